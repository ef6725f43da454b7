//! The allocator handed to `doca_sta_mem_allocator_register` (doca-sta-api.md 3.4, 5.4):
//! zeroed, cache-line (or more) aligned, pinned memory, and its DMA address.
//!
//! What `vtophys` returns: the IOVA a device uses for the memory. Under VFIO (the IOMMU
//! on, which `nvmf-target preflight` checks) an address is what the process mapped into
//! the device's container; this allocator's IOVA is the virtual address (SPDK's
//! `iova-mode va`), for every byte of an allocation (one contiguous run, which DOCA
//! requires). Memory not from this allocator has no IOVA (`DOCA_STA_VTOPHYS_ERROR`).
//! What is not done yet: mapping this memory into the VFIO container of each NVMe drive
//! handed to DOCA (at IOVA = VA; the nvme backend's own buffers use IOVAs from 4 GiB to
//! 512 GiB, below any user-space address, so the two cannot collide). Until then only
//! DOCA's own devices (and the double) use these addresses, which is all the null backend
//! needs. Without an IOMMU a device would need physical addresses; not supported.
//!
//! Pinning: every allocation is `mlock`ed. With NVIDIA's library a failed `mlock` fails
//! the allocation (DOCA then reports `DOCA_ERROR_NO_MEMORY`; raise `LimitMEMLOCK`); with
//! the test double, whose "device" is host code, it is logged once and tolerated.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use doca_sys::DOCA_STA_VTOPHYS_ERROR;

const PAGE: usize = 4096;

fn allocations() -> std::sync::MutexGuard<'static, BTreeMap<usize, Layout>> {
    static A: Mutex<BTreeMap<usize, Layout>> = Mutex::new(BTreeMap::new());
    A.lock().unwrap_or_else(|e| e.into_inner())
}

/// `doca_sta_zmalloc_cb_t`.
pub(crate) unsafe extern "C" fn zmalloc(size: usize, align: usize, phys: *mut u64) -> *mut c_void {
    if align != 0 && !align.is_power_of_two() {
        return std::ptr::null_mut();
    }
    // Whole pages: mlock and munlock work on pages, so no two allocations share one.
    let align = align.max(PAGE);
    let Ok(l) = Layout::from_size_align(size.max(1).next_multiple_of(PAGE), align) else {
        return std::ptr::null_mut();
    };
    // SAFETY: a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(l) };
    if p.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: the range we just allocated.
    if unsafe { libc::mlock(p as *const c_void, l.size()) } != 0 {
        let err = std::io::Error::last_os_error();
        let double = super::LIB
            .get()
            .and_then(|r| r.as_ref().ok())
            .is_some_and(|d| d.is_double());
        if !double {
            tracing::error!(
                "doca: cannot pin {} bytes for DOCA STA (mlock: {err}); raise the memlock \
                 limit (LimitMEMLOCK=infinity in the unit file)",
                l.size()
            );
            // SAFETY: allocated above with this layout.
            unsafe { std::alloc::dealloc(p, l) };
            return std::ptr::null_mut();
        }
        static WARNED: AtomicBool = AtomicBool::new(false);
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "doca: memory not pinned (mlock: {err}); tolerated with the DOCA double"
            );
        }
    }
    allocations().insert(p as usize, l);
    if !phys.is_null() {
        // SAFETY: DOCA's out pointer.
        unsafe { phys.write(p as u64) };
    }
    p as *mut c_void
}

/// `doca_sta_free_cb_t`.
pub(crate) unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    let Some(l) = allocations().remove(&(p as usize)) else {
        tracing::error!("doca: free of memory the allocator did not hand out");
        return;
    };
    // SAFETY: allocated by `zmalloc` with this layout, unused by DOCA from now on.
    unsafe {
        libc::munlock(p as *const c_void, l.size());
        std::alloc::dealloc(p as *mut u8, l);
    }
}

/// `doca_sta_vtophys_cb_t`: the IOVA of `[buf, buf + size)`, which must lie inside one
/// allocation.
pub(crate) unsafe extern "C" fn vtophys(buf: *const c_void, size: u32) -> u64 {
    let a = allocations();
    let p = buf as usize;
    match a.range(..=p).next_back() {
        Some((&base, l)) if p + size as usize <= base + l.size() => p as u64,
        _ => DOCA_STA_VTOPHYS_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_zeroed_aligned_and_translate_inside_only() {
        let mut phys = 0u64;
        // SAFETY: our allocator's contract.
        unsafe {
            let p = zmalloc(1000, 4096, &mut phys);
            assert!(!p.is_null());
            assert_eq!(p as usize % 4096, 0);
            assert_eq!(phys, p as u64);
            assert!(std::slice::from_raw_parts(p as *const u8, 1000)
                .iter()
                .all(|&b| b == 0));
            assert_eq!(vtophys(p, 1000), p as u64);
            assert_eq!(vtophys((p as *const u8).add(10).cast(), 990), p as u64 + 10);
            assert_eq!(vtophys(p, 4096), p as u64, "whole pages");
            assert_eq!(vtophys(p, 4097), DOCA_STA_VTOPHYS_ERROR);
            assert_eq!(vtophys(std::ptr::null(), 1), DOCA_STA_VTOPHYS_ERROR);
            free(p);
            assert_eq!(vtophys(p, 1), DOCA_STA_VTOPHYS_ERROR);
            assert!(
                zmalloc(64, 3, std::ptr::null_mut()).is_null(),
                "align not a power of two"
            );
        }
    }
}
