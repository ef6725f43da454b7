//! The NVMe/RDMA link of a soft-engine QP: the verbs side around
//! `nvmf::rdma::RdmaQueue`, which makes the protocol decisions (capsule checks, SQHD,
//! what to READ, WRITE and SEND, credits). Per thread: devices (PD, completion channel,
//! memory registrations); per QP: the queue pair, its completion queue, receive buffers
//! and the verbs work requests built from the machine's plan.
//!
//! Every send-side work request is signaled, so completions return credits one for one;
//! receives are re-posted in one chain per pass and sends go out in one chain per pass
//! (one doorbell each).

// `unsafe` allowed here: verbs calls through rdma-core's function pointers, and the
// registered buffers and work requests the NIC reads and writes.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};

use backend::IoBuf;
use nvmf::rdma::{accept_private_data, RdmaQueue, RejectStatus, SqCredits, WorkRequest, NO_SLOT};
use nvmf::spec::Sqe;

use super::cmd::{Core, Link, QpState, St};
use crate::verbs::ffi::{self, IbvContext, IbvCq, IbvMr, IbvPd, IbvQp, IbvWc};
use crate::verbs::CqChannel;
use crate::verbs::{lib, CmId, ConnRequest, Lib, VerbsError};
use crate::{Event, QpHandle, TaskError, TaskKind, TransportErrorKind};

/// `wr_id` layout: kind in bits 63:56, command slot (or receive slot) in bits 31:0.
const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;
const WR_WRITE: u64 = 3;
const WR_READ: u64 = 4;

fn wr_id(kind: u64, slot: u32) -> u64 {
    kind << 56 | slot as u64
}
fn wr_kind(id: u64) -> u64 {
    id >> 56
}
fn wr_slot(id: u64) -> u32 {
    id as u32
}

/// Most RDMA READs we keep in flight per QP (also bounded by what the host allows).
const MAX_RD_ATOMIC: u8 = 16;

/// Receives posted for a queue until its Fabrics Connect succeeds. A host sends nothing
/// but the Connect before its answer (Linux and SPDK wait for it), so the rest of the
/// ring (HSQSIZE + 1 receives, about 1 MiB at depth 128) is allocated, registered and
/// posted only for a connected queue ([`RdmaLink::grow_receives`]): a peer that opens
/// connections and never sends Connect pins a few buffers each, not a whole ring. A
/// capsule sent early past these finds no receive: the host's QP retries it a few times
/// (RNR, the retry count our accept gives it) and then fails the connection, the host's
/// doing. (A discovery queue grows its ring too once connected; the per-address
/// connection limits bound those.)
const PRE_CONNECT_RECVS: u32 = 4;

/// One RDMA device as one IO thread uses it.
struct Dev {
    ctx: *mut IbvContext,
    pd: *mut IbvPd,
    /// Data buffers registered so far, by address: (capacity, MR). Pool buffers live as
    /// long as the pool (this thread), so a registration stays valid while cached.
    /// Registrations by [`IoBuf::id`] (not by address: an address can come back as
    /// another buffer after the pool frees one; an id never does). A freed buffer's
    /// registration is dropped at the next deadline check (`forget_buffers`).
    mrs: HashMap<u64, (usize, *mut IbvMr)>,
}

/// Per-IO-thread verbs state.
pub(super) struct RdmaThread {
    pub lib: &'static Lib,
    devs: Vec<Dev>,
}

/// Why an RDMA connect request could not be accepted: the reject status to send and
/// what failed.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct AcceptError {
    pub status: RejectStatus,
    #[source]
    pub error: VerbsError,
}

/// Add a QP's completion channel (`fd`, [`RdmaLink::channel_fd`]) to the IO context's
/// epoll set under `tag`.
pub(super) fn watch_channel(
    epoll: &nix::sys::epoll::Epoll,
    fd: c_int,
    tag: u64,
) -> nix::Result<()> {
    use nix::sys::epoll::{EpollEvent, EpollFlags};
    // SAFETY: the completion channel's descriptor stays open until its link is gone and
    // the grace period after it is over; its registration is removed before that
    // (`unwatch_channel`) or goes with the epoll set.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    epoll.add(fd, EpollEvent::new(EpollFlags::EPOLLIN, tag))
}

/// Remove a QP's completion channel from the epoll set (before the link is dropped: its
/// channel stays open for a while, and a late event must not keep waking the thread).
pub(super) fn unwatch_channel(epoll: &nix::sys::epoll::Epoll, fd: c_int) {
    // SAFETY: the descriptor is open (its link is alive).
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    // Fails only if it was not registered: nothing to undo.
    let _ = epoll.delete(fd);
}

fn no_rsc(what: &str) -> AcceptError {
    AcceptError {
        status: RejectStatus::NoResources,
        error: VerbsError::call(what),
    }
}

pub(crate) struct RdmaLink {
    /// The protocol side: capsule checks, SQHD, the work to post, credits.
    pub machine: RdmaQueue,
    id: CmId,
    qp: *mut IbvQp,
    cq: *mut IbvCq,
    /// The CQ's own completion channel, buried when the CQ is destroyed.
    chan: Option<CqChannel>,
    dev: usize,
    /// The device's protection domain (alive as long as the IO thread), for the rest of
    /// the receive ring.
    pd: *mut IbvPd,
    recv_mr: *mut IbvMr,
    /// Receive buffers, `recv_sz` bytes each: slots below `head_slots` here (posted at
    /// accept), the others in `recv_tail` (once connected); moved out while a capsule is
    /// parsed.
    pub recv_buf: Box<[u8]>,
    recv_tail: Box<[u8]>,
    tail_mr: *mut IbvMr,
    head_slots: u32,
    /// Receives the queue has once connected: HSQSIZE + 1 of the CM request.
    depth: u32,
    pub recv_sz: u32,
    pub repost: Vec<u32>,
    /// Receive buffers whose capsule's command is still in flight: one goes back to the
    /// NIC (`repost`) each time a command of the queue is done. So receives posted plus
    /// commands in flight never exceed the queue depth, and a host cannot have more
    /// commands outstanding than HSQSIZE + 1 (its sends find no receive: RNR, its
    /// problem), as Linux nvmet and SPDK repost on completion too.
    pub recv_idle: Vec<u32>,
    pub established: bool,
    pub disconnect_sent: bool,
    sges: Vec<ffi::IbvSge>,
    swrs: Vec<ffi::IbvSendWr>,
    rwrs: Vec<ffi::IbvRecvWr>,
    batch: Vec<WorkRequest>,
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn wc_status_str(lib: &Lib, status: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static NUL-terminated string for any value.
    unsafe {
        let p = (lib.wc_status_str)(status);
        if p.is_null() {
            format!("status {status}")
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

impl RdmaThread {
    pub fn new() -> Result<RdmaThread, VerbsError> {
        Ok(RdmaThread {
            lib: lib()?,
            devs: Vec::new(),
        })
    }

    /// The device of `ctx` (its PD), set up on first use.
    fn dev_for(&mut self, ctx: *mut IbvContext) -> std::io::Result<usize> {
        if let Some(i) = self.devs.iter().position(|d| d.ctx == ctx) {
            return Ok(i);
        }
        // SAFETY: `ctx` is the live device context of a connect request's cm_id.
        let pd = unsafe { (self.lib.alloc_pd)(ctx) };
        if pd.is_null() {
            return Err(errno());
        }
        self.devs.push(Dev {
            ctx,
            pd,
            mrs: HashMap::new(),
        });
        Ok(self.devs.len() - 1)
    }

    /// Deregister the memory regions of freed pool buffers (`ids`, from
    /// `BufPool::take_dropped`): their pages are no longer pinned.
    pub fn forget_buffers(&mut self, ids: &[u64]) {
        let lib = self.lib;
        for d in &mut self.devs {
            for id in ids {
                if let Some((_, mr)) = d.mrs.remove(id) {
                    // SAFETY: `mr` is a live registration of a buffer that is freed: no
                    // work request can use it (a command holding the buffer would have
                    // kept it alive).
                    unsafe { (lib.dereg_mr)(mr) };
                }
            }
        }
    }

    /// Local key of a data buffer, registering it on first use.
    pub fn lkey(&mut self, dev: usize, buf: &IoBuf) -> Option<u32> {
        let lib = self.lib;
        let d = self.devs.get_mut(dev)?;
        let key = buf.id();
        let cap = buf.capacity();
        if let Some(&(c, mr)) = d.mrs.get(&key) {
            if c == cap {
                // SAFETY: `mr` is a live registration.
                return Some(unsafe { (*mr).lkey });
            }
            // SAFETY: as above; replaced below.
            unsafe { (lib.dereg_mr)(mr) };
            d.mrs.remove(&key);
        }
        // SAFETY: `buf` is alive and owns `cap` allocated bytes; the NIC may write them
        // (RDMA READ target) only through work requests posted for a command that holds
        // `buf`. The registration is found again only through this buffer's id, so once
        // the buffer is freed the registration is never used again.
        let mr = unsafe {
            (lib.reg_mr)(
                d.pd,
                buf.as_ptr() as *mut c_void,
                cap,
                ffi::IBV_ACCESS_LOCAL_WRITE,
            )
        };
        if mr.is_null() {
            tracing::warn!("ibv_reg_mr of a {cap}-byte buffer failed: {}", errno());
            return None;
        }
        d.mrs.insert(key, (cap, mr));
        // SAFETY: just registered.
        Some(unsafe { (*mr).lkey })
    }

    /// Create the QP, its CQ (with its own completion channel, [`RdmaLink::channel_fd`]
    /// to watch) and receive buffers for a connect request, post the receives and accept;
    /// the link takes the request's id. On error the request still owns its id (reject
    /// it).
    pub fn accept(
        &mut self,
        req: &mut ConnRequest,
        depth: u16,
        recv_sz: u32,
    ) -> Result<RdmaLink, AcceptError> {
        let lib = self.lib;
        let Some(raw_id) = req.id_raw() else {
            return Err(no_rsc("connect request without an id"));
        };
        // SAFETY: `raw_id` is a live connect-request id handed to this thread.
        let ctx = unsafe { (*raw_id).verbs };
        if ctx.is_null() {
            return Err(no_rsc("cm_id has no device"));
        }
        let dev = self.dev_for(ctx).map_err(|e| AcceptError {
            status: RejectStatus::NoResources,
            error: VerbsError::Call {
                call: "device setup".into(),
                source: e,
                hint: "",
            },
        })?;
        let d = &self.devs[dev];
        let depth32 = depth as u32;
        let max_send_wr = depth32 * 3 + 4;
        let cqe = (max_send_wr + depth32 + 8) as c_int;
        // One channel per CQ (see `crate::verbs::CqChannel`).
        // SAFETY: `ctx` is the live device context of the request's id.
        let chan = unsafe { CqChannel::new(lib, ctx) }.map_err(|e| AcceptError {
            status: RejectStatus::NoResources,
            error: VerbsError::Call {
                call: "ibv_create_comp_channel".into(),
                source: e,
                hint: "",
            },
        })?;
        // SAFETY: `ctx` and `chan` are live.
        let cq = unsafe { (lib.create_cq)(ctx, cqe, std::ptr::null_mut(), chan.raw(), 0) };
        if cq.is_null() {
            return Err(no_rsc("ibv_create_cq"));
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
        // SAFETY: `id` is live, `pd` belongs to its device, `attr` is initialized.
        if unsafe { (lib.create_qp)(raw_id, d.pd, &mut attr) } != 0 {
            let e = no_rsc("rdma_create_qp");
            // SAFETY: `cq` is unused.
            unsafe { (lib.destroy_cq)(cq) };
            return Err(e);
        }
        // SAFETY: rdma_create_qp stored the QP in the id.
        let qp = unsafe { (*raw_id).qp };
        let head_slots = depth32.min(PRE_CONNECT_RECVS);
        let mut recv_buf = vec![0u8; head_slots as usize * recv_sz as usize].into_boxed_slice();
        // SAFETY: `recv_buf` lives in the RdmaLink until after the QP is destroyed.
        let recv_mr = unsafe {
            (lib.reg_mr)(
                d.pd,
                recv_buf.as_mut_ptr() as *mut c_void,
                recv_buf.len(),
                ffi::IBV_ACCESS_LOCAL_WRITE,
            )
        };
        let credits = SqCredits::new(max_send_wr, req.initiator_depth.min(MAX_RD_ATOMIC) as u32);
        let Some(id) = req.take_id() else {
            return Err(no_rsc("connect request without an id"));
        };
        let mut q = RdmaLink {
            machine: RdmaQueue::new(recv_sz as usize, credits, depth),
            id,
            qp,
            cq,
            chan: Some(chan),
            dev,
            pd: d.pd,
            recv_mr,
            recv_buf,
            recv_tail: Box::default(),
            tail_mr: std::ptr::null_mut(),
            head_slots,
            depth: depth32,
            recv_sz,
            repost: (0..head_slots).collect(),
            recv_idle: Vec::with_capacity(depth as usize),
            established: false,
            disconnect_sent: false,
            sges: Vec::with_capacity(depth as usize * 2),
            swrs: Vec::with_capacity(depth as usize * 2),
            rwrs: Vec::with_capacity(depth as usize),
            batch: Vec::with_capacity(depth as usize * 2),
        };
        if recv_mr.is_null() {
            let e = no_rsc("ibv_reg_mr (receive buffers)");
            req.put_id(q.into_id(lib));
            return Err(e);
        }
        if let Err(e) = q.post_recvs(lib) {
            req.put_id(q.into_id(lib));
            return Err(AcceptError {
                status: RejectStatus::NoResources,
                error: VerbsError::Call {
                    call: "ibv_post_recv".into(),
                    source: e,
                    hint: "",
                },
            });
        }
        let pd = accept_private_data(depth);
        let mut param = ffi::RdmaConnParam {
            private_data: pd.as_ptr() as *const c_void,
            private_data_len: pd.len() as u8,
            responder_resources: req.responder_resources.min(MAX_RD_ATOMIC),
            initiator_depth: req.initiator_depth.min(MAX_RD_ATOMIC),
            flow_control: 1,
            // These two go into the REP for the *host's* QP: how often it retries a
            // SEND we have no receive for, and its transport retries. Ours were set by
            // the host's REQ (Linux and SPDK ask for RNR retry 7: forever), so a host
            // that posts no receives for our answers is bounded by the drain deadline
            // instead (`flush_all`, `on_wc`). We post a receive per command slot, so
            // a host within its queue depth never meets an RNR NAK; 6 bounds one past it.
            retry_count: 7,
            rnr_retry_count: 6,
            srq: 0,
            qp_num: 0,
        };
        // SAFETY: `id` is live with a QP; `param` and `pd` outlive the call.
        if unsafe { (lib.accept)(q.id.raw(), &mut param) } != 0 {
            let e = no_rsc("rdma_accept");
            req.put_id(q.into_id(lib));
            return Err(e);
        }
        tracing::debug!(
            // SAFETY: `qp` is live.
            qp_num = unsafe { (*qp).qp_num },
            depth,
            ird = param.responder_resources,
            ord = param.initiator_depth,
            recv_sz,
            "rdma: accepted"
        );
        Ok(q)
    }

    pub fn poll(&mut self, q: &mut RdmaLink, wcs: &mut [IbvWc]) -> usize {
        // SAFETY: `cq` is live; `wcs` has room for `wcs.len()` entries. ibv_poll_cq is an
        // inline of verbs.h calling through the context's ops table.
        let n = unsafe {
            let ctx = (*q.cq).context;
            ((*ctx).ops.poll_cq)(q.cq, wcs.len() as c_int, wcs.as_mut_ptr())
        };
        n.max(0) as usize
    }

    /// Request a completion event for the next completion on `q`'s CQ.
    pub fn arm(&mut self, q: &mut RdmaLink) {
        // SAFETY: `cq` is live; inline ibv_req_notify_cq.
        unsafe {
            let ctx = (*q.cq).context;
            ((*ctx).ops.req_notify_cq)(q.cq, 0);
        }
    }
}

impl RdmaLink {
    fn post_recvs(&mut self, lib: &Lib) -> std::io::Result<()> {
        if self.repost.is_empty() {
            return Ok(());
        }
        let _ = lib;
        self.sges.clear();
        self.rwrs.clear();
        // SAFETY: `recv_mr` is live, and so is `tail_mr` once the tail slots exist
        // (`grow_receives`): no tail slot is in `repost` before.
        let (head_key, tail_key) = unsafe {
            (
                (*self.recv_mr).lkey,
                self.tail_mr.as_ref().map_or(0, |m| m.lkey),
            )
        };
        let (head, tail) = (
            self.recv_buf.as_ptr() as u64,
            self.recv_tail.as_ptr() as u64,
        );
        let sz = self.recv_sz as u64;
        for &slot in &self.repost {
            let (addr, lkey) = match slot.checked_sub(self.head_slots) {
                None => (head + slot as u64 * sz, head_key),
                Some(t) => (tail + t as u64 * sz, tail_key),
            };
            self.sges.push(ffi::IbvSge {
                addr,
                length: self.recv_sz,
                lkey,
            });
        }
        for (i, &slot) in self.repost.iter().enumerate() {
            let sg = &mut self.sges[i] as *mut ffi::IbvSge;
            self.rwrs.push(ffi::IbvRecvWr {
                wr_id: wr_id(WR_RECV, slot),
                next: std::ptr::null_mut(),
                sg_list: sg,
                num_sge: 1,
            });
        }
        let n = self.rwrs.len();
        for i in 0..n - 1 {
            let next = &mut self.rwrs[i + 1] as *mut ffi::IbvRecvWr;
            self.rwrs[i].next = next;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: `qp` is live; the WR chain and its SGEs stay put during the call (no
        // pushes after the pointers were taken); the buffers are registered.
        let rc = unsafe {
            let ctx = (*self.qp).context;
            ((*ctx).ops.post_recv)(self.qp, self.rwrs.as_mut_ptr(), &mut bad)
        };
        self.repost.clear();
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }

    /// Post re-posted receives and as much of the machine's work as credits allow. `buf`
    /// gives a command's data buffer address and local key.
    pub fn flush(
        &mut self,
        lib: &Lib,
        mut buf: impl FnMut(u32) -> Option<(u64, u32)>,
    ) -> std::io::Result<()> {
        self.post_recvs(lib)?;
        self.batch.clear();
        while let Some(w) = self.machine.next_work() {
            self.batch.push(w);
        }
        if self.batch.is_empty() {
            return Ok(());
        }
        self.sges.clear();
        self.swrs.clear();
        for op in &self.batch {
            let (sge, wr) = match op {
                WorkRequest::Read {
                    slot: cmd,
                    off,
                    len,
                    raddr,
                    rkey,
                } => {
                    let (a, lkey) =
                        buf(*cmd).ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
                    let wr = ffi::IbvSendWr {
                        wr_id: wr_id(WR_READ, *cmd),
                        opcode: ffi::IBV_WR_RDMA_READ,
                        send_flags: ffi::IBV_SEND_SIGNALED,
                        remote_addr: *raddr,
                        rkey: *rkey,
                        ..Default::default()
                    };
                    (
                        ffi::IbvSge {
                            addr: a + *off as u64,
                            length: *len,
                            lkey,
                        },
                        wr,
                    )
                }
                WorkRequest::Write {
                    slot: cmd,
                    len,
                    raddr,
                    rkey,
                } => {
                    let (a, lkey) =
                        buf(*cmd).ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
                    let wr = ffi::IbvSendWr {
                        wr_id: wr_id(WR_WRITE, *cmd),
                        opcode: ffi::IBV_WR_RDMA_WRITE,
                        send_flags: ffi::IBV_SEND_SIGNALED,
                        remote_addr: *raddr,
                        rkey: *rkey,
                        ..Default::default()
                    };
                    (
                        ffi::IbvSge {
                            addr: a,
                            length: *len,
                            lkey,
                        },
                        wr,
                    )
                }
                WorkRequest::Send {
                    slot: cmd,
                    cqe,
                    invalidate: inv,
                } => {
                    let wr = ffi::IbvSendWr {
                        wr_id: wr_id(WR_SEND, *cmd),
                        opcode: if inv.is_some() {
                            ffi::IBV_WR_SEND_WITH_INV
                        } else {
                            ffi::IBV_WR_SEND
                        },
                        send_flags: ffi::IBV_SEND_SIGNALED | ffi::IBV_SEND_INLINE,
                        imm_or_inv: inv.unwrap_or(0),
                        ..Default::default()
                    };
                    (
                        ffi::IbvSge {
                            addr: cqe.as_ptr() as u64,
                            length: 16,
                            lkey: 0,
                        },
                        wr,
                    )
                }
            };
            self.sges.push(sge);
            self.swrs.push(wr);
        }
        let n = self.swrs.len();
        for i in 0..n {
            self.swrs[i].sg_list = &mut self.sges[i] as *mut ffi::IbvSge;
            self.swrs[i].num_sge = 1;
            if i + 1 < n {
                self.swrs[i].next = &mut self.swrs[i + 1] as *mut ffi::IbvSendWr;
            }
        }
        tracing::trace!(n, "rdma: posting send work requests");
        let mut bad = std::ptr::null_mut();
        // SAFETY: `qp` is live; the chain, its SGEs and the inline CQE bytes (in `batch`)
        // stay put during the call; data buffers are registered and owned by commands
        // that stay allocated until their completions arrive (or the QP is destroyed).
        let rc = unsafe {
            let ctx = (*self.qp).context;
            ((*ctx).ops.post_send)(self.qp, self.swrs.as_mut_ptr(), &mut bad)
        };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }

    /// `rdma_disconnect` (once): the QP moves to the error state, outstanding work
    /// requests flush, and the host sees the disconnect.
    pub fn disconnect(&mut self, lib: &Lib) {
        if !self.disconnect_sent {
            self.disconnect_sent = true;
            // SAFETY: `id` is live (destroyed only in `destroy`).
            unsafe { (lib.disconnect)(self.id.raw()) };
        }
    }

    fn destroy_verbs(&mut self, lib: &Lib) {
        // SAFETY: each object is live and destroyed once, QP before its CQ and before the
        // receive buffers' registration; nothing posts to the QP afterwards.
        unsafe {
            if !self.qp.is_null() {
                (lib.destroy_qp)(self.id.raw());
                self.qp = std::ptr::null_mut();
            }
            if !self.cq.is_null() {
                (lib.destroy_cq)(self.cq);
                self.cq = std::ptr::null_mut();
            }
            for mr in [&mut self.recv_mr, &mut self.tail_mr] {
                if !mr.is_null() {
                    (lib.dereg_mr)(*mr);
                    *mr = std::ptr::null_mut();
                }
            }
        }
        // The kernel may still queue an event for the CQ just destroyed: the channel is
        // never read through libibverbs again.
        if let Some(c) = self.chan.take() {
            c.bury();
        }
    }

    /// The completion channel's descriptor, to watch for this QP's completions.
    pub fn channel_fd(&self) -> Option<c_int> {
        self.chan.as_ref().map(|c| c.fd())
    }

    /// Consume the CQ's completion events (the CQ is polled anyway).
    pub fn drain_cq_events(&self, lib: &Lib) {
        if let (Some(c), false) = (&self.chan, self.cq.is_null()) {
            // SAFETY: the channel's only CQ is this link's, alive until `destroy_verbs`,
            // which takes the channel away first.
            unsafe { c.drain(lib) };
        }
    }

    /// Undo a half-made link and give its id back (to be rejected).
    fn into_id(mut self, lib: &Lib) -> CmId {
        self.destroy_verbs(lib);
        // The id leaves without being destroyed: swap in a dangling stand-in that Drop
        // (run on `self` below) must not touch; `destroy_verbs` already cleared the rest.
        let id = std::mem::replace(&mut self.id, CmId::placeholder());
        drop(self);
        id
    }

    pub fn dev(&self) -> usize {
        self.dev
    }

    /// Where receive slot `slot` lives: its region (`recv_buf` for the slots posted at
    /// accept, `recv_tail` for the others) and its index in it.
    fn recv_region(&mut self, slot: u32) -> (&mut Box<[u8]>, u32) {
        match slot.checked_sub(self.head_slots) {
            None => (&mut self.recv_buf, slot),
            Some(t) => (&mut self.recv_tail, t),
        }
    }

    /// The queue is connected: allocate and register the rest of its receive ring and
    /// post it with the next flush (see [`PRE_CONNECT_RECVS`]). Once per queue.
    pub fn grow_receives(&mut self, lib: &Lib) -> std::io::Result<()> {
        if !self.tail_mr.is_null() || self.depth <= self.head_slots {
            return Ok(());
        }
        let slots = self.depth - self.head_slots;
        let mut tail = vec![0u8; slots as usize * self.recv_sz as usize].into_boxed_slice();
        // SAFETY: `pd` is the live protection domain of the QP's device; `tail` moves into
        // the link (its heap block stays where it is) and lives until after the QP is
        // destroyed and this registration released (`destroy_verbs`).
        let mr = unsafe {
            (lib.reg_mr)(
                self.pd,
                tail.as_mut_ptr() as *mut c_void,
                tail.len(),
                ffi::IBV_ACCESS_LOCAL_WRITE,
            )
        };
        if mr.is_null() {
            return Err(errno());
        }
        self.recv_tail = tail;
        self.tail_mr = mr;
        self.repost.extend(self.head_slots..self.depth);
        Ok(())
    }

    /// A command of this queue is done: one receive goes back to the NIC.
    pub fn command_released(&mut self) {
        if let Some(i) = self.recv_idle.pop() {
            self.repost.push(i);
        }
    }
}

impl Drop for RdmaThread {
    /// Every QP of the thread is gone before this runs (`StaIo`'s Drop destroys its links
    /// first): deregister the data buffers, then the completion channels and PDs.
    fn drop(&mut self) {
        let lib = self.lib;
        for d in self.devs.drain(..) {
            // SAFETY: each object is live and released once, MRs before their PD; no QP
            // or CQ of this thread uses them any more.
            unsafe {
                for (_, (_, mr)) in d.mrs {
                    (lib.dereg_mr)(mr);
                }
                (lib.dealloc_pd)(d.pd);
            }
        }
    }
}

impl Drop for RdmaLink {
    /// The QP, its CQ and the receive buffers' registration go first, then the cm_id
    /// (its own Drop): after this no work request of the QP touches memory any more, so
    /// its commands' buffers can be recycled.
    fn drop(&mut self) {
        if let Ok(lib) = lib() {
            self.destroy_verbs(lib);
        }
    }
}

/// One work completion of RDMA QP `qp`.
pub(super) fn on_wc(
    core: &mut Core,
    rt: &mut RdmaThread,
    qp: QpHandle,
    st: &mut QpState,
    wc: &IbvWc,
) {
    let kind = wr_kind(wc.wr_id);
    let slot = wr_slot(wc.wr_id);
    if core.wc_logged < 64 {
        core.wc_logged += 1;
        tracing::debug!(
            qp = qp.as_u64(),
            "wc kind {kind} slot {} status {} len {}",
            slot as i32,
            wc.status,
            wc.byte_len
        );
    }
    let Link::Rdma(r) = &mut st.link else {
        return;
    };
    if kind != WR_RECV {
        r.machine.work_completed(kind == WR_READ);
        // The peer took (or answered) work: the drain clock stops. `check_deadlines`
        // starts it again, at its own reading of the clock, while work is outstanding
        // (`core.now` may be from before a long sleep or a stopped process).
        st.tx_stalled_since = None;
        if r.machine.has_work() {
            // Work that waited for send-queue credits goes out at the next flush.
            core.mark_tx(st);
        }
    }
    let Link::Rdma(r) = &mut st.link else {
        return;
    };
    if wc.status != ffi::IBV_WC_SUCCESS {
        // The first failure of the QP only (the rest of its work fails with it); the
        // application logs the queue's loss with the peer, host and subsystem.
        if wc.status != ffi::IBV_WC_WR_FLUSH_ERR && st.disconnect.is_none() && !st.error_reported {
            let what = match kind {
                WR_RECV => "RDMA receive",
                WR_SEND => "RDMA SEND",
                WR_WRITE => "RDMA WRITE",
                WR_READ => "RDMA READ",
                _ => "RDMA work request",
            };
            tracing::warn!(
                qp = qp.as_u64(),
                "{what} failed: {} (the queue is closed)",
                wc_status_str(rt.lib, wc.status)
            );
        }
        st.rx_stopped = true;
        // A flush is the QP going into error for something else: the host's disconnect
        // (or an error reported before it, or our own disconnect, neither reported again).
        let lost = if wc.status == ffi::IBV_WC_WR_FLUSH_ERR {
            TransportErrorKind::PeerClosed
        } else {
            TransportErrorKind::Io
        };
        core.transport_error(qp, st, lost);
        // The commands die with the QP (qp_disconnect frees them once it is destroyed);
        // a failed host-data fetch for the application is reported to it.
        if kind == WR_READ {
            if let Some(c) = core.cmds.get_mut(slot as usize) {
                if c.st == St::H2C && c.qp == qp && c.op.is_none() {
                    c.st = St::App;
                    let user = c.user;
                    core.events.push_back(Event::TaskDone {
                        kind: TaskKind::RdmaRead,
                        qp,
                        user,
                        result: Err(TaskError::QpClosing),
                    });
                }
            }
        }
        return;
    }
    match kind {
        WR_RECV => {
            if st.rx_stopped {
                return;
            }
            let sz = r.recv_sz as usize;
            let (place, i) = r.recv_region(slot);
            let region = std::mem::take(place);
            let off = i as usize * sz;
            let n = (wc.byte_len as usize).min(sz);
            let capsule = &region[off..off + n];
            let before = st.inflight;
            match r.machine.on_recv(capsule) {
                Ok((sqe, data)) => core.on_capsule(qp, st, &sqe, data, true),
                Err(e) => {
                    if !st.error_reported {
                        tracing::warn!(qp = qp.as_u64(), "{e} (the queue is closed)");
                    }
                    st.rx_stopped = true;
                    core.transport_error(qp, st, TransportErrorKind::Protocol);
                }
            }
            let holds_slot = st.inflight > before;
            if let Link::Rdma(r) = &mut st.link {
                *r.recv_region(slot).0 = region;
                // The capsule was copied out; its receive goes back when its command is
                // done (`command_released`), or now if it got no command slot.
                if holds_slot {
                    r.recv_idle.push(slot);
                } else {
                    r.repost.push(slot);
                }
            }
            core.mark_tx(st);
        }
        // The slot is this QP's (a completion only ever names its own QP's slots; the
        // check keeps a stray one from releasing another QP's command).
        WR_SEND if slot != NO_SLOT && core.cmds.get(slot as usize).is_some_and(|c| c.qp == qp) => {
            core.release(st, slot)
        }
        WR_READ => {
            // An RDMA READ of host data finished: the command's data is in.
            let ok = core
                .cmds
                .get(slot as usize)
                .is_some_and(|c| c.st == St::H2C && c.qp == qp);
            if ok {
                core.host_data_done(qp, st, slot, Ok(()));
            }
        }
        _ => {}
    }
}

/// Bytes of one receive buffer: the SQE and the in-capsule data an I/O queue accepts.
pub(super) fn recv_size(max_incapsule: u32) -> u32 {
    Sqe::SIZE as u32 + max_incapsule
}
