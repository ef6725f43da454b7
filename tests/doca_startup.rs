//! `engine: doca` at start-up, through the binary: what is missing is named. Without the
//! library: every directory searched. With the workspace's DOCA double (a dev-dependency:
//! cargo builds it beside this test binary, in `target/<profile>/deps`, and the daemon is
//! pointed there with `NVMF_DOCA_LIB_DIR`) but a device it does not list: the device and
//! what DOCA lists. Neither needs RDMA hardware: the engine fails before any listener
//! opens.

mod common;

use std::path::Path;
use std::process::Command;

const CONFIG: &str = "\
engine: doca
doca: {sta_device: nosuchdev0, net_devices: [nosuchdev1]}
listeners:
  - {name: l, transport: rdma, address: 127.0.0.1, port: 4420}
backends:
  - {name: b, type: ram, size: 4M}
subsystems:
  - nqn: nqn.2026-11.dev.example:s
    namespaces:
      - {nsid: 1, backend: b}
";

/// Starts `bin` with the doca config in `dir`, DOCA searched for only in `lib_dir` (when
/// given) and in the places the loader always looks.
fn run(bin: &Path, dir: &Path, lib_dir: Option<&Path>) -> (i32, String) {
    let cfg = dir.join("doca.yaml");
    std::fs::write(&cfg, CONFIG).expect("config");
    let mut c = Command::new(bin);
    match lib_dir {
        Some(d) => c.env("NVMF_DOCA_LIB_DIR", d),
        None => c.env_remove("NVMF_DOCA_LIB_DIR"),
    };
    let out = c
        .arg("--config")
        .arg(&cfg)
        .env_remove("DOCA_SDK_ROOT")
        .env_remove("LD_LIBRARY_PATH")
        .env("DOCA_DOUBLE_TEST_DEVICES", "tdev0")
        .output()
        .expect("run nvmf-target");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_missing_library_is_named_with_every_place_searched() {
    // A copy of the binary in a directory without libdoca_sta.so.
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("nvmf-target");
    std::fs::copy(env!("CARGO_BIN_EXE_nvmf-target"), &bin).expect("copy the binary");
    let (rc, err) = run(&bin, dir.path(), None);
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("engine: doca: DOCA STA library (libdoca_sta.so) not found; searched")
            && err.contains("/opt/mellanox/doca/lib/")
            && err.contains(&dir.path().display().to_string())
            && err.contains("NVMF_DOCA_LIB_DIR"),
        "{err}"
    );
}

#[test]
fn an_unknown_device_is_named_with_what_doca_lists() {
    let bin = Path::new(env!("CARGO_BIN_EXE_nvmf-target"));
    let dir = tempfile::tempdir().expect("tempdir");
    let (rc, err) = run(bin, dir.path(), Some(&common::doca_double_dir()));
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("engine: doca: DOCA device nosuchdev0 not found; DOCA lists: ")
            && err.contains("tdev0"),
        "{err}"
    );
}
