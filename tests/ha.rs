//! End to end: reservations between two hosts, PTPL across a daemon restart, ANA states
//! per listener changed by reload, per-host visibility.

mod common;

use std::time::Duration;

use common::*;
use nvmf::spec::opcodes::io;
use nvmf::spec::{Sqe, Status};
use nvmf_initiator::{HostOptions, Request, TcpHost, Xfer};

const HA_CONFIG: &str = "\
io_threads: 2
listeners:
  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: {port}}
backends:
  - {name: ram0, type: ram, size: 16MiB, block_size: 512}
reservations: {state_file: {dir}/resv.ptpl}
subsystems:
  - nqn: nqn.2026-11.dev.nvmf-target:e2e
    allow_any_host: true
    namespaces:
      - {nsid: 1, backend: ram0}
";

fn resv(
    io: &mut TcpHost,
    opcode: u8,
    cdw10: u32,
    cdw11: u32,
    xfer: Xfer,
    buf: Vec<u8>,
) -> (Status, Vec<u8>) {
    let mut sqe = Sqe {
        nsid: 1,
        cdw10,
        cdw11,
        ..Default::default()
    };
    sqe.set_opcode_cid(opcode, 0);
    let cid = io.submit(Request::new(sqe, xfer, buf)).expect("submit");
    let c = io.wait(cid).expect("completion");
    (c.cqe.status(), c.buf)
}

fn keys(a: u64, b: u64) -> Vec<u8> {
    let mut d = a.to_le_bytes().to_vec();
    d.extend_from_slice(&b.to_le_bytes());
    d
}

fn register(io: &mut TcpHost, key: u64, cptpl: u32) -> Status {
    resv(
        io,
        io::RESERVATION_REGISTER,
        cptpl << 30,
        0,
        Xfer::ToController,
        keys(0, key),
    )
    .0
}

fn acquire(io: &mut TcpHost, action: u32, rtype: u32, crkey: u64, prkey: u64) -> Status {
    resv(
        io,
        io::RESERVATION_ACQUIRE,
        action | rtype << 8,
        0,
        Xfer::ToController,
        keys(crkey, prkey),
    )
    .0
}

/// Reservation Report, extended: (RTYPE, REGCTL, PTPLS, holder host IDs).
fn report(io: &mut TcpHost) -> (u8, u16, u8, Vec<[u8; 16]>) {
    let (st, d) = resv(
        io,
        io::RESERVATION_REPORT,
        1023,
        1,
        Xfer::FromController,
        vec![0; 4096],
    );
    assert_eq!(st, Status::SUCCESS);
    let n = u16::from_le_bytes([d[5], d[6]]);
    let holders = (0..n as usize)
        .filter(|i| d[64 + i * 64 + 2] & 1 == 1)
        .map(|i| d[64 + i * 64 + 16..64 + i * 64 + 32].try_into().unwrap())
        .collect();
    (d[4], n, d[9], holders)
}

fn host(d: &Daemon, opts: &HostOptions) -> (TcpHost, TcpHost) {
    let (mut admin, cntlid) = admin(d, SUBNQN, opts);
    request_queues(&mut admin, 1);
    let io = io_queue(d, SUBNQN, cntlid, 1, opts);
    (admin, io)
}

#[test]
fn two_hosts_reserve_and_ptpl_survives_a_restart() {
    let _w = watchdog(
        "two_hosts_reserve_and_ptpl_survives_a_restart",
        Duration::from_secs(60),
    );
    let mut d = Daemon::start(HA_CONFIG);
    let (oa, ob) = (host_opts(), host_opts());
    assert_ne!(oa.hostid, ob.hostid);
    let (_aa, mut a) = host(&d, &oa);
    let (_ab, mut b) = host(&d, &ob);
    assert_eq!(register(&mut a, 0xa, 0), Status::SUCCESS);
    assert_eq!(register(&mut b, 0xb, 0), Status::SUCCESS);
    assert_eq!(acquire(&mut a, 0, 1, 0xa, 0), Status::SUCCESS);
    assert_eq!(acquire(&mut b, 0, 1, 0xb, 0), Status::RESERVATION_CONFLICT);
    let (rtype, n, _, holders) = report(&mut b);
    assert_eq!((rtype, n, holders), (1, 2, vec![oa.hostid]));
    // EDS 0: Host Identifier Inconsistent (128-bit host IDs).
    let (st, _) = resv(
        &mut b,
        io::RESERVATION_REPORT,
        15,
        0,
        Xfer::FromController,
        vec![0; 64],
    );
    assert_eq!(st, Status::HOST_IDENTIFIER_INCONSISTENT);
    // B preempts A; A's registration is gone.
    assert_eq!(acquire(&mut b, 1, 2, 0xb, 0xa), Status::SUCCESS);
    assert_eq!(report(&mut a).1, 1);
    // A registers again with PTPL and takes the reservation after B releases.
    let (st, _) = resv(
        &mut b,
        io::RESERVATION_RELEASE,
        2 << 8,
        0,
        Xfer::ToController,
        0xbu64.to_le_bytes().to_vec(),
    );
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(register(&mut a, 0xa, 0b11), Status::SUCCESS);
    assert_eq!(acquire(&mut a, 0, 3, 0xa, 0), Status::SUCCESS);
    let state = std::fs::read_to_string(d.dir().join("resv.ptpl")).expect("PTPL state file");
    assert!(state.contains("rtype: 3"), "{state}");
    drop((a, b));
    d.stop();
    d.restart();
    let (_aa, mut a) = host(&d, &oa);
    let (rtype, n, ptpls, holders) = report(&mut a);
    assert_eq!((rtype, n, ptpls, holders), (3, 2, 1, vec![oa.hostid]));
    assert!(d.log().contains("restored"), "{}", d.log());
}

/// A corrupt state file stops start-up with the file named (the default policy).
#[test]
fn corrupt_state_file_fails_start_up() {
    let _w = watchdog("corrupt_state_file_fails_start_up", Duration::from_secs(60));
    let mut d = Daemon::start(HA_CONFIG);
    d.stop();
    std::fs::write(
        d.dir().join("resv.ptpl"),
        "format: nvmf-target-ptpl/1\nnamespaces: 7\n",
    )
    .unwrap();
    let out = std::process::Command::new(daemon_binary())
        .arg("--config")
        .arg(d.dir().join("nvmf-target.yaml"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("resv.ptpl") && err.contains("unusable"),
        "{err}"
    );
}
