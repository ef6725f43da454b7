//! The double's own calls (declared in `include/doca_double.h`), for tests: contract mode,
//! the loopback host, the RAM drive's stall switch, the backend timeout.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_void};

use doca_sys::*;

use crate::contract::{self, broken, finish};
use crate::link::LoopHost;
use crate::out;
use crate::world::{ptr, world, Kind};

/// Marks the library as the double (the doca-sys loader looks for this symbol).
#[no_mangle]
pub extern "C" fn doca_double_version() -> *const c_char {
    concat!(
        "doca-double ",
        env!("CARGO_PKG_VERSION"),
        " (DOCA STA 3.3 C ABI)\0"
    )
    .as_ptr() as *const c_char
}

/// 1: contract violations return their error code and are kept for
/// `doca_double_take_violation`; 0: they abort the process (the default).
#[no_mangle]
pub extern "C" fn doca_double_set_contract_mode(report: c_int) {
    contract::set_report_mode(report != 0);
}

/// Copy the oldest kept violation message into `buf` (NUL-terminated, truncated to
/// `len`); 1 if there was one, 0 if none.
#[no_mangle]
pub unsafe extern "C" fn doca_double_take_violation(buf: *mut c_char, len: u32) -> c_int {
    let Some(m) = contract::take() else { return 0 };
    if !buf.is_null() && len > 0 {
        let n = m.len().min(len as usize - 1);
        // SAFETY: the caller gives `len` writable bytes; n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(m.as_ptr(), buf as *mut u8, n);
            *buf.add(n) = 0;
        }
    }
    1
}

/// Objects alive (contexts, QPs, subsystems, namespaces, backends and queues, tasks,
/// PEs, devices, mmaps, loopback ids).
#[no_mangle]
pub extern "C" fn doca_double_live_objects() -> u64 {
    world().live_objects() as u64
}

/// A loopback "connect request": give it to doca_sta_io_qp_accept/connect as the cm_id.
#[no_mangle]
pub unsafe extern "C" fn doca_double_loop_create(id: *mut *mut rdma_cm_id) -> doca_error_t {
    finish(
        "doca_double_loop_create",
        (|| {
            out::check(id, "cm_id")?;
            let mut w = world();
            let l = w.new_id(Kind::Loop);
            w.loops.insert(l, LoopHost::default());
            out::put(id, ptr(Kind::Loop, l))
        })(),
    )
}

fn loop_id(w: &crate::world::World, id: *const rdma_cm_id) -> Result<u64, contract::Broken> {
    let l = w.id_of(Kind::Loop, id as u64)?;
    if w.loops.contains_key(&l) {
        Ok(l)
    } else {
        Err(w.missing(Kind::Loop, l))
    }
}

#[no_mangle]
pub unsafe extern "C" fn doca_double_loop_destroy(id: *mut rdma_cm_id) -> doca_error_t {
    finish(
        "doca_double_loop_destroy",
        (|| {
            let mut w = world();
            let l = loop_id(&w, id)?;
            if w.loops[&l].attached {
                return broken(
                    &contract::TEARDOWN,
                    "loopback id destroyed while its QP exists",
                );
            }
            w.loops.remove(&l);
            Ok(())
        })(),
    )
}

/// Host memory the double may RDMA READ/WRITE under `rkey`.
#[no_mangle]
pub unsafe extern "C" fn doca_double_loop_add_region(
    id: *mut rdma_cm_id,
    rkey: u32,
    addr: *mut c_void,
    len: u64,
) -> doca_error_t {
    finish(
        "doca_double_loop_add_region",
        (|| {
            let mut w = world();
            let l = loop_id(&w, id)?;
            w.loops
                .get_mut(&l)
                .expect("live")
                .regions
                .push((rkey, addr as usize, len as usize));
            Ok(())
        })(),
    )
}

/// The host sends a capsule (SQE + in-capsule data).
#[no_mangle]
pub unsafe extern "C" fn doca_double_loop_send(
    id: *mut rdma_cm_id,
    capsule: *const c_void,
    len: u32,
) -> doca_error_t {
    finish(
        "doca_double_loop_send",
        (|| {
            out::check(capsule, "capsule")?;
            let mut w = world();
            let l = loop_id(&w, id)?;
            // SAFETY: `len` readable bytes at `capsule`.
            let c =
                unsafe { std::slice::from_raw_parts(capsule as *const u8, len as usize) }.to_vec();
            w.loops.get_mut(&l).expect("live").capsules.push_back(c);
            Ok(())
        })(),
    )
}

/// The next completion the host received: 1 and the CQE (and the rkey a SEND with
/// Invalidate named, else 0), or 0 when none is waiting.
#[no_mangle]
pub unsafe extern "C" fn doca_double_loop_recv(
    id: *mut rdma_cm_id,
    cqe: *mut u8,
    inval: *mut u32,
) -> c_int {
    let mut w = world();
    let Ok(l) = loop_id(&w, id) else { return -1 };
    let Some((c, inv)) = w.loops.get_mut(&l).expect("live").cqes.pop_front() else {
        return 0;
    };
    if !cqe.is_null() {
        // SAFETY: the caller gives 16 writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(c.as_ptr(), cqe, 16) };
    }
    if !inval.is_null() {
        // SAFETY: a valid out pointer.
        unsafe { inval.write(inv.unwrap_or(0)) };
    }
    1
}

/// The accept private data the QP sent to the loopback host; returns its length.
#[no_mangle]
pub unsafe extern "C" fn doca_double_loop_accept_data(
    id: *mut rdma_cm_id,
    buf: *mut u8,
    len: u32,
) -> c_int {
    let w = world();
    let Ok(l) = loop_id(&w, id) else { return -1 };
    let d = &w.loops[&l].accept_data;
    if !buf.is_null() {
        let n = d.len().min(len as usize);
        // SAFETY: the caller gives `len` writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), buf, n) };
    }
    d.len() as c_int
}

/// The host drops the connection (its QP goes to the error state).
#[no_mangle]
pub unsafe extern "C" fn doca_double_loop_disconnect(id: *mut rdma_cm_id) -> doca_error_t {
    finish(
        "doca_double_loop_disconnect",
        (|| {
            let mut w = world();
            let l = loop_id(&w, id)?;
            w.loops.get_mut(&l).expect("live").disconnected = true;
            Ok(())
        })(),
    )
}

/// Whether the loopback connection is up: 1 up, 0 down (either side dropped it: the host
/// with `doca_double_loop_disconnect`, the target with a disconnect task), -1 for an
/// unknown id.
#[no_mangle]
pub unsafe extern "C" fn doca_double_loop_connected(id: *mut rdma_cm_id) -> c_int {
    let w = world();
    let Ok(l) = loop_id(&w, id) else { return -1 };
    c_int::from(!w.loops[&l].disconnected)
}

/// Stall (1) or resume (0) the RAM drive of a backend: a stalled drive fetches nothing.
#[no_mangle]
pub unsafe extern "C" fn doca_double_null_drive_stall(
    be: *mut doca_sta_be_handle,
    stalled: c_int,
) -> doca_error_t {
    finish(
        "doca_double_null_drive_stall",
        (|| {
            let mut w = world();
            w.be(be)?.1.drive.stalled = stalled != 0;
            Ok(())
        })(),
    )
}

/// 1: a QP allocated from now on gets the handle of the QP destroyed last, if one was
/// destroyed since (as NVIDIA's library may, its handles being addresses), so tests can
/// show that nothing of the old QP reaches the new one; 0: handles are never reused again
/// (the default, which catches a destroyed handle's use as `arg.destroyed`).
#[no_mangle]
pub extern "C" fn doca_double_reuse_qp_handles(on: c_int) {
    world().reusable_qps = (on != 0).then(Vec::new);
}

/// Backend command timeout of a main context (default `DOCA_DOUBLE_BE_TIMEOUT_MS`, else
/// 30 s).
#[no_mangle]
pub unsafe extern "C" fn doca_double_set_be_timeout_ms(
    sta: *mut doca_sta,
    ms: u32,
) -> doca_error_t {
    finish(
        "doca_double_set_be_timeout_ms",
        (|| {
            let mut w = world();
            w.sta(sta)?.1.be_timeout = std::time::Duration::from_millis(ms as u64);
            Ok(())
        })(),
    )
}

/// `doca_double_mmap_set_bar_memrange`: a device BAR window mapped in this process (a
/// VFIO mmap of an NVMe drive's BAR0) registered as device memory without a dma-buf. For
/// kernels that cannot export a BAR as a dma-buf (no `VFIO_DEVICE_FEATURE_DMA_BUF`): the
/// double's "device" is host code, so it rings the doorbells with CPU stores into the
/// mapping, where DOCA on a BlueField would need the dma-buf for a peer-to-peer write.
/// The queue is then left to the device behind it, as with a dma-buf range.
#[no_mangle]
pub unsafe extern "C" fn doca_double_mmap_set_bar_memrange(
    m: *mut doca_mmap,
    addr: *mut c_void,
    len: usize,
) -> doca_error_t {
    finish(
        "doca_double_mmap_set_bar_memrange",
        (|| {
            let mut w = world();
            let id = crate::core_api::configurable(&mut w, m)?;
            if addr.is_null() || len == 0 {
                return broken(
                    &contract::NULL_ARG,
                    "BAR range with a NULL address or zero length",
                );
            }
            let x = w.mmaps.get_mut(&id).expect("live");
            x.addr = addr as usize;
            x.len = len;
            x.dmabuf = true;
            Ok(())
        })(),
    )
}
