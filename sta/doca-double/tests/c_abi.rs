//! A C program written against our headers (include/) must build and run against the
//! double: that proves the headers and the library agree on the ABI (struct layouts,
//! enum values, callback prototypes), beyond what the Rust signatures show. Without a C
//! compiler the test is SKIPPED (`skip/mod.rs`).

#[path = "../../../tests/common/skip.rs"]
mod skip;

use std::path::PathBuf;
use std::process::Command;

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

fn main() {
    let cc = cc();
    let missing = Command::new(&cc)
        .arg("--version")
        .output()
        .err()
        .map(|e| format!("no C compiler ({cc}: {e}) to build tests/c/smoke.c"));
    skip::run(vec![skip::trial(
        "c_program_against_our_headers_runs_on_the_double",
        missing,
        c_program_against_our_headers_runs_on_the_double,
    )]);
}

fn c_program_against_our_headers_runs_on_the_double() {
    let cc = cc();
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // The double built for this test run sits beside the test binary.
    let libdir = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    assert!(libdir.join("libdoca_sta.so").is_file(), "{libdir:?}");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("doca-double-smoke");
    let build = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg(here.join("tests/c/smoke.c"))
        .arg("-I")
        .arg(here.join("include"))
        .arg(format!("-L{}", libdir.display()))
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-ldoca_sta")
        .output()
        .expect("run the C compiler");
    assert!(
        build.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let run = Command::new(&out)
        .env("DOCA_DOUBLE_TEST_DEVICES", "cdev0")
        .env_remove("DOCA_DOUBLE_CONTRACT")
        .output()
        .expect("run the C program");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.contains("smoke: ok (doca-double"),
        "status {:?}\nstdout: {stdout}\nstderr: {}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
}
