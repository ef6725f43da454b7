//! DH-HMAC-CHAP on the target: which hosts must authenticate, the Authentication
//! Send/Receive commands, and the rule that an unauthenticated queue can do nothing else
//! (NVMe Base 2.0 section 8.13; the state machine itself is [`crate::auth::ctrl`]).
//!
//! - A host with credentials ([`Target::set_host_credentials`]) gets ATR in every
//!   Connect response to a non-discovery subsystem (admin and I/O queues: each queue
//!   authenticates, as the Linux host does), and until that queue has authenticated every
//!   command but Authentication Send/Receive is answered Authentication Required.
//! - A subsystem marked [`Target::set_subsystem_auth_required`] refuses Connects from
//!   hosts without credentials (Connect Invalid Host).
//! - A failed transaction (AUTH_Failure1 sent or AUTH_Failure2 received) destroys the
//!   controller, as nvmet's fatal error does; a queue that has not authenticated within
//!   [`AUTH_TIMEOUT`] of its Connect does too. A re-authentication the host starts on an
//!   authenticated queue runs beside normal commands; if one of its steps times out the
//!   transaction is dropped and the queue stays authenticated (nvmet does the same).
//! - Credentials are looked up when a transaction starts, so a reload that rotates a
//!   secret applies from the next (re-)authentication; connected controllers stay.
//! - The DH arithmetic of a transaction (tens of milliseconds with FFDHE-8192) is not done
//!   where the command arrives: the Authentication Send that needs it is held, its
//!   [`DhJob`] waits in [`Target::take_dh_jobs`] for the caller to run on a thread of its
//!   own, and [`Target::dh_done`] completes the Send. One job per queue at a time: an
//!   authentication command on a queue whose job is out is answered Command Sequence
//!   Error.

use super::{Controller, Notice, QueueRef, Refusal, RefusalReason, Reply, Target};
use crate::auth::ctrl::{CommandError, DhDone, DhWork, Event, Peer, Policy, Secrets, Transaction};
use crate::auth::msg::{auth_id, auth_type, AuthCommand};
use crate::auth::{DhGroup, Entropy, HashId, SECP_NVME_AUTH, SPSP_DHCHAP};
use crate::spec::{opcodes, Cqe, Sqe, Status};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a queue has from its Connect to finish authenticating, and each step of a
/// re-authentication to arrive. The Linux host runs the whole exchange right after
/// Connect; nvmet allows KATO or 120 s per step. 30 s leaves room for a slow host
/// (FFDHE-8192 in an emulated guest) while bounding what an unauthenticated peer holds.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(30);

/// Authentications one host NQN may fail or abandon from one address within
/// [`STRIKE_WINDOW`] before its new ones from there are refused at their first message,
/// with no DH work. Per host NQN (only hosts with a secret authenticate, so the NQNs are
/// the configured ones): a host that keeps trying a stale key after a rotation throttles
/// itself, not the other hosts behind the same address (a NAT, VMs of one node). A host with the secret
/// authenticates every queue; a peer that knows an allowed host NQN but not its secret
/// must not make the target compute a DH key pair for every connection it opens and
/// drops (each FFDHE-8192 key costs tens of milliseconds, under the target's lock).
pub const AUTH_STRIKES: usize = 16;
/// First authentications (of distinct controllers) one host NQN may have running from one
/// address at once, its strikes included: a peer that knows an allowed host NQN but not
/// its secret gets at most this many DH key pairs computed before its first failures
/// count. A real host has one per controller it is connecting; after a target restart
/// all of them at once (a Linux host reconnects every controller in parallel), so this
/// is well above [`AUTH_STRIKES`].
pub const FIRST_AUTH_UNDER_WAY: usize = 64;
/// How long a failed or abandoned authentication counts against its address.
pub const STRIKE_WINDOW: Duration = Duration::from_secs(60);
/// Re-authentications (new transactions on a queue that has authenticated: the Linux
/// host starts one on every write of its `dhchap_secret` or `dhchap_ctrl_secret`, so a
/// key rotation may bring two at once) one queue may begin within [`REAUTH_WINDOW`].
/// Each costs a DH key pair and proves nothing new: without a bound one authenticated
/// host kept the DH threads busy for everyone.
pub const REAUTH_BURST: usize = 4;
/// See [`REAUTH_BURST`].
pub const REAUTH_WINDOW: Duration = Duration::from_secs(60);
/// (address, host NQN) pairs tracked at once; the one struck longest ago makes room.
const STRIKE_ADDRESSES: usize = 4096;

/// Failed and abandoned authentications per host address and host NQN, within
/// [`STRIKE_WINDOW`].
#[derive(Default)]
pub(super) struct AuthStrikes(HashMap<(IpAddr, String), VecDeque<Instant>>);

impl AuthStrikes {
    /// One more failed or abandoned authentication of `host` from `addr` at `at`.
    pub(super) fn strike(&mut self, addr: Option<IpAddr>, host: &str, at: Instant) {
        let Some(addr) = addr else { return };
        let addr = (addr, host.to_string());
        if !self.0.contains_key(&addr) && self.0.len() >= STRIKE_ADDRESSES {
            let oldest = self
                .0
                .iter()
                .min_by_key(|(_, t)| t.back().copied())
                .map(|(a, _)| a.clone());
            if let Some(a) = oldest {
                self.0.remove(&a);
            }
        }
        let times = self.0.entry(addr).or_default();
        times.push_back(at);
        while times.len() > AUTH_STRIKES {
            times.pop_front();
        }
    }

    /// How many strikes `host` has from `addr` at `now`, when they and `under_way`
    /// transactions still running are enough to refuse it.
    pub(super) fn throttled(
        &mut self,
        addr: Option<IpAddr>,
        host: &str,
        now: Instant,
        under_way: usize,
    ) -> Option<usize> {
        let addr = (addr?, host.to_string());
        let mut n = 0;
        if let Some(times) = self.0.get_mut(&addr) {
            while times
                .front()
                .is_some_and(|&t| now.saturating_duration_since(t) >= STRIKE_WINDOW)
            {
                times.pop_front();
            }
            n = times.len();
            if n == 0 {
                self.0.remove(&addr);
            }
        }
        (n >= AUTH_STRIKES || n + under_way >= FIRST_AUTH_UNDER_WAY).then_some(n)
    }

    /// Host `host`'s credentials changed: its strikes, earned with the old ones, go.
    pub(super) fn forget_host(&mut self, host: &str) {
        self.0.retain(|(_, h), _| h != host);
    }
}

/// A host's DH-HMAC-CHAP credentials and what it may negotiate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostCredentials {
    pub secrets: Secrets,
    pub policy: Policy,
}

/// The secure channel concatenation a queue may ask for: a new PSK on an admin queue over
/// plain TCP, a replacement over TLS, none on I/O queues (TP 8018; nvmet's rules).
fn concat_for(queue_tls: &BTreeMap<super::QueueKey, TlsPeer>, ctrl: &Controller, qid: u16) -> u8 {
    match (qid, queue_tls.contains_key(&ctrl.admin_key)) {
        (0, false) => crate::auth::sc_c::NEWTLSPSK,
        (0, true) => crate::auth::sc_c::REPLACETLSPSK,
        _ => crate::auth::sc_c::NOSC,
    }
}

/// One queue's authentication state.
pub(super) struct QueueAuth {
    pub(super) tx: Transaction,
    /// Until when the queue may stay unauthenticated.
    pub(super) deadline: Instant,
    /// The DH job out for this queue: its number and the CID of the Send it holds.
    dh: Option<(u64, u16)>,
    /// When the queue, authenticated, began its last re-authentications (at most
    /// [`REAUTH_BURST`], within [`REAUTH_WINDOW`]).
    reauths: VecDeque<Instant>,
    /// When the transaction under way began (its Negotiate).
    pub(super) began: Option<Instant>,
}

/// DH arithmetic an authentication waits for (see the module docs).
#[derive(Debug)]
pub struct DhJob {
    pub id: DhJobId,
    /// The host's address, when known (a caller can serve addresses in turn).
    pub peer: Option<IpAddr>,
    pub work: DhWork,
}

/// Which queue's transaction a [`DhJob`] belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DhJobId {
    queue: QueueRef,
    key: super::QueueKey,
    seq: u64,
}

impl QueueAuth {
    /// The deadline by which the queue must have authenticated, if it must and one runs
    /// now: none while its DH job is out (that wait is the target's).
    fn initial_deadline(&self, auth_required: bool) -> Option<Instant> {
        (auth_required && !self.tx.authenticated() && self.dh.is_none()).then_some(self.deadline)
    }

    /// The job out for this queue, if it is the one `id` names: the CID of the Send it
    /// holds.
    fn job_cid(&self, id: &DhJobId) -> Option<u16> {
        self.dh
            .filter(|&(seq, _)| seq == id.seq)
            .map(|(_, cid)| cid)
    }

    pub(super) fn new(now: Instant) -> QueueAuth {
        QueueAuth {
            tx: Transaction::new(),
            deadline: now + AUTH_TIMEOUT,
            dh: None,
            reauths: VecDeque::new(),
            began: None,
        }
    }
}

/// How a queue authenticated, for the operator's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authenticated {
    pub hostnqn: String,
    pub subnqn: String,
    pub cntlid: u16,
    pub qid: u16,
    pub hash: HashId,
    pub dhgroup: DhGroup,
    pub bidirectional: bool,
}

impl Controller {
    /// Whether this queue may run commands other than Authentication Send/Receive.
    pub(super) fn queue_may_run(&self, qid: u16) -> bool {
        !self.auth_required
            || self
                .queue_auth
                .get(&qid)
                .is_some_and(|a| a.tx.authenticated())
    }
}

pub(super) fn is_auth_command(sqe: &Sqe) -> bool {
    sqe.is_fabrics()
        && matches!(
            sqe.fctype(),
            opcodes::fabrics::AUTHENTICATION_SEND | opcodes::fabrics::AUTHENTICATION_RECEIVE
        )
}

/// Who a queue's TLS PSK belongs to (from the configuration the PSK came from).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsPeer {
    pub identity: String,
    pub hostnqn: String,
    pub subnqn: String,
    /// The PSK was generated by a DH-HMAC-CHAP transaction (secure channel
    /// concatenation): holding it already proves the host, so the queue does not
    /// authenticate again (nvmet does the same).
    pub generated: bool,
}

/// A TLS PSK generated by secure channel concatenation (TP 8018) on an admin queue: the
/// host reconnects over TLS with it; the transport must accept this identity from now on
/// (it replaces any earlier one for the same host and subsystem).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedPsk {
    pub hostnqn: String,
    pub subnqn: String,
    /// Identity `NVMe1G<hh> <NQNh> <NQNc> <digest>` and the TLS PSK derived from the
    /// generated PSK.
    pub psk: crate::auth::tls::TlsPsk,
}

impl Target {
    /// The transport finished a TLS handshake on queue `key` with this PSK: its Connect
    /// must name the same host and subsystem. Forgotten when the queue closes.
    pub fn set_queue_tls(&mut self, key: super::QueueKey, peer: TlsPeer) {
        self.queue_tls.insert(key, peer);
    }

    /// Replaces every host's DH-HMAC-CHAP credentials (host NQN -> credentials).
    /// Controllers already connected keep running; a changed secret applies from the
    /// next (re-)authentication.
    pub fn set_host_credentials(
        &mut self,
        creds: impl IntoIterator<Item = (String, HostCredentials)>,
    ) {
        let new: BTreeMap<String, Arc<HostCredentials>> =
            creds.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
        // A host whose secret changed starts with a clean slate: the failures it had
        // were against what is no longer its secret.
        for (host, c) in &new {
            if self.credentials.get(host) != Some(c) {
                self.auth_strikes.forget_host(host);
            }
        }
        self.credentials = new;
    }

    /// Whether a connected queue may run commands other than authentication (it
    /// authenticated, or its controller does not authenticate). The engine must not serve
    /// I/O on a queue for which this is false.
    pub fn queue_authenticated(&self, queue: QueueRef) -> bool {
        self.controllers
            .get(&queue.cntlid)
            .is_some_and(|c| !c.retired && c.queue_may_run(queue.qid))
    }

    /// Whether hosts without credentials are refused by this subsystem.
    pub fn set_subsystem_auth_required(&mut self, nqn: &str, required: bool) {
        if required {
            self.auth_required_subsystems.insert(nqn.to_string());
        } else {
            self.auth_required_subsystems.remove(nqn);
        }
    }

    /// The random source for challenges (DH private keys come from whoever runs the
    /// [`DhJob`]s). Until one is set, authentication commands fail with Internal Error.
    pub fn set_entropy(&mut self, e: Box<dyn Entropy + Send>) {
        self.entropy = Some(e);
    }

    /// Whether a host connecting to a subsystem must authenticate: `Err` when it cannot
    /// (the subsystem requires it and the host has no credentials).
    pub(super) fn auth_needed(
        &self,
        subnqn: &str,
        hostnqn: &str,
        is_discovery: bool,
    ) -> Result<bool, RefusalReason> {
        if is_discovery {
            return Ok(false);
        }
        let has = self.credentials.contains_key(hostnqn);
        if !has && self.auth_required_subsystems.contains(subnqn) {
            return Err(RefusalReason::NoCredentials);
        }
        Ok(has)
    }

    /// Authentication Send or Receive on a connected queue.
    pub(super) fn auth_command(
        &mut self,
        now: Instant,
        queue: QueueRef,
        sqe: &Sqe,
        data: &mut [u8],
    ) -> Result<Reply, Status> {
        let cmd = AuthCommand::from_sqe(sqe);
        if cmd.secp != SECP_NVME_AUTH || cmd.spsp0 != SPSP_DHCHAP || cmd.spsp1 != SPSP_DHCHAP {
            return Err(Status::INVALID_FIELD);
        }
        if cmd.len == 0 {
            return Err(Status::INVALID_FIELD);
        }
        let send = sqe.fctype() == opcodes::fabrics::AUTHENTICATION_SEND;
        let negotiating =
            send && data.get(..2) == Some(&[auth_type::COMMON, auth_id::NEGOTIATE][..]);
        // A first authentication counts its host's others still running from the same
        // address against the throttle ([`FIRST_AUTH_UNDER_WAY`]): a peer that knows an
        // allowed host NQN but not its secret cannot have a DH key pair computed for every
        // connection it opens before the first of them fails.
        let under_way = if negotiating && queue.qid == 0 {
            self.first_authentications_under_way(queue.cntlid)
        } else {
            0
        };
        let ctrl = self
            .controllers
            .get_mut(&queue.cntlid)
            .ok_or(Status::COMMAND_SEQUENCE_ERROR)?;
        // No secret for this host: the protocol cannot run (the Linux host only starts it
        // when Connect asked for it).
        let creds = self
            .credentials
            .get(&ctrl.hostnqn)
            .cloned()
            .ok_or(Status::INVALID_FIELD)?;
        let concat = concat_for(&self.queue_tls, ctrl, queue.qid);
        let qkey = if queue.qid == 0 {
            ctrl.admin_key
        } else {
            *ctrl
                .io_queues
                .get(&queue.qid)
                .ok_or(Status::COMMAND_SEQUENCE_ERROR)?
        };
        let peer = Peer {
            hostnqn: &ctrl.hostnqn,
            subnqn: &ctrl.subnqn,
            secrets: &creds.secrets,
            policy: &creds.policy,
            concat,
        };
        let peer_addr = ctrl.origin.peer;
        let qa = ctrl
            .queue_auth
            .entry(queue.qid)
            .or_insert_with(|| QueueAuth::new(now));
        // The host sent another authentication command before the last Send completed.
        if qa.dh.is_some() {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        }
        // A Negotiate that starts over a transaction not yet finished, on a queue not yet
        // authenticated, counts as one abandoned: each Negotiate costs a DH key pair, and
        // the host has not shown it knows the secret.
        let restart = send
            && qa.tx.in_progress()
            && !qa.tx.authenticated()
            && data.get(..2) == Some(&[auth_type::COMMON, auth_id::NEGOTIATE][..]);
        // A new transaction (its AUTH_Negotiate) from an address that keeps failing or
        // abandoning them: refused before any DH work.
        if send && (!qa.tx.in_progress() || restart) {
            let under_way = if qa.tx.authenticated() { 0 } else { under_way };
            if let Some(strikes) =
                self.auth_strikes
                    .throttled(peer_addr, &ctrl.hostnqn, now, under_way)
            {
                let who = (ctrl.admin_key, ctrl.hostnqn.clone(), ctrl.subnqn.clone());
                let secs = STRIKE_WINDOW.as_secs();
                let reason = RefusalReason::AuthenticationThrottled {
                    strikes,
                    under_way,
                    secs,
                };
                if qa.tx.authenticated() {
                    // A queue that proved the secret keeps running: only the new
                    // transaction is refused.
                    let ci = Some(Status::COMMAND_INTERRUPTED);
                    self.refused_on(reason, (qkey, who.1, who.2), queue, ci);
                } else {
                    self.refuse_and_retire(reason, who, queue);
                }
                return Err(Status::COMMAND_INTERRUPTED);
            }
        }
        if restart {
            self.auth_strikes.strike(peer_addr, &ctrl.hostnqn, now);
        }
        // Re-authentication: at most REAUTH_BURST new transactions per queue within
        // REAUTH_WINDOW. Past that the transaction is refused, not the queue, and it is no
        // strike: the bound is the protection, and a host rotating keys is not an attacker.
        if negotiating && qa.tx.authenticated() {
            while qa
                .reauths
                .front()
                .is_some_and(|&t| now.saturating_duration_since(t) >= REAUTH_WINDOW)
            {
                qa.reauths.pop_front();
            }
            if qa.reauths.len() >= REAUTH_BURST {
                let reason = RefusalReason::ReauthenticationTooSoon {
                    count: REAUTH_BURST,
                    secs: REAUTH_WINDOW.as_secs(),
                };
                let who = (qkey, ctrl.hostnqn.clone(), ctrl.subnqn.clone());
                self.refused_on(reason, who, queue, Some(Status::COMMAND_INTERRUPTED));
                return Err(Status::COMMAND_INTERRUPTED);
            }
            qa.reauths.push_back(now);
        }
        if negotiating {
            qa.began = Some(now);
        }
        let (event, reply) = if send {
            let tl = cmd.len as usize;
            let payload = data.get(..tl).ok_or(Status::DATA_SGL_LENGTH_INVALID)?;
            let event = qa.tx.send(now, AUTH_TIMEOUT, peer, payload);
            if let Some(work) = qa.tx.take_work() {
                // Held until the DH work is done (`dh_done`); nothing final happened yet.
                debug_assert_eq!(event, Event::None);
                self.next_dh_seq += 1;
                let seq = self.next_dh_seq;
                qa.dh = Some((seq, sqe.cid()));
                self.dh_jobs.push(DhJob {
                    id: DhJobId {
                        queue,
                        key: qkey,
                        seq,
                    },
                    peer: peer_addr,
                    work,
                });
                return Ok(Reply::Held);
            }
            (event, Reply::ok()?)
        } else {
            let entropy = self.entropy.as_mut().ok_or(Status::INTERNAL_ERROR)?;
            let al = (cmd.len as usize).min(data.len());
            let (msg, ev) = qa
                .tx
                .receive(now, AUTH_TIMEOUT, peer, entropy.as_mut(), al)
                .map_err(|CommandError::AllocationLength { .. }| Status::INVALID_FIELD)?;
            if msg.len() > al {
                return Err(Status::INVALID_FIELD);
            }
            data[..msg.len()].copy_from_slice(&msg);
            data[msg.len()..al].fill(0);
            (ev, Reply::data(al)?)
        };
        let (hash, dhgroup) = qa.tx.selected();
        let generated = match (&event, qa.tx.generated_psk()) {
            (Event::Authenticated { .. }, Some((h, input))) => Some(GeneratedPsk {
                hostnqn: ctrl.hostnqn.clone(),
                subnqn: ctrl.subnqn.clone(),
                psk: crate::auth::tls::TlsPsk::v1(h, input, &ctrl.hostnqn, &ctrl.subnqn, true),
            }),
            _ => None,
        };
        let (hostnqn, subnqn, key) = (ctrl.hostnqn.clone(), ctrl.subnqn.clone(), ctrl.admin_key);
        match event {
            Event::None => {}
            Event::Authenticated { bidirectional } => {
                self.notice(Notice::Authenticated(Authenticated {
                    hostnqn,
                    subnqn,
                    cntlid: queue.cntlid,
                    qid: queue.qid,
                    hash,
                    dhgroup,
                    bidirectional,
                }));
                if let Some(g) = generated {
                    self.notice(Notice::GeneratedPsk(g));
                }
            }
            Event::Failed { reason, by_host } => {
                self.auth_strikes.strike(peer_addr, &hostnqn, now);
                // The answer still goes out (the transport sends completions before it
                // tears the queue down): the host reads Failure1 and then sees the
                // connection close.
                let reason = RefusalReason::AuthenticationFailed { reason, by_host };
                self.refuse_and_retire(reason, (key, hostnqn, subnqn), queue);
            }
        }
        Ok(reply)
    }

    /// The DH work authentication Sends left since the last call, to run off the threads
    /// that serve hosts (see the module docs).
    pub fn take_dh_jobs(&mut self) -> Vec<DhJob> {
        std::mem::take(&mut self.dh_jobs)
    }

    /// Whether a job's queue still waits for it (a job whose controller or queue went,
    /// or whose transaction started over, need not run).
    pub fn dh_wanted(&self, id: &DhJobId) -> bool {
        self.controllers
            .get(&id.queue.cntlid)
            .filter(|c| !c.retired)
            .and_then(|c| c.queue_auth.get(&id.queue.qid))
            .and_then(|qa| qa.job_cid(id))
            .is_some()
    }

    /// A job's result: the transaction goes on, and the Send it held completes (the
    /// returned [`Action::CompleteHeld`](super::Action::CompleteHeld)); a problem the
    /// work found is the Failure1 of the next Receive. Nothing happens for a job no
    /// longer wanted.
    ///
    /// The deadlines the queue's authentication waited on while the job was out start
    /// over at `now`: the host could not go on meanwhile.
    pub fn dh_done(&mut self, id: DhJobId, done: DhDone, now: Instant) -> Vec<super::Action> {
        let Some(ctrl) = self
            .controllers
            .get_mut(&id.queue.cntlid)
            .filter(|c| !c.retired)
        else {
            return Vec::new();
        };
        let concat = concat_for(&self.queue_tls, ctrl, id.queue.qid);
        let creds = self.credentials.get(&ctrl.hostnqn).cloned();
        let Some(qa) = ctrl.queue_auth.get_mut(&id.queue.qid) else {
            return Vec::new();
        };
        let Some(cid) = qa.job_cid(&id) else {
            return Vec::new();
        };
        qa.dh = None;
        qa.deadline = qa.deadline.max(now + AUTH_TIMEOUT);
        match creds {
            Some(creds) => qa.tx.dh_done(
                now,
                AUTH_TIMEOUT,
                Peer {
                    hostnqn: &ctrl.hostnqn,
                    subnqn: &ctrl.subnqn,
                    secrets: &creds.secrets,
                    policy: &creds.policy,
                    concat,
                },
                done,
            ),
            // A reload took the host's credentials away meanwhile.
            None => qa.tx.dh_failed(),
        }
        self.actions.push(super::Action::CompleteHeld {
            queue: id.queue,
            key: id.key,
            cqe: Cqe {
                sqid: id.queue.qid,
                ..Cqe::success(cid)
            },
        });
        self.take_actions()
    }

    /// Other live controllers of controller `cntlid`'s host NQN from its address whose
    /// admin queue is in its first authentication.
    fn first_authentications_under_way(&self, cntlid: u16) -> usize {
        let Some(c) = self.controllers.get(&cntlid) else {
            return 0;
        };
        if c.origin.peer.is_none() {
            return 0;
        }
        self.controllers
            .values()
            .filter(|o| {
                o.cntlid != cntlid
                    && !o.retired
                    && o.origin.peer == c.origin.peer
                    && o.hostnqn == c.hostnqn
            })
            .filter(|o| {
                o.queue_auth
                    .get(&0)
                    .is_some_and(|qa| qa.tx.in_progress() && !qa.tx.authenticated())
            })
            .count()
    }

    /// Authentication deadlines at `now`: controllers with a queue that did not
    /// authenticate in time are retired (with a notice); re-authentication steps that
    /// timed out are dropped.
    pub(super) fn poll_auth_timeouts(&mut self, now: Instant) {
        let mut late = Vec::new();
        // Transactions dropped for a step that timed out on a queue that may stay (a
        // discovery controller's, a re-authentication): a strike each, as when dropped
        // with the queue (`queue_closed`); a queue past its first deadline is struck below.
        let mut dropped = Vec::new();
        for c in self.controllers.values_mut().filter(|c| !c.retired) {
            for (&qid, qa) in c.queue_auth.iter_mut() {
                let timed_out = qa.tx.poll_timeout(now);
                let past_initial = qa
                    .initial_deadline(c.auth_required)
                    .is_some_and(|d| d <= now);
                if timed_out && !past_initial {
                    dropped.push((c.origin.peer, c.hostnqn.clone()));
                }
                if past_initial {
                    late.push((
                        c.cntlid,
                        qid,
                        c.admin_key,
                        c.hostnqn.clone(),
                        c.subnqn.clone(),
                        c.origin.peer,
                    ));
                    break;
                }
            }
        }
        for (peer, host) in dropped {
            self.auth_strikes.strike(peer, &host, now);
        }
        for (cntlid, qid, key, hostnqn, subnqn, peer) in late {
            self.auth_strikes.strike(peer, &hostnqn, now);
            let reason = RefusalReason::AuthenticationTimeout {
                secs: AUTH_TIMEOUT.as_secs(),
            };
            self.refuse_and_retire(reason, (key, hostnqn, subnqn), QueueRef { cntlid, qid });
        }
    }

    /// An authentication refused on `queue` of the controller whose admin queue, host and
    /// subsystem `who` names: said so, and the controller retired (nvmet's fatal error).
    fn refuse_and_retire(
        &mut self,
        reason: RefusalReason,
        who: (super::QueueKey, String, String),
        queue: QueueRef,
    ) {
        self.refused_on(reason, who, queue, None);
        self.retire_controllers_where(|c| c.cntlid == queue.cntlid);
    }

    /// The refusal line of an authentication on `queue` (`status`: what it was answered,
    /// when the queue stays); `who` names the queue's connection, host and subsystem.
    fn refused_on(
        &mut self,
        reason: RefusalReason,
        (key, hostnqn, subnqn): (super::QueueKey, String, String),
        queue: QueueRef,
        status: Option<Status>,
    ) {
        self.notice(Notice::Refused(Refusal {
            reason,
            key,
            hostnqn: Some(hostnqn),
            subnqn: Some(subnqn),
            cntlid: Some(queue.cntlid),
            qid: Some(queue.qid),
            status,
        }));
    }

    /// The earliest authentication deadline of live controllers.
    pub(super) fn next_auth_timeout(&self) -> Option<Instant> {
        self.controllers
            .values()
            .filter(|c| !c.retired)
            .flat_map(|c| {
                c.queue_auth.values().flat_map(move |qa| {
                    qa.initial_deadline(c.auth_required)
                        .into_iter()
                        .chain(qa.tx.deadline())
                })
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The strike table holds at most [`STRIKE_ADDRESSES`] addresses and [`AUTH_STRIKES`]
    /// strikes each, however many a flood from many addresses brings: the address struck
    /// longest ago makes room, and the newest keep their strikes.
    #[test]
    fn the_strike_table_is_bounded() {
        let mut s = AuthStrikes::default();
        let t0 = Instant::now();
        let addr = |i: u32| Some(IpAddr::from((0x0a00_0000 + i).to_be_bytes()));
        for i in 0..(STRIKE_ADDRESSES as u32 + 100) {
            for _ in 0..AUTH_STRIKES + 3 {
                s.strike(addr(i), "h", t0 + Duration::from_millis(i.into()));
            }
            assert!(s.0.len() <= STRIKE_ADDRESSES);
            assert!(s.0.values().all(|t| t.len() <= AUTH_STRIKES));
        }
        let now = t0 + Duration::from_secs(1);
        assert_eq!(
            s.throttled(addr(0), "h", now, 0),
            None,
            "the oldest made room"
        );
        let last = STRIKE_ADDRESSES as u32 + 99;
        assert_eq!(s.throttled(addr(last), "h", now, 0), Some(AUTH_STRIKES));
        // Another host NQN from the same address is not throttled.
        assert_eq!(s.throttled(addr(last), "other", now, 0), None);
        // An unknown address is never throttled.
        assert_eq!(s.throttled(None, "h", now, 0), None);
        // New credentials for the host: its strikes go.
        s.forget_host("h");
        assert_eq!(s.throttled(addr(last), "h", now, 0), None);
    }
}
