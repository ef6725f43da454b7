//! The P2P path: one NVMe I/O queue pair handed to an offload engine (DOCA STA's
//! `doca_sta_be_add_queue`, see `../shared/doca-sta-api.md` 5.6 and 5.13) instead of
//! being driven by this process.
//!
//! The engine needs three things per queue: the SQ ring and the CQ ring (host DMA memory:
//! IOVA for the drive, host VA for registering it with its own device) and the doorbells,
//! which live in the drive's BAR0. The engine's device reaches the doorbells by PCIe
//! peer-to-peer, so BAR0 (a window of it) is exported as a **dma-buf**:
//!
//! - Upstream Linux: `VFIO_DEVICE_FEATURE` with `VFIO_DEVICE_FEATURE_DMA_BUF` (feature 11,
//!   `struct vfio_device_feature_dma_buf { region_index, open_flags, flags, nr_ranges,
//!   dma_ranges[] }`, page-aligned ranges), which returns a new dma-buf fd. See
//!   `kernel-patches/README.md` for the versions that have it.
//! - NVIDIA's patched kernels (the SPDK fork's `lib/env_dpdk/dmabuf.c`):
//!   `VFIO_DEVICE_P2P_DMA_BUF = _IO(VFIO_TYPE, VFIO_BASE + 22)` with `{ region_index,
//!   open_flags, offset, length }` (`length` 0 = the whole BAR). Tried only when the
//!   upstream feature is absent: upstream proposals use the same ioctl number for other
//!   things.
//!
//! [`OffloadQueue`] owns the queue pair while the engine uses it; dropping it zeroes the
//! CQ (what SPDK does, so stale offload completions cannot confuse a later owner),
//! deletes the queue pair on the drive and frees the ring memory.

#![forbid(unsafe_code)]

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::driver::{Controller, Ring};
use crate::Error;

/// Which kernel interface produced a dma-buf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaBufInterface {
    /// `VFIO_DEVICE_FEATURE_DMA_BUF` (upstream).
    Upstream,
    /// `VFIO_DEVICE_P2P_DMA_BUF` (NVIDIA's patched kernels).
    NvidiaP2p,
}

/// A dma-buf exporting part of BAR0.
#[derive(Debug)]
pub struct DmaBufExport {
    pub fd: OwnedFd,
    /// Where the dma-buf starts in BAR0 (bytes).
    pub bar_offset: u64,
    /// Its length (bytes).
    pub len: u64,
    pub interface: DmaBufInterface,
}

/// One ring in host DMA memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingMemory {
    /// The drive's address of entry 0 (IOVA).
    pub iova: u64,
    /// This process's virtual address of entry 0 (what `doca_mmap_set_memrange` takes).
    pub host_addr: usize,
    /// Bytes: entries x 64 (SQ) or x 16 (CQ).
    pub bytes: usize,
}

/// The doorbells of one queue pair, as the engine must address them.
#[derive(Debug)]
pub struct DoorbellWindow {
    /// BAR0 as a dma-buf (`None` when the kernel cannot export it: the engine cannot ring
    /// the doorbells by P2P then; the reason is in `dmabuf_error`).
    pub dmabuf: Option<DmaBufExport>,
    pub dmabuf_error: Option<String>,
    /// Start of the 64-byte-aligned doorbell window in BAR0 (DOCA registers a 64-byte
    /// window aligned down from the SQ tail doorbell).
    pub window_bar_offset: u64,
    /// Length of the window (64 unless the doorbell stride spreads the two doorbells
    /// further apart).
    pub window_len: u64,
    /// SQ tail doorbell, bytes from the window start (`sq_db_offset`).
    pub sq_tail_offset: u16,
    /// CQ head doorbell, bytes from the window start (`cq_db_offset`).
    pub cq_head_offset: u16,
}

impl DoorbellWindow {
    /// Offset of the window inside the dma-buf (for `doca_mmap_set_dmabuf_memrange`).
    pub fn window_dmabuf_offset(&self) -> Option<u64> {
        self.dmabuf
            .as_ref()
            .map(|d| self.window_bar_offset - d.bar_offset)
    }
}

/// An NVMe I/O queue pair given to an offload engine. Created by
/// [`NvmeBackend::offload_queue`](super::NvmeBackend::offload_queue).
#[derive(Debug)]
pub struct OffloadQueue {
    /// Queue ID on the drive.
    pub qid: u16,
    /// Entries of both rings (a power of two, as STA requires).
    pub entries: u16,
    /// Namespace ID on the drive (`be_ns_id`) and its block size.
    pub nsid: u32,
    pub block_size: u32,
    pub sq: RingMemory,
    pub cq: RingMemory,
    pub doorbells: DoorbellWindow,
    ring: Option<Ring>,
    ctrl: Arc<Controller>,
}

impl OffloadQueue {
    pub(super) fn new(
        ctrl: Arc<Controller>,
        ring: Ring,
        nsid: u32,
        block_size: u32,
    ) -> OffloadQueue {
        let (sq_db, cq_db) = ring.doorbells();
        let start = (sq_db.min(cq_db) as u64) & !63;
        let end = ((sq_db.max(cq_db) as u64) + 4).next_multiple_of(64);
        let dev = Arc::clone(ctrl.device());
        // dma-bufs of MMIO are page granular: export the page(s) holding the window.
        let page_start = start & !4095;
        let page_len = (end - page_start).next_multiple_of(4096);
        let (dmabuf, dmabuf_error) = match dev.export_bar0_dmabuf(page_start, page_len) {
            Ok(d) => (Some(d), None),
            Err(e) => (None, Some(e.to_string())),
        };
        OffloadQueue {
            qid: ring.qid,
            entries: ring.entries,
            nsid,
            block_size,
            sq: RingMemory {
                iova: ring.sq.iova(),
                host_addr: ring.sq.host_addr(),
                bytes: usize::from(ring.entries) * 64,
            },
            cq: RingMemory {
                iova: ring.cq.iova(),
                host_addr: ring.cq.host_addr(),
                bytes: usize::from(ring.entries) * 16,
            },
            doorbells: DoorbellWindow {
                dmabuf,
                dmabuf_error,
                window_bar_offset: start,
                window_len: end - start,
                sq_tail_offset: (sq_db as u64 - start) as u16,
                cq_head_offset: (cq_db as u64 - start) as u16,
            },
            ring: Some(ring),
            ctrl,
        }
    }

    /// This process's address of the doorbell window (BAR0 memory-mapped through VFIO):
    /// the address `doca_mmap_set_dmabuf_memrange` takes with the dma-buf, and the one a
    /// host-CPU double writes the doorbells at. `None` when BAR0 is not memory-mapped
    /// (the emulated controller, a BAR reached by pread/pwrite).
    pub fn doorbell_window_addr(&self) -> Option<usize> {
        self.ctrl
            .device()
            .bar0_addr(self.doorbells.window_bar_offset)
    }

    /// Makes the engine's memory (`len` bytes at `addr`, data buffers and anything its
    /// commands point at) reachable by this drive at IOVA = `addr`, the address the
    /// engine's allocator reports as the DMA address. Undo with
    /// [`OffloadQueue::unmap_engine_memory`] before the memory is freed.
    pub fn map_engine_memory(&self, addr: usize, len: usize) -> Result<(), Error> {
        self.ctrl
            .device()
            .map_dma_at(addr, len, addr as u64)
            .map_err(|e| {
                Error::Invalid(format!(
                    "nvme {}: cannot map offload engine memory {addr:#x}+{len:#x} for the \
                     drive: {e}",
                    self.ctrl.device().name()
                ))
            })
    }

    /// Undoes one [`OffloadQueue::map_engine_memory`].
    pub fn unmap_engine_memory(&self, addr: usize, len: usize) {
        self.ctrl.device().unmap_dma_at(addr as u64, len);
    }

    /// The ring memory and doorbells, for a test double that plays the engine in this
    /// process (it writes SQEs, rings doorbells through the device, reads CQEs).
    pub fn ring_mut(&mut self) -> Option<&mut Ring> {
        self.ring.as_mut()
    }

    /// The controller this queue lives on.
    pub fn controller(&self) -> &Arc<Controller> {
        &self.ctrl
    }
}

impl Drop for OffloadQueue {
    fn drop(&mut self) {
        if let Some(ring) = self.ring.take() {
            ring.cq.zero();
            self.ctrl.delete_io_pair(ring, true);
        }
    }
}
