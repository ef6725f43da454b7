//! Unit tests of the config module; `tests/config.rs` covers each error through the
//! binary's `--check-config`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use super::validate::check_nqn;
use super::*;

fn errors(yaml: &str) -> Vec<String> {
    match Config::parse(yaml, "t.yaml") {
        Ok(cfg) => panic!("expected errors, got {cfg:#?}"),
        Err(err) => err.diagnostics().iter().map(ToString::to_string).collect(),
    }
}

const MINIMAL: &str = "\
listeners:
  - {name: l, transport: tcp, address: '::', port: 4420}
backends:
  - {name: b, type: ram, size: 4M}
subsystems:
  - nqn: nqn.2026-11.dev.example:s
    namespaces:
      - {nsid: 7, backend: b}
";

#[test]
fn embedded_default() {
    let cfg = Config::embedded_default();
    assert_eq!(cfg.source, "<embedded default>");
    assert_eq!(cfg.threads, IoThreads::Count(1));
    assert_eq!(
        cfg.listeners,
        vec![ListenerConfig {
            name: "tcp0".into(),
            transport: TransportKind::Tcp,
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 4420,
            tls: TlsMode::None,
        }]
    );
    assert_eq!(
        cfg.backends,
        vec![BackendConfig {
            name: "ram0".into(),
            kind: BackendKind::Ram {
                size: 1 << 30,
                block_size: 512
            },
        }]
    );
    let [s] = cfg.subsystems.as_slice() else {
        panic!("one subsystem expected: {:?}", cfg.subsystems)
    };
    assert_eq!(s.nqn, "nqn.2026-11.dev.nvmf-target:default");
    assert!(s.allow_any_host);
    assert!(s.hosts.is_empty());
    assert_eq!(s.listeners, ["tcp0"]);
    assert_eq!(s.model, DEFAULT_MODEL);
    assert_eq!(s.serial, derive_serial(&s.nqn));
    assert_eq!(s.namespaces.len(), 1);
    assert_eq!(s.namespaces[0].nsid, 1);
    assert_eq!(s.namespaces[0].backend, "ram0");
    assert_eq!(cfg.metrics, None);
}

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/etc/example.yaml");

/// `etc/example.yaml` with its state directory (`/var/lib/nvmf-target`, which the systemd
/// unit creates and a build machine usually lacks) moved to `state`.
fn example_in(state: &Path) -> Config {
    let text = std::fs::read_to_string(EXAMPLE)
        .unwrap()
        .replace("/var/lib/nvmf-target", &state.display().to_string());
    Config::parse_as_file(&text, Path::new(EXAMPLE)).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn example_parses() {
    let state = tempfile::tempdir().unwrap();
    let cfg = example_in(state.path());
    assert_eq!(cfg.source, EXAMPLE);
    assert_eq!(cfg.threads, IoThreads::Count(2));
    assert_eq!(cfg.listeners.len(), 2);
    assert_eq!(cfg.listeners[1].address, "::1".parse::<IpAddr>().unwrap());
    assert_eq!(
        cfg.backends[1].kind,
        BackendKind::File {
            path: state.path().join("disk0.img"),
            size: Some(10 << 30),
            block_size: Some(4096),
            direct: Some(true),
        }
    );
    let disk = &cfg.subsystems[0];
    assert_eq!(disk.serial, "NVMFT0001");
    assert!(!disk.allow_any_host);
    assert_eq!(disk.hosts.len(), 2);
    let ns = &disk.namespaces[0];
    assert_eq!(
        uuid::Uuid::from_bytes(ns.uuid).to_string(),
        "5f1c6b2e-8d3a-4e6f-9b7c-2a1d0e4f3c5b"
    );
    assert_eq!(ns.nguid, ns.uuid);
    assert_eq!(ns.eui64, [0x02, 0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6, 0x07]);
    // The second subsystem does not name listeners: it gets all of them.
    assert_eq!(cfg.subsystems[1].listeners, ["tcp0", "tcp6"]);
    assert_eq!(cfg.metrics, Some(SocketAddr::from(([127, 0, 0, 1], 9100))));
    assert_eq!(cfg.namespace_count(), 2);
    // Outside the systemd unit, which creates it, the state directory is missing and the
    // error names it. A directory that does not exist on any machine stands in for
    // /var/lib/nvmf-target, so the check runs where that one exists too.
    let missing = state.path().join("not-created");
    let file = state.path().join("example.yaml");
    let text = std::fs::read_to_string(EXAMPLE)
        .unwrap()
        .replace("/var/lib/nvmf-target", &missing.display().to_string());
    std::fs::write(&file, text).unwrap();
    let err = Config::load(&file).expect_err("the state directory was never created");
    assert!(
        err.to_string().contains(&format!(
            "backends[1].path: directory {} does not exist",
            missing.display()
        )),
        "{err}"
    );
}

#[test]
fn derived_ids_are_stable() {
    let a = Config::parse(MINIMAL, "a.yaml").unwrap();
    let b = Config::parse(MINIMAL, "b.yaml").unwrap();
    let (na, nb) = (
        &a.subsystems[0].namespaces[0],
        &b.subsystems[0].namespaces[0],
    );
    assert_eq!(na.uuid, nb.uuid);
    assert_eq!(na.eui64, nb.eui64);
    assert_eq!(
        na.uuid,
        derive_namespace_uuid("nqn.2026-11.dev.example:s", 7)
    );
    assert_eq!(na.nguid, na.uuid);
    let u = uuid::Uuid::from_bytes(na.uuid);
    assert_eq!(u.get_version_num(), 5);
    // Pinned: changing the derivation would change every deployed namespace's UUID.
    assert_eq!(
        u,
        uuid::Uuid::new_v5(
            &uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_DNS, b"nvmf-target.dev"),
            b"nqn.2026-11.dev.example:s/ns/7"
        )
    );
    assert_eq!(na.eui64[0] & 0x03, 0x02, "locally administered, unicast");

    let other_nsid = Config::parse(&MINIMAL.replace("nsid: 7", "nsid: 8"), "c.yaml").unwrap();
    let nc = &other_nsid.subsystems[0].namespaces[0];
    assert_ne!(nc.uuid, na.uuid);
    assert_ne!(nc.eui64, na.eui64);
    let other_nqn = Config::parse(&MINIMAL.replace(":s\n", ":t\n"), "d.yaml").unwrap();
    assert_ne!(other_nqn.subsystems[0].namespaces[0].uuid, na.uuid);

    let serial = derive_serial("nqn.2026-11.dev.example:s");
    assert_eq!(serial.len(), 20);
    assert!(serial.starts_with("NVMFT"));
    assert_eq!(a.subsystems[0].serial, serial);
    assert_ne!(derive_serial("nqn.2026-11.dev.example:t"), serial);
}

#[test]
fn defaults() {
    let cfg = Config::parse(MINIMAL, "m.yaml").unwrap();
    assert_eq!(cfg.threads, IoThreads::Count(1));
    assert_eq!(cfg.threads.count(), 1);
    assert_eq!(
        cfg.backends[0].kind,
        BackendKind::Ram {
            size: 4 << 20,
            block_size: 512
        }
    );
    assert!(!cfg.subsystems[0].allow_any_host);
    assert_eq!(cfg.subsystems[0].model, "nvmf-target");
}

#[test]
fn cpus() {
    let cfg = Config::parse(&format!("cpus: [0]\n{MINIMAL}"), "c.yaml").unwrap();
    assert_eq!(cfg.threads, IoThreads::Cpus(vec![0]));
    assert_eq!(cfg.threads.count(), 1);
    let errs = errors(&format!("cpus: [100000]\n{MINIMAL}"));
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0].starts_with("t.yaml:1:8: cpus[0]: CPU 100000 is not available to this process"),
        "{errs:?}"
    );
    assert_eq!(
        errors(&format!("cpus: []\n{MINIMAL}")),
        ["t.yaml:1:7: cpus: must list at least one CPU"]
    );
}

#[test]
fn relative_file_path_is_relative_to_config_dir() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("disk.img"), vec![0u8; 4096]).unwrap();
    let yaml = MINIMAL.replace(
        "{name: b, type: ram, size: 4M}",
        "{name: b, type: file, path: disk.img}",
    );
    let config_path = dir.path().join("nvmf.yaml");
    std::fs::write(&config_path, yaml).unwrap();
    let cfg = Config::load(&config_path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        cfg.backends[0].kind,
        BackendKind::File {
            path: dir.path().join("disk.img"),
            size: None,
            block_size: None,
            direct: None,
        }
    );
}

#[test]
fn existing_file_checks() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    let yaml = MINIMAL.replace(
        "{name: b, type: ram, size: 4M}",
        &format!("{{name: b, type: file, path: {}}}", empty.display()),
    );
    assert_eq!(
        errors(&yaml),
        [format!(
            "t.yaml:4:33: backends[0].path: {} is empty; set size to extend it",
            empty.display()
        )]
    );
    std::fs::write(&empty, vec![0u8; 8192]).unwrap();
    let yaml = yaml.replace(
        &format!("{}}}", empty.display()),
        &format!("{}, size: 4096}}", empty.display()),
    );
    // A file larger than `size` keeps its size (grown on disk since, say): no error.
    let cfg = Config::parse(&yaml, "t.yaml").expect("a file larger than its size is fine");
    assert_eq!(cfg.backends.len(), 1);
}

#[test]
fn file_to_create_needs_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nodir");
    let yaml = MINIMAL.replace(
        "{name: b, type: ram, size: 4M}",
        &format!(
            "{{name: b, type: file, path: {}, size: 1M}}",
            missing.join("x.img").display()
        ),
    );
    let expected = format!(
        "t.yaml:4:33: backends[0].path: directory {} does not exist (create it: the daemon \
         creates only the file)",
        missing.display()
    );
    assert_eq!(errors(&yaml), std::slice::from_ref(&expected));
    // Without size, setting size would not help either: the directory is named first.
    let yaml = yaml.replace(", size: 1M}", "}");
    assert_eq!(errors(&yaml), [expected]);
    std::fs::create_dir(&missing).unwrap();
    Config::parse(&yaml.replace("x.img}", "x.img, size: 1M}"), "t.yaml")
        .unwrap_or_else(|e| panic!("{e}"));

    // A relative path's directory is looked for beside the config file.
    let yaml = MINIMAL.replace(
        "{name: b, type: ram, size: 4M}",
        "{name: b, type: file, path: sub/x.img, size: 1M}",
    );
    let config_path = dir.path().join("nvmf.yaml");
    std::fs::write(&config_path, &yaml).unwrap();
    let err = Config::load(&config_path).expect_err("no sub/ beside the config");
    let shown = dir.path().join("sub").display().to_string();
    assert!(
        err.to_string()
            .contains(&format!("directory {shown} does not exist")),
        "{err}"
    );
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    Config::load(&config_path).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn existing_file_smaller_than_one_block() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = dir.path().join("tiny.img");
    std::fs::write(&tiny, vec![0u8; 100]).unwrap();
    let yaml = MINIMAL.replace(
        "{name: b, type: ram, size: 4M}",
        &format!("{{name: b, type: file, path: {}}}", tiny.display()),
    );
    assert_eq!(
        errors(&yaml),
        [format!(
            "t.yaml:4:33: backends[0].path: {} is 100 bytes, less than one 512-byte block; \
             set size to extend it",
            tiny.display()
        )]
    );
    // The configured block size is the one that counts.
    std::fs::write(&tiny, vec![0u8; 1024]).unwrap();
    Config::parse(&yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
    let yaml = yaml.replace("tiny.img}", "tiny.img, block_size: 4096}");
    assert_eq!(
        errors(&yaml),
        [format!(
            "t.yaml:4:33: backends[0].path: {} is 1024 bytes, less than one 4096-byte block; \
             set size to extend it",
            tiny.display()
        )]
    );
}

#[test]
fn ram_backend_rejects_file_fields() {
    let yaml = MINIMAL.replace("size: 4M}", "size: 4M, path: /x, direct: true}");
    assert_eq!(
        errors(&yaml),
        [
            "t.yaml:4:42: backends[0].path: only valid for file backends",
            "t.yaml:4:54: backends[0].direct: only valid for file backends",
        ]
    );
}

#[test]
fn explicit_empty_listener_list() {
    let yaml = MINIMAL.replace("    namespaces:", "    listeners: []\n    namespaces:");
    assert_eq!(
        errors(&yaml),
        ["t.yaml:7:16: subsystems[0].listeners: names no listener; omit the field to use all listeners"]
    );
}

#[test]
fn rdma_listener_is_accepted() {
    let cfg = Config::parse(
        &MINIMAL.replace("transport: tcp", "transport: rdma"),
        "r.yaml",
    )
    .unwrap();
    assert_eq!(cfg.listeners[0].transport, TransportKind::Rdma);
}

/// Every misspelt field is listed in one go, block or flow style, each with the field
/// it most likely meant, and with the file's other problems; the locations are those of
/// the file as written.
#[test]
fn every_unknown_field_is_listed() {
    let yaml = "\
io_thread: 2
listeners:
  - {name: l, transport: tcp, address: '::', port: 4420, tsl: none}
backends:
  - {sise: 4M, name: b, type: ram}
  - name: c
    type: ram
    size: 4M
    blok_size: 4096
    extra: {a: [1, 2]}
subsystems:
  - nqn: nqn.2026-01.io.test:a
    allow_any_hosts: true
    namespaces:
      - {nsid: 1, backend: b}
      - {nsid: 1, backend: c}
";
    let errs = errors(yaml);
    let want = [
        "t.yaml:1:1: io_thread: unknown field `io_thread` (did you mean `io_threads`?",
        "t.yaml:3:58: listeners[0].tsl: unknown field `tsl` (did you mean `tls`?",
        "t.yaml:5:6: backends[0].sise: unknown field `sise` (did you mean `size`?",
        "t.yaml:9:5: backends[1].blok_size: unknown field `blok_size` (did you mean `block_size`?",
        "t.yaml:10:5: backends[1].extra: unknown field `extra` (expected one of:",
        "t.yaml:13:5: subsystems[0].allow_any_hosts: unknown field `allow_any_hosts` (did you \
         mean `allow_any_host`?",
    ];
    for w in want {
        assert!(
            errs.iter().any(|e| e.starts_with(w)),
            "{w:?} not in {errs:#?}"
        );
    }
    assert!(
        errs.iter().any(|e| e.contains("nsid") && e.contains("16:")),
        "the duplicate NSID found past the typos: {errs:#?}"
    );
    // `sise` was read as the `size` it most likely meant: no "size is missing" after it.
    assert!(
        !errs.iter().any(|e| e.contains("required")),
        "no error follows from a typo read as meant: {errs:#?}"
    );
}

/// Removing a misspelt last field of a block list item leaves the next item whole.
#[test]
fn an_unknown_last_field_of_an_item_leaves_the_next_item() {
    let errs = errors(&MINIMAL.replace(
        "  - {name: b, type: ram, size: 4M}\n",
        "  - name: b\n    type: ram\n    size: 4M\n    blok_size: 4096\n  - {name: c, type: ram, \
         size: 4M, colour: red}\n",
    ));
    for want in [
        "backends[0].blok_size: unknown field",
        "backends[1].colour: unknown field",
    ] {
        assert!(errs.iter().any(|e| e.contains(want)), "{want}: {errs:#?}");
    }
    assert!(!errs.iter().any(|e| e.contains("duplicate")), "{errs:#?}");
}

/// A file whose lines end in a lone CR (the parser counts those, the text is not split on
/// them): the error is listed once, not again and again.
#[test]
fn a_typo_in_a_cr_only_file_is_listed_once() {
    let errs = errors(&format!("{}io_thread: 2\r", MINIMAL.replace('\n', "\r")));
    assert_eq!(
        errs.iter().filter(|e| e.contains("io_thread")).count(),
        1,
        "{errs:#?}"
    );
}

/// Past 20 unknown fields the list says it stops there.
#[test]
fn a_long_list_of_typos_says_where_it_stops() {
    let typos: String = (0..25).map(|i| format!("typo{i}: 1\n")).collect();
    let errs = errors(&format!("{MINIMAL}{typos}"));
    assert_eq!(errs.len(), 21, "{errs:#?}");
    assert!(
        errs[20].contains("20 unknown fields listed; the rest of the file was not read"),
        "{errs:#?}"
    );
}

/// A missing required field ends the reading (serde cannot go on without it), after the
/// unknown fields before it.
#[test]
fn a_missing_field_ends_the_list() {
    let errs = errors(&format!(
        "io_thread: 2\n{}",
        MINIMAL.replace("name: b, type: ram", "type: ram")
    ));
    assert!(errs[0].contains("unknown field `io_thread`"), "{errs:#?}");
    assert!(
        errs[1].contains("backends[0].name: required field is missing"),
        "{errs:#?}"
    );
    assert_eq!(errs.len(), 2, "{errs:#?}");
}

#[test]
fn errors_are_sorted_and_all_reported() {
    let yaml = "\
io_threads: 300
listeners:
  - {name: l, transport: tcp, address: 1.2.3, port: 0}
backends:
  - {name: b, type: ram, size: 1000, block_size: 4096}
subsystems:
  - nqn: nqn.bad
    serial: \"\"
    namespaces:
      - {nsid: 1, backend: x}
      - {nsid: 1, backend: b, nguid: \"00000000000000000000000000000000\"}
";
    assert_eq!(
        errors(yaml),
        [
            "t.yaml:1:13: io_threads: must be 1..=256, got 300",
            "t.yaml:3:40: listeners[0].address: invalid IP address \"1.2.3\": expected an IPv4 or IPv6 literal",
            "t.yaml:3:53: listeners[0].port: port 0 is not allowed; use 1..=65535",
            "t.yaml:5:32: backends[0].size: 1000 bytes is not a multiple of the block size (4096)",
            "t.yaml:7:10: subsystems[0].nqn: invalid NQN \"nqn.bad\": expected a date yyyy-mm. after \"nqn.\" (nqn.yyyy-mm.reverse.domain:name)",
            "t.yaml:8:13: subsystems[0].serial: must not be empty",
            "t.yaml:10:28: subsystems[0].namespaces[0].backend: unknown backend \"x\" (known: b)",
            "t.yaml:11:16: subsystems[0].namespaces[1].nsid: duplicate nsid 1 (first: subsystems[0].namespaces[0] at line 10)",
            "t.yaml:11:38: subsystems[0].namespaces[1].nguid: must not be all zeros (that means \"not reported\")",
        ]
    );
}

/// New users' mistakes get plain words: a single value where a list belongs, and the
/// top-level `hosts:` shape inside a subsystem.
#[test]
fn shape_errors_say_what_was_expected() {
    let e = errors(
        "backends: [{name: b, type: ram, size: 1MiB}]\nsubsystems:\n  - nqn: nqn.2026-01.io.x:a\n    hosts: nqn.2026-01.io.x:h\n",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].contains("subsystems[0].hosts: expected a list"),
        "{e:?}"
    );
    let e = errors(
        "backends: [{name: b, type: ram, size: 1MiB}]\nsubsystems:\n  - nqn: nqn.2026-01.io.x:a\n    hosts: [{nqn: nqn.2026-01.io.x:h}]\n",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].contains("subsystems[0].hosts[0]: expected a single value")
            && e[0].contains("top-level hosts:"),
        "{e:?}"
    );
}

#[test]
fn syntax_errors_have_a_field() {
    assert_eq!(
        errors("listeners: 5\n"),
        ["t.yaml:1:12: listeners: expected a list (lines starting with `- `, or `[a, b]`)"]
    );
    assert_eq!(
        errors("- 1\n"),
        ["t.yaml:1:1: <root>: expected a mapping (`key: value` lines, or `{key: value}`)"]
    );
}

/// A flow mapping or list left open is reported at its bracket, not lines later where
/// the parser gave up; brackets in quotes, comments and plain text do not count.
#[test]
fn an_unclosed_bracket_is_reported_where_it_opens() {
    let e = errors(
        "backends:\n  - {name: b, type: ram, size: 1MiB\nsubsystems:\n  - nqn: nqn.2026-01.io.x:a\n",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("t.yaml:2:5: ")
            && e[0].contains("`{` is not closed (the parser stopped at line 4"),
        "{e:?}"
    );
    let e = errors(
        "# a comment with [ and {\nbackends: [{name: 'b{', type: ram, size: 1MiB}]\n\
         subsystems:\n  - nqn: nqn.2026-01.io.x:a\n    hosts: [nqn.2026-01.io.x:h\n  - nqn: x\n",
    );
    assert!(
        e[0].starts_with("t.yaml:5:12: ") && e[0].contains("`[` is not closed"),
        "{e:?}"
    );
    // No bracket is open in these; each has an error further on, which is reported where
    // the parser found it. (A line with text like `ñandú` before a comment
    // once made the finder slice inside a character and panic: a reload of such a file
    // stopped the daemon.)
    for (yaml, at) in [
        ("subsystems:\n  - nqn: nqn.2026-01.io.x:a\n    serial: x-{1\n  model: m\n   bad: 1\n", "t.yaml:4:3:"),
        ("subsystems:\n  - nqn: nqn.2026-01.io.x:a # ñandú [ü\n    model: ñandú # [the model\n  x: 1\n   bad: 1\n", "t.yaml:4:3:"),
        ("subsystems:\n  - nqn: \"nqn.2026-01.io.x:a\n\n    [x\"\n  x: 1\n   bad: 1\n", "t.yaml:4:5:"),
        ("subsystems:\n  - nqn: nqn.2026-01.io.x:a\n    model: |\n      {x\n      [y\n  x: 1\n   bad: 1\n", "t.yaml:6:3:"),
    ] {
        let e = errors(yaml);
        assert!(!e[0].contains("is not closed"), "{yaml}: {e:?}");
        assert!(e[0].starts_with(at), "{yaml}: {e:?}");
    }
}

#[test]
fn nqn_syntax() {
    for good in [
        "nqn.2014-08.org.nvmexpress:uuid:3f2504e0-4f89-11d3-9a0c-0305e82c3301",
        "nqn.2026-11.dev.nvmf-target:disk0",
        "nqn.1999-01.com.example:a:b:c",
    ] {
        assert_eq!(check_nqn(good), Ok(()), "{good}");
    }
    for bad in [
        "",
        "nqn.",
        "nqn.2026-11.",
        "nqn.2026-11.:x",
        "nqn.2026-00.com.example:x",
        "nqn.26-11.com.example:x",
        "nqn.2026-11.com.example:",
        "nqn.2026-11.-com.example:x",
        "nqn.2026-11.com..example:x",
        "nqn.2026-11.com.exämple:x",
        "nqn.2014-08.org.nvmexpress:uuid:3f2504e04f8911d39a0c0305e82c3301",
        "nqn.2014-08.org.nvmexpress.discovery",
    ] {
        assert!(check_nqn(bad).is_err(), "{bad:?} accepted");
    }
    let max = format!("nqn.2026-11.com.example:{}", "x".repeat(223 - 24));
    assert_eq!(max.len(), 223);
    assert_eq!(check_nqn(&max), Ok(()));
    assert!(check_nqn(&format!("{max}x")).is_err());
}

#[test]
fn error_display_is_one_line_per_problem() {
    let err = Config::parse("io_threads: 0\n", "x.yaml").unwrap_err();
    assert_eq!(
        err.to_string(),
        "x.yaml:1:1: listeners: at least one listener is required\n\
         x.yaml:1:13: io_threads: must be 1..=256, got 0"
    );
}

#[test]
fn truncated_and_odd_inputs_never_panic() {
    let example = include_str!("../../etc/example.yaml");
    let mut inputs: Vec<String> = (0..example.len())
        .filter(|&i| example.is_char_boundary(i))
        .map(|i| example[..i].to_owned())
        .collect();
    inputs.extend(
        [
            "",
            "~",
            "listeners:\n",
            "listeners: ~\n",
            "a: &x 1\nb: *x\n",
            "io_threads: 99999999999999999999999\n",
            "cpus: [18446744073709551615]\n",
            "\t",
            "listeners: [{name: a, transport: tcp, address: ::1, port: 1}]\nsubsystems: [{nqn: \"nqn.2026-11.é:x\"}]\n",
        ]
        .map(str::to_owned),
    );
    for input in &inputs {
        if let Err(err) = Config::parse(input, "t.yaml") {
            for diag in err.diagnostics() {
                assert!(diag.line >= 1 && diag.column >= 1, "{diag} for {input:?}");
                assert!(!diag.field.is_empty() && !diag.message.is_empty(), "{diag}");
                assert!(!diag.to_string().contains('\n'), "{diag}");
            }
        }
    }
}

#[test]
fn max_io_size_default_units_and_range() {
    assert_eq!(
        Config::parse(MINIMAL, "t.yaml").unwrap().max_io_size,
        DEFAULT_MAX_IO_SIZE
    );
    assert_eq!(DEFAULT_MAX_IO_SIZE, 1 << 20);
    for (text, bytes) in [
        ("4KiB", 4096u32),
        ("128KiB", 128 << 10),
        ("8MiB", 8 << 20),
        ("262144", 256 << 10),
    ] {
        let cfg = Config::parse(&format!("max_io_size: {text}\n{MINIMAL}"), "t.yaml")
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(cfg.max_io_size, bytes, "{text}");
    }
    for (text, why) in [
        ("3000", "power of two"),
        ("2KiB", "power of two from 4KiB"),
        ("16MiB", "to 8MiB"),
        ("0", "power of two"),
        ("1 parsec", "unit"),
    ] {
        let e = errors(&format!("max_io_size: {text}\n{MINIMAL}"));
        assert_eq!(e.len(), 1, "{text}: {e:?}");
        assert!(
            e[0].starts_with("t.yaml:1:") && e[0].contains("max_io_size"),
            "{text}: {}",
            e[0]
        );
        assert!(e[0].contains(why) || why == "unit", "{text}: {}", e[0]);
    }
    let state = tempfile::tempdir().unwrap();
    let example = example_in(state.path());
    assert_eq!(example.max_io_size, 1 << 20);
}

/// `hosts[]` with inline secrets, a secret file, algorithm lists, `require_auth` and a
/// TLS listener; keys made by the nvmf crate's own printers (the parser is tested
/// against independent vectors there).
#[test]
fn host_credentials() {
    use nvmf::auth::{key::DhchapKey, tls::ConfiguredPsk, DhGroup, HashId};
    let host_key = DhchapKey::from_bytes(Some(HashId::Sha256), &[1; 32]).unwrap();
    let ctrl_key = DhchapKey::from_bytes(None, &[2; 48]).unwrap();
    let psk = ConfiguredPsk::from_bytes(Some(HashId::Sha256), &[3; 32]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("h2.key");
    std::fs::write(&file, format!("{}\n", *host_key.to_text())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let yaml = format!(
        "\
listeners:
  - {{name: l, transport: tcp, address: '::', port: 4420, tls: required}}
backends:
  - {{name: b, type: ram, size: 4M}}
hosts:
  - nqn: nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001
    dhchap_secret: \"{}\"
    dhchap_ctrl_secret: \"{}\"
    dhchap_hashes: [sha384, sha256]
    dhchap_dhgroups: [ffdhe3072, 'null']
    tls_psk: \"{}\"
  - nqn: nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002
    dhchap_secret_file: h2.key
subsystems:
  - nqn: nqn.2026-11.dev.example:s
    require_auth: true
    hosts: [nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001]
",
        *host_key.to_text(),
        *ctrl_key.to_text(),
        *psk.to_text()
    );
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let cfg = Config::load(&path).unwrap();
    assert_eq!(cfg.listeners[0].tls, TlsMode::Required);
    assert!(cfg.subsystems[0].require_auth);
    let h1 = &cfg.hosts[0];
    let d = h1.dhchap.as_ref().unwrap();
    assert_eq!(d.secret, host_key);
    assert_eq!(d.ctrl_secret.as_ref(), Some(&ctrl_key));
    assert_eq!(d.hashes, vec![HashId::Sha384, HashId::Sha256]);
    assert_eq!(d.dhgroups, vec![DhGroup::Ffdhe3072, DhGroup::Null]);
    assert_eq!(h1.tls_psk.as_ref(), Some(&psk));
    assert_eq!(cfg.hosts[1].dhchap.as_ref().unwrap().secret, host_key);
    assert_eq!(
        cfg.hosts[1].dhchap.as_ref().unwrap().hashes,
        HashId::ALL.to_vec()
    );

    // A secret file others can read is refused, naming the file and the fix.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = Config::load(&path).unwrap_err().to_string();
    assert!(err.contains("hosts[1].dhchap_secret_file"), "{err}");
    assert!(
        err.contains("mode 0644") && err.contains("chmod 600"),
        "{err}"
    );
    // Rotation: the file is re-read on every load.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o400)).unwrap();
    std::fs::remove_file(&file).unwrap();
    std::fs::write(&file, &*ctrl_key.to_text()).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cfg2 = Config::load(&path).unwrap();
    assert_eq!(cfg2.hosts[1].dhchap.as_ref().unwrap().secret, ctrl_key);
    let d = crate::reload::diff(&cfg, &cfg2);
    assert!(d.auth_changed && !d.is_empty());
}

#[test]
fn host_credential_errors() {
    let e = errors(
        "\
listeners:
  - {name: l, transport: rdma, address: '::', port: 4420, tls: optional}
hosts:
  - nqn: nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001
    dhchap_secret: \"DHHC-1:00:AAAA:\"
    dhchap_hashes: [md5]
    dhchap_dhgroups: []
  - nqn: nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001
    dhchap_ctrl_secret: \"DHHC-1:00:AAAA:\"
    tls_psk: \"NVMeTLSkey-1:05:AAAA:\"
    tls_psk_file: /nonexistent
  - nqn: nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000003
    dhchap_secret_file: /nonexistent/key
subsystems:
  - nqn: nqn.2026-11.dev.example:s
    require_auth: true
    hosts: [nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000009]
",
    );
    let all = e.join("\n");
    for want in [
        "listeners[0].tls: TLS is defined for NVMe/TCP listeners only",
        "hosts[0].dhchap_secret: the key is 0 bytes",
        "hosts[0].dhchap_hashes[0]: unknown \"md5\"",
        "hosts[0].dhchap_dhgroups: must name at least one",
        "hosts[1].nqn: host \"nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001\" is listed twice",
        "hosts[1].dhchap_ctrl_secret: a controller secret needs a host secret",
        "hosts[1].tls_psk_file: give tls_psk or tls_psk_file, not both",
        "hosts[2].dhchap_secret_file: cannot read /nonexistent/key",
        "subsystems[0].hosts[0]: the subsystem requires authentication",
    ] {
        assert!(all.contains(want), "missing {want:?} in\n{all}");
    }
}

#[test]
fn nvme_backend_parses_with_defaults() {
    let yaml = MINIMAL.replace(
        "{name: b, type: ram, size: 4M}",
        "{name: b, type: nvme, pci: 0000:00:04.0}\n  - {name: c, type: nvme, pci: 0000:00:04.0, nsid: 2, io_timeout_ms: 3000, sgl: false}",
    );
    let cfg = Config::parse(&yaml, "t.yaml").unwrap();
    assert_eq!(
        cfg.backends[0].kind,
        BackendKind::Nvme {
            pci: "0000:00:04.0".into(),
            nsid: 1,
            io_timeout_ms: None,
            sgl: true,
        }
    );
    assert_eq!(
        cfg.backends[1].kind,
        BackendKind::Nvme {
            pci: "0000:00:04.0".into(),
            nsid: 2,
            io_timeout_ms: Some(3000),
            sgl: false,
        }
    );
}

#[test]
fn nvme_backend_errors_name_file_line_and_field() {
    let yaml = MINIMAL.replace(
        "{name: b, type: ram, size: 4M}",
        "{name: b, type: nvme, pci: 00:04.0, nsid: 0, size: 4M}\n  \
         - {name: c, type: nvme}\n  \
         - {name: d, type: nvme, pci: 0000:00:05.0, io_timeout_ms: 5}\n  \
         - {name: e, type: nvme, pci: 0000:00:05.0, nsid: 1}\n  \
         - {name: f, type: ram, size: 4M, pci: 0000:00:05.0}",
    );
    assert_eq!(
        errors(&yaml),
        [
            "t.yaml:4:32: backends[0].pci: invalid PCI address \"00:04.0\": expected domain:bus:device.function, e.g. 0000:00:04.0",
            "t.yaml:4:47: backends[0].nsid: must be 1..=4294967294 (0xFFFFFFFE), got 0",
            "t.yaml:4:56: backends[0].size: not valid for nvme backends (the drive's namespace has its own)",
            "t.yaml:5:5: backends[1].pci: required for nvme backends",
            "t.yaml:6:61: backends[2].io_timeout_ms: must be 100..=600000 milliseconds, got 5",
            "t.yaml:7:32: backends[3].pci: namespace 1 of 0000:00:05.0 is already used by backends[2] at line 6",
            "t.yaml:8:41: backends[4].pci: only valid for nvme backends",
        ]
    );
}

#[test]
fn engine_defaults_to_soft_and_doca_needs_devices_and_rdma() {
    assert_eq!(
        Config::parse(MINIMAL, "t.yaml").unwrap().engine,
        EngineKind::Soft
    );
    let cfg = Config::parse(&format!("engine: soft\n{MINIMAL}"), "t.yaml").unwrap();
    assert_eq!(cfg.engine, EngineKind::Soft);
    assert_eq!(cfg.doca, None);
    // doca without its devices, and with MINIMAL's TCP listener: both named.
    let e = errors(&format!("engine: doca\n{MINIMAL}"));
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with("t.yaml:1:") && e[0].contains("doca") && e[0].contains("sta_device"),
        "{}",
        e[0]
    );
    assert!(
        e[1].starts_with("t.yaml:3:")
            && e[1].contains("listeners[0].transport")
            && e[1].contains("NVMe/RDMA only"),
        "{}",
        e[1]
    );
    let rdma = MINIMAL.replace("transport: tcp", "transport: rdma");
    let doca = "engine: doca\ndoca:\n  sta_device: mlx5_0\n  net_devices: [mlx5_2, mlx5_3]\n";
    let cfg = Config::parse(&format!("{doca}{rdma}"), "t.yaml").unwrap();
    assert_eq!(cfg.engine, EngineKind::Doca);
    assert_eq!(
        cfg.doca,
        Some(DocaSettings {
            sta_device: "mlx5_0".into(),
            net_devices: vec!["mlx5_2".into(), "mlx5_3".into()],
            be_queue_entries: DEFAULT_BE_QUEUE_ENTRIES,
        })
    );
    let bad =
        "engine: doca\ndoca:\n  sta_device: ''\n  net_devices: [a, a]\n  be_queue_entries: 100\n";
    let e = errors(&format!("{bad}{rdma}"));
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(
        e[0].starts_with("t.yaml:3:") && e[0].contains("doca.sta_device"),
        "{}",
        e[0]
    );
    assert!(
        e[1].starts_with("t.yaml:4:") && e[1].contains("listed twice"),
        "{}",
        e[1]
    );
    assert!(
        e[2].starts_with("t.yaml:5:") && e[2].contains("doca.be_queue_entries"),
        "{}",
        e[2]
    );
    // ANA states cannot be enforced on DOCA's offloaded path: refused with their line.
    let ana = rdma.replace(
        "    namespaces:",
        "    ana_groups:\n      - {id: 2, states: {l: inaccessible}}\n    namespaces:",
    );
    let e = errors(&format!("{doca}{ana}"));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].contains("subsystems[0].ana_groups[0]") && e[0].contains("doca engine"),
        "{}",
        e[0]
    );
    let e = errors(&format!("engine: spdk\n{MINIMAL}"));
    assert!(e[0].starts_with("t.yaml:1:"), "{e:?}");
    let state = tempfile::tempdir().unwrap();
    let example = example_in(state.path());
    assert_eq!(example.engine, EngineKind::Soft);
}

#[test]
fn control_socket_defaults_and_settings() {
    let cfg = Config::parse(MINIMAL, "t.yaml").unwrap();
    let c = cfg.control.expect("on by default");
    assert_eq!(c.path, default_socket_path());
    assert_eq!((c.mode, c.group, c.explicit), (0o600, None, false));

    for (mode, want) in [
        ("\"0660\"", 0o660),
        ("\"0o640\"", 0o640),
        ("600", 0o600),
        ("0600", 0o600),
    ] {
        let yaml = format!("control: {{path: /run/x/c.sock, mode: {mode}, group: adm}}\n{MINIMAL}");
        let c = Config::parse(&yaml, "t.yaml").unwrap().control.unwrap();
        assert_eq!(c.path, PathBuf::from("/run/x/c.sock"));
        assert_eq!(
            (c.mode, c.group.as_deref(), c.explicit),
            (want, Some("adm"), true),
            "{mode}"
        );
    }
    let off = format!("control: {{enabled: false}}\n{MINIMAL}");
    assert_eq!(Config::parse(&off, "t.yaml").unwrap().control, None);
}

#[test]
fn control_socket_errors_name_the_field() {
    let long = format!("/{}", "a".repeat(120));
    for (control, want) in [
        (
            "{path: relative.sock}",
            "t.yaml:1:17: control.path: must be an absolute path",
        ),
        (
            &*format!("{{path: {long}}}"),
            "control.path: is 121 bytes long",
        ),
        (
            "{mode: \"0999\"}",
            "t.yaml:1:17: control.mode: invalid mode \"0999\"",
        ),
        ("{mode: 1777}", "control.mode: invalid mode \"1777\""),
        ("{group: \"\"}", "control.group: must not be empty"),
        ("{socket: /x}", "unknown field `socket`"),
    ] {
        let errs = errors(&format!("control: {control}\n{MINIMAL}"));
        assert!(
            errs.iter().any(|e| e.contains(want)),
            "{control}: {errs:?} lacks {want:?}"
        );
    }
}

#[test]
fn ana_groups_visibility_referrals_and_reservations() {
    let yaml = "\
listeners:
  - {name: t0, transport: tcp, address: 127.0.0.1, port: 4420}
  - {name: t1, transport: tcp, address: 127.0.0.1, port: 4421}
backends:
  - {name: b, type: ram, size: 4M}
  - {name: c, type: ram, size: 4M}
reservations: {state_file: /var/lib/nvmf-target/r.ptpl, if_missing: fail, if_corrupt: start_clean}
referrals:
  - {transport: tcp, address: 192.0.2.9, port: 8009}
subsystems:
  - nqn: nqn.2026-11.dev.example:s
    allow_any_host: true
    ana_groups:
      - {id: 2, states: {t0: inaccessible, t1: optimized}}
    namespaces:
      - {nsid: 1, backend: b}
      - {nsid: 2, backend: c, ana_group: 2, hosts: [nqn.2026-11.dev.example:h1]}
";
    let cfg = Config::parse(yaml, "t.yaml").unwrap();
    let s = &cfg.subsystems[0];
    assert_eq!(
        s.ana_groups,
        vec![AnaGroupConfig {
            id: 2,
            states: vec![
                ("t0".into(), AnaStateName::Inaccessible),
                ("t1".into(), AnaStateName::Optimized)
            ]
        }]
    );
    assert_eq!(
        (s.namespaces[0].ana_group, s.namespaces[1].ana_group),
        (1, 2)
    );
    assert_eq!(s.namespaces[0].hosts, None);
    assert_eq!(
        s.namespaces[1].hosts,
        Some(vec!["nqn.2026-11.dev.example:h1".to_string()])
    );
    assert_eq!(
        cfg.reservations,
        ReservationsConfig {
            state_file: Some("/var/lib/nvmf-target/r.ptpl".into()),
            if_missing: StartPolicy::Fail,
            if_corrupt: StartPolicy::StartClean,
        }
    );
    assert_eq!(cfg.referrals[0].port, 8009);
    // Defaults: no state file for text configs (the file path gives one), fail on corrupt.
    let d = Config::parse(MINIMAL, "t.yaml").unwrap();
    assert_eq!(d.reservations, ReservationsConfig::default());
    assert_eq!(d.subsystems[0].namespaces[0].ana_group, 1);

    let bad = yaml
        .replace(
            "{id: 2, states: {t0: inaccessible, t1: optimized}}",
            "{id: 200, states: {t9: optimized}}",
        )
        .replace("ana_group: 2", "ana_group: 0")
        .replace(
            "allow_any_host: true",
            "hosts: [nqn.2026-11.dev.example:h2]",
        )
        .replace("192.0.2.9", "0.0.0.0");
    let e = errors(&bad);
    let want = [
        "referrals[0].address: a referral needs an address",
        "subsystems[0].ana_groups[0].id: must be 1..=128, got 200",
        "subsystems[0].namespaces[1].ana_group: must be 1..=128, got 0",
        "subsystems[0].namespaces[1].hosts[0]: host \"nqn.2026-11.dev.example:h1\" may not connect",
    ];
    for w in want {
        assert!(e.iter().any(|x| x.contains(w)), "{w:?} not in {e:#?}");
    }
    let e = errors(&yaml.replace("t1: optimized", "t9: optimized"));
    assert!(
        e[0].contains("ana_groups[0].states.t9: listener \"t9\" is not one of"),
        "{e:?}"
    );
    let e = errors(&yaml.replace("t1: optimized", "t1: sideways"));
    assert!(e[0].contains("states"), "{e:?}");
}

#[test]
fn state_file_sits_beside_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("n.yaml");
    std::fs::write(&path, MINIMAL).unwrap();
    let cfg = Config::load(&path).unwrap();
    assert_eq!(
        cfg.reservations.state_file,
        Some(dir.path().join("n.yaml.ptpl"))
    );
    // The daemon loads with the text (start and reload), and parses the running text
    // for --diff: the same default both ways (without it, PTPL was never offered).
    let (cfg2, text) = Config::load_with_text(&path).unwrap();
    assert_eq!(cfg2.reservations, cfg.reservations);
    let cfg3 = Config::parse_as_file(&text, &path).unwrap();
    assert_eq!(cfg3.reservations, cfg.reservations);
    std::fs::write(
        &path,
        format!("{MINIMAL}reservations: {{state_file: r/state}}\n"),
    )
    .unwrap();
    let cfg = Config::load(&path).unwrap();
    assert_eq!(
        cfg.reservations.state_file,
        Some(dir.path().join("r/state"))
    );
}

#[test]
fn limits_default_and_configured() {
    let cfg = Config::parse(MINIMAL, "t.yaml").expect("valid");
    assert_eq!(cfg.limits, Limits::default());
    assert!(!cfg.metrics_allow_remote);
    let yaml = format!(
        "{MINIMAL}limits:\n  max_connections: 100\n  max_connections_per_peer: 10\n  \
         icreq_timeout_ms: 500\n  connection_buffer: 4MiB\n\
         metrics: {{address: '0.0.0.0:9100', allow_remote: true}}\n"
    );
    let cfg = Config::parse(&yaml, "t.yaml").expect("valid");
    assert_eq!(cfg.limits.max_connections, 100);
    assert_eq!(cfg.limits.max_connections_per_peer, 10);
    // A default larger than the configured total is lowered to it.
    assert_eq!(cfg.limits.max_unconnected, 100);
    // Its per-peer share by default: half of it, and no more
    // than the peer may hold at all.
    assert_eq!(cfg.limits.max_unconnected_per_peer, 10);
    assert_eq!(cfg.limits.icreq_timeout, Duration::from_millis(500));
    assert_eq!(
        cfg.limits.connect_timeout,
        Limits::default().connect_timeout
    );
    assert_eq!(cfg.limits.connection_buffer, 4 << 20);
    assert!(cfg.metrics_allow_remote);
}

#[test]
fn max_unconnected_per_peer_default_and_bounds() {
    assert_eq!(Limits::default().max_unconnected_per_peer, 512);
    let limits = |body: &str| {
        Config::parse(&format!("{MINIMAL}limits: {{{body}}}\n"), "t.yaml")
            .expect("valid")
            .limits
    };
    // Half of a smaller max_unconnected, so that one address never holds all of it.
    assert_eq!(limits("max_unconnected: 16").max_unconnected_per_peer, 8);
    assert_eq!(limits("max_unconnected: 1").max_unconnected_per_peer, 1);
    assert_eq!(
        limits("max_unconnected: 4096").max_unconnected_per_peer,
        2048
    );
    let l = limits("max_unconnected: 64, max_unconnected_per_peer: 64");
    assert_eq!(l.max_unconnected_per_peer, 64);
    let l = limits("max_unconnected_per_peer: 1");
    assert_eq!(l.max_unconnected_per_peer, 1);

    let e = errors(&format!(
        "{MINIMAL}limits: {{max_unconnected: 64, max_unconnected_per_peer: 65}}\n"
    ));
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(
        e[0].contains(
            "limits.max_unconnected_per_peer: 65 is more than limits.max_unconnected (64), \
             the budget of all addresses together"
        ),
        "{e:#?}"
    );
    let e = errors(&format!(
        "{MINIMAL}limits: {{max_connections_per_peer: 8, max_unconnected_per_peer: 9}}\n"
    ));
    assert!(
        e[0].contains(
            "limits.max_unconnected_per_peer: 9 is more than limits.max_connections_per_peer \
             (8), so it could never be reached"
        ),
        "{e:#?}"
    );
    let e = errors(&format!(
        "{MINIMAL}limits: {{max_unconnected_per_peer: 0}}\n"
    ));
    assert!(
        e[0].contains("limits.max_unconnected_per_peer: must be from 1 to 1000000, got 0"),
        "{e:#?}"
    );
}

#[test]
fn limits_errors_name_the_field() {
    let yaml = format!(
        "{MINIMAL}limits:\n  max_connections: 10\n  max_unconnected: 20\n  \
         drain_timeout_ms: 5\n  connection_buffer: 4KiB\n  max_connections_per_peer: 0\n"
    );
    let e = errors(&yaml);
    assert_eq!(e.len(), 4, "{e:#?}");
    assert!(
        e.iter()
            .any(|l| l
                .contains("limits.max_unconnected: 20 is more than limits.max_connections (10)")),
        "{e:#?}"
    );
    assert!(
        e.iter()
            .any(|l| l.contains("limits.drain_timeout_ms: must be from 100")),
        "{e:#?}"
    );
    assert!(
        e.iter()
            .any(|l| l.contains("limits.connection_buffer: must be from max_io_size")),
        "{e:#?}"
    );
    assert!(
        e.iter()
            .any(|l| l.contains("limits.max_connections_per_peer: must be from 1")),
        "{e:#?}"
    );
    let e = errors(&format!("{MINIMAL}limits: {{max_conections: 5}}\n"));
    assert!(e[0].contains("max_conections"), "{e:#?}");
}

/// Two backends on one file (the same path, a symlink or a hard link to it, a `..` detour)
/// are refused: two namespaces would show hosts the same data under two identities.
#[test]
fn two_backends_on_one_file_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0u8; 4096]).unwrap();
    let link = dir.path().join("link.img");
    std::os::unix::fs::symlink(&disk, &link).unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let detour = dir.path().join("sub/../disk.img");
    let hard = dir.path().join("hard.img");
    std::fs::hard_link(&disk, &hard).unwrap();
    let paths = [&disk, &link, &detour, &hard];
    let yaml = MINIMAL.replace(
        "{name: b, type: ram, size: 4M}",
        &paths
            .iter()
            .zip(["b", "c", "d", "e"])
            .map(|(p, n)| format!("{{name: {n}, type: file, path: {}}}", p.display()))
            .collect::<Vec<_>>()
            .join("\n  - "),
    );
    let errs = errors(&yaml);
    assert_eq!(errs.len(), 3, "{errs:#?}");
    for (e, i) in errs.iter().zip(1..) {
        assert!(
            e.starts_with(&format!("t.yaml:{}:", 4 + i))
                && e.contains(&format!(
                    "backends[{i}].path: {} is already the file of backends[0] at line 4",
                    paths[i].display()
                )),
            "{e}"
        );
    }
}

/// A config path that is not a regular file, or a file far too large for a config, is
/// refused with the path and why, without reading it to the end.
#[test]
fn a_config_path_to_a_device_or_a_huge_file_is_refused() {
    let err = Config::load("/dev/zero").expect_err("/dev/zero is no config");
    assert!(
        err.to_string().contains("/dev/zero") && err.to_string().contains("not a regular file"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.yaml");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(crate::config::MAX_CONFIG_BYTES + 1).unwrap();
    let err = Config::load(&big).expect_err("too big");
    assert!(err.to_string().contains("larger than 16 MiB"), "{err}");
    // A FIFO nobody writes: refused at once, not waited on.
    let fifo = dir.path().join("fifo.yaml");
    nix::unistd::mkfifo(
        &fifo,
        nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
    )
    .unwrap();
    let err = Config::load(&fifo).expect_err("a FIFO is no config");
    assert!(err.to_string().contains("not a regular file"), "{err}");
}

/// A config written in place is read once it is left alone: half a file (which here is
/// valid YAML without its last lines) is never what a reload sees while the writer is
/// still at it (the reload audit's M5). A file left alone is read as it is, and one that
/// never stops changing is an error that says how to write configs. (Settle times of
/// 1 s here, 100 ms in the daemon: a loaded test machine can stall a writer thread for
/// longer than the daemon's.)
#[test]
fn a_config_written_in_place_is_read_once_it_is_left_alone() {
    use std::io::Write;
    let (settle, max) = (Duration::from_secs(1), Duration::from_secs(3));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    let full = "a: 1\nb: 2\nc: 3\n";
    std::fs::write(&path, "a: 1\n").unwrap();
    let writer = {
        let path = path.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            f.write_all(b"b: 2\n").unwrap();
            std::thread::sleep(Duration::from_millis(50));
            f.write_all(b"c: 3\n").unwrap();
        })
    };
    let text = read_settled(&path, settle, max).unwrap();
    writer.join().unwrap();
    assert_eq!(text, full, "the whole file, not the part written first");

    // Left alone for a while: read as it is.
    let f = std::fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(std::time::SystemTime::now() - Duration::from_secs(5))
        .unwrap();
    assert_eq!(read_settled(&path, settle, max).unwrap(), full);

    // Never left alone.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (path, stop) = (path.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                f.write_all(b"# more\n").unwrap();
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(30));
    let e = read_settled(&path, settle, max).unwrap_err().to_string();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        e.contains("kept changing") && e.contains("atomically"),
        "{e}"
    );
}
