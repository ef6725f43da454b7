//! What hosts other than the Linux kernel do, end to end against the daemon, with the
//! repo's own initiator playing each host: CC.CSS 110b (NVMe 2.0 hosts such as SPDK's
//! once CAP.CSS bit 6 is set), a random HOSTID per I/O queue Connect, an empty Host NQN
//! (`spdk_nvme_perf` without a hostnqn), SQ flow control disabled (every completion must
//! report SQHD FFFFh, the ones the engine builds included), admin queues of other sizes
//! than 32 (SQHD wraps at the size the host negotiated).

mod common;

use std::time::Duration;

use common::*;
use nvmf::spec::log::lid;
use nvmf::spec::opcodes::admin;
use nvmf::spec::{Sqe, Status};
use nvmf_initiator::{Error, HostOptions, Request, TcpHost};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn admin_sqe(opcode: u8, nsid: u32) -> Sqe {
    let mut s = Sqe {
        nsid,
        ..Default::default()
    };
    s.set_opcode_cid(opcode, 0);
    s
}

/// Identify with CNS and CSI (CDW11 bits 31:24).
fn identify_sqe(cns: u8, nsid: u32, csi: u8) -> Sqe {
    Sqe {
        cdw10: cns as u32,
        cdw11: (csi as u32) << 24,
        ..admin_sqe(admin::IDENTIFY, nsid)
    }
}

/// Get Log Page of `len` bytes with CSI (CDW14 bits 31:24).
fn log_sqe(lid: u8, len: u32, csi: u8) -> Sqe {
    let numd = len / 4 - 1;
    Sqe {
        cdw10: lid as u32 | (numd & 0xffff) << 16,
        cdw11: numd >> 16,
        cdw14: (csi as u32) << 24,
        ..admin_sqe(admin::GET_LOG_PAGE, 0)
    }
}

/// 4 KiB written, then read back, on `q`.
fn roundtrip(q: &mut TcpHost, seed: u64, what: &str) {
    let data = pattern(seed, 4096);
    assert_ok(q.write(1, seed * 8, &data, false).expect("write"), what);
    let mut back = vec![0u8; 4096];
    assert_ok(q.read(1, seed * 8, 8, &mut back).expect("read"), what);
    assert!(back == data, "{what}: data read back differs");
}

/// CC.CSS = 110b ("all supported I/O command sets") enables both the discovery and an
/// I/O controller, and what such a host asks next is answered. Before: CSTS.CFS.
#[test]
fn css_110b_host_enables_identifies_and_does_io() {
    let _w = watchdog("css_110b", secs(60));
    let mut d = Daemon::start_default();
    let opts = HostOptions {
        cc_css: 0b110,
        ..host_opts()
    };
    // CAP.CSS advertises bit 0 and bit 6 (what makes such hosts choose 110b).
    let mut disc = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq");
    disc.connect_admin(DISCOVERY_NQN, 0)
        .expect("Connect discovery");
    let cap = disc.property_get(0, true).expect("CAP");
    assert_ne!(cap & 1 << 37, 0, "CAP.CSS bit 0 (NVM)");
    assert_ne!(cap & 1 << 43, 0, "CAP.CSS bit 6 (I/O command sets)");
    disc.enable_controller()
        .expect("discovery controller enables with CC.CSS 110b");
    let log = disc
        .get_log_page(0x70, 0, 0, 1024, false)
        .expect("discovery log");
    assert!(le64(&log, 8) >= 1, "discovery log has records");

    let mut c = controller(&d, 1, &opts);
    assert_eq!(
        c.admin.property_get(0x14, false).expect("CC") >> 4 & 7,
        0b110,
        "CC.CSS reads back"
    );
    for (cns, nsid, what) in [
        (0x05u8, 1u32, "CNS 05h (NVM namespace)"),
        (0x06, 0, "CNS 06h (NVM controller)"),
        (0x1c, 0, "CNS 1Ch (I/O command set vector)"),
        (0x08, 1, "CNS 08h (independent namespace)"),
    ] {
        let (cqe, data) = c
            .admin
            .submit_admin_raw(identify_sqe(cns, nsid, 0), &[], 4096)
            .expect("identify");
        assert_ok(cqe.status(), what);
        if cns == 0x1c {
            assert_eq!(le64(&data, 0), 1, "{what}: combination 0 is NVM only");
        }
    }
    let (cqe, data) = c
        .admin
        .submit_admin_raw(log_sqe(lid::COMMANDS_EFFECTS, 4096, 0), &[], 4096)
        .expect("effects log");
    assert_ok(cqe.status(), "Commands Supported and Effects, CSI 00h");
    assert_eq!(le32(&data, 1024 + 4 * 0x02) & 1, 1, "Read supported");
    // Zoned (CSI 02h), which nvme-cli 2.13 asks for too: the admin commands, no I/O one.
    let admin_part = data[..1024].to_vec();
    let (cqe, data) = c
        .admin
        .submit_admin_raw(log_sqe(lid::COMMANDS_EFFECTS, 4096, 2), &[], 4096)
        .expect("effects log");
    assert_ok(cqe.status(), "Commands Supported and Effects, CSI 02h");
    assert_eq!(data[..1024], admin_part[..], "CSI 02h: the admin commands");
    assert!(
        data[1024..].iter().all(|&b| b == 0),
        "CSI 02h: no I/O command"
    );
    let (cqe, data) = c
        .admin
        .submit_admin_raw(log_sqe(lid::SUPPORTED_LOG_PAGES, 1024, 0), &[], 1024)
        .expect("supported log pages");
    assert_ok(cqe.status(), "Supported Log Pages");
    for l in [0usize, 1, 2, 3, 4, 5] {
        assert_eq!(data[l * 4] & 1, 1, "LID {l:#x} supported");
    }
    roundtrip(&mut c.io[0], 3, "I/O with CC.CSS 110b");
    assert_serves(&mut d);
}

/// A host that makes a new HOSTID for every I/O queue Connect reaches its controller
/// (found by SUBNQN + HOSTNQN + CNTLID), whose HOSTID stays the admin queue's. Before:
/// every I/O queue Connect was Connect Invalid Parameters (HOSTID).
#[test]
fn random_hostid_per_io_queue_connects() {
    let _w = watchdog("random_hostid", secs(60));
    let mut d = Daemon::start_default();
    let opts = HostOptions {
        random_hostid_per_queue: true,
        ..host_opts()
    };
    let mut c = controller(&d, 2, &opts);
    let ids: Vec<[u8; 16]> = c.io.iter().map(|q| q.connect_hostid().unwrap()).collect();
    assert!(
        ids[0] != ids[1] && ids[0] != opts.hostid,
        "the host really varied it"
    );
    for (i, q) in c.io.iter_mut().enumerate() {
        roundtrip(q, 10 + i as u64, &format!("I/O queue {}", i + 1));
    }
    // Get Features Host Identifier (EXHID) returns the admin queue's HOSTID.
    let mut sqe = admin_sqe(admin::GET_FEATURES, 0);
    sqe.cdw10 = 0x81;
    sqe.cdw11 = 1;
    let (cqe, data) = c
        .admin
        .submit_admin_raw(sqe, &[], 16)
        .expect("get features");
    assert_ok(cqe.status(), "Get Features Host Identifier");
    assert_eq!(
        data, opts.hostid,
        "the controller's HOSTID is the admin queue's"
    );
    assert_serves(&mut d);
}

/// `spdk_nvme_perf`'s empty Host NQN: accepted by a subsystem that allows any host (with
/// one warning in the log), refused as Connect Invalid Host by one with a hosts list, with
/// the reason in the log. Before: Connect Invalid Parameters everywhere, nothing logged.
#[test]
fn empty_host_nqn_is_accepted_where_any_host_is() {
    let _w = watchdog("empty_hostnqn", secs(60));
    let mut d = Daemon::start_default();
    let opts = host_opts().with_empty_hostnqn();
    // Twice: the warning is said once per subsystem.
    for round in 0..2 {
        let mut c = controller(&d, 1, &opts);
        roundtrip(&mut c.io[0], 20 + round, "I/O with an empty host NQN");
    }
    let mut disc = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq");
    disc.connect_admin(DISCOVERY_NQN, 0)
        .expect("discovery with an empty host NQN");
    // A subsystem with a hosts list: Connect Invalid Host.
    let mut h = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq");
    let s = err_status(h.connect_admin(RESTRICTED_NQN, 0), "Connect restricted");
    assert_status(
        s,
        Status::CONNECT_INVALID_HOST,
        "empty host NQN, hosts list",
    );
    let log = wait_for_log(&d, "empty_host_nqn_not_allowed");
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("accepted an empty host NQN") && l.contains(SUBNQN))
        .collect();
    assert_eq!(warned.len(), 1, "warned once for {SUBNQN}:\n{log}");
    assert!(warned[0].contains("spdk_nvme_perf") && warned[0].contains("WARN"));
    let refused = log
        .lines()
        .find(|l| l.contains("empty_host_nqn_not_allowed"))
        .unwrap();
    for part in [
        "WARN",
        "peer 127.0.0.1:",
        "listener tcp0",
        RESTRICTED_NQN,
        "qid 0",
    ] {
        assert!(refused.contains(part), "{part:?} missing from {refused}");
    }
    assert_serves(&mut d);
}

/// The daemon's log once it contains `needle` (lines arrive asynchronously).
fn wait_for_log(d: &Daemon, needle: &str) -> String {
    let deadline = std::time::Instant::now() + secs(5);
    loop {
        let log = d.log();
        if log.contains(needle) || std::time::Instant::now() > deadline {
            return log;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SQ flow control disabled (Connect CATTR bit 2): every completion reports SQHD FFFFh,
/// on the admin queue and the I/O queues, for the target's answers and for the ones the
/// engine builds (reads, writes, their errors). The initiator fails any other SQHD.
/// Before: the engine overwrote SQHD with its head on every completion it sent.
#[test]
fn sq_flow_control_disabled_reports_sqhd_ffffh_everywhere() {
    let _w = watchdog("sqflow", secs(60));
    let mut d = Daemon::start_default();
    let opts = HostOptions {
        disable_sq_flow_control: true,
        io_max_incapsule: IO_INCAPSULE,
        ..host_opts()
    };
    let mut c = controller(&d, 1, &opts);
    c.admin.identify(1, 0).expect("Identify with SQHD FFFFh");
    c.admin.keep_alive().expect("Keep Alive with SQHD FFFFh");
    let q = &mut c.io[0];
    // In-capsule write, R2T write, read (C2HData with SUCCESS carries no CQE), and a
    // read the engine fails (its own error completion).
    let data = pattern(7, 4096);
    assert_ok(q.write(1, 0, &data, false).expect("write"), "write");
    let big = pattern(8, 64 << 10);
    assert_ok(q.write(1, 64, &big, true).expect("write R2T"), "write R2T");
    let mut back = vec![0u8; 64 << 10];
    assert_ok(q.read(1, 64, 128, &mut back).expect("read"), "read");
    assert!(back == big);
    let mut one = vec![0u8; 512];
    let s = q
        .read(1, NS1_SIZE / 512, 1, &mut one)
        .expect("read past end");
    assert_status(s, Status::LBA_OUT_OF_RANGE, "read past the end");
    // Pipelined, so completions of many commands are checked.
    let reqs = (0..64u64)
        .map(|i| Request::read(1, i * 8, 8, vec![0; 4096]))
        .collect();
    for cpl in run_pipelined(q, reqs, 16) {
        assert_ok(cpl.cqe.status(), "pipelined read");
    }
    assert_ok(q.flush(1).expect("flush"), "flush");
    assert_serves(&mut d);
}

/// Admin queues of the sizes hosts use: SQSIZE 1 (2 entries, SPDK's smallest) and 127
/// (128 entries). SQHD wraps at the negotiated size, not at 32. Before: SQSIZE below 31
/// was refused, and the admin queue's SQHD wrapped at 32 whatever it was.
#[test]
fn admin_queue_sizes_and_sqhd_wrap() {
    let _w = watchdog("admin_sqsize", secs(60));
    let mut d = Daemon::start_default();
    for (sqsize, commands) in [(127u16, 150u32), (1, 6), (4095, 40)] {
        let opts = HostOptions {
            admin_sqsize: sqsize,
            ..host_opts()
        };
        let entries = sqsize as u32 + 1;
        let mut h = TcpHost::connect(d.addr(), opts).expect("ICReq");
        h.connect_admin(SUBNQN, 0)
            .unwrap_or_else(|e| panic!("admin Connect with SQSIZE {sqsize}: {e}"));
        // The Connect was command 1. Each Property Get takes one more entry.
        for k in 2..=commands {
            let p = nvmf::spec::fabrics::PropertyCommand {
                attrib: 0,
                offset: 0x1c,
                value: 0,
            };
            let (cqe, _) = h
                .submit_admin_raw(p.to_sqe(0, false), &[], 0)
                .expect("CSTS");
            assert_ok(cqe.status(), "Property Get");
            assert_eq!(
                cqe.sqhd as u32,
                k % entries,
                "SQSIZE {sqsize}: SQHD after {k} commands"
            );
        }
        h.enable_controller().expect("enable");
        h.identify(1, 0).expect("identify");
    }
    // An admin queue of 4097 entries does not exist.
    let mut h = TcpHost::connect(
        d.addr(),
        HostOptions {
            admin_sqsize: 4096,
            ..host_opts()
        },
    )
    .expect("ICReq");
    match h.connect_admin(SUBNQN, 0) {
        Err(Error::Status(s, cqe)) => {
            assert_status(s, Status::CONNECT_INVALID_PARAMETERS, "SQSIZE 4096");
            assert_eq!(cqe.dw0, 44, "IPO: SQSIZE in the SQE");
        }
        other => panic!("SQSIZE 4096: {other:?}"),
    }
    assert_serves(&mut d);
}
