//! Conformance fixes (NVMe Base 2.0, NVMe-oF 1.1, NVMe/TCP 1.0, and Linux nvmet's
//! behaviour where hosts rely on it), end to end against the daemon: what a host sees
//! on the wire for each. Each of these failed before its fix; the pure decisions also
//! have unit tests in `nvmf`.

mod common;

use std::io::Read;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use nvmf::spec::opcodes::{self, io};
use nvmf::spec::{Sqe, Status};
use nvmf::tcp::{self, Digests, IcReq};
use nvmf_initiator::{Error, HostOptions, OwnedPdu, Request, TcpHost};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn fabrics_sqe(fctype: u8) -> Sqe {
    let mut s = Sqe {
        nsid: fctype as u32,
        ..Default::default()
    };
    s.set_opcode_cid(opcodes::FABRICS, 0);
    s
}

fn wait_log(d: &Daemon, what: &str) -> String {
    let deadline = Instant::now() + secs(10);
    loop {
        let log = d.log();
        if log.contains(what) {
            return log;
        }
        assert!(Instant::now() < deadline, "log never said {what:?}:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const TWO_LISTENERS: &str = "\
io_threads: 1
listeners:
  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: {port}}
  - {name: tcp1, transport: tcp, address: 127.0.0.1, port: {port2}}
backends:
  - {name: ram0, type: ram, size: 4MiB, block_size: 512}
  - {name: ram1, type: ram, size: 4MiB, block_size: 512}
subsystems:
  - nqn: nqn.2026-11.dev.nvmf-target:e2e
    allow_any_host: true
    namespaces:
      - {nsid: 1, backend: ram0}
  - nqn: nqn.2026-11.dev.nvmf-target:only-tcp1
    allow_any_host: true
    listeners: [tcp1]
    namespaces:
      - {nsid: 1, backend: ram1}
";

/// 5f: a subsystem restricted to some listeners refuses Connects arriving on the others
/// (before, only the discovery log hid it), with the reason in the log.
#[test]
fn a_listener_restricted_subsystem_refuses_other_listeners() {
    let _w = watchdog("listener_restricted", secs(60));
    let port2 = free_port();
    let mut d = Daemon::start(&TWO_LISTENERS.replace("{port2}", &port2.to_string()));
    let only = "nqn.2026-11.dev.nvmf-target:only-tcp1";
    let mut h = TcpHost::connect(d.addr(), host_opts()).expect("ICReq");
    match h.connect_admin(only, 0) {
        Err(Error::Status(s, cqe)) => {
            assert_status(s, Status::CONNECT_INVALID_PARAMETERS, "Connect on tcp0");
            assert_eq!(cqe.dw0, 1 << 16 | 256, "IATTR/IPO: SUBNQN in the data");
        }
        other => panic!("Connect to {only} through tcp0: {other:?}"),
    }
    let log = wait_log(&d, "subsystem_not_on_listener");
    let line = log
        .lines()
        .find(|l| l.contains("subsystem_not_on_listener"))
        .unwrap();
    assert!(
        line.contains("listener tcp0") && line.contains(only),
        "{line}"
    );
    let mut h = TcpHost::connect(("127.0.0.1", port2), host_opts()).expect("ICReq");
    h.connect_admin(only, 0).expect("Connect on tcp1");
    h.enable_controller().expect("enable");
    assert_serves(&mut d);
}

/// 5d: Fabrics Disconnect on an I/O queue completes and frees its QID at once: the host
/// reconnects it. On the admin queue it is Invalid Queue Type and the association stays.
/// Before: the QID stayed taken (the target never heard the queue closed), and a
/// Disconnect on the admin queue tore the whole association down.
#[test]
fn fabrics_disconnect_frees_the_qid() {
    let _w = watchdog("disconnect", secs(60));
    let mut d = Daemon::start_default();
    let opts = host_opts();
    let mut c = controller(&d, 1, &opts);
    let (cqe, _) = c
        .admin
        .submit_admin_raw(fabrics_sqe(0x08), &[], 0)
        .expect("Disconnect");
    assert_status(
        cqe.status(),
        Status::INVALID_QUEUE_TYPE,
        "Disconnect on the admin queue",
    );
    c.admin
        .keep_alive()
        .expect("the association is still there");
    for round in 0..3 {
        let mut q = c.io.pop().expect("an I/O queue");
        let (cqe, _) = q
            .submit_admin_raw(fabrics_sqe(0x08), &[], 0)
            .expect("Disconnect");
        assert_ok(cqe.status(), "Disconnect on I/O queue 1");
        // The target closes that connection.
        let mut b = [0u8; 1];
        let n = q.stream().read(&mut b).unwrap_or(0);
        assert_eq!(n, 0, "connection closed after Disconnect");
        let mut q = io_queue(&d, SUBNQN, c.cntlid, 1, &opts);
        let data = pattern(round, 512);
        assert_ok(
            q.write(1, round, &data, false).expect("write"),
            "I/O on the new QID 1",
        );
        c.io.push(q);
    }
    assert_serves(&mut d);
}

/// 5e: a second Connect on a connected queue is Command Sequence Error, and no second
/// controller appears. Before: it made another controller.
#[test]
fn a_second_connect_on_a_connected_queue_is_refused() {
    let _w = watchdog("second_connect", secs(60));
    let mut d = Daemon::start_default();
    let opts = host_opts();
    let (mut h, cntlid) = admin(&d, SUBNQN, &opts);
    let s = err_status(h.connect_admin(SUBNQN, 0), "second Connect");
    assert_status(s, Status::COMMAND_SEQUENCE_ERROR, "second admin Connect");
    let id = h.identify(1, 0).expect("identify");
    assert_eq!(le16(&id, 78), cntlid, "still the first controller");
    let mut q = io_queue(&d, SUBNQN, cntlid, 1, &opts);
    let s = err_status(q.connect_io(SUBNQN, cntlid, 1, 31), "second I/O Connect");
    assert_status(s, Status::COMMAND_SEQUENCE_ERROR, "second I/O Connect");
    wait_log(&d, "already_connected");
    assert_serves(&mut d);
}

/// 5i: an SGL longer than the command's transfer is Data SGL Length Invalid (nvmet checks
/// the lengths are equal). Before: accepted.
#[test]
fn sgl_longer_than_the_transfer() {
    let _w = watchdog("sgl_long", secs(60));
    let mut d = Daemon::start_default();
    let opts = HostOptions {
        io_max_incapsule: IO_INCAPSULE,
        ..host_opts()
    };
    let mut c = controller(&d, 1, &opts);
    let q = &mut c.io[0];
    for (req, what) in [
        (
            Request::read(1, 0, 8, vec![0; 8192]),
            "read, NLB 8, SGL 8 KiB",
        ),
        (
            Request::write(1, 0, 8, vec![1; 8192], false),
            "in-capsule write, NLB 8, SGL 8 KiB",
        ),
        (
            Request::write(1, 0, 8, vec![1; 65536], false),
            "R2T write, NLB 8, SGL 64 KiB",
        ),
    ] {
        let cid = q.submit(req).expect("submit");
        let cpl = q.wait(cid).expect("completion");
        assert_status(cpl.cqe.status(), Status::DATA_SGL_LENGTH_INVALID, what);
    }
    assert_serves(&mut d);
}

/// 5k: a C2HTermReq carries the header of the PDU that caused it (NVMe/TCP 1.0 Figure
/// 24). Before: no header, PLEN 24.
#[test]
fn c2h_term_req_carries_the_offending_header() {
    let _w = watchdog("term_req_header", secs(60));
    let mut d = Daemon::start_default();
    let (mut h, _) = admin(&d, SUBNQN, &host_opts());
    let mut pdu = Vec::new();
    tcp::encode_h2c_data(&mut pdu, 7, 0x1234, 0, &[0u8; 512], true, Digests::NONE, 0);
    h.send_raw(&pdu).expect("send");
    let mut got = Vec::new();
    let deadline = Instant::now() + secs(5);
    let mut s = h.stream();
    while Instant::now() < deadline {
        let mut b = [0u8; 512];
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(_) => break,
        }
    }
    assert!(got.len() >= 24, "no C2HTermReq: {got:?}");
    assert_eq!(got[0], 0x03, "C2HTermReq");
    let plen = le32(&got, 4) as usize;
    assert_eq!(
        plen,
        24 + 24,
        "PLEN: header plus the 24-byte H2CData header"
    );
    assert_eq!(
        &got[24..48],
        &pdu[..24],
        "the offending H2CData header, as sent"
    );
    let log = wait_log(&d, "c2h_term_req_sent");
    assert!(log.contains("FES 0x1"), "{log}");
    assert_serves(&mut d);
}

/// SMART as seen through Get Log Page 02h (all namespaces).
fn smart_page(h: &mut TcpHost) -> Vec<u8> {
    h.get_log_page(0x02, 0xffff_ffff, 0, 512, false)
        .expect("SMART log")
}

/// SMART's (data units read, media errors).
fn smart(h: &mut TcpHost) -> (u128, u128) {
    let s = smart_page(h);
    (le128(&s, 32), le128(&s, 160))
}

/// 5h: Media and Data Integrity Errors counts media errors only, not every failed
/// command; Compare counts toward Data Units Read. Before: an LBA Out of Range read was a
/// "media error", and 1 MiB compared moved nothing.
#[test]
fn smart_media_errors_and_compare() {
    let _w = watchdog("smart", secs(60));
    let mut d = Daemon::start_default();
    let opts = HostOptions {
        io_max_incapsule: IO_INCAPSULE,
        ..host_opts()
    };
    let mut c = controller(&d, 1, &opts);
    let (_, e0) = smart(&mut c.admin);
    let q = &mut c.io[0];
    let mut one = vec![0u8; 512];
    let s = q
        .read(1, NS1_SIZE / 512, 1, &mut one)
        .expect("read past end");
    assert_status(s, Status::LBA_OUT_OF_RANGE, "read past the end");
    let s = q.read(99, 0, 1, &mut one).expect("read bad ns");
    assert_status(s, Status::INVALID_NAMESPACE, "read of nsid 99");
    let (r0, e1) = smart(&mut c.admin);
    assert_eq!(
        e1, e0,
        "no media error for LBA Out of Range / Invalid Namespace"
    );
    let data = pattern(5, 128 << 10);
    let q = &mut c.io[0];
    for i in 0..8u64 {
        assert_ok(q.write(1, i * 256, &data, false).expect("write"), "write");
    }
    for i in 0..8u64 {
        assert_ok(q.compare(1, i * 256, &data).expect("compare"), "compare");
    }
    let (r1, _) = smart(&mut c.admin);
    // 1 MiB compared = 2048 units of 512 bytes = 2.048 thousand, rounded up.
    assert!(
        r1 >= r0 + 2,
        "Data Units Read {r0} -> {r1} after 1 MiB of Compare"
    );
    assert_serves(&mut d);
}

/// Errors of offloaded I/O, which the engine answers without the target, are in the
/// controller's Error Information log (with their queue, command, namespace and first
/// block) and in SMART's count of entries, as nvmet keeps them. Before: the log held
/// only the target's own (admin) errors.
#[test]
fn engine_io_errors_are_in_the_error_log() {
    let _w = watchdog("error_log", secs(60));
    let mut d = Daemon::start_default();
    let mut c = controller(&d, 1, &host_opts());
    let entries = |h: &mut TcpHost| {
        let s = smart_page(h);
        le128(&s, 176)
    };
    let before = entries(&mut c.admin);
    let mut one = vec![0u8; 512];
    let past_end = NS1_SIZE / 512 + 7;
    let s = c.io[0]
        .read(1, past_end, 1, &mut one)
        .expect("read past end");
    assert_status(s, Status::LBA_OUT_OF_RANGE, "read past the end");
    // The IO thread records it after its pass; the admin queue may be on another.
    let deadline = Instant::now() + secs(5);
    while entries(&mut c.admin) == before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(entries(&mut c.admin), before + 1, "SMART error log entries");
    let log = c
        .admin
        .get_log_page(0x01, 0xffff_ffff, 0, 64, false)
        .expect("error log");
    let count = le64(&log, 0);
    assert_eq!(
        u128::from(count),
        before + 1,
        "newest entry first: {log:02x?}"
    );
    assert_eq!(le16(&log, 8), 1, "SQID: the I/O queue");
    let status = le16(&log, 12) >> 1;
    assert_eq!(status & 0xff, 0x80, "status LBA Out of Range: {status:#x}");
    assert_eq!(le64(&log, 16), past_end, "LBA");
    assert_eq!(le32(&log, 24), 1, "NSID");
    assert_serves(&mut d);
}

/// 5l: a single 256 KiB command (what the Linux host's `nvme write`/`nvme read`
/// passthrough sends, unsplit) works with the default max_io_size (1 MiB, MDTS 8).
/// Before: MDTS 5 (128 KiB), Invalid Field.
#[test]
fn passthrough_sized_io_fits_the_default_mdts() {
    let _w = watchdog("mdts_default", secs(60));
    let mut d = Daemon::start_default();
    let mut c = controller(&d, 1, &host_opts());
    let id = c.admin.identify(1, 0).expect("identify");
    assert_eq!(id[77], 8, "MDTS: 2^8 x 4 KiB = 1 MiB");
    let q = &mut c.io[0];
    for len in [256usize << 10, 1 << 20] {
        let data = pattern(len as u64, len);
        assert_ok(q.write(1, 4096, &data, false).expect("write"), "big write");
        let mut back = vec![0u8; len];
        let nlb = (len / 512) as u32;
        assert_ok(q.read(1, 4096, nlb, &mut back).expect("read"), "big read");
        assert!(back == data, "{len} bytes read back differ");
    }
    assert_serves(&mut d);
}

/// `max_io_size` in the YAML sets MDTS, MAXH2CDATA follows (never larger), and the
/// engine refuses transfers beyond it.
#[test]
fn max_io_size_setting() {
    let _w = watchdog("mdts_setting", secs(60));
    let cfg = format!("max_io_size: 64KiB\n{CONFIG}");
    let mut d = Daemon::start(&cfg);
    let mut c = controller(&d, 1, &host_opts());
    let id = c.admin.identify(1, 0).expect("identify");
    assert_eq!(id[77], 4, "MDTS: 2^4 x 4 KiB = 64 KiB");
    let q = &mut c.io[0];
    assert!(q.ic_resp().unwrap().maxh2cdata <= 64 << 10, "MAXH2CDATA");
    let mut buf = vec![0u8; 128 << 10];
    let s = q.read(1, 0, 256, &mut buf).expect("read");
    assert_status(s, Status::INVALID_FIELD, "128 KiB read with a 64 KiB limit");
    let data = pattern(1, 64 << 10);
    assert_ok(
        q.write(1, 0, &data, false).expect("write"),
        "64 KiB write by R2T",
    );
    assert_ok(
        q.read(1, 0, 128, &mut buf[..64 << 10]).expect("read"),
        "64 KiB read",
    );
    assert!(buf[..64 << 10] == data[..]);
    drop(c);
    d.stop();
    // Out of range: refused with the file, line and field.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    let text = CONFIG
        .replace("{port}", "4420")
        .replace("{dir}", &dir.path().display().to_string());
    std::fs::write(&path, format!("max_io_size: 3000\n{text}")).unwrap();
    let out = Command::new(daemon_binary())
        .args(["--check-config", "--config"])
        .arg(&path)
        .output()
        .expect("run --check-config");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "3000 bytes accepted");
    assert!(
        err.contains("bad.yaml:1:") && err.contains("max_io_size"),
        "{err}"
    );
}

/// Write Zeroes with FUA succeeds and zeroes (the FUA reaching the backend is tested in
/// `sta`, with a backend that records it).
#[test]
fn write_zeroes_with_fua() {
    let _w = watchdog("wz_fua", secs(60));
    let mut d = Daemon::start_default();
    let mut c = controller(&d, 1, &host_opts());
    let q = &mut c.io[0];
    q.set_lba_size(4096);
    let data = pattern(9, 4096);
    assert_ok(q.write(2, 3, &data, false).expect("write"), "write");
    let mut sqe = Sqe {
        nsid: 2,
        cdw10: 3,
        cdw12: 1 << 30,
        ..Default::default()
    };
    sqe.set_opcode_cid(io::WRITE_ZEROES, 0);
    let (cqe, _) = q.submit_admin_raw(sqe, &[], 0).expect("write zeroes");
    assert_ok(cqe.status(), "Write Zeroes FUA");
    let mut back = vec![1u8; 4096];
    assert_ok(q.read(2, 3, 1, &mut back).expect("read"), "read");
    assert!(back.iter().all(|&b| b == 0));
    assert_serves(&mut d);
}

/// Every refusal is explained: an unknown host, a bad ICReq and a bad CC each log a warn
/// line naming the peer and listener (and host, subsystem, queue where known) with the
/// reason in words; a host retrying in a loop is rate-limited in the log.
#[test]
fn refusals_are_logged_with_who_and_why() {
    let _w = watchdog("refusals_logged", secs(60));
    let mut d = Daemon::start_default();
    // Not on the hosts list, 20 times from the same peer.
    for _ in 0..20 {
        let mut h = TcpHost::connect(d.addr(), host_opts()).expect("ICReq");
        let s = err_status(h.connect_admin(RESTRICTED_NQN, 0), "Connect restricted");
        assert_status(s, Status::CONNECT_INVALID_HOST, "unknown host");
    }
    // ICReq with PFV 1.
    let mut h = TcpHost::connect_raw(d.addr(), host_opts()).expect("connect");
    let mut ic = Vec::new();
    tcp::encode_ic_req(
        &mut ic,
        &IcReq {
            pfv: 1,
            ..IcReq::default()
        },
    );
    h.send_raw(&ic).expect("send");
    assert!(matches!(h.recv_pdu(), Ok(OwnedPdu::C2HTermReq { .. })));
    // CC with an unsupported CSS: CSTS.CFS, and the log says which field.
    let mut h = TcpHost::connect(
        d.addr(),
        HostOptions {
            cc_css: 0b001,
            ..host_opts()
        },
    )
    .expect("ICReq");
    h.connect_admin(SUBNQN, 0).expect("Connect");
    assert!(h.enable_controller().is_err(), "CSTS.CFS");
    // A Connect whose SGL says 1024 bytes of in-capsule data but 512 come: the engine
    // answers Data SGL Length Invalid before the application sees it, and the refusal is
    // logged with the peer all the same.
    let mut h = TcpHost::connect(d.addr(), host_opts()).expect("ICReq");
    let mut sqe = nvmf::spec::fabrics::ConnectCommand {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    }
    .to_sqe(0);
    sqe.dptr = nvmf::spec::SglDescriptor::unkeyed(
        nvmf::spec::sgl::TYPE_DATA_BLOCK,
        nvmf::spec::sgl::SUBTYPE_OFFSET,
        0,
        1024,
    );
    let mut capsule = Vec::new();
    tcp::encode_capsule_cmd(&mut capsule, &sqe, &[0u8; 512], Digests::NONE, 0);
    h.send_raw(&capsule).expect("send the short Connect");
    match h.recv_pdu() {
        Ok(OwnedPdu::CapsuleResp(cqe)) => assert_status(
            cqe.status(),
            Status::DATA_SGL_LENGTH_INVALID,
            "short Connect",
        ),
        other => panic!("short Connect answered {other:?}"),
    }
    // An Identify before any Connect: Command Sequence Error, logged the same way.
    let mut h = TcpHost::connect(d.addr(), host_opts()).expect("ICReq");
    let mut identify = Sqe {
        cdw10: 1,
        ..Default::default()
    };
    identify.set_opcode_cid(opcodes::admin::IDENTIFY, 0);
    let (cqe, _) = h
        .submit_admin_raw(identify, &[], 4096)
        .expect("Identify before Connect");
    assert_status(
        cqe.status(),
        Status::COMMAND_SEQUENCE_ERROR,
        "Identify before Connect",
    );
    wait_log(&d, "opcode 0x06");
    let log = wait_log(&d, "controller_fatal_status");
    let lines = |label: &str| -> Vec<&str> {
        log.lines()
            .filter(|l| {
                l.contains(&format!("reason=\"{label}\"")) || l.contains(&format!("reason={label}"))
            })
            .collect()
    };
    let denied = lines("host_not_allowed");
    assert!(
        !denied.is_empty() && denied.len() <= 5,
        "rate limit: 1..=5 lines for 20 refusals within 10 s, got {}:\n{log}",
        denied.len()
    );
    for part in [
        "WARN",
        "peer 127.0.0.1:",
        "listener tcp0",
        RESTRICTED_NQN,
        "hosts list",
        "qid 0",
    ] {
        assert!(
            denied[0].contains(part),
            "{part:?} missing from {}",
            denied[0]
        );
    }
    let ic = lines("icreq_rejected");
    assert_eq!(ic.len(), 1, "{log}");
    assert!(
        ic[0].contains("listener tcp0") && ic[0].contains("FES 0x6"),
        "{}",
        ic[0]
    );
    let short = lines("refused_before_connect");
    assert_eq!(short.len(), 2, "{log}");
    assert!(
        short[1].contains("a command (opcode 0x06) before the queue's Fabrics Connect")
            && short[1].contains("a queue's first command must be a Fabrics Connect"),
        "{}",
        short[1]
    );
    assert!(
        short[0].contains("peer 127.0.0.1:")
            && short[0].contains("listener tcp0")
            && short[0].contains("Fabrics Connect (qid 0)")
            && short[0].contains("a Connect carries 1024 bytes"),
        "{}",
        short[0]
    );
    let cfs = lines("controller_fatal_status");
    assert!(
        cfs[0].contains("CC.CSS=1") && cfs[0].contains(SUBNQN),
        "{}",
        cfs[0]
    );
    assert_serves(&mut d);
}

/// 5m: a reload that removes a subsystem while a host runs I/O, then adds it back: every
/// command either completes successfully or dies with its connection (which the host
/// retries on a new association); none fails with an error status. Before: commands
/// arriving between the namespace's removal and the controller's teardown got Invalid
/// Namespace or Command Sequence Error with DNR, which the Linux host hands to the
/// application as I/O errors. Each cycle's reload waits until every queue has completed
/// reads, so a cycle whose connections died before their first command cannot pass.
#[test]
fn reload_removing_a_subsystem_under_io_fails_no_command() {
    let _w = watchdog("reload_under_io", secs(120));
    let mut d = Daemon::start_default();
    let cfg_path = d.dir().join("nvmf-target.yaml");
    let full = std::fs::read_to_string(&cfg_path).unwrap();
    let without = full.replace(
        "  - nqn: nqn.2026-11.dev.nvmf-target:e2e\n    allow_any_host: true\n    namespaces:\n      - {nsid: 1, backend: ram0}\n      - {nsid: 2, backend: f0}\n",
        "",
    );
    assert_ne!(full, without, "the e2e subsystem is in the config");
    let mut bad = Vec::new();
    for cycle in 0..4 {
        let opts = host_opts();
        let mut c = controller(&d, 2, &opts);
        let stop = Arc::new(AtomicBool::new(false));
        // Successful reads, per queue.
        let done: Arc<Vec<AtomicU64>> = Arc::new(c.io.iter().map(|_| AtomicU64::new(0)).collect());
        let workers: Vec<_> =
            c.io.drain(..)
                .enumerate()
                .map(|(i, mut q)| {
                    let stop = stop.clone();
                    let done = done.clone();
                    std::thread::spawn(move || {
                        let mut errors = Vec::new();
                        let mut n = 0u64;
                        'run: while !stop.load(Ordering::Relaxed) {
                            let reqs: Vec<Request> = (0..8u64)
                                .map(|k| {
                                    let lba = ((n * 8 + k) * 2 + i as u64) % 4096 * 8;
                                    Request::read(1, lba, 8, vec![0; 4096])
                                })
                                .collect();
                            let mut cids = Vec::new();
                            for r in reqs {
                                match q.submit(r) {
                                    Ok(cid) => cids.push(cid),
                                    Err(_) => break 'run,
                                }
                            }
                            for cid in cids {
                                match q.wait(cid) {
                                    Ok(c) if c.cqe.status().is_success() => {
                                        done[i].fetch_add(1, Ordering::Relaxed);
                                    }
                                    Ok(c) => errors.push(c.cqe.status()),
                                    Err(_) => break 'run,
                                }
                            }
                            n += 1;
                        }
                        errors
                    })
                })
                .collect();
        std::thread::sleep(Duration::from_millis(100));
        let deadline = Instant::now() + secs(10);
        while done.iter().any(|n| n.load(Ordering::Relaxed) == 0) {
            assert!(
                Instant::now() < deadline,
                "cycle {cycle}: a queue completed no read before the reload (reads per queue: {:?})",
                done.iter()
                    .map(|n| n.load(Ordering::Relaxed))
                    .collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::write(&cfg_path, &without).unwrap();
        d.signal(Signal::SIGHUP);
        let applied = format!("subsystem {SUBNQN} removed");
        let deadline = Instant::now() + secs(10);
        while d.log().matches(&applied).count() <= cycle {
            assert!(
                Instant::now() < deadline,
                "reload {cycle} not applied:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            bad.extend(w.join().unwrap());
        }
        std::fs::write(&cfg_path, &full).unwrap();
        d.signal(Signal::SIGHUP);
        let added = format!("subsystem {SUBNQN} added");
        let deadline = Instant::now() + secs(10);
        while d.log().matches(&added).count() <= cycle + 1 {
            assert!(
                Instant::now() < deadline,
                "re-add {cycle} not applied:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    assert!(
        bad.is_empty(),
        "commands failed with an error status around a reload: {bad:?}"
    );
    assert_serves(&mut d);
}

/// 5c: a discovery controller enables with IOSQES/IOCQES 0 (hosts leave them 0 there; it
/// has no I/O queues). Before: CSTS.CFS.
#[test]
fn discovery_controller_enables_with_io_entry_sizes_zero() {
    let _w = watchdog("disc_iosqes", secs(60));
    let mut d = Daemon::start_default();
    let mut h = TcpHost::connect(d.addr(), host_opts()).expect("ICReq");
    h.connect_admin(DISCOVERY_NQN, 0)
        .expect("Connect discovery");
    h.property_set(0x14, 1, false).expect("CC.EN=1 only");
    let csts = h.property_get(0x1c, false).expect("CSTS");
    assert_eq!(csts & 3, 1, "CSTS.RDY, not CFS: {csts:#x}");
    let log = h
        .get_log_page(0x70, 0, 0, 1024, false)
        .expect("discovery log");
    assert!(le64(&log, 8) >= 1);
    assert_serves(&mut d);
}

/// 5j/5k as a host reads them: Set Features of a controller-scoped feature naming a
/// namespace is Feature Not Namespace Specific; Identify Controller reports 128-bit host
/// IDs, no keyed SGLs on TCP; CRTO agrees with CAP.TO; a discovery controller reports
/// IOCCSZ/IORCSZ 0.
#[test]
fn features_nsid_and_identify_attributes() {
    let _w = watchdog("features_identify", secs(60));
    let mut d = Daemon::start_default();
    let mut c = controller(&d, 1, &host_opts());
    let mut sqe = Sqe {
        nsid: 1,
        cdw10: 0x01,
        cdw11: 3,
        ..Default::default()
    };
    sqe.set_opcode_cid(opcodes::admin::SET_FEATURES, 0);
    let (cqe, _) = c.admin.submit_admin_raw(sqe, &[], 0).expect("set features");
    assert_status(
        cqe.status(),
        Status::FEATURE_NOT_NAMESPACE_SPECIFIC,
        "Set Features Arbitration with NSID 1",
    );
    sqe.nsid = 0xffff_ffff;
    let (cqe, _) = c.admin.submit_admin_raw(sqe, &[], 0).expect("set features");
    assert_ok(cqe.status(), "Set Features Arbitration with NSID FFFFFFFFh");
    let id = c.admin.identify(1, 0).expect("identify");
    assert_eq!(le32(&id, 96) & 1, 1, "CTRATT.HIDS");
    assert_eq!(
        le32(&id, 536) & (1 << 2),
        0,
        "no keyed SGL data blocks on TCP"
    );
    let cap = c.admin.property_get(0, true).expect("CAP");
    let crto = c.admin.property_get(0x68, false).expect("CRTO");
    let to = (cap >> 24) & 0xff;
    assert_eq!(
        (crto & 0xffff, crto >> 16),
        (to, to),
        "CRTO.CRWMT/CRIMT = CAP.TO"
    );
    let mut disc = TcpHost::connect(d.addr(), host_opts()).expect("ICReq");
    disc.connect_admin(DISCOVERY_NQN, 0)
        .expect("Connect discovery");
    disc.enable_controller().expect("enable");
    let id = disc.identify(1, 0).expect("identify discovery");
    assert_eq!((le32(&id, 1792), le32(&id, 1796)), (0, 0), "IOCCSZ/IORCSZ");
    assert_serves(&mut d);
}

const ONE_LISTENER: &str = "\
io_threads: 1
listeners:
  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: {port}}
backends:
  - {name: ram0, type: ram, size: 4MiB, block_size: 512}
  - {name: ram1, type: ram, size: 4MiB, block_size: 512}
subsystems:
  - nqn: nqn.2026-11.dev.nvmf-target:e2e
    allow_any_host: true
    namespaces:
      - {nsid: 1, backend: ram0}
  - nqn: nqn.2026-11.dev.nvmf-target:only-tcp0
    allow_any_host: true
    listeners: [tcp0]
    namespaces:
      - {nsid: 1, backend: ram1}
";

/// A listener added by reload serves at once the subsystems that name no listeners (they
/// are on all of them), and not those that name others.
#[test]
fn a_listener_added_by_reload_serves_subsystems_on_all_listeners() {
    let _w = watchdog("reload_listener", secs(60));
    let mut d = Daemon::start(ONE_LISTENER);
    let port2 = free_port();
    let cfg_path = d.dir().join("nvmf-target.yaml");
    let text = std::fs::read_to_string(&cfg_path).unwrap().replace(
        "listeners:\n",
        &format!(
            "listeners:\n  - {{name: tcp1, transport: tcp, address: 127.0.0.1, port: {port2}}}\n"
        ),
    );
    std::fs::write(&cfg_path, text).unwrap();
    d.signal(Signal::SIGHUP);
    wait_log(&d, "reload applied");
    let mut h = TcpHost::connect(("127.0.0.1", port2), host_opts()).expect("ICReq on tcp1");
    h.connect_admin(SUBNQN, 0)
        .expect("Connect through the new listener");
    h.enable_controller().expect("enable");
    let mut h = TcpHost::connect(("127.0.0.1", port2), host_opts()).expect("ICReq on tcp1");
    let s = err_status(
        h.connect_admin("nqn.2026-11.dev.nvmf-target:only-tcp0", 0),
        "Connect only-tcp0 through tcp1",
    );
    assert_status(
        s,
        Status::CONNECT_INVALID_PARAMETERS,
        "named listeners only",
    );
    assert!(!d
        .log()
        .contains("restart required: subsystem nqn.2026-11.dev.nvmf-target:e2e"));
    assert_serves(&mut d);
}
