//! From YAML text to a checked [`Config`]: deserialize, then check everything and collect
//! every problem with its location.
//!
//! Why this file is over 800 lines: it is one `Checker` walking the document top-down
//! (threads, listeners, backends, subsystems with their namespaces and hosts, metrics),
//! each field with its check and its own message; the walk shares the checker's state
//! (diagnostics, names seen, cross-references) from section to section, and reads best
//! in document order. The access sections (`hosts[]` credentials, reservations,
//! referrals, ANA groups) are in `validate/access.rs`; the NQN syntax check at the end
//! could move to a file of its own should this file grow further.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_saphyr::{Location, MessageFormatter, Spanned, UserMessageFormatter};

use super::raw::{
    RawAnaGroup, RawBackend, RawBackendType, RawConfig, RawHost, RawLimits, RawListener,
    RawReferral, RawReservations, RawSize, RawSubsystem,
};
use super::yaml_path::{rest_of_line, PathIndex, ROOT};

mod access;
use super::{
    default_max_unconnected_per_peer, derive_eui64, derive_namespace_uuid, derive_serial,
    parse_size, AnaGroupConfig, BackendConfig, BackendKind, Config, ConfigError, DhchapConfig,
    Diagnostic, DocaSettings, EngineKind, HostConfig, IoThreads, Limits, ListenerConfig,
    NamespaceConfig, ReferralConfig, ReservationsConfig, SubsystemConfig, TlsMode, TransportKind,
    DEFAULT_BE_QUEUE_ENTRIES, DEFAULT_MAX_IO_SIZE, DEFAULT_MODEL, MAX_IO_THREADS, MAX_MAX_IO_SIZE,
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

/// Unknown fields listed at most, before the rest of a file is read.
const MAX_UNKNOWN_FIELDS: usize = 20;

pub(super) fn parse(text: &str, source: &str, base: Option<&Path>) -> Result<Config, ConfigError> {
    // An unknown field (a typo, most often) is renamed or blanked out and the text read
    // again, so that every typo is listed in one go, with the other problems of the file;
    // any other syntax or type error ends the reading there.
    let mut diags = Vec::new();
    let mut text = std::borrow::Cow::Borrowed(text);
    let raw = loop {
        let err = match serde_saphyr::from_str::<RawConfig>(&text) {
            Ok(raw) => break Some(raw),
            Err(err) => err,
        };
        let index = PathIndex::build(&text);
        diags.push(syntax_diagnostic(&err, &text, &index, source));
        match past_unknown_field(&err, &text, &index) {
            // (Unchanged: line ends the parser counts and this code does not.)
            Some(t) if t == *text => {}
            Some(t) if diags.len() < MAX_UNKNOWN_FIELDS => {
                text = t.into();
                continue;
            }
            Some(_) => {
                let more = Diagnostic {
                    message: format!(
                        "{MAX_UNKNOWN_FIELDS} unknown fields listed; the rest of the file \
                         was not read"
                    ),
                    ..diags[diags.len() - 1].clone()
                };
                diags.push(more);
            }
            None => {}
        }
        break None;
    };
    let mut checker = Checker {
        source,
        base,
        diags,
    };
    match raw.map(|raw| checker.config(raw)) {
        Some(config) if checker.diags.is_empty() => Ok(config),
        _ => {
            let mut diags = checker.diags;
            diags.sort_by_key(|d| (d.line, d.column));
            Err(ConfigError::Invalid(diags))
        }
    }
}

/// `text` read again past the field `err` says is unknown: renamed to the field it most
/// likely meant when that fits in its place and its mapping lacks it (so that the rest
/// is checked as the user meant it), otherwise removed (its key and value turned to
/// spaces). Every other location stays where it was. `None` for any other error.
fn past_unknown_field(err: &serde_saphyr::Error, text: &str, index: &PathIndex) -> Option<String> {
    let err = err.without_snippet();
    let serde_saphyr::Error::SerdeUnknownField {
        field, expected, ..
    } = err
    else {
        return None;
    };
    let at = err.location().filter(|l| l.line() > 0)?;
    let start = (at.line(), at.column().max(1));
    let at_key =
        rest_of_line(text, start.0, start.1).is_some_and(|r| r.starts_with(field.as_str()));
    let rename = closest(field, expected).filter(|near| {
        at_key
            && near.chars().count() <= field.chars().count()
            && !index.has_sibling(start.0, start.1, near)
    });
    let end = match rename {
        Some(_) => None,
        // Only the key the error names goes.
        None if at_key => Some(index.field_end(text, start.0, start.1)?),
        None => return None,
    };
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let n = i as u64 + 1;
        for (j, c) in line.chars().enumerate() {
            let here = (n, j as u64 + 1);
            match (rename, end) {
                (Some(near), _) if n == start.0 && here.1 >= start.1 => {
                    let k = (here.1 - start.1) as usize;
                    if k < field.chars().count() {
                        out.push(near.chars().nth(k).unwrap_or(' '));
                    } else {
                        out.push(c);
                    }
                }
                (None, Some(end))
                    if here >= start && end.is_none_or(|e| here < e) && c != '\n' && c != '\r' =>
                {
                    out.push(' ')
                }
                _ => out.push(c),
            }
        }
    }
    Some(out)
}

/// Turns a deserializer error into a located diagnostic naming the field.
fn syntax_diagnostic(
    err: &serde_saphyr::Error,
    text: &str,
    index: &PathIndex,
    source: &str,
) -> Diagnostic {
    use serde_saphyr::Error as E;

    let err = err.without_snippet();
    let (mut line, mut column) = err
        .location()
        .filter(|l| l.line() > 0)
        .map_or((1, 1), |l| (l.line(), l.column().max(1)));
    let (field, message) = match err {
        E::SerdeUnknownField {
            field, expected, ..
        } => (
            index.key_at(line, column),
            match closest(field, expected) {
                Some(near) => format!(
                    "unknown field `{field}` (did you mean `{near}`? expected one of: {})",
                    expected.join(", ")
                ),
                None => format!(
                    "unknown field `{field}` (expected one of: {})",
                    expected.join(", ")
                ),
            },
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
        E::InvalidScalar { ty, .. } => (
            index.node_at(line, column),
            match value_at(text, line, column) {
                Some(v) => format!("{}, not `{v}`", expected_scalar(ty)),
                None => expected_scalar(ty),
            },
        ),
        // A single value or a mapping where a list belongs (`hosts: nqn...`, `backends:`
        // entries without `-`).
        E::Unexpected {
            expected: "sequence start",
            ..
        } => (
            index.node_at(line, column),
            "expected a list (lines starting with `- `, or `[a, b]`)".into(),
        ),
        E::Unexpected {
            expected: "mapping start",
            ..
        } => (
            index.node_at(line, column),
            "expected a mapping (`key: value` lines, or `{key: value}`)".into(),
        ),
        // Said of numbers too, when a sequence or mapping stands where a value should be.
        E::Unexpected {
            expected: "string scalar",
            ..
        } => {
            let field = index.node_at(line, column);
            let mut m = String::from("expected a single value, found a sequence or mapping");
            // The top-level `hosts:` shape copied into a subsystem.
            let subsystem_hosts = field
                .strip_prefix("subsystems[")
                .and_then(|r| r.split_once(']'))
                .is_some_and(|(_, rest)| rest.starts_with(".hosts["));
            if subsystem_hosts {
                m.push_str(
                    " (a subsystem's hosts are host NQN strings; a host's secrets go in the \
                     top-level hosts:)",
                );
            }
            (field, m)
        }
        other => {
            let said = UserMessageFormatter.format_message(other).into_owned();
            match unclosed_flow(text, line, column) {
                // The parser stops lines later, where the next block entry shows the
                // bracket was never closed: point at the bracket.
                Some((open, l, c)) => {
                    let m = format!(
                        "`{open}` is not closed (the parser stopped at line {line}, column \
                         {column}: {said})"
                    );
                    (line, column) = (l, c);
                    (index.node_at(line, column), m)
                }
                None => (index.node_at(line, column), said),
            }
        }
    };
    Diagnostic {
        source: source.to_owned(),
        line,
        column,
        field,
        message: sanitize(&message),
    }
}

/// The innermost flow collection (`{` or `[`, with its 1-based line and column) still
/// open at `line`:`column` of `text`, if any: a hint for an error the parser reports
/// only lines later. Conservative: a bracket counts only where YAML starts a flow
/// collection (at the start of a value: after the indentation, `- `, `? `, `key: `, or
/// inside another flow collection), never inside quoted strings (which may span
/// lines), comments, block scalars (`|`, `>`) or plain text like `x-{1`; anything it
/// cannot place (tags, anchors) is left alone.
fn unclosed_flow(text: &str, line: u64, column: u64) -> Option<(char, u64, u64)> {
    let mut open: Vec<(char, u64, u64)> = Vec::new();
    let mut quote: Option<char> = None;
    // The indentation of the line that began a block scalar: more indented lines (and
    // blank ones) are its text.
    let mut block: Option<usize> = None;
    for (l_no, l) in (1u64..=line).zip(text.lines()) {
        let indent = l.len() - l.trim_start_matches([' ', '\t']).len();
        if let Some(b) = block {
            if l.trim().is_empty() || indent > b {
                continue;
            }
            block = None;
        }
        let mut value_start = quote.is_none();
        let mut before: Option<char> = None;
        let mut chars = l.chars().zip(1u64..).peekable();
        while let Some((ch, col)) = chars.next() {
            if l_no == line && col >= column {
                break;
            }
            let last = before.replace(ch);
            if let Some(q) = quote {
                if ch == q {
                    // '' inside single quotes is an escaped quote.
                    if q == '\'' && chars.peek().is_some_and(|&(n, _)| n == '\'') {
                        chars.next();
                    } else {
                        quote = None;
                        value_start = false;
                    }
                } else if q == '"' && ch == '\\' {
                    chars.next();
                }
                continue;
            }
            let spaced = chars.peek().is_none_or(|&(n, _)| n == ' ' || n == '\t');
            let flow = !open.is_empty();
            match ch {
                ' ' | '\t' => {}
                '#' if last.is_none_or(|c| c == ' ' || c == '\t') => break,
                '\'' | '"' if value_start => quote = Some(ch),
                '{' | '[' if value_start || flow => {
                    open.push((ch, l_no, col));
                    value_start = true;
                }
                '}' | ']' if flow => {
                    open.pop();
                    value_start = false;
                }
                ',' if flow => value_start = true,
                ':' if flow || spaced => value_start = true,
                '-' | '?' if value_start && spaced => {}
                '|' | '>' if value_start && !flow => {
                    block = Some(indent);
                    break;
                }
                _ => value_start = false,
            }
        }
    }
    open.pop()
}

/// The expected field a misspelt one most likely meant: within two edits (a letter
/// missing, extra, changed or two swapped), the nearest.
fn closest<'a>(field: &str, expected: &[&'a str]) -> Option<&'a str> {
    expected
        .iter()
        .map(|e| (strsim::damerau_levenshtein(field, e), *e))
        .filter(|&(d, _)| d <= 2)
        .min_by_key(|&(d, _)| d)
        .map(|(_, e)| e)
}

fn expected_scalar(ty: &str) -> String {
    match ty {
        "u8" | "u16" | "u32" | "u64" | "usize" => "expected a non-negative integer".to_owned(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "expected an integer".to_owned(),
        // serde-saphyr names it "boolean".
        "bool" | "boolean" => "expected true or false".to_owned(),
        other => format!("invalid value for type {other}"),
    }
}

/// The plain scalar that starts at `line`:`column` (1-based), up to the end of the line, a
/// comment or the end of a flow item, for "expected X, not `Y`"; None when there is none.
fn value_at(text: &str, line: u64, column: u64) -> Option<String> {
    let rest = rest_of_line(text, line, column)?;
    let end = [" #", ",", "}", "]"]
        .iter()
        .filter_map(|stop| rest.find(stop))
        .min()
        .unwrap_or(rest.len());
    let v = rest[..end].trim();
    (!v.is_empty() && v.chars().count() <= 64).then(|| v.to_owned())
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
        let engine = raw.engine.as_ref().map_or(EngineKind::Soft, |e| {
            if let Some(why) = e.value.unavailable() {
                self.error(e, "engine", why);
            }
            e.value
        });
        let (control, problems) = super::control::check(raw.control.as_ref());
        for (at, field, message) in problems {
            self.error_at(at, field, message);
        }
        let metrics_allow_remote = raw.metrics.as_ref().is_some_and(|m| m.value.allow_remote);
        let limits = raw
            .limits
            .as_ref()
            .map_or_else(Limits::default, |l| self.limits(&l.value, max_io_size));
        let doca = self.doca(&raw, engine);
        Config {
            threads,
            listeners: listeners.into_iter().map(|(l, _)| l).collect(),
            backends,
            subsystems,
            metrics,
            max_io_size,
            engine,
            control,
            doca,
            source: self.source.to_owned(),
            hosts,
            reservations: raw
                .reservations
                .as_ref()
                .map_or_else(Default::default, |r| self.reservations(&r.value)),
            referrals: self.referrals(&raw.referrals),
            metrics_allow_remote,
            limits,
        }
    }

    /// `limits:`: counts from 1 to a million, the per-peer and unconnected limits no
    /// larger than the total, the per-peer unconnected limit no larger than either of
    /// them, timeouts from 100 ms to an hour, the connection buffer from `max_io_size`
    /// (one command must fit) to 4 GiB.
    fn limits(&mut self, raw: &RawLimits, max_io_size: u32) -> Limits {
        let d = Limits::default();
        let mut count = |v: &Option<Spanned<u64>>, name: &str, default: u32| -> u32 {
            let Some(v) = v else { return default };
            if !(1..=1_000_000).contains(&v.value) {
                let msg = format!("must be from 1 to 1000000, got {}", v.value);
                self.error(v, format!("limits.{name}"), msg);
                return default;
            }
            v.value as u32
        };
        let max_connections = count(&raw.max_connections, "max_connections", d.max_connections);
        let mut max_connections_per_peer = count(
            &raw.max_connections_per_peer,
            "max_connections_per_peer",
            d.max_connections_per_peer,
        );
        let mut max_unconnected = count(&raw.max_unconnected, "max_unconnected", d.max_unconnected);
        // A default above a configured total is lowered to it; a configured value above it
        // is an error (it could never be reached).
        for (v, value, name) in [
            (
                &raw.max_connections_per_peer,
                &mut max_connections_per_peer,
                "max_connections_per_peer",
            ),
            (
                &raw.max_unconnected,
                &mut max_unconnected,
                "max_unconnected",
            ),
        ] {
            if *value > max_connections {
                // Only a value that was accepted above (an invalid one is reported once).
                if let Some(v) = v.as_ref().filter(|v| v.value == u64::from(*value)) {
                    let msg = format!(
                        "{} is more than limits.max_connections ({max_connections})",
                        v.value
                    );
                    self.error(v, format!("limits.{name}"), msg);
                }
                *value = max_connections;
            }
        }
        // One address's share of the pre-Connect budget: by default a part of it (see
        // `default_max_unconnected_per_peer`), never more than the budget itself or than
        // the address may hold at all.
        let default_share =
            default_max_unconnected_per_peer(max_unconnected).min(max_connections_per_peer);
        let max_unconnected_per_peer = match &raw.max_unconnected_per_peer {
            None => default_share,
            Some(v) => {
                let field = "limits.max_unconnected_per_peer";
                if !(1..=1_000_000).contains(&v.value) {
                    let msg = format!("must be from 1 to 1000000, got {}", v.value);
                    self.error(v, field, msg);
                    default_share
                } else if v.value > u64::from(max_unconnected) {
                    let msg = format!(
                        "{} is more than limits.max_unconnected ({max_unconnected}), the budget \
                         of all addresses together (keep it well below, so that one address \
                         cannot lock every other host out)",
                        v.value
                    );
                    self.error(v, field, msg);
                    max_unconnected
                } else if v.value > u64::from(max_connections_per_peer) {
                    let msg = format!(
                        "{} is more than limits.max_connections_per_peer \
                         ({max_connections_per_peer}), so it could never be reached",
                        v.value
                    );
                    self.error(v, field, msg);
                    max_connections_per_peer
                } else {
                    v.value as u32
                }
            }
        };
        let mut ms = |v: &Option<Spanned<u64>>, name: &str, default: Duration| -> Duration {
            let Some(v) = v else { return default };
            if !(100..=3_600_000).contains(&v.value) {
                let msg = format!(
                    "must be from 100 (0.1 s) to 3600000 (an hour) milliseconds, got {}",
                    v.value
                );
                self.error(v, format!("limits.{name}"), msg);
                return default;
            }
            Duration::from_millis(v.value)
        };
        let icreq_timeout = ms(&raw.icreq_timeout_ms, "icreq_timeout_ms", d.icreq_timeout);
        let connect_timeout = ms(
            &raw.connect_timeout_ms,
            "connect_timeout_ms",
            d.connect_timeout,
        );
        let host_data_timeout = ms(
            &raw.host_data_timeout_ms,
            "host_data_timeout_ms",
            d.host_data_timeout,
        );
        let drain_timeout = ms(&raw.drain_timeout_ms, "drain_timeout_ms", d.drain_timeout);
        let mut connection_buffer = d.connection_buffer.max(u64::from(max_io_size));
        if let Some(b) = &raw.connection_buffer {
            let field = "limits.connection_buffer";
            let bytes = match &b.value {
                RawSize::Bytes(n) => Some(*n),
                RawSize::Text(text) => match parse_size(text) {
                    Ok(n) => Some(n),
                    Err(e) => {
                        self.error(b, field, e.to_string());
                        None
                    }
                },
            };
            if let Some(bytes) = bytes {
                if bytes < u64::from(max_io_size) || bytes > 4 << 30 {
                    let msg = format!(
                        "must be from max_io_size ({max_io_size} bytes: one command must fit) \
                         to 4GiB, got {bytes} bytes"
                    );
                    self.error(b, field, msg);
                } else {
                    connection_buffer = bytes;
                }
            }
        }
        Limits {
            max_connections,
            max_connections_per_peer,
            max_unconnected,
            max_unconnected_per_peer,
            icreq_timeout,
            connect_timeout,
            host_data_timeout,
            drain_timeout,
            connection_buffer,
        }
    }

    /// `doca:` (required with `engine: doca`), and what the doca engine cannot serve: a
    /// TCP listener.
    fn doca(&mut self, raw: &RawConfig, engine: EngineKind) -> Option<DocaSettings> {
        if engine == EngineKind::Doca {
            // DOCA STA's DPA checks no access views (sta::access): ANA states other than
            // optimized would not be enforced on offloaded I/O, so they are refused here.
            for (i, sub) in raw.subsystems.iter().enumerate() {
                for (j, g) in sub.value.ana_groups.iter().enumerate() {
                    self.error(
                        g,
                        format!("subsystems[{i}].ana_groups[{j}]"),
                        "ANA groups are not available with the doca engine (DOCA STA cannot \
                         enforce ANA states on offloaded I/O); remove them or use `engine: soft`",
                    );
                }
            }
            for (i, l) in raw.listeners.iter().enumerate() {
                if l.value.transport.value == TransportKind::Tcp {
                    self.error(
                        &l.value.transport,
                        format!("listeners[{i}].transport"),
                        "the doca engine serves NVMe/RDMA only (DOCA STA offloads RDMA queue \
                         pairs); use `transport: rdma`, or `engine: soft` for NVMe/TCP",
                    );
                }
            }
        }
        let Some(d) = &raw.doca else {
            if let (EngineKind::Doca, Some(e)) = (engine, &raw.engine) {
                self.error(
                    e,
                    "doca",
                    "engine: doca needs a `doca:` section naming its devices, e.g. \
                     `doca: { sta_device: mlx5_0, net_devices: [mlx5_2] }` (ibdev names; \
                     `nvmf-target preflight` lists them)",
                );
            }
            return None;
        };
        let d = &d.value;
        let name_ok = |s: &str| !s.is_empty() && s.len() < 64 && !s.contains(char::is_whitespace);
        if !name_ok(&d.sta_device.value) {
            self.error(
                &d.sta_device,
                "doca.sta_device",
                "must be an ibdev name (1-63 characters, no spaces), e.g. mlx5_0",
            );
        }
        if d.net_devices.value.is_empty() {
            self.error(
                &d.net_devices,
                "doca.net_devices",
                "at least one RDMA device (ibdev name) must carry NVMe-oF traffic",
            );
        }
        let mut net = Vec::new();
        for (i, n) in d.net_devices.value.iter().enumerate() {
            if !name_ok(&n.value) {
                self.error(
                    n,
                    format!("doca.net_devices[{i}]"),
                    "must be an ibdev name (1-63 characters, no spaces), e.g. mlx5_2",
                );
            } else if net.contains(&n.value) {
                self.error(
                    n,
                    format!("doca.net_devices[{i}]"),
                    format!("{} is listed twice", n.value),
                );
            } else {
                net.push(n.value.clone());
            }
        }
        let be_queue_entries = match &d.be_queue_entries {
            None => DEFAULT_BE_QUEUE_ENTRIES,
            Some(e) if e.value.is_power_of_two() && (2..=32768).contains(&e.value) => {
                e.value as u16
            }
            Some(e) => {
                self.error(
                    e,
                    "doca.be_queue_entries",
                    format!("must be a power of two from 2 to 32768, got {}", e.value),
                );
                DEFAULT_BE_QUEUE_ENTRIES
            }
        };
        Some(DocaSettings {
            sta_device: d.sta_device.value.clone(),
            net_devices: net,
            be_queue_entries,
        })
    }

    /// `max_io_size`: a power of two in MIN_MAX_IO_SIZE..=MAX_MAX_IO_SIZE (MDTS is a power
    /// of two of 4 KiB pages).
    fn max_io_size(&mut self, m: &Spanned<RawSize>) -> u32 {
        let bytes = match &m.value {
            RawSize::Bytes(n) => *n,
            RawSize::Text(text) => match parse_size(text) {
                Ok(n) => n,
                Err(e) => {
                    self.error(m, "max_io_size", e.to_string());
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
            // A TCP wildcard and another address it covers on one port: the kernel refuses
            // to bind the second, so the daemon would start without it. `::` is dual-stack
            // (unless net.ipv6.bindv6only is 1): it covers IPv4 addresses too.
            let covers = |w: &IpAddr, x: &IpAddr| {
                w.is_unspecified() && (w.is_ipv4() == x.is_ipv4() || (w.is_ipv6() && dual_stack()))
            };
            let overlap = (l.transport.value == TransportKind::Tcp)
                .then(|| {
                    endpoints.iter().find(|((t, a, pt), _)| {
                        *t == TransportKind::Tcp
                            && *pt == port
                            && (covers(a, &address) || covers(&address, a))
                    })
                })
                .flatten();
            if let Some(first) = endpoints.get(&key) {
                let msg = format!(
                    "{} {} is already used by {first}",
                    l.transport.value,
                    SocketAddr::new(address, port)
                );
                self.error(&l.port, format!("{p}.port"), msg);
            } else if let Some(((_, a, _), first)) = overlap {
                let msg = format!(
                    "tcp {} overlaps {first} on {}: a wildcard address and another address \
                     it covers cannot listen on the same port (the kernel refuses the second \
                     bind; \"::\" covers IPv4 too); use one wildcard listener, or specific \
                     addresses only",
                    SocketAddr::new(address, port),
                    SocketAddr::new(*a, port)
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
        // By device and inode where the file exists (hard links, symlinks, `..`), else by
        // path.
        let mut files: HashMap<(u64, u64, PathBuf), Seen> = HashMap::new();
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
                // Two backends on one file (by another name, a symlink, `..`) would give
                // two namespaces, each with its own identity, the same data.
                if let (BackendKind::File { path, .. }, Some(at)) = (&cfg.kind, &backend.value.path)
                {
                    use std::os::unix::fs::MetadataExt;
                    let key = match std::fs::metadata(path) {
                        Ok(m) => (m.dev(), m.ino(), PathBuf::new()),
                        Err(_) => (0, 0, path.clone()),
                    };
                    if let Some(first) = files.get(&key) {
                        let msg = format!(
                            "{} is already the file of {first}: two backends on one file \
                             would show hosts two namespaces with the same data",
                            path.display()
                        );
                        self.error(at, format!("{p}.path"), msg);
                    } else {
                        files.insert(key, Seen::new(p.clone(), at));
                    }
                }
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
                    Err(e) => {
                        self.error(size, field, e.to_string());
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
                    Some(path) => self.file_path(path, b, size, block_size, p),
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
        block_size: Option<u32>,
        p: &str,
    ) -> PathBuf {
        let field = format!("{p}.path");
        if path.value.is_empty() {
            self.error(path, field, "must not be empty");
            return PathBuf::new();
        }
        let resolved = self.resolve(&path.value);
        let shown = resolved.display();
        // 512 unless set; the backend may pick the file system's larger direct I/O
        // alignment instead, which only opening the file shows.
        let block = block_size.unwrap_or(512);
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
                None if meta.len() < u64::from(block) => {
                    let msg = format!(
                        "{shown} is {} bytes, less than one {block}-byte block; set size to extend it",
                        meta.len()
                    );
                    self.error(path, field, msg);
                }
                // A file larger than `size` keeps its size (files are never cut): `size`
                // is what a missing or smaller file is extended to, and a file grown on
                // disk since (its namespace grown by a reload) must not make the config
                // it was grown under invalid.
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
                // The daemon creates the file, never the directories above it.
                let dir = match resolved.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d,
                    _ => Path::new("."),
                };
                match std::fs::metadata(dir) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        let msg = format!(
                            "directory {} does not exist (create it: the daemon creates only the file)",
                            dir.display()
                        );
                        self.error(path, field, msg);
                    }
                    _ if b.size.is_none() => {
                        let msg = format!("{shown} does not exist (set size to create it)");
                        self.error(path, field, msg);
                    }
                    _ => {}
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
                if let Err(e) = check_nqn(&nqn.value) {
                    self.error(nqn, format!("{p}.nqn"), e.to_string());
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
            if let Err(e) = check_nqn(&host.value) {
                self.error(host, &field, e.to_string());
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
                            self.error(h, &field, msg.to_string());
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
pub(super) fn check_nqn(nqn: &str) -> Result<(), NqnError> {
    let fail = |why: NqnProblem| {
        Err(NqnError {
            nqn: nqn.to_owned(),
            why,
        })
    };
    if !nqn.is_ascii() {
        return fail(NqnProblem::NotAscii);
    }
    if nqn.len() > NQN_MAX_LEN {
        return fail(NqnProblem::TooLong(nqn.len()));
    }
    if nqn == DISCOVERY_NQN {
        return fail(NqnProblem::Discovery);
    }
    if let Some(uuid) = nqn.strip_prefix(UUID_NQN_PREFIX) {
        let hyphenated =
            uuid.len() == 36 && [8, 13, 18, 23].iter().all(|&i| uuid.as_bytes()[i] == b'-');
        return if hyphenated && uuid::Uuid::try_parse(uuid).is_ok() {
            Ok(())
        } else {
            fail(NqnProblem::BadUuid)
        };
    }
    let Some(rest) = nqn.strip_prefix("nqn.") else {
        return fail(NqnProblem::NoPrefix);
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
        return fail(NqnProblem::BadDate);
    }
    let rest = &rest[8..];
    let Some((domain, name)) = rest.split_once(':') else {
        return fail(NqnProblem::NoName);
    };
    if name.is_empty() {
        return fail(NqnProblem::EmptyName);
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if !domain.split('.').all(label_ok) {
        return fail(NqnProblem::BadDomain(domain.to_owned()));
    }
    Ok(())
}

/// An NQN that breaks the syntax rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid NQN {nqn:?}: {why}")]
pub(super) struct NqnError {
    nqn: String,
    why: NqnProblem,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum NqnProblem {
    #[error("must be ASCII")]
    NotAscii,
    #[error("is {0} bytes long; the limit is {NQN_MAX_LEN}")]
    TooLong(usize),
    #[error("is the well-known discovery NQN, which the target serves itself")]
    Discovery,
    #[error("the UUID form needs a UUID in 8-4-4-4-12 hex digits after \"uuid:\"")]
    BadUuid,
    #[error("must start with \"nqn.\" (nqn.yyyy-mm.reverse.domain:name)")]
    NoPrefix,
    #[error("expected a date yyyy-mm. after \"nqn.\" (nqn.yyyy-mm.reverse.domain:name)")]
    BadDate,
    #[error("expected \":name\" after the reverse domain name")]
    NoName,
    #[error("expected a name after the ':'")]
    EmptyName,
    #[error("invalid reverse domain name {0:?}")]
    BadDomain(String),
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

/// Whether a socket bound to `::` takes IPv4 too: Linux's net.ipv6.bindv6only, 0 unless
/// the machine says otherwise (as the kernel defaults).
fn dual_stack() -> bool {
    static DUAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DUAL.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only").map_or(true, |v| v.trim() != "1")
    })
}
