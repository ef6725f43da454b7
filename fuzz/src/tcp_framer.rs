//! The `tcp_framer` harness: a byte stream into [`RxFramer`], controller or host side.
//!
//! Input: `[ctl, step, lim, stream...]`.
//!
//! - `ctl` bit 0: host role; bit 1: the harness prepends a valid ICReq/ICResp; bits 2-3:
//!   the digests that IC asks for; bits 4-7: the framer's PDA (CPDA/HPDA).
//! - `step`: the chunked pass feeds the stream `step` bytes at a time (0: one byte).
//! - `lim`: in-capsule data and H2C/C2H data limits.
//!
//! Checks, besides "no panic":
//!
//! - progress: `Ok(Some)` consumes 1..=buffered bytes; `Ok(None)` asks for more than is
//!   buffered; an error is sticky and its `header_len` fits the buffer and 128 bytes;
//! - limits: data lengths within the framer's configured limits, DATA PDUs non-empty;
//! - chunking: feeding the stream in pieces yields the same PDUs and the same error
//!   (FES/FEI) as feeding it whole;
//! - re-encoding: every parsed PDU, encoded again with `nvmf::tcp::encode_*` and parsed by
//!   a fresh framer in the same state, gives the same PDU back.

use nvmf::spec::{Cqe, Sqe};
use nvmf::tcp::{self, ControllerLimits, Digests, HostLimits, IcReq, IcResp, Pdu, RxFramer};

#[derive(Clone, Copy)]
struct Setup {
    host: bool,
    pda: u8,
    max_incapsule: u32,
    max_data: u32,
}

impl Setup {
    fn framer(&self) -> RxFramer {
        if self.host {
            RxFramer::new_host(HostLimits {
                hpda: self.pda,
                max_c2h_data: self.max_data,
            })
        } else {
            RxFramer::new_controller(ControllerLimits {
                max_h2c_data: self.max_data,
                max_incapsule_data: self.max_incapsule,
                cpda: self.pda,
            })
        }
    }
}

/// What one pass saw: the PDUs (debug-printed, data included) and how it ended.
#[derive(Debug, PartialEq, Eq)]
struct Trace {
    pdus: Vec<String>,
    /// FES, FEI, send_term_req of the error, if any.
    error: Option<(u16, u32, bool)>,
}

/// The transport's part after an IC PDU: adopt the negotiated digests.
fn after_ic(f: &mut RxFramer, pdu: &Pdu) {
    match pdu {
        Pdu::IcReq(r) => f.set_digests(r.digests),
        Pdu::IcResp(r) => f.set_digests(r.digests),
        _ => {}
    }
}

fn check_pdu(s: &Setup, pdu: &Pdu) {
    match *pdu {
        Pdu::CapsuleCmd { data, .. } => {
            assert!(!s.host);
            assert!(
                data.len() as u64 <= s.max_incapsule as u64,
                "in-capsule data over limit"
            );
        }
        Pdu::H2CData { data, .. } => {
            assert!(!s.host);
            assert!(!data.is_empty() && data.len() as u64 <= s.max_data as u64);
        }
        Pdu::C2HData { data, .. } => {
            assert!(s.host);
            assert!(!data.is_empty() && data.len() as u64 <= s.max_data as u64);
        }
        Pdu::IcReq(_) | Pdu::H2CTermReq { .. } => assert!(!s.host),
        // This harness never turns streaming on (tcp_queue does).
        Pdu::H2CDataHead { .. } | Pdu::H2CDataTail { .. } => panic!("streamed without asking"),
        Pdu::IcResp(_) | Pdu::CapsuleResp { .. } | Pdu::R2T { .. } | Pdu::C2HTermReq { .. } => {
            assert!(s.host)
        }
    }
}

/// Encodes `pdu` as a peer would with the negotiated digests; `None` for IC/TermReq
/// (their encoders are checked by the unit tests, and they change framer state).
fn reencode(pdu: &Pdu, d: Digests, pda: u8) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match *pdu {
        Pdu::CapsuleCmd { sqe, data, .. } => tcp::encode_capsule_cmd(&mut out, &sqe, data, d, pda),
        Pdu::H2CData {
            cccid,
            ttag,
            datao,
            data,
            last,
            ..
        } => tcp::encode_h2c_data(&mut out, cccid, ttag, datao, data, last, d, pda),
        Pdu::CapsuleResp { cqe } => tcp::encode_capsule_resp(&mut out, &cqe, d),
        Pdu::C2HData {
            cccid,
            datao,
            data,
            last,
            success,
            ..
        } => tcp::encode_c2h_data(&mut out, cccid, datao, data, last, success, d, pda),
        Pdu::R2T {
            cccid,
            ttag,
            r2to,
            r2tl,
        } => tcp::encode_r2t(&mut out, cccid, ttag, r2to, r2tl, d),
        _ => return None,
    }
    Some(out)
}

/// A framer past IC with digests `d`, as `f` is.
fn fresh_after_ic(s: &Setup, d: Digests) -> RxFramer {
    let mut f = s.framer();
    let mut ic = Vec::new();
    if s.host {
        tcp::encode_ic_resp(
            &mut ic,
            &IcResp {
                pfv: 0,
                cpda: 0,
                digests: d,
                maxh2cdata: tcp::MIN_MAXH2CDATA,
            },
        );
    } else {
        tcp::encode_ic_req(
            &mut ic,
            &IcReq {
                pfv: 0,
                hpda: 0,
                digests: d,
                maxr2t: 0,
            },
        );
    }
    let (pdu, n) = f.parse(&ic).expect("valid IC").expect("complete IC");
    assert_eq!(n, ic.len());
    after_ic(&mut f, &pdu);
    f
}

fn check_reencode(s: &Setup, f: &RxFramer, pdu: &Pdu) {
    // Only digest-clean PDUs round-trip: a bad data digest is re-encoded as a good one.
    let digest_ok = match *pdu {
        Pdu::CapsuleCmd { data_digest_ok, .. }
        | Pdu::H2CData { data_digest_ok, .. }
        | Pdu::C2HData { data_digest_ok, .. } => data_digest_ok,
        _ => true,
    };
    if !f.ic_done() || !digest_ok {
        return;
    }
    let Some(bytes) = reencode(pdu, f.digests(), s.pda) else {
        return;
    };
    let mut g = fresh_after_ic(s, f.digests());
    match g.parse(&bytes) {
        Ok(Some((again, n))) => {
            assert_eq!(n, bytes.len(), "re-encoded {pdu:?} not consumed whole");
            assert_eq!(&again, pdu, "re-encoded PDU parses differently");
        }
        other => panic!("re-encoded {pdu:?} ({bytes:02x?}) does not parse: {other:?}"),
    }
}

/// Feeds `stream` to a fresh framer, `step` bytes more each time it asks (0: all at once).
fn pass(s: &Setup, stream: &[u8], step: usize, checks: bool) -> Trace {
    let mut f = s.framer();
    let mut trace = Trace {
        pdus: Vec::new(),
        error: None,
    };
    let mut pos = 0;
    let mut avail = if step == 0 {
        stream.len()
    } else {
        step.min(stream.len())
    };
    loop {
        let buf = &stream[pos..avail];
        match f.parse(buf) {
            Ok(Some((pdu, n))) => {
                assert!(n > 0 && n <= buf.len(), "consumed {n} of {}", buf.len());
                if checks {
                    check_pdu(s, &pdu);
                    check_reencode(s, &f, &pdu);
                }
                trace.pdus.push(format!("{pdu:?}"));
                after_ic(&mut f, &pdu);
                pos += n;
            }
            Ok(None) => {
                assert!(
                    f.needed() > buf.len(),
                    "Ok(None) with {} buffered but needed() = {}",
                    buf.len(),
                    f.needed()
                );
                if avail == stream.len() {
                    return trace;
                }
                avail = (avail + step.max(1)).min(stream.len());
            }
            Err(e) => {
                assert!(e.header_len as usize <= buf.len().max(tcp::COMMON_HEADER_LEN));
                assert!(e.header_len as usize <= tcp::TERM_REQ_MAX_DATA);
                let hdr = e.offending_header(buf);
                assert!(hdr.len() <= tcp::TERM_REQ_MAX_DATA);
                let mut out = Vec::new();
                tcp::encode_term_req(&mut out, !s.host, e.fes, e.fei, hdr);
                assert_eq!(f.parse(buf), Err(e), "errors are sticky");
                trace.error = Some((e.fes, e.fei, e.send_term_req));
                return trace;
            }
        }
    }
}

pub fn run(data: &[u8]) {
    let mut inp = crate::Input::new(data);
    let ctl = inp.u8();
    let step = inp.u8() as usize;
    let lim = inp.u8();
    let s = Setup {
        host: ctl & 1 != 0,
        pda: ctl >> 4,
        max_incapsule: [0, 64, 4096, 8192][(lim & 3) as usize],
        max_data: [4096, 512, 65536, 1 << 20][((lim >> 2) & 3) as usize],
    };
    let mut stream = Vec::new();
    if ctl & 2 != 0 {
        let digests = Digests {
            header: ctl & 4 != 0,
            data: ctl & 8 != 0,
        };
        if s.host {
            tcp::encode_ic_resp(
                &mut stream,
                &IcResp {
                    pfv: 0,
                    cpda: 0,
                    digests,
                    maxh2cdata: tcp::MIN_MAXH2CDATA,
                },
            );
        } else {
            tcp::encode_ic_req(
                &mut stream,
                &IcReq {
                    pfv: 0,
                    hpda: 0,
                    digests,
                    maxr2t: 0,
                },
            );
        }
    }
    stream.extend_from_slice(inp.rest());
    let whole = pass(&s, &stream, 0, true);
    let chunked = pass(&s, &stream, step.max(1), false);
    assert_eq!(
        whole,
        chunked,
        "chunked parsing (step {}) differs",
        step.max(1)
    );
}

/// Valid conversations for both roles, with and without digests.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for dig in 0..4u8 {
        let d = Digests {
            header: dig & 1 != 0,
            data: dig & 2 != 0,
        };
        for pda in [0u8, 3] {
            let ctl = 2 | dig << 2 | pda << 4;
            // Controller side: capsules with and without data, H2CData, TermReq.
            let mut c = vec![ctl, 7, 0b1010];
            let mut sqe = Sqe::default();
            sqe.set_opcode_cid(0x01, 5);
            sqe.nsid = 1;
            tcp::encode_capsule_cmd(&mut c, &sqe, &[0xab; 100], d, pda);
            sqe.set_opcode_cid(0x06, 6);
            tcp::encode_capsule_cmd(&mut c, &sqe, &[], d, pda);
            tcp::encode_h2c_data(&mut c, 5, 1, 0, &[0xcd; 600], true, d, pda);
            tcp::encode_term_req(&mut c, false, 1, 2, &[0x04; 30]);
            v.push(c);
            // Host side: response, R2T, C2HData with and without SUCCESS, TermReq.
            let mut h = vec![ctl | 1, 13, 0b1010];
            tcp::encode_capsule_resp(&mut h, &Cqe::success(5), d);
            tcp::encode_r2t(&mut h, 5, 1, 0, 4096, d);
            tcp::encode_c2h_data(&mut h, 6, 0, &[0x11; 300], false, false, d, pda);
            tcp::encode_c2h_data(&mut h, 6, 300, &[0x22; 200], true, true, d, pda);
            tcp::encode_term_req(&mut h, true, 5, 4, &[0x07; 24]);
            v.push(h);
        }
    }
    // No auto-IC: the stream starts with the IC the fuzzer wrote.
    let mut c = vec![0, 1, 0];
    tcp::encode_ic_req(&mut c, &IcReq::default());
    tcp::encode_capsule_cmd(&mut c, &Sqe::default(), &[1, 2, 3, 4], Digests::NONE, 0);
    v.push(c);
    v
}
