//! Loopback NVMe/TCP benchmark: starts the release daemon with one IO thread and a RAM
//! namespace, drives it with the `nvmf-initiator` host, and prints figures (it asserts
//! nothing: figures on a shared machine are for reading, not for failing builds).
//!
//! ```sh
//! cargo build --release && cargo run --release --example bench -- [seconds]
//! ```
//!
//! For each case it prints IOPS, mean latency, the daemon's CPU use over the run (from
//! /proc/<pid>/stat) and IOPS per daemon CPU-second: with one IO thread that last figure is
//! the per-core rate the target could serve if the load generator (which shares this
//! machine) kept up. Cases run side by side in one run: digests off and on, QD1 and QD32.

// `unsafe` allowed here: one sysconf(_SC_CLK_TCK) call to turn /proc CPU ticks into
// seconds.
#![allow(unsafe_code)]

use std::io::Write as _;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nvmf_initiator::{HostOptions, Request, TcpHost};

const NQN: &str = "nqn.2026-11.dev.nvmf-target:bench";
const BLOCKS: u64 = (256 << 20) / 512;

struct Daemon {
    child: Child,
    port: u16,
    _dir: std::path::PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_daemon(bin: &str) -> Daemon {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("nvmft-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("bench.yaml");
    let mut f = std::fs::File::create(&cfg).unwrap();
    write!(
        f,
        "io_threads: 1\nlisteners: [{{name: tcp0, transport: tcp, address: 127.0.0.1, port: {port}}}]\n\
         backends: [{{name: ram0, type: ram, size: 1GiB, block_size: 512}}]\n\
         subsystems:\n  - nqn: {NQN}\n    allow_any_host: true\n    namespaces: [{{nsid: 1, backend: ram0}}]\n"
    )
    .unwrap();
    let child = Command::new(bin)
        .arg("--config")
        .arg(&cfg)
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "daemon did not start listening");
        std::thread::sleep(Duration::from_millis(20));
    }
    Daemon {
        child,
        port,
        _dir: dir,
    }
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

struct Xorshift(u64);
impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn connect(d: &Daemon, digests: bool) -> TcpHost {
    // Like the Linux host: writes up to IOCCSZ go in-capsule, not by R2T.
    let opts = HostOptions {
        header_digest: digests,
        data_digest: digests,
        io_max_incapsule: 8192,
        ..Default::default()
    };
    let mut admin = TcpHost::connect(("127.0.0.1", d.port), opts.clone()).unwrap();
    let cntlid = admin.connect_admin(NQN, 30_000).unwrap();
    admin.enable_controller().unwrap();
    admin.set_features(7, 0, 0x0000_0000, false).unwrap();
    let mut io = TcpHost::connect(("127.0.0.1", d.port), opts).unwrap();
    io.connect_io(NQN, cntlid, 1, 127).unwrap();
    // The admin connection must stay open for the controller to live; leak it for the
    // duration of the case.
    std::mem::forget(admin);
    io
}

fn run_case(d: &Daemon, name: &str, digests: bool, qd: usize, write: bool, secs: f64) {
    let mut io = connect(d, digests);
    let mut rng = Xorshift(0x9e37_79b9_7f4a_7c15);
    let mut bufs: Vec<Vec<u8>> = (0..qd).map(|_| vec![0xa5u8; 4096]).collect();
    let issue = |io: &mut TcpHost, buf: Vec<u8>, rng: &mut Xorshift| {
        let lba = (rng.next() % (BLOCKS / 8)) * 8;
        let req = if write {
            Request::write(1, lba, 8, buf, false)
        } else {
            Request::read(1, lba, 8, buf)
        };
        io.submit(req).unwrap();
    };
    let pid = d.child.id();
    let cpu0 = cpu_seconds(pid);
    let t0 = Instant::now();
    let mut started = vec![t0; 65536];
    for _ in 0..qd {
        let b = bufs.pop().unwrap();
        issue(&mut io, b, &mut rng);
    }
    let mut done = 0u64;
    let mut lat_sum = Duration::ZERO;
    let end = t0 + Duration::from_secs_f64(secs);
    let mut now = t0;
    while now < end {
        let c = io.poll_completion().unwrap();
        assert!(c.cqe.status().is_success(), "{name}: {:?}", c.cqe.status());
        now = Instant::now();
        lat_sum += now - started[c.cid as usize];
        done += 1;
        issue(&mut io, c.buf, &mut rng);
        // The CID just freed is the one reused next (LIFO), so stamp it.
        started[c.cid as usize] = now;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu0;
    let iops = done as f64 / elapsed;
    println!(
        "{name:<34} {:>9.0} IOPS  {:>7.1} us mean  daemon CPU {:>5.1}%  {:>9.0} IOPS per daemon CPU-second",
        iops,
        lat_sum.as_secs_f64() * 1e6 / done.max(1) as f64,
        cpu / elapsed * 100.0,
        done as f64 / cpu.max(1e-9),
    );
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let bin =
        std::env::var("NVMF_TARGET_BIN").unwrap_or_else(|_| "target/release/nvmf-target".into());
    let d = start_daemon(&bin);
    println!("nvmf-target bench: 1 IO thread, RAM namespace, 4 KiB random I/O over 256 MiB, {secs} s per case");
    // Fill the range first so reads hit written memory.
    run_case(&d, "fill: randwrite QD32", false, 32, true, secs.min(2.0));
    for digests in [false, true] {
        let tag = if digests {
            "digests on "
        } else {
            "digests off"
        };
        run_case(
            &d,
            &format!("randread  QD1  {tag}"),
            digests,
            1,
            false,
            secs,
        );
        run_case(
            &d,
            &format!("randread  QD32 {tag}"),
            digests,
            32,
            false,
            secs,
        );
        run_case(
            &d,
            &format!("randwrite QD32 {tag}"),
            digests,
            32,
            true,
            secs,
        );
    }
}
