//! NVMe/RDMA pieces shared by the soft engine and the daemon's RDMA CM service.
//!
//! - rdma-core access: libibverbs.so.1 and librdmacm.so.1 are opened at run time
//!   ([`available`] says what is missing: the libraries or an RDMA device), with our own
//!   `#[repr(C)]` declarations in `ffi` (rdma-core 44 ABI).
//! - The NVMe-oF RDMA transport binding's wire bits (NVMe-oF 1.1 section 7.3, kernel
//!   `include/linux/nvme-rdma.h` for the field layout): the RDMA CM private data of the
//!   connect request ([`CmRequest`]), of the accept ([`accept_private_data`]) and of the
//!   reject ([`RejectStatus`]); keyed SGL data block descriptors ([`KeyedSgl`]); send-queue
//!   credit accounting ([`SqCredits`]).
//! - The connection manager: an event channel ([`CmChannel`]), listeners ([`CmListener`])
//!   and connect requests ([`ConnRequest`]) the application hands to an IO context, which
//!   creates the QP and accepts ([`crate::soft::StaIo::qp_accept_rdma`]).
//!
//! Not implemented: SRQ, multi-descriptor SGLs (last segment), iWARP specifics.

/// The raw rdma-core declarations. Public for the DOCA STA test double (`sta/doca-double`),
/// which drives verbs itself; to be reorganised with the engine traits (issue 10).
#[doc(hidden)]
pub mod ffi;

use std::ffi::c_void;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use nvmf::spec::{sgl, SglDescriptor};

pub(crate) use ffi::Lib;

static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

/// rdma-core, loaded once (also used by the DOCA STA test double).
pub fn lib() -> Result<&'static Lib, String> {
    LIB.get_or_init(Lib::load).as_ref().map_err(|e| e.clone())
}

/// Whether this machine can serve NVMe/RDMA: rdma-core's libraries load and at least one
/// RDMA device exists. The error says what is missing and how to get it.
pub fn available() -> Result<usize, String> {
    let lib = lib().map_err(|e| {
        format!(
            "NVMe/RDMA needs rdma-core's libibverbs.so.1 and librdmacm.so.1 ({e}); \
             install the libibverbs1, librdmacm1 and ibverbs-providers packages"
        )
    })?;
    let mut n = 0;
    // SAFETY: ibv_get_device_list writes the count to `n` and returns a NULL-terminated
    // array (or NULL), which we free at once with ibv_free_device_list.
    let list = unsafe { (lib.get_device_list)(&mut n) };
    if !list.is_null() {
        // SAFETY: `list` came from ibv_get_device_list and is freed once.
        unsafe { (lib.free_device_list)(list) };
    }
    if list.is_null() || n <= 0 {
        return Err(
            "NVMe/RDMA: rdma-core is installed but there is no RDMA device \
                    (ibv_get_device_list lists none); load the NIC's RDMA driver, or for \
                    Soft-RoCE: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <ifname>"
                .to_string(),
        );
    }
    Ok(n as usize)
}

// --- NVMe-oF RDMA private data ---------------------------------------------------------

/// Reject status in the reject private data (NVMe-oF 1.1 Figure 55, `nvme_rdma_cm_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

impl RejectStatus {
    /// The reject private data: RECFMT 0, STS.
    pub fn private_data(self) -> [u8; 4] {
        let s = (self as u16).to_le_bytes();
        [0, 0, s[0], s[1]]
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
#[derive(Clone, Copy, Debug)]
pub struct CmLimits {
    pub max_queue_depth: u16,
    pub admin_queue_depth: u16,
    pub max_io_queues: u16,
}

pub const CM_REQUEST_LEN: usize = 32;
pub const CM_ACCEPT_LEN: usize = 32;

impl CmRequest {
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

/// The accept private data (NVMe-oF 1.1 Figure 54): RECFMT 0, CRQSIZE.
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
    pub len: u32,
    pub key: u32,
    /// Sub type Fh: the host asks the target to invalidate `key` (SEND with Invalidate).
    pub invalidate: bool,
}

impl KeyedSgl {
    /// `None` unless the descriptor is a keyed data block with sub type address or
    /// invalidate key.
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
        let l = self.len.to_le_bytes();
        let k = self.key.to_le_bytes();
        SglDescriptor {
            addr: self.addr,
            bytes: [l[0], l[1], l[2], k[0], k[1], k[2], k[3]],
            id: sgl::TYPE_KEYED_DATA_BLOCK << 4
                | if self.invalidate {
                    sgl::SUBTYPE_INVALIDATE_KEY
                } else {
                    sgl::SUBTYPE_ADDRESS
                },
        }
    }
}

// --- send queue credits ---------------------------------------------------------------

/// Send-queue credits of one QP: work requests posted and not completed may not exceed
/// the send queue, and RDMA READs in flight may not exceed the initiator depth the
/// connection negotiated. Every send-side WR is signaled, so each completion returns
/// exactly what its post took.
#[derive(Clone, Copy, Debug)]
pub struct SqCredits {
    sq_free: u32,
    rd_free: u32,
}

impl SqCredits {
    pub fn new(sq: u32, reads: u32) -> SqCredits {
        SqCredits {
            sq_free: sq,
            rd_free: reads.max(1),
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
}

// --- connection manager ---------------------------------------------------------------

/// An `rdma_cm_id` travelling between threads. It is only a handle: who may use it is
/// decided by the protocol (the CM thread until it hands a connect request over, then the
/// IO context that accepted it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CmId(pub(crate) *mut ffi::RdmaCmIdRaw);

// SAFETY: an rdma_cm_id is a heap object of librdmacm whose calls are thread safe; the
// handle is moved between threads, and our protocol gives each id one user at a time.
unsafe impl Send for CmId {}

impl CmId {
    /// Identity for maps and logs.
    pub fn as_u64(self) -> u64 {
        self.0 as u64
    }
}

/// A connect request taken from the CM event channel (the event is already acknowledged):
/// hand it to an IO context, or reject it.
#[derive(Debug)]
pub struct ConnRequest {
    pub id: CmId,
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
    /// Refuse the connection with the NVMe-oF RDMA reject private data and free the id.
    pub fn reject(self, status: RejectStatus) {
        reject_and_destroy(self.id, Some(status));
    }
}

/// Reject (with a status, or without private data) and destroy an id we never accepted.
pub(crate) fn reject_and_destroy(id: CmId, status: Option<RejectStatus>) {
    let Ok(lib) = lib() else { return };
    let pd = status.map(RejectStatus::private_data);
    let (p, n) = match &pd {
        Some(b) => (b.as_ptr() as *const c_void, b.len() as u8),
        None => (std::ptr::null(), 0),
    };
    // SAFETY: `id` is a live connect-request id that nobody else uses; the private data
    // outlives the call; after rdma_destroy_id the id is not used again.
    unsafe {
        (lib.reject)(id.0, p, n);
        (lib.destroy_id)(id.0);
    }
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
    Established(CmId),
    Disconnected(CmId),
    DeviceRemoval(CmId),
    TimewaitExit(CmId),
    ConnectError(CmId),
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
    pub fn id(&self) -> CmId {
        CmId(self.id)
    }
}

fn errno_str() -> String {
    std::io::Error::last_os_error().to_string()
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

fn sockaddr_of(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
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
    pub fn new() -> Result<CmChannel, String> {
        available()?;
        let lib = lib()?;
        // SAFETY: no preconditions.
        let ch = unsafe { (lib.create_event_channel)() };
        if ch.is_null() {
            return Err(format!("rdma_create_event_channel: {}", errno_str()));
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
    pub fn listen(&self, addr: SocketAddr) -> Result<CmListener, String> {
        let mut id = std::ptr::null_mut();
        // SAFETY: `ch` is live; `id` receives the new id.
        let rc = unsafe {
            (self.lib.create_id)(self.ch, &mut id, std::ptr::null_mut(), ffi::RDMA_PS_TCP)
        };
        if rc != 0 {
            return Err(format!("rdma_create_id: {}", errno_str()));
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
            return Err(format!("rdma_bind_addr {addr}: {e}{hint}"));
        }
        // SAFETY: `id` is bound.
        if unsafe { (self.lib.listen)(id, 128) } != 0 {
            return Err(format!("rdma_listen {addr}: {}", errno_str()));
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
            let id = CmId(e.id);
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
                        id,
                        private_data: pd,
                        responder_resources: c.responder_resources,
                        initiator_depth: c.initiator_depth,
                    })
                }
                ffi::RDMA_CM_EVENT_ESTABLISHED => CmEvent::Established(id),
                ffi::RDMA_CM_EVENT_DISCONNECTED => CmEvent::Disconnected(id),
                ffi::RDMA_CM_EVENT_DEVICE_REMOVAL => CmEvent::DeviceRemoval(id),
                ffi::RDMA_CM_EVENT_TIMEWAIT_EXIT => CmEvent::TimewaitExit(id),
                ffi::RDMA_CM_EVENT_CONNECT_ERROR
                | ffi::RDMA_CM_EVENT_UNREACHABLE
                | ffi::RDMA_CM_EVENT_REJECTED => CmEvent::ConnectError(id),
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

    const LIM: CmLimits = CmLimits {
        max_queue_depth: 128,
        admin_queue_depth: 32,
        max_io_queues: 64,
    };

    fn req(recfmt: u16, qid: u16, hrq: u16, hsq: u16) -> [u8; 32] {
        CmRequest {
            recfmt,
            qid,
            hrqsize: hrq,
            hsqsize: hsq,
            cntlid: 0,
        }
        .encode()
    }

    #[test]
    fn private_data_round_trip_and_layout() {
        let b = req(0, 3, 128, 127);
        assert_eq!(&b[..8], &[0, 0, 3, 0, 128, 0, 127, 0]);
        let r = CmRequest::parse(&b).unwrap();
        assert_eq!((r.qid, r.hrqsize, r.hsqsize), (3, 128, 127));
        assert_eq!(r.encode(), b);
    }

    #[test]
    fn private_data_validation() {
        // What the Linux host sends: admin 32/31, I/O queue_size/queue_size-1.
        assert_eq!(CmRequest::validate(&req(0, 0, 32, 31), &LIM).unwrap().1, 32);
        assert_eq!(
            CmRequest::validate(&req(0, 1, 128, 127), &LIM).unwrap().1,
            128
        );
        let e = |b: &[u8]| CmRequest::validate(b, &LIM).unwrap_err();
        assert_eq!(e(&req(0, 1, 128, 127)[..31]), RejectStatus::InvalidLength);
        assert_eq!(e(&[]), RejectStatus::InvalidLength);
        assert_eq!(e(&req(1, 1, 128, 127)), RejectStatus::InvalidRecfmt);
        assert_eq!(e(&req(0, 65, 128, 127)), RejectStatus::InvalidQid);
        assert_eq!(e(&req(0, 1, 128, 128)), RejectStatus::InvalidHsqsize);
        assert_eq!(e(&req(0, 0, 32, 32)), RejectStatus::InvalidHsqsize);
        assert_eq!(e(&req(0, 1, 128, 0)), RejectStatus::InvalidHsqsize);
        assert_eq!(e(&req(0, 1, 0, 127)), RejectStatus::InvalidHrqsize);
        assert_eq!(e(&req(0, 1, 129, 127)), RejectStatus::InvalidHrqsize);
    }

    #[test]
    fn accept_and_reject_private_data() {
        let a = accept_private_data(128);
        assert_eq!(a.len(), 32);
        assert_eq!(&a[..4], &[0, 0, 128, 0]);
        assert!(a[4..].iter().all(|&b| b == 0));
        assert_eq!(RejectStatus::InvalidHsqsize.private_data(), [0, 0, 4, 0]);
        assert_eq!(RejectStatus::NoResources.private_data(), [0, 0, 6, 0]);
    }

    #[test]
    fn keyed_sgl_parse() {
        // Bytes as the Linux host builds them: addr, 3-byte length, 4-byte key, id 0x4F.
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
        raw[8..11].copy_from_slice(&[0x00, 0x00, 0x02]); // 128 KiB
        raw[11..15].copy_from_slice(&0xdead_beefu32.to_le_bytes());
        raw[15] = 0x4f;
        let d = SglDescriptor {
            addr: u64::from_le_bytes(raw[..8].try_into().unwrap()),
            bytes: raw[8..15].try_into().unwrap(),
            id: raw[15],
        };
        let k = KeyedSgl::parse(&d).unwrap();
        assert_eq!(
            k,
            KeyedSgl {
                addr: 0x1122_3344_5566_7788,
                len: 128 * 1024,
                key: 0xdead_beef,
                invalidate: true
            }
        );
        assert_eq!(k.encode(), d);
        let plain = KeyedSgl {
            invalidate: false,
            ..k
        };
        assert_eq!(plain.encode().id, 0x40);
        assert_eq!(KeyedSgl::parse(&plain.encode()), Some(plain));
        // Not keyed: in-capsule data block, transport data block, keyed with a bad subtype.
        for id in [0x01u8, 0x5a, 0x41, 0x4a] {
            assert_eq!(
                KeyedSgl::parse(&SglDescriptor { id, ..d }),
                None,
                "id {id:#x}"
            );
        }
    }

    #[test]
    fn credits() {
        let mut c = SqCredits::new(3, 1);
        assert!(c.take(true));
        assert!(!c.take(true), "only one READ in flight");
        assert!(c.take(false));
        assert!(c.take(false));
        assert!(!c.take(false), "send queue full");
        c.give(false);
        assert!(!c.take(true), "READ still limited by the initiator depth");
        assert!(c.take(false));
        c.give(true);
        assert_eq!((c.sq_free(), c.rd_free()), (1, 1));
        assert!(c.take(true));
        // A depth of 0 from the host still allows one READ (we need it to make progress).
        assert_eq!(SqCredits::new(4, 0).rd_free(), 1);
    }

    #[test]
    fn availability_reports_what_is_missing() {
        // Hermetic: whatever this machine has, the answer is a count or a clear message.
        match available() {
            Ok(n) => assert!(n > 0),
            Err(e) => assert!(
                e.contains("rdma-core") || e.contains("RDMA device"),
                "unhelpful message: {e}"
            ),
        }
    }
}
