//! An IO thread: it owns one engine IO context and runs it to completion. Connections
//! arrive as messages from the main thread (TCP) or the RDMA CM thread; the engine
//! serves the offloaded I/O itself and hands everything else up as events, which this
//! thread answers through the shared `nvmf::target::Target` (`commands.rs`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use nvmf::spec::{Cqe, DataDirection, Sqe, Status};
use nvmf::target::{Action, QueueOrigin, QueueRef, Transport};
use sta::{AccessKey, CmdToken, Event, IoContext, QpHandle, SubsysId, TaskError, TaskKind};

use super::conn_limits::ConnSlot;
use super::shared::{queue_key, thread_of, Shared, ThreadMsg};
use crate::rdma_cm::RdmaMsg;
use crate::refusals::ConnInfo;

/// An IO thread keeps polling without sleeping this long after its last work.
const SPIN_WINDOW: Duration = Duration::from_millis(2);
/// Longest sleep of an idle IO thread (messages from other threads wait at most this).
const IDLE_WAIT: Duration = Duration::from_millis(5);
/// The longest wait while completions are deferred (`deferred`).
const DEFERRED_POLL: Duration = Duration::from_micros(200);
/// New connections an IO thread takes per pass. A burst of connect requests (an RDMA
/// accept creates a QP and a CQ and registers memory) is spread over passes, each of
/// which also serves the queues the thread already has.
const ACCEPTS_PER_PASS: usize = 16;

/// A command waiting for the host's data (`rdma_read`) before it can run.
pub(super) struct Waiting {
    pub qp: QpHandle,
    pub token: CmdToken,
    pub sqe: Sqe,
}

/// What this thread knows of one of its QPs.
#[derive(Default)]
pub(super) struct QpApp {
    pub queue: Option<QueueRef>,
    /// The target was told this queue is gone.
    pub closed: bool,
    /// Where the connection came in (for Connect).
    pub origin: QueueOrigin,
    /// An I/O queue that must authenticate first: its subsystem and access key are bound
    /// to the QP (the engine then serves I/O itself, past the target) only once it has.
    pub offload_after_auth: Option<(SubsysId, AccessKey)>,
    /// The TLS PSK's owner, for a queue that came over TLS.
    pub tls: Option<sta::TlsPeerInfo>,
    /// Its place under the connection limits, given back when this goes.
    pub slot: Option<ConnSlot>,
    /// The engine's limit that ends it was logged already (with its C2HTermReq).
    pub limit_logged: bool,
}

pub(super) struct IoThread<I: IoContext> {
    pub index: usize,
    pub io: I,
    pub shared: Arc<Shared>,
    rx: Receiver<ThreadMsg>,
    pub qps: HashMap<QpHandle, QpApp>,
    /// Commands the target holds (Asynchronous Event Requests, Authentication Sends
    /// waiting for DH work), by queue and CID.
    pub held: HashMap<(QueueRef, u16), (QpHandle, CmdToken)>,
    waiting: HashMap<u64, Waiting>,
    next_wait: u64,
    stopping: bool,
    /// When `Stop` arrived, for the drain log.
    stop_started: Option<Instant>,
    /// RDMA connections of this thread: cm_id -> QP.
    rdma_ids: HashMap<u64, QpHandle>,
    /// Completions waiting for a namespace's fence or for the PTPL state file
    /// (`commands.rs`), answered once done.
    pub deferred: Vec<Deferred>,
    /// Commands the engine failed this pass (`io_errors.rs`).
    pub failures: super::io_errors::Failures,
}

/// A completion held back until the preempted hosts' commands are done (Preempt and
/// Abort: `fence`) and the reservation state it made is on disk (`ptpl`, 0 for none).
pub struct Deferred {
    pub fence: Option<sta::Fence>,
    pub ptpl: u64,
    pub qp: QpHandle,
    pub token: CmdToken,
    pub cqe: Cqe,
}

impl<I: IoContext> IoThread<I> {
    pub fn new(index: usize, io: I, shared: Arc<Shared>, rx: Receiver<ThreadMsg>) -> Self {
        IoThread {
            index,
            io,
            shared,
            rx,
            qps: HashMap::new(),
            held: HashMap::new(),
            waiting: HashMap::new(),
            next_wait: 1,
            stopping: false,
            stop_started: None,
            rdma_ids: HashMap::new(),
            deferred: Vec::new(),
            failures: Default::default(),
        }
    }

    /// Until told to stop and drained.
    pub fn run(mut self) {
        // When the last pass that found work ended, read once per busy streak (at its
        // first idle pass), not on every busy pass: the clock is not free at a million
        // passes a second. `None` while the streak goes on.
        let mut idle_since: Option<Instant> = Some(Instant::now());
        // The QP count the acceptor balances by, as last published.
        let mut published = usize::MAX;
        loop {
            // A connection handed to this thread was counted by the acceptor already
            // (`pick_thread`); the count is published again after one, taken or not.
            let mut conns = 0;
            while conns < ACCEPTS_PER_PASS {
                let Ok(m) = self.rx.try_recv() else { break };
                conns += usize::from(matches!(
                    m,
                    ThreadMsg::Conn { .. } | ThreadMsg::Rdma(RdmaMsg::Connect { .. })
                ));
                self.on_msg(m);
            }
            // Busy-poll while work came recently (no wake-up latency under load), block in
            // the engine once idle so an idle daemon costs no CPU; not while messages wait.
            let wait = match idle_since {
                _ if !self.rx.is_empty() => Duration::ZERO,
                // Deferred completions (a fence, a PTPL write that may take milliseconds
                // of fsync) are looked at often, but not by spinning for their whole wait.
                Some(t) if t.elapsed() >= SPIN_WINDOW && !self.deferred.is_empty() => DEFERRED_POLL,
                Some(t) if t.elapsed() >= SPIN_WINDOW => IDLE_WAIT,
                _ => Duration::ZERO,
            };
            let mut did = self.io.progress(wait);
            while let Some(ev) = self.io.poll_event() {
                did = true;
                self.on_event(ev);
            }
            if !self.failures.is_empty() {
                self.record_failures();
            }
            if !self.deferred.is_empty() {
                did |= self.answer_deferred();
            }
            if did {
                idle_since = None;
            } else if idle_since.is_none() {
                idle_since = Some(Instant::now());
            }
            // Stored when it changes, not every pass: the counts of all IO threads share
            // a cache line, and a store per pass would pull it from core to core.
            if conns > 0 || self.qps.len() != published {
                published = self.qps.len();
                self.shared.qp_counts[self.index].store(published, Ordering::Relaxed);
            }
            if self.stopping && self.qps.is_empty() && !self.io.busy() {
                let took = self.stop_started.map_or(Duration::ZERO, |t| t.elapsed());
                tracing::info!("io{}: drained in {took:?}", self.index);
                return;
            }
        }
    }

    fn on_msg(&mut self, m: ThreadMsg) {
        match m {
            ThreadMsg::Conn {
                sock,
                peer,
                listener,
                info,
                slot,
            } => {
                if self.stopping {
                    // Dropping the socket closes it: the host retries elsewhere or later.
                    return;
                }
                let local = sock.local_addr().ok().map(|a| a.ip().to_canonical());
                let accepted = match self.shared.listeners.tls(&listener) {
                    Some(t) => self.io.qp_accept_tcp_tls(sock, 0, &t),
                    None => self.io.qp_accept_tcp(sock, 0),
                };
                match accepted {
                    Ok(qp) => {
                        tracing::debug!(qp = qp.as_u64(), "io{}: accepted {peer}", self.index);
                        let conn = ConnInfo {
                            peer: Some(peer),
                            listener: Some(listener),
                        };
                        let origin = QueueOrigin {
                            listener: Some(info),
                            local,
                            peer: Some(peer.ip().to_canonical()),
                        };
                        self.add_qp(qp, conn, origin, false, slot);
                    }
                    Err(e) => {
                        tracing::warn!("io{}: cannot take connection from {peer}: {e}", self.index)
                    }
                }
            }
            ThreadMsg::Rdma(RdmaMsg::Connect { req, depth, qid }) => {
                let id = req.key().as_u64();
                if self.stopping {
                    req.reject(nvmf::rdma::RejectStatus::NoResources);
                    return;
                }
                let (peer, local) = (req.peer, req.local);
                let listener = local.and_then(|l| self.shared.listeners.find(Transport::Rdma, l));
                // RDMA connections are held to the same limits as TCP ones (a queue pair
                // and its receive buffers per connect request, before any NVMe Connect).
                let slot = match self.shared.conn_limits.admit(peer.map(|p| p.ip())) {
                    Ok(s) => s,
                    Err(l) => {
                        req.reject(nvmf::rdma::RejectStatus::NoResources);
                        let conn = ConnInfo {
                            peer,
                            listener: listener.map(|(n, _)| n),
                        };
                        self.shared.limit_refused(l, &conn);
                        return;
                    }
                };
                match self.io.qp_accept_rdma(req, depth, 0) {
                    Ok(qp) => {
                        tracing::debug!(
                            qp = qp.as_u64(),
                            "io{}: accepted an RDMA connection (qid {qid}, depth {depth})",
                            self.index
                        );
                        let conn = ConnInfo {
                            peer,
                            listener: listener.as_ref().map(|(n, _)| n.clone()),
                        };
                        let origin = QueueOrigin {
                            listener: listener.map(|(_, l)| l),
                            local: local.map(|a| a.ip().to_canonical()),
                            peer: peer.map(|a| a.ip().to_canonical()),
                        };
                        self.add_qp(qp, conn, origin, true, slot);
                        self.rdma_ids.insert(id, qp);
                    }
                    Err(e) => {
                        let conn = ConnInfo {
                            peer,
                            listener: listener.map(|(n, _)| n),
                        };
                        tracing::warn!(
                            "io{}: {}: cannot accept the RDMA connection (rejected): {e}",
                            self.index,
                            crate::refusals::where_from(Some(&conn))
                        )
                    }
                }
            }
            ThreadMsg::Rdma(RdmaMsg::Event { id, ev }) => {
                let Some(&qp) = self.rdma_ids.get(&id.as_u64()) else {
                    // The QP was disconnected and forgotten already; nothing to tell.
                    tracing::debug!("io{}: RDMA CM event {ev:?} for a gone QP", self.index);
                    return;
                };
                if let Err(e) = self.io.qp_rdma_cm_event(qp, ev) {
                    // The engine dropped the QP since (its disconnect is under way).
                    tracing::debug!(qp = qp.as_u64(), "io{}: CM event {ev:?}: {e}", self.index);
                }
            }
            ThreadMsg::Action(a) => self.on_action(a),
            ThreadMsg::Stop => {
                self.stopping = true;
                self.stop_started = Some(Instant::now());
                tracing::info!(
                    "io{}: stopping: closing {} queue(s) with {} command(s) in flight (those \
                     in a backend finish first; those still waiting for host data are \
                     dropped unanswered, nothing of them acknowledged)",
                    self.index,
                    self.qps.len(),
                    self.io.commands_in_flight()
                );
                let qps: Vec<QpHandle> = self.qps.keys().copied().collect();
                for qp in qps {
                    self.close_queue(qp);
                    self.disconnect(qp);
                }
            }
        }
    }

    fn add_qp(
        &mut self,
        qp: QpHandle,
        conn: ConnInfo,
        origin: QueueOrigin,
        rdma: bool,
        slot: ConnSlot,
    ) {
        self.shared
            .conn_opened(queue_key(self.index, qp), conn, rdma);
        self.qps.insert(
            qp,
            QpApp {
                origin,
                slot: Some(slot),
                ..QpApp::default()
            },
        );
    }

    /// Ask the engine to disconnect `qp`; `TaskDone { QpDisconnect }` follows.
    pub fn disconnect(&mut self, qp: QpHandle) {
        match self.io.qp_disconnect(qp, 0) {
            Ok(()) => {}
            // Already on its way (a transport error and an action can both ask).
            Err(TaskError::QpClosing) => {}
            Err(e) => tracing::debug!(qp = qp.as_u64(), "io{}: disconnect: {e}", self.index),
        }
    }

    pub fn on_action(&mut self, a: Action) {
        match a {
            Action::CompleteHeld { queue, key: _, cqe } => {
                if let Some((qp, token)) = self.held.remove(&(queue, cqe.cid)) {
                    self.answer(qp, token, &cqe, 0);
                }
            }
            Action::Disconnect { queue, key } => {
                let Some(qp) = self.qps.iter().find_map(|(h, a)| {
                    (queue_key(self.index, *h) == key || a.queue == Some(queue)).then_some(*h)
                }) else {
                    return;
                };
                // The target still hears of the close when the disconnect is done
                // (`close_queue`): a retired controller goes once its admin queue closes,
                // and a queue the target already forgot is ignored.
                self.held.retain(|_, (h, _)| *h != qp);
                self.disconnect(qp);
            }
            Action::Abort {
                key,
                cid,
                abort,
                abort_cid,
                ..
            } => {
                let qp = self
                    .qps
                    .keys()
                    .copied()
                    .find(|h| queue_key(self.index, *h) == key);
                let aborted = qp.is_some_and(|qp| self.io.cmd_abort(qp, cid));
                tracing::debug!(
                    "io{}: abort of command {cid} on queue {key:#x}: {}",
                    self.index,
                    if aborted { "aborted" } else { "not aborted" }
                );
                let actions = self.shared.target().abort_done(abort, abort_cid, aborted);
                self.route_or_apply(actions);
            }
        }
    }

    /// Tell the target a queue is gone (once), and route what follows from it.
    fn close_queue(&mut self, qp: QpHandle) {
        let Some(app) = self.qps.get_mut(&qp) else {
            return;
        };
        if app.closed {
            return;
        }
        app.closed = true;
        self.held.retain(|_, (h, _)| *h != qp);
        if let Some(q) = app.queue {
            let (actions, notices) = {
                let mut t = self.shared.target();
                let actions = t.queue_closed(q, queue_key(self.index, qp));
                (actions, t.take_notices())
            };
            // Now, while the connection's record (peer, listener) is still there: an
            // authentication abandoned with the close is logged with whom it came from.
            self.shared.report_notices(notices);
            self.route_or_apply(actions);
        }
    }

    pub fn route_or_apply(&mut self, actions: Vec<Action>) {
        for a in actions {
            if thread_of(a.key()) == self.index {
                self.on_action(a);
            } else {
                self.shared.route(vec![a]);
            }
        }
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::NonOffload {
                qp,
                token,
                sqe,
                payload_valid,
                ..
            } => {
                let h2c = matches!(sqe.data_direction(), DataDirection::HostToController);
                // Only data the target reads is fetched (issue 11): the soft engine hands
                // up nothing else already, a DOCA engine leaves it to us.
                let qid = self.qps.get(&qp).and_then(|a| a.queue).map(|q| q.qid);
                let reads = nvmf::target::slow_path_host_data(&sqe, qid) > 0;
                if h2c && !payload_valid && reads {
                    self.fetch_host_data(qp, token, sqe);
                } else {
                    self.execute(qp, token, &sqe);
                }
            }
            Event::TaskDone {
                kind: TaskKind::RdmaRead,
                user,
                result,
                ..
            } => {
                if let Some(w) = self.waiting.remove(&user) {
                    match result {
                        Ok(()) => self.execute(w.qp, w.token, &w.sqe),
                        Err(e) => {
                            tracing::debug!(qp = w.qp.as_u64(), "io{}: host data: {e}", self.index);
                            let cqe = Cqe::new(w.sqe.cid(), Status::TRANSIENT_TRANSPORT_ERROR);
                            self.answer(w.qp, w.token, &cqe, 0);
                        }
                    }
                }
            }
            Event::TaskDone {
                kind: TaskKind::QpDisconnect,
                qp,
                result,
                ..
            } => {
                if let Err(e) = result {
                    tracing::error!(qp = qp.as_u64(), "io{}: disconnect failed: {e}", self.index);
                }
                self.close_queue(qp);
                self.qps.remove(&qp);
                self.shared.conn_closed(queue_key(self.index, qp));
                self.waiting.retain(|_, w| w.qp != qp);
                self.rdma_ids.retain(|_, q| *q != qp);
            }
            Event::TaskDone {
                kind: kind @ (TaskKind::RdmaSend | TaskKind::RdmaWriteSend),
                qp,
                result,
                ..
            } => {
                // The answer is on its way; if it could not be sent, the QP is broken
                // (SPDK disconnects on any task error too).
                if let Err(e) = result {
                    tracing::warn!(qp = qp.as_u64(), "io{}: {kind:?} failed: {e}", self.index);
                    self.close_queue(qp);
                    self.disconnect(qp);
                }
            }
            Event::Terminated {
                qp,
                by_host,
                icreq,
                fes,
                fei,
                limit,
                ..
            } => {
                if let Some(l) = limit {
                    // Logged here, with the TermReq; its TransportError says nothing more.
                    if let Some(a) = self.qps.get_mut(&qp) {
                        a.limit_logged = true;
                    }
                    self.report_limit(qp, l, true);
                } else {
                    self.report_termination(qp, by_host, icreq, fes, fei)
                }
            }
            Event::Tls { qp, ok, .. } => self.on_tls(qp, ok),
            Event::CommandFailed { qp, failure, .. } => {
                let queue = self.qps.get(&qp).and_then(|a| a.queue);
                self.failures.push(qp, queue, failure)
            }
            Event::RefusedBeforeConnect {
                qp, sqe, status, ..
            } => self.report_refused_before_connect(qp, &sqe, status),
            Event::TransportError { qp, kind, .. } => {
                tracing::debug!(qp = qp.as_u64(), ?kind, "io{}: queue lost", self.index);
                match kind {
                    sta::TransportErrorKind::Limit(l) => {
                        if !self.qps.get(&qp).is_some_and(|a| a.limit_logged) {
                            self.report_limit(qp, l, false);
                        }
                    }
                    sta::TransportErrorKind::Io | sta::TransportErrorKind::Protocol => {
                        self.report_rdma_error(qp, kind)
                    }
                    sta::TransportErrorKind::PeerClosed => {}
                }
                self.close_queue(qp);
                self.disconnect(qp);
            }
        }
    }

    /// A command whose host data is not in its payload yet: fetch it (`rdma_read`), run
    /// it when the task is done.
    fn fetch_host_data(&mut self, qp: QpHandle, token: CmdToken, sqe: Sqe) {
        let id = self.next_wait;
        self.next_wait += 1;
        match self.io.rdma_read(qp, token, id) {
            Ok(()) => {
                self.waiting.insert(id, Waiting { qp, token, sqe });
            }
            // The QP is going away with its commands; nobody is left to answer.
            Err(TaskError::QpClosing | TaskError::NoQp) => {}
            // No host memory to read from (an RDMA command without a keyed SGL).
            Err(TaskError::BadState) => {
                let cqe = Cqe::new(sqe.cid(), Status::SGL_DESCRIPTOR_TYPE_INVALID);
                self.answer(qp, token, &cqe, 0);
            }
            Err(e) => {
                tracing::warn!(qp = qp.as_u64(), "io{}: rdma_read: {e}", self.index);
                let cqe = Cqe::new(sqe.cid(), Status::TRANSIENT_TRANSPORT_ERROR);
                self.answer(qp, token, &cqe, 0);
            }
        }
    }

    /// Send the completion of a non-offloaded command, with `data_len` bytes of its
    /// payload first when there are any (`rdma_write_send`, else `rdma_send`).
    pub fn answer(&mut self, qp: QpHandle, token: CmdToken, cqe: &Cqe, data_len: u32) {
        let r = if data_len > 0 {
            self.io.rdma_write_send(qp, token, cqe, data_len, 0)
        } else {
            self.io.rdma_send(qp, token, cqe, 0)
        };
        match r {
            Ok(()) => {}
            // The QP is being torn down: the command dies with it, the host retries it.
            Err(TaskError::QpClosing | TaskError::NoQp) => {}
            Err(e) => {
                // The command is not answerable (a stale token): the QP's state is not
                // what this thread believes; drop the connection rather than leave a
                // command hanging.
                tracing::error!(
                    qp = qp.as_u64(),
                    "io{}: cannot answer command {}: {e}",
                    self.index,
                    cqe.cid
                );
                self.close_queue(qp);
                self.disconnect(qp);
            }
        }
    }
}
