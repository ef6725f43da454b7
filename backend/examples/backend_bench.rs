//! Micro benchmark: 4 KiB random reads and writes at queue depth 32 on one thread, for
//! the RAM backend and the file backend (O_DIRECT and buffered). Prints IOPS; asserts
//! nothing.
//!
//! `cargo run --release -p backend --example backend_bench -- [seconds] [dir]`
//! (default 2 s per case, the file in a temp dir under `dir` or the system temp dir;
//! `BENCH_FILTER=ram` runs only the cases whose name contains the string).

// `unsafe` allowed here: one clock_gettime(CLOCK_THREAD_CPUTIME_ID) call (nix's safe
// wrapper needs a feature the workspace does not enable).
#![allow(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::{Backend, FileBackend, FileOptions, IoBuf, IoStatus, Op, RamBackend, Request};

const BS: u32 = 4096;
const QD: usize = 32;
const SIZE: u64 = 256 << 20;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Writes every block once so reads hit real data.
fn prefill(be: &Arc<dyn Backend>) {
    let mut q = be.clone().create_queue(QD as u32).expect("queue");
    let chunk = 256u32; // 1 MiB
    let mut lba = 0;
    let mut out = Vec::new();
    while lba < be.num_blocks() {
        let n = chunk.min((be.num_blocks() - lba) as u32);
        let buf = IoBuf::from_slice(&vec![0x5a; (n * BS) as usize]);
        q.submit(Request {
            tag: 0,
            op: Op::Write { fua: false },
            lba,
            nblocks: n,
            buf: Some(buf),
        })
        .expect("submit");
        out.clear();
        while q.poll(&mut out) == 0 {}
        lba += u64::from(n);
    }
    be.flush_sync().expect("flush");
}

/// CPU time of the calling thread (user + system), in seconds.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live timespec for the kernel to fill in.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Returns (IOPS over wall time, IOPS per second of this thread's CPU time). The second
/// is the per-core figure on a shared machine; it leaves out kernel worker threads
/// (io-wq), so for buffered file I/O it flatters.
fn run(be: &Arc<dyn Backend>, op: Op, secs: f64) -> (f64, f64) {
    let mut q = be.clone().create_queue(QD as u32).expect("queue");
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let blocks = be.num_blocks();
    let submit = |q: &mut dyn backend::BackendQueue, buf: IoBuf, rng: &mut Rng| {
        let lba = rng.next() % blocks;
        q.submit(Request {
            tag: 0,
            op,
            lba,
            nblocks: 1,
            buf: Some(buf),
        })
        .expect("submit");
    };
    for _ in 0..QD {
        submit(&mut *q, IoBuf::new(BS as usize), &mut rng);
    }
    let mut out = Vec::with_capacity(QD);
    let mut done = 0u64;
    let start = Instant::now();
    let cpu0 = thread_cpu();
    let limit = Duration::from_secs_f64(secs);
    loop {
        out.clear();
        q.poll(&mut out);
        for c in out.drain(..) {
            assert_eq!(c.status, IoStatus::Ok);
            done += 1;
            submit(&mut *q, c.buf.expect("buffer"), &mut rng);
        }
        if done & 0x3ff == 0 && start.elapsed() >= limit {
            break;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = thread_cpu() - cpu0;
    // Drain before dropping the queue so the numbers include only finished I/O.
    while q.in_flight() > 0 {
        out.clear();
        q.poll(&mut out);
    }
    (done as f64 / elapsed, done as f64 / cpu)
}

fn report(name: &str, be: Arc<dyn Backend>, secs: f64) {
    // BENCH_FILTER=ram (or "O_DIRECT", ...) runs only the matching cases.
    if let Ok(f) = std::env::var("BENCH_FILTER") {
        if !name.contains(f.as_str()) {
            return;
        }
    }
    prefill(&be);
    for (label, op) in [
        ("randread ", Op::Read),
        ("randwrite", Op::Write { fua: false }),
    ] {
        let (iops, per_cpu) = run(&be, op, secs);
        println!(
            "{name:<16} {label} 4KiB QD{QD}: {:>9.0} IOPS ({:>5.0} MiB/s), {:>9.0} IOPS per CPU-second",
            iops,
            iops * 4096.0 / (1 << 20) as f64,
            per_cpu
        );
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let dir = match args.next() {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir(),
    }
    .expect("temp dir");

    report("ram", RamBackend::new(SIZE, BS).expect("ram"), secs);
    for direct in [true, false] {
        let path = dir
            .path()
            .join(if direct { "direct.img" } else { "buffered.img" });
        let opts = FileOptions {
            create_size: Some(SIZE),
            block_size: Some(BS),
            direct: Some(direct),
        };
        match FileBackend::open(&path, opts) {
            Ok(be) => report(
                if direct {
                    "file (O_DIRECT)"
                } else {
                    "file (buffered)"
                },
                be,
                secs,
            ),
            Err(e) => println!("file direct={direct}: not available: {e}"),
        }
    }
}
