//! RAM backend: the benchmark and test store.
//!
//! Storage is one anonymous private mapping with `MAP_NORESERVE`, so a namespace commits
//! memory only where it is written; untouched pages read as zeroes.
//!
//! Growing ([`Backend::grow`]): the mapping reserves address space for more than the
//! namespace (`grow_reserve`: 8 times it, at most 1 TiB, and all stores together at
//! most 16 TiB beyond their sizes), inaccessible (`PROT_NONE`, which
//! strict overcommit does not charge) past the part in use. Growing makes the added pages
//! readable and writable and then publishes the new size; nothing moves, so every address
//! handed out stays valid. Past the reserve, a namespace grows only by a restart. A mapped
//! file ([`RamBackend::map_file`]) reserves the same way, its mapping reaching past the end
//! of the file, and the file backend allocates the file's new range before it grows the
//! store. Deallocate and Write
//! Zeroes hand whole pages back to the kernel (`MADV_DONTNEED`) when the range is large,
//! and zero the rest in place.
//!
//! The mapping asks for transparent huge pages (`MADV_HUGEPAGE`; a no-op where THP is
//! off): random 4 KiB reads over a large written namespace otherwise miss the TLB on
//! nearly every request, and inside a VM a miss is a two-dimensional page walk. The cost:
//! memory is committed in 2 MiB steps on first write, and freeing part of a huge page
//! splits it.
//!
//! Writes into a namespace much larger than the CPU's caches use non-temporal stores:
//! the destination lines are then not first read from memory only to be overwritten whole.
//!
//! Concurrency: the space is cut into stripes of [`STRIPE_BYTES`]; every byte belongs to
//! exactly one stripe, and every access to a stripe's bytes holds that stripe's lock
//! (shared for reads, exclusive for writes and deallocation). Stripes map onto a fixed
//! table of cache-line-padded `RwLock`s (stripe `i` uses lock `i % LOCKS`), so the lock
//! memory does not grow with the namespace. A request is copied stripe by stripe,
//! holding one lock at a time (only [`RamBackend::lend`] holds several: read locks in
//! ascending order, see "Lending" below), so there is no lock ordering to get wrong. Two
//! accesses to the same byte are therefore never concurrent unless both are reads: no
//! data race.
//! Stripes are block-aligned, so each logical block is written atomically; a request
//! spanning stripes is not atomic as a whole (NVMe's AWUN of one block allows that).
//!
//! Completions are immediate: `submit` does the copy and queues the completion, and the
//! next `poll` returns it; Deallocate and Write Zeroes are done by `poll`, at most
//! [`ZERO_STEP`] bytes per call. No volatile write cache.
//!
//! Lending: a transport that copies anyway (the kernel's `sendmsg` copies into socket
//! buffers before it returns) can send a read's bytes straight from the mapping instead of
//! from a copy of them: [`RamBackend::lend`] read-locks every stripe of a [`LendSet`] for
//! the length of a closure and hands out the bytes inside it ([`Lent::bytes`]). The locks
//! are taken in ascending lock order, each at most once, and a writer holds one lock at a
//! time and waits for nothing else while it does, so lenders and writers cannot deadlock.
//! The closure must not write to this namespace (its own thread would wait for itself).
//!
//! File-backed stores ([`RamBackend::map_file`]): a fully allocated file on a memory file
//! system (tmpfs, ramfs) is already memory, the page cache's. The file backend lends its
//! reads the same way, through a read-only shared mapping of the file, under the same
//! stripe locks. The daemon itself never loads or stores through that mapping: its copies
//! go through the file (`pread`, `pwrite`), so a file truncated behind its back gives an
//! error (the kernel's copy from the mapping fails with `EFAULT`), never `SIGBUS`. Zeroing
//! writes zeroes instead of punching holes: a lent read of a hole would make the kernel
//! allocate a tmpfs page inside the send, where a full tmpfs can only fail it.

// `unsafe` allowed here: the anonymous mapping (mmap, madvise) and the copies in and out of
// it under the stripe locks.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::{Backend, BackendQueue, Completion, Error, IoStatus, Op, Request, SubmitError};

/// Bytes covered by one stripe lock.
pub const STRIPE_BYTES: usize = 64 << 10;
/// Most stripe locks one [`LendSet`] takes (the lock guards live on the stack, one
/// frame each, while the closure runs).
pub const LEND_MAX_LOCKS: usize = 64;
/// Longest range that always fits an empty [`LendSet`], wherever it starts.
pub const LEND_MAX_BYTES: usize = (LEND_MAX_LOCKS - 1) * STRIPE_BYTES;
/// Number of stripe locks (a power of two).
const LOCKS: usize = 1024;
/// Below this many bytes, Deallocate/Write Zeroes zero memory in place rather than
/// `madvise` (which costs a syscall and a TLB shootdown across the process's threads).
const MADVISE_MIN: usize = 64 << 10;
/// From this namespace size on, writes go to memory with non-temporal stores (see
/// [`copy_streaming`]): the namespace is far larger than any last-level cache, so a block
/// just written is rarely read before it leaves the cache anyway.
const STREAM_MIN_SIZE: usize = 256 << 20;
/// A store reserves address space for this many times its size at creation, so that it
/// can grow in place ([`Backend::grow`]) with every address it handed out staying valid.
const GROW_RESERVE_FACTOR: usize = 8;
/// ... but never more than this much (1 TiB): a large namespace does not need eight times
/// itself to grow by a useful amount, and a 47-bit address space holds 128 of these.
const GROW_RESERVE_MAX: u64 = 1 << 40;

/// All stores together reserve at most this much address space beyond what they use
/// (16 TiB, an eighth of x86-64's 128 TiB for user space): with many large namespaces the
/// last ones reserve less, or nothing, rather than leave the process too little address
/// space for its thread stacks and allocations.
const GROW_RESERVE_TOTAL: usize = 1 << 44;
/// Address space reserved beyond their size by the stores alive now.
static RESERVED_BEYOND: AtomicUsize = AtomicUsize::new(0);

/// The address space a store of `map_len` bytes (page-rounded) would like to reserve:
/// `map_len` times [`GROW_RESERVE_FACTOR`], capped at [`GROW_RESERVE_MAX`], never less
/// than `map_len` itself, rounded up to a page. Reserving costs no memory: an anonymous
/// store's reserve is `PROT_NONE` until used (so strict overcommit does not charge it),
/// and a file's mapping past its end is never touched until the file has grown there.
fn grow_reserve(map_len: usize, page: usize) -> usize {
    let cap = usize::try_from(GROW_RESERVE_MAX).unwrap_or(usize::MAX);
    map_len
        .saturating_mul(GROW_RESERVE_FACTOR)
        .min(cap)
        .max(map_len)
        .checked_next_multiple_of(page)
        .unwrap_or(map_len)
}

/// Maps a store of `map_len` bytes with `map(len)` at the reserve [`grow_reserve`] asks
/// for, as far as [`GROW_RESERVE_TOTAL`] has room left (page-rounded), else at `map_len`
/// (also when the larger mapping fails: an address-space limit). Returns what `map`
/// returned, the length mapped and the part of it beyond `map_len` taken from the total
/// (given back by [`give_back_reserve`] when the store goes).
fn map_reserved(
    map_len: usize,
    page: usize,
    map: impl Fn(usize) -> *mut libc::c_void,
) -> (*mut libc::c_void, usize, usize) {
    map_reserved_in(&RESERVED_BEYOND, GROW_RESERVE_TOTAL, map_len, page, map)
}

/// [`map_reserved`] against the total `used` of at most `limit`.
fn map_reserved_in(
    used: &AtomicUsize,
    limit: usize,
    map_len: usize,
    page: usize,
    map: impl Fn(usize) -> *mut libc::c_void,
) -> (*mut libc::c_void, usize, usize) {
    let wanted = grow_reserve(map_len, page) - map_len;
    let mut taken = 0;
    let _ = used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
        taken = wanted.min(limit.saturating_sub(now)) / page * page;
        Some(now + taken)
    });
    if taken > 0 {
        let raw = map(map_len + taken);
        if raw != libc::MAP_FAILED {
            return (raw, map_len + taken, taken);
        }
        used.fetch_sub(taken, Ordering::AcqRel);
    }
    (map(map_len), map_len, 0)
}

fn give_back_reserve(taken: usize) {
    RESERVED_BEYOND.fetch_sub(taken, Ordering::AcqRel);
}

#[repr(align(64))]
#[derive(Debug, Default)]
struct StripeLock(RwLock<()>);

/// Where a store's bytes live, and so how the daemon copies them.
enum Backing {
    /// Our own anonymous mapping: copies are loads and stores.
    Anon,
    /// A read-only shared mapping of this file: copies go through the file.
    File(File),
}

/// Zeroes for a file-backed store's zeroing writes (one stripe at most per write).
static ZEROES: [u8; STRIPE_BYTES] = [0; STRIPE_BYTES];

/// A RAM-backed block store, shared by all IO threads.
pub struct RamBackend {
    base: NonNull<u8>,
    /// Length of the whole mapping, reserve included ([`grow_reserve`]): the most the
    /// store can grow to without a restart. Only `size` bytes of it (rounded up to a page)
    /// are in use: readable and writable for an anonymous store, inside the file for a
    /// mapped file.
    reserve: usize,
    /// The namespace's size in bytes. It only ever grows (`grow_to`), so a range checked
    /// against it once stays inside it; published with `Release` after the added part is
    /// usable, read with `Acquire`.
    size: AtomicUsize,
    /// The part of `reserve` beyond the size at creation, taken from
    /// [`GROW_RESERVE_TOTAL`] and given back by `Drop`.
    beyond: usize,
    /// Held by `grow_to`: one resize at a time.
    growing: Mutex<()>,
    block_size: u32,
    page: usize,
    locks: Box<[StripeLock]>,
    /// Writes use non-temporal stores ([`STREAM_MIN_SIZE`]).
    stream: bool,
    /// The kernel took the huge-page advice for the mapping.
    huge: bool,
    backing: Backing,
}

// SAFETY: the mapping is owned by `RamBackend` and freed only in `Drop`. Every read or
// write of its bytes through `&RamBackend` holds the stripe lock covering those bytes
// (see the module docs), so sharing `&RamBackend` between threads cannot race. (A mapped
// file's other writers are outside this process: `map_file`'s contract.)
unsafe impl Sync for RamBackend {}
// SAFETY: the raw pointer refers to a process-wide mapping, not to thread-local state;
// moving the owner to another thread is fine.
unsafe impl Send for RamBackend {}

impl std::fmt::Debug for RamBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RamBackend")
            .field("size", &self.size())
            .field("block_size", &self.block_size)
            .finish()
    }
}

impl RamBackend {
    /// A zero-filled namespace of `size_bytes` (a non-zero multiple of `block_size`),
    /// with `block_size` a power of two from 512 to 64 KiB.
    pub fn new(size_bytes: u64, block_size: u32) -> Result<Arc<RamBackend>, Error> {
        let (size, page, map_len) = geometry(size_bytes, block_size)?;
        // The whole reserve is mapped inaccessible, which strict overcommit does not
        // charge; only the part in use is made readable and writable (and charged).
        let map_anon = |len: usize| {
            // SAFETY: an anonymous private mapping at a kernel-chosen address touches no
            // existing memory; the result is checked for MAP_FAILED by `adopt`.
            unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            }
        };
        let (raw, reserve, beyond) = map_reserved(map_len, page, map_anon);
        let mut ram = Self::adopt(
            raw,
            (size, page, reserve, beyond),
            block_size,
            Backing::Anon,
        )?;
        // SAFETY: `raw..raw+map_len` lies in the reservation we just mapped and nothing
        // refers to it yet; mprotect changes only its access rights.
        if unsafe { libc::mprotect(raw, map_len, libc::PROT_READ | libc::PROT_WRITE) } != 0 {
            // `ram` unmaps the reservation when dropped here.
            return Err(Error::Io(std::io::Error::last_os_error()));
        }
        // SAFETY: advice on the used part of our fresh mapping; it changes no contents.
        // It fails where THP is not built in, and the mapping then keeps small pages.
        ram.huge = unsafe { libc::madvise(raw, map_len, libc::MADV_HUGEPAGE) } == 0;
        // Decided once, from the size at creation: a namespace that grows past
        // `STREAM_MIN_SIZE` later keeps plain stores, which are only slower there.
        ram.stream = size >= STREAM_MIN_SIZE;
        Ok(Arc::new(ram))
    }

    /// The store over `raw`, what `mmap` returned for a mapping of `reserve` bytes
    /// (`MAP_FAILED` is turned into the error here), with the size and page from
    /// [`geometry`]; non-temporal writes and huge pages off. From here on, `Drop` unmaps
    /// it.
    fn adopt(
        raw: *mut libc::c_void,
        (size, page, reserve, beyond): (usize, usize, usize, usize),
        block_size: u32,
        backing: Backing,
    ) -> Result<RamBackend, Error> {
        if raw == libc::MAP_FAILED {
            give_back_reserve(beyond);
            return Err(Error::Io(std::io::Error::last_os_error()));
        }
        let Some(base) = NonNull::new(raw.cast::<u8>()) else {
            give_back_reserve(beyond);
            return Err(Error::Invalid("ram: mmap returned null".into()));
        };
        Ok(RamBackend {
            base,
            reserve,
            beyond,
            size: AtomicUsize::new(size),
            growing: Mutex::new(()),
            block_size,
            page,
            locks: (0..LOCKS).map(|_| StripeLock::default()).collect(),
            stream: false,
            huge: false,
            backing,
        })
    }

    /// A store over the first `size_bytes` of `file` (a non-zero multiple of
    /// `block_size`, and no more than the file holds), for a file on a memory file
    /// system that is allocated in full (see the module docs: holes would be allocated
    /// by lent reads). The store keeps `file` for its own copies.
    ///
    /// # Safety
    ///
    /// As for any shared mapping of a file: while the store lives, nobody but the store
    /// may write the file's first `size_bytes` or truncate it below them, or the slices
    /// [`Lent::bytes`] hands out change under their borrow, or fault (`SIGBUS`) when read
    /// in user space. The caller answers for what it can: the store's own copies never read
    /// the mapping (they use the file), and a caller that only ever hands lent bytes to
    /// the kernel (`writev`) turns a truncation into `EFAULT` from that call instead.
    pub unsafe fn map_file(
        file: File,
        size_bytes: u64,
        block_size: u32,
    ) -> Result<Arc<RamBackend>, Error> {
        let (size, page, map_len) = geometry(size_bytes, block_size)?;
        let file_len = file.metadata().map_err(Error::Io)?.len();
        if file_len < size_bytes {
            return Err(Error::Invalid(format!(
                "ram: the file holds {file_len} bytes, less than the {size_bytes} to map"
            )));
        }
        // The mapping reaches past the end of the file, for the file to grow into
        // (`grow_to`): legal for a shared mapping as long as nothing touches the pages past
        // the end, and nothing does: only the kernel reads through the mapping, and only
        // bytes lent below the store's size, which never passes what the file holds.
        let map_shared = |len: usize| {
            // SAFETY: a new shared read-only mapping of an open file at a kernel-chosen
            // address touches no existing memory; the result is checked by `adopt`. Only
            // the kernel reads through it (see `Backing::File`).
            unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    std::os::fd::AsRawFd::as_raw_fd(&file),
                    0,
                )
            }
        };
        let (raw, reserve, beyond) = map_reserved(map_len, page, map_shared);
        Self::adopt(
            raw,
            (size, page, reserve, beyond),
            block_size,
            Backing::File(file),
        )
        .map(Arc::new)
    }

    /// The namespace's size in bytes now.
    fn size(&self) -> usize {
        self.size.load(Ordering::Acquire)
    }

    /// The most bytes the namespace can grow to while it runs: the address space it
    /// reserved when it was created.
    pub fn reserved_bytes(&self) -> usize {
        self.reserve
    }

    /// Grows the namespace to `new_size` bytes (a multiple of the block size, within the
    /// reserve) and then publishes the new size, so no range check passes bytes that are
    /// not ready yet. An anonymous store makes the added pages readable and writable; a
    /// mapped file must hold them already, allocated in full (the file backend's `grow`
    /// sees to that first). The same size: nothing to do. Smaller, not block-aligned, or
    /// past the reserve: an error, and the size stays.
    pub(crate) fn grow_to(&self, new_size: u64) -> Result<(), Error> {
        let _one_at_a_time = self.growing.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.size();
        let bs = u64::from(self.block_size);
        if !new_size.is_multiple_of(bs) {
            return Err(Error::Invalid(format!(
                "ram: size {new_size} is not a multiple of the block size {bs}"
            )));
        }
        if new_size < old as u64 {
            return Err(Error::Invalid(format!(
                "ram: the namespace holds {old} bytes, more than the {new_size} asked for; \
                 a namespace cannot shrink while it runs"
            )));
        }
        if new_size > self.reserve as u64 {
            return Err(Error::NeedsRestart(format!(
                "ram: {new_size} bytes is past the {} reserved when the namespace was \
                 created; restart to grow past {} bytes",
                self.reserve, self.reserve
            )));
        }
        // Fits: `new_size <= reserve`, a usize.
        let new = new_size as usize;
        if new == old {
            return Ok(());
        }
        if let Backing::Anon = self.backing {
            // Pages from the one after the last in use up to the new end (the reserve is
            // page-rounded, so `to <= reserve`).
            let from = old.next_multiple_of(self.page);
            let to = new.next_multiple_of(self.page);
            if to > from {
                // SAFETY: `from..to` lies inside our reservation (`to <= reserve`) and
                // past every page in use (`from` is the old size rounded up), so nothing
                // refers to it; mprotect changes only its access rights.
                let p = unsafe { self.base.as_ptr().add(from) }.cast::<libc::c_void>();
                // SAFETY: as above.
                if unsafe { libc::mprotect(p, to - from, libc::PROT_READ | libc::PROT_WRITE) } != 0
                {
                    return Err(Error::Invalid(format!(
                        "ram: cannot make {} more bytes of memory usable ({}); the size \
                         stays {old}",
                        to - from,
                        std::io::Error::last_os_error()
                    )));
                }
                if self.huge {
                    // SAFETY: advice on pages of our mapping nobody uses yet; it changes
                    // no contents.
                    unsafe { libc::madvise(p, to - from, libc::MADV_HUGEPAGE) };
                }
            }
        }
        self.size.store(new, Ordering::Release);
        Ok(())
    }

    /// Whether the store maps a file ([`RamBackend::map_file`]).
    pub fn is_file(&self) -> bool {
        matches!(self.backing, Backing::File(_))
    }

    /// Whether the kernel took the advice to back the namespace with transparent huge
    /// pages (it then uses them where it has them free).
    pub fn huge_pages(&self) -> bool {
        self.huge
    }

    /// Byte offset and length of blocks `lba..lba+nblocks`, or `None` when they leave the
    /// namespace: the range to give [`LendSet::add`] and [`Lent::bytes`].
    pub fn byte_range(&self, lba: u64, nblocks: u32) -> Option<(usize, usize)> {
        self.range(lba, nblocks)
    }

    /// Writes `src` to blocks `lba..lba+nblocks` at once, as a Write request would (for a
    /// transport that has the host's data in memory already). False, and nothing
    /// written, when the blocks leave the namespace or `src` is not their length; false
    /// also when a file-backed store's write failed (part may be written): the caller
    /// then sends the write down its queue, which reports the error.
    pub fn write_blocks(&self, lba: u64, nblocks: u32, src: &[u8]) -> bool {
        match self.range(lba, nblocks) {
            Some((off, len)) if len == src.len() => self.write(off, src).is_ok(),
            _ => false,
        }
    }

    /// Runs `f` with every stripe of `set` read-locked, so that [`Lent::bytes`] can hand
    /// out the bytes of those stripes without copying them. Writers of those stripes (on
    /// other threads) wait until `f` returns; `f` must not write to this namespace.
    pub fn lend<R>(&self, set: &LendSet, f: impl FnOnce(&Lent<'_>) -> R) -> R {
        let lent = Lent {
            backend: self,
            set: set.bits,
        };
        let mut f = Some(f);
        let mut out = None;
        self.hold(&lent, 0, &mut f, &mut out);
        // `hold` runs `f` exactly once, at the bottom of its recursion.
        out.unwrap_or_else(|| unreachable!("lend: the closure did not run"))
    }

    /// Takes the lowest lock of `lent.set` from lock index `from` on, then recurses; with
    /// none left, runs the closure. Ascending order, each lock once.
    fn hold<R, F: FnOnce(&Lent<'_>) -> R>(
        &self,
        lent: &Lent<'_>,
        from: usize,
        f: &mut Option<F>,
        out: &mut Option<R>,
    ) {
        match next_bit(&lent.set, from) {
            Some(i) => {
                let _g = self.locks[i].0.read().unwrap_or_else(|e| e.into_inner());
                self.hold(lent, i + 1, f, out);
            }
            None => {
                if let Some(f) = f.take() {
                    *out = Some(f(lent));
                }
            }
        }
    }

    /// Bytes resident in memory, for tests and metrics (`mincore`).
    pub fn resident_bytes(&self) -> usize {
        // The part in use only: the reserve may be a thousand times larger.
        let map_len = self.size().next_multiple_of(self.page);
        let pages = map_len / self.page;
        let mut vec = vec![0u8; pages];
        // SAFETY: `base..base+map_len` is the page-aligned part in use of our mapping and
        // `vec` has one byte per page of it, as mincore requires.
        let rc = unsafe { libc::mincore(self.base.as_ptr().cast(), map_len, vec.as_mut_ptr()) };
        if rc != 0 {
            return 0;
        }
        vec.iter().filter(|&&v| v & 1 != 0).count() * self.page
    }

    fn lock(&self, stripe: usize) -> &RwLock<()> {
        &self.locks[stripe % LOCKS].0
    }

    /// Calls `f(offset, len)` for each stripe-bounded piece of `off..off+len`, in order,
    /// up to the first error.
    fn for_each_stripe(
        off: usize,
        len: usize,
        mut f: impl FnMut(usize, usize) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let end = off + len;
        let mut pos = off;
        while pos < end {
            let stripe_end = (pos / STRIPE_BYTES + 1) * STRIPE_BYTES;
            let n = stripe_end.min(end) - pos;
            f(pos, n)?;
            pos += n;
        }
        Ok(())
    }

    fn read(&self, off: usize, dst: &mut [u8]) -> std::io::Result<()> {
        Self::for_each_stripe(off, dst.len(), |pos, n| {
            let _g = self
                .lock(pos / STRIPE_BYTES)
                .read()
                .unwrap_or_else(|e| e.into_inner());
            self.copy_out(pos, &mut dst[pos - off..pos - off + n])
        })
    }

    /// Copies bytes `pos..pos+dst.len()` (inside the namespace) into `dst`; the caller
    /// holds the read lock of every stripe they touch.
    fn copy_out(&self, pos: usize, dst: &mut [u8]) -> std::io::Result<()> {
        match &self.backing {
            // SAFETY: `pos + len <= size` (the callers checked against the current size,
            // which only grows and whose pages were made readable before it was
            // published), so the source lies in the used part of our mapping; the caller's shared stripe locks exclude writers of
            // these bytes; `dst` is a distinct exclusive slice, so no overlap.
            Backing::Anon => unsafe {
                std::ptr::copy_nonoverlapping(
                    self.base.as_ptr().add(pos),
                    dst.as_mut_ptr(),
                    dst.len(),
                );
                Ok(())
            },
            Backing::File(f) => f.read_exact_at(dst, pos as u64),
        }
    }

    fn write(&self, off: usize, src: &[u8]) -> std::io::Result<()> {
        Self::for_each_stripe(off, src.len(), |pos, n| {
            let _g = self
                .lock(pos / STRIPE_BYTES)
                .write()
                .unwrap_or_else(|e| e.into_inner());
            let s = &src[pos - off..pos - off + n];
            if let Backing::File(f) = &self.backing {
                return f.write_all_at(s, pos as u64);
            }
            // SAFETY: the destination lies in the used part of our mapping (`range`
            // checked it against the size, published only once its pages were made
            // writable, and never smaller afterwards); the
            // exclusive stripe lock excludes every other access to these bytes; `s` is a
            // caller-owned slice that cannot overlap the mapping's interior we hand out
            // nowhere else. `copy_streaming` has made its stores visible when it returns,
            // before the guard releases the lock.
            unsafe {
                let d = self.base.as_ptr().add(pos);
                if self.stream {
                    copy_streaming(s.as_ptr(), d, n);
                } else {
                    std::ptr::copy_nonoverlapping(s.as_ptr(), d, n);
                }
            }
            Ok(())
        })
    }

    fn zero(&self, off: usize, len: usize) -> std::io::Result<()> {
        Self::for_each_stripe(off, len, |pos, n| {
            let _g = self
                .lock(pos / STRIPE_BYTES)
                .write()
                .unwrap_or_else(|e| e.into_inner());
            if let Backing::File(f) = &self.backing {
                // Written, not punched: the file stays allocated (module docs). A piece
                // is at most one stripe, the length of `ZEROES`.
                return f.write_all_at(&ZEROES[..n], pos as u64);
            }
            // Whole pages inside the piece go back to the kernel (they read as zeroes
            // again); the ragged edges are zeroed in place.
            let first_page = pos.next_multiple_of(self.page);
            let last_page = (pos + n) / self.page * self.page;
            let (head, tail) = if n >= MADVISE_MIN && last_page > first_page {
                // SAFETY: the page-aligned range `first_page..last_page` lies in our
                // private anonymous mapping and we hold the exclusive lock of its stripe;
                // MADV_DONTNEED only replaces those pages with zero-fill pages.
                let rc = unsafe {
                    libc::madvise(
                        self.base.as_ptr().add(first_page).cast(),
                        last_page - first_page,
                        libc::MADV_DONTNEED,
                    )
                };
                if rc == 0 {
                    ((pos, first_page - pos), (last_page, pos + n - last_page))
                } else {
                    ((pos, n), (pos + n, 0))
                }
            } else {
                ((pos, n), (pos + n, 0))
            };
            for (start, count) in [head, tail] {
                // SAFETY: `start..start+count` lies within this piece, inside the mapping,
                // under the exclusive stripe lock.
                unsafe { std::ptr::write_bytes(self.base.as_ptr().add(start), 0, count) };
            }
            Ok(())
        })
    }

    /// Byte range of `lba..lba+nblocks`, or `None` when it leaves the namespace.
    fn range(&self, lba: u64, nblocks: u32) -> Option<(usize, usize)> {
        let bs = u64::from(self.block_size);
        let end = lba.checked_add(u64::from(nblocks))?.checked_mul(bs)?;
        if end > self.size() as u64 {
            return None;
        }
        // Both fit in usize because `end <= size`.
        Some(((lba * bs) as usize, (u64::from(nblocks) * bs) as usize))
    }

    /// Runs one request to completion (a file-backed store's FUA and Flush are the file
    /// backend's business: this only moves bytes).
    pub(crate) fn execute(&self, req: &mut Request) -> IoStatus {
        let Some((off, len)) = self.range(req.lba, req.nblocks) else {
            return IoStatus::OutOfRange;
        };
        let done = match req.op {
            Op::Read => match req.buf.as_mut() {
                Some(b) if b.capacity() >= len => {
                    b.set_len(len);
                    self.read(off, b.as_mut_slice())
                }
                _ => return IoStatus::Unsupported,
            },
            Op::Write { .. } => match req.buf.as_ref() {
                Some(b) if b.len() >= len => self.write(off, &b.as_slice()[..len]),
                _ => return IoStatus::Unsupported,
            },
            Op::Flush => Ok(()),
            Op::WriteZeroes { .. } | Op::Deallocate => self.zero(off, len),
        };
        match done {
            Ok(()) => IoStatus::Ok,
            // Only a file-backed store fails.
            Err(e) => crate::file::status_for_error(req.op, &e),
        }
    }
}

/// Copies `n` bytes from `src` to `dst` with non-temporal stores when `dst` is 16-byte
/// aligned and `n` is a whole number of 64-byte lines (block-aligned writes always are),
/// else with a plain copy. Non-temporal stores fill whole lines in write-combining buffers
/// instead of reading each destination line into the cache first, and leave the cache to
/// the data path's other memory. They are weakly ordered, so the copy ends with a store
/// fence: every byte is visible to other threads before the caller releases its lock.
///
/// # Safety
/// `src..src+n` must be readable, `dst..dst+n` writable, and the two must not overlap.
unsafe fn copy_streaming(src: *const u8, dst: *mut u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if (dst as usize).is_multiple_of(16) && n.is_multiple_of(64) {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // SSE2 is part of the x86_64 baseline. SAFETY: every 16-byte load and store below
        // lies within `src..src+n` and `dst..dst+n` (the caller's promise); stores are
        // 16-byte aligned, as `_mm_stream_si128` requires.
        unsafe {
            let mut i = 0;
            while i < n {
                let a = _mm_loadu_si128(src.add(i).cast::<__m128i>());
                let b = _mm_loadu_si128(src.add(i + 16).cast::<__m128i>());
                let c = _mm_loadu_si128(src.add(i + 32).cast::<__m128i>());
                let d = _mm_loadu_si128(src.add(i + 48).cast::<__m128i>());
                _mm_stream_si128(dst.add(i).cast::<__m128i>(), a);
                _mm_stream_si128(dst.add(i + 16).cast::<__m128i>(), b);
                _mm_stream_si128(dst.add(i + 32).cast::<__m128i>(), c);
                _mm_stream_si128(dst.add(i + 48).cast::<__m128i>(), d);
                i += 64;
            }
            _mm_sfence();
        }
        return;
    }
    // SAFETY: as promised by the caller.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
}

/// Checks a store's size and block size (`block_size` a power of two from 512 to 64 KiB,
/// the size a non-zero multiple of it) and returns the size, the page size and the
/// length to map (the size rounded up to a page).
fn geometry(size_bytes: u64, block_size: u32) -> Result<(usize, usize, usize), Error> {
    if !block_size.is_power_of_two() || !(512..=65536).contains(&block_size) {
        return Err(Error::Invalid(format!(
            "ram: block size {block_size} is not a power of two in 512..=65536"
        )));
    }
    if size_bytes == 0 || size_bytes & (u64::from(block_size) - 1) != 0 {
        return Err(Error::Invalid(format!(
            "ram: size {size_bytes} is not a non-zero multiple of the block size {block_size}"
        )));
    }
    let size = usize::try_from(size_bytes)
        .map_err(|_| Error::Invalid(format!("ram: size {size_bytes} too large")))?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let map_len = size
        .checked_next_multiple_of(page)
        .ok_or_else(|| Error::Invalid(format!("ram: size {size_bytes} too large")))?;
    Ok((size, page, map_len))
}

/// Where the lock of `stripe` sits in a lock bitmap: its word and its bit.
fn lock_bit(stripe: usize) -> (usize, u64) {
    let i = stripe % LOCKS;
    (i / 64, 1u64 << (i % 64))
}

/// The lowest set bit of `bits` at index `from` or above.
fn next_bit(bits: &[u64; LOCKS / 64], from: usize) -> Option<usize> {
    let mut w = from / 64;
    if w >= bits.len() {
        return None;
    }
    let mut word = bits[w] & (!0u64 << (from % 64));
    loop {
        if word != 0 {
            return Some(w * 64 + word.trailing_zeros() as usize);
        }
        w += 1;
        if w == bits.len() {
            return None;
        }
        word = bits[w];
    }
}

/// The stripe locks a [`RamBackend::lend`] takes: a set of lock indices, built from the
/// byte ranges that are to be lent together.
#[derive(Clone, Debug)]
pub struct LendSet {
    bits: [u64; LOCKS / 64],
    count: usize,
}

impl Default for LendSet {
    fn default() -> Self {
        LendSet {
            bits: [0; LOCKS / 64],
            count: 0,
        }
    }
}

impl LendSet {
    /// Adds the stripes of bytes `off..off+len`. Returns false, and adds nothing, when the
    /// set would then hold more than [`LEND_MAX_LOCKS`] locks.
    pub fn add(&mut self, off: usize, len: usize) -> bool {
        let mut bits = self.bits;
        let mut count = self.count;
        if len > 0 {
            for stripe in off / STRIPE_BYTES..=(off + len - 1) / STRIPE_BYTES {
                let (word, bit) = lock_bit(stripe);
                if bits[word] & bit == 0 {
                    bits[word] |= bit;
                    count += 1;
                    if count > LEND_MAX_LOCKS {
                        return false;
                    }
                }
            }
        }
        self.bits = bits;
        self.count = count;
        true
    }

    /// No range added since the last [`LendSet::clear`].
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn clear(&mut self) {
        *self = LendSet::default();
    }
}

/// Shared access to the stripes of a [`LendSet`] while [`RamBackend::lend`] holds their
/// locks.
pub struct Lent<'a> {
    backend: &'a RamBackend,
    set: [u64; LOCKS / 64],
}

impl Lent<'_> {
    /// Whether bytes `off..off+len` lie in the namespace and every stripe they touch is
    /// locked (was in the set).
    fn covers(&self, off: usize, len: usize) -> bool {
        let Some(end) = off
            .checked_add(len)
            .filter(|&end| end <= self.backend.size())
        else {
            return false;
        };
        len == 0
            || (off / STRIPE_BYTES..=(end - 1) / STRIPE_BYTES).all(|stripe| {
                let (word, bit) = lock_bit(stripe);
                self.set[word] & bit != 0
            })
    }

    /// Bytes `off..off+len` of the namespace, or `None` when the range leaves it or a
    /// stripe of it is not locked (was not in the set). They are for the kernel to read
    /// (`writev`); a copy in user space takes [`Lent::copy_to`], which a file-backed
    /// store does through its file.
    pub fn bytes(&self, off: usize, len: usize) -> Option<&[u8]> {
        if !self.covers(off, len) {
            return None;
        }
        // SAFETY: `off..off+len` lies inside the mapping (`covers`: the end is within the
        // current size, which only grows and never passes the reserve we mapped), and the lock of every stripe it touches is read-locked by
        // the `lend` call that made this `Lent` and is held until that call returns,
        // which outlives the borrow of `self`: no writer of ours can change these bytes
        // while the slice lives. (For a mapped file, nobody else either: the promise
        // `map_file`'s caller made.)
        Some(unsafe { std::slice::from_raw_parts(self.backend.base.as_ptr().add(off), len) })
    }

    /// Copies bytes `off..off+dst.len()` of the namespace into `dst`: false when they are
    /// not all locked (as [`Lent::bytes`]) or a file-backed store's read failed.
    pub fn copy_to(&self, off: usize, dst: &mut [u8]) -> bool {
        self.covers(off, dst.len()) && self.backend.copy_out(off, dst).is_ok()
    }
}

impl Drop for RamBackend {
    fn drop(&mut self) {
        // SAFETY: `base`/`reserve` are exactly our mapping, reserve included; no queue can
        // outlive us (each holds an `Arc<RamBackend>`), so nothing refers to it any more.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.reserve) };
        give_back_reserve(self.beyond);
    }
}

impl Backend for RamBackend {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn num_blocks(&self) -> u64 {
        self.size() as u64 / u64::from(self.block_size)
    }

    fn volatile_write_cache(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        format!("ram:{}", self.size())
    }

    fn create_queue(self: Arc<Self>, depth: u32) -> Result<Box<dyn BackendQueue>, Error> {
        if depth == 0 {
            return Err(Error::Invalid("ram: queue depth 0".into()));
        }
        Ok(Box::new(RamQueue {
            backend: self,
            depth: depth as usize,
            done: VecDeque::with_capacity(depth as usize),
            zeroing: Zeroing::default(),
        }))
    }

    fn flush_sync(&self) -> Result<(), Error> {
        Ok(())
    }

    /// `Some(bytes)`: grows to `bytes` within the reserve ([`RamBackend::reserved_bytes`]).
    /// `None`: nothing to re-read, the size stays. A store over a file grows through its
    /// file backend, which allocates the file first.
    fn grow(&self, to: Option<u64>) -> Result<u64, Error> {
        match to {
            Some(bytes) if self.is_file() && bytes != self.size() as u64 => {
                return Err(Error::Invalid(
                    "ram: a store over a file grows through its file backend".into(),
                ));
            }
            Some(bytes) => self.grow_to(bytes)?,
            None => {}
        }
        Ok(self.num_blocks())
    }

    fn grow_limit(&self) -> Option<u64> {
        Some(self.reserve as u64)
    }
}

/// Most bytes a queue zeroes per poll. Deallocate and Write Zeroes are done this much per
/// poll, all of a queue's together, so that a large range (a whole namespace, as `mkfs`
/// or `blkdiscard` send) or many ranges at once (one Dataset Management command carries
/// up to 256) do not stall the IO thread's other connections for as long as they take.
pub const ZERO_STEP: usize = 4 << 20;

/// The Deallocate and Write Zeroes requests of one queue, worked off [`ZERO_STEP`] bytes
/// per poll, in order.
#[derive(Debug, Default)]
pub(crate) struct Zeroing {
    /// Each request with the next byte to zero and the end of its range.
    reqs: VecDeque<(Request, usize, usize)>,
}

impl Zeroing {
    pub(crate) fn len(&self) -> usize {
        self.reqs.len()
    }

    /// Queues `req` to zero bytes `off..off+len` of the store (checked by the caller).
    pub(crate) fn push(&mut self, req: Request, off: usize, len: usize) {
        self.reqs.push_back((req, off, off + len));
    }

    /// Zeroes up to [`ZERO_STEP`] bytes of `store`, oldest request first, and hands each
    /// request that finished (or failed) to `done` with its status.
    pub(crate) fn step(&mut self, store: &RamBackend, mut done: impl FnMut(Request, IoStatus)) {
        let mut budget = ZERO_STEP;
        while budget > 0 {
            let Some((req, next, end)) = self.reqs.front_mut() else {
                return;
            };
            let n = (*end - *next).min(budget);
            let result = store.zero(*next, n);
            *next += n;
            budget -= n;
            let status = match result {
                Err(e) => crate::file::status_for_error(req.op, &e),
                Ok(()) if next == end => IoStatus::Ok,
                Ok(()) => continue,
            };
            if let Some((req, _, _)) = self.reqs.pop_front() {
                done(req, status);
            }
        }
    }
}

/// A per-thread queue on a [`RamBackend`].
#[derive(Debug)]
pub struct RamQueue {
    backend: Arc<RamBackend>,
    depth: usize,
    done: VecDeque<Completion>,
    zeroing: Zeroing,
}

impl BackendQueue for RamQueue {
    fn submit(&mut self, mut req: Request) -> Result<(), SubmitError> {
        if self.in_flight() >= self.depth {
            return Err(SubmitError::Full(req));
        }
        if matches!(req.op, Op::WriteZeroes { .. } | Op::Deallocate) {
            if let Some((off, len)) = self.backend.range(req.lba, req.nblocks) {
                self.zeroing.push(req, off, len);
                return Ok(());
            }
        }
        let status = self.backend.execute(&mut req);
        self.done.push_back(Completion {
            tag: req.tag,
            status,
            buf: req.buf,
        });
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        let done = &mut self.done;
        self.zeroing.step(&self.backend, |req, status| {
            done.push_back(Completion {
                tag: req.tag,
                status,
                buf: req.buf,
            })
        });
        let n = self.done.len();
        out.extend(self.done.drain(..));
        n
    }

    fn in_flight(&self) -> usize {
        self.done.len() + self.zeroing.len()
    }

    fn ram_store(&self) -> Option<Arc<RamBackend>> {
        Some(self.backend.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stores take their reserve from one total: the first gets all it asks for, the
    /// next what is left (page-rounded), the one after none and maps its size only; a
    /// reserve the kernel refuses falls back to the size and gives its share back.
    #[test]
    fn reserves_come_out_of_one_total() {
        let page = 4096;
        let used = AtomicUsize::new(0);
        let lens = std::cell::RefCell::new(Vec::new());
        let fake = |fail_above: usize| {
            let lens = &lens;
            move |len: usize| {
                lens.borrow_mut().push(len);
                if len > fail_above {
                    libc::MAP_FAILED
                } else {
                    std::ptr::NonNull::<u8>::dangling().as_ptr().cast()
                }
            }
        };
        let mib = 1 << 20;
        // 1 MiB wants 7 MiB beyond it; the total has 10 MiB + 100 bytes.
        let limit = 10 * mib + 100;
        let (_, len, beyond) = map_reserved_in(&used, limit, mib, page, fake(usize::MAX));
        assert_eq!((len, beyond), (8 * mib, 7 * mib));
        let (_, len, beyond) = map_reserved_in(&used, limit, mib, page, fake(usize::MAX));
        assert_eq!(
            (len, beyond),
            (4 * mib, 3 * mib),
            "what is left, page-rounded"
        );
        let (_, len, beyond) = map_reserved_in(&used, limit, mib, page, fake(usize::MAX));
        assert_eq!((len, beyond), (mib, 0), "nothing left: the size only");
        assert_eq!(used.load(Ordering::Acquire), 10 * mib);
        used.fetch_sub(10 * mib, Ordering::AcqRel);
        lens.borrow_mut().clear();
        let (raw, len, beyond) = map_reserved_in(&used, limit, mib, page, fake(mib));
        assert!(raw != libc::MAP_FAILED);
        assert_eq!((len, beyond), (mib, 0));
        assert_eq!(
            *lens.borrow(),
            [8 * mib, mib],
            "tried the reserve, then the size"
        );
        assert_eq!(
            used.load(Ordering::Acquire),
            0,
            "the failed reserve's share came back"
        );
    }

    #[test]
    fn streaming_copy_matches_a_plain_copy_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        // 16-byte aligned destination storage, offset below to misalign it on purpose.
        let mut store = vec![0u128; 20_000 / 16 + 2];
        for dst_off in [0usize, 1, 8, 16, 64] {
            for src_off in [0usize, 3, 64] {
                for n in [0usize, 1, 63, 64, 512, 4096, 4160, 12_345, 16_384] {
                    store.fill(0);
                    // SAFETY: `store` is 16-byte aligned and spans 20,032 bytes; every
                    // (dst_off, n) and (src_off, n) pair here stays inside it and `src`,
                    // and the two are distinct allocations.
                    unsafe {
                        let dst = store.as_mut_ptr().cast::<u8>().add(dst_off);
                        copy_streaming(src.as_ptr().add(src_off), dst, n);
                    }
                    // SAFETY: as above; the copy has returned.
                    let bytes =
                        unsafe { std::slice::from_raw_parts(store.as_ptr().cast::<u8>(), 20_032) };
                    assert_eq!(
                        &bytes[dst_off..dst_off + n],
                        &src[src_off..src_off + n],
                        "dst+{dst_off} src+{src_off} n={n}"
                    );
                    assert!(bytes[..dst_off].iter().all(|&b| b == 0), "wrote before");
                    assert!(
                        bytes[dst_off + n..].iter().all(|&b| b == 0),
                        "wrote after: dst+{dst_off} n={n}"
                    );
                }
            }
        }
    }

    #[test]
    fn only_namespaces_larger_than_caches_stream() {
        assert!(!RamBackend::new(64 << 20, 4096).unwrap().stream);
        assert!(
            RamBackend::new(STREAM_MIN_SIZE as u64, 4096)
                .unwrap()
                .stream
        );
    }
}
