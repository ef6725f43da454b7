//! RAM backend: the benchmark and test store.
//!
//! Storage is one anonymous private mapping with `MAP_NORESERVE`, so a namespace commits
//! memory only where it is written; untouched pages read as zeroes. Deallocate and Write
//! Zeroes hand whole pages back to the kernel (`MADV_DONTNEED`) when the range is large,
//! and zero the rest in place.
//!
//! Concurrency: the space is cut into stripes of [`STRIPE_BYTES`]; every byte belongs to
//! exactly one stripe, and every access to a stripe's bytes holds that stripe's lock
//! (shared for reads, exclusive for writes and deallocation). Stripes map onto a fixed
//! table of cache-line-padded `RwLock`s (stripe `i` uses lock `i % LOCKS`), so the lock
//! memory does not grow with the namespace. A request is copied stripe by stripe,
//! holding one lock at a time, so there is no lock ordering to get wrong. Two accesses
//! to the same byte are therefore never concurrent unless both are reads: no data race.
//! Stripes are block-aligned, so each logical block is written atomically; a request
//! spanning stripes is not atomic as a whole (NVMe's AWUN of one block allows that).
//!
//! Completions are immediate: `submit` does the copy and queues the completion, and the
//! next `poll` returns it. No volatile write cache.

// `unsafe` allowed here: the anonymous mapping (mmap, madvise) and the copies in and out of
// it under the stripe locks.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::{Arc, RwLock};

use crate::{Backend, BackendQueue, Completion, Error, IoStatus, Op, Request, SubmitError};

/// Bytes covered by one stripe lock.
pub const STRIPE_BYTES: usize = 64 << 10;
/// Number of stripe locks (a power of two).
const LOCKS: usize = 1024;
/// Below this many bytes, Deallocate/Write Zeroes zero memory in place rather than
/// `madvise` (which costs a syscall and a TLB shootdown across the process's threads).
const MADVISE_MIN: usize = 64 << 10;

#[repr(align(64))]
#[derive(Debug, Default)]
struct StripeLock(RwLock<()>);

/// A RAM-backed block store, shared by all IO threads.
pub struct RamBackend {
    base: NonNull<u8>,
    /// Mapped length (size rounded up to the page size).
    map_len: usize,
    size: usize,
    block_size: u32,
    page: usize,
    locks: Box<[StripeLock]>,
}

// SAFETY: the mapping is owned by `RamBackend` and freed only in `Drop`. Every read or
// write of its bytes through `&RamBackend` holds the stripe lock covering those bytes
// (see the module docs), so sharing `&RamBackend` between threads cannot race.
unsafe impl Sync for RamBackend {}
// SAFETY: the raw pointer refers to a process-wide mapping, not to thread-local state;
// moving the owner to another thread is fine.
unsafe impl Send for RamBackend {}

impl std::fmt::Debug for RamBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RamBackend")
            .field("size", &self.size)
            .field("block_size", &self.block_size)
            .finish()
    }
}

impl RamBackend {
    /// A zero-filled namespace of `size_bytes` (a non-zero multiple of `block_size`),
    /// with `block_size` a power of two from 512 to 64 KiB.
    pub fn new(size_bytes: u64, block_size: u32) -> Result<Arc<RamBackend>, Error> {
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
        // SAFETY: an anonymous private mapping at a kernel-chosen address touches no
        // existing memory; the result is checked for MAP_FAILED below.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(Error::Io(std::io::Error::last_os_error()));
        }
        let base = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| Error::Invalid("ram: mmap returned null".into()))?;
        let locks = (0..LOCKS).map(|_| StripeLock::default()).collect();
        Ok(Arc::new(RamBackend {
            base,
            map_len,
            size,
            block_size,
            page,
            locks,
        }))
    }

    /// Bytes resident in memory, for tests and metrics (`mincore`).
    pub fn resident_bytes(&self) -> usize {
        let pages = self.map_len / self.page;
        let mut vec = vec![0u8; pages];
        // SAFETY: `base..base+map_len` is our page-aligned mapping and `vec` has one byte
        // per page of it, as mincore requires.
        let rc =
            unsafe { libc::mincore(self.base.as_ptr().cast(), self.map_len, vec.as_mut_ptr()) };
        if rc != 0 {
            return 0;
        }
        vec.iter().filter(|&&v| v & 1 != 0).count() * self.page
    }

    fn lock(&self, stripe: usize) -> &RwLock<()> {
        &self.locks[stripe % LOCKS].0
    }

    /// Calls `f(offset, len)` for each stripe-bounded piece of `off..off+len`.
    fn for_each_stripe(off: usize, len: usize, mut f: impl FnMut(usize, usize)) {
        let end = off + len;
        let mut pos = off;
        while pos < end {
            let stripe_end = (pos / STRIPE_BYTES + 1) * STRIPE_BYTES;
            let n = stripe_end.min(end) - pos;
            f(pos, n);
            pos += n;
        }
    }

    fn read(&self, off: usize, dst: &mut [u8]) {
        Self::for_each_stripe(off, dst.len(), |pos, n| {
            let _g = self
                .lock(pos / STRIPE_BYTES)
                .read()
                .unwrap_or_else(|e| e.into_inner());
            let d = &mut dst[pos - off..pos - off + n];
            // SAFETY: `pos + n <= size <= map_len` (checked by `range`), so the source lies
            // in our mapping; the shared stripe lock excludes writers of these bytes; `d`
            // is a distinct exclusive slice of exactly `n` bytes, so no overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(self.base.as_ptr().add(pos), d.as_mut_ptr(), n)
            };
        });
    }

    fn write(&self, off: usize, src: &[u8]) {
        Self::for_each_stripe(off, src.len(), |pos, n| {
            let _g = self
                .lock(pos / STRIPE_BYTES)
                .write()
                .unwrap_or_else(|e| e.into_inner());
            let s = &src[pos - off..pos - off + n];
            // SAFETY: the destination lies in our mapping (`range` checked it); the
            // exclusive stripe lock excludes every other access to these bytes; `s` is a
            // caller-owned slice that cannot overlap the mapping's interior we hand out
            // nowhere else.
            unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), self.base.as_ptr().add(pos), n) };
        });
    }

    fn zero(&self, off: usize, len: usize) {
        Self::for_each_stripe(off, len, |pos, n| {
            let _g = self
                .lock(pos / STRIPE_BYTES)
                .write()
                .unwrap_or_else(|e| e.into_inner());
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
        });
    }

    /// Byte range of `lba..lba+nblocks`, or `None` when it leaves the namespace.
    fn range(&self, lba: u64, nblocks: u32) -> Option<(usize, usize)> {
        let bs = u64::from(self.block_size);
        let end = lba.checked_add(u64::from(nblocks))?.checked_mul(bs)?;
        if end > self.size as u64 {
            return None;
        }
        // Both fit in usize because `end <= size`.
        Some(((lba * bs) as usize, (u64::from(nblocks) * bs) as usize))
    }

    /// Runs one request to completion.
    fn execute(&self, req: &mut Request) -> IoStatus {
        let Some((off, len)) = self.range(req.lba, req.nblocks) else {
            return IoStatus::OutOfRange;
        };
        match req.op {
            Op::Read => match req.buf.as_mut() {
                Some(b) if b.capacity() >= len => {
                    b.set_len(len);
                    self.read(off, b.as_mut_slice());
                    IoStatus::Ok
                }
                _ => IoStatus::Unsupported,
            },
            Op::Write { .. } => match req.buf.as_ref() {
                Some(b) if b.len() >= len => {
                    self.write(off, &b.as_slice()[..len]);
                    IoStatus::Ok
                }
                _ => IoStatus::Unsupported,
            },
            Op::Flush => IoStatus::Ok,
            Op::WriteZeroes { .. } | Op::Deallocate => {
                self.zero(off, len);
                IoStatus::Ok
            }
        }
    }
}

impl Drop for RamBackend {
    fn drop(&mut self) {
        // SAFETY: `base`/`map_len` are exactly our mapping; no queue can outlive us (each
        // holds an `Arc<RamBackend>`), so nothing refers to it any more.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
    }
}

impl Backend for RamBackend {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn num_blocks(&self) -> u64 {
        self.size as u64 / u64::from(self.block_size)
    }

    fn volatile_write_cache(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        format!("ram:{}", self.size)
    }

    fn create_queue(self: Arc<Self>, depth: u32) -> Result<Box<dyn BackendQueue>, Error> {
        if depth == 0 {
            return Err(Error::Invalid("ram: queue depth 0".into()));
        }
        Ok(Box::new(RamQueue {
            backend: self,
            depth: depth as usize,
            done: VecDeque::with_capacity(depth as usize),
        }))
    }

    fn flush_sync(&self) -> Result<(), Error> {
        Ok(())
    }
}

/// A per-thread queue on a [`RamBackend`].
#[derive(Debug)]
pub struct RamQueue {
    backend: Arc<RamBackend>,
    depth: usize,
    done: VecDeque<Completion>,
}

impl BackendQueue for RamQueue {
    fn submit(&mut self, mut req: Request) -> Result<(), SubmitError> {
        if self.done.len() >= self.depth {
            return Err(SubmitError::Full(req));
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
        let n = self.done.len();
        out.extend(self.done.drain(..));
        n
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }
}
