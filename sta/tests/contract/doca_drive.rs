//! The doca engine on the DOCA double with an `nvme` namespace: the backend is the nvme
//! backend on the in-process emulated NVMe controller, so the engine hands the drive's own
//! I/O queue pair to DOCA (`doca_sta_be_add_queue` with the driver's SQ/CQ rings and the
//! BAR0 doorbell window) instead of the null backend, and the double's offloaded
//! READ/WRITE become NVMe commands in the emulated drive's queue.
//!
//! The emulator's BAR0 is not memory (its registers are method calls), so [`MemBar`]
//! stands in for a VFIO mapping of BAR0: the doorbell page is plain memory, and a small
//! thread forwards what lands there to the emulator's doorbell registers, as the PCIe
//! write from the DPA (or the double's CPU store into a VFIO mapping) would reach the
//! drive. No dma-buf exists here, so the engine takes the double's
//! `doca_double_mmap_set_bar_memrange` path (the one a stock kernel in the VM takes).
//!
//! What this proves: the engine registers the drive's rings, doorbell offsets and backend
//! NSID correctly, maps the allocator's memory into the drive at IOVA = VA (the drive
//! DMAs the host's data from and to it), tears the queue down in order, and the data the
//! host wrote is on the drive (read back from the emulator's media, and its command
//! counters moved). What it does not prove: the dma-buf registration (no kernel here
//! exports one), a real PCIe peer-to-peer write, NVIDIA's library.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use backend::nvme::{
    DeviceAccess, DeviceError, DmaBufExport, DmaRegion, EmuConfig, EmulatedController, NvmeBackend,
    NvmeOptions,
};
use backend::{Backend, IoBuf};
use sta::doca::{DocaIo, Sta};
use sta::QpHandle;

use crate::doca::{DocaLoop, LoopHost};
use crate::suite::{Fabric, BLOCK, BLOCKS};

/// BAR0's doorbell page (0x1000..0x2000) as memory.
const DB_BASE: usize = 0x1000;
const DB_SLOTS: usize = 1024;

/// The emulated controller with its doorbell page memory-mapped, as VFIO maps BAR0.
pub struct MemBar {
    emu: Arc<EmulatedController>,
    page: Box<[AtomicU32]>,
    /// Slots handed out through `bar0_addr` (the offload queue's window), watched.
    watched: Mutex<Vec<(usize, u32)>>,
    forwarded: AtomicU32,
}

impl fmt::Debug for MemBar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MemBar(emulated)")
    }
}

impl MemBar {
    pub fn new(emu: Arc<EmulatedController>) -> Arc<MemBar> {
        let bar = Arc::new(MemBar {
            emu,
            page: (0..DB_SLOTS).map(|_| AtomicU32::new(0)).collect(),
            watched: Mutex::new(Vec::new()),
            forwarded: AtomicU32::new(0),
        });
        let weak: Weak<MemBar> = Arc::downgrade(&bar);
        // Stops by itself once the device is gone.
        std::thread::spawn(move || {
            while let Some(b) = weak.upgrade() {
                b.forward();
                drop(b);
                std::thread::sleep(Duration::from_micros(50));
            }
        });
        bar
    }

    /// Doorbell stores that reached the emulator through the memory page.
    pub fn forwarded(&self) -> u32 {
        self.forwarded.load(Ordering::Relaxed)
    }

    fn forward(&self) {
        let mut w = self.watched.lock().unwrap();
        for (slot, last) in w.iter_mut() {
            let v = self.page[*slot].load(Ordering::Acquire);
            if v != *last {
                *last = v;
                self.emu.write32(DB_BASE + *slot * 4, v);
                self.forwarded.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl DeviceAccess for MemBar {
    fn name(&self) -> String {
        "emulated (doorbells in memory)".into()
    }
    fn read32(&self, off: usize) -> u32 {
        self.emu.read32(off)
    }
    fn write32(&self, off: usize, value: u32) {
        self.emu.write32(off, value)
    }
    fn enable_bus_master(&self) -> Result<(), DeviceError> {
        self.emu.enable_bus_master()
    }
    fn alloc_dma(&self, len: usize) -> Result<DmaRegion, DeviceError> {
        self.emu.alloc_dma(len)
    }
    fn map_dma(&self, buf: &IoBuf) -> Result<u64, DeviceError> {
        self.emu.map_dma(buf)
    }
    fn unmap_dma(&self, iova: u64, len: usize) {
        self.emu.unmap_dma(iova, len)
    }
    fn map_dma_at(&self, addr: usize, len: usize, iova: u64) -> Result<(), DeviceError> {
        self.emu.map_dma_at(addr, len, iova)
    }
    fn unmap_dma_at(&self, iova: u64, len: usize) {
        self.emu.unmap_dma_at(iova, len)
    }
    fn bar0_addr(&self, off: u64) -> Option<usize> {
        let off = off as usize;
        if !(DB_BASE..DB_BASE + DB_SLOTS * 4).contains(&off) {
            return None;
        }
        // Watch the 64-byte window from here (what the engine registers).
        let first = (off - DB_BASE) / 4;
        let mut w = self.watched.lock().unwrap();
        for s in first..(first + 16).min(DB_SLOTS) {
            if !w.iter().any(|(x, _)| *x == s) {
                w.push((s, self.page[s].load(Ordering::Relaxed)));
            }
        }
        Some(self.page.as_ptr() as usize + (off - DB_BASE))
    }
    fn export_bar0_dmabuf(&self, offset: u64, len: u64) -> Result<DmaBufExport, DeviceError> {
        self.emu.export_bar0_dmabuf(offset, len)
    }
}

/// [`DocaLoop`] with an nvme namespace on the emulated drive.
pub struct DocaDrive {
    inner: DocaLoop,
    pub emu: Arc<EmulatedController>,
    /// The memory-mapped BAR the backend was opened on (shared: the suite consumes the
    /// fabric, the test reads the forwarding count afterwards).
    pub bar: Arc<Mutex<Option<Arc<MemBar>>>>,
}

impl DocaDrive {
    pub fn new() -> DocaDrive {
        DocaDrive {
            inner: DocaLoop::new(),
            emu: EmulatedController::new(EmuConfig {
                namespaces: vec![BLOCKS],
                block_size: BLOCK,
                ..EmuConfig::default()
            }),
            bar: Arc::new(Mutex::new(None)),
        }
    }
}

impl Fabric for DocaDrive {
    type Engine = Sta;
    type Host = LoopHost;

    fn name(&self) -> &'static str {
        "doca engine on the DOCA double, nvme namespace on the emulated drive"
    }

    fn engine(&mut self, backend_timeout: Duration) -> Sta {
        self.inner.engine(backend_timeout)
    }

    fn backend(&mut self) -> Arc<dyn Backend> {
        let bar = MemBar::new(Arc::clone(&self.emu));
        *self.bar.lock().unwrap() = Some(Arc::clone(&bar));
        NvmeBackend::open(bar as Arc<dyn DeviceAccess>, NvmeOptions::default())
            .expect("nvme backend on the emulated drive")
    }

    fn stall(&mut self, _engine: &mut Sta, _on: bool) {
        panic!("the drive fabric runs no stall scenario");
    }

    fn counts_latency(&self) -> bool {
        false
    }

    fn unique_nqns(&self) -> bool {
        true
    }

    fn connect(&mut self, io: &mut DocaIo, user: u64) -> (QpHandle, LoopHost) {
        self.inner.connect(io, user)
    }
}
