//! The contract suite, generic over the engine and the transport: [`Fabric`] gives an
//! engine, a backend and connected hosts; [`World`] plays the application (a small
//! daemon around `nvmf::target::Target`, written only against `sta`'s traits) and
//! records everything the engine reports; the scenarios at the bottom drive it and check
//! the rules `sta::contract` states.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::Backend;
use nvmf::spec::fabrics::{self, ConnectCommand, ConnectData, PropertyCommand};
use nvmf::spec::opcodes::{admin, io};
use nvmf::spec::{opcodes, Cqe, DataDirection, Sqe, Status};
use nvmf::target::{
    NamespaceConfig, NoCounters, Outcome, QueueOrigin, SubsystemConfig, Target, TargetOptions,
};
use sta::{
    CmdToken, CommandFailure, Engine, EngineError, Event, IoContext, IoSeed, MainEvent, QpHandle,
    SubsysId, TaskError, TaskKind, TransportErrorKind,
};
use zerocopy::IntoBytes;

use crate::glue::{Glue, Held, QpApp};

pub const NQN: &str = "nqn.2026-11.dev.nvmf-target:contract";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
pub const BLOCK: u32 = 512;
pub const BLOCKS: u64 = 16384;
/// Longest any one wait may take before the scenario fails (wall clock: the engine and
/// the host run for real).
const DEADLINE: Duration = Duration::from_secs(10);

/// A command's data transfer, as the host sees it.
pub enum Dir {
    None,
    /// These bytes go to the controller (in-capsule when they fit, else fetched).
    ToController(Vec<u8>),
    /// This many bytes come back.
    FromController(u32),
}

/// One host queue (one connection), pumped by the test between engine passes.
pub trait Host {
    /// The transport handshake is over (TCP: ICResp; RDMA: established).
    fn ready(&self) -> bool;
    /// Send a command; returns its CID.
    fn submit(&mut self, sqe: Sqe, dir: Dir) -> u16;
    /// Move bytes both ways without blocking; whether anything moved.
    fn pump(&mut self) -> bool;
    /// Command `cid`'s completion and data, once it arrived.
    fn take(&mut self, cid: u16) -> Option<(Cqe, Vec<u8>)>;
    /// More CIDs (after Connect granted a deeper queue).
    fn set_depth(&mut self, depth: usize);
    /// The host closes its end.
    fn close(&mut self);
    /// The target closed the connection.
    fn gone(&self) -> bool;
    /// The host refused something the target sent.
    fn error(&self) -> Option<String>;
    /// An RDMA CM event of this connection for the target's IO context (ESTABLISHED,
    /// DISCONNECTED), as the daemon's CM service would deliver it; TCP has none.
    fn cm_event(&mut self) -> Option<sta::verbs::RdmaCmEvent> {
        None
    }
}

/// What an engine and a transport give the suite.
pub trait Fabric {
    type Engine: Engine;
    type Host: Host;
    fn name(&self) -> &'static str;
    /// A fresh engine whose backend timeout is `backend_timeout`.
    fn engine(&mut self, backend_timeout: Duration) -> Self::Engine;
    /// A backend of [`BLOCKS`] blocks of [`BLOCK`] bytes that reads back what was written
    /// and holds its requests while [`Fabric::stall`] is on.
    fn backend(&mut self) -> Arc<dyn Backend>;
    /// Hold (or release) the backend's requests; the engine is given for fabrics whose
    /// backend lives in the engine's library (the DOCA double's RAM drive).
    fn stall(&mut self, engine: &mut Self::Engine, on: bool);
    /// Whether the engine counts latency histograms (DOCA's counters have none).
    fn counts_latency(&self) -> bool {
        true
    }
    /// Whether the engine bounds I/O by the namespace size it was given, and so can
    /// follow a resize (DOCA STA takes no size: the drive bounds its I/O).
    fn bounds_by_size(&self) -> bool {
        true
    }
    /// Whether the engine's library keeps one subsystem per NQN (DOCA), so that a second
    /// `subsystem_create` of a live NQN is [`EngineError::NqnInUse`].
    fn unique_nqns(&self) -> bool {
        false
    }
    /// A new connection, accepted on `io` with QP user data `user`, and its host end.
    fn connect(
        &mut self,
        io: &mut <Self::Engine as Engine>::Io,
        user: u64,
    ) -> (QpHandle, Self::Host);
}

/// Everything the engine reported, in order.
#[derive(Default)]
pub struct Log {
    pub non_offloaded: Vec<(QpHandle, u64, Sqe, u32, bool)>,
    pub task_done: Vec<(TaskKind, QpHandle, u64, Result<(), TaskError>)>,
    /// Tasks whose call returned Ok: (kind, user).
    pub submitted: Vec<(TaskKind, u64)>,
    pub transport_errors: Vec<(QpHandle, TransportErrorKind)>,
    pub main_events: Vec<MainEvent>,
    /// Commands the engine failed by itself ([`Event::CommandFailed`]).
    pub failed: Vec<(QpHandle, CommandFailure)>,
    /// The payload of a command handed up without its data (rule 5: zeroes).
    pub payload_without_data: Vec<Vec<u8>>,
    /// `payload()` while an `rdma_read` ran (rule 2: refused).
    pub payload_during_read: Vec<Result<usize, TaskError>>,
    /// The payload once `rdma_read` completed.
    pub payload_after_read: Vec<Vec<u8>>,
}

type Io<F> = <<F as Fabric>::Engine as Engine>::Io;

impl<F: Fabric> Glue for World<F> {
    fn target(&mut self) -> &mut Target {
        &mut self.target
    }
    fn apps(&mut self) -> &mut HashMap<QpHandle, QpApp> {
        &mut self.apps
    }
    fn held(&mut self) -> &mut Held {
        &mut self.held
    }
    fn answer(&mut self, qp: QpHandle, token: CmdToken, cqe: &Cqe, data_len: u32) {
        World::answer(self, qp, token, cqe, data_len)
    }
    fn disconnect(&mut self, qp: QpHandle) {
        World::disconnect(self, qp)
    }
    fn cmd_abort(&mut self, qp: QpHandle, cid: u16) -> bool {
        self.io.cmd_abort(qp, cid)
    }
}

/// An engine, its application and its hosts.
pub struct World<F: Fabric> {
    pub fabric: F,
    pub engine: F::Engine,
    pub io: Io<F>,
    pub target: Target,
    pub subsys: SubsysId,
    /// The namespace's backend (NSID 1).
    pub backend: Arc<dyn Backend>,
    pub hosts: Vec<(QpHandle, F::Host)>,
    pub log: Log,
    apps: HashMap<QpHandle, QpApp>,
    waiting: HashMap<u64, (QpHandle, CmdToken, Sqe)>,
    held: Held,
    next_user: u64,
    /// Answer non-offloaded commands (off: the test answers them itself).
    pub auto_answer: bool,
    /// Commands handed up while `auto_answer` is off.
    pub pending: Vec<(QpHandle, CmdToken, Sqe)>,
    /// Teardown races are expected (hosts close with work in flight): answers and reads
    /// refused because the QP is closing or gone, and failed reads, are what a daemon
    /// sees and tolerates, not test failures.
    pub lenient: bool,
}

impl<F: Fabric> World<F> {
    pub fn new(mut fabric: F) -> World<F> {
        World::with_timeout(&mut fabric, Duration::from_secs(30)).finish(fabric)
    }

    pub fn with_backend_timeout(mut fabric: F, t: Duration) -> World<F> {
        World::with_timeout(&mut fabric, t).finish(fabric)
    }

    fn with_timeout(fabric: &mut F, t: Duration) -> Parts<F> {
        let mut engine = fabric.engine(t);
        let subsys = engine.subsystem_create(NQN).expect("subsystem_create");
        let backend = fabric.backend();
        engine.ns_add(subsys, 1, backend.clone()).expect("ns_add");
        let io = engine
            .io_create()
            .expect("io_create")
            .start()
            .expect("IO context start");
        let caps = engine.caps();
        let mut target = Target::new(TargetOptions {
            mdts: (caps.max_io_size / 4096).trailing_zeros() as u8,
            ioccsz_bytes: caps.max_incapsule_data,
            max_queue_depth: caps.max_queue_depth,
            ..TargetOptions::default()
        });
        target
            .add_subsystem(SubsystemConfig {
                nqn: NQN.into(),
                serial: "CONTRACT".into(),
                model: "contract suite".into(),
                allow_any_host: true,
                hosts: Vec::new(),
                listeners: None,
            })
            .expect("target subsystem");
        target
            .add_namespace(
                NQN,
                NamespaceConfig {
                    nsid: 1,
                    block_size: backend.block_size(),
                    num_blocks: backend.num_blocks(),
                    uuid: [1; 16],
                    nguid: [2; 16],
                    eui64: [3; 8],
                    volatile_write_cache: false,
                    anagrpid: 0,
                    hosts: None,
                },
            )
            .expect("target namespace");
        Parts {
            engine,
            io,
            target,
            subsys,
            backend,
        }
    }

    fn user(&mut self) -> u64 {
        self.next_user += 1;
        self.next_user
    }

    /// One engine pass, its events handled, every host pumped, main events drained.
    pub fn pass(&mut self) -> bool {
        let mut did = self.io.progress(Duration::ZERO);
        while let Some(ev) = self.io.poll_event() {
            did = true;
            self.on_event(ev);
        }
        for (qp, h) in self.hosts.iter_mut() {
            did |= h.pump();
            while let Some(ev) = h.cm_event() {
                did = true;
                // A QP already gone has nothing to hear.
                let _ = self.io.qp_rdma_cm_event(*qp, ev);
            }
        }
        while let Some(ev) = self.engine.progress() {
            did = true;
            self.log.main_events.push(ev);
        }
        did
    }

    /// Run passes until `cond` holds; fail after [`DEADLINE`].
    pub fn run_until(&mut self, what: &str, mut cond: impl FnMut(&mut World<F>) -> bool) {
        let end = Instant::now() + DEADLINE;
        loop {
            if cond(self) {
                return;
            }
            if Instant::now() > end {
                let errs: Vec<_> = self.hosts.iter().filter_map(|(_, h)| h.error()).collect();
                panic!(
                    "{}: {what}: not within {DEADLINE:?} (host errors {errs:?})",
                    self.fabric.name()
                );
            }
            if !self.pass() {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Runs until the main context reports namespace 1 removed for `user`.
    pub fn wait_ns1_removed(&mut self, user: u64) {
        self.run_until("NsRemoved", |w| {
            w.log
                .main_events
                .iter()
                .any(|e| matches!(e, MainEvent::NsRemoved { nsid: 1, user: u, .. } if *u == user))
        });
    }

    /// Run passes for `d` (to show something does not happen).
    pub fn run_for(&mut self, d: Duration) {
        let end = Instant::now() + d;
        while Instant::now() < end {
            if !self.pass() {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// A new connection, transport handshake done; returns its index.
    pub fn open(&mut self) -> usize {
        let user = self.user();
        let (qp, host) = self.fabric.connect(&mut self.io, user);
        self.apps.insert(qp, QpApp::default());
        self.hosts.push((qp, host));
        let i = self.hosts.len() - 1;
        self.run_until("transport handshake", |w| w.hosts[i].1.ready());
        i
    }

    pub fn submit(&mut self, i: usize, sqe: Sqe, dir: Dir) -> u16 {
        self.hosts[i].1.submit(sqe, dir)
    }

    pub fn wait(&mut self, i: usize, cid: u16) -> (Cqe, Vec<u8>) {
        let mut got = None;
        self.run_until(&format!("completion of CID {cid}"), |w| {
            got = w.hosts[i].1.take(cid);
            got.is_some()
        });
        got.expect("completion")
    }

    pub fn exec(&mut self, i: usize, sqe: Sqe, dir: Dir) -> (Cqe, Vec<u8>) {
        let cid = self.submit(i, sqe, dir);
        self.wait(i, cid)
    }

    fn connect(&mut self, i: usize, cntlid: u16, qid: u16, sqsize: u16) -> Cqe {
        let cmd = ConnectCommand {
            recfmt: 0,
            qid,
            sqsize,
            cattr: 0,
            kato: 0,
        };
        let data = ConnectData::new([9; 16], cntlid, NQN, HOSTNQN);
        let (cqe, _) = self.exec(
            i,
            cmd.to_sqe(0),
            Dir::ToController(data.as_bytes().to_vec()),
        );
        cqe
    }

    /// An admin queue, connected and enabled: (connection, CNTLID).
    pub fn admin(&mut self) -> (usize, u16) {
        let i = self.open();
        let cqe = self.connect(i, fabrics::CNTLID_DYNAMIC, 0, 31);
        assert!(cqe.status().is_success(), "admin Connect: {}", cqe.status());
        let cntlid = cqe.dw0 as u16;
        self.hosts[i].1.set_depth(32);
        let p = PropertyCommand {
            attrib: 0,
            offset: fabrics::property::CC,
            value: (fabrics::cc::EN | 6 << 16 | 4 << 20) as u64,
        };
        let (cqe, _) = self.exec(i, p.to_sqe(0, true), Dir::None);
        assert!(cqe.status().is_success(), "CC.EN: {}", cqe.status());
        (i, cntlid)
    }

    /// An admin queue and an I/O queue of one controller: (admin, io).
    pub fn controller(&mut self) -> (usize, usize) {
        let (a, cntlid) = self.admin();
        let q = self.open();
        let cqe = self.connect(q, cntlid, 1, 31);
        assert!(cqe.status().is_success(), "I/O Connect: {}", cqe.status());
        self.hosts[q].1.set_depth(32);
        (a, q)
    }

    pub fn on_event(&mut self, ev: Event) {
        match ev {
            Event::NonOffload {
                qp,
                qp_user,
                token,
                sqe,
                payload_len,
                payload_valid,
            } => {
                self.log
                    .non_offloaded
                    .push((qp, qp_user, sqe, payload_len, payload_valid));
                let h2c = sqe.data_direction() == DataDirection::HostToController;
                // Only data the target reads is fetched (issue 11), as the daemon does.
                let qid = self.apps.get(&qp).and_then(|a| a.queue).map(|q| q.qid);
                let reads = nvmf::target::slow_path_host_data(&sqe, qid) > 0;
                if h2c && !payload_valid && reads {
                    let p = self
                        .io
                        .payload(token)
                        .expect("payload of a handed-up command");
                    assert_eq!(p.len(), payload_len as usize, "payload length");
                    self.log.payload_without_data.push(p.to_vec());
                    let user = self.user();
                    match self.io.rdma_read(qp, token, user) {
                        Ok(()) => {}
                        Err(TaskError::QpClosing | TaskError::NoQp) if self.lenient => return,
                        Err(e) => panic!("rdma_read: {e}"),
                    }
                    self.log.submitted.push((TaskKind::RdmaRead, user));
                    let during = self.io.payload(token).map(|p| p.len());
                    self.log.payload_during_read.push(during);
                    self.waiting.insert(user, (qp, token, sqe));
                } else if self.auto_answer {
                    self.execute(qp, token, &sqe);
                } else {
                    self.pending.push((qp, token, sqe));
                }
            }
            Event::TaskDone {
                kind,
                qp,
                user,
                result,
            } => {
                self.log.task_done.push((kind, qp, user, result));
                match kind {
                    TaskKind::RdmaRead => {
                        let (qp, token, sqe) = self
                            .waiting
                            .remove(&user)
                            .expect("a read the app submitted");
                        if self.lenient && result.is_err() {
                            // The daemon answers a failed fetch; its QP is going away.
                            let cqe = Cqe::new(sqe.cid(), Status::TRANSIENT_TRANSPORT_ERROR);
                            self.answer(qp, token, &cqe, 0);
                            return;
                        }
                        result.expect("rdma_read");
                        let p = self.io.payload(token).expect("payload after rdma_read");
                        self.log.payload_after_read.push(p.to_vec());
                        self.execute(qp, token, &sqe);
                    }
                    TaskKind::QpDisconnect => {
                        self.close_queue(qp);
                        self.apps.remove(&qp);
                    }
                    TaskKind::RdmaSend | TaskKind::RdmaWriteSend => {}
                }
            }
            Event::TransportError { qp, kind, .. } => {
                self.log.transport_errors.push((qp, kind));
                self.close_queue(qp);
                self.disconnect(qp);
            }
            Event::CommandFailed { qp, failure, .. } => self.log.failed.push((qp, failure)),
            // Logged by an application; the command is answered already.
            Event::Terminated { .. } | Event::RefusedBeforeConnect { .. } => {}
            // The suite accepts no TLS connections.
            Event::Tls { qp, .. } => panic!("TLS event for plain QP {qp:?}"),
        }
    }

    pub fn disconnect(&mut self, qp: QpHandle) {
        let user = self.user();
        match self.io.qp_disconnect(qp, user) {
            Ok(()) => self.log.submitted.push((TaskKind::QpDisconnect, user)),
            Err(TaskError::QpClosing) => {}
            Err(e) => panic!("qp_disconnect: {e}"),
        }
    }

    pub fn answer(&mut self, qp: QpHandle, token: CmdToken, cqe: &Cqe, data_len: u32) {
        let user = self.user();
        let (kind, r) = if data_len > 0 {
            (
                TaskKind::RdmaWriteSend,
                self.io.rdma_write_send(qp, token, cqe, data_len, user),
            )
        } else {
            (TaskKind::RdmaSend, self.io.rdma_send(qp, token, cqe, user))
        };
        match r {
            Ok(()) => {}
            Err(TaskError::QpClosing | TaskError::NoQp | TaskError::NoCommand) if self.lenient => {
                return
            }
            Err(e) => panic!("{kind:?}: {e}"),
        }
        self.log.submitted.push((kind, user));
    }

    /// What a daemon does with a non-offloaded command (its data in the payload).
    pub fn execute(&mut self, qp: QpHandle, token: CmdToken, sqe: &Sqe) {
        let now = Instant::now();
        let payload = match self.io.payload(token) {
            Ok(p) => p,
            Err(_) if self.lenient => return,
            Err(e) => panic!("payload: {e}"),
        };
        if sqe.is_fabrics() && sqe.fctype() == opcodes::fabrics::CONNECT {
            let (cqe, ok) =
                self.target
                    .connect(now, qp.as_u64(), &QueueOrigin::default(), sqe, payload);
            if let Some(ok) = ok {
                if let Some(a) = self.apps.get_mut(&qp) {
                    a.queue = Some(ok.queue());
                }
                if ok.qid > 0 {
                    // Who the queue's commands come from, before its data path is bound.
                    self.io.qp_set_access(qp, ok.access).expect("qp_set_access");
                    self.io
                        .qp_add_subsystem(qp, self.subsys)
                        .expect("qp_add_subsystem");
                }
                self.io
                    .qp_connect_set_params(qp, ok.qid, ok.sqsize, ok.disable_sq_flow_control)
                    .expect("qp_connect_set_params");
            }
            self.answer(qp, token, &cqe, 0);
            let actions = self.target.take_actions();
            self.apply(actions);
            return;
        }
        let Some(queue) = self.apps.get(&qp).and_then(|a| a.queue) else {
            let cqe = Cqe::new(sqe.cid(), Status::COMMAND_SEQUENCE_ERROR);
            return self.answer(qp, token, &cqe, 0);
        };
        match self.target.execute(now, queue, sqe, payload, &NoCounters) {
            Outcome::Complete { cqe, data_len } => self.answer(qp, token, &cqe, data_len),
            Outcome::Deferred => {
                self.held.insert((queue.cntlid, sqe.cid()), (qp, token));
            }
            Outcome::Dropped => {}
        }
        let actions = self.target.take_actions();
        self.apply(actions);
    }

    /// Rule 1: every task whose call succeeded completed exactly once, and nothing else
    /// completed.
    pub fn check_task_accounting(&mut self) {
        self.run_until("every submitted task to complete", |w| {
            w.log.task_done.len() >= w.log.submitted.len()
        });
        let mut seen = HashSet::new();
        for (kind, _, user, _) in &self.log.task_done {
            assert!(seen.insert(*user), "task {user} ({kind:?}) completed twice");
            assert!(
                self.log.submitted.contains(&(*kind, *user)),
                "{kind:?} {user} completed but was never submitted"
            );
        }
        assert_eq!(
            seen.len(),
            self.log.submitted.len(),
            "tasks left without a completion"
        );
    }

    pub fn qp(&self, i: usize) -> QpHandle {
        self.hosts[i].0
    }
}

struct Parts<F: Fabric> {
    engine: F::Engine,
    io: Io<F>,
    target: Target,
    subsys: SubsysId,
    backend: Arc<dyn Backend>,
}

impl<F: Fabric> Parts<F> {
    fn finish(self, fabric: F) -> World<F> {
        World {
            fabric,
            engine: self.engine,
            io: self.io,
            target: self.target,
            subsys: self.subsys,
            backend: self.backend,
            hosts: Vec::new(),
            log: Log::default(),
            apps: HashMap::new(),
            waiting: HashMap::new(),
            held: HashMap::new(),
            next_user: 0,
            auto_answer: true,
            pending: Vec::new(),
            lenient: false,
        }
    }
}

// ---------------------------------------------------------------- command builders

pub fn rw(opcode: u8, nsid: u32, slba: u64, nlb: u32) -> Sqe {
    let mut s = Sqe::default();
    s.set_opcode_cid(opcode, 0);
    s.nsid = nsid;
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

fn identify_controller() -> Sqe {
    let mut s = Sqe::default();
    s.set_opcode_cid(admin::IDENTIFY, 0);
    s.cdw10 = 1;
    s
}

// ---------------------------------------------------------------------- scenarios

/// Limits an application can size a target by.
pub fn caps_are_usable<F: Fabric>(mut fabric: F) {
    let e = fabric.engine(Duration::from_secs(30));
    let c = e.caps();
    assert!(
        c.max_io_size.is_power_of_two() && c.max_io_size >= 4096,
        "{c:?}"
    );
    assert!(c.max_queue_depth >= 2, "{c:?}");
    assert!(c.tcp || c.rdma, "an engine serves some transport: {c:?}");
    assert!(!e.name().is_empty());
}

/// The main context's synchronous calls and their errors; `ns_remove` completes through
/// `progress` once the IO contexts have let go.
pub fn control_plane<F: Fabric>(mut fabric: F) {
    let mut e = fabric.engine(Duration::from_secs(30));
    let a = e
        .subsystem_create("nqn.2026-11.dev.test:a")
        .expect("create");
    let a2 = match e.subsystem_create("nqn.2026-11.dev.test:a") {
        Ok(a2) => {
            assert_ne!(a, a2, "each create makes a new subsystem");
            Some(a2)
        }
        Err(EngineError::NqnInUse(n)) if fabric.unique_nqns() => {
            assert_eq!(n, "nqn.2026-11.dev.test:a");
            None
        }
        Err(e) => panic!("create again: {e}"),
    };
    let be = fabric.backend();
    assert!(matches!(
        e.ns_add(SubsysId(9999), 1, be.clone()),
        Err(EngineError::NoSubsystem)
    ));
    e.ns_add(a, 1, be.clone()).expect("ns_add");
    assert!(matches!(
        e.ns_add(a, 1, be.clone()),
        Err(EngineError::NsExists(1))
    ));
    assert!(matches!(
        e.subsystem_destroy(a),
        Err(EngineError::SubsystemInUse)
    ));
    assert!(matches!(
        e.ns_remove(a, 7, 1),
        Err(EngineError::NoNamespace(7))
    ));
    let mut io = e.io_create().expect("io_create").start().expect("start");
    e.ns_remove(a, 1, 42).expect("ns_remove");
    assert_eq!(e.pending_tasks(), 1);
    let end = Instant::now() + DEADLINE;
    let done = loop {
        io.progress(Duration::ZERO);
        if let Some(ev) = e.progress() {
            break ev;
        }
        assert!(Instant::now() < end, "ns_remove did not complete");
    };
    assert!(
        matches!(done, MainEvent::NsRemoved { subsys, nsid: 1, user: 42 } if subsys == a),
        "{done:?}"
    );
    assert_eq!(e.pending_tasks(), 0);
    e.subsystem_destroy(a)
        .expect("destroy once its namespace is gone");
    assert!(matches!(
        e.subsystem_destroy(a),
        Err(EngineError::NoSubsystem)
    ));
    if let Some(a2) = a2 {
        e.subsystem_destroy(a2).expect("destroy the other");
    } else {
        // Once the first is gone the NQN is free again.
        let a3 = e
            .subsystem_create("nqn.2026-11.dev.test:a")
            .expect("create once the first is gone");
        e.subsystem_destroy(a3).expect("destroy it");
    }
}

/// Connect, enable, Identify: the admin path through the non-offload callback and the
/// two response tasks; every task completes once.
pub fn admin_path<F: Fabric>(fabric: F) {
    let mut w = World::new(fabric);
    let (a, _) = w.admin();
    let (cqe, data) = w.exec(a, identify_controller(), Dir::FromController(4096));
    assert!(cqe.status().is_success(), "Identify: {}", cqe.status());
    // SUBNQN, bytes 768..1024 of Identify Controller (NVMe Base 2.0, Figure 275).
    assert!(
        data[768..].starts_with(NQN.as_bytes()),
        "SUBNQN in Identify"
    );
    // Connect's data is a host-to-controller payload: it reached the application either
    // in the capsule or fetched by rdma_read, and the payload held it.
    let connect = w
        .log
        .non_offloaded
        .iter()
        .find(|n| n.2.is_fabrics() && n.2.fctype() == opcodes::fabrics::CONNECT)
        .expect("Connect handed up");
    assert_eq!(connect.3, 1024, "Connect data payload length");
    w.check_task_accounting();
}

/// READ and WRITE on an I/O queue bound to the subsystem are served by the engine (never
/// handed up), move the right bytes, and are counted.
pub fn io_is_offloaded<F: Fabric>(fabric: F) {
    let mut w = World::new(fabric);
    let (_, q) = w.controller();
    let before = w.log.non_offloaded.len();
    let data = pattern(3, 64 * 1024);
    let (cqe, _) = w.exec(q, rw(io::WRITE, 1, 8, 128), Dir::ToController(data.clone()));
    assert!(cqe.status().is_success(), "write: {}", cqe.status());
    let small = pattern(4, 4096);
    let (cqe, _) = w.exec(
        q,
        rw(io::WRITE, 1, 300, 8),
        Dir::ToController(small.clone()),
    );
    assert!(
        cqe.status().is_success(),
        "in-capsule write: {}",
        cqe.status()
    );
    let (cqe, back) = w.exec(q, rw(io::READ, 1, 8, 128), Dir::FromController(64 * 1024));
    assert!(cqe.status().is_success(), "read: {}", cqe.status());
    assert!(back == data, "read returned other bytes than were written");
    let (_, back) = w.exec(q, rw(io::READ, 1, 300, 8), Dir::FromController(4096));
    assert!(back == small);
    assert_eq!(
        w.log.non_offloaded.len(),
        before,
        "offloaded I/O must not reach the application"
    );
    let t = w.engine.stats().namespace(w.subsys, 1);
    assert_eq!((t.write_cmds, t.read_cmds), (2, 2), "{t:?}");
    assert_eq!(
        (t.write_bytes, t.read_bytes),
        (68 * 1024, 68 * 1024),
        "{t:?}"
    );
    if w.fabric.counts_latency() {
        assert_eq!(t.read_latency.count(), 2);
    }
    let threads = w.engine.stats().threads();
    assert_eq!(threads.len(), 1);
    assert!(threads[0].offloaded >= 4, "{threads:?}");
    assert!(
        threads[0].non_offloaded >= 3,
        "Connects and Property Set: {threads:?}"
    );
    w.check_task_accounting();
}

/// An offloaded command the engine fails is reported to the application, with what its
/// controller's Error Information log needs: the command, its first block, the status,
/// and that the storage did not cause it. Successful ones are not.
pub fn failures_are_reported<F: Fabric>(fabric: F) {
    let mut w = World::new(fabric);
    let (_, q) = w.controller();
    let (cqe, _) = w.exec(q, rw(io::READ, 1, 0, 8), Dir::FromController(4096));
    assert!(cqe.status().is_success(), "read: {}", cqe.status());
    assert_eq!(w.log.failed, vec![], "a successful read is no failure");
    // Twice the blocks the data SGL has room for: refused by every engine's own checks.
    let sqe = rw(io::READ, 1, 40, 16);
    let (cqe, _) = w.exec(q, sqe, Dir::FromController(4096));
    assert!(
        !cqe.status().is_success(),
        "a read larger than its SGL succeeded"
    );
    let qp = w.qp(q);
    w.run_until("the failure's report", |w| !w.log.failed.is_empty());
    let (at, f) = w.log.failed[0];
    assert_eq!(at, qp);
    assert_eq!(
        (
            f.opcode,
            f.error.cid,
            f.error.nsid,
            f.error.lba,
            f.error.status,
            f.from_backend
        ),
        (io::READ, cqe.cid, 1, Some(40), cqe.status(), false),
        "{f:?}"
    );
    assert_eq!(w.log.failed.len(), 1, "{:?}", w.log.failed);
    w.check_task_accounting();
}

/// A namespace whose backend grew: once the engine has the new size ([`Engine::ns_resize`]),
/// blocks past the old end are written and read back on a QP connected before the
/// change; before it, the engine refuses them (LBA Out of Range) although the backend
/// already holds them. An engine that cannot follow a resize (DOCA: the drive bounds the
/// I/O) says so (`Unsupported`, with what to do).
pub fn ns_resize<F: Fabric>(fabric: F) {
    let mut w = World::new(fabric);
    let (_, q) = w.controller();
    let old = w.backend.num_blocks();
    let grown = w
        .backend
        .grow(Some(2 * old * u64::from(BLOCK)))
        .expect("the backend grows");
    assert_eq!(grown, 2 * old);
    let subsys = w.subsys;
    if !w.fabric.bounds_by_size() {
        match w.engine.ns_resize(subsys, 1, grown) {
            Err(EngineError::Unsupported(why)) => assert!(why.contains("restart"), "{why}"),
            r => panic!("ns_resize on an engine that cannot follow it: {r:?}"),
        }
        return;
    }
    let past = old + 8;
    let data = pattern(4, 4096);
    let (cqe, _) = w.exec(
        q,
        rw(io::WRITE, 1, past, 8),
        Dir::ToController(data.clone()),
    );
    assert_eq!(cqe.status(), Status::LBA_OUT_OF_RANGE, "before ns_resize");
    w.engine.ns_resize(subsys, 1, grown).expect("ns_resize");
    assert!(matches!(
        w.engine.ns_resize(subsys, 2, grown),
        Err(EngineError::NoNamespace(2))
    ));
    w.target
        .resize_namespace(NQN, 1, grown)
        .expect("target resize");
    let (cqe, _) = w.exec(
        q,
        rw(io::WRITE, 1, past, 8),
        Dir::ToController(data.clone()),
    );
    assert!(
        cqe.status().is_success(),
        "write past the old end: {}",
        cqe.status()
    );
    let (cqe, got) = w.exec(q, rw(io::READ, 1, past, 8), Dir::FromController(4096));
    assert!(cqe.status().is_success(), "read: {}", cqe.status());
    assert_eq!(got, data);
    let (cqe, _) = w.exec(q, rw(io::READ, 1, grown - 4, 8), Dir::FromController(4096));
    assert_eq!(cqe.status(), Status::LBA_OUT_OF_RANGE, "past the new end");
    w.check_task_accounting();
}

/// A non-offloaded command whose data is not in the capsule: handed up with a zeroed
/// payload (rule 5), fetched with `rdma_read` (no payload access meanwhile, rule 2), then
/// answered. Authentication Send (its transfer is a DH-HMAC-CHAP message) is such a
/// command; I/O to a namespace the subsystem does not have is refused without its data,
/// which is never fetched.
pub fn host_data_by_rdma_read<F: Fabric>(fabric: F) {
    let mut w = World::new(fabric);
    let (_, q) = w.controller();
    let data = pattern(9, 16 * 1024);
    let (cqe, _) = w.exec(q, rw(io::WRITE, 2, 0, 32), Dir::ToController(data.clone()));
    assert_eq!(
        cqe.status().sc,
        Status::INVALID_NAMESPACE.sc,
        "{}",
        cqe.status()
    );
    assert!(
        w.log.payload_without_data.is_empty(),
        "data nobody reads is not fetched"
    );
    assert!(
        !w.log
            .submitted
            .iter()
            .any(|(k, _)| *k == TaskKind::RdmaRead),
        "no rdma_read for it"
    );
    let send = nvmf::auth::msg::AuthCommand::dhchap(data.len() as u32).to_sqe(0, true);
    let (cqe, _) = w.exec(q, send, Dir::ToController(data.clone()));
    assert!(!cqe.status().is_success(), "no DH-HMAC-CHAP secret here");
    assert_eq!(w.log.payload_without_data.len(), 1);
    assert!(
        w.log.payload_without_data[0].iter().all(|&b| b == 0),
        "payload not zeroed"
    );
    assert_eq!(w.log.payload_without_data[0].len(), data.len());
    assert!(
        w.log.payload_during_read[0].is_err(),
        "payload lent while rdma_read runs"
    );
    assert!(
        w.log.payload_after_read[0] == data,
        "rdma_read fetched other bytes"
    );
    w.check_task_accounting();
}

/// Calls with stale handles fail, start nothing, and report nothing.
pub fn stale_handles_are_errors<F: Fabric>(fabric: F) {
    let mut w = World::new(fabric);
    let (a, _) = w.admin();
    w.auto_answer = false;
    let cid = w.submit(a, identify_controller(), Dir::FromController(4096));
    w.run_until("Identify handed up", |w| !w.pending.is_empty());
    let (qp, token, sqe) = w.pending.pop().expect("pending");
    assert_eq!(sqe.cid(), cid);
    assert!(w
        .io
        .payload(token)
        .expect("payload")
        .iter()
        .all(|&b| b == 0));
    let cqe = Cqe::new(cid, Status::INVALID_FIELD);
    w.answer(qp, token, &cqe, 0);
    // The command is answered: its token is dead for every call.
    assert!(w.io.payload(token).is_err());
    assert!(w.io.rdma_send(qp, token, &cqe, 999).is_err());
    assert!(w.io.rdma_write_send(qp, token, &cqe, 16, 999).is_err());
    assert!(w.io.rdma_read(qp, token, 999).is_err());
    let (got, _) = w.wait(a, cid);
    assert_eq!(got.status().sc, Status::INVALID_FIELD.sc);
    // A QP that is gone.
    w.auto_answer = true;
    let qp = w.qp(a);
    w.disconnect(qp);
    w.run_until("disconnect", |w| {
        w.log
            .task_done
            .iter()
            .any(|t| t.0 == TaskKind::QpDisconnect && t.1 == qp)
    });
    assert_eq!(w.io.qp_disconnect(qp, 999), Err(TaskError::NoQp));
    assert_eq!(w.io.qp_add_subsystem(qp, w.subsys), Err(TaskError::NoQp));
    assert_eq!(
        w.io.qp_set_access(qp, Default::default()),
        Err(TaskError::NoQp)
    );
    assert!(!w.io.cmd_abort(qp, 0), "abort on a dead QP");
    assert_eq!(w.io.qp_set_user_data(qp, 1), Err(TaskError::NoQp));
    assert!(w.io.rdma_send(qp, token, &cqe, 999).is_err());
    w.run_for(Duration::from_millis(50));
    assert!(
        !w.log.task_done.iter().any(|t| t.2 == 999),
        "a refused task reported a completion"
    );
    w.check_task_accounting();
}

/// `qp_disconnect` completes once, closes the connection, and the QP is gone; the QP's
/// user data comes back in its events.
pub fn disconnect_and_user_data<F: Fabric>(fabric: F) {
    let mut w = World::new(fabric);
    let (a, _) = w.admin();
    let qp = w.qp(a);
    w.io.qp_set_user_data(qp, 0xfeed).expect("set user data");
    w.exec(a, identify_controller(), Dir::FromController(4096));
    assert_eq!(w.log.non_offloaded.last().expect("identify").1, 0xfeed);
    let n = w.io.qp_count();
    w.disconnect(qp);
    assert_eq!(w.io.qp_disconnect(qp, 1000), Err(TaskError::QpClosing));
    w.run_until("the host to see the connection go", |w| w.hosts[a].1.gone());
    w.run_until("qp_disconnect to complete", |w| w.io.qp_count() == n - 1);
    w.check_task_accounting();
    let done = w
        .log
        .task_done
        .iter()
        .filter(|t| t.0 == TaskKind::QpDisconnect && t.1 == qp)
        .count();
    assert_eq!(done, 1);
}

/// The host going away is a transport error on its QP.
pub fn host_close_is_a_transport_error<F: Fabric>(fabric: F) {
    let mut w = World::new(fabric);
    let (_, q) = w.controller();
    let qp = w.qp(q);
    w.hosts[q].1.close();
    w.run_until("transport error", |w| {
        w.log.transport_errors.iter().any(|e| e.0 == qp)
    });
    w.check_task_accounting();
    assert!(w
        .log
        .transport_errors
        .iter()
        .all(|e| e.1 == TransportErrorKind::PeerClosed || e.1 == TransportErrorKind::Io));
}

/// `ns_remove` lets in-flight I/O finish before it completes; afterwards the namespace's
/// I/O reaches the application.
pub fn ns_remove_waits_for_inflight_io<F: Fabric>(fabric: F) {
    let mut w = World::new(fabric);
    let (_, q) = w.controller();
    w.fabric.stall(&mut w.engine, true);
    let cid = w.submit(q, rw(io::READ, 1, 0, 8), Dir::FromController(4096));
    w.run_for(Duration::from_millis(100));
    w.engine.ns_remove(w.subsys, 1, 5).expect("ns_remove");
    w.run_for(Duration::from_millis(200));
    assert!(
        !w.log
            .main_events
            .iter()
            .any(|e| matches!(e, MainEvent::NsRemoved { .. })),
        "ns_remove completed while a read was in the backend"
    );
    w.fabric.stall(&mut w.engine, false);
    let (cqe, _) = w.wait(q, cid);
    assert!(
        cqe.status().is_success(),
        "in-flight read: {}",
        cqe.status()
    );
    w.wait_ns1_removed(5);
    let handed = w.log.non_offloaded.len();
    w.target.remove_namespace(NQN, 1).expect("target removal");
    let (cqe, _) = w.exec(q, rw(io::READ, 1, 0, 8), Dir::FromController(4096));
    assert_eq!(
        cqe.status().sc,
        Status::INVALID_NAMESPACE.sc,
        "{}",
        cqe.status()
    );
    assert_eq!(
        w.log.non_offloaded.len(),
        handed + 1,
        "handed up after removal"
    );
    w.check_task_accounting();
}

/// A hung backend: the backend timeout is reported on the main context, and
/// `be_queue_destroy` answers what is outstanding at once.
pub fn hung_backend<F: Fabric>(fabric: F) {
    let mut w = World::with_backend_timeout(fabric, Duration::from_millis(300));
    let (_, q) = w.controller();
    w.fabric.stall(&mut w.engine, true);
    let cid = w.submit(q, rw(io::READ, 1, 0, 8), Dir::FromController(4096));
    w.run_until("backend timeout", |w| {
        w.log.main_events.iter().any(
            |e| matches!(e, MainEvent::BackendTimeout { nsid: 1, commands: 1, limit, .. } if *limit == Duration::from_millis(300)),
        )
    });
    w.engine
        .be_queue_destroy(w.subsys, 1, 8)
        .expect("be_queue_destroy");
    let (cqe, _) = w.wait(q, cid);
    assert_eq!(
        cqe.status().sc,
        Status::ABORTED_SQ_DELETION.sc,
        "{}",
        cqe.status()
    );
    w.run_until("BeQueueDestroyed", |w| {
        w.log.main_events.iter().any(|e| {
            matches!(
                e,
                MainEvent::BeQueueDestroyed {
                    nsid: 1,
                    user: 8,
                    ..
                }
            )
        })
    });
    w.fabric.stall(&mut w.engine, false);
    w.check_task_accounting();
}

/// The interop failure of issue docafix: namespace removed while I/O to it runs on two
/// I/O queues, commands handed up and answered (or still with the application), reads of
/// host data in flight, then the host closes both I/O queues with answers in flight and
/// the application answering commands of QPs being torn down. Repeated, each round with a
/// fresh engine. What must hold: no panic, no broken rule, every task that started
/// completes once, every QP goes, the namespace removal completes.
// Run for the doca engine only (doca_scenarios), so only built with it.
#[cfg(feature = "doca")]
pub fn ns_removed_under_io_then_host_close<F: Fabric>(mut fabric: F, rounds: usize) {
    for round in 0..rounds {
        let mut w = World::new(fabric);
        w.lenient = true;
        let (_a, cntlid) = w.admin();
        let mut ioq = Vec::new();
        for qid in 1..=2u16 {
            let q = w.open();
            let cqe = w.connect(q, cntlid, qid, 31);
            assert!(cqe.status().is_success(), "I/O Connect: {}", cqe.status());
            w.hosts[q].1.set_depth(32);
            ioq.push(q);
        }
        let n_before = w.io.qp_count();
        let submit_burst = |w: &mut World<F>, seed: u64| {
            for (k, &q) in ioq.iter().enumerate() {
                for j in 0..6u64 {
                    let lba = (seed * 64 + j * 8 + k as u64 * 4096) % (BLOCKS - 64);
                    match j % 3 {
                        // In-capsule write (4 KiB), a write whose data must be fetched
                        // (16 KiB: beyond the in-capsule size) and a read.
                        0 => w.submit(
                            q,
                            rw(io::WRITE, 1, lba, 8),
                            Dir::ToController(pattern(seed + j, 4096)),
                        ),
                        1 => w.submit(
                            q,
                            rw(io::WRITE, 1, lba, 32),
                            Dir::ToController(pattern(seed + j, 16384)),
                        ),
                        _ => w.submit(q, rw(io::READ, 1, lba, 8), Dir::FromController(4096)),
                    };
                }
            }
        };
        submit_burst(&mut w, 1);
        // Removed while that I/O is in the backend or fetching host data.
        w.engine.ns_remove(w.subsys, 1, 77).expect("ns_remove");
        w.target.remove_namespace(NQN, 1).expect("target removal");
        submit_burst(&mut w, 2);
        for _ in 0..(round % 5) {
            w.pass();
        }
        // Some commands stay with the application when the host goes.
        w.auto_answer = false;
        submit_burst(&mut w, 3);
        for _ in 0..(round % 3) + 1 {
            w.pass();
        }
        for &q in &ioq {
            w.hosts[q].1.close();
        }
        // Answer what the application holds while the QPs are being torn down, as a
        // daemon does (refusals are expected).
        for _ in 0..3 {
            w.pass();
            let pending = std::mem::take(&mut w.pending);
            for (qp, token, sqe) in pending {
                let cqe = Cqe::new(sqe.cid(), Status::INVALID_NAMESPACE);
                w.answer(qp, token, &cqe, 0);
            }
        }
        w.auto_answer = true;
        w.run_until("both I/O QPs destroyed", |w| {
            w.io.qp_count() == n_before - 2
        });
        w.wait_ns1_removed(77);
        w.check_task_accounting();
        assert!(
            w.log.non_offloaded.len() > 10 && w.log.transport_errors.len() == 2,
            "round {round}: the I/O after the removal was handed up ({}) and both queues \
             were lost ({:?})",
            w.log.non_offloaded.len(),
            w.log.transport_errors
        );
        fabric = w.into_fabric();
    }
}

/// A QP the application disconnects before the CM's ESTABLISHED for it was handled (the
/// host's first capsule can arrive before ESTABLISHED, and a bad one makes the daemon
/// disconnect at once): the late ESTABLISHED must not reach the library for a QP that is
/// being torn down, and the disconnect completes.
// Run for the doca engine only (doca_scenarios), so only built with it.
#[cfg(feature = "doca")]
pub fn established_after_disconnect<F: Fabric>(mut fabric: F) {
    let mut w = World::new(fabric);
    let user = w.user();
    let (qp, host) = w.fabric.connect(&mut w.io, user);
    w.apps.insert(qp, QpApp::default());
    w.hosts.push((qp, host));
    let n = w.io.qp_count();
    w.disconnect(qp);
    // ESTABLISHED reaches the IO thread after the disconnect was submitted and before the
    // engine progressed (a daemon handles its messages before each engine pass).
    let ev = w.hosts[0].1.cm_event();
    if let Some(ev) = ev {
        let r = w.io.qp_rdma_cm_event(qp, ev);
        assert!(
            matches!(r, Ok(()) | Err(TaskError::QpClosing)),
            "late {ev:?}: {r:?}"
        );
    }
    w.run_until("qp_disconnect to complete", |w| w.io.qp_count() == n - 1);
    w.check_task_accounting();
    fabric = w.into_fabric();
    drop(fabric);
}

impl<F: Fabric> World<F> {
    /// Tear this world down (engine, IO context, hosts) and give the fabric back.
    #[cfg(feature = "doca")]
    pub fn into_fabric(self) -> F {
        let World {
            fabric,
            engine,
            io,
            hosts,
            ..
        } = self;
        // The order a World's fields drop in.
        drop(engine);
        drop(io);
        drop(hosts);
        fabric
    }
}
