//! [`DeviceAccess`] for a real PCI function bound to `vfio-pci`, through the VFIO
//! group/container interface (`/dev/vfio/vfio` + `/dev/vfio/<group>`, type-1 v2 IOMMU).
//!
//! - BAR0 is `mmap`ed when the region allows it, otherwise reached with `pread`/`pwrite`
//!   on the device fd (slower, same semantics).
//! - DMA: memory is mapped with `VFIO_IOMMU_MAP_DMA` at IOVAs from our own allocator.
//! - Removal: the device request interrupt (`VFIO_PCI_REQ_IRQ_INDEX`, the kernel asking
//!   us to give the device back on hot unplug) is wired to a non-blocking eventfd that
//!   the driver polls. [`DeviceAccess::release`] clears Bus Master, replaces the BAR
//!   mapping with anonymous memory (so a racing doorbell write lands nowhere) and closes
//!   the device fd (by `dup2`ing `/dev/null` over it, so the number never names another
//!   file), which lets the kernel finish the removal.
//! - P2P: BAR0 windows exported as dma-bufs (`p2p.rs`).
//!
//! Every `unsafe` block is an FFI call or raw MMIO, each with its `// SAFETY:`.
//! Not implemented: the iommufd/cdev interface (`/dev/vfio/devices/vfioN`), interrupts.

// `unsafe` allowed here: VFIO ioctls, mmap of BAR0 and raw MMIO to the device's registers.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use vfio_bindings::bindings::vfio as vb;

use super::device::{DeviceAccess, DeviceError, DmaRegion, IovaAllocator};
use super::p2p::{DmaBufExport, DmaBufInterface};
use crate::IoBuf;

/// `_IO(VFIO_TYPE, VFIO_BASE + n)`: every VFIO ioctl is declared this way.
const fn vfio_io(n: u32) -> libc::Ioctl {
    (((vb::VFIO_TYPE as u32) << 8) | (vb::VFIO_BASE + n)) as libc::Ioctl
}
const VFIO_GET_API_VERSION: libc::Ioctl = vfio_io(0);
const VFIO_CHECK_EXTENSION: libc::Ioctl = vfio_io(1);
const VFIO_SET_IOMMU: libc::Ioctl = vfio_io(2);
const VFIO_GROUP_GET_STATUS: libc::Ioctl = vfio_io(3);
const VFIO_GROUP_SET_CONTAINER: libc::Ioctl = vfio_io(4);
const VFIO_GROUP_GET_DEVICE_FD: libc::Ioctl = vfio_io(6);
const VFIO_DEVICE_GET_INFO: libc::Ioctl = vfio_io(7);
const VFIO_DEVICE_GET_REGION_INFO: libc::Ioctl = vfio_io(8);
const VFIO_DEVICE_SET_IRQS: libc::Ioctl = vfio_io(10);
const VFIO_IOMMU_MAP_DMA: libc::Ioctl = vfio_io(13);
const VFIO_IOMMU_UNMAP_DMA: libc::Ioctl = vfio_io(14);
const VFIO_DEVICE_FEATURE: libc::Ioctl = vfio_io(17);
/// NVIDIA's patched kernels (doca-sta-api.md 5.6). Same number as later upstream
/// proposals for other purposes: only ever tried when the upstream feature is absent.
const VFIO_DEVICE_P2P_DMA_BUF: libc::Ioctl = vfio_io(22);

/// Argument of `VFIO_DEVICE_P2P_DMA_BUF` (NVIDIA).
#[repr(C)]
struct NvP2pDmaBuf {
    region_index: u32,
    open_flags: u32,
    offset: u32,
    length: u64,
}

/// `VFIO_DEVICE_FEATURE` header + `vfio_device_feature_dma_buf` + one range.
#[repr(C)]
struct FeatureDmaBuf {
    argsz: u32,
    flags: u32,
    region_index: u32,
    open_flags: u32,
    dmabuf_flags: u32,
    nr_ranges: u32,
    offset: u64,
    length: u64,
}

/// `vfio_irq_set` with one eventfd.
#[repr(C)]
struct IrqSetOne {
    argsz: u32,
    flags: u32,
    index: u32,
    start: u32,
    count: u32,
    fd: i32,
}

fn os_err(what: &str) -> DeviceError {
    let e = io::Error::last_os_error();
    DeviceError::Io(io::Error::new(e.kind(), format!("{what}: {e}")))
}

/// How BAR0 is reached.
#[derive(Debug)]
enum Bar {
    Mapped { base: usize, len: usize },
    Pio { offset: u64, len: usize },
}

/// A PCI NVMe function opened through VFIO.
#[derive(Debug)]
pub struct VfioDevice {
    bdf: String,
    /// Kept open as long as any DMA mapping may need unmapping.
    container: Arc<OwnedFd>,
    _group: OwnedFd,
    /// The device fd number; after `release` it names /dev/null.
    device: RawFd,
    config_offset: u64,
    bar: Bar,
    iova: Arc<IovaAllocator>,
    req_eventfd: Option<OwnedFd>,
    removal: AtomicBool,
    gone: AtomicBool,
}

fn sysfs_link_name(path: &Path) -> Option<String> {
    std::fs::read_link(path)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// Checks `addr` is `DDDD:BB:DD.F`.
pub fn valid_pci_address(addr: &str) -> bool {
    let b = addr.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && [0, 1, 2, 3, 5, 6, 8, 9]
            .iter()
            .all(|&i| b[i].is_ascii_hexdigit())
        && (b'0'..=b'7').contains(&b[11])
}

fn ioctl_ptr<T>(
    fd: RawFd,
    req: libc::Ioctl,
    arg: &mut T,
    what: &str,
) -> Result<libc::c_int, DeviceError> {
    // SAFETY: `arg` is a live, exclusively borrowed `#[repr(C)]` struct of the layout the
    // ioctl `req` expects (argsz set by the caller); the kernel reads/writes within it.
    let rc = unsafe { libc::ioctl(fd, req, arg as *mut T) };
    if rc < 0 {
        return Err(os_err(what));
    }
    Ok(rc)
}

impl VfioDevice {
    /// Opens PCI function `bdf` (e.g. `0000:00:04.0`), which must be bound to vfio-pci.
    pub fn open(bdf: &str) -> Result<Arc<VfioDevice>, DeviceError> {
        if !valid_pci_address(bdf) {
            return Err(DeviceError::Invalid(format!(
                "{bdf:?} is not a PCI address of the form 0000:00:04.0"
            )));
        }
        let sys = Path::new("/sys/bus/pci/devices").join(bdf);
        if !sys.exists() {
            return Err(DeviceError::Invalid(format!("{bdf}: no such PCI device")));
        }
        match sysfs_link_name(&sys.join("driver")).as_deref() {
            Some("vfio-pci") => {}
            other => {
                return Err(DeviceError::Invalid(format!(
                    "{bdf} is bound to {}, not vfio-pci; bind it with: \
                     echo {bdf} > /sys/bus/pci/devices/{bdf}/driver/unbind; \
                     echo vfio-pci > /sys/bus/pci/devices/{bdf}/driver_override; \
                     echo {bdf} > /sys/bus/pci/drivers_probe",
                    other.unwrap_or("no driver")
                )))
            }
        }
        let group = sysfs_link_name(&sys.join("iommu_group")).ok_or_else(|| {
            DeviceError::Invalid(format!(
                "{bdf} has no IOMMU group (is the IOMMU on? intel_iommu=on / amd_iommu=on)"
            ))
        })?;
        let open = |p: &str| -> Result<OwnedFd, DeviceError> {
            let f: File = OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .map_err(|e| DeviceError::Io(io::Error::new(e.kind(), format!("{p}: {e}"))))?;
            Ok(OwnedFd::from(f))
        };
        let container = open("/dev/vfio/vfio")?;
        let cfd = container.as_raw_fd();
        // SAFETY: plain ioctls without arguments on our own fd.
        let api = unsafe { libc::ioctl(cfd, VFIO_GET_API_VERSION) };
        if api != vb::VFIO_API_VERSION as i32 {
            return Err(DeviceError::Unsupported(format!("VFIO API version {api}")));
        }
        // SAFETY: VFIO_CHECK_EXTENSION takes the extension number by value.
        let ext = unsafe {
            libc::ioctl(
                cfd,
                VFIO_CHECK_EXTENSION,
                vb::VFIO_TYPE1v2_IOMMU as libc::c_ulong,
            )
        };
        if ext <= 0 {
            return Err(DeviceError::Unsupported(
                "the VFIO container has no type-1 v2 IOMMU".into(),
            ));
        }
        let group_fd = open(&format!("/dev/vfio/{group}"))?;
        let gfd = group_fd.as_raw_fd();
        let mut status = vb::vfio_group_status {
            argsz: std::mem::size_of::<vb::vfio_group_status>() as u32,
            flags: 0,
        };
        ioctl_ptr(
            gfd,
            VFIO_GROUP_GET_STATUS,
            &mut status,
            "VFIO_GROUP_GET_STATUS",
        )?;
        if status.flags & vb::VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(DeviceError::Invalid(format!(
                "IOMMU group {group} is not viable: bind every device in \
                 /sys/kernel/iommu_groups/{group}/devices to vfio-pci"
            )));
        }
        let mut cfd_arg: libc::c_int = cfd;
        ioctl_ptr(
            gfd,
            VFIO_GROUP_SET_CONTAINER,
            &mut cfd_arg,
            "VFIO_GROUP_SET_CONTAINER",
        )?;
        // SAFETY: VFIO_SET_IOMMU takes the IOMMU type by value.
        if unsafe { libc::ioctl(cfd, VFIO_SET_IOMMU, vb::VFIO_TYPE1v2_IOMMU as libc::c_ulong) } < 0
        {
            return Err(os_err("VFIO_SET_IOMMU"));
        }
        let name = CString::new(bdf).map_err(|_| DeviceError::Invalid("bad address".into()))?;
        // SAFETY: the argument is a NUL-terminated string that outlives the call.
        let dfd = unsafe { libc::ioctl(gfd, VFIO_GROUP_GET_DEVICE_FD, name.as_ptr()) };
        if dfd < 0 {
            return Err(os_err("VFIO_GROUP_GET_DEVICE_FD"));
        }
        // SAFETY: `dfd` is a new fd the kernel just gave us; OwnedFd takes ownership (and
        // closes it if we fail below).
        let device = unsafe { OwnedFd::from_raw_fd(dfd) };
        let mut info = vb::vfio_device_info {
            argsz: std::mem::size_of::<vb::vfio_device_info>() as u32,
            ..Default::default()
        };
        ioctl_ptr(dfd, VFIO_DEVICE_GET_INFO, &mut info, "VFIO_DEVICE_GET_INFO")?;
        if info.flags & vb::VFIO_DEVICE_FLAGS_PCI == 0 {
            return Err(DeviceError::Invalid(format!("{bdf} is not a PCI device")));
        }
        let region = |index: u32| -> Result<vb::vfio_region_info, DeviceError> {
            let mut r = vb::vfio_region_info {
                argsz: std::mem::size_of::<vb::vfio_region_info>() as u32,
                index,
                ..Default::default()
            };
            ioctl_ptr(
                dfd,
                VFIO_DEVICE_GET_REGION_INFO,
                &mut r,
                "VFIO_DEVICE_GET_REGION_INFO",
            )?;
            Ok(r)
        };
        let bar0 = region(vb::VFIO_PCI_BAR0_REGION_INDEX)?;
        let config = region(vb::VFIO_PCI_CONFIG_REGION_INDEX)?;
        if bar0.size < 0x2000 {
            return Err(DeviceError::Invalid(format!(
                "{bdf}: BAR0 is {} bytes, too small for an NVMe controller",
                bar0.size
            )));
        }
        let len = bar0.size as usize;
        let bar = if bar0.flags & vb::VFIO_REGION_INFO_FLAG_MMAP != 0 {
            // SAFETY: a shared mapping of the device fd at the region's offset, at a
            // kernel-chosen address; checked for MAP_FAILED.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    dfd,
                    bar0.offset as libc::off_t,
                )
            };
            if p == libc::MAP_FAILED {
                Bar::Pio {
                    offset: bar0.offset,
                    len,
                }
            } else {
                Bar::Mapped {
                    base: p as usize,
                    len,
                }
            }
        } else {
            Bar::Pio {
                offset: bar0.offset,
                len,
            }
        };
        let req_eventfd = Self::wire_request_irq(dfd);
        tracing::info!(
            "vfio {bdf}: IOMMU group {group}, BAR0 {} KiB {}, removal notification {}",
            len / 1024,
            if matches!(bar, Bar::Mapped { .. }) {
                "mmapped"
            } else {
                "by pread/pwrite (not mmappable)"
            },
            if req_eventfd.is_some() {
                "wired"
            } else {
                "unavailable"
            }
        );
        let raw = device.as_raw_fd();
        std::mem::forget(device); // owned by `VfioDevice::device` from here on
        Ok(Arc::new(VfioDevice {
            bdf: bdf.to_owned(),
            container: Arc::new(container),
            _group: group_fd,
            device: raw,
            config_offset: config.offset,
            bar,
            iova: Arc::new(IovaAllocator::new(1 << 32, 1 << 39)),
            req_eventfd,
            removal: AtomicBool::new(false),
            gone: AtomicBool::new(false),
        }))
    }

    /// Asks for an eventfd signal when the kernel wants the device back (hot removal).
    fn wire_request_irq(dfd: RawFd) -> Option<OwnedFd> {
        // SAFETY: eventfd has no memory-safety preconditions; checked below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if efd < 0 {
            return None;
        }
        // SAFETY: a new fd we own.
        let owned = unsafe { OwnedFd::from_raw_fd(efd) };
        let mut set = IrqSetOne {
            argsz: std::mem::size_of::<IrqSetOne>() as u32,
            flags: vb::VFIO_IRQ_SET_DATA_EVENTFD | vb::VFIO_IRQ_SET_ACTION_TRIGGER,
            index: vb::VFIO_PCI_REQ_IRQ_INDEX,
            start: 0,
            count: 1,
            fd: efd,
        };
        ioctl_ptr(dfd, VFIO_DEVICE_SET_IRQS, &mut set, "VFIO_DEVICE_SET_IRQS").ok()?;
        Some(owned)
    }

    fn config_rw(&self, off: u64, buf: &mut [u8], write: bool) -> io::Result<()> {
        let pos = (self.config_offset + off) as libc::off_t;
        // SAFETY: `buf` is a live exclusive slice; pread/pwrite touch at most its length.
        let n = unsafe {
            if write {
                libc::pwrite(self.device, buf.as_ptr().cast(), buf.len(), pos)
            } else {
                libc::pread(self.device, buf.as_mut_ptr().cast(), buf.len(), pos)
            }
        };
        if n != buf.len() as isize {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn dma_map(&self, vaddr: u64, iova: u64, size: u64) -> Result<(), DeviceError> {
        let mut m = vb::vfio_iommu_type1_dma_map {
            argsz: std::mem::size_of::<vb::vfio_iommu_type1_dma_map>() as u32,
            flags: vb::VFIO_DMA_MAP_FLAG_READ | vb::VFIO_DMA_MAP_FLAG_WRITE,
            vaddr,
            iova,
            size,
        };
        ioctl_ptr(
            self.container.as_raw_fd(),
            VFIO_IOMMU_MAP_DMA,
            &mut m,
            "VFIO_IOMMU_MAP_DMA",
        )?;
        Ok(())
    }
}

fn dma_unmap(container: &OwnedFd, iova: u64, size: u64) {
    let mut u = vb::vfio_iommu_type1_dma_unmap {
        argsz: std::mem::size_of::<vb::vfio_iommu_type1_dma_unmap>() as u32,
        flags: 0,
        iova,
        size,
        data: Default::default(),
    };
    let _ = ioctl_ptr(
        container.as_raw_fd(),
        VFIO_IOMMU_UNMAP_DMA,
        &mut u,
        "VFIO_IOMMU_UNMAP_DMA",
    );
}

impl DeviceAccess for VfioDevice {
    fn name(&self) -> String {
        self.bdf.clone()
    }

    fn read32(&self, off: usize) -> u32 {
        if self.gone.load(Ordering::Acquire) {
            return u32::MAX;
        }
        let v = match self.bar {
            Bar::Mapped { base, len } => {
                assert!(
                    off.is_multiple_of(4) && off + 4 <= len,
                    "BAR0 read at {off:#x}"
                );
                // SAFETY: `base..base+len` is our BAR0 mapping (or, after `release`,
                // anonymous memory of the same size mapped over it), never unmapped while
                // `self` lives; `off` is in bounds and aligned (asserted).
                unsafe { std::ptr::read_volatile((base + off) as *const u32) }
            }
            Bar::Pio { offset, len } => {
                assert!(off + 4 <= len);
                let mut b = [0u8; 4];
                // SAFETY: reads 4 bytes into `b`; the fd is ours (or /dev/null after
                // `release`, which reads nothing).
                let n = unsafe {
                    libc::pread(
                        self.device,
                        b.as_mut_ptr().cast(),
                        4,
                        (offset + off as u64) as libc::off_t,
                    )
                };
                if n != 4 {
                    return u32::MAX;
                }
                u32::from_le_bytes(b)
            }
        };
        if self.gone.load(Ordering::Acquire) {
            u32::MAX
        } else {
            v
        }
    }

    fn write32(&self, off: usize, value: u32) {
        if self.gone.load(Ordering::Acquire) {
            return;
        }
        match self.bar {
            Bar::Mapped { base, len } => {
                assert!(
                    off.is_multiple_of(4) && off + 4 <= len,
                    "BAR0 write at {off:#x}"
                );
                // SAFETY: as in `read32`; a write racing `release` lands in the anonymous
                // replacement mapping.
                unsafe { std::ptr::write_volatile((base + off) as *mut u32, value) }
            }
            Bar::Pio { offset, len } => {
                assert!(off + 4 <= len);
                let b = value.to_le_bytes();
                // SAFETY: writes 4 bytes from `b` to our device fd (or /dev/null).
                unsafe {
                    libc::pwrite(
                        self.device,
                        b.as_ptr().cast(),
                        4,
                        (offset + off as u64) as libc::off_t,
                    )
                };
            }
        }
    }

    fn enable_bus_master(&self) -> Result<(), DeviceError> {
        let mut cmd = [0u8; 2];
        self.config_rw(4, &mut cmd, false)?;
        let v = u16::from_le_bytes(cmd) | 0x6; // Memory Space | Bus Master
        let mut cmd = v.to_le_bytes();
        self.config_rw(4, &mut cmd, true)?;
        Ok(())
    }

    fn alloc_dma(&self, len: usize) -> Result<DmaRegion, DeviceError> {
        let mem = IoBuf::try_new(len.max(1)).ok_or_else(|| {
            DeviceError::Invalid(format!("cannot allocate {len} bytes of DMA memory"))
        })?;
        let cap = mem.capacity();
        let iova = self
            .iova
            .alloc(cap)
            .ok_or_else(|| DeviceError::Invalid("IOVA space exhausted".into()))?;
        if let Err(e) = self.dma_map(mem.as_ptr() as u64, iova, cap as u64) {
            self.iova.free(iova, cap);
            return Err(e);
        }
        let container = Arc::clone(&self.container);
        let alloc = Arc::clone(&self.iova);
        let release = Box::new(move || {
            dma_unmap(&container, iova, cap as u64);
            alloc.free(iova, cap);
        });
        Ok(DmaRegion::new(mem, iova, Some(release)))
    }

    fn map_dma(&self, buf: &IoBuf) -> Result<u64, DeviceError> {
        let cap = buf.capacity();
        let iova = self
            .iova
            .alloc(cap)
            .ok_or_else(|| DeviceError::Invalid("IOVA space exhausted".into()))?;
        if let Err(e) = self.dma_map(buf.as_ptr() as u64, iova, cap as u64) {
            self.iova.free(iova, cap);
            return Err(e);
        }
        Ok(iova)
    }

    fn unmap_dma(&self, iova: u64, len: usize) {
        dma_unmap(&self.container, iova, len as u64);
        self.iova.free(iova, len);
    }

    fn removal_requested(&self) -> bool {
        if self.removal.load(Ordering::Relaxed) {
            return true;
        }
        let Some(efd) = &self.req_eventfd else {
            return false;
        };
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into `v` from our non-blocking eventfd.
        let n = unsafe { libc::read(efd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if n == 8 {
            self.removal.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    fn release(&self) {
        if self.gone.swap(true, Ordering::AcqRel) {
            return;
        }
        // Stop the device's DMA first: clear Bus Master.
        let mut cmd = [0u8; 2];
        if self.config_rw(4, &mut cmd, false).is_ok() {
            let mut v = (u16::from_le_bytes(cmd) & !0x4).to_le_bytes();
            let _ = self.config_rw(4, &mut v, true);
        }
        if let Bar::Mapped { base, len } = self.bar {
            // SAFETY: replaces exactly our BAR0 mapping with private anonymous memory at
            // the same address (MAP_FIXED), so concurrent accessors never fault; the old
            // mapping's reference to the device file goes away.
            unsafe {
                libc::mmap(
                    base as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
        }
        if let Ok(null) = File::open("/dev/null") {
            // SAFETY: atomically makes our device fd number refer to /dev/null, closing
            // the device file; nothing else owns that number.
            unsafe { libc::dup2(null.as_raw_fd(), self.device) };
        }
    }

    fn export_bar0_dmabuf(&self, offset: u64, len: u64) -> Result<DmaBufExport, DeviceError> {
        if self.gone.load(Ordering::Acquire) {
            return Err(DeviceError::Removed);
        }
        let mut f = FeatureDmaBuf {
            argsz: std::mem::size_of::<FeatureDmaBuf>() as u32,
            flags: vb::VFIO_DEVICE_FEATURE_GET | vb::VFIO_DEVICE_FEATURE_DMA_BUF,
            region_index: vb::VFIO_PCI_BAR0_REGION_INDEX,
            open_flags: (libc::O_RDWR | libc::O_CLOEXEC) as u32,
            dmabuf_flags: 0,
            nr_ranges: 1,
            offset,
            length: len,
        };
        let mut probe = vb::vfio_device_feature {
            argsz: std::mem::size_of::<vb::vfio_device_feature>() as u32,
            flags: vb::VFIO_DEVICE_FEATURE_PROBE
                | vb::VFIO_DEVICE_FEATURE_GET
                | vb::VFIO_DEVICE_FEATURE_DMA_BUF,
            data: Default::default(),
        };
        let upstream = ioctl_ptr(self.device, VFIO_DEVICE_FEATURE, &mut probe, "probe").is_ok();
        if upstream {
            let fd = ioctl_ptr(
                self.device,
                VFIO_DEVICE_FEATURE,
                &mut f,
                "VFIO_DEVICE_FEATURE_DMA_BUF",
            )?;
            // SAFETY: the ioctl returned a new dma-buf fd that we now own.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            return Ok(DmaBufExport {
                fd,
                bar_offset: offset,
                len,
                interface: DmaBufInterface::Upstream,
            });
        }
        let upstream_err = io::Error::last_os_error();
        let mut nv = NvP2pDmaBuf {
            region_index: vb::VFIO_PCI_BAR0_REGION_INDEX,
            open_flags: libc::O_RDWR as u32,
            offset: 0,
            length: 0,
        };
        match ioctl_ptr(
            self.device,
            VFIO_DEVICE_P2P_DMA_BUF,
            &mut nv,
            "VFIO_DEVICE_P2P_DMA_BUF",
        ) {
            Ok(fd) => {
                // SAFETY: as above.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                let bar_len = match self.bar {
                    Bar::Mapped { len, .. } | Bar::Pio { len, .. } => len as u64,
                };
                Ok(DmaBufExport {
                    fd,
                    bar_offset: 0,
                    len: bar_len,
                    interface: DmaBufInterface::NvidiaP2p,
                })
            }
            Err(nv_err) => Err(DeviceError::Unsupported(format!(
                "BAR0 dma-buf export: upstream VFIO_DEVICE_FEATURE_DMA_BUF: {upstream_err}; \
                 NVIDIA VFIO_DEVICE_P2P_DMA_BUF: {nv_err} (see kernel-patches/README.md)"
            ))),
        }
    }
}

impl Drop for VfioDevice {
    fn drop(&mut self) {
        if let Bar::Mapped { base, len } = self.bar {
            // SAFETY: our mapping (BAR0 or its anonymous replacement); nothing can use it
            // once the last reference to `self` is gone.
            unsafe { libc::munmap(base as *mut libc::c_void, len) };
        }
        // SAFETY: we own this fd number (device file or /dev/null) and close it once.
        unsafe { libc::close(self.device) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_uapi_header() {
        // _IO(';', 100 + n): 0x3B64 + n.
        assert_eq!(u64::from(VFIO_GET_API_VERSION as u32), 0x3B64);
        assert_eq!(u64::from(VFIO_IOMMU_MAP_DMA as u32), 0x3B71);
        assert_eq!(u64::from(VFIO_DEVICE_FEATURE as u32), 0x3B75);
        assert_eq!(u64::from(VFIO_DEVICE_P2P_DMA_BUF as u32), 0x3B7A);
        assert_eq!(std::mem::size_of::<NvP2pDmaBuf>(), 24);
        assert_eq!(std::mem::size_of::<FeatureDmaBuf>(), 40);
        assert_eq!(std::mem::size_of::<IrqSetOne>(), 24);
    }

    #[test]
    fn pci_addresses() {
        assert!(valid_pci_address("0000:00:04.0"));
        assert!(valid_pci_address("0000:af:1f.7"));
        assert!(!valid_pci_address("00:04.0"));
        assert!(!valid_pci_address("0000:00:04.8"));
        assert!(!valid_pci_address("0000-00:04.0"));
    }

    #[test]
    fn open_reports_a_missing_device_by_name() {
        let e = VfioDevice::open("0000:ff:1f.7").unwrap_err().to_string();
        assert!(e.contains("0000:ff:1f.7"), "{e}");
        let e = VfioDevice::open("nope").unwrap_err().to_string();
        assert!(e.contains("PCI address"), "{e}");
    }
}
