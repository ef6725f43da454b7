//! One IO thread's queue on an NVMe namespace: [`NvmeQueue`] turns backend requests into
//! NVMe commands on its own I/O SQ/CQ pair, polls completions, and handles timeouts,
//! controller resets and removal.
//!
//! - A request becomes one or more commands ("parts"): Read/Write are cut at the drive's
//!   MDTS (and at 2 MiB, one PRP list page, and 65536 blocks, NLB's limit); Write Zeroes at
//!   65536 blocks; Deallocate is one Dataset Management range. Parts are issued as command
//!   IDs free up; the request completes when its last part does, with the first error.
//! - Data buffers are the engine's [`IoBuf`]s, mapped for the device once and cached by
//!   their never-reused id ([`MapCache`]): in steady state (the pool recycling the same
//!   buffers) no I/O makes a syscall. The cache is bounded in entries and bytes; a
//!   mapping in use by a command is never evicted.
//! - Data pointers: one SGL Data Block descriptor when the controller supports SGLs
//!   (the mapped buffer is contiguous in IOVA space), else PRP1/PRP2 or a PRP list in a
//!   page reserved per command ID.
//! - Timeouts: a command outstanding longer than `io_timeout` is aborted; if the Abort
//!   fails or the command is still outstanding `abort_timeout` later, the controller is
//!   reset. After a reset (by this queue or another) the queue recreates its SQ/CQ and
//!   resubmits what was outstanding, up to `max_retries` times per command, then fails
//!   it. Data is never acknowledged before the drive completed it, so nothing
//!   acknowledged is lost.
//! - None of that waits on the IO thread: creating the queue pair, Aborts, resets,
//!   re-creating the pair and deleting it are jobs for the controller's service thread
//!   (`driver.rs`). A new queue exists at once and holds its requests (up to its depth)
//!   until its pair is on the device. A create that times out resets the controller
//!   (then the pair is created as after any reset); one the drive refuses fails the
//!   queue's requests with [`IoStatus::Unavailable`]. While a reset or re-creation this queue asked for is
//!   pending, the queue holds too: it does not touch its rings, keeps what is outstanding
//!   as it is, and keeps new requests until the pair is back. Dropping the queue hands its
//!   rings, PRP list pages and outstanding buffers to the service thread, which frees them
//!   only once the drive has deleted the pair. A command whose Abort is pending keeps its command ID until
//!   the answer, so the Abort can never hit a later command with the same ID.
//! - Removal (all-ones reads, CSTS gone, or the platform's request): the controller is
//!   released (no more DMA), everything outstanding fails with
//!   [`IoStatus::Unavailable`], and so does every later request.
//!
//! No `unsafe` here.

#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::device::{DeviceAccess, DeviceError, DmaRegion};
use super::driver::{Answer, Controller, DriverError, Health, Job, Mailbox, Ring, Teardown};
use super::spec::{self, io, Sqe, Status};
use super::NvmeBackend;
use crate::{BackendQueue, Completion, IoBuf, IoStatus, Op, Request, SubmitError};

/// Longest wait between two controller resets for timed-out commands of one queue.
/// Below the Linux host's 30 s I/O timeout, so a host whose command waits on a drive
/// that is being backed off from still sees a reset (and a retry) before it gives up.
const MAX_RESET_BACKOFF: Duration = Duration::from_secs(16);

/// Largest part: one PRP list page holds 512 entries, plus PRP1's page.
const MAX_PART_BYTES: usize = 2 << 20;
/// Write Zeroes fallback buffer (when the drive has no Write Zeroes).
const ZERO_BYTES: usize = 128 << 10;

/// Maps [`IoBuf`]s for the device once and remembers them by buffer id.
#[derive(Debug)]
pub struct MapCache {
    dev: Arc<dyn DeviceAccess>,
    entries: HashMap<u64, MapEntry>,
    bytes: usize,
    max_entries: usize,
    max_bytes: usize,
    tick: u64,
    stats: MapStats,
}

#[derive(Debug)]
struct MapEntry {
    iova: u64,
    len: usize,
    last: u64,
    users: u32,
}

/// Counters of a [`MapCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapStats {
    pub hits: u64,
    pub maps: u64,
    pub evictions: u64,
}

impl MapCache {
    pub fn new(dev: Arc<dyn DeviceAccess>, max_entries: usize, max_bytes: usize) -> MapCache {
        MapCache {
            dev,
            entries: HashMap::new(),
            bytes: 0,
            max_entries: max_entries.max(1),
            max_bytes,
            tick: 0,
            stats: MapStats::default(),
        }
    }

    /// The IOVA of `buf`, mapping it if needed; the entry is pinned until [`MapCache::put`].
    pub fn get(&mut self, buf: &IoBuf) -> Result<u64, DeviceError> {
        self.tick += 1;
        if let Some(e) = self.entries.get_mut(&buf.id()) {
            e.last = self.tick;
            e.users += 1;
            self.stats.hits += 1;
            return Ok(e.iova);
        }
        let len = buf.capacity();
        while !self.entries.is_empty()
            && (self.entries.len() >= self.max_entries || self.bytes + len > self.max_bytes)
        {
            if !self.evict_one() {
                break;
            }
        }
        let iova = match self.dev.map_dma(buf) {
            Ok(i) => i,
            Err(e) => {
                // Out of mappings (VFIO's per-container limit, locked memory): make room
                // once and retry.
                if !self.evict_one() {
                    return Err(e);
                }
                self.dev.map_dma(buf)?
            }
        };
        self.stats.maps += 1;
        self.bytes += len;
        self.entries.insert(
            buf.id(),
            MapEntry {
                iova,
                len,
                last: self.tick,
                users: 1,
            },
        );
        Ok(iova)
    }

    /// Releases one use of buffer `id`'s mapping.
    pub fn put(&mut self, id: u64) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.users = e.users.saturating_sub(1);
        }
    }

    /// Unmaps the least recently used idle entry.
    fn evict_one(&mut self) -> bool {
        let victim = self
            .entries
            .iter()
            .filter(|(_, e)| e.users == 0)
            .min_by_key(|(_, e)| e.last)
            .map(|(&id, _)| id);
        match victim.and_then(|id| self.entries.remove(&id)) {
            Some(e) => {
                self.dev.unmap_dma(e.iova, e.len);
                self.bytes -= e.len;
                self.stats.evictions += 1;
                true
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn stats(&self) -> MapStats {
        self.stats
    }
}

impl Drop for MapCache {
    fn drop(&mut self) {
        for (_, e) in self.entries.drain() {
            self.dev.unmap_dma(e.iova, e.len);
        }
    }
}

/// One request in flight.
#[derive(Debug)]
struct Slot {
    tag: u64,
    op: Op,
    lba: u64,
    nblocks: u32,
    buf: Option<IoBuf>,
    iova: u64,
    /// Blocks covered by parts issued so far.
    issued: u32,
    /// Parts submitted and not completed.
    outstanding: u32,
    status: IoStatus,
}

/// One NVMe command in flight (index = command ID).
#[derive(Debug)]
struct Cmd {
    slot: u32,
    sqe: Sqe,
    started: Instant,
    abort_sent: Option<Instant>,
    retries: u8,
}

/// What the queue waits for from the controller's service thread before it uses its
/// rings again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    /// Nothing: the queue runs.
    No,
    /// Its queue pair, being created on the device for the first time.
    Create,
    /// The controller reset this queue asked for.
    Reset,
    /// Its queue pair, created again on the device after a reset.
    Recreate,
    /// The controller being failed (released), before outstanding commands fail.
    Fail,
}

/// Counters of one queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub commands: u64,
    pub timeouts: u64,
    pub aborts: u64,
    pub resets: u64,
    pub retries: u64,
    pub recoveries: u64,
}

/// A per-thread queue on an [`NvmeBackend`].
#[derive(Debug)]
pub struct NvmeQueue {
    // `ns`, `ctrl`, `dev` and `maps` are moved out only in `Drop`, which hands them to the
    // service thread with the pair: whichever reference to the controller or the device
    // is the last, it never drops on the IO thread (a controller's shutdown waits up to
    // 2 s for CC.SHN, and closing the device may reset it).
    ns: Held<Arc<NvmeBackend>>,
    ctrl: Held<Arc<Controller>>,
    dev: Held<Arc<dyn DeviceAccess>>,
    ring: Option<Ring>,
    generation: u64,
    depth: usize,
    slots: Vec<Option<Slot>>,
    free_slots: Vec<u32>,
    /// Slots with parts still to issue, oldest first.
    issue: VecDeque<u32>,
    /// Commands to resubmit (retries), before new parts.
    retry: VecDeque<Cmd>,
    cmds: Vec<Option<Cmd>>,
    free_cids: Vec<u16>,
    /// One 4 KiB page per command ID: PRP list or DSM range. Always there; an `Option`
    /// only so that `Drop` can hand it to the service thread.
    lists: Option<DmaRegion>,
    zeroes: Option<DmaRegion>,
    ready: VecDeque<Completion>,
    maps: Held<MapCache>,
    max_part_blocks: u32,
    next_check: Instant,
    /// When this queue last reset the controller because a command timed out, and how
    /// long it waits before it does so again (doubling up to [`MAX_RESET_BACKOFF`]): a
    /// drive that is only slow is not reset over and over, which would stall every queue
    /// of every namespace on it for nothing.
    last_timeout_reset: Option<Instant>,
    reset_backoff: Duration,
    failed: bool,
    hold: Hold,
    /// `abort_pending[cid]`: an Abort of this command ID was posted and not answered; the
    /// ID is not reused until it is.
    abort_pending: Vec<bool>,
    answers: mpsc::Receiver<Answer>,
    mailbox: mpsc::Sender<Answer>,
    /// Liveness token for the service thread: jobs of a dropped queue are skipped.
    alive: Arc<()>,
    stats: QueueStats,
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Maps an NVMe completion status to a backend status.
///
/// The drive's own status goes to the host as it is, DNR included (generic,
/// command-specific and media statuses: Invalid Field, Namespace Write Protected,
/// Reservation Conflict, Attempted Write to Read Only Range, a protection check error,
/// Unrecovered Read Error...), since each request is the same command on the drive as on
/// the fabric. A vendor-specific status means nothing to the host: Internal Error with
/// DNR. No drive status takes the namespace out ([`IoStatus::Unavailable`] is for a
/// failed or removed controller only).
pub fn io_status(_op: Op, st: Status) -> IoStatus {
    match (st.sct, st.sc) {
        (0, 0) => IoStatus::Ok,
        (0, 0x80) => IoStatus::OutOfRange,
        (0, 0x81) => IoStatus::NoSpace,
        // About the drive-side command this driver built (its command ID, PRPs, SGLs),
        // not the host's: Internal Error with DNR.
        (0, 0x03 | 0x0d..=0x16) => IoStatus::Failed,
        // Path statuses are about the path between this driver and the drive, not the
        // host's path to us: passed on, they would send a multipath host to another
        // path of ours, behind which is the same drive. Internal Error, no DNR.
        (3, _) => IoStatus::Busy,
        (0..=2, _) => IoStatus::Device {
            sct: st.sct,
            sc: st.sc,
            dnr: st.dnr,
        },
        _ => IoStatus::Failed,
    }
}

/// Whether the drive said "try again".
fn retryable(st: Status) -> bool {
    st.same(Status::ABORT_REQUESTED)
        || st.same(Status::ABORTED_SQ_DELETION)
        || (!st.dnr && (st.same(Status::NAMESPACE_NOT_READY) || st.same(Status::INTERNAL_ERROR)))
}

impl NvmeQueue {
    pub(super) fn new(ns: Arc<NvmeBackend>, depth: u32) -> Result<NvmeQueue, DriverError> {
        if depth == 0 || depth > 4096 {
            return Err(DriverError::Invalid(format!(
                "queue depth {depth} not in 1..=4096"
            )));
        }
        let ctrl = Arc::clone(ns.controller());
        if ctrl.is_failed() {
            return Err(DriverError::Failed);
        }
        let dev = Arc::clone(ctrl.device());
        let want = if ns.opts.queue_entries > 0 {
            ns.opts.queue_entries
        } else {
            (depth + 1).next_power_of_two()
        };
        let entries = ctrl.io_queue_entries(want);
        // Only the queue ID and memory here: the admin commands that create the pair on
        // the device run on the controller's service thread (`Job::Create`), and requests
        // wait in the queue until it answers.
        let ring = ctrl.reserve_io_pair(entries)?;
        let ncmds = usize::from(entries) - 1;
        let lists = match dev.alloc_dma(ncmds * spec::PAGE) {
            Ok(l) => l,
            Err(e) => {
                ctrl.delete_io_pair(ring, false);
                return Err(e.into());
            }
        };
        let bs = ns.block_size as usize;
        let part = ctrl
            .max_transfer()
            .map_or(MAX_PART_BYTES, |m| m.min(MAX_PART_BYTES))
            .min(65536 * bs);
        let maps = MapCache::new(
            Arc::clone(&dev),
            ns.opts.map_cache_entries,
            ns.opts.map_cache_bytes,
        );
        let (mailbox, answers) = mpsc::channel();
        let queue = ring.spec();
        let q = NvmeQueue {
            generation: ctrl.generation(),
            ctrl: Held::new(ctrl),
            dev: Held::new(dev),
            ring: Some(ring),
            depth: depth as usize,
            slots: (0..depth).map(|_| None).collect(),
            free_slots: (0..depth).rev().collect(),
            issue: VecDeque::new(),
            retry: VecDeque::new(),
            cmds: (0..ncmds).map(|_| None).collect(),
            free_cids: (0..ncmds as u16).rev().collect(),
            lists: Some(lists),
            zeroes: None,
            ready: VecDeque::new(),
            maps: Held::new(maps),
            max_part_blocks: (part / bs).max(1) as u32,
            next_check: Instant::now(),
            last_timeout_reset: None,
            reset_backoff: Duration::ZERO,
            failed: false,
            hold: Hold::Create,
            abort_pending: vec![false; ncmds],
            answers,
            mailbox,
            alive: Arc::new(()),
            stats: QueueStats::default(),
            ns: Held::new(ns),
            _not_send: std::marker::PhantomData,
        };
        let job = Job::Create {
            queue,
            to: q.mailbox(),
        };
        if !q.ctrl.post(job) {
            // No service thread: the controller failed (see `serve`).
            return Err(DriverError::Failed);
        }
        Ok(q)
    }

    /// The per-command pages (there until `Drop`).
    fn lists(&self) -> &DmaRegion {
        self.lists
            .as_ref()
            .expect("the PRP list pages live as long as the queue")
    }

    /// This queue's counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// The mapping cache's counters and size.
    pub fn map_stats(&self) -> (MapStats, usize) {
        (self.maps.stats(), self.maps.len())
    }

    /// Waits until the queue pair is on the device (the service thread answered the
    /// create), at most `limit`. For callers that may wait (tools, tests); an IO thread
    /// just submits and polls, and its requests wait in the queue meanwhile.
    pub fn wait_created(&mut self, limit: Duration) -> Result<(), DriverError> {
        let deadline = Instant::now() + limit;
        loop {
            self.take_answers();
            if self.failed {
                return Err(DriverError::Failed);
            }
            if self.hold != Hold::Create {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(DriverError::Timeout(format!(
                    "creating I/O queue {:?}",
                    self.qid()
                )));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// The queue ID on the controller.
    pub fn qid(&self) -> Option<u16> {
        self.ring.as_ref().map(|r| r.qid)
    }

    fn complete_now(&mut self, req: Request, status: IoStatus) {
        self.ready.push_back(Completion {
            tag: req.tag,
            status,
            buf: req.buf,
        });
    }

    /// Builds the next part of slot `si` for command `cid`: the SQE and blocks covered.
    fn build_part(&mut self, si: u32, cid: u16) -> Option<(Sqe, u32)> {
        let nsid = self.ns.nsid;
        let bs = self.ns.block_size as usize;
        let id = self.ctrl.identity();
        let has_wz = id.oncs & spec::ONCS_WRITE_ZEROES != 0;
        // Deallocate must read back zeroes (the backend contract): DSM only when the
        // namespace says deallocated blocks read as zeroes, else Write Zeroes with DEAC.
        let has_dsm = id.oncs & spec::ONCS_DSM != 0 && self.ns.dsm_zeroes;
        let sgl = self.ns.use_sgl();
        let list_off = usize::from(cid) * spec::PAGE;
        let list_iova = self.lists().iova() + list_off as u64;
        let max_part = self.max_part_blocks;
        let slot = self.slots[si as usize].as_ref()?;
        let rest = slot.nblocks - slot.issued;
        let lba = slot.lba + u64::from(slot.issued);
        let mut data: Option<(u64, usize)> = None;
        let (mut sqe, blocks) = match slot.op {
            Op::Flush => (Sqe::new(io::FLUSH, nsid), slot.nblocks.max(1)),
            Op::Read | Op::Write { .. } => {
                let n = rest.min(max_part);
                let opc = if slot.op == Op::Read {
                    io::READ
                } else {
                    io::WRITE
                };
                let mut s = Sqe::new(opc, nsid);
                s.set_slba(lba);
                s.dw[12] = n - 1;
                if let Op::Write { fua: true } = slot.op {
                    s.dw[12] |= 1 << 30;
                }
                let off = slot.issued as usize * bs;
                data = Some((slot.iova + off as u64, n as usize * bs));
                (s, n)
            }
            Op::Deallocate if has_dsm => {
                let mut range = [0u8; 16];
                range[4..8].copy_from_slice(&rest.to_le_bytes());
                range[8..16].copy_from_slice(&lba.to_le_bytes());
                self.lists().write(list_off, &range);
                let mut s = Sqe::new(io::DSM, nsid);
                s.dw[10] = 0; // one range
                s.dw[11] = 1 << 2; // AD: deallocate
                if sgl {
                    s.set_sgl_data_block(list_iova, 16);
                } else {
                    s.set_prp(list_iova, 0);
                }
                return Some((s, rest));
            }
            Op::WriteZeroes { .. } | Op::Deallocate if has_wz => {
                let n = rest.min(65536);
                let mut s = Sqe::new(io::WRITE_ZEROES, nsid);
                s.set_slba(lba);
                s.dw[12] = n - 1;
                if slot.op == Op::Deallocate {
                    s.dw[12] |= 1 << 25; // DEAC: the drive may deallocate
                }
                if let Op::WriteZeroes { fua: true } = slot.op {
                    s.dw[12] |= 1 << 30;
                }
                (s, n)
            }
            Op::WriteZeroes { .. } | Op::Deallocate => {
                // No Write Zeroes on this drive: write from a zero buffer.
                let zlen = ZERO_BYTES.min(max_part as usize * bs);
                if self.zeroes.is_none() {
                    self.zeroes = self.dev.alloc_dma(zlen).ok();
                }
                let z = self.zeroes.as_ref()?;
                let n = rest.min((zlen / bs) as u32).max(1);
                let mut s = Sqe::new(io::WRITE, nsid);
                s.set_slba(lba);
                s.dw[12] = n - 1;
                if let Op::WriteZeroes { fua: true } = slot.op {
                    s.dw[12] |= 1 << 30;
                }
                data = Some((z.iova(), n as usize * bs));
                (s, n)
            }
        };
        if let Some((iova, len)) = data {
            if sgl {
                sqe.set_sgl_data_block(iova, len as u32);
            } else if len <= spec::PAGE {
                sqe.set_prp(iova, 0);
            } else if len <= 2 * spec::PAGE {
                sqe.set_prp(iova, iova + spec::PAGE as u64);
            } else {
                let pages = len.div_ceil(spec::PAGE);
                let mut list = Vec::with_capacity((pages - 1) * 8);
                for k in 1..pages {
                    list.extend_from_slice(&(iova + (k * spec::PAGE) as u64).to_le_bytes());
                }
                self.lists().write(list_off, &list);
                sqe.set_prp(iova, list_iova);
            }
        }
        Some((sqe, blocks))
    }

    /// Puts retries and new parts into the SQ while command IDs are free.
    fn issue_parts(&mut self) {
        if self.failed || self.ring.is_none() || self.hold != Hold::No {
            return;
        }
        let now = Instant::now();
        while !self.retry.is_empty() {
            let Some(cid) = self.free_cids.pop() else {
                return;
            };
            let Some(mut cmd) = self.retry.pop_front() else {
                self.free_cids.push(cid);
                return;
            };
            cmd.sqe.set_cid(cid);
            cmd.started = now;
            cmd.abort_sent = None;
            // A PRP list or DSM range lives in the old command ID's page: move it.
            let (base, end) = (
                self.lists().iova(),
                self.lists().iova() + self.lists().len() as u64,
            );
            let ref_page = cmd.sqe.opcode() == io::DSM
                || (cmd.sqe.psdt() == 0 && (base..end).contains(&cmd.sqe.prp2()));
            if ref_page {
                self.move_page(&mut cmd, cid);
            }
            if let Some(r) = self.ring.as_mut() {
                r.push(&cmd.sqe);
            }
            self.stats.commands += 1;
            self.cmds[usize::from(cid)] = Some(cmd);
        }
        while let Some(&si) = self.issue.front() {
            let pending = match self.slots[si as usize].as_ref() {
                Some(s) => s.status == IoStatus::Ok && s.issued < s.nblocks.max(1),
                None => false,
            };
            if !pending {
                self.issue.pop_front();
                continue;
            }
            let Some(cid) = self.free_cids.pop() else {
                return;
            };
            let Some((mut sqe, blocks)) = self.build_part(si, cid) else {
                self.free_cids.push(cid);
                self.issue.pop_front();
                self.fail_slot_part(si, IoStatus::Unavailable, false);
                continue;
            };
            sqe.set_cid(cid);
            if let Some(s) = self.slots[si as usize].as_mut() {
                s.issued = s.issued.saturating_add(blocks).min(s.nblocks.max(1));
                s.outstanding += 1;
            }
            if let Some(r) = self.ring.as_mut() {
                r.push(&sqe);
            }
            self.stats.commands += 1;
            self.cmds[usize::from(cid)] = Some(Cmd {
                slot: si,
                sqe,
                started: now,
                abort_sent: None,
                retries: 0,
            });
        }
    }

    /// Copies the per-command page (PRP list or DSM range) of a command being resubmitted
    /// under a new command ID, and points the command at the new page.
    fn move_page(&mut self, cmd: &mut Cmd, new_cid: u16) {
        let base = self.lists().iova();
        let old = if cmd.sqe.psdt() == 1 {
            cmd.sqe.sgl1().0
        } else if cmd.sqe.opcode() == io::DSM {
            cmd.sqe.prp1()
        } else {
            cmd.sqe.prp2()
        };
        let old_off = (old - base) as usize / spec::PAGE * spec::PAGE;
        let new_off = usize::from(new_cid) * spec::PAGE;
        if old_off != new_off {
            let mut page = vec![0u8; spec::PAGE];
            self.lists().read(old_off, &mut page);
            self.lists().write(new_off, &page);
        }
        let new = base + new_off as u64 + (old - base) % spec::PAGE as u64;
        if cmd.sqe.psdt() == 1 {
            let (_, len, _) = cmd.sqe.sgl1();
            cmd.sqe.set_sgl_data_block(new, len);
        } else if cmd.sqe.opcode() == io::DSM {
            cmd.sqe.set_prp(new, 0);
        } else {
            let p1 = cmd.sqe.prp1();
            cmd.sqe.set_prp(p1, new);
        }
    }

    /// One part of slot `si` ended with `status`.
    fn part_done(&mut self, si: u32, status: IoStatus) {
        let Some(s) = self.slots[si as usize].as_mut() else {
            return;
        };
        s.outstanding = s.outstanding.saturating_sub(1);
        if status != IoStatus::Ok && s.status == IoStatus::Ok {
            s.status = status;
        }
        let done = s.outstanding == 0 && (s.status != IoStatus::Ok || s.issued >= s.nblocks.max(1));
        if done {
            self.finish(si);
        }
    }

    fn fail_slot_part(&mut self, si: u32, status: IoStatus, was_outstanding: bool) {
        if !was_outstanding {
            if let Some(s) = self.slots[si as usize].as_mut() {
                if s.status == IoStatus::Ok {
                    s.status = status;
                }
                if s.outstanding == 0 {
                    self.finish(si);
                }
            }
            return;
        }
        self.part_done(si, status);
    }

    fn finish(&mut self, si: u32) {
        let Some(mut s) = self.slots[si as usize].take() else {
            return;
        };
        if let Some(b) = s.buf.as_ref() {
            self.maps.put(b.id());
        }
        if s.status == IoStatus::Ok && s.op == Op::Read {
            if let Some(b) = s.buf.as_mut() {
                b.set_len(s.nblocks as usize * self.ns.block_size as usize);
            }
        }
        self.ready.push_back(Completion {
            tag: s.tag,
            status: s.status,
            buf: s.buf,
        });
        self.free_slots.push(si);
    }

    fn reap(&mut self) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        let mut done = Vec::new();
        while let Some(cqe) = ring.pop() {
            done.push(cqe);
        }
        ring.ring_cq(&**self.dev);
        for cqe in done {
            let cid = usize::from(cqe.cid);
            let Some(cmd) = self.cmds.get_mut(cid).and_then(Option::take) else {
                continue; // stale (completed before a reset we already handled)
            };
            self.free_cid(cqe.cid);
            let st = cqe.status();
            let op = self.slots[cmd.slot as usize].as_ref().map(|s| s.op);
            let Some(op) = op else {
                continue;
            };
            if !st.is_success() && retryable(st) && cmd.retries < self.ns.opts.max_retries {
                self.stats.retries += 1;
                self.retry.push_back(Cmd {
                    retries: cmd.retries + 1,
                    ..cmd
                });
                continue;
            }
            self.part_done(cmd.slot, io_status(op, st));
        }
    }

    /// Fails everything outstanding and every later request (controller gone: the device
    /// is released, so the rings can go).
    fn fail_all(&mut self) {
        self.fail_requests();
        if let Some(ring) = self.ring.take() {
            self.ctrl.delete_io_pair(ring, false);
        }
    }

    /// Fails every request this queue holds and every later one. The rings stay (the
    /// device may still have them) until `Drop` hands them to the service thread.
    fn fail_requests(&mut self) {
        if !self.failed {
            tracing_warn(&format!(
                "{}: namespace {} failed: controller removed or unrecoverable",
                self.dev.name(),
                self.ns.nsid
            ));
        }
        self.failed = true;
        self.hold = Hold::No;
        for cid in 0..self.cmds.len() {
            if let Some(cmd) = self.cmds[cid].take() {
                self.free_cid(cid as u16);
                self.part_done(cmd.slot, IoStatus::Unavailable);
            }
        }
        while let Some(cmd) = self.retry.pop_front() {
            self.part_done(cmd.slot, IoStatus::Unavailable);
        }
        while let Some(si) = self.issue.pop_front() {
            self.fail_slot_part(si, IoStatus::Unavailable, false);
        }
        // Slots whose parts all finished but were never completed cannot exist; any slot
        // left is failed here.
        for si in 0..self.slots.len() as u32 {
            if self.slots[si as usize].is_some() {
                if let Some(s) = self.slots[si as usize].as_mut() {
                    s.outstanding = 0;
                    if s.status == IoStatus::Ok {
                        s.status = IoStatus::Unavailable;
                    }
                }
                self.finish(si);
            }
        }
    }

    /// A command ID is free again, unless an Abort naming it is still pending: then it
    /// waits for the Abort's answer.
    fn free_cid(&mut self, cid: u16) {
        if !self.abort_pending[usize::from(cid)] {
            self.free_cids.push(cid);
        }
    }

    fn mailbox(&self) -> Mailbox {
        Mailbox {
            tx: self.mailbox.clone(),
            owner: Arc::downgrade(&self.alive),
        }
    }

    /// Gives up on the controller; outstanding commands fail once it is released (held
    /// until then if another thread holds the admin lock).
    fn fail_controller(&mut self) {
        if self.ctrl.fail_soon() {
            self.fail_all();
        } else {
            self.hold = Hold::Fail;
        }
    }

    /// After a controller reset (by this queue or another): ask for the SQ/CQ to be
    /// created again and hold until it is ([`NvmeQueue::recreated`]).
    fn recover(&mut self) {
        self.stats.recoveries += 1;
        self.generation = self.ctrl.generation();
        if self.ctrl.is_failed() {
            self.fail_all();
            return;
        }
        let Some(ring) = self.ring.as_mut() else {
            self.fail_controller();
            return;
        };
        // The reset took the pair off the device: its memory is ours again.
        ring.reset();
        let job = Job::Recreate {
            queue: ring.spec(),
            generation: self.generation,
            to: self.mailbox(),
        };
        if self.ctrl.post(job) {
            self.hold = Hold::Recreate;
        } else {
            self.fail_controller();
        }
    }

    /// The pair is back on the device: resubmit what was outstanding.
    fn recreated(&mut self) {
        if self.ctrl.generation() != self.generation {
            // Reset again meanwhile (the service thread then created nothing): the next
            // poll starts over.
            return;
        }
        let mut outstanding: Vec<Cmd> = Vec::new();
        for cid in 0..self.cmds.len() {
            if let Some(cmd) = self.cmds[cid].take() {
                self.free_cid(cid as u16);
                outstanding.push(cmd);
            }
        }
        outstanding.sort_by_key(|c| c.started);
        for cmd in outstanding {
            if cmd.retries < self.ns.opts.max_retries {
                self.stats.retries += 1;
                self.retry.push_back(Cmd {
                    retries: cmd.retries + 1,
                    ..cmd
                });
            } else {
                // Timed out (or caught in resets) on every try: this command fails, as
                // the Linux driver fails a request out of retries; the drive and the
                // namespace stay.
                tracing_warn(&format!(
                    "{}: namespace {}: a command failed after {} retries (Command Abort \
                     Requested)",
                    self.dev.name(),
                    self.ns.nsid,
                    cmd.retries
                ));
                self.part_done(cmd.slot, IoStatus::Aborted);
            }
        }
    }

    /// Asks the service thread for a controller reset and holds until it answers.
    fn reset_controller(&mut self, why: &str) {
        if self.hold != Hold::No {
            return;
        }
        tracing_warn(&format!(
            "{}: resetting the controller ({why})",
            self.dev.name()
        ));
        self.stats.resets += 1;
        let job = Job::Reset {
            seen: self.generation,
            to: self.mailbox(),
        };
        if self.ctrl.post(job) {
            self.hold = Hold::Reset;
        } else {
            self.fail_controller();
        }
    }

    /// Takes the service thread's answers.
    fn take_answers(&mut self) {
        while let Ok(answer) = self.answers.try_recv() {
            match answer {
                Answer::Abort { cid, result } => self.abort_answered(cid, result),
                Answer::Reset(result) => {
                    if self.hold == Hold::Reset {
                        self.hold = Hold::No;
                    }
                    if let Err(e) = result {
                        if !self.failed {
                            tracing_warn(&format!(
                                "{}: controller reset failed: {e}",
                                self.dev.name()
                            ));
                            self.fail_controller();
                        }
                    }
                    // Success: the new generation starts recovery on this poll.
                }
                Answer::Create { generation, result } => {
                    if self.hold == Hold::Create {
                        self.hold = Hold::No;
                    }
                    if self.failed {
                        continue;
                    }
                    // A reset after this generation is noticed on this poll and recovered
                    // from as for any queue; the reset asked for below is skipped if one
                    // came after it already.
                    self.generation = generation;
                    let Err(e) = result else {
                        continue;
                    };
                    tracing_warn(&format!(
                        "{}: namespace {}: cannot create an I/O queue: {e}",
                        self.dev.name(),
                        self.ns.nsid
                    ));
                    if self.ctrl.is_failed() {
                        self.fail_all();
                    } else if matches!(e, DriverError::Timeout(_)) {
                        // The admin queue did not answer: reset the controller, as for
                        // an Abort that times out. The pair is then created as after any
                        // reset (`recover`), and the held requests go; a reset that
                        // fails fails the controller.
                        self.reset_controller("Create I/O queue timed out");
                    } else {
                        // Refused: nothing was ever issued on this queue; its requests
                        // fail, its rings wait for `Drop`.
                        self.fail_requests();
                    }
                }
                Answer::Recreate(result) => {
                    if self.hold == Hold::Recreate {
                        self.hold = Hold::No;
                    }
                    if self.failed {
                        continue;
                    }
                    match result {
                        Ok(()) => self.recreated(),
                        Err(e) => {
                            tracing_warn(&format!(
                                "{}: cannot recreate I/O queue after reset: {e}",
                                self.dev.name()
                            ));
                            self.fail_controller();
                        }
                    }
                }
            }
        }
    }

    fn abort_answered(&mut self, cid: u16, result: Result<bool, DriverError>) {
        let i = usize::from(cid);
        if !std::mem::replace(&mut self.abort_pending[i], false) {
            return;
        }
        // Freed while the Abort was pending: free now.
        if self.cmds[i].is_none() {
            self.free_cids.push(cid);
        }
        if self.failed {
            return;
        }
        match result {
            Ok(_) => {
                if let Some(c) = self.cmds[i].as_mut() {
                    c.abort_sent = Some(Instant::now());
                }
            }
            Err(DriverError::Failed) => self.fail_controller(),
            Err(e) => self.reset_controller(&format!("Abort failed: {e}")),
        }
    }

    /// Whether a timed-out command may reset the controller now: the first time at once,
    /// then only after a back-off that doubles with each such reset, from
    /// `abort_timeout` up to [`MAX_RESET_BACKOFF`], and starts over after a quiet spell
    /// of four back-offs.
    fn may_reset_for_timeout(&mut self, now: Instant) -> bool {
        let base = self.ns.opts.abort_timeout.max(Duration::from_millis(1));
        match self.last_timeout_reset {
            Some(t) if now < t + self.reset_backoff => return false,
            Some(t) if now.duration_since(t) < self.reset_backoff * 4 => {
                self.reset_backoff = (self.reset_backoff * 2).min(MAX_RESET_BACKOFF);
            }
            _ => self.reset_backoff = base,
        }
        self.last_timeout_reset = Some(now);
        true
    }

    fn check_timeouts(&mut self, now: Instant) {
        let opts = &self.ns.opts;
        let busy = self.cmds.iter().any(Option::is_some);
        self.next_check = now
            + if busy {
                opts.check_interval
            } else {
                opts.check_interval.max(Duration::from_millis(500))
            };
        match self.ctrl.check_health() {
            Health::Removed => {
                self.fail_controller();
                return;
            }
            Health::NeedsReset => {
                if self.ctrl.generation() == self.generation {
                    self.reset_controller("controller not ready or fatal status");
                } else {
                    self.recover();
                }
                return;
            }
            Health::Ok => {}
        }
        let (io_timeout, abort_timeout) = (opts.io_timeout, opts.abort_timeout);
        let Some(qid) = self.qid() else {
            return;
        };
        let mut to_abort = Vec::new();
        let mut expired = false;
        for (cid, c) in self.cmds.iter().enumerate() {
            let Some(c) = c else {
                continue;
            };
            match c.abort_sent {
                Some(t) if now.duration_since(t) > abort_timeout => expired = true,
                None if now.duration_since(c.started) > io_timeout && !self.abort_pending[cid] => {
                    to_abort.push(cid as u16)
                }
                _ => {}
            }
        }
        // While backing off, a command past its Abort stays with the drive, which may
        // still complete it; the reset comes when the back-off is over.
        if expired && self.may_reset_for_timeout(now) {
            self.reset_controller("command still outstanding after Abort");
            return;
        }
        for cid in to_abort {
            self.stats.timeouts += 1;
            self.stats.aborts += 1;
            let job = Job::Abort {
                sqid: qid,
                cid,
                generation: self.generation,
                limit: abort_timeout,
                to: self.mailbox(),
            };
            if !self.ctrl.post(job) {
                self.fail_controller();
                return;
            }
            self.abort_pending[usize::from(cid)] = true;
        }
        // The Abort's answer comes on a later poll, and so do the aborted commands'
        // completions.
    }
}

fn tracing_warn(msg: &str) {
    tracing::warn!("nvme: {msg}");
}

impl BackendQueue for NvmeQueue {
    fn submit(&mut self, req: Request) -> Result<(), SubmitError> {
        if self.in_flight() >= self.depth {
            return Err(SubmitError::Full(req));
        }
        if self.failed || self.ctrl.is_failed() {
            self.complete_now(req, IoStatus::Unavailable);
            return Ok(());
        }
        let bs = u64::from(self.ns.block_size);
        if req.op != Op::Flush {
            let end = req.lba.checked_add(u64::from(req.nblocks));
            if end.is_none_or(|e| e > self.ns.num_blocks) {
                self.complete_now(req, IoStatus::OutOfRange);
                return Ok(());
            }
            if req.nblocks == 0 {
                self.complete_now(req, IoStatus::Ok);
                return Ok(());
            }
        }
        let len = u64::from(req.nblocks) * bs;
        let buf_ok = match (req.op, &req.buf) {
            (Op::Read, Some(b)) => b.capacity() as u64 >= len,
            (Op::Write { .. }, Some(b)) => b.len() as u64 >= len,
            (Op::Read | Op::Write { .. }, None) => false,
            _ => true,
        };
        if !buf_ok {
            self.complete_now(req, IoStatus::Unsupported);
            return Ok(());
        }
        let iova = match (&req.op, &req.buf) {
            (Op::Read | Op::Write { .. }, Some(b)) => match self.maps.get(b) {
                Ok(i) => i,
                Err(e) => {
                    tracing_warn(&format!("{}: cannot map a buffer: {e}", self.dev.name()));
                    // Out of mappings or locked memory: this request fails, and may
                    // succeed later; the drive is fine.
                    self.complete_now(req, IoStatus::Busy);
                    return Ok(());
                }
            },
            _ => 0,
        };
        let Some(si) = self.free_slots.pop() else {
            if let Some(b) = req.buf.as_ref() {
                self.maps.put(b.id());
            }
            return Err(SubmitError::Full(req));
        };
        self.slots[si as usize] = Some(Slot {
            tag: req.tag,
            op: req.op,
            lba: req.lba,
            nblocks: req.nblocks,
            buf: req.buf,
            iova,
            issued: 0,
            outstanding: 0,
            status: IoStatus::Ok,
        });
        self.issue.push_back(si);
        self.issue_parts();
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        self.take_answers();
        if !self.failed {
            if self.ctrl.is_failed() {
                self.fail_all();
            } else if self.hold == Hold::No && self.ctrl.generation() != self.generation {
                self.recover();
            } else if self.hold == Hold::Fail {
                // The admin lock was busy; ask again (done once it is free).
                self.fail_controller();
            } else if self.hold != Hold::No {
                // Held for a reset that may take a while: a removal meanwhile cuts it
                // short rather than waiting for it.
                let now = Instant::now();
                if now >= self.next_check {
                    self.next_check = now + self.ns.opts.check_interval;
                    if self.ctrl.check_health() == Health::Removed {
                        self.fail_controller();
                    }
                }
            }
        }
        if !self.failed && self.hold == Hold::No {
            self.issue_parts();
            if let Some(r) = self.ring.as_mut() {
                r.ring_sq(&**self.dev);
            }
            self.reap();
            self.issue_parts();
            if let Some(r) = self.ring.as_mut() {
                r.ring_sq(&**self.dev);
            }
            let now = Instant::now();
            if now >= self.next_check {
                self.check_timeouts(now);
                self.issue_parts();
                if let Some(r) = self.ring.as_mut() {
                    r.ring_sq(&**self.dev);
                }
            }
        }
        let n = self.ready.len();
        out.extend(self.ready.drain(..));
        n
    }

    fn in_flight(&self) -> usize {
        (self.depth - self.free_slots.len()) + self.ready.len()
    }
}

/// A field of [`NvmeQueue`] that its `Drop` moves out (to the service thread); there until
/// then, so reading it never finds it gone.
#[derive(Debug)]
struct Held<T>(Option<T>);

impl<T> Held<T> {
    fn new(value: T) -> Held<T> {
        Held(Some(value))
    }

    /// Only in `Drop`: nothing reads the field after.
    fn take(&mut self) -> T {
        self.0
            .take()
            .expect("a queue's field is taken once, when it drops")
    }
}

impl<T> std::ops::Deref for Held<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0
            .as_ref()
            .expect("a queue's fields are there until it drops")
    }
}

impl<T> std::ops::DerefMut for Held<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0
            .as_mut()
            .expect("a queue's fields are there until it drops")
    }
}

impl Drop for NvmeQueue {
    fn drop(&mut self) {
        // Jobs still queued for this queue are skipped from now on (a create or
        // re-creation already under way finishes first: the token is checked under the
        // admin lock, and the delete below runs after it).
        self.alive = Arc::new(());
        let (ns, ctrl, dev, maps) = (
            self.ns.take(),
            self.ctrl.take(),
            self.dev.take(),
            self.maps.take(),
        );
        let Some(ring) = self.ring.take() else {
            // Failed with the controller: the device is released, nothing to delete. The
            // references drop here, on the IO thread: a failed controller skips its
            // shutdown, but if this was the last reference the device's descriptors close
            // here too (the kernel may reset the function then).
            drop((maps, ns, ctrl, dev));
            return;
        };
        // The device may still reach the rings, the PRP list pages and, through
        // outstanding commands, the data buffers and their mappings: all of it goes to the
        // service thread, which deletes the pair (Delete I/O SQ completes only once every
        // command on it is done or aborted) and frees the memory only after that. The IO
        // thread does not wait for the drive's admin queue.
        // A tuple drops in field order: the data buffers' mappings go before the buffers.
        let rest = (
            maps,
            std::mem::take(&mut self.slots),
            self.lists.take(),
            self.zeroes.take(),
        );
        // The queue's own references go along and drop there too, after the delete:
        // were they dropped here once the service thread had finished, the last one would
        // shut the controller down, or close the device, on this IO thread.
        Controller::retire(
            ctrl,
            Teardown::new(ring, Box::new(rest)),
            Box::new((ns, dev)),
        );
    }
}

#[cfg(test)]
mod status_tests {
    use super::*;

    /// A drive's path status is no status of the host's path: it becomes a retryable
    /// Internal Error, never a path status a multipath host would fail over on (to the
    /// same drive). The drive's media and command statuses pass through.
    #[test]
    fn drive_path_statuses_are_not_passed_on() {
        let st = |sct, sc, dnr| Status { sct, sc, dnr };
        for sc in [0x00, 0x01, 0x02, 0x03, 0x60, 0x70] {
            assert_eq!(
                io_status(Op::Read, st(3, sc, false)),
                IoStatus::Busy,
                "3/{sc:#x}"
            );
        }
        assert_eq!(
            io_status(Op::Read, st(2, 0x81, true)),
            IoStatus::Device {
                sct: 2,
                sc: 0x81,
                dnr: true
            }
        );
    }
}
