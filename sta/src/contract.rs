//! The engine contract: what the daemon may ask of an offload engine and what it hears
//! back, as a family of traits with DOCA STA's shape (`shared/doca-sta-api.md` sections 4
//! and 5 list the C calls; the DOCA name of each call is given on its method).
//!
//! - [`Engine`] is the main context (`struct doca_sta`): subsystems, namespaces with their
//!   backends, IO-context creation, the asynchronous control tasks (`ns_remove`,
//!   `be_queue_destroy`) and main events ([`MainEvent`]), limits ([`Caps`]) and
//!   statistics ([`Stats`]). It lives on the main thread.
//! - [`IoSeed`] is an IO context created but not started (`doca_sta_io_create`); it is
//!   `Send` so it can move to its thread, where [`IoSeed::start`] builds the
//!   [`IoContext`] (`struct doca_sta_io` connected to that thread's progress engine).
//! - [`IoContext`] is one IO thread's context: progress and events ([`Event`]), QP
//!   accept (a TCP connection, an RDMA CM connect request), CM events, the Connect-time
//!   calls (`qp_add_subsystem`, `qp_connect_set_params`), the three non-offload tasks
//!   (`rdma_read`, `rdma_write_send`, `rdma_send`), `qp_disconnect`, and access to a
//!   non-offloaded command's payload. Everything about one QP happens on the thread whose
//!   context accepted it.
//!
//! Rules every engine keeps (the contract suite, `sta/tests/contract/`, checks them):
//!
//! 1. Tasks complete asynchronously. A task call only validates and queues; its result
//!    arrives later as exactly one [`Event::TaskDone`] from [`IoContext::poll_event`] (or
//!    [`MainEvent`] from [`Engine::progress`]), never from inside the call. A call that
//!    returns an error started nothing and reports nothing later.
//! 2. A non-offloaded command is the application's from its [`Event::NonOffload`] until it
//!    submits `rdma_send` or `rdma_write_send` for it (or its QP is disconnected). Its
//!    payload buffer is engine memory; the application reaches it only through
//!    [`IoContext::payload`], a borrow of the context that ends before the next call on
//!    the context. That is what a C engine can give: DOCA's non-offload callback hands a
//!    `payload` pointer that stays valid and untouched by the engine until the answering
//!    task is submitted; the engine never lends it while a task (an `rdma_read`) is
//!    moving data into it, and the application never keeps it.
//! 3. Events are returned, not called back: DOCA calls callbacks from `doca_pe_progress`,
//!    a Rust engine queues them during [`IoContext::progress`] and the application
//!    drains them, so it can submit tasks while handling them.
//! 4. Handles are plain values ([`QpHandle`], [`CmdToken`], [`SubsysId`]) that an engine
//!    maps to its own objects; a stale handle is an error, never undefined behaviour.
//! 5. A payload whose data is not valid yet is handed up zeroed (buffers are reused: no
//!    byte of another command may reach the application or a host). Its length is what
//!    the application will read of the host's data (`nvmf::target::slow_path_host_data`:
//!    before Connect only the Connect's data, after it only commands the target reads
//!    data for), so nothing a peer sends makes the engine solicit (R2T) or buffer data
//!    nobody reads (issue 11); a command refused without its data is answered at once.
//!
//! Beyond DOCA's calls (the soft engine has them; an engine that lacks one says so in
//! [`Caps`] or refuses the call): TLS on TCP QPs (`qp_accept_tcp_tls`, [`Event::Tls`],
//! `qp_tls`), namespace access views ([`Engine::access_publisher`], `qp_set_access`, see
//! [`crate::access`]) and `cmd_abort` (the Abort admin command for a command that has not
//! reached the backend: one still waiting for the host's data never runs and is answered
//! Abort Requested once its data is in, so the transport stays consistent; one queued
//! behind a full backend queue is taken off it).
//!
//! Transports: an engine says in [`Caps`] which it serves. A call for a transport it does
//! not serve fails with [`AcceptError::Unsupported`] (an RDMA connect request is
//! rejected, not leaked).

use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backend::Backend;
use nvmf::rdma::RejectStatus;
use nvmf::spec::{Cqe, Sqe};

use crate::access::{AccessKey, AccessPublisher};
use crate::stats::Stats;
use crate::verbs::{ConnRequest, RdmaCmEvent};

/// A subsystem known to the engine (DOCA: `struct doca_sta_subs_handle *`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SubsysId(pub u32);

/// A QP of one IO context (DOCA: `struct doca_sta_qp_handle *`). Only meaningful on the
/// thread that owns that context.
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

/// The tasks an IO context completes with [`Event::TaskDone`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskKind {
    RdmaRead,
    RdmaWriteSend,
    RdmaSend,
    QpDisconnect,
}

/// Why an IO-context call or task failed.
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
    #[error("the transport failed while the task ran")]
    Transport,
}

/// Why an engine lost a QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportErrorKind {
    /// The host closed the connection.
    PeerClosed,
    /// A socket or verbs error.
    Io,
    /// The host broke the transport protocol; the engine terminated the connection.
    Protocol,
    /// The peer ran into one of the engine's bounds or deadlines ([`Limit`]) and loses
    /// its connection for it.
    Limit(Limit),
}

/// A bound or deadline the engine holds a peer to (DESIGN: every resource a peer can make
/// us hold has a bound, a deadline and a counter). Each hit is counted per IO context
/// ([`crate::ThreadTotals::limit_hits`], in [`Limit::ALL`] order); the ones that cost the
/// peer its connection are also reported as [`TransportErrorKind::Limit`].
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
    /// A PDU the peer began was not complete within [`EngineLimits::host_data_timeout`]
    /// of its first bytes (NVMe/TCP: a capsule or H2CData sent in part, then nothing).
    PartialPdu,
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
    /// A command waited because the connections from its peer's address already held
    /// that address's share of the IO context's buffer pool (not fatal): one host cannot
    /// take the whole pool and leave the others Command Interrupted.
    PeerBuffers,
    /// The IO context's buffer pool was exhausted: the command was answered Command
    /// Interrupted (the host retries it).
    BufferPool,
    /// The IO context's command slots were exhausted: the command was answered Command
    /// Interrupted.
    CommandSlots,
    /// The connections from the command's peer address already held that address's share
    /// of the IO context's command slots: the command was answered Command Interrupted
    /// (the host retries it), so that one address cannot take every slot and leave the
    /// other hosts' commands Command Interrupted.
    PeerCommandSlots,
}

impl Limit {
    pub const ALL: [Limit; 12] = [
        Limit::IcReqTimeout,
        Limit::ConnectTimeout,
        Limit::HostDataTimeout,
        Limit::DrainTimeout,
        Limit::SendQueue,
        Limit::QueueDepth,
        Limit::ConnectionBuffers,
        Limit::BufferPool,
        Limit::CommandSlots,
        Limit::PeerBuffers,
        Limit::PartialPdu,
        Limit::PeerCommandSlots,
    ];

    /// Metric label (`nvmft_limit_hits_total{limit="..."}`) and log reason.
    pub fn label(self) -> &'static str {
        match self {
            Limit::IcReqTimeout => "icreq_timeout",
            Limit::ConnectTimeout => "connect_timeout",
            Limit::HostDataTimeout => "host_data_timeout",
            Limit::PartialPdu => "partial_pdu_timeout",
            Limit::DrainTimeout => "drain_timeout",
            Limit::SendQueue => "send_queue",
            Limit::QueueDepth => "queue_depth",
            Limit::ConnectionBuffers => "connection_buffers",
            Limit::BufferPool => "buffer_pool",
            Limit::CommandSlots => "command_slots",
            Limit::PeerBuffers => "peer_buffers",
            Limit::PeerCommandSlots => "peer_command_slots",
        }
    }

    /// What happened, in words, for log lines.
    pub fn describe(self) -> &'static str {
        match self {
            Limit::IcReqTimeout => "sent no ICReq in time",
            Limit::ConnectTimeout => "sent no Fabrics Connect in time",
            Limit::HostDataTimeout => "did not send the data an R2T asked for in time",
            Limit::PartialPdu => "began a PDU and did not finish it in time",
            Limit::DrainTimeout => "did not read its responses in time",
            Limit::SendQueue => "let too many responses pile up unread",
            Limit::QueueDepth => "submitted more commands than its queue has entries",
            Limit::ConnectionBuffers => "used its whole buffer budget (commands wait)",
            Limit::BufferPool => "found the IO thread's buffer pool exhausted",
            Limit::CommandSlots => "found the IO thread's command slots exhausted",
            Limit::PeerBuffers => "used its address's share of the buffer pool (commands wait)",
            Limit::PeerCommandSlots => {
                "used its address's share of the IO thread's command slots (commands refused)"
            }
        }
    }

    /// Position in [`Limit::ALL`].
    pub fn index(self) -> usize {
        Limit::ALL.iter().position(|&l| l == self).unwrap_or(0)
    }
}

/// The engine's bounds and deadlines on peers (see [`Limit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineLimits {
    /// A TCP connection must send its ICReq within this. The Linux host sends it at
    /// once; nvmet and SPDK have no such deadline, so an idle socket costs them forever.
    pub icreq_timeout: Duration,
    /// A queue must have its Fabrics Connect answered within this of being accepted.
    pub connect_timeout: Duration,
    /// Host data solicited by an R2T must arrive within this (the Linux host's own I/O
    /// timeout is 30 s: by then it has given up on the command anyway), and so must the
    /// rest of any PDU once its first bytes are in ([`Limit::PartialPdu`]).
    pub host_data_timeout: Duration,
    /// A connection whose output the peer does not take for this long is closed.
    pub drain_timeout: Duration,
    /// Data buffers one connection may hold for commands in flight; more commands wait
    /// (never fail) until some finish. At least the max I/O size. Host data is only
    /// given a buffer once it arrives, so commands whose data never comes hold none.
    pub connection_buffer_bytes: usize,
}

impl Default for EngineLimits {
    fn default() -> Self {
        EngineLimits {
            icreq_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            host_data_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(30),
            connection_buffer_bytes: 16 << 20,
        }
    }
}

/// What an IO context reports from [`IoContext::poll_event`].
#[derive(Clone, Copy, Debug)]
pub enum Event {
    /// A capsule the engine did not offload (DOCA: the non-offload callback).
    /// `payload_len` is the size of the command's payload buffer (its data length from
    /// SGL1, bounded by the max I/O size); with `payload_valid` the host's data is
    /// already in it (in-capsule data).
    NonOffload {
        qp: QpHandle,
        qp_user: u64,
        token: CmdToken,
        sqe: Sqe,
        payload_len: u32,
        payload_valid: bool,
    },
    /// A task finished (DOCA: its completion or error callback).
    TaskDone {
        kind: TaskKind,
        qp: QpHandle,
        user: u64,
        result: Result<(), TaskError>,
    },
    /// The transport lost the QP (DOCA: the transport-error event); the application
    /// answers with `qp_disconnect`.
    TransportError {
        qp: QpHandle,
        qp_user: u64,
        kind: TransportErrorKind,
    },
    /// An NVMe/TCP connection is being terminated with a TermReq, reported before the
    /// QP's [`Event::TransportError`]: the engine sent a C2HTermReq because the host broke
    /// the protocol (`icreq`: the connection's ICReq itself was rejected), or the host
    /// sent an H2CTermReq (`by_host`). FES and FEI say why (NVMe/TCP 1.0 Figure 23).
    /// Only on errors, only on TCP.
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
    /// The engine answered a command with an error itself on a queue that has no
    /// controller yet (before its Fabrics Connect was answered): a malformed Connect (its
    /// SGL and its data disagree), a command no slot could be had for. Reported so that
    /// the application logs the refusal with who it came from; the command is answered
    /// already.
    RefusedBeforeConnect {
        qp: QpHandle,
        qp_user: u64,
        sqe: Sqe,
        status: nvmf::spec::Status,
    },
    /// A connection accepted with [`IoContext::qp_accept_tcp_tls`] finished its TLS
    /// handshake (`ok`, before any of its capsules is reported), or failed it (then its
    /// [`Event::TransportError`] follows). [`IoContext::qp_tls`] says who the PSK belongs
    /// to, or why it failed. A plain host on an optional-TLS listener reports nothing.
    Tls {
        qp: QpHandle,
        qp_user: u64,
        ok: bool,
    },
    /// The engine answered a command of a connected queue with an error by itself (DOCA:
    /// the CQE-notify event: a capsule that failed validation, or an error from the
    /// backend). Reported so that the application puts it in its controller's Error
    /// Information log and logs storage errors; the host has its answer already.
    CommandFailed {
        qp: QpHandle,
        qp_user: u64,
        failure: CommandFailure,
    },
}

/// One command the engine failed by itself ([`Event::CommandFailed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandFailure {
    pub opcode: u8,
    /// What the controller's Error Information log keeps of it.
    pub error: nvmf::target::CommandError,
    /// The status came from the backend (the storage said no), not from the engine's own
    /// checks of the command.
    pub from_backend: bool,
}

impl CommandFailure {
    /// The failure of `sqe` on queue `qid` (an admin queue's commands address no blocks).
    pub fn of(
        sqe: &nvmf::spec::Sqe,
        qid: u16,
        status: nvmf::spec::Status,
        from_backend: bool,
    ) -> Self {
        CommandFailure {
            opcode: sqe.opcode(),
            error: nvmf::target::CommandError::of(sqe, qid, status),
            from_backend,
        }
    }
}

/// TLS for a TCP connection (TP 8011): the server context (PSKs, suites) and whether a
/// host that speaks plain NVMe/TCP is refused.
#[derive(Clone)]
pub struct TlsAccept {
    pub ctx: nvmf_tls::SslContext,
    pub required: bool,
    /// Longest a host may take to finish the handshake.
    pub handshake_timeout: Duration,
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

/// What the main context reports from [`Engine::progress`].
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
    /// Backend commands of a namespace have been outstanding longer than `limit` (DOCA:
    /// the backend-timeout event, delivered on the main context). Reported once per
    /// command; `commands` is how many newly crossed the limit on one IO context. The
    /// soft engine reports a command only when the namespace's backend also completed
    /// nothing on that context for `limit` (a slow backend working off a long queue is not
    /// hung), or once it is outstanding ten times `limit`.
    BackendTimeout {
        subsys: SubsysId,
        nsid: u32,
        commands: u32,
        limit: Duration,
    },
    /// A namespace's backend answered that it is gone (its file was deleted, its device
    /// removed): commands got Internal Path Error. Reported once per IO context.
    BackendGone { subsys: SubsysId, nsid: u32 },
}

/// Engine limits (DOCA: `doca_sta_get_max_*`) and what it serves.
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// Largest data transfer of one command in bytes (MDTS); also the largest payload.
    pub max_io_size: u32,
    /// Deepest I/O queue (MQES + 1).
    pub max_queue_depth: u16,
    /// In-capsule data accepted on I/O queues, in bytes.
    pub max_incapsule_data: u32,
    /// Largest H2CData PDU the engine accepts (NVMe/TCP MAXH2CDATA).
    pub max_h2c_data: u32,
    /// Whether [`IoContext::qp_accept_tcp`] and [`IoContext::qp_accept_rdma`] can succeed.
    pub tcp: bool,
    pub rdma: bool,
    /// The engine checks offloaded commands against published namespace access views
    /// (see [`crate::access`]).
    pub access_views: bool,
    /// The engine runs Copy (format 0) itself, through one buffer of `max_io_size`.
    pub copy: bool,
    /// The engine runs fused Compare and Write itself.
    pub fused_compare_write: bool,
    /// The engine follows a namespace's new size ([`Engine::ns_resize`]).
    pub resize: bool,
}

/// Why a main-context call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("no such subsystem")]
    NoSubsystem,
    #[error("the subsystem still has namespaces")]
    SubsystemInUse,
    #[error("namespace {0} already exists in this subsystem")]
    NsExists(u32),
    #[error("no namespace {0} in this subsystem")]
    NoNamespace(u32),
    #[error("block size {0} is not supported")]
    BlockSize(u32),
    /// The engine cannot do this here (a backend type it cannot drive, a missing library).
    #[error("{0}")]
    Unsupported(String),
    /// A call into the engine's library failed: which call, and the library's own
    /// description of the error (DOCA: `doca_error_get_name` and `_get_descr`).
    #[error("{call} failed: {message}")]
    Library { call: &'static str, message: String },
    /// The engine's library keeps one subsystem per NQN (DOCA STA does) and the previous
    /// subsystem with this NQN is not destroyed yet.
    #[error(
        "subsystem {0} still exists in the engine (it is being removed); try again once it is gone"
    )]
    NqnInUse(String),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Why a QP could not be accepted. An RDMA connect request has been rejected (with
/// `status`) and its CM id freed by the time this is returned.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("this engine does not serve NVMe/{0} connections")]
    Unsupported(&'static str),
    #[error("{error} (connect request rejected: {status:?})")]
    Rejected {
        status: RejectStatus,
        #[source]
        error: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The main context (DOCA: `struct doca_sta` and its main progress engine).
pub trait Engine {
    /// The IO context this engine's seeds start.
    type Io: IoContext;
    type Seed: IoSeed<Io = Self::Io>;

    /// A short name for logs (`soft`, `doca`).
    fn name(&self) -> &'static str;
    /// DOCA: `doca_sta_get_max_*`.
    fn caps(&self) -> Caps;
    /// Counters readable from any thread.
    fn stats(&self) -> Stats;
    /// DOCA: `doca_sta_subsystem_create` (+ `subsystem_add_dev` for every device). Each
    /// call makes a new subsystem, even for an NQN seen before (the application keeps
    /// the NQN -> id map), except that an engine whose library keeps NQNs unique (DOCA)
    /// answers [`EngineError::NqnInUse`] while an earlier subsystem with that NQN is not
    /// destroyed yet.
    fn subsystem_create(&mut self, nqn: &str) -> Result<SubsysId, EngineError>;
    /// DOCA: `doca_sta_subsystem_destroy`: only without namespaces, so after the
    /// [`MainEvent::NsRemoved`] of each (else [`EngineError::SubsystemInUse`]). I/O queues
    /// bound to it may still be disconnecting; an engine that must wait for them (DOCA
    /// does) defers the destruction itself.
    fn subsystem_destroy(&mut self, id: SubsysId) -> Result<(), EngineError>;
    /// DOCA: `doca_sta_subsystem_add_ns`. Synchronous: every IO context serves the
    /// namespace before any host can learn of it from the control path. An engine that
    /// cannot drive `backend` (DOCA needs NVMe queues it can register with
    /// `doca_sta_be_add_queue`) says so with [`EngineError::Unsupported`].
    fn ns_add(
        &mut self,
        subsys: SubsysId,
        nsid: u32,
        backend: Arc<dyn Backend>,
    ) -> Result<(), EngineError>;
    /// The namespace's backend grew ([`Backend::grow`]) to `num_blocks`: commands up to
    /// the new end are served from now on. Like [`Engine::ns_add`] it does not wait:
    /// every IO context takes the new size at the start of its next pass, before it reads
    /// its sockets, so before a host can use it (the application tells hosts after this
    /// returns, and a host needs an event and two admin commands to learn of it). Never
    /// shrinks: a smaller count is ignored. DOCA STA has no such call (`doca_sta_subsystem_add_ns` takes no size: the
    /// drive's own namespace bounds its I/O), so an engine that cannot follow a resize
    /// says so with [`EngineError::Unsupported`].
    fn ns_resize(
        &mut self,
        subsys: SubsysId,
        nsid: u32,
        num_blocks: u64,
    ) -> Result<(), EngineError>;
    /// DOCA: `doca_sta_subsystem_task_rm_ns_alloc_init` + submit. New I/O to the
    /// namespace stops being offloaded at once; [`MainEvent::NsRemoved`] reports when its
    /// in-flight I/O is done and its backend queues are gone.
    fn ns_remove(&mut self, subsys: SubsysId, nsid: u32, user: u64) -> Result<(), EngineError>;
    /// DOCA: `doca_sta_be_destroy_queue_task_alloc_init` + submit for the namespace's
    /// backend queues: what is outstanding on them is answered at once with Aborted - SQ
    /// Deletion, then they are freed; [`MainEvent::BeQueueDestroyed`] reports the end.
    /// For a backend that vanished or hangs.
    fn be_queue_destroy(
        &mut self,
        subsys: SubsysId,
        nsid: u32,
        user: u64,
    ) -> Result<(), EngineError>;
    /// DOCA: `doca_sta_io_create`. The seed knows every namespace added so far.
    fn io_create(&mut self) -> Result<Self::Seed, EngineError>;
    /// DOCA: `doca_pe_progress` on the main progress engine. Returns one event, if any.
    fn progress(&mut self) -> Option<MainEvent>;
    /// Main-context tasks not finished yet.
    fn pending_tasks(&self) -> usize;
    /// Where namespace access views go to every IO context (see [`crate::access`]); hand
    /// a clone to every thread that runs commands which change them. Not a DOCA call.
    fn access_publisher(&self) -> AccessPublisher;
}

/// An IO context created on the main thread, not started yet.
pub trait IoSeed: Send + 'static {
    type Io: IoContext;
    /// Start the context on the thread that will own it (DOCA: connect it to that
    /// thread's progress engine, `doca_ctx_start`). Its buffers and backend queues
    /// belong to that thread from then on.
    fn start(self) -> Result<Self::Io, EngineError>;
}

/// See [`IoContext::ns_fence`]: done when every IO context has arrived.
#[derive(Clone)]
pub struct Fence(Arc<FenceInner>);

struct FenceInner {
    left: AtomicUsize,
    /// Called by the context that arrives last.
    on_done: Option<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Fence").field(&self.0.left).finish()
    }
}

impl Fence {
    /// A fence that waits for `contexts` IO contexts.
    pub fn new(contexts: usize) -> Fence {
        Fence(Arc::new(FenceInner {
            left: AtomicUsize::new(contexts),
            on_done: None,
        }))
    }
    /// A fence that waits for `contexts` IO contexts and calls `on_done` once all have
    /// arrived (on the thread of the last one; not at all for `contexts` 0).
    pub fn with_on_done(contexts: usize, on_done: impl Fn() + Send + Sync + 'static) -> Fence {
        Fence(Arc::new(FenceInner {
            left: AtomicUsize::new(contexts),
            on_done: Some(Box::new(on_done)),
        }))
    }
    /// A fence with nothing to wait for.
    pub fn done() -> Fence {
        Fence::new(0)
    }
    pub fn is_done(&self) -> bool {
        self.0.left.load(Ordering::Acquire) == 0
    }
    /// One IO context is through.
    pub fn arrive(&self) {
        // Never below zero, whoever arrives late.
        let before = self
            .0
            .left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if before == Ok(1) {
            if let Some(f) = &self.0.on_done {
                f();
            }
        }
    }
}

/// One IO thread's engine context (DOCA: `struct doca_sta_io`).
pub trait IoContext {
    /// One pass (DOCA: `doca_pe_progress` on the IO progress engine), waiting up to
    /// `max_wait` for input when there is nothing else to do. Returns whether anything
    /// happened.
    fn progress(&mut self, max_wait: Duration) -> bool;
    /// The next event, if any (call after `progress`, until `None`).
    fn poll_event(&mut self) -> Option<Event>;
    /// Whether the engine has work that needs another pass soon.
    fn busy(&self) -> bool;
    /// Live QPs (the daemon balances threads by it).
    fn qp_count(&self) -> usize;
    /// Commands received and not yet answered and sent, all QPs.
    fn commands_in_flight(&self) -> usize;

    /// A TCP connection: the engine runs the ICReq/ICResp exchange itself, then hands
    /// capsules up or serves them.
    fn qp_accept_tcp(&mut self, sock: TcpStream, user: u64) -> Result<QpHandle, AcceptError>;
    /// [`qp_accept_tcp`](Self::qp_accept_tcp) on a TLS listener: the engine runs the TLS
    /// 1.3 handshake (or, for optional TLS, sees the host speak plain NVMe/TCP) before the
    /// ICReq and reports [`Event::Tls`]; from then on every byte of the QP is encrypted.
    /// An engine without TLS fails with [`AcceptError::Unsupported`].
    fn qp_accept_tcp_tls(
        &mut self,
        sock: TcpStream,
        user: u64,
        tls: &TlsAccept,
    ) -> Result<QpHandle, AcceptError>;
    /// How a TLS QP's handshake ended: the PSK's owner, or why it failed (`None` for
    /// plain QPs and while the handshake runs).
    fn qp_tls(&mut self, qp: QpHandle) -> Option<Result<TlsPeerInfo, String>>;
    /// DOCA: `doca_sta_io_qp_alloc` + `doca_sta_io_qp_accept` for an RDMA CM connect
    /// request whose NVMe-oF private data the CM service validated; `depth` is HSQSIZE
    /// + 1. The request is consumed: accepted, or rejected on error.
    fn qp_accept_rdma(
        &mut self,
        req: ConnRequest,
        depth: u16,
        user: u64,
    ) -> Result<QpHandle, AcceptError>;
    /// An RDMA CM event of one of this context's QPs. ESTABLISHED is DOCA's
    /// `doca_sta_io_qp_connect_established`; the others end in [`Event::TransportError`].
    fn qp_rdma_cm_event(&mut self, qp: QpHandle, ev: RdmaCmEvent) -> Result<(), TaskError>;
    /// DOCA: `doca_sta_io_qp_set_user_data`; it comes back in the QP's events.
    fn qp_set_user_data(&mut self, qp: QpHandle, user: u64) -> Result<(), TaskError>;
    /// DOCA: `doca_sta_io_qp_add_subsystem`: bind an I/O queue (never an admin queue) to
    /// a subsystem; from then on the engine serves its I/O to that subsystem's namespaces.
    fn qp_add_subsystem(&mut self, qp: QpHandle, subsys: SubsysId) -> Result<(), TaskError>;
    /// DOCA: `doca_sta_io_qp_connect_set_sq_size`, plus what transports need from the
    /// Connect command: the queue id and whether SQ flow control is disabled. Call it for
    /// every queue, admin included, while its Connect is outstanding (before the answer).
    fn qp_connect_set_params(
        &mut self,
        qp: QpHandle,
        qid: u16,
        sqsize: u16,
        sqflow_disabled: bool,
    ) -> Result<(), TaskError>;
    /// Who an I/O queue's commands come from (host identifier, host NQN, listener: what
    /// `nvmf::target`'s Connect answer says): the engine checks every offloaded command of
    /// the QP against the namespace's access view with it. Call it before
    /// `qp_add_subsystem`, so no offloaded command is checked without it. Not a DOCA call.
    fn qp_set_access(&mut self, qp: QpHandle, key: AccessKey) -> Result<(), TaskError>;
    /// Abort command `cid` of `qp` if it has not reached the backend (see the module
    /// docs). Returns whether it was aborted; one at the backend, handed to the
    /// application, or not found is not (the spec allows that for any command).
    fn cmd_abort(&mut self, qp: QpHandle, cid: u16) -> bool;
    /// A fence on namespace `nsid` of `subsys` across every IO context: the returned
    /// [`Fence`] is done once each context has seen it and the backend requests it had in
    /// flight for the namespace at that moment have completed. Call it after publishing
    /// an access view that takes access away (a Preempt and Abort): once the fence is
    /// done, nothing the old view admitted is still running. An engine that does not
    /// check access views returns a done fence. Not a DOCA call.
    fn ns_fence(&mut self, subsys: SubsysId, nsid: u32) -> Fence;
    /// Free non-offloaded command `token` without answering it: the host no longer counts
    /// it as outstanding (an Asynchronous Event Request held across a controller reset and
    /// sent again with the same CID). Its queue entry is free again. Not a DOCA call.
    fn cmd_drop(&mut self, qp: QpHandle, token: CmdToken) -> Result<(), TaskError>;
    /// DOCA: `doca_sta_io_task_disconnect_alloc_init` + submit: stop taking input, let the
    /// QP's in-flight I/O finish, drop its unsent output, close it, then report
    /// `TaskDone { kind: QpDisconnect }`. The handle is dead afterwards (DOCA's
    /// `qp_destroy` is folded in), and so are the tokens of its non-offloaded commands.
    fn qp_disconnect(&mut self, qp: QpHandle, user: u64) -> Result<(), TaskError>;

    /// The payload buffer of a non-offloaded command that is the application's (rule 2
    /// above): `payload_len` bytes. An error for a stale token, or while a task moves data
    /// into it.
    fn payload(&mut self, token: CmdToken) -> Result<&mut [u8], TaskError>;
    /// DOCA `rdma_read` task: fetch the host's data for a non-offloaded command into its
    /// payload (TCP: R2T, then the host's H2CData; RDMA: RDMA READ of the keyed SGL).
    fn rdma_read(&mut self, qp: QpHandle, token: CmdToken, user: u64) -> Result<(), TaskError>;
    /// DOCA `rdma_write_send` task: send the first `data_len` bytes of the payload to the
    /// host (TCP: C2HData; RDMA: RDMA WRITE), then the completion. `data_len` is clamped
    /// to the payload length. (DOCA's task has no length and writes the SGL's length:
    /// payload buffers are handed up zeroed, rule 5, so what follows `data_len` is zeroes,
    /// never another command's data.)
    fn rdma_write_send(
        &mut self,
        qp: QpHandle,
        token: CmdToken,
        cqe: &Cqe,
        data_len: u32,
        user: u64,
    ) -> Result<(), TaskError>;
    /// DOCA `rdma_send` task: send the completion only (TCP: CapsuleResp; RDMA: SEND).
    fn rdma_send(
        &mut self,
        qp: QpHandle,
        token: CmdToken,
        cqe: &Cqe,
        user: u64,
    ) -> Result<(), TaskError>;
}
