//! Would io_uring for the sockets cut the soft engine's CPU per request? This serves the
//! shape of 4 KiB reads over loopback TCP two ways and compares the server thread's CPU per
//! request, in alternating rounds over fresh connections:
//!
//! - `epoll`: what the soft engine's IO thread does (`sta/src/soft/io.rs`). Each pass is one
//!   `epoll_wait` with a zero timeout (the engine busy-polls while it has work), one
//!   non-blocking `recv` per ready socket, then one `writev` per socket carrying every answer
//!   made in that pass, the data slices pointing straight into the region (as lent reads do).
//! - `uring`: one multishot receive per socket (`IORING_OP_RECV` with
//!   `IORING_RECV_MULTISHOT`) into a ring of provided buffers, and one `IORING_OP_SENDMSG`
//!   per socket per pass with the same iovecs. Each pass is one `io_uring_enter` (GETEVENTS,
//!   `min_complete` 0) that submits the pass's sends and runs the completions' task work.
//!   No SQPOLL: it would take a core of the two.
//! - `uring-coop`: as `uring`, with `COOP_TASKRUN | TASKRUN_FLAG | SINGLE_ISSUER`: the
//!   kernel interrupts nobody to run our completions and raises a flag in the ring instead,
//!   so a pass with nothing to submit and no flag raised makes no system call at all.
//! - `uring-defer`: as `uring-coop` with `DEFER_TASKRUN` in place of `COOP_TASKRUN`: the
//!   completions' work runs only inside our `io_uring_enter`.
//! - `uring-zc`: as `uring-defer`, sending with `IORING_OP_SENDMSG_ZC` (only to record it:
//!   on loopback the kernel copies the pages anyway, and each send posts a second CQE).
//!
//! ```sh
//! cargo run --release --example uring_sockets -- [--cases 1x1,32x1,32x4] \
//!     [--modes epoll,uring,uring-coop,uring-defer] [--payload 4096] [--secs 3] \
//!     [--rounds 5] [--mib 1024] [--bufs 64] [--buf-size 16384] [--server-cpu 0] \
//!     [--client-cpu 1] [--client-batch 1] [--retries 0] [--sleep]
//! ```
//!
//! A case `QDxN` is N connections with QD requests in flight on each. The client thread (on
//! `--client-cpu`) busy-polls its non-blocking sockets: a request is a 72-byte "command"
//! (the size of a CapsuleCmd PDU) naming a random block; each answer it gets back is
//! followed at once by a new request on that connection, all the new requests of one `read`
//! in one `write` (with `--client-batch B`, only once B answers of the connection wait for
//! theirs: a host slower than this one hands the server bigger batches). The server thread
//! (on `--server-cpu`) answers each command with a 24-byte header, `--payload` bytes from
//! that block of a written `--mib` MiB region (huge pages asked for, as the RAM namespace
//! does) and a 24-byte trailer: a C2HData PDU and a CapsuleResp, as the engine answers a
//! read.
//!
//! Each run prints requests per second (client side), the server thread's CPU per request
//! (`getrusage(RUSAGE_THREAD)`, everything the thread spent, its spinning included), its
//! *busy* CPU per request (the wall time of the passes that did work, clocked once per
//! pass: what the thread spent apart from its idle spinning, the figure that matters when
//! the server is not the bottleneck, at QD1 above all; it is wall time, so a loaded machine
//! inflates it), the server's system calls per request, and at QD1 the mean round trip. The
//! last lines give, per case and io_uring mode, the median over rounds of the ratio to the
//! `epoll` run of the same round (below 1: io_uring is cheaper). Within a round the modes
//! run back to back, in reverse order every other round; the machine changes speed from
//! minute to minute, so only these paired ratios mean much. A run is *disturbed* when
//! either thread (with `--sleep`, the client) had less than 95 % of its core (something
//! else ran there: a build, another benchmark); `--retries N` runs a round's case up to N
//! more times until none is, and the summary gives the medians over all rounds and over the
//! undisturbed ones.
//!
//! By default the server busy-polls, as the engine does while it has work. With `--sleep`
//! it waits in the kernel (`epoll_wait` with no timeout, `io_uring_enter` for one
//! completion) after every pass that found nothing to do; its CPU then counts no spinning
//! and no time another task held its core, so CPU per request holds up on a loaded machine,
//! but it pays a wake-up whenever it ran dry.
//!
//! What it is not: a target. There is no NVMe, no queue state machine, no backend and no
//! locking of the region; the commands are fixed-size and never split across reads in a
//! way that matters. Its own code costs a fraction of the engine's, so the share io_uring
//! could save here is an upper bound on the share it would save the engine. The headers
//! live in a per-connection ring of slots that is reused once the client has the answer;
//! with `uring-zc` that is safe only because loopback copies before the client can read.

// `unsafe` allowed here: the io_uring submissions (the kernel reads our iovecs, msghdrs and
// buffer ring until the completion), the provided-buffer ring's shared memory, the region's
// mmap/madvise and the raw `writev` of iovecs that point into that memory.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, types, IoUring};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

#[path = "common/measure.rs"]
mod measure;
use measure::{median, pin, thread_cpu, write_all};

/// A CapsuleCmd PDU: 8-byte common header + 64-byte SQE.
const CMD: usize = 72;
/// A C2HData header and a CapsuleResp, each 24 bytes.
const HDR: usize = 24;
/// Most slices in one `writev` or `sendmsg`.
const IOV_MAX: usize = 1024;
/// Where the command id and the starting block sit in a command (SQE bytes 2 and 40).
const CID_AT: usize = 8 + 2;
const SLBA_AT: usize = 8 + 40;
/// io_uring user data: what the completion is for, and the connection's index.
const RECV_TAG: u64 = 1 << 32;
const SEND_TAG: u64 = 2 << 32;
const IDX_MASK: u64 = 0xffff_ffff;
/// The provided-buffer group of the receives.
const BGID: u16 = 0;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Epoll,
    Uring,
    UringCoop,
    UringDefer,
    UringZc,
}

impl Mode {
    const ALL: [Mode; 5] = [
        Mode::Epoll,
        Mode::Uring,
        Mode::UringCoop,
        Mode::UringDefer,
        Mode::UringZc,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::Epoll => "epoll",
            Mode::Uring => "uring",
            Mode::UringCoop => "uring-coop",
            Mode::UringDefer => "uring-defer",
            Mode::UringZc => "uring-zc",
        }
    }

    /// Whether a pass may skip `io_uring_enter` when it has nothing to submit and the ring
    /// raised no task-work flag.
    fn skips_idle_enter(self) -> bool {
        matches!(self, Mode::UringCoop | Mode::UringDefer | Mode::UringZc)
    }
}

#[derive(Clone, Copy)]
struct Case {
    qd: usize,
    conns: usize,
}

struct Opts {
    cases: Vec<Case>,
    modes: Vec<Mode>,
    payload: usize,
    secs: f64,
    rounds: usize,
    mib: usize,
    bufs: u16,
    buf_size: usize,
    server_cpu: usize,
    client_cpu: usize,
    client_batch: usize,
    retries: usize,
    sleep: bool,
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        cases: vec![
            Case { qd: 1, conns: 1 },
            Case { qd: 32, conns: 1 },
            Case { qd: 32, conns: 4 },
        ],
        modes: vec![Mode::Epoll, Mode::Uring, Mode::UringCoop, Mode::UringDefer],
        payload: 4096,
        secs: 3.0,
        rounds: 5,
        mib: 1024,
        bufs: 64,
        buf_size: 16384,
        server_cpu: 0,
        client_cpu: 1,
        client_batch: 1,
        retries: 0,
        sleep: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--sleep" {
            o.sleep = true;
            continue;
        }
        let v = args.next().ok_or_else(|| format!("{a} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{a} {v}: {e}");
        match a.as_str() {
            "--cases" => {
                o.cases = v
                    .split(',')
                    .map(|c| {
                        let (qd, n) = c.split_once('x').ok_or("a case is QDxCONNS")?;
                        Ok::<_, String>(Case {
                            qd: qd.parse().map_err(|e| bad(&e))?,
                            conns: n.parse().map_err(|e| bad(&e))?,
                        })
                    })
                    .collect::<Result<_, _>>()?
            }
            "--modes" => {
                o.modes = v
                    .split(',')
                    .map(|m| {
                        Mode::ALL
                            .into_iter()
                            .find(|x| x.name() == m)
                            .ok_or_else(|| format!("unknown mode {m}"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--payload" => o.payload = v.parse().map_err(|e| bad(&e))?,
            "--secs" => o.secs = v.parse().map_err(|e| bad(&e))?,
            "--rounds" => o.rounds = v.parse().map_err(|e| bad(&e))?,
            "--mib" => o.mib = v.parse().map_err(|e| bad(&e))?,
            "--bufs" => o.bufs = v.parse().map_err(|e| bad(&e))?,
            "--buf-size" => o.buf_size = v.parse().map_err(|e| bad(&e))?,
            "--server-cpu" => o.server_cpu = v.parse().map_err(|e| bad(&e))?,
            "--client-cpu" => o.client_cpu = v.parse().map_err(|e| bad(&e))?,
            "--client-batch" => o.client_batch = v.parse().map_err(|e| bad(&e))?,
            "--retries" => o.retries = v.parse().map_err(|e| bad(&e))?,
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    if o.cases.is_empty()
        || o.cases
            .iter()
            .any(|c| c.qd == 0 || c.qd > 256 || c.conns == 0 || c.conns > 64)
    {
        return Err("--cases: QD 1..=256, connections 1..=64".into());
    }
    if o.modes.first() != Some(&Mode::Epoll) || o.modes[1..].contains(&Mode::Epoll) {
        return Err("--modes must start with epoll (the reference) and name it once".into());
    }
    if o.payload == 0 || o.mib * (1 << 20) < o.payload * 4 || o.rounds == 0 {
        return Err("--payload must be positive, --mib hold a few payloads, --rounds >= 1".into());
    }
    if !o.bufs.is_power_of_two() || o.bufs > 32768 || o.buf_size < CMD || o.buf_size > 1 << 20 {
        return Err("--bufs must be a power of two up to 32768, --buf-size 72..=1 MiB".into());
    }
    if !(o.secs > 0.0 && o.secs <= 600.0) || o.client_batch == 0 {
        return Err("--secs must be in (0, 600], --client-batch at least 1".into());
    }
    Ok(o)
}

/// The data the answers come from: anonymous memory, huge pages asked for, every byte
/// written (never the shared zero page), like the bench's filled RAM namespace.
struct Region {
    ptr: *mut u8,
    len: usize,
}

/// A fresh private anonymous read-write mapping of `len` bytes (page-aligned).
fn anon_map(len: usize) -> std::io::Result<*mut libc::c_void> {
    // SAFETY: a new mapping at an address the kernel picks; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p)
}

impl Region {
    fn new(len: usize) -> std::io::Result<Region> {
        let ptr = anon_map(len)?;
        // SAFETY: advice on the mapping just made; failure only means no huge pages.
        unsafe { libc::madvise(ptr, len, libc::MADV_HUGEPAGE) };
        let r = Region {
            ptr: ptr.cast(),
            len,
        };
        // SAFETY: `ptr` is valid for `len` bytes and nothing else refers to it yet.
        let bytes = unsafe { std::slice::from_raw_parts_mut(r.ptr, len) };
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i >> 12) as u8;
        }
        Ok(r)
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: valid for `len` bytes until drop; only read once written in `new`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no slice of it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

// SAFETY: the region is written only in `new`, before any other thread sees it; after that it
// is read-only memory.
unsafe impl Sync for Region {}

/// A connection's answers not yet handed to the kernel, as iovecs in order, and the slots
/// their headers and trailers live in.
struct Outbox {
    /// `HDR` header + `HDR` trailer per slot, reused round-robin. An answer's slot is taken
    /// again only `slots.len()` answers later; the client has at most QD answers missing, so
    /// by then the kernel has long copied it.
    slots: Box<[[u8; 2 * HDR]]>,
    next_slot: usize,
    iov: Vec<libc::iovec>,
    /// Slices before this one were sent.
    head: usize,
}

impl Outbox {
    fn new(qd: usize) -> Outbox {
        Outbox {
            slots: vec![[0u8; 2 * HDR]; 2 * qd + 8].into_boxed_slice(),
            next_slot: 0,
            iov: Vec::with_capacity(3 * qd + 3),
            head: 0,
        }
    }

    fn pending(&self) -> &[libc::iovec] {
        &self.iov[self.head..]
    }

    /// Builds the answer to one command: header, the block's bytes, trailer.
    fn answer(&mut self, cmd: &[u8], region: &[u8], payload: usize) -> Result<(), String> {
        if cmd[0] != 0x04 {
            return Err(format!("not a command: type byte {:#x}", cmd[0]));
        }
        let blocks = (region.len() / payload) as u64;
        let slba = u64::from_le_bytes(cmd[SLBA_AT..SLBA_AT + 8].try_into().expect("8 bytes"));
        let at = (slba % blocks) as usize * payload;
        let n_slots = self.slots.len();
        let slot = &mut self.slots[self.next_slot];
        self.next_slot = (self.next_slot + 1) % n_slots;
        slot[0] = 0x07; // C2HData
        slot[2] = HDR as u8;
        slot[4..8].copy_from_slice(&((HDR + payload) as u32).to_le_bytes());
        slot[8..10].copy_from_slice(&cmd[CID_AT..CID_AT + 2]);
        slot[HDR] = 0x05; // CapsuleResp
        slot[HDR + 2] = HDR as u8;
        slot[HDR + 8 + 12..HDR + 8 + 14].copy_from_slice(&cmd[CID_AT..CID_AT + 2]);
        let base = slot.as_mut_ptr();
        let data = region[at..at + payload].as_ptr();
        for (p, len) in [
            (base, HDR),
            (data.cast_mut(), payload),
            (base.wrapping_add(HDR), HDR),
        ] {
            self.iov.push(libc::iovec {
                iov_base: p.cast(),
                iov_len: len,
            });
        }
        Ok(())
    }

    /// `n` more bytes of the pending slices went out.
    fn sent(&mut self, n: usize) {
        advance(&mut self.iov, &mut self.head, n);
    }
}

/// Drops `n` bytes from the front of `iov[*head..]`.
fn advance(iov: &mut Vec<libc::iovec>, head: &mut usize, mut n: usize) {
    while n > 0 {
        let v = &mut iov[*head];
        if n >= v.iov_len {
            n -= v.iov_len;
            *head += 1;
        } else {
            v.iov_base = v.iov_base.cast::<u8>().wrapping_add(n).cast();
            v.iov_len -= n;
            n = 0;
        }
    }
    if *head == iov.len() {
        iov.clear();
        *head = 0;
    }
}

/// What the server thread saw in one run.
#[derive(Default)]
struct ServerStats {
    served: u64,
    cpu: f64,
    elapsed: f64,
    /// Wall time of the passes that did work (clocked once per pass).
    busy: f64,
    passes: u64,
    idle_passes: u64,
    syscalls: u64,
    /// io_uring: completions reaped, receives re-armed after running out of buffers.
    cqes: u64,
    enobufs: u64,
    /// io_uring worker threads alive at the end (their CPU is not the server thread's).
    workers: usize,
}

impl ServerStats {
    /// Counts a server pass that ended now, busy if it `did` work (its time since `last`
    /// is busy time); moves `last` to now. Returns whether the pass was idle.
    fn pass_done(&mut self, did: bool, last: &mut Instant) -> bool {
        let now = Instant::now();
        self.passes += 1;
        if did {
            self.busy += (now - *last).as_secs_f64();
        } else {
            self.idle_passes += 1;
        }
        *last = now;
        !did
    }
}

/// Threads of this process that are io_uring workers (`iou-wrk-*`).
fn uring_workers() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("iou-wrk"))
        })
        .count()
}

/// Accepts `n` connections: non-blocking, no Nagle.
fn accept(l: &TcpListener, n: usize) -> std::io::Result<Vec<TcpStream>> {
    (0..n)
        .map(|_| {
            let (s, _) = l.accept()?;
            s.set_nodelay(true)?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
        .collect()
}

struct EpollConn {
    sock: TcpStream,
    rx: Vec<u8>,
    rx_len: usize,
    out: Outbox,
    open: bool,
}

fn serve_epoll(
    socks: Vec<TcpStream>,
    case: Case,
    o: &Opts,
    region: &[u8],
) -> Result<ServerStats, String> {
    let io = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| io("epoll_create", &e))?;
    let mut conns: Vec<EpollConn> = socks
        .into_iter()
        .map(|sock| EpollConn {
            sock,
            rx: vec![0u8; o.buf_size],
            rx_len: 0,
            out: Outbox::new(case.qd),
            open: true,
        })
        .collect();
    for (i, c) in conns.iter().enumerate() {
        epoll
            .add(&c.sock, EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
            .map_err(|e| io("epoll_ctl", &e))?;
    }
    let mut events = vec![EpollEvent::empty(); 64];
    let mut st = ServerStats::default();
    let mut live = conns.len();
    let cpu0 = thread_cpu();
    let start = Instant::now();
    let mut last = start;
    let mut idle_before = false;
    while live > 0 {
        // With --sleep, a pass after one that found nothing waits for the kernel.
        let timeout = if o.sleep && idle_before {
            EpollTimeout::NONE
        } else {
            EpollTimeout::ZERO
        };
        let n = epoll
            .wait(&mut events, timeout)
            .map_err(|e| io("epoll_wait", &e))?;
        st.syscalls += 1;
        let mut did = false;
        for ev in &events[..n] {
            let c = &mut conns[ev.data() as usize];
            st.syscalls += 1;
            match nix::sys::socket::recv(
                c.sock.as_raw_fd(),
                &mut c.rx[c.rx_len..],
                nix::sys::socket::MsgFlags::empty(),
            ) {
                Ok(0) => {
                    epoll.delete(&c.sock).map_err(|e| io("epoll_ctl", &e))?;
                    c.open = false;
                    live -= 1;
                }
                Ok(k) => {
                    did = true;
                    c.rx_len += k;
                    let whole = c.rx_len / CMD;
                    for i in 0..whole {
                        c.out
                            .answer(&c.rx[i * CMD..(i + 1) * CMD], region, o.payload)?;
                    }
                    st.served += whole as u64;
                    c.rx.copy_within(whole * CMD..c.rx_len, 0);
                    c.rx_len -= whole * CMD;
                }
                Err(nix::errno::Errno::EAGAIN) => {}
                Err(e) => return Err(io("recv", &e)),
            }
        }
        for c in conns.iter_mut().filter(|c| !c.out.pending().is_empty()) {
            let iov = c.out.pending();
            let cnt = iov.len().min(IOV_MAX);
            st.syscalls += 1;
            // SAFETY: every iovec points into the region or this connection's header slots,
            // both alive and unchanged for the call.
            let r = unsafe { libc::writev(c.sock.as_raw_fd(), iov.as_ptr(), cnt as i32) };
            if r >= 0 {
                did = true;
                c.out.sent(r as usize);
            } else {
                let e = std::io::Error::last_os_error();
                if e.kind() != ErrorKind::WouldBlock {
                    return Err(io("writev", &e));
                }
            }
        }
        idle_before = st.pass_done(did, &mut last);
    }
    st.cpu = thread_cpu() - cpu0;
    st.elapsed = start.elapsed().as_secs_f64();
    debug_assert!(conns.iter().all(|c| !c.open));
    Ok(st)
}

/// The provided-buffer ring the multishot receives take their buffers from.
struct BufRing {
    ring: *mut types::BufRingEntry,
    ring_bytes: usize,
    tail: u16,
    mask: u16,
    bufs: Vec<u8>,
    size: usize,
}

impl BufRing {
    fn new(count: u16, size: usize) -> std::io::Result<BufRing> {
        let ring_bytes = (usize::from(count) * std::mem::size_of::<types::BufRingEntry>())
            .next_multiple_of(4096);
        // Page-aligned, as the kernel requires of a buffer ring.
        let p = anon_map(ring_bytes)?;
        let mut r = BufRing {
            ring: p.cast(),
            ring_bytes,
            tail: 0,
            mask: count - 1,
            bufs: vec![0u8; usize::from(count) * size],
            size,
        };
        for bid in 0..count {
            r.give(bid);
        }
        r.publish();
        Ok(r)
    }

    /// Queues buffer `bid` for the kernel again (seen once [`publish`](Self::publish)ed).
    fn give(&mut self, bid: u16) {
        // SAFETY: the index is masked into the ring's `count` entries; the kernel reads only
        // entries before the published tail, and this one is past it.
        let e = unsafe { &mut *self.ring.add(usize::from(self.tail & self.mask)) };
        e.set_addr(self.bufs.as_ptr() as u64 + u64::from(bid) * self.size as u64);
        e.set_len(self.size as u32);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    fn publish(&self) {
        // SAFETY: the ring's base is page-aligned and mapped; `tail` gives its tail field,
        // which the kernel only reads. An atomic release store orders the entries before it.
        unsafe {
            let t = types::BufRingEntry::tail(self.ring) as *const AtomicU16;
            (*t).store(self.tail, Ordering::Release);
        }
    }

    fn data(&self, bid: u16, len: usize) -> &[u8] {
        let at = usize::from(bid) * self.size;
        &self.bufs[at..at + len]
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; the ring that used it is gone (see serve_uring).
        unsafe { libc::munmap(self.ring.cast(), self.ring_bytes) };
    }
}

struct UringConn {
    sock: TcpStream,
    /// The start of a command split across two receives.
    carry: [u8; CMD],
    carry_len: usize,
    out: Outbox,
    /// The slices of the send in flight (the kernel's until its completion), and the
    /// message that points at them.
    flight: Vec<libc::iovec>,
    flight_head: usize,
    msg: libc::msghdr,
    sending: bool,
}

impl UringConn {
    /// Answers every whole command in `data`, keeping a split one's start for later.
    fn take(&mut self, mut data: &[u8], region: &[u8], payload: usize) -> Result<u64, String> {
        let mut n = 0;
        if self.carry_len > 0 {
            let k = (CMD - self.carry_len).min(data.len());
            self.carry[self.carry_len..self.carry_len + k].copy_from_slice(&data[..k]);
            self.carry_len += k;
            data = &data[k..];
            if self.carry_len < CMD {
                return Ok(0);
            }
            let cmd = self.carry;
            self.out.answer(&cmd, region, payload)?;
            self.carry_len = 0;
            n += 1;
        }
        let mut cmds = data.chunks_exact(CMD);
        for cmd in &mut cmds {
            self.out.answer(cmd, region, payload)?;
            n += 1;
        }
        let rest = cmds.remainder();
        self.carry[..rest.len()].copy_from_slice(rest);
        self.carry_len = rest.len();
        Ok(n)
    }
}

fn serve_uring(
    socks: Vec<TcpStream>,
    case: Case,
    mode: Mode,
    o: &Opts,
    region: &[u8],
) -> Result<ServerStats, String> {
    let io = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    let mut builder = IoUring::builder();
    builder.setup_cqsize(4096);
    match mode {
        Mode::Uring | Mode::Epoll => {}
        Mode::UringCoop => {
            builder
                .setup_coop_taskrun()
                .setup_taskrun_flag()
                .setup_single_issuer();
        }
        Mode::UringDefer | Mode::UringZc => {
            builder
                .setup_single_issuer()
                .setup_defer_taskrun()
                .setup_taskrun_flag();
        }
    }
    let mut bufs = BufRing::new(o.bufs, o.buf_size).map_err(|e| io("buffer ring", &e))?;
    let mut ring: IoUring = builder.build(256).map_err(|e| io("io_uring_setup", &e))?;
    // SAFETY: the ring's memory stays mapped until after `ring` is dropped (below).
    unsafe {
        ring.submitter()
            .register_buf_ring_with_flags(bufs.ring as u64, o.bufs, BGID, 0)
    }
    .map_err(|e| io("register buffer ring", &e))?;
    // Boxed so the msghdrs and iovecs the kernel reads never move.
    let mut conns: Vec<Box<UringConn>> = socks
        .into_iter()
        .map(|sock| {
            Box::new(UringConn {
                sock,
                carry: [0u8; CMD],
                carry_len: 0,
                out: Outbox::new(case.qd),
                flight: Vec::with_capacity(IOV_MAX),
                flight_head: 0,
                // SAFETY: an all-zero msghdr is a valid empty message.
                msg: unsafe { std::mem::zeroed() },
                sending: false,
            })
        })
        .collect();
    let recv_sqe = |c: &UringConn, i: usize| {
        opcode::RecvMulti::new(types::Fd(c.sock.as_raw_fd()), BGID)
            .build()
            .user_data(RECV_TAG | i as u64)
    };
    let mut st = ServerStats::default();
    let result = (|| -> Result<(), String> {
        let (submitter, mut sq, mut cq) = ring.split();
        for (i, c) in conns.iter().enumerate() {
            // SAFETY: a receive into provided buffers only; the socket outlives the ring.
            unsafe { sq.push(&recv_sqe(c, i)) }.map_err(|_| "submission queue full")?;
        }
        sq.sync();
        let mut live = conns.len();
        let cpu0 = thread_cpu();
        let start = Instant::now();
        let mut last = start;
        let mut idle_before = false;
        while live > 0 || conns.iter().any(|c| c.sending) {
            bufs.publish();
            sq.sync();
            let to_submit = sq.len();
            // With --sleep, a pass after one that found nothing waits for a completion.
            let want = u32::from(o.sleep && idle_before);
            if !mode.skips_idle_enter()
                || want > 0
                || to_submit > 0
                || sq.taskrun()
                || sq.cq_overflow()
            {
                st.syscalls += 1;
                // SAFETY: every queued entry's memory (msghdr, iovecs, buffers) outlives its
                // completion; no argument is passed.
                unsafe {
                    submitter.enter::<libc::sigset_t>(
                        to_submit as u32,
                        want,
                        io_uring::EnterFlags::GETEVENTS.bits(),
                        None,
                    )
                }
                .map_err(|e| io("io_uring_enter", &e))?;
            }
            cq.sync();
            // A pass that handed the kernel sends or receive buffers did work even when no
            // completion came back in it.
            let mut did = to_submit > 0;
            for cqe in &mut cq {
                did = true;
                st.cqes += 1;
                let i = (cqe.user_data() & IDX_MASK) as usize;
                let res = cqe.result();
                let flags = cqe.flags();
                let c = &mut conns[i];
                if cqe.user_data() & RECV_TAG != 0 {
                    if res > 0 {
                        let bid = cqueue::buffer_select(flags).ok_or("receive without buffer")?;
                        st.served += c.take(bufs.data(bid, res as usize), region, o.payload)?;
                        bufs.give(bid);
                        if !cqueue::more(flags) {
                            // SAFETY: as the first arming.
                            unsafe { sq.push(&recv_sqe(c, i)) }.map_err(|_| "SQ full")?;
                        }
                    } else if res == 0 {
                        live -= 1;
                    } else if res == -libc::ENOBUFS {
                        st.enobufs += 1;
                        // SAFETY: as the first arming.
                        unsafe { sq.push(&recv_sqe(c, i)) }.map_err(|_| "SQ full")?;
                    } else {
                        return Err(io("recv", &std::io::Error::from_raw_os_error(-res)));
                    }
                } else if cqueue::notif(flags) {
                    // SENDMSG_ZC: the kernel let go of the pages (it copied them on loopback).
                } else {
                    if res < 0 {
                        return Err(io("sendmsg", &std::io::Error::from_raw_os_error(-res)));
                    }
                    advance(&mut c.flight, &mut c.flight_head, res as usize);
                    c.sending = false;
                }
            }
            // One send per connection with answers and none in flight: what a short send
            // left first, else everything made since the last send.
            for (i, c) in conns.iter_mut().enumerate() {
                if c.sending || (c.flight.is_empty() && c.out.pending().is_empty()) {
                    continue;
                }
                if c.flight.is_empty() {
                    let n = c.out.pending().len().min(IOV_MAX);
                    c.flight.extend_from_slice(&c.out.pending()[..n]);
                    let k = c.out.pending()[..n].iter().map(|v| v.iov_len).sum();
                    c.out.sent(k);
                }
                c.msg.msg_iov = c.flight[c.flight_head..].as_mut_ptr();
                c.msg.msg_iovlen = c.flight.len() - c.flight_head;
                let fd = types::Fd(c.sock.as_raw_fd());
                let sqe = if mode == Mode::UringZc {
                    opcode::SendMsgZc::new(fd, &c.msg)
                        .flags(libc::MSG_NOSIGNAL as u32)
                        .build()
                } else {
                    opcode::SendMsg::new(fd, &c.msg)
                        .flags(libc::MSG_NOSIGNAL as u32)
                        .build()
                };
                // SAFETY: the msghdr and its iovecs live in this boxed connection, untouched
                // until the send's completion; they point into the region and header slots.
                unsafe { sq.push(&sqe.user_data(SEND_TAG | i as u64)) }.map_err(|_| "SQ full")?;
                c.sending = true;
            }
            idle_before = st.pass_done(did, &mut last);
        }
        st.cpu = thread_cpu() - cpu0;
        st.elapsed = start.elapsed().as_secs_f64();
        st.workers = uring_workers();
        Ok(())
    })();
    // The ring goes first: it may use the buffers, msghdrs and iovecs until it is gone.
    drop(ring);
    drop(bufs);
    drop(conns);
    result.map(|()| st)
}

/// What the client saw in one run.
struct ClientStats {
    ops: u64,
    elapsed: f64,
    rtt_sum: f64,
    /// The client thread's CPU over the same time.
    cpu: f64,
}

struct ClientConn {
    sock: TcpStream,
    sent_at: VecDeque<Instant>,
    partial: usize,
    /// Answers received that no new request has replaced yet.
    owed: usize,
}

fn client(addr: SocketAddr, case: Case, o: &Opts, seed: &mut u64) -> std::io::Result<ClientStats> {
    let answer = 2 * HDR + o.payload;
    let mut conns = Vec::with_capacity(case.conns);
    for _ in 0..case.conns {
        let sock = TcpStream::connect(addr)?;
        sock.set_nodelay(true)?;
        sock.set_nonblocking(true)?;
        conns.push(ClientConn {
            sock,
            sent_at: VecDeque::with_capacity(case.qd),
            partial: 0,
            owed: 0,
        });
    }
    let mut reqs = vec![0u8; CMD * case.qd];
    let mut cid = 0u16;
    let mut fill = |reqs: &mut [u8], n: usize| -> usize {
        for r in reqs.chunks_exact_mut(CMD).take(n) {
            // xorshift64: a random block
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            r[0] = 0x04;
            r[2] = CMD as u8;
            r[CID_AT..CID_AT + 2].copy_from_slice(&cid.to_le_bytes());
            r[SLBA_AT..SLBA_AT + 8].copy_from_slice(&seed.to_le_bytes());
            cid = cid.wrapping_add(1);
        }
        n * CMD
    };
    let mut inbuf = vec![0u8; answer * case.qd + 65536];
    let cpu0 = thread_cpu();
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(o.secs);
    for c in &mut conns {
        let n = fill(&mut reqs, case.qd);
        c.sent_at.extend(std::iter::repeat_n(t0, case.qd));
        write_all(&mut c.sock, &reqs[..n])?;
    }
    let (mut ops, mut rtt_sum) = (0u64, 0f64);
    let batch = o.client_batch.min(case.qd);
    let mut now = t0;
    let mut measuring = true;
    // Until the end, every answer brings a new request; then the rest is drained.
    while measuring || conns.iter().any(|c| !c.sent_at.is_empty()) {
        for c in &mut conns {
            let n = match c.sock.read(&mut inbuf) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            };
            now = Instant::now();
            let total = c.partial + n;
            let whole = total / answer;
            c.partial = total % answer;
            for _ in 0..whole {
                let t = c.sent_at.pop_front().ok_or(ErrorKind::InvalidData)?;
                if measuring {
                    rtt_sum += (now - t).as_secs_f64();
                    ops += 1;
                }
            }
            c.owed += whole;
            if measuring && c.owed >= batch {
                let k = fill(&mut reqs, c.owed);
                c.sent_at.extend(std::iter::repeat_n(now, c.owed));
                write_all(&mut c.sock, &reqs[..k])?;
                c.owed = 0;
            }
        }
        measuring = measuring && now < end;
    }
    let elapsed = (now - t0).as_secs_f64();
    let cpu = thread_cpu() - cpu0;
    for c in &conns {
        if c.partial != 0 {
            return Err(std::io::Error::other("a partial answer at the end"));
        }
        c.sock.shutdown(std::net::Shutdown::Write)?;
    }
    Ok(ClientStats {
        ops,
        elapsed,
        rtt_sum,
        cpu,
    })
}

/// A thread that busy-polls should have its CPU for the whole run; below this share of the
/// wall time something else ran on its core, and the run is marked as disturbed.
const CLEAN_SHARE: f64 = 0.95;

struct Run {
    /// Both threads had their CPU for the whole run (nothing else ran on their cores).
    clean: bool,
    rps: f64,
    cpu_us: f64,
    busy_us: f64,
    rtt_us: f64,
}

fn run(o: &Opts, region: &Region, case: Case, mode: Mode, seed: u64) -> Result<Run, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("local_addr: {e}"))?;
    let (srv, cli) = std::thread::scope(|scope| {
        let srv = scope.spawn(|| -> Result<ServerStats, String> {
            pin(o.server_cpu).map_err(|e| format!("pin server: {e}"))?;
            let socks = accept(&listener, case.conns).map_err(|e| format!("accept: {e}"))?;
            match mode {
                Mode::Epoll => serve_epoll(socks, case, o, region.bytes()),
                _ => serve_uring(socks, case, mode, o, region.bytes()),
            }
        });
        let cli = scope.spawn(|| -> std::io::Result<ClientStats> {
            pin(o.client_cpu)?;
            let mut seed = seed;
            client(addr, case, o, &mut seed)
        });
        (
            srv.join().expect("server thread panicked"),
            cli.join().expect("client thread panicked"),
        )
    });
    let s = srv.map_err(|e| format!("server: {e}"))?;
    let c = cli.map_err(|e| format!("client: {e}"))?;
    if c.ops == 0 || s.served == 0 {
        return Err("no request completed".into());
    }
    let shares = (s.cpu / s.elapsed, c.cpu / c.elapsed);
    let r = Run {
        // A server that sleeps has no share to check; the busy-polling client still tells.
        clean: (o.sleep || shares.0 >= CLEAN_SHARE) && shares.1 >= CLEAN_SHARE,
        rps: c.ops as f64 / c.elapsed,
        cpu_us: s.cpu / s.served as f64 * 1e6,
        busy_us: s.busy.min(s.cpu) / s.served as f64 * 1e6,
        rtt_us: c.rtt_sum / c.ops as f64 * 1e6,
    };
    print!(
        "{:>9.0} req/s  server CPU {:5.2} us/req, busy {:5.2} us/req ({:4.1} % of passes idle, {:.2} syscalls/req",
        r.rps,
        r.cpu_us,
        r.busy_us,
        s.idle_passes as f64 * 100.0 / s.passes.max(1) as f64,
        s.syscalls as f64 / s.served as f64,
    );
    if mode != Mode::Epoll {
        print!(", {:.2} CQEs/req", s.cqes as f64 / s.served as f64);
        if s.enobufs > 0 {
            print!(", {} out of buffers", s.enobufs);
        }
        if s.workers > 0 {
            print!(", {} io-wq workers", s.workers);
        }
    }
    print!(
        ", CPU/wall server {:.2} client {:.2}{})",
        shares.0,
        shares.1,
        if r.clean { "" } else { " DISTURBED" }
    );
    if case.qd == 1 {
        print!("  mean RTT {:.2} us", r.rtt_us);
    }
    println!();
    Ok(r)
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("uring_sockets: {e}");
            std::process::exit(2);
        }
    };
    let region = match Region::new(o.mib << 20) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("uring_sockets: region of {} MiB: {e}", o.mib);
            std::process::exit(1);
        }
    };
    // ratios[case][mode] = per round: (CPU/req, busy CPU/req, req/s, RTT) of the mode over
    // epoll's, and whether both runs were undisturbed
    let mut ratios = vec![vec![Vec::<([f64; 4], bool)>::new(); o.modes.len()]; o.cases.len()];
    println!(
        "payload {} B, {} s per run, server {} on CPU {}, client on CPU {} (batch {}), {} buffers of {} B",
        o.payload,
        o.secs,
        if o.sleep { "sleeps when idle" } else { "busy-polls" },
        o.server_cpu,
        o.client_cpu,
        o.client_batch,
        o.bufs,
        o.buf_size
    );
    for r in 0..o.rounds {
        println!(
            "round {r}: load average {}",
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split(' ')
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        );
        for (ci, &case) in o.cases.iter().enumerate() {
            let mut order: Vec<usize> = (0..o.modes.len()).collect();
            if r % 2 == 1 {
                order.reverse();
            }
            let mut got: Vec<Option<Run>> = (0..o.modes.len()).map(|_| None).collect();
            for attempt in 0..=o.retries {
                if attempt > 0 {
                    println!("round {r}: a run was disturbed, the round's case again");
                }
                for &mi in &order {
                    let mode = o.modes[mi];
                    print!(
                        "round {r} qd={:<3} conns={} {:<11} ",
                        case.qd,
                        case.conns,
                        mode.name()
                    );
                    let seed = 0x9e37_79b9_7f4a_7c15u64 ^ (r as u64) << 8 ^ ci as u64;
                    match run(&o, &region, case, mode, seed) {
                        Ok(x) => got[mi] = Some(x),
                        Err(e) => {
                            println!();
                            eprintln!("uring_sockets: round {r} {}: {e}", mode.name());
                            std::process::exit(1);
                        }
                    }
                }
                if got.iter().flatten().all(|g| g.clean) {
                    break;
                }
            }
            let base = got[0].as_ref().expect("epoll ran");
            for (mi, g) in got.iter().enumerate().skip(1) {
                let g = g.as_ref().expect("mode ran");
                ratios[ci][mi].push((
                    [
                        g.cpu_us / base.cpu_us,
                        g.busy_us / base.busy_us,
                        g.rps / base.rps,
                        g.rtt_us / base.rtt_us,
                    ],
                    g.clean && base.clean,
                ));
            }
        }
    }
    println!(
        "median of mode/epoll in the same round, (lowest-highest), over all {} rounds and over \
         the rounds where neither run was disturbed (CPU and busy CPU per request: below 1 is \
         cheaper):",
        o.rounds
    );
    for (ci, case) in o.cases.iter().enumerate() {
        for (mi, mode) in o.modes.iter().enumerate().skip(1) {
            for clean_only in [false, true] {
                let pick: Vec<[f64; 4]> = ratios[ci][mi]
                    .iter()
                    .filter(|(_, clean)| *clean || !clean_only)
                    .map(|(x, _)| *x)
                    .collect();
                let col = |k: usize| {
                    let mut v: Vec<f64> = pick
                        .iter()
                        .map(|x| x[k])
                        .filter(|x| x.is_finite())
                        .collect();
                    if v.is_empty() {
                        return "n/a".to_string();
                    }
                    let (lo, hi) = v
                        .iter()
                        .fold((f64::INFINITY, 0f64), |(a, b), &x| (a.min(x), b.max(x)));
                    format!("{:.3} ({:.2}-{:.2})", median(&mut v), lo, hi)
                };
                print!(
                    "qd={:<3} conns={} {:<11} {:>5} {:>2} rounds: CPU/req {}, busy CPU/req {}, req/s {}",
                    case.qd,
                    case.conns,
                    mode.name(),
                    if clean_only { "clean" } else { "all" },
                    pick.len(),
                    col(0),
                    col(1),
                    col(2)
                );
                if case.qd == 1 {
                    print!(", RTT {}", col(3));
                }
                println!();
            }
        }
    }
}
