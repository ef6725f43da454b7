//! The controller side of DH-HMAC-CHAP on one queue (NVMe Base 2.0 section 8.13.5).
//!
//! ```text
//!   host                                   controller (this)
//!   Auth Send    AUTH_Negotiate       ->   pick hash and DH group
//!   Auth Receive                      <-   DH-HMAC-CHAP_Challenge (C1, S1, g^x)
//!   Auth Send    DH-HMAC-CHAP_Reply   ->   check R1; C2, S2 if bidirectional
//!   Auth Receive                      <-   DH-HMAC-CHAP_Success1 (R2 if bidirectional)
//!   Auth Send    DH-HMAC-CHAP_Success2 ->  (bidirectional only) done
//! ```
//!
//! A problem found in an Auth Send is answered by the next Auth Receive with
//! AUTH_Failure1 (the Send itself completes successfully, as nvmet does and the Linux host
//! expects); the host may answer our R2 with AUTH_Failure2. Either ends the transaction as
//! failed: the caller tears the controller down (nvmet raises a fatal error).
//!
//! The two modular exponentiations of a DH exchange (our key pair after a Negotiate, the
//! shared secret after a Reply) cost up to tens of milliseconds each with FFDHE-8192, so
//! the Send that needs one leaves it as [`DhWork`] ([`Transaction::take_work`]) for the
//! caller to run where it likes, and waits for [`Transaction::dh_done`]. The target runs
//! them off the threads that serve other hosts.
//!
//! The responses (section 8.13.5.6), with Ca = C1 for the NULL group, else
//! HMAC(H(g^xy mod p), C1), and Kh' / Kc' the transformed secrets ([`super::key`]):
//!
//! ```text
//! R1 = HMAC(Kh', Ca  || S1 || T_ID || SC_C || "HostHost"   || NQNh || 00h || NQNc)
//! R2 = HMAC(Kc', Ca2 || S2 || T_ID || SC_C || "Controller" || NQNc || 00h || NQNh)
//! ```
//! (S1, S2 little-endian 32 bits, T_ID little-endian 16 bits, SC_C one byte.)

use super::dh::{DhError, KeyPair};
use super::key::DhchapKey;
use super::msg::{self, Message};
use super::{ct_eq, sc_c, DhGroup, Entropy, FailureReason, HashId};
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// What this controller accepts, in order of preference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub hashes: Vec<HashId>,
    pub dhgroups: Vec<DhGroup>,
}

impl Default for Policy {
    /// SHA-256/384/512 and every FFDHE group before NULL: with DH the exchange also
    /// protects against a passive observer replaying responses.
    fn default() -> Policy {
        Policy {
            hashes: HashId::ALL.to_vec(),
            dhgroups: vec![
                DhGroup::Ffdhe2048,
                DhGroup::Ffdhe3072,
                DhGroup::Ffdhe4096,
                DhGroup::Ffdhe6144,
                DhGroup::Ffdhe8192,
                DhGroup::Null,
            ],
        }
    }
}

/// A host's secrets as the target knows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Secrets {
    /// The host's secret (`--dhchap-secret` on the host).
    pub host: DhchapKey,
    /// The controller's secret for bidirectional authentication (`--dhchap-ctrl-secret`).
    pub ctrl: Option<DhchapKey>,
}

/// Who is authenticating to whom.
#[derive(Clone, Copy, Debug)]
pub struct Peer<'a> {
    pub hostnqn: &'a str,
    pub subnqn: &'a str,
    pub secrets: &'a Secrets,
    pub policy: &'a Policy,
    /// The secure channel concatenation this queue may ask for besides none:
    /// [`sc_c::NEWTLSPSK`] on an admin queue without TLS, [`sc_c::REPLACETLSPSK`] on one
    /// with TLS, [`sc_c::NOSC`] (none) on I/O queues (TP 8018; nvmet's rules).
    pub concat: u8,
}

/// What a step changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Nothing final yet.
    None,
    /// The host is authenticated (and, if `bidirectional`, has verified us).
    Authenticated { bidirectional: bool },
    /// The transaction failed. `by_host`: the host sent AUTH_Failure2 (it did not accept
    /// our response, or gave up); otherwise we sent AUTH_Failure1.
    Failed {
        reason: FailureReason,
        by_host: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Waiting for AUTH_Negotiate.
    Negotiate,
    /// Negotiated a DH group; waiting for our key pair ([`DhWork::KeyPair`]).
    AwaitKeyPair,
    /// The next Auth Receive returns the Challenge.
    Challenge,
    /// Waiting for the Reply.
    Reply,
    /// Got the Reply; waiting for the shared secret ([`DhWork::SharedSecret`]).
    AwaitShared,
    /// The next Auth Receive returns Success1.
    Success1,
    /// Waiting for Success2 (bidirectional).
    Success2,
    /// The next Auth Receive returns Failure1 with this reason.
    Failure1(FailureReason),
}

/// Errors that are answered with an NVMe status instead of a protocol message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandError {
    /// AL too small for the message due (the host may retry with a larger one).
    AllocationLength { need: usize },
}

/// A modular exponentiation a step waits for (see the module docs).
pub enum DhWork {
    /// Our ephemeral key pair in the negotiated group.
    KeyPair(DhGroup),
    /// The shared secret from our key pair and the host's public value.
    SharedSecret {
        keypair: KeyPair,
        host_value: Vec<u8>,
    },
}

impl std::fmt::Debug for DhWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DhWork::KeyPair(g) => write!(f, "KeyPair({g:?})"),
            DhWork::SharedSecret { keypair, .. } => {
                write!(f, "SharedSecret({:?})", keypair.group())
            }
        }
    }
}

/// What [`DhWork::run`] computed.
pub enum DhDone {
    KeyPair(Result<KeyPair, DhError>),
    SharedSecret(Result<Zeroizing<Vec<u8>>, DhError>),
}

impl DhWork {
    /// Do the work (the slow part: call it where a wait of tens of milliseconds hurts
    /// no one).
    pub fn run(self, entropy: &mut dyn Entropy) -> DhDone {
        match self {
            DhWork::KeyPair(g) => DhDone::KeyPair(KeyPair::generate(g, entropy)),
            DhWork::SharedSecret {
                keypair,
                host_value,
            } => DhDone::SharedSecret(keypair.shared_secret(&host_value)),
        }
    }

    /// The group whose arithmetic it is.
    pub fn group(&self) -> DhGroup {
        match self {
            DhWork::KeyPair(g) => *g,
            DhWork::SharedSecret { keypair, .. } => keypair.group(),
        }
    }
}

/// The parts of a Reply that are checked once the shared secret is known.
struct PendingReply {
    cvalid: bool,
    seqnum: u32,
    response: Vec<u8>,
    challenge: Zeroizing<Vec<u8>>,
}

/// One queue's DH-HMAC-CHAP state on the controller.
pub struct Transaction {
    step: Step,
    t_id: u16,
    sc_c: u8,
    hash: HashId,
    group: DhGroup,
    c1: Zeroizing<Vec<u8>>,
    s1: u32,
    keypair: Option<KeyPair>,
    shared: Option<Zeroizing<Vec<u8>>>,
    c2: Option<Zeroizing<Vec<u8>>>,
    s2: u32,
    authenticated: bool,
    /// Deadline of the step in progress (`None` when idle).
    deadline: Option<Instant>,
    generated_psk: Option<Zeroizing<Vec<u8>>>,
    /// The work the last Send left for the caller.
    work: Option<DhWork>,
    /// A Reply waiting for its shared secret.
    pending_reply: Option<PendingReply>,
}

impl Default for Transaction {
    fn default() -> Self {
        Transaction::new()
    }
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("step", &self.step)
            .field("t_id", &self.t_id)
            .field("hash", &self.hash)
            .field("group", &self.group)
            .field("authenticated", &self.authenticated)
            .finish_non_exhaustive()
    }
}

impl Transaction {
    pub fn new() -> Transaction {
        Transaction {
            step: Step::Negotiate,
            t_id: 0,
            sc_c: 0,
            hash: HashId::Sha256,
            group: DhGroup::Null,
            c1: Zeroizing::new(Vec::new()),
            s1: 0,
            keypair: None,
            shared: None,
            c2: None,
            s2: 0,
            authenticated: false,
            deadline: None,
            generated_psk: None,
            work: None,
            pending_reply: None,
        }
    }

    /// Whether the queue has authenticated (a re-authentication in progress does not
    /// take that away until it fails).
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }
    /// A transaction is under way.
    pub fn in_progress(&self) -> bool {
        self.step != Step::Negotiate
    }
    /// The last Send left DH work and waits for its result ([`Transaction::dh_done`]).
    pub fn awaiting_dh(&self) -> bool {
        matches!(self.step, Step::AwaitKeyPair | Step::AwaitShared)
    }
    /// The DH work the last Send left, if any (once).
    pub fn take_work(&mut self) -> Option<DhWork> {
        self.work.take()
    }
    /// The hash and DH group the last Negotiate settled on.
    pub fn selected(&self) -> (HashId, DhGroup) {
        (self.hash, self.group)
    }
    /// The deadline of the step in progress (none while the step waits for its DH work:
    /// that wait is the target's, not the host's).
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline.filter(|_| !self.awaiting_dh())
    }
    /// The PSK generated for secure channel concatenation (TP 8018), once a transaction
    /// with SC_C set succeeded: HMAC(KS, C1 || C2).
    pub fn generated_psk(&self) -> Option<(HashId, &[u8])> {
        self.generated_psk.as_deref().map(|p| (self.hash, &p[..]))
    }
    /// SC_C of the last Negotiate.
    pub fn sc_c(&self) -> u8 {
        self.sc_c
    }

    /// A step's deadline passed: the transaction is dropped (nvmet resets it the same
    /// way); an already authenticated queue stays authenticated. Returns whether
    /// anything was dropped.
    pub fn poll_timeout(&mut self, now: Instant) -> bool {
        if self.deadline().is_some_and(|d| d <= now) {
            self.reset_transaction();
            return true;
        }
        false
    }

    fn reset_transaction(&mut self) {
        self.step = Step::Negotiate;
        self.deadline = None;
        self.keypair = None;
        self.shared = None;
        self.c2 = None;
        self.c1 = Zeroizing::new(Vec::new());
        self.work = None;
        self.pending_reply = None;
    }

    fn fail(&mut self, reason: FailureReason) {
        self.step = Step::Failure1(reason);
    }

    /// Authentication Send with this payload (already checked: SECP E9h, SPSP 01h, TL > 0).
    pub fn send(&mut self, now: Instant, timeout: Duration, peer: Peer<'_>, data: &[u8]) -> Event {
        self.deadline = Some(now + timeout);
        let m = match Message::decode(data) {
            Ok(m) => m,
            Err(msg::DecodeError::Unknown(..)) => {
                self.fail(FailureReason::IncorrectProtocolMessage);
                return Event::None;
            }
            Err(_) => {
                self.fail(FailureReason::IncorrectPayload);
                return Event::None;
            }
        };
        match m {
            // A Negotiate (re)starts a transaction whatever the state: re-authentication
            // (section 8.13.4), or a host starting over.
            Message::Negotiate {
                t_id,
                sc_c,
                hashes,
                dhgroups,
            } => {
                self.reset_transaction();
                self.deadline = Some(now + timeout);
                self.t_id = t_id;
                self.sc_c = sc_c;
                self.generated_psk = None;
                if let Err(r) = self.negotiate(peer, sc_c, &hashes, &dhgroups) {
                    self.fail(r);
                } else if self.group == DhGroup::Null {
                    self.step = Step::Challenge;
                } else {
                    self.work = Some(DhWork::KeyPair(self.group));
                    self.step = Step::AwaitKeyPair;
                }
                Event::None
            }
            Message::Failure {
                failure1: false,
                explanation,
                ..
            } => {
                let reason = FailureReason::from_code(explanation).unwrap_or(FailureReason::Failed);
                self.reset_transaction();
                self.authenticated = false;
                Event::Failed {
                    reason,
                    by_host: true,
                }
            }
            m if m.t_id() != self.t_id || self.step == Step::Negotiate => {
                self.fail(FailureReason::IncorrectProtocolMessage);
                Event::None
            }
            Message::Reply {
                cvalid,
                seqnum,
                response,
                challenge,
                dh_value,
                ..
            } if self.step == Step::Reply => {
                let reply = PendingReply {
                    cvalid,
                    seqnum,
                    response,
                    challenge: Zeroizing::new(challenge),
                };
                if self.group == DhGroup::Null {
                    if dh_value.is_empty() {
                        self.finish_reply(peer, reply);
                    } else {
                        self.fail(FailureReason::IncorrectPayload);
                    }
                } else if reply.response.len() != self.hash.output_len() {
                    // Checked before any DH work is spent on it.
                    self.fail(FailureReason::IncorrectPayload);
                } else if let Some(keypair) = self.keypair.take() {
                    self.work = Some(DhWork::SharedSecret {
                        keypair,
                        host_value: dh_value,
                    });
                    self.pending_reply = Some(reply);
                    self.step = Step::AwaitShared;
                } else {
                    self.fail(FailureReason::Failed);
                }
                Event::None
            }
            Message::Success2 { .. } if self.step == Step::Success2 => {
                self.finish();
                Event::Authenticated {
                    bidirectional: true,
                }
            }
            _ => {
                self.fail(FailureReason::IncorrectProtocolMessage);
                Event::None
            }
        }
    }

    fn negotiate(
        &mut self,
        peer: Peer<'_>,
        sc: u8,
        hashes: &[u8],
        dhgroups: &[u8],
    ) -> Result<(), FailureReason> {
        if sc != sc_c::NOSC && sc != peer.concat {
            return Err(FailureReason::ConcatMismatch);
        }
        self.hash = peer
            .policy
            .hashes
            .iter()
            .copied()
            // The TLS PSK derivation is defined for SHA-256 and SHA-384 only.
            .filter(|h| sc == sc_c::NOSC || *h != HashId::Sha512)
            .find(|h| hashes.contains(&h.id()))
            .ok_or(FailureReason::HashUnusable)?;
        self.group = peer
            .policy
            .dhgroups
            .iter()
            .copied()
            // Secure channel concatenation needs a DH exchange (TP 8018).
            .filter(|g| sc == sc_c::NOSC || *g != DhGroup::Null)
            .find(|g| dhgroups.contains(&g.id()))
            .ok_or(if sc != sc_c::NOSC && dhgroups.iter().all(|&g| g == 0) {
                FailureReason::ConcatMismatch
            } else {
                FailureReason::DhGroupUnusable
            })?;
        Ok(())
    }

    /// The result of the work the last Send left, at `now`: the step's deadline starts
    /// over (`timeout`), since the host could not go on while the work waited. Ignored
    /// when the transaction no longer waits for it (the host started over).
    pub fn dh_done(&mut self, now: Instant, timeout: Duration, peer: Peer<'_>, done: DhDone) {
        if self.awaiting_dh() {
            self.deadline = Some(now + timeout);
        }
        match (self.step, done) {
            (Step::AwaitKeyPair, DhDone::KeyPair(Ok(kp))) => {
                self.keypair = Some(kp);
                self.step = Step::Challenge;
            }
            (Step::AwaitKeyPair, DhDone::KeyPair(Err(_))) => {
                self.fail(FailureReason::DhGroupUnusable)
            }
            (Step::AwaitShared, DhDone::SharedSecret(r)) => {
                let reply = self.pending_reply.take();
                match (r, reply) {
                    (Ok(s), Some(reply)) => {
                        self.shared = Some(s);
                        self.finish_reply(peer, reply);
                    }
                    (Err(_), _) => self.fail(FailureReason::DhGroupUnusable),
                    (Ok(_), None) => self.fail(FailureReason::Failed),
                }
            }
            _ => {}
        }
    }

    /// The work the last Send left cannot be finished (the host's credentials went):
    /// the next Receive answers Failure1.
    pub fn dh_failed(&mut self) {
        if self.awaiting_dh() {
            self.work = None;
            self.pending_reply = None;
            self.fail(FailureReason::Failed);
        }
    }

    /// Run the work the last Send left in place (for callers with no other thread).
    pub fn run_work(
        &mut self,
        now: Instant,
        timeout: Duration,
        peer: Peer<'_>,
        entropy: &mut dyn Entropy,
    ) {
        if let Some(w) = self.take_work() {
            let done = w.run(entropy);
            self.dh_done(now, timeout, peer, done);
        }
    }

    /// Check a Reply (the shared secret, if any, known): Success1 is due, or Failure1.
    fn finish_reply(&mut self, peer: Peer<'_>, reply: PendingReply) {
        match self.check_reply(peer, reply) {
            Ok(()) => self.step = Step::Success1,
            Err(r) => self.fail(r),
        }
    }

    fn check_reply(&mut self, peer: Peer<'_>, reply: PendingReply) -> Result<(), FailureReason> {
        let PendingReply {
            cvalid,
            seqnum,
            response,
            challenge,
        } = reply;
        if response.len() != self.hash.output_len() {
            return Err(FailureReason::IncorrectPayload);
        }
        let expected = host_response(
            self.hash,
            &peer.secrets.host,
            &self.augmented(&self.c1),
            self.s1,
            self.t_id,
            self.sc_c,
            peer.hostnqn,
            peer.subnqn,
        );
        if !ct_eq(&expected, &response) {
            return Err(FailureReason::Failed);
        }
        // Secure channel concatenation needs C2 (section 8.13.5.5; nvmet checks it too).
        if self.sc_c != sc_c::NOSC && !cvalid {
            return Err(FailureReason::Failed);
        }
        self.s2 = seqnum;
        self.c2 = cvalid.then_some(challenge);
        // S2 = 0 with a valid C2: no bidirectional authentication, C2 only feeds the
        // generated PSK (NVMe Base 2.1 section 8.3.4.5.4).
        if self.c2.is_some() && self.s2 != 0 && peer.secrets.ctrl.is_none() {
            // The host asks us to prove ourselves and we have no controller secret.
            return Err(FailureReason::Failed);
        }
        Ok(())
    }

    /// Ca for a challenge: itself with the NULL group, HMAC(H(g^xy), C) otherwise.
    fn augmented(&self, c: &[u8]) -> Zeroizing<Vec<u8>> {
        match &self.shared {
            None => Zeroizing::new(c.to_vec()),
            Some(s) => augmented_challenge(self.hash, s, c),
        }
    }

    fn finish(&mut self) {
        if self.sc_c != sc_c::NOSC {
            if let (Some(s), Some(c2)) = (&self.shared, &self.c2) {
                self.generated_psk = Some(self.hash.hmac(s, &[&self.c1, c2]));
            }
        }
        self.authenticated = true;
        self.reset_transaction();
    }

    /// Authentication Receive with allocation length `al` (already checked > 0): the
    /// message due, and what it ended.
    pub fn receive(
        &mut self,
        now: Instant,
        timeout: Duration,
        peer: Peer<'_>,
        entropy: &mut dyn Entropy,
        al: usize,
    ) -> Result<(Vec<u8>, Event), CommandError> {
        // Every answer is at least a Failure1 (found by the `auth` fuzz target: an AL
        // below 8 bytes after a failed Send).
        if al < msg::FAILURE_SIZE {
            return Err(CommandError::AllocationLength {
                need: msg::FAILURE_SIZE,
            });
        }
        match self.step {
            Step::Challenge => {
                let hl = self.hash.output_len();
                let need = msg::HEADER_16 + hl + self.group.value_len();
                if al < need {
                    return Err(CommandError::AllocationLength { need });
                }
                let mut c1 = Zeroizing::new(vec![0u8; hl]);
                entropy.fill(&mut c1);
                let mut s = [0u8; 4];
                while u32::from_le_bytes(s) == 0 {
                    entropy.fill(&mut s);
                }
                self.s1 = u32::from_le_bytes(s);
                self.c1 = c1;
                let dh_value = if self.group == DhGroup::Null {
                    Vec::new()
                } else {
                    match &self.keypair {
                        Some(kp) => kp.public().to_vec(),
                        None => return Ok(self.failure1(FailureReason::Failed)),
                    }
                };
                self.step = Step::Reply;
                self.deadline = Some(now + timeout);
                let m = Message::Challenge {
                    t_id: self.t_id,
                    hash: self.hash.id(),
                    dhgroup: self.group.id(),
                    seqnum: self.s1,
                    challenge: self.c1.to_vec(),
                    dh_value,
                };
                Ok((m.encode(), Event::None))
            }
            Step::Success1 => {
                let bidirectional = self.c2.is_some() && self.s2 != 0;
                let need = msg::HEADER_16
                    + if bidirectional {
                        self.hash.output_len()
                    } else {
                        0
                    };
                if al < need {
                    return Err(CommandError::AllocationLength { need });
                }
                let response = if bidirectional {
                    let (Some(ctrl), Some(c2)) = (&peer.secrets.ctrl, &self.c2) else {
                        return Ok(self.failure1(FailureReason::Failed));
                    };
                    Some(
                        ctrl_response(
                            self.hash,
                            ctrl,
                            &self.augmented(c2),
                            self.s2,
                            self.t_id,
                            self.sc_c,
                            peer.subnqn,
                            peer.hostnqn,
                        )
                        .to_vec(),
                    )
                } else {
                    None
                };
                let m = Message::Success1 {
                    t_id: self.t_id,
                    hl: self.hash.output_len() as u8,
                    response,
                };
                if bidirectional {
                    self.step = Step::Success2;
                    self.deadline = Some(now + timeout);
                    Ok((m.encode(), Event::None))
                } else {
                    self.finish();
                    Ok((
                        m.encode(),
                        Event::Authenticated {
                            bidirectional: false,
                        },
                    ))
                }
            }
            Step::Failure1(r) => Ok(self.failure1(r)),
            // A Receive where a Send is due, or before the last Send's work is done.
            Step::Negotiate
            | Step::AwaitKeyPair
            | Step::Reply
            | Step::AwaitShared
            | Step::Success2 => Ok(self.failure1(FailureReason::IncorrectProtocolMessage)),
        }
    }

    fn failure1(&mut self, reason: FailureReason) -> (Vec<u8>, Event) {
        let m = Message::Failure {
            failure1: true,
            t_id: self.t_id,
            reason: msg::REASON_FAILED,
            explanation: reason.code(),
        };
        self.reset_transaction();
        self.authenticated = false;
        (
            m.encode(),
            Event::Failed {
                reason,
                by_host: false,
            },
        )
    }
}

/// HMAC(H(shared secret), challenge).
pub(crate) fn augmented_challenge(h: HashId, shared: &[u8], c: &[u8]) -> Zeroizing<Vec<u8>> {
    let hk = h.digest(&[shared]);
    h.hmac(&hk, &[c])
}

/// R1 (see the module docs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn host_response(
    h: HashId,
    key: &DhchapKey,
    ca: &[u8],
    s1: u32,
    t_id: u16,
    sc_c: u8,
    hostnqn: &str,
    subnqn: &str,
) -> Zeroizing<Vec<u8>> {
    let k = key.transformed(hostnqn);
    h.hmac(
        &k,
        &[
            ca,
            &s1.to_le_bytes(),
            &t_id.to_le_bytes(),
            &[sc_c],
            b"HostHost",
            hostnqn.as_bytes(),
            &[0],
            subnqn.as_bytes(),
        ],
    )
}

/// R2 (see the module docs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn ctrl_response(
    h: HashId,
    key: &DhchapKey,
    ca: &[u8],
    s2: u32,
    t_id: u16,
    sc_c: u8,
    subnqn: &str,
    hostnqn: &str,
) -> Zeroizing<Vec<u8>> {
    let k = key.transformed(subnqn);
    h.hmac(
        &k,
        &[
            ca,
            &s2.to_le_bytes(),
            &t_id.to_le_bytes(),
            &[sc_c],
            b"Controller",
            subnqn.as_bytes(),
            &[0],
            hostnqn.as_bytes(),
        ],
    )
}
