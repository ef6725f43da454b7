//! Live reload (SIGHUP): what changed between the running [`Config`] and a newly loaded
//! one. This module only computes the difference; applying it is the daemon's job.
//!
//! Re-reading the file is [`Config::load`] on the same path (it re-runs every check,
//! including the backend files on disk); with the embedded default there is no file to
//! re-read. A config that fails to load leaves the running one untouched.
//!
//! # Identity
//!
//! Entries are matched by key, never by position, so reordering any list in the YAML
//! (listeners, backends, subsystems, namespaces, hosts, a subsystem's listeners, cpus)
//! is not a change:
//!
//! - a listener by `name`; one whose transport/address/port changed is removed + added;
//! - a backend by `name`; one whose definition changed is removed + added when no
//!   surviving namespace uses it; one in use whose size alone changed and that can reach
//!   it by growing is resized in place ([`ConfigDiff::backends_resized`]); otherwise
//!   [`ConfigDiff::restart_required`];
//! - a subsystem by `nqn`;
//! - a namespace by (subsystem NQN, nsid). **Decision:** a change to a namespace's
//!   backend, uuid, nguid or eui64 is removed + added, never a restart: the target
//!   removes the namespace and adds it back, and hosts get a Namespace Attribute Changed
//!   notice. With a new identity hosts see a new namespace. A new backend under the same
//!   identity (the default uuid comes from the NQN and nsid alone) is the same namespace
//!   to them, now holding the new backend's data; the summary says so
//!   (`namespaces_same_identity`). Its `hosts` and its `ana_group` change in place. A
//!   namespace is "surviving" when it is identical in both configs but for those two.
//!
//! # Applying a diff
//!
//! Every list is sorted by its key, so the diff does not depend on file order. Apply
//! removals before additions (a listener may move its address to a new name, a backend
//! may pass from one namespace to another), in this order:
//!
//! 1. `namespaces_removed` — this includes every namespace of a removed subsystem;
//! 2. `subsystems_removed`;
//! 3. `backends_removed` — no namespace uses them any more after step 1;
//! 4. `listeners_removed`;
//! 5. `listeners_added`;
//! 6. `backends_added`;
//! 7. `auth_changed` — replace every host's credentials and every subsystem's
//!    `require_auth` with the new config's, before any subsystem is added, so that no host
//!    reaches a new subsystem before the rules that bind it are in place;
//! 8. `subsystems_added` — add the subsystem *without* its `namespaces`: those are
//!    listed in `namespaces_added` as well, which is authoritative;
//! 9. `namespaces_added` — includes every namespace of an added subsystem;
//! 10. `hosts_changed` — subsystems present in both configs only (an added subsystem
//!     carries its hosts in its `SubsystemConfig`);
//! 11. `namespace_hosts_changed` — per-host visibility of surviving namespaces (a change
//!     of a namespace's `hosts` alone is not a remove + add);
//! 12. `ana_groups_changed` — ANA states of subsystems in both configs (hosts on the
//!     listeners whose state changed get an ANA Change event);
//! 13. `namespace_ana_group_changed` — surviving namespaces moved to another ANA group,
//!     in place (after step 12, so the group's states are the new ones);
//! 14. `referrals_changed` — the discovery log's referrals;
//! 15. `subsystem_listeners_changed` — subsystems in both configs that name listeners,
//!     where the names or a named listener's address changed: each is exposed on its
//!     new list as the listeners now stand (after steps 4 and 5).
//!
//! 16. `backends_resized` — grown in place after everything else, with every other
//!     backend's size re-read (a file grown on disk): the namespaces on a backend that
//!     grew take its new size, and their hosts get a Namespace Attribute Changed notice.
//!
//! Steps 4 and 5 for a listener in both lists (its address or settings changed) are one
//! replacement: the new socket is bound before the old one is closed where the address
//! differs, and a listener whose new address cannot be bound keeps listening on the old
//! one. Backends added (step 6) are opened before anything is removed: a namespace that
//! moves to a backend that does not open stays where it was ([`Undone`] says so).
//!
//! The reservation state file (`reservations:`) needs a restart.
//!
//! `restart_required` lists what cannot be applied live; none of it appears in the other
//! lists, so the rest can still be applied (the daemon keeps running the old value of
//! each restart-required item until it is restarted). These are:
//! - the IO thread layout (`io_threads` / `cpus`), `max_io_size`, the engine, `limits:`,
//!   the metrics address (and `allow_remote`) and the control socket (`control:`);
//! - a backend whose definition changed while a surviving namespace uses it, but for a
//!   larger RAM size or a file's `size` (resized in place);
//! - a subsystem's serial or model.
//!
//! A subsystem's listeners change live (step 15): one that names no listeners is on all
//! of them and follows listeners added or removed at once; one that names some follows
//! its list and the addresses of the listeners on it.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::config::{
    AnaGroupConfig, BackendConfig, BackendKind, Config, IoThreads, ListenerConfig, NamespaceConfig,
    ReferralConfig, SubsystemConfig,
};

/// How [`ConfigDiff::summary`] starts the line of a change that waits for a restart.
pub const RESTART_PREFIX: &str = "restart required: ";

/// The changes from one config to the next; see the module docs for the application
/// order and what each list contains.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigDiff {
    pub listeners_added: Vec<ListenerConfig>,
    pub listeners_removed: Vec<ListenerConfig>,
    pub backends_added: Vec<BackendConfig>,
    /// Backend names.
    pub backends_removed: Vec<String>,
    /// The new definitions of backends in use whose size alone changed and which grow in
    /// place ([`resized_in_place`]): a RAM namespace made larger, a file's `size`. Their namespaces keep their data, identity, reservations and
    /// hosts; hosts see the new size. (Every reload also re-reads the size of file and
    /// block-device backends: one grown on disk grows its namespaces, with no change in
    /// the file at all; that is the daemon's, not in this diff.)
    pub backends_resized: Vec<BackendConfig>,
    /// Complete subsystem configs; their namespaces are also in `namespaces_added`.
    pub subsystems_added: Vec<SubsystemConfig>,
    /// Subsystem NQNs; their namespaces are also in `namespaces_removed`.
    pub subsystems_removed: Vec<String>,
    /// (subsystem NQN, namespace).
    pub namespaces_added: Vec<(String, NamespaceConfig)>,
    /// (subsystem NQN, nsid).
    pub namespaces_removed: Vec<(String, u32)>,
    /// (subsystem NQN, nsid) of namespaces removed and added again on another backend
    /// with the same identity (uuid, nguid, eui64): hosts take them for the same
    /// namespace, so [`ConfigDiff::summary`] says so.
    pub namespaces_same_identity: Vec<(String, u32)>,
    /// (subsystem NQN, nsid) of namespaces the target took out (their storage went or
    /// hung) that the file still has: [`diff`] never lists them; the daemon adds them,
    /// removed and added again on their backend reopened (also in the lists above), so
    /// that a reload of the same file brings them back once their storage is.
    pub namespaces_retried: Vec<(String, u32)>,
    /// (subsystem NQN, allow_any_host, hosts) for subsystems in both configs whose access
    /// list changed; the new full list, in the new config's order.
    pub hosts_changed: Vec<(String, bool, Vec<String>)>,
    /// (subsystem NQN, nsid, hosts) of surviving namespaces whose host list changed (the
    /// only namespace change that is not remove + add: hosts that gain or lose the
    /// namespace get a Namespace Attribute Changed notice, the others nothing).
    pub namespace_hosts_changed: Vec<(String, u32, Option<Vec<String>>)>,
    /// (subsystem NQN, its new ANA groups) for subsystems in both configs whose groups
    /// changed (an added subsystem carries its groups in its `SubsystemConfig`).
    pub ana_groups_changed: Vec<(String, Vec<AnaGroupConfig>)>,
    /// (subsystem NQN, nsid, new ANA group, 1 for the default) of surviving namespaces
    /// moved to another
    /// ANA group: in place, as SPDK does, keeping their reservations and I/O (hosts that
    /// see them get an ANA Change event).
    pub namespace_ana_group_changed: Vec<(String, u32, u32)>,
    /// The new referral list, when it changed.
    pub referrals_changed: Option<Vec<ReferralConfig>>,
    /// (subsystem NQN, listener names or `None` for all, what changed in words) for
    /// subsystems in both configs whose listeners changed: their names, or the address
    /// of one they name.
    pub subsystem_listeners_changed: Vec<(String, Option<Vec<String>>, String)>,
    /// Changes that take effect only after a restart, one human-readable line each.
    pub restart_required: Vec<String>,
    /// Host credentials (`hosts[]`, secrets re-read from their files) or a subsystem's
    /// `require_auth` changed: apply the new config's whole set (step 7). Connected
    /// controllers stay; new secrets apply from the next (re-)authentication.
    pub auth_changed: bool,
}

impl ConfigDiff {
    /// The old definition of listener `name` when the change replaces it (removed and
    /// added under the same name: its address or settings changed).
    pub fn listener_replaced(&self, name: &str) -> Option<&ListenerConfig> {
        self.listeners_removed
            .iter()
            .find(|o| o.name == name)
            .filter(|_| self.listeners_added.iter().any(|l| l.name == name))
    }

    /// For a daemon whose engine cannot follow a resize: the backends this change would
    /// resize in place wait for a restart instead, as any other redefinition of a
    /// backend in use (`why` says why), so that no backend grows behind namespaces whose
    /// hosts could never see it.
    pub fn resizes_need_a_restart(&mut self, why: &str) {
        self.resizes_need_a_restart_where(|_| Some(why.to_string()));
    }

    /// As [`ConfigDiff::resizes_need_a_restart`], for the resizes `why` gives a reason
    /// for (a size past what the backend can reach live); the others stay.
    pub fn resizes_need_a_restart_where(
        &mut self,
        mut why: impl FnMut(&BackendConfig) -> Option<String>,
    ) {
        for b in std::mem::take(&mut self.backends_resized) {
            match why(&b) {
                Some(why) => self.restart_required.push(format!(
                    "backend {}: {} ({why})",
                    b.name,
                    backend_text(&b.kind)
                )),
                None => self.backends_resized.push(b),
            }
        }
    }

    /// True when the configs are equivalent (nothing to apply, nothing needs a restart).
    pub fn is_empty(&self) -> bool {
        self == &ConfigDiff::default()
    }

    /// One log line per change, in application order, restart-required items last
    /// (prefixed `restart required: `). Empty for an empty diff.
    pub fn summary(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (nqn, nsid) in &self.namespaces_removed {
            out.push(format!("subsystem {nqn} namespace {nsid}: remove"));
        }
        for nqn in &self.subsystems_removed {
            out.push(format!("subsystem {nqn}: remove"));
        }
        for name in &self.backends_removed {
            out.push(format!("backend {name}: remove"));
        }
        for l in &self.listeners_removed {
            out.push(format!(
                "listener {}: remove ({})",
                l.name,
                listener_text(l)
            ));
        }
        for l in &self.listeners_added {
            out.push(format!("listener {}: add ({})", l.name, listener_text(l)));
        }
        for b in &self.backends_added {
            out.push(format!(
                "backend {}: add ({})",
                b.name,
                backend_text(&b.kind)
            ));
        }
        for b in &self.backends_resized {
            let what = match &b.kind {
                BackendKind::File {
                    size: Some(size), ..
                } => format!(
                    "size {size} in place (a smaller file is extended to it, a larger one \
                     keeps its size; hosts see any new size)"
                ),
                BackendKind::File { size: None, .. } => {
                    "no size: the file keeps the size it has (nothing to do)".to_string()
                }
                kind => format!(
                    "grow in place to {} (its namespaces keep their data; hosts see the new \
                     size)",
                    backend_text(kind)
                ),
            };
            out.push(format!("backend {}: {what}", b.name));
        }
        if self.auth_changed {
            out.push("host credentials or require_auth: updated".to_string());
        }
        for s in &self.subsystems_added {
            out.push(format!(
                "subsystem {}: add (serial {:?}, model {:?}, listeners [{}], {})",
                s.nqn,
                s.serial,
                s.model,
                s.listeners.join(", "),
                hosts_text(s.allow_any_host, &s.hosts)
            ));
        }
        for (nqn, nsid) in &self.namespaces_retried {
            out.push(format!(
                "subsystem {nqn} namespace {nsid}: taken out earlier (its storage went or \
                 hung): tried again on its backend reopened"
            ));
        }
        for (nqn, ns) in &self.namespaces_added {
            out.push(format!(
                "subsystem {nqn} namespace {}: add on backend {} (uuid {})",
                ns.nsid,
                ns.backend,
                uuid::Uuid::from_bytes(ns.uuid).hyphenated()
            ));
            if self
                .namespaces_same_identity
                .contains(&(nqn.clone(), ns.nsid))
            {
                out.push(format!(
                    "subsystem {nqn} namespace {}: note: same identity on another backend: \
                     connected hosts keep it as the same namespace and read the new \
                     backend's data in place of the old (give it a new uuid, or another \
                     nsid, for hosts to see a new namespace)",
                    ns.nsid
                ));
            }
        }
        for (nqn, any, hosts) in &self.hosts_changed {
            out.push(format!("subsystem {nqn}: {}", hosts_text(*any, hosts)));
        }
        for (nqn, nsid, hosts) in &self.namespace_hosts_changed {
            let who = hosts
                .as_ref()
                .map_or("every host".to_string(), |h| h.join(", "));
            out.push(format!(
                "subsystem {nqn} namespace {nsid}: visible to {who}"
            ));
        }
        for (nqn, nsid, group) in &self.namespace_ana_group_changed {
            out.push(format!(
                "subsystem {nqn} namespace {nsid}: ANA group {group}"
            ));
        }
        for (nqn, groups) in &self.ana_groups_changed {
            let text: Vec<String> = groups
                .iter()
                .map(|g| {
                    let states: Vec<String> =
                        g.states.iter().map(|(l, s)| format!("{l}={s:?}")).collect();
                    format!("group {} [{}]", g.id, states.join(", "))
                })
                .collect();
            if text.is_empty() {
                out.push(format!(
                    "subsystem {nqn}: ANA groups removed (every namespace optimized on \
                     every listener)"
                ));
            } else {
                out.push(format!("subsystem {nqn}: ANA {}", text.join("; ")));
            }
        }
        if let Some(r) = &self.referrals_changed {
            out.push(format!("referrals: {} entr(ies)", r.len()));
        }
        for (nqn, _, text) in &self.subsystem_listeners_changed {
            out.push(format!("subsystem {nqn}: listeners {text}"));
        }
        for line in &self.restart_required {
            out.push(format!("{RESTART_PREFIX}{line}"));
        }
        out
    }
}

/// The changes that turn `old` (running) into `new` (just loaded). Pure; see the module
/// docs for how entries are matched and what each list means.
pub fn diff(old: &Config, new: &Config) -> ConfigDiff {
    let mut d = ConfigDiff::default();
    let require = |c: &Config| -> BTreeSet<String> {
        c.subsystems
            .iter()
            .filter(|s| s.require_auth)
            .map(|s| s.nqn.clone())
            .collect()
    };
    let hosts = |c: &Config| -> BTreeMap<String, crate::config::HostConfig> {
        c.hosts.iter().map(|h| (h.nqn.clone(), h.clone())).collect()
    };
    d.auth_changed = hosts(old) != hosts(new) || require(old) != require(new);

    if !same_threads(&old.threads, &new.threads) {
        d.restart_required.push(format!(
            "io threads: {} -> {}",
            threads_text(&old.threads),
            threads_text(&new.threads)
        ));
    }
    if old.max_io_size != new.max_io_size {
        d.restart_required.push(format!(
            "max_io_size: {} -> {} bytes",
            old.max_io_size, new.max_io_size
        ));
    }
    if old.engine != new.engine {
        d.restart_required
            .push(format!("engine: {} -> {}", old.engine, new.engine));
    }
    if old.limits != new.limits {
        // The engine and the connection accounting take them at start-up.
        d.restart_required.push("limits: changed".to_string());
    }
    if old.doca != new.doca {
        d.restart_required
            .push("doca: devices or queue size changed".to_string());
    }
    if old.metrics != new.metrics {
        let text = |m: Option<std::net::SocketAddr>| m.map_or("off".to_string(), |a| a.to_string());
        d.restart_required.push(format!(
            "metrics address: {} -> {}",
            text(old.metrics),
            text(new.metrics)
        ));
    }
    if old.control != new.control {
        let text = |c: &Option<crate::config::ControlConfig>| match c {
            None => "off".to_string(),
            Some(c) => format!(
                "{} mode {:04o}{}",
                c.path.display(),
                c.mode,
                c.group
                    .as_ref()
                    .map_or(String::new(), |g| format!(" group {g}"))
            ),
        };
        d.restart_required.push(format!(
            "control socket: {} -> {}",
            text(&old.control),
            text(&new.control)
        ));
    }
    if old.metrics_allow_remote != new.metrics_allow_remote {
        // Only the start-up warning depends on it.
        d.restart_required.push(format!(
            "metrics.allow_remote: {} -> {}",
            old.metrics_allow_remote, new.metrics_allow_remote
        ));
    }

    // Listeners, by name.
    let old_l: BTreeMap<&str, &ListenerConfig> =
        old.listeners.iter().map(|l| (l.name.as_str(), l)).collect();
    let new_l: BTreeMap<&str, &ListenerConfig> =
        new.listeners.iter().map(|l| (l.name.as_str(), l)).collect();
    d.listeners_removed = changed(&old_l, &new_l).cloned().collect();
    d.listeners_added = changed(&new_l, &old_l).cloned().collect();

    if old.reservations != new.reservations {
        d.restart_required.push(format!(
            "reservations: state file {:?} ({:?}/{:?}) -> {:?} ({:?}/{:?})",
            old.reservations.state_file,
            old.reservations.if_missing,
            old.reservations.if_corrupt,
            new.reservations.state_file,
            new.reservations.if_missing,
            new.reservations.if_corrupt
        ));
    }
    if old.referrals != new.referrals {
        d.referrals_changed = Some(new.referrals.clone());
    }

    // Namespaces, by (subsystem NQN, nsid): removed or added unless identical (their host
    // lists and ANA groups aside, which change live).
    let old_ns = namespaces(old);
    let new_ns = namespaces(new);
    let same = |a: &NamespaceConfig, b: &NamespaceConfig| {
        let live = |n: &NamespaceConfig| NamespaceConfig {
            hosts: None,
            ana_group: 0,
            ..n.clone()
        };
        live(a) == live(b)
    };
    d.namespaces_removed = old_ns
        .iter()
        .filter(|(key, ns)| !new_ns.get(key).is_some_and(|n| same(n, ns)))
        .map(|(&(nqn, nsid), _)| (nqn.to_string(), nsid))
        .collect();
    d.namespaces_added = new_ns
        .iter()
        .filter(|(key, ns)| !old_ns.get(key).is_some_and(|o| same(o, ns)))
        .map(|(&(nqn, _), &ns)| (nqn.to_string(), ns.clone()))
        .collect();
    d.namespaces_same_identity = new_ns
        .iter()
        .filter_map(|(key, ns)| {
            let o = old_ns.get(key)?;
            (o.backend != ns.backend && (o.uuid, o.nguid, o.eui64) == (ns.uuid, ns.nguid, ns.eui64))
                .then(|| (key.0.to_string(), key.1))
        })
        .collect();
    d.namespace_hosts_changed = new_ns
        .iter()
        .filter_map(|(key, ns)| {
            let o = old_ns.get(key)?;
            (same(o, ns) && o.hosts != ns.hosts)
                .then(|| (key.0.to_string(), key.1, ns.hosts.clone()))
        })
        .collect();
    d.namespace_ana_group_changed = new_ns
        .iter()
        .filter_map(|(key, ns)| {
            let o = old_ns.get(key)?;
            // 0 is the default group, 1.
            let group = |n: &NamespaceConfig| n.ana_group.max(1);
            (same(o, ns) && group(o) != group(ns)).then(|| (key.0.to_string(), key.1, group(ns)))
        })
        .collect();
    // Backends of namespaces that stay as they are: these cannot be swapped live.
    let in_use: BTreeMap<&str, (&str, u32)> = old_ns
        .iter()
        .filter(|(key, ns)| new_ns.get(key).is_some_and(|n| same(n, ns)))
        .map(|(&(nqn, nsid), ns)| (ns.backend.as_str(), (nqn, nsid)))
        .collect();

    // Backends, by name.
    let old_b: BTreeMap<&str, &BackendConfig> =
        old.backends.iter().map(|b| (b.name.as_str(), b)).collect();
    let new_b: BTreeMap<&str, &BackendConfig> =
        new.backends.iter().map(|b| (b.name.as_str(), b)).collect();
    for (&name, &b) in &old_b {
        match new_b.get(name) {
            None => d.backends_removed.push(name.to_string()),
            Some(&nb) if nb != b => match in_use.get(name) {
                Some(_) if resized_in_place(&b.kind, &nb.kind) => {
                    d.backends_resized.push(nb.clone());
                }
                Some((nqn, nsid)) => {
                    let shrinks = matches!(
                        (&b.kind, &nb.kind),
                        (BackendKind::Ram { size: a, .. }, BackendKind::Ram { size: c, .. }) if c < a
                    );
                    d.restart_required.push(format!(
                        "backend {name} (used by subsystem {nqn} namespace {nsid}): {} -> {}{}",
                        backend_text(&b.kind),
                        backend_text(&nb.kind),
                        if shrinks {
                            " (a namespace cannot shrink while hosts use it)"
                        } else {
                            ""
                        }
                    ))
                }
                None => {
                    d.backends_removed.push(name.to_string());
                    d.backends_added.push(nb.clone());
                }
            },
            Some(_) => {}
        }
    }
    d.backends_added.extend(
        new_b
            .iter()
            .filter(|(name, _)| !old_b.contains_key(*name))
            .map(|(_, &b)| b.clone()),
    );
    d.backends_added.sort_by(|a, b| a.name.cmp(&b.name));

    // Subsystems, by NQN.
    let old_s: BTreeMap<&str, &SubsystemConfig> =
        old.subsystems.iter().map(|s| (s.nqn.as_str(), s)).collect();
    let new_s: BTreeMap<&str, &SubsystemConfig> =
        new.subsystems.iter().map(|s| (s.nqn.as_str(), s)).collect();
    d.subsystems_removed = old_s
        .keys()
        .filter(|nqn| !new_s.contains_key(*nqn))
        .map(|nqn| nqn.to_string())
        .collect();
    d.subsystems_added = new_s
        .iter()
        .filter(|(nqn, _)| !old_s.contains_key(*nqn))
        .map(|(_, &s)| s.clone())
        .collect();
    for (&nqn, &o) in &old_s {
        let Some(&n) = new_s.get(nqn) else { continue };
        if o.serial != n.serial {
            d.restart_required.push(format!(
                "subsystem {nqn}: serial {:?} -> {:?}",
                o.serial, n.serial
            ));
        }
        if o.model != n.model {
            d.restart_required.push(format!(
                "subsystem {nqn}: model {:?} -> {:?}",
                o.model, n.model
            ));
        }
        if let Some(text) = listeners_change(o, &old_l, n, &new_l) {
            let names = (!n.all_listeners).then(|| n.listeners.clone());
            d.subsystem_listeners_changed
                .push((nqn.to_string(), names, text));
        }
        if o.allow_any_host != n.allow_any_host || host_set(o) != host_set(n) {
            d.hosts_changed
                .push((nqn.to_string(), n.allow_any_host, n.hosts.clone()));
        }
        if o.ana_groups != n.ana_groups {
            d.ana_groups_changed
                .push((nqn.to_string(), n.ana_groups.clone()));
        }
    }

    d
}

/// Whether a backend in use can go from `old` to `new` in place ([`Backend::grow`]): only
/// its size changed, and it grows. A RAM backend made larger; a file's `size` changed
/// (a file is extended to at least its `size` and never cut, so any new value is
/// reached by growing or by nothing at all).
///
/// [`Backend::grow`]: backend::Backend::grow
pub fn resized_in_place(old: &BackendKind, new: &BackendKind) -> bool {
    match (old, new) {
        (
            BackendKind::Ram {
                size: a,
                block_size: x,
            },
            BackendKind::Ram {
                size: b,
                block_size: y,
            },
        ) => x == y && b > a,
        (
            BackendKind::File {
                path,
                size: _,
                block_size,
                direct,
            },
            BackendKind::File {
                path: p,
                size: _,
                block_size: bs,
                direct: dr,
            },
        ) => path == p && block_size == bs && direct == dr,
        _ => false,
    }
}

/// What the daemon runs once `d`, the change from `old` to `new` ([`diff`]), is applied in
/// full: `new`, except that what [`ConfigDiff::restart_required`] lists keeps `old`'s value
/// until a restart. Recorded as the running config, it keeps those items pending: a later
/// diff (a reload, `--check-config --diff`) still shows them, in the right direction.
pub fn running_after(old: &Config, new: &Config, d: &ConfigDiff) -> Config {
    let mut run = new.clone();
    run.threads = old.threads.clone();
    run.max_io_size = old.max_io_size;
    run.engine = old.engine;
    run.limits = old.limits;
    run.doca = old.doca.clone();
    run.metrics = old.metrics;
    run.control = old.control.clone();
    run.metrics_allow_remote = old.metrics_allow_remote;
    run.reservations = old.reservations.clone();
    // A changed backend that the diff neither removes nor adds is in use: it stays.
    for b in &mut run.backends {
        if d.backends_removed.contains(&b.name)
            || d.backends_resized.iter().any(|r| r.name == b.name)
        {
            continue;
        }
        if let Some(o) = old.backends.iter().find(|o| o.name == b.name) {
            *b = o.clone();
        }
    }
    for s in &mut run.subsystems {
        if let Some(o) = old.subsystems.iter().find(|o| o.nqn == s.nqn) {
            s.serial = o.serial.clone();
            s.model = o.model.clone();
        }
    }
    run
}

/// The parts of a change the daemon could not apply, by key (see [`running_after`] and
/// [`Undone::remove_from`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Undone {
    /// Listeners that could not be opened.
    pub listeners: BTreeSet<String>,
    /// Backends that could not be opened.
    pub backends: BTreeSet<String>,
    /// Subsystems that could not be added.
    pub subsystems: BTreeSet<String>,
    /// (subsystem NQN, nsid) of namespaces that could not be added.
    pub namespaces: BTreeSet<(String, u32)>,
    /// (subsystem NQN, nsid) of namespaces whose new host list could not be applied.
    pub namespace_hosts: BTreeSet<(String, u32)>,
    /// (subsystem NQN, nsid) of namespaces whose new ANA group could not be applied.
    pub namespace_ana_groups: BTreeSet<(String, u32)>,
    /// Subsystems whose new ANA groups could not be applied.
    pub ana_groups: BTreeSet<String>,
    /// Of `listeners`: those still open with their old settings (the new address could
    /// not be bound; the old socket was kept).
    pub listeners_kept: BTreeSet<String>,
    /// Namespaces that stay as they were, on their old backend, because the backend
    /// they were to move to did not open (their removal was skipped).
    pub namespaces_kept: BTreeSet<(String, u32)>,
    /// Backends of the old config that stay, with their old definition: the old backend
    /// of a kept namespace (one whose new definition did not open is such a backend
    /// when a namespace was to move onto it under the same name).
    pub backends_kept: BTreeSet<String>,
}

impl Undone {
    /// `run` (what the change was to give, [`running_after`]) without what failed: what
    /// the daemon really runs. What could not be added is left out and what could not be
    /// changed keeps `old`'s value, so the next reload of the same file tries it again and
    /// `--check-config --diff` shows it as still to do.
    pub fn remove_from(&self, mut run: Config, old: &Config) -> Config {
        run.listeners.retain(|l| !self.listeners.contains(&l.name));
        run.listeners.extend(
            old.listeners
                .iter()
                .filter(|l| self.listeners_kept.contains(&l.name))
                .cloned(),
        );
        run.backends
            .retain(|b| !self.backends.contains(&b.name) && !self.backends_kept.contains(&b.name));
        run.backends.extend(
            old.backends
                .iter()
                .filter(|b| self.backends_kept.contains(&b.name))
                .cloned(),
        );
        run.subsystems.retain(|s| !self.subsystems.contains(&s.nqn));
        let backends: BTreeSet<String> = run.backends.iter().map(|b| b.name.clone()).collect();
        for s in &mut run.subsystems {
            let o = old.subsystems.iter().find(|o| o.nqn == s.nqn);
            // What stayed as it was: a namespace kept whole, or its host list or ANA group.
            for ns in &mut s.namespaces {
                let key = (s.nqn.clone(), ns.nsid);
                let Some(before) = o.and_then(|o| o.namespaces.iter().find(|n| n.nsid == ns.nsid))
                else {
                    continue;
                };
                if self.namespaces_kept.contains(&key) {
                    *ns = before.clone();
                    continue;
                }
                if self.namespace_hosts.contains(&key) {
                    ns.hosts = before.hosts.clone();
                }
                if self.namespace_ana_groups.contains(&key) {
                    ns.ana_group = before.ana_group;
                }
            }
            s.namespaces.retain(|ns| {
                let key = (s.nqn.clone(), ns.nsid);
                backends.contains(&ns.backend)
                    && (!self.namespaces.contains(&key) || self.namespaces_kept.contains(&key))
            });
            if self.ana_groups.contains(&s.nqn) {
                s.ana_groups = o.map_or_else(Vec::new, |o| o.ana_groups.clone());
            }
        }
        run
    }
}

/// The values of `a` that `b` does not hold under the same key, in key order.
fn changed<'a, T: PartialEq>(
    a: &'a BTreeMap<&str, &'a T>,
    b: &'a BTreeMap<&str, &'a T>,
) -> impl Iterator<Item = &'a T> + 'a {
    a.iter()
        .filter(move |(key, v)| b.get(*key) != Some(*v))
        .map(|(_, &v)| v)
}

fn namespaces(cfg: &Config) -> BTreeMap<(&str, u32), &NamespaceConfig> {
    cfg.subsystems
        .iter()
        .flat_map(|s| {
            s.namespaces
                .iter()
                .map(|ns| ((s.nqn.as_str(), ns.nsid), ns))
        })
        .collect()
}

fn host_set(s: &SubsystemConfig) -> BTreeSet<&str> {
    s.hosts.iter().map(String::as_str).collect()
}

/// The same layout: equal counts, or the same set of CPUs (a thread per CPU, so their
/// order does not matter).
fn same_threads(a: &IoThreads, b: &IoThreads) -> bool {
    match (a, b) {
        (IoThreads::Count(x), IoThreads::Count(y)) => x == y,
        (IoThreads::Cpus(x), IoThreads::Cpus(y)) => {
            x.iter().collect::<BTreeSet<_>>() == y.iter().collect::<BTreeSet<_>>()
        }
        _ => false,
    }
}

/// How a subsystem's listeners changed (names added/removed, or a listener it keeps whose
/// definition changed), or `None` when they did not. A subsystem that names no listeners
/// in either config follows the listener list by itself: no change.
fn listeners_change(
    o: &SubsystemConfig,
    old_l: &BTreeMap<&str, &ListenerConfig>,
    n: &SubsystemConfig,
    new_l: &BTreeMap<&str, &ListenerConfig>,
) -> Option<String> {
    match (o.all_listeners, n.all_listeners) {
        (true, true) => return None,
        (true, false) => return Some(format!("all -> [{}]", n.listeners.join(", "))),
        (false, true) => return Some(format!("[{}] -> all", o.listeners.join(", "))),
        (false, false) => {}
    }
    let old_names: BTreeSet<&str> = o.listeners.iter().map(String::as_str).collect();
    let new_names: BTreeSet<&str> = n.listeners.iter().map(String::as_str).collect();
    let mut parts = Vec::new();
    for name in old_names.difference(&new_names) {
        parts.push(format!("-{name}"));
    }
    for name in new_names.difference(&old_names) {
        parts.push(format!("+{name}"));
    }
    for name in old_names.intersection(&new_names) {
        if let (Some(a), Some(b)) = (old_l.get(name), new_l.get(name)) {
            if a != b {
                parts.push(format!(
                    "{name} ({} -> {})",
                    listener_text(a),
                    listener_text(b)
                ));
            }
        }
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

fn listener_text(l: &ListenerConfig) -> String {
    if l.tls != crate::config::TlsMode::None {
        return format!("{} {}, tls {}", l.transport, l.socket_addr(), l.tls);
    }
    format!("{} {}", l.transport, l.socket_addr())
}

fn threads_text(t: &IoThreads) -> String {
    match t {
        IoThreads::Count(n) => format!("{n} unpinned"),
        IoThreads::Cpus(cpus) => format!("pinned to cpus {cpus:?}"),
    }
}

fn backend_text(kind: &BackendKind) -> String {
    match kind {
        BackendKind::Ram { size, block_size } => {
            format!("ram, {size} bytes, {block_size}-byte blocks")
        }
        BackendKind::File {
            path,
            size,
            block_size,
            direct,
        } => {
            let mut s = format!("file {}", path.display());
            if let Some(size) = size {
                let _ = write!(s, ", size {size}");
            }
            if let Some(bs) = block_size {
                let _ = write!(s, ", {bs}-byte blocks");
            }
            if let Some(direct) = direct {
                let _ = write!(s, ", direct {direct}");
            }
            s
        }
        BackendKind::Nvme { pci, nsid, .. } => format!("nvme {pci} namespace {nsid}"),
    }
}

fn hosts_text(allow_any_host: bool, hosts: &[String]) -> String {
    match (allow_any_host, hosts.is_empty()) {
        (true, true) => "any host".to_string(),
        (true, false) => format!("any host (listed: {})", hosts.join(", ")),
        (false, true) => "no host allowed".to_string(),
        (false, false) => format!("hosts {}", hosts.join(", ")),
    }
}

#[cfg(test)]
mod tests;
