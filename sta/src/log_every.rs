//! At most one log line per period for an event that can come without end (a peer that
//! keeps running into a bound, a disk that fails every command): the lines held back are
//! counted, and the next line says how many.

use std::time::{Duration, Instant};

/// One kind of line, printed at most once per `every`.
#[derive(Debug)]
pub struct LogEvery {
    every: Duration,
    last: Option<Instant>,
    quiet: u64,
}

impl LogEvery {
    pub const fn new(every: Duration) -> LogEvery {
        LogEvery {
            every,
            last: None,
            quiet: 0,
        }
    }

    /// One more event at `now`: `Some(n)` when its line may be printed, `n` being the
    /// lines held back since the last one printed; `None` (counted) when not.
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < self.every)
        {
            self.quiet += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.quiet))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One line per period; the next line counts those held back.
    #[test]
    fn one_line_per_period_with_the_count_held_back() {
        let every = Duration::from_secs(10);
        let mut l = LogEvery::new(every);
        let t0 = Instant::now();
        assert_eq!(l.admit(t0), Some(0));
        for i in 1..=5 {
            assert_eq!(l.admit(t0 + Duration::from_secs(i)), None);
        }
        assert_eq!(l.admit(t0 + every), Some(5));
        assert_eq!(l.admit(t0 + every), None);
        assert_eq!(l.admit(t0 + 2 * every), Some(1));
    }
}
