//! The controller side of the driver: bring-up (disable, admin queue, enable), admin
//! commands (Identify, Set Features, Create/Delete I/O queues, Abort, Get Log Page),
//! queue rings, controller reset and removal.
//!
//! Reaches hardware only through [`DeviceAccess`]; no `unsafe` here.
//!
//! Concurrency: one [`Controller`] is shared by every IO thread's queue (`Arc`). Admin
//! commands are synchronous (submit, poll with a deadline) under the admin mutex; they
//! happen at queue creation and deletion, on timeouts and for the health log, never per
//! I/O. A reset bumps [`Controller::generation`]; each queue notices on its next poll and
//! rebuilds its own SQ/CQ (see `queue.rs`).
//!
//! The admin work an I/O queue needs (create its queue pair, Abort a timed-out command,
//! reset the controller, create its pair again after a reset, delete it when the queue is
//! dropped) can take seconds: an Abort
//! waits up to its deadline when the admin queue does not answer, and a reset waits for
//! CSTS.RDY up to CAP.TO (up to 127.5 s) per attempt. An IO thread serves many
//! connections and namespaces, so it must not wait for that. Each controller has a
//! service thread that does this work: a queue posts a [`Job`] and reads the [`Answer`]
//! from its own channel on a later poll, holding its commands meanwhile. Jobs run one at
//! a time, in order, which also orders an Abort before the reset or queue re-creation
//! that follows it, and a queue's create before its delete.
//!
//! Queue memory is never freed while the device may still use it: the admin lock's
//! holder tracks which queue IDs may have a pair on the device (`Admin::live`), and a
//! dropped queue whose delete the drive did not confirm is kept (`Admin::orphans`) until a
//! reset or the device's release takes every pair away. Orphans keep their queue IDs
//! meanwhile: a new queue that finds no ID free asks for that reset (`Job::Reclaim`).

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, TryLockError, Weak};
use std::time::{Duration, Instant};

use super::device::{DeviceAccess, DeviceError, DmaRegion};
use super::spec::{self, Cap, Cqe, IdentifyController, IdentifyNamespace, Sqe, Status};

/// Entries of the admin queue pair.
pub const ADMIN_ENTRIES: u16 = 32;
/// Bring-up attempts of one controller reset.
const RESET_ATTEMPTS: u32 = 3;

/// Why a controller operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("{0} timed out")]
    Timeout(String),
    #[error("{what} failed: status type {:#x} code {:#x}", .status.sct, .status.sc)]
    Status { what: String, status: Status },
    #[error("{0}")]
    Invalid(String),
    #[error("controller removed or failed")]
    Failed,
}

/// One submission/completion queue pair in DMA memory, with its doorbells.
#[derive(Debug)]
pub struct Ring {
    pub qid: u16,
    pub entries: u16,
    pub sq: DmaRegion,
    pub cq: DmaRegion,
    sq_tail: u16,
    cq_head: u16,
    phase: bool,
    sq_db: usize,
    cq_db: usize,
    sq_dirty: bool,
    cq_dirty: bool,
}

impl Ring {
    pub fn new(
        dev: &dyn DeviceAccess,
        qid: u16,
        entries: u16,
        dstrd: u8,
    ) -> Result<Ring, DriverError> {
        let sq = dev.alloc_dma(usize::from(entries) * 64)?;
        let cq = dev.alloc_dma(usize::from(entries) * 16)?;
        Ok(Ring {
            qid,
            entries,
            sq,
            cq,
            sq_tail: 0,
            cq_head: 0,
            phase: true,
            sq_db: spec::doorbell_offset(qid, false, dstrd),
            cq_db: spec::doorbell_offset(qid, true, dstrd),
            sq_dirty: false,
            cq_dirty: false,
        })
    }

    /// Back to the state of a freshly created queue (after a controller reset).
    pub fn reset(&mut self) {
        self.sq.zero();
        self.cq.zero();
        self.sq_tail = 0;
        self.cq_head = 0;
        self.phase = true;
        self.sq_dirty = false;
        self.cq_dirty = false;
    }

    /// Byte offsets in BAR0 of the SQ tail and CQ head doorbells.
    pub fn doorbells(&self) -> (usize, usize) {
        (self.sq_db, self.cq_db)
    }

    /// What Create I/O CQ/SQ needs to know about this pair.
    pub fn spec(&self) -> QueueSpec {
        QueueSpec {
            qid: self.qid,
            entries: self.entries,
            sq_iova: self.sq.iova(),
            cq_iova: self.cq.iova(),
        }
    }

    /// Writes `sqe` at the tail. The caller keeps at most `entries - 1` commands
    /// outstanding, so the ring cannot overflow.
    pub fn push(&mut self, sqe: &Sqe) {
        let off = usize::from(self.sq_tail) * 64;
        self.sq.write(off, &sqe.to_bytes());
        self.sq_tail = (self.sq_tail + 1) % self.entries;
        self.sq_dirty = true;
    }

    /// Publishes pushed entries (one doorbell write for the batch).
    pub fn ring_sq(&mut self, dev: &dyn DeviceAccess) {
        if self.sq_dirty {
            std::sync::atomic::fence(Ordering::SeqCst);
            dev.write32(self.sq_db, u32::from(self.sq_tail));
            self.sq_dirty = false;
        }
    }

    /// The next completion, if the device has posted one.
    pub fn pop(&mut self) -> Option<Cqe> {
        let off = usize::from(self.cq_head) * 16;
        let dw3 = self.cq.read_u32(off + 12);
        if (dw3 >> 16 & 1 != 0) != self.phase {
            return None;
        }
        let mut b = [0u8; 16];
        self.cq.read(off, &mut b[..12]);
        b[12..16].copy_from_slice(&dw3.to_le_bytes());
        self.cq_head += 1;
        if self.cq_head == self.entries {
            self.cq_head = 0;
            self.phase = !self.phase;
        }
        self.cq_dirty = true;
        Some(Cqe::from_bytes(&b))
    }

    /// Tells the device how far completions were consumed.
    pub fn ring_cq(&mut self, dev: &dyn DeviceAccess) {
        if self.cq_dirty {
            dev.write32(self.cq_db, u32::from(self.cq_head));
            self.cq_dirty = false;
        }
    }
}

/// An I/O queue pair as the controller sees it: its ID, size and ring addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSpec {
    pub qid: u16,
    pub entries: u16,
    pub sq_iova: u64,
    pub cq_iova: u64,
}

/// Slow admin work an I/O queue hands to its controller's service thread.
#[derive(Debug)]
pub(crate) enum Job {
    /// Abort command `cid` on SQ `sqid`, waiting at most `limit` for the Abort. Not sent
    /// when the controller was reset since `generation`: the command is gone and the ID
    /// may name another one by now.
    Abort {
        sqid: u16,
        cid: u16,
        generation: u64,
        limit: Duration,
        to: Mailbox,
    },
    /// Reset the controller unless someone did since generation `seen`. A reset that
    /// fails fails the controller.
    Reset { seen: u64, to: Mailbox },
    /// Create the queue pair on the device again after the reset to `generation`
    /// (nothing is done when the controller was reset again since). Failing to fails the
    /// controller.
    Recreate {
        queue: QueueSpec,
        generation: u64,
        to: Mailbox,
    },
    /// Create a new queue pair on the device (its queue ID and rings are reserved,
    /// [`Controller::reserve_io_pair`]). Skipped once the queue is gone.
    Create { queue: QueueSpec, to: Mailbox },
    /// Delete a dropped queue's pair from the device, then free its memory and queue
    /// ID (see [`Teardown`]). `keep` holds the controller until that is done, so its
    /// shutdown never comes before the delete.
    Delete {
        pair: Teardown,
        keep: Arc<Controller>,
        /// The dropped queue's other references (its namespace and device), dropped with
        /// `keep` after the delete.
        owners: Owners,
    },
    /// Every queue ID was taken when a queue asked for one
    /// ([`Controller::reserve_io_pair`]): if dropped queues whose delete the drive never
    /// confirmed hold some of them (`Admin::orphans`), reset the controller, which takes
    /// their pairs off the device and frees their IDs. Nothing else would: their queues
    /// are gone, so no timeout of theirs asks for that reset.
    Reclaim,
    /// Give up on the controller (see [`Controller::fail_soon`]).
    Fail,
    /// Answered once every job posted before it is done (see [`Controller::settle`]).
    Barrier(mpsc::Sender<()>),
}

/// What a dropped I/O queue leaves behind: its rings and whatever else the device may
/// still reach through its commands (PRP list pages, data buffers and their mappings).
/// Freed only once the pair is off the device (deleted, or gone with a reset or the
/// released device); until then it is kept, never freed under the device.
pub(crate) struct Teardown {
    ring: Ring,
    /// Kept alive, never looked at.
    _rest: Box<dyn Send>,
}

/// What a dropped queue still held besides the controller (see [`Controller::retire`]).
pub(crate) struct Owners {
    _held: Box<dyn Send>,
}

impl std::fmt::Debug for Owners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Owners")
    }
}

impl Teardown {
    pub(crate) fn new(ring: Ring, rest: Box<dyn Send>) -> Teardown {
        Teardown { ring, _rest: rest }
    }
}

impl std::fmt::Debug for Teardown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Teardown")
            .field("qid", &self.ring.qid)
            .finish_non_exhaustive()
    }
}

/// The service thread's answer to a [`Job`].
#[derive(Debug)]
pub(crate) enum Answer {
    /// As [`Controller::abort`]; `Ok(false)` too when the Abort was not sent because the
    /// controller was reset meanwhile.
    Abort {
        cid: u16,
        result: Result<bool, DriverError>,
    },
    Reset(Result<(), DriverError>),
    Recreate(Result<(), DriverError>),
    /// The new pair is on the device (or not), tried under controller generation
    /// `generation`.
    Create {
        generation: u64,
        result: Result<(), DriverError>,
    },
}

/// Where the answer to a [`Job`] goes. `owner` is the queue's liveness token: once the
/// queue is gone, its jobs are skipped (its rings may be freed memory by then).
#[derive(Clone, Debug)]
pub(crate) struct Mailbox {
    pub tx: mpsc::Sender<Answer>,
    pub owner: Weak<()>,
}

impl Mailbox {
    fn send(&self, a: Answer) {
        // The queue may be gone; its answer with it.
        let _ = self.tx.send(a);
    }

    fn owner_gone(&self) -> bool {
        self.owner.strong_count() == 0
    }
}

/// Driver settings.
#[derive(Clone, Debug)]
pub struct DriverOptions {
    /// Deadline of one admin command.
    pub admin_timeout: Duration,
    /// I/O queues to ask the controller for (Set Features, Number of Queues).
    pub io_queues: u16,
    /// Use SGLs for data when the controller supports them (else PRPs).
    pub use_sgl: bool,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            admin_timeout: Duration::from_secs(5),
            io_queues: 64,
            use_sgl: true,
        }
    }
}

/// What the controller state check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Ok,
    /// CSTS.CFS set or RDY dropped (someone reset the function, firmware fault).
    NeedsReset,
    /// All-ones reads or the platform asked for the device back.
    Removed,
}

#[derive(Debug)]
struct Admin {
    ring: Ring,
    next_cid: u16,
    /// Buffer for Identify / log pages.
    page: DmaRegion,
    /// I/O queue IDs that may have a queue pair on the device: created, or a create or
    /// delete whose outcome is unknown (timed out). Emptied by a reset.
    live: Vec<u16>,
    /// Dropped queues whose pair could not be deleted: their memory stays allocated (and
    /// their queue IDs taken) until a reset or the device's release takes the pair away.
    orphans: Vec<Teardown>,
}

/// An initialised controller shared by every queue of every namespace on it.
#[derive(Debug)]
pub struct Controller {
    dev: Arc<dyn DeviceAccess>,
    opts: DriverOptions,
    cap: Cap,
    id: IdentifyController,
    admin: Mutex<Admin>,
    /// `qids[q]`: I/O queue `q` is taken (index 0 stands for the admin queue).
    qids: Mutex<Vec<bool>>,
    generation: AtomicU64,
    /// Set (under the admin lock) once the device is released: no command is outstanding
    /// on it any more, so its queues may give their buffers back.
    failed: AtomicBool,
    /// Someone asked to fail the controller: admin commands and reset waits in progress
    /// stop early, so the admin lock is free for [`Controller::fail`] soon.
    abandon: AtomicBool,
    resets: AtomicU64,
    /// A `Job::Reclaim` is posted and not started yet (one at a time is enough).
    reclaim_posted: AtomicBool,
    /// The service thread's job queue.
    jobs: Mutex<mpsc::Sender<Job>>,
}

fn wait_rdy(
    dev: &dyn DeviceAccess,
    want: bool,
    cap: Cap,
    abandon: &AtomicBool,
) -> Result<(), DriverError> {
    // CAP.TO is the worst case in 500 ms units; at least 1 s, and never forever.
    let limit = Duration::from_millis(500 * u64::from(cap.to.max(2)));
    let deadline = Instant::now() + limit;
    loop {
        let csts = dev.read32(spec::REG_CSTS);
        if csts == u32::MAX || abandon.load(Ordering::Acquire) {
            return Err(DriverError::Failed);
        }
        if want && csts & spec::CSTS_CFS != 0 {
            return Err(DriverError::Invalid(
                "controller fatal status (CSTS.CFS) while enabling".into(),
            ));
        }
        if (csts & spec::CSTS_RDY != 0) == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(DriverError::Timeout(format!(
                "waiting for CSTS.RDY={} ({limit:?}, CAP.TO)",
                u8::from(want)
            )));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Disables the controller, programs the admin queue and enables it again. Gives up with
/// [`DriverError::Failed`] once `abandon` is set.
fn bring_up(
    dev: &dyn DeviceAccess,
    cap: Cap,
    admin: &mut Admin,
    abandon: &AtomicBool,
) -> Result<(), DriverError> {
    let cc = dev.read32(spec::REG_CC);
    if cc == u32::MAX {
        return Err(DriverError::Failed);
    }
    if cc & spec::CC_EN != 0 {
        dev.write32(spec::REG_CC, cc & !spec::CC_EN);
    }
    wait_rdy(dev, false, cap, abandon)?;
    admin.ring.reset();
    let n = u32::from(admin.ring.entries - 1);
    dev.write32(spec::REG_AQA, n | n << 16);
    dev.write64(spec::REG_ASQ, admin.ring.sq.iova());
    dev.write64(spec::REG_ACQ, admin.ring.cq.iova());
    dev.write32(spec::REG_CC, spec::CC_CONFIG);
    dev.write32(spec::REG_CC, spec::CC_CONFIG | spec::CC_EN);
    wait_rdy(dev, true, cap, abandon)
}

/// The service thread: runs jobs one at a time until the controller is dropped.
fn serve(ctrl: Weak<Controller>, jobs: mpsc::Receiver<Job>) {
    // A job that panics would leave its queue holding its commands for an answer that
    // never comes: fail the controller instead, which every queue notices on its next
    // poll whatever it waits for. Memory the device may still write is not in a job's
    // frame when it panics (a dropped queue's pair waits among the orphans while its
    // delete runs, see `discard_locked`), so the unwinding frees none of it before this
    // releases the device.
    struct FailOnPanic(Weak<Controller>);
    impl Drop for FailOnPanic {
        fn drop(&mut self) {
            if std::thread::panicking() {
                if let Some(c) = self.0.upgrade() {
                    c.fail();
                }
            }
        }
    }
    let _guard = FailOnPanic(ctrl.clone());
    // The generation at which an admin command last timed out: later Aborts of that
    // generation are answered at once rather than each waiting out its own deadline on
    // an admin queue known not to answer (the queue resets the controller instead).
    let mut stuck: Option<u64> = None;
    while let Ok(job) = jobs.recv() {
        if let Job::Barrier(done) = job {
            // Answered without holding the controller: whoever waits for this may drop
            // the last reference next and must get the shutdown on its own thread.
            let _ = done.send(());
            continue;
        }
        let Some(c) = ctrl.upgrade() else {
            return;
        };
        c.run(job, &mut stuck);
        // Someone asked to fail the controller while the admin lock was taken.
        if c.abandon.load(Ordering::Acquire) {
            c.fail();
        }
    }
}

impl Controller {
    /// Resets and enables the controller behind `dev`, identifies it and asks for I/O
    /// queues.
    pub fn init(
        dev: Arc<dyn DeviceAccess>,
        opts: DriverOptions,
    ) -> Result<Arc<Controller>, DriverError> {
        dev.enable_bus_master()?;
        let raw = dev.read64(spec::REG_CAP);
        if raw == u64::MAX {
            return Err(DriverError::Failed);
        }
        let cap = Cap::from_u64(raw);
        if !cap.css_nvm {
            return Err(DriverError::Invalid(
                "controller does not support the NVM command set (CAP.CSS)".into(),
            ));
        }
        if cap.mpsmin != 0 {
            return Err(DriverError::Invalid(format!(
                "controller's smallest page is {} bytes; the driver uses 4096",
                4096u64 << cap.mpsmin
            )));
        }
        let entries = ADMIN_ENTRIES.min(cap.mqes.saturating_add(1)).max(2);
        let mut admin = Admin {
            ring: Ring::new(&*dev, 0, entries, cap.dstrd)?,
            next_cid: 0,
            page: dev.alloc_dma(4096)?,
            live: Vec::new(),
            orphans: Vec::new(),
        };
        let abandon = AtomicBool::new(false);
        bring_up(&*dev, cap, &mut admin, &abandon)?;
        let (tx, rx) = mpsc::channel();
        let mut ctrl = Controller {
            dev,
            opts,
            cap,
            id: IdentifyController::parse(&[0; 4096]),
            admin: Mutex::new(admin),
            qids: Mutex::new(vec![true]),
            generation: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            abandon,
            resets: AtomicU64::new(0),
            reclaim_posted: AtomicBool::new(false),
            jobs: Mutex::new(tx),
        };
        let page = ctrl.identify(1, 0)?;
        ctrl.id = IdentifyController::parse(&page);
        let granted = ctrl.set_queue_count()?;
        *ctrl.qids.get_mut().unwrap_or_else(|e| e.into_inner()) = {
            let mut v = vec![false; usize::from(granted) + 1];
            v[0] = true;
            v
        };
        let name = format!("nvme-svc {}", ctrl.dev.name());
        let ctrl = Arc::new(ctrl);
        let weak = Arc::downgrade(&ctrl);
        std::thread::Builder::new()
            .name(name)
            .spawn(move || serve(weak, rx))
            .map_err(DeviceError::Io)?;
        Ok(ctrl)
    }

    pub fn device(&self) -> &Arc<dyn DeviceAccess> {
        &self.dev
    }

    pub fn cap(&self) -> Cap {
        self.cap
    }

    pub fn identity(&self) -> &IdentifyController {
        &self.id
    }

    pub fn options(&self) -> &DriverOptions {
        &self.opts
    }

    /// Largest data transfer of one command in bytes (MDTS), `None` if unlimited.
    pub fn max_transfer(&self) -> Option<usize> {
        match self.id.mdts {
            0 => None,
            m => Some(4096usize << (m.min(20) + self.cap.mpsmin)),
        }
    }

    /// Whether data goes by SGL (controller supports it and the options allow it).
    pub fn use_sgl(&self) -> bool {
        self.opts.use_sgl && self.id.supports_sgl()
    }

    /// Bumped by every completed controller reset.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Controller resets done so far.
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::Relaxed)
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    fn lock_admin(&self) -> std::sync::MutexGuard<'_, Admin> {
        self.admin.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one admin command to completion (or its deadline) with the admin lock held.
    fn admin_locked(&self, a: &mut Admin, sqe: Sqe, what: &str) -> Result<Cqe, DriverError> {
        self.admin_locked_within(a, sqe, what, self.opts.admin_timeout)
    }

    fn admin_locked_within(
        &self,
        a: &mut Admin,
        mut sqe: Sqe,
        what: &str,
        limit: Duration,
    ) -> Result<Cqe, DriverError> {
        if self.is_failed() || self.abandon.load(Ordering::Acquire) {
            return Err(DriverError::Failed);
        }
        a.next_cid = a.next_cid.wrapping_add(1);
        let cid = a.next_cid;
        sqe.set_cid(cid);
        a.ring.push(&sqe);
        a.ring.ring_sq(&*self.dev);
        let deadline = Instant::now() + limit;
        let mut spins = 0u32;
        loop {
            while let Some(cqe) = a.ring.pop() {
                if cqe.cid == cid {
                    a.ring.ring_cq(&*self.dev);
                    let st = cqe.status();
                    if st.is_success() {
                        return Ok(cqe);
                    }
                    return Err(DriverError::Status {
                        what: what.to_owned(),
                        status: st,
                    });
                }
                // A late completion of an earlier command that timed out: dropped.
            }
            a.ring.ring_cq(&*self.dev);
            if self.abandon.load(Ordering::Acquire) {
                return Err(DriverError::Failed);
            }
            if Instant::now() > deadline {
                if self.dev.read32(spec::REG_CSTS) == u32::MAX {
                    return Err(DriverError::Failed);
                }
                return Err(DriverError::Timeout(format!("admin command {what}")));
            }
            spins += 1;
            if spins > 64 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Identify with CNS `cns` for `nsid`: the 4096-byte structure.
    pub fn identify(&self, cns: u8, nsid: u32) -> Result<Box<[u8; 4096]>, DriverError> {
        let mut a = self.lock_admin();
        let mut sqe = Sqe::new(spec::admin::IDENTIFY, nsid);
        sqe.set_prp(a.page.iova(), 0);
        sqe.dw[10] = u32::from(cns);
        a.page.zero();
        self.admin_locked(&mut a, sqe, &format!("Identify CNS {cns}"))?;
        let mut out = Box::new([0u8; 4096]);
        a.page.read(0, &mut out[..]);
        Ok(out)
    }

    /// Identify Namespace `nsid`.
    pub fn identify_namespace(&self, nsid: u32) -> Result<IdentifyNamespace, DriverError> {
        if nsid == 0 || nsid > self.id.nn {
            return Err(DriverError::Invalid(format!(
                "namespace {nsid} does not exist (the controller has {})",
                self.id.nn
            )));
        }
        let ns = IdentifyNamespace::parse(&*self.identify(0, nsid)?);
        if ns.nsze == 0 {
            return Err(DriverError::Invalid(format!(
                "namespace {nsid} is not active (NSZE 0)"
            )));
        }
        Ok(ns)
    }

    /// Set Features / Number of Queues; returns how many I/O SQ/CQ pairs were granted.
    fn set_queue_count(&self) -> Result<u16, DriverError> {
        let mut a = self.lock_admin();
        self.set_queue_count_locked(&mut a)
    }

    fn set_queue_count_locked(&self, a: &mut Admin) -> Result<u16, DriverError> {
        let want = u32::from(self.opts.io_queues.max(1) - 1);
        let mut sqe = Sqe::new(spec::admin::SET_FEATURES, 0);
        sqe.dw[10] = u32::from(spec::FID_NUMBER_OF_QUEUES);
        sqe.dw[11] = want | want << 16;
        let cqe = self.admin_locked(a, sqe, "Set Features (Number of Queues)")?;
        let nsqa = (cqe.result & 0xFFFF) as u16;
        let ncqa = (cqe.result >> 16) as u16;
        Ok(nsqa
            .min(ncqa)
            .saturating_add(1)
            .min(self.opts.io_queues.max(1)))
    }

    /// The SMART / Health Information log (controller-wide, NSID FFFFFFFFh).
    pub fn health_log(&self) -> Result<[u8; spec::SMART_LOG_LEN], DriverError> {
        let mut a = self.lock_admin();
        let mut sqe = Sqe::new(spec::admin::GET_LOG_PAGE, 0xFFFF_FFFF);
        sqe.set_prp(a.page.iova(), 0);
        let numd = (spec::SMART_LOG_LEN / 4 - 1) as u32;
        sqe.dw[10] = u32::from(spec::LID_SMART) | (numd & 0xFFFF) << 16;
        sqe.dw[11] = numd >> 16;
        a.page.zero();
        self.admin_locked(&mut a, sqe, "Get Log Page (SMART)")?;
        let mut out = [0u8; spec::SMART_LOG_LEN];
        a.page.read(0, &mut out);
        Ok(out)
    }

    /// Creates the pair on the device (CQ, then SQ). The queue ID counts as live (maybe on
    /// the device) from the first command on, until a create is refused outright.
    fn create_on_device(&self, a: &mut Admin, ring: &QueueSpec) -> Result<(), DriverError> {
        let qsize = u32::from(ring.entries - 1);
        let qid = u32::from(ring.qid);
        if !a.live.contains(&ring.qid) {
            a.live.push(ring.qid);
        }
        let mut cq = Sqe::new(spec::admin::CREATE_IO_CQ, 0);
        cq.set_prp(ring.cq_iova, 0);
        cq.dw[10] = qid | qsize << 16;
        cq.dw[11] = 1; // physically contiguous, interrupts off (polled)
        if let Err(e) = self.admin_locked(a, cq, &format!("Create I/O CQ {qid}")) {
            // Refused: nothing was created. Timed out: the drive may still create it.
            if matches!(e, DriverError::Status { .. }) {
                a.live.retain(|&q| q != ring.qid);
            }
            return Err(e);
        }
        let mut sq = Sqe::new(spec::admin::CREATE_IO_SQ, 0);
        sq.set_prp(ring.sq_iova, 0);
        sq.dw[10] = qid | qsize << 16;
        sq.dw[11] = 1 | qid << 16;
        if let Err(e) = self.admin_locked(a, sq, &format!("Create I/O SQ {qid}")) {
            if matches!(e, DriverError::Status { .. }) {
                let mut d = Sqe::new(spec::admin::DELETE_IO_CQ, 0);
                d.dw[10] = qid;
                if self.admin_locked(a, d, "Delete I/O CQ").is_ok() {
                    a.live.retain(|&q| q != ring.qid);
                }
            }
            return Err(e);
        }
        Ok(())
    }

    /// Takes pair `qid` off the device if it may be there. True when it is off (or the
    /// device is released); false when the drive did not confirm it.
    fn delete_on_device(&self, a: &mut Admin, qid: u16) -> bool {
        if self.is_failed() || !a.live.contains(&qid) {
            return true;
        }
        // Invalid Queue Identifier: no such queue on the device, which is what we want.
        let gone = |r: &Result<Cqe, DriverError>| match r {
            Ok(_) => true,
            Err(DriverError::Status { status, .. }) => status.sct == 1 && status.sc == 0x01,
            Err(_) => false,
        };
        let mut d = Sqe::new(spec::admin::DELETE_IO_SQ, 0);
        d.dw[10] = u32::from(qid);
        let sq = self.admin_locked(a, d, "Delete I/O SQ");
        if matches!(sq, Err(DriverError::Timeout(_) | DriverError::Failed)) {
            return self.is_failed();
        }
        let mut d = Sqe::new(spec::admin::DELETE_IO_CQ, 0);
        d.dw[10] = u32::from(qid);
        let cq = self.admin_locked(a, d, "Delete I/O CQ");
        if gone(&sq) && gone(&cq) {
            a.live.retain(|&q| q != qid);
            return true;
        }
        self.is_failed()
    }

    /// Deletes `pair` from the device, then frees its memory and queue ID; if the drive
    /// does not confirm the delete, keeps both until a reset or the device's release
    /// (false then).
    ///
    /// The pair waits among the orphans while the delete runs, not in this frame: should
    /// anything on the way panic (the device layer, a log subscriber), unwinding leaves it
    /// in the admin state, where it is freed only by a reset or after the device's release
    /// (the service thread's panic guard fails the controller; `Controller`'s drop releases
    /// the device before the admin state goes).
    fn discard_locked(&self, a: &mut Admin, pair: Teardown) -> bool {
        let qid = pair.ring.qid;
        a.orphans.push(pair);
        if !self.delete_on_device(a, qid) {
            tracing::warn!(
                "nvme {}: I/O queue {qid} could not be deleted; its memory is kept until \
                 the controller is reset or released",
                self.dev.name()
            );
            return false;
        }
        // Still there (it left only with a reset or release, which need this lock): the
        // last one pushed with this ID.
        if let Some(i) = a.orphans.iter().rposition(|o| o.ring.qid == qid) {
            drop(a.orphans.remove(i));
        }
        self.free_qid(qid);
        true
    }

    /// The pairs are off the device (reset or release): orphans' memory and queue IDs can
    /// go.
    fn forget_pairs(&self, a: &mut Admin) {
        a.live.clear();
        for o in std::mem::take(&mut a.orphans) {
            let qid = o.ring.qid;
            drop(o);
            self.free_qid(qid);
        }
    }

    /// The longest a controller reset may take: every bring-up attempt waits CAP.TO for
    /// CSTS.RDY to fall and again to rise, with a pause between attempts.
    pub fn reset_time_bound(&self) -> Duration {
        let wait = Duration::from_millis(500 * u64::from(self.cap.to.max(2)));
        (wait * 2 + Duration::from_millis(200)) * RESET_ATTEMPTS + Duration::from_secs(1)
    }

    /// Largest I/O queue the controller allows, capped at `want` and rounded down to a
    /// power of two (DOCA STA needs that for queues it is handed; harmless otherwise).
    pub fn io_queue_entries(&self, want: u32) -> u16 {
        let max = u32::from(self.cap.mqes) + 1;
        let n = want.clamp(2, max.min(4096));
        (1u32 << (31 - n.leading_zeros())) as u16
    }

    /// A free queue ID and the rings of a pair of `entries` entries, not yet on the
    /// device (no admin command; see `Job::Create` and [`Controller::create_io_pair`]).
    ///
    /// With every ID taken this fails at once, and asks the service thread to see whether
    /// orphans hold some of them (`Job::Reclaim`): if so, it resets the controller, and a
    /// later call finds their IDs free.
    pub fn reserve_io_pair(&self, entries: u16) -> Result<Ring, DriverError> {
        if self.is_failed() {
            return Err(DriverError::Failed);
        }
        let qid = {
            let mut q = self.qids.lock().unwrap_or_else(|e| e.into_inner());
            let Some(i) = q.iter().position(|used| !used) else {
                let granted = q.len() - 1;
                drop(q);
                // Never waits: the admin lock (which the orphans are under) may be held
                // for seconds, and this runs on an IO thread.
                if !self.reclaim_posted.swap(true, Ordering::AcqRel) && !self.post(Job::Reclaim) {
                    self.reclaim_posted.store(false, Ordering::Release);
                }
                return Err(DriverError::Invalid(format!(
                    "no free I/O queue on the controller ({granted} granted)"
                )));
            };
            q[i] = true;
            i as u16
        };
        let ring = Ring::new(&*self.dev, qid, entries, self.cap.dstrd);
        if ring.is_err() {
            self.free_qid(qid);
        }
        ring
    }

    /// A new I/O queue pair of `entries` entries on a free queue ID, created on the
    /// device before this returns (waits for the admin queue: not for an IO thread).
    pub fn create_io_pair(&self, entries: u16) -> Result<Ring, DriverError> {
        let ring = self.reserve_io_pair(entries)?;
        let mut a = self.lock_admin();
        match self.create_on_device(&mut a, &ring.spec()) {
            Ok(()) => Ok(ring),
            Err(e) => {
                self.discard_locked(&mut a, Teardown::new(ring, Box::new(())));
                Err(e)
            }
        }
    }

    /// Recreates `ring` on the device after a controller reset (same queue ID, empty).
    pub fn recreate_io_pair(&self, ring: &mut Ring) -> Result<(), DriverError> {
        ring.reset();
        let mut a = self.lock_admin();
        self.create_on_device(&mut a, &ring.spec())
    }

    /// Deletes the queue pair on the device and frees it and its queue ID; `on_device`
    /// false: the caller knows the device does not have it (the controller failed). A
    /// delete the drive does not confirm keeps the memory (see [`Teardown`]). Waits for
    /// the admin queue: an IO thread's queue hands this to the service thread instead.
    pub fn delete_io_pair(&self, ring: Ring, on_device: bool) {
        if on_device && !self.is_failed() {
            let mut a = self.lock_admin();
            self.discard_locked(&mut a, Teardown::new(ring, Box::new(())));
            return;
        }
        let qid = ring.qid;
        drop(ring);
        self.free_qid(qid);
    }

    fn free_qid(&self, qid: u16) {
        let mut q = self.qids.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = q.get_mut(usize::from(qid)) {
            *u = false;
        }
    }

    /// Abort command `cid` on SQ `sqid`, waiting at most `limit` for the Abort itself
    /// (I/O queues ask the service thread for it: `Job::Abort`).
    /// `Ok(true)`: the controller says it aborted it (its completion follows with Command
    /// Abort Requested); `Ok(false)`: it did not.
    pub fn abort(&self, sqid: u16, cid: u16, limit: Duration) -> Result<bool, DriverError> {
        let mut sqe = Sqe::new(spec::admin::ABORT, 0);
        sqe.dw[10] = u32::from(sqid) | u32::from(cid) << 16;
        let mut a = self.lock_admin();
        let cqe = self.admin_locked_within(&mut a, sqe, "Abort", limit)?;
        Ok(cqe.result & 1 == 0)
    }

    /// Reads CSTS (and the platform's removal notice) to see whether the controller is
    /// still working.
    pub fn check_health(&self) -> Health {
        if self.is_failed() || self.dev.removal_requested() {
            return Health::Removed;
        }
        let csts = self.dev.read32(spec::REG_CSTS);
        if csts == u32::MAX {
            return Health::Removed;
        }
        if csts & spec::CSTS_CFS != 0 || csts & spec::CSTS_RDY == 0 {
            return Health::NeedsReset;
        }
        Health::Ok
    }

    /// Resets the controller unless someone already did since generation `seen` was
    /// current. Every I/O queue is gone afterwards; their owners recreate them.
    ///
    /// Blocks for as long as the controller takes (each of the bring-up attempts may
    /// wait CAP.TO twice): I/O queues ask the service thread for it (`Job::Reset`).
    pub fn reset(&self, seen: u64) -> Result<(), DriverError> {
        let mut a = self.lock_admin();
        if self.generation() != seen {
            return Ok(());
        }
        if self.is_failed() {
            return Err(DriverError::Failed);
        }
        // A reset that races a function-level reset still in progress (memory space off,
        // writes dropped, the FLR landing after our enable) fails to come ready: try a
        // few times, restoring Bus Master each time.
        let mut result = Err(DriverError::Failed);
        for attempt in 0..RESET_ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(200));
            }
            if self.abandon.load(Ordering::Acquire) {
                result = Err(DriverError::Failed);
                break;
            }
            let _ = self.dev.enable_bus_master();
            result = bring_up(&*self.dev, self.cap, &mut a, &self.abandon);
            if matches!(result, Ok(()) | Err(DriverError::Failed)) {
                break;
            }
            tracing::warn!(
                "nvme {}: controller reset attempt {} failed: {}",
                self.dev.name(),
                attempt + 1,
                result
                    .as_ref()
                    .err()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            );
        }
        if result.is_ok() {
            // The controller was disabled: no I/O queue pair is left on it.
            self.forget_pairs(&mut a);
        }
        // Still under the admin lock, up to the generation bump: a queue that saw the
        // controller not ready meanwhile waits here and then finds the new generation
        // instead of resetting a second time.
        let result = result.and_then(|()| self.set_queue_count_locked(&mut a).map(|_| ()));
        match result {
            Ok(()) => {
                self.resets.fetch_add(1, Ordering::Relaxed);
                self.generation.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            Err(e) => {
                if matches!(e, DriverError::Failed) {
                    drop(a);
                    self.fail();
                }
                Err(e)
            }
        }
    }

    /// Gives up on the controller: no more commands, and the device is released so the
    /// platform can take it (hot removal). Outstanding commands are failed by their
    /// queues once this returns (the device can no longer DMA into their buffers).
    pub fn fail(&self) {
        let mut a = self.lock_admin();
        self.fail_locked(&mut a);
    }

    /// With the admin lock held. `failed` is set only once the device is released, so a
    /// queue that sees it may give its buffers back.
    fn fail_locked(&self, a: &mut Admin) {
        if !self.failed.load(Ordering::Acquire) {
            self.dev.release();
            self.failed.store(true, Ordering::Release);
        }
        self.forget_pairs(a);
    }

    /// [`Controller::fail`] without waiting for the admin lock (for an IO thread): done at
    /// once when the lock is free; otherwise whoever holds it stops early (see `abandon`)
    /// and the service thread fails the controller next. Returns whether it is failed
    /// now; if not, the caller holds its commands and asks again later
    /// ([`Controller::is_failed`]).
    pub fn fail_soon(&self) -> bool {
        let first = !self.abandon.swap(true, Ordering::AcqRel);
        match self.admin.try_lock() {
            Ok(mut a) => self.fail_locked(&mut a),
            Err(TryLockError::Poisoned(p)) => {
                let mut a = p.into_inner();
                self.fail_locked(&mut a);
            }
            Err(TryLockError::WouldBlock) => {
                if first {
                    // If the thread is gone there is nobody to wait for: the lock holder
                    // stops early and a later call finds the lock free.
                    let _ = self.post(Job::Fail);
                }
            }
        }
        self.is_failed()
    }

    /// Hands `job` to the service thread; false if the thread is gone.
    pub(crate) fn post(&self, job: Job) -> bool {
        let tx = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        tx.send(job).is_ok()
    }

    /// Hands a dropped queue's pair and memory to the service thread, which deletes the
    /// pair and frees the memory after (`Job::Delete`); returns at once. It takes the
    /// queue's own reference to the controller (`keep`) and its other references
    /// (`owners`), and keeps none here, so that whichever is the last drops on the service
    /// thread, never on the IO thread that dropped the queue.
    pub(crate) fn retire(keep: Arc<Self>, pair: Teardown, owners: Box<dyn Send>) {
        let tx = keep.jobs.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let job = Job::Delete {
            pair,
            keep,
            owners: Owners { _held: owners },
        };
        if let Err(mpsc::SendError(job)) = tx.send(job) {
            // The thread is gone, which happens only after a job panicked, and then the
            // controller was failed (the device released): freeing is safe. Should it not
            // be failed, the memory is leaked rather than freed under the device.
            if !matches!(&job, Job::Delete { keep, .. } if keep.is_failed()) {
                std::mem::forget(job);
            }
        }
    }

    /// Runs one job on the service thread.
    fn run(&self, job: Job, stuck: &mut Option<u64>) {
        match job {
            Job::Abort {
                sqid,
                cid,
                generation,
                limit,
                to,
            } => {
                if to.owner_gone() {
                    return;
                }
                let result = if self.generation() != generation {
                    Ok(false)
                } else if *stuck == Some(generation) {
                    Err(DriverError::Timeout(
                        "Abort (the admin queue is not answering)".into(),
                    ))
                } else {
                    self.abort(sqid, cid, limit)
                };
                match &result {
                    Err(DriverError::Failed) => self.fail(),
                    Err(DriverError::Timeout(_)) => *stuck = Some(generation),
                    _ => {}
                }
                to.send(Answer::Abort { cid, result });
            }
            Job::Reset { seen, to } => {
                if to.owner_gone() {
                    return;
                }
                let result = self.reset(seen);
                if result.is_err() {
                    self.fail();
                }
                to.send(Answer::Reset(result));
            }
            Job::Recreate {
                queue,
                generation,
                to,
            } => {
                let result = {
                    // The owner is checked under the admin lock: a queue being dropped
                    // lets go of its token before it deletes its pair under that lock,
                    // so its rings are never created on the device once freed.
                    let mut a = self.lock_admin();
                    if to.owner_gone() {
                        return;
                    }
                    if self.generation() != generation {
                        Ok(())
                    } else {
                        self.create_on_device(&mut a, &queue)
                    }
                };
                if result.is_err() {
                    self.fail();
                }
                to.send(Answer::Recreate(result));
            }
            Job::Create { queue, to } => {
                let (generation, result) = {
                    // As for Recreate: a queue dropped before its pair was created never
                    // gets it (its Delete job follows this one).
                    let mut a = self.lock_admin();
                    if to.owner_gone() {
                        return;
                    }
                    let generation = self.generation();
                    // On an admin queue known not to answer, each create would wait out
                    // the admin timeout in turn: answered at once (the queue then asks
                    // for the reset that brings it back).
                    let result = if *stuck == Some(generation) {
                        Err(DriverError::Timeout(
                            "Create I/O CQ (the admin queue is not answering)".into(),
                        ))
                    } else {
                        self.create_on_device(&mut a, &queue)
                    };
                    (generation, result)
                };
                if matches!(result, Err(DriverError::Timeout(_))) {
                    *stuck = Some(generation);
                }
                to.send(Answer::Create { generation, result });
            }
            Job::Delete { pair, keep, owners } => {
                let mut a = self.lock_admin();
                let generation = self.generation();
                if *stuck == Some(generation)
                    && a.live.contains(&pair.ring.qid)
                    && !self.is_failed()
                {
                    // As for creates: kept until the reset or release, without waiting.
                    a.orphans.push(pair);
                } else if !self.discard_locked(&mut a, pair) {
                    *stuck = Some(generation);
                }
                drop(a);
                // Maybe the last references: the device closes, or the controller shuts
                // down, after the delete.
                drop(owners);
                drop(keep);
            }
            Job::Reclaim => {
                self.reclaim_posted.store(false, Ordering::Release);
                let (seen, orphans) = {
                    let a = self.lock_admin();
                    (self.generation(), a.orphans.len())
                };
                let some_free = self
                    .qids
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .skip(1)
                    .any(|used| !used);
                if orphans == 0 || some_free || self.is_failed() {
                    // The IDs are all in use by live queues, or one came back since the
                    // job was posted (a confirmed delete, another reset): no reset for
                    // nothing.
                    return;
                }
                tracing::warn!(
                    "nvme {}: every I/O queue ID is taken, {orphans} by dropped queues whose \
                     delete the drive never confirmed: resetting the controller to free them",
                    self.dev.name()
                );
                // As for a queue's reset: one that fails fails the controller. A reset by
                // someone else since `seen` freed the orphans already.
                if self.reset(seen).is_err() {
                    self.fail();
                }
            }
            Job::Fail => self.fail(),
            Job::Barrier(done) => {
                let _ = done.send(());
            }
        }
    }

    /// Waits until the service thread has done every job posted so far (the deletes of
    /// dropped queues among them, whose jobs hold the controller), at most `limit`; true
    /// if it has. For shutdown, so that the controller's last reference, and with it the
    /// normal shutdown (CC.SHN), stays with the caller; never for an IO thread.
    pub fn settle(&self, limit: Duration) -> bool {
        let (tx, rx) = mpsc::channel();
        self.post(Job::Barrier(tx)) && rx.recv_timeout(limit).is_ok()
    }

    /// Normal shutdown (CC.SHN) when the last user goes away.
    pub fn shutdown(&self) {
        if self.is_failed() {
            return;
        }
        let _a = self.lock_admin();
        let cc = self.dev.read32(spec::REG_CC);
        if cc == u32::MAX || cc & spec::CC_EN == 0 {
            return;
        }
        self.dev
            .write32(spec::REG_CC, cc & !spec::CC_SHN_MASK | spec::CC_SHN_NORMAL);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let csts = self.dev.read32(spec::REG_CSTS);
            if csts == u32::MAX || csts & spec::CSTS_SHST_MASK == spec::CSTS_SHST_DONE {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.shutdown();
        // Pairs whose delete the drive never confirmed may still be in its hands, and their
        // memory goes with the admin state right after this: take the device off the bus
        // first (Bus Master off), so it can no longer write into memory freed under it.
        let a = self.admin.get_mut().unwrap_or_else(|e| e.into_inner());
        if !a.orphans.is_empty() && !self.failed.load(Ordering::Acquire) {
            self.dev.release();
        }
    }
}
