//! The flush list (`Core::tx_ready`): a pass writes the output of the QPs on it and looks
//! at no other QP, so a QP whose output is queued and that is not put on the list is
//! never flushed, and its host waits forever. These tests queue output on a few QPs among
//! many idle ones, from each path that queues it: a response after a backend completion
//! (C2HData + CapsuleResp), an R2T, a command started by the release of another one (past
//! the connection's buffer budget), the application's answer (`rdma_write_send`, between
//! passes), a full pipe retried, and a full socket resumed by EPOLLOUT. Every command must
//! complete with the right data, and only the QPs with work may ever be on the list.
//!
//! Debug builds also check the list against every QP before and after each pass
//! (`StaIo::check_tx_ready`), so every conversation of the other tests checks it too.

use std::collections::HashSet;

use nvmf::spec::opcodes::{admin, io};
use nvmf::spec::{Cqe, Sqe};
use nvmf::tcp::{Digests, Xfer};

use super::pair::*;
use crate::soft::SoftConfig;
use crate::QpHandle;

fn ok(cqe: &Cqe, what: &str) {
    assert!(cqe.status().is_success(), "{what}: {}", cqe.status());
}

fn identify_controller() -> Sqe {
    let mut s = Sqe::default();
    s.set_opcode_cid(admin::IDENTIFY, 0);
    s.cdw10 = 1;
    s
}

/// A pair whose connections hold at most 256 KiB of data buffers each (commands past it
/// wait for a release), with transfers of up to 128 KiB.
fn small_budget_pair() -> Pair {
    Pair::with_config(SoftConfig {
        limits: crate::EngineLimits {
            connection_buffer_bytes: 256 << 10,
            ..Default::default()
        },
        ..SoftConfig::with_max_io_size(128 << 10)
    })
}

#[test]
fn output_from_every_path_reaches_its_host_among_idle_qps() {
    let mut p = small_budget_pair();
    // 40 controllers (80 QPs), all idle once connected.
    let ctrls: Vec<(usize, usize)> = (0..40)
        .map(|_| p.controller(Digests::NONE, 31, 0))
        .collect();
    p.pump();
    assert!(
        p.io.core.tx_ready.is_empty(),
        "idle QPs are left on the flush list"
    );
    p.io.core.tx_listed_log.clear();

    let (_, reader) = ctrls[7];
    let (_, writer) = ctrls[23];
    let (slow_admin, slow) = ctrls[35];
    p.conns[writer].host.set_max_incapsule(0);
    // The slow host's pipe takes 4 KiB at a time: its output is retried pass after pass
    // (a full socket and its EPOLLOUT, in memory).
    p.conns[slow].pipe.borrow_mut().host_window = Some(4096);
    p.conns[slow_admin].pipe.borrow_mut().host_window = Some(512);

    // Known data under the reads.
    for k in 0..8u64 {
        let (cqe, _) = p.exec(
            reader,
            rw(io::WRITE, k * 128, 128),
            Xfer::ToController,
            pattern(100 + k, 64 << 10),
        );
        ok(&cqe, "setup write");
    }
    p.io.core.tx_listed_log.clear();

    let mut reads = Vec::new();
    for (q, base) in [(reader, 0u64), (slow, 512)] {
        for k in 0..8u64 {
            let cid = p.submit(
                q,
                rw(io::READ, base + k * 128, 128),
                Xfer::FromController,
                vec![0; 64 << 10],
            );
            reads.push((q, cid, base + k * 128));
        }
    }
    // 12 writes of 64 KiB by R2T: 768 KiB against a 256 KiB budget, so most of them
    // start (and send their R2T) only when an earlier one is released.
    let mut writes = Vec::new();
    for k in 0..12u64 {
        let lba = 4096 + k * 128;
        let cid = p.submit(
            writer,
            rw(io::WRITE, lba, 128),
            Xfer::ToController,
            pattern(k, 64 << 10),
        );
        writes.push((cid, lba, k));
    }
    // Answered by the application between passes (rdma_write_send), through a pipe that
    // takes 512 bytes at a time.
    let ident: Vec<u16> = (0..3)
        .map(|_| {
            p.submit(
                slow_admin,
                identify_controller(),
                Xfer::FromController,
                vec![0; 4096],
            )
        })
        .collect();

    for (q, cid, lba) in reads.clone() {
        let (cqe, data) = p.wait(q, cid);
        ok(&cqe, "read");
        assert_eq!(data, disk(&p, lba, 128), "read at {lba} on conn {q}");
    }
    for &(cid, lba, k) in &writes {
        let (cqe, _) = p.wait(writer, cid);
        ok(&cqe, "write");
        assert_eq!(disk(&p, lba, 128), pattern(k, 64 << 10), "write at {lba}");
    }
    for cid in ident {
        let (cqe, data) = p.wait(slow_admin, cid);
        ok(&cqe, "identify");
        assert!(data.iter().any(|&b| b != 0), "identify data arrived");
    }
    let hits = crate::Engine::stats(&p.sta).limit_hits();
    assert!(
        hits.iter()
            .any(|&(l, n)| l == crate::Limit::ConnectionBuffers.label() && n > 0),
        "writes waited for the budget: {hits:?}"
    );

    // Only the QPs with work were ever on the list, and each of them was.
    let active: HashSet<QpHandle> = [reader, writer, slow, slow_admin]
        .iter()
        .map(|&c| p.conns[c].qp)
        .collect();
    assert_eq!(p.io.core.tx_listed_log, active, "QPs on the flush list");
    assert!(p.io.core.tx_ready.is_empty(), "flush list drained");
    assert!(!p.io.busy());
    assert_eq!(p.io.commands_in_flight(), 0);

    // The idle ones still answer.
    for &(a, q) in [ctrls[0], ctrls[39]].iter() {
        let (cqe, _) = p.exec(
            a,
            identify_controller(),
            Xfer::FromController,
            vec![0; 4096],
        );
        ok(&cqe, "identify on an idle controller");
        let (cqe, data) = p.exec(q, rw(io::READ, 0, 8), Xfer::FromController, vec![0; 4096]);
        ok(&cqe, "read on an idle controller");
        assert_eq!(data, disk(&p, 0, 8));
    }
}

/// Real loopback sockets with small buffers, among idle socket QPs: the host stops
/// reading, the target's socket fills and the QP waits for EPOLLOUT (off the flush list);
/// when the host reads again, EPOLLOUT puts it back and every byte arrives.
#[test]
fn a_full_socket_is_flushed_again_after_epollout() {
    let mut p = small_budget_pair();
    p.sockets = true;
    p.socket_buffers = Some(64 << 10);
    let ctrls: Vec<(usize, usize)> = (0..8).map(|_| p.controller(Digests::NONE, 31, 0)).collect();
    let (_, q) = ctrls[5];
    assert!(p.conns[q].sock.is_some(), "a socket connection");

    for k in 0..4u64 {
        let (cqe, _) = p.exec(
            q,
            rw(io::WRITE, k * 256, 256),
            Xfer::ToController,
            pattern(k, 128 << 10),
        );
        ok(&cqe, "setup write");
    }
    p.io.core.tx_listed_log.clear();

    // 16 reads of 128 KiB (2 MiB) while the host reads nothing.
    p.conns[q].reading = false;
    let cids: Vec<(u16, u64)> = (0..16u64)
        .map(|k| {
            let lba = (k % 4) * 256;
            let cid = p.submit(
                q,
                rw(io::READ, lba, 256),
                Xfer::FromController,
                vec![0; 128 << 10],
            );
            (cid, lba)
        })
        .collect();
    // Until the target's socket is full and the QP waits for EPOLLOUT.
    let qp = p.conns[q].qp;
    let deadline = std::time::Instant::now() + SOCKET_WAIT;
    let blocked = loop {
        p.pump();
        let b = crate::soft::io::qp_ref(&mut p.io.qps, qp).is_some_and(|x| x.st.tx_blocked());
        if b || std::time::Instant::now() > deadline {
            break b;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    assert!(blocked, "2 MiB of reads did not fill a 64 KiB socket");
    assert!(
        !p.io.core.tx_ready.contains(&qp),
        "a QP waiting for EPOLLOUT is not flushed every pass"
    );

    p.conns[q].reading = true;
    for (cid, lba) in cids {
        let (cqe, data) = p.wait(q, cid);
        ok(&cqe, "read");
        assert_eq!(data, disk(&p, lba, 256), "read at {lba}");
    }
    let others: Vec<QpHandle> = ctrls
        .iter()
        .flat_map(|&(a, b)| [a, b])
        .filter(|&c| c != q)
        .map(|c| p.conns[c].qp)
        .collect();
    assert!(
        others.iter().all(|h| !p.io.core.tx_listed_log.contains(h)),
        "idle socket QPs were on the flush list"
    );
    assert!(p.io.core.tx_ready.is_empty(), "flush list drained");
    assert_eq!(p.io.commands_in_flight(), 0);
}
