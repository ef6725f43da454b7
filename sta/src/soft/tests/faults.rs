//! Faults: PDUs split at every byte, H2CData out of order / short / overlong / with a
//! wrong TTAG or CCCID, hosts vanishing mid-transfer, keep-alive expiry with simulated
//! time, and random command mixes with a fault at a random point (proptest).

use std::time::Duration;

use nvmf::spec::opcodes::{admin, io};
use nvmf::spec::{Sqe, Status};
use nvmf::tcp::{self, fes, Digests, HostError, Xfer};
use proptest::prelude::*;

use super::pair::*;
use crate::TransportErrorKind;

/// Give the target everything the host queued, run one engine pass, and return the raw
/// bytes the target wrote (the host machine does not see them).
fn raw_exchange(p: &mut Pair, q: usize) -> Vec<u8> {
    let c = &mut p.conns[q];
    let n = c.tx.len();
    c.pipe.borrow_mut().to_target.extend(c.tx.drain(..n));
    p.io.progress_at(p.now);
    let out = std::mem::take(&mut p.conns[q].pipe.borrow_mut().to_host);
    p.pump();
    out
}

#[test]
fn every_pdu_split_at_every_byte() {
    for d in [Digests::NONE, Digests::BOTH] {
        for chunk in [1usize, 3, 7, 100] {
            let mut p = Pair::new();
            let (a, q) = p.controller(d, 31, 0);
            // From here on every byte the hosts send reaches the engine in its own pass
            // (or `chunk` bytes per pass).
            p.conns[a].chunk = chunk;
            p.conns[q].chunk = chunk;
            p.conns[q].host.set_max_incapsule(1024);
            for (k, nlb) in [1u32, 2, 9].into_iter().enumerate() {
                let data = pattern(k as u64 + 1, nlb as usize * 512);
                let (cqe, _) = p.exec(q, rw(io::WRITE, 100, nlb), Xfer::ToController, data.clone());
                assert!(cqe.status().is_success(), "{d:?}/{chunk}: {}", cqe.status());
                let (cqe, back) = p.exec(
                    q,
                    rw(io::READ, 100, nlb),
                    Xfer::FromController,
                    vec![0; data.len()],
                );
                assert!(cqe.status().is_success());
                assert_eq!(back, data, "{d:?} chunk {chunk} nlb {nlb}");
            }
            let mut ka = Sqe::default();
            ka.set_opcode_cid(admin::KEEP_ALIVE, 0);
            assert!(p
                .exec(a, ka, Xfer::None, Vec::new())
                .0
                .status()
                .is_success());
            assert_eq!(p.io.commands_in_flight(), 0);
        }
    }
}

/// A write waiting for its data on connection `q` (R2Ts not answered); returns
/// (cid, ttag, r2t length).
fn pending_write(p: &mut Pair, q: usize, nlb: u32) -> (u16, u16, u32) {
    p.conns[q].auto_r2t = false;
    p.conns[q].host.set_max_incapsule(0);
    let cid = p.submit(
        q,
        rw(io::WRITE, 0, nlb),
        Xfer::ToController,
        pattern(1, nlb as usize * 512),
    );
    p.pump();
    let (c, ttag, off, len) = p.conns[q].r2ts.pop().expect("an R2T");
    assert_eq!((c, off, len), (cid, 0, nlb * 512));
    (cid, ttag, len)
}

/// Bad H2CData: the C2HTermReq carries the offending header, the QP goes away and every
/// command slot comes back; the other connection keeps working.
#[test]
fn bad_h2cdata_terminates_with_the_header_and_frees_everything() {
    type Forge = fn(u16, u16, u32) -> (u16, u16, u32, usize);
    let cases: [(&str, Forge, u16, u32); 5] = [
        (
            "wrong TTAG",
            |c, t, _| (c, t ^ 0x40, 0, 512),
            fes::INVALID_HEADER_FIELD,
            10,
        ),
        (
            "wrong CCCID",
            |c, t, _| (c ^ 1, t, 0, 512),
            fes::INVALID_HEADER_FIELD,
            8,
        ),
        (
            "out of order",
            |c, t, l| (c, t, l / 2, 512),
            fes::DATA_TRANSFER_OUT_OF_RANGE,
            12,
        ),
        (
            "overlong",
            |c, t, l| (c, t, 0, l as usize + 512),
            fes::DATA_TRANSFER_OUT_OF_RANGE,
            12,
        ),
        (
            "past the end",
            |c, t, l| (c, t, l - 512, 1024),
            fes::DATA_TRANSFER_OUT_OF_RANGE,
            12,
        ),
    ];
    for (what, forge, fes_want, fei_want) in cases {
        let mut p = Pair::with_config(crate::soft::SoftConfig {
            max_h2c_data: 64 * 1024,
            ..Default::default()
        });
        let (_, q) = p.controller(Digests::NONE, 31, 0);
        let (_, other) = {
            let o = p.open(Digests::NONE, 0);
            let cntlid = p.conns[q].cntlid;
            assert!(p.connect(o, cntlid, 2, 31, 0, 0).status().is_success());
            (0, o)
        };
        let (cid, ttag, len) = pending_write(&mut p, q, 16);
        let (c, t, off, n) = forge(cid, ttag, len);
        let mut pdu = Vec::new();
        tcp::encode_h2c_data(&mut pdu, c, t, off, &vec![5u8; n], true, Digests::NONE, 0);
        p.conns[q].send_raw(&pdu);
        let wire = raw_exchange(&mut p, q);
        // NVMe/TCP 1.0 Figure 24: C2HTermReq, FES, FEI, then the H2CData header.
        assert_eq!(wire[0], tcp::pdu_type::C2H_TERM_REQ, "{what}");
        assert_eq!(u16::from_le_bytes([wire[8], wire[9]]), fes_want, "{what}");
        assert_eq!(
            u32::from_le_bytes([wire[10], wire[11], wire[12], wire[13]]),
            fei_want,
            "{what}"
        );
        assert_eq!(&wire[24..], &pdu[..24], "{what}: the offending header");
        assert!(p.conns[q].target_closed(), "{what}: connection closed");
        assert!(p
            .transport_errors
            .iter()
            .any(|&(h, k)| h == p.conns[q].qp && k == TransportErrorKind::Protocol));
        // The application hears why, once, for its refusal log and metrics.
        assert_eq!(
            p.terminations,
            [Termination {
                qp: p.conns[q].qp,
                by_host: false,
                icreq: false,
                fes: fes_want,
                fei: fei_want,
            }],
            "{what}"
        );
        assert_eq!(p.io.commands_in_flight(), 0, "{what}: slots freed");
        // The other queue of the controller was torn down with it? No: only the admin
        // queue's loss ends the controller; I/O queue 2 keeps serving.
        let (cqe, _) = p.exec(
            other,
            rw(io::READ, 0, 1),
            Xfer::FromController,
            vec![0; 512],
        );
        assert!(cqe.status().is_success(), "{what}: {}", cqe.status());
    }
}

/// The host vanishes after an R2T, after part of the data, and with reads in flight:
/// the engine reports it, the QP is torn down and nothing stays allocated.
#[test]
fn disconnect_mid_transfer() {
    for partial in [false, true] {
        let mut p = Pair::new();
        let (a, q) = p.controller(Digests::BOTH, 31, 0);
        let (cid, ttag, len) = pending_write(&mut p, q, 64);
        if partial {
            let data = pattern(1, len as usize / 2);
            let mut pdu = Vec::new();
            tcp::encode_h2c_data(&mut pdu, cid, ttag, 0, &data, false, Digests::BOTH, 0);
            p.conns[q].send_raw(&pdu);
        }
        // Reads queued behind it, then the host is gone.
        for _ in 0..4 {
            p.submit(q, rw(io::READ, 0, 8), Xfer::FromController, vec![0; 4096]);
        }
        p.conns[q].close();
        p.pump();
        assert!(p.disconnected.contains(&p.conns[q].qp));
        assert!(p
            .transport_errors
            .iter()
            .any(|&(h, k)| h == p.conns[q].qp && k == TransportErrorKind::PeerClosed));
        assert_eq!(p.io.commands_in_flight(), 0, "partial {partial}");
        assert_eq!(
            disk(&p, 0, 64),
            vec![0; 64 * 512],
            "no partial write reached the disk"
        );
        // The admin queue still answers.
        let mut ka = Sqe::default();
        ka.set_opcode_cid(admin::KEEP_ALIVE, 0);
        assert!(p
            .exec(a, ka, Xfer::None, Vec::new())
            .0
            .status()
            .is_success());
    }
}

/// Keep-alive with simulated time: keep-alives within KATO keep the controller; silence
/// past it ends the association and the engine closes both queues.
#[test]
fn keep_alive_expiry_with_simulated_time() {
    let mut p = Pair::new();
    let a = p.admin(Digests::NONE, 31, 2_000);
    let q = p.open(Digests::NONE, 0);
    let cntlid = p.conns[a].cntlid;
    assert!(p.connect(q, cntlid, 1, 31, 0, 0).status().is_success());
    let mut ka = Sqe::default();
    ka.set_opcode_cid(admin::KEEP_ALIVE, 0);
    for _ in 0..5 {
        p.advance(Duration::from_millis(1_500));
        assert!(p
            .exec(a, ka, Xfer::None, Vec::new())
            .0
            .status()
            .is_success());
    }
    assert!(!p.conns[a].target_closed() && !p.conns[q].target_closed());
    p.advance(Duration::from_secs(30));
    assert!(p.conns[a].target_closed(), "admin queue closed");
    assert!(p.conns[q].target_closed(), "I/O queue closed");
    assert_eq!(p.disconnected.len(), 2);
    assert_eq!(p.io.qp_count(), 0);
}

/// A host that sends H2CTermReq: the engine closes quietly (no C2HTermReq back).
#[test]
fn host_term_req_closes_quietly() {
    let mut p = Pair::new();
    let (_, q) = p.controller(Digests::NONE, 31, 0);
    let mut pdu = Vec::new();
    tcp::encode_term_req(&mut pdu, false, fes::PDU_SEQUENCE_ERROR, 0, &[]);
    p.conns[q].send_raw(&pdu);
    let wire = raw_exchange(&mut p, q);
    assert!(wire.is_empty(), "nothing sent back");
    assert!(p.conns[q].target_closed());
    assert_eq!(
        p.terminations,
        [Termination {
            qp: p.conns[q].qp,
            by_host: true,
            icreq: false,
            fes: fes::PDU_SEQUENCE_ERROR,
            fei: 0,
        }]
    );
}

/// An ICReq the target cannot accept (PFV 1, NVMe/TCP 1.0 section 3.6.2.2): a C2HTermReq
/// with the ICReq's header, and the application is told the ICReq itself was rejected.
#[test]
fn rejected_icreq_is_reported_as_such() {
    let mut p = Pair::new();
    let q = p.open_without_icreq(Digests::NONE, 0);
    let mut icreq = Vec::new();
    tcp::encode_ic_req(
        &mut icreq,
        &tcp::IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::NONE,
            maxr2t: 0,
        },
    );
    icreq[8] = 1; // PFV (bytes 8-9 of the ICReq)
    p.conns[q].send_raw(&icreq);
    let wire = raw_exchange(&mut p, q);
    assert_eq!(wire[0], tcp::pdu_type::C2H_TERM_REQ);
    assert_eq!(&wire[24..], &icreq[..], "the whole 128-byte ICReq header");
    assert!(p.conns[q].target_closed());
    let t = p.terminations.as_slice();
    assert!(
        matches!(
            t,
            [Termination {
                by_host: false,
                icreq: true,
                ..
            }]
        ),
        "{t:?}"
    );
    assert_eq!(t[0].qp, p.conns[q].qp);
}

#[derive(Clone, Debug)]
enum Cmd {
    Write { slba: u16, nlb: u8, seed: u8 },
    Read { slba: u16, nlb: u8 },
    Flush,
    Zeroes { slba: u16, nlb: u8, fua: bool },
    Compare { slba: u16, nlb: u8, flip: bool },
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    /// The host closes after submitting everything.
    Vanish,
    /// H2CData with a wrong TTAG for a write submitted last.
    BadTtag,
    /// H2CData at the wrong offset for a write submitted last.
    OutOfOrder,
}

fn cmd_strategy() -> impl Strategy<Value = Cmd> {
    prop_oneof![
        (0u16..4000, 1u8..64, any::<u8>()).prop_map(|(slba, nlb, seed)| Cmd::Write {
            slba,
            nlb,
            seed
        }),
        (0u16..4000, 1u8..64).prop_map(|(slba, nlb)| Cmd::Read { slba, nlb }),
        Just(Cmd::Flush),
        (0u16..4000, 1u8..64, any::<bool>()).prop_map(|(slba, nlb, fua)| Cmd::Zeroes {
            slba,
            nlb,
            fua
        }),
        (0u16..4000, 1u8..16, any::<bool>()).prop_map(|(slba, nlb, flip)| Cmd::Compare {
            slba,
            nlb,
            flip
        }),
    ]
}

fn fault_strategy() -> impl Strategy<Value = Fault> {
    prop_oneof![
        Just(Fault::None),
        Just(Fault::Vanish),
        Just(Fault::BadTtag),
        Just(Fault::OutOfOrder)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random command mixes, pipelined up to 8 deep, bytes cut in random pieces, with and
    /// without digests and in-capsule data, then a random fault: every command before
    /// the fault completes as a model disk predicts; after it the engine has nothing
    /// left allocated and a fresh connection reads the model's bytes back.
    #[test]
    fn random_mixes_with_faults(cmds in prop::collection::vec(cmd_strategy(), 1..24),
                                chunk in 1usize..400, hdr: bool, dat: bool, incap: bool,
                                depth in 1usize..8, fault in fault_strategy()) {
        let d = Digests { header: hdr, data: dat };
        let mut p = Pair::new();
        let (a, q) = p.controller(d, 31, 0);
        p.conns[q].chunk = chunk;
        p.conns[q].host.set_max_incapsule(if incap { 8192 } else { 0 });
        let mut model = vec![0u8; BLOCKS as usize * 512];
        // Submitted, not yet checked: cid -> expected (status, read data).
        let mut expect: std::collections::HashMap<u16, (Status, Option<Vec<u8>>)> = Default::default();
        let mut done = 0;
        for c in &cmds {
            let (sqe, xfer, buf, want) = match *c {
                Cmd::Write { slba, nlb, seed } => {
                    let data = pattern(seed as u64, nlb as usize * 512);
                    model[slba as usize * 512..][..data.len()].copy_from_slice(&data);
                    (rw(io::WRITE, slba as u64, nlb as u32), Xfer::ToController, data, (Status::SUCCESS, None))
                }
                Cmd::Read { slba, nlb } => {
                    let want = model[slba as usize * 512..][..nlb as usize * 512].to_vec();
                    (rw(io::READ, slba as u64, nlb as u32), Xfer::FromController, vec![0; want.len()], (Status::SUCCESS, Some(want)))
                }
                Cmd::Flush => {
                    let mut s = Sqe::default();
                    s.set_opcode_cid(io::FLUSH, 0);
                    s.nsid = 1;
                    (s, Xfer::None, Vec::new(), (Status::SUCCESS, None))
                }
                Cmd::Zeroes { slba, nlb, fua } => {
                    model[slba as usize * 512..][..nlb as usize * 512].fill(0);
                    let mut s = rw(io::WRITE_ZEROES, slba as u64, nlb as u32);
                    if fua { s.cdw12 |= 1 << 30; }
                    (s, Xfer::None, Vec::new(), (Status::SUCCESS, None))
                }
                Cmd::Compare { slba, nlb, flip } => {
                    let mut data = model[slba as usize * 512..][..nlb as usize * 512].to_vec();
                    if flip { data[0] ^= 0x80; }
                    let st = if flip { Status::COMPARE_FAILURE } else { Status::SUCCESS };
                    (rw(io::COMPARE, slba as u64, nlb as u32), Xfer::ToController, data, (st, None))
                }
            };
            // Commands on overlapping blocks must not race: keep one in flight when the
            // model depends on order (writes, zeroes, compares), `depth` otherwise.
            let ordered = !matches!(c, Cmd::Read { .. } | Cmd::Flush);
            if ordered || expect.len() >= depth {
                p.pump();
                collect(&mut p, q, &mut expect, &mut done)?;
                prop_assert!(expect.is_empty(), "commands did not complete: {:?}", expect.keys());
            }
            let cid = p.submit(q, sqe, xfer, buf);
            expect.insert(cid, want);
            if ordered {
                p.pump();
                collect(&mut p, q, &mut expect, &mut done)?;
            }
        }
        p.pump();
        collect(&mut p, q, &mut expect, &mut done)?;
        prop_assert!(expect.is_empty());
        prop_assert_eq!(done, cmds.len());

        match fault {
            Fault::None => {}
            Fault::Vanish => {
                p.submit(q, rw(io::WRITE, 0, 8), Xfer::ToController, vec![1; 4096]);
                p.conns[q].close();
                p.pump();
            }
            Fault::BadTtag | Fault::OutOfOrder => {
                let (cid, ttag, len) = pending_write(&mut p, q, 16);
                let (t, off) = if matches!(fault, Fault::BadTtag) { (ttag ^ 1, 0) } else { (ttag, 512) };
                let mut pdu = Vec::new();
                tcp::encode_h2c_data(&mut pdu, cid, t, off, &vec![9u8; len as usize / 2], false, d, 0);
                p.conns[q].send_raw(&pdu);
                p.pump();
                prop_assert!(matches!(p.conns[q].error, Some(HostError::Terminated { .. })),
                             "{:?}", p.conns[q].error);
            }
        }
        if !matches!(fault, Fault::None) {
            prop_assert!(p.conns[q].target_closed());
            prop_assert!(p.disconnected.contains(&p.conns[q].qp));
        }
        prop_assert_eq!(p.io.commands_in_flight(), 0);
        // The association may have lost an I/O queue, never the data: read it all back
        // through a new I/O queue.
        let cntlid = p.conns[a].cntlid;
        let r = p.open(Digests::NONE, 0);
        prop_assert!(p.connect(r, cntlid, 3, 31, 0, 0).status().is_success());
        for chunk in 0..(BLOCKS as usize / 256) {
            let slba = chunk as u64 * 256;
            let (cqe, back) = p.exec(r, rw(io::READ, slba, 256), Xfer::FromController, vec![0; 131072]);
            prop_assert!(cqe.status().is_success());
            prop_assert!(back == model[slba as usize * 512..][..131072], "blocks {slba}..");
        }
    }
}

type Expect = std::collections::HashMap<u16, (Status, Option<Vec<u8>>)>;

fn collect(
    p: &mut Pair,
    q: usize,
    expect: &mut Expect,
    done: &mut usize,
) -> Result<(), TestCaseError> {
    prop_assert!(p.conns[q].error.is_none(), "{:?}", p.conns[q].error);
    while let Some((cid, cqe, buf)) = p.conns[q].completions.pop_front() {
        let Some((st, data)) = expect.remove(&cid) else {
            return Err(TestCaseError::fail(format!(
                "unexpected completion of CID {cid}"
            )));
        };
        prop_assert_eq!(cqe.status(), st, "CID {}", cid);
        if let Some(d) = data {
            prop_assert!(buf == d, "read data of CID {}", cid);
        }
        *done += 1;
    }
    Ok(())
}
