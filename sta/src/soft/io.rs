//! Why this file is over 800 lines: the progress loop and the QP table it walks belong
//! together (accepting TCP, TLS and RDMA QPs, the pass itself, deadlines, teardown); the
//! per-link work is already in `tcp_link`/`rdma_link`, the command path in `cmd`.
//!
//! The soft engine's IO context: one per IO thread (DOCA: `struct doca_sta_io`). It owns
//! the QP table, the epoll set and the verbs state, and runs the progress loop: control
//! messages, socket input, completions, backends, output, disconnects, timeouts. What a
//! QP's bytes mean is decided by its link's queue machine (`tcp_link`, `rdma_link`) and
//! the command core (`cmd`); the tasks the application submits are in `tasks`.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::SubmitError;
use crossbeam_channel::{Receiver, Sender};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::EventFd;
use nvmf::tcp::ControllerLimits;

use super::cmd::{
    free_cmd, Core, FusedLocks, Link, NsFences, NsSlot, QpState, St, ADMIN_INCAPSULE,
};
use super::counters::{bump, StatsRegistry, ThreadCounters};
use super::rdma_link::{self, AcceptError, RdmaThread};
use super::tcp_link::{self, RxBuf, TcpLink, Wire};
use super::{Ack, Ctrl, SoftConfig};
use crate::verbs::ffi::IbvWc;
use crate::verbs::{ConnRequest, RdmaCmEvent};
use crate::{Event, QpHandle, TaskError, TaskKind, TransportErrorKind};
use crate::{Limit, TransportErrorKind as Tek};

/// Epoll data of an RDMA device's completion channel (low bits: device index); TCP QPs
/// use their slot index.
const COMP_TAG: u64 = 1 << 63;
/// The epoll tag of the context's wake-up event (`super::fence_all`).
const WAKE_TAG: u64 = u64::MAX;
/// How long a context waiting only for other IO threads spins before it naps, and the
/// longest nap (see `StaIo::progress`).
const REMOTE_SPIN: Duration = Duration::from_micros(50);
const REMOTE_NAP: Duration = Duration::from_micros(200);

/// A backend command outstanding this many times `backend_timeout` is reported as hung
/// even while its namespace's backend completes others (one lost command).
pub(super) const STUCK_FACTOR: u32 = 10;

pub(super) struct Qp {
    /// Received bytes not parsed yet (TCP only; empty for RDMA).
    pub rx: RxBuf,
    pub st: QpState,
    /// TCP: the epoll events the socket is registered for (0: not registered).
    pub interest: u32,
}

pub(super) struct QpSlot {
    pub gen: u32,
    pub qp: Option<Qp>,
}

pub(super) fn qp_ref(qps: &mut [QpSlot], h: QpHandle) -> Option<&mut Qp> {
    let s = qps.get_mut(h.idx as usize)?;
    if s.gen != h.gen {
        return None;
    }
    s.qp.as_mut()
}

/// The soft engine's per-thread IO context.
pub struct StaIo {
    pub(super) core: Core,
    pub(super) qps: Vec<QpSlot>,
    free_qps: Vec<u32>,
    epoll: Epoll,
    ep_events: Vec<EpollEvent>,
    ctrl: Receiver<Ctrl>,
    ack: Sender<Ack>,
    pub(super) released: Vec<u32>,
    next_timeout_check: Instant,
    /// Verbs state, set up with the first RDMA QP.
    pub(super) rdma: Option<RdmaThread>,
    wcs: Vec<IbvWc>,
    /// Ids of freed pool buffers, for their memory regions.
    dropped_bufs: Vec<u64>,
    /// The flush's copy of [`Core::tx_ready`] (two lists, swapped, so neither is
    /// allocated again).
    tx_flushing: Vec<QpHandle>,
    /// QPs whose `qp_disconnect` is under way, until their slots are freed.
    pub(super) disconnecting: Vec<QpHandle>,
    /// Slots of the RDMA QPs (their completion queues are polled every pass; TCP QPs
    /// are not walked for that).
    rdma_slots: Vec<u32>,
    /// A namespace is being removed (`Ctrl::NsRemove`): its slot goes once its
    /// in-flight I/O is done.
    ns_removals: bool,
    /// Since when commands here wait only for other IO threads (see `progress`).
    remote_since: Option<Instant>,
}

impl Drop for StaIo {
    /// QPs first (an RDMA QP is destroyed before anything it may touch: its CQ, its
    /// buffers' registrations), then the verbs state (memory regions, channels, PDs),
    /// then the buffers themselves with the rest.
    fn drop(&mut self) {
        // A fence another context sent after this one's last pass would never arrive, and
        // its sender would wait for good.
        while let Ok(m) = self.ctrl.try_recv() {
            if let Ctrl::Fence { fence, .. } = m {
                fence.arrive();
            }
        }
        self.qps.clear();
        self.rdma = None;
    }
}

impl StaIo {
    pub(crate) fn new(
        cfg: SoftConfig,
        ctrl: Receiver<Ctrl>,
        ack: Sender<Ack>,
        stats: Arc<StatsRegistry>,
        counters: Arc<ThreadCounters>,
        contexts: super::Contexts,
        waker: Arc<EventFd>,
    ) -> std::io::Result<StaIo> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        // Written by another context that sent this one a fence (`super::fence_all`), and
        // by the last context to arrive at a fence this one waits for (`Core::me`).
        epoll.add(&*waker, EpollEvent::new(EpollFlags::EPOLLIN, WAKE_TAG))?;
        let now = Instant::now();
        Ok(StaIo {
            core: Core::new(cfg, counters, stats, now, contexts, waker),
            qps: Vec::new(),
            free_qps: Vec::new(),
            epoll,
            ep_events: vec![EpollEvent::empty(); 64],
            ctrl,
            ack,
            released: Vec::with_capacity(64),
            next_timeout_check: now,
            rdma: None,
            wcs: vec![IbvWc::default(); 64],
            dropped_bufs: Vec::new(),
            tx_flushing: Vec::new(),
            disconnecting: Vec::new(),
            rdma_slots: Vec::new(),
            ns_removals: false,
            remote_since: None,
        })
    }

    /// See [`crate::IoContext::ns_fence`]: sent to every IO context, this one included
    /// (it handles its own message on its next pass, like the others).
    pub fn ns_fence(&mut self, subsys: crate::SubsysId, nsid: u32) -> crate::Fence {
        super::fence_all(&self.core.contexts, subsys, nsid, None)
    }

    /// Command slots in use (received and not yet answered and sent), all QPs.
    pub(crate) fn commands_in_flight(&self) -> usize {
        self.core.cmds.len() - self.core.free_cmds.len()
    }

    /// Bytes of data buffers this context's pool has allocated (in use or idle).
    pub fn buffer_bytes(&self) -> usize {
        self.core.pool.allocated_bytes()
    }

    /// The application commands' reserve: bytes allocated, buffers idle.
    #[cfg(test)]
    pub(crate) fn reserve_use(&self) -> (usize, usize) {
        let r = &self.core.reserve;
        (r.allocated_bytes(), r.idle_buffers())
    }

    /// Bytes of receive buffers held by this context's TCP connections.
    pub fn rx_buffer_bytes(&self) -> usize {
        self.qps
            .iter()
            .filter_map(|s| s.qp.as_ref())
            .map(|q| q.rx.buf.len())
            .sum()
    }

    /// Number of live QPs (the acceptor balances threads by it).
    pub(crate) fn qp_count(&self) -> usize {
        self.qps.iter().filter(|s| s.qp.is_some()).count()
    }

    fn tcp_limits(&self) -> (ControllerLimits, usize) {
        let cfg = &self.core.cfg;
        let limits = ControllerLimits {
            max_h2c_data: cfg.max_h2c_data,
            max_incapsule_data: cfg.max_incapsule_data.max(ADMIN_INCAPSULE),
            cpda: 0,
        };
        // The largest PDU (H2CData or an in-capsule write) and its headers, twice, so a
        // busy connection reads a PDU and the start of the next at once.
        let rx_max = (cfg.max_h2c_data.max(cfg.max_incapsule_data) as usize + 4096) * 2;
        (limits, rx_max)
    }

    fn alloc_qp_slot(&mut self) -> u32 {
        match self.free_qps.pop() {
            Some(i) => i,
            None => {
                self.qps.push(QpSlot { gen: 0, qp: None });
                self.qps.len() as u32 - 1
            }
        }
    }

    /// DOCA `qp_alloc` + `qp_accept`, for a TCP connection: the engine runs the
    /// ICReq/ICResp exchange itself, then hands capsules up or serves them.
    pub(crate) fn qp_accept_tcp(
        &mut self,
        sock: TcpStream,
        user: u64,
    ) -> std::io::Result<QpHandle> {
        let idx = self.register_tcp(&sock)?;
        let (limits, rx_cap) = self.tcp_limits();
        let link = Link::Tcp(TcpLink::new(Wire::Socket(sock), limits));
        let h = self.install_qp(idx, RxBuf::new(rx_cap), link, user, None);
        if let Some(q) = self.qps[idx as usize].qp.as_mut() {
            q.interest = EpollFlags::EPOLLIN.bits() as u32;
        }
        Ok(h)
    }

    /// A new TCP connection: non-blocking, no Nagle, a QP slot, registered for reading.
    fn register_tcp(&mut self, sock: &TcpStream) -> std::io::Result<u32> {
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        let idx = self.alloc_qp_slot();
        if let Err(e) = self
            .epoll
            .add(sock, EpollEvent::new(EpollFlags::EPOLLIN, idx as u64))
        {
            self.free_qps.push(idx);
            return Err(e.into());
        }
        Ok(idx)
    }

    /// The time for a new QP's deadlines.
    fn accept_time(&self) -> Instant {
        if self.core.manual_time {
            self.core.now
        } else {
            Instant::now()
        }
    }

    /// [`qp_accept_tcp`](Self::qp_accept_tcp) on a TLS listener: the engine runs the TLS
    /// handshake (or, for optional TLS, sees the host speak plain NVMe/TCP) before the
    /// ICReq, reports [`crate::Event::Tls`], and from then on every byte of the QP goes
    /// through OpenSSL.
    pub fn qp_accept_tcp_tls(
        &mut self,
        sock: TcpStream,
        user: u64,
        tls: &crate::TlsAccept,
    ) -> std::io::Result<QpHandle> {
        let idx = self.register_tcp(&sock)?;
        let (limits, rx_cap) = self.tcp_limits();
        // The handshake comes before the ICReq: it has the ICReq's deadline at most.
        let wait = tls
            .handshake_timeout
            .min(self.core.cfg.limits.icreq_timeout);
        let deadline = Instant::now() + wait;
        let wire = Wire::tls(sock, tls.ctx.clone(), tls.required, deadline);
        let link = Link::Tcp(TcpLink::new(wire, limits));
        Ok(self.install_qp(idx, RxBuf::new(rx_cap), link, user, None))
    }

    /// How a TLS QP's handshake ended: the PSK's owner, or why it failed (`None` for plain
    /// QPs and while the handshake runs).
    pub fn qp_tls(&mut self, qp: QpHandle) -> Option<Result<crate::TlsPeerInfo, String>> {
        match &qp_ref(&mut self.qps, qp)?.st.link {
            Link::Tcp(t) => t.tls.as_deref().cloned(),
            _ => None,
        }
    }

    /// A TCP QP over an in-memory pipe (unit tests: no socket, no epoll; `progress_at`
    /// services it every pass).
    #[cfg(test)]
    pub(super) fn qp_accept_memory(
        &mut self,
        pipe: std::rc::Rc<std::cell::RefCell<super::tests::MemPipe>>,
        user: u64,
    ) -> QpHandle {
        let idx = self.alloc_qp_slot();
        let (limits, rx_cap) = self.tcp_limits();
        let link = Link::Tcp(TcpLink::new(Wire::Memory(pipe), limits));
        self.install_qp(idx, RxBuf::new(rx_cap), link, user, None)
    }

    /// Put a new QP (TCP or RDMA) in slot `idx` with a fresh generation. An RDMA QP
    /// starts with output to post (its receives).
    /// `rdma_peer`: an RDMA QP's host address (a TCP QP's is its socket's).
    fn install_qp(
        &mut self,
        idx: u32,
        rx: RxBuf,
        link: Link,
        user: u64,
        rdma_peer: Option<std::net::SocketAddr>,
    ) -> QpHandle {
        let now = self.accept_time();
        let slot = &mut self.qps[idx as usize];
        slot.gen = slot.gen.wrapping_add(1) & 0x00ff_ffff;
        let handle = QpHandle { idx, gen: slot.gen };
        let counters = self.core.counters.add_queue(handle.as_u64());
        let rdma = matches!(link, Link::Rdma(_));
        let peer = match &link {
            Link::Tcp(t) => t.wire.socket().and_then(|s| s.peer_addr().ok()),
            Link::Rdma(_) => rdma_peer,
        }
        .map(|a| self.core.peers.attach(a.ip().to_canonical()));
        let qp = slot.qp.insert(Qp {
            rx,
            st: QpState::new(link, user, now, handle, counters),
            interest: 0,
        });
        qp.st.peer = peer;
        if rdma {
            self.core.mark_tx(&mut qp.st);
            self.rdma_slots.push(idx);
        }
        bump(&self.core.counters.qps, 1);
        handle
    }

    /// Gives a QP's peer address (unit tests: memory pipes have none).
    #[cfg(test)]
    pub(super) fn set_qp_peer(&mut self, qp: QpHandle, peer: std::net::IpAddr) {
        if let Some(q) = qp_ref(&mut self.qps, qp) {
            if let Some(old) = q.st.peer.take() {
                self.core.peers.detach(old);
            }
            q.st.peer = Some(self.core.peers.attach(peer));
        }
    }

    /// Peer shares in use (tests: none is left behind).
    #[cfg(test)]
    pub(super) fn peer_shares(&self) -> usize {
        self.core.peers.in_use()
    }

    /// Starts the commands of QPs whose peer gave buffer bytes back while they waited for
    /// its share of the pool (`PeerShares::give_back`).
    fn resume_peers(&mut self) {
        for h in std::mem::take(&mut self.core.peers.resume) {
            if let Some(q) = qp_ref(&mut self.qps, h) {
                self.core.resume_waiting(&mut q.st);
            }
        }
    }

    /// DOCA `qp_alloc` + `qp_accept` for an RDMA connect request (the CM thread has
    /// validated its private data; `depth` is HSQSIZE + 1): create the QP and its CQ on
    /// this thread's PD, post `depth` receives of SQE + in-capsule size, and accept with
    /// the NVMe-oF accept private data. On error the request is rejected (no resources)
    /// and its cm_id freed.
    pub(crate) fn qp_accept_rdma(
        &mut self,
        mut req: ConnRequest,
        depth: u16,
        user: u64,
    ) -> Result<QpHandle, AcceptError> {
        if self.rdma.is_none() {
            match RdmaThread::new() {
                Ok(rt) => {
                    // Pool buffers get memory regions: hear of the ones freed.
                    self.core.pool.track_drops();
                    self.core.reserve.track_drops();
                    self.rdma = Some(rt)
                }
                Err(error) => {
                    let status = nvmf::rdma::RejectStatus::NoResources;
                    req.reject(status);
                    return Err(AcceptError { status, error });
                }
            }
        }
        let Some(rt) = self.rdma.as_mut() else {
            unreachable!("set above")
        };
        let recv_sz = rdma_link::recv_size(self.core.cfg.max_incapsule_data);
        let rq = match rt.accept(&mut req, depth, recv_sz) {
            Ok(x) => x,
            Err(e) => {
                req.reject(e.status);
                return Err(e);
            }
        };
        let idx = self.alloc_qp_slot();
        if let Some(fd) = rq.channel_fd() {
            if let Err(e) = rdma_link::watch_channel(&self.epoll, fd, COMP_TAG | idx as u64) {
                tracing::warn!("epoll add of an RDMA completion channel: {e}");
            }
        }
        let peer = req.peer;
        Ok(self.install_qp(idx, RxBuf::new(0), Link::Rdma(Box::new(rq)), user, peer))
    }

    /// An RDMA CM event for a QP of this context. ESTABLISHED is DOCA's
    /// `qp_connect_established`; DISCONNECTED, DEVICE_REMOVAL, TIMEWAIT_EXIT and connect
    /// errors report [`Event::TransportError`] (the application then runs `qp_disconnect`).
    pub(crate) fn qp_rdma_cm_event(
        &mut self,
        qp: QpHandle,
        ev: RdmaCmEvent,
    ) -> Result<(), TaskError> {
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        let Link::Rdma(r) = &mut q.st.link else {
            return Err(TaskError::BadState);
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
        Ok(())
    }

    /// The next event, if any (call after `progress`).
    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.core.events.pop_front()
    }

    /// Whether the engine has work that needs another pass soon (I/O in flight, output
    /// waiting, events to deliver). It looks at the namespaces (few, set by the
    /// configuration) and at the QPs with output waiting ([`Core::tx_ready`]), never at
    /// every connected QP.
    pub(crate) fn busy(&self) -> bool {
        self.busy_here() || self.core.any_remote_wait()
    }

    /// [`StaIo::busy`] but for commands that wait for other IO threads.
    fn busy_here(&self) -> bool {
        !self.core.events.is_empty()
            || self
                .core
                .ns
                .iter()
                .flatten()
                .any(|n| n.inflight() > 0 || !n.pending.is_empty())
            || self.core.tx_ready.iter().any(|&h| {
                self.qps
                    .get(h.idx as usize)
                    .filter(|s| s.gen == h.gen)
                    .and_then(|s| s.qp.as_ref())
                    .is_some_and(|q| q.st.tx_ready())
            })
    }

    /// The bookkeeping behind [`Core::tx_ready`] (debug builds, every pass): every QP
    /// with output it may send now is on the list, and every QP on it is there once.
    #[cfg(debug_assertions)]
    fn check_tx_ready(&self) {
        let mut listed = 0;
        for s in &self.qps {
            let Some(q) = s.qp.as_ref() else {
                continue;
            };
            assert!(
                !q.st.tx_ready() || q.st.tx_listed(),
                "QP {:#x} has output to send and is not on the flush list",
                q.st.handle.as_u64()
            );
            listed += usize::from(q.st.tx_listed());
        }
        let mut live: Vec<QpHandle> = self
            .core
            .tx_ready
            .iter()
            .copied()
            .filter(|&h| {
                self.qps
                    .get(h.idx as usize)
                    .is_some_and(|s| s.gen == h.gen && s.qp.is_some())
            })
            .collect();
        live.sort_by_key(|h| h.as_u64());
        live.dedup();
        assert_eq!(
            live.len(),
            listed,
            "the flush list and the QPs' listed flags disagree"
        );
    }

    /// One pass: control messages, sockets, backend completions, output. Waits up to
    /// `max_wait` for socket input when there is nothing else to do. Returns whether
    /// anything happened.
    pub(crate) fn progress(&mut self, max_wait: Duration) -> bool {
        let mut did = self.drain_ctrl();
        did |= self.poll_rdma();
        let remote = self.core.any_remote_wait();
        let mut wait = if did || self.busy_here() {
            Duration::ZERO
        } else if remote {
            // Waiting only for other IO threads (a fused pair's range or fence): spin a
            // little, then nap, so that a thread sharing this CPU can run (spinning, even
            // with sched_yield, kept it off the CPU for milliseconds). A fence's last
            // arrival wakes this context; a range is looked at again after the nap.
            let since = *self.remote_since.get_or_insert_with(Instant::now);
            if since.elapsed() < REMOTE_SPIN {
                Duration::ZERO
            } else {
                REMOTE_NAP
            }
        } else {
            max_wait
        };
        if !remote {
            self.remote_since = None;
        }
        if !wait.is_zero() && self.arm_rdma() {
            // A completion slipped in between the poll and arming the CQs.
            wait = Duration::ZERO;
        }
        let timeout = EpollTimeout::try_from(wait).unwrap_or(EpollTimeout::ZERO);
        let n = self.epoll.wait(&mut self.ep_events, timeout).unwrap_or(0);
        self.core.manual_time = false;
        did | self.pass(Instant::now(), n)
    }

    /// One pass at time `now` without waiting: what [`progress`](Self::progress) does
    /// after its wait. The engine reads no clock here, so a test can drive it with
    /// simulated time.
    pub fn progress_at(&mut self, now: Instant) -> bool {
        let mut did = self.drain_ctrl();
        did |= self.poll_rdma();
        let n = self
            .epoll
            .wait(&mut self.ep_events, EpollTimeout::ZERO)
            .unwrap_or(0);
        self.core.manual_time = true;
        did | self.pass(now, n)
    }

    /// The pass after the wait, `n` epoll events ready.
    fn pass(&mut self, now: Instant, n: usize) -> bool {
        #[cfg(debug_assertions)]
        self.check_tx_ready();
        self.core.now = now;
        self.core.in_pass = true;
        let did = self.pass_inner(now, n);
        self.core.in_pass = false;
        #[cfg(debug_assertions)]
        self.check_tx_ready();
        did
    }

    fn pass_inner(&mut self, now: Instant, n: usize) -> bool {
        // Control messages that arrived while we slept come before the sockets: a host may
        // use a namespace as soon as it learns of it, and the engine was told first.
        let mut did = self.drain_ctrl();
        for i in 0..n {
            let data = self.ep_events[i].data();
            if data == WAKE_TAG {
                // The messages it announced were read above; only the counter is left.
                let _ = self.core.me.read();
                continue;
            }
            if data & COMP_TAG != 0 {
                let slot = self.qps.get((data & !COMP_TAG) as usize);
                if let (Some(rt), Some(Link::Rdma(r))) = (
                    self.rdma.as_ref(),
                    slot.and_then(|s| s.qp.as_ref()).map(|q| &q.st.link),
                ) {
                    r.drain_cq_events(rt.lib);
                }
                continue;
            }
            let flags = self.ep_events[i].events();
            if flags.intersects(EpollFlags::EPOLLOUT | EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP)
            {
                // The socket takes output again (or is dead: the write says so).
                if let Some(q) = self.qps.get_mut(data as usize).and_then(|s| s.qp.as_mut()) {
                    self.core.unblock_tx(&mut q.st);
                }
            }
            if flags.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP) {
                did |= self.service_rx(data as u32);
            }
        }
        #[cfg(test)]
        for i in 0..self.qps.len() {
            let memory = self.qps[i]
                .qp
                .as_ref()
                .is_some_and(|q| matches!(&q.st.link, Link::Tcp(t) if t.wire.socket().is_none()));
            if memory {
                // No epoll for a pipe: a full one is tried again every pass (its EPOLLOUT).
                if let Some(q) = self.qps[i].qp.as_mut().filter(|q| q.st.tx_blocked()) {
                    self.core.unblock_tx(&mut q.st);
                }
                did |= self.service_rx(i as u32);
            }
        }
        did |= self.poll_rdma();
        did |= self.poll_backends();
        if self.core.any_remote_wait() {
            did |= self.core.retry_remote_waits(&mut self.qps);
        }
        if !self.core.peers.resume.is_empty() {
            self.resume_peers();
            did = true;
        }
        if self.core.ns_gone_news {
            self.report_gone_backends();
        }
        did |= self.flush_all();
        if !self.disconnecting.is_empty() {
            self.finish_disconnects();
        }
        if now >= self.next_timeout_check {
            self.next_timeout_check =
                now + (self.core.cfg.backend_timeout / 4).min(Duration::from_secs(1));
            self.check_backend_timeouts(now);
            self.check_deadlines(now);
            self.check_stores();
            self.check_tls_deadlines(now);
        }
        let c = &self.core.counters;
        bump(if did { &c.busy_polls } else { &c.idle_polls }, 1);
        did
    }

    fn service_rx(&mut self, idx: u32) -> bool {
        let Some(slot) = self.qps.get_mut(idx as usize) else {
            return false;
        };
        let h = QpHandle { idx, gen: slot.gen };
        let Some(qp) = slot.qp.as_mut() else {
            return false;
        };
        if !qp.st.rx_stopped {
            let did = tcp_link::service_rx(&mut self.core, h, &mut qp.rx, &mut qp.st);
            if !qp.st.rx_stopped {
                return did;
            }
        }
        // Nothing more is read; drop the interest so a dead socket does not spin.
        set_interest(&self.epoll, qp, idx);
        false
    }

    /// Tell the main context about namespaces whose backend said it is gone (once per
    /// namespace and thread).
    fn report_gone_backends(&mut self) {
        self.core.ns_gone_news = false;
        for ns in self.core.ns.iter_mut().flatten() {
            if ns.gone && !ns.gone_reported {
                ns.gone_reported = true;
                tracing::error!(
                    nsid = ns.nsid,
                    "backend of namespace {} is gone: its I/O gets Internal Path Error",
                    ns.nsid
                );
                let _ = self.ack.send(Ack::BackendGone {
                    subsys: ns.subsys,
                    nsid: ns.nsid,
                });
            }
        }
    }

    /// Namespaces served from their store ([`NsSlot::ram`]) may see no request on their
    /// queue, which is where a backend learns it is gone (a deleted or shrunk file): ask
    /// their queues. One that is gone loses its store, and its I/O then fails through
    /// the queue.
    fn check_stores(&mut self) {
        for ns in self.core.ns.iter_mut().flatten() {
            if ns.ram.is_some() && !ns.gone && ns.q.check_gone() {
                ns.set_gone();
                self.core.ns_gone_news = true;
            }
        }
    }

    /// The deadlines of [`crate::EngineLimits`]: ICReq and Connect (from accept), host
    /// data (from the R2T), a PDU begun and not finished, output the peer does not take.
    /// A QP past one stops taking input and is reported as [`Tek::Limit`] (the application
    /// disconnects it); host data that never came also ends the NVMe/TCP connection with
    /// a C2HTermReq. Idle receive buffers shrink here too.
    fn check_deadlines(&mut self, now: Instant) {
        let lim = self.core.cfg.limits;
        if let Some(rt) = self.rdma.as_mut() {
            let late = crate::verbs::reap_dead_channels(now);
            if late > 0 {
                tracing::debug!(
                    late,
                    total = crate::verbs::late_cq_events(),
                    "rdma: completion events for CQs already destroyed, discarded (rdma_rxe \
                     before Linux 6.4 raises them late; see verbs::CqChannel)"
                );
            }
            self.core.pool.take_dropped(&mut self.dropped_bufs);
            self.core.reserve.take_dropped(&mut self.dropped_bufs);
            if !self.dropped_bufs.is_empty() {
                rt.forget_buffers(&self.dropped_bufs);
                self.dropped_bufs.clear();
            }
        }
        // A burst's idle buffers go back to the system (an eighth of the pool stays).
        self.core
            .pool
            .trim_idle(self.core.cfg.buffer_pool_bytes / 8);
        // Host data: the oldest outstanding fetch per TCP QP.
        let mut late: Vec<QpHandle> = Vec::new();
        for c in self.core.cmds.iter() {
            if c.st == St::H2C
                && now.saturating_duration_since(c.since) > lim.host_data_timeout
                && !late.contains(&c.qp)
            {
                late.push(c.qp);
            }
        }
        for h in late {
            let Some(q) = qp_ref(&mut self.qps, h) else {
                continue;
            };
            if q.st.disconnect.is_some() || q.st.error_reported {
                continue;
            }
            let Link::Tcp(t) = &mut q.st.link else {
                // An RDMA READ of host data is send-side work: the drain deadline covers
                // it while it waits for credits or for its completion (`flush_all`).
                continue;
            };
            if let Some(nvmf::tcp::ControllerEvent::Fatal { fes, fei, .. }) = t
                .machine
                .abort(&mut t.tx, nvmf::tcp::fes::PDU_SEQUENCE_ERROR)
            {
                self.core.events.push_back(Event::Terminated {
                    qp: h,
                    qp_user: q.st.user,
                    by_host: false,
                    icreq: false,
                    fes,
                    fei,
                    limit: Some(Limit::HostDataTimeout),
                });
            }
            self.core.unblock_tx(&mut q.st);
            self.core.mark_tx(&mut q.st);
            self.core.counters.hit(Limit::HostDataTimeout);
            q.st.rx_stopped = true;
            self.core
                .transport_error(h, &mut q.st, Tek::Limit(Limit::HostDataTimeout));
        }
        for i in 0..self.qps.len() {
            let gen = self.qps[i].gen;
            let Some(q) = self.qps[i].qp.as_mut() else {
                continue;
            };
            let h = QpHandle { idx: i as u32, gen };
            q.rx.shrink_if_idle();
            if let Link::Tcp(t) = &mut q.st.link {
                if t.tx.is_empty() && t.tx.segs.capacity() > 64 {
                    t.tx.segs.shrink_to_fit();
                }
            }
            if q.st.disconnect.is_some() || q.st.error_reported {
                continue;
            }
            if let Link::Rdma(r) = &q.st.link {
                // Send-side work outstanding since the last completion (which stopped the
                // clock: `on_wc`) is under the drain deadline from here on.
                if r.machine.send_side_busy() {
                    q.st.tx_stalled_since.get_or_insert(now);
                }
            }
            let age = now.saturating_duration_since(q.st.accepted);
            // A connection still in its TLS handshake is under the TLS deadline
            // (`check_tls_deadlines`), which says so, not under the ICReq and Connect ones.
            let tls_pending = matches!(&q.st.link, Link::Tcp(t) if t.wire.tls_deadline().is_some());
            let icreq_pending = matches!(&q.st.link, Link::Tcp(t) if t.machine.awaiting_icreq());
            let limit = if tls_pending {
                None
            } else if icreq_pending && age > lim.icreq_timeout {
                Some(Limit::IcReqTimeout)
            } else if q.st.qid.is_none() && age > lim.connect_timeout {
                Some(Limit::ConnectTimeout)
            } else if q
                .st
                .tx_stalled_since
                .is_some_and(|t| now.saturating_duration_since(t) > lim.drain_timeout)
            {
                Some(Limit::DrainTimeout)
            } else if q
                .st
                .partial_since
                .is_some_and(|t| now.saturating_duration_since(t) > lim.host_data_timeout)
            {
                Some(Limit::PartialPdu)
            } else {
                None
            };
            if let Some(l) = limit {
                tracing::debug!(qp = h.as_u64(), "closing: the peer {}", l.describe());
                self.core.counters.hit(l);
                q.st.rx_stopped = true;
                self.core.transport_error(h, &mut q.st, Tek::Limit(l));
                set_interest(&self.epoll, q, i as u32);
            }
        }
    }

    /// `be_queue_destroy` on this thread: drop the requests not yet handed to the
    /// backend and answer every command waiting on the namespace's backend queue now, with
    /// Aborted - SQ Deletion. Late completions from the backend are discarded (the slots'
    /// generations have moved on) and only recycle their buffers.
    fn abort_backend_commands(&mut self, ns_idx: u32) {
        let core = &mut self.core;
        if let Some(ns) = core.ns[ns_idx as usize].as_mut() {
            for r in ns.pending.drain(..) {
                ns.fences.ended(r.tag);
                if let Some(b) = r.buf {
                    core.pool.put(b);
                }
            }
            // The commands waiting for a fused pair's range or fence are answered below
            // with the rest, so none is tried again (its slot may hold another command by
            // then), and the pairs here give back their ranges and waits: nothing of the
            // namespace runs on this thread any more, and without this its slot (and the
            // backend's queue) would wait for good for a pair that never lets go.
            ns.blocked.clear();
            ns.remote_wait = false;
            ns.locks.abandon();
            ns.publish_depth();
        }
        for idx in 0..core.cmds.len() {
            let c = &mut core.cmds[idx];
            if c.st != St::Backend || c.ns != ns_idx {
                continue;
            }
            c.pending = 0;
            let qh = c.qp;
            match qp_ref(&mut self.qps, qh) {
                Some(q) if q.st.disconnect.is_none() => core.fail(
                    &mut q.st,
                    idx as u32,
                    nvmf::spec::Status::ABORTED_SQ_DELETION,
                ),
                Some(q) => core.release(&mut q.st, idx as u32),
                None => core.release_orphan(idx as u32),
            }
        }
    }

    /// Report commands that have waited on a backend longer than the backend timeout
    /// (each once) to the main context.
    /// TLS handshakes that ran past their deadline: the QP is dropped (a host holding a
    /// half-open handshake holds a QP slot and a socket).
    fn check_tls_deadlines(&mut self, now: Instant) {
        for i in 0..self.qps.len() {
            let gen = self.qps[i].gen;
            let Some(qp) = self.qps[i].qp.as_mut() else {
                continue;
            };
            let late = matches!(&qp.st.link, Link::Tcp(t) if t.wire.tls_deadline().is_some_and(|d| d <= now));
            if late && !qp.st.rx_stopped {
                // The handshake is the start of the ICReq's wait: counted under its limit.
                self.core.counters.hit(Limit::IcReqTimeout);
                let h = QpHandle { idx: i as u32, gen };
                if let Link::Tcp(t) = &mut qp.st.link {
                    t.tls = Some(Box::new(Err(
                        "the host did not finish the TLS handshake in time".into(),
                    )));
                }
                self.core.events.push_back(crate::Event::Tls {
                    qp: h,
                    qp_user: qp.st.user,
                    ok: false,
                });
                qp.st.rx_stopped = true;
                self.core
                    .transport_error(h, &mut qp.st, TransportErrorKind::Protocol);
            }
        }
    }

    /// Backend commands outstanding longer than the limit while their namespace's backend
    /// completed nothing on this thread for as long: the backend hangs. A backend that
    /// still completes is only slow (a host that queued a lot of work, such as
    /// deallocating much of the namespace many times over, makes the commands behind it
    /// wait), and its namespace is not to be taken from every host for it; a command
    /// outstanding [`STUCK_FACTOR`] times the limit is reported all the same.
    fn check_backend_timeouts(&mut self, now: Instant) {
        let limit = self.core.cfg.backend_timeout;
        let mut late: Vec<(u32, u32)> = Vec::new();
        for c in self.core.cmds.iter_mut() {
            // `pending` 0: not at the backend but waiting for a fused pair's range or fence
            // (or its partner's compare), which says nothing of the backend.
            if c.st != St::Backend || c.timeout_reported || c.pending == 0 {
                continue;
            }
            let age = now.saturating_duration_since(c.start);
            let progress = self
                .core
                .ns
                .get(c.ns as usize)
                .and_then(|s| s.as_ref())
                .and_then(|s| s.progress)
                .filter(|&p| p > c.start);
            let quiet = progress.map_or(age, |p| now.saturating_duration_since(p));
            if (age > limit && quiet > limit) || age > limit * STUCK_FACTOR {
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
                self.ack(Ack::BackendTimeout {
                    subsys,
                    nsid,
                    commands,
                });
            }
        }
    }

    fn ack(&self, a: Ack) {
        send_ack(&self.ack, a);
    }

    fn drain_ctrl(&mut self) -> bool {
        let mut did = false;
        while let Ok(m) = self.ctrl.try_recv() {
            // A fence with nothing of this context to wait for is no reason to busy-poll
            // afterwards: that kept a thread that shares this CPU with the fence's sender
            // off it for a whole spin window.
            did |= !matches!(m, Ctrl::Fence { .. });
            match m {
                Ctrl::NsAdd {
                    subsys,
                    nsid,
                    backend,
                    access,
                    fused,
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
                                ram: q.ram_store().map(Arc::new),
                                q,
                                pending: VecDeque::new(),
                                counters: self.core.stats.register_ns(subsys, nsid),
                                progress: None,
                                removing: None,
                                gone: false,
                                gone_reported: false,
                                view: access.load(),
                                view_epoch: access.epoch.load(std::sync::atomic::Ordering::Acquire),
                                access,
                                locks: FusedLocks::new(fused),
                                blocked: VecDeque::new(),
                                closed: Vec::new(),
                                remote_wait: false,
                                fences: NsFences::default(),
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
                Ctrl::Fence {
                    subsys,
                    nsid,
                    fence,
                } => {
                    // A namespace being removed is out of the map but may still have
                    // requests in flight: its slot is fenced too.
                    let slot = match self.core.ns_map.get(&(subsys.0, nsid)) {
                        Some(&i) => self.core.ns[i as usize].as_mut(),
                        None => self
                            .core
                            .ns
                            .iter_mut()
                            .flatten()
                            .find(|n| n.subsys == subsys && n.nsid == nsid),
                    };
                    match slot {
                        Some(ns) => ns.fences.add(fence),
                        // Not served here: nothing of it in flight.
                        None => fence.arrive(),
                    }
                }
                Ctrl::NsResize {
                    subsys,
                    nsid,
                    nblocks,
                } => {
                    let slot = self.core.ns_map.get(&(subsys.0, nsid)).copied();
                    if let Some(s) = slot.and_then(|i| self.core.ns[i as usize].as_mut()) {
                        s.nblocks = s.nblocks.max(nblocks);
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
                            self.ns_removals = true;
                        }
                        if fail_outstanding {
                            self.abort_backend_commands(i);
                            if let Some(s) = self.core.ns[i as usize].as_mut() {
                                s.acked = true;
                            }
                            self.ack(Ack::NsRemoved { task });
                        }
                    }
                    None => {
                        self.ack(Ack::NsRemoved { task });
                    }
                },
            }
        }
        // Removed namespaces whose in-flight I/O is done: destroy the queue, acknowledge.
        if self.ns_removals {
            self.ns_removals = false;
            // Nothing left of it at the backend. Commands waiting for a fused pair's range
            // or fence (`blocked`) have nothing in flight yet; they are retried and
            // answered first.
            let idle =
                |s: &NsSlot| s.inflight() == 0 && s.pending.is_empty() && s.blocked.is_empty();
            // Commands still bound to a slot (a write waiting for its data, say) keep it:
            // they finish on its backend, and no namespace added meanwhile takes it. (All
            // commands are looked at only once some slot has nothing else left.)
            let bound = if self
                .core
                .ns
                .iter()
                .flatten()
                .any(|s| s.removing.is_some() && idle(s))
            {
                self.core.bound_slots()
            } else {
                Vec::new()
            };
            for (i, slot) in self.core.ns.iter_mut().enumerate() {
                let Some(s) = slot else { continue };
                let Some(task) = s.removing else { continue };
                if idle(s) && !bound.get(i).copied().unwrap_or(true) {
                    if !s.acked {
                        send_ack(&self.ack, Ack::NsRemoved { task });
                    }
                    *slot = None;
                } else {
                    self.ns_removals = true;
                }
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
                    // Answered just below, with the namespace's completions.
                    Err(SubmitError::Closed(r)) => ns.refuse(r),
                }
            }
            if !ns.closed.is_empty() {
                self.core.completions.append(&mut ns.closed);
            }
            if ns.inflight() > 0 {
                ns.q.poll(&mut self.core.completions);
            }
            if self.core.completions.is_empty() {
                continue;
            }
            did = true;
            let mut comps = std::mem::take(&mut self.core.completions);
            self.core.batch_time = (!self.core.manual_time).then(Instant::now);
            for c in comps.drain(..) {
                self.core.on_backend_completion(&mut self.qps, i as u32, c);
            }
            self.core.batch_time = None;
            // Nothing is pushed there meanwhile (a request the backend refuses goes to its
            // namespace's `closed`); were anything, it would be kept, not dropped.
            comps.append(&mut self.core.completions);
            self.core.completions = comps;
        }
        did
    }

    /// Write (TCP) or post (RDMA) the pending output of the QPs on [`Core::tx_ready`]
    /// (the only ones with output they may send). A TCP socket that takes no more is left
    /// to EPOLLOUT (not retried every pass); output the peer has not taken starts the
    /// drain clock, and a queue of output grown past its bound ends the connection.
    fn flush_all(&mut self) -> bool {
        let mut did = false;
        let now = self.core.now;
        // What is marked while this runs (a release that starts a waiting command) goes
        // to the other list: the next pass.
        let mut list = std::mem::take(&mut self.tx_flushing);
        std::mem::swap(&mut list, &mut self.core.tx_ready);
        for &h in &list {
            let i = h.idx as usize;
            let Some(qp) = qp_ref(&mut self.qps, h) else {
                // Freed since it was listed.
                continue;
            };
            let listed = qp.st.take_tx_listed();
            debug_assert!(listed, "QP {:#x} on the flush list twice", h.as_u64());
            if !qp.st.tx_ready() {
                // Cleared (disconnecting) or blocked since it was listed.
                continue;
            }
            let st = &mut qp.st;
            let over;
            let still_dirty;
            let mut blocked = false;
            let res = match &mut st.link {
                Link::Rdma(r) => {
                    let before = r.machine.queued();
                    let recvs = !r.repost.is_empty();
                    let res = match self.rdma.as_mut() {
                        Some(rt) => post_rdma(rt, r, &self.core.cmds),
                        None => Ok(()),
                    };
                    let posted = before - r.machine.queued().min(before);
                    did |= posted > 0 || recvs;
                    // Work waiting for send-queue credits goes out when a completion
                    // returns them (`on_wc` marks the QP then): no polling. The drain
                    // clock runs while work waits or is posted and not completed (a host
                    // that posts no receives RNR-NAKs our SENDs, and the REQ it sent
                    // may have told our QP to retry them forever). Only a completion,
                    // the host's doing, starts it over (`on_wc`, `check_deadlines`):
                    // posting is ours, and a host sending a command now and then must
                    // not keep a stuck queue alive with it.
                    if !r.machine.send_side_busy() {
                        st.tx_stalled_since = None;
                    } else {
                        st.tx_stalled_since.get_or_insert(now);
                    }
                    over = r.machine.queued() > send_queue_bound(r.machine.params().sqsize);
                    if res.is_err() {
                        r.machine.discard_work();
                        still_dirty = false;
                    } else {
                        still_dirty = r.machine.ready();
                    }
                    res.map_err(|e| ("RDMA post failed", e))
                }
                Link::Tcp(t) => {
                    let res = tcp_link::flush(t, &mut self.core.cmds, &mut self.released);
                    match &res {
                        Ok(w) => {
                            did |= *w > 0 || !self.released.is_empty();
                            if t.tx.is_empty() {
                                st.tx_stalled_since = None;
                            } else {
                                // The socket is full: wait for EPOLLOUT.
                                blocked = true;
                                if *w > 0 {
                                    st.tx_stalled_since = Some(now);
                                } else {
                                    st.tx_stalled_since.get_or_insert(now);
                                }
                            }
                        }
                        Err(_) => {
                            // Output impossible: drop what is queued, report once.
                            did = true;
                            t.tx.discard(&mut self.released);
                            st.tx_stalled_since = None;
                        }
                    }
                    still_dirty = !t.tx.is_empty();
                    over = t.tx.segs.len() > send_queue_bound(t.machine.params().sqsize);
                    res.map(|_| ()).map_err(|e| ("socket write failed", e))
                }
            };
            self.core.tx_flushed(st, still_dirty, blocked);
            if let Err((what, e)) = res {
                if matches!(st.link, Link::Rdma(_)) {
                    tracing::warn!(qp = h.as_u64(), "{what}: {e}");
                }
                st.rx_stopped = true;
                self.core.transport_error(h, st, TransportErrorKind::Io);
            } else if over && !st.error_reported && st.disconnect.is_none() {
                self.core.counters.hit(Limit::SendQueue);
                st.rx_stopped = true;
                self.core
                    .transport_error(h, st, Tek::Limit(Limit::SendQueue));
            }
            for c in self.released.drain(..) {
                self.core.release(st, c);
            }
            set_interest(&self.epoll, qp, i as u32);
        }
        list.clear();
        self.tx_flushing = list;
        did
    }

    /// Completes `qp_disconnect` tasks whose QP has nothing left in the backend (the QPs
    /// on `disconnecting`; the others are not looked at).
    fn finish_disconnects(&mut self) {
        let mut k = 0;
        while k < self.disconnecting.len() {
            let h = self.disconnecting[k];
            let i = h.idx as usize;
            let Some(qp) = qp_ref(&mut self.qps, h) else {
                // Not ours any more (cannot happen: a QP leaves the list when freed).
                self.disconnecting.swap_remove(k);
                continue;
            };
            let Some(user) = qp.st.disconnect else {
                self.disconnecting.swap_remove(k);
                continue;
            };
            if matches!(qp.st.link, Link::Rdma(_)) {
                // The NIC may still touch command buffers until the QP is destroyed: wait
                // for the backend, destroy the QP, then free every slot.
                if self
                    .core
                    .cmds
                    .iter()
                    .any(|c| c.st == St::Backend && c.qp == h)
                {
                    k += 1;
                    continue;
                }
                // Dropping the link destroys the verbs QP, its CQ and the cm_id.
                if let Some(fd) = match &qp.st.link {
                    Link::Rdma(r) => r.channel_fd(),
                    Link::Tcp(_) => None,
                } {
                    rdma_link::unwatch_channel(&self.epoll, fd);
                }
                if let Some(s) = self.qps[i].qp.take().and_then(|q| q.st.peer) {
                    self.core.peers.detach(s);
                }
                if let Some(p) = self.rdma_slots.iter().position(|&s| s as usize == i) {
                    self.rdma_slots.swap_remove(p);
                }
                for (ci, c) in self.core.cmds.iter_mut().enumerate() {
                    if c.st != St::Free && c.qp == h {
                        self.core.free_cmds.push(ci as u32);
                        free_cmd(
                            c,
                            &mut self.core.pool,
                            &mut self.core.reserve,
                            &mut self.core.peers,
                        );
                    }
                }
                self.disconnecting.swap_remove(k);
                self.finish_qp_free(i, h, user);
                continue;
            }
            // Free every slot that is not owned by the backend.
            for (ci, c) in self.core.cmds.iter_mut().enumerate() {
                if c.st != St::Free && c.st != St::Backend && c.qp == h {
                    self.core.free_cmds.push(ci as u32);
                    free_cmd(
                        c,
                        &mut self.core.pool,
                        &mut self.core.reserve,
                        &mut self.core.peers,
                    );
                    qp.st.inflight -= 1;
                }
            }
            if qp.st.inflight > 0 {
                k += 1;
                continue;
            }
            if let Link::Tcp(t) = &qp.st.link {
                if let Some(sock) = t.wire.socket() {
                    // Fails only if it was removed already: nothing left to undo.
                    let _ = self.epoll.delete(sock);
                }
                t.wire.shutdown();
            }
            if let Some(s) = self.qps[i].qp.take().and_then(|q| q.st.peer) {
                self.core.peers.detach(s);
            }
            self.disconnecting.swap_remove(k);
            self.finish_qp_free(i, h, user);
        }
    }

    fn finish_qp_free(&mut self, i: usize, h: QpHandle, user: u64) {
        self.free_qps.push(i as u32);
        self.core.counters.remove_queue(h.as_u64());
        let qps = &self.core.counters.qps;
        qps.store(
            qps.load(std::sync::atomic::Ordering::Relaxed)
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

    fn arm_rdma(&mut self) -> bool {
        let Some(rt) = self.rdma.as_mut() else {
            return false;
        };
        for &i in &self.rdma_slots {
            if let Some(Qp {
                st:
                    QpState {
                        link: Link::Rdma(r),
                        ..
                    },
                ..
            }) = self.qps[i as usize].qp.as_mut()
            {
                rt.arm(r);
            }
        }
        self.poll_rdma()
    }

    /// Poll every RDMA QP's completion queue (each has its own: this walks the RDMA QPs,
    /// not the TCP ones).
    fn poll_rdma(&mut self) -> bool {
        let Some(rt) = self.rdma.as_mut() else {
            return false;
        };
        let mut did = false;
        for &i in &self.rdma_slots {
            let i = i as usize;
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
                    rdma_link::on_wc(&mut self.core, rt, h, &mut qp.st, &wc);
                }
                if n < self.wcs.len() {
                    break;
                }
            }
        }
        did
    }
}

/// Tell the main context. It fails only when the main context was dropped (the
/// application is tearing down): nobody waits for the answer then.
fn send_ack(tx: &Sender<Ack>, a: Ack) {
    if tx.send(a).is_err() {
        tracing::debug!("engine: the main context is gone; acknowledgement dropped");
    }
}

/// Post an RDMA link's receives and the work its machine has credits for.
pub(super) fn post_rdma(
    rt: &mut RdmaThread,
    r: &mut rdma_link::RdmaLink,
    cmds: &[super::cmd::Cmd],
) -> std::io::Result<()> {
    let dev = r.dev();
    let lib = rt.lib;
    r.flush(lib, |ci| {
        let b = cmds.get(ci as usize)?.buf.as_ref()?;
        Some((b.as_ptr() as u64, rt.lkey(dev, b)?))
    })
}

/// Most pieces of output (TCP segments, RDMA work requests) a queue of SQSIZE `sqsize`
/// may have waiting: every outstanding command's response (a few pieces each) and some
/// room for answers that need no slot. Past it the peer is neither reading nor respecting
/// flow control.
fn send_queue_bound(sqsize: u16) -> usize {
    8 * (sqsize as usize + 1) + 64
}

/// Register `qp`'s socket (slot `idx`) for what it waits for: input unless input is over,
/// output room while the socket is full. Pipes (tests) have no socket.
fn set_interest(epoll: &Epoll, qp: &mut Qp, idx: u32) {
    let Link::Tcp(t) = &qp.st.link else {
        return;
    };
    let Some(sock) = t.wire.socket() else {
        return;
    };
    let mut want = EpollFlags::empty();
    if !qp.st.rx_stopped {
        want |= EpollFlags::EPOLLIN;
    }
    if qp.st.tx_blocked() && qp.st.disconnect.is_none() {
        want |= EpollFlags::EPOLLOUT;
    }
    let want_bits = want.bits() as u32;
    if want_bits == qp.interest {
        return;
    }
    let mut ev = EpollEvent::new(want, idx as u64);
    let r = if want.is_empty() {
        epoll.delete(sock)
    } else if qp.interest == 0 {
        epoll.add(sock, ev)
    } else {
        epoll.modify(sock, &mut ev)
    };
    if r.is_ok() {
        qp.interest = want_bits;
    }
}
