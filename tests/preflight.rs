//! `nvmf-target preflight` on this machine, through the binary: every line is one check
//! (`OK`, `FAIL ...; fix: ...`, `SKIP`), and the exit status says whether any failed. The
//! text of each check against a prepared system tree is tested in `src/preflight.rs`; here
//! the real machine is read, so only what holds on any machine is asserted, plus what the
//! build guarantees (the DOCA library found next to the binary is the workspace's double).

use std::process::Command;

fn preflight(config: Option<&str>) -> (bool, Vec<String>) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nvmf-target"));
    if let Some(text) = config {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.yaml");
        std::fs::write(&p, text).expect("write config");
        c.arg("--config").arg(&p);
        let out = c.arg("preflight").output().expect("run nvmf-target");
        return parse(out);
    }
    parse(c.arg("preflight").output().expect("run nvmf-target"))
}

fn parse(out: std::process::Output) -> (bool, Vec<String>) {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (
        out.status.success(),
        text.lines().map(str::to_string).collect(),
    )
}

fn check_lines(ok: bool, lines: &[String]) {
    let (last, checks) = lines.split_last().expect("output");
    assert!(last.starts_with("preflight: "), "{last}");
    for l in checks {
        assert!(
            l.starts_with("OK   ") || l.starts_with("FAIL ") || l.starts_with("SKIP "),
            "{l}"
        );
        if l.starts_with("FAIL ") {
            assert!(l.contains("; fix: "), "a FAIL names its fix: {l}");
        }
    }
    let failed = checks.iter().any(|l| l.starts_with("FAIL "));
    assert_eq!(
        ok, !failed,
        "exit status follows the FAIL lines: {lines:#?}"
    );
    if let Some(l) = checks.iter().find(|l| l.contains(" doca-library: ")) {
        if l.starts_with("OK ") {
            assert!(l.contains("DOCA test double"), "no NVIDIA DOCA here: {l}");
        }
    }
}

#[test]
fn the_embedded_soft_config_needs_nothing_special() {
    let (ok, lines) = preflight(None);
    check_lines(ok, &lines);
    assert!(ok, "{lines:#?}");
    assert!(lines.iter().any(|l| l.starts_with("SKIP doca-devices:")));
}

#[test]
fn a_doca_config_names_what_this_machine_lacks() {
    let (ok, lines) = preflight(Some(
        "engine: doca
doca: {sta_device: mlx5_0, net_devices: [mlx5_2]}
listeners:
  - {name: l, transport: rdma, address: 127.0.0.1, port: 4420}
backends:
  - {name: b, type: ram, size: 4M}
subsystems:
  - nqn: nqn.2026-11.dev.example:s
    namespaces:
      - {nsid: 1, backend: b}
",
    ));
    check_lines(ok, &lines);
    // No BlueField-3 can be on a machine that runs this suite without one; if it has one,
    // the line says where.
    let bf = lines
        .iter()
        .find(|l| l.contains(" bluefield-dpa: "))
        .expect("bluefield line");
    assert!(
        bf.starts_with("FAIL ") || bf.contains("BlueField-3 at "),
        "{bf}"
    );
    assert!(lines.iter().any(|l| l.contains(" rdma-devices: ")));
    assert!(lines.iter().any(|l| l.contains(" memlock: ")));
}
