//! The NVMe/TCP link of a soft-engine QP: the socket, its receive buffer and its
//! transmit queue around `nvmf::tcp::ControllerQueue`, which makes every protocol
//! decision. This file only moves bytes: it reads the socket, feeds the machine, acts on
//! what it reports, and writes the queued output with one `writev` per pass.

use std::collections::VecDeque;
use std::io::{IoSlice, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use nvmf_tls::{Handshake, MidHandshakeSslStream, SslContext, SslStream};

use nvmf::tcp::{ControllerEvent, ControllerLimits, ControllerQueue, FatalCause, TxSink};

use backend::ram::{LendSet, Lent};

use super::cmd::{Cmd, Core, QpState};
use crate::{Event, Limit, QpHandle, TransportErrorKind};

/// Most slices in one `writev`.
const IOV_MAX: usize = 64;

/// Where a TCP link's bytes go: a socket, TLS over a socket, or (in unit tests) an
/// in-memory pipe.
pub(super) enum Wire {
    Socket(TcpStream),
    /// A listener with TLS, before the handshake finished: the first byte tells TLS from
    /// plain NVMe/TCP (optional TLS), then the handshake runs, one step per readable event.
    TlsPending(Box<TlsPending>),
    /// TLS 1.3 up: every byte goes through OpenSSL's record layer.
    Tls(Box<TlsUp>),
    /// The handshake failed: nothing more is read or written (the socket, if still
    /// here, is only shut down; a failed OpenSSL handshake has already closed it).
    TlsFailed(Option<TcpStream>),
    #[cfg(test)]
    Memory(std::rc::Rc<std::cell::RefCell<super::tests::MemPipe>>),
}

impl Wire {
    /// Bytes go to the peer as written, without TLS (a plain socket, or a test pipe).
    pub fn is_plain(&self) -> bool {
        match self {
            Wire::Socket(_) => true,
            #[cfg(test)]
            Wire::Memory(_) => true,
            _ => false,
        }
    }
}

/// A TLS connection being set up.
pub(super) struct TlsPending {
    ctx: SslContext,
    required: bool,
    /// A host that does not finish the handshake by then is dropped.
    pub deadline: Instant,
    stage: Option<TlsStage>,
}

enum TlsStage {
    /// Nothing read yet.
    Fresh(TcpStream),
    Mid(MidHandshakeSslStream<TcpStream>),
}

pub(super) struct TlsUp {
    stream: SslStream<TcpStream>,
    /// Output gathered into records of up to 16 KiB (OpenSSL writes one slice at a time;
    /// this is where TLS loses the plain path's zero-copy `writev` of data buffers).
    stage: Vec<u8>,
}

/// Largest TLS record payload (RFC 8446 section 5.1).
const TLS_RECORD: usize = 16 * 1024;
/// The first byte of a TLS record carrying a handshake message (a ClientHello); an
/// NVMe/TCP ICReq starts with PDU type 00h.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// What the TLS layer has to tell the engine once: the handshake finished (PSK owner,
/// cipher) or failed (why).
pub(super) type TlsNews = Result<crate::TlsPeerInfo, String>;

impl Wire {
    /// A socket accepted on a TLS listener.
    pub fn tls(sock: TcpStream, ctx: SslContext, required: bool, deadline: Instant) -> Wire {
        Wire::TlsPending(Box::new(TlsPending {
            ctx,
            required,
            deadline,
            stage: Some(TlsStage::Fresh(sock)),
        }))
    }

    pub fn socket(&self) -> Option<&TcpStream> {
        match self {
            Wire::Socket(s) | Wire::TlsFailed(Some(s)) => Some(s),
            Wire::TlsFailed(None) => None,
            Wire::TlsPending(p) => match p.stage.as_ref()? {
                TlsStage::Fresh(s) => Some(s),
                TlsStage::Mid(m) => Some(m.get_ref()),
            },
            Wire::Tls(t) => Some(t.stream.get_ref()),
            #[cfg(test)]
            Wire::Memory(_) => None,
        }
    }

    /// Decrypted bytes OpenSSL holds that the socket will not signal again.
    fn tls_buffered(&self) -> bool {
        matches!(self, Wire::Tls(t) if t.stream.ssl().pending() > 0)
    }

    /// The handshake deadline, while one is running.
    pub fn tls_deadline(&self) -> Option<Instant> {
        match self {
            Wire::TlsPending(p) => Some(p.deadline),
            _ => None,
        }
    }

    /// Reads into `a`, then `b`, in one call, when the wire can (a plain socket: one
    /// `readv`); `None` on TLS, which decrypts record by record into its own buffer.
    fn read_split(&mut self, a: &mut [u8], b: &mut [u8]) -> Option<std::io::Result<usize>> {
        match self {
            Wire::Socket(s) => {
                let mut v = [std::io::IoSliceMut::new(a), std::io::IoSliceMut::new(b)];
                Some(s.read_vectored(&mut v))
            }
            #[cfg(test)]
            Wire::Memory(p) => {
                let mut p = p.borrow_mut();
                Some(p.target_read(a).map(|n| {
                    if n < a.len() {
                        n
                    } else {
                        n + p.target_read(b).unwrap_or(0)
                    }
                }))
            }
            _ => None,
        }
    }

    /// Reads; on a pending TLS link this first advances the handshake (and reports its
    /// outcome through `news`).
    fn read(&mut self, buf: &mut [u8], news: &mut Option<TlsNews>) -> std::io::Result<usize> {
        if let Wire::TlsPending(_) = self {
            self.advance_tls(news)?;
        }
        match self {
            Wire::Socket(s) => s.read(buf),
            Wire::Tls(t) => t.stream.read(buf),
            Wire::TlsPending(_) => Err(std::io::ErrorKind::WouldBlock.into()),
            Wire::TlsFailed(_) => Err(std::io::Error::other("TLS handshake failed")),
            #[cfg(test)]
            Wire::Memory(p) => p.borrow_mut().target_read(buf),
        }
    }

    /// One step of a pending TLS setup: sniff the first byte, run the handshake.
    fn advance_tls(&mut self, news: &mut Option<TlsNews>) -> std::io::Result<()> {
        let Wire::TlsPending(p) = self else {
            return Ok(());
        };
        let Some(stage) = p.stage.take() else {
            return Err(std::io::Error::other("TLS state lost"));
        };
        let hs = match stage {
            TlsStage::Fresh(sock) => {
                let mut first = [0u8; 1];
                match sock.peek(&mut first) {
                    Ok(0) => {
                        // Closed before saying anything: a plain close, not a TLS failure.
                        *self = Wire::Socket(sock);
                        return Ok(());
                    }
                    Ok(_) if first[0] != TLS_HANDSHAKE_RECORD => {
                        if p.required {
                            *news = Some(Err(format!(
                                "TLS required on this listener and the host spoke plain NVMe/TCP \
                                 (first byte {:#04x}; nvme connect needs --tls)",
                                first[0]
                            )));
                            *self = Wire::TlsFailed(Some(sock));
                            return Err(std::io::Error::other("TLS required"));
                        }
                        // Optional TLS and a plain host: NVMe/TCP as usual.
                        *self = Wire::Socket(sock);
                        return Ok(());
                    }
                    Ok(_) => Handshake::accept(&p.ctx, sock),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        p.stage = Some(TlsStage::Fresh(sock));
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                }
            }
            TlsStage::Mid(m) => Handshake::resume(m),
        };
        match hs {
            Handshake::Pending(m) => {
                p.stage = Some(TlsStage::Mid(m));
                Ok(())
            }
            Handshake::Done(stream) => {
                let peer = nvmf_tls::peer_psk(stream.ssl());
                let cipher = stream
                    .ssl()
                    .current_cipher()
                    .map_or_else(String::new, |c| c.name().to_string());
                *news = Some(match peer {
                    Some(e) => Ok(crate::TlsPeerInfo {
                        generated: nvmf::auth::tls::parse_identity(&e.identity)
                            .is_some_and(|(_, g, ..)| g),
                        identity: e.identity.clone(),
                        hostnqn: e.hostnqn.clone(),
                        subnqn: e.subnqn.clone(),
                        cipher,
                    }),
                    None => Err("TLS handshake finished without a PSK".to_string()),
                });
                if matches!(news, Some(Err(_))) {
                    *self = Wire::TlsFailed(None);
                    return Err(std::io::Error::other("no PSK"));
                }
                *self = Wire::Tls(Box::new(TlsUp {
                    stream,
                    stage: Vec::with_capacity(TLS_RECORD),
                }));
                Ok(())
            }
            Handshake::Failed(e) => {
                *news = Some(Err(e.to_string()));
                // The failed handshake took the socket with it (closing it also takes it
                // out of the epoll set).
                *self = Wire::TlsFailed(None);
                Err(std::io::Error::other("TLS handshake failed"))
            }
        }
    }

    /// `write_vectored` that treats EINTR as a retry and EAGAIN as "wrote nothing".
    fn writev(&mut self, slices: &[IoSlice<'_>]) -> std::io::Result<usize> {
        if let Wire::Tls(t) = self {
            return t.write_records(slices);
        }
        loop {
            let r = match self {
                Wire::Socket(s) => s.write_vectored(slices),
                // Nothing is sent before the handshake is done (the queue machine has
                // not seen an ICReq yet), and nothing after it failed.
                Wire::TlsPending(_) | Wire::TlsFailed(_) => return Ok(0),
                Wire::Tls(_) => unreachable!("handled above"),
                #[cfg(test)]
                Wire::Memory(p) => p.borrow_mut().target_write(slices),
            };
            match r {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(0),
                Err(e) => return Err(e),
            }
        }
    }

    pub fn shutdown(&self) {
        if let Some(s) = self.socket() {
            // Fails only when the peer already closed it: closed either way.
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        #[cfg(test)]
        if let Wire::Memory(p) = self {
            p.borrow_mut().target_closed = true;
        }
    }
}

impl TlsUp {
    /// Writes the slices as TLS records of up to 16 KiB until the socket is full; returns
    /// the plaintext bytes accepted. A record OpenSSL could not finish is retried with the
    /// same leading bytes on the next call (the queue still holds them), as OpenSSL
    /// requires after SSL_ERROR_WANT_WRITE.
    fn write_records(&mut self, slices: &[IoSlice<'_>]) -> std::io::Result<usize> {
        let mut done = 0usize;
        let total: usize = slices.iter().map(|s| s.len()).sum();
        while done < total {
            // Gather the next record from the slices, skipping what was written.
            self.stage.clear();
            let mut skip = done;
            for s in slices {
                if skip >= s.len() {
                    skip -= s.len();
                    continue;
                }
                let part = &s[skip..];
                skip = 0;
                let take = part.len().min(TLS_RECORD - self.stage.len());
                self.stage.extend_from_slice(&part[..take]);
                if self.stage.len() == TLS_RECORD {
                    break;
                }
            }
            match self.stream.write(&self.stage) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    return if done > 0 { Ok(done) } else { Err(e) };
                }
            }
        }
        Ok(done)
    }
}

/// One TCP connection's state in the engine.
pub(super) struct TcpLink {
    pub wire: Wire,
    pub machine: ControllerQueue,
    pub tx: TxQueue,
    /// How the TLS handshake ended, on a TLS link.
    pub tls: Option<Box<TlsNews>>,
}

/// H2CData PDUs with at least this much data are streamed: their payload goes from the
/// socket straight into the command's buffer (one copy, the kernel's) instead of through
/// the receive buffer.
const STREAM_MIN: u32 = 16 * 1024;

/// While large host data is streaming, reads into the receive buffer take at most this
/// much, so the next PDU's header comes in with only a little of its payload (which is
/// copied) and the rest is read straight into its command's buffer.
const SMALL_FILL: usize = 8 * 1024;

/// How many PDUs after a streamed one the receive buffer keeps to [`SMALL_FILL`] reads.
const SMALL_FILL_PDUS: u8 = 32;

impl TcpLink {
    pub fn new(wire: Wire, limits: ControllerLimits) -> TcpLink {
        let mut machine = ControllerQueue::new(limits);
        machine.set_stream_host_data(STREAM_MIN);
        TcpLink {
            wire,
            machine,
            tx: TxQueue::default(),
            tls: None,
        }
    }
}

/// Bytes read from the socket and not yet parsed: `buf[head..tail]`. It starts at
/// [`RX_INITIAL`] bytes and grows (up to `max`) only when a PDU needs more or the socket
/// keeps filling it; an idle connection's buffer shrinks back ([`RxBuf::shrink_if_idle`]).
/// So an idle connection costs a few KiB, not the largest PDU it could send.
pub(super) struct RxBuf {
    pub buf: Box<[u8]>,
    pub head: usize,
    pub tail: usize,
    max: usize,
    /// PDUs to go with [`SMALL_FILL`] reads (set when a PDU is streamed).
    small_fills: u8,
}

/// A receive buffer's size while its connection is idle: ICReq, Connect and admin
/// capsules fit.
pub(super) const RX_INITIAL: usize = 4096;

pub(super) enum RxResult {
    /// Read this many bytes (0: nothing available now).
    Read(usize),
    Closed,
    Error,
}

impl RxBuf {
    /// A buffer that may grow to `max` bytes.
    pub fn new(max: usize) -> RxBuf {
        let cap = RX_INITIAL.min(max);
        RxBuf {
            buf: vec![0u8; cap].into_boxed_slice(),
            head: 0,
            tail: 0,
            max,
            small_fills: 0,
        }
    }

    /// Make room for a PDU of `needed` bytes (or, with `needed` 0, double: the socket
    /// filled the buffer), keeping what is pending, within `max`.
    fn grow(&mut self, needed: usize) {
        let want = if needed == 0 {
            self.buf.len() * 2
        } else {
            needed.next_power_of_two()
        }
        .min(self.max);
        if want <= self.buf.len() {
            return;
        }
        let mut b = vec![0u8; want].into_boxed_slice();
        let n = self.tail - self.head;
        b[..n].copy_from_slice(&self.buf[self.head..self.tail]);
        self.buf = b;
        self.head = 0;
        self.tail = n;
    }

    /// Give memory back once nothing is pending.
    pub fn shrink_if_idle(&mut self) {
        if self.head == self.tail && self.buf.len() > RX_INITIAL {
            self.buf = vec![0u8; RX_INITIAL].into_boxed_slice();
            self.head = 0;
            self.tail = 0;
        }
    }

    pub fn pending(&self) -> &[u8] {
        &self.buf[self.head..self.tail]
    }

    /// Read what the wire has, making room first when the free tail is small.
    fn fill(&mut self, wire: &mut Wire, news: &mut Option<TlsNews>) -> RxResult {
        if self.head == self.tail {
            self.head = 0;
            self.tail = 0;
        } else if self.buf.len() - self.tail < self.buf.len() / 4 {
            self.buf.copy_within(self.head..self.tail, 0);
            self.tail -= self.head;
            self.head = 0;
        }
        let mut total = 0;
        let limit = if self.small_fills > 0 {
            (self.tail + SMALL_FILL).min(self.buf.len())
        } else {
            self.buf.len()
        };
        while self.tail < limit {
            let asked = limit - self.tail;
            match wire.read(&mut self.buf[self.tail..limit], news) {
                Ok(0) => {
                    return if total > 0 {
                        RxResult::Read(total)
                    } else {
                        RxResult::Closed
                    }
                }
                Ok(n) => {
                    self.tail += n;
                    total += n;
                    // A plain socket that gave less than asked for has nothing more now;
                    // its level-triggered epoll interest reports the next bytes (or the
                    // close). Asking again would cost a syscall that says EAGAIN on
                    // every pass. (TLS hands out one record at a time: read on.)
                    if n < asked && matches!(wire, Wire::Socket(_)) {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    return if total > 0 {
                        RxResult::Read(total)
                    } else {
                        RxResult::Error
                    }
                }
            }
        }
        RxResult::Read(total)
    }
}

/// Largest PDU header (with header digest and data padding) kept inline in a segment.
const SMALL_MAX: usize = 184;

/// One piece of output, in order.
pub(super) enum TxSeg {
    /// A PDU header or a whole small PDU, copied inline (no allocation).
    Small { len: u8, bytes: [u8; SMALL_MAX] },
    /// `len` bytes of a command's data buffer starting at `off`.
    Data { cmd: u32, off: u32, len: u32 },
    /// Once everything before this is on the wire, the command slot can be freed.
    Release { cmd: u32 },
}

#[derive(Default)]
pub(super) struct TxQueue {
    pub segs: VecDeque<TxSeg>,
    /// Bytes of the front segment already written.
    pub front_done: usize,
}

impl TxSink for TxQueue {
    fn header(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(SMALL_MAX) {
            let mut b = [0u8; SMALL_MAX];
            b[..chunk.len()].copy_from_slice(chunk);
            self.segs.push_back(TxSeg::Small {
                len: chunk.len() as u8,
                bytes: b,
            });
        }
    }
    fn data(&mut self, slot: u32, offset: u32, len: u32) {
        self.segs.push_back(TxSeg::Data {
            cmd: slot,
            off: offset,
            len,
        });
    }
    fn release(&mut self, slot: u32) {
        self.segs.push_back(TxSeg::Release { cmd: slot });
    }
}

impl TxQueue {
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// Account for `n` bytes written from the front; release markers reached are
    /// appended to `released`.
    fn advance(&mut self, mut n: usize, released: &mut Vec<u32>) {
        loop {
            match self.segs.front() {
                Some(TxSeg::Release { cmd }) => {
                    released.push(*cmd);
                    self.segs.pop_front();
                }
                Some(seg) => {
                    let left = seg_len(seg) - self.front_done;
                    if n >= left {
                        n -= left;
                        self.front_done = 0;
                        self.segs.pop_front();
                    } else {
                        self.front_done += n;
                        return;
                    }
                }
                None => return,
            }
        }
    }

    /// Drop everything queued; the slots whose release markers were dropped go to
    /// `released`.
    pub fn discard(&mut self, released: &mut Vec<u32>) {
        for seg in self.segs.drain(..) {
            if let TxSeg::Release { cmd } = seg {
                released.push(cmd);
            }
        }
        self.front_done = 0;
    }
}

/// Write as much queued output as the wire takes, `IOV_MAX` slices per `writev`, looping
/// while it takes everything. Slots whose release marker went out go to `released`.
/// Returns how many bytes were written.
///
/// Lent reads ([`Cmd::lent`]) go out straight from their RAM store: each `writev` that
/// carries some holds the read locks of their stripes while the kernel copies them (one
/// store per `writev`, a bounded set of stripes). Writers of those stripes on other IO
/// threads wait for that one non-blocking call, whose copy the socket's send buffer
/// bounds. (Capping such a call at 256 KiB to shorten the wait cost 128 KiB reads a
/// third of their throughput: 0.87 against the copying build, 1.25 without the cap.)
/// A lent read the socket took only part of gets the rest of its bytes copied into its
/// buffer before the locks go, so every block the host receives is one version of it.
pub(super) fn flush(
    link: &mut TcpLink,
    cmds: &mut [Cmd],
    released: &mut Vec<u32>,
) -> std::io::Result<usize> {
    let mut written = 0;
    let mut set = LendSet::default();
    loop {
        // Which segments go in this writev, and which store stripes they need.
        set.clear();
        let mut src: Option<super::cmd::ThreadStore> = None;
        let mut slices = 0;
        let mut segs = 0;
        let mut skip = link.tx.front_done;
        for seg in link.tx.segs.iter() {
            if slices == IOV_MAX {
                break;
            }
            if let TxSeg::Data { cmd, off, len } = seg {
                let lent = cmds.get(*cmd as usize).and_then(|c| c.lent.as_ref());
                if let Some(l) = lent {
                    match &src {
                        Some(s) if !Arc::ptr_eq(s, &l.src) => break,
                        _ => {}
                    }
                    if !set.add(l.off + *off as usize, *len as usize) {
                        break;
                    }
                    src.get_or_insert_with(|| l.src.clone());
                }
            }
            segs += 1;
            if !matches!(seg, TxSeg::Release { .. }) && seg_len(seg) > skip {
                slices += 1;
            }
            skip = 0;
        }
        let (w, total) = match src {
            None => write_segs(link, cmds, None, segs, released)?,
            Some(src) => src.lend(&set, |lent| {
                let (w, total) = write_segs(link, cmds, Some(lent), segs, released)?;
                if w < total {
                    keep_version(link, cmds, lent)?;
                }
                Ok::<_, std::io::Error>((w, total))
            })?,
        };
        written += w;
        if w < total || total == 0 || link.tx.is_empty() {
            return Ok(written);
        }
    }
}

fn seg_len(seg: &TxSeg) -> usize {
    match seg {
        TxSeg::Small { len, .. } => *len as usize,
        TxSeg::Data { len, .. } => *len as usize,
        TxSeg::Release { .. } => 0,
    }
}

/// One `writev` of the first `segs` queued segments (from `front_done` on), then the
/// queue advanced past what it took. Lent reads' bytes come from `lent`; the planning in
/// [`flush`] put every lent segment among them under its locks. Returns the bytes
/// written and the bytes offered (0 when there was nothing to write, only release
/// markers).
fn write_segs(
    link: &mut TcpLink,
    cmds: &[Cmd],
    lent: Option<&Lent<'_>>,
    segs: usize,
    released: &mut Vec<u32>,
) -> std::io::Result<(usize, usize)> {
    let mut iov = [IoSlice::new(&[]); IOV_MAX];
    let mut n = 0;
    let mut total = 0;
    let mut skip = link.tx.front_done;
    for seg in link.tx.segs.iter().take(segs) {
        let s: &[u8] = match seg {
            TxSeg::Small { len, bytes } => &bytes[..*len as usize],
            TxSeg::Data { cmd, off, len } => {
                let (off, len) = (*off as usize, *len as usize);
                match cmds.get(*cmd as usize) {
                    Some(Cmd { lent: Some(l), .. }) => {
                        // Planned under the locks by `flush`. Were it not, nothing of it
                        // may be sent, and a queue that cannot move is an error, not a
                        // wait for EPOLLOUT that would come at once, again and again.
                        match lent.and_then(|lent| lent.bytes(l.off + off, len)) {
                            Some(b) => b,
                            None => {
                                return Err(std::io::Error::other(
                                    "a lent read's stripes were not locked",
                                ))
                            }
                        }
                    }
                    Some(c) => c
                        .buf
                        .as_ref()
                        .map_or(&[][..], |b| &b.as_slice()[off..off + len]),
                    None => &[][..],
                }
            }
            TxSeg::Release { .. } => continue,
        };
        let s = &s[skip.min(s.len())..];
        skip = 0;
        if !s.is_empty() {
            iov[n] = IoSlice::new(s);
            n += 1;
            total += s.len();
        }
    }
    let w = if n == 0 {
        0
    } else {
        link.wire.writev(&iov[..n])?
    };
    link.tx.advance(w, released);
    Ok((w, total))
}

/// After a short write under `lent`: when the front segment is a lent read the socket
/// took part of, the rest of its bytes are copied into its buffer from the same locked
/// bytes, and it is sent from there on. Every block then reaches the host as one
/// version, whatever a writer does once the locks are released.
fn keep_version(link: &TcpLink, cmds: &mut [Cmd], lent: &Lent<'_>) -> std::io::Result<()> {
    if link.tx.front_done == 0 {
        return Ok(());
    }
    let Some(TxSeg::Data { cmd, .. }) = link.tx.segs.front() else {
        return Ok(());
    };
    let Some(c) = cmds.get_mut(*cmd as usize) else {
        return Ok(());
    };
    let (Some(l), Some(b)) = (c.lent.as_ref(), c.buf.as_mut()) else {
        return Ok(());
    };
    // The segment is the read's whole data from offset 0: its unsent rest is `sent..`.
    let sent = link.tx.front_done;
    if !lent.copy_to(l.off + sent, &mut b.as_mut_slice()[sent..]) {
        // The segment was sent under these locks, so only a mapped file's read can fail
        // (the file shrank). The host must not get the rest of this read from anywhere
        // else: the connection fails.
        return Err(std::io::Error::other(
            "the rest of a lent read could not be copied",
        ));
    }
    c.lent = None;
    Ok(())
}

/// Read what the socket of QP `h` has and feed it to the queue machine; returns whether
/// anything happened. Input stops (and the application hears of it) on a fatal error, a
/// TermReq from the host, or the peer closing.
pub(super) fn service_rx(core: &mut Core, h: QpHandle, rx: &mut RxBuf, st: &mut QpState) -> bool {
    let mut did = false;
    // Whether a PDU was completed here: the one still arriving, if any, began now.
    let mut pdu_done = false;
    // A buffer that had to grow for the PDU at hand is filled again at once (at most a
    // few times: it grows to its bound at most).
    for _ in 0..4 {
        let super::cmd::Link::Tcp(link) = &mut st.link else {
            return did;
        };
        let mut news = None;
        let streaming = link.machine.inflow().is_some();
        let mut got = match read_inflow(core, h, rx, link) {
            Some(r) => r,
            None => rx.fill(&mut link.wire, &mut news),
        };
        // A streamed payload that ended is a PDU done (its tail may name no event).
        pdu_done |= streaming && link.machine.inflow().is_none();
        let mut full = rx.tail == rx.buf.len();
        if let Some(result) = news.take() {
            // Before any capsule of this connection: the application learns who the PSK
            // belongs to (or why the handshake failed) first.
            core.events.push_back(crate::Event::Tls {
                qp: h,
                qp_user: st.user,
                ok: result.is_ok(),
            });
            link.tls = Some(Box::new(result));
            did = true;
        }
        // Parse whatever is complete, even when the peer closed after sending it. With
        // TLS, OpenSSL may still hold decrypted bytes that no epoll event will announce:
        // read them as soon as the parser has made room.
        loop {
            while !st.rx_stopped {
                let super::cmd::Link::Tcp(link) = &mut st.link else {
                    break;
                };
                if let Some(f) = link.machine.inflow() {
                    // Streamed payload that came in with the PDU's header.
                    let n = rx.pending().len().min(f.len as usize);
                    if n == 0 {
                        break;
                    }
                    let chunk = &rx.buf[rx.head..rx.head + n];
                    link.machine.inflow_received(chunk);
                    pdu_done |= link.machine.inflow().is_none();
                    if !f.discard {
                        core.on_host_data(h, st, f.ttag as u32, f.offset, chunk, None);
                    }
                    rx.head += n;
                    did = true;
                    continue;
                }
                let (used, ev) = link.machine.receive(rx.pending(), &mut link.tx);
                let Some(ev) = ev else {
                    rx.head += used;
                    break;
                };
                did = true;
                pdu_done = true;
                if !link.tx.is_empty() {
                    core.mark_tx(st);
                }
                let streamed = matches!(ev, ControllerEvent::HostDataStart { .. });
                on_event(core, h, st, ev);
                rx.head += used;
                rx.small_fills = if streamed {
                    SMALL_FILL_PDUS
                } else {
                    rx.small_fills.saturating_sub(1)
                };
            }
            let super::cmd::Link::Tcp(link) = &mut st.link else {
                break;
            };
            if st.rx_stopped || !link.wire.tls_buffered() || !matches!(got, RxResult::Read(_)) {
                break;
            }
            let before = rx.tail - rx.head;
            got = rx.fill(&mut link.wire, &mut news);
            full |= rx.tail == rx.buf.len();
            if rx.tail - rx.head == before {
                break;
            }
        }
        match got {
            RxResult::Read(n) => did |= n > 0,
            RxResult::Closed | RxResult::Error => {
                let kind = if matches!(got, RxResult::Closed) {
                    TransportErrorKind::PeerClosed
                } else {
                    TransportErrorKind::Io
                };
                st.rx_stopped = true;
                core.transport_error(h, st, kind);
                return true;
            }
        }
        let super::cmd::Link::Tcp(link) = &st.link else {
            break;
        };
        if st.rx_stopped {
            break;
        }
        // A PDU larger than the buffer, or a socket that had more than it held: grow,
        // and read on.
        let needed = link.machine.needed();
        let before = rx.buf.len();
        if needed > before {
            rx.grow(needed);
        } else if full {
            rx.grow(0);
        }
        if rx.buf.len() == before {
            break;
        }
    }
    note_partial_pdu(core.now, rx, st, pdu_done);
    did
}

/// Keep [`QpState::partial_since`]: bytes left over that the queue machine could not
/// make a PDU of yet, or a payload still streaming, are a PDU under way (the machine only
/// stops short of a whole PDU when it has not all arrived). Its time is that of the pass
/// that completed the PDU before it, or saw its first bytes.
fn note_partial_pdu(now: Instant, rx: &RxBuf, st: &mut QpState, pdu_done: bool) {
    let super::cmd::Link::Tcp(link) = &st.link else {
        return;
    };
    let under_way = !rx.pending().is_empty() || link.machine.inflow().is_some();
    st.partial_since = match (under_way, st.partial_since) {
        (false, _) => None,
        (true, Some(t)) if !pdu_done => Some(t),
        (true, _) => Some(now),
    };
}

/// With the receive buffer empty and a streamed payload under way, read the socket
/// straight into the command's buffer, and what follows the payload (at most
/// [`SMALL_FILL`] bytes) into the receive buffer, in one `readv`. `None` when that does
/// not apply (no payload pending, bytes still buffered, a TLS link, a command with
/// nowhere to put its data): read the usual way then.
fn read_inflow(
    core: &mut Core,
    h: QpHandle,
    rx: &mut RxBuf,
    link: &mut TcpLink,
) -> Option<RxResult> {
    if rx.head != rx.tail {
        return None;
    }
    let f = link.machine.inflow().filter(|f| !f.discard)?;
    let dst = core.host_data_dest(h, f.ttag as u32, f.offset, f.len)?;
    rx.head = 0;
    rx.tail = 0;
    let small = rx.buf.len().min(SMALL_FILL);
    let r = link.wire.read_split(dst, &mut rx.buf[..small])?;
    Some(match r {
        Ok(0) => RxResult::Closed,
        Ok(n) => {
            let k = n.min(dst.len());
            link.machine.inflow_received(&dst[..k]);
            rx.tail = n - k;
            RxResult::Read(n)
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => RxResult::Read(0),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => RxResult::Read(0),
        Err(_) => RxResult::Error,
    })
}

/// Act on what the queue machine made of one PDU.
fn on_event(core: &mut Core, h: QpHandle, st: &mut QpState, ev: ControllerEvent<'_>) {
    match ev {
        ControllerEvent::Connected(r) => {
            tracing::debug!(qp = h.as_u64(), hpda = r.hpda, digests = ?r.digests, "tcp: ICReq");
        }
        ControllerEvent::Command {
            sqe,
            data,
            data_digest_ok,
        } => core.on_capsule(h, st, &sqe, data, data_digest_ok),
        ControllerEvent::HostData {
            ttag,
            offset,
            data,
            complete,
        } => core.on_host_data(h, st, ttag as u32, offset, data, complete),
        // The payload follows (`service_rx` moves it).
        ControllerEvent::HostDataStart { .. } => {}
        // Terminations are logged (rate-limited) and counted by the application from
        // `Event::Terminated`; here only at debug level.
        ControllerEvent::HostTerminated { fes, fei } => {
            tracing::debug!(
                qp = h.as_u64(),
                fes,
                fei,
                "host terminated the connection (H2CTermReq)"
            );
            core.events.push_back(Event::Terminated {
                qp: h,
                qp_user: st.user,
                by_host: true,
                icreq: false,
                fes,
                fei,
                limit: None,
            });
            st.rx_stopped = true;
            core.transport_error(h, st, TransportErrorKind::PeerClosed);
        }
        ControllerEvent::Fatal { fes, fei, cause } => {
            tracing::debug!(
                qp = h.as_u64(),
                fes,
                fei,
                ?cause,
                "fatal NVMe/TCP error from host: C2HTermReq sent, closing"
            );
            let limit = match cause {
                FatalCause::QueueOverflow => Some(Limit::QueueDepth),
                _ => None,
            };
            core.events.push_back(Event::Terminated {
                qp: h,
                qp_user: st.user,
                by_host: false,
                icreq: cause == FatalCause::IcReqRejected,
                fes,
                fei,
                limit,
            });
            st.rx_stopped = true;
            core.mark_tx(st);
            match limit {
                Some(l) => {
                    core.counters.hit(l);
                    core.transport_error(h, st, TransportErrorKind::Limit(l));
                }
                None => core.transport_error(h, st, TransportErrorKind::Protocol),
            }
        }
    }
}
