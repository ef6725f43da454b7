//! The `soft` engine: the STA contract on host CPU cores, for NVMe/TCP and NVMe/RDMA.
//!
//! One [`StaIo`] per IO thread, run to completion by its thread. The engine is a shell
//! around `nvmf`'s machines: it owns sockets, epoll, io_uring-backed backend queues and
//! verbs, and feeds the machines bytes. By concern:
//!
//! - `io`: the IO context, its QP table and the progress loop;
//! - `cmd`: command slots and the command path shared by both transports (capsule
//!   intake, the offloaded READ, WRITE, FLUSH, WRITE ZEROES, DSM, COMPARE against the
//!   thread's own backend queues, the non-offloaded hand-up, the host-data fetch, written
//!   once for both paths and both transports);
//! - `tasks`: what the application submits (the three DOCA data tasks, disconnect);
//! - `tcp_link`: a TCP QP: one `epoll_wait` per pass, bytes fed to
//!   `nvmf::tcp::ControllerQueue` (framing, ICReq, R2T/H2CData accounting, C2HData,
//!   SQHD, TermReq), its output written with one `writev` per pass (C2HData header, the
//!   data buffer, digest and CapsuleResp go out together, data never copied);
//! - `rdma_link`: an RDMA QP (verbs through rdma-core loaded at run time): per thread a
//!   PD and a completion channel per device; per QP a CQ and pre-posted receives of SQE +
//!   in-capsule size; `nvmf::rdma::RdmaQueue` plans the RDMA READs of keyed SGLs, the
//!   RDMA WRITEs and the response SENDs (with Invalidate when asked) and holds them until
//!   send-queue and READ credits allow; receives and sends are posted as one chain each
//!   per pass.
//!
//! Command slots and data buffers come from per-thread pools, so the steady-state data
//! path takes no lock and allocates nothing (RDMA registers each pool buffer once).
//!
//! What a peer can make an IO context hold is bounded ([`crate::EngineLimits`], counted
//! as [`crate::Limit`] hits): a queue's commands by its SQSIZE + 1 (NVMe/TCP: a capsule
//! beyond that is a fatal error; NVMe/RDMA: a receive is posted again only when the
//! command it carried is done, so the host cannot send more), a connection's data buffers
//! by its budget (further commands wait), host data by a deadline (NVMe/TCP buffers are
//! taken only when the data arrives, so data that never comes costs nothing but a slot),
//! output by a drain deadline (a full socket is waited on with EPOLLOUT, not polled),
//! and a connection's life before Fabrics Connect by the ICReq and Connect deadlines.
//! Before Connect nothing but the Connect's own data is ever solicited.
//!
//! Beyond the plain commands:
//!
//! - Every offloaded command is checked against its namespace's access view (reservation
//!   conflicts, ANA path states, per-host visibility; see the crate docs): one atomic
//!   load per command, the view reloaded only when it was republished.
//! - Copy (format 0): the source ranges are read one by one into one buffer (MCL and
//!   MSSRL are the max I/O size), then written to the destination; not atomic, as the
//!   spec allows. It is offloaded because the engine is where the backend queues are:
//!   the daemon has no data path of its own, and a copy through it would cross threads
//!   twice for data that never needs to leave the IO thread.
//! - Fused Compare and Write: the first command is held until the next capsule of the
//!   QP; a matching Write makes the pair, anything else fails the first with Missing
//!   Fused. The pair claims its LBA range among every IO thread of the namespace
//!   ([`FusedRanges`]; a pair whose range overlaps a claimed one waits, retried every
//!   pass). From the claim on, writes to an overlapping range (and DSM, Copy) wait on
//!   every IO thread until the pair's write is done: a plain write reads one relaxed
//!   counter, and takes the ranges' lock only while some pair holds a range. Writes let
//!   through just before the claim may still be at the backend, which does not keep
//!   submission order, so the pair then sends a fence to every IO thread
//!   ([`crate::IoContext::ns_fence`]) and compares once each has seen the claim and
//!   finished what it had in flight on the namespace (the fence's message is also what
//!   makes the claim visible to a thread that had not seen it). A Copy counts as in
//!   flight from its first read to the end of its write, so a fence waits for a Copy
//!   already started as a whole. Compare and write are thus atomic against every other
//!   write to their range, as NVMe Base 2.0 section 3.4.2 asks, wherever the writer's
//!   queue is. A fence costs a message round trip to every IO thread: each context has
//!   an eventfd in its epoll set, so one asleep is woken, and the last to arrive wakes the
//!   pair's context, which naps rather than spins while it waits. Waiting for a range
//!   takes turns, among threads ([`FusedRanges`]) and on each thread
//!   ([`cmd::FusedLocks`]), so pairs that keep coming never hold back a write, a
//!   deallocation or a Copy to their range for longer than the pairs already running
//!   take. Writes that do not touch a pair's range (a DSM's ranges, a Copy's
//!   destination) never wait for it.
//! - RAM namespaces ([`backend::BackendQueue::ram_store`]) skip the backend queue both
//!   ways. A Read on a plain TCP queue without data digest is answered at once and its
//!   C2HData goes out straight from the store: the `writev` that carries it holds the
//!   read locks of its stripes, so the kernel's copy into the socket is the only one (and
//!   a read the socket took only part of gets its rest copied under the same locks, so
//!   each block reaches the host as one version). An in-capsule Write (either
//!   transport) goes from where it arrived straight into the store, unless it is fused or
//!   waits for a fused pair's range.
//! - Abort: a command waiting for its host data is marked and answered Abort Requested
//!   once its data is in (never run); one queued behind a full backend queue is taken off
//!   it. Commands at the backend are not aborted.
//!
//! Not implemented yet: more than one outstanding R2T per command, zero-copy receive into
//! data buffers (H2CData and RDMA in-capsule data are copied once), an SRQ, multi-segment
//! SGLs.

mod cmd;
mod contract_impl;
pub(crate) mod counters;
mod io;
mod rdma_link;
mod tasks;
mod tcp_link;
#[cfg(test)]
mod tests;

pub use io::StaIo;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use backend::Backend;
use crossbeam_channel::{unbounded, Receiver, Sender};
use nix::sys::eventfd::{EfdFlags, EventFd};

use self::counters::StatsRegistry;
use crate::{AccessCell, AccessPublisher, Caps, EngineError, MainEvent, Stats, SubsysId};

/// Settings of the soft engine.
#[derive(Clone, Debug)]
pub struct SoftConfig {
    /// Largest data transfer of one command (bytes, a power of two, at least 4 KiB).
    pub max_io_size: u32,
    /// Deepest I/O queue the engine accepts.
    pub max_queue_depth: u16,
    /// In-capsule data for I/O queues (bytes). Admin queues always accept 8 KiB.
    pub max_incapsule_data: u32,
    /// MAXH2CDATA advertised in ICResp.
    pub max_h2c_data: u32,
    /// Cap on each thread's data-buffer pool (bytes).
    pub buffer_pool_bytes: usize,
    /// Backend queue depth created per (thread, namespace).
    pub backend_queue_depth: u32,
    /// A backend command outstanding longer than this, while its namespace's backend
    /// completed nothing on the thread for as long (or outstanding ten times this, in any
    /// case), raises [`MainEvent::BackendTimeout`](crate::MainEvent::BackendTimeout).
    pub backend_timeout: std::time::Duration,
    /// Bounds and deadlines on peers.
    pub limits: crate::EngineLimits,
}

/// Default largest transfer of one command: 1 MiB (MDTS 8). Linux nvmet sets no limit on
/// TCP; 128 KiB made the Linux host's unsplit passthrough I/O (`nvme read`/`nvme write`
/// of 256 KiB) fail. Buffers are pooled by power-of-two size class, so small I/O still
/// takes small buffers.
pub const DEFAULT_MAX_IO_SIZE: u32 = 1 << 20;
/// Largest H2CData PDU the engine accepts (MAXH2CDATA), unless the max I/O size is
/// smaller: a larger transfer arrives in several H2CData PDUs into one buffer.
pub const DEFAULT_MAX_H2C_DATA: u32 = 128 * 1024;

impl SoftConfig {
    /// The settings for a largest transfer of `max_io_size` bytes: MAXH2CDATA no larger
    /// than it, and a per-thread buffer pool that holds at least 64 transfers of that size
    /// (and never less than the 256 MiB default).
    pub fn with_max_io_size(max_io_size: u32) -> SoftConfig {
        let d = SoftConfig::default();
        SoftConfig {
            max_io_size,
            max_h2c_data: DEFAULT_MAX_H2C_DATA.min(max_io_size),
            buffer_pool_bytes: d.buffer_pool_bytes.max(64 * max_io_size as usize),
            ..d
        }
    }
}

impl Default for SoftConfig {
    fn default() -> Self {
        SoftConfig {
            max_io_size: DEFAULT_MAX_IO_SIZE,
            max_queue_depth: 128,
            max_incapsule_data: 8192,
            max_h2c_data: DEFAULT_MAX_H2C_DATA,
            buffer_pool_bytes: 256 << 20,
            backend_queue_depth: 256,
            backend_timeout: std::time::Duration::from_secs(30),
            limits: crate::EngineLimits::default(),
        }
    }
}

/// An IO context not started yet: `Send`, so it can be moved to its thread.
pub struct StaIoSeed {
    cfg: SoftConfig,
    rx: Receiver<Ctrl>,
    ack: Sender<Ack>,
    stats: Arc<StatsRegistry>,
    /// Registered when the seed is made, on the main context's thread, so the counters'
    /// order is the order of `io_create` calls (what `Stats::threads` promises and what
    /// the application's thread numbers follow), not the order the threads start in.
    counters: Arc<counters::ThreadCounters>,
    contexts: Contexts,
    /// Written by IO contexts that need this one's attention now (a fence).
    waker: Arc<EventFd>,
}

/// Every IO context's control channel, and the event that wakes it up.
pub(crate) type Contexts = Arc<std::sync::Mutex<Vec<(Sender<Ctrl>, Arc<EventFd>)>>>;

impl StaIoSeed {
    /// Build the IO context on the thread that will own it (DOCA: connect the IO context
    /// to that thread's progress engine and start it).
    pub fn start(self) -> Result<StaIo, EngineError> {
        let (cfg, rx, ack) = (self.cfg, self.rx, self.ack);
        StaIo::new(
            cfg,
            rx,
            ack,
            self.stats,
            self.counters,
            self.contexts,
            self.waker,
        )
        .map_err(|source| EngineError::Io {
            what: "creating the IO context's epoll set",
            source,
        })
    }
}

/// Control messages from the main context to IO contexts.
pub(crate) enum Ctrl {
    NsAdd {
        subsys: SubsysId,
        nsid: u32,
        backend: Arc<dyn Backend>,
        /// The namespace's access view, shared with the publisher.
        access: Arc<AccessCell>,
        /// The namespace's fused Compare and Write ranges, shared by every IO thread.
        fused: Arc<FusedRanges>,
    },
    /// The namespace's backend grew: serve commands up to `nblocks`.
    NsResize {
        subsys: SubsysId,
        nsid: u32,
        nblocks: u64,
    },
    /// Stop offloading to the namespace; when its in-flight backend requests are done
    /// (`fail_outstanding`: answered at once with an error, without waiting), destroy the
    /// thread's queue and acknowledge.
    NsRemove {
        subsys: SubsysId,
        nsid: u32,
        task: u64,
        fail_outstanding: bool,
    },
    /// `ns_fence` from some IO context: arrive once this context's backend requests in
    /// flight for the namespace now have completed.
    Fence {
        subsys: SubsysId,
        nsid: u32,
        fence: crate::Fence,
    },
}

/// The LBA ranges of fused Compare and Write pairs running on one namespace, on any IO
/// thread (see the module docs), and the commands that wait for one of them on another
/// IO thread. Plain writes read `claimed` (one relaxed load, a line written only when a
/// pair starts or ends) and take the lock only while some pair holds a range.
///
/// Waiting takes turns: a command that waits for a pair on another thread gets a ticket,
/// and a pair may claim a range only if no command with an older ticket waits for an
/// overlapping one. Without that, a host that kept a few pairs in flight on one range
/// held it for good (each pair claimed it again as the one before let go), and a write,
/// deallocation or Copy to that range from another IO thread never ran.
/// Each IO thread shows its waiting commands as one entry, their oldest ticket and all
/// the blocks they wait for (from the first to the last), so a claim looks at one entry
/// per thread however many commands wait. That holds back some pairs that need not
/// wait, never the oldest waiting command: it only waits for pairs that claimed before
/// it, so each in turn goes on.
#[derive(Default)]
pub(crate) struct FusedRanges {
    inner: std::sync::Mutex<Claims>,
    claimed: LineOf<std::sync::atomic::AtomicUsize>,
    next_ticket: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Claims {
    held: Vec<(u64, u32)>,
    /// Per IO thread with commands waiting: (thread, oldest ticket, blocks).
    waiting: Vec<(u64, u64, (u64, u64))>,
    next_owner: u64,
}

/// The blocks `range` (first LBA, count) covers, as `start..end`.
pub(crate) fn span_of(range: (u64, u32)) -> (u64, u64) {
    (range.0, range.0.saturating_add(u64::from(range.1)))
}

pub(crate) fn spans_overlap(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// A value on cache lines of its own: `claimed` is read by every write on every IO
/// thread, and must not share a line with the mutex pairs take.
#[derive(Default)]
#[repr(align(128))]
struct LineOf<T>(T);

impl<T> std::ops::Deref for LineOf<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl FusedRanges {
    fn inner(&self) -> std::sync::MutexGuard<'_, Claims> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A key of its own for one IO thread's [`cmd::FusedLocks`].
    pub fn new_owner(&self) -> u64 {
        let mut c = self.inner();
        c.next_owner += 1;
        c.next_owner
    }

    /// Claims `range` for a pair holding `ticket` (`u64::MAX` when it has not waited)
    /// unless a pair on some thread holds an overlapping range or a command with an
    /// older ticket waits for one.
    pub fn claim(&self, range: (u64, u32), ticket: u64) -> bool {
        let mut c = self.inner();
        let span = span_of(range);
        let held = c.held.iter().any(|&l| spans_overlap(span_of(l), span));
        if held
            || c.waiting
                .iter()
                .any(|w| w.1 < ticket && spans_overlap(w.2, span))
        {
            return false;
        }
        c.held.push(range);
        self.claimed.store(c.held.len(), Ordering::Relaxed);
        true
    }

    pub fn release(&self, range: (u64, u32)) {
        let mut c = self.inner();
        if let Some(i) = c.held.iter().position(|&l| l == range) {
            c.held.swap_remove(i);
        }
        self.claimed.store(c.held.len(), Ordering::Relaxed);
    }

    /// A ticket for a command that starts waiting: later than every one before.
    pub fn new_ticket(&self) -> u64 {
        self.next_ticket.fetch_add(1, Ordering::Relaxed)
    }

    /// Sets what `owner`'s commands wait for: their oldest ticket and all their blocks,
    /// or nothing.
    pub fn set_waiting(&self, owner: u64, now: Option<(u64, (u64, u64))>) {
        let mut c = self.inner();
        c.waiting.retain(|w| w.0 != owner);
        if let Some((ticket, span)) = now {
            c.waiting.push((owner, ticket, span));
        }
    }

    /// Whether a pair on some IO thread holds a range. A claim is seen by every IO
    /// thread that handled the fence its pair sent after claiming (`Core::run_fused`):
    /// the fence's message orders the two.
    #[inline]
    pub fn any_claimed(&self) -> bool {
        self.claimed.load(Ordering::Relaxed) > 0
    }

    /// Whether a pair on some IO thread holds a range overlapping one of `ranges`.
    pub fn overlaps(&self, ranges: &[(u64, u32)]) -> bool {
        let c = self.inner();
        ranges.iter().any(|&r| {
            let span = span_of(r);
            c.held.iter().any(|&l| spans_overlap(span_of(l), span))
        })
    }
}

/// A fence on namespace `nsid` of `subsys` sent to every IO context
/// ([`crate::IoContext::ns_fence`]); each handles it on its next pass. The context whose
/// wake-up event is `me` is not sent it: the caller, that context, adds it itself.
pub(crate) fn fence_all(
    contexts: &Contexts,
    subsys: SubsysId,
    nsid: u32,
    me: Option<&Arc<EventFd>>,
) -> crate::Fence {
    let contexts = contexts.lock().unwrap_or_else(|e| e.into_inner());
    let fence = match me {
        // The caller may nap while it waits (`StaIo::progress`): the last to arrive wakes
        // it.
        Some(m) => {
            let m = m.clone();
            crate::Fence::with_on_done(contexts.len(), move || {
                let _ = m.write(1);
            })
        }
        None => crate::Fence::new(contexts.len()),
    };
    for (tx, waker) in contexts.iter() {
        if me.is_some_and(|m| Arc::ptr_eq(m, waker)) {
            continue;
        }
        let m = Ctrl::Fence {
            subsys,
            nsid,
            fence: fence.clone(),
        };
        if tx.send(m).is_err() {
            // That context is gone (its thread ended): it runs nothing any more.
            fence.arrive();
            continue;
        }
        // A context asleep in its wait would see the message only when the wait ends.
        // Fails only if the counter is full (it is read on every wake-up).
        let _ = waker.write(1);
    }
    fence
}

/// Acknowledgements from IO contexts.
pub(crate) enum Ack {
    NsRemoved {
        task: u64,
    },
    BackendTimeout {
        subsys: SubsysId,
        nsid: u32,
        commands: u32,
    },
    BackendGone {
        subsys: SubsysId,
        nsid: u32,
    },
}

struct PendingRemove {
    subsys: SubsysId,
    nsid: u32,
    user: u64,
    waiting: usize,
    /// `be_queue_destroy` rather than `ns_remove`.
    destroy: bool,
}

/// The main context (DOCA: `struct doca_sta`).
/// A namespace as the engine knows it: subsystem, NSID, backend, and the fused Compare
/// and Write ranges its IO threads share.
type NsEntry = (SubsysId, u32, Arc<dyn Backend>, Arc<FusedRanges>);

pub struct Sta {
    cfg: SoftConfig,
    /// Live subsystems by id; ids are never reused (`next_subsystem`).
    subsystems: std::collections::HashMap<u32, String>,
    next_subsystem: u32,
    namespaces: Vec<NsEntry>,
    io_tx: Vec<Sender<Ctrl>>,
    /// The same senders, for IO contexts to reach each other (`ns_fence`).
    contexts: Contexts,
    ack_tx: Sender<Ack>,
    ack_rx: Receiver<Ack>,
    removes: HashMap<u64, PendingRemove>,
    next_task: u64,
    stats: Arc<StatsRegistry>,
    access: AccessPublisher,
}

impl Sta {
    pub fn new(cfg: SoftConfig) -> Sta {
        let (ack_tx, ack_rx) = unbounded();
        Sta {
            cfg,
            subsystems: std::collections::HashMap::new(),
            next_subsystem: 0,
            namespaces: Vec::new(),
            io_tx: Vec::new(),
            contexts: Contexts::default(),
            ack_tx,
            ack_rx,
            removes: HashMap::new(),
            next_task: 1,
            stats: Arc::new(StatsRegistry::default()),
            access: AccessPublisher::default(),
        }
    }

    fn detach(
        &mut self,
        subsys: SubsysId,
        nsid: u32,
        user: u64,
        fail_outstanding: bool,
    ) -> Result<(), EngineError> {
        let pos = self
            .namespaces
            .iter()
            .position(|(s, n, _, _)| *s == subsys && *n == nsid)
            .ok_or(EngineError::NoNamespace(nsid))?;
        self.namespaces.swap_remove(pos);
        self.access.forget(subsys, nsid);
        let task = self.next_task;
        self.next_task += 1;
        let mut waiting = 0;
        for tx in &self.io_tx {
            let m = Ctrl::NsRemove {
                subsys,
                nsid,
                task,
                fail_outstanding,
            };
            if tx.send(m).is_ok() {
                waiting += 1;
            }
        }
        self.removes.insert(
            task,
            PendingRemove {
                subsys,
                nsid,
                user,
                waiting,
                destroy: fail_outstanding,
            },
        );
        Ok(())
    }
}

impl crate::Engine for Sta {
    type Io = StaIo;
    type Seed = StaIoSeed;

    fn name(&self) -> &'static str {
        "soft"
    }

    fn caps(&self) -> Caps {
        Caps {
            max_io_size: self.cfg.max_io_size,
            max_queue_depth: self.cfg.max_queue_depth,
            max_incapsule_data: self.cfg.max_incapsule_data,
            max_h2c_data: self.cfg.max_h2c_data,
            tcp: true,
            rdma: true,
            access_views: true,
            copy: true,
            fused_compare_write: true,
            resize: true,
        }
    }

    fn stats(&self) -> Stats {
        Stats::new(self.stats.clone())
    }

    /// DOCA: `doca_sta_subsystem_create`.
    fn subsystem_create(&mut self, nqn: &str) -> Result<SubsysId, EngineError> {
        // A new object each time, as DOCA's: a subsystem removed and added again while the
        // old one still drains is another subsystem.
        // (Only what is live is kept: a reload loop that removes and adds subsystems
        // leaves nothing behind.)
        let id = self.next_subsystem;
        self.next_subsystem = id.checked_add(1).ok_or_else(|| {
            EngineError::Unsupported("no subsystem ids left (2^32 were created)".into())
        })?;
        self.subsystems.insert(id, nqn.to_string());
        Ok(SubsysId(id))
    }

    /// DOCA: `doca_sta_subsystem_destroy`; only once it has no namespaces.
    fn subsystem_destroy(&mut self, id: SubsysId) -> Result<(), EngineError> {
        if self.namespaces.iter().any(|(s, _, _, _)| *s == id) {
            return Err(EngineError::SubsystemInUse);
        }
        match self.subsystems.remove(&id.0) {
            Some(_) => {
                self.stats.forget_subsystem(id);
                Ok(())
            }
            None => Err(EngineError::NoSubsystem),
        }
    }

    /// DOCA: `doca_sta_subsystem_add_ns`. Every IO context starts serving the namespace
    /// from its own backend queue once it has processed the message (before any host can
    /// learn of the namespace from the control path).
    fn ns_add(
        &mut self,
        subsys: SubsysId,
        nsid: u32,
        backend: Arc<dyn Backend>,
    ) -> Result<(), EngineError> {
        if !self.subsystems.contains_key(&subsys.0) {
            return Err(EngineError::NoSubsystem);
        }
        let bs = backend.block_size();
        if !bs.is_power_of_two() || !(512..=65536).contains(&bs) {
            return Err(EngineError::BlockSize(bs));
        }
        if self
            .namespaces
            .iter()
            .any(|(s, n, _, _)| *s == subsys && *n == nsid)
        {
            return Err(EngineError::NsExists(nsid));
        }
        let access = self.access.cell(subsys, nsid);
        let fused = Arc::new(FusedRanges::default());
        for tx in &self.io_tx {
            let m = Ctrl::NsAdd {
                subsys,
                nsid,
                backend: backend.clone(),
                access: access.clone(),
                fused: fused.clone(),
            };
            if tx.send(m).is_err() {
                // Only when that IO context was dropped (its thread ended): it serves
                // nothing any more, so there is nothing to tell it.
                tracing::debug!("ns_add: an IO context is gone");
            }
        }
        self.namespaces.push((subsys, nsid, backend, fused));
        Ok(())
    }

    /// Every IO context serves up to the new end once it has processed the message, as
    /// for [`Engine::ns_add`]; contexts created later read the size from the backend.
    fn ns_resize(
        &mut self,
        subsys: SubsysId,
        nsid: u32,
        num_blocks: u64,
    ) -> Result<(), EngineError> {
        if !self
            .namespaces
            .iter()
            .any(|(s, n, _, _)| *s == subsys && *n == nsid)
        {
            return Err(EngineError::NoNamespace(nsid));
        }
        for tx in &self.io_tx {
            let m = Ctrl::NsResize {
                subsys,
                nsid,
                nblocks: num_blocks,
            };
            if tx.send(m).is_err() {
                tracing::debug!("ns_resize: an IO context is gone");
            }
        }
        Ok(())
    }

    /// DOCA: `doca_sta_subsystem_task_rm_ns_alloc_init` + submit. New I/O to the
    /// namespace stops being offloaded at once; [`MainEvent::NsRemoved`] reports when
    /// every IO context has finished its in-flight I/O and destroyed its backend queue.
    fn ns_remove(&mut self, subsys: SubsysId, nsid: u32, user: u64) -> Result<(), EngineError> {
        self.detach(subsys, nsid, user, false)
    }

    /// DOCA: `doca_sta_be_destroy_queue_task_alloc_init` + submit, for the soft engine's
    /// backend queues of one namespace (one per IO thread): every command outstanding on
    /// them is answered at once with Aborted - SQ Deletion (requests not yet handed to
    /// the backend are dropped, requests the backend holds are abandoned and their late
    /// completions discarded), then the queues are freed as soon as the backend returns
    /// what it holds. The namespace is no longer offloaded afterwards: its I/O reaches the
    /// application. For a backend that vanished or hangs. [`MainEvent::BeQueueDestroyed`]
    /// reports the end.
    fn be_queue_destroy(
        &mut self,
        subsys: SubsysId,
        nsid: u32,
        user: u64,
    ) -> Result<(), EngineError> {
        self.detach(subsys, nsid, user, true)
    }

    /// DOCA: `doca_sta_io_create`. Returns the seed of an IO context: move it to its IO
    /// thread and call [`StaIoSeed::start`] there (the context's buffer pool and backend
    /// queues belong to that thread and never leave it). It will know every namespace
    /// added so far.
    fn io_create(&mut self) -> Result<StaIoSeed, EngineError> {
        let (tx, rx) = unbounded();
        for (s, n, b, f) in &self.namespaces {
            // Cannot fail: the receiving end is in the seed returned below.
            let _ = tx.send(Ctrl::NsAdd {
                subsys: *s,
                nsid: *n,
                backend: b.clone(),
                access: self.access.cell(*s, *n),
                fused: f.clone(),
            });
        }
        let waker = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map(Arc::new)
            .map_err(|e| EngineError::Io {
                what: "creating the IO context's wake-up event",
                source: e.into(),
            })?;
        self.contexts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((tx.clone(), waker.clone()));
        self.io_tx.push(tx);
        Ok(StaIoSeed {
            waker,
            cfg: self.cfg.clone(),
            rx,
            ack: self.ack_tx.clone(),
            stats: self.stats.clone(),
            counters: self.stats.register_thread(),
            contexts: self.contexts.clone(),
        })
    }

    /// DOCA: `doca_pe_progress` on the main PE. Returns one finished task, if any.
    fn progress(&mut self) -> Option<MainEvent> {
        while let Ok(ack) = self.ack_rx.try_recv() {
            match ack {
                Ack::NsRemoved { task } => {
                    if let Some(p) = self.removes.get_mut(&task) {
                        p.waiting = p.waiting.saturating_sub(1);
                    }
                }
                Ack::BackendTimeout {
                    subsys,
                    nsid,
                    commands,
                } => {
                    return Some(MainEvent::BackendTimeout {
                        subsys,
                        nsid,
                        commands,
                        limit: self.cfg.backend_timeout,
                    })
                }
                Ack::BackendGone { subsys, nsid } => {
                    return Some(MainEvent::BackendGone { subsys, nsid })
                }
            }
        }
        let done = self
            .removes
            .iter()
            .find(|(_, p)| p.waiting == 0)
            .map(|(t, _)| *t)?;
        let p = self.removes.remove(&done)?;
        let (subsys, nsid, user) = (p.subsys, p.nsid, p.user);
        Some(if p.destroy {
            MainEvent::BeQueueDestroyed { subsys, nsid, user }
        } else {
            MainEvent::NsRemoved { subsys, nsid, user }
        })
    }

    /// Namespace removals still waiting for IO contexts.
    fn pending_tasks(&self) -> usize {
        self.removes.len()
    }

    /// The publisher of namespace access views (see [`crate::access`]).
    fn access_publisher(&self) -> AccessPublisher {
        self.access.clone()
    }
}
