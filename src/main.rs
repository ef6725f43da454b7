//! `nvmf-target`: an NVMe-over-Fabrics target daemon (see DESIGN.md).
//!
//! This file is the command line: parse arguments, set up logging, load and check the
//! config, then hand over to [`engine::run`], which starts the configured engine and runs
//! [`daemon::run`] on it. With `--check-config` it stops after the
//! check, so operators (and `ExecStartPre=`) can validate a file without starting anything;
//! with `--diff` as well it also asks the running daemon what a reload would change.
//! `nvmf-target ctl ...` is the control socket's client (`control::client`).

mod config;
mod control;
mod daemon;
mod engine;
mod metrics;
mod notify;
mod preflight;
mod ptpl;
mod rdma_cm;
mod refusals;
mod reload;
mod startup_checks;
mod tls;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::config::{Config, ConfigError};

/// Locks `m`, poisoned or not: the daemon's mutexes guard plain data (no invariant spans
/// an unlock), so what a thread that panicked while holding one left is still usable.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// NVMe-over-Fabrics target daemon.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// YAML config file (default: the embedded config, one 1 GiB RAM namespace on
    /// TCP 127.0.0.1:4420).
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Check the config (syntax, semantics, backend files) and exit: 0 if it is valid,
    /// 1 with its problems listed if not (every misspelt field and every semantic
    /// problem; reading stops at another syntax or type error, or a missing field).
    #[arg(long)]
    check_config: bool,

    /// With --check-config: print what a reload of the file would change in the running
    /// daemon (asked over its control socket: --socket, else the file's control.path).
    #[arg(long, requires = "check_config")]
    diff: bool,

    /// With --diff: the running daemon's control socket.
    // An id of its own: clap hands a global argument's value (ctl's --socket) to every
    // argument of the same id up the command line.
    #[arg(
        id = "diff_socket",
        long = "socket",
        value_name = "PATH",
        requires = "diff"
    )]
    socket: Option<PathBuf>,

    /// More logging: -v debug, -vv trace (RUST_LOG, when set, takes precedence).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,

    /// Log line format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Ask the running daemon over its control socket (status, subsystems, controllers,
    /// disconnect, reload).
    Ctl(control::client::CtlArgs),
    /// Check what this machine lacks to serve the config: DOCA libraries and devices, a
    /// BlueField-3 DPA, RDMA links, IOMMU and VFIO binding of NVMe drives, P2P dma-buf,
    /// hugepages, memlock. One line per check (OK, FAIL with the fix, SKIP); exit
    /// status 1 if any check failed.
    Preflight,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Cmd::Ctl(args)) = &cli.command {
        return control::client::run(args);
    }
    logging::init(cli.verbose, cli.log_format);

    let loaded = match &cli.config {
        Some(path) => Config::load_with_text(path),
        None => Ok((
            Config::embedded_default(),
            config::EMBEDDED_DEFAULT.to_string(),
        )),
    };
    let (cfg, text) = match loaded {
        Ok(cfg) => cfg,
        Err(err) => {
            report_config_error(&err, cli.check_config || cli.command.is_some());
            return ExitCode::FAILURE;
        }
    };

    if cli.diff {
        let Some(file) = &cli.config else {
            eprintln!("--diff needs --config FILE: the file a reload would read");
            return ExitCode::FAILURE;
        };
        return match control::client::diff_against_running(&cfg, file, cli.socket.as_deref()) {
            Ok(text) => {
                control::client::emit(&text);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nvmf-target --diff: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Cmd::Preflight) = cli.command {
        let checks = preflight::run(&cfg, &preflight::System::here());
        return if preflight::report(&checks) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }

    if cli.check_config {
        for w in startup_checks::config_warnings(&cfg) {
            eprintln!("warning: {w}");
        }
        println!(
            "config OK: {}, {}, {}",
            counted(cfg.subsystems.len(), "subsystem"),
            counted(cfg.namespace_count(), "namespace"),
            counted(cfg.listeners.len(), "listener")
        );
        return ExitCode::SUCCESS;
    }

    log_config(&cfg);
    if let Some(w) = cli
        .config
        .as_deref()
        .and_then(startup_checks::config_permissions)
    {
        tracing::warn!("{w}");
    }
    for w in startup_checks::config_warnings(&cfg) {
        tracing::warn!("{w}");
    }
    match engine::run(cfg, text, cli.config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--check-config` prints the problems as they are (one `file:line:col: field: message`
/// a line, for editors and scripts); a starting daemon logs them.
fn report_config_error(err: &ConfigError, check_only: bool) {
    let diags = err.diagnostics();
    if check_only {
        eprintln!("{err}");
        if diags.len() > 1 {
            eprintln!("{} errors", diags.len());
        }
    } else if diags.is_empty() {
        tracing::error!("{err}");
    } else {
        for diag in diags {
            tracing::error!("{diag}");
        }
        tracing::error!("config has {} error(s); not starting", diags.len());
    }
}

/// What the daemon is about to serve, so the journal shows the resolved identifiers.
fn log_config(cfg: &Config) {
    use config::{BackendKind, IoThreads};

    tracing::info!("config {}", cfg.source);
    match &cfg.threads {
        IoThreads::Count(_) => tracing::debug!("io threads: {}", cfg.threads.count()),
        IoThreads::Cpus(cpus) => tracing::debug!("io threads pinned to cpus {cpus:?}"),
    }
    for l in &cfg.listeners {
        tracing::debug!("listener {}: {} {}", l.name, l.transport, l.socket_addr());
    }
    for b in &cfg.backends {
        match &b.kind {
            BackendKind::Ram { size, block_size } => {
                tracing::debug!(
                    "backend {}: ram, {size} bytes, {block_size}-byte blocks",
                    b.name
                )
            }
            BackendKind::File {
                path,
                size,
                block_size,
                direct,
            } => tracing::debug!(
                "backend {}: file {}, size {size:?}, block size {block_size:?}, direct {direct:?}",
                b.name,
                path.display()
            ),
            BackendKind::Nvme {
                pci,
                nsid,
                io_timeout_ms,
                sgl,
            } => tracing::debug!(
                "backend {}: nvme {pci} namespace {nsid}, io timeout {io_timeout_ms:?} ms, sgl {sgl}",
                b.name
            ),
        }
    }
    for s in &cfg.subsystems {
        tracing::debug!(
            "subsystem {}: serial {:?}, model {:?}, listeners {:?}, any host {}, hosts {:?}",
            s.nqn,
            s.serial,
            s.model,
            s.listeners,
            s.allow_any_host,
            s.hosts
        );
        for ns in &s.namespaces {
            tracing::debug!(
                "subsystem {} nsid {}: backend {}, uuid {}, nguid {}, eui64 {}",
                s.nqn,
                ns.nsid,
                ns.backend,
                uuid::Uuid::from_bytes(ns.uuid).hyphenated(),
                hex(&ns.nguid),
                hex(&ns.eui64)
            );
        }
    }
    if let Some(addr) = cfg.metrics {
        tracing::debug!("metrics on {addr}");
    }
}

/// `n` and the noun, which is plural unless `n` is 1.
pub(crate) fn counted(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Logging: text or JSON lines on stderr, or the journal's native protocol under
/// systemd. All formatting is tracing-subscriber's (and tracing-journald's).
mod logging {
    use std::io::IsTerminal as _;
    use std::os::fd::AsFd as _;

    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::EnvFilter;

    use super::LogFormat;

    /// `-v`/`-vv` pick the level; a non-empty `RUST_LOG` replaces that choice entirely.
    ///
    /// - Text, started by systemd with stderr on the journal: entries go to journald
    ///   with their priority, target and fields (`journalctl -p warning` works). If the
    ///   journal socket cannot be reached, plain lines on stderr without timestamps (the
    ///   journal stamps them).
    /// - Text otherwise: tracing-subscriber's line format, colours on a terminal.
    /// - JSON: one object a line on stderr (`timestamp` unless the journal adds one,
    ///   `level`, the event's fields at the top level, `target`, `spans`).
    pub fn init(verbose: u8, format: LogFormat) {
        let level = match verbose {
            0 => "info",
            1 => "debug",
            _ => "trace",
        };
        let filter = match std::env::var("RUST_LOG") {
            Ok(spec) if !spec.trim().is_empty() => EnvFilter::builder().parse_lossy(spec),
            _ => EnvFilter::new(level),
        };
        let journal = stderr_is_journal();
        let result = match format {
            LogFormat::Json => {
                let json = tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(true)
                    .with_writer(std::io::stderr);
                let registry = tracing_subscriber::registry().with(filter);
                if journal {
                    registry.with(json.without_time()).try_init()
                } else {
                    registry.with(json).try_init()
                }
            }
            LogFormat::Text if journal => match tracing_journald::layer() {
                Ok(layer) => tracing_subscriber::registry()
                    .with(filter)
                    .with(layer)
                    .try_init(),
                Err(e) => {
                    eprintln!("nvmf-target: journald socket unavailable ({e}); logging to stderr");
                    tracing_subscriber::registry()
                        .with(filter)
                        .with(
                            tracing_subscriber::fmt::layer()
                                .without_time()
                                .with_ansi(false)
                                .with_writer(std::io::stderr),
                        )
                        .try_init()
                }
            },
            LogFormat::Text => tracing_subscriber::registry()
                .with(filter)
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_ansi(std::io::stderr().is_terminal())
                        .with_writer(std::io::stderr),
                )
                .try_init(),
        };
        if let Err(err) = result {
            eprintln!("nvmf-target: cannot set up logging: {err}");
        }
    }

    /// True when stderr is the journal stream systemd set up for this service
    /// (`JOURNAL_STREAM=<dev>:<inode>` matching stderr), as sd_journal_stream_fd(3)
    /// recommends.
    fn stderr_is_journal() -> bool {
        let Ok(value) = std::env::var("JOURNAL_STREAM") else {
            return false;
        };
        let parsed = value
            .split_once(':')
            .and_then(|(dev, ino)| Some((dev.parse::<u64>().ok()?, ino.parse::<u64>().ok()?)));
        let Some((dev, ino)) = parsed else {
            return !value.is_empty();
        };
        match nix::sys::stat::fstat(std::io::stderr().as_fd()) {
            Ok(st) => st.st_dev == dev && st.st_ino == ino,
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::Parser as _;

    use super::{Cli, Cmd};

    /// `ctl`'s global `--socket` (which its own tests check) and the daemon's `--socket`
    /// for `--diff` live side by side in the whole command line.
    #[test]
    fn ctl_socket_and_the_diff_socket_are_apart() {
        let argv = ["nvmf-target", "ctl", "status", "--json", "--socket", "/s"];
        let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
        let Some(Cmd::Ctl(args)) = cli.command else {
            panic!("not ctl: {cli:?}");
        };
        assert!(args.json);
        assert_eq!(args.socket.as_deref(), Some(Path::new("/s")));
        assert_eq!(cli.socket, None);
        let argv = ["nvmf-target", "--check-config", "--diff", "--socket", "/s"];
        let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.socket.as_deref(), Some(Path::new("/s")));
        assert!(cli.command.is_none());
    }
}
