//! The control socket's client, in the daemon's own binary: `nvmf-target ctl ...` and
//! `nvmf-target --check-config --config FILE --diff`.
//!
//! Human-readable tables by default; `--json` prints the daemon's `result` object as it
//! came (field names documented in docs/control.md). Exit status: 0 when the daemon
//! answered `ok`, 1 otherwise (no daemon, permission denied, an error reply, or a reload
//! that applied with errors).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::protocol::{
    Command, ControllerInfo, DisconnectTarget, Disconnected, ReloadResult, RunningConfig, Status,
    SubsystemInfo,
};
use crate::config::{Config, EMBEDDED_DEFAULT_NAME};
use crate::counted as count;
use crate::reload::RESTART_PREFIX;

/// `nvmf-target ctl`: ask a running daemon over its control socket.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The daemon's control socket (default: /run/nvmf-target/control.sock as root,
    /// $XDG_RUNTIME_DIR/nvmf-target/control.sock otherwise).
    #[arg(long, value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,

    /// Without --socket: the socket `control.path` of this config file names (the
    /// default path if it names none or cannot be read: a file being fixed still
    /// reaches the daemon, whose reload then says what is wrong with it).
    #[arg(long, value_name = "FILE", global = true, conflicts_with = "socket")]
    pub config: Option<PathBuf>,

    /// Print the daemon's reply as JSON (for scripts) instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Version, uptime, engine, IO threads and their load, listeners.
    Status,
    /// Subsystems with their namespaces, backends, allowed hosts and listeners.
    Subsystems,
    /// Connected controllers: host, address, listener, queues, keep-alive, age.
    Controllers,
    /// Tear down a host's controllers, or one controller; the host sees its connections
    /// close (the Linux host reconnects).
    Disconnect {
        /// Every controller of this host NQN.
        #[arg(long, value_name = "HOSTNQN", conflicts_with = "controller")]
        host: Option<String>,
        /// One controller: subsystem NQN and CNTLID, e.g. nqn.2026-11.dev.x:disk:1.
        #[arg(long, value_name = "SUBNQN:CNTLID", required_unless_present = "host")]
        controller: Option<String>,
    },
    /// Re-read and apply the config file (as SIGHUP does); prints what was applied.
    Reload {
        /// When no daemon answers on the control socket (none configured, or not where
        /// --config's file says: a reload that moves it), send SIGHUP to this process
        /// instead; the outcome is then only in the daemon's log. For the systemd unit's
        /// ExecReload ($MAINPID).
        #[arg(long, value_name = "PID")]
        or_signal: Option<i32>,
    },
}

/// How long the client waits for the daemon's answer (the daemon gives its main thread
/// 60 s; a little more here so its own timeout message arrives).
const REPLY_WAIT: Duration = Duration::from_secs(70);

/// Runs `nvmf-target ctl ...`.
pub fn run(args: &CtlArgs) -> ExitCode {
    match run_inner(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nvmf-target ctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `reload --or-signal PID` where no control socket can be asked (`why`): SIGHUP to the
/// daemon instead; only its log says how the reload went.
fn reload_by_signal(pid: i32, why: &str) -> anyhow::Result<ExitCode> {
    let pid = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP)
        .with_context(|| format!("{why}, and SIGHUP to {pid}"))?;
    eprintln!(
        "nvmf-target ctl: {why}: sent SIGHUP to {pid} instead (the daemon's log says how the \
         reload went)"
    );
    Ok(ExitCode::SUCCESS)
}

fn run_inner(args: &CtlArgs) -> anyhow::Result<ExitCode> {
    // `None`: --config's file disables the control socket. Then there is none to ask: the
    // default path may be another daemon's.
    let path = match (&args.socket, &args.config) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(file)) => match Config::load(file) {
            Ok(c) => c.control.map(|c| c.path),
            Err(_) => Some(crate::config::default_socket_path()),
        },
        (None, None) => Some(crate::config::default_socket_path()),
    };
    let Some(path) = path else {
        let file = args.config.as_ref().expect("only a config disables it");
        return match &args.command {
            CtlCommand::Reload {
                or_signal: Some(pid),
            } => reload_by_signal(
                *pid,
                &format!("{} disables the control socket", file.display()),
            ),
            _ => bail!(
                "{} disables the control socket (control: {{enabled: false}}): no daemon to \
                 ask (reload: --or-signal PID, or send SIGHUP)",
                file.display()
            ),
        };
    };
    let command = match &args.command {
        CtlCommand::Status => Command::Status,
        CtlCommand::Subsystems => Command::Subsystems,
        CtlCommand::Controllers => Command::Controllers,
        CtlCommand::Reload { or_signal } => {
            if let Some(pid) = *or_signal {
                if UnixStream::connect(&path).is_err() {
                    let why = format!("no daemon answers at {}", path.display());
                    return reload_by_signal(pid, &why);
                }
            }
            Command::Reload
        }
        CtlCommand::Disconnect { host, controller } => {
            Command::Disconnect(match (host, controller) {
                (Some(h), _) => DisconnectTarget::Host(h.clone()),
                (None, Some(c)) => parse_controller(c)?,
                (None, None) => bail!("disconnect: give --host or --controller"),
            })
        }
    };
    let result = request(&path, &command)?;
    if args.json {
        emit(&format!("{}\n", serde_json::to_string_pretty(&result)?));
        let failed = matches!(command, Command::Reload)
            && result
                .get("errors")
                .and_then(Value::as_array)
                .is_some_and(|e| !e.is_empty());
        return Ok(if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        });
    }
    match command {
        Command::Status => emit(&render_status(&decode::<Status>(result)?)),
        Command::Subsystems => emit(&render_subsystems(&decode::<Vec<SubsystemInfo>>(result)?)),
        Command::Controllers => emit(&render_controllers(&decode::<Vec<ControllerInfo>>(result)?)),
        Command::Disconnect(_) => {
            for c in decode::<Disconnected>(result)?.controllers {
                emit(&format!(
                    "disconnected controller {} (host {}, subsystem {}, {} queue(s))\n",
                    c.cntlid, c.host_nqn, c.subsystem, c.queues
                ));
            }
        }
        Command::Reload => {
            let r = decode::<ReloadResult>(result)?;
            emit(&render_reload(&r));
            if !r.errors.is_empty() {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Config => unreachable!("not a ctl subcommand"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes to stdout; a reader that went away (`ctl status | head -1`, `grep -q`) ends
/// the output quietly instead of a panic (what `print!` does on EPIPE).
pub fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    if out
        .write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        // Nothing more can be said to anyone; the exit status still tells the result.
    }
}

/// `SUBNQN:CNTLID`: NQNs contain colons, so the CNTLID is after the last one.
fn parse_controller(text: &str) -> anyhow::Result<DisconnectTarget> {
    let Some((nqn, id)) = text.rsplit_once(':') else {
        bail!("--controller {text:?}: expected SUBNQN:CNTLID");
    };
    let cntlid: u16 = id
        .parse()
        .with_context(|| format!("--controller {text:?}: CNTLID {id:?} is not 0..=65535"))?;
    if nqn.is_empty() {
        bail!("--controller {text:?}: the subsystem NQN is empty");
    }
    Ok(DisconnectTarget::Controller {
        subsystem: nqn.to_string(),
        cntlid,
    })
}

fn decode<T: DeserializeOwned>(v: Value) -> anyhow::Result<T> {
    serde_json::from_value(v).context("the daemon's reply does not have the expected fields")
}

/// Sends one request and returns the `result` of an `ok` reply; an error reply, or no
/// reply, is an error naming the socket.
pub fn request(path: &Path, command: &Command) -> anyhow::Result<Value> {
    let mut stream = UnixStream::connect(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => anyhow::anyhow!(
            "no daemon at {} ({e}); is nvmf-target running, and is this its control.path? \
             (--socket PATH names another)",
            path.display()
        ),
        std::io::ErrorKind::PermissionDenied => anyhow::anyhow!(
            "{}: permission denied; the control socket is for root and the daemon's user \
             (and control.group, if configured)",
            path.display()
        ),
        _ => anyhow::anyhow!("{}: {e}", path.display()),
    })?;
    stream.set_read_timeout(Some(REPLY_WAIT))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    // A peer the daemon refuses (permission, busy) gets its reason and is closed before
    // its request is read: the write may fail, and the reason is still there to read.
    let sent = stream.write_all(format!("{}\n", command.to_request()).as_bytes());
    let mut line = String::new();
    let read = BufReader::new(&stream).read_line(&mut line);
    if line.trim().is_empty() {
        sent.with_context(|| format!("{}: sending the request", path.display()))?;
        read.with_context(|| format!("{}: reading the reply", path.display()))?;
        bail!(
            "{}: the daemon closed the connection without a reply",
            path.display()
        );
    }
    let reply: Value = serde_json::from_str(line.trim())
        .with_context(|| format!("{}: the reply is not JSON: {line:?}", path.display()))?;
    if reply.get("ok") == Some(&Value::Bool(true)) {
        Ok(reply.get("result").cloned().unwrap_or(Value::Null))
    } else {
        let why = reply
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("error reply without a reason");
        bail!("{why}")
    }
}

/// `--check-config --config FILE --diff`: what a reload of `candidate` (already loaded
/// and checked) would change in the running daemon, which is asked for its config over
/// `socket` (default: the candidate's `control.path`).
pub fn diff_against_running(
    candidate: &Config,
    file: &Path,
    socket: Option<&Path>,
) -> anyhow::Result<String> {
    let path = match (socket, &candidate.control) {
        (Some(p), _) => p.to_path_buf(),
        (None, Some(c)) => c.path.clone(),
        // The default path may be another daemon's.
        (None, None) => bail!(
            "{} disables the control socket (control: {{enabled: false}}): give the running \
             daemon's with --socket PATH",
            file.display()
        ),
    };
    let running: RunningConfig = decode(request(&path, &Command::Config)?)?;
    let old = match &running.path {
        Some(p) => Config::parse_as_file(&running.text, Path::new(p)),
        None => Config::parse(&running.text, EMBEDDED_DEFAULT_NAME),
    }
    .map_err(|e| {
        anyhow::anyhow!(
            "the running config ({}) no longer checks out here, so there is nothing sound to \
             compare with:\n{e}",
            running.path.as_deref().unwrap_or(EMBEDDED_DEFAULT_NAME)
        )
    })?;
    // A reload re-reads the daemon's own file: a candidate that leaves the PTPL state file
    // to its default would have it beside that file, not beside the candidate.
    let mut candidate = candidate.clone();
    if let Some(running_path) = running.path.as_deref().map(Path::new) {
        if candidate.reservations.state_file == Some(Config::ptpl_default_for(file)) {
            candidate.reservations.state_file = Some(Config::ptpl_default_for(running_path));
        }
    }
    let d = crate::reload::diff(&old, &candidate);
    let from = running.path.as_deref().unwrap_or(EMBEDDED_DEFAULT_NAME);
    let mut out = String::new();
    if d.is_empty() {
        out += &format!(
            "no changes: {} is the file the daemon last loaded (from {from})\n",
            file.display()
        );
    } else {
        let lines = d.summary();
        out += &format!(
            "a reload of {} would apply {} change(s) to the running daemon (from {from}):\n",
            file.display(),
            lines.len()
        );
        for l in lines {
            out += &format!("  {l}\n");
        }
        if !d.backends_resized.is_empty() {
            // What the running store can reach is known only inside the daemon.
            out += "  (a resize past the address space the running store reserved at start, \
                    or under an engine that cannot resize, waits for a restart instead; the \
                    reload says which)\n";
        }
    }
    out += &render_pending(&running.pending);
    Ok(out)
}

// ------------------------------------------------------------------------- rendering

/// Left-aligned columns, two spaces apart.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s += c;
            } else {
                s += &format!("{c:<w$}  ");
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        out += &line(r.clone());
    }
    out
}

fn duration_text(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s:02}s"),
        (0, _, _) => format!("{h}h{m:02}m"),
        _ => format!("{d}d{h:02}h"),
    }
}

pub(crate) fn bytes_text(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

pub fn render_status(s: &Status) -> String {
    let mut out = format!(
        "nvmf-target {} (pid {}), engine {}, up {} since {}\nconfig {}\n{} subsystem(s), {} controller(s)\n\n",
        s.version,
        s.pid,
        s.engine,
        duration_text(s.uptime_seconds),
        s.started,
        s.config,
        s.subsystems,
        s.controllers
    );
    let rows: Vec<Vec<String>> = s
        .io_threads
        .iter()
        .map(|t| {
            let polls = t.busy_polls + t.idle_polls;
            let busy = if polls == 0 {
                "-".to_string()
            } else {
                format!("{:.1}%", t.busy_polls as f64 * 100.0 / polls as f64)
            };
            vec![
                format!("io{}", t.index),
                t.qps.to_string(),
                t.busy_polls.to_string(),
                t.idle_polls.to_string(),
                busy,
                t.offloaded.to_string(),
                t.non_offloaded.to_string(),
            ]
        })
        .collect();
    out += &table(
        &[
            "IO THREAD",
            "QPS",
            "BUSY POLLS",
            "IDLE POLLS",
            "BUSY",
            "OFFLOADED",
            "NON-OFFLOADED",
        ],
        &rows,
    );
    out += "\n";
    let rows: Vec<Vec<String>> = s
        .listeners
        .iter()
        .map(|l| {
            vec![
                l.name.clone(),
                l.transport.clone(),
                l.address.clone(),
                l.port.to_string(),
            ]
        })
        .collect();
    out += &table(&["LISTENER", "TRANSPORT", "ADDRESS", "PORT"], &rows);
    out += &render_pending(&s.pending);
    out
}

/// What the config file asks for that does not run, or nothing when it all runs.
fn render_pending(pending: &[String]) -> String {
    if pending.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "
not running yet ({}): what failed is tried again by a reload of the same file; \
         \"restart required\" waits for a restart\n",
        count(pending.len(), "item")
    );
    for l in pending {
        out += &format!("  {l}\n");
    }
    out
}

pub fn render_subsystems(list: &[SubsystemInfo]) -> String {
    if list.is_empty() {
        return "no subsystems\n".into();
    }
    let mut out = String::new();
    for (i, s) in list.iter().enumerate() {
        if i > 0 {
            out += "\n";
        }
        out += &format!(
            "subsystem {}\n  serial {}, model {}, {} controller(s)\n",
            s.nqn, s.serial, s.model, s.controllers
        );
        let hosts = match (s.allow_any_host, s.hosts.is_empty()) {
            (true, true) => "any host".to_string(),
            (true, false) => format!("any host (listed: {})", s.hosts.join(", ")),
            (false, true) => "no host".to_string(),
            (false, false) => s.hosts.join(", "),
        };
        out += &format!("  hosts: {hosts}\n");
        let listeners = if s.all_listeners {
            "all".to_string()
        } else {
            s.listeners.join(", ")
        };
        out += &format!("  listeners: {listeners}\n");
        for g in &s.ana_groups {
            let states: Vec<String> = g
                .states
                .iter()
                .map(|p| format!("{} {}", p.listener, p.state))
                .collect();
            out += &format!("  ANA group {}: {}\n", g.id, states.join(", "));
        }
        let rows: Vec<Vec<String>> = s
            .namespaces
            .iter()
            .map(|n| {
                vec![
                    n.nsid.to_string(),
                    n.backend.clone(),
                    bytes_text(n.size_bytes),
                    n.block_size.to_string(),
                    n.read_commands.to_string(),
                    n.write_commands.to_string(),
                    bytes_text(n.read_bytes),
                    bytes_text(n.write_bytes),
                    n.errors.to_string(),
                    n.backend_description.clone(),
                ]
            })
            .collect();
        if rows.is_empty() {
            out += "  no namespaces\n";
        } else {
            for l in table(
                &[
                    "NSID",
                    "BACKEND",
                    "SIZE",
                    "BLOCK",
                    "READS",
                    "WRITES",
                    "READ",
                    "WRITTEN",
                    "ERRORS",
                    "BACKEND IS",
                ],
                &rows,
            )
            .lines()
            {
                out += &format!("  {l}\n");
            }
        }
    }
    out
}

pub fn render_controllers(list: &[ControllerInfo]) -> String {
    if list.is_empty() {
        return "no controllers connected\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|c| {
            let depths: Vec<String> = c
                .queues
                .iter()
                .map(|q| q.depth.map_or("?".into(), |d| d.to_string()))
                .collect();
            let state = if c.retired {
                "disconnecting"
            } else if c.enabled {
                "enabled"
            } else {
                "connected"
            };
            vec![
                c.cntlid.to_string(),
                c.subsystem.clone(),
                c.host_nqn.clone(),
                c.host_address.clone().unwrap_or_else(|| "-".into()),
                format!("{}/{}", c.listener.as_deref().unwrap_or("-"), c.transport),
                format!("{} ({})", c.queues.len(), depths.join(",")),
                if c.kato_ms == 0 {
                    "off".into()
                } else {
                    format!("{}s", c.kato_ms as f64 / 1000.0)
                },
                c.connected_seconds.map_or("-".into(), duration_text),
                c.io.as_ref().map_or("-".into(), |io| {
                    format!(
                        "{}/{} ({}/{})",
                        io.read_commands,
                        io.write_commands,
                        bytes_text(io.read_bytes),
                        bytes_text(io.write_bytes)
                    )
                }),
                state.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "CNTLID",
            "SUBSYSTEM",
            "HOST NQN",
            "HOST ADDRESS",
            "LISTENER",
            "QUEUES (DEPTHS)",
            "KATO",
            "CONNECTED",
            "READS/WRITES (BYTES)",
            "STATE",
        ],
        &rows,
    )
}

pub fn render_reload(r: &ReloadResult) -> String {
    let restart = r
        .changes
        .iter()
        .filter(|l| l.starts_with(RESTART_PREFIX))
        .count();
    let live = r.changes.len() - restart;
    let mut out = format!("reload of {}: ", r.config);
    out += &match (r.changed, r.errors.len()) {
        (false, _) => "no changes".to_string(),
        (true, 0) => format!("applied {}", count(live, "change")),
        (true, e) => format!(
            "{} to apply, {} (what failed was not applied; a reload of the same file \
             tries it again)",
            count(live, "change"),
            count(e, "error")
        ),
    };
    if restart > 0 {
        out += &format!("; {} at the next restart", count(restart, "more change"));
    }
    out += "\n";
    for l in &r.changes {
        out += &format!("  {l}\n");
    }
    for e in &r.errors {
        out += &format!("  error: {e}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_summary_counts_live_changes_restarts_and_errors_apart() {
        let r = |changes: &[&str], errors: &[&str]| ReloadResult {
            config: "t.yaml".into(),
            changed: !changes.is_empty(),
            changes: changes.iter().map(|s| s.to_string()).collect(),
            errors: errors.iter().map(|s| s.to_string()).collect(),
        };
        let head = |r: &ReloadResult| render_reload(r).lines().next().unwrap().to_string();
        assert_eq!(head(&r(&[], &[])), "reload of t.yaml: no changes");
        assert_eq!(
            head(&r(&["listener tcp1: add (tcp 127.0.0.1:1)"], &[])),
            "reload of t.yaml: applied 1 change"
        );
        assert_eq!(
            head(&r(
                &[
                    "backend b: add (ram)",
                    "subsystem s namespace 2: add on backend b",
                    "restart required: io threads: 1 unpinned -> 2 unpinned",
                ],
                &[
                    "backend b: no memory",
                    "subsystem s namespace 2: backend b unavailable"
                ],
            )),
            "reload of t.yaml: 2 changes to apply, 2 errors (what failed was not applied; a \
             reload of the same file tries it again); 1 more change at the next restart"
        );
    }

    #[test]
    fn ctl_takes_json_and_socket_before_or_after_the_subcommand() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            ctl: CtlArgs,
        }
        for args in [
            ["x", "--json", "--socket", "/s", "status"],
            ["x", "status", "--json", "--socket", "/s"],
        ] {
            let c = Cli::try_parse_from(args).unwrap().ctl;
            assert!(c.json && c.socket.as_deref() == Some(Path::new("/s")));
            assert!(matches!(c.command, CtlCommand::Status));
        }
    }

    /// A file that disables the control socket never sends --diff (or ctl) to the
    /// default path, which may be another daemon's.
    #[test]
    fn a_disabled_socket_is_never_the_default_one() {
        let text = format!(
            "{}\ncontrol: {{enabled: false}}\n",
            crate::config::EMBEDDED_DEFAULT
        );
        let c = Config::parse(&text, "t.yaml").expect("the default with no socket");
        assert!(c.control.is_none());
        let e = diff_against_running(&c, Path::new("t.yaml"), None).unwrap_err();
        assert!(e.to_string().contains("disables the control socket"), "{e}");
    }

    #[test]
    fn controller_argument_splits_at_the_last_colon() {
        assert_eq!(
            parse_controller("nqn.2026-11.dev.x:disk:17").unwrap(),
            DisconnectTarget::Controller {
                subsystem: "nqn.2026-11.dev.x:disk".into(),
                cntlid: 17
            }
        );
        assert!(parse_controller("nqn.x:disk").is_err());
        assert!(parse_controller("nodelimiter").is_err());
        assert!(parse_controller(":3").is_err());
    }

    #[test]
    fn durations_and_sizes_read_well() {
        assert_eq!(duration_text(5), "5s");
        assert_eq!(duration_text(65), "1m05s");
        assert_eq!(duration_text(3700), "1h01m");
        assert_eq!(duration_text(90000), "1d01h");
        assert_eq!(bytes_text(512), "512 B");
        assert_eq!(bytes_text(64 << 20), "64.0 MiB");
    }
}
