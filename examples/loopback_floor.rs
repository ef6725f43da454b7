//! The loopback floor: raw TCP request/response over 127.0.0.1 between two pinned cores,
//! with the byte counts of NVMe/TCP commands but no NVMe at all. It answers "how fast can
//! any target on this machine be", so a target's QD1 latency can be read against what the
//! kernel's loopback path allows (`benches/vs-spdk.sh` prints it beside the QD1 row).
//!
//! ```sh
//! cargo run --release --example loopback_floor -- [--qd 1] [--req 72] [--resp 4120] \
//!     [--secs 5] [--server-cpu 0] [--client-cpu 1] [--blocking]
//! ```
//!
//! The default sizes are a 4 KiB read as a Linux or SPDK host sends it without digests: a
//! 72-byte CapsuleCmd PDU (8-byte common header + 64-byte SQE) answered by one C2HData PDU
//! with the SUCCESS flag (24-byte header + 4096 bytes of data, no CapsuleResp). A 4 KiB
//! in-capsule write is `--req 4168 --resp 24`.
//!
//! The server thread (on `--server-cpu`) answers every complete request with one response,
//! in order, and batches: all responses for the requests of one read go out in one write.
//! The client thread (on `--client-cpu`) keeps `--qd` requests outstanding, timestamps each
//! and sends as many new requests as responses came back, in one write. Both busy-poll
//! non-blocking sockets (as spdk_nvme_perf and a polling target do) unless `--blocking`,
//! which sleeps in `read` like an interrupt-driven peer. TCP_NODELAY on both ends.
//!
//! It prints one line, e.g.
//! `floor qd=1 req=72 resp=4120 mode=poll: 61234 ops/s, 239.2 MiB/s resp, avg 16.31 us, p50 15.80 us,
//! p99 19.02 us`
//! (latency is from writing a request to reading the last byte of its response).

use std::io::{ErrorKind, Read};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

#[path = "common/measure.rs"]
mod measure;
use measure::{pin, write_all};

struct Opts {
    qd: usize,
    req: usize,
    resp: usize,
    secs: f64,
    server_cpu: usize,
    client_cpu: usize,
    blocking: bool,
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        qd: 1,
        req: 72,
        resp: 4120,
        secs: 5.0,
        server_cpu: 0,
        client_cpu: 1,
        blocking: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--blocking" {
            o.blocking = true;
            continue;
        }
        let v = args.next().ok_or_else(|| format!("{a} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{a} {v}: {e}");
        match a.as_str() {
            "--qd" => o.qd = v.parse().map_err(|e| bad(&e))?,
            "--req" => o.req = v.parse().map_err(|e| bad(&e))?,
            "--resp" => o.resp = v.parse().map_err(|e| bad(&e))?,
            "--secs" => o.secs = v.parse().map_err(|e| bad(&e))?,
            "--server-cpu" => o.server_cpu = v.parse().map_err(|e| bad(&e))?,
            "--client-cpu" => o.client_cpu = v.parse().map_err(|e| bad(&e))?,
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    if o.qd == 0 || o.qd > 4096 || o.req == 0 || o.resp == 0 {
        return Err("--qd must be 1..=4096, --req and --resp at least 1".into());
    }
    if !(o.secs > 0.0 && o.secs <= 600.0) {
        return Err("--secs must be in (0, 600]".into());
    }
    Ok(o)
}

/// Reads what is there (at least one byte), spinning on WouldBlock in poll mode.
/// `Ok(0)` is end of stream.
fn read_some(s: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match s.read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                std::hint::spin_loop()
            }
            Err(e) => return Err(e),
        }
    }
}

fn serve(mut s: TcpStream, o: &Opts) -> std::io::Result<()> {
    let mut inbuf = vec![0u8; o.req * o.qd + 65536];
    let out = vec![0x5au8; o.resp * o.qd];
    let mut partial = 0usize; // bytes of an incomplete request carried over
    loop {
        let n = read_some(&mut s, &mut inbuf)?;
        if n == 0 {
            return Ok(());
        }
        let total = partial + n;
        let whole = total / o.req;
        partial = total % o.req;
        // Never more than qd requests are outstanding, so `out` holds every answer.
        let mut left = whole;
        while left > 0 {
            let k = left.min(o.qd);
            write_all(&mut s, &out[..k * o.resp])?;
            left -= k;
        }
    }
}

struct Sample {
    ops: u64,
    elapsed: f64,
    lat_ns: Vec<u32>,
}

fn client(mut s: TcpStream, o: &Opts) -> std::io::Result<Sample> {
    let reqs = vec![0xa5u8; o.req * o.qd];
    let mut inbuf = vec![0u8; o.resp * o.qd + 65536];
    let mut sent_at = std::collections::VecDeque::with_capacity(o.qd);
    let mut lat_ns: Vec<u32> = Vec::with_capacity(1 << 20);
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(o.secs);
    for _ in 0..o.qd {
        sent_at.push_back(t0);
    }
    write_all(&mut s, &reqs)?;
    let mut partial = 0usize;
    let mut ops = 0u64;
    let mut now = t0;
    while now < end {
        let n = read_some(&mut s, &mut inbuf)?;
        if n == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        now = Instant::now();
        let total = partial + n;
        let whole = total / o.resp;
        partial = total % o.resp;
        for _ in 0..whole {
            let t = sent_at.pop_front().expect("a response without a request");
            lat_ns.push(u32::try_from((now - t).as_nanos()).unwrap_or(u32::MAX));
        }
        ops += whole as u64;
        if whole > 0 && now < end {
            for _ in 0..whole {
                sent_at.push_back(now);
            }
            write_all(&mut s, &reqs[..whole * o.req])?;
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    // Let the server finish what is in flight and see end of stream, so neither side
    // writes into a reset connection.
    s.shutdown(std::net::Shutdown::Write)?;
    while read_some(&mut s, &mut inbuf)? != 0 {}
    Ok(Sample {
        ops,
        elapsed,
        lat_ns,
    })
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("loopback_floor: {e}");
            std::process::exit(2);
        }
    };
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local_addr");
    let server = std::thread::scope(|scope| {
        let srv = scope.spawn(|| -> std::io::Result<()> {
            pin(o.server_cpu)?;
            let (s, _) = listener.accept()?;
            s.set_nodelay(true)?;
            s.set_nonblocking(!o.blocking)?;
            serve(s, &o)
        });
        let cli = scope.spawn(|| -> std::io::Result<Sample> {
            pin(o.client_cpu)?;
            let s = TcpStream::connect(addr)?;
            s.set_nodelay(true)?;
            s.set_nonblocking(!o.blocking)?;
            client(s, &o)
        });
        let c = cli.join().expect("client thread panicked");
        let s = srv.join().expect("server thread panicked");
        (c, s)
    });
    let (res, srv) = server;
    if let Err(e) = srv {
        eprintln!("loopback_floor: server: {e}");
        std::process::exit(1);
    }
    let mut r = match res {
        Ok(r) => r,
        Err(e) => {
            eprintln!("loopback_floor: client: {e}");
            std::process::exit(1);
        }
    };
    if r.lat_ns.is_empty() {
        eprintln!("loopback_floor: no request completed");
        std::process::exit(1);
    }
    r.lat_ns.sort_unstable();
    let avg = r.lat_ns.iter().map(|&v| u64::from(v)).sum::<u64>() as f64 / r.lat_ns.len() as f64;
    // Nearest-rank percentile, as spdk_nvme_perf's histogram cut-offs are read.
    let pct = |p: usize| f64::from(r.lat_ns[(r.lat_ns.len() * p).div_ceil(100) - 1]) / 1000.0;
    let ops_s = r.ops as f64 / r.elapsed;
    println!(
        "floor qd={} req={} resp={} mode={}: {:.0} ops/s, {:.1} MiB/s resp, avg {:.2} us, p50 {:.2} us, p99 {:.2} us",
        o.qd,
        o.req,
        o.resp,
        if o.blocking { "blocking" } else { "poll" },
        ops_s,
        ops_s * o.resp as f64 / (1024.0 * 1024.0),
        avg / 1000.0,
        pct(50),
        pct(99)
    );
}
