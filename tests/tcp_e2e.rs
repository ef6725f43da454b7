//! End-to-end tests of the `nvmf-target` daemon over NVMe/TCP on loopback, with the
//! `nvmf-initiator` host, one daemon per test (tests/common):
//!
//! - discovery (log page contents, the current discovery entry) and host access lists;
//! - admin commands: Identify, features, log pages (SMART counters that move with I/O,
//!   unknown log pages), namespace identifiers stable across restarts, commands before
//!   CC.EN, controller shutdown and reset, admin error statuses;
//! - I/O on several queues without digests, with header and data digests, with HPDA,
//!   all writes by R2T; FUA, Flush, Write Zeroes, Deallocate, Compare; error statuses;
//!   an SGL shorter than the transfer; a data digest error failing only its command;
//! - Connect: invalid parameters, garbage NQNs, SQSIZE limits, I/O queues to discovery;
//! - keep-alive expiry;
//! - malformed PDUs (truncated, bad type, HLEN, PLEN/PDO, unknown TTAG, header digest,
//!   a second ICReq, PFV 1) and an H2CTermReq from the host;
//! - graceful stop (SIGTERM with I/O in flight, SIGINT, abandoned transfers) and
//!   connections that do not leak.
//!
//! Elsewhere: namespace changes under connected hosts (Namespace Attribute Changed, the
//! Changed Namespace List) in tests/reload.rs; other hosts' habits in
//! tests/host_quirks.rs; refusals and spec conformance fixes in tests/conformance.rs;
//! metrics in tests/metrics.rs; the engine's own rules in sta/tests/contract.

mod common;

use std::time::{Duration, Instant};

use common::*;
use nvmf::spec::fabrics::ConnectCommand;
use nvmf::spec::{opcodes, Sqe, Status};
use nvmf::tcp::{self, Digests, IcReq};
use nvmf_initiator::{Error, HostOptions, OwnedPdu, Request, TcpHost};

const MIB: u64 = 1 << 20;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

// ============================================================================ discovery

struct DiscEntry {
    trtype: u8,
    adrfam: u8,
    subtype: u8,
    trsvcid: String,
    subnqn: String,
    traddr: String,
}

/// Reads the discovery log: the header at offset 0, then the entries from offset 1024.
fn discovery_log(d: &Daemon, opts: &HostOptions) -> Vec<DiscEntry> {
    let (mut h, _) = admin(d, DISCOVERY_NQN, opts);
    let id = h.identify(1, 0).expect("Identify Controller (discovery)");
    assert_eq!(id[111], 2, "CNTRLTYPE of the discovery controller");
    assert_eq!(
        cstr(&id[768..1024]),
        DISCOVERY_NQN,
        "SUBNQN of the discovery controller"
    );

    let hdr = h
        .get_log_page(0x70, 0, 0, 1024, false)
        .expect("discovery log header");
    let genctr = le64(&hdr, 0);
    let numrec = le64(&hdr, 8);
    assert_eq!(le16(&hdr, 16), 0, "RECFMT");
    assert!((1..=64).contains(&numrec), "NUMREC {numrec}");
    let body = h
        .get_log_page(0x70, 0, 1024, 1024 * numrec as u32, false)
        .expect("discovery log entries");
    let hdr2 = h
        .get_log_page(0x70, 0, 0, 1024, false)
        .expect("discovery log header again");
    assert_eq!(
        le64(&hdr2, 0),
        genctr,
        "GENCTR changed without a configuration change"
    );
    body.chunks(1024)
        .map(|e| DiscEntry {
            trtype: e[0],
            adrfam: e[1],
            subtype: e[2],
            trsvcid: padded(&e[32..64]),
            subnqn: cstr(&e[256..512]),
            traddr: padded(&e[512..768]),
        })
        .collect()
}

#[test]
fn discovery_log_lists_subsystem_and_current_discovery() {
    let _w = watchdog("discovery_log", secs(60));
    let d = Daemon::start_default();
    let entries = discovery_log(&d, &host_opts());
    let port = d.port().to_string();

    let ours: Vec<_> = entries.iter().filter(|e| e.subnqn == SUBNQN).collect();
    assert_eq!(ours.len(), 1, "entries for {SUBNQN}");
    let e = ours[0];
    assert_eq!(e.subtype, 2, "SUBTYPE of {SUBNQN} (NVM subsystem)");
    assert_eq!(e.trtype, 3, "TRTYPE tcp");
    assert_eq!(e.adrfam, 1, "ADRFAM IPv4");
    assert_eq!(e.trsvcid, port, "TRSVCID");
    assert_eq!(e.traddr, "127.0.0.1", "TRADDR");

    let cur: Vec<_> = entries.iter().filter(|e| e.subtype == 3).collect();
    assert_eq!(cur.len(), 1, "current discovery subsystem entries");
    assert_eq!(cur[0].subnqn, DISCOVERY_NQN);
    assert_eq!(cur[0].trtype, 3);
    assert_eq!(cur[0].trsvcid, port);
    assert_eq!(cur[0].traddr, "127.0.0.1");

    // A host not in the restricted subsystem's allow-list does not see it.
    assert!(
        !entries.iter().any(|e| e.subnqn == RESTRICTED_NQN),
        "{RESTRICTED_NQN} listed for a host that may not connect to it"
    );
}

// ============================================================================ host ACL

#[test]
fn host_not_in_allow_list_is_rejected_and_hidden() {
    let _w = watchdog("host_acl", secs(60));
    let mut d = Daemon::start_default();

    let stranger = host_opts();
    let mut h = TcpHost::connect(d.addr(), stranger.clone()).expect("ICReq");
    let s = err_status(
        h.connect_admin(RESTRICTED_NQN, 0),
        "Connect from a stranger",
    );
    assert_eq!(code(s), (1, 0x84), "Connect Invalid Host expected, got {s}");
    assert!(
        !discovery_log(&d, &stranger)
            .iter()
            .any(|e| e.subnqn == RESTRICTED_NQN),
        "restricted subsystem visible to a stranger"
    );

    let friend = HostOptions {
        hostnqn: ALLOWED_HOST.to_string(),
        ..host_opts()
    };
    let (mut h, _) = admin(&d, RESTRICTED_NQN, &friend);
    h.identify(1, 0)
        .expect("Identify on the restricted subsystem by the allowed host");
    let log = discovery_log(&d, &friend);
    let e = log
        .iter()
        .find(|e| e.subnqn == RESTRICTED_NQN)
        .expect("restricted subsystem listed for the allowed host");
    assert_eq!((e.subtype, e.trtype), (2, 3));
    assert_serves(&mut d);
}

// ============================================================================ admin

#[test]
fn admin_identify_features_and_log_pages() {
    let _w = watchdog("admin_identify", secs(60));
    let d = Daemon::start_default();
    let opts = host_opts();
    let mut h = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq");
    let ic = h.ic_resp().expect("ICResp");
    assert_eq!(ic.pfv, 0);
    assert_eq!(ic.maxh2cdata, 128 * 1024, "MAXH2CDATA");
    let cntlid = h.connect_admin(SUBNQN, 0).expect("Connect");
    assert_ne!(cntlid, 0xffff, "dynamic controller gets a real CNTLID");
    let cap = h.property_get(0x00, true).expect("CAP");
    assert!(cap & (1 << 37) != 0, "CAP.CSS NVM");
    let csts = h.property_get(0x1c, false).expect("CSTS");
    assert_eq!(csts & 1, 0, "CSTS.RDY before CC.EN");
    h.enable_controller().expect("CC.EN -> CSTS.RDY");
    let csts = h.property_get(0x1c, false).expect("CSTS");
    assert_eq!(csts & 3, 1, "CSTS.RDY=1, CFS=0 after enable");
    let cc = h.property_get(0x14, false).expect("CC");
    assert_eq!(cc & 1, 1, "CC.EN reads back");

    // Identify Controller.
    let id = h.identify(1, 0).expect("Identify Controller");
    assert_eq!(cstr(&id[768..1024]), SUBNQN, "SUBNQN");
    assert_eq!(le16(&id, 78), cntlid, "CNTLID");
    assert_eq!(id[77], 8, "MDTS: 1 MiB, the default max_io_size");
    assert_eq!(le32(&id, 1792), (64 + 8192) / 16, "IOCCSZ");
    assert_eq!(le32(&id, 1796), 1, "IORCSZ");
    let sgls = le32(&id, 536);
    assert_eq!(sgls & 3, 1, "SGLS bits 1:0 (SGLs supported), got {sgls:#x}");
    assert!(
        sgls & (1 << 20) != 0,
        "SGLS offset-addressed data blocks, got {sgls:#x}"
    );
    assert_eq!(id[111], 1, "CNTRLTYPE I/O controller");
    assert!(le32(&id, 516) >= 2, "NN");
    let oncs = le16(&id, 520);
    assert_eq!(
        oncs & 0b1101,
        0b1101,
        "ONCS compare, DSM, write zeroes: {oncs:#x}"
    );
    assert_eq!(id[512], 0x66, "SQES");
    assert_eq!(id[513], 0x44, "CQES");
    let fr = id[64..72].to_vec();

    // Identify Namespace 1 and 2.
    for (nsid, size, bs) in [(1u32, NS1_SIZE, NS1_BLOCK), (2, NS2_SIZE, NS2_BLOCK)] {
        let ns = h.identify(0, nsid).expect("Identify Namespace");
        let nsze = le64(&ns, 0);
        assert_eq!(nsze, size / bs as u64, "NSZE of ns {nsid}");
        assert_eq!(le64(&ns, 8), nsze, "NCAP of ns {nsid}");
        let fmt = (ns[26] & 0xf) as usize;
        let lbads = ns[128 + 4 * fmt + 2];
        assert_eq!(1u32 << lbads, bs, "LBA data size of ns {nsid}");
    }
    // An inactive NSID: zeroes (or Invalid Namespace); never a crash.
    match h.identify(0, 7) {
        Ok(b) => assert!(
            b.iter().all(|&x| x == 0),
            "Identify of inactive nsid 7 not zero"
        ),
        Err(Error::Status(s, _)) => assert_status(s, Status::INVALID_NAMESPACE, "inactive"),
        Err(e) => panic!("Identify nsid 7: {e}"),
    }

    // Active namespace list.
    let list = h.identify(2, 0).expect("Active NS list");
    let ids: Vec<u32> = list
        .chunks(4)
        .map(|c| le32(c, 0))
        .take_while(|&n| n != 0)
        .collect();
    assert_eq!(ids, vec![1, 2], "active namespace list");

    // Namespace identification descriptors: a non-zero UUID for each namespace.
    let u1 = ns_uuid(&mut h, 1);
    let u2 = ns_uuid(&mut h, 2);
    assert_ne!(u1, u2, "two namespaces share a UUID");

    // Number of Queues.
    let granted = request_queues(&mut h, 4);
    assert!(granted >= 2, "granted {granted} I/O queues");

    // Log pages: error information, SMART, firmware slot, commands supported and effects.
    h.get_log_page(0x01, 0, 0, 64, false)
        .expect("Error Information log");
    let smart = h
        .get_log_page(0x02, 0xffff_ffff, 0, 512, false)
        .expect("SMART log");
    assert!(smart[3] <= 100, "available spare");
    let fw = h
        .get_log_page(0x03, 0, 0, 512, false)
        .expect("Firmware Slot log");
    assert_eq!(fw[0] & 7, 1, "AFI active slot 1");
    assert_eq!(&fw[8..16], &fr[..], "FRS1 equals Identify FR");
    let fx = h
        .get_log_page(0x05, 0, 0, 4096, false)
        .expect("Commands Supported and Effects log");
    for opc in [0x02u8, 0x06, 0x09, 0x0a, 0x18] {
        assert!(
            le32(&fx, 4 * opc as usize) & 1 != 0,
            "admin opcode {opc:#x} not CSUPP"
        );
    }
    for opc in [0x00u8, 0x01, 0x02, 0x05, 0x08, 0x09] {
        assert!(
            le32(&fx, 1024 + 4 * opc as usize) & 1 != 0,
            "I/O opcode {opc:#x} not CSUPP"
        );
    }
    assert!(le32(&fx, 1024 + 4) & 2 != 0, "WRITE has LBCC");
    h.keep_alive().expect("Keep Alive");
}

/// The UUID from the Namespace Identification Descriptor list (CNS 03h).
fn ns_uuid(h: &mut TcpHost, nsid: u32) -> [u8; 16] {
    let descs = h.identify(3, nsid).expect("NS identification descriptors");
    let mut off = 0;
    let mut uuid = None;
    while off + 4 <= descs.len() && descs[off] != 0 {
        let (nidt, nidl) = (descs[off], descs[off + 1] as usize);
        let nid = &descs[off + 4..off + 4 + nidl];
        match nidt {
            1 => assert_eq!(nidl, 8, "EUI64 length"),
            2 => assert_eq!(nidl, 16, "NGUID length"),
            3 => {
                assert_eq!(nidl, 16, "UUID length");
                uuid = Some(<[u8; 16]>::try_from(nid).unwrap());
            }
            4 => assert_eq!(nidl, 1, "CSI length"),
            _ => {}
        }
        off += 4 + nidl;
    }
    let uuid = uuid.unwrap_or_else(|| panic!("no UUID descriptor for ns {nsid}"));
    assert!(uuid.iter().any(|&b| b != 0), "zero UUID for ns {nsid}");
    uuid
}

#[test]
fn namespace_uuids_are_stable_across_restart() {
    let _w = watchdog("ns_uuid_restart", secs(60));
    let mut d = Daemon::start_default();
    let (mut h, _) = admin(&d, SUBNQN, &host_opts());
    let before = [ns_uuid(&mut h, 1), ns_uuid(&mut h, 2)];
    drop(h);
    d.stop();
    d.restart();
    let (mut h, _) = admin(&d, SUBNQN, &host_opts());
    let after = [ns_uuid(&mut h, 1), ns_uuid(&mut h, 2)];
    assert_eq!(before, after, "namespace UUIDs changed across a restart");
}

#[test]
fn commands_before_enable_are_command_sequence_errors() {
    let _w = watchdog("before_enable", secs(60));
    let mut d = Daemon::start_default();
    let mut h = TcpHost::connect(d.addr(), host_opts()).expect("ICReq");
    h.connect_admin(SUBNQN, 0).expect("Connect");
    // Fabrics commands work while disabled.
    h.property_get(0x00, true)
        .expect("Property Get CAP before CC.EN");
    let s = err_status(h.identify(1, 0), "Identify before CC.EN");
    assert_status(s, Status::COMMAND_SEQUENCE_ERROR, "Identify before CC.EN");
    let s = err_status(
        h.get_log_page(0x02, 0xffff_ffff, 0, 512, false),
        "Get Log Page before CC.EN",
    );
    assert_status(
        s,
        Status::COMMAND_SEQUENCE_ERROR,
        "Get Log Page before CC.EN",
    );
    let s = err_status(
        h.set_features(0x07, 0, 0x0001_0001, false),
        "Set Features before CC.EN",
    );
    assert_status(
        s,
        Status::COMMAND_SEQUENCE_ERROR,
        "Set Features before CC.EN",
    );
    // And after enabling, the same commands work on the same queue.
    h.enable_controller().expect("enable");
    h.identify(1, 0).expect("Identify after CC.EN");
    assert_serves(&mut d);
}

#[test]
fn admin_queue_interprets_opcodes_as_admin_commands() {
    let _w = watchdog("admin_opcodes", secs(60));
    let mut d = Daemon::start_default();
    let (mut h, _) = admin(&d, SUBNQN, &host_opts());
    // 03h is neither an admin command nor valid on fabrics (it is no I/O command either).
    let (cqe, _) = h
        .submit_admin_raw(raw_sqe(0x03, 1), &[], 0)
        .expect("opcode 03h");
    assert_status(
        cqe.status(),
        Status::INVALID_OPCODE,
        "opcode 03h on the admin queue",
    );
    // 01h (WRITE on an I/O queue) is Create I/O SQ here, prohibited on fabrics.
    let (cqe, _) = h
        .submit_admin_raw(raw_sqe(0x01, 0), &[], 0)
        .expect("opcode 01h");
    assert_status(
        cqe.status(),
        Status::INVALID_OPCODE,
        "Create I/O SQ on fabrics",
    );
    // 02h (READ on an I/O queue) is Get Log Page here.
    let mut sqe = raw_sqe(opcodes::admin::GET_LOG_PAGE, 0xffff_ffff);
    sqe.cdw10 = 0x02 | (512 / 4 - 1) << 16;
    let (cqe, data) = h.submit_admin_raw(sqe, &[], 512).expect("opcode 02h");
    assert_ok(
        cqe.status(),
        "opcode 02h (Get Log Page SMART) on the admin queue",
    );
    assert_eq!(data.len(), 512);
    // Admin opcodes on an I/O queue: Identify (06h) is not an I/O command.
    let mut c = controller(&d, 1, &host_opts());
    let (cqe, _) = c.io[0]
        .submit_admin_raw(raw_sqe(0x06, 1), &[], 0)
        .expect("06h on I/O");
    assert_status(
        cqe.status(),
        Status::INVALID_OPCODE,
        "opcode 06h on an I/O queue",
    );
    assert_serves(&mut d);
}

fn raw_sqe(opcode: u8, nsid: u32) -> Sqe {
    let mut sqe = Sqe::default();
    sqe.set_opcode_cid(opcode, 0);
    sqe.nsid = nsid;
    sqe
}

fn smart_counts(h: &mut TcpHost) -> [u128; 4] {
    let s = h
        .get_log_page(0x02, 0xffff_ffff, 0, 512, false)
        .expect("SMART log");
    // Data units read/written, host read/write commands.
    [le128(&s, 32), le128(&s, 48), le128(&s, 64), le128(&s, 80)]
}

#[test]
fn smart_counters_move_after_io() {
    let _w = watchdog("smart", secs(60));
    let d = Daemon::start_default();
    let mut c = controller(&d, 2, &host_opts());
    let before = smart_counts(&mut c.admin);
    let data = pattern(7, 64 * 1024);
    for i in 0..10u64 {
        let q = &mut c.io[(i % 2) as usize];
        assert_ok(q.write(1, i * 128, &data, false).expect("write"), "write");
    }
    let mut buf = vec![0u8; 64 * 1024];
    for i in 0..7u64 {
        let q = &mut c.io[(i % 2) as usize];
        assert_ok(q.read(1, i * 128, 128, &mut buf).expect("read"), "read");
    }
    // Counters are summed from the IO threads; allow them a moment to settle.
    let deadline = Instant::now() + secs(2);
    let after = loop {
        let a = smart_counts(&mut c.admin);
        if (a[2] - before[2] >= 7 && a[3] - before[3] >= 10) || Instant::now() > deadline {
            break a;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(after[3] - before[3], 10, "host write commands moved by");
    assert_eq!(after[2] - before[2], 7, "host read commands moved by");
    // 640 KiB written = 1280 units of 512 bytes = 2 (thousands, rounded up).
    assert!(
        after[1] > before[1],
        "data units written did not move: {before:?} -> {after:?}"
    );
    assert!(
        after[0] > before[0],
        "data units read did not move: {before:?} -> {after:?}"
    );
}

// ============================================================================ I/O data path

/// Transfer sizes for a namespace with `bs`-byte blocks: 512 B..128 KiB (MDTS),
/// straddling the 8 KiB in-capsule limit.
fn sizes(bs: u32) -> Vec<usize> {
    let mut v: Vec<usize> = [
        512,
        1024,
        4096,
        8192 - 512,
        8192,
        8192 + 512,
        12288,
        65536,
        131072,
    ]
    .into_iter()
    .filter(|s| s % bs as usize == 0)
    .collect();
    v.dedup();
    v
}

/// Writes patterns on every queue and reads them back from another queue; then the same
/// LBA is written from one queue and read from the others, on both namespaces.
fn io_across_queues(opts: HostOptions) {
    let d = Daemon::start_default();
    let nq = 3u16;
    let mut c = controller(&d, nq, &opts);
    let n = nq as usize;
    for (nsid, bs) in [(1u32, NS1_BLOCK), (2, NS2_BLOCK)] {
        for q in c.io.iter_mut() {
            q.set_lba_size(bs);
        }
        let region = 256 * 1024u64; // one region per (size, queue): no overlaps
        let mut written = Vec::new();
        for (k, &size) in sizes(bs).iter().enumerate() {
            for i in 0..n {
                let off = (k * n + i) as u64 * region;
                let slba = off / bs as u64;
                let data = pattern(nsid as u64 * 1_000_000 + off, size);
                let s = c.io[i]
                    .write(nsid, slba, &data, false)
                    .unwrap_or_else(|e| panic!("ns {nsid} write {size} B on queue {i}: {e}"));
                assert_ok(
                    s,
                    &format!("ns {nsid} write {size} B at LBA {slba} on queue {i}"),
                );
                written.push((i, slba, data));
            }
        }
        for (i, slba, data) in &written {
            let j = (i + 1) % n;
            let mut back = vec![0u8; data.len()];
            let nlb = (data.len() / bs as usize) as u32;
            let s = c.io[j]
                .read(nsid, *slba, nlb, &mut back)
                .unwrap_or_else(|e| panic!("ns {nsid} read {} B on queue {j}: {e}", data.len()));
            assert_ok(
                s,
                &format!("ns {nsid} read {} B at LBA {slba} on queue {j}", data.len()),
            );
            assert!(
                back == *data,
                "ns {nsid}: {} B at LBA {slba} written on queue {i} read back different on queue {j} \
                 (first difference at byte {:?})",
                data.len(),
                back.iter().zip(data.iter()).position(|(a, b)| a != b)
            );
        }
        // The same LBA from every queue in turn: each read sees the latest write.
        let slba = (60 * MIB) / bs as u64;
        let size = 16384usize.max(bs as usize);
        let nlb = (size / bs as usize) as u32;
        for round in 0..n {
            let data = pattern(0xabc0 + round as u64 + nsid as u64 * 100, size);
            assert_ok(
                c.io[round].write(nsid, slba, &data, false).expect("write"),
                "write",
            );
            for j in 0..n {
                let mut back = vec![0u8; size];
                assert_ok(
                    c.io[j].read(nsid, slba, nlb, &mut back).expect("read"),
                    "read",
                );
                assert!(
                    back == data,
                    "ns {nsid}: queue {j} does not see the write of queue {round} at LBA {slba}"
                );
            }
        }
    }
    // Pipelined: queue depth 16 of mixed writes, then reads, on every queue at once.
    for (qi, q) in c.io.iter_mut().enumerate() {
        q.set_lba_size(512);
        let base = 32 * MIB / 512 + qi as u64 * 4096;
        let reqs: Vec<Request> = (0..48u64)
            .map(|k| {
                let size = [512usize, 4096, 16384, 131072][k as usize % 4];
                let buf = pattern(base * 7 + k, size);
                Request::write(1, base + k * 256, (size / 512) as u32, buf, k % 5 == 0)
            })
            .collect();
        let expect: Vec<Vec<u8>> = reqs.iter().map(|r| r.buf.clone()).collect();
        for (k, cpl) in run_pipelined(q, reqs, 16).iter().enumerate() {
            assert_ok(
                cpl.cqe.status(),
                &format!("pipelined write {k} on queue {qi}"),
            );
        }
        let reqs: Vec<Request> = expect
            .iter()
            .enumerate()
            .map(|(k, e)| {
                Request::read(
                    1,
                    base + k as u64 * 256,
                    (e.len() / 512) as u32,
                    vec![0; e.len()],
                )
            })
            .collect();
        for (k, cpl) in run_pipelined(q, reqs, 16).iter().enumerate() {
            assert_ok(
                cpl.cqe.status(),
                &format!("pipelined read {k} on queue {qi}"),
            );
            assert!(
                cpl.buf == expect[k],
                "pipelined read {k} on queue {qi} differs"
            );
        }
    }
}

#[test]
fn io_across_queues_without_digests() {
    let _w = watchdog("io_no_digests", secs(120));
    io_across_queues(HostOptions {
        io_max_incapsule: IO_INCAPSULE,
        ..host_opts()
    });
}

#[test]
fn io_across_queues_with_header_and_data_digests() {
    let _w = watchdog("io_digests", secs(120));
    io_across_queues(HostOptions {
        io_max_incapsule: IO_INCAPSULE,
        header_digest: true,
        data_digest: true,
        ..host_opts()
    });
}

#[test]
fn io_across_queues_header_digest_only() {
    let _w = watchdog("io_hdgst", secs(120));
    io_across_queues(HostOptions {
        io_max_incapsule: IO_INCAPSULE,
        header_digest: true,
        ..host_opts()
    });
}

#[test]
fn io_across_queues_all_writes_by_r2t() {
    let _w = watchdog("io_r2t", secs(120));
    io_across_queues(HostOptions {
        io_max_incapsule: 0,
        data_digest: true,
        ..host_opts()
    });
}

#[test]
fn fua_flush_write_zeroes_deallocate_compare() {
    let _w = watchdog("nvm_commands", secs(60));
    let d = Daemon::start_default();
    let mut c = controller(
        &d,
        2,
        &HostOptions {
            io_max_incapsule: IO_INCAPSULE,
            ..host_opts()
        },
    );
    for (nsid, bs) in [(1u32, NS1_BLOCK), (2, NS2_BLOCK)] {
        let (a, b) = c.io.split_at_mut(1);
        let (q0, q1) = (&mut a[0], &mut b[0]);
        q0.set_lba_size(bs);
        q1.set_lba_size(bs);
        let len = 32 * 1024usize;
        let nlb = (len / bs as usize) as u32;
        let lba = |byte: u64| byte / bs as u64;
        let mut back = vec![0u8; len];

        // FUA write, then FLUSH.
        let data = pattern(11 + nsid as u64, len);
        assert_ok(
            q0.write(nsid, lba(MIB), &data, true).expect("FUA write"),
            "FUA write",
        );
        assert_ok(
            q1.read(nsid, lba(MIB), nlb, &mut back).expect("read"),
            "read",
        );
        assert!(back == data, "ns {nsid}: FUA write read back different");
        assert_ok(q0.flush(nsid).expect("flush"), &format!("FLUSH ns {nsid}"));
        assert_ok(
            q1.flush(nsid).expect("flush"),
            &format!("FLUSH ns {nsid} (queue 2)"),
        );

        // Write Zeroes in the middle of a pattern.
        let data = pattern(21 + nsid as u64, len);
        assert_ok(
            q0.write(nsid, lba(2 * MIB), &data, false).expect("write"),
            "write",
        );
        let z0 = lba(2 * MIB) + nlb as u64 / 4;
        let zn = nlb / 2;
        assert_ok(
            q1.write_zeroes(nsid, z0, zn).expect("write zeroes"),
            &format!("WRITE ZEROES ns {nsid}"),
        );
        assert_ok(
            q0.read(nsid, lba(2 * MIB), nlb, &mut back).expect("read"),
            "read",
        );
        let (zs, ze) = (len / 4, len / 4 + zn as usize * bs as usize);
        assert!(
            back[zs..ze].iter().all(|&x| x == 0),
            "ns {nsid}: write zeroes not zero"
        );
        assert!(
            back[..zs] == data[..zs] && back[ze..] == data[ze..],
            "ns {nsid}: write zeroes spilled"
        );

        // Dataset Management: deallocate two ranges.
        let data = pattern(31 + nsid as u64, len);
        assert_ok(
            q0.write(nsid, lba(3 * MIB), &data, false).expect("write"),
            "write",
        );
        let r1 = (lba(3 * MIB), nlb / 4);
        let r2 = (lba(3 * MIB) + 3 * nlb as u64 / 4, nlb / 4);
        assert_ok(
            q1.dsm_deallocate(nsid, &[r1, r2]).expect("dsm"),
            &format!("DSM deallocate ns {nsid}"),
        );
        assert_ok(
            q0.read(nsid, lba(3 * MIB), nlb, &mut back).expect("read"),
            "read",
        );
        let q = len / 4;
        assert!(
            back[..q].iter().all(|&x| x == 0),
            "ns {nsid}: deallocated range 1 not zero"
        );
        assert!(
            back[3 * q..].iter().all(|&x| x == 0),
            "ns {nsid}: deallocated range 2 not zero"
        );
        assert!(
            back[q..3 * q] == data[q..3 * q],
            "ns {nsid}: deallocate touched other blocks"
        );

        // Compare: success, then a one-byte difference.
        let data = pattern(41 + nsid as u64, len);
        assert_ok(
            q0.write(nsid, lba(4 * MIB), &data, false).expect("write"),
            "write",
        );
        assert_ok(
            q1.compare(nsid, lba(4 * MIB), &data).expect("compare"),
            "COMPARE equal",
        );
        let mut other = data.clone();
        other[len - 100] ^= 0x40;
        let s = q1.compare(nsid, lba(4 * MIB), &other).expect("compare");
        assert_status(
            s,
            Status::COMPARE_FAILURE,
            &format!("COMPARE different, ns {nsid}"),
        );
        // Small compare (in-capsule) too.
        let s = q0
            .compare(nsid, lba(4 * MIB), &data[..bs as usize])
            .expect("compare");
        assert_ok(s, "COMPARE one block");
    }
}

#[test]
fn io_error_statuses() {
    let _w = watchdog("io_errors", secs(60));
    let mut d = Daemon::start_default();
    let mut c = controller(&d, 1, &host_opts());
    let q = &mut c.io[0];
    let nsze1 = NS1_SIZE / NS1_BLOCK as u64;
    let nsze2 = NS2_SIZE / NS2_BLOCK as u64;

    // LBA past the end (starting inside and running over, and starting past the end).
    let mut buf = vec![0u8; 1024];
    let s = q.read(1, nsze1 - 1, 2, &mut buf).expect("read");
    assert_status(s, Status::LBA_OUT_OF_RANGE, "read over the end of ns 1");
    let s = q.write(1, nsze1, &buf[..512], false).expect("write");
    assert_status(s, Status::LBA_OUT_OF_RANGE, "write past the end of ns 1");
    q.set_lba_size(4096);
    let mut buf4 = vec![0u8; 8192];
    let s = q.read(2, nsze2 - 1, 2, &mut buf4).expect("read");
    assert_status(s, Status::LBA_OUT_OF_RANGE, "read over the end of ns 2");
    let s = q.write_zeroes(2, nsze2, 1).expect("write zeroes");
    assert_status(
        s,
        Status::LBA_OUT_OF_RANGE,
        "write zeroes past the end of ns 2",
    );
    let s = q.read(1, u64::MAX - 1, 4, &mut buf4[..2048]).expect("read");
    assert_status(
        s,
        Status::LBA_OUT_OF_RANGE,
        "read with SLBA near 2^64 (overflow)",
    );
    q.set_lba_size(512);

    // Transfers beyond MDTS (1 MiB, the default max_io_size): 2049 blocks of 512 bytes,
    // and 257 blocks of 4 KiB.
    let mut big = vec![0u8; 2049 * 512];
    let s = q.read(1, 0, 2049, &mut big).expect("read beyond MDTS");
    assert_status(
        s,
        Status::INVALID_FIELD,
        "read of 2049 x 512 B (beyond MDTS)",
    );
    let s = q.write(1, 0, &big, false).expect("write beyond MDTS");
    assert_status(
        s,
        Status::INVALID_FIELD,
        "write of 2049 x 512 B (beyond MDTS)",
    );
    let mut big4 = vec![0u8; 257 * 4096];
    let s = q.read(2, 0, 257, &mut big4).expect("read beyond MDTS");
    assert_status(
        s,
        Status::INVALID_FIELD,
        "read of 257 x 4 KiB (beyond MDTS)",
    );
    // Exactly MDTS is fine.
    let mut max = vec![0u8; 2048 * 512];
    assert_ok(
        q.read(1, 0, 2048, &mut max).expect("read"),
        "read of exactly MDTS",
    );

    // Bad NSIDs.
    for nsid in [0u32, 3, 99, 0xffff_ffff] {
        let s = q.read(nsid, 0, 1, &mut buf[..512]).expect("read");
        assert_status(
            s,
            Status::INVALID_NAMESPACE,
            &format!("read from nsid {nsid:#x}"),
        );
    }
    let s = q.write(99, 0, &buf[..512], false).expect("write");
    assert_status(s, Status::INVALID_NAMESPACE, "write to nsid 99");

    // Unknown I/O opcodes.
    for opc in [0x03u8, 0x7e, 0x83] {
        let (cqe, _) = q
            .submit_admin_raw(raw_sqe(opc, 1), &[], 0)
            .expect("unknown opcode");
        assert_status(
            cqe.status(),
            Status::INVALID_OPCODE,
            &format!("I/O opcode {opc:#x}"),
        );
    }
    // The queue still works.
    let data = pattern(5, 4096);
    assert_ok(
        q.write(1, 8, &data, false).expect("write"),
        "write after errors",
    );
    let mut back = vec![0u8; 4096];
    assert_ok(
        q.read(1, 8, 8, &mut back).expect("read"),
        "read after errors",
    );
    assert!(back == data);
    assert_serves(&mut d);
}

// ============================================================================ Connect

#[test]
fn io_connect_with_invalid_parameters() {
    let _w = watchdog("connect_invalid", secs(60));
    let mut d = Daemon::start_default();
    let opts = host_opts();
    let (mut admin_q, cntlid) = admin(&d, SUBNQN, &opts);
    let granted = request_queues(&mut admin_q, 2);

    // Unknown controller ID.
    let mut h = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq");
    let s = err_status(
        h.connect_io(SUBNQN, cntlid.wrapping_add(100), 1, 31),
        "I/O Connect to an unknown CNTLID",
    );
    assert_status(
        s,
        Status::CONNECT_INVALID_PARAMETERS,
        "I/O Connect to an unknown CNTLID",
    );

    // QID beyond the granted number of queues.
    let mut h = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq");
    let s = err_status(
        h.connect_io(SUBNQN, cntlid, granted + 1, 31),
        "I/O Connect beyond the granted queues",
    );
    assert_status(
        s,
        Status::CONNECT_INVALID_PARAMETERS,
        "I/O Connect with QID granted+1",
    );

    // The same QID twice.
    let _q1 = io_queue(&d, SUBNQN, cntlid, 1, &opts);
    let mut h = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq");
    assert!(
        h.connect_io(SUBNQN, cntlid, 1, 31).is_err(),
        "a second Connect of QID 1 succeeded"
    );

    // A valid one still works.
    let mut q2 = io_queue(&d, SUBNQN, cntlid, 2, &opts);
    let mut b = vec![0u8; 512];
    assert_ok(q2.read(1, 0, 1, &mut b).expect("read"), "read on QID 2");
    assert_serves(&mut d);
}

/// A Connect capsule with hand-made data (HOSTID, CNTLID, SUBNQN, HOSTNQN fields).
fn raw_connect(d: &Daemon, subnqn: &[u8], hostnqn: &[u8]) -> Status {
    let mut data = vec![0u8; 1024];
    data[..16].copy_from_slice(&[0x11; 16]);
    data[16..18].copy_from_slice(&0xffffu16.to_le_bytes());
    data[256..256 + subnqn.len()].copy_from_slice(subnqn);
    data[512..512 + hostnqn.len()].copy_from_slice(hostnqn);
    let cmd = ConnectCommand {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    };
    let mut h = TcpHost::connect(d.addr(), host_opts()).expect("ICReq");
    let (cqe, _) = h
        .submit_admin_raw(cmd.to_sqe(0), &data, 0)
        .expect("Connect capsule answered");
    cqe.status()
}

#[test]
fn connect_with_garbage_nqns_fails_cleanly() {
    let _w = watchdog("garbage_nqns", secs(60));
    let mut d = Daemon::start_default();
    let host = b"nqn.2014-08.org.nvmexpress:uuid:0b5c1d2e-3f40-4152-8364-a5b6c7d8e9f1";
    let cases: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
        ("SUBNQN not NUL-terminated", vec![b'a'; 256], host.to_vec()),
        (
            "SUBNQN of 256 non-NUL bytes starting like ours",
            {
                let mut v = SUBNQN.as_bytes().to_vec();
                v.resize(256, b'x');
                v
            },
            host.to_vec(),
        ),
        (
            "SUBNQN with a wrong prefix",
            b"nqx.2026-11.dev.nvmf-target:e2e".to_vec(),
            host.to_vec(),
        ),
        ("SUBNQN empty", vec![], host.to_vec()),
        (
            "SUBNQN not UTF-8",
            vec![b'n', b'q', b'n', b'.', 0xff, 0xfe, b':', b'x'],
            host.to_vec(),
        ),
        (
            "unknown SUBNQN",
            b"nqn.2026-11.dev.nvmf-target:nope".to_vec(),
            host.to_vec(),
        ),
        (
            "HOSTNQN not NUL-terminated",
            SUBNQN.as_bytes().to_vec(),
            vec![b'h'; 256],
        ),
        (
            "HOSTNQN with a wrong prefix",
            SUBNQN.as_bytes().to_vec(),
            b"host:1".to_vec(),
        ),
        // (An empty HOSTNQN is accepted where any host is: see host_quirks.rs. A subsystem
        // with a hosts list refuses it.)
        ("HOSTNQN empty", RESTRICTED_NQN.as_bytes().to_vec(), vec![]),
    ];
    for (what, sub, hostnqn) in cases {
        let s = raw_connect(&d, &sub, &hostnqn);
        assert!(!s.is_success(), "Connect with {what}: succeeded");
        assert!(
            d.is_running(),
            "daemon died on Connect with {what}; log:\n{}",
            d.log()
        );
    }
    // Discovery NQN spelled wrong is not the discovery controller either.
    let s = raw_connect(&d, b"nqn.2014-08.org.nvmexpress.discovery.", host);
    assert!(
        !s.is_success(),
        "Connect to a misspelled discovery NQN succeeded"
    );
    assert_serves(&mut d);
}

// ============================================================================ keep-alive

#[test]
fn keep_alive_expiry_closes_the_association() {
    let _w = watchdog("keep_alive", secs(60));
    let mut d = Daemon::start_default();
    let opts = HostOptions {
        timeout: secs(5),
        ..host_opts()
    };
    // A: KATO 1 s, then silence. B: KATO 5 s with a Keep Alive every 250 ms (B shows Keep
    // Alives keep a controller; with 1 s, a test thread left off the CPU for 750 ms on a
    // loaded machine would have let it expire).
    let mut a = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq");
    let a_id = a.connect_admin(SUBNQN, 1000).expect("Connect KATO 1000");
    a.enable_controller().expect("enable");
    request_queues(&mut a, 1);
    let mut a_io = io_queue(&d, SUBNQN, a_id, 1, &opts);
    let mut b = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq");
    b.connect_admin(SUBNQN, 5000).expect("Connect KATO 5000");
    b.enable_controller().expect("enable");

    let start = Instant::now();
    while start.elapsed() < secs(3) {
        b.keep_alive().expect("Keep Alive on the live controller");
        std::thread::sleep(Duration::from_millis(250));
    }
    b.identify(1, 0)
        .expect("the controller that sent Keep Alives still works");

    // Closed by the target, or failed: both are fine; an answer with success or no
    // answer at all is not.
    let expired = |r: Result<Status, Error>, what: &str| match r {
        Err(Error::Eof) | Err(Error::Io(_)) | Err(Error::Terminated { .. }) => {}
        Err(Error::Status(..)) => {}
        Ok(s) if !s.is_success() => {}
        Ok(_) => panic!("{what}: command succeeded 3 s after a 1 s KATO expired"),
        Err(Error::Timeout) => panic!("{what}: no answer and no close after KATO expiry"),
        Err(e) => panic!("{what}: unexpected {e}"),
    };
    expired(
        a.keep_alive().map(|_| Status::SUCCESS),
        "admin queue of the silent controller",
    );
    let mut buf = vec![0u8; 512];
    expired(
        a_io.read(1, 0, 1, &mut buf),
        "I/O queue of the silent controller",
    );
    assert_serves(&mut d);
}

// ============================================================================ malformed PDUs

/// Expects a C2HTermReq with `fes` (and `fei` when given), then the target closing the
/// socket.
#[track_caller]
fn expect_term_req(h: &mut TcpHost, fes: u16, fei: Option<u32>, what: &str) {
    match h.recv_pdu() {
        Ok(OwnedPdu::C2HTermReq { fes: f, fei: i }) => {
            assert_eq!(f, fes, "{what}: C2HTermReq FES (FEI {i})");
            if let Some(fei) = fei {
                assert_eq!(i, fei, "{what}: C2HTermReq FEI");
            }
        }
        other => panic!("{what}: expected C2HTermReq FES {fes:#x}, got {other:?}"),
    }
    expect_closed(h, what);
}

#[track_caller]
fn expect_closed(h: &mut TcpHost, what: &str) {
    match h.recv_pdu() {
        Err(Error::Eof) => {}
        Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("{what}: expected the target to close the socket, got {other:?}"),
    }
}

fn raw_opts() -> HostOptions {
    HostOptions {
        timeout: secs(5),
        ..host_opts()
    }
}

/// A connection after ICReq/ICResp.
fn ic_done(d: &Daemon, digests: Digests) -> TcpHost {
    TcpHost::connect(
        d.addr(),
        HostOptions {
            header_digest: digests.header,
            data_digest: digests.data,
            ..raw_opts()
        },
    )
    .expect("ICReq/ICResp")
}

fn identify_capsule(d: Digests, data: &[u8]) -> Vec<u8> {
    let mut sqe = raw_sqe(opcodes::admin::IDENTIFY, 0);
    sqe.cdw10 = 1;
    let mut out = Vec::new();
    tcp::encode_capsule_cmd(&mut out, &sqe, data, d, 0);
    out
}

#[test]
fn malformed_truncated_pdu_then_close() {
    let _w = watchdog("truncated", secs(60));
    let mut d = Daemon::start_default();
    // Half a CapsuleCmd, then close.
    let mut h = ic_done(&d, Digests::NONE);
    let pdu = identify_capsule(Digests::NONE, &[]);
    h.send_raw(&pdu[..40]).expect("send");
    h.stream()
        .shutdown(std::net::Shutdown::Write)
        .expect("shutdown");
    expect_closed(&mut h, "truncated CapsuleCmd then FIN");
    drop(h);
    // Half an ICReq, then close.
    let mut h = TcpHost::connect_raw(d.addr(), raw_opts()).expect("connect");
    let mut ic = Vec::new();
    tcp::encode_ic_req(&mut ic, &IcReq::default());
    h.send_raw(&ic[..60]).expect("send");
    h.stream()
        .shutdown(std::net::Shutdown::Write)
        .expect("shutdown");
    expect_closed(&mut h, "truncated ICReq then FIN");
    drop(h);
    // Just a few bytes of a common header, then reset.
    let mut h = ic_done(&d, Digests::NONE);
    h.send_raw(&pdu[..5]).expect("send");
    drop(h);
    assert_serves(&mut d);
}

#[test]
fn malformed_bad_pdu_type() {
    let _w = watchdog("bad_type", secs(60));
    let mut d = Daemon::start_default();
    for ty in [0x0bu8, 0x08, 0x05, 0x07] {
        let mut h = ic_done(&d, Digests::NONE);
        let mut pdu = identify_capsule(Digests::NONE, &[]);
        pdu[0] = ty;
        h.send_raw(&pdu).expect("send");
        expect_term_req(
            &mut h,
            tcp::fes::INVALID_HEADER_FIELD,
            Some(0),
            &format!("PDU type {ty:#x}"),
        );
    }
    assert_serves(&mut d);
}

#[test]
fn malformed_bad_hlen() {
    let _w = watchdog("bad_hlen", secs(60));
    let mut d = Daemon::start_default();
    for hlen in [0u8, 24, 71, 73, 255] {
        let mut h = ic_done(&d, Digests::NONE);
        let mut pdu = identify_capsule(Digests::NONE, &[]);
        pdu[2] = hlen;
        h.send_raw(&pdu).expect("send");
        expect_term_req(
            &mut h,
            tcp::fes::INVALID_HEADER_FIELD,
            Some(2),
            &format!("HLEN {hlen}"),
        );
    }
    assert_serves(&mut d);
}

/// PLEN shorter than HLEN: the field in error is PLEN (FEI 4). PDO 0 is what a capsule
/// without data carries, so it is not the field to blame.
#[test]
fn malformed_plen_shorter_than_header() {
    let _w = watchdog("short_plen", secs(60));
    let mut d = Daemon::start_default();
    let mut h = ic_done(&d, Digests::NONE);
    let mut pdu = identify_capsule(Digests::NONE, &[]);
    pdu[4..8].copy_from_slice(&70u32.to_le_bytes());
    h.send_raw(&pdu).expect("send");
    expect_term_req(
        &mut h,
        tcp::fes::INVALID_HEADER_FIELD,
        Some(4),
        "PLEN 70 < HLEN",
    );
    assert_serves(&mut d);
}

#[test]
fn malformed_bad_plen_and_pdo() {
    let _w = watchdog("bad_plen_pdo", secs(60));
    let mut d = Daemon::start_default();
    // PDO inside the header.
    let mut h = ic_done(&d, Digests::NONE);
    let mut pdu = identify_capsule(Digests::NONE, &[0u8; 64]);
    assert_eq!(pdu[3], 72, "PDO of the well-formed capsule");
    pdu[3] = 8;
    h.send_raw(&pdu).expect("send");
    expect_term_req(&mut h, tcp::fes::INVALID_HEADER_FIELD, Some(3), "PDO 8");

    // PDO beyond PLEN.
    let mut h = ic_done(&d, Digests::NONE);
    let mut pdu = identify_capsule(Digests::NONE, &[0u8; 64]);
    pdu[3] = 200;
    h.send_raw(&pdu).expect("send");
    expect_term_req(
        &mut h,
        tcp::fes::INVALID_HEADER_FIELD,
        Some(3),
        "PDO 200 > PLEN",
    );

    // In-capsule data over the limit: the header alone announces 1 MiB.
    let mut h = ic_done(&d, Digests::NONE);
    let mut pdu = identify_capsule(Digests::NONE, &[0u8; 64]);
    pdu[4..8].copy_from_slice(&(72u32 + (1 << 20)).to_le_bytes());
    h.send_raw(&pdu).expect("send");
    expect_term_req(
        &mut h,
        tcp::fes::DATA_TRANSFER_LIMIT_EXCEEDED,
        Some(4),
        "in-capsule data of 1 MiB",
    );
    assert_serves(&mut d);
}

#[test]
fn malformed_h2c_data_with_unknown_ttag() {
    let _w = watchdog("unknown_ttag", secs(60));
    let mut d = Daemon::start_default();
    // On a fresh connection, on a connected admin queue, and on an I/O queue.
    let mut h = ic_done(&d, Digests::NONE);
    let mut pdu = Vec::new();
    tcp::encode_h2c_data(&mut pdu, 0, 0x1234, 0, &[0u8; 512], true, Digests::NONE, 0);
    h.send_raw(&pdu).expect("send");
    expect_term_req(
        &mut h,
        tcp::fes::INVALID_HEADER_FIELD,
        Some(10),
        "H2CData, no command",
    );

    let (mut h, _) = admin(&d, SUBNQN, &raw_opts());
    h.send_raw(&pdu).expect("send");
    expect_term_req(
        &mut h,
        tcp::fes::INVALID_HEADER_FIELD,
        Some(10),
        "H2CData on the admin queue",
    );

    let mut a = controller(&d, 1, &raw_opts());
    let q = &mut a.io[0];
    // A real write waiting for its R2T; answer with the wrong TTAG.
    let cid = q
        .submit(Request::write(1, 0, 64, pattern(1, 32768), false))
        .expect("submit");
    match q.recv_pdu().expect("R2T") {
        OwnedPdu::R2T {
            cccid,
            ttag,
            r2to,
            r2tl,
        } => {
            assert_eq!((cccid, r2to, r2tl), (cid, 0, 32768), "R2T fields");
            let mut pdu = Vec::new();
            let bad = ttag.wrapping_add(1);
            tcp::encode_h2c_data(
                &mut pdu,
                cid,
                bad,
                0,
                &pattern(1, 32768),
                true,
                Digests::NONE,
                0,
            );
            q.send_raw(&pdu).expect("send");
        }
        other => panic!("expected R2T, got {other:?}"),
    }
    expect_term_req(
        q,
        tcp::fes::INVALID_HEADER_FIELD,
        Some(10),
        "H2CData with a wrong TTAG",
    );
    assert_serves(&mut d);
}

#[test]
fn malformed_bad_header_digest() {
    let _w = watchdog("bad_hdgst", secs(60));
    let mut d = Daemon::start_default();
    let dg = Digests {
        header: true,
        data: false,
    };
    let mut h = ic_done(&d, dg);
    assert_eq!(h.digests(), dg, "header digest negotiated");
    let mut pdu = identify_capsule(dg, &[]);
    assert_eq!(pdu.len(), 76);
    pdu[73] ^= 0x01;
    h.send_raw(&pdu).expect("send");
    expect_term_req(
        &mut h,
        tcp::fes::HEADER_DIGEST_ERROR,
        None,
        "bad header digest",
    );
    // Digest flag missing although negotiated.
    let mut h = ic_done(&d, dg);
    let mut pdu = identify_capsule(Digests::NONE, &[]);
    pdu[1] = 0;
    h.send_raw(&pdu).expect("send");
    expect_term_req(
        &mut h,
        tcp::fes::INVALID_HEADER_FIELD,
        Some(1),
        "HDGSTF missing",
    );
    assert_serves(&mut d);
}

#[test]
fn malformed_second_icreq() {
    let _w = watchdog("second_icreq", secs(60));
    let mut d = Daemon::start_default();
    let mut h = ic_done(&d, Digests::NONE);
    let mut ic = Vec::new();
    tcp::encode_ic_req(&mut ic, &IcReq::default());
    h.send_raw(&ic).expect("send");
    expect_term_req(&mut h, tcp::fes::PDU_SEQUENCE_ERROR, None, "second ICReq");
    // And after Connect.
    let (mut h, _) = admin(&d, SUBNQN, &raw_opts());
    h.send_raw(&ic).expect("send");
    expect_term_req(
        &mut h,
        tcp::fes::PDU_SEQUENCE_ERROR,
        None,
        "ICReq after Connect",
    );
    // A CapsuleCmd before ICReq is a sequence error too.
    let mut h = TcpHost::connect_raw(d.addr(), raw_opts()).expect("connect");
    h.send_raw(&identify_capsule(Digests::NONE, &[]))
        .expect("send");
    expect_term_req(
        &mut h,
        tcp::fes::PDU_SEQUENCE_ERROR,
        None,
        "CapsuleCmd before ICReq",
    );
    assert_serves(&mut d);
}

#[test]
fn malformed_icreq_pfv_1() {
    let _w = watchdog("icreq_pfv", secs(60));
    let mut d = Daemon::start_default();
    let mut h = TcpHost::connect_raw(d.addr(), raw_opts()).expect("connect");
    let mut ic = Vec::new();
    tcp::encode_ic_req(
        &mut ic,
        &IcReq {
            pfv: 1,
            ..IcReq::default()
        },
    );
    h.send_raw(&ic).expect("send");
    expect_term_req(
        &mut h,
        tcp::fes::UNSUPPORTED_PARAMETER,
        Some(8),
        "ICReq PFV 1",
    );
    // HPDA beyond 31.
    let mut h = TcpHost::connect_raw(d.addr(), raw_opts()).expect("connect");
    let mut ic = Vec::new();
    tcp::encode_ic_req(&mut ic, &IcReq::default());
    ic[10] = 32;
    h.send_raw(&ic).expect("send");
    expect_term_req(
        &mut h,
        tcp::fes::INVALID_HEADER_FIELD,
        Some(10),
        "ICReq HPDA 32",
    );
    assert_serves(&mut d);
}

#[test]
fn host_term_req_closes_quietly() {
    let _w = watchdog("h2c_term", secs(60));
    let mut d = Daemon::start_default();
    let (mut h, _) = admin(&d, SUBNQN, &raw_opts());
    let mut t = Vec::new();
    tcp::encode_term_req(&mut t, false, tcp::fes::INVALID_HEADER_FIELD, 0, &[0u8; 8]);
    h.send_raw(&t).expect("send");
    expect_closed(&mut h, "after H2CTermReq");
    assert_serves(&mut d);
}

// ============================================================================ stop

#[test]
fn sigterm_with_io_in_flight_exits_zero() {
    let _w = watchdog("sigterm_io", secs(60));
    let mut d = Daemon::start_default();
    let opts = HostOptions {
        timeout: secs(5),
        io_max_incapsule: IO_INCAPSULE,
        ..host_opts()
    };
    let c = controller(&d, 2, &opts);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut threads = Vec::new();
    for (qi, mut q) in c.io.into_iter().enumerate() {
        let done = done.clone();
        threads.push(std::thread::spawn(move || {
            let deadline = Instant::now() + secs(20);
            let mut k = 0u64;
            let mut inflight = 0;
            while Instant::now() < deadline {
                while inflight < 16 {
                    let nsid = 1 + (k % 2) as u32;
                    let (bs, nlb) = if nsid == 1 { (512, 256) } else { (4096, 32) };
                    let slba = (k * 131072 % (32 * MIB)) / bs + qi as u64 * (32 * MIB) / bs;
                    let req = if k % 3 == 2 {
                        Request::read(nsid, slba, nlb, vec![0; 131072])
                    } else {
                        Request::write(nsid, slba, nlb, pattern(k, 131072), false)
                    };
                    if q.submit(req).is_err() {
                        return;
                    }
                    k += 1;
                    inflight += 1;
                }
                match q.poll_completion() {
                    Ok(_) => {
                        inflight -= 1;
                        done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    let start = Instant::now();
    while done.load(std::sync::atomic::Ordering::SeqCst) < 200 && start.elapsed() < secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        done.load(std::sync::atomic::Ordering::SeqCst) >= 200,
        "I/O did not get going"
    );
    let t = Instant::now();
    let st = d.stop_within(secs(5));
    let took = t.elapsed();
    for t in threads {
        t.join().expect("I/O thread");
    }
    match st {
        Ok(st) => assert!(
            st.success(),
            "exit status {st} on SIGTERM with I/O in flight"
        ),
        Err(_) => panic!(
            "no exit within 5 s of SIGTERM with I/O in flight; log:\n{}",
            d.log()
        ),
    }
    eprintln!("stopped in {took:?} with I/O in flight");
}

#[test]
fn sigint_and_idle_sigterm_exit_zero() {
    let _w = watchdog("sigint", secs(60));
    let mut d = Daemon::start_default();
    let _idle = admin(&d, SUBNQN, &host_opts());
    match d.signal_and_wait(nix::sys::signal::Signal::SIGINT, secs(5)) {
        Ok(st) => assert!(st.success(), "exit status {st} on SIGINT"),
        Err(_) => panic!("no exit within 5 s of SIGINT; log:\n{}", d.log()),
    }
    d.restart();
    // SIGHUP changes nothing and keeps serving.
    d.signal(nix::sys::signal::Signal::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    assert_serves(&mut d);
    d.stop();
}

// ============================================================================ more probes

/// A corrupted data digest fails just that command (Transient Transport Error), leaves
/// the blocks alone, and the connection goes on.
#[test]
fn data_digest_error_fails_the_command_only() {
    let _w = watchdog("ddgst_error", secs(60));
    let mut d = Daemon::start_default();
    let opts = HostOptions {
        io_max_incapsule: IO_INCAPSULE,
        header_digest: true,
        data_digest: true,
        ..host_opts()
    };
    let mut c = controller(&d, 1, &opts);
    let q = &mut c.io[0];
    let old = pattern(1, 4096);
    assert_ok(q.write(1, 64, &old, false).expect("write"), "write");

    // In-capsule write with a bad data digest.
    let mut sqe = raw_sqe(opcodes::io::WRITE, 1);
    sqe.cdw10 = 64;
    sqe.cdw12 = 7;
    sqe.set_opcode_cid(opcodes::io::WRITE, 30);
    sqe.cdw0 |= 1 << 14;
    sqe.dptr = nvmf::spec::SglDescriptor::unkeyed(
        nvmf::spec::sgl::TYPE_DATA_BLOCK,
        nvmf::spec::sgl::SUBTYPE_OFFSET,
        0,
        4096,
    );
    let new = pattern(2, 4096);
    let mut pdu = Vec::new();
    tcp::encode_capsule_cmd(&mut pdu, &sqe, &new, Digests::BOTH, 0);
    let n = pdu.len();
    pdu[n - 1] ^= 0xff;
    q.send_raw(&pdu).expect("send");
    match q
        .recv_pdu()
        .expect("answer to a capsule with a bad data digest")
    {
        OwnedPdu::CapsuleResp(cqe) => {
            assert_eq!(cqe.cid, 30);
            assert_status(
                cqe.status(),
                Status::TRANSIENT_TRANSPORT_ERROR,
                "in-capsule data with a bad data digest",
            );
        }
        other => panic!("expected a CapsuleResp, got {other:?}"),
    }
    let mut back = vec![0u8; 4096];
    assert_ok(
        q.read(1, 64, 8, &mut back).expect("read"),
        "read after digest error",
    );
    assert!(
        back == old,
        "a write with a bad data digest changed the blocks"
    );
    assert_serves(&mut d);
}

/// C2HData honours the host's HPDA (the host framer checks the alignment).
#[test]
fn io_across_queues_with_hpda() {
    let _w = watchdog("io_hpda", secs(120));
    io_across_queues(HostOptions {
        io_max_incapsule: IO_INCAPSULE,
        hpda: 7,
        data_digest: true,
        ..host_opts()
    });
}

/// SGL length disagreeing with NLB: Data SGL Length Invalid, not a short/long transfer.
#[test]
fn sgl_shorter_than_transfer() {
    let _w = watchdog("sgl_short", secs(60));
    let mut d = Daemon::start_default();
    let opts = HostOptions {
        io_max_incapsule: IO_INCAPSULE,
        ..host_opts()
    };
    let mut c = controller(&d, 1, &opts);
    let q = &mut c.io[0];
    // Read of 8 blocks into a 2 KiB SGL.
    let cid = q
        .submit(Request::read(1, 0, 8, vec![0; 2048]))
        .expect("submit");
    let cpl = q.wait(cid).expect("completion");
    assert_status(
        cpl.cqe.status(),
        Status::DATA_SGL_LENGTH_INVALID,
        "read, SGL 2 KiB, NLB 8",
    );
    // Write of 8 blocks with 2 KiB in-capsule, and with 16 KiB... of which 64 KiB by R2T.
    let cid = q
        .submit(Request::write(1, 0, 8, vec![1; 2048], false))
        .expect("submit");
    let cpl = q.wait(cid).expect("completion");
    assert_status(
        cpl.cqe.status(),
        Status::DATA_SGL_LENGTH_INVALID,
        "write in-capsule, SGL 2 KiB, NLB 8",
    );
    let cid = q
        .submit(Request::write(1, 0, 256, vec![1; 65536], false))
        .expect("submit");
    let cpl = q.wait(cid).expect("completion");
    assert_status(
        cpl.cqe.status(),
        Status::DATA_SGL_LENGTH_INVALID,
        "write by R2T, SGL 64 KiB, NLB 256",
    );
    assert_serves(&mut d);
}

/// Hosts that vanish in the middle of a write (after the R2T, after part of the data)
/// leave nothing behind: the daemon serves others and still stops within seconds.
#[test]
fn abandoned_transfers_then_graceful_stop() {
    let _w = watchdog("abandoned", secs(60));
    let mut d = Daemon::start_default();
    for partial in [false, true] {
        let mut c = controller(&d, 2, &raw_opts());
        for q in c.io.iter_mut() {
            for k in 0..4u64 {
                q.submit(Request::write(1, k * 256, 256, pattern(k, 131072), false))
                    .expect("submit");
            }
            // Take the first R2T and, optionally, send half of its data.
            if let OwnedPdu::R2T {
                cccid, ttag, r2to, ..
            } = q.recv_pdu().expect("R2T")
            {
                if partial {
                    let mut pdu = Vec::new();
                    tcp::encode_h2c_data(
                        &mut pdu,
                        cccid,
                        ttag,
                        r2to,
                        &[7u8; 65536],
                        false,
                        Digests::NONE,
                        0,
                    );
                    q.send_raw(&pdu).expect("send");
                }
            } else {
                panic!("expected an R2T");
            }
        }
        // Also a half-sent capsule on the admin queue.
        let pdu = identify_capsule(Digests::NONE, &[]);
        c.admin.send_raw(&pdu[..30]).expect("send");
        drop(c);
        assert_serves(&mut d);
    }
    std::thread::sleep(Duration::from_millis(200));
    match d.stop_within(secs(5)) {
        Ok(st) => assert!(st.success(), "exit status {st} after abandoned transfers"),
        Err(_) => panic!(
            "no exit within 5 s of SIGTERM after abandoned transfers; log:\n{}",
            d.log()
        ),
    }
}

/// CC.SHN completes a shutdown (CSTS.SHST); CC.EN=0 resets (CSTS.RDY=0); enabling again
/// works.
#[test]
fn controller_shutdown_and_reset() {
    let _w = watchdog("shutdown_reset", secs(60));
    let mut d = Daemon::start_default();
    let wait_csts = |h: &mut TcpHost, mask: u64, want: u64, what: &str| {
        let deadline = Instant::now() + secs(5);
        loop {
            let csts = h.property_get(0x1c, false).expect("CSTS");
            if csts & mask == want {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: CSTS {csts:#x}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let (mut h, _) = admin(&d, SUBNQN, &host_opts());
    let cc = h.property_get(0x14, false).expect("CC");
    h.property_set(0x14, cc | 1 << 14, false)
        .expect("CC.SHN=01b");
    wait_csts(&mut h, 0b1100, 0b1000, "shutdown processing complete");

    let (mut h, _) = admin(&d, SUBNQN, &host_opts());
    let cc = h.property_get(0x14, false).expect("CC");
    h.property_set(0x14, cc & !1, false).expect("CC.EN=0");
    wait_csts(&mut h, 1, 0, "CSTS.RDY after CC.EN=0");
    let s = err_status(h.identify(1, 0), "Identify while disabled");
    assert_status(s, Status::COMMAND_SEQUENCE_ERROR, "Identify after reset");
    h.enable_controller().expect("enable again");
    h.identify(1, 0).expect("Identify after re-enable");
    assert_serves(&mut d);
}

/// Get Log Page of a reserved LID: Invalid Log Page (NVMe Base 2.0, Get Log Page
/// command-specific status 09h, "also returned if a reserved log page is requested").
#[test]
fn get_log_page_of_unknown_lid_is_invalid_log_page() {
    let _w = watchdog("unknown_lid", secs(60));
    let mut d = Daemon::start_default();
    let (mut h, _) = admin(&d, SUBNQN, &host_opts());
    let s = err_status(
        h.get_log_page(0x55, 0, 0, 512, false),
        "Get Log Page LID 55h",
    );
    assert_status(
        s,
        Status::INVALID_LOG_PAGE,
        "Get Log Page of an unknown LID",
    );
    assert_serves(&mut d);
}

/// More admin error paths: offset past a log, unknown CNS, unknown
/// feature, Number of Queues after I/O queues exist, 65536 queues, AER limit.
#[test]
fn admin_error_statuses() {
    let _w = watchdog("admin_errors", secs(60));
    let mut d = Daemon::start_default();
    let opts = host_opts();
    let (mut h, cntlid) = admin(&d, SUBNQN, &opts);
    let s = err_status(
        h.get_log_page(0x02, 0xffff_ffff, 4096, 4, false),
        "SMART log at offset 4096",
    );
    assert_status(s, Status::INVALID_FIELD, "Get Log Page offset past the log");
    let s = err_status(h.identify(0x1f, 0), "Identify CNS 1Fh");
    assert_status(s, Status::INVALID_FIELD, "Identify with an unsupported CNS");
    let s = err_status(h.get_features(0x55, 0, 0), "Get Features FID 55h");
    assert_status(s, Status::INVALID_FIELD, "Get Features of an unknown FID");
    let s = err_status(h.set_features(0x07, 0, 0xffff_ffff, false), "65536 queues");
    assert_status(s, Status::INVALID_FIELD, "Number of Queues 65536");

    let granted = request_queues(&mut h, 2);
    assert!(granted >= 2);
    let _q = io_queue(&d, SUBNQN, cntlid, 1, &opts);
    let s = err_status(
        h.set_features(0x07, 0, 0x0003_0003, false),
        "Number of Queues after I/O queue",
    );
    assert_status(
        s,
        Status::COMMAND_SEQUENCE_ERROR,
        "Number of Queues after an I/O queue exists",
    );
    // Get Features still reports the grant.
    let dw0 = h
        .get_features(0x07, 0, 0)
        .expect("Get Features Number of Queues");
    assert_eq!((dw0 & 0xffff) as u16 + 1, granted, "NSQA from Get Features");

    // AERs are held; one more than AERL+1 is refused; other commands still run.
    let id = h.identify(1, 0).expect("Identify");
    let aerl = id[259] as usize + 1;
    let mut held = Vec::new();
    for _ in 0..aerl {
        held.push(
            h.submit(Request::new(
                raw_sqe(opcodes::admin::ASYNC_EVENT_REQUEST, 0),
                nvmf_initiator::Xfer::None,
                Vec::new(),
            ))
            .expect("submit AER"),
        );
    }
    h.keep_alive().expect("Keep Alive with AERs outstanding");
    let extra = h
        .submit(Request::new(
            raw_sqe(opcodes::admin::ASYNC_EVENT_REQUEST, 0),
            nvmf_initiator::Xfer::None,
            Vec::new(),
        ))
        .expect("submit AER");
    let cpl = h.wait(extra).expect("the extra AER completes");
    assert_status(
        cpl.cqe.status(),
        Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED,
        &format!("AER number {} (AERL+1 = {aerl})", aerl + 1),
    );
    h.identify(0, 1)
        .expect("Identify Namespace with AERs outstanding");
    assert_eq!(h.outstanding(), aerl, "held AERs completed early");
    assert_serves(&mut d);
}

#[test]
fn io_connect_sqsize_limits() {
    let _w = watchdog("sqsize", secs(60));
    let mut d = Daemon::start_default();
    let opts = host_opts();
    let (mut a, cntlid) = admin(&d, SUBNQN, &opts);
    request_queues(&mut a, 3);
    let mqes = (a.property_get(0x00, true).expect("CAP") & 0xffff) as u16;
    let mut h = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq");
    let s = err_status(h.connect_io(SUBNQN, cntlid, 1, 0), "SQSIZE 0");
    assert_status(
        s,
        Status::CONNECT_INVALID_PARAMETERS,
        "I/O Connect with SQSIZE 0",
    );
    if mqes < u16::MAX {
        let mut h = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq");
        let s = err_status(h.connect_io(SUBNQN, cntlid, 1, mqes + 1), "SQSIZE MQES+1");
        assert_status(
            s,
            Status::CONNECT_INVALID_PARAMETERS,
            "I/O Connect with SQSIZE > MQES",
        );
    }
    // SQSIZE = MQES works, and that many commands can be outstanding.
    let mut h = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq");
    h.connect_io(SUBNQN, cntlid, 2, mqes)
        .expect("I/O Connect with SQSIZE = MQES");
    let n = h.queue_depth().min(1024);
    let reqs: Vec<Request> = (0..n as u64)
        .map(|k| Request::read(1, k * 8, 8, vec![0; 4096]))
        .collect();
    for (k, cpl) in run_pipelined(&mut h, reqs, n).iter().enumerate() {
        assert_ok(cpl.cqe.status(), &format!("read {k} of {n} outstanding"));
    }
    assert_serves(&mut d);
}

fn open_fds(d: &Daemon) -> usize {
    let pid = d.pid().expect("running");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/PID/fd")
        .count()
}

/// Connections that come and go (clean, abandoned, malformed) leave no file descriptor
/// (no QP) behind, and every admin Connect gets its own CNTLID.
#[test]
fn connections_do_not_leak() {
    let _w = watchdog("leak", secs(120));
    let mut d = Daemon::start_default();
    // Warm up both IO threads, then measure.
    for _ in 0..4 {
        drop(controller(&d, 2, &host_opts()));
    }
    std::thread::sleep(Duration::from_millis(300));
    let before = open_fds(&d);
    let mut ids = std::collections::HashSet::new();
    for k in 0..60u64 {
        match k % 4 {
            0 => {
                let mut c = controller(&d, 2, &host_opts());
                assert!(ids.insert(c.cntlid), "CNTLID {} handed out twice", c.cntlid);
                let mut b = vec![0u8; 4096];
                assert_ok(c.io[1].read(1, k, 8, &mut b).expect("read"), "read");
            }
            1 => {
                let mut c = controller(&d, 1, &raw_opts());
                c.io[0]
                    .submit(Request::write(1, 0, 256, vec![0; 131072], false))
                    .expect("submit");
                let _ = c.io[0].recv_pdu();
            }
            2 => {
                let mut h = ic_done(&d, Digests::NONE);
                h.send_raw(&[0xee; 72]).expect("send");
                let _ = h.recv_pdu();
            }
            _ => {
                let _ = TcpHost::connect_raw(d.addr(), raw_opts()).expect("connect");
            }
        }
    }
    let deadline = Instant::now() + secs(5);
    let after = loop {
        let n = open_fds(&d);
        if n <= before || Instant::now() > deadline {
            break n;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        after <= before,
        "daemon file descriptors grew from {before} to {after} after 60 connections closed"
    );
    assert_serves(&mut d);
}

/// The discovery controller has no I/O queues.
#[test]
fn io_connect_to_discovery_is_refused() {
    let _w = watchdog("disc_io", secs(60));
    let mut d = Daemon::start_default();
    let opts = host_opts();
    let (_a, cntlid) = admin(&d, DISCOVERY_NQN, &opts);
    let mut h = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq");
    let s = err_status(
        h.connect_io(DISCOVERY_NQN, cntlid, 1, 31),
        "I/O Connect to the discovery controller",
    );
    assert_status(
        s,
        Status::CONNECT_INVALID_PARAMETERS,
        "I/O Connect to the discovery controller",
    );
    assert_serves(&mut d);
}
