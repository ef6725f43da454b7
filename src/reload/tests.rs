//! Tests of `reload`.

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
fn limits_need_a_restart() {
    let d = from_base(&edit(
        "metrics:\n",
        "limits: {max_connections_per_peer: 16}\nmetrics:\n",
    ));
    assert_only_restart(&d, &["limits: changed"]);
    let d = from_base(&edit(
        "  address: 127.0.0.1:9100\n",
        "  address: 127.0.0.1:9100\n  allow_remote: true\n",
    ));
    assert_only_restart(&d, &["metrics.allow_remote: false -> true"]);
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
    // Subsystem a serves on tcp1: it follows tcp1 to its new port, live.
    assert!(d.restart_required.is_empty(), "{d:#?}");
    assert_eq!(
        d.subsystem_listeners_changed,
        [(
            A.to_string(),
            Some(vec!["tcp0".to_string(), "tcp1".to_string()]),
            "tcp1 (tcp 127.0.0.1:4421 -> tcp 127.0.0.1:4430)".to_string()
        )]
    );
    assert!(d.backends_added.is_empty() && d.namespaces_added.is_empty());
    assert!(d.subsystems_added.is_empty() && d.hosts_changed.is_empty());
}

#[test]
fn subsystem_listeners_change_live() {
    let d = from_base(&edit("listeners: [tcp0]\n", "listeners: [tcp1]\n"));
    assert_eq!(
        d,
        ConfigDiff {
            subsystem_listeners_changed: vec![(
                B.to_string(),
                Some(vec!["tcp1".to_string()]),
                "-tcp0, +tcp1".to_string()
            )],
            ..ConfigDiff::default()
        }
    );
    assert_eq!(
        d.summary(),
        [format!("subsystem {B}: listeners -tcp0, +tcp1")]
    );

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
    // Naming listeners where none were named, and the reverse, change live too.
    let d = diff(&parse(&implicit), &parse(BASE));
    assert!(d.restart_required.is_empty(), "{d:#?}");
    assert_eq!(
        d.subsystem_listeners_changed,
        [(
            B.to_string(),
            Some(vec!["tcp0".to_string()]),
            "all -> [tcp0]".to_string()
        )]
    );
    let d = diff(&parse(BASE), &parse(&implicit));
    assert_eq!(
        d.subsystem_listeners_changed,
        [(B.to_string(), None, "[tcp0] -> all".to_string())]
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

/// A RAM backend in use made larger grows in place (its namespace keeps its data and
/// hosts); made smaller, or given another block size, it waits for a restart, and the
/// line says why a smaller one cannot be applied.
#[test]
fn backend_redefined_while_in_use_needs_a_restart_unless_it_grows() {
    let grown = edit(
        "  - {name: ram2, type: ram, size: 64MiB}",
        "  - {name: ram2, type: ram, size: 128MiB}",
    );
    let d = from_base(&grown);
    assert_eq!(
        d,
        ConfigDiff {
            backends_resized: vec![grown
                .backends
                .iter()
                .find(|b| b.name == "ram2")
                .unwrap()
                .clone()],
            ..ConfigDiff::default()
        }
    );
    assert_eq!(
        d.summary(),
        [
            "backend ram2: grow in place to ram, 134217728 bytes, 512-byte blocks (its \
          namespaces keep their data; hosts see the new size)"
        ]
    );
    // With an engine that cannot follow a resize, the same change waits for a restart.
    let mut d2 = d.clone();
    d2.resizes_need_a_restart("no resize here");
    assert_only_restart(
        &d2,
        &["backend ram2: ram, 134217728 bytes, 512-byte blocks (no resize here)"],
    );
    // A resize the backend cannot reach live (past its reserve) waits alone; one it can
    // stays a resize.
    let mut d3 = d.clone();
    d3.resizes_need_a_restart_where(|b| (b.name == "ram9").then(|| "never".into()));
    assert_eq!(d3, d, "a resize nobody objects to stays");
    d3.resizes_need_a_restart_where(|b| (b.name == "ram2").then(|| "past the reserve".into()));
    assert_only_restart(
        &d3,
        &["backend ram2: ram, 134217728 bytes, 512-byte blocks (past the reserve)"],
    );
    // What runs afterwards is the new size: nothing left to do.
    let run = running_after(&parse(BASE), &grown, &d);
    assert!(diff(&run, &grown).is_empty());

    let d = from_base(&edit(
        "  - {name: ram2, type: ram, size: 64MiB}",
        "  - {name: ram2, type: ram, size: 32MiB}",
    ));
    assert_only_restart(
        &d,
        &[&format!(
            "backend ram2 (used by subsystem {B} namespace 1): \
                 ram, 67108864 bytes, 512-byte blocks -> ram, 33554432 bytes, 512-byte blocks \
                 (a namespace cannot shrink while hosts use it)"
        )],
    );
    let d = from_base(&edit(
        "  - {name: ram2, type: ram, size: 64MiB}",
        "  - {name: ram2, type: ram, size: 128MiB, block_size: 4096}",
    ));
    assert_only_restart(
        &d,
        &[&format!(
            "backend ram2 (used by subsystem {B} namespace 1): \
                 ram, 67108864 bytes, 512-byte blocks -> ram, 134217728 bytes, 4096-byte blocks"
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
            namespaces_same_identity: vec![(A.into(), 2)],
            ..ConfigDiff::default()
        }
    );
    assert_eq!(ns(&new, A, 2).backend, "spare");
    // Its identity is derived from the NQN and nsid: hosts keep it as the same namespace,
    // and the summary says so.
    let summary = d.summary();
    assert!(
        summary[2].starts_with(&format!(
            "subsystem {A} namespace 2: note: same identity on another backend"
        )),
        "{summary:?}"
    );
    // With a new uuid it is a new namespace to hosts: nothing to note.
    let renamed = edit(
        "{nsid: 2, backend: ram1}",
        "{nsid: 2, backend: spare, uuid: 0e9c1b7a-3d4f-4a5b-8c6d-7e8f9a0b1c2d}",
    );
    assert!(from_base(&renamed).namespaces_same_identity.is_empty());

    // Two namespaces trading backends: both removed, then both added.
    let swapped = parse(
        &BASE
            .replace("{nsid: 1, backend: ram0}", "{nsid: 1, backend: ram1}")
            .replace("{nsid: 2, backend: ram1}", "{nsid: 2, backend: ram0}"),
    );
    let d = from_base(&swapped);
    assert_eq!(d.namespaces_removed, [(A.into(), 1), (A.into(), 2)]);
    assert_eq!(d.namespaces_same_identity, [(A.into(), 1), (A.into(), 2)]);
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
            format!("subsystem {A}: listeners -tcp1"),
            "restart required: io threads: 2 unpinned -> 3 unpinned".to_string(),
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

    // A file's size is a minimum (the file is extended, never cut): any new value is
    // applied in place by growing, or by nothing.
    for (size, bytes) in [("2MiB", 2097152), ("512KiB", 524288)] {
        std::fs::write(&path, yaml(size)).unwrap();
        let new = Config::load(&path).unwrap();
        let d = diff(&running, &new);
        assert_eq!(
            d,
            ConfigDiff {
                backends_resized: vec![new.backends[0].clone()],
                ..ConfigDiff::default()
            },
            "{size}"
        );
        assert_eq!(
            d.summary(),
            [format!(
                "backend f: size {bytes} in place (a smaller file is extended to it, a larger \
                 one keeps its size; hosts see any new size)"
            )]
        );
    }
    // Another block size is not a resize.
    std::fs::write(&path, yaml("1MiB, block_size: 4096")).unwrap();
    let d = diff(&running, &Config::load(&path).unwrap());
    let img = dir.path().join("disk.img");
    assert_only_restart(
        &d,
        &[&format!(
            "backend f (used by subsystem {A} namespace 1): file {0}, size 1048576 -> \
                 file {0}, size 1048576, 4096-byte blocks",
            img.display()
        )],
    );
}

/// A namespace's host list and its ANA group change live (no remove + add).
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
    assert!(d.namespaces_removed.is_empty() && d.namespaces_added.is_empty());
    assert_eq!(d.namespace_ana_group_changed, vec![(A.to_string(), 2, 3)]);
    assert_eq!(
        d.summary(),
        vec![format!("subsystem {A} namespace 2: ANA group 3")]
    );
    // With another change as well it is removed + added, in its new group.
    let new = edit(
        "      - {nsid: 2, backend: ram1}",
        "      - {nsid: 2, backend: ram1, ana_group: 3, uuid: 11111111-2222-3333-4444-555555555555}",
    );
    let d = from_base(&new);
    assert_eq!(d.namespaces_removed, vec![(A.to_string(), 2)]);
    assert!(d.namespace_ana_group_changed.is_empty());
    let new = edit(
        "    listeners: [tcp0, tcp1]\n",
        "    listeners: [tcp0, tcp1]\n    ana_groups: [{id: 1, states: {tcp0: inaccessible}}]\n",
    );
    let d = from_base(&new);
    assert_eq!(d.ana_groups_changed.len(), 1);
    assert_eq!(d.ana_groups_changed[0].1[0].states[0].0, "tcp0");
    assert!(d.restart_required.is_empty());
    // And back: the summary says the groups went, not an empty list.
    assert_eq!(
        diff(&new, &parse(BASE)).summary(),
        [format!(
            "subsystem {A}: ANA groups removed (every namespace optimized on every listener)"
        )]
    );
    let new = edit(
        "metrics:\n",
        "referrals: [{transport: tcp, address: 192.0.2.1, port: 8009}]\nreservations: {state_file: /tmp/x}\nmetrics:\n",
    );
    let d = from_base(&new);
    assert_eq!(d.referrals_changed.as_ref().map(Vec::len), Some(1));
    assert_eq!(d.restart_required.len(), 1);
    assert!(d.restart_required[0].starts_with("reservations:"));
}

/// Every restart-only setting changed at once, with live changes beside them.
const EVERYTHING_CHANGED: &str = "\
io_threads: 3
max_io_size: 262144
limits: {max_connections: 77}
listeners:
  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: 4420}
  - {name: tcp1, transport: tcp, address: 127.0.0.1, port: 4421}
  - {name: tcp2, transport: tcp, address: 127.0.0.1, port: 4422}
backends:
  - {name: ram0, type: ram, size: 32MiB}
  - {name: ram1, type: ram, size: 64MiB}
  - {name: ram2, type: ram, size: 64MiB}
  - {name: ram3, type: ram, size: 64MiB}
subsystems:
  - nqn: nqn.2026-11.dev.test:a
    serial: CHANGED01
    model: another
    listeners: [tcp0]
    hosts: [nqn.2026-11.dev.test:h1]
    namespaces:
      - {nsid: 1, backend: ram0}
      - {nsid: 2, backend: ram1}
      - {nsid: 3, backend: ram3}
  - nqn: nqn.2026-11.dev.test:b
    allow_any_host: true
    listeners: [tcp0]
    namespaces:
      - {nsid: 1, backend: ram2}
metrics:
  address: 127.0.0.1:9101
  allow_remote: true
";

#[test]
fn what_runs_after_a_reload_keeps_restart_only_settings_pending() {
    let old = parse(BASE);
    let new = parse(EVERYTHING_CHANGED);
    let d = diff(&old, &new);
    // ram0 shrinks while namespace 1 uses it: a restart item too.
    assert!(d.restart_required.len() >= 8, "{:?}", d.restart_required);
    assert!(!d.listeners_added.is_empty() && !d.namespaces_added.is_empty());

    let run = running_after(&old, &new, &d);
    // From what ran before, only the live changes are left to do...
    let done = diff(&old, &run);
    assert!(done.restart_required.is_empty(), "{done:?}");
    assert_eq!(
        done,
        ConfigDiff {
            restart_required: Vec::new(),
            ..d.clone()
        }
    );
    // ...and from what runs now to the file, only what waits for a restart, the same
    // lines as the reload printed (so the next diff still shows them, the right way
    // round).
    let pending = diff(&run, &new);
    assert_eq!(
        pending,
        ConfigDiff {
            restart_required: d.restart_required.clone(),
            ..ConfigDiff::default()
        }
    );
    // Putting the old values back in the file is then no change at all.
    assert!(diff(&run, &old).restart_required.is_empty());
    // A reload that changes nothing keeps what runs.
    assert_eq!(running_after(&old, &old, &diff(&old, &old)), old);
}

#[test]
fn what_a_reload_could_not_apply_stays_to_do() {
    let old = parse(BASE);
    let new = edit(
        "  - {name: spare, type: ram, size: 1MiB}\n",
        "  - {name: spare, type: ram, size: 1MiB}\n  - {name: new0, type: ram, size: 1MiB}\n  - {name: new1, type: ram, size: 1MiB}\n",
    );
    let new = Config {
        listeners: {
            let mut l = new.listeners.clone();
            let mut extra = l[0].clone();
            extra.name = "tcp9".into();
            extra.port = 4429;
            l.push(extra);
            l
        },
        subsystems: {
            let mut s = new.subsystems.clone();
            let a = s.iter_mut().find(|s| s.nqn == A).unwrap();
            let mut n3 = a.namespaces[0].clone();
            n3.nsid = 3;
            n3.backend = "new0".into();
            let mut n4 = n3.clone();
            n4.nsid = 4;
            n4.backend = "new1".into();
            a.namespaces.push(n3);
            a.namespaces.push(n4);
            a.namespaces[1].hosts = Some(vec!["nqn.2026-11.dev.test:h1".into()]);
            s
        },
        ..new
    };
    let d = diff(&old, &new);
    assert_eq!(d.listeners_added.len(), 1);
    assert_eq!(d.namespaces_added.len(), 2);
    assert_eq!(d.namespace_hosts_changed.len(), 1);

    // The listener did not open, backend new0 did not open (so its namespace 3 could
    // not be added) and namespace 2's new host list was refused.
    let undone = Undone {
        listeners: ["tcp9".to_string()].into(),
        backends: ["new0".to_string()].into(),
        namespaces: [(A.to_string(), 3)].into(),
        namespace_hosts: [(A.to_string(), 2)].into(),
        ..Undone::default()
    };
    let run = undone.remove_from(running_after(&old, &new, &d), &old);
    // What runs has the rest: backend new1 and namespace 4...
    assert!(run.backends.iter().any(|b| b.name == "new1"));
    assert_eq!(ns(&run, A, 4), ns(&new, A, 4));
    // ...and the next diff of the same file does exactly what failed, nothing else.
    let retry = diff(&run, &new);
    assert_eq!(
        retry
            .listeners_added
            .iter()
            .map(|l| &l.name)
            .collect::<Vec<_>>(),
        ["tcp9"]
    );
    assert_eq!(
        retry
            .backends_added
            .iter()
            .map(|b| &b.name)
            .collect::<Vec<_>>(),
        ["new0"]
    );
    assert_eq!(
        retry
            .namespaces_added
            .iter()
            .map(|(nqn, ns)| (nqn.as_str(), ns.nsid))
            .collect::<Vec<_>>(),
        [(A, 3)]
    );
    assert_eq!(
        retry.namespace_hosts_changed,
        [(
            A.to_string(),
            2,
            Some(vec!["nqn.2026-11.dev.test:h1".to_string()])
        )]
    );
    assert!(retry.namespaces_removed.is_empty() && retry.backends_removed.is_empty());
    assert!(retry.listeners_removed.is_empty() && retry.restart_required.is_empty());

    // A subsystem that could not be added is left out with its namespaces.
    let added = edit(
        "  - nqn: nqn.2026-11.dev.test:b\n",
        "  - nqn: nqn.2026-11.dev.test:c\n    allow_any_host: true\n    namespaces:\n      - {nsid: 1, backend: spare}\n  - nqn: nqn.2026-11.dev.test:b\n",
    );
    let undone = Undone {
        subsystems: ["nqn.2026-11.dev.test:c".to_string()].into(),
        ..Undone::default()
    };
    let run = undone.remove_from(running_after(&old, &added, &diff(&old, &added)), &old);
    assert_eq!(run, old);
    let retry = diff(&run, &added);
    assert_eq!(retry.subsystems_added.len(), 1);
    assert_eq!(retry.namespaces_added.len(), 1);
}
