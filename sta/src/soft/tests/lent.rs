//! Reads sent straight from a RAM namespace (`Cmd::lent`, `tcp_link::flush`): the host
//! gets the store's bytes, the backend queue never sees the read, and a read the socket
//! takes only part of still arrives as one version of every block, whatever is written
//! to those blocks meanwhile. Where the path does not apply (data digest), reads go
//! through the backend queue as before. Each check runs on an anonymous RAM store and on
//! a mapped file (`RamBackend::map_file`, the file backend's store for a file in memory),
//! whose own copies go through the file.

use nvmf::spec::opcodes::io;
use nvmf::spec::Cqe;
use nvmf::tcp::{Digests, Xfer};

use std::io::Write as _;
use std::sync::Arc;

use super::pair::*;
use crate::soft::SoftConfig;

/// A file of the pair's size, filled with zeroes (allocated), mapped as a store; the
/// file stays open for checks of what reached it.
#[allow(unsafe_code)]
fn file_store() -> (Arc<backend::RamBackend>, tempfile::NamedTempFile) {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(&vec![0; (BLOCKS * BLOCK as u64) as usize])
        .expect("fill");
    let file = f.reopen().expect("reopen");
    // SAFETY: the temporary file is this test's own; only the store writes it, and it is
    // never truncated (the test reads it back through another descriptor, read-only).
    let store =
        unsafe { backend::RamBackend::map_file(file, BLOCKS * BLOCK as u64, BLOCK) }.expect("map");
    assert!(store.is_file());
    (store, f)
}

/// A lending pair over an anonymous RAM store, or over a mapped file.
fn lending(file: bool) -> (Pair, Option<tempfile::NamedTempFile>) {
    let cfg = SoftConfig::with_max_io_size(128 << 10);
    if file {
        let (store, f) = file_store();
        (Pair::lending_store(cfg, store), Some(f))
    } else {
        (Pair::lending(cfg), None)
    }
}

fn ok(cqe: &Cqe, what: &str) {
    assert!(cqe.status().is_success(), "{what}: {}", cqe.status());
}

fn reads_in(p: &Pair) -> usize {
    let ops = p.backend_ops.lock().expect("ops");
    ops.iter()
        .filter(|o| matches!(o, backend::Op::Read))
        .count()
}

/// Blocks `lba..lba+nlb` overwritten in the store directly, as a writer on another IO
/// thread would.
fn overwrite(p: &Pair, lba: u64, nlb: u32, seed: u64) {
    let data = pattern(seed, nlb as usize * BLOCK as usize);
    assert!(p.backend.write_blocks(lba, nlb, &data));
}

#[test]
fn reads_are_sent_from_the_store_and_skip_the_backend_queue() {
    reads_skip_the_backend_queue(false);
}

#[test]
fn reads_are_sent_from_a_mapped_file_and_skip_the_backend_queue() {
    reads_skip_the_backend_queue(true);
}

fn reads_skip_the_backend_queue(file: bool) {
    let (mut p, _file) = lending(file);
    let (_, q) = p.controller(Digests::NONE, 63, 0);
    for k in 0..8u64 {
        let (cqe, _) = p.exec(
            q,
            rw(io::WRITE, k * 256, 256),
            Xfer::ToController,
            pattern(k + 1, 128 << 10),
        );
        ok(&cqe, "setup write");
    }
    let before = reads_in(&p);
    // Reads of every size at once (more slices than one writev takes), at odd offsets.
    let sizes = [1u32, 8, 256, 3, 128, 64, 255, 16];
    let mut cids = Vec::new();
    for round in 0..6u64 {
        for (k, &nlb) in sizes.iter().enumerate() {
            let lba = (round * 97 + k as u64 * 211) % (2048 - 256);
            let cid = p.submit(
                q,
                rw(io::READ, lba, nlb),
                Xfer::FromController,
                vec![0; nlb as usize * BLOCK as usize],
            );
            cids.push((cid, lba, nlb));
        }
    }
    for (cid, lba, nlb) in cids {
        let (cqe, data) = p.wait(q, cid);
        ok(&cqe, "read");
        assert_eq!(data, disk(&p, lba, nlb), "read of {nlb} at {lba}");
    }
    assert_eq!(
        reads_in(&p),
        before,
        "a lent read went to the backend queue"
    );
    assert_eq!(p.io.commands_in_flight(), 0);

    // With the data digest the read is copied first (the digest covers the bytes sent).
    let (_, d) = p.controller(
        Digests {
            header: false,
            data: true,
        },
        31,
        0,
    );
    let (cqe, data) = p.exec(
        d,
        rw(io::READ, 256, 256),
        Xfer::FromController,
        vec![0; 128 << 10],
    );
    ok(&cqe, "read with data digest");
    assert_eq!(data, pattern(2, 128 << 10));
    assert_eq!(reads_in(&p), before + 1, "a read with data digest was lent");
}

/// The host's window takes 4 KiB at a time: a 128 KiB read goes out over many passes.
/// Between the first pass (which sent part of it) and the rest, the blocks are
/// overwritten: the host still gets the version that was there when the send began.
#[test]
fn a_read_cut_short_by_the_socket_is_one_version() {
    cut_short_read_is_one_version(false);
}

/// The same from a mapped file: the rest of the read is copied through the file.
#[test]
fn a_read_from_a_mapped_file_cut_short_by_the_socket_is_one_version() {
    cut_short_read_is_one_version(true);
}

fn cut_short_read_is_one_version(file: bool) {
    let (mut p, _file) = lending(file);
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    let (cqe, _) = p.exec(
        q,
        rw(io::WRITE, 512, 256),
        Xfer::ToController,
        pattern(7, 128 << 10),
    );
    ok(&cqe, "setup write");
    p.conns[q].pipe.borrow_mut().host_window = Some(4096);
    let cid = p.submit(
        q,
        rw(io::READ, 512, 256),
        Xfer::FromController,
        vec![0; 128 << 10],
    );
    // Passes until some of the read's data went out, then new data under it.
    let mut passes = 0;
    while p.conns[q].rx.is_empty() && p.conns[q].completions.is_empty() {
        p.pass();
        passes += 1;
        assert!(passes < 100, "the read's data never started");
    }
    overwrite(&p, 512, 256, 9);
    let (cqe, data) = p.wait(q, cid);
    ok(&cqe, "read");
    assert!(
        data == pattern(7, 128 << 10),
        "the read mixed two versions of its blocks"
    );
    // The next read sees the new data.
    p.conns[q].pipe.borrow_mut().host_window = None;
    let (cqe, data) = p.exec(
        q,
        rw(io::READ, 512, 256),
        Xfer::FromController,
        vec![0; 128 << 10],
    );
    ok(&cqe, "read again");
    assert_eq!(data, pattern(9, 128 << 10));
    assert_eq!(p.io.commands_in_flight(), 0);
}

/// A lent read waiting for the socket holds its store through its IO thread's own handle
/// (`ThreadStore`), not through the store's `Arc`, whose count every IO thread serving
/// the namespace would otherwise write at every read.
#[test]
fn a_waiting_lent_read_leaves_the_shared_count_alone() {
    let (mut p, _file) = lending(false);
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    let shared = Arc::strong_count(&p.backend);
    p.conns[q].pipe.borrow_mut().host_window = Some(0);
    let cids: Vec<u16> = (0..4u64)
        .map(|k| {
            p.submit(
                q,
                rw(io::READ, k * 8, 8),
                Xfer::FromController,
                vec![0; 8 * BLOCK as usize],
            )
        })
        .collect();
    for _ in 0..4 {
        p.pass();
    }
    assert_eq!(p.io.commands_in_flight(), 4, "the reads are not waiting");
    assert!(p.conns[q].rx.is_empty(), "the reads went out");
    assert_eq!(
        Arc::strong_count(&p.backend),
        shared,
        "a lent read counted itself on the store's shared Arc"
    );
    p.conns[q].pipe.borrow_mut().host_window = None;
    for (k, cid) in cids.into_iter().enumerate() {
        let (cqe, data) = p.wait(q, cid);
        ok(&cqe, "read");
        assert_eq!(data, disk(&p, k as u64 * 8, 8));
    }
    assert_eq!(Arc::strong_count(&p.backend), shared);
}

/// Real loopback sockets with small buffers, reads from the store while another thread
/// keeps overwriting the same blocks with whole-block patterns: every block of every
/// read is one of the versions written, never a mix (and everything completes). The
/// reads must have seen at least two versions, or nothing was written while they ran.
#[test]
fn lent_reads_over_a_real_socket_never_tear_a_block() {
    lent_reads_never_tear(false);
}

#[test]
fn lent_reads_from_a_mapped_file_over_a_real_socket_never_tear_a_block() {
    lent_reads_never_tear(true);
}

fn lent_reads_never_tear(file: bool) {
    let (mut p, _file) = lending(file);
    p.sockets = true;
    p.socket_buffers = Some(32 << 10);
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    assert!(p.conns[q].sock.is_some(), "a socket connection");
    let store = p.backend.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (stop, written) = (stop.clone(), written.clone());
        std::thread::spawn(move || {
            let mut v = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                v = v.wrapping_add(1);
                assert!(store.write_blocks(0, 512, &[v; 256 << 10]));
                written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
    };
    // The reads start once the writer is writing.
    while written.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        std::thread::yield_now();
    }
    let mut versions = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let cids: Vec<u16> = (0..8u64)
            .map(|k| {
                p.submit(
                    q,
                    rw(io::READ, k * 32, 256),
                    Xfer::FromController,
                    vec![0; 128 << 10],
                )
            })
            .collect();
        for cid in cids {
            let (cqe, data) = p.wait(q, cid);
            ok(&cqe, "read");
            for (b, block) in data.chunks(BLOCK as usize).enumerate() {
                assert!(
                    block.iter().all(|&x| x == block[0]),
                    "block {b} of a read is torn"
                );
                versions.insert(block[0]);
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().expect("writer");
    assert_eq!(p.io.commands_in_flight(), 0);
    assert!(
        versions.len() >= 2,
        "the reads saw only versions {versions:?}: the writer never raced them ({} writes)",
        written.load(std::sync::atomic::Ordering::Relaxed)
    );
}

/// In-capsule writes to a RAM namespace go from the receive buffer straight into the
/// store (no backend request); larger writes (R2T), fused Compare and Write and writes
/// waiting on a fused pair's range still go through the backend queue.
#[test]
fn in_capsule_writes_go_straight_into_the_store() {
    writes_go_into_the_store(false);
}

/// The same into a mapped file, where they land in the file itself.
#[test]
fn in_capsule_writes_go_straight_into_a_mapped_file() {
    writes_go_into_the_store(true);
}

fn writes_go_into_the_store(file: bool) {
    let (mut p, file) = lending(file);
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    let writes_in = |p: &Pair| {
        p.backend_ops
            .lock()
            .expect("ops")
            .iter()
            .filter(|o| matches!(o, backend::Op::Write { .. }))
            .count()
    };
    let before = writes_in(&p);
    let cids: Vec<(u16, u64)> = (0..16u64)
        .map(|k| {
            let lba = k * 37 % 4000;
            let cid = p.submit(
                q,
                rw(io::WRITE, lba, 8),
                Xfer::ToController,
                pattern(k + 50, 4096),
            );
            (cid, lba)
        })
        .collect();
    for (k, (cid, lba)) in cids.into_iter().enumerate() {
        let (cqe, _) = p.wait(q, cid);
        ok(&cqe, "in-capsule write");
        assert_eq!(
            disk(&p, lba, 8),
            pattern(k as u64 + 50, 4096),
            "write at {lba}"
        );
    }
    assert_eq!(
        writes_in(&p),
        before,
        "an in-capsule write went to the backend queue"
    );
    // Past the in-capsule size: R2T, then the backend queue.
    p.conns[q].host.set_max_incapsule(0);
    let (cqe, _) = p.exec(
        q,
        rw(io::WRITE, 100, 8),
        Xfer::ToController,
        pattern(3, 4096),
    );
    ok(&cqe, "R2T write");
    assert_eq!(disk(&p, 100, 8), pattern(3, 4096));
    assert_eq!(writes_in(&p), before + 1);
    if let Some(f) = file {
        // Both kinds of write are in the file, read through another descriptor.
        use std::os::unix::fs::FileExt;
        let mut got = vec![0; 4096];
        let other = std::fs::File::open(f.path()).expect("open");
        other.read_exact_at(&mut got, 100 * 512).expect("read");
        assert_eq!(got, pattern(3, 4096), "the R2T write is not in the file");
        other.read_exact_at(&mut got, 37 * 512).expect("read");
        assert_eq!(
            got,
            pattern(51, 4096),
            "an in-capsule write is not in the file"
        );
    }
}

/// A store whose backend goes (a deleted or shrunk file) while nothing reaches its
/// queue: the periodic check finds it, the namespace stops lending, and its reads fail
/// through the queue with a path error (no DNR, for multipath hosts).
#[test]
fn a_store_whose_backend_is_gone_stops_lending() {
    let (mut p, _file) = lending(true);
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    let (cqe, _) = p.exec(q, rw(io::READ, 0, 8), Xfer::FromController, vec![0; 4096]);
    ok(&cqe, "lent read");
    assert_eq!(reads_in(&p), 0);
    p.backend_gone
        .store(true, std::sync::atomic::Ordering::Relaxed);
    p.advance(std::time::Duration::from_secs(2));
    p.pass();
    let (cqe, _) = p.exec(q, rw(io::READ, 0, 8), Xfer::FromController, vec![0; 4096]);
    let s = cqe.status();
    assert_eq!((s.sct, s.sc, s.dnr), (3, 0x00, false), "{s}");
    let (cqe, _) = p.exec(q, rw(io::WRITE, 0, 8), Xfer::ToController, vec![1; 4096]);
    assert_eq!(
        cqe.status().sct,
        3,
        "an in-capsule write to a gone namespace"
    );
}
