//! The offloaded data path through the soft engine, whole conversations in memory.

use nvmf::spec::opcodes::{admin, io};
use nvmf::spec::{sgl, Cqe, SglDescriptor, Sqe, Status};
use nvmf::tcp::{self, Digests, Pdu, RxFramer, Xfer};

use super::pair::*;
use crate::soft::SoftConfig;
use crate::Engine;

const DIGEST_CASES: [Digests; 3] = [
    Digests::NONE,
    Digests {
        header: true,
        data: false,
    },
    Digests::BOTH,
];

fn ok(cqe: &Cqe, what: &str) {
    assert!(cqe.status().is_success(), "{what}: {}", cqe.status());
}

#[test]
fn write_then_read_in_capsule_and_by_r2t_with_and_without_digests() {
    for d in DIGEST_CASES {
        for incapsule in [0u32, 8192] {
            let mut p = Pair::new();
            let (_, q) = p.controller(d, 31, 0);
            p.conns[q].host.set_max_incapsule(incapsule);
            for (k, nlb) in [1u32, 8, 16, 17, 64, 256].into_iter().enumerate() {
                let slba = k as u64 * 300;
                let data = pattern(k as u64, nlb as usize * 512);
                let (cqe, _) = p.exec(
                    q,
                    rw(io::WRITE, slba, nlb),
                    Xfer::ToController,
                    data.clone(),
                );
                ok(&cqe, "write");
                assert_eq!(
                    disk(&p, slba, nlb),
                    data,
                    "{d:?} in-capsule {incapsule} nlb {nlb}"
                );
                let (cqe, back) = p.exec(
                    q,
                    rw(io::READ, slba, nlb),
                    Xfer::FromController,
                    vec![0; data.len()],
                );
                ok(&cqe, "read");
                assert_eq!(back, data, "{d:?} nlb {nlb}");
            }
            assert_eq!(p.io.commands_in_flight(), 0, "every slot released");
        }
    }
}

#[test]
fn flush_write_zeroes_fua_dsm_and_compare() {
    let mut p = Pair::new();
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    let data = pattern(5, 4096);
    ok(
        &p.exec(q, rw(io::WRITE, 10, 8), Xfer::ToController, data.clone())
            .0,
        "write",
    );
    let mut flush = Sqe::default();
    flush.set_opcode_cid(io::FLUSH, 0);
    flush.nsid = 1;
    ok(&p.exec(q, flush, Xfer::None, Vec::new()).0, "flush");
    // Compare: equal, then different.
    ok(
        &p.exec(q, rw(io::COMPARE, 10, 8), Xfer::ToController, data.clone())
            .0,
        "compare",
    );
    // SMART counts a Compare as a read: Host Read Commands and Data Units Read.
    let t = p.sta.stats().namespace(p.subsys, 1);
    assert_eq!(
        (t.read_cmds, t.read_bytes),
        (1, 4096),
        "Compare counts as a read"
    );
    let mut other = data.clone();
    other[100] ^= 1;
    let (cqe, _) = p.exec(q, rw(io::COMPARE, 10, 8), Xfer::ToController, other);
    assert_eq!(cqe.status(), Status::COMPARE_FAILURE);
    // Write Zeroes with FUA: the backend is asked for durable zeroes (one request, no
    // separate Flush), and without FUA it is not.
    let mut wz = rw(io::WRITE_ZEROES, 12, 2);
    wz.cdw12 |= 1 << 30;
    p.backend_ops.lock().unwrap().clear();
    ok(&p.exec(q, wz, Xfer::None, Vec::new()).0, "write zeroes FUA");
    assert_eq!(
        *p.backend_ops.lock().unwrap(),
        [backend::Op::WriteZeroes { fua: true }]
    );
    let mut want = data.clone();
    want[1024..2048].fill(0);
    assert_eq!(disk(&p, 10, 8), want);
    ok(
        &p.exec(q, rw(io::WRITE_ZEROES, 10, 1), Xfer::None, Vec::new())
            .0,
        "write zeroes",
    );
    want[..512].fill(0);
    assert_eq!(disk(&p, 10, 8), want);
    // DSM deallocate of two ranges (one of length 0, skipped): reads return zeroes.
    let mut ranges = Vec::new();
    for (len, slba) in [(2u32, 14u64), (0, 0)] {
        ranges.extend_from_slice(&0u32.to_le_bytes());
        ranges.extend_from_slice(&len.to_le_bytes());
        ranges.extend_from_slice(&slba.to_le_bytes());
    }
    let mut dsm = Sqe::default();
    dsm.set_opcode_cid(io::DATASET_MANAGEMENT, 0);
    dsm.nsid = 1;
    dsm.cdw10 = 1;
    dsm.cdw11 = 1 << 2;
    ok(&p.exec(q, dsm, Xfer::ToController, ranges).0, "dsm");
    want[2048..3072].fill(0);
    assert_eq!(disk(&p, 10, 8), want);
    let t = p.sta.stats().namespace(p.subsys, 1);
    assert_eq!(
        (t.write_cmds, t.errors),
        (1, 1),
        "counters: one write, one miscompare"
    );
    assert_eq!(p.io.commands_in_flight(), 0);
}

#[test]
fn error_statuses() {
    let mut p = Pair::new();
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    // Past the end of the namespace.
    let (cqe, _) = p.exec(
        q,
        rw(io::READ, BLOCKS - 1, 2),
        Xfer::FromController,
        vec![0; 1024],
    );
    assert_eq!(cqe.status(), Status::LBA_OUT_OF_RANGE);
    // Beyond MDTS (1 MiB by default): Invalid Field.
    let (cqe, _) = p.exec(
        q,
        rw(io::READ, 0, 4096),
        Xfer::FromController,
        vec![0; 2 << 20],
    );
    assert_eq!(cqe.status(), Status::INVALID_FIELD);
    // A namespace the subsystem does not have: not offloaded, the target answers.
    let mut s = rw(io::READ, 0, 1);
    s.nsid = 9;
    let (cqe, _) = p.exec(q, s, Xfer::FromController, vec![0; 512]);
    assert_eq!(cqe.status(), Status::INVALID_NAMESPACE);
    // SGL shorter and longer than NLB: Data SGL Length Invalid (as nvmet).
    for len in [2048usize, 8192] {
        let (cqe, _) = p.exec(q, rw(io::READ, 0, 8), Xfer::FromController, vec![0; len]);
        assert_eq!(
            cqe.status(),
            Status::DATA_SGL_LENGTH_INVALID,
            "read SGL {len}"
        );
        let (cqe, _) = p.exec(q, rw(io::WRITE, 0, 8), Xfer::ToController, vec![1; len]);
        assert_eq!(
            cqe.status(),
            Status::DATA_SGL_LENGTH_INVALID,
            "write SGL {len}"
        );
    }
    assert_eq!(disk(&p, 0, 8), vec![0; 4096], "nothing written");
    assert_eq!(p.io.commands_in_flight(), 0);
}

/// Forged capsules: in-capsule data at an offset that runs past the data, a keyed SGL on
/// TCP, in-capsule data for a read.
#[test]
fn sgl_checks_on_forged_capsules() {
    let mut p = Pair::new();
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    let cases = [
        (
            io::WRITE,
            SglDescriptor::unkeyed(sgl::TYPE_DATA_BLOCK, sgl::SUBTYPE_OFFSET, 16, 512),
            512,
            Status::SGL_OFFSET_INVALID,
        ),
        (
            io::WRITE,
            SglDescriptor::keyed(sgl::SUBTYPE_ADDRESS, 0x1000, 512, 7),
            512,
            Status::SGL_DESCRIPTOR_TYPE_INVALID,
        ),
        (
            io::READ,
            SglDescriptor::unkeyed(sgl::TYPE_DATA_BLOCK, sgl::SUBTYPE_OFFSET, 0, 512),
            512,
            Status::DATA_SGL_LENGTH_INVALID,
        ),
        (
            io::WRITE,
            SglDescriptor::unkeyed(sgl::TYPE_DATA_BLOCK, sgl::SUBTYPE_OFFSET, 0, 1024),
            512,
            Status::DATA_SGL_LENGTH_INVALID,
        ),
    ];
    for (cid, (op, dptr, data_len, want)) in cases.into_iter().enumerate() {
        let mut s = rw(op, 0, 1);
        s.set_opcode_cid(op, 200 + cid as u16);
        s.dptr = dptr;
        let mut b = Vec::new();
        tcp::encode_capsule_cmd(&mut b, &s, &vec![3u8; data_len], Digests::NONE, 0);
        p.conns[q].send_raw(&b);
        p.pump();
        // The host machine does not know these CIDs: it reports the completion as
        // unexpected, which is what we look at.
        match p.conns[q].error.take() {
            Some(nvmf::tcp::HostError::Unexpected(m)) => {
                assert!(m.contains(&format!("idle CID {}", 200 + cid)), "{m}")
            }
            other => panic!("case {cid}: {other:?}"),
        }
        let st = p.sta.stats().namespace(p.subsys, 1);
        let idx = crate::error_status_index(want);
        assert!(st.errors_by_status[idx] >= 1, "case {cid}: {want}");
    }
}

/// SQHD: counts capsules and wraps at the I/O queue's SQSIZE + 1; with SQ flow control
/// disabled it is FFFFh and a read's completion rides on C2HData's SUCCESS flag.
#[test]
fn sqhd_and_success_flag() {
    let mut p = Pair::new();
    let (_, q) = p.controller(Digests::NONE, 7, 0);
    let mut heads = Vec::new();
    for _ in 0..10 {
        let (cqe, _) = p.exec(q, rw(io::READ, 0, 1), Xfer::FromController, vec![0; 512]);
        heads.push(cqe.sqhd);
    }
    // The Connect was capsule 1 of 8 entries.
    assert_eq!(heads, [2, 3, 4, 5, 6, 7, 0, 1, 2, 3]);

    let mut p = Pair::new();
    let (_, q) = p.controller(Digests::NONE, 31, 1 << 2);
    let (cqe, _) = p.exec(q, rw(io::WRITE, 0, 1), Xfer::ToController, vec![1; 512]);
    assert_eq!(cqe.sqhd, 0xffff);
    // Look at the raw bytes of a read: one C2HData with LAST_PDU|SUCCESS, no CapsuleResp.
    let cid = p.submit(q, rw(io::READ, 0, 1), Xfer::FromController, vec![0; 512]);
    let c = &mut p.conns[q];
    let n = c.tx.len();
    c.pipe.borrow_mut().to_target.extend(c.tx.drain(..n));
    p.io.progress_at(p.now);
    let wire = std::mem::take(&mut p.conns[q].pipe.borrow_mut().to_host);
    let mut f = RxFramer::new_host(tcp::HostLimits {
        hpda: 0,
        max_c2h_data: 1 << 20,
    });
    // The host framer needs its ICResp first.
    let mut ic = Vec::new();
    tcp::encode_ic_resp(
        &mut ic,
        &tcp::IcResp {
            pfv: 0,
            cpda: 0,
            digests: Digests::NONE,
            maxh2cdata: 4096,
        },
    );
    f.parse(&ic).unwrap();
    let (pdu, used) = f.parse(&wire).unwrap().unwrap();
    assert!(matches!(
        pdu,
        Pdu::C2HData {
            cccid,
            last: true,
            success: true,
            ..
        } if cccid == cid
    ));
    assert_eq!(used, wire.len(), "nothing after the C2HData");
}

/// The admin queue's SQHD wraps at the SQSIZE the host asked for, not at 32.
#[test]
fn admin_sqhd_wraps_at_negotiated_size() {
    let mut p = Pair::new();
    let a = p.admin(Digests::NONE, 63, 0);
    let mut ka = Sqe::default();
    ka.set_opcode_cid(admin::KEEP_ALIVE, 0);
    let mut last = 0;
    // Connect and Property Set were capsules 1 and 2.
    for _ in 0..40 {
        let (cqe, _) = p.exec(a, ka, Xfer::None, Vec::new());
        ok(&cqe, "keep alive");
        last = cqe.sqhd;
    }
    assert_eq!(last, 42);
}

/// A bigger MDTS configured in the engine (`SoftConfig::with_max_io_size`): 2 MiB writes
/// (in 128 KiB H2CData PDUs) and reads in one command.
#[test]
fn two_mib_transfers_with_a_larger_max_io_size() {
    let cfg = SoftConfig::with_max_io_size(2 << 20);
    assert_eq!(cfg.max_h2c_data, 128 * 1024);
    let mut p = Pair::with_config(cfg);
    let (_, q) = p.controller(Digests::BOTH, 31, 0);
    let data = pattern(9, 2 << 20);
    ok(
        &p.exec(q, rw(io::WRITE, 0, 4096), Xfer::ToController, data.clone())
            .0,
        "write",
    );
    let (cqe, back) = p.exec(
        q,
        rw(io::READ, 0, 4096),
        Xfer::FromController,
        vec![0; 2 << 20],
    );
    ok(&cqe, "read");
    assert!(back == data);
}

/// Dataset Management the way the Linux host sends it: one range in a 4 KiB buffer (room
/// for 256 ranges, `nvme_setup_discard`), in-capsule and by R2T. nvmet accepts the longer
/// SGL for DSM; so must we (blkdiscard in the interop guest depends on it).
#[test]
fn dsm_with_the_linux_hosts_4k_range_buffer() {
    for incapsule in [8192u32, 0] {
        let mut p = Pair::new();
        let (_, q) = p.controller(Digests::NONE, 31, 0);
        p.conns[q].host.set_max_incapsule(incapsule);
        let data = pattern(3, 8 * 512);
        ok(
            &p.exec(q, rw(io::WRITE, 40, 8), Xfer::ToController, data).0,
            "write",
        );
        let mut buf = vec![0u8; 4096];
        buf[4..8].copy_from_slice(&8u32.to_le_bytes());
        buf[8..16].copy_from_slice(&40u64.to_le_bytes());
        let mut dsm = Sqe::default();
        dsm.set_opcode_cid(io::DATASET_MANAGEMENT, 0);
        dsm.nsid = 1;
        dsm.cdw10 = 0; // one range
        dsm.cdw11 = 1 << 2;
        let (cqe, _) = p.exec(q, dsm, Xfer::ToController, buf);
        ok(&cqe, &format!("DSM, in-capsule limit {incapsule}"));
        assert_eq!(disk(&p, 40, 8), vec![0; 4096]);
    }
}
