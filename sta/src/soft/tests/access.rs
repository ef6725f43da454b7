//! The offloaded path honours the target's namespace access views (reservations, ANA
//! path states, per-host visibility), and Abort aborts commands that have not started.

use nvmf::spec::opcodes::{admin, io};
use nvmf::spec::{Sqe, Status};
use nvmf::target::{AnaGroup, AnaState, ListenerInfo, QueueOrigin, Transport};
use nvmf::tcp::{Digests, Xfer};

use super::pair::*;
use crate::soft::SoftConfig;
use crate::Engine;

const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-4000-8000-00000000000a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-4000-8000-00000000000b";

/// A controller (admin, I/O queue) of host `nqn`/`id`, coming in on `origin`.
fn host(p: &mut Pair, nqn: &str, id: u8, origin: QueueOrigin) -> (usize, usize) {
    let a = p.open(Digests::NONE, 0);
    p.conns[a].hostnqn = nqn.to_string();
    p.conns[a].hostid = [id; 16];
    p.conns[a].origin = origin.clone();
    let cqe = p.connect(a, nvmf::spec::fabrics::CNTLID_DYNAMIC, 0, 31, 0, 0);
    assert!(cqe.status().is_success());
    let cntlid = cqe.dw0 as u16;
    p.conns[a].cntlid = cntlid;
    let en = nvmf::spec::fabrics::PropertyCommand {
        attrib: 0,
        offset: nvmf::spec::fabrics::property::CC,
        value: 0x0046_0001,
    };
    assert!(p
        .exec(a, en.to_sqe(0, true), Xfer::None, vec![])
        .0
        .status()
        .is_success());
    let q = p.open(Digests::NONE, 0);
    p.conns[q].hostnqn = nqn.to_string();
    p.conns[q].hostid = [id; 16];
    p.conns[q].origin = origin;
    let cqe = p.connect(q, cntlid, 1, 31, 0, 0);
    assert!(cqe.status().is_success(), "I/O connect: {}", cqe.status());
    p.conns[q].cntlid = cntlid;
    (a, q)
}

fn resv(p: &mut Pair, q: usize, opcode: u8, cdw10: u32, data: Vec<u8>) -> Status {
    let mut s = Sqe {
        nsid: 1,
        cdw10,
        ..Default::default()
    };
    s.set_opcode_cid(opcode, 0);
    p.exec(q, s, Xfer::ToController, data).0.status()
}

fn keys(a: u64, b: u64) -> Vec<u8> {
    let mut d = a.to_le_bytes().to_vec();
    d.extend_from_slice(&b.to_le_bytes());
    d
}

fn write(p: &mut Pair, q: usize, slba: u64, seed: u64) -> Status {
    p.exec(
        q,
        rw(io::WRITE, slba, 1),
        Xfer::ToController,
        pattern(seed, 512),
    )
    .0
    .status()
}

fn read(p: &mut Pair, q: usize, slba: u64) -> Status {
    p.exec(q, rw(io::READ, slba, 1), Xfer::FromController, vec![0; 512])
        .0
        .status()
}

#[test]
fn reservation_conflicts_are_answered_by_the_engine() {
    let mut p = Pair::new();
    let (_, a) = host(&mut p, HOST_A, 0xa, QueueOrigin::default());
    let (_, b) = host(&mut p, HOST_B, 0xb, QueueOrigin::default());
    assert_eq!(
        write(&mut p, b, 10, 1),
        Status::SUCCESS,
        "no reservation yet"
    );
    assert_eq!(
        resv(&mut p, a, io::RESERVATION_REGISTER, 0, keys(0, 0xa)),
        Status::SUCCESS
    );
    assert_eq!(
        resv(&mut p, b, io::RESERVATION_REGISTER, 0, keys(0, 0xb)),
        Status::SUCCESS
    );
    // A holds Write Exclusive: B (a registrant) may read, not write.
    assert_eq!(
        resv(&mut p, a, io::RESERVATION_ACQUIRE, 1 << 8, keys(0xa, 0)),
        Status::SUCCESS
    );
    let ops_before = p.backend_ops.lock().unwrap().len();
    assert_eq!(write(&mut p, b, 11, 2), Status::RESERVATION_CONFLICT);
    assert_eq!(
        p.backend_ops.lock().unwrap().len(),
        ops_before,
        "never reached the backend"
    );
    let t = p.sta.stats().namespace(p.subsys, 1);
    let i = crate::error_status_index(Status::RESERVATION_CONFLICT);
    assert_eq!(crate::ERROR_STATUSES[i].0, "reservation_conflict");
    assert_eq!(t.errors_by_status[i], 1, "counted per namespace");
    assert_eq!(disk(&p, 11, 1), vec![0; 512]);
    assert_eq!(read(&mut p, b, 10), Status::SUCCESS);
    assert_eq!(write(&mut p, a, 12, 3), Status::SUCCESS);
    assert_eq!(disk(&p, 12, 1), pattern(3, 512));
    // Write Zeroes, DSM and Flush are writes too.
    let mut wz = rw(io::WRITE_ZEROES, 12, 1);
    wz.cdw12 = 0;
    assert_eq!(
        p.exec(b, wz, Xfer::None, vec![]).0.status(),
        Status::RESERVATION_CONFLICT
    );
    let mut fl = Sqe {
        nsid: 1,
        ..Default::default()
    };
    fl.set_opcode_cid(io::FLUSH, 0);
    assert_eq!(
        p.exec(b, fl, Xfer::None, vec![]).0.status(),
        Status::RESERVATION_CONFLICT
    );
    // B preempts with Exclusive Access: A's reads now conflict too.
    assert_eq!(
        resv(
            &mut p,
            b,
            io::RESERVATION_ACQUIRE,
            1 | 2 << 8,
            keys(0xb, 0xa)
        ),
        Status::SUCCESS
    );
    assert_eq!(read(&mut p, a, 10), Status::RESERVATION_CONFLICT);
    assert_eq!(write(&mut p, b, 11, 4), Status::SUCCESS);
    // B releases: everyone may write again.
    assert_eq!(
        resv(
            &mut p,
            b,
            io::RESERVATION_RELEASE,
            2 << 8,
            0xbu64.to_le_bytes().to_vec()
        ),
        Status::SUCCESS
    );
    assert_eq!(write(&mut p, a, 13, 5), Status::SUCCESS);
    assert_eq!(p.io.commands_in_flight(), 0);
}

#[test]
fn ana_path_states_and_visibility_on_the_offloaded_path() {
    let mut p = Pair::new();
    let l0 = ListenerInfo {
        transport: Transport::Tcp,
        addr: "127.0.0.1".parse().unwrap(),
        port: 4420,
    };
    let l1 = ListenerInfo {
        port: 4421,
        ..l0.clone()
    };
    p.target.add_listener(l0.clone());
    p.target.add_listener(l1.clone());
    let on = |l: &ListenerInfo| QueueOrigin {
        listener: Some(l.clone()),
        local: Some(l.addr),
        peer: None,
    };
    let (_, a) = host(&mut p, HOST_A, 0xa, on(&l0));
    let (_, b) = host(&mut p, HOST_B, 0xb, on(&l1));
    for (state, want) in [
        (AnaState::Inaccessible, Status::ANA_INACCESSIBLE),
        (AnaState::PersistentLoss, Status::ANA_PERSISTENT_LOSS),
        (AnaState::Change, Status::ANA_TRANSITION),
        (AnaState::NonOptimized, Status::SUCCESS),
    ] {
        let acts = p
            .target
            .set_ana_groups(
                NQN,
                vec![AnaGroup {
                    id: 1,
                    states: vec![(l1.clone(), state)],
                }],
            )
            .unwrap();
        drop(acts);
        p.publish_views();
        assert_eq!(read(&mut p, b, 0), want, "{state:?} on B's path");
        assert!(!want.dnr, "path statuses let the host fail over");
        assert_eq!(
            read(&mut p, a, 0),
            Status::SUCCESS,
            "A's path stays optimized"
        );
    }
    // Namespace 1 for host A only: B's commands get Invalid Namespace from the engine.
    p.target
        .set_namespace_hosts(NQN, 1, Some(vec![HOST_A.to_string()]))
        .unwrap();
    p.publish_views();
    assert_eq!(read(&mut p, b, 0), Status::INVALID_NAMESPACE);
    assert_eq!(write(&mut p, a, 0, 7), Status::SUCCESS);
    p.target.set_namespace_hosts(NQN, 1, None).unwrap();
    p.publish_views();
    assert_eq!(read(&mut p, b, 0), Status::SUCCESS);
}

/// Abort of a write still waiting for its data: the Abort says "aborted", the data the
/// host was asked for is still taken in, the write answers Abort Requested and the media
/// is untouched. A command that already ran is not aborted.
/// A write of host B admitted before A preempted B with Preempt and Abort, whose data
/// comes only after the preempt completed, does not land: the access view is checked
/// again when the data is in (Reservation Conflict), so a fenced host's write cannot
/// overtake the fence.
#[test]
fn a_write_admitted_before_preempt_and_abort_does_not_land_after_it() {
    let mut p = Pair::new();
    let (_, a) = host(&mut p, HOST_A, 0xa, QueueOrigin::default());
    let (_, b) = host(&mut p, HOST_B, 0xb, QueueOrigin::default());
    for (q, k) in [(a, 0xa), (b, 0xb)] {
        assert_eq!(
            resv(&mut p, q, io::RESERVATION_REGISTER, 0, keys(0, k)),
            Status::SUCCESS
        );
    }
    // B takes Write Exclusive and starts a write whose data it holds back.
    assert_eq!(
        resv(&mut p, b, io::RESERVATION_ACQUIRE, 1 << 8, keys(0xb, 0)),
        Status::SUCCESS
    );
    p.conns[b].auto_r2t = false;
    p.conns[b].host.set_max_incapsule(0);
    let data = pattern(7, 4096);
    let cid = p.submit(b, rw(io::WRITE, 60, 8), Xfer::ToController, data.clone());
    p.pump();
    let (c, ttag, off, len) = p.conns[b].r2ts.pop().expect("an R2T");
    assert_eq!(c, cid);
    // A fences B: Preempt and Abort (RACQA 2), Write Exclusive, B's key.
    assert_eq!(
        resv(
            &mut p,
            a,
            io::RESERVATION_ACQUIRE,
            2 | 1 << 8,
            keys(0xa, 0xb)
        ),
        Status::SUCCESS
    );
    // B's data arrives now: refused, and the blocks are untouched.
    p.conns[b].send_h2c(cid, ttag, off, &data[off as usize..(off + len) as usize]);
    let (cqe, _) = p.wait(b, cid);
    assert_eq!(cqe.status(), Status::RESERVATION_CONFLICT);
    assert_eq!(disk(&p, 60, 8), vec![0; 4096]);
    assert_eq!(
        write(&mut p, a, 60, 8),
        Status::SUCCESS,
        "the new holder writes"
    );
    assert_eq!(p.io.commands_in_flight(), 0);
}

/// Abort (SQID 1, `cid`) on admin queue `adm`: its completion.
fn abort(p: &mut Pair, adm: usize, cid: u16) -> nvmf::spec::Cqe {
    let mut sqe = Sqe {
        cdw10: 1 | (cid as u32) << 16,
        ..Default::default()
    };
    sqe.set_opcode_cid(admin::ABORT, 0);
    p.exec(adm, sqe, Xfer::None, vec![]).0
}

#[test]
fn abort_a_write_waiting_for_host_data() {
    let mut p = Pair::with_config(SoftConfig::default());
    let (adm, q) = p.controller(Digests::NONE, 31, 0);
    p.conns[q].auto_r2t = false;
    p.conns[q].host.set_max_incapsule(0);
    let data = pattern(9, 4096);
    let cid = p.submit(q, rw(io::WRITE, 40, 8), Xfer::ToController, data.clone());
    p.pump();
    let (c, ttag, off, len) = p.conns[q].r2ts.pop().expect("an R2T");
    assert_eq!(c, cid);
    let cqe = abort(&mut p, adm, cid);
    assert!(cqe.status().is_success());
    assert_eq!(cqe.dw0 & 1, 0, "aborted");
    // The host sends the data it was asked for; the command then ends, unrun.
    let part = data[off as usize..(off + len) as usize].to_vec();
    p.conns[q].send_h2c(cid, ttag, off, &part);
    let (cqe, _) = p.wait(q, cid);
    assert_eq!(cqe.status(), Status::ABORT_REQUESTED);
    assert_eq!(disk(&p, 40, 8), vec![0; 4096]);
    // A command that is done: not aborted.
    p.conns[q].auto_r2t = true;
    assert_eq!(write(&mut p, q, 50, 1), Status::SUCCESS);
    let cqe = abort(&mut p, adm, cid);
    assert_eq!(cqe.dw0 & 1, 1, "not aborted");
    assert_eq!(p.io.commands_in_flight(), 0);
}

pub(super) fn copy_sqe(dest: u64, nranges: u32) -> Sqe {
    let mut s = Sqe {
        nsid: 1,
        cdw10: dest as u32,
        cdw11: (dest >> 32) as u32,
        cdw12: nranges - 1,
        ..Default::default()
    };
    s.set_opcode_cid(io::COPY, 0);
    s
}

/// Copy: several source ranges land back to back at the destination; limits and LBA
/// ranges are checked before anything moves; a reservation refuses it like a write.
#[test]
fn copy_single_and_multi_range() {
    let mut p = Pair::new();
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    assert_eq!(
        p.exec(
            q,
            rw(io::WRITE, 100, 4),
            Xfer::ToController,
            pattern(1, 2048)
        )
        .0
        .status(),
        Status::SUCCESS
    );
    assert_eq!(
        p.exec(
            q,
            rw(io::WRITE, 300, 2),
            Xfer::ToController,
            pattern(2, 1024)
        )
        .0
        .status(),
        Status::SUCCESS
    );
    // One range.
    let ranges = nvmf::copy::encode_ranges(&[(100, 4)]);
    let (cqe, _) = p.exec(q, copy_sqe(1000, 1), Xfer::ToController, ranges);
    assert_eq!(cqe.status(), Status::SUCCESS);
    assert_eq!(disk(&p, 1000, 4), pattern(1, 2048));
    // Three ranges, one of them overlapping the first.
    let ranges = nvmf::copy::encode_ranges(&[(300, 2), (100, 4), (101, 1)]);
    let (cqe, _) = p.exec(q, copy_sqe(2000, 3), Xfer::ToController, ranges);
    assert_eq!(cqe.status(), Status::SUCCESS);
    let mut want = pattern(2, 1024);
    want.extend(pattern(1, 2048));
    want.extend_from_slice(&pattern(1, 2048)[512..1024]);
    assert_eq!(disk(&p, 2000, 7), want);
    // Past the end (a source, the destination), a format other than 0: nothing moves.
    let ops = p.backend_ops.lock().unwrap().len();
    let ranges = nvmf::copy::encode_ranges(&[(BLOCKS - 1, 2)]);
    assert_eq!(
        p.exec(q, copy_sqe(0, 1), Xfer::ToController, ranges)
            .0
            .status(),
        Status::LBA_OUT_OF_RANGE
    );
    let ranges = nvmf::copy::encode_ranges(&[(0, 2)]);
    assert_eq!(
        p.exec(
            q,
            copy_sqe(BLOCKS - 1, 1),
            Xfer::ToController,
            ranges.clone()
        )
        .0
        .status(),
        Status::LBA_OUT_OF_RANGE
    );
    let mut fmt1 = copy_sqe(0, 1);
    fmt1.cdw12 |= 1 << 8;
    assert_eq!(
        p.exec(q, fmt1, Xfer::ToController, ranges).0.status(),
        Status::INVALID_FIELD
    );
    // Format 1 with its own 40-byte descriptor: the format is refused, not the length.
    assert_eq!(
        p.exec(q, fmt1, Xfer::ToController, vec![0; 40]).0.status(),
        Status::INVALID_FIELD
    );
    // More blocks than one buffer (MCL = 1 MiB of 512-byte blocks = 2048).
    let ranges = nvmf::copy::encode_ranges(&[(0, 2048), (4096, 1)]);
    assert_eq!(
        p.exec(q, copy_sqe(6000, 2), Xfer::ToController, ranges)
            .0
            .status(),
        Status::COMMAND_SIZE_LIMIT_EXCEEDED
    );
    assert_eq!(p.backend_ops.lock().unwrap().len(), ops);
    assert_eq!(p.io.commands_in_flight(), 0);
}

#[test]
fn copy_is_a_write_for_reservations() {
    let mut p = Pair::new();
    let (_, a) = host(&mut p, HOST_A, 0xa, QueueOrigin::default());
    let (_, b) = host(&mut p, HOST_B, 0xb, QueueOrigin::default());
    assert_eq!(
        resv(&mut p, a, io::RESERVATION_REGISTER, 0, keys(0, 0xa)),
        Status::SUCCESS
    );
    assert_eq!(
        resv(&mut p, a, io::RESERVATION_ACQUIRE, 1 << 8, keys(0xa, 0)),
        Status::SUCCESS
    );
    let ranges = nvmf::copy::encode_ranges(&[(0, 1)]);
    assert_eq!(
        p.exec(b, copy_sqe(10, 1), Xfer::ToController, ranges.clone())
            .0
            .status(),
        Status::RESERVATION_CONFLICT
    );
    assert_eq!(
        p.exec(a, copy_sqe(10, 1), Xfer::ToController, ranges)
            .0
            .status(),
        Status::SUCCESS
    );
}

fn fused(opcode: u8, fuse: u8, slba: u64, nlb: u32) -> Sqe {
    let mut s = rw(opcode, slba, nlb);
    s.cdw0 |= (fuse as u32) << 8;
    s
}

/// Fused Compare and Write: match (both succeed, the write lands), mismatch (Compare
/// Failure, the write aborted as failed fused), a first without its second and a lone
/// second (Missing Fused), and a plain write to the range submitted behind the pair waits
/// until the pair is done.
#[test]
fn fused_compare_and_write() {
    fused_compare_and_write_on(Pair::new());
}

/// The same where reads and in-capsule writes take the RAM store's direct path: the pair
/// and a write waiting for its range still go through the backend queue, in order.
#[test]
fn fused_compare_and_write_beside_direct_ram_io() {
    fused_compare_and_write_on(Pair::lending(crate::soft::SoftConfig::default()));
}

/// An Abort of either half of a fused pair while its data is still coming is not carried
/// out (the pair runs together or not at all: aborting one half left the other waiting
/// forever); the pair then completes normally.
#[test]
fn aborting_half_of_a_fused_pair_leaves_the_pair_whole() {
    for half in [0usize, 1] {
        let mut p = Pair::new();
        let (adm, q) = p.controller(Digests::NONE, 31, 0);
        let old = pattern(1, 1024);
        let new = pattern(2, 1024);
        assert_eq!(
            p.exec(q, rw(io::WRITE, 5, 2), Xfer::ToController, old.clone())
                .0
                .status(),
            Status::SUCCESS
        );
        p.conns[q].auto_r2t = false;
        p.conns[q].host.set_max_incapsule(0);
        let (c1, c2) = submit_pair(&mut p, q, (5, &old), (5, &new));
        p.pump();
        let r2ts = std::mem::take(&mut p.conns[q].r2ts);
        assert_eq!(r2ts.len(), 2, "both halves asked for their data");
        let cid = [c1, c2][half];
        let cqe = abort(&mut p, adm, cid);
        assert!(cqe.status().is_success());
        assert_eq!(cqe.dw0 & 1, 1, "half {half}: not aborted");
        for (c, ttag, off, len) in r2ts {
            let data = if c == c1 { &old } else { &new };
            p.conns[q].send_h2c(c, ttag, off, &data[off as usize..(off + len) as usize]);
        }
        assert_eq!(p.wait(q, c1).0.status(), Status::SUCCESS, "half {half}");
        assert_eq!(p.wait(q, c2).0.status(), Status::SUCCESS, "half {half}");
        assert_eq!(disk(&p, 5, 2), new);
        assert_eq!(p.io.commands_in_flight(), 0);
    }
}

/// A half of a fused pair that fails a check of its own before it runs (its SGL's length,
/// MDTS) fails the other half too (Aborted - Failed Fused), whichever half it is and
/// whether the data comes in the capsule or by R2T. The other half used to wait forever,
/// its command slot with it. Nothing is written.
#[test]
fn a_half_that_fails_its_own_checks_takes_its_partner_along() {
    for incapsule in [true, false] {
        let mut p = Pair::new();
        let (_, q) = p.controller(Digests::NONE, 31, 0);
        let (old, new) = (pattern(1, 1024), pattern(2, 1024));
        assert_eq!(
            p.exec(q, rw(io::WRITE, 5, 2), Xfer::ToController, old.clone())
                .0
                .status(),
            Status::SUCCESS
        );
        if !incapsule {
            p.conns[q].host.set_max_incapsule(0);
        }
        // The second's SGL says 512 bytes for 2 blocks, then the first's does.
        for bad_second in [true, false] {
            let (cmp, wr) = if bad_second {
                (&old[..], &new[..512])
            } else {
                (&old[..512], &new[..])
            };
            let (c1, c2) = submit_pair(&mut p, q, (5, cmp), (5, wr));
            let (bad, other) = if bad_second { (c2, c1) } else { (c1, c2) };
            let at = format!("bad second {bad_second}, in capsule {incapsule}");
            let st = p.wait(q, bad).0.status();
            assert_eq!(st, Status::DATA_SGL_LENGTH_INVALID, "{at}");
            let st = p.wait(q, other).0.status();
            assert_eq!(st, Status::ABORTED_FAILED_FUSED, "{at}");
        }
        // Both over MDTS (1 MiB here; the second's SGL says 1 KiB): the second is refused
        // first, the first goes with it.
        let big = vec![0u8; 1024];
        let cmp = fused(io::COMPARE, 1, 0, 4096);
        let c1 = p.submit(q, cmp, Xfer::ToController, vec![0; 4096 * 512]);
        let c2 = p.submit(q, fused(io::WRITE, 2, 0, 4096), Xfer::ToController, big);
        let at = format!("over MDTS, in capsule {incapsule}");
        assert_eq!(p.wait(q, c2).0.status(), Status::INVALID_FIELD, "{at}");
        assert_eq!(
            p.wait(q, c1).0.status(),
            Status::ABORTED_FAILED_FUSED,
            "{at}"
        );
        assert_eq!(disk(&p, 5, 2), old);
        assert_eq!(p.io.commands_in_flight(), 0, "in capsule {incapsule}");
        // The queue goes on: a good pair works.
        let (c1, c2) = submit_pair(&mut p, q, (5, &old), (5, &new));
        assert_eq!(p.wait(q, c1).0.status(), Status::SUCCESS);
        assert_eq!(p.wait(q, c2).0.status(), Status::SUCCESS);
        assert_eq!(disk(&p, 5, 2), new);
    }
}

/// A fused Compare (first) and Write (second), each of 2 blocks at its own LBA, with
/// their data: the pair's CIDs.
fn submit_pair(p: &mut Pair, q: usize, compare: (u64, &[u8]), write: (u64, &[u8])) -> (u16, u16) {
    let c1 = p.submit(
        q,
        fused(io::COMPARE, 1, compare.0, 2),
        Xfer::ToController,
        compare.1.to_vec(),
    );
    let c2 = p.submit(
        q,
        fused(io::WRITE, 2, write.0, 2),
        Xfer::ToController,
        write.1.to_vec(),
    );
    (c1, c2)
}

fn fused_compare_and_write_on(mut p: Pair) {
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    let (old, new, other) = (pattern(1, 1024), pattern(2, 1024), pattern(3, 1024));
    assert_eq!(
        p.exec(q, rw(io::WRITE, 5, 2), Xfer::ToController, old.clone())
            .0
            .status(),
        Status::SUCCESS
    );
    // Match.
    let (c1, c2) = submit_pair(&mut p, q, (5, &old), (5, &new));
    assert_eq!(p.wait(q, c1).0.status(), Status::SUCCESS);
    assert_eq!(p.wait(q, c2).0.status(), Status::SUCCESS);
    assert_eq!(disk(&p, 5, 2), new);
    // Mismatch: nothing written.
    let (c1, c2) = submit_pair(&mut p, q, (5, &old), (5, &other));
    assert_eq!(p.wait(q, c1).0.status(), Status::COMPARE_FAILURE);
    assert_eq!(p.wait(q, c2).0.status(), Status::ABORTED_FAILED_FUSED);
    assert_eq!(disk(&p, 5, 2), new);
    // A first followed by something else; a lone second; a pair over different ranges.
    let c1 = p.submit(
        q,
        fused(io::COMPARE, 1, 5, 2),
        Xfer::ToController,
        new.clone(),
    );
    let r = p.submit(q, rw(io::READ, 5, 2), Xfer::FromController, vec![0; 1024]);
    assert_eq!(p.wait(q, c1).0.status(), Status::ABORTED_MISSING_FUSED);
    assert_eq!(p.wait(q, r).0.status(), Status::SUCCESS);
    let c2 = p.submit(
        q,
        fused(io::WRITE, 2, 5, 2),
        Xfer::ToController,
        other.clone(),
    );
    assert_eq!(p.wait(q, c2).0.status(), Status::ABORTED_MISSING_FUSED);
    let (c1, c2) = submit_pair(&mut p, q, (5, &new), (6, &other));
    assert_eq!(p.wait(q, c1).0.status(), Status::ABORTED_MISSING_FUSED);
    assert_eq!(p.wait(q, c2).0.status(), Status::ABORTED_MISSING_FUSED);
    assert_eq!(disk(&p, 5, 2), new);
    // FUSE 11b is reserved: not run.
    let w = p.submit(
        q,
        fused(io::WRITE, 3, 5, 2),
        Xfer::ToController,
        other.clone(),
    );
    assert_eq!(p.wait(q, w).0.status(), Status::INVALID_FIELD);
    assert_eq!(disk(&p, 5, 2), new);
    // Atomic against a write to the range queued right behind it: the pair compares and
    // writes first, the plain write lands after.
    let ops0 = p.backend_ops.lock().unwrap().len();
    let (c1, c2) = submit_pair(&mut p, q, (5, &new), (5, &other));
    let w = p.submit(
        q,
        rw(io::WRITE, 6, 1),
        Xfer::ToController,
        old[..512].to_vec(),
    );
    assert_eq!(p.wait(q, c1).0.status(), Status::SUCCESS);
    assert_eq!(p.wait(q, c2).0.status(), Status::SUCCESS);
    assert_eq!(p.wait(q, w).0.status(), Status::SUCCESS);
    let ops: Vec<_> = p.backend_ops.lock().unwrap()[ops0..].to_vec();
    assert_eq!(ops.len(), 3, "{ops:?}");
    assert!(matches!(ops[0], backend::Op::Read), "{ops:?}");
    assert!(
        matches!(ops[1], backend::Op::Write { .. }) && matches!(ops[2], backend::Op::Write { .. }),
        "{ops:?}"
    );
    let mut want = other[..512].to_vec();
    want.extend_from_slice(&old[..512]);
    assert_eq!(disk(&p, 5, 2), want);
    assert_eq!(p.io.commands_in_flight(), 0);
}

/// A namespace the target took out because its storage is gone (`namespace_lost`, after
/// one IO thread's backend error or a hang) answers Internal Path Error on the offloaded
/// path of every queue, even where its backend still works: hosts were told it left the
/// active list, and no write may land on it behind their backs (the audit of 2026-11-27:
/// a new controller read and wrote a lost namespace whose file had come back).
#[test]
fn a_lost_namespace_serves_no_io_on_the_offloaded_path() {
    let mut p = Pair::new();
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    assert_eq!(write(&mut p, q, 0, 1), Status::SUCCESS);
    p.target.namespace_lost(NQN, 1).unwrap();
    let actions = p.target.take_actions();
    p.apply(actions);
    p.publish_views();
    assert_eq!(read(&mut p, q, 0), Status::INTERNAL_PATH_ERROR);
    assert_eq!(write(&mut p, q, 0, 2), Status::INTERNAL_PATH_ERROR);
    let (_, q2) = p.controller(Digests::NONE, 31, 0);
    assert_eq!(read(&mut p, q2, 0), Status::INTERNAL_PATH_ERROR);
}

/// A Copy as large as the namespace allows (MCL: the max I/O size) is served on a
/// connection whose buffer budget is at its smallest (one max I/O size) and that holds
/// nothing else: its own descriptors do not count against it (the review of 2026-11-27:
/// charging the copy's buffers refused every Copy of half MCL or more there, Command
/// Interrupted without DNR, for ever).
#[test]
fn a_largest_copy_fits_the_smallest_connection_budget() {
    let cfg = SoftConfig::default();
    let max = cfg.max_io_size;
    let mut p = Pair::with_config(SoftConfig {
        limits: crate::EngineLimits {
            connection_buffer_bytes: max as usize,
            ..Default::default()
        },
        ..cfg
    });
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    let blocks = max / 512;
    let ranges = nvmf::copy::encode_ranges(&[(0, blocks)]);
    let (cqe, _) = p.exec(
        q,
        copy_sqe(u64::from(blocks), 1),
        Xfer::ToController,
        ranges,
    );
    assert_eq!(cqe.status(), Status::SUCCESS);
}
