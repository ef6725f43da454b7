//! Checks the BAR0 dma-buf export on a real kernel: opens an NVMe drive bound to
//! vfio-pci, exports BAR0's first two pages (registers and the first doorbells) as a
//! dma-buf through `VfioDevice::export_bar0_dmabuf`, maps the dma-buf and compares what
//! it reads with what VFIO's own BAR access reads. Then it hands out an offload queue and
//! prints the doorbell window the engine would register. Prints `PASS name` / `FAIL
//! name: why` lines and exits non-zero on any failure; `SKIPPED: why` (exit 0) when the
//! kernel has no dma-buf export.
//!
//! `dmabuf_check 0000:00:04.0` (run inside the interop guest by the `kernel-dmabuf`
//! scenario, on the kernel built from `kernel-patches/`).

// `unsafe` allowed here: it mmaps the exported dma-buf and reads device registers through
// it.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;
use std::process::ExitCode;

use backend::nvme::device::DeviceError;
use backend::nvme::spec;
use backend::nvme::vfio::VfioDevice;
use backend::nvme::{DeviceAccess, DmaBufInterface, NvmeBackend, NvmeOptions};

fn main() -> ExitCode {
    let bdf = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "0000:00:04.0".into());
    let mut failed = false;
    let mut check = |name: &str, ok: bool, why: String| {
        if ok {
            println!("PASS {name}");
        } else {
            println!("FAIL {name}: {why}");
            failed = true;
        }
    };
    let dev = match VfioDevice::open(&bdf) {
        Ok(d) => d,
        Err(e) => {
            println!("FAIL open: {e}");
            return ExitCode::FAILURE;
        }
    };
    let export = match dev.export_bar0_dmabuf(0, 8192) {
        Ok(x) => x,
        Err(DeviceError::Unsupported(why)) => {
            println!("SKIPPED: this kernel cannot export BAR0 as a dma-buf: {why}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            println!("FAIL export: {e}");
            return ExitCode::FAILURE;
        }
    };
    check(
        "export-upstream-interface",
        export.interface == DmaBufInterface::Upstream,
        format!("{:?}", export.interface),
    );
    check(
        "export-range",
        export.bar_offset == 0 && export.len == 8192,
        format!("{}+{}", export.bar_offset, export.len),
    );
    // SAFETY: maps 8 KiB of the dma-buf fd we own, shared, at a kernel-chosen address;
    // checked for MAP_FAILED; unmapped below before the fd is closed.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            export.fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        check(
            "dmabuf-mmap",
            false,
            std::io::Error::last_os_error().to_string(),
        );
        return ExitCode::FAILURE;
    }
    check("dmabuf-mmap", true, String::new());
    let read32 = |off: usize| {
        // SAFETY: `off + 4 <= 8192`, 4-aligned, inside the live mapping made above.
        unsafe { std::ptr::read_volatile(p.cast::<u8>().add(off).cast::<u32>()) }
    };
    let cap_lo = read32(spec::REG_CAP);
    let vs = read32(spec::REG_VS);
    check(
        "dmabuf-reads-cap",
        cap_lo == dev.read32(spec::REG_CAP) && cap_lo != u32::MAX,
        format!("{cap_lo:#x} vs {:#x}", dev.read32(spec::REG_CAP)),
    );
    check(
        "dmabuf-reads-vs",
        vs == dev.read32(spec::REG_VS) && vs >> 16 >= 1,
        format!("{vs:#x}"),
    );
    println!("RESULT dmabuf_cap_lo={cap_lo:#x} vs={vs:#x}");
    // SAFETY: the mapping made above, unmapped once.
    unsafe { libc::munmap(p, 8192) };
    drop(export);

    // The offload hand-off with a real dma-buf.
    let be = match NvmeBackend::open(
        dev.clone() as std::sync::Arc<dyn DeviceAccess>,
        NvmeOptions::default(),
    ) {
        Ok(b) => b,
        Err(e) => {
            println!("FAIL controller-init: {e}");
            return ExitCode::FAILURE;
        }
    };
    match be.offload_queue(128) {
        Ok(q) => {
            let db = &q.doorbells;
            println!(
                "RESULT offload_queue qid={} entries={} sq_iova={:#x} cq_iova={:#x} window_bar_offset={:#x} sq_db={} cq_db={} dmabuf={:?}",
                q.qid,
                q.entries,
                q.sq.iova,
                q.cq.iova,
                db.window_bar_offset,
                db.sq_tail_offset,
                db.cq_head_offset,
                db.dmabuf.as_ref().map(|d| (d.bar_offset, d.len, d.interface))
            );
            check(
                "offload-queue-dmabuf",
                db.dmabuf.is_some() && db.window_dmabuf_offset().is_some(),
                db.dmabuf_error.clone().unwrap_or_default(),
            );
        }
        Err(e) => check("offload-queue", false, e.to_string()),
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
