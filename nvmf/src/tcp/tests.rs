use super::*;
use crate::spec::Status;
use proptest::prelude::*;

const LIMITS: ControllerLimits = ControllerLimits {
    max_h2c_data: 64 * 1024,
    max_incapsule_data: 8192,
    cpda: 0,
};

fn host_limits(hpda: u8) -> HostLimits {
    HostLimits {
        hpda,
        max_c2h_data: 1 << 20,
    }
}

/// Feeds `stream` to `f` in pieces ending at `cuts`, parsing whatever is complete; after an
/// IC PDU switches to digests `d`. Returns the PDUs (as Debug strings) or the first error.
fn run(
    f: &mut RxFramer,
    stream: &[u8],
    cuts: &[usize],
    d: Digests,
) -> Result<Vec<String>, TermError> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let mut start = 0;
    for &end in cuts.iter().chain(std::iter::once(&stream.len())) {
        let end = end.clamp(start, stream.len());
        buf.extend_from_slice(&stream[start..end]);
        start = end;
        loop {
            match f.parse(&buf)? {
                None => {
                    assert!(
                        f.needed() > buf.len(),
                        "needed {} <= have {}",
                        f.needed(),
                        buf.len()
                    );
                    break;
                }
                Some((p, n)) => {
                    if matches!(p, Pdu::IcReq(_) | Pdu::IcResp(_)) {
                        f.set_digests(d);
                    }
                    out.push(format!("{p:?}"));
                    buf.drain(..n);
                }
            }
        }
    }
    if !buf.is_empty() {
        out.push(format!("{} bytes left over", buf.len()));
    }
    Ok(out)
}

fn sqe_with(cdw10: u32, cid: u16, data_len: u32) -> Sqe {
    let mut s = Sqe {
        cdw10,
        ..Default::default()
    };
    s.set_opcode_cid(crate::spec::opcodes::io::WRITE, cid);
    s.dptr = crate::spec::SglDescriptor::unkeyed(
        crate::spec::sgl::TYPE_DATA_BLOCK,
        crate::spec::sgl::SUBTYPE_OFFSET,
        0,
        data_len,
    );
    s
}

#[derive(Clone, Debug)]
enum H2C {
    Cmd {
        cdw10: u32,
        cid: u16,
        data: Vec<u8>,
    },
    Data {
        cccid: u16,
        ttag: u16,
        datao: u32,
        data: Vec<u8>,
        last: bool,
    },
}

#[derive(Clone, Debug)]
enum C2H {
    Resp {
        cid: u16,
        dw0: u32,
        sc: u8,
    },
    Data {
        cccid: u16,
        datao: u32,
        data: Vec<u8>,
        last: bool,
        success: bool,
    },
    R2T {
        cccid: u16,
        ttag: u16,
        r2to: u32,
        r2tl: u32,
    },
}

fn h2c_strategy() -> impl Strategy<Value = H2C> {
    prop_oneof![
        (
            any::<u32>(),
            any::<u16>(),
            prop::collection::vec(any::<u8>(), 0..300)
        )
            .prop_map(|(cdw10, cid, data)| H2C::Cmd { cdw10, cid, data }),
        (
            any::<u16>(),
            any::<u16>(),
            any::<u32>(),
            prop::collection::vec(any::<u8>(), 1..300),
            any::<bool>()
        )
            .prop_map(|(cccid, ttag, datao, data, last)| H2C::Data {
                cccid,
                ttag,
                datao,
                data,
                last
            }),
    ]
}

fn c2h_strategy() -> impl Strategy<Value = C2H> {
    prop_oneof![
        (any::<u16>(), any::<u32>(), any::<u8>()).prop_map(|(cid, dw0, sc)| C2H::Resp {
            cid,
            dw0,
            sc
        }),
        (
            any::<u16>(),
            any::<u32>(),
            prop::collection::vec(any::<u8>(), 1..300),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(cccid, datao, data, last, s)| C2H::Data {
                cccid,
                datao,
                data,
                last,
                success: s && last
            }),
        (any::<u16>(), any::<u16>(), any::<u32>(), any::<u32>()).prop_map(
            |(cccid, ttag, r2to, r2tl)| C2H::R2T {
                cccid,
                ttag,
                r2to,
                r2tl
            }
        ),
    ]
}

fn digests_strategy() -> impl Strategy<Value = Digests> {
    (any::<bool>(), any::<bool>()).prop_map(|(header, data)| Digests { header, data })
}

/// Encodes an ICReq and `pdus` host-to-controller, returning the stream and the PDUs the
/// controller must see.
fn h2c_stream(pdus: &[H2C], d: Digests, cpda: u8, hpda: u8) -> (Vec<u8>, Vec<String>) {
    let mut s = Vec::new();
    let ic = IcReq {
        pfv: 0,
        hpda,
        digests: d,
        maxr2t: 3,
    };
    encode_ic_req(&mut s, &ic);
    let mut want = vec![format!("{:?}", Pdu::IcReq(ic))];
    for p in pdus {
        match p {
            H2C::Cmd { cdw10, cid, data } => {
                let sqe = sqe_with(*cdw10, *cid, data.len() as u32);
                encode_capsule_cmd(&mut s, &sqe, data, d, cpda);
                want.push(format!(
                    "{:?}",
                    Pdu::CapsuleCmd {
                        sqe,
                        data,
                        data_digest_ok: true
                    }
                ));
            }
            H2C::Data {
                cccid,
                ttag,
                datao,
                data,
                last,
            } => {
                encode_h2c_data(&mut s, *cccid, *ttag, *datao, data, *last, d, cpda);
                want.push(format!(
                    "{:?}",
                    Pdu::H2CData {
                        cccid: *cccid,
                        ttag: *ttag,
                        datao: *datao,
                        data,
                        last: *last,
                        data_digest_ok: true
                    }
                ));
            }
        }
    }
    encode_term_req(&mut s, false, fes::PDU_SEQUENCE_ERROR, 7, &[1, 2, 3]);
    want.push(format!(
        "{:?}",
        Pdu::H2CTermReq {
            fes: fes::PDU_SEQUENCE_ERROR,
            fei: 7
        }
    ));
    (s, want)
}

fn c2h_stream(pdus: &[C2H], d: Digests, cpda: u8, hpda: u8) -> (Vec<u8>, Vec<String>) {
    let mut s = Vec::new();
    let ic = IcResp {
        pfv: 0,
        cpda,
        digests: d,
        maxh2cdata: 128 * 1024,
    };
    encode_ic_resp(&mut s, &ic);
    let mut want = vec![format!("{:?}", Pdu::IcResp(ic))];
    for p in pdus {
        match p {
            C2H::Resp { cid, dw0, sc } => {
                let mut cqe = Cqe::new(
                    *cid,
                    Status {
                        sct: 0,
                        sc: *sc,
                        dnr: false,
                        more: false,
                    },
                );
                cqe.dw0 = *dw0;
                encode_capsule_resp(&mut s, &cqe, d);
                want.push(format!("{:?}", Pdu::CapsuleResp { cqe }));
            }
            C2H::Data {
                cccid,
                datao,
                data,
                last,
                success,
            } => {
                encode_c2h_data(&mut s, *cccid, *datao, data, *last, *success, d, hpda);
                want.push(format!(
                    "{:?}",
                    Pdu::C2HData {
                        cccid: *cccid,
                        datao: *datao,
                        data,
                        last: *last,
                        success: *success,
                        data_digest_ok: true
                    }
                ));
            }
            C2H::R2T {
                cccid,
                ttag,
                r2to,
                r2tl,
            } => {
                encode_r2t(&mut s, *cccid, *ttag, *r2to, *r2tl, d);
                want.push(format!(
                    "{:?}",
                    Pdu::R2T {
                        cccid: *cccid,
                        ttag: *ttag,
                        r2to: *r2to,
                        r2tl: *r2tl
                    }
                ));
            }
        }
    }
    encode_term_req(&mut s, true, fes::HEADER_DIGEST_ERROR, 0, &[0xaa; 200]);
    want.push(format!(
        "{:?}",
        Pdu::C2HTermReq {
            fes: fes::HEADER_DIGEST_ERROR,
            fei: 0
        }
    ));
    (s, want)
}

proptest! {
    #[test]
    fn h2c_roundtrip(pdus in prop::collection::vec(h2c_strategy(), 0..8), d in digests_strategy(),
                     cpda in 0u8..=31, cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6)) {
        let (s, want) = h2c_stream(&pdus, d, cpda, 0);
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(s.len() + 1)).collect();
        cuts.sort();
        let mut f = RxFramer::new_controller(ControllerLimits { cpda, ..LIMITS });
        prop_assert_eq!(run(&mut f, &s, &cuts, d).unwrap(), want);
    }

    #[test]
    fn c2h_roundtrip(pdus in prop::collection::vec(c2h_strategy(), 0..8), d in digests_strategy(),
                     hpda in 0u8..=31, cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6)) {
        let (s, want) = c2h_stream(&pdus, d, 0, hpda);
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(s.len() + 1)).collect();
        cuts.sort();
        let mut f = RxFramer::new_host(host_limits(hpda));
        prop_assert_eq!(run(&mut f, &s, &cuts, d).unwrap(), want);
    }

    /// Random bytes, alone or after a valid IC PDU, in random pieces: never a panic, and
    /// whatever parses is consumed within the buffer.
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600), controller: bool,
                                after_ic: bool, d in digests_strategy(), pda in 0u8..=31,
                                cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..4)) {
        let mut s = Vec::new();
        let mut f = if controller {
            if after_ic { encode_ic_req(&mut s, &IcReq::default()); }
            RxFramer::new_controller(ControllerLimits { cpda: pda, ..LIMITS })
        } else {
            if after_ic { encode_ic_resp(&mut s, &IcResp { maxh2cdata: 4096, ..Default::default() }); }
            RxFramer::new_host(HostLimits { hpda: pda, max_c2h_data: 4096 })
        };
        s.extend_from_slice(&bytes);
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(s.len() + 1)).collect();
        cuts.sort();
        let mut buf = Vec::new();
        let mut start = 0;
        'outer: for &end in cuts.iter().chain(std::iter::once(&s.len())) {
            buf.extend_from_slice(&s[start..end]);
            start = end;
            loop {
                match f.parse(&buf) {
                    Ok(None) => break,
                    Ok(Some((p, n))) => {
                        prop_assert!(n > 0 && n <= buf.len());
                        if matches!(p, Pdu::IcReq(_) | Pdu::IcResp(_)) { f.set_digests(d); }
                        buf.drain(..n);
                    }
                    Err(e) => {
                        prop_assert!(e.offending_header(&buf).len() <= TERM_REQ_MAX_DATA);
                        prop_assert_eq!(f.parse(&buf), Err(e));
                        break 'outer;
                    }
                }
            }
        }
    }

    #[test]
    fn incremental_digest_any_split(a in prop::collection::vec(any::<u8>(), 0..5000), cut in 0usize..5000) {
        let cut = cut.min(a.len());
        let mut d = DataDigest::new();
        d.update(&a[..cut]);
        d.update(&a[cut..]);
        prop_assert_eq!(d.finish(), data_digest(&a));
    }

    #[test]
    fn incremental_digest(a in prop::collection::vec(any::<u8>(), 0..100), b in prop::collection::vec(any::<u8>(), 0..100)) {
        let mut d = DataDigest::new();
        d.update(&a);
        d.update(&b);
        prop_assert_eq!(d.finish(), data_digest(&[a, b].concat()));
    }
}

/// CRC32C's check value (the CRC catalogue's CRC-32/ISCSI: "123456789" gives E3069283h),
/// whole and split.
#[test]
fn digest_known_answers() {
    assert_eq!(data_digest(b"123456789"), 0xe306_9283);
    assert_eq!(data_digest(&[]), 0);
    let mut d = DataDigest::new();
    d.update(b"1234");
    d.update(b"56789");
    assert_eq!(d.finish(), 0xe306_9283);
}

/// One fixed conversation per role, split in two at every byte boundary and fed one byte
/// at a time.
#[test]
fn split_at_every_boundary() {
    let h2c = [
        H2C::Cmd {
            cdw10: 1,
            cid: 2,
            data: vec![],
        },
        H2C::Cmd {
            cdw10: 3,
            cid: 4,
            data: (0..100).collect(),
        },
        H2C::Data {
            cccid: 4,
            ttag: 9,
            datao: 0,
            data: vec![7; 33],
            last: true,
        },
    ];
    let c2h = [
        C2H::Data {
            cccid: 1,
            datao: 0,
            data: vec![5; 17],
            last: true,
            success: false,
        },
        C2H::Resp {
            cid: 1,
            dw0: 0,
            sc: 0,
        },
        C2H::R2T {
            cccid: 2,
            ttag: 3,
            r2to: 0,
            r2tl: 4096,
        },
    ];
    for d in [
        Digests::NONE,
        Digests::BOTH,
        Digests {
            header: true,
            data: false,
        },
    ] {
        for pda in [0, 3, 31] {
            let (s, want) = h2c_stream(&h2c, d, pda, 0);
            let every: Vec<usize> = (0..s.len()).collect();
            let new = || {
                RxFramer::new_controller(ControllerLimits {
                    cpda: pda,
                    ..LIMITS
                })
            };
            assert_eq!(run(&mut new(), &s, &every, d).unwrap(), want);
            for cut in 0..=s.len() {
                assert_eq!(run(&mut new(), &s, &[cut], d).unwrap(), want, "cut {cut}");
            }
            let (s, want) = c2h_stream(&c2h, d, 0, pda);
            let every: Vec<usize> = (0..s.len()).collect();
            assert_eq!(
                run(&mut RxFramer::new_host(host_limits(pda)), &s, &every, d).unwrap(),
                want
            );
            for cut in 0..=s.len() {
                let mut f = RxFramer::new_host(host_limits(pda));
                assert_eq!(run(&mut f, &s, &[cut], d).unwrap(), want, "cut {cut}");
            }
        }
    }
}

#[test]
fn encoded_layouts() {
    // CapsuleCmd with header digest, 5 bytes of data, data digest, CPDA 3 (16-byte
    // alignment): header 72 + 4 digest = 76, padded to 80.
    let mut v = Vec::new();
    encode_capsule_cmd(
        &mut v,
        &sqe_with(0, 1, 5),
        &[1, 2, 3, 4, 5],
        Digests::BOTH,
        3,
    );
    assert_eq!(
        &v[..4],
        &[pdu_type::CAPSULE_CMD, flags::HDGSTF | flags::DDGSTF, 72, 80]
    );
    assert_eq!(u32::from_le_bytes(v[4..8].try_into().unwrap()), 80 + 5 + 4);
    assert_eq!(v.len(), 89);
    assert_eq!(
        u32::from_le_bytes(v[72..76].try_into().unwrap()),
        data_digest(&v[..72])
    );
    assert_eq!(&v[76..80], &[0; 4]);
    assert_eq!(&v[85..89], &data_digest(&[1, 2, 3, 4, 5]).to_le_bytes());
    // No data: no DDGSTF, PDO 0.
    v.clear();
    encode_capsule_cmd(&mut v, &sqe_with(0, 1, 0), &[], Digests::BOTH, 3);
    assert_eq!(
        &v[..8],
        &[pdu_type::CAPSULE_CMD, flags::HDGSTF, 72, 0, 76, 0, 0, 0]
    );
    // CapsuleResp, R2T, ICResp.
    v.clear();
    encode_capsule_resp(&mut v, &Cqe::success(7), Digests::NONE);
    assert_eq!(&v[..8], &[5, 0, 24, 0, 24, 0, 0, 0]);
    assert_eq!(&v[20..22], &[7, 0]);
    v.clear();
    encode_r2t(&mut v, 1, 2, 3, 4, Digests::NONE);
    assert_eq!(
        v,
        [9, 0, 24, 0, 24, 0, 0, 0, 1, 0, 2, 0, 3, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0]
    );
    v.clear();
    encode_ic_resp(
        &mut v,
        &IcResp {
            pfv: 0,
            cpda: 1,
            digests: Digests::BOTH,
            maxh2cdata: 0x2_0000,
        },
    );
    assert_eq!(
        &v[..16],
        &[1, 0, 128, 0, 128, 0, 0, 0, 0, 0, 1, 3, 0, 0, 2, 0]
    );
    // C2HData with SUCCESS and LAST, HPDA 0.
    v.clear();
    encode_c2h_data_header(&mut v, 3, 512, 512, true, true, Digests::NONE, 0);
    assert_eq!(&v[..8], &[7, 0x0c, 24, 24, 0x18, 2, 0, 0]);
    // TermReq: at most 128 bytes of header echoed, FEI at offset 10.
    v.clear();
    encode_term_req(
        &mut v,
        true,
        fes::INVALID_HEADER_FIELD,
        0x0102_0304,
        &[0xee; 200],
    );
    assert_eq!(v.len(), TERM_REQ_MAX_PLEN);
    assert_eq!(&v[..14], &[3, 0, 24, 0, 152, 0, 0, 0, 1, 0, 4, 3, 2, 1]);
}

/// A controller framer past ICReq with digests `d`.
fn controller(d: Digests) -> RxFramer {
    let mut f = RxFramer::new_controller(LIMITS);
    let mut s = Vec::new();
    encode_ic_req(
        &mut s,
        &IcReq {
            digests: d,
            ..Default::default()
        },
    );
    assert!(matches!(f.parse(&s), Ok(Some((Pdu::IcReq(_), 128)))));
    f.set_digests(d);
    f
}

fn cmd(data: &[u8], d: Digests) -> Vec<u8> {
    let mut v = Vec::new();
    encode_capsule_cmd(&mut v, &sqe_with(0, 1, data.len() as u32), data, d, 0);
    v
}

fn err(f: &mut RxFramer, b: &[u8]) -> (u16, u32) {
    match f.parse(b) {
        Err(e) => (e.fes, e.fei),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn fes_invalid_header_field() {
    let d = Digests::NONE;
    let ok = cmd(&[1; 8], d);
    let with = |i: usize, v: u8| {
        let mut b = ok.clone();
        b[i] = v;
        b
    };
    // Unknown type; a type for the other direction.
    assert_eq!(
        err(&mut controller(d), &with(0, 0x08)),
        (fes::INVALID_HEADER_FIELD, 0)
    );
    assert_eq!(
        err(&mut controller(d), &with(0, pdu_type::CAPSULE_RESP)),
        (fes::INVALID_HEADER_FIELD, 0)
    );
    // Flags: LAST_PDU on a capsule; HDGSTF not negotiated; DDGSTF missing when negotiated.
    assert_eq!(
        err(&mut controller(d), &with(1, flags::LAST_PDU)),
        (fes::INVALID_HEADER_FIELD, 1)
    );
    assert_eq!(
        err(&mut controller(d), &with(1, flags::HDGSTF)),
        (fes::INVALID_HEADER_FIELD, 1)
    );
    let dd = Digests {
        header: false,
        data: true,
    };
    let mut b = cmd(&[1; 8], dd);
    b[1] = 0;
    assert_eq!(err(&mut controller(dd), &b), (fes::INVALID_HEADER_FIELD, 1));
    // HLEN.
    assert_eq!(
        err(&mut controller(d), &with(2, 24)),
        (fes::INVALID_HEADER_FIELD, 2)
    );
    // PDO: inside the header, misaligned for CPDA 3 (72 is not a multiple of 16), beyond
    // PLEN.
    assert_eq!(
        err(&mut controller(d), &with(3, 8)),
        (fes::INVALID_HEADER_FIELD, 3)
    );
    let mut f = RxFramer::new_controller(ControllerLimits { cpda: 3, ..LIMITS });
    let mut s = Vec::new();
    encode_ic_req(&mut s, &IcReq::default());
    f.parse(&s).unwrap();
    assert_eq!(err(&mut f, &ok), (fes::INVALID_HEADER_FIELD, 3));
    assert_eq!(
        err(&mut controller(d), &with(3, 200)),
        (fes::INVALID_HEADER_FIELD, 3)
    );
    // PLEN below HLEN, or data on a PDU type without data (host side).
    let mut b = Vec::new();
    encode_r2t(&mut b, 1, 2, 3, 4, d);
    for plen in [20, 28] {
        b[4] = plen;
        let mut f = RxFramer::new_host(host_limits(0));
        let mut ic = Vec::new();
        encode_ic_resp(
            &mut ic,
            &IcResp {
                maxh2cdata: 4096,
                ..Default::default()
            },
        );
        f.parse(&ic).unwrap();
        assert_eq!(err(&mut f, &b), (fes::INVALID_HEADER_FIELD, 4));
    }
    // H2CData DATAL disagreeing with PLEN.
    let mut b = Vec::new();
    encode_h2c_data(&mut b, 1, 1, 0, &[0; 16], true, d, 0);
    b[16] = 15;
    assert_eq!(err(&mut controller(d), &b), (fes::INVALID_HEADER_FIELD, 16));
    // ICReq HPDA out of range.
    let mut b = Vec::new();
    encode_ic_req(
        &mut b,
        &IcReq {
            hpda: 32,
            ..Default::default()
        },
    );
    assert_eq!(
        err(&mut RxFramer::new_controller(LIMITS), &b),
        (fes::INVALID_HEADER_FIELD, 10)
    );
    // ICResp with MAXH2CDATA below 4096.
    let mut b = Vec::new();
    encode_ic_resp(
        &mut b,
        &IcResp {
            maxh2cdata: 1024,
            ..Default::default()
        },
    );
    assert_eq!(
        err(&mut RxFramer::new_host(host_limits(0)), &b),
        (fes::INVALID_HEADER_FIELD, 12)
    );
}

#[test]
fn fes_pdu_sequence_error() {
    let mut f = RxFramer::new_controller(LIMITS);
    assert_eq!(
        err(&mut f, &cmd(&[], Digests::NONE)),
        (fes::PDU_SEQUENCE_ERROR, 0)
    );
    // The framer stays failed.
    let mut ic = Vec::new();
    encode_ic_req(&mut ic, &IcReq::default());
    assert_eq!(err(&mut f, &ic), (fes::PDU_SEQUENCE_ERROR, 0));
    // A second ICReq.
    let mut f = controller(Digests::NONE);
    assert_eq!(err(&mut f, &ic), (fes::PDU_SEQUENCE_ERROR, 0));
    // Host: R2T before ICResp.
    let mut b = Vec::new();
    encode_r2t(&mut b, 0, 0, 0, 0, Digests::NONE);
    assert_eq!(
        err(&mut RxFramer::new_host(host_limits(0)), &b),
        (fes::PDU_SEQUENCE_ERROR, 0)
    );
}

#[test]
fn fes_header_digest_error() {
    let d = Digests::BOTH;
    let mut b = cmd(&[1; 8], d);
    b[40] ^= 1;
    let mut f = controller(d);
    let e = f.parse(&b).unwrap_err();
    assert_eq!((e.fes, e.send_term_req), (fes::HEADER_DIGEST_ERROR, true));
    assert_eq!(e.offending_header(&b), &b[..72]);
}

#[test]
fn fes_data_transfer_limit_exceeded() {
    // In-capsule data above the limit is refused from the 8-byte common header alone.
    let b = cmd(&vec![0; 8193], Digests::NONE);
    assert_eq!(
        err(&mut controller(Digests::NONE), &b[..8]),
        (fes::DATA_TRANSFER_LIMIT_EXCEEDED, 4)
    );
    // Tightened after Connect to an I/O queue's IOCCSZ.
    let mut f = controller(Digests::NONE);
    f.set_max_incapsule_data(4096);
    assert_eq!(
        err(&mut f, &cmd(&[0; 4097], Digests::NONE)),
        (fes::DATA_TRANSFER_LIMIT_EXCEEDED, 4)
    );
    // H2CData above MAXH2CDATA.
    let mut b = Vec::new();
    encode_h2c_data_header(
        &mut b,
        1,
        1,
        0,
        LIMITS.max_h2c_data + 1,
        false,
        Digests::BOTH,
        0,
    );
    assert_eq!(
        err(&mut controller(Digests::BOTH), &b),
        (fes::DATA_TRANSFER_LIMIT_EXCEEDED, 4)
    );
    // Exactly at the limits is fine.
    let mut f = controller(Digests::NONE);
    assert!(matches!(
        f.parse(&cmd(&[0; 8192], Digests::NONE)),
        Ok(Some(_))
    ));
    let mut b = Vec::new();
    encode_h2c_data(
        &mut b,
        1,
        1,
        0,
        &vec![0; LIMITS.max_h2c_data as usize],
        true,
        Digests::NONE,
        0,
    );
    assert!(matches!(f.parse(&b), Ok(Some(_))));
}

#[test]
fn fes_unsupported_parameter() {
    let mut b = Vec::new();
    encode_ic_req(
        &mut b,
        &IcReq {
            pfv: 1,
            ..Default::default()
        },
    );
    assert_eq!(
        err(&mut RxFramer::new_controller(LIMITS), &b),
        (fes::UNSUPPORTED_PARAMETER, 8)
    );
}

#[test]
fn data_digest_mismatch_is_per_command() {
    let d = Digests::BOTH;
    let mut b = cmd(&[1; 8], d);
    let n = b.len();
    b[n - 1] ^= 0xff;
    b.extend_from_slice(&cmd(&[2; 8], d));
    let mut f = controller(d);
    let (p, used) = f.parse(&b).unwrap().unwrap();
    assert!(matches!(
        p,
        Pdu::CapsuleCmd {
            data_digest_ok: false,
            ..
        }
    ));
    let (p, _) = f.parse(&b[used..]).unwrap().unwrap();
    assert!(matches!(
        p,
        Pdu::CapsuleCmd {
            data_digest_ok: true,
            ..
        }
    ));
}

#[test]
fn malformed_term_req_closes_silently() {
    let mut b = Vec::new();
    encode_term_req(&mut b, false, 1, 0, &[]);
    b[4] = 10; // PLEN below 24
    let e = RxFramer::new_controller(LIMITS).parse(&b).unwrap_err();
    assert!(!e.send_term_req);
    // A well-formed one before ICReq is accepted (the host may give up at any time).
    b[4] = 24;
    assert!(matches!(
        RxFramer::new_controller(LIMITS).parse(&b),
        Ok(Some((Pdu::H2CTermReq { fes: 1, fei: 0 }, 24)))
    ));
}

#[test]
fn needed_reports_whole_pdu() {
    let b = cmd(&[0; 100], Digests::NONE);
    let mut f = controller(Digests::NONE);
    assert_eq!(f.parse(&b[..3]), Ok(None));
    assert_eq!(f.needed(), 8);
    assert_eq!(f.parse(&b[..9]), Ok(None));
    assert_eq!(f.needed(), b.len());
}

#[test]
fn ic_resp_answers_request() {
    let req = IcReq {
        pfv: 0,
        hpda: 0,
        digests: Digests {
            header: true,
            data: false,
        },
        maxr2t: 0,
    };
    let r = LIMITS.ic_resp(&req);
    assert_eq!(
        (r.digests, r.maxh2cdata, r.cpda),
        (req.digests, LIMITS.max_h2c_data, 0)
    );
}

proptest! {
    /// Valid streams with a few bytes corrupted: errors or PDUs, never a panic.
    #[test]
    fn mutated_streams_never_panic(pdus in prop::collection::vec(h2c_strategy(), 1..4),
                                   rpdus in prop::collection::vec(c2h_strategy(), 1..4),
                                   d in digests_strategy(), pda in 0u8..=31,
                                   muts in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)) {
        let (mut s, _) = h2c_stream(&pdus, d, pda, 0);
        let (mut r, _) = c2h_stream(&rpdus, d, 0, pda);
        for (i, v) in &muts {
            let n = s.len();
            s[i.index(n)] = *v;
            let n = r.len();
            r[i.index(n)] = *v;
        }
        let _ = run(&mut RxFramer::new_controller(ControllerLimits { cpda: pda, ..LIMITS }), &s, &[], d);
        let _ = run(&mut RxFramer::new_host(host_limits(pda)), &r, &[], d);
    }
}

/// H2CData and C2HData as the wire carries them (NVMe/TCP 1.0 Figure 10 common header:
/// PDU-Type, FLAGS, HLEN, PDO, PLEN; Figure 30 H2CData PSH: CCCID, TTAG, DATAO, DATAL;
/// Figure 29 C2HData PSH: CCCID, reserved, DATAO, DATAL; FLAGS bit 2 LAST_PDU, bit 3
/// SUCCESS), without digests: the header is 24 bytes and the data follows it.
#[test]
fn data_pdus_fixed_bytes() {
    let h2c: [u8; 32] = [
        0x06, 0x04, 0x18, 0x18, 0x20, 0x00, 0x00,
        0x00, // H2CData, LAST_PDU, HLEN/PDO 24, PLEN 32
        0x05, 0x00, 0x07, 0x00, // CCCID 5, TTAG 7
        0x00, 0x10, 0x00, 0x00, // DATAO 4096
        0x08, 0x00, 0x00, 0x00, // DATAL 8
        0x00, 0x00, 0x00, 0x00, // reserved
        1, 2, 3, 4, 5, 6, 7, 8,
    ];
    let mut v = Vec::new();
    encode_h2c_data_header(&mut v, 5, 7, 4096, 8, true, Digests::NONE, 0);
    v.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(v, h2c);
    let (mut s, _) = h2c_stream(&[], Digests::NONE, 0, 0);
    s.extend_from_slice(&h2c);
    let mut f = RxFramer::new_controller(LIMITS);
    let got = run(&mut f, &s, &[], Digests::NONE).unwrap();
    let want = Pdu::H2CData {
        cccid: 5,
        ttag: 7,
        datao: 4096,
        data: &[1, 2, 3, 4, 5, 6, 7, 8],
        last: true,
        data_digest_ok: true,
    };
    assert_eq!(got.last(), Some(&format!("{want:?}")));

    let c2h: [u8; 28] = [
        0x07, 0x0c, 0x18, 0x18, 0x1c, 0x00, 0x00,
        0x00, // C2HData, LAST_PDU | SUCCESS, PLEN 28
        0x09, 0x00, 0x00, 0x00, // CCCID 9, reserved
        0x00, 0x00, 0x00, 0x00, // DATAO 0
        0x04, 0x00, 0x00, 0x00, // DATAL 4
        0x00, 0x00, 0x00, 0x00, // reserved
        0xde, 0xad, 0xbe, 0xef,
    ];
    let mut v = Vec::new();
    encode_c2h_data_header(&mut v, 9, 0, 4, true, true, Digests::NONE, 0);
    v.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(v, c2h);
    let (mut s, _) = c2h_stream(&[], Digests::NONE, 0, 0);
    s.extend_from_slice(&c2h);
    let mut f = RxFramer::new_host(host_limits(0));
    let got = run(&mut f, &s, &[], Digests::NONE).unwrap();
    let want = Pdu::C2HData {
        cccid: 9,
        datao: 0,
        data: &[0xde, 0xad, 0xbe, 0xef],
        last: true,
        success: true,
        data_digest_ok: true,
    };
    assert_eq!(got.last(), Some(&format!("{want:?}")));
}
