//! Telling systemd what the daemon is doing (`sd_notify(3)`), through the `sd-notify` crate.
//!
//! The unit (`systemd/nvmf-target.service`) is `Type=notify` with
//! `ExecReload=kill -HUP $MAINPID` and `WatchdogSec=`. The daemon sends:
//!
//! - [`ready`] once the listeners are up (systemd holds `systemctl start` until then),
//!   and again when a reload is done;
//! - [`reloading`] when SIGHUP arrives, with `MONOTONIC_USEC` as systemd 253+ wants it for
//!   `Type=notify-reload` (harmless for `Type=notify`: `systemctl status` shows
//!   "reloading" until the next `READY=1`);
//! - [`stopping`] when a graceful stop begins;
//! - [`status`] one-line summaries for `systemctl status`;
//! - [`watchdog`] keep-alive pings, at half of [`watchdog_interval`] as `sd_watchdog_enabled(3)`
//!   advises, and only while the IO threads are alive, so a wedged daemon gets restarted.
//!
//! Every call is a no-op when `NOTIFY_SOCKET` is unset (not started by systemd, tests).
//! A failed send is logged and otherwise ignored: the daemon must not stop serving
//! because the service manager went away.
//!
//! Not implemented: file-descriptor store, socket activation (`LISTEN_FDS`), `EXTEND_TIMEOUT_USEC`.

use std::time::{Duration, Instant};

use sd_notify::NotifyState;

fn send(what: &str, states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("sd_notify {what}: {e}");
    }
}

/// `READY=1`: start-up (or a reload) is complete.
pub fn ready() {
    send("READY", &[NotifyState::Ready]);
}

/// `RELOADING=1` with `MONOTONIC_USEC=` (the time the reload began, CLOCK_MONOTONIC).
/// Follow it with [`ready`] when the reload is done, whether or not it succeeded.
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send("RELOADING", &[NotifyState::Reloading, now]),
        Err(e) => {
            tracing::warn!("sd_notify RELOADING: no monotonic clock ({e}); sending it without");
            send("RELOADING", &[NotifyState::Reloading]);
        }
    }
}

/// `STOPPING=1`: a graceful stop has begun.
pub fn stopping() {
    send("STOPPING", &[NotifyState::Stopping]);
}

/// `STATUS=`: one line for `systemctl status`. Line breaks would end the assignment
/// (and start another), so they become spaces.
pub fn status(text: &str) {
    let line: String = text
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    send("STATUS", &[NotifyState::Status(&line)]);
}

/// `WATCHDOG=1`: the daemon is alive.
pub fn watchdog() {
    send("WATCHDOG", &[NotifyState::Watchdog]);
}

/// The watchdog timeout systemd enforces on this process (`WATCHDOG_USEC`, honoured only
/// when `WATCHDOG_PID` is unset or names this process), or `None` when there is no
/// watchdog. Ping with [`watchdog`] at half this interval.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled().filter(|d| !d.is_zero())
}

/// Feeds the systemd watchdog from the main loop, and only while every IO thread is making
/// progress: a thread that exited or is stuck (its engine's poll counters stopped moving)
/// stops the pings, and systemd restarts the service after `WatchdogSec=`. An idle IO
/// thread still counts its idle polls (at least one per idle wait), so idleness is not
/// mistaken for a hang.
pub struct Watchdog {
    every: Duration,
    next: Instant,
    /// Busy + idle polls of each IO thread at the last check.
    last_polls: Vec<u64>,
}

impl Watchdog {
    /// `None` when systemd set no watchdog for this process.
    pub fn from_env() -> Option<Watchdog> {
        watchdog_interval().map(Watchdog::with_interval)
    }

    /// Pings every `interval / 2`.
    pub fn with_interval(interval: Duration) -> Watchdog {
        Watchdog {
            every: interval / 2,
            next: Instant::now(),
            last_polls: Vec::new(),
        }
    }

    /// Call on every main-loop pass. When a ping is due, sends `WATCHDOG=1` if `threads`
    /// IO threads exist and each has polled since the previous check; returns whether it
    /// pinged.
    pub fn tick(&mut self, now: Instant, stats: &sta::Stats, threads: usize) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + self.every;
        let polls: Vec<u64> = stats
            .threads()
            .iter()
            .map(|t| t.busy_polls + t.idle_polls)
            .collect();
        let stuck: Vec<usize> = (0..polls.len())
            .filter(|&i| self.last_polls.get(i).is_some_and(|&p| p == polls[i]))
            .collect();
        let healthy = polls.len() == threads && stuck.is_empty();
        if healthy {
            watchdog();
        } else {
            tracing::error!(
                "not feeding the systemd watchdog: {} of {threads} IO threads running, \
                 no progress on {stuck:?}",
                polls.len()
            );
        }
        self.last_polls = polls;
        healthy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sta::{Engine, IoContext};
    use std::os::unix::net::UnixDatagram;
    use std::sync::Mutex;

    /// The tests change process-wide environment variables: one at a time.
    static ENV: Mutex<()> = Mutex::new(());

    fn monotonic_usec() -> i128 {
        match NotifyState::monotonic_usec_now().expect("CLOCK_MONOTONIC") {
            NotifyState::MonotonicUsec(v) => v,
            _ => unreachable!(),
        }
    }

    fn recv(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 4096];
        let n = sock.recv(&mut buf).expect("a notification");
        String::from_utf8(buf[..n].to_vec()).expect("UTF-8")
    }

    #[test]
    fn messages_reach_notify_socket() {
        let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        std::env::set_var("NOTIFY_SOCKET", &path);

        ready();
        assert_eq!(recv(&sock), "READY=1\n");

        let before = monotonic_usec();
        reloading();
        let after = monotonic_usec();
        let m = recv(&sock);
        let mut lines = m.lines();
        assert_eq!(lines.next(), Some("RELOADING=1"));
        let usec: i128 = lines
            .next()
            .and_then(|l| l.strip_prefix("MONOTONIC_USEC="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("MONOTONIC_USEC in {m:?}"));
        assert!(
            before <= usec && usec <= after,
            "MONOTONIC_USEC {usec} is not CLOCK_MONOTONIC between {before} and {after}"
        );

        stopping();
        assert_eq!(recv(&sock), "STOPPING=1\n");

        status("2 listeners\nup");
        assert_eq!(recv(&sock), "STATUS=2 listeners up\n");

        watchdog();
        assert_eq!(recv(&sock), "WATCHDOG=1\n");

        std::env::remove_var("NOTIFY_SOCKET");
        // Without a socket every call is a quiet no-op.
        ready();
        watchdog();
        sock.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 64];
        assert!(
            sock.recv(&mut buf).is_err(),
            "nothing sent without NOTIFY_SOCKET"
        );
    }

    #[test]
    fn watchdog_interval_follows_the_environment() {
        let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
        std::env::remove_var("WATCHDOG_USEC");
        std::env::remove_var("WATCHDOG_PID");
        assert_eq!(watchdog_interval(), None);

        std::env::set_var("WATCHDOG_USEC", "30000000");
        assert_eq!(watchdog_interval(), Some(Duration::from_secs(30)));
        std::env::set_var("WATCHDOG_PID", std::process::id().to_string());
        assert_eq!(watchdog_interval(), Some(Duration::from_secs(30)));
        // Meant for another process (a parent that did not unset it): not ours.
        std::env::set_var("WATCHDOG_PID", (std::process::id() + 1).to_string());
        assert_eq!(watchdog_interval(), None);
        std::env::set_var("WATCHDOG_PID", std::process::id().to_string());
        std::env::set_var("WATCHDOG_USEC", "0");
        assert_eq!(watchdog_interval(), None);
        std::env::set_var("WATCHDOG_USEC", "garbage");
        assert_eq!(watchdog_interval(), None);

        std::env::remove_var("WATCHDOG_USEC");
        std::env::remove_var("WATCHDOG_PID");
    }

    #[test]
    fn watchdog_pings_only_while_every_io_thread_progresses() {
        let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_nonblocking(true).unwrap();
        std::env::set_var("NOTIFY_SOCKET", &path);
        let pinged = |sock: &UnixDatagram| {
            let mut buf = [0u8; 64];
            let mut n = 0;
            while let Ok(len) = sock.recv(&mut buf) {
                assert_eq!(&buf[..len], b"WATCHDOG=1\n");
                n += 1;
            }
            n
        };

        let mut sta = crate::engine::for_tests();
        let mut io = sta
            .io_create()
            .expect("engine IO context")
            .start()
            .expect("engine IO context");
        let stats = sta.stats();
        let mut w = Watchdog::with_interval(Duration::from_secs(2));
        let t0 = Instant::now();
        // Two threads expected, one exists: no ping.
        assert!(!w.tick(t0, &stats, 2));
        assert_eq!(pinged(&sock), 0);
        // Not due yet.
        io.progress(Duration::ZERO);
        assert!(!w.tick(t0 + Duration::from_millis(500), &stats, 1));
        // Due, and the thread polled since the last check.
        assert!(w.tick(t0 + Duration::from_secs(1), &stats, 1));
        assert_eq!(pinged(&sock), 1);
        // Due again, but the thread did not poll: stuck, no ping.
        assert!(!w.tick(t0 + Duration::from_secs(2), &stats, 1));
        assert_eq!(pinged(&sock), 0);
        io.progress(Duration::ZERO);
        assert!(w.tick(t0 + Duration::from_secs(3), &stats, 1));
        assert_eq!(pinged(&sock), 1);
        std::env::remove_var("NOTIFY_SOCKET");
    }
}
