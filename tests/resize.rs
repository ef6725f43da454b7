//! Live resize end to end: namespaces grow under a connected host on reload (a RAM
//! backend given a larger `size`, a file grown on disk with no change in the config), the
//! host gets Namespace Attribute Changed with the NSIDs in its Changed Namespace List,
//! Identify answers the new size, the I/O queue it already had serves the new blocks, and
//! what it wrote before is still there. A namespace never shrinks: a smaller RAM size
//! waits for a restart, a file cut behind the daemon's back is an error of the reload, and
//! in both cases the host keeps the size it had.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use nvmf::spec::Status;
use nvmf_initiator::TcpHost;

/// Namespace 1 on RAM, 2 on a file in the test's directory (a disk file system: the
/// io_uring path), 3 on a file in /dev/shm (a memory file system allocated in full: the
/// mapped path).
const CONFIG: &str = "\
io_threads: 2
listeners:
  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: {port}}
backends:
  - {name: ram0, type: ram, size: 16MiB, block_size: 512}
  - {name: f0, type: file, path: \"{dir}/f0.img\", size: 8MiB}
  - {name: shm0, type: file, path: \"{shm}\", size: 8MiB}
subsystems:
  - nqn: nqn.2026-11.dev.nvmf-target:e2e
    allow_any_host: true
    namespaces:
      - {nsid: 1, backend: ram0}
      - {nsid: 2, backend: f0}
      - {nsid: 3, backend: shm0}
";

/// `nvmf-target ctl --socket <d's socket> <what>`: (success, stdout + stderr).
fn ctl(d: &Daemon, what: &str) -> (bool, String) {
    let o = Command::new(daemon_binary())
        .arg("ctl")
        .arg("--socket")
        .arg(d.dir().join("control.sock"))
        .arg(what)
        .output()
        .expect("run nvmf-target ctl");
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

fn ctl_reload(d: &Daemon) -> (bool, String) {
    ctl(d, "reload")
}

/// NSZE and NCAP from Identify Namespace.
fn size_of(admin: &mut TcpHost, nsid: u32) -> (u64, u64) {
    let id = admin.identify(0, nsid).expect("Identify Namespace");
    let word = |at: usize| u64::from_le_bytes(id[at..at + 8].try_into().unwrap());
    (word(0), word(8))
}

fn changed_list(admin: &mut TcpHost) -> Vec<u32> {
    let log = admin
        .get_log_page(0x04, 0xffff_ffff, 0, 4096, false)
        .expect("Changed Namespace List");
    log.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .take_while(|&n| n != 0)
        .collect()
}

/// Removes the /dev/shm file however the test ends.
struct ShmFile(std::path::PathBuf);

impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn namespaces_grow_live_and_never_shrink() {
    let _w = watchdog("resize", Duration::from_secs(90));
    if !std::path::Path::new("/dev/shm").is_dir() {
        println!("SKIPPED: namespaces_grow_live_and_never_shrink: no /dev/shm here");
        return;
    }
    let shm = ShmFile(std::path::PathBuf::from(format!(
        "/dev/shm/nvmft-resize-{}.img",
        std::process::id()
    )));
    // Written in full before the daemon opens it: only a file with no hole is served
    // from its pages.
    std::fs::write(&shm.0, vec![0u8; 8 << 20]).expect("write the /dev/shm file");
    let config = CONFIG.replace("{shm}", &shm.0.display().to_string());
    let mut d = Daemon::start(&config);
    let mut c = controller(&d, 1, &host_opts());
    // Namespace Attribute Notices on (Async Event Configuration bit 8), as Linux does.
    c.admin
        .set_features(0x0b, 0, 1 << 8, false)
        .expect("Set Features: Async Event Config");
    let sizes =
        |c: &mut Ctrl| -> Vec<u64> { (1..=3).map(|n| size_of(&mut c.admin, n).0).collect() };
    assert_eq!(sizes(&mut c), [32768, 16384, 16384]);

    // Data at the last blocks each namespace has now.
    let before = pattern(7, 4096);
    for (nsid, end) in [(1u32, 32768u64), (2, 16384), (3, 16384)] {
        assert_ok(
            c.io[0].write(nsid, end - 8, &before, false).expect("write"),
            "write at the old end",
        );
        let mut buf = vec![0u8; 4096];
        let s = c.io[0].read(nsid, end, 8, &mut buf).expect("read");
        assert_status(s, Status::LBA_OUT_OF_RANGE, "read past the end");
    }
    // The /dev/shm file is served from its pages (the mapped path).
    assert!(
        d.log().contains("nvmft-resize-") && d.log().contains("served from its pages"),
        "{}",
        d.log()
    );

    // RAM: a larger size in the file. f0: grown on disk, the config unchanged. shm0:
    // grown on disk too (the mapped store must reserve the space and allocate it).
    let aer = submit_aer(&mut c.admin);
    std::fs::write(
        d.dir().join("nvmf-target.yaml"),
        d.fill(&config.replace("size: 16MiB", "size: 24MiB")),
    )
    .unwrap();
    for f in [d.dir().join("f0.img"), shm.0.clone()] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .and_then(|h| h.set_len(12 << 20))
            .expect("grow the file");
    }
    let (ok, out) = ctl_reload(&d);
    assert!(ok, "{out}");
    for line in [
        "backend ram0: grow in place",
        "backend ram0: grew from 16.0 MiB to 24.0 MiB (49152 blocks of 512 bytes)",
        "backend f0: grew from 8.0 MiB to 12.0 MiB",
        "backend shm0: grew from 8.0 MiB to 12.0 MiB",
        "namespace 1: now 24.0 MiB (49152 blocks)",
        "namespace 2: now 12.0 MiB (24576 blocks)",
        "namespace 3: now 12.0 MiB (24576 blocks)",
    ] {
        assert!(
            out.contains(line),
            "ctl reload did not say {line:?}:\n{out}"
        );
    }
    let done = c.admin.poll_completion().expect("AER completion");
    assert_eq!(
        (done.cid, done.cqe.dw0),
        (aer, 0x0004_0002),
        "NS attribute notice"
    );
    assert_eq!(changed_list(&mut c.admin), [1, 2, 3]);
    assert_eq!(sizes(&mut c), [49152, 24576, 24576]);
    assert_eq!(size_of(&mut c.admin, 2), (24576, 24576), "NCAP too");
    // The queue connected before serves the new blocks; the old data is there.
    for (nsid, old_end, new_end) in [
        (1u32, 32768u64, 49152u64),
        (2, 16384, 24576),
        (3, 16384, 24576),
    ] {
        let mut buf = vec![0u8; 4096];
        assert_ok(
            c.io[0].read(nsid, old_end - 8, 8, &mut buf).unwrap(),
            "old data",
        );
        assert!(
            buf == before,
            "namespace {nsid}: data before the resize changed"
        );
        let after = pattern(u64::from(nsid) + 100, 4096);
        assert_ok(
            c.io[0].write(nsid, new_end - 8, &after, true).unwrap(),
            "write at the new end",
        );
        assert_ok(
            c.io[0].read(nsid, new_end - 8, 8, &mut buf).unwrap(),
            "read it back",
        );
        assert!(buf == after, "namespace {nsid}: new blocks read back wrong");
        let s = c.io[0].read(nsid, new_end, 8, &mut buf).unwrap();
        assert_status(s, Status::LBA_OUT_OF_RANGE, "past the new end");
    }
    // The metrics follow (they read the target).
    let out = String::from_utf8_lossy(
        &Command::new(daemon_binary())
            .args(["ctl", "--socket"])
            .arg(d.dir().join("control.sock"))
            .args(["subsystems"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(out.contains("24.0 MiB"), "{out}");

    // A file served from its pages grown on disk past the address space its mapping
    // reserved at start (8 times its 8 MiB): the growth waits for a restart, and says
    // so; the reload itself succeeds, and the namespace keeps its size (review 15, M2:
    // it failed every reload).
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shm.0)
        .and_then(|h| h.set_len(80 << 20))
        .unwrap();
    let (ok, out) = ctl_reload(&d);
    assert!(ok, "{out}");
    assert!(
        out.contains("restart required: backend shm0") && out.contains("restart to grow past"),
        "{out}"
    );
    assert_eq!(sizes(&mut c), [49152, 24576, 24576]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shm.0)
        .and_then(|h| h.set_len(12 << 20))
        .unwrap();

    // Shrinking: a smaller RAM size waits for a restart; a file cut on disk is an error
    // of the reload. No notice, no size change.
    let aer = submit_aer(&mut c.admin);
    std::fs::write(
        d.dir().join("nvmf-target.yaml"),
        d.fill(&config.replace("size: 16MiB", "size: 8MiB")),
    )
    .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(d.dir().join("f0.img"))
        .and_then(|h| h.set_len(10 << 20))
        .unwrap();
    let (ok, out) = ctl_reload(&d);
    assert!(!ok, "a file cut behind the daemon is an error: {out}");
    assert!(
        out.contains("restart required: backend ram0")
            && out.contains("a namespace cannot shrink while hosts use it"),
        "{out}"
    );
    assert!(out.contains("backend f0: cannot grow"), "{out}");
    assert_eq!(sizes(&mut c), [49152, 24576, 24576]);
    // Those Identify commands went after the reload on the admin queue: an event raised
    // by it would have come back before them.
    assert_eq!(
        c.admin.queued_completions(),
        0,
        "no notice for a size that did not change (AER {aer} completed)"
    );
    d.stop();
}

const RAM_ONLY: &str = "\
io_threads: 2
listeners:
  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: {port}}
backends:
  - {name: ram0, type: ram, size: 16MiB, block_size: 512}
subsystems:
  - nqn: nqn.2026-11.dev.nvmf-target:e2e
    allow_any_host: true
    namespaces:
      - {nsid: 1, backend: ram0}
";

/// (From the review of the feature.) A grow that cannot be done live (past the address
/// space a RAM namespace reserved at start) waits for a restart, as a shrink does, and
/// leaves the size alone; one that fits reaches I/O queues on both IO threads; a size past
/// memory and swap is refused as at start-up.
#[test]
fn a_grow_past_the_reserve_waits_for_a_restart_and_a_good_one_reaches_every_io_thread() {
    let _w = watchdog("resize past the reserve", Duration::from_secs(90));
    let mut d = Daemon::start(RAM_ONLY);
    // Four I/O queues: spread over both IO threads.
    let mut c = controller(&d, 4, &host_opts());
    let nsze = |c: &mut Ctrl| size_of(&mut c.admin, 1).0;
    assert_eq!(nsze(&mut c), 32768);
    let write_config = |size: &str| {
        std::fs::write(
            d.dir().join("nvmf-target.yaml"),
            d.fill(&RAM_ONLY.replace("size: 16MiB", size)),
        )
        .unwrap()
    };

    // 256 MiB: past the 128 MiB reserve of a 16 MiB store. Not an error of the reload:
    // the change waits for a restart, and says why.
    write_config("size: 256MiB");
    let (ok, out) = ctl(&d, "reload");
    assert!(ok, "{out}");
    assert!(
        out.contains("restart required: backend ram0")
            && out.contains("past the 128.0 MiB it reserved at start"),
        "{out}"
    );
    let (_, status) = ctl(&d, "status");
    assert!(
        status.contains("past the 128.0 MiB it reserved at start"),
        "waits for a restart: {status}"
    );
    assert!(!status.contains("grow in place"), "not pending: {status}");
    assert_eq!(nsze(&mut c), 32768);

    // 64 MiB fits: every queue serves the new end.
    write_config("size: 64MiB");
    let (ok, out) = ctl(&d, "reload");
    assert!(ok, "{out}");
    assert_eq!(nsze(&mut c), 131072);
    let data = pattern(3, 4096);
    for (i, q) in c.io.iter_mut().enumerate() {
        let lba = 131072 - 8 * (i as u64 + 1);
        assert_ok(
            q.write(1, lba, &data, false).unwrap(),
            "write at the new end",
        );
        let mut buf = vec![0u8; 4096];
        assert_ok(q.read(1, lba, 8, &mut buf).unwrap(), "read at the new end");
        assert!(buf == data, "queue {i}: read back other data");
        let s = q.read(1, 131072, 8, &mut buf).unwrap();
        assert_status(s, Status::LBA_OUT_OF_RANGE, "past the new end");
    }
    let (_, status) = ctl(&d, "status");
    assert!(!status.contains("not running yet"), "{status}");
    let threads = d.log();
    assert!(
        threads.contains("io0: controller") && threads.contains("io1: controller"),
        "the queues are on both IO threads:\n{threads}"
    );

    // Beyond memory and swap: refused as at start-up.
    write_config("size: 64TiB");
    let (ok, out) = ctl(&d, "reload");
    assert!(!ok && out.contains("memory and swap"), "{out}");
    assert_eq!(nsze(&mut c), 131072);
    d.stop();
}
