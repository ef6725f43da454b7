//! `nvmf-initiator`: a small blocking NVMe/TCP host over `std::net::TcpStream`, for
//! integration tests and benchmarks of the target.
//!
//! One [`TcpHost`] is one NVMe/TCP connection, that is one queue (admin or I/O). It does
//! the ICReq/ICResp exchange in [`TcpHost::connect`], then Fabrics Connect
//! ([`TcpHost::connect_admin`], [`TcpHost::connect_io`]), and offers:
//!
//! - synchronous admin and I/O helpers (`identify`, `get_log_page`, `read`, `write`, ...);
//! - a pipelined API for queue depth > 1: [`TcpHost::submit`] a [`Request`] (which owns
//!   its buffer, so reusing the buffers returned by [`TcpHost::poll_completion`] makes the
//!   I/O path allocation-free), answering R2Ts for any number of outstanding writes;
//! - raw access for malformed-input tests: [`TcpHost::connect_raw`] (no ICReq),
//!   [`TcpHost::send_raw`], [`TcpHost::recv_pdu`].
//!
//! Every socket read and write has a timeout ([`HostOptions::timeout`]), so a test never
//! hangs. Received PDUs go through `nvmf::tcp::RxFramer` in its host role, so a target
//! that sends malformed PDUs is caught ([`Error::Protocol`]).
//!
//! Host behaviours of other initiators, to test a target against them
//! ([`HostOptions`]): CC.CSS 110b (NVMe 2.0 hosts such as SPDK's), a random HOSTID per
//! I/O queue Connect (user-space hosts that make one per connection), an empty Host NQN
//! (`spdk_nvme_perf` without a hostnqn), SQ flow control disabled (CATTR bit 2; the host
//! then checks that every completion reports SQHD FFFFh), any admin queue size.
//!
//! Not implemented: TLS, authentication, SQ flow-control accounting (with flow control
//! on, SQHD is not checked; the host keeps at most SQSIZE commands outstanding instead),
//! asynchronous event requests are only available through the raw API. The host is
//! single-threaded and blocking: while it writes a large H2CData it does not read, so it
//! relies on the target to keep reading while it sends (which the spec's flow expects of
//! a target anyway).

use nvmf::spec::fabrics::{self, ConnectCommand, ConnectData, PropertyCommand};
use nvmf::spec::opcodes::{admin, io};
use nvmf::spec::{Cqe, Sqe, Status};
use nvmf::tcp::{
    Digests, HostConfig, HostError, HostEvent, HostQueue, IcResp, Pdu, TermError, TxSink,
};
use std::collections::VecDeque;
use std::io::{IoSlice, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};
use zerocopy::IntoBytes;

pub use nvmf::tcp::Xfer;

pub mod hostile;
#[cfg(test)]
mod tests;

/// Errors of the transport (NVMe statuses are not errors here except where a helper
/// needs a successful result: [`Error::Status`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("timed out waiting for the target")]
    Timeout,
    #[error("connection closed by the target")]
    Eof,
    /// The target sent a malformed PDU; an H2CTermReq was sent (best effort).
    #[error("malformed PDU from the target: {0}")]
    Protocol(TermError),
    /// The target sent C2HTermReq.
    #[error("target terminated the connection: FES {fes:#x} FEI {fei}")]
    Terminated { fes: u16, fei: u32 },
    /// A well-formed PDU that makes no sense now (unknown CID, data out of range, ...).
    #[error("unexpected from the target: {0}")]
    Unexpected(String),
    /// ICResp not acceptable (digests not granted, PFV).
    #[error("ICResp rejected: {0}")]
    IcResp(String),
    /// A helper that needs success got this completion.
    #[error("command failed: {0}")]
    Status(Status, Cqe),
    #[error("all {0} command slots are in use")]
    QueueFull(usize),
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The TLS handshake failed (unknown PSK, wrong key, plain-only target).
    #[error("TLS: {0}")]
    Tls(String),
    /// DH-HMAC-CHAP failed (the target refused us, or we refused the target).
    #[error("authentication: {0}")]
    Auth(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Connection options.
#[derive(Clone, Debug)]
pub struct HostOptions {
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub header_digest: bool,
    pub data_digest: bool,
    /// HPDA sent in ICReq (C2H data alignment `(hpda+1)*4`).
    pub hpda: u8,
    /// MAXR2T sent in ICReq (0's based).
    pub maxr2t: u32,
    /// Timeout of every socket read/write and of `enable_controller`.
    pub timeout: Duration,
    /// Largest C2HData accepted.
    pub max_c2h_data: u32,
    /// In-capsule data limit for I/O queues (the controller's IOCCSZ*16 - 64) if known; 0
    /// sends every I/O-queue write's data (and the I/O queue Connect data) by R2T. The
    /// admin queue always uses 8 KiB.
    pub io_max_incapsule: u32,
    /// CC.CSS that [`TcpHost::enable_controller`] writes: 0 (NVM command set, what the
    /// Linux host writes when CAP.CSS bit 6 is clear) or 0b110 (all supported I/O command
    /// sets: what NVMe 2.0 hosts such as SPDK's write when CAP.CSS bit 6 is set).
    pub cc_css: u8,
    /// A fresh random HOSTID in every I/O queue Connect, as user-space hosts that make one
    /// per connection do; the admin queue uses [`hostid`](Self::hostid).
    pub random_hostid_per_queue: bool,
    /// Connect with CATTR bit 2 (SQ flow control disabled); every completion must then
    /// report SQHD FFFFh, and one that does not is an [`Error::Unexpected`].
    pub disable_sq_flow_control: bool,
    /// SQSIZE (0's based) of the admin queue Connect: Linux uses 31, SPDK's host 1..=4095.
    pub admin_sqsize: u16,
    /// Local address to connect from (a loopback alias such as 127.1.0.7 makes the
    /// connection look like another peer); `None`: the kernel picks.
    pub source: Option<std::net::IpAddr>,
    /// TLS 1.3 with this PSK (TP 8011) before ICReq; `None`: plain TCP.
    pub tls: Option<std::sync::Arc<nvmf_tls::PskEntry>>,
}

impl Default for HostOptions {
    fn default() -> Self {
        let hostid = random_hostid();
        HostOptions {
            hostnqn: format!("nqn.2014-08.org.nvmexpress:uuid:{}", uuid_string(&hostid)),
            hostid,
            header_digest: false,
            data_digest: false,
            hpda: 0,
            maxr2t: 15,
            timeout: Duration::from_secs(10),
            max_c2h_data: 1 << 20,
            io_max_incapsule: 0,
            cc_css: 0,
            random_hostid_per_queue: false,
            disable_sq_flow_control: false,
            admin_sqsize: 31,
            source: None,
            tls: None,
        }
    }
}

impl HostOptions {
    /// What `spdk_nvme_perf` does when its `-r` names no hostnqn: an empty Host NQN.
    pub fn with_empty_hostnqn(self) -> HostOptions {
        HostOptions {
            hostnqn: String::new(),
            ..self
        }
    }
}

/// A random version 4 UUID for a HOSTID (time, process and a counter through a xorshift:
/// unique enough for test hosts, not cryptographic).
pub fn random_hostid() -> [u8; 16] {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut x =
        t ^ N.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed) ^ std::process::id() as u64;
    let mut id = [0u8; 16];
    for chunk in id.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}

fn uuid_string(id: &[u8; 16]) -> String {
    let h: Vec<String> = id.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// A command for [`TcpHost::submit`]. The host fills in CID, PSDT and the SGL.
#[derive(Clone, Debug)]
pub struct Request {
    pub sqe: Sqe,
    pub xfer: Xfer,
    pub buf: Vec<u8>,
}

impl Request {
    pub fn new(sqe: Sqe, xfer: Xfer, buf: Vec<u8>) -> Request {
        Request { sqe, xfer, buf }
    }
    /// Read `nlb` blocks into `buf` (whose length is the transfer length).
    pub fn read(nsid: u32, slba: u64, nlb: u32, buf: Vec<u8>) -> Request {
        Request::new(
            rw_sqe(io::READ, nsid, slba, nlb, false),
            Xfer::FromController,
            buf,
        )
    }
    /// Write `buf` as `nlb` blocks.
    pub fn write(nsid: u32, slba: u64, nlb: u32, buf: Vec<u8>, fua: bool) -> Request {
        Request::new(
            rw_sqe(io::WRITE, nsid, slba, nlb, fua),
            Xfer::ToController,
            buf,
        )
    }
}

fn rw_sqe(opcode: u8, nsid: u32, slba: u64, nlb: u32, fua: bool) -> Sqe {
    let mut sqe = Sqe::default();
    sqe.set_opcode_cid(opcode, 0);
    sqe.nsid = nsid;
    sqe.cdw10 = slba as u32;
    sqe.cdw11 = (slba >> 32) as u32;
    sqe.cdw12 = (nlb.saturating_sub(1) & 0xffff) | if fua { 1 << 30 } else { 0 };
    sqe
}

/// A finished command: its CQE and the request's buffer (read data, or the written data
/// back for reuse).
#[derive(Clone, Debug)]
pub struct Completion {
    pub cid: u16,
    pub cqe: Cqe,
    pub buf: Vec<u8>,
}

/// A received PDU, owned (for [`TcpHost::recv_pdu`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnedPdu {
    IcResp(IcResp),
    CapsuleResp(Cqe),
    C2HData {
        cccid: u16,
        datao: u32,
        data: Vec<u8>,
        last: bool,
        success: bool,
        data_digest_ok: bool,
    },
    R2T {
        cccid: u16,
        ttag: u16,
        r2to: u32,
        r2tl: u32,
    },
    C2HTermReq {
        fes: u16,
        fei: u32,
    },
}

impl OwnedPdu {
    fn from_pdu(p: Pdu<'_>) -> OwnedPdu {
        match p {
            Pdu::IcResp(r) => OwnedPdu::IcResp(r),
            Pdu::CapsuleResp { cqe } => OwnedPdu::CapsuleResp(cqe),
            Pdu::C2HData {
                cccid,
                datao,
                data,
                last,
                success,
                data_digest_ok,
            } => OwnedPdu::C2HData {
                cccid,
                datao,
                data: data.to_vec(),
                last,
                success,
                data_digest_ok,
            },
            Pdu::R2T {
                cccid,
                ttag,
                r2to,
                r2tl,
            } => OwnedPdu::R2T {
                cccid,
                ttag,
                r2to,
                r2tl,
            },
            Pdu::C2HTermReq { fes, fei } => OwnedPdu::C2HTermReq { fes, fei },
            // A host framer never yields controller-side PDUs.
            Pdu::IcReq(_)
            | Pdu::CapsuleCmd { .. }
            | Pdu::H2CData { .. }
            | Pdu::H2CDataHead { .. }
            | Pdu::H2CDataTail { .. }
            | Pdu::H2CTermReq { .. } => OwnedPdu::C2HTermReq { fes: 0, fei: 0 },
        }
    }
}

/// Output the host machine queued: header bytes kept here, data as references to the
/// per-CID buffers, resolved when written.
#[derive(Default)]
struct Out {
    bytes: Vec<u8>,
    /// (is data, cid or start, offset or len, len)
    segs: Vec<Seg>,
}

#[derive(Clone, Copy)]
enum Seg {
    Bytes { start: usize, len: usize },
    Data { cid: u32, off: u32, len: u32 },
}

impl TxSink for Out {
    fn header(&mut self, b: &[u8]) {
        self.segs.push(Seg::Bytes {
            start: self.bytes.len(),
            len: b.len(),
        });
        self.bytes.extend_from_slice(b);
    }
    fn data(&mut self, cid: u32, off: u32, len: u32) {
        self.segs.push(Seg::Data { cid, off, len });
    }
    fn release(&mut self, _: u32) {}
}

/// One NVMe/TCP connection (one queue), host side: a blocking shell around
/// [`nvmf::tcp::HostQueue`], which builds and checks every PDU.
/// The connection under the NVMe/TCP PDUs: plain TCP or TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<nvmf_tls::SslStream<TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => t.get_ref(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(t) => t.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write_vectored(bufs),
            // One record for the pieces of a PDU rather than one per piece.
            Stream::Tls(t) => {
                let mut v = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
                for b in bufs {
                    v.extend_from_slice(b);
                    if v.len() >= 16 * 1024 {
                        break;
                    }
                }
                t.write(&v)
            }
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(t) => t.flush(),
        }
    }
}

pub struct TcpHost {
    stream: Stream,
    opts: HostOptions,
    q: HostQueue,
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    out: Out,
    qid: Option<u16>,
    /// The HOSTID this queue's Connect sent.
    connect_hostid: Option<[u8; 16]>,
    lba_size: u32,
    /// Each CID's buffer while its command is outstanding.
    bufs: Vec<Vec<u8>>,
    done: VecDeque<Completion>,
    pool: Vec<Vec<u8>>,
}

const RX_BUF: usize = 256 * 1024;
/// Slots before Connect says how deep the queue is (the admin queue's 32 entries).
const INITIAL_SLOTS: usize = 31;

fn host_err(e: HostError) -> Error {
    match e {
        HostError::Protocol(t) => Error::Protocol(t),
        HostError::Terminated { fes, fei } => Error::Terminated { fes, fei },
        HostError::IcResp(s) => Error::IcResp(s),
        HostError::Unexpected(s) => Error::Unexpected(s),
        HostError::QueueFull(n) => Error::QueueFull(n),
    }
}

impl TcpHost {
    /// Connects and exchanges ICReq/ICResp; the connection is then ready for Connect.
    pub fn connect(addr: impl ToSocketAddrs, opts: HostOptions) -> Result<TcpHost> {
        let mut h = TcpHost::connect_raw(addr, opts)?;
        h.q.start(&mut h.out);
        h.write_out()?;
        match h.recv_pdu()? {
            OwnedPdu::IcResp(r) => {
                let asked = Digests {
                    header: h.opts.header_digest,
                    data: h.opts.data_digest,
                };
                if r.digests != asked {
                    return Err(Error::IcResp(format!(
                        "asked digests {:?}, got {:?}",
                        asked, r.digests
                    )));
                }
                Ok(h)
            }
            OwnedPdu::C2HTermReq { fes, fei } => Err(Error::Terminated { fes, fei }),
            other => Err(Error::Unexpected(format!("{other:?} instead of ICResp"))),
        }
    }

    /// Connects without sending ICReq: for tests that send their own (malformed) PDUs with
    /// [`send_raw`](Self::send_raw). An ICResp received by [`recv_pdu`](Self::recv_pdu)
    /// still sets up digests and CPDA.
    pub fn connect_raw(addr: impl ToSocketAddrs, opts: HostOptions) -> Result<TcpHost> {
        let tcp = match opts.source {
            None => TcpStream::connect(addr)?,
            Some(from) => {
                let to = addr.to_socket_addrs()?.next().ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address")
                })?;
                connect_from(from, to)?
            }
        };
        tcp.set_nodelay(true)?;
        tcp.set_read_timeout(Some(opts.timeout))?;
        tcp.set_write_timeout(Some(opts.timeout))?;
        let stream = match &opts.tls {
            None => Stream::Plain(tcp),
            Some(psk) => {
                let ctx =
                    nvmf_tls::client_context(psk.clone()).map_err(|e| Error::Tls(e.to_string()))?;
                let s = nvmf_tls::Handshake::connect(&ctx, tcp)
                    .finish()
                    .map_err(|e| Error::Tls(e.to_string()))?;
                Stream::Tls(Box::new(s))
            }
        };
        let q = HostQueue::new(
            HostConfig {
                digests: Digests {
                    header: opts.header_digest,
                    data: opts.data_digest,
                },
                hpda: opts.hpda,
                maxr2t: opts.maxr2t,
                max_c2h_data: opts.max_c2h_data,
            },
            INITIAL_SLOTS,
        );
        Ok(TcpHost {
            stream,
            q,
            rx: vec![0; RX_BUF],
            rx_start: 0,
            rx_end: 0,
            out: Out::default(),
            qid: None,
            connect_hostid: None,
            lba_size: 512,
            bufs: vec![Vec::new(); INITIAL_SLOTS],
            done: VecDeque::new(),
            pool: Vec::new(),
            opts,
        })
    }

    fn resize_slots(&mut self, n: usize) {
        self.q.set_depth(n);
        if self.bufs.len() < n {
            self.bufs.resize(n, Vec::new());
        }
    }

    /// The ICResp (after [`connect`](Self::connect)).
    pub fn ic_resp(&self) -> Option<IcResp> {
        self.q.ic_resp()
    }
    pub fn digests(&self) -> Digests {
        self.q.digests()
    }
    /// How many commands may be outstanding at once.
    pub fn queue_depth(&self) -> usize {
        self.q.depth()
    }
    /// Commands submitted and not yet returned by `poll_completion`.
    pub fn outstanding(&self) -> usize {
        self.q.outstanding() + self.done.len()
    }
    /// Logical block size used by `write`/`compare` to compute NLB (default 512).
    pub fn set_lba_size(&mut self, n: u32) {
        self.lba_size = n.max(1);
    }
    /// In-capsule data limit of this queue.
    pub fn set_max_incapsule(&mut self, n: u32) {
        self.q.set_max_incapsule(n);
    }
    pub fn stream(&self) -> &TcpStream {
        self.stream.tcp()
    }

    /// Write what the machine queued, resolving data references against the buffers.
    fn write_out(&mut self) -> Result<()> {
        // A command is a handful of pieces (header, data, digest per PDU): no allocation
        // unless an R2T is answered with many H2CData PDUs at once.
        const INLINE: usize = 16;
        let mut inline: [&[u8]; INLINE] = [&[]; INLINE];
        let mut heap: Vec<&[u8]> = Vec::new();
        let n = self.out.segs.len();
        for (i, seg) in self.out.segs.iter().enumerate() {
            let part: &[u8] = match *seg {
                Seg::Bytes { start, len } => &self.out.bytes[start..start + len],
                Seg::Data { cid, off, len } => self
                    .bufs
                    .get(cid as usize)
                    .and_then(|b| b.get(off as usize..(off + len) as usize))
                    .unwrap_or(&[]),
            };
            if n <= INLINE {
                inline[i] = part;
            } else {
                heap.push(part);
            }
        }
        let parts = if n <= INLINE { &inline[..n] } else { &heap[..] };
        let res = write_all_vectored(&mut self.stream, parts);
        self.out.segs.clear();
        self.out.bytes.clear();
        res
    }

    // ---------------------------------------------------------------- raw access

    /// Writes bytes as they are.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes).map_err(io_err)
    }

    /// Receives the next PDU (validated by the host framer), or `Eof`/`Timeout`.
    pub fn recv_pdu(&mut self) -> Result<OwnedPdu> {
        loop {
            let avail = &self.rx[self.rx_start..self.rx_end];
            match self.q.receive_raw(avail, &mut self.out) {
                Ok(Some((pdu, n))) => {
                    let p = OwnedPdu::from_pdu(pdu);
                    self.rx_start += n;
                    return Ok(p);
                }
                Ok(None) => {
                    let need = self.q.needed();
                    self.fill(need)?;
                }
                Err(e) => {
                    // The H2CTermReq goes out best effort.
                    let _ = self.write_out();
                    return Err(host_err(e));
                }
            }
        }
    }

    /// Reads until at least `need` unparsed bytes are buffered.
    fn fill(&mut self, need: usize) -> Result<()> {
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
        }
        if self.rx_start + need > self.rx.len() {
            self.rx.copy_within(self.rx_start..self.rx_end, 0);
            self.rx_end -= self.rx_start;
            self.rx_start = 0;
            if need > self.rx.len() {
                self.rx.resize(need, 0);
            }
        }
        while self.rx_end - self.rx_start < need {
            match self.stream.read(&mut self.rx[self.rx_end..]) {
                Ok(0) => return Err(Error::Eof),
                Ok(n) => self.rx_end += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(e)),
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------- pipelined API

    /// Sends a command without waiting; returns its CID. Write data goes in-capsule when
    /// it fits this queue's limit, otherwise it is sent when the target asks (R2T).
    pub fn submit(&mut self, req: Request) -> Result<u16> {
        let Request { sqe, xfer, buf } = req;
        let cid = self
            .q
            .submit(&mut self.out, sqe, xfer, &buf)
            .map_err(host_err)?;
        self.bufs[cid as usize] = buf;
        self.write_out().map(|_| cid)
    }

    /// Waits for the next completion of any submitted command, answering R2Ts and taking
    /// C2HData on the way.
    pub fn poll_completion(&mut self) -> Result<Completion> {
        if let Some(c) = self.done.pop_front() {
            return Ok(c);
        }
        loop {
            if let Some(c) = self.step()? {
                return Ok(c);
            }
        }
    }

    /// Completions received while waiting for other commands and not taken yet (an AER
    /// that completed meanwhile, say).
    pub fn queued_completions(&self) -> usize {
        self.done.len()
    }

    /// Waits for command `cid`, queueing other completions for `poll_completion`.
    pub fn wait(&mut self, cid: u16) -> Result<Completion> {
        if let Some(i) = self.done.iter().position(|c| c.cid == cid) {
            return Ok(self.done.remove(i).expect("index from position"));
        }
        loop {
            if let Some(c) = self.step()? {
                if c.cid == cid {
                    return Ok(c);
                }
                self.done.push_back(c);
            }
        }
    }

    /// Handles one PDU; returns a completion if it finished a command.
    fn step(&mut self) -> Result<Option<Completion>> {
        loop {
            let avail = &self.rx[self.rx_start..self.rx_end];
            let (n, ev) = match self.q.receive(avail, &mut self.out) {
                Ok(r) => r,
                Err(e) => {
                    let _ = self.write_out();
                    return Err(host_err(e));
                }
            };
            let Some(ev) = ev else {
                let need = self.q.needed();
                self.fill(need)?;
                continue;
            };
            let res = match ev {
                HostEvent::Data { cid, offset, data } => {
                    if let Some(b) = self.bufs.get_mut(cid as usize) {
                        b[offset as usize..offset as usize + data.len()].copy_from_slice(data);
                    }
                    None
                }
                HostEvent::Completion { cid, cqe } => {
                    let buf = std::mem::take(&mut self.bufs[cid as usize]);
                    Some(Completion { cid, cqe, buf })
                }
                HostEvent::R2T {
                    cid,
                    ttag,
                    offset,
                    len,
                } => {
                    let part = &self.bufs[cid as usize][offset as usize..(offset + len) as usize];
                    self.q.send_data(&mut self.out, cid, ttag, offset, part);
                    self.rx_start += n;
                    self.write_out()?;
                    return Ok(None);
                }
                HostEvent::Connected(_) => None,
            };
            self.rx_start += n;
            return Ok(res);
        }
    }

    // ---------------------------------------------------------------- synchronous helpers

    fn take_buf(&mut self) -> Vec<u8> {
        let mut b = self.pool.pop().unwrap_or_default();
        b.clear();
        b
    }

    /// Runs one command to completion. `data_out` is sent, or `data_in_len` bytes are
    /// read; returns the CQE (whatever its status) and the read data.
    pub fn submit_admin_raw(
        &mut self,
        sqe: Sqe,
        data_out: &[u8],
        data_in_len: usize,
    ) -> Result<(Cqe, Vec<u8>)> {
        let c = self.exec(sqe, data_out, data_in_len)?;
        Ok((c.cqe, c.buf))
    }

    fn exec(&mut self, sqe: Sqe, data_out: &[u8], data_in_len: usize) -> Result<Completion> {
        let mut buf = self.take_buf();
        let xfer = if !data_out.is_empty() {
            buf.extend_from_slice(data_out);
            Xfer::ToController
        } else if data_in_len > 0 {
            buf.resize(data_in_len, 0);
            Xfer::FromController
        } else {
            Xfer::None
        };
        let cid = self.submit(Request { sqe, xfer, buf })?;
        self.wait(cid)
    }

    /// Like `exec` but a non-success status is an error; recycles the buffer.
    fn exec_ok(&mut self, sqe: Sqe, data_out: &[u8]) -> Result<Cqe> {
        let c = self.exec(sqe, data_out, 0)?;
        self.pool.push(c.buf);
        check(c.cqe)
    }

    fn exec_status(&mut self, sqe: Sqe, data_out: &[u8]) -> Result<Status> {
        let c = self.exec(sqe, data_out, 0)?;
        self.pool.push(c.buf);
        Ok(c.cqe.status())
    }

    fn connect_queue(
        &mut self,
        subnqn: &str,
        cntlid: u16,
        qid: u16,
        sqsize: u16,
        kato_ms: u32,
    ) -> Result<Cqe> {
        let cattr = if self.opts.disable_sq_flow_control {
            fabrics::CATTR_DISABLE_SQ_FLOW_CONTROL
        } else {
            0
        };
        let cmd = ConnectCommand {
            recfmt: 0,
            qid,
            sqsize,
            cattr,
            kato: kato_ms,
        };
        if qid != 0 {
            // The I/O queue's in-capsule limit applies from its Connect on.
            self.q.set_max_incapsule(self.opts.io_max_incapsule);
        }
        let hostid = if qid != 0 && self.opts.random_hostid_per_queue {
            random_hostid()
        } else {
            self.opts.hostid
        };
        self.connect_hostid = Some(hostid);
        // The Connect's own completion already reports SQHD FFFFh (nvmet does the same).
        self.q
            .set_sq_flow_control_disabled(self.opts.disable_sq_flow_control);
        let data = ConnectData::new(hostid, cntlid, subnqn, &self.opts.hostnqn);
        let cqe = self.exec_ok(cmd.to_sqe(0), data.as_bytes())?;
        self.qid = Some(qid);
        // At most SQSIZE (0's based) + 1 - 1 commands fit in the queue.
        self.resize_slots((sqsize as usize).max(1));
        Ok(cqe)
    }

    /// Fabrics Connect of the admin queue (QID 0, SQSIZE [`HostOptions::admin_sqsize`],
    /// CNTLID FFFFh); returns the controller ID.
    pub fn connect_admin(&mut self, subnqn: &str, kato_ms: u32) -> Result<u16> {
        let sqsize = self.opts.admin_sqsize;
        let cqe = self.connect_queue(subnqn, fabrics::CNTLID_DYNAMIC, 0, sqsize, kato_ms)?;
        Ok(cqe.dw0 as u16)
    }

    /// The HOSTID this queue's Connect sent.
    pub fn connect_hostid(&self) -> Option<[u8; 16]> {
        self.connect_hostid
    }

    /// Fabrics Connect of I/O queue `qid` to controller `cntlid` (SQSIZE 0's based).
    pub fn connect_io(&mut self, subnqn: &str, cntlid: u16, qid: u16, sqsize: u16) -> Result<()> {
        self.connect_queue(subnqn, cntlid, qid, sqsize, 0)
            .map(|_| ())
    }

    /// Property Get; `eight` for 8-byte properties (CAP).
    pub fn property_get(&mut self, offset: u32, eight: bool) -> Result<u64> {
        let p = PropertyCommand {
            attrib: eight as u8,
            offset,
            value: 0,
        };
        let cqe = self.exec_ok(p.to_sqe(0, false), &[])?;
        Ok(cqe.dw0 as u64 | (cqe.dw1 as u64) << 32)
    }

    pub fn property_set(&mut self, offset: u32, value: u64, eight: bool) -> Result<()> {
        let p = PropertyCommand {
            attrib: eight as u8,
            offset,
            value,
        };
        self.exec_ok(p.to_sqe(0, true), &[]).map(|_| ())
    }

    /// CC.EN = 1 with IOSQES 6, IOCQES 4 and CC.CSS [`HostOptions::cc_css`], then waits
    /// for CSTS.RDY (CAP.TO, at most the connection timeout).
    pub fn enable_controller(&mut self) -> Result<()> {
        let cap = self.property_get(fabrics::property::CAP, true)?;
        let cc = fabrics::cc::EN | 6 << 16 | 4 << 20 | ((self.opts.cc_css & 7) as u32) << 4;
        self.property_set(fabrics::property::CC, cc as u64, false)?;
        let to = Duration::from_millis(((cap >> fabrics::cap::TO_SHIFT) & 0xff).max(1) * 500);
        let deadline = Instant::now() + to.min(self.opts.timeout);
        loop {
            let csts = self.property_get(fabrics::property::CSTS, false)? as u32;
            if csts & fabrics::csts::CFS != 0 {
                return Err(Error::Unexpected("CSTS.CFS set while enabling".into()));
            }
            if csts & fabrics::csts::RDY != 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Identify (4096 bytes).
    pub fn identify(&mut self, cns: u8, nsid: u32) -> Result<Vec<u8>> {
        let mut sqe = Sqe::default();
        sqe.set_opcode_cid(admin::IDENTIFY, 0);
        sqe.nsid = nsid;
        sqe.cdw10 = cns as u32;
        self.exec_in(sqe, 4096)
    }

    fn exec_in(&mut self, sqe: Sqe, len: usize) -> Result<Vec<u8>> {
        let c = self.exec(sqe, &[], len)?;
        check(c.cqe)?;
        Ok(c.buf)
    }

    /// Get Log Page of `len` bytes (a multiple of 4) at byte `offset`.
    pub fn get_log_page(
        &mut self,
        lid: u8,
        nsid: u32,
        offset: u64,
        len: u32,
        rae: bool,
    ) -> Result<Vec<u8>> {
        if len == 0 || !len.is_multiple_of(4) {
            return Err(Error::InvalidArgument(
                "log page length must be a non-zero multiple of 4",
            ));
        }
        let numd = len / 4 - 1;
        let mut sqe = Sqe::default();
        sqe.set_opcode_cid(admin::GET_LOG_PAGE, 0);
        sqe.nsid = nsid;
        sqe.cdw10 = lid as u32 | (rae as u32) << 15 | (numd & 0xffff) << 16;
        sqe.cdw11 = numd >> 16;
        sqe.cdw12 = offset as u32;
        sqe.cdw13 = (offset >> 32) as u32;
        self.exec_in(sqe, len as usize)
    }

    /// Get Features; returns completion DW0.
    pub fn get_features(&mut self, fid: u8, nsid: u32, cdw11: u32) -> Result<u32> {
        let mut sqe = Sqe::default();
        sqe.set_opcode_cid(admin::GET_FEATURES, 0);
        sqe.nsid = nsid;
        sqe.cdw10 = fid as u32;
        sqe.cdw11 = cdw11;
        Ok(self.exec_ok(sqe, &[])?.dw0)
    }

    /// Set Features; returns completion DW0.
    pub fn set_features(&mut self, fid: u8, nsid: u32, cdw11: u32, save: bool) -> Result<u32> {
        let mut sqe = Sqe::default();
        sqe.set_opcode_cid(admin::SET_FEATURES, 0);
        sqe.nsid = nsid;
        sqe.cdw10 = fid as u32 | (save as u32) << 31;
        sqe.cdw11 = cdw11;
        Ok(self.exec_ok(sqe, &[])?.dw0)
    }

    pub fn keep_alive(&mut self) -> Result<()> {
        let mut sqe = Sqe::default();
        sqe.set_opcode_cid(admin::KEEP_ALIVE, 0);
        self.exec_ok(sqe, &[]).map(|_| ())
    }

    /// Read `nlb` blocks into `buf` (its length is the transfer length).
    pub fn read(&mut self, nsid: u32, slba: u64, nlb: u32, buf: &mut [u8]) -> Result<Status> {
        let c = self.exec(rw_sqe(io::READ, nsid, slba, nlb, false), &[], buf.len())?;
        buf.copy_from_slice(&c.buf);
        self.pool.push(c.buf);
        Ok(c.cqe.status())
    }

    fn nlb_of(&self, data: &[u8]) -> Result<u32> {
        if data.is_empty() || !data.len().is_multiple_of(self.lba_size as usize) {
            return Err(Error::InvalidArgument(
                "data length is not a non-zero multiple of the LBA size",
            ));
        }
        Ok((data.len() / self.lba_size as usize) as u32)
    }

    /// Write `data` (a multiple of the LBA size, see [`set_lba_size`](Self::set_lba_size)).
    pub fn write(&mut self, nsid: u32, slba: u64, data: &[u8], fua: bool) -> Result<Status> {
        let nlb = self.nlb_of(data)?;
        self.exec_status(rw_sqe(io::WRITE, nsid, slba, nlb, fua), data)
    }

    pub fn compare(&mut self, nsid: u32, slba: u64, data: &[u8]) -> Result<Status> {
        let nlb = self.nlb_of(data)?;
        self.exec_status(rw_sqe(io::COMPARE, nsid, slba, nlb, false), data)
    }

    pub fn flush(&mut self, nsid: u32) -> Result<Status> {
        let mut sqe = Sqe::default();
        sqe.set_opcode_cid(io::FLUSH, 0);
        sqe.nsid = nsid;
        self.exec_status(sqe, &[])
    }

    pub fn write_zeroes(&mut self, nsid: u32, slba: u64, nlb: u32) -> Result<Status> {
        self.exec_status(rw_sqe(io::WRITE_ZEROES, nsid, slba, nlb, false), &[])
    }

    /// Dataset Management with the Deallocate attribute for `(slba, nlb)` ranges (1..=256).
    pub fn dsm_deallocate(&mut self, nsid: u32, ranges: &[(u64, u32)]) -> Result<Status> {
        if ranges.is_empty() || ranges.len() > 256 {
            return Err(Error::InvalidArgument("DSM takes 1 to 256 ranges"));
        }
        let mut data = Vec::with_capacity(ranges.len() * 16);
        for &(slba, nlb) in ranges {
            data.extend_from_slice(&0u32.to_le_bytes()); // context attributes
            data.extend_from_slice(&nlb.to_le_bytes());
            data.extend_from_slice(&slba.to_le_bytes());
        }
        let mut sqe = Sqe::default();
        sqe.set_opcode_cid(io::DATASET_MANAGEMENT, 0);
        sqe.nsid = nsid;
        sqe.cdw10 = ranges.len() as u32 - 1;
        sqe.cdw11 = 1 << 2; // AD
        self.exec_status(sqe, &data)
    }

    /// Closes both directions of the socket.
    pub fn shutdown(&self) -> Result<()> {
        self.stream
            .tcp()
            .shutdown(std::net::Shutdown::Both)
            .map_err(Error::Io)
    }
}

/// A TCP connection to `to` from local address `from` (any port).
pub fn connect_from(
    from: std::net::IpAddr,
    to: std::net::SocketAddr,
) -> std::io::Result<TcpStream> {
    use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6};
    use std::net::SocketAddr;
    use std::os::fd::AsRawFd;
    let family = if to.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket::socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    let raw = fd.as_raw_fd();
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "address families differ");
    match (SocketAddr::new(from, 0), to) {
        (SocketAddr::V4(l), SocketAddr::V4(r)) => {
            socket::bind(raw, &SockaddrIn::from(l))?;
            socket::connect(raw, &SockaddrIn::from(r))?;
        }
        (SocketAddr::V6(l), SocketAddr::V6(r)) => {
            socket::bind(raw, &SockaddrIn6::from(l))?;
            socket::connect(raw, &SockaddrIn6::from(r))?;
        }
        _ => return Err(bad()),
    }
    Ok(TcpStream::from(fd))
}

fn check(cqe: Cqe) -> Result<Cqe> {
    let s = cqe.status();
    if s.is_success() {
        Ok(cqe)
    } else {
        Err(Error::Status(s, cqe))
    }
}

fn io_err(e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::Timeout,
        _ => Error::Io(e),
    }
}

/// `writev` until every part is out.
fn write_all_vectored(w: &mut Stream, parts: &[&[u8]]) -> Result<()> {
    let mut idx = 0;
    let mut off = 0;
    while idx < parts.len() {
        if off == parts[idx].len() {
            idx += 1;
            off = 0;
            continue;
        }
        let mut slices = [IoSlice::new(&[]); 4];
        let mut n = 0;
        slices[0] = IoSlice::new(&parts[idx][off..]);
        for (i, p) in parts[idx + 1..].iter().take(3).enumerate() {
            slices[i + 1] = IoSlice::new(p);
            n = i + 1;
        }
        match w.write_vectored(&slices[..=n]) {
            Ok(0) => return Err(Error::Eof),
            Ok(mut written) => {
                while written > 0 {
                    let left = parts[idx].len() - off;
                    if written < left {
                        off += written;
                        written = 0;
                    } else {
                        written -= left;
                        idx += 1;
                        off = 0;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(e)),
        }
    }
    Ok(())
}

impl TcpHost {
    /// DH-HMAC-CHAP on this queue (after its Connect answered with ATR): Negotiate,
    /// Challenge, Reply, Success1 and, when `ctrl_key` is given, Success2 (the controller
    /// proved itself too). On a failure the controller's answer or our AUTH_Failure2 has
    /// been exchanged; the error says which side refused.
    pub fn authenticate(
        &mut self,
        subnqn: &str,
        key: nvmf::auth::key::DhchapKey,
        ctrl_key: Option<nvmf::auth::key::DhchapKey>,
    ) -> Result<()> {
        use nvmf::auth::host::{HostConfig, HostTransaction};
        use nvmf::auth::msg::AuthCommand;
        let cfg = HostConfig::new(&self.opts.hostnqn, subnqn, key, ctrl_key);
        let mut tx = HostTransaction::new(cfg, self.qid.unwrap_or(0));
        let no_entropy = std::cell::Cell::new(false);
        let mut rng = |b: &mut [u8]| {
            if getrandom::getrandom(b).is_err() {
                no_entropy.set(true);
            }
        };
        let send = |h: &mut TcpHost, m: &[u8]| -> Result<()> {
            let sqe = AuthCommand::dhchap(m.len() as u32).to_sqe(0, true);
            let (cqe, _) = h.submit_admin_raw(sqe, m, 0)?;
            check(cqe).map(|_| ())
        };
        let receive = |h: &mut TcpHost| -> Result<Vec<u8>> {
            let sqe = AuthCommand::dhchap(4096).to_sqe(0, false);
            let (cqe, data) = h.submit_admin_raw(sqe, &[], 4096)?;
            check(cqe)?;
            Ok(data)
        };
        let auth_err = |e: nvmf::auth::host::HostError| Error::Auth(e.to_string());
        send(self, &tx.negotiate())?;
        let chal = receive(self)?;
        let reply = match tx.on_challenge(&chal, &mut rng) {
            // No OS randomness: give up rather than send predictable values.
            Ok(_) if no_entropy.get() => {
                return Err(Error::Auth("the OS random generator failed".into()))
            }
            Ok(r) => r,
            Err(e) => {
                if let Some(r) = e.failure2_reason() {
                    let _ = send(self, &tx.failure2(r));
                }
                return Err(auth_err(e));
            }
        };
        send(self, &reply)?;
        let s1 = receive(self)?;
        match tx.on_success1(&s1) {
            Ok(Some(s2)) => send(self, &s2),
            Ok(None) => Ok(()),
            Err(e) => {
                if let Some(r) = e.failure2_reason() {
                    let _ = send(self, &tx.failure2(r));
                }
                Err(auth_err(e))
            }
        }
    }
}
