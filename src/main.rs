//! `nvmf-target`: an NVMe-over-Fabrics target daemon (see DESIGN.md).
//!
//! This file is the command line: parse arguments, set up logging, load and check the
//! config, then hand over to [`daemon::run`]. With `--check-config` it stops after the
//! check, so operators (and `ExecStartPre=`) can validate a file without starting anything.

mod config;
mod daemon;
mod metrics;
mod notify;
mod ptpl;
mod rdma_cm;
mod refusals;
mod reload;
mod tls;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};

use crate::config::{Config, ConfigError};

/// NVMe-over-Fabrics target daemon.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// YAML config file (default: the embedded config, one 1 GiB RAM namespace on
    /// TCP 127.0.0.1:4420).
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Check the config (syntax, semantics, backend files) and exit: 0 if it is valid,
    /// 1 with every problem listed if not.
    #[arg(long)]
    check_config: bool,

    /// More logging: -v debug, -vv trace (RUST_LOG, when set, takes precedence).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,

    /// Log line format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.verbose, cli.log_format);

    let loaded = match &cli.config {
        Some(path) => Config::load(path),
        None => Ok(Config::embedded_default()),
    };
    let cfg = match loaded {
        Ok(cfg) => cfg,
        Err(err) => {
            report_config_error(&err, cli.check_config);
            return ExitCode::FAILURE;
        }
    };

    if cli.check_config {
        println!(
            "config OK: {} subsystems, {} namespaces, {} listeners",
            cfg.subsystems.len(),
            cfg.namespace_count(),
            cfg.listeners.len()
        );
        return ExitCode::SUCCESS;
    }

    log_config(&cfg);
    match daemon::run(cfg, cli.config) {
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Logging to stderr, which systemd hands to the journal.
mod logging {
    use std::fmt::Write as _;
    use std::io::IsTerminal as _;
    use std::os::fd::AsFd as _;

    use tracing::field::{Field, Visit};
    use tracing::{Event, Level, Subscriber};
    use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields, Writer};
    use tracing_subscriber::fmt::FmtContext;
    use tracing_subscriber::registry::LookupSpan;
    use tracing_subscriber::EnvFilter;

    use super::LogFormat;

    /// `-v`/`-vv` pick the level; a non-empty `RUST_LOG` replaces that choice entirely.
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
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(!journal && std::io::stderr().is_terminal());
        let result = match (format, journal) {
            (LogFormat::Json, _) => builder
                .event_format(JsonFormat {
                    timestamps: !journal,
                })
                .try_init(),
            (LogFormat::Text, true) => builder
                .event_format(SyslogPrefix(format::format().without_time()))
                .try_init(),
            (LogFormat::Text, false) => builder.try_init(),
        };
        if let Err(err) = result {
            eprintln!("nvmf-target: cannot set up logging: {err}");
        }
    }

    /// True when stderr is the journal stream systemd set up for this service
    /// (`JOURNAL_STREAM=<dev>:<inode>` matching stderr), as sd_journal_stream_fd(3)
    /// recommends; the journal adds its own timestamps then.
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

    /// Prefixes each line with its syslog priority (`<3>` error .. `<7>` debug), which
    /// journald turns into the entry's priority (so `journalctl -p warning` works).
    struct SyslogPrefix<F>(F);

    impl<S, N, F> FormatEvent<S, N> for SyslogPrefix<F>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
        F: FormatEvent<S, N>,
    {
        fn format_event(
            &self,
            ctx: &FmtContext<'_, S, N>,
            mut writer: Writer<'_>,
            event: &Event<'_>,
        ) -> std::fmt::Result {
            let priority = match *event.metadata().level() {
                Level::ERROR => 3,
                Level::WARN => 4,
                Level::INFO => 6,
                Level::DEBUG | Level::TRACE => 7,
            };
            write!(writer, "<{priority}>")?;
            self.0.format_event(ctx, writer, event)
        }
    }

    /// One JSON object a line: `timestamp` (unless the journal adds it), `level`,
    /// `target`, `spans` (outermost first), then the event's fields (`message`, ...).
    struct JsonFormat {
        timestamps: bool,
    }

    impl<S, N> FormatEvent<S, N> for JsonFormat
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
    {
        fn format_event(
            &self,
            ctx: &FmtContext<'_, S, N>,
            mut writer: Writer<'_>,
            event: &Event<'_>,
        ) -> std::fmt::Result {
            let meta = event.metadata();
            let mut out = String::from("{");
            if self.timestamps {
                out.push_str("\"timestamp\":");
                json_string(&mut out, &rfc3339_now());
                out.push(',');
            }
            out.push_str("\"level\":");
            json_string(&mut out, meta.level().as_str());
            out.push_str(",\"target\":");
            json_string(&mut out, meta.target());
            if let Some(scope) = ctx.event_scope() {
                out.push_str(",\"spans\":[");
                for (i, span) in scope.from_root().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    json_string(&mut out, span.name());
                }
                out.push(']');
            }
            let mut fields = JsonFields { out: &mut out };
            event.record(&mut fields);
            out.push('}');
            writeln!(writer, "{out}")
        }
    }

    struct JsonFields<'a> {
        out: &'a mut String,
    }

    impl JsonFields<'_> {
        fn key(&mut self, field: &Field) {
            self.out.push(',');
            json_string(self.out, field.name());
            self.out.push(':');
        }
    }

    impl Visit for JsonFields<'_> {
        fn record_str(&mut self, field: &Field, value: &str) {
            self.key(field);
            json_string(self.out, value);
        }

        fn record_bool(&mut self, field: &Field, value: bool) {
            self.key(field);
            let _ = write!(self.out, "{value}");
        }

        fn record_i64(&mut self, field: &Field, value: i64) {
            self.key(field);
            let _ = write!(self.out, "{value}");
        }

        fn record_u64(&mut self, field: &Field, value: u64) {
            self.key(field);
            let _ = write!(self.out, "{value}");
        }

        fn record_f64(&mut self, field: &Field, value: f64) {
            self.key(field);
            if value.is_finite() {
                let _ = write!(self.out, "{value}");
            } else {
                json_string(self.out, &value.to_string());
            }
        }

        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.key(field);
            json_string(self.out, &format!("{value:?}"));
        }
    }

    fn json_string(out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }

    /// Current UTC time as `2026-11-03T12:34:56.789012Z`.
    fn rfc3339_now() -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let secs = now.as_secs();
        let (days, rem) = (secs / 86_400, secs % 86_400);
        // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
        let z = days as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        format!(
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60,
            now.subsec_micros()
        )
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn json_escapes() {
            let mut out = String::new();
            super::json_string(&mut out, "a\"b\\c\nd\u{1}");
            assert_eq!(out, r#""a\"b\\c\nd\u0001""#);
        }

        #[test]
        fn timestamp_shape() {
            let ts = super::rfc3339_now();
            assert_eq!(ts.len(), "2026-11-03T12:34:56.789012Z".len(), "{ts}");
            assert!(ts.starts_with("20") && ts.ends_with('Z'), "{ts}");
        }
    }
}
