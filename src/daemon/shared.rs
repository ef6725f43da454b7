//! What the main thread, the IO threads and the RDMA CM thread share: the target (the
//! protocol's state, locked only by the non-offloaded path and the control plane), the
//! subsystem registry, the listener directory, connection records for log lines, the
//! refusal log, and the channels to the IO threads.

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crossbeam_channel::Sender;
use nvmf::target::{Action, CounterSource, IoCounters, ListenerInfo, Notice, Target};
use sta::QpHandle;

use super::listeners::ListenerDirectory;
use super::queue_facts::QueueFacts;
use super::subsystems::Subsystems;
use crate::rdma_cm::RdmaMsg;
use crate::refusals::{ConnInfo, RefusalLog};

/// What the main thread, the RDMA CM thread and other IO threads send to an IO thread.
pub(super) enum ThreadMsg {
    /// A TCP connection from `peer`, accepted by the listener named `listener`.
    Conn {
        sock: TcpStream,
        peer: SocketAddr,
        listener: String,
        info: ListenerInfo,
    },
    /// From the RDMA CM thread: a connection to accept, or an event of one.
    Rdma(RdmaMsg),
    /// Something the target decided about a queue this thread owns.
    Action(Action),
    /// Graceful stop: disconnect every QP, drain, exit.
    Stop,
}

/// A queue key names the IO thread (top byte) and the QP on it.
pub(super) fn queue_key(thread: usize, qp: QpHandle) -> u64 {
    (thread as u64) << 56 | (qp.as_u64() & ((1 << 56) - 1))
}

/// The IO thread a queue key belongs to.
pub(super) fn thread_of(key: u64) -> usize {
    (key >> 56) as usize
}

/// The queue key an action concerns.
pub(super) fn action_key(a: &Action) -> u64 {
    match a {
        Action::CompleteHeld { key, .. } | Action::Disconnect { key, .. } => *key,
    }
}

pub(super) struct Shared {
    target: Mutex<Target>,
    /// Every subsystem, as the target and the engine know it (`subsystems.rs`).
    pub subsystems: Subsystems,
    pub stats: sta::Stats,
    /// One channel per IO thread.
    pub threads: Vec<Sender<ThreadMsg>>,
    /// QPs per IO thread (new connections go to the thread with the fewest).
    pub qp_counts: Vec<AtomicUsize>,
    /// Every open listener, TCP and RDMA (kept by `Listeners`, read by every thread).
    pub listeners: ListenerDirectory,
    /// Queue keys of NVMe/RDMA queues (every other queue is NVMe/TCP), for metrics labels.
    rdma_queues: Mutex<HashSet<u64>>,
    /// Peer and listener of every connection by queue key, for refusal lines (written at
    /// accept and close only).
    conns: Mutex<HashMap<u64, ConnInfo>>,
    /// Refusal counters and the rate-limited refusal log.
    pub refusals: RefusalLog,
    /// Accept time and depth of every queue, for the control socket.
    pub queue_facts: QueueFacts,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A thread that panicked while holding one of these locks left plain data behind (no
    // invariant spans an unlock), so the data is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn new(target: Target, stats: sta::Stats, threads: Vec<Sender<ThreadMsg>>) -> Shared {
        let n = threads.len();
        Shared {
            target: Mutex::new(target),
            subsystems: Subsystems::default(),
            stats,
            threads,
            qp_counts: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            listeners: ListenerDirectory::default(),
            rdma_queues: Mutex::new(HashSet::new()),
            conns: Mutex::new(HashMap::new()),
            refusals: RefusalLog::new(),
            queue_facts: QueueFacts::default(),
        }
    }

    pub fn target(&self) -> MutexGuard<'_, Target> {
        lock(&self.target)
    }

    /// The IO thread with the fewest QPs, counted as having one more (the connection about
    /// to be sent there).
    pub fn pick_thread(&self) -> usize {
        let t = (0..self.qp_counts.len())
            .min_by_key(|&t| self.qp_counts[t].load(Ordering::Relaxed))
            .unwrap_or(0);
        if let Some(c) = self.qp_counts.get(t) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        t
    }

    /// Send a message to IO thread `t`. This fails only once that thread has exited: it
    /// exits when told to stop (after closing every QP it had, so an action for one of
    /// them has nothing left to act on) or by dying, which stops the daemon. Either way
    /// the message can be dropped; what it carried goes with it (a socket is closed, a
    /// connect request is rejected by its drop).
    pub fn send(&self, t: usize, msg: ThreadMsg) {
        let what = match &msg {
            ThreadMsg::Conn { .. } => "a connection",
            ThreadMsg::Rdma(_) => "an RDMA connection event",
            ThreadMsg::Action(_) => "a queue action",
            ThreadMsg::Stop => "stop",
        };
        match self.threads.get(t) {
            Some(tx) if tx.send(msg).is_ok() => {}
            _ => tracing::debug!("io thread {t} has exited: {what} for it was dropped"),
        }
    }

    /// Send actions to the IO threads that own the queues they concern.
    pub fn route(&self, actions: Vec<Action>) {
        for a in actions {
            self.send(thread_of(action_key(&a)), ThreadMsg::Action(a));
        }
    }

    pub fn conn(&self, key: u64) -> Option<ConnInfo> {
        lock(&self.conns).get(&key).cloned()
    }

    /// A connection was accepted as queue `key` (`rdma`: over NVMe/RDMA).
    pub fn conn_opened(&self, key: u64, info: ConnInfo, rdma: bool) {
        lock(&self.conns).insert(key, info);
        self.queue_facts.opened(key);
        if rdma {
            lock(&self.rdma_queues).insert(key);
        }
    }

    /// Queue `key` is gone.
    pub fn conn_closed(&self, key: u64) {
        lock(&self.conns).remove(&key);
        self.queue_facts.closed(key);
        lock(&self.rdma_queues).remove(&key);
    }

    /// `rdma` or `tcp`, for metrics labels.
    pub fn transport_of(&self, key: u64) -> &'static str {
        if lock(&self.rdma_queues).contains(&key) {
            "rdma"
        } else {
            "tcp"
        }
    }

    /// Logs and counts what the target had to say (refusals, an empty host NQN), from
    /// `Target::take_notices` (called with the target unlocked).
    pub fn report_notices(&self, (notices, dropped): (Vec<Notice>, u64)) {
        if dropped > 0 {
            tracing::warn!("{dropped} refusal notice(s) were dropped (too many at once)");
        }
        for n in notices {
            match n {
                Notice::Refused(r) => {
                    let c = self.conn(r.key);
                    let line = crate::refusals::describe(&r, c.as_ref());
                    self.refusals
                        .report(r.reason.label(), c.and_then(|c| c.peer), &line);
                }
                Notice::EmptyHostNqnAccepted { subnqn, key } => {
                    let c = self.conn(key);
                    tracing::warn!(
                        "{}: accepted an empty host NQN for subsystem {subnqn:?} (it allows any \
                         host). SPDK's spdk_nvme_perf sends one when its -r option names no \
                         hostnqn; give it one (hostnqn:nqn....) to tell hosts apart. Said once \
                         per subsystem.",
                        crate::refusals::where_from(c.as_ref())
                    );
                }
            }
        }
    }
}

/// The engine's counters of a namespace, as the target's SMART log wants them.
pub(super) struct Counters<'a>(pub &'a Shared);

impl CounterSource for Counters<'_> {
    fn namespace_counters(&self, subnqn: &str, nsid: u32) -> IoCounters {
        let Some(id) = self.0.subsystems.id(subnqn) else {
            return IoCounters::default();
        };
        let t = self.0.stats.namespace(id, nsid);
        IoCounters {
            read_cmds: t.read_cmds,
            write_cmds: t.write_cmds,
            read_bytes: t.read_bytes,
            write_bytes: t.write_bytes,
            media_errors: t.media_errors(),
        }
    }
}
