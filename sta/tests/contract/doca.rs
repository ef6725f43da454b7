//! The doca engine against the DOCA double (`sta/doca-double`, `libdoca_sta.so`) over the
//! double's loopback host: the fabric the suite runs against here, without RDMA hardware.
//!
//! What this proves: the doca engine's calls, in their order, through doca-sys's
//! run-time-loaded function table (the way it loads NVIDIA's library), kept every rule of
//! the double's contract (a broken rule aborts this test binary with the rule's name), and
//! the engine turned DOCA's callbacks into the contract's events correctly; the offloaded
//! READ/WRITE went through backend queues the engine registered (served by the double's
//! RAM drive). What it does not prove: verbs (the loopback host stands in for RDMA; the
//! interop VM runs the double's verbs path), or anything about NVIDIA's library or a
//! BlueField.
//!
//! The host: the double's `doca_double_loop_*` calls (capsules in, completions out, host
//! memory under rkeys that the double RDMA-reads and -writes, checking key and bounds),
//! with the RDMA CM events a real CM would deliver (ESTABLISHED after the accept,
//! DISCONNECTED when the host closes).

// `unsafe` allowed here: the double's test calls are C functions found with dlsym, and
// host memory is handed to it by address.
#![allow(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use backend::Backend;
use nvmf::spec::{sgl, Cqe, SglDescriptor, Sqe};
use sta::doca::{DocaConfig, DocaIo, Sta};
use sta::verbs::RdmaCmEvent;
use sta::{QpHandle, SubsysId};
use zerocopy::{FromBytes, IntoBytes};

use crate::suite::{Dir, Fabric, Host, BLOCK, BLOCKS};

/// Largest data the host puts in the capsule (the double receives 64 + 8192 bytes).
const IN_CAPSULE: usize = 8192;

type DocaError = u32;

struct Ext {
    loop_create: unsafe extern "C" fn(*mut *mut c_void) -> DocaError,
    loop_destroy: unsafe extern "C" fn(*mut c_void) -> DocaError,
    loop_add_region: unsafe extern "C" fn(*mut c_void, u32, *mut c_void, u64) -> DocaError,
    loop_send: unsafe extern "C" fn(*mut c_void, *const c_void, u32) -> DocaError,
    loop_recv: unsafe extern "C" fn(*mut c_void, *mut u8, *mut u32) -> c_int,
    loop_disconnect: unsafe extern "C" fn(*mut c_void) -> DocaError,
    loop_connected: unsafe extern "C" fn(*mut c_void) -> c_int,
    reuse_qp_handles: unsafe extern "C" fn(c_int),
}

fn ext() -> &'static Ext {
    static E: OnceLock<Ext> = OnceLock::new();
    E.get_or_init(|| {
        // The double cargo built for this test run sits beside the test binary (deps/).
        let deps = std::env::current_exe()
            .expect("test binary")
            .parent()
            .expect("its dir")
            .to_path_buf();
        // SAFETY: set before the library is loaded (below), under the OnceLock.
        unsafe {
            std::env::set_var("DOCA_DOUBLE_TEST_DEVICES", "tdev0");
            std::env::set_var(doca_sys::LIB_DIR_ENV, &deps);
        }
        let d = sta::doca::library().expect("the workspace's libdoca_sta.so (the DOCA double)");
        assert!(d.is_double(), "loaded {:?}, not the double", d.paths());
        let this = libloading::os::unix::Library::this();
        macro_rules! sym {
            ($n:literal) => {
                // SAFETY: the double exports these with the prototypes of doca_double.h.
                *unsafe { this.get($n) }.unwrap_or_else(|e| panic!("{e}"))
            };
        }
        Ext {
            loop_create: sym!(b"doca_double_loop_create\0"),
            loop_destroy: sym!(b"doca_double_loop_destroy\0"),
            loop_add_region: sym!(b"doca_double_loop_add_region\0"),
            loop_send: sym!(b"doca_double_loop_send\0"),
            loop_recv: sym!(b"doca_double_loop_recv\0"),
            loop_disconnect: sym!(b"doca_double_loop_disconnect\0"),
            loop_connected: sym!(b"doca_double_loop_connected\0"),
            reuse_qp_handles: sym!(b"doca_double_reuse_qp_handles\0"),
        }
    })
}

/// Hold this for a whole scenario (the World it builds is dropped inside it).
pub fn serial() -> MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    L.lock().unwrap_or_else(|e| e.into_inner())
}

/// While held, a new QP gets the handle of the QP destroyed last, as with NVIDIA's
/// library, whose handles are addresses (`doca_double_reuse_qp_handles`); the double never
/// reuses one otherwise.
pub struct ReuseQpHandles(());

impl ReuseQpHandles {
    pub fn on() -> ReuseQpHandles {
        // SAFETY: the double's call, no arguments to get wrong.
        unsafe { (ext().reuse_qp_handles)(1) };
        ReuseQpHandles(())
    }
}

impl Drop for ReuseQpHandles {
    fn drop(&mut self) {
        // SAFETY: as in `on`.
        unsafe { (ext().reuse_qp_handles)(0) };
    }
}

pub struct DocaLoop;

impl DocaLoop {
    pub fn new() -> DocaLoop {
        ext();
        DocaLoop
    }
}

impl Fabric for DocaLoop {
    type Engine = Sta;
    type Host = LoopHost;

    fn name(&self) -> &'static str {
        "doca engine on the DOCA double, loopback host"
    }

    fn engine(&mut self, backend_timeout: Duration) -> Sta {
        let mut cfg = DocaConfig::new("tdev0", &["tdev0"]);
        cfg.backend_timeout = backend_timeout;
        Sta::new(cfg).unwrap_or_else(|e| panic!("doca engine: {e}"))
    }

    /// Only its geometry matters: the double's RAM drive holds the data (the null
    /// backend, see `sta::doca`).
    fn backend(&mut self) -> Arc<dyn Backend> {
        backend::RamBackend::new(BLOCKS * BLOCK as u64, BLOCK).expect("RAM backend")
    }

    fn stall(&mut self, engine: &mut Sta, on: bool) {
        // The suite's namespace: subsystem 1 (the first the engine made), NSID 1.
        engine
            .double_stall(SubsysId(1), 1, on)
            .unwrap_or_else(|e| panic!("stall: {e}"));
    }

    fn counts_latency(&self) -> bool {
        false
    }

    fn bounds_by_size(&self) -> bool {
        false
    }

    fn unique_nqns(&self) -> bool {
        true
    }

    fn connect(&mut self, io: &mut DocaIo, user: u64) -> (QpHandle, LoopHost) {
        let x = ext();
        let mut id = std::ptr::null_mut();
        // SAFETY: a valid out pointer.
        assert_eq!(unsafe { (x.loop_create)(&mut id) }, 0, "loop_create");
        // SAFETY: an id the double just made; it outlives the QP (the host is dropped
        // after the IO context in the suite's World).
        let qp = unsafe { io.qp_accept_loopback(id, 128, user) }
            .unwrap_or_else(|e| panic!("accept: {e}"));
        let host = LoopHost {
            id,
            next_cid: 1,
            next_key: 0x1000,
            regions: Vec::new(),
            reading: HashMap::new(),
            done: HashMap::new(),
            cm: VecDeque::from([RdmaCmEvent::Established]),
            ready: false,
            closed: false,
        };
        (qp, host)
    }
}

/// The host end of one loopback connection.
pub struct LoopHost {
    id: *mut c_void,
    next_cid: u16,
    next_key: u32,
    /// Every buffer ever registered (the double keeps regions until the id goes).
    regions: Vec<Box<[u8]>>,
    /// CID -> index of the buffer a controller-to-host transfer lands in.
    reading: HashMap<u16, usize>,
    done: HashMap<u16, (Cqe, Vec<u8>)>,
    cm: VecDeque<RdmaCmEvent>,
    ready: bool,
    closed: bool,
}

impl LoopHost {
    fn region(&mut self, data: Vec<u8>) -> (usize, u64, u32) {
        let mut b = data.into_boxed_slice();
        let key = self.next_key;
        self.next_key += 1;
        let addr = b.as_mut_ptr();
        // SAFETY: the buffer lives in `regions` (a Box does not move its heap data) until
        // the host is dropped, after the double stopped using the id.
        let r = unsafe { (ext().loop_add_region)(self.id, key, addr.cast(), b.len() as u64) };
        assert_eq!(r, 0, "loop_add_region");
        self.regions.push(b);
        (self.regions.len() - 1, addr as u64, key)
    }
}

impl Host for LoopHost {
    fn ready(&self) -> bool {
        self.ready
    }

    fn submit(&mut self, mut sqe: Sqe, dir: Dir) -> u16 {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        sqe.set_opcode_cid(sqe.opcode(), cid);
        sqe.cdw0 |= 1 << 14; // PSDT: SGL
        let mut capsule = Vec::new();
        let mut extra = Vec::new();
        match dir {
            Dir::None => sqe.dptr = SglDescriptor::keyed(sgl::SUBTYPE_ADDRESS, 0, 0, 0),
            Dir::ToController(data) if data.len() <= IN_CAPSULE => {
                sqe.dptr = SglDescriptor::unkeyed(
                    sgl::TYPE_DATA_BLOCK,
                    sgl::SUBTYPE_OFFSET,
                    0,
                    data.len() as u32,
                );
                extra = data;
            }
            Dir::ToController(data) => {
                let len = data.len() as u32;
                let (_, addr, key) = self.region(data);
                sqe.dptr = SglDescriptor::keyed(sgl::SUBTYPE_ADDRESS, addr, len, key);
            }
            Dir::FromController(n) => {
                let (i, addr, key) = self.region(vec![0u8; n as usize]);
                sqe.dptr = SglDescriptor::keyed(sgl::SUBTYPE_ADDRESS, addr, n, key);
                self.reading.insert(cid, i);
            }
        }
        capsule.extend_from_slice(sqe.as_bytes());
        capsule.extend_from_slice(&extra);
        // SAFETY: `capsule.len()` readable bytes.
        let r =
            unsafe { (ext().loop_send)(self.id, capsule.as_ptr().cast(), capsule.len() as u32) };
        assert_eq!(r, 0, "loop_send");
        cid
    }

    fn pump(&mut self) -> bool {
        let mut did = false;
        loop {
            let mut c = [0u8; 16];
            let mut inval = 0u32;
            // SAFETY: 16 writable bytes and an out pointer.
            if unsafe { (ext().loop_recv)(self.id, c.as_mut_ptr(), &mut inval) } != 1 {
                break;
            }
            did = true;
            let cqe = Cqe::read_from_bytes(&c[..]).expect("16 bytes");
            let data = self
                .reading
                .remove(&cqe.cid)
                .map(|i| self.regions[i].to_vec())
                .unwrap_or_default();
            self.done.insert(cqe.cid, (cqe, data));
        }
        did
    }

    fn take(&mut self, cid: u16) -> Option<(Cqe, Vec<u8>)> {
        self.done.remove(&cid)
    }

    fn set_depth(&mut self, _depth: usize) {}

    fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            // SAFETY: our live id.
            unsafe { (ext().loop_disconnect)(self.id) };
            self.cm.push_back(RdmaCmEvent::Disconnected);
        }
    }

    fn gone(&self) -> bool {
        // SAFETY: our live id.
        let up = unsafe { (ext().loop_connected)(self.id) };
        up == 0
    }

    fn error(&self) -> Option<String> {
        None
    }

    fn cm_event(&mut self) -> Option<RdmaCmEvent> {
        let ev = self.cm.pop_front();
        if ev == Some(RdmaCmEvent::Established) {
            self.ready = true;
        }
        ev
    }
}

impl Drop for LoopHost {
    fn drop(&mut self) {
        // SAFETY: our id; its QP was destroyed with the IO context (dropped before the
        // hosts in the suite's World).
        unsafe { (ext().loop_destroy)(self.id) };
    }
}
