//! `sta`: the offload-engine contract, modelled on NVIDIA DOCA STA, and its engines.
//!
//! The contract (see `shared/doca-sta-api.md` for the C API it mirrors):
//!
//! - A main context, [`Sta`], knows the subsystems and the namespaces (each backed by a
//!   [`backend::Backend`]) and creates one IO context per IO thread ([`Sta::io_create`],
//!   like `doca_sta_set_max_sta_io` + `doca_sta_io_create`). Slow control work runs as
//!   asynchronous tasks whose completion arrives through [`Sta::progress`]:
//!   [`Sta::ns_remove`] (stop new I/O to the namespace, let in-flight I/O finish, destroy
//!   every thread's backend queue for it, then report).
//! - An IO context ([`soft::StaIo`] for the CPU engine) owns its QPs, its backend queues and
//!   its buffer pool. The owning thread calls `progress()` in its loop and then drains
//!   `poll_event()` (DOCA calls callbacks from `doca_pe_progress`; Rust returns events so
//!   the application can submit tasks while handling them).
//! - QP life: `qp_accept_tcp` for a TCP connection (`qp_accept_tcp_tls` on a TLS listener:
//!   the engine runs the TLS 1.3 PSK handshake first and reports [`Event::Tls`]),
//!   `qp_accept_rdma` for an RDMA CM
//!   connect request (DOCA: `qp_alloc` + `qp_accept` with the `rdma_cm_id`), then
//!   `qp_rdma_cm_event` for the connection's CM events (ESTABLISHED is DOCA's
//!   `qp_connect_established`). Once the application has answered a Fabrics Connect for an I/O queue it
//!   binds the QP to its subsystem with `qp_add_subsystem` and `qp_connect_set_params`; from
//!   then on the engine serves READ, WRITE, FLUSH, WRITE ZEROES, DATASET MANAGEMENT and
//!   COMPARE to that subsystem's namespaces itself (the offloaded path) and never shows
//!   them to the application.
//! - Everything else on a QP reaches the application as [`Event::NonOffload`] with the
//!   SQE, a payload buffer and whether the host's data is already in it. The application
//!   answers with one of three tasks, as in DOCA: `rdma_read` (fetch the host's data into
//!   the payload), `rdma_write_send` (send payload data, then the completion), `rdma_send`
//!   (completion only). On TCP these are R2T/H2CData, C2HData + CapsuleResp, CapsuleResp.
//! - `qp_disconnect` drains the QP's in-flight I/O and closes it; [`Event::TransportError`]
//!   reports a QP the transport lost (peer closed, protocol error).
//!
//! - Namespace access views: what the offloaded path must refuse on a namespace
//!   (reservation conflicts, ANA path states, namespaces a host may not see) is decided
//!   by `nvmf::target` and pushed by the application as an immutable
//!   [`NamespaceAccess`] through the main context's [`AccessPublisher`] (cloneable, usable
//!   from any thread, so an IO thread that just ran a Reservation Acquire publishes before
//!   it completes the command). Each I/O QP is told its [`AccessKey`] (host and listener)
//!   with `qp_set_access`. The engine checks every offloaded command against the view
//!   without a lock: an IO context keeps its own copy and reloads it only when the
//!   namespace's epoch (one atomic load per command) moved. DOCA STA has no such hook on
//!   the DPA: an engine that cannot honour views says so in [`Caps::access_views`], and
//!   the daemon then must not offer reservations or non-optimized ANA states for the
//!   namespaces it offloads there (the decision for the `doca` engine, which does not
//!   exist yet: its namespaces are offloaded whole, so RESCAP and ONCS bit 5 would be
//!   cleared and ANA groups refused at configuration time).
//! - `cmd_abort` (Abort of an I/O queue's command) aborts a command that has not reached
//!   the backend: one still waiting for the host's data (it never runs: answered Abort
//!   Requested once its data is in, so the transport stays consistent) or queued behind a
//!   full backend queue.
//!
//! Engines: [`soft`] runs the contract on host cores over TCP and RDMA (any verbs device,
//! Soft-RoCE included; rdma-core is loaded at run time, see [`verbs`]). The `doca` engine
//! (DOCA STA on a BlueField-3 DPA) is later work; it implements the same calls.

pub mod soft;
pub mod verbs;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use nvmf::spec::{Cqe, Sqe, Status};
pub use nvmf::target::{AccessKey, NamespaceAccess};

/// One namespace's current access view and its epoch (bumped on every publish).
#[derive(Debug)]
pub(crate) struct AccessCell {
    pub epoch: AtomicU64,
    view: Mutex<Arc<NamespaceAccess>>,
}

impl AccessCell {
    pub(crate) fn new() -> AccessCell {
        AccessCell {
            epoch: AtomicU64::new(1),
            view: Mutex::new(Arc::new(NamespaceAccess::open())),
        }
    }
    /// The view now (a lock, taken only when the epoch moved).
    pub(crate) fn load(&self) -> Arc<NamespaceAccess> {
        self.view.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Access cells by (subsystem, nsid).
type AccessCells = std::collections::HashMap<(u32, u32), Arc<AccessCell>>;

/// Publishes namespace access views to every IO context (see the crate docs). Cheap to
/// clone; `publish` takes a short lock, never one the data path takes per command.
#[derive(Clone, Default)]
pub struct AccessPublisher {
    cells: Arc<Mutex<AccessCells>>,
}

impl AccessPublisher {
    /// The cell of a namespace, created (open) if it has none yet.
    pub(crate) fn cell(&self, subsys: SubsysId, nsid: u32) -> Arc<AccessCell> {
        self.cells
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((subsys.0, nsid))
            .or_insert_with(|| Arc::new(AccessCell::new()))
            .clone()
    }

    pub(crate) fn forget(&self, subsys: SubsysId, nsid: u32) {
        self.cells
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(subsys.0, nsid));
    }

    /// From now on, every command an IO context takes for this namespace is checked
    /// against `view`. May be called before the namespace is added (the engine starts
    /// with it then).
    pub fn publish(&self, subsys: SubsysId, nsid: u32, view: Arc<NamespaceAccess>) {
        let cell = self.cell(subsys, nsid);
        *cell.view.lock().unwrap_or_else(|e| e.into_inner()) = view;
        cell.epoch.fetch_add(1, Ordering::Release);
    }
}

/// A subsystem known to the engine (index into the main context's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SubsysId(pub u32);

/// A QP of one IO context. Only meaningful on the thread that owns that context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpHandle {
    pub(crate) idx: u32,
    pub(crate) gen: u32,
}

impl QpHandle {
    /// A stable number for logs and for the application's maps.
    pub fn as_u64(self) -> u64 {
        (self.gen as u64) << 32 | self.idx as u64
    }
}

/// Identifies a non-offloaded command inside the engine (DOCA's
/// `non_offload_user_data`): hand it back to the task that answers the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CmdToken {
    pub(crate) idx: u32,
    pub(crate) gen: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskKind {
    RdmaRead,
    RdmaWriteSend,
    RdmaSend,
    QpDisconnect,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    #[error("no such QP")]
    NoQp,
    #[error("no such command")]
    NoCommand,
    #[error("the QP is closing")]
    QpClosing,
    #[error("the command is in the wrong state for this task")]
    BadState,
    #[error("data digest mismatch on host data")]
    DataDigest,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportErrorKind {
    /// The host closed the connection.
    PeerClosed,
    /// A socket error.
    Io,
    /// The host broke the NVMe/TCP protocol; the engine sent a C2HTermReq.
    Protocol,
    /// The peer ran into one of the engine's bounds or deadlines ([`Limit`]) and loses
    /// its connection for it.
    Limit(Limit),
}

/// A bound or deadline the engine holds a peer to (DESIGN: every resource a peer can make
/// us hold has a bound, a deadline and a counter). Each hit is counted per IO thread
/// ([`ThreadCounters::limit_hits`], in [`Limit::ALL`] order); the ones that cost the peer
/// its connection are also reported as [`TransportErrorKind::Limit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// A TCP connection sent no ICReq within [`EngineLimits::icreq_timeout`].
    IcReqTimeout,
    /// A queue had no Fabrics Connect answered within [`EngineLimits::connect_timeout`]
    /// of being accepted.
    ConnectTimeout,
    /// Host data an R2T asked for did not come within
    /// [`EngineLimits::host_data_timeout`] (a C2HTermReq ends the connection).
    HostDataTimeout,
    /// The peer took none of its output (responses) for [`EngineLimits::drain_timeout`].
    DrainTimeout,
    /// A queue's output grew past its bound (the peer neither reads nor stops sending).
    SendQueue,
    /// A capsule arrived while all SQSIZE + 1 entries of its queue were outstanding (a
    /// C2HTermReq ends the connection).
    QueueDepth,
    /// A command waited because its connection already held
    /// [`EngineLimits::connection_buffer_bytes`] of data buffers (not fatal).
    ConnectionBuffers,
    /// The IO thread's buffer pool was exhausted: the command was answered Command
    /// Interrupted (the host retries it).
    BufferPool,
    /// The IO thread's command slots were exhausted: the command was answered Command
    /// Interrupted.
    CommandSlots,
}

impl Limit {
    pub const ALL: [Limit; 9] = [
        Limit::IcReqTimeout,
        Limit::ConnectTimeout,
        Limit::HostDataTimeout,
        Limit::DrainTimeout,
        Limit::SendQueue,
        Limit::QueueDepth,
        Limit::ConnectionBuffers,
        Limit::BufferPool,
        Limit::CommandSlots,
    ];

    /// Metric label (`nvmft_limit_hits_total{limit="..."}`) and log reason.
    pub fn label(self) -> &'static str {
        match self {
            Limit::IcReqTimeout => "icreq_timeout",
            Limit::ConnectTimeout => "connect_timeout",
            Limit::HostDataTimeout => "host_data_timeout",
            Limit::DrainTimeout => "drain_timeout",
            Limit::SendQueue => "send_queue",
            Limit::QueueDepth => "queue_depth",
            Limit::ConnectionBuffers => "connection_buffers",
            Limit::BufferPool => "buffer_pool",
            Limit::CommandSlots => "command_slots",
        }
    }

    /// What happened, in words, for log lines.
    pub fn describe(self) -> &'static str {
        match self {
            Limit::IcReqTimeout => "sent no ICReq in time",
            Limit::ConnectTimeout => "sent no Fabrics Connect in time",
            Limit::HostDataTimeout => "did not send the data an R2T asked for in time",
            Limit::DrainTimeout => "did not read its responses in time",
            Limit::SendQueue => "let too many responses pile up unread",
            Limit::QueueDepth => "submitted more commands than its queue has entries",
            Limit::ConnectionBuffers => "used its whole buffer budget (commands wait)",
            Limit::BufferPool => "found the IO thread's buffer pool exhausted",
            Limit::CommandSlots => "found the IO thread's command slots exhausted",
        }
    }

    fn index(self) -> usize {
        Limit::ALL.iter().position(|&l| l == self).unwrap_or(0)
    }
}

/// The engine's bounds and deadlines on peers (see [`Limit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineLimits {
    /// A TCP connection must send its ICReq within this. The Linux host sends it at
    /// once; nvmet and SPDK have no such deadline, so an idle socket costs them forever.
    pub icreq_timeout: std::time::Duration,
    /// A queue must have its Fabrics Connect answered within this of being accepted.
    pub connect_timeout: std::time::Duration,
    /// Host data solicited by an R2T must arrive within this (the Linux host's own I/O
    /// timeout is 30 s: by then it has given up on the command anyway).
    pub host_data_timeout: std::time::Duration,
    /// A connection whose output the peer does not take for this long is closed.
    pub drain_timeout: std::time::Duration,
    /// Data buffers one connection may hold for commands in flight; more commands wait
    /// (never fail) until some finish. At least the max I/O size. Host data is only
    /// given a buffer once it arrives, so commands whose data never comes hold none.
    pub connection_buffer_bytes: usize,
}

impl Default for EngineLimits {
    fn default() -> Self {
        use std::time::Duration;
        EngineLimits {
            icreq_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            host_data_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(30),
            connection_buffer_bytes: 16 << 20,
        }
    }
}

/// What an IO context reports from `progress()`.
#[derive(Clone, Copy, Debug)]
pub enum Event {
    /// A capsule the engine did not offload. `payload_len` is the size of the command's
    /// payload buffer (its data length from SGL1, bounded by the max I/O size); with
    /// `payload_valid` the host's data is already in it (in-capsule data).
    NonOffload {
        qp: QpHandle,
        qp_user: u64,
        token: CmdToken,
        sqe: Sqe,
        payload_len: u32,
        payload_valid: bool,
    },
    TaskDone {
        kind: TaskKind,
        qp: QpHandle,
        user: u64,
        result: Result<(), TaskError>,
    },
    TransportError {
        qp: QpHandle,
        qp_user: u64,
        kind: TransportErrorKind,
    },
    /// An NVMe/TCP connection is being terminated with a TermReq, reported before the
    /// QP's [`Event::TransportError`]: the engine sent a C2HTermReq because the host broke
    /// the protocol (`icreq`: the connection's ICReq itself was rejected), or the host
    /// sent an H2CTermReq (`by_host`). FES and FEI say why (NVMe/TCP 1.0 Figure 23).
    /// Only on errors: never on the I/O path.
    Terminated {
        qp: QpHandle,
        qp_user: u64,
        by_host: bool,
        icreq: bool,
        fes: u16,
        fei: u32,
        /// The engine ended the connection because the peer ran into this bound or
        /// deadline (a full queue, host data that never came), not over a bad PDU.
        limit: Option<Limit>,
    },
    /// A connection accepted with [`TlsAccept`] finished its TLS handshake (`ok`, before
    /// any of its capsules is reported), or failed it (then its [`Event::TransportError`]
    /// follows). `qp_tls` says who the PSK belongs to, or why it failed. A plain host on
    /// an optional-TLS listener reports nothing.
    Tls {
        qp: QpHandle,
        qp_user: u64,
        ok: bool,
    },
}

/// TLS for a TCP connection (TP 8011): the server context (PSKs, suites) and whether a
/// host that speaks plain NVMe/TCP is refused.
#[derive(Clone)]
pub struct TlsAccept {
    pub ctx: nvmf_tls::SslContext,
    pub required: bool,
    /// Longest a host may take to finish the handshake.
    pub handshake_timeout: std::time::Duration,
}

/// Who a TLS connection's PSK belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsPeerInfo {
    pub identity: String,
    pub hostnqn: String,
    pub subnqn: String,
    /// TLS 1.3 cipher suite name.
    pub cipher: String,
    /// A PSK generated by DH-HMAC-CHAP (secure channel concatenation).
    pub generated: bool,
}

/// What the main context reports from [`Sta::progress`].
#[derive(Clone, Copy, Debug)]
pub enum MainEvent {
    /// An `ns_remove` task finished: no IO context serves the namespace any more and its
    /// backend queues are gone.
    NsRemoved {
        subsys: SubsysId,
        nsid: u32,
        user: u64,
    },
    /// A `be_queue_destroy` task finished: every command that was outstanding on the
    /// namespace's backend queues has been answered with an error, and the queues are gone.
    BeQueueDestroyed {
        subsys: SubsysId,
        nsid: u32,
        user: u64,
    },
    /// Backend commands of a namespace have been outstanding longer than the backend
    /// timeout (DOCA: the backend-timeout event, delivered on the main context). Reported
    /// once per command; `commands` is how many newly crossed the limit on one IO thread.
    BackendTimeout {
        subsys: SubsysId,
        nsid: u32,
        commands: u32,
    },
    /// A namespace's backend answered that it is gone (its file was deleted, its device
    /// removed): commands got Internal Path Error. Reported once per IO thread.
    BackendGone { subsys: SubsysId, nsid: u32 },
}

/// Engine limits (DOCA: `doca_sta_get_max_*`).
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// Largest data transfer of one command in bytes (MDTS).
    pub max_io_size: u32,
    /// Deepest I/O queue (MQES + 1).
    pub max_queue_depth: u16,
    /// In-capsule data accepted on I/O queues, in bytes.
    pub max_incapsule_data: u32,
    /// Largest H2CData PDU the engine accepts (NVMe/TCP MAXH2CDATA).
    pub max_h2c_data: u32,
    /// The engine checks offloaded commands against published namespace access views.
    pub access_views: bool,
    /// The engine runs Copy (format 0) itself, through one buffer of `max_io_size`.
    pub copy: bool,
    /// The engine runs fused Compare and Write itself.
    pub fused_compare_write: bool,
}

/// Upper bounds (µs) of the latency histogram buckets; a last bucket catches the rest.
pub const LATENCY_BOUNDS_US: [u64; 14] = [
    5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 50_000, 100_000, 1_000_000,
];

/// A latency histogram written by one thread (plain loads and stores, no locked
/// instructions) and read by scrapers.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    pub buckets: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    pub sum_ns: AtomicU64,
}

impl LatencyHistogram {
    #[inline]
    pub(crate) fn record(&self, ns: u64) {
        let us = ns / 1000;
        let i = LATENCY_BOUNDS_US
            .iter()
            .position(|&b| us < b)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        NsCounters::bump(&self.buckets[i], 1);
        NsCounters::bump(&self.sum_ns, ns);
    }
}

/// Summed histogram: per-bucket counts (not cumulative) and the total in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyTotals {
    pub buckets: [u64; LATENCY_BOUNDS_US.len() + 1],
    pub sum_ns: u64,
}

impl LatencyTotals {
    fn add(&mut self, h: &LatencyHistogram) {
        for (t, b) in self.buckets.iter_mut().zip(h.buckets.iter()) {
            *t += b.load(Ordering::Relaxed);
        }
        self.sum_ns += h.sum_ns.load(Ordering::Relaxed);
    }
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// The error statuses counted one by one (everything else is counted as "other"): the
/// ones the engine and its backends produce. Label, status.
pub const ERROR_STATUSES: [(&str, Status); 20] = [
    ("lba_out_of_range", Status::LBA_OUT_OF_RANGE),
    ("invalid_field", Status::INVALID_FIELD),
    ("invalid_opcode", Status::INVALID_OPCODE),
    ("invalid_namespace", Status::INVALID_NAMESPACE),
    ("data_sgl_length_invalid", Status::DATA_SGL_LENGTH_INVALID),
    (
        "sgl_descriptor_type_invalid",
        Status::SGL_DESCRIPTOR_TYPE_INVALID,
    ),
    ("sgl_offset_invalid", Status::SGL_OFFSET_INVALID),
    ("internal_error", Status::INTERNAL_ERROR),
    (
        "transient_transport_error",
        Status::TRANSIENT_TRANSPORT_ERROR,
    ),
    ("aborted_sq_deletion", Status::ABORTED_SQ_DELETION),
    ("namespace_not_ready", Status::NAMESPACE_NOT_READY),
    ("write_fault", Status::WRITE_FAULT),
    ("unrecovered_read_error", Status::UNRECOVERED_READ_ERROR),
    ("compare_failure", Status::COMPARE_FAILURE),
    ("reservation_conflict", Status::RESERVATION_CONFLICT),
    ("ana_inaccessible", Status::ANA_INACCESSIBLE),
    ("ana_persistent_loss", Status::ANA_PERSISTENT_LOSS),
    ("ana_transition", Status::ANA_TRANSITION),
    ("internal_path_error", Status::INTERNAL_PATH_ERROR),
    ("command_interrupted", Status::COMMAND_INTERRUPTED),
];

/// Index into [`ERROR_STATUSES`] (by SCT and SC; DNR does not matter), or its length for
/// "other".
pub fn error_status_index(s: Status) -> usize {
    ERROR_STATUSES
        .iter()
        .position(|(_, e)| e.sct == s.sct && e.sc == s.sc)
        .unwrap_or(ERROR_STATUSES.len())
}

/// Per-(thread, namespace) I/O counters. One IO thread writes them; readers sum all
/// threads at scrape time, so the data path never shares a cache line it writes.
#[derive(Debug, Default)]
pub struct NsCounters {
    pub read_cmds: AtomicU64,
    pub write_cmds: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub other_cmds: AtomicU64,
    pub errors: AtomicU64,
    /// Errors by status: [`ERROR_STATUSES`] order, then "other".
    pub errors_by_status: [AtomicU64; ERROR_STATUSES.len() + 1],
    /// Requests this thread has in the namespace's backend queue right now (a gauge).
    pub queue_depth: AtomicU64,
    /// Capsule arrival to completion queued, per operation.
    pub read_latency: LatencyHistogram,
    pub write_latency: LatencyHistogram,
    pub other_latency: LatencyHistogram,
}

impl NsCounters {
    #[inline]
    pub(crate) fn count_error(&self, s: Status) {
        Self::bump(&self.errors, 1);
        Self::bump(&self.errors_by_status[error_status_index(s)], 1);
    }

    /// Single-writer increment: a plain load and store, no locked instruction.
    #[inline]
    pub(crate) fn bump(c: &AtomicU64, by: u64) {
        c.store(
            c.load(Ordering::Relaxed).wrapping_add(by),
            Ordering::Relaxed,
        );
    }
}

/// A sum of [`NsCounters`] over threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NsTotals {
    pub read_cmds: u64,
    pub write_cmds: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub other_cmds: u64,
    pub errors: u64,
    /// [`ERROR_STATUSES`] order, then "other".
    pub errors_by_status: [u64; ERROR_STATUSES.len() + 1],
    /// Requests in the namespace's backend queues now, all threads.
    pub queue_depth: u64,
    pub read_latency: LatencyTotals,
    pub write_latency: LatencyTotals,
    pub other_latency: LatencyTotals,
}

impl NsTotals {
    /// Commands that failed with a media or data integrity error (SCT 2), Compare Failure
    /// and Access Denied excepted (the data differs or access is refused: the media is
    /// fine): what SMART reports as Media and Data Integrity Errors.
    pub fn media_errors(&self) -> u64 {
        ERROR_STATUSES
            .iter()
            .zip(self.errors_by_status)
            .filter(|((_, s), _)| {
                s.sct == nvmf::spec::status::sct::MEDIA
                    && (s.sc, s.sct) != (Status::COMPARE_FAILURE.sc, Status::COMPARE_FAILURE.sct)
                    && (s.sc, s.sct) != (Status::ACCESS_DENIED.sc, Status::ACCESS_DENIED.sct)
            })
            .map(|(_, n)| n)
            .sum()
    }
}

/// Per-IO-thread engine counters (for metrics).
#[derive(Debug, Default)]
pub struct ThreadCounters {
    pub offloaded: AtomicU64,
    pub non_offloaded: AtomicU64,
    pub busy_polls: AtomicU64,
    pub idle_polls: AtomicU64,
    pub qps: AtomicU64,
    /// Hits of each [`Limit`], in [`Limit::ALL`] order.
    pub limit_hits: [AtomicU64; Limit::ALL.len()],
}

impl ThreadCounters {
    #[inline]
    pub(crate) fn hit(&self, l: Limit) {
        NsCounters::bump(&self.limit_hits[l.index()], 1);
    }
}

#[derive(Default)]
pub(crate) struct StatsRegistry {
    ns: Mutex<Vec<(SubsysId, u32, Arc<NsCounters>)>>,
    threads: Mutex<Vec<Arc<ThreadCounters>>>,
}

impl StatsRegistry {
    pub(crate) fn register_ns(&self, subsys: SubsysId, nsid: u32) -> Arc<NsCounters> {
        let c = Arc::new(NsCounters::default());
        self.ns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((subsys, nsid, c.clone()));
        c
    }
    pub(crate) fn register_thread(&self) -> Arc<ThreadCounters> {
        let c = Arc::new(ThreadCounters::default());
        self.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(c.clone());
        c
    }
}

/// A read-only view of the engine's counters, cheap to clone into other threads.
#[derive(Clone)]
pub struct Stats(Arc<StatsRegistry>);

impl Stats {
    /// Sum of one namespace's counters over all IO threads (counters of a namespace
    /// that was removed and re-added keep counting from where they were).
    pub fn namespace(&self, subsys: SubsysId, nsid: u32) -> NsTotals {
        let list = self.0.ns.lock().unwrap_or_else(|e| e.into_inner());
        let mut t = NsTotals::default();
        for (s, n, c) in list.iter() {
            if *s == subsys && *n == nsid {
                let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
                t.read_cmds += l(&c.read_cmds);
                t.write_cmds += l(&c.write_cmds);
                t.read_bytes += l(&c.read_bytes);
                t.write_bytes += l(&c.write_bytes);
                t.other_cmds += l(&c.other_cmds);
                t.errors += l(&c.errors);
                for (t, c) in t.errors_by_status.iter_mut().zip(c.errors_by_status.iter()) {
                    *t += l(c);
                }
                t.queue_depth += l(&c.queue_depth);
                t.read_latency.add(&c.read_latency);
                t.write_latency.add(&c.write_latency);
                t.other_latency.add(&c.other_latency);
            }
        }
        t
    }
    /// Every (subsystem, nsid) that has counters, once each.
    pub fn namespaces(&self) -> Vec<(SubsysId, u32)> {
        let list = self.0.ns.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<(SubsysId, u32)> = list.iter().map(|(s, n, _)| (*s, *n)).collect();
        v.sort_by_key(|(s, n)| (s.0, *n));
        v.dedup();
        v
    }

    /// Hits of every [`Limit`], summed over IO threads: (label, count).
    pub fn limit_hits(&self) -> Vec<(&'static str, u64)> {
        let threads = self.threads();
        Limit::ALL
            .iter()
            .map(|l| {
                let n = threads
                    .iter()
                    .map(|t| t.limit_hits[l.index()].load(Ordering::Relaxed))
                    .sum();
                (l.label(), n)
            })
            .collect()
    }

    /// Per-thread engine counters, in thread creation order.
    pub fn threads(&self) -> Vec<Arc<ThreadCounters>> {
        self.0
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

pub use soft::{SoftConfig, Sta, StaIoSeed};
