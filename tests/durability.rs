//! Durability of acknowledged writes on a file-backed namespace across a `kill -9` and a
//! graceful stop of the daemon.
//!
//! Rule checked: a write acknowledged before a successful FLUSH, or acknowledged with FUA,
//! is there after the daemon is killed with SIGKILL right after the acknowledgements and
//! started again on the same file; after a clean SIGTERM stop every acknowledged write is
//! there. (A SIGKILL keeps the kernel's page cache, so this shows the daemon handed the
//! data to the kernel before acknowledging it; a power cut is beyond this test.)

mod common;

use std::time::Duration;

use common::*;
use nvmf::spec::Status;
use nvmf_initiator::{HostOptions, Request};

/// File-backed namespace 1 (512-byte blocks) and a RAM namespace 2.
const CONFIG: &str = "\
io_threads: 2
listeners: [{name: tcp0, transport: tcp, address: 127.0.0.1, port: {port}}]
backends:
  - {name: f0, type: file, path: {dir}/f0.img, size: 64MiB}
  - {name: ram0, type: ram, size: 16MiB, block_size: 512}
subsystems:
  - nqn: nqn.2026-11.dev.nvmf-target:e2e
    allow_any_host: true
    namespaces: [{nsid: 1, backend: f0}, {nsid: 2, backend: ram0}]
";

const REGION: u64 = 256 * 1024;

/// One acknowledged write: where and what.
#[derive(Clone)]
struct Written {
    slba: u64,
    data: Vec<u8>,
}

fn opts() -> HostOptions {
    HostOptions {
        io_max_incapsule: IO_INCAPSULE,
        ..host_opts()
    }
}

/// Writes one pattern per region in `regions` (sizes cycling 512 B..128 KiB), pipelined,
/// alternating two queues; returns them once every write is acknowledged.
fn write_regions(c: &mut Ctrl, regions: &[u64], seed: u64, fua: bool) -> Vec<Written> {
    let sizes = [512usize, 4096, 8192, 12288, 65536, 131072, 1536, 32768];
    let mut per_queue: Vec<Vec<Request>> = vec![Vec::new(), Vec::new()];
    let mut out = Vec::new();
    for (i, &r) in regions.iter().enumerate() {
        let size = sizes[(i + seed as usize) % sizes.len()];
        let slba = r * REGION / 512;
        let data = pattern(seed * 10_000 + r, size);
        per_queue[i % 2].push(Request::write(
            1,
            slba,
            (size / 512) as u32,
            data.clone(),
            fua,
        ));
        out.push(Written { slba, data });
    }
    for (qi, reqs) in per_queue.into_iter().enumerate() {
        for (k, cpl) in run_pipelined(&mut c.io[qi], reqs, 8).iter().enumerate() {
            assert_ok(
                cpl.cqe.status(),
                &format!("write {k} on queue {qi} (fua {fua})"),
            );
        }
    }
    out
}

fn verify(d: &Daemon, expected: &[Written], what: &str) {
    let mut c = controller(d, 1, &opts());
    let q = &mut c.io[0];
    for w in expected {
        let mut back = vec![0u8; w.data.len()];
        let s = q
            .read(1, w.slba, (w.data.len() / 512) as u32, &mut back)
            .expect("read back");
        assert_ok(s, "read back");
        assert!(
            back == w.data,
            "{what}: {} bytes at LBA {} lost or changed (first difference at byte {:?})",
            w.data.len(),
            w.slba,
            back.iter().zip(w.data.iter()).position(|(a, b)| a != b)
        );
    }
}

#[test]
fn acknowledged_writes_survive_kill9() {
    let _w = watchdog("kill9", Duration::from_secs(120));
    let mut d = Daemon::start(CONFIG);

    // Round 1: plain writes then FLUSH on regions 0..40; FUA writes on 40..60; kill -9
    // right after the last acknowledgement.
    let mut c = controller(&d, 2, &opts());
    let plain: Vec<u64> = (0..40).collect();
    let mut expected = write_regions(&mut c, &plain, 1, false);
    assert_ok(c.io[0].flush(1).expect("flush"), "FLUSH");
    let fua: Vec<u64> = (40..60).collect();
    expected.extend(write_regions(&mut c, &fua, 2, true));
    d.kill9();
    drop(c);
    d.restart();
    verify(&d, &expected, "after kill -9 (round 1)");

    // Round 2: overwrite half of the flushed regions with FUA writes and the other half
    // with plain writes and a FLUSH (on the other queue); kill -9; the new data wins.
    let mut c = controller(&d, 2, &opts());
    let evens: Vec<u64> = (0..40).filter(|r| r % 2 == 0).collect();
    let odds: Vec<u64> = (0..40).filter(|r| r % 2 == 1).collect();
    let mut newer = write_regions(&mut c, &evens, 3, true);
    newer.extend(write_regions(&mut c, &odds, 4, false));
    assert_ok(c.io[1].flush(1).expect("flush"), "FLUSH on queue 2");
    d.kill9();
    drop(c);
    d.restart();
    let mut expected2 = newer;
    expected2.extend(
        expected
            .iter()
            .filter(|w| w.slba * 512 / REGION >= 40)
            .cloned(),
    );
    verify(&d, &expected2, "after kill -9 (round 2)");
    d.stop();
}

#[test]
fn acknowledged_writes_survive_sigterm() {
    let _w = watchdog("sigterm", Duration::from_secs(120));
    let mut d = Daemon::start(CONFIG);
    let mut c = controller(&d, 2, &opts());
    // Plain writes, no FLUSH: a graceful stop flushes.
    let regions: Vec<u64> = (0..64).map(|r| r * 3 % 200).collect();
    let mut expected = write_regions(&mut c, &regions, 5, false);
    // Some single-block writes at the very end of the namespace too.
    let last = 64 * 1024 * 1024 / 512 - 1;
    let data = pattern(99, 512);
    assert_ok(
        c.io[1].write(1, last, &data, false).expect("write"),
        "write last LBA",
    );
    expected.push(Written { slba: last, data });
    drop(c);
    d.stop();
    d.restart();
    verify(&d, &expected, "after SIGTERM and restart");
    d.stop();
}

/// A namespace a reload removes is flushed once the engine has drained it, as at a
/// graceful stop: writes the host never flushed must not wait in the page cache after
/// the host lost its means to flush them (the integrity audit of 2026-11-27; nvmet does
/// not flush either). Its data is there when a later reload adds it back.
#[test]
fn a_namespace_removed_by_reload_is_flushed_once_drained() {
    let _w = watchdog("flush_on_removal", Duration::from_secs(60));
    let mut d = Daemon::start(CONFIG);
    let mut c = controller(&d, 2, &opts());
    let regions: Vec<u64> = (0..16).collect();
    let expected = write_regions(&mut c, &regions, 7, false);
    drop(c);
    let without = CONFIG.replace(
        "namespaces: [{nsid: 1, backend: f0}, {nsid: 2, backend: ram0}]",
        "namespaces: [{nsid: 2, backend: ram0}]",
    );
    assert_ne!(without, CONFIG);
    std::fs::write(d.dir().join("nvmf-target.yaml"), d.fill(&without)).unwrap();
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let want = "backend f0: flushed after namespace 1 of subsystem";
    while !d.log().contains(want) {
        assert!(
            std::time::Instant::now() < deadline,
            "no flush after the removal:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(d.dir().join("nvmf-target.yaml"), d.fill(CONFIG)).unwrap();
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while d.log().matches("reload applied").count() < 2 {
        assert!(std::time::Instant::now() < deadline, "{}", d.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    verify(&d, &expected, "after the namespace came back");
    d.stop();
}

/// Issue 11: a backing file deleted under the daemon takes its namespace out end to end:
/// its I/O gets Internal Path Error without DNR (a multipath host fails over; Namespace
/// Not Ready made Linux retry forever on the same path), it leaves the active namespace
/// list, the daemon says why, and the other namespace keeps serving.
#[test]
fn a_deleted_backing_file_takes_its_namespace_out() {
    let _w = watchdog(
        "a_deleted_backing_file_takes_its_namespace_out",
        Duration::from_secs(60),
    );
    let mut d = Daemon::start(CONFIG);
    let mut c = controller(&d, 1, &opts());
    let q = &mut c.io[0];
    assert_ok(
        q.write(1, 0, &pattern(1, 4096), false).expect("write"),
        "write before",
    );
    std::fs::remove_file(d.dir().join("f0.img")).expect("delete the backing file");
    // The file backend notices at the next Flush (or within a second on the I/O path).
    let mut got = None;
    for _ in 0..50 {
        let s = q.flush(1).expect("flush");
        if !s.is_success() {
            got = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let s = got.expect("the deleted file was never noticed");
    assert_status(s, Status::INTERNAL_PATH_ERROR, "flush on a deleted file");
    assert!(
        !s.dnr,
        "Internal Path Error must leave the host free to retry elsewhere"
    );
    // Reads and writes on it get the same answer; the RAM namespace still serves.
    let mut buf = vec![0u8; 4096];
    let mut s = Status::SUCCESS;
    for _ in 0..30 {
        s = q.read(1, 0, 8, &mut buf).expect("read");
        if code(s) == code(Status::INTERNAL_PATH_ERROR) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_status(s, Status::INTERNAL_PATH_ERROR, "read on a lost namespace");
    assert_ok(
        q.write(2, 0, &pattern(2, 4096), false).expect("write ns 2"),
        "RAM namespace",
    );
    // It leaves the active namespace list (Identify CNS 02h), once the daemon took it out.
    let mut active = Vec::new();
    for _ in 0..50 {
        let list = c.admin.identify(0x02, 0).expect("Identify active NS list");
        active = list
            .chunks_exact(4)
            .map(|b| le32(b, 0))
            .take_while(|&n| n != 0)
            .collect();
        if active == [2] {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(active, vec![2], "active namespaces after the file went");
    let log = d.log();
    assert!(
        log.contains("is gone") && log.contains("Internal Path Error"),
        "the daemon says why: {log}"
    );
    // A reload of the same file tries it again, on its backend opened anew (here the
    // file is created again, empty, as at start-up: `size` is set): it is back in the
    // active list and serves, with no restart (before: "reload: no changes", and the
    // namespace stayed out until a restart or two edited reloads).
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let mut back = false;
    for _ in 0..100 {
        let list = c.admin.identify(0x02, 0).expect("Identify active NS list");
        let ids: Vec<u32> = list
            .chunks_exact(4)
            .map(|b| le32(b, 0))
            .take_while(|&n| n != 0)
            .collect();
        if ids == [1, 2] {
            back = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(back, "namespace 1 not back after the reload:\n{}", d.log());
    assert!(
        d.log()
            .contains("taken out earlier (its storage went or hung): tried again"),
        "{}",
        d.log()
    );
    let q = &mut c.io[0];
    assert_ok(
        q.write(1, 0, &pattern(3, 4096), false).expect("write"),
        "write after the reload",
    );
    let mut buf = vec![0u8; 4096];
    assert_ok(
        q.read(1, 0, 8, &mut buf).expect("read"),
        "read after the reload",
    );
    assert!(buf == pattern(3, 4096));
    d.stop();
}
