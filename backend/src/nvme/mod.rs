//! The `nvme` backend: NVMe drives driven from user space over VFIO (SPDK's way, no
//! DPDK), and the queue hand-off for the P2P offload path.
//!
//! # Architecture (OpenVMM's nvme_driver layering)
//!
//! ```text
//!  NvmeBackend (Backend)  ──create_queue──▶  NvmeQueue (BackendQueue, per IO thread)
//!        │                                        │ SQ/CQ ring, command IDs, PRP/SGL,
//!        │ Arc<Controller>                        │ map cache, timeouts/abort/reset
//!        ▼                                        ▼
//!  Controller (driver.rs): bring-up, admin queue, Identify, Create/Delete queues,
//!        │                 Abort, Get Log Page, reset, removal
//!        ▼
//!  dyn DeviceAccess (device.rs): BAR0 read/write, config space, DMA alloc/map
//!        ├── VfioDevice (vfio.rs)            the real thing, the only `unsafe` besides
//!        │                                   DmaRegion's accessors
//!        └── EmulatedController (emu/)       in-process NVMe controller for tests
//! ```
//!
//! `spec.rs`, `driver.rs`, `queue.rs`, `p2p.rs` and `emu/ctrl.rs` are
//! `#![forbid(unsafe_code)]`: the driver logic is tested in full against the emulator.
//!
//! # What it does
//!
//! - Opens the function through its IOMMU group (VFIO container/group, type-1 v2), maps
//!   BAR0, sets Bus Master, disables/enables the controller with a polled admin queue,
//!   Identify Controller/Namespace, Set Features (Number of Queues).
//! - One I/O SQ/CQ pair per [`Backend::create_queue`] (per IO thread), polled, no
//!   interrupts. Read, Write (FUA), Flush, Write Zeroes (or zero writes when the drive has
//!   none), Deallocate (Dataset Management, or Write Zeroes with DEAC).
//! - Data moves without copies: the engine's pool buffers are mapped for the device on
//!   first use and cached by buffer id (bounded; `queue.rs`). SGLs when Identify SGLS
//!   says so, PRPs (with a PRP list page per command ID) otherwise. MDTS respected by
//!   splitting requests.
//! - Timeouts: Abort, then controller reset (backing off between resets a timed-out
//!   command causes); outstanding commands are retried on the rebuilt queues (bounded),
//!   then fail alone with Command Abort Requested. Creating and deleting queues, Aborts,
//!   resets and re-creating the queues run on the controller's service thread, never on
//!   an IO thread (a new queue holds its requests until its pair exists): a drive whose
//!   admin queue stops answering, or that takes its full CAP.TO to come ready, holds its
//!   own queues' commands but no other backend's. The drive's own error statuses go to
//!   the host as the drive gave them. Only a controller that is removed (surprise removal,
//!   the kernel's removal request) or fails for good (a reset that fails) fails the
//!   namespace with [`IoStatus::Unavailable`](crate::IoStatus), which the engine answers
//!   with Internal Path Error and takes the namespace out.
//! - The drive's SMART / Health log through [`Backend::health_log`].
//! - [`NvmeBackend::offload_queue`]: an I/O queue pair plus a BAR0 doorbell dma-buf for
//!   an offload engine (`p2p.rs`).
//!
//! # What it does not do
//!
//! Interrupts, metadata / protection information, namespace management, multiple
//! namespaces' formats other than the one in use, the iommufd/cdev VFIO interface,
//! Compare, reservations, controller memory buffers, asynchronous events.

pub mod device;
pub mod driver;
pub mod emu;
pub mod p2p;
pub mod queue;
pub mod spec;
pub mod vfio;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

pub use device::{DeviceAccess, DeviceError, DmaRegion};
pub use driver::{Controller, DriverError, DriverOptions};
pub use emu::{EmuConfig, EmulatedController};
pub use p2p::{DmaBufExport, DmaBufInterface, DoorbellWindow, OffloadQueue, RingMemory};
pub use queue::NvmeQueue;

use crate::{Backend, BackendQueue, Error};

/// How to run one namespace of a drive.
#[derive(Clone, Debug)]
pub struct NvmeOptions {
    /// Namespace ID on the drive.
    pub nsid: u32,
    /// A command outstanding this long is aborted.
    pub io_timeout: Duration,
    /// An aborted command still outstanding this long after the Abort: controller reset.
    pub abort_timeout: Duration,
    /// How often a busy queue checks for timeouts and controller health.
    pub check_interval: Duration,
    /// Resubmissions of one command after Abort / reset / "retry" statuses.
    pub max_retries: u8,
    /// Entries per I/O queue (0: the next power of two above the requested depth, capped
    /// by CAP.MQES).
    pub queue_entries: u32,
    /// Bound of the per-queue buffer mapping cache: entries and bytes.
    pub map_cache_entries: usize,
    pub map_cache_bytes: usize,
    pub driver: DriverOptions,
}

impl Default for NvmeOptions {
    fn default() -> Self {
        NvmeOptions {
            nsid: 1,
            io_timeout: Duration::from_secs(8),
            abort_timeout: Duration::from_secs(2),
            check_interval: Duration::from_millis(10),
            max_retries: 3,
            queue_entries: 0,
            map_cache_entries: 4096,
            map_cache_bytes: 1 << 30,
            driver: DriverOptions::default(),
        }
    }
}

/// One namespace of an NVMe drive, exported as a block backend.
#[derive(Debug)]
pub struct NvmeBackend {
    ctrl: Arc<Controller>,
    pub(crate) nsid: u32,
    pub(crate) block_size: u32,
    pub(crate) num_blocks: u64,
    /// Deallocate may use Dataset Management (the drive reads deallocated blocks as 0).
    pub(crate) dsm_zeroes: bool,
    pub(crate) opts: NvmeOptions,
    desc: String,
}

fn driver_err(what: &str, e: DriverError) -> Error {
    Error::Invalid(format!("{what}: {e}"))
}

/// Controllers opened over VFIO in this process, by PCI address: a VFIO group can be
/// opened once, so namespaces of one drive share its controller.
fn registry() -> &'static Mutex<HashMap<String, Weak<Controller>>> {
    static R: OnceLock<Mutex<HashMap<String, Weak<Controller>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

impl NvmeBackend {
    /// Namespace `opts.nsid` of the drive at PCI address `pci` (bound to vfio-pci).
    /// Namespaces of the same drive share one controller.
    pub fn open_pci(pci: &str, opts: NvmeOptions) -> Result<Arc<NvmeBackend>, Error> {
        let ctrl = {
            let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
            match reg.get(pci).and_then(Weak::upgrade) {
                Some(c) if !c.is_failed() => c,
                _ => {
                    let dev = vfio::VfioDevice::open(pci)
                        .map_err(|e| Error::Invalid(format!("nvme {pci}: {e}")))?;
                    let c = Controller::init(dev, opts.driver.clone())
                        .map_err(|e| driver_err(&format!("nvme {pci}"), e))?;
                    reg.insert(pci.to_owned(), Arc::downgrade(&c));
                    c
                }
            }
        };
        Self::with_controller(ctrl, opts)
    }

    /// Namespace `opts.nsid` behind any device (the emulator in tests).
    pub fn open(dev: Arc<dyn DeviceAccess>, opts: NvmeOptions) -> Result<Arc<NvmeBackend>, Error> {
        let name = dev.name();
        let ctrl = Controller::init(dev, opts.driver.clone())
            .map_err(|e| driver_err(&format!("nvme {name}"), e))?;
        Self::with_controller(ctrl, opts)
    }

    /// Another namespace on an already initialised controller.
    pub fn with_controller(
        ctrl: Arc<Controller>,
        opts: NvmeOptions,
    ) -> Result<Arc<NvmeBackend>, Error> {
        let name = ctrl.device().name();
        let ns = ctrl
            .identify_namespace(opts.nsid)
            .map_err(|e| driver_err(&format!("nvme {name} namespace {}", opts.nsid), e))?;
        if ns.block_size < 512 || ns.block_size > 65536 {
            return Err(Error::Invalid(format!(
                "nvme {name} namespace {}: unsupported LBA format (block size {})",
                opts.nsid, ns.block_size
            )));
        }
        if ns.ms != 0 {
            return Err(Error::Invalid(format!(
                "nvme {name} namespace {}: formatted with {} bytes of metadata per block, \
                 which this backend does not support",
                opts.nsid, ns.ms
            )));
        }
        let id = ctrl.identity();
        tracing::info!(
            "nvme {name}: {} {} fw {}, MDTS {:?} bytes, SGL {}, VWC {}, ONCS {:#x}, namespace {} DLFEAT {:#x}",
            id.model,
            id.serial,
            id.firmware,
            ctrl.max_transfer(),
            id.supports_sgl(),
            id.vwc,
            id.oncs,
            opts.nsid,
            ns.dlfeat
        );
        let desc = format!(
            "nvme:{name}/ns{} ({} {}, {} x {} B, {})",
            opts.nsid,
            id.model,
            id.serial,
            ns.nsze,
            ns.block_size,
            if opts.driver.use_sgl && id.supports_sgl() {
                "SGL"
            } else {
                "PRP"
            }
        );
        Ok(Arc::new(NvmeBackend {
            nsid: opts.nsid,
            block_size: ns.block_size,
            num_blocks: ns.nsze,
            dsm_zeroes: ns.deallocate_reads_zeroes(),
            opts,
            desc,
            ctrl,
        }))
    }

    pub fn controller(&self) -> &Arc<Controller> {
        &self.ctrl
    }

    pub fn nsid(&self) -> u32 {
        self.nsid
    }

    /// Whether this namespace's commands carry SGLs (drive supports them and the options
    /// allow them; per namespace, since namespaces of one drive share its controller).
    pub fn use_sgl(&self) -> bool {
        self.opts.driver.use_sgl && self.ctrl.identity().supports_sgl()
    }

    /// A queue of the concrete type (tests and benchmarks want its counters).
    pub fn create_nvme_queue(self: &Arc<Self>, depth: u32) -> Result<NvmeQueue, Error> {
        NvmeQueue::new(Arc::clone(self), depth).map_err(|e| driver_err(&self.desc, e))
    }

    /// An I/O queue pair of `entries` entries (rounded down to a power of two, capped by
    /// CAP.MQES) handed to an offload engine, with BAR0's doorbell window exported as a
    /// dma-buf where the kernel can (see [`p2p`]). This process does not drive it.
    pub fn offload_queue(self: &Arc<Self>, entries: u32) -> Result<OffloadQueue, Error> {
        self.make_offload_queue(entries)
    }

    fn make_offload_queue(&self, entries: u32) -> Result<OffloadQueue, Error> {
        let n = self.ctrl.io_queue_entries(entries);
        let ring = self
            .ctrl
            .create_io_pair(n)
            .map_err(|e| driver_err(&self.desc, e))?;
        Ok(OffloadQueue::new(
            Arc::clone(&self.ctrl),
            ring,
            self.nsid,
            self.block_size,
        ))
    }
}

impl Backend for NvmeBackend {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn num_blocks(&self) -> u64 {
        self.num_blocks
    }

    fn volatile_write_cache(&self) -> bool {
        self.ctrl.identity().vwc
    }

    fn describe(&self) -> String {
        self.desc.clone()
    }

    fn create_queue(self: Arc<Self>, depth: u32) -> Result<Box<dyn BackendQueue>, Error> {
        Ok(Box::new(self.create_nvme_queue(depth)?))
    }

    /// Flush through a short-lived queue of its own (used at shutdown). Then waits
    /// (bounded) for the service thread to delete the queues dropped so far, so that the
    /// controller shuts down (CC.SHN) when the caller drops the last namespace rather than
    /// later on the service thread, perhaps after the process exited.
    fn flush_sync(&self) -> Result<(), Error> {
        let result = self.flush_now();
        let limit = self.opts.driver.admin_timeout * 2 + Duration::from_secs(1);
        if !self.ctrl.is_failed() && !self.ctrl.settle(limit) {
            tracing::warn!(
                "{}: queues still being deleted after {limit:?}; the drive may be shut \
                 down late or not at all",
                self.desc
            );
        }
        result
    }

    fn health_log(&self) -> Option<[u8; 512]> {
        self.ctrl.health_log().ok()
    }

    fn offload_queue(&self, entries: u32) -> Option<Result<OffloadQueue, Error>> {
        Some(self.make_offload_queue(entries))
    }
}

impl NvmeBackend {
    /// The flush of [`Backend::flush_sync`].
    fn flush_now(&self) -> Result<(), Error> {
        if !self.ctrl.identity().vwc || self.ctrl.is_failed() {
            return Ok(());
        }
        let me = Arc::new(NvmeBackend {
            ctrl: Arc::clone(&self.ctrl),
            nsid: self.nsid,
            block_size: self.block_size,
            num_blocks: self.num_blocks,
            dsm_zeroes: self.dsm_zeroes,
            opts: self.opts.clone(),
            desc: self.desc.clone(),
        });
        let mut q = me.create_nvme_queue(2)?;
        q.submit(crate::Request {
            tag: 0,
            op: crate::Op::Flush,
            lba: 0,
            nblocks: 0,
            buf: None,
        })
        .map_err(|_| Error::Invalid(format!("{}: flush not accepted", self.desc)))?;
        // The queue's pair is created first (on the service thread, after a reset under
        // way if there is one, which the old synchronous create waited for too), then the
        // flush runs.
        let deadline = std::time::Instant::now()
            + self.opts.driver.admin_timeout * 2
            + self.ctrl.reset_time_bound()
            + self.opts.io_timeout
            + self.opts.abort_timeout;
        let mut out = Vec::new();
        while out.is_empty() && std::time::Instant::now() < deadline {
            q.poll(&mut out);
            std::thread::sleep(Duration::from_micros(50));
        }
        match out.first().map(|c| c.status) {
            Some(crate::IoStatus::Ok) => Ok(()),
            Some(s) => Err(Error::Invalid(format!(
                "{}: flush failed: {s:?}",
                self.desc
            ))),
            None => Err(Error::Invalid(format!("{}: flush timed out", self.desc))),
        }
    }
}
