//! Drive health: the SMART / Health log of backends on real NVMe drives, read now and then
//! on a thread of its own (an admin command to the drive; never on the main loop or the
//! data path) and handed to the target, so Get Log Page 02h of the namespaces a drive
//! backs answers with the drive's health and a new critical warning raises the SMART /
//! Health event hosts asked for (nvmf: `Target::set_device_health`).

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backend::Backend;

/// How often each drive is asked. Its warnings change slowly; an admin command a minute
/// costs the drive nothing.
pub(super) const INTERVAL: Duration = Duration::from_secs(60);

type Drives = Arc<Mutex<Vec<(String, Arc<dyn Backend>)>>>;

enum Wake {
    /// The set of drives changed: read them now.
    Now,
}

/// The polling thread and what it reported. Dropping it stops the thread (its wake
/// channel closes) without waiting for a poll in progress.
pub(super) struct HealthPoller {
    drives: Drives,
    wake: Sender<Wake>,
    logs: Receiver<(String, [u8; 512])>,
    /// The last critical warning seen per backend, to log changes once.
    warnings: HashMap<String, u8>,
}

impl HealthPoller {
    pub fn start(interval: Duration) -> std::io::Result<HealthPoller> {
        let drives: Drives = Arc::default();
        let (wake, wake_rx) = mpsc::channel();
        let (tx, logs) = mpsc::channel();
        let list = drives.clone();
        std::thread::Builder::new()
            .name("drive-health".into())
            .spawn(move || poll_loop(&list, &wake_rx, &tx, interval))?;
        Ok(HealthPoller {
            drives,
            wake,
            logs,
            warnings: HashMap::new(),
        })
    }

    /// The drives to poll from now on (backend name and backend); read at once.
    pub fn set_drives(&self, drives: Vec<(String, Arc<dyn Backend>)>) {
        let changed = {
            let mut d = self.drives.lock().unwrap_or_else(|p| p.into_inner());
            let names = |v: &[(String, Arc<dyn Backend>)]| {
                v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>()
            };
            let changed = names(&d) != names(&drives);
            *d = drives;
            changed
        };
        if changed {
            // The thread only stops when this poller is dropped, so the send succeeds.
            let _ = self.wake.send(Wake::Now);
        }
    }

    /// The logs read since the last call, with a line for each critical warning that
    /// appeared or went away.
    pub fn take(&mut self) -> Vec<(String, [u8; 512])> {
        let logs: Vec<_> = self.logs.try_iter().collect();
        for (name, log) in &logs {
            let warning = log[0];
            let before = self.warnings.insert(name.clone(), warning).unwrap_or(0);
            if warning != before {
                if warning == 0 {
                    tracing::info!("backend {name}: the drive's critical warning cleared");
                } else {
                    tracing::warn!(
                        "backend {name}: the drive reports critical warning {warning:#04x} ({})",
                        describe_warning(warning)
                    );
                }
            }
        }
        logs
    }
}

fn poll_loop(
    drives: &Drives,
    wake: &Receiver<Wake>,
    out: &Sender<(String, [u8; 512])>,
    interval: Duration,
) {
    loop {
        let list = drives.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (name, b) in list {
            if let Some(log) = b.health_log() {
                if out.send((name, log)).is_err() {
                    return;
                }
            }
        }
        match wake.recv_timeout(interval) {
            Ok(Wake::Now) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// The Critical Warning bits in words (NVMe Base 2.0 Figure 207).
fn describe_warning(w: u8) -> String {
    const BITS: [&str; 6] = [
        "available spare below threshold",
        "temperature threshold crossed",
        "reliability degraded",
        "read-only",
        "volatile memory backup failed",
        "persistent memory region read-only",
    ];
    let words: Vec<&str> = BITS
        .iter()
        .enumerate()
        .filter(|(i, _)| w & (1 << i) != 0)
        .map(|(_, s)| *s)
        .collect();
    if words.is_empty() {
        "reserved bits".into()
    } else {
        words.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use backend::ram::RamBackend;

    /// A RAM backend that answers a health log with a given critical warning.
    #[derive(Debug)]
    struct Drive {
        inner: Arc<dyn Backend>,
        warning: Mutex<u8>,
    }
    impl Backend for Drive {
        fn block_size(&self) -> u32 {
            self.inner.block_size()
        }
        fn num_blocks(&self) -> u64 {
            self.inner.num_blocks()
        }
        fn volatile_write_cache(&self) -> bool {
            false
        }
        fn describe(&self) -> String {
            "test drive".into()
        }
        fn create_queue(
            self: Arc<Self>,
            depth: u32,
        ) -> Result<Box<dyn backend::BackendQueue>, backend::Error> {
            self.inner.clone().create_queue(depth)
        }
        fn flush_sync(&self) -> Result<(), backend::Error> {
            Ok(())
        }
        fn health_log(&self) -> Option<[u8; 512]> {
            let mut log = [0u8; 512];
            log[0] = *self.warning.lock().unwrap();
            log[1..3].copy_from_slice(&300u16.to_le_bytes());
            Some(log)
        }
    }

    #[test]
    fn drives_are_read_when_set_and_non_drives_report_nothing() {
        let drive = Arc::new(Drive {
            inner: RamBackend::new(1 << 20, 512).unwrap(),
            warning: Mutex::new(0),
        });
        let ram: Arc<dyn Backend> = RamBackend::new(1 << 20, 512).unwrap();
        // A long interval: every read below comes from set_drives waking the thread.
        let mut p = HealthPoller::start(Duration::from_secs(3600)).unwrap();
        p.set_drives(vec![("d".into(), drive.clone()), ("r".into(), ram.clone())]);
        let got = wait_for(&mut p, 1);
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            p.take().is_empty(),
            "the RAM backend has no health log to send"
        );
        assert_eq!(got[0].0, "d");
        assert_eq!(u16::from_le_bytes([got[0].1[1], got[0].1[2]]), 300);
        // The same set again does not wake the thread; a new set does.
        *drive.warning.lock().unwrap() = 0b10;
        p.set_drives(vec![("d".into(), drive.clone()), ("r".into(), ram)]);
        std::thread::sleep(Duration::from_millis(100));
        assert!(p.take().is_empty());
        p.set_drives(vec![("d".into(), drive.clone())]);
        let got = wait_for(&mut p, 1);
        assert_eq!(got[0].1[0], 0b10);
        assert_eq!(p.warnings.get("d"), Some(&0b10));
        assert_eq!(describe_warning(0b10), "temperature threshold crossed");
    }

    fn wait_for(p: &mut HealthPoller, n: usize) -> Vec<(String, [u8; 512])> {
        let mut got = Vec::new();
        for _ in 0..200 {
            got.extend(p.take());
            if got.len() >= n {
                return got;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no health log after 2 s: {got:?}");
    }
}
