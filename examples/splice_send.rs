//! What a zero-copy send would save the target on this machine: the sender's CPU per read
//! answered with `writev` (the kernel copies the data into the socket, as the daemon's lent
//! reads do) against `vmsplice` + `splice` (the socket takes references to the pages and
//! the receiver copies straight out of them). The data comes from random blocks of a
//! written region much larger than the cache, like the RAM namespace of `benches/vs-spdk.sh`.
//!
//! ```sh
//! cargo run --release --example splice_send -- [--chunk 4096] [--batch 8] [--secs 3] \
//!     [--rounds 3] [--mib 1024] [--sender-cpu 0] [--receiver-cpu 1]
//! ```
//!
//! Each answer is laid out as the daemon sends a read: a 24-byte C2HData header, the data,
//! a 24-byte CapsuleResp; `--batch` answers go out per call, as a pass batches them. The
//! receiver (on `--receiver-cpu`) reads into one buffer with blocking `recv`, as a host
//! would. Rounds alternate between the two ways over fresh connections, and each prints
//! answers per second and the sender thread's CPU per answer; the last line gives the
//! median ratio of splice's CPU per answer to writev's (below 1: splice is cheaper).
//!
//! This is a measurement, not a design: `vmsplice` leaves the socket holding our pages
//! after the call returns, with no word on when it lets go (on loopback, not until the
//! receiver has read them), so the headers here come from a large rotating arena whose
//! bytes nobody checks. The daemon cannot send that way without knowing when a page may be
//! written again (MSG_ZEROCOPY tells, but on loopback it copies anyway).

use std::io::{IoSlice, Read};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

use nix::fcntl::{splice, vmsplice, SpliceFFlags};

#[path = "common/measure.rs"]
mod measure;
use measure::{median, pin, thread_cpu};

struct Opts {
    chunk: usize,
    batch: usize,
    secs: f64,
    rounds: usize,
    mib: usize,
    sender_cpu: usize,
    receiver_cpu: usize,
}

const HDR: usize = 24;
const ARENA: usize = 16 << 20;
const PIPE_BYTES: i32 = 1 << 20;

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        chunk: 4096,
        batch: 8,
        secs: 3.0,
        rounds: 3,
        mib: 1024,
        sender_cpu: 0,
        receiver_cpu: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().ok_or_else(|| format!("{a} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{a} {v}: {e}");
        match a.as_str() {
            "--chunk" => o.chunk = v.parse().map_err(|e| bad(&e))?,
            "--batch" => o.batch = v.parse().map_err(|e| bad(&e))?,
            "--secs" => o.secs = v.parse().map_err(|e| bad(&e))?,
            "--rounds" => o.rounds = v.parse().map_err(|e| bad(&e))?,
            "--mib" => o.mib = v.parse().map_err(|e| bad(&e))?,
            "--sender-cpu" => o.sender_cpu = v.parse().map_err(|e| bad(&e))?,
            "--receiver-cpu" => o.receiver_cpu = v.parse().map_err(|e| bad(&e))?,
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    if o.chunk == 0 || !o.chunk.is_multiple_of(512) || o.batch == 0 || o.batch > 64 {
        return Err("--chunk must be a positive multiple of 512, --batch 1..=64".into());
    }
    if o.mib * (1 << 20) < o.chunk * 4 || o.rounds == 0 {
        return Err("--mib must hold a few chunks and --rounds be at least 1".into());
    }
    if !(o.secs > 0.0 && o.secs <= 600.0) {
        return Err("--secs must be in (0, 600]".into());
    }
    Ok(o)
}

/// Reads to end of stream; returns the byte count.
fn receive(mut s: TcpStream) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        match s.read(&mut buf)? {
            0 => return Ok(total),
            n => total += n as u64,
        }
    }
}

struct Round {
    answers: u64,
    elapsed: f64,
    cpu: f64,
}

/// Puts every byte of `slices` into the socket, by `writev` or through the pipe.
fn send_batch(
    sock: &TcpStream,
    pipe: Option<&(OwnedFd, OwnedFd)>,
    mut slices: &mut [IoSlice<'_>],
) -> std::io::Result<()> {
    while !slices.is_empty() {
        let n = match pipe {
            None => nix::sys::uio::writev(sock, slices)?,
            Some((rd, wr)) => {
                let n = vmsplice(wr.as_fd(), slices, SpliceFFlags::empty())?;
                let mut in_pipe = n;
                while in_pipe > 0 {
                    in_pipe -= splice(rd, None, sock, None, in_pipe, SpliceFFlags::empty())?;
                }
                n
            }
        };
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

fn run_round(o: &Opts, region: &[u8], by_splice: bool, seed: &mut u64) -> std::io::Result<Round> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let receiver_cpu = o.receiver_cpu;
    let rx = std::thread::spawn(move || -> std::io::Result<u64> {
        pin(receiver_cpu)?;
        receive(TcpStream::connect(addr)?)
    });
    let (sock, _) = listener.accept()?;
    sock.set_nodelay(true)?;
    let pipe = if by_splice {
        let (rd, wr) = nix::unistd::pipe()?;
        nix::fcntl::fcntl(&wr, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_BYTES))?;
        Some((rd, wr))
    } else {
        None
    };
    let arena = vec![0x11u8; ARENA];
    let blocks = (region.len() / o.chunk) as u64;
    let mut hdr_at = 0usize;
    let (mut answers, mut sent) = (0u64, 0u64);
    let start = Instant::now();
    let cpu0 = thread_cpu();
    while start.elapsed().as_secs_f64() < o.secs {
        let mut slices = Vec::with_capacity(o.batch * 3);
        for _ in 0..o.batch {
            // xorshift64: a random block, the same sequence for both ways in a round pair
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            let at = (*seed % blocks) as usize * o.chunk;
            for part in [None, Some(at), None] {
                slices.push(IoSlice::new(match part {
                    Some(at) => &region[at..at + o.chunk],
                    None => {
                        let h = &arena[hdr_at..hdr_at + HDR];
                        hdr_at = (hdr_at + 64) % ARENA;
                        h
                    }
                }));
            }
        }
        send_batch(&sock, pipe.as_ref(), &mut slices)?;
        answers += o.batch as u64;
        sent += (o.batch * (o.chunk + 2 * HDR)) as u64;
    }
    let cpu = thread_cpu() - cpu0;
    let elapsed = start.elapsed().as_secs_f64();
    drop(sock);
    let got = rx.join().expect("receiver thread")?;
    if got != sent {
        return Err(std::io::Error::other(format!(
            "receiver got {got} bytes of {sent}"
        )));
    }
    Ok(Round {
        answers,
        elapsed,
        cpu,
    })
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("splice_send: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = pin(o.sender_cpu) {
        eprintln!("splice_send: cannot pin to CPU {}: {e}", o.sender_cpu);
        std::process::exit(1);
    }
    // Written memory, so every block is a real page (never the shared zero page).
    let region: Vec<u8> = (0..o.mib << 20).map(|i| (i >> 12) as u8).collect();
    let mut ratios = Vec::new();
    for r in 0..o.rounds {
        let mut per_answer = [0f64; 2];
        let seed0 = 0x9e37_79b9_7f4a_7c15u64 ^ r as u64;
        for (k, by_splice) in [false, true].into_iter().enumerate() {
            let mut seed = seed0;
            let round = match run_round(&o, &region, by_splice, &mut seed) {
                Ok(x) => x,
                Err(e) => {
                    eprintln!("splice_send: round {r}: {e}");
                    std::process::exit(1);
                }
            };
            per_answer[k] = round.cpu / round.answers as f64 * 1e9;
            println!(
                "round {r} {:6} chunk={} batch={}: {:.0} answers/s, {:.0} MiB/s, sender CPU {:.2}, {:.0} ns CPU per answer",
                if by_splice { "splice" } else { "writev" },
                o.chunk,
                o.batch,
                round.answers as f64 / round.elapsed,
                (round.answers * o.chunk as u64) as f64 / round.elapsed / (1 << 20) as f64,
                round.cpu / round.elapsed,
                per_answer[k]
            );
        }
        ratios.push(per_answer[1] / per_answer[0]);
    }
    println!(
        "median splice/writev sender CPU per answer: {:.2} over {} rounds",
        median(&mut ratios),
        ratios.len()
    );
}
