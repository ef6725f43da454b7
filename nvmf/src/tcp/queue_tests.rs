//! The two queue machines: fixed bytes from the NVMe/TCP 1.0 figures, error answers, and
//! property tests of whole conversations between a host machine and a controller machine
//! with a toy in-memory disk, the bytes split at random points.

use super::*;
use crate::queue::QueueParams;
use crate::spec::Status;
use proptest::prelude::*;

/// A sink that keeps everything as one byte stream, resolving data references against
/// `bufs` (slot -> buffer) at the time they are queued, and records releases.
#[derive(Default)]
struct Wire {
    bytes: Vec<u8>,
    released: Vec<u32>,
    /// (slot, offset, len) of data references, for the checks that want them.
    refs: Vec<(u32, u32, u32)>,
}

struct Sink<'a> {
    wire: &'a mut Wire,
    bufs: &'a dyn Fn(u32) -> Vec<u8>,
}

impl TxSink for Sink<'_> {
    fn header(&mut self, b: &[u8]) {
        self.wire.bytes.extend_from_slice(b);
    }
    fn data(&mut self, slot: u32, off: u32, len: u32) {
        let b = (self.bufs)(slot);
        self.wire
            .bytes
            .extend_from_slice(&b[off as usize..(off + len) as usize]);
        self.wire.refs.push((slot, off, len));
    }
    fn release(&mut self, slot: u32) {
        self.wire.released.push(slot);
    }
}

fn no_bufs(_: u32) -> Vec<u8> {
    Vec::new()
}

const LIMITS: ControllerLimits = ControllerLimits {
    max_h2c_data: 8192,
    max_incapsule_data: 8192,
    cpda: 0,
};

fn icreq(hpda: u8, d: Digests) -> Vec<u8> {
    let mut v = Vec::new();
    encode_ic_req(
        &mut v,
        &IcReq {
            pfv: 0,
            hpda,
            digests: d,
            maxr2t: 0,
        },
    );
    v
}

/// A controller queue past ICReq; returns the ICResp bytes it sent.
fn connected(d: Digests, hpda: u8) -> (ControllerQueue, Vec<u8>) {
    let mut q = ControllerQueue::new(LIMITS);
    let mut w = Wire::default();
    let b = icreq(hpda, d);
    let (used, ev) = q.receive(
        &b,
        &mut Sink {
            wire: &mut w,
            bufs: &no_bufs,
        },
    );
    assert_eq!(used, 128);
    assert!(matches!(ev, Some(ControllerEvent::Connected(_))));
    (q, w.bytes)
}

/// NVMe/TCP 1.0 Figure 27: ICResp is 128 bytes: CH (type 01h, HLEN 128, PLEN 128), PFV,
/// CPDA, DGST, MAXH2CDATA, reserved.
#[test]
fn icreq_answered_with_fixed_icresp() {
    let (_, resp) = connected(Digests::BOTH, 0);
    let mut want = vec![0x01, 0x00, 0x80, 0x00, 0x80, 0x00, 0x00, 0x00];
    want.extend_from_slice(&[0x00, 0x00, 0x00, 0x03, 0x00, 0x20, 0x00, 0x00]);
    want.resize(128, 0);
    assert_eq!(resp, want);
}

/// An ICReq with PFV 1: C2HTermReq FES Unsupported Parameter (06h), FEI 8 (the PFV
/// field's offset), carrying the ICReq's 128-byte header.
#[test]
fn icreq_with_unsupported_pfv_is_refused_with_its_header() {
    let mut q = ControllerQueue::new(LIMITS);
    let mut b = icreq(0, Digests::NONE);
    b[8] = 1;
    let mut w = Wire::default();
    let (_, ev) = q.receive(
        &b,
        &mut Sink {
            wire: &mut w,
            bufs: &no_bufs,
        },
    );
    assert_eq!(
        ev,
        Some(ControllerEvent::Fatal {
            fes: fes::UNSUPPORTED_PARAMETER,
            fei: 8,
            cause: FatalCause::IcReqRejected
        })
    );
    // Figure 25: C2HTermReq: CH (03h, HLEN 24, PLEN 24 + 128), FES, FEI, reserved, data.
    assert_eq!(
        &w.bytes[..14],
        &[0x03, 0, 24, 0, 152, 0, 0, 0, 0x06, 0, 8, 0, 0, 0]
    );
    assert_eq!(&w.bytes[24..], &b[..]);
    assert!(q.stopped());
    assert_eq!(
        q.receive(
            &b,
            &mut Sink {
                wire: &mut w,
                bufs: &no_bufs
            }
        ),
        (0, None)
    );
}

fn write_capsule(cid: u16, len: u32, in_capsule: &[u8], d: Digests) -> Vec<u8> {
    let mut s = Sqe::default();
    s.set_opcode_cid(crate::spec::opcodes::io::WRITE, cid);
    s.dptr = if in_capsule.is_empty() {
        SglDescriptor::unkeyed(
            sgl::TYPE_TRANSPORT_DATA_BLOCK,
            sgl::SUBTYPE_TRANSPORT,
            0,
            len,
        )
    } else {
        SglDescriptor::unkeyed(sgl::TYPE_DATA_BLOCK, sgl::SUBTYPE_OFFSET, 0, len)
    };
    let mut v = Vec::new();
    encode_capsule_cmd(&mut v, &s, in_capsule, d, 0);
    v
}

fn feed<'a>(q: &mut ControllerQueue, b: &'a [u8], w: &mut Wire) -> Option<ControllerEvent<'a>> {
    let (used, ev) = q.receive(
        b,
        &mut Sink {
            wire: w,
            bufs: &no_bufs,
        },
    );
    assert!(used == b.len() || ev.is_some(), "whole PDU consumed");
    ev
}

/// R2T (Figure 31), H2CData accounting, and the CapsuleResp (Figure 28) with SQHD.
#[test]
fn r2t_then_h2cdata_then_capsule_resp_fixed_bytes() {
    let (mut q, _) = connected(Digests::NONE, 0);
    let mut w = Wire::default();
    let cap = write_capsule(0x11, 8192, &[], Digests::NONE);
    assert!(matches!(
        feed(&mut q, &cap, &mut w),
        Some(ControllerEvent::Command { .. })
    ));
    q.request_data(
        &mut Sink {
            wire: &mut w,
            bufs: &no_bufs,
        },
        0x11,
        0x0203,
        0,
        8192,
    );
    // CH (09h, HLEN 24, PLEN 24), CCCID, TTAG, R2TO, R2TL, reserved.
    assert_eq!(
        w.bytes,
        [
            0x09, 0, 24, 0, 24, 0, 0, 0, 0x11, 0, 0x03, 0x02, 0, 0, 0, 0, 0x00, 0x20, 0, 0, 0, 0,
            0, 0
        ]
    );
    for (off, last) in [(0u32, false), (4096, true)] {
        let mut h2c = Vec::new();
        encode_h2c_data(
            &mut h2c,
            0x11,
            0x0203,
            off,
            &[7u8; 4096],
            last,
            Digests::NONE,
            0,
        );
        match feed(&mut q, &h2c, &mut w) {
            Some(ControllerEvent::HostData {
                ttag: 0x0203,
                offset,
                data,
                complete,
            }) => {
                assert_eq!((offset, data.len()), (off, 4096));
                assert_eq!(complete, last.then_some(true));
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(q.transfers(), 0);
    w.bytes.clear();
    q.respond(
        &mut Sink {
            wire: &mut w,
            bufs: &no_bufs,
        },
        0x0203,
        Cqe::success(0x11),
        &[],
    );
    // CH (05h, HLEN 24, PLEN 24), then the CQE: DW0, DW1, SQHD 2 (ICReq does not count,
    // two capsules... one capsule here: 1), SQID 0, CID, status.
    assert_eq!(
        w.bytes,
        [0x05, 0, 24, 0, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0x11, 0, 0, 0]
    );
    assert_eq!(w.released, [0x0203]);
}

fn term_of(w: &Wire) -> (u8, u16, u32, Vec<u8>) {
    let b = &w.bytes;
    (
        b[0],
        u16::from_le_bytes([b[8], b[9]]),
        u32::from_le_bytes([b[10], b[11], b[12], b[13]]),
        b[24..].to_vec(),
    )
}

#[test]
fn bad_h2cdata_gets_term_req_with_its_header() {
    for (case, cccid, ttag, off, len, fes_want, fei_want, cause) in [
        (
            "unknown TTAG",
            1u16,
            9u16,
            0u32,
            512usize,
            fes::INVALID_HEADER_FIELD,
            10u32,
            FatalCause::UnknownTtag,
        ),
        (
            "wrong CCCID",
            2,
            5,
            0,
            512,
            fes::INVALID_HEADER_FIELD,
            8,
            FatalCause::WrongCccid,
        ),
        (
            "wrong DATAO",
            1,
            5,
            512,
            512,
            fes::DATA_TRANSFER_OUT_OF_RANGE,
            12,
            FatalCause::DataOutOfRange,
        ),
        (
            "past the R2T",
            1,
            5,
            0,
            4096,
            fes::DATA_TRANSFER_OUT_OF_RANGE,
            12,
            FatalCause::DataOutOfRange,
        ),
        (
            "LAST_PDU before the R2T's range is complete",
            1,
            5,
            0,
            512,
            fes::INVALID_HEADER_FIELD,
            1,
            FatalCause::EarlyLastPdu,
        ),
    ] {
        let (mut q, _) = connected(Digests::NONE, 0);
        let mut w = Wire::default();
        let cap = write_capsule(1, 2048, &[], Digests::NONE);
        feed(&mut q, &cap, &mut w);
        q.request_data(
            &mut Sink {
                wire: &mut w,
                bufs: &no_bufs,
            },
            1,
            5,
            0,
            2048,
        );
        w.bytes.clear();
        let mut h2c = Vec::new();
        encode_h2c_data(
            &mut h2c,
            cccid,
            ttag,
            off,
            &vec![1u8; len],
            true,
            Digests::NONE,
            0,
        );
        let (_, ev) = q.receive(
            &h2c,
            &mut Sink {
                wire: &mut w,
                bufs: &no_bufs,
            },
        );
        assert_eq!(
            ev,
            Some(ControllerEvent::Fatal {
                fes: fes_want,
                fei: fei_want,
                cause
            }),
            "{case}"
        );
        let (ty, fes_got, fei_got, hdr) = term_of(&w);
        assert_eq!(
            (ty, fes_got, fei_got),
            (pdu_type::C2H_TERM_REQ, fes_want, fei_want),
            "{case}"
        );
        assert_eq!(
            hdr,
            &h2c[..24],
            "{case}: the TermReq carries the H2CData header"
        );
        assert!(q.stopped());
    }
}

/// A PDU only a controller sends (here a CapsuleResp, HLEN 24), arriving at the
/// controller: C2HTermReq Invalid PDU Header Field carrying that PDU's whole header (its
/// HLEN bytes, section 3.6.2.4), not just the common header.
#[test]
fn controller_pdu_from_the_host_gets_term_req_with_its_whole_header() {
    let (mut q, _) = connected(Digests::NONE, 0);
    let mut resp = Vec::new();
    encode_capsule_resp(&mut resp, &Cqe::success(3), Digests::NONE);
    assert_eq!(resp.len(), 24);
    let mut w = Wire::default();
    let ev = feed(&mut q, &resp, &mut w);
    assert_eq!(
        ev,
        Some(ControllerEvent::Fatal {
            fes: fes::INVALID_HEADER_FIELD,
            fei: 0,
            cause: FatalCause::Malformed
        })
    );
    let (ty, _, _, hdr) = term_of(&w);
    assert_eq!(ty, pdu_type::C2H_TERM_REQ);
    assert_eq!(hdr, resp, "the CapsuleResp's 24-byte header");
    assert!(q.stopped());
}

/// A malformed H2CTermReq (HLEN 8): the host is ending the connection; the machine says
/// so and sends nothing back (no TermReq answers a TermReq).
#[test]
fn malformed_h2c_term_req_is_the_host_terminating() {
    let (mut q, _) = connected(Digests::NONE, 0);
    let mut t = Vec::new();
    encode_term_req(&mut t, false, fes::PDU_SEQUENCE_ERROR, 0, &[]);
    t[2] = 8; // HLEN
    let mut w = Wire::default();
    let (_, ev) = q.receive(
        &t,
        &mut Sink {
            wire: &mut w,
            bufs: &no_bufs,
        },
    );
    assert!(
        matches!(ev, Some(ControllerEvent::HostTerminated { .. })),
        "{ev:?}"
    );
    assert!(w.bytes.is_empty(), "nothing sent back");
    assert!(q.stopped());
}

/// With SQ flow control disabled a successful read's completion rides on C2HData
/// (Figure 29: FLAGS LAST_PDU | SUCCESS = 0Ch) and no CapsuleResp follows; a completion
/// with DW0 set, or an error, still gets its CapsuleResp, with SQHD FFFFh.
#[test]
fn success_flag_only_without_flow_control() {
    let data = vec![0xabu8; 512];
    let bufs = |_: u32| vec![0xabu8; 512];
    for disabled in [false, true] {
        let (mut q, _) = connected(Digests::NONE, 0);
        q.set_params(QueueParams {
            qid: 1,
            sqsize: 31,
            sq_flow_control_disabled: disabled,
        });
        let mut w = Wire::default();
        q.respond(
            &mut Sink {
                wire: &mut w,
                bufs: &bufs,
            },
            4,
            Cqe::success(3),
            &data,
        );
        let want_flags = if disabled { 0x0c } else { 0x04 };
        assert_eq!(&w.bytes[..8], &[0x07, want_flags, 24, 24, 0x18, 0x02, 0, 0]);
        assert_eq!(
            &w.bytes[8..24],
            &[3, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(&w.bytes[24..536], &data[..]);
        let rest = &w.bytes[536..];
        if disabled {
            assert!(rest.is_empty(), "no CapsuleResp after SUCCESS");
        } else {
            assert_eq!(rest[0], pdu_type::CAPSULE_RESP);
            assert_eq!(&rest[16..20], &[0, 0, 1, 0], "SQHD 0, SQID 1");
        }
        let mut w = Wire::default();
        let mut cqe = Cqe::success(3);
        cqe.dw0 = 1;
        q.respond(
            &mut Sink {
                wire: &mut w,
                bufs: &bufs,
            },
            4,
            cqe,
            &data,
        );
        assert_eq!(w.bytes[1], 0x04, "DW0 set: no SUCCESS");
        let resp = &w.bytes[536..];
        let sqhd = u16::from_le_bytes([resp[16], resp[17]]);
        assert_eq!(sqhd, if disabled { 0xffff } else { 0 });
    }
}

/// C2HData padded to HPDA 3 (16 bytes) with both digests: PDO 32 (24 + 4, rounded up),
/// header digest over the 24 header bytes, data digest after the data.
#[test]
fn c2hdata_honours_hpda_and_digests() {
    let (mut q, _) = connected(Digests::BOTH, 3);
    let data = vec![5u8; 100];
    let mut w = Wire::default();
    let bufs = |_: u32| vec![5u8; 100];
    q.respond(
        &mut Sink {
            wire: &mut w,
            bufs: &bufs,
        },
        0,
        Cqe::success(1),
        &data,
    );
    let b = &w.bytes;
    assert_eq!(&b[..8], &[0x07, 0x07, 24, 32, 136, 0, 0, 0]);
    assert_eq!(&b[24..28], &data_digest(&b[..24]).to_le_bytes());
    assert_eq!(&b[28..32], &[0; 4]);
    assert_eq!(&b[132..136], &data_digest(&data).to_le_bytes());
    assert_eq!(w.refs, [(0, 0, 100)], "data by reference");
}

#[test]
fn digest_error_is_reported_at_the_end_of_the_transfer() {
    let dd = Digests {
        header: false,
        data: true,
    };
    let (mut q, _) = connected(dd, 0);
    let mut w = Wire::default();
    let cap = write_capsule(1, 1024, &[], dd);
    feed(&mut q, &cap, &mut w);
    q.request_data(
        &mut Sink {
            wire: &mut w,
            bufs: &no_bufs,
        },
        1,
        7,
        0,
        1024,
    );
    let mut h2c = Vec::new();
    encode_h2c_data(&mut h2c, 1, 7, 0, &[1u8; 512], false, dd, 0);
    let n = h2c.len();
    h2c[n - 1] ^= 1;
    assert!(matches!(
        feed(&mut q, &h2c, &mut w),
        Some(ControllerEvent::HostData { complete: None, .. })
    ));
    let mut h2c = Vec::new();
    encode_h2c_data(&mut h2c, 1, 7, 512, &[1u8; 512], true, dd, 0);
    assert!(matches!(
        feed(&mut q, &h2c, &mut w),
        Some(ControllerEvent::HostData {
            complete: Some(false),
            ..
        })
    ));
}

/// A streamed H2CData PDU: header checked against the R2T first, payload shown piece by
/// piece, data digest checked at the tail (a bad one fails the transfer at its end),
/// and streaming only for PDUs that are large enough and not wholly buffered.
#[test]
fn streamed_host_data_is_checked_like_whole_pdus() {
    let dd = Digests {
        header: true,
        data: true,
    };
    for corrupt in [false, true] {
        let (mut q, _) = connected(dd, 0);
        q.set_stream_host_data(1024);
        let mut w = Wire::default();
        let cap = write_capsule(1, 4096, &[], dd);
        feed(&mut q, &cap, &mut w);
        let mut sink = Sink {
            wire: &mut w,
            bufs: &no_bufs,
        };
        q.request_data(&mut sink, 1, 7, 0, 4096);
        // A small PDU (under the threshold) wholly buffered: the usual event.
        let mut small = Vec::new();
        encode_h2c_data(&mut small, 1, 7, 0, &[3u8; 512], false, dd, 0);
        let (used, ev) = q.receive(&small, &mut sink);
        assert_eq!(used, small.len());
        assert!(matches!(
            ev,
            Some(ControllerEvent::HostData {
                offset: 0,
                complete: None,
                ..
            })
        ));
        // A large one, header and 100 bytes in: streamed.
        let data: Vec<u8> = (0..3584u32).map(|i| i as u8).collect();
        let mut big = Vec::new();
        encode_h2c_data(&mut big, 1, 7, 512, &data, true, dd, 0);
        if corrupt {
            let n = big.len();
            big[n - 1] ^= 1;
        }
        let pdo = big[3] as usize;
        let (used, ev) = q.receive(&big[..pdo + 100], &mut sink);
        assert_eq!(used, pdo);
        assert_eq!(
            ev,
            Some(ControllerEvent::HostDataStart {
                ttag: 7,
                offset: 512,
                len: 3584
            })
        );
        // While payload is due, `receive` takes nothing.
        assert_eq!(q.receive(&big[pdo..], &mut sink), (0, None));
        let mut at = pdo;
        for piece in [100usize, 1000, 2484] {
            let f = q.inflow().expect("payload due");
            assert_eq!(
                (f.ttag, f.offset, f.discard),
                (7, (512 + at - pdo) as u32, false)
            );
            assert_eq!(f.len as usize, big.len() - 4 - at);
            assert_eq!(q.inflow_received(&big[at..at + piece]), piece);
            at += piece;
        }
        assert_eq!(q.inflow(), None);
        // The digest: 2 of its 4 bytes are not enough.
        assert_eq!(q.receive(&big[at..at + 2], &mut sink), (0, None));
        let (used, ev) = q.receive(&big[at..], &mut sink);
        assert_eq!(used, 4);
        assert_eq!(
            ev,
            Some(ControllerEvent::HostData {
                ttag: 7,
                offset: 4096,
                data: &[],
                complete: Some(!corrupt)
            })
        );
        assert_eq!(q.transfers(), 0);
    }
}

/// A streamed PDU's header is checked before anything of its payload is taken: a TTAG
/// without R2T is fatal at once; a transfer cancelled mid-stream has its remaining
/// payload discarded, and its TTAG may be solicited again at once without the old bytes
/// landing in the new transfer.
#[test]
fn streamed_host_data_header_errors_and_cancel() {
    let streaming = || {
        let (mut q, _) = connected(Digests::NONE, 0);
        q.set_stream_host_data(1);
        q
    };
    let mut w = Wire::default();
    let mut sink = Sink {
        wire: &mut w,
        bufs: &no_bufs,
    };
    let mut q = streaming();
    let mut h2c = Vec::new();
    encode_h2c_data(&mut h2c, 1, 9, 0, &[1u8; 2048], true, Digests::NONE, 0);
    let (_, ev) = q.receive(&h2c[..40], &mut sink);
    assert!(matches!(
        ev,
        Some(ControllerEvent::Fatal {
            cause: FatalCause::UnknownTtag,
            ..
        })
    ));

    let mut q = streaming();
    let cap = write_capsule(1, 2048, &[], Digests::NONE);
    q.receive(&cap, &mut sink);
    q.request_data(&mut sink, 1, 9, 0, 2048);
    let pdo = h2c[3] as usize;
    let (used, _) = q.receive(&h2c[..pdo], &mut sink);
    assert_eq!(used, pdo);
    q.inflow_received(&h2c[pdo..pdo + 48]);
    q.cancel_transfer(9);
    q.request_data(&mut sink, 1, 9, 0, 2048);
    let f = q.inflow().expect("payload still due");
    assert!(f.discard, "the old PDU's bytes go nowhere");
    assert_eq!(q.inflow_received(&h2c[pdo + 48..]), 2000);
    // The orphan's end is reported to nobody; the next PDU is parsed in the same call.
    let mut next = Vec::new();
    encode_h2c_data(&mut next, 1, 9, 0, &[2u8; 8], false, Digests::NONE, 0);
    let (used, ev) = q.receive(&next, &mut sink);
    assert_eq!(used, next.len());
    assert_eq!(
        ev,
        Some(ControllerEvent::HostData {
            ttag: 9,
            offset: 0,
            data: &[2u8; 8],
            complete: None
        })
    );
    assert_eq!(q.transfers(), 1, "the new R2T is still outstanding");
}

#[test]
fn sqhd_wraps_at_negotiated_admin_size() {
    let (mut q, _) = connected(Digests::NONE, 0);
    let mut w = Wire::default();
    let cap = write_capsule(0, 0, &[], Digests::NONE);
    feed(&mut q, &cap, &mut w);
    q.set_params(QueueParams {
        qid: 0,
        sqsize: 63,
        sq_flow_control_disabled: false,
    });
    for _ in 0..40 {
        feed(&mut q, &cap, &mut w);
    }
    w.bytes.clear();
    q.respond_untracked(
        &mut Sink {
            wire: &mut w,
            bufs: &no_bufs,
        },
        Cqe::new(0, Status::INVALID_FIELD),
    );
    assert_eq!(u16::from_le_bytes([w.bytes[16], w.bytes[17]]), 41);
}

// ------------------------------------------------------------------ whole conversations

/// A toy controller around a `ControllerQueue`: writes solicit their data with one R2T
/// (TTAG = CID + 0x100), reads return a pattern of the LBA, everything on a 64 KiB disk
/// of 512-byte blocks.
struct ToyTarget {
    q: ControllerQueue,
    disk: Vec<u8>,
    /// ttag -> (sqe, buffer)
    xfers: std::collections::HashMap<u16, (Sqe, Vec<u8>)>,
    out: Wire,
    pending_rx: Vec<u8>,
}

impl ToyTarget {
    /// With `stream`, every H2CData PDU not wholly in the input is streamed: its payload
    /// goes into the transfer's buffer piece by piece, as an engine reading the socket
    /// straight into its buffers does.
    fn new(stream: bool) -> ToyTarget {
        let mut q = ControllerQueue::new(LIMITS);
        if stream {
            q.set_stream_host_data(1);
        }
        ToyTarget {
            q,
            disk: vec![0; 65536],
            xfers: Default::default(),
            out: Wire::default(),
            pending_rx: Vec::new(),
        }
    }

    fn input(&mut self, bytes: &[u8]) {
        self.pending_rx.extend_from_slice(bytes);
        loop {
            if let Some(f) = self.q.inflow() {
                let n = self.pending_rx.len().min(f.len as usize);
                if n == 0 {
                    break;
                }
                let piece: Vec<u8> = self.pending_rx.drain(..n).collect();
                if !f.discard {
                    let (_, buf) = self.xfers.get_mut(&f.ttag).expect("claimed TTAG");
                    buf[f.offset as usize..][..n].copy_from_slice(&piece);
                }
                assert_eq!(self.q.inflow_received(&piece), n);
                continue;
            }
            let rx = std::mem::take(&mut self.pending_rx);
            let (used, ev) = self.q.receive(
                &rx,
                &mut Sink {
                    wire: &mut self.out,
                    bufs: &no_bufs,
                },
            );
            let done = ev.is_none() && used == 0;
            if let Some(ev) = ev {
                self.handle(ev);
            }
            self.pending_rx = rx[used..].to_vec();
            if done {
                break;
            }
        }
    }

    fn handle(&mut self, ev: ControllerEvent<'_>) {
        match ev {
            ControllerEvent::Command {
                sqe,
                data,
                data_digest_ok,
            } => {
                let off = sqe.slba() as usize * 512;
                let len = sqe.nlb() as usize * 512;
                let ttag = sqe.cid() + 0x100;
                if !data_digest_ok {
                    return self.finish(
                        ttag,
                        Cqe::new(sqe.cid(), Status::TRANSIENT_TRANSPORT_ERROR),
                        Vec::new(),
                    );
                }
                match sqe.opcode() {
                    crate::spec::opcodes::io::READ => {
                        let b = self.disk[off..off + len].to_vec();
                        self.finish(ttag, Cqe::success(sqe.cid()), b);
                    }
                    _ if !data.is_empty() => {
                        self.disk[off..off + len].copy_from_slice(data);
                        self.finish(ttag, Cqe::success(sqe.cid()), Vec::new());
                    }
                    _ => {
                        self.xfers.insert(ttag, (sqe, vec![0; len]));
                        self.q.request_data(
                            &mut Sink {
                                wire: &mut self.out,
                                bufs: &no_bufs,
                            },
                            sqe.cid(),
                            ttag,
                            0,
                            len as u32,
                        );
                    }
                }
            }
            ControllerEvent::HostData {
                ttag,
                offset,
                data,
                complete,
            } => {
                let (sqe, buf) = self.xfers.get_mut(&ttag).expect("machine checked the TTAG");
                buf[offset as usize..offset as usize + data.len()].copy_from_slice(data);
                if let Some(ok) = complete {
                    let (sqe, buf) = (*sqe, std::mem::take(buf));
                    self.xfers.remove(&ttag);
                    let st = if ok {
                        let off = sqe.slba() as usize * 512;
                        self.disk[off..off + buf.len()].copy_from_slice(&buf);
                        Status::SUCCESS
                    } else {
                        Status::TRANSIENT_TRANSPORT_ERROR
                    };
                    self.finish(ttag, Cqe::new(sqe.cid(), st), Vec::new());
                }
            }
            ControllerEvent::HostDataStart { ttag, .. } => {
                assert!(self.xfers.contains_key(&ttag), "machine checked the TTAG");
            }
            ControllerEvent::Connected(_) => {}
            other => panic!("toy target: {other:?}"),
        }
    }

    fn finish(&mut self, slot: u16, cqe: Cqe, data: Vec<u8>) {
        let d = data.clone();
        let bufs = move |_: u32| d.clone();
        self.q.respond(
            &mut Sink {
                wire: &mut self.out,
                bufs: &bufs,
            },
            slot as u32,
            cqe,
            &data,
        );
    }
}

#[derive(Clone, Debug)]
enum Op {
    Write { slba: u8, nlb: u8, seed: u8 },
    Read { slba: u8, nlb: u8 },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..100, 1u8..24, any::<u8>()).prop_map(|(slba, nlb, seed)| Op::Write {
            slba,
            nlb,
            seed
        }),
        (0u8..100, 1u8..24).prop_map(|(slba, nlb)| Op::Read { slba, nlb }),
    ]
}

proptest! {
    /// Random reads and writes (in-capsule and by R2T, several H2CData PDUs each) between
    /// the two machines, every byte stream cut at random points: every command completes
    /// with success, reads return what the model disk holds.
    #[test]
    fn host_and_controller_agree(ops in prop::collection::vec(op_strategy(), 1..12),
                                 hdr: bool, dat: bool, cut in 1usize..700, incap: bool,
                                 stream: bool) {
        let d = Digests { header: hdr, data: dat };
        let mut t = ToyTarget::new(stream);
        let mut h = HostQueue::new(HostConfig { digests: d, hpda: 0, maxr2t: 0, max_c2h_data: 1 << 20 }, 32);
        h.set_max_incapsule(if incap { 4096 } else { 0 });
        let mut model = vec![0u8; 65536];
        let mut bufs: Vec<Vec<u8>> = vec![Vec::new(); 32];
        let mut hw = Wire::default();
        h.start(&mut Sink { wire: &mut hw, bufs: &no_bufs });
        let mut expect_reads = std::collections::HashMap::new();
        let mut pending = ops.len();
        // The first round only exchanges ICReq/ICResp; each later one submits one command.
        for i in 0..=ops.len() {
          if i > 0 {
            let op = &ops[i - 1];
            let (sqe, xfer, buf) = match *op {
                Op::Write { slba, nlb, seed } => {
                    let len = nlb as usize * 512;
                    let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(seed)).collect();
                    model[slba as usize * 512..][..len].copy_from_slice(&data);
                    (rw(crate::spec::opcodes::io::WRITE, slba, nlb), Xfer::ToController, data)
                }
                Op::Read { slba, nlb } => {
                    let len = nlb as usize * 512;
                    (rw(crate::spec::opcodes::io::READ, slba, nlb), Xfer::FromController, vec![0; len])
                }
            };
            let snapshot = buf.clone();
            let bf = move |_: u32| snapshot.clone();
            let cid = h.submit(&mut Sink { wire: &mut hw, bufs: &bf }, sqe, xfer, &buf).unwrap();
            if let Op::Read { slba, nlb } = *op {
                expect_reads.insert(cid, model[slba as usize * 512..][..nlb as usize * 512].to_vec());
            }
            bufs[cid as usize] = buf;
          }
            // Run the conversation until quiet, delivering `cut` bytes at a time.
            loop {
                let to_t = std::mem::take(&mut hw.bytes);
                for c in to_t.chunks(cut) {
                    t.input(c);
                }
                let to_h = std::mem::take(&mut t.out.bytes);
                if to_h.is_empty() && hw.bytes.is_empty() {
                    break;
                }
                let mut rx = Vec::new();
                for c in to_h.chunks(cut) {
                    rx.extend_from_slice(c);
                    loop {
                        let (used, ev) = {
                            let r = h.receive(&rx, &mut Sink { wire: &mut hw, bufs: &no_bufs }).unwrap();
                            (r.0, r.1.map(|e| match e {
                                HostEvent::Data { cid, offset, data } => (0, cid, offset, data.to_vec(), 0, Cqe::default()),
                                HostEvent::R2T { cid, ttag, offset, len } => (1, cid, offset, Vec::new(), ((ttag as u32) << 16) as u64 | len as u64, Cqe::default()),
                                HostEvent::Completion { cid, cqe } => (2, cid, 0, Vec::new(), 0, cqe),
                                HostEvent::Connected(_) => (3, 0, 0, Vec::new(), 0, Cqe::default()),
                            }))
                        };
                        rx.drain(..used);
                        let Some((kind, cid, offset, data, extra, cqe)) = ev else { break };
                        match kind {
                            0 => bufs[cid as usize][offset as usize..][..data.len()].copy_from_slice(&data),
                            1 => {
                                let (ttag, len) = ((extra >> 16) as u16, extra as u32 & 0xffff);
                                let part = bufs[cid as usize][offset as usize..][..len as usize].to_vec();
                                let full = bufs[cid as usize].clone();
                                let bf = move |_: u32| full.clone();
                                h.send_data(&mut Sink { wire: &mut hw, bufs: &bf }, cid, ttag, offset, &part);
                            }
                            2 => {
                                prop_assert!(cqe.status().is_success(), "{:?}", cqe.status());
                                if let Some(want) = expect_reads.remove(&cid) {
                                    prop_assert_eq!(&bufs[cid as usize], &want);
                                }
                                pending -= 1;
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
        prop_assert_eq!(pending, 0);
        prop_assert_eq!(&t.disk, &model);
        prop_assert_eq!(t.q.transfers(), 0);
    }
}

fn rw(opcode: u8, slba: u8, nlb: u8) -> Sqe {
    let mut s = Sqe::default();
    s.set_opcode_cid(opcode, 0);
    s.nsid = 1;
    s.cdw10 = slba as u32;
    s.cdw12 = nlb as u32 - 1;
    s
}

/// SQ flow control: a queue takes SQSIZE + 1 outstanding commands (32 before Connect);
/// the next capsule is a fatal PDU Sequence Error carrying its header, and releases make
/// room again.
#[test]
fn capsules_beyond_the_queue_size_are_fatal() {
    for sqsize in [None, Some(7u16)] {
        let (mut q, _) = connected(Digests::NONE, 0);
        if let Some(sqsize) = sqsize {
            q.set_params(QueueParams {
                qid: 1,
                sqsize,
                sq_flow_control_disabled: false,
            });
        }
        let entries = sqsize.map_or(32, |s| s as u32 + 1);
        let mut w = Wire::default();
        let mut sink = Sink {
            wire: &mut w,
            bufs: &no_bufs,
        };
        let capsule = |cid: u16| {
            let mut s = Sqe::default();
            s.set_opcode_cid(0x18, cid);
            let mut v = Vec::new();
            encode_capsule_cmd(&mut v, &s, &[], Digests::NONE, 0);
            v
        };
        for cid in 0..entries as u16 {
            let b = capsule(cid);
            let (_, ev) = q.receive(&b, &mut sink);
            assert!(
                matches!(ev, Some(ControllerEvent::Command { .. })),
                "{ev:?}"
            );
        }
        assert_eq!(q.outstanding(), entries);
        // One done: one more fits.
        q.command_released();
        let b = capsule(100);
        let (_, ev) = q.receive(&b, &mut sink);
        assert!(matches!(ev, Some(ControllerEvent::Command { .. })));
        let bytes = capsule(101);
        let (used, ev) = q.receive(&bytes, &mut sink);
        assert_eq!(used, bytes.len());
        assert_eq!(
            ev,
            Some(ControllerEvent::Fatal {
                fes: fes::PDU_SEQUENCE_ERROR,
                fei: 0,
                cause: FatalCause::QueueOverflow,
            })
        );
        let term = &sink.wire.bytes;
        assert_eq!(term[0], pdu_type::C2H_TERM_REQ);
        assert_eq!(
            &term[SHORT_HLEN..],
            &bytes[..CAPSULE_CMD_HLEN],
            "its header"
        );
        assert!(q.stopped());
    }
}

/// `abort`: a C2HTermReq without a PDU header, then no more input; once only.
#[test]
fn abort_sends_a_headerless_term_req_once() {
    let (mut q, _) = connected(Digests::NONE, 0);
    let mut w = Wire::default();
    let mut sink = Sink {
        wire: &mut w,
        bufs: &no_bufs,
    };
    let ev = q.abort(&mut sink, fes::PDU_SEQUENCE_ERROR);
    assert!(matches!(
        ev,
        Some(ControllerEvent::Fatal {
            cause: FatalCause::Aborted,
            ..
        })
    ));
    assert_eq!(sink.wire.bytes.len(), SHORT_HLEN);
    assert_eq!(sink.wire.bytes[0], pdu_type::C2H_TERM_REQ);
    assert!(q.stopped());
    assert!(q.abort(&mut sink, fes::PDU_SEQUENCE_ERROR).is_none());
}
