use super::*;
use crate::spec::Status;
use proptest::prelude::*;

const LIM: CmLimits = CmLimits {
    max_queue_depth: 128,
    admin_queue_depth: 32,
    max_io_queues: 64,
};

fn req(recfmt: u16, qid: u16, hrq: u16, hsq: u16) -> [u8; 32] {
    CmRequest {
        recfmt,
        qid,
        hrqsize: hrq,
        hsqsize: hsq,
        cntlid: 0,
    }
    .encode()
}

/// NVMe-oF 1.1 Figure 53, as the Linux host fills it for I/O queue 3 of depth 128:
/// RECFMT 0, QID 3, HRQSIZE 128, HSQSIZE 127, CNTLID 0, 22 reserved bytes.
#[test]
fn connect_request_fixed_bytes() {
    let mut wire = [0u8; 32];
    wire[..10].copy_from_slice(&[0x00, 0x00, 0x03, 0x00, 0x80, 0x00, 0x7f, 0x00, 0x00, 0x00]);
    assert_eq!(req(0, 3, 128, 127), wire);
    let r = CmRequest::parse(&wire).unwrap();
    assert_eq!((r.qid, r.hrqsize, r.hsqsize, r.cntlid), (3, 128, 127, 0));
    assert_eq!(r.encode(), wire);
}

#[test]
fn private_data_validation() {
    // What the Linux host sends: admin 32/31, I/O queue_size/queue_size-1.
    assert_eq!(CmRequest::validate(&req(0, 0, 32, 31), &LIM).unwrap().1, 32);
    assert_eq!(
        CmRequest::validate(&req(0, 1, 128, 127), &LIM).unwrap().1,
        128
    );
    let e = |b: &[u8]| CmRequest::validate(b, &LIM).unwrap_err();
    assert_eq!(e(&req(0, 1, 128, 127)[..31]), RejectStatus::InvalidLength);
    assert_eq!(e(&[]), RejectStatus::InvalidLength);
    assert_eq!(e(&req(1, 1, 128, 127)), RejectStatus::InvalidRecfmt);
    assert_eq!(e(&req(0, 65, 128, 127)), RejectStatus::InvalidQid);
    assert_eq!(e(&req(0, 1, 128, 128)), RejectStatus::InvalidHsqsize);
    assert_eq!(e(&req(0, 0, 32, 32)), RejectStatus::InvalidHsqsize);
    assert_eq!(e(&req(0, 1, 128, 0)), RejectStatus::InvalidHsqsize);
    assert_eq!(e(&req(0, 1, 0, 127)), RejectStatus::InvalidHrqsize);
    assert_eq!(e(&req(0, 1, 129, 127)), RejectStatus::InvalidHrqsize);
}

/// Figure 54 (accept: RECFMT, CRQSIZE, reserved to 32 bytes) and Figure 55 (reject:
/// RECFMT, STS) as fixed bytes.
#[test]
fn accept_and_reject_fixed_bytes() {
    let a = accept_private_data(128);
    let mut want = [0u8; 32];
    want[2] = 0x80;
    assert_eq!(a, want);
    assert_eq!(RejectStatus::InvalidHsqsize.private_data(), [0, 0, 4, 0]);
    assert_eq!(RejectStatus::NoResources.private_data(), [0, 0, 6, 0]);
    assert_eq!(RejectStatus::InvalidCntlid.private_data(), [0, 0, 9, 0]);
    for s in [
        RejectStatus::InvalidLength,
        RejectStatus::InvalidRecfmt,
        RejectStatus::InvalidQid,
        RejectStatus::InvalidHsqsize,
        RejectStatus::InvalidHrqsize,
        RejectStatus::NoResources,
        RejectStatus::InvalidIrd,
        RejectStatus::InvalidOrd,
        RejectStatus::InvalidCntlid,
    ] {
        assert_eq!(RejectStatus::parse(&s.private_data()), Some(s));
    }
    assert_eq!(RejectStatus::parse(&[0, 0, 0x0a, 0]), None);
    assert_eq!(RejectStatus::parse(&[0, 0, 1]), None);
}

#[test]
fn keyed_sgl_fixed_bytes() {
    // Bytes as the Linux host builds them: addr, 3-byte length, 4-byte key, id 0x4F.
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
    raw[8..11].copy_from_slice(&[0x00, 0x00, 0x02]); // 128 KiB
    raw[11..15].copy_from_slice(&0xdead_beefu32.to_le_bytes());
    raw[15] = 0x4f;
    let d = SglDescriptor::read_from_bytes(&raw[..]).unwrap();
    let k = KeyedSgl::parse(&d).unwrap();
    assert_eq!(
        k,
        KeyedSgl {
            addr: 0x1122_3344_5566_7788,
            len: 128 * 1024,
            key: 0xdead_beef,
            invalidate: true
        }
    );
    assert_eq!(k.encode().as_bytes(), &raw[..]);
    let plain = KeyedSgl {
        invalidate: false,
        ..k
    };
    assert_eq!(plain.encode().id, 0x40);
    assert_eq!(KeyedSgl::parse(&plain.encode()), Some(plain));
    // Not keyed: in-capsule data block, transport data block, keyed with a bad subtype.
    for id in [0x01u8, 0x5a, 0x41, 0x4a] {
        assert_eq!(
            KeyedSgl::parse(&SglDescriptor { id, ..d }),
            None,
            "id {id:#x}"
        );
    }
}

#[test]
fn credits() {
    let mut c = SqCredits::new(3, 1);
    assert!(c.take(true));
    assert!(!c.take(true), "only one READ in flight");
    assert!(c.take(false));
    assert!(c.take(false));
    assert!(!c.take(false), "send queue full");
    c.give(false);
    assert!(!c.take(true), "READ still limited by the initiator depth");
    assert!(c.take(false));
    c.give(true);
    assert_eq!((c.sq_free(), c.rd_free()), (1, 1));
    assert!(c.take(true));
    // A depth of 0 from the host still allows one READ (we need it to make progress).
    assert_eq!(SqCredits::new(4, 0).rd_free(), 1);
}

fn capsule(cid: u16, dptr: SglDescriptor, data: &[u8]) -> Vec<u8> {
    let mut s = Sqe::default();
    s.set_opcode_cid(0x02, cid);
    s.dptr = dptr;
    let mut b = s.as_bytes().to_vec();
    b.extend_from_slice(data);
    b
}

/// Work the engine posted stays "busy" until its completion comes back: a peer that
/// posts no receives for our SENDs (all of a queue's answers fit in its send queue, so
/// none waits for credits) must still be seen holding the queue, or no deadline runs.
#[test]
fn posted_work_keeps_the_send_side_busy_until_it_completes() {
    let mut q = RdmaQueue::new(64, SqCredits::new(8, 1), 8);
    assert!(!q.send_side_busy());
    for cid in 0..3 {
        q.respond_untracked(Cqe::success(cid));
    }
    assert!(q.send_side_busy(), "queued");
    while q.next_work().is_some() {}
    assert_eq!(q.queued(), 0);
    assert!(!q.has_work());
    assert_eq!(q.credits().in_flight(), 3);
    assert!(q.send_side_busy(), "posted, not completed");
    for left in [2, 1, 0] {
        q.work_completed(false);
        assert_eq!(q.credits().in_flight(), left);
    }
    assert!(!q.send_side_busy());
}

#[test]
fn recv_length_checks_and_sqhd() {
    let mut q = RdmaQueue::new(64 + 8192, SqCredits::new(16, 4), 32);
    assert_eq!(q.on_recv(&[0u8; 63]), Err(RdmaError::ShortCapsule(63)));
    assert_eq!(
        q.on_recv(&vec![0u8; 64 + 8193]),
        Err(RdmaError::LongCapsule(64 + 8193))
    );
    let b = capsule(5, SglDescriptor::default(), &[1, 2, 3]);
    let (sqe, data) = q.on_recv(&b).unwrap();
    assert_eq!((sqe.cid(), data), (5, &[1u8, 2, 3][..]));
    q.respond_untracked(Cqe::new(5, Status::INVALID_FIELD));
    match q.next_work() {
        Some(WorkRequest::Send {
            slot: NO_SLOT,
            cqe,
            invalidate: None,
        }) => {
            let c = Cqe::read_from_bytes(&cqe[..]).unwrap();
            // Only the good capsule counted.
            assert_eq!((c.sqhd, c.cid, c.status()), (1, 5, Status::INVALID_FIELD));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn read_response_plan_with_invalidate() {
    let mut q = RdmaQueue::new(64, SqCredits::new(8, 1), 8);
    q.set_params(QueueParams {
        qid: 2,
        sqsize: 7,
        sq_flow_control_disabled: false,
    });
    let k = KeyedSgl {
        addr: 0x1000,
        len: 4096,
        key: 0x77,
        invalidate: true,
    };
    let b = capsule(9, k.encode(), &[]);
    let (sqe, _) = q.on_recv(&b).unwrap();
    // The target returns more than the SGL holds: never more than the SGL is written.
    q.respond(3, &sqe.dptr, Cqe::success(9), 8192);
    assert_eq!(
        q.next_work(),
        Some(WorkRequest::Write {
            slot: 3,
            len: 4096,
            raddr: 0x1000,
            rkey: 0x77
        })
    );
    match q.next_work() {
        Some(WorkRequest::Send {
            slot: 3,
            cqe,
            invalidate: Some(0x77),
        }) => {
            // CQE bytes (NVMe Base 2.0 Figure 90): DW0, DW1, SQHD, SQID, CID, status.
            assert_eq!(cqe, [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 2, 0, 9, 0, 0, 0]);
        }
        other => panic!("{other:?}"),
    }
    assert!(!q.has_work());
}

#[test]
fn reads_wait_for_the_initiator_depth() {
    let mut q = RdmaQueue::new(64, SqCredits::new(8, 1), 8);
    let k = KeyedSgl {
        addr: 0x10_0000,
        len: 8192,
        key: 5,
        invalidate: false,
    };
    q.fetch(1, &k, 0, 8192);
    q.fetch(2, &k, 4096, 4096);
    assert!(matches!(
        q.next_work(),
        Some(WorkRequest::Read { slot: 1, .. })
    ));
    assert_eq!(q.next_work(), None, "second READ waits for the first");
    q.work_completed(true);
    assert_eq!(
        q.next_work(),
        Some(WorkRequest::Read {
            slot: 2,
            off: 4096,
            len: 4096,
            raddr: 0x10_1000,
            rkey: 5
        })
    );
}

/// `ready` says whether `next_work` would hand something out (so an engine need not poll
/// a queue that waits for credits), `queued` how much waits.
#[test]
fn ready_and_queued_follow_the_credits() {
    let mut q = RdmaQueue::new(64, SqCredits::new(1, 1), 8);
    assert!(!q.ready() && q.queued() == 0);
    q.respond_untracked(Cqe::new(1, Status::SUCCESS));
    q.respond_untracked(Cqe::new(2, Status::SUCCESS));
    assert!(q.ready());
    assert_eq!(q.queued(), 2);
    assert!(q.next_work().is_some());
    assert!(!q.ready(), "no send-queue credit left");
    assert!(q.has_work());
    assert_eq!(q.queued(), 1);
    q.work_completed(false);
    assert!(q.ready());
    let k = KeyedSgl {
        addr: 0x1000,
        len: 4096,
        key: 1,
        invalidate: false,
    };
    let mut r = RdmaQueue::new(64, SqCredits::new(8, 1), 8);
    r.fetch(1, &k, 0, 4096);
    r.fetch(2, &k, 0, 4096);
    assert!(r.next_work().is_some());
    assert!(!r.ready(), "the next READ waits for the initiator depth");
}

/// A field value: a third of the time one of `edges` (the limits of `LIM` and their
/// neighbours), a third from `0..=hi`, a third any `u16`, so that a random request meets
/// each rule about as often as it breaks it, often by one.
fn near(edges: &'static [u16], hi: u16) -> impl Strategy<Value = u16> {
    prop_oneof![prop::sample::select(edges), 0..=hi, any::<u16>()]
}

/// QID, HSQSIZE and HRQSIZE of a request within `LIM`: the admin queue (QID 0) up to its
/// depth 32, an I/O queue up to 128; HSQSIZE is 0's based, HRQSIZE is not.
fn within_limits() -> impl Strategy<Value = (u16, u16, u16)> {
    (0..=LIM.max_io_queues).prop_flat_map(|qid| {
        let max = if qid == 0 {
            LIM.admin_queue_depth
        } else {
            LIM.max_queue_depth
        };
        (Just(qid), 1..max, 1..=max)
    })
}

// Cheap cases, and the limits are narrow targets in a u16: more of them than the default.
proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Any request round-trips through its 32 bytes, and `validate` answers with the
    /// first rule it breaks, in the order it checks them (RECFMT, QID, HSQSIZE, HRQSIZE),
    /// or accepts it with the depth HSQSIZE + 1.
    #[test]
    fn cm_request_roundtrip(recfmt in near(&[0, 1], 1),
                            qid in near(&[0, 1, 63, 64, 65], 66),
                            hrq in near(&[0, 1, 31, 32, 33, 127, 128, 129], 130),
                            hsq in near(&[0, 1, 30, 31, 32, 126, 127, 128], 130),
                            cntlid: u16) {
        let r = CmRequest { recfmt, qid, hrqsize: hrq, hsqsize: hsq, cntlid };
        prop_assert_eq!(CmRequest::parse(&r.encode()), Ok(r));
        let max = if qid == 0 { LIM.admin_queue_depth } else { LIM.max_queue_depth };
        let want = if recfmt != 0 {
            Err(RejectStatus::InvalidRecfmt)
        } else if qid > LIM.max_io_queues {
            Err(RejectStatus::InvalidQid)
        } else if hsq == 0 || u32::from(hsq) + 1 > u32::from(max) {
            Err(RejectStatus::InvalidHsqsize)
        } else if hrq == 0 || hrq > max {
            Err(RejectStatus::InvalidHrqsize)
        } else {
            Ok((r, hsq + 1))
        };
        prop_assert_eq!(CmRequest::validate(&r.encode(), &LIM), want);
    }

    /// A request within the limits (RECFMT 0, QID up to the I/O queue count, sizes up to
    /// the queue's depth) is accepted as sent, and the depth to serve is HSQSIZE + 1:
    /// between 2 and that queue's limit.
    #[test]
    fn cm_request_within_limits_is_accepted((qid, hsq, hrq) in within_limits(), cntlid: u16) {
        let r = CmRequest { recfmt: 0, qid, hrqsize: hrq, hsqsize: hsq, cntlid };
        let max = if qid == 0 { LIM.admin_queue_depth } else { LIM.max_queue_depth };
        let (v, depth) = CmRequest::validate(&r.encode(), &LIM)
            .map_err(|e| TestCaseError::fail(format!("{r:?} refused: {e:?}")))?;
        prop_assert_eq!(v, r);
        prop_assert_eq!(depth, hsq + 1);
        prop_assert!((2..=max).contains(&depth), "depth {} for {:?}", depth, r);
    }
}

proptest! {
    #[test]
    fn keyed_sgl_roundtrip(addr: u64, len in 0u32..(1 << 24), key: u32, inv: bool) {
        let k = KeyedSgl { addr, len, key, invalidate: inv };
        prop_assert_eq!(KeyedSgl::parse(&k.encode()), Some(k));
    }

    /// Any mix of fetches and responses: credits never go negative, every op comes out
    /// once and in order, and no more READs are in flight than the initiator depth.
    #[test]
    fn work_respects_credits(ops in prop::collection::vec((any::<bool>(), 1u32..8192), 1..64),
                             sq in 1u32..8, rd in 1u32..4) {
        let mut q = RdmaQueue::new(64, SqCredits::new(sq, rd), 64);
        let k = KeyedSgl { addr: 0, len: 8192, key: 1, invalidate: false };
        for (i, &(fetch, len)) in ops.iter().enumerate() {
            if fetch {
                q.fetch(i as u32, &k, 0, len);
            } else {
                q.respond(i as u32, &k.encode(), Cqe::success(i as u16), len);
            }
        }
        let mut in_flight: Vec<WorkRequest> = Vec::new();
        let mut seen = 0;
        while q.has_work() || !in_flight.is_empty() {
            while let Some(w) = q.next_work() {
                in_flight.push(w);
                seen += 1;
            }
            prop_assert!(in_flight.len() as u32 <= sq);
            prop_assert!(in_flight.iter().filter(|w| w.is_read()).count() as u32 <= rd);
            let w = in_flight.remove(0);
            q.work_completed(w.is_read());
        }
        let expect: usize = ops.iter().map(|&(f, _)| if f { 1 } else { 2 }).sum();
        prop_assert_eq!(seen, expect);
        prop_assert_eq!(q.credits(), SqCredits::new(sq, rd));
    }
}
