//! The reservation rules, table by table (NVMe Base 2.0 section 8.19).

use super::*;
use ReservationType::*;

const A: HostId = [0xa; 16];
const B: HostId = [0xb; 16];
const C: HostId = [0xc; 16];

fn keys(a: u64, b: u64) -> Vec<u8> {
    let mut d = a.to_le_bytes().to_vec();
    d.extend_from_slice(&b.to_le_bytes());
    d
}
fn reg(r: &mut Reservations, h: &HostId, key: u64) {
    r.register(h, RREGA_REGISTER, &keys(0, key), false).unwrap();
}
fn acq(
    r: &mut Reservations,
    h: &HostId,
    action: u32,
    rtype: u8,
    crkey: u64,
    prkey: u64,
) -> Result<Effects, Status> {
    r.acquire(h, action | (rtype as u32) << 8, &keys(crkey, prkey))
}
fn rel(
    r: &mut Reservations,
    h: &HostId,
    action: u32,
    rtype: u8,
    crkey: u64,
) -> Result<Effects, Status> {
    r.release(h, action | (rtype as u32) << 8, &crkey.to_le_bytes())
}

/// NVMe Base 2.0 Figure "Command Behavior in the Presence of a Reservation", written out:
/// for each type, (read, write) allowed for a non-registrant, a registrant that does not
/// hold the reservation, and the holder.
/// (read, write) allowed.
type Rw = [bool; 2];

#[test]
fn command_behavior_table() {
    #[rustfmt::skip]
    let table: [(ReservationType, Rw, Rw, Rw); 6] = [
        //                               non-registrant   registrant      holder
        (WriteExclusive,                 [true, false],   [true, false],  [true, true]),
        (ExclusiveAccess,                [false, false],  [false, false], [true, true]),
        (WriteExclusiveRegistrantsOnly,  [true, false],   [true, true],   [true, true]),
        (ExclusiveAccessRegistrantsOnly, [false, false],  [true, true],   [true, true]),
        (WriteExclusiveAllRegistrants,   [true, false],   [true, true],   [true, true]),
        (ExclusiveAccessAllRegistrants,  [false, false],  [true, true],   [true, true]),
    ];
    for (rtype, non, regd, holder) in table {
        for (who, want) in [
            ("non-registrant", non),
            ("registrant", regd),
            ("holder", holder),
        ] {
            for (i, access) in [Access::Read, Access::Write].into_iter().enumerate() {
                let got = allowed(rtype, who == "holder", who != "non-registrant", access);
                assert_eq!(got, want[i], "{rtype:?} {who} {access:?}");
            }
        }
        // The same table through a real state: A holds, B is registered, C is not.
        let mut r = Reservations::default();
        reg(&mut r, &A, 1);
        reg(&mut r, &B, 2);
        acq(&mut r, &A, RACQA_ACQUIRE, rtype as u8, 1, 0).unwrap();
        for (h, want) in [
            (&C, non),
            (
                &B,
                if rtype.all_registrants() {
                    holder
                } else {
                    regd
                },
            ),
            (&A, holder),
        ] {
            assert_eq!(r.check(h, Access::Read).is_ok(), want[0], "{rtype:?} read");
            assert_eq!(
                r.check(h, Access::Write).is_ok(),
                want[1],
                "{rtype:?} write"
            );
            if !want[1] {
                assert_eq!(r.check(h, Access::Write), Err(Status::RESERVATION_CONFLICT));
            }
        }
    }
    // No reservation: everything goes.
    let r = Reservations::default();
    assert_eq!(r.check(&C, Access::Write), Ok(()));
}

#[test]
fn register_unregister_replace() {
    let mut r = Reservations::default();
    reg(&mut r, &A, 7);
    assert_eq!(r.generation, 1);
    // Again with the same key: fine, no change of state but a new generation.
    reg(&mut r, &A, 7);
    // With another key: conflict.
    assert_eq!(
        r.register(&A, RREGA_REGISTER, &keys(0, 8), false),
        Err(Status::RESERVATION_CONFLICT)
    );
    // Replace needs the current key unless IEKEY.
    assert_eq!(
        r.register(&A, RREGA_REPLACE, &keys(6, 9), false),
        Err(Status::RESERVATION_CONFLICT)
    );
    r.register(&A, RREGA_REPLACE, &keys(7, 9), false).unwrap();
    r.register(&A, RREGA_REPLACE | 1 << 3, &keys(1234, 10), false)
        .unwrap();
    assert_eq!(r.registrants, vec![Registrant::new(A, 10)]);
    // Replace with IEKEY by an unregistered host registers it.
    r.register(&B, RREGA_REPLACE | 1 << 3, &keys(0, 20), false)
        .unwrap();
    assert!(r.is_registrant(&B));
    // Unregister: wrong key conflicts, IEKEY ignores it; unknown host conflicts.
    assert_eq!(
        r.register(&B, RREGA_UNREGISTER, &keys(21, 0), false),
        Err(Status::RESERVATION_CONFLICT)
    );
    r.register(&B, RREGA_UNREGISTER | 1 << 3, &keys(0, 0), false)
        .unwrap();
    assert_eq!(
        r.register(&C, RREGA_UNREGISTER, &keys(0, 0), false),
        Err(Status::RESERVATION_CONFLICT)
    );
    // Reserved action, short data.
    assert_eq!(
        r.register(&A, 3, &keys(0, 0), false),
        Err(Status::INVALID_FIELD)
    );
    assert_eq!(
        r.register(&A, 0, &[0; 8], false),
        Err(Status::DATA_SGL_LENGTH_INVALID)
    );
    let gen = r.generation;
    assert_eq!(gen, 6, "every successful Register bumps PRGEN");
}

#[test]
fn cptpl() {
    let mut r = Reservations::default();
    // Set PTPL (11b) where it cannot be kept: Invalid Field; 01b is reserved.
    assert_eq!(
        r.register(&A, 0b11 << 30, &keys(0, 1), false),
        Err(Status::INVALID_FIELD)
    );
    assert_eq!(
        r.register(&A, 0b01 << 30, &keys(0, 1), true),
        Err(Status::INVALID_FIELD)
    );
    let fx = r.register(&A, 0b11 << 30, &keys(0, 1), true).unwrap();
    assert!(r.ptpl && fx.ptpl_changed && fx.changed);
    let fx = r
        .register(&A, RREGA_REPLACE | 0b10 << 30, &keys(1, 2), true)
        .unwrap();
    assert!(!r.ptpl && fx.ptpl_changed);
}

#[test]
fn acquire_and_release() {
    let mut r = Reservations::default();
    reg(&mut r, &A, 1);
    reg(&mut r, &B, 2);
    // Wrong key, unregistered host, bad type, IEKEY.
    assert_eq!(
        acq(&mut r, &A, 0, 1, 9, 0),
        Err(Status::RESERVATION_CONFLICT)
    );
    assert_eq!(
        acq(&mut r, &C, 0, 1, 0, 0),
        Err(Status::RESERVATION_CONFLICT)
    );
    assert_eq!(acq(&mut r, &A, 0, 7, 1, 0), Err(Status::INVALID_FIELD));
    assert_eq!(acq(&mut r, &A, 0, 0, 1, 0), Err(Status::INVALID_FIELD));
    assert_eq!(acq(&mut r, &A, 1 << 3, 1, 1, 0), Err(Status::INVALID_FIELD));
    let gen = r.generation;
    acq(&mut r, &A, 0, 3, 1, 0).unwrap();
    assert_eq!(r.generation, gen, "Acquire does not bump PRGEN");
    // Holder again, same type: fine; other type: conflict; other host: conflict.
    acq(&mut r, &A, 0, 3, 1, 0).unwrap();
    assert_eq!(
        acq(&mut r, &A, 0, 1, 1, 0),
        Err(Status::RESERVATION_CONFLICT)
    );
    assert_eq!(
        acq(&mut r, &B, 0, 3, 2, 0),
        Err(Status::RESERVATION_CONFLICT)
    );
    // Release: wrong type is Invalid Field; a non-holder's release does nothing.
    assert_eq!(rel(&mut r, &A, 0, 1, 1), Err(Status::INVALID_FIELD));
    let fx = rel(&mut r, &B, 0, 3, 2).unwrap();
    assert!(!fx.changed && r.held.is_some());
    // Holder releases a Registrants Only reservation: the others hear of it.
    let fx = rel(&mut r, &A, 0, 3, 1).unwrap();
    assert!(r.held.is_none());
    assert_eq!(
        fx.notify,
        vec![Notify {
            host_id: B,
            kind: NotificationType::ReservationReleased
        }]
    );
    // Releasing a Write Exclusive reservation tells nobody.
    acq(&mut r, &A, 0, 1, 1, 0).unwrap();
    assert!(rel(&mut r, &A, 0, 1, 1).unwrap().notify.is_empty());
    // Release with no reservation: success.
    rel(&mut r, &A, 0, 1, 1).unwrap();
    // Clear: everything goes, the others get Reservation Preempted, PRGEN moves.
    acq(&mut r, &A, 0, 2, 1, 0).unwrap();
    let gen = r.generation;
    let fx = rel(&mut r, &B, RRELA_CLEAR, 0, 2).unwrap();
    assert!(r.held.is_none() && r.registrants.is_empty());
    assert_eq!(r.generation, gen + 1);
    assert_eq!(
        fx.notify,
        vec![Notify {
            host_id: A,
            kind: NotificationType::ReservationPreempted
        }]
    );
}

#[test]
fn unregistering_holder() {
    // Registrants Only: the holder leaving releases it and tells the others.
    let mut r = Reservations::default();
    reg(&mut r, &A, 1);
    reg(&mut r, &B, 2);
    acq(&mut r, &A, 0, 4, 1, 0).unwrap();
    let fx = r
        .register(&A, RREGA_UNREGISTER, &keys(1, 0), false)
        .unwrap();
    assert!(r.held.is_none());
    assert_eq!(
        fx.notify,
        vec![Notify {
            host_id: B,
            kind: NotificationType::ReservationReleased
        }]
    );
    // All Registrants: stays held while a registrant is left.
    reg(&mut r, &A, 1);
    acq(&mut r, &A, 0, 6, 1, 0).unwrap();
    assert!(r.is_holder(&B));
    r.register(&A, RREGA_UNREGISTER, &keys(1, 0), false)
        .unwrap();
    assert!(r.held.is_some() && r.is_holder(&B));
    r.register(&B, RREGA_UNREGISTER, &keys(2, 0), false)
        .unwrap();
    assert!(r.held.is_none());
}

#[test]
fn preempt() {
    // No reservation: PRKEY unregisters the matching registrants; no match conflicts.
    let mut r = Reservations::default();
    reg(&mut r, &A, 1);
    reg(&mut r, &B, 2);
    reg(&mut r, &C, 2);
    assert_eq!(
        acq(&mut r, &A, 1, 1, 1, 99),
        Err(Status::RESERVATION_CONFLICT)
    );
    let gen = r.generation;
    let fx = acq(&mut r, &A, 1, 1, 1, 2).unwrap();
    assert_eq!(r.registrants.len(), 1);
    assert!(
        r.held.is_none(),
        "preempting registrations acquires nothing"
    );
    assert_eq!(r.generation, gen + 1);
    assert_eq!(fx.notify.len(), 2);
    assert!(fx
        .notify
        .iter()
        .all(|n| n.kind == NotificationType::RegistrationPreempted));

    // Holder's key: the preempting host takes it with the new type, the holder goes.
    let mut r = Reservations::default();
    reg(&mut r, &A, 1);
    reg(&mut r, &B, 2);
    acq(&mut r, &A, 0, 1, 1, 0).unwrap();
    let fx = acq(&mut r, &B, RACQA_PREEMPT_ABORT, 2, 2, 1).unwrap();
    assert_eq!(
        r.held,
        Some(Held {
            rtype: ExclusiveAccess,
            holder: B
        })
    );
    assert!(!r.is_registrant(&A));
    assert!(fx.notify.contains(&Notify {
        host_id: A,
        kind: NotificationType::RegistrationPreempted
    }));
    // PRKEY 0 that is not the holder's key: Invalid Field.
    reg(&mut r, &A, 1);
    assert_eq!(acq(&mut r, &A, 1, 1, 1, 0), Err(Status::INVALID_FIELD));
    // Another key: those registrants go, the reservation stays.
    reg(&mut r, &C, 3);
    acq(&mut r, &A, 1, 1, 1, 3).unwrap();
    assert!(!r.is_registrant(&C));
    assert_eq!(r.held.unwrap().holder, B);
    // The holder preempting itself changes the type.
    acq(&mut r, &B, 1, 3, 2, 2).unwrap();
    assert_eq!(
        r.held,
        Some(Held {
            rtype: WriteExclusiveRegistrantsOnly,
            holder: B
        })
    );
    assert!(r.is_registrant(&B));

    // All Registrants, PRKEY 0: everyone else goes, the preempting host holds the new type.
    let mut r = Reservations::default();
    reg(&mut r, &A, 1);
    reg(&mut r, &B, 2);
    acq(&mut r, &A, 0, 5, 1, 0).unwrap();
    acq(&mut r, &B, 1, 1, 2, 0).unwrap();
    assert_eq!(
        r.held,
        Some(Held {
            rtype: WriteExclusive,
            holder: B
        })
    );
    assert_eq!(r.registrants.len(), 1);
}

#[test]
fn report_both_layouts() {
    let mut r = Reservations::default();
    reg(&mut r, &A, 0x1111);
    reg(&mut r, &B, 0x2222);
    acq(&mut r, &A, 0, 1, 0x1111, 0).unwrap();
    r.ptpl = true;
    let e = report(&r, true);
    assert_eq!(e.len(), 64 + 2 * 64);
    assert_eq!(&e[0..10], &[2, 0, 0, 0, 1, 2, 0, 0, 0, 1]);
    // Entry 0: CNTLID FFFFh, RCSTS 1, RKEY, 128-bit HOSTID.
    assert_eq!(&e[64..67], &[0xff, 0xff, 1]);
    assert_eq!(&e[72..80], &0x1111u64.to_le_bytes());
    assert_eq!(&e[80..96], &A);
    assert_eq!(
        e[128 + 2],
        0,
        "B does not hold a Write Exclusive reservation"
    );
    let n = report(&r, false);
    assert_eq!(n.len(), 24 + 2 * 24);
    assert_eq!(&n[24..27], &[0xff, 0xff, 1]);
    assert_eq!(&n[32..40], &A[..8]);
    assert_eq!(&n[40..48], &0x1111u64.to_le_bytes());
}

#[test]
fn notification_page_bytes() {
    let e = NotificationEntry {
        count: 3,
        kind: 2,
        nsid: 7,
    };
    let b = e.encode(5);
    assert_eq!(&b[..16], &[3, 0, 0, 0, 0, 0, 0, 0, 2, 5, 0, 0, 7, 0, 0, 0]);
    assert!(b[16..].iter().all(|&x| x == 0));
}

/// Host ID number `i` (big-endian in its first 8 bytes), with `tag` in its last byte.
fn numbered_host(i: usize, tag: u8) -> HostId {
    let mut h = [0u8; 16];
    h[..8].copy_from_slice(&(i as u64).to_be_bytes());
    h[15] = tag;
    h
}

/// A namespace keeps at most MAX_REGISTRANTS: one more new Host ID is refused (Register,
/// and Replace with IEKEY), while those registered keep working and a freed place can be
/// taken again. The access view answers the same for a registrant at either end of the
/// (sorted) list.
#[test]
fn registrants_are_bounded() {
    let host = |i| numbered_host(i, 1);
    let mut r = Reservations::default();
    // Registered in descending Host ID order: the view must not rely on the list's order.
    for i in (0..MAX_REGISTRANTS).rev() {
        reg(&mut r, &host(i), 7);
    }
    let late = host(MAX_REGISTRANTS);
    assert!(r.full_for(&late, RREGA_REGISTER));
    assert_eq!(
        r.register(&late, RREGA_REGISTER, &keys(0, 7), false),
        Err(REGISTRANTS_FULL)
    );
    assert_eq!(
        r.register(&late, RREGA_REPLACE | 1 << 3, &keys(0, 7), false),
        Err(REGISTRANTS_FULL)
    );
    assert_eq!(r.registrants.len(), MAX_REGISTRANTS);
    // A registered host re-registering with its key, or replacing it, is not refused.
    assert!(r
        .register(&host(3), RREGA_REGISTER, &keys(0, 7), false)
        .is_ok());
    assert!(r
        .register(&host(3), RREGA_REPLACE, &keys(7, 8), false)
        .is_ok());
    // A place freed is taken again.
    r.register(&host(3), RREGA_UNREGISTER, &keys(8, 0), false)
        .unwrap();
    reg(&mut r, &late, 7);
    assert_eq!(r.registrants.len(), MAX_REGISTRANTS);
    // Under Write Exclusive Registrants Only, registrants write, others do not.
    acq(&mut r, &late, 0, WriteExclusiveRegistrantsOnly as u8, 7, 0).unwrap();
    let view = super::super::access::NamespaceAccess::new(None, Vec::new(), Some(&r));
    let key = |h: HostId| super::super::access::AccessKey {
        host_id: h,
        ..Default::default()
    };
    for h in [host(0), host(MAX_REGISTRANTS - 1), late] {
        assert_eq!(view.check(&key(h), Some(Access::Write)), Ok(()));
    }
    assert_eq!(
        view.check(&key(host(3)), Some(Access::Write)),
        Err(Status::RESERVATION_CONFLICT)
    );
}

/// One host NQN, and one peer address, add at most MAX_REGISTRANTS_PER_HOST registrants
/// to a namespace (registrations outlive controllers and Host IDs are the host's to
/// choose: without this, one peer filled the list for good). Others still register;
/// registrants of unknown origin (PTPL) count against no one.
#[test]
fn one_host_nqn_or_address_adds_a_bounded_number_of_registrants() {
    let host = |i| numbered_host(i, 2);
    let a1 = Some("10.0.0.1".parse().unwrap());
    let evil = RegisteredBy::new("nqn.2014-08.org.nvmexpress:uuid:evil", a1);
    let mut r = Reservations::default();
    for i in 0..10 {
        reg(&mut r, &host(1000 + i), 3); // restored from PTPL: unknown origin
    }
    for i in 0..MAX_REGISTRANTS_PER_HOST {
        r.register_by(&host(i), RREGA_REGISTER, &keys(0, 7), false, evil)
            .unwrap();
    }
    let next = host(MAX_REGISTRANTS_PER_HOST);
    // The same host NQN from another address, then another host NQN from the address.
    let nqn_elsewhere = RegisteredBy::new(
        "nqn.2014-08.org.nvmexpress:uuid:evil",
        Some("10.0.0.2".parse().unwrap()),
    );
    let addr_other_nqn = RegisteredBy::new("nqn.2014-08.org.nvmexpress:uuid:x", a1);
    for (by, why) in [
        (nqn_elsewhere, RegistrantsRefusal::HostQuota),
        (addr_other_nqn, RegistrantsRefusal::PeerQuota),
        (evil, RegistrantsRefusal::HostQuota),
    ] {
        assert_eq!(r.refuse_new(&next, RREGA_REGISTER, by), Some(why));
        assert_eq!(
            r.register_by(&next, RREGA_REGISTER, &keys(0, 7), false, by),
            Err(REGISTRANTS_FULL)
        );
        assert_eq!(
            r.register_by(&next, RREGA_REPLACE | 1 << 3, &keys(0, 7), false, by),
            Err(REGISTRANTS_FULL)
        );
    }
    // A registrant already there keeps working; another host from elsewhere registers.
    r.register_by(&host(5), RREGA_REPLACE, &keys(7, 8), false, evil)
        .unwrap();
    let good = RegisteredBy::new(
        "nqn.2014-08.org.nvmexpress:uuid:good",
        Some("10.0.0.9".parse().unwrap()),
    );
    r.register_by(&next, RREGA_REGISTER, &keys(0, 7), false, good)
        .unwrap();
    // A place the peer frees is its own again.
    r.register(&host(5), RREGA_UNREGISTER, &keys(8, 0), false)
        .unwrap();
    r.register_by(&host(5000), RREGA_REGISTER, &keys(0, 7), false, evil)
        .unwrap();
    assert_eq!(r.registrants.len(), 10 + MAX_REGISTRANTS_PER_HOST + 1);
}

/// A host NQN at its quota replaces its own oldest registration that no live controller
/// holds and that holds no reservation; another host NQN's registrations are never taken.
#[test]
fn a_host_at_its_quota_replaces_its_own_stale_registrations() {
    let host = |i| numbered_host(i, 3);
    let me = RegisteredBy::new("nqn.2014-08.org.nvmexpress:uuid:node1", None);
    let other = RegisteredBy::new("nqn.2014-08.org.nvmexpress:uuid:node2", None);
    let mut r = Reservations::default();
    r.register_by(&host(500), RREGA_REGISTER, &keys(0, 5), false, other)
        .unwrap();
    for i in 0..MAX_REGISTRANTS_PER_HOST {
        r.register_by(&host(i), RREGA_REGISTER, &keys(0, 7), false, me)
            .unwrap();
    }
    // host(0) holds the reservation, host(1) has a live controller: host(2) goes.
    acq(&mut r, &host(0), 0, WriteExclusive as u8, 7, 0).unwrap();
    let live: std::collections::HashSet<HostId> = [host(1)].into_iter().collect();
    assert!(r.evict_stale(me, &live));
    assert!(!r.is_registrant(&host(2)));
    assert!(r.is_registrant(&host(0)) && r.is_registrant(&host(1)));
    assert!(r.is_registrant(&host(500)));
    let next = host(MAX_REGISTRANTS_PER_HOST);
    r.register_by(&next, RREGA_REGISTER, &keys(0, 7), false, me)
        .unwrap();
    // Nothing of another host NQN's, and nothing without a known origin, is taken.
    let all_live: std::collections::HashSet<HostId> =
        r.registrants.iter().map(|x| x.host_id).collect();
    assert!(!r.evict_stale(me, &all_live));
    assert!(!r.evict_stale(RegisteredBy::default(), &Default::default()));
}
