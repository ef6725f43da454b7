//! Why this file is over 800 lines: it is one state machine, a command's life from intake
//! to response on both transports (slot, offload or hand-up, host-data fetch, backend
//! completion, response, abort); split across files, one command's transitions would be
//! read in several places and the invariants between them (slot, buffer budget, in-flight
//! count) checked in none.
//!
//! Command slots and the command path shared by both transports: capsule intake, the
//! offloaded path against the thread's backend queues, the non-offloaded hand-up, the
//! host-data fetch (one function for both paths and both transports) and responses.
//!
//! The protocol decisions are `nvmf`'s: which commands are offloaded, their transfer
//! length and SGL checks (`nvmf::command`), and everything on the wire (the queue machines
//! behind [`Link`]). This file moves commands between states:
//!
//! ```text
//! capsule -> App (handed up) ---------------------------> Tx -> Free (release marker /
//!        \-> [WaitBuf] -> H2C (host data being fetched) -> Backend -> Tx       SEND completion)
//!                   \-----------------------------------/
//! ```
//!
//! Buffers: a connection holds at most its budget of data buffers
//! ([`crate::EngineLimits::connection_buffer_bytes`], reserved per command, `QpState::buf_bytes`);
//! a command that would exceed it waits (`WaitBuf`) until one of the connection's
//! commands finishes. The connections from one peer address hold at most a
//! [`PEER_POOL_SHARE`]th of the thread's pool together (`Core::peers`); a command past
//! that waits too, until the address gives some back on any of its connections, so one
//! host opening many connections cannot take the whole pool. On NVMe/TCP a command's
//! buffer for host data is taken when the first H2CData PDU arrives, not when the R2T
//! goes out, so a host that never sends its data holds no buffer (the host-data deadline
//! then ends the connection).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use backend::{
    BackendQueue, BufPool, Completion, IoBuf, IoStatus, Op, RamBackend, Request, SubmitError,
};
use nvmf::command::{self, DataSgl, OffloadOp};
use nvmf::queue::QueueParams;
use nvmf::spec::{Cqe, DataDirection, Sqe, Status};
use nvmf::target::Transport;

use super::counters::{bump, NsCounters, QueueCounters, StatsRegistry, ThreadCounters};
use super::io::{qp_ref, QpSlot};
use super::rdma_link::RdmaLink;
use super::tcp_link::TcpLink;
use super::SoftConfig;
use crate::{
    AccessCell, AccessKey, CmdToken, CommandFailure, Event, Limit, NamespaceAccess, QpHandle,
    SubsysId, TaskError, TaskKind, TransportErrorKind,
};
use nvmf::target::reservation::Access;

/// Admin and Fabrics commands may always carry this much in-capsule data on NVMe/TCP.
pub(super) const ADMIN_INCAPSULE: u32 = nvmf::tcp::ADMIN_MAX_INCAPSULE_DATA;
/// Command slots per IO context; a slot index is also its NVMe/TCP TTAG (16 bits).
const MAX_CMDS: usize = 65535;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum St {
    Free,
    /// Waiting for its connection's buffer budget (`QpState::waiting`).
    WaitBuf,
    /// Waiting for the host's data (H2CData after our R2T, or an RDMA READ).
    H2C,
    /// Submitted to the backend.
    Backend,
    /// Handed to the application (non-offloaded), waiting for a task.
    App,
    /// Response queued; freed at its release marker (TCP) or SEND completion (RDMA).
    Tx,
}

pub(super) struct Cmd {
    pub gen: u32,
    pub st: St,
    /// The offloaded command, or `None` for one handed to the application.
    pub op: Option<OffloadOp>,
    pub qp: QpHandle,
    pub sqe: Sqe,
    pub buf: Option<IoBuf>,
    /// Transfer length in bytes (payload length for non-offloaded commands).
    pub len: u32,
    /// Host data received so far.
    pub got: u32,
    /// Backend requests outstanding.
    pub pending: u16,
    pub status: Status,
    pub ns: u32,
    pub user: u64,
    /// Capsule arrival, for the latency histograms and the backend timeout.
    pub start: Instant,
    /// Aborted (Abort command) while waiting for its host data: answered Abort Requested
    /// when the data is in, never run.
    pub aborted: bool,
    /// A Copy in progress: its source ranges are read one by one into one buffer, which
    /// is then written to the destination.
    pub copy: Option<Box<CopyPlan>>,
    /// Fused Compare and Write: this command's role and its partner's slot.
    pub fused: Fused,
    /// A first fused command held until its partner arrives: its SGL (its in-capsule data,
    /// if any, is in `buf`).
    pub held_sgl: Option<DataSgl>,
    /// A first fused command whose pair holds its range: the fence its compare waits for
    /// (writes every IO thread let through before the range was claimed).
    pub pair_fence: Option<crate::Fence>,
    /// The backend timeout was reported for this command.
    pub timeout_reported: bool,
    /// `status` is the backend's answer (the storage failed the command), not one of the
    /// engine's own checks.
    pub backend_failed: bool,
    /// Bytes of the connection's buffer budget this command holds.
    pub reserved: u32,
    /// The peer share ([`PeerShares`]) the command's slot, and those bytes, are counted
    /// in, if any.
    pub peer: Option<u32>,
    /// When the host-data fetch started (R2T sent), for the host-data deadline.
    pub since: Instant,
    /// Host data is received but dropped (no buffer could be had); the command fails
    /// with `status` once the transfer is over.
    pub discard: bool,
    /// A Read answered straight from a RAM namespace: its data is sent from the store
    /// (bytes `off..off+len`) under the store's stripe locks when the C2HData goes out,
    /// not from `buf` (whose bytes are not filled in unless the send had to stop
    /// half-way; see `tcp_link::flush`).
    pub lent: Option<LentRead>,
}

/// An IO thread's own handle on a RAM store. Lent reads (and each writev of them) take
/// a reference to this, not to the store's `Arc`, which every IO thread serving the
/// namespace shares: its count would be written by all of them at every read, and its
/// cache line would move from core to core. This count is written by one thread only.
pub(super) type ThreadStore = Arc<Arc<RamBackend>>;

/// Where a lent Read's data lies (see [`Cmd::lent`]).
pub(super) struct LentRead {
    pub src: ThreadStore,
    pub off: usize,
}

/// Copies a lent read's bytes from its store into its buffer (under the store's locks)
/// and makes it an ordinary read, for the paths that cannot send from the store. False
/// when the bytes could not be had (the buffer then does not hold the read's data).
fn fill_lent(c: &mut Cmd) -> bool {
    let (Some(l), Some(b)) = (c.lent.take(), c.buf.as_mut()) else {
        return false;
    };
    let n = b.len();
    let mut set = backend::ram::LendSet::default();
    set.add(l.off, n)
        && l.src
            .lend(&set, |lent| lent.copy_to(l.off, b.as_mut_slice()))
}

impl Cmd {
    /// The tag of this command, in slot `idx`, on its backend requests (without the fence
    /// bit), and the key it waits under for a fused pair's range: its generation and
    /// slot, so a late completion for an earlier user of the slot is told apart.
    pub(super) fn tag(&self, idx: u32) -> u64 {
        u64::from(self.gen) << 32 | u64::from(idx)
    }

    fn free(now: Instant) -> Cmd {
        Cmd {
            gen: 0,
            st: St::Free,
            op: None,
            qp: QpHandle { idx: 0, gen: 0 },
            sqe: Sqe::default(),
            buf: None,
            len: 0,
            got: 0,
            pending: 0,
            status: Status::SUCCESS,
            ns: 0,
            user: 0,
            start: now,
            timeout_reported: false,
            backend_failed: false,
            reserved: 0,
            peer: None,
            since: now,
            discard: false,
            lent: None,
            aborted: false,
            copy: None,
            fused: Fused::None,
            held_sgl: None,
            pair_fence: None,
        }
    }

    /// The first `n` bytes of the command's buffer (empty without one).
    pub fn data(&self, n: u32) -> &[u8] {
        // A lent read's buffer holds whatever the pool last put in it.
        debug_assert!(self.lent.is_none(), "the buffer of a lent read was read");
        self.buf
            .as_ref()
            .map_or(&[][..], |b| &b.as_slice()[..n as usize])
    }
}

/// A command's part in a fused Compare and Write (NVMe Base 2.0 section 3.4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fused {
    None,
    /// The Compare; `ready` once its host data is in.
    First {
        partner: Option<u32>,
        ready: bool,
    },
    /// The Write.
    Second {
        partner: u32,
        ready: bool,
    },
}

/// A Copy being carried out (see [`Cmd::copy`]).
pub(super) struct CopyPlan {
    pub ranges: Vec<(u64, u32)>,
    /// The range being read now.
    pub next: usize,
    /// The source data, assembled in range order.
    pub data: Option<IoBuf>,
    pub filled: usize,
    pub dest: u64,
    pub total: u32,
    /// The destination write is under way.
    pub writing: bool,
}

/// Free command slot `c`: its buffers go back to the pool that made them (`pool`, or
/// the application commands' `reserve`), its bytes to its peer's share.
pub(super) fn free_cmd(
    c: &mut Cmd,
    pool: &mut BufPool,
    reserve: &mut BufPool,
    peers: &mut PeerShares,
) {
    if let Some(p) = c.peer.take() {
        peers.give_back(p, c.reserved as usize);
    }
    if let Some(b) = c.buf.take() {
        if reserve.owns(&b) {
            reserve.put(b);
        } else {
            pool.put(b);
        }
    }
    if let Some(b) = c.copy.take().and_then(|p| p.data) {
        pool.put(b);
    }
    c.lent = None;
    c.st = St::Free;
    c.gen = c.gen.wrapping_add(1);
}

/// How a QP's bytes move: the only transport-specific part of a QP. Commands, offload
/// logic and tasks are shared; the link's queue machine decides what goes on the wire.
/// TCP, the common case, stays inline (a box would cost a pointer chase per PDU); QPs
/// live in one table, so its ~220 bytes per entry do not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Link {
    Tcp(TcpLink),
    Rdma(Box<RdmaLink>),
}

impl Link {
    pub fn transport(&self) -> Transport {
        match self {
            Link::Tcp(_) => Transport::Tcp,
            Link::Rdma(_) => Transport::Rdma,
        }
    }

    pub fn set_params(&mut self, p: QueueParams) {
        match self {
            Link::Tcp(t) => t.machine.set_params(p),
            Link::Rdma(r) => r.machine.set_params(p),
        }
    }

    /// Fetch `len` bytes of the host's data for command `slot` into its buffer at `off`
    /// (TCP: an R2T whose TTAG is the slot; RDMA: a READ of the keyed SGL). False when
    /// the SGL has no host memory to read (RDMA only).
    fn fetch(&mut self, slot: u32, sqe: &Sqe, off: u32, len: u32) -> bool {
        match self {
            Link::Tcp(t) => {
                t.machine
                    .request_data(&mut t.tx, sqe.cid(), slot as u16, off, len);
                true
            }
            Link::Rdma(r) => match nvmf::rdma::KeyedSgl::parse(&sqe.dptr) {
                Some(k) => {
                    r.machine.fetch(slot, &k, off, len);
                    true
                }
                None => false,
            },
        }
    }

    /// The command's fetch is over another way (its slot is being freed).
    fn cancel_fetch(&mut self, slot: u32) {
        if let Link::Tcp(t) = self {
            t.machine.cancel_transfer(slot as u16);
        }
    }

    /// Queue the response to command `slot`: `data` (a prefix of its buffer) to the host
    /// (C2HData / RDMA WRITE), then the completion; the slot is released after.
    fn respond(&mut self, slot: u32, sqe: &Sqe, cqe: Cqe, data: &[u8]) {
        match self {
            Link::Tcp(t) => t.machine.respond(&mut t.tx, slot, cqe, data),
            Link::Rdma(r) => r.machine.respond(slot, &sqe.dptr, cqe, data.len() as u32),
        }
    }

    /// As [`Link::respond`] for a lent read (`len` bytes sent from the store when the
    /// output is written). False, and nothing queued, where that cannot be done (RDMA,
    /// or a TCP queue with the data digest).
    fn respond_lent(&mut self, slot: u32, cqe: Cqe, len: u32) -> bool {
        match self {
            Link::Tcp(t) => t.machine.respond_unhashed(&mut t.tx, slot, cqe, len),
            Link::Rdma(_) => false,
        }
    }

    fn respond_untracked(&mut self, cqe: Cqe) {
        match self {
            Link::Tcp(t) => t.machine.respond_untracked(&mut t.tx, cqe),
            Link::Rdma(r) => r.machine.respond_untracked(cqe),
        }
    }

    /// One of the queue's commands is done: its entry is free again (TCP: the machine's
    /// flow-control count; RDMA: a receive is posted again).
    fn command_released(&mut self) {
        match self {
            Link::Tcp(t) => t.machine.command_released(),
            Link::Rdma(r) => r.command_released(),
        }
    }
}

/// A QP's state next to its link.
pub(super) struct QpState {
    pub link: Link,
    pub user: u64,
    /// The subsystem whose namespaces this I/O queue's commands are offloaded to.
    pub subsys: Option<SubsysId>,
    /// Command slots this QP holds.
    pub inflight: u32,
    /// No more input is processed (peer gone, protocol error, or disconnecting).
    pub rx_stopped: bool,
    /// The transport error was reported to the application.
    pub error_reported: bool,
    /// `qp_disconnect` was called with this user data.
    pub disconnect: Option<u64>,
    /// The QP's own handle (its place in the QP table and that place's generation), for
    /// the thread's list of QPs with output ([`Core::tx_ready`]).
    pub handle: QpHandle,
    /// Output is waiting to be written or posted. Private, like `tx_blocked` and
    /// `tx_listed`: only [`Core::mark_tx`], [`Core::unblock_tx`] and the flush change them,
    /// so a QP that has output to send and may send it is always on [`Core::tx_ready`].
    tx_dirty: bool,
    /// On [`Core::tx_ready`] (at most once).
    tx_listed: bool,
    /// The application answered the queue's Fabrics Connect (`qp_connect_set_params`):
    /// the queue has a controller, and this QID.
    pub qid: Option<u16>,
    /// When the QP was accepted (ICReq and Connect deadlines).
    pub accepted: Instant,
    /// Bytes of data buffers this QP's commands hold (its budget's use).
    pub buf_bytes: usize,
    /// The pool share of the peer's address (TCP: the socket's, RDMA: the CM's), in
    /// [`PeerShares`].
    pub peer: Option<u32>,
    /// Commands waiting for the budget, oldest first.
    pub waiting: VecDeque<u32>,
    /// TCP: the socket took no more output; waiting for EPOLLOUT, not polling.
    tx_blocked: bool,
    /// Output has been waiting without any of it being taken since then.
    pub tx_stalled_since: Option<Instant>,
    /// NVMe/TCP: the pass in which the PDU the peer is still sending began (bytes of it
    /// are in, not all of them), for [`crate::Limit::PartialPdu`].
    pub partial_since: Option<Instant>,
    /// Who this I/O queue's commands come from (`qp_set_access`).
    pub access: AccessKey,
    /// A first fused command (FUSE 01b) waiting for the next capsule.
    pub fused_first: Option<u32>,
    /// Its offloaded I/O, for the application's per-controller view.
    pub counters: Arc<QueueCounters>,
}

impl QpState {
    /// A new QP's state, with no output pending (see [`Core::mark_tx`]).
    pub fn new(
        link: Link,
        user: u64,
        now: Instant,
        handle: QpHandle,
        counters: Arc<QueueCounters>,
    ) -> QpState {
        QpState {
            link,
            user,
            subsys: None,
            inflight: 0,
            rx_stopped: false,
            error_reported: false,
            disconnect: None,
            handle,
            tx_dirty: false,
            tx_listed: false,
            qid: None,
            accepted: now,
            buf_bytes: 0,
            peer: None,
            waiting: VecDeque::new(),
            tx_blocked: false,
            tx_stalled_since: None,
            partial_since: None,
            access: AccessKey::default(),
            fused_first: None,
            counters,
        }
    }

    /// TCP: the socket took no more output; the QP waits for EPOLLOUT.
    pub fn tx_blocked(&self) -> bool {
        self.tx_blocked
    }

    /// Whether the flush should write or post this QP's output now.
    pub fn tx_ready(&self) -> bool {
        self.tx_dirty && !self.tx_blocked
    }

    /// Whether the QP is on [`Core::tx_ready`].
    #[cfg(debug_assertions)]
    pub fn tx_listed(&self) -> bool {
        self.tx_listed
    }

    /// The flush took the QP off [`Core::tx_ready`]; whether it was on it.
    pub fn take_tx_listed(&mut self) -> bool {
        std::mem::replace(&mut self.tx_listed, false)
    }

    /// Nothing is to be sent any more (the QP is disconnecting, or its output was
    /// dropped). A place it holds on [`Core::tx_ready`] is dropped at the next flush.
    pub fn clear_tx(&mut self) {
        self.tx_dirty = false;
    }
}

pub(super) struct NsSlot {
    pub subsys: SubsysId,
    pub nsid: u32,
    /// The removal was acknowledged already (`be_queue_destroy` does not wait for the
    /// backend); the slot only lives on until the backend gives back what it holds.
    pub acked: bool,
    pub shift: u32,
    pub nblocks: u64,
    pub q: Box<dyn BackendQueue>,
    /// The RAM store behind `q`: plain TCP queues send reads straight from it, and
    /// in-capsule writes go straight into it.
    pub ram: Option<ThreadStore>,
    pub pending: VecDeque<Request>,
    /// Requests the backend refused as closed, answered with the next poll of this
    /// namespace like its completions (by namespace: the completion's tag does not say).
    pub closed: Vec<Completion>,
    pub counters: Arc<NsCounters>,
    /// When the backend last completed a command of this namespace on this thread: a
    /// backend that completes is slow, not hung (`check_backend_timeouts`).
    pub progress: Option<Instant>,
    pub removing: Option<u64>,
    /// The backend said it is gone (`IoStatus::Unavailable`); reported to the main
    /// context once.
    pub gone: bool,
    pub gone_reported: bool,
    /// The namespace's published access view, and this context's copy of it with the
    /// epoch it was taken at.
    pub access: Arc<AccessCell>,
    pub view: Arc<NamespaceAccess>,
    pub view_epoch: u64,
    /// LBA ranges of fused Compare and Write pairs running on this thread, and the
    /// commands that wait for a pair's range, on this thread or another ([`FusedLocks`]):
    /// writes, deallocations and Copy destinations that overlap a pair's range, other fused
    /// pairs, and pairs waiting for their fence.
    pub locks: FusedLocks,
    pub blocked: VecDeque<u32>,
    /// A command in `blocked` waits for a pair on another IO thread, or a pair waits for
    /// its fence: `blocked` is tried again every pass until they can go.
    pub remote_wait: bool,
    /// Backend requests in flight (by fence parity), and the fences waiting for them.
    pub fences: NsFences,
}

/// The tag bit that carries a backend request's fence parity (command slot indexes
/// stay far below it).
pub(crate) const FENCE_BIT: u64 = 1 << 31;

/// A namespace's backend requests in flight on this IO thread, and its fences
/// ([`crate::IoContext::ns_fence`]). Each backend request is counted under the parity
/// current when it went in (a bit of its tag); a
/// fence flips the parity and is through when the requests of the old parity are all
/// done. A fence that comes while one drains waits for the next flip. Fences still
/// waiting when the namespace leaves the thread arrive then (nothing of it runs any
/// more).
#[derive(Default)]
pub(crate) struct NsFences {
    parity: u8,
    inflight: [u32; 2],
    draining: Vec<crate::Fence>,
    queued: Vec<crate::Fence>,
}

impl NsFences {
    /// A request goes to the backend: the tag bit to set.
    pub fn started(&mut self) -> u64 {
        self.inflight[self.parity as usize] += 1;
        u64::from(self.parity) * FENCE_BIT
    }
    /// Backend requests in flight (handed to the backend's queue or waiting for room in
    /// it).
    pub fn in_flight(&self) -> u32 {
        self.inflight[0] + self.inflight[1]
    }
    /// The request with `tag` completed, or was dropped before the backend saw it.
    pub fn ended(&mut self, tag: u64) {
        let p = usize::from(tag & FENCE_BIT != 0);
        debug_assert!(self.inflight[p] > 0, "a request ended twice");
        self.inflight[p] = self.inflight[p].saturating_sub(1);
        if !self.draining.is_empty() {
            self.settle();
        }
    }
    pub fn add(&mut self, fence: crate::Fence) {
        if self.draining.is_empty() {
            self.parity ^= 1;
            self.draining.push(fence);
        } else {
            self.queued.push(fence);
        }
        self.settle();
    }
    fn settle(&mut self) {
        while !self.draining.is_empty() && self.inflight[usize::from(self.parity ^ 1)] == 0 {
            for f in self.draining.drain(..) {
                f.arrive();
            }
            if !self.queued.is_empty() {
                self.parity ^= 1;
                self.draining = std::mem::take(&mut self.queued);
            }
        }
    }
}

impl Drop for NsFences {
    fn drop(&mut self) {
        for f in self.draining.drain(..).chain(self.queued.drain(..)) {
            f.arrive();
        }
    }
}

/// What [`FusedLocks::take`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Take {
    Taken,
    /// A pair on this thread holds an overlapping range.
    BusyHere,
    /// A pair on another IO thread holds an overlapping range.
    BusyElsewhere,
}

/// The fused pairs' ranges this thread holds on a namespace, each also claimed among all
/// the namespace's IO threads, and the commands here that wait for a pair's range. Those
/// waiting for a pair on another IO thread are registered among all threads with their
/// tickets (see [`super::FusedRanges`]); every waiting command here also keeps a later
/// pair of this thread off its blocks, so waiting takes turns on one thread too. Claims
/// and waits still held when the namespace leaves this thread are given back then.
pub(crate) struct FusedLocks {
    shared: Arc<super::FusedRanges>,
    owner: u64,
    held: Vec<(u64, u32)>,
    /// The commands registered as waiting (`key`) with their tickets, by key.
    waiting: Vec<(u64, u64)>,
    /// Found waiting since the waiting commands were last all tried again
    /// ([`FusedLocks::refind`]), in the order found: key, blocks, and whether it waits
    /// for another thread.
    found: Vec<(u64, (u64, u64), bool)>,
    /// All the blocks `found` waits for, from the first to the last.
    found_span: Option<(u64, u64)>,
}

/// From the first to the last block of `a` and `b`.
fn span_union(a: Option<(u64, u64)>, b: (u64, u64)) -> (u64, u64) {
    a.map_or(b, |a| (a.0.min(b.0), a.1.max(b.1)))
}

impl FusedLocks {
    pub fn new(shared: Arc<super::FusedRanges>) -> FusedLocks {
        FusedLocks {
            owner: shared.new_owner(),
            shared,
            held: Vec::new(),
            waiting: Vec::new(),
            found: Vec::new(),
            found_span: None,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
    /// The ranges pairs hold on every IO thread of the namespace.
    pub fn shared(&self) -> &super::FusedRanges {
        &self.shared
    }
    /// Whether a pair on this thread holds a range overlapping `r`.
    pub fn overlaps(&self, r: (u64, u32)) -> bool {
        self.held.iter().any(|&l| nvmf::copy::overlaps(l, r))
    }
    /// Claims `r` for the pair whose first command is `key`, unless a pair holds an
    /// overlapping range, a command here found waiting before it waits for overlapping
    /// blocks, or a command on another thread that started waiting before it does.
    /// Waiting for a command here is [`Take::BusyElsewhere`] too: it is tried again
    /// every pass, not only when a pair here lets go.
    pub fn take(&mut self, r: (u64, u32), key: u64) -> Take {
        if self.overlaps(r) {
            return Take::BusyHere;
        }
        let span = super::span_of(r);
        if self
            .found_span
            .is_some_and(|f| super::spans_overlap(f, span))
        {
            return Take::BusyElsewhere;
        }
        let ticket = self.ticket(key).unwrap_or(u64::MAX);
        if !self.shared.claim(r, ticket) {
            return Take::BusyElsewhere;
        }
        self.held.push(r);
        Take::Taken
    }
    pub fn give_back(&mut self, r: (u64, u32)) {
        if let Some(i) = self.held.iter().position(|&l| l == r) {
            self.held.swap_remove(i);
            self.shared.release(r);
        }
    }
    fn ticket(&self, key: u64) -> Option<u64> {
        let i = self.waiting.binary_search_by_key(&key, |w| w.0).ok()?;
        Some(self.waiting[i].1)
    }
    /// Command `key` waits for a pair's range, for blocks `span`; `elsewhere`: for a pair
    /// on another IO thread (or for a command found waiting here before it). It keeps
    /// later pairs here off `span` at once, and those on other threads from the next
    /// [`FusedLocks::sync_waiting`] on.
    pub fn wait(&mut self, key: u64, span: (u64, u64), elsewhere: bool) {
        self.found.push((key, span, elsewhere));
        self.found_span = Some(span_union(self.found_span, span));
    }
    /// Forgets what was found waiting, before every waiting command is tried again.
    pub fn refind(&mut self) {
        self.found.clear();
        self.found_span = None;
    }
    /// Registers the commands found waiting for another thread among all threads, in
    /// place of the ones registered before: a command that still waits keeps its ticket,
    /// and those that start waiting get theirs in the order they were found.
    pub fn sync_waiting(&mut self) {
        if self.waiting.is_empty() && !self.found.iter().any(|f| f.2) {
            return;
        }
        let mut now: Option<(u64, (u64, u64))> = None;
        let mut waiting = Vec::with_capacity(self.found.len());
        for &(key, span, elsewhere) in &self.found {
            if !elsewhere {
                continue;
            }
            let t = self.ticket(key).unwrap_or_else(|| self.shared.new_ticket());
            waiting.push((key, t));
            now = Some((
                now.map_or(t, |n| n.0.min(t)),
                span_union(now.map(|n| n.1), span),
            ));
        }
        waiting.sort_unstable();
        waiting.dedup_by_key(|w| w.0);
        self.waiting = waiting;
        self.shared.set_waiting(self.owner, now);
    }

    /// Gives back every range held here and withdraws every wait: the namespace's
    /// commands on this thread are all answered without running (`be_queue_destroy`),
    /// or the namespace leaves the thread.
    pub fn abandon(&mut self) {
        for r in self.held.drain(..) {
            self.shared.release(r);
        }
        if !self.waiting.is_empty() {
            self.waiting.clear();
            self.shared.set_waiting(self.owner, None);
        }
        self.refind();
    }
}

impl Drop for FusedLocks {
    fn drop(&mut self) {
        self.abandon();
    }
}

impl NsSlot {
    /// The backend refused `r` as closed: it is answered Unavailable with the next poll
    /// of this namespace (`closed`).
    pub fn refuse(&mut self, r: Request) {
        self.closed.push(Completion {
            tag: r.tag,
            status: IoStatus::Unavailable,
            buf: r.buf,
        });
    }

    /// Backend requests in flight on this thread.
    pub fn inflight(&self) -> u32 {
        self.fences.in_flight()
    }

    /// The queue depth metric follows [`NsSlot::inflight`].
    pub fn publish_depth(&self) {
        self.counters
            .queue_depth
            .store(u64::from(self.inflight()), Ordering::Relaxed);
    }

    /// The backend is gone: from now on reads and writes go through the queue too (no
    /// store), which fails them. The caller tells the main context (`ns_gone_news`).
    pub fn set_gone(&mut self) {
        self.gone = true;
        self.ram = None;
    }

    /// Whether `key` may run `op` here now: one atomic load, and the namespace's view
    /// reloaded only when it was republished since.
    #[inline]
    pub fn check_access(&mut self, key: &AccessKey, op: OffloadOp) -> Result<(), Status> {
        let epoch = self.access.epoch.load(Ordering::Acquire);
        if epoch != self.view_epoch {
            self.view = self.access.load();
            self.view_epoch = epoch;
        }
        if self.view.is_open() {
            return Ok(());
        }
        let access = match op {
            OffloadOp::Read | OffloadOp::Compare => Access::Read,
            OffloadOp::Write
            | OffloadOp::WriteZeroes
            | OffloadOp::DatasetManagement
            | OffloadOp::Flush
            | OffloadOp::Copy => Access::Write,
        };
        self.view.check(key, Some(access))
    }
}

/// One peer address may hold at most this fraction (1/n) of a thread's buffer pool, and
/// always one largest transfer.
pub(super) const PEER_POOL_SHARE: usize = 4;

/// One peer address may hold at most this many of a thread's [`MAX_CMDS`] command slots
/// (a quarter): every queue is bounded by its size, but an address may open many queues
/// (discovery admin queues of 4096 entries need no allowed host NQN) and fill them with
/// commands whose data never comes; past its share its capsules are answered Command
/// Interrupted, not the other hosts'.
pub(super) const PEER_CMD_SHARE: u32 = (MAX_CMDS / 4) as u32;

/// A capsule refused for want of a command slot is logged at most this often per IO
/// thread (the rest are counted in the next line and in the limit's counter).
const SLOT_REFUSAL_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Largest transfer of an application command served from [`Core::reserve`]: the admin
/// in-capsule size (a Connect's data), an Identify or a discovery log of a few entries.
pub(super) const ADMIN_RESERVE_MAX: usize = ADMIN_INCAPSULE as usize;
/// Bytes of [`Core::reserve`] per IO thread: 512 transfers of 8 KiB.
pub(super) const ADMIN_RESERVE_BYTES: usize = 4 << 20;

/// What the connections from one peer address hold of a thread's pool.
struct PeerShare {
    addr: IpAddr,
    /// QPs of the address on this thread.
    qps: u32,
    /// Buffer bytes its commands hold (each command knows its share: `Cmd::peer`).
    bytes: usize,
    /// Command slots its commands hold.
    cmds: u32,
    /// Its QPs with commands waiting for the share.
    waiters: Vec<QpHandle>,
}

/// The peer shares of one IO thread, by slot: a QP and each command that holds bytes
/// know their slot, so the data path counts without a lookup. A slot lives while a QP or
/// a command of its address does.
#[derive(Default)]
pub(super) struct PeerShares {
    slots: Vec<Option<PeerShare>>,
    by_addr: HashMap<IpAddr, u32>,
    free: Vec<u32>,
    /// QPs whose address gave bytes back while they waited: the pass starts their
    /// commands (`StaIo::resume_peers`).
    pub resume: Vec<QpHandle>,
}

impl PeerShares {
    /// The slot of `addr` for one more of its QPs.
    pub fn attach(&mut self, addr: IpAddr) -> u32 {
        if let Some(&s) = self.by_addr.get(&addr) {
            if let Some(share) = self.slots[s as usize].as_mut() {
                share.qps += 1;
            }
            return s;
        }
        let share = PeerShare {
            addr,
            qps: 1,
            bytes: 0,
            cmds: 0,
            waiters: Vec::new(),
        };
        let s = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(share);
                s
            }
            None => {
                self.slots.push(Some(share));
                self.slots.len() as u32 - 1
            }
        };
        self.by_addr.insert(addr, s);
        s
    }

    /// One QP of slot `s` is gone.
    pub fn detach(&mut self, s: u32) {
        if let Some(share) = self.slots.get_mut(s as usize).and_then(Option::as_mut) {
            share.qps = share.qps.saturating_sub(1);
        }
        self.maybe_free(s);
    }

    fn charge(&mut self, s: u32, len: usize) {
        if let Some(share) = self.slots.get_mut(s as usize).and_then(Option::as_mut) {
            share.bytes += len;
        }
    }

    /// One more command slot for slot `s`, unless it holds `max` already.
    fn take_cmd(&mut self, s: u32, max: u32) -> bool {
        match self.slots.get_mut(s as usize).and_then(Option::as_mut) {
            Some(share) if share.cmds >= max => false,
            Some(share) => {
                share.cmds += 1;
                true
            }
            None => true,
        }
    }

    /// A command of slot `s` is freed and gives its `len` bytes back; QPs that waited for
    /// them are resumed by the pass.
    fn give_back(&mut self, s: u32, len: usize) {
        if let Some(share) = self.slots.get_mut(s as usize).and_then(Option::as_mut) {
            share.cmds = share.cmds.saturating_sub(1);
            share.bytes = share.bytes.saturating_sub(len);
            if len > 0 && !share.waiters.is_empty() {
                self.resume.append(&mut share.waiters);
            }
        }
        self.maybe_free(s);
    }

    /// Whether `len` more bytes take slot `s` past `budget` (an address holding nothing
    /// always gets one command's worth); if so, `qp` waits on the slot.
    fn full(&mut self, s: u32, len: usize, own: usize, budget: usize, qp: QpHandle) -> bool {
        let Some(share) = self.slots.get_mut(s as usize).and_then(Option::as_mut) else {
            return false;
        };
        let full = share.bytes > own && share.bytes + len > budget;
        if full && !share.waiters.contains(&qp) {
            share.waiters.push(qp);
        }
        full
    }

    fn maybe_free(&mut self, s: u32) {
        let unused = self
            .slots
            .get(s as usize)
            .and_then(Option::as_ref)
            .is_some_and(|share| share.qps == 0 && share.bytes == 0 && share.cmds == 0);
        if unused {
            if let Some(share) = self.slots[s as usize].take() {
                self.by_addr.remove(&share.addr);
            }
            self.free.push(s);
        }
    }

    /// The address of slot `s`.
    pub fn addr(&self, s: u32) -> Option<IpAddr> {
        self.slots
            .get(s as usize)
            .and_then(Option::as_ref)
            .map(|share| share.addr)
    }

    /// Slots in use (tests: none is left behind).
    #[cfg(test)]
    pub fn in_use(&self) -> usize {
        self.by_addr.len()
    }
}

/// Everything of an IO context but its QPs, so a QP and the core can be borrowed side by
/// side.
pub(super) struct Core {
    pub cfg: SoftConfig,
    /// Buffer bytes held per peer address, over all its connections on this thread.
    pub peers: PeerShares,
    pub cmds: Vec<Cmd>,
    pub free_cmds: Vec<u32>,
    pub pool: BufPool,
    /// Small buffers for the application's commands (Connect data, Identify, most log
    /// pages: up to [`ADMIN_RESERVE_MAX`]) when `pool` is empty, so that hosts can still
    /// connect and manage while many peers together hold the pool (each at most its
    /// share). [`ADMIN_RESERVE_BYTES`] in all.
    pub reserve: BufPool,
    pub ns: Vec<Option<NsSlot>>,
    pub ns_map: HashMap<(u32, u32), u32>,
    pub events: VecDeque<Event>,
    pub completions: Vec<Completion>,
    pub counters: Arc<ThreadCounters>,
    pub stats: Arc<StatsRegistry>,
    /// The time of the current pass, passed in by `progress`/`progress_at`.
    pub now: Instant,
    /// Time is simulated (`progress_at`): per-command times use `now` instead of the
    /// clock. Otherwise a command's start is the time of the pass that read its capsule
    /// (`now`, read once after the wait: every capsule of the pass had arrived by then)
    /// and its end is read from the clock, once per batch of backend completions
    /// (`batch_time`) or per command elsewhere, so latencies are real even when a command
    /// starts and ends within one pass, at one or two clock reads per pass instead of two
    /// per command.
    pub manual_time: bool,
    /// Inside a pass (`now` is the time after its wait; outside, it may be a whole idle
    /// wait old).
    pub in_pass: bool,
    /// While a batch of backend completions is delivered: the clock read they share.
    pub batch_time: Option<Instant>,
    /// RDMA work completions logged so far (the first few are, for diagnosis).
    pub wc_logged: u32,
    /// Capsules refused for want of a command slot: at most one line per
    /// [`SLOT_REFUSAL_LOG_EVERY`].
    slot_refusals: crate::LogEvery,
    /// The QPs whose output the next flush writes or posts: every QP with output waiting
    /// and not blocked on a full socket is here, once (`QpState::tx_listed`), so a pass
    /// costs the QPs with work, not every connected QP. An entry may be stale (the QP was
    /// cleared or freed since): the flush and `busy` check each one.
    pub tx_ready: Vec<QpHandle>,
    /// A namespace's backend said it is gone since the last report (`NsSlot::gone`).
    pub ns_gone_news: bool,
    /// Every IO context of the engine: a fused pair fences its namespace on all of them
    /// before it compares ([`Core::run_fused`]); this one's wake-up event tells it apart.
    pub(super) contexts: super::Contexts,
    pub(super) me: Arc<nix::sys::eventfd::EventFd>,
    /// Unit tests: every QP ever put on `tx_ready`.
    #[cfg(test)]
    pub tx_listed_log: std::collections::HashSet<QpHandle>,
}

fn status_of(s: IoStatus) -> Status {
    match s {
        IoStatus::Ok => Status::SUCCESS,
        // A media error from a file or block device comes after the kernel's own
        // retries below it (SCSI, NVMe, dm), and the same command fails the same way
        // again: DNR, as nvmet sets for EIO. (A drive's own status keeps the drive's
        // DNR: `IoStatus::Device`.)
        IoStatus::ReadError => Status::UNRECOVERED_READ_ERROR.with_dnr(true),
        IoStatus::WriteFault => Status::WRITE_FAULT.with_dnr(true),
        IoStatus::OutOfRange => Status::LBA_OUT_OF_RANGE,
        IoStatus::Unsupported => Status::INVALID_OPCODE,
        // ENOSPC and its kin: the status NVMe defines for a store that ran out of room,
        // with DNR, as nvmet's errno_to_nvme_status answers.
        IoStatus::NoSpace => Status::CAPACITY_EXCEEDED,
        // A write the store refuses (immutable or read-only file, read-only device):
        // Internal Error with DNR, which is what nvmet answers for EPERM, EROFS and
        // EACCES. Namespace Write Protected (00h/20h) belongs to the Namespace Write
        // Protection feature, which this target neither offers nor reports in Identify;
        // Access Denied (02h/86h) is a media status that the Linux host logs as a
        // critical medium error.
        IoStatus::Refused => Status::INTERNAL_ERROR.with_dnr(true),
        // Transient (out of memory, busy, a timeout or transport error below): the host
        // may try again.
        IoStatus::Busy => Status::INTERNAL_ERROR,
        // Anything else that concerns this command alone: retrying will not help.
        IoStatus::Failed => Status::INTERNAL_ERROR.with_dnr(true),
        // The drive did not answer in time, even after aborts, resets and retries.
        IoStatus::Aborted => Status::ABORT_REQUESTED,
        IoStatus::Device { sct, sc, dnr } => Status {
            sct,
            sc,
            dnr,
            more: false,
        },
        // The backend is gone (file deleted, device removed): a path error, so that a
        // multipath host fails over (see `nvmf::target::Target::namespace_lost`).
        IoStatus::Unavailable => Status::INTERNAL_PATH_ERROR,
    }
}

impl Core {
    pub fn new(
        cfg: SoftConfig,
        counters: Arc<ThreadCounters>,
        stats: Arc<StatsRegistry>,
        now: Instant,
        contexts: super::Contexts,
        me: Arc<nix::sys::eventfd::EventFd>,
    ) -> Core {
        let pool = BufPool::new(
            cfg.max_io_size.max(ADMIN_INCAPSULE) as usize,
            cfg.buffer_pool_bytes,
        );
        let reserve = BufPool::new(ADMIN_RESERVE_MAX, ADMIN_RESERVE_BYTES);
        Core {
            cfg,
            peers: PeerShares::default(),
            cmds: Vec::new(),
            free_cmds: Vec::new(),
            pool,
            reserve,
            ns: Vec::new(),
            ns_map: HashMap::new(),
            events: VecDeque::new(),
            completions: Vec::with_capacity(256),
            counters,
            stats,
            now,
            manual_time: false,
            in_pass: false,
            batch_time: None,
            wc_logged: 0,
            slot_refusals: crate::LogEvery::new(SLOT_REFUSAL_LOG_EVERY),
            tx_ready: Vec::new(),
            ns_gone_news: false,
            contexts,
            me,
            #[cfg(test)]
            tx_listed_log: Default::default(),
        }
    }

    /// `st` has output to write or post: the next flush sends it (at once, or after
    /// EPOLLOUT when its socket is full).
    pub fn mark_tx(&mut self, st: &mut QpState) {
        st.tx_dirty = true;
        self.list_tx(st);
    }

    /// `st`'s socket takes output again (EPOLLOUT, or it is to be tried again): output
    /// it has waiting goes at the next flush.
    pub fn unblock_tx(&mut self, st: &mut QpState) {
        st.tx_blocked = false;
        self.list_tx(st);
    }

    /// After the flush wrote or posted what `st` had: whether output is still waiting,
    /// and (TCP) whether the socket is full. Output still waiting on a socket that is not
    /// full goes again at the next pass.
    pub fn tx_flushed(&mut self, st: &mut QpState, dirty: bool, blocked: bool) {
        st.tx_dirty = dirty;
        st.tx_blocked |= blocked;
        self.list_tx(st);
    }

    fn list_tx(&mut self, st: &mut QpState) {
        if st.tx_ready() && !st.tx_listed {
            st.tx_listed = true;
            self.tx_ready.push(st.handle);
            #[cfg(test)]
            self.tx_listed_log.insert(st.handle);
        }
    }

    /// The time for a command's timestamps (see `manual_time`).
    fn cmd_time(&self) -> Instant {
        if self.manual_time {
            self.now
        } else {
            self.batch_time.unwrap_or_else(Instant::now)
        }
    }

    pub fn cmd_mut(&mut self, t: CmdToken) -> Option<&mut Cmd> {
        let c = self.cmds.get_mut(t.idx as usize)?;
        (c.gen == t.gen && c.st != St::Free).then_some(c)
    }

    /// A free slot for a command of `st`, or the limit that left none.
    fn alloc_cmd(&mut self, qp: QpHandle, st: &mut QpState, sqe: &Sqe) -> Result<u32, Limit> {
        if self.free_cmds.is_empty() && self.cmds.len() >= MAX_CMDS {
            return Err(Limit::CommandSlots);
        }
        if let Some(s) = st.peer {
            if !self.peers.take_cmd(s, PEER_CMD_SHARE) {
                return Err(Limit::PeerCommandSlots);
            }
        }
        let idx = match self.free_cmds.pop() {
            Some(i) => i,
            None => {
                self.cmds.push(Cmd::free(self.now));
                self.cmds.len() as u32 - 1
            }
        };
        let c = &mut self.cmds[idx as usize];
        c.st = St::App;
        c.op = None;
        c.qp = qp;
        c.sqe = *sqe;
        c.len = 0;
        c.got = 0;
        c.pending = 0;
        c.status = Status::SUCCESS;
        c.user = 0;
        c.timeout_reported = false;
        c.backend_failed = false;
        c.reserved = 0;
        c.peer = st.peer;
        c.discard = false;
        c.aborted = false;
        c.copy = None;
        c.fused = Fused::None;
        c.held_sgl = None;
        c.pair_fence = None;
        c.lent = None;
        c.start = if self.manual_time || self.in_pass {
            self.now
        } else {
            Instant::now()
        };
        st.inflight += 1;
        Ok(idx)
    }

    /// Free a slot of `st` (a release marker was reached, a SEND completed, or the QP
    /// is going away), give its budget back and start commands that waited for it.
    pub fn release(&mut self, st: &mut QpState, idx: u32) {
        let Some(c) = self.cmds.get_mut(idx as usize) else {
            return;
        };
        if c.st == St::Free {
            return;
        }
        match c.st {
            St::H2C => st.link.cancel_fetch(idx),
            St::WaitBuf => st.waiting.retain(|&w| w != idx),
            _ => {}
        }
        st.buf_bytes = st.buf_bytes.saturating_sub(c.reserved as usize);
        free_cmd(c, &mut self.pool, &mut self.reserve, &mut self.peers);
        self.free_cmds.push(idx);
        st.inflight = st.inflight.saturating_sub(1);
        st.link.command_released();
        if matches!(st.link, Link::Rdma(_)) {
            // A receive to post again.
            self.mark_tx(st);
        }
        self.resume_waiting(st);
    }

    /// A connection's buffer budget: at least one largest transfer.
    fn budget(&self) -> usize {
        self.cfg
            .limits
            .connection_buffer_bytes
            .max(self.cfg.max_io_size as usize)
    }

    /// What one peer address may hold of the pool: its [`PEER_POOL_SHARE`]th, and at least
    /// one largest transfer.
    fn peer_budget(&self) -> usize {
        (self.cfg.buffer_pool_bytes / PEER_POOL_SHARE).max(self.cfg.max_io_size as usize)
    }

    /// Whether `len` more bytes would take `st`'s address past its share (one holding
    /// nothing always gets one command's worth). If so, `st` waits on the share, to be
    /// resumed when the address gives bytes back on any of its QPs.
    fn peer_full(&mut self, st: &QpState, len: usize, own: usize) -> bool {
        let budget = self.peer_budget();
        st.peer
            .is_some_and(|s| self.peers.full(s, len, own, budget, st.handle))
    }

    /// The budget `len` more bytes would take `st` past, if any: its connection's (one
    /// holding nothing but the `own` bytes of the command that asks always gets one
    /// command's worth), else its address's share ([`Core::peer_full`], which then has
    /// `st` wait on the share).
    fn over_budget(&mut self, st: &QpState, len: usize, own: usize) -> Option<Limit> {
        if st.buf_bytes > own && st.buf_bytes + len > self.budget() {
            Some(Limit::ConnectionBuffers)
        } else if self.peer_full(st, len, own) {
            Some(Limit::PeerBuffers)
        } else {
            None
        }
    }

    /// Command `idx` of `st` takes `len` more bytes of its budgets (its QP's and its
    /// address's, the share its slot is counted in); `free_cmd` gives the address's part
    /// back.
    fn charge(&mut self, st: &mut QpState, idx: u32, len: usize) {
        st.buf_bytes += len;
        let c = &mut self.cmds[idx as usize];
        c.reserved += len as u32;
        if let Some(s) = c.peer {
            self.peers.charge(s, len);
        }
    }

    /// Start the commands that waited for `st`'s budget, oldest first, while it lasts.
    pub fn resume_waiting(&mut self, st: &mut QpState) {
        if st.disconnect.is_some() || st.rx_stopped {
            return;
        }
        while let Some(&idx) = st.waiting.front() {
            let len = self.cmds[idx as usize].len as usize;
            if self.over_budget(st, len, 0).is_some() {
                break;
            }
            st.waiting.pop_front();
            self.reserve_and_start(st, idx);
        }
    }

    /// Free a slot whose QP is gone.
    pub fn release_orphan(&mut self, idx: u32) {
        if let Some(c) = self.cmds.get_mut(idx as usize) {
            if c.st != St::Free {
                free_cmd(c, &mut self.pool, &mut self.reserve, &mut self.peers);
                self.free_cmds.push(idx);
            }
        }
    }

    pub fn transport_error(&mut self, qp: QpHandle, st: &mut QpState, kind: TransportErrorKind) {
        if !st.error_reported && st.disconnect.is_none() {
            st.error_reported = true;
            self.events.push_back(Event::TransportError {
                qp,
                qp_user: st.user,
                kind,
            });
        }
    }

    /// Queue the response to command `idx`: `data_len` bytes of its buffer, then `cqe`.
    pub fn respond(&mut self, st: &mut QpState, idx: u32, mut cqe: Cqe, data_len: u32) {
        let c = &mut self.cmds[idx as usize];
        c.st = St::Tx;
        cqe.cid = c.sqe.cid();
        let mut data_len = data_len.min(c.len);
        if c.lent.is_some() {
            if data_len == 0 {
                c.lent = None;
            } else if data_len == c.len && st.link.respond_lent(idx, cqe, data_len) {
                return self.mark_tx(st);
            } else if !fill_lent(c) {
                // Lent reads fit a lock set, so only a mapped file's read can fail
                // here (the file shrank). The buffer's bytes are not the read's: fail
                // it rather than send them.
                cqe = Cqe::new(cqe.cid, Status::INTERNAL_ERROR);
                data_len = 0;
                c.backend_failed = true;
                self.report_failure(st, idx, Status::INTERNAL_ERROR);
            }
        }
        let c = &self.cmds[idx as usize];
        st.link.respond(idx, &c.sqe, cqe, c.data(data_len));
        self.mark_tx(st);
    }

    /// Fail command `idx` with `status` (counted against its namespace, if any).
    pub fn fail(&mut self, st: &mut QpState, idx: u32, status: Status) {
        let c = &self.cmds[idx as usize];
        if c.op.is_some() {
            if let Some(ns) = self.ns.get(c.ns as usize).and_then(|n| n.as_ref()) {
                ns.counters.count_error(status);
            }
        }
        if st.qid.is_none() {
            self.refused_before_connect(st, c.sqe, status);
        }
        self.report_failure(st, idx, status);
        let cid = self.cmds[idx as usize].sqe.cid();
        self.respond(st, idx, Cqe::new(cid, status), 0);
    }

    /// Tells the application of a command of a connected queue that the engine failed
    /// ([`Event::CommandFailed`]), for its controller's Error Information log.
    fn report_failure(&mut self, st: &QpState, idx: u32, status: Status) {
        let Some(qid) = st.qid else { return };
        let c = &self.cmds[idx as usize];
        self.events.push_back(Event::CommandFailed {
            qp: st.handle,
            qp_user: st.user,
            failure: CommandFailure::of(&c.sqe, qid, status, c.backend_failed),
        });
    }

    /// Tells the application of a command the engine answered with an error on a queue
    /// without a controller ([`Event::RefusedBeforeConnect`]).
    fn refused_before_connect(&mut self, st: &QpState, sqe: Sqe, status: Status) {
        self.events.push_back(Event::RefusedBeforeConnect {
            qp: st.handle,
            qp_user: st.user,
            sqe,
            status,
        });
    }

    /// No slot for a capsule of `st`: every slot of this IO thread is taken (each queue
    /// is bounded by its size; many queues together can still get here), or its address
    /// holds its share. Answered without a slot; the host retries.
    fn refuse_without_slot(&mut self, st: &mut QpState, sqe: &Sqe, limit: Limit) {
        self.counters.hit(limit);
        if let Some(quiet) = self.slot_refusals.admit(self.now) {
            let peer = st
                .peer
                .and_then(|s| self.peers.addr(s))
                .map_or_else(|| "unknown peer".to_string(), |a| format!("peer {a}"));
            tracing::warn!(
                qp = st.handle.as_u64(),
                "{peer}: command (opcode {:#04x}) refused: it {}: answered Command Interrupted \
                 ({} more refused on this IO thread since the last such line) reason=\"{}\"",
                sqe.opcode(),
                limit.describe(),
                quiet,
                limit.label()
            );
        }
        if st.qid.is_none() {
            self.refused_before_connect(st, *sqe, Status::COMMAND_INTERRUPTED);
        }
        let cqe = Cqe::new(sqe.cid(), Status::COMMAND_INTERRUPTED);
        st.link.respond_untracked(cqe);
        self.mark_tx(st);
    }

    /// A capsule arrived on `qp` (either transport): offload it, or hand it up.
    pub fn on_capsule(
        &mut self,
        qp: QpHandle,
        st: &mut QpState,
        sqe: &Sqe,
        mut data: &[u8],
        data_digest_ok: bool,
    ) {
        let offload = match (st.subsys, OffloadOp::from_opcode(sqe.opcode())) {
            (Some(s), Some(op)) => self.ns_map.get(&(s.0, sqe.nsid)).map(|&ns| (op, ns)),
            _ => None,
        };
        let idx = match self.alloc_cmd(qp, st, sqe) {
            Ok(idx) => idx,
            Err(limit) => return self.refuse_without_slot(st, sqe, limit),
        };
        // Fused Compare and Write: a held first command meets the capsule after it.
        let mut first_of_pair = None;
        if let Some(f) = st.fused_first.take() {
            let pair = sqe.fuse() == nvmf::copy::FUSE_SECOND
                && nvmf::copy::fused_pair_status(&self.cmds[f as usize].sqe, sqe).is_ok()
                && matches!(offload, Some((OffloadOp::Write, n)) if n == self.cmds[f as usize].ns);
            if pair {
                self.cmds[f as usize].fused = Fused::First {
                    partner: Some(idx),
                    ready: false,
                };
                self.cmds[idx as usize].fused = Fused::Second {
                    partner: f,
                    ready: false,
                };
                first_of_pair = Some(f);
            } else {
                self.fail(st, f, Status::ABORTED_MISSING_FUSED);
            }
        }
        if sqe.fuse() == nvmf::copy::FUSE_RESERVED && !sqe.is_fabrics() {
            // FUSE 11b is reserved (SPDK and nvmet answer it so too).
            return self.fail(st, idx, Status::INVALID_FIELD);
        }
        if sqe.fuse() == nvmf::copy::FUSE_SECOND && first_of_pair.is_none() {
            return self.fail(st, idx, Status::ABORTED_MISSING_FUSED);
        }
        if !data_digest_ok {
            // NVMe/TCP 1.0 section 3.6.2.5: a data digest error fails the command only.
            if let Some(f) = first_of_pair {
                self.fail(st, f, Status::ABORTED_FAILED_FUSED);
            }
            return self.fail(st, idx, Status::TRANSIENT_TRANSPORT_ERROR);
        }
        let sgl = match DataSgl::parse(sqe, st.link.transport(), data.len()) {
            Ok(s @ DataSgl::InCapsule { len, offset }) => {
                // From here on the data is the SGL's bytes only.
                data = &data[offset as usize..(offset + len) as usize];
                s
            }
            Ok(s) => s,
            Err(status) => {
                if let Some((_, ns)) = offload {
                    self.cmds[idx as usize].op = offload.map(|o| o.0);
                    self.cmds[idx as usize].ns = ns;
                }
                // A second whose first is paired already takes it along.
                return self.fail_with_partner(st, idx, status);
            }
        };
        match offload {
            Some((op, ns)) => {
                bump(&self.counters.offloaded, 1);
                // Reservations, ANA path state, per-host visibility (the published view).
                let checked = self.ns[ns as usize]
                    .as_mut()
                    .map_or(Ok(()), |n| n.check_access(&st.access, op));
                if let Err(status) = checked {
                    let c = &mut self.cmds[idx as usize];
                    c.op = Some(op);
                    c.ns = ns;
                    if let Some(f) = first_of_pair {
                        self.fail(st, f, Status::ABORTED_FAILED_FUSED);
                    }
                    return self.fail(st, idx, status);
                }
                if sqe.fuse() == nvmf::copy::FUSE_FIRST {
                    return self.hold_first_fused(st, idx, op, ns, sgl, data);
                }
                self.start_offload(st, idx, op, ns, sgl, data);
                if let Some(f) = first_of_pair {
                    self.start_held(st, f);
                }
            }
            None if sqe.fuse() != 0 => {
                // Fused commands run where the data is: not on a namespace that is not
                // offloaded here.
                self.fail(st, idx, Status::ABORTED_MISSING_FUSED)
            }
            None => {
                bump(&self.counters.non_offloaded, 1);
                self.start_non_offload(qp, st, idx, sgl, data);
            }
        }
    }

    /// A first fused command (a Compare): held, unstarted, until the next capsule.
    fn hold_first_fused(
        &mut self,
        st: &mut QpState,
        idx: u32,
        op: OffloadOp,
        ns: u32,
        sgl: DataSgl,
        data: &[u8],
    ) {
        if op != OffloadOp::Compare {
            return self.fail(st, idx, Status::ABORTED_MISSING_FUSED);
        }
        if !data.is_empty() {
            let Some(mut b) = self.pool.get(data.len()) else {
                return self.fail(st, idx, Status::INTERNAL_ERROR);
            };
            b.set_len(data.len());
            b.as_mut_slice().copy_from_slice(data);
            self.cmds[idx as usize].buf = Some(b);
        }
        let c = &mut self.cmds[idx as usize];
        c.op = Some(op);
        c.ns = ns;
        c.held_sgl = Some(sgl);
        c.fused = Fused::First {
            partner: None,
            ready: false,
        };
        st.fused_first = Some(idx);
    }

    /// Starts a held first fused command now that its partner is here.
    fn start_held(&mut self, st: &mut QpState, idx: u32) {
        let c = &mut self.cmds[idx as usize];
        // No SGL: its second failed first, and it with it (`fail_partner`).
        let (Some(op), Some(sgl)) = (c.op, c.held_sgl.take()) else {
            return;
        };
        let ns = c.ns;
        let held = c.buf.take();
        let data: Vec<u8> = held.as_ref().map_or(Vec::new(), |b| b.as_slice().to_vec());
        if let Some(b) = held {
            self.pool.put(b);
        }
        self.start_offload(st, idx, op, ns, sgl, &data);
    }

    /// Whether command `idx` must wait for a fused pair's range on its namespace, for a
    /// pair on which thread, and for which blocks (from the first to the last): writes,
    /// deallocations and Copies whose blocks overlap a pair's range.
    #[inline]
    fn lock_wait(&self, idx: u32) -> Option<(Take, (u64, u64))> {
        let c = &self.cmds[idx as usize];
        let op = c.op?;
        if !matches!(
            op,
            OffloadOp::Write
                | OffloadOp::WriteZeroes
                | OffloadOp::DatasetManagement
                | OffloadOp::Copy
        ) {
            return None;
        }
        let ns = self.ns.get(c.ns as usize).and_then(|n| n.as_ref())?;
        let elsewhere = ns.locks.shared().any_claimed();
        if ns.locks.is_empty() && !elsewhere {
            return None;
        }
        let mut buf = [(0u64, 0u32); command::DSM_MAX_RANGES];
        // The blocks it writes; `None`: any (the whole namespace).
        let ranges: Option<&[(u64, u32)]> = match op {
            OffloadOp::DatasetManagement if !command::dsm_deallocate(&c.sqe) => return None,
            OffloadOp::DatasetManagement => {
                // A list that is refused (a range past the end) deallocates nothing.
                let n = command::dsm_ranges(&c.sqe, c.data(c.len), ns.nblocks, &mut buf).ok()?;
                Some(&buf[..n])
            }
            // Only the destination is written (formats other than 0 were refused before
            // their data came). Descriptors not all there: any blocks (the Copy is
            // refused when it starts).
            OffloadOp::Copy => nvmf::copy::destination_range(&c.sqe, c.data(c.len)).map(|r| {
                buf[0] = r;
                &buf[..1]
            }),
            _ => {
                buf[0] = (c.sqe.slba(), c.sqe.nlb());
                Some(&buf[..1])
            }
        };
        let Some(ranges) = ranges else {
            let span = (0, u64::MAX);
            if !ns.locks.is_empty() {
                return Some((Take::BusyHere, span));
            }
            return elsewhere.then_some((Take::BusyElsewhere, span));
        };
        // Nothing to write (every range of length 0): nothing to wait for.
        let span = ranges
            .iter()
            .map(|&r| super::span_of(r))
            .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))?;
        if ranges.iter().any(|&r| ns.locks.overlaps(r)) {
            return Some((Take::BusyHere, span));
        }
        // This thread's own ranges are among the shared ones, and do not overlap.
        let there = elsewhere && ns.locks.shared().overlaps(ranges);
        there.then_some((Take::BusyElsewhere, span))
    }

    /// A fused command's host data is in: run the pair once both are ready.
    fn fused_ready(&mut self, st: &mut QpState, idx: u32) {
        let partner = match &mut self.cmds[idx as usize].fused {
            Fused::First { partner, ready } => {
                *ready = true;
                *partner
            }
            Fused::Second { partner, ready } => {
                *ready = true;
                Some(*partner)
            }
            Fused::None => None,
        };
        let Some(p) = partner else {
            return;
        };
        let both = matches!(
            (self.cmds[idx as usize].fused, self.cmds[p as usize].fused),
            (
                Fused::First { ready: true, .. },
                Fused::Second { ready: true, .. }
            ) | (
                Fused::Second { ready: true, .. },
                Fused::First { ready: true, .. }
            )
        );
        if both {
            let first = if matches!(self.cmds[idx as usize].fused, Fused::First { .. }) {
                idx
            } else {
                p
            };
            self.run_fused(st, first);
        }
    }

    /// Runs a ready pair: lock its range on this thread (or wait for the pair holding an
    /// overlapping one), read for the compare; the write follows in
    /// [`Core::fused_compared`].
    fn run_fused(&mut self, st: &mut QpState, first: u32) {
        let c = &self.cmds[first as usize];
        let (range, ns_idx) = ((c.sqe.slba(), c.sqe.nlb()), c.ns);
        let key = c.tag(first);
        let Fused::First {
            partner: Some(second),
            ..
        } = c.fused
        else {
            return;
        };
        let Some(ns) = self.ns[ns_idx as usize].as_mut() else {
            self.fail(st, second, Status::ABORTED_FAILED_FUSED);
            return self.fail(st, first, Status::INVALID_NAMESPACE);
        };
        self.cmds[first as usize].st = St::Backend;
        self.cmds[second as usize].st = St::Backend;
        let fence = match self.cmds[first as usize].pair_fence.take() {
            // The range is the pair's already; its fence may be through.
            Some(fence) => fence,
            None => {
                match ns.locks.take(range, key) {
                    Take::Taken => {}
                    Take::BusyHere => {
                        ns.locks.wait(key, super::span_of(range), false);
                        return ns.blocked.push_back(first);
                    }
                    Take::BusyElsewhere => {
                        ns.locks.wait(key, super::span_of(range), true);
                        ns.remote_wait = true;
                        return ns.blocked.push_back(first);
                    }
                }
                // From here on, a write to the range waits on every IO thread; one that
                // went ahead before the claim may still be in flight (on any thread: the
                // backend does not keep submission order). The compare waits until every
                // IO thread has seen the claim and what it let through before is done.
                let fence = super::fence_all(&self.contexts, ns.subsys, ns.nsid, Some(&self.me));
                // This thread's part at once: done now if it has nothing in flight there.
                ns.fences.add(fence.clone());
                fence
            }
        };
        if !fence.is_done() {
            self.cmds[first as usize].pair_fence = Some(fence);
            ns.remote_wait = true;
            return ns.blocked.push_back(first);
        }
        let len = self.cmds[first as usize].len as usize;
        let Some(mut b) = self.pool.get(len) else {
            // The commands that waited for the range try again on the next pass.
            let waiting = self.unlock(ns_idx, range);
            if let Some(ns) = self.ns[ns_idx as usize].as_mut() {
                ns.blocked.extend(waiting);
                ns.remote_wait |= !ns.blocked.is_empty();
            }
            self.fail(st, second, Status::ABORTED_FAILED_FUSED);
            return self.fail(st, first, Status::INTERNAL_ERROR);
        };
        b.set_len(len);
        let c = &mut self.cmds[first as usize];
        c.pending = 1;
        let tag = c.tag(first);
        self.push_req(
            ns_idx,
            Request {
                tag,
                op: Op::Read,
                lba: range.0,
                nblocks: range.1,
                buf: Some(b),
            },
        );
    }

    /// Drops a fused pair's range lock; the commands that waited for it go on. Returns
    /// them for the caller to restart with their QPs.
    fn unlock(&mut self, ns_idx: u32, range: (u64, u32)) -> Vec<u32> {
        let Some(ns) = self.ns[ns_idx as usize].as_mut() else {
            return Vec::new();
        };
        ns.locks.give_back(range);
        // All of them are tried again (or put back for the next pass to try).
        ns.locks.refind();
        ns.blocked.drain(..).collect()
    }

    /// The namespace slots some command is bound to (an offloaded command not yet freed,
    /// in any state: waiting for its data or a buffer, at the backend, answering): a
    /// removed namespace's slot stays until none is, so that it is not reused meanwhile.
    pub(super) fn bound_slots(&self) -> Vec<bool> {
        let mut bound = vec![false; self.ns.len()];
        for c in &self.cmds {
            if c.st != St::Free && c.op.is_some() {
                if let Some(b) = bound.get_mut(c.ns as usize) {
                    *b = true;
                }
            }
        }
        bound
    }

    /// Whether some namespace has commands waiting for another IO thread (`remote_wait`).
    pub(super) fn any_remote_wait(&self) -> bool {
        self.ns.iter().flatten().any(|n| n.remote_wait)
    }

    /// Tries again the commands of namespaces with a pair waiting for another IO thread's
    /// range (they may wait again). Returns whether any of them went on (rather than
    /// waiting again).
    pub(super) fn retry_remote_waits(&mut self, qps: &mut [QpSlot]) -> bool {
        let mut any = false;
        for i in 0..self.ns.len() {
            let Some(ns) = self.ns[i].as_mut().filter(|n| n.remote_wait) else {
                continue;
            };
            ns.remote_wait = false;
            ns.locks.refind();
            let waiting: Vec<u32> = ns.blocked.drain(..).collect();
            let before = waiting.len();
            self.restart_blocked(qps, waiting);
            let Some(ns) = self.ns[i].as_mut() else {
                continue;
            };
            // Commands that wait again keep their turn; the ones that went on give it up.
            ns.locks.sync_waiting();
            any |= ns.blocked.len() < before;
        }
        any
    }

    /// Restarts commands that waited for a range lock (they may wait again).
    fn restart_blocked(&mut self, qps: &mut [QpSlot], waiting: Vec<u32>) {
        for idx in waiting {
            let c = &self.cmds[idx as usize];
            if c.st != St::Backend {
                continue;
            }
            let (qh, first) = (c.qp, matches!(c.fused, Fused::First { .. }));
            let Some(q) = qp_ref(qps, qh) else {
                self.release_orphan(idx);
                continue;
            };
            if first {
                self.run_fused(&mut q.st, idx);
            } else if let Err(status) = self.recheck_access(&q.st, idx) {
                // It waited: the view may have changed meanwhile (`recheck_access`).
                self.fail(&mut q.st, idx, status);
            } else {
                self.submit_offload(&mut q.st, idx);
            }
        }
    }

    /// The compare of a fused pair finished with `status`: on a match the write goes;
    /// otherwise both complete (Compare Failure, and the write aborted as its partner
    /// failed).
    fn fused_compared(&mut self, qps: &mut [QpSlot], first: u32, status: Status) {
        let c = &self.cmds[first as usize];
        let (qh, ns_idx, range) = (c.qp, c.ns, (c.sqe.slba(), c.sqe.nlb()));
        let Fused::First {
            partner: Some(second),
            ..
        } = c.fused
        else {
            return;
        };
        if status.is_success() {
            let w = &mut self.cmds[second as usize];
            w.pending = 1;
            let tag = w.tag(second);
            let req = Request {
                tag,
                op: Op::Write { fua: w.sqe.fua() },
                lba: range.0,
                nblocks: range.1,
                buf: w.buf.take(),
            };
            return self.push_req(ns_idx, req);
        }
        let waiting = self.unlock(ns_idx, range);
        if let Some(q) = qp_ref(qps, qh) {
            if q.st.disconnect.is_none() {
                self.complete_offload(&mut q.st, first, status);
                self.complete_offload(&mut q.st, second, Status::ABORTED_FAILED_FUSED);
            } else {
                self.release(&mut q.st, first);
                self.release(&mut q.st, second);
            }
        }
        self.restart_blocked(qps, waiting);
    }

    /// The write of a fused pair finished: both complete, the range is free again.
    fn fused_written(&mut self, qps: &mut [QpSlot], second: u32, status: Status) {
        let c = &self.cmds[second as usize];
        let (qh, ns_idx, range) = (c.qp, c.ns, (c.sqe.slba(), c.sqe.nlb()));
        let Fused::Second { partner: first, .. } = c.fused else {
            return;
        };
        let waiting = self.unlock(ns_idx, range);
        if let Some(q) = qp_ref(qps, qh) {
            if q.st.disconnect.is_none() {
                self.complete_offload(&mut q.st, first, Status::SUCCESS);
                self.complete_offload(&mut q.st, second, status);
            } else {
                self.release(&mut q.st, first);
                self.release(&mut q.st, second);
            }
        }
        self.restart_blocked(qps, waiting);
    }

    /// Hand a command up with a payload buffer for what the application can use of its
    /// data: host data only as much as the target reads
    /// ([`nvmf::target::slow_path_host_data`]: before Connect, one Connect's data at a
    /// time, nothing else; so nothing is solicited from a queue without a controller),
    /// room for data to the host only once the queue has a controller (bounded by the max
    /// I/O size). Filled already when the data came in-capsule.
    fn start_non_offload(
        &mut self,
        qp: QpHandle,
        st: &mut QpState,
        idx: u32,
        sgl: DataSgl,
        data: &[u8],
    ) {
        let sqe = self.cmds[idx as usize].sqe;
        let len = match sqe.data_direction() {
            DataDirection::HostToController if st.qid.is_none() && st.buf_bytes > 0 => 0,
            DataDirection::HostToController => sgl
                .len()
                .min(nvmf::target::slow_path_host_data(&sqe, st.qid)),
            DataDirection::None => 0,
            _ if st.qid.is_some() => sgl.len(),
            _ => 0,
        };
        if len > self.cfg.max_io_size.max(ADMIN_INCAPSULE) {
            return self.fail(st, idx, Status::INVALID_FIELD);
        }
        let in_capsule = matches!(sgl, DataSgl::InCapsule { .. }) && len > 0;
        self.cmds[idx as usize].len = len;
        if len > 0 && !in_capsule {
            // Room for data the application will read or write (a Get Log Page, an
            // Identify, Connect data to fetch) counts against the same budgets as I/O: a
            // peer with many large admin commands outstanding must not empty the pool
            // that other hosts' Connects and I/O draw from. Past them it waits, as I/O
            // does (`resume_waiting`). (In-capsule data is here already: taken as is.)
            if let Some(limit) = self.over_budget(st, len as usize, 0) {
                self.counters.hit(limit);
                // A small transfer past its address's share (an Identify, or RDMA Connect
                // data, while the host's own I/O holds the share) takes a reserve buffer
                // rather than wait behind that I/O for as long as it keeps coming.
                if limit == Limit::PeerBuffers && len as usize <= ADMIN_RESERVE_MAX {
                    if let Some(b) = self.reserve.get(len as usize) {
                        return self.hand_up_in(qp, st, idx, None, Some(b));
                    }
                }
                self.cmds[idx as usize].st = St::WaitBuf;
                st.waiting.push_back(idx);
                return;
            }
        }
        self.hand_up(qp, st, idx, in_capsule.then_some(data));
    }

    /// [`Core::start_non_offload`], once within the budgets: take the payload buffer
    /// (`in_capsule`: filled with the data that came with the capsule; else zeroed) and
    /// hand the command up.
    fn hand_up(&mut self, qp: QpHandle, st: &mut QpState, idx: u32, in_capsule: Option<&[u8]>) {
        let len = self.cmds[idx as usize].len as usize;
        if len == 0 {
            return self.hand_up_in(qp, st, idx, in_capsule, None);
        }
        // With the pool held by other peers, a small transfer (a Connect's data, an
        // Identify) takes one of the reserve's buffers (`free_cmd` gives it back there).
        let Some(b) = self.pool.get(len).or_else(|| {
            self.counters.hit(Limit::BufferPool);
            self.reserve.get(len)
        }) else {
            return self.fail(st, idx, Status::COMMAND_INTERRUPTED);
        };
        self.hand_up_in(qp, st, idx, in_capsule, Some(b));
    }

    /// [`Core::hand_up`] with the payload buffer (`None` for no data) taken.
    fn hand_up_in(
        &mut self,
        qp: QpHandle,
        st: &mut QpState,
        idx: u32,
        in_capsule: Option<&[u8]>,
        buf: Option<IoBuf>,
    ) {
        let len = self.cmds[idx as usize].len;
        if let Some(mut b) = buf {
            let s = &mut b.as_mut_slice()[..len as usize];
            match in_capsule {
                Some(data) => s.copy_from_slice(&data[..len as usize]),
                None => s.fill(0),
            }
            self.cmds[idx as usize].buf = Some(b);
            self.charge(st, idx, len as usize);
        }
        let c = &mut self.cmds[idx as usize];
        c.got = if in_capsule.is_some() { len } else { 0 };
        c.st = St::App;
        self.events.push_back(Event::NonOffload {
            qp,
            qp_user: st.user,
            token: CmdToken { idx, gen: c.gen },
            sqe: c.sqe,
            payload_len: len,
            payload_valid: in_capsule.is_some() || len == 0,
        });
    }

    fn start_offload(
        &mut self,
        st: &mut QpState,
        idx: u32,
        op: OffloadOp,
        ns_idx: u32,
        sgl: DataSgl,
        data: &[u8],
    ) {
        let sqe = self.cmds[idx as usize].sqe;
        {
            let c = &mut self.cmds[idx as usize];
            c.op = Some(op);
            c.ns = ns_idx;
        }
        let Some(ns) = self.ns[ns_idx as usize].as_ref() else {
            return self.fail_with_partner(st, idx, Status::INVALID_NAMESPACE);
        };
        let (shift, nblocks) = (ns.shift, ns.nblocks);
        if op.uses_lba_range() {
            if let Err(s) = command::check_lba_range(&sqe, nblocks) {
                return self.fail_with_partner(st, idx, s);
            }
        }
        if op == OffloadOp::Copy && nvmf::copy::descriptor_format(&sqe) != 0 {
            // Before the transfer's length, which is sized for format 0's descriptors.
            return self.fail(st, idx, Status::INVALID_FIELD);
        }
        let len = op.transfer_len(&sqe, shift);
        if len > self.cfg.max_io_size as u64 {
            return self.fail_with_partner(st, idx, Status::INVALID_FIELD);
        }
        let len = len as u32;
        self.cmds[idx as usize].len = len;
        if let Err(s) = sgl.check_transfer(op, len) {
            return self.fail_with_partner(st, idx, s);
        }
        if len == 0 {
            return self.submit_offload(st, idx);
        }
        if let DataSgl::InCapsule { .. } = sgl {
            if op == OffloadOp::Write && self.write_through(st, idx, &data[..len as usize]) {
                return;
            }
            // The data is here already (bounded by the in-capsule size): take it, budget
            // or not.
            let Some(mut b) = self.pool.get(len as usize) else {
                self.counters.hit(Limit::BufferPool);
                return self.fail_with_partner(st, idx, Status::COMMAND_INTERRUPTED);
            };
            b.set_len(len as usize);
            // Only the transfer is taken (a DSM range buffer may be longer).
            b.as_mut_slice()[..len as usize].copy_from_slice(&data[..len as usize]);
            let c = &mut self.cmds[idx as usize];
            c.buf = Some(b);
            c.got = len;
            self.charge(st, idx, len as usize);
            return self.submit_offload(st, idx);
        }
        self.reserve_and_start(st, idx)
    }

    /// Take command `idx`'s share of `st`'s buffer budget and go on (fetch the host's
    /// data, or read from the backend), or wait for the budget.
    fn reserve_and_start(&mut self, st: &mut QpState, idx: u32) {
        let len = self.cmds[idx as usize].len;
        let limit = self.over_budget(st, len as usize, 0);
        let c = &mut self.cmds[idx as usize];
        if let Some(limit) = limit {
            if c.st != St::WaitBuf {
                c.st = St::WaitBuf;
                self.counters.hit(limit);
            }
            st.waiting.push_back(idx);
            return;
        }
        let Some(op) = c.op else {
            // A command for the application that waited for the budgets.
            return self.hand_up(st.handle, st, idx, None);
        };
        self.charge(st, idx, len as usize);
        let h2c = op.direction() == DataDirection::HostToController;
        if h2c && matches!(st.link, Link::Tcp(_)) {
            // The buffer is taken when the data arrives (`on_host_data`).
            return self.fetch_host_data(st, idx);
        }
        // An RDMA READ needs its destination now; a read needs room for the backend.
        let Some(mut b) = self.pool.get(len as usize) else {
            self.counters.hit(Limit::BufferPool);
            return self.fail_with_partner(st, idx, Status::COMMAND_INTERRUPTED);
        };
        b.set_len(len as usize);
        self.cmds[idx as usize].buf = Some(b);
        if h2c {
            return self.fetch_host_data(st, idx);
        }
        self.submit_offload(st, idx)
    }

    /// Fetch the rest of command `idx`'s host data into its buffer: the one place both
    /// the offloaded path and the application's `rdma_read` go through, on either
    /// transport. [`Core::host_data_done`] follows.
    pub fn fetch_host_data(&mut self, st: &mut QpState, idx: u32) {
        let c = &mut self.cmds[idx as usize];
        let (off, len) = (c.got, c.len - c.got);
        c.st = St::H2C;
        c.since = self.now;
        let sqe = c.sqe;
        if st.link.fetch(idx, &sqe, off, len) {
            self.mark_tx(st);
        } else {
            let qp = c.qp;
            self.host_data_done(qp, st, idx, Err(TaskError::BadState));
        }
    }

    /// Host data for command `idx` arrived at `offset` (NVMe/TCP H2CData, already checked
    /// by the queue machine); `complete` once the whole range is in.
    pub fn on_host_data(
        &mut self,
        qp: QpHandle,
        st: &mut QpState,
        idx: u32,
        offset: u32,
        data: &[u8],
        complete: Option<bool>,
    ) {
        let end = offset as usize + data.len();
        if let Some(dst) = self.host_data_dest(qp, idx, offset, data.len() as u32) {
            dst.copy_from_slice(data);
        }
        let Some(c) = self.cmds.get_mut(idx as usize) else {
            return;
        };
        if c.st != St::H2C || c.qp != qp {
            return;
        }
        c.got = end as u32;
        match complete {
            None => {}
            Some(true) => self.host_data_done(qp, st, idx, Ok(())),
            Some(false) => self.host_data_done(qp, st, idx, Err(TaskError::DataDigest)),
        }
    }

    /// Where `len` bytes of host data at `offset` of command `idx` (fetching on `qp`) go:
    /// a slice of its buffer, taken from the pool when the first data arrives. `None`:
    /// not a fetching command of this QP, out of its range, or nothing to put it in (the
    /// command then takes the rest of its transfer off the wire and fails).
    pub fn host_data_dest(
        &mut self,
        qp: QpHandle,
        idx: u32,
        offset: u32,
        len: u32,
    ) -> Option<&mut [u8]> {
        let Core {
            cmds,
            pool,
            counters,
            ..
        } = self;
        let c = cmds.get_mut(idx as usize)?;
        if c.st != St::H2C || c.qp != qp {
            return None;
        }
        if c.buf.is_none() && !c.discard && c.len > 0 {
            // The data is coming: now it needs a buffer.
            match pool.get(c.len as usize) {
                Some(mut b) => {
                    b.set_len(c.len as usize);
                    c.buf = Some(b);
                }
                None => {
                    // Nothing to put it in: take the rest of the transfer off the wire
                    // and fail the command (the host retries it).
                    counters.hit(Limit::BufferPool);
                    c.discard = true;
                    c.status = Status::COMMAND_INTERRUPTED;
                }
            }
        }
        let end = offset as usize + len as usize;
        c.buf.as_mut()?.as_mut_slice().get_mut(offset as usize..end)
    }

    /// The host-data fetch of command `idx` ended: hand the result to the application
    /// (`rdma_read` task) or run the offloaded command.
    pub fn host_data_done(
        &mut self,
        qp: QpHandle,
        st: &mut QpState,
        idx: u32,
        result: Result<(), TaskError>,
    ) {
        let c = &mut self.cmds[idx as usize];
        if result.is_ok() {
            c.got = c.len;
        }
        if c.discard && c.op.is_some() && st.disconnect.is_none() {
            let status = c.status;
            self.fail_with_partner(st, idx, status);
        } else if c.op.is_none() {
            c.st = St::App;
            let user = c.user;
            self.events.push_back(Event::TaskDone {
                kind: TaskKind::RdmaRead,
                qp,
                user,
                result,
            });
        } else if st.disconnect.is_some() {
            // Nothing more goes out; the slot is freed with the QP.
        } else if result.is_err() {
            self.fail_with_partner(st, idx, Status::TRANSIENT_TRANSPORT_ERROR);
        } else if c.aborted {
            // Abort Requested, or the status its fused partner's failure left.
            let status = if c.status.is_success() {
                Status::ABORT_REQUESTED
            } else {
                c.status
            };
            self.fail(st, idx, status);
        } else if let Err(status) = self.recheck_access(st, idx) {
            self.fail(st, idx, status);
        } else {
            self.submit_offload(st, idx);
        }
    }

    /// Fail command `idx` with `status`, and its fused partner, if any, with it
    /// ([`Core::fail_partner`]). Every check a command can fail on its own before it runs
    /// fails this way: a half of a pair failed alone left the other waiting for good.
    fn fail_with_partner(&mut self, st: &mut QpState, idx: u32, status: Status) {
        self.fail(st, idx, status);
        self.fail_partner(st, idx);
    }

    /// Command `idx`, half of a fused pair, failed on its own: its partner cannot run and
    /// fails too (Aborted - Failed Fused), at once if its host data is in, else when it
    /// is (the host was asked for it).
    fn fail_partner(&mut self, st: &mut QpState, idx: u32) {
        let partner = match self.cmds[idx as usize].fused {
            Fused::First {
                partner: Some(p), ..
            } => p,
            Fused::Second { partner, .. } => partner,
            _ => return,
        };
        self.cmds[idx as usize].fused = Fused::None;
        let p = &mut self.cmds[partner as usize];
        let ready = match p.fused {
            Fused::First { ready, .. } | Fused::Second { ready, .. } => ready,
            Fused::None => return,
        };
        p.fused = Fused::None;
        // A first still held (its second failed before starting it) has its data already:
        // nothing will start it now.
        let held = p.held_sgl.take().is_some();
        if ready || held {
            self.fail(st, partner, Status::ABORTED_FAILED_FUSED);
        } else {
            p.aborted = true;
            p.status = Status::ABORTED_FAILED_FUSED;
        }
    }

    /// Access of a command whose host data has just come in, checked again before it
    /// runs: the view may have changed while the data was on its way (its host was
    /// preempted: a Preempt and Abort completes once the new view is published, and a
    /// write of the preempted host must not land after that). Fused pairs are checked
    /// when they arrive only.
    fn recheck_access(&mut self, st: &QpState, idx: u32) -> Result<(), Status> {
        let c = &self.cmds[idx as usize];
        if c.fused != Fused::None {
            return Ok(());
        }
        let (Some(op), ns) = (c.op, c.ns) else {
            return Ok(());
        };
        self.ns
            .get_mut(ns as usize)
            .and_then(|n| n.as_mut())
            .map_or(Ok(()), |n| n.check_access(&st.access, op))
    }

    fn push_req(&mut self, ns_idx: u32, req: Request) {
        self.push_req_as(ns_idx, req, false)
    }

    /// [`Core::push_req`]; `continued`: the request is the next step of a command whose
    /// previous step's completion did not end its count in the fences (a Copy's next
    /// read or its write, from `Core::copy_step`), so it keeps that step's parity: a
    /// fence then waits for the whole command, not only the step in flight.
    fn push_req_as(&mut self, ns_idx: u32, mut req: Request, continued: bool) {
        if let Some(ns) = self.ns[ns_idx as usize].as_mut() {
            if !continued {
                req.tag = (req.tag & !FENCE_BIT) | ns.fences.started();
            }
            ns.publish_depth();
            match ns.q.submit(req) {
                Ok(()) => {}
                Err(SubmitError::Full(r)) => ns.pending.push_back(r),
                Err(SubmitError::Closed(r)) => ns.refuse(r),
            }
        }
    }

    /// All host data is in: hand the command to the backend.
    fn submit_offload(&mut self, st: &mut QpState, idx: u32) {
        // A namespace being removed keeps its slot while commands are bound to it
        // (`Core::bound_slots`), so the data of a write that came after the removal goes
        // to that namespace's backend, never to another one's. Its queues destroyed
        // (`be_queue_destroy`), nothing more goes down.
        match self.ns.get(self.cmds[idx as usize].ns as usize) {
            Some(Some(ns)) if !ns.acked => {}
            Some(Some(_)) => return self.fail_with_partner(st, idx, Status::ABORTED_SQ_DELETION),
            _ => return self.fail_with_partner(st, idx, Status::INVALID_NAMESPACE),
        }
        if self.cmds[idx as usize].fused != Fused::None {
            return self.fused_ready(st, idx);
        }
        if let Some(wait) = self.lock_wait(idx) {
            let c = &mut self.cmds[idx as usize];
            c.st = St::Backend;
            let ns_idx = c.ns;
            let key = c.tag(idx);
            if let Some(ns) = self.ns[ns_idx as usize].as_mut() {
                ns.blocked.push_back(idx);
                // A pair on another thread: nothing here will restart it, so every pass
                // does. Pairs that come later wait for it.
                let elsewhere = wait.0 == Take::BusyElsewhere;
                ns.remote_wait |= elsewhere;
                ns.locks.wait(key, wait.1, elsewhere);
            }
            return;
        }
        let c = &mut self.cmds[idx as usize];
        let sqe = c.sqe;
        let ns_idx = c.ns;
        let tag = c.tag(idx);
        c.st = St::Backend;
        let (lba, nblocks) = (sqe.slba(), sqe.nlb());
        let Some(op) = c.op else {
            return self.fail(st, idx, Status::INTERNAL_ERROR);
        };
        if op == OffloadOp::Read && self.lend_read(st, idx) {
            return;
        }
        let c = &mut self.cmds[idx as usize];
        // The commands that are one backend request each.
        let single = match op {
            OffloadOp::Read => Some((Op::Read, lba, nblocks, c.buf.take())),
            OffloadOp::Write => Some((Op::Write { fua: sqe.fua() }, lba, nblocks, c.buf.take())),
            OffloadOp::Flush => Some((Op::Flush, 0, 0, None)),
            // FUA (CDW12 bit 30, as for Write) goes down with the request: the backend
            // makes the zeroes durable before it completes.
            OffloadOp::WriteZeroes => {
                Some((Op::WriteZeroes { fua: sqe.fua() }, lba, nblocks, None))
            }
            OffloadOp::Compare | OffloadOp::DatasetManagement | OffloadOp::Copy => None,
        };
        if let Some((op, lba, nblocks, buf)) = single {
            c.pending = 1;
            let req = Request {
                tag,
                op,
                lba,
                nblocks,
                buf,
            };
            return self.push_req(ns_idx, req);
        }
        if op == OffloadOp::Compare {
            let len = c.len as usize;
            let Some(mut b) = self.pool.get(len) else {
                self.counters.hit(Limit::BufferPool);
                return self.fail(st, idx, Status::COMMAND_INTERRUPTED);
            };
            b.set_len(len);
            self.cmds[idx as usize].pending = 1;
            let req = Request {
                tag,
                op: Op::Read,
                lba,
                nblocks,
                buf: Some(b),
            };
            return self.push_req(ns_idx, req);
        }
        if op == OffloadOp::Copy {
            return self.start_copy(st, idx);
        }
        // Dataset Management: deallocate every range; the other attributes are hints.
        let mut ranges = [(0u64, 0u32); command::DSM_MAX_RANGES];
        let n = if command::dsm_deallocate(&sqe) {
            let nblocks_ns = self.ns[ns_idx as usize].as_ref().map_or(0, |n| n.nblocks);
            let c = &self.cmds[idx as usize];
            match command::dsm_ranges(&sqe, c.data(c.len), nblocks_ns, &mut ranges) {
                Ok(n) => n,
                Err(s) => return self.fail(st, idx, s),
            }
        } else {
            0
        };
        if n == 0 {
            return self.complete_offload(st, idx, Status::SUCCESS);
        }
        self.cmds[idx as usize].pending = n as u16;
        for &(lba, nblocks) in &ranges[..n] {
            let req = Request {
                tag,
                op: Op::Deallocate,
                lba,
                nblocks,
                buf: None,
            };
            self.push_req(ns_idx, req);
        }
    }

    /// A Read from a RAM namespace on a plain TCP queue without data digest: answered at
    /// once, its data to be sent from the store when the C2HData goes out (one copy, the
    /// kernel's, instead of two). False (nothing done) where that does not apply: the
    /// digest and TLS would read the data before the send, RDMA writes from registered
    /// buffers, and other backends have no bytes to lend.
    fn lend_read(&mut self, st: &mut QpState, idx: u32) -> bool {
        let Link::Tcp(t) = &st.link else {
            return false;
        };
        if !t.wire.is_plain() || t.machine.digests().data {
            return false;
        }
        let c = &mut self.cmds[idx as usize];
        let Some(src) = self.ns[c.ns as usize].as_ref().and_then(|n| n.ram.as_ref()) else {
            return false;
        };
        // Longer reads might not fit one writev's lock set (`tcp_link::flush`).
        let Some((off, len)) = src
            .byte_range(c.sqe.slba(), c.sqe.nlb())
            .filter(|&(_, len)| len <= backend::ram::LEND_MAX_BYTES)
        else {
            return false;
        };
        match c.buf.as_mut() {
            Some(b) if len == c.len as usize && b.capacity() >= len => b.set_len(len),
            _ => return false,
        }
        c.lent = Some(LentRead {
            src: src.clone(),
            off,
        });
        self.complete_offload(st, idx, Status::SUCCESS);
        true
    }

    /// An in-capsule Write to a RAM namespace: its data goes from where it arrived
    /// straight into the store and the command completes at once (no buffer, no second
    /// copy). False (nothing done) for a fused Write, one that must wait for a fused
    /// pair's range, a FUA write to a mapped file, and other backends.
    fn write_through(&mut self, st: &mut QpState, idx: u32, data: &[u8]) -> bool {
        let c = &self.cmds[idx as usize];
        if c.fused != Fused::None || self.lock_wait(idx).is_some() {
            return false;
        }
        let Some(src) = self.ns[c.ns as usize].as_ref().and_then(|n| n.ram.as_ref()) else {
            return false;
        };
        // FUA on a mapped file means a sync, and the file backend's queue does that (and
        // remembers a failed one).
        if c.sqe.fua() && src.is_file() {
            return false;
        }
        if !src.write_blocks(c.sqe.slba(), c.sqe.nlb(), data) {
            return false;
        }
        self.complete_offload(st, idx, Status::SUCCESS);
        true
    }

    /// Copy, step 1: check the source ranges (format 0, the namespace's MSSRL/MCL/MSRC,
    /// LBA ranges) and read the first range.
    fn start_copy(&mut self, st: &mut QpState, idx: u32) {
        let c = &self.cmds[idx as usize];
        let (sqe, ns_idx) = (c.sqe, c.ns);
        let Some(ns) = self.ns[ns_idx as usize].as_ref() else {
            return self.fail(st, idx, Status::INVALID_NAMESPACE);
        };
        let (shift, nblocks) = (ns.shift, ns.nblocks);
        let limits = nvmf::copy::CopyLimits::for_buffer(self.cfg.max_io_size, shift);
        let parsed = nvmf::copy::source_ranges(&sqe, c.data(c.len), &limits, nblocks);
        let (ranges, total) = match parsed {
            Ok(x) => x,
            Err(s) => return self.fail(st, idx, s),
        };
        let bytes = (total as usize) << shift;
        // What the copy holds while it runs, from the pool: the gathered data and one
        // range's read at a time. It counts against the connection's and the address's
        // budgets as host data does (its descriptors alone were charged at intake); past
        // them the copy is answered Command Interrupted, and the host retries it.
        let largest = ranges.iter().map(|r| r.1 as usize).max().unwrap_or(0) << shift;
        let own = self.cmds[idx as usize].reserved as usize;
        if let Some(limit) = self.over_budget(st, bytes + largest, own) {
            self.counters.hit(limit);
            return self.fail(st, idx, Status::COMMAND_INTERRUPTED);
        }
        self.charge(st, idx, bytes + largest);
        let (Some(mut data), Some(mut first)) = (
            self.pool.get(bytes),
            self.pool.get((ranges[0].1 as usize) << shift),
        ) else {
            return self.fail(st, idx, Status::INTERNAL_ERROR);
        };
        data.set_len(bytes);
        first.set_len((ranges[0].1 as usize) << shift);
        let (lba, n) = ranges[0];
        let c = &mut self.cmds[idx as usize];
        let tag = c.tag(idx);
        c.pending = 1;
        c.copy = Some(Box::new(CopyPlan {
            ranges,
            next: 0,
            data: Some(data),
            filled: 0,
            dest: nvmf::copy::destination(&sqe),
            total: total as u32,
            writing: false,
        }));
        self.push_req(
            ns_idx,
            Request {
                tag,
                op: Op::Read,
                lba,
                nblocks: n,
                buf: Some(first),
            },
        );
    }

    /// Copy, the next steps: a source range was read (keep it, read the next one, or
    /// write everything to the destination). Returns the completion when the command is
    /// done with it (the destination write, an error, or not a Copy at all).
    fn copy_step(&mut self, idx: u32, ns_idx: u32, comp: Completion) -> Option<Completion> {
        let c = &mut self.cmds[idx as usize];
        let tag = comp.tag;
        let Some(plan) = c.copy.as_mut() else {
            return Some(comp);
        };
        if plan.writing || comp.status != IoStatus::Ok {
            return Some(comp);
        }
        if let (Some(b), Some(data)) = (comp.buf, plan.data.as_mut()) {
            let n = b.len().min(data.len() - plan.filled);
            data.as_mut_slice()[plan.filled..plan.filled + n].copy_from_slice(&b.as_slice()[..n]);
            plan.filled += n;
            self.pool.put(b);
        }
        let c = &mut self.cmds[idx as usize];
        let plan = c.copy.as_mut()?;
        plan.next += 1;
        let shift = self.ns[ns_idx as usize].as_ref().map_or(9, |n| n.shift);
        let req = if let Some(&(lba, n)) = plan.ranges.get(plan.next) {
            let Some(mut b) = self.pool.get((n as usize) << shift) else {
                c.status = Status::INTERNAL_ERROR;
                return Some(Completion {
                    tag,
                    status: IoStatus::Ok,
                    buf: None,
                });
            };
            b.set_len((n as usize) << shift);
            Request {
                tag,
                op: Op::Read,
                lba,
                nblocks: n,
                buf: Some(b),
            }
        } else {
            plan.writing = true;
            Request {
                tag,
                op: Op::Write { fua: false },
                lba: plan.dest,
                nblocks: plan.total,
                buf: plan.data.take(),
            }
        };
        c.pending = 1;
        self.push_req_as(ns_idx, req, true);
        None
    }

    /// A backend request of namespace slot `ns_idx` is done with (its `tag`).
    fn fence_ended(&mut self, ns_idx: u32, tag: u64) {
        if let Some(ns) = self.ns[ns_idx as usize].as_mut() {
            ns.fences.ended(tag);
            ns.publish_depth();
        }
    }

    fn complete_offload(&mut self, st: &mut QpState, idx: u32, status: Status) {
        let end = self.cmd_time();
        let c = &self.cmds[idx as usize];
        let (op, len, cid) = (c.op, c.len, c.sqe.cid());
        if let Some(ns) = self.ns.get(c.ns as usize).and_then(|n| n.as_ref()) {
            let k = &ns.counters;
            let lat = end.saturating_duration_since(c.start).as_nanos() as u64;
            match op {
                Some(OffloadOp::Read) => k.read_latency.record(lat),
                Some(OffloadOp::Write) => k.write_latency.record(lat),
                _ => k.other_latency.record(lat),
            }
            let q = &st.counters;
            if !status.is_success() {
                k.count_error(status);
                bump(&q.errors, 1);
            } else {
                match op {
                    Some(OffloadOp::Read | OffloadOp::Compare) => {
                        bump(&q.read_cmds, 1);
                        bump(&q.read_bytes, len as u64);
                    }
                    Some(OffloadOp::Write) => {
                        bump(&q.write_cmds, 1);
                        bump(&q.write_bytes, len as u64);
                    }
                    _ => bump(&q.other_cmds, 1),
                }
                match op {
                    Some(OffloadOp::Read) => {
                        bump(&k.read_cmds, 1);
                        bump(&k.read_bytes, len as u64);
                    }
                    Some(OffloadOp::Write) => {
                        bump(&k.write_cmds, 1);
                        bump(&k.write_bytes, len as u64);
                    }
                    // SMART counts Compare as a read: Host Read Commands and, for the
                    // logical blocks it compares, Data Units Read (NVMe Base 2.0 Fig. 207).
                    Some(OffloadOp::Compare) => {
                        bump(&k.read_cmds, 1);
                        bump(&k.read_bytes, len as u64);
                    }
                    _ => bump(&k.other_cmds, 1),
                }
            }
        }
        if !status.is_success() {
            self.report_failure(st, idx, status);
        }
        let data_len = if op == Some(OffloadOp::Read) && status.is_success() {
            len
        } else {
            0
        };
        self.respond(st, idx, Cqe::new(cid, status), data_len);
    }

    /// A backend completion for namespace slot `ns_idx`; `qps` is the QP table (a
    /// command whose QP is gone is only recycled).
    pub fn on_backend_completion(&mut self, qps: &mut [QpSlot], ns_idx: u32, comp: Completion) {
        if let Some(ns) = self.ns[ns_idx as usize].as_mut() {
            ns.progress = Some(self.batch_time.unwrap_or(self.now));
            if comp.status == IoStatus::Unavailable && !ns.gone {
                ns.set_gone();
                self.ns_gone_news = true;
            }
        }
        let (tag, idx) = (comp.tag, (comp.tag & 0xffff_ffff & !FENCE_BIT) as u32);
        let gen = (comp.tag >> 32) as u32;
        let Some(c) = self.cmds.get_mut(idx as usize) else {
            return self.fence_ended(ns_idx, tag);
        };
        if c.gen != gen || c.st != St::Backend {
            // The QP went away while this was in flight (disconnect); only recycle.
            if let Some(b) = comp.buf {
                self.pool.put(b);
            }
            return self.fence_ended(ns_idx, tag);
        }
        // A Copy's step that goes on keeps its count in the fences for the next step
        // (`push_req_as`): a fused pair's fence then waits for the Copy's write too.
        let comp = match self.copy_step(idx, ns_idx, comp) {
            Some(comp) => comp,
            None => return,
        };
        self.fence_ended(ns_idx, tag);
        let c = &mut self.cmds[idx as usize];
        if c.op == Some(OffloadOp::Compare) {
            // buf holds the host's data, the completion returns what the media has.
            if let Some(b) = comp.buf {
                if comp.status == IoStatus::Ok {
                    let n = c.len as usize;
                    let same = c
                        .buf
                        .as_ref()
                        .is_some_and(|h| h.as_slice()[..n] == b.as_slice()[..n]);
                    if !same {
                        c.status = Status::COMPARE_FAILURE;
                    }
                }
                self.pool.put(b);
            }
        } else if c.buf.is_none() {
            c.buf = comp.buf;
        } else if let Some(b) = comp.buf {
            self.pool.put(b);
        }
        if comp.status != IoStatus::Ok && c.status.is_success() {
            c.status = status_of(comp.status);
            // A block past the end, an operation the store lacks: the command's fault.
            c.backend_failed = !matches!(comp.status, IoStatus::OutOfRange | IoStatus::Unsupported);
        }

        c.pending = c.pending.saturating_sub(1);
        if c.pending > 0 {
            return;
        }
        let status = c.status;
        let qh = c.qp;
        match c.fused {
            Fused::First { .. } => return self.fused_compared(qps, idx, status),
            Fused::Second { .. } => return self.fused_written(qps, idx, status),
            Fused::None => {}
        }
        match qp_ref(qps, qh) {
            Some(q) if q.st.disconnect.is_none() => self.complete_offload(&mut q.st, idx, status),
            // Disconnecting: nothing more goes out, just free the slot.
            Some(q) => self.release(&mut q.st, idx),
            None => self.release_orphan(idx),
        }
    }
}

#[cfg(test)]
mod fence_tests {
    use super::*;

    /// A fence waits for the requests of the parity before it; one that comes while
    /// another drains waits for the requests started in between too; fences still
    /// waiting when the namespace goes are through.
    #[test]
    fn fences_wait_for_what_was_in_flight_before_them() {
        let mut f = NsFences::default();
        let old = f.started();
        let a = crate::Fence::new(1);
        f.add(a.clone());
        assert!(!a.is_done());
        let newer = f.started();
        assert_ne!(
            old, newer,
            "requests after the fence carry the other parity"
        );
        let b = crate::Fence::new(1);
        f.add(b.clone());
        f.ended(newer);
        assert!(!a.is_done() && !b.is_done(), "a waits for the old request");
        let third = f.started();
        f.ended(old);
        assert!(a.is_done(), "the old request is done");
        assert!(!b.is_done(), "b waits for what started after a (third)");
        f.ended(third);
        assert!(b.is_done());
        // Nothing in flight: through at once.
        let c = crate::Fence::new(1);
        f.add(c.clone());
        assert!(c.is_done());
        // The namespace leaves the thread with a fence waiting.
        let _ = f.started();
        let d = crate::Fence::new(1);
        f.add(d.clone());
        drop(f);
        assert!(d.is_done());
    }
}

#[cfg(test)]
mod fused_lock_tests {
    use super::*;

    /// Two IO threads' locks on one namespace: a range one holds is busy for the other
    /// (and for itself, as a local wait); claims go back with `give_back` and when the
    /// namespace leaves a thread.
    #[test]
    fn pairs_on_two_threads_exclude_each_other() {
        let shared = Arc::new(super::super::FusedRanges::default());
        let mut a = FusedLocks::new(shared.clone());
        let mut b = FusedLocks::new(shared.clone());
        assert_eq!(a.take((0, 8), 1), Take::Taken);
        assert_eq!(b.take((4, 8), 2), Take::BusyElsewhere);
        assert_eq!(a.take((4, 2), 3), Take::BusyHere);
        assert!(
            a.overlaps((7, 1)) && !b.overlaps((7, 1)),
            "plain writes wait locally only"
        );
        assert_eq!(b.take((100, 1), 4), Take::Taken);
        a.give_back((0, 8));
        assert_eq!(b.take((4, 8), 2), Take::Taken);
        assert_eq!(a.take((0, 8), 5), Take::BusyElsewhere);
        drop(b);
        assert_eq!(a.take((0, 8), 5), Take::Taken);
        assert_eq!(a.take((100, 1), 6), Take::Taken);
    }

    /// A command waiting on one thread keeps later pairs on another off its blocks until
    /// it goes on; pairs that both wait go in the order they started waiting. (Each
    /// `refind` is the engine trying all waiting commands again: a pair is never among
    /// the found ones when it tries.)
    #[test]
    fn a_waiting_command_goes_before_later_pairs() {
        let span = super::super::span_of;
        let shared = Arc::new(super::super::FusedRanges::default());
        let mut a = FusedLocks::new(shared.clone());
        let mut b = FusedLocks::new(shared.clone());
        let mut c = FusedLocks::new(shared.clone());
        assert_eq!(a.take((0, 8), 1), Take::Taken);
        // A write to blocks 4..6 on b waits for a's pair.
        b.wait(10, span((4, 2)), true);
        b.sync_waiting();
        a.give_back((0, 8));
        // A later pair on a, or on c, may not take an overlapping range before it...
        assert_eq!(a.take((0, 8), 2), Take::BusyElsewhere);
        assert_eq!(c.take((5, 1), 20), Take::BusyElsewhere);
        // ...but one that does not overlap may.
        assert_eq!(c.take((6, 4), 21), Take::Taken);
        c.give_back((6, 4));
        // Both pairs now wait, a's first; the write went on (b found it waiting no more).
        a.wait(2, span((0, 8)), true);
        a.sync_waiting();
        c.wait(20, span((5, 1)), true);
        c.sync_waiting();
        b.refind();
        b.sync_waiting();
        c.refind();
        assert_eq!(c.take((5, 1), 20), Take::BusyElsewhere, "a waited longer");
        c.wait(20, span((5, 1)), true);
        a.refind();
        assert_eq!(a.take((0, 8), 2), Take::Taken);
        a.sync_waiting();
        // A command that waits again keeps its ticket.
        c.sync_waiting();
        a.give_back((0, 8));
        c.refind();
        assert_eq!(c.take((5, 1), 20), Take::Taken);
        c.sync_waiting();
        // A command waiting for the whole namespace (a Copy whose descriptors it cannot
        // read); dropping its thread's locks withdraws it.
        c.give_back((5, 1));
        b.wait(11, (0, u64::MAX), true);
        b.sync_waiting();
        assert_eq!(a.take((1000, 1), 3), Take::BusyElsewhere);
        drop(b);
        assert_eq!(a.take((1000, 1), 3), Take::Taken);
    }

    /// On one thread: a command found waiting (for a pair here or elsewhere) keeps the
    /// pairs tried after it off its blocks, until the waiting commands are tried again.
    #[test]
    fn a_waiting_command_goes_before_later_pairs_on_its_thread() {
        let span = super::super::span_of;
        let shared = Arc::new(super::super::FusedRanges::default());
        let mut a = FusedLocks::new(shared.clone());
        assert_eq!(a.take((0, 1), 1), Take::Taken);
        assert_eq!(a.take((50, 1), 2), Take::Taken);
        // A DSM waits for both pairs, here; the first lets go, and its next pair on the
        // same block is tried after the DSM.
        a.wait(9, (0, u64::MAX), false);
        a.give_back((0, 1));
        a.refind();
        a.wait(9, (0, u64::MAX), false);
        assert_eq!(a.take((0, 1), 3), Take::BusyElsewhere);
        a.wait(3, span((0, 1)), true);
        // The second lets go: the DSM goes on (not found again), then the pair.
        a.give_back((50, 1));
        a.refind();
        assert_eq!(a.take((0, 1), 3), Take::Taken);
        // Found waiting for a pair here only, nothing is registered for other threads.
        a.wait(12, span((0, 1)), false);
        a.sync_waiting();
        let mut b = FusedLocks::new(shared.clone());
        assert_eq!(b.take((5, 1), 30), Take::Taken);
    }
}

#[cfg(test)]
mod status_tests {
    use super::*;

    /// What the host sees for each backend failure: only a vanished store is a path
    /// error; the rest fail the one command, with DNR where a retry cannot help (audit
    /// findings F1, F8, F4, F7 and F10).
    #[test]
    fn backend_failures_map_to_command_statuses() {
        let internal_dnr = Status::INTERNAL_ERROR.with_dnr(true);
        for (io, want) in [
            (IoStatus::ReadError, (0x2, 0x81, true)),
            (IoStatus::WriteFault, (0x2, 0x80, true)),
            (IoStatus::NoSpace, (0x0, 0x81, true)),
            (IoStatus::Refused, (0x0, 0x06, true)),
            (IoStatus::Busy, (0x0, 0x06, false)),
            (IoStatus::Failed, (0x0, 0x06, true)),
            (IoStatus::Aborted, (0x0, 0x07, false)),
            (IoStatus::Unavailable, (0x3, 0x00, false)),
            (
                IoStatus::Device {
                    sct: 0,
                    sc: 0x20,
                    dnr: true,
                },
                (0x0, 0x20, true),
            ),
            (
                IoStatus::Device {
                    sct: 1,
                    sc: 0x82,
                    dnr: false,
                },
                (0x1, 0x82, false),
            ),
        ] {
            let s = status_of(io);
            assert_eq!((s.sct, s.sc, s.dnr), want, "{io:?}");
        }
        assert_eq!(status_of(IoStatus::Refused), internal_dnr);
        assert_eq!(status_of(IoStatus::NoSpace), Status::CAPACITY_EXCEEDED);
    }
}
