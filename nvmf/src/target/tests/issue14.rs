//! Reservations, ANA, AENs, Abort, per-host visibility and referrals through the target,
//! with two hosts.

use super::*;
use crate::spec::features::async_event_config as aec;
use crate::spec::log::aen;
use reservation::{Access, NotificationType};

const HOSTID_A: [u8; 16] = [0xaa; 16];
const HOSTID_B: [u8; 16] = [0xbb; 16];

/// One host's controller: admin queue, one I/O queue, AEC set to `aec_bits`.
struct Host {
    admin: QueueRef,
    io: QueueRef,
    admin_key: QueueKey,
    access: AccessKey,
    cid: u16,
}

fn open_target() -> Target {
    let mut t = Target::new(TargetOptions {
        ptpl_capable: true,
        ..TargetOptions::default()
    });
    t.add_listener(tcp());
    t.add_listener(rdma());
    t.add_subsystem(subsystem(SUB2, &[])).unwrap();
    t.add_namespace(SUB2, ns(1)).unwrap();
    t
}

fn join(
    t: &mut Target,
    hostnqn: &str,
    hostid: [u8; 16],
    key: QueueKey,
    on: ListenerInfo,
    aec_bits: u32,
) -> Host {
    let now = Instant::now();
    let o = QueueOrigin {
        listener: Some(on.clone()),
        local: Some(on.addr),
        peer: None,
    };
    let data = ConnectData::new(hostid, 0xffff, SUB2, hostnqn);
    let (_, ok) = t.connect(now, key, &o, &connect_sqe(0, 31, 0), data.as_bytes());
    let ok = ok.unwrap();
    let admin = ok.queue();
    let mut h = Host {
        admin,
        io: QueueRef {
            cntlid: admin.cntlid,
            qid: 1,
        },
        admin_key: key,
        access: ok.access,
        cid: 0,
    };
    let p = fabrics::PropertyCommand {
        attrib: 0,
        offset: fabrics::property::CC,
        value: CC_ENABLE,
    };
    h.run(t, h.admin, p.to_sqe(0, true), &mut []);
    h.run(
        t,
        h.admin,
        set_features(fid::ASYNC_EVENT_CONFIG, aec_bits),
        &mut [],
    );
    let data = ConnectData::new(hostid, admin.cntlid, SUB2, hostnqn);
    let (cqe, ok) = t.connect(now, key + 1, &o, &connect_sqe(1, 127, 0), data.as_bytes());
    assert!(cqe.status().is_success(), "{:?}", cqe.status());
    assert_eq!(ok.unwrap().access, h.access);
    h
}

impl Host {
    fn run(&mut self, t: &mut Target, q: QueueRef, mut sqe: Sqe, data: &mut [u8]) -> Outcome {
        self.cid += 1;
        sqe.set_opcode_cid(sqe.opcode(), self.cid);
        t.execute(Instant::now(), q, &sqe, data, &NoCounters)
    }
    fn status(&mut self, t: &mut Target, q: QueueRef, sqe: Sqe, data: &mut [u8]) -> Status {
        match self.run(t, q, sqe, data) {
            Outcome::Complete { cqe, .. } => cqe.status(),
            o => panic!("{o:?}"),
        }
    }
    fn io(
        &mut self,
        t: &mut Target,
        opcode: u8,
        cdw10: u32,
        cdw11: u32,
        data: &mut [u8],
    ) -> Status {
        let mut s = Sqe {
            nsid: 1,
            cdw10,
            cdw11,
            ..Default::default()
        };
        s.set_opcode_cid(opcode, 0);
        self.status(t, self.io, s, data)
    }
    fn register(&mut self, t: &mut Target, key: u64) -> Status {
        let mut d = [0u8; 16];
        d[8..].copy_from_slice(&key.to_le_bytes());
        self.io(t, io::RESERVATION_REGISTER, 0, 0, &mut d)
    }
    fn acquire(
        &mut self,
        t: &mut Target,
        action: u32,
        rtype: u8,
        crkey: u64,
        prkey: u64,
    ) -> Status {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&crkey.to_le_bytes());
        d[8..].copy_from_slice(&prkey.to_le_bytes());
        self.io(
            t,
            io::RESERVATION_ACQUIRE,
            action | (rtype as u32) << 8,
            0,
            &mut d,
        )
    }
    /// Holds an AER; returns its CID.
    fn aer(&mut self, t: &mut Target) -> u16 {
        let o = self.run(
            t,
            self.admin,
            admin_sqe(admin::ASYNC_EVENT_REQUEST, 0),
            &mut [],
        );
        assert_eq!(o, Outcome::Deferred);
        self.cid
    }
    fn log(&mut self, t: &mut Target, lid: u8, len: u32, lsp: u8, rae: bool) -> Vec<u8> {
        let mut s = admin_sqe(admin::GET_LOG_PAGE, 0xffff_ffff);
        GetLogPage {
            lid,
            lsp,
            numd: len / 4 - 1,
            rae,
            ..Default::default()
        }
        .write_to(&mut s);
        let mut buf = vec![0u8; len as usize];
        match self.run(t, self.admin, s, &mut buf) {
            Outcome::Complete { cqe, data_len } => {
                assert!(cqe.status().is_success(), "{:?}", cqe.status());
                buf.truncate(data_len as usize);
                buf
            }
            o => panic!("{o:?}"),
        }
    }
}

/// The AER completions among `actions`, as (admin key, DW0).
fn events(actions: &[Action]) -> Vec<(QueueKey, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::CompleteHeld { key, cqe, .. } => Some((*key, cqe.dw0)),
            _ => None,
        })
        .collect()
}

const RESV_EVENT: u32 = aen::TYPE_IO_COMMAND_SPECIFIC as u32 | 0x80 << 16;
const ANA_EVENT: u32 = 2 | 3 << 8 | 0x0c << 16;

#[test]
fn two_hosts_register_reserve_preempt_with_notifications() {
    let mut t = open_target();
    let mut a = join(
        &mut t,
        HOST1,
        HOSTID_A,
        100,
        tcp(),
        aec::NS_ATTRIBUTE_NOTICES,
    );
    let mut b = join(
        &mut t,
        HOST2,
        HOSTID_B,
        200,
        tcp(),
        aec::NS_ATTRIBUTE_NOTICES,
    );
    assert_ne!(a.access.host, b.access.host);
    t.take_access_updates();
    assert_eq!(a.register(&mut t, 0xa), Status::SUCCESS);
    assert_eq!(b.register(&mut t, 0xb), Status::SUCCESS);
    assert_eq!(a.acquire(&mut t, 0, 1, 0xa, 0), Status::SUCCESS);
    // The engine gets a view that refuses B's writes and lets its reads through.
    let ups = t.take_access_updates();
    let (_, _, view) = ups.iter().find(|(n, id, _)| n == SUB2 && *id == 1).unwrap();
    assert_eq!(
        view.check(&b.access, Some(Access::Write)),
        Err(Status::RESERVATION_CONFLICT)
    );
    assert_eq!(view.check(&b.access, Some(Access::Read)), Ok(()));
    assert_eq!(view.check(&a.access, Some(Access::Write)), Ok(()));
    // A write of B that reaches the target gets the same answer.
    assert_eq!(
        b.io(&mut t, io::WRITE, 0, 0, &mut [0; 512]),
        Status::RESERVATION_CONFLICT
    );
    assert_eq!(
        b.io(&mut t, io::READ, 0, 0, &mut []),
        Status::NAMESPACE_NOT_READY
    );

    // B preempts A (Preempt and Abort): A's controller hears of it through an AER and
    // the Reservation Notification log; B does not.
    let aer = a.aer(&mut t);
    b.aer(&mut t);
    assert_eq!(b.acquire(&mut t, 2, 2, 0xb, 0xa), Status::SUCCESS);
    let ev = events(&t.take_actions());
    assert_eq!(ev, vec![(a.admin_key, RESV_EVENT)]);
    let _ = aer;
    // A read refused for its offset (past the 64-byte page) loses no entry, nor does one
    // from the page's end (offset 64: allowed, all zeroes).
    let at = |lpo: u64| {
        let mut s = admin_sqe(admin::GET_LOG_PAGE, 0xffff_ffff);
        GetLogPage {
            lid: lid::RESERVATION_NOTIFICATION,
            numd: 64 / 4 - 1,
            lpo,
            ..Default::default()
        }
        .write_to(&mut s);
        s
    };
    assert_eq!(
        a.status(&mut t, a.admin, at(128), &mut [0; 64]),
        Status::INVALID_FIELD
    );
    assert_eq!(
        a.status(&mut t, a.admin, at(64), &mut [0; 64]),
        Status::SUCCESS
    );
    let page = a.log(&mut t, lid::RESERVATION_NOTIFICATION, 64, 0, false);
    assert_eq!(
        &page[..16],
        &[
            1,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            NotificationType::RegistrationPreempted as u8,
            0,
            0,
            0,
            1,
            0,
            0,
            0
        ]
    );
    // Read again: empty (count 0).
    let page = a.log(&mut t, lid::RESERVATION_NOTIFICATION, 64, 0, false);
    assert!(page.iter().all(|&x| x == 0));
    // A is no longer registered: its write conflicts with B's Exclusive Access.
    assert_eq!(
        a.io(&mut t, io::WRITE, 0, 0, &mut [0; 512]),
        Status::RESERVATION_CONFLICT
    );

    // Report: EDS 0 is refused (128-bit host IDs), EDS 1 lists B as holder.
    assert_eq!(
        b.io(&mut t, io::RESERVATION_REPORT, 15, 0, &mut [0; 64]),
        Status::HOST_IDENTIFIER_INCONSISTENT
    );
    let mut rep = [0u8; 128];
    assert_eq!(
        b.io(&mut t, io::RESERVATION_REPORT, 31, 1, &mut rep),
        Status::SUCCESS
    );
    assert_eq!(rep[4], 2, "RTYPE");
    assert_eq!(u16::from_le_bytes([rep[5], rep[6]]), 1, "REGCTL");
    assert_eq!(&rep[64 + 16..64 + 32], &HOSTID_B);

    // A masks Registration Preempted (feature 82h): re-registered and preempted again, it
    // gets neither a log page nor an event.
    let mut s = set_features(
        fid::RESERVATION_NOTIFICATION_MASK,
        NotificationType::RegistrationPreempted.mask_bit(),
    );
    s.nsid = 1;
    assert_eq!(a.status(&mut t, a.admin, s, &mut []), Status::SUCCESS);
    assert_eq!(a.register(&mut t, 0xa), Status::SUCCESS);
    assert_eq!(b.acquire(&mut t, 1, 2, 0xb, 0xa), Status::SUCCESS);
    assert!(events(&t.take_actions()).is_empty());
    let page = a.log(&mut t, lid::RESERVATION_NOTIFICATION, 64, 0, false);
    assert!(page.iter().all(|&x| x == 0));
    let mut g = get_features(fid::RESERVATION_NOTIFICATION_MASK, 0, 0);
    g.nsid = 1;
    match a.run(&mut t, a.admin, g, &mut []) {
        Outcome::Complete { cqe, .. } => assert_eq!(cqe.dw0, 2),
        o => panic!("{o:?}"),
    }
}

#[test]
fn ptpl_snapshot_follows_changes_and_restores() {
    let mut t = open_target();
    let mut a = join(&mut t, HOST1, HOSTID_A, 100, tcp(), 0);
    let v0 = t.ptpl_version();
    assert_eq!(a.register(&mut t, 5), Status::SUCCESS);
    assert_eq!(t.ptpl_version(), v0, "PTPL off: nothing to persist");
    // Register with CPTPL 11b turns it on.
    let mut d = [0u8; 16];
    d[8..].copy_from_slice(&5u64.to_le_bytes());
    assert_eq!(
        a.io(&mut t, io::RESERVATION_REGISTER, 0b11 << 30, 0, &mut d),
        Status::SUCCESS
    );
    assert!(t.ptpl_version() > v0);
    assert_eq!(a.acquire(&mut t, 0, 1, 5, 0), Status::SUCCESS);
    let (_, snap) = t.ptpl_snapshot();
    assert_eq!(snap.len(), 1);
    assert!(snap[0].state.ptpl && snap[0].state.held.is_some());
    // A new target (a restart) restores it; the engine gets the view.
    let mut t2 = open_target();
    t2.take_access_updates();
    t2.restore_reservation(snap[0].clone()).unwrap();
    let ups = t2.take_access_updates();
    assert_eq!(ups.len(), 1);
    let other = AccessKey {
        host_id: HOSTID_B,
        host: 9,
        port: 1,
    };
    assert_eq!(
        ups[0].2.check(&other, Some(Access::Write)),
        Err(Status::RESERVATION_CONFLICT)
    );
    // Feature 83h reads it and turns it off.
    let mut g = get_features(fid::RESERVATION_PERSISTENCE, 0, 0);
    g.nsid = 1;
    match a.run(&mut t, a.admin, g, &mut []) {
        Outcome::Complete { cqe, .. } => assert_eq!(cqe.dw0, 1),
        o => panic!("{o:?}"),
    }
    let mut s = set_features(fid::RESERVATION_PERSISTENCE, 0);
    s.nsid = 1;
    assert_eq!(a.status(&mut t, a.admin, s, &mut []), Status::SUCCESS);
    assert!(t.ptpl_snapshot().1.is_empty());
}

#[test]
fn ptpl_needs_a_state_file() {
    let mut t = Target::new(TargetOptions::default());
    t.add_listener(tcp());
    t.add_subsystem(subsystem(SUB2, &[])).unwrap();
    t.add_namespace(SUB2, ns(1)).unwrap();
    let mut a = join(&mut t, HOST1, HOSTID_A, 100, tcp(), 0);
    let d = &mut [0u8; 16];
    assert_eq!(
        a.io(&mut t, io::RESERVATION_REGISTER, 0b11 << 30, 0, d),
        Status::INVALID_FIELD
    );
    let mut s = set_features(fid::RESERVATION_PERSISTENCE, 1);
    s.nsid = 1;
    assert_eq!(a.status(&mut t, a.admin, s, &mut []), Status::INVALID_FIELD);
    let mut buf = vec![0u8; 4096];
    a.run(&mut t, a.admin, identify(cns::NAMESPACE, 1, 0), &mut buf);
    let id = IdentifyNamespace::read_from_bytes(&buf).unwrap();
    assert_eq!(id.rescap, 0b1111_1110, "every type, IEKEY, no PTPL");
}

/// ANA: default group 1 optimized; a reload makes the TCP path inaccessible; the TCP
/// controller gets an ANA Change event, the log says so byte for byte, I/O on that path
/// gets the path status, the RDMA controller sees nothing change.
#[test]
fn ana_states_log_and_events() {
    let mut t = open_target();
    let mut a = join(&mut t, HOST1, HOSTID_A, 100, tcp(), aec::ANA_CHANGE_NOTICES);
    let mut b = join(
        &mut t,
        HOST2,
        HOSTID_B,
        200,
        rdma(),
        aec::ANA_CHANGE_NOTICES,
    );
    let mut buf = vec![0u8; 4096];
    a.run(&mut t, a.admin, identify(cns::CONTROLLER, 0, 0), &mut buf);
    let id = IdentifyController::read_from_bytes(&buf).unwrap();
    assert_eq!(id.cmic & 0b1000, 0b1000);
    assert_eq!((id.anatt, id.anacap), (10, 0b101_1111));
    assert_eq!(
        (id.anagrpmax.get(), id.nanagrpid.get(), id.mnan.get()),
        (128, 128, 1024)
    );
    assert_ne!(id.oaes.get() & (1 << 11), 0);
    // Default: one group, optimized, change count 0.
    let log = a.log(&mut t, lid::ANA, 64, 0, false);
    #[rustfmt::skip]
    assert_eq!(&log[..52], &[
        0, 0, 0, 0, 0, 0, 0, 0,  1, 0,  0, 0, 0, 0, 0, 0, // CHGCNT 0, NGRPS 1
        1, 0, 0, 0,  1, 0, 0, 0,  0, 0, 0, 0, 0, 0, 0, 0, // ANAGRPID 1, NNSIDS 1, CHGCNT 0
        1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,   // optimized
        1, 0, 0, 0,                                       // NSID 1
    ]);
    a.aer(&mut t);
    b.aer(&mut t);
    let acts = t
        .set_ana_groups(
            SUB2,
            vec![AnaGroup {
                id: 1,
                states: vec![(tcp(), AnaState::Inaccessible)],
            }],
        )
        .unwrap();
    assert_eq!(events(&acts), vec![(a.admin_key, ANA_EVENT)]);
    // RGO: no NSID list.
    let log = a.log(&mut t, lid::ANA, 48, 1, true);
    #[rustfmt::skip]
    assert_eq!(&log[..48], &[
        1, 0, 0, 0, 0, 0, 0, 0,  1, 0,  0, 0, 0, 0, 0, 0,
        1, 0, 0, 0,  0, 0, 0, 0,  1, 0, 0, 0, 0, 0, 0, 0,
        3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    assert_eq!(
        b.log(&mut t, lid::ANA, 48, 0, false)[32],
        1,
        "the RDMA path stays optimized"
    );
    // I/O on the inaccessible path: path status without DNR; on the other: fine.
    assert_eq!(
        a.io(&mut t, io::WRITE, 0, 0, &mut [0; 512]),
        Status::ANA_INACCESSIBLE
    );
    // (Not Ready: it passed the checks and reached what the engine would run.)
    assert_eq!(
        b.io(&mut t, io::FLUSH, 0, 0, &mut []),
        Status::NAMESPACE_NOT_READY
    );
    let ups = t.take_access_updates();
    let view = &ups.iter().find(|(_, id, _)| *id == 1).unwrap().2;
    assert_eq!(
        view.check(&a.access, Some(Access::Read)),
        Err(Status::ANA_INACCESSIBLE)
    );
    assert_eq!(view.check(&b.access, Some(Access::Read)), Ok(()));
    // Identify Namespace on the inaccessible path: ANAGRPID 1, NUSE 0.
    a.run(&mut t, a.admin, identify(cns::NAMESPACE, 1, 0), &mut buf);
    let idns = IdentifyNamespace::read_from_bytes(&buf).unwrap();
    assert_eq!((idns.anagrpid.get(), idns.nuse.get()), (1, 0));
    // Masked until the host reads the log without RAE: a second change raises nothing on
    // A (it read with RAE), then reading without RAE lets the next one through.
    a.aer(&mut t);
    let acts = t
        .set_ana_groups(
            SUB2,
            vec![AnaGroup {
                id: 1,
                states: vec![(tcp(), AnaState::Change)],
            }],
        )
        .unwrap();
    assert!(events(&acts).is_empty());
    let log = a.log(&mut t, lid::ANA, 48, 1, false);
    assert_eq!((log[0], log[32]), (2, 0x0f));
    let acts = t
        .set_ana_groups(
            SUB2,
            vec![AnaGroup {
                id: 1,
                states: vec![(tcp(), AnaState::NonOptimized)],
            }],
        )
        .unwrap();
    assert_eq!(events(&acts), vec![(a.admin_key, ANA_EVENT)]);
    assert_eq!(
        a.io(&mut t, io::FLUSH, 0, 0, &mut []),
        Status::NAMESPACE_NOT_READY
    );
    // Out of range group IDs are refused.
    assert!(t
        .set_ana_groups(
            SUB2,
            vec![AnaGroup {
                id: 129,
                states: vec![]
            }]
        )
        .is_err());
}

/// A namespace moved to another ANA group (a reload that changes its `ana_group`) moves
/// in place, as SPDK does: the move shows in the log (both groups' change counts, the
/// NSID under its new group), controllers get an ANA Change event, I/O on a path where
/// the new group is inaccessible gets the path status, Identify says the new group, and
/// the namespace keeps its reservation. Before: remove + add, which dropped reservations
/// and answered Invalid Namespace meanwhile.
#[test]
fn a_namespace_changes_ana_group_in_place() {
    let mut t = open_target();
    let mut a = join(&mut t, HOST1, HOSTID_A, 100, tcp(), aec::ANA_CHANGE_NOTICES);
    assert_eq!(a.register(&mut t, 5), Status::SUCCESS);
    assert_eq!(a.acquire(&mut t, 0, 1, 5, 0), Status::SUCCESS);
    t.set_ana_groups(
        SUB2,
        vec![AnaGroup {
            id: 2,
            states: vec![(tcp(), AnaState::Inaccessible)],
        }],
    )
    .unwrap();
    a.aer(&mut t);
    t.take_access_updates();
    let acts = t.set_namespace_ana_group(SUB2, 1, 2).unwrap();
    assert_eq!(events(&acts), vec![(a.admin_key, ANA_EVENT)]);
    let log = a.log(&mut t, lid::ANA, 4096, 0, false);
    let chgcnt = u64::from_le_bytes(log[..8].try_into().unwrap());
    // Group 2 with NSID 1 and the move's change count; group 1, empty now, is not listed
    // (only groups with namespaces are).
    assert_eq!(&log[8..10], &[1, 0], "one group");
    let g2 = &log[16..52];
    assert_eq!(
        (
            g2[0],
            g2[4],
            g2[16],
            u64::from_le_bytes(g2[8..16].try_into().unwrap())
        ),
        (2, 1, 3, chgcnt),
        "group 2: NSID 1, inaccessible on this path"
    );
    assert_eq!(&g2[32..36], &[1, 0, 0, 0]);
    assert!(chgcnt > 0);
    let mut buf = vec![0u8; 4096];
    a.run(&mut t, a.admin, identify(cns::NAMESPACE, 1, 0), &mut buf);
    let idns = IdentifyNamespace::read_from_bytes(&buf).unwrap();
    assert_eq!(idns.anagrpid.get(), 2);
    assert_eq!(
        a.io(&mut t, io::READ, 0, 0, &mut [0; 512]),
        Status::ANA_INACCESSIBLE
    );
    let ups = t.take_access_updates();
    let view = &ups.iter().find(|(_, id, _)| *id == 1).unwrap().2;
    assert_eq!(
        view.check(&a.access, Some(Access::Read)),
        Err(Status::ANA_INACCESSIBLE)
    );
    // Its reservation stayed.
    let r = t.reservation(SUB2, 1).expect("reservation kept");
    assert!(r.state.held.is_some(), "{r:?}");
    // The same group again: nothing happens.
    assert!(t.set_namespace_ana_group(SUB2, 1, 2).unwrap().is_empty());
    assert!(t.set_namespace_ana_group(SUB2, 1, 129).is_err());
    assert!(t.set_namespace_ana_group(SUB2, 9, 1).is_err());
}

/// ANA Change events follow Set Features 0Bh: a controller that did not enable them gets
/// none.
#[test]
fn ana_events_are_masked_by_async_event_config() {
    let mut t = open_target();
    let mut a = join(
        &mut t,
        HOST1,
        HOSTID_A,
        100,
        tcp(),
        aec::NS_ATTRIBUTE_NOTICES,
    );
    a.aer(&mut t);
    let acts = t
        .set_ana_groups(
            SUB2,
            vec![AnaGroup {
                id: 1,
                states: vec![(tcp(), AnaState::PersistentLoss)],
            }],
        )
        .unwrap();
    assert!(events(&acts).is_empty());
    assert_eq!(
        a.io(&mut t, io::READ, 0, 0, &mut []),
        Status::ANA_PERSISTENT_LOSS
    );
}

#[test]
fn per_host_visibility_and_its_events() {
    let mut t = open_target();
    let mut a = join(
        &mut t,
        HOST1,
        HOSTID_A,
        100,
        tcp(),
        aec::NS_ATTRIBUTE_NOTICES,
    );
    let mut b = join(
        &mut t,
        HOST2,
        HOSTID_B,
        200,
        tcp(),
        aec::NS_ATTRIBUTE_NOTICES,
    );
    a.aer(&mut t);
    b.aer(&mut t);
    // Namespace 2 for HOST2 only: only B hears of it.
    t.add_namespace(
        SUB2,
        NamespaceConfig {
            hosts: Some(vec![HOST2.to_string()]),
            ..ns(2)
        },
    )
    .unwrap();
    assert_eq!(
        events(&t.take_actions()),
        vec![(b.admin_key, 2 | 0x04 << 16)]
    );
    let mut buf = vec![0u8; 4096];
    a.run(
        &mut t,
        a.admin,
        identify(cns::ACTIVE_NS_LIST, 0, 0),
        &mut buf,
    );
    assert_eq!(
        NamespaceList::read_from_bytes(&buf).unwrap().to_ids(),
        vec![1]
    );
    b.run(
        &mut t,
        b.admin,
        identify(cns::ACTIVE_NS_LIST, 0, 0),
        &mut buf,
    );
    assert_eq!(
        NamespaceList::read_from_bytes(&buf).unwrap().to_ids(),
        vec![1, 2]
    );
    a.run(&mut t, a.admin, identify(cns::NAMESPACE, 2, 0), &mut buf);
    assert!(buf.iter().all(|&x| x == 0), "inactive for HOST1");
    let mut s = Sqe {
        nsid: 2,
        ..Default::default()
    };
    s.set_opcode_cid(io::FLUSH, 0);
    assert_eq!(
        a.status(&mut t, a.io, s, &mut []),
        Status::INVALID_NAMESPACE
    );
    let ups = t.take_access_updates();
    let view = &ups.iter().find(|(_, id, _)| *id == 2).unwrap().2;
    assert_eq!(
        view.check(&a.access, Some(Access::Read)),
        Err(Status::INVALID_NAMESPACE)
    );
    assert_eq!(view.check(&b.access, Some(Access::Read)), Ok(()));
    // Reload gives it to HOST1 too: only A hears of it (B saw no change).
    a.log(&mut t, lid::CHANGED_NS_LIST, 4096, 0, false);
    b.log(&mut t, lid::CHANGED_NS_LIST, 4096, 0, false);
    a.aer(&mut t);
    b.aer(&mut t);
    let acts = t.set_namespace_hosts(SUB2, 2, None).unwrap();
    assert_eq!(events(&acts), vec![(a.admin_key, 2 | 0x04 << 16)]);
    let list = a.log(&mut t, lid::CHANGED_NS_LIST, 4096, 0, false);
    assert_eq!(
        NamespaceList::read_from_bytes(&list).unwrap().to_ids(),
        vec![2]
    );
    assert!(t.take_access_updates()[0].2.is_open());
}

#[test]
fn referrals_in_the_discovery_log() {
    let mut t = target();
    let mut c = Conv::enabled(t, DISCOVERY_NQN, HOST1);
    let gen = discovery_log(&mut c).0.genctr.get();
    c.t.set_referrals(vec![Referral {
        transport: Transport::Tcp,
        addr: "192.0.2.7".parse().unwrap(),
        port: 8009,
    }]);
    let (h, entries) = discovery_log(&mut c);
    assert!(h.genctr.get() > gen);
    let r = entries
        .iter()
        .find(|e| e.subtype == disc::SUBTYPE_REFERRAL)
        .unwrap();
    assert_eq!(&r.traddr[..9], b"192.0.2.7");
    assert_eq!(&r.trsvcid[..4], b"8009");
    assert_eq!(&r.subnqn[..DISCOVERY_NQN.len()], DISCOVERY_NQN.as_bytes());
    t = c.t;
    let _ = t;
}

#[test]
fn abort_of_a_held_aer_and_of_an_io_command() {
    let mut t = open_target();
    let mut a = join(&mut t, HOST1, HOSTID_A, 100, tcp(), 0);
    let aer = a.aer(&mut t);
    // Abort the AER: it completes with Abort Requested, the Abort says "aborted".
    let mut s = admin_sqe(admin::ABORT, 0);
    s.cdw10 = (aer as u32) << 16;
    match a.run(&mut t, a.admin, s, &mut []) {
        Outcome::Complete { cqe, .. } => assert_eq!(cqe.dw0 & 1, 0),
        o => panic!("{o:?}"),
    }
    let acts = t.take_actions();
    assert!(
        matches!(&acts[..], [Action::CompleteHeld { cqe, .. }] if cqe.cid == aer && cqe.status() == Status::ABORT_REQUESTED)
    );
    // Unknown CID on the admin queue, unknown SQ: not aborted.
    s.cdw10 = 77 << 16;
    match a.run(&mut t, a.admin, s, &mut []) {
        Outcome::Complete { cqe, .. } => assert_eq!(cqe.dw0 & 1, 1),
        o => panic!("{o:?}"),
    }
    s.cdw10 = 9 | 77 << 16;
    match a.run(&mut t, a.admin, s, &mut []) {
        Outcome::Complete { cqe, .. } => assert_eq!(cqe.dw0 & 1, 1),
        o => panic!("{o:?}"),
    }
    // A command of I/O queue 1: the engine is asked, the Abort is held until it answers.
    s.cdw10 = 1 | 42 << 16;
    assert_eq!(a.run(&mut t, a.admin, s, &mut []), Outcome::Deferred);
    let abort_cid = a.cid;
    let acts = t.take_actions();
    let [Action::Abort {
        queue,
        key,
        cid,
        abort,
        abort_cid: ac,
    }] = &acts[..]
    else {
        panic!("{acts:?}")
    };
    assert_eq!((*queue, *key, *cid, *ac), (a.io, 101, 42, abort_cid));
    let done = t.abort_done(*abort, abort_cid, true);
    assert!(
        matches!(&done[..], [Action::CompleteHeld { cqe, .. }] if cqe.cid == abort_cid && cqe.dw0 == 0)
    );
    // At most four outstanding.
    for _ in 0..4 {
        assert_eq!(a.run(&mut t, a.admin, s, &mut []), Outcome::Deferred);
    }
    assert_eq!(
        a.status(&mut t, a.admin, s, &mut []),
        Status::ABORT_COMMAND_LIMIT_EXCEEDED
    );
}

/// Every notice the target raises, one by one: raised when enabled, not raised when Set
/// Features 0Bh leaves it off (reservation notices: feature 82h), kept masked by a log
/// read with RAE, raised again after a read without RAE.
#[test]
fn every_event_kind_is_raised_masked_and_cleared() {
    let all = aec::NS_ATTRIBUTE_NOTICES | aec::ANA_CHANGE_NOTICES;
    let ns_event = 2 | 0x04 << 16;
    // (what raises it, its DW0, its log page, the AEC bit that enables it)
    type Raise = fn(&mut Target, &mut Host, &mut Host, u32) -> Vec<Action>;
    let kinds: [(&str, Raise, u32, u8, u32); 3] = [
        (
            "namespace attribute",
            |t, _, _, n| {
                t.add_namespace(SUB2, ns(10 + n)).unwrap();
                t.take_actions()
            },
            ns_event,
            lid::CHANGED_NS_LIST,
            aec::NS_ATTRIBUTE_NOTICES,
        ),
        (
            "ANA change",
            |t, _, _, n| {
                let s = if n % 2 == 0 {
                    AnaState::NonOptimized
                } else {
                    AnaState::Optimized
                };
                t.set_ana_groups(
                    SUB2,
                    vec![AnaGroup {
                        id: 1,
                        states: vec![(tcp(), s)],
                    }],
                )
                .unwrap()
            },
            ANA_EVENT,
            lid::ANA,
            aec::ANA_CHANGE_NOTICES,
        ),
        (
            "reservation log",
            |t, a, b, _| {
                // B takes A's registration away (B keeps a registration to preempt with).
                assert_eq!(a.register(t, 0xa), Status::SUCCESS);
                assert_eq!(b.register(t, 0xb), Status::SUCCESS);
                assert_eq!(b.acquire(t, 1, 1, 0xb, 0xa), Status::SUCCESS);
                t.take_actions()
            },
            RESV_EVENT,
            lid::RESERVATION_NOTIFICATION,
            0,
        ),
    ];
    for (name, raise, dw0, log, bit) in kinds {
        let mut t = open_target();
        let mut a = join(&mut t, HOST1, HOSTID_A, 100, tcp(), all);
        let mut b = join(&mut t, HOST2, HOSTID_B, 200, rdma(), all);
        a.aer(&mut t);
        assert_eq!(
            events(&raise(&mut t, &mut a, &mut b, 0)),
            vec![(a.admin_key, dw0)],
            "{name}: raised"
        );
        // Read with RAE: still masked, nothing new is raised.
        a.log(&mut t, log, 64, 0, true);
        a.aer(&mut t);
        assert!(
            events(&raise(&mut t, &mut a, &mut b, 1)).is_empty(),
            "{name}: masked after RAE"
        );
        // Read without RAE: unmasked (reservation pages: each read takes one; the queue is
        // empty now, so nothing is raised until the next one), the next one is raised.
        a.log(&mut t, log, 64, 0, false);
        assert!(events(&t.take_actions()).is_empty());
        assert_eq!(
            events(&raise(&mut t, &mut a, &mut b, 2)),
            vec![(a.admin_key, dw0)],
            "{name}: unmasked"
        );
        // Disabled by Set Features 0Bh (or 82h for reservation notices): never raised.
        let mut t = open_target();
        let mut a = join(&mut t, HOST1, HOSTID_A, 100, tcp(), all & !bit);
        let mut b = join(&mut t, HOST2, HOSTID_B, 200, rdma(), all);
        if bit == 0 {
            let mut s = set_features(
                fid::RESERVATION_NOTIFICATION_MASK,
                reservation::NOTIFICATION_MASK_ALL,
            );
            s.nsid = 0xffff_ffff;
            assert_eq!(a.status(&mut t, a.admin, s, &mut []), Status::SUCCESS);
        }
        a.aer(&mut t);
        assert!(
            events(&raise(&mut t, &mut a, &mut b, 0)).is_empty(),
            "{name}: disabled"
        );
    }
}

/// Copy and fused Compare and Write are advertised only where the engine runs them.
#[test]
fn copy_and_fused_are_advertised_with_the_engine_only() {
    for (copy, fused) in [(0u32, false), (1 << 20, true)] {
        let mut t = Target::new(TargetOptions {
            copy_max_bytes: copy,
            fused_compare_write: fused,
            ..TargetOptions::default()
        });
        t.add_listener(tcp());
        t.add_subsystem(subsystem(SUB2, &[])).unwrap();
        t.add_namespace(SUB2, ns(1)).unwrap();
        let mut a = join(&mut t, HOST1, HOSTID_A, 100, tcp(), 0);
        let mut buf = vec![0u8; 4096];
        a.run(&mut t, a.admin, identify(cns::CONTROLLER, 0, 0), &mut buf);
        let id = IdentifyController::read_from_bytes(&buf).unwrap();
        assert_eq!(id.oncs.get() & (1 << 8) != 0, copy > 0);
        assert_eq!(id.ocfs.get(), (copy > 0) as u16);
        assert_eq!(id.fuses.get(), fused as u16);
        assert_ne!(id.oncs.get() & (1 << 5), 0, "reservations always");
        a.run(&mut t, a.admin, identify(cns::NAMESPACE, 1, 0), &mut buf);
        let n = IdentifyNamespace::read_from_bytes(&buf).unwrap();
        if copy > 0 {
            // 1 MiB of 4 KiB blocks.
            assert_eq!((n.mssrl.get(), n.mcl.get(), n.msrc), (256, 256, 127));
        } else {
            assert_eq!((n.mssrl.get(), n.mcl.get(), n.msrc), (0, 0, 0));
            let mut s = Sqe {
                nsid: 1,
                ..Default::default()
            };
            s.set_opcode_cid(io::COPY, 0);
            assert_eq!(a.status(&mut t, a.io, s, &mut []), Status::INVALID_OPCODE);
        }
    }
}

/// With `reservations: false` (an engine that cannot enforce them on offloaded I/O, DOCA
/// STA) nothing advertises reservations and their commands are Invalid Opcode.
#[test]
fn reservations_can_be_left_out_for_an_engine_that_cannot_enforce_them() {
    for on in [true, false] {
        let mut t = Target::new(TargetOptions {
            reservations: on,
            ..TargetOptions::default()
        });
        t.add_listener(tcp());
        t.add_listener(rdma());
        t.add_subsystem(subsystem(SUB2, &[])).unwrap();
        t.add_namespace(SUB2, ns(1)).unwrap();
        let mut a = join(&mut t, HOST1, HOSTID_A, 100, tcp(), 0);
        let mut buf = vec![0u8; 4096];
        a.run(&mut t, a.admin, identify(cns::CONTROLLER, 0, 0), &mut buf);
        let id = IdentifyController::read_from_bytes(&buf).unwrap();
        assert_eq!(id.oncs.get() & (1 << 5) != 0, on, "ONCS bit 5");
        a.run(&mut t, a.admin, identify(cns::NAMESPACE, 1, 0), &mut buf);
        let n = IdentifyNamespace::read_from_bytes(&buf).unwrap();
        assert_eq!(n.rescap != 0, on, "RESCAP {:#x}", n.rescap);
        let st = a.register(&mut t, 0x1111);
        if on {
            assert_eq!(st, Status::SUCCESS);
        } else {
            assert_eq!(st, Status::INVALID_OPCODE);
            assert_eq!(
                a.io(&mut t, io::RESERVATION_REPORT, 15, 0, &mut [0; 64]),
                Status::INVALID_OPCODE
            );
            // Plain I/O is still the engine's (reaching the target it is "not ready", as
            // with reservations on), not refused as an unknown opcode.
            assert_eq!(
                a.io(&mut t, io::READ, 0, 0, &mut []),
                Status::NAMESPACE_NOT_READY
            );
        }
    }
}

/// A namespace whose backend grew (a reload after `truncate -s` or `lvextend`): Identify
/// answers the new size, the controllers that see it get a Namespace Attribute Changed
/// event with the NSID in their Changed Namespace List (a host that cannot see it hears
/// nothing), and it keeps its reservation. Smaller counts are refused, the same count is
/// no event.
#[test]
fn a_namespace_grows_in_place() {
    let mut t = open_target();
    let mut a = join(
        &mut t,
        HOST1,
        HOSTID_A,
        100,
        tcp(),
        aec::NS_ATTRIBUTE_NOTICES,
    );
    let mut b = join(
        &mut t,
        HOST2,
        HOSTID_B,
        200,
        tcp(),
        aec::NS_ATTRIBUTE_NOTICES,
    );
    t.set_namespace_hosts(SUB2, 1, Some(vec![HOST1.to_string()]))
        .unwrap();
    assert_eq!(a.register(&mut t, 5), Status::SUCCESS);
    a.log(&mut t, lid::CHANGED_NS_LIST, 4096, 0, false);
    b.log(&mut t, lid::CHANGED_NS_LIST, 4096, 0, false);
    a.aer(&mut t);
    b.aer(&mut t);
    let before = 1u64 << 20;
    let acts = t.resize_namespace(SUB2, 1, before + 4096).unwrap();
    assert_eq!(events(&acts), vec![(a.admin_key, 2 | 0x04 << 16)]);
    let list = a.log(&mut t, lid::CHANGED_NS_LIST, 4096, 0, false);
    assert_eq!(
        NamespaceList::read_from_bytes(&list).unwrap().to_ids(),
        vec![1]
    );
    let mut buf = vec![0u8; 4096];
    a.run(&mut t, a.admin, identify(cns::NAMESPACE, 1, 0), &mut buf);
    let idns = IdentifyNamespace::read_from_bytes(&buf).unwrap();
    assert_eq!(
        (idns.nsze.get(), idns.ncap.get()),
        (before + 4096, before + 4096)
    );
    let report = t.report();
    let sub = report.subsystems.iter().find(|s| s.nqn == SUB2).unwrap();
    assert_eq!(sub.namespaces[0].num_blocks, before + 4096);
    let r = t.reservation(SUB2, 1).expect("reservation kept");
    assert_eq!(r.state.registrants.len(), 1, "{r:?}");
    // No shrinking, no event for no change, no unknown namespace.
    assert!(t.resize_namespace(SUB2, 1, before).is_err());
    assert!(t
        .resize_namespace(SUB2, 1, before + 4096)
        .unwrap()
        .is_empty());
    assert!(t.resize_namespace(SUB2, 9, before).is_err());
}
