//! Why this file is over 800 lines: the main context follows doca-sta-api.md section 5
//! object by object, and each DOCA object's creation and destruction are kept side by side
//! (devices, subsystems, backends and their queues, namespaces), so the teardown order can
//! be checked against the creation order in one place; the IO context is in `io`, memory in
//! `mem`, statistics in `stats`.
//!
//! The `doca` engine: the engine contract over NVIDIA DOCA STA (`doca_sta_*`), loaded at
//! run time through `doca-sys` (feature `doca`). On a BlueField-3 the DPA serves the
//! offloaded READ/WRITE/FLUSH path; this code is the control plane around it and the
//! non-offloaded path, in the call order of `shared/doca-sta-api.md` section 5.
//!
//! - [`Sta`] is the main context (5.2-5.7, 5.12-5.13, 5.16): devices matched by ibdev
//!   name (one STA device, network devices for NVMe-oF traffic), the main progress
//!   engine, subsystems, one backend with one queue per namespace, namespaces, the
//!   `rm_ns` and backend-queue-destroy tasks, the backend-timeout event, statistics.
//! - [`DocaIoSeed`] / [`DocaIo`] (module `io`) are one IO context per IO thread with its
//!   progress engine (5.8-5.11, 5.14-5.15): QP alloc/accept/established/disconnect, the
//!   non-offload callback and its three tasks, transport-error events.
//! - Module `mem` is the allocator handed to `doca_sta_mem_allocator_register` (5.4).
//!
//! Callbacks: DOCA calls them from `doca_pe_progress`; ours only record what happened in
//! an inbox (rule 3 of the contract: events are returned, not called back) and the
//! engine turns the records into [`Event`](crate::Event)s / [`MainEvent`]s after progress returns.
//!
//! Backends. DOCA STA drives NVMe queues (`doca_sta_be_add_queue`: SQ/CQ rings and
//! doorbells of a drive). An `nvme` namespace gives its drive's own I/O queue pair
//! ([`Backend::offload_queue`], `backend::nvme::OffloadQueue`): the rings are registered
//! as mmaps of the driver's DMA memory, the doorbell window of BAR0 as a dma-buf mmap at
//! its VFIO-mapped address, and the allocator's memory (module `mem`) is mapped into the
//! drive's VFIO container at IOVA = VA. Without a BAR dma-buf (a stock kernel) NVIDIA's
//! library cannot reach the doorbells and the namespace is refused with that reason; the
//! DOCA double is given the CPU mapping instead (`doca_double_mmap_set_bar_memrange`)
//! and rings the doorbells by stores into it. Any other backend gets SPDK's "null"
//! backend of doca-sta-api.md 5.6: engine-allocated SQ/CQ rings and a 16-byte doorbell
//! area in allocator memory. What serves those rings: with the DOCA double loaded, its
//! RAM drive (so a RAM or file namespace under `engine: doca` is served from the double's
//! memory, not from the configured backend, whose size and block size only describe it);
//! with NVIDIA's library nothing would, so [`Sta::ns_add`] refuses it with
//! [`EngineError::Unsupported`].
//!
//! Errors: every failing DOCA call becomes [`EngineError::Library`] naming the call and
//! `doca_error_get_descr`; at run time a QP whose task fails is reported as a transport
//! error (the application disconnects it) and a failed Connect-time call reaches the
//! daemon as a [`TaskError`](crate::TaskError) (it answers the Connect with an error status). Never a
//! panic.
//!
//! Not here: `doca_sta_io_qp_connect` (the one-call variant; we use alloc + accept);
//! execution-unit error and CQE-notify events are registered but only logged (the
//! contract has no place for them); per-namespace latency (DOCA's counters have none).

// `unsafe` allowed here: every DOCA call is FFI through doca-sys's function table, the
// callbacks are `extern "C"` functions receiving raw pointers, and the allocator hands
// out raw memory.
#![allow(unsafe_code)]

mod io;
mod mem;
mod stats;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use backend::Backend;
use doca_sys::*;

pub use io::{DocaIo, DocaIoSeed};

use crate::access::AccessPublisher;
use crate::contract::{Caps, CommandFailure, Engine, EngineError, MainEvent, SubsysId};
use crate::stats::Stats;
use nvmf::spec::Status;

/// The loaded library (one per process: DOCA's objects are process-wide).
static LIB: OnceLock<Result<Doca, LoadError>> = OnceLock::new();

/// Load DOCA (or the double) from doca-sys's search path, once per process.
pub fn library() -> Result<&'static Doca, LoadError> {
    LIB.get_or_init(Doca::load).as_ref().map_err(Clone::clone)
}

fn lib() -> &'static Doca {
    // Every object of this module is made after `library()` succeeded.
    match LIB.get() {
        Some(Ok(d)) => d,
        _ => unreachable!("DOCA objects exist only after the library loaded"),
    }
}

/// A DOCA call's result as an engine error naming the call.
pub(crate) fn check(call: &'static str, r: doca_error_t) -> Result<(), EngineError> {
    if r == DOCA_SUCCESS {
        return Ok(());
    }
    let d = lib();
    Err(EngineError::Library {
        call,
        message: format!("{}: {}", d.error_name(r), d.error_descr(r)),
    })
}

/// The settings of the doca engine (`doca:` in the daemon's config).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocaConfig {
    /// ibdev name of the STA device (the DPA-capable function `doca_sta_create` runs
    /// on; SPDK's default `mlx5_0`).
    pub sta_device: String,
    /// ibdev names of the RDMA devices that carry NVMe-oF (SPDK's `rdma_devices`).
    pub net_devices: Vec<String>,
    /// IO contexts that will be created (`doca_sta_set_max_sta_io`): the IO threads.
    pub io_contexts: u16,
    /// Largest transfer the daemon allows (the engine's own limit may be lower).
    pub max_io_size: u32,
    /// Backend command timeout. Only the DOCA double can be told it
    /// (`doca_double_set_be_timeout_ms`); NVIDIA's library has no call for it and uses
    /// its own, and the events we report then carry this value as the limit.
    pub backend_timeout: Duration,
    /// Entries of each backend queue (a power of two; SPDK's null backend uses 128).
    pub be_queue_entries: u16,
}

impl DocaConfig {
    pub fn new(sta_device: &str, net_devices: &[&str]) -> DocaConfig {
        DocaConfig {
            sta_device: sta_device.into(),
            net_devices: net_devices.iter().map(|s| s.to_string()).collect(),
            io_contexts: 1,
            max_io_size: 1 << 20,
            backend_timeout: Duration::from_secs(30),
            be_queue_entries: 128,
        }
    }
}

/// A network device opened for NVMe-oF traffic.
pub(crate) struct NetDev {
    pub name: String,
    pub dev: *mut doca_dev,
}

/// One namespace's backend (doca-sta-api.md 5.6): a backend object and one queue, either
/// a drive's I/O queue pair (`drive`) or the null backend's rings and doorbells in
/// allocator memory (`mem`).
struct BeQueue {
    be: *mut doca_sta_be_handle,
    /// NULL once destroyed by its task.
    beq: *mut doca_sta_be_q_handle,
    mmaps: Vec<*mut doca_mmap>,
    mem: Vec<*mut c_void>,
    /// The drive's queue pair handed to DOCA (an `nvme` namespace).
    drive: Option<backend::nvme::OffloadQueue>,
    /// The drive whose VFIO container maps the allocator's memory (`mem::attach_device`).
    attached: Option<Arc<dyn backend::nvme::DeviceAccess>>,
}

impl BeQueue {
    /// Nothing created yet; `free_backend` releases whatever a failed set-up added.
    fn empty() -> BeQueue {
        BeQueue {
            be: std::ptr::null_mut(),
            beq: std::ptr::null_mut(),
            mmaps: Vec::new(),
            mem: Vec::new(),
            drive: None,
            attached: None,
        }
    }
}

struct Ns {
    raw: *mut doca_sta_ns_handle,
    be: BeQueue,
    /// `rm_ns` submitted (user), or done and waiting for the queue destroy.
    removing: Option<u64>,
    rm_ns_done: bool,
    /// A backend-queue-destroy task runs.
    beq_destroying: bool,
}

struct Subsys {
    raw: *mut doca_sta_subs_handle,
    ns: BTreeMap<u32, Ns>,
}

#[derive(Clone, Copy, Debug)]
enum MainTaskKind {
    RmNs,
    /// `for_remove`: part of `ns_remove` (no event of its own).
    BeqDestroy {
        for_remove: bool,
    },
}

/// What a main-context task's user data points at.
struct MainTask {
    core: *const Core,
    kind: MainTaskKind,
    subsys: SubsysId,
    nsid: u32,
    user: u64,
}

enum MainRaw {
    Task { rec: Box<MainTask>, ok: bool },
    BeTimeout { beq: usize },
}

/// The main context's mutable state (control path only; one lock, never on the data
/// path).
struct MainState {
    subsys: BTreeMap<u32, Subsys>,
    /// Destroyed by the application while I/O queues were still bound: destroyed here
    /// once the IO contexts let go of them.
    deferred_destroy: Vec<(u32, Subsys)>,
    next_subsys: u32,
    pending: usize,
    events: VecDeque<MainEvent>,
    /// Counters of namespaces removed (added back to the same (subsystem, nsid)).
    stats_base: BTreeMap<(u32, u32), crate::stats::NsTotals>,
    threads: Vec<Arc<io::IoCounters>>,
    ios_created: u16,
}

/// What the main context and its IO contexts share. Dropped (torn down in the order of
/// doca-sta-api.md 5.16) when the engine and every IO context are gone.
pub(crate) struct Core {
    sta: *mut doca_sta,
    pe: *mut doca_pe,
    sta_dev: *mut doca_dev,
    pub(crate) net: Vec<NetDev>,
    cfg: DocaConfig,
    caps: Caps,
    state: Mutex<MainState>,
    /// Filled by the main callbacks during `doca_pe_progress(main pe)`.
    inbox: Mutex<Vec<MainRaw>>,
    /// QPs bound to each subsystem (`qp_add_subsystem` until the QP is destroyed): DOCA
    /// destroys a subsystem only without them.
    bound: Mutex<BTreeMap<u32, usize>>,
    /// Raw subsystem handles by id, for the IO threads' `qp_add_subsystem`.
    subs_raw: Mutex<BTreeMap<u32, usize>>,
    access: AccessPublisher,
    /// Where the commands the engine failed by itself (the CQE-notify event, on the main
    /// PE) go: the failure box of the IO context that owns the QP (see [`FailureRoutes`]).
    failure_routes: Mutex<FailureRoutes>,
    /// Failures dropped: of QPs gone, under a quarantined handle, or past a box's bound.
    failures_dropped: AtomicU64,
}

/// Bound of a [`FailureBox`]: a host can make the engine fail commands without end, and
/// its IO context takes them only at its next pass.
const FAILURES_HELD: usize = 1024;

/// One IO context's failures not taken yet (raw QP handle, failure).
#[derive(Default)]
pub(crate) struct FailureBox {
    list: Mutex<VecDeque<(usize, CommandFailure)>>,
    waiting: AtomicBool,
}

impl FailureBox {
    /// The failures in order; cheap when there are none (one atomic load).
    pub(crate) fn take(&self) -> Vec<(usize, CommandFailure)> {
        if !self.waiting.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        lock(&self.list).drain(..).collect()
    }

    /// Forget the failures of `qp` (destroyed).
    fn forget(&self, qp: usize) {
        lock(&self.list).retain(|(q, _)| *q != qp);
    }

    /// A failure of `qp`, at the back; false when the oldest went to make room (at most
    /// [`FAILURES_HELD`] wait).
    fn push(&self, qp: usize, f: CommandFailure) -> bool {
        let mut l = lock(&self.list);
        let full = l.len() >= FAILURES_HELD;
        if full {
            l.pop_front();
        }
        l.push_back((qp, f));
        self.waiting.store(true, Ordering::Release);
        !full
    }
}

/// Idle passes of the main PE (see [`FailureRoutes::drained`]) that a destroyed QP's raw
/// handle waits in quarantine.
const QUARANTINE_PASSES: u64 = 2;

/// Bound of the quarantine: past it the handle destroyed first leaves early (QPs
/// destroyed while the main PE never went idle, which a host churning connections could
/// make many).
const QUARANTINE_HELD: usize = 1024;

/// The failure box of each QP's IO context, by raw QP handle (registered at accept, gone
/// at destroy: a failure of a QP already destroyed is dropped, never given to a later QP),
/// and the raw handles of QPs destroyed lately.
///
/// DOCA's handles are addresses, so a QP accepted after another was destroyed may get the
/// same handle, on any IO context. A CQE-notify event of the destroyed QP that the main PE
/// delivers only after that (the daemon runs the main context every 100 ms) would go to the
/// new QP: another controller's, perhaps another host's. So a destroyed QP's handle stays
/// in quarantine until the main PE has been found idle [`QUARANTINE_PASSES`] times. Every
/// event of the destroyed QP was queued before its destroy (the disconnect task, which
/// ends the QP's commands, completed first), so the first idle pass has delivered it; the
/// second is margin. A failure reported under a quarantined handle is dropped and counted,
/// also one of a new QP that got the handle meanwhile: that QP loses the reports of its
/// first moments (about two main-loop ticks when the main PE is quiet) rather than another
/// QP getting them.
#[derive(Default)]
pub(crate) struct FailureRoutes {
    boxes: HashMap<usize, Arc<FailureBox>>,
    /// (raw handle, `idle_passes` at its destroy), oldest first.
    quarantine: VecDeque<(usize, u64)>,
    idle_passes: u64,
}

impl FailureRoutes {
    /// A failure of `qp` into its box; false when it was dropped (no box, quarantined, or
    /// the oldest in the box went to make room).
    fn note(&self, qp: usize, f: CommandFailure) -> bool {
        if self.quarantine.iter().any(|&(q, _)| q == qp) {
            return false;
        }
        self.boxes.get(&qp).is_some_and(|b| b.push(qp, f))
    }

    fn route(&mut self, qp: usize, b: Option<&Arc<FailureBox>>) {
        match b {
            Some(b) => {
                self.boxes.insert(qp, b.clone());
            }
            None => {
                if let Some(b) = self.boxes.remove(&qp) {
                    b.forget(qp);
                }
                if self.quarantine.len() >= QUARANTINE_HELD {
                    self.quarantine.pop_front();
                }
                self.quarantine.push_back((qp, self.idle_passes));
            }
        }
    }

    /// The main PE had nothing to deliver: handles destroyed [`QUARANTINE_PASSES`] such
    /// passes ago leave the quarantine.
    fn drained(&mut self) {
        self.idle_passes += 1;
        while let Some(&(_, at)) = self.quarantine.front() {
            if self.idle_passes - at < QUARANTINE_PASSES {
                break;
            }
            self.quarantine.pop_front();
        }
    }
}

impl Core {
    fn note_failure(&self, qp: usize, f: CommandFailure) {
        // Looked up and pushed under the routes' lock: a destroy of the QP
        // (`route_failures(qp, None)`) comes wholly before (the failure is dropped) or
        // wholly after (its `forget` takes the failure out of the box again).
        if !lock(&self.failure_routes).note(qp, f) {
            self.failures_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// QP `qp` belongs to the IO context whose failures go to `b` (accept), or to none
    /// any more (`None`: destroyed; its failures not taken yet go too, and its handle is
    /// quarantined, see [`FailureRoutes`]).
    pub(crate) fn route_failures(&self, qp: usize, b: Option<&Arc<FailureBox>>) {
        lock(&self.failure_routes).route(qp, b);
    }
}

// SAFETY: the raw pointers are DOCA handles. Main-context calls are made with `state`
// locked (or from the engine's single owner before any IO context exists, or in Drop when
// nothing else is left); IO contexts only read `net` and the maps behind their own locks.
unsafe impl Send for Core {}
// SAFETY: as above.
unsafe impl Sync for Core {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The doca engine's main context.
pub struct Sta {
    core: Arc<Core>,
}

impl Sta {
    /// Engine-failed commands whose report was dropped: their QP was destroyed before the
    /// main context heard of them, their QP's handle was in quarantine (a destroyed QP's,
    /// see `FailureRoutes`), or their IO context had [`FAILURES_HELD`] waiting.
    pub fn failures_dropped(&self) -> u64 {
        self.core.failures_dropped.load(Ordering::Relaxed)
    }
}

fn ibdev_name(info: *const doca_devinfo) -> Result<String, EngineError> {
    let mut buf = [0 as c_char; DOCA_DEVINFO_IBDEV_NAME_SIZE as usize];
    // SAFETY: `info` is an entry of a live device list; the buffer has the documented size.
    check("doca_devinfo_get_ibdev_name", unsafe {
        (lib().doca_devinfo_get_ibdev_name)(info, buf.as_mut_ptr(), buf.len() as u32)
    })?;
    // SAFETY: NUL-terminated by DOCA within the buffer.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// A device DOCA lists, for `nvmf-target preflight`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ibdev: String,
    /// `doca_sta_cap_is_supported` answered DOCA_SUCCESS.
    pub sta_capable: bool,
}

/// Every device DOCA lists (`doca_devinfo_create_list`) and whether it can run STA.
pub fn devices() -> Result<Vec<DeviceInfo>, EngineError> {
    let d = library().map_err(|e| EngineError::Unsupported(e.to_string()))?;
    let mut list = std::ptr::null_mut();
    let mut n = 0u32;
    // SAFETY: valid out pointers; the list is destroyed below.
    check("doca_devinfo_create_list", unsafe {
        (d.doca_devinfo_create_list)(&mut list, &mut n)
    })?;
    let mut out = Vec::new();
    let mut err = None;
    for i in 0..n as usize {
        // SAFETY: `list` has `n` entries.
        let info = unsafe { *list.add(i) };
        match ibdev_name(info) {
            Ok(ibdev) => out.push(DeviceInfo {
                ibdev,
                // SAFETY: a live devinfo.
                sta_capable: unsafe { (d.doca_sta_cap_is_supported)(info) } == DOCA_SUCCESS,
            }),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    // SAFETY: the list from create_list.
    unsafe { (d.doca_devinfo_destroy_list)(list) };
    match err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// The library's version string: NVIDIA's `doca_version_runtime()` when exported, the
/// double's `doca_double_version()` for the double.
pub fn library_version() -> Option<String> {
    let d = library().ok()?;
    let this = libloading::os::unix::Library::this();
    for sym in [
        &b"doca_version_runtime\0"[..],
        &b"doca_double_version\0"[..],
    ] {
        type F = unsafe extern "C" fn() -> *const c_char;
        // SAFETY: both are `const char *(void)` returning a static string.
        if let Ok(f) = unsafe { this.get::<F>(sym) } {
            // SAFETY: as above.
            let p = unsafe { f() };
            if !p.is_null() {
                // SAFETY: a static NUL-terminated string.
                return Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
            }
        }
    }
    let _ = d;
    None
}

/// Open the devices named (doca-sta-api.md 5.2): every name must be listed and STA
/// capable. Returns them in the order asked.
fn open_devices(names: &[&str]) -> Result<Vec<*mut doca_dev>, EngineError> {
    let d = lib();
    let mut list = std::ptr::null_mut();
    let mut n = 0u32;
    // SAFETY: valid out pointers; the list is destroyed below.
    check("doca_devinfo_create_list", unsafe {
        (d.doca_devinfo_create_list)(&mut list, &mut n)
    })?;
    let mut found: Vec<Option<*mut doca_dev>> = vec![None; names.len()];
    let mut seen = Vec::new();
    let mut err = None;
    for i in 0..n as usize {
        // SAFETY: `list` has `n` entries.
        let info = unsafe { *list.add(i) };
        let name = match ibdev_name(info) {
            Ok(s) => s,
            Err(e) => {
                err = Some(e);
                break;
            }
        };
        for (k, want) in names.iter().enumerate() {
            if *want != name || found[k].is_some() {
                continue;
            }
            // SAFETY: a live devinfo.
            if let Err(e) = check("doca_sta_cap_is_supported", unsafe {
                (d.doca_sta_cap_is_supported)(info)
            }) {
                err = Some(EngineError::Unsupported(format!(
                    "device {name} cannot run DOCA STA ({e}); the STA device must be a \
                     BlueField-3 function with DPA access"
                )));
                break;
            }
            // Devices named twice (the STA device also carrying traffic) open once.
            if let Some(j) = names[..k].iter().position(|w| *w == name) {
                found[k] = found[j];
                continue;
            }
            let mut dev = std::ptr::null_mut();
            // SAFETY: a live devinfo, a valid out pointer.
            if let Err(e) = check("doca_dev_open", unsafe {
                (d.doca_dev_open)(info, &mut dev)
            }) {
                err = Some(e);
                break;
            }
            found[k] = Some(dev);
        }
        seen.push(name);
    }
    // SAFETY: the list from create_list; the opened devices stay valid.
    unsafe { (d.doca_devinfo_destroy_list)(list) };
    let opened: Vec<*mut doca_dev> = {
        let mut v: Vec<*mut doca_dev> = found.iter().flatten().copied().collect();
        v.dedup();
        v
    };
    let close_all = || {
        for dev in &opened {
            // SAFETY: opened above, used by nothing yet.
            unsafe { (d.doca_dev_close)(*dev) };
        }
    };
    if let Some(e) = err {
        close_all();
        return Err(e);
    }
    if let Some(k) = found.iter().position(Option::is_none) {
        close_all();
        return Err(EngineError::Unsupported(format!(
            "DOCA device {} not found; DOCA lists: {}",
            names[k],
            if seen.is_empty() {
                "none".to_string()
            } else {
                seen.join(", ")
            }
        )));
    }
    Ok(found.into_iter().flatten().collect())
}

// --- main callbacks ----------------------------------------------------------------------

unsafe extern "C" fn main_task_ok(task: *mut doca_sta_producer_task_send, ud: doca_data) {
    // SAFETY: user data of our main tasks is a leaked Box<MainTask> (freed here, once).
    unsafe { main_task_done(task, ud, true) }
}

unsafe extern "C" fn main_task_err(task: *mut doca_sta_producer_task_send, ud: doca_data) {
    // SAFETY: as above.
    unsafe { main_task_done(task, ud, false) }
}

unsafe fn main_task_done(task: *mut doca_sta_producer_task_send, ud: doca_data, ok: bool) {
    // SAFETY: the pointer was made by Box::into_raw when the task was allocated and
    // DOCA calls exactly one of the two callbacks once.
    let rec = unsafe { Box::from_raw(ud.ptr as *mut MainTask) };
    let d = lib();
    // SAFETY: the task is ours again inside its callback (doca-sta-api.md 3.4).
    unsafe { (d.doca_task_free)((d.doca_sta_producer_send_task_as_task)(task)) };
    // SAFETY: the core outlives its tasks (its Drop progresses them to the end).
    let core = unsafe { &*rec.core };
    lock(&core.inbox).push(MainRaw::Task { rec, ok });
}

unsafe extern "C" fn be_timeout_cb(ev: *const doca_sta_event_be_timeout, ud: doca_data) {
    let mut beq = std::ptr::null();
    // SAFETY: the event is valid during its callback.
    let r = unsafe { (lib().doca_sta_event_be_timeout_get_be_queue_handle)(ev, &mut beq) };
    if r != DOCA_SUCCESS {
        tracing::warn!(
            "doca: backend timeout event without a queue: {}",
            lib().error_descr(r)
        );
        return;
    }
    // SAFETY: user data is the core, registered at start and alive while its PE runs.
    let core = unsafe { &*(ud.ptr as *const Core) };
    lock(&core.inbox).push(MainRaw::BeTimeout { beq: beq as usize });
}

unsafe extern "C" fn eu_err_cb(ev: *const doca_sta_event_eu_err, _ud: doca_data) {
    let mut fatal = false;
    // SAFETY: the event is valid during its callback.
    unsafe { (lib().doca_sta_event_eu_err_is_fatal_error)(ev, &mut fatal) };
    tracing::error!(fatal, "doca: execution unit (DPA handler) error");
}

/// An error completion the engine sent by itself (a capsule that failed validation, or an
/// NVMe error from the drive): the host has its answer already; the IO context that owns
/// the QP reports it as [`Event::CommandFailed`].
unsafe extern "C" fn cqe_notify_cb(ev: *const doca_sta_event_cqe_notify, ud: doca_data) {
    let d = lib();
    let (mut typ, mut cqe, mut qp) = (0, [0u8; 16], std::ptr::null());
    let (mut op, mut cid, mut nsid, mut lba) = (0u8, 0u16, 0u16, 0u64);
    // SAFETY: the event is valid during its callback; valid out pointers and a 16-byte
    // buffer.
    unsafe {
        (d.doca_sta_event_cqe_notify_get_cqe_notify_type)(ev, &mut typ);
        (d.doca_sta_event_cqe_notify_get_cqe)(ev, cqe.as_mut_ptr());
        (d.doca_sta_event_cqe_notify_get_qp_handle)(ev, &mut qp);
        (d.doca_sta_event_cqe_notify_get_capsule_params)(
            ev, &mut op, &mut cid, &mut nsid, &mut lba,
        );
    }
    let status = Status::from_field(u16::from_le_bytes([cqe[14], cqe[15]]));
    let from_backend = typ != DOCA_STA_CQE_NOTIF_NVME_OF_VALIDATION_ERR;
    tracing::debug!(
        from_backend,
        opcode = op,
        cid,
        nsid,
        lba,
        "doca: the engine answered a command with {status}"
    );
    // SAFETY: user data is the core, registered at start and alive while its PE runs.
    let core = unsafe { &*(ud.ptr as *const Core) };
    core.note_failure(
        qp as usize,
        CommandFailure {
            opcode: op,
            error: nvmf::target::CommandError {
                cid,
                nsid: u32::from(nsid),
                // Only I/O queues are offloaded: the opcode says what CDW10-11 is.
                lba: nvmf::spec::opcodes::io::addresses_blocks(op).then_some(lba),
                status,
            },
            from_backend,
        },
    );
}

/// The DOCA double's own calls (`include/doca_double.h`), when that is the library.
fn double_fn<T: Copy>(name: &[u8]) -> Option<T> {
    let d = lib();
    if !d.is_double() {
        return None;
    }
    let this = libloading::os::unix::Library::this();
    // SAFETY: the symbol is the double's, with the prototype of doca_double.h that the
    // caller's T spells; the library stays loaded for the process.
    unsafe { this.get::<T>(name) }.ok().map(|s| *s)
}

impl Sta {
    /// Open the devices, create and start the main context (doca-sta-api.md 5.1-5.3).
    /// Every failure names the DOCA call and DOCA's description of the error.
    pub fn new(cfg: DocaConfig) -> Result<Sta, EngineError> {
        let d = library().map_err(|e| EngineError::Unsupported(e.to_string()))?;
        if cfg.net_devices.is_empty() {
            return Err(EngineError::Unsupported(
                "the doca engine needs at least one network device".into(),
            ));
        }
        if !cfg.be_queue_entries.is_power_of_two() || cfg.be_queue_entries < 2 {
            return Err(EngineError::Unsupported(format!(
                "backend queue entries must be a power of two >= 2, got {}",
                cfg.be_queue_entries
            )));
        }
        let mut names: Vec<&str> = vec![cfg.sta_device.as_str()];
        names.extend(cfg.net_devices.iter().map(String::as_str));
        let devs = open_devices(&names)?;
        let sta_dev = devs[0];
        let net: Vec<NetDev> = cfg
            .net_devices
            .iter()
            .zip(&devs[1..])
            .map(|(n, dev)| NetDev {
                name: n.clone(),
                dev: *dev,
            })
            .collect();
        let mut sta = std::ptr::null_mut();
        // SAFETY: an open device, a valid out pointer.
        if let Err(e) = check("doca_sta_create", unsafe {
            (d.doca_sta_create)(sta_dev, &mut sta)
        }) {
            close_devs(sta_dev, &net);
            return Err(e);
        }
        let caps = match read_caps(sta, &cfg) {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: created above, never started.
                unsafe { (d.doca_sta_destroy)(sta) };
                close_devs(sta_dev, &net);
                return Err(e);
            }
        };
        let core = Arc::new(Core {
            sta,
            pe: std::ptr::null_mut(),
            sta_dev,
            net,
            cfg,
            caps,
            state: Mutex::new(MainState {
                subsys: BTreeMap::new(),
                deferred_destroy: Vec::new(),
                next_subsys: 1,
                pending: 0,
                events: VecDeque::new(),
                stats_base: BTreeMap::new(),
                threads: Vec::new(),
                ios_created: 0,
            }),
            inbox: Mutex::new(Vec::new()),
            bound: Mutex::new(BTreeMap::new()),
            subs_raw: Mutex::new(BTreeMap::new()),
            access: AccessPublisher::default(),
            failure_routes: Mutex::new(FailureRoutes::default()),
            failures_dropped: AtomicU64::new(0),
        });
        let mut core = core;
        let started = {
            let c = Arc::get_mut(&mut core).expect("not shared yet");
            c.start()
        };
        if let Err(e) = started {
            // Core's Drop tears down what was made (a context that did not start is
            // destroyed without a stop).
            drop(core);
            return Err(e);
        }
        tracing::info!(
            "doca: main context running on {} (library {:?}{}), network devices {:?}",
            core.cfg.sta_device,
            d.paths(),
            if d.is_double() {
                ", the test double"
            } else {
                ""
            },
            core.net.iter().map(|n| n.name.as_str()).collect::<Vec<_>>()
        );
        Ok(Sta { core })
    }

    /// Test hook of the DOCA double: stall (or resume) the RAM drive serving a
    /// namespace's backend. Fails with NVIDIA's library.
    #[doc(hidden)]
    pub fn double_stall(&self, subsys: SubsysId, nsid: u32, on: bool) -> Result<(), EngineError> {
        type F = unsafe extern "C" fn(*mut doca_sta_be_handle, i32) -> doca_error_t;
        let f: F = double_fn(b"doca_double_null_drive_stall\0")
            .ok_or_else(|| EngineError::Unsupported("not the DOCA double".into()))?;
        let st = lock(&self.core.state);
        let s = st.subsys.get(&subsys.0).ok_or(EngineError::NoSubsystem)?;
        let ns = s.ns.get(&nsid).ok_or(EngineError::NoNamespace(nsid))?;
        // SAFETY: a live backend handle of ours.
        check("doca_double_null_drive_stall", unsafe {
            f(ns.be.be, on as i32)
        })
    }
}

fn close_devs(sta_dev: *mut doca_dev, net: &[NetDev]) {
    let d = lib();
    let mut closed = vec![sta_dev];
    // SAFETY: devices opened by `open_devices`, used by nothing any more; each once.
    unsafe { (d.doca_dev_close)(sta_dev) };
    for n in net {
        if !closed.contains(&n.dev) {
            closed.push(n.dev);
            // SAFETY: as above.
            unsafe { (d.doca_dev_close)(n.dev) };
        }
    }
}

fn read_caps(sta: *mut doca_sta, cfg: &DocaConfig) -> Result<Caps, EngineError> {
    let d = lib();
    let (mut io_size, mut qsize, mut ioccsz) = (0u32, 0u32, 0u32);
    // SAFETY: a live context, valid out pointers (doca-sta-api.md 4.1).
    unsafe {
        check(
            "doca_sta_get_max_io_size",
            (d.doca_sta_get_max_io_size)(&mut io_size),
        )?;
        check(
            "doca_sta_get_max_io_queue_size",
            (d.doca_sta_get_max_io_queue_size)(sta, &mut qsize),
        )?;
        check(
            "doca_sta_get_max_ioccsz",
            (d.doca_sta_get_max_ioccsz)(&mut ioccsz),
        )?;
    }
    // SPDK clamps its transport limits to these (5.3 step 5); MDTS needs a power of two.
    let io = io_size.min(cfg.max_io_size).max(4096);
    let max_io_size = if io.is_power_of_two() {
        io
    } else {
        io.next_power_of_two() / 2
    };
    Ok(Caps {
        max_io_size,
        // The double refuses an SQ size >= its max_io_queue_size (state.sq-size), so
        // the deepest queue is one less.
        max_queue_depth: qsize.saturating_sub(1).clamp(2, u16::MAX as u32) as u16,
        max_incapsule_data: ioccsz.saturating_sub(64),
        max_h2c_data: max_io_size,
        tcp: false,
        rdma: true,
        // DOCA STA has no hook for access views on the DPA, nor Copy or fused
        // Compare and Write offload (sta::access explains what the daemon does then).
        access_views: false,
        copy: false,
        fused_compare_write: false,
        // DOCA STA takes no namespace size (`ns_resize`).
        resize: false,
    })
}

impl Core {
    /// doca-sta-api.md 5.3 steps 6-14.
    fn start(&mut self) -> Result<(), EngineError> {
        let d = lib();
        let me = self as *const Core as *mut c_void;
        // SAFETY: every call is on the live, idle main context in the documented order;
        // the callbacks are ours and their user data (the core) outlives the context.
        unsafe {
            let ctx = (d.doca_sta_as_ctx)(self.sta);
            if ctx.is_null() {
                return Err(EngineError::Library {
                    call: "doca_sta_as_ctx",
                    message: "returned NULL".into(),
                });
            }
            check("doca_pe_create", (d.doca_pe_create)(&mut self.pe))?;
            check("doca_pe_connect_ctx", (d.doca_pe_connect_ctx)(self.pe, ctx))?;
            let mut added = Vec::new();
            for n in &self.net {
                if !added.contains(&n.dev) {
                    check("doca_sta_add_dev", (d.doca_sta_add_dev)(self.sta, n.dev))?;
                    added.push(n.dev);
                }
            }
            check(
                "doca_sta_subsystem_task_rm_ns_set_conf",
                (d.doca_sta_subsystem_task_rm_ns_set_conf)(
                    self.sta,
                    Some(main_task_ok),
                    Some(main_task_err),
                ),
            )?;
            check(
                "doca_sta_be_task_destroy_queue_set_conf",
                (d.doca_sta_be_task_destroy_queue_set_conf)(
                    self.sta,
                    Some(main_task_ok),
                    Some(main_task_err),
                ),
            )?;
            check(
                "doca_sta_mem_allocator_register",
                (d.doca_sta_mem_allocator_register)(
                    self.sta,
                    Some(mem::zmalloc),
                    Some(mem::free),
                    Some(mem::vtophys),
                ),
            )?;
            check(
                "doca_sta_set_max_sta_io",
                (d.doca_sta_set_max_sta_io)(self.sta, self.cfg.io_contexts.max(1)),
            )?;
            check(
                "doca_sta_event_be_timeout_register_cb",
                (d.doca_sta_event_be_timeout_register_cb)(
                    self.sta,
                    Some(be_timeout_cb),
                    data_ptr(me),
                ),
            )?;
            check(
                "doca_sta_event_eu_err_register_cb",
                (d.doca_sta_event_eu_err_register_cb)(self.sta, Some(eu_err_cb), data_ptr(me)),
            )?;
            check(
                "doca_sta_event_cqe_notify_register_cb",
                (d.doca_sta_event_cqe_notify_register_cb)(
                    self.sta,
                    Some(cqe_notify_cb),
                    data_ptr(me),
                ),
            )?;
            run_ctx_start(ctx, self.pe, "doca_ctx_start (main context)")?;
        }
        type SetTimeout = unsafe extern "C" fn(*mut doca_sta, u32) -> doca_error_t;
        if let Some(f) = double_fn::<SetTimeout>(b"doca_double_set_be_timeout_ms\0") {
            let ms = self
                .cfg
                .backend_timeout
                .as_millis()
                .clamp(1, u32::MAX as u128) as u32;
            // SAFETY: the double's call on our live context.
            check("doca_double_set_be_timeout_ms", unsafe { f(self.sta, ms) })?;
        }
        Ok(())
    }

    fn subs_handle(&self, id: SubsysId) -> Option<*mut doca_sta_subs_handle> {
        lock(&self.subs_raw)
            .get(&id.0)
            .map(|&p| p as *mut doca_sta_subs_handle)
    }

    /// A QP was bound to (`+1`) or let go of (`-1`) a subsystem.
    pub(crate) fn bind(&self, id: SubsysId, delta: isize) {
        let mut b = lock(&self.bound);
        let n = b.entry(id.0).or_insert(0);
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            b.remove(&id.0);
        }
    }

    fn bound_qps(&self, id: u32) -> usize {
        lock(&self.bound).get(&id).copied().unwrap_or(0)
    }

    /// One pass of the main PE, its callbacks' records applied.
    fn progress_locked(&self, st: &mut MainState) -> bool {
        let d = lib();
        // SAFETY: our live PE, not from inside a callback.
        let did = unsafe { (d.doca_pe_progress)(self.pe) } != 0;
        if !did {
            lock(&self.failure_routes).drained();
        }
        let raws = std::mem::take(&mut *lock(&self.inbox));
        let any = !raws.is_empty();
        for r in raws {
            self.apply(st, r);
        }
        // Subsystems whose QPs are gone now.
        let mut i = 0;
        while i < st.deferred_destroy.len() {
            if self.bound_qps(st.deferred_destroy[i].0) == 0 {
                let (id, s) = st.deferred_destroy.swap_remove(i);
                // SAFETY: a live subsystem without namespaces or QPs.
                if let Err(e) = check("doca_sta_subsystem_destroy", unsafe {
                    (d.doca_sta_subsystem_destroy)(s.raw)
                }) {
                    tracing::error!("doca: subsystem {id}: {e}");
                }
            } else {
                i += 1;
            }
        }
        did || any
    }

    fn apply(&self, st: &mut MainState, r: MainRaw) {
        match r {
            MainRaw::BeTimeout { beq } => {
                let hit = st.subsys.iter().find_map(|(sid, s)| {
                    s.ns.iter()
                        .find(|(_, ns)| ns.be.beq as usize == beq)
                        .map(|(nsid, _)| (*sid, *nsid))
                });
                if let Some((sid, nsid)) = hit {
                    st.events.push_back(MainEvent::BackendTimeout {
                        subsys: SubsysId(sid),
                        nsid,
                        commands: 1,
                        limit: self.cfg.backend_timeout,
                    });
                }
            }
            MainRaw::Task { rec, ok } => {
                let (sid, nsid, user) = (rec.subsys, rec.nsid, rec.user);
                let Some(ns) = st.subsys.get_mut(&sid.0).and_then(|s| s.ns.get_mut(&nsid)) else {
                    return;
                };
                match rec.kind {
                    MainTaskKind::RmNs => {
                        if !ok {
                            // The namespace stays in DOCA; the daemon keeps the subsystem.
                            tracing::error!(
                                "doca: removing namespace {nsid} of subsystem {}: the rm_ns \
                                 task failed; the namespace stays attached",
                                sid.0
                            );
                            ns.removing = None;
                            st.pending = st.pending.saturating_sub(1);
                            return;
                        }
                        ns.rm_ns_done = true;
                        ns.raw = std::ptr::null_mut();
                        if ns.be.beq.is_null() {
                            self.finish_remove(st, sid, nsid);
                        } else if !ns.beq_destroying {
                            if let Err(e) = self.submit_beq_destroy(ns, sid, nsid, user, true) {
                                tracing::error!(
                                    "doca: namespace {nsid} of subsystem {}: {e}; its backend \
                                     queue is left",
                                    sid.0
                                );
                                self.finish_remove(st, sid, nsid);
                            }
                        }
                    }
                    MainTaskKind::BeqDestroy { for_remove } => {
                        ns.beq_destroying = false;
                        if ok {
                            ns.be.beq = std::ptr::null_mut();
                        } else {
                            tracing::error!(
                                "doca: namespace {nsid} of subsystem {}: the backend queue \
                                 destroy task failed",
                                sid.0
                            );
                        }
                        if !for_remove {
                            st.pending = st.pending.saturating_sub(1);
                            st.events.push_back(MainEvent::BeQueueDestroyed {
                                subsys: sid,
                                nsid,
                                user,
                            });
                        }
                        let ns = st.subsys.get_mut(&sid.0).and_then(|s| s.ns.get_mut(&nsid));
                        if let Some(ns) = ns {
                            if ns.rm_ns_done {
                                if ns.be.beq.is_null() || for_remove {
                                    self.finish_remove(st, sid, nsid);
                                } else if let Some(u) = ns.removing {
                                    if let Err(e) = self.submit_beq_destroy(ns, sid, nsid, u, true)
                                    {
                                        tracing::error!("doca: namespace {nsid}: {e}");
                                        self.finish_remove(st, sid, nsid);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    fn submit_beq_destroy(
        &self,
        ns: &mut Ns,
        sid: SubsysId,
        nsid: u32,
        user: u64,
        for_remove: bool,
    ) -> Result<(), EngineError> {
        let rec = Box::into_raw(Box::new(MainTask {
            core: self as *const Core,
            kind: MainTaskKind::BeqDestroy { for_remove },
            subsys: sid,
            nsid,
            user,
        }));
        let d = lib();
        let mut t = std::ptr::null_mut();
        // SAFETY: a live backend queue; the record is freed by the callback, or here if
        // the task never started.
        let r = unsafe {
            check(
                "doca_sta_be_destroy_queue_task_alloc_init",
                (d.doca_sta_be_destroy_queue_task_alloc_init)(
                    ns.be.beq,
                    data_ptr(rec.cast()),
                    &mut t,
                ),
            )
            .and_then(|()| submit(t, "doca_task_submit (backend queue destroy)"))
        };
        match r {
            Ok(()) => {
                ns.beq_destroying = true;
                Ok(())
            }
            Err(e) => {
                // SAFETY: not submitted: still ours.
                drop(unsafe { Box::from_raw(rec) });
                Err(e)
            }
        }
    }

    /// The namespace is out of DOCA and its queue is gone: free the backend.
    fn finish_remove(&self, st: &mut MainState, sid: SubsysId, nsid: u32) {
        let Some(s) = st.subsys.get_mut(&sid.0) else {
            return;
        };
        let Some(ns) = s.ns.remove(&nsid) else { return };
        let user = ns.removing.unwrap_or(0);
        free_backend(ns.be);
        st.pending = st.pending.saturating_sub(1);
        st.events.push_back(MainEvent::NsRemoved {
            subsys: sid,
            nsid,
            user,
        });
    }
}

/// Allocate and submit the `rm_ns` task of namespace `ns_raw` of subsystem `subs_raw`.
/// Its record goes to the completion callback, which frees it; if the task never
/// started, it is freed here and the error returned.
///
/// # Safety
/// `subs_raw` and `ns_raw` are live DOCA handles; `core` outlives the task.
unsafe fn submit_rm_ns(
    core: *const Core,
    subs_raw: *mut doca_sta_subs_handle,
    ns_raw: *mut doca_sta_ns_handle,
    subsys: SubsysId,
    nsid: u32,
    user: u64,
) -> Result<(), EngineError> {
    let d = lib();
    let rec = Box::into_raw(Box::new(MainTask {
        core,
        kind: MainTaskKind::RmNs,
        subsys,
        nsid,
        user,
    }));
    let mut t = std::ptr::null_mut();
    // SAFETY: live handles (caller); the record is freed by the callback, or below if
    // the task never started.
    let r = unsafe {
        check(
            "doca_sta_subsystem_task_rm_ns_alloc_init",
            (d.doca_sta_subsystem_task_rm_ns_alloc_init)(
                subs_raw,
                ns_raw,
                data_ptr(rec.cast()),
                &mut t,
            ),
        )
        .and_then(|()| submit(t, "doca_task_submit (rm_ns)"))
    };
    if r.is_err() {
        // SAFETY: not submitted: still ours.
        drop(unsafe { Box::from_raw(rec) });
    }
    r
}

/// Submit a task; on failure the task is freed (it is still ours, 5.10 step 7).
/// `DOCA_ERROR_AGAIN` is retried a bounded number of times (SPDK retries it: several
/// threads submitting to one DPA execution unit).
pub(crate) unsafe fn submit(
    t: *mut doca_sta_producer_task_send,
    what: &'static str,
) -> Result<(), EngineError> {
    let d = lib();
    // SAFETY: `t` is a task the caller allocated and owns.
    let task = unsafe { (d.doca_sta_producer_send_task_as_task)(t) };
    let mut r = DOCA_ERROR_AGAIN;
    for _ in 0..1000 {
        // SAFETY: as above.
        r = unsafe { (d.doca_task_submit)(task) };
        if r != DOCA_ERROR_AGAIN {
            break;
        }
    }
    if r != DOCA_SUCCESS {
        // SAFETY: a rejected task stays the caller's.
        unsafe { (d.doca_task_free)(task) };
    }
    check(what, r)
}

/// `doca_ctx_start`, then progress until RUNNING when it answers IN_PROGRESS (5.3 step
/// 14), bounded.
unsafe fn run_ctx_start(
    ctx: *mut doca_ctx,
    pe: *mut doca_pe,
    what: &'static str,
) -> Result<(), EngineError> {
    let d = lib();
    // SAFETY: the caller's live context and PE.
    let r = unsafe { (d.doca_ctx_start)(ctx) };
    if r == DOCA_SUCCESS {
        return Ok(());
    }
    if r != DOCA_ERROR_IN_PROGRESS {
        return check(what, r);
    }
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let mut st = 0;
        // SAFETY: as above.
        unsafe {
            (d.doca_pe_progress)(pe);
            check("doca_ctx_get_state", (d.doca_ctx_get_state)(ctx, &mut st))?;
        }
        if st == DOCA_CTX_STATE_RUNNING {
            return Ok(());
        }
        if st == DOCA_CTX_STATE_IDLE || Instant::now() > end {
            return Err(EngineError::Library {
                call: what,
                message: format!("the context did not reach RUNNING (state {st})"),
            });
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// `doca_ctx_stop`, then progress until IDLE (5.15, 5.16 step 5), bounded.
unsafe fn run_ctx_stop(ctx: *mut doca_ctx, pe: *mut doca_pe, what: &'static str) {
    let d = lib();
    // SAFETY: the caller's live context and PE.
    let r = unsafe { (d.doca_ctx_stop)(ctx) };
    if r != DOCA_SUCCESS && r != DOCA_ERROR_IN_PROGRESS {
        tracing::error!("{what}: {}: {}", d.error_name(r), d.error_descr(r));
        return;
    }
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let mut st = 0;
        // SAFETY: as above.
        unsafe {
            (d.doca_pe_progress)(pe);
            (d.doca_ctx_get_state)(ctx, &mut st);
        }
        if st == DOCA_CTX_STATE_IDLE {
            return;
        }
        if Instant::now() > end {
            tracing::error!("{what}: the context did not stop within 10 s");
            return;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

fn free_backend(be: BeQueue) {
    let d = lib();
    if !be.beq.is_null() {
        // Its destroy task failed: DOCA may still use the rings. Leaking them is the only
        // safe answer (destroying the backend now breaks DOCA's rules, 5.13).
        tracing::error!(
            "doca: a backend queue could not be destroyed; its backend, {} mmaps and ring \
             memory are left allocated",
            be.mmaps.len()
        );
        // The drive's queue pair and the memory mappings stay too: DOCA may still use them.
        std::mem::forget(be.drive);
        std::mem::forget(be.attached);
        return;
    }
    // SAFETY: the queue was destroyed by its task (or never made); nothing uses these
    // mmaps and memory any more (5.13).
    unsafe {
        for m in &be.mmaps {
            if let Err(e) = check("doca_mmap_destroy", (d.doca_mmap_destroy)(*m)) {
                tracing::error!("doca: {e}");
            }
        }
        // The queue is gone from DOCA: the drive no longer needs our memory, and the
        // queue pair goes back to the drive (its CQ zeroed, deleted; p2p.rs).
        if let Some(dev) = &be.attached {
            mem::detach_device(dev);
        }
        drop(be.drive);
        if !be.be.is_null() {
            if let Err(e) = check("doca_sta_be_destroy", (d.doca_sta_be_destroy)(be.be)) {
                tracing::error!("doca: {e}");
            }
        }
        for p in be.mem {
            mem::free(p);
        }
    }
}

/// An mmap on the STA device over `len` bytes of host memory at `p`.
///
/// # Safety
/// `p..p + len` stays valid until the mmap is destroyed.
unsafe fn host_mmap(
    core: &Core,
    p: *mut c_void,
    len: usize,
) -> Result<*mut doca_mmap, EngineError> {
    let d = lib();
    let mut m = std::ptr::null_mut();
    // SAFETY: DOCA calls on an mmap we create here, on the live STA device; the range is
    // valid for the mmap's life (the caller's contract).
    unsafe {
        check("doca_mmap_create", (d.doca_mmap_create)(&mut m))?;
        let r = (|| {
            check("doca_mmap_add_dev", (d.doca_mmap_add_dev)(m, core.sta_dev))?;
            check(
                "doca_mmap_set_memrange",
                (d.doca_mmap_set_memrange)(m, p, len),
            )?;
            check(
                "doca_mmap_set_permissions",
                (d.doca_mmap_set_permissions)(m, DOCA_ACCESS_FLAG_LOCAL_READ_WRITE),
            )?;
            check("doca_mmap_start", (d.doca_mmap_start)(m))
        })();
        if let Err(e) = r {
            (d.doca_mmap_destroy)(m);
            return Err(e);
        }
    }
    Ok(m)
}

/// A namespace's backend: the drive's own I/O queue pair for an `nvme` namespace
/// ([`Backend::offload_queue`]), the null backend for anything else. Returns it and the
/// namespace ID on the backend (`be_nsid` of `doca_sta_subsystem_add_ns`).
fn make_backend(
    core: &Core,
    entries: u16,
    backend: &dyn Backend,
) -> Result<(BeQueue, u32), EngineError> {
    match backend.offload_queue(u32::from(entries)) {
        None => {
            if !lib().is_double() {
                return Err(EngineError::Unsupported(format!(
                    "the doca engine offloads to NVMe drives only (doca_sta_be_add_queue \
                     takes a drive's queues); backend {} is not one, and nothing would serve \
                     a null backend's rings on a BlueField",
                    backend.describe()
                )));
            }
            // The null backend's only namespace; SPDK counts from 1.
            Ok((make_null_backend(core, entries)?, 1))
        }
        Some(Err(e)) => Err(EngineError::Unsupported(format!(
            "{}: no I/O queue pair for DOCA STA: {e}",
            backend.describe()
        ))),
        Some(Ok(q)) => {
            let nsid = q.nsid;
            Ok((make_drive_backend(core, q, &backend.describe())?, nsid))
        }
    }
}

/// doca-sta-api.md 5.6 for a drive: the SQ and CQ rings (host DMA memory the driver
/// allocated) as mmaps on the STA device, the doorbell window of BAR0 as a dma-buf mmap,
/// `doca_sta_be_add_queue` with the doorbells' offsets in that window, and the
/// allocator's memory mapped for the drive (DOCA's commands point at it).
fn make_drive_backend(
    core: &Core,
    q: backend::nvme::OffloadQueue,
    what: &str,
) -> Result<BeQueue, EngineError> {
    let d = lib();
    let window_va = q.doorbell_window_addr().ok_or_else(|| {
        EngineError::Unsupported(format!(
            "{what}: BAR0 is not memory-mapped in this process (an emulated controller, or \
             VFIO without an mmap-able BAR0), so the doorbells have no address to register"
        ))
    })?;
    let db = &q.doorbells;
    // Which way the doorbell window is registered: the dma-buf (DOCA's only way); with the
    // double and no dma-buf, the CPU mapping itself (the double rings by CPU stores).
    let dmabuf = match (&db.dmabuf, db.window_dmabuf_offset()) {
        (Some(x), Some(off)) => Some((std::os::fd::AsRawFd::as_raw_fd(&x.fd), off)),
        _ => None,
    };
    type BarRange = unsafe extern "C" fn(*mut doca_mmap, *mut c_void, usize) -> doca_error_t;
    let bar_range: Option<BarRange> = if dmabuf.is_none() {
        let f = double_fn::<BarRange>(b"doca_double_mmap_set_bar_memrange\0");
        if f.is_none() {
            return Err(EngineError::Unsupported(format!(
                "{what}: the kernel cannot export the drive's BAR0 as a dma-buf ({}); DOCA \
                 STA rings the drive's doorbells by PCIe peer-to-peer through one. It needs \
                 VFIO_DEVICE_FEATURE_DMA_BUF (upstream) or NVIDIA's patched kernel \
                 (VFIO_DEVICE_P2P_DMA_BUF); see kernel-patches/README.md",
                db.dmabuf_error.as_deref().unwrap_or("no dma-buf")
            )));
        }
        tracing::warn!(
            "doca: {what}: no BAR0 dma-buf ({}); the DOCA double rings the doorbells through \
             the VFIO mapping instead (NVIDIA's library could not)",
            db.dmabuf_error.as_deref().unwrap_or("no dma-buf")
        );
        f
    } else {
        None
    };
    let dev = Arc::clone(q.controller().device());
    let mut be = BeQueue::empty();
    let (sq, cq) = (q.sq, q.cq);
    let (sq_off, cq_off, wlen) = (db.sq_tail_offset, db.cq_head_offset, db.window_len);
    be.drive = Some(q);
    let r = (|| {
        mem::attach_device(&dev).map_err(|e| EngineError::Unsupported(format!("{what}: {e}")))?;
        be.attached = Some(Arc::clone(&dev));
        // SAFETY: a live running main context and valid out pointers; the rings are the
        // drive queue's DMA memory and the window its BAR0 mapping, both owned by
        // `be.drive` until `free_backend` (after the mmaps are destroyed).
        unsafe {
            check(
                "doca_sta_be_create",
                (d.doca_sta_be_create)(core.sta, &mut be.be),
            )?;
            be.mmaps
                .push(host_mmap(core, sq.host_addr as *mut c_void, sq.bytes)?);
            be.mmaps
                .push(host_mmap(core, cq.host_addr as *mut c_void, cq.bytes)?);
            let mut m = std::ptr::null_mut();
            check("doca_mmap_create", (d.doca_mmap_create)(&mut m))?;
            be.mmaps.push(m);
            check("doca_mmap_add_dev", (d.doca_mmap_add_dev)(m, core.sta_dev))?;
            match (dmabuf, bar_range) {
                (Some((fd, off)), _) => check(
                    "doca_mmap_set_dmabuf_memrange",
                    (d.doca_mmap_set_dmabuf_memrange)(
                        m,
                        fd,
                        window_va as *mut c_void,
                        off as usize,
                        wlen as usize,
                    ),
                )?,
                (None, Some(f)) => check(
                    "doca_double_mmap_set_bar_memrange",
                    f(m, window_va as *mut c_void, wlen as usize),
                )?,
                (None, None) => unreachable!("checked above"),
            }
            check(
                "doca_mmap_set_permissions",
                (d.doca_mmap_set_permissions)(
                    m,
                    DOCA_ACCESS_FLAG_LOCAL_READ_WRITE | DOCA_ACCESS_FLAG_PCI_RELAXED_ORDERING,
                ),
            )?;
            check("doca_mmap_start", (d.doca_mmap_start)(m))?;
            check(
                "doca_sta_be_add_queue",
                (d.doca_sta_be_add_queue)(
                    be.be,
                    be.mmaps[0],
                    be.mmaps[2],
                    sq_off,
                    be.mmaps[1],
                    be.mmaps[2],
                    cq_off,
                    &mut be.beq,
                ),
            )
        }
    })();
    match r {
        Ok(()) => Ok(be),
        Err(e) => {
            free_backend(be);
            Err(e)
        }
    }
}

/// The null backend of doca-sta-api.md 5.6: SQ and CQ rings of `entries` and a 16-byte
/// doorbell area (SQ tail at 0, CQ head at 8), each an mmap on the STA device.
fn make_null_backend(core: &Core, entries: u16) -> Result<BeQueue, EngineError> {
    let d = lib();
    let n = entries as usize;
    let mut be = BeQueue::empty();
    let r = (|| {
        // SAFETY: a live running main context, valid out pointers; the memory comes from
        // our allocator and lives until `free_backend`.
        unsafe {
            check(
                "doca_sta_be_create",
                (d.doca_sta_be_create)(core.sta, &mut be.be),
            )?;
            for len in [n * 64, n * 16, 16] {
                let p = mem::zmalloc(len, 4096, std::ptr::null_mut());
                if p.is_null() {
                    return Err(EngineError::Library {
                        call: "zmalloc (backend rings)",
                        message: format!("no memory for {len} bytes"),
                    });
                }
                be.mem.push(p);
                be.mmaps.push(host_mmap(core, p, len)?);
            }
            check(
                "doca_sta_be_add_queue",
                (d.doca_sta_be_add_queue)(
                    be.be,
                    be.mmaps[0],
                    be.mmaps[2],
                    0,
                    be.mmaps[1],
                    be.mmaps[2],
                    8,
                    &mut be.beq,
                ),
            )
        }
    })();
    match r {
        Ok(()) => Ok(be),
        Err(e) => {
            free_backend(be);
            Err(e)
        }
    }
}

impl Engine for Sta {
    type Io = DocaIo;
    type Seed = DocaIoSeed;

    fn name(&self) -> &'static str {
        "doca"
    }

    fn caps(&self) -> Caps {
        self.core.caps
    }

    fn stats(&self) -> Stats {
        Stats::new(self.core.clone())
    }

    fn subsystem_create(&mut self, nqn: &str) -> Result<SubsysId, EngineError> {
        let d = lib();
        let c = CString::new(nqn)
            .map_err(|_| EngineError::Unsupported(format!("NQN {nqn:?} contains a NUL")))?;
        let mut st = lock(&self.core.state);
        let mut raw = std::ptr::null_mut();
        // SAFETY: the live main context, a NUL-terminated NQN, a valid out pointer.
        let r = unsafe { (d.doca_sta_subsystem_create)(self.core.sta, c.as_ptr(), &mut raw) };
        if r == DOCA_ERROR_ALREADY_EXIST {
            return Err(EngineError::NqnInUse(nqn.to_string()));
        }
        check("doca_sta_subsystem_create", r)?;
        let mut added = Vec::new();
        for n in &self.core.net {
            if added.contains(&n.dev) {
                continue;
            }
            added.push(n.dev);
            // SAFETY: a live subsystem and device.
            if let Err(e) = check("doca_sta_subsystem_add_dev", unsafe {
                (d.doca_sta_subsystem_add_dev)(raw, n.dev)
            }) {
                // SAFETY: ours, without namespaces or QPs.
                unsafe { (d.doca_sta_subsystem_destroy)(raw) };
                return Err(e);
            }
        }
        let id = st.next_subsys;
        st.next_subsys += 1;
        st.subsys.insert(
            id,
            Subsys {
                raw,
                ns: BTreeMap::new(),
            },
        );
        lock(&self.core.subs_raw).insert(id, raw as usize);
        Ok(SubsysId(id))
    }

    fn subsystem_destroy(&mut self, id: SubsysId) -> Result<(), EngineError> {
        let d = lib();
        let mut st = lock(&self.core.state);
        let s = st.subsys.get(&id.0).ok_or(EngineError::NoSubsystem)?;
        if !s.ns.is_empty() {
            return Err(EngineError::SubsystemInUse);
        }
        let s = st.subsys.remove(&id.0).expect("present");
        lock(&self.core.subs_raw).remove(&id.0);
        if self.core.bound_qps(id.0) > 0 {
            // Its I/O queues are still disconnecting: destroyed once they are gone.
            st.deferred_destroy.push((id.0, s));
            return Ok(());
        }
        // SAFETY: a live subsystem without namespaces or bound QPs.
        check("doca_sta_subsystem_destroy", unsafe {
            (d.doca_sta_subsystem_destroy)(s.raw)
        })
    }

    fn ns_add(
        &mut self,
        subsys: SubsysId,
        nsid: u32,
        backend: Arc<dyn Backend>,
    ) -> Result<(), EngineError> {
        let d = lib();
        let mut st = lock(&self.core.state);
        let s = st
            .subsys
            .get_mut(&subsys.0)
            .ok_or(EngineError::NoSubsystem)?;
        if s.ns.contains_key(&nsid) {
            return Err(EngineError::NsExists(nsid));
        }
        let bs = backend.block_size();
        // SAFETY: a plain query.
        if !unsafe { (d.doca_sta_is_logical_block_size_supported)(bs) } {
            return Err(EngineError::BlockSize(bs));
        }
        let (be, be_nsid) = make_backend(&self.core, self.core.cfg.be_queue_entries, &*backend)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: live subsystem and backend, a valid out pointer.
        let r = check("doca_sta_subsystem_add_ns", unsafe {
            (d.doca_sta_subsystem_add_ns)(s.raw, nsid, bs, be_nsid, be.be, &mut raw)
        });
        if let Err(e) = r {
            // The queue was never used: destroy it by task before freeing (5.13).
            let mut ns = Ns {
                raw: std::ptr::null_mut(),
                be,
                removing: Some(0),
                rm_ns_done: true,
                beq_destroying: false,
            };
            drop(st);
            self.discard_ns(&mut ns);
            free_backend(ns.be);
            return Err(e);
        }
        s.ns.insert(
            nsid,
            Ns {
                raw,
                be,
                removing: None,
                rm_ns_done: false,
                beq_destroying: false,
            },
        );
        Ok(())
    }

    /// DOCA STA takes no size for a namespace (`doca_sta_subsystem_add_ns`): the drive's
    /// own namespace bounds its I/O, and a drive's namespace does not grow from our
    /// config. Nothing to follow.
    fn ns_resize(
        &mut self,
        _subsys: SubsysId,
        _nsid: u32,
        _num_blocks: u64,
    ) -> Result<(), EngineError> {
        Err(EngineError::Unsupported(
            "the doca engine cannot resize a namespace live (DOCA STA has no call for it); \
             restart the daemon"
                .into(),
        ))
    }

    fn ns_remove(&mut self, subsys: SubsysId, nsid: u32, user: u64) -> Result<(), EngineError> {
        let core = self.core.clone();
        let mut st = lock(&core.state);
        let base = core.ns_totals_locked(&st, subsys, nsid);
        let s = st
            .subsys
            .get_mut(&subsys.0)
            .ok_or(EngineError::NoSubsystem)?;
        let subs_raw = s.raw;
        let ns =
            s.ns.get_mut(&nsid)
                .filter(|n| n.removing.is_none())
                .ok_or(EngineError::NoNamespace(nsid))?;
        // SAFETY: live subsystem and namespace (both looked up under the state lock).
        unsafe { submit_rm_ns(Arc::as_ptr(&core), subs_raw, ns.raw, subsys, nsid, user)? };
        ns.removing = Some(user);
        st.pending += 1;
        // Counters keep counting from here if the namespace comes back.
        *st.stats_base.entry((subsys.0, nsid)).or_default() = base;
        Ok(())
    }

    fn be_queue_destroy(
        &mut self,
        subsys: SubsysId,
        nsid: u32,
        user: u64,
    ) -> Result<(), EngineError> {
        let core = self.core.clone();
        let mut st = lock(&core.state);
        let s = st
            .subsys
            .get_mut(&subsys.0)
            .ok_or(EngineError::NoSubsystem)?;
        let ns = s.ns.get_mut(&nsid).ok_or(EngineError::NoNamespace(nsid))?;
        if ns.be.beq.is_null() || ns.beq_destroying {
            return Err(EngineError::Unsupported(format!(
                "namespace {nsid}: its backend queue is already destroyed or being destroyed"
            )));
        }
        core.submit_beq_destroy(ns, subsys, nsid, user, false)?;
        st.pending += 1;
        Ok(())
    }

    fn io_create(&mut self) -> Result<DocaIoSeed, EngineError> {
        let d = lib();
        let mut st = lock(&self.core.state);
        let mut io = std::ptr::null_mut();
        // SAFETY: the live running main context, a valid out pointer.
        check("doca_sta_io_create", unsafe {
            (d.doca_sta_io_create)(self.core.sta, &mut io)
        })?;
        let counters = Arc::new(io::IoCounters::default());
        st.threads.push(counters.clone());
        st.ios_created += 1;
        Ok(DocaIoSeed::new(self.core.clone(), io, counters))
    }

    fn progress(&mut self) -> Option<MainEvent> {
        let mut st = lock(&self.core.state);
        if let Some(e) = st.events.pop_front() {
            return Some(e);
        }
        self.core.progress_locked(&mut st);
        st.events.pop_front()
    }

    fn pending_tasks(&self) -> usize {
        lock(&self.core.state).pending
    }

    /// Views are accepted and never consulted: `Caps::access_views` is false (the DPA
    /// has no hook for them).
    fn access_publisher(&self) -> AccessPublisher {
        self.core.access.clone()
    }
}

impl Sta {
    /// Remove a namespace that was never offered to hosts (its add failed half-way):
    /// destroy its backend queue by task, progressing the main PE (bounded).
    fn discard_ns(&mut self, ns: &mut Ns) {
        let core = self.core.clone();
        if ns.be.beq.is_null() {
            return;
        }
        let mut st = lock(&core.state);
        let sid = SubsysId(u32::MAX);
        if core.submit_beq_destroy(ns, sid, 0, 0, true).is_err() {
            return;
        }
        let end = Instant::now() + Duration::from_secs(5);
        while ns.beq_destroying && Instant::now() < end {
            // SAFETY: our PE.
            unsafe { (lib().doca_pe_progress)(core.pe) };
            for r in std::mem::take(&mut *lock(&core.inbox)) {
                match r {
                    MainRaw::Task { rec, ok } if rec.subsys == sid => {
                        ns.beq_destroying = false;
                        if ok {
                            ns.be.beq = std::ptr::null_mut();
                        }
                    }
                    other => core.apply(&mut st, other),
                }
            }
        }
    }
}

impl Drop for Core {
    /// doca-sta-api.md 5.16: namespaces (rm_ns, then their backend queues by task),
    /// backends, subsystems, the main context (stop until IDLE, destroy), devices, PE.
    /// Runs when the engine and every IO context are gone.
    fn drop(&mut self) {
        let d = lib();
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let mut st = std::mem::replace(
            st,
            MainState {
                subsys: BTreeMap::new(),
                deferred_destroy: Vec::new(),
                next_subsys: 0,
                pending: 0,
                events: VecDeque::new(),
                stats_base: BTreeMap::new(),
                threads: Vec::new(),
                ios_created: 0,
            },
        );
        if !self.pe.is_null() {
            // Every namespace out, by task.
            let ids: Vec<(u32, u32)> = st
                .subsys
                .iter()
                .flat_map(|(s, sub)| sub.ns.keys().map(move |n| (*s, *n)))
                .collect();
            for (s, n) in ids {
                let sub = st.subsys.get_mut(&s).expect("listed");
                let subs_raw = sub.raw;
                let ns = sub.ns.get_mut(&n).expect("listed");
                if ns.removing.is_some() {
                    continue;
                }
                // SAFETY: the subsystem and namespace are still registered with DOCA.
                let r = unsafe { submit_rm_ns(self, subs_raw, ns.raw, SubsysId(s), n, 0) };
                match r {
                    Ok(()) => {
                        ns.removing = Some(0);
                        st.pending += 1;
                    }
                    Err(e) => tracing::error!("doca: teardown: {e}"),
                }
            }
            let end = Instant::now() + Duration::from_secs(10);
            while st.pending > 0 && Instant::now() < end {
                if !self.progress_locked(&mut st) {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
            if st.pending > 0 {
                tracing::error!(
                    "doca: teardown: {} main-context tasks did not finish",
                    st.pending
                );
            }
            let _ = self.progress_locked(&mut st);
            for (id, s) in std::mem::take(&mut st.subsys)
                .into_iter()
                .chain(std::mem::take(&mut st.deferred_destroy))
            {
                if !s.ns.is_empty() {
                    tracing::error!("doca: teardown: subsystem {id} keeps namespaces");
                    continue;
                }
                // SAFETY: a live subsystem without namespaces; no IO context is left.
                if let Err(e) = check("doca_sta_subsystem_destroy", unsafe {
                    (d.doca_sta_subsystem_destroy)(s.raw)
                }) {
                    tracing::error!("doca: teardown: {e}");
                }
            }
            // SAFETY: the live main context and its PE; nothing else uses them.
            unsafe {
                let ctx = (d.doca_sta_as_ctx)(self.sta);
                let mut state = 0;
                (d.doca_ctx_get_state)(ctx, &mut state);
                if state != DOCA_CTX_STATE_IDLE {
                    run_ctx_stop(ctx, self.pe, "doca_ctx_stop (main context)");
                }
            }
        }
        // SAFETY: stopped (or never started), no children left.
        unsafe {
            if let Err(e) = check("doca_sta_destroy", (d.doca_sta_destroy)(self.sta)) {
                tracing::error!("doca: teardown: {e}");
            }
            if !self.pe.is_null() {
                if let Err(e) = check("doca_pe_destroy", (d.doca_pe_destroy)(self.pe)) {
                    tracing::error!("doca: teardown: {e}");
                }
            }
        }
        close_devs(self.sta_dev, &self.net);
    }
}

#[cfg(test)]
mod failure_box_tests {
    use super::*;

    fn failure(cid: u16) -> CommandFailure {
        CommandFailure {
            opcode: 2,
            error: nvmf::target::CommandError {
                cid,
                nsid: 1,
                lba: Some(0),
                status: Status::LBA_OUT_OF_RANGE,
            },
            from_backend: false,
        }
    }

    /// A host that makes the engine fail commands faster than its IO context takes them
    /// holds at most FAILURES_HELD of them: the oldest go, each push past the bound says
    /// so (the core counts it); a destroyed QP's go with it; an empty box costs nothing.
    #[test]
    fn a_failure_box_holds_at_most_its_bound() {
        let b = FailureBox::default();
        assert!(b.take().is_empty());
        let n = FAILURES_HELD as u16;
        for cid in 0..n {
            assert!(b.push(7, failure(cid)));
        }
        assert!(!b.push(8, failure(n)), "past the bound: the oldest went");
        b.forget(8);
        let taken = b.take();
        assert_eq!(taken.len(), FAILURES_HELD - 1);
        assert_eq!(taken[0].1.error.cid, 1, "the oldest went first");
        assert!(
            taken.iter().all(|(qp, _)| *qp == 7),
            "the forgotten QP's are gone"
        );
        assert!(b.take().is_empty());
    }

    /// A destroyed QP's handle, accepted again for a new QP (DOCA's handles are
    /// addresses): a failure reported under it before the main PE was idle twice is
    /// dropped, not given to the new QP (the review of 2026-11-27, L7); afterwards the
    /// new QP's failures reach it. The quarantine is bounded.
    #[test]
    fn a_reused_handle_gets_no_failure_until_its_quarantine_ends() {
        let (old, new) = (
            Arc::new(FailureBox::default()),
            Arc::new(FailureBox::default()),
        );
        let mut r = FailureRoutes::default();
        r.route(7, Some(&old));
        assert!(r.note(7, failure(1)));
        r.route(7, None);
        assert!(old.take().is_empty(), "forgotten at the destroy");
        r.route(7, Some(&new));
        assert!(!r.note(7, failure(2)), "a late report of the destroyed QP");
        r.drained();
        assert!(!r.note(7, failure(3)), "one idle pass is not enough");
        r.drained();
        assert!(
            new.take().is_empty(),
            "nothing reached the new QP in quarantine"
        );
        assert!(r.note(7, failure(4)));
        assert_eq!(new.take()[0].1.error.cid, 4);
        // Other handles were never held up.
        r.route(8, Some(&new));
        r.route(9, None);
        assert!(r.note(8, failure(5)));
        for qp in 100..100 + QUARANTINE_HELD + 1 {
            r.route(qp, None);
        }
        assert_eq!(r.quarantine.len(), QUARANTINE_HELD);
        assert!(
            r.quarantine.iter().all(|&(q, _)| q != 9),
            "the oldest left first"
        );
    }

    /// The DOCA double as this process's DOCA (it sits beside the test binary in deps/,
    /// a dev-dependency), and a main context on it.
    fn double_sta() -> Sta {
        static ENV: std::sync::Once = std::sync::Once::new();
        ENV.call_once(|| {
            let deps = std::env::current_exe()
                .expect("test binary")
                .parent()
                .expect("its dir")
                .to_path_buf();
            std::env::set_var("DOCA_DOUBLE_TEST_DEVICES", "tdev0");
            std::env::set_var(doca_sys::LIB_DIR_ENV, deps);
        });
        Sta::new(DocaConfig::new("tdev0", &["tdev0"])).expect("doca engine on the double")
    }

    /// A failure noted (main PE) while its QP is destroyed (IO thread) is either dropped or
    /// taken out by the destroy, never left in the IO context's box for a QP that is gone
    /// (the review of 2026-11-27, L7: the box was looked up under the routes' lock and
    /// pushed to after it, so a destroy could run in between). Each round uses a new
    /// handle.
    #[test]
    fn a_failure_noted_while_its_qp_is_destroyed_never_outlives_it() {
        use std::sync::Barrier;
        const ROUNDS: usize = 10_000;
        let sta = double_sta();
        let core = sta.core.clone();
        let b = Arc::new(FailureBox::default());
        let (go, done) = (Arc::new(Barrier::new(3)), Arc::new(Barrier::new(3)));
        let raw = |i: usize| 0x10_0000 + i;
        let run = |destroy: bool| {
            let (core, go, done) = (core.clone(), go.clone(), done.clone());
            std::thread::spawn(move || {
                for i in 0..ROUNDS {
                    go.wait();
                    if destroy {
                        core.route_failures(raw(i), None);
                    } else {
                        core.note_failure(raw(i), failure(i as u16));
                    }
                    done.wait();
                }
            })
        };
        let (noter, destroyer) = (run(false), run(true));
        let mut outlived = 0;
        for i in 0..ROUNDS {
            core.route_failures(raw(i), Some(&b));
            // The box held for a moment, as an IO context taking its failures does: the
            // note's push may have to wait for it, widening the window between lookup and
            // push that the destroy must not slip into.
            let taking = lock(&b.list);
            go.wait();
            let hold = std::time::Instant::now();
            while hold.elapsed() < std::time::Duration::from_nanos((i % 16) as u64 * 500) {
                std::hint::spin_loop();
            }
            drop(taking);
            done.wait();
            outlived += b.take().len();
        }
        noter.join().unwrap();
        destroyer.join().unwrap();
        assert_eq!(outlived, 0, "failures left in the box of QPs destroyed");
    }
}
