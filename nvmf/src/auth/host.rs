//! The host side of DH-HMAC-CHAP on one queue, for the repo's initiator: build the
//! Negotiate, answer the Challenge, check Success1 (and the controller's response when
//! authenticating both ways). The transport sends the bytes with Authentication
//! Send/Receive ([`super::msg::AuthCommand`]).

use super::ctrl::{augmented_challenge, ctrl_response, host_response};
use super::dh::KeyPair;
use super::key::DhchapKey;
use super::msg::{self, Message};
use super::{ct_eq, sc_c, DhGroup, Entropy, FailureReason, HashId};
use zeroize::Zeroizing;

/// The host's configuration for one controller.
#[derive(Clone, Debug)]
pub struct HostConfig {
    pub hostnqn: String,
    pub subnqn: String,
    /// The host's secret.
    pub key: DhchapKey,
    /// The controller's secret: set to authenticate the controller too.
    pub ctrl_key: Option<DhchapKey>,
    /// Offered hash functions and DH groups (the Linux host offers all of them).
    pub hashes: Vec<HashId>,
    pub dhgroups: Vec<DhGroup>,
    /// SC_C to ask for (secure channel concatenation), [`sc_c::NOSC`] normally.
    pub sc_c: u8,
}

impl HostConfig {
    pub fn new(hostnqn: &str, subnqn: &str, key: DhchapKey, ctrl_key: Option<DhchapKey>) -> Self {
        HostConfig {
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            key,
            ctrl_key,
            hashes: HashId::ALL.to_vec(),
            dhgroups: DhGroup::ALL.to_vec(),
            sc_c: sc_c::NOSC,
        }
    }
}

/// Why the host gave up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("the controller refused: {}", .0.text())]
    Refused(FailureReason),
    #[error("the controller chose what the host did not offer: {0}")]
    NotOffered(&'static str),
    #[error("malformed or unexpected message from the controller: {0}")]
    Protocol(String),
    #[error(
        "the controller's response did not verify (wrong controller secret, or not the controller)"
    )]
    ControllerNotAuthenticated,
}

impl HostError {
    /// The AUTH_Failure2 explanation to send for this error (none when the controller
    /// already failed the transaction).
    pub fn failure2_reason(&self) -> Option<FailureReason> {
        match self {
            HostError::Refused(_) => None,
            HostError::NotOffered("hash") => Some(FailureReason::HashUnusable),
            HostError::NotOffered(_) => Some(FailureReason::DhGroupUnusable),
            HostError::Protocol(_) => Some(FailureReason::IncorrectPayload),
            HostError::ControllerNotAuthenticated => Some(FailureReason::Failed),
        }
    }
}

/// One authentication transaction, host side.
pub struct HostTransaction {
    cfg: HostConfig,
    t_id: u16,
    hash: HashId,
    shared: Option<Zeroizing<Vec<u8>>>,
    c1: Zeroizing<Vec<u8>>,
    c2: Option<Zeroizing<Vec<u8>>>,
    s2: u32,
}

impl HostTransaction {
    pub fn new(cfg: HostConfig, t_id: u16) -> HostTransaction {
        HostTransaction {
            cfg,
            t_id,
            hash: HashId::Sha256,
            shared: None,
            c1: Zeroizing::new(Vec::new()),
            c2: None,
            s2: 0,
        }
    }

    /// AUTH_Negotiate.
    pub fn negotiate(&self) -> Vec<u8> {
        Message::Negotiate {
            t_id: self.t_id,
            sc_c: self.cfg.sc_c,
            hashes: self.cfg.hashes.iter().map(|h| h.id()).collect(),
            dhgroups: self.cfg.dhgroups.iter().map(|g| g.id()).collect(),
        }
        .encode()
    }

    /// AUTH_Failure2 with this explanation.
    pub fn failure2(&self, reason: FailureReason) -> Vec<u8> {
        Message::Failure {
            failure1: false,
            t_id: self.t_id,
            reason: msg::REASON_FAILED,
            explanation: reason.code(),
        }
        .encode()
    }

    fn check_common(&self, m: &Message) -> Result<(), HostError> {
        if let Message::Failure {
            failure1: true,
            explanation,
            ..
        } = m
        {
            return Err(HostError::Refused(
                FailureReason::from_code(*explanation).unwrap_or(FailureReason::Failed),
            ));
        }
        if m.t_id() != self.t_id {
            return Err(HostError::Protocol(format!(
                "T_ID {} instead of {}",
                m.t_id(),
                self.t_id
            )));
        }
        Ok(())
    }

    /// The Challenge (or a Failure1) from Auth Receive: the Reply to send.
    pub fn on_challenge(
        &mut self,
        data: &[u8],
        entropy: &mut dyn Entropy,
    ) -> Result<Vec<u8>, HostError> {
        let m = Message::decode(data).map_err(|e| HostError::Protocol(e.to_string()))?;
        self.check_common(&m)?;
        let Message::Challenge {
            hash,
            dhgroup,
            seqnum,
            challenge,
            dh_value,
            ..
        } = m
        else {
            return Err(HostError::Protocol(format!("{m:?} instead of a Challenge")));
        };
        let hash = HashId::from_id(hash)
            .filter(|h| self.cfg.hashes.contains(h))
            .ok_or(HostError::NotOffered("hash"))?;
        let group = DhGroup::from_id(dhgroup)
            .filter(|g| self.cfg.dhgroups.contains(g))
            .ok_or(HostError::NotOffered("DH group"))?;
        if challenge.len() != hash.output_len() || dh_value.len() != group.value_len() {
            return Err(HostError::Protocol("HL or DHVLEN do not fit".into()));
        }
        self.hash = hash;
        let mut my_public = Vec::new();
        if group != DhGroup::Null {
            let kp = KeyPair::generate(group, entropy)
                .map_err(|e| HostError::Protocol(e.to_string()))?;
            self.shared = Some(
                kp.shared_secret(&dh_value)
                    .map_err(|e| HostError::Protocol(e.to_string()))?,
            );
            my_public = kp.public().to_vec();
        }
        self.c1 = Zeroizing::new(challenge);
        let ca = self.augmented(&self.c1);
        let response = host_response(
            hash,
            &self.cfg.key,
            &ca,
            seqnum,
            self.t_id,
            self.cfg.sc_c,
            &self.cfg.hostnqn,
            &self.cfg.subnqn,
        );
        let bidirectional = self.cfg.ctrl_key.is_some();
        let concat = self.cfg.sc_c != sc_c::NOSC;
        let (cvalid, s2) = if bidirectional || concat {
            let mut c2 = Zeroizing::new(vec![0u8; hash.output_len()]);
            entropy.fill(&mut c2);
            self.c2 = Some(c2);
            let mut s = [0u8; 4];
            // S2 = 0 says "C2 for the PSK only, do not authenticate back".
            if bidirectional {
                while u32::from_le_bytes(s) == 0 {
                    entropy.fill(&mut s);
                }
            }
            (true, u32::from_le_bytes(s))
        } else {
            (false, 0)
        };
        self.s2 = s2;
        Ok(Message::Reply {
            t_id: self.t_id,
            cvalid,
            seqnum: s2,
            response: response.to_vec(),
            challenge: self.c2.as_deref().map(|c| c.to_vec()).unwrap_or_default(),
            dh_value: my_public,
        }
        .encode())
    }

    fn augmented(&self, c: &[u8]) -> Zeroizing<Vec<u8>> {
        match &self.shared {
            None => Zeroizing::new(c.to_vec()),
            Some(s) => augmented_challenge(self.hash, s, c),
        }
    }

    /// Success1 (or a Failure1) from Auth Receive: `Some(Success2)` to send when
    /// authenticating the controller too, `None` when done.
    pub fn on_success1(&mut self, data: &[u8]) -> Result<Option<Vec<u8>>, HostError> {
        let m = Message::decode(data).map_err(|e| HostError::Protocol(e.to_string()))?;
        self.check_common(&m)?;
        let Message::Success1 { response, .. } = m else {
            return Err(HostError::Protocol(format!("{m:?} instead of Success1")));
        };
        let Some(ctrl_key) = &self.cfg.ctrl_key else {
            return Ok(None);
        };
        let r = response.ok_or(HostError::ControllerNotAuthenticated)?;
        let c2 = self
            .c2
            .as_ref()
            .ok_or(HostError::ControllerNotAuthenticated)?;
        let expected = ctrl_response(
            self.hash,
            ctrl_key,
            &self.augmented(c2),
            self.s2,
            self.t_id,
            self.cfg.sc_c,
            &self.cfg.subnqn,
            &self.cfg.hostnqn,
        );
        if !ct_eq(&expected, &r) {
            return Err(HostError::ControllerNotAuthenticated);
        }
        Ok(Some(Message::Success2 { t_id: self.t_id }.encode()))
    }

    /// The generated PSK for secure channel concatenation, after a successful exchange
    /// that asked for it: HMAC(KS, C1 || C2) with the negotiated hash.
    pub fn generated_psk(&self) -> Option<(HashId, Zeroizing<Vec<u8>>)> {
        let (s, c2) = (self.shared.as_ref()?, self.c2.as_ref()?);
        (self.cfg.sc_c != sc_c::NOSC).then(|| (self.hash, self.hash.hmac(s, &[&self.c1, c2])))
    }
}

#[cfg(test)]
mod tests {
    use super::super::ctrl::{Event, Peer, Policy, Secrets, Transaction};
    use super::*;
    use std::time::{Duration, Instant};

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
    const SUB: &str = "nqn.2026-11.dev.nvmf-target:disk0";
    const T: Duration = Duration::from_secs(10);

    fn entropy(seed: u64) -> impl FnMut(&mut [u8]) {
        let mut n = seed;
        move |buf: &mut [u8]| {
            for b in buf.iter_mut() {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *b = (n >> 33) as u8;
            }
        }
    }

    fn key(t: Option<HashId>, fill: u8, len: usize) -> DhchapKey {
        DhchapKey::from_bytes(t, &vec![fill; len]).unwrap()
    }

    /// An Authentication Send to the controller, its DH work (if any) run at once.
    fn send(c: &mut Transaction, now: Instant, peer: Peer<'_>, m: &[u8]) -> Event {
        let ev = c.send(now, T, peer, m);
        c.run_work(now, T, peer, &mut entropy(3));
        ev
    }

    /// Runs a whole transaction between the two machines; returns the controller's final
    /// event and the host's error, if any.
    fn run(
        host: HostConfig,
        secrets: &Secrets,
        policy: &Policy,
    ) -> (Event, Option<HostError>, Transaction, HostTransaction) {
        let now = Instant::now();
        let peer = Peer {
            hostnqn: HOST,
            subnqn: SUB,
            secrets,
            policy,
            concat: sc_c::NEWTLSPSK,
        };
        let mut c = Transaction::new();
        let mut h = HostTransaction::new(host, 0x42);
        let mut ec = entropy(1);
        let mut eh = entropy(2);
        assert_eq!(send(&mut c, now, peer, &h.negotiate()), Event::None);
        let (chal, ev) = c.receive(now, T, peer, &mut ec, 4096).unwrap();
        if ev != Event::None {
            let err = h.on_challenge(&chal, &mut eh).unwrap_err();
            return (ev, Some(err), c, h);
        }
        let reply = match h.on_challenge(&chal, &mut eh) {
            Ok(r) => r,
            Err(e) => {
                let ev = send(&mut c, now, peer, &h.failure2(e.failure2_reason().unwrap()));
                return (ev, Some(e), c, h);
            }
        };
        assert_eq!(send(&mut c, now, peer, &reply), Event::None);
        let (s1, ev) = c.receive(now, T, peer, &mut ec, 4096).unwrap();
        match h.on_success1(&s1) {
            Ok(Some(s2)) => {
                assert_eq!(ev, Event::None);
                (send(&mut c, now, peer, &s2), None, c, h)
            }
            Ok(None) => (ev, None, c, h),
            Err(e) => {
                let ev2 = match e.failure2_reason() {
                    Some(r) => send(&mut c, now, peer, &h.failure2(r)),
                    None => ev,
                };
                (ev2, Some(e), c, h)
            }
        }
    }

    #[test]
    fn unidirectional_every_hash_and_group() {
        for hash in HashId::ALL {
            for group in [DhGroup::Null, DhGroup::Ffdhe2048, DhGroup::Ffdhe4096] {
                for t in [None, Some(HashId::Sha256), Some(HashId::Sha512)] {
                    let k = key(t, 0x33, 48);
                    let secrets = Secrets {
                        host: k.clone(),
                        ctrl: None,
                    };
                    let policy = Policy {
                        hashes: vec![hash],
                        dhgroups: vec![group],
                    };
                    let (ev, err, c, _) =
                        run(HostConfig::new(HOST, SUB, k, None), &secrets, &policy);
                    assert_eq!(err, None, "{hash:?} {group:?} {t:?}");
                    assert_eq!(
                        ev,
                        Event::Authenticated {
                            bidirectional: false
                        }
                    );
                    assert!(c.authenticated());
                    assert_eq!(c.selected(), (hash, group));
                }
            }
        }
    }

    #[test]
    fn bidirectional() {
        let hk = key(Some(HashId::Sha256), 1, 32);
        let ck = key(Some(HashId::Sha384), 2, 48);
        let secrets = Secrets {
            host: hk.clone(),
            ctrl: Some(ck.clone()),
        };
        let (ev, err, c, _) = run(
            HostConfig::new(HOST, SUB, hk.clone(), Some(ck)),
            &secrets,
            &Policy::default(),
        );
        assert_eq!(err, None);
        assert_eq!(
            ev,
            Event::Authenticated {
                bidirectional: true
            }
        );
        assert_eq!(c.selected(), (HashId::Sha256, DhGroup::Ffdhe2048));
        // The host holds a different controller secret: it refuses us with Failure2.
        let (ev, err, c, _) = run(
            HostConfig::new(HOST, SUB, hk, Some(key(None, 9, 32))),
            &secrets,
            &Policy::default(),
        );
        assert_eq!(err, Some(HostError::ControllerNotAuthenticated));
        assert_eq!(
            ev,
            Event::Failed {
                reason: FailureReason::Failed,
                by_host: true
            }
        );
        assert!(!c.authenticated());
    }

    #[test]
    fn wrong_host_secret_is_failure1() {
        let secrets = Secrets {
            host: key(None, 1, 32),
            ctrl: None,
        };
        let (ev, err, c, _) = run(
            HostConfig::new(HOST, SUB, key(None, 2, 32), None),
            &secrets,
            &Policy::default(),
        );
        assert_eq!(
            ev,
            Event::Failed {
                reason: FailureReason::Failed,
                by_host: false
            }
        );
        assert_eq!(err, Some(HostError::Refused(FailureReason::Failed)));
        assert!(!c.authenticated());
    }

    /// The host asks us to authenticate back but the target has no controller secret.
    #[test]
    fn bidirectional_without_controller_secret() {
        let hk = key(None, 1, 32);
        let secrets = Secrets {
            host: hk.clone(),
            ctrl: None,
        };
        let (ev, err, _, _) = run(
            HostConfig::new(HOST, SUB, hk, Some(key(None, 2, 32))),
            &secrets,
            &Policy::default(),
        );
        assert_eq!(
            ev,
            Event::Failed {
                reason: FailureReason::Failed,
                by_host: false
            }
        );
        assert!(err.is_some());
    }

    #[test]
    fn nothing_in_common() {
        let hk = key(None, 1, 32);
        let secrets = Secrets {
            host: hk.clone(),
            ctrl: None,
        };
        let mut cfg = HostConfig::new(HOST, SUB, hk.clone(), None);
        cfg.hashes = vec![HashId::Sha512];
        let policy = Policy {
            hashes: vec![HashId::Sha256],
            dhgroups: vec![DhGroup::Null],
        };
        let (ev, _, _, _) = run(cfg, &secrets, &policy);
        assert_eq!(
            ev,
            Event::Failed {
                reason: FailureReason::HashUnusable,
                by_host: false
            }
        );
        let mut cfg = HostConfig::new(HOST, SUB, hk, None);
        cfg.dhgroups = vec![DhGroup::Null];
        let policy = Policy {
            hashes: vec![HashId::Sha256],
            dhgroups: vec![DhGroup::Ffdhe2048],
        };
        let (ev, _, _, _) = run(cfg, &secrets, &policy);
        assert_eq!(
            ev,
            Event::Failed {
                reason: FailureReason::DhGroupUnusable,
                by_host: false
            }
        );
    }

    /// Secure channel concatenation: both sides derive the same generated PSK, and the
    /// NULL group is not allowed for it.
    #[test]
    fn concatenation_generates_the_same_psk() {
        let hk = key(None, 1, 32);
        let secrets = Secrets {
            host: hk.clone(),
            ctrl: None,
        };
        let mut cfg = HostConfig::new(HOST, SUB, hk.clone(), None);
        cfg.sc_c = sc_c::NEWTLSPSK;
        let (ev, err, c, h) = run(cfg.clone(), &secrets, &Policy::default());
        assert_eq!(err, None);
        assert!(matches!(ev, Event::Authenticated { .. }));
        let (hh, hp) = h.generated_psk().unwrap();
        let (ch, cp) = c.generated_psk().unwrap();
        assert_eq!((hh, &hp[..]), (ch, cp));
        cfg.dhgroups = vec![DhGroup::Null];
        let (ev, _, _, _) = run(cfg, &secrets, &Policy::default());
        assert_eq!(
            ev,
            Event::Failed {
                reason: FailureReason::ConcatMismatch,
                by_host: false
            }
        );
    }

    #[test]
    fn out_of_order_and_garbage() {
        let now = Instant::now();
        let secrets = Secrets {
            host: key(None, 1, 32),
            ctrl: None,
        };
        let policy = Policy::default();
        let peer = Peer {
            hostnqn: HOST,
            subnqn: SUB,
            secrets: &secrets,
            policy: &policy,
            concat: sc_c::NEWTLSPSK,
        };
        let mut e = entropy(5);
        // Receive before any Negotiate.
        let mut c = Transaction::new();
        let (m, ev) = c.receive(now, T, peer, &mut e, 4096).unwrap();
        assert_eq!(m, vec![0, 0xf1, 0, 0, 0, 0, 1, 7]);
        assert!(matches!(ev, Event::Failed { .. }));
        // A Reply with no transaction.
        let mut c = Transaction::new();
        let reply = Message::Reply {
            t_id: 0,
            cvalid: false,
            seqnum: 0,
            response: vec![0; 32],
            challenge: vec![],
            dh_value: vec![],
        };
        send(&mut c, now, peer, &reply.encode());
        let (m, _) = c.receive(now, T, peer, &mut e, 4096).unwrap();
        assert_eq!(m[7], FailureReason::IncorrectProtocolMessage.code());
        // Garbage payload.
        let mut c = Transaction::new();
        send(&mut c, now, peer, &[0xff; 3]);
        let (m, _) = c.receive(now, T, peer, &mut e, 4096).unwrap();
        assert_eq!(m[7], FailureReason::IncorrectPayload.code());
        // AL too small for the Challenge: an NVMe error, state kept.
        let mut c = Transaction::new();
        let h = HostTransaction::new(HostConfig::new(HOST, SUB, key(None, 1, 32), None), 1);
        send(&mut c, now, peer, &h.negotiate());
        assert!(c.receive(now, T, peer, &mut e, 16).is_err());
        let (m, ev) = c.receive(now, T, peer, &mut e, 4096).unwrap();
        assert_eq!((m[1], ev), (msg::auth_id::CHALLENGE, Event::None));
        // Wrong T_ID on the Reply.
        let reply = Message::Reply {
            t_id: 2,
            cvalid: false,
            seqnum: 0,
            response: vec![0; 32],
            challenge: vec![],
            dh_value: vec![0; 256],
        };
        send(&mut c, now, peer, &reply.encode());
        let (m, _) = c.receive(now, T, peer, &mut e, 4096).unwrap();
        assert_eq!(m[7], FailureReason::IncorrectProtocolMessage.code());
    }

    #[test]
    fn step_deadline_drops_the_transaction() {
        let now = Instant::now();
        let secrets = Secrets {
            host: key(None, 1, 32),
            ctrl: None,
        };
        let policy = Policy::default();
        let peer = Peer {
            hostnqn: HOST,
            subnqn: SUB,
            secrets: &secrets,
            policy: &policy,
            concat: sc_c::NEWTLSPSK,
        };
        let mut c = Transaction::new();
        let h = HostTransaction::new(HostConfig::new(HOST, SUB, key(None, 1, 32), None), 1);
        send(&mut c, now, peer, &h.negotiate());
        assert!(c.in_progress());
        assert!(!c.poll_timeout(now + T - Duration::from_millis(1)));
        assert!(c.poll_timeout(now + T));
        assert!(!c.in_progress() && !c.authenticated());
    }

    /// Re-authentication: a second Negotiate on an authenticated queue runs a new
    /// transaction; the queue stays authenticated meanwhile.
    #[test]
    fn reauthentication() {
        let hk = key(None, 1, 32);
        let secrets = Secrets {
            host: hk.clone(),
            ctrl: None,
        };
        let policy = Policy::default();
        let (_, _, mut c, _) = run(
            HostConfig::new(HOST, SUB, hk.clone(), None),
            &secrets,
            &policy,
        );
        assert!(c.authenticated());
        let now = Instant::now();
        let peer = Peer {
            hostnqn: HOST,
            subnqn: SUB,
            secrets: &secrets,
            policy: &policy,
            concat: sc_c::NEWTLSPSK,
        };
        let mut h = HostTransaction::new(HostConfig::new(HOST, SUB, hk, None), 7);
        let mut e = entropy(9);
        send(&mut c, now, peer, &h.negotiate());
        assert!(c.authenticated() && c.in_progress());
        let (chal, _) = c.receive(now, T, peer, &mut e, 4096).unwrap();
        let reply = h.on_challenge(&chal, &mut entropy(10)).unwrap();
        send(&mut c, now, peer, &reply);
        let (s1, ev) = c.receive(now, T, peer, &mut e, 4096).unwrap();
        assert_eq!(h.on_success1(&s1).unwrap(), None);
        assert_eq!(
            ev,
            Event::Authenticated {
                bidirectional: false
            }
        );
    }
}
