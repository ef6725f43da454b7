//! Memory from the application's allocator (`doca_sta_mem_allocator_register`): data and
//! payload buffers with a PRP list page each, and the map from physical (bus) addresses
//! back to virtual ones that the RAM drive uses to follow PRPs, as a device's DMA would.

use std::collections::BTreeMap;

use doca_sys::DOCA_STA_VTOPHYS_ERROR;

use crate::contract::{self, broken, code, Res};
use crate::world::{Alloc, Buf};

pub const PAGE: usize = 4096;

#[derive(Default)]
pub struct MemMap {
    /// phys -> (len, va)
    by_phys: BTreeMap<u64, (usize, usize)>,
}

impl MemMap {
    pub fn insert(&mut self, va: usize, len: usize, phys: u64) {
        self.by_phys.insert(phys, (len, va));
    }
    pub fn remove(&mut self, phys: u64) {
        self.by_phys.remove(&phys);
    }
    /// The virtual address of `[phys, phys + len)` if one allocation holds all of it.
    pub fn to_va(&self, phys: u64, len: usize) -> Option<usize> {
        let (&base, &(blen, va)) = self.by_phys.range(..=phys).next_back()?;
        let off = (phys - base) as usize;
        (off + len <= blen).then_some(va + off)
    }
}

fn zmalloc(a: &Alloc, mem: &mut MemMap, len: usize) -> Res<(*mut u8, u64)> {
    let mut phys = 0u64;
    // SAFETY: the application registered this allocator with the documented prototype;
    // `phys` is a valid out pointer.
    let p = unsafe { (a.zmalloc)(len, PAGE, &mut phys) } as *mut u8;
    if p.is_null() {
        return code(doca_sys::DOCA_ERROR_NO_MEMORY);
    }
    if !(p as usize).is_multiple_of(PAGE) {
        return broken(
            &contract::ALLOCATOR,
            format!("zmalloc({len}, {PAGE}) returned {p:p}, not {PAGE}-byte aligned"),
        );
    }
    // SAFETY: zmalloc returned `len` bytes at `p`.
    let bytes = unsafe { std::slice::from_raw_parts(p, len) };
    if bytes.iter().any(|&b| b != 0) {
        return broken(
            &contract::ALLOCATOR,
            format!("zmalloc({len}) returned memory that is not zero-filled"),
        );
    }
    // SAFETY: as above; vtophys only reads the address.
    let v = unsafe { (a.vtophys)(p as *const _, len as u32) };
    if v == DOCA_STA_VTOPHYS_ERROR || v != phys {
        return broken(
            &contract::ALLOCATOR,
            format!(
                "vtophys({p:p}, {len}) = {v:#x} but zmalloc gave physical address {phys:#x} \
                 (the range must translate as one contiguous run)"
            ),
        );
    }
    mem.insert(p as usize, len, phys);
    Ok((p, phys))
}

/// A data buffer of `cap` bytes and its PRP list page.
pub fn alloc_buf(a: &Alloc, mem: &mut MemMap, cap: usize) -> Res<Buf> {
    let (va, phys) = zmalloc(a, mem, cap)?;
    let (prp, prp_phys) = match zmalloc(a, mem, PAGE) {
        Ok(x) => x,
        Err(e) => {
            mem.remove(phys);
            // SAFETY: `va` came from this allocator and is not used again.
            unsafe { (a.free)(va as *mut _) };
            return Err(e);
        }
    };
    Ok(Buf {
        va,
        phys,
        cap,
        prp_va: prp as *mut u64,
        prp_phys,
        mrs: Vec::new(),
    })
}

/// Give a buffer back to the application's allocator (its registrations must be gone).
pub fn free_buf(a: &Alloc, mem: &mut MemMap, b: Buf) {
    debug_assert!(b.mrs.is_empty());
    mem.remove(b.phys);
    mem.remove(b.prp_phys);
    // SAFETY: both came from this allocator; nothing refers to them any more.
    unsafe {
        (a.free)(b.va as *mut _);
        (a.free)(b.prp_va as *mut _);
    }
}

/// PRP1/PRP2 for `len` bytes at the start of `b` (filling its PRP list when needed).
pub fn prps(b: &Buf, len: usize) -> (u64, u64) {
    let pages = len.div_ceil(PAGE).max(1);
    match pages {
        1 => (b.phys, 0),
        2 => (b.phys, b.phys + PAGE as u64),
        n => {
            for i in 1..n {
                // SAFETY: the list page holds 512 entries; n <= max_io_size / PAGE <= 512.
                unsafe { b.prp_va.add(i - 1).write(b.phys + (i * PAGE) as u64) };
            }
            (b.phys, b.prp_phys)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phys_to_virt() {
        let mut m = MemMap::default();
        m.insert(0x7000_0000, 8192, 0x10_0000);
        m.insert(0x7100_0000, 4096, 0x20_0000);
        assert_eq!(m.to_va(0x10_0000, 8192), Some(0x7000_0000));
        assert_eq!(m.to_va(0x10_1000, 4096), Some(0x7000_1000));
        assert_eq!(m.to_va(0x10_1000, 4097), None, "runs past the allocation");
        assert_eq!(m.to_va(0x0f_ffff, 1), None);
        assert_eq!(m.to_va(0x20_0800, 16), Some(0x7100_0800));
        m.remove(0x20_0000);
        assert_eq!(m.to_va(0x20_0800, 16), None);
    }
}
