//! The transport-independent NVMe-oF target: subsystems, namespaces, hosts, listeners,
//! the controller state machine and every command the data-path engine hands up.
//!
//! The daemon keeps one [`Target`] behind `Arc<Mutex<Target>>` shared by its IO threads.
//! It is the slow path: READ/WRITE/FLUSH/WRITE ZEROES/DSM/COMPARE to attached namespaces
//! never reach it. Nothing here does I/O or reads a clock: callers pass `now`, the bytes
//! of a capsule and a [`QueueKey`] naming the transport queue, and get back completions
//! ([`Outcome`]) and work for the transport ([`Action`]).
//!
//! # Model
//!
//! - Dynamic controller model (NVMe-oF 1.1 section 3.3.3): an admin Connect with CNTLID
//!   FFFFh creates a controller; CNTLIDs come from 1..=FFEFh, handed out round robin so a
//!   freshly freed ID is not reused at once. I/O queue Connects name that CNTLID and are
//!   matched by SUBNQN + HOSTNQN + CNTLID (as nvmet and SPDK do; a different HOSTID is
//!   ignored and the admin queue's HOSTID stays the controller's).
//! - Connect knows where the host came in ([`QueueOrigin`]): a subsystem restricted to some
//!   listeners refuses Connects arriving on the others, and a discovery log read over a
//!   wildcard listener (0.0.0.0, ::) publishes the address the host actually reached.
//! - The discovery subsystem `nqn.2014-08.org.nvmexpress.discovery` always exists; any
//!   host may connect to it on any listener, and its log shows each host only the
//!   subsystems it may use.
//! - Every refusal (Connect, CSTS.CFS, keep-alive expiry) is queued as a [`Notice`] with a
//!   [`RefusalReason`] for the caller to log and count ([`Target::take_notices`]).
//! - Controllers taken away by the target (subsystem or host removed, keep-alive expired)
//!   are *retired* first: their queues come back as [`Action::Disconnect`] and, until the
//!   transport reports the admin queue closed, commands on them get no answer
//!   ([`Outcome::Dropped`]), so a host sees its connection go and retries on a new one
//!   instead of getting an error with DNR for I/O it sent a moment too late.
//! - Every method that returns `Vec<Action>` also drains the pending actions, so callers
//!   that use those methods and [`Target::take_actions`] after `execute`, `connect` and
//!   the namespace calls never miss one.
//!
//! # Implemented (NVMe Base 2.0, NVM Command Set 1.0, NVMe-oF 1.1)
//!
//! - Fabrics: Connect (admin and I/O, IATTR/IPO on Connect Invalid Parameters), Property
//!   Get/Set (CAP, VS, CC, CSTS, CRTO), Disconnect (I/O queues; Invalid Queue Type on the
//!   admin queue).
//! - Controller: CC.EN enable/reset, CC.SHN shutdown, CSTS.RDY/CFS/SHST, CC.CSS 000b (NVM)
//!   and 110b (all supported I/O command sets), keep alive with KATO (command based;
//!   Traffic Based Keep Alive is not advertised).
//! - Admin: Identify CNS 00h/01h/02h/03h/05h/06h/07h/08h/1Ch; Get Log Page 00h/01h/02h/
//!   03h/04h/05h (per CSI)/70h with LPO/NUMD; Get/Set Features 01h, 02h, 04h, 05h (per
//!   namespace), 06h, 07h, 08h, 09h, 0Ah, 0Bh, 0Fh, 81h with NSID checks; Keep Alive;
//!   Asynchronous Event Request (namespace attribute, ANA change, reservation log and
//!   discovery log change notices, SMART / Health critical warnings of drives behind
//!   namespaces ([`Target::set_device_health`]), each masked until its log page is read without RAE and
//!   enabled per Set Features 0Bh; held across a controller reset, as nvmet does); Abort
//!   (held AERs here; commands of I/O queues through the engine, [`Action::Abort`]).
//! - Reservations ([`reservation`]): Register, Acquire, Release, Report on I/O queues,
//!   the Reservation Notification log (80h), features 82h and 83h, PTPL state for the
//!   caller to persist ([`Target::ptpl_snapshot`], [`Target::restore_reservation`]).
//! - ANA ([`ana`]): groups per subsystem with a state per listener, the ANA log (0Ch),
//!   ANA Change events, the Identify fields; always on (group 1 optimized everywhere).
//! - Per-host namespace visibility and discovery referrals (SUBTYPE 1).
//! - What the offloaded data path must refuse (reservation conflicts, ANA path states,
//!   namespaces a host may not see) is published as immutable [`NamespaceAccess`] views
//!   ([`Target::take_access_updates`]) for the engine to check without a lock.
//! - I/O commands that are not offloaded: the same checks, then Invalid Namespace /
//!   Invalid Opcode / Namespace Not Ready answers.
//! - In-band authentication (DH-HMAC-CHAP): Authentication Send/Receive, ATR in the
//!   Connect response, Authentication Required until a queue authenticates,
//!   re-authentication, timeouts, secure channel concatenation (TP 8018) on the target
//!   side (see [`authn`]).
//! - TLS: the discovery log's TREQ/TSAS for TLS listeners ([`Target::set_listener_tls`]);
//!   a queue that came over TLS may only Connect as the host and subsystem its PSK is for
//!   ([`Target::set_queue_tls`]). The handshake itself is the transport's.
//!
//! # Not implemented
//!
//! The static controller model, namespace management/attachment, firmware
//! download/commit, format, sanitize, self-test, telemetry, saveable features,
//! SMART/temperature events, I/O command set profiles (Set Features 19h).

pub mod access;
mod admin;
pub mod ana;
mod authn;
mod discovery;
mod health;
mod io;
pub mod operator;
pub mod refusal;
pub mod report;
pub mod reservation;
#[cfg(test)]
mod tests;

use crate::spec::fabrics::{
    self, cc, connect_data_offset as data_off, connect_sqe_offset as sqe_off, csts, ConnectCommand,
    ConnectData,
};
use crate::spec::log::{ErrorInformationEntry, SmartLog};
use crate::spec::{opcodes, Cqe, Sqe, Status};
pub use access::{AccessKey, NamespaceAccess};
pub use ana::{AnaGroup, AnaState};
pub use authn::{
    Authenticated, DhJob, DhJobId, GeneratedPsk, HostCredentials, TlsPeer, AUTH_TIMEOUT,
};
pub use refusal::{ControllerReset, Notice, Refusal, RefusalReason};
use reservation::{NotificationEntry, Reservations};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The well-known discovery subsystem NQN (NVMe Base 2.0 section 4.5).
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Admin queue entries the discovery log advertises (ASQSZ) and hosts use.
pub const ADMIN_QUEUE_ENTRIES: u16 = 32;
/// Largest admin queue SQSIZE (0's based) a Connect may ask for: 4096 entries, the most
/// an admin queue can have (NVMe Base 2.0 AQA.ASQS). Linux nvmet accepts any non-zero
/// SQSIZE on the admin queue and SPDK up to its `max_aq_depth` (128 by default, 4096 at
/// most); SPDK's host may ask for 2..=4096 entries, Linux's for 32.
pub const MAX_ADMIN_SQSIZE: u16 = 4095;
/// A retired controller whose admin queue the transport never reports closed is dropped
/// after this long anyway.
const RETIRED_LIMIT: Duration = Duration::from_secs(30);
/// Notices kept for [`Target::take_notices`]; more are counted in `notices_dropped`.
const NOTICE_LIMIT: usize = 1024;
/// Highest CNTLID of the dynamic model (FFF0h-FFFFh are reserved).
const MAX_CNTLID: u16 = 0xffef;
/// Error Information log entries kept per controller (ELPE + 1).
const ERROR_LOG_ENTRIES: usize = 64;
/// Asynchronous Event Requests a controller holds at once (AERL + 1).
const AER_LIMIT: usize = 4;
/// Abort commands a controller may have outstanding at once (ACL + 1).
const ABORT_LIMIT: usize = 4;
/// Reservation Notification log pages kept per controller (nvmet keeps 64); when more
/// arrive they are dropped and the Log Page Count jumps by as many, which tells the host
/// how many it missed.
const RESERVATION_LOG_LIMIT: usize = 64;

/// How many bytes of host-to-controller data the target reads for a command the engine
/// hands up (not offloaded) on a queue connected as `queue` (its QID, once its Fabrics
/// Connect was answered; `None` before): the engine fetches no more than this (no R2T,
/// no buffer beyond it).
///
/// Before Connect a queue has no controller and the only command the target reads data
/// for is the Connect itself (its 1024 bytes of Connect data). Once connected, on any
/// queue, Authentication Send takes its transfer length (a DH-HMAC-CHAP message). On the
/// admin queue no other command the target implements takes host data: Set Features
/// carries its values in CDW11, and the admin commands that take data (Security Send,
/// Firmware Image Download, Namespace Management) are not implemented and are refused
/// without it. On I/O queues the reservation commands take theirs (Register and Acquire
/// 16 bytes, Release 8); the other I/O commands that reach the slow path are answered
/// without their data. A command added here that reads host data must say so.
pub fn slow_path_host_data(sqe: &Sqe, queue: Option<u16>) -> u32 {
    use opcodes::io;
    match queue {
        None if sqe.is_fabrics() && sqe.fctype() == opcodes::fabrics::CONNECT => {
            ConnectData::SIZE as u32
        }
        Some(_) if sqe.is_fabrics() && sqe.fctype() == opcodes::fabrics::AUTHENTICATION_SEND => {
            crate::auth::msg::AuthCommand::from_sqe(sqe).len
        }
        None | Some(0) => 0,
        Some(_) => match sqe.opcode() {
            io::RESERVATION_REGISTER => reservation::REGISTER_DATA_LEN as u32,
            io::RESERVATION_ACQUIRE => reservation::ACQUIRE_DATA_LEN as u32,
            io::RESERVATION_RELEASE => reservation::RELEASE_DATA_LEN as u32,
            _ => 0,
        },
    }
}

/// Target-wide limits and identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetOptions {
    /// Entries per I/O submission queue (CAP.MQES + 1), e.g. 128.
    pub max_queue_depth: u16,
    /// I/O queues a controller may have (Set Features Number of Queues grants up to this).
    pub max_io_queues: u16,
    /// Maximum Data Transfer Size: 2^mdts * 4 KiB.
    pub mdts: u8,
    /// In-capsule data bytes accepted on I/O queues (IOCCSZ = (64 + this) / 16).
    pub ioccsz_bytes: u32,
    /// Namespace IDs are 1..=max_namespaces (Identify Controller NN).
    pub max_namespaces: u32,
    /// Keep-alive timeout applied to discovery controllers that connect with KATO 0, so
    /// stale discovery sessions are cleaned up. 0 disables that.
    pub kato_default_ms: u32,
    pub firmware_revision: String,
    /// Reservation state can be persisted (a PTPL state file is configured): RESCAP
    /// advertises Persist Through Power Loss and CPTPL / feature 83h may turn it on.
    pub ptpl_capable: bool,
    /// The engine runs Copy (format 0) itself, through one buffer of at most this many
    /// bytes (0: Copy is not supported; ONCS bit 8 stays clear).
    pub copy_max_bytes: u32,
    /// The engine runs fused Compare and Write (FUSES bit 0).
    pub fused_compare_write: bool,
    /// Reservations are offered (ONCS bit 5, RESCAP, the four reservation commands). Off
    /// where the engine serves I/O without checking them (DOCA STA: `sta::access`): then
    /// the commands are Invalid Opcode and nothing advertises them.
    pub reservations: bool,
}

impl Default for TargetOptions {
    fn default() -> Self {
        TargetOptions {
            max_queue_depth: 128,
            max_io_queues: 64,
            mdts: 8,
            ioccsz_bytes: 8192,
            max_namespaces: 1024,
            kato_default_ms: 120_000,
            firmware_revision: env!("CARGO_PKG_VERSION").to_string(),
            ptpl_capable: false,
            copy_max_bytes: 0,
            fused_compare_write: false,
            reservations: true,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Tcp,
    Rdma,
}

/// An address the daemon listens on; it shapes the discovery log.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ListenerInfo {
    pub transport: Transport,
    pub addr: IpAddr,
    pub port: u16,
}

impl ListenerInfo {
    /// Whether a connection whose local address is `local` can have come in on this
    /// listener's address: the same address, or a wildcard that covers it (0.0.0.0 covers
    /// IPv4; :: covers IPv6 and, dual stack being Linux's default, IPv4 too).
    pub fn covers(&self, local: IpAddr) -> bool {
        let local = local.to_canonical();
        match self.addr {
            IpAddr::V4(a) if a.is_unspecified() => local.is_ipv4(),
            IpAddr::V6(a) if a.is_unspecified() => true,
            a => a.to_canonical() == local,
        }
    }
}

/// TLS on a TCP listener, as the discovery log publishes it (TREQ and TSAS SECTYPE).
/// The handshake itself is the transport's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ListenerTls {
    /// Plain TCP (SECTYPE none, TREQ "not specified").
    #[default]
    None,
    /// TLS 1.3 or plain TCP (SECTYPE TLS 1.3, TREQ "not required").
    Optional,
    /// TLS 1.3 only (SECTYPE TLS 1.3, TREQ "required").
    Required,
}

/// Where a queue's transport connection came in. `Default` is "unknown", which only
/// subsystems open to every listener accept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueOrigin {
    /// The listener that accepted the connection, as configured (maybe a wildcard).
    pub listener: Option<ListenerInfo>,
    /// The connection's local address: the address the host reached.
    pub local: Option<IpAddr>,
    /// The host's address (failed authentications are counted per address).
    pub peer: Option<IpAddr>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubsystemConfig {
    pub nqn: String,
    /// ASCII, at most 20 bytes.
    pub serial: String,
    /// ASCII, at most 40 bytes.
    pub model: String,
    pub allow_any_host: bool,
    /// Host NQNs allowed when `allow_any_host` is false.
    pub hosts: Vec<String>,
    /// Listeners that expose the subsystem; `None` means all of them.
    pub listeners: Option<Vec<ListenerInfo>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceConfig {
    pub nsid: u32,
    /// Bytes per logical block: a power of two, 512..=65536.
    pub block_size: u32,
    pub num_blocks: u64,
    pub uuid: [u8; 16],
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    pub volatile_write_cache: bool,
    /// ANA group (1..=[`ana::ANAGRPMAX`]); 0 means the default group 1.
    pub anagrpid: u32,
    /// Host NQNs that see the namespace; `None`: every host of the subsystem.
    pub hosts: Option<Vec<String>>,
}

impl NamespaceConfig {
    pub fn group(&self) -> u32 {
        if self.anagrpid == 0 {
            ana::DEFAULT_GROUP
        } else {
            self.anagrpid
        }
    }
    /// Whether `hostnqn` sees this namespace.
    pub fn visible_to(&self, hostnqn: &str) -> bool {
        self.hosts
            .as_ref()
            .is_none_or(|h| h.iter().any(|x| x == hostnqn))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    #[error("invalid NQN {0:?}")]
    InvalidNqn(String),
    #[error("subsystem {0} already exists")]
    DuplicateSubsystem(String),
    #[error("no subsystem {0}")]
    UnknownSubsystem(String),
    #[error("the discovery subsystem cannot be changed this way")]
    DiscoverySubsystem,
    #[error("invalid serial or model number: {0}")]
    InvalidIdentity(String),
    #[error("namespace {nsid}: {reason}")]
    InvalidNamespace { nsid: u32, reason: &'static str },
    #[error("namespace {0} already exists")]
    DuplicateNamespace(u32),
    #[error("no namespace {0}")]
    UnknownNamespace(u32),
    #[error("ANA group {0} is out of range (1..={max})", max = ana::ANAGRPMAX)]
    InvalidAnaGroup(u32),
}

/// A referral to another discovery service (a SUBTYPE 1 discovery log entry).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Referral {
    pub transport: Transport,
    pub addr: IpAddr,
    pub port: u16,
}

/// A namespace's reservation state as the PTPL state file keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistedReservation {
    pub subnqn: String,
    pub nsid: u32,
    pub state: Reservations,
}

/// Opaque to nvmf: the transport's name for a queue (thread index, QP handle...).
pub type QueueKey = u64;

/// A command answered with an error, as its controller's Error Information log keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandError {
    pub cid: u16,
    pub nsid: u32,
    /// The command's first logical block, for I/O commands that address blocks.
    pub lba: Option<u64>,
    pub status: Status,
}

impl CommandError {
    /// `sqe`, failed with `status` on queue `qid`.
    pub fn of(sqe: &Sqe, qid: u16, status: Status) -> CommandError {
        CommandError {
            cid: sqe.cid(),
            nsid: sqe.nsid,
            lba: if qid == 0 { None } else { sqe.io_lba() },
            status,
        }
    }
}

/// A connected queue: its controller and queue ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueRef {
    pub cntlid: u16,
    pub qid: u16,
}

/// What a successful Connect established.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectOk {
    pub cntlid: u16,
    pub qid: u16,
    /// Submission queue size, 0's based, as in the Connect command.
    pub sqsize: u16,
    /// The host disabled SQ flow control (CATTR bit 2): SQHD need not be tracked.
    pub disable_sq_flow_control: bool,
    pub subnqn: String,
    /// The host NQN as the Connect data gave it (may be empty, see [`Notice`]).
    pub hostnqn: String,
    pub is_discovery: bool,
    /// The queue must authenticate (DH-HMAC-CHAP) before anything else: ATR was set in
    /// the Connect response.
    pub authentication_required: bool,
    /// Who the queue's commands come from, for the engine's access checks.
    pub access: AccessKey,
}

impl ConnectOk {
    pub fn queue(&self) -> QueueRef {
        QueueRef {
            cntlid: self.cntlid,
            qid: self.qid,
        }
    }
}

/// The answer to a capsule given to [`Target::execute`]. The CQE carries CID, SQID,
/// status and DW0/DW1; SQHD is left 0 for the transport to fill (it owns the SQ head).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Send this CQE; if `data_len > 0`, first send `data[..data_len]` to the host.
    Complete { cqe: Cqe, data_len: u32 },
    /// Held (Asynchronous Event Request); completed later by [`Action::CompleteHeld`].
    Deferred,
    /// Send nothing: the queue belongs to a retired controller and an
    /// [`Action::Disconnect`] for it is already out. The host sees the connection close
    /// and retries the command on a new association (which is what Linux nvmet's hosts
    /// see when a port or subsystem goes away), rather than failing it with DNR.
    Dropped,
}

/// Work for the transport that does not answer the capsule at hand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send this CQE for a command that [`Outcome::Deferred`] held.
    CompleteHeld {
        queue: QueueRef,
        key: QueueKey,
        cqe: Cqe,
    },
    /// Tear the queue down (after sending any completion already given for it).
    Disconnect { queue: QueueRef, key: QueueKey },
    /// Abort command `cid` on the I/O queue `queue` if it has not started (still queued or
    /// waiting for host data), then report with [`Target::abort_done`] naming `abort`
    /// (the Abort command's controller and CID, held until then).
    Abort {
        queue: QueueRef,
        key: QueueKey,
        cid: u16,
        abort: QueueRef,
        abort_cid: u16,
    },
}

impl Action {
    /// The queue whose transport must carry this action out.
    pub fn key(&self) -> QueueKey {
        match self {
            Action::CompleteHeld { key, .. }
            | Action::Disconnect { key, .. }
            | Action::Abort { key, .. } => *key,
        }
    }
}

/// Live I/O counters of one namespace, for the SMART / Health log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounters {
    pub read_cmds: u64,
    pub write_cmds: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Commands that failed with a media or data integrity error (SCT 2: unrecovered read
    /// error, write fault), not every failed command: SMART's Media and Data Integrity
    /// Errors.
    pub media_errors: u64,
}

/// What the target needs from the engine: live I/O counters for SMART / Health.
pub trait CounterSource {
    fn namespace_counters(&self, subnqn: &str, nsid: u32) -> IoCounters;
}

/// A [`CounterSource`] with no I/O at all.
pub struct NoCounters;

impl CounterSource for NoCounters {
    fn namespace_counters(&self, _subnqn: &str, _nsid: u32) -> IoCounters {
        IoCounters::default()
    }
}

struct Subsystem {
    cfg: SubsystemConfig,
    namespaces: BTreeMap<u32, NamespaceConfig>,
    /// Namespaces whose storage is gone ([`Target::namespace_lost`]): inactive for
    /// Identify, their I/O answered with a path error, until removed.
    lost: BTreeMap<u32, NamespaceConfig>,
    is_discovery: bool,
    /// Reservation state per namespace (kept while the namespace exists).
    resv: BTreeMap<u32, Reservations>,
    ana: ana::AnaTable,
    /// The drive's own SMART / Health log of namespaces backed by a real drive
    /// ([`Target::set_device_health`]).
    device_health: BTreeMap<u32, SmartLog>,
}

impl Subsystem {
    fn allows(&self, hostnqn: &str) -> bool {
        self.is_discovery || self.cfg.allow_any_host || self.cfg.hosts.iter().any(|h| h == hostnqn)
    }
    /// Identify Controller VWC bit 0: any namespace has a volatile write cache.
    fn has_volatile_cache(&self) -> bool {
        self.namespaces.values().any(|n| n.volatile_write_cache)
    }
}

/// Values of the features the target implements (NVMe Base 2.0 section 5.27.1).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Features {
    arbitration: u32,
    power_management: u32,
    /// Composite temperature over / under thresholds, kelvins.
    temperature_over: u16,
    temperature_under: u16,
    error_recovery: u32,
    volatile_write_cache: bool,
    /// I/O queues granted (1-based).
    io_queues: u16,
    write_atomicity: u32,
    async_event_config: u32,
}

impl Features {
    fn defaults(max_io_queues: u16) -> Features {
        Features {
            arbitration: 0,
            power_management: 0,
            temperature_over: 343,
            temperature_under: 0,
            error_recovery: 0,
            volatile_write_cache: true,
            io_queues: max_io_queues,
            write_atomicity: 0,
            async_event_config: 0,
        }
    }
}

/// Event kinds that are masked once reported until the host reads their log page
/// without RAE (NVMe Base 2.0 section 5.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventKind {
    NamespaceAttribute,
    DiscoveryLog,
    AnaChange,
    ReservationLog,
    /// SMART / Health status: NVM subsystem reliability, temperature threshold, spare
    /// below threshold (a drive's critical warnings; module `health`).
    SmartReliability,
    SmartTemperature,
    SmartSpare,
}

impl EventKind {
    fn bit(self) -> u8 {
        1 << self as u8
    }
    /// The completion DW0 of this event.
    fn dw0(self) -> u32 {
        use crate::spec::log::{aen, lid};
        match self {
            EventKind::NamespaceAttribute => aen::dw0(
                aen::TYPE_NOTICE,
                aen::INFO_NS_ATTRIBUTE_CHANGED,
                lid::CHANGED_NS_LIST,
            ),
            EventKind::DiscoveryLog => aen::dw0(
                aen::TYPE_NOTICE,
                aen::INFO_DISCOVERY_LOG_CHANGED,
                lid::DISCOVERY,
            ),
            EventKind::AnaChange => aen::dw0(aen::TYPE_NOTICE, aen::INFO_ANA_CHANGE, lid::ANA),
            EventKind::ReservationLog => aen::dw0(
                aen::TYPE_IO_COMMAND_SPECIFIC,
                aen::INFO_RESERVATION_LOG_AVAILABLE,
                lid::RESERVATION_NOTIFICATION,
            ),
            EventKind::SmartReliability => aen::dw0(
                aen::TYPE_SMART_HEALTH,
                aen::INFO_RELIABILITY,
                lid::SMART_HEALTH,
            ),
            EventKind::SmartTemperature => aen::dw0(
                aen::TYPE_SMART_HEALTH,
                aen::INFO_TEMPERATURE,
                lid::SMART_HEALTH,
            ),
            EventKind::SmartSpare => aen::dw0(
                aen::TYPE_SMART_HEALTH,
                aen::INFO_SPARE_BELOW_THRESHOLD,
                lid::SMART_HEALTH,
            ),
        }
    }
    /// The Asynchronous Event Configuration bit that enables it (reservation log events
    /// have none: feature 82h masks them per namespace; SMART events are enabled per
    /// critical-warning bit, checked where they are raised).
    fn config_bit(self) -> Option<u32> {
        use crate::spec::features::async_event_config as c;
        match self {
            EventKind::NamespaceAttribute => Some(c::NS_ATTRIBUTE_NOTICES),
            EventKind::DiscoveryLog => Some(c::DISCOVERY_LOG_CHANGE_NOTICES),
            EventKind::AnaChange => Some(c::ANA_CHANGE_NOTICES),
            EventKind::ReservationLog
            | EventKind::SmartReliability
            | EventKind::SmartTemperature
            | EventKind::SmartSpare => None,
        }
    }
}

struct Controller {
    cntlid: u16,
    subnqn: String,
    hostnqn: String,
    hostid: [u8; 16],
    is_discovery: bool,
    admin_key: QueueKey,
    io_queues: BTreeMap<u16, QueueKey>,
    /// Where the admin queue came in (its transport decides the keyed-SGL bit; its local
    /// address fills wildcard listeners in the discovery log).
    origin: QueueOrigin,
    /// Taken away by the target: its queues are being disconnected, commands on them get
    /// no answer, and it goes when the admin queue closes (or after [`RETIRED_LIMIT`]).
    retired: bool,
    /// When `poll_timeouts` first saw it retired.
    retired_since: Option<Instant>,
    /// The transport reported the admin queue closed (the controller goes when its I/O
    /// queues have closed too).
    admin_closed: bool,
    /// Error Recovery (feature 05h) per namespace, when set for one.
    ns_error_recovery: BTreeMap<u32, u32>,
    cc: u32,
    csts: u32,
    /// I/O queues a reset (CC.EN=0 or a shutdown) disconnected whose close the transport
    /// has not reported yet: until they are gone CSTS still reads RDY=1 (shutdown:
    /// occurring), so a host that waits for RDY=0 knows no I/O of them still runs.
    closing_io: BTreeSet<QueueKey>,
    /// KATO as the host set it (Connect or Set Features 0Fh), milliseconds.
    kato_ms: u32,
    /// Keep-alive deadline, `None` when the timer is off.
    deadline: Option<Instant>,
    features: Features,
    /// CIDs of held Asynchronous Event Requests, oldest first.
    aers: VecDeque<u16>,
    /// Event CQE DW0 values waiting for an AER.
    pending_events: VecDeque<u32>,
    /// [`EventKind`] bits reported and not yet cleared by reading their log page.
    masked: u8,
    changed_ns: Vec<u32>,
    changed_ns_overflow: bool,
    error_log: VecDeque<ErrorInformationEntry>,
    error_count: u64,
    /// Every queue of this controller must authenticate (the host has credentials).
    auth_required: bool,
    /// Authentication state per QID.
    queue_auth: BTreeMap<u16, authn::QueueAuth>,
    /// Host, host NQN slot and port of this controller, for access checks.
    access: AccessKey,
    /// Reservation Notification log pages not read yet, oldest first.
    resv_log: VecDeque<NotificationEntry>,
    /// Log Page Count of the last page added (lost ones included).
    resv_log_count: u64,
    /// Reservation Notification Mask (feature 82h) per namespace, and for the others.
    resv_masks: BTreeMap<u32, u32>,
    resv_mask_default: u32,
    /// Abort commands held until the engine answers.
    aborts: usize,
}

/// A Keep Alive Timeout as the controller runs it: rounded up to the Keep Alive
/// Granularity it reports (KAS 1: 100 ms), as the spec asks (NVMe Base 2.0 section
/// 5.27.1.12); Get Features returns the rounded value.
fn kato_granular(ms: u32) -> u32 {
    ms.div_ceil(100).min(u32::MAX / 100) * 100
}

/// An interned host NQN ([`Target::host_slots`]).
#[derive(Debug)]
struct HostSlot {
    slot: u64,
    /// Controllers of the host that exist (retired ones too).
    controllers: u32,
    /// A namespace's `hosts` named it once (it may still).
    named: bool,
}

impl Controller {
    fn enabled(&self) -> bool {
        self.cc & cc::EN != 0 && self.csts & csts::RDY != 0
    }
    fn effective_kato_ms(&self, opts: &TargetOptions) -> u32 {
        if self.kato_ms == 0 && self.is_discovery {
            opts.kato_default_ms
        } else {
            self.kato_ms
        }
    }
    fn restart_keep_alive(&mut self, now: Instant, opts: &TargetOptions) {
        let ms = self.effective_kato_ms(opts);
        self.deadline = (ms != 0).then(|| now + Duration::from_millis(ms as u64));
    }
    fn all_queues(&self) -> impl Iterator<Item = Action> + '_ {
        let cntlid = self.cntlid;
        std::iter::once(Action::Disconnect {
            queue: QueueRef { cntlid, qid: 0 },
            key: self.admin_key,
        })
        .chain(self.io_queue_disconnects())
    }
    fn io_queue_disconnects(&self) -> impl Iterator<Item = Action> + '_ {
        let cntlid = self.cntlid;
        self.io_queues
            .iter()
            .map(move |(&qid, &key)| Action::Disconnect {
                queue: QueueRef { cntlid, qid },
                key,
            })
    }
    /// Queues an event for the host unless the host disabled it (Asynchronous Event
    /// Configuration) or one of its kind is already reported and its log not read yet;
    /// completes a held AER if there is one.
    fn raise(&mut self, kind: EventKind, actions: &mut Vec<Action>) {
        if kind
            .config_bit()
            .is_some_and(|b| self.features.async_event_config & b == 0)
        {
            return;
        }
        if self.masked & kind.bit() != 0 {
            return;
        }
        self.masked |= kind.bit();
        let dw0 = kind.dw0();
        match self.aers.pop_front() {
            Some(cid) => actions.push(Action::CompleteHeld {
                queue: QueueRef {
                    cntlid: self.cntlid,
                    qid: 0,
                },
                key: self.admin_key,
                cqe: Cqe {
                    dw0,
                    ..Cqe::success(cid)
                },
            }),
            None => self.pending_events.push_back(dw0),
        }
    }
    fn record_error(&mut self, qid: u16, e: &CommandError) {
        self.error_count += 1;
        let entry = ErrorInformationEntry {
            error_count: self.error_count.into(),
            sqid: qid.into(),
            cid: e.cid.into(),
            status: e.status.to_field().into(),
            parameter_error_location: 0xffffu16.into(),
            lba: e.lba.unwrap_or(0).into(),
            nsid: e.nsid.into(),
            ..Default::default()
        };
        self.error_log.push_front(entry);
        self.error_log.truncate(ERROR_LOG_ENTRIES);
    }
    /// CC.EN 1 -> 0 or shutdown: I/O queues go, pending events are dropped, features
    /// return to their defaults. Held AERs stay held, as Linux nvmet and SPDK's TCP
    /// target keep them: the admin queue is still connected, so they complete with the
    /// next event or go with the connection. (Completing them here breaks SPDK's host,
    /// which frees its AER before shutting the controller down and then fails the queue
    /// on the unexpected completion; forgetting them leaves the host's commands
    /// unanswerable for the life of the connection.)
    /// CSTS as the host reads it: a reset or shutdown is still under way while I/O queues
    /// it disconnected have not closed (`closing_io`).
    fn csts_now(&self) -> u32 {
        let mut v = self.csts;
        if !self.closing_io.is_empty() {
            if self.cc & cc::EN == 0 {
                v |= csts::RDY;
            }
            if v & csts::SHST_MASK == csts::SHST_COMPLETE {
                v = (v & !csts::SHST_MASK) | csts::SHST_OCCURRING;
            }
        }
        v
    }

    fn reset(&mut self, max_io_queues: u16, actions: &mut Vec<Action>) {
        actions.extend(self.io_queue_disconnects());
        self.closing_io.extend(self.io_queues.values().copied());
        self.io_queues.clear();
        self.queue_auth.retain(|&qid, _| qid == 0);
        self.ns_error_recovery.clear();
        self.pending_events.clear();
        self.masked = 0;
        self.resv_masks.clear();
        self.resv_mask_default = 0;
        self.features = Features::defaults(max_io_queues);
    }
}

/// Result of a command handler: the completion's DW0 and data length, held, or no answer
/// at all (retired controller).
enum Reply {
    Done { dw0: u32, dw1: u32, data_len: u32 },
    Held,
    Dropped,
}

impl Reply {
    fn ok() -> Result<Reply, Status> {
        Reply::dw0(0)
    }
    fn dw0(dw0: u32) -> Result<Reply, Status> {
        Ok(Reply::Done {
            dw0,
            dw1: 0,
            data_len: 0,
        })
    }
    fn data(len: usize) -> Result<Reply, Status> {
        Ok(Reply::Done {
            dw0: 0,
            dw1: 0,
            data_len: len as u32,
        })
    }
}

/// A failed Connect: status, response DW0 (IATTR/IPO for Invalid Parameters) and why.
struct ConnectError {
    status: Status,
    dw0: u32,
    reason: RefusalReason,
    cntlid: Option<u16>,
}

impl ConnectError {
    fn data(status: Status, offset: u16, reason: RefusalReason) -> ConnectError {
        ConnectError {
            status,
            dw0: fabrics::invalid_parameter_dw0(true, offset),
            reason,
            cntlid: None,
        }
    }
    fn sqe(offset: u16, reason: RefusalReason) -> ConnectError {
        ConnectError {
            status: Status::CONNECT_INVALID_PARAMETERS,
            dw0: fabrics::invalid_parameter_dw0(false, offset),
            reason,
            cntlid: None,
        }
    }
    fn plain(status: Status, reason: RefusalReason) -> ConnectError {
        ConnectError {
            status,
            dw0: 0,
            reason,
            cntlid: None,
        }
    }
    fn on(mut self, cntlid: u16) -> ConnectError {
        self.cntlid = Some(cntlid);
        self
    }
}

/// Subsystems, listeners and controllers of one target. See the module docs.
pub struct Target {
    opts: TargetOptions,
    /// Listeners with their discovery PORTID, in the order they were added.
    listeners: Vec<(u16, ListenerInfo)>,
    /// TLS of TCP listeners that have it.
    listener_tls: std::collections::HashMap<ListenerInfo, ListenerTls>,
    next_portid: u16,
    subsystems: BTreeMap<String, Subsystem>,
    controllers: BTreeMap<u16, Controller>,
    next_cntlid: u16,
    /// Discovery log generation counter, bumped on every change to what it shows.
    genctr: u64,
    actions: Vec<Action>,
    /// Refusals and other news for the operator, drained by [`Target::take_notices`].
    notices: Vec<Notice>,
    /// Notices not kept because nobody drained them.
    notices_dropped: u64,
    /// Subsystems that already accepted an empty Host NQN (warned once each).
    empty_hostnqn_seen: BTreeSet<String>,
    /// First time seen, for SMART power-on hours.
    started: Option<Instant>,
    /// DH-HMAC-CHAP credentials by host NQN.
    credentials: BTreeMap<String, Arc<HostCredentials>>,
    /// Subsystems that refuse hosts without credentials.
    auth_required_subsystems: BTreeSet<String>,
    /// Random bytes for authentication (challenges, DH keys).
    entropy: Option<Box<dyn crate::auth::Entropy + Send>>,
    /// TLS PSK owners of queues that came over TLS, by transport key.
    queue_tls: BTreeMap<QueueKey, TlsPeer>,
    /// Failed and abandoned authentications per host address.
    auth_strikes: authn::AuthStrikes,
    /// DH work not yet taken by [`Target::take_dh_jobs`], and the last job's number.
    dh_jobs: Vec<authn::DhJob>,
    next_dh_seq: u64,
    /// Host NQNs interned for access keys (visibility checks compare these numbers):
    /// those a namespace's `hosts` names and those of controllers that exist. A slot is
    /// never given out twice, so a key outliving its entry cannot match another host.
    host_slots: BTreeMap<String, HostSlot>,
    next_host_slot: u64,
    /// Access views built since the last [`Target::take_access_updates`], by namespace.
    access_updates: BTreeMap<(String, u32), Arc<NamespaceAccess>>,
    /// Bumped whenever state the PTPL file keeps changes.
    ptpl_version: u64,
    referrals: Vec<Referral>,
}

impl Target {
    /// A target with the discovery subsystem and nothing else.
    pub fn new(opts: TargetOptions) -> Target {
        let mut subsystems = BTreeMap::new();
        subsystems.insert(
            DISCOVERY_NQN.to_string(),
            Subsystem {
                cfg: SubsystemConfig {
                    nqn: DISCOVERY_NQN.to_string(),
                    serial: "nvmf-target-disc".to_string(),
                    model: "nvmf-target discovery".to_string(),
                    allow_any_host: true,
                    hosts: Vec::new(),
                    listeners: None,
                },
                namespaces: BTreeMap::new(),
                lost: BTreeMap::new(),
                is_discovery: true,
                resv: BTreeMap::new(),
                ana: ana::AnaTable::default(),
                device_health: BTreeMap::new(),
            },
        );
        Target {
            opts,
            listeners: Vec::new(),
            listener_tls: std::collections::HashMap::new(),
            next_portid: 1,
            subsystems,
            controllers: BTreeMap::new(),
            next_cntlid: 1,
            genctr: 0,
            actions: Vec::new(),
            notices: Vec::new(),
            notices_dropped: 0,
            empty_hostnqn_seen: BTreeSet::new(),
            started: None,
            credentials: BTreeMap::new(),
            auth_required_subsystems: BTreeSet::new(),
            entropy: None,
            queue_tls: BTreeMap::new(),
            auth_strikes: Default::default(),
            dh_jobs: Vec::new(),
            next_dh_seq: 0,
            host_slots: BTreeMap::new(),
            next_host_slot: 1,
            access_updates: BTreeMap::new(),
            ptpl_version: 0,
            referrals: Vec::new(),
        }
    }

    pub fn options(&self) -> &TargetOptions {
        &self.opts
    }

    /// Adds a listener (ignored if already present); it gets the next PORTID.
    pub fn add_listener(&mut self, l: ListenerInfo) {
        if self.listeners.iter().any(|(_, x)| *x == l) {
            return;
        }
        self.listeners.push((self.next_portid, l));
        self.next_portid = self.next_portid.wrapping_add(1).max(1);
        self.discovery_changed();
        // ANA states are per port: views name ports by PORTID.
        self.publish_all();
    }

    /// Sets what the discovery log says about a listener's TLS (before or after
    /// [`Target::add_listener`]); discovery controllers get a log change notice.
    pub fn set_listener_tls(&mut self, l: &ListenerInfo, tls: ListenerTls) {
        let old = self.listener_tls.insert(l.clone(), tls).unwrap_or_default();
        if old != tls {
            self.discovery_changed();
        }
    }

    /// Removes a listener from the discovery log. Connected queues are the transport's
    /// business and are not touched.
    pub fn remove_listener(&mut self, l: &ListenerInfo) {
        let before = self.listeners.len();
        self.listeners.retain(|(_, x)| x != l);
        if self.listeners.len() != before {
            self.discovery_changed();
            self.publish_all();
        }
    }

    /// Replaces the discovery referrals (SUBTYPE 1 entries); discovery controllers see a
    /// new GENCTR and a Discovery Log Change event when they differ.
    pub fn set_referrals(&mut self, referrals: Vec<Referral>) -> Vec<Action> {
        if referrals != self.referrals {
            self.referrals = referrals;
            self.discovery_changed();
        }
        self.take_actions()
    }

    pub fn add_subsystem(&mut self, c: SubsystemConfig) -> Result<(), TargetError> {
        if c.nqn == DISCOVERY_NQN {
            return Err(TargetError::DiscoverySubsystem);
        }
        if !fabrics::is_valid_nqn(&c.nqn) {
            return Err(TargetError::InvalidNqn(c.nqn));
        }
        if let Some(h) = c.hosts.iter().find(|h| !fabrics::is_valid_nqn(h)) {
            return Err(TargetError::InvalidNqn(h.clone()));
        }
        let printable = |s: &str, max: usize| {
            !s.is_empty() && s.len() <= max && s.bytes().all(|b| (0x20..0x7f).contains(&b))
        };
        if !printable(&c.serial, 20) {
            return Err(TargetError::InvalidIdentity(c.serial));
        }
        if !printable(&c.model, 40) {
            return Err(TargetError::InvalidIdentity(c.model));
        }
        if self.subsystems.contains_key(&c.nqn) {
            return Err(TargetError::DuplicateSubsystem(c.nqn));
        }
        self.subsystems.insert(
            c.nqn.clone(),
            Subsystem {
                cfg: c,
                namespaces: BTreeMap::new(),
                lost: BTreeMap::new(),
                is_discovery: false,
                resv: BTreeMap::new(),
                ana: ana::AnaTable::default(),
                device_health: BTreeMap::new(),
            },
        );
        self.discovery_changed();
        Ok(())
    }

    /// Changes the listeners that expose a subsystem (`None`: all of them). Connects on
    /// the others are refused from now on; controllers connected through them stay (as
    /// after a listener is removed); discovery logs follow.
    pub fn set_subsystem_listeners(
        &mut self,
        nqn: &str,
        listeners: Option<Vec<ListenerInfo>>,
    ) -> Result<(), TargetError> {
        let s = self.user_subsystem_mut(nqn)?;
        if s.cfg.listeners != listeners {
            s.cfg.listeners = listeners;
            self.discovery_changed();
        }
        Ok(())
    }

    /// Removes a subsystem: new Connects to it are refused at once, its controllers are
    /// retired (their queues come back as [`Action::Disconnect`]; commands on them get no
    /// answer until the transport closes them). Unknown NQNs and the discovery subsystem
    /// are ignored.
    pub fn remove_subsystem(&mut self, nqn: &str) -> Vec<Action> {
        let Some(s) = self.subsystems.remove(nqn).filter(|_| nqn != DISCOVERY_NQN) else {
            return self.take_actions();
        };
        if s.resv.values().any(|r| r.ptpl) {
            self.ptpl_version += 1;
        }
        self.access_updates.retain(|(n, _), _| n != nqn);
        self.retire_controllers_where(|c| c.subnqn == nqn);
        self.discovery_changed();
        self.forget_unnamed_hosts();
        self.take_actions()
    }

    /// Replaces a subsystem's allow list; controllers of hosts no longer allowed are
    /// retired (their queues come back as [`Action::Disconnect`]).
    pub fn set_hosts(
        &mut self,
        nqn: &str,
        allow_any_host: bool,
        hosts: Vec<String>,
    ) -> Vec<Action> {
        if let Some(s) = self.subsystems.get_mut(nqn).filter(|s| !s.is_discovery) {
            s.cfg.allow_any_host = allow_any_host;
            s.cfg.hosts = hosts;
            let s = &self.subsystems[nqn];
            let gone: Vec<u16> = self
                .controllers
                .values()
                .filter(|c| c.subnqn == nqn && !s.allows(&c.hostnqn))
                .map(|c| c.cntlid)
                .collect();
            self.retire_controllers_where(|c| gone.contains(&c.cntlid));
            self.discovery_changed();
        }
        self.take_actions()
    }

    /// After a reload tightened the rules: retires the controllers connected before that
    /// no longer meet them, as Linux nvmet and SPDK do (a removed listener's, a
    /// subsystem's on a listener it left, plaintext ones on a listener that now requires
    /// TLS, unauthenticated ones of a subsystem that now requires authentication).
    /// Returns (cntlid, host NQN, subsystem NQN, why) of each; their queues come back as
    /// [`Action::Disconnect`] ([`Target::take_actions`]).
    pub fn retire_out_of_policy(&mut self) -> Vec<(u16, String, String, &'static str)> {
        let mut gone = Vec::new();
        for c in self.controllers.values().filter(|c| !c.retired) {
            let Some(s) = self.subsystems.get(&c.subnqn) else {
                continue;
            };
            let plaintext = std::iter::once(&c.admin_key)
                .chain(c.io_queues.values())
                .any(|k| !self.queue_tls.contains_key(k));
            let why = match c.origin.listener.as_ref() {
                Some(l) if !self.listeners.iter().any(|(_, x)| x == l) => {
                    Some("its listener was removed or moved")
                }
                Some(l)
                    if !s.is_discovery
                        && s.cfg.listeners.as_ref().is_some_and(|ls| !ls.contains(l)) =>
                {
                    Some("the subsystem is no longer on its listener")
                }
                Some(l)
                    if plaintext && self.listener_tls.get(l) == Some(&ListenerTls::Required) =>
                {
                    Some("its listener now requires TLS and it connected without")
                }
                _ => None,
            };
            let generated_tls = self
                .queue_tls
                .get(&c.admin_key)
                .is_some_and(|p| p.generated);
            let why = why.or_else(|| {
                (!s.is_discovery
                    && self.auth_required_subsystems.contains(&c.subnqn)
                    && !c.auth_required
                    && !generated_tls)
                    .then_some(
                        "the subsystem now requires authentication and it did not authenticate",
                    )
            });
            if let Some(why) = why {
                gone.push((c.cntlid, c.hostnqn.clone(), c.subnqn.clone(), why));
            }
        }
        self.retire_controllers_where(|c| gone.iter().any(|g| g.0 == c.cntlid));
        gone
    }

    /// Adds a namespace; every controller of the subsystem gets it in its Changed
    /// Namespace List and a Namespace Attribute Changed event.
    pub fn add_namespace(&mut self, subnqn: &str, ns: NamespaceConfig) -> Result<(), TargetError> {
        let max = self.opts.max_namespaces;
        let s = self.user_subsystem_mut(subnqn)?;
        let nsid = ns.nsid;
        let bad = |reason| Err(TargetError::InvalidNamespace { nsid, reason });
        if nsid == 0 || nsid > max {
            return bad("NSID out of range");
        }
        if !ns.block_size.is_power_of_two() || !(512..=65536).contains(&ns.block_size) {
            return bad("block size must be a power of two in 512..=65536");
        }
        if ns.num_blocks == 0 {
            return bad("no blocks");
        }
        if ns.group() > ana::ANAGRPMAX {
            return bad("ANA group ID out of range");
        }
        if s.namespaces.contains_key(&nsid) || s.lost.contains_key(&nsid) {
            return Err(TargetError::DuplicateNamespace(nsid));
        }
        let hosts = ns.hosts.clone();
        s.namespaces.insert(nsid, ns);
        s.resv.insert(nsid, Reservations::default());
        self.publish(subnqn, nsid);
        self.namespace_changed(subnqn, nsid, |h| {
            hosts.as_ref().is_none_or(|l| l.iter().any(|x| x == h))
        });
        Ok(())
    }

    /// Removes a namespace, with the same notifications as [`Target::add_namespace`].
    pub fn remove_namespace(&mut self, subnqn: &str, nsid: u32) -> Result<(), TargetError> {
        let s = self.user_subsystem_mut(subnqn)?;
        let Some(old) = s.namespaces.remove(&nsid).or_else(|| s.lost.remove(&nsid)) else {
            return Err(TargetError::UnknownNamespace(nsid));
        };
        s.device_health.remove(&nsid);
        if s.resv.remove(&nsid).is_some_and(|r| r.ptpl) {
            self.ptpl_version += 1;
        }
        self.access_updates.remove(&(subnqn.to_string(), nsid));
        self.namespace_changed(subnqn, nsid, |h| old.visible_to(h));
        self.forget_unnamed_hosts();
        Ok(())
    }

    /// The storage behind a namespace is gone (its file was deleted, its device removed)
    /// or hangs. What hosts see, and why:
    ///
    /// - I/O to it is answered Internal Path Error (SCT 3h, SC 00h) without DNR. NVMe
    ///   Base 2.0 makes SCT 3h the "try another path" class; the Linux host fails such
    ///   commands over to another path of the namespace when it has one (multipath), and
    ///   otherwise retries a few times and fails them. Namespace Not Ready (what a
    ///   namespace not attached *yet* gets) is no good here: Linux retries it on the same
    ///   path and never fails over, and with DNR no host retries at all, not even
    ///   elsewhere. ANA states (Persistent Loss) say the same but for a whole ANA group
    ///   on a listener; one lost backend is one namespace, and the rest of its group is
    ///   fine.
    /// - It leaves the active namespace list, with a Namespace Attribute Changed event,
    ///   as a hot-removed drive would: the host rescans and drops this path, so a host
    ///   with no other path stops retrying and fails the I/O instead of spinning on it.
    ///
    /// The namespace stays configured (a reload that removes it, or a restart, clears
    /// it; re-adding it needs it removed first). Idempotent.
    /// The namespaces taken out by [`Target::namespace_lost`] and not removed since, as
    /// (subsystem NQN, NSID).
    pub fn lost_namespaces(&self) -> Vec<(String, u32)> {
        self.subsystems
            .iter()
            .flat_map(|(n, s)| s.lost.keys().map(move |&id| (n.clone(), id)))
            .collect()
    }

    pub fn namespace_lost(&mut self, subnqn: &str, nsid: u32) -> Result<(), TargetError> {
        let s = self.user_subsystem_mut(subnqn)?;
        if s.lost.contains_key(&nsid) {
            return Ok(());
        }
        let ns = s
            .namespaces
            .remove(&nsid)
            .ok_or(TargetError::UnknownNamespace(nsid))?;
        let visible = ns.clone();
        s.lost.insert(nsid, ns);
        // The engine answers its I/O on every IO thread from now on.
        self.access_updates.insert(
            (subnqn.to_string(), nsid),
            Arc::new(NamespaceAccess::lost()),
        );
        self.namespace_changed(subnqn, nsid, |h| visible.visible_to(h));
        Ok(())
    }

    /// Changes which hosts see a namespace. Controllers of hosts that gain or lose it
    /// (and only those) get it in their Changed Namespace List and a Namespace Attribute
    /// Changed event; the engine gets a new access view.
    pub fn set_namespace_hosts(
        &mut self,
        subnqn: &str,
        nsid: u32,
        hosts: Option<Vec<String>>,
    ) -> Result<Vec<Action>, TargetError> {
        let s = self.user_subsystem_mut(subnqn)?;
        let ns = s
            .namespaces
            .get_mut(&nsid)
            .ok_or(TargetError::UnknownNamespace(nsid))?;
        let old = ns.clone();
        ns.hosts = hosts;
        let new = ns.clone();
        self.publish(subnqn, nsid);
        self.namespace_changed(subnqn, nsid, |h| old.visible_to(h) != new.visible_to(h));
        self.forget_unnamed_hosts();
        Ok(self.take_actions())
    }

    /// Moves a namespace to ANA group `grpid` (0: the default group) in place, as SPDK
    /// does (`nvmf_subsystem_set_ns_ana_group`): it stays attached with its identity, its
    /// reservations and its I/O. Its state on each listener becomes the new group's (the
    /// engine gets a new access view), both groups' descriptors in the ANA log change,
    /// and controllers that see the namespace get an ANA Change event.
    pub fn set_namespace_ana_group(
        &mut self,
        subnqn: &str,
        nsid: u32,
        grpid: u32,
    ) -> Result<Vec<Action>, TargetError> {
        if grpid > ana::ANAGRPMAX {
            return Err(TargetError::InvalidAnaGroup(grpid));
        }
        let s = self.user_subsystem_mut(subnqn)?;
        if let Some(lost) = s.lost.get_mut(&nsid) {
            // Taken out (its storage went): it comes back in its new group.
            lost.anagrpid = grpid;
            return Ok(Vec::new());
        }
        let ns = s
            .namespaces
            .get_mut(&nsid)
            .ok_or(TargetError::UnknownNamespace(nsid))?;
        let before = ns.group();
        ns.anagrpid = grpid;
        let (after, seen) = (ns.group(), ns.clone());
        if after == before {
            return Ok(Vec::new());
        }
        s.ana.members_changed(&[before, after]);
        self.publish(subnqn, nsid);
        for c in self
            .controllers
            .values_mut()
            .filter(|c| c.subnqn == subnqn && !c.retired && seen.visible_to(&c.hostnqn))
        {
            c.raise(EventKind::AnaChange, &mut self.actions);
        }
        Ok(self.take_actions())
    }

    /// The size in blocks hosts are told for namespace `nsid` (one taken out included).
    pub fn namespace_blocks(&self, subnqn: &str, nsid: u32) -> Option<u64> {
        let s = self.subsystems.get(subnqn)?;
        s.namespaces
            .get(&nsid)
            .or_else(|| s.lost.get(&nsid))
            .map(|ns| ns.num_blocks)
    }

    /// The namespace now holds `num_blocks` blocks (its backend grew): Identify Namespace
    /// answers the new NSZE, NCAP and NUSE, and controllers that see it get it in their
    /// Changed Namespace List with a Namespace Attribute Changed event, on which a host
    /// reads the namespace's Identify data again (Linux: "detected capacity change"), as
    /// after nvmet's `revalidate_size` or an SPDK bdev resize. Only growth: a namespace
    /// never shrinks under its hosts (blocks they wrote would vanish), so a smaller count
    /// is refused. Called once the engine serves the new blocks.
    pub fn resize_namespace(
        &mut self,
        subnqn: &str,
        nsid: u32,
        num_blocks: u64,
    ) -> Result<Vec<Action>, TargetError> {
        let s = self.user_subsystem_mut(subnqn)?;
        let lost = s.lost.contains_key(&nsid);
        let ns = s
            .namespaces
            .get_mut(&nsid)
            .or_else(|| s.lost.get_mut(&nsid))
            .ok_or(TargetError::UnknownNamespace(nsid))?;
        if num_blocks < ns.num_blocks {
            return Err(TargetError::InvalidNamespace {
                nsid,
                reason: "a namespace cannot shrink while hosts use it",
            });
        }
        if num_blocks == ns.num_blocks {
            return Ok(Vec::new());
        }
        ns.num_blocks = num_blocks;
        let seen = ns.clone();
        if !lost {
            // Taken out namespaces are outside every host's view: nothing to tell.
            self.namespace_changed(subnqn, nsid, |h| seen.visible_to(h));
        }
        Ok(self.take_actions())
    }

    /// Records the SMART / Health log (Log Page 02h, 512 bytes) the drive behind a
    /// namespace reported; Get Log Page 02h answers its health fields from it from now on
    /// (module `health`). Critical-warning bits that were clear and are now set raise the
    /// SMART / Health event they belong to on each controller of the subsystem that
    /// enabled that bit (Asynchronous Event Configuration bits 7:0), masked until the
    /// host reads log 02h without RAE.
    pub fn set_device_health(
        &mut self,
        subnqn: &str,
        nsid: u32,
        log: &[u8; 512],
    ) -> Result<Vec<Action>, TargetError> {
        use zerocopy::FromBytes;
        let s = self.user_subsystem_mut(subnqn)?;
        if !s.namespaces.contains_key(&nsid) {
            return Err(TargetError::UnknownNamespace(nsid));
        }
        // 512 bytes is the structure's size and it has no alignment: this cannot fail.
        let new = SmartLog::read_from_bytes(&log[..]).unwrap_or_default();
        let before = s
            .device_health
            .get(&nsid)
            .map_or(0, |old| old.critical_warning);
        let newly_set = new.critical_warning & !before;
        s.device_health.insert(nsid, new);
        if newly_set != 0 {
            for c in self
                .controllers
                .values_mut()
                .filter(|c| c.subnqn == subnqn && !c.retired && !c.is_discovery)
            {
                for (kind, bits) in health::events_for(newly_set) {
                    if c.features.async_event_config & bits as u32 != 0 {
                        c.raise(kind, &mut self.actions);
                    }
                }
            }
        }
        Ok(self.take_actions())
    }

    /// Replaces a subsystem's ANA groups. Controllers on listeners where a group's state
    /// changed get an ANA Change event (if they enabled it); the change count moves; the
    /// engine gets new access views for the subsystem's namespaces.
    pub fn set_ana_groups(
        &mut self,
        subnqn: &str,
        groups: Vec<AnaGroup>,
    ) -> Result<Vec<Action>, TargetError> {
        if let Some(g) = groups.iter().find(|g| g.id == 0 || g.id > ana::ANAGRPMAX) {
            return Err(TargetError::InvalidAnaGroup(g.id));
        }
        let s = self.user_subsystem_mut(subnqn)?;
        let changed = s.ana.set(&groups);
        let groups_in_use: BTreeSet<u32> = s.namespaces.values().map(|n| n.group()).collect();
        let nsids: Vec<u32> = s.namespaces.keys().copied().collect();
        for nsid in nsids {
            self.publish(subnqn, nsid);
        }
        for c in self
            .controllers
            .values_mut()
            .filter(|c| c.subnqn == subnqn && !c.retired)
        {
            let hit = c.origin.listener.as_ref().is_some_and(|l| {
                changed
                    .iter()
                    .any(|(x, g)| x == l && groups_in_use.contains(g))
            });
            if hit {
                c.raise(EventKind::AnaChange, &mut self.actions);
            }
        }
        Ok(self.take_actions())
    }

    /// The ANA state of `subnqn`'s group `grpid` on `listener`.
    pub fn ana_state(&self, subnqn: &str, grpid: u32, listener: &ListenerInfo) -> Option<AnaState> {
        self.subsystems
            .get(subnqn)
            .map(|s| s.ana.state(grpid, Some(listener)))
    }

    /// (host NQN, subsystem NQN) of a controller, for log lines.
    pub fn controller_nqns(&self, cntlid: u16) -> Option<(String, String)> {
        self.controllers
            .get(&cntlid)
            .map(|c| (c.hostnqn.clone(), c.subnqn.clone()))
    }

    /// The subsystem NQN of a live controller.
    pub fn subsystem_of(&self, cntlid: u16) -> Option<&str> {
        self.controllers.get(&cntlid).map(|c| c.subnqn.as_str())
    }

    /// Fabrics Connect on a new queue: `data` is the 1024-byte Connect data, `origin`
    /// where the queue's connection came in. On success CQE DW0 holds the CNTLID; on
    /// Connect Invalid Parameters/Host it holds IATTR/IPO. A refusal is also queued as a
    /// [`Notice`] with its reason.
    pub fn connect(
        &mut self,
        now: Instant,
        key: QueueKey,
        origin: &QueueOrigin,
        sqe: &Sqe,
        data: &[u8],
    ) -> (Cqe, Option<ConnectOk>) {
        self.started.get_or_insert(now);
        let cmd = ConnectCommand::from_sqe(sqe);
        match self.try_connect(now, key, origin, sqe, &cmd, data) {
            Ok(ok) => {
                let atr = if ok.authentication_required {
                    crate::auth::CONNECT_AUTHREQ_ATR
                } else {
                    0
                };
                let mut cqe = Cqe {
                    dw0: ok.cntlid as u32 | atr,
                    sqid: ok.qid,
                    ..Cqe::success(sqe.cid())
                };
                if ok.disable_sq_flow_control {
                    cqe.sqhd = crate::queue::SQHD_FLOW_CONTROL_DISABLED;
                }
                (cqe, Some(ok))
            }
            Err(e) => {
                // A refused queue is closed by the host; nothing to keep for it.
                if !matches!(e.reason, RefusalReason::AlreadyConnected) {
                    self.queue_tls.remove(&key);
                }
                // What the host said, as far as it can be read, for the log; for a queue
                // connected already, who it is connected as (a second Connect's data may
                // be anything).
                let d = ConnectData::from_bytes(data);
                let text = |f: fn(&ConnectData) -> Option<&str>| {
                    d.as_ref().and_then(f).map(|s| s.to_string())
                };
                let owner = match e.reason {
                    RefusalReason::AlreadyConnected => e
                        .cntlid
                        .and_then(|id| self.controllers.get(&id))
                        .map(|c| (c.hostnqn.clone(), c.subnqn.clone())),
                    _ => None,
                };
                let (hostnqn, subnqn) = match owner {
                    Some((h, s)) => (Some(h), Some(s)),
                    None => (text(ConnectData::hostnqn), text(ConnectData::subnqn)),
                };
                self.notice(Notice::Refused(Refusal {
                    reason: e.reason,
                    key,
                    hostnqn,
                    subnqn,
                    cntlid: e.cntlid.or(d.map(|d| d.cntlid.get())),
                    qid: Some(cmd.qid),
                    status: Some(e.status),
                }));
                (
                    Cqe {
                        dw0: e.dw0,
                        sqid: cmd.qid,
                        ..Cqe::new(sqe.cid(), e.status)
                    },
                    None,
                )
            }
        }
    }

    /// The queue (CNTLID, QID) a transport key is connected as, retired controllers
    /// included.
    fn queue_of_key(&self, key: QueueKey) -> Option<QueueRef> {
        self.controllers.values().find_map(|c| {
            if c.admin_key == key {
                return Some(QueueRef {
                    cntlid: c.cntlid,
                    qid: 0,
                });
            }
            c.io_queues
                .iter()
                .find(|(_, &k)| k == key)
                .map(|(&qid, _)| QueueRef {
                    cntlid: c.cntlid,
                    qid,
                })
        })
    }

    fn try_connect(
        &mut self,
        now: Instant,
        key: QueueKey,
        origin: &QueueOrigin,
        sqe: &Sqe,
        cmd: &ConnectCommand,
        data: &[u8],
    ) -> Result<ConnectOk, ConnectError> {
        use RefusalReason as R;
        if !sqe.is_fabrics() || sqe.fctype() != opcodes::fabrics::CONNECT {
            return Err(ConnectError::plain(
                Status::COMMAND_SEQUENCE_ERROR,
                R::NotConnected,
            ));
        }
        // NVMe-oF 1.1 section 3.3: Connect is the first command on a queue and only that;
        // a second one (a host retrying, or a broken one) must not make a second
        // controller or a second queue out of one connection.
        if let Some(q) = self.queue_of_key(key) {
            return Err(
                ConnectError::plain(Status::COMMAND_SEQUENCE_ERROR, R::AlreadyConnected)
                    .on(q.cntlid),
            );
        }
        if cmd.recfmt != 0 {
            return Err(ConnectError::plain(
                Status::CONNECT_INCOMPATIBLE_FORMAT,
                R::IncompatibleFormat { recfmt: cmd.recfmt },
            ));
        }
        let d = ConnectData::from_bytes(data).ok_or(ConnectError::plain(
            Status::DATA_SGL_LENGTH_INVALID,
            R::ShortConnectData { len: data.len() },
        ))?;
        let invalid = Status::CONNECT_INVALID_PARAMETERS;
        let subnqn = d
            .subnqn()
            .filter(|n| fabrics::is_valid_nqn(n))
            .ok_or(ConnectError::data(
                invalid,
                data_off::SUBNQN,
                R::InvalidSubsystemNqn,
            ))?;
        // An empty Host NQN is what SPDK's spdk_nvme_perf sends when its -r option names
        // no hostnqn (its documentation's examples do not); SPDK's target accepts it for
        // subsystems that allow any host, and so do we (see below).
        let hostnqn = d
            .hostnqn()
            .filter(|n| n.is_empty() || fabrics::is_valid_nqn(n))
            .ok_or(ConnectError::data(
                invalid,
                data_off::HOSTNQN,
                R::InvalidHostNqn,
            ))?;
        let subsys = self.subsystems.get(subnqn).ok_or(ConnectError::data(
            invalid,
            data_off::SUBNQN,
            R::UnknownSubsystem,
        ))?;
        // A subsystem restricted to some listeners does not exist on the others: Linux
        // nvmet answers a Connect for a subsystem its port does not export with Connect
        // Invalid Parameters on SUBNQN, as for an unknown one. Discovery is on every port.
        let on_listener = subsys.is_discovery
            || subsys
                .cfg
                .listeners
                .as_ref()
                .is_none_or(|ls| origin.listener.as_ref().is_some_and(|l| ls.contains(l)));
        if !on_listener {
            return Err(ConnectError::data(
                invalid,
                data_off::SUBNQN,
                R::SubsystemNotOnListener,
            ));
        }
        // A TLS PSK is for one host and one subsystem (its identity names both; TP 8011):
        // a queue may not use one host's PSK to connect as another.
        if let Some(peer) = self.queue_tls.get(&key) {
            if peer.hostnqn != hostnqn || peer.subnqn != subnqn {
                return Err(ConnectError::data(
                    Status::CONNECT_INVALID_HOST,
                    data_off::HOSTNQN,
                    R::TlsIdentityMismatch {
                        identity: peer.identity.clone(),
                    },
                ));
            }
        }
        if !subsys.allows(hostnqn) {
            let reason = if hostnqn.is_empty() {
                R::EmptyHostNqnNotAllowed
            } else {
                R::HostNotAllowed
            };
            return Err(ConnectError::data(
                Status::CONNECT_INVALID_HOST,
                data_off::HOSTNQN,
                reason,
            ));
        }
        let is_discovery = subsys.is_discovery;
        // A queue over TLS with a PSK that DH-HMAC-CHAP generated (secure channel
        // concatenation) has proven the host already.
        let generated_tls = self.queue_tls.get(&key).is_some_and(|p| p.generated);
        let auth_required = !generated_tls
            && self
                .auth_needed(subnqn, hostnqn, is_discovery)
                .map_err(|r| {
                    ConnectError::data(Status::CONNECT_INVALID_HOST, data_off::HOSTNQN, r)
                })?;
        let ok = ConnectOk {
            cntlid: 0,
            qid: cmd.qid,
            sqsize: cmd.sqsize,
            disable_sq_flow_control: cmd.cattr & fabrics::CATTR_DISABLE_SQ_FLOW_CONTROL != 0,
            subnqn: subnqn.to_string(),
            hostnqn: hostnqn.to_string(),
            is_discovery,
            authentication_required: auth_required,
            access: AccessKey::default(),
        };
        let cntlid = d.cntlid.get();
        if cmd.qid == 0 {
            if cntlid != fabrics::CNTLID_DYNAMIC {
                return Err(ConnectError::data(
                    invalid,
                    data_off::CNTLID,
                    R::StaticControllerId { cntlid },
                ));
            }
            // Any non-zero size up to the 4096 entries an admin queue can have: nvmet
            // accepts every non-zero SQSIZE here, SPDK's host asks for 2..=4096 entries.
            if cmd.sqsize == 0 || cmd.sqsize > MAX_ADMIN_SQSIZE {
                return Err(ConnectError::sqe(
                    sqe_off::SQSIZE,
                    R::AdminQueueSize {
                        sqsize: cmd.sqsize,
                        max: MAX_ADMIN_SQSIZE,
                    },
                ));
            }
            let cntlid = self.allocate_cntlid().ok_or(ConnectError::plain(
                Status::CONNECT_CONTROLLER_BUSY,
                R::ControllerIdsExhausted,
            ))?;
            if hostnqn.is_empty() && self.empty_hostnqn_seen.insert(subnqn.to_string()) {
                self.notice(Notice::EmptyHostNqnAccepted {
                    subnqn: subnqn.to_string(),
                    key,
                });
            }
            let host = self.host_slot(hostnqn, 1);
            let port = origin
                .listener
                .as_ref()
                .and_then(|l| self.listeners.iter().find(|(_, x)| x == l))
                .map_or(0, |(p, _)| *p);
            let access = AccessKey {
                host_id: d.hostid,
                host,
                port,
            };
            let mut ctrl = Controller {
                cntlid,
                subnqn: subnqn.to_string(),
                hostnqn: hostnqn.to_string(),
                hostid: d.hostid,
                is_discovery,
                admin_key: key,
                io_queues: BTreeMap::new(),
                origin: origin.clone(),
                retired: false,
                retired_since: None,
                admin_closed: false,
                ns_error_recovery: BTreeMap::new(),
                cc: 0,
                csts: 0,
                closing_io: BTreeSet::new(),
                kato_ms: kato_granular(cmd.kato),
                deadline: None,
                features: Features::defaults(self.opts.max_io_queues),
                aers: VecDeque::new(),
                pending_events: VecDeque::new(),
                masked: 0,
                changed_ns: Vec::new(),
                changed_ns_overflow: false,
                error_log: VecDeque::new(),
                error_count: 0,
                auth_required,
                queue_auth: BTreeMap::new(),
                access,
                resv_log: VecDeque::new(),
                resv_log_count: 0,
                resv_masks: BTreeMap::new(),
                resv_mask_default: 0,
                aborts: 0,
            };
            if auth_required {
                ctrl.queue_auth.insert(0, authn::QueueAuth::new(now));
            }
            ctrl.restart_keep_alive(now, &self.opts);
            self.controllers.insert(cntlid, ctrl);
            return Ok(ConnectOk {
                cntlid,
                access,
                ..ok
            });
        }
        if is_discovery {
            return Err(ConnectError::sqe(sqe_off::QID, R::IoQueueOnDiscovery));
        }
        let mqes = self.opts.max_queue_depth.saturating_sub(1);
        // Found by SUBNQN + HOSTNQN + CNTLID, as nvmet and SPDK do: user-space hosts that
        // make a new HOSTID per connection still reach their controller, whose HOSTID
        // stays the admin queue's (the one reservations will key on).
        let ctrl = self
            .controllers
            .get_mut(&cntlid)
            .filter(|c| !c.retired && c.subnqn == subnqn && c.hostnqn == hostnqn)
            .ok_or(ConnectError::data(
                invalid,
                data_off::CNTLID,
                R::UnknownController { cntlid },
            ))?;
        if !ctrl.enabled() {
            return Err(ConnectError::plain(
                Status::COMMAND_SEQUENCE_ERROR,
                R::ControllerNotEnabled,
            )
            .on(cntlid));
        }
        if cmd.qid > ctrl.features.io_queues {
            let max = ctrl.features.io_queues;
            return Err(ConnectError::sqe(
                sqe_off::QID,
                R::QueueIdOutOfRange { qid: cmd.qid, max },
            )
            .on(cntlid));
        }
        if ctrl.io_queues.contains_key(&cmd.qid) {
            return Err(ConnectError::plain(
                Status::COMMAND_SEQUENCE_ERROR,
                R::QueueIdInUse { qid: cmd.qid },
            )
            .on(cntlid));
        }
        if cmd.sqsize == 0 || cmd.sqsize > mqes {
            return Err(ConnectError::sqe(
                sqe_off::SQSIZE,
                R::IoQueueSize {
                    sqsize: cmd.sqsize,
                    max: mqes,
                },
            )
            .on(cntlid));
        }
        ctrl.io_queues.insert(cmd.qid, key);
        // Every queue of a controller that authenticates authenticates (the credentials
        // may have changed since the admin queue connected: the controller's rule holds),
        // except over a concatenated secure channel.
        let authentication_required = ctrl.auth_required && !generated_tls;
        if authentication_required {
            ctrl.queue_auth.insert(cmd.qid, authn::QueueAuth::new(now));
        } else {
            ctrl.queue_auth.remove(&cmd.qid);
        }
        Ok(ConnectOk {
            cntlid,
            authentication_required,
            access: ctrl.access,
            ..ok
        })
    }

    /// A command of controller `cntlid` refused for `reason` (answered `status`): a
    /// notice naming the host and subsystem.
    fn refused_command(&mut self, cntlid: u16, status: Status, reason: RefusalReason) {
        let Some(c) = self.controllers.get(&cntlid) else {
            return;
        };
        let n = Notice::Refused(Refusal {
            reason,
            key: c.admin_key,
            hostnqn: Some(c.hostnqn.clone()),
            subnqn: Some(c.subnqn.clone()),
            cntlid: Some(cntlid),
            qid: None,
            status: Some(status),
        });
        self.notice(n);
    }

    fn notice(&mut self, n: Notice) {
        if self.notices.len() < NOTICE_LIMIT {
            self.notices.push(n);
        } else {
            self.notices_dropped += 1;
        }
    }

    /// Commands the engine answered with an error by itself (the target never saw them):
    /// into their controllers' Error Information logs. Those of controllers gone are
    /// dropped.
    pub fn record_engine_errors(&mut self, errors: &[(QueueRef, CommandError)]) {
        for (q, e) in errors {
            if let Some(c) = self.controllers.get_mut(&q.cntlid) {
                c.record_error(q.qid, e);
            }
        }
    }

    /// Refusals and other news since the last call (see [`Notice`]), oldest first, and
    /// how many were dropped because the queue was full ([`NOTICE_LIMIT`] kept).
    pub fn take_notices(&mut self) -> (Vec<Notice>, u64) {
        (
            std::mem::take(&mut self.notices),
            std::mem::take(&mut self.notices_dropped),
        )
    }

    fn allocate_cntlid(&mut self) -> Option<u16> {
        for _ in 0..MAX_CNTLID {
            let id = self.next_cntlid;
            self.next_cntlid = if id >= MAX_CNTLID { 1 } else { id + 1 };
            if !self.controllers.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }

    /// Any other capsule on a connected queue (admin or I/O). `data` is the command's
    /// buffer: host data already in it for host-to-controller commands, filled here for
    /// controller-to-host ones (it must be at least as long as the transfer).
    pub fn execute(
        &mut self,
        now: Instant,
        queue: QueueRef,
        sqe: &Sqe,
        data: &mut [u8],
        counters: &dyn CounterSource,
    ) -> Outcome {
        self.started.get_or_insert(now);
        let result = self.dispatch(now, queue, sqe, data, counters);
        let cid = sqe.cid();
        match result {
            Ok(Reply::Held) => Outcome::Deferred,
            Ok(Reply::Dropped) => Outcome::Dropped,
            Ok(Reply::Done { dw0, dw1, data_len }) => Outcome::Complete {
                cqe: Cqe {
                    dw0,
                    dw1,
                    sqid: queue.qid,
                    ..Cqe::success(cid)
                },
                data_len,
            },
            Err(status) => {
                if let Some(c) = self.controllers.get_mut(&queue.cntlid) {
                    c.record_error(queue.qid, &CommandError::of(sqe, queue.qid, status));
                }
                Outcome::Complete {
                    cqe: Cqe {
                        sqid: queue.qid,
                        ..Cqe::new(cid, status)
                    },
                    data_len: 0,
                }
            }
        }
    }

    fn dispatch(
        &mut self,
        now: Instant,
        queue: QueueRef,
        sqe: &Sqe,
        data: &mut [u8],
        counters: &dyn CounterSource,
    ) -> Result<Reply, Status> {
        let ctrl = self
            .controllers
            .get_mut(&queue.cntlid)
            .ok_or(Status::COMMAND_SEQUENCE_ERROR)?;
        if ctrl.retired {
            return Ok(Reply::Dropped);
        }
        if queue.qid != 0 && !ctrl.io_queues.contains_key(&queue.qid) {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        }
        if authn::is_auth_command(sqe) {
            return self.auth_command(now, queue, sqe, data);
        }
        // Until the queue has authenticated, nothing but authentication (NVMe Base 2.0
        // section 8.13.1; nvmet answers the same status).
        if !ctrl.queue_may_run(queue.qid) {
            let (key, hostnqn, subnqn) =
                (ctrl.admin_key, ctrl.hostnqn.clone(), ctrl.subnqn.clone());
            self.notice(Notice::Refused(Refusal {
                reason: RefusalReason::AuthenticationRequired {
                    opcode: sqe.opcode(),
                },
                key,
                hostnqn: Some(hostnqn),
                subnqn: Some(subnqn),
                cntlid: Some(queue.cntlid),
                qid: Some(queue.qid),
                status: Some(Status::AUTHENTICATION_REQUIRED),
            }));
            return Err(Status::AUTHENTICATION_REQUIRED);
        }
        let ctrl = self
            .controllers
            .get_mut(&queue.cntlid)
            .ok_or(Status::COMMAND_SEQUENCE_ERROR)?;
        if sqe.is_fabrics() {
            return match sqe.fctype() {
                opcodes::fabrics::PROPERTY_GET if queue.qid == 0 => {
                    property_get(ctrl, sqe, &self.opts)
                }
                opcodes::fabrics::PROPERTY_SET if queue.qid == 0 => {
                    property_set(ctrl, sqe, &self.opts, &mut self.actions, &mut self.notices)
                }
                opcodes::fabrics::CONNECT => Err(Status::COMMAND_SEQUENCE_ERROR),
                // Disconnect deletes the I/O queue it arrives on (NVMe-oF 1.1 section
                // 3.5; OFCS bit 0 advertises it). On the admin queue the spec's answer is
                // Invalid Queue Type, and the association stays (Linux nvmet and SPDK,
                // which do not implement Disconnect, answer Invalid Opcode: also an
                // error that leaves everything in place).
                opcodes::fabrics::DISCONNECT if queue.qid == 0 => Err(Status::INVALID_QUEUE_TYPE),
                opcodes::fabrics::DISCONNECT => {
                    // The QID is free at once: a host may connect it again before the
                    // transport has closed this connection.
                    if let Some(key) = ctrl.io_queues.remove(&queue.qid) {
                        ctrl.queue_auth.remove(&queue.qid);
                        self.actions.push(Action::Disconnect { queue, key });
                    }
                    Reply::ok()
                }
                _ => Err(Status::INVALID_OPCODE),
            };
        }
        if !ctrl.enabled() {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        }
        if queue.qid == 0 {
            admin::execute(self, now, queue.cntlid, sqe, data, counters)
        } else {
            io::execute(self, queue.cntlid, sqe, data)
        }
    }

    /// The transport lost this queue (socket closed, QP error, Disconnect done). When
    /// the admin queue goes the association is over: the controller is retired (its I/O
    /// queues come back as [`Action::Disconnect`], commands still arriving on them get no
    /// answer) and destroyed once its last queue is reported closed. Unknown queues
    /// (already torn down) are ignored.
    pub fn queue_closed(&mut self, queue: QueueRef, key: QueueKey) -> Vec<Action> {
        self.queue_tls.remove(&key);
        let mut abandoned = None;
        if let Some(c) = self.controllers.get_mut(&queue.cntlid) {
            let ours = if queue.qid == 0 {
                c.admin_key == key && !c.admin_closed
            } else {
                c.io_queues.get(&queue.qid) == Some(&key)
            };
            // A DH-HMAC-CHAP transaction begun and dropped with its queue counts against
            // the address (as of when it began), on any queue of
            // any controller: a discovery controller, which requires no authentication,
            // or an authenticated controller's I/O queue cost the same DH work. A host
            // that never began one (it has no secret) cost nothing; a retired controller
            // was counted when it failed or timed out.
            if let Some(qa) = c
                .queue_auth
                .get(&queue.qid)
                .filter(|qa| ours && !c.retired && qa.tx.in_progress())
            {
                // When the transaction began (this call has no clock of its own).
                let began = qa.began.unwrap_or(qa.deadline - authn::AUTH_TIMEOUT);
                self.auth_strikes.strike(c.origin.peer, &c.hostnqn, began);
            }
            if queue.qid == 0 && ours {
                c.admin_closed = true;
                if !c.retired && !c.queue_may_run(0) {
                    abandoned = Some((c.hostnqn.clone(), c.subnqn.clone()));
                }
                if !c.retired {
                    c.retired = true;
                    c.deadline = None;
                    c.aers.clear();
                    c.pending_events.clear();
                    self.actions.extend(c.io_queue_disconnects());
                }
            } else if queue.qid != 0 && c.io_queues.get(&queue.qid) == Some(&key) {
                c.io_queues.remove(&queue.qid);
                c.queue_auth.remove(&queue.qid);
            }
            c.closing_io.remove(&key);
            if c.admin_closed && c.io_queues.is_empty() {
                let hostnqn = std::mem::take(&mut c.hostnqn);
                self.controllers.remove(&queue.cntlid);
                self.release_host_slot(&hostnqn);
            }
        }
        if let Some((hostnqn, subnqn)) = abandoned {
            self.notice(Notice::Refused(Refusal {
                reason: RefusalReason::AuthenticationAbandoned,
                key,
                hostnqn: Some(hostnqn),
                subnqn: Some(subnqn),
                cntlid: Some(queue.cntlid),
                qid: Some(0),
                status: None,
            }));
        }
        self.take_actions()
    }

    /// Keep alive: controllers whose KATO expired at `now` are retired (all their queues
    /// come back as [`Action::Disconnect`], and a [`Notice`] says why); so are those with
    /// a queue that did not authenticate within [`AUTH_TIMEOUT`]. Retired
    /// controllers whose admin queue the transport has not reported closed within
    /// [`RETIRED_LIMIT`] are dropped.
    pub fn poll_timeouts(&mut self, now: Instant) -> Vec<Action> {
        let expired: Vec<(u16, u32, QueueKey, String, String)> = self
            .controllers
            .values()
            .filter(|c| !c.retired && c.deadline.is_some_and(|d| d <= now))
            .map(|c| {
                (
                    c.cntlid,
                    c.effective_kato_ms(&self.opts),
                    c.admin_key,
                    c.hostnqn.clone(),
                    c.subnqn.clone(),
                )
            })
            .collect();
        for (cntlid, kato_ms, key, hostnqn, subnqn) in expired {
            self.notice(Notice::Refused(Refusal {
                reason: RefusalReason::KeepAliveExpired { kato_ms },
                key,
                hostnqn: Some(hostnqn),
                subnqn: Some(subnqn),
                cntlid: Some(cntlid),
                qid: Some(0),
                status: None,
            }));
            self.retire_controllers_where(|c| c.cntlid == cntlid);
        }
        self.poll_auth_timeouts(now);
        for c in self.controllers.values_mut().filter(|c| c.retired) {
            c.retired_since.get_or_insert(now);
        }
        let mut gone = Vec::new();
        self.controllers.retain(|_, c| {
            let keep = c
                .retired_since
                .is_none_or(|t| now.saturating_duration_since(t) < RETIRED_LIMIT);
            if !keep {
                gone.push(std::mem::take(&mut c.hostnqn));
            }
            keep
        });
        for hostnqn in gone {
            self.release_host_slot(&hostnqn);
        }
        self.take_actions()
    }

    /// The earliest keep-alive or authentication deadline (or retirement limit), for the
    /// caller's timer.
    pub fn next_timeout(&self) -> Option<Instant> {
        let keep_alive = self
            .controllers
            .values()
            .filter_map(|c| {
                if c.retired {
                    c.retired_since.map(|t| t + RETIRED_LIMIT)
                } else {
                    c.deadline
                }
            })
            .min();
        match (keep_alive, self.next_auth_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Actions produced since the last call (AER completions after namespace changes,
    /// queue teardown on CC.EN=0, shutdown or Disconnect...).
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// Retires the controllers `pred` selects: every queue comes back as
    /// [`Action::Disconnect`], held AERs are forgotten (they go with the admin queue),
    /// the keep-alive timer stops, commands get no answer from now on.
    fn retire_controllers_where(&mut self, pred: impl Fn(&Controller) -> bool) {
        for c in self.controllers.values_mut() {
            if c.retired || !pred(c) {
                continue;
            }
            c.retired = true;
            c.deadline = None;
            c.aers.clear();
            c.pending_events.clear();
            self.actions.extend(c.all_queues());
        }
    }

    fn user_subsystem_mut(&mut self, nqn: &str) -> Result<&mut Subsystem, TargetError> {
        match self.subsystems.get_mut(nqn) {
            Some(s) if s.is_discovery => Err(TargetError::DiscoverySubsystem),
            Some(s) => Ok(s),
            None => Err(TargetError::UnknownSubsystem(nqn.to_string())),
        }
    }

    /// Namespace `nsid` changed for the hosts `affected` selects: their controllers get
    /// it in the Changed Namespace List and a Namespace Attribute Changed event.
    fn namespace_changed(&mut self, subnqn: &str, nsid: u32, affected: impl Fn(&str) -> bool) {
        for c in self
            .controllers
            .values_mut()
            .filter(|c| c.subnqn == subnqn && !c.retired && affected(&c.hostnqn))
        {
            if !c.changed_ns.contains(&nsid) {
                if c.changed_ns.len() >= crate::spec::identify::NamespaceList::CAPACITY {
                    c.changed_ns_overflow = true;
                } else {
                    c.changed_ns.push(nsid);
                    c.changed_ns.sort_unstable();
                }
            }
            c.raise(EventKind::NamespaceAttribute, &mut self.actions);
        }
    }

    /// The discovery log changed: bump GENCTR, notify discovery controllers that asked.
    fn discovery_changed(&mut self) {
        self.genctr += 1;
        for c in self
            .controllers
            .values_mut()
            .filter(|c| c.is_discovery && !c.retired)
        {
            c.raise(EventKind::DiscoveryLog, &mut self.actions);
        }
    }

    /// The interned number of `hostnqn` (a new one the first time), counting
    /// `controllers` more of its controllers; 0 is a namespace naming it.
    fn host_slot(&mut self, hostnqn: &str, controllers: u32) -> u64 {
        let next = &mut self.next_host_slot;
        let e = self
            .host_slots
            .entry(hostnqn.to_string())
            .or_insert_with(|| {
                let slot = *next;
                *next += 1;
                HostSlot {
                    slot,
                    controllers: 0,
                    named: false,
                }
            });
        e.controllers += controllers;
        e.named |= controllers == 0;
        e.slot
    }

    /// One controller of `hostnqn` is gone: its entry goes with its last controller
    /// unless a namespace names the host (any host NQN a peer made up would otherwise
    /// stay forever).
    fn release_host_slot(&mut self, hostnqn: &str) {
        let Some(e) = self.host_slots.get_mut(hostnqn) else {
            return;
        };
        e.controllers = e.controllers.saturating_sub(1);
        if self.host_slot_unused(hostnqn, &self.host_slots[hostnqn]) {
            self.host_slots.remove(hostnqn);
        }
    }

    /// Whether the interned `hostnqn` can go: no controller of it exists and no
    /// namespace names it. (Only a host some namespace named once can be named still:
    /// the others, any NQN a peer sends, cost no look through the configuration.)
    fn host_slot_unused(&self, hostnqn: &str, e: &HostSlot) -> bool {
        e.controllers == 0 && !(e.named && self.host_named(hostnqn))
    }

    /// Whether some namespace's `hosts` list names `hostnqn` (a lost namespace's too: it
    /// is still configured).
    fn host_named(&self, hostnqn: &str) -> bool {
        self.subsystems.values().any(|s| {
            s.namespaces.values().chain(s.lost.values()).any(|ns| {
                ns.hosts
                    .as_ref()
                    .is_some_and(|h| h.iter().any(|x| x == hostnqn))
            })
        })
    }

    /// Builds the access view of one namespace and queues it for the engine.
    fn publish(&mut self, subnqn: &str, nsid: u32) {
        let Some(hosts) = self
            .subsystems
            .get(subnqn)
            .and_then(|s| s.namespaces.get(&nsid))
            .map(|ns| ns.hosts.clone())
        else {
            return;
        };
        let visible = hosts.map(|hosts| hosts.iter().map(|h| self.host_slot(h, 0)).collect());
        let s = &self.subsystems[subnqn];
        let ns = &s.namespaces[&nsid];
        let ana = self
            .listeners
            .iter()
            .map(|(p, l)| (*p, s.ana.state(ns.group(), Some(l))))
            .collect();
        let view = NamespaceAccess::new(visible, ana, s.resv.get(&nsid));
        self.access_updates
            .insert((subnqn.to_string(), nsid), Arc::new(view));
    }

    /// Drops the interned NQNs no namespace names any more, of hosts without a
    /// controller (after a change to the namespaces or their `hosts`).
    fn forget_unnamed_hosts(&mut self) {
        let unused: Vec<String> = self
            .host_slots
            .iter()
            .filter(|(h, e)| self.host_slot_unused(h, e))
            .map(|(h, _)| h.clone())
            .collect();
        for h in unused {
            self.host_slots.remove(&h);
        }
    }

    fn publish_all(&mut self) {
        self.forget_unnamed_hosts();
        let all: Vec<(String, u32)> = self
            .subsystems
            .iter()
            .filter(|(_, s)| !s.is_discovery)
            .flat_map(|(n, s)| s.namespaces.keys().map(move |id| (n.clone(), *id)))
            .collect();
        for (n, id) in all {
            self.publish(&n, id);
        }
    }

    /// Access views built since the last call: hand each to the engine before sending
    /// the completion of the command that produced it.
    pub fn take_access_updates(&mut self) -> Vec<(String, u32, Arc<NamespaceAccess>)> {
        std::mem::take(&mut self.access_updates)
            .into_iter()
            .map(|((n, id), v)| (n, id, v))
            .collect()
    }

    /// Changes whenever state the PTPL file keeps changes (compare with the last one
    /// written).
    pub fn ptpl_version(&self) -> u64 {
        self.ptpl_version
    }

    /// The reservation state of every namespace whose PTPL state is on, with the
    /// version it belongs to.
    pub fn ptpl_snapshot(&self) -> (u64, Vec<PersistedReservation>) {
        let mut out = Vec::new();
        for (nqn, s) in &self.subsystems {
            for (nsid, r) in s.resv.iter().filter(|(_, r)| r.ptpl) {
                out.push(PersistedReservation {
                    subnqn: nqn.clone(),
                    nsid: *nsid,
                    state: r.clone(),
                });
            }
        }
        (self.ptpl_version, out)
    }

    /// A namespace's reservation state (registrants, holder, PTPL), if it has one.
    pub fn reservation(&self, subnqn: &str, nsid: u32) -> Option<PersistedReservation> {
        let s = self.subsystems.get(subnqn)?;
        let state = s.resv.get(&nsid)?.clone();
        Some(PersistedReservation {
            subnqn: subnqn.to_string(),
            nsid,
            state,
        })
    }

    /// Gives a namespace that was removed and added again (as the same namespace to
    /// hosts) the reservation state it had, [`Target::reservation`]: a fenced host stays
    /// fenced. State that persists is written again (its removal took it out of the file).
    pub fn carry_reservation(&mut self, p: PersistedReservation) -> Result<(), TargetError> {
        let ptpl = p.state.ptpl;
        self.restore_reservation(p)?;
        if ptpl {
            self.ptpl_version += 1;
        }
        Ok(())
    }

    /// Restores a namespace's reservation state from the PTPL file (at start-up, after
    /// the namespace was added). The engine gets the new access view.
    pub fn restore_reservation(&mut self, p: PersistedReservation) -> Result<(), TargetError> {
        let s = self.user_subsystem_mut(&p.subnqn)?;
        let r = s
            .resv
            .get_mut(&p.nsid)
            .ok_or(TargetError::UnknownNamespace(p.nsid))?;
        *r = p.state;
        self.publish(&p.subnqn, p.nsid);
        Ok(())
    }

    /// The engine answered an [`Action::Abort`]: complete the held Abort command with
    /// DW0 bit 0 clear if the command was aborted, set if it was not.
    pub fn abort_done(&mut self, abort: QueueRef, abort_cid: u16, aborted: bool) -> Vec<Action> {
        if let Some(c) = self.controllers.get_mut(&abort.cntlid) {
            c.aborts = c.aborts.saturating_sub(1);
            if !c.retired {
                self.actions.push(Action::CompleteHeld {
                    queue: QueueRef {
                        cntlid: abort.cntlid,
                        qid: 0,
                    },
                    key: c.admin_key,
                    cqe: Cqe {
                        dw0: (!aborted) as u32,
                        sqid: 0,
                        ..Cqe::success(abort_cid)
                    },
                });
            }
        }
        self.take_actions()
    }

    /// Delivers reservation notifications: a log page and an event for every controller
    /// of each host named, unless that controller masked the kind for the namespace.
    fn notify_reservation(&mut self, subnqn: &str, nsid: u32, notes: &[reservation::Notify]) {
        for n in notes {
            for c in self
                .controllers
                .values_mut()
                .filter(|c| c.subnqn == subnqn && !c.retired && c.hostid == n.host_id)
            {
                let mask = c
                    .resv_masks
                    .get(&nsid)
                    .copied()
                    .unwrap_or(c.resv_mask_default);
                if mask & n.kind.mask_bit() != 0 {
                    continue;
                }
                c.resv_log_count = c.resv_log_count.wrapping_add(1).max(1);
                if c.resv_log.len() < RESERVATION_LOG_LIMIT {
                    c.resv_log.push_back(NotificationEntry {
                        count: c.resv_log_count,
                        kind: n.kind as u8,
                        nsid,
                    });
                }
                c.raise(EventKind::ReservationLog, &mut self.actions);
            }
        }
    }
}

/// CAP.TO (and CRTO.CRWMT/CRIMT), in 500 ms units: RDY follows CC.EN at once, 10 s is
/// ample.
const READY_TIMEOUT_UNITS: u64 = 20;

/// CAP as this target reports it: CSS advertises the NVM command set (bit 0) and "one or
/// more I/O command sets" (bit 6), as Linux nvmet does, so hosts may enable with CC.CSS
/// 000b or 110b.
fn cap_value(opts: &TargetOptions) -> u64 {
    use fabrics::cap;
    let mqes = opts.max_queue_depth.saturating_sub(1).max(1) as u64;
    mqes & cap::MQES_MASK
        | cap::CQR
        | READY_TIMEOUT_UNITS << cap::TO_SHIFT
        | cap::CSS_NVM
        | cap::CSS_IOCS
}

const VERSION_1_4: u32 = 0x0001_0400;

fn property_get(ctrl: &Controller, sqe: &Sqe, opts: &TargetOptions) -> Result<Reply, Status> {
    use fabrics::property;
    let p = fabrics::PropertyCommand::from_sqe(sqe);
    if p.attrib & !1 != 0 {
        return Err(Status::INVALID_FIELD);
    }
    let value: u64 = match (p.offset, p.is_8_bytes()) {
        (property::CAP, true) => cap_value(opts),
        (property::VS, false) => VERSION_1_4 as u64,
        (property::CC, false) => ctrl.cc as u64,
        (property::CSTS, false) => ctrl.csts_now() as u64,
        // CRTO: CRWMT (15:0) and CRIMT (31:16) in 500 ms units. CAP.TO shall be
        // min(CRWMT, FFh) (NVMe Base 2.0, CAP.TO), so both say what CAP.TO says.
        (property::CRTO, false) => READY_TIMEOUT_UNITS | READY_TIMEOUT_UNITS << 16,
        _ => return Err(Status::INVALID_FIELD),
    };
    Ok(Reply::Done {
        dw0: value as u32,
        dw1: (value >> 32) as u32,
        data_len: 0,
    })
}

/// The first CC field a controller of this kind cannot run with, by name and value.
fn unsupported_cc_field(new: u32, is_discovery: bool) -> Option<(&'static str, u32)> {
    // CAP.CSS advertises bit 0 and bit 6: CC.CSS 000b (NVM) and 110b (all supported I/O
    // command sets, what NVMe 2.0 hosts such as SPDK's choose when CAP.CSS bit 6 is set).
    if !matches!(
        cc::css(new),
        fabrics::cc::CSS_NVM | fabrics::cc::CSS_ALL_IOCS
    ) {
        return Some(("CC.CSS", cc::css(new)));
    }
    if cc::mps(new) != 0 {
        return Some(("CC.MPS", cc::mps(new)));
    }
    if cc::ams(new) != 0 {
        return Some(("CC.AMS", cc::ams(new)));
    }
    // A discovery controller has no I/O queues: hosts leave IOSQES/IOCQES 0 there
    // (nvmet checks them only for I/O controllers, for the same reason).
    if !is_discovery {
        if cc::iosqes(new) != 6 {
            return Some(("CC.IOSQES", cc::iosqes(new)));
        }
        if cc::iocqes(new) != 4 {
            return Some(("CC.IOCQES", cc::iocqes(new)));
        }
    }
    None
}

fn property_set(
    ctrl: &mut Controller,
    sqe: &Sqe,
    opts: &TargetOptions,
    actions: &mut Vec<Action>,
    notices: &mut Vec<Notice>,
) -> Result<Reply, Status> {
    let p = fabrics::PropertyCommand::from_sqe(sqe);
    if p.attrib != 0 || p.offset != fabrics::property::CC {
        return Err(Status::INVALID_FIELD);
    }
    let new = p.value as u32;
    let old = ctrl.cc;
    ctrl.cc = new;
    if new & cc::EN != 0 && old & cc::EN == 0 {
        // What this controller can do: NVM command set, 4 KiB pages, round robin,
        // 64-byte SQEs and 16-byte CQEs. Anything else is a fatal configuration.
        match unsupported_cc_field(new, ctrl.is_discovery) {
            None => ctrl.csts = csts::RDY,
            Some((field, value)) => {
                ctrl.csts = csts::CFS;
                if notices.len() < NOTICE_LIMIT {
                    notices.push(Notice::Refused(Refusal {
                        reason: RefusalReason::InvalidControllerConfiguration { field, value },
                        key: ctrl.admin_key,
                        hostnqn: Some(ctrl.hostnqn.clone()),
                        subnqn: Some(ctrl.subnqn.clone()),
                        cntlid: Some(ctrl.cntlid),
                        qid: Some(0),
                        status: None,
                    }));
                }
            }
        }
    } else if new & cc::EN == 0 && old & cc::EN != 0 {
        let io_queues = ctrl.io_queues.len();
        ctrl.reset(opts.max_io_queues, actions);
        ctrl.csts = 0;
        if notices.len() < NOTICE_LIMIT {
            notices.push(Notice::ControllerReset(ControllerReset {
                key: ctrl.admin_key,
                hostnqn: ctrl.hostnqn.clone(),
                subnqn: ctrl.subnqn.clone(),
                cntlid: ctrl.cntlid,
                io_queues,
            }));
        }
    }
    if cc::shn(new) != 0 && cc::shn(old) == 0 {
        ctrl.reset(opts.max_io_queues, actions);
        ctrl.csts = (ctrl.csts & !csts::SHST_MASK) | csts::SHST_COMPLETE;
    } else if cc::shn(new) == 0 {
        ctrl.csts &= !csts::SHST_MASK;
    }
    Reply::ok()
}
