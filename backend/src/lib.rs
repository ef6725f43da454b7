//! Block backends behind one trait.
//!
//! A [`Backend`] is one exported block store (RAM, a file or block device, later an NVMe
//! drive over VFIO). Each IO thread creates its own [`BackendQueue`] from it and drives
//! that queue alone: submit requests, poll completions, no locks shared with other
//! threads. Data moves in [`IoBuf`]s that the caller owns and lends to the request; the
//! completion hands the buffer back, so the data path allocates nothing per I/O and a
//! buffer is never touched by two parties at once (the io_uring ownership model).
//!
//! Errors on the I/O path are [`IoStatus`] values that the engine maps to NVMe status
//! codes; a failing backend never panics.
//!
//! Backends: [`ram`], [`file`] (files and block devices over io_uring) and [`nvme`]
//! (NVMe drives driven from user space over VFIO, with an emulated controller for tests).
//!
//! Not implemented here: metadata/protection information, zoned namespaces.

pub mod buf;
pub mod file;
pub mod nvme;
pub mod ram;

pub use buf::{BufPool, IoBuf};
pub use file::{FileBackend, FileOptions};
pub use nvme::{NvmeBackend, NvmeOptions};
pub use ram::RamBackend;

use std::sync::Arc;

/// What a request asks the backend to do. Offsets and lengths are in logical blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Fill `buf[..nblocks * block_size]` from `lba`.
    Read,
    /// Store `buf[..nblocks * block_size]` at `lba`; with `fua` the data is durable when
    /// the completion arrives.
    Write { fua: bool },
    /// Make every completed write durable. `lba` and `nblocks` are ignored.
    Flush,
    /// Zero `nblocks` from `lba` (no buffer); with `fua` the zeroes are durable when the
    /// completion arrives (NVMe Write Zeroes with FUA).
    WriteZeroes { fua: bool },
    /// The host no longer needs `nblocks` from `lba`; reads of them return zeroes.
    Deallocate,
}

/// One request. `tag` comes back unchanged in the completion.
///
/// A request the backend can check up front (range, buffer) is still accepted by
/// `submit` and fails in its completion: `lba + nblocks` past the end (or overflowing)
/// gives [`IoStatus::OutOfRange`], a missing or short buffer [`IoStatus::Unsupported`].
/// `nblocks == 0` completes `Ok` without I/O (NVMe's NLB is 0-based, so the engine never
/// sends it).
#[derive(Debug)]
pub struct Request {
    pub tag: u64,
    pub op: Op,
    pub lba: u64,
    pub nblocks: u32,
    /// Data buffer for Read/Write. Write stores the first `nblocks * block_size` bytes of
    /// `buf.as_slice()` (so `len()` must cover them). Read needs `capacity()` to cover
    /// them and, on success, sets `len()` to exactly `nblocks * block_size`. Any other
    /// op returns the buffer untouched.
    pub buf: Option<IoBuf>,
}

/// Why an I/O failed, in backend terms; the engine turns it into an NVMe status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoStatus {
    Ok,
    /// The device reported an error reading (EIO on read): Unrecovered Read Error.
    ReadError,
    /// The device reported an error writing or flushing: Write Fault.
    WriteFault,
    /// Request outside the device (should have been caught above): LBA Out of Range.
    OutOfRange,
    /// The backend cannot do this operation, or the request is malformed (Read/Write
    /// without a buffer, or one shorter than `nblocks * block_size`): Invalid
    /// Opcode/Field.
    Unsupported,
    /// The store has no room for the data (`ENOSPC`, `EDQUOT`, `EFBIG` on a write): Capacity
    /// Exceeded with DNR, the status NVMe defines for a thin-provisioned store that ran
    /// out. Nothing of the failed part was written; earlier data is unaffected.
    NoSpace,
    /// The store refuses this request for good (`EPERM`, `EROFS`, `EACCES`: an immutable or
    /// read-only file, a read-only device): Internal Error with DNR. See the engine's
    /// mapping for why it is not Namespace Write Protected.
    Refused,
    /// This request failed for a reason that may pass (`ENOMEM`, `EBUSY`, `EAGAIN` after
    /// retries, `ETIMEDOUT`, a transport error below a device): Internal Error without
    /// DNR, so the host may retry it.
    Busy,
    /// This request failed for a reason the backend does not know to be transient:
    /// Internal Error with DNR. The namespace stays: only [`IoStatus::Unavailable`] takes
    /// it out.
    Failed,
    /// The drive did not complete the command in time and it was aborted (by an Abort
    /// command or a controller reset) more often than the backend retries: Command Abort
    /// Requested, without DNR. The drive itself is still there.
    Aborted,
    /// A status the drive itself returned, passed through to the host as it is (NVMe
    /// backends; the drive's own DNR is kept).
    Device {
        sct: u8,
        sc: u8,
        dnr: bool,
    },
    /// The backing store itself is gone (file deleted, device removed, controller failed
    /// for good): the engine answers a path error and takes the namespace out. Never for
    /// an error that concerns one request.
    Unavailable,
}

#[derive(Debug)]
pub struct Completion {
    pub tag: u64,
    pub status: IoStatus,
    /// The buffer lent with the request, returned.
    pub buf: Option<IoBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    /// A size the backend reaches only after a restart ([`Backend::grow`] past what its
    /// store reserved at start); nothing changed.
    #[error("{0}")]
    NeedsRestart(String),
    #[error("io_uring setup failed: {0}")]
    Uring(std::io::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Submission refused: the queue is full (try again after polling) or the queue is dead.
#[derive(Debug)]
pub enum SubmitError {
    Full(Request),
    Closed(Request),
}

/// One exported block store, shared by every IO thread (`Arc<dyn Backend>`).
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Logical block size in bytes (512 or 4096).
    fn block_size(&self) -> u32;
    /// Capacity in logical blocks.
    fn num_blocks(&self) -> u64;
    /// Whether writes may sit in a volatile cache until Flush (reported to hosts as VWC).
    fn volatile_write_cache(&self) -> bool;
    /// A short name for logs and metrics, e.g. `ram` or the file path.
    fn describe(&self) -> String;
    /// A queue for the calling thread, able to hold `depth` requests in flight.
    fn create_queue(self: Arc<Self>, depth: u32) -> Result<Box<dyn BackendQueue>, Error>;
    /// Make everything written so far durable (used at shutdown), synchronously.
    fn flush_sync(&self) -> Result<(), Error>;
    /// Grows the store in place, keeping every byte it holds, and returns its capacity in
    /// blocks afterwards ([`Backend::num_blocks`] says the same from then on, on every
    /// thread, before this returns). `Some(bytes)`: the configuration asks for this size
    /// (a RAM namespace's `size`, a file's `size`: the file is extended to at least
    /// this). `None`: whatever the backing store holds now (a file or block device grown
    /// behind the daemon's back); nothing changes when it did not grow.
    ///
    /// Never shrinks: a backing store now smaller than the namespace, or a size the
    /// backend cannot reach without a restart, is an error that says why, and the
    /// capacity stays. Blocking (metadata calls); call it off the data path. The default
    /// is a backend whose size never changes.
    fn grow(&self, to: Option<u64>) -> Result<u64, Error> {
        let have = self.num_blocks();
        match to {
            Some(bytes) if bytes > have.saturating_mul(u64::from(self.block_size())) => {
                Err(Error::Invalid(format!(
                    "{}: this backend cannot grow while it runs",
                    self.describe()
                )))
            }
            _ => Ok(have),
        }
    }
    /// The largest size in bytes that [`Backend::grow`] can reach without a restart, when
    /// the backend has such a bound (a RAM store, or a file served from memory, grows only
    /// inside the address space it reserved at start); `None`: no such bound (what the
    /// storage allows, or nothing for a backend that cannot grow: `grow` says why). Lets
    /// a reload list a size past it as waiting for a restart rather than try and fail.
    fn grow_limit(&self) -> Option<u64> {
        None
    }
    /// The device's own SMART / Health Information log page (NVMe Log Page 02h, 512
    /// bytes), for backends that sit on a real drive (`nvme`); `None` otherwise or when
    /// the drive cannot answer. Blocking (an admin command); call it off the data path.
    fn health_log(&self) -> Option<[u8; 512]> {
        None
    }
    /// For an offload engine that drives the drive's queues itself (DOCA STA's
    /// `doca_sta_be_add_queue`): a new I/O queue pair of about `entries` entries with its
    /// rings and doorbell window ([`nvme::OffloadQueue`]). `None` for backends that are not
    /// an NVMe drive (RAM, file); `Some(Err)` when the drive cannot give one. Blocking
    /// (admin commands); call it at namespace add, off the data path.
    fn offload_queue(&self, _entries: u32) -> Option<Result<nvme::OffloadQueue, Error>> {
        None
    }
}

/// A per-thread queue. Not shared: one IO thread creates it, submits and polls (it is
/// not `Send`: the file queue's io_uring is bound to its creating thread).
///
/// Dropping a queue with requests in flight waits for the kernel to finish with their
/// buffers (never frees memory the kernel may still write) and discards their
/// completions; drain it first to get them.
pub trait BackendQueue {
    /// Queue a request; it is started no later than the next [`BackendQueue::poll`].
    /// Returns `Full` (with the request) when `in_flight()` has reached the depth.
    fn submit(&mut self, req: Request) -> Result<(), SubmitError>;
    /// Start queued work and collect finished requests into `out` (appended). Returns
    /// how many completions were appended. Never blocks.
    fn poll(&mut self, out: &mut Vec<Completion>) -> usize;
    /// Requests submitted and not yet returned by `poll`.
    fn in_flight(&self) -> usize;
    /// For a namespace held in memory (RAM, or a file in memory allocated in full): the
    /// store itself, so that a transport can send a read's bytes from it under its locks
    /// ([`RamBackend::lend`]) and write data it already holds
    /// ([`RamBackend::write_blocks`]) without a buffer and a second copy. `None` for
    /// every other backend.
    fn ram_store(&self) -> Option<Arc<RamBackend>> {
        None
    }
    /// Whether the backend is gone, for a queue whose I/O may bypass it through
    /// [`BackendQueue::ram_store`] (and so not hear of it from a request): the owner
    /// calls this about once a second and, once it says true, stops using the store and
    /// sends everything through the queue, which fails it as gone.
    fn check_gone(&mut self) -> bool {
        false
    }
}
