//! How the driver reaches a controller: the [`DeviceAccess`] trait (BAR0 registers,
//! doorbells, PCI config space, DMA memory) and the DMA memory types both implementations
//! share.
//!
//! This is the only place besides `vfio.rs` and the emulator's DMA engine with `unsafe`:
//! [`DmaRegion`] hands out bytes that a device reads and writes behind the compiler's back,
//! so every access goes through atomics or raw copies here, and the driver above sees only
//! safe methods.

// `unsafe` allowed here: DMA memory that a device reads and writes behind the compiler's
// back (atomics and raw copies only).
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use crate::IoBuf;

/// Why a device operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Invalid(String),
    #[error("device removed")]
    Removed,
    #[error("not supported: {0}")]
    Unsupported(String),
}

/// A controller as the driver sees it. Two implementations: [`super::vfio::VfioDevice`]
/// (a real PCI function bound to vfio-pci) and [`super::emu::EmulatedController`].
///
/// MMIO accessors never fail: a device that is gone reads as all ones (as a PCIe read to a
/// removed function does) and swallows writes; the driver checks for that pattern.
pub trait DeviceAccess: Send + Sync + std::fmt::Debug {
    /// For logs: the PCI address or `emulated`.
    fn name(&self) -> String;
    /// 32-bit read of BAR0 at byte offset `off`.
    fn read32(&self, off: usize) -> u32;
    /// 32-bit write of BAR0 at byte offset `off` (doorbells, CC, AQA).
    fn write32(&self, off: usize, value: u32);
    /// 64-bit register read as two 32-bit reads, low dword first.
    fn read64(&self, off: usize) -> u64 {
        u64::from(self.read32(off)) | u64::from(self.read32(off + 4)) << 32
    }
    /// 64-bit register write as two 32-bit writes, low dword first.
    fn write64(&self, off: usize, value: u64) {
        self.write32(off, value as u32);
        self.write32(off + 4, (value >> 32) as u32);
    }
    /// Sets Memory Space Enable and Bus Master Enable in the PCI command register.
    fn enable_bus_master(&self) -> Result<(), DeviceError>;
    /// Zeroed memory of at least `len` bytes (a multiple of 4 KiB), mapped for the device.
    fn alloc_dma(&self, len: usize) -> Result<DmaRegion, DeviceError>;
    /// Makes `buf`'s whole allocation (`capacity()` bytes) reachable by the device and
    /// returns its I/O virtual address. The device may read or write those bytes while a
    /// command that points at them is outstanding; the caller keeps the buffer alive and
    /// untouched for that time and calls [`DeviceAccess::unmap_dma`] before the buffer is
    /// freed or at least before its memory is given to anything else that a command could
    /// reach.
    fn map_dma(&self, buf: &IoBuf) -> Result<u64, DeviceError>;
    /// Undoes one [`DeviceAccess::map_dma`].
    fn unmap_dma(&self, iova: u64, len: usize);
    /// Whether the platform asked us to give the device up (VFIO's device request
    /// notification on hot removal). Polled; never blocks.
    fn removal_requested(&self) -> bool {
        false
    }
    /// Stop touching the device: later MMIO reads return all ones, writes are dropped,
    /// and the platform may take the device away. Called once the driver has failed
    /// everything outstanding.
    fn release(&self) {}
    /// Exports a window of BAR0 as a dma-buf for peer-to-peer access by another device
    /// (the offload engine's doorbell path). See `p2p.rs`.
    fn export_bar0_dmabuf(
        &self,
        _offset: u64,
        _len: u64,
    ) -> Result<super::p2p::DmaBufExport, DeviceError> {
        Err(DeviceError::Unsupported(
            "this device cannot export BAR0 as a dma-buf".into(),
        ))
    }
}

/// Hands out I/O virtual addresses: a bump pointer from 4 GiB (above the x86 MSI window
/// at 0xFEE0_0000 and any low reserved ranges) with exact-size reuse of freed ranges.
/// The IOVA is deliberately unrelated to the virtual address, so a driver that put a
/// pointer where an IOVA belongs fails at once, on the emulator as on hardware.
#[derive(Debug)]
pub struct IovaAllocator {
    inner: Mutex<IovaInner>,
}

#[derive(Debug)]
struct IovaInner {
    next: u64,
    limit: u64,
    free: HashMap<u64, Vec<u64>>,
}

impl IovaAllocator {
    /// IOVAs in `base..limit`.
    pub fn new(base: u64, limit: u64) -> IovaAllocator {
        IovaAllocator {
            inner: Mutex::new(IovaInner {
                next: base,
                limit,
                free: HashMap::new(),
            }),
        }
    }

    /// An IOVA range of `len` bytes (rounded up to 4 KiB), 4 KiB aligned.
    pub fn alloc(&self, len: usize) -> Option<u64> {
        let len = (len.max(1) as u64).next_multiple_of(4096);
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(iova) = g.free.get_mut(&len).and_then(Vec::pop) {
            return Some(iova);
        }
        let iova = g.next;
        let end = iova.checked_add(len)?;
        if end > g.limit {
            return None;
        }
        g.next = end;
        Some(iova)
    }

    pub fn free(&self, iova: u64, len: usize) {
        let len = (len.max(1) as u64).next_multiple_of(4096);
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.free.entry(len).or_default().push(iova);
    }
}

/// Driver-owned DMA memory (queue rings, PRP lists, Identify and log pages): host memory
/// plus the IOVA the device uses for it. Dropping it unmaps it (through the hook the
/// device gave it) before the memory is freed.
///
/// Both the driver and the device access it at the same time (that is what a ring is),
/// so there are no `&[u8]` views: dword accessors are atomic, byte copies are raw copies
/// whose ordering the ring protocol provides (an SQE is written before the doorbell that
/// publishes it; a CQE's other dwords are read after its phase dword).
pub struct DmaRegion {
    ptr: NonNull<u8>,
    len: usize,
    iova: u64,
    /// Runs before the memory is freed: removes the device's mapping.
    release: Option<Box<dyn FnOnce() + Send + Sync>>,
    /// The allocation (4 KiB aligned, zeroed); never accessed through the `IoBuf` API
    /// after creation.
    _mem: IoBuf,
}

// SAFETY: the region owns its allocation; all access through `&DmaRegion` is by atomic
// dword operations or raw copies into caller-owned slices, which is how hardware and the
// driver share ring memory. `release` is `Send + Sync`.
unsafe impl Send for DmaRegion {}
// SAFETY: as above; no method hands out a reference into the memory.
unsafe impl Sync for DmaRegion {}

impl std::fmt::Debug for DmaRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaRegion")
            .field("len", &self.len)
            .field("iova", &format_args!("{:#x}", self.iova))
            .finish()
    }
}

impl DmaRegion {
    /// Wraps `mem` (its whole capacity), mapped at `iova`; `release` undoes the mapping.
    pub fn new(
        mut mem: IoBuf,
        iova: u64,
        release: Option<Box<dyn FnOnce() + Send + Sync>>,
    ) -> DmaRegion {
        let len = mem.capacity();
        let ptr = NonNull::new(mem.as_mut_ptr()).expect("IoBuf pointers are never null");
        DmaRegion {
            ptr,
            len,
            iova,
            release,
            _mem: mem,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device's address of byte 0.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// The host virtual address of byte 0 (for handing the memory to another engine).
    pub fn host_addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    fn check(&self, off: usize, n: usize) {
        assert!(
            off.checked_add(n).is_some_and(|e| e <= self.len),
            "DmaRegion access {off}+{n} outside {} bytes",
            self.len
        );
    }

    fn atomic32(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4);
        assert!(off.is_multiple_of(4), "unaligned dword access at {off}");
        // SAFETY: `off + 4 <= len` and `off` is 4-aligned inside a 4 KiB-aligned
        // allocation that lives as long as `self`; every concurrent access to these bytes
        // is either atomic (this method) or a device/raw copy ordered by the ring protocol.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(off).cast::<u32>()) }
    }

    /// Atomic (Acquire) little-endian dword read.
    pub fn read_u32(&self, off: usize) -> u32 {
        u32::from_le(self.atomic32(off).load(Ordering::Acquire))
    }

    /// Atomic (Release) little-endian dword write.
    pub fn write_u32(&self, off: usize, v: u32) {
        self.atomic32(off).store(v.to_le(), Ordering::Release);
    }

    pub fn write_u64(&self, off: usize, v: u64) {
        self.write_u32(off, v as u32);
        self.write_u32(off + 4, (v >> 32) as u32);
    }

    /// Copies `dst.len()` bytes from offset `off`.
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        // SAFETY: bounds checked above; `dst` is an exclusive caller slice that cannot
        // overlap this allocation (no reference into it is ever handed out).
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        }
    }

    /// Copies `src` to offset `off`.
    pub fn write(&self, off: usize, src: &[u8]) {
        self.check(off, src.len());
        // SAFETY: bounds checked above; `src` cannot overlap this allocation.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len())
        }
    }

    /// Zeroes the whole region.
    pub fn zero(&self) {
        // SAFETY: the whole allocation belongs to `self`; callers zero a region only
        // while the device is not using it (before a queue is created or after a reset).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), 0, self.len) }
    }
}

impl Drop for DmaRegion {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}
