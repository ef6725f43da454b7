//! The running daemon, written against the engine contract (`sta::Engine`); which engine
//! runs is decided once, in `crate::engine`.
//!
//! Threads (DESIGN.md, "Threads and ownership"):
//! - the main thread owns the engine's main context, the listeners and the signals; it
//!   applies configuration changes, hands each accepted connection to the IO thread with
//!   the fewest QPs and runs the keep-alive timers (`main_loop.rs`, `runtime.rs`,
//!   `listeners.rs`);
//! - each IO thread owns one engine IO context and runs it to completion. It answers the
//!   capsules the engine hands up (Fabrics Connect, admin commands, unusual I/O) through
//!   the shared `nvmf::target::Target`, which only this slow path locks (`io_thread.rs`,
//!   `commands.rs`);
//! - the RDMA CM thread (`crate::rdma_cm`) takes RDMA connect requests and events.
//!
//! What they share is in `shared.rs`; the subsystem registry (target and engine, one
//! place) in `subsystems.rs`; host credentials, ANA, referrals and the reservation state
//! file in the target's terms in `policy.rs`.

mod backends;
mod commands;
mod conn_limits;
mod control;
mod dh_jobs;
mod health;
mod io_errors;
mod io_thread;
mod listeners;
mod main_loop;
mod policy;
mod ptpl_writer;
mod queue_facts;
mod runtime;
mod service_thread;
mod shared;
mod subsystems;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use crossbeam_channel::{unbounded, Receiver};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nvmf::target::{Target, TargetOptions};
use sta::{Engine, IoSeed};

use self::control::ControlHook;
use self::io_thread::IoThread;
use self::listeners::MAX_IO_QUEUES;
use self::runtime::Runtime;
use self::shared::{Shared, ThreadMsg};
use crate::config::{Config, IoThreads};
use crate::reload::diff;

/// How long a graceful stop waits for IO threads to drain before giving up on them.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Serve `cfg` with `engine` until SIGTERM/SIGINT (or an IO thread dies), then stop
/// gracefully: listeners close, every queue drains, backends are flushed.
///
/// `text` is the config's text as read (what the control socket reports as running).
pub fn run<E: Engine>(
    engine: E,
    cfg: Config,
    text: String,
    config_path: Option<PathBuf>,
) -> anyhow::Result<()> {
    let source = config_path.as_ref().map_or_else(
        || "<embedded default>".to_string(),
        |p| p.display().to_string(),
    );
    tracing::info!(
        "nvmf-target {} starting with {source} (engine {})",
        env!("CARGO_PKG_VERSION"),
        engine.name()
    );
    let started = std::time::SystemTime::now();

    // Signals first, so every thread spawned later inherits the blocked mask and only the
    // signalfd sees them.
    let mut mask = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        mask.add(s);
    }
    mask.thread_block().context("blocking signals")?;
    let sfd = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .context("signalfd")?;

    let mut engine = engine;
    let (ptpl, persisted) = policy::open_ptpl(&cfg)?;
    let target = new_target(&engine, ptpl.is_some());
    let count = cfg.threads.count();
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..count {
        let (tx, rx) = unbounded();
        senders.push(tx);
        receivers.push(rx);
    }
    let shared = Arc::new(Shared::new(
        target,
        engine.stats(),
        engine.access_publisher(),
        ptpl,
        senders,
        &cfg.limits,
    ));
    crate::startup_checks::raise_nofile(cfg.limits.max_connections);
    if let Some(w) = cfg
        .metrics
        .and_then(|a| crate::startup_checks::metrics_exposure(a, cfg.metrics_allow_remote))
    {
        tracing::warn!("{w}");
    }
    // Metrics before the IO threads: a taken port fails start-up with nothing to undo.
    let _metrics = match cfg.metrics {
        Some(addr) => Some(
            crate::metrics::serve(addr, metrics_source(&shared, started))
                .with_context(|| format!("metrics: cannot listen on {addr}"))?,
        ),
        None => {
            tracing::info!(
                "metrics: off (metrics: {{address: 127.0.0.1:9100}} in the config serves /metrics)"
            );
            None
        }
    };
    // The control socket too: an explicitly configured path that cannot be bound fails
    // start-up here (the default path only warns).
    let mut ctl = ControlHook::start(&cfg, config_path.as_deref(), text, engine.name(), started)?;
    let threads = start_io_threads(&mut engine, &shared, &cfg.threads, receivers)?;
    dh_jobs::spawn(&shared).context("spawning the DH-HMAC-CHAP threads")?;
    ptpl_writer::spawn(&shared).context("spawning the reservation state file's writer")?;

    // Start-up is the change from nothing to the configuration; at start-up any error
    // is fatal.
    let mut rt = Runtime::new(&cfg, engine, shared.clone(), persisted);
    let errors = rt.apply(&diff(&rt.cfg, &cfg), &cfg).errors;
    if let Some(first) = errors.first() {
        for t in 0..count {
            shared.send(t, ThreadMsg::Stop);
        }
        bail!("{first}");
    }
    rt.cfg = cfg;
    rt.drop_unrestored_reservations();
    let listeners = rt.listeners.len();
    tracing::info!("ready: {listeners} listener(s), {count} IO thread(s)");
    crate::notify::status(&format!(
        "serving: {listeners} listener(s), {count} IO thread(s)"
    ));
    crate::notify::ready();

    let stop_reason = main_loop::serve(&mut rt, &sfd, &mut ctl, &threads);
    let died = threads.alive() < threads.count();
    // No control requests while draining: the socket goes first.
    drop(ctl);
    stop(rt, threads, &stop_reason)?;
    if died {
        bail!("an IO thread died (see above); exiting with an error so the service restarts");
    }
    Ok(())
}

/// The protocol side, sized by what the engine can do (`ptpl_capable`: reservations can
/// persist, there is a writable state file).
fn new_target<E: Engine>(engine: &E, ptpl_capable: bool) -> Target {
    let caps = engine.caps();
    tracing::info!(
        "max I/O size {} KiB (MDTS {}), MAXH2CDATA {} KiB",
        caps.max_io_size / 1024,
        (caps.max_io_size / 4096).trailing_zeros(),
        caps.max_h2c_data / 1024
    );
    let mut target = Target::new(TargetOptions {
        max_queue_depth: caps.max_queue_depth,
        max_io_queues: MAX_IO_QUEUES,
        mdts: (caps.max_io_size / 4096).trailing_zeros() as u8,
        ioccsz_bytes: caps.max_incapsule_data,
        max_namespaces: 1024,
        kato_default_ms: 120_000,
        firmware_revision: env!("CARGO_PKG_VERSION").chars().take(8).collect(),
        ptpl_capable,
        // What the engine runs on the offloaded path (Identify advertises only that).
        copy_max_bytes: if caps.copy { caps.max_io_size } else { 0 },
        fused_compare_write: caps.fused_compare_write,
        // An engine that serves I/O without checking access views (DOCA STA) cannot
        // enforce reservations on it: they are not offered at all then (sta::access).
        reservations: caps.access_views,
    });
    // Challenges and DH private keys come from the kernel's generator (getrandom(2)),
    // which only fails on kernels older than 3.17 without /dev/urandom.
    target.set_entropy(Box::new(|buf: &mut [u8]| {
        getrandom::getrandom(buf).expect("the operating system's random generator failed")
    }));
    target
}

/// The IO threads, running: their handles and how many are still alive.
pub(super) struct IoThreadSet {
    handles: Vec<JoinHandle<()>>,
    alive: Arc<AtomicUsize>,
}

impl IoThreadSet {
    pub fn count(&self) -> usize {
        self.handles.len()
    }
    pub fn alive(&self) -> usize {
        self.alive.load(Ordering::SeqCst)
    }
}

/// One thread per configured IO thread (pinned when `cpus:` names CPUs), each starting
/// its engine IO context on itself.
fn start_io_threads<E: Engine>(
    engine: &mut E,
    shared: &Arc<Shared>,
    layout: &IoThreads,
    receivers: Vec<Receiver<ThreadMsg>>,
) -> anyhow::Result<IoThreadSet> {
    let cpus = match layout {
        IoThreads::Count(_) => None,
        IoThreads::Cpus(list) => Some(list.clone()),
    };
    let alive = Arc::new(AtomicUsize::new(receivers.len()));
    let mut handles = Vec::new();
    for (i, rx) in receivers.into_iter().enumerate() {
        let seed = engine.io_create().context("creating an IO context")?;
        let shared = shared.clone();
        let cpu = cpus.as_ref().map(|c| c[i]);
        let alive = AliveGuard {
            index: i,
            alive: alive.clone(),
        };
        let h = std::thread::Builder::new()
            .name(format!("nvmft-io{i}"))
            .spawn(move || {
                let _alive = alive;
                if let Some(cpu) = cpu {
                    pin_to(i, cpu);
                }
                match seed.start() {
                    Ok(io) => IoThread::new(i, io, shared, rx).run(),
                    Err(e) => {
                        tracing::error!("io thread {i}: cannot start its engine context: {e}")
                    }
                }
            })
            .context("spawning an IO thread")?;
        handles.push(h);
    }
    Ok(IoThreadSet { handles, alive })
}

/// Counts an IO thread out of the alive count when it ends, however it ends. A panic is
/// logged here (the panic message itself went to stderr, the journal); the main loop then
/// sees the thread gone and stops the daemon: no more watchdog pings, and a non-zero exit
/// status so that systemd (`Restart=on-failure`) starts it again. Its connections are
/// lost either way; the hosts reconnect to the new process.
struct AliveGuard {
    index: usize,
    alive: Arc<AtomicUsize>,
}

impl Drop for AliveGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!(
                "io thread {} panicked: stopping the daemon (exit status 1, so the service \
                 manager restarts it)",
                self.index
            );
        }
        self.alive.fetch_sub(1, Ordering::SeqCst);
    }
}

fn pin_to(thread: usize, cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    let r = set
        .set(cpu)
        .and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set));
    if let Err(e) = r {
        tracing::warn!("io thread {thread}: cannot pin to cpu {cpu}: {e}");
    }
}

/// Graceful stop: no new connections, drain every QP, flush backends.
fn stop<E: Engine>(mut rt: Runtime<E>, threads: IoThreadSet, reason: &str) -> anyhow::Result<()> {
    tracing::info!("stopping ({reason}): closing listeners, draining IO threads");
    crate::notify::stopping();
    crate::notify::status(&format!("stopping ({reason})"));
    rt.listeners.close_all();
    let count = threads.count();
    for t in 0..count {
        rt.shared.send(t, ThreadMsg::Stop);
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    tracing::info!("waiting up to {STOP_TIMEOUT:?} for {count} IO thread(s) to drain");
    while threads.alive() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stuck = threads.alive();
    if stuck > 0 {
        tracing::error!(
            "{stuck} IO thread(s) did not drain within {STOP_TIMEOUT:?} (commands stuck in a \
             backend?); exiting anyway"
        );
    } else {
        for (i, h) in threads.handles.into_iter().enumerate() {
            if h.join().is_err() {
                tracing::error!("io thread {i} panicked");
            }
        }
        // Every accepted cm_id is gone with its QP: the CM channel can go too.
        rt.listeners.shutdown_rdma();
    }
    if let Some(w) = &rt.shared.ptpl {
        // Every completion that waited for it was answered, or dropped with its queue;
        // a reload's change may still be on its way.
        if !w.flush(STOP_TIMEOUT) {
            tracing::error!(
                "reservations: the state file's last change was not written within \
                 {STOP_TIMEOUT:?}; exiting anyway"
            );
        }
    }
    let mut failed = false;
    for (name, b) in &rt.backends {
        if let Err(e) = b.flush_sync() {
            tracing::error!("backend {name}: flush at shutdown failed: {e}");
            failed = true;
        }
    }
    tracing::info!("daemon: stopped");
    if failed {
        bail!("some backends could not be flushed");
    }
    // Commands were still in a backend when the daemon gave up on them: say so in the
    // exit status, for systemd and monitoring (their hosts saw no completion).
    if stuck > 0 {
        bail!("{stuck} IO thread(s) did not drain within {STOP_TIMEOUT:?}");
    }
    Ok(())
}

/// What a /metrics scrape reads: engine counters (summed over threads) and a short
/// look at the target's state (the lock is held only to copy it).
fn metrics_source(
    shared: &Arc<Shared>,
    started: std::time::SystemTime,
) -> crate::metrics::MetricsSource {
    let (for_report, for_ids, for_transport) = (shared.clone(), shared.clone(), shared.clone());
    let for_refusals = shared.clone();
    let (for_limits, for_conns, for_dh) = (shared.clone(), shared.clone(), shared.clone());
    crate::metrics::MetricsSource {
        stats: shared.stats.clone(),
        report: Box::new(move || for_report.target().report()),
        subsystems: Box::new(move || for_ids.subsystems.all()),
        transport_of: Box::new(move |key| for_transport.transport_of(key)),
        refusals: Box::new(move || for_refusals.refusals.counts()),
        limit_hits: Box::new(move || {
            let mut v = for_limits.stats.limit_hits();
            v.extend(for_limits.conn_limits.hits());
            v.push(("accept_open_files", for_limits.accept_backoffs()));
            v
        }),
        peer_connections: Box::new(move || {
            let (total, unconnected, _) = for_conns.conn_limits.held();
            (u64::from(total - unconnected), u64::from(unconnected))
        }),
        dh_jobs: Box::new(move || for_dh.dh.counts()),
        started,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panicking IO thread is counted out of the alive count (the main loop stops the
    /// daemon on that), as one that returns is.
    #[test]
    fn a_panicking_io_thread_is_counted_out() {
        let alive = Arc::new(AtomicUsize::new(2));
        let guard = |index| AliveGuard {
            index,
            alive: alive.clone(),
        };
        let (g0, g1) = (guard(0), guard(1));
        let h = std::thread::spawn(move || {
            let _g = g0;
            panic!("an IO thread bug");
        });
        assert!(h.join().is_err(), "the thread panicked");
        assert_eq!(alive.load(Ordering::SeqCst), 1);
        std::thread::spawn(move || drop(g1))
            .join()
            .expect("returns");
        assert_eq!(alive.load(Ordering::SeqCst), 0);
    }
}
