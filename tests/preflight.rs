//! `nvmf-target preflight` on this machine, through the binary: every line is one check
//! (`OK`, `FAIL ...; fix: ...`, `SKIP`), and the exit status says whether any failed. The
//! text of each check against a prepared system tree is tested in `src/preflight.rs`; here
//! the real machine is read, so only what holds on any machine is asserted, plus what the
//! build guarantees (the DOCA library found is the workspace's double). The doca config's
//! check names devices this machine lacks; on a machine that has one of them (an RDMA
//! device mlx5_0 or mlx5_2) that check is SKIPPED (`common/skip.rs`).

mod common;

use std::path::Path;
use std::process::Command;

/// The devices the doca config names.
const STA_DEVICE: &str = "mlx5_0";
const NET_DEVICE: &str = "mlx5_2";

fn main() {
    let present: Vec<&str> = [STA_DEVICE, NET_DEVICE]
        .into_iter()
        .filter(|d| Path::new("/sys/class/infiniband").join(d).exists())
        .collect();
    let has_them = (!present.is_empty()).then(|| {
        format!(
            "this machine has {} (/sys/class/infiniband): nothing is missing to be named",
            present.join(", ")
        )
    });
    common::skip::run(vec![
        common::skip::trial(
            "the_embedded_soft_config_needs_nothing_special",
            None,
            the_embedded_soft_config_needs_nothing_special,
        ),
        common::skip::trial(
            "a_doca_config_names_what_this_machine_lacks",
            has_them,
            a_doca_config_names_what_this_machine_lacks,
        ),
    ]);
}

/// `nvmf-target preflight` with `config` (else the embedded one), DOCA looked for in
/// `lib_dir` first when given.
fn preflight(config: Option<&str>, lib_dir: Option<&Path>) -> (bool, Vec<String>) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nvmf-target"));
    if let Some(d) = lib_dir {
        c.env("NVMF_DOCA_LIB_DIR", d)
            .env("DOCA_DOUBLE_TEST_DEVICES", "tdev0");
    }
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

fn the_embedded_soft_config_needs_nothing_special() {
    let (ok, lines) = preflight(None, None);
    check_lines(ok, &lines);
    assert!(ok, "{lines:#?}");
    assert!(lines.iter().any(|l| l.starts_with("SKIP doca-devices:")));
}

fn a_doca_config_names_what_this_machine_lacks() {
    let config = format!(
        "engine: doca
doca: {{sta_device: {STA_DEVICE}, net_devices: [{NET_DEVICE}]}}
listeners:
  - {{name: l, transport: rdma, address: 127.0.0.1, port: 4420}}
backends:
  - {{name: b, type: ram, size: 4M}}
subsystems:
  - nqn: nqn.2026-11.dev.example:s
    namespaces:
      - {{nsid: 1, backend: b}}
"
    );
    let (ok, lines) = preflight(Some(&config), Some(&common::doca_double_dir()));
    check_lines(ok, &lines);
    assert!(
        !ok,
        "preflight passed a machine without {STA_DEVICE}: {lines:#?}"
    );
    let line = |name: &str| {
        lines
            .iter()
            .find(|l| l.contains(&format!(" {name}: ")))
            .unwrap_or_else(|| panic!("no {name} line: {lines:#?}"))
    };
    let lib = line("doca-library");
    assert!(
        lib.starts_with("OK ") && lib.contains("DOCA test double"),
        "{lib}"
    );
    // The double lists this machine's RDMA devices and tdev0: neither has the configured
    // names, and each failing line names the device and what DOCA lists.
    let sta = line("doca-sta-device");
    assert!(
        sta.starts_with("FAIL ") && sta.contains(&format!("{STA_DEVICE} not found; DOCA lists")),
        "{sta}"
    );
    assert!(sta.contains("tdev0"), "{sta}");
    let net = line("doca-net-device");
    assert!(
        net.starts_with("FAIL ") && net.contains(&format!("{NET_DEVICE} not found; DOCA lists")),
        "{net}"
    );
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
