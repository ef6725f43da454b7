//! The `capsule` harness: a script of capsules and events against a [`Target`] with a
//! subsystem, two namespaces and a connected, enabled controller with two I/O queues.
//! The harness plays the transport: it executes what the target asks
//! ([`Action::Disconnect`] becomes `queue_closed`) and checks what comes back.
//!
//! Input: `[opts, counters, op...]`; `opts` picks [`TargetOptions`] edge values and the
//! admin KATO, `counters` the SMART counters' magnitude. Each op byte's low 3 bits pick:
//!
//! - 0-3: execute a 64-byte SQE (next bytes) on the admin queue, an I/O queue or some other
//!   queue (op bits 3-4), with a data buffer of the next u16 bytes (mod 20000);
//! - 4: Connect with a 64-byte SQE and 1024 bytes of Connect data (op bit 3 forces the
//!   Connect opcode; bit 4 uses valid Connect data naming our controller);
//! - 5: time passes (u16 * 10 ms), keep-alive timeouts are polled;
//! - 6: a namespace is added or removed;
//! - 7: an I/O queue closes, the host list changes, a listener comes or goes, or the
//!   admin queue is re-established.
//!
//! Checks: `data_len <= data.len()`; CQE CID/SQID echo the command and queue; errors
//! carry no data; only AERs and Aborts on the admin queue are held; every held completion
//! answers a command that was held; Disconnect actions name queues that exist; a granted
//! Connect to SUB1 names a host on its list as last set, and an I/O queue's Connect the
//! host that created its controller.

use nvmf::spec::fabrics::{self, ConnectCommand, ConnectData, PropertyCommand};
use nvmf::spec::features::{fid, FeatureCommand};
use nvmf::spec::identify::cns;
use nvmf::spec::log::{lid, GetLogPage};
use nvmf::spec::opcodes::{self, admin, io};
use nvmf::spec::{Cqe, Sqe};
use nvmf::target::{
    Action, CounterSource, IoCounters, ListenerInfo, NamespaceConfig, Outcome, QueueKey,
    QueueOrigin, QueueRef, SubsystemConfig, Target, TargetOptions, Transport,
};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};
use zerocopy::IntoBytes;

pub const SUB1: &str = "nqn.2024-01.io.example:sub1";
pub const SUB2: &str = "nqn.2024-01.io.example:sub2";
pub const HOST1: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
pub const HOST2: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002";
pub const HOSTID1: [u8; 16] = [1; 16];
/// CC as the Linux host writes it: EN, IOSQES 6, IOCQES 4.
pub const CC_ENABLE: u64 = 0x0046_0001;

pub struct FixedCounters(pub IoCounters);

impl CounterSource for FixedCounters {
    fn namespace_counters(&self, _subnqn: &str, _nsid: u32) -> IoCounters {
        self.0
    }
}

pub fn listener(port: u16) -> ListenerInfo {
    ListenerInfo {
        transport: if port.is_multiple_of(2) {
            Transport::Tcp
        } else {
            Transport::Rdma
        },
        addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        port,
    }
}

pub fn namespace(nsid: u32) -> NamespaceConfig {
    NamespaceConfig {
        nsid,
        block_size: 512 << (nsid % 4),
        num_blocks: 1 << (10 + nsid % 40),
        uuid: [nsid as u8; 16],
        nguid: [0x10 + nsid as u8; 16],
        eui64: [0x20 + nsid as u8; 8],
        volatile_write_cache: nsid % 2 == 1,
        anagrpid: nsid % 3,
        hosts: None,
    }
}

/// A target with a TCP listener, SUB1 (HOST1 only, namespaces 1 and 2) and SUB2 (any
/// host, no namespace).
pub fn target(opts: TargetOptions) -> Target {
    let mut t = Target::new(opts);
    t.add_listener(listener(4420));
    let sub = |nqn: &str, hosts: &[&str]| SubsystemConfig {
        nqn: nqn.to_string(),
        serial: "SN0001".to_string(),
        model: "nvmf-target fuzz".to_string(),
        allow_any_host: hosts.is_empty(),
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        listeners: None,
    };
    t.add_subsystem(sub(SUB1, &[HOST1])).expect("SUB1");
    t.add_subsystem(sub(SUB2, &[])).expect("SUB2");
    t.add_namespace(SUB1, namespace(1)).expect("ns 1");
    t.add_namespace(SUB1, namespace(2)).expect("ns 2");
    let _ = t.take_actions();
    t
}

pub fn connect_sqe(qid: u16, sqsize: u16, kato: u32) -> Sqe {
    ConnectCommand {
        recfmt: 0,
        qid,
        sqsize,
        cattr: 0,
        kato,
    }
    .to_sqe(0x10 + qid)
}

pub fn connect_data(cntlid: u16, subnqn: &str, hostnqn: &str) -> Vec<u8> {
    ConnectData::new(HOSTID1, cntlid, subnqn, hostnqn)
        .as_bytes()
        .to_vec()
}

/// The transport's view: which queues are up, which AERs are held.
pub struct World {
    pub t: Target,
    pub now: Instant,
    next_key: QueueKey,
    kato: u32,
    /// Our SUB1/HOST1 controller's admin queue.
    pub admin: Option<(QueueRef, QueueKey)>,
    /// Every connected queue, ours and those the fuzzer's Connects made.
    pub queues: BTreeMap<QueueRef, QueueKey>,
    /// Held AER CIDs by CNTLID (they stay held across a reset).
    held: BTreeMap<u16, Vec<u16>>,
    pub counters: FixedCounters,
    /// SUB1's host list as last set: any host, or these.
    sub1_hosts: (bool, Vec<String>),
    /// The host NQN each controller was created for (by its admin Connect).
    ctrl_hosts: BTreeMap<u16, String>,
}

impl World {
    pub fn new(opts: TargetOptions, kato: u32, counters: IoCounters) -> World {
        let mut w = World {
            t: target(opts),
            now: Instant::now(),
            next_key: 100,
            kato,
            admin: None,
            queues: BTreeMap::new(),
            held: BTreeMap::new(),
            counters: FixedCounters(counters),
            sub1_hosts: (false, vec![HOST1.to_string()]),
            ctrl_hosts: BTreeMap::new(),
        };
        w.establish();
        w
    }

    fn key(&mut self) -> QueueKey {
        self.next_key += 1;
        self.next_key
    }

    /// Admin Connect to SUB1 as HOST1, CC.EN, Set Features AEC, I/O queues 1 and 2.
    /// Tolerates failures (edge options can refuse some of it).
    pub fn establish(&mut self) {
        let key = self.key();
        let (cqe, ok) = self.connect(
            key,
            &connect_sqe(0, 31, self.kato),
            &connect_data(fabrics::CNTLID_DYNAMIC, SUB1, HOST1),
        );
        let Some(ok) = ok else {
            panic!("admin Connect refused: {cqe:?}");
        };
        self.admin = Some((ok.queue(), key));
        let cc = PropertyCommand {
            attrib: 0,
            offset: fabrics::property::CC,
            value: CC_ENABLE,
        };
        self.execute(ok.queue(), &cc.to_sqe(1, true), 0);
        let mut aec = Sqe::default();
        aec.set_opcode_cid(admin::SET_FEATURES, 2);
        FeatureCommand {
            fid: fid::ASYNC_EVENT_CONFIG,
            value: 0xffff_ffff,
            ..Default::default()
        }
        .write_to(&mut aec);
        self.execute(ok.queue(), &aec, 0);
        for qid in [1, 2] {
            let key = self.key();
            self.connect(
                key,
                &connect_sqe(qid, 127, 0),
                &connect_data(ok.cntlid, SUB1, HOST1),
            );
        }
    }

    /// Sets SUB1's host list (the target retires controllers it no longer allows), and
    /// remembers it for the access checks of [`World::connect`].
    fn set_sub1_hosts(&mut self, any: bool, hosts: Vec<String>) {
        self.sub1_hosts = (any, hosts.clone());
        let a = self.t.set_hosts(SUB1, any, hosts);
        self.handle(a);
    }

    /// Connect, with the checks that hold for any Connect.
    pub fn connect(
        &mut self,
        key: QueueKey,
        sqe: &Sqe,
        data: &[u8],
    ) -> (Cqe, Option<nvmf::target::ConnectOk>) {
        let origin = QueueOrigin {
            listener: Some(listener(4420)),
            local: Some(listener(4420).addr),
            peer: None,
        };
        let (cqe, ok) = self.t.connect(self.now, key, &origin, sqe, data);
        assert_eq!(cqe.cid, sqe.cid());
        match &ok {
            Some(ok) => {
                assert!(cqe.status().is_success(), "{cqe:?} with {ok:?}");
                assert_eq!(cqe.dw0, ok.cntlid as u32);
                assert_eq!(cqe.sqid, ok.qid);
                assert!((1..=0xffef).contains(&ok.cntlid), "CNTLID {}", ok.cntlid);
                assert_eq!(ok.qid, ConnectCommand::from_sqe(sqe).qid);
                assert!(fabrics::is_valid_nqn(&ok.subnqn));
                assert_eq!(ok.is_discovery, ok.subnqn == nvmf::target::DISCOVERY_NQN);
                assert!(
                    self.queues.insert(ok.queue(), key).is_none(),
                    "Connect granted {:?} twice",
                    ok.queue()
                );
                assert_eq!(self.t.subsystem_of(ok.cntlid), Some(ok.subnqn.as_str()));
                // Access control: SUB1 takes only the hosts on its list, and an I/O queue
                // joins a controller only as the host that created it.
                let d = ConnectData::from_bytes(data).expect("Connect granted without data");
                let host = d
                    .hostnqn()
                    .expect("Connect granted to a HOSTNQN that is no string");
                if ok.subnqn == SUB1 {
                    let (any, hosts) = &self.sub1_hosts;
                    assert!(
                        *any || hosts.iter().any(|h| h == host),
                        "Connect let {host} into {SUB1}, whose hosts are {hosts:?}"
                    );
                }
                if ok.qid == 0 {
                    self.ctrl_hosts.insert(ok.cntlid, host.to_string());
                } else {
                    assert_eq!(
                        self.ctrl_hosts.get(&ok.cntlid).map(String::as_str),
                        Some(host),
                        "I/O queue {} joined controller {} as another host",
                        ok.qid,
                        ok.cntlid
                    );
                }
            }
            None => assert!(!cqe.status().is_success(), "success without ConnectOk"),
        }
        let actions = self.t.take_actions();
        self.handle(actions);
        (cqe, ok)
    }

    /// Executes `sqe` on `queue` with a `len`-byte buffer, checking the outcome.
    pub fn execute(&mut self, queue: QueueRef, sqe: &Sqe, len: usize) -> Outcome {
        let mut data = vec![0x5a; len];
        let out = self
            .t
            .execute(self.now, queue, sqe, &mut data, &self.counters);
        match &out {
            Outcome::Complete { cqe, data_len } => {
                assert!(
                    *data_len as usize <= data.len(),
                    "data_len {data_len} > buffer {} for {sqe:?}",
                    data.len()
                );
                assert_eq!(cqe.cid, sqe.cid());
                assert_eq!(cqe.sqid, queue.qid);
                assert_eq!(cqe.sqhd, 0, "SQHD is the transport's");
                if !cqe.status().is_success() {
                    assert_eq!(*data_len, 0, "an error with data: {cqe:?}");
                }
            }
            Outcome::Deferred => {
                // AERs wait for an event; an Abort waits for the transport to look for
                // its command (Action::Abort, answered through abort_done).
                assert!(
                    queue.qid == 0
                        && !sqe.is_fabrics()
                        && matches!(sqe.opcode(), admin::ASYNC_EVENT_REQUEST | admin::ABORT),
                    "held a command that is neither an AER nor an Abort: {sqe:?}"
                );
                self.held.entry(queue.cntlid).or_default().push(sqe.cid());
            }
            Outcome::Dropped => {
                let retired = self
                    .t
                    .report()
                    .controllers
                    .iter()
                    .any(|c| c.cntlid == queue.cntlid && c.retired);
                assert!(retired, "a live controller dropped {sqe:?}");
            }
        }
        let actions = self.t.take_actions();
        self.handle(actions);
        out
    }

    /// Plays the transport's part for target actions.
    pub fn handle(&mut self, mut actions: Vec<Action>) {
        while !actions.is_empty() {
            let mut more = Vec::new();
            for a in actions {
                match a {
                    Action::CompleteHeld { queue, key, cqe } => {
                        assert_eq!(queue.qid, 0, "held completion off the admin queue");
                        assert_eq!(self.queues.get(&queue), Some(&key), "{queue:?} unknown");
                        let held = self.held.entry(queue.cntlid).or_default();
                        let i = held
                            .iter()
                            .position(|&c| c == cqe.cid)
                            .unwrap_or_else(|| panic!("completion for CID {} never held", cqe.cid));
                        held.remove(i);
                        // Events succeed; an AER aborted by Abort says so.
                        assert!(
                            cqe.status().is_success()
                                || cqe.status() == nvmf::spec::Status::ABORT_REQUESTED
                        );
                    }
                    Action::Abort {
                        abort, abort_cid, ..
                    } => {
                        // The toy transport never has a command to abort.
                        more.extend(self.t.abort_done(abort, abort_cid, false));
                    }
                    Action::Disconnect { queue, key } => {
                        assert_eq!(
                            self.queues.get(&queue),
                            Some(&key),
                            "Disconnect for a queue not connected: {queue:?}"
                        );
                        more.extend(self.close(queue, key));
                    }
                }
            }
            actions = more;
        }
    }

    /// The transport lost a queue.
    pub fn close(&mut self, queue: QueueRef, key: QueueKey) -> Vec<Action> {
        if self.queues.get(&queue) == Some(&key) {
            self.queues.remove(&queue);
        }
        if queue.qid == 0 {
            self.held.remove(&queue.cntlid);
            if self.admin == Some((queue, key)) {
                self.admin = None;
            }
        }
        self.t.queue_closed(queue, key)
    }

    /// Our controller's queue `qid`, if it is up.
    fn ours(&self, qid: u16) -> Option<QueueRef> {
        let (a, _) = self.admin?;
        let q = QueueRef {
            cntlid: a.cntlid,
            qid,
        };
        self.queues.contains_key(&q).then_some(q)
    }
}

fn options(b: u8) -> TargetOptions {
    let d = TargetOptions::default();
    TargetOptions {
        max_queue_depth: [d.max_queue_depth, 0, 1, 2, 32, 0xffff][(b & 7) as usize % 6],
        max_io_queues: [d.max_io_queues, 0, 1, 0xffff][((b >> 3) & 3) as usize],
        mdts: [d.mdts, 0, 255, 1][((b >> 5) & 3) as usize],
        max_namespaces: if b & 0x80 != 0 { 2 } else { d.max_namespaces },
        ..d
    }
}

pub fn run(data: &[u8]) {
    let mut inp = crate::Input::new(data);
    let ob = inp.u8();
    let cb = inp.u8();
    let big = |shift: u8| {
        if cb & (1 << shift) != 0 {
            u64::MAX
        } else {
            12345
        }
    };
    let counters = IoCounters {
        read_cmds: big(0),
        write_cmds: big(1),
        read_bytes: big(2),
        write_bytes: big(3),
        media_errors: big(4),
    };
    let kato = [0, 5000, 1, u32::MAX][(cb >> 5) as usize & 3];
    let mut w = World::new(options(ob), kato, counters);
    let mut steps = 0;
    while !inp.is_empty() && steps < 256 {
        steps += 1;
        let op = inp.u8();
        match op & 7 {
            0..=3 => {
                let sel = (op >> 3) & 3;
                let q = match sel {
                    0..=2 => w.ours(sel as u16),
                    _ => {
                        // Some other queue: one the fuzzer connected, or a made-up one.
                        let n = inp.u8() as usize;
                        let qs: Vec<_> = w.queues.keys().copied().collect();
                        if qs.is_empty() || n >= 0xf0 {
                            Some(QueueRef {
                                cntlid: inp.u16(),
                                qid: inp.u16(),
                            })
                        } else {
                            Some(qs[n % qs.len()])
                        }
                    }
                };
                let sqe = Sqe::from_bytes(&inp.bytes(64)).expect("64 bytes");
                let len = inp.u16() as usize % 20000;
                if let Some(q) = q {
                    w.execute(q, &sqe, len);
                }
            }
            4 => {
                let mut sqe = Sqe::from_bytes(&inp.bytes(64)).expect("64 bytes");
                if op & 8 != 0 {
                    sqe.set_opcode_cid(opcodes::FABRICS, sqe.cid());
                    sqe.nsid = (sqe.nsid & !0xff) | opcodes::fabrics::CONNECT as u32;
                }
                let data = if op & 16 != 0 {
                    let cntlid = w.admin.map_or(fabrics::CNTLID_DYNAMIC, |(q, _)| q.cntlid);
                    let cntlid = if op & 32 != 0 {
                        fabrics::CNTLID_DYNAMIC
                    } else {
                        cntlid
                    };
                    let sub = if op & 64 != 0 { SUB2 } else { SUB1 };
                    connect_data(cntlid, sub, HOST1)
                } else {
                    inp.bytes(1024)
                };
                let key = w.key();
                w.connect(key, &sqe, &data);
            }
            5 => {
                w.now += Duration::from_millis(inp.u16() as u64 * 10);
                let next = w.t.next_timeout();
                let actions = w.t.poll_timeouts(w.now);
                if next.is_some_and(|n| n > w.now) {
                    assert!(actions.is_empty(), "actions before the earliest deadline");
                }
                w.handle(actions);
                if let Some(n) = w.t.next_timeout() {
                    assert!(n > w.now, "an expired deadline survived poll_timeouts");
                }
            }
            6 => {
                let nsid = inp.u8() as u32 % 8 + 1;
                let sub = if op & 16 != 0 { SUB2 } else { SUB1 };
                if op & 8 != 0 {
                    let _ = w.t.add_namespace(sub, namespace(nsid));
                } else {
                    let _ = w.t.remove_namespace(sub, nsid);
                }
                let a = w.t.take_actions();
                w.handle(a);
            }
            _ => match (op >> 3) & 3 {
                0 => {
                    let qid = inp.u8() as u16 % 3;
                    if let Some(q) = w.ours(qid) {
                        let key = w.queues[&q];
                        let a = w.close(q, key);
                        w.handle(a);
                    }
                }
                1 => {
                    let any = op & 32 != 0;
                    let hosts = if op & 64 != 0 {
                        vec![HOST2.to_string()]
                    } else {
                        vec![HOST1.to_string()]
                    };
                    w.set_sub1_hosts(any, hosts);
                }
                2 => {
                    let l = listener(4420 + (op >> 5) as u16);
                    if op & 4 == 0 {
                        w.t.add_listener(l);
                    } else {
                        w.t.remove_listener(&l);
                    }
                    let a = w.t.take_actions();
                    w.handle(a);
                }
                _ => {
                    if w.admin.is_none() {
                        w.set_sub1_hosts(false, vec![HOST1.to_string()]);
                        w.establish();
                    }
                }
            },
        }
    }
}

/// Encodes one "execute" op for the seeds.
fn exec_op(out: &mut Vec<u8>, sel: u8, sqe: &Sqe, len: u16) {
    out.push(sel << 3);
    out.extend_from_slice(sqe.as_bytes());
    out.extend_from_slice(&len.to_le_bytes());
}

fn admin_sqe(opcode: u8, cid: u16, nsid: u32, cdw10: u32, cdw11: u32) -> Sqe {
    let mut s = Sqe {
        nsid,
        cdw10,
        cdw11,
        ..Default::default()
    };
    s.set_opcode_cid(opcode, cid);
    s
}

/// Scripts that walk the admin command set, AERs, namespace changes and teardown.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    let mut s = vec![0u8, 0b0010_0000];
    for (i, c) in [
        cns::NAMESPACE,
        cns::CONTROLLER,
        cns::ACTIVE_NS_LIST,
        cns::NS_ID_DESCRIPTORS,
    ]
    .into_iter()
    .enumerate()
    {
        exec_op(
            &mut s,
            0,
            &admin_sqe(admin::IDENTIFY, 10 + i as u16, 1, c as u32, 0),
            4096,
        );
    }
    for (i, l) in [
        lid::ERROR_INFORMATION,
        lid::SMART_HEALTH,
        lid::FIRMWARE_SLOT,
        lid::CHANGED_NS_LIST,
        lid::COMMANDS_EFFECTS,
    ]
    .into_iter()
    .enumerate()
    {
        let mut g = admin_sqe(admin::GET_LOG_PAGE, 20 + i as u16, 0xffff_ffff, 0, 0);
        GetLogPage {
            lid: l,
            numd: 1023,
            ..Default::default()
        }
        .write_to(&mut g);
        exec_op(&mut s, 0, &g, 4096);
    }
    for (i, f) in [
        fid::ARBITRATION,
        fid::POWER_MANAGEMENT,
        fid::TEMPERATURE_THRESHOLD,
        fid::NUMBER_OF_QUEUES,
        fid::VOLATILE_WRITE_CACHE,
        fid::KEEP_ALIVE_TIMER,
        fid::ASYNC_EVENT_CONFIG,
    ]
    .into_iter()
    .enumerate()
    {
        let mut g = admin_sqe(admin::GET_FEATURES, 40 + i as u16, 1, 0, 0);
        FeatureCommand {
            fid: f,
            ..Default::default()
        }
        .write_to(&mut g);
        exec_op(&mut s, 0, &g, 4096);
        let mut st = admin_sqe(admin::SET_FEATURES, 60 + i as u16, 1, 0, 0);
        FeatureCommand {
            fid: f,
            value: 0x0003_0003,
            ..Default::default()
        }
        .write_to(&mut st);
        exec_op(&mut s, 0, &st, 0);
    }
    for cid in 80..86 {
        exec_op(
            &mut s,
            0,
            &admin_sqe(admin::ASYNC_EVENT_REQUEST, cid, 0, 0, 0),
            0,
        );
    }
    s.extend_from_slice(&[6 | 8, 5]); // add namespace 6
    exec_op(&mut s, 0, &admin_sqe(admin::KEEP_ALIVE, 90, 0, 0, 0), 0);
    exec_op(&mut s, 0, &admin_sqe(admin::ABORT, 91, 0, 0, 0), 0);
    exec_op(&mut s, 1, &admin_sqe(io::READ, 92, 1, 0, 0), 4096);
    exec_op(&mut s, 2, &admin_sqe(io::FLUSH, 93, 2, 0, 0), 0);
    exec_op(&mut s, 1, &admin_sqe(io::VERIFY, 94, 1, 0, 0), 0);
    for (i, (off, eight)) in [
        (fabrics::property::CAP, true),
        (fabrics::property::VS, false),
        (fabrics::property::CSTS, false),
    ]
    .into_iter()
    .enumerate()
    {
        let p = PropertyCommand {
            attrib: eight as u8,
            offset: off,
            value: 0,
        };
        exec_op(&mut s, 0, &p.to_sqe(100 + i as u16, false), 0);
    }
    s.extend_from_slice(&[5, 0xff, 0x01]); // 2.5 s pass
    v.push(s.clone());
    // Then shutdown, reset, Disconnect, reconnect.
    let mut t = s;
    let shn = PropertyCommand {
        attrib: 0,
        offset: fabrics::property::CC,
        value: CC_ENABLE | 1 << 14,
    };
    exec_op(&mut t, 0, &shn.to_sqe(110, true), 0);
    let reset = PropertyCommand {
        attrib: 0,
        offset: fabrics::property::CC,
        value: 0,
    };
    exec_op(&mut t, 0, &reset.to_sqe(111, true), 0);
    let mut disc = Sqe::default();
    disc.set_opcode_cid(opcodes::FABRICS, 112);
    disc.nsid = opcodes::fabrics::DISCONNECT as u32;
    exec_op(&mut t, 0, &disc, 0);
    t.push(7 | 3 << 3);
    // I/O Connect on qid 3 with valid data.
    t.push(4 | 8 | 16);
    t.extend_from_slice(connect_sqe(3, 15, 0).as_bytes());
    // Time runs out.
    t.extend_from_slice(&[5, 0xff, 0xff]);
    v.push(t);
    // A second admin connect, to SUB2 and the discovery subsystem.
    let mut u = vec![0u8, 0xff];
    u.push(4 | 8 | 16 | 32 | 64);
    u.extend_from_slice(connect_sqe(0, 31, 0).as_bytes());
    u.push(4 | 8);
    u.extend_from_slice(connect_sqe(0, 31, 0).as_bytes());
    u.extend_from_slice(&connect_data(0xffff, nvmf::target::DISCOVERY_NQN, HOST2));
    let mut g = admin_sqe(admin::GET_LOG_PAGE, 7, 0, 0, 0);
    GetLogPage {
        lid: lid::DISCOVERY,
        numd: 1023,
        ..Default::default()
    }
    .write_to(&mut g);
    u.push(3 << 3);
    u.push(0);
    u.extend_from_slice(g.as_bytes());
    u.extend_from_slice(&4096u16.to_le_bytes());
    v.push(u);
    v
}
