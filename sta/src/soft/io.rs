//! The soft engine's IO context: one per IO thread (DOCA: `struct doca_sta_io`).

use std::collections::{HashMap, VecDeque};
use std::io::IoSlice;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::{BackendQueue, BufPool, Completion, IoBuf, IoStatus, Op, Request, SubmitError};
use crossbeam_channel::{Receiver, Sender};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nvmf::spec::{opcodes, sgl, Cqe, Sqe, Status};
use nvmf::tcp::{self, ControllerLimits, Digests, IcResp, Pdu, RxFramer};
use zerocopy::FromBytes;

use super::rdma::{self as xrdma, RdmaQp, RdmaThread, WrOp};
use super::tcp::{writev, RxBuf, RxResult, TxQueue, TxSeg};
use super::{Ack, Ctrl, SoftConfig};
use crate::rdma::{ffi::IbvWc, ConnRequest, KeyedSgl, RdmaCmEvent};
use crate::{
    CmdToken, Event, NsCounters, QpHandle, StatsRegistry, SubsysId, TaskError, TaskKind,
    ThreadCounters, TransportErrorKind,
};

/// Admin and Fabrics commands may always carry this much in-capsule data on NVMe/TCP.
const ADMIN_INCAPSULE: u32 = 8192;
const MAX_CMDS: usize = 65535;
const IOV_MAX: usize = 64;
/// Epoll data of an RDMA device's completion channel (low bits: device index); TCP QPs
/// use their slot index.
const COMP_TAG: u64 = 1 << 63;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    Free,
    /// Waiting for the host's data (H2CData after our R2T).
    H2C,
    /// Submitted to the backend.
    Backend,
    /// Handed to the application (non-offloaded), waiting for a task.
    App,
    /// Response queued on the socket; freed at its release marker.
    Tx,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    NonOffload,
    Read,
    Write,
    Flush,
    WriteZeroes,
    Dsm,
    Compare,
}

struct Cmd {
    gen: u32,
    st: St,
    kind: Kind,
    qp: QpHandle,
    sqe: Sqe,
    buf: Option<IoBuf>,
    buf2: Option<IoBuf>,
    /// Transfer length in bytes (payload length for non-offloaded commands).
    len: u32,
    /// Host data received so far.
    got: u32,
    /// Backend requests outstanding.
    pending: u16,
    status: Status,
    ns: u32,
    user: u64,
    /// Capsule arrival, for the latency histograms and the backend timeout.
    start: Instant,
    /// The backend timeout was reported for this command.
    timeout_reported: bool,
}

impl Cmd {
    fn free() -> Cmd {
        Cmd {
            gen: 0,
            st: St::Free,
            kind: Kind::NonOffload,
            qp: QpHandle { idx: 0, gen: 0 },
            sqe: Sqe::default(),
            buf: None,
            buf2: None,
            len: 0,
            got: 0,
            pending: 0,
            status: Status::SUCCESS,
            ns: 0,
            user: 0,
            start: Instant::now(),
            timeout_reported: false,
        }
    }
}

#[derive(Clone, Copy)]
struct Binding {
    subsys: SubsysId,
    qid: u16,
}

/// How a QP's bytes move: the only transport-specific part of a QP. Commands, offload
/// logic and tasks are shared; the transport decides how host data is fetched (R2T vs
/// RDMA READ) and how data and responses go out (C2HData + CapsuleResp vs RDMA WRITE +
/// SEND).
enum Link {
    Tcp(TcpStream),
    Rdma(Box<RdmaQp>),
}

struct QpState {
    link: Link,
    user: u64,
    tx: TxQueue,
    digests: Digests,
    hpda: u8,
    binding: Option<Binding>,
    qid: u16,
    /// SQ head: commands taken from the queue, modulo its size (`nvmf::queue`).
    sq_head: u16,
    /// Entries of the submission queue (Connect SQSIZE + 1; admin default until Connect).
    sq_entries: u32,
    /// The host disabled SQ flow control: every completion reports SQHD FFFFh.
    sqflow_disabled: bool,
    /// Command slots this QP holds.
    inflight: u32,
    /// No more input is processed (peer gone, protocol error, or disconnecting).
    rx_stopped: bool,
    /// The transport error was reported to the application.
    error_reported: bool,
    /// `qp_disconnect` was called with this user data.
    disconnect: Option<u64>,
    tx_dirty: bool,
}

struct Qp {
    rx: RxBuf,
    framer: RxFramer,
    st: QpState,
}

struct QpSlot {
    gen: u32,
    qp: Option<Qp>,
}

struct NsSlot {
    subsys: SubsysId,
    nsid: u32,
    /// The removal was acknowledged already (`be_queue_destroy` does not wait for the
    /// backend); the slot only lives on until the backend gives back what it holds.
    acked: bool,
    shift: u32,
    nblocks: u64,
    q: Box<dyn BackendQueue>,
    pending: VecDeque<Request>,
    counters: Arc<NsCounters>,
    inflight: u32,
    removing: Option<u64>,
}

/// Everything but the QPs, so PDU handling can borrow a QP and the core side by side.
struct Core {
    cfg: SoftConfig,
    cmds: Vec<Cmd>,
    free_cmds: Vec<u32>,
    pool: BufPool,
    ns: Vec<Option<NsSlot>>,
    ns_map: HashMap<(u32, u32), u32>,
    events: VecDeque<Event>,
    scratch: Vec<u8>,
    completions: Vec<Completion>,
    counters: Arc<ThreadCounters>,
    stats: Arc<StatsRegistry>,
    /// RDMA work completions logged so far (the first few are, for diagnosis).
    wc_logged: u32,
}

/// The soft engine's per-thread IO context.
pub struct StaIo {
    core: Core,
    qps: Vec<QpSlot>,
    free_qps: Vec<u32>,
    epoll: Epoll,
    ep_events: Vec<EpollEvent>,
    ctrl: Receiver<Ctrl>,
    ack: Sender<Ack>,
    released: Vec<u32>,
    next_timeout_check: Instant,
    /// Verbs state, set up with the first RDMA QP.
    rdma: Option<RdmaThread>,
    wcs: Vec<IbvWc>,
}

fn qp_ref(qps: &mut [QpSlot], h: QpHandle) -> Option<&mut Qp> {
    let s = qps.get_mut(h.idx as usize)?;
    if s.gen != h.gen {
        return None;
    }
    s.qp.as_mut()
}

impl StaIo {
    pub(crate) fn new(
        cfg: SoftConfig,
        ctrl: Receiver<Ctrl>,
        ack: Sender<Ack>,
        stats: Arc<StatsRegistry>,
    ) -> std::io::Result<StaIo> {
        let counters = stats.register_thread();
        let pool = BufPool::new(
            cfg.max_io_size.max(ADMIN_INCAPSULE) as usize,
            cfg.buffer_pool_bytes,
        );
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        Ok(StaIo {
            core: Core {
                cfg,
                cmds: Vec::new(),
                free_cmds: Vec::new(),
                pool,
                ns: Vec::new(),
                ns_map: HashMap::new(),
                events: VecDeque::new(),
                scratch: Vec::with_capacity(512),
                completions: Vec::with_capacity(256),
                counters,
                stats,
                wc_logged: 0,
            },
            qps: Vec::new(),
            free_qps: Vec::new(),
            epoll,
            ep_events: vec![EpollEvent::empty(); 64],
            ctrl,
            ack,
            released: Vec::with_capacity(64),
            next_timeout_check: Instant::now(),
            rdma: None,
            wcs: vec![IbvWc::default(); 64],
        })
    }

    /// Number of live QPs (the acceptor balances threads by it).
    /// Command slots in use (received and not yet answered and sent), all QPs.
    pub fn commands_in_flight(&self) -> usize {
        self.core.cmds.len() - self.core.free_cmds.len()
    }

    pub fn qp_count(&self) -> usize {
        self.qps.iter().filter(|s| s.qp.is_some()).count()
    }

    /// DOCA `qp_alloc` + `qp_accept`, for a TCP connection: the engine runs the
    /// ICReq/ICResp exchange itself, then hands capsules up or serves them.
    pub fn qp_accept_tcp(&mut self, sock: TcpStream, user: u64) -> std::io::Result<QpHandle> {
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        let idx = match self.free_qps.pop() {
            Some(i) => i,
            None => {
                self.qps.push(QpSlot { gen: 0, qp: None });
                self.qps.len() as u32 - 1
            }
        };
        let cfg = &self.core.cfg;
        let limits = ControllerLimits {
            max_h2c_data: cfg.max_h2c_data,
            max_incapsule_data: cfg.max_incapsule_data.max(ADMIN_INCAPSULE),
            cpda: 0,
        };
        let rx_cap = (cfg.max_h2c_data.max(cfg.max_incapsule_data) as usize + 4096) * 2;
        if let Err(e) = self
            .epoll
            .add(&sock, EpollEvent::new(EpollFlags::EPOLLIN, idx as u64))
        {
            self.free_qps.push(idx);
            return Err(e.into());
        }
        Ok(self.install_qp(
            idx,
            RxBuf::new(rx_cap),
            limits,
            Link::Tcp(sock),
            user,
            false,
        ))
    }

    /// Put a new QP (TCP or RDMA) in slot `idx` with a fresh generation.
    fn install_qp(
        &mut self,
        idx: u32,
        rx: RxBuf,
        limits: ControllerLimits,
        link: Link,
        user: u64,
        tx_dirty: bool,
    ) -> QpHandle {
        let slot = &mut self.qps[idx as usize];
        slot.gen = slot.gen.wrapping_add(1) & 0x00ff_ffff;
        slot.qp = Some(Qp {
            rx,
            framer: RxFramer::new_controller(limits),
            st: QpState {
                link,
                user,
                tx: TxQueue::default(),
                digests: Digests::NONE,
                hpda: 0,
                binding: None,
                qid: 0,
                sq_head: 0,
                sq_entries: nvmf::queue::DEFAULT_ADMIN_SQ_ENTRIES,
                sqflow_disabled: false,
                inflight: 0,
                rx_stopped: false,
                error_reported: false,
                disconnect: None,
                tx_dirty,
            },
        });
        NsCounters::bump(&self.core.counters.qps, 1);
        QpHandle { idx, gen: slot.gen }
    }

    pub fn qp_set_user_data(&mut self, qp: QpHandle, user: u64) {
        if let Some(q) = qp_ref(&mut self.qps, qp) {
            q.st.user = user;
        }
    }

    /// DOCA `doca_sta_io_qp_add_subsystem`: binds an I/O queue (never an admin queue) to a
    /// subsystem; from now on the engine serves its I/O commands to that subsystem's
    /// namespaces.
    pub fn qp_add_subsystem(&mut self, qp: QpHandle, subsys: SubsysId) -> Result<(), TaskError> {
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        let qid = q.st.qid;
        let b = q.st.binding.get_or_insert(Binding { subsys, qid });
        b.subsys = subsys;
        Ok(())
    }

    /// DOCA `doca_sta_io_qp_connect_set_sq_size`, plus what the TCP binding needs from
    /// the Connect command: the queue id and whether SQ flow control is disabled (then
    /// every completion reports SQHD FFFFh, and a successful read's C2HData carries the
    /// SUCCESS flag instead of a response capsule). Admin queues too: their SQHD wraps at
    /// the SQSIZE they negotiated.
    pub fn qp_connect_set_params(
        &mut self,
        qp: QpHandle,
        qid: u16,
        sqsize: u16,
        sqflow_disabled: bool,
    ) -> Result<(), TaskError> {
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        q.st.qid = qid;
        q.st.sq_entries = sqsize as u32 + 1;
        q.st.sq_head = (q.st.sq_head as u32 % q.st.sq_entries) as u16;
        q.st.sqflow_disabled = sqflow_disabled;
        if let Some(b) = q.st.binding.as_mut() {
            b.qid = qid;
        }
        Ok(())
    }

    /// The next event, if any (call after `progress`).
    pub fn poll_event(&mut self) -> Option<Event> {
        self.core.events.pop_front()
    }

    /// The payload buffer of a non-offloaded command.
    pub fn payload(&mut self, token: CmdToken) -> Option<&mut [u8]> {
        let c = self.core.cmd_mut(token)?;
        let len = c.len as usize;
        match c.buf.as_mut() {
            Some(b) => Some(&mut b.as_mut_slice()[..len]),
            None => Some(&mut []),
        }
    }

    /// Whether the engine has work that needs another pass soon (I/O in flight, output
    /// waiting, events to deliver).
    pub fn busy(&self) -> bool {
        !self.core.events.is_empty()
            || self
                .core
                .ns
                .iter()
                .flatten()
                .any(|n| n.inflight > 0 || !n.pending.is_empty())
            || self
                .qps
                .iter()
                .any(|s| s.qp.as_ref().is_some_and(|q| q.st.tx_dirty))
    }

    /// One pass: control messages, sockets, backend completions, output. Waits up to
    /// `max_wait` for socket input when there is nothing else to do. Returns whether
    /// anything happened.
    pub fn progress(&mut self, max_wait: Duration) -> bool {
        let mut did = self.drain_ctrl();
        did |= self.poll_rdma();
        let mut wait = if did || self.busy() {
            Duration::ZERO
        } else {
            max_wait
        };
        if !wait.is_zero() && self.arm_rdma() {
            // A completion slipped in between the poll and arming the CQs.
            wait = Duration::ZERO;
        }
        let timeout = EpollTimeout::try_from(wait).unwrap_or(EpollTimeout::ZERO);
        let n = self.epoll.wait(&mut self.ep_events, timeout).unwrap_or(0);
        // Control messages that arrived while we slept come before the sockets: a host may
        // use a namespace as soon as it learns of it, and the engine was told first.
        did |= self.drain_ctrl();
        for i in 0..n {
            let data = self.ep_events[i].data();
            if data & COMP_TAG != 0 {
                if let Some(rt) = self.rdma.as_mut() {
                    rt.drain_cq_events((data & !COMP_TAG) as usize);
                }
                continue;
            }
            did |= self.service_rx(data as u32);
        }
        did |= self.poll_rdma();
        did |= self.poll_backends();
        did |= self.flush_all();
        self.finish_disconnects();
        let now = Instant::now();
        if now >= self.next_timeout_check {
            self.next_timeout_check =
                now + (self.core.cfg.backend_timeout / 4).min(Duration::from_secs(1));
            self.check_backend_timeouts(now);
        }
        let c = &self.core.counters;
        NsCounters::bump(if did { &c.busy_polls } else { &c.idle_polls }, 1);
        did
    }

    /// `be_queue_destroy` on this thread: drop the requests not yet handed to the
    /// backend and answer every command waiting on the namespace's backend queue now, with
    /// Aborted - SQ Deletion. Late completions from the backend are discarded (the slots'
    /// generations have moved on) and only recycle their buffers.
    fn abort_backend_commands(&mut self, ns_idx: u32) {
        let core = &mut self.core;
        if let Some(ns) = core.ns[ns_idx as usize].as_mut() {
            let dropped = ns.pending.len() as u32;
            for r in ns.pending.drain(..) {
                if let Some(b) = r.buf {
                    core.pool.put(b);
                }
            }
            ns.inflight = ns.inflight.saturating_sub(dropped);
            ns.counters
                .queue_depth
                .store(ns.inflight as u64, Ordering::Relaxed);
        }
        for idx in 0..core.cmds.len() {
            let c = &mut core.cmds[idx];
            if c.st != St::Backend || c.ns != ns_idx {
                continue;
            }
            c.pending = 0;
            let qh = c.qp;
            match qp_ref(&mut self.qps, qh) {
                Some(q) if q.st.disconnect.is_none() => {
                    core.fail(&mut q.st, idx as u32, Status::ABORTED_SQ_DELETION)
                }
                Some(q) => core.release(&mut q.st, idx as u32),
                None => {
                    free_cmd(c, &mut core.pool);
                    core.free_cmds.push(idx as u32);
                }
            }
        }
    }

    /// Report commands that have waited on a backend longer than the backend timeout
    /// (each once) to the main context.
    fn check_backend_timeouts(&mut self, now: Instant) {
        let limit = self.core.cfg.backend_timeout;
        let mut late: Vec<(u32, u32)> = Vec::new();
        for c in self.core.cmds.iter_mut() {
            if c.st == St::Backend && !c.timeout_reported && now.duration_since(c.start) > limit {
                c.timeout_reported = true;
                match late.iter_mut().find(|(n, _)| *n == c.ns) {
                    Some(e) => e.1 += 1,
                    None => late.push((c.ns, 1)),
                }
            }
        }
        for (ns, commands) in late {
            if let Some(s) = self.core.ns.get(ns as usize).and_then(|s| s.as_ref()) {
                let (subsys, nsid) = (s.subsys, s.nsid);
                tracing::warn!(
                    nsid,
                    commands,
                    "backend commands outstanding longer than {limit:?}"
                );
                let _ = self.ack.send(Ack::BackendTimeout {
                    subsys,
                    nsid,
                    commands,
                });
            }
        }
    }

    fn drain_ctrl(&mut self) -> bool {
        let mut did = false;
        while let Ok(m) = self.ctrl.try_recv() {
            did = true;
            match m {
                Ctrl::NsAdd {
                    subsys,
                    nsid,
                    backend,
                } => {
                    let bs = backend.block_size();
                    let nblocks = backend.num_blocks();
                    let desc = backend.describe();
                    match backend.create_queue(self.core.cfg.backend_queue_depth) {
                        Ok(q) => {
                            let slot = NsSlot {
                                subsys,
                                nsid,
                                acked: false,
                                shift: bs.trailing_zeros(),
                                nblocks,
                                q,
                                pending: VecDeque::new(),
                                counters: self.core.stats.register_ns(subsys, nsid),
                                inflight: 0,
                                removing: None,
                            };
                            let i = match self.core.ns.iter().position(|s| s.is_none()) {
                                Some(i) => {
                                    self.core.ns[i] = Some(slot);
                                    i
                                }
                                None => {
                                    self.core.ns.push(Some(slot));
                                    self.core.ns.len() - 1
                                }
                            };
                            self.core.ns_map.insert((subsys.0, nsid), i as u32);
                        }
                        Err(e) => tracing::error!(
                            "namespace {nsid}: cannot create a backend queue on {desc}: {e}; \
                             its I/O will fail on this thread"
                        ),
                    }
                }
                Ctrl::NsRemove {
                    subsys,
                    nsid,
                    task,
                    fail_outstanding,
                } => match self.core.ns_map.remove(&(subsys.0, nsid)) {
                    Some(i) => {
                        if let Some(s) = self.core.ns[i as usize].as_mut() {
                            s.removing = Some(task);
                        }
                        if fail_outstanding {
                            self.abort_backend_commands(i);
                            if let Some(s) = self.core.ns[i as usize].as_mut() {
                                s.acked = true;
                            }
                            let _ = self.ack.send(Ack::NsRemoved { task });
                        }
                    }
                    None => {
                        let _ = self.ack.send(Ack::NsRemoved { task });
                    }
                },
            }
        }
        // Removed namespaces whose in-flight I/O is done: destroy the queue, acknowledge.
        for slot in self.core.ns.iter_mut() {
            if let Some(s) = slot {
                if let (Some(task), 0, true) = (s.removing, s.inflight, s.pending.is_empty()) {
                    if !s.acked {
                        let _ = self.ack.send(Ack::NsRemoved { task });
                    }
                    *slot = None;
                }
            }
        }
        did
    }

    fn service_rx(&mut self, idx: u32) -> bool {
        let Some(slot) = self.qps.get_mut(idx as usize) else {
            return false;
        };
        let gen = slot.gen;
        let Some(qp) = slot.qp.as_mut() else {
            return false;
        };
        let h = QpHandle { idx, gen };
        if qp.st.rx_stopped {
            // Nothing more is read; drop the interest so a dead socket does not spin.
            if let Link::Tcp(sock) = &qp.st.link {
                let _ = self.epoll.delete(sock);
            }
            return false;
        }
        let Link::Tcp(sock) = &mut qp.st.link else {
            return false;
        };
        let got = qp.rx.fill(sock);
        let mut did = false;
        // Parse whatever is complete, even when the peer closed after sending it.
        loop {
            if qp.st.rx_stopped {
                break;
            }
            let Qp { rx, framer, st } = qp;
            match framer.parse(rx.pending()) {
                Ok(Some((pdu, used))) => {
                    did = true;
                    let hdr = tcp::pdu_header(&rx.pending()[..used]);
                    self.core.on_pdu(h, st, pdu, hdr);
                    rx.head += used;
                    if framer.digests() != st.digests {
                        // ICReq negotiated digests: they apply to every later PDU.
                        framer.set_digests(st.digests);
                    }
                }
                Ok(None) => break,
                Err(term) => {
                    tracing::debug!(qp = h.as_u64(), "fatal NVMe/TCP error from host: {term}");
                    // The connection's first PDU exchange failed on the ICReq itself.
                    let icreq =
                        !framer.ic_done() && rx.pending().first() == Some(&tcp::pdu_type::IC_REQ);
                    self.core.events.push_back(Event::Terminated {
                        qp: h,
                        qp_user: st.user,
                        by_host: !term.send_term_req,
                        icreq,
                        fes: term.fes,
                        fei: term.fei,
                    });
                    if term.send_term_req {
                        self.core.scratch.clear();
                        tcp::encode_term_req(
                            &mut self.core.scratch,
                            true,
                            term.fes,
                            term.fei,
                            term.offending_header(rx.pending()),
                        );
                        st.tx.push_small(&self.core.scratch);
                        st.tx_dirty = true;
                    }
                    st.rx_stopped = true;
                    self.core
                        .transport_error(h, st, TransportErrorKind::Protocol);
                    did = true;
                    break;
                }
            }
        }
        match got {
            RxResult::Read(n) => did |= n > 0,
            RxResult::Closed | RxResult::Error => {
                let kind = if matches!(got, RxResult::Closed) {
                    TransportErrorKind::PeerClosed
                } else {
                    TransportErrorKind::Io
                };
                qp.st.rx_stopped = true;
                self.core.transport_error(h, &mut qp.st, kind);
                if let Link::Tcp(sock) = &qp.st.link {
                    let _ = self.epoll.delete(sock);
                }
                did = true;
            }
        }
        did
    }

    fn poll_backends(&mut self) -> bool {
        let mut did = false;
        for i in 0..self.core.ns.len() {
            let Some(ns) = self.core.ns[i].as_mut() else {
                continue;
            };
            while let Some(req) = ns.pending.pop_front() {
                match ns.q.submit(req) {
                    Ok(()) => {}
                    Err(SubmitError::Full(r)) => {
                        ns.pending.push_front(r);
                        break;
                    }
                    Err(SubmitError::Closed(r)) => {
                        self.core.completions.push(Completion {
                            tag: r.tag,
                            status: IoStatus::Unavailable,
                            buf: r.buf,
                        });
                    }
                }
            }
            if ns.inflight > 0 {
                ns.q.poll(&mut self.core.completions);
            }
            if self.core.completions.is_empty() {
                continue;
            }
            did = true;
            let mut comps = std::mem::take(&mut self.core.completions);
            for c in comps.drain(..) {
                self.core.on_backend_completion(&mut self.qps, i as u32, c);
            }
            self.core.completions = comps;
        }
        did
    }

    fn flush_all(&mut self) -> bool {
        let mut did = false;
        for i in 0..self.qps.len() {
            let Some(qp) = self.qps[i].qp.as_mut() else {
                continue;
            };
            if !qp.st.tx_dirty {
                continue;
            }
            did = true;
            if let Link::Rdma(r) = &mut qp.st.link {
                let res = match self.rdma.as_mut() {
                    Some(rt) => {
                        let dev = r.dev();
                        let lib = rt.lib;
                        let cmds = &self.core.cmds;
                        r.flush(lib, |ci| {
                            let b = cmds.get(ci as usize)?.buf.as_ref()?;
                            Some((b.as_ptr() as u64, rt.lkey(dev, b)?))
                        })
                    }
                    None => Ok(()),
                };
                qp.st.tx_dirty = !r.ops.is_empty();
                if let Err(e) = res {
                    tracing::warn!(qp = i, "RDMA post failed: {e}");
                    r.ops.clear();
                    qp.st.tx_dirty = false;
                    qp.st.rx_stopped = true;
                    let h = QpHandle {
                        idx: i as u32,
                        gen: self.qps[i].gen,
                    };
                    let qp = self.qps[i].qp.as_mut().expect("checked above");
                    self.core
                        .transport_error(h, &mut qp.st, TransportErrorKind::Io);
                }
                continue;
            }
            match flush_qp(&mut qp.st, &self.core.cmds, &mut self.released) {
                Ok(()) => {}
                Err(_) => {
                    // Output impossible: drop what is queued, report once.
                    let h = QpHandle {
                        idx: i as u32,
                        gen: self.qps[i].gen,
                    };
                    let qp = self.qps[i].qp.as_mut().expect("checked above");
                    discard_tx(&mut qp.st, &mut self.released);
                    qp.st.rx_stopped = true;
                    self.core
                        .transport_error(h, &mut qp.st, TransportErrorKind::Io);
                }
            }
            let qp = self.qps[i].qp.as_mut().expect("checked above");
            qp.st.tx_dirty = !qp.st.tx.is_empty();
            for c in self.released.drain(..) {
                self.core.release(&mut qp.st, c);
            }
        }
        did
    }

    /// Completes `qp_disconnect` tasks whose QP has nothing left in the backend.
    fn finish_disconnects(&mut self) {
        for i in 0..self.qps.len() {
            let gen = self.qps[i].gen;
            let Some(qp) = self.qps[i].qp.as_mut() else {
                continue;
            };
            let Some(user) = qp.st.disconnect else {
                continue;
            };
            let h = QpHandle { idx: i as u32, gen };
            if matches!(qp.st.link, Link::Rdma(_)) {
                // The NIC may still touch command buffers until the QP is destroyed: wait
                // for the backend, destroy the QP, then free every slot.
                if self
                    .core
                    .cmds
                    .iter()
                    .any(|c| c.st == St::Backend && c.qp == h)
                {
                    continue;
                }
                let Some(Qp { st, .. }) = self.qps[i].qp.take() else {
                    continue;
                };
                if let (Link::Rdma(r), Some(rt)) = (st.link, self.rdma.as_ref()) {
                    r.destroy(rt.lib);
                }
                for (ci, c) in self.core.cmds.iter_mut().enumerate() {
                    if c.st != St::Free && c.qp == h {
                        self.core.free_cmds.push(ci as u32);
                        free_cmd(c, &mut self.core.pool);
                    }
                }
                self.finish_qp_free(i, h, user);
                continue;
            }
            // Free every slot that is not owned by the backend.
            for (ci, c) in self.core.cmds.iter_mut().enumerate() {
                if c.st != St::Free && c.st != St::Backend && c.qp == h {
                    self.core.free_cmds.push(ci as u32);
                    free_cmd(c, &mut self.core.pool);
                    qp.st.inflight -= 1;
                }
            }
            if qp.st.inflight > 0 {
                continue;
            }
            if let Link::Tcp(sock) = &qp.st.link {
                let _ = self.epoll.delete(sock);
                let _ = sock.shutdown(std::net::Shutdown::Both);
            }
            self.qps[i].qp = None;
            self.finish_qp_free(i, h, user);
        }
    }

    fn finish_qp_free(&mut self, i: usize, h: QpHandle, user: u64) {
        self.free_qps.push(i as u32);
        self.core.counters.qps.store(
            self.core
                .counters
                .qps
                .load(std::sync::atomic::Ordering::Relaxed)
                .saturating_sub(1),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.core.events.push_back(Event::TaskDone {
            kind: TaskKind::QpDisconnect,
            qp: h,
            user,
            result: Ok(()),
        });
    }

    /// DOCA `qp_alloc` + `qp_accept` for an RDMA connect request (the CM thread has
    /// validated its private data; `depth` is HSQSIZE + 1): create the QP and its CQ on
    /// this thread's PD, post `depth` receives of SQE + in-capsule size, and accept with
    /// the NVMe-oF accept private data. On error the request is rejected (no resources)
    /// and its cm_id freed.
    pub fn qp_accept_rdma(
        &mut self,
        req: ConnRequest,
        depth: u16,
        user: u64,
    ) -> Result<QpHandle, String> {
        if self.rdma.is_none() {
            match RdmaThread::new() {
                Ok(rt) => self.rdma = Some(rt),
                Err(e) => {
                    req.reject(crate::rdma::RejectStatus::NoResources);
                    return Err(e);
                }
            }
        }
        let rt = self.rdma.as_mut().expect("set above");
        let recv_sz = Sqe::SIZE as u32 + self.core.cfg.max_incapsule_data;
        let (rq, new_fd) = match rt.accept(&req, depth, recv_sz) {
            Ok(x) => x,
            Err((status, e)) => {
                req.reject(status);
                return Err(e);
            }
        };
        if let Some(fd) = new_fd {
            // SAFETY: the completion channel's descriptor lives as long as this thread's
            // verbs state (never closed before the IO context goes away).
            let bfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            let tag = COMP_TAG | rq.dev() as u64;
            if let Err(e) = self
                .epoll
                .add(bfd, EpollEvent::new(EpollFlags::EPOLLIN, tag))
            {
                tracing::warn!("epoll add of an RDMA completion channel: {e}");
            }
        }
        let idx = match self.free_qps.pop() {
            Some(i) => i,
            None => {
                self.qps.push(QpSlot { gen: 0, qp: None });
                self.qps.len() as u32 - 1
            }
        };
        let limits = ControllerLimits {
            max_h2c_data: 0,
            max_incapsule_data: 0,
            cpda: 0,
        };
        Ok(self.install_qp(
            idx,
            RxBuf::new(0),
            limits,
            Link::Rdma(Box::new(rq)),
            user,
            true,
        ))
    }

    /// An RDMA CM event for a QP of this context. ESTABLISHED is DOCA's
    /// `qp_connect_established`; DISCONNECTED, DEVICE_REMOVAL, TIMEWAIT_EXIT and connect
    /// errors report [`Event::TransportError`] (the application then runs `qp_disconnect`).
    pub fn qp_rdma_cm_event(&mut self, qp: QpHandle, ev: RdmaCmEvent) {
        let Some(q) = qp_ref(&mut self.qps, qp) else {
            return;
        };
        let Link::Rdma(r) = &mut q.st.link else {
            return;
        };
        match ev {
            RdmaCmEvent::Established => {
                tracing::debug!(qp = qp.as_u64(), "rdma: established");
                r.established = true
            }
            RdmaCmEvent::Disconnected => {
                // The host is gone; `qp_disconnect` still calls rdma_disconnect (it
                // answers the host's DREQ and moves the QP to the error state).
                q.st.rx_stopped = true;
                self.core
                    .transport_error(qp, &mut q.st, TransportErrorKind::PeerClosed);
            }
            RdmaCmEvent::Lost => {
                q.st.rx_stopped = true;
                self.core
                    .transport_error(qp, &mut q.st, TransportErrorKind::Io);
            }
        }
    }

    fn arm_rdma(&mut self) -> bool {
        let Some(rt) = self.rdma.as_mut() else {
            return false;
        };
        for s in self.qps.iter_mut() {
            if let Some(Qp {
                st:
                    QpState {
                        link: Link::Rdma(r),
                        ..
                    },
                ..
            }) = s.qp.as_mut()
            {
                rt.arm(r);
            }
        }
        self.poll_rdma()
    }

    /// Poll every RDMA QP's completion queue.
    fn poll_rdma(&mut self) -> bool {
        let Some(rt) = self.rdma.as_mut() else {
            return false;
        };
        let mut did = false;
        for i in 0..self.qps.len() {
            let gen = self.qps[i].gen;
            let Some(qp) = self.qps[i].qp.as_mut() else {
                continue;
            };
            let h = QpHandle { idx: i as u32, gen };
            loop {
                let n = match &mut qp.st.link {
                    Link::Rdma(r) => rt.poll(r, &mut self.wcs),
                    Link::Tcp(_) => 0,
                };
                if n == 0 {
                    break;
                }
                did = true;
                for k in 0..n {
                    let wc = self.wcs[k];
                    if self.core.wc_logged < 64 {
                        self.core.wc_logged += 1;
                        tracing::debug!(
                            qp = h.as_u64(),
                            "wc kind {} slot {} status {} len {}",
                            xrdma::wr_kind(wc.wr_id),
                            xrdma::wr_slot(wc.wr_id) as i32,
                            wc.status,
                            wc.byte_len
                        );
                    }
                    self.core.on_wc(rt, h, &mut qp.st, &wc);
                }
                if n < self.wcs.len() {
                    break;
                }
            }
        }
        did
    }

    /// DOCA `doca_sta_io_task_disconnect_alloc_init` + submit: stop taking input, let the
    /// QP's in-flight backend I/O finish, drop its unsent output, close the socket, then
    /// report `TaskDone { kind: QpDisconnect }`. The handle is dead afterwards (DOCA's
    /// `qp_destroy` is folded in). Tokens of the QP's non-offloaded commands die with it.
    pub fn qp_disconnect(&mut self, qp: QpHandle, user: u64) -> Result<(), TaskError> {
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        if q.st.disconnect.is_some() {
            return Err(TaskError::QpClosing);
        }
        q.st.disconnect = Some(user);
        q.st.rx_stopped = true;
        if let Link::Rdma(r) = &mut q.st.link {
            // Post what is queued (a final response) best effort, then disconnect: the
            // QP goes to the error state and everything outstanding flushes.
            if let Some(rt) = self.rdma.as_mut() {
                let dev = r.dev();
                let lib = rt.lib;
                let cmds = &self.core.cmds;
                let _ = r.flush(lib, |ci| {
                    let b = cmds.get(ci as usize)?.buf.as_ref()?;
                    Some((b.as_ptr() as u64, rt.lkey(dev, b)?))
                });
                r.ops.clear();
                r.disconnect(lib);
            }
            q.st.tx_dirty = false;
            return Ok(());
        }
        // Flush what is already queued (e.g. a final response) best effort, then drop.
        let _ = flush_qp(&mut q.st, &self.core.cmds, &mut self.released);
        discard_tx(&mut q.st, &mut self.released);
        for c in self.released.drain(..) {
            self.core.release(&mut q.st, c);
        }
        q.st.tx_dirty = false;
        Ok(())
    }

    fn app_cmd(&mut self, qp: QpHandle, token: CmdToken) -> Result<(), TaskError> {
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        if q.st.disconnect.is_some() {
            return Err(TaskError::QpClosing);
        }
        let c = self.core.cmd_mut(token).ok_or(TaskError::NoCommand)?;
        if c.qp != qp {
            return Err(TaskError::NoCommand);
        }
        if c.st != St::App {
            return Err(TaskError::BadState);
        }
        Ok(())
    }

    /// DOCA `rdma_read` task: fetch the host's data for a non-offloaded command into its
    /// payload (TCP: R2T, then H2CData). `TaskDone { kind: RdmaRead }` follows.
    pub fn rdma_read(&mut self, qp: QpHandle, token: CmdToken, user: u64) -> Result<(), TaskError> {
        self.app_cmd(qp, token)?;
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        let c = &mut self.core.cmds[token.idx as usize];
        c.user = user;
        if c.got >= c.len {
            self.core.events.push_back(Event::TaskDone {
                kind: TaskKind::RdmaRead,
                qp,
                user,
                result: Ok(()),
            });
            return Ok(());
        }
        c.st = St::H2C;
        let (cid, len, got) = (c.sqe.cid(), c.len, c.got);
        if let Link::Rdma(r) = &mut q.st.link {
            let Some(k) = KeyedSgl::parse(&c.sqe.dptr) else {
                c.st = St::App;
                return Err(TaskError::BadState);
            };
            r.ops.push_back(WrOp::Read {
                cmd: token.idx,
                off: got,
                len: len - got,
                raddr: k.addr + got as u64,
                rkey: k.key,
            });
            q.st.tx_dirty = true;
            return Ok(());
        }
        self.core.scratch.clear();
        tcp::encode_r2t(
            &mut self.core.scratch,
            cid,
            token.idx as u16,
            got,
            len - got,
            q.st.digests,
        );
        q.st.tx.push_small(&self.core.scratch);
        q.st.tx_dirty = true;
        Ok(())
    }

    /// DOCA `rdma_write_send` task: send `data_len` bytes of the payload to the host
    /// (TCP: C2HData), then the completion. `data_len` is clamped to the payload length.
    pub fn rdma_write_send(
        &mut self,
        qp: QpHandle,
        token: CmdToken,
        cqe: &Cqe,
        data_len: u32,
        user: u64,
    ) -> Result<(), TaskError> {
        self.app_cmd(qp, token)?;
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        let len = data_len.min(self.core.cmds[token.idx as usize].len);
        self.core.respond(&mut q.st, token.idx, *cqe, len);
        self.core.events.push_back(Event::TaskDone {
            kind: TaskKind::RdmaWriteSend,
            qp,
            user,
            result: Ok(()),
        });
        Ok(())
    }

    /// DOCA `rdma_send` task: send the completion only.
    pub fn rdma_send(
        &mut self,
        qp: QpHandle,
        token: CmdToken,
        cqe: &Cqe,
        user: u64,
    ) -> Result<(), TaskError> {
        self.app_cmd(qp, token)?;
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        self.core.respond(&mut q.st, token.idx, *cqe, 0);
        self.core.events.push_back(Event::TaskDone {
            kind: TaskKind::RdmaSend,
            qp,
            user,
            result: Ok(()),
        });
        Ok(())
    }
}

/// One writev of as much queued output as fits in `IOV_MAX` slices; loops while the
/// socket takes everything.
fn flush_qp(st: &mut QpState, cmds: &[Cmd], released: &mut Vec<u32>) -> std::io::Result<()> {
    loop {
        let mut iov = [IoSlice::new(&[]); IOV_MAX];
        let mut n = 0;
        let mut total = 0;
        let mut skip = st.tx.front_done;
        for seg in st.tx.segs.iter() {
            if n == IOV_MAX {
                break;
            }
            let s: &[u8] = match seg {
                TxSeg::Small { len, bytes } => &bytes[..*len as usize],
                TxSeg::Data { cmd, off, len } => cmds
                    .get(*cmd as usize)
                    .and_then(|c| c.buf.as_ref())
                    .map_or(&[][..], |b| {
                        &b.as_slice()[*off as usize..(*off + *len) as usize]
                    }),
                TxSeg::Release { .. } => continue,
            };
            let s = &s[skip.min(s.len())..];
            skip = 0;
            if !s.is_empty() {
                iov[n] = IoSlice::new(s);
                n += 1;
                total += s.len();
            }
        }
        if n == 0 {
            st.tx.advance(0, released);
            return Ok(());
        }
        let Link::Tcp(sock) = &mut st.link else {
            return Ok(());
        };
        let w = writev(sock, &iov[..n])?;
        st.tx.advance(w, released);
        if w < total || st.tx.is_empty() {
            return Ok(());
        }
    }
}

fn discard_tx(st: &mut QpState, released: &mut Vec<u32>) {
    for seg in st.tx.segs.drain(..) {
        if let TxSeg::Release { cmd } = seg {
            released.push(cmd);
        }
    }
    st.tx.front_done = 0;
}

fn free_cmd(c: &mut Cmd, pool: &mut BufPool) {
    if let Some(b) = c.buf.take() {
        pool.put(b);
    }
    if let Some(b) = c.buf2.take() {
        pool.put(b);
    }
    c.st = St::Free;
    c.gen = c.gen.wrapping_add(1);
}

fn is_offload_opcode(op: u8) -> Option<Kind> {
    Some(match op {
        opcodes::io::READ => Kind::Read,
        opcodes::io::WRITE => Kind::Write,
        opcodes::io::FLUSH => Kind::Flush,
        opcodes::io::WRITE_ZEROES => Kind::WriteZeroes,
        opcodes::io::DATASET_MANAGEMENT => Kind::Dsm,
        opcodes::io::COMPARE => Kind::Compare,
        _ => return None,
    })
}

fn cqe_bytes(c: &Cqe) -> [u8; 16] {
    let mut b = [0u8; 16];
    b.copy_from_slice(zerocopy::IntoBytes::as_bytes(c));
    b
}

fn status_of(s: IoStatus) -> Status {
    match s {
        IoStatus::Ok => Status::SUCCESS,
        IoStatus::ReadError => Status::UNRECOVERED_READ_ERROR,
        IoStatus::WriteFault => Status::WRITE_FAULT,
        IoStatus::OutOfRange => Status::LBA_OUT_OF_RANGE,
        IoStatus::Unsupported => Status::INVALID_OPCODE,
        IoStatus::Unavailable => Status::NAMESPACE_NOT_READY,
    }
}

impl Core {
    /// One work completion of an RDMA QP.
    fn on_wc(&mut self, rt: &mut RdmaThread, qp: QpHandle, st: &mut QpState, wc: &IbvWc) {
        let kind = xrdma::wr_kind(wc.wr_id);
        let slot = xrdma::wr_slot(wc.wr_id);
        let Link::Rdma(r) = &mut st.link else {
            return;
        };
        if kind != xrdma::WR_RECV {
            r.credits.give(kind == xrdma::WR_READ);
            if !r.ops.is_empty() {
                st.tx_dirty = true;
            }
        }
        if wc.status != crate::rdma::ffi::IBV_WC_SUCCESS {
            if wc.status != crate::rdma::ffi::IBV_WC_WR_FLUSH_ERR && st.disconnect.is_none() {
                tracing::warn!(
                    qp = qp.as_u64(),
                    "RDMA work request (kind {kind}) failed: {}",
                    xrdma::wc_status_str(rt.lib, wc.status)
                );
            }
            st.rx_stopped = true;
            self.transport_error(qp, st, TransportErrorKind::Io);
            // The commands die with the QP (qp_disconnect frees them once it is destroyed);
            // a failed host-data fetch for the application is reported to it.
            if kind == xrdma::WR_READ {
                if let Some(c) = self.cmds.get_mut(slot as usize) {
                    if c.st == St::H2C && c.qp == qp && c.kind == Kind::NonOffload {
                        c.st = St::App;
                        let user = c.user;
                        self.events.push_back(Event::TaskDone {
                            kind: TaskKind::RdmaRead,
                            qp,
                            user,
                            result: Err(TaskError::QpClosing),
                        });
                    }
                }
            }
            return;
        }
        match kind {
            xrdma::WR_RECV => {
                if st.rx_stopped {
                    return;
                }
                let region = std::mem::take(&mut r.recv_buf);
                let sz = r.recv_sz as usize;
                let off = slot as usize * sz;
                let n = (wc.byte_len as usize).min(sz);
                let capsule = &region[off..off + n];
                st.sq_head = nvmf::queue::advance_sq_head(st.sq_head, st.sq_entries);
                match Sqe::read_from_prefix(capsule) {
                    Ok((sqe, _)) => self.on_capsule(qp, st, &sqe, &capsule[Sqe::SIZE..], true),
                    Err(_) => {
                        tracing::warn!(qp = qp.as_u64(), "short RDMA capsule ({n} bytes)");
                        st.rx_stopped = true;
                        self.transport_error(qp, st, TransportErrorKind::Protocol);
                    }
                }
                if let Link::Rdma(r) = &mut st.link {
                    r.recv_buf = region;
                    r.repost.push(slot);
                }
                st.tx_dirty = true;
            }
            xrdma::WR_SEND if slot != xrdma::NO_CMD => self.release(st, slot),
            xrdma::WR_READ => self.rdma_read_done(qp, st, slot),
            _ => {}
        }
    }

    /// An RDMA READ of host data finished: the command's data is in.
    fn rdma_read_done(&mut self, qp: QpHandle, st: &mut QpState, idx: u32) {
        let Some(c) = self.cmds.get_mut(idx as usize) else {
            return;
        };
        if c.st != St::H2C || c.qp != qp {
            return;
        }
        c.got = c.len;
        if c.kind == Kind::NonOffload {
            c.st = St::App;
            let user = c.user;
            self.events.push_back(Event::TaskDone {
                kind: TaskKind::RdmaRead,
                qp,
                user,
                result: Ok(()),
            });
        } else if st.disconnect.is_none() {
            self.submit_offload(st, idx);
        }
    }

    fn cmd_mut(&mut self, t: CmdToken) -> Option<&mut Cmd> {
        let c = self.cmds.get_mut(t.idx as usize)?;
        (c.gen == t.gen && c.st != St::Free).then_some(c)
    }

    fn alloc_cmd(&mut self, qp: QpHandle, st: &mut QpState, sqe: &Sqe) -> Option<u32> {
        let idx = match self.free_cmds.pop() {
            Some(i) => i,
            None if self.cmds.len() < MAX_CMDS => {
                self.cmds.push(Cmd::free());
                self.cmds.len() as u32 - 1
            }
            None => return None,
        };
        let c = &mut self.cmds[idx as usize];
        c.st = St::App;
        c.kind = Kind::NonOffload;
        c.qp = qp;
        c.sqe = *sqe;
        c.len = 0;
        c.got = 0;
        c.pending = 0;
        c.status = Status::SUCCESS;
        c.user = 0;
        c.start = Instant::now();
        c.timeout_reported = false;
        st.inflight += 1;
        Some(idx)
    }

    fn release(&mut self, st: &mut QpState, idx: u32) {
        if let Some(c) = self.cmds.get_mut(idx as usize) {
            if c.st != St::Free {
                free_cmd(c, &mut self.pool);
                self.free_cmds.push(idx);
                st.inflight = st.inflight.saturating_sub(1);
            }
        }
    }

    fn transport_error(&mut self, qp: QpHandle, st: &mut QpState, kind: TransportErrorKind) {
        if !st.error_reported && st.disconnect.is_none() {
            st.error_reported = true;
            self.events.push_back(Event::TransportError {
                qp,
                qp_user: st.user,
                kind,
            });
        }
    }

    fn sqhd(st: &QpState) -> u16 {
        nvmf::queue::sqhd(st.sq_head, st.sqflow_disabled)
    }

    /// Queue the response to command `idx`: `data_len` bytes of its buffer as C2HData
    /// (with SUCCESS when allowed), then the CapsuleResp, then the release marker.
    fn respond(&mut self, st: &mut QpState, idx: u32, mut cqe: Cqe, data_len: u32) {
        let c = &mut self.cmds[idx as usize];
        c.st = St::Tx;
        cqe.cid = c.sqe.cid();
        cqe.sqid = st.qid;
        cqe.sqhd = Self::sqhd(st);
        if let Link::Rdma(r) = &mut st.link {
            // RDMA WRITE of the data to the host's keyed SGL, then the completion SEND
            // (with Invalidate when the host asked for it); the slot is freed when the
            // SEND completes.
            let k = KeyedSgl::parse(&c.sqe.dptr);
            if let (true, Some(k)) = (data_len > 0, k) {
                r.ops.push_back(WrOp::Write {
                    cmd: idx,
                    len: data_len.min(k.len),
                    raddr: k.addr,
                    rkey: k.key,
                });
            }
            r.ops.push_back(WrOp::Send {
                cmd: idx,
                cqe: cqe_bytes(&cqe),
                inv: k.filter(|k| k.invalidate).map(|k| k.key),
            });
            st.tx_dirty = true;
            return;
        }
        let ok = cqe.status().is_success();
        let success_flag = ok && data_len > 0 && st.sqflow_disabled && cqe.dw0 == 0;
        if data_len > 0 {
            self.scratch.clear();
            tcp::encode_c2h_data_header(
                &mut self.scratch,
                cqe.cid,
                0,
                data_len,
                true,
                success_flag,
                st.digests,
                st.hpda,
            );
            st.tx.push_small(&self.scratch);
            st.tx.segs.push_back(TxSeg::Data {
                cmd: idx,
                off: 0,
                len: data_len,
            });
            if st.digests.data {
                let b = c
                    .buf
                    .as_ref()
                    .map_or(&[][..], |b| &b.as_slice()[..data_len as usize]);
                st.tx.push_small(&tcp::data_digest(b).to_le_bytes());
            }
        }
        if !success_flag {
            self.scratch.clear();
            tcp::encode_capsule_resp(&mut self.scratch, &cqe, st.digests);
            st.tx.push_small(&self.scratch);
        }
        st.tx.segs.push_back(TxSeg::Release { cmd: idx });
        st.tx_dirty = true;
    }

    /// Respond to a command that never got a slot (queue overrun by the host).
    fn respond_without_slot(&mut self, st: &mut QpState, sqe: &Sqe, status: Status) {
        let mut cqe = Cqe::new(sqe.cid(), status);
        cqe.sqid = st.qid;
        cqe.sqhd = Self::sqhd(st);
        if let Link::Rdma(r) = &mut st.link {
            r.ops.push_back(WrOp::Send {
                cmd: xrdma::NO_CMD,
                cqe: cqe_bytes(&cqe),
                inv: None,
            });
            st.tx_dirty = true;
            return;
        }
        self.scratch.clear();
        tcp::encode_capsule_resp(&mut self.scratch, &cqe, st.digests);
        st.tx.push_small(&self.scratch);
        st.tx_dirty = true;
    }

    /// Sends a C2HTermReq carrying `hdr`, the offending PDU's header, and stops the QP.
    fn fatal(&mut self, qp: QpHandle, st: &mut QpState, fes: u16, fei: u32, hdr: &[u8]) {
        self.events.push_back(Event::Terminated {
            qp,
            qp_user: st.user,
            by_host: false,
            icreq: false,
            fes,
            fei,
        });
        self.scratch.clear();
        tcp::encode_term_req(&mut self.scratch, true, fes, fei, hdr);
        st.tx.push_small(&self.scratch);
        st.tx_dirty = true;
        st.rx_stopped = true;
        self.transport_error(qp, st, TransportErrorKind::Protocol);
    }

    /// One PDU of a TCP QP; `hdr` is its header as received (for a C2HTermReq).
    fn on_pdu(&mut self, qp: QpHandle, st: &mut QpState, pdu: Pdu<'_>, hdr: &[u8]) {
        match pdu {
            Pdu::IcReq(ic) => {
                let digests = ic.digests;
                st.digests = digests;
                st.hpda = ic.hpda;
                self.scratch.clear();
                tcp::encode_ic_resp(
                    &mut self.scratch,
                    &IcResp {
                        pfv: 0,
                        cpda: 0,
                        digests,
                        maxh2cdata: self.cfg.max_h2c_data,
                    },
                );
                st.tx.push_small(&self.scratch);
                st.tx_dirty = true;
            }
            Pdu::CapsuleCmd {
                sqe,
                data,
                data_digest_ok,
            } => {
                st.sq_head = nvmf::queue::advance_sq_head(st.sq_head, st.sq_entries);
                self.on_capsule(qp, st, &sqe, data, data_digest_ok);
            }
            Pdu::H2CData {
                cccid,
                ttag,
                datao,
                data,
                last: _,
                data_digest_ok,
            } => {
                self.on_h2c(qp, st, cccid, ttag, datao, data, data_digest_ok, hdr);
            }
            Pdu::H2CTermReq { fes, fei } => {
                tracing::debug!(qp = qp.as_u64(), fes, "host terminated the connection");
                self.events.push_back(Event::Terminated {
                    qp,
                    qp_user: st.user,
                    by_host: true,
                    icreq: false,
                    fes,
                    fei,
                });
                st.rx_stopped = true;
                self.transport_error(qp, st, TransportErrorKind::PeerClosed);
            }
            _ => {
                // The framer only yields host-to-controller PDUs in controller mode.
                self.fatal(qp, st, tcp::fes::INVALID_HEADER_FIELD, 0, hdr);
            }
        }
    }

    fn on_capsule(
        &mut self,
        qp: QpHandle,
        st: &mut QpState,
        sqe: &Sqe,
        data: &[u8],
        ddgst_ok: bool,
    ) {
        let offload = match (st.binding, is_offload_opcode(sqe.opcode())) {
            (Some(b), Some(kind)) => self
                .ns_map
                .get(&(b.subsys.0, sqe.nsid))
                .map(|&ns| (kind, ns)),
            _ => None,
        };
        let Some(idx) = self.alloc_cmd(qp, st, sqe) else {
            self.respond_without_slot(st, sqe, Status::COMMAND_ID_CONFLICT.with_dnr(false));
            return;
        };
        if !ddgst_ok {
            self.respond(
                st,
                idx,
                Cqe::new(sqe.cid(), Status::TRANSIENT_TRANSPORT_ERROR),
                0,
            );
            return;
        }
        match offload {
            Some((kind, ns)) => {
                NsCounters::bump(&self.counters.offloaded, 1);
                self.start_offload(st, idx, kind, ns, data);
            }
            None => {
                NsCounters::bump(&self.counters.non_offloaded, 1);
                self.start_non_offload(qp, st, idx, data);
            }
        }
    }

    fn start_non_offload(&mut self, qp: QpHandle, st: &mut QpState, idx: u32, data: &[u8]) {
        let sqe = self.cmds[idx as usize].sqe;
        let d = sqe.dptr;
        let rdma = matches!(st.link, Link::Rdma(_));
        let len = match (d.sgl_type(), d.subtype()) {
            (sgl::TYPE_DATA_BLOCK, sgl::SUBTYPE_OFFSET) => d.length(),
            (sgl::TYPE_TRANSPORT_DATA_BLOCK, sgl::SUBTYPE_TRANSPORT) if !rdma => d.length(),
            (sgl::TYPE_KEYED_DATA_BLOCK, sgl::SUBTYPE_ADDRESS | sgl::SUBTYPE_INVALIDATE_KEY)
                if rdma =>
            {
                d.keyed_length()
            }
            _ if data.is_empty() => 0,
            _ => {
                self.respond(
                    st,
                    idx,
                    Cqe::new(sqe.cid(), Status::SGL_DESCRIPTOR_TYPE_INVALID),
                    0,
                );
                return;
            }
        };
        let in_capsule = d.sgl_type() == sgl::TYPE_DATA_BLOCK && len > 0;
        if in_capsule && (d.addr != 0 || data.len() as u32 != len) {
            let s = if d.addr != 0 {
                Status::SGL_OFFSET_INVALID
            } else {
                Status::DATA_SGL_LENGTH_INVALID
            };
            self.respond(st, idx, Cqe::new(sqe.cid(), s), 0);
            return;
        }
        if len > self.cfg.max_io_size.max(ADMIN_INCAPSULE) {
            self.respond(st, idx, Cqe::new(sqe.cid(), Status::INVALID_FIELD), 0);
            return;
        }
        if len > 0 {
            let Some(mut b) = self.pool.get(len as usize) else {
                self.respond(st, idx, Cqe::new(sqe.cid(), Status::INTERNAL_ERROR), 0);
                return;
            };
            b.as_mut_slice()[..len as usize].fill(0);
            if in_capsule {
                b.as_mut_slice()[..len as usize].copy_from_slice(data);
            }
            self.cmds[idx as usize].buf = Some(b);
        }
        let c = &mut self.cmds[idx as usize];
        c.len = len;
        c.got = if in_capsule { len } else { 0 };
        c.st = St::App;
        self.events.push_back(Event::NonOffload {
            qp,
            qp_user: st.user,
            token: CmdToken { idx, gen: c.gen },
            sqe,
            payload_len: len,
            payload_valid: in_capsule || len == 0,
        });
    }

    fn fail(&mut self, st: &mut QpState, idx: u32, status: Status) {
        let c = &self.cmds[idx as usize];
        if let Some(ns) = self.ns.get(c.ns as usize).and_then(|n| n.as_ref()) {
            ns.counters.count_error(status);
        }
        let cid = c.sqe.cid();
        self.respond(st, idx, Cqe::new(cid, status), 0);
    }

    fn start_offload(&mut self, st: &mut QpState, idx: u32, kind: Kind, ns_idx: u32, data: &[u8]) {
        let sqe = self.cmds[idx as usize].sqe;
        let Some(ns) = self.ns[ns_idx as usize].as_ref() else {
            return self.fail(st, idx, Status::INVALID_NAMESPACE);
        };
        let (shift, nblocks) = (ns.shift, ns.nblocks);
        {
            let c = &mut self.cmds[idx as usize];
            c.kind = kind;
            c.ns = ns_idx;
        }
        let needs_range = matches!(
            kind,
            Kind::Read | Kind::Write | Kind::Compare | Kind::WriteZeroes
        );
        if needs_range {
            let end = sqe.slba().checked_add(sqe.nlb() as u64);
            if end.is_none_or(|e| e > nblocks) {
                return self.fail(st, idx, Status::LBA_OUT_OF_RANGE);
            }
        }
        let len = match kind {
            Kind::Read | Kind::Write | Kind::Compare => (sqe.nlb() as u64) << shift,
            Kind::Dsm => ((sqe.cdw10 & 0xff) as u64 + 1) * 16,
            _ => 0,
        };
        if len > self.cfg.max_io_size as u64 {
            return self.fail(st, idx, Status::INVALID_FIELD);
        }
        let len = len as u32;
        self.cmds[idx as usize].len = len;
        if len == 0 {
            return self.submit_offload(st, idx);
        }
        let d = sqe.dptr;
        let keyed = KeyedSgl::parse(&d).filter(|_| matches!(st.link, Link::Rdma(_)));
        let (in_capsule, sgl_len) = match (d.sgl_type(), d.subtype(), keyed) {
            (sgl::TYPE_DATA_BLOCK, sgl::SUBTYPE_OFFSET, _) => (true, d.length()),
            (_, _, Some(k)) => (false, k.len),
            (sgl::TYPE_TRANSPORT_DATA_BLOCK, sgl::SUBTYPE_TRANSPORT, _)
                if matches!(st.link, Link::Tcp(_)) =>
            {
                (false, d.length())
            }
            _ => return self.fail(st, idx, Status::SGL_DESCRIPTOR_TYPE_INVALID),
        };
        // An SGL longer than the transfer is as invalid as a shorter one (nvmet checks
        // the same); only Dataset Management may describe more than its ranges.
        let rule = if kind == Kind::Dsm {
            nvmf::queue::SglRule::AtLeast
        } else {
            nvmf::queue::SglRule::Exact
        };
        if let Err(s) = nvmf::queue::check_sgl_length(sgl_len, len, rule) {
            return self.fail(st, idx, s);
        }
        let Some(mut b) = self.pool.get(len as usize) else {
            return self.fail(st, idx, Status::INTERNAL_ERROR);
        };
        b.set_len(len as usize);
        let host_to_ctrl = kind != Kind::Read;
        if in_capsule {
            if !host_to_ctrl || data.len() as u32 != d.length() || d.addr != 0 {
                self.pool.put(b);
                return self.fail(st, idx, Status::DATA_SGL_LENGTH_INVALID);
            }
            b.as_mut_slice()[..len as usize].copy_from_slice(&data[..len as usize]);
            self.cmds[idx as usize].buf = Some(b);
            self.cmds[idx as usize].got = len;
            return self.submit_offload(st, idx);
        }
        self.cmds[idx as usize].buf = Some(b);
        if host_to_ctrl {
            let c = &mut self.cmds[idx as usize];
            c.st = St::H2C;
            if let (Link::Rdma(r), Some(k)) = (&mut st.link, keyed) {
                r.ops.push_back(WrOp::Read {
                    cmd: idx,
                    off: 0,
                    len,
                    raddr: k.addr,
                    rkey: k.key,
                });
                st.tx_dirty = true;
                return;
            }
            self.scratch.clear();
            tcp::encode_r2t(&mut self.scratch, sqe.cid(), idx as u16, 0, len, st.digests);
            st.tx.push_small(&self.scratch);
            st.tx_dirty = true;
            return;
        }
        self.submit_offload(st, idx)
    }

    fn push_req(&mut self, ns_idx: u32, req: Request) {
        if let Some(ns) = self.ns[ns_idx as usize].as_mut() {
            ns.inflight += 1;
            ns.counters
                .queue_depth
                .store(ns.inflight as u64, Ordering::Relaxed);
            match ns.q.submit(req) {
                Ok(()) => {}
                Err(SubmitError::Full(r)) => ns.pending.push_back(r),
                Err(SubmitError::Closed(r)) => self.completions.push(Completion {
                    tag: r.tag,
                    status: IoStatus::Unavailable,
                    buf: r.buf,
                }),
            }
        }
    }

    /// All host data is in: hand the command to the backend.
    fn submit_offload(&mut self, st: &mut QpState, idx: u32) {
        let c = &mut self.cmds[idx as usize];
        let sqe = c.sqe;
        let ns_idx = c.ns;
        let tag = (c.gen as u64) << 32 | idx as u64;
        c.st = St::Backend;
        let (lba, nblocks) = (sqe.slba(), sqe.nlb());
        // The commands that are one backend request each.
        let single = match c.kind {
            Kind::Read => Some((Op::Read, lba, nblocks, c.buf.take())),
            Kind::Write => Some((Op::Write { fua: sqe.fua() }, lba, nblocks, c.buf.take())),
            Kind::Flush => Some((Op::Flush, 0, 0, None)),
            // FUA (CDW12 bit 30, as for Write) goes down: the zeroes are durable before
            // the completion, not just at the next Flush.
            Kind::WriteZeroes => Some((Op::WriteZeroes { fua: sqe.fua() }, lba, nblocks, None)),
            _ => None,
        };
        if let Some((op, lba, nblocks, buf)) = single {
            c.pending = 1;
            let req = Request {
                tag,
                op,
                lba,
                nblocks,
                buf,
            };
            return self.push_req(ns_idx, req);
        }
        match c.kind {
            Kind::Compare => {
                let len = c.len as usize;
                let Some(mut b) = self.pool.get(len) else {
                    return self.fail(st, idx, Status::INTERNAL_ERROR);
                };
                b.set_len(len);
                let c = &mut self.cmds[idx as usize];
                c.pending = 1;
                self.push_req(
                    ns_idx,
                    Request {
                        tag,
                        op: Op::Read,
                        lba,
                        nblocks,
                        buf: Some(b),
                    },
                );
            }
            Kind::Dsm => {
                // Deallocate (AD, CDW11 bit 2) every range; other attributes are hints.
                let deallocate = sqe.cdw11 & (1 << 2) != 0;
                let nr = (sqe.cdw10 & 0xff) as usize + 1;
                let nblocks_ns = self.ns[ns_idx as usize].as_ref().map_or(0, |n| n.nblocks);
                let mut ranges = [(0u64, 0u32); 256];
                let mut n = 0;
                if deallocate {
                    let b = c.buf.as_ref().map_or(&[][..], |b| b.as_slice());
                    for r in b.chunks_exact(16).take(nr) {
                        let len = u32::from_le_bytes([r[4], r[5], r[6], r[7]]);
                        let slba = u64::from_le_bytes(r[8..16].try_into().unwrap_or([0; 8]));
                        if len == 0 {
                            continue;
                        }
                        if slba.checked_add(len as u64).is_none_or(|e| e > nblocks_ns) {
                            return self.fail(st, idx, Status::LBA_OUT_OF_RANGE);
                        }
                        ranges[n] = (slba, len);
                        n += 1;
                    }
                }
                if n == 0 {
                    return self.complete_offload(st, idx, Status::SUCCESS);
                }
                self.cmds[idx as usize].pending = n as u16;
                for &(lba, nblocks) in &ranges[..n] {
                    let req = Request {
                        tag,
                        op: Op::Deallocate,
                        lba,
                        nblocks,
                        buf: None,
                    };
                    self.push_req(ns_idx, req);
                }
            }
            // Read, Write, Flush and Write Zeroes went out above; NonOffload never comes here.
            _ => self.fail(st, idx, Status::INTERNAL_ERROR),
        }
    }

    fn complete_offload(&mut self, st: &mut QpState, idx: u32, status: Status) {
        let c = &self.cmds[idx as usize];
        let (kind, len, cid) = (c.kind, c.len, c.sqe.cid());
        if let Some(ns) = self.ns.get(c.ns as usize).and_then(|n| n.as_ref()) {
            let k = &ns.counters;
            let lat = c.start.elapsed().as_nanos() as u64;
            match kind {
                Kind::Read => k.read_latency.record(lat),
                Kind::Write => k.write_latency.record(lat),
                _ => k.other_latency.record(lat),
            }
            if !status.is_success() {
                k.count_error(status);
            } else {
                match kind {
                    Kind::Read => {
                        NsCounters::bump(&k.read_cmds, 1);
                        NsCounters::bump(&k.read_bytes, len as u64);
                    }
                    Kind::Write => {
                        NsCounters::bump(&k.write_cmds, 1);
                        NsCounters::bump(&k.write_bytes, len as u64);
                    }
                    // SMART counts Compare as a read: Host Read Commands and, for the
                    // logical blocks it compares, Data Units Read (NVMe Base 2.0 Fig. 207).
                    Kind::Compare => {
                        NsCounters::bump(&k.read_cmds, 1);
                        NsCounters::bump(&k.read_bytes, len as u64);
                    }
                    _ => NsCounters::bump(&k.other_cmds, 1),
                }
            }
        }
        let data_len = if kind == Kind::Read && status.is_success() {
            len
        } else {
            0
        };
        self.respond(st, idx, Cqe::new(cid, status), data_len);
    }

    fn on_backend_completion(&mut self, qps: &mut [QpSlot], ns_idx: u32, comp: Completion) {
        if let Some(ns) = self.ns[ns_idx as usize].as_mut() {
            ns.inflight = ns.inflight.saturating_sub(1);
            ns.counters
                .queue_depth
                .store(ns.inflight as u64, Ordering::Relaxed);
        }
        let idx = (comp.tag & 0xffff_ffff) as u32;
        let gen = (comp.tag >> 32) as u32;
        let Some(c) = self.cmds.get_mut(idx as usize) else {
            return;
        };
        if c.gen != gen || c.st != St::Backend {
            // The QP went away while this was in flight (disconnect); only recycle.
            if let Some(b) = comp.buf {
                self.pool.put(b);
            }
            return;
        }
        match c.kind {
            Kind::Compare => {
                // buf holds the host's data, the completion returns what the media has.
                if let Some(b) = comp.buf {
                    if comp.status == IoStatus::Ok {
                        let same = c.buf.as_ref().is_some_and(|h| {
                            h.as_slice()[..c.len as usize] == b.as_slice()[..c.len as usize]
                        });
                        if !same {
                            c.status = Status::COMPARE_FAILURE;
                        }
                    }
                    self.pool.put(b);
                }
            }
            _ => {
                if c.buf.is_none() {
                    c.buf = comp.buf;
                } else if let Some(b) = comp.buf {
                    self.pool.put(b);
                }
            }
        }
        if comp.status != IoStatus::Ok && c.status.is_success() {
            c.status = status_of(comp.status);
        }
        c.pending = c.pending.saturating_sub(1);
        if c.pending > 0 {
            return;
        }
        let status = c.status;
        let qh = c.qp;
        match qp_ref(qps, qh) {
            Some(q) if q.st.disconnect.is_none() => self.complete_offload(&mut q.st, idx, status),
            Some(q) => {
                // Disconnecting: nothing more goes out, just free the slot.
                self.release(&mut q.st, idx);
            }
            None => {
                let c = &mut self.cmds[idx as usize];
                free_cmd(c, &mut self.pool);
                self.free_cmds.push(idx);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_h2c(
        &mut self,
        qp: QpHandle,
        st: &mut QpState,
        cccid: u16,
        ttag: u16,
        datao: u32,
        data: &[u8],
        ddgst_ok: bool,
        hdr: &[u8],
    ) {
        let idx = ttag as u32;
        let valid = self
            .cmds
            .get(idx as usize)
            .is_some_and(|c| c.st == St::H2C && c.qp == qp && c.sqe.cid() == cccid);
        if !valid {
            // H2CData header: TTAG is at byte 10.
            return self.fatal(qp, st, tcp::fes::INVALID_HEADER_FIELD, 10, hdr);
        }
        let c = &mut self.cmds[idx as usize];
        let end = datao as u64 + data.len() as u64;
        if datao != c.got || end > c.len as u64 {
            return self.fatal(qp, st, tcp::fes::DATA_TRANSFER_OUT_OF_RANGE, 12, hdr);
        }
        if let Some(b) = c.buf.as_mut() {
            b.as_mut_slice()[datao as usize..end as usize].copy_from_slice(data);
        }
        if !ddgst_ok {
            c.status = Status::TRANSIENT_TRANSPORT_ERROR;
        }
        c.got = end as u32;
        if c.got < c.len {
            return;
        }
        if c.kind == Kind::NonOffload {
            c.st = St::App;
            let result = if c.status.is_success() {
                Ok(())
            } else {
                Err(TaskError::DataDigest)
            };
            let user = c.user;
            self.events.push_back(Event::TaskDone {
                kind: TaskKind::RdmaRead,
                qp,
                user,
                result,
            });
        } else if !c.status.is_success() {
            let s = c.status;
            self.fail(st, idx, s);
        } else {
            self.submit_offload(st, idx);
        }
    }
}
