//! The emulated controller's DMA engine: the only place where the emulator touches host
//! memory by address, as a real device does through the IOMMU.
//!
//! The emulator learns ranges from [`DeviceAccess::map_dma`](super::super::DeviceAccess)
//! and `alloc_dma`, and copies bytes in and out of them while it executes a command that
//! points there. That is sound for the same reason real DMA is: the driver maps a buffer
//! it owns, hands its address to the device only in a command, and does not touch, move
//! or free the buffer until that command's completion is reaped (or the controller is
//! reset, which drops every command the emulator holds). Addresses outside every mapped
//! range never reach this module: the emulator translates and bounds-checks first and
//! answers Data Transfer Error instead, like an IOMMU fault.

// `unsafe` allowed here: the emulated device copies to and from host memory by address, as
// real DMA does.
#![allow(unsafe_code)]

use crate::IoBuf;

use super::super::DmaRegion;

/// A mapped host range: start address and length.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostRange {
    addr: usize,
    len: usize,
}

impl HostRange {
    pub(crate) fn of_buf(buf: &IoBuf) -> HostRange {
        HostRange {
            addr: buf.as_ptr() as usize,
            len: buf.capacity(),
        }
    }

    pub(crate) fn of_region(r: &DmaRegion) -> HostRange {
        HostRange {
            addr: r.host_addr(),
            len: r.len(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Device read: copies `dst.len()` bytes from `off`.
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) {
        assert!(off.checked_add(dst.len()).is_some_and(|e| e <= self.len));
        // SAFETY: the range is a live mapping (module docs: the driver keeps a mapped
        // buffer alive while a command points at it, and only such commands reach here);
        // `off + len` is inside it (asserted); `dst` is the emulator's own buffer and
        // cannot overlap host memory lent to the device.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.addr + off) as *const u8,
                dst.as_mut_ptr(),
                dst.len(),
            )
        }
    }

    /// Device write: copies `src` to `off`.
    pub(crate) fn write(&self, off: usize, src: &[u8]) {
        assert!(off.checked_add(src.len()).is_some_and(|e| e <= self.len));
        // SAFETY: as in `read`; the driver does not read these bytes until the command's
        // completion is posted, which happens after this copy under the emulator's lock.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), (self.addr + off) as *mut u8, src.len())
        }
    }

    /// Device write of one little-endian dword with Release ordering (the CQE dword that
    /// carries the phase tag, which the driver polls with an atomic Acquire load).
    pub(crate) fn write_u32_release(&self, off: usize, v: u32) {
        assert!(off.is_multiple_of(4) && self.addr.is_multiple_of(4));
        assert!(off.checked_add(4).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds and 4-aligned (asserted) inside a live mapping (module docs);
        // the driver accesses this dword only atomically.
        let a = unsafe { std::sync::atomic::AtomicU32::from_ptr((self.addr + off) as *mut u32) };
        a.store(v.to_le(), std::sync::atomic::Ordering::Release);
    }
}
