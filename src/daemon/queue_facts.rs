//! Facts about each queue that only the daemon knows and the control socket shows:
//! when its connection was accepted and the depth its Connect asked for. (The peer and
//! listener are in `Shared`'s connection records; the target knows queues only by key.)
//! Written when a connection opens, when its Connect succeeds and when it closes, on the
//! slow path only; read by the main thread for `ctl controllers`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::SystemTime;

#[derive(Clone, Copy, Debug)]
pub(super) struct QueueFact {
    pub opened: SystemTime,
    /// SQSIZE + 1 from the queue's Connect.
    pub depth: Option<u32>,
}

#[derive(Default)]
pub(super) struct QueueFacts(Mutex<HashMap<u64, QueueFact>>);

impl QueueFacts {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, QueueFact>> {
        // Plain data: usable even if a thread panicked holding the lock.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn opened(&self, key: u64) {
        self.map().insert(
            key,
            QueueFact {
                opened: SystemTime::now(),
                depth: None,
            },
        );
    }
    pub fn connected(&self, key: u64, sqsize: u16) {
        if let Some(f) = self.map().get_mut(&key) {
            f.depth = Some(u32::from(sqsize) + 1);
        }
    }
    pub fn closed(&self, key: u64) {
        self.map().remove(&key);
    }
    pub fn get(&self, key: u64) -> Option<QueueFact> {
        self.map().get(&key).copied()
    }
}
