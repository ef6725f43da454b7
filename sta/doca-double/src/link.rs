//! How a QP's bytes move: RDMA verbs on the `rdma_cm_id` the application accepted
//! (rdma-core through `sta::verbs::ffi`, loaded at run time), or the loopback host used by
//! hermetic tests (`doca_double_loop_*`), which performs RDMA READ/WRITE as memory copies
//! between the double's buffers and regions the test registered under an rkey, checking
//! key and bounds as a NIC would. Everything above this module is the same for both.
//!
//! Why one file of ~870 lines: each operation (post, flush, poll, disconnect, destroy)
//! has its verbs and its loopback version side by side, so the two cannot drift apart.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};

use nvmf::rdma::SqCredits;
use sta::verbs::ffi::{self, IbvContext, IbvCq, IbvMr, IbvPd, IbvQp, IbvWc};
use sta::verbs::CqChannel;

use crate::world::Buf;

/// Receive buffer per capsule: the 64-byte SQE and up to 8 KiB of in-capsule data
/// (the largest I/O command capsule, `doca_sta_get_max_ioccsz`).
pub const RECV_SZ: usize = 64 + 8192;
/// Slot number of a SEND that belongs to no command (an error answered without one).
pub const NO_SLOT: u16 = u16::MAX;
/// RDMA READs in flight per QP, and what we offer the host.
pub const MAX_RD_ATOMIC: u8 = 16;

pub const IBV_WC_REM_ACCESS_ERR: u32 = 10;
pub const IBV_WC_LOC_PROT_ERR: u32 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcKind {
    Recv,
    Read,
    Write,
    Send,
}

/// A work completion, whatever the link.
#[derive(Clone, Copy, Debug)]
pub struct Wc {
    pub kind: WcKind,
    pub slot: u16,
    pub ok: bool,
    /// Flushed because the QP is in the error state (after a disconnect): not an error
    /// to report.
    pub flush: bool,
    pub status: u32,
    pub vendor: u32,
    pub len: u32,
}

#[derive(Clone, Copy, Debug)]
pub enum Op {
    Read {
        slot: u16,
        laddr: u64,
        lkey: u32,
        len: u32,
        raddr: u64,
        rkey: u32,
    },
    Write {
        slot: u16,
        laddr: u64,
        lkey: u32,
        len: u32,
        raddr: u64,
        rkey: u32,
    },
    Send {
        slot: u16,
        cqe: [u8; 16],
        inv: Option<u32>,
    },
}

impl Op {
    fn is_read(&self) -> bool {
        matches!(self, Op::Read { .. })
    }
}

// --- loopback ---------------------------------------------------------------------------

/// The host side of a loopback connection (owned by the test through its handle).
#[derive(Default)]
pub struct LoopHost {
    pub capsules: VecDeque<Vec<u8>>,
    /// Completions the double sent, with the rkey a SEND with Invalidate named.
    pub cqes: VecDeque<([u8; 16], Option<u32>)>,
    pub regions: Vec<(u32, usize, usize)>,
    pub disconnected: bool,
    /// Accepted by a QP (the id may be given to one QP only).
    pub attached: bool,
    /// The private data the accept carried.
    pub accept_data: Vec<u8>,
}

impl LoopHost {
    fn region(&self, rkey: u32, addr: u64, len: u32) -> Option<usize> {
        self.regions.iter().find_map(|&(k, a, l)| {
            (k == rkey && addr as usize >= a && addr as usize + len as usize <= a + l)
                .then_some(addr as usize)
        })
    }
}

pub struct LoopQp {
    pub id: u64,
    recv: Box<[u8]>,
    posted: VecDeque<u16>,
    ops: VecDeque<Op>,
    wcs: VecDeque<Wc>,
    disconnected: bool,
}

// --- verbs ------------------------------------------------------------------------------

struct VDev {
    ctx: *mut IbvContext,
    pd: *mut IbvPd,
}

/// An IO context's verbs devices (a PD each).
///
/// Each QP's CQ has its own completion channel ([`CqChannel`]), read only while the CQ
/// lives. Why not one channel per device: the kernel's Soft-RoCE driver, without upstream
/// 78b26a335310 ("RDMA/rxe: Remove tasklet call from rxe_cq.c", Linux 6.4; the interop
/// guest's 6.1 module still has the tasklet), raises a CQ's completion event from a
/// tasklet that holds no reference on the CQ, so an event can be queued after
/// `ibv_destroy_cq` returned. On a shared channel the next `ibv_get_cq_event` returns it,
/// and libibverbs reads the freed `struct ibv_cq` and calls through its context's ops
/// table: an indirect call through freed memory (issue 12's SIGSEGV on the IO thread
/// right after a QP teardown). A destroyed CQ's channel is buried
/// ([`CqChannel::bury`]): drained as raw bytes for a grace period, then closed.
#[derive(Default)]
pub struct VerbsIo {
    devs: Vec<VDev>,
}

pub struct VerbsQp {
    id: *mut ffi::RdmaCmIdRaw,
    qp: *mut IbvQp,
    cq: *mut IbvCq,
    /// The CQ's own completion channel (see [`VerbsIo`]).
    chan: Option<CqChannel>,
    dev: usize,
    recv: Box<[u8]>,
    recv_mr: *mut IbvMr,
    repost: Vec<u16>,
    ops: VecDeque<Op>,
    credits: SqCredits,
    /// `doca_sta_io_qp_connect` gave the cm_id to the library (doca-sta-api.md 5.9).
    pub owns_id: bool,
    disconnect_sent: bool,
    posted_sends: u32,
    /// Flush completions of work that was never posted.
    synth: VecDeque<Wc>,
}

fn wr_id(kind: WcKind, slot: u16) -> u64 {
    (kind as u64) << 56 | slot as u64
}

fn wr_kind(id: u64) -> WcKind {
    match id >> 56 {
        0 => WcKind::Recv,
        1 => WcKind::Read,
        2 => WcKind::Write,
        _ => WcKind::Send,
    }
}

fn errno() -> String {
    std::io::Error::last_os_error().to_string()
}

impl VerbsIo {
    /// Index of the device of `ctx`, set up (its PD) on first use.
    fn dev_for(&mut self, lib: &ffi::Lib, ctx: *mut IbvContext) -> Result<usize, String> {
        if let Some(i) = self.devs.iter().position(|d| d.ctx == ctx) {
            return Ok(i);
        }
        // SAFETY: `ctx` is the device context of a live cm_id.
        let pd = unsafe { (lib.alloc_pd)(ctx) };
        if pd.is_null() {
            return Err(format!("ibv_alloc_pd: {}", errno()));
        }
        self.devs.push(VDev { ctx, pd });
        Ok(self.devs.len() - 1)
    }

    /// Local key of `b` on device `dev`, registering it on first use.
    pub fn lkey(&mut self, lib: &ffi::Lib, dev: usize, b: &mut Buf) -> Option<u32> {
        let d = self.devs.get(dev)?;
        let key = d.ctx as usize;
        if let Some(&(_, mr)) = b.mrs.iter().find(|(k, _)| *k == key) {
            // SAFETY: a live registration of this buffer.
            return Some(unsafe { (*mr).lkey });
        }
        // SAFETY: `b` is a buffer the double owns for as long as the registration lives
        // (deregistered in `dereg` before the buffer goes back to the allocator).
        let mr = unsafe {
            (lib.reg_mr)(
                d.pd,
                b.va as *mut c_void,
                b.cap,
                ffi::IBV_ACCESS_LOCAL_WRITE,
            )
        };
        if mr.is_null() {
            return None;
        }
        b.mrs.push((key, mr));
        // SAFETY: just registered.
        Some(unsafe { (*mr).lkey })
    }

    /// Accept `id` (a connect request handed over by the application): completion
    /// channel, CQ, QP, receive buffers for `depth` capsules, then `rdma_accept` with the
    /// application's private data. The second value is the channel's descriptor, to watch.
    pub(crate) fn accept(
        &mut self,
        lib: &ffi::Lib,
        id: *mut ffi::RdmaCmIdRaw,
        depth: u16,
        priv_data: &[u8],
    ) -> Result<(VerbsQp, c_int), String> {
        // SAFETY: the application hands us a live connect-request id.
        let ctx = unsafe { (*id).verbs };
        if ctx.is_null() {
            return Err("the rdma_cm_id has no verbs device (not a connect request?)".into());
        }
        let dev = self.dev_for(lib, ctx)?;
        let d = &self.devs[dev];
        let depth32 = depth as u32;
        let max_send_wr = depth32 * 3 + 4;
        // SAFETY: `ctx` is the live device context of the connect request's id.
        let chan = unsafe { CqChannel::new(lib, ctx) }
            .map_err(|e| format!("ibv_create_comp_channel: {e}"))?;
        let fd = chan.fd();
        // SAFETY: `ctx` and `chan` are live.
        let cq = unsafe {
            (lib.create_cq)(
                ctx,
                (max_send_wr + depth32 + 8) as c_int,
                std::ptr::null_mut(),
                chan.raw(),
                0,
            )
        };
        if cq.is_null() {
            // The unused channel closes with `chan`.
            return Err(format!("ibv_create_cq: {}", errno()));
        }
        let mut attr = ffi::IbvQpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: std::ptr::null_mut(),
            cap: ffi::IbvQpCap {
                max_send_wr,
                max_recv_wr: depth32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 16,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: `id` is live, the PD belongs to its device, `attr` is initialised.
        if unsafe { (lib.create_qp)(id, d.pd, &mut attr) } != 0 {
            let e = format!("rdma_create_qp: {}", errno());
            // SAFETY: unused CQ (never armed: no event can follow it); its channel closes
            // with `chan` after it.
            unsafe { (lib.destroy_cq)(cq) };
            return Err(e);
        }
        let mut recv = vec![0u8; depth as usize * RECV_SZ].into_boxed_slice();
        // SAFETY: `recv` lives in the VerbsQp until after its QP is destroyed.
        let recv_mr = unsafe {
            (lib.reg_mr)(
                d.pd,
                recv.as_mut_ptr() as *mut c_void,
                recv.len(),
                ffi::IBV_ACCESS_LOCAL_WRITE,
            )
        };
        let mut q = VerbsQp {
            id,
            // SAFETY: rdma_create_qp stored the QP in the id.
            qp: unsafe { (*id).qp },
            cq,
            chan: Some(chan),
            dev,
            recv,
            recv_mr,
            repost: (0..depth).collect(),
            ops: VecDeque::new(),
            credits: SqCredits::new(max_send_wr, MAX_RD_ATOMIC as u32),
            owns_id: false,
            disconnect_sent: false,
            posted_sends: 0,
            synth: VecDeque::new(),
        };
        if recv_mr.is_null() {
            q.destroy_unused(lib);
            return Err(format!("ibv_reg_mr (receive buffers): {}", errno()));
        }
        if let Err(e) = q.post_recvs() {
            q.destroy_unused(lib);
            return Err(format!("ibv_post_recv: {e}"));
        }
        let mut param = ffi::RdmaConnParam {
            private_data: if priv_data.is_empty() {
                std::ptr::null()
            } else {
                priv_data.as_ptr() as *const c_void
            },
            private_data_len: priv_data.len() as u8,
            responder_resources: MAX_RD_ATOMIC,
            initiator_depth: MAX_RD_ATOMIC,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        };
        // SAFETY: `id` is live with a QP; `param` and the private data outlive the call.
        if unsafe { (lib.accept)(id, &mut param) } != 0 {
            let e = format!("rdma_accept: {}", errno());
            q.destroy_unused(lib);
            return Err(e);
        }
        Ok((q, fd))
    }

    /// Free every device (after all QPs are gone).
    pub fn destroy(&mut self, lib: &ffi::Lib) {
        for d in self.devs.drain(..) {
            // SAFETY: no QP, CQ or MR of this device is left (the IO context's QPs and
            // buffers are gone); freed once.
            unsafe { (lib.dealloc_pd)(d.pd) };
        }
    }

    pub fn is_empty(&self) -> bool {
        self.devs.is_empty()
    }
}

/// Deregister a buffer's memory registrations.
pub fn dereg(b: &mut Buf) {
    if b.mrs.is_empty() {
        return;
    }
    if let Ok(lib) = sta::verbs::lib() {
        for (_, mr) in b.mrs.drain(..) {
            // SAFETY: a live registration; no work request uses the buffer any more.
            unsafe { (lib.dereg_mr)(mr) };
        }
    }
}

/// The flush completion a work request gets when it never reaches the wire (the QP is in
/// the error state, or posting it failed), as a NIC reports posted WRs of a QP in error.
fn flushed(op: &Op) -> Wc {
    let (kind, slot) = match *op {
        Op::Read { slot, .. } => (WcKind::Read, slot),
        Op::Write { slot, .. } => (WcKind::Write, slot),
        Op::Send { slot, .. } => (WcKind::Send, slot),
    };
    flush_wc(kind, slot)
}

/// A flush completion (`IBV_WC_WR_FLUSH_ERR`) of work request `slot` of `kind`.
fn flush_wc(kind: WcKind, slot: u16) -> Wc {
    Wc {
        kind,
        slot,
        ok: false,
        flush: true,
        status: ffi::IBV_WC_WR_FLUSH_ERR,
        vendor: 0,
        len: 0,
    }
}

/// Work requests of a batch that `ibv_post_send` refused: their send-queue credits come
/// back and each completes as flushed at the next poll, so their commands and tasks finish
/// (before this, they were dropped: tasks never completed, credits and buffers held).
fn fail_unposted(credits: &mut SqCredits, synth: &mut VecDeque<Wc>, rest: &[Op]) {
    for op in rest {
        credits.give(op.is_read());
        synth.push_back(flushed(op));
    }
}

impl VerbsQp {
    fn post_recvs(&mut self) -> Result<(), String> {
        if self.repost.is_empty() {
            return Ok(());
        }
        // SAFETY: `recv_mr` is live.
        let lkey = unsafe { (*self.recv_mr).lkey };
        let base = self.recv.as_ptr() as u64;
        let mut sges: Vec<ffi::IbvSge> = self
            .repost
            .iter()
            .map(|&s| ffi::IbvSge {
                addr: base + s as u64 * RECV_SZ as u64,
                length: RECV_SZ as u32,
                lkey,
            })
            .collect();
        let mut wrs: Vec<ffi::IbvRecvWr> = self
            .repost
            .iter()
            .zip(sges.iter_mut())
            .map(|(&s, sg)| ffi::IbvRecvWr {
                wr_id: wr_id(WcKind::Recv, s),
                next: std::ptr::null_mut(),
                sg_list: sg as *mut _,
                num_sge: 1,
            })
            .collect();
        for i in 0..wrs.len() - 1 {
            let next = &mut wrs[i + 1] as *mut ffi::IbvRecvWr;
            wrs[i].next = next;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: `qp` is live; the chain and its SGEs live across the call; the receive
        // buffers are registered.
        let rc = unsafe {
            let ctx = (*self.qp).context;
            ((*ctx).ops.post_recv)(self.qp, wrs.as_mut_ptr(), &mut bad)
        };
        if rc != 0 {
            // Work requests before `bad` were posted; `bad` and the rest were not, and
            // stay on the list for the next try rather than being lost.
            // (A `bad` outside the chain says nothing of what was posted: the old way,
            // forget them all, rather than post some twice.)
            match wrs.iter().position(|wr| std::ptr::eq(wr, bad)) {
                Some(first_unposted) => drop(self.repost.drain(..first_unposted)),
                None => self.repost.clear(),
            }
            return Err(std::io::Error::from_raw_os_error(rc).to_string());
        }
        self.repost.clear();
        Ok(())
    }

    fn flush(&mut self, owned: &dyn Fn(&Op) -> bool) -> Result<(), String> {
        self.post_recvs()?;
        let mut batch = Vec::new();
        while let Some(op) = self.ops.front() {
            if !owned(op) {
                // Never DMA into or from a buffer its command gave back (see Link::flush).
                let op = *op;
                self.ops.pop_front();
                eprintln!("doca-double: an RDMA transfer targets a buffer its command does not hold; failed");
                debug_assert!(false, "RDMA transfer into a buffer given back");
                let mut wc = flushed(&op);
                wc.flush = false;
                wc.status = IBV_WC_LOC_PROT_ERR;
                self.synth.push_back(wc);
                continue;
            }
            if !self.credits.take(op.is_read()) {
                break;
            }
            batch.extend(self.ops.pop_front());
        }
        if batch.is_empty() {
            return Ok(());
        }
        let mut sges = Vec::with_capacity(batch.len());
        let mut wrs = Vec::with_capacity(batch.len());
        for op in &batch {
            let (sge, wr) = match *op {
                Op::Read {
                    slot,
                    laddr,
                    lkey,
                    len,
                    raddr,
                    rkey,
                } => (
                    ffi::IbvSge {
                        addr: laddr,
                        length: len,
                        lkey,
                    },
                    ffi::IbvSendWr {
                        wr_id: wr_id(WcKind::Read, slot),
                        opcode: ffi::IBV_WR_RDMA_READ,
                        send_flags: ffi::IBV_SEND_SIGNALED,
                        remote_addr: raddr,
                        rkey,
                        ..Default::default()
                    },
                ),
                Op::Write {
                    slot,
                    laddr,
                    lkey,
                    len,
                    raddr,
                    rkey,
                } => (
                    ffi::IbvSge {
                        addr: laddr,
                        length: len,
                        lkey,
                    },
                    ffi::IbvSendWr {
                        wr_id: wr_id(WcKind::Write, slot),
                        opcode: ffi::IBV_WR_RDMA_WRITE,
                        send_flags: ffi::IBV_SEND_SIGNALED,
                        remote_addr: raddr,
                        rkey,
                        ..Default::default()
                    },
                ),
                Op::Send { slot, ref cqe, inv } => (
                    ffi::IbvSge {
                        addr: cqe.as_ptr() as u64,
                        length: 16,
                        lkey: 0,
                    },
                    ffi::IbvSendWr {
                        wr_id: wr_id(WcKind::Send, slot),
                        opcode: if inv.is_some() {
                            ffi::IBV_WR_SEND_WITH_INV
                        } else {
                            ffi::IBV_WR_SEND
                        },
                        send_flags: ffi::IBV_SEND_SIGNALED | ffi::IBV_SEND_INLINE,
                        imm_or_inv: inv.unwrap_or(0),
                        ..Default::default()
                    },
                ),
            };
            sges.push(sge);
            wrs.push(wr);
        }
        let n = wrs.len();
        for i in 0..n {
            wrs[i].sg_list = &mut sges[i] as *mut _;
            wrs[i].num_sge = 1;
            if i + 1 < n {
                wrs[i].next = &mut wrs[i + 1] as *mut _;
            }
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: `qp` is live; the chain, its SGEs and the inline CQE bytes (in `batch`)
        // live across the call; data buffers are registered and stay allocated until
        // their completions arrive or the QP is destroyed.
        let rc = unsafe {
            let ctx = (*self.qp).context;
            ((*ctx).ops.post_send)(self.qp, wrs.as_mut_ptr(), &mut bad)
        };
        if rc != 0 {
            // The WRs before `bad` are on the send queue and complete as usual; `bad` and
            // the rest never reached it. (A NULL `bad`: the provider queued the whole
            // chain and failed afterwards, e.g. rxe's doorbell, so all of it is posted.)
            let posted = if bad.is_null() {
                n
            } else {
                (bad as usize).saturating_sub(wrs.as_ptr() as usize)
                    / std::mem::size_of::<ffi::IbvSendWr>()
            }
            .min(n);
            self.posted_sends += posted as u32;
            fail_unposted(&mut self.credits, &mut self.synth, &batch[posted..]);
            // Move the QP to the error state, so what was posted completes (flushed) and
            // nothing more is posted (Link::flush flushes what is queued after this).
            self.disconnect_sent = true;
            if let Ok(lib) = sta::verbs::lib() {
                // SAFETY: the id is live until `destroy`.
                unsafe { (lib.disconnect)(self.id) };
            }
            return Err(std::io::Error::from_raw_os_error(rc).to_string());
        }
        self.posted_sends += n as u32;
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Wc>) {
        out.extend(self.synth.drain(..));
        let mut wcs = [IbvWc::default(); 32];
        loop {
            // SAFETY: `cq` is live; `wcs` has room for 32 entries (inline ibv_poll_cq).
            let n = unsafe {
                let ctx = (*self.cq).context;
                ((*ctx).ops.poll_cq)(self.cq, wcs.len() as c_int, wcs.as_mut_ptr())
            };
            if n <= 0 {
                break;
            }
            for wc in &wcs[..n as usize] {
                let kind = wr_kind(wc.wr_id);
                if kind != WcKind::Recv {
                    self.credits.give(kind == WcKind::Read);
                    self.posted_sends = self.posted_sends.saturating_sub(1);
                }
                out.push(Wc {
                    kind,
                    slot: wc.wr_id as u16,
                    ok: wc.status == ffi::IBV_WC_SUCCESS,
                    flush: wc.status == ffi::IBV_WC_WR_FLUSH_ERR,
                    status: wc.status,
                    vendor: wc.vendor_err,
                    len: wc.byte_len,
                });
            }
        }
    }

    fn arm(&mut self) {
        // SAFETY: `cq` is live (inline ibv_req_notify_cq).
        unsafe {
            let ctx = (*self.cq).context;
            ((*ctx).ops.req_notify_cq)(self.cq, 0);
        }
    }

    /// Consume the CQ's completion events (the CQ is polled anyway).
    fn drain_events(&mut self, lib: &ffi::Lib) {
        if let (Some(c), false) = (&self.chan, self.cq.is_null()) {
            // SAFETY: only this QP's CQ uses the channel, and it is alive (`destroy_verbs`
            // takes the channel away before destroying it).
            unsafe { c.drain(lib) };
        }
    }

    /// Destroy the QP, its CQ and the receive buffers' registration; the completion
    /// channel is returned (to be buried), no longer read through libibverbs.
    fn destroy_verbs(&mut self, lib: &ffi::Lib) -> Option<CqChannel> {
        // SAFETY: each object is live and freed once, QP before its CQ and before the
        // receive buffers' registration. Every event read from the channel was acked
        // (`drain_events`), so ibv_destroy_cq does not wait.
        unsafe {
            if !self.qp.is_null() {
                (lib.destroy_qp)(self.id);
                self.qp = std::ptr::null_mut();
            }
            if !self.cq.is_null() {
                let rc = (lib.destroy_cq)(self.cq);
                self.cq = std::ptr::null_mut();
                if rc != 0 {
                    // The CQ lives on, leaked (no completion can reach it: its QP is
                    // gone); its channel is still drained raw, then fails to close and
                    // is leaked too.
                    eprintln!(
                        "doca-double: ibv_destroy_cq: {} (the CQ is leaked)",
                        std::io::Error::from_raw_os_error(rc)
                    );
                }
            }
            if !self.recv_mr.is_null() {
                (lib.dereg_mr)(self.recv_mr);
                self.recv_mr = std::ptr::null_mut();
            }
        }
        self.chan.take()
    }

    /// Destroy a QP whose CQ was never armed (a failed accept): no event can follow, so
    /// the channel closes at once.
    fn destroy_unused(&mut self, lib: &ffi::Lib) {
        drop(self.destroy_verbs(lib));
    }
}

// --- the link ---------------------------------------------------------------------------

pub enum Link {
    Verbs(Box<VerbsQp>),
    Loop(LoopQp),
}

impl Link {
    pub fn new_loop(id: u64, depth: u16) -> Link {
        Link::Loop(LoopQp {
            id,
            recv: vec![0u8; depth as usize * RECV_SZ].into_boxed_slice(),
            posted: (0..depth).collect(),
            ops: VecDeque::new(),
            wcs: VecDeque::new(),
            disconnected: false,
        })
    }

    pub fn qpn(&self) -> u32 {
        match self {
            // SAFETY: the QP is live while the link is.
            Link::Verbs(v) => unsafe { (*v.qp).qp_num },
            Link::Loop(l) => l.id as u32,
        }
    }

    pub fn dev(&self) -> Option<usize> {
        match self {
            Link::Verbs(v) => Some(v.dev),
            Link::Loop(_) => None,
        }
    }

    /// The capsule received into receive slot `slot`.
    pub fn recv_buf(&self, slot: u16, len: usize) -> &[u8] {
        let b = match self {
            Link::Verbs(v) => &v.recv,
            Link::Loop(l) => &l.recv,
        };
        let s = slot as usize * RECV_SZ;
        &b[s..s + len.min(RECV_SZ)]
    }

    pub fn repost(&mut self, slot: u16) {
        match self {
            Link::Verbs(v) => v.repost.push(slot),
            Link::Loop(l) => l.posted.push_back(slot),
        }
    }

    pub fn post(&mut self, op: Op) {
        match self {
            Link::Verbs(v) => v.ops.push_back(op),
            Link::Loop(l) => l.ops.push_back(op),
        }
    }

    /// Work requests queued and not posted yet.
    pub fn queued(&self) -> bool {
        match self {
            Link::Verbs(v) => !v.ops.is_empty(),
            Link::Loop(l) => !l.ops.is_empty(),
        }
    }

    /// Work requests posted and not completed (sends, reads, writes).
    pub fn busy(&self) -> bool {
        match self {
            Link::Verbs(v) => v.posted_sends > 0 || !v.ops.is_empty() || !v.synth.is_empty(),
            Link::Loop(l) => !l.ops.is_empty() || !l.wcs.is_empty(),
        }
    }

    /// Post what is queued (loopback: perform it, a READ/WRITE only into or from a buffer
    /// `owned` says is its command's: else it fails as a NIC fails a WR whose memory
    /// registration is gone, with a local protection error).
    pub fn flush(
        &mut self,
        loops: &mut HashMap<u64, LoopHost>,
        owned: &dyn Fn(&Op) -> bool,
    ) -> Result<(), String> {
        match self {
            Link::Verbs(v) => {
                if v.disconnect_sent {
                    // The QP is in the error state (disconnected, or a post failed): what
                    // is still queued is reported as flushed by the next poll, as the NIC
                    // would for posted WRs.
                    while let Some(op) = v.ops.pop_front() {
                        v.synth.push_back(flushed(&op));
                    }
                    return Ok(());
                }
                v.flush(owned)
            }
            Link::Loop(l) => {
                let host = loops.get_mut(&l.id);
                let down = l.disconnected || host.as_ref().is_none_or(|h| h.disconnected);
                let mut host = host;
                while let Some(op) = l.ops.pop_front() {
                    let (kind, slot) = match op {
                        Op::Read { slot, .. } => (WcKind::Read, slot),
                        Op::Write { slot, .. } => (WcKind::Write, slot),
                        Op::Send { slot, .. } => (WcKind::Send, slot),
                    };
                    let mut wc = Wc {
                        kind,
                        slot,
                        ok: true,
                        flush: false,
                        status: 0,
                        vendor: 0,
                        len: 0,
                    };
                    if down {
                        wc.ok = false;
                        wc.flush = true;
                        wc.status = ffi::IBV_WC_WR_FLUSH_ERR;
                    } else if !owned(&op) {
                        // The double's own bug, never the application's: loud in tests.
                        eprintln!(
                            "doca-double: loopback {kind:?} of slot {slot} targets a buffer \
                             its command does not hold"
                        );
                        debug_assert!(false, "RDMA {kind:?} into a buffer given back");
                        wc.ok = false;
                        wc.status = IBV_WC_LOC_PROT_ERR;
                    } else if let Some(h) = host.as_deref_mut() {
                        match op {
                            Op::Read {
                                laddr,
                                len,
                                raddr,
                                rkey,
                                ..
                            } => match h.region(rkey, raddr, len) {
                                // SAFETY: the region was registered by the test for this
                                // key and range; `laddr` is the double's own buffer of at
                                // least `len` bytes.
                                Some(src) => unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        src as *const u8,
                                        laddr as *mut u8,
                                        len as usize,
                                    )
                                },
                                None => {
                                    wc.ok = false;
                                    wc.status = IBV_WC_REM_ACCESS_ERR;
                                }
                            },
                            Op::Write {
                                laddr,
                                len,
                                raddr,
                                rkey,
                                ..
                            } => match h.region(rkey, raddr, len) {
                                // SAFETY: as above, in the other direction.
                                Some(dst) => unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        laddr as *const u8,
                                        dst as *mut u8,
                                        len as usize,
                                    )
                                },
                                None => {
                                    wc.ok = false;
                                    wc.status = IBV_WC_REM_ACCESS_ERR;
                                }
                            },
                            Op::Send { cqe, inv, .. } => h.cqes.push_back((cqe, inv)),
                        }
                    }
                    if !wc.ok && !wc.flush {
                        // A NIC moves the QP to the error state after a failed WR.
                        l.disconnected = true;
                    }
                    l.wcs.push_back(wc);
                }
                Ok(())
            }
        }
    }

    pub fn poll(&mut self, loops: &mut HashMap<u64, LoopHost>, out: &mut Vec<Wc>) {
        match self {
            Link::Verbs(v) => v.poll(out),
            Link::Loop(l) => {
                out.extend(l.wcs.drain(..));
                let host = loops.get_mut(&l.id);
                let down = l.disconnected || host.as_ref().is_none_or(|h| h.disconnected);
                if down {
                    out.extend(l.posted.drain(..).map(|slot| flush_wc(WcKind::Recv, slot)));
                    return;
                }
                let Some(h) = host else { return };
                while !l.posted.is_empty() && !h.capsules.is_empty() {
                    let (Some(slot), Some(c)) = (l.posted.pop_front(), h.capsules.pop_front())
                    else {
                        break;
                    };
                    let n = c.len().min(RECV_SZ);
                    let s = slot as usize * RECV_SZ;
                    l.recv[s..s + n].copy_from_slice(&c[..n]);
                    out.push(Wc {
                        kind: WcKind::Recv,
                        slot,
                        ok: true,
                        flush: false,
                        status: 0,
                        vendor: 0,
                        len: n as u32,
                    });
                }
            }
        }
    }

    pub fn arm(&mut self) {
        if let Link::Verbs(v) = self {
            v.arm();
        }
    }

    /// `rdma_disconnect` once (loopback: the host sees its connection drop).
    pub fn disconnect(&mut self, loops: &mut HashMap<u64, LoopHost>) {
        match self {
            Link::Verbs(v) => {
                if !v.disconnect_sent {
                    v.disconnect_sent = true;
                    if let Ok(lib) = sta::verbs::lib() {
                        // SAFETY: the id is live until `destroy`.
                        unsafe { (lib.disconnect)(v.id) };
                    }
                }
            }
            Link::Loop(l) => {
                l.disconnected = true;
                if let Some(h) = loops.get_mut(&l.id) {
                    h.disconnected = true;
                }
            }
        }
    }

    /// Consume completion-channel events (verbs; the loopback has none).
    pub fn drain_events(&mut self) {
        if let Link::Verbs(v) = self {
            if let Ok(lib) = sta::verbs::lib() {
                v.drain_events(lib);
            }
        }
    }

    /// Free the QP's transport resources (and the cm_id when the library owns it); the
    /// CQ's completion channel is buried (see [`VerbsIo`]).
    pub fn destroy(self, loops: &mut HashMap<u64, LoopHost>) {
        match self {
            Link::Verbs(mut v) => {
                if let Ok(lib) = sta::verbs::lib() {
                    if let Some(chan) = v.destroy_verbs(lib) {
                        chan.bury();
                    }
                    if v.owns_id {
                        // SAFETY: the library took over this id at qp_connect; nobody else
                        // uses it.
                        unsafe { (lib.destroy_id)(v.id) };
                    }
                }
            }
            Link::Loop(l) => {
                if let Some(h) = loops.get_mut(&l.id) {
                    h.attached = false;
                    h.disconnected = true;
                }
            }
        }
    }
}

/// Accept on verbs (a real `rdma_cm_id`): see [`VerbsIo::accept`].
pub(crate) fn accept_verbs(
    io: &mut VerbsIo,
    id: *mut ffi::RdmaCmIdRaw,
    depth: u16,
    priv_data: &[u8],
) -> Result<(Link, c_int), String> {
    let lib = sta::verbs::lib().map_err(|e| e.to_string())?;
    let (q, fd) = io.accept(lib, id, depth, priv_data)?;
    Ok((Link::Verbs(Box::new(q)), fd))
}

pub fn set_owns_id(l: &mut Link) {
    if let Link::Verbs(v) = l {
        v.owns_id = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_work_requests_give_back_credits_and_complete_as_flushed() {
        let mut credits = SqCredits::new(8, 2);
        let batch = [
            Op::Read {
                slot: 1,
                laddr: 0,
                lkey: 0,
                len: 4096,
                raddr: 0,
                rkey: 1,
            },
            Op::Write {
                slot: 2,
                laddr: 0,
                lkey: 0,
                len: 4096,
                raddr: 0,
                rkey: 1,
            },
            Op::Send {
                slot: 3,
                cqe: [0; 16],
                inv: None,
            },
        ];
        for op in &batch {
            assert!(credits.take(op.is_read()));
        }
        assert_eq!((credits.sq_free(), credits.rd_free()), (5, 1));
        let mut synth = VecDeque::new();
        // The first WR was posted; the provider refused the second (and so the third).
        fail_unposted(&mut credits, &mut synth, &batch[1..]);
        assert_eq!((credits.sq_free(), credits.rd_free()), (7, 1));
        let got: Vec<(WcKind, u16, bool, bool)> = synth
            .iter()
            .map(|w| (w.kind, w.slot, w.ok, w.flush))
            .collect();
        assert_eq!(
            got,
            [
                (WcKind::Write, 2, false, true),
                (WcKind::Send, 3, false, true)
            ]
        );
    }
}
