//! NVMe/RDMA transport binding (NVMe-oF 1.1 section 7.3): the wire pieces and the
//! controller-side queue machine, with no verbs and no I/O.
//!
//! - RDMA CM private data (section 7.3.1, field layout as in the kernel's
//!   `include/linux/nvme-rdma.h`): the connect request ([`CmRequest`], Figure 53) and its
//!   checks ([`CmRequest::validate`]), the accept ([`accept_private_data`], Figure 54) and
//!   the reject ([`RejectStatus`], Figure 55).
//! - Keyed SGL Data Block descriptors ([`KeyedSgl`], NVMe Base 2.0 Figure 117): host
//!   memory the target reads or writes with RDMA.
//! - Send-queue credits ([`SqCredits`]): work requests in flight never exceed the send
//!   queue, RDMA READs never exceed the initiator depth the connection negotiated.
//! - [`RdmaQueue`]: one queue's protocol: a capsule from a RECV (length checks, SQHD),
//!   host data fetched with RDMA READ of the keyed SGL, the response plan (RDMA WRITE of
//!   the data, then a SEND of the completion, SEND with Invalidate when the host asked for
//!   it), all as [`WorkRequest`]s the engine posts to its verbs QP when credits allow.
//!
//! Not implemented: SRQ, multi-descriptor SGLs (Last Segment), iWARP specifics.

use std::collections::VecDeque;

use crate::queue::{QueueParams, SqHead};
use crate::spec::{sgl, Cqe, SglDescriptor, Sqe};
use zerocopy::{FromBytes, IntoBytes};

// --- RDMA CM private data --------------------------------------------------------------

/// Reject status in the reject private data (NVMe-oF 1.1 Figure 55, the kernel's
/// `nvme_rdma_cm_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum RejectStatus {
    InvalidLength = 0x01,
    InvalidRecfmt = 0x02,
    InvalidQid = 0x03,
    InvalidHsqsize = 0x04,
    InvalidHrqsize = 0x05,
    NoResources = 0x06,
    InvalidIrd = 0x07,
    InvalidOrd = 0x08,
    InvalidCntlid = 0x09,
}

/// Length of the reject private data.
pub const CM_REJECT_LEN: usize = 4;

impl RejectStatus {
    /// The reject private data: RECFMT 0 (bytes 0-1), STS (bytes 2-3), little-endian.
    pub fn private_data(self) -> [u8; CM_REJECT_LEN] {
        let s = (self as u16).to_le_bytes();
        [0, 0, s[0], s[1]]
    }

    /// Decode reject private data (host side).
    pub fn parse(b: &[u8]) -> Option<RejectStatus> {
        if b.len() < CM_REJECT_LEN || b[0] != 0 || b[1] != 0 {
            return None;
        }
        use RejectStatus::*;
        Some(match u16::from_le_bytes([b[2], b[3]]) {
            0x01 => InvalidLength,
            0x02 => InvalidRecfmt,
            0x03 => InvalidQid,
            0x04 => InvalidHsqsize,
            0x05 => InvalidHrqsize,
            0x06 => NoResources,
            0x07 => InvalidIrd,
            0x08 => InvalidOrd,
            0x09 => InvalidCntlid,
            _ => return None,
        })
    }
}

/// The connect request private data (NVMe-oF 1.1 Figure 53): 32 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmRequest {
    pub recfmt: u16,
    pub qid: u16,
    /// Host receive queue size: completions the host can take.
    pub hrqsize: u16,
    /// Host send queue size, 0's based: commands the host may have outstanding - 1.
    pub hsqsize: u16,
    pub cntlid: u16,
}

/// What a connect request is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmLimits {
    pub max_queue_depth: u16,
    pub admin_queue_depth: u16,
    pub max_io_queues: u16,
}

pub const CM_REQUEST_LEN: usize = 32;
pub const CM_ACCEPT_LEN: usize = 32;

impl CmRequest {
    /// Fields at byte offsets 0, 2, 4, 6 and 8, little-endian; the rest is reserved.
    pub fn parse(b: &[u8]) -> Result<CmRequest, RejectStatus> {
        if b.len() < CM_REQUEST_LEN {
            return Err(RejectStatus::InvalidLength);
        }
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Ok(CmRequest {
            recfmt: u(0),
            qid: u(2),
            hrqsize: u(4),
            hsqsize: u(6),
            cntlid: u(8),
        })
    }

    pub fn encode(&self) -> [u8; CM_REQUEST_LEN] {
        let mut b = [0u8; CM_REQUEST_LEN];
        for (i, v) in [
            self.recfmt,
            self.qid,
            self.hrqsize,
            self.hsqsize,
            self.cntlid,
        ]
        .into_iter()
        .enumerate()
        {
            b[i * 2..i * 2 + 2].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Parse and check a request; `Ok` is the queue depth to serve (commands the host
    /// may have outstanding: HSQSIZE + 1).
    pub fn validate(b: &[u8], lim: &CmLimits) -> Result<(CmRequest, u16), RejectStatus> {
        let r = CmRequest::parse(b)?;
        if r.recfmt != 0 {
            return Err(RejectStatus::InvalidRecfmt);
        }
        if r.qid > lim.max_io_queues {
            return Err(RejectStatus::InvalidQid);
        }
        let max = if r.qid == 0 {
            lim.admin_queue_depth
        } else {
            lim.max_queue_depth
        };
        let depth = r.hsqsize as u32 + 1;
        if r.hsqsize == 0 || depth > max as u32 {
            return Err(RejectStatus::InvalidHsqsize);
        }
        if r.hrqsize == 0 || r.hrqsize > max {
            return Err(RejectStatus::InvalidHrqsize);
        }
        Ok((r, depth as u16))
    }
}

/// The accept private data (NVMe-oF 1.1 Figure 54): RECFMT 0, CRQSIZE at byte 2.
pub fn accept_private_data(crqsize: u16) -> [u8; CM_ACCEPT_LEN] {
    let mut b = [0u8; CM_ACCEPT_LEN];
    b[2..4].copy_from_slice(&crqsize.to_le_bytes());
    b
}

// --- keyed SGL ------------------------------------------------------------------------

/// A keyed SGL data block descriptor: host memory the target reads or writes with RDMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyedSgl {
    pub addr: u64,
    /// 24 bits on the wire.
    pub len: u32,
    pub key: u32,
    /// Sub type Fh: the host asks the target to invalidate `key` (SEND with Invalidate).
    pub invalidate: bool,
}

impl KeyedSgl {
    /// `None` unless the descriptor is a keyed data block with sub type Address (0h) or
    /// Invalidate Key (Fh).
    pub fn parse(d: &SglDescriptor) -> Option<KeyedSgl> {
        if d.sgl_type() != sgl::TYPE_KEYED_DATA_BLOCK {
            return None;
        }
        let invalidate = match d.subtype() {
            sgl::SUBTYPE_ADDRESS => false,
            sgl::SUBTYPE_INVALIDATE_KEY => true,
            _ => return None,
        };
        Some(KeyedSgl {
            addr: d.addr,
            len: d.keyed_length(),
            key: d.key(),
            invalidate,
        })
    }

    pub fn encode(&self) -> SglDescriptor {
        SglDescriptor::keyed(
            if self.invalidate {
                sgl::SUBTYPE_INVALIDATE_KEY
            } else {
                sgl::SUBTYPE_ADDRESS
            },
            self.addr,
            self.len,
            self.key,
        )
    }
}

// --- send queue credits ---------------------------------------------------------------

/// Send-queue credits of one QP: work requests posted and not completed may not exceed
/// the send queue, and RDMA READs in flight may not exceed the initiator depth the
/// connection negotiated. Every send-side WR is signaled, so each completion returns
/// exactly what its post took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqCredits {
    sq_free: u32,
    rd_free: u32,
    sq_total: u32,
}

impl SqCredits {
    pub fn new(sq: u32, reads: u32) -> SqCredits {
        SqCredits {
            sq_free: sq,
            rd_free: reads.max(1),
            sq_total: sq,
        }
    }
    /// Take the credits of one WR (`read`: an RDMA READ); false when it must wait.
    pub fn take(&mut self, read: bool) -> bool {
        if self.sq_free == 0 || (read && self.rd_free == 0) {
            return false;
        }
        self.sq_free -= 1;
        if read {
            self.rd_free -= 1;
        }
        true
    }
    /// One WR completed (successfully or flushed).
    pub fn give(&mut self, read: bool) {
        self.sq_free += 1;
        if read {
            self.rd_free += 1;
        }
    }
    pub fn sq_free(&self) -> u32 {
        self.sq_free
    }
    pub fn rd_free(&self) -> u32 {
        self.rd_free
    }
    /// Work requests posted and not completed yet.
    pub fn in_flight(&self) -> u32 {
        self.sq_total.saturating_sub(self.sq_free)
    }
}

// --- the queue machine ----------------------------------------------------------------

/// `slot` of a SEND that answers a command without a slot (nothing to release).
pub const NO_SLOT: u32 = u32::MAX;

/// A send-side work request the engine posts to its verbs QP. `slot` names the engine's
/// command (its data buffer, and what to release when a SEND completes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkRequest {
    /// RDMA READ `len` bytes of host memory (`raddr`, `rkey`) into the slot's buffer at
    /// `off`.
    Read {
        slot: u32,
        off: u32,
        len: u32,
        raddr: u64,
        rkey: u32,
    },
    /// RDMA WRITE the first `len` bytes of the slot's buffer to host memory.
    Write {
        slot: u32,
        len: u32,
        raddr: u64,
        rkey: u32,
    },
    /// SEND the 16-byte completion (SEND with Invalidate of `invalidate` when set); the
    /// slot is released when it completes ([`NO_SLOT`]: nothing to release).
    Send {
        slot: u32,
        cqe: [u8; Cqe::SIZE],
        invalidate: Option<u32>,
    },
}

impl WorkRequest {
    pub fn is_read(&self) -> bool {
        matches!(self, WorkRequest::Read { .. })
    }
}

/// A RECV that cannot be a command capsule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RdmaError {
    /// Shorter than the 64-byte SQE (NVMe-oF 1.1 section 7.3.2: a capsule holds at least
    /// the SQE).
    #[error("RDMA capsule of {0} bytes is shorter than an SQE")]
    ShortCapsule(usize),
    /// Longer than the SQE plus the in-capsule data this queue accepts.
    #[error("RDMA capsule of {0} bytes is longer than this queue accepts")]
    LongCapsule(usize),
}

/// One NVMe/RDMA queue, controller side.
#[derive(Debug)]
pub struct RdmaQueue {
    head: SqHead,
    max_capsule: usize,
    credits: SqCredits,
    ops: VecDeque<WorkRequest>,
}

impl RdmaQueue {
    /// A queue taking capsules of up to `max_capsule` bytes (SQE + in-capsule data) with
    /// `credits` for its send queue. `depth` (HSQSIZE + 1) sizes the work queue once.
    pub fn new(max_capsule: usize, credits: SqCredits, depth: u16) -> RdmaQueue {
        RdmaQueue {
            head: SqHead::new(),
            max_capsule,
            credits,
            ops: VecDeque::with_capacity(depth as usize * 3),
        }
    }

    /// Fabrics Connect answered: SQHD follows the queue's size and flow-control mode.
    pub fn set_params(&mut self, p: QueueParams) {
        self.head.set_params(p);
    }

    pub fn params(&self) -> QueueParams {
        self.head.params()
    }

    /// A RECV completed with `bytes`: the SQE and its in-capsule data. Counts toward SQHD.
    pub fn on_recv<'a>(&mut self, bytes: &'a [u8]) -> Result<(Sqe, &'a [u8]), RdmaError> {
        if bytes.len() > self.max_capsule {
            return Err(RdmaError::LongCapsule(bytes.len()));
        }
        let Ok((sqe, data)) = Sqe::read_from_prefix(bytes) else {
            return Err(RdmaError::ShortCapsule(bytes.len()));
        };
        self.head.capsule_received();
        Ok((sqe, data))
    }

    /// Fetch `len` bytes of host data at offset `off` of the command's keyed SGL into
    /// the slot's buffer at `off` (RDMA READ).
    pub fn fetch(&mut self, slot: u32, k: &KeyedSgl, off: u32, len: u32) {
        self.ops.push_back(WorkRequest::Read {
            slot,
            off,
            len,
            raddr: k.addr.wrapping_add(off as u64),
            rkey: k.key,
        });
    }

    /// Answer command `slot` (whose SGL1 is `dptr`): RDMA WRITE of `data_len` bytes of
    /// its buffer to the host's keyed SGL (never more than the SGL holds), then the SEND
    /// of `cqe` with SQHD and SQID filled in, with Invalidate when the host asked for it.
    pub fn respond(&mut self, slot: u32, dptr: &SglDescriptor, mut cqe: Cqe, data_len: u32) {
        self.head.complete(&mut cqe);
        let k = KeyedSgl::parse(dptr);
        if let (true, Some(k)) = (data_len > 0, k) {
            self.ops.push_back(WorkRequest::Write {
                slot,
                len: data_len.min(k.len),
                raddr: k.addr,
                rkey: k.key,
            });
        }
        self.ops.push_back(WorkRequest::Send {
            slot,
            cqe: cqe_bytes(&cqe),
            invalidate: k.filter(|k| k.invalidate).map(|k| k.key),
        });
    }

    /// Answer a command that got no slot: the completion only.
    pub fn respond_untracked(&mut self, mut cqe: Cqe) {
        self.head.complete(&mut cqe);
        self.ops.push_back(WorkRequest::Send {
            slot: NO_SLOT,
            cqe: cqe_bytes(&cqe),
            invalidate: None,
        });
    }

    /// The next work request to post, if the send queue (and, for a READ, the initiator
    /// depth) has a credit for it; the credit is taken.
    pub fn next_work(&mut self) -> Option<WorkRequest> {
        let op = self.ops.front()?;
        if !self.credits.take(op.is_read()) {
            return None;
        }
        self.ops.pop_front()
    }

    /// A send-side work request completed (or was flushed): its credit comes back.
    pub fn work_completed(&mut self, read: bool) {
        self.credits.give(read);
    }

    /// Work waiting for credits.
    pub fn has_work(&self) -> bool {
        !self.ops.is_empty()
    }

    /// Whether [`next_work`](Self::next_work) would hand out something now (work is
    /// waiting and the credits allow the next piece).
    pub fn ready(&self) -> bool {
        self.ops.front().is_some_and(|op| {
            self.credits.sq_free() > 0 && (!op.is_read() || self.credits.rd_free() > 0)
        })
    }

    /// Send-side work waiting for credits or posted and not completed: what a peer
    /// that stops taking our SENDs (posts no receives) or answering our READs holds. The
    /// engine runs its drain deadline while this is true and no completion comes.
    pub fn send_side_busy(&self) -> bool {
        self.has_work() || self.credits.in_flight() > 0
    }

    /// Work requests waiting to be posted.
    pub fn queued(&self) -> usize {
        self.ops.len()
    }

    /// Drop the work not posted yet (the QP is going away).
    pub fn discard_work(&mut self) {
        self.ops.clear();
    }

    pub fn credits(&self) -> SqCredits {
        self.credits
    }
}

fn cqe_bytes(c: &Cqe) -> [u8; Cqe::SIZE] {
    let mut b = [0u8; Cqe::SIZE];
    b.copy_from_slice(c.as_bytes());
    b
}

#[cfg(test)]
mod tests;
