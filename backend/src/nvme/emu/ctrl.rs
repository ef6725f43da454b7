//! The emulated controller's logic: registers, queues, admin and NVM commands, fault
//! injection. Memory is reached only through `dma.rs`.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::dma::HostRange;
use crate::nvme::device::{DeviceAccess, DeviceError, DmaRegion, IovaAllocator};
use crate::nvme::spec::{
    self, admin, io, Cap, Cqe, IdentifyController, IdentifyNamespace, Sqe, Status,
};
use crate::IoBuf;

/// What the emulated controller looks like.
#[derive(Clone, Debug)]
pub struct EmuConfig {
    /// Namespaces 1..=n: capacity in blocks.
    pub namespaces: Vec<u64>,
    pub block_size: u32,
    /// MDTS (0: no limit).
    pub mdts: u8,
    /// Report and accept SGLs.
    pub sgl: bool,
    /// CAP.MQES (0-based).
    pub mqes: u16,
    /// I/O queue pairs granted at most.
    pub max_queues: u16,
    pub vwc: bool,
    pub oncs: u16,
    /// CAP.DSTRD.
    pub dstrd: u8,
    /// Deallocated blocks read as zeroes (DLFEAT 001b). When false, Dataset Management
    /// leaves the data in place (as QEMU's drive does without `discard=unmap`).
    pub dsm_zeroes: bool,
    /// CAP.TO: worst-case time to come ready, in 500 ms units.
    pub cap_to: u8,
}

impl Default for EmuConfig {
    fn default() -> Self {
        EmuConfig {
            namespaces: vec![2048],
            block_size: 512,
            mdts: 5,
            sgl: false,
            mqes: 1023,
            max_queues: 8,
            vwc: true,
            oncs: spec::ONCS_DSM | spec::ONCS_WRITE_ZEROES,
            dstrd: 0,
            dsm_zeroes: true,
            cap_to: 2,
        }
    }
}

/// Counters a test can read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmuCounters {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub write_zeroes: u64,
    pub dsm: u64,
    pub aborts: u64,
    pub blocks_read: u64,
    pub blocks_written: u64,
    /// Commands that used an SGL data pointer.
    pub sgl_commands: u64,
    /// Commands whose PRP2 was a PRP list.
    pub prp_list_commands: u64,
    /// Largest single transfer seen, bytes.
    pub max_transfer: usize,
    /// Controller enables (CC.EN 0 -> 1).
    pub enables: u64,
    /// DMA memory freed while an I/O queue the controller still has lies in it (the
    /// device could write into freed memory): always 0 for a correct driver.
    pub freed_under_device: u64,
}

#[derive(Debug)]
struct Sq {
    base: u64,
    size: u16,
    head: u16,
    tail: u16,
    cqid: u16,
}

#[derive(Debug)]
struct Cq {
    base: u64,
    size: u16,
    head: u16,
    tail: u16,
    phase: bool,
    pending: VecDeque<Cqe>,
}

#[derive(Debug, Default)]
struct Faults {
    /// Hold (never complete) the next `stall` I/O commands (matching `stall_opcode`).
    stall: u32,
    stall_opcode: Option<u8>,
    /// Ignore every doorbell until the next controller reset (a hung controller).
    hang: bool,
    /// Leave admin commands in the admin SQ, unanswered, until the next controller reset
    /// or `release_admin`, while I/O queues keep working.
    hang_admin: bool,
    /// Answer Abort with "not aborted".
    ignore_abort: bool,
    /// The next command with this opcode fails with this status.
    fail_next: Vec<(u8, Status)>,
    /// Surprise removal: reads are all ones, writes vanish.
    removed: bool,
    /// Ask the driver to give the device back (VFIO device request).
    removal_requested: bool,
    /// Drop this many register writes (a function reset still in progress).
    drop_writes: u32,
    /// Panic when an admin command with this opcode runs (once).
    panic_on: Option<u8>,
}

#[derive(Debug)]
struct State {
    cfg: EmuConfig,
    cap: Cap,
    cc: u32,
    csts: u32,
    aqa: u32,
    asq: u64,
    acq: u64,
    sqs: HashMap<u16, Sq>,
    cqs: HashMap<u16, Cq>,
    granted: u16,
    storage: Vec<Vec<u8>>,
    faults: Faults,
    /// Commands held by the stall fault: (sqid, command).
    held: Vec<(u16, Sqe)>,
    counters: EmuCounters,
    /// How long CSTS.RDY takes to follow CC.EN 0 -> 1.
    ready_delay: Duration,
    /// The name of the thread that last asked for a shutdown (CC.SHN).
    shutdown_by: Option<String>,
    /// When CSTS.RDY comes up (an enable in progress).
    ready_at: Option<Instant>,
}

/// An in-process NVMe controller: enough of NVMe for the driver's tests (see the module
/// docs of `nvme`). Commands run synchronously when their SQ tail doorbell is written.
#[derive(Debug)]
pub struct EmulatedController {
    /// Shared with the release hooks of the DMA regions it hands out, which check that
    /// no I/O queue is left in memory being freed.
    state: Arc<Mutex<State>>,
    maps: Arc<Mutex<BTreeMap<u64, HostRange>>>,
    iova: Arc<IovaAllocator>,
    bus_master: AtomicBool,
}

impl EmulatedController {
    pub fn new(cfg: EmuConfig) -> Arc<EmulatedController> {
        let cap = Cap {
            mqes: cfg.mqes,
            cqr: true,
            to: cfg.cap_to,
            dstrd: cfg.dstrd,
            css_nvm: true,
            mpsmin: 0,
            mpsmax: 0,
        };
        let storage = cfg
            .namespaces
            .iter()
            .map(|&n| vec![0u8; (n * u64::from(cfg.block_size)) as usize])
            .collect();
        Arc::new(EmulatedController {
            state: Arc::new(Mutex::new(State {
                cfg,
                cap,
                cc: 0,
                csts: 0,
                aqa: 0,
                asq: 0,
                acq: 0,
                sqs: HashMap::new(),
                cqs: HashMap::new(),
                granted: 0,
                storage,
                faults: Faults::default(),
                held: Vec::new(),
                counters: EmuCounters::default(),
                ready_delay: Duration::ZERO,
                shutdown_by: None,
                ready_at: None,
            })),
            maps: Arc::new(Mutex::new(BTreeMap::new())),
            iova: Arc::new(IovaAllocator::new(1 << 32, 1 << 40)),
            bus_master: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds (never completes) the next `n` I/O commands, only those with `opcode` if
    /// given. Abort releases a held command with Command Abort Requested; a controller
    /// reset drops them.
    pub fn stall_io(&self, n: u32, opcode: Option<u8>) {
        let mut s = self.lock();
        s.faults.stall = n;
        s.faults.stall_opcode = opcode;
    }

    /// Commands currently held by [`EmulatedController::stall_io`].
    pub fn held(&self) -> usize {
        self.lock().held.len()
    }

    /// Stop answering anything (doorbells ignored) until the next controller reset.
    pub fn hang(&self) {
        self.lock().faults.hang = true;
    }

    /// Stop answering admin commands until the next controller reset (which drops them)
    /// or [`EmulatedController::release_admin`]; I/O queues keep working.
    pub fn hang_admin(&self) {
        self.lock().faults.hang_admin = true;
    }

    /// Answer admin commands again, those left waiting by
    /// [`EmulatedController::hang_admin`] first.
    pub fn release_admin(&self) {
        let mut s = self.lock();
        s.faults.hang_admin = false;
        if let Some(tail) = s.sqs.get(&0).map(|sq| sq.tail) {
            self.ring_sq(&mut s, 0, tail);
        }
    }

    /// Admin commands submitted and not run yet (see [`EmulatedController::hang_admin`]).
    pub fn admin_waiting(&self) -> usize {
        let s = self.lock();
        s.sqs
            .get(&0)
            .map_or(0, |sq| usize::from((sq.tail + sq.size - sq.head) % sq.size))
    }

    /// Command IDs of the commands held by [`EmulatedController::stall_io`].
    pub fn held_cids(&self) -> Vec<u16> {
        self.lock().held.iter().map(|(_, c)| c.cid()).collect()
    }

    /// Runs the held commands now, as if the drive had only been slow.
    pub fn complete_held(&self) {
        let mut s = self.lock();
        s.faults.stall = 0;
        for (sqid, sqe) in std::mem::take(&mut s.held) {
            if let Some((status, result)) = self.io(&mut s, sqid, &sqe) {
                self.complete(&mut s, sqid, &sqe, status, result);
            }
        }
    }

    /// From now on CSTS.RDY comes up `d` after the controller is enabled (a drive that
    /// takes a good part of CAP.TO to get ready).
    pub fn set_ready_delay(&self, d: Duration) {
        self.lock().ready_delay = d;
    }

    /// Answer every Abort with "not aborted".
    pub fn ignore_abort(&self, on: bool) {
        self.lock().faults.ignore_abort = on;
    }

    /// The next command with `opcode` on an I/O queue fails with `status`.
    pub fn fail_next(&self, opcode: u8, status: Status) {
        self.lock().faults.fail_next.push((opcode, status));
    }

    /// Surprise removal: from now on reads are all ones and writes are dropped.
    pub fn remove(&self) {
        self.lock().faults.removed = true;
    }

    /// Orderly removal: the platform asks the driver to give the device back.
    pub fn request_removal(&self) {
        self.lock().faults.removal_requested = true;
    }

    /// A function-level reset done behind the driver's back: controller disabled, every
    /// queue and held command gone.
    pub fn function_reset(&self) {
        let mut s = self.lock();
        s.disable();
        s.cc = 0;
    }

    /// Drops the next `n` register/doorbell writes, as a function whose reset is still
    /// in progress does.
    pub fn drop_writes(&self, n: u32) {
        self.lock().faults.drop_writes = n;
    }

    /// The next admin command with `opcode` panics inside the register write that
    /// submits it, on the thread that writes the doorbell: a bug in the layer below the
    /// driver, for tests of what the driver's unwinding frees.
    pub fn panic_on_next(&self, opcode: u8) {
        self.lock().faults.panic_on = Some(opcode);
    }

    pub fn counters(&self) -> EmuCounters {
        self.lock().counters
    }

    /// The name of the thread that last wrote CC.SHN, if one did.
    pub fn shutdown_by(&self) -> Option<String> {
        self.lock().shutdown_by.clone()
    }

    /// Whether the controller is enabled and ready.
    pub fn ready(&self) -> bool {
        let mut s = self.lock();
        s.tick();
        s.csts & spec::CSTS_RDY != 0
    }

    /// Number of I/O submission queues that exist now.
    pub fn io_queues(&self) -> usize {
        self.lock().sqs.keys().filter(|&&q| q != 0).count()
    }

    /// The bytes of namespace `nsid` from `lba` for `n` blocks.
    pub fn read_blocks(&self, nsid: u32, lba: u64, n: u64) -> Vec<u8> {
        let s = self.lock();
        let bs = s.cfg.block_size as usize;
        let st = &s.storage[nsid as usize - 1];
        st[lba as usize * bs..(lba + n) as usize * bs].to_vec()
    }

    /// Whether `release()` was called (the driver gave the device up).
    pub fn released(&self) -> bool {
        self.lock().faults.removed
    }

    fn translate(&self, iova: u64, len: usize) -> Option<(HostRange, usize)> {
        let maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        let (&start, range) = maps.range(..=iova).next_back()?;
        let off = (iova - start) as usize;
        (off.checked_add(len)? <= range.len()).then_some((*range, off))
    }

    fn dma_read(&self, iova: u64, dst: &mut [u8]) -> bool {
        match self.translate(iova, dst.len()) {
            Some((r, off)) => {
                r.read(off, dst);
                true
            }
            None => false,
        }
    }

    fn dma_write(&self, iova: u64, src: &[u8]) -> bool {
        match self.translate(iova, src.len()) {
            Some((r, off)) => {
                r.write(off, src);
                true
            }
            None => false,
        }
    }

    fn post(&self, s: &mut State, cqid: u16, cqe: Cqe) {
        let Some(cq) = s.cqs.get_mut(&cqid) else {
            return;
        };
        cq.pending.push_back(cqe);
        self.flush_cq(s, cqid);
    }

    fn flush_cq(&self, s: &mut State, cqid: u16) {
        let Some(cq) = s.cqs.get_mut(&cqid) else {
            return;
        };
        while (cq.tail + 1) % cq.size != cq.head {
            let Some(mut cqe) = cq.pending.pop_front() else {
                break;
            };
            cqe.phase = cq.phase;
            let b = cqe.to_bytes();
            let at = cq.base + u64::from(cq.tail) * 16;
            if let Some((r, off)) = self.translate(at, 16) {
                r.write(off, &b[..12]);
                r.write_u32_release(off + 12, u32::from_le_bytes([b[12], b[13], b[14], b[15]]));
            }
            cq.tail += 1;
            if cq.tail == cq.size {
                cq.tail = 0;
                cq.phase = !cq.phase;
            }
        }
    }

    fn complete(&self, s: &mut State, sqid: u16, sqe: &Sqe, status: Status, result: u32) {
        let Some(sq) = s.sqs.get(&sqid) else {
            return;
        };
        let (cqid, sqhd) = (sq.cqid, sq.head);
        let cqe = Cqe {
            result,
            sqhd,
            sqid,
            cid: sqe.cid(),
            phase: false,
            status: status.to_field(),
        };
        self.post(s, cqid, cqe);
    }

    fn ring_sq(&self, s: &mut State, sqid: u16, tail: u16) {
        let Some(sq) = s.sqs.get_mut(&sqid) else {
            return;
        };
        if tail >= sq.size {
            return;
        }
        sq.tail = tail;
        loop {
            let Some(sq) = s.sqs.get_mut(&sqid) else {
                return;
            };
            if sq.head == sq.tail {
                return;
            }
            let at = sq.base + u64::from(sq.head) * 64;
            sq.head = (sq.head + 1) % sq.size;
            let mut b = [0u8; 64];
            if !self.dma_read(at, &mut b) {
                return;
            }
            let sqe = Sqe::from_bytes(&b);
            let outcome = if sqid == 0 {
                Some(self.admin(s, &sqe))
            } else {
                self.io(s, sqid, &sqe)
            };
            if let Some((status, result)) = outcome {
                self.complete(s, sqid, &sqe, status, result);
            }
        }
    }

    fn admin(&self, s: &mut State, sqe: &Sqe) -> (Status, u32) {
        if s.faults.panic_on == Some(sqe.opcode()) {
            s.faults.panic_on = None;
            panic!(
                "emulated controller: injected panic on admin opcode {:#04x}",
                sqe.opcode()
            );
        }
        match sqe.opcode() {
            admin::IDENTIFY => {
                let mut page = [0u8; 4096];
                match sqe.dw[10] & 0xFF {
                    1 => IdentifyController {
                        vid: 0x1b36,
                        serial: "EMU0001".into(),
                        model: "nvmf-target emulated NVMe".into(),
                        firmware: "1.0".into(),
                        mdts: s.cfg.mdts,
                        cntlid: 1,
                        acl: 3,
                        nn: s.cfg.namespaces.len() as u32,
                        oncs: s.cfg.oncs,
                        vwc: s.cfg.vwc,
                        sgls: u32::from(s.cfg.sgl),
                    }
                    .encode(&mut page),
                    0 => {
                        let nsid = sqe.nsid() as usize;
                        match s.cfg.namespaces.get(nsid.wrapping_sub(1)) {
                            Some(&n) => IdentifyNamespace {
                                nsze: n,
                                block_size: s.cfg.block_size,
                                ms: 0,
                                dlfeat: u8::from(s.cfg.dsm_zeroes),
                            }
                            .encode(&mut page),
                            None => return (Status::INVALID_NAMESPACE.dnr(), 0),
                        }
                    }
                    2 => {
                        for i in 0..s.cfg.namespaces.len().min(1024) {
                            page[i * 4..i * 4 + 4].copy_from_slice(&(i as u32 + 1).to_le_bytes());
                        }
                    }
                    _ => return (Status::INVALID_FIELD.dnr(), 0),
                }
                (self.dev_to_host(s, sqe, &page), 0)
            }
            admin::SET_FEATURES if sqe.dw[10] & 0xFF == u32::from(spec::FID_NUMBER_OF_QUEUES) => {
                let want = (sqe.dw[11] & 0xFFFF).min(sqe.dw[11] >> 16) as u16;
                s.granted = want.saturating_add(1).min(s.cfg.max_queues);
                let g = u32::from(s.granted - 1);
                (Status::SUCCESS, g | g << 16)
            }
            admin::SET_FEATURES => (Status::SUCCESS, 0),
            admin::GET_FEATURES => {
                let g = u32::from(s.granted.max(1) - 1);
                (Status::SUCCESS, g | g << 16)
            }
            admin::CREATE_IO_CQ => {
                let qid = sqe.dw[10] as u16;
                let size = (sqe.dw[10] >> 16) as u16;
                if qid == 0 || qid > s.granted || s.cqs.contains_key(&qid) {
                    return (Status::INVALID_QUEUE_ID.dnr(), 0);
                }
                if size == 0 || size > s.cap.mqes {
                    return (Status::INVALID_QUEUE_SIZE.dnr(), 0);
                }
                if sqe.dw[11] & 1 == 0 {
                    return (Status::INVALID_FIELD.dnr(), 0);
                }
                s.cqs.insert(
                    qid,
                    Cq {
                        base: sqe.prp1(),
                        size: size + 1,
                        head: 0,
                        tail: 0,
                        phase: true,
                        pending: VecDeque::new(),
                    },
                );
                (Status::SUCCESS, 0)
            }
            admin::CREATE_IO_SQ => {
                let qid = sqe.dw[10] as u16;
                let size = (sqe.dw[10] >> 16) as u16;
                let cqid = (sqe.dw[11] >> 16) as u16;
                if qid == 0 || qid > s.granted || s.sqs.contains_key(&qid) {
                    return (Status::INVALID_QUEUE_ID.dnr(), 0);
                }
                if size == 0 || size > s.cap.mqes {
                    return (Status::INVALID_QUEUE_SIZE.dnr(), 0);
                }
                if cqid == 0 || !s.cqs.contains_key(&cqid) {
                    return (Status::CQ_INVALID.dnr(), 0);
                }
                s.sqs.insert(
                    qid,
                    Sq {
                        base: sqe.prp1(),
                        size: size + 1,
                        head: 0,
                        tail: 0,
                        cqid,
                    },
                );
                (Status::SUCCESS, 0)
            }
            admin::DELETE_IO_SQ => {
                let qid = sqe.dw[10] as u16;
                if qid == 0 || !s.sqs.contains_key(&qid) {
                    return (Status::INVALID_QUEUE_ID.dnr(), 0);
                }
                let held: Vec<Sqe> = s
                    .held
                    .iter()
                    .filter(|(q, _)| *q == qid)
                    .map(|(_, c)| *c)
                    .collect();
                for c in &held {
                    self.complete(s, qid, c, Status::ABORTED_SQ_DELETION, 0);
                }
                s.held.retain(|(q, _)| *q != qid);
                s.sqs.remove(&qid);
                (Status::SUCCESS, 0)
            }
            admin::DELETE_IO_CQ => {
                let qid = sqe.dw[10] as u16;
                if qid == 0 || s.cqs.remove(&qid).is_none() {
                    return (Status::INVALID_QUEUE_ID.dnr(), 0);
                }
                (Status::SUCCESS, 0)
            }
            admin::ABORT => {
                s.counters.aborts += 1;
                let sqid = sqe.dw[10] as u16;
                let cid = (sqe.dw[10] >> 16) as u16;
                if s.faults.ignore_abort {
                    return (Status::SUCCESS, 1);
                }
                match s
                    .held
                    .iter()
                    .position(|(q, c)| *q == sqid && c.cid() == cid)
                {
                    Some(i) => {
                        let (q, c) = s.held.remove(i);
                        self.complete(s, q, &c, Status::ABORT_REQUESTED, 0);
                        (Status::SUCCESS, 0)
                    }
                    None => (Status::SUCCESS, 1),
                }
            }
            admin::GET_LOG_PAGE if sqe.dw[10] & 0xFF == u32::from(spec::LID_SMART) => {
                let numd = ((sqe.dw[10] >> 16) | (sqe.dw[11] & 0xFFFF) << 16) as usize + 1;
                let mut page = [0u8; spec::SMART_LOG_LEN];
                page[1..3].copy_from_slice(&310u16.to_le_bytes()); // 37 C in kelvin
                page[3] = 100; // available spare
                page[4] = 10; // threshold
                let c = s.counters;
                let units =
                    |blocks: u64| (blocks * u64::from(s.cfg.block_size) / 512).div_ceil(1000);
                page[32..40].copy_from_slice(&units(c.blocks_read).to_le_bytes());
                page[48..56].copy_from_slice(&units(c.blocks_written).to_le_bytes());
                page[64..72].copy_from_slice(&c.reads.to_le_bytes());
                page[80..88].copy_from_slice(&c.writes.to_le_bytes());
                let n = (numd * 4).min(page.len());
                (self.dev_to_host(s, sqe, &page[..n]), 0)
            }
            admin::GET_LOG_PAGE => (Status::INVALID_FIELD.dnr(), 0),
            _ => (Status::INVALID_OPCODE.dnr(), 0),
        }
    }

    /// The (iova, len) pieces a command's data pointer describes for `len` bytes.
    fn segments(&self, s: &mut State, sqe: &Sqe, len: usize) -> Result<Vec<(u64, usize)>, Status> {
        match sqe.psdt() {
            0 => {
                let prp1 = sqe.prp1();
                let page = spec::PAGE as u64;
                let first = len.min((page - prp1 % page) as usize);
                let mut segs = vec![(prp1, first)];
                let mut rest = len - first;
                if rest == 0 {
                    return Ok(segs);
                }
                let prp2 = sqe.prp2();
                if rest <= spec::PAGE {
                    if !prp2.is_multiple_of(page) {
                        return Err(Status::INVALID_PRP_OFFSET.dnr());
                    }
                    segs.push((prp2, rest));
                    return Ok(segs);
                }
                // PRP list, possibly chained across pages.
                s.counters.prp_list_commands += 1;
                if !prp2.is_multiple_of(8) {
                    return Err(Status::INVALID_PRP_OFFSET.dnr());
                }
                let mut list = prp2;
                while rest > 0 {
                    let left_in_page = ((page - list % page) / 8) as usize;
                    let pages_needed = rest.div_ceil(spec::PAGE);
                    let mut raw = vec![0u8; left_in_page * 8];
                    if !self.dma_read(list, &mut raw) {
                        return Err(Status::DATA_TRANSFER_ERROR);
                    }
                    let entries: Vec<u64> = raw
                        .chunks_exact(8)
                        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                        .collect();
                    let usable = if pages_needed > left_in_page {
                        left_in_page - 1
                    } else {
                        pages_needed
                    };
                    for &e in &entries[..usable] {
                        if !e.is_multiple_of(page) {
                            return Err(Status::INVALID_PRP_OFFSET.dnr());
                        }
                        let n = rest.min(spec::PAGE);
                        segs.push((e, n));
                        rest -= n;
                    }
                    if rest > 0 {
                        list = entries[left_in_page - 1];
                    }
                }
                Ok(segs)
            }
            1 => {
                if !s.cfg.sgl {
                    return Err(Status::INVALID_FIELD.dnr());
                }
                s.counters.sgl_commands += 1;
                let (addr, slen, ty) = sqe.sgl1();
                if ty >> 4 != 0 {
                    return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.dnr());
                }
                if (slen as usize) < len {
                    return Err(Status::DATA_SGL_LENGTH_INVALID.dnr());
                }
                Ok(vec![(addr, len)])
            }
            _ => Err(Status::INVALID_FIELD.dnr()),
        }
    }

    /// Device-to-host transfer of `data` through the command's data pointer.
    fn dev_to_host(&self, s: &mut State, sqe: &Sqe, data: &[u8]) -> Status {
        let segs = match self.segments(s, sqe, data.len()) {
            Ok(v) => v,
            Err(st) => return st,
        };
        let mut pos = 0;
        for (iova, n) in segs {
            if !self.dma_write(iova, &data[pos..pos + n]) {
                return Status::DATA_TRANSFER_ERROR;
            }
            pos += n;
        }
        Status::SUCCESS
    }

    /// Host-to-device transfer into `data`.
    fn host_to_dev(&self, s: &mut State, sqe: &Sqe, data: &mut [u8]) -> Status {
        let segs = match self.segments(s, sqe, data.len()) {
            Ok(v) => v,
            Err(st) => return st,
        };
        let mut pos = 0;
        for (iova, n) in segs {
            if !self.dma_read(iova, &mut data[pos..pos + n]) {
                return Status::DATA_TRANSFER_ERROR;
            }
            pos += n;
        }
        Status::SUCCESS
    }

    /// Runs an I/O command; `None` when the stall fault holds it.
    fn io(&self, s: &mut State, sqid: u16, sqe: &Sqe) -> Option<(Status, u32)> {
        let op = sqe.opcode();
        let nsid = sqe.nsid();
        if nsid == 0 || nsid as usize > s.storage.len() {
            return Some((Status::INVALID_NAMESPACE.dnr(), 0));
        }
        if let Some(i) = s.faults.fail_next.iter().position(|(o, _)| *o == op) {
            let (_, st) = s.faults.fail_next.remove(i);
            return Some((st, 0));
        }
        if s.faults.stall > 0 && s.faults.stall_opcode.is_none_or(|o| o == op) {
            s.faults.stall -= 1;
            s.held.push((sqid, *sqe));
            return None;
        }
        let ns = nsid as usize - 1;
        let bs = s.cfg.block_size as usize;
        let nblocks = s.storage[ns].len() / bs;
        let slba = sqe.slba();
        let nlb = (sqe.dw[12] & 0xFFFF) as usize + 1;
        let in_range = |lba: u64, n: usize| {
            lba.checked_add(n as u64)
                .is_some_and(|e| e <= nblocks as u64)
        };
        let status = match op {
            io::READ | io::WRITE => {
                if !in_range(slba, nlb) {
                    return Some((Status::LBA_OUT_OF_RANGE.dnr(), 0));
                }
                let len = nlb * bs;
                if s.cfg.mdts != 0 && len > spec::PAGE << s.cfg.mdts {
                    return Some((Status::INVALID_FIELD.dnr(), 0));
                }
                s.counters.max_transfer = s.counters.max_transfer.max(len);
                let off = slba as usize * bs;
                if op == io::READ {
                    let data = s.storage[ns][off..off + len].to_vec();
                    let st = self.dev_to_host(s, sqe, &data);
                    if st.is_success() {
                        s.counters.reads += 1;
                        s.counters.blocks_read += nlb as u64;
                    }
                    st
                } else {
                    let mut data = vec![0u8; len];
                    let st = self.host_to_dev(s, sqe, &mut data);
                    if st.is_success() {
                        s.storage[ns][off..off + len].copy_from_slice(&data);
                        s.counters.writes += 1;
                        s.counters.blocks_written += nlb as u64;
                    }
                    st
                }
            }
            io::FLUSH => {
                s.counters.flushes += 1;
                Status::SUCCESS
            }
            io::WRITE_ZEROES if s.cfg.oncs & spec::ONCS_WRITE_ZEROES != 0 => {
                if !in_range(slba, nlb) {
                    return Some((Status::LBA_OUT_OF_RANGE.dnr(), 0));
                }
                let off = slba as usize * bs;
                s.storage[ns][off..off + nlb * bs].fill(0);
                s.counters.write_zeroes += 1;
                Status::SUCCESS
            }
            io::DSM if s.cfg.oncs & spec::ONCS_DSM != 0 => {
                let nr = (sqe.dw[10] & 0xFF) as usize + 1;
                let mut ranges = vec![0u8; nr * 16];
                let st = self.host_to_dev(s, sqe, &mut ranges);
                if !st.is_success() {
                    return Some((st, 0));
                }
                s.counters.dsm += 1;
                if sqe.dw[11] & 4 != 0 && s.cfg.dsm_zeroes {
                    for r in ranges.chunks_exact(16) {
                        let n = u32::from_le_bytes([r[4], r[5], r[6], r[7]]) as usize;
                        let lba = u64::from_le_bytes(r[8..16].try_into().unwrap_or([0; 8]));
                        if !in_range(lba, n) {
                            return Some((Status::LBA_OUT_OF_RANGE.dnr(), 0));
                        }
                        let off = lba as usize * bs;
                        s.storage[ns][off..off + n * bs].fill(0);
                    }
                }
                Status::SUCCESS
            }
            _ => Status::INVALID_OPCODE.dnr(),
        };
        Some((status, 0))
    }

    fn write_reg(&self, s: &mut State, off: usize, v: u32) {
        match off {
            spec::REG_CC => {
                let was = s.cc;
                s.cc = v;
                if was & spec::CC_EN == 0 && v & spec::CC_EN != 0 {
                    s.enable();
                } else if was & spec::CC_EN != 0 && v & spec::CC_EN == 0 {
                    s.disable();
                }
                if v & spec::CC_SHN_MASK != 0 {
                    s.shutdown_by = Some(
                        std::thread::current()
                            .name()
                            .unwrap_or("(unnamed)")
                            .to_string(),
                    );
                    s.csts = s.csts & !spec::CSTS_SHST_MASK | spec::CSTS_SHST_DONE;
                }
            }
            spec::REG_AQA => s.aqa = v,
            o if o == spec::REG_ASQ => s.asq = s.asq & !0xFFFF_FFFF | u64::from(v),
            o if o == spec::REG_ASQ + 4 => s.asq = s.asq & 0xFFFF_FFFF | u64::from(v) << 32,
            o if o == spec::REG_ACQ => s.acq = s.acq & !0xFFFF_FFFF | u64::from(v),
            o if o == spec::REG_ACQ + 4 => s.acq = s.acq & 0xFFFF_FFFF | u64::from(v) << 32,
            o if o >= spec::REG_DOORBELLS => {
                if s.faults.hang || s.csts & spec::CSTS_RDY == 0 {
                    return;
                }
                let stride = 4usize << s.cap.dstrd;
                let idx = (o - spec::REG_DOORBELLS) / stride;
                let qid = (idx / 2) as u16;
                if qid == 0 && s.faults.hang_admin && idx.is_multiple_of(2) {
                    // Noted, not run.
                    if let Some(sq) = s.sqs.get_mut(&0) {
                        if (v as u16) < sq.size {
                            sq.tail = v as u16;
                        }
                    }
                    return;
                }
                if idx.is_multiple_of(2) {
                    self.ring_sq(s, qid, v as u16);
                } else if let Some(cq) = s.cqs.get_mut(&qid) {
                    if (v as u16) < cq.size {
                        cq.head = v as u16;
                        self.flush_cq(s, qid);
                    }
                }
            }
            _ => {}
        }
    }
}

impl State {
    fn enable(&mut self) {
        let asqs = (self.aqa & 0xFFF) as u16 + 1;
        let acqs = (self.aqa >> 16 & 0xFFF) as u16 + 1;
        if asqs < 2 || acqs < 2 || self.asq == 0 || self.acq == 0 {
            self.csts |= spec::CSTS_CFS;
            return;
        }
        self.cqs.insert(
            0,
            Cq {
                base: self.acq,
                size: acqs,
                head: 0,
                tail: 0,
                phase: true,
                pending: VecDeque::new(),
            },
        );
        self.sqs.insert(
            0,
            Sq {
                base: self.asq,
                size: asqs,
                head: 0,
                tail: 0,
                cqid: 0,
            },
        );
        self.faults.hang = false;
        self.faults.hang_admin = false;
        self.counters.enables += 1;
        if self.ready_delay.is_zero() {
            self.csts = spec::CSTS_RDY;
        } else {
            self.ready_at = Some(Instant::now() + self.ready_delay);
        }
    }

    /// Brings CSTS.RDY up once an enable's delay is over.
    fn tick(&mut self) {
        if self.ready_at.is_some_and(|t| Instant::now() >= t) {
            self.ready_at = None;
            self.csts |= spec::CSTS_RDY;
        }
    }

    fn disable(&mut self) {
        self.sqs.clear();
        self.cqs.clear();
        self.held.clear();
        self.faults.hang = false;
        self.faults.hang_admin = false;
        self.granted = 0;
        self.csts = 0;
        self.ready_at = None;
    }
}

impl DeviceAccess for EmulatedController {
    fn name(&self) -> String {
        "emulated".into()
    }

    fn read32(&self, off: usize) -> u32 {
        let mut s = self.lock();
        if s.faults.removed {
            return u32::MAX;
        }
        s.tick();
        let cap = s.cap.to_u64();
        match off {
            spec::REG_CAP => cap as u32,
            o if o == spec::REG_CAP + 4 => (cap >> 32) as u32,
            spec::REG_VS => 0x0001_0400,
            spec::REG_CC => s.cc,
            spec::REG_CSTS => s.csts,
            spec::REG_AQA => s.aqa,
            o if o == spec::REG_ASQ => s.asq as u32,
            o if o == spec::REG_ASQ + 4 => (s.asq >> 32) as u32,
            o if o == spec::REG_ACQ => s.acq as u32,
            o if o == spec::REG_ACQ + 4 => (s.acq >> 32) as u32,
            _ => 0,
        }
    }

    fn write32(&self, off: usize, value: u32) {
        let mut s = self.lock();
        if s.faults.removed || !self.bus_master.load(Ordering::Relaxed) {
            return;
        }
        if s.faults.drop_writes > 0 {
            s.faults.drop_writes -= 1;
            return;
        }
        s.tick();
        self.write_reg(&mut s, off, value);
    }

    fn enable_bus_master(&self) -> Result<(), DeviceError> {
        if self.lock().faults.removed {
            return Err(DeviceError::Removed);
        }
        self.bus_master.store(true, Ordering::Relaxed);
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
        let maps = Arc::clone(&self.maps);
        let alloc = Arc::clone(&self.iova);
        let state = Arc::downgrade(&self.state);
        let release = Box::new(move || {
            if let Some(state) = state.upgrade() {
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                let inside = |base: u64| (iova..iova + cap as u64).contains(&base);
                if s.sqs.iter().any(|(&q, sq)| q != 0 && inside(sq.base))
                    || s.cqs.iter().any(|(&q, cq)| q != 0 && inside(cq.base))
                {
                    s.counters.freed_under_device += 1;
                }
            }
            maps.lock().unwrap_or_else(|e| e.into_inner()).remove(&iova);
            alloc.free(iova, cap);
        });
        let region = DmaRegion::new(mem, iova, Some(release));
        self.maps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(iova, HostRange::of_region(&region));
        Ok(region)
    }

    fn map_dma(&self, buf: &IoBuf) -> Result<u64, DeviceError> {
        let iova = self
            .iova
            .alloc(buf.capacity())
            .ok_or_else(|| DeviceError::Invalid("IOVA space exhausted".into()))?;
        self.maps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(iova, HostRange::of_buf(buf));
        Ok(iova)
    }

    fn map_dma_at(&self, addr: usize, len: usize, iova: u64) -> Result<(), DeviceError> {
        if len == 0 || addr == 0 || self.iova.overlaps(iova, len) {
            return Err(DeviceError::Invalid(format!(
                "IOVA {iova:#x}+{len:#x} is empty or overlaps the driver's own IOVA range"
            )));
        }
        self.maps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(iova, HostRange::of_raw(addr, len));
        Ok(())
    }

    fn unmap_dma_at(&self, iova: u64, _len: usize) {
        self.maps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&iova);
    }

    fn unmap_dma(&self, iova: u64, len: usize) {
        if self
            .maps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&iova)
            .is_some()
        {
            self.iova.free(iova, len);
        }
    }

    fn removal_requested(&self) -> bool {
        self.lock().faults.removal_requested
    }

    fn release(&self) {
        let mut s = self.lock();
        s.faults.removed = true;
        s.disable();
    }
}

/// Mapped ranges right now (for tests: the driver's map cache is bounded).
impl EmulatedController {
    pub fn mapped_ranges(&self) -> usize {
        self.maps.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
