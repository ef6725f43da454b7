//! `engine`: a hostile byte stream into the soft engine's IO context over a real loopback
//! TCP connection, with a small application around `nvmf::target::Target` answering what
//! the engine hands up (Connect, Property Get/Set, Identify, held AERs...), as the daemon's
//! IO thread does. The point is the engine's accounting, not parsing (`tcp_queue` has
//! that): whatever the peer sends, it loses only its own connection, and once it is gone
//! everything it made the engine hold is released.
//!
//! Input: `[mode, step, at, stream...]`.
//!
//! - `mode & 3`, what the harness sends before the stream: 0 nothing (the stream brings
//!   its own ICReq), 1 an ICReq, 2 an ICReq and an admin Connect (answered), 3 a clean
//!   admin queue on a connection of its own (Connect, CC.EN = 1) and, on the fuzzed
//!   connection, an ICReq and an I/O queue Connect (QID 1) to that controller: the stream
//!   is then an I/O queue's.
//! - `mode & 4`: the client stops reading after the preamble (the engine's output backs
//!   up); `mode & 8`: the client closes after `at / 256` of the stream; `mode & 16`:
//!   it half-closes (shutdown write) first and keeps reading a while; `mode & 32`: more
//!   engine passes between chunks; `mode & 64`: chunk sizes vary with the stream's bytes;
//!   `mode & 128`: the harness follows the stream's PDUs (by PLEN) and writes into each
//!   H2CData's TTAG the one of the latest R2T for its CCCID (the engine's TTAGs are its
//!   command slots, which a stream written ahead cannot know), waiting a few passes for
//!   that R2T.
//! - `at` 0xFF without `mode & 8`: the client lingers, connected, up to 100 ms after the
//!   stream (the engine's deadlines are 30-60 ms here). In mode 3 `at` also sets the
//!   I/O queue's SQSIZE (1 + `at` % 127; 127 for 0xFF).
//! - `step`: chunk size minus one (0: the whole stream at once... unless `mode & 64`).
//!
//! After the stream the client closes, and the harness pumps until the QP is gone
//! (bounded: a QP that never goes away is a finding). Then it checks the IO context is
//! idle again: no QP, no command slot in use, no backend request in flight, the thread's
//! QP gauge at 0, the Target without controllers. In mode 3 the clean admin queue must
//! still answer (another queue's peer misbehaving must not cost it its service) before it
//! closes too. Every 64th input (and the first) a clean host connects an admin and an I/O
//! queue, writes a block pattern in-capsule and reads it back: the data path still works.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use nvmf::spec::fabrics::{self, ConnectCommand, ConnectData, PropertyCommand};
use nvmf::spec::opcodes::{self, admin, io as io_op};
use nvmf::spec::{sgl, Cqe, DataDirection, SglDescriptor, Sqe, Status};
use nvmf::target::{
    NamespaceConfig, NoCounters, Outcome, QueueOrigin, SubsystemConfig, Target, TargetOptions,
};
use nvmf::tcp::{self, Digests, IcReq};
use sta::soft::{SoftConfig, Sta, StaIo};
use sta::{CmdToken, Engine, Event, IoContext, Limit, QpHandle, SubsysId, TaskError};
use zerocopy::IntoBytes;

use crate::Input;

const NQN: &str = "nqn.2026-11.dev.nvmf-target:fuzz-engine";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-1111-2222-3333-444444444444";
const BLOCK: u32 = 512;
const NS_BYTES: u64 = 1 << 20;
/// Longest the harness waits for a QP to go away, or for a clean host's answer.
const DEADLINE: Duration = Duration::from_secs(2);
/// Longest one input may spend writing its stream (a peer the engine stops reading from
/// while the client does not read either).
const STREAM_BUDGET: Duration = Duration::from_millis(200);
/// Longest an input lingers connected after its stream (`at` 0xFF without `mode & 8`):
/// past every deadline of the engine's limits set in [`World::new`].
const LINGER: Duration = Duration::from_millis(100);
/// Bytes the client keeps of what it read (it only parses the preamble's answers).
const RX_KEEP: usize = 1 << 20;

/// The application's queue closing and target actions, shared with the contract suite.
#[path = "../../sta/tests/contract/glue.rs"]
mod glue;
use glue::{Glue, Held, QpApp as App};

impl Glue for World {
    fn target(&mut self) -> &mut Target {
        &mut self.target
    }
    fn apps(&mut self) -> &mut HashMap<QpHandle, App> {
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

/// The engine, its application and the listener, kept for the whole process.
struct World {
    engine: Sta,
    io: StaIo,
    target: Target,
    subsys: SubsysId,
    listener: TcpListener,
    apps: HashMap<QpHandle, App>,
    /// `rdma_read`s under way: user -> (qp, token, sqe).
    reads: HashMap<u64, (QpHandle, CmdToken, Sqe)>,
    /// Held completions (AERs): (cntlid, cid) -> (qp, token).
    held: Held,
    user: u64,
    inputs: u64,
}

thread_local! {
    static WORLD: RefCell<Option<World>> = const { RefCell::new(None) };
}

/// One connection's host end: raw bytes out, raw bytes in.
struct Client {
    qp: QpHandle,
    sock: TcpStream,
    rx: Vec<u8>,
    /// The target closed (EOF or an error reading or writing).
    gone: bool,
    write_closed: bool,
}

impl Client {
    /// Reads what is there (keeps at most [`RX_KEEP`] bytes when `keep`).
    fn drain(&mut self, keep: bool) -> bool {
        let mut did = false;
        let mut buf = [0u8; 65536];
        while !self.gone {
            match self.sock.read(&mut buf) {
                Ok(0) => self.gone = true,
                Ok(n) => {
                    did = true;
                    if keep && self.rx.len() + n <= RX_KEEP {
                        self.rx.extend_from_slice(&buf[..n]);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => self.gone = true,
            }
        }
        did
    }

    /// Writes some of `b`; how much (0 when the socket is full or gone).
    fn write_some(&mut self, b: &[u8]) -> usize {
        if self.gone || self.write_closed {
            return 0;
        }
        match self.sock.write(b) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => 0,
            Err(_) => {
                self.gone = true;
                0
            }
        }
    }

    /// The next complete PDU in `rx`, removed: (type, flags, pdo, bytes).
    fn next_pdu(&mut self) -> Option<Vec<u8>> {
        if self.rx.len() < 8 {
            return None;
        }
        let plen = u32::from_le_bytes([self.rx[4], self.rx[5], self.rx[6], self.rx[7]]) as usize;
        assert!(plen >= 8, "the target sent a PDU of PLEN {plen}");
        if self.rx.len() < plen {
            return None;
        }
        Some(self.rx.drain(..plen).collect())
    }
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// `sqe` with `len` bytes of in-capsule data described by SGL1.
fn in_capsule(mut sqe: Sqe, len: u32) -> Sqe {
    sqe.cdw0 = (sqe.cdw0 & !(3 << 14)) | 1 << 14;
    sqe.dptr = SglDescriptor::unkeyed(sgl::TYPE_DATA_BLOCK, sgl::SUBTYPE_OFFSET, 0, len);
    sqe
}

/// `sqe` whose `len` bytes move by the transport (R2T/H2CData or C2HData).
fn by_transport(mut sqe: Sqe, len: u32) -> Sqe {
    sqe.cdw0 = (sqe.cdw0 & !(3 << 14)) | 1 << 14;
    sqe.dptr = SglDescriptor::unkeyed(
        sgl::TYPE_TRANSPORT_DATA_BLOCK,
        sgl::SUBTYPE_TRANSPORT,
        0,
        len,
    );
    sqe
}

fn capsule(out: &mut Vec<u8>, sqe: &Sqe, data: &[u8]) {
    tcp::encode_capsule_cmd(out, sqe, data, Digests::NONE, 0);
}

fn ic_req(out: &mut Vec<u8>) {
    tcp::encode_ic_req(out, &IcReq::default());
}

/// A Connect capsule: queue `qid` of controller `cntlid` with SQSIZE `sqsize`.
fn connect(out: &mut Vec<u8>, cid: u16, cntlid: u16, qid: u16, sqsize: u16) {
    let cmd = ConnectCommand {
        recfmt: 0,
        qid,
        sqsize,
        cattr: 0,
        kato: 0,
    };
    let data = ConnectData::new([7; 16], cntlid, NQN, HOSTNQN);
    let bytes = data.as_bytes();
    capsule(out, &in_capsule(cmd.to_sqe(cid), bytes.len() as u32), bytes);
}

fn property_set_cc_en(out: &mut Vec<u8>, cid: u16) {
    let p = PropertyCommand {
        attrib: 0,
        offset: fabrics::property::CC,
        value: (fabrics::cc::EN | 6 << 16 | 4 << 20) as u64,
    };
    capsule(out, &p.to_sqe(cid, true), &[]);
}

fn property_get_csts(out: &mut Vec<u8>, cid: u16) {
    let p = PropertyCommand {
        attrib: 0,
        offset: fabrics::property::CSTS,
        value: 0,
    };
    capsule(out, &p.to_sqe(cid, false), &[]);
}

fn identify(out: &mut Vec<u8>, cid: u16, cns: u32, nsid: u32) {
    let mut s = Sqe::default();
    s.set_opcode_cid(admin::IDENTIFY, cid);
    s.nsid = nsid;
    s.cdw10 = cns;
    capsule(out, &by_transport(s, 4096), &[]);
}

fn rw(opcode: u8, cid: u16, slba: u64, nlb: u32) -> Sqe {
    let mut s = Sqe::default();
    s.set_opcode_cid(opcode, cid);
    s.nsid = 1;
    s.cdw10 = slba as u32;
    s.cdw11 = (slba >> 32) as u32;
    s.cdw12 = nlb - 1;
    s
}

impl World {
    fn new() -> World {
        // Deadlines short enough for an input that lingers to run into them (the clean
        // hosts answer within microseconds), long enough for a loaded machine.
        let mut engine = Sta::new(SoftConfig {
            limits: sta::EngineLimits {
                icreq_timeout: Duration::from_millis(60),
                connect_timeout: Duration::from_millis(60),
                host_data_timeout: Duration::from_millis(30),
                drain_timeout: Duration::from_millis(30),
                ..sta::EngineLimits::default()
            },
            // Deadlines are looked at every quarter of this.
            backend_timeout: Duration::from_millis(40),
            ..SoftConfig::default()
        });
        let subsys = engine.subsystem_create(NQN).expect("subsystem_create");
        let ram = backend::RamBackend::new(NS_BYTES, BLOCK).expect("RAM backend");
        let (block_size, num_blocks) = {
            use backend::Backend;
            (ram.block_size(), ram.num_blocks())
        };
        engine.ns_add(subsys, 1, ram).expect("ns_add");
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
                serial: "FUZZENGINE".into(),
                model: "engine fuzz".into(),
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
                    block_size,
                    num_blocks,
                    uuid: [1; 16],
                    nguid: [2; 16],
                    eui64: [3; 8],
                    volatile_write_cache: false,
                    anagrpid: 0,
                    hosts: None,
                },
            )
            .expect("target namespace");
        let listener = TcpListener::bind("127.0.0.1:0").expect("loopback listener");
        World {
            engine,
            io,
            target,
            subsys,
            listener,
            apps: HashMap::new(),
            reads: HashMap::new(),
            held: HashMap::new(),
            user: 0,
            inputs: 0,
        }
    }

    fn next_user(&mut self) -> u64 {
        self.user += 1;
        self.user
    }

    /// A new connection accepted into the IO context, and its client end.
    fn open(&mut self) -> Client {
        let addr = self.listener.local_addr().expect("listener address");
        let sock = TcpStream::connect(addr).expect("connect over loopback");
        sock.set_nonblocking(true).expect("non-blocking");
        sock.set_nodelay(true).expect("nodelay");
        let (srv, _) = self.listener.accept().expect("accept");
        let user = self.next_user();
        let qp = self.io.qp_accept_tcp(srv, user).expect("qp_accept_tcp");
        self.apps.insert(qp, App::default());
        Client {
            qp,
            sock,
            rx: Vec::new(),
            gone: false,
            write_closed: false,
        }
    }

    /// One engine pass, its events answered, main events drained.
    fn pass(&mut self) -> bool {
        let mut did = self.io.progress(Duration::ZERO);
        while let Some(ev) = self.io.poll_event() {
            did = true;
            self.on_event(ev);
        }
        while self.engine.progress().is_some() {
            did = true;
        }
        let actions = self.target.poll_timeouts(Instant::now());
        did |= !actions.is_empty();
        self.apply(actions);
        did
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
                let live = self.apps.get(&qp).is_some_and(|a| !a.closed);
                assert!(live, "a command handed up for QP {qp:?}, closed or unknown");
                let qid = self.apps.get(&qp).and_then(|a| a.queue).map(|q| q.qid);
                let h2c = sqe.data_direction() == DataDirection::HostToController;
                let reads = nvmf::target::slow_path_host_data(&sqe, qid) > 0;
                if h2c && !payload_valid && reads {
                    let user = self.next_user();
                    match self.io.rdma_read(qp, token, user) {
                        Ok(()) => {
                            self.reads.insert(user, (qp, token, sqe));
                        }
                        Err(e) => panic!("rdma_read on a live QP: {e}"),
                    }
                } else {
                    self.execute(qp, token, &sqe);
                }
            }
            Event::TaskDone {
                kind: sta::TaskKind::RdmaRead,
                user,
                result,
                ..
            } => {
                let (qp, token, sqe) = self.reads.remove(&user).expect("a read we submitted");
                if result.is_err() {
                    let cqe = Cqe::new(sqe.cid(), Status::TRANSIENT_TRANSPORT_ERROR);
                    self.answer(qp, token, &cqe, 0);
                } else {
                    self.execute(qp, token, &sqe);
                }
            }
            Event::TaskDone {
                kind: sta::TaskKind::QpDisconnect,
                qp,
                ..
            } => {
                self.close_queue(qp);
                self.apps.remove(&qp);
                self.reads.retain(|_, r| r.0 != qp);
            }
            Event::TaskDone { .. } => {}
            Event::TransportError { qp, .. } => {
                self.close_queue(qp);
                self.disconnect(qp);
            }
            Event::Tls { qp, .. } => panic!("TLS event for plain QP {qp:?}"),
            Event::CommandFailed { .. }
            | Event::Terminated { .. }
            | Event::RefusedBeforeConnect { .. } => {}
        }
    }

    fn disconnect(&mut self, qp: QpHandle) {
        let user = self.next_user();
        match self.io.qp_disconnect(qp, user) {
            Ok(()) | Err(TaskError::QpClosing) | Err(TaskError::NoQp) => {}
            Err(e) => panic!("qp_disconnect: {e}"),
        }
    }

    fn answer(&mut self, qp: QpHandle, token: CmdToken, cqe: &Cqe, data_len: u32) {
        let user = self.next_user();
        let r = if data_len > 0 {
            self.io.rdma_write_send(qp, token, cqe, data_len, user)
        } else {
            self.io.rdma_send(qp, token, cqe, user)
        };
        match r {
            Ok(()) => {}
            // The QP is going away under the answer: what a daemon sees and tolerates.
            Err(TaskError::QpClosing | TaskError::NoQp | TaskError::NoCommand) => {}
            Err(e) => panic!("answering CID {}: {e}", cqe.cid),
        }
    }

    /// What the daemon does with a non-offloaded command (its data, if any, in the payload).
    fn execute(&mut self, qp: QpHandle, token: CmdToken, sqe: &Sqe) {
        let now = Instant::now();
        let Some(app) = self.apps.get(&qp).filter(|a| !a.closed) else {
            // Its QP closed while the data came: nothing to run it for.
            return;
        };
        let queue = app.queue;
        let payload = match self.io.payload(token) {
            Ok(p) => p,
            Err(e) => panic!("payload of a live QP's handed-up command: {e}"),
        };
        if sqe.is_fabrics() && sqe.fctype() == opcodes::fabrics::CONNECT && queue.is_none() {
            let (cqe, ok) =
                self.target
                    .connect(now, qp.as_u64(), &QueueOrigin::default(), sqe, payload);
            if let Some(ok) = ok {
                if let Some(a) = self.apps.get_mut(&qp) {
                    a.queue = Some(ok.queue());
                }
                if ok.qid > 0 {
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
        let Some(queue) = queue else {
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

    /// Passes until `client` has the answer to `cid` (CapsuleResp, or a C2HData with
    /// SUCCESS), collecting C2HData bytes; `None` if the target closed or never answered.
    fn wait_answer(&mut self, client: &mut Client, cid: u16) -> Option<(Status, u32, Vec<u8>)> {
        let end = Instant::now() + DEADLINE;
        let mut data = Vec::new();
        loop {
            self.pass();
            client.drain(true);
            while let Some(pdu) = client.next_pdu() {
                match pdu[0] {
                    tcp::pdu_type::CAPSULE_RESP if u16_at(&pdu, 8 + 12) == cid => {
                        let status = Status::from_field(u16_at(&pdu, 8 + 14));
                        return Some((status, u32_at(&pdu, 8), data));
                    }
                    tcp::pdu_type::C2H_DATA if u16_at(&pdu, 8) == cid => {
                        let pdo = pdu[3] as usize;
                        let len = u32_at(&pdu, 16) as usize;
                        data.extend_from_slice(&pdu[pdo..pdo + len]);
                        if pdu[1] & tcp::flags::SUCCESS != 0 {
                            return Some((Status::SUCCESS, 0, data));
                        }
                    }
                    _ => {}
                }
            }
            if client.gone || Instant::now() > end {
                return None;
            }
        }
    }

    /// Sends `bytes` (small: one write takes them on loopback) and waits for ICResp.
    fn handshake(&mut self, client: &mut Client) {
        let mut b = Vec::new();
        ic_req(&mut b);
        self.send_all(client, &b);
        let end = Instant::now() + DEADLINE;
        loop {
            self.pass();
            client.drain(true);
            if let Some(pdu) = client.next_pdu() {
                assert_eq!(pdu[0], tcp::pdu_type::IC_RESP, "answer to a clean ICReq");
                return;
            }
            assert!(Instant::now() < end, "no ICResp to a clean ICReq");
        }
    }

    fn send_all(&mut self, client: &mut Client, mut b: &[u8]) {
        let end = Instant::now() + DEADLINE;
        while !b.is_empty() {
            let n = client.write_some(b);
            b = &b[n..];
            assert!(!client.gone, "a clean host's connection was closed");
            if n == 0 {
                assert!(Instant::now() < end, "a clean host could not send");
                self.pass();
            }
        }
    }

    /// A clean command on a clean connection; its status, DW0 and data.
    fn exec(&mut self, client: &mut Client, what: &str, cid: u16, pdu: &[u8]) -> (u32, Vec<u8>) {
        self.send_all(client, pdu);
        let Some((status, dw0, data)) = self.wait_answer(client, cid) else {
            panic!("{what}: no answer for a well-behaved host");
        };
        assert!(status.is_success(), "{what}: {status}");
        (dw0, data)
    }

    /// A clean admin queue, connected and enabled: its connection and CNTLID.
    fn clean_admin(&mut self) -> (Client, u16) {
        let mut c = self.open();
        self.handshake(&mut c);
        let mut b = Vec::new();
        connect(&mut b, 1, fabrics::CNTLID_DYNAMIC, 0, 31);
        let (dw0, _) = self.exec(&mut c, "clean admin Connect", 1, &b);
        let mut b = Vec::new();
        property_set_cc_en(&mut b, 2);
        self.exec(&mut c, "clean CC.EN = 1", 2, &b);
        (c, dw0 as u16)
    }

    /// Closes `clients` and runs until their QPs are gone, then checks the context is
    /// idle (but for the QPs of other clients, which hold no command).
    fn close_all(&mut self, clients: &mut [Client]) {
        for c in clients.iter_mut() {
            // A socket the target closed first may refuse the shutdown: nothing to do.
            let _ = c.sock.shutdown(Shutdown::Both);
            c.gone = true;
        }
        let end = Instant::now() + DEADLINE;
        let ours = |w: &World| clients.iter().any(|c| w.apps.contains_key(&c.qp));
        while ours(self) || self.io.qp_count() != self.apps.len() {
            if !self.pass() {
                std::thread::sleep(Duration::from_micros(50));
            }
            assert!(
                Instant::now() < end,
                "QPs never went away after their hosts closed: {} QPs in the IO context, {} \
                 the application knows, {} commands in flight",
                self.io.qp_count(),
                self.apps.len(),
                self.io.commands_in_flight(),
            );
        }
        // Anything the last passes left (a held main event, a timer).
        for _ in 0..4 {
            self.pass();
        }
        self.check_idle();
    }

    fn check_idle(&mut self) {
        let others = self.apps.len();
        assert_eq!(self.io.qp_count(), others, "QPs left");
        assert_eq!(
            self.io.commands_in_flight(),
            0,
            "command slots still in use with no command outstanding"
        );
        if others == 0 {
            assert_eq!(self.io.rx_buffer_bytes(), 0, "receive buffers held");
        }
        assert!(self.reads.is_empty(), "reads left: {:?}", self.reads.len());
        assert!(self.held.is_empty(), "held completions left");
        let stats = self.engine.stats();
        let t = stats.threads();
        assert_eq!(t[0].qps, others as u64, "the thread's QP gauge");
        // Out of reach for a few connections of at most 4096 entries and 16 MiB each
        // (16383 slots per peer address, 64 Ki slots and 256 MiB of buffers per IO
        // context): hit only if slots or buffers leak across inputs.
        for l in [
            Limit::CommandSlots,
            Limit::PeerCommandSlots,
            Limit::BufferPool,
        ] {
            let hits = t[0].limit_hits[l.index()];
            assert_eq!(hits, 0, "limit {} hit {hits} times", l.label());
        }
        let ns = stats.namespace(self.subsys, 1);
        assert_eq!(ns.queue_depth, 0, "backend requests in flight");
        assert_eq!(self.engine.pending_tasks(), 0, "main-context tasks");
        let report = self.target.report();
        // What is left is the clean admin queue's controller, without I/O queues.
        assert!(
            report.controllers.len() <= others
                && report.controllers.iter().all(|c| c.io_queues.is_empty()),
            "controllers left in the Target: {:?}",
            report.controllers
        );
    }

    /// A clean controller with one I/O queue writes a pattern and reads it back.
    fn clean_data_path(&mut self) {
        let (admin_c, cntlid) = self.clean_admin();
        let mut ioq = self.open();
        self.handshake(&mut ioq);
        let mut b = Vec::new();
        connect(&mut b, 1, cntlid, 1, 31);
        self.exec(&mut ioq, "clean I/O Connect", 1, &b);
        let slba = (self.inputs * 8) % (NS_BYTES / BLOCK as u64 - 8);
        let pattern: Vec<u8> = (0..4096u32)
            .map(|i| (i as u64 ^ self.inputs.wrapping_mul(0x9e37)) as u8)
            .collect();
        let mut b = Vec::new();
        capsule(
            &mut b,
            &in_capsule(rw(io_op::WRITE, 2, slba, 8), 4096),
            &pattern,
        );
        self.exec(&mut ioq, "clean Write", 2, &b);
        let mut b = Vec::new();
        capsule(
            &mut b,
            &by_transport(rw(io_op::READ, 3, slba, 8), 4096),
            &[],
        );
        let (_, data) = self.exec(&mut ioq, "clean Read", 3, &b);
        assert!(data == pattern, "a clean host read back other data");
        self.close_all(&mut [admin_c, ioq]);
    }

    fn run(&mut self, data: &[u8]) {
        self.inputs += 1;
        if self.inputs % 64 == 1 {
            self.clean_data_path();
        }
        let mut inp = Input::new(data);
        let mode = inp.u8();
        let step = inp.u8();
        let at = inp.u8();
        let stream = inp.rest();

        let mut clients = Vec::new();
        let mut admin = None;
        let mut c = self.open();
        match mode & 3 {
            0 => {}
            1 => self.handshake(&mut c),
            2 => {
                self.handshake(&mut c);
                let mut b = Vec::new();
                connect(&mut b, 0xfff0, fabrics::CNTLID_DYNAMIC, 0, 31);
                self.exec(&mut c, "admin Connect", 0xfff0, &b);
            }
            _ => {
                let (a, cntlid) = self.clean_admin();
                admin = Some(a);
                self.handshake(&mut c);
                let mut b = Vec::new();
                let sqsize = if at == 0xff {
                    127
                } else {
                    1 + u16::from(at) % 127
                };
                connect(&mut b, 0xfff0, cntlid, 1, sqsize);
                self.exec(&mut c, "I/O Connect", 0xfff0, &b);
            }
        }
        c.rx.clear();
        let reading = mode & 4 == 0;
        let cut = if mode & 8 != 0 {
            stream.len() * at as usize / 256
        } else {
            stream.len()
        };
        let extra_passes = if mode & 32 != 0 { 4 } else { 1 };
        let started = Instant::now();
        let follow = mode & 128 != 0;
        let mut stream = stream.to_vec();
        // With `follow`: where the next PDU of the stream starts (by its PLEN), and the
        // TTAG of each CCCID's latest R2T.
        let mut next_pdu = 0usize;
        let mut ttags: HashMap<u16, u16> = HashMap::new();
        let mut off = 0;
        let mut i = 0usize;
        while off < cut && !c.gone && started.elapsed() < STREAM_BUDGET {
            if follow && off == next_pdu && off + 12 <= cut {
                let plen = u32_at(&stream, off + 4) as usize;
                next_pdu = if plen >= 8 { off + plen } else { usize::MAX };
                if stream[off] == tcp::pdu_type::H2C_DATA {
                    let cccid = u16_at(&stream, off + 8);
                    for _ in 0..8 {
                        if ttags.contains_key(&cccid) {
                            break;
                        }
                        self.pass();
                        c.drain(true);
                        while let Some(p) = c.next_pdu() {
                            if p[0] == tcp::pdu_type::R2T && p.len() >= 12 {
                                ttags.insert(u16_at(&p, 8), u16_at(&p, 10));
                            }
                        }
                    }
                    if let Some(t) = ttags.get(&cccid) {
                        stream[off + 10..off + 12].copy_from_slice(&t.to_le_bytes());
                    }
                }
            }
            let chunk = if mode & 64 != 0 {
                1 + stream[i % stream.len()] as usize % (step as usize + 1)
            } else if step == 0 {
                cut
            } else {
                step as usize
            };
            i += 1;
            let mut end = (off + chunk).min(cut);
            if follow && next_pdu > off {
                end = end.min(next_pdu);
            }
            let n = c.write_some(&stream[off..end]);
            off += n;
            for _ in 0..extra_passes {
                self.pass();
            }
            if follow {
                c.drain(true);
                while let Some(p) = c.next_pdu() {
                    if p[0] == tcp::pdu_type::R2T && p.len() >= 12 {
                        ttags.insert(u16_at(&p, 8), u16_at(&p, 10));
                    }
                }
            } else if reading {
                c.drain(verbose());
            }
        }
        if mode & 16 != 0 && !c.gone {
            let _ = c.sock.shutdown(Shutdown::Write);
            c.write_closed = true;
        }
        // Let the engine finish what the stream began (bounded).
        for _ in 0..16 {
            let did = self.pass();
            if reading || mode & 16 != 0 {
                c.drain(verbose());
            }
            if !did && !self.io.busy() {
                break;
            }
        }
        if at == 0xff && mode & 8 == 0 {
            // Linger: the peer stays connected and silent past the engine's deadlines
            // (ICReq, Connect, host data, partial PDU, drain), bounded.
            let end = Instant::now() + LINGER;
            while Instant::now() < end && self.apps.contains_key(&c.qp) {
                if !self.pass() {
                    std::thread::sleep(Duration::from_micros(200));
                }
                if reading {
                    c.drain(false);
                }
            }
        }
        clients.push(c);
        self.close_all(&mut clients);
        if verbose() {
            let mut got = Vec::new();
            while let Some(p) = clients[0].next_pdu() {
                let cid = if p[0] == tcp::pdu_type::CAPSULE_RESP {
                    u16_at(&p, 20)
                } else {
                    u16_at(&p, 8)
                };
                let st = if p[0] == tcp::pdu_type::CAPSULE_RESP {
                    u16_at(&p, 22) >> 1
                } else {
                    0
                };
                got.push((p[0], cid, st));
            }
            eprintln!("engine: got (type, cid, status): {got:x?}");
            let t = self.engine.stats().threads()[0];
            eprintln!(
                "engine: input {}: mode {mode:#x}, {off} of {} bytes sent; totals: offloaded \
                 {}, handed up {}, limit hits {:?}",
                self.inputs,
                stream.len(),
                t.offloaded,
                t.non_offloaded,
                self.engine.stats().limit_hits()
            );
        }
        if let Some(mut a) = admin {
            // The clean admin queue's controller lost an I/O queue to a bad peer; the
            // admin queue itself must still be served.
            let mut b = Vec::new();
            property_get_csts(&mut b, 3);
            self.exec(
                &mut a,
                "clean Property Get after the I/O queue's peer",
                3,
                &b,
            );
            let mut b = Vec::new();
            identify(&mut b, 4, 1, 0);
            let (_, id) = self.exec(&mut a, "clean Identify after the I/O queue's peer", 4, &b);
            assert_eq!(id.len(), 4096, "Identify Controller data");
            self.close_all(&mut [a]);
        }
    }
}

/// `ENGINE_FUZZ_VERBOSE` set: a line per input (what was sent, what came back).
fn verbose() -> bool {
    std::env::var_os("ENGINE_FUZZ_VERBOSE").is_some()
}

pub fn run(data: &[u8]) {
    let t0 = Instant::now();
    WORLD.with(|w| {
        let mut w = w.borrow_mut();
        w.get_or_insert_with(World::new).run(data);
    });
    if verbose() {
        eprintln!(
            "engine: {:?} for {:02x?}",
            t0.elapsed(),
            &data[..data.len().min(3)]
        );
    }
}

/// Valid streams that get deep, for each preamble mode.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    // Mode 0: the stream's own ICReq, admin Connect, CC.EN, Identify, an AER held, a
    // Get Log Page, Keep Alive; whole and in 7-byte chunks, reading or not.
    let mut admin_stream = Vec::new();
    ic_req(&mut admin_stream);
    connect(&mut admin_stream, 1, fabrics::CNTLID_DYNAMIC, 0, 31);
    property_set_cc_en(&mut admin_stream, 2);
    identify(&mut admin_stream, 3, 1, 0);
    identify(&mut admin_stream, 4, 0, 1);
    let mut aer = Sqe::default();
    aer.set_opcode_cid(admin::ASYNC_EVENT_REQUEST, 5);
    capsule(&mut admin_stream, &aer, &[]);
    let mut glp = Sqe::default();
    glp.set_opcode_cid(admin::GET_LOG_PAGE, 6);
    glp.cdw10 = 0x02 | (127 << 16);
    capsule(&mut admin_stream, &by_transport(glp, 512), &[]);
    let mut ka = Sqe::default();
    ka.set_opcode_cid(admin::KEEP_ALIVE, 7);
    capsule(&mut admin_stream, &ka, &[]);
    for (mode, step) in [(0u8, 0u8), (0x80, 7), (4, 0), (0x40, 31), (0x18, 0)] {
        let mut s = vec![mode, step, 128];
        s.extend_from_slice(&admin_stream);
        v.push(s);
    }
    // Mode 2: after the harness's admin Connect, CC.EN and the rest.
    let mut s = vec![2u8, 0, 0];
    property_set_cc_en(&mut s, 2);
    identify(&mut s, 3, 1, 0);
    property_get_csts(&mut s, 4);
    v.push(s);
    // Mode 3: an I/O queue's stream: writes in-capsule and by R2T/H2CData, reads, a
    // flush, a write whose data never comes, then reads the host does not take.
    let io_stream = |out: &mut Vec<u8>| {
        capsule(
            out,
            &in_capsule(rw(io_op::WRITE, 1, 0, 8), 4096),
            &[0x5a; 4096],
        );
        capsule(out, &by_transport(rw(io_op::WRITE, 2, 8, 16), 8192), &[]);
        tcp::encode_h2c_data(out, 2, 2, 0, &[0xa5; 8192], true, Digests::NONE, 0);
        capsule(out, &by_transport(rw(io_op::READ, 3, 0, 24), 12288), &[]);
        let mut flush = Sqe::default();
        flush.set_opcode_cid(io_op::FLUSH, 4);
        flush.nsid = 1;
        capsule(out, &flush, &[]);
        capsule(out, &by_transport(rw(io_op::WRITE, 5, 64, 8), 4096), &[]);
        for cid in 6..20 {
            capsule(
                out,
                &by_transport(rw(io_op::READ, cid, 0, 256), 131072),
                &[],
            );
        }
    };
    for (mode, step) in [
        (0x83u8, 0u8),
        (0x83, 100),
        (0x87, 0),
        (0x93, 0),
        (0xa3, 50),
        (3, 0),
    ] {
        let mut s = vec![mode, step, 200];
        io_stream(&mut s);
        v.push(s);
    }
    // Mode 3, SQSIZE 1: writes whose data never comes overrun the queue (a C2HTermReq
    // for QueueDepth).
    let mut s = vec![0x03u8, 0, 0];
    for cid in 0..4 {
        capsule(
            &mut s,
            &by_transport(rw(io_op::WRITE, cid, 0, 8), 4096),
            &[],
        );
    }
    v.push(s);
    // Mode 3, a client that reads nothing: 20 reads of 1 MiB back up the output.
    let mut s = vec![0x87u8, 0, 126];
    for cid in 0..20 {
        capsule(
            &mut s,
            &by_transport(rw(io_op::READ, cid, 0, 2048), 1 << 20),
            &[],
        );
    }
    v.push(s);
    // Lingering: an ICReq only (Connect deadline), half a capsule (partial PDU), a write
    // whose data never comes (host data deadline).
    let mut s = vec![0u8, 0, 0xff];
    ic_req(&mut s);
    v.push(s);
    let mut s = vec![1u8, 0, 0xff];
    let mut half = Vec::new();
    connect(&mut half, 1, fabrics::CNTLID_DYNAMIC, 0, 31);
    s.extend_from_slice(&half[..100]);
    v.push(s);
    let mut s = vec![0x83u8, 0, 0xff];
    capsule(&mut s, &by_transport(rw(io_op::WRITE, 1, 0, 8), 4096), &[]);
    v.push(s);
    // Mode 1: a broken capsule after a good ICReq (a TermReq follows).
    let mut s = vec![1u8, 0, 0];
    capsule(
        &mut s,
        &in_capsule(rw(io_op::WRITE, 1, 0, 1), 9000),
        &[1; 64],
    );
    v.push(s);
    v
}
