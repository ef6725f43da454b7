//! Hostile and broken peers, and one well-behaved host, for the hostile-peer suite
//! (`tests/hostile.rs`) and its benchmark (`examples/hostile_bench.rs`). Each attack opens
//! connections that misbehave in one way and hands them back, for the caller to hold as
//! long as it likes (dropping them closes them).
//!
//! Attackers can come from many loopback addresses ([`Peers`]: 127.1.0.1, 127.1.0.2...;
//! Linux routes all of 127.0.0.0/8 to `lo`), so that a target's per-peer limit is not
//! what stops them and its total limits are what the test sees.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use nvmf::spec::fabrics::{ConnectCommand, ConnectData, CNTLID_DYNAMIC};
use nvmf::target::DISCOVERY_NQN;
use zerocopy::IntoBytes;

use crate::{HostOptions, Request, Result, TcpHost};

/// Source addresses for attackers: 127.1.0.1, 127.1.0.2, ... (`None`: all from the
/// kernel's choice, 127.0.0.1 on loopback).
#[derive(Clone, Debug)]
pub struct Peers {
    next: Option<u32>,
}

impl Peers {
    /// Every connection from its own loopback address.
    pub fn many() -> Peers {
        Peers { next: Some(1) }
    }
    /// Every connection from the same address.
    pub fn one() -> Peers {
        Peers { next: None }
    }
    /// The next source address.
    pub fn next_addr(&mut self) -> Option<IpAddr> {
        let n = self.next.as_mut()?;
        // 127.1.0.0/16 without .0 and .255 host bytes.
        while *n & 0xff == 0 || *n & 0xff == 0xff {
            *n += 1;
        }
        let ip = Ipv4Addr::from(0x7f01_0000u32 | (*n & 0xffff));
        *n += 1;
        Some(IpAddr::V4(ip))
    }
    fn opts(&mut self, base: &HostOptions) -> HostOptions {
        HostOptions {
            source: self.next_addr(),
            ..base.clone()
        }
    }
}

/// Whether the target still holds `s` open (it has not closed or reset it). Reads
/// nothing that would be missed: a peek, without blocking.
pub fn is_open(s: &TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    let open = match s.peek(&mut b) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
    };
    let _ = s.set_nonblocking(false);
    open
}

/// Options for attackers: short socket timeouts, a fresh host identity each.
pub fn attacker_options() -> HostOptions {
    HostOptions {
        timeout: Duration::from_secs(5),
        ..HostOptions::default()
    }
}

/// `n` TCP connections that never send anything (not even ICReq). Returns the ones
/// that connected and how many could not.
pub fn silent(to: SocketAddr, n: usize, peers: &mut Peers) -> (Vec<TcpStream>, usize) {
    let mut held = Vec::with_capacity(n);
    let mut failed = 0;
    for _ in 0..n {
        let r = match peers.next_addr() {
            Some(from) => crate::connect_from(from, to),
            None => TcpStream::connect(to),
        };
        match r {
            Ok(s) => held.push(s),
            Err(_) => failed += 1,
        }
    }
    (held, failed)
}

/// `n` connections that send ICReq, take the ICResp, and then send nothing.
pub fn icreq_then_nothing(to: SocketAddr, n: usize, peers: &mut Peers) -> (Vec<TcpHost>, usize) {
    let base = attacker_options();
    let mut held = Vec::with_capacity(n);
    let mut failed = 0;
    for _ in 0..n {
        match TcpHost::connect(to, peers.opts(&base)) {
            Ok(h) => held.push(h),
            Err(_) => failed += 1,
        }
    }
    (held, failed)
}

/// A controller (admin queue with KATO 0, enabled) and `io_queues` I/O queues of
/// `sqsize`, as one host.
pub fn controller(
    to: SocketAddr,
    subnqn: &str,
    io_queues: u16,
    sqsize: u16,
    opts: HostOptions,
) -> Result<(TcpHost, Vec<TcpHost>)> {
    let mut admin = TcpHost::connect(to, opts.clone())?;
    let cntlid = admin.connect_admin(subnqn, 0)?;
    admin.enable_controller()?;
    if io_queues > 0 {
        let n = (io_queues - 1) as u32;
        admin.set_features(0x07, 0, n | n << 16, false)?;
    }
    let mut ios = Vec::with_capacity(io_queues as usize);
    for qid in 1..=io_queues {
        let mut io = TcpHost::connect(to, opts.clone())?;
        io.connect_io(subnqn, cntlid, qid, sqsize)?;
        ios.push(io);
    }
    Ok((admin, ios))
}

/// `n` controllers, each with one I/O queue on which `qd` writes of `len` bytes are sent
/// by R2T and whose data never comes (the R2Ts are never answered). The writes stay
/// within the first 64 MiB of namespace 1 (512-byte blocks), so that none is refused
/// (LBA out of range) instead of waiting for its data.
pub fn data_never_comes(
    to: SocketAddr,
    subnqn: &str,
    n: usize,
    qd: usize,
    len: usize,
    peers: &mut Peers,
) -> (Vec<(TcpHost, TcpHost)>, usize) {
    let base = HostOptions {
        io_max_incapsule: 0,
        ..attacker_options()
    };
    let mut held = Vec::with_capacity(n);
    let mut failed = 0;
    for i in 0..n {
        let r = controller(to, subnqn, 1, qd as u16, peers.opts(&base)).and_then(|(a, mut ios)| {
            let mut io = ios.pop().expect("one I/O queue");
            for k in 0..qd {
                let nb = (len / 512).max(1) as u64;
                let lba = ((i * qd + k) as u64 % ((64 << 20) / 512 / nb)) * nb;
                io.submit(Request::write(
                    1,
                    lba,
                    (len / 512) as u32,
                    vec![0x5a; len],
                    false,
                ))?;
            }
            Ok((a, io))
        });
        match r {
            Ok(c) => held.push(c),
            Err(_) => failed += 1,
        }
    }
    (held, failed)
}

/// `n` controllers, each with one I/O queue on which a 4 KiB write is sent with its data
/// in the capsule, but only the capsule's first 100 bytes: the rest of the PDU never
/// comes. The target needs IOCCSZ of at least 4 KiB (its default is 8 KiB).
pub fn pdu_never_finished(
    to: SocketAddr,
    subnqn: &str,
    n: usize,
    peers: &mut Peers,
) -> (Vec<(TcpHost, TcpHost)>, usize) {
    let mut held = Vec::with_capacity(n);
    let mut failed = 0;
    for _ in 0..n {
        let r = controller(to, subnqn, 1, 31, peers.opts(&attacker_options())).and_then(
            |(a, mut ios)| {
                let mut io = ios.pop().expect("one I/O queue");
                use nvmf::spec::{opcodes::io::WRITE, sgl, SglDescriptor};
                // 8 blocks of 512 bytes, CID 1.
                let mut sqe = crate::rw_sqe(WRITE, 1, 0, 8, false);
                sqe.set_opcode_cid(WRITE, 1);
                sqe.dptr =
                    SglDescriptor::unkeyed(sgl::TYPE_DATA_BLOCK, sgl::SUBTYPE_OFFSET, 0, 4096);
                let mut pdu = Vec::new();
                nvmf::tcp::encode_capsule_cmd(&mut pdu, &sqe, &[0x5a; 4096], io.digests(), 0);
                io.send_raw(&pdu[..100])?;
                Ok((a, io))
            },
        );
        match r {
            Ok(c) => held.push(c),
            Err(_) => failed += 1,
        }
    }
    (held, failed)
}

/// A controller whose I/O queue asks for `qd` reads of `len` bytes and never reads the
/// answers.
pub fn never_reads(
    to: SocketAddr,
    subnqn: &str,
    qd: usize,
    len: usize,
    peers: &mut Peers,
) -> Result<(TcpHost, TcpHost)> {
    let (a, mut ios) = controller(to, subnqn, 1, qd as u16, peers.opts(&attacker_options()))?;
    let mut io = ios.pop().expect("one I/O queue");
    for k in 0..qd {
        let lba = (k * len / 512) as u64;
        io.submit(Request::read(1, lba, (len / 512) as u32, vec![0; len]))?;
    }
    Ok((a, io))
}

/// What [`connect_flood`] saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FloodResult {
    /// Connects answered with success.
    pub accepted: usize,
    /// Connects answered with an error status.
    pub refused: usize,
    /// Connects never answered (the connection went away).
    pub lost: usize,
}

/// `n` Fabrics Connects to the discovery subsystem on one connection, one after the other.
pub fn connect_flood(to: SocketAddr, n: usize, peers: &mut Peers) -> Result<FloodResult> {
    let opts = peers.opts(&attacker_options());
    let mut h = TcpHost::connect(to, opts.clone())?;
    let mut r = FloodResult::default();
    let data = ConnectData::new(opts.hostid, CNTLID_DYNAMIC, DISCOVERY_NQN, &opts.hostnqn);
    let cmd = ConnectCommand {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    };
    for _ in 0..n {
        match h.submit_admin_raw(cmd.to_sqe(0), data.as_bytes(), 0) {
            Ok((cqe, _)) if cqe.status().is_success() => r.accepted += 1,
            Ok(_) => r.refused += 1,
            Err(_) => {
                r.lost = n - r.accepted - r.refused;
                break;
            }
        }
    }
    Ok(r)
}

/// `cycles` times: a controller with `io_queues` I/O queues connects, then every
/// connection closes (as a host that goes away). Returns the cycles that failed.
pub fn churn(
    to: SocketAddr,
    subnqn: &str,
    cycles: usize,
    io_queues: u16,
    peers: &mut Peers,
) -> usize {
    let mut failed = 0;
    for _ in 0..cycles {
        match controller(to, subnqn, io_queues, 127, peers.opts(&attacker_options())) {
            Ok((a, ios)) => {
                for io in &ios {
                    let _ = io.shutdown();
                }
                let _ = a.shutdown();
            }
            Err(_) => failed += 1,
        }
    }
    failed
}

/// `n` idle hosts: an admin queue each (KATO `kato_ms`, enabled), no I/O queue. Keep them
/// alive with [`keep_alive_all`].
pub fn idle_hosts(
    to: SocketAddr,
    subnqn: &str,
    n: usize,
    kato_ms: u32,
    peers: &mut Peers,
) -> (Vec<TcpHost>, usize) {
    let mut held = Vec::with_capacity(n);
    let mut failed = 0;
    for _ in 0..n {
        let r = (|| {
            let mut a = TcpHost::connect(to, peers.opts(&attacker_options()))?;
            a.connect_admin(subnqn, kato_ms)?;
            a.enable_controller()?;
            Ok::<_, crate::Error>(a)
        })();
        match r {
            Ok(a) => held.push(a),
            Err(_) => failed += 1,
        }
    }
    (held, failed)
}

/// One Keep Alive on every host; returns how many failed.
pub fn keep_alive_all(hosts: &mut [TcpHost]) -> usize {
    let mut failed = 0;
    for h in hosts.iter_mut() {
        failed += h.keep_alive().is_err() as usize;
    }
    failed
}

/// A well-behaved host: 4 KiB random I/O (`write_pct` percent writes) at queue depth
/// `qd` over the first `blocks` 512-byte blocks of namespace 1, for `secs`. Returns the
/// commands completed; an error status or a lost connection is an error.
pub fn random_io(
    io: &mut TcpHost,
    blocks: u64,
    qd: usize,
    write_pct: u64,
    secs: f64,
) -> std::result::Result<u64, String> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ Instant::now().elapsed().as_nanos() as u64;
    let mut rng = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut issue = |io: &mut TcpHost, mut buf: Vec<u8>| {
        let lba = (rng() % (blocks / 8)) * 8;
        buf.resize(4096, 0xa5);
        let req = if rng() % 100 < write_pct {
            Request::write(1, lba, 8, buf, false)
        } else {
            Request::read(1, lba, 8, buf)
        };
        io.submit(req).map(|_| ()).map_err(|e| e.to_string())
    };
    for _ in 0..qd {
        issue(io, vec![0; 4096])?;
    }
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut done = 0u64;
    while Instant::now() < end {
        let c = io.poll_completion().map_err(|e| e.to_string())?;
        if !c.cqe.status().is_success() {
            return Err(format!("command failed: {}", c.cqe.status()));
        }
        done += 1;
        issue(io, c.buf)?;
    }
    for _ in 0..qd {
        let c = io.poll_completion().map_err(|e| e.to_string())?;
        if !c.cqe.status().is_success() {
            return Err(format!("command failed: {}", c.cqe.status()));
        }
    }
    Ok(done)
}

/// Reads a process's resident set (VmRSS) in bytes from /proc.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Raise this process's open-file soft limit to its hard limit (the attacks open
/// thousands of sockets); returns the new soft limit.
pub fn raise_nofile() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((_, hard)) => {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
            getrlimit(Resource::RLIMIT_NOFILE).map_or(0, |(s, _)| s)
        }
        Err(_) => 0,
    }
}

/// Reads everything a closed connection still has (used to drain attackers' sockets
/// before dropping them, so the kernel sends FIN rather than RST).
pub fn drain(mut s: &TcpStream) {
    let _ = s.set_nonblocking(true);
    let mut b = [0u8; 4096];
    while let Ok(n) = s.read(&mut b) {
        if n == 0 {
            break;
        }
    }
}
