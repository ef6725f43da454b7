//! File backend tests that need something of the machine: a tmpfs (/dev/shm) and a loop
//! device (losetup, root). Without it a test is SKIPPED (`common/skip.rs`), never passed.

mod common;

use std::process::Command;

use backend::{Backend, FileBackend, FileOptions};
use common::*;

const SHM: &str = "/dev/shm";

fn modes() -> Vec<Option<bool>> {
    vec![Some(false), None]
}

fn main() {
    let tmpfs = tempfile::tempdir_in(SHM)
        .err()
        .map(|e| format!("no writable {SHM}: {e}"));
    let loopdev = match Command::new("losetup").arg("--find").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "losetup --find: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("cannot run losetup: {e}")),
    };
    skip::run(vec![
        skip::trial("on_tmpfs", tmpfs, on_tmpfs),
        skip::trial("block_device_via_loop", loopdev, block_device_via_loop),
    ]);
}

/// The same checks on tmpfs (/dev/shm), whose fallocate and O_DIRECT support differ
/// from ext4's.
fn on_tmpfs() {
    let dir = tempfile::tempdir_in(SHM).expect("the probe found /dev/shm writable");
    for direct in modes() {
        let path = dir.path().join(format!("ns-{direct:?}.img"));
        let opts = FileOptions {
            create_size: Some(16 << 20),
            block_size: Some(4096),
            direct,
        };
        let be = FileBackend::open(&path, opts).unwrap();
        eprintln!("tmpfs: direct={}", be.is_direct());
        two_queues_two_threads(be.clone());
        fua_flush_zeroes_dealloc(be.clone());
        bad_requests(be);
    }
}

/// Block-device path, on a loop device over a temp file when this machine allows it.
fn block_device_via_loop() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("loop.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let out = Command::new("losetup")
        .args(["--find", "--show", "--sector-size", "512"])
        .arg(&img)
        .output();
    let o = out.expect("losetup ran for the probe");
    assert!(
        o.status.success(),
        "losetup could not attach: {}",
        String::from_utf8_lossy(&o.stderr).trim()
    );
    let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            // Best effort: a loop device left attached is harmless and visible in losetup.
            if let Err(e) = Command::new("losetup").arg("-d").arg(&self.0).status() {
                eprintln!("losetup -d {}: {e}", self.0);
            }
        }
    }
    let _guard = Detach(dev.clone());
    eprintln!("block_device_via_loop: using {dev}");
    let be = FileBackend::open(&dev, FileOptions::default()).unwrap();
    assert!(be.is_block_device());
    assert_eq!(be.block_size(), 512);
    assert_eq!(be.num_blocks(), (32 << 20) / 512);
    eprintln!("block_device_via_loop: direct={}", be.is_direct());
    // A block size below the device's logical block size is refused.
    assert!(FileBackend::open(
        &dev,
        FileOptions {
            block_size: Some(256),
            ..Default::default()
        }
    )
    .is_err());
    two_queues_two_threads(be.clone());
    fua_flush_zeroes_dealloc(be.clone());
    bad_requests(be.clone());
    let be4k = FileBackend::open(
        &dev,
        FileOptions {
            block_size: Some(4096),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(be4k.num_blocks(), (32 << 20) / 4096);
    fua_flush_zeroes_dealloc(be4k);
    be.flush_sync().unwrap();
}
