//! The harness: one engine IO context, one `Target`, any number of host connections.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf::spec::fabrics::{self, ConnectCommand, ConnectData, PropertyCommand};
use nvmf::spec::{opcodes, Cqe, DataDirection, Sqe, Status};
use nvmf::target::{
    Action, NamespaceConfig, NoCounters, Outcome, QueueOrigin, QueueRef, SubsystemConfig, Target,
    TargetOptions,
};
use nvmf::tcp::{Digests, HostConfig, HostError, HostEvent, HostQueue, TxSink, Xfer};
use zerocopy::IntoBytes;

use super::MemPipe;
use crate::soft::{SoftConfig, Sta, StaIo};
use crate::{CmdToken, Engine, Event, QpHandle, SubsysId, TaskKind};

pub const NQN: &str = "nqn.2026-11.dev.nvmf-target:pair";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
pub const BLOCK: u32 = 512;
pub const BLOCKS: u64 = 8192;
/// Most engine passes one `pump` runs before it calls the conversation stuck.
const MAX_PASSES: usize = 200_000;
/// With real sockets, how long `open` and `wait` keep pumping for what they wait for.
pub const SOCKET_WAIT: Duration = Duration::from_secs(10);

/// A connected loopback TCP pair: (the host's end, non-blocking; the target's end). With
/// `buffers`, the target's send buffer and the host's receive buffer are that small.
fn socket_pair(buffers: Option<usize>) -> (std::net::TcpStream, std::net::TcpStream) {
    use nix::sys::socket::{setsockopt, sockopt};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("listen on loopback");
    let host = std::net::TcpStream::connect(l.local_addr().expect("address")).expect("connect");
    let (target, _) = l.accept().expect("accept");
    if let Some(b) = buffers {
        setsockopt(&target, sockopt::SndBuf, &b).expect("SO_SNDBUF");
        setsockopt(&host, sockopt::RcvBuf, &b).expect("SO_RCVBUF");
    }
    host.set_nonblocking(true).expect("non-blocking");
    host.set_nodelay(true).expect("no delay");
    (host, target)
}

/// Host output: header bytes inline, data as references resolved at send time.
#[derive(Default)]
struct Out {
    bytes: Vec<u8>,
    segs: Vec<(bool, usize, u32, u32)>,
}

impl TxSink for Out {
    fn header(&mut self, b: &[u8]) {
        self.segs.push((false, self.bytes.len(), 0, b.len() as u32));
        self.bytes.extend_from_slice(b);
    }
    fn data(&mut self, cid: u32, off: u32, len: u32) {
        self.segs.push((true, cid as usize, off, len));
    }
    fn release(&mut self, _: u32) {}
}

/// One host connection (one queue).
pub struct Conn {
    pub pipe: Rc<RefCell<MemPipe>>,
    /// The host's end of a real loopback TCP connection (non-blocking), for connections
    /// opened while [`Pair::sockets`] is set; then `pipe` is unused but for
    /// `target_closed`, and `chunk` is ignored.
    pub sock: Option<std::net::TcpStream>,
    pub host: HostQueue,
    pub qp: QpHandle,
    pub bufs: Vec<Vec<u8>>,
    out: Out,
    /// Host bytes not yet given to the target.
    pub tx: VecDeque<u8>,
    /// Target bytes not yet parsed by the host.
    pub rx: Vec<u8>,
    pub completions: VecDeque<(u16, Cqe, Vec<u8>)>,
    /// Bytes handed to the target per engine pass.
    pub chunk: usize,
    /// The host machine refused what the target sent (or the target terminated).
    pub error: Option<HostError>,
    /// Answer R2Ts automatically (off for tests that forge H2CData).
    pub auto_r2t: bool,
    /// R2Ts seen while `auto_r2t` is off: (cid, ttag, offset, len).
    pub r2ts: Vec<(u16, u16, u32, u32)>,
    pub cntlid: u16,
    /// The host reads what the target sends (off: a peer that never reads).
    pub reading: bool,
    /// Host NQN and Host Identifier this connection's Connect sends.
    pub hostnqn: String,
    pub hostid: [u8; 16],
    /// Where the connection "came in" (its listener decides its ANA states).
    pub origin: QueueOrigin,
}

impl Conn {
    /// Answers an R2T the test held back (`auto_r2t` off) with H2CData.
    pub fn send_h2c(&mut self, cid: u16, ttag: u16, offset: u32, data: &[u8]) {
        self.host.send_data(&mut self.out, cid, ttag, offset, data);
        self.flush_out();
    }

    fn flush_out(&mut self) {
        for &(data, a, off, len) in &self.out.segs {
            let s: &[u8] = if data {
                &self.bufs[a][off as usize..(off + len) as usize]
            } else {
                &self.out.bytes[a..a + len as usize]
            };
            self.tx.extend(s.iter().copied());
        }
        self.out.segs.clear();
        self.out.bytes.clear();
    }

    /// Queue raw bytes to the target (forged PDUs).
    pub fn send_raw(&mut self, b: &[u8]) {
        self.tx.extend(b.iter().copied());
    }

    /// The host closes its end.
    pub fn close(&mut self) {
        self.pipe.borrow_mut().host_closed = true;
        if let Some(s) = &self.sock {
            // Fails only when the connection is gone already.
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
    }

    /// Socket connections: write what the socket takes, read what it has. Returns
    /// whether any bytes moved.
    fn move_socket_bytes(&mut self) -> bool {
        use std::io::{ErrorKind, Read, Write};
        let Some(s) = self.sock.as_mut() else {
            return false;
        };
        let mut moved = false;
        while !self.tx.is_empty() && !self.pipe.borrow().host_closed {
            let (front, _) = self.tx.as_slices();
            match s.write(front) {
                Ok(n) if n > 0 => {
                    self.tx.drain(..n);
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                _ => break,
            }
        }
        let mut buf = [0u8; 65536];
        while self.reading {
            match s.read(&mut buf) {
                Ok(0) => {
                    self.pipe.borrow_mut().target_closed = true;
                    break;
                }
                Ok(n) => {
                    self.rx.extend_from_slice(&buf[..n]);
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        moved
    }

    pub fn target_closed(&self) -> bool {
        self.pipe.borrow().target_closed
    }
}

#[derive(Default)]
struct QpApp {
    queue: Option<QueueRef>,
    closed: bool,
}

/// One [`Event::Terminated`] as the application saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Termination {
    pub qp: QpHandle,
    pub by_host: bool,
    pub icreq: bool,
    pub fes: u16,
    pub fei: u32,
}

/// An engine, a target and their hosts, with simulated time.
pub struct Pair {
    pub sta: Sta,
    pub io: StaIo,
    pub target: Target,
    pub subsys: SubsysId,
    pub backend: Arc<backend::RamBackend>,
    /// Every request the engine handed to the backend, in order.
    pub backend_ops: Arc<std::sync::Mutex<Vec<backend::Op>>>,
    /// Set: the backend fails every request from now on as gone (`IoStatus::Unavailable`:
    /// a deleted file, a vanished device).
    pub backend_gone: Arc<std::sync::atomic::AtomicBool>,
    pub now: Instant,
    pub conns: Vec<Conn>,
    /// New connections are real loopback TCP sockets served through the engine's epoll
    /// (its EPOLLIN/EPOLLOUT path), not pipes. The kernel may hand bytes over a moment
    /// after they were written, so with sockets `open` and `wait` pump again, with short
    /// sleeps, until what they wait for is there (at most [`SOCKET_WAIT`]).
    pub sockets: bool,
    /// Socket buffer sizes for new socket connections (SO_SNDBUF of the target's end,
    /// SO_RCVBUF of the host's), to make a full socket easy to reach.
    pub socket_buffers: Option<usize>,
    apps: HashMap<QpHandle, QpApp>,
    waiting: HashMap<u64, (QpHandle, CmdToken, Sqe)>,
    held: HashMap<(u16, u16), (QpHandle, CmdToken)>,
    next_wait: u64,
    /// Transport errors the engine reported, by QP.
    pub transport_errors: Vec<(QpHandle, crate::TransportErrorKind)>,
    /// NVMe/TCP terminations the engine reported ([`Event::Terminated`]), in order.
    pub terminations: Vec<Termination>,
    /// Commands the engine answered with an error before their queue's Connect
    /// ([`Event::RefusedBeforeConnect`]), in order.
    pub refused_before_connect: Vec<(QpHandle, Status)>,
    /// Commands of connected queues the engine failed ([`Event::CommandFailed`]).
    pub failed: Vec<(QpHandle, crate::CommandFailure)>,
    pub disconnected: Vec<QpHandle>,
}

impl Pair {
    pub fn new() -> Pair {
        Pair::with_config(SoftConfig::default())
    }

    pub fn with_config(cfg: SoftConfig) -> Pair {
        Pair::build(cfg, false)
    }

    /// As [`Pair::with_config`], with a namespace that lends its bytes
    /// ([`backend::BackendQueue::ram_store`]) as a plain RAM namespace does: TCP reads are
    /// then sent from the store and never reach the backend's queue.
    pub fn lending(cfg: SoftConfig) -> Pair {
        Pair::build(cfg, true)
    }

    /// As [`Pair::lending`], over `store` (of [`BLOCKS`] blocks of [`BLOCK`] bytes): a
    /// file mapped as a store, as the file backend serves a file in memory.
    pub fn lending_store(cfg: SoftConfig, store: Arc<backend::RamBackend>) -> Pair {
        Pair::build_on(cfg, true, store)
    }

    fn build(cfg: SoftConfig, lend: bool) -> Pair {
        let store = backend::RamBackend::new(BLOCKS * BLOCK as u64, BLOCK).expect("RAM");
        Pair::build_on(cfg, lend, store)
    }

    fn build_on(cfg: SoftConfig, lend: bool, backend: Arc<backend::RamBackend>) -> Pair {
        let caps_mdts = (cfg.max_io_size / 4096).trailing_zeros() as u8;
        let ioccsz = cfg.max_incapsule_data;
        let mut sta = Sta::new(cfg);
        let subsys = sta.subsystem_create(NQN).expect("subsystem");
        let backend_ops = Arc::new(std::sync::Mutex::new(Vec::new()));
        let backend_gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let recording = Arc::new(Recording {
            lend,
            inner: backend.clone(),
            ops: backend_ops.clone(),
            gone: backend_gone.clone(),
        });
        sta.ns_add(subsys, 1, recording).expect("ns_add");
        let io = sta
            .io_create()
            .expect("IO context")
            .start()
            .expect("IO context");
        let mut target = Target::new(TargetOptions {
            mdts: caps_mdts,
            ioccsz_bytes: ioccsz,
            ..TargetOptions::default()
        });
        target
            .add_subsystem(SubsystemConfig {
                nqn: NQN.into(),
                serial: "PAIR".into(),
                model: "pair harness".into(),
                allow_any_host: true,
                hosts: Vec::new(),
                listeners: None,
            })
            .expect("subsystem");
        target
            .add_namespace(
                NQN,
                NamespaceConfig {
                    nsid: 1,
                    block_size: BLOCK,
                    num_blocks: BLOCKS,
                    uuid: [1; 16],
                    nguid: [2; 16],
                    eui64: [3; 8],
                    volatile_write_cache: false,
                    anagrpid: 0,
                    hosts: None,
                },
            )
            .expect("namespace");
        Pair {
            sta,
            io,
            target,
            subsys,
            backend,
            backend_ops,
            backend_gone,
            now: Instant::now(),
            conns: Vec::new(),
            sockets: false,
            socket_buffers: None,
            apps: HashMap::new(),
            waiting: HashMap::new(),
            held: HashMap::new(),
            next_wait: 1,
            transport_errors: Vec::new(),
            terminations: Vec::new(),
            refused_before_connect: Vec::new(),
            failed: Vec::new(),
            disconnected: Vec::new(),
        }
    }

    /// A new connection after ICReq/ICResp; returns its index.
    pub fn open(&mut self, digests: Digests, hpda: u8) -> usize {
        let i = self.open_without_icreq(digests, hpda);
        let c = &mut self.conns[i];
        c.host.start(&mut c.out);
        c.flush_out();
        self.pump_until(|p| p.conns[i].host.ic_resp().is_some() || p.conns[i].error.is_some());
        assert!(
            self.conns[i].host.ic_resp().is_some(),
            "no ICResp: {:?}",
            self.conns[i].error
        );
        i
    }

    /// A new connection whose host has sent nothing yet (tests that forge the ICReq);
    /// returns its index.
    pub fn open_without_icreq(&mut self, digests: Digests, hpda: u8) -> usize {
        let pipe = Rc::new(RefCell::new(MemPipe::default()));
        let (qp, sock) = if self.sockets {
            let (host, target) = socket_pair(self.socket_buffers);
            let qp = self.io.qp_accept_tcp(target, 0).expect("accept");
            (qp, Some(host))
        } else {
            (self.io.qp_accept_memory(pipe.clone(), 0), None)
        };
        self.apps.insert(qp, QpApp::default());
        let c = Conn {
            pipe,
            sock,
            host: HostQueue::new(
                HostConfig {
                    digests,
                    hpda,
                    maxr2t: 0,
                    max_c2h_data: 16 << 20,
                },
                31,
            ),
            qp,
            bufs: vec![Vec::new(); 256],
            out: Out::default(),
            tx: VecDeque::new(),
            rx: Vec::new(),
            completions: VecDeque::new(),
            chunk: usize::MAX,
            error: None,
            auto_r2t: true,
            r2ts: Vec::new(),
            cntlid: 0,
            reading: true,
            hostnqn: HOSTNQN.to_string(),
            hostid: [9; 16],
            origin: QueueOrigin::default(),
        };
        self.conns.push(c);
        self.conns.len() - 1
    }

    /// Submit a command on connection `i` (no waiting).
    pub fn submit(&mut self, i: usize, sqe: Sqe, xfer: Xfer, buf: Vec<u8>) -> u16 {
        let c = &mut self.conns[i];
        let cid = c
            .host
            .submit(&mut c.out, sqe, xfer, &buf)
            .expect("a free CID");
        c.bufs[cid as usize] = buf;
        c.flush_out();
        cid
    }

    /// Submit and run until that command completes.
    pub fn exec(&mut self, i: usize, sqe: Sqe, xfer: Xfer, buf: Vec<u8>) -> (Cqe, Vec<u8>) {
        let cid = self.submit(i, sqe, xfer, buf);
        self.wait(i, cid)
    }

    pub fn wait(&mut self, i: usize, cid: u16) -> (Cqe, Vec<u8>) {
        self.pump_until(|p| {
            let c = &p.conns[i];
            c.completions.iter().any(|x| x.0 == cid) || c.error.is_some() || c.target_closed()
        });
        let c = &mut self.conns[i];
        let Some(p) = c.completions.iter().position(|x| x.0 == cid) else {
            panic!(
                "CID {cid} did not complete (host error {:?}, target closed {})",
                c.error,
                c.target_closed()
            );
        };
        let (_, cqe, buf) = c.completions.remove(p).expect("position");
        (cqe, buf)
    }

    /// Fabrics Connect of an admin queue (SQSIZE `sqsize`, KATO `kato_ms`) and enable the
    /// controller; returns the connection.
    pub fn admin(&mut self, digests: Digests, sqsize: u16, kato_ms: u32) -> usize {
        let i = self.open(digests, 0);
        let cqe = self.connect(i, fabrics::CNTLID_DYNAMIC, 0, sqsize, kato_ms, 0);
        assert!(cqe.status().is_success(), "admin Connect: {}", cqe.status());
        self.conns[i].cntlid = cqe.dw0 as u16;
        self.conns[i].host.set_depth(sqsize as usize);
        let p = PropertyCommand {
            attrib: 0,
            offset: fabrics::property::CC,
            value: (fabrics::cc::EN | 6 << 16 | 4 << 20) as u64,
        };
        let (cqe, _) = self.exec(i, p.to_sqe(0, true), Xfer::None, Vec::new());
        assert!(cqe.status().is_success(), "CC.EN: {}", cqe.status());
        i
    }

    /// An admin queue and one I/O queue; returns (admin, io).
    pub fn controller(&mut self, digests: Digests, io_sqsize: u16, cattr: u8) -> (usize, usize) {
        let a = self.admin(digests, 31, 0);
        let q = self.open(digests, 0);
        let cntlid = self.conns[a].cntlid;
        let cqe = self.connect(q, cntlid, 1, io_sqsize, 0, cattr);
        assert!(cqe.status().is_success(), "I/O Connect: {}", cqe.status());
        self.conns[q].cntlid = cntlid;
        self.conns[q].host.set_depth(io_sqsize as usize);
        (a, q)
    }

    pub fn connect(
        &mut self,
        i: usize,
        cntlid: u16,
        qid: u16,
        sqsize: u16,
        kato: u32,
        cattr: u8,
    ) -> Cqe {
        let cmd = ConnectCommand {
            recfmt: 0,
            qid,
            sqsize,
            cattr,
            kato,
        };
        let data = ConnectData::new(
            self.conns[i].hostid,
            cntlid,
            NQN,
            &self.conns[i].hostnqn.clone(),
        );
        // With flow control disabled the host machine checks SQHD FFFFh from here on.
        self.conns[i]
            .host
            .set_sq_flow_control_disabled(cattr & fabrics::CATTR_DISABLE_SQ_FLOW_CONTROL != 0);
        let (cqe, _) = self.exec(
            i,
            cmd.to_sqe(0),
            Xfer::ToController,
            data.as_bytes().to_vec(),
        );
        cqe
    }

    /// Move simulated time and run the keep-alive timers.
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        let actions = self.target.poll_timeouts(self.now);
        self.apply(actions);
        self.pump();
    }

    /// [`pump`](Self::pump); with sockets, again (after a short sleep) until `done`
    /// holds or [`SOCKET_WAIT`] has passed.
    pub fn pump_until(&mut self, mut done: impl FnMut(&Pair) -> bool) {
        self.pump();
        let deadline = Instant::now() + SOCKET_WAIT;
        while self.sockets && !done(self) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
            self.pump();
        }
    }

    /// Run engine passes and move bytes until nothing moves.
    pub fn pump(&mut self) {
        for _ in 0..MAX_PASSES {
            if !self.pass() && !self.io.busy() {
                return;
            }
        }
        panic!("conversation did not settle in {MAX_PASSES} passes");
    }

    /// One round: the hosts' bytes to the target, one engine pass, the target's bytes to
    /// the hosts. Returns whether anything moved.
    pub fn pass(&mut self) -> bool {
        let mut moved = false;
        for c in self.conns.iter_mut() {
            if c.sock.is_some() {
                moved |= c.move_socket_bytes();
                continue;
            }
            if !c.tx.is_empty() && !c.pipe.borrow().host_closed {
                let n = c.chunk.min(c.tx.len());
                let mut p = c.pipe.borrow_mut();
                p.to_target.extend(c.tx.drain(..n));
                moved = true;
            }
        }
        moved |= self.io.progress_at(self.now);
        while let Some(ev) = self.io.poll_event() {
            moved = true;
            self.on_event(ev);
        }
        for c in self.conns.iter_mut() {
            if !c.reading {
                continue;
            }
            moved |= c.move_socket_bytes();
            let got = std::mem::take(&mut c.pipe.borrow_mut().to_host);
            if !got.is_empty() {
                moved = true;
                c.rx.extend_from_slice(&got);
            }
            moved |= host_receive(c);
        }
        moved
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            // The in-memory pair has no TLS links.
            Event::Tls { .. } => {}
            Event::NonOffload {
                qp,
                token,
                sqe,
                payload_valid,
                ..
            } => {
                if sqe.data_direction() == DataDirection::HostToController && !payload_valid {
                    let id = self.next_wait;
                    self.next_wait += 1;
                    self.waiting.insert(id, (qp, token, sqe));
                    if self.io.rdma_read(qp, token, id).is_err() {
                        self.waiting.remove(&id);
                    }
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
                if let Some((qp, token, sqe)) = self.waiting.remove(&user) {
                    match result {
                        Ok(()) => self.execute(qp, token, &sqe),
                        Err(_) => {
                            let cqe = Cqe::new(sqe.cid(), Status::TRANSIENT_TRANSPORT_ERROR);
                            let _ = self.io.rdma_send(qp, token, &cqe, 0);
                        }
                    }
                }
            }
            Event::TaskDone {
                kind: TaskKind::QpDisconnect,
                qp,
                ..
            } => {
                self.close_queue(qp);
                self.apps.remove(&qp);
                self.waiting.retain(|_, w| w.0 != qp);
                self.disconnected.push(qp);
            }
            Event::TaskDone { .. } => {}
            Event::Terminated {
                qp,
                by_host,
                icreq,
                fes,
                fei,
                ..
            } => self.terminations.push(Termination {
                qp,
                by_host,
                icreq,
                fes,
                fei,
            }),
            Event::TransportError { qp, kind, .. } => {
                self.transport_errors.push((qp, kind));
                self.close_queue(qp);
                let _ = self.io.qp_disconnect(qp, 0);
            }
            Event::RefusedBeforeConnect { qp, status, .. } => {
                self.refused_before_connect.push((qp, status))
            }
            Event::CommandFailed { qp, failure, .. } => self.failed.push((qp, failure)),
        }
    }

    fn close_queue(&mut self, qp: QpHandle) {
        let Some(app) = self.apps.get_mut(&qp) else {
            return;
        };
        if app.closed {
            return;
        }
        app.closed = true;
        self.held.retain(|_, (h, _)| *h != qp);
        if let Some(q) = app.queue {
            let actions = self.target.queue_closed(q, qp.as_u64());
            self.apply(actions);
        }
    }

    pub fn apply(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::CompleteHeld { queue, cqe, .. } => {
                    if let Some((qp, token)) = self.held.remove(&(queue.cntlid, cqe.cid)) {
                        let _ = self.io.rdma_send(qp, token, &cqe, 0);
                    }
                }
                Action::Disconnect { key, .. } => {
                    // As the daemon does: the target still hears of the close when the
                    // disconnect is done (`close_queue`), so a retired controller goes
                    // once its last queue has closed.
                    let qp = self.apps.keys().copied().find(|q| q.as_u64() == key);
                    if let Some(qp) = qp {
                        self.held.retain(|_, (h, _)| *h != qp);
                        let _ = self.io.qp_disconnect(qp, 0);
                    }
                }
                Action::Abort {
                    key,
                    cid,
                    abort,
                    abort_cid,
                    ..
                } => {
                    let qp = self.apps.keys().copied().find(|q| q.as_u64() == key);
                    let aborted = qp.is_some_and(|qp| self.io.cmd_abort(qp, cid));
                    let more = self.target.abort_done(abort, abort_cid, aborted);
                    self.apply(more);
                }
            }
        }
    }

    /// Hands the target's new namespace access views to the engine (the daemon's
    /// `sync_target_state`).
    pub fn publish_views(&mut self) {
        let publisher = self.sta.access_publisher();
        for (_, nsid, view) in self.target.take_access_updates() {
            publisher.publish(self.subsys, nsid, view);
        }
    }

    /// What the daemon's IO thread does with a non-offloaded command.
    fn execute(&mut self, qp: QpHandle, token: CmdToken, sqe: &Sqe) {
        let now = self.now;
        let key = qp.as_u64();
        let Ok(payload) = self.io.payload(token) else {
            return;
        };
        if sqe.is_fabrics() && sqe.fctype() == opcodes::fabrics::CONNECT {
            let origin = self
                .conns
                .iter()
                .find(|c| c.qp == qp)
                .map(|c| c.origin.clone())
                .unwrap_or_default();
            let (cqe, ok) = self.target.connect(now, key, &origin, sqe, payload);
            if let Some(ok) = ok {
                if let Some(a) = self.apps.get_mut(&qp) {
                    a.queue = Some(ok.queue());
                }
                if ok.qid > 0 {
                    self.io.qp_add_subsystem(qp, self.subsys).expect("QP");
                    self.io.qp_set_access(qp, ok.access).expect("QP");
                }
                self.io
                    .qp_connect_set_params(qp, ok.qid, ok.sqsize, ok.disable_sq_flow_control)
                    .expect("QP");
            }
            self.io.rdma_send(qp, token, &cqe, 0).expect("rdma_send");
            let actions = self.target.take_actions();
            self.apply(actions);
            return;
        }
        let Some(queue) = self.apps.get(&qp).and_then(|a| a.queue) else {
            let cqe = Cqe::new(sqe.cid(), Status::COMMAND_SEQUENCE_ERROR);
            let _ = self.io.rdma_send(qp, token, &cqe, 0);
            return;
        };
        let outcome = self.target.execute(now, queue, sqe, payload, &NoCounters);
        // New access views reach the engine before the completion goes out.
        self.publish_views();
        match outcome {
            Outcome::Complete { cqe, data_len } if data_len > 0 => {
                self.io
                    .rdma_write_send(qp, token, &cqe, data_len, 0)
                    .expect("rdma_write_send");
            }
            Outcome::Complete { cqe, .. } => {
                self.io.rdma_send(qp, token, &cqe, 0).expect("rdma_send");
            }
            Outcome::Deferred => {
                // A held command with this CID is one the host sent again (an AER after a
                // controller reset): the old one will never be answered, free its slot.
                if let Some((oq, ot)) = self.held.insert((queue.cntlid, sqe.cid()), (qp, token)) {
                    if ot != token {
                        let _ = self.io.cmd_drop(oq, ot);
                    }
                }
            }
            // A retired controller's queue: its Disconnect action is on the way.
            Outcome::Dropped => {}
        }
        let actions = self.target.take_actions();
        self.apply(actions);
    }
}

/// Let the host machine parse what it received; returns whether anything happened.
fn host_receive(c: &mut Conn) -> bool {
    let mut did = false;
    while c.error.is_none() {
        let (used, ev) = match c.host.receive(&c.rx, &mut c.out) {
            Ok(r) => r,
            Err(e) => {
                // The PDU in error is dropped with whatever followed it.
                c.error = Some(e);
                c.rx.clear();
                c.flush_out();
                return true;
            }
        };
        let Some(ev) = ev else { break };
        did = true;
        match ev {
            HostEvent::Data { cid, offset, data } => {
                c.bufs[cid as usize][offset as usize..offset as usize + data.len()]
                    .copy_from_slice(data);
            }
            HostEvent::R2T {
                cid,
                ttag,
                offset,
                len,
            } => {
                if c.auto_r2t {
                    let part =
                        c.bufs[cid as usize][offset as usize..(offset + len) as usize].to_vec();
                    c.host.send_data(&mut c.out, cid, ttag, offset, &part);
                } else {
                    c.r2ts.push((cid, ttag, offset, len));
                }
            }
            HostEvent::Completion { cid, cqe } => {
                let buf = std::mem::take(&mut c.bufs[cid as usize]);
                c.completions.push_back((cid, cqe, buf));
            }
            HostEvent::Connected(_) => {}
        }
        c.rx.drain(..used);
        c.flush_out();
    }
    did
}

// ------------------------------------------------------------------ command builders

pub fn rw(opcode: u8, slba: u64, nlb: u32) -> Sqe {
    let mut s = Sqe::default();
    s.set_opcode_cid(opcode, 0);
    s.nsid = 1;
    s.cdw10 = slba as u32;
    s.cdw11 = (slba >> 32) as u32;
    s.cdw12 = nlb - 1;
    s
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed * 7) as u8)
        .collect()
}

/// The namespace's bytes as the RAM backend holds them.
pub fn disk(p: &Pair, slba: u64, nlb: u32) -> Vec<u8> {
    use backend::{Backend, Completion, IoBuf, Op, Request};
    let mut q = p.backend.clone().create_queue(1).expect("queue");
    let len = nlb as usize * BLOCK as usize;
    let mut b = IoBuf::new(len);
    b.set_len(0);
    q.submit(Request {
        tag: 1,
        op: Op::Read,
        lba: slba,
        nblocks: nlb,
        buf: Some(b),
    })
    .expect("submit");
    let mut out: Vec<Completion> = Vec::new();
    while out.is_empty() {
        q.poll(&mut out);
    }
    out.remove(0).buf.expect("buffer").as_slice()[..len].to_vec()
}

/// A RAM backend that records every request's operation.
#[derive(Debug)]
struct Recording {
    /// Its queues lend the RAM store's bytes.
    lend: bool,
    inner: Arc<backend::RamBackend>,
    ops: Arc<std::sync::Mutex<Vec<backend::Op>>>,
    gone: Arc<std::sync::atomic::AtomicBool>,
}

struct RecordingQueue {
    lend: bool,
    inner: Box<dyn backend::BackendQueue>,
    ops: Arc<std::sync::Mutex<Vec<backend::Op>>>,
    gone: Arc<std::sync::atomic::AtomicBool>,
    failed: Vec<backend::Completion>,
}

impl backend::Backend for Recording {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }
    fn volatile_write_cache(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        "recording ram".into()
    }
    fn create_queue(
        self: Arc<Self>,
        depth: u32,
    ) -> Result<Box<dyn backend::BackendQueue>, backend::Error> {
        Ok(Box::new(RecordingQueue {
            lend: self.lend,
            inner: self.inner.clone().create_queue(depth)?,
            ops: self.ops.clone(),
            gone: self.gone.clone(),
            failed: Vec::new(),
        }))
    }
    fn flush_sync(&self) -> Result<(), backend::Error> {
        self.inner.flush_sync()
    }
}

impl backend::BackendQueue for RecordingQueue {
    fn submit(&mut self, req: backend::Request) -> Result<(), backend::SubmitError> {
        let op = req.op;
        if self.gone.load(std::sync::atomic::Ordering::Relaxed) {
            self.failed.push(backend::Completion {
                tag: req.tag,
                status: backend::IoStatus::Unavailable,
                buf: req.buf,
            });
            return Ok(());
        }
        let r = self.inner.submit(req);
        if r.is_ok() {
            self.ops.lock().expect("ops").push(op);
        }
        r
    }
    fn poll(&mut self, out: &mut Vec<backend::Completion>) -> usize {
        let n = self.failed.len();
        out.append(&mut self.failed);
        n + self.inner.poll(out)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.failed.len()
    }
    fn ram_store(&self) -> Option<Arc<backend::RamBackend>> {
        if self.lend {
            self.inner.ram_store()
        } else {
            None
        }
    }
    fn check_gone(&mut self) -> bool {
        self.gone.load(std::sync::atomic::Ordering::Relaxed)
    }
}
