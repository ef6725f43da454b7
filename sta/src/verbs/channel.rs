//! Completion channels: one per CQ, kept open for a grace period after the CQ is gone.
//!
//! Why not one channel per device: the kernel's Soft-RoCE driver up to Linux 6.3
//! (rdma_rxe, e.g. the interop guest's 6.1) raises a CQ's completion event from a tasklet
//! that holds no reference on the CQ (fixed upstream by 78b26a335310, "RDMA/rxe: Remove
//! tasklet call from rxe_cq.c"), so an event can be queued for a CQ after
//! `ibv_destroy_cq` returned. On a channel shared with live CQs, the next
//! `ibv_get_cq_event` returns that event, and libibverbs reads the freed `struct ibv_cq`
//! and calls through its context's ops table: a call through freed memory. With one
//! channel per CQ, a channel is read through libibverbs only while its CQ lives
//! ([`CqChannel::drain`]); after that it goes to a graveyard ([`CqChannel::bury`]) that
//! drains it as raw bytes (never looking at what the events name) and closes it after
//! [`LATE_EVENT_GRACE`] ([`reap_dead_channels`]).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::ffi::{IbvCompChannel, IbvContext, Lib};

/// How long a destroyed CQ's channel stays open to catch late events.
pub const LATE_EVENT_GRACE: Duration = Duration::from_secs(2);

/// A completion channel that belongs to one CQ. Dropping it closes it at once: only for a
/// channel whose CQ was never created or never armed; otherwise [`bury`](Self::bury) it.
#[derive(Debug)]
pub struct CqChannel(*mut IbvCompChannel);

// SAFETY: the channel is a kernel file and a small heap object of libibverbs, not bound
// to a thread; it is used by one owner at a time (its IO thread, then the graveyard
// under its mutex).
unsafe impl Send for CqChannel {}

impl CqChannel {
    /// A new non-blocking channel on device `ctx`.
    ///
    /// # Safety
    /// `ctx` is a live device context (e.g. a connect request's `cm_id->verbs`).
    pub unsafe fn new(lib: &Lib, ctx: *mut IbvContext) -> std::io::Result<CqChannel> {
        // SAFETY: the caller's promise.
        let chan = unsafe { (lib.create_comp_channel)(ctx) };
        if chan.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `chan` is live; its descriptor is ours to make non-blocking.
        unsafe {
            let fd = (*chan).fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        Ok(CqChannel(chan))
    }

    pub fn raw(&self) -> *mut IbvCompChannel {
        self.0
    }

    /// The descriptor to watch (readable when an event is queued).
    pub fn fd(&self) -> c_int {
        // SAFETY: the channel is live while `self` is.
        unsafe { (*self.0).fd }
    }

    /// Consume the queued events, acking each (the CQ is polled anyway).
    ///
    /// # Safety
    /// The channel's CQ is alive: an event then names it, and libibverbs may read it.
    pub unsafe fn drain(&self, lib: &Lib) {
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: the channel is live and non-blocking; by the caller's promise its
            // only CQ is alive, so the CQ an event names is too.
            if unsafe { (lib.get_cq_event)(self.0, &mut cq, &mut ctx) } != 0 || cq.is_null() {
                return;
            }
            // SAFETY: `cq` came from ibv_get_cq_event and is alive.
            unsafe { (lib.ack_cq_events)(cq, 1) };
        }
    }

    /// The CQ is destroyed: keep the channel open (and drained) for the grace period,
    /// then close it. It is never read through libibverbs again.
    /// At most [`MAX_BURIED`] wait: past that the oldest is drained and closed early
    /// (safe: the grace period is there to count late events, not to be safe from them),
    /// so peers that open and close connections fast cannot make the graveyard hold an
    /// unbounded number of descriptors.
    pub fn bury(self) {
        let until = Instant::now() + LATE_EVENT_GRACE;
        let mut g = GRAVE.lock().unwrap_or_else(|e| e.into_inner());
        let evicted = push_bounded(&mut g, (self, until), MAX_BURIED);
        BURIED.store(g.len(), Ordering::Relaxed);
        drop(g);
        if let Some((c, _)) = evicted {
            LATE_EVENTS.fetch_add(c.drain_raw(), Ordering::Relaxed);
            EARLY_CLOSED.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Read and discard queued events without interpreting them; how many there were.
    fn drain_raw(&self) -> u64 {
        let mut n = 0;
        loop {
            let mut ev = [0u8; 8];
            // SAFETY: reads at most 8 bytes into `ev` from our non-blocking descriptor;
            // each event is one `struct ib_uverbs_comp_event_desc` (a u64 CQ handle),
            // counted and never dereferenced.
            let r = unsafe { libc::read(self.fd(), ev.as_mut_ptr() as *mut c_void, ev.len()) };
            if r != 8 {
                return n;
            }
            n += 1;
        }
    }
}

impl Drop for CqChannel {
    fn drop(&mut self) {
        if let Ok(lib) = super::lib() {
            // SAFETY: no CQ uses the channel any more (see the type's docs); freed once.
            unsafe { (lib.destroy_comp_channel)(self.0) };
        }
    }
}

/// The most channels of destroyed CQs kept open at once (each is a descriptor): a
/// connection churn of 512 a second over the 2 s grace period.
pub const MAX_BURIED: usize = 1024;

/// Appends `item` to `g`, oldest first; when `g` then holds more than `max`, takes the
/// oldest out and returns it.
fn push_bounded<T>(g: &mut Vec<T>, item: T, max: usize) -> Option<T> {
    g.push(item);
    (g.len() > max).then(|| g.remove(0))
}

/// Channels closed before their grace period was over, the graveyard being full.
static EARLY_CLOSED: AtomicU64 = AtomicU64::new(0);

/// Channels of destroyed CQs, with the time each may be closed.
static GRAVE: Mutex<Vec<(CqChannel, Instant)>> = Mutex::new(Vec::new());
/// `GRAVE`'s length, read without the lock (the common case: empty).
static BURIED: AtomicUsize = AtomicUsize::new(0);
/// Completion events that arrived for destroyed CQs, process-wide.
static LATE_EVENTS: AtomicU64 = AtomicU64::new(0);

/// Drain the buried channels and close those whose grace period is over (`now` past it).
/// Returns how many late events this call found. Cheap when the graveyard is empty; call
/// it from housekeeping (about once a second) on any thread. Closing a channel early is
/// safe (the kernel drops events for a closed channel): the grace period is there to see
/// late events, not to be safe from them.
pub fn reap_dead_channels(now: Instant) -> u64 {
    if BURIED.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    let mut g = GRAVE.lock().unwrap_or_else(|e| e.into_inner());
    let late: u64 = g.iter().map(|(c, _)| c.drain_raw()).sum();
    g.retain(|(_, until)| *until > now);
    BURIED.store(g.len(), Ordering::Relaxed);
    LATE_EVENTS.fetch_add(late, Ordering::Relaxed);
    late
}

/// Completion events discarded because their CQ was already destroyed, since start.
pub fn late_cq_events() -> u64 {
    LATE_EVENTS.load(Ordering::Relaxed)
}

/// Channels waiting out their grace period.
pub fn buried_channels() -> usize {
    BURIED.load(Ordering::Relaxed)
}

/// Channels closed early because [`MAX_BURIED`] were waiting already, since start.
pub fn early_closed_channels() -> u64 {
    EARLY_CLOSED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::push_bounded;

    #[test]
    fn the_graveyard_keeps_the_newest_and_gives_back_the_oldest_past_its_bound() {
        let mut g = Vec::new();
        for i in 0..3 {
            assert_eq!(push_bounded(&mut g, i, 3), None);
        }
        assert_eq!(push_bounded(&mut g, 3, 3), Some(0));
        assert_eq!(push_bounded(&mut g, 4, 3), Some(1));
        assert_eq!(g, [2, 3, 4]);
        // Churn: never more than the bound, whatever comes.
        for i in 5..10_000 {
            push_bounded(&mut g, i, 3);
            assert!(g.len() <= 3);
        }
        assert_eq!(g, [9997, 9998, 9999]);
    }
}
