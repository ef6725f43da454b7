//! The running daemon: backends, the engine, IO threads, the acceptor, signals.
//!
//! Threads (DESIGN.md, "Threads and ownership"):
//! - the main thread owns the listeners, the engine's main context and the signals; it
//!   hands each accepted connection to the IO thread with the fewest QPs and runs the
//!   keep-alive timers;
//! - each IO thread owns one engine IO context and runs it to completion. It answers the
//!   capsules the engine hands up (Fabrics Connect, admin commands, unusual I/O) through
//!   the shared `nvmf::target::Target`, which only this slow path locks.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use backend::Backend;
use crossbeam_channel::{unbounded, Receiver, Sender};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nvmf::spec::{opcodes, Cqe, DataDirection, Sqe, Status};
use nvmf::target::{
    Action, CounterSource, IoCounters, ListenerInfo, NamespaceConfig, Notice, Outcome, QueueOrigin,
    QueueRef, SubsystemConfig, Target, TargetOptions, Transport,
};
use sta::soft::StaIo;
use sta::{CmdToken, Event, QpHandle, SoftConfig, Sta, SubsysId, TaskKind};

use crate::config::{BackendKind, Config, IoThreads, ListenerConfig, TransportKind};
use crate::rdma_cm::{RdmaMsg, RdmaService};
use crate::refusals::{ConnInfo, RefusalLog};
use crate::reload::{diff, ConfigDiff};

/// How long a graceful stop waits for IO threads to drain before giving up on them.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// An IO thread keeps polling without sleeping this long after its last work.
const SPIN_WINDOW: Duration = Duration::from_millis(2);
/// Longest sleep of an idle IO thread (messages from other threads wait at most this).
const IDLE_WAIT: Duration = Duration::from_millis(5);

/// I/O queues a controller may have (also the highest QID an RDMA connect may ask for).
const MAX_IO_QUEUES: u16 = 64;
/// Deepest NVMe/RDMA admin queue (HSQSIZE + 1) a connect request may ask for: SPDK's RDMA
/// default `max_aq_depth`. Every entry costs a posted receive of SQE + in-capsule data
/// (NVMe/TCP admin queues cost nothing per entry and take up to 4096, see
/// `nvmf::target::MAX_ADMIN_SQSIZE`).
const RDMA_ADMIN_QUEUE_DEPTH: u16 = 128;

/// What the main thread and other IO threads send to an IO thread.
enum ThreadMsg {
    /// A TCP connection from `peer`, accepted by the listener named `listener`.
    Conn {
        sock: TcpStream,
        peer: SocketAddr,
        listener: String,
        info: ListenerInfo,
    },
    /// From the RDMA CM thread: a connection to accept, or an event of one.
    Rdma(RdmaMsg),
    Action(Action),
    Stop,
}

/// State every IO thread and the main thread share. Only the non-offloaded path locks it.
struct Shared {
    target: Mutex<Target>,
    subsys_ids: Mutex<HashMap<String, SubsysId>>,
    stats: sta::Stats,
    threads: Vec<Sender<ThreadMsg>>,
    qp_counts: Vec<AtomicUsize>,
    /// Queue keys of NVMe/RDMA queues (every other queue is NVMe/TCP), for metrics labels.
    rdma_queues: Mutex<std::collections::HashSet<u64>>,
    /// Every listener (TCP and RDMA) by name, to tell which one an RDMA connection came in
    /// on from its local address.
    listeners: Mutex<Vec<(String, ListenerInfo)>>,
    /// Peer and listener of every connection by queue key, for refusal lines (written at
    /// accept and close only).
    conns: Mutex<HashMap<u64, ConnInfo>>,
    /// Refusal counters and the rate-limited refusal log.
    refusals: RefusalLog,
    /// The PTPL state file, when reservations can persist.
    ptpl: Option<crate::ptpl::PtplStore>,
    /// Where namespace access views go to the engine.
    access: sta::AccessPublisher,
}

impl Shared {
    /// After the target changed state (a command, a reload): hand new namespace access
    /// views to the engine and write the PTPL state file if what it keeps changed. Called
    /// before the completion of the command that caused it is sent.
    fn sync_target_state(&self) {
        let (views, snapshot) = {
            let mut t = self.target();
            let views = t.take_access_updates();
            let snapshot = self.ptpl.as_ref().and_then(|_| {
                let v = t.ptpl_version();
                (v != 0).then(|| t.ptpl_snapshot())
            });
            (views, snapshot)
        };
        self.publish_access(views);
        if let (Some(store), Some((version, entries))) = (&self.ptpl, snapshot) {
            if let Err(e) = store.save(version, &entries) {
                tracing::error!(
                    "reservations: cannot write the state file {}: {e}; reservations that \
                     persist through power loss may be lost on restart",
                    store.path().display()
                );
            }
        }
    }

    /// Hands access views to the engine's data path.
    fn publish_access(
        &self,
        views: Vec<(String, u32, std::sync::Arc<nvmf::target::NamespaceAccess>)>,
    ) {
        for (nqn, nsid, view) in views {
            let id = self
                .subsys_ids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&nqn)
                .copied();
            if let Some(id) = id {
                tracing::debug!(
                    "namespace {nsid} of {nqn}: new access view (open: {})",
                    view.is_open()
                );
                self.access.publish(id, nsid, view);
            }
        }
    }

    fn target(&self) -> MutexGuard<'_, Target> {
        self.target.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remember_listener(&self, name: &str, info: &ListenerInfo) {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name.to_string(), info.clone()));
    }

    fn forget_listener(&self, name: &str) {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(n, _)| n != name);
    }

    /// The listener of `transport` whose address covers `local` (exact addresses before
    /// wildcards), for connections that do not say which listener took them (RDMA).
    fn listener_for(
        &self,
        transport: Transport,
        local: SocketAddr,
    ) -> Option<(String, ListenerInfo)> {
        let ls = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
        let fits = |l: &ListenerInfo| {
            l.transport == transport && l.port == local.port() && l.covers(local.ip())
        };
        ls.iter()
            .filter(|(_, l)| fits(l))
            .min_by_key(|(_, l)| l.addr.is_unspecified())
            .cloned()
    }

    fn conn(&self, key: u64) -> Option<ConnInfo> {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()
    }

    /// Logs and counts what the target had to say (refusals, an empty host NQN), from
    /// `Target::take_notices` (called with the target unlocked).
    fn report_notices(&self, (notices, dropped): (Vec<Notice>, u64)) {
        if dropped > 0 {
            tracing::warn!("{dropped} refusal notice(s) were dropped (too many at once)");
        }
        for n in notices {
            match n {
                Notice::Refused(r) => {
                    let c = self.conn(r.key);
                    let line = crate::refusals::describe(&r, c.as_ref());
                    self.refusals
                        .report(r.reason.label(), c.and_then(|c| c.peer), &line);
                }
                Notice::EmptyHostNqnAccepted { subnqn, key } => {
                    let c = self.conn(key);
                    tracing::warn!(
                        "{}: accepted an empty host NQN for subsystem {subnqn:?} (it allows any \
                         host). SPDK's spdk_nvme_perf sends one when its -r option names no \
                         hostnqn; give it one (hostnqn:nqn....) to tell hosts apart. Said once \
                         per subsystem.",
                        crate::refusals::where_from(c.as_ref())
                    );
                }
            }
        }
    }

    /// Send actions to the IO threads that own the queues they concern.
    fn route(&self, actions: Vec<Action>) {
        for a in actions {
            if let Some(tx) = self.threads.get(thread_of(a.key())) {
                let _ = tx.send(ThreadMsg::Action(a));
            }
        }
    }
}

/// A queue key names the IO thread (top byte) and the QP on it.
fn queue_key(thread: usize, qp: QpHandle) -> u64 {
    (thread as u64) << 56 | (qp.as_u64() & ((1 << 56) - 1))
}
fn thread_of(key: u64) -> usize {
    (key >> 56) as usize
}

struct Counters<'a>(&'a Shared);

impl CounterSource for Counters<'_> {
    fn namespace_counters(&self, subnqn: &str, nsid: u32) -> IoCounters {
        let id = self
            .0
            .subsys_ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(subnqn)
            .copied();
        let Some(id) = id else {
            return IoCounters::default();
        };
        let t = self.0.stats.namespace(id, nsid);
        IoCounters {
            read_cmds: t.read_cmds,
            write_cmds: t.write_cmds,
            read_bytes: t.read_bytes,
            write_bytes: t.write_bytes,
            media_errors: t.media_errors(),
        }
    }
}

fn open_backend(b: &crate::config::BackendConfig) -> anyhow::Result<Arc<dyn Backend>> {
    Ok(match &b.kind {
        BackendKind::Ram { size, block_size } => backend::ram::RamBackend::new(*size, *block_size)
            .with_context(|| format!("backend {}: RAM", b.name))?,
        BackendKind::File {
            path,
            size,
            block_size,
            direct,
        } => backend::file::FileBackend::open(
            path,
            backend::file::FileOptions {
                create_size: *size,
                block_size: *block_size,
                direct: *direct,
            },
        )
        .with_context(|| format!("backend {}: {}", b.name, path.display()))?,
        BackendKind::Nvme {
            pci,
            nsid,
            io_timeout_ms,
            sgl,
        } => {
            let mut opts = backend::NvmeOptions {
                nsid: *nsid,
                ..Default::default()
            };
            opts.driver.use_sgl = *sgl;
            if let Some(ms) = io_timeout_ms {
                opts.io_timeout = std::time::Duration::from_millis(*ms);
                opts.abort_timeout = opts.io_timeout.min(std::time::Duration::from_secs(2));
            }
            let be = backend::NvmeBackend::open_pci(pci, opts)
                .with_context(|| format!("backend {}: nvme {pci} namespace {nsid}", b.name))?;
            // TODO(nvmf SMART): `Backend::health_log()` returns this drive's own SMART /
            // Health log (Log Page 02h). Feeding it into Get Log Page 02h for the
            // namespaces it backs needs a hook in nvmf/src/target (not edited here).
            be
        }
    })
}

/// What the main thread owns: the engine's main context, backends, listeners and the
/// configuration they were built from.
struct Runtime {
    cfg: Config,
    sta: Sta,
    shared: Arc<Shared>,
    backends: HashMap<String, Arc<dyn Backend>>,
    listeners: Vec<(String, TcpListener, ListenerInfo)>,
    /// The RDMA CM service, started with the first RDMA listener; its listeners.
    rdma: Option<RdmaService>,
    rdma_listeners: Vec<(String, ListenerInfo)>,
    /// Reservations read from the PTPL state file at start-up, restored as their
    /// namespaces are added (before any host can reach them).
    persisted: Vec<nvmf::target::PersistedReservation>,
}

fn ana_state(s: crate::config::AnaStateName) -> nvmf::target::AnaState {
    use crate::config::AnaStateName as N;
    use nvmf::target::AnaState as S;
    match s {
        N::Optimized => S::Optimized,
        N::NonOptimized => S::NonOptimized,
        N::Inaccessible => S::Inaccessible,
        N::PersistentLoss => S::PersistentLoss,
        N::Change => S::Change,
    }
}

fn listener_info(l: &ListenerConfig) -> ListenerInfo {
    ListenerInfo {
        transport: match l.transport {
            TransportKind::Tcp => Transport::Tcp,
            TransportKind::Rdma => Transport::Rdma,
        },
        addr: l.address,
        port: l.port,
    }
}

impl Runtime {
    /// Apply a configuration change (DESIGN: the main thread owns config). Start-up is the
    /// change from an empty configuration. Steps run in the order `reload` documents:
    /// removals first, then additions, with one exception: a removed subsystem's
    /// controllers are retired (their connections torn down) *before* its namespaces
    /// leave the engine. Otherwise I/O arriving between the two would be answered Invalid
    /// Namespace or Command Sequence Error with DNR, which the Linux host hands to the
    /// application; once retired, a controller's commands get no answer and the host
    /// requeues them and reconnects (what it sees when Linux nvmet removes a subsystem).
    /// Errors are collected, not fatal: the rest of the change is still applied, and the
    /// caller decides what an error means.
    fn apply(&mut self, d: &ConfigDiff, new: &Config) -> Vec<String> {
        let mut errors = Vec::new();
        let mut err = |e: String| {
            tracing::error!("{e}");
            errors.push(e);
        };
        let shared = self.shared.clone();
        let id_of = |nqn: &str| {
            shared
                .subsys_ids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(nqn)
                .copied()
        };

        // Removed subsystems first: Connects to them are refused from now on, and their
        // controllers are retired (every queue asked to disconnect) while the engine still
        // serves their namespaces.
        for nqn in &d.subsystems_removed {
            let actions = shared.target().remove_subsystem(nqn);
            tracing::info!(
                "subsystem {nqn}: disconnecting {} queue(s) of its controllers",
                actions
                    .iter()
                    .filter(|a| matches!(a, Action::Disconnect { .. }))
                    .count()
            );
            shared.route(actions);
        }
        for (nqn, nsid) in &d.namespaces_removed {
            // Hosts learn first (Namespace Attribute Changed), then the engine stops
            // serving it: new I/O reaches the target, which answers Invalid Namespace
            // (as nvmet does for a disabled namespace). A removed subsystem's namespaces
            // only leave the engine: the target forgot them with the subsystem.
            if !d.subsystems_removed.contains(nqn) {
                if let Err(e) = shared.target().remove_namespace(nqn, *nsid) {
                    err(format!("subsystem {nqn}: removing namespace {nsid}: {e}"));
                }
                let actions = shared.target().take_actions();
                shared.route(actions);
            }
            if let Some(id) = id_of(nqn) {
                if let Err(e) = self.sta.ns_remove(id, *nsid, 0) {
                    err(format!(
                        "subsystem {nqn}: engine: removing namespace {nsid}: {e}"
                    ));
                }
            }
            tracing::info!("subsystem {nqn}: namespace {nsid} removed");
        }
        for nqn in &d.subsystems_removed {
            if let Some(id) = shared
                .subsys_ids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(nqn)
            {
                if let Err(e) = self.sta.subsystem_destroy(id) {
                    err(format!("subsystem {nqn}: engine: {e}"));
                }
            }
            tracing::info!("subsystem {nqn} removed");
        }
        for name in &d.backends_removed {
            // The engine holds its own reference until every queue on it is gone.
            self.backends.remove(name);
            tracing::info!("backend {name} released");
        }
        for l in &d.listeners_removed {
            if let Some(i) = self.listeners.iter().position(|(n, _, _)| *n == l.name) {
                let (_, sock, info) = self.listeners.remove(i);
                drop(sock);
                shared.target().remove_listener(&info);
                shared.forget_listener(&l.name);
                tracing::info!("listener {} closed", l.name);
            }
            if let Some(i) = self.rdma_listeners.iter().position(|(n, _)| *n == l.name) {
                let (_, info) = self.rdma_listeners.remove(i);
                if let Some(r) = self.rdma.as_mut() {
                    r.unlisten(&l.name);
                }
                shared.target().remove_listener(&info);
                shared.forget_listener(&l.name);
                tracing::info!("listener {} closed", l.name);
            }
        }
        for l in &d.listeners_added {
            if matches!(l.transport, TransportKind::Rdma) {
                let addr = SocketAddr::new(l.address, l.port);
                if self.rdma.is_none() {
                    match start_rdma(&shared, self.sta.caps().max_queue_depth) {
                        Ok(r) => self.rdma = Some(r),
                        Err(e) => {
                            err(format!("listener {}: {e}", l.name));
                            continue;
                        }
                    }
                }
                let Some(r) = self.rdma.as_mut() else {
                    continue;
                };
                match r.listen(&l.name, addr) {
                    Ok(()) => {
                        let info = listener_info(l);
                        shared.target().add_listener(info.clone());
                        shared.remember_listener(&l.name, &info);
                        self.rdma_listeners.push((l.name.clone(), info));
                        tracing::info!("listening on {addr} (nvme/rdma, listener {})", l.name);
                    }
                    Err(e) => err(format!("listener {}: {e}", l.name)),
                }
                continue;
            }
            let addr = SocketAddr::new(l.address, l.port);
            match TcpListener::bind(addr).and_then(|s| s.set_nonblocking(true).map(|_| s)) {
                Ok(sock) => {
                    let info = listener_info(l);
                    shared.target().add_listener(info.clone());
                    shared.remember_listener(&l.name, &info);
                    self.listeners.push((l.name.clone(), sock, info));
                    tracing::info!("listening on {addr} (nvme/tcp, listener {})", l.name);
                }
                Err(e) => err(format!("listener {}: bind {addr}: {e}", l.name)),
            }
        }
        for b in &d.backends_added {
            match open_backend(b) {
                Ok(be) => {
                    tracing::info!(
                        "backend {}: {} ({} blocks of {} bytes)",
                        b.name,
                        be.describe(),
                        be.num_blocks(),
                        be.block_size()
                    );
                    self.backends.insert(b.name.clone(), be);
                }
                Err(e) => err(format!("{e:#}")),
            }
        }
        for s in &d.subsystems_added {
            let infos: Vec<ListenerInfo> = s
                .listeners
                .iter()
                .filter_map(|n| {
                    new.listeners
                        .iter()
                        .find(|l| l.name == *n)
                        .map(listener_info)
                })
                .collect();
            let r = shared.target().add_subsystem(SubsystemConfig {
                nqn: s.nqn.clone(),
                serial: s.serial.clone(),
                model: s.model.clone(),
                allow_any_host: s.allow_any_host,
                hosts: s.hosts.clone(),
                // A subsystem that names no listeners is on all of them, those a later
                // reload adds included.
                listeners: if s.all_listeners { None } else { Some(infos) },
            });
            match r {
                Ok(()) => {
                    let id = self.sta.subsystem_create(&s.nqn);
                    shared
                        .subsys_ids
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(s.nqn.clone(), id);
                    tracing::info!("subsystem {} added", s.nqn);
                }
                Err(e) => err(format!("subsystem {}: {e}", s.nqn)),
            }
        }
        for (nqn, ns) in &d.namespaces_added {
            let (Some(be), Some(id)) = (self.backends.get(&ns.backend).cloned(), id_of(nqn)) else {
                err(format!(
                    "subsystem {nqn} namespace {}: backend {} or subsystem unavailable",
                    ns.nsid, ns.backend
                ));
                continue;
            };
            // The engine serves it before any host can learn of it.
            if let Err(e) = self.sta.ns_add(id, ns.nsid, be.clone()) {
                err(format!(
                    "subsystem {nqn} namespace {}: engine: {e}",
                    ns.nsid
                ));
                continue;
            }
            let r = shared.target().add_namespace(
                nqn,
                NamespaceConfig {
                    nsid: ns.nsid,
                    block_size: be.block_size(),
                    num_blocks: be.num_blocks(),
                    uuid: ns.uuid,
                    nguid: ns.nguid,
                    eui64: ns.eui64,
                    volatile_write_cache: be.volatile_write_cache(),
                    anagrpid: ns.ana_group,
                    hosts: ns.hosts.clone(),
                },
            );
            match r {
                Ok(()) => {
                    tracing::info!(
                        "subsystem {nqn}: namespace {} on backend {}",
                        ns.nsid,
                        ns.backend
                    );
                    if let Some(i) = self
                        .persisted
                        .iter()
                        .position(|p| p.subnqn == *nqn && p.nsid == ns.nsid)
                    {
                        let p = self.persisted.swap_remove(i);
                        match shared.target().restore_reservation(p) {
                            Ok(()) => tracing::info!(
                                "reservations: subsystem {nqn} namespace {}: restored",
                                ns.nsid
                            ),
                            Err(e) => err(format!(
                                "reservations: subsystem {nqn} namespace {}: {e}",
                                ns.nsid
                            )),
                        }
                    }
                }
                Err(e) => {
                    err(format!("subsystem {nqn} namespace {}: {e}", ns.nsid));
                    let _ = self.sta.ns_remove(id, ns.nsid, 0);
                }
            }
            // Its access view (visibility, ANA, a restored reservation) reaches the
            // engine before a host learns of the namespace.
            shared.sync_target_state();
            let actions = shared.target().take_actions();
            shared.route(actions);
        }
        for (nqn, any, hosts) in &d.hosts_changed {
            let actions = shared.target().set_hosts(nqn, *any, hosts.clone());
            shared.route(actions);
            tracing::info!("subsystem {nqn}: host access updated");
        }
        for (nqn, nsid, hosts) in &d.namespace_hosts_changed {
            let r = shared
                .target()
                .set_namespace_hosts(nqn, *nsid, hosts.clone());
            match r {
                Ok(actions) => {
                    shared.route(actions);
                    tracing::info!("subsystem {nqn}: namespace {nsid}: visibility updated");
                }
                Err(e) => err(format!("subsystem {nqn} namespace {nsid}: {e}")),
            }
        }
        let ana_changes = d
            .subsystems_added
            .iter()
            .filter(|s| !s.ana_groups.is_empty())
            .map(|s| (s.nqn.clone(), s.ana_groups.clone()))
            .chain(d.ana_groups_changed.iter().cloned());
        for (nqn, groups) in ana_changes {
            let groups = groups
                .iter()
                .map(|g| nvmf::target::AnaGroup {
                    id: g.id,
                    states: g
                        .states
                        .iter()
                        .filter_map(|(name, st)| {
                            let l = new.listeners.iter().find(|l| l.name == *name)?;
                            Some((listener_info(l), ana_state(*st)))
                        })
                        .collect(),
                })
                .collect();
            let r = shared.target().set_ana_groups(&nqn, groups);
            match r {
                Ok(actions) => {
                    shared.route(actions);
                    tracing::info!("subsystem {nqn}: ANA states applied");
                }
                Err(e) => err(format!("subsystem {nqn}: ANA groups: {e}")),
            }
        }
        if let Some(refs) = &d.referrals_changed {
            let refs = refs
                .iter()
                .map(|r| nvmf::target::Referral {
                    transport: match r.transport {
                        TransportKind::Tcp => Transport::Tcp,
                        TransportKind::Rdma => Transport::Rdma,
                    },
                    addr: r.address,
                    port: r.port,
                })
                .collect();
            let actions = shared.target().set_referrals(refs);
            shared.route(actions);
        }
        shared.sync_target_state();
        for line in &d.restart_required {
            tracing::warn!("needs a restart to take effect: {line}");
        }
        errors
    }

    /// SIGHUP: re-read the file, validate it, apply the difference.
    fn reload(&mut self, path: Option<&std::path::Path>) {
        let Some(path) = path else {
            tracing::warn!("SIGHUP: running on the embedded default, there is no file to re-read");
            return;
        };
        tracing::info!("SIGHUP: reloading {}", path.display());
        let new = match Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("reload rejected, configuration unchanged: {e}");
                return;
            }
        };
        let d = diff(&self.cfg, &new);
        if d.is_empty() {
            tracing::info!("reload: no changes");
            return;
        }
        for line in d.summary() {
            tracing::info!("reload: {line}");
        }
        let errors = self.apply(&d, &new);
        if errors.is_empty() {
            tracing::info!("reload applied");
        } else {
            tracing::error!("reload applied with {} error(s); see above", errors.len());
        }
        self.cfg = new;
    }
}

/// Start the RDMA CM service: connections go to the IO thread with the fewest QPs.
fn start_rdma(shared: &Arc<Shared>, max_queue_depth: u16) -> Result<RdmaService, String> {
    let (a, b, c) = (shared.clone(), shared.clone(), shared.clone());
    RdmaService::start(
        nvmf::rdma::CmLimits {
            max_queue_depth,
            admin_queue_depth: RDMA_ADMIN_QUEUE_DEPTH,
            max_io_queues: MAX_IO_QUEUES,
        },
        Box::new(move || {
            let t = (0..a.qp_counts.len())
                .min_by_key(|&t| a.qp_counts[t].load(Ordering::Relaxed))
                .unwrap_or(0);
            a.qp_counts[t].fetch_add(1, Ordering::Relaxed);
            t
        }),
        Box::new(move |t, m| {
            if let Some(tx) = b.threads.get(t) {
                let _ = tx.send(ThreadMsg::Rdma(m));
            }
        }),
        Box::new(move |req, status| {
            let listener = req
                .local
                .and_then(|l| c.listener_for(Transport::Rdma, l))
                .map(|(n, _)| n);
            let conn = ConnInfo {
                peer: req.peer,
                listener,
            };
            let line = format!(
                "{}: rdma: rejecting a connect request ({status:?}: the NVMe-oF RDMA private \
                 data is invalid or asks for more than this target allows; private data {:02x?})",
                crate::refusals::where_from(Some(&conn)),
                &req.private_data[..req.private_data.len().min(32)]
            );
            c.refusals
                .report(crate::refusals::RDMA_CONNECT_REJECTED, conn.peer, &line);
        }),
    )
}

/// What a /metrics scrape reads: engine counters (summed over threads) and a short
/// look at the target's state (the lock is held only to copy it).
fn metrics_source(
    shared: &Arc<Shared>,
    started: std::time::SystemTime,
) -> crate::metrics::MetricsSource {
    let (for_report, for_ids, for_transport) = (shared.clone(), shared.clone(), shared.clone());
    let for_refusals = shared.clone();
    crate::metrics::MetricsSource {
        stats: shared.stats.clone(),
        report: Box::new(move || for_report.target().report()),
        subsystems: Box::new(move || {
            for_ids
                .subsys_ids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(nqn, id)| (*id, nqn.clone()))
                .collect()
        }),
        transport_of: Box::new(move |key| {
            let rdma = for_transport
                .rdma_queues
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if rdma.contains(&key) {
                "rdma"
            } else {
                "tcp"
            }
        }),
        refusals: Box::new(move || for_refusals.refusals.counts()),
        started,
    }
}

pub fn run(cfg: Config, config_path: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let source = config_path.as_ref().map_or_else(
        || "<embedded default>".to_string(),
        |p| p.display().to_string(),
    );
    tracing::info!(
        "nvmf-target {} starting with {source}",
        env!("CARGO_PKG_VERSION")
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

    let mut sta = Sta::new(SoftConfig::with_max_io_size(cfg.max_io_size));
    let caps = sta.caps();
    tracing::info!(
        "max I/O size {} KiB (MDTS {}), MAXH2CDATA {} KiB",
        caps.max_io_size / 1024,
        (caps.max_io_size / 4096).trailing_zeros(),
        caps.max_h2c_data / 1024
    );
    // Reservations persist (PTPL) when there is a state file the daemon can write; with
    // the embedded default, or a directory it may not write (ProtectSystem=strict makes
    // /etc read-only: point reservations.state_file at /var/lib/nvmf-target), hosts are
    // told PTPL is not supported rather than promised something a restart would lose.
    let ptpl = match &cfg.reservations.state_file {
        None => None,
        Some(path) => {
            let store = crate::ptpl::PtplStore::new(path.clone());
            match store.probe() {
                Ok(()) => Some(store),
                Err(e) => {
                    tracing::warn!(
                        "reservations: cannot write next to {} ({e}); reservations will not \
                         persist through restarts (set reservations.state_file to a writable \
                         place, e.g. /var/lib/nvmf-target/reservations.ptpl)",
                        path.display()
                    );
                    None
                }
            }
        }
    };
    let persisted = match &ptpl {
        Some(store) => store
            .load(cfg.reservations.if_missing, cfg.reservations.if_corrupt)
            .map_err(|e| anyhow::anyhow!(e))?,
        None => Vec::new(),
    };
    let target = Target::new(TargetOptions {
        max_queue_depth: caps.max_queue_depth,
        max_io_queues: MAX_IO_QUEUES,
        mdts: (caps.max_io_size / 4096).trailing_zeros() as u8,
        ioccsz_bytes: caps.max_incapsule_data,
        max_namespaces: 1024,
        kato_default_ms: 120_000,
        firmware_revision: env!("CARGO_PKG_VERSION").chars().take(8).collect(),
        ptpl_capable: ptpl.is_some(),
        // What the engine runs on the offloaded path (Identify advertises only that).
        copy_max_bytes: if caps.copy { caps.max_io_size } else { 0 },
        fused_compare_write: caps.fused_compare_write,
    });

    // IO threads.
    let (count, cpus) = match &cfg.threads {
        IoThreads::Count(n) => (*n, None),
        IoThreads::Cpus(list) => (list.len(), Some(list.clone())),
    };
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..count {
        let (tx, rx) = unbounded();
        senders.push(tx);
        receivers.push(rx);
    }
    let shared = Arc::new(Shared {
        target: Mutex::new(target),
        subsys_ids: Mutex::new(HashMap::new()),
        stats: sta.stats(),
        access: sta.access_publisher(),
        threads: senders,
        qp_counts: (0..count).map(|_| AtomicUsize::new(0)).collect(),
        rdma_queues: Mutex::new(std::collections::HashSet::new()),
        listeners: Mutex::new(Vec::new()),
        conns: Mutex::new(HashMap::new()),
        refusals: RefusalLog::new(),
        ptpl,
    });
    // Metrics before the IO threads: a taken port fails start-up with nothing to undo.
    let _metrics = match cfg.metrics {
        Some(addr) => Some(
            crate::metrics::serve(addr, metrics_source(&shared, started))
                .with_context(|| format!("metrics: cannot listen on {addr}"))?,
        ),
        None => None,
    };
    let alive = Arc::new(AtomicUsize::new(count));
    let mut handles: Vec<JoinHandle<()>> = Vec::new();
    for (i, rx) in receivers.into_iter().enumerate() {
        let io = sta.io_create();
        let shared = shared.clone();
        let cpu = cpus.as_ref().map(|c| c[i]);
        let alive = alive.clone();
        let h = std::thread::Builder::new()
            .name(format!("nvmft-io{i}"))
            .spawn(move || {
                if let Some(cpu) = cpu {
                    let mut set = nix::sched::CpuSet::new();
                    if set.set(cpu).is_ok() {
                        if let Err(e) =
                            nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
                        {
                            tracing::warn!("io thread {i}: cannot pin to cpu {cpu}: {e}");
                        }
                    }
                }
                match io.start() {
                    Ok(io) => IoThread::new(i, io, shared, rx).run(),
                    Err(e) => {
                        tracing::error!("io thread {i}: cannot start its engine context: {e}")
                    }
                }
                alive.fetch_sub(1, Ordering::SeqCst);
            })
            .context("spawning an IO thread")?;
        handles.push(h);
    }

    // Start-up is the change from nothing to the configuration; at start-up any error
    // is fatal.
    let empty = Config {
        threads: cfg.threads.clone(),
        listeners: Vec::new(),
        backends: Vec::new(),
        subsystems: Vec::new(),
        metrics: cfg.metrics,
        max_io_size: cfg.max_io_size,
        source: cfg.source.clone(),
        reservations: cfg.reservations.clone(),
        referrals: Vec::new(),
    };
    let mut rt = Runtime {
        cfg: empty,
        sta,
        shared: shared.clone(),
        backends: HashMap::new(),
        listeners: Vec::new(),
        rdma: None,
        rdma_listeners: Vec::new(),
        persisted,
    };
    let d = diff(&rt.cfg, &cfg);
    let errors = rt.apply(&d, &cfg);
    if let Some(first) = errors.first() {
        for tx in &shared.threads {
            let _ = tx.send(ThreadMsg::Stop);
        }
        bail!("{first}");
    }
    rt.cfg = cfg;
    for p in std::mem::take(&mut rt.persisted) {
        tracing::warn!(
            "reservations: subsystem {} namespace {}: not restored; it is no longer configured",
            p.subnqn,
            p.nsid
        );
    }
    tracing::info!(
        "ready: {} listener(s), {count} IO thread(s)",
        rt.listeners.len() + rt.rdma_listeners.len()
    );
    crate::notify::status(&format!(
        "serving: {} listener(s), {count} IO thread(s)",
        rt.listeners.len()
    ));
    crate::notify::ready();
    let mut watchdog = crate::notify::Watchdog::from_env();

    // Main loop: accept, signals, timers, engine main context.
    let mut next_timer = Instant::now();
    let stop_reason;
    loop {
        let mut fds: Vec<PollFd> = rt
            .listeners
            .iter()
            .map(|(_, l, _)| PollFd::new(l.as_fd(), PollFlags::POLLIN))
            .collect();
        fds.push(PollFd::new(sfd.as_fd(), PollFlags::POLLIN));
        let _ = nix::poll::poll(&mut fds, PollTimeout::from(100u16));
        drop(fds);
        if let Ok(Some(si)) = sfd.read_signal() {
            match Signal::try_from(si.ssi_signo as i32) {
                Ok(Signal::SIGHUP) => {
                    crate::notify::reloading();
                    rt.reload(config_path.as_deref());
                    crate::notify::status("serving; reloaded");
                    crate::notify::ready();
                }
                Ok(s) => {
                    stop_reason = format!("{s:?}");
                    break;
                }
                Err(_) => {}
            }
        }
        for (name, l, info) in &rt.listeners {
            loop {
                match l.accept() {
                    Ok((sock, peer)) => {
                        let t = (0..count)
                            .min_by_key(|&t| shared.qp_counts[t].load(Ordering::Relaxed))
                            .unwrap_or(0);
                        shared.qp_counts[t].fetch_add(1, Ordering::Relaxed);
                        tracing::debug!("connection from {peer} on {name} to io thread {t}");
                        let _ = shared.threads[t].send(ThreadMsg::Conn {
                            sock,
                            peer,
                            listener: name.clone(),
                            info: info.clone(),
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        tracing::warn!("accept: {e}");
                        break;
                    }
                }
            }
        }
        let now = Instant::now();
        if now >= next_timer {
            next_timer = now + Duration::from_millis(100);
            let (actions, notices) = {
                let mut t = shared.target();
                (t.poll_timeouts(now), t.take_notices())
            };
            let expired = !notices.0.is_empty();
            shared.report_notices(notices);
            for a in &actions {
                if let Action::Disconnect { queue, .. } = a {
                    if expired {
                        tracing::info!(
                            "keep-alive expired: controller {} queue {} torn down",
                            queue.cntlid,
                            queue.qid
                        );
                    }
                }
            }
            shared.route(actions);
            shared.refusals.flush();
        }
        while let Some(ev) = rt.sta.progress() {
            let name = |id: SubsysId| {
                let ids = shared.subsys_ids.lock().unwrap_or_else(|e| e.into_inner());
                ids.iter()
                    .find(|(_, v)| **v == id)
                    .map_or_else(|| format!("#{}", id.0), |(k, _)| k.clone())
            };
            match ev {
                sta::MainEvent::NsRemoved { subsys, nsid, .. } => tracing::info!(
                    "engine: namespace {nsid} of subsystem {} drained and detached",
                    name(subsys)
                ),
                sta::MainEvent::BeQueueDestroyed { subsys, nsid, .. } => tracing::warn!(
                    "engine: backend queues of namespace {nsid} of subsystem {} destroyed",
                    name(subsys)
                ),
                sta::MainEvent::BackendGone { subsys, nsid } => tracing::error!(
                    "engine: the backend of namespace {nsid} of subsystem {} is gone; its \
                     I/O gets Internal Path Error",
                    name(subsys)
                ),
                sta::MainEvent::BackendTimeout {
                    subsys,
                    nsid,
                    commands,
                } => tracing::error!(
                    "backend timeout: {commands} command(s) of namespace {nsid} of subsystem {} \
                     outstanding longer than {:?}; the backend may be hung",
                    name(subsys),
                    SoftConfig::default().backend_timeout
                ),
            }
        }
        if alive.load(Ordering::SeqCst) < count {
            stop_reason = "an IO thread exited".to_string();
            break;
        }
        // Fed only while every IO thread is still making passes.
        if let Some(w) = watchdog.as_mut() {
            w.tick(Instant::now(), &shared.stats, count);
        }
    }

    // Graceful stop: no new connections, drain every QP, flush backends.
    tracing::info!("stopping ({stop_reason}): closing listeners, draining IO threads");
    crate::notify::stopping();
    crate::notify::status(&format!("stopping ({stop_reason})"));
    rt.listeners.clear();
    if let Some(r) = rt.rdma.as_mut() {
        r.close_listeners();
    }
    for tx in &shared.threads {
        let _ = tx.send(ThreadMsg::Stop);
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    tracing::info!("waiting up to {STOP_TIMEOUT:?} for {count} IO thread(s) to drain");
    while alive.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stuck = alive.load(Ordering::SeqCst);
    if stuck > 0 {
        tracing::error!(
            "{stuck} IO thread(s) did not drain within {STOP_TIMEOUT:?} (commands stuck in a \
             backend?); exiting anyway"
        );
    } else {
        for h in handles {
            let _ = h.join();
        }
        // Every accepted cm_id is gone with its QP: the CM channel can go too.
        if let Some(r) = rt.rdma.take() {
            r.shutdown();
        }
    }
    let mut failed = false;
    for (name, b) in &rt.backends {
        if let Err(e) = b.flush_sync() {
            tracing::error!("backend {name}: flush at shutdown failed: {e}");
            failed = true;
        }
    }
    tracing::info!("stopped");
    if failed {
        bail!("some backends could not be flushed");
    }
    Ok(())
}

/// A command waiting for the host's data (rdma_read) before it can run.
struct Waiting {
    qp: QpHandle,
    token: CmdToken,
    sqe: Sqe,
}

#[derive(Default)]
struct QpApp {
    queue: Option<QueueRef>,
    /// The target was told this queue is gone.
    closed: bool,
    /// Where the connection came in (for Connect).
    origin: QueueOrigin,
}

struct IoThread {
    index: usize,
    io: StaIo,
    shared: Arc<Shared>,
    rx: Receiver<ThreadMsg>,
    qps: HashMap<QpHandle, QpApp>,
    /// Asynchronous Event Requests held by the target, by (cntlid, cid).
    held: HashMap<(u16, u16), (QpHandle, CmdToken)>,
    waiting: HashMap<u64, Waiting>,
    next_wait: u64,
    stopping: bool,
    /// When `Stop` arrived, for the drain log.
    stop_started: Option<Instant>,
    /// RDMA connections of this thread: cm_id -> QP.
    rdma_ids: HashMap<u64, QpHandle>,
}

impl IoThread {
    fn new(index: usize, io: StaIo, shared: Arc<Shared>, rx: Receiver<ThreadMsg>) -> IoThread {
        IoThread {
            index,
            io,
            shared,
            rx,
            qps: HashMap::new(),
            held: HashMap::new(),
            waiting: HashMap::new(),
            next_wait: 1,
            stopping: false,
            stop_started: None,
            rdma_ids: HashMap::new(),
        }
    }

    fn run(mut self) {
        let mut last_work = Instant::now();
        loop {
            while let Ok(m) = self.rx.try_recv() {
                self.on_msg(m);
            }
            // Busy-poll while work came recently (no wake-up latency under load), block in
            // epoll once idle so an idle daemon costs no CPU.
            let wait = if last_work.elapsed() < SPIN_WINDOW {
                Duration::ZERO
            } else {
                IDLE_WAIT
            };
            let mut did = self.io.progress(wait);
            while let Some(ev) = self.io.poll_event() {
                did = true;
                self.on_event(ev);
            }
            if did {
                last_work = Instant::now();
            }
            self.shared.qp_counts[self.index].store(self.qps.len(), Ordering::Relaxed);
            if self.stopping && self.qps.is_empty() && !self.io.busy() {
                let took = self.stop_started.map_or(Duration::ZERO, |t| t.elapsed());
                tracing::info!("io{}: drained in {took:?}", self.index);
                return;
            }
        }
    }

    fn on_msg(&mut self, m: ThreadMsg) {
        match m {
            ThreadMsg::Conn {
                sock,
                peer,
                listener,
                info,
            } => {
                if self.stopping {
                    return;
                }
                let local = sock.local_addr().ok().map(|a| a.ip().to_canonical());
                match self.io.qp_accept_tcp(sock, 0) {
                    Ok(qp) => {
                        tracing::debug!(qp = qp.as_u64(), "io{}: accepted {peer}", self.index);
                        self.shared
                            .conns
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(
                                queue_key(self.index, qp),
                                ConnInfo {
                                    peer: Some(peer),
                                    listener: Some(listener),
                                },
                            );
                        self.qps.insert(
                            qp,
                            QpApp {
                                origin: QueueOrigin {
                                    listener: Some(info),
                                    local,
                                },
                                ..QpApp::default()
                            },
                        );
                    }
                    Err(e) => {
                        tracing::warn!("io{}: cannot take connection from {peer}: {e}", self.index)
                    }
                }
            }
            ThreadMsg::Rdma(RdmaMsg::Connect { req, depth, qid }) => {
                let id = req.key().as_u64();
                if self.stopping {
                    req.reject(nvmf::rdma::RejectStatus::NoResources);
                    return;
                }
                let (peer, local) = (req.peer, req.local);
                let listener = local.and_then(|l| self.shared.listener_for(Transport::Rdma, l));
                match self.io.qp_accept_rdma(req, depth, 0) {
                    Ok(qp) => {
                        tracing::debug!(
                            qp = qp.as_u64(),
                            "io{}: accepted an RDMA connection (qid {qid}, depth {depth})",
                            self.index
                        );
                        self.shared
                            .conns
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(
                                queue_key(self.index, qp),
                                ConnInfo {
                                    peer,
                                    listener: listener.as_ref().map(|(n, _)| n.clone()),
                                },
                            );
                        self.qps.insert(
                            qp,
                            QpApp {
                                origin: QueueOrigin {
                                    listener: listener.map(|(_, l)| l),
                                    local: local.map(|a| a.ip().to_canonical()),
                                },
                                ..QpApp::default()
                            },
                        );
                        self.rdma_ids.insert(id, qp);
                        self.shared
                            .rdma_queues
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(queue_key(self.index, qp));
                    }
                    Err(e) => {
                        tracing::warn!("io{}: cannot accept an RDMA connection: {e}", self.index)
                    }
                }
            }
            ThreadMsg::Rdma(RdmaMsg::Event { id, ev }) => {
                if let Some(&qp) = self.rdma_ids.get(&id.as_u64()) {
                    self.io.qp_rdma_cm_event(qp, ev);
                }
            }
            ThreadMsg::Action(a) => self.on_action(a),
            ThreadMsg::Stop => {
                self.stopping = true;
                self.stop_started = Some(Instant::now());
                tracing::info!(
                    "io{}: stopping: draining {} queue(s), {} command(s) in flight",
                    self.index,
                    self.qps.len(),
                    self.io.commands_in_flight()
                );
                let qps: Vec<QpHandle> = self.qps.keys().copied().collect();
                for qp in qps {
                    self.close_queue(qp);
                    let _ = self.io.qp_disconnect(qp, 0);
                }
            }
        }
    }

    fn on_action(&mut self, a: Action) {
        match a {
            Action::CompleteHeld { queue, key: _, cqe } => {
                if let Some((qp, token)) = self.held.remove(&(queue.cntlid, cqe.cid)) {
                    let _ = self.io.rdma_send(qp, token, &cqe, 0);
                }
            }
            Action::Disconnect { queue, key } => {
                let Some(qp) = self.qps.iter().find_map(|(h, a)| {
                    (queue_key(self.index, *h) == key || a.queue == Some(queue)).then_some(*h)
                }) else {
                    return;
                };
                // The target still hears of the close when the disconnect is done
                // (`close_queue`): a retired controller goes once its admin queue closes,
                // and a queue the target already forgot is ignored.
                self.held.retain(|_, (h, _)| *h != qp);
                let _ = self.io.qp_disconnect(qp, 0);
            }
            Action::Abort {
                key,
                cid,
                abort,
                abort_cid,
                ..
            } => {
                let qp = self
                    .qps
                    .keys()
                    .copied()
                    .find(|h| queue_key(self.index, *h) == key);
                let aborted = qp.is_some_and(|qp| self.io.cmd_abort(qp, cid));
                tracing::debug!(
                    "io{}: abort of command {cid} on queue {key:#x}: {}",
                    self.index,
                    if aborted { "aborted" } else { "not aborted" }
                );
                let actions = self.shared.target().abort_done(abort, abort_cid, aborted);
                self.route_or_apply(actions);
            }
        }
    }

    /// Tell the target a queue is gone (once), and route what follows from it.
    fn close_queue(&mut self, qp: QpHandle) {
        let Some(app) = self.qps.get_mut(&qp) else {
            return;
        };
        if app.closed {
            return;
        }
        app.closed = true;
        self.held.retain(|_, (h, _)| *h != qp);
        if let Some(q) = app.queue {
            let actions = self
                .shared
                .target()
                .queue_closed(q, queue_key(self.index, qp));
            self.route_or_apply(actions);
        }
    }

    fn route_or_apply(&mut self, actions: Vec<Action>) {
        for a in actions {
            if thread_of(a.key()) == self.index {
                self.on_action(a);
            } else {
                self.shared.route(vec![a]);
            }
        }
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::NonOffload {
                qp,
                token,
                sqe,
                payload_len: _,
                payload_valid,
                ..
            } => {
                let h2c = matches!(sqe.data_direction(), DataDirection::HostToController);
                if h2c && !payload_valid {
                    let id = self.next_wait;
                    self.next_wait += 1;
                    self.waiting.insert(id, Waiting { qp, token, sqe });
                    if self.io.rdma_read(qp, token, id).is_err() {
                        self.waiting.remove(&id);
                    }
                } else {
                    self.execute(qp, token, &sqe);
                }
            }
            Event::TaskDone {
                kind: TaskKind::RdmaRead,
                user,
                result,
                ..
            } => {
                if let Some(w) = self.waiting.remove(&user) {
                    match result {
                        Ok(()) => self.execute(w.qp, w.token, &w.sqe),
                        Err(_) => {
                            let cqe = Cqe::new(w.sqe.cid(), Status::TRANSIENT_TRANSPORT_ERROR);
                            let _ = self.io.rdma_send(w.qp, w.token, &cqe, 0);
                        }
                    }
                }
            }
            Event::TaskDone {
                kind: TaskKind::QpDisconnect,
                qp,
                ..
            } => {
                self.close_queue(qp);
                self.qps.remove(&qp);
                self.shared
                    .conns
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&queue_key(self.index, qp));
                self.waiting.retain(|_, w| w.qp != qp);
                self.rdma_ids.retain(|_, q| *q != qp);
                self.shared
                    .rdma_queues
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&queue_key(self.index, qp));
            }
            Event::TaskDone { .. } => {}
            Event::Terminated {
                qp,
                by_host,
                icreq,
                fes,
                fei,
                ..
            } => self.report_termination(qp, by_host, icreq, fes, fei),
            Event::TransportError { qp, kind, .. } => {
                tracing::debug!(qp = qp.as_u64(), ?kind, "io{}: queue lost", self.index);
                self.close_queue(qp);
                let _ = self.io.qp_disconnect(qp, 0);
            }
        }
    }

    /// Logs and counts an NVMe/TCP termination (a rejected ICReq, a C2HTermReq we sent, an
    /// H2CTermReq the host sent).
    fn report_termination(&mut self, qp: QpHandle, by_host: bool, icreq: bool, fes: u16, fei: u32) {
        use crate::refusals as r;
        let key = queue_key(self.index, qp);
        let c = self.shared.conn(key);
        let what = fes_text(fes);
        let (label, line) = if by_host {
            (
                r::H2C_TERM_REQ_RECEIVED,
                format!("the host terminated the connection with an H2CTermReq (FES {fes:#x}: {what}, FEI {fei})"),
            )
        } else if icreq {
            (
                r::ICREQ_REJECTED,
                format!("ICReq rejected with a C2HTermReq (FES {fes:#x}: {what}, FEI {fei} = byte offset of the bad field)"),
            )
        } else {
            (
                r::C2H_TERM_REQ_SENT,
                format!("the host broke NVMe/TCP: sent a C2HTermReq (FES {fes:#x}: {what}, FEI {fei} = byte offset of the bad field) and closed the connection"),
            )
        };
        let queue = self.qps.get(&qp).and_then(|a| a.queue);
        let (host, sub) = queue
            .and_then(|q| self.shared.target().controller_nqns(q.cntlid))
            .unwrap_or_default();
        let line = format!(
            "{}: host {host:?}, subsystem {sub:?}, cntlid {}, qid {}: {line}",
            r::where_from(c.as_ref()),
            queue.map_or_else(|| "-".into(), |q| q.cntlid.to_string()),
            queue.map_or_else(|| "-".into(), |q| q.qid.to_string()),
        );
        self.shared
            .refusals
            .report(label, c.and_then(|c| c.peer), &line);
    }

    /// Answer one non-offloaded command whose host data (if any) is in its payload.
    fn execute(&mut self, qp: QpHandle, token: CmdToken, sqe: &Sqe) {
        let now = Instant::now();
        let key = queue_key(self.index, qp);
        let shared = self.shared.clone();
        let Some(payload) = self.io.payload(token) else {
            return;
        };
        if sqe.is_fabrics() && sqe.fctype() == opcodes::fabrics::CONNECT {
            let origin = self
                .qps
                .get(&qp)
                .map(|a| a.origin.clone())
                .unwrap_or_default();
            let (cqe, ok, notices) = {
                let mut t = shared.target();
                let (cqe, ok) = t.connect(now, key, &origin, sqe, payload);
                (cqe, ok, t.take_notices())
            };
            shared.report_notices(notices);
            if let Some(ok) = ok {
                let queue = QueueRef {
                    cntlid: ok.cntlid,
                    qid: ok.qid,
                };
                if let Some(a) = self.qps.get_mut(&qp) {
                    a.queue = Some(queue);
                }
                if ok.qid > 0 {
                    let id = shared
                        .subsys_ids
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(&ok.subnqn)
                        .copied();
                    if let Some(id) = id {
                        let _ = self.io.qp_add_subsystem(qp, id);
                        let _ = self.io.qp_set_access(qp, ok.access);
                    }
                }
                let _ = self.io.qp_connect_set_params(
                    qp,
                    ok.qid,
                    ok.sqsize,
                    ok.disable_sq_flow_control,
                );
                tracing::info!(
                    "io{}: controller {} queue {} connected to {}",
                    self.index,
                    ok.cntlid,
                    ok.qid,
                    ok.subnqn
                );
            }
            let _ = self.io.rdma_send(qp, token, &cqe, 0);
            let actions = shared.target().take_actions();
            self.route_or_apply(actions);
            return;
        }
        let Some(queue) = self.qps.get(&qp).and_then(|a| a.queue) else {
            let cqe = Cqe::new(sqe.cid(), Status::COMMAND_SEQUENCE_ERROR);
            let _ = self.io.rdma_send(qp, token, &cqe, 0);
            return;
        };
        let (outcome, actions, notices) = {
            let mut t = shared.target();
            let o = t.execute(now, queue, sqe, payload, &Counters(&shared));
            (o, t.take_actions(), t.take_notices())
        };
        shared.report_notices(notices);
        // A reservation, PTPL or visibility change reaches the engine (and the PTPL file)
        // before the host hears the command completed.
        shared.sync_target_state();
        match outcome {
            Outcome::Complete { cqe, data_len } if data_len > 0 => {
                let _ = self.io.rdma_write_send(qp, token, &cqe, data_len, 0);
            }
            Outcome::Complete { cqe, .. } => {
                let _ = self.io.rdma_send(qp, token, &cqe, 0);
            }
            Outcome::Deferred => {
                self.held.insert((queue.cntlid, sqe.cid()), (qp, token));
            }
            // A retired controller: its queue is being disconnected (the action is already
            // on its way); the command dies with the connection and the host retries it.
            Outcome::Dropped => {}
        }
        self.route_or_apply(actions);
    }
}

/// A few words for a TermReq's Fatal Error Status (NVMe/TCP 1.0 Figure 23).
fn fes_text(fes: u16) -> &'static str {
    use nvmf::tcp::fes;
    match fes {
        fes::INVALID_HEADER_FIELD => "invalid PDU header field",
        fes::PDU_SEQUENCE_ERROR => "PDU sequence error",
        fes::HEADER_DIGEST_ERROR => "header digest error",
        fes::DATA_TRANSFER_OUT_OF_RANGE => "data transfer out of range",
        fes::DATA_TRANSFER_LIMIT_EXCEEDED => "data transfer limit exceeded",
        fes::UNSUPPORTED_PARAMETER => "unsupported parameter",
        _ => "unknown",
    }
}
