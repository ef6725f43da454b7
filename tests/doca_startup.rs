//! `engine: doca` at start-up, through the binary: what is missing is named. Without the
//! library: every directory searched. With the workspace's DOCA double beside the binary
//! (cargo builds it as `target/<profile>/libdoca_sta.so`) but a device it does not list:
//! the device and what DOCA lists. Neither needs RDMA hardware: the engine fails before
//! any listener opens.

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

fn run(bin: &Path, dir: &Path) -> (i32, String) {
    let cfg = dir.join("doca.yaml");
    std::fs::write(&cfg, CONFIG).expect("config");
    let out = Command::new(bin)
        .arg("--config")
        .arg(&cfg)
        .env_remove("NVMF_DOCA_LIB_DIR")
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
    let (rc, err) = run(&bin, dir.path());
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
    let (rc, err) = run(bin, dir.path());
    assert_eq!(rc, 1, "{err}");
    let double = bin.with_file_name("libdoca_sta.so");
    if double.exists() {
        assert!(
            err.contains("engine: doca: DOCA device nosuchdev0 not found; DOCA lists: ")
                && err.contains("tdev0"),
            "{err}"
        );
    } else {
        // Only the daemon was built: the library is what is missing.
        assert!(err.contains("libdoca_sta.so) not found"), "{err}");
    }
}
