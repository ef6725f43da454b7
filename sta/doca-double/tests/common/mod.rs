//! Test harness: the double loaded through doca-sys's function table (the way the doca
//! engine will load DOCA), an application allocator whose physical addresses differ from
//! virtual ones (so PRP translation is really exercised), callbacks that record what they
//! saw, and a fixture that brings a main context and one IO context to RUNNING on a test
//! device.

// `unsafe` allowed here: these tests drive the double through its C ABI (doca-sys's
// function table): every call is an FFI call with raw pointers.
#![allow(unsafe_code)]
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Mutex, MutexGuard, OnceLock};

use doca_sys::*;

/// "Physical" address = virtual + this, as an IOMMU would make it differ.
pub const PHYS_OFF: u64 = 0x0100_0000_0000;

pub struct Ext {
    pub set_contract_mode: unsafe extern "C" fn(c_int),
    pub take_violation: unsafe extern "C" fn(*mut c_char, u32) -> c_int,
    pub loop_create: unsafe extern "C" fn(*mut *mut rdma_cm_id) -> doca_error_t,
    pub loop_destroy: unsafe extern "C" fn(*mut rdma_cm_id) -> doca_error_t,
    pub loop_add_region:
        unsafe extern "C" fn(*mut rdma_cm_id, u32, *mut c_void, u64) -> doca_error_t,
    pub loop_send: unsafe extern "C" fn(*mut rdma_cm_id, *const c_void, u32) -> doca_error_t,
    pub loop_recv: unsafe extern "C" fn(*mut rdma_cm_id, *mut u8, *mut u32) -> c_int,
    pub loop_accept_data: unsafe extern "C" fn(*mut rdma_cm_id, *mut u8, u32) -> c_int,
    pub loop_disconnect: unsafe extern "C" fn(*mut rdma_cm_id) -> doca_error_t,
    pub null_drive_stall: unsafe extern "C" fn(*mut doca_sta_be_handle, c_int) -> doca_error_t,
    pub set_be_timeout_ms: unsafe extern "C" fn(*mut doca_sta, u32) -> doca_error_t,
    _lib: libloading::Library,
}

pub struct Env {
    pub d: Doca,
    pub x: Ext,
}

// SAFETY: the table holds function pointers and library handles only.
unsafe impl Sync for Env {}
// SAFETY: as above.
unsafe impl Send for Env {}

pub fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| {
        // The double cargo built for this test run sits beside the test binary (deps/);
        // target/debug/libdoca_sta.so is only refreshed by `cargo build` and may be stale.
        let deps = std::env::current_exe()
            .expect("test binary")
            .parent()
            .expect("its dir")
            .to_path_buf();
        // SAFETY: set before anything reads them, under the OnceLock.
        unsafe {
            std::env::set_var("DOCA_DOUBLE_TEST_DEVICES", "tdev0,tdev1");
            std::env::set_var(LIB_DIR_ENV, &deps);
        }
        let d = Doca::load().expect("the workspace's libdoca_sta.so (the double)");
        assert_eq!(
            d.paths().last().and_then(|p| p.parent()),
            Some(deps.as_path()),
            "the freshly built double"
        );
        assert!(d.is_double(), "loaded {:?}, not the double", d.paths());
        let path = d.paths().last().expect("a path").clone();
        // SAFETY: the same library, already loaded.
        let lib = unsafe { libloading::Library::new(&path) }.expect("reopen the double");
        macro_rules! sym {
            ($n:literal) => {
                // SAFETY: the double exports these with the prototypes of doca_double.h.
                *unsafe { lib.get($n) }.unwrap_or_else(|e| panic!("{e}"))
            };
        }
        let x = Ext {
            set_contract_mode: sym!(b"doca_double_set_contract_mode\0"),
            take_violation: sym!(b"doca_double_take_violation\0"),
            loop_create: sym!(b"doca_double_loop_create\0"),
            loop_destroy: sym!(b"doca_double_loop_destroy\0"),
            loop_add_region: sym!(b"doca_double_loop_add_region\0"),
            loop_send: sym!(b"doca_double_loop_send\0"),
            loop_recv: sym!(b"doca_double_loop_recv\0"),
            loop_accept_data: sym!(b"doca_double_loop_accept_data\0"),
            loop_disconnect: sym!(b"doca_double_loop_disconnect\0"),
            null_drive_stall: sym!(b"doca_double_null_drive_stall\0"),
            set_be_timeout_ms: sym!(b"doca_double_set_be_timeout_ms\0"),
            _lib: lib,
        };
        Env { d, x }
    })
}

/// Tests share the double's global state: one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    let g = L.lock().unwrap_or_else(|e| e.into_inner());
    let e = env();
    // SAFETY: plain setter.
    unsafe { (e.x.set_contract_mode)(1) };
    while take_violation().is_some() {}
    log().clear();
    g
}

/// The oldest contract violation reported (report mode), if any.
pub fn take_violation() -> Option<String> {
    let mut b = vec![0 as c_char; 1024];
    // SAFETY: 1024 writable bytes.
    if unsafe { (env().x.take_violation)(b.as_mut_ptr(), 1024) } == 0 {
        return None;
    }
    // SAFETY: NUL-terminated by the double.
    Some(
        unsafe { CStr::from_ptr(b.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Assert the last call broke `rule` (report mode).
#[track_caller]
pub fn expect_violation(rule: &str) -> String {
    let v = take_violation().unwrap_or_else(|| panic!("no violation reported; expected [{rule}]"));
    assert!(
        v.contains(&format!("[{rule}]")),
        "expected [{rule}], got: {v}"
    );
    v
}

// --- allocator --------------------------------------------------------------------------

fn allocs() -> MutexGuard<'static, BTreeMap<usize, std::alloc::Layout>> {
    static A: Mutex<BTreeMap<usize, std::alloc::Layout>> = Mutex::new(BTreeMap::new());
    A.lock().unwrap_or_else(|e| e.into_inner())
}

pub unsafe extern "C" fn zmalloc(size: usize, align: usize, phys: *mut u64) -> *mut c_void {
    let l = std::alloc::Layout::from_size_align(size.max(1), align.max(64)).expect("layout");
    // SAFETY: non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(l) };
    if p.is_null() {
        return p as *mut c_void;
    }
    allocs().insert(p as usize, l);
    if !phys.is_null() {
        // SAFETY: out pointer from the double.
        unsafe { *phys = p as u64 + PHYS_OFF };
    }
    p as *mut c_void
}

pub unsafe extern "C" fn zfree(p: *mut c_void) {
    if let Some(l) = allocs().remove(&(p as usize)) {
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(p as *mut u8, l) };
    }
}

pub unsafe extern "C" fn vtophys(p: *const c_void, size: u32) -> u64 {
    let a = allocs();
    match a.range(..=p as usize).next_back() {
        Some((&base, l)) if p as usize + size as usize <= base + l.size() => p as u64 + PHYS_OFF,
        _ => DOCA_STA_VTOPHYS_ERROR,
    }
}

pub fn live_allocations() -> usize {
    allocs().len()
}

/// Test-owned memory from the same allocator (rings, doorbells).
pub fn app_mem(len: usize) -> *mut u8 {
    // SAFETY: our own allocator.
    unsafe { zmalloc(len, 4096, std::ptr::null_mut()) as *mut u8 }
}

// --- callbacks --------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
pub enum Ev {
    State {
        ctx: usize,
        prev: u32,
        next: u32,
    },
    TaskOk {
        task: usize,
        user: u64,
    },
    TaskErr {
        task: usize,
        user: u64,
    },
    NonOffload {
        qp: usize,
        sqe: Vec<u8>,
        payload: usize,
        len: u32,
        valid: bool,
        token: u64,
    },
    Transport {
        qp: usize,
        op: u32,
        syndrome: u32,
    },
    BeTimeout {
        be: usize,
        beq: usize,
    },
    Cqe {
        typ: u32,
        cqe: [u8; 16],
        opcode: u8,
        cid: u16,
        nsid: u16,
    },
}

pub fn log() -> MutexGuard<'static, Vec<Ev>> {
    static L: Mutex<Vec<Ev>> = Mutex::new(Vec::new());
    L.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn take_log() -> Vec<Ev> {
    std::mem::take(&mut *log())
}

pub unsafe extern "C" fn state_cb(
    _u: doca_data,
    ctx: *mut doca_ctx,
    prev: doca_ctx_states,
    next: doca_ctx_states,
) {
    log().push(Ev::State {
        ctx: ctx as usize,
        prev,
        next,
    });
}

pub unsafe extern "C" fn task_ok(t: *mut doca_sta_producer_task_send, u: doca_data) {
    log().push(Ev::TaskOk {
        task: t as usize,
        user: data_as_u64(u),
    });
}

pub unsafe extern "C" fn task_err(t: *mut doca_sta_producer_task_send, u: doca_data) {
    log().push(Ev::TaskErr {
        task: t as usize,
        user: data_as_u64(u),
    });
}

pub unsafe extern "C" fn non_offload_cb(
    qp: *mut doca_sta_qp_handle,
    _u: doca_data,
    cmd: *const u8,
    payload: *mut u8,
    len: u32,
    valid: bool,
    token: doca_data,
) {
    // SAFETY: the 64-byte SQE, valid during the callback.
    let sqe = unsafe { std::slice::from_raw_parts(cmd, 64) }.to_vec();
    log().push(Ev::NonOffload {
        qp: qp as usize,
        sqe,
        payload: payload as usize,
        len,
        valid,
        token: data_as_u64(token),
    });
}

pub unsafe extern "C" fn transport_cb(e: *const doca_sta_event_transport_err, _u: doca_data) {
    let d = &env().d;
    let (mut qp, mut op, mut syn) = (std::ptr::null(), 0, 0);
    // SAFETY: getters on the event during its callback.
    unsafe {
        assert_eq!(
            (d.doca_sta_event_transport_err_get_qp_handle)(e, &mut qp),
            DOCA_SUCCESS
        );
        assert_eq!(
            (d.doca_sta_event_transport_err_get_operation)(e, &mut op),
            DOCA_SUCCESS
        );
        assert_eq!(
            (d.doca_sta_event_transport_err_get_syndrome)(e, &mut syn),
            DOCA_SUCCESS
        );
    }
    log().push(Ev::Transport {
        qp: qp as usize,
        op,
        syndrome: syn,
    });
}

pub unsafe extern "C" fn be_timeout_cb(e: *const doca_sta_event_be_timeout, _u: doca_data) {
    let d = &env().d;
    let (mut be, mut beq) = (std::ptr::null(), std::ptr::null());
    // SAFETY: getters on the event during its callback.
    unsafe {
        assert_eq!(
            (d.doca_sta_event_be_timeout_get_be_handle)(e, &mut be),
            DOCA_SUCCESS
        );
        assert_eq!(
            (d.doca_sta_event_be_timeout_get_be_queue_handle)(e, &mut beq),
            DOCA_SUCCESS
        );
    }
    log().push(Ev::BeTimeout {
        be: be as usize,
        beq: beq as usize,
    });
}

pub unsafe extern "C" fn cqe_cb(e: *const doca_sta_event_cqe_notify, _u: doca_data) {
    let d = &env().d;
    let mut typ = 0;
    let mut cqe = [0u8; 16];
    let (mut op, mut cid, mut nsid, mut lba) = (0u8, 0u16, 0u16, 0u64);
    // SAFETY: getters on the event during its callback.
    unsafe {
        assert_eq!(
            (d.doca_sta_event_cqe_notify_get_cqe_notify_type)(e, &mut typ),
            DOCA_SUCCESS
        );
        assert_eq!(
            (d.doca_sta_event_cqe_notify_get_cqe)(e, cqe.as_mut_ptr()),
            DOCA_SUCCESS
        );
        assert_eq!(
            (d.doca_sta_event_cqe_notify_get_capsule_params)(
                e, &mut op, &mut cid, &mut nsid, &mut lba
            ),
            DOCA_SUCCESS
        );
    }
    log().push(Ev::Cqe {
        typ,
        cqe,
        opcode: op,
        cid,
        nsid,
    });
}

// --- fixture ----------------------------------------------------------------------------

pub fn ok(e: doca_error_t, what: &str) {
    assert_eq!(e, DOCA_SUCCESS, "{what}: {}", env().d.error_name(e));
}

/// Open the test device `name` (from DOCA_DOUBLE_TEST_DEVICES).
pub fn open_dev(name: &str) -> *mut doca_dev {
    let d = &env().d;
    let mut list = std::ptr::null_mut();
    let mut n = 0u32;
    // SAFETY: table calls with valid out pointers; the list is destroyed below.
    unsafe {
        ok(
            (d.doca_devinfo_create_list)(&mut list, &mut n),
            "create_list",
        );
        let mut dev = std::ptr::null_mut();
        for i in 0..n as usize {
            let info = *list.add(i);
            let mut buf = [0 as c_char; DOCA_DEVINFO_IBDEV_NAME_SIZE as usize];
            ok(
                (d.doca_devinfo_get_ibdev_name)(info, buf.as_mut_ptr(), buf.len() as u32),
                "ibdev name",
            );
            if CStr::from_ptr(buf.as_ptr()).to_str() == Ok(name) {
                ok((d.doca_sta_cap_is_supported)(info), "cap");
                ok((d.doca_dev_open)(info, &mut dev), "dev_open");
            }
        }
        ok((d.doca_devinfo_destroy_list)(list), "destroy_list");
        assert!(!dev.is_null(), "test device {name} listed");
        dev
    }
}

pub struct Fx {
    pub dev: *mut doca_dev,
    pub sta: *mut doca_sta,
    pub pe: *mut doca_pe,
    pub io: *mut doca_sta_io,
    pub io_pe: *mut doca_pe,
    /// A second IO context (`Fx::two_io`), else NULL.
    pub io2: *mut doca_sta_io,
    pub io2_pe: *mut doca_pe,
}

impl Fx {
    /// Main context RUNNING with the test device, allocator and confs; no IO context.
    pub fn main_only() -> Fx {
        let d = &env().d;
        let dev = open_dev("tdev0");
        let mut sta = std::ptr::null_mut();
        let mut pe = std::ptr::null_mut();
        // SAFETY: table calls in the documented order (doca-sta-api.md 5.3).
        unsafe {
            ok((d.doca_sta_create)(dev, &mut sta), "sta_create");
            ok((d.doca_pe_create)(&mut pe), "pe_create");
            let ctx = (d.doca_sta_as_ctx)(sta);
            ok((d.doca_pe_connect_ctx)(pe, ctx), "connect");
            ok((d.doca_sta_add_dev)(sta, dev), "add_dev");
            ok(
                (d.doca_ctx_set_state_changed_cb)(ctx, Some(state_cb)),
                "state cb",
            );
            ok(
                (d.doca_sta_subsystem_task_rm_ns_set_conf)(sta, Some(task_ok), Some(task_err)),
                "rm_ns conf",
            );
            ok(
                (d.doca_sta_be_task_destroy_queue_set_conf)(sta, Some(task_ok), Some(task_err)),
                "beq conf",
            );
            ok(
                (d.doca_sta_mem_allocator_register)(sta, Some(zmalloc), Some(zfree), Some(vtophys)),
                "allocator",
            );
            ok((d.doca_sta_set_max_sta_io)(sta, 2), "max io");
            ok(
                (d.doca_sta_event_be_timeout_register_cb)(sta, Some(be_timeout_cb), data_u64(0)),
                "be timeout cb",
            );
            ok(
                (d.doca_sta_event_cqe_notify_register_cb)(sta, Some(cqe_cb), data_u64(0)),
                "cqe cb",
            );
            assert_eq!((d.doca_ctx_start)(ctx), DOCA_ERROR_IN_PROGRESS);
            let mut st = 0;
            for _ in 0..10 {
                (d.doca_pe_progress)(pe);
                ok((d.doca_ctx_get_state)(ctx, &mut st), "get_state");
                if st == DOCA_CTX_STATE_RUNNING {
                    break;
                }
            }
            assert_eq!(st, DOCA_CTX_STATE_RUNNING);
        }
        Fx {
            dev,
            sta,
            pe,
            io: std::ptr::null_mut(),
            io_pe: std::ptr::null_mut(),
            io2: std::ptr::null_mut(),
            io2_pe: std::ptr::null_mut(),
        }
    }

    /// Main context and one IO context RUNNING.
    pub fn new() -> Fx {
        let mut f = Fx::main_only();
        (f.io, f.io_pe) = start_io(f.sta);
        f
    }

    /// Main context and two IO contexts RUNNING, each with its own PE.
    pub fn two_io() -> Fx {
        let mut f = Fx::new();
        (f.io2, f.io2_pe) = start_io(f.sta);
        f
    }

    pub fn pump(&self, rounds: usize) {
        let d = &env().d;
        for _ in 0..rounds {
            // SAFETY: live PEs, not inside a callback.
            unsafe {
                for pe in [self.io_pe, self.io2_pe] {
                    if !pe.is_null() {
                        (d.doca_pe_progress)(pe);
                    }
                }
                (d.doca_pe_progress)(self.pe);
            }
        }
    }

    /// Stop and destroy everything the fixture made (children must be gone already).
    pub fn teardown(self) {
        let d = &env().d;
        // SAFETY: documented teardown order (5.15, 5.16).
        unsafe {
            for (io, pe) in [(self.io, self.io_pe), (self.io2, self.io2_pe)] {
                if !io.is_null() {
                    let ctx = (d.doca_sta_io_as_ctx)(io);
                    ok((d.doca_ctx_stop)(ctx), "io stop");
                    ok((d.doca_sta_io_destroy)(io), "io destroy");
                    ok((d.doca_pe_destroy)(pe), "io pe destroy");
                }
            }
            let ctx = (d.doca_sta_as_ctx)(self.sta);
            let r = (d.doca_ctx_stop)(ctx);
            assert!(
                r == DOCA_SUCCESS || r == DOCA_ERROR_IN_PROGRESS,
                "stop: {}",
                d.error_name(r)
            );
            for _ in 0..3 {
                (d.doca_pe_progress)(self.pe);
            }
            ok((d.doca_sta_destroy)(self.sta), "sta destroy");
            ok((d.doca_pe_destroy)(self.pe), "pe destroy");
            ok((d.doca_dev_close)(self.dev), "dev close");
        }
    }
}

/// Create, configure and start an IO context with its own PE (doca-sta-api.md 5.8).
fn start_io(sta: *mut doca_sta) -> (*mut doca_sta_io, *mut doca_pe) {
    let d = &env().d;
    let mut io = std::ptr::null_mut();
    let mut io_pe = std::ptr::null_mut();
    // SAFETY: documented order (5.8).
    unsafe {
        ok((d.doca_sta_io_create)(sta, &mut io), "io_create");
        let ctx = (d.doca_sta_io_as_ctx)(io);
        ok((d.doca_pe_create)(&mut io_pe), "io pe");
        ok((d.doca_pe_connect_ctx)(io_pe, ctx), "io connect");
        ok(
            (d.doca_sta_io_task_disconnect_set_conf)(io, Some(task_ok), Some(task_err)),
            "disc conf",
        );
        ok(
            (d.doca_sta_io_event_transport_err_register_cb)(io, Some(transport_cb), data_u64(0)),
            "terr cb",
        );
        ok(
            (d.doca_sta_io_non_offload_register_cb)(io, Some(non_offload_cb), data_u64(7)),
            "non-offload cb",
        );
        ok(
            (d.doca_sta_io_task_non_offload_set_rdma_write_send_conf)(
                io,
                Some(task_ok),
                Some(task_err),
            ),
            "ws conf",
        );
        ok(
            (d.doca_sta_io_task_non_offload_set_rdma_read_conf)(io, Some(task_ok), Some(task_err)),
            "rd conf",
        );
        ok(
            (d.doca_ctx_set_state_changed_cb)(ctx, Some(state_cb)),
            "io state cb",
        );
        ok((d.doca_ctx_start)(ctx), "io start");
    }
    (io, io_pe)
}

/// A backend with one queue whose rings and 16-byte doorbell area are application
/// memory (SPDK's null backend, doca-sta-api.md 5.6): served by the double's RAM drive.
pub struct NullBackend {
    pub be: *mut doca_sta_be_handle,
    pub beq: *mut doca_sta_be_q_handle,
    pub mmaps: Vec<*mut doca_mmap>,
    pub sq: *mut u8,
    pub cq: *mut u8,
    pub db: *mut u8,
    pub entries: usize,
}

impl NullBackend {
    pub fn new(f: &Fx, entries: usize) -> NullBackend {
        let d = &env().d;
        let sq = app_mem(entries * 64);
        let cq = app_mem(entries * 16);
        let db = app_mem(16);
        let mut be = std::ptr::null_mut();
        let mut beq = std::ptr::null_mut();
        let mut mmaps = Vec::new();
        // SAFETY: documented order (5.6): create, add_dev (the STA device), memrange,
        // permissions, start; then be_add_queue.
        unsafe {
            ok((d.doca_sta_be_create)(f.sta, &mut be), "be_create");
            for (addr, len) in [(sq, entries * 64), (cq, entries * 16), (db, 16)] {
                let mut m = std::ptr::null_mut();
                ok((d.doca_mmap_create)(&mut m), "mmap_create");
                ok((d.doca_mmap_add_dev)(m, f.dev), "mmap_add_dev");
                ok(
                    (d.doca_mmap_set_memrange)(m, addr as *mut c_void, len),
                    "memrange",
                );
                ok(
                    (d.doca_mmap_set_permissions)(m, DOCA_ACCESS_FLAG_LOCAL_READ_WRITE),
                    "perms",
                );
                ok((d.doca_mmap_start)(m), "mmap_start");
                mmaps.push(m);
            }
            ok(
                (d.doca_sta_be_add_queue)(
                    be, mmaps[0], mmaps[2], 0, mmaps[1], mmaps[2], 8, &mut beq,
                ),
                "add_queue",
            );
        }
        NullBackend {
            be,
            beq,
            mmaps,
            sq,
            cq,
            db,
            entries,
        }
    }

    pub fn sq_tail_doorbell(&self) -> u32 {
        // SAFETY: our 16-byte doorbell area.
        unsafe { (self.db as *const u32).read_volatile() }
    }

    pub fn cq_head_doorbell(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (self.db.add(8) as *const u32).read_volatile() }
    }

    pub fn sqe(&self, i: usize) -> [u8; 64] {
        let mut b = [0u8; 64];
        // SAFETY: inside our SQ ring.
        unsafe { std::ptr::copy_nonoverlapping(self.sq.add(i * 64), b.as_mut_ptr(), 64) };
        b
    }

    /// Destroy the queue by task (progressing the main PE), then the mmaps and the backend.
    pub fn destroy(self, f: &Fx) {
        let d = &env().d;
        // SAFETY: documented order (5.13).
        unsafe {
            let mut t = std::ptr::null_mut();
            ok(
                (d.doca_sta_be_destroy_queue_task_alloc_init)(self.beq, data_u64(99), &mut t),
                "beq destroy task",
            );
            let task = (d.doca_sta_producer_send_task_as_task)(t);
            ok((d.doca_task_submit)(task), "submit");
            f.pump(2);
            assert!(take_log().contains(&Ev::TaskOk {
                task: t as usize,
                user: 99
            }));
            (d.doca_task_free)(task);
            for m in self.mmaps {
                ok((d.doca_mmap_destroy)(m), "mmap destroy");
            }
            ok((d.doca_sta_be_destroy)(self.be), "be destroy");
            for p in [self.sq, self.cq, self.db] {
                zfree(p as *mut c_void);
            }
        }
    }
}

// --- capsules ---------------------------------------------------------------------------

pub const KEYED: u8 = 0x40;
pub const KEYED_INVALIDATE: u8 = 0x4F;
pub const INCAPSULE: u8 = 0x01;

/// A 64-byte SQE: opcode, CID, NSID, SGL1 (addr, len, key, id), CDW10-12.
#[allow(clippy::too_many_arguments)]
pub fn sqe(
    opcode: u8,
    cid: u16,
    nsid: u32,
    addr: u64,
    len: u32,
    key: u32,
    sgl_id: u8,
    cdw10_12: [u32; 3],
) -> [u8; 64] {
    let mut s = [0u8; 64];
    s[0] = opcode;
    s[1] = 0x40; // PSDT: SGL
    s[2..4].copy_from_slice(&cid.to_le_bytes());
    s[4..8].copy_from_slice(&nsid.to_le_bytes());
    s[24..32].copy_from_slice(&addr.to_le_bytes());
    if sgl_id >> 4 == 4 {
        s[32..35].copy_from_slice(&len.to_le_bytes()[..3]);
        s[35..39].copy_from_slice(&key.to_le_bytes());
    } else {
        s[32..36].copy_from_slice(&len.to_le_bytes());
    }
    s[39] = sgl_id;
    for (i, v) in cdw10_12.iter().enumerate() {
        s[40 + i * 4..44 + i * 4].copy_from_slice(&v.to_le_bytes());
    }
    s
}

/// Fabrics Connect for queue `qid` with SQSIZE `sqsize`, 1024 bytes of in-capsule data.
pub fn connect_capsule(cid: u16, qid: u16, sqsize: u16) -> Vec<u8> {
    let mut s = sqe(0x7f, cid, 0, 0, 1024, 0, INCAPSULE, [0; 3]);
    s[4] = 0x01; // FCTYPE Connect
    s[4..8].copy_from_slice(&[0x01, 0, 0, 0]);
    s[42..44].copy_from_slice(&qid.to_le_bytes());
    s[44..46].copy_from_slice(&sqsize.to_le_bytes());
    let mut c = s.to_vec();
    c.extend(std::iter::repeat_n(0xC0u8, 1024));
    c
}

pub fn cqe_cid(c: &[u8; 16]) -> u16 {
    u16::from_le_bytes([c[12], c[13]])
}

/// (SCT, SC) of a CQE.
pub fn cqe_status(c: &[u8; 16]) -> (u8, u8) {
    let s = u16::from_le_bytes([c[14], c[15]]);
    (((s >> 9) & 7) as u8, (s >> 1) as u8)
}

/// A completion for the application to send: CID and (SCT, SC).
pub fn app_cqe(cid: u16, sct: u8, sc: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[12..14].copy_from_slice(&cid.to_le_bytes());
    let s: u16 = (sc as u16) << 1 | ((sct as u16) & 7) << 9;
    c[14..16].copy_from_slice(&s.to_le_bytes());
    c
}
