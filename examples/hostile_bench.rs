//! Hostile-peer benchmark (issue 11): starts the release daemon (one IO thread, a RAM
//! namespace, metrics on), measures a well-behaved host's 4 KiB random I/O alone, then
//! again while each attack runs, and prints figures (it asserts nothing: figures on a
//! shared machine are for reading; `tests/hostile.rs` checks the behaviour).
//!
//! ```sh
//! cargo build --release && cargo run --release --example hostile_bench -- [--quick] [--secs S]
//! ```
//!
//! Attacks (full counts; `--quick` divides them by 10): 10,000 TCP connections that never
//! send ICReq; 2,000 that send ICReq and stop; 1,000 controllers whose writes' data never
//! comes (an admin and an I/O queue each, 32 writes of 128 KiB by R2T); 4 peers that never
//! read their responses (128 reads of 128 KiB each); 10,000 Connects on one connection
//! to the discovery subsystem; 1,000 connect/disconnect cycles of a controller with 4 I/O
//! queues. Attackers connect from their own loopback addresses (127.1.x.y), so the
//! per-peer limit is not what stops them. For each: the victim's IOPS during the attack
//! against alone, the daemon's peak RSS, what the daemon did (limit counters from
//! /metrics), and, once the attackers are gone, RSS, controllers and queue pairs against
//! where they started. Last, 1,000 idle connected hosts (admin queue up, Keep Alive every
//! 5 s): the daemon's RSS with them against without.
//!
//! The victim: one controller, one I/O queue, QD 32, 50% writes, 4 KiB, from 127.0.0.1.
//! This process raises its RLIMIT_NOFILE to the hard limit (the daemon inherits it).

#[path = "../tests/common/prom.rs"]
#[allow(
    dead_code,
    reason = "prom::required is the tests' reader; the bench uses gauge()"
)]
mod prom;

use prom::metric;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nvmf_initiator::hostile::{self, Peers};
use nvmf_initiator::{HostOptions, TcpHost};

const NQN: &str = "nqn.2026-11.dev.nvmf-target:hostile";
const BLOCKS: u64 = (64 << 20) / 512;

struct Daemon {
    child: Child,
    addr: SocketAddr,
    metrics: SocketAddr,
    dir: std::path::PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn start_daemon(bin: &str) -> Daemon {
    let (port, mport) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("nvmft-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cfg = dir.join("hostile.yaml");
    std::fs::write(
        &cfg,
        format!(
            "io_threads: 1\n\
             listeners: [{{name: tcp0, transport: tcp, address: 0.0.0.0, port: {port}}}]\n\
             backends: [{{name: ram0, type: ram, size: 64MiB, block_size: 512}}]\n\
             metrics: {{address: 127.0.0.1:{mport}}}\n\
             subsystems:\n  - nqn: {NQN}\n    allow_any_host: true\n    namespaces: [{{nsid: 1, backend: ram0}}]\n"
        ),
    )
    .expect("config");
    let child = Command::new(bin)
        .arg("--config")
        .arg(&cfg)
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("daemon.log")).expect("log"),
        ))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpHost::connect(addr, HostOptions::default()).is_err() {
        assert!(Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Daemon {
        child,
        addr,
        metrics: format!("127.0.0.1:{mport}").parse().expect("addr"),
        dir,
    }
}

/// `/metrics` as text (empty when the scrape fails).
fn scrape(d: &Daemon) -> String {
    let Ok(mut s) = TcpStream::connect(d.metrics) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Gauge `name` in a scrape; NaN (printed as such, never "settled") when the scrape failed
/// or lacks it, rather than a 0 that would read as "nothing left".
fn gauge(text: &str, name: &str) -> f64 {
    metric(text, name, "").unwrap_or(f64::NAN)
}

/// Limit hits since `before`, as "label +n" pairs.
fn limit_delta(before: &str, after: &str) -> String {
    let mut parts = Vec::new();
    for l in after
        .lines()
        .filter(|l| l.starts_with("nvmft_limit_hits_total{"))
    {
        let Some((series, v)) = l.rsplit_once(' ') else {
            continue;
        };
        let now: f64 = v.parse().unwrap_or(0.0);
        let was = before
            .lines()
            .find(|b| b.starts_with(series))
            .and_then(|b| b.rsplit_once(' ')?.1.parse().ok())
            .unwrap_or(0.0);
        if now > was {
            let label = series
                .split("limit=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or(series);
            parts.push(format!("{label} +{}", now - was));
        }
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

struct Victim {
    _admin: TcpHost,
    io: TcpHost,
}

fn victim(d: &Daemon) -> Victim {
    let opts = HostOptions {
        io_max_incapsule: 8192,
        timeout: Duration::from_secs(20),
        ..HostOptions::default()
    };
    let (admin, mut ios) = hostile::controller(d.addr, NQN, 1, 127, opts).expect("victim");
    Victim {
        _admin: admin,
        io: ios.pop().expect("I/O queue"),
    }
}

/// IOPS of the victim over `secs`, sampling the daemon's RSS meanwhile (peak returned).
fn measure(v: &mut Victim, pid: u32, secs: f64) -> (f64, u64) {
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (p, s) = (peak.clone(), stop.clone());
    let sampler = std::thread::spawn(move || {
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            let r = hostile::rss_bytes(pid).unwrap_or(0);
            p.fetch_max(r, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let t0 = Instant::now();
    let done = hostile::random_io(&mut v.io, BLOCKS, 32, 50, secs).unwrap_or_else(|e| {
        eprintln!("victim I/O failed: {e}");
        0
    });
    let iops = done as f64 / t0.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = sampler.join();
    (iops, peak.load(std::sync::atomic::Ordering::Relaxed))
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

struct Row {
    name: String,
    iops: f64,
    peak: u64,
    after_rss: u64,
    ctrl: f64,
    qps: f64,
    note: String,
}

fn main() {
    let mut quick = false;
    let mut secs = 4.0;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--secs" => secs = args.next().and_then(|v| v.parse().ok()).unwrap_or(secs),
            other => panic!("unknown argument {other} (use --quick, --secs S)"),
        }
    }
    let k = if quick { 10 } else { 1 };
    let nofile = hostile::raise_nofile();
    let bin =
        std::env::var("NVMF_TARGET_BIN").unwrap_or_else(|_| "target/release/nvmf-target".into());
    let d = start_daemon(&bin);
    let pid = d.child.id();
    println!(
        "nvmf-target hostile bench: 1 IO thread, RAM namespace; victim 4 KiB randrw 50% QD32; \
         {secs} s per measurement; RLIMIT_NOFILE {nofile}{}",
        if quick {
            "; --quick: attack counts / 10"
        } else {
            ""
        }
    );
    let mut v = victim(&d);
    // Fill the range so reads hit written memory, then the solo figure.
    let _ = hostile::random_io(&mut v.io, BLOCKS, 32, 100, 1.0);
    let (solo, _) = measure(&mut v, pid, secs);
    let base = scrape(&d);
    let base_rss = hostile::rss_bytes(pid).unwrap_or(0);
    let base_ctrl = gauge(&base, "nvmft_controllers");
    let base_qps = gauge(&base, "nvmft_io_thread_queue_pairs");
    println!(
        "alone: {solo:.0} IOPS; daemon RSS {:.1} MiB, {base_ctrl} controllers, {base_qps} queue pairs",
        mib(base_rss)
    );
    let mut rows: Vec<Row> = Vec::new();
    let mut peers = Peers::many();

    // Held attacks: set up, measured, released.
    type Setup<'a> = Box<dyn FnMut(&Daemon, &mut Peers) -> (Box<dyn std::any::Any>, String) + 'a>;
    let held: Vec<(String, Setup)> = vec![
        (
            format!("{} connections, no ICReq", 10_000 / k),
            Box::new(|d: &Daemon, p: &mut Peers| {
                let (socks, failed) = hostile::silent(d.addr, 10_000 / k, p);
                std::thread::sleep(Duration::from_millis(500));
                let open = socks.iter().filter(|s| hostile::is_open(s)).count();
                (
                    Box::new(socks) as Box<dyn std::any::Any>,
                    format!("{open} held open by the daemon, {failed} could not connect"),
                )
            }),
        ),
        (
            format!("{} connections, ICReq then nothing", 2_000 / k),
            Box::new(|d: &Daemon, p: &mut Peers| {
                let (hosts, failed) = hostile::icreq_then_nothing(d.addr, 2_000 / k, p);
                (
                    Box::new(hosts) as Box<dyn std::any::Any>,
                    format!("{failed} got no ICResp"),
                )
            }),
        ),
        (
            format!("{} controllers, write data never comes", 1_000 / k),
            Box::new(|d: &Daemon, p: &mut Peers| {
                let (c, failed) =
                    hostile::data_never_comes(d.addr, NQN, 1_000 / k, 32, 128 << 10, p);
                (
                    Box::new(c) as Box<dyn std::any::Any>,
                    format!("{failed} could not connect"),
                )
            }),
        ),
        (
            "4 peers that never read".into(),
            Box::new(|d: &Daemon, p: &mut Peers| {
                let c: Vec<_> = (0..4)
                    .filter_map(|_| hostile::never_reads(d.addr, NQN, 127, 128 << 10, p).ok())
                    .collect();
                let n = c.len();
                (Box::new(c) as Box<dyn std::any::Any>, format!("{n} set up"))
            }),
        ),
    ];
    for (name, mut setup) in held {
        let before = scrape(&d);
        let t = Instant::now();
        let (guard, note) = setup(&d, &mut peers);
        let setup_s = t.elapsed().as_secs_f64();
        let (iops, peak) = measure(&mut v, pid, secs);
        let during = scrape(&d);
        drop(guard);
        let (after_rss, ctrl, qps) = settle(&d, pid, base_ctrl, base_qps);
        rows.push(Row {
            name,
            iops,
            peak,
            after_rss,
            ctrl,
            qps,
            note: format!(
                "{note}; set up in {setup_s:.1} s; limits: {}",
                limit_delta(&before, &during)
            ),
        });
    }

    // Running attacks: measured while they run.
    type Attack = Box<dyn FnOnce(SocketAddr, Peers) -> String + Send>;
    let running: Vec<(String, Attack)> = vec![
        (
            format!("{} Connects on one discovery connection", 10_000 / k),
            Box::new(
                move |a, mut p| match hostile::connect_flood(a, 10_000 / k, &mut p) {
                    Ok(r) => format!(
                        "{} accepted, {} refused, {} unanswered",
                        r.accepted, r.refused, r.lost
                    ),
                    Err(e) => format!("failed: {e}"),
                },
            ),
        ),
        (
            format!("{} connect/disconnect cycles, 4 I/O queues", 1_000 / k),
            Box::new(move |a, mut p| {
                let failed = hostile::churn(a, NQN, 1_000 / k, 4, &mut p);
                format!("{failed} cycles failed")
            }),
        ),
    ];
    for (name, attack) in running {
        let before = scrape(&d);
        let addr = d.addr;
        let p = peers.clone();
        // Different addresses for the next attack.
        for _ in 0..4096 {
            peers.next_addr();
        }
        let h = std::thread::spawn(move || {
            let t = Instant::now();
            let note = attack(addr, p);
            (note, t.elapsed().as_secs_f64())
        });
        let (iops, peak) = measure(&mut v, pid, secs);
        let (note, took) = h.join().unwrap_or_else(|_| ("panicked".into(), 0.0));
        let during = scrape(&d);
        let (after_rss, ctrl, qps) = settle(&d, pid, base_ctrl, base_qps);
        rows.push(Row {
            name,
            iops,
            peak,
            after_rss,
            ctrl,
            qps,
            note: format!(
                "{note}; attack took {took:.1} s; limits: {}",
                limit_delta(&before, &during)
            ),
        });
    }

    println!();
    println!(
        "{:<44} {:>9} {:>7} {:>10} {:>10} {:>6} {:>5}  what happened",
        "attack", "IOPS", "vs solo", "RSS peak", "RSS after", "ctrls", "QPs"
    );
    for r in &rows {
        println!(
            "{:<44} {:>9.0} {:>6.0}% {:>7.1} MiB {:>6.1} MiB {:>6} {:>5}  {}",
            r.name,
            r.iops,
            r.iops / solo.max(1.0) * 100.0,
            mib(r.peak),
            mib(r.after_rss),
            r.ctrl,
            r.qps,
            r.note
        );
    }

    // Idle hosts.
    let n = 1_000 / k;
    let rss0 = hostile::rss_bytes(pid).unwrap_or(0);
    let t = Instant::now();
    let (mut hosts, failed) = hostile::idle_hosts(d.addr, NQN, n, 15_000, &mut peers);
    let setup = t.elapsed().as_secs_f64();
    // Keep Alive twice (KATO 15 s), then the figure.
    let mut ka_failed = 0;
    for _ in 0..2 {
        std::thread::sleep(Duration::from_secs(2));
        ka_failed += hostile::keep_alive_all(&mut hosts);
    }
    let rss1 = hostile::rss_bytes(pid).unwrap_or(0);
    let m = scrape(&d);
    println!();
    println!(
        "{} idle hosts (admin queue, KATO 15 s, Keep Alive running): daemon RSS {:.1} MiB -> {:.1} MiB \
         (+{:.1} MiB, {:.1} KiB per host; bar: < 64 MiB in total); {} connected in {setup:.1} s, \
         {failed} failed, {ka_failed} keep-alives failed; controllers now {}",
        n,
        mib(rss0),
        mib(rss1),
        mib(rss1.saturating_sub(rss0)),
        rss1.saturating_sub(rss0) as f64 / 1024.0 / hosts.len().max(1) as f64,
        hosts.len(),
        gauge(&m, "nvmft_controllers")
    );
    drop(hosts);
    let (after_rss, ctrl, qps) = settle(&d, pid, base_ctrl, base_qps);
    println!(
        "after they leave: RSS {:.1} MiB, {ctrl} controllers, {qps} queue pairs",
        mib(after_rss)
    );
    let (iops, _) = measure(&mut v, pid, secs);
    println!(
        "victim alone again: {iops:.0} IOPS ({:.0}% of the first solo run)",
        iops / solo.max(1.0) * 100.0
    );
}

/// Waits (up to 60 s: the daemon's deadlines are 10-30 s) until controllers and queue
/// pairs are back where they started; returns RSS, controllers and queue pairs then.
fn settle(d: &Daemon, pid: u32, ctrl0: f64, qps0: f64) -> (u64, f64, f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = scrape(d);
        let (c, q) = (
            gauge(&m, "nvmft_controllers"),
            gauge(&m, "nvmft_io_thread_queue_pairs"),
        );
        if (c <= ctrl0 && q <= qps0) || Instant::now() >= deadline {
            return (hostile::rss_bytes(pid).unwrap_or(0), c, q);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}
