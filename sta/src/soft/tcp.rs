//! The socket side of a soft-engine TCP QP: receive buffer and transmit queue.

use std::collections::VecDeque;
use std::io::{IoSlice, Read, Write};
use std::net::TcpStream;

/// Bytes read from the socket and not yet parsed: `buf[head..tail]`.
pub(crate) struct RxBuf {
    pub buf: Box<[u8]>,
    pub head: usize,
    pub tail: usize,
}

pub(crate) enum RxResult {
    /// Read this many bytes (0: nothing available now).
    Read(usize),
    Closed,
    Error,
}

impl RxBuf {
    pub fn new(cap: usize) -> RxBuf {
        RxBuf {
            buf: vec![0u8; cap].into_boxed_slice(),
            head: 0,
            tail: 0,
        }
    }

    pub fn pending(&self) -> &[u8] {
        &self.buf[self.head..self.tail]
    }

    /// Read what the socket has, making room first when the free tail is small.
    pub fn fill(&mut self, sock: &mut TcpStream) -> RxResult {
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
            match sock.read(&mut self.buf[self.tail..]) {
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
pub(crate) const SMALL_MAX: usize = 184;

/// One piece of output, in order.
pub(crate) enum TxSeg {
    /// A PDU header or a whole small PDU, copied inline (no allocation).
    Small { len: u8, bytes: [u8; SMALL_MAX] },
    /// `len` bytes of a command's data buffer starting at `off`.
    Data { cmd: u32, off: u32, len: u32 },
    /// Once everything before this is on the wire, the command slot can be freed.
    Release { cmd: u32 },
}

#[derive(Default)]
pub(crate) struct TxQueue {
    pub segs: VecDeque<TxSeg>,
    /// Bytes of the front segment already written.
    pub front_done: usize,
}

impl TxQueue {
    pub fn push_small(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(SMALL_MAX) {
            let mut b = [0u8; SMALL_MAX];
            b[..chunk.len()].copy_from_slice(chunk);
            self.segs.push_back(TxSeg::Small {
                len: chunk.len() as u8,
                bytes: b,
            });
        }
    }

    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// Account for `n` bytes written from the front; release markers reached are
    /// appended to `released`.
    pub fn advance(&mut self, mut n: usize, released: &mut Vec<u32>) {
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
}

/// `write_vectored` that treats EINTR as a retry and EAGAIN as "wrote nothing".
pub(crate) fn writev(sock: &mut TcpStream, slices: &[IoSlice<'_>]) -> std::io::Result<usize> {
    loop {
        match sock.write_vectored(slices) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(0),
            Err(e) => return Err(e),
        }
    }
}
