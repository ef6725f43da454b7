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
//!   surviving namespace uses it, otherwise [`ConfigDiff::restart_required`];
//! - a subsystem by `nqn`;
//! - a namespace by (subsystem NQN, nsid). **Decision:** any change to a namespace
//!   (backend, uuid, nguid or eui64) is removed + added, never a restart: the target
//!   removes the namespace (hosts get a Namespace Attribute Changed notice and drop it)
//!   and adds it back with its new identity, which hosts see as a new namespace. A
//!   namespace is "surviving" when it is identical in both configs.
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
//! 13. `referrals_changed` — the discovery log's referrals.
//!
//! The reservation state file (`reservations:`) needs a restart.
//!
//! `restart_required` lists what cannot be applied live; none of it appears in the other
//! lists, so the rest can still be applied (the daemon keeps running the old value of
//! each restart-required item until it is restarted). These are:
//! - the IO thread layout (`io_threads` / `cpus`), `max_io_size` and the metrics address;
//! - a backend whose definition changed while a surviving namespace uses it;
//! - a subsystem's serial, model or named listeners (a changed address of a listener it
//!   names too). A subsystem that names no listeners is on all of them, and follows
//!   listeners added or removed by a reload at once (nothing to restart); naming
//!   listeners where it named none, or the reverse, needs a restart.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::config::{
    AnaGroupConfig, BackendConfig, BackendKind, Config, IoThreads, ListenerConfig, NamespaceConfig,
    ReferralConfig, SubsystemConfig,
};

/// The changes from one config to the next; see the module docs for the application
/// order and what each list contains.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigDiff {
    pub listeners_added: Vec<ListenerConfig>,
    pub listeners_removed: Vec<ListenerConfig>,
    pub backends_added: Vec<BackendConfig>,
    /// Backend names.
    pub backends_removed: Vec<String>,
    /// Complete subsystem configs; their namespaces are also in `namespaces_added`.
    pub subsystems_added: Vec<SubsystemConfig>,
    /// Subsystem NQNs; their namespaces are also in `namespaces_removed`.
    pub subsystems_removed: Vec<String>,
    /// (subsystem NQN, namespace).
    pub namespaces_added: Vec<(String, NamespaceConfig)>,
    /// (subsystem NQN, nsid).
    pub namespaces_removed: Vec<(String, u32)>,
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
    /// The new referral list, when it changed.
    pub referrals_changed: Option<Vec<ReferralConfig>>,
    /// Changes that take effect only after a restart, one human-readable line each.
    pub restart_required: Vec<String>,
    /// Host credentials (`hosts[]`, secrets re-read from their files) or a subsystem's
    /// `require_auth` changed: apply the new config's whole set (step 7). Connected
    /// controllers stay; new secrets apply from the next (re-)authentication.
    pub auth_changed: bool,
}

impl ConfigDiff {
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
        for (nqn, ns) in &self.namespaces_added {
            out.push(format!(
                "subsystem {nqn} namespace {}: add on backend {} (uuid {})",
                ns.nsid,
                ns.backend,
                uuid::Uuid::from_bytes(ns.uuid).hyphenated()
            ));
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
        for (nqn, groups) in &self.ana_groups_changed {
            let text: Vec<String> = groups
                .iter()
                .map(|g| {
                    let states: Vec<String> =
                        g.states.iter().map(|(l, s)| format!("{l}={s:?}")).collect();
                    format!("group {} [{}]", g.id, states.join(", "))
                })
                .collect();
            out.push(format!("subsystem {nqn}: ANA {}", text.join("; ")));
        }
        if let Some(r) = &self.referrals_changed {
            out.push(format!("referrals: {} entr(ies)", r.len()));
        }
        for line in &self.restart_required {
            out.push(format!("restart required: {line}"));
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
    if old.metrics != new.metrics {
        let text = |m: Option<std::net::SocketAddr>| m.map_or("off".to_string(), |a| a.to_string());
        d.restart_required.push(format!(
            "metrics address: {} -> {}",
            text(old.metrics),
            text(new.metrics)
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
    // lists aside, which change live).
    let old_ns = namespaces(old);
    let new_ns = namespaces(new);
    let same = |a: &NamespaceConfig, b: &NamespaceConfig| {
        NamespaceConfig {
            hosts: None,
            ..a.clone()
        } == NamespaceConfig {
            hosts: None,
            ..b.clone()
        }
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
    d.namespace_hosts_changed = new_ns
        .iter()
        .filter_map(|(key, ns)| {
            let o = old_ns.get(key)?;
            (same(o, ns) && o.hosts != ns.hosts)
                .then(|| (key.0.to_string(), key.1, ns.hosts.clone()))
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
                Some((nqn, nsid)) => d.restart_required.push(format!(
                    "backend {name} (used by subsystem {nqn} namespace {nsid}): {} -> {}",
                    backend_text(&b.kind),
                    backend_text(&nb.kind)
                )),
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
            d.restart_required
                .push(format!("subsystem {nqn}: listeners {text}"));
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
mod tests {
    use super::*;

    const A: &str = "nqn.2026-11.dev.test:a";
    const B: &str = "nqn.2026-11.dev.test:b";

    const BASE: &str = "\
io_threads: 2
listeners:
  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: 4420}
  - {name: tcp1, transport: tcp, address: 127.0.0.1, port: 4421}
backends:
  - {name: ram0, type: ram, size: 64MiB}
  - {name: ram1, type: ram, size: 64MiB}
  - {name: ram2, type: ram, size: 64MiB}
  - {name: spare, type: ram, size: 1MiB}
subsystems:
  - nqn: nqn.2026-11.dev.test:a
    listeners: [tcp0, tcp1]
    hosts: [nqn.2026-11.dev.test:h1, nqn.2026-11.dev.test:h2]
    namespaces:
      - {nsid: 1, backend: ram0}
      - {nsid: 2, backend: ram1}
  - nqn: nqn.2026-11.dev.test:b
    allow_any_host: true
    listeners: [tcp0]
    namespaces:
      - {nsid: 1, backend: ram2}
metrics:
  address: 127.0.0.1:9100
";

    fn parse(yaml: &str) -> Config {
        Config::parse(yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}\n{yaml}"))
    }

    /// `BASE` with `old` (which must occur exactly once) replaced by `new`.
    fn edit(old: &str, new: &str) -> Config {
        assert_eq!(
            BASE.matches(old).count(),
            1,
            "{old:?} must occur once in BASE"
        );
        parse(&BASE.replacen(old, new, 1))
    }

    fn from_base(new: &Config) -> ConfigDiff {
        diff(&parse(BASE), new)
    }

    fn ns(cfg: &Config, nqn: &str, nsid: u32) -> NamespaceConfig {
        cfg.subsystems
            .iter()
            .find(|s| s.nqn == nqn)
            .and_then(|s| s.namespaces.iter().find(|n| n.nsid == nsid))
            .cloned()
            .unwrap_or_else(|| panic!("no namespace {nqn}/{nsid}"))
    }

    fn assert_only_restart(d: &ConfigDiff, lines: &[&str]) {
        assert_eq!(
            d,
            &ConfigDiff {
                restart_required: lines.iter().map(|l| l.to_string()).collect(),
                ..ConfigDiff::default()
            }
        );
    }

    #[test]
    fn a_changed_max_io_size_needs_a_restart() {
        let old = parse(BASE);
        let new = Config {
            max_io_size: old.max_io_size / 2,
            ..old.clone()
        };
        let d = diff(&old, &new);
        assert_eq!(d.restart_required.len(), 1, "{d:?}");
        assert!(d.restart_required[0].starts_with("max_io_size: "));
        assert_eq!(
            ConfigDiff {
                restart_required: Vec::new(),
                ..d
            },
            ConfigDiff::default()
        );
    }

    #[test]
    fn identical_configs_give_an_empty_diff() {
        let d = diff(&parse(BASE), &parse(BASE));
        assert!(d.is_empty(), "{d:#?}");
        assert!(d.summary().is_empty());
        let def = Config::embedded_default();
        assert!(diff(&def, &Config::embedded_default()).is_empty());
        // Where the config came from is not part of it.
        let elsewhere = Config::parse(BASE, "/etc/other.yaml").unwrap();
        assert!(diff(&parse(BASE), &elsewhere).is_empty());
    }

    #[test]
    fn reordered_lists_are_not_a_change() {
        let reordered = "\
metrics:
  address: 127.0.0.1:9100
subsystems:
  - nqn: nqn.2026-11.dev.test:b
    listeners: [tcp0]
    allow_any_host: true
    namespaces:
      - {backend: ram2, nsid: 1}
  - nqn: nqn.2026-11.dev.test:a
    namespaces:
      - {nsid: 2, backend: ram1}
      - {nsid: 1, backend: ram0}
    hosts: [nqn.2026-11.dev.test:h2, nqn.2026-11.dev.test:h1]
    listeners: [tcp1, tcp0]
backends:
  - {name: spare, type: ram, size: 1MiB}
  - {name: ram2, type: ram, size: 64MiB}
  - {name: ram0, type: ram, size: 64MiB}
  - {name: ram1, type: ram, size: 64MiB, block_size: 512}
listeners:
  - {name: tcp1, transport: tcp, address: 127.0.0.1, port: 4421}
  - {port: 4420, address: 127.0.0.1, transport: tcp, name: tcp0}
io_threads: 2
";
        let d = from_base(&parse(reordered));
        assert!(d.is_empty(), "{d:#?}");
        // And the other way round.
        assert!(diff(&parse(reordered), &parse(BASE)).is_empty());

        // A subsystem that names no listeners gets all of them, in file order; swapping
        // the listeners is still no change.
        let all = BASE.replace("    listeners: [tcp0, tcp1]\n", "");
        let swapped = all.replace(
            "  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: 4420}\n  \
             - {name: tcp1, transport: tcp, address: 127.0.0.1, port: 4421}\n",
            "  - {name: tcp1, transport: tcp, address: 127.0.0.1, port: 4421}\n  \
             - {name: tcp0, transport: tcp, address: 127.0.0.1, port: 4420}\n",
        );
        assert_ne!(all, swapped);
        assert!(diff(&parse(&all), &parse(&swapped)).is_empty());
    }

    #[test]
    fn io_threads_need_a_restart() {
        let d = from_base(&edit("io_threads: 2", "io_threads: 4"));
        assert_only_restart(&d, &["io threads: 2 unpinned -> 4 unpinned"]);

        // Built directly: the config checks that listed CPUs exist on this machine.
        let with_cpus = |cpus: &[usize]| Config {
            threads: IoThreads::Cpus(cpus.to_vec()),
            ..parse(BASE)
        };
        let d = from_base(&with_cpus(&[0, 1]));
        assert_only_restart(&d, &["io threads: 2 unpinned -> pinned to cpus [0, 1]"]);

        let pinned = with_cpus(&[0, 1]);
        assert!(diff(&pinned, &with_cpus(&[1, 0])).is_empty());
        let d = diff(&pinned, &with_cpus(&[0, 2]));
        assert_only_restart(
            &d,
            &["io threads: pinned to cpus [0, 1] -> pinned to cpus [0, 2]"],
        );
        // One pinned thread is a change from one unpinned thread.
        let d = diff(
            &Config {
                threads: IoThreads::Count(1),
                ..parse(BASE)
            },
            &with_cpus(&[0]),
        );
        assert_only_restart(&d, &["io threads: 1 unpinned -> pinned to cpus [0]"]);
    }

    #[test]
    fn metrics_address_needs_a_restart() {
        let d = from_base(&edit("127.0.0.1:9100", "127.0.0.1:9200"));
        assert_only_restart(&d, &["metrics address: 127.0.0.1:9100 -> 127.0.0.1:9200"]);
        let d = from_base(&edit("metrics:\n  address: 127.0.0.1:9100\n", ""));
        assert_only_restart(&d, &["metrics address: 127.0.0.1:9100 -> off"]);
    }

    #[test]
    fn listener_added_and_removed() {
        let added = edit(
            "listeners:\n",
            "listeners:\n  - {name: tcp9, transport: tcp, address: '::1', port: 4420}\n",
        );
        let d = from_base(&added);
        assert_eq!(
            d,
            ConfigDiff {
                listeners_added: vec![ListenerConfig {
                    name: "tcp9".into(),
                    transport: crate::config::TransportKind::Tcp,
                    address: "::1".parse().unwrap(),
                    port: 4420,
                    tls: crate::config::TlsMode::None,
                }],
                ..ConfigDiff::default()
            }
        );
        assert_eq!(d.summary(), ["listener tcp9: add (tcp [::1]:4420)"]);

        let d = diff(&added, &parse(BASE));
        assert_eq!(d.listeners_removed, added.listeners[..1]);
        assert!(d.listeners_added.is_empty());
        assert!(d.restart_required.is_empty(), "{d:#?}");
        assert_eq!(d.summary(), ["listener tcp9: remove (tcp [::1]:4420)"]);
    }

    #[test]
    fn listener_changed_is_removed_and_added() {
        let base = parse(BASE);
        let new = edit("port: 4421", "port: 4430");
        let d = diff(&base, &new);
        assert_eq!(d.listeners_removed, [base.listeners[1].clone()]);
        assert_eq!(d.listeners_added, [new.listeners[1].clone()]);
        // Subsystem a serves on tcp1: its listeners changed.
        assert_eq!(
            d.restart_required,
            [format!(
                "subsystem {A}: listeners tcp1 (tcp 127.0.0.1:4421 -> tcp 127.0.0.1:4430)"
            )]
        );
        assert!(d.backends_added.is_empty() && d.namespaces_added.is_empty());
        assert!(d.subsystems_added.is_empty() && d.hosts_changed.is_empty());
    }

    #[test]
    fn subsystem_listeners_need_a_restart() {
        let d = from_base(&edit("listeners: [tcp0]\n", "listeners: [tcp1]\n"));
        assert_only_restart(&d, &[&format!("subsystem {B}: listeners -tcp0, +tcp1")]);

        // Subsystem b follows "all listeners": a new listener is simply added, the
        // subsystem is on it at once.
        let implicit = BASE.replace("    listeners: [tcp0]\n", "");
        let more = implicit.replace(
            "listeners:\n",
            "listeners:\n  - {name: tcp9, transport: tcp, address: '::1', port: 4420}\n",
        );
        let d = diff(&parse(&implicit), &parse(&more));
        assert_eq!(d.listeners_added.len(), 1);
        assert!(d.restart_required.is_empty(), "{d:#?}");
        // Naming listeners where none were named (even all of them) needs a restart.
        let d = diff(&parse(&implicit), &parse(BASE));
        assert_eq!(
            d.restart_required,
            [format!("subsystem {B}: listeners all -> [tcp0]")]
        );
    }

    #[test]
    fn backend_added_removed_and_redefined_when_unused() {
        let d = from_base(&edit(
            "  - {name: spare, type: ram, size: 1MiB}\n",
            "  - {name: extra, type: ram, size: 2MiB, block_size: 4096}\n",
        ));
        assert_eq!(
            d,
            ConfigDiff {
                backends_added: vec![BackendConfig {
                    name: "extra".into(),
                    kind: BackendKind::Ram {
                        size: 2 << 20,
                        block_size: 4096
                    },
                }],
                backends_removed: vec!["spare".into()],
                ..ConfigDiff::default()
            }
        );
        assert_eq!(
            d.summary(),
            [
                "backend spare: remove",
                "backend extra: add (ram, 2097152 bytes, 4096-byte blocks)"
            ]
        );

        // No namespace uses spare: a new definition is applied live.
        let new = edit("size: 1MiB", "size: 2MiB");
        let d = from_base(&new);
        assert_eq!(d.backends_removed, ["spare"]);
        assert_eq!(d.backends_added, [new.backends[3].clone()]);
        assert!(d.restart_required.is_empty(), "{d:#?}");
    }

    #[test]
    fn backend_redefined_while_in_use_needs_a_restart() {
        let d = from_base(&edit(
            "  - {name: ram2, type: ram, size: 64MiB}",
            "  - {name: ram2, type: ram, size: 128MiB}",
        ));
        assert_only_restart(
            &d,
            &[&format!(
                "backend ram2 (used by subsystem {B} namespace 1): \
                 ram, 67108864 bytes, 512-byte blocks -> ram, 134217728 bytes, 512-byte blocks"
            )],
        );
    }

    #[test]
    fn backend_redefined_while_its_namespace_changes_is_swapped_live() {
        // b/1 gets a new uuid (removed + added), so ram2 is free in between.
        let new = parse(
            &BASE
                .replace(
                    "      - {nsid: 1, backend: ram2}",
                    "      - {nsid: 1, backend: ram2, uuid: 0e9c1b7a-3d4f-4a5b-8c6d-7e8f9a0b1c2d}",
                )
                .replace(
                    "name: ram2, type: ram, size: 64MiB",
                    "name: ram2, type: ram, size: 32MiB",
                ),
        );
        let d = from_base(&new);
        assert_eq!(d.namespaces_removed, [(B.to_string(), 1)]);
        assert_eq!(d.namespaces_added, [(B.to_string(), ns(&new, B, 1))]);
        assert_eq!(d.backends_removed, ["ram2"]);
        assert_eq!(d.backends_added, [new.backends[2].clone()]);
        assert!(d.restart_required.is_empty(), "{d:#?}");
    }

    #[test]
    fn subsystem_added_lists_its_namespaces() {
        let new = edit(
            "metrics:",
            "  - nqn: nqn.2026-11.dev.test:c\n    \
               allow_any_host: true\n    \
               namespaces:\n      \
                 - {nsid: 5, backend: spare}\n\
             metrics:",
        );
        let d = from_base(&new);
        let c = new.subsystems[2].clone();
        assert_eq!(c.nqn, "nqn.2026-11.dev.test:c");
        assert_eq!(
            d,
            ConfigDiff {
                namespaces_added: vec![(c.nqn.clone(), c.namespaces[0].clone())],
                subsystems_added: vec![c.clone()],
                ..ConfigDiff::default()
            }
        );
        let summary = d.summary();
        assert_eq!(summary.len(), 2);
        assert!(
            summary[0].starts_with("subsystem nqn.2026-11.dev.test:c: add (serial \"NVMFT"),
            "{summary:?}"
        );
        assert!(
            summary[0].ends_with(", model \"nvmf-target\", listeners [tcp0, tcp1], any host)"),
            "{summary:?}"
        );
        assert!(
            summary[1].starts_with(
                "subsystem nqn.2026-11.dev.test:c namespace 5: add on backend spare (uuid "
            ),
            "{summary:?}"
        );
    }

    #[test]
    fn subsystem_removed_lists_its_namespaces() {
        let new = parse(&BASE.replace(
            "  - nqn: nqn.2026-11.dev.test:a\n    \
               listeners: [tcp0, tcp1]\n    \
               hosts: [nqn.2026-11.dev.test:h1, nqn.2026-11.dev.test:h2]\n    \
               namespaces:\n      \
                 - {nsid: 1, backend: ram0}\n      \
                 - {nsid: 2, backend: ram1}\n",
            "",
        ));
        assert_eq!(new.subsystems.len(), 1);
        let d = from_base(&new);
        assert_eq!(
            d,
            ConfigDiff {
                subsystems_removed: vec![A.into()],
                namespaces_removed: vec![(A.into(), 1), (A.into(), 2)],
                ..ConfigDiff::default()
            }
        );
        assert_eq!(
            d.summary(),
            [
                format!("subsystem {A} namespace 1: remove"),
                format!("subsystem {A} namespace 2: remove"),
                format!("subsystem {A}: remove"),
            ]
        );
    }

    #[test]
    fn namespace_added_and_removed() {
        let new = edit(
            "      - {nsid: 1, backend: ram2}\n",
            "      - {nsid: 1, backend: ram2}\n      - {nsid: 9, backend: spare}\n",
        );
        let d = from_base(&new);
        assert_eq!(
            d,
            ConfigDiff {
                namespaces_added: vec![(B.into(), ns(&new, B, 9))],
                ..ConfigDiff::default()
            }
        );
        let d = diff(&new, &parse(BASE));
        assert_eq!(
            d,
            ConfigDiff {
                namespaces_removed: vec![(B.into(), 9)],
                ..ConfigDiff::default()
            }
        );
        assert_eq!(d.summary(), [format!("subsystem {B} namespace 9: remove")]);
    }

    #[test]
    fn namespace_moved_to_another_backend_is_removed_and_added() {
        let new = edit("{nsid: 2, backend: ram1}", "{nsid: 2, backend: spare}");
        let d = from_base(&new);
        assert_eq!(
            d,
            ConfigDiff {
                namespaces_removed: vec![(A.into(), 2)],
                namespaces_added: vec![(A.into(), ns(&new, A, 2))],
                ..ConfigDiff::default()
            }
        );
        assert_eq!(ns(&new, A, 2).backend, "spare");

        // Two namespaces trading backends: both removed, then both added.
        let swapped = parse(
            &BASE
                .replace("{nsid: 1, backend: ram0}", "{nsid: 1, backend: ram1}")
                .replace("{nsid: 2, backend: ram1}", "{nsid: 2, backend: ram0}"),
        );
        let d = from_base(&swapped);
        assert_eq!(d.namespaces_removed, [(A.into(), 1), (A.into(), 2)]);
        assert_eq!(
            d.namespaces_added,
            [
                (A.into(), ns(&swapped, A, 1)),
                (A.into(), ns(&swapped, A, 2))
            ]
        );
        assert!(d.backends_removed.is_empty() && d.restart_required.is_empty());
    }

    #[test]
    fn namespace_identity_change_is_removed_and_added() {
        for (field, value) in [
            ("uuid", "0e9c1b7a-3d4f-4a5b-8c6d-7e8f9a0b1c2d"),
            ("nguid", "00112233445566778899aabbccddeeff"),
            ("eui64", "0211223344556677"),
        ] {
            let new = edit(
                "{nsid: 1, backend: ram0}",
                &format!("{{nsid: 1, backend: ram0, {field}: {value}}}"),
            );
            let d = from_base(&new);
            assert_eq!(
                d,
                ConfigDiff {
                    namespaces_removed: vec![(A.into(), 1)],
                    namespaces_added: vec![(A.into(), ns(&new, A, 1))],
                    ..ConfigDiff::default()
                },
                "{field}"
            );
        }
        // Writing out the derived uuid is no change.
        let base = parse(BASE);
        let uuid = uuid::Uuid::from_bytes(ns(&base, A, 1).uuid).hyphenated();
        let explicit = edit(
            "{nsid: 1, backend: ram0}",
            &format!("{{nsid: 1, backend: ram0, uuid: {uuid}}}"),
        );
        assert!(diff(&base, &explicit).is_empty());
    }

    #[test]
    fn hosts_changed() {
        let d = from_base(&edit(
            "hosts: [nqn.2026-11.dev.test:h1, nqn.2026-11.dev.test:h2]",
            "hosts: [nqn.2026-11.dev.test:h2, nqn.2026-11.dev.test:h3]",
        ));
        let hosts = vec![
            "nqn.2026-11.dev.test:h2".to_string(),
            "nqn.2026-11.dev.test:h3".to_string(),
        ];
        assert_eq!(
            d,
            ConfigDiff {
                hosts_changed: vec![(A.into(), false, hosts)],
                ..ConfigDiff::default()
            }
        );
        assert_eq!(
            d.summary(),
            [format!(
                "subsystem {A}: hosts nqn.2026-11.dev.test:h2, nqn.2026-11.dev.test:h3"
            )]
        );

        let d = from_base(&edit("allow_any_host: true", "allow_any_host: false"));
        assert_eq!(d.hosts_changed, [(B.to_string(), false, vec![])]);
        assert_eq!(d.summary(), [format!("subsystem {B}: no host allowed")]);
        assert!(d.restart_required.is_empty());

        let d = from_base(&edit(
            "    allow_any_host: true\n",
            "    allow_any_host: true\n    hosts: [nqn.2026-11.dev.test:h1]\n",
        ));
        assert_eq!(
            d.hosts_changed,
            [(
                B.to_string(),
                true,
                vec!["nqn.2026-11.dev.test:h1".to_string()]
            )]
        );
    }

    #[test]
    fn serial_and_model_need_a_restart() {
        let new = edit(
            "    allow_any_host: true\n",
            "    allow_any_host: true\n    serial: SN42\n    model: Example\n",
        );
        let d = from_base(&new);
        let old_serial = crate::config::derive_serial(B);
        assert_only_restart(
            &d,
            &[
                &format!("subsystem {B}: serial {old_serial:?} -> \"SN42\""),
                &format!("subsystem {B}: model \"nvmf-target\" -> \"Example\""),
            ],
        );
        assert_eq!(
            d.summary()[0],
            format!("restart required: subsystem {B}: serial {old_serial:?} -> \"SN42\"")
        );
    }

    #[test]
    fn summary_follows_the_application_order() {
        let new = parse(
            &BASE
                .replace("io_threads: 2", "io_threads: 3")
                .replace(
                    "  - {name: tcp1, transport: tcp, address: 127.0.0.1, port: 4421}\n",
                    "  - {name: tcp2, transport: tcp, address: 127.0.0.1, port: 4421}\n",
                )
                .replace("listeners: [tcp0, tcp1]", "listeners: [tcp0]")
                .replace(
                    "{name: spare, type: ram, size: 1MiB}",
                    "{name: new, type: ram, size: 1MiB}",
                )
                .replace("{nsid: 2, backend: ram1}", "{nsid: 3, backend: new}")
                .replace("allow_any_host: true", "allow_any_host: false"),
        );
        let d = from_base(&new);
        assert!(!d.is_empty());
        assert_eq!(
            d.summary(),
            [
                format!("subsystem {A} namespace 2: remove"),
                "backend spare: remove".to_string(),
                "listener tcp1: remove (tcp 127.0.0.1:4421)".to_string(),
                "listener tcp2: add (tcp 127.0.0.1:4421)".to_string(),
                "backend new: add (ram, 1048576 bytes, 512-byte blocks)".to_string(),
                format!(
                    "subsystem {A} namespace 3: add on backend new (uuid {})",
                    uuid::Uuid::from_bytes(ns(&new, A, 3).uuid).hyphenated()
                ),
                format!("subsystem {B}: no host allowed"),
                "restart required: io threads: 2 unpinned -> 3 unpinned".to_string(),
                format!("restart required: subsystem {A}: listeners -tcp1"),
            ]
        );
    }

    #[test]
    fn file_backends() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = |size: &str| {
            format!(
                "backends:\n  - {{name: f, type: file, path: disk.img, size: {size}}}\n\
                 listeners:\n  - {{name: l, transport: tcp, address: 127.0.0.1, port: 4420}}\n\
                 subsystems:\n  - nqn: {A}\n    namespaces:\n      - {{nsid: 1, backend: f}}\n"
            )
        };
        let path = dir.path().join("t.yaml");
        std::fs::write(&path, yaml("1MiB")).unwrap();
        let running = Config::load(&path).unwrap();
        // SIGHUP re-reads the same path with Config::load: unchanged file, empty diff.
        assert!(diff(&running, &Config::load(&path).unwrap()).is_empty());

        std::fs::write(&path, yaml("2MiB")).unwrap();
        let d = diff(&running, &Config::load(&path).unwrap());
        let img = dir.path().join("disk.img");
        assert_only_restart(
            &d,
            &[&format!(
                "backend f (used by subsystem {A} namespace 1): file {0}, size 1048576 -> \
                 file {0}, size 2097152",
                img.display()
            )],
        );
    }

    /// A namespace's host list changes live (no remove + add); its ANA group does not.
    /// ANA states and referrals change live; the reservation state file needs a restart.
    #[test]
    fn visibility_ana_and_referrals_change_live() {
        let new = edit(
            "      - {nsid: 2, backend: ram1}",
            "      - {nsid: 2, backend: ram1, hosts: [nqn.2026-11.dev.test:h2]}",
        );
        let d = from_base(&new);
        assert!(d.namespaces_removed.is_empty() && d.namespaces_added.is_empty());
        assert_eq!(
            d.namespace_hosts_changed,
            vec![(
                A.to_string(),
                2,
                Some(vec!["nqn.2026-11.dev.test:h2".to_string()])
            )]
        );
        let new = edit(
            "      - {nsid: 2, backend: ram1}",
            "      - {nsid: 2, backend: ram1, ana_group: 3}",
        );
        let d = from_base(&new);
        assert_eq!(d.namespaces_removed, vec![(A.to_string(), 2)]);
        let new = edit(
            "    listeners: [tcp0, tcp1]\n",
            "    listeners: [tcp0, tcp1]\n    ana_groups: [{id: 1, states: {tcp0: inaccessible}}]\n",
        );
        let d = from_base(&new);
        assert_eq!(d.ana_groups_changed.len(), 1);
        assert_eq!(d.ana_groups_changed[0].1[0].states[0].0, "tcp0");
        assert!(d.restart_required.is_empty());
        let new = edit(
            "metrics:\n",
            "referrals: [{transport: tcp, address: 192.0.2.1, port: 8009}]\nreservations: {state_file: /tmp/x}\nmetrics:\n",
        );
        let d = from_base(&new);
        assert_eq!(d.referrals_changed.as_ref().map(Vec::len), Some(1));
        assert_eq!(d.restart_required.len(), 1);
        assert!(d.restart_required[0].starts_with("reservations:"));
    }
}
