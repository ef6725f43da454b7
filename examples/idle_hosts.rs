//! Idle hosts for `benches/vs-spdk.sh`: opens many NVMe/TCP controllers on a target, each
//! as its own host (its own Host NQN and Host ID), keeps them alive with Keep Alive and
//! sends no I/O. It measures nothing itself; the script reads the target's CPU time from
//! /proc while these controllers sit idle, or runs spdk_nvme_perf beside them.
//!
//! ```sh
//! cargo run --release --example idle_hosts -- --addr 127.0.0.1:4420 --subnqn NQN \
//!     [--controllers 100] [--io-queues 1] [--kato-ms 5000] [--hold-secs 70] [--ready FILE] \
//!     [--digests]
//! ```
//!
//! `--digests` asks for header and data digests in every ICReq (the initiator refuses an
//! ICResp that does not grant both) and reads 4 KiB (8 blocks of 512 bytes) from
//! namespace 1 on the first controller: the check that a target really negotiates and
//! computes what `spdk_nvme_perf -H -I` asks for.
//!
//! Each controller is what a Linux host leaves behind after `nvme connect` minus the
//! Identify traffic: an admin queue (Fabrics Connect with KATO, CC.EN, CSTS.RDY) and
//! `--io-queues` I/O queues of 128 entries (the Linux default queue size). Keep Alive goes
//! out on every admin queue every KATO/2, as the Linux host does when the controller does
//! not report TBKAS. spdk_nvme_perf cannot do this: with `-P` it opens I/O queues but
//! drives I/O on all of them.
//!
//! Prints `ready: ...` (and creates `--ready FILE`) once every controller is enabled, then
//! holds for `--hold-secs`, sends a last Keep Alive on every controller and prints
//! `done: A of N controllers alive ...`. Exits 1 when a connection or a Keep Alive fails,
//! naming the controller.

use std::time::{Duration, Instant};

use nvmf_initiator::{HostOptions, TcpHost};

struct Opts {
    addr: String,
    subnqn: String,
    controllers: usize,
    io_queues: u16,
    kato_ms: u32,
    hold_secs: f64,
    ready: Option<std::path::PathBuf>,
    digests: bool,
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        addr: String::new(),
        subnqn: String::new(),
        controllers: 100,
        io_queues: 1,
        kato_ms: 5000,
        hold_secs: 70.0,
        ready: None,
        digests: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--digests" {
            o.digests = true;
            continue;
        }
        let v = args.next().ok_or_else(|| format!("{a} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{a} {v}: {e}");
        match a.as_str() {
            "--addr" => o.addr = v,
            "--subnqn" => o.subnqn = v,
            "--controllers" => o.controllers = v.parse().map_err(|e| bad(&e))?,
            "--io-queues" => o.io_queues = v.parse().map_err(|e| bad(&e))?,
            "--kato-ms" => o.kato_ms = v.parse().map_err(|e| bad(&e))?,
            "--hold-secs" => o.hold_secs = v.parse().map_err(|e| bad(&e))?,
            "--ready" => o.ready = Some(v.into()),
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    if o.addr.is_empty() || o.subnqn.is_empty() {
        return Err("--addr and --subnqn are required".into());
    }
    if o.controllers == 0 || o.controllers > 100_000 || o.io_queues > 64 {
        return Err("--controllers must be 1..=100000, --io-queues at most 64".into());
    }
    if o.kato_ms < 1000 || !(o.hold_secs >= 0.0 && o.hold_secs <= 3600.0) {
        return Err("--kato-ms must be >= 1000, --hold-secs in [0, 3600]".into());
    }
    Ok(o)
}

/// Host `i`'s identity: a fixed random-looking prefix and the index, as a version 4 UUID.
fn host_identity(i: usize) -> (String, [u8; 16]) {
    let mut id = [
        0x16, 0xa1, 0xd1, 0xe0, 0x00, 0x00, 0x40, 0x00, 0x80, 0x00, 0, 0, 0, 0, 0, 0,
    ];
    id[10..16].copy_from_slice(&(i as u64).to_be_bytes()[2..]);
    let h: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    );
    (format!("nqn.2014-08.org.nvmexpress:uuid:{uuid}"), id)
}

struct Controller {
    admin: TcpHost,
    _io: Vec<TcpHost>,
}

fn open_controller(o: &Opts, i: usize) -> nvmf_initiator::Result<Controller> {
    let (hostnqn, hostid) = host_identity(i);
    let opts = HostOptions {
        hostnqn,
        hostid,
        header_digest: o.digests,
        data_digest: o.digests,
        ..Default::default()
    };
    let mut admin = TcpHost::connect(o.addr.as_str(), opts.clone())?;
    let cntlid = admin.connect_admin(&o.subnqn, o.kato_ms)?;
    admin.enable_controller()?;
    if o.io_queues > 0 {
        // Number of Queues (FID 07h), 0's based, as a host asks before creating them.
        let n = u32::from(o.io_queues - 1);
        admin.set_features(0x07, 0, n | n << 16, false)?;
    }
    let mut io: Vec<TcpHost> = Vec::with_capacity(usize::from(o.io_queues));
    for qid in 1..=o.io_queues {
        let mut q = TcpHost::connect(o.addr.as_str(), opts.clone())?;
        q.connect_io(&o.subnqn, cntlid, qid, 127)?;
        io.push(q);
    }
    if o.digests && i == 0 {
        // The initiator already refused an ICResp without both digests; one read checks
        // the target's C2HData data digest too (the host's framer verifies it).
        let q = io
            .first_mut()
            .ok_or(nvmf_initiator::Error::InvalidArgument(
                "--digests needs at least one I/O queue",
            ))?;
        let mut buf = vec![0u8; 4096];
        let st = q.read(1, 0, 8, &mut buf)?;
        if !st.is_success() {
            return Err(nvmf_initiator::Error::Unexpected(format!(
                "4 KiB read with digests: {st:?}"
            )));
        }
        println!("digests: header and data digests granted; a 4 KiB read passed their checks");
    }
    Ok(Controller { admin, _io: io })
}

/// One Keep Alive on every controller; exits the process on the first failure.
fn keep_alive_pass(ctrls: &mut [Controller]) -> u64 {
    for (i, c) in ctrls.iter_mut().enumerate() {
        if let Err(e) = c.admin.keep_alive() {
            eprintln!("idle_hosts: controller {i}: Keep Alive: {e}");
            std::process::exit(1);
        }
    }
    ctrls.len() as u64
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("idle_hosts: {e}");
            std::process::exit(2);
        }
    };
    let period = Duration::from_millis(u64::from(o.kato_ms / 2));
    let t0 = Instant::now();
    let mut ctrls = Vec::with_capacity(o.controllers);
    let mut sent = 0u64;
    // Connecting many controllers can take longer than KATO (SPDK takes ~20 ms each), so
    // the ones already up get their Keep Alive while the rest connect.
    let mut next = t0 + period;
    for i in 0..o.controllers {
        match open_controller(&o, i) {
            Ok(c) => ctrls.push(c),
            Err(e) => {
                eprintln!("idle_hosts: controller {i} of {}: {e}", o.controllers);
                std::process::exit(1);
            }
        }
        if Instant::now() >= next {
            sent += keep_alive_pass(&mut ctrls);
            next += period;
        }
    }
    println!(
        "ready: {} controllers ({} connections) in {:.2} s",
        ctrls.len(),
        ctrls.len() * (1 + usize::from(o.io_queues)),
        t0.elapsed().as_secs_f64()
    );
    if let Some(p) = &o.ready {
        if let Err(e) = std::fs::write(p, b"ready\n") {
            eprintln!("idle_hosts: {}: {e}", p.display());
            std::process::exit(1);
        }
    }
    let hold_end = Instant::now() + Duration::from_secs_f64(o.hold_secs);
    while next < hold_end {
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        sent += keep_alive_pass(&mut ctrls);
        next += period;
    }
    std::thread::sleep(hold_end.saturating_duration_since(Instant::now()));
    // A last Keep Alive on every controller proves none was dropped while idle.
    let mut alive = 0usize;
    for (i, c) in ctrls.iter_mut().enumerate() {
        match c.admin.keep_alive() {
            Ok(()) => alive += 1,
            Err(e) => eprintln!("idle_hosts: controller {i}: final Keep Alive: {e}"),
        }
    }
    println!(
        "done: {alive} of {} controllers alive after {:.1} s, {sent} keep-alives",
        ctrls.len(),
        o.hold_secs
    );
    if alive != ctrls.len() {
        std::process::exit(1);
    }
}
