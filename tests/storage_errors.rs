//! What the storage's own failures look like from outside: the host's status, the
//! controller's Error Information log, and the daemon's log line naming the namespace,
//! the block and who sent the command.
//!
//! The full file system is a small tmpfs mounted for the test, which needs root: without
//! it the test is SKIPPED (`common/skip.rs`; `harness = false`).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

fn main() {
    let root =
        std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0);
    skip::run(vec![skip::trial(
        "a_full_file_system_is_capacity_exceeded_in_the_error_log_and_the_log",
        (!root).then(|| "mounting a tmpfs needs root".to_string()),
        a_full_file_system_is_capacity_exceeded_in_the_error_log_and_the_log,
    )]);
}

/// Unmounts the test's tmpfs, also when the test fails.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A 64 MiB namespace on a file in a 4 MiB tmpfs: writes succeed until the file system
/// is full, then fail with Capacity Exceeded (DNR). The failure is in the Error
/// Information log with its LBA, and the daemon logs it once with the namespace, the
/// block, the host and the subsystem. Before: the log stayed empty and nothing was logged
/// for I/O the engine failed.
fn a_full_file_system_is_capacity_exceeded_in_the_error_log_and_the_log() {
    let _w = watchdog("storage_errors", Duration::from_secs(120));
    let mnt = tempfile::tempdir().expect("tempdir");
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(mnt.path())
        .status()
        .expect("run mount");
    assert!(ok.success(), "mount a 4 MiB tmpfs as root");
    let _m = Mount(mnt.path().to_path_buf());
    let config = format!(
        "\
listeners: [{{name: tcp0, transport: tcp, address: 127.0.0.1, port: {{port}}}}]
backends:
  - {{name: f0, type: file, path: {}/ns.img, size: 64MiB, block_size: 512}}
subsystems:
  - nqn: {SUBNQN}
    allow_any_host: true
    namespaces: [{{nsid: 1, backend: f0}}]
",
        mnt.path().display()
    );
    let mut d = Daemon::start(&config);
    let mut c = controller(&d, 1, &host_opts());
    let chunk = pattern(9, 256 << 10);
    let mut full = None;
    for i in 0..64u64 {
        let lba = i * 512;
        let s = c.io[0].write(1, lba, &chunk, false).expect("write");
        if !s.is_success() {
            full = Some((lba, s));
            break;
        }
    }
    let (lba, s) = full.expect("a 4 MiB file system cannot take 16 MiB");
    assert_eq!(
        (s.sct, s.sc, s.dnr),
        (0, 0x81, true),
        "Capacity Exceeded: {s}"
    );

    let deadline = Instant::now() + Duration::from_secs(5);
    let line = loop {
        let log = d.log();
        if let Some(l) = log.lines().find(|l| l.contains("I/O error: ")) {
            break l.to_string();
        }
        assert!(Instant::now() < deadline, "no I/O error line; log:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let what = format!("Write at LBA {lba} of namespace 1 failed in its backend");
    for want in [&what, "Capacity Exceeded", SUBNQN, "peer 127.0.0.1"] {
        assert!(line.contains(want), "{want:?} not in {line:?}");
    }
    assert!(line.contains("WARN"), "a warning: {line}");

    let log = c
        .admin
        .get_log_page(0x01, 0xffff_ffff, 0, 64, false)
        .expect("error log");
    assert!(le64(&log, 0) >= 1, "error count: {log:02x?}");
    assert_eq!(le16(&log, 8), 1, "SQID");
    assert_eq!((le16(&log, 12) >> 1) & 0xff, 0x81, "status");
    assert_eq!(le64(&log, 16), lba, "LBA");
    assert_eq!(le32(&log, 24), 1, "NSID");
    // The namespace serves on: reads of what was written, and the daemon.
    let mut back = vec![0u8; 512];
    let s = c.io[0].read(1, 0, 1, &mut back).expect("read");
    assert!(s.is_success(), "read after the failed write: {s}");
    assert_eq!(back, chunk[..512], "written data");
    assert_serves(&mut d);
}
