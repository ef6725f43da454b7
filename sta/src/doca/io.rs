//! Why this file is over 800 lines: one IO context, its C callbacks (which only fill the
//! inbox) and the `IoContext` implementation that drains it are one unit; the callbacks'
//! safety rests on the inbox layout defined here.
//!
//! One IO thread's DOCA STA context (`struct doca_sta_io` and its progress engine):
//! doca-sta-api.md 5.8-5.11, 5.14-5.15.
//!
//! QPs are STA QPs made with `doca_sta_io_qp_alloc` + `doca_sta_io_qp_accept` on the
//! connect request the daemon's RDMA CM service hands over; the IO context keeps the
//! `rdma_cm_id` (`qp_accept` leaves it to the application) and destroys it after
//! `doca_sta_io_qp_destroy`, which follows the disconnect task. The non-offload callback,
//! the task callbacks and the transport-error callback fill an inbox during
//! `doca_pe_progress`; [`DocaIo::progress`] turns it into contract events.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use doca_sys::*;
use nvmf::spec::{Cqe, Sqe};
use zerocopy::{FromBytes, IntoBytes};

use super::{check, lib, run_ctx_start, run_ctx_stop, submit, Core};
use crate::access::AccessKey;
use crate::contract::{
    AcceptError, CmdToken, EngineError, Event, IoContext, IoSeed, QpHandle, SubsysId, TaskError,
    TaskKind, TlsAccept, TlsPeerInfo, TransportErrorKind,
};
use crate::verbs::{CmId, ConnRequest, RdmaCmEvent};

/// Counters of one IO context, read by the stats source from any thread.
#[derive(Default, Debug)]
pub(crate) struct IoCounters {
    pub non_offloaded: AtomicU64,
    pub busy: AtomicU64,
    pub idle: AtomicU64,
    pub qps: AtomicU64,
}

fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}

/// An IO context created on the main thread (`doca_sta_io_create`), not started.
pub struct DocaIoSeed {
    core: Arc<Core>,
    io: *mut doca_sta_io,
    counters: Arc<IoCounters>,
}

// SAFETY: the context is created, idle, and used by no thread until `start` runs on the
// thread that will own it (the double's `order.io-thread` rule: the first user after start).
unsafe impl Send for DocaIoSeed {}

impl DocaIoSeed {
    pub(crate) fn new(core: Arc<Core>, io: *mut doca_sta_io, counters: Arc<IoCounters>) -> Self {
        DocaIoSeed { core, io, counters }
    }
}

impl Drop for DocaIoSeed {
    fn drop(&mut self) {
        if !self.io.is_null() {
            // SAFETY: created, never started, used by nobody.
            unsafe { (lib().doca_sta_io_destroy)(self.io) };
        }
    }
}

enum IoRaw {
    NonOffload {
        qp: usize,
        sqe: [u8; 64],
        payload: *mut u8,
        len: u32,
        valid: bool,
        nud: u64,
    },
    Task {
        rec: Box<IoTask>,
        ok: bool,
    },
    Transport {
        qp: usize,
        op: u32,
        syndrome: u32,
    },
}

#[derive(Default)]
struct IoInbox {
    raw: Vec<IoRaw>,
}

/// What an IO task's user data points at.
struct IoTask {
    inbox: *mut IoInbox,
    kind: TaskKind,
    qp: QpHandle,
    user: u64,
    token: Option<CmdToken>,
    /// The completion a response task sends, alive until the task completes (whether
    /// DOCA copies it at alloc_init is not documented; SPDK keeps it too).
    _cqe: [u8; 16],
}

struct Qp {
    raw: *mut doca_sta_qp_handle,
    user: u64,
    /// The connect request's id (None for the double's loopback ids, which the test owns).
    cm: Option<CmId>,
    established: bool,
    closing: bool,
    error_reported: bool,
    subsys: Option<SubsysId>,
}

struct Slot<T> {
    gen: u32,
    live: Option<T>,
}

/// A free slot's index: a recycled one, or a new slot at the end.
fn alloc_slot<T>(slots: &mut Vec<Slot<T>>, free: &mut Vec<u32>) -> u32 {
    free.pop().unwrap_or_else(|| {
        slots.push(Slot { gen: 1, live: None });
        (slots.len() - 1) as u32
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum CmdState {
    /// The application's (rule 2).
    Owned,
    /// An rdma_read moves host data into the payload.
    Reading,
    /// A response task was submitted: the engine's again.
    Answering,
}

struct Cmd {
    qp: QpHandle,
    payload: *mut u8,
    len: u32,
    nud: u64,
    state: CmdState,
}

/// One IO thread's DOCA STA context.
pub struct DocaIo {
    core: Arc<Core>,
    io: *mut doca_sta_io,
    pe: *mut doca_pe,
    inbox: *mut IoInbox,
    notify: Option<doca_notification_handle_t>,
    qps: Vec<Slot<Qp>>,
    free_qps: Vec<u32>,
    by_raw: HashMap<usize, u32>,
    cmds: Vec<Slot<Cmd>>,
    free_cmds: Vec<u32>,
    events: VecDeque<Event>,
    /// Commands the engine failed on this context's QPs, from the main context's
    /// CQE-notify events (`Core::route_failures`).
    failures: Arc<super::FailureBox>,
    counters: Arc<IoCounters>,
    tasks_in_flight: usize,
    /// `doca_ctx_start` succeeded (else Drop only frees what was made).
    started: bool,
}

// --- callbacks (inside doca_pe_progress of this context's PE) -----------------------------

unsafe extern "C" fn non_offload_cb(
    qp: *mut doca_sta_qp_handle,
    ud: doca_data,
    cmd: *const u8,
    payload: *mut u8,
    len: u32,
    valid: bool,
    nud: doca_data,
) {
    let mut sqe = [0u8; 64];
    // SAFETY: DOCA hands the 64-byte SQE, valid during the callback.
    unsafe { std::ptr::copy_nonoverlapping(cmd, sqe.as_mut_ptr(), 64) };
    // SAFETY: user data is this context's inbox, registered at start, freed after stop.
    let inbox = unsafe { &mut *(ud.ptr as *mut IoInbox) };
    inbox.raw.push(IoRaw::NonOffload {
        qp: qp as usize,
        sqe,
        payload,
        len,
        valid,
        nud: data_as_u64(nud),
    });
}

unsafe extern "C" fn task_ok(task: *mut doca_sta_producer_task_send, ud: doca_data) {
    // SAFETY: our IO tasks' user data is a leaked Box<IoTask>.
    unsafe { task_done(task, ud, true) }
}

unsafe extern "C" fn task_err(task: *mut doca_sta_producer_task_send, ud: doca_data) {
    // SAFETY: as above.
    unsafe { task_done(task, ud, false) }
}

unsafe fn task_done(task: *mut doca_sta_producer_task_send, ud: doca_data, ok: bool) {
    // SAFETY: made by Box::into_raw at alloc_init; DOCA calls one callback once.
    let rec = unsafe { Box::from_raw(ud.ptr as *mut IoTask) };
    let d = lib();
    // SAFETY: inside its callback the task is ours (doca-sta-api.md 3.4); SPDK frees first.
    unsafe { (d.doca_task_free)((d.doca_sta_producer_send_task_as_task)(task)) };
    // SAFETY: the inbox outlives every task of the context (Drop progresses them out).
    let inbox = unsafe { &mut *rec.inbox };
    inbox.raw.push(IoRaw::Task { rec, ok });
}

unsafe extern "C" fn transport_cb(ev: *const doca_sta_event_transport_err, ud: doca_data) {
    let d = lib();
    let (mut qp, mut op, mut syn) = (std::ptr::null(), 0u32, 0u32);
    // SAFETY: the event is valid during its callback; valid out pointers.
    unsafe {
        (d.doca_sta_event_transport_err_get_qp_handle)(ev, &mut qp);
        (d.doca_sta_event_transport_err_get_operation)(ev, &mut op);
        (d.doca_sta_event_transport_err_get_syndrome)(ev, &mut syn);
    }
    // SAFETY: user data is this context's inbox.
    let inbox = unsafe { &mut *(ud.ptr as *mut IoInbox) };
    inbox.raw.push(IoRaw::Transport {
        qp: qp as usize,
        op,
        syndrome: syn,
    });
}

impl IoSeed for DocaIoSeed {
    type Io = DocaIo;

    /// doca-sta-api.md 5.8 steps 20-26, on the thread that will own the context.
    fn start(mut self) -> Result<DocaIo, EngineError> {
        let d = lib();
        let io = std::mem::replace(&mut self.io, std::ptr::null_mut());
        let inbox = Box::into_raw(Box::<IoInbox>::default());
        let mut me = DocaIo {
            core: self.core.clone(),
            io,
            pe: std::ptr::null_mut(),
            inbox,
            notify: None,
            qps: Vec::new(),
            free_qps: Vec::new(),
            by_raw: HashMap::new(),
            cmds: Vec::new(),
            free_cmds: Vec::new(),
            events: VecDeque::new(),
            failures: Arc::default(),
            counters: self.counters.clone(),
            tasks_in_flight: 0,
            started: false,
        };
        let ud = data_ptr(inbox.cast());
        // SAFETY: the idle context we created, configured in the documented order; the
        // callbacks are ours and the inbox outlives the context (freed in Drop after stop).
        unsafe {
            let ctx = (d.doca_sta_io_as_ctx)(io);
            if ctx.is_null() {
                return Err(EngineError::Library {
                    call: "doca_sta_io_as_ctx",
                    message: "returned NULL".into(),
                });
            }
            check("doca_pe_create", (d.doca_pe_create)(&mut me.pe))?;
            check("doca_pe_connect_ctx", (d.doca_pe_connect_ctx)(me.pe, ctx))?;
            check(
                "doca_sta_io_task_disconnect_set_conf",
                (d.doca_sta_io_task_disconnect_set_conf)(io, Some(task_ok), Some(task_err)),
            )?;
            check(
                "doca_sta_io_event_transport_err_register_cb",
                (d.doca_sta_io_event_transport_err_register_cb)(io, Some(transport_cb), ud),
            )?;
            check(
                "doca_sta_io_non_offload_register_cb",
                (d.doca_sta_io_non_offload_register_cb)(io, Some(non_offload_cb), ud),
            )?;
            check(
                "doca_sta_io_task_non_offload_set_rdma_write_send_conf",
                (d.doca_sta_io_task_non_offload_set_rdma_write_send_conf)(
                    io,
                    Some(task_ok),
                    Some(task_err),
                ),
            )?;
            check(
                "doca_sta_io_task_non_offload_set_rdma_read_conf",
                (d.doca_sta_io_task_non_offload_set_rdma_read_conf)(
                    io,
                    Some(task_ok),
                    Some(task_err),
                ),
            )?;
            run_ctx_start(ctx, me.pe, "doca_ctx_start (IO context)")?;
            me.started = true;
            let mut h: doca_notification_handle_t = Default::default();
            if (d.doca_pe_get_notification_handle)(me.pe, &mut h) == DOCA_SUCCESS {
                me.notify = Some(h);
            }
        }
        Ok(me)
    }
}

/// The ibdev name of the verbs device an `rdma_cm_id` is bound to.
fn cm_id_device_name(id: *mut crate::verbs::ffi::RdmaCmIdRaw) -> Option<String> {
    // SAFETY: `id` is a live connect-request id; `verbs` is its device context, whose
    // `device` points at a `struct ibv_device` (libibverbs/verbs.h: two ops pointers,
    // node_type and transport_type (4 bytes each), then `char name[64]`).
    unsafe {
        let ctx = (*id).verbs;
        if ctx.is_null() || (*ctx).device.is_null() {
            return None;
        }
        let name = ((*ctx).device as *const u8).add(24);
        let bytes = std::slice::from_raw_parts(name, 64);
        let n = bytes.iter().position(|&b| b == 0).unwrap_or(64);
        Some(String::from_utf8_lossy(&bytes[..n]).into_owned())
    }
}

impl DocaIo {
    fn qp(&self, h: QpHandle) -> Option<&Qp> {
        self.qps
            .get(h.idx as usize)
            .filter(|s| s.gen == h.gen)
            .and_then(|s| s.live.as_ref())
    }

    fn qp_mut(&mut self, h: QpHandle) -> Option<&mut Qp> {
        self.qps
            .get_mut(h.idx as usize)
            .filter(|s| s.gen == h.gen)
            .and_then(|s| s.live.as_mut())
    }

    fn cmd(&mut self, t: CmdToken) -> Option<&mut Cmd> {
        self.cmds
            .get_mut(t.idx as usize)
            .filter(|s| s.gen == t.gen)
            .and_then(|s| s.live.as_mut())
    }

    fn free_cmd(&mut self, t: CmdToken) {
        if let Some(s) = self.cmds.get_mut(t.idx as usize).filter(|s| s.gen == t.gen) {
            if s.live.take().is_some() {
                s.gen = s.gen.wrapping_add(1);
                self.free_cmds.push(t.idx);
            }
        }
    }

    /// Accept a connect request's id on network device `dev` (doca-sta-api.md 5.9,
    /// generation A: alloc, then accept with the NVMe-oF accept private data).
    fn accept_raw(
        &mut self,
        cm: *mut rdma_cm_id,
        dev: *mut doca_dev,
        depth: u16,
        user: u64,
    ) -> Result<QpHandle, EngineError> {
        let d = lib();
        let mut qp = std::ptr::null_mut();
        // SAFETY: our running context, a network device added to the main context.
        check("doca_sta_io_qp_alloc", unsafe {
            (d.doca_sta_io_qp_alloc)(self.io, dev, &mut qp)
        })?;
        let pd = nvmf::rdma::accept_private_data(depth);
        // SAFETY: a live allocated QP, the id of a connect request nobody else uses, the
        // private data outlives the call.
        let r = unsafe {
            check(
                "doca_sta_io_qp_accept",
                (d.doca_sta_io_qp_accept)(
                    self.io,
                    qp,
                    dev,
                    cm,
                    pd.as_ptr() as *const c_void,
                    pd.len() as u32,
                    std::ptr::null_mut(),
                ),
            )
            .and_then(|()| {
                check(
                    "doca_sta_io_qp_set_user_data",
                    (d.doca_sta_io_qp_set_user_data)(self.io, qp, data_u64(user)),
                )
            })
        };
        if let Err(e) = r {
            // SAFETY: allocated, not connected: destroyable at once.
            unsafe { (d.doca_sta_io_qp_destroy)(self.io, qp) };
            return Err(e);
        }
        let idx = alloc_slot(&mut self.qps, &mut self.free_qps);
        let slot = &mut self.qps[idx as usize];
        slot.live = Some(Qp {
            raw: qp,
            user,
            cm: None,
            established: false,
            closing: false,
            error_reported: false,
            subsys: None,
        });
        self.by_raw.insert(qp as usize, idx);
        self.core.route_failures(qp as usize, Some(&self.failures));
        bump(&self.counters.qps, 1);
        Ok(QpHandle { idx, gen: slot.gen })
    }

    /// Test hook for the DOCA double's loopback host (`doca_double_loop_create`): accept
    /// its id on the first network device and mark it established.
    ///
    /// # Safety
    /// `cm` must be an id the double's `doca_double_loop_create` returned, alive until
    /// this QP is destroyed.
    #[doc(hidden)]
    pub unsafe fn qp_accept_loopback(
        &mut self,
        cm: *mut c_void,
        depth: u16,
        user: u64,
    ) -> Result<QpHandle, EngineError> {
        let dev = self.core.net[0].dev;
        self.accept_raw(cm.cast(), dev, depth, user)
    }

    fn report_transport(&mut self, h: QpHandle, kind: TransportErrorKind) {
        if let Some(q) = self.qp_mut(h) {
            if q.closing || q.error_reported {
                return;
            }
            q.error_reported = true;
            let user = q.user;
            self.events.push_back(Event::TransportError {
                qp: h,
                qp_user: user,
                kind,
            });
        }
    }

    fn handle(&self, raw: usize) -> Option<QpHandle> {
        let idx = *self.by_raw.get(&raw)?;
        Some(QpHandle {
            idx,
            gen: self.qps[idx as usize].gen,
        })
    }

    /// Commands the engine failed on this context's QPs (the main context's CQE-notify
    /// events), as events.
    fn take_failures(&mut self) -> bool {
        let taken = self.failures.take();
        let any = !taken.is_empty();
        for (raw, failure) in taken {
            if let Some(h) = self.handle(raw) {
                let qp_user = self.qp_mut(h).map_or(0, |q| q.user);
                self.events.push_back(Event::CommandFailed {
                    qp: h,
                    qp_user,
                    failure,
                });
            }
        }
        any
    }

    /// Turn the callbacks' records into events.
    fn drain(&mut self) -> bool {
        // SAFETY: our inbox; no callback runs outside doca_pe_progress.
        let raws = std::mem::take(unsafe { &mut (*self.inbox).raw });
        let any = !raws.is_empty();
        for r in raws {
            match r {
                IoRaw::NonOffload {
                    qp,
                    sqe,
                    payload,
                    len,
                    valid,
                    nud,
                } => self.on_non_offload(qp, sqe, payload, len, valid, nud),
                IoRaw::Task { rec, ok } => self.on_task(*rec, ok),
                IoRaw::Transport { qp, op, syndrome } => {
                    let Some(h) = self.handle(qp) else { continue };
                    tracing::debug!(qp = h.as_u64(), op, syndrome, "doca: transport error");
                    self.report_transport(h, TransportErrorKind::Io);
                }
            }
        }
        any
    }

    fn on_non_offload(
        &mut self,
        qp: usize,
        sqe: [u8; 64],
        payload: *mut u8,
        len: u32,
        valid: bool,
        nud: u64,
    ) {
        bump(&self.counters.non_offloaded, 1);
        let Some(h) = self.handle(qp) else {
            tracing::warn!("doca: a capsule for a QP this context does not know");
            return;
        };
        let Ok(sqe) = Sqe::read_from_bytes(&sqe[..]) else {
            return;
        };
        if !valid && !payload.is_null() && len > 0 {
            // Rule 5: no byte of an earlier command reaches the application.
            // SAFETY: DOCA's payload buffer of `len` bytes, ours until answered.
            unsafe { std::ptr::write_bytes(payload, 0, len as usize) };
        }
        let idx = alloc_slot(&mut self.cmds, &mut self.free_cmds);
        let slot = &mut self.cmds[idx as usize];
        slot.live = Some(Cmd {
            qp: h,
            payload,
            len,
            nud,
            state: CmdState::Owned,
        });
        let token = CmdToken { idx, gen: slot.gen };
        let qp_user = self.qp(h).map_or(0, |q| q.user);
        self.events.push_back(Event::NonOffload {
            qp: h,
            qp_user,
            token,
            sqe,
            payload_len: len,
            payload_valid: valid,
        });
    }

    fn on_task(&mut self, rec: IoTask, ok: bool) {
        self.tasks_in_flight = self.tasks_in_flight.saturating_sub(1);
        let result = if ok {
            Ok(())
        } else {
            Err(TaskError::Transport)
        };
        match rec.kind {
            TaskKind::RdmaRead => {
                if let Some(t) = rec.token {
                    if let Some(c) = self.cmd(t) {
                        c.state = CmdState::Owned;
                    }
                }
            }
            TaskKind::RdmaSend | TaskKind::RdmaWriteSend => {
                if let Some(t) = rec.token {
                    self.free_cmd(t);
                }
            }
            TaskKind::QpDisconnect => self.destroy_qp(rec.qp),
        }
        if !ok {
            tracing::debug!(qp = rec.qp.as_u64(), kind = ?rec.kind, "doca: task failed");
        }
        self.events.push_back(Event::TaskDone {
            kind: rec.kind,
            qp: rec.qp,
            user: rec.user,
            result,
        });
    }

    /// After the disconnect task (5.11): `doca_sta_io_qp_destroy`, then the cm_id; the
    /// QP's commands and handle die.
    fn destroy_qp(&mut self, h: QpHandle) {
        let Some(slot) = self.qps.get_mut(h.idx as usize).filter(|s| s.gen == h.gen) else {
            return;
        };
        let Some(q) = slot.live.take() else { return };
        slot.gen = slot.gen.wrapping_add(1);
        self.free_qps.push(h.idx);
        self.by_raw.remove(&(q.raw as usize));
        self.core.route_failures(q.raw as usize, None);
        // SAFETY: its disconnect task completed; nothing uses the handle any more.
        if let Err(e) = check("doca_sta_io_qp_destroy", unsafe {
            (lib().doca_sta_io_qp_destroy)(self.io, q.raw)
        }) {
            tracing::error!(qp = h.as_u64(), "doca: {e}");
        }
        drop(q.cm);
        if let Some(s) = q.subsys {
            self.core.bind(s, -1);
        }
        let dead: Vec<CmdToken> = self
            .cmds
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live.as_ref().is_some_and(|c| c.qp == h))
            .map(|(i, s)| CmdToken {
                idx: i as u32,
                gen: s.gen,
            })
            .collect();
        for t in dead {
            self.free_cmd(t);
        }
        self.counters.qps.fetch_sub(1, Ordering::Relaxed);
    }

    /// Allocate, submit and track a task; `alloc` fills the task pointer.
    fn run_task(
        &mut self,
        rec: IoTask,
        call: &'static str,
        alloc: impl FnOnce(doca_data, *mut u8, *mut *mut doca_sta_producer_task_send) -> doca_error_t,
    ) -> Result<(), TaskError> {
        let qp = rec.qp;
        let rec = Box::into_raw(Box::new(rec));
        let mut t = std::ptr::null_mut();
        // SAFETY: the record lives until the task's callback (or is freed here when the
        // task never started); its CQE bytes are stable inside the box.
        let cqe_ptr = unsafe { (*rec)._cqe.as_mut_ptr() };
        let r = check(call, alloc(data_ptr(rec.cast()), cqe_ptr, &mut t))
            // SAFETY: a task we just allocated.
            .and_then(|()| unsafe { submit(t, "doca_task_submit") });
        match r {
            Ok(()) => {
                self.tasks_in_flight += 1;
                Ok(())
            }
            Err(e) => {
                // SAFETY: not submitted: the record is still ours.
                drop(unsafe { Box::from_raw(rec) });
                tracing::warn!(qp = qp.as_u64(), "doca: {e}");
                Err(TaskError::Transport)
            }
        }
    }

    /// The command of `token` on `qp`, in `state`.
    fn owned_cmd(&mut self, qp: QpHandle, token: CmdToken) -> Result<&mut Cmd, TaskError> {
        let q = self.qp(qp).ok_or(TaskError::NoQp)?;
        if q.closing {
            return Err(TaskError::QpClosing);
        }
        let c = self.cmd(token).ok_or(TaskError::NoCommand)?;
        if c.qp != qp {
            return Err(TaskError::NoCommand);
        }
        if c.state != CmdState::Owned {
            return Err(TaskError::BadState);
        }
        Ok(c)
    }

    fn respond(
        &mut self,
        qp: QpHandle,
        token: CmdToken,
        cqe: &Cqe,
        user: u64,
        kind: TaskKind,
    ) -> Result<(), TaskError> {
        let nud = self.owned_cmd(qp, token)?.nud;
        let raw = self.qp(qp).ok_or(TaskError::NoQp)?.raw;
        let mut c16 = [0u8; 16];
        c16.copy_from_slice(cqe.as_bytes());
        let io = self.io;
        let d = lib();
        let r = if kind == TaskKind::RdmaWriteSend {
            self.run_task(
                IoTask {
                    inbox: self.inbox,
                    kind,
                    qp,
                    user,
                    token: Some(token),
                    _cqe: c16,
                },
                "doca_sta_io_task_non_offload_rdma_write_send_alloc_init",
                // SAFETY: live context and QP, the command's token, a 16-byte completion.
                |ud, c, t| unsafe {
                    (d.doca_sta_io_task_non_offload_rdma_write_send_alloc_init)(
                        io,
                        ud,
                        raw,
                        c,
                        data_u64(nud),
                        t,
                    )
                },
            )
        } else {
            self.run_task(
                IoTask {
                    inbox: self.inbox,
                    kind,
                    qp,
                    user,
                    token: Some(token),
                    _cqe: c16,
                },
                "doca_sta_io_task_non_offload_rdma_send_alloc_init",
                // SAFETY: as above.
                |ud, c, t| unsafe {
                    (d.doca_sta_io_task_non_offload_rdma_send_alloc_init)(
                        io,
                        ud,
                        raw,
                        c,
                        data_u64(nud),
                        t,
                    )
                },
            )
        };
        r?;
        if let Some(c) = self.cmd(token) {
            c.state = CmdState::Answering;
        }
        Ok(())
    }

    fn wait_for_input(&mut self, max_wait: Duration) {
        let Some(fd) = self.notify else {
            std::thread::sleep(max_wait.min(Duration::from_millis(1)));
            return;
        };
        let d = lib();
        // SAFETY: our PE and its notification handle (an fd on Linux).
        unsafe {
            if (d.doca_pe_request_notification)(self.pe) != DOCA_SUCCESS {
                std::thread::sleep(max_wait.min(Duration::from_millis(1)));
                return;
            }
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = max_wait.as_millis().clamp(1, i32::MAX as u128) as i32;
            libc::poll(&mut p, 1, ms);
            (d.doca_pe_clear_notification)(self.pe, fd);
        }
    }
}

impl IoContext for DocaIo {
    /// DOCA STA serves I/O without checking access views, and this engine offers no
    /// reservations: nothing to wait for.
    fn ns_fence(&mut self, _subsys: SubsysId, _nsid: u32) -> crate::Fence {
        crate::Fence::done()
    }
    fn progress(&mut self, max_wait: Duration) -> bool {
        let d = lib();
        // SAFETY: our PE, on its thread, not from a callback.
        let mut did = unsafe { (d.doca_pe_progress)(self.pe) } != 0;
        did |= self.drain();
        did |= self.take_failures();
        if !did && self.events.is_empty() && !max_wait.is_zero() {
            self.wait_for_input(max_wait);
            // SAFETY: as above.
            did = unsafe { (d.doca_pe_progress)(self.pe) } != 0;
            did |= self.drain();
        }
        bump(
            if did {
                &self.counters.busy
            } else {
                &self.counters.idle
            },
            1,
        );
        did
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn busy(&self) -> bool {
        self.tasks_in_flight > 0 || !self.events.is_empty()
    }

    fn qp_count(&self) -> usize {
        self.by_raw.len()
    }

    /// Non-offloaded commands not answered yet (offloaded ones are the DPA's: DOCA does
    /// not tell how many are in flight).
    fn commands_in_flight(&self) -> usize {
        self.cmds.iter().filter(|s| s.live.is_some()).count()
    }

    fn qp_accept_tcp(&mut self, sock: TcpStream, _user: u64) -> Result<QpHandle, AcceptError> {
        drop(sock);
        Err(AcceptError::Unsupported("TCP"))
    }

    fn qp_accept_tcp_tls(
        &mut self,
        sock: TcpStream,
        _user: u64,
        _tls: &TlsAccept,
    ) -> Result<QpHandle, AcceptError> {
        drop(sock);
        Err(AcceptError::Unsupported("TCP"))
    }

    fn qp_tls(&mut self, _qp: QpHandle) -> Option<Result<TlsPeerInfo, String>> {
        None
    }

    fn qp_accept_rdma(
        &mut self,
        mut req: ConnRequest,
        depth: u16,
        user: u64,
    ) -> Result<QpHandle, AcceptError> {
        let reject = |req: ConnRequest, error: String| {
            let status = nvmf::rdma::RejectStatus::NoResources;
            req.reject(status);
            AcceptError::Rejected {
                status,
                error: error.into(),
            }
        };
        let Some(raw) = req.id_raw() else {
            return Err(reject(req, "connect request without an id".into()));
        };
        let name = cm_id_device_name(raw);
        let dev = match name.as_deref() {
            Some(n) => self.core.net.iter().find(|d| d.name == n).map(|d| d.dev),
            None => None,
        };
        let Some(dev) = dev else {
            let msg = format!(
                "connection on RDMA device {} which is not one of the doca engine's network \
                 devices ({})",
                name.as_deref().unwrap_or("?"),
                self.core
                    .net
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return Err(reject(req, msg));
        };
        let Some(id) = req.take_id() else {
            return Err(reject(req, "connect request without an id".into()));
        };
        match self.accept_raw(id.raw().cast(), dev, depth, user) {
            Ok(h) => {
                if let Some(q) = self.qp_mut(h) {
                    q.cm = Some(id);
                }
                Ok(h)
            }
            Err(e) => {
                req.put_id(id);
                Err(reject(req, e.to_string()))
            }
        }
    }

    fn qp_rdma_cm_event(&mut self, qp: QpHandle, ev: RdmaCmEvent) -> Result<(), TaskError> {
        let io = self.io;
        let q = self.qp_mut(qp).ok_or(TaskError::NoQp)?;
        match ev {
            RdmaCmEvent::Established => {
                // A QP whose disconnect task is already submitted is past
                // `connect_established` (doca-sta-api.md 4.8, 5.9, 5.11): ESTABLISHED can
                // reach us after the host's first capsule, and a bad capsule makes the
                // daemon disconnect before it; telling DOCA then is a call on a QP that is
                // going away.
                if q.established || q.closing {
                    return Ok(());
                }
                q.established = true;
                let raw = q.raw;
                // SAFETY: our live, accepted QP.
                check("doca_sta_io_qp_connect_established", unsafe {
                    (lib().doca_sta_io_qp_connect_established)(io, raw)
                })
                .map_err(|e| {
                    tracing::warn!(qp = qp.as_u64(), "doca: {e}");
                    TaskError::Transport
                })
            }
            RdmaCmEvent::Disconnected => {
                self.report_transport(qp, TransportErrorKind::PeerClosed);
                Ok(())
            }
            RdmaCmEvent::Lost => {
                self.report_transport(qp, TransportErrorKind::Io);
                Ok(())
            }
        }
    }

    fn qp_set_user_data(&mut self, qp: QpHandle, user: u64) -> Result<(), TaskError> {
        let io = self.io;
        let q = self.qp_mut(qp).ok_or(TaskError::NoQp)?;
        // SAFETY: our live QP.
        check("doca_sta_io_qp_set_user_data", unsafe {
            (lib().doca_sta_io_qp_set_user_data)(io, q.raw, data_u64(user))
        })
        .map_err(|_| TaskError::BadState)?;
        q.user = user;
        Ok(())
    }

    fn qp_add_subsystem(&mut self, qp: QpHandle, subsys: SubsysId) -> Result<(), TaskError> {
        let io = self.io;
        let subs = self.core.subs_handle(subsys).ok_or(TaskError::BadState)?;
        let core = self.core.clone();
        let q = self.qp_mut(qp).ok_or(TaskError::NoQp)?;
        if q.closing {
            return Err(TaskError::QpClosing);
        }
        if q.subsys.is_some() {
            return Err(TaskError::BadState);
        }
        // SAFETY: our live QP, a live subsystem of our main context.
        check("doca_sta_io_qp_add_subsystem", unsafe {
            (lib().doca_sta_io_qp_add_subsystem)(io, subs, q.raw)
        })
        .map_err(|e| {
            tracing::warn!(qp = qp.as_u64(), "doca: {e}");
            TaskError::BadState
        })?;
        q.subsys = Some(subsys);
        core.bind(subsys, 1);
        Ok(())
    }

    fn qp_connect_set_params(
        &mut self,
        qp: QpHandle,
        _qid: u16,
        sqsize: u16,
        _sqflow_disabled: bool,
    ) -> Result<(), TaskError> {
        let io = self.io;
        let q = self.qp(qp).ok_or(TaskError::NoQp)?;
        if q.closing {
            return Err(TaskError::QpClosing);
        }
        let raw = q.raw;
        // SAFETY: our live QP, while its Connect is outstanding (SPDK passes the
        // Connect's SQSIZE unchanged, 5.10 step 4).
        check("doca_sta_io_qp_connect_set_sq_size", unsafe {
            (lib().doca_sta_io_qp_connect_set_sq_size)(io, raw, sqsize)
        })
        .map_err(|e| {
            tracing::warn!(qp = qp.as_u64(), "doca: {e}");
            TaskError::BadState
        })
    }

    /// Accepted and not enforced: `Caps::access_views` is false (DOCA's DPA checks no
    /// access views).
    fn qp_set_access(&mut self, qp: QpHandle, _key: AccessKey) -> Result<(), TaskError> {
        self.qp(qp).map(|_| ()).ok_or(TaskError::NoQp)
    }

    /// DOCA has no abort: offloaded commands are the DPA's, handed-up ones the
    /// application's; the spec lets a controller not abort any command.
    fn cmd_abort(&mut self, _qp: QpHandle, _cid: u16) -> bool {
        false
    }

    /// DOCA has no call that frees a handed-up command without answering it: the
    /// replaced AER stays DOCA's until its QP closes (one entry per controller reset).
    fn cmd_drop(&mut self, qp: QpHandle, _token: CmdToken) -> Result<(), TaskError> {
        self.qp(qp).ok_or(TaskError::NoQp)?;
        Err(TaskError::BadState)
    }

    fn qp_disconnect(&mut self, qp: QpHandle, user: u64) -> Result<(), TaskError> {
        let q = self.qp(qp).ok_or(TaskError::NoQp)?;
        if q.closing {
            return Err(TaskError::QpClosing);
        }
        let raw = q.raw;
        let io = self.io;
        let d = lib();
        self.run_task(
            IoTask {
                inbox: self.inbox,
                kind: TaskKind::QpDisconnect,
                qp,
                user,
                token: None,
                _cqe: [0; 16],
            },
            "doca_sta_io_task_disconnect_alloc_init",
            // SAFETY: our running context and live QP.
            |ud, _, t| unsafe { (d.doca_sta_io_task_disconnect_alloc_init)(io, ud, raw, t) },
        )?;
        if let Some(q) = self.qp_mut(qp) {
            q.closing = true;
        }
        Ok(())
    }

    fn payload(&mut self, token: CmdToken) -> Result<&mut [u8], TaskError> {
        let c = self.cmd(token).ok_or(TaskError::NoCommand)?;
        if c.state != CmdState::Owned {
            return Err(TaskError::BadState);
        }
        if c.payload.is_null() || c.len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: DOCA's payload buffer of `len` bytes stays valid and untouched by the
        // engine until the answering task is submitted (doca-sta-api.md 3.4); the borrow
        // of `self` ends before any call that could submit one.
        Ok(unsafe { std::slice::from_raw_parts_mut(c.payload, c.len as usize) })
    }

    fn rdma_read(&mut self, qp: QpHandle, token: CmdToken, user: u64) -> Result<(), TaskError> {
        let nud = self.owned_cmd(qp, token)?.nud;
        let raw = self.qp(qp).ok_or(TaskError::NoQp)?.raw;
        let io = self.io;
        let d = lib();
        self.run_task(
            IoTask {
                inbox: self.inbox,
                kind: TaskKind::RdmaRead,
                qp,
                user,
                token: Some(token),
                _cqe: [0; 16],
            },
            "doca_sta_io_task_non_offload_rdma_read_alloc_init",
            // SAFETY: live context and QP, the command's token.
            |ud, _, t| unsafe {
                (d.doca_sta_io_task_non_offload_rdma_read_alloc_init)(io, ud, raw, data_u64(nud), t)
            },
        )?;
        if let Some(c) = self.cmd(token) {
            c.state = CmdState::Reading;
        }
        Ok(())
    }

    fn rdma_write_send(
        &mut self,
        qp: QpHandle,
        token: CmdToken,
        cqe: &Cqe,
        _data_len: u32,
        user: u64,
    ) -> Result<(), TaskError> {
        self.respond(qp, token, cqe, user, TaskKind::RdmaWriteSend)
    }

    fn rdma_send(
        &mut self,
        qp: QpHandle,
        token: CmdToken,
        cqe: &Cqe,
        user: u64,
    ) -> Result<(), TaskError> {
        self.respond(qp, token, cqe, user, TaskKind::RdmaSend)
    }
}

impl Drop for DocaIo {
    /// Disconnect what is left (by task), destroy the QPs, stop and destroy the context
    /// and its PE (5.11, 5.15).
    fn drop(&mut self) {
        let d = lib();
        if !self.started {
            // SAFETY: an idle context that never ran, its PE (if made) and our inbox.
            unsafe {
                (d.doca_sta_io_destroy)(self.io);
                if !self.pe.is_null() {
                    (d.doca_pe_destroy)(self.pe);
                }
                drop(Box::from_raw(self.inbox));
            }
            return;
        }
        let live: Vec<QpHandle> = self
            .qps
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live.as_ref().is_some_and(|q| !q.closing))
            .map(|(i, s)| QpHandle {
                idx: i as u32,
                gen: s.gen,
            })
            .collect();
        for h in live {
            let _ = self.qp_disconnect(h, 0);
        }
        let end = Instant::now() + Duration::from_secs(10);
        while (self.tasks_in_flight > 0 || !self.by_raw.is_empty()) && Instant::now() < end {
            // SAFETY: our PE on its thread.
            let n = unsafe { (d.doca_pe_progress)(self.pe) };
            self.drain();
            if n == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        self.events.clear();
        if !self.by_raw.is_empty() {
            // Destroying a QP whose disconnect did not finish breaks DOCA's rules: leak
            // the context rather than crash the process.
            tracing::error!(
                "doca: IO context teardown: {} QPs did not disconnect within 10 s; the \
                 context is left",
                self.by_raw.len()
            );
            return;
        }
        // SAFETY: no QP or task is left; the context, its PE and our inbox are ours.
        unsafe {
            let ctx = (d.doca_sta_io_as_ctx)(self.io);
            run_ctx_stop(ctx, self.pe, "doca_ctx_stop (IO context)");
            if let Err(e) = check("doca_sta_io_destroy", (d.doca_sta_io_destroy)(self.io)) {
                tracing::error!("doca: {e}");
            }
            if let Err(e) = check("doca_pe_destroy", (d.doca_pe_destroy)(self.pe)) {
                tracing::error!("doca: {e}");
            }
            drop(Box::from_raw(self.inbox));
        }
    }
}
