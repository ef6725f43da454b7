//! Whole conversations against [`Target`] with simulated time, the way the Linux host
//! drives a controller: admin Connect, Property Set CC.EN, Identify, Set Features Number
//! of Queues, I/O Connects, keep alive, AERs, discovery.

use super::*;
use crate::spec::fabrics::{ConnectCommand, ConnectData, PropertyCommand};
use crate::spec::features::{fid, FeatureCommand};
use crate::spec::identify::{
    cns, csi, IdentifyController, IdentifyNamespace, NamespaceList, NsIdDescriptor,
};
use crate::spec::log::{disc, lid, DiscoveryLogEntry, DiscoveryLogHeader, GetLogPage, SmartLog};
use crate::spec::opcodes::{admin, io};
use proptest::prelude::*;
use std::net::{IpAddr, Ipv4Addr};
use zerocopy::{FromBytes, IntoBytes};

const SUB1: &str = "nqn.2024-01.io.example:sub1";
const SUB2: &str = "nqn.2024-01.io.example:sub2";
const HOST1: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
const HOST2: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002";
const HOSTID1: [u8; 16] = [1; 16];
/// CC as the Linux host writes it: EN, IOSQES 6, IOCQES 4.
const CC_ENABLE: u64 = 0x0046_0001;

fn tcp() -> ListenerInfo {
    ListenerInfo {
        transport: Transport::Tcp,
        addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        port: 4420,
    }
}
fn rdma() -> ListenerInfo {
    ListenerInfo {
        transport: Transport::Rdma,
        addr: "fd00::1".parse().unwrap(),
        port: 4421,
    }
}

/// A queue that came in on the TCP listener, at its address.
fn origin() -> QueueOrigin {
    QueueOrigin {
        listener: Some(tcp()),
        local: Some(tcp().addr),
        peer: None,
    }
}

fn ns(nsid: u32) -> NamespaceConfig {
    NamespaceConfig {
        nsid,
        block_size: 4096,
        num_blocks: 1 << 20,
        uuid: [nsid as u8; 16],
        nguid: [0x10 + nsid as u8; 16],
        eui64: [0x20 + nsid as u8; 8],
        volatile_write_cache: true,
        anagrpid: 0,
        hosts: None,
    }
}

fn subsystem(nqn: &str, hosts: &[&str]) -> SubsystemConfig {
    SubsystemConfig {
        nqn: nqn.to_string(),
        serial: "SN0001".to_string(),
        model: "nvmf-target test".to_string(),
        allow_any_host: hosts.is_empty(),
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        listeners: None,
    }
}

/// A target with one TCP listener and SUB1 (HOST1 only, namespace 1).
fn target() -> Target {
    let mut t = Target::new(TargetOptions::default());
    t.add_listener(tcp());
    t.add_subsystem(subsystem(SUB1, &[HOST1])).unwrap();
    t.add_namespace(SUB1, ns(1)).unwrap();
    t
}

fn connect_sqe(qid: u16, sqsize: u16, kato: u32) -> Sqe {
    ConnectCommand {
        recfmt: 0,
        qid,
        sqsize,
        cattr: 0,
        kato,
    }
    .to_sqe(0x10 + qid)
}

fn connect_data(cntlid: u16, subnqn: &str, hostnqn: &str) -> Vec<u8> {
    ConnectData::new(HOSTID1, cntlid, subnqn, hostnqn)
        .as_bytes()
        .to_vec()
}

struct Conv {
    t: Target,
    now: Instant,
    admin: QueueRef,
    cid: u16,
}

impl Conv {
    /// Admin Connect with KATO 5 s.
    fn connect(t: Target, subnqn: &str, hostnqn: &str) -> Conv {
        Conv::connect_kato(t, Instant::now(), 100, 5000, subnqn, hostnqn)
    }
    /// Admin Connect at `now` on transport key `key` with KATO `kato` ms.
    fn connect_kato(
        mut t: Target,
        now: Instant,
        key: u64,
        kato: u32,
        subnqn: &str,
        hostnqn: &str,
    ) -> Conv {
        let (cqe, ok) = t.connect(
            now,
            key,
            &origin(),
            &connect_sqe(0, 31, kato),
            &connect_data(0xffff, subnqn, hostnqn),
        );
        assert_eq!(cqe.status(), Status::SUCCESS);
        let ok = ok.unwrap();
        assert_eq!(cqe.dw0, ok.cntlid as u32);
        Conv {
            t,
            now,
            admin: ok.queue(),
            cid: 0,
        }
    }
    fn enabled(t: Target, subnqn: &str, hostnqn: &str) -> Conv {
        let mut c = Conv::connect(t, subnqn, hostnqn);
        let (cqe, _) = c.property_set(CC_ENABLE);
        assert!(cqe.status().is_success());
        assert_eq!(c.property_get(fabrics::property::CSTS, false).dw0 & 1, 1);
        c
    }
    fn exec_on(&mut self, q: QueueRef, mut sqe: Sqe, data: &mut [u8]) -> Outcome {
        self.cid = self.cid.wrapping_add(1);
        sqe.set_opcode_cid(sqe.opcode(), self.cid);
        self.t.execute(self.now, q, &sqe, data, &NoCounters)
    }
    /// Runs an admin command with an 8 KiB buffer; panics if it is held.
    fn admin(&mut self, sqe: Sqe) -> (Cqe, Vec<u8>) {
        let mut buf = vec![0u8; 8192];
        match self.exec_on(self.admin, sqe, &mut buf) {
            Outcome::Complete { cqe, data_len } => {
                assert_eq!(cqe.cid, self.cid);
                buf.truncate(data_len as usize);
                (cqe, buf)
            }
            Outcome::Deferred => panic!("held"),
            Outcome::Dropped => panic!("dropped"),
        }
    }
    fn property_set(&mut self, value: u64) -> (Cqe, Vec<u8>) {
        let p = PropertyCommand {
            attrib: 0,
            offset: fabrics::property::CC,
            value,
        };
        self.admin(p.to_sqe(0, true))
    }
    fn property_get(&mut self, offset: u32, eight: bool) -> Cqe {
        let p = PropertyCommand {
            attrib: eight as u8,
            offset,
            value: 0,
        };
        self.admin(p.to_sqe(0, false)).0
    }
    fn io_connect(&mut self, qid: u16, key: QueueKey) -> (Cqe, Option<ConnectOk>) {
        let data = connect_data(self.admin.cntlid, SUB1, HOST1);
        self.t
            .connect(self.now, key, &origin(), &connect_sqe(qid, 127, 0), &data)
    }
}

fn admin_sqe(opcode: u8, nsid: u32) -> Sqe {
    let mut s = Sqe {
        nsid,
        ..Default::default()
    };
    s.set_opcode_cid(opcode, 0);
    s
}
fn identify(cns: u8, nsid: u32, csi: u8) -> Sqe {
    Sqe {
        cdw10: cns as u32,
        cdw11: (csi as u32) << 24,
        ..admin_sqe(admin::IDENTIFY, nsid)
    }
}
fn get_log(lid: u8, len: u32, lpo: u64, rae: bool, nsid: u32) -> Sqe {
    let mut s = admin_sqe(admin::GET_LOG_PAGE, nsid);
    GetLogPage {
        lid,
        numd: len / 4 - 1,
        lpo,
        rae,
        ..Default::default()
    }
    .write_to(&mut s);
    s
}
fn set_features(f: u8, value: u32) -> Sqe {
    let mut s = admin_sqe(admin::SET_FEATURES, 0);
    FeatureCommand {
        fid: f,
        value,
        ..Default::default()
    }
    .write_to(&mut s);
    s
}
fn get_features(f: u8, sel: u8, value: u32) -> Sqe {
    let mut s = admin_sqe(admin::GET_FEATURES, 0);
    FeatureCommand {
        fid: f,
        sel,
        value,
        ..Default::default()
    }
    .write_to(&mut s);
    s
}

#[test]
fn linux_host_connect_sequence() {
    let mut c = Conv::connect(target(), SUB1, HOST1);
    let q = c.admin;
    assert_eq!(c.t.subsystem_of(q.cntlid), Some(SUB1));
    // Before CC.EN only Fabrics commands work.
    assert_eq!(
        c.admin(identify(cns::CONTROLLER, 0, 0)).0.status(),
        Status::COMMAND_SEQUENCE_ERROR
    );
    assert_eq!(
        c.io_connect(1, 201).0.status(),
        Status::COMMAND_SEQUENCE_ERROR
    );
    let cap = c.property_get(fabrics::property::CAP, true);
    let cap = cap.dw0 as u64 | (cap.dw1 as u64) << 32;
    assert_eq!(cap & 0xffff, 127, "MQES");
    assert_ne!(cap & fabrics::cap::CQR, 0);
    assert_ne!(cap & fabrics::cap::CSS_NVM, 0);
    assert_eq!(
        c.property_get(fabrics::property::VS, false).dw0,
        0x0001_0400
    );
    // A 4-byte read of CAP is refused.
    assert_eq!(
        c.property_get(fabrics::property::CAP, false).status(),
        Status::INVALID_FIELD
    );
    c.property_set(CC_ENABLE);
    assert_eq!(c.property_get(fabrics::property::CSTS, false).dw0, 1);
    assert_eq!(
        c.property_get(fabrics::property::CC, false).dw0,
        CC_ENABLE as u32
    );

    let (cqe, data) = c.admin(identify(cns::CONTROLLER, 0, 0));
    assert!(cqe.status().is_success());
    let id = IdentifyController::read_from_bytes(&data).unwrap();
    assert_eq!(id.cntlid.get(), q.cntlid);
    assert_eq!(id.cntrltype, 1);
    assert_eq!(&id.sn[..8], b"SN0001  ");
    assert_eq!(fabrics::nul_terminated_str(&id.subnqn), Some(SUB1));
    assert_eq!(id.ioccsz.get(), (64 + 8192) / 16);
    assert_eq!(id.iorcsz.get(), 1);
    assert_eq!((id.sqes, id.cqes, id.msdbd, id.mdts), (0x66, 0x44, 1, 8));
    assert_eq!(id.vwc, 0b101);
    assert_ne!(id.kas.get(), 0);
    assert_ne!(id.sgls.get() & (1 << 20), 0);
    assert_ne!(id.oaes.get() & (1 << 8), 0);
    assert_eq!(id.nn.get(), 1024);

    // Number of Queues: ask for 4 (0's based 3), get 4.
    let (cqe, _) = c.admin(set_features(fid::NUMBER_OF_QUEUES, 3 | 3 << 16));
    assert_eq!(cqe.dw0, 3 | 3 << 16);
    for qid in 1..=4 {
        let (cqe, ok) = c.io_connect(qid, 200 + qid as u64);
        assert!(cqe.status().is_success(), "qid {qid}: {}", cqe.status());
        assert_eq!(
            ok.unwrap().queue(),
            QueueRef {
                cntlid: q.cntlid,
                qid
            }
        );
    }
    let (cqe, _) = c.io_connect(5, 205);
    assert_eq!(cqe.status(), Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(cqe.dw0, 42, "IPO = QID in the SQE");
    assert_eq!(
        c.io_connect(1, 206).0.status(),
        Status::COMMAND_SEQUENCE_ERROR
    );
    // Too late to change the queue count.
    let (cqe, _) = c.admin(set_features(fid::NUMBER_OF_QUEUES, 7 | 7 << 16));
    assert_eq!(cqe.status(), Status::COMMAND_SEQUENCE_ERROR);

    // Namespaces.
    let (_, data) = c.admin(identify(cns::ACTIVE_NS_LIST, 0, 0));
    assert_eq!(
        NamespaceList::read_from_bytes(&data).unwrap().to_ids(),
        vec![1]
    );
    let (_, data) = c.admin(identify(cns::NAMESPACE, 1, 0));
    let idns = IdentifyNamespace::read_from_bytes(&data).unwrap();
    assert_eq!(idns.nsze.get(), 1 << 20);
    assert_eq!(idns.lbaf[0].lbads, 12);
    assert_eq!(idns.nguid, [0x11; 16]);
    let (_, data) = c.admin(identify(cns::NS_ID_DESCRIPTORS, 1, 0));
    let descs = NsIdDescriptor::decode_list(&data).unwrap();
    assert!(descs.contains(&NsIdDescriptor::Uuid([1; 16])));
    // Inactive NSID: zeros; out of range: Invalid Namespace.
    let (cqe, data) = c.admin(identify(cns::NAMESPACE, 7, 0));
    assert!(cqe.status().is_success() && data.iter().all(|&b| b == 0));
    assert_eq!(
        c.admin(identify(cns::NAMESPACE, 0, 0)).0.status(),
        Status::INVALID_NAMESPACE
    );
    assert_eq!(
        c.admin(identify(0x55, 0, 0)).0.status(),
        Status::INVALID_FIELD
    );
    assert!(c
        .admin(identify(cns::CS_CONTROLLER, 0, 0))
        .0
        .status()
        .is_success());
    assert_eq!(
        c.admin(identify(cns::CS_CONTROLLER, 0, 2)).0.status(),
        Status::INVALID_FIELD
    );
    assert!(c
        .admin(identify(cns::CS_INDEPENDENT_NAMESPACE, 1, 0))
        .0
        .status()
        .is_success());
    assert!(c
        .admin(identify(cns::CS_NAMESPACE, 1, 0))
        .0
        .status()
        .is_success());
    assert!(c
        .admin(identify(cns::CS_ACTIVE_NS_LIST, 0, 0))
        .0
        .status()
        .is_success());

    // Host identifier, keep alive, abort, unknown opcode.
    let (cqe, data) = c.admin(get_features(fid::HOST_IDENTIFIER, 0, 1));
    assert!(cqe.status().is_success());
    assert_eq!(data, HOSTID1);
    assert!(c
        .admin(admin_sqe(admin::KEEP_ALIVE, 0))
        .0
        .status()
        .is_success());
    assert_eq!(c.admin(admin_sqe(admin::ABORT, 0)).0.dw0 & 1, 1);
    assert_eq!(
        c.admin(admin_sqe(admin::FORMAT_NVM, 1)).0.status(),
        Status::INVALID_OPCODE
    );

    // Closing the admin queue takes the I/O queues down; commands still arriving on
    // them get no answer; the controller goes with the last of them.
    let actions = c.t.queue_closed(q, 100);
    assert_eq!(actions.len(), 4);
    assert!(actions
        .iter()
        .all(|a| matches!(a, Action::Disconnect { queue, .. } if queue.qid != 0)));
    let mut buf = vec![0u8; 512];
    let ioq = QueueRef {
        cntlid: q.cntlid,
        qid: 1,
    };
    assert_eq!(
        c.exec_on(ioq, admin_sqe(io::READ, 1), &mut buf),
        Outcome::Dropped
    );
    for a in actions {
        let Action::Disconnect { queue, key } = a else {
            unreachable!()
        };
        assert_eq!(c.t.subsystem_of(q.cntlid), Some(SUB1));
        assert!(c.t.queue_closed(queue, key).is_empty());
    }
    assert_eq!(c.t.subsystem_of(q.cntlid), None);
}

#[test]
fn keep_alive_expiry_tears_down_all_queues() {
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    let start = c.now;
    assert_eq!(
        c.t.next_timeout(),
        Some(start + Duration::from_millis(5000))
    );
    c.io_connect(1, 201);
    c.io_connect(2, 202);
    c.now = start + Duration::from_secs(3);
    c.admin(admin_sqe(admin::KEEP_ALIVE, 0));
    let deadline = c.now + Duration::from_millis(5000);
    assert_eq!(c.t.next_timeout(), Some(deadline));
    assert!(c
        .t
        .poll_timeouts(deadline - Duration::from_millis(1))
        .is_empty());
    let mut actions = c.t.poll_timeouts(deadline + Duration::from_millis(1));
    actions.sort_by_key(|a| match a {
        Action::Disconnect { queue, .. } => queue.qid,
        _ => u16::MAX,
    });
    let cntlid = c.admin.cntlid;
    assert_eq!(
        actions,
        vec![
            Action::Disconnect {
                queue: QueueRef { cntlid, qid: 0 },
                key: 100
            },
            Action::Disconnect {
                queue: QueueRef { cntlid, qid: 1 },
                key: 201
            },
            Action::Disconnect {
                queue: QueueRef { cntlid, qid: 2 },
                key: 202
            },
        ]
    );
    // Retired: the expiry is a notice, commands in between get no answer, the only timer
    // left is the retirement limit.
    let (notices, _) = c.t.take_notices();
    assert!(
        matches!(
            &notices[..],
            [Notice::Refused(Refusal { reason: RefusalReason::KeepAliveExpired { kato_ms: 5000 }, key: 100, cntlid: Some(id), .. })] if *id == cntlid
        ),
        "{notices:?}"
    );
    assert_eq!(
        c.t.next_timeout(),
        Some(deadline + Duration::from_millis(1) + RETIRED_LIMIT)
    );
    let mut buf = [0u8; 0];
    assert_eq!(
        c.exec_on(c.admin, admin_sqe(admin::KEEP_ALIVE, 0), &mut buf),
        Outcome::Dropped
    );
    // The transport reports the queues closed: the controller goes, nothing more to do.
    for (qid, key) in [(1, 201), (2, 202)] {
        assert!(c.t.queue_closed(QueueRef { cntlid, qid }, key).is_empty());
    }
    assert!(c
        .t
        .queue_closed(QueueRef { cntlid, qid: 0 }, 100)
        .is_empty());
    assert_eq!(c.t.next_timeout(), None);
    assert_eq!(c.t.subsystem_of(cntlid), None);
    let (cqe, _) = c.admin(admin_sqe(admin::KEEP_ALIVE, 0));
    assert_eq!(cqe.status(), Status::COMMAND_SEQUENCE_ERROR);
}

#[test]
fn a_retired_controller_whose_queues_never_close_goes_after_the_limit() {
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    let cntlid = c.admin.cntlid;
    assert_eq!(c.t.remove_subsystem(SUB1).len(), 1);
    let t0 = c.now;
    assert!(c.t.poll_timeouts(t0).is_empty());
    assert_eq!(c.t.subsystem_of(cntlid), Some(SUB1));
    assert!(c.t.poll_timeouts(t0 + RETIRED_LIMIT).is_empty());
    assert_eq!(c.t.subsystem_of(cntlid), None);
}

#[test]
fn kato_zero_disables_the_timer_and_set_features_restarts_it() {
    let now = Instant::now();
    let mut c = Conv::connect_kato(target(), now, 1, 0, SUB1, HOST1);
    assert_eq!(c.t.next_timeout(), None);
    c.property_set(CC_ENABLE);
    c.admin(set_features(fid::KEEP_ALIVE_TIMER, 1000));
    assert_eq!(
        c.admin(get_features(fid::KEEP_ALIVE_TIMER, 0, 0)).0.dw0,
        1000
    );
    assert_eq!(c.t.next_timeout(), Some(now + Duration::from_secs(1)));
}

/// A discovery controller connected with KATO 0 runs with the default (as nvmet and
/// SPDK do), and Get Features says so; Connect's KATO is rounded up to 100 ms too.
#[test]
fn discovery_kato_zero_reads_back_the_default_and_connect_kato_is_rounded() {
    let now = Instant::now();
    let mut c = Conv::connect_kato(target(), now, 1, 0, DISCOVERY_NQN, HOST1);
    c.property_set(CC_ENABLE);
    assert_eq!(
        c.admin(get_features(fid::KEEP_ALIVE_TIMER, 0, 0)).0.dw0,
        TargetOptions::default().kato_default_ms
    );
    let mut c = Conv::connect_kato(c.t, now, 2, 4321, SUB1, HOST1);
    c.property_set(CC_ENABLE);
    assert_eq!(
        c.admin(get_features(fid::KEEP_ALIVE_TIMER, 0, 0)).0.dw0,
        4400
    );
    assert_eq!(c.t.next_timeout(), Some(now + Duration::from_millis(4400)));
}

#[test]
fn aer_completes_on_namespace_add() {
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    c.admin(set_features(fid::ASYNC_EVENT_CONFIG, 1 << 8));
    let mut buf = [0u8; 0];
    assert_eq!(
        c.exec_on(c.admin, admin_sqe(admin::ASYNC_EVENT_REQUEST, 0), &mut buf),
        Outcome::Deferred
    );
    let aer_cid = c.cid;
    c.t.add_namespace(SUB1, ns(2)).unwrap();
    let actions = c.t.take_actions();
    assert_eq!(actions.len(), 1);
    let Action::CompleteHeld { queue, key, cqe } = actions[0] else {
        panic!("{actions:?}")
    };
    assert_eq!((queue, key, cqe.cid), (c.admin, 100, aer_cid));
    assert_eq!(cqe.dw0, 0x04_00_02, "notice, NS attribute changed, log 04h");
    // Masked until the log is read: no AER pending, and this one is not queued.
    c.t.add_namespace(SUB1, ns(3)).unwrap();
    assert!(c.t.take_actions().is_empty());
    // RAE keeps it masked and the list intact.
    let (_, data) = c.admin(get_log(lid::CHANGED_NS_LIST, 4096, 0, true, 0xffff_ffff));
    assert_eq!(
        NamespaceList::read_from_bytes(&data).unwrap().to_ids(),
        vec![2, 3]
    );
    let (_, data) = c.admin(get_log(lid::CHANGED_NS_LIST, 4096, 0, false, 0xffff_ffff));
    assert_eq!(
        NamespaceList::read_from_bytes(&data).unwrap().to_ids(),
        vec![2, 3]
    );
    let (_, data) = c.admin(get_log(lid::CHANGED_NS_LIST, 4096, 0, false, 0xffff_ffff));
    assert!(NamespaceList::read_from_bytes(&data)
        .unwrap()
        .to_ids()
        .is_empty());
    // Unmasked: an event with no AER outstanding waits for the next AER.
    c.t.remove_namespace(SUB1, 3).unwrap();
    assert!(c.t.take_actions().is_empty());
    match c.exec_on(c.admin, admin_sqe(admin::ASYNC_EVENT_REQUEST, 0), &mut buf) {
        Outcome::Complete { cqe, .. } => assert_eq!(cqe.dw0, 0x04_00_02),
        o => panic!("{o:?}"),
    }
    // AERL + 1 = 4 held, the fifth is refused.
    for _ in 0..4 {
        assert_eq!(
            c.exec_on(c.admin, admin_sqe(admin::ASYNC_EVENT_REQUEST, 0), &mut buf),
            Outcome::Deferred
        );
    }
    match c.exec_on(c.admin, admin_sqe(admin::ASYNC_EVENT_REQUEST, 0), &mut buf) {
        Outcome::Complete { cqe, .. } => {
            assert_eq!(cqe.status(), Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED)
        }
        o => panic!("{o:?}"),
    }
    // CC.EN = 0 keeps the held AERs (nvmet does too): nothing is answered at the reset,
    // and after the host enables again and asks for notices, the next event completes
    // one of them; a shutdown keeps them as well.
    let _ = c.t.take_actions();
    let held: Vec<u16> = (0..4).map(|i| aer_cid + 2 + i).collect();
    c.property_set(0);
    assert!(c.t.take_actions().is_empty(), "no completion at the reset");
    assert_eq!(c.property_get(fabrics::property::CSTS, false).dw0, 0);
    c.property_set(CC_ENABLE);
    c.admin(set_features(fid::ASYNC_EVENT_CONFIG, 1 << 8));
    c.t.add_namespace(SUB1, ns(5)).unwrap();
    let actions = c.t.take_actions();
    assert!(
        matches!(&actions[..], [Action::CompleteHeld { cqe, .. }] if held.contains(&cqe.cid) && cqe.dw0 == 0x04_00_02),
        "{actions:?} (held {held:?})"
    );
    c.property_set(CC_ENABLE | 1 << 14);
    assert!(c.t.take_actions().is_empty(), "no completion at shutdown");
}

/// A reset (CC.EN=0) or a shutdown disconnects the I/O queues, and CSTS says it is
/// done (RDY=0, SHST complete) only once the transport reported them closed: until
/// then their I/O may still run, on whatever IO threads they are.
#[test]
fn reset_and_shutdown_disconnect_io_queues() {
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    c.io_connect(1, 201);
    c.property_set(0);
    let q1 = QueueRef {
        cntlid: c.admin.cntlid,
        qid: 1,
    };
    assert_eq!(
        c.t.take_actions(),
        vec![Action::Disconnect {
            queue: q1,
            key: 201
        }]
    );
    // The reset is reported (logged at info by the daemon).
    let (notices, _) = c.t.take_notices();
    assert!(
        notices.iter().any(|n| matches!(n,
            Notice::ControllerReset(r) if r.cntlid == q1.cntlid && r.io_queues == 1
                && r.hostnqn == HOST1 && r.subnqn == SUB1)),
        "{notices:?}"
    );
    let csts = |c: &mut Conv| c.property_get(fabrics::property::CSTS, false).dw0;
    assert_eq!(csts(&mut c) & 1, 1, "RDY until queue 1 is closed");
    c.t.queue_closed(q1, 201);
    assert_eq!(csts(&mut c) & 1, 0, "reset done");
    c.property_set(CC_ENABLE);
    c.io_connect(1, 211);
    // Shutdown (SHN = 01b).
    c.property_set(CC_ENABLE | 1 << 14);
    assert_eq!(c.t.take_actions().len(), 1);
    assert_eq!(
        csts(&mut c) & 0xc,
        0x4,
        "shutdown occurring until queue 1 is closed"
    );
    c.t.queue_closed(q1, 211);
    assert_eq!(csts(&mut c) & 0xc, 0x8);
    // Bad CC (MPS 1) sets CFS instead of RDY.
    c.property_set(0);
    c.property_set(CC_ENABLE | 1 << 7);
    assert_eq!(c.property_get(fabrics::property::CSTS, false).dw0, 2);
}

#[test]
fn io_queue_commands_by_queue_type() {
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    let (_, ok) = c.io_connect(1, 201);
    let ioq = ok.unwrap().queue();
    let mut buf = vec![0u8; 4096];
    let status = |o: Outcome| match o {
        Outcome::Complete { cqe, .. } => cqe.status(),
        o => panic!("{o:?}"),
    };
    // A WRITE opcode on the admin queue is Create I/O SQ: not on fabrics.
    assert_eq!(
        c.admin(admin_sqe(io::WRITE, 1)).0.status(),
        Status::INVALID_OPCODE
    );
    // Identify's opcode on an I/O queue is not an I/O command.
    assert_eq!(
        status(c.exec_on(ioq, identify(1, 0, 0), &mut buf)),
        Status::INVALID_OPCODE
    );
    assert_eq!(
        status(c.exec_on(ioq, admin_sqe(io::READ, 9), &mut buf)),
        Status::INVALID_NAMESPACE
    );
    assert_eq!(
        status(c.exec_on(ioq, admin_sqe(io::FLUSH, 0xffff_ffff), &mut buf)),
        Status::INVALID_NAMESPACE
    );
    assert_eq!(
        status(c.exec_on(ioq, admin_sqe(io::READ, 1), &mut buf)),
        Status::NAMESPACE_NOT_READY
    );
    assert_eq!(
        status(c.exec_on(ioq, admin_sqe(0x7e, 1), &mut buf)),
        Status::INVALID_OPCODE
    );
    // Property Get is an admin-queue command.
    let p = PropertyCommand {
        attrib: 0,
        offset: 0x14,
        value: 0,
    }
    .to_sqe(0, false);
    assert_eq!(status(c.exec_on(ioq, p, &mut buf)), Status::INVALID_OPCODE);
    // Errors land in the error log, newest first.
    let (_, data) = c.admin(get_log(lid::ERROR_INFORMATION, 128, 0, false, 0));
    let e = crate::spec::log::ErrorInformationEntry::read_from_bytes(&data[..64]).unwrap();
    assert_eq!(e.status.get() >> 1, Status::INVALID_OPCODE.to_field() >> 1);
    assert_eq!(e.sqid.get(), 1);
    // Disconnect on the I/O queue: success, then the transport closes it.
    let mut d = Sqe {
        nsid: opcodes::fabrics::DISCONNECT as u32,
        ..Default::default()
    };
    d.set_opcode_cid(opcodes::FABRICS, 0);
    assert_eq!(status(c.exec_on(ioq, d, &mut buf)), Status::SUCCESS);
    assert_eq!(
        c.t.take_actions(),
        vec![Action::Disconnect {
            queue: ioq,
            key: 201
        }]
    );
    assert!(c.t.queue_closed(ioq, 201).is_empty());
    assert!(c.io_connect(1, 202).0.status().is_success());
}

#[test]
fn connect_rejections() {
    let mut t = target();
    let now = Instant::now();
    let admin = connect_sqe(0, 31, 5000);
    let mut go = |sqe: &Sqe, data: &[u8]| {
        let (cqe, ok) = t.connect(now, 1, &origin(), sqe, data);
        assert!(ok.is_none());
        (cqe.status(), cqe.dw0)
    };
    let invalid = Status::CONNECT_INVALID_PARAMETERS;
    // Host not on the allow list: Connect Invalid Host, IPO = HOSTNQN in the data.
    assert_eq!(
        go(&admin, &connect_data(0xffff, SUB1, HOST2)),
        (Status::CONNECT_INVALID_HOST, 1 << 16 | 512)
    );
    assert_eq!(
        go(&admin, &connect_data(0xffff, SUB2, HOST1)),
        (invalid, 1 << 16 | 256)
    );
    // Garbage NQNs.
    let mut d = connect_data(0xffff, SUB1, HOST1);
    d[256..512].fill(b'a');
    assert_eq!(go(&admin, &d), (invalid, 1 << 16 | 256));
    assert_eq!(
        go(
            &admin,
            &connect_data(0xffff, SUB1, "iqn.2000-01.com.example:x")
        ),
        (invalid, 1 << 16 | 512)
    );
    let mut d = connect_data(0xffff, SUB1, HOST1);
    d[520] = 0xff;
    assert_eq!(go(&admin, &d), (invalid, 1 << 16 | 512));
    // Static controller IDs, admin queue size, format, short data.
    assert_eq!(
        go(&admin, &connect_data(1, SUB1, HOST1)),
        (invalid, 1 << 16 | 16)
    );
    assert_eq!(
        go(&connect_sqe(0, 0, 0), &connect_data(0xffff, SUB1, HOST1)),
        (invalid, 44)
    );
    assert_eq!(
        go(&connect_sqe(0, 4096, 0), &connect_data(0xffff, SUB1, HOST1)),
        (invalid, 44)
    );
    let mut bad = connect_sqe(0, 31, 0);
    bad.cdw10 |= 1;
    assert_eq!(
        go(&bad, &connect_data(0xffff, SUB1, HOST1)).0,
        Status::CONNECT_INCOMPATIBLE_FORMAT
    );
    assert_eq!(go(&admin, &[0u8; 100]).0, Status::DATA_SGL_LENGTH_INVALID);
    // Not a Connect at all.
    assert_eq!(
        go(&identify(1, 0, 0), &connect_data(0xffff, SUB1, HOST1)).0,
        Status::COMMAND_SEQUENCE_ERROR
    );
    // I/O queue for a controller that does not exist / on the discovery subsystem.
    assert_eq!(
        go(&connect_sqe(1, 31, 0), &connect_data(7, SUB1, HOST1)),
        (invalid, 1 << 16 | 16)
    );
    assert_eq!(
        go(
            &connect_sqe(1, 31, 0),
            &connect_data(7, DISCOVERY_NQN, HOST1)
        ),
        (invalid, 42)
    );

    // An I/O Connect from another host is refused.
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    c.t.set_hosts(SUB1, true, vec![]);
    let cntlid = c.admin.cntlid;
    let (cqe, _) = c.t.connect(
        c.now,
        5,
        &origin(),
        &connect_sqe(1, 31, 0),
        &connect_data(cntlid, SUB1, HOST2),
    );
    assert_eq!((cqe.status(), cqe.dw0), (invalid, 1 << 16 | 16));
    // SQSIZE 0 and above MQES.
    let (cqe, _) = c.t.connect(
        c.now,
        5,
        &origin(),
        &connect_sqe(1, 0, 0),
        &connect_data(cntlid, SUB1, HOST1),
    );
    assert_eq!((cqe.status(), cqe.dw0), (invalid, 44));
    let (cqe, _) = c.t.connect(
        c.now,
        5,
        &origin(),
        &connect_sqe(1, 128, 0),
        &connect_data(cntlid, SUB1, HOST1),
    );
    assert_eq!((cqe.status(), cqe.dw0), (invalid, 44));
    // Taking HOST1 off the list disconnects its controller.
    let actions = c.t.set_hosts(SUB1, false, vec![HOST2.to_string()]);
    assert_eq!(
        actions,
        vec![Action::Disconnect {
            queue: c.admin,
            key: 100
        }]
    );
}

fn discovery_log(c: &mut Conv) -> (DiscoveryLogHeader, Vec<DiscoveryLogEntry>) {
    let (cqe, data) = c.admin(get_log(lid::DISCOVERY, 1024, 0, false, 0));
    assert!(cqe.status().is_success());
    let h = DiscoveryLogHeader::read_from_bytes(&data).unwrap();
    let n = h.numrec.get() as u32;
    let mut entries = Vec::new();
    if n > 0 {
        // Linux reads the entries from offset 1024 once it knows NUMREC.
        let (cqe, data) = c.admin(get_log(lid::DISCOVERY, 1024 * n, 1024, false, 0));
        assert!(cqe.status().is_success());
        entries = data
            .chunks(1024)
            .map(|e| DiscoveryLogEntry::read_from_bytes(e).unwrap())
            .collect();
    }
    (h, entries)
}

#[test]
fn discovery_log_paging_filtering_and_genctr() {
    let mut t = target();
    t.add_listener(rdma());
    t.add_subsystem(SubsystemConfig {
        listeners: Some(vec![tcp()]),
        ..subsystem(SUB2, &[])
    })
    .unwrap();
    let mut c2 = Conv::enabled(t, DISCOVERY_NQN, HOST2);
    let (_, data) = c2.admin(identify(cns::CONTROLLER, 0, 0));
    let id = IdentifyController::read_from_bytes(&data).unwrap();
    assert_eq!(id.cntrltype, 2);
    assert_ne!(id.oaes.get() & (1 << 31), 0);
    assert_eq!(fabrics::nul_terminated_str(&id.subnqn), Some(DISCOVERY_NQN));
    assert_eq!(
        c2.admin(identify(cns::ACTIVE_NS_LIST, 0, 0)).0.status(),
        Status::INVALID_FIELD
    );
    assert_eq!(
        c2.admin(get_log(lid::SMART_HEALTH, 512, 0, false, 0))
            .0
            .status(),
        Status::INVALID_LOG_PAGE
    );

    // HOST2 sees SUB2 on TCP only, plus the discovery subsystem on both listeners.
    let (h, e) = discovery_log(&mut c2);
    assert_eq!(h.numrec.get(), 3);
    assert_eq!(e[0].subtype, disc::SUBTYPE_NVME);
    assert_eq!(fabrics::nul_terminated_str(&e[0].subnqn), Some(SUB2));
    assert_eq!(
        (e[0].trtype, e[0].adrfam, e[0].portid.get()),
        (disc::TRTYPE_TCP, disc::ADRFAM_IPV4, 1)
    );
    assert_eq!(&e[0].trsvcid[..5], b"4420 ");
    assert_eq!(&e[0].traddr[..9], b"10.0.0.1 ");
    assert_eq!((e[0].cntlid.get(), e[0].asqsz.get()), (0xffff, 32));
    assert_eq!(e[1].subtype, disc::SUBTYPE_CURRENT_DISCOVERY);
    assert_eq!(e[2].subtype, disc::SUBTYPE_CURRENT_DISCOVERY);
    assert_eq!(
        (e[2].trtype, e[2].adrfam),
        (disc::TRTYPE_RDMA, disc::ADRFAM_IPV6)
    );
    assert_eq!(
        &e[2].tsas[..3],
        &[1, 1, 1],
        "QPTYPE connected, PRTYPE none, CMS rdma_cm"
    );
    assert_ne!(e[2].eflags.get() & disc::EFLAGS_EPCSD, 0);
    // Reads past the end are refused, unaligned offsets too; short reads work.
    assert_eq!(
        c2.admin(get_log(lid::DISCOVERY, 4, 8192, false, 0))
            .0
            .status(),
        Status::INVALID_FIELD
    );
    assert_eq!(
        c2.admin(get_log(lid::DISCOVERY, 4, 2, false, 0)).0.status(),
        Status::INVALID_FIELD
    );
    let (cqe, data) = c2.admin(get_log(lid::DISCOVERY, 16, 0, false, 0));
    assert!(cqe.status().is_success());
    assert_eq!(data.len(), 16);
    assert_eq!(u64::from_le_bytes(data[8..16].try_into().unwrap()), 3);

    // HOST1, allowed on SUB1 too, sees it on both listeners.
    // (The first host's admin queue closes first: Conv reuses its transport key.)
    let Conv { mut t, admin, .. } = c2;
    t.queue_closed(admin, 100);
    let mut c1 = Conv::enabled(t, DISCOVERY_NQN, HOST1);
    let (h1, e1) = discovery_log(&mut c1);
    assert_eq!(h1.numrec.get(), 5);
    assert_eq!(h1.genctr, h.genctr);
    assert_eq!(fabrics::nul_terminated_str(&e1[0].subnqn), Some(SUB1));

    // Discovery log change notices, once enabled.
    c1.admin(set_features(fid::ASYNC_EVENT_CONFIG, 1 << 31));
    let mut buf = [0u8; 0];
    assert_eq!(
        c1.exec_on(c1.admin, admin_sqe(admin::ASYNC_EVENT_REQUEST, 0), &mut buf),
        Outcome::Deferred
    );
    let g0 = h1.genctr.get();
    c1.t.remove_listener(&rdma());
    let actions = c1.t.take_actions();
    assert!(matches!(actions[..], [Action::CompleteHeld { cqe, .. }] if cqe.dw0 == 0x70_f0_02));
    let (h1, e1) = discovery_log(&mut c1);
    assert!(h1.genctr.get() > g0);
    assert_eq!(e1.len(), 3);
    let g1 = h1.genctr.get();
    c1.t.set_hosts(SUB1, false, vec![HOST2.to_string()]);
    let (h1, e1) = discovery_log(&mut c1);
    assert!(h1.genctr.get() > g1);
    assert_eq!(e1.len(), 2);
}

struct Counters;
impl CounterSource for Counters {
    fn namespace_counters(&self, subnqn: &str, nsid: u32) -> IoCounters {
        assert_eq!(subnqn, SUB1);
        IoCounters {
            read_cmds: 10 * nsid as u64,
            write_cmds: 1,
            read_bytes: 512 * 1000 * nsid as u64,
            write_bytes: 1,
            media_errors: 2,
        }
    }
}

#[test]
fn smart_log_sums_counters() {
    let mut t = target();
    t.add_namespace(SUB1, ns(2)).unwrap();
    let mut c = Conv::enabled(t, SUB1, HOST1);
    let mut buf = vec![0u8; 512];
    let mut read = |c: &mut Conv, nsid| {
        let o = c.t.execute(
            c.now,
            c.admin,
            &get_log(lid::SMART_HEALTH, 512, 0, false, nsid),
            &mut buf,
            &Counters,
        );
        assert!(
            matches!(o, Outcome::Complete { cqe, data_len: 512 } if cqe.status().is_success()),
            "{o:?}"
        );
        SmartLog::read_from_bytes(&buf).unwrap()
    };
    let all = read(&mut c, 0xffff_ffff);
    assert_eq!(all.host_read_commands.get(), 30);
    assert_eq!(all.data_units_read.get(), 3);
    assert_eq!(all.data_units_written.get(), 1, "2 bytes, rounded up");
    assert_eq!(all.media_errors.get(), 4);
    let one = read(&mut c, 2);
    assert_eq!(one.host_read_commands.get(), 20);
    assert_eq!(one.data_units_read.get(), 2);
    let (cqe, _) = c.admin(get_log(lid::SMART_HEALTH, 512, 0, false, 9));
    assert_eq!(cqe.status(), Status::INVALID_NAMESPACE);
    // Firmware slot and effects logs; an unknown log.
    let (_, data) = c.admin(get_log(lid::FIRMWARE_SLOT, 512, 0, false, 0));
    assert_eq!(data[0], 1);
    let (_, data) = c.admin(get_log(lid::COMMANDS_EFFECTS, 4096, 0, false, 0));
    assert_eq!(data[4 * admin::IDENTIFY as usize], 1);
    assert_eq!(data[1024 + 4 * io::WRITE as usize], 3);
    assert_eq!(
        c.admin(get_log(0x42, 512, 0, false, 0)).0.status(),
        Status::INVALID_LOG_PAGE
    );
}

#[test]
fn features_round_trip() {
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    for (f, v) in [
        (fid::ARBITRATION, 3u32),
        (fid::TEMPERATURE_THRESHOLD, 350),
        (fid::ERROR_RECOVERY, 20),
        (fid::WRITE_ATOMICITY, 1),
        (fid::ASYNC_EVENT_CONFIG, 1 << 8),
    ] {
        assert!(
            c.admin(set_features(f, v)).0.status().is_success(),
            "set {f:#x}"
        );
        assert_eq!(c.admin(get_features(f, 0, 0)).0.dw0, v, "get {f:#x}");
    }
    assert_eq!(
        c.admin(get_features(fid::TEMPERATURE_THRESHOLD, 1, 0))
            .0
            .dw0,
        343
    );
    assert_eq!(
        c.admin(get_features(fid::VOLATILE_WRITE_CACHE, 0, 0)).0.dw0,
        1
    );
    assert_eq!(
        c.admin(set_features(fid::VOLATILE_WRITE_CACHE, 0))
            .0
            .status(),
        Status::FEATURE_NOT_CHANGEABLE
    );
    assert_eq!(
        c.admin(set_features(fid::POWER_MANAGEMENT, 1)).0.status(),
        Status::INVALID_FIELD
    );
    assert_eq!(
        c.admin(set_features(fid::HOST_IDENTIFIER, 1)).0.status(),
        Status::COMMAND_SEQUENCE_ERROR
    );
    assert_eq!(
        c.admin(get_features(fid::HOST_IDENTIFIER, 0, 0)).0.status(),
        Status::INVALID_FIELD
    );
    assert_eq!(
        c.admin(set_features(0x7d, 0)).0.status(),
        Status::INVALID_FIELD
    );
    assert_eq!(
        c.admin(get_features(fid::ARBITRATION, 3, 0)).0.dw0,
        4,
        "changeable"
    );
    assert_eq!(
        c.admin(get_features(fid::VOLATILE_WRITE_CACHE, 3, 0)).0.dw0,
        0,
        "the cache cannot be turned off: not changeable"
    );
    // Prohibited on fabrics controllers (NVMe Base 2.1), as nvmet answers them.
    for f in [fid::INTERRUPT_COALESCING, fid::INTERRUPT_VECTOR_CONFIG] {
        assert_eq!(
            c.admin(set_features(f, 1)).0.status(),
            Status::INVALID_FIELD
        );
        assert_eq!(
            c.admin(get_features(f, 0, 0)).0.status(),
            Status::INVALID_FIELD
        );
    }
    // Keep Alive Timeout: rounded up to the 100 ms granularity (KAS 1), and read back so.
    for (set, runs) in [(1, 100), (150, 200), (1000, 1000), (0, 0)] {
        assert!(c
            .admin(set_features(fid::KEEP_ALIVE_TIMER, set))
            .0
            .status()
            .is_success());
        assert_eq!(
            c.admin(get_features(fid::KEEP_ALIVE_TIMER, 0, 0)).0.dw0,
            runs,
            "KATO {set}"
        );
    }
    let mut sv = set_features(fid::ARBITRATION, 0);
    sv.cdw10 |= 1 << 31;
    assert_eq!(c.admin(sv).0.status(), Status::FEATURE_ID_NOT_SAVEABLE);
    // A subsystem without a volatile cache: feature 06h is Invalid Field.
    let mut t = Target::new(TargetOptions::default());
    t.add_subsystem(subsystem(SUB2, &[])).unwrap();
    t.add_namespace(
        SUB2,
        NamespaceConfig {
            volatile_write_cache: false,
            ..ns(1)
        },
    )
    .unwrap();
    let mut c = Conv::enabled(t, SUB2, HOST1);
    assert_eq!(
        c.admin(get_features(fid::VOLATILE_WRITE_CACHE, 0, 0))
            .0
            .status(),
        Status::INVALID_FIELD
    );
}

#[test]
fn config_errors() {
    let mut t = target();
    assert!(matches!(
        t.add_subsystem(subsystem(SUB1, &[])),
        Err(TargetError::DuplicateSubsystem(_))
    ));
    assert!(matches!(
        t.add_subsystem(subsystem("bogus", &[])),
        Err(TargetError::InvalidNqn(_))
    ));
    assert_eq!(
        t.add_subsystem(subsystem(DISCOVERY_NQN, &[])),
        Err(TargetError::DiscoverySubsystem)
    );
    assert_eq!(
        t.add_namespace(SUB1, ns(1)),
        Err(TargetError::DuplicateNamespace(1))
    );
    assert!(t
        .add_namespace(
            SUB1,
            NamespaceConfig {
                block_size: 1000,
                ..ns(4)
            }
        )
        .is_err());
    assert!(t.add_namespace(SUB1, ns(0)).is_err());
    assert_eq!(
        t.add_namespace(DISCOVERY_NQN, ns(1)),
        Err(TargetError::DiscoverySubsystem)
    );
    assert_eq!(
        t.remove_namespace(SUB1, 9),
        Err(TargetError::UnknownNamespace(9))
    );
    assert!(t.remove_subsystem(DISCOVERY_NQN).is_empty());
    let c = Conv::enabled(t, SUB1, HOST1);
    let Conv { mut t, admin, .. } = c;
    assert_eq!(
        t.remove_subsystem(SUB1),
        vec![Action::Disconnect {
            queue: admin,
            key: 100
        }]
    );
}

fn arb_sqe() -> impl Strategy<Value = Sqe> {
    let opcode = prop_oneof![
        Just(opcodes::FABRICS),
        Just(admin::IDENTIFY),
        Just(admin::GET_LOG_PAGE),
        Just(admin::SET_FEATURES),
        Just(admin::GET_FEATURES),
        Just(admin::ASYNC_EVENT_REQUEST),
        any::<u8>()
    ];
    (opcode, proptest::collection::vec(any::<u8>(), 64), 0u32..3).prop_map(|(op, bytes, small)| {
        let mut s = Sqe::from_bytes(&bytes).unwrap();
        s.set_opcode_cid(op, s.cid());
        if small > 0 {
            // Keep some NSIDs and lengths in the interesting range.
            s.nsid %= 4;
            s.cdw10 = (s.cdw10 & 0x00ff_ffff) | ((s.cdw10 >> 24) % 4) << 16;
            s.cdw11 &= 0xff00_00ff;
            s.cdw12 = (s.cdw12 % 4096) & !3;
            s.cdw13 = 0;
        }
        s
    })
}

proptest! {
    #[test]
    fn random_capsules_never_panic(
        sqes in proptest::collection::vec((arb_sqe(), 0u16..3, 0usize..6000, any::<bool>()), 1..40),
        connect_bytes in proptest::collection::vec(any::<u8>(), 0..1100),
    ) {
        let mut t = target();
        t.add_listener(rdma());
        let mut c = Conv::enabled(t, SUB1, HOST1);
        c.admin(set_features(fid::ASYNC_EVENT_CONFIG, 1 << 8));
        c.io_connect(1, 201);
        let _ = c.t.connect(c.now, 9, &origin(), &arb_sqe_fixed(&connect_bytes), &connect_bytes);
        for (i, (sqe, qid, len, add_ns)) in sqes.into_iter().enumerate() {
            c.now += Duration::from_millis(100);
            let mut data = vec![0u8; len];
            let q = QueueRef { cntlid: c.admin.cntlid, qid };
            match c.t.execute(c.now, q, &sqe, &mut data, &Counters) {
                Outcome::Complete { data_len, .. } => prop_assert!(data_len as usize <= data.len()),
                Outcome::Deferred | Outcome::Dropped => {}
            }
            let _ = c.t.connect(c.now, 50 + i as u64, &origin(), &sqe, &data);
            if add_ns {
                let _ = c.t.add_namespace(SUB1, ns(2 + i as u32));
            }
            let _ = c.t.take_actions();
            let _ = c.t.poll_timeouts(c.now);
        }
    }
}

fn arb_sqe_fixed(bytes: &[u8]) -> Sqe {
    let mut b = [0u8; 64];
    let n = bytes.len().min(64);
    b[..n].copy_from_slice(&bytes[..n]);
    let mut s = Sqe::from_bytes(&b).unwrap();
    s.set_opcode_cid(opcodes::FABRICS, 1);
    s.nsid = opcodes::fabrics::CONNECT as u32;
    s
}

/// Connect data with valid or broken NQNs, CNTLIDs and HOSTIDs, or raw bytes of any length.
fn arb_connect_data() -> impl Strategy<Value = Vec<u8>> {
    let nqn = prop_oneof![
        Just(SUB1.to_string()),
        Just(SUB2.to_string()),
        Just(DISCOVERY_NQN.to_string()),
        Just(HOST1.to_string()),
        Just(HOST2.to_string()),
        "\\PC{0,300}",
    ];
    let cntlid = prop_oneof![Just(0xffffu16), Just(1), Just(2), any::<u16>()];
    let hostid = prop_oneof![Just(HOSTID1), any::<[u8; 16]>()];
    prop_oneof![
        (hostid, cntlid, nqn.clone(), nqn)
            .prop_map(|(id, c, s, h)| { ConnectData::new(id, c, &s, &h).as_bytes().to_vec() }),
        proptest::collection::vec(any::<u8>(), 0..1100),
    ]
}

proptest! {
    /// Connects on a target with an enabled SUB1 controller (CNTLID 1): whatever the SQE
    /// and data, success and ConnectOk go together, DW0 is the CNTLID (or IATTR/IPO),
    /// and a queue is never granted twice.
    #[test]
    fn random_connects_are_consistent(
        attempts in proptest::collection::vec(
            (any::<u16>(), prop_oneof![Just(0u16), Just(1), Just(2), Just(64), any::<u16>()],
             any::<u16>(), any::<u8>(), any::<u32>(), any::<bool>(), arb_connect_data()),
            1..12),
    ) {
        let mut t = target();
        t.add_subsystem(subsystem(SUB2, &[])).unwrap();
        let c = Conv::enabled(t, SUB1, HOST1);
        let mut t = c.t;
        let mut granted = std::collections::HashSet::new();
        granted.insert(c.admin);
        for (i, (recfmt, qid, sqsize, cattr, kato, valid_recfmt, data)) in attempts.into_iter().enumerate() {
            let cmd = ConnectCommand {
                recfmt: if valid_recfmt { 0 } else { recfmt },
                qid,
                sqsize,
                cattr,
                kato,
            };
            let sqe = cmd.to_sqe(i as u16);
            let (cqe, ok) = t.connect(c.now, 500 + i as u64, &origin(), &sqe, &data);
            prop_assert_eq!(cqe.cid, i as u16);
            match ok {
                Some(ok) => {
                    prop_assert!(cqe.status().is_success());
                    prop_assert_eq!(cqe.dw0, ok.cntlid as u32);
                    prop_assert_eq!(ok.qid, qid);
                    prop_assert!((1..=MAX_CNTLID).contains(&ok.cntlid));
                    prop_assert!(granted.insert(ok.queue()), "granted twice: {:?}", ok.queue());
                    prop_assert_eq!(t.subsystem_of(ok.cntlid), Some(ok.subnqn.as_str()));
                }
                None => {
                    prop_assert!(!cqe.status().is_success());
                    prop_assert_eq!(cqe.dw0 >> 17, 0, "only IATTR bit 0 and IPO in DW0");
                }
            }
        }
    }

    /// Admin commands with any fields and any buffer: the CQE echoes CID and SQID, data
    /// fits the buffer, errors carry none, only AERs are held.
    #[test]
    fn admin_commands_answer_within_the_buffer(
        cmds in proptest::collection::vec((arb_sqe(), 0usize..9000), 1..30),
        discovery: bool,
    ) {
        let mut t = target();
        t.add_listener(rdma());
        let sub = if discovery { DISCOVERY_NQN } else { SUB1 };
        let mut c = Conv::enabled(t, sub, HOST1);
        for (sqe, len) in cmds {
            let mut data = vec![0u8; len];
            match c.t.execute(c.now, c.admin, &sqe, &mut data, &Counters) {
                Outcome::Complete { cqe, data_len } => {
                    prop_assert_eq!(cqe.cid, sqe.cid());
                    prop_assert_eq!(cqe.sqid, 0);
                    prop_assert!(data_len as usize <= len);
                    if !cqe.status().is_success() {
                        prop_assert_eq!(data_len, 0);
                    }
                }
                Outcome::Deferred => {
                    prop_assert_eq!(sqe.opcode(), admin::ASYNC_EVENT_REQUEST);
                    prop_assert!(!sqe.is_fabrics());
                }
                Outcome::Dropped => prop_assert!(false, "a live controller dropped a command"),
            }
            for a in c.t.take_actions() {
                if let Action::Disconnect { queue, key } = a {
                    c.t.queue_closed(queue, key);
                }
            }
            if c.t.subsystem_of(c.admin.cntlid).is_none() {
                break;
            }
        }
    }
}

// ------------------------------------------------------------------------------------
// Host behaviour of user-space hosts and conformance fixes: each of these failed before
// the fix it names.

fn refusals(t: &mut Target) -> Vec<Refusal> {
    t.take_notices()
        .0
        .into_iter()
        .filter_map(|n| match n {
            Notice::Refused(r) => Some(r),
            _ => None,
        })
        .collect()
}

/// CC as SPDK's host writes it when CAP.CSS bit 6 is set: CSS 110b (all supported I/O
/// command sets), IOSQES 6, IOCQES 4.
const CC_ENABLE_CSS_110: u64 = CC_ENABLE | 0b110 << 4;

#[test]
fn cap_advertises_css_nvm_and_iocs_and_cc_css_110b_enables() {
    let mut c = Conv::connect(target(), SUB1, HOST1);
    let cap = c.property_get(fabrics::property::CAP, true);
    let cap = cap.dw0 as u64 | (cap.dw1 as u64) << 32;
    assert_ne!(cap & fabrics::cap::CSS_NVM, 0, "CAP.CSS bit 0");
    assert_ne!(cap & fabrics::cap::CSS_IOCS, 0, "CAP.CSS bit 6");
    c.property_set(CC_ENABLE_CSS_110);
    assert_eq!(
        c.property_get(fabrics::property::CSTS, false).dw0,
        csts::RDY,
        "CC.CSS 110b must enable, not CFS"
    );
    assert!(refusals(&mut c.t).is_empty());
    // What such a host asks next: I/O command set specific Identify for CSI 00h, the I/O
    // command set vector (CNS 1Ch), the effects log for CSI 00h, the supported logs.
    for (cns, nsid) in [
        (cns::CS_NAMESPACE, 1),
        (cns::CS_CONTROLLER, 0),
        (cns::IO_COMMAND_SET, 0),
    ] {
        let (cqe, data) = c.admin(identify(cns, nsid, csi::NVM));
        assert!(cqe.status().is_success(), "CNS {cns:#x}: {}", cqe.status());
        assert_eq!(data.len(), 4096);
    }
    let (_, data) = c.admin(identify(cns::IO_COMMAND_SET, 0, 0));
    assert_eq!(
        u64::from_le_bytes(data[..8].try_into().unwrap()),
        1,
        "NVM only"
    );
    assert!(data[8..].iter().all(|&b| b == 0));
    // CNTID (CDW10 31:16) naming another controller is Invalid Field.
    let mut other = identify(cns::IO_COMMAND_SET, 0, 0);
    other.cdw10 |= ((c.admin.cntlid + 1) as u32) << 16;
    assert_eq!(c.admin(other).0.status(), Status::INVALID_FIELD);
    let mut own = identify(cns::IO_COMMAND_SET, 0, 0);
    own.cdw10 |= (c.admin.cntlid as u32) << 16;
    assert!(c.admin(own).0.status().is_success());
    // Identify for another command set (CSI 02h, zoned) is Invalid Field.
    assert_eq!(
        c.admin(identify(cns::CS_CONTROLLER, 0, 2)).0.status(),
        Status::INVALID_FIELD
    );
    // Commands Supported and Effects per CSI: NVM with its I/O commands; Key Value and
    // Zoned (nvme-cli 2.13 asks for Zoned and fails the command if refused) with the
    // admin commands only; a reserved CSI is Invalid Log Page.
    let mut effects = get_log(lid::COMMANDS_EFFECTS, 4096, 0, false, 0);
    let (cqe, data) = c.admin(effects);
    assert!(cqe.status().is_success());
    assert_eq!(data[1024 + 4 * io::READ as usize] & 1, 1);
    let admin_part = data[..1024].to_vec();
    for other in [csi::KEY_VALUE, csi::ZONED] {
        effects.cdw14 = (other as u32) << 24;
        let (cqe, data) = c.admin(effects);
        assert!(cqe.status().is_success(), "CSI {other}: {}", cqe.status());
        assert_eq!(data[..1024], admin_part[..], "CSI {other}");
        assert!(
            data[1024..].iter().all(|&b| b == 0),
            "CSI {other}: no I/O command"
        );
    }
    effects.cdw14 = 3 << 24;
    assert_eq!(c.admin(effects).0.status(), Status::INVALID_LOG_PAGE);
    // Supported Log Pages.
    let (cqe, data) = c.admin(get_log(lid::SUPPORTED_LOG_PAGES, 1024, 0, false, 0));
    assert!(cqe.status().is_success());
    for l in [0u8, 1, 2, 3, 4, 5] {
        assert_eq!(data[l as usize * 4] & 1, 1, "LID {l:#x} supported");
    }
    assert_eq!(data[0x70 * 4], 0, "no discovery log on an I/O controller");
}

#[test]
fn unsupported_cc_values_set_cfs_and_say_why() {
    for (cc, field) in [
        (CC_ENABLE | 0b001 << 4, "CC.CSS"),
        (CC_ENABLE | 0b111 << 4, "CC.CSS"),
        (CC_ENABLE | 1 << 7, "CC.MPS"),
        (CC_ENABLE | 1 << 11, "CC.AMS"),
        (0x0045_0001, "CC.IOSQES"),
    ] {
        let mut c = Conv::connect(target(), SUB1, HOST1);
        c.property_set(cc);
        assert_eq!(
            c.property_get(fabrics::property::CSTS, false).dw0,
            csts::CFS
        );
        let r = refusals(&mut c.t);
        assert!(
            matches!(&r[..], [Refusal { reason: RefusalReason::InvalidControllerConfiguration { field: f, .. }, hostnqn: Some(h), subnqn: Some(s), qid: Some(0), .. }] if *f == field && h == HOST1 && s == SUB1),
            "{cc:#x}: {r:?}"
        );
        assert_eq!(r[0].reason.label(), "controller_fatal_status");
    }
}

#[test]
fn discovery_controller_enables_with_iosqes_and_iocqes_zero() {
    let mut c = Conv::connect(target(), DISCOVERY_NQN, HOST1);
    // What hosts that leave the I/O queue entry sizes alone on a discovery controller
    // write: EN only (CSS 000b), and EN with CSS 110b.
    c.property_set(1);
    assert_eq!(
        c.property_get(fabrics::property::CSTS, false).dw0,
        csts::RDY
    );
    c.property_set(0);
    c.property_set(1 | 0b110 << 4);
    assert_eq!(
        c.property_get(fabrics::property::CSTS, false).dw0,
        csts::RDY
    );
    // An I/O controller still needs them.
    let mut io = Conv::connect(target(), SUB1, HOST1);
    io.property_set(1);
    assert_eq!(
        io.property_get(fabrics::property::CSTS, false).dw0,
        csts::CFS
    );
}

#[test]
fn io_connect_with_another_hostid_reaches_the_controller() {
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    let cntlid = c.admin.cntlid;
    // A host that makes a random HOSTID per connection.
    for (qid, id) in [(1u16, [0x77u8; 16]), (2, [0x88; 16])] {
        let d = ConnectData::new(id, cntlid, SUB1, HOST1);
        let (cqe, ok) = c.t.connect(
            c.now,
            300 + qid as u64,
            &origin(),
            &connect_sqe(qid, 31, 0),
            d.as_bytes(),
        );
        assert!(cqe.status().is_success(), "qid {qid}: {}", cqe.status());
        assert_eq!(ok.unwrap().queue(), QueueRef { cntlid, qid });
    }
    // The controller's HOSTID stays the admin queue's.
    let (cqe, data) = c.admin(get_features(fid::HOST_IDENTIFIER, 0, 1));
    assert!(cqe.status().is_success());
    assert_eq!(data, HOSTID1);
    // Another host NQN with the right CNTLID is still refused (the subsystem lets it in).
    c.t.set_hosts(SUB1, true, vec![]);
    let d = ConnectData::new(HOSTID1, cntlid, SUB1, HOST2);
    let (cqe, _) =
        c.t.connect(c.now, 310, &origin(), &connect_sqe(3, 31, 0), d.as_bytes());
    assert_eq!(cqe.status(), Status::CONNECT_INVALID_PARAMETERS);
}

#[test]
fn empty_host_nqn_with_allow_any_host_is_accepted_and_noticed_once() {
    let mut t = target();
    t.add_subsystem(subsystem(SUB2, &[])).unwrap();
    for key in [1u64, 2] {
        let (cqe, ok) = t.connect(
            Instant::now(),
            key,
            &origin(),
            &connect_sqe(0, 31, 0),
            &connect_data(0xffff, SUB2, ""),
        );
        assert!(cqe.status().is_success(), "{}", cqe.status());
        assert_eq!(ok.unwrap().hostnqn, "");
    }
    let (notices, _) = t.take_notices();
    assert_eq!(
        notices,
        vec![Notice::EmptyHostNqnAccepted {
            subnqn: SUB2.into(),
            key: 1
        }],
        "one notice per subsystem"
    );
    // The discovery subsystem accepts it too (and notices it separately).
    let (cqe, _) = t.connect(
        Instant::now(),
        3,
        &origin(),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, DISCOVERY_NQN, ""),
    );
    assert!(cqe.status().is_success());
    assert_eq!(t.take_notices().0.len(), 1);
}

#[test]
fn empty_host_nqn_with_a_host_list_is_an_invalid_host() {
    let mut t = target();
    let (cqe, ok) = t.connect(
        Instant::now(),
        1,
        &origin(),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB1, ""),
    );
    assert!(ok.is_none());
    assert_eq!(
        (cqe.status(), cqe.dw0),
        (Status::CONNECT_INVALID_HOST, 1 << 16 | 512)
    );
    let r = refusals(&mut t);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].reason, RefusalReason::EmptyHostNqnNotAllowed);
    assert_eq!(r[0].reason.label(), "empty_host_nqn_not_allowed");
    assert_eq!(
        (r[0].hostnqn.as_deref(), r[0].subnqn.as_deref(), r[0].qid),
        (Some(""), Some(SUB1), Some(0))
    );
    assert_eq!(r[0].status, Some(Status::CONNECT_INVALID_HOST));
}

#[test]
fn every_connect_refusal_says_why() {
    let mut t = target();
    t.add_subsystem(SubsystemConfig {
        listeners: Some(vec![rdma()]),
        ..subsystem(SUB2, &[])
    })
    .unwrap();
    let now = Instant::now();
    let refuse = |t: &mut Target, sqe: Sqe, data: Vec<u8>| {
        let (cqe, ok) = t.connect(now, 9, &origin(), &sqe, &data);
        assert!(ok.is_none() && !cqe.status().is_success());
        let r = refusals(t);
        assert_eq!(r.len(), 1, "{r:?}");
        (r[0].reason.clone(), r[0].status)
    };
    let admin = connect_sqe(0, 31, 0);
    assert_eq!(
        refuse(&mut t, admin, connect_data(0xffff, SUB1, HOST2)).0,
        RefusalReason::HostNotAllowed
    );
    assert_eq!(
        refuse(
            &mut t,
            admin,
            connect_data(0xffff, "nqn.2024-01.io.example:nope", HOST1)
        )
        .0,
        RefusalReason::UnknownSubsystem
    );
    assert_eq!(
        refuse(&mut t, admin, connect_data(0xffff, SUB2, HOST1)).0,
        RefusalReason::SubsystemNotOnListener
    );
    assert_eq!(
        refuse(&mut t, admin, connect_data(0xffff, SUB1, "host")).0,
        RefusalReason::InvalidHostNqn
    );
    assert_eq!(
        refuse(&mut t, admin, connect_data(5, SUB1, HOST1)).0,
        RefusalReason::StaticControllerId { cntlid: 5 }
    );
    assert_eq!(
        refuse(
            &mut t,
            connect_sqe(0, 0, 0),
            connect_data(0xffff, SUB1, HOST1)
        )
        .0,
        RefusalReason::AdminQueueSize {
            sqsize: 0,
            max: MAX_ADMIN_SQSIZE
        }
    );
    assert_eq!(
        refuse(&mut t, connect_sqe(1, 31, 0), connect_data(9, SUB1, HOST1)),
        (
            RefusalReason::UnknownController { cntlid: 9 },
            Some(Status::CONNECT_INVALID_PARAMETERS)
        )
    );
    assert_eq!(
        refuse(&mut t, admin, vec![0; 10]).0,
        RefusalReason::ShortConnectData { len: 10 }
    );
}

#[test]
fn a_listener_restricted_subsystem_refuses_connects_on_other_listeners() {
    let mut t = target();
    t.add_listener(rdma());
    t.add_subsystem(SubsystemConfig {
        listeners: Some(vec![rdma()]),
        ..subsystem(SUB2, &[])
    })
    .unwrap();
    let now = Instant::now();
    let on = |l: ListenerInfo| QueueOrigin {
        local: Some(l.addr),
        listener: Some(l),
        peer: None,
    };
    let (cqe, ok) = t.connect(
        now,
        1,
        &on(tcp()),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB2, HOST1),
    );
    assert!(ok.is_none());
    assert_eq!(
        (cqe.status(), cqe.dw0),
        (Status::CONNECT_INVALID_PARAMETERS, 1 << 16 | 256),
        "as nvmet answers a Connect to a subsystem its port does not export"
    );
    assert_eq!(
        refusals(&mut t)[0].reason,
        RefusalReason::SubsystemNotOnListener
    );
    // Unknown origin: only subsystems open to every listener.
    let (_, ok) = t.connect(
        now,
        2,
        &QueueOrigin::default(),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB2, HOST1),
    );
    assert!(ok.is_none());
    let (cqe, ok) = t.connect(
        now,
        3,
        &on(rdma()),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB2, HOST1),
    );
    assert!(cqe.status().is_success() && ok.is_some());
    // The discovery subsystem is on every listener.
    let (_, ok) = t.connect(
        now,
        4,
        &on(tcp()),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, DISCOVERY_NQN, HOST1),
    );
    assert!(ok.is_some());
    // A reload moves the subsystem to the TCP listener: Connects follow at once.
    t.set_subsystem_listeners(SUB2, Some(vec![tcp()])).unwrap();
    let (_, ok) = t.connect(
        now,
        5,
        &on(tcp()),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB2, HOST1),
    );
    assert!(ok.is_some());
    let (_, ok) = t.connect(
        now,
        6,
        &on(rdma()),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB2, HOST1),
    );
    assert!(ok.is_none());
    assert_eq!(
        t.set_subsystem_listeners(DISCOVERY_NQN, None),
        Err(TargetError::DiscoverySubsystem)
    );
}

/// Rules a reload tightens apply to controllers connected before it: those the new
/// rules would refuse are retired, with why; the others stay.
#[test]
fn controllers_out_of_policy_after_a_reload_are_retired() {
    let both = |c: &mut Conv| c.t.retire_out_of_policy();
    // Nothing changed: nobody goes.
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    assert!(both(&mut c).is_empty());
    // The subsystem now requires authentication; the host connected without.
    c.t.set_subsystem_auth_required(SUB1, true);
    let gone = both(&mut c);
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert_eq!((gone[0].1.as_str(), gone[0].2.as_str()), (HOST1, SUB1));
    assert!(gone[0].3.contains("requires authentication"), "{gone:?}");
    assert!(
        c.t.take_actions()
            .iter()
            .any(|a| matches!(a, Action::Disconnect { queue, .. } if queue.qid == 0)),
        "its queues are disconnected"
    );
    assert!(both(&mut c).is_empty(), "retired once");
    // The listener it came through is removed.
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    c.t.remove_listener(&tcp());
    let gone = both(&mut c);
    assert!(
        gone.len() == 1 && gone[0].3.contains("listener was removed"),
        "{gone:?}"
    );
    // The listener now requires TLS; the controller came without.
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    c.t.set_listener_tls(&tcp(), ListenerTls::Optional);
    assert!(both(&mut c).is_empty(), "TLS optional: plaintext may stay");
    c.t.set_listener_tls(&tcp(), ListenerTls::Required);
    let gone = both(&mut c);
    assert!(
        gone.len() == 1 && gone[0].3.contains("requires TLS"),
        "{gone:?}"
    );
    // The subsystem left its listener.
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    c.t.add_listener(rdma());
    c.t.set_subsystem_listeners(SUB1, Some(vec![rdma()]))
        .unwrap();
    let gone = both(&mut c);
    assert!(
        gone.len() == 1 && gone[0].3.contains("no longer on its listener"),
        "{gone:?}"
    );
}

#[test]
fn a_second_connect_on_a_connected_queue_is_a_sequence_error() {
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    let before = c.t.report().controllers.len();
    // On the admin queue's connection (key 100): no second controller.
    let (cqe, ok) = c.t.connect(
        c.now,
        100,
        &origin(),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB1, HOST1),
    );
    assert!(ok.is_none());
    assert_eq!(cqe.status(), Status::COMMAND_SEQUENCE_ERROR);
    assert_eq!(c.t.report().controllers.len(), before);
    assert_eq!(
        refusals(&mut c.t)[0].reason,
        RefusalReason::AlreadyConnected
    );
    // On an I/O queue's connection: not a second queue either.
    assert!(c.io_connect(1, 201).0.status().is_success());
    let (cqe, ok) = c.io_connect(2, 201);
    assert!(ok.is_none());
    assert_eq!(cqe.status(), Status::COMMAND_SEQUENCE_ERROR);
    let r = c.t.report();
    assert_eq!(r.controllers[0].io_queues, vec![(1, 201)]);
    // A second Connect with no data at all (SPDK's nvme_fuzz sends such): the refusal
    // names the host and subsystem the queue is connected as, not what the data says.
    refusals(&mut c.t);
    let (cqe, _) =
        c.t.connect(c.now, 201, &origin(), &connect_sqe(7, 31, 0), &[]);
    assert_eq!(cqe.status(), Status::COMMAND_SEQUENCE_ERROR);
    let r = refusals(&mut c.t).remove(0);
    assert_eq!(r.reason, RefusalReason::AlreadyConnected);
    assert_eq!(
        (r.hostnqn.as_deref(), r.subnqn.as_deref()),
        (Some(HOST1), Some(SUB1))
    );
}

#[test]
fn admin_queue_sizes_hosts_use_are_accepted() {
    // Linux: 31; SPDK's host: 2..=4096 entries (SQSIZE 1..=4095).
    for sqsize in [1u16, 15, 31, 127, 128, 4095] {
        let mut t = target();
        let (cqe, ok) = t.connect(
            Instant::now(),
            1,
            &origin(),
            &connect_sqe(0, sqsize, 0),
            &connect_data(0xffff, SUB1, HOST1),
        );
        assert!(
            cqe.status().is_success(),
            "SQSIZE {sqsize}: {}",
            cqe.status()
        );
        assert_eq!(ok.unwrap().sqsize, sqsize);
    }
}

#[test]
fn disconnect_on_the_admin_queue_is_invalid_queue_type_and_keeps_the_association() {
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    let mut d = Sqe {
        nsid: opcodes::fabrics::DISCONNECT as u32,
        ..Default::default()
    };
    d.set_opcode_cid(opcodes::FABRICS, 0);
    assert_eq!(c.admin(d).0.status(), Status::INVALID_QUEUE_TYPE);
    assert!(c.t.take_actions().is_empty(), "nothing torn down");
    assert!(c
        .admin(admin_sqe(admin::KEEP_ALIVE, 0))
        .0
        .status()
        .is_success());
}

#[test]
fn disconnect_on_an_io_queue_frees_its_qid_at_once() {
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    let (_, ok) = c.io_connect(1, 201);
    let ioq = ok.unwrap().queue();
    let mut d = Sqe {
        nsid: opcodes::fabrics::DISCONNECT as u32,
        ..Default::default()
    };
    d.set_opcode_cid(opcodes::FABRICS, 0);
    let mut buf = [0u8; 0];
    assert!(
        matches!(c.exec_on(ioq, d, &mut buf), Outcome::Complete { cqe, .. } if cqe.status().is_success())
    );
    assert_eq!(
        c.t.take_actions(),
        vec![Action::Disconnect {
            queue: ioq,
            key: 201
        }]
    );
    // The host connects QID 1 again before the old connection is even closed.
    let (cqe, ok) = c.io_connect(1, 202);
    assert!(cqe.status().is_success(), "{}", cqe.status());
    assert_eq!(ok.unwrap().queue(), ioq);
    // The old connection's late close does not take the new queue.
    assert!(c.t.queue_closed(ioq, 201).is_empty());
    assert_eq!(c.t.report().controllers[0].io_queues, vec![(1, 202)]);
}

#[test]
fn removing_a_subsystem_retires_its_controllers_before_they_go() {
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    let (_, ok) = c.io_connect(1, 201);
    let ioq = ok.unwrap().queue();
    let actions = c.t.remove_subsystem(SUB1);
    assert_eq!(actions.len(), 2, "both queues asked to go: {actions:?}");
    // Commands that arrive before the transport has closed the queues: no answer (the
    // host retries them on its next association), never Command Sequence Error + DNR.
    let mut buf = vec![0u8; 4096];
    assert_eq!(
        c.exec_on(ioq, admin_sqe(io::READ, 1), &mut buf),
        Outcome::Dropped
    );
    assert_eq!(
        c.exec_on(c.admin, identify(cns::CONTROLLER, 0, 0), &mut buf),
        Outcome::Dropped
    );
    // A reconnect finds no subsystem at once.
    let (cqe, _) = c.t.connect(
        c.now,
        400,
        &origin(),
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB1, HOST1),
    );
    assert_eq!(
        (cqe.status(), cqe.dw0),
        (Status::CONNECT_INVALID_PARAMETERS, 1 << 16 | 256)
    );
    assert!(c.t.report().controllers.iter().all(|r| r.retired));
    // Queues closed: the controller is gone.
    assert!(c.t.queue_closed(ioq, 201).is_empty());
    assert!(c.t.queue_closed(c.admin, 100).is_empty());
    assert!(c.t.report().controllers.is_empty());
}

#[test]
fn set_features_nsid_rules() {
    let mut t = target();
    t.add_namespace(SUB1, ns(2)).unwrap();
    let mut c = Conv::enabled(t, SUB1, HOST1);
    let with_nsid = |mut s: Sqe, nsid: u32| {
        s.nsid = nsid;
        s
    };
    // Controller-scoped features: Set with one NSID is Feature Not Namespace Specific;
    // 0h and FFFFFFFFh are fine; Get ignores the NSID (nvme-cli on /dev/nvmeXnY).
    assert_eq!(
        c.admin(with_nsid(set_features(fid::ARBITRATION, 3), 1))
            .0
            .status(),
        Status::FEATURE_NOT_NAMESPACE_SPECIFIC
    );
    assert_eq!(
        c.admin(with_nsid(set_features(fid::NUMBER_OF_QUEUES, 0), 2))
            .0
            .status(),
        Status::FEATURE_NOT_NAMESPACE_SPECIFIC
    );
    for nsid in [0, 0xffff_ffff] {
        assert!(c
            .admin(with_nsid(set_features(fid::ARBITRATION, 3), nsid))
            .0
            .status()
            .is_success());
    }
    let (cqe, _) = c.admin(with_nsid(get_features(fid::NUMBER_OF_QUEUES, 0, 0), 1));
    assert!(cqe.status().is_success());
    // An NSID no namespace can have: Invalid Namespace.
    assert_eq!(
        c.admin(with_nsid(get_features(fid::ARBITRATION, 0, 0), 5000))
            .0
            .status(),
        Status::INVALID_NAMESPACE
    );
    // Error Recovery is per namespace: set on ns 2, read back per namespace.
    assert!(c
        .admin(with_nsid(set_features(fid::ERROR_RECOVERY, 7), 2))
        .0
        .status()
        .is_success());
    assert_eq!(
        c.admin(with_nsid(get_features(fid::ERROR_RECOVERY, 0, 0), 2))
            .0
            .dw0,
        7
    );
    assert_eq!(
        c.admin(with_nsid(get_features(fid::ERROR_RECOVERY, 0, 0), 1))
            .0
            .dw0,
        0
    );
    assert_eq!(
        c.admin(with_nsid(get_features(fid::ERROR_RECOVERY, 0, 0), 0))
            .0
            .dw0,
        0
    );
    // A valid NSID with no namespace behind it.
    assert_eq!(
        c.admin(with_nsid(set_features(fid::ERROR_RECOVERY, 7), 9))
            .0
            .status(),
        Status::INVALID_NAMESPACE
    );
    // FFFFFFFFh: every namespace.
    assert!(c
        .admin(with_nsid(set_features(fid::ERROR_RECOVERY, 9), 0xffff_ffff))
        .0
        .status()
        .is_success());
    assert_eq!(
        c.admin(with_nsid(get_features(fid::ERROR_RECOVERY, 0, 0), 2))
            .0
            .dw0,
        9
    );
    assert_eq!(
        c.admin(with_nsid(get_features(fid::ERROR_RECOVERY, 3, 0), 1))
            .0
            .dw0,
        capabilities_changeable_ns()
    );
}

fn capabilities_changeable_ns() -> u32 {
    crate::spec::features::capabilities::CHANGEABLE
        | crate::spec::features::capabilities::NAMESPACE_SPECIFIC
}

#[test]
fn identify_controller_attributes_by_transport_and_kind() {
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    let (_, data) = c.admin(identify(cns::CONTROLLER, 0, 0));
    let id = IdentifyController::read_from_bytes(&data).unwrap();
    assert_eq!(
        id.ctratt.get() & 1,
        1,
        "CTRATT.HIDS: 128-bit host identifier"
    );
    assert_eq!(id.sgls.get() & (1 << 2), 0, "no keyed SGLs on TCP");
    assert_eq!((id.ioccsz.get(), id.iorcsz.get()), ((64 + 8192) / 16, 1));
    // CRTO.CRWMT (and CRIMT) agree with CAP.TO.
    let cap = c.property_get(fabrics::property::CAP, true);
    let cap = cap.dw0 as u64 | (cap.dw1 as u64) << 32;
    let to = (cap >> fabrics::cap::TO_SHIFT) & 0xff;
    let crto = c.property_get(fabrics::property::CRTO, false).dw0;
    assert_eq!(((crto & 0xffff) as u64, (crto >> 16) as u64), (to, to));

    // Over RDMA the keyed-SGL bit is set.
    let mut t = target();
    t.add_listener(rdma());
    let rdma_origin = QueueOrigin {
        listener: Some(rdma()),
        local: Some(rdma().addr),
        peer: None,
    };
    let (_, ok) = t.connect(
        c.now,
        1,
        &rdma_origin,
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB1, HOST1),
    );
    let mut r = Conv {
        t,
        now: c.now,
        admin: ok.unwrap().queue(),
        cid: 0,
    };
    r.property_set(CC_ENABLE);
    let (_, data) = r.admin(identify(cns::CONTROLLER, 0, 0));
    let id = IdentifyController::read_from_bytes(&data).unwrap();
    assert_ne!(id.sgls.get() & (1 << 2), 0, "keyed SGLs on RDMA");

    // A discovery controller reports IOCCSZ/IORCSZ 0.
    let mut d = Conv::enabled(target(), DISCOVERY_NQN, HOST1);
    let (_, data) = d.admin(identify(cns::CONTROLLER, 0, 0));
    let id = IdentifyController::read_from_bytes(&data).unwrap();
    assert_eq!((id.ioccsz.get(), id.iorcsz.get()), (0, 0));
}

#[test]
fn discovery_over_a_wildcard_listener_publishes_the_address_the_host_reached() {
    let wild4 = ListenerInfo {
        transport: Transport::Tcp,
        addr: "0.0.0.0".parse().unwrap(),
        port: 4420,
    };
    let wild6 = ListenerInfo {
        transport: Transport::Tcp,
        addr: "::".parse().unwrap(),
        port: 4421,
    };
    let mut t = Target::new(TargetOptions::default());
    t.add_listener(wild4.clone());
    t.add_listener(wild6.clone());
    t.add_subsystem(subsystem(SUB2, &[])).unwrap();
    // The host came in on 192.0.2.7 (through the IPv4 wildcard).
    let origin = QueueOrigin {
        listener: Some(wild4.clone()),
        local: Some("192.0.2.7".parse().unwrap()),
        peer: None,
    };
    let (_, ok) = t.connect(
        Instant::now(),
        1,
        &origin,
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, DISCOVERY_NQN, HOST1),
    );
    let mut c = Conv {
        t,
        now: Instant::now(),
        admin: ok.unwrap().queue(),
        cid: 0,
    };
    c.property_set(1);
    let (_, e) = discovery_log(&mut c);
    assert_eq!(e.len(), 4, "SUB2 and discovery on both listeners");
    for x in &e {
        assert_eq!(&x.traddr[..10], b"192.0.2.7 ", "never 0.0.0.0 or ::");
        assert_eq!(x.adrfam, disc::ADRFAM_IPV4);
    }
    // An IPv6 host on the IPv6 wildcard: the IPv4 wildcard has no address to publish.
    let origin6 = QueueOrigin {
        listener: Some(wild6),
        local: Some("2001:db8::5".parse().unwrap()),
        peer: None,
    };
    let Conv { mut t, .. } = c;
    let (_, ok) = t.connect(
        Instant::now(),
        2,
        &origin6,
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, DISCOVERY_NQN, HOST1),
    );
    let mut c = Conv {
        t,
        now: Instant::now(),
        admin: ok.unwrap().queue(),
        cid: 0,
    };
    c.property_set(1);
    let (_, e) = discovery_log(&mut c);
    assert_eq!(e.len(), 2);
    for x in &e {
        assert_eq!(&x.traddr[..12], b"2001:db8::5 ");
        assert_eq!(x.adrfam, disc::ADRFAM_IPV6);
        assert_eq!(&x.trsvcid[..5], b"4421 ");
    }
}

#[test]
fn listener_covers_its_address_or_wildcard_family() {
    let l = |a: &str| ListenerInfo {
        transport: Transport::Tcp,
        addr: a.parse().unwrap(),
        port: 1,
    };
    let ip = |a: &str| -> IpAddr { a.parse().unwrap() };
    assert!(l("0.0.0.0").covers(ip("10.1.1.1")));
    assert!(!l("0.0.0.0").covers(ip("fd00::1")));
    assert!(l("::").covers(ip("fd00::1")));
    assert!(l("::").covers(ip("::ffff:10.1.1.1")));
    assert!(l("10.1.1.1").covers(ip("::ffff:10.1.1.1")));
    assert!(!l("10.1.1.1").covers(ip("10.1.1.2")));
}

/// A host that resets its controller (CC.EN 1 -> 0 -> 1) and sends its AER again with the
/// CID of the one still held (Linux uses one fixed CID for it): the target holds it once,
/// and one event completes it once.
#[test]
fn aer_with_the_cid_of_a_held_one_is_held_once() {
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    c.admin(set_features(fid::ASYNC_EVENT_CONFIG, 1 << 8));
    let mut aer = admin_sqe(admin::ASYNC_EVENT_REQUEST, 0);
    aer.set_opcode_cid(admin::ASYNC_EVENT_REQUEST, 31);
    let mut buf = [0u8; 0];
    let t = &mut c.t;
    assert_eq!(
        t.execute(c.now, c.admin, &aer, &mut buf, &NoCounters),
        Outcome::Deferred
    );
    c.property_set(0);
    c.property_set(CC_ENABLE);
    c.admin(set_features(fid::ASYNC_EVENT_CONFIG, 1 << 8));
    assert_eq!(
        c.t.execute(c.now, c.admin, &aer, &mut buf, &NoCounters),
        Outcome::Deferred
    );
    let _ = c.t.take_actions();
    c.t.add_namespace(SUB1, ns(2)).unwrap();
    let actions = c.t.take_actions();
    assert!(
        matches!(&actions[..], [Action::CompleteHeld { cqe, .. }] if cqe.cid == 31),
        "{actions:?}"
    );
    // Nothing else is held: after the log is read, a new event waits for a new AER.
    c.admin(get_log(lid::CHANGED_NS_LIST, 4096, 0, false, 0xffff_ffff));
    c.t.add_namespace(SUB1, ns(3)).unwrap();
    assert!(
        c.t.take_actions().is_empty(),
        "no second completion for CID 31"
    );
}

/// A namespace whose storage is gone: its I/O gets Internal Path Error without DNR (a
/// multipath host fails over), it leaves the active list with a Namespace Attribute
/// Changed event (the host drops the path), and a reload can remove it and add it back.
#[test]
fn lost_namespace_answers_path_error_and_leaves_the_active_list() {
    let mut c = Conv::enabled(target(), SUB1, HOST1);
    c.admin(set_features(fid::ASYNC_EVENT_CONFIG, 1 << 8));
    let mut buf = [0u8; 0];
    assert_eq!(
        c.exec_on(c.admin, admin_sqe(admin::ASYNC_EVENT_REQUEST, 0), &mut buf),
        Outcome::Deferred
    );
    let (_, ok) = c.io_connect(1, 201);
    let ioq = ok.unwrap().queue();
    c.t.namespace_lost(SUB1, 1).unwrap();
    let actions = c.t.take_actions();
    assert!(
        matches!(&actions[..], [Action::CompleteHeld { cqe, .. }] if cqe.dw0 == 0x04_00_02),
        "{actions:?}"
    );
    // The engine gets a view that refuses every command of any host with the same
    // status (its I/O never reaches the target: without it, a backend that works again
    // served a namespace the hosts were told is gone).
    let views = c.t.take_access_updates();
    assert!(
        matches!(&views[..], [(n, 1, v)] if n == SUB1
            && v.check(&AccessKey::default(), None) == Err(Status::INTERNAL_PATH_ERROR)),
        "{views:?}"
    );
    let mut data = vec![0u8; 4096];
    match c.exec_on(ioq, admin_sqe(io::READ, 1), &mut data) {
        Outcome::Complete { cqe, .. } => {
            assert_eq!(cqe.status(), Status::INTERNAL_PATH_ERROR);
            assert!(!cqe.status().dnr);
        }
        o => panic!("{o:?}"),
    }
    let (_, list) = c.admin(identify(cns::ACTIVE_NS_LIST, 0, 0));
    assert!(
        !NamespaceList::read_from_bytes(&list[..4096])
            .unwrap()
            .to_ids()
            .contains(&1),
        "a lost namespace is not active"
    );
    // Losing it again changes nothing; it stays configured until removed.
    c.t.namespace_lost(SUB1, 1).unwrap();
    assert_eq!(
        c.t.add_namespace(SUB1, ns(1)),
        Err(TargetError::DuplicateNamespace(1))
    );
    c.t.remove_namespace(SUB1, 1).unwrap();
    c.t.add_namespace(SUB1, ns(1)).unwrap();
    match c.exec_on(ioq, admin_sqe(io::READ, 1), &mut data) {
        Outcome::Complete { cqe, .. } => assert_eq!(cqe.status(), Status::NAMESPACE_NOT_READY),
        o => panic!("{o:?}"),
    }
}

mod auth;
mod health;
mod issue14;

/// What the engine may fetch for a command it hands up: before Connect only the
/// Connect's data; after it, Authentication Send's transfer (DH-HMAC-CHAP on the admin
/// queue and on I/O queues) and the reservation commands' data on I/O queues.
#[test]
fn slow_path_host_data_before_and_after_connect() {
    use crate::auth::msg::AuthCommand;
    use crate::target::slow_path_host_data;
    let send = AuthCommand::dhchap(300).to_sqe(1, true);
    let receive = AuthCommand::dhchap(300).to_sqe(1, false);
    assert_eq!(slow_path_host_data(&send, None), 0, "no controller yet");
    assert_eq!(slow_path_host_data(&send, Some(0)), 300);
    assert_eq!(slow_path_host_data(&send, Some(3)), 300);
    assert_eq!(slow_path_host_data(&receive, Some(0)), 0);
    let connect = connect_sqe(0, 31, 0);
    assert_eq!(slow_path_host_data(&connect, None), 1024);
    assert_eq!(
        slow_path_host_data(&connect, Some(0)),
        0,
        "a second Connect"
    );
}

/// Host NQNs a peer makes up do not stay interned once their controllers are gone (any
/// peer may connect to discovery with a new NQN each time, and would otherwise grow the
/// target without bound); a host a namespace names keeps its slot; a slot is never handed
/// out twice.
#[test]
fn host_slots_go_with_their_last_controller() {
    let mut t = target();
    t.add_subsystem(subsystem(SUB2, &[])).unwrap();
    t.add_namespace(
        SUB2,
        NamespaceConfig {
            hosts: Some(vec![HOST2.to_string()]),
            ..ns(1)
        },
    )
    .unwrap();
    let named = t.host_slots[HOST2].slot;
    let mut seen = std::collections::BTreeSet::from([named]);
    let now = Instant::now();
    for i in 0..100u64 {
        let hostnqn = if i % 10 == 0 {
            HOST2.to_string()
        } else {
            format!("nqn.2014-08.org.example:made-up-{i}")
        };
        let c = Conv::connect_kato(t, now, 1000 + i, 0, DISCOVERY_NQN, &hostnqn);
        t = c.t;
        let slot = t.host_slots[&hostnqn].slot;
        if hostnqn == HOST2 {
            assert_eq!(slot, named, "a named host keeps its slot");
        } else {
            assert!(seen.insert(slot), "slot {slot} handed out twice");
        }
        t.queue_closed(c.admin, 1000 + i);
    }
    assert_eq!(
        t.host_slots.keys().collect::<Vec<_>>(),
        vec![HOST2],
        "only the named host is left"
    );
    // Named no more, and no controller: gone at the next publish.
    t.set_namespace_hosts(SUB2, 1, None).unwrap();
    assert!(t.host_slots.is_empty(), "{:?}", t.host_slots);
    // A controller whose keep-alive expired and whose queues are never reported closed
    // is dropped after the retirement limit, and its host's entry with it.
    let silent = "nqn.2014-08.org.example:silent";
    t = Conv::connect_kato(t, now, 5000, 1000, DISCOVERY_NQN, silent).t;
    assert_eq!(t.host_slots.len(), 1);
    t.poll_timeouts(now + Duration::from_secs(2));
    assert_eq!(t.host_slots.len(), 1, "retired, not gone yet");
    t.poll_timeouts(now + Duration::from_secs(3) + RETIRED_LIMIT);
    assert!(t.host_slots.is_empty(), "{:?}", t.host_slots);
}
