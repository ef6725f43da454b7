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
//!   freshly freed ID is not reused at once. I/O queue Connects name that CNTLID.
//! - The discovery subsystem `nqn.2014-08.org.nvmexpress.discovery` always exists; any
//!   host may connect to it, and its log shows each host only the subsystems it may use.
//! - Every method that returns `Vec<Action>` also drains the pending actions, so callers
//!   that use those methods and [`Target::take_actions`] after `execute`, `connect` and
//!   the namespace calls never miss one.
//!
//! # Implemented (NVMe Base 2.0, NVM Command Set 1.0, NVMe-oF 1.1)
//!
//! - Fabrics: Connect (admin and I/O, IATTR/IPO on Connect Invalid Parameters), Property
//!   Get/Set (CAP, VS, CC, CSTS, CRTO), Disconnect.
//! - Controller: CC.EN enable/reset, CC.SHN shutdown, CSTS.RDY/CFS/SHST, keep alive with
//!   KATO (command based; Traffic Based Keep Alive is not advertised).
//! - Admin: Identify CNS 00h/01h/02h/03h/05h/06h/07h/08h; Get Log Page 01h/02h/03h/04h/
//!   05h/70h with LPO/NUMD; Get/Set Features 01h, 02h, 04h, 05h, 06h, 07h, 08h, 09h, 0Ah,
//!   0Bh, 0Fh, 81h; Keep Alive; Asynchronous Event Request (namespace attribute and
//!   discovery log change notices); Abort (never aborts).
//! - I/O commands that are not offloaded: Invalid Namespace / Invalid Opcode answers.
//!
//! # Not implemented
//!
//! Authentication (Connect never sets AUTHREQ), TLS, the static controller model,
//! reservations, ANA, namespace management/attachment, firmware download/commit, format,
//! sanitize, self-test, telemetry, saveable features, SMART/temperature events,
//! per-listener access checks on Connect (the Connect path does not know the listener;
//! listeners only shape the discovery log), referrals.

mod admin;
mod discovery;
pub mod report;
#[cfg(test)]
mod tests;

use crate::spec::fabrics::{
    self, cc, connect_data_offset as data_off, connect_sqe_offset as sqe_off, csts, ConnectCommand,
    ConnectData,
};
use crate::spec::log::ErrorInformationEntry;
use crate::spec::{opcodes, Cqe, Sqe, Status};
use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The well-known discovery subsystem NQN (NVMe Base 2.0 section 4.5).
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Admin queue size every controller accepts (ASQSZ, the spec's minimum).
pub const ADMIN_QUEUE_ENTRIES: u16 = 32;
/// Highest CNTLID of the dynamic model (FFF0h-FFFFh are reserved).
const MAX_CNTLID: u16 = 0xffef;
/// Error Information log entries kept per controller (ELPE + 1).
const ERROR_LOG_ENTRIES: usize = 64;
/// Asynchronous Event Requests a controller holds at once (AERL + 1).
const AER_LIMIT: usize = 4;

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
}

impl Default for TargetOptions {
    fn default() -> Self {
        TargetOptions {
            max_queue_depth: 128,
            max_io_queues: 64,
            mdts: 5,
            ioccsz_bytes: 8192,
            max_namespaces: 1024,
            kato_default_ms: 120_000,
            firmware_revision: env!("CARGO_PKG_VERSION").to_string(),
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
}

/// Opaque to nvmf: the transport's name for a queue (thread index, QP handle...).
pub type QueueKey = u64;

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
    pub is_discovery: bool,
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
}

/// Live I/O counters of one namespace, for the SMART / Health log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounters {
    pub read_cmds: u64,
    pub write_cmds: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
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
    is_discovery: bool,
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
    interrupt_coalescing: u32,
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
            interrupt_coalescing: 0,
            write_atomicity: 0,
            async_event_config: 0,
        }
    }
}

/// Event kinds that are masked once reported until the host reads their log page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventKind {
    NamespaceAttribute,
    DiscoveryLog,
}

struct Controller {
    cntlid: u16,
    subnqn: String,
    hostnqn: String,
    hostid: [u8; 16],
    is_discovery: bool,
    admin_key: QueueKey,
    io_queues: BTreeMap<u16, QueueKey>,
    cc: u32,
    csts: u32,
    /// KATO as the host set it (Connect or Set Features 0Fh), milliseconds.
    kato_ms: u32,
    /// Keep-alive deadline, `None` when the timer is off.
    deadline: Option<Instant>,
    features: Features,
    /// CIDs of held Asynchronous Event Requests, oldest first.
    aers: VecDeque<u16>,
    /// Event CQE DW0 values waiting for an AER.
    pending_events: VecDeque<u32>,
    masked_ns_attr: bool,
    masked_discovery: bool,
    changed_ns: Vec<u32>,
    changed_ns_overflow: bool,
    error_log: VecDeque<ErrorInformationEntry>,
    error_count: u64,
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
    /// Queues an event for the host unless its kind is masked; completes a held AER
    /// if there is one.
    fn raise(&mut self, kind: EventKind, dw0: u32, actions: &mut Vec<Action>) {
        let masked = match kind {
            EventKind::NamespaceAttribute => &mut self.masked_ns_attr,
            EventKind::DiscoveryLog => &mut self.masked_discovery,
        };
        if *masked {
            return;
        }
        *masked = true;
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
    fn record_error(&mut self, qid: u16, sqe: &Sqe, status: Status) {
        self.error_count += 1;
        let entry = ErrorInformationEntry {
            error_count: self.error_count.into(),
            sqid: qid.into(),
            cid: sqe.cid().into(),
            status: status.to_field().into(),
            parameter_error_location: 0xffffu16.into(),
            nsid: sqe.nsid.into(),
            ..Default::default()
        };
        self.error_log.push_front(entry);
        self.error_log.truncate(ERROR_LOG_ENTRIES);
    }
    /// CC.EN 1 -> 0 or shutdown: I/O queues go, held AERs and pending events are
    /// dropped, features return to their defaults.
    fn reset(&mut self, max_io_queues: u16, actions: &mut Vec<Action>) {
        actions.extend(self.io_queue_disconnects());
        self.io_queues.clear();
        self.aers.clear();
        self.pending_events.clear();
        self.masked_ns_attr = false;
        self.masked_discovery = false;
        self.features = Features::defaults(max_io_queues);
    }
}

/// Result of a command handler: the completion's DW0 and data length, or held.
enum Reply {
    Done { dw0: u32, dw1: u32, data_len: u32 },
    Held,
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

/// A failed Connect: status and response DW0 (IATTR/IPO for Invalid Parameters).
struct ConnectError(Status, u32);

impl ConnectError {
    fn data(status: Status, offset: u16) -> ConnectError {
        ConnectError(status, fabrics::invalid_parameter_dw0(true, offset))
    }
    fn sqe(offset: u16) -> ConnectError {
        ConnectError(
            Status::CONNECT_INVALID_PARAMETERS,
            fabrics::invalid_parameter_dw0(false, offset),
        )
    }
    fn plain(status: Status) -> ConnectError {
        ConnectError(status, 0)
    }
}

/// Subsystems, listeners and controllers of one target. See the module docs.
pub struct Target {
    opts: TargetOptions,
    /// Listeners with their discovery PORTID, in the order they were added.
    listeners: Vec<(u16, ListenerInfo)>,
    next_portid: u16,
    subsystems: BTreeMap<String, Subsystem>,
    controllers: BTreeMap<u16, Controller>,
    next_cntlid: u16,
    /// Discovery log generation counter, bumped on every change to what it shows.
    genctr: u64,
    actions: Vec<Action>,
    /// First time seen, for SMART power-on hours.
    started: Option<Instant>,
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
                is_discovery: true,
            },
        );
        Target {
            opts,
            listeners: Vec::new(),
            next_portid: 1,
            subsystems,
            controllers: BTreeMap::new(),
            next_cntlid: 1,
            genctr: 0,
            actions: Vec::new(),
            started: None,
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
    }

    /// Removes a listener from the discovery log. Connected queues are the transport's
    /// business and are not touched.
    pub fn remove_listener(&mut self, l: &ListenerInfo) {
        let before = self.listeners.len();
        self.listeners.retain(|(_, x)| x != l);
        if self.listeners.len() != before {
            self.discovery_changed();
        }
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
                is_discovery: false,
            },
        );
        self.discovery_changed();
        Ok(())
    }

    /// Removes a subsystem; all its controllers are destroyed and their queues returned
    /// as [`Action::Disconnect`]. Unknown NQNs and the discovery subsystem are ignored.
    pub fn remove_subsystem(&mut self, nqn: &str) -> Vec<Action> {
        if nqn == DISCOVERY_NQN || self.subsystems.remove(nqn).is_none() {
            return self.take_actions();
        }
        self.destroy_controllers_where(|c| c.subnqn == nqn);
        self.discovery_changed();
        self.take_actions()
    }

    /// Replaces a subsystem's allow list; controllers of hosts no longer allowed are
    /// destroyed (their queues come back as [`Action::Disconnect`]).
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
            self.destroy_controllers_where(|c| gone.contains(&c.cntlid));
            self.discovery_changed();
        }
        self.take_actions()
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
        if s.namespaces.contains_key(&nsid) {
            return Err(TargetError::DuplicateNamespace(nsid));
        }
        s.namespaces.insert(nsid, ns);
        self.namespace_changed(subnqn, nsid);
        Ok(())
    }

    /// Removes a namespace, with the same notifications as [`Target::add_namespace`].
    pub fn remove_namespace(&mut self, subnqn: &str, nsid: u32) -> Result<(), TargetError> {
        let s = self.user_subsystem_mut(subnqn)?;
        if s.namespaces.remove(&nsid).is_none() {
            return Err(TargetError::UnknownNamespace(nsid));
        }
        self.namespace_changed(subnqn, nsid);
        Ok(())
    }

    /// The subsystem NQN of a live controller.
    pub fn subsystem_of(&self, cntlid: u16) -> Option<&str> {
        self.controllers.get(&cntlid).map(|c| c.subnqn.as_str())
    }

    /// Fabrics Connect on a new queue: `data` is the 1024-byte Connect data. On success
    /// CQE DW0 holds the CNTLID; on Connect Invalid Parameters/Host it holds IATTR/IPO.
    pub fn connect(
        &mut self,
        now: Instant,
        key: QueueKey,
        sqe: &Sqe,
        data: &[u8],
    ) -> (Cqe, Option<ConnectOk>) {
        self.started.get_or_insert(now);
        let cmd = ConnectCommand::from_sqe(sqe);
        match self.try_connect(now, key, sqe, &cmd, data) {
            Ok(ok) => {
                let mut cqe = Cqe {
                    dw0: ok.cntlid as u32,
                    sqid: ok.qid,
                    ..Cqe::success(sqe.cid())
                };
                if ok.disable_sq_flow_control {
                    cqe.sqhd = 0xffff;
                }
                (cqe, Some(ok))
            }
            Err(ConnectError(status, dw0)) => (
                Cqe {
                    dw0,
                    sqid: cmd.qid,
                    ..Cqe::new(sqe.cid(), status)
                },
                None,
            ),
        }
    }

    fn try_connect(
        &mut self,
        now: Instant,
        key: QueueKey,
        sqe: &Sqe,
        cmd: &ConnectCommand,
        data: &[u8],
    ) -> Result<ConnectOk, ConnectError> {
        if !sqe.is_fabrics() || sqe.fctype() != opcodes::fabrics::CONNECT {
            return Err(ConnectError::plain(Status::COMMAND_SEQUENCE_ERROR));
        }
        if cmd.recfmt != 0 {
            return Err(ConnectError::plain(Status::CONNECT_INCOMPATIBLE_FORMAT));
        }
        let d = ConnectData::from_bytes(data)
            .ok_or(ConnectError::plain(Status::DATA_SGL_LENGTH_INVALID))?;
        let invalid = Status::CONNECT_INVALID_PARAMETERS;
        let subnqn = d
            .subnqn()
            .filter(|n| fabrics::is_valid_nqn(n))
            .ok_or(ConnectError::data(invalid, data_off::SUBNQN))?;
        let hostnqn = d
            .hostnqn()
            .filter(|n| fabrics::is_valid_nqn(n))
            .ok_or(ConnectError::data(invalid, data_off::HOSTNQN))?;
        let subsys = self
            .subsystems
            .get(subnqn)
            .ok_or(ConnectError::data(invalid, data_off::SUBNQN))?;
        if !subsys.allows(hostnqn) {
            return Err(ConnectError::data(
                Status::CONNECT_INVALID_HOST,
                data_off::HOSTNQN,
            ));
        }
        let is_discovery = subsys.is_discovery;
        let ok = ConnectOk {
            cntlid: 0,
            qid: cmd.qid,
            sqsize: cmd.sqsize,
            disable_sq_flow_control: cmd.cattr & fabrics::CATTR_DISABLE_SQ_FLOW_CONTROL != 0,
            subnqn: subnqn.to_string(),
            is_discovery,
        };
        let cntlid = d.cntlid.get();
        if cmd.qid == 0 {
            if cntlid != fabrics::CNTLID_DYNAMIC {
                return Err(ConnectError::data(invalid, data_off::CNTLID));
            }
            // At least the 32 entries the spec requires; more (up to MQES) is tolerated
            // for hosts that size the admin queue like an I/O queue.
            let max = (ADMIN_QUEUE_ENTRIES - 1).max(self.opts.max_queue_depth.saturating_sub(1));
            if cmd.sqsize < ADMIN_QUEUE_ENTRIES - 1 || cmd.sqsize > max {
                return Err(ConnectError::sqe(sqe_off::SQSIZE));
            }
            let cntlid = self
                .allocate_cntlid()
                .ok_or(ConnectError::plain(Status::CONNECT_CONTROLLER_BUSY))?;
            let mut ctrl = Controller {
                cntlid,
                subnqn: subnqn.to_string(),
                hostnqn: hostnqn.to_string(),
                hostid: d.hostid,
                is_discovery,
                admin_key: key,
                io_queues: BTreeMap::new(),
                cc: 0,
                csts: 0,
                kato_ms: cmd.kato,
                deadline: None,
                features: Features::defaults(self.opts.max_io_queues),
                aers: VecDeque::new(),
                pending_events: VecDeque::new(),
                masked_ns_attr: false,
                masked_discovery: false,
                changed_ns: Vec::new(),
                changed_ns_overflow: false,
                error_log: VecDeque::new(),
                error_count: 0,
            };
            ctrl.restart_keep_alive(now, &self.opts);
            self.controllers.insert(cntlid, ctrl);
            return Ok(ConnectOk { cntlid, ..ok });
        }
        if is_discovery {
            return Err(ConnectError::sqe(sqe_off::QID));
        }
        let mqes = self.opts.max_queue_depth.saturating_sub(1);
        let ctrl = self
            .controllers
            .get_mut(&cntlid)
            .filter(|c| c.subnqn == subnqn && c.hostnqn == hostnqn)
            .ok_or(ConnectError::data(invalid, data_off::CNTLID))?;
        if ctrl.hostid != d.hostid {
            return Err(ConnectError::data(invalid, data_off::HOSTID));
        }
        if !ctrl.enabled() {
            return Err(ConnectError::plain(Status::COMMAND_SEQUENCE_ERROR));
        }
        if cmd.qid > ctrl.features.io_queues {
            return Err(ConnectError::sqe(sqe_off::QID));
        }
        if ctrl.io_queues.contains_key(&cmd.qid) {
            return Err(ConnectError::plain(Status::COMMAND_SEQUENCE_ERROR));
        }
        if cmd.sqsize == 0 || cmd.sqsize > mqes {
            return Err(ConnectError::sqe(sqe_off::SQSIZE));
        }
        ctrl.io_queues.insert(cmd.qid, key);
        Ok(ConnectOk { cntlid, ..ok })
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
                    c.record_error(queue.qid, sqe, status);
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
        let key = if queue.qid == 0 {
            ctrl.admin_key
        } else {
            *ctrl
                .io_queues
                .get(&queue.qid)
                .ok_or(Status::COMMAND_SEQUENCE_ERROR)?
        };
        if sqe.is_fabrics() {
            return match sqe.fctype() {
                opcodes::fabrics::PROPERTY_GET if queue.qid == 0 => {
                    property_get(ctrl, sqe, &self.opts)
                }
                opcodes::fabrics::PROPERTY_SET if queue.qid == 0 => {
                    property_set(ctrl, sqe, &self.opts, &mut self.actions)
                }
                opcodes::fabrics::CONNECT => Err(Status::COMMAND_SEQUENCE_ERROR),
                opcodes::fabrics::DISCONNECT => {
                    self.actions.push(Action::Disconnect { queue, key });
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
            let subsys = &self.subsystems[&ctrl.subnqn];
            io_command(subsys, sqe)
        }
    }

    /// The transport lost this queue (socket closed, QP error, Disconnect done). When
    /// the admin queue goes the controller is destroyed and its I/O queues come back as
    /// [`Action::Disconnect`]. Unknown queues (already torn down) are ignored.
    pub fn queue_closed(&mut self, queue: QueueRef, key: QueueKey) -> Vec<Action> {
        if let Some(c) = self.controllers.get_mut(&queue.cntlid) {
            if queue.qid == 0 && c.admin_key == key {
                let c = self.controllers.remove(&queue.cntlid).expect("present");
                self.actions.extend(c.io_queue_disconnects());
            } else if queue.qid != 0 && c.io_queues.get(&queue.qid) == Some(&key) {
                c.io_queues.remove(&queue.qid);
            }
        }
        self.take_actions()
    }

    /// Keep alive: controllers whose KATO expired at `now` are destroyed; all their
    /// queues come back as [`Action::Disconnect`].
    pub fn poll_timeouts(&mut self, now: Instant) -> Vec<Action> {
        self.destroy_controllers_where(|c| c.deadline.is_some_and(|d| d <= now));
        self.take_actions()
    }

    /// The earliest keep-alive deadline, for the caller's timer.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.controllers.values().filter_map(|c| c.deadline).min()
    }

    /// Actions produced since the last call (AER completions after namespace changes,
    /// queue teardown on CC.EN=0, shutdown or Disconnect...).
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    fn destroy_controllers_where(&mut self, pred: impl Fn(&Controller) -> bool) {
        let ids: Vec<u16> = self
            .controllers
            .values()
            .filter(|c| pred(c))
            .map(|c| c.cntlid)
            .collect();
        for id in ids {
            if let Some(c) = self.controllers.remove(&id) {
                self.actions.extend(c.all_queues());
            }
        }
    }

    fn user_subsystem_mut(&mut self, nqn: &str) -> Result<&mut Subsystem, TargetError> {
        match self.subsystems.get_mut(nqn) {
            Some(s) if s.is_discovery => Err(TargetError::DiscoverySubsystem),
            Some(s) => Ok(s),
            None => Err(TargetError::UnknownSubsystem(nqn.to_string())),
        }
    }

    fn namespace_changed(&mut self, subnqn: &str, nsid: u32) {
        use crate::spec::log::{aen, lid};
        let dw0 = aen::dw0(
            aen::TYPE_NOTICE,
            aen::INFO_NS_ATTRIBUTE_CHANGED,
            lid::CHANGED_NS_LIST,
        );
        for c in self.controllers.values_mut().filter(|c| c.subnqn == subnqn) {
            if !c.changed_ns.contains(&nsid) {
                if c.changed_ns.len() >= crate::spec::identify::NamespaceList::CAPACITY {
                    c.changed_ns_overflow = true;
                } else {
                    c.changed_ns.push(nsid);
                    c.changed_ns.sort_unstable();
                }
            }
            if c.features.async_event_config
                & crate::spec::features::async_event_config::NS_ATTRIBUTE_NOTICES
                != 0
            {
                c.raise(EventKind::NamespaceAttribute, dw0, &mut self.actions);
            }
        }
    }

    /// The discovery log changed: bump GENCTR, notify discovery controllers that asked.
    fn discovery_changed(&mut self) {
        use crate::spec::log::{aen, lid};
        self.genctr += 1;
        let dw0 = aen::dw0(
            aen::TYPE_NOTICE,
            aen::INFO_DISCOVERY_LOG_CHANGED,
            lid::DISCOVERY,
        );
        for c in self.controllers.values_mut().filter(|c| c.is_discovery) {
            if c.features.async_event_config
                & crate::spec::features::async_event_config::DISCOVERY_LOG_CHANGE_NOTICES
                != 0
            {
                c.raise(EventKind::DiscoveryLog, dw0, &mut self.actions);
            }
        }
    }
}

/// CAP as this target reports it.
fn cap_value(opts: &TargetOptions) -> u64 {
    use fabrics::cap;
    let mqes = opts.max_queue_depth.saturating_sub(1).max(1) as u64;
    // TO is in 500 ms units; RDY follows CC.EN at once, 10 s is ample.
    mqes & cap::MQES_MASK | cap::CQR | 20 << cap::TO_SHIFT | cap::CSS_NVM
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
        (property::CSTS, false) => ctrl.csts as u64,
        // CRTO: CRWMT and CRIMT in 500 ms units; the controller is ready at once.
        (property::CRTO, false) => 1 | 1 << 16,
        _ => return Err(Status::INVALID_FIELD),
    };
    Ok(Reply::Done {
        dw0: value as u32,
        dw1: (value >> 32) as u32,
        data_len: 0,
    })
}

fn property_set(
    ctrl: &mut Controller,
    sqe: &Sqe,
    opts: &TargetOptions,
    actions: &mut Vec<Action>,
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
        let valid = cc::css(new) == 0
            && cc::mps(new) == 0
            && cc::ams(new) == 0
            && cc::iosqes(new) == 6
            && cc::iocqes(new) == 4;
        ctrl.csts = if valid { csts::RDY } else { csts::CFS };
    } else if new & cc::EN == 0 && old & cc::EN != 0 {
        ctrl.reset(opts.max_io_queues, actions);
        ctrl.csts = 0;
    }
    if cc::shn(new) != 0 && cc::shn(old) == 0 {
        ctrl.reset(opts.max_io_queues, actions);
        ctrl.csts = (ctrl.csts & !csts::SHST_MASK) | csts::SHST_COMPLETE;
    } else if cc::shn(new) == 0 {
        ctrl.csts &= !csts::SHST_MASK;
    }
    Reply::ok()
}

/// An I/O command the engine did not offload.
fn io_command(subsys: &Subsystem, sqe: &Sqe) -> Result<Reply, Status> {
    use opcodes::io;
    let offloadable = matches!(
        sqe.opcode(),
        io::FLUSH | io::WRITE | io::READ | io::COMPARE | io::WRITE_ZEROES | io::DATASET_MANAGEMENT
    );
    if !offloadable {
        return Err(Status::INVALID_OPCODE);
    }
    // Flush broadcast (NSID FFFFFFFFh) is advertised as unsupported (VWC bits 2:1 = 10b).
    let ns = subsys
        .namespaces
        .get(&sqe.nsid)
        .ok_or(Status::INVALID_NAMESPACE)?;
    if sqe.opcode() == io::FLUSH && !ns.volatile_write_cache {
        // Nothing volatile to flush.
        return Reply::ok();
    }
    // The engine runs these for attached namespaces; one reaching us means the
    // namespace is not attached yet (or is going away): the host may retry.
    Err(Status::NAMESPACE_NOT_READY)
}
