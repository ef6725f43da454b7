//! Every object the double hands out, behind one lock.
//!
//! Handles are not addresses: a handle is `0xD0CA << 48 | kind << 40 | id` (a
//! non-canonical address, so a program that dereferences one faults at once), ids are
//! never reused (unless a test asks for QP handles to be, as NVIDIA's library may: its
//! handles are addresses; `doca_double_reuse_qp_handles`), and every id ever issued
//! remembers its kind. So a handle of the wrong
//! type, a foreign pointer and a handle used after its object was destroyed are each told
//! apart and named (rules `arg.handle`, `arg.destroyed`).

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::sync::{Mutex, MutexGuard};
use std::thread::ThreadId;
use std::time::Instant;

use doca_sys::*;

use crate::contract::{self, Broken};
use crate::drive::RamDrive;
use crate::link::{Link, VerbsIo};
use crate::stats::Counters;

const TAG: u64 = 0xD0CA << 48;

#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u8)]
pub enum Kind {
    DevInfo = 1,
    Dev,
    Pe,
    Mmap,
    LogBackend,
    Sta,
    StaCtx,
    Io,
    IoCtx,
    Qp,
    Subs,
    Ns,
    Be,
    BeQ,
    StaTask,
    Task,
    Eu,
    EvTransport,
    EvBeTimeout,
    EvCqe,
    EvEuErr,
    Loop,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::DevInfo => "struct doca_devinfo",
            Kind::Dev => "struct doca_dev",
            Kind::Pe => "struct doca_pe",
            Kind::Mmap => "struct doca_mmap",
            Kind::LogBackend => "struct doca_log_backend",
            Kind::Sta => "struct doca_sta",
            Kind::StaCtx | Kind::IoCtx => "struct doca_ctx",
            Kind::Io => "struct doca_sta_io",
            Kind::Qp => "struct doca_sta_qp_handle",
            Kind::Subs => "struct doca_sta_subs_handle",
            Kind::Ns => "struct doca_sta_ns_handle",
            Kind::Be => "struct doca_sta_be_handle",
            Kind::BeQ => "struct doca_sta_be_q_handle",
            Kind::StaTask => "struct doca_sta_producer_task_send",
            Kind::Task => "struct doca_task",
            Kind::Eu => "struct doca_sta_eu_handle",
            Kind::EvTransport => "struct doca_sta_event_transport_err",
            Kind::EvBeTimeout => "struct doca_sta_event_be_timeout",
            Kind::EvCqe => "struct doca_sta_event_cqe_notify",
            Kind::EvEuErr => "struct doca_sta_event_eu_err",
            Kind::Loop => "struct rdma_cm_id (double loopback)",
        }
    }
}

pub fn handle(kind: Kind, id: u64) -> u64 {
    TAG | (kind as u64) << 40 | id
}

pub fn ptr<T>(kind: Kind, id: u64) -> *mut T {
    handle(kind, id) as usize as *mut T
}

/// The kind and id a handle value encodes, if it is one of ours.
pub fn decode(v: u64) -> Option<(u8, u64)> {
    if v & (0xFFFF << 48) != TAG {
        return None;
    }
    Some((((v >> 40) & 0xFF) as u8, v & ((1 << 40) - 1)))
}

/// A context: the main one (`doca_sta`) or an IO one (`doca_sta_io`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum CtxRef {
    Sta(u64),
    Io(u64),
}

impl CtxRef {
    pub fn handle(self) -> *mut doca_ctx {
        match self {
            CtxRef::Sta(id) => ptr(Kind::StaCtx, id),
            CtxRef::Io(id) => ptr(Kind::IoCtx, id),
        }
    }
}

/// The generic `doca_ctx` part of a context.
pub struct Ctx {
    pub state: doca_ctx_states,
    pub pe: Option<u64>,
    pub user: u64,
    pub state_cb: doca_ctx_state_changed_callback_t,
}

impl Default for Ctx {
    fn default() -> Self {
        Self::new()
    }
}

impl Ctx {
    pub fn new() -> Ctx {
        Ctx {
            state: DOCA_CTX_STATE_IDLE,
            pe: None,
            user: 0,
            state_cb: None,
        }
    }
    pub fn idle(&self) -> bool {
        self.state == DOCA_CTX_STATE_IDLE
    }
    pub fn running(&self) -> bool {
        self.state == DOCA_CTX_STATE_RUNNING
    }
}

pub type TaskCb = doca_sta_task_completion_cb_t;

/// A callback to run from `doca_pe_progress`, without the world lock held.
pub enum Cb {
    CtxState {
        cb: doca_ctx_state_changed_callback_t,
        user: u64,
        ctx: CtxRef,
        prev: doca_ctx_states,
        next: doca_ctx_states,
    },
    Task {
        cb: TaskCb,
        task: u64,
        user: u64,
    },
    NonOffload {
        cb: doca_sta_io_non_offload_cb_t,
        qp: u64,
        user: u64,
        cmd: *const u8,
        payload: *mut u8,
        len: u32,
        valid: bool,
        token: u64,
    },
    TransportErr {
        cb: doca_sta_event_transport_err_cb_t,
        ev: u64,
        user: u64,
    },
    BeTimeout {
        cb: doca_sta_event_be_timeout_cb_t,
        ev: u64,
        user: u64,
    },
    CqeNotify {
        cb: doca_sta_event_cqe_notify_cb_t,
        ev: u64,
        user: u64,
    },
}

pub struct DevInfo {
    pub name: String,
    pub iface: String,
    pub pci: Option<String>,
    /// A verbs device (else a test device from DOCA_DOUBLE_TEST_DEVICES).
    pub verbs: bool,
}

pub struct Dev {
    pub info: u64,
}

pub struct Pe {
    pub ctxs: Vec<CtxRef>,
    pub cbs: VecDeque<Cb>,
    pub notify: crate::pe::Notify,
}

pub struct Mmap {
    pub devs: Vec<u64>,
    pub addr: usize,
    pub len: usize,
    /// Set by `doca_mmap_set_dmabuf_memrange`: device memory (a BAR) behind the range.
    pub dmabuf: bool,
    pub perms: u32,
    pub started: bool,
    /// Backend queues using it.
    pub users: u32,
}

#[derive(Clone, Copy)]
pub struct Alloc {
    pub zmalloc: unsafe extern "C" fn(usize, usize, *mut u64) -> *mut std::ffi::c_void,
    pub free: unsafe extern "C" fn(*mut std::ffi::c_void),
    pub vtophys: unsafe extern "C" fn(*const std::ffi::c_void, u32) -> u64,
}

pub struct Sta {
    pub ctx: Ctx,
    pub dev: u64,
    pub net_devs: Vec<u64>,
    pub max_io: u16,
    pub ios: Vec<u64>,
    pub io_created: u16,
    pub subs: Vec<u64>,
    pub bes: Vec<u64>,
    pub alloc: Option<Alloc>,
    pub rm_ns_conf: Option<(TaskCb, TaskCb)>,
    pub beq_conf: Option<(TaskCb, TaskCb)>,
    pub be_timeout_cb: Option<(doca_sta_event_be_timeout_cb_t, u64)>,
    pub eu_err_cb: Option<(doca_sta_event_eu_err_cb_t, u64)>,
    pub cqe_cb: Option<(doca_sta_event_cqe_notify_cb_t, u64)>,
    /// Main-context tasks submitted and not completed.
    pub tasks: Vec<u64>,
    pub eus: Vec<u64>,
    pub be_timeout: std::time::Duration,
    /// CQE-notify events raised on IO threads, delivered by the main PE.
    pub cqe_events: VecDeque<CqeEvent>,
    pub qp_count: u32,
}

pub struct Io {
    pub ctx: Ctx,
    pub sta: u64,
    pub index: u16,
    pub qps: Vec<u64>,
    pub non_offload: Option<(doca_sta_io_non_offload_cb_t, u64)>,
    pub ws_conf: Option<(TaskCb, TaskCb)>,
    pub rd_conf: Option<(TaskCb, TaskCb)>,
    pub disc_conf: Option<(TaskCb, TaskCb)>,
    pub terr_cb: Option<(doca_sta_event_transport_err_cb_t, u64)>,
    pub owner: Option<ThreadId>,
    pub verbs: VerbsIo,
    /// Free data buffers (from the application's allocator).
    pub bufs: Vec<Buf>,
    pub bufs_total: u32,
    pub eu_comp: u64,
    pub eu_tx: u64,
    pub tasks: u32,
}

/// A data buffer from the application's allocator, with a PRP list page.
pub struct Buf {
    pub va: *mut u8,
    pub phys: u64,
    pub cap: usize,
    pub prp_va: *mut u64,
    pub prp_phys: u64,
    /// Memory registrations, by verbs device context.
    pub mrs: Vec<(usize, *mut sta::verbs::ffi::IbvMr)>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum QpSt {
    Allocated,
    Accepted,
    Established,
    Disconnecting,
    Disconnected,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CmdSt {
    Free,
    /// Non-offloaded, with the application.
    App,
    /// Non-offloaded, an rdma_read task is moving the host's data.
    AppReading,
    /// Non-offloaded, the response task's WRITE/SEND is posted.
    AppSending,
    /// Offloaded WRITE: the host's data is being read.
    HostRead,
    /// Offloaded, waiting for a backend queue slot.
    BeWait,
    /// Offloaded, in the backend queue.
    Backend,
    /// Offloaded, completion (and data) posted to the host.
    Sending,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CmdKind {
    NonOffload,
    Read,
    Write,
    Flush,
}

pub struct Cmd {
    pub gen: u16,
    pub st: CmdSt,
    pub kind: CmdKind,
    pub sqe: Box<[u8; 64]>,
    pub keyed: Option<nvmf::rdma::KeyedSgl>,
    pub buf: Option<Buf>,
    /// Payload length (non-offloaded) or transfer length (offloaded).
    pub len: u32,
    pub valid: bool,
    pub ns: u64,
    pub task: Option<u64>,
    pub cqe: [u8; 16],
    pub start: Instant,
}

impl Default for Cmd {
    fn default() -> Self {
        Self::new()
    }
}

impl Cmd {
    pub fn new() -> Cmd {
        Cmd {
            gen: 0,
            st: CmdSt::Free,
            kind: CmdKind::NonOffload,
            sqe: Box::new([0; 64]),
            keyed: None,
            buf: None,
            len: 0,
            valid: false,
            ns: 0,
            task: None,
            cqe: [0; 16],
            start: Instant::now(),
        }
    }
}

pub struct Qp {
    pub io: u64,
    pub dev: u64,
    pub user: u64,
    pub st: QpSt,
    pub subs: Option<u64>,
    pub sq_size: Option<u16>,
    pub qid: u16,
    pub sqhd: u16,
    pub depth: u16,
    pub link: Option<Link>,
    pub cmds: Vec<Cmd>,
    pub free_cmds: Vec<u16>,
    pub disc_task: Option<u64>,
    pub disc_done: bool,
    pub error_reported: bool,
    pub index: u16,
    pub qpn: u32,
}

impl Qp {
    /// Commands of this QP the backend still holds.
    pub fn backend_busy(&self) -> bool {
        self.cmds
            .iter()
            .any(|c| matches!(c.st, CmdSt::Backend | CmdSt::BeWait | CmdSt::HostRead))
    }
}

pub struct Subs {
    pub sta: u64,
    pub nqn: String,
    pub devs: Vec<u64>,
    pub nss: Vec<u64>,
    pub qps: u32,
}

pub struct Ns {
    pub subs: u64,
    pub fe: u32,
    pub bs: u32,
    pub be_nsid: u32,
    pub be: u64,
    pub removing: bool,
    /// Removal asked for by a task (else by the synchronous doca_sta_subsystem_rm_ns).
    pub by_task: bool,
    pub inflight: u32,
    pub stats: Counters,
}

pub struct Be {
    pub sta: u64,
    pub queues: Vec<u64>,
    pub drive: RamDrive,
    pub nss: u32,
}

/// Who a backend command belongs to.
#[derive(Clone, Copy, Debug)]
pub struct Pending {
    pub qp: u64,
    pub slot: u16,
    pub gen: u16,
    pub submitted: Instant,
    pub timeout_reported: bool,
}

pub struct BeQ {
    pub be: u64,
    pub mmaps: [u64; 4],
    pub entries: u32,
    pub sq_va: usize,
    pub cq_va: usize,
    pub sq_db_va: usize,
    pub cq_db_va: usize,
    pub sq_tail: u32,
    pub cq_head: u32,
    pub phase: bool,
    pub slots: Vec<Option<Pending>>,
    pub free_cids: Vec<u16>,
    pub waiting: VecDeque<(u64, u16, u16)>,
    /// The doorbells are plain memory: the double's RAM drive serves this queue.
    pub null: bool,
    pub drive_q: crate::drive::DriveQueue,
    pub destroying: bool,
    pub eu: u64,
    pub stats: Counters,
    /// `doca_sta_get_be_queue_mapping_info`: the EU serving the queue.
    pub map: Counters,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TaskKind {
    Disconnect,
    RdmaRead,
    RdmaWriteSend,
    RdmaSend,
    RmNs,
    BeqDestroy,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TaskSt {
    Idle,
    Submitted,
    /// Finished; its callback is queued on the PE.
    Done,
}

pub struct Task {
    pub kind: TaskKind,
    pub owner: CtxRef,
    pub user: u64,
    pub st: TaskSt,
    pub status: doca_error_t,
    pub qp: u64,
    pub token: u64,
    pub cqe: [u8; 16],
    pub ns: u64,
    pub beq: u64,
    pub subs: u64,
}

pub struct Eu {
    pub sta: u64,
    pub name: CString,
    pub typ: dpa_sta_eu_type,
    pub id: u16,
    /// The IO context (COMP, TX) or backend queue (BEQ) it stands for.
    pub of: u64,
    pub stats: Counters,
}

pub struct TransportEv {
    pub qp: u64,
    pub op: u32,
    pub syndrome: u32,
    pub vendor: u32,
}

pub struct BeTimeoutEv {
    pub be: u64,
    pub beq: u64,
}

#[derive(Clone)]
pub struct CqeEvent {
    pub typ: doca_sta_cqe_notify_type,
    pub cqe: [u8; 16],
    pub subs: u64,
    pub qp: u64,
    pub opcode: u8,
    pub cid: u16,
    pub nsid: u32,
    pub lba: u64,
    pub pel: u16,
}

pub enum Event {
    Transport(TransportEv),
    BeTimeout(BeTimeoutEv),
    Cqe(CqeEvent),
}

/// Everything, under [`world`].
pub struct World {
    pub next_id: u64,
    /// Destroyed QPs' ids, handed out again for new QPs (most recent first) while set:
    /// `doca_double_reuse_qp_handles`. `None`: ids are never reused (the default).
    pub reusable_qps: Option<Vec<u64>>,
    pub kinds: HashMap<u64, Kind>,
    pub devinfos: HashMap<u64, DevInfo>,
    /// devinfo id by device name: one object per device for the process's life.
    pub devinfo_by_name: HashMap<String, u64>,
    pub lists: HashMap<usize, Box<[*mut doca_devinfo]>>,
    pub devs: HashMap<u64, Dev>,
    pub pes: HashMap<u64, Pe>,
    pub mmaps: HashMap<u64, Mmap>,
    pub logs: HashMap<u64, ()>,
    pub stas: HashMap<u64, Sta>,
    pub ios: HashMap<u64, Io>,
    pub qps: HashMap<u64, Qp>,
    pub subs: HashMap<u64, Subs>,
    pub nss: HashMap<u64, Ns>,
    pub bes: HashMap<u64, Be>,
    pub beqs: HashMap<u64, BeQ>,
    pub tasks: HashMap<u64, Task>,
    pub eus: HashMap<u64, Eu>,
    pub events: HashMap<u64, Event>,
    pub loops: HashMap<u64, crate::link::LoopHost>,
    /// Allocations made through applications' allocators: va -> (len, phys).
    pub mem: crate::mem::MemMap,
}

// SAFETY: the raw pointers inside (verbs objects, buffers from the application's
// allocator, callback pointers) are only used with the world lock held or, for callback
// arguments, by the thread running doca_pe_progress; every verbs object and buffer may be
// used from any thread.
unsafe impl Send for World {}

static WORLD: Mutex<Option<World>> = Mutex::new(None);

pub struct WorldGuard(MutexGuard<'static, Option<World>>);

impl std::ops::Deref for WorldGuard {
    type Target = World;
    fn deref(&self) -> &World {
        self.0.as_ref().expect("initialised")
    }
}

impl std::ops::DerefMut for WorldGuard {
    fn deref_mut(&mut self) -> &mut World {
        self.0.as_mut().expect("initialised")
    }
}

/// Lock the world.
pub fn world() -> WorldGuard {
    let mut g = WORLD.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        *g = Some(World::new());
    }
    WorldGuard(g)
}

macro_rules! getter {
    ($get:ident, $map:ident, $ty:ty, $kind:expr) => {
        pub fn $get(&mut self, p: *const impl Sized) -> Result<(u64, &mut $ty), Broken> {
            let id = self.id_of($kind, p as u64)?;
            if !self.$map.contains_key(&id) {
                return Err(self.missing($kind, id));
            }
            Ok((id, self.$map.get_mut(&id).expect("checked")))
        }
    };
}

impl World {
    fn new() -> World {
        World {
            next_id: 1,
            reusable_qps: None,
            kinds: HashMap::new(),
            devinfos: HashMap::new(),
            devinfo_by_name: HashMap::new(),
            lists: HashMap::new(),
            devs: HashMap::new(),
            pes: HashMap::new(),
            mmaps: HashMap::new(),
            logs: HashMap::new(),
            stas: HashMap::new(),
            ios: HashMap::new(),
            qps: HashMap::new(),
            subs: HashMap::new(),
            nss: HashMap::new(),
            bes: HashMap::new(),
            beqs: HashMap::new(),
            tasks: HashMap::new(),
            eus: HashMap::new(),
            events: HashMap::new(),
            loops: HashMap::new(),
            mem: crate::mem::MemMap::default(),
        }
    }

    /// A new id for an object of `kind`.
    pub fn new_id(&mut self, kind: Kind) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.kinds.insert(id, kind);
        id
    }

    /// The id inside a handle of `kind`; the error says what is wrong with it.
    pub fn id_of(&self, kind: Kind, v: u64) -> Result<u64, Broken> {
        if v == 0 {
            return Err(Broken::new(
                &contract::HANDLE,
                format!("NULL where a {} is required", kind.name()),
            ));
        }
        let Some((k, id)) = decode(v) else {
            return Err(Broken::new(
                &contract::HANDLE,
                format!(
                    "{v:#x} was never returned by this library (a {} is required)",
                    kind.name()
                ),
            ));
        };
        if k != kind as u8 {
            let got = self
                .kinds
                .get(&id)
                .map(|k| k.name())
                .unwrap_or("unknown object");
            return Err(Broken::new(
                &contract::HANDLE,
                format!("a {got} was passed where a {} is required", kind.name()),
            ));
        }
        Ok(id)
    }

    /// The error for a handle of the right type whose object does not exist.
    pub fn missing(&self, kind: Kind, id: u64) -> Broken {
        if self.kinds.contains_key(&id) {
            Broken::new(
                &contract::DESTROYED,
                format!("{} #{id} was already destroyed", kind.name()),
            )
        } else {
            Broken::new(
                &contract::HANDLE,
                format!("{:#x} was never returned by this library", handle(kind, id)),
            )
        }
    }

    getter!(devinfo, devinfos, DevInfo, Kind::DevInfo);
    getter!(dev, devs, Dev, Kind::Dev);
    getter!(pe, pes, Pe, Kind::Pe);
    getter!(mmap, mmaps, Mmap, Kind::Mmap);
    getter!(sta, stas, Sta, Kind::Sta);
    getter!(io, ios, Io, Kind::Io);
    getter!(qp, qps, Qp, Kind::Qp);
    getter!(subsys, subs, Subs, Kind::Subs);
    getter!(ns, nss, Ns, Kind::Ns);
    getter!(be, bes, Be, Kind::Be);
    getter!(beq, beqs, BeQ, Kind::BeQ);
    getter!(eu, eus, Eu, Kind::Eu);

    /// A `doca_ctx` handle of either kind.
    pub fn ctx_ref(&self, p: *const doca_ctx) -> Result<CtxRef, Broken> {
        let v = p as u64;
        match decode(v) {
            Some((k, id)) if k == Kind::StaCtx as u8 => {
                if self.stas.contains_key(&id) {
                    Ok(CtxRef::Sta(id))
                } else {
                    Err(self.missing(Kind::StaCtx, id))
                }
            }
            Some((k, id)) if k == Kind::IoCtx as u8 => {
                if self.ios.contains_key(&id) {
                    Ok(CtxRef::Io(id))
                } else {
                    Err(self.missing(Kind::IoCtx, id))
                }
            }
            _ => self.id_of(Kind::StaCtx, v).map(CtxRef::Sta),
        }
    }

    pub fn ctx(&mut self, c: CtxRef) -> &mut Ctx {
        match c {
            CtxRef::Sta(id) => &mut self.stas.get_mut(&id).expect("live").ctx,
            CtxRef::Io(id) => &mut self.ios.get_mut(&id).expect("live").ctx,
        }
    }

    /// Queue a callback on the PE a context is connected to.
    pub fn queue_cb(&mut self, c: CtxRef, cb: Cb) {
        let pe = match c {
            CtxRef::Sta(id) => self.stas.get(&id).and_then(|s| s.ctx.pe),
            CtxRef::Io(id) => self.ios.get(&id).and_then(|s| s.ctx.pe),
        };
        if let Some(p) = pe.and_then(|p| self.pes.get_mut(&p)) {
            p.cbs.push_back(cb);
            p.notify.wake();
        }
    }

    /// Change a context's state and queue its state callback.
    pub fn set_ctx_state(&mut self, c: CtxRef, next: doca_ctx_states) {
        let x = self.ctx(c);
        let prev = x.state;
        x.state = next;
        let (cb, user) = (x.state_cb, x.user);
        if cb.is_some() && prev != next {
            self.queue_cb(
                c,
                Cb::CtxState {
                    cb,
                    user,
                    ctx: c,
                    prev,
                    next,
                },
            );
        }
    }

    /// A task finished: record the status and queue its callback (completion or error).
    pub fn finish_task(&mut self, id: u64, status: doca_error_t) {
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        if t.st != TaskSt::Submitted {
            return;
        }
        t.st = TaskSt::Done;
        t.status = status;
        let (kind, owner, user) = (t.kind, t.owner, t.user);
        let confs = match (kind, owner) {
            (TaskKind::RmNs, CtxRef::Sta(s)) => self.stas.get(&s).and_then(|s| s.rm_ns_conf),
            (TaskKind::BeqDestroy, CtxRef::Sta(s)) => self.stas.get(&s).and_then(|s| s.beq_conf),
            (TaskKind::Disconnect, CtxRef::Io(i)) => self.ios.get(&i).and_then(|i| i.disc_conf),
            (TaskKind::RdmaRead, CtxRef::Io(i)) => self.ios.get(&i).and_then(|i| i.rd_conf),
            (TaskKind::RdmaWriteSend | TaskKind::RdmaSend, CtxRef::Io(i)) => {
                self.ios.get(&i).and_then(|i| i.ws_conf)
            }
            _ => None,
        };
        match owner {
            CtxRef::Sta(s) => {
                if let Some(s) = self.stas.get_mut(&s) {
                    s.tasks.retain(|&t| t != id);
                }
            }
            CtxRef::Io(i) => {
                if let Some(i) = self.ios.get_mut(&i) {
                    i.tasks = i.tasks.saturating_sub(1);
                }
            }
        }
        if let Some((ok, err)) = confs {
            let cb = if status == DOCA_SUCCESS { ok } else { err };
            self.queue_cb(owner, Cb::Task { cb, task: id, user });
        }
    }

    /// Objects alive now (devinfos, which live as long as the process, not counted).
    pub fn live_objects(&self) -> usize {
        self.devs.len()
            + self.pes.len()
            + self.mmaps.len()
            + self.stas.len()
            + self.ios.len()
            + self.qps.len()
            + self.subs.len()
            + self.nss.len()
            + self.bes.len()
            + self.beqs.len()
            + self.tasks.len()
            + self.loops.len()
    }
}
