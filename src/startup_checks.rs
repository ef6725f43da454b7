//! Warnings about how the daemon is set up that are not config errors (it still starts):
//! a config file others may write, a metrics endpoint reachable from other hosts that
//! nobody asked for, too few file descriptors for `limits.max_connections`, a subsystem
//! no host may connect to. Also raises the soft RLIMIT_NOFILE to the hard one (every
//! connection is a descriptor).

use std::net::SocketAddr;
use std::path::Path;

use crate::config::{BackendKind, Config};

/// Mode bits that let someone other than the file's owner change it (group or others
/// write).
const WRITABLE_BY_OTHERS: u32 = 0o022;

/// Descriptors the daemon needs besides connections (listeners, backends, io_uring
/// rings, epoll, the metrics server, logs).
const DESCRIPTOR_RESERVE: u64 = 256;

/// Why `path` (the config file) is a risk, if it is: whoever can write it decides, at
/// the next reload, which hosts may connect and which files and devices are exported.
pub fn config_permissions(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    writable_by_others(mode).then(|| {
        format!(
            "config file {} is writable by others (mode {:o}): whoever can write it decides, \
             at the next reload, which hosts may connect and what is exported; chmod go-w it",
            path.display(),
            mode & 0o7777
        )
    })
}

fn writable_by_others(mode: u32) -> bool {
    mode & WRITABLE_BY_OTHERS != 0
}

/// What in a valid config is probably not what was meant, one warning each:
/// - a subsystem that allows no host at all (`allow_any_host: false` and no `hosts:`),
///   which may be kept so on purpose until its hosts are known;
/// - a subsystem with `allow_any_host: true` and a `hosts:` list, which then restricts
///   nothing;
/// - more IO threads than CPUs this process may run on (`cpus` available), each of
///   which polls;
/// - a RAM backend larger than memory and swap together (refused when it opens: said
///   here too so that `--check-config` tells), or RAM backends that are together: a RAM
///   namespace takes memory as hosts write it, so thin provisioning is allowed, but
///   hosts filling them all would meet the out-of-memory killer.
///
/// `--check-config` prints these, the daemon logs them at start-up and reload.
pub fn config_warnings(cfg: &Config) -> Vec<String> {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    warnings_for(cfg, cpus, memory_and_swap())
}

/// MemTotal plus SwapTotal, in bytes (`None` where /proc/meminfo does not say).
pub(crate) fn memory_and_swap() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Some((kib("MemTotal:")? + kib("SwapTotal:").unwrap_or(0)) * 1024)
}

/// `bytes` in GiB, or TiB from 1 TiB up (a typo's 64 TiB reads as such).
pub(crate) fn gib(bytes: u64) -> String {
    let (unit, shift) = if bytes >= 1 << 40 {
        ("TiB", 40)
    } else {
        ("GiB", 30)
    };
    format!("{:.1} {unit}", bytes as f64 / (1u64 << shift) as f64)
}

fn warnings_for(cfg: &Config, cpus: usize, memory: Option<u64>) -> Vec<String> {
    let mut w = Vec::new();
    for s in &cfg.subsystems {
        if !s.allow_any_host && s.hosts.is_empty() {
            w.push(format!(
                "subsystem {}: no host may connect (allow_any_host is false and hosts lists \
                 none); add its hosts, or set allow_any_host: true",
                s.nqn
            ));
        }
        if s.allow_any_host && !s.hosts.is_empty() {
            w.push(format!(
                "subsystem {}: allow_any_host is true, so any host may connect and its hosts \
                 list ({} host{}) restricts nothing; set allow_any_host: false to allow only \
                 those",
                s.nqn,
                s.hosts.len(),
                if s.hosts.len() == 1 { "" } else { "s" }
            ));
        }
    }
    let n = cfg.threads.count();
    if cpus > 0 && n > cpus {
        w.push(format!(
            "io_threads: {n} IO threads on {cpus} CPU{} this process may use: each thread \
             polls, so the ones past the CPUs add wake-ups and CPU time, not I/O",
            if cpus == 1 { "" } else { "s" }
        ));
    }
    if let Some(limit) = memory {
        w.extend(ram_warnings(cfg, limit));
    }
    w
}

/// RAM backends against `limit` (memory and swap, bytes): each one larger, by name; else,
/// when there are several, their sum.
fn ram_warnings(cfg: &Config, limit: u64) -> Vec<String> {
    let ram: Vec<(&str, u64)> = cfg
        .backends
        .iter()
        .filter_map(|b| match b.kind {
            BackendKind::Ram { size, .. } => Some((b.name.as_str(), size)),
            _ => None,
        })
        .collect();
    let too_big: Vec<String> = ram
        .iter()
        .filter(|&&(_, size)| size > limit)
        .map(|&(name, size)| {
            format!(
                "backend {name}: {} of RAM is more than this machine's memory and swap \
                 together ({}); it is refused when it opens",
                gib(size),
                gib(limit)
            )
        })
        .collect();
    if !too_big.is_empty() {
        return too_big;
    }
    let total: u64 = ram.iter().map(|&(_, size)| size).sum();
    if ram.len() < 2 || total <= limit {
        return Vec::new();
    }
    let names: Vec<&str> = ram.iter().map(|&(name, _)| name).collect();
    vec![format!(
        "RAM backends {} take {} together, more than this machine's memory and swap ({}): \
         a RAM namespace takes memory as hosts write it, so hosts that fill them all would \
         bring the out-of-memory killer; make them smaller or use file backends",
        names.join(", "),
        gib(total),
        gib(limit)
    )]
}

/// The warning for a metrics endpoint on `addr` (it has no authentication), unless it is
/// on loopback or the config said `allow_remote: true`.
pub fn metrics_exposure(addr: SocketAddr, allow_remote: bool) -> Option<String> {
    if allow_remote || addr.ip().is_loopback() {
        return None;
    }
    Some(format!(
        "metrics on {addr} can be reached from other hosts and have no authentication \
         (they name subsystems, hosts and namespaces); bind them to 127.0.0.1 or set \
         metrics.allow_remote: true to say this is meant"
    ))
}

/// Raise the soft RLIMIT_NOFILE to the hard limit (systemd's default soft limit is 1024)
/// and warn when even that is short of `max_connections`. Returns the soft limit now.
pub fn raise_nofile(max_connections: u32) -> Option<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    let soft = if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!("cannot raise RLIMIT_NOFILE from {soft} to {hard}: {e}");
                soft
            }
        }
    } else {
        soft
    };
    let needed = u64::from(max_connections) + DESCRIPTOR_RESERVE;
    if soft < needed {
        tracing::warn!(
            "RLIMIT_NOFILE is {soft}: fewer than limits.max_connections ({max_connections}) \
             + {DESCRIPTOR_RESERVE}; accept will run out of descriptors first (and back off); \
             raise LimitNOFILE= in the service or lower limits.max_connections"
        );
    }
    Some(soft)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_or_world_writable_config_is_reported() {
        assert!(!writable_by_others(0o100644));
        assert!(!writable_by_others(0o100600));
        assert!(writable_by_others(0o100664));
        assert!(writable_by_others(0o100666));
        assert!(writable_by_others(0o100646));
    }

    #[test]
    fn config_file_mode_is_read_from_disk() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("nvmft-perm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("c.yaml");
        std::fs::write(&f, "io_threads: 1\n").expect("write");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert_eq!(config_permissions(&f), None);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let w = config_permissions(&f).expect("a warning");
        assert!(w.contains("writable by others (mode 666)"), "{w}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_subsystem_no_host_may_connect_to_is_a_warning() {
        let yaml = |access: &str| {
            format!(
                "listeners:
  - {{name: l, transport: tcp, address: 127.0.0.1, port: 4420}}
subsystems:
  - nqn: nqn.2026-11.dev.example:parked
{access}  - nqn: nqn.2026-11.dev.example:open
    allow_any_host: true
"
            )
        };
        let warnings = |access: &str| {
            let cfg = Config::parse(&yaml(access), "t.yaml").unwrap_or_else(|e| panic!("{e}"));
            config_warnings(&cfg)
        };
        assert_eq!(
            warnings(""),
            [
                "subsystem nqn.2026-11.dev.example:parked: no host may connect (allow_any_host \
              is false and hosts lists none); add its hosts, or set allow_any_host: true"
            ]
        );
        assert_eq!(
            warnings("    allow_any_host: false\n"),
            warnings(""),
            "the default is false"
        );
        assert!(warnings("    hosts: [nqn.2026-11.dev.example:h1]\n").is_empty());
        assert!(warnings("    allow_any_host: true\n").is_empty());
        assert_eq!(
            warnings("    allow_any_host: true\n    hosts: [nqn.2026-11.dev.example:h1]\n"),
            [
                "subsystem nqn.2026-11.dev.example:parked: allow_any_host is true, so any \
                 host may connect and its hosts list (1 host) restricts nothing; set \
                 allow_any_host: false to allow only those"
            ]
        );
    }

    #[test]
    fn more_io_threads_than_cpus_is_a_warning() {
        let cfg = |n: usize| {
            let y = format!(
                "io_threads: {n}\nlisteners: [{{name: l, transport: tcp, address: 127.0.0.1, port: 4420}}]\n"
            );
            Config::parse(&y, "t.yaml").unwrap_or_else(|e| panic!("{e}"))
        };
        assert!(warnings_for(&cfg(2), 2, None).is_empty());
        assert_eq!(
            warnings_for(&cfg(64), 2, None),
            [
                "io_threads: 64 IO threads on 2 CPUs this process may use: each thread polls, \
              so the ones past the CPUs add wake-ups and CPU time, not I/O"
            ]
        );
        assert!(
            warnings_for(&cfg(64), 0, None).is_empty(),
            "CPUs unknown: no guess"
        );
    }

    /// One RAM backend past memory and swap is named (it will be refused); several that
    /// fit one by one but not together get one warning with their sum; file backends and
    /// a single RAM backend that fits get none.
    #[test]
    fn ram_backends_past_the_machines_memory_are_a_warning() {
        let cfg = |backends: &str| {
            let y = format!(
                "listeners: [{{name: l, transport: tcp, address: 127.0.0.1, port: 4420}}]\n\
                 backends:\n{backends}"
            );
            Config::parse(&y, "t.yaml").unwrap_or_else(|e| panic!("{e}"))
        };
        let gib = 1u64 << 30;
        let three = cfg("  - {name: r0, type: ram, size: 8GiB}\n  \
                         - {name: r1, type: ram, size: 8GiB}\n  \
                         - {name: f0, type: file, path: /tmp/x.img, size: 1GiB}\n  \
                         - {name: r2, type: ram, size: 8GiB}\n");
        assert!(warnings_for(&three, 2, Some(24 * gib)).is_empty());
        assert_eq!(
            warnings_for(&three, 2, Some(20 * gib)),
            [
                "RAM backends r0, r1, r2 take 24.0 GiB together, more than this machine's \
              memory and swap (20.0 GiB): a RAM namespace takes memory as hosts write it, so \
              hosts that fill them all would bring the out-of-memory killer; make them \
              smaller or use file backends"
            ]
        );
        assert_eq!(
            warnings_for(&three, 2, Some(4 * gib)),
            ["r0", "r1", "r2"].map(|n| format!(
                "backend {n}: 8.0 GiB of RAM is more than this machine's memory and swap \
                 together (4.0 GiB); it is refused when it opens"
            )),
            "each one too big is named; the sum is then not repeated"
        );
        let one = cfg("  - {name: r0, type: ram, size: 8GiB}\n");
        assert!(warnings_for(&one, 2, Some(8 * gib)).is_empty());
        assert_eq!(warnings_for(&one, 2, Some(7 * gib)).len(), 1);
        assert!(
            warnings_for(&three, 2, None).is_empty(),
            "memory unknown: no guess"
        );
    }

    #[test]
    fn metrics_off_loopback_warn_unless_allowed() {
        let a = |s: &str| s.parse::<SocketAddr>().expect("addr");
        assert_eq!(metrics_exposure(a("127.0.0.1:9100"), false), None);
        assert_eq!(metrics_exposure(a("[::1]:9100"), false), None);
        assert!(metrics_exposure(a("0.0.0.0:9100"), false).is_some());
        assert!(metrics_exposure(a("192.0.2.1:9100"), false).is_some());
        assert_eq!(metrics_exposure(a("0.0.0.0:9100"), true), None);
    }
}
