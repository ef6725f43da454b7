//! The NVMe/TCP link of a soft-engine QP: the socket, its receive buffer and its
//! transmit queue around `nvmf::tcp::ControllerQueue`, which makes every protocol
//! decision. This file only moves bytes: it reads the socket, feeds the machine, acts on
//! what it reports, and writes the queued output with one `writev` per pass.

use std::collections::VecDeque;
use std::io::{IoSlice, Read, Write};
use std::net::TcpStream;

use nvmf::tcp::{ControllerEvent, ControllerLimits, ControllerQueue, FatalCause, TxSink};

use super::cmd::{Cmd, Core, QpState};
use crate::{Event, Limit, QpHandle, TransportErrorKind};

/// Most slices in one `writev`.
const IOV_MAX: usize = 64;

/// Where a TCP link's bytes go: a socket, or (in unit tests) an in-memory pipe.
pub(super) enum Wire {
    Socket(TcpStream),
    #[cfg(test)]
    Memory(std::rc::Rc<std::cell::RefCell<super::tests::MemPipe>>),
}

impl Wire {
    pub fn socket(&self) -> Option<&TcpStream> {
        match self {
            Wire::Socket(s) => Some(s),
            #[cfg(test)]
            Wire::Memory(_) => None,
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Wire::Socket(s) => s.read(buf),
            #[cfg(test)]
            Wire::Memory(p) => p.borrow_mut().target_read(buf),
        }
    }

    /// `write_vectored` that treats EINTR as a retry and EAGAIN as "wrote nothing".
    fn writev(&mut self, slices: &[IoSlice<'_>]) -> std::io::Result<usize> {
        loop {
            let r = match self {
                Wire::Socket(s) => s.write_vectored(slices),
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
        match self {
            Wire::Socket(s) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            #[cfg(test)]
            Wire::Memory(p) => p.borrow_mut().target_closed = true,
        }
    }
}

/// One TCP connection's state in the engine.
pub(super) struct TcpLink {
    pub wire: Wire,
    pub machine: ControllerQueue,
    pub tx: TxQueue,
}

impl TcpLink {
    pub fn new(wire: Wire, limits: ControllerLimits) -> TcpLink {
        TcpLink {
            wire,
            machine: ControllerQueue::new(limits),
            tx: TxQueue::default(),
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
    fn fill(&mut self, wire: &mut Wire) -> RxResult {
        if self.head == self.tail {
            self.head = 0;
            self.tail = 0;
        } else if self.buf.len() - self.tail < self.buf.len() / 4 {
            self.buf.copy_within(self.head..self.tail, 0);
            self.tail -= self.head;
            self.head = 0;
        }
        let mut total = 0;
        while self.tail < self.buf.len() {
            match wire.read(&mut self.buf[self.tail..]) {
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
                    let len = match seg {
                        TxSeg::Small { len, .. } => *len as usize,
                        TxSeg::Data { len, .. } => *len as usize,
                        TxSeg::Release { .. } => 0,
                    };
                    let left = len - self.front_done;
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
pub(super) fn flush(
    link: &mut TcpLink,
    cmds: &[Cmd],
    released: &mut Vec<u32>,
) -> std::io::Result<usize> {
    let mut written = 0;
    loop {
        let mut iov = [IoSlice::new(&[]); IOV_MAX];
        let mut n = 0;
        let mut total = 0;
        let mut skip = link.tx.front_done;
        for seg in link.tx.segs.iter() {
            if n == IOV_MAX {
                break;
            }
            let s: &[u8] = match seg {
                TxSeg::Small { len, bytes } => &bytes[..*len as usize],
                TxSeg::Data { cmd, off, len } => cmds
                    .get(*cmd as usize)
                    .and_then(|c| c.buf.as_ref())
                    .map_or(&[][..], |b| {
                        &b.as_slice()[*off as usize..(*off + *len) as usize]
                    }),
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
        if n == 0 {
            link.tx.advance(0, released);
            return Ok(written);
        }
        let w = link.wire.writev(&iov[..n])?;
        written += w;
        link.tx.advance(w, released);
        if w < total || link.tx.is_empty() {
            return Ok(written);
        }
    }
}

/// Read what the socket of QP `h` has and feed it to the queue machine; returns whether
/// anything happened. Input stops (and the application hears of it) on a fatal error, a
/// TermReq from the host, or the peer closing.
pub(super) fn service_rx(core: &mut Core, h: QpHandle, rx: &mut RxBuf, st: &mut QpState) -> bool {
    let mut did = false;
    // A buffer that had to grow for the PDU at hand is filled again at once (at most a
    // few times: it grows to its bound at most).
    for _ in 0..4 {
        let super::cmd::Link::Tcp(link) = &mut st.link else {
            return false;
        };
        let got = rx.fill(&mut link.wire);
        let full = rx.tail == rx.buf.len();
        // Parse whatever is complete, even when the peer closed after sending it.
        while !st.rx_stopped {
            let super::cmd::Link::Tcp(link) = &mut st.link else {
                break;
            };
            let (used, ev) = link.machine.receive(rx.pending(), &mut link.tx);
            let Some(ev) = ev else {
                rx.head += used;
                break;
            };
            did = true;
            st.tx_dirty |= !link.tx.is_empty();
            on_event(core, h, st, ev);
            rx.head += used;
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
    did
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
            st.tx_dirty = true;
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
