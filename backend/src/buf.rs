//! I/O buffers: [`IoBuf`] (owned, 4 KiB aligned) and [`BufPool`] (a per-thread pool of
//! them in power-of-two size classes).
//!
//! The alignment is what lets the same buffer go to an `O_DIRECT` file, a block device, or
//! (later) an NVMe PRP list without a bounce copy. A buffer has one owner at a time: the
//! pool, the engine, or a backend request in flight; that is what makes lending it to the
//! kernel (io_uring) sound.

// `unsafe` allowed here: aligned allocation through std::alloc, and the raw bytes of a
// buffer the kernel (io_uring) or a device reads and writes while a request holds it.
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Alignment (and capacity granule) of every [`IoBuf`].
pub const IO_BUF_ALIGN: usize = 4096;

/// Smallest size class of a [`BufPool`].
pub const MIN_CLASS: usize = 4096;

/// An owned, [`IO_BUF_ALIGN`]-aligned byte buffer with a capacity (a multiple of 4 KiB)
/// and a current length (`<= capacity`).
///
/// A newly allocated buffer is zero-filled. A buffer recycled through a [`BufPool`]
/// keeps whatever bytes it last held; [`IoBuf::as_slice`] only shows `..len`, and callers
/// that expose bytes past what they wrote must zero them (see [`IoBuf::zero`]).
pub struct IoBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
    /// The pool that allocated this buffer, for its byte accounting; `None` for a
    /// stand-alone buffer.
    origin: Option<Arc<PoolShared>>,
    /// Unique for the life of the process (never reused, unlike the address).
    id: u64,
}

/// Source of [`IoBuf::id`]s.
static NEXT_BUF_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

// SAFETY: `IoBuf` uniquely owns its allocation (like `Box<[u8]>`); the only shared part is
// `origin`, an `Arc` of atomics, which is Send + Sync itself.
unsafe impl Send for IoBuf {}
// SAFETY: `&IoBuf` only gives read access to the bytes (`as_slice`, `as_ptr`), like
// `&Box<[u8]>`; mutation needs `&mut IoBuf`.
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// A zero-filled buffer of length `len`, capacity `len` rounded up to 4 KiB (at least
    /// 4 KiB). Aborts on allocation failure like `Vec`; see [`IoBuf::try_new`].
    pub fn new(len: usize) -> IoBuf {
        let layout = layout_for(len).unwrap_or_else(|| panic!("IoBuf of {len} bytes: too large"));
        match IoBuf::try_new(len) {
            Some(b) => b,
            None => alloc::handle_alloc_error(layout),
        }
    }

    /// Like [`IoBuf::new`], but `None` when the allocation fails or `len` is absurd.
    pub fn try_new(len: usize) -> Option<IoBuf> {
        let layout = layout_for(len)?;
        // SAFETY: `layout` has a non-zero size (at least 4 KiB) and a valid power-of-two
        // alignment, as `alloc_zeroed` requires.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw)?;
        Some(IoBuf {
            ptr,
            cap: layout.size(),
            len,
            origin: None,
            id: NEXT_BUF_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// This allocation's identity: never shared with another buffer, even one that later
    /// gets the same address. Per-buffer registrations (RDMA memory regions) are keyed by
    /// it, so a freed buffer's registration can never be used for a new buffer.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// A buffer holding a copy of `data` (for tests and control-path use).
    pub fn from_slice(data: &[u8]) -> IoBuf {
        let mut b = IoBuf::new(data.len());
        b.as_mut_slice().copy_from_slice(data);
        b
    }

    /// The bytes `..len`.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `cap` initialised bytes owned by `self` (zeroed at
        // allocation, only ever written through `&mut self` or by a backend that holds the
        // buffer by value); `len <= cap`; the shared borrow of `self` keeps them unchanged.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes `..len`, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; the exclusive borrow of `self` makes this the only
        // access to the bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Current length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Set the length. The bytes up to the new length are whatever the buffer last held
    /// (zero if never written).
    ///
    /// # Panics
    /// If `len > capacity()`: a caller bug, never a data-dependent condition.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.cap,
            "IoBuf::set_len({len}) beyond capacity {}",
            self.cap
        );
        self.len = len;
    }

    /// Allocated bytes (a multiple of 4 KiB).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Zero the bytes `..len`.
    pub fn zero(&mut self) {
        self.as_mut_slice().fill(0);
    }

    /// Start of the allocation, for handing to the kernel.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Start of the allocation, writable, for handing to the kernel. Valid for
    /// `capacity()` bytes while `self` is neither moved-from-and-dropped nor borrowed.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn layout(&self) -> Layout {
        // SAFETY: `cap` and `IO_BUF_ALIGN` are the values this buffer was allocated with,
        // which `layout_for` already validated.
        unsafe { Layout::from_size_align_unchecked(self.cap, IO_BUF_ALIGN) }
    }
}

/// Hand memory the allocator holds free back to the system. glibc keeps freed heap
/// memory (and raises its mmap threshold after large frees, so large buffers end up on
/// the heap too): without this, a trimmed pool would not shrink the process.
fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only releases free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn layout_for(len: usize) -> Option<Layout> {
    let cap = len.max(1).checked_next_multiple_of(IO_BUF_ALIGN)?;
    Layout::from_size_align(cap, IO_BUF_ALIGN).ok()
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if let Some(origin) = &self.origin {
            origin.allocated.fetch_sub(self.cap, Ordering::Relaxed);
            if origin.track_drops.load(Ordering::Relaxed) {
                origin
                    .dropped
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(self.id);
            }
        }
        // SAFETY: `ptr` came from `alloc_zeroed` with exactly this layout and is freed
        // once, here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout()) }
    }
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("capacity", &self.cap)
            .field("pooled", &self.origin.is_some())
            .finish()
    }
}

/// What a pool shares with the buffers it made: their byte count, so that a buffer
/// dropped anywhere (any thread) instead of returned gives its bytes back to the cap.
#[derive(Debug, Default)]
struct PoolShared {
    allocated: AtomicUsize,
    /// Record the ids of freed buffers (for [`BufPool::take_dropped`]).
    track_drops: std::sync::atomic::AtomicBool,
    /// Ids of buffers freed since the last `take_dropped` (a freed buffer is rare: the
    /// pool frees only under cap pressure).
    dropped: std::sync::Mutex<Vec<u64>>,
}

/// A per-thread pool of [`IoBuf`]s in power-of-two size classes from 4 KiB to `max_buf`.
///
/// `get` reuses a free buffer of the right class, or allocates one while the bytes
/// allocated by this pool (in use + free) stay within `cap_bytes`; past the cap it first
/// releases idle buffers of other classes, then returns `None`. `put` takes a buffer
/// back. Once the free lists have grown to the working set, `get`/`put` allocate nothing.
///
/// Not `Sync`: one IO thread owns it. Its buffers are `Send` and may be dropped on any
/// thread; they must come back through `put` on the owning thread to be reused.
#[derive(Debug)]
pub struct BufPool {
    /// `free[i]` holds idle buffers of capacity `MIN_CLASS << i`.
    free: Vec<Vec<IoBuf>>,
    max_buf: usize,
    cap_bytes: usize,
    shared: Arc<PoolShared>,
    /// Keeps the pool `!Sync` (and `!Send`): per-thread by design.
    _not_sync: std::marker::PhantomData<*const ()>,
}

impl BufPool {
    /// A pool whose buffers go up to `max_buf` bytes (rounded up to a power of two, at
    /// least 4 KiB) and whose allocations never exceed `cap_bytes` in total.
    pub fn new(max_buf: usize, cap_bytes: usize) -> BufPool {
        let max_buf = max_buf
            .max(MIN_CLASS)
            .checked_next_power_of_two()
            .unwrap_or(1 << 30);
        let classes = (max_buf / MIN_CLASS).trailing_zeros() as usize + 1;
        BufPool {
            free: (0..classes).map(|_| Vec::new()).collect(),
            max_buf,
            cap_bytes,
            shared: Arc::new(PoolShared::default()),
            _not_sync: std::marker::PhantomData,
        }
    }

    /// A buffer of length `len` (capacity: the smallest class that holds it), or `None`
    /// when `len > max_buf()` or the cap is reached. Recycled buffers are not re-zeroed.
    pub fn get(&mut self, len: usize) -> Option<IoBuf> {
        let class = self.class_of(len)?;
        if let Some(mut b) = self.free[class].pop() {
            b.len = len;
            return Some(b);
        }
        let size = MIN_CLASS << class;
        if !self.reserve(size, class) {
            return None;
        }
        match IoBuf::try_new(size) {
            Some(mut b) => {
                b.len = len;
                b.origin = Some(Arc::clone(&self.shared));
                Some(b)
            }
            None => {
                self.shared.allocated.fetch_sub(size, Ordering::Relaxed);
                None
            }
        }
    }

    /// Whether `buf` was made by this pool (and so [`put`](Self::put) would keep it).
    pub fn owns(&self, buf: &IoBuf) -> bool {
        buf.origin
            .as_ref()
            .is_some_and(|o| Arc::ptr_eq(o, &self.shared))
    }

    /// Return a buffer. A buffer this pool did not make is dropped (freed), not adopted,
    /// so the cap keeps meaning what it says.
    pub fn put(&mut self, buf: IoBuf) {
        if !self.owns(&buf) {
            return;
        }
        // A pooled buffer's capacity is always exactly a class size.
        match self.class_of(buf.cap) {
            Some(class) if MIN_CLASS << class == buf.cap => self.free[class].push(buf),
            _ => drop(buf),
        }
    }

    /// From now on remember the [`IoBuf::id`] of every buffer of this pool that is freed
    /// (by the pool or anywhere else), for owners of per-buffer registrations (RDMA
    /// memory regions) to drop theirs: see [`BufPool::take_dropped`].
    pub fn track_drops(&self) {
        self.shared.track_drops.store(true, Ordering::Relaxed);
    }

    /// Ids of this pool's buffers freed since the last call (with [`BufPool::track_drops`]
    /// on), appended to `out`.
    pub fn take_dropped(&self, out: &mut Vec<u64>) {
        let mut d = self
            .shared
            .dropped
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        out.append(&mut d);
    }

    /// Bytes of idle buffers (in the free lists).
    pub fn idle_bytes(&self) -> usize {
        self.free
            .iter()
            .enumerate()
            .map(|(c, l)| l.len() * (MIN_CLASS << c))
            .sum()
    }

    /// Free idle buffers, largest first, until at most `keep` bytes of them remain: a
    /// burst's buffers go back to the system once it is over. Returns the bytes freed.
    pub fn trim_idle(&mut self, keep: usize) -> usize {
        let mut idle = self.idle_bytes();
        let mut freed = 0;
        for c in (0..self.free.len()).rev() {
            while idle > keep {
                let Some(b) = self.free[c].pop() else {
                    break;
                };
                idle -= b.cap;
                freed += b.cap;
            }
        }
        if freed > 0 {
            return_free_memory();
        }
        freed
    }

    /// Largest buffer `get` hands out.
    pub fn max_buf(&self) -> usize {
        self.max_buf
    }

    /// The byte cap given at creation.
    pub fn cap_bytes(&self) -> usize {
        self.cap_bytes
    }

    /// Bytes currently allocated by this pool: idle plus lent out.
    pub fn allocated_bytes(&self) -> usize {
        self.shared.allocated.load(Ordering::Relaxed)
    }

    /// Idle buffers in the free lists.
    pub fn idle_buffers(&self) -> usize {
        self.free.iter().map(Vec::len).sum()
    }

    fn class_of(&self, len: usize) -> Option<usize> {
        if len > self.max_buf {
            return None;
        }
        let size = len.max(MIN_CLASS).next_power_of_two();
        Some((size / MIN_CLASS).trailing_zeros() as usize)
    }

    /// Account `size` new bytes, releasing idle buffers of other classes if that is what
    /// it takes to stay under the cap.
    fn reserve(&mut self, size: usize, class: usize) -> bool {
        loop {
            let now = self.shared.allocated.load(Ordering::Relaxed);
            if now.checked_add(size).is_some_and(|n| n <= self.cap_bytes) {
                // Only this thread increases the count; other threads only decrease it,
                // so the check above stays true.
                self.shared.allocated.fetch_add(size, Ordering::Relaxed);
                return true;
            }
            // Release the largest idle buffer of another class and try again.
            let victim = (0..self.free.len())
                .rev()
                .find(|&c| c != class && !self.free[c].is_empty());
            match victim {
                Some(c) => drop(self.free[c].pop()),
                None => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_never_reused_even_when_addresses_are() {
        let mut seen = std::collections::HashSet::new();
        let mut addrs = std::collections::HashSet::new();
        let mut reused_address = false;
        for _ in 0..64 {
            let b = IoBuf::new(4096);
            assert!(seen.insert(b.id()), "id {} handed out twice", b.id());
            reused_address |= !addrs.insert(b.as_ptr() as usize);
            drop(b);
        }
        // The allocator normally hands the freed block straight back: the case an
        // address-keyed registration would get wrong.
        assert!(
            reused_address,
            "no address reuse observed; the test proves nothing"
        );
    }

    #[test]
    fn iobuf_is_aligned_zeroed_and_sized() {
        for len in [0, 1, 512, 4096, 4097, 1 << 20] {
            let b = IoBuf::new(len);
            assert_eq!(b.as_ptr() as usize % IO_BUF_ALIGN, 0);
            assert_eq!(b.len(), len);
            assert!(b.capacity() >= len.max(1));
            assert_eq!(b.capacity() % IO_BUF_ALIGN, 0);
            assert!(b.as_slice().iter().all(|&x| x == 0));
        }
        let mut b = IoBuf::new(10);
        b.set_len(b.capacity());
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[4095] = 7;
        b.set_len(4096);
        assert_eq!(b.as_slice()[4095], 7);
    }

    #[test]
    #[should_panic(expected = "beyond capacity")]
    fn set_len_beyond_capacity_panics() {
        IoBuf::new(4096).set_len(4097);
    }

    #[test]
    fn iobuf_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<IoBuf>();
    }

    #[test]
    fn pool_classes_and_alignment() {
        let mut pool = BufPool::new(2 << 20, 64 << 20);
        assert_eq!(pool.max_buf(), 2 << 20);
        for (len, cap) in [
            (0, 4096),
            (1, 4096),
            (4096, 4096),
            (4097, 8192),
            (100_000, 131_072),
            (2 << 20, 2 << 20),
        ] {
            let b = pool.get(len).unwrap();
            assert_eq!((b.len(), b.capacity()), (len, cap));
            assert_eq!(b.as_ptr() as usize % IO_BUF_ALIGN, 0);
            pool.put(b);
        }
        assert!(pool.get((2 << 20) + 1).is_none());
    }

    #[test]
    fn pool_reuses_buffers() {
        let mut pool = BufPool::new(1 << 20, 1 << 20);
        let b = pool.get(4096).unwrap();
        let p = b.as_ptr();
        pool.put(b);
        let allocated = pool.allocated_bytes();
        for _ in 0..1000 {
            let b = pool.get(3000).unwrap();
            assert_eq!(b.as_ptr(), p);
            assert_eq!(b.len(), 3000);
            pool.put(b);
        }
        assert_eq!(pool.allocated_bytes(), allocated);
        assert_eq!(pool.idle_buffers(), 1);
    }

    #[test]
    fn pool_respects_cap() {
        let mut pool = BufPool::new(64 << 10, 64 << 10);
        let held: Vec<_> = (0..16).map(|_| pool.get(4096).unwrap()).collect();
        assert_eq!(pool.allocated_bytes(), 64 << 10);
        assert!(pool.get(4096).is_none());
        assert!(pool.get(8192).is_none());
        for b in held {
            pool.put(b);
        }
        // Idle 4 KiB buffers are released to make room for a 64 KiB one.
        let big = pool.get(64 << 10).unwrap();
        assert_eq!(pool.idle_buffers(), 0);
        assert_eq!(pool.allocated_bytes(), 64 << 10);
        assert!(pool.get(4096).is_none());
        // Dropping instead of returning gives the bytes back to the cap.
        drop(big);
        assert_eq!(pool.allocated_bytes(), 0);
        assert!(pool.get(4096).is_some());
    }

    #[test]
    fn pool_drop_from_other_thread_is_accounted() {
        let mut pool = BufPool::new(8192, 8192);
        let b = pool.get(8192).unwrap();
        std::thread::spawn(move || drop(b)).join().unwrap();
        assert_eq!(pool.allocated_bytes(), 0);
        assert!(pool.get(8192).is_some());
    }

    #[test]
    fn freed_buffers_are_reported_when_asked() {
        let mut pool = BufPool::new(64 << 10, 64 << 10);
        let a = pool.get(4096).unwrap();
        drop(a);
        let mut ids = Vec::new();
        pool.take_dropped(&mut ids);
        assert!(ids.is_empty(), "not tracked unless asked");
        pool.track_drops();
        let held: Vec<_> = (0..16).map(|_| pool.get(4096).unwrap()).collect();
        let want: Vec<u64> = held.iter().map(|b| b.id()).collect();
        for b in held {
            pool.put(b);
        }
        // A 64 KiB buffer needs the room of the 16 idle 4 KiB ones: the pool frees them.
        let big = pool.get(64 << 10).unwrap();
        pool.take_dropped(&mut ids);
        ids.sort_unstable();
        assert_eq!(ids, want);
        let id = big.id();
        std::thread::spawn(move || drop(big)).join().unwrap();
        ids.clear();
        pool.take_dropped(&mut ids);
        assert_eq!(ids, vec![id], "freed on another thread");
    }

    #[test]
    fn trim_frees_idle_buffers_largest_first() {
        let mut pool = BufPool::new(1 << 20, 8 << 20);
        let big: Vec<_> = (0..4).map(|_| pool.get(1 << 20).unwrap()).collect();
        let small: Vec<_> = (0..8).map(|_| pool.get(4096).unwrap()).collect();
        for b in big.into_iter().chain(small) {
            pool.put(b);
        }
        assert_eq!(pool.idle_bytes(), (4 << 20) + 8 * 4096);
        assert_eq!(pool.trim_idle(64 << 10), 4 << 20);
        assert_eq!(pool.idle_bytes(), 8 * 4096);
        assert_eq!(pool.allocated_bytes(), 8 * 4096);
        assert_eq!(pool.trim_idle(0), 8 * 4096);
        assert_eq!(pool.allocated_bytes(), 0);
    }

    #[test]
    fn pool_does_not_adopt_foreign_buffers() {
        let mut a = BufPool::new(4096, 4096);
        let mut b = BufPool::new(4096, 4096);
        let buf = a.get(4096).unwrap();
        b.put(buf);
        assert_eq!(b.idle_buffers(), 0);
        assert_eq!(a.allocated_bytes(), 0);
        b.put(IoBuf::new(4096));
        assert_eq!(b.idle_buffers(), 0);
    }
}
