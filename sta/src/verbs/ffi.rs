//! Hand-written FFI for the parts of rdma-core (libibverbs + librdmacm, ABI of rdma-core
//! 44, `libibverbs/verbs.h` and `librdmacm/rdma_cma.h`) the soft engine uses. The
//! libraries are opened at run time with `libloading`, so building needs neither the -dev
//! packages nor libclang. Only the leading fields of the structs we read are declared;
//! the libraries allocate them, we only look at what is here.
//!
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are inline
//! functions in verbs.h that call through `context->ops`; [`IbvContextOps`] mirrors that
//! table up to `post_recv` (slots 11, 12, 25 and 26).

// `unsafe` allowed here: the layouts and function tables of rdma-core's C API, called
// through pointers loaded at run time.
#![allow(unsafe_code)]
#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_library_is_named_in_the_error() {
        let e = super::Lib::load_named("libibverbs-absent.so.1", "librdmacm.so.1")
            .err()
            .expect("no such library")
            .to_string();
        assert!(e.contains("cannot load libibverbs-absent.so.1"), "{e}");
    }
}

#[repr(C)]
pub struct IbvContextOps {
    pub compat: [*mut c_void; 11],
    pub poll_cq: unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int,
    pub req_notify_cq: unsafe extern "C" fn(*mut IbvCq, c_int) -> c_int,
    pub compat2: [*mut c_void; 12],
    pub post_send: unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int,
    pub post_recv: unsafe extern "C" fn(*mut IbvQp, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int,
}
const _: () = assert!(std::mem::offset_of!(IbvContextOps, poll_cq) == 11 * 8);
const _: () = assert!(std::mem::offset_of!(IbvContextOps, post_send) == 25 * 8);
const _: () = assert!(std::mem::offset_of!(IbvContextOps, post_recv) == 26 * 8);

#[repr(C)]
pub struct IbvContext {
    pub device: *mut c_void,
    pub ops: IbvContextOps,
}

#[repr(C)]
pub struct IbvPd {
    pub context: *mut IbvContext,
    pub handle: u32,
}

#[repr(C)]
pub struct IbvCompChannel {
    pub context: *mut IbvContext,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
}

#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}
const _: () = assert!(std::mem::offset_of!(IbvQp, qp_num) == 52);

#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// `imm_data` or `invalidate_rkey`.
    pub imm_or_inv: u32,
    /// `wr.rdma.remote_addr`, `wr.rdma.rkey` (the union is 32 bytes).
    pub remote_addr: u64,
    pub rkey: u32,
    pub wr_pad: [u32; 5],
    /// `qp_type` union and the `bind_mw`/`tso` union.
    pub tail: [u64; 7],
}
const _: () = assert!(std::mem::offset_of!(IbvSendWr, remote_addr) == 40);
const _: () = assert!(std::mem::size_of::<IbvSendWr>() == 128);

impl Default for IbvSendWr {
    fn default() -> Self {
        IbvSendWr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_or_inv: 0,
            remote_addr: 0,
            rkey: 0,
            wr_pad: [0; 5],
            tail: [0; 7],
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_or_inv: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}
const _: () = assert!(std::mem::size_of::<IbvWc>() == 48);

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

pub const IBV_QPT_RC: c_uint = 2;
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub const IBV_ACCESS_REMOTE_READ: c_int = 4;
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_WR_RDMA_READ: c_uint = 4;
pub const IBV_WR_SEND_WITH_INV: c_uint = 9;
pub const IBV_SEND_SIGNALED: c_uint = 2;
pub const IBV_SEND_INLINE: c_uint = 8;
pub const IBV_WC_SUCCESS: c_uint = 0;
pub const IBV_WC_WR_FLUSH_ERR: c_uint = 5;

// --- librdmacm --------------------------------------------------------------------------

#[repr(C)]
pub struct RdmaEventChannel {
    pub fd: c_int,
}

/// The front of `struct rdma_cm_id` (rdma_cma.h), up to `route.addr`'s source and
/// destination addresses (`struct rdma_addr` opens with two `sockaddr_storage` unions).
/// Only ever read through pointers librdmacm gives us; never allocated here.
#[repr(C)]
pub struct RdmaCmIdRaw {
    pub verbs: *mut IbvContext,
    pub channel: *mut RdmaEventChannel,
    pub context: *mut c_void,
    pub qp: *mut IbvQp,
    /// `route.addr.src_storage`: our side of the connection.
    pub src: libc::sockaddr_storage,
    /// `route.addr.dst_storage`: the peer.
    pub dst: libc::sockaddr_storage,
}
const _: () = assert!(std::mem::offset_of!(RdmaCmIdRaw, src) == 32);
const _: () = assert!(std::mem::offset_of!(RdmaCmIdRaw, dst) == 160);

#[repr(C)]
#[derive(Clone, Copy)]
pub struct RdmaConnParam {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}
const _: () = assert!(std::mem::size_of::<RdmaConnParam>() == 24);

#[repr(C)]
pub struct RdmaCmEventRaw {
    pub id: *mut RdmaCmIdRaw,
    pub listen_id: *mut RdmaCmIdRaw,
    pub event: c_uint,
    pub status: c_int,
    /// `param.conn` (the union also holds `rdma_ud_param`, which is larger).
    pub conn: RdmaConnParam,
}
const _: () = assert!(std::mem::offset_of!(RdmaCmEventRaw, conn) == 24);

pub const RDMA_PS_TCP: c_int = 0x0106;
pub const RDMA_CM_EVENT_ADDR_RESOLVED: c_uint = 0;
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: c_uint = 2;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: c_uint = 4;
pub const RDMA_CM_EVENT_CONNECT_ERROR: c_uint = 6;
pub const RDMA_CM_EVENT_UNREACHABLE: c_uint = 7;
pub const RDMA_CM_EVENT_REJECTED: c_uint = 8;
pub const RDMA_CM_EVENT_ESTABLISHED: c_uint = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: c_uint = 10;
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: c_uint = 11;
pub const RDMA_CM_EVENT_ADDR_CHANGE: c_uint = 14;
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: c_uint = 15;

/// The entry points, resolved once.
pub struct Lib {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void,
    pub free_device_list: unsafe extern "C" fn(*mut *mut c_void),
    pub alloc_pd: unsafe extern "C" fn(*mut IbvContext) -> *mut IbvPd,
    pub dealloc_pd: unsafe extern "C" fn(*mut IbvPd) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(*mut IbvContext) -> *mut IbvCompChannel,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut IbvCompChannel) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut IbvContext,
        c_int,
        *mut c_void,
        *mut IbvCompChannel,
        c_int,
    ) -> *mut IbvCq,
    pub destroy_cq: unsafe extern "C" fn(*mut IbvCq) -> c_int,
    pub get_cq_event:
        unsafe extern "C" fn(*mut IbvCompChannel, *mut *mut IbvCq, *mut *mut c_void) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(*mut IbvCq, c_uint),
    pub reg_mr: unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, c_int) -> *mut IbvMr,
    pub dereg_mr: unsafe extern "C" fn(*mut IbvMr) -> c_int,
    pub wc_status_str: unsafe extern "C" fn(c_uint) -> *const c_char,

    pub create_event_channel: unsafe extern "C" fn() -> *mut RdmaEventChannel,
    pub destroy_event_channel: unsafe extern "C" fn(*mut RdmaEventChannel),
    pub create_id: unsafe extern "C" fn(
        *mut RdmaEventChannel,
        *mut *mut RdmaCmIdRaw,
        *mut c_void,
        c_int,
    ) -> c_int,
    pub destroy_id: unsafe extern "C" fn(*mut RdmaCmIdRaw) -> c_int,
    pub bind_addr: unsafe extern "C" fn(*mut RdmaCmIdRaw, *const libc::sockaddr) -> c_int,
    pub listen: unsafe extern "C" fn(*mut RdmaCmIdRaw, c_int) -> c_int,
    pub get_cm_event:
        unsafe extern "C" fn(*mut RdmaEventChannel, *mut *mut RdmaCmEventRaw) -> c_int,
    pub ack_cm_event: unsafe extern "C" fn(*mut RdmaCmEventRaw) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut RdmaCmIdRaw, *mut IbvPd, *mut IbvQpInitAttr) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut RdmaCmIdRaw),
    pub accept: unsafe extern "C" fn(*mut RdmaCmIdRaw, *mut RdmaConnParam) -> c_int,
    pub reject: unsafe extern "C" fn(*mut RdmaCmIdRaw, *const c_void, u8) -> c_int,
    pub disconnect: unsafe extern "C" fn(*mut RdmaCmIdRaw) -> c_int,
    /// The active side (the test hosts in `examples/`; the target never connects).
    pub resolve_addr: unsafe extern "C" fn(
        *mut RdmaCmIdRaw,
        *const libc::sockaddr,
        *const libc::sockaddr,
        c_int,
    ) -> c_int,
    pub resolve_route: unsafe extern "C" fn(*mut RdmaCmIdRaw, c_int) -> c_int,
    pub connect: unsafe extern "C" fn(*mut RdmaCmIdRaw, *mut RdmaConnParam) -> c_int,
    /// The libraries the pointers above come from, kept loaded with them.
    _verbs: Library,
    _cm: Library,
}

/// rdma-core could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot load {lib}: {source}")]
    Library {
        lib: &'static str,
        source: libloading::Error,
    },
    #[error("symbol {symbol} not found in {lib}: {source}")]
    Symbol {
        lib: &'static str,
        symbol: &'static str,
        source: libloading::Error,
    },
}

fn open(name: &'static str) -> Result<Library, LoadError> {
    // SAFETY: loading rdma-core runs its initializers, which have no preconditions; the
    // libraries stay loaded for the life of the process (`Lib` lives in a static).
    unsafe { Library::open(Some(name), RTLD_NOW | RTLD_GLOBAL) }
        .map_err(|source| LoadError::Library { lib: name, source })
}

macro_rules! load {
    ($lib:expr, $libname:expr, $name:literal) => {{
        // SAFETY: the symbol has the C prototype of rdma-core 44 that the field's type
        // spells out; the library it comes from is kept in `Lib` next to the pointer, so
        // the pointer never outlives it.
        let s = unsafe { $lib.get(concat!($name, "\0").as_bytes()) }.map_err(|source| {
            LoadError::Symbol {
                lib: $libname,
                symbol: $name,
                source,
            }
        })?;
        *s
    }};
}

impl Lib {
    pub fn load() -> Result<Lib, LoadError> {
        Lib::load_named("libibverbs.so.1", "librdmacm.so.1")
    }

    pub(crate) fn load_named(verbs: &'static str, cm: &'static str) -> Result<Lib, LoadError> {
        let v = open(verbs)?;
        let c = open(cm)?;
        Ok(Lib {
            get_device_list: load!(v, verbs, "ibv_get_device_list"),
            free_device_list: load!(v, verbs, "ibv_free_device_list"),
            alloc_pd: load!(v, verbs, "ibv_alloc_pd"),
            dealloc_pd: load!(v, verbs, "ibv_dealloc_pd"),
            create_comp_channel: load!(v, verbs, "ibv_create_comp_channel"),
            destroy_comp_channel: load!(v, verbs, "ibv_destroy_comp_channel"),
            create_cq: load!(v, verbs, "ibv_create_cq"),
            destroy_cq: load!(v, verbs, "ibv_destroy_cq"),
            get_cq_event: load!(v, verbs, "ibv_get_cq_event"),
            ack_cq_events: load!(v, verbs, "ibv_ack_cq_events"),
            reg_mr: load!(v, verbs, "ibv_reg_mr"),
            dereg_mr: load!(v, verbs, "ibv_dereg_mr"),
            wc_status_str: load!(v, verbs, "ibv_wc_status_str"),
            create_event_channel: load!(c, cm, "rdma_create_event_channel"),
            destroy_event_channel: load!(c, cm, "rdma_destroy_event_channel"),
            create_id: load!(c, cm, "rdma_create_id"),
            destroy_id: load!(c, cm, "rdma_destroy_id"),
            bind_addr: load!(c, cm, "rdma_bind_addr"),
            listen: load!(c, cm, "rdma_listen"),
            get_cm_event: load!(c, cm, "rdma_get_cm_event"),
            ack_cm_event: load!(c, cm, "rdma_ack_cm_event"),
            create_qp: load!(c, cm, "rdma_create_qp"),
            destroy_qp: load!(c, cm, "rdma_destroy_qp"),
            accept: load!(c, cm, "rdma_accept"),
            reject: load!(c, cm, "rdma_reject"),
            disconnect: load!(c, cm, "rdma_disconnect"),
            resolve_addr: load!(c, cm, "rdma_resolve_addr"),
            resolve_route: load!(c, cm, "rdma_resolve_route"),
            connect: load!(c, cm, "rdma_connect"),
            _verbs: v,
            _cm: c,
        })
    }
}
