//! What the main thread owns and how a configuration change is applied: the engine's
//! main context, the backends, the listeners, and the configuration they were built
//! from. Start-up is the change from an empty configuration; SIGHUP is the change from
//! the running one to the re-read file (`crate::reload` computes the difference).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use backend::Backend;
use nvmf::target::{
    Action, ListenerInfo, NamespaceConfig, PersistedReservation, SubsystemConfig, TargetError,
};
use sta::{Engine, EngineError, MainEvent, SubsysId};

use super::backends::{grow_backend, open_backend, ram_size_fits, OpenError};
use super::health::{self, HealthPoller};
use super::listeners::{listener_info, ListenerError, Listeners};
use super::policy;
use super::shared::Shared;
use super::subsystems::RegisterError;
use crate::config::{BackendKind, Config, ListenerConfig};
use crate::control::client::bytes_text;
use crate::reload::{diff, running_after, ConfigDiff, Undone, RESTART_PREFIX};

/// One part of a configuration change that could not be applied (the rest was).
#[derive(Debug, thiserror::Error)]
pub(super) enum ApplyError {
    #[error("subsystem {nqn}: {source}")]
    Subsystem {
        nqn: String,
        #[source]
        source: RegisterError,
    },
    #[error("subsystem {nqn}: removing namespace {nsid}: {source}")]
    RemoveNamespace {
        nqn: String,
        nsid: u32,
        #[source]
        source: TargetError,
    },
    #[error("subsystem {nqn}: engine: {what}: {source}")]
    Engine {
        nqn: String,
        what: String,
        #[source]
        source: EngineError,
    },
    #[error("subsystem {nqn} namespace {nsid}: {source}")]
    AddNamespace {
        nqn: String,
        nsid: u32,
        #[source]
        source: TargetError,
    },
    #[error("subsystem {nqn} namespace {nsid}: new size: {source}")]
    Resize {
        nqn: String,
        nsid: u32,
        #[source]
        source: TargetError,
    },
    #[error("subsystem {nqn} namespace {nsid}: ANA group: {source}")]
    NamespaceAnaGroup {
        nqn: String,
        nsid: u32,
        #[source]
        source: TargetError,
    },
    #[error("subsystem {nqn} namespace {nsid}: {source}")]
    NamespaceHosts {
        nqn: String,
        nsid: u32,
        #[source]
        source: TargetError,
    },
    #[error("reservations: subsystem {nqn} namespace {nsid}: {source}")]
    RestoreReservation {
        nqn: String,
        nsid: u32,
        #[source]
        source: TargetError,
    },
    #[error("subsystem {nqn}: ANA groups: {source}")]
    AnaGroups {
        nqn: String,
        #[source]
        source: TargetError,
    },
    /// What it needs failed earlier in the same change (logged above it).
    #[error("subsystem {nqn} namespace {nsid}: not added: {why}")]
    Unavailable { nqn: String, nsid: u32, why: String },
    #[error("listener {name}: {source}")]
    Listener {
        name: String,
        #[source]
        source: ListenerError,
    },
    #[error(transparent)]
    Backend(#[from] OpenError),
}

/// A removed subsystem whose namespaces the engine is still removing; the engine forgets
/// the subsystem once they are all gone (a subsystem is destroyed only without
/// namespaces, DOCA's rule too).
struct Retiring {
    nqn: String,
    id: SubsysId,
    namespaces: Vec<u32>,
}

pub(super) struct Runtime<E: Engine> {
    /// What the daemon runs: the file last loaded, except what waits for a restart (the
    /// running value stays) and what a reload could not apply (left out).
    pub cfg: Config,
    pub engine: E,
    pub shared: Arc<Shared>,
    pub backends: HashMap<String, Arc<dyn Backend>>,
    pub listeners: Listeners,
    retiring: Vec<Retiring>,
    /// Namespaces whose hung backend queues were destroyed (`be_queue_destroy` once each,
    /// until a reload removes the namespace).
    hung: std::collections::HashSet<(SubsysId, u32)>,
    /// Backends of namespaces being removed, flushed once the engine has drained them
    /// (`NsRemoved`): a write the host never flushed is on stable storage before its
    /// namespace and the host's means to flush it are gone, as at a graceful stop.
    flush_when_removed: HashMap<(SubsysId, u32), (String, Arc<dyn Backend>)>,
    /// Reservations read from the PTPL state file at start-up, restored as their
    /// namespaces are added (before any host can reach them).
    persisted: Vec<PersistedReservation>,
    /// Reservations of namespaces this reload removes and adds again under the same
    /// identity, until they are added (`restore_reservation`).
    carried: Vec<PersistedReservation>,
    /// Reads the SMART / Health log of `nvme` backends; started with the first one.
    health: Option<HealthPoller>,
}

impl<E: Engine> Runtime<E> {
    /// A runtime serving nothing yet; `cfg` keeps what cannot change without a restart
    /// (IO threads, metrics, max I/O size) and lists no listener, backend or subsystem.
    pub fn new(
        cfg: &Config,
        engine: E,
        shared: Arc<Shared>,
        persisted: Vec<PersistedReservation>,
    ) -> Runtime<E> {
        // Every field spelled out (no `..cfg`): a field added to `Config` must be decided
        // here, empty (applied at start-up as a change) or kept (restart-only).
        let empty = Config {
            threads: cfg.threads.clone(),
            listeners: Vec::new(),
            backends: Vec::new(),
            subsystems: Vec::new(),
            metrics: cfg.metrics,
            max_io_size: cfg.max_io_size,
            engine: cfg.engine,
            // Restart-only: the socket is bound once, at start-up.
            control: cfg.control.clone(),
            doca: cfg.doca.clone(),
            source: cfg.source.clone(),
            hosts: Vec::new(),
            // Restart-only: the state file was opened at start-up.
            reservations: cfg.reservations.clone(),
            referrals: Vec::new(),
            metrics_allow_remote: cfg.metrics_allow_remote,
            limits: cfg.limits,
        };
        Runtime {
            cfg: empty,
            engine,
            shared,
            backends: HashMap::new(),
            listeners: Listeners::default(),
            retiring: Vec::new(),
            hung: Default::default(),
            flush_when_removed: HashMap::new(),
            persisted,
            carried: Vec::new(),
            health: None,
        }
    }

    /// After start-up: reservations of the state file whose namespace is not configured
    /// any more are dropped, and said so.
    pub fn drop_unrestored_reservations(&mut self) {
        for p in std::mem::take(&mut self.persisted) {
            tracing::warn!(
                "reservations: subsystem {} namespace {}: not restored; it is no longer configured",
                p.subnqn,
                p.nsid
            );
        }
    }

    /// Apply a configuration change (DESIGN: the main thread owns config). Steps run in
    /// the order `reload` documents: removals first, then additions, with one exception:
    /// a removed subsystem's controllers are retired (their connections torn down)
    /// *before* its namespaces leave the engine. Otherwise I/O arriving between the two
    /// would be answered Invalid Namespace or Command Sequence Error with DNR, which the
    /// Linux host hands to the application; once retired, a controller's commands get no
    /// answer and the host requeues them and reconnects (what it sees when Linux nvmet
    /// removes a subsystem). Errors are collected (and logged), not fatal: the rest of
    /// the change is still applied, and the caller decides what an error means.
    pub fn apply(&mut self, d: &ConfigDiff, new: &Config) -> Applied {
        let mut errors = Errors::default();
        // New backends open before anything is removed: a namespace that was to move to
        // one that does not open stays where it is.
        let mut opened = self.open_backends(d, &mut errors);
        self.keep_what_cannot_move(d, &mut errors.undone);
        opened.retain(|name, _| !errors.undone.backends_kept.contains(name));
        self.retire_subsystems(d);
        self.remove_namespaces(d, &mut errors);
        self.forget_subsystems(d, &mut errors);
        for name in &d.backends_removed {
            if errors.undone.backends_kept.contains(name) {
                continue;
            }
            // The engine holds its own reference until every queue on it is gone.
            self.backends.remove(name);
            tracing::info!("backend {name} released");
        }
        self.backends.extend(opened);
        for l in &d.listeners_removed {
            if d.listener_replaced(&l.name).is_none() {
                self.listeners.close(&self.shared, &l.name);
            }
        }
        let depth = self.engine.caps().max_queue_depth;
        // Listeners whose new address another of the changed ones still holds (two that
        // swap ports): replaced the other way round after the first pass, closed first.
        let mut blocked = Vec::new();
        for l in &d.listeners_added {
            let result = match d.listener_replaced(&l.name) {
                Some(old) => self.listeners.replace(&self.shared, old, l, depth),
                None => self
                    .listeners
                    .open(&self.shared, l, depth)
                    .map_err(|e| (e, false)),
            };
            let in_use = |e: &ListenerError| {
                matches!(e, ListenerError::Bind { source, .. }
                    if source.kind() == std::io::ErrorKind::AddrInUse)
            };
            let taken_by_a_changed_one = |l: &ListenerConfig| {
                d.listeners_removed
                    .iter()
                    .any(|o| o.name != l.name && listener_info(o) == listener_info(l))
            };
            let result = match result {
                Err((e, true)) if in_use(&e) && taken_by_a_changed_one(l) => {
                    blocked.push(l);
                    Ok(())
                }
                r => r,
            };
            self.listener_result(l, result, &mut errors);
        }
        // Close them all, then open each at its new address (the old one again if that
        // fails).
        for l in &blocked {
            self.listeners.close(&self.shared, &l.name);
        }
        for l in blocked {
            let Some(old) = d.listener_replaced(&l.name) else {
                continue;
            };
            let result = match self.listeners.open(&self.shared, l, depth) {
                Ok(()) => Ok(()),
                Err(e) => Err((e, self.listeners.open(&self.shared, old, depth).is_ok())),
            };
            self.listener_result(l, result, &mut errors);
        }
        if d.auth_changed {
            // Before any subsystem is added: no host reaches a new subsystem before the
            // rules that bind it are in place.
            policy::apply_auth(&self.shared, new);
        }
        policy::rebuild_psk_table(&self.shared, new);
        self.add_subsystems(d, new, &mut errors);
        self.add_namespaces(d, &mut errors);
        for p in std::mem::take(&mut self.carried) {
            tracing::warn!(
                "reservations: subsystem {} namespace {}: dropped; the namespace was not \
                 added again (see above)",
                p.subnqn,
                p.nsid
            );
        }
        for (nqn, any, hosts) in &d.hosts_changed {
            let live = |t: &nvmf::target::Target| -> Vec<(u16, String)> {
                t.report()
                    .controllers
                    .into_iter()
                    .filter(|c| c.subnqn == *nqn && !c.retired)
                    .map(|c| (c.cntlid, c.hostnqn))
                    .collect()
            };
            let (before, actions, after) = {
                let mut t = self.shared.target();
                let before = live(&t);
                let actions = t.set_hosts(nqn, *any, hosts.clone());
                (before, actions, live(&t))
            };
            self.shared.route(actions);
            tracing::info!("subsystem {nqn}: host access updated");
            for (cntlid, host) in before.iter().filter(|c| !after.contains(c)) {
                tracing::info!(
                    "subsystem {nqn}: controller {cntlid} of host {host:?} disconnected: the \
                     host is no longer allowed"
                );
            }
        }
        self.apply_visibility_ana_referrals(d, new, &mut errors);
        for (nqn, names, text) in &d.subsystem_listeners_changed {
            let infos = names
                .as_ref()
                .map(|n| self.named_listeners(n, new, &errors.undone));
            match self.shared.target().set_subsystem_listeners(nqn, infos) {
                Ok(()) => tracing::info!("subsystem {nqn}: listeners {text}"),
                Err(e) => tracing::warn!("subsystem {nqn}: listeners {text}: not applied: {e}"),
            }
        }
        // Connections made under the old rules that the new ones refuse go, as a host
        // taken off a subsystem's list does (above).
        let gone = self.shared.target().retire_out_of_policy();
        for (cntlid, host, nqn, why) in gone {
            tracing::info!(
                "subsystem {nqn}: controller {cntlid} of host {host:?} disconnected: {why}"
            );
        }
        let actions = self.shared.target().take_actions();
        self.shared.route(actions);
        self.poll_drives(new);
        self.shared.sync_target_state();
        for line in &d.restart_required {
            tracing::warn!("needs a restart to take effect: {line}");
        }
        Applied {
            errors: errors.list,
            undone: errors.undone,
        }
    }

    /// Removed subsystems first: Connects to them are refused from now on, and their
    /// controllers are retired (every queue asked to disconnect) while the engine still
    /// serves their namespaces.
    fn retire_subsystems(&mut self, d: &ConfigDiff) {
        for nqn in &d.subsystems_removed {
            let actions = self.shared.retire_subsystem(nqn);
            let queues = actions
                .iter()
                .filter(|a| matches!(a, Action::Disconnect { .. }))
                .count();
            tracing::info!("subsystem {nqn}: disconnecting {queues} queue(s) of its controllers");
            self.shared.route(actions);
        }
    }

    /// Hosts learn first (Namespace Attribute Changed), then the engine stops serving the
    /// namespace: new I/O reaches the target, which answers Invalid Namespace (as nvmet
    /// does for a disabled namespace). A removed subsystem's namespaces only leave the
    /// engine: the target forgot them with the subsystem.
    fn remove_namespaces(&mut self, d: &ConfigDiff, errors: &mut Errors) {
        for (nqn, nsid) in &d.namespaces_removed {
            if errors
                .undone
                .namespaces_kept
                .contains(&(nqn.clone(), *nsid))
            {
                continue;
            }
            if !d.subsystems_removed.contains(nqn) {
                // Added again under the same identity: hosts take it for the same
                // namespace, so it keeps its reservations (`add_namespaces`).
                let key = (nqn.clone(), *nsid);
                if d.namespaces_same_identity.contains(&key) || d.namespaces_retried.contains(&key)
                {
                    let r = self.shared.target().reservation(nqn, *nsid);
                    self.carried.extend(r);
                }
                if let Err(source) = self.shared.target().remove_namespace(nqn, *nsid) {
                    errors.push(ApplyError::RemoveNamespace {
                        nqn: nqn.clone(),
                        nsid: *nsid,
                        source,
                    });
                }
                let actions = self.shared.target().take_actions();
                self.shared.route(actions);
            }
            if let Some(id) = self.shared.subsystems.id(nqn) {
                let hung = self.hung.remove(&(id, *nsid));
                let backend = self.cfg.namespace(nqn, *nsid).and_then(|n| {
                    let b = self.backends.get(&n.backend)?;
                    Some((n.backend.clone(), b.clone()))
                });
                match self.engine.ns_remove(id, *nsid, 0) {
                    Ok(()) => {
                        if d.subsystems_removed.contains(nqn) {
                            self.retiring_entry(nqn, id).namespaces.push(*nsid);
                        }
                        // Not one that hangs: its flush would too. One still waiting from
                        // an earlier removal of the same namespace is flushed now.
                        if let Some(b) = backend.filter(|_| !hung) {
                            if let Some((name, old)) =
                                self.flush_when_removed.insert((id, *nsid), b)
                            {
                                flush_detached(name, nqn.clone(), *nsid, old);
                            }
                        }
                    }
                    Err(source) => errors.push(ApplyError::Engine {
                        nqn: nqn.clone(),
                        what: format!("removing namespace {nsid}"),
                        source,
                    }),
                }
            }
            tracing::info!("subsystem {nqn}: namespace {nsid} removed");
        }
    }

    fn retiring_entry(&mut self, nqn: &str, id: SubsysId) -> &mut Retiring {
        let i = match self.retiring.iter().position(|r| r.id == id) {
            Some(i) => i,
            None => {
                self.retiring.push(Retiring {
                    nqn: nqn.to_string(),
                    id,
                    namespaces: Vec::new(),
                });
                self.retiring.len() - 1
            }
        };
        &mut self.retiring[i]
    }

    /// The NQNs of removed subsystems stop naming engine subsystems; an engine subsystem
    /// with no namespace left to remove is destroyed now, the others when their last
    /// `NsRemoved` arrives ([`Runtime::engine_events`]).
    fn forget_subsystems(&mut self, d: &ConfigDiff, errors: &mut Errors) {
        for nqn in &d.subsystems_removed {
            if let Some(id) = self.shared.forget_subsystem(nqn) {
                let r = self.retiring_entry(nqn, id);
                if r.namespaces.is_empty() {
                    self.destroy_retired(id, errors);
                }
            }
            tracing::info!("subsystem {nqn} removed");
        }
    }

    fn destroy_retired(&mut self, id: SubsysId, errors: &mut Errors) {
        let Some(i) = self.retiring.iter().position(|r| r.id == id) else {
            return;
        };
        let r = self.retiring.swap_remove(i);
        if let Err(source) = self.engine.subsystem_destroy(id) {
            errors.push(ApplyError::Engine {
                nqn: r.nqn,
                what: "destroying the subsystem".into(),
                source,
            });
        }
    }

    /// The `nvme` backends of `new` are the drives whose health is read from now on.
    fn poll_drives(&mut self, new: &Config) {
        let drives: Vec<(String, Arc<dyn Backend>)> = new
            .backends
            .iter()
            .filter(|b| matches!(b.kind, BackendKind::Nvme { .. }))
            .filter_map(|b| Some((b.name.clone(), self.backends.get(&b.name)?.clone())))
            .collect();
        if self.health.is_none() && !drives.is_empty() {
            match HealthPoller::start(health::INTERVAL) {
                Ok(p) => self.health = Some(p),
                Err(e) => tracing::error!(
                    "drive health: cannot start its thread: {e}; Get Log Page 02h answers \
                     without the drives' health"
                ),
            }
        }
        if let Some(p) = &self.health {
            p.set_drives(drives);
        }
    }

    /// Main loop, each tick: drive health logs read since the last tick go to the target
    /// for each namespace the drive backs (AENs the target raises are sent).
    pub fn drive_health(&mut self) {
        let Some(p) = self.health.as_mut() else {
            return;
        };
        for (backend, log) in p.take() {
            for s in &self.cfg.subsystems {
                for ns in s.namespaces.iter().filter(|n| n.backend == backend) {
                    let result = self
                        .shared
                        .target()
                        .set_device_health(&s.nqn, ns.nsid, &log);
                    match result {
                        Ok(actions) => self.shared.route(actions),
                        // The namespace went between the read and now: nothing to report.
                        Err(e) => tracing::debug!(
                            "drive health: subsystem {} namespace {}: {e}",
                            s.nqn,
                            ns.nsid
                        ),
                    }
                }
            }
        }
    }

    /// Record how opening or replacing listener `l` went.
    fn listener_result(
        &self,
        l: &ListenerConfig,
        result: Result<(), (ListenerError, bool)>,
        errors: &mut Errors,
    ) {
        if let Err((source, kept)) = result {
            errors.undone.listeners.insert(l.name.clone());
            if kept {
                errors.undone.listeners_kept.insert(l.name.clone());
            }
            errors.push(ApplyError::Listener {
                name: l.name.clone(),
                source,
            });
        }
    }

    /// Namespaces removed and added again on a backend that did not open stay as they
    /// were (their removal is skipped), and so does the old backend they use.
    fn keep_what_cannot_move(&self, d: &ConfigDiff, undone: &mut Undone) {
        for (nqn, ns) in &d.namespaces_added {
            let key = (nqn.clone(), ns.nsid);
            if !undone.backends.contains(&ns.backend)
                || !d.namespaces_removed.contains(&key)
                || d.subsystems_removed.contains(nqn)
            {
                continue;
            }
            let Some(old) = self.cfg.namespace(nqn, ns.nsid) else {
                continue;
            };
            if d.backends_removed.contains(&old.backend) {
                undone.backends_kept.insert(old.backend.clone());
            }
            tracing::error!(
                "subsystem {nqn}: namespace {} stays as it was, on backend {}: its new \
                 backend {} did not open (see above)",
                ns.nsid,
                old.backend,
                ns.backend
            );
            undone.namespaces.insert(key.clone());
            undone.namespaces_kept.insert(key);
        }
    }

    /// The listeners as they stand after this change: `new`'s, but one kept at its old
    /// address (its new one could not be bound) with its old definition.
    fn listeners_now(&self, new: &Config, undone: &Undone) -> Vec<ListenerConfig> {
        new.listeners
            .iter()
            .map(|l| {
                let kept = undone.listeners_kept.contains(&l.name);
                match self.cfg.listeners.iter().find(|o| kept && o.name == l.name) {
                    Some(o) => o.clone(),
                    None => l.clone(),
                }
            })
            .collect()
    }

    /// The listeners `names` of a subsystem as they stand after this change
    /// ([`Runtime::listeners_now`]).
    fn named_listeners(
        &self,
        names: &[String],
        new: &Config,
        undone: &Undone,
    ) -> Vec<ListenerInfo> {
        let now = self.listeners_now(new, undone);
        names
            .iter()
            .filter_map(|n| now.iter().find(|l| l.name == *n).map(listener_info))
            .collect()
    }

    /// Open the backends the change adds; the caller installs them (after removals).
    fn open_backends(
        &mut self,
        d: &ConfigDiff,
        errors: &mut Errors,
    ) -> HashMap<String, Arc<dyn Backend>> {
        let mut opened = HashMap::new();
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
                    opened.insert(b.name.clone(), be);
                }
                Err(e) => {
                    errors.undone.backends.insert(b.name.clone());
                    errors.push(e.into());
                }
            }
        }
        opened
    }

    fn add_subsystems(&mut self, d: &ConfigDiff, new: &Config, errors: &mut Errors) {
        for s in &d.subsystems_added {
            let infos = self.named_listeners(&s.listeners, new, &errors.undone);
            let cfg = SubsystemConfig {
                nqn: s.nqn.clone(),
                serial: s.serial.clone(),
                model: s.model.clone(),
                allow_any_host: s.allow_any_host,
                hosts: s.hosts.clone(),
                // A subsystem that names no listeners is on all of them, those a later
                // reload adds included.
                listeners: if s.all_listeners { None } else { Some(infos) },
            };
            match self.shared.add_subsystem(&mut self.engine, cfg) {
                Ok(_) => tracing::info!("subsystem {} added", s.nqn),
                Err(source) => {
                    errors.undone.subsystems.insert(s.nqn.clone());
                    errors.push(ApplyError::Subsystem {
                        nqn: s.nqn.clone(),
                        source,
                    });
                }
            }
        }
    }

    fn add_namespaces(&mut self, d: &ConfigDiff, errors: &mut Errors) {
        for (nqn, ns) in &d.namespaces_added {
            if errors
                .undone
                .namespaces_kept
                .contains(&(nqn.clone(), ns.nsid))
            {
                // Said so already (`keep_what_cannot_move`).
                continue;
            }
            let be = self.backends.get(&ns.backend).cloned();
            let id = self.shared.subsystems.id(nqn);
            let (Some(be), Some(id)) = (be, id) else {
                let why = if id.is_none() {
                    "its subsystem could not be added (see above)".to_string()
                } else {
                    format!("its backend {} did not open (see above)", ns.backend)
                };
                errors.undone.namespaces.insert((nqn.clone(), ns.nsid));
                errors.push(ApplyError::Unavailable {
                    nqn: nqn.clone(),
                    nsid: ns.nsid,
                    why,
                });
                continue;
            };
            // The engine serves it before any host can learn of it.
            if let Err(source) = self.engine.ns_add(id, ns.nsid, be.clone()) {
                errors.undone.namespaces.insert((nqn.clone(), ns.nsid));
                errors.push(ApplyError::Engine {
                    nqn: nqn.clone(),
                    what: format!("adding namespace {}", ns.nsid),
                    source,
                });
                continue;
            }
            let r = self.shared.target().add_namespace(
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
                    self.restore_reservation(nqn, ns.nsid, errors);
                }
                Err(source) => {
                    errors.undone.namespaces.insert((nqn.clone(), ns.nsid));
                    errors.push(ApplyError::AddNamespace {
                        nqn: nqn.clone(),
                        nsid: ns.nsid,
                        source,
                    });
                    // Undo the engine's half; its NsRemoved is only logged.
                    if let Err(e) = self.engine.ns_remove(id, ns.nsid, 0) {
                        tracing::error!(
                            "subsystem {nqn}: engine: removing namespace {} again: {e}",
                            ns.nsid
                        );
                    }
                }
            }
            // Its access view (visibility, ANA, a restored reservation) reaches the
            // engine before a host learns of the namespace.
            self.shared.sync_target_state();
            let actions = self.shared.target().take_actions();
            self.shared.route(actions);
        }
    }

    /// The reservation the state file kept for a namespace just added, if any, or the
    /// one it had before this reload moved it to another backend (`carried`).
    fn restore_reservation(&mut self, nqn: &str, nsid: u32, errors: &mut Errors) {
        let take = |list: &mut Vec<PersistedReservation>| {
            let i = list
                .iter()
                .position(|p| p.subnqn == nqn && p.nsid == nsid)?;
            Some(list.swap_remove(i))
        };
        let (r, done) = if let Some(p) = take(&mut self.carried) {
            (
                self.shared.target().carry_reservation(p),
                "kept on its new backend",
            )
        } else if let Some(p) = take(&mut self.persisted) {
            (self.shared.target().restore_reservation(p), "restored")
        } else {
            return;
        };
        match r {
            Ok(()) => tracing::info!("reservations: subsystem {nqn} namespace {nsid}: {done}"),
            Err(source) => errors.push(ApplyError::RestoreReservation {
                nqn: nqn.to_string(),
                nsid,
                source,
            }),
        }
    }

    /// Per-namespace visibility, ANA states (of added subsystems and changed ones; hosts
    /// on listeners whose state changed get an ANA Change event) and referrals.
    fn apply_visibility_ana_referrals(
        &mut self,
        d: &ConfigDiff,
        new: &Config,
        errors: &mut Errors,
    ) {
        for (nqn, nsid, hosts) in &d.namespace_hosts_changed {
            let r = self
                .shared
                .target()
                .set_namespace_hosts(nqn, *nsid, hosts.clone());
            match r {
                Ok(actions) => {
                    // The data path first: a host that hears of the change (an AER) and
                    // uses it at once must find it there.
                    self.shared.sync_target_state();
                    self.shared.route(actions);
                    tracing::info!("subsystem {nqn}: namespace {nsid}: visibility updated");
                }
                Err(source) => {
                    errors.undone.namespace_hosts.insert((nqn.clone(), *nsid));
                    errors.push(ApplyError::NamespaceHosts {
                        nqn: nqn.clone(),
                        nsid: *nsid,
                        source,
                    });
                }
            }
        }
        // ANA states are kept per listener address: a listener that moved takes its
        // states along, for every subsystem whose groups name it.
        let moved: Vec<&str> = d
            .listeners_added
            .iter()
            .filter(|l| d.listener_replaced(&l.name).is_some())
            .map(|l| l.name.as_str())
            .collect();
        let follow_moves = new
            .subsystems
            .iter()
            .filter(|s| {
                !d.subsystems_added.iter().any(|a| a.nqn == s.nqn)
                    && !d.ana_groups_changed.iter().any(|(n, _)| *n == s.nqn)
                    && s.ana_groups
                        .iter()
                        .any(|g| g.states.iter().any(|(l, _)| moved.contains(&l.as_str())))
            })
            .map(|s| (s.nqn.clone(), s.ana_groups.clone()));
        let ana_changes: Vec<_> = d
            .subsystems_added
            .iter()
            .filter(|s| !s.ana_groups.is_empty())
            .map(|s| (s.nqn.clone(), s.ana_groups.clone()))
            .chain(d.ana_groups_changed.iter().cloned())
            .chain(follow_moves)
            .collect();
        let listeners = self.listeners_now(new, &errors.undone);
        for (nqn, groups) in ana_changes {
            let groups = policy::ana_groups(&groups, &listeners);
            let r = self.shared.target().set_ana_groups(&nqn, groups);
            match r {
                Ok(actions) => {
                    // As above: the new states reach the data path before the ANA Change
                    // event reaches any host.
                    self.shared.sync_target_state();
                    self.shared.route(actions);
                    tracing::info!("subsystem {nqn}: ANA states applied");
                }
                Err(source) => {
                    errors.undone.ana_groups.insert(nqn.clone());
                    errors.push(ApplyError::AnaGroups { nqn, source });
                }
            }
        }
        // After the groups' states: a namespace takes its new group's states as they are
        // now.
        for (nqn, nsid, group) in &d.namespace_ana_group_changed {
            // One taken out and tried again is added anew, in its new group.
            if d.namespaces_retried.contains(&(nqn.clone(), *nsid)) {
                continue;
            }
            let r = self
                .shared
                .target()
                .set_namespace_ana_group(nqn, *nsid, *group);
            match r {
                Ok(actions) => {
                    self.shared.sync_target_state();
                    self.shared.route(actions);
                    tracing::info!(
                        "subsystem {nqn}: namespace {nsid}: moved to ANA group {group} in place"
                    );
                }
                Err(source) => {
                    errors
                        .undone
                        .namespace_ana_groups
                        .insert((nqn.clone(), *nsid));
                    errors.push(ApplyError::NamespaceAnaGroup {
                        nqn: nqn.clone(),
                        nsid: *nsid,
                        source,
                    });
                }
            }
        }
        if let Some(refs) = &d.referrals_changed {
            let actions = self.shared.target().set_referrals(policy::referrals(refs));
            self.shared.route(actions);
        }
    }

    /// SIGHUP (and `ctl reload`): re-read the file, validate it, apply the difference.
    /// An error means nothing was applied (no file, or it does not load); otherwise the
    /// summary of what was applied, what failed, and the text now running.
    pub fn reload(&mut self, path: Option<&Path>) -> Result<Reloaded, String> {
        let Some(path) = path else {
            let why = "running on the embedded default, there is no file to re-read";
            tracing::warn!("reload: {why}");
            return Err(why.into());
        };
        tracing::info!("reloading {}", path.display());
        if let Some(w) = crate::startup_checks::config_permissions(path) {
            tracing::warn!("{w}");
        }
        // Reading the file touches nothing running: a bug in the parser that panics on
        // some input rejects the reload instead of stopping the daemon for every host.
        let loaded = std::panic::catch_unwind(|| Config::load_with_text(path));
        let (new, text) = match loaded {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::error!("reload rejected, configuration unchanged: {e}");
                return Err(format!("reload rejected, configuration unchanged:\n{e}"));
            }
            Err(_) => {
                let why = format!(
                    "reload rejected, configuration unchanged: reading {} failed inside the \
                     daemon (a bug: the panic message above says where; please report it \
                     with the file)",
                    path.display()
                );
                tracing::error!("{why}");
                return Err(why);
            }
        };
        for w in crate::startup_checks::config_warnings(&new) {
            tracing::warn!("{w}");
        }
        let mut d = diff(&self.cfg, &new);
        self.retry_lost(&mut d, &new);
        self.resizes_live_or_at_restart(&mut d);
        let mut changes = d.summary();
        if d.is_empty() {
            tracing::info!("reload: no changes in the file");
        }
        for line in &changes {
            tracing::info!("reload: {line}");
        }
        let (mut errors, mut undone) = if d.is_empty() {
            (Vec::new(), Undone::default())
        } else {
            let applied = self.apply(&d, &new);
            let errors = applied.errors.iter().map(|e| e.to_string()).collect();
            (errors, applied.undone)
        };
        // Sizes, on every reload: a file or device grown on disk needs no change in the
        // config file, only a reload (nvmet's `revalidate_size`, SPDK's rescan).
        let mut sizes = Errors::default();
        let mut at_restart = Vec::new();
        let grown = self.grow_backends(&d, &new, &mut sizes, &mut at_restart);
        undone
            .backends_kept
            .extend(sizes.undone.backends_kept.iter().cloned());
        if errors.is_empty() {
            if !d.is_empty() {
                tracing::info!("reload applied");
            }
        } else {
            tracing::error!("reload applied with {} error(s); see above", errors.len());
        }
        // What runs now: the file, but for what waits for a restart and what failed (a
        // reload of the same file tries that again).
        self.cfg = undone.remove_from(running_after(&self.cfg, &new, &d), &self.cfg);
        changes.extend(self.reconcile_sizes(&grown, &mut sizes));
        changes.extend(at_restart.iter().map(|l| format!("{RESTART_PREFIX}{l}")));
        if !sizes.list.is_empty() {
            tracing::error!(
                "reload: {} size change(s) failed; see above",
                sizes.list.len()
            );
        }
        errors.extend(sizes.list.iter().map(|e| e.to_string()));
        Ok(Reloaded {
            changes,
            errors,
            text,
            file: new,
        })
    }

    /// Moves the resizes of `d` that cannot be done live to `restart_required`, with the
    /// reason: all of them when the engine cannot resize, and a size past the address
    /// space its store reserved at start. The reload and `ctl status`'s pending list both
    /// go through here, so they agree.
    pub(super) fn resizes_live_or_at_restart(&self, d: &mut ConfigDiff) {
        if !self.engine.caps().resize {
            d.resizes_need_a_restart("this engine cannot resize a namespace while it runs");
        }
        let backends = &self.backends;
        d.resizes_need_a_restart_where(|b| {
            let size = match b.kind {
                // A size the machine could never hold stays an error of the reload, as
                // at start-up (`grow_backend` says so), not a wait for a restart that
                // would fail.
                BackendKind::Ram { size, .. } if ram_size_fits(size).is_err() => return None,
                BackendKind::Ram { size, .. }
                | BackendKind::File {
                    size: Some(size), ..
                } => size,
                _ => return None,
            };
            let limit = backends.get(&b.name)?.grow_limit()?;
            (size > limit).then(|| {
                format!(
                    "past the {} it reserved at start: only a restart grows it that far",
                    bytes_text(limit)
                )
            })
        });
    }

    /// Grows every backend that can ([`grow_backend`]): those whose size the change
    /// sets (`d.backends_resized`) to their new size, the others to what their storage
    /// holds now. Returns (name, blocks before, blocks after) of those that grew. A
    /// resize that fails keeps the backend's old definition running (the next reload
    /// tries it again).
    fn grow_backends(
        &mut self,
        d: &ConfigDiff,
        new: &Config,
        errors: &mut Errors,
        restart: &mut Vec<String>,
    ) -> Vec<(String, u64, u64)> {
        if !self.engine.caps().resize {
            // No backend grows behind namespaces whose hosts could never see it (resizes
            // asked for by the file wait for a restart: `resizes_need_a_restart`).
            return Vec::new();
        }
        // Storage is looked at only where a namespace is served from it: a backend whose
        // namespaces were all taken out (gone or hung) may not answer at all, and the
        // main thread runs every host's keep-alive timers.
        let lost = self.shared.target().lost_namespaces();
        let live: std::collections::HashSet<&str> = self
            .cfg
            .subsystems
            .iter()
            .flat_map(|s| s.namespaces.iter().map(move |n| (s, n)))
            .filter(|(s, n)| {
                !lost.iter().any(|(q, id)| *q == s.nqn && *id == n.nsid)
                    && !self
                        .shared
                        .subsystems
                        .id(&s.nqn)
                        .is_some_and(|id| self.hung.contains(&(id, n.nsid)))
            })
            .map(|(_, n)| n.backend.as_str())
            .collect();
        let mut names: Vec<String> = self.backends.keys().cloned().collect();
        names.sort();
        let mut grown = Vec::new();
        for name in names {
            let resized = d.backends_resized.iter().find(|b| b.name == name);
            if resized.is_none() && !live.contains(name.as_str()) {
                continue;
            }
            let Some(def) = resized.or_else(|| new.backends.iter().find(|b| b.name == name)) else {
                continue;
            };
            match grow_backend(&name, &*self.backends[&name], &def.kind, resized.is_some()) {
                Ok((before, after)) if after > before => grown.push((name, before, after)),
                Ok(_) => {}
                // Past what its store reserved at start (a file grown on disk that far, or a
                // size the classification above could not see coming): waits for a
                // restart, as a reload's other such changes do, rather than failing every
                // reload until then.
                Err(e) if matches!(e.cause(), backend::Error::NeedsRestart(_)) => {
                    if resized.is_some() {
                        errors.undone.backends_kept.insert(name.clone());
                    }
                    restart.push(format!("backend {name}: {}", e.cause()));
                }
                Err(e) => {
                    if resized.is_some() {
                        errors.undone.backends_kept.insert(name);
                    }
                    errors.push(e.into());
                }
            }
        }
        grown
    }

    /// Every namespace (as the running config has them) whose backend now holds more
    /// blocks than its hosts are told takes the backend's size: the engine serves it
    /// first, then the target tells the hosts that see it (Namespace Attribute Changed).
    /// Looked at on every reload, so one that failed before is tried again. One line per
    /// backend that grew (`grown`) and per namespace resized.
    fn reconcile_sizes(
        &mut self,
        grown: &[(String, u64, u64)],
        errors: &mut Errors,
    ) -> Vec<String> {
        let mut lines = Vec::new();
        for (name, before, after) in grown {
            let bs = u64::from(self.backends[name].block_size());
            lines.push(format!(
                "backend {name}: grew from {} to {} ({after} blocks of {bs} bytes)",
                bytes_text(before * bs),
                bytes_text(after * bs)
            ));
        }
        if !self.engine.caps().resize {
            return lines;
        }
        let namespaces: Vec<(String, u32, String)> = self
            .cfg
            .subsystems
            .iter()
            .flat_map(|s| {
                s.namespaces
                    .iter()
                    .map(|n| (s.nqn.clone(), n.nsid, n.backend.clone()))
            })
            .collect();
        for (nqn, nsid, backend) in namespaces {
            let Some(be) = self.backends.get(&backend) else {
                continue;
            };
            let (have, bs) = (be.num_blocks(), u64::from(be.block_size()));
            let told = self.shared.target().namespace_blocks(&nqn, nsid);
            let (Some(told), Some(id)) = (told, self.shared.subsystems.id(&nqn)) else {
                continue;
            };
            if have <= told {
                continue;
            }
            match self.engine.ns_resize(id, nsid, have) {
                // Taken out (its storage went or hung): the target still takes the size,
                // for when a reload brings it back.
                Ok(()) | Err(EngineError::NoNamespace(_)) => {}
                Err(source) => {
                    errors.push(ApplyError::Engine {
                        nqn: nqn.clone(),
                        what: format!("resizing namespace {nsid}"),
                        source,
                    });
                    continue;
                }
            }
            let r = self.shared.target().resize_namespace(&nqn, nsid, have);
            match r {
                Ok(actions) => {
                    self.shared.route(actions);
                    lines.push(format!(
                        "subsystem {nqn} namespace {nsid}: now {} ({have} blocks); the hosts \
                         that see it are told (Namespace Attribute Changed)",
                        bytes_text(have * bs)
                    ));
                }
                Err(source) => errors.push(ApplyError::Resize { nqn, nsid, source }),
            }
        }
        for line in &lines {
            tracing::info!("reload: {line}");
        }
        lines
    }

    /// Drain the engine's main events: task completions (a retired subsystem's last
    /// namespace gone lets the engine destroy it) and backend timeouts.
    pub fn engine_events(&mut self) {
        while let Some(ev) = self.engine.progress() {
            match ev {
                MainEvent::NsRemoved { subsys, nsid, .. } => {
                    let nqn = self.subsystem_name(subsys);
                    tracing::info!(
                        "engine: namespace {nsid} of subsystem {nqn} drained and detached"
                    );
                    if let Some((name, b)) = self.flush_when_removed.remove(&(subsys, nsid)) {
                        flush_detached(name, nqn, nsid, b);
                    }
                    let done = self
                        .retiring
                        .iter_mut()
                        .find(|r| r.id == subsys)
                        .is_some_and(|r| {
                            r.namespaces.retain(|n| *n != nsid);
                            r.namespaces.is_empty()
                        });
                    if done {
                        // Errors are logged by the collector; nothing else waits for them.
                        self.destroy_retired(subsys, &mut Errors::default());
                    }
                }
                MainEvent::BeQueueDestroyed { subsys, nsid, .. } => tracing::warn!(
                    "engine: backend queues of namespace {nsid} of subsystem {} destroyed",
                    self.subsystem_name(subsys)
                ),
                MainEvent::BackendTimeout {
                    subsys,
                    nsid,
                    commands,
                    limit,
                } => {
                    let nqn = self.subsystem_name(subsys);
                    tracing::error!(
                        "backend timeout: {commands} command(s) of namespace {nsid} of \
                         subsystem {nqn} outstanding longer than {limit:?}: the backend hangs; \
                         its queues are destroyed (what is outstanding is answered Aborted - SQ \
                         Deletion) and the namespace is taken out (Internal Path Error: hosts \
                         fail over); a reload tries it again on its backend reopened"
                    );
                    self.namespace_lost(&nqn, nsid);
                    if self.hung.insert((subsys, nsid)) {
                        if let Err(e) = self.engine.be_queue_destroy(subsys, nsid, 0) {
                            tracing::error!(
                                "subsystem {nqn}: namespace {nsid}: be_queue_destroy: {e}"
                            );
                        }
                    }
                }
                MainEvent::BackendGone { subsys, nsid } => {
                    let nqn = self.subsystem_name(subsys);
                    tracing::error!(
                        "engine: the backend of namespace {nsid} of subsystem {nqn} is gone \
                         (file deleted, device removed): the namespace is taken out (Internal \
                         Path Error: hosts fail over); a reload tries it again on its backend \
                         reopened"
                    );
                    self.namespace_lost(&nqn, nsid);
                }
            }
        }
    }

    /// The storage of a namespace is gone or hangs: the target takes it out of the active
    /// namespace list (with the Namespace Attribute Changed event) and answers its I/O
    /// Internal Path Error without DNR, so a multipath host fails over (see
    /// `nvmf::target::Target::namespace_lost`). Idempotent.
    fn namespace_lost(&mut self, nqn: &str, nsid: u32) {
        if let Err(e) = self.shared.target().namespace_lost(nqn, nsid) {
            tracing::warn!("subsystem {nqn}: namespace {nsid}: cannot take it out: {e}");
        }
        self.shared.sync_target_state();
        let actions = self.shared.target().take_actions();
        self.shared.route(actions);
    }

    /// Namespaces taken out because their storage went or hung (`namespace_lost`) that
    /// the new file still has, unchanged: the reload tries them again, removed and added
    /// on their backend opened anew (a file that came back, a drive that recovered). A
    /// backend that still does not open leaves the namespace out, as it was
    /// (`keep_what_cannot_move`). Not when another namespace shares the backend: it
    /// cannot be reopened under that one.
    fn retry_lost(&self, d: &mut ConfigDiff, new: &Config) {
        for (nqn, nsid) in self.shared.target().lost_namespaces() {
            let key = (nqn.clone(), nsid);
            if d.namespaces_removed.contains(&key) || d.subsystems_removed.contains(&nqn) {
                continue;
            }
            let Some(ns) = new.namespace(&nqn, nsid) else {
                continue;
            };
            let shared_with = new
                .subsystems
                .iter()
                .flat_map(|s| s.namespaces.iter().map(move |n| (&s.nqn, n)))
                .find(|(s, n)| n.backend == ns.backend && (**s != nqn || n.nsid != nsid));
            if let Some((s, n)) = shared_with {
                tracing::warn!(
                    "subsystem {nqn}: namespace {nsid} stays out: its backend {} is also \
                     namespace {} of {s}'s and cannot be reopened under it",
                    ns.backend,
                    n.nsid
                );
                continue;
            }
            let Some(b) = new.backends.iter().find(|b| b.name == ns.backend) else {
                continue;
            };
            if !d.backends_added.iter().any(|x| x.name == b.name) {
                d.backends_removed.push(b.name.clone());
                d.backends_added.push(b.clone());
            }
            d.namespaces_removed.push(key.clone());
            d.namespaces_added.push((nqn.clone(), ns.clone()));
            d.namespaces_retried.push(key);
        }
    }

    /// The NQN of engine subsystem `id`, retiring ones included, for logs.
    fn subsystem_name(&self, id: SubsysId) -> String {
        match self.retiring.iter().find(|r| r.id == id) {
            Some(r) => r.nqn.clone(),
            None => self.shared.subsystems.name(id),
        }
    }
}

/// What a reload applied.
pub(super) struct Reloaded {
    /// [`ConfigDiff::summary`] of the change (empty: nothing changed).
    pub changes: Vec<String>,
    /// The parts that failed (the rest was applied).
    pub errors: Vec<String>,
    /// The text of the file now running.
    pub text: String,
    /// That file as loaded (what [`Runtime::cfg`] runs of it may be less).
    pub file: Config,
}

/// Errors of one apply, logged as they happen.
#[derive(Default)]
struct Errors {
    list: Vec<ApplyError>,
    /// What the errors left undone, by key: the running config leaves it out.
    undone: Undone,
}

impl Errors {
    fn push(&mut self, e: ApplyError) {
        tracing::error!("{e}");
        self.list.push(e);
    }
}

/// What [`Runtime::apply`] did not do.
pub(super) struct Applied {
    /// Each failure, logged as it happened.
    pub errors: Vec<ApplyError>,
    /// The parts of the change those failures left undone.
    pub undone: Undone,
}

/// Flushes the backend of a namespace the engine has detached, on a thread of its own (a
/// large file's fsync can take seconds; the main thread runs the keep-alive timers).
fn flush_detached(backend: String, nqn: String, nsid: u32, b: Arc<dyn Backend>) {
    let name = backend.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("flush {backend}"))
        .spawn(move || match b.flush_sync() {
            Ok(()) => tracing::info!(
                "backend {backend}: flushed after namespace {nsid} of subsystem {nqn} was \
                 detached"
            ),
            Err(e) => tracing::warn!(
                "backend {backend}: flush after namespace {nsid} of subsystem {nqn} was \
                 detached failed: {e} (writes the host did not flush may not be on stable \
                 storage)"
            ),
        });
    if let Err(e) = spawned {
        tracing::warn!("backend {name}: cannot start its flush after a namespace left: {e}");
    }
}
