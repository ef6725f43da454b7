//! The `tcp_queue` harness: whole PDU streams into the controller-side NVMe/TCP queue
//! machine ([`ControllerQueue`]), with a toy engine that answers like the soft engine
//! does: writes (opcode bit 0 set, no in-capsule data) get one R2T for their whole SGL
//! length with the CID as TTAG, commands with in-capsule data or none are answered at
//! once (reads with C2HData of their SGL length, capped), and some commands are answered
//! without a slot. Every answered command is released (`command_released`).
//!
//! Input: `[ctl, step, sqsize, stream...]`.
//!
//! - `ctl` bit 0: the harness prepends a valid ICReq; bits 1-2: its digests; bit 3: SQ
//!   flow control disabled after the first capsule (as Connect would); bits 4-7: HPDA.
//! - `step`: the chunked pass feeds the stream `step` bytes at a time (0: one byte).
//! - `sqsize`: the SQSIZE given to the machine after the first capsule.
//!
//! Checks, besides "no panic":
//!
//! - progress: `receive` consumes at most what is buffered, returns `(0, None)` only when
//!   more bytes are needed or input is over, and nothing after a fatal error;
//! - accounting: host data is only reported for a TTAG the engine solicited, inside the
//!   solicited range, contiguous, and the transfer completes exactly at its end;
//! - output: everything the machine writes parses with a host-side framer (ICResp first,
//!   then CapsuleResp/C2HData/R2T/C2HTermReq), every C2HTermReq is last and carries at
//!   most 128 bytes, SQHD is FFFFh with flow control disabled and otherwise the count of
//!   capsules received when the completion was sent, modulo SQSIZE + 1, the completions
//!   are the engine's answers in the order it gave them, and no command is completed
//!   twice: a CID gets no more completions (CapsuleResp, or C2HData with SUCCESS) than
//!   capsules came with it (a host may reuse a CID once its command completed); SUCCESS only on completions with DW0 zero (the
//!   engine sets DW0 for odd CIDs); C2HData carries the engine's bytes at DATAO; R2Ts
//!   ask for what the engine asked (TTAG = CID, offset 0); on a connection that did not
//!   end, every command but a write still waiting for its data got exactly one
//!   completion;
//! - flow control: the engine releases each command once answered, and the machine
//!   refuses a capsule for queue overflow only with all SQSIZE + 1 entries in use;
//! - chunking: feeding the stream in pieces gives the same events and output as whole;
//! - streaming: a third pass feeds the pieces to a machine that streams H2CData
//!   ([`ControllerQueue::set_stream_host_data`]); its payload is accounted piece by piece
//!   with the same checks, and without a fatal error in either pass it gives the same
//!   output and the same per-PDU host-data verdicts as the whole pass.

use std::collections::HashMap;

use nvmf::queue::QueueParams;
use nvmf::spec::{Cqe, Sqe, Status};
use nvmf::tcp::{
    self, ControllerEvent, ControllerLimits, ControllerQueue, Digests, FatalCause, HostLimits,
    IcReq, Pdu, RxFramer, TxSink,
};

const LIMITS: ControllerLimits = ControllerLimits {
    max_h2c_data: 4096,
    max_incapsule_data: 8192,
    cpda: 0,
};

/// Output as one byte stream; data references are filled with a pattern of the slot.
#[derive(Default, PartialEq, Eq, Debug)]
struct Wire {
    bytes: Vec<u8>,
    released: Vec<u32>,
}

impl TxSink for Wire {
    fn header(&mut self, b: &[u8]) {
        self.bytes.extend_from_slice(b);
    }
    fn data(&mut self, slot: u32, off: u32, len: u32) {
        self.bytes
            .extend((off..off + len).map(|i| (i as u8) ^ (slot as u8)));
    }
    fn release(&mut self, slot: u32) {
        self.released.push(slot);
    }
}

fn slot_data(slot: u32, len: usize) -> Vec<u8> {
    (0..len as u32).map(|i| (i as u8) ^ (slot as u8)).collect()
}

#[derive(Default)]
struct Engine {
    /// ttag -> (next offset, end)
    xfers: HashMap<u16, (u32, u32)>,
    capsules: usize,
    /// Capsules received per CID.
    cids: HashMap<u16, u32>,
    /// Commands taken and not answered yet (the machine's count, kept independently).
    outstanding: u32,
    /// The connection ended (a fatal error or the host's TermReq).
    ended: bool,
    /// The engine's answers in the order it gave them: the CID, and the SQHD the
    /// completion must carry with SQ flow control on (capsules received by then, modulo
    /// SQSIZE + 1).
    answers: Vec<(u16, u16)>,
    /// The HPDA of the ICReq the machine accepted (the harness's or the input's own),
    /// which places the data of every C2HData it sends.
    hpda: u8,
    events: Vec<String>,
    out: Wire,
}

impl Engine {
    /// Notes the answer about to be given to command `cid`: its completion is the next
    /// one on the wire (a CapsuleResp, or C2HData with SUCCESS), and the command is no
    /// longer outstanding.
    fn answer(&mut self, s: &Setup, cid: u16) {
        self.outstanding -= 1;
        let entries = u32::from(s.sqsize) + 1;
        self.answers
            .push((cid, (self.capsules as u32 % entries) as u16));
    }
}

fn pass(q: &mut ControllerQueue, e: &mut Engine, stream: &[u8], step: usize, setup: &Setup) {
    pass_with(q, e, stream, step, setup, false)
}

fn pass_with(
    q: &mut ControllerQueue,
    e: &mut Engine,
    stream: &[u8],
    step: usize,
    setup: &Setup,
    normalize: bool,
) {
    let mut buf: Vec<u8> = Vec::new();
    let mut fed = 0;
    loop {
        if fed < stream.len() {
            let n = step.max(1).min(stream.len() - fed);
            buf.extend_from_slice(&stream[fed..fed + n]);
            fed += n;
        }
        loop {
            if let Some(f) = q.inflow() {
                // Streamed payload: account it as the engine would put it in place.
                assert!(!f.discard, "no transfer is cancelled here");
                let Some(x) = e.xfers.get_mut(&f.ttag) else {
                    panic!("streamed data for unsolicited TTAG {}", f.ttag);
                };
                assert_eq!(f.offset, x.0, "streamed data not contiguous");
                let n = buf.len().min(f.len as usize);
                if n == 0 {
                    break;
                }
                assert_eq!(q.inflow_received(&buf[..n]), n);
                x.0 += n as u32;
                assert!(x.0 <= x.1, "streamed data past the R2T");
                buf.drain(..n);
                continue;
            }
            let (used, ev) = q.receive(&buf, &mut e.out);
            assert!(used <= buf.len(), "consumed more than buffered");
            let Some(ev) = ev else {
                assert_eq!(used, 0);
                if !q.stopped() {
                    assert!(q.needed() > buf.len(), "stalled with a whole PDU buffered");
                }
                break;
            };
            match ev {
                // One verdict per H2CData PDU, however it came in.
                ControllerEvent::HostDataStart { .. } if normalize => {}
                ControllerEvent::HostData { ttag, complete, .. } if normalize => {
                    e.events.push(format!("HostData {ttag} {complete:?}"))
                }
                _ => e.events.push(format!("{ev:?}")),
            }
            handle(q, e, ev, setup);
            buf.drain(..used);
        }
        if q.stopped() {
            assert_eq!(
                q.receive(&buf, &mut e.out),
                (0, None),
                "input after the end"
            );
            return;
        }
        if fed == stream.len() {
            return;
        }
    }
}

fn handle(q: &mut ControllerQueue, e: &mut Engine, ev: ControllerEvent<'_>, s: &Setup) {
    match ev {
        ControllerEvent::Command { sqe, data, .. } => {
            e.capsules += 1;
            e.outstanding += 1;
            *e.cids.entry(sqe.cid()).or_default() += 1;
            if e.capsules == 1 {
                q.set_params(QueueParams {
                    qid: 1,
                    sqsize: s.sqsize,
                    sq_flow_control_disabled: s.no_flow_control,
                });
            }
            let cid = sqe.cid();
            let len = sqe.dptr.length().min(1 << 16);
            let write = sqe.opcode() & 1 != 0;
            if write && data.is_empty() && len > 0 && !e.xfers.contains_key(&cid) {
                e.xfers.insert(cid, (0, len));
                q.request_data(&mut e.out, cid, cid, 0, len);
            } else if cid % 7 == 3 {
                e.answer(s, cid);
                q.respond_untracked(&mut e.out, Cqe::new(cid, Status::INVALID_FIELD));
            } else {
                let n = if write { 0 } else { len.min(8192) as usize };
                let mut cqe = Cqe::success(cid);
                // Odd CIDs complete with DW0 set: their completion may not ride on
                // C2HData's SUCCESS flag.
                cqe.dw0 = (cid % 2) as u32;
                e.answer(s, cid);
                q.respond(&mut e.out, cid as u32, cqe, &slot_data(cid as u32, n));
                // The soft engine releases a command once its response is out.
                q.command_released();
            }
        }
        ControllerEvent::HostData {
            ttag,
            offset,
            data,
            complete,
        } => {
            let Some(&(next, end)) = e.xfers.get(&ttag) else {
                panic!("host data for unsolicited TTAG {ttag}");
            };
            assert_eq!(offset, next, "host data not contiguous");
            let new = offset as u64 + data.len() as u64;
            assert!(new <= end as u64, "host data past the R2T");
            assert_eq!(
                complete.is_some(),
                new == end as u64,
                "completion at the end"
            );
            if complete.is_some() {
                e.xfers.remove(&ttag);
                e.answer(s, ttag);
                q.respond(&mut e.out, ttag as u32, Cqe::success(ttag), &[]);
                q.command_released();
            } else {
                e.xfers.insert(ttag, (new as u32, end));
            }
        }
        ControllerEvent::HostDataStart { ttag, offset, len } => {
            let Some(&(next, end)) = e.xfers.get(&ttag) else {
                panic!("streamed PDU for unsolicited TTAG {ttag}");
            };
            assert_eq!(offset, next, "streamed PDU not contiguous");
            assert!(
                offset as u64 + len as u64 <= end as u64,
                "streamed PDU past the R2T"
            );
        }
        ControllerEvent::Fatal { cause, .. } => {
            assert!(q.stopped());
            e.ended = true;
            if cause == FatalCause::QueueOverflow {
                assert!(
                    e.outstanding > u32::from(s.sqsize),
                    "queue overflow with {} of SQSIZE {} + 1 entries in use",
                    e.outstanding,
                    s.sqsize
                );
            }
            e.xfers.clear();
        }
        ControllerEvent::HostTerminated { .. } => {
            assert!(q.stopped());
            e.ended = true;
            e.xfers.clear();
        }
        ControllerEvent::Connected(r) => e.hpda = r.hpda,
    }
}

/// Where the C2HTermReq starts in the output, if there is one (it is always last).
fn term_req_start(out: &[u8], hpda: u8) -> Option<usize> {
    let mut f = RxFramer::new_host(HostLimits {
        hpda,
        max_c2h_data: 1 << 20,
    });
    let mut at = 0;
    while at < out.len() {
        let Ok(Some((pdu, n))) = f.parse(&out[at..]) else {
            return None;
        };
        match pdu {
            Pdu::IcResp(r) => f.set_digests(r.digests),
            Pdu::C2HTermReq { .. } => return Some(at),
            _ => {}
        }
        at += n;
    }
    None
}

/// Parse the machine's output as a host would.
fn check_output(w: &Wire, s: &Setup, digests: Digests, e: &Engine) {
    let cids = &e.cids;
    let mut f = RxFramer::new_host(HostLimits {
        hpda: e.hpda,
        max_c2h_data: 1 << 20,
    });
    let mut b = &w.bytes[..];
    let mut answers = e.answers.iter().copied();
    // Completions seen per CID.
    let mut done: HashMap<u16, u32> = HashMap::new();
    // A completion on the wire: the engine's next answer, in order. Returns its SQHD.
    let mut complete = |cid: u16, what: &str| {
        let n = done.entry(cid).or_default();
        *n += 1;
        let capsules = cids.get(&cid).copied().unwrap_or(0);
        assert!(
            *n <= capsules,
            "{what}: completion {n} for CID {cid}, which came in {capsules} capsule(s)"
        );
        let Some((want, sqhd)) = answers.next() else {
            panic!("{what} for CID {cid}: the engine gave no more answers");
        };
        assert_eq!(
            cid, want,
            "{what} for CID {cid}: the engine's next answer is for CID {want}"
        );
        sqhd
    };
    while !b.is_empty() {
        let (pdu, n) = match f.parse(b) {
            Ok(Some(x)) => x,
            Ok(None) => panic!("output ends inside a PDU"),
            Err(e) => panic!("output does not parse: {e}"),
        };
        match pdu {
            Pdu::IcResp(r) => f.set_digests(r.digests),
            Pdu::C2HTermReq { .. } => {
                assert!(n <= tcp::TERM_REQ_MAX_PLEN);
                assert_eq!(n, b.len(), "C2HTermReq is the last PDU");
            }
            Pdu::CapsuleResp { cqe } => {
                let want = complete(cqe.cid, "CapsuleResp");
                // Every completion goes out after the first capsule set the parameters.
                if s.no_flow_control {
                    assert_eq!(cqe.sqhd, 0xffff);
                } else {
                    assert_eq!(cqe.sqhd, want, "SQHD of the completion for CID {}", cqe.cid);
                }
            }
            Pdu::C2HData {
                cccid,
                datao,
                data,
                success,
                data_digest_ok,
                ..
            } => {
                assert!(
                    data_digest_ok || !digests.data,
                    "our own data digest is wrong"
                );
                // The engine's data is its slot's pattern (slot = CID), from DATAO on.
                for (i, &b) in data.iter().enumerate() {
                    let want = (datao as usize + i) as u8 ^ cccid as u8;
                    assert_eq!(b, want, "C2HData byte {i} at DATAO {datao} for CID {cccid}");
                }
                if success {
                    assert!(s.no_flow_control, "SUCCESS with SQ flow control on");
                    assert_eq!(cccid % 2, 0, "SUCCESS on a completion with DW0 set");
                    complete(cccid, "C2HData with SUCCESS");
                }
            }
            Pdu::R2T {
                cccid,
                ttag,
                r2to,
                r2tl,
            } => {
                // The engine asks for a write's whole SGL length at once, TTAG = CID.
                assert_eq!((ttag, r2to), (cccid, 0), "R2T fields");
                assert!((1..=1 << 16).contains(&r2tl), "R2TL {r2tl}");
            }
            other => panic!("controller sent {other:?}"),
        }
        b = &b[n..];
    }
    // Every answer went out (before any C2HTermReq); on a connection that did not end,
    // every command got its completion, except writes still waiting for their data.
    let left = answers.count();
    assert_eq!(left, 0, "{left} answer(s) of the engine never went out");
    if !e.ended {
        for (&cid, &capsules) in cids {
            let waiting = u32::from(e.xfers.contains_key(&cid));
            let got = done.get(&cid).copied().unwrap_or(0);
            assert_eq!(
                got,
                capsules - waiting,
                "CID {cid}: {got} completion(s) for {capsules} capsule(s), {waiting} waiting"
            );
        }
    }
}

#[derive(Clone, Copy)]
struct Setup {
    hpda: u8,
    sqsize: u16,
    no_flow_control: bool,
}

pub fn run(data: &[u8]) {
    let mut inp = crate::Input::new(data);
    let ctl = inp.u8();
    let step = inp.u8() as usize;
    let sqsize = (inp.u8() as u16).max(1);
    let digests = Digests {
        header: ctl & 2 != 0,
        data: ctl & 4 != 0,
    };
    let s = Setup {
        hpda: (ctl >> 4).min(tcp::MAX_PDA),
        sqsize,
        no_flow_control: ctl & 8 != 0,
    };
    let mut stream = Vec::new();
    if ctl & 1 != 0 {
        tcp::encode_ic_req(
            &mut stream,
            &IcReq {
                pfv: 0,
                hpda: s.hpda,
                digests,
                maxr2t: 0,
            },
        );
    }
    stream.extend_from_slice(inp.rest());

    let mut whole_q = ControllerQueue::new(LIMITS);
    let mut whole = Engine::default();
    pass(&mut whole_q, &mut whole, &stream, usize::MAX, &s);
    let mut chunked_q = ControllerQueue::new(LIMITS);
    let mut chunked = Engine::default();
    pass(&mut chunked_q, &mut chunked, &stream, step, &s);
    let mut streamed_q = ControllerQueue::new(LIMITS);
    streamed_q.set_stream_host_data(1);
    let mut streamed = Engine::default();
    pass_with(&mut streamed_q, &mut streamed, &stream, step, &s, true);
    check_output(&streamed.out, &s, streamed_q.digests(), &streamed);
    let mut whole_n = Engine::default();
    pass_with(
        &mut ControllerQueue::new(LIMITS),
        &mut whole_n,
        &stream,
        usize::MAX,
        &s,
        true,
    );
    // A PDU refused at its header is refused before its payload when streamed, so the
    // two may differ only when one of them ended the connection.
    if term_req_start(&whole.out.bytes, whole.hpda).is_none()
        && term_req_start(&streamed.out.bytes, streamed.hpda).is_none()
    {
        assert_eq!(
            whole_n.events, streamed.events,
            "streaming changed the events"
        );
        assert_eq!(whole.out, streamed.out, "streaming changed the output");
    }
    assert_eq!(whole.events, chunked.events, "chunking changed the events");
    assert_eq!(whole.out.released, chunked.out.released);
    // A C2HTermReq echoes as much of the offending header as had arrived when the error
    // was found (a bad common header is refused as soon as its 8 bytes are in), so only
    // its data may be shorter when fed in pieces.
    let (w, c) = (&whole.out.bytes, &chunked.out.bytes);
    match term_req_start(w, whole.hpda) {
        Some(t) => {
            // Everything before it, its type/flags/HLEN, FES and FEI agree (PLEN differs
            // with the data length).
            assert_eq!(
                &w[..t + 4],
                &c[..(t + 4).min(c.len())],
                "chunking changed the output"
            );
            assert_eq!(
                &w[t + 8..t + 14],
                &c[(t + 8).min(c.len())..(t + 14).min(c.len())]
            );
            assert!(
                w[t + 24..].starts_with(&c[(t + 24).min(c.len())..]),
                "TermReq data"
            );
        }
        None => assert_eq!(w, c, "chunking changed the output"),
    }
    check_output(&whole.out, &s, whole_q.digests(), &whole);
}

/// Valid streams: connection setup, capsules with and without data, writes answered by
/// H2CData in pieces, with each digest combination and flow-control mode.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for dig in 0..4u8 {
        let d = Digests {
            header: dig & 1 != 0,
            data: dig & 2 != 0,
        };
        for fc in [0u8, 8] {
            let mut c = vec![1 | dig << 1 | fc, 5, 31];
            let mut sqe = Sqe::default();
            sqe.set_opcode_cid(0x02, 1);
            sqe.dptr = nvmf::spec::SglDescriptor::unkeyed(0x5, 0xa, 0, 512);
            tcp::encode_capsule_cmd(&mut c, &sqe, &[], d, 0);
            // A write of 6000 bytes on R2T (CID 2 = TTAG 2), in two H2CData PDUs.
            sqe.set_opcode_cid(0x01, 2);
            sqe.dptr = nvmf::spec::SglDescriptor::unkeyed(0x5, 0xa, 0, 6000);
            tcp::encode_capsule_cmd(&mut c, &sqe, &[], d, 0);
            tcp::encode_h2c_data(&mut c, 2, 2, 0, &[7; 4096], false, d, 0);
            tcp::encode_h2c_data(&mut c, 2, 2, 4096, &[7; 1904], true, d, 0);
            // In-capsule write, then a bad H2CData.
            sqe.set_opcode_cid(0x01, 4);
            sqe.dptr = nvmf::spec::SglDescriptor::unkeyed(0x0, 0x1, 0, 100);
            tcp::encode_capsule_cmd(&mut c, &sqe, &[1; 100], d, 0);
            tcp::encode_h2c_data(&mut c, 9, 9, 0, &[7; 64], true, d, 0);
            v.push(c);
        }
    }
    // The harness's ICReq off: the stream starts with whatever the fuzzer wrote.
    let mut raw = vec![0u8, 1, 7];
    tcp::encode_ic_req(&mut raw, &IcReq::default());
    tcp::encode_term_req(&mut raw, false, 1, 0, &[]);
    v.push(raw);
    // The input's own ICReq (HPDA 0) while `ctl` names HPDA 3, then a read: its C2HData
    // is placed by the HPDA the machine accepted, not by `ctl`'s.
    let mut own = vec![0x30u8, 5, 31];
    tcp::encode_ic_req(&mut own, &IcReq::default());
    let mut sqe = Sqe::default();
    sqe.set_opcode_cid(0x02, 1);
    sqe.dptr = nvmf::spec::SglDescriptor::unkeyed(0x5, 0xa, 0, 512);
    tcp::encode_capsule_cmd(&mut own, &sqe, &[], Digests::NONE, 0);
    v.push(own);
    // SQSIZE 1 (two entries): a write waits for its data while a read comes and goes, the
    // data completes it, then two writes fill the queue and a third capsule overflows it.
    let mut full = vec![1u8, 5, 1];
    let w = |c: &mut Vec<u8>, cid: u16| {
        let mut sqe = Sqe::default();
        sqe.set_opcode_cid(0x01, cid);
        sqe.dptr = nvmf::spec::SglDescriptor::unkeyed(0x5, 0xa, 0, 512);
        tcp::encode_capsule_cmd(c, &sqe, &[], Digests::NONE, 0);
    };
    w(&mut full, 2);
    tcp::encode_capsule_cmd(&mut full, &sqe, &[], Digests::NONE, 0);
    tcp::encode_h2c_data(&mut full, 2, 2, 0, &[7; 512], true, Digests::NONE, 0);
    w(&mut full, 4);
    w(&mut full, 6);
    tcp::encode_capsule_cmd(&mut full, &sqe, &[], Digests::NONE, 0);
    v.push(full);
    v
}
