//! The control protocol: one request line, one reply line, both JSON objects.
//!
//! Request: `{"version": 1, "command": "<name>", ...arguments}`. Commands and their
//! arguments:
//!
//! | command       | arguments                                         |
//! |---------------|---------------------------------------------------|
//! | `status`      | none                                              |
//! | `subsystems`  | none                                              |
//! | `controllers` | none                                              |
//! | `disconnect`  | `host` (a host NQN) or `subsystem` + `cntlid`     |
//! | `reload`      | none                                              |
//! | `config`      | none (the text of the running config)             |
//!
//! Reply: `{"version": 1, "ok": true, "result": {...}}` or
//! `{"version": 1, "ok": false, "error": "<why>"}`. A request the daemon cannot serve
//! (not JSON, another version, an unknown command or argument) gets an error reply and
//! the connection stays usable for the next line; an oversized request, a client that
//! does not finish its line before the deadline, or a peer without permission gets an
//! error reply and the connection is closed.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The protocol version this binary speaks.
pub const VERSION: u64 = 1;

/// Every command the daemon serves, for error messages.
pub const COMMANDS: &[&str] = &[
    "status",
    "subsystems",
    "controllers",
    "disconnect",
    "reload",
    "config",
];

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Status,
    Subsystems,
    Controllers,
    Disconnect(DisconnectTarget),
    Reload,
    Config,
}

/// What `disconnect` tears down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DisconnectTarget {
    /// Every controller of this host NQN.
    Host(String),
    /// One controller.
    Controller { subsystem: String, cntlid: u16 },
}

impl Command {
    /// The request line for this command (without the newline).
    pub fn to_request(&self) -> String {
        let mut m = Map::new();
        m.insert("version".into(), VERSION.into());
        let name = match self {
            Command::Status => "status",
            Command::Subsystems => "subsystems",
            Command::Controllers => "controllers",
            Command::Reload => "reload",
            Command::Config => "config",
            Command::Disconnect(t) => {
                match t {
                    DisconnectTarget::Host(h) => {
                        m.insert("host".into(), h.clone().into());
                    }
                    DisconnectTarget::Controller { subsystem, cntlid } => {
                        m.insert("subsystem".into(), subsystem.clone().into());
                        m.insert("cntlid".into(), (*cntlid).into());
                    }
                }
                "disconnect"
            }
        };
        m.insert("command".into(), name.into());
        Value::Object(m).to_string()
    }
}

/// Parses one request line. The error is the text of the error reply.
pub fn parse_request(line: &str) -> Result<Command, String> {
    let value: Value =
        serde_json::from_str(line).map_err(|e| format!("bad request: not a JSON object: {e}"))?;
    let Value::Object(mut m) = value else {
        return Err("bad request: expected a JSON object".into());
    };
    match m.remove("version") {
        Some(Value::Number(n)) if n.as_u64() == Some(VERSION) => {}
        Some(v) => {
            return Err(format!(
                "unsupported protocol version {v} (this daemon speaks version {VERSION})"
            ))
        }
        None => return Err(format!("bad request: missing \"version\" (use {VERSION})")),
    }
    let name = match m.remove("command") {
        Some(Value::String(s)) => s,
        Some(other) => {
            return Err(format!(
                "bad request: \"command\" must be a string, got {other}"
            ))
        }
        None => return Err("bad request: missing \"command\"".into()),
    };
    let cmd = match name.as_str() {
        "status" => Command::Status,
        "subsystems" => Command::Subsystems,
        "controllers" => Command::Controllers,
        "reload" => Command::Reload,
        "config" => Command::Config,
        "disconnect" => Command::Disconnect(disconnect_target(&mut m)?),
        other => {
            return Err(format!(
                "unknown command {other:?} (this daemon serves: {})",
                COMMANDS.join(", ")
            ))
        }
    };
    if let Some(extra) = m.keys().next() {
        return Err(format!(
            "bad request: command {name:?} takes no argument {extra:?}"
        ));
    }
    Ok(cmd)
}

fn disconnect_target(m: &mut Map<String, Value>) -> Result<DisconnectTarget, String> {
    let text = |v: Value, what: &str| match v {
        Value::String(s) if !s.is_empty() => Ok(s),
        other => Err(format!(
            "bad request: disconnect: \"{what}\" must be a non-empty string, got {other}"
        )),
    };
    match (m.remove("host"), m.remove("subsystem"), m.remove("cntlid")) {
        (Some(h), None, None) => Ok(DisconnectTarget::Host(text(h, "host")?)),
        (None, Some(s), Some(c)) => {
            let cntlid = c
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .ok_or_else(|| {
                    format!("bad request: disconnect: \"cntlid\" must be 0..=65535, got {c}")
                })?;
            Ok(DisconnectTarget::Controller {
                subsystem: text(s, "subsystem")?,
                cntlid,
            })
        }
        _ => Err(
            "bad request: disconnect takes either \"host\" or both \"subsystem\" and \"cntlid\""
                .into(),
        ),
    }
}

/// The reply line for a result (without the newline).
pub fn reply_ok(result: Value) -> String {
    serde_json::json!({"version": VERSION, "ok": true, "result": result}).to_string()
}

/// The reply line for an error (without the newline).
pub fn reply_err(error: &str) -> String {
    serde_json::json!({"version": VERSION, "ok": false, "error": error}).to_string()
}

// ---------------------------------------------------------------------------- results
// Field names below are the documented, stable interface (docs/control.md): add fields,
// never rename or remove one.

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub pid: u32,
    /// RFC 3339, UTC.
    pub started: String,
    pub uptime_seconds: u64,
    pub engine: String,
    /// The config file (or `<embedded default>`).
    pub config: String,
    pub io_threads: Vec<IoThreadStatus>,
    pub listeners: Vec<ListenerStatus>,
    pub subsystems: usize,
    pub controllers: usize,
    /// What the config file asks for that does not run ([`RunningConfig::pending`]).
    #[serde(default)]
    pub pending: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IoThreadStatus {
    pub index: usize,
    pub qps: u64,
    /// Progress passes that found work, and passes that found none, since start.
    pub busy_polls: u64,
    pub idle_polls: u64,
    /// Capsules the engine served itself / handed to the daemon, since start.
    pub offloaded: u64,
    pub non_offloaded: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListenerStatus {
    pub name: String,
    pub transport: String,
    pub address: String,
    pub port: u16,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubsystemInfo {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    /// Listener names; empty with `all_listeners` true when it is on every listener.
    pub listeners: Vec<String>,
    pub all_listeners: bool,
    pub controllers: usize,
    pub namespaces: Vec<NamespaceInfo>,
    /// ANA state of every group its namespaces are in, on every listener it is on.
    pub ana_groups: Vec<AnaGroupInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AnaGroupInfo {
    /// ANAGRPID.
    pub id: u32,
    pub states: Vec<AnaPathState>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AnaPathState {
    pub listener: String,
    /// `optimized`, `non_optimized`, `inaccessible`, `persistent_loss` or `change`.
    pub state: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NamespaceInfo {
    pub nsid: u32,
    pub backend: String,
    /// The backend as it describes itself (kind, path, device).
    pub backend_description: String,
    pub block_size: u32,
    pub blocks: u64,
    pub size_bytes: u64,
    pub uuid: String,
    pub read_commands: u64,
    pub write_commands: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
    /// ANA group (ANAGRPID).
    pub ana_group: u32,
    /// The hosts that see it; `None`: every host of the subsystem.
    pub visible_to: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ControllerInfo {
    pub cntlid: u16,
    pub subsystem: String,
    pub host_nqn: String,
    /// `ip:port` of the host's admin queue connection (None if it is already gone).
    pub host_address: Option<String>,
    /// The listener name the admin queue came in on.
    pub listener: Option<String>,
    /// `tcp` or `rdma`.
    pub transport: String,
    /// When the admin queue's connection was accepted, RFC 3339 UTC.
    pub connected_since: Option<String>,
    pub connected_seconds: Option<u64>,
    pub discovery: bool,
    pub enabled: bool,
    /// Being torn down (keep-alive expired, removed, disconnected by an operator).
    pub retired: bool,
    pub kato_ms: u32,
    /// Commands its slow path failed (the Error Information log's count).
    pub errors: u64,
    /// Admin queue (qid 0) first, then the I/O queues by qid.
    pub queues: Vec<QueueInfo>,
    /// I/O the engine served on its queues (offloaded commands) since they connected;
    /// null when the engine does not count per queue.
    pub io: Option<ControllerIo>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ControllerIo {
    pub read_commands: u64,
    pub write_commands: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Flush, Write Zeroes, Dataset Management, Copy, ...
    pub other_commands: u64,
    pub errors: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueInfo {
    pub qid: u16,
    /// Entries (SQSIZE + 1) the host asked for in its Connect.
    pub depth: Option<u32>,
    pub io_thread: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Disconnected {
    pub controllers: Vec<DisconnectedController>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DisconnectedController {
    pub cntlid: u16,
    pub subsystem: String,
    pub host_nqn: String,
    pub queues: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReloadResult {
    pub config: String,
    /// False when nothing changed.
    pub changed: bool,
    /// One line per change, in the order applied; `restart required: ...` lines last.
    pub changes: Vec<String>,
    /// Parts of the change that failed (the rest was applied).
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunningConfig {
    /// The file it was read from (None: the embedded default).
    pub path: Option<String>,
    pub text: String,
    /// What that file asks for that the daemon does not run, as change lines (the
    /// change from what runs to the file): items that wait for a restart, and parts a
    /// reload could not apply (the next reload tries them again). Empty: it runs the file.
    #[serde(default)]
    pub pending: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_round_trips_through_its_request_line() {
        for c in [
            Command::Status,
            Command::Subsystems,
            Command::Controllers,
            Command::Reload,
            Command::Config,
            Command::Disconnect(DisconnectTarget::Host("nqn.h".into())),
            Command::Disconnect(DisconnectTarget::Controller {
                subsystem: "nqn.s".into(),
                cntlid: 7,
            }),
        ] {
            assert_eq!(parse_request(&c.to_request()), Ok(c.clone()), "{c:?}");
        }
    }

    #[test]
    fn bad_requests_get_a_reason() {
        let cases = [
            ("", "not a JSON object"),
            ("[1]", "expected a JSON object"),
            (r#"{"command":"status"}"#, "missing \"version\""),
            (
                r#"{"version":2,"command":"status"}"#,
                "unsupported protocol version 2",
            ),
            (r#"{"version":1}"#, "missing \"command\""),
            (
                r#"{"version":1,"command":"frobnicate"}"#,
                "unknown command \"frobnicate\"",
            ),
            (
                r#"{"version":1,"command":"status","x":1}"#,
                "takes no argument \"x\"",
            ),
            (r#"{"version":1,"command":"disconnect"}"#, "either \"host\""),
            (
                r#"{"version":1,"command":"disconnect","subsystem":"s","cntlid":70000}"#,
                "0..=65535",
            ),
            (
                r#"{"version":1,"command":"disconnect","host":""}"#,
                "non-empty",
            ),
        ];
        for (line, want) in cases {
            let err = parse_request(line).expect_err(line);
            assert!(err.contains(want), "{line}: {err:?} lacks {want:?}");
        }
    }
}
