//! From YAML text to a checked [`Config`]: deserialize, then check everything and collect
//! every problem with its location.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use serde_saphyr::{Location, MessageFormatter, Spanned, UserMessageFormatter};

use super::raw::{
    RawAnaGroup, RawBackend, RawBackendType, RawConfig, RawHost, RawListener, RawReferral,
    RawReservations, RawSize, RawSubsystem,
};
use super::yaml_path::{PathIndex, ROOT};
use super::{
    derive_eui64, derive_namespace_uuid, derive_serial, parse_size, AnaGroupConfig, BackendConfig,
    BackendKind, Config, ConfigError, DhchapConfig, Diagnostic, HostConfig, IoThreads,
    ListenerConfig, NamespaceConfig, ReferralConfig, ReservationsConfig, SubsystemConfig, TlsMode,
    TransportKind, DEFAULT_MAX_IO_SIZE, DEFAULT_MODEL, MAX_IO_THREADS, MAX_MAX_IO_SIZE,
    MIN_MAX_IO_SIZE,
};

/// Longest NQN the NVMe base specification allows, in bytes.
const NQN_MAX_LEN: usize = 223;
/// The well-known discovery subsystem NQN.
const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Prefix of NQNs of the UUID form.
const UUID_NQN_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";
/// Largest valid namespace ID (0xFFFFFFFF is the broadcast value).
const NSID_MAX: u64 = 0xFFFF_FFFE;
const SERIAL_MAX_LEN: usize = 20;
const MODEL_MAX_LEN: usize = 40;
const NAME_MAX_LEN: usize = 64;
/// Highest ANA group ID (the target's ANAGRPMAX).
const ANA_GROUP_MAX: u32 = nvmf::target::ana::ANAGRPMAX;

pub(super) fn parse(text: &str, source: &str, base: Option<&Path>) -> Result<Config, ConfigError> {
    let raw: RawConfig = serde_saphyr::from_str(text)
        .map_err(|err| ConfigError::Invalid(vec![syntax_diagnostic(&err, text, source)]))?;
    let mut checker = Checker {
        source,
        base,
        diags: Vec::new(),
    };
    let config = checker.config(raw);
    if checker.diags.is_empty() {
        Ok(config)
    } else {
        let mut diags = checker.diags;
        diags.sort_by_key(|d| (d.line, d.column));
        Err(ConfigError::Invalid(diags))
    }
}

/// Turns a deserializer error into a located diagnostic naming the field.
fn syntax_diagnostic(err: &serde_saphyr::Error, text: &str, source: &str) -> Diagnostic {
    use serde_saphyr::Error as E;

    let err = err.without_snippet();
    let (mut line, mut column) = err
        .location()
        .filter(|l| l.line() > 0)
        .map_or((1, 1), |l| (l.line(), l.column().max(1)));
    let index = PathIndex::build(text);
    let (field, message) = match err {
        E::SerdeUnknownField {
            field, expected, ..
        } => (
            index.key_at(line, column),
            format!(
                "unknown field `{field}` (expected one of: {})",
                expected.join(", ")
            ),
        ),
        E::DuplicateMappingKey { .. } => (index.key_at(line, column), "duplicate key".into()),
        E::SerdeMissingField { field, .. } => {
            // Point at the mapping that lacks the field.
            let (parent, l, c) = index.mapping_around(line, column);
            (line, column) = (l, c);
            let path = if parent == ROOT {
                (*field).to_owned()
            } else {
                format!("{parent}.{field}")
            };
            (path, "required field is missing".into())
        }
        E::InvalidScalar { ty, .. } => (index.node_at(line, column), expected_scalar(ty)),
        // Said of numbers too, when a sequence or mapping stands where a value should be.
        E::Unexpected {
            expected: "string scalar",
            ..
        } => (
            index.node_at(line, column),
            "expected a single value, found a sequence or mapping".into(),
        ),
        other => (
            index.node_at(line, column),
            UserMessageFormatter.format_message(other).into_owned(),
        ),
    };
    Diagnostic {
        source: source.to_owned(),
        line,
        column,
        field,
        message: sanitize(&message),
    }
}

fn expected_scalar(ty: &str) -> String {
    match ty {
        "u8" | "u16" | "u32" | "u64" | "usize" => "expected a non-negative integer".to_owned(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "expected an integer".to_owned(),
        "bool" => "expected true or false".to_owned(),
        other => format!("invalid value for type {other}"),
    }
}

/// Keeps control characters from the file out of the one-line message.
fn sanitize(message: &str) -> String {
    message
        .chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_debug().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

struct Checker<'a> {
    source: &'a str,
    /// Directory that relative backend paths are relative to.
    base: Option<&'a Path>,
    diags: Vec<Diagnostic>,
}

/// Where a value was first seen, for "duplicate" messages.
#[derive(Clone)]
struct Seen {
    field: String,
    line: u64,
}

impl Seen {
    fn new<T>(field: impl Into<String>, at: &Spanned<T>) -> Seen {
        Seen {
            field: field.into(),
            line: at.referenced.line(),
        }
    }
}

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at line {}", self.field, self.line)
    }
}

impl Checker<'_> {
    fn error_at(&mut self, at: Location, field: impl Into<String>, message: impl Into<String>) {
        let (line, column) = if at.line() == 0 {
            (1, 1)
        } else {
            (at.line(), at.column().max(1))
        };
        self.diags.push(Diagnostic {
            source: self.source.to_owned(),
            line,
            column,
            field: field.into(),
            message: message.into(),
        });
    }

    fn error<T>(&mut self, at: &Spanned<T>, field: impl Into<String>, message: impl Into<String>) {
        self.error_at(at.referenced, field, message);
    }

    /// A path from the file: relative ones are taken from the config file's directory.
    fn resolve(&self, path: &str) -> PathBuf {
        match self.base {
            Some(base) if Path::new(path).is_relative() => base.join(path),
            _ => PathBuf::from(path),
        }
    }

    fn config(&mut self, raw: RawConfig) -> Config {
        let threads = self.threads(&raw);
        let listeners = self.listeners(&raw.listeners);
        let backends = self.backends(&raw.backends);
        let hosts = self.hosts(&raw.hosts);
        let subsystems = self.subsystems(&raw.subsystems, &listeners, &backends);
        self.auth_consistency(&raw.subsystems, &hosts);
        let metrics = raw
            .metrics
            .as_ref()
            .and_then(|m| self.metrics(&m.value.address, &listeners));
        let max_io_size = raw
            .max_io_size
            .as_ref()
            .map_or(DEFAULT_MAX_IO_SIZE, |m| self.max_io_size(m));
        Config {
            threads,
            listeners: listeners.into_iter().map(|(l, _)| l).collect(),
            backends,
            subsystems,
            metrics,
            max_io_size,
            source: self.source.to_owned(),
            hosts,
            reservations: raw
                .reservations
                .as_ref()
                .map_or_else(Default::default, |r| self.reservations(&r.value)),
            referrals: self.referrals(&raw.referrals),
        }
    }

    /// `hosts[]`: NQNs, secrets (inline or from owner-only files), algorithm lists.
    fn hosts(&mut self, raw: &[Spanned<RawHost>]) -> Vec<HostConfig> {
        let mut seen: HashMap<String, Seen> = HashMap::new();
        let mut out = Vec::new();
        for (i, h) in raw.iter().enumerate() {
            let p = format!("hosts[{i}]");
            let h = &h.value;
            if let Err(msg) = check_nqn(&h.nqn.value) {
                self.error(&h.nqn, format!("{p}.nqn"), msg);
            } else if h.nqn.value == DISCOVERY_NQN {
                self.error(
                    &h.nqn,
                    format!("{p}.nqn"),
                    "the discovery NQN is not a host",
                );
            }
            if let Some(first) = seen.get(&h.nqn.value) {
                let msg = format!("host {:?} is listed twice (first: {first})", h.nqn.value);
                self.error(&h.nqn, format!("{p}.nqn"), msg);
            } else {
                seen.insert(h.nqn.value.clone(), Seen::new(format!("{p}.nqn"), &h.nqn));
            }
            let secret = self
                .secret_text(&h.dhchap_secret, &h.dhchap_secret_file, &p, "dhchap_secret")
                .and_then(|(text, at, field)| {
                    nvmf::auth::key::DhchapKey::parse(&text)
                        .map_err(|e| self.error_at(at, field, e.to_string()))
                        .ok()
                });
            let ctrl_secret = self
                .secret_text(
                    &h.dhchap_ctrl_secret,
                    &h.dhchap_ctrl_secret_file,
                    &p,
                    "dhchap_ctrl_secret",
                )
                .and_then(|(text, at, field)| {
                    nvmf::auth::key::DhchapKey::parse(&text)
                        .map_err(|e| self.error_at(at, field, e.to_string()))
                        .ok()
                });
            let has_secret = h.dhchap_secret.is_some() || h.dhchap_secret_file.is_some();
            let has_ctrl = h.dhchap_ctrl_secret.is_some() || h.dhchap_ctrl_secret_file.is_some();
            if has_ctrl && !has_secret {
                let at = h
                    .dhchap_ctrl_secret
                    .as_ref()
                    .or(h.dhchap_ctrl_secret_file.as_ref())
                    .map_or(h.nqn.referenced, |s| s.referenced);
                self.error_at(
                    at,
                    format!("{p}.dhchap_ctrl_secret"),
                    "a controller secret needs a host secret (dhchap_secret) too",
                );
            }
            let hashes = match &h.dhchap_hashes {
                None => nvmf::auth::HashId::ALL.to_vec(),
                Some(list) => self.names(
                    list,
                    &format!("{p}.dhchap_hashes"),
                    nvmf::auth::HashId::from_name,
                    "sha256, sha384, sha512",
                ),
            };
            let dhgroups = match &h.dhchap_dhgroups {
                None => nvmf::auth::ctrl::Policy::default().dhgroups,
                Some(list) => self.names(
                    list,
                    &format!("{p}.dhchap_dhgroups"),
                    nvmf::auth::DhGroup::from_name,
                    "null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144, ffdhe8192",
                ),
            };
            if !has_secret && (h.dhchap_hashes.is_some() || h.dhchap_dhgroups.is_some()) {
                self.error(
                    &h.nqn,
                    format!("{p}.dhchap_hashes"),
                    "DH-HMAC-CHAP settings without a dhchap_secret",
                );
            }
            let tls_psk = self
                .secret_text(&h.tls_psk, &h.tls_psk_file, &p, "tls_psk")
                .and_then(|(text, at, field)| {
                    nvmf::auth::tls::ConfiguredPsk::parse(&text)
                        .map_err(|e| self.error_at(at, field, e.to_string()))
                        .ok()
                });
            let tls_derivation = match &h.tls_psk_derivation {
                None => nvmf::auth::tls::Derivation::Rfc8446,
                Some(d) => match d.value.as_str() {
                    "rfc8446" => nvmf::auth::tls::Derivation::Rfc8446,
                    "libnvme-compat" => nvmf::auth::tls::Derivation::LibnvmeCompat,
                    other => {
                        self.error(
                            d,
                            format!("{p}.tls_psk_derivation"),
                            format!("unknown {other:?}; known: rfc8446, libnvme-compat"),
                        );
                        nvmf::auth::tls::Derivation::Rfc8446
                    }
                },
            };
            out.push(HostConfig {
                nqn: h.nqn.value.clone(),
                tls_derivation,
                dhchap: secret.map(|secret| DhchapConfig {
                    secret,
                    ctrl_secret,
                    hashes,
                    dhgroups,
                }),
                tls_psk,
            });
        }
        out
    }

    /// A list of algorithm names, each known and listed once.
    fn names<T: PartialEq>(
        &mut self,
        list: &Spanned<Vec<Spanned<String>>>,
        field: &str,
        parse: impl Fn(&str) -> Option<T>,
        known: &str,
    ) -> Vec<T> {
        if list.value.is_empty() {
            self.error(list, field, format!("must name at least one of {known}"));
        }
        let mut out = Vec::new();
        for (i, n) in list.value.iter().enumerate() {
            match parse(&n.value) {
                Some(v) if out.contains(&v) => self.error(
                    n,
                    format!("{field}[{i}]"),
                    format!("{:?} is listed twice", n.value),
                ),
                Some(v) => out.push(v),
                None => self.error(
                    n,
                    format!("{field}[{i}]"),
                    format!("unknown {:?}; known: {known}", n.value),
                ),
            }
        }
        out
    }

    /// A secret given inline (`name`) or in a file (`name_file`): its text, where to
    /// point errors about its content, and the field name. Files must not be readable or
    /// writable by group or others.
    fn secret_text(
        &mut self,
        inline: &Option<Spanned<String>>,
        file: &Option<Spanned<String>>,
        p: &str,
        name: &str,
    ) -> Option<(String, Location, String)> {
        match (inline, file) {
            (Some(_), Some(f)) => {
                self.error(
                    f,
                    format!("{p}.{name}_file"),
                    format!("give {name} or {name}_file, not both"),
                );
                None
            }
            (Some(s), None) => Some((s.value.clone(), s.referenced, format!("{p}.{name}"))),
            (None, Some(f)) => {
                use std::os::unix::fs::PermissionsExt;
                let field = format!("{p}.{name}_file");
                let resolved = self.resolve(&f.value);
                let shown = resolved.display().to_string();
                let meta = match std::fs::metadata(&resolved) {
                    Ok(m) => m,
                    Err(e) => {
                        self.error(f, field, format!("cannot read {shown}: {e}"));
                        return None;
                    }
                };
                let mode = meta.permissions().mode() & 0o777;
                if !meta.is_file() {
                    self.error(f, field, format!("{shown} is not a regular file"));
                    return None;
                }
                if mode & 0o077 != 0 {
                    self.error(
                        f,
                        field,
                        format!(
                            "{shown} has mode {mode:04o}: a secret must not be readable or \
                             writable by group or others (chmod 600 {shown})"
                        ),
                    );
                    return None;
                }
                match std::fs::read_to_string(&resolved) {
                    Ok(text) => Some((text, f.referenced, field)),
                    Err(e) => {
                        self.error(f, field, format!("cannot read {shown}: {e}"));
                        None
                    }
                }
            }
            (None, None) => None,
        }
    }

    /// `require_auth` subsystems: every host they list needs a DH-HMAC-CHAP secret.
    fn auth_consistency(&mut self, raw: &[Spanned<RawSubsystem>], hosts: &[HostConfig]) {
        for (i, s) in raw.iter().enumerate() {
            let s = &s.value;
            if !s.require_auth {
                continue;
            }
            for (j, h) in s.hosts.iter().enumerate() {
                if !hosts.iter().any(|c| c.nqn == h.value && c.dhchap.is_some()) {
                    self.error(
                        h,
                        format!("subsystems[{i}].hosts[{j}]"),
                        format!(
                            "the subsystem requires authentication and host {:?} has no \
                             dhchap_secret in hosts[]; it could never connect",
                            h.value
                        ),
                    );
                }
            }
        }
    }

    fn reservations(&mut self, r: &RawReservations) -> ReservationsConfig {
        let d = ReservationsConfig::default();
        let state_file = r.state_file.as_ref().and_then(|f| {
            if f.value.trim().is_empty() {
                self.error(f, "reservations.state_file", "must not be empty");
                return None;
            }
            Some(self.resolve(&f.value))
        });
        ReservationsConfig {
            state_file,
            if_missing: r.if_missing.as_ref().map_or(d.if_missing, |v| v.value),
            if_corrupt: r.if_corrupt.as_ref().map_or(d.if_corrupt, |v| v.value),
        }
    }

    fn referrals(&mut self, raw: &[Spanned<RawReferral>]) -> Vec<ReferralConfig> {
        let mut out: Vec<ReferralConfig> = Vec::new();
        for (i, r) in raw.iter().enumerate() {
            let p = format!("referrals[{i}]");
            let r = &r.value;
            let address = match r.address.value.trim().parse::<IpAddr>() {
                Ok(a) if !a.is_unspecified() => Some(a),
                Ok(_) => {
                    let msg = "a referral needs an address hosts can reach, not a wildcard";
                    self.error(&r.address, format!("{p}.address"), msg);
                    None
                }
                Err(_) => {
                    let msg = format!(
                        "invalid IP address {:?}: expected an IPv4 or IPv6 literal",
                        r.address.value
                    );
                    self.error(&r.address, format!("{p}.address"), msg);
                    None
                }
            };
            let port = self.port(&r.port, &format!("{p}.port"));
            if let (Some(address), Some(port)) = (address, port) {
                let c = ReferralConfig {
                    transport: r.transport.value,
                    address,
                    port,
                };
                if out.contains(&c) {
                    self.error(
                        &r.port,
                        format!("{p}.port"),
                        "the same referral is listed twice",
                    );
                } else {
                    out.push(c);
                }
            }
        }
        out
    }

    /// `subsystems[].ana_groups`: IDs 1..=128, once each; states name listeners the
    /// subsystem is on.
    fn ana_groups(
        &mut self,
        raw: &[Spanned<RawAnaGroup>],
        p: &str,
        listeners: &[String],
    ) -> Vec<AnaGroupConfig> {
        let mut seen: HashMap<u64, Seen> = HashMap::new();
        let mut out = Vec::new();
        for (i, g) in raw.iter().enumerate() {
            let gp = format!("{p}.ana_groups[{i}]");
            let id = &g.value.id;
            if !(1..=u64::from(ANA_GROUP_MAX)).contains(&id.value) {
                let msg = format!("must be 1..={ANA_GROUP_MAX}, got {}", id.value);
                self.error(id, format!("{gp}.id"), msg);
                continue;
            }
            if let Some(first) = seen.get(&id.value) {
                let msg = format!("ANA group {} is defined twice (first: {first})", id.value);
                self.error(id, format!("{gp}.id"), msg);
                continue;
            }
            seen.insert(id.value, Seen::new(gp.clone(), id));
            let mut states = Vec::new();
            for (name, state) in &g.value.states {
                if !listeners.contains(name) {
                    let msg = format!(
                        "listener {name:?} is not one of this subsystem's {}",
                        known("listeners", listeners)
                    );
                    self.error(state, format!("{gp}.states.{name}"), msg);
                    continue;
                }
                states.push((name.clone(), state.value));
            }
            out.push(AnaGroupConfig {
                id: id.value as u32,
                states,
            });
        }
        out.sort_by_key(|g| g.id);
        out
    }

    /// `max_io_size`: a power of two in MIN_MAX_IO_SIZE..=MAX_MAX_IO_SIZE (MDTS is a power
    /// of two of 4 KiB pages).
    fn max_io_size(&mut self, m: &Spanned<RawSize>) -> u32 {
        let bytes = match &m.value {
            RawSize::Bytes(n) => *n,
            RawSize::Text(text) => match parse_size(text) {
                Ok(n) => n,
                Err(msg) => {
                    self.error(m, "max_io_size", msg);
                    return DEFAULT_MAX_IO_SIZE;
                }
            },
        };
        let range = u64::from(MIN_MAX_IO_SIZE)..=u64::from(MAX_MAX_IO_SIZE);
        if !bytes.is_power_of_two() || !range.contains(&bytes) {
            let msg = format!(
                "must be a power of two from 4KiB to 8MiB (e.g. 128KiB, 1MiB), got {bytes} bytes"
            );
            self.error(m, "max_io_size", msg);
            return DEFAULT_MAX_IO_SIZE;
        }
        bytes as u32
    }

    fn threads(&mut self, raw: &RawConfig) -> IoThreads {
        match (&raw.io_threads, &raw.cpus) {
            (Some(count), Some(cpus)) => {
                self.error(
                    cpus,
                    "cpus",
                    format!(
                        "cannot be combined with io_threads (line {}); give a count or a CPU list",
                        count.referenced.line()
                    ),
                );
                IoThreads::Count(1)
            }
            (Some(count), None) => {
                let n = count.value;
                if n == 0 || n > MAX_IO_THREADS as u64 {
                    self.error(
                        count,
                        "io_threads",
                        format!("must be 1..={MAX_IO_THREADS}, got {n}"),
                    );
                    IoThreads::Count(1)
                } else {
                    IoThreads::Count(n as usize)
                }
            }
            (None, Some(cpus)) => IoThreads::Cpus(self.cpus(cpus)),
            (None, None) => IoThreads::Count(1),
        }
    }

    fn cpus(&mut self, cpus: &Spanned<Vec<Spanned<u64>>>) -> Vec<usize> {
        if cpus.value.is_empty() {
            self.error(cpus, "cpus", "must list at least one CPU");
        }
        if cpus.value.len() > MAX_IO_THREADS {
            self.error(
                cpus,
                "cpus",
                format!(
                    "lists {} CPUs; at most {MAX_IO_THREADS} IO threads are supported",
                    cpus.value.len()
                ),
            );
        }
        let available = available_cpus();
        let mut seen: HashMap<u64, Seen> = HashMap::new();
        let mut out = Vec::new();
        for (i, cpu) in cpus.value.iter().enumerate() {
            let field = format!("cpus[{i}]");
            if let Some(first) = seen.get(&cpu.value) {
                let msg = format!("CPU {} is listed twice (first: {first})", cpu.value);
                self.error(cpu, field, msg);
                continue;
            }
            seen.insert(cpu.value, Seen::new(field.clone(), cpu));
            if let Some(available) = &available {
                if !available.contains(&cpu.value) {
                    let msg = format!(
                        "CPU {} is not available to this process (available: {})",
                        cpu.value,
                        cpu_ranges(available)
                    );
                    self.error(cpu, field, msg);
                    continue;
                }
            }
            out.push(cpu.value as usize);
        }
        out
    }

    /// Checked listeners, each with the location of its port for later cross-checks.
    fn listeners(&mut self, raw: &[Spanned<RawListener>]) -> Vec<(ListenerConfig, Location)> {
        if raw.is_empty() {
            self.error_at(
                Location::UNKNOWN,
                "listeners",
                "at least one listener is required",
            );
        }
        let mut names: HashMap<String, Seen> = HashMap::new();
        let mut endpoints: HashMap<(TransportKind, IpAddr, u16), Seen> = HashMap::new();
        let mut out = Vec::new();
        for (i, listener) in raw.iter().enumerate() {
            let l = &listener.value;
            let p = format!("listeners[{i}]");
            self.name(&l.name, &format!("{p}.name"), "listener", &mut names);
            let address = match l.address.value.trim().parse::<IpAddr>() {
                Ok(a) => Some(a),
                Err(_) => {
                    let msg = format!(
                        "invalid IP address {:?}: expected an IPv4 or IPv6 literal",
                        l.address.value
                    );
                    self.error(&l.address, format!("{p}.address"), msg);
                    None
                }
            };
            let port = self.port(&l.port, &format!("{p}.port"));
            let (Some(address), Some(port)) = (address, port) else {
                continue;
            };
            let key = (l.transport.value, address, port);
            if let Some(first) = endpoints.get(&key) {
                let msg = format!(
                    "{} {} is already used by {first}",
                    l.transport.value,
                    SocketAddr::new(address, port)
                );
                self.error(&l.port, format!("{p}.port"), msg);
            } else {
                endpoints.insert(key, Seen::new(p.clone(), listener));
            }
            let tls = l.tls.as_ref().map_or(TlsMode::None, |t| t.value);
            if tls != TlsMode::None && l.transport.value != TransportKind::Tcp {
                self.error(
                    l.tls.as_ref().expect("set"),
                    format!("{p}.tls"),
                    "TLS is defined for NVMe/TCP listeners only",
                );
            }
            out.push((
                ListenerConfig {
                    name: l.name.value.clone(),
                    transport: l.transport.value,
                    address,
                    port,
                    tls,
                },
                l.port.referenced,
            ));
        }
        out
    }

    fn port(&mut self, port: &Spanned<u64>, field: &str) -> Option<u16> {
        match port.value {
            0 => {
                self.error(port, field, "port 0 is not allowed; use 1..=65535");
                None
            }
            p if p > u64::from(u16::MAX) => {
                self.error(port, field, format!("must be 1..=65535, got {p}"));
                None
            }
            p => Some(p as u16),
        }
    }

    /// Checks a listener or backend name: syntax and uniqueness.
    fn name(
        &mut self,
        name: &Spanned<String>,
        field: &str,
        what: &str,
        seen: &mut HashMap<String, Seen>,
    ) {
        let value = &name.value;
        let valid = !value.is_empty()
            && value.len() <= NAME_MAX_LEN
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !valid {
            let msg = format!(
                "invalid {what} name {value:?}: use 1..={NAME_MAX_LEN} characters from A-Z a-z 0-9 _ - ."
            );
            self.error(name, field, msg);
        }
        if let Some(first) = seen.get(value) {
            let msg = format!("duplicate {what} name {value:?} (first: {first})");
            self.error(name, field, msg);
        } else {
            seen.insert(
                value.clone(),
                Seen::new(field.trim_end_matches(".name"), name),
            );
        }
    }

    fn backends(&mut self, raw: &[Spanned<RawBackend>]) -> Vec<BackendConfig> {
        let mut names: HashMap<String, Seen> = HashMap::new();
        let mut drives: HashMap<(String, u32), Seen> = HashMap::new();
        raw.iter()
            .enumerate()
            .map(|(i, backend)| {
                let p = format!("backends[{i}]");
                self.name(
                    &backend.value.name,
                    &format!("{p}.name"),
                    "backend",
                    &mut names,
                );
                let cfg = self.backend(backend, &p);
                if let (BackendKind::Nvme { pci, nsid, .. }, Some(at)) =
                    (&cfg.kind, &backend.value.pci)
                {
                    let key = (pci.clone(), *nsid);
                    if let Some(first) = drives.get(&key) {
                        let msg = format!("namespace {nsid} of {pci} is already used by {first}");
                        self.error(at, format!("{p}.pci"), msg);
                    } else {
                        drives.insert(key, Seen::new(p.clone(), at));
                    }
                }
                cfg
            })
            .collect()
    }

    fn backend(&mut self, backend: &Spanned<RawBackend>, p: &str) -> BackendConfig {
        let b = &backend.value;
        let block_size = b.block_size.as_ref().and_then(|bs| match bs.value {
            512 | 4096 => Some(bs.value as u32),
            other => {
                let msg = format!("must be 512 or 4096, got {other}");
                self.error(bs, format!("{p}.block_size"), msg);
                None
            }
        });
        let size = b.size.as_ref().and_then(|size| {
            let field = format!("{p}.size");
            let bytes = match &size.value {
                RawSize::Bytes(n) => *n,
                RawSize::Text(text) => match parse_size(text) {
                    Ok(n) => n,
                    Err(msg) => {
                        self.error(size, field, msg);
                        return None;
                    }
                },
            };
            let bs = match (&b.block_size, block_size) {
                (Some(_), None) => return Some(bytes), // bad block_size, reported already
                (_, bs) => u64::from(bs.unwrap_or(512)),
            };
            if bytes == 0 {
                self.error(size, field, "must not be 0");
            } else if bytes % bs != 0 {
                let msg = format!("{bytes} bytes is not a multiple of the block size ({bs})");
                self.error(size, field, msg);
            }
            Some(bytes)
        });
        if b.kind.value != RawBackendType::Nvme {
            for (field, at) in [
                ("pci", b.pci.as_ref().map(|s| s.referenced)),
                ("nsid", b.nsid.as_ref().map(|s| s.referenced)),
                (
                    "io_timeout_ms",
                    b.io_timeout_ms.as_ref().map(|s| s.referenced),
                ),
            ] {
                if let Some(at) = at {
                    self.error_at(at, format!("{p}.{field}"), "only valid for nvme backends");
                }
            }
        }
        let kind = match b.kind.value {
            RawBackendType::Nvme => self.nvme_backend(backend, p),
            RawBackendType::Ram => {
                for (field, at) in [
                    ("path", b.path.as_ref().map(|s| s.referenced)),
                    ("direct", b.direct.as_ref().map(|s| s.referenced)),
                ] {
                    if let Some(at) = at {
                        self.error_at(at, format!("{p}.{field}"), "only valid for file backends");
                    }
                }
                if b.size.is_none() {
                    self.error(backend, format!("{p}.size"), "required for ram backends");
                }
                BackendKind::Ram {
                    size: size.unwrap_or(0),
                    block_size: block_size.unwrap_or(512),
                }
            }
            RawBackendType::File => {
                let path = match &b.path {
                    None => {
                        self.error(backend, format!("{p}.path"), "required for file backends");
                        PathBuf::new()
                    }
                    Some(path) => self.file_path(path, b, size, p),
                };
                BackendKind::File {
                    path,
                    size,
                    block_size,
                    direct: b.direct.as_ref().map(|d| d.value),
                }
            }
        };
        BackendConfig {
            name: b.name.value.clone(),
            kind,
        }
    }

    /// `type: nvme`: a drive's PCI address and namespace; no file or RAM fields.
    fn nvme_backend(&mut self, backend: &Spanned<RawBackend>, p: &str) -> BackendKind {
        let b = &backend.value;
        for (field, at) in [
            ("path", b.path.as_ref().map(|s| s.referenced)),
            ("direct", b.direct.as_ref().map(|s| s.referenced)),
            ("size", b.size.as_ref().map(|s| s.referenced)),
            ("block_size", b.block_size.as_ref().map(|s| s.referenced)),
        ] {
            if let Some(at) = at {
                let msg = "not valid for nvme backends (the drive's namespace has its own)";
                self.error_at(at, format!("{p}.{field}"), msg);
            }
        }
        let pci = match &b.pci {
            None => {
                self.error(backend, format!("{p}.pci"), "required for nvme backends");
                String::new()
            }
            Some(pci) => {
                let addr = pci.value.trim().to_ascii_lowercase();
                if !backend::nvme::vfio::valid_pci_address(&addr) {
                    let msg = format!(
                        "invalid PCI address {:?}: expected domain:bus:device.function, e.g. 0000:00:04.0",
                        pci.value
                    );
                    self.error(pci, format!("{p}.pci"), msg);
                }
                addr
            }
        };
        let nsid = match &b.nsid {
            None => 1,
            Some(n) if (1..=NSID_MAX).contains(&n.value) => n.value as u32,
            Some(n) => {
                let msg = format!("must be 1..={NSID_MAX} (0xFFFFFFFE), got {}", n.value);
                self.error(n, format!("{p}.nsid"), msg);
                1
            }
        };
        let io_timeout_ms = b.io_timeout_ms.as_ref().map(|t| {
            if !(100..=600_000).contains(&t.value) {
                let msg = format!("must be 100..=600000 milliseconds, got {}", t.value);
                self.error(t, format!("{p}.io_timeout_ms"), msg);
            }
            t.value
        });
        BackendKind::Nvme {
            pci,
            nsid,
            io_timeout_ms,
            sgl: b.sgl.as_ref().is_none_or(|s| s.value),
        }
    }

    /// Resolves a file backend's path and checks what is there now.
    fn file_path(
        &mut self,
        path: &Spanned<String>,
        b: &RawBackend,
        size: Option<u64>,
        p: &str,
    ) -> PathBuf {
        let field = format!("{p}.path");
        if path.value.is_empty() {
            self.error(path, field, "must not be empty");
            return PathBuf::new();
        }
        let resolved = self.resolve(&path.value);
        let shown = resolved.display();
        match std::fs::metadata(&resolved) {
            Ok(meta) if meta.file_type().is_block_device() => {
                if let Some(at) = &b.size {
                    let msg =
                        format!("{shown} is a block device, which keeps its own size; remove size");
                    self.error(at, format!("{p}.size"), msg);
                }
            }
            Ok(meta) if meta.is_file() => match size {
                None if meta.len() == 0 => {
                    let msg = format!("{shown} is empty; set size to extend it");
                    self.error(path, field, msg);
                }
                Some(size) if size < meta.len() => {
                    let msg = format!(
                        "{shown} is already {} bytes, larger than size; files are never shrunk",
                        meta.len()
                    );
                    if let Some(at) = &b.size {
                        self.error(at, format!("{p}.size"), msg);
                    }
                }
                _ => {}
            },
            Ok(meta) if meta.is_dir() => {
                self.error(path, field, format!("{shown} is a directory"));
            }
            Ok(_) => {
                let msg = format!("{shown} is not a regular file or a block device");
                self.error(path, field, msg);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if b.size.is_none() {
                    let msg = format!("{shown} does not exist (set size to create it)");
                    self.error(path, field, msg);
                }
            }
            Err(e) => {
                self.error(path, field, format!("cannot access {shown}: {e}"));
            }
        }
        resolved
    }

    fn subsystems(
        &mut self,
        raw: &[Spanned<RawSubsystem>],
        listeners: &[(ListenerConfig, Location)],
        backends: &[BackendConfig],
    ) -> Vec<SubsystemConfig> {
        let mut refs = References {
            listener_names: unique(listeners.iter().map(|(l, _)| l.name.clone())),
            backend_names: unique(backends.iter().map(|b| b.name.clone())),
            backend_users: HashMap::new(),
            ids: HashMap::new(),
        };
        let mut nqns: HashMap<String, Seen> = HashMap::new();
        raw.iter()
            .enumerate()
            .map(|(i, subsystem)| {
                let p = format!("subsystems[{i}]");
                let nqn = &subsystem.value.nqn;
                if let Err(msg) = check_nqn(&nqn.value) {
                    self.error(nqn, format!("{p}.nqn"), msg);
                }
                if let Some(first) = nqns.get(&nqn.value) {
                    let msg = format!("duplicate subsystem NQN {:?} (first: {first})", nqn.value);
                    self.error(nqn, format!("{p}.nqn"), msg);
                } else {
                    nqns.insert(nqn.value.clone(), Seen::new(p.clone(), subsystem));
                }
                self.subsystem(&subsystem.value, &p, &mut refs)
            })
            .collect()
    }

    fn subsystem(&mut self, s: &RawSubsystem, p: &str, refs: &mut References) -> SubsystemConfig {
        let nqn = s.nqn.value.clone();
        let serial = match &s.serial {
            Some(serial) => {
                self.ascii_field(serial, &format!("{p}.serial"), SERIAL_MAX_LEN);
                serial.value.clone()
            }
            None => derive_serial(&nqn),
        };
        let model = match &s.model {
            Some(model) => {
                self.ascii_field(model, &format!("{p}.model"), MODEL_MAX_LEN);
                model.value.clone()
            }
            None => DEFAULT_MODEL.to_owned(),
        };

        let mut hosts_seen: HashMap<String, Seen> = HashMap::new();
        for (i, host) in s.hosts.iter().enumerate() {
            let field = format!("{p}.hosts[{i}]");
            if let Err(msg) = check_nqn(&host.value) {
                self.error(host, &field, msg);
            }
            if let Some(first) = hosts_seen.get(&host.value) {
                let msg = format!("host {:?} is listed twice (first: {first})", host.value);
                self.error(host, field, msg);
            } else {
                hosts_seen.insert(host.value.clone(), Seen::new(field, host));
            }
        }

        let listeners = match &s.listeners {
            None => refs.listener_names.clone(),
            Some(list) => {
                if list.value.is_empty() {
                    self.error(
                        list,
                        format!("{p}.listeners"),
                        "names no listener; omit the field to use all listeners",
                    );
                }
                let mut seen: HashMap<String, Seen> = HashMap::new();
                for (i, name) in list.value.iter().enumerate() {
                    let field = format!("{p}.listeners[{i}]");
                    if !refs.listener_names.contains(&name.value) {
                        let msg = format!(
                            "unknown listener {:?} {}",
                            name.value,
                            known("listeners", &refs.listener_names)
                        );
                        self.error(name, field, msg);
                    } else if let Some(first) = seen.get(&name.value) {
                        let msg =
                            format!("listener {:?} is listed twice (first: {first})", name.value);
                        self.error(name, field, msg);
                    } else {
                        seen.insert(name.value.clone(), Seen::new(field, name));
                    }
                }
                list.value.iter().map(|n| n.value.clone()).collect()
            }
        };

        let ana_groups = self.ana_groups(&s.ana_groups, p, &listeners);
        let mut nsids: HashMap<u64, Seen> = HashMap::new();
        let namespaces = s
            .namespaces
            .iter()
            .enumerate()
            .map(|(i, ns)| {
                let np = format!("{p}.namespaces[{i}]");
                let ns = &ns.value;
                let nsid_ok = (1..=NSID_MAX).contains(&ns.nsid.value);
                if !nsid_ok {
                    let msg = format!("must be 1..={NSID_MAX} (0xFFFFFFFE), got {}", ns.nsid.value);
                    self.error(&ns.nsid, format!("{np}.nsid"), msg);
                } else if let Some(first) = nsids.get(&ns.nsid.value) {
                    let msg = format!("duplicate nsid {} (first: {first})", ns.nsid.value);
                    self.error(&ns.nsid, format!("{np}.nsid"), msg);
                } else {
                    nsids.insert(ns.nsid.value, Seen::new(np.clone(), &ns.nsid));
                }
                let nsid = if nsid_ok { ns.nsid.value as u32 } else { 0 };

                let backend = &ns.backend;
                let bfield = format!("{np}.backend");
                if !refs.backend_names.contains(&backend.value) {
                    let msg = format!(
                        "unknown backend {:?} {}",
                        backend.value,
                        known("backends", &refs.backend_names)
                    );
                    self.error(backend, bfield, msg);
                } else if let Some(first) = refs.backend_users.get(&backend.value) {
                    let msg = format!(
                        "backend {:?} is already used by {first}; a backend serves one namespace",
                        backend.value
                    );
                    self.error(backend, bfield, msg);
                } else {
                    refs.backend_users
                        .insert(backend.value.clone(), Seen::new(np.clone(), backend));
                }

                let uuid = match &ns.uuid {
                    Some(text) => {
                        let parsed = self.uuid(text, &format!("{np}.uuid"));
                        self.unique_id(refs, "uuid", &parsed, text, &np);
                        parsed
                    }
                    None => derive_namespace_uuid(&nqn, nsid),
                };
                let nguid = match &ns.nguid {
                    Some(text) => {
                        let parsed = self.hex_id::<16>(text, &format!("{np}.nguid"));
                        self.unique_id(refs, "nguid", &parsed, text, &np);
                        parsed
                    }
                    None => uuid,
                };
                let eui64 = match &ns.eui64 {
                    Some(text) => {
                        let parsed = self.hex_id::<8>(text, &format!("{np}.eui64"));
                        self.unique_id(refs, "eui64", &parsed, text, &np);
                        parsed
                    }
                    None => derive_eui64(&uuid),
                };
                let ana_group = match &ns.ana_group {
                    None => 1,
                    Some(g) if (1..=u64::from(ANA_GROUP_MAX)).contains(&g.value) => g.value as u32,
                    Some(g) => {
                        let msg = format!("must be 1..={ANA_GROUP_MAX}, got {}", g.value);
                        self.error(g, format!("{np}.ana_group"), msg);
                        1
                    }
                };
                let hosts = ns.hosts.as_ref().map(|list| {
                    let mut seen: HashMap<String, Seen> = HashMap::new();
                    for (j, h) in list.value.iter().enumerate() {
                        let field = format!("{np}.hosts[{j}]");
                        if let Err(msg) = check_nqn(&h.value) {
                            self.error(h, &field, msg);
                        } else if !s.allow_any_host && !s.hosts.iter().any(|x| x.value == h.value) {
                            let msg = format!(
                                "host {:?} may not connect to this subsystem (add it to \
                                 {p}.hosts or set allow_any_host)",
                                h.value
                            );
                            self.error(h, &field, msg);
                        }
                        if let Some(first) = seen.get(&h.value) {
                            let msg =
                                format!("host {:?} is listed twice (first: {first})", h.value);
                            self.error(h, field, msg);
                        } else {
                            seen.insert(h.value.clone(), Seen::new(field, h));
                        }
                    }
                    list.value.iter().map(|h| h.value.clone()).collect()
                });
                NamespaceConfig {
                    nsid,
                    backend: backend.value.clone(),
                    uuid,
                    nguid,
                    eui64,
                    ana_group,
                    hosts,
                }
            })
            .collect();

        SubsystemConfig {
            nqn,
            serial,
            model,
            allow_any_host: s.allow_any_host,
            hosts: s.hosts.iter().map(|h| h.value.clone()).collect(),
            require_auth: s.require_auth,
            listeners,
            all_listeners: s.listeners.is_none(),
            ana_groups,
            namespaces,
        }
    }

    /// Serial and model numbers: printable ASCII, 1..=max bytes.
    fn ascii_field(&mut self, value: &Spanned<String>, field: &str, max: usize) {
        let text = &value.value;
        if text.trim().is_empty() {
            self.error(value, field, "must not be empty");
        } else if !text.chars().all(|c| c.is_ascii_graphic() || c == ' ') {
            self.error(value, field, "must be printable ASCII");
        } else if text.len() > max {
            let msg = format!("is {} characters long; the limit is {max}", text.len());
            self.error(value, field, msg);
        }
    }

    fn uuid(&mut self, text: &Spanned<String>, field: &str) -> [u8; 16] {
        match uuid::Uuid::try_parse(text.value.trim()) {
            Ok(u) if u.is_nil() => {
                self.error(
                    text,
                    field,
                    "must not be all zeros (that means \"no UUID\")",
                );
                [0; 16]
            }
            Ok(u) => *u.as_bytes(),
            Err(_) => {
                let msg = format!(
                    "invalid UUID {:?}: expected 8-4-4-4-12 hex digits",
                    text.value
                );
                self.error(text, field, msg);
                [0; 16]
            }
        }
    }

    /// NGUID (N = 16) and EUI-64 (N = 8): 2N hex digits, `-` separators allowed.
    fn hex_id<const N: usize>(&mut self, text: &Spanned<String>, field: &str) -> [u8; N] {
        let digits: String = text.value.trim().chars().filter(|&c| c != '-').collect();
        let mut out = [0u8; N];
        let parsed = digits.len() == 2 * N
            && digits.is_ascii()
            && out.iter_mut().enumerate().all(|(i, byte)| {
                u8::from_str_radix(&digits[2 * i..2 * i + 2], 16)
                    .map(|b| *byte = b)
                    .is_ok()
            });
        if !parsed {
            let msg = format!(
                "invalid value {:?}: expected {} hex digits",
                text.value,
                2 * N
            );
            self.error(text, field, msg);
            return [0; N];
        }
        if out.iter().all(|&b| b == 0) {
            self.error(
                text,
                field,
                "must not be all zeros (that means \"not reported\")",
            );
        }
        out
    }

    /// Configured namespace identifiers must differ between namespaces.
    fn unique_id(
        &mut self,
        refs: &mut References,
        kind: &'static str,
        id: &[u8],
        at: &Spanned<String>,
        np: &str,
    ) {
        if id.iter().all(|&b| b == 0) {
            return;
        }
        let field = format!("{np}.{kind}");
        if let Some(first) = refs.ids.get(&(kind, id.to_vec())) {
            let msg = format!("{kind} is already used by {first}");
            self.error(at, field, msg);
        } else {
            refs.ids.insert((kind, id.to_vec()), Seen::new(field, at));
        }
    }

    fn metrics(
        &mut self,
        address: &Spanned<String>,
        listeners: &[(ListenerConfig, Location)],
    ) -> Option<SocketAddr> {
        let field = "metrics.address";
        let Ok(addr) = address.value.trim().parse::<SocketAddr>() else {
            let msg = format!(
                "invalid address {:?}: expected IP:port, e.g. 127.0.0.1:9100 or \"[::1]:9100\"",
                address.value
            );
            self.error(address, field, msg);
            return None;
        };
        if addr.port() == 0 {
            self.error(address, field, "port 0 is not allowed; use 1..=65535");
            return None;
        }
        if let Some((listener, at)) = listeners
            .iter()
            .find(|(l, _)| l.transport == TransportKind::Tcp && l.socket_addr() == addr)
        {
            let msg = format!(
                "{addr} is already used by TCP listener {:?} (line {})",
                listener.name,
                at.line()
            );
            self.error(address, field, msg);
        }
        Some(addr)
    }
}

/// Cross-references collected while checking subsystems.
struct References {
    listener_names: Vec<String>,
    backend_names: Vec<String>,
    /// Backend name -> the namespace that uses it.
    backend_users: HashMap<String, Seen>,
    /// (kind, bytes) of configured namespace identifiers -> where.
    ids: HashMap<(&'static str, Vec<u8>), Seen>,
}

/// Names in first-seen order without repeats (duplicates are reported elsewhere).
fn unique(names: impl Iterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in names {
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// `(known: a, b)` for unknown-reference messages.
fn known(what: &str, names: &[String]) -> String {
    if names.is_empty() {
        format!("(no {what} are defined)")
    } else {
        format!("(known: {})", names.join(", "))
    }
}

/// NVMe Qualified Name syntax (NVMe Base Specification, "NVMe Qualified Names"):
/// `nqn.yyyy-mm.<reverse domain>:<name>` or `nqn.2014-08.org.nvmexpress:uuid:<uuid>`,
/// ASCII, at most 223 bytes.
pub(super) fn check_nqn(nqn: &str) -> Result<(), String> {
    let fail = |why: &str| Err(format!("invalid NQN {nqn:?}: {why}"));
    if !nqn.is_ascii() {
        return fail("must be ASCII");
    }
    if nqn.len() > NQN_MAX_LEN {
        return fail(&format!(
            "is {} bytes long; the limit is {NQN_MAX_LEN}",
            nqn.len()
        ));
    }
    if nqn == DISCOVERY_NQN {
        return fail("is the well-known discovery NQN, which the target serves itself");
    }
    if let Some(uuid) = nqn.strip_prefix(UUID_NQN_PREFIX) {
        let hyphenated =
            uuid.len() == 36 && [8, 13, 18, 23].iter().all(|&i| uuid.as_bytes()[i] == b'-');
        return if hyphenated && uuid::Uuid::try_parse(uuid).is_ok() {
            Ok(())
        } else {
            fail("the UUID form needs a UUID in 8-4-4-4-12 hex digits after \"uuid:\"")
        };
    }
    let Some(rest) = nqn.strip_prefix("nqn.") else {
        return fail("must start with \"nqn.\" (nqn.yyyy-mm.reverse.domain:name)");
    };
    let date = rest.as_bytes();
    let date_ok = date.len() >= 8
        && date[..4].iter().all(u8::is_ascii_digit)
        && date[4] == b'-'
        && date[5..7].iter().all(u8::is_ascii_digit)
        && date[7] == b'.'
        && matches!(
            &rest[5..7],
            "01" | "02" | "03" | "04" | "05" | "06" | "07" | "08" | "09" | "10" | "11" | "12"
        );
    if !date_ok {
        return fail("expected a date yyyy-mm. after \"nqn.\" (nqn.yyyy-mm.reverse.domain:name)");
    }
    let rest = &rest[8..];
    let Some((domain, name)) = rest.split_once(':') else {
        return fail("expected \":name\" after the reverse domain name");
    };
    if name.is_empty() {
        return fail("expected a name after the ':'");
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if !domain.split('.').all(label_ok) {
        return fail(&format!("invalid reverse domain name {domain:?}"));
    }
    Ok(())
}

/// CPUs this process may run on, or `None` if that cannot be found out.
fn available_cpus() -> Option<Vec<u64>> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok()?;
    Some(
        (0..nix::sched::CpuSet::count())
            .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
            .map(|cpu| cpu as u64)
            .collect(),
    )
}

/// `0-3,6` for a sorted CPU list.
fn cpu_ranges(cpus: &[u64]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            i += 1;
            end = cpus[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(",")
    }
}
