//! Hostile and broken peers (issue 11): each test is one thing a peer can do to make the
//! engine hold a resource (command slots, buffers, send queues, time), and checks that
//! the resource is bounded, that the peer loses its own connection (with a C2HTermReq
//! where NVMe/TCP has one), and that nobody else is hurt.
//!
//! Forged traffic goes through [`Conn::send_raw`] on a connection whose host does not
//! read (`reading = false`); what the target wrote is then parsed here by [`wire`].

use std::time::Duration;

use nvmf::spec::fabrics::{self, ConnectCommand, ConnectData, PropertyCommand};
use nvmf::spec::opcodes::{admin, io};
use nvmf::spec::{sgl, SglDescriptor, Sqe, Status};
use nvmf::target::DISCOVERY_NQN;
use nvmf::tcp::{self, fes, Digests, Xfer};
use zerocopy::IntoBytes;

use super::pair::*;

/// Long enough for every deadline the engine may have to pass.
const FOREVER: Duration = Duration::from_secs(3600);

/// One PDU the target sent, as the tests care about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Out {
    R2T { cid: u16, ttag: u16, len: u32 },
    Resp { cid: u16, status: Status },
    C2HData { cid: u16, len: u32 },
    Term { fes: u16, fei: u32 },
    Other(u8),
}

/// Split what the target wrote (no digests) into PDUs.
fn wire(bytes: &[u8]) -> Vec<Out> {
    let mut out = Vec::new();
    let mut b = bytes;
    while b.len() >= 8 {
        let plen = u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as usize;
        assert!(
            plen >= 8 && plen <= b.len(),
            "truncated PDU in {bytes:02x?}"
        );
        let u16at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        out.push(match b[0] {
            tcp::pdu_type::R2T => Out::R2T {
                cid: u16at(8),
                ttag: u16at(10),
                len: u32at(16),
            },
            tcp::pdu_type::CAPSULE_RESP => Out::Resp {
                cid: u16at(8 + 12),
                status: Status::from_field(u16at(8 + 14)),
            },
            tcp::pdu_type::C2H_DATA => Out::C2HData {
                cid: u16at(8),
                len: u32at(16),
            },
            tcp::pdu_type::C2H_TERM_REQ => Out::Term {
                fes: u16at(8),
                fei: u32at(10),
            },
            t => Out::Other(t),
        });
        b = &b[plen..];
    }
    out
}

/// Everything the target wrote to connection `q` since the last call (the host of `q`
/// must not be reading).
fn take_wire(p: &mut Pair, q: usize) -> Vec<Out> {
    let bytes = std::mem::take(&mut p.conns[q].pipe.borrow_mut().to_host);
    wire(&bytes)
}

/// `s` with CID `cid` and SGL1 describing `len` bytes moved by the transport (R2T/H2CData
/// or C2HData): nothing in the capsule.
fn by_transport(mut s: Sqe, cid: u16, len: u32) -> Sqe {
    s.set_opcode_cid(s.opcode(), cid);
    s.cdw0 = (s.cdw0 & !(3 << 14)) | 1 << 14;
    s.dptr = SglDescriptor::unkeyed(
        sgl::TYPE_TRANSPORT_DATA_BLOCK,
        sgl::SUBTYPE_TRANSPORT,
        0,
        len,
    );
    s
}

/// `s` with CID `cid` and `data` in the capsule.
fn in_capsule(mut s: Sqe, cid: u16, len: u32) -> Sqe {
    s.set_opcode_cid(s.opcode(), cid);
    s.cdw0 = (s.cdw0 & !(3 << 14)) | 1 << 14;
    s.dptr = SglDescriptor::unkeyed(sgl::TYPE_DATA_BLOCK, sgl::SUBTYPE_OFFSET, 0, len);
    s
}

/// A capsule PDU of `sqe` with `data` in it (no digests).
fn capsule_pdu(sqe: &Sqe, data: &[u8]) -> Vec<u8> {
    let mut pdu = Vec::new();
    tcp::encode_capsule_cmd(&mut pdu, sqe, data, Digests::NONE, 0);
    pdu
}

/// Queue a capsule on connection `q` (bytes only, the host machine does not know).
fn forge(p: &mut Pair, q: usize, sqe: &Sqe, data: &[u8]) {
    p.conns[q].send_raw(&capsule_pdu(sqe, data));
}

/// A connection past ICReq whose host only sends what the test forges.
fn raw_conn(p: &mut Pair) -> usize {
    let q = p.open(Digests::NONE, 0);
    p.conns[q].reading = false;
    let _ = take_wire(p, q);
    q
}

/// A forged I/O queue `qid` of controller `cntlid` (SQSIZE `sqsize`), Connect answered.
fn raw_io_queue(p: &mut Pair, cntlid: u16, qid: u16, sqsize: u16) -> usize {
    let q = raw_conn(p);
    let cmd = ConnectCommand {
        recfmt: 0,
        qid,
        sqsize,
        cattr: 0,
        kato: 0,
    };
    let data = ConnectData::new([9; 16], cntlid, NQN, HOSTNQN);
    forge(p, q, &in_capsule(cmd.to_sqe(0), 0, 1024), data.as_bytes());
    p.pump();
    let w = take_wire(p, q);
    assert!(
        matches!(w.as_slice(), [Out::Resp { status, .. }] if status.is_success()),
        "I/O Connect: {w:?}"
    );
    q
}

fn set_features_sqe(fid: u8, value: u32) -> Sqe {
    let mut s = Sqe::default();
    s.set_opcode_cid(admin::SET_FEATURES, 0);
    s.cdw10 = fid as u32;
    s.cdw11 = value;
    s
}

/// Before Fabrics Connect a queue has no controller: a capsule that says it carries data
/// must not make the engine solicit it (R2T) or set a buffer aside for it. Only the
/// Connect's own 1024 bytes may be fetched, one Connect at a time.
#[test]
fn no_r2t_and_no_buffers_before_connect() {
    let mut p = Pair::new();
    let before = p.io.buffer_bytes();
    let q = raw_conn(&mut p);
    // Host-to-controller admin commands (Set Features) announcing 1 MiB each.
    for cid in 0..16 {
        forge(
            &mut p,
            q,
            &by_transport(set_features_sqe(0x0e, 0), cid, 1 << 20),
            &[],
        );
    }
    // Connects whose data never comes.
    let connect = ConnectCommand {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    };
    for cid in 16..24 {
        forge(&mut p, q, &by_transport(connect.to_sqe(0), cid, 1024), &[]);
    }
    p.pump();
    let w = take_wire(&mut p, q);
    let r2ts: Vec<&Out> = w.iter().filter(|o| matches!(o, Out::R2T { .. })).collect();
    assert!(
        r2ts.len() <= 1 && r2ts.iter().all(|o| matches!(o, Out::R2T { len: 1024, .. })),
        "at most one R2T, for one Connect's 1024 bytes: {r2ts:?}"
    );
    for cid in 0..16 {
        assert!(
            w.iter().any(|o| matches!(o, Out::Resp { cid: c, status } if *c == cid && *status == Status::COMMAND_SEQUENCE_ERROR)),
            "Set Features {cid} before Connect is answered Command Sequence Error: {w:?}"
        );
    }
    assert!(
        p.io.buffer_bytes() - before <= 64 << 10,
        "{} bytes of buffers held for a queue without a controller",
        p.io.buffer_bytes() - before
    );
}

/// In-capsule data at an offset (the SGL's Address, SGLS bit 20, which Identify offers):
/// the data is the bytes from there to the capsule's end, as nvmet-rdma and SPDK read it.
/// An offset past the data is SGL Offset Invalid. Before: any non-zero offset was
/// refused, though the bit said it was supported.
#[test]
fn in_capsule_data_at_an_offset() {
    let mut p = Pair::new();
    let (a, q) = p.controller(Digests::NONE, 31, 0);
    let cntlid = p.conns[a].cntlid;
    let raw = raw_io_queue(&mut p, cntlid, 2, 15);
    let data = pattern(41, 512);
    let mut capsule = vec![0xeeu8; 16];
    capsule.extend_from_slice(&data);
    let mut w = in_capsule(rw(io::WRITE, 77, 1), 3, 512);
    w.dptr.addr = 16;
    forge(&mut p, raw, &w, &capsule);
    p.pump();
    let out = take_wire(&mut p, raw);
    assert!(
        matches!(out[..], [Out::Resp { cid: 3, status }] if status.is_success()),
        "{out:?}"
    );
    assert_eq!(disk(&p, 77, 1), data, "the bytes from the offset on");
    // Past the end of what came.
    let mut w = in_capsule(io_rw(io::WRITE, 1), 4, 512);
    w.dptr.addr = 600;
    forge(&mut p, raw, &w, &data);
    p.pump();
    let out = take_wire(&mut p, raw);
    assert!(
        matches!(out[..], [Out::Resp { cid: 4, status }] if (status.sct, status.sc) == (0, 0x16)),
        "{out:?}"
    );
    let (cqe, back) = p.exec(q, rw(io::READ, 77, 1), Xfer::FromController, vec![0; 512]);
    assert!(cqe.status().is_success());
    assert_eq!(back, data);
}

/// A host that submits more commands than its queue has entries (SQSIZE + 1) breaks SQ
/// flow control: the connection ends with a C2HTermReq (PDU Sequence Error) instead of
/// the engine handing out slot after slot; the rest of the controller keeps working.
#[test]
fn more_commands_than_the_queue_holds_ends_the_connection() {
    let mut p = Pair::new();
    let (a, q) = p.controller(Digests::NONE, 31, 0);
    let cntlid = p.conns[a].cntlid;
    let bad = raw_io_queue(&mut p, cntlid, 2, 15);
    // 16 entries: writes whose data is not sent keep their slots.
    for cid in 0..16 {
        forge(
            &mut p,
            bad,
            &by_transport(io_rw(io::WRITE, 8), cid, 4096),
            &[],
        );
    }
    p.pump();
    let w = take_wire(&mut p, bad);
    assert!(
        !w.iter().any(|o| matches!(o, Out::Term { .. })),
        "16 commands fit a 16-entry queue: {w:?}"
    );
    forge(
        &mut p,
        bad,
        &by_transport(io_rw(io::WRITE, 8), 16, 4096),
        &[],
    );
    p.pump();
    let w = take_wire(&mut p, bad);
    assert!(
        w.iter()
            .any(|o| matches!(o, Out::Term { fes: f, .. } if *f == fes::PDU_SEQUENCE_ERROR)),
        "the 17th command is a fatal error: {w:?}"
    );
    assert!(p.conns[bad].target_closed());
    assert!(p
        .terminations
        .iter()
        .any(|t| t.qp == p.conns[bad].qp && !t.by_host));
    assert_eq!(p.io.commands_in_flight(), 0, "every slot came back");
    // The controller's other queue is fine.
    let (cqe, _) = p.exec(q, rw(io::READ, 0, 1), Xfer::FromController, vec![0; 512]);
    assert!(cqe.status().is_success(), "{}", cqe.status());
}

/// Before Connect the admin queue's 32 entries are the bound: a peer that does not read
/// its completions cannot keep sending (here the answers to its Keep Alives cannot be
/// written, so their slots stay held until the 33rd command ends the connection).
#[test]
fn more_than_32_commands_before_connect_ends_the_connection() {
    let mut p = Pair::new();
    let q = raw_conn(&mut p);
    let mut ka = Sqe::default();
    ka.set_opcode_cid(admin::KEEP_ALIVE, 0);
    p.conns[q].pipe.borrow_mut().host_window = Some(0);
    for cid in 0..40 {
        forge(&mut p, q, &by_transport(ka, cid, 0), &[]);
    }
    p.pump();
    assert!(p.conns[q].target_closed());
    assert!(
        p.terminations
            .iter()
            .any(|t| t.qp == p.conns[q].qp && !t.by_host && t.fes == fes::PDU_SEQUENCE_ERROR),
        "{:?}",
        p.terminations
    );
    assert_eq!(p.io.commands_in_flight(), 0);
}

/// A controller with an I/O queue `q`, and a second I/O queue `bad` of it whose host
/// sends forged traffic.
fn controller_and_raw_queue() -> (Pair, usize, usize) {
    let mut p = Pair::new();
    let (a, q) = p.controller(Digests::NONE, 31, 0);
    let cntlid = p.conns[a].cntlid;
    let bad = raw_io_queue(&mut p, cntlid, 2, 31);
    (p, q, bad)
}

/// A write of `nlb` 512-byte blocks (CID 0) by R2T on `bad`; the R2T for all of it is
/// the only thing the target sends. Returns its TTAG.
fn write_by_r2t(p: &mut Pair, bad: usize, nlb: u32) -> u16 {
    let len = nlb * 512;
    forge(p, bad, &by_transport(io_rw(io::WRITE, nlb), 0, len), &[]);
    p.pump();
    let w = take_wire(p, bad);
    match w.as_slice() {
        [Out::R2T { ttag, len: l, .. }] if *l == len => *ttag,
        _ => panic!("one R2T for {len} bytes: {w:?}"),
    }
}

/// Past the host-data deadline: a C2HTermReq on `bad`, its connection closed and
/// disconnected, no command left, and queue `q` still serves.
fn host_data_deadline_ends_the_connection(p: &mut Pair, bad: usize, q: usize) {
    p.advance(FOREVER);
    let w = take_wire(p, bad);
    assert!(
        matches!(w.as_slice(), [Out::Term { fes: f, .. }] if *f == fes::PDU_SEQUENCE_ERROR),
        "a C2HTermReq: {w:?}"
    );
    assert!(p.conns[bad].target_closed());
    assert!(p.disconnected.contains(&p.conns[bad].qp));
    assert_eq!(p.io.commands_in_flight(), 0);
    let (cqe, _) = p.exec(q, rw(io::READ, 0, 1), Xfer::FromController, vec![0; 512]);
    assert!(cqe.status().is_success());
}

/// A write whose data never comes (R2T sent, no H2CData): after the host-data deadline
/// the engine gives up on the transfer and the connection, with a C2HTermReq; every slot
/// and buffer comes back; the controller's other queue keeps serving.
#[test]
fn host_data_that_never_comes_times_out() {
    let (mut p, q, bad) = controller_and_raw_queue();
    write_by_r2t(&mut p, bad, 8);
    host_data_deadline_ends_the_connection(&mut p, bad, q);
}

/// A large H2CData PDU whose header and first bytes come and then nothing: the payload
/// is being read straight into the command's buffer (streamed), and the host-data
/// deadline still ends the transfer and the connection with a C2HTermReq; the buffer and
/// the slot come back, the controller's other queue keeps serving.
#[test]
fn host_data_stalled_inside_a_streamed_pdu_times_out() {
    let (mut p, q, bad) = controller_and_raw_queue();
    let before = p.io.buffer_bytes();
    let len = 64 << 10;
    let ttag = write_by_r2t(&mut p, bad, 128);
    let mut pdu = Vec::new();
    tcp::encode_h2c_data(
        &mut pdu,
        0,
        ttag,
        0,
        &vec![5u8; len as usize],
        true,
        Digests::NONE,
        0,
    );
    p.conns[bad].send_raw(&pdu[..pdu.len() / 3]);
    p.pump();
    assert!(
        p.io.buffer_bytes() > before,
        "the streamed payload has a buffer to go to"
    );
    assert!(!p.conns[bad].target_closed());
    host_data_deadline_ends_the_connection(&mut p, bad, q);
}

/// A write capsule that carries its data but whose SGL1 says the data comes by R2T is
/// answered SGL Descriptor Type Invalid (no R2T, the data not taken for something else);
/// the queue goes on.
#[test]
fn in_capsule_data_with_a_transport_sgl_is_refused() {
    let (mut p, _q, bad) = controller_and_raw_queue();
    let mut answer = |sqe: Sqe| {
        forge(&mut p, bad, &sqe, &[0xa5; 4096]);
        p.pump();
        match take_wire(&mut p, bad).as_slice() {
            [Out::Resp { status, .. }] => *status,
            w => panic!("one response: {w:?}"),
        }
    };
    let transport = by_transport(io_rw(io::WRITE, 8), 5, 4096);
    assert_eq!(answer(transport), Status::SGL_DESCRIPTOR_TYPE_INVALID);
    let offset = in_capsule(io_rw(io::WRITE, 8), 6, 4096);
    assert!(answer(offset).is_success());
}

/// A fused pair whose second capsule has an SGL the transport does not take (a data
/// block with an address) fails the second with that error and the first with Aborted -
/// Failed Fused: the first, already paired, used to wait for good.
#[test]
fn a_fused_second_with_a_bad_sgl_takes_its_first_along() {
    let (mut p, _q, bad) = controller_and_raw_queue();
    let mut first = in_capsule(io_rw(io::COMPARE, 1), 7, 512);
    first.cdw0 |= 1 << 8;
    let mut second = in_capsule(io_rw(io::WRITE, 1), 8, 512);
    second.cdw0 |= 2 << 8;
    second.dptr = SglDescriptor::unkeyed(sgl::TYPE_DATA_BLOCK, 0, 0x1000, 512);
    forge(&mut p, bad, &first, &[0; 512]);
    forge(&mut p, bad, &second, &[0; 512]);
    p.pump();
    let mut got: Vec<(u16, Status)> = take_wire(&mut p, bad)
        .into_iter()
        .map(|o| match o {
            Out::Resp { cid, status, .. } => (cid, status),
            o => panic!("only responses: {o:?}"),
        })
        .collect();
    got.sort_by_key(|&(cid, _)| cid);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0], (7, Status::ABORTED_FAILED_FUSED));
    assert_eq!(got[1].0, 8);
    assert!(!got[1].1.is_success(), "{got:?}");
    assert_eq!(p.io.commands_in_flight(), 0);
}

/// A capsule sent in part and then nothing ends its connection once the host-data
/// deadline has passed since its first bytes. A connection whose every pass ends inside
/// a PDU, having finished the one before it, is busy, not stalled: it stays.
#[test]
fn a_pdu_left_unfinished_times_out_but_a_busy_stream_does_not() {
    let mut p = Pair::new();
    let (a, q) = p.controller(Digests::NONE, 31, 0);
    let cntlid = p.conns[a].cntlid;
    let stalled = raw_io_queue(&mut p, cntlid, 2, 31);
    let busy = raw_io_queue(&mut p, cntlid, 3, 31);
    let capsule = |cid: u16| {
        capsule_pdu(
            &in_capsule(io_rw(io::WRITE, 1), cid, 512),
            &[cid as u8; 512],
        )
    };
    let first = capsule(100);
    p.conns[stalled].send_raw(&first[..40]);
    let mut next = capsule(0);
    p.conns[busy].send_raw(&next[..next.len() / 2]);
    p.pump();
    let step = crate::EngineLimits::default().host_data_timeout / 4;
    let rounds = 8u16;
    for cid in 0..rounds {
        p.advance(step);
        let rest = next[next.len() / 2..].to_vec();
        next = capsule(cid + 1);
        p.conns[busy].send_raw(&rest);
        p.conns[busy].send_raw(&next[..next.len() / 2]);
        p.pump();
        assert!(!p.conns[busy].target_closed(), "busy for {} steps", cid + 1);
    }
    assert!(
        p.conns[stalled].target_closed(),
        "the stalled PDU's connection"
    );
    assert!(p.disconnected.contains(&p.conns[stalled].qp));
    assert!(p
        .transport_errors
        .iter()
        .any(|&(h, k)| h == p.conns[stalled].qp
            && k == crate::TransportErrorKind::Limit(crate::Limit::PartialPdu)));
    let done = take_wire(&mut p, busy)
        .iter()
        .filter(|o| matches!(o, Out::Resp { status, .. } if status.is_success()))
        .count();
    assert_eq!(done, rounds as usize, "every finished write was answered");
    let (cqe, _) = p.exec(q, rw(io::READ, 0, 1), Xfer::FromController, vec![0; 512]);
    assert!(cqe.status().is_success());
}

/// A peer that never reads its responses: the engine neither spins on the full socket
/// nor holds the connection forever; after the drain deadline the connection goes and
/// its slots come back. Others are served meanwhile.
#[test]
fn a_peer_that_never_reads_loses_its_connection() {
    let mut p = Pair::new();
    let (a, q) = p.controller(Digests::NONE, 31, 0);
    let cntlid = p.conns[a].cntlid;
    let lazy = raw_io_queue(&mut p, cntlid, 2, 31);
    p.conns[lazy].pipe.borrow_mut().host_window = Some(16 << 10);
    for cid in 0..32 {
        forge(
            &mut p,
            lazy,
            &by_transport(io_rw(io::READ, 64), cid, 64 * 512),
            &[],
        );
    }
    // Settles although output is stuck (pump panics on an engine that never idles).
    p.pump();
    assert!(!p.conns[lazy].target_closed());
    let (cqe, _) = p.exec(q, rw(io::READ, 0, 8), Xfer::FromController, vec![0; 4096]);
    assert!(cqe.status().is_success(), "others are served meanwhile");
    p.advance(FOREVER);
    assert!(
        p.conns[lazy].target_closed(),
        "the stuck connection is closed"
    );
    assert!(p.disconnected.contains(&p.conns[lazy].qp));
    assert_eq!(p.io.commands_in_flight(), 0);
}

/// A connection that never sends its ICReq, and one that stops after it, are closed by
/// their deadlines.
#[test]
fn icreq_and_connect_deadlines() {
    let mut p = Pair::new();
    let silent = p.open_without_icreq(Digests::NONE, 0);
    let idle = p.open(Digests::NONE, 0);
    let (a, _) = p.controller(Digests::NONE, 31, 0);
    p.advance(FOREVER);
    assert!(p.conns[silent].target_closed(), "no ICReq: closed");
    assert!(p.conns[idle].target_closed(), "no Connect: closed");
    assert!(p
        .transport_errors
        .iter()
        .any(|&(h, _)| h == p.conns[silent].qp));
    assert!(!p.conns[a].target_closed(), "a connected queue stays");
}

/// An idle connection costs little: its receive buffer is small until a PDU needs more,
/// and shrinks back once the connection is idle again.
#[test]
fn receive_buffers_grow_on_demand() {
    let mut p = Pair::new();
    let n = 8;
    for _ in 0..n {
        p.admin(Digests::NONE, 31, 0);
    }
    let per = p.io.rx_buffer_bytes() / n;
    assert!(
        per <= 16 << 10,
        "{per} bytes of receive buffer per idle connection"
    );
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    p.conns[q].host.set_max_incapsule(8192);
    let data = pattern(3, 8192);
    let (cqe, _) = p.exec(q, rw(io::WRITE, 0, 16), Xfer::ToController, data);
    assert!(cqe.status().is_success());
    p.advance(Duration::from_secs(5));
    let per = p.io.rx_buffer_bytes() / (n + 2);
    assert!(per <= 16 << 10, "{per} bytes per connection after idling");
}

/// Writes whose data never comes hold no data buffers: three queues full of 1 MiB
/// writes that are never sent do not keep another host's write from being served.
#[test]
fn buffers_are_not_held_for_data_that_never_comes() {
    let mut p = Pair::new();
    let (a, q) = p.controller(Digests::NONE, 127, 0);
    let cntlid = p.conns[a].cntlid;
    let before = p.io.buffer_bytes();
    for qid in 2..5 {
        let bad = raw_io_queue(&mut p, cntlid, qid, 127);
        for cid in 0..128 {
            forge(
                &mut p,
                bad,
                &by_transport(io_rw(io::WRITE, 2048), cid, 1 << 20),
                &[],
            );
        }
    }
    p.pump();
    let data = pattern(7, 1 << 20);
    let (cqe, _) = p.exec(
        q,
        rw(io::WRITE, 4096, 2048),
        Xfer::ToController,
        data.clone(),
    );
    assert!(cqe.status().is_success(), "{}", cqe.status());
    assert_eq!(disk(&p, 4096, 2048), data);
    let held = p.io.buffer_bytes() - before;
    assert!(held <= 16 << 20, "{held} bytes of buffers held");
}

/// An Asynchronous Event Request held across a controller reset, then sent again with
/// the same CID (the host counts the old one as gone): the engine must not keep the old
/// one's slot forever.
#[test]
fn aer_resent_after_reset_does_not_leak_a_slot() {
    let mut p = Pair::new();
    let a = p.admin(Digests::NONE, 31, 0);
    let (cqe, _) = p.exec(a, set_features_sqe(0x0b, 1 << 8), Xfer::None, Vec::new());
    assert!(cqe.status().is_success());
    p.conns[a].reading = false;
    let mut aer = Sqe::default();
    aer.set_opcode_cid(admin::ASYNC_EVENT_REQUEST, 31);
    forge(&mut p, a, &aer, &[]);
    p.pump();
    assert_eq!(p.io.commands_in_flight(), 1, "the AER is held");
    for value in [0u32, fabrics::cc::EN | 6 << 16 | 4 << 20] {
        let prop = PropertyCommand {
            attrib: 0,
            offset: fabrics::property::CC,
            value: value as u64,
        };
        forge(&mut p, a, &prop.to_sqe(1, true), &[]);
        p.pump();
    }
    forge(&mut p, a, &set_features_sqe(0x0b, 1 << 8), &[]);
    forge(&mut p, a, &aer, &[]);
    p.pump();
    let _ = take_wire(&mut p, a);
    assert_eq!(
        p.io.commands_in_flight(),
        1,
        "one AER is outstanding at the host, one slot is held"
    );
    // A namespace change completes it; nothing stays behind.
    p.target
        .add_namespace(
            NQN,
            nvmf::target::NamespaceConfig {
                nsid: 2,
                block_size: 512,
                num_blocks: 8,
                uuid: [4; 16],
                nguid: [5; 16],
                eui64: [6; 8],
                volatile_write_cache: false,
                anagrpid: 0,
                hosts: None,
            },
        )
        .expect("namespace");
    p.advance(Duration::from_millis(1));
    let w = take_wire(&mut p, a);
    assert!(
        w.iter().any(|o| matches!(o, Out::Resp { cid: 31, .. })),
        "{w:?}"
    );
    assert_eq!(p.io.commands_in_flight(), 0, "no slot leaked");
}

/// 10,000 Connects on one connection to the discovery subsystem make one controller, and
/// it goes with the connection.
#[test]
fn connect_flood_on_one_discovery_connection() {
    let mut p = Pair::new();
    let q = raw_conn(&mut p);
    let cmd = ConnectCommand {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    };
    let data = ConnectData::new([9; 16], fabrics::CNTLID_DYNAMIC, DISCOVERY_NQN, HOSTNQN);
    let mut ok = 0;
    for i in 0..10_000u32 {
        forge(
            &mut p,
            q,
            &in_capsule(cmd.to_sqe(0), (i % 32) as u16, 1024),
            data.as_bytes(),
        );
        p.pump();
        for o in take_wire(&mut p, q) {
            match o {
                Out::Resp { status, .. } if status.is_success() => ok += 1,
                Out::Resp { .. } => {}
                o => panic!("{o:?}"),
            }
        }
    }
    assert_eq!(ok, 1, "one Connect succeeds, the others are refused");
    assert_eq!(p.target.report().controllers.len(), 1);
    p.conns[q].close();
    p.pump();
    assert!(p.target.report().controllers.is_empty());
}

/// A controller with KATO 0 (no keep-alive) ends with its admin connection.
#[test]
fn kato_zero_controller_ends_with_its_admin_connection() {
    let mut p = Pair::new();
    let (a, _) = p.controller(Digests::NONE, 31, 0);
    assert_eq!(p.target.report().controllers.len(), 1);
    p.conns[a].close();
    p.pump();
    assert!(p.target.report().controllers.is_empty());
}

/// A backend that vanished (file deleted, device gone) fails I/O with a path error
/// without DNR (Internal Path Error, SCT 3h): a multipath host retries on another path.
#[test]
fn vanished_backend_answers_a_path_error() {
    let mut p = Pair::new();
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    p.backend_gone
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let (cqe, _) = p.exec(q, rw(io::READ, 24, 8), Xfer::FromController, vec![0; 4096]);
    let s = cqe.status();
    assert_eq!((s.sct, s.sc, s.dnr), (3, 0x00, false), "{s}");
    // Reported as the backend's failure, for the Error Information log and the log line.
    let [(_, f)] = p.failed[..] else {
        panic!("one failure reported: {:?}", p.failed)
    };
    assert_eq!(
        (
            f.opcode,
            f.error.cid,
            f.error.lba,
            f.error.status,
            f.from_backend
        ),
        (io::READ, cqe.cid, Some(24), s, true),
        "{f:?}"
    );
}

/// An I/O command with NSID 1 and NLB `nlb` at LBA 0 (CID and SGL set by the caller).
fn io_rw(opcode: u8, nlb: u32) -> Sqe {
    rw(opcode, 0, nlb)
}

/// A host that writes more than its connection's buffer budget at once is slowed, not
/// failed: commands past the budget wait for earlier ones and every write lands.
#[test]
fn a_connection_past_its_buffer_budget_waits_and_completes() {
    let mut p = Pair::with_config(crate::soft::SoftConfig {
        limits: crate::EngineLimits {
            connection_buffer_bytes: 1 << 20,
            ..Default::default()
        },
        ..Default::default()
    });
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    p.conns[q].host.set_max_incapsule(0);
    let mut cids = Vec::new();
    for k in 0..24u64 {
        // 24 writes of 128 KiB: 3 MiB in flight against a 1 MiB budget.
        cids.push((
            k,
            p.submit(
                q,
                rw(io::WRITE, k * 256, 256),
                Xfer::ToController,
                pattern(k, 128 << 10),
            ),
        ));
    }
    for (k, cid) in cids {
        let (cqe, _) = p.wait(q, cid);
        assert!(cqe.status().is_success(), "write {k}: {}", cqe.status());
        assert_eq!(disk(&p, k * 256, 256), pattern(k, 128 << 10));
    }
    let hits = crate::Engine::stats(&p.sta).limit_hits();
    assert!(
        hits.iter()
            .any(|&(l, n)| l == crate::Limit::ConnectionBuffers.label() && n > 0),
        "{hits:?}"
    );
    assert_eq!(p.io.commands_in_flight(), 0);
}

/// Sends a write of `len` bytes by R2T as CID `cid` on connection `c`, then only the first
/// 64 KiB of its data; returns the R2T's TTAG.
fn half_a_write(p: &mut Pair, c: usize, cid: u16, len: u32) -> u16 {
    forge(
        p,
        c,
        &by_transport(io_rw(io::WRITE, len / 512), cid, len),
        &[],
    );
    p.pump();
    let w = take_wire(p, c);
    let Some(&Out::R2T { ttag, .. }) = w.first() else {
        panic!("{w:?}")
    };
    let mut pdu = Vec::new();
    tcp::encode_h2c_data(
        &mut pdu,
        cid,
        ttag,
        0,
        &[1u8; 65536],
        false,
        Digests::NONE,
        0,
    );
    p.conns[c].send_raw(&pdu);
    p.pump();
    ttag
}

/// Sends the rest (past the first 64 KiB) of the data of `half_a_write`'s write of `len`
/// bytes, CID `cid`, R2T `ttag`, on connection `c`.
fn rest_of_the_write(p: &mut Pair, c: usize, cid: u16, ttag: u16, len: u32) {
    for k in 1..len / 65536 {
        let mut pdu = Vec::new();
        tcp::encode_h2c_data(
            &mut pdu,
            cid,
            ttag,
            k * 65536,
            &[2u8; 65536],
            k == len / 65536 - 1,
            Digests::NONE,
            0,
        );
        p.conns[c].send_raw(&pdu);
        p.pump();
    }
}

/// Identify Controller as CID `cid`.
fn identify_controller(cid: u16) -> Sqe {
    let mut s = Sqe::default();
    s.set_opcode_cid(admin::IDENTIFY, cid);
    s.cdw10 = 1;
    s
}

/// A 2 MiB pool (an address's share: 1 MiB, one largest transfer); a controller whose
/// I/O queue (`q`) comes from 10.0.0.2, and two raw I/O queues of it (`hog`, `hog2`)
/// from 10.0.0.1. Returns (pair, q, hog, hog2).
fn two_queues_of_one_address_and_another_host() -> (Pair, usize, usize, usize) {
    let mut p = Pair::with_config(crate::soft::SoftConfig {
        buffer_pool_bytes: 2 << 20,
        ..Default::default()
    });
    let (a, q) = p.controller(Digests::NONE, 31, 0);
    let cntlid = p.conns[a].cntlid;
    let hog = raw_io_queue(&mut p, cntlid, 2, 31);
    let hog2 = raw_io_queue(&mut p, cntlid, 3, 31);
    let attacker: std::net::IpAddr = "10.0.0.1".parse().unwrap();
    for c in [hog, hog2] {
        let h = p.conns[c].qp;
        p.io.set_qp_peer(h, attacker);
    }
    let h = p.conns[q].qp;
    p.io.set_qp_peer(h, "10.0.0.2".parse().unwrap());
    (p, q, hog, hog2)
}

/// One peer address cannot take the thread's pool from the others: its connections
/// together hold at most their share (here 1 MiB of a 2 MiB pool, one largest
/// transfer). A second 1 MiB write on another of its queues waits (no R2T, no buffer)
/// instead of taking the rest of the pool, so another host's write gets a buffer; once
/// the first write completes, the waiting one is started on its own queue.
#[test]
fn one_peer_holds_at_most_its_share_of_the_pool() {
    let (mut p, q, hog, hog2) = two_queues_of_one_address_and_another_host();

    // The first 1 MiB write gets its R2T and its first 64 KiB: 1 MiB of the pool taken.
    let len = 1 << 20;
    let ttag = half_a_write(&mut p, hog, 0, len);
    // The second, on another queue of the same address: it waits for the address's share.
    let mut second = io_rw(io::WRITE, len / 512);
    second.set_opcode_cid(io::WRITE, 1);
    forge(&mut p, hog2, &by_transport(second, 1, len), &[]);
    p.pump();
    assert!(take_wire(&mut p, hog2).is_empty(), "no R2T past the share");
    let hits = crate::Engine::stats(&p.sta).limit_hits();
    assert!(
        hits.iter()
            .any(|&(l, n)| l == crate::Limit::PeerBuffers.label() && n == 1),
        "{hits:?}"
    );

    // Another host's write finds a buffer.
    p.conns[q].host.set_max_incapsule(0);
    let (cqe, _) = p.exec(q, rw(io::WRITE, 0, 8), Xfer::ToController, pattern(1, 4096));
    assert!(cqe.status().is_success(), "{}", cqe.status());
    assert_eq!(disk(&p, 0, 8), pattern(1, 4096));

    // The first write's data ends: it completes, and the second gets its R2T.
    rest_of_the_write(&mut p, hog, 0, ttag, len);
    let w = take_wire(&mut p, hog);
    assert!(
        matches!(w.as_slice(), [Out::Resp { status, .. }] if status.is_success()),
        "{w:?}"
    );
    p.pump();
    let w = take_wire(&mut p, hog2);
    assert!(matches!(w.first(), Some(Out::R2T { cid: 1, .. })), "{w:?}");
}

/// A Get Log Page of `len` bytes (Error Information, past its end zeros).
fn log_page(cid: u16, len: u32) -> Sqe {
    let numd = len / 4 - 1;
    let mut s = Sqe::default();
    s.set_opcode_cid(admin::GET_LOG_PAGE, cid);
    s.nsid = 0xFFFF_FFFF;
    s.cdw10 = 0x01 | (numd & 0xFFFF) << 16;
    s.cdw11 = numd >> 16;
    s
}

/// Admin commands count against a peer's share as I/O does: with its share taken by
/// half a write, the address's 1 MiB Get Log Page waits (no buffer) instead of taking
/// the rest of the pool, so another host's 1 MiB Get Log Page gets one; its small
/// Identify is served from the reserve meanwhile; once the write completes, the waiting
/// command is answered. (Before, admin commands took buffers past every budget, and one
/// address could empty the pool that others' Connects and I/O draw from.)
#[test]
fn a_peers_admin_commands_hold_at_most_its_share_of_the_pool() {
    let mut p = Pair::with_config(crate::soft::SoftConfig {
        buffer_pool_bytes: 2 << 20,
        ..Default::default()
    });
    let (a, _) = p.controller(Digests::NONE, 31, 0);
    let cntlid = p.conns[a].cntlid;
    let hog = raw_io_queue(&mut p, cntlid, 2, 31);
    let attacker: std::net::IpAddr = "10.0.0.1".parse().unwrap();
    for c in [a, hog] {
        let h = p.conns[c].qp;
        p.io.set_qp_peer(h, attacker);
    }
    let b = p.admin(Digests::NONE, 31, 0);
    let h = p.conns[b].qp;
    p.io.set_qp_peer(h, "10.0.0.2".parse().unwrap());

    let len = 1 << 20;
    let ttag = half_a_write(&mut p, hog, 0, len);
    let waiting = p.submit(
        a,
        log_page(0, len),
        Xfer::FromController,
        vec![0; len as usize],
    );
    p.pump();
    assert!(
        !p.conns[a].completions.iter().any(|x| x.0 == waiting),
        "no answer past the share"
    );
    let hits = crate::Engine::stats(&p.sta).limit_hits();
    assert!(
        hits.iter()
            .any(|&(l, n)| l == crate::Limit::PeerBuffers.label() && n == 1),
        "{hits:?}"
    );

    // A small one of the same address (an Identify) is answered at once, from the
    // reserve: it does not wait behind the address's own held buffers.
    let (cqe, data) = p.exec(
        a,
        identify_controller(1),
        Xfer::FromController,
        vec![0; 4096],
    );
    assert!(cqe.status().is_success(), "{}", cqe.status());
    assert_eq!(data.len(), 4096);
    // Its buffer went back to the reserve, and the next one reuses it.
    assert_eq!(p.io.reserve_use(), (4096, 1));
    for _ in 0..3 {
        let (cqe, _) = p.exec(
            a,
            identify_controller(1),
            Xfer::FromController,
            vec![0; 4096],
        );
        assert!(cqe.status().is_success(), "{}", cqe.status());
    }
    assert_eq!(p.io.reserve_use(), (4096, 1));

    // The other host's log page finds the pool's other half.
    let (cqe, back) = p.exec(
        b,
        log_page(0, len),
        Xfer::FromController,
        vec![1; len as usize],
    );
    assert!(cqe.status().is_success(), "{}", cqe.status());
    assert_eq!(back.len(), len as usize);

    // The write's data ends; the waiting log page is answered.
    rest_of_the_write(&mut p, hog, 0, ttag, len);
    let (cqe, _) = p.wait(a, waiting);
    assert!(cqe.status().is_success(), "{}", cqe.status());
    assert_eq!(p.io.commands_in_flight(), 0);
}

/// The thread's pool is exhausted by a host that sent half of a large write: another
/// host's write whose data arrives then gets Command Interrupted (retryable, no DNR),
/// its data is taken off the wire, and its connection keeps working; a new host can
/// still connect and identify the controller.
#[test]
fn pool_exhaustion_fails_the_write_not_the_connection() {
    let mut p = Pair::with_config(crate::soft::SoftConfig {
        buffer_pool_bytes: 1 << 20,
        ..Default::default()
    });
    let (a, q) = p.controller(Digests::NONE, 31, 0);
    let cntlid = p.conns[a].cntlid;
    let hog = raw_io_queue(&mut p, cntlid, 2, 31);
    // A 1 MiB write whose first 64 KiB arrive: its buffer takes the whole pool.
    half_a_write(&mut p, hog, 0, 1 << 20);
    assert!(p.io.buffer_bytes() >= 1 << 20, "the pool is taken");
    p.conns[q].host.set_max_incapsule(0);
    let (cqe, _) = p.exec(q, rw(io::WRITE, 0, 8), Xfer::ToController, pattern(1, 4096));
    assert_eq!(
        cqe.status(),
        Status::COMMAND_INTERRUPTED,
        "{}",
        cqe.status()
    );
    assert!(!cqe.status().dnr);
    // A new host's Connect (its data in the capsule) and its Identify still succeed:
    // small transfers of the application's commands have a reserve of their own.
    let other = p.admin(Digests::NONE, 31, 0);
    let (cqe, data) = p.exec(
        other,
        identify_controller(0),
        Xfer::FromController,
        vec![0; 4096],
    );
    assert!(cqe.status().is_success(), "{}", cqe.status());
    assert_eq!(data.len(), 4096);
    // The reads the host retries with still need buffers: the hog goes (its deadline).
    p.advance(FOREVER);
    assert!(p.conns[hog].target_closed());
    let (cqe, _) = p.exec(q, rw(io::WRITE, 0, 8), Xfer::ToController, pattern(1, 4096));
    assert!(cqe.status().is_success(), "{}", cqe.status());
    assert_eq!(disk(&p, 0, 8), pattern(1, 4096));
}

/// A peer's share lives while a QP or a command of its address does: after the host's
/// connections close (with a command holding buffer bytes, a write whose data never
/// came), nothing of it is left.
#[test]
fn a_peer_share_is_gone_with_its_connections() {
    let mut p = Pair::new();
    p.sockets = true;
    let (a, q) = p.controller(Digests::NONE, 31, 0);
    assert!(p.conns[q].sock.is_some(), "a socket connection");
    assert_eq!(p.io.peer_shares(), 1, "127.0.0.1's share");
    p.conns[q].host.set_max_incapsule(0);
    let (cqe, _) = p.exec(q, rw(io::WRITE, 0, 8), Xfer::ToController, pattern(3, 4096));
    assert!(cqe.status().is_success(), "{}", cqe.status());
    // A 64 KiB write answered by its R2T and never given its data: it holds bytes.
    forge(
        &mut p,
        q,
        &by_transport(io_rw(io::WRITE, 128), 9, 65536),
        &[],
    );
    p.pump();
    p.pump();
    assert!(p.io.buffer_bytes() > 0 || p.io.commands_in_flight() > 0);
    p.conns[q].close();
    p.conns[a].close();
    for _ in 0..100 {
        p.pump();
        if p.io.peer_shares() == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(p.io.peer_shares(), 0, "the share outlived its connections");
}

/// A Connect whose SGL says 1024 bytes of in-capsule data while 512 came is answered by
/// the engine (Data SGL Length Invalid) before the application sees it, and reported to
/// the application, which logs it as a refusal; a well-formed Connect is not reported.
#[test]
fn a_malformed_connect_is_reported_to_the_application() {
    let mut p = Pair::new();
    let q = raw_conn(&mut p);
    let cmd = ConnectCommand {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    };
    let data = ConnectData::new([9; 16], 0xffff, NQN, HOSTNQN);
    forge(
        &mut p,
        q,
        &in_capsule(cmd.to_sqe(0), 0, 1024),
        &data.as_bytes()[..512],
    );
    p.pump();
    let w = take_wire(&mut p, q);
    assert!(
        matches!(w.as_slice(), [Out::Resp { status, .. }] if *status == Status::DATA_SGL_LENGTH_INVALID),
        "{w:?}"
    );
    assert_eq!(
        p.refused_before_connect,
        [(p.conns[q].qp, Status::DATA_SGL_LENGTH_INVALID)]
    );
    // A Connect that is whole reaches the application, which answers it: nothing more.
    let (_, _) = p.controller(Digests::NONE, 31, 0);
    assert_eq!(p.refused_before_connect.len(), 1);
}

/// A forged admin queue of SQSIZE `sqsize` (a new controller of the test host), Connect
/// answered.
fn raw_admin_queue(p: &mut Pair, sqsize: u16) -> usize {
    let q = raw_conn(p);
    let cmd = ConnectCommand {
        recfmt: 0,
        qid: 0,
        sqsize,
        cattr: 0,
        kato: 0,
    };
    let data = ConnectData::new([9; 16], fabrics::CNTLID_DYNAMIC, NQN, HOSTNQN);
    forge(p, q, &in_capsule(cmd.to_sqe(0), 0, 1024), data.as_bytes());
    p.pump();
    let w = take_wire(p, q);
    assert!(
        matches!(w.as_slice(), [Out::Resp { status, .. }] if status.is_success()),
        "admin Connect: {w:?}"
    );
    q
}

/// One address cannot take every command slot of an IO thread (the audit of 2026-11-27:
/// 16 admin queues of 4096 entries, each full of Authentication Sends whose data never
/// comes, left every other host's commands and Connects Command Interrupted). Its
/// connections together hold at most their share; its capsules past it are answered
/// Command Interrupted and counted, and another host's queue, connected before, and a
/// new host's Connect are served meanwhile. Once its connections are gone, so is its
/// share.
#[test]
fn one_peer_holds_at_most_its_share_of_the_command_slots() {
    let mut p = Pair::new();
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    let h = p.conns[q].qp;
    p.io.set_qp_peer(h, "10.0.0.2".parse().unwrap());
    let attacker: std::net::IpAddr = "10.0.0.1".parse().unwrap();
    let send = nvmf::auth::msg::AuthCommand::dhchap(16);
    let (mut held, mut refused) = (0u32, 0u32);
    let mut hogs = Vec::new();
    // 17 x 4096 commands: more than every slot of the thread (65,535).
    for _ in 0..17 {
        let c = raw_admin_queue(&mut p, 4095);
        let qp = p.conns[c].qp;
        p.io.set_qp_peer(qp, attacker);
        for cid in 0..4096u16 {
            forge(
                &mut p,
                c,
                &by_transport(send.to_sqe(cid, true), cid, 16),
                &[],
            );
        }
        p.pump();
        let before = held;
        for o in take_wire(&mut p, c) {
            match o {
                Out::R2T { .. } => held += 1,
                Out::Resp { status, .. } if status == Status::COMMAND_INTERRUPTED => refused += 1,
                other => panic!("{other:?}"),
            }
        }
        hogs.push((c, held > before));
    }
    assert_eq!(
        held,
        super::super::cmd::PEER_CMD_SHARE,
        "slots held by one address"
    );
    assert_eq!(held + refused, 17 * 4096);
    let hits = crate::Engine::stats(&p.sta).limit_hits();
    assert!(
        hits.iter()
            .any(|&(l, n)| l == crate::Limit::PeerCommandSlots.label() && n == refused as u64),
        "{hits:?}"
    );
    assert!(
        hits.iter()
            .all(|&(l, n)| l != crate::Limit::CommandSlots.label() || n == 0),
        "{hits:?}"
    );

    // The other host's queue serves, and a new host connects and serves.
    let (cqe, _) = p.exec(q, rw(io::READ, 0, 1), Xfer::FromController, vec![0; 512]);
    assert!(cqe.status().is_success(), "{}", cqe.status());
    let (_, q2) = p.controller(Digests::NONE, 31, 0);
    let (cqe, _) = p.exec(q2, rw(io::READ, 0, 1), Xfer::FromController, vec![0; 512]);
    assert!(cqe.status().is_success(), "{}", cqe.status());

    // The host-data deadline ends the attacker's connections that held commands (the
    // others have nothing outstanding); the slots come back.
    p.advance(FOREVER);
    for (c, held_some) in hogs {
        assert_eq!(p.conns[c].target_closed(), held_some);
    }
    assert_eq!(p.io.commands_in_flight(), 0);
    let (cqe, _) = p.exec(q, rw(io::READ, 0, 1), Xfer::FromController, vec![0; 512]);
    assert!(cqe.status().is_success(), "{}", cqe.status());
}

/// A Copy's buffers (the data it gathers, one range's read at a time) count against its
/// address's share as host data does: with the share taken by half a write, the
/// address's Copy is answered Command Interrupted instead of taking pool buffers past it
/// (the audit of 2026-11-27: Copies charged only their 32-byte descriptors held 2 MiB each
/// and left other hosts' reads Command Interrupted), and another host's Copy is served.
#[test]
fn a_copy_counts_against_its_peers_share_of_the_pool() {
    let (mut p, q, hog, hog2) = two_queues_of_one_address_and_another_host();

    half_a_write(&mut p, hog, 0, 1 << 20);
    let ranges = nvmf::copy::encode_ranges(&[(100, 8)]);
    let copy = super::access::copy_sqe(1000, 1);
    forge(
        &mut p,
        hog2,
        &in_capsule(copy, 0, ranges.len() as u32),
        &ranges,
    );
    p.pump();
    let w = take_wire(&mut p, hog2);
    assert!(
        matches!(w.as_slice(), [Out::Resp { status, .. }] if *status == Status::COMMAND_INTERRUPTED),
        "{w:?}"
    );
    let hits = crate::Engine::stats(&p.sta).limit_hits();
    assert!(
        hits.iter()
            .any(|&(l, n)| l == crate::Limit::PeerBuffers.label() && n == 1),
        "{hits:?}"
    );

    let (cqe, _) = p.exec(q, copy, Xfer::ToController, ranges);
    assert!(cqe.status().is_success(), "{}", cqe.status());
}
