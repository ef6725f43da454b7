//! `nvmf-target --check-config`: exit codes, the OK summary, and one test per kind of
//! config error, each asserting the exact `file:line:col: field: message` line.
//! These run the built binary with `--check-config` only; the daemon never starts.

use std::io::Write as _;
use std::process::{Command, Output};

/// A valid config; tests break one line of it at a time (line numbers are 1-based).
const BASE: &str = "\
io_threads: 2
listeners:
  - name: tcp0
    transport: tcp
    address: 127.0.0.1
    port: 4420
backends:
  - name: ram0
    type: ram
    size: 1GiB
  - name: ram1
    type: ram
    size: 64MiB
    block_size: 4096
subsystems:
  - nqn: nqn.2026-11.dev.nvmf-target:a
    allow_any_host: true
    namespaces:
      - nsid: 1
        backend: ram0
      - nsid: 2
        backend: ram1
";

fn check_config(yaml: &str) -> (Output, String) {
    let mut file = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("temp file");
    file.write_all(yaml.as_bytes()).expect("write config");
    let path = file.path().display().to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_nvmf-target"))
        .args(["--check-config", "--config", &path])
        .env_remove("RUST_LOG")
        .output()
        .expect("run nvmf-target");
    (output, path)
}

/// `BASE` with the 1-based line `line` (which must contain `old`) changed to `new`.
fn edit(line: usize, old: &str, new: &str) -> String {
    let mut lines: Vec<String> = BASE.lines().map(str::to_owned).collect();
    let target = &mut lines[line - 1];
    assert!(
        target.contains(old),
        "line {line} is {target:?}, not {old:?}"
    );
    *target = target.replace(old, new);
    lines.join("\n") + "\n"
}

/// Runs the check on `yaml` and asserts it fails with exactly these lines
/// (`line:col: field: message`, the file name is added here).
#[track_caller]
fn assert_errors(yaml: &str, expected: &[&str]) {
    let (output, path) = check_config(yaml);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(output.stdout.is_empty(), "stdout: {:?}", output.stdout);
    let mut want: Vec<String> = expected.iter().map(|e| format!("{path}:{e}")).collect();
    if expected.len() > 1 {
        want.push(format!("{} errors", expected.len()));
    }
    let got: Vec<&str> = stderr.lines().collect();
    assert_eq!(got, want, "for config:\n{yaml}");
}

#[track_caller]
fn assert_error(yaml: &str, expected: &str) {
    assert_errors(yaml, &[expected]);
}

#[test]
fn valid_config_prints_summary() {
    let (output, _) = check_config(BASE);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "config OK: 1 subsystem, 2 namespaces, 1 listener\n"
    );
}

#[test]
fn subsystem_no_host_may_connect_is_a_warning() {
    let (output, _) = check_config(&edit(17, "allow_any_host: true", "allow_any_host: false"));
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "warning: subsystem nqn.2026-11.dev.nvmf-target:a: no host may connect (allow_any_host \
         is false and hosts lists none); add its hosts, or set allow_any_host: true\n"
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "config OK: 1 subsystem, 2 namespaces, 1 listener\n"
    );
}

#[test]
fn embedded_default_checks() {
    let output = Command::new(env!("CARGO_BIN_EXE_nvmf-target"))
        .arg("--check-config")
        .output()
        .expect("run nvmf-target");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "config OK: 1 subsystem, 1 namespace, 1 listener\n"
    );
}

#[test]
fn example_checks() {
    // Its state directory (/var/lib/nvmf-target) is the systemd unit's to create; here
    // it is a temporary one.
    let state = tempfile::tempdir().expect("temp dir");
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/etc/example.yaml"))
        .expect("read example")
        .replace("/var/lib/nvmf-target", &state.path().display().to_string());
    let config = state.path().join("example.yaml");
    std::fs::write(&config, text).expect("write config");
    let output = Command::new(env!("CARGO_BIN_EXE_nvmf-target"))
        .args(["--check-config", "--config"])
        .arg(&config)
        .output()
        .expect("run nvmf-target");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "config OK: 2 subsystems, 2 namespaces, 2 listeners\n"
    );
}

#[test]
fn usage_error_exits_2() {
    let output = Command::new(env!("CARGO_BIN_EXE_nvmf-target"))
        .args(["--check-config", "--log-format", "xml"])
        .output()
        .expect("run nvmf-target");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}

#[test]
fn missing_file() {
    let output = Command::new(env!("CARGO_BIN_EXE_nvmf-target"))
        .args(["--check-config", "--config", "/nonexistent/nvmf.yaml"])
        .output()
        .expect("run nvmf-target");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("/nonexistent/nvmf.yaml: cannot read config file: "),
        "{stderr}"
    );
}

// ---- syntax and type errors (from the YAML deserializer) ----

#[test]
fn yaml_syntax_error() {
    assert_error(
        &edit(5, "address: 127.0.0.1", "address: \"127.0.0.1"),
        "6:5: listeners[0].address: invalid indentation in multiline quoted scalar",
    );
}

#[test]
fn unknown_field() {
    assert_error(
        &edit(17, "allow_any_host", "allow_any_hots"),
        "17:5: subsystems[0].allow_any_hots: unknown field `allow_any_hots` (did you mean \
         `allow_any_host`? expected one of: nqn, serial, model, allow_any_host, hosts, \
         require_auth, listeners, ana_groups, namespaces)",
    );
}

#[test]
fn missing_field() {
    assert_error(
        &edit(6, "port: 4420", "# no port"),
        "3:5: listeners[0].port: required field is missing",
    );
}

#[test]
fn wrong_type() {
    assert_error(
        &edit(19, "nsid: 1", "nsid: one"),
        "19:15: subsystems[0].namespaces[0].nsid: expected a non-negative integer, not `one`",
    );
}

#[test]
fn misspelt_boolean() {
    assert_error(
        &edit(17, "allow_any_host: true", "allow_any_host: ture"),
        "17:21: subsystems[0].allow_any_host: expected true or false, not `ture`",
    );
}

#[test]
fn collection_instead_of_value() {
    assert_error(
        &edit(6, "4420", "[4420]"),
        "6:11: listeners[0].port: expected a single value, found a sequence or mapping",
    );
}

#[test]
fn unknown_transport() {
    assert_error(
        &edit(4, "tcp", "udp"),
        "4:16: listeners[0].transport: unknown variant `udp`, expected one of tcp, rdma",
    );
}

#[test]
fn duplicate_key() {
    assert_error(
        &edit(10, "size: 1GiB", "size: 1GiB\n    size: 2GiB"),
        "11:5: backends[0].size: duplicate key",
    );
}

// ---- semantic errors ----

#[test]
fn duplicate_listener_name() {
    let yaml = edit(
        6,
        "port: 4420",
        "port: 4420\n  - name: tcp0\n    transport: tcp\n    address: 127.0.0.1\n    port: 4421",
    );
    assert_error(
        &yaml,
        "7:11: listeners[1].name: duplicate listener name \"tcp0\" (first: listeners[0] at line 3)",
    );
}

#[test]
fn duplicate_listener_port() {
    let yaml = edit(
        6,
        "port: 4420",
        "port: 4420\n  - name: tcp1\n    transport: tcp\n    address: 127.0.0.1\n    port: 4420",
    );
    assert_error(
        &yaml,
        "10:11: listeners[1].port: tcp 127.0.0.1:4420 is already used by listeners[0] at line 3",
    );
}

/// A wildcard and a specific address of its family on one TCP port cannot both listen
/// (the reload audit's L5: `--check-config` passed it, the daemon then failed the second
/// bind); another family's specific address, or another port, may.
#[test]
fn wildcard_and_specific_address_on_one_tcp_port() {
    let yaml = edit(
        6,
        "port: 4420",
        "port: 4420\n  - name: any\n    transport: tcp\n    address: 0.0.0.0\n    port: 4420",
    );
    assert_error(
        &yaml,
        "10:11: listeners[1].port: tcp 0.0.0.0:4420 overlaps listeners[0] at line 3 on \
         127.0.0.1:4420: a wildcard address and another address it covers cannot listen on \
         the same port (the kernel refuses the second bind; \"::\" covers IPv4 too); use one \
         wildcard listener, or specific addresses only",
    );
    // "::" is dual-stack (unless net.ipv6.bindv6only is 1): it covers 127.0.0.1 as well.
    let yaml = edit(
        6,
        "port: 4420",
        "port: 4420\n  - name: any\n    transport: tcp\n    address: \"::\"\n    port: 4420",
    );
    let v6only =
        std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only").is_ok_and(|v| v.trim() == "1");
    if v6only {
        let (output, _) = check_config(&yaml);
        assert_eq!(output.status.code(), Some(0), "{output:?}");
    } else {
        assert_error(
            &yaml,
            "10:11: listeners[1].port: tcp [::]:4420 overlaps listeners[0] at line 3 on \
             127.0.0.1:4420: a wildcard address and another address it covers cannot listen \
             on the same port (the kernel refuses the second bind; \"::\" covers IPv4 too); \
             use one wildcard listener, or specific addresses only",
        );
    }
    for other in [
        "address: \"::1\"\n    port: 4420",
        "address: 0.0.0.0\n    port: 4421",
    ] {
        let yaml = edit(
            6,
            "port: 4420",
            &format!("port: 4420\n  - name: any\n    transport: tcp\n    {other}"),
        );
        let (output, _) = check_config(&yaml);
        assert_eq!(output.status.code(), Some(0), "{other}: {output:?}");
    }
}

#[test]
fn tcp_and_rdma_may_share_a_port() {
    let yaml = edit(
        6,
        "port: 4420",
        "port: 4420\n  - name: rdma0\n    transport: rdma\n    address: 127.0.0.1\n    port: 4420",
    );
    let (output, _) = check_config(&yaml);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
}

#[test]
fn bad_listener_name() {
    assert_error(
        &edit(3, "tcp0", "\"tcp 0\""),
        "3:11: listeners[0].name: invalid listener name \"tcp 0\": use 1..=64 characters \
         from A-Z a-z 0-9 _ - .",
    );
}

#[test]
fn duplicate_backend_name() {
    assert_errors(
        &edit(11, "ram1", "ram0"),
        &[
            "11:11: backends[1].name: duplicate backend name \"ram0\" (first: backends[0] at line 8)",
            "22:18: subsystems[0].namespaces[1].backend: unknown backend \"ram1\" (known: ram0)",
        ],
    );
}

#[test]
fn duplicate_nqn() {
    let yaml = format!("{BASE}  - nqn: nqn.2026-11.dev.nvmf-target:a\n    allow_any_host: true\n");
    assert_error(
        &yaml,
        "23:10: subsystems[1].nqn: duplicate subsystem NQN \"nqn.2026-11.dev.nvmf-target:a\" \
         (first: subsystems[0] at line 16)",
    );
}

#[test]
fn duplicate_nsid() {
    assert_error(
        &edit(21, "nsid: 2", "nsid: 1"),
        "21:15: subsystems[0].namespaces[1].nsid: duplicate nsid 1 \
         (first: subsystems[0].namespaces[0] at line 19)",
    );
}

#[test]
fn bad_nqn() {
    assert_error(
        &edit(
            16,
            "nqn.2026-11.dev.nvmf-target:a",
            "nqn.2026-13.dev.nvmf-target:a",
        ),
        "16:10: subsystems[0].nqn: invalid NQN \"nqn.2026-13.dev.nvmf-target:a\": expected a \
         date yyyy-mm. after \"nqn.\" (nqn.yyyy-mm.reverse.domain:name)",
    );
    assert_error(
        &edit(
            16,
            "nqn.2026-11.dev.nvmf-target:a",
            "iqn.2026-11.dev.nvmf-target:a",
        ),
        "16:10: subsystems[0].nqn: invalid NQN \"iqn.2026-11.dev.nvmf-target:a\": must start \
         with \"nqn.\" (nqn.yyyy-mm.reverse.domain:name)",
    );
    assert_error(
        &edit(
            16,
            "nqn.2026-11.dev.nvmf-target:a",
            "nqn.2026-11.dev.nvmf-target",
        ),
        "16:10: subsystems[0].nqn: invalid NQN \"nqn.2026-11.dev.nvmf-target\": expected \
         \":name\" after the reverse domain name",
    );
}

#[test]
fn discovery_nqn() {
    assert_error(
        &edit(
            16,
            "nqn.2026-11.dev.nvmf-target:a",
            "nqn.2014-08.org.nvmexpress.discovery",
        ),
        "16:10: subsystems[0].nqn: invalid NQN \"nqn.2014-08.org.nvmexpress.discovery\": is the \
         well-known discovery NQN, which the target serves itself",
    );
}

#[test]
fn nqn_too_long() {
    let long = format!("nqn.2026-11.dev.nvmf-target:{}", "x".repeat(200));
    assert_error(
        &edit(16, "nqn.2026-11.dev.nvmf-target:a", &long),
        &format!(
            "16:10: subsystems[0].nqn: invalid NQN {long:?}: is 228 bytes long; the limit is 223"
        ),
    );
}

#[test]
fn bad_host_nqn() {
    assert_error(
        &edit(
            17,
            "allow_any_host: true",
            "hosts: [\"nqn.2014-08.org.nvmexpress:uuid:not-a-uuid\"]",
        ),
        "17:13: subsystems[0].hosts[0]: invalid NQN \"nqn.2014-08.org.nvmexpress:uuid:not-a-uuid\": \
         the UUID form needs a UUID in 8-4-4-4-12 hex digits after \"uuid:\"",
    );
}

#[test]
fn nsid_out_of_range() {
    assert_error(
        &edit(21, "nsid: 2", "nsid: 0xFFFFFFFF"),
        "21:15: subsystems[0].namespaces[1].nsid: must be 1..=4294967294 (0xFFFFFFFE), got 4294967295",
    );
    assert_error(
        &edit(19, "nsid: 1", "nsid: 0"),
        "19:15: subsystems[0].namespaces[0].nsid: must be 1..=4294967294 (0xFFFFFFFE), got 0",
    );
}

#[test]
fn unknown_backend() {
    assert_error(
        &edit(22, "ram1", "disk9"),
        "22:18: subsystems[0].namespaces[1].backend: unknown backend \"disk9\" (known: ram0, ram1)",
    );
}

#[test]
fn unknown_listener() {
    assert_error(
        &edit(17, "allow_any_host: true", "listeners: [tcp0, tcp9]"),
        "17:23: subsystems[0].listeners[1]: unknown listener \"tcp9\" (known: tcp0)",
    );
}

#[test]
fn backend_used_twice() {
    assert_error(
        &edit(22, "ram1", "ram0"),
        "22:18: subsystems[0].namespaces[1].backend: backend \"ram0\" is already used by \
         subsystems[0].namespaces[0] at line 20; a backend serves one namespace",
    );
}

#[test]
fn size_zero() {
    assert_error(
        &edit(10, "1GiB", "0"),
        "10:11: backends[0].size: must not be 0",
    );
}

#[test]
fn size_not_multiple_of_block_size() {
    assert_error(
        &edit(13, "64MiB", "10000"),
        "13:11: backends[1].size: 10000 bytes is not a multiple of the block size (4096)",
    );
}

#[test]
fn bad_size_unit() {
    assert_error(
        &edit(10, "1GiB", "1GB2"),
        "10:11: backends[0].size: invalid size \"1GB2\": unknown unit \"GB2\" \
         (use K/M/G/T, KiB/MiB/GiB/TiB or KB/MB/GB/TB)",
    );
}

#[test]
fn bad_block_size() {
    assert_error(
        &edit(14, "4096", "1024"),
        "14:17: backends[1].block_size: must be 512 or 4096, got 1024",
    );
}

#[test]
fn ram_without_size() {
    assert_error(
        &edit(10, "size: 1GiB", "block_size: 512"),
        "8:5: backends[0].size: required for ram backends",
    );
}

#[test]
fn file_backend_missing_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("absent.img");
    let yaml = edit(10, "size: 1GiB", &format!("path: {}", missing.display()))
        .replace("type: ram\n    path", "type: file\n    path");
    assert_error(
        &yaml,
        &format!(
            "10:11: backends[0].path: {} does not exist (set size to create it)",
            missing.display()
        ),
    );
}

#[test]
fn file_backend_created_with_size() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("absent.img");
    let yaml = edit(
        10,
        "size: 1GiB",
        &format!("path: {}\n    size: 1GiB", missing.display()),
    )
    .replace("type: ram\n    path", "type: file\n    path");
    let (output, _) = check_config(&yaml);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(!missing.exists(), "--check-config must not create files");
}

#[test]
fn file_backend_directory_missing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("nodir");
    let yaml = edit(
        10,
        "size: 1GiB",
        &format!("path: {}\n    size: 1GiB", missing.join("x.img").display()),
    )
    .replace("type: ram\n    path", "type: file\n    path");
    assert_error(
        &yaml,
        &format!(
            "10:11: backends[0].path: directory {} does not exist (create it: the daemon \
             creates only the file)",
            missing.display()
        ),
    );
}

#[test]
fn file_backend_smaller_than_one_block() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tiny = dir.path().join("tiny.img");
    std::fs::write(&tiny, [0u8; 100]).expect("write file");
    let yaml = edit(10, "size: 1GiB", &format!("path: {}", tiny.display()))
        .replace("type: ram\n    path", "type: file\n    path");
    assert_error(
        &yaml,
        &format!(
            "10:11: backends[0].path: {} is 100 bytes, less than one 512-byte block; set size \
             to extend it",
            tiny.display()
        ),
    );
}

#[test]
fn file_backend_is_directory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let yaml = edit(10, "size: 1GiB", &format!("path: {}", dir.path().display()))
        .replace("type: ram\n    path", "type: file\n    path");
    assert_error(
        &yaml,
        &format!(
            "10:11: backends[0].path: {} is a directory",
            dir.path().display()
        ),
    );
}

#[test]
fn io_threads_out_of_range() {
    assert_error(
        &edit(1, "2", "0"),
        "1:13: io_threads: must be 1..=256, got 0",
    );
    assert_error(
        &edit(1, "2", "257"),
        "1:13: io_threads: must be 1..=256, got 257",
    );
}

#[test]
fn io_threads_and_cpus() {
    assert_error(
        &edit(1, "io_threads: 2", "io_threads: 2\ncpus: [0]"),
        "2:7: cpus: cannot be combined with io_threads (line 1); give a count or a CPU list",
    );
}

#[test]
fn duplicate_cpu() {
    assert_error(
        &edit(1, "io_threads: 2", "cpus: [0, 0]"),
        "1:11: cpus[1]: CPU 0 is listed twice (first: cpus[0] at line 1)",
    );
}

#[test]
fn bad_ip() {
    assert_error(
        &edit(5, "127.0.0.1", "127.0.0.256"),
        "5:14: listeners[0].address: invalid IP address \"127.0.0.256\": expected an IPv4 or \
         IPv6 literal",
    );
}

#[test]
fn port_zero() {
    assert_error(
        &edit(6, "4420", "0"),
        "6:11: listeners[0].port: port 0 is not allowed; use 1..=65535",
    );
    assert_error(
        &edit(6, "4420", "65536"),
        "6:11: listeners[0].port: must be 1..=65535, got 65536",
    );
}

#[test]
fn serial_too_long() {
    assert_error(
        &edit(17, "allow_any_host: true", "serial: ABCDEFGHIJKLMNOPQRSTU"),
        "17:13: subsystems[0].serial: is 21 characters long; the limit is 20",
    );
}

#[test]
fn model_not_ascii() {
    assert_error(
        &edit(17, "allow_any_host: true", "model: nvmf-tärget"),
        "17:12: subsystems[0].model: must be printable ASCII",
    );
}

#[test]
fn bad_uuid() {
    assert_error(
        &edit(20, "backend: ram0", "backend: ram0\n        uuid: 5f1c-zz"),
        "21:15: subsystems[0].namespaces[0].uuid: invalid UUID \"5f1c-zz\": expected \
         8-4-4-4-12 hex digits",
    );
}

#[test]
fn bad_nguid() {
    assert_error(
        &edit(
            20,
            "backend: ram0",
            "backend: ram0\n        nguid: 0123456789abcdef",
        ),
        "21:16: subsystems[0].namespaces[0].nguid: invalid value \"0123456789abcdef\": expected \
         32 hex digits",
    );
}

#[test]
fn duplicate_uuid() {
    let uuid = "5f1c6b2e-8d3a-4e6f-9b7c-2a1d0e4f3c5b";
    let yaml = edit(
        20,
        "backend: ram0",
        &format!("backend: ram0\n        uuid: {uuid}"),
    )
    .replace(
        "backend: ram1",
        &format!("backend: ram1\n        uuid: {uuid}"),
    );
    assert_error(
        &yaml,
        "24:15: subsystems[0].namespaces[1].uuid: uuid is already used by \
         subsystems[0].namespaces[0].uuid at line 21",
    );
}

#[test]
fn bad_metrics_address() {
    let yaml = format!("{BASE}metrics:\n  address: localhost:9100\n");
    assert_error(
        &yaml,
        "24:12: metrics.address: invalid address \"localhost:9100\": expected IP:port, \
         e.g. 127.0.0.1:9100 or \"[::1]:9100\"",
    );
}

#[test]
fn no_listeners() {
    let yaml = BASE.replace(
        "listeners:\n  - name: tcp0\n    transport: tcp\n    address: 127.0.0.1\n    port: 4420\n",
        "",
    );
    assert_error(&yaml, "1:1: listeners: at least one listener is required");
}

#[test]
fn all_semantic_errors_are_reported() {
    let yaml = edit(1, "2", "0")
        .replace("port: 4420", "port: 0")
        .replace("backend: ram1", "backend: disk9");
    assert_errors(
        &yaml,
        &[
            "1:13: io_threads: must be 1..=256, got 0",
            "6:11: listeners[0].port: port 0 is not allowed; use 1..=65535",
            "22:18: subsystems[0].namespaces[1].backend: unknown backend \"disk9\" (known: ram0, ram1)",
        ],
    );
}

#[test]
fn max_unconnected_per_peer_over_max_unconnected() {
    let yaml = format!("{BASE}limits:\n  max_unconnected: 64\n  max_unconnected_per_peer: 65\n");
    assert_error(
        &yaml,
        "25:29: limits.max_unconnected_per_peer: 65 is more than limits.max_unconnected (64), \
         the budget of all addresses together (keep it well below, so that one address cannot \
         lock every other host out)",
    );
    let yaml = format!("{BASE}limits:\n  max_unconnected_per_peer: 0\n");
    assert_error(
        &yaml,
        "24:29: limits.max_unconnected_per_peer: must be from 1 to 1000000, got 0",
    );
    // At most max_unconnected is fine (one address may have it all if the operator says so).
    let (output, _) = check_config(&format!(
        "{BASE}limits:\n  max_unconnected: 64\n  max_unconnected_per_peer: 64\n"
    ));
    assert_eq!(output.status.code(), Some(0), "{output:?}");
}
