//! The `auth` harness: DH-HMAC-CHAP messages from the wire.
//!
//! Input: `[mode, then messages]`, each message `[len u16][bytes]`. Mode bit 0: the bytes
//! go to a controller-side [`Transaction`] as Authentication Send payloads, each followed
//! by an Authentication Receive with an allocation length from the input; otherwise they
//! go to a host-side [`HostTransaction`] as Challenge / Success1 answers, the host asking
//! for bidirectional authentication (it holds a controller key) when mode bit 1 is set.
//!
//! Checks: nothing panics; every Receive answer decodes as a DH-HMAC-CHAP message and fits
//! the allocation length; a transaction never reports success for a host that sent no
//! valid Reply (the fuzzer does not know the secret, so Authenticated means a bug); a
//! host that holds a controller key never accepts a Success1 (the fuzzer cannot compute
//! the controller's response either).

use nvmf::auth::ctrl::{CommandError, Event, Peer, Policy, Secrets, Transaction};
use nvmf::auth::host::{HostConfig, HostTransaction};
use nvmf::auth::key::DhchapKey;
use nvmf::auth::msg::Message;
use nvmf::auth::{sc_c, DhGroup, HashId};
use std::time::{Duration, Instant};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
const SUB: &str = "nqn.2024-01.io.example:sub1";

fn entropy() -> impl FnMut(&mut [u8]) {
    let mut n = 1u64;
    move |b: &mut [u8]| {
        for x in b.iter_mut() {
            n = n.wrapping_mul(6364136223846793005).wrapping_add(1);
            *x = (n >> 33) as u8;
        }
    }
}

pub fn run(input: &[u8]) {
    let mut inp = crate::Input::new(input);
    let mode = inp.u8();
    let key = DhchapKey::from_bytes(Some(HashId::Sha256), &[0x5a; 32]).expect("32 bytes");
    let now = Instant::now();
    let t = Duration::from_secs(10);
    if mode & 1 != 0 {
        let secrets = Secrets {
            host: key,
            ctrl: Some(DhchapKey::from_bytes(None, &[1; 32]).expect("32 bytes")),
        };
        // NULL and 2048 only: the fuzzer cannot know a secret, FFDHE-8192 only slows it.
        let policy = Policy {
            hashes: HashId::ALL.to_vec(),
            dhgroups: vec![DhGroup::Null, DhGroup::Ffdhe2048],
        };
        let peer = Peer {
            hostnqn: HOST,
            subnqn: SUB,
            secrets: &secrets,
            policy: &policy,
            concat: sc_c::NEWTLSPSK,
        };
        let mut tx = Transaction::new();
        let mut e = entropy();
        while !inp.is_empty() {
            let n = inp.u16() as usize % 2048;
            let msg = inp.bytes(n);
            let ev = tx.send(now, t, peer, &msg);
            // The DH work a Send leaves, run in place (the daemon runs it on its DH threads).
            tx.run_work(now, t, peer, &mut e);
            assert!(
                !matches!(ev, Event::Authenticated { .. }),
                "authenticated without the secret"
            );
            let al = inp.u16() as usize;
            match tx.receive(now, t, peer, &mut e, al) {
                Ok((out, ev)) => {
                    assert!(out.len() <= al, "answer longer than AL");
                    assert!(
                        Message::decode(&out).is_ok(),
                        "our own answer does not decode"
                    );
                    assert!(
                        !matches!(ev, Event::Authenticated { .. }),
                        "authenticated without the secret"
                    );
                }
                Err(CommandError::AllocationLength { need }) => assert!(need > al),
            }
        }
    } else {
        let bidirectional = mode & 2 != 0;
        let ctrl_key =
            bidirectional.then(|| DhchapKey::from_bytes(None, &[1; 32]).expect("32 bytes"));
        let mut h = HostTransaction::new(HostConfig::new(HOST, SUB, key, ctrl_key), 1);
        let mut e = entropy();
        let _ = h.negotiate();
        let n = inp.u16() as usize % 2048;
        let chal = inp.bytes(n);
        if let Ok(reply) = h.on_challenge(&chal, &mut e) {
            assert!(Message::decode(&reply).is_ok());
        }
        let rest = inp.rest();
        let verdict = h.on_success1(rest);
        if bidirectional {
            assert!(
                verdict.is_err(),
                "the host accepted a Success1 without the controller's secret: {verdict:?}"
            );
        }
    }
}

/// A Negotiate (NULL group offered), then a Reply shape, as starting points.
pub fn seeds() -> Vec<Vec<u8>> {
    let neg = Message::Negotiate {
        t_id: 1,
        sc_c: 0,
        hashes: vec![1, 2, 3],
        dhgroups: vec![0],
    }
    .encode();
    let reply = Message::Reply {
        t_id: 1,
        cvalid: true,
        seqnum: 7,
        response: vec![0; 32],
        challenge: vec![1; 32],
        dh_value: vec![],
    }
    .encode();
    let mut a = vec![1u8];
    for m in [&neg, &reply] {
        a.extend_from_slice(&(m.len() as u16).to_le_bytes());
        a.extend_from_slice(m);
        a.extend_from_slice(&4096u16.to_le_bytes());
    }
    let chal = Message::Challenge {
        t_id: 1,
        hash: 1,
        dhgroup: 0,
        seqnum: 3,
        challenge: vec![2; 32],
        dh_value: vec![],
    }
    .encode();
    let mut seeds = vec![a];
    for (mode, response) in [(0u8, None), (2, None), (2, Some(vec![0; 32]))] {
        let mut b = vec![mode];
        b.extend_from_slice(&(chal.len() as u16).to_le_bytes());
        b.extend_from_slice(&chal);
        b.extend_from_slice(
            &Message::Success1 {
                t_id: 1,
                hl: 32,
                response,
            }
            .encode(),
        );
        seeds.push(b);
    }
    seeds
}
