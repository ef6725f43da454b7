//! The daemon's configuration: one YAML file, parsed and checked before anything starts.
//!
//! Reading a config happens in three steps:
//!
//! 1. `serde-saphyr` deserializes the text into the `raw` types, which keep every value's
//!    source location (`Spanned<T>`). Syntax and type errors stop here; `yaml_path` turns
//!    their location into the field path (`subsystems[0].namespaces[1].nsid`).
//! 2. `validate` checks the whole document (duplicate names, references, NQN syntax,
//!    sizes, files on disk, ...) and reports *every* problem it finds, each pointing at the
//!    offending value as `file:line:col: field: message`.
//! 3. The result is a [`Config`] of plain values with every default resolved (serial,
//!    model, namespace UUID/NGUID/EUI-64, subsystem listeners), so the daemon never has to
//!    interpret the YAML again.
//!
//! What it does not do: apply the config (that is the daemon's job), decide whether an
//! RDMA listener can be served on this host (the daemon does, at start-up), or check
//! that a block device's size or logical block size fits the configured block size.

mod control;
mod raw;
mod size;
mod validate;
mod yaml_path;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use control::{default_socket_path, ControlConfig};
pub use size::parse_size;

/// The file name reported in errors about the embedded default config.
pub const EMBEDDED_DEFAULT_NAME: &str = "<embedded default>";

/// The config used when no `--config` is given.
pub const EMBEDDED_DEFAULT: &str = include_str!("../etc/default.yaml");

/// Most IO threads a config may ask for.
pub const MAX_IO_THREADS: usize = 256;

/// `max_io_size` when the config does not set it: 1 MiB. Linux nvmet sets no limit on
/// TCP, and the Linux host does not split passthrough I/O (`nvme read`/`nvme write`), so
/// a small limit fails real commands; buffers are pooled by size class, so 4 KiB I/O
/// still takes 4 KiB buffers.
pub const DEFAULT_MAX_IO_SIZE: u32 = 1 << 20;
/// Smallest `max_io_size`: one 4 KiB page (MDTS 0 would mean "no limit").
pub const MIN_MAX_IO_SIZE: u32 = 4096;
/// Largest `max_io_size`: 8 MiB (MDTS 11). Each IO thread's buffer pool holds at least 64
/// transfers of this size, and NVMe/RDMA keyed SGLs describe at most 16 MiB - 1.
pub const MAX_MAX_IO_SIZE: u32 = 8 << 20;

/// Model number reported by subsystems whose config does not set one.
pub const DEFAULT_MODEL: &str = "nvmf-target";

/// A checked configuration with every default resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// How many IO threads to run, and where.
    pub threads: IoThreads,
    pub listeners: Vec<ListenerConfig>,
    pub backends: Vec<BackendConfig>,
    pub subsystems: Vec<SubsystemConfig>,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// Largest data transfer of one command in bytes (MDTS = log2(this / 4 KiB)): a power
    /// of two in [`MIN_MAX_IO_SIZE`]..=[`MAX_MAX_IO_SIZE`], [`DEFAULT_MAX_IO_SIZE`] when
    /// the file does not say.
    pub max_io_size: u32,
    /// Which offload engine runs the data path (`engine:`, default `soft`).
    pub engine: EngineKind,
    /// The control socket (`control:`); `None` when `control: {enabled: false}`.
    pub control: Option<ControlConfig>,
    /// `metrics.allow_remote`: the metrics address may be reachable from other hosts
    /// without a warning at start-up (the endpoint has no authentication).
    pub metrics_allow_remote: bool,
    /// `limits:`: bounds and deadlines on what peers can make the daemon hold.
    pub limits: Limits,
    /// `doca:`: the doca engine's devices (required with `engine: doca`).
    pub doca: Option<DocaSettings>,
    /// The file the config came from ([`EMBEDDED_DEFAULT_NAME`] for the embedded default).
    pub source: String,
    /// Per-host credentials (`hosts[]`): DH-HMAC-CHAP secrets and TLS PSKs.
    pub hosts: Vec<HostConfig>,
    /// Persist Through Power Loss: where reservation state is kept.
    pub reservations: ReservationsConfig,
    /// Discovery referrals (SUBTYPE 1 entries of the discovery log).
    pub referrals: Vec<ReferralConfig>,
}

/// One host's credentials (`hosts[]`). Secrets come inline or from files that only
/// their owner may read (checked when the config is loaded, so a reload re-reads them:
/// that is how a secret is rotated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    pub nqn: String,
    pub dhchap: Option<DhchapConfig>,
    /// The configured TLS PSK (`NVMeTLSkey-1:` interchange format).
    pub tls_psk: Option<nvmf::auth::tls::ConfiguredPsk>,
    /// How the host derives its TLS PSK from it: `rfc8446` (default) or `libnvme-compat`
    /// (nvme-cli 2.13 / libnvme 1.13, e.g. Debian trixie).
    pub tls_derivation: nvmf::auth::tls::Derivation,
}

/// DH-HMAC-CHAP settings of a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhchapConfig {
    /// The host's secret (`nvme connect --dhchap-secret`).
    pub secret: nvmf::auth::key::DhchapKey,
    /// The controller's secret, for bidirectional authentication (`--dhchap-ctrl-secret`).
    pub ctrl_secret: Option<nvmf::auth::key::DhchapKey>,
    /// Hash functions and DH groups the host may use, in order of preference.
    pub hashes: Vec<nvmf::auth::HashId>,
    pub dhgroups: Vec<nvmf::auth::DhGroup>,
}

/// TLS on a TCP listener (`listeners[].tls`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TlsMode {
    /// Plain TCP only (the default).
    #[default]
    None,
    /// TLS 1.3 with a PSK, or plain TCP: the discovery log says "not required".
    Optional,
    /// TLS 1.3 with a PSK only.
    Required,
}

impl fmt::Display for TlsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsMode::None => "none",
            TlsMode::Optional => "optional",
            TlsMode::Required => "required",
        })
    }
}

/// What to do at start-up when the reservation state file is missing or cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartPolicy {
    /// Start with no reservations (and say so in the log).
    StartClean,
    /// Refuse to start, naming the file and what is wrong with it.
    Fail,
}

/// `reservations:`: the PTPL state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationsConfig {
    /// `None` with the embedded default (there is no file to sit beside): reservations
    /// then cannot persist (RESCAP reports no PTPL). Otherwise `state_file`, relative to
    /// the config's directory, or `<config file>.ptpl` beside it.
    pub state_file: Option<PathBuf>,
    /// Default: start clean (a first start has no file).
    pub if_missing: StartPolicy,
    /// Default: fail (losing reservations silently is worse than not starting).
    pub if_corrupt: StartPolicy,
}

impl Default for ReservationsConfig {
    fn default() -> Self {
        ReservationsConfig {
            state_file: None,
            if_missing: StartPolicy::StartClean,
            if_corrupt: StartPolicy::Fail,
        }
    }
}

/// One referral to another discovery service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferralConfig {
    pub transport: TransportKind,
    pub address: IpAddr,
    pub port: u16,
}

/// An ANA state as the YAML writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnaStateName {
    Optimized,
    NonOptimized,
    Inaccessible,
    PersistentLoss,
    Change,
}

/// One ANA group of a subsystem (`subsystems[].ana_groups[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnaGroupConfig {
    /// 1..=128.
    pub id: u32,
    /// (listener name, state), sorted by listener; listeners not named are optimized.
    pub states: Vec<(String, AnaStateName)>,
}

/// `limits:`: what a peer can make the daemon hold, and for how long. The defaults are
/// meant never to need changing; each one protects the daemon (and its other hosts) from
/// one kind of misbehaving or hostile peer (DESIGN: every resource a peer can make us hold
/// has a bound, a deadline and a counter, `nvmft_limit_hits_total{limit="..."}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections (NVMe/TCP sockets and NVMe/RDMA queue pairs, every queue of every
    /// controller) held at once. Protects file descriptors and memory.
    pub max_connections: u32,
    /// Connections from one peer address. One host needs one per queue of each
    /// controller (the Linux host: an admin queue plus one I/O queue per CPU, per
    /// subsystem and path).
    pub max_connections_per_peer: u32,
    /// Connections not yet past their Fabrics Connect (opened and silent, or half-way
    /// through ICReq/Connect). Protects against connection floods from many addresses.
    pub max_unconnected: u32,
    /// Connections from one peer address not yet past their Fabrics Connect. Keeps one
    /// address from taking all of `max_unconnected` and locking every other host out.
    /// A host needs one per queue it sets up at once (the Linux host opens every I/O
    /// queue of a controller, up to the 64 this target grants, before it connects any,
    /// and its controllers reconnect together): see [`default_max_unconnected_per_peer`].
    pub max_unconnected_per_peer: u32,
    /// An NVMe/TCP connection must send its ICReq within this.
    pub icreq_timeout: Duration,
    /// A connection must have its Fabrics Connect answered within this of being
    /// accepted.
    pub connect_timeout: Duration,
    /// Host data the target asked for (R2T, RDMA READ) must arrive within this; then the
    /// transfer and the connection are aborted (NVMe/TCP: with a C2HTermReq).
    pub host_data_timeout: Duration,
    /// A peer that takes none of its responses for this long loses its connection.
    pub drain_timeout: Duration,
    /// Data buffers one connection may hold for its commands in flight; more commands
    /// wait for earlier ones (they do not fail). At least `max_io_size`.
    pub connection_buffer: u64,
}

/// Default `limits.max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 16_384;
/// Default `limits.max_connections_per_peer`.
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: u32 = 2_048;
/// Default `limits.max_unconnected`.
pub const DEFAULT_MAX_UNCONNECTED: u32 = 1_024;
/// `limits.max_unconnected_per_peer` when the config does not say: half of
/// `max_unconnected` (at least 1; 512 by default), so that one address never holds the
/// whole pre-Connect budget, and no less. A host needs one place per queue it sets up at
/// once, and the Linux host opens every I/O queue of a controller (up to the 64 this
/// target grants) before it sends any of their Connects, for all its controllers at once
/// when they reconnect together (after a target restart): 8 subsystems make 512. A cap
/// below that would refuse a queue of each controller, and every controller would fail
/// and retry together, again and again.
pub fn default_max_unconnected_per_peer(max_unconnected: u32) -> u32 {
    (max_unconnected / 2).max(1)
}

/// Default `limits.connection_buffer`: 16 MiB.
pub const DEFAULT_CONNECTION_BUFFER: u64 = 16 << 20;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            max_unconnected: DEFAULT_MAX_UNCONNECTED,
            max_unconnected_per_peer: default_max_unconnected_per_peer(DEFAULT_MAX_UNCONNECTED),
            icreq_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            host_data_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(30),
            connection_buffer: DEFAULT_CONNECTION_BUFFER,
        }
    }
}

/// `engine:`: the offload engine (see `crate::engine`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// The CPU engine (`sta::soft`).
    #[default]
    Soft,
    /// DOCA STA on a BlueField DPA (`sta::doca`, DOCA loaded at run time).
    Doca,
}

/// `doca:`: what the doca engine opens (see `sta::doca::DocaConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocaSettings {
    /// ibdev name of the STA device (`doca_sta_create`), e.g. `mlx5_0`.
    pub sta_device: String,
    /// ibdev names of the RDMA devices carrying NVMe-oF (`doca_sta_add_dev`).
    pub net_devices: Vec<String>,
    /// Entries of each backend queue (a power of two, 2..=32768; default 128).
    pub be_queue_entries: u16,
}

/// Default `doca.be_queue_entries` (SPDK's null backend uses 128).
pub const DEFAULT_BE_QUEUE_ENTRIES: u16 = 128;

impl EngineKind {
    /// Why this engine cannot run in this binary, if it cannot (checked with the config,
    /// so the error names its line; `crate::engine` builds the ones that can). Kept here,
    /// not in `crate::engine`, so the config module stands alone (the fuzz harness
    /// compiles it by itself).
    pub fn unavailable(self) -> Option<&'static str> {
        match self {
            EngineKind::Soft => None,
            EngineKind::Doca if cfg!(feature = "doca") => None,
            EngineKind::Doca => Some(
                "the doca engine (DOCA STA on a BlueField DPA) is not built into this binary \
                 (built without the `doca` cargo feature); rebuild with default features or \
                 use `engine: soft`",
            ),
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EngineKind::Soft => "soft",
            EngineKind::Doca => "doca",
        })
    }
}

/// IO thread layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoThreads {
    /// `io_threads: n`: n threads, not pinned (1..=256).
    Count(usize),
    /// `cpus: [..]`: one thread per listed CPU, pinned to it (distinct, 1..=256 of them).
    Cpus(Vec<usize>),
}

impl IoThreads {
    /// Number of IO threads.
    pub fn count(&self) -> usize {
        match self {
            IoThreads::Count(n) => *n,
            IoThreads::Cpus(cpus) => cpus.len(),
        }
    }
}

/// Fabrics transport of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    Tcp,
    Rdma,
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Rdma => "rdma",
        })
    }
}

/// One listening address (`listeners[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    pub name: String,
    pub transport: TransportKind,
    pub address: IpAddr,
    /// 1..=65535.
    pub port: u16,
    /// TLS (TCP only).
    pub tls: TlsMode,
}

impl ListenerConfig {
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.address, self.port)
    }
}

/// One block backend (`backends[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    pub name: String,
    pub kind: BackendKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendKind {
    /// Memory, zero-filled at start. `size` is a non-zero multiple of `block_size`.
    Ram { size: u64, block_size: u32 },
    /// A regular file or a block device.
    File {
        /// Relative paths in a config file are resolved against the file's directory.
        path: PathBuf,
        /// Create (or extend) a regular file to this size; `None` for block devices and
        /// for existing files used at their current size. A multiple of the block size.
        size: Option<u64>,
        /// 512 or 4096; `None`: 512 for files, the device's logical block size for devices.
        block_size: Option<u32>,
        /// O_DIRECT preference; `None`: the backend decides.
        direct: Option<bool>,
    },
    /// A namespace of an NVMe drive bound to vfio-pci, driven from user space.
    Nvme {
        /// PCI address, `DDDD:BB:DD.F`.
        pci: String,
        /// Namespace ID on the drive (1 when not configured).
        nsid: u32,
        /// Command timeout before Abort; `None`: the backend's default.
        io_timeout_ms: Option<u64>,
        /// `false`: data pointers are PRPs even when the drive supports SGLs.
        sgl: bool,
    },
}

/// One NVM subsystem (`subsystems[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemConfig {
    pub nqn: String,
    /// Printable ASCII, 1..=20 bytes; derived from the NQN when not configured.
    pub serial: String,
    /// Printable ASCII, 1..=40 bytes; [`DEFAULT_MODEL`] when not configured.
    pub model: String,
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect (in addition to any host when `allow_any_host`).
    pub hosts: Vec<String>,
    /// Hosts without a DH-HMAC-CHAP secret are refused.
    pub require_auth: bool,
    /// Names of the listeners this subsystem is reachable on; all listeners when the
    /// config does not say.
    pub listeners: Vec<String>,
    /// The config did not name listeners: the subsystem is on every listener, including
    /// listeners a reload adds later (Connects are refused on listeners a subsystem is
    /// not on, so this follows the listener list live rather than at start-up).
    pub all_listeners: bool,
    /// ANA groups with non-default states, by ID (a group not listed is optimized on
    /// every listener; every namespace is in group 1 unless it names another).
    pub ana_groups: Vec<AnaGroupConfig>,
    pub namespaces: Vec<NamespaceConfig>,
}

/// One namespace of a subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceConfig {
    /// 1..=0xFFFF_FFFE, unique in its subsystem.
    pub nsid: u32,
    /// Name of a backend in [`Config::backends`]; no backend serves two namespaces.
    pub backend: String,
    /// Configured, or UUID v5 of (subsystem NQN, nsid): stable across restarts.
    pub uuid: [u8; 16],
    /// Configured, or the bytes of `uuid`.
    pub nguid: [u8; 16],
    /// Configured, or derived from `uuid` (a locally administered EUI-64).
    pub eui64: [u8; 8],
    /// ANA group, 1..=128 (1 when not configured).
    pub ana_group: u32,
    /// Host NQNs that see this namespace; `None`: every host of the subsystem.
    pub hosts: Option<Vec<String>>,
}

/// A config file is at most this big (the largest real ones are tens of KiB): a path to
/// a device or a huge file must not make the daemon read without end.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A config file last changed less than this long ago may still be being written: it is
/// read again once it has been left alone this long (`read_text`).
const CONFIG_SETTLE: Duration = Duration::from_millis(100);
/// Longest `read_text` waits for a file being written to be left alone.
const CONFIG_SETTLE_MAX: Duration = Duration::from_secs(2);

/// The text of config file `path`: a regular file (or a symlink to one) of at most
/// [`MAX_CONFIG_BYTES`], in UTF-8, as it stands once nobody writes it. A file written in
/// place (not to a temporary file renamed over it) can be read half-written, and half a
/// file is often valid YAML that lacks the subsystems of its second half: a reload would
/// then remove them. So a file that changed while it was read, or less than
/// [`CONFIG_SETTLE`] before, is read again once it is left alone; one that keeps changing
/// for [`CONFIG_SETTLE_MAX`] is an error.
fn read_text(path: &Path) -> std::io::Result<String> {
    read_settled(path, CONFIG_SETTLE, CONFIG_SETTLE_MAX)
}

/// [`read_text`] with its two times.
fn read_settled(path: &Path, settle: Duration, max: Duration) -> std::io::Result<String> {
    let start = std::time::Instant::now();
    loop {
        let (text, settled) = read_text_once(path)?;
        let wait = match settled {
            Ok(age) if age >= settle => return Ok(text),
            Ok(age) => settle - age,
            Err(()) => settle / 4,
        };
        if start.elapsed() + wait > max {
            return Err(std::io::Error::other(format!(
                "it kept changing for {:.1} s while it was read: write config files \
                 atomically (to a temporary file renamed over it)",
                max.as_secs_f64()
            )));
        }
        std::thread::sleep(wait);
    }
}

/// One read of `path`, and how long before it the file last changed (`Err`: it changed
/// while it was read). A modification time in the future or unknown counts as settled.
type ReadOnce = (String, Result<Duration, ()>);

fn read_text_once(path: &Path) -> std::io::Result<ReadOnce> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    // Non-blocking open: a FIFO at the path must not hang the main loop before the type
    // check (a regular file's reads ignore the flag).
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)?;
    let before = f.metadata()?;
    if !before.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut text = String::new();
    (&f).take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {} MiB: not a config file",
            MAX_CONFIG_BYTES >> 20
        )));
    }
    let after = f.metadata()?;
    let stamp = |m: &std::fs::Metadata| (m.len(), m.mtime(), m.mtime_nsec());
    if stamp(&before) != stamp(&after) || text.len() as u64 != after.len() {
        return Ok((text, Err(())));
    }
    let age = after
        .modified()
        .ok()
        .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
        .unwrap_or(Duration::MAX);
    Ok((text, Ok(age)))
}

impl Config {
    /// Reads and checks the config file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        Self::load_with_text(path).map(|(cfg, _)| cfg)
    }

    /// The PTPL state file sits beside the config file unless the config says where.
    fn with_ptpl_default(mut self, path: &Path) -> Config {
        if self.reservations.state_file.is_none() {
            self.reservations.state_file = Some(Self::ptpl_default_for(path));
        }
        self
    }

    /// `<config file>.ptpl`: where the PTPL state file is when the config does not say.
    pub fn ptpl_default_for(path: &Path) -> PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(".ptpl");
        PathBuf::from(name)
    }

    /// [`Config::load`], also returning the text it parsed (what the control socket hands
    /// `--check-config --diff` as the running config).
    pub fn load_with_text(path: impl AsRef<Path>) -> Result<(Config, String), ConfigError> {
        let path = path.as_ref();
        let source = path.display().to_string();
        let text = read_text(path).map_err(|error| ConfigError::Read {
            path: source.clone(),
            error,
        })?;
        let base = path.parent().filter(|p| !p.as_os_str().is_empty());
        let cfg = validate::parse(&text, &source, base)?;
        Ok((cfg.with_ptpl_default(path), text))
    }

    /// Parses text that was read from `path` (relative backend paths resolve against its
    /// directory, as [`Config::load`] does), e.g. the running config a daemon reports.
    pub fn parse_as_file(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let base = path.parent().filter(|p| !p.as_os_str().is_empty());
        let cfg = validate::parse(text, &path.display().to_string(), base)?;
        Ok(cfg.with_ptpl_default(path))
    }

    /// Parses and checks config text; `source` names it in errors. Relative backend paths
    /// are taken as they are (relative to the working directory).
    pub fn parse(text: &str, source: &str) -> Result<Config, ConfigError> {
        validate::parse(text, source, None)
    }

    /// The embedded default: one 1 GiB RAM namespace on TCP 127.0.0.1:4420.
    pub fn embedded_default() -> Config {
        Config::parse(EMBEDDED_DEFAULT, EMBEDDED_DEFAULT_NAME)
            .expect("the embedded default config is valid (tested)")
    }

    /// Namespace `nsid` of subsystem `nqn`, if configured.
    pub fn namespace(&self, nqn: &str, nsid: u32) -> Option<&NamespaceConfig> {
        self.subsystems
            .iter()
            .find(|s| s.nqn == nqn)
            .and_then(|s| s.namespaces.iter().find(|n| n.nsid == nsid))
    }

    /// Number of namespaces over all subsystems.
    pub fn namespace_count(&self) -> usize {
        self.subsystems.iter().map(|s| s.namespaces.len()).sum()
    }
}

/// Why a config could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("{path}: cannot read config file: {error}")]
    Read {
        path: String,
        #[source]
        error: std::io::Error,
    },
    /// Syntax, type or semantic errors, in file order (one per line when displayed).
    #[error("{}", DisplayDiagnostics(.0))]
    Invalid(Vec<Diagnostic>),
}

impl ConfigError {
    /// The located problems (empty for [`ConfigError::Read`]).
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            ConfigError::Invalid(diags) => diags,
            ConfigError::Read { .. } => &[],
        }
    }
}

/// One problem in a config file, displayed as `file:line:col: field: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub source: String,
    /// 1-based.
    pub line: u64,
    /// 1-based, in characters.
    pub column: u64,
    /// Path of the offending field, e.g. `subsystems[0].namespaces[1].backend`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}: {}",
            self.source, self.line, self.column, self.field, self.message
        )
    }
}

struct DisplayDiagnostics<'a>(&'a [Diagnostic]);

impl fmt::Display for DisplayDiagnostics<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, diag) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{diag}")?;
        }
        Ok(())
    }
}

/// UUID v5 namespace under which this daemon derives its identifiers.
fn id_namespace() -> uuid::Uuid {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_DNS, b"nvmf-target.dev")
}

/// The namespace UUID used when the config does not set one: UUID v5 of the subsystem
/// NQN and the nsid, so it is the same on every start and differs between namespaces.
pub fn derive_namespace_uuid(subsystem_nqn: &str, nsid: u32) -> [u8; 16] {
    let name = format!("{subsystem_nqn}/ns/{nsid}");
    *uuid::Uuid::new_v5(&id_namespace(), name.as_bytes()).as_bytes()
}

/// The EUI-64 used when the config does not set one: hashed from the namespace UUID,
/// marked locally administered (not an IEEE-assigned OUI) and unicast.
pub fn derive_eui64(uuid: &[u8; 16]) -> [u8; 8] {
    let name = format!("eui64/{}", uuid::Uuid::from_bytes(*uuid).hyphenated());
    let hash = uuid::Uuid::new_v5(&id_namespace(), name.as_bytes());
    let mut eui = [0u8; 8];
    eui.copy_from_slice(&hash.as_bytes()[..8]);
    eui[0] = (eui[0] | 0x02) & !0x01;
    eui
}

/// The serial number used when the config does not set one: `NVMFT` and 15 hex digits
/// hashed from the subsystem NQN (20 ASCII characters, the field's full width).
pub fn derive_serial(subsystem_nqn: &str) -> String {
    let name = format!("serial/{subsystem_nqn}");
    let hash = uuid::Uuid::new_v5(&id_namespace(), name.as_bytes());
    let hex = hash
        .simple()
        .encode_upper(&mut uuid::Uuid::encode_buffer())
        .to_owned();
    format!("NVMFT{}", &hex[..15])
}

#[cfg(test)]
mod tests;
