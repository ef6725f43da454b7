//! The reservation state file (PTPL) is written on a thread of its own.
//!
//! Writing it costs a file write and two fsyncs: milliseconds on a real disk. Done on the
//! IO thread that ran the reservation command, as it once was, it stalled every other
//! queue of that thread, so one allowed host registering and unregistering in a loop
//! slowed every host that shared its thread. Now the IO thread hands the new state over
//! and goes on; the command's completion waits (with the thread's fenced completions,
//! `commands.rs`) until the writer has put that version, or a later one, on disk. The host
//! never sees a reservation change succeed that a restart would lose. When the write
//! fails, that is logged as an error naming the file, and the commands whose state it
//! held are answered Internal Error, as SPDK answers them: the change is in effect, but
//! the host must not take it as persisted. A later write that succeeds holds their state
//! too; commands answered after it succeed.
//!
//! Only the newest state waits to be written: a version handed over while an older one
//! waits replaces it, so a flood of changes costs one write per write's duration, however
//! many commands it holds back. The writer that panics stops the daemon, as a DH thread
//! does.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nvmf::target::{PersistedReservation, Target};

use super::shared::Shared;
use crate::ptpl::PtplStore;

/// A version of the state and the namespaces it holds.
type Snapshot = (u64, Vec<PersistedReservation>);

pub(super) struct PtplWriter {
    store: PtplStore,
    /// The newest state not yet taken by the writer.
    pending: Mutex<Option<Snapshot>>,
    ready: Condvar,
    /// The newest version handed over. Read and set under the target's lock, so versions
    /// are handed over in the order the target made them.
    queued: AtomicU64,
    /// The newest version the writer is done with: on disk, or failed (and logged).
    written: AtomicU64,
    /// The newest version on disk.
    saved: AtomicU64,
    /// Writer threads running (0 or 1).
    alive: AtomicUsize,
}

impl PtplWriter {
    pub fn new(store: PtplStore) -> PtplWriter {
        PtplWriter {
            store,
            pending: Mutex::new(None),
            ready: Condvar::new(),
            queued: AtomicU64::new(0),
            written: AtomicU64::new(0),
            saved: AtomicU64::new(0),
            alive: AtomicUsize::new(0),
        }
    }

    /// Hands the target's state to the writer if it changed since the last hand-over.
    /// The caller holds the target's lock.
    pub fn hand_over(&self, t: &Target) {
        self.offer(t.ptpl_version(), || t.ptpl_snapshot());
    }

    /// Hands over the state `snapshot` makes if `version` is newer than the last one.
    fn offer(&self, version: u64, snapshot: impl FnOnce() -> Snapshot) {
        if version <= self.queued.load(Ordering::Acquire) {
            return;
        }
        self.queued.store(version, Ordering::Release);
        *crate::lock(&self.pending) = Some(snapshot());
        self.ready.notify_one();
    }

    /// Whether version `v` (or a later one) is done with.
    pub fn written(&self, v: u64) -> bool {
        self.written.load(Ordering::Acquire) >= v
    }

    /// Whether version `v` (or a later one, which holds it) is on disk. Read once
    /// [`written`](Self::written) says `v` is done with.
    pub fn saved(&self, v: u64) -> bool {
        self.saved.load(Ordering::Acquire) >= v
    }

    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst) > 0
    }

    /// Waits until everything handed over is written, or `limit` has passed. Whether it
    /// was.
    pub fn flush(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.written(self.queued.load(Ordering::Acquire)) {
                return true;
            }
            if Instant::now() >= deadline || !self.alive() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn take(&self) -> Snapshot {
        let mut p = crate::lock(&self.pending);
        loop {
            if let Some(s) = p.take() {
                return s;
            }
            p = self.ready.wait(p).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn write(&self, (version, entries): Snapshot) {
        match self.store.save(version, &entries) {
            Ok(()) => self.saved.store(version, Ordering::Release),
            Err(e) => tracing::error!(
                "reservations: cannot write the state file {}: {e}; the reservation \
                 commands waiting for it are answered Internal Error, and reservations \
                 that persist through power loss may be lost on restart",
                self.store.path().display()
            ),
        }
        self.written.store(version, Ordering::Release);
    }
}

/// What counts the writer when there is none (never read: it is not started then).
static NO_WRITER: AtomicUsize = AtomicUsize::new(0);

/// Starts the writer thread if reservations persist. It waits for states for the life
/// of the process.
pub(super) fn spawn(shared: &Arc<Shared>) -> std::io::Result<()> {
    if shared.ptpl.is_none() {
        return Ok(());
    }
    super::service_thread::spawn(
        shared,
        "nvmft-ptpl".into(),
        "the reservation state file's writer",
        |s| s.ptpl.as_ref().map_or(&NO_WRITER, |w| &w.alive),
        |s| {
            if let Some(w) = &s.ptpl {
                loop {
                    let snapshot = w.take();
                    w.write(snapshot);
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf::target::reservation::{Registrant, Reservations};

    fn state(n: u8) -> Vec<PersistedReservation> {
        vec![PersistedReservation {
            subnqn: "nqn.2026-11.dev.test:a".into(),
            nsid: 1,
            state: Reservations {
                generation: n.into(),
                registrants: vec![Registrant::new([n; 16], n.into())],
                held: None,
                ptpl: true,
            },
        }]
    }

    /// States handed over while the writer is busy are written once, as the newest; a
    /// version not newer than one handed over already is not taken again.
    #[test]
    fn only_the_newest_waiting_state_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("resv.ptpl");
        let w = PtplWriter::new(PtplStore::new(path.clone()));
        for v in 1..=3u8 {
            w.offer(v.into(), || (v.into(), state(v)));
        }
        w.offer(2, || panic!("an older version is not snapshotted"));
        assert!(!w.written(1));
        let s = w.take();
        assert_eq!(s.0, 3);
        w.write(s);
        assert!(w.written(3) && !w.written(4));
        assert!(w.saved(3) && !w.saved(4));
        // Nothing else waits: the one write took all three.
        assert!(crate::lock(&w.pending).is_none());
        let on_disk = crate::ptpl::decode(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(on_disk[0].state.registrants[0].host_id, [3; 16]);
        assert!(w.flush(Duration::ZERO));
    }

    /// A write that fails is done with, not saved: its commands are answered Internal
    /// Error. A later write that succeeds holds the earlier versions too.
    #[test]
    fn a_failed_write_is_done_with_but_not_saved() {
        let dir = tempfile::tempdir().unwrap();
        let w = PtplWriter::new(PtplStore::new(dir.path().join("gone/resv.ptpl")));
        w.write((1, state(1)));
        assert!(w.written(1) && !w.saved(1));
        let w = PtplWriter {
            store: PtplStore::new(dir.path().join("resv.ptpl")),
            ..w
        };
        w.write((2, state(2)));
        assert!(w.saved(1) && w.saved(2));
    }

    /// The writer thread takes what is handed over; `flush` waits for it, and says when a
    /// state was left unwritten.
    #[test]
    fn flush_waits_for_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let w = Arc::new(PtplWriter::new(PtplStore::new(
            dir.path().join("resv.ptpl"),
        )));
        w.offer(1, || (1, state(1)));
        // No writer thread: nothing writes version 1.
        assert!(!w.flush(Duration::from_millis(20)));
        w.alive.fetch_add(1, Ordering::SeqCst);
        let mine = w.clone();
        let t = std::thread::spawn(move || {
            let s = mine.take();
            mine.write(s);
        });
        assert!(w.flush(Duration::from_secs(30)));
        t.join().unwrap();
        assert!(w.written(1));
    }
}
