//! NVMe/RDMA start-up on a machine that cannot serve it: a config with an RDMA listener
//! must fail at start-up with a message that says what is missing (rdma-core, or an RDMA
//! device), not start half-way or hang. Whichever piece this machine lacks is accepted
//! (a missing library is also covered by `sta`'s unit tests). On a machine that really
//! has an RDMA device there is nothing to check: the test is SKIPPED (`common/skip.rs`);
//! the interop VM proves the RDMA listener that does start (scenario `nvmft-rdma`).

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

fn main() {
    let missing = has_rdma_device().then(|| {
        "this machine has an RDMA device (/sys/class/infiniband): the listener would start"
            .to_string()
    });
    common::skip::run(vec![common::skip::trial(
        "rdma_listener_without_rdma_fails_at_startup_with_a_clear_message",
        missing,
        rdma_listener_without_rdma_fails_at_startup_with_a_clear_message,
    )]);
}

fn rdma_listener_without_rdma_fails_at_startup_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("rdma.yaml");
    std::fs::write(
        &cfg,
        "io_threads: 1\n\
         listeners:\n  - {name: rdma0, transport: rdma, address: 127.0.0.1, port: 44420}\n\
         backends:\n  - {name: ram0, type: ram, size: 16MiB, block_size: 512}\n\
         subsystems:\n  - nqn: nqn.2026-11.dev.nvmf-target:rdma-test\n    allow_any_host: true\n    \
         namespaces: [{nsid: 1, backend: ram0}]\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_nvmf-target"))
        .arg("--config")
        .arg(&cfg)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("the daemon did not exit: an unusable RDMA listener must stop start-up");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!status.success(), "must fail; output:\n{text}");
    assert!(
        text.contains("listener rdma0"),
        "names the listener:\n{text}"
    );
    assert!(
        text.contains("no RDMA device") || text.contains("libibverbs.so.1"),
        "says what is missing:\n{text}"
    );
}
