//! File and block-device backend over io_uring.
//!
//! [`FileBackend::open`] takes a regular file (created or extended when `create_size` is
//! given) or a block device (size from `BLKGETSIZE64`, logical block size from
//! `BLKSSZGET`). It uses `O_DIRECT` when the exported block size is a multiple of the
//! device's direct-I/O alignment and the kernel accepts an aligned probe read; otherwise
//! it falls back to buffered I/O (`FileOptions::direct` can force either way).
//!
//! Each [`FileQueue`] owns one io_uring with `depth` entries and its own open file
//! description of the file (reopened through `/proc/self/fd`), registered as fixed file 0.
//! Its own description matters for writeback errors: Linux reports a writeback error to
//! each open file description once (`errseq_t`), so queues sharing one would let a single
//! Flush see the error and the others succeed over data that was lost. On top of that the
//! backend remembers a writeback error for good: once a Flush, or a buffered FUA write
//! whose error may be another page's writeback error, has failed, every later Flush and
//! FUA write fails too, on every queue, and so does `flush_sync`. A write that stored
//! nothing (no room, refused) or an `O_DIRECT` write's own error does not count
//! (`latches_writeback_error`).
//! The kernel may have dropped the dirty pages it could not write; no later fsync can
//! make them durable, so no later Flush may say so (PostgreSQL's "fsyncgate" lesson).
//!
//! A backing file that is deleted under the daemon (its link count drops to 0; checked at
//! every Flush and at most once a second on other requests) or a device that vanishes
//! (`ENODEV`, `ENXIO`, `ENOMEDIUM`) makes the backend *gone*: every request from then on
//! fails with [`IoStatus::Unavailable`], which the engine answers with a path error. Any
//! other errno fails its request alone (`status_for_errno`).
//!
//! Mapping of operations:
//!
//! | Op | io_uring |
//! | --- | --- |
//! | Read | `READ`; short reads are resubmitted for the remainder |
//! | Write | `WRITE`; with FUA, `RWF_DSYNC` (REQ_FUA on a block device with `O_DIRECT`) |
//! | Flush | `FSYNC` with `DATASYNC` |
//! | Deallocate | `FALLOCATE(PUNCH_HOLE\|KEEP_SIZE)`, else `ZERO_RANGE`, else zero writes |
//! | Write Zeroes | `FALLOCATE(ZERO_RANGE\|KEEP_SIZE)`, else `PUNCH_HOLE`, else zero writes |
//!
//! On a block device the kernel implements both fallocate modes with a zero-out
//! (`PUNCH_HOLE` only where the device can unmap and guarantee zeroes), so reads of a
//! deallocated range return zeroes on files and devices alike. A mode that returns
//! `EOPNOTSUPP` is remembered and skipped afterwards.
//!
//! Files in memory (tmpfs, ramfs) take no io_uring: their reads and writes are copied in
//! the IO thread (see `memory_backed`). One that has no hole in the namespace's range
//! when opened goes further: it is served as a store over a shared mapping of its pages
//! ([`RamBackend::map_file`]), and its queues set up no io_uring at all (Flush is an
//! inline `fdatasync`, which tmpfs answers at once), so such a file is served even where
//! io_uring is blocked. Reads, writes and zeroing go through the store's stripe
//! locks (each block one version), plain TCP queues send reads straight from the pages
//! ([`BackendQueue::ram_store`]), and zeroing writes zeroes, so the file stays allocated
//! ([`ZERO_STEP`](crate::ram::ZERO_STEP) bytes per poll, so the IO thread's other
//! connections are served meanwhile). Such a file that shrinks below the namespace or
//! loses pages from outside is gone too (its lent reads would fail, or allocate, inside
//! the send); the engine asks the queue about once a second
//! ([`BackendQueue::check_gone`]), since its reads may never reach the queue.
//!
//! Growing ([`Backend::grow`]): the capacity is re-read from the file (fstat) or device
//! (`BLKGETSIZE64`), after extending a smaller file to the size asked for. Queues check
//! every request against the capacity now, so queues made before the grow serve the new
//! blocks. A mapped file first allocates the added range (as at open) and raises the
//! allocated-block count the gone check compares with, then grows its store, whose mapping
//! reserved room for that when it was opened (`crate::ram`); past that room, only a restart
//! grows it. Nothing shrinks: a store found smaller than the namespace is an error.
//!
//! `submit` never enters the kernel; `poll` pushes queued SQEs, calls `io_uring_enter`
//! without waiting when there is something to submit or task work to run, and reaps
//! CQEs. The volatile write cache is reported as present: even with `O_DIRECT`, file
//! metadata and the device's own cache need a Flush to be durable.
//!
//! Not implemented: registered (fixed) buffers, polled I/O (`IOPOLL`), `SQPOLL`.

// `unsafe` allowed here: io_uring submissions hand the kernel raw pointers into request
// buffers, and block-device ioctls (BLKGETSIZE64, BLKSSZGET).
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use io_uring::{opcode, squeue, types, IoUring};

use crate::ram::Zeroing;
use crate::{
    Backend, BackendQueue, Completion, Error, IoBuf, IoStatus, Op, RamBackend, Request, SubmitError,
};

/// How to open a [`FileBackend`].
#[derive(Clone, Debug, Default)]
pub struct FileOptions {
    /// Create the file if missing and extend it to at least this many bytes (regular
    /// files; for a block device, an error if the device is smaller).
    pub create_size: Option<u64>,
    /// Exported logical block size; default: the device's logical block size for a block
    /// device, the filesystem's direct-I/O alignment (or 512) for a file.
    pub block_size: Option<u32>,
    /// `Some(true)`: require `O_DIRECT`; `Some(false)`: buffered; `None`: `O_DIRECT` when
    /// possible.
    pub direct: Option<bool>,
}

/// Largest byte count for one read/write SQE (the kernel's `MAX_RW_COUNT`).
const MAX_RW: u64 = 0x7fff_f000;
/// Zero buffer for the Write Zeroes fallback.
const ZERO_BUF: usize = 1 << 20;
/// Resubmissions allowed after `EAGAIN`/`EINTR` before giving up on a request.
const MAX_RETRIES: u8 = 16;

const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
const ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;

#[cfg(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc64"
))]
const BLKGETSIZE64: libc::Ioctl = 0x4008_1272;
/// `_IOR(0x12, 114, size_t)` with the generic ioctl encoding.
#[cfg(not(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc64"
)))]
const BLKGETSIZE64: libc::Ioctl = 0x8008_1272;

/// A file or block device exported as a namespace.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    path: String,
    block_size: u32,
    /// Capacity in blocks. Only grows ([`Backend::grow`]), published with `Release` once
    /// the blocks are there (and for a mapped file, allocated and in the store); read with
    /// `Acquire`.
    num_blocks: AtomicU64,
    /// Held by `grow`: one resize at a time.
    growing: Mutex<()>,
    direct: bool,
    block_device: bool,
    /// The file lives in memory (tmpfs, ramfs): reads and writes are done at once in the
    /// IO thread (see [`memory_backed`]).
    inline_rw: bool,
    /// A file in memory that is allocated in full, as a store (`crate::ram`): reads,
    /// writes and zeroing go through the store, whose stripe locks make each block one
    /// version, and plain TCP queues send reads straight from its pages
    /// ([`BackendQueue::ram_store`]).
    store: Option<Arc<RamBackend>>,
    /// The mapped file's allocated 512-byte blocks when the store was set up: fewer later
    /// means pages were freed under the store (truncated or punched from outside). Raised
    /// by `grow` once the added range is allocated, before the namespace grows.
    mapped_blocks: AtomicU64,
    /// Cleared when `FALLOCATE(PUNCH_HOLE)` returned `EOPNOTSUPP`.
    punch_ok: AtomicBool,
    /// Cleared when `FALLOCATE(ZERO_RANGE)` returned `EOPNOTSUPP`.
    zero_range_ok: AtomicBool,
    /// A Flush or FUA write failed: what was written may be lost; every later one fails.
    writeback_failed: AtomicBool,
    /// The file was deleted or the device vanished: every request fails.
    gone: AtomicBool,
}

/// The store over a file in memory of `size` bytes, and the file's allocated 512-byte
/// blocks once it is set up, when the file has no hole in those bytes (a lent read of a
/// hole would have the kernel allocate a page inside the send: see `crate::ram`).
///
/// A quick screen first: no hole in the range (`SEEK_HOLE`), or every page of the file
/// allocated (tmpfs's `SEEK_HOLE` calls pages `fallocate` reserved holes until they are
/// written, though a fault finds them there and only zeroes them). Then the proof:
/// `fallocate` of the whole range, which changes nothing where every page is there and
/// otherwise reserves the rest (where the screen was fooled, say by pages reserved past
/// the end of the file) or fails (ramfs cannot; nor can a full tmpfs), and the file is
/// then copied instead. The store copies through a new open file description without
/// `O_DIRECT`, since it copies into any buffer.
fn memory_store(
    file: &File,
    name: &str,
    size: u64,
    block_size: u32,
) -> Option<(Arc<RamBackend>, u64)> {
    let fd = file.as_raw_fd();
    // SAFETY: lseek on a valid fd has no memory-safety preconditions.
    let hole = unsafe { libc::lseek(fd, 0, libc::SEEK_HOLE) };
    let reserved = file
        .metadata()
        .is_ok_and(|m| m.blocks().saturating_mul(512) >= m.len());
    if !reserved && (hole < 0 || (hole as u64) < size) {
        tracing::info!(
            "{name}: in memory but not allocated in full (first hole at byte {hole}): its \
             reads are copied; allocate it (write it, or fallocate -l SIZE) to have them \
             sent straight from its pages"
        );
        return None;
    }
    // SAFETY: fallocate on a valid fd has no memory-safety preconditions.
    if unsafe { libc::fallocate(fd, 0, 0, size as libc::off_t) } != 0 {
        tracing::info!(
            "{name}: cannot reserve every page of the file ({}): its reads are copied",
            io::Error::last_os_error()
        );
        return None;
    }
    let blocks = file.metadata().map(|m| m.blocks()).unwrap_or(0);
    let plain = OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{fd}"));
    let mapped = plain.map_err(Error::Io).and_then(|f| {
        // SAFETY: `map_file`'s contract: nothing in this process writes the file but the
        // store (every queue of a mapped file sends its requests through the store), and
        // nothing reads the mapping in user space: the store copies through the file and
        // the engine hands lent bytes to `writev` only. Another process truncating or
        // writing the file is what no code can rule out; a truncation then fails those
        // `writev`s with `EFAULT`, and the queues' checks take the namespace out within a
        // second.
        unsafe { RamBackend::map_file(f, size, block_size) }
    });
    match mapped {
        Ok(store) => {
            tracing::debug!("{name}: in memory and allocated in full: served from its pages");
            Some((store, blocks))
        }
        Err(e) => {
            tracing::warn!("{name}: cannot map the file ({e}): its reads are copied");
            None
        }
    }
}

/// Direct-I/O constraints of an open file: (offset/length alignment, memory alignment).
/// `Some((0, _))` means the file does not support direct I/O; `None`: unknown.
fn dio_align(file: &File) -> Option<(u32, u32)> {
    // SAFETY: `statx` is plain old data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, a NUL-terminated empty path with AT_EMPTY_PATH (stat the fd
    // itself), and a pointer to a live `statx` the kernel fills in.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    Some((stx.stx_dio_offset_align, stx.stx_dio_mem_align))
}

/// Whether `file` lives on a memory file system (tmpfs, ramfs). Their reads and writes
/// never wait for a device, but they do not support non-blocking I/O (`RWF_NOWAIT` says
/// `EOPNOTSUPP`), so io_uring cannot complete them inline: it hands every one to an io-wq
/// worker thread, a context switch per request on the IO thread's own core (measured: a
/// 4 KiB randread QD32 namespace on /dev/shm served half the IOPS of SPDK's AIO bdev, which
/// copies inline). For these files the queue does the copy itself, as the RAM backend
/// does. (A page swapped out can still make one read wait; the RAM backend has the same
/// exposure.)
fn memory_backed(file: &File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    // SAFETY: `statfs` is plain old data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and a pointer to a live `statfs` the kernel fills in.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)] // f_type is i64 on x86_64, other widths elsewhere
    let kind = st.f_type as i64;
    kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
}

fn bdev_geometry(file: &File) -> io::Result<(u64, u32)> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to `size`.
    if unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut lbs: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which points to `lbs`.
    if unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            libc::BLKSSZGET,
            &mut lbs as *mut libc::c_int,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    let lbs =
        u32::try_from(lbs).map_err(|_| io::Error::other("BLKSSZGET returned a negative size"))?;
    Ok((size, lbs))
}

/// Reads block 0 with `O_DIRECT` to see whether the kernel really accepts it.
fn probe_direct(file: &File, block_size: u32) -> io::Result<()> {
    let mut buf = IoBuf::new(block_size as usize);
    // SAFETY: `buf` is a live, exclusively owned allocation of at least `block_size`
    // bytes; pread writes at most that many.
    let n = unsafe {
        libc::pread(
            file.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            block_size as usize,
            0,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl FileBackend {
    /// Opens (and with `create_size`, creates or extends) a file or block device.
    pub fn open(path: impl AsRef<Path>, opts: FileOptions) -> Result<Arc<FileBackend>, Error> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let open_err = |source: io::Error| Error::Open {
            path: name.clone(),
            source,
        };
        let mut oo = OpenOptions::new();
        oo.read(true).write(true);
        if opts.create_size.is_some() {
            oo.create(true);
        }
        let file = oo.open(path).map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        let ft = meta.file_type();

        let (size, dio) = if ft.is_block_device() {
            let (size, lbs) = bdev_geometry(&file).map_err(open_err)?;
            if let Some(want) = opts.create_size {
                if want > size {
                    return Err(Error::Invalid(format!(
                        "{name}: block device has {size} bytes, create_size asks for {want}"
                    )));
                }
            }
            (size, Some((lbs, lbs)))
        } else if ft.is_file() {
            let mut size = meta.len();
            if let Some(want) = opts.create_size {
                if want > size {
                    file.set_len(want).map_err(open_err)?;
                    size = want;
                }
            }
            (size, dio_align(&file))
        } else {
            return Err(Error::Invalid(format!(
                "{name}: neither a regular file nor a block device"
            )));
        };

        let block_size = match opts.block_size {
            Some(bs) => bs,
            None => match dio {
                Some((off, _)) if off >= 512 => off,
                _ => 512,
            },
        };
        if !block_size.is_power_of_two() || !(512..=65536).contains(&block_size) {
            return Err(Error::Invalid(format!(
                "{name}: block size {block_size} is not a power of two in 512..=65536"
            )));
        }
        if ft.is_block_device() {
            let lbs = dio.map_or(512, |d| d.0);
            if block_size < lbs {
                return Err(Error::Invalid(format!(
                    "{name}: block size {block_size} is below the device's logical block size {lbs}"
                )));
            }
        }
        let num_blocks = size / u64::from(block_size);
        if num_blocks == 0 {
            return Err(Error::Invalid(format!(
                "{name}: {size} bytes is less than one {block_size}-byte block"
            )));
        }

        // O_DIRECT is possible when our offsets/lengths (multiples of block_size) and
        // buffers (4 KiB aligned) meet the device's alignment; unknown alignment: try.
        let direct_possible = match dio {
            Some((0, _)) => false,
            Some((off, mem)) => block_size >= off && mem <= crate::buf::IO_BUF_ALIGN as u32,
            None => true,
        };
        let mut direct_err = None;
        let direct_file = if opts.direct != Some(false) && direct_possible {
            let attempt = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .and_then(|f| probe_direct(&f, block_size).map(|()| f));
            match attempt {
                Ok(f) => Some(f),
                Err(e) => {
                    direct_err = Some(e);
                    None
                }
            }
        } else {
            None
        };
        if opts.direct == Some(true) && direct_file.is_none() {
            let why = match direct_err {
                Some(e) => e.to_string(),
                None => format!("alignment {dio:?} does not fit block size {block_size}"),
            };
            return Err(Error::Invalid(format!(
                "{name}: O_DIRECT requested but not possible: {why}"
            )));
        }
        let direct = direct_file.is_some();
        let file = direct_file.unwrap_or(file);
        let inline_rw = ft.is_file() && memory_backed(&file);
        let (store, mapped_blocks) = match inline_rw
            .then(|| memory_store(&file, &name, num_blocks * u64::from(block_size), block_size))
            .flatten()
        {
            Some((store, blocks)) => (Some(store), blocks),
            None => (None, 0),
        };

        Ok(Arc::new(FileBackend {
            file,
            path: name,
            block_size,
            num_blocks: AtomicU64::new(num_blocks),
            growing: Mutex::new(()),
            direct,
            block_device: ft.is_block_device(),
            inline_rw,
            store,
            mapped_blocks: AtomicU64::new(mapped_blocks),
            punch_ok: AtomicBool::new(true),
            zero_range_ok: AtomicBool::new(true),
            writeback_failed: AtomicBool::new(false),
            gone: AtomicBool::new(false),
        }))
    }

    /// A new open file description of the same file (not a `dup`: writeback errors are
    /// reported per description). Through `/proc/self/fd`, so it is the same inode even
    /// when the path was renamed or deleted meanwhile.
    fn reopen(&self) -> io::Result<File> {
        let mut oo = OpenOptions::new();
        oo.read(true).write(true);
        if self.direct {
            oo.custom_flags(libc::O_DIRECT);
        }
        oo.open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// A Flush failed: remember it (see the module docs).
    fn writeback_error(&self, errno: i32) {
        if !self.writeback_failed.swap(true, Ordering::Relaxed) {
            tracing::error!(
                "{}: a writeback error ({}) on a Flush or FUA write: data written before \
                 it may be lost; every later Flush and FUA write fails until the backend \
                 is reopened (restart)",
                self.path,
                io::Error::from_raw_os_error(errno)
            );
        }
    }

    /// The backing file or device is gone (see the module docs).
    fn set_gone(&self, why: &str) {
        if !self.gone.swap(true, Ordering::Relaxed) {
            tracing::error!(
                "{}: {why}: the namespace's I/O fails from now on (path error)",
                self.path
            );
        }
    }

    /// Whether the backend is gone (its file deleted, its device vanished).
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Relaxed)
    }

    /// Whether the file is open with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Whether reads and writes are copied inline instead of going through io_uring
    /// (a file on tmpfs or ramfs; see [`memory_backed`]).
    pub fn is_inline(&self) -> bool {
        self.inline_rw
    }

    /// Whether the file is served as a store over its pages (a file in memory with no
    /// hole; see [`BackendQueue::ram_store`]).
    pub fn is_mapped(&self) -> bool {
        self.store.is_some()
    }

    /// Whether this is a block device (not a regular file).
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// Stops using fallocate, as if the filesystem supported neither mode: Deallocate and
    /// Write Zeroes then write zeroes. For tests of that fallback.
    #[doc(hidden)]
    pub fn disable_fallocate(&self) {
        self.punch_ok.store(false, Ordering::Relaxed);
        self.zero_range_ok.store(false, Ordering::Relaxed);
    }

    /// Fallback steps for Deallocate / Write Zeroes, in order of preference.
    fn zero_step(&self, dealloc: bool, after: Option<i32>) -> Step {
        let order = if dealloc {
            [PUNCH, ZERO_RANGE]
        } else {
            [ZERO_RANGE, PUNCH]
        };
        let start = match after {
            None => 0,
            Some(m) => order.iter().position(|&o| o == m).map_or(2, |i| i + 1),
        };
        for &mode in &order[start.min(2)..] {
            let ok = if mode == PUNCH {
                &self.punch_ok
            } else {
                &self.zero_range_ok
            };
            if ok.load(Ordering::Relaxed) {
                return Step::Fallocate(mode);
            }
        }
        Step::WriteZeroBuf
    }

    fn mark_unsupported(&self, mode: i32) {
        let ok = if mode == PUNCH {
            &self.punch_ok
        } else {
            &self.zero_range_ok
        };
        ok.store(false, Ordering::Relaxed);
    }
}

impl Backend for FileBackend {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn num_blocks(&self) -> u64 {
        self.num_blocks.load(Ordering::Acquire)
    }

    fn volatile_write_cache(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        self.path.clone()
    }

    fn create_queue(self: Arc<Self>, depth: u32) -> Result<Box<dyn BackendQueue>, Error> {
        Ok(Box::new(FileQueue::new(self, depth)?))
    }

    fn flush_sync(&self) -> Result<(), Error> {
        let r = self.file.sync_data();
        if let Err(e) = &r {
            self.writeback_error(e.raw_os_error().unwrap_or(libc::EIO));
        }
        if self.writeback_failed.load(Ordering::Relaxed) {
            return Err(Error::Io(io::Error::other(format!(
                "{}: an earlier flush failed: data may be lost",
                self.path
            ))));
        }
        r.map_err(Error::Io)
    }

    /// A file served from memory grows only inside its mapping's reserve; a file read
    /// and written through the kernel has no bound of ours.
    fn grow_limit(&self) -> Option<u64> {
        self.store.as_ref().map(|s| s.reserved_bytes() as u64)
    }

    /// Re-reads the file's size (fstat) or the device's (`BLKGETSIZE64`); `Some(bytes)`
    /// first extends a smaller regular file to `bytes` (a device cannot be). The new
    /// capacity is whole blocks of what the store holds. A mapped file's added range is
    /// allocated in full first, as at open (`fallocate`), and must fit the mapping's
    /// reserve ([`RamBackend::reserved_bytes`]).
    fn grow(&self, to: Option<u64>) -> Result<u64, Error> {
        let _one_at_a_time = self.growing.lock().unwrap_or_else(|e| e.into_inner());
        let name = &self.path;
        let bs = u64::from(self.block_size);
        let have_blocks = self.num_blocks();
        let have = have_blocks * bs;
        let io_err = |what: &str, e: io::Error| {
            Error::Invalid(format!(
                "{name}: {what} ({e}); the namespace stays {have} bytes"
            ))
        };
        let holds = |file: &File| -> io::Result<u64> {
            if self.block_device {
                bdev_geometry(file).map(|(size, _)| size)
            } else {
                file.metadata().map(|m| m.len())
            }
        };
        let shrunk = |len: u64| {
            Error::Invalid(format!(
                "{name} now holds {len} bytes, less than the namespace's {have}; a namespace \
                 cannot shrink while it runs (restore the size, or remove the namespace)"
            ))
        };
        let mut len = holds(&self.file).map_err(|e| io_err("cannot read its size", e))?;
        if len < have {
            return Err(shrunk(len));
        }
        let want = match to {
            Some(bytes) if bytes > len && self.block_device => {
                return Err(Error::Invalid(format!(
                    "{name}: block device has {len} bytes, size asks for {bytes}"
                )));
            }
            Some(bytes) => bytes.max(len),
            None => len,
        };
        if want / bs <= have_blocks {
            return Ok(have_blocks);
        }
        if let Some(store) = &self.store {
            // A mapped file: the added range must be allocated (a lent read of a hole
            // would allocate inside the send) and fit the mapping reserved at open.
            let new_size = want / bs * bs;
            let reserve = store.reserved_bytes() as u64;
            if new_size > reserve {
                return Err(Error::NeedsRestart(format!(
                    "{name}: {new_size} bytes is past the {reserve} its mapping reserved when \
                     it was opened; restart to grow past {reserve} bytes"
                )));
            }
            let (off, n) = (have as libc::off_t, (want - have) as libc::off_t);
            // SAFETY: fallocate on a valid fd has no memory-safety preconditions.
            if unsafe { libc::fallocate(self.file.as_raw_fd(), 0, off, n) } != 0 {
                return Err(io_err(
                    &format!("cannot allocate bytes {have}..{want} of the file"),
                    io::Error::last_os_error(),
                ));
            }
            let blocks = self
                .file
                .metadata()
                .map_err(|e| io_err("cannot read its size", e))?
                .blocks();
            // Raised before the namespace grows, so the gone check (which compares the
            // file's allocated blocks with this) does not take the new size for a loss.
            self.mapped_blocks.fetch_max(blocks, Ordering::Release);
            store.grow_to(new_size)?;
            self.num_blocks.store(new_size / bs, Ordering::Release);
            return Ok(new_size / bs);
        }
        if want > len {
            self.file
                .set_len(want)
                .map_err(|e| io_err(&format!("cannot extend the file to {want} bytes"), e))?;
            len = holds(&self.file).map_err(|e| io_err("cannot read its size", e))?;
        }
        let new_blocks = len / bs;
        if new_blocks < have_blocks {
            // Shrunk between the two looks: someone else truncates it.
            return Err(shrunk(len));
        }
        self.num_blocks.store(new_blocks, Ordering::Release);
        Ok(new_blocks)
    }
}

/// What the SQE of a slot does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Read,
    Write {
        dsync: bool,
    },
    Sync,
    /// After a buffered `RWF_DSYNC` write failed with an errno that may mean it stored
    /// nothing (`ENOSPC`...): `fdatasync` on the backend's own open file description,
    /// which no request uses, to learn whether the write's sync met (and so hid from
    /// this queue's description) a writeback error. The request then completes with the
    /// status kept here.
    CheckWriteback(IoStatus),
    Fallocate(i32),
    /// Write Zeroes / Deallocate fallback: plain writes from the queue's zero buffer.
    WriteZeroBuf,
}

/// One request in flight.
#[derive(Debug)]
struct Slot {
    tag: u64,
    op: Op,
    step: Step,
    buf: Option<IoBuf>,
    /// Byte offset and length of the whole request; `done` bytes finished so far.
    off: u64,
    len: u64,
    done: u64,
    retries: u8,
}

/// A per-thread io_uring queue on a [`FileBackend`].
pub struct FileQueue {
    backend: Arc<FileBackend>,
    /// This queue's own open file description (registered as fixed file 0).
    file: File,
    /// Next time a request looks whether the file was deleted.
    next_gone_check: std::time::Instant,
    /// `None` for a mapped file ([`FileBackend::is_mapped`]): its reads, writes and
    /// zeroing go through the store, and its Flush is an inline `fdatasync` (nothing to
    /// wait for on tmpfs), so it needs no ring, and works where io_uring is disabled.
    ring: Option<IoUring>,
    depth: usize,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    /// Slots whose next SQE has not been pushed to the SQ yet.
    pending: VecDeque<u32>,
    /// Completions decided without I/O (bad requests), returned by the next poll.
    ready: VecDeque<Completion>,
    /// SQEs pushed to the SQ and not reaped yet: the kernel may use their buffers.
    in_kernel: usize,
    /// Long zeroing requests of a mapped file, a step per poll.
    zeroing: Zeroing,
    /// Zero source for the Write Zeroes fallback, allocated on first use and kept until
    /// the queue is dropped (after every SQE that points into it has completed).
    zeroes: Option<IoBuf>,
    /// The ring is created with `SINGLE_ISSUER`: keep the queue on its thread.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl std::fmt::Debug for FileQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileQueue")
            .field("backend", &self.backend.path)
            .field("depth", &self.depth)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

fn uring_error(e: io::Error) -> Error {
    let hint = match e.raw_os_error() {
        Some(libc::ENOSYS) => " (kernel built without io_uring, or blocked by seccomp)",
        Some(libc::EPERM) => {
            " (io_uring disabled: see sysctl kernel.io_uring_disabled, or seccomp)"
        }
        Some(libc::ENOMEM) => " (locked-memory limit too low? see ulimit -l)",
        _ => "",
    };
    Error::Uring(io::Error::new(e.kind(), format!("{e}{hint}")))
}

/// As [`status_for_errno`], for an `io::Error`; one without an errno (a short transfer:
/// the file shrank) counts as `EIO`.
pub(crate) fn status_for_error(op: Op, e: &io::Error) -> IoStatus {
    status_for_errno(op, e.raw_os_error().unwrap_or(libc::EIO))
}

/// Maps an errno from a failed step to the request's status.
///
/// Only an errno that says the store itself has vanished (`ENODEV`, `ENXIO`,
/// `ENOMEDIUM`) gives [`IoStatus::Unavailable`], which takes the namespace out; a deleted
/// file is found apart from any errno ([`FileQueue::gone`]). Every other errno fails this
/// request alone: one refused or failed write says nothing about the rest of the store.
pub(crate) fn status_for_errno(op: Op, errno: i32) -> IoStatus {
    let reading = matches!(op, Op::Read);
    match errno {
        libc::EIO | libc::ENODATA | libc::EBADMSG | libc::EILSEQ | libc::EREMOTEIO => {
            if reading {
                IoStatus::ReadError
            } else {
                IoStatus::WriteFault
            }
        }
        // A write that found no room: nothing of it was stored. A Flush that fails this
        // way lost data written earlier (delayed allocation at writeback), which is a
        // write fault, not a full store the host could act on.
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG if !reading && op != Op::Flush => {
            IoStatus::NoSpace
        }
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG if op == Op::Flush => IoStatus::WriteFault,
        libc::EPERM | libc::EROFS | libc::EACCES => IoStatus::Refused,
        libc::EOPNOTSUPP | libc::ENOSYS => IoStatus::Unsupported,
        libc::ENODEV | libc::ENXIO | libc::ENOMEDIUM => IoStatus::Unavailable,
        libc::EAGAIN
        | libc::EINTR
        | libc::ENOMEM
        | libc::EBUSY
        | libc::ETIMEDOUT
        | libc::ENOLINK
        | libc::EBADE
        | libc::ECANCELED => IoStatus::Busy,
        _ => IoStatus::Failed,
    }
}

/// Whether a failed step may hide the loss of data other than its own, and so must fail
/// every later Flush and FUA write (see the module docs).
///
/// - A Flush (`fdatasync`) reports writeback errors of anything written before it: it
///   latches whatever the errno.
/// - A buffered `RWF_DSYNC` write syncs its range after copying it into the page cache,
///   and that sync reports (and consumes) a writeback error of other dirty pages too; it
///   latches unless its errno may say the write itself was refused before anything was
///   stored (no room, no permission, a bad request, a transient shortage). Such an
///   errno is ambiguous (a thin volume or NFS reports `ENOSPC` at writeback too), so
///   the request then checks the backend's own description with an `fdatasync`
///   (`Step::CheckWriteback`), which latches if a writeback error happened. Inline
///   writes (files in memory) sync apart from the write and latch on a failed sync.
/// - An `O_DIRECT` write (file or block device) bypasses the page cache: its error is its
///   own range's, reported to the host with it; there are no other dirty pages whose
///   error it could consume.
/// - Anything else (reads, fallocate, zero writes without sync) never latches.
fn latches_writeback_error(step: Step, errno: i32, direct: bool) -> bool {
    match step {
        Step::Sync => true,
        Step::Write { dsync: true } => {
            !direct
                && !matches!(
                    errno,
                    libc::ENOSPC
                        | libc::EDQUOT
                        | libc::EFBIG
                        | libc::EPERM
                        | libc::EROFS
                        | libc::EACCES
                        | libc::EINVAL
                        | libc::EOPNOTSUPP
                        | libc::EAGAIN
                        | libc::EINTR
                        | libc::ENOMEM
                        | libc::EBUSY
                )
        }
        _ => false,
    }
}

impl FileQueue {
    fn new(backend: Arc<FileBackend>, depth: u32) -> Result<FileQueue, Error> {
        if depth == 0 || depth > 4096 {
            return Err(Error::Invalid(format!(
                "{}: queue depth {depth} not in 1..=4096",
                backend.path
            )));
        }
        let file = backend.reopen().map_err(|source| Error::Open {
            path: backend.path.clone(),
            source,
        })?;
        let ring = if backend.store.is_some() {
            None
        } else {
            let ring = IoUring::builder()
                .setup_coop_taskrun()
                .setup_taskrun_flag()
                .setup_single_issuer()
                .build(depth)
                .or_else(|e| match e.raw_os_error() {
                    // Older kernels reject the flags: plain ring.
                    Some(libc::EINVAL) => IoUring::new(depth),
                    _ => Err(e),
                })
                .map_err(uring_error)?;
            // Fixed file 1, the backend's own description: see `Step::CheckWriteback`.
            ring.submitter()
                .register_files(&[file.as_raw_fd(), backend.file.as_raw_fd()])
                .map_err(uring_error)?;
            Some(ring)
        };
        let depth = depth as usize;
        Ok(FileQueue {
            backend,
            file,
            next_gone_check: std::time::Instant::now(),
            ring,
            depth,
            slots: (0..depth).map(|_| None).collect(),
            free: (0..depth as u32).rev().collect(),
            pending: VecDeque::with_capacity(depth),
            ready: VecDeque::with_capacity(depth),
            in_kernel: 0,
            zeroing: Zeroing::default(),
            zeroes: None,
            _not_send: std::marker::PhantomData,
        })
    }

    /// Checks a request; `Err` carries the status of a request that needs no I/O.
    fn validate(&self, req: &Request) -> Result<(u64, u64), IoStatus> {
        let bs = u64::from(self.backend.block_size);
        if req.op == Op::Flush {
            return Ok((0, 0));
        }
        let end = req
            .lba
            .checked_add(u64::from(req.nblocks))
            .ok_or(IoStatus::OutOfRange)?;
        if end > self.backend.num_blocks() {
            return Err(IoStatus::OutOfRange);
        }
        let (off, len) = (req.lba * bs, u64::from(req.nblocks) * bs);
        let buf_ok = match (req.op, &req.buf) {
            (Op::Read, Some(b)) => b.capacity() as u64 >= len,
            (Op::Write { .. }, Some(b)) => b.len() as u64 >= len,
            (Op::Read | Op::Write { .. }, None) => false,
            _ => true,
        };
        if !buf_ok {
            return Err(IoStatus::Unsupported);
        }
        if len == 0 {
            return Err(IoStatus::Ok);
        }
        Ok((off, len))
    }

    /// Builds the next SQE of slot `idx`.
    fn sqe(&mut self, idx: u32) -> Option<squeue::Entry> {
        let zero_ptr = match self.slots[idx as usize].as_ref()?.step {
            Step::WriteZeroBuf => {
                let z = self.zeroes.get_or_insert_with(|| IoBuf::new(ZERO_BUF));
                Some((z.as_ptr(), z.capacity() as u64))
            }
            _ => None,
        };
        let slot = self.slots[idx as usize].as_mut()?;
        let fd = types::Fixed(0);
        let pos = slot.off + slot.done;
        let rest = slot.len - slot.done;
        let entry = match slot.step {
            Step::Read => {
                let buf = slot.buf.as_mut()?;
                // `done < len <= capacity`, checked in `validate`.
                let ptr = buf.as_mut_ptr().wrapping_add(slot.done as usize);
                opcode::Read::new(fd, ptr, rest.min(MAX_RW) as u32)
                    .offset(pos)
                    .build()
            }
            Step::Write { dsync } => {
                let buf = slot.buf.as_ref()?;
                let ptr = buf.as_ptr().wrapping_add(slot.done as usize);
                let flags = if dsync { libc::RWF_DSYNC } else { 0 };
                opcode::Write::new(fd, ptr, rest.min(MAX_RW) as u32)
                    .offset(pos)
                    .rw_flags(flags)
                    .build()
            }
            Step::Sync => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            Step::CheckWriteback(_) => opcode::Fsync::new(types::Fixed(1))
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            Step::Fallocate(mode) => opcode::Fallocate::new(fd, slot.len)
                .offset(slot.off)
                .mode(mode)
                .build(),
            Step::WriteZeroBuf => {
                let (ptr, cap) = zero_ptr?;
                opcode::Write::new(fd, ptr, rest.min(cap) as u32)
                    .offset(pos)
                    .build()
            }
        };
        Some(entry.user_data(u64::from(idx)))
    }

    /// On a memory-backed file: do slot `idx`'s read or write step now, returning what
    /// its CQE would have said (bytes moved, or `-errno`); on a queue without a ring, its
    /// flush too. `None` for the steps that go through the ring (fallocate, zero writes,
    /// and flush where there is a ring).
    fn inline_rw(&mut self, idx: u32) -> Option<i32> {
        let slot = self.slots[idx as usize].as_mut()?;
        let pos = slot.off + slot.done;
        let (from, to) = (
            slot.done as usize,
            (slot.done + (slot.len - slot.done).min(MAX_RW)) as usize,
        );
        let res = match slot.step {
            Step::Read => {
                let buf = slot.buf.as_mut()?;
                // `len <= capacity` (checked in `validate`); `finish` sets the final length.
                if buf.len() < to {
                    buf.set_len(to);
                }
                self.file.read_at(&mut buf.as_mut_slice()[from..to], pos)
            }
            Step::Write { dsync } => {
                let buf = slot.buf.as_ref()?;
                let backend = &self.backend;
                self.file
                    .write_at(&buf.as_slice()[from..to], pos)
                    .and_then(|n| {
                        if dsync {
                            // The write is in; a failed sync now is a writeback error,
                            // whatever its errno (see `latches_writeback_error`).
                            self.file.sync_data().map(|()| n).inspect_err(|e| {
                                backend.writeback_error(e.raw_os_error().unwrap_or(libc::EIO));
                            })
                        } else {
                            Ok(n)
                        }
                    })
            }
            Step::Sync if self.ring.is_none() => self.file.sync_data().map(|()| 0),
            _ => return None,
        };
        Some(match res {
            Ok(n) => n as i32,
            Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
        })
    }

    /// Moves pending slots into the SQ while it has room.
    fn push_pending(&mut self) {
        while let Some(&idx) = self.pending.front() {
            if self.ring.as_mut().is_some_and(|r| r.submission().is_full()) {
                break;
            }
            self.pending.pop_front();
            if self.backend.inline_rw || self.ring.is_none() {
                if let Some(res) = self.inline_rw(idx) {
                    // The same bookkeeping as a CQE: short transfers go round again,
                    // errors map to statuses, FUA failures are remembered.
                    self.complete_cqe(idx, res);
                    continue;
                }
            }
            let (Some(entry), Some(ring)) = (self.sqe(idx), self.ring.as_mut()) else {
                // A slot whose step has no buffer cannot happen (validated), nor a step
                // other than Flush on a queue without a ring (the store does the rest):
                // fail it safely.
                self.finish(idx, IoStatus::Failed);
                continue;
            };
            // SAFETY: every buffer the entry points to (the slot's IoBuf or the queue's
            // zero buffer) is owned by this queue and stays allocated and untouched until
            // its CQE is reaped: slots are released only in `complete_cqe`, and `Drop`
            // waits for `in_kernel` to reach zero before freeing anything.
            let pushed = unsafe { ring.submission().push(&entry) };
            if pushed.is_ok() {
                self.in_kernel += 1;
            } else {
                self.pending.push_front(idx);
                break;
            }
        }
    }

    /// Releases slot `idx` and queues its completion.
    fn finish(&mut self, idx: u32, status: IoStatus) {
        if let Some(mut slot) = self.slots[idx as usize].take() {
            if status == IoStatus::Ok && slot.op == Op::Read {
                if let Some(b) = slot.buf.as_mut() {
                    b.set_len(slot.len as usize);
                }
            }
            self.ready.push_back(Completion {
                tag: slot.tag,
                status,
                buf: slot.buf,
            });
            self.free.push(idx);
        }
    }

    /// Advances slot `idx` after its SQE completed with `res`.
    fn complete_cqe(&mut self, idx: u32, res: i32) {
        let backend = Arc::clone(&self.backend);
        // Writes done inline sync on their own (`inline_rw`) and latch there.
        let inline = backend.inline_rw || self.ring.is_none();
        let Some(slot) = self.slots.get_mut(idx as usize).and_then(Option::as_mut) else {
            return;
        };
        let outcome = if res < 0 {
            let errno = -res;
            match (slot.step, errno) {
                (_, libc::EAGAIN | libc::EINTR) if slot.retries < MAX_RETRIES => {
                    slot.retries += 1;
                    None
                }
                (Step::Fallocate(mode), libc::EOPNOTSUPP | libc::ENOSYS) => {
                    backend.mark_unsupported(mode);
                    slot.step = backend.zero_step(slot.op == Op::Deallocate, Some(mode));
                    None
                }
                (Step::CheckWriteback(status), _) => {
                    backend.writeback_error(errno);
                    Some(status)
                }
                (step, _) => {
                    let latched = latches_writeback_error(step, errno, backend.direct);
                    if latched {
                        backend.writeback_error(errno);
                    }
                    if matches!(errno, libc::ENODEV | libc::ENXIO | libc::ENOMEDIUM) {
                        backend.set_gone("the device is gone");
                    }
                    let status = status_for_errno(slot.op, errno);
                    if !latched
                        && step == (Step::Write { dsync: true })
                        && !backend.direct
                        && !inline
                    {
                        // Nothing latched: the errno may be the write's own (nothing
                        // stored) or the writeback error its sync consumed. Ask the
                        // backend's own description, which has seen no error yet.
                        slot.step = Step::CheckWriteback(status);
                        slot.retries = 0;
                        None
                    } else {
                        Some(status)
                    }
                }
            }
        } else {
            match slot.step {
                Step::Read | Step::Write { .. } | Step::WriteZeroBuf => {
                    if res == 0 {
                        // End of file (the file shrank under us) or a device that
                        // accepts nothing: resubmitting would spin.
                        Some(if slot.op == Op::Read {
                            IoStatus::ReadError
                        } else {
                            IoStatus::WriteFault
                        })
                    } else {
                        slot.done += res as u64;
                        if slot.done >= slot.len {
                            Some(IoStatus::Ok)
                        } else {
                            None
                        }
                    }
                }
                Step::Sync | Step::Fallocate(_) => Some(IoStatus::Ok),
                Step::CheckWriteback(status) => Some(status),
            }
        };
        // Write Zeroes with FUA: once the range is zero, make it durable (fdatasync)
        // before the completion goes back.
        let outcome = match outcome {
            Some(IoStatus::Ok)
                if slot.op == (Op::WriteZeroes { fua: true }) && slot.step != Step::Sync =>
            {
                slot.step = Step::Sync;
                slot.retries = 0;
                None
            }
            o => o,
        };
        match outcome {
            Some(status) => self.finish(idx, status),
            None => self.pending.push_back(idx),
        }
    }

    /// Enters the kernel if there is anything to submit or task work to run, then reaps
    /// every available CQE.
    fn drive(&mut self) {
        self.push_pending();
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        let need_enter = {
            let sq = ring.submission();
            !sq.is_empty() || sq.taskrun() || sq.cq_overflow()
        };
        if need_enter {
            // EAGAIN/EBUSY/EINTR/ENOMEM: nothing was submitted; the SQEs stay in the SQ
            // and go with the next poll.
            let _ = ring.submit();
        }
        let mut batch = [(0u64, 0i32); 64];
        loop {
            let Some(ring) = self.ring.as_mut() else {
                return;
            };
            let n = {
                let mut cq = ring.completion();
                let mut n = 0;
                for (slot, cqe) in batch.iter_mut().zip(&mut cq) {
                    *slot = (cqe.user_data(), cqe.result());
                    n += 1;
                }
                n
            };
            if n == 0 {
                break;
            }
            self.in_kernel -= n;
            for &(user_data, res) in &batch[..n] {
                self.complete_cqe(user_data as u32, res);
            }
        }
    }
}

impl FileQueue {
    /// Whether the backend is gone, looking at the file's link count at every Flush and
    /// at most once a second otherwise (regular files; a block device node says nothing:
    /// a vanished device answers `ENODEV`/`ENXIO`).
    fn gone(&mut self, op: Op) -> bool {
        if self.backend.is_gone() {
            return true;
        }
        if self.backend.block_device {
            return false;
        }
        let now = std::time::Instant::now();
        if op != Op::Flush && now < self.next_gone_check {
            return false;
        }
        self.look_for_gone(now)
    }

    /// The check behind [`FileQueue::gone`], now: a deleted file, and for a mapped file
    /// one that shrank or lost pages.
    fn look_for_gone(&mut self, now: std::time::Instant) -> bool {
        self.next_gone_check = now + std::time::Duration::from_secs(1);
        // Both read before the file is looked at: `grow` raises them only after the file
        // holds (and has allocated) the added range, so values read first never ask for
        // more than the file shows afterwards.
        let size = self.backend.num_blocks() * u64::from(self.backend.block_size);
        let mapped_blocks = self.backend.mapped_blocks.load(Ordering::Acquire);
        let mapped = self.backend.store.is_some();
        match self.file.metadata() {
            Ok(m) if m.nlink() == 0 => {
                self.backend.set_gone("the backing file was deleted");
                true
            }
            // Lent reads of a mapped file past its end would fail inside the send, and
            // take their connection with them; reads of pages freed under it would have
            // the kernel allocate them inside the send. The namespace goes instead. (A
            // write can grow a truncated file back, but not bring back its pages.)
            Ok(m) if mapped && (m.len() < size || m.blocks() < mapped_blocks) => {
                self.backend
                    .set_gone("the backing file was truncated or had pages freed under it");
                true
            }
            _ => false,
        }
    }

    /// A request other than Flush on a file served as a store: done at once through the
    /// store, or for zeroing, by the polls ([`ZERO_STEP`](crate::ram::ZERO_STEP) bytes
    /// each).
    fn store_request(&mut self, mut req: Request, off: u64, len: u64) {
        if matches!(req.op, Op::WriteZeroes { .. } | Op::Deallocate) {
            // `validate` put the range inside the namespace, which fits in memory.
            self.zeroing.push(req, off as usize, len as usize);
            return;
        }
        let status = match self.backend.store.as_ref() {
            Some(store) => store.execute(&mut req),
            None => IoStatus::Unavailable,
        };
        self.finish_store(req, status);
    }

    /// Steps the zeroing of a mapped file (see [`ZERO_STEP`](crate::ram::ZERO_STEP)).
    fn step_zeroing(&mut self) {
        let Some(store) = self.backend.store.as_ref() else {
            return;
        };
        let mut finished = Vec::new();
        self.zeroing
            .step(store, |req, status| finished.push((req, status)));
        for (req, status) in finished {
            self.finish_store(req, status);
        }
    }

    /// Completes a request done through the store (FUA: `fdatasync` first, as the ring
    /// path does).
    fn finish_store(&mut self, req: Request, mut status: IoStatus) {
        let fua = matches!(
            req.op,
            Op::Write { fua: true } | Op::WriteZeroes { fua: true }
        );
        if status == IoStatus::Ok && fua {
            if let Err(e) = self.file.sync_data() {
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                self.backend.writeback_error(errno);
                status = status_for_errno(req.op, errno);
            }
        }
        self.ready.push_back(Completion {
            tag: req.tag,
            status,
            buf: req.buf,
        });
    }

    /// A Flush or FUA request after a writeback error: it fails without I/O.
    fn writeback_failed(&self, op: Op) -> bool {
        matches!(
            op,
            Op::Flush | Op::Write { fua: true } | Op::WriteZeroes { fua: true }
        ) && self.backend.writeback_failed.load(Ordering::Relaxed)
    }
}

impl BackendQueue for FileQueue {
    fn submit(&mut self, req: Request) -> Result<(), SubmitError> {
        if self.in_flight() >= self.depth {
            return Err(SubmitError::Full(req));
        }
        let early = if self.gone(req.op) {
            Some(IoStatus::Unavailable)
        } else if self.writeback_failed(req.op) {
            Some(IoStatus::WriteFault)
        } else {
            None
        };
        if let Some(status) = early {
            self.ready.push_back(Completion {
                tag: req.tag,
                status,
                buf: req.buf,
            });
            return Ok(());
        }
        let (off, len) = match self.validate(&req) {
            Ok(r) => r,
            Err(status) => {
                self.ready.push_back(Completion {
                    tag: req.tag,
                    status,
                    buf: req.buf,
                });
                return Ok(());
            }
        };
        if self.backend.store.is_some() && req.op != Op::Flush {
            self.store_request(req, off, len);
            return Ok(());
        }
        let Some(idx) = self.free.pop() else {
            return Err(SubmitError::Full(req));
        };
        let step = match req.op {
            Op::Read => Step::Read,
            Op::Write { fua } => Step::Write { dsync: fua },
            Op::Flush => Step::Sync,
            Op::WriteZeroes { .. } => self.backend.zero_step(false, None),
            Op::Deallocate => self.backend.zero_step(true, None),
        };
        self.slots[idx as usize] = Some(Slot {
            tag: req.tag,
            op: req.op,
            step,
            buf: req.buf,
            off,
            len,
            done: 0,
            retries: 0,
        });
        self.pending.push_back(idx);
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        if self.zeroing.len() > 0 {
            self.step_zeroing();
        }
        if !self.pending.is_empty() || self.in_kernel > 0 {
            self.drive();
            // Resubmit short transfers and fallbacks at once rather than a poll later.
            if !self.pending.is_empty() {
                self.drive();
            }
        }
        let n = self.ready.len();
        out.extend(self.ready.drain(..));
        n
    }

    fn in_flight(&self) -> usize {
        (self.depth - self.free.len()) + self.ready.len() + self.zeroing.len()
    }

    fn ram_store(&self) -> Option<Arc<RamBackend>> {
        self.backend.store.clone()
    }

    fn check_gone(&mut self) -> bool {
        // The caller paces these calls itself.
        self.backend.is_gone() || self.look_for_gone(std::time::Instant::now())
    }
}

impl Drop for FileQueue {
    fn drop(&mut self) {
        // The kernel may still read or write buffers of SQEs it has (or will take from
        // the SQ): wait for every one of them before the buffers are freed.
        self.pending.clear();
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        while self.in_kernel > 0 {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) => {}
                Err(_) => {
                    // Cannot wait any more: leak the buffers rather than free memory the
                    // kernel may still write to.
                    for slot in self.slots.drain(..) {
                        std::mem::forget(slot);
                    }
                    std::mem::forget(self.zeroes.take());
                    return;
                }
            }
            let n = ring.completion().count();
            self.in_kernel = self.in_kernel.saturating_sub(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        let w = Op::Write { fua: false };
        assert_eq!(status_for_errno(Op::Read, libc::EIO), IoStatus::ReadError);
        assert_eq!(status_for_errno(w, libc::EIO), IoStatus::WriteFault);
        assert_eq!(status_for_errno(Op::Flush, libc::EIO), IoStatus::WriteFault);
        assert_eq!(
            status_for_errno(Op::Deallocate, libc::EOPNOTSUPP),
            IoStatus::Unsupported
        );
    }

    /// Only a vanished store takes the namespace out; every other errno fails the one
    /// request (audit F1).
    #[test]
    fn only_a_vanished_store_is_unavailable() {
        let w = Op::Write { fua: true };
        for errno in [libc::ENODEV, libc::ENXIO, libc::ENOMEDIUM] {
            assert_eq!(status_for_errno(w, errno), IoStatus::Unavailable);
            assert_eq!(status_for_errno(Op::Read, errno), IoStatus::Unavailable);
        }
        for errno in [libc::EPERM, libc::EROFS, libc::EACCES] {
            assert_eq!(
                status_for_errno(w, errno),
                IoStatus::Refused,
                "errno {errno}"
            );
        }
        for errno in [
            libc::EAGAIN,
            libc::EINTR,
            libc::ENOMEM,
            libc::EBUSY,
            libc::ETIMEDOUT,
            libc::ENOLINK,
            libc::ECANCELED,
        ] {
            assert_eq!(status_for_errno(w, errno), IoStatus::Busy, "errno {errno}");
            assert_eq!(status_for_errno(Op::Read, errno), IoStatus::Busy);
        }
        for errno in [libc::EINVAL, libc::EBADF, libc::ESTALE, libc::E2BIG] {
            assert_eq!(
                status_for_errno(w, errno),
                IoStatus::Failed,
                "errno {errno}"
            );
            assert_eq!(status_for_errno(Op::Read, errno), IoStatus::Failed);
        }
        assert_eq!(status_for_errno(Op::Read, libc::ENOSPC), IoStatus::Failed);
    }

    /// A write that found no room is Capacity Exceeded; a Flush that did is a lost
    /// writeback (audit F8).
    #[test]
    fn no_room_on_a_write_is_capacity_exceeded() {
        for errno in [libc::ENOSPC, libc::EDQUOT, libc::EFBIG] {
            for op in [
                Op::Write { fua: false },
                Op::Write { fua: true },
                Op::WriteZeroes { fua: false },
                Op::Deallocate,
            ] {
                assert_eq!(status_for_errno(op, errno), IoStatus::NoSpace, "{op:?}");
            }
            assert_eq!(status_for_errno(Op::Flush, errno), IoStatus::WriteFault);
        }
    }

    /// Which failures latch the writeback error (audit F3).
    #[test]
    fn only_errors_that_may_hide_lost_data_latch() {
        let dsync = Step::Write { dsync: true };
        // A failed fdatasync always latches, buffered or direct.
        for direct in [false, true] {
            for errno in [libc::EIO, libc::ENOSPC, libc::EPERM] {
                assert!(latches_writeback_error(Step::Sync, errno, direct));
            }
        }
        // EIO from a buffered RWF_DSYNC write may be another page's writeback error.
        assert!(latches_writeback_error(dsync, libc::EIO, false));
        // Nothing was written, or the error is the write's own.
        for errno in [
            libc::ENOSPC,
            libc::EDQUOT,
            libc::EFBIG,
            libc::EPERM,
            libc::EROFS,
        ] {
            assert!(!latches_writeback_error(dsync, errno, false), "{errno}");
        }
        for errno in [libc::EIO, libc::ENOSPC] {
            assert!(
                !latches_writeback_error(dsync, errno, true),
                "O_DIRECT {errno}"
            );
        }
        for step in [Step::Read, Step::Write { dsync: false }, Step::WriteZeroBuf] {
            assert!(!latches_writeback_error(step, libc::EIO, false), "{step:?}");
        }
    }

    #[test]
    fn fallback_order() {
        let dir = tempfile::tempdir().unwrap();
        let opts = FileOptions {
            create_size: Some(1 << 20),
            ..Default::default()
        };
        let be = FileBackend::open(dir.path().join("f"), opts).unwrap();
        assert_eq!(be.zero_step(true, None), Step::Fallocate(PUNCH));
        assert_eq!(be.zero_step(false, None), Step::Fallocate(ZERO_RANGE));
        assert_eq!(be.zero_step(true, Some(PUNCH)), Step::Fallocate(ZERO_RANGE));
        assert_eq!(
            be.zero_step(false, Some(ZERO_RANGE)),
            Step::Fallocate(PUNCH)
        );
        assert_eq!(be.zero_step(false, Some(PUNCH)), Step::WriteZeroBuf);
        be.mark_unsupported(ZERO_RANGE);
        assert_eq!(be.zero_step(false, None), Step::Fallocate(PUNCH));
        assert_eq!(be.zero_step(true, Some(PUNCH)), Step::WriteZeroBuf);
    }
}
