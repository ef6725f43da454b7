//! rdma-core for the soft engine and the daemon's RDMA CM service: libibverbs.so.1 and
//! librdmacm.so.1 opened at run time with `libloading` ([`available`] says what is
//! missing: the libraries or an RDMA device), with our own `#[repr(C)]` declarations in
//! `ffi` (rdma-core 44 ABI), so the build needs neither rdma-core's -dev packages nor
//! libclang.
//!
//! - The connection manager: an event channel ([`CmChannel`]), listeners
//!   ([`CmListener`]) and connect requests ([`ConnRequest`]) the application hands to an IO
//!   context, which creates the QP and accepts ([`crate::soft::StaIo::qp_accept_rdma`]).
//! - Ownership of `rdma_cm_id`s is in the types: a [`CmId`] owns one (moved, never
//!   copied; dropping it destroys the id), a [`CmIdKey`] only names one (for maps and
//!   events), and a [`ConnRequest`] dropped without being accepted is rejected.
//!
//! The NVMe/RDMA wire pieces (CM private data, keyed SGLs, SQ credits) and the queue
//! protocol live in `nvmf::rdma`; the verbs side of an engine QP in
//! `crate::soft::rdma_link`.

// `unsafe` allowed here: librdmacm and libibverbs calls (loaded with libloading) and the
// raw CM ids and events they hand out.
#![allow(unsafe_code)]

mod channel;
/// The raw rdma-core declarations. Public (and hidden from the docs) only for the DOCA STA
/// test double (`sta/doca-double`), which drives verbs itself with the same table; nothing
/// else outside `sta` may use it.
#[doc(hidden)]
pub mod ffi;

pub use channel::{
    buried_channels, early_closed_channels, late_cq_events, reap_dead_channels, CqChannel,
    LATE_EVENT_GRACE, MAX_BURIED,
};

use std::ffi::c_void;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use nvmf::rdma::RejectStatus;

pub(crate) use ffi::Lib;

/// What went wrong with rdma-core.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    #[error(
        "NVMe/RDMA needs rdma-core's libibverbs.so.1 and librdmacm.so.1 ({0}); \
         install the libibverbs1, librdmacm1 and ibverbs-providers packages"
    )]
    Missing(String),
    #[error(
        "NVMe/RDMA: rdma-core is installed but there is no RDMA device \
         (ibv_get_device_list lists none); load the NIC's RDMA driver, or for \
         Soft-RoCE: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <ifname>"
    )]
    NoDevice,
    /// A verbs or CM call failed.
    #[error("{call}: {source}{hint}")]
    Call {
        call: String,
        source: std::io::Error,
        hint: &'static str,
    },
    #[error("spawning the RDMA CM thread: {0}")]
    Thread(std::io::Error),
}

impl VerbsError {
    pub(crate) fn call(call: impl Into<String>) -> VerbsError {
        VerbsError::Call {
            call: call.into(),
            source: std::io::Error::last_os_error(),
            hint: "",
        }
    }
}

static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

/// rdma-core, loaded once (also used by the DOCA STA test double).
#[doc(hidden)]
pub fn lib() -> Result<&'static Lib, VerbsError> {
    LIB.get_or_init(|| Lib::load().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| VerbsError::Missing(e.clone()))
}

/// Whether this machine can serve NVMe/RDMA: rdma-core's libraries load and at least one
/// RDMA device exists (the count). The error says what is missing and how to get it.
pub fn available() -> Result<usize, VerbsError> {
    let lib = lib()?;
    let mut n = 0;
    // SAFETY: ibv_get_device_list writes the count to `n` and returns a NULL-terminated
    // array (or NULL), which we free at once with ibv_free_device_list.
    let list = unsafe { (lib.get_device_list)(&mut n) };
    if !list.is_null() {
        // SAFETY: `list` came from ibv_get_device_list and is freed once.
        unsafe { (lib.free_device_list)(list) };
    }
    if list.is_null() || n <= 0 {
        return Err(VerbsError::NoDevice);
    }
    Ok(n as usize)
}

// --- connection manager ---------------------------------------------------------------

/// Names an `rdma_cm_id` without owning it: for maps and events. Never dereferenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CmIdKey(u64);

impl CmIdKey {
    /// Identity for maps and logs.
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

/// Owns an accepted or pending `rdma_cm_id`: one owner at a time (the CM thread until it
/// hands a connect request over, then the IO context that accepted it). Not `Copy`, not
/// `Clone`; dropping it destroys the id.
#[derive(Debug)]
pub struct CmId(*mut ffi::RdmaCmIdRaw);

// SAFETY: an rdma_cm_id is a heap object of librdmacm whose calls are thread safe; a
// `CmId` is moved (never shared) between threads, so exactly one thread uses it at a time.
unsafe impl Send for CmId {}

impl CmId {
    /// Identity for maps and logs.
    pub fn as_u64(&self) -> u64 {
        self.0 as u64
    }

    pub fn key(&self) -> CmIdKey {
        CmIdKey(self.0 as u64)
    }

    pub(crate) fn raw(&self) -> *mut ffi::RdmaCmIdRaw {
        self.0
    }

    /// Owns nothing: a stand-in left behind when an id is moved out of a struct that
    /// has its own Drop.
    pub(crate) fn placeholder() -> CmId {
        CmId(std::ptr::null_mut())
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        if self.0.is_null() {
            return;
        }
        if let Ok(lib) = lib() {
            // SAFETY: we own the id and nobody uses it after this; its QP (if any) was
            // destroyed first by the link that owned both.
            unsafe { (lib.destroy_id)(self.0) };
        }
    }
}

/// A connect request taken from the CM event channel (the event is already acknowledged):
/// hand it to an IO context, or reject it. Dropped without either, it is rejected (no
/// resources) and its id destroyed.
#[derive(Debug)]
pub struct ConnRequest {
    id: Option<CmId>,
    pub private_data: Vec<u8>,
    /// From our side (the CM swaps the host's values): RDMA READs the host wants in
    /// flight toward us (its initiator depth).
    pub responder_resources: u8,
    /// RDMA READs we may have in flight toward the host (its responder resources); 0
    /// means we could never fetch host data.
    pub initiator_depth: u8,
    /// Our address of the connection (which listener it reached, which address the host
    /// used), from the new id's route.
    pub local: Option<SocketAddr>,
    /// The host's address, for logs.
    pub peer: Option<SocketAddr>,
}

impl ConnRequest {
    /// The id's name, for maps and logs.
    pub fn key(&self) -> CmIdKey {
        self.id.as_ref().map_or(CmIdKey(0), CmId::key)
    }

    /// Refuse the connection with the NVMe-oF RDMA reject private data and free the id.
    pub fn reject(mut self, status: RejectStatus) {
        if let Some(id) = self.id.take() {
            reject(&id, Some(status));
        }
    }

    /// Take the id to accept it (the IO context owns it from here).
    pub(crate) fn take_id(&mut self) -> Option<CmId> {
        self.id.take()
    }

    /// Give the id back after a failed accept (so the request can be rejected).
    pub(crate) fn put_id(&mut self, id: CmId) {
        self.id = Some(id);
    }

    pub(crate) fn id_raw(&self) -> Option<*mut ffi::RdmaCmIdRaw> {
        self.id.as_ref().map(CmId::raw)
    }
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            reject(&id, Some(RejectStatus::NoResources));
        }
    }
}

/// Reject (with a status, or without private data) a connect request we never accepted;
/// the caller then drops (destroys) the id.
fn reject(id: &CmId, status: Option<RejectStatus>) {
    let Ok(lib) = lib() else { return };
    let pd = status.map(RejectStatus::private_data);
    let (p, n) = match &pd {
        Some(b) => (b.as_ptr() as *const c_void, b.len() as u8),
        None => (std::ptr::null(), 0),
    };
    // SAFETY: `id` is a live connect-request id that nobody else uses; the private data
    // outlives the call.
    unsafe { (lib.reject)(id.raw(), p, n) };
}

/// What an IO context is told about one of its RDMA QPs by the CM thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RdmaCmEvent {
    Established,
    /// The host disconnected.
    Disconnected,
    /// Device removal, time-wait exit before a disconnect, connect error.
    Lost,
}

/// What the CM thread learns from the event channel.
#[derive(Debug)]
pub enum CmEvent {
    ConnectRequest(ConnRequest),
    /// For an accepted connection: established, or gone (disconnected, device removed
    /// (also reported for a listener's id), time-wait over, connect error).
    Established(CmIdKey),
    Disconnected(CmIdKey),
    DeviceRemoval(CmIdKey),
    TimewaitExit(CmIdKey),
    ConnectError(CmIdKey),
    Other(u32),
}

/// An RDMA CM event channel (`rdma_create_event_channel`), shared by listeners and the
/// connections they accept.
pub struct CmChannel {
    lib: &'static Lib,
    ch: *mut ffi::RdmaEventChannel,
}

// SAFETY: librdmacm event channels may be used from any thread.
unsafe impl Send for CmChannel {}
// SAFETY: every operation (rdma_create_id/bind/listen, rdma_get_cm_event/ack) is thread
// safe in librdmacm; events are copied out before they are acknowledged.
unsafe impl Sync for CmChannel {}

/// A listening `rdma_cm_id`; dropping it destroys it.
pub struct CmListener {
    lib: &'static Lib,
    id: *mut ffi::RdmaCmIdRaw,
}

// SAFETY: the listening id is only destroyed (once, on drop); librdmacm is thread safe.
unsafe impl Send for CmListener {}

impl Drop for CmListener {
    fn drop(&mut self) {
        // SAFETY: `id` is a live listening id we own; no use after this.
        unsafe { (self.lib.destroy_id)(self.id) };
    }
}

impl CmListener {
    pub fn key(&self) -> CmIdKey {
        CmIdKey(self.id as u64)
    }
}

/// A `sockaddr_storage` holding an IPv4 or IPv6 address, as a `SocketAddr`.
fn socket_addr_from(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says it holds a sockaddr_in, which it is large enough
            // and aligned for.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::new(ip.into(), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::new(ip.into(), u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

/// `addr` as a `sockaddr_storage` and its length, for librdmacm's calls.
pub fn sockaddr_of(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all zeroes is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            (ss, std::mem::size_of::<libc::sockaddr_in>() as _)
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            (ss, std::mem::size_of::<libc::sockaddr_in6>() as _)
        }
    }
}

impl CmChannel {
    /// Needs rdma-core and an RDMA device ([`available`]).
    pub fn new() -> Result<CmChannel, VerbsError> {
        available()?;
        let lib = lib()?;
        // SAFETY: no preconditions.
        let ch = unsafe { (lib.create_event_channel)() };
        if ch.is_null() {
            return Err(VerbsError::call("rdma_create_event_channel"));
        }
        // Non-blocking, so `get_event` can poll with a timeout.
        // SAFETY: `ch` is live; `fd` is its descriptor.
        let fd = unsafe { (*ch).fd };
        // SAFETY: fcntl on a descriptor we own.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        Ok(CmChannel { lib, ch })
    }

    /// `rdma_create_id` + `rdma_bind_addr` + `rdma_listen` on `addr`.
    pub fn listen(&self, addr: SocketAddr) -> Result<CmListener, VerbsError> {
        let mut id = std::ptr::null_mut();
        // SAFETY: `ch` is live; `id` receives the new id.
        let rc = unsafe {
            (self.lib.create_id)(self.ch, &mut id, std::ptr::null_mut(), ffi::RDMA_PS_TCP)
        };
        if rc != 0 {
            return Err(VerbsError::call("rdma_create_id"));
        }
        let l = CmListener { lib: self.lib, id };
        let (ss, _) = sockaddr_of(addr);
        // SAFETY: `id` is live; `ss` holds a sockaddr_in/in6 for the call's duration.
        let rc = unsafe { (self.lib.bind_addr)(id, &ss as *const _ as *const libc::sockaddr) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            let hint = if e.raw_os_error() == Some(libc::ENODEV)
                || e.raw_os_error() == Some(libc::EADDRNOTAVAIL)
            {
                " (no RDMA device serves this address: give the address of an interface \
                 with an RDMA device, e.g. Soft-RoCE's netdev)"
            } else {
                ""
            };
            return Err(VerbsError::Call {
                call: format!("rdma_bind_addr {addr}"),
                source: e,
                hint,
            });
        }
        // SAFETY: `id` is bound.
        if unsafe { (self.lib.listen)(id, 128) } != 0 {
            return Err(VerbsError::call(format!("rdma_listen {addr}")));
        }
        Ok(l)
    }

    /// Wait up to `timeout` for one event; the event is acknowledged before it is returned
    /// (the private data is copied).
    pub fn get_event(&self, timeout: Duration) -> Option<CmEvent> {
        // SAFETY: `ch` is live.
        let fd = unsafe { (*self.ch).fd };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, ms) } <= 0 {
            return None;
        }
        let mut ev = std::ptr::null_mut();
        // SAFETY: `ch` is live and non-blocking; `ev` receives an event we ack below.
        if unsafe { (self.lib.get_cm_event)(self.ch, &mut ev) } != 0 || ev.is_null() {
            return None;
        }
        // SAFETY: `ev` is a live event until rdma_ack_cm_event; we copy what we need.
        let out = unsafe {
            let e = &*ev;
            let key = CmIdKey(e.id as u64);
            match e.event {
                ffi::RDMA_CM_EVENT_CONNECT_REQUEST => {
                    let c = e.conn;
                    let pd = if c.private_data.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(
                            c.private_data as *const u8,
                            c.private_data_len as usize,
                        )
                        .to_vec()
                    };
                    // The new id's route holds both ends of the connection.
                    let (local, peer) = if e.id.is_null() {
                        (None, None)
                    } else {
                        let raw = &*e.id;
                        (socket_addr_from(&raw.src), socket_addr_from(&raw.dst))
                    };
                    CmEvent::ConnectRequest(ConnRequest {
                        local,
                        peer,
                        id: Some(CmId(e.id)),
                        private_data: pd,
                        responder_resources: c.responder_resources,
                        initiator_depth: c.initiator_depth,
                    })
                }
                ffi::RDMA_CM_EVENT_ESTABLISHED => CmEvent::Established(key),
                ffi::RDMA_CM_EVENT_DISCONNECTED => CmEvent::Disconnected(key),
                ffi::RDMA_CM_EVENT_DEVICE_REMOVAL => CmEvent::DeviceRemoval(key),
                ffi::RDMA_CM_EVENT_TIMEWAIT_EXIT => CmEvent::TimewaitExit(key),
                ffi::RDMA_CM_EVENT_CONNECT_ERROR
                | ffi::RDMA_CM_EVENT_UNREACHABLE
                | ffi::RDMA_CM_EVENT_REJECTED => CmEvent::ConnectError(key),
                other => CmEvent::Other(other),
            }
        };
        // SAFETY: `ev` came from rdma_get_cm_event and is acked once.
        unsafe { (self.lib.ack_cm_event)(ev) };
        Some(out)
    }
}

impl Drop for CmChannel {
    fn drop(&mut self) {
        // SAFETY: every id on the channel is gone by now (listeners are dropped first,
        // accepted ids are destroyed by their IO contexts); `ch` is freed once.
        unsafe { (self.lib.destroy_event_channel)(self.ch) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_reports_what_is_missing() {
        // Hermetic: whatever this machine has, the answer is a count or a clear message.
        match available() {
            Ok(n) => assert!(n > 0),
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.contains("rdma-core") || e.contains("RDMA device"),
                    "unhelpful message: {e}"
                )
            }
        }
    }

    /// The ownership types stay what they say (a compile-time check): `CmId` owns, so it
    /// is `Send` (moved to the accepting thread) but neither `Copy` nor `Sync`.
    #[test]
    fn cm_id_ownership() {
        fn send<T: Send>() {}
        send::<CmId>();
        send::<ConnRequest>();
        // `CmIdKey` is a plain number.
        let k = CmIdKey(7);
        let k2 = k;
        assert_eq!(k.as_u64(), k2.as_u64());
    }
}
