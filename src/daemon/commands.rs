//! The non-offloaded path of an IO thread: a command the engine handed up (its host data,
//! if any, already in its payload) is answered by the target, and a Fabrics Connect also
//! binds the QP for the engine (at once, or once the queue has authenticated when its
//! subsystem requires DH-HMAC-CHAP). Plus the log lines of an NVMe/TCP termination and of
//! a TLS handshake.

use std::time::Instant;

use nvmf::spec::{opcodes, Cqe, Sqe, Status};
use nvmf::target::{ConnectOk, Outcome, QueueRef};
use sta::{AccessKey, CmdToken, IoContext, QpHandle, SubsysId, TaskError};

use super::io_thread::{Deferred, IoThread};
use super::shared::{queue_key, Counters};

impl<I: IoContext> IoThread<I> {
    /// Answer one non-offloaded command whose host data (if any) is in its payload.
    pub(super) fn execute(&mut self, qp: QpHandle, token: CmdToken, sqe: &Sqe) {
        if sqe.is_fabrics() && sqe.fctype() == opcodes::fabrics::CONNECT {
            return self.connect(qp, token, sqe);
        }
        let Some(queue) = self.qps.get(&qp).and_then(|a| a.queue) else {
            let cqe = Cqe::new(sqe.cid(), Status::COMMAND_SEQUENCE_ERROR);
            self.report_refused_before_connect(qp, sqe, cqe.status());
            return self.answer(qp, token, &cqe, 0);
        };
        let now = Instant::now();
        let shared = self.shared.clone();
        let payload = match self.io.payload(token) {
            Ok(p) => p,
            Err(e) => return self.payload_gone(qp, e),
        };
        let pending = self.qps.get(&qp).and_then(|a| a.offload_after_auth);
        let (outcome, actions, notices, authenticated, ptpl) = {
            let mut t = shared.target();
            let before = t.ptpl_version();
            let o = t.execute(now, queue, sqe, payload, &Counters(&shared));
            // The PTPL state version this command made, if it changed what the file keeps.
            let ptpl = (t.ptpl_version() != before).then(|| t.ptpl_version());
            let authenticated = pending.is_some() && t.queue_authenticated(queue);
            // An Authentication Send held for DH arithmetic: the DH threads do it.
            shared.dh.push(t.take_dh_jobs());
            (o, t.take_actions(), t.take_notices(), authenticated, ptpl)
        };
        if let (true, Some((id, access))) = (authenticated, pending) {
            // Authenticated: from now on the engine serves this queue's I/O itself.
            if let Some(a) = self.qps.get_mut(&qp) {
                a.offload_after_auth = None;
            }
            if let Err(e) = self.offload(qp, id, access) {
                // The QP is going away (its disconnect reports it); nothing to bind.
                tracing::debug!(
                    qp = qp.as_u64(),
                    "io{}: offload after auth: {e}",
                    self.index
                );
            }
        }
        shared.report_notices(notices);
        // A reservation, PTPL or visibility change reaches the engine before the host hears
        // the command completed; a change the PTPL file keeps, the file too (below).
        shared.sync_target_state();
        match outcome {
            Outcome::Complete { cqe, data_len } => {
                if queue.qid == 0 && !cqe.status().is_success() {
                    // Hosts probe optional features; the answer is theirs to read, and
                    // this line says which command and field it was.
                    tracing::debug!(
                        cntlid = queue.cntlid,
                        "admin command {:#04x} (nsid {:#x}, cdw10 {:#x}, cdw11 {:#x}, cdw12 {:#x}, \
                         cdw13 {:#x}, cdw14 {:#x}) answered {}",
                        sqe.opcode(),
                        sqe.nsid,
                        sqe.cdw10,
                        sqe.cdw11,
                        sqe.cdw12,
                        sqe.cdw13,
                        sqe.cdw14,
                        cqe.status()
                    );
                }
                let fence = self.fence_for(queue, sqe, &cqe);
                let ptpl = ptpl.unwrap_or(0);
                if fence.is_some() || !shared.ptpl_written(ptpl) {
                    self.deferred.push(Deferred {
                        fence,
                        ptpl,
                        qp,
                        token,
                        cqe,
                    });
                    return self.route_or_apply(actions);
                }
                self.answer(qp, token, &shared.ptpl_answer(ptpl, cqe), data_len)
            }
            Outcome::Deferred => {
                // A held command with this CID is one the host sent again (an AER after a
                // controller reset: Linux reuses its one AER CID): the old one will never
                // be answered, so its queue entry and command slot are freed.
                if let Some((oq, ot)) = self.held.insert((queue, sqe.cid()), (qp, token)) {
                    if ot != token {
                        if let Err(e) = self.io.cmd_drop(oq, ot) {
                            // Its QP is gone already (and the command with it).
                            tracing::debug!(qp = oq.as_u64(), "io{}: cmd_drop: {e}", self.index);
                        }
                    }
                }
            }
            // A retired controller: its queue is being disconnected (the action is already
            // on its way); the command dies with the connection and the host retries it.
            Outcome::Dropped => {}
        }
        self.route_or_apply(actions);
    }

    /// A Preempt and Abort that succeeded on an I/O queue is answered only once the
    /// namespace's fence is done (NVMe Base 2.0 section 8.19.5: the preempted hosts'
    /// commands are aborted; nvmet waits for them): the new access view refuses their
    /// new commands already, and the fence waits for the backend requests every IO thread
    /// had in flight for the namespace when it was published. `None`: answer now.
    fn fence_for(&mut self, queue: QueueRef, sqe: &Sqe, cqe: &Cqe) -> Option<sta::Fence> {
        const PREEMPT_AND_ABORT: u32 = 2;
        if queue.qid == 0
            || sqe.opcode() != opcodes::io::RESERVATION_ACQUIRE
            || sqe.cdw10 & 7 != PREEMPT_AND_ABORT
            || !cqe.status().is_success()
        {
            return None;
        }
        let subnqn = self.shared.target().subsystem_of(queue.cntlid)?.to_owned();
        let id = self.shared.subsystems.id(&subnqn)?;
        let fence = self.io.ns_fence(id, sqe.nsid);
        (!fence.is_done()).then_some(fence)
    }

    /// Answers the deferred completions whose fence is done and whose PTPL state is
    /// written. Returns whether any.
    pub(super) fn answer_deferred(&mut self) -> bool {
        let shared = &self.shared;
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|d| {
                d.fence.as_ref().is_none_or(|f| f.is_done()) && shared.ptpl_written(d.ptpl)
            });
        self.deferred = waiting;
        let any = !done.is_empty();
        for d in done {
            // A QP that went meanwhile: the answer is dropped with it.
            if self.qps.contains_key(&d.qp) {
                let cqe = self.shared.ptpl_answer(d.ptpl, d.cqe);
                self.answer(d.qp, d.token, &cqe, 0);
            }
        }
        any
    }

    /// Fabrics Connect: the target decides; on success the QP learns its queue
    /// parameters (and, for an I/O queue, the subsystem the engine serves it from)
    /// before the answer goes out, as DOCA requires.
    fn connect(&mut self, qp: QpHandle, token: CmdToken, sqe: &Sqe) {
        let now = Instant::now();
        let key = queue_key(self.index, qp);
        let shared = self.shared.clone();
        let origin = self
            .qps
            .get(&qp)
            .map(|a| a.origin.clone())
            .unwrap_or_default();
        let payload = match self.io.payload(token) {
            Ok(p) => p,
            Err(e) => return self.payload_gone(qp, e),
        };
        let tls = self.qps.get(&qp).and_then(|a| a.tls.clone());
        let (mut cqe, ok, notices) = {
            let mut t = shared.target();
            if let Some(p) = tls {
                // The Connect must be for the host and subsystem the PSK belongs to.
                t.set_queue_tls(
                    key,
                    nvmf::target::TlsPeer {
                        identity: p.identity,
                        hostnqn: p.hostnqn,
                        subnqn: p.subnqn,
                        generated: p.generated,
                    },
                );
            }
            let (cqe, ok) = t.connect(now, key, &origin, sqe, payload);
            (cqe, ok, t.take_notices())
        };
        shared.report_notices(notices);
        if let Some(ok) = ok {
            if let Err(e) = self.bind_queue(qp, &ok) {
                // SPDK answers a Connect it could not set up in the engine the same way.
                tracing::error!(
                    qp = qp.as_u64(),
                    "io{}: controller {} queue {}: engine: {e}",
                    self.index,
                    ok.cntlid,
                    ok.qid
                );
                cqe = Cqe::new(sqe.cid(), Status::INTERNAL_ERROR);
            } else {
                shared.queue_facts.connected(key, ok.sqsize);
                tracing::info!(
                    "io{}: controller {} queue {} connected to {}",
                    self.index,
                    ok.cntlid,
                    ok.qid,
                    ok.subnqn
                );
            }
        }
        self.answer(qp, token, &cqe, 0);
        let actions = shared.target().take_actions();
        self.route_or_apply(actions);
    }

    /// Record the queue a successful Connect made, and tell the engine. An I/O queue that
    /// must authenticate first is bound to its subsystem only once it has (`execute`):
    /// until then every command of it reaches the target, which refuses I/O.
    fn bind_queue(&mut self, qp: QpHandle, ok: &ConnectOk) -> Result<(), TaskError> {
        if let Some(a) = self.qps.get_mut(&qp) {
            a.queue = Some(QueueRef {
                cntlid: ok.cntlid,
                qid: ok.qid,
            });
            if let Some(s) = a.slot.as_mut() {
                s.connected();
            }
        }
        if ok.qid > 0 {
            // A subsystem the target accepted a Connect for is registered with the engine
            // (`subsystems.rs` adds both or neither).
            if let Some(id) = self.shared.subsystems.id(&ok.subnqn) {
                if ok.authentication_required {
                    if let Some(a) = self.qps.get_mut(&qp) {
                        a.offload_after_auth = Some((id, ok.access));
                    }
                } else {
                    self.offload(qp, id, ok.access)?;
                }
            }
        }
        self.io
            .qp_connect_set_params(qp, ok.qid, ok.sqsize, ok.disable_sq_flow_control)
    }

    /// Hands a connected (and, where required, authenticated) I/O queue's data path to the
    /// engine: who its commands come from, for the access views, then its subsystem. The
    /// key goes first so that no offloaded command is ever checked without it.
    fn offload(&mut self, qp: QpHandle, id: SubsysId, access: AccessKey) -> Result<(), TaskError> {
        self.io.qp_set_access(qp, access)?;
        self.io.qp_add_subsystem(qp, id)
    }

    /// A TLS handshake ended: remember whose PSK the connection uses (its Connect must be
    /// for that host and subsystem), or log and count why it failed.
    pub(super) fn on_tls(&mut self, qp: QpHandle, ok: bool) {
        let key = queue_key(self.index, qp);
        let c = self.shared.conn(key);
        match self.io.qp_tls(qp) {
            Some(Ok(p)) if ok => {
                tracing::info!(
                    "{}: TLS 1.3 ({}) with PSK {:?} of host {:?} for subsystem {:?}",
                    crate::refusals::where_from(c.as_ref()),
                    p.cipher,
                    p.identity,
                    p.hostnqn,
                    p.subnqn
                );
                if let Some(a) = self.qps.get_mut(&qp) {
                    a.tls = Some(p);
                }
            }
            other => {
                let why = match other {
                    Some(Err(e)) => e,
                    _ => "unknown".to_string(),
                };
                // The TLS layer's own errors say "TLS handshake failed: ..." already.
                let why = why.strip_prefix("TLS handshake failed: ").unwrap_or(&why);
                let line = format!(
                    "{}: TLS handshake failed: {why}",
                    crate::refusals::where_from(c.as_ref())
                );
                self.shared.refusals.report(
                    crate::refusals::TLS_HANDSHAKE_FAILED,
                    c.and_then(|c| c.peer),
                    &line,
                );
            }
        }
    }

    /// The engine no longer lends the command's payload: its QP is closing (the command
    /// dies with it), or this thread lost track of it.
    fn payload_gone(&mut self, qp: QpHandle, e: TaskError) {
        tracing::debug!(qp = qp.as_u64(), "io{}: payload: {e}", self.index);
    }

    /// Logs and counts an NVMe/TCP termination (a rejected ICReq, a C2HTermReq we sent, an
    /// H2CTermReq the host sent).
    /// A command the engine answered with an error before the queue's Connect was
    /// answered: logged and counted as a refusal, with who it came from.
    pub(super) fn report_refused_before_connect(
        &mut self,
        qp: QpHandle,
        sqe: &nvmf::spec::Sqe,
        status: nvmf::spec::Status,
    ) {
        use crate::refusals as r;
        let key = queue_key(self.index, qp);
        let c = self.shared.conn(key);
        let what = if sqe.is_fabrics() && sqe.fctype() == nvmf::spec::opcodes::fabrics::CONNECT {
            let qid = nvmf::spec::fabrics::ConnectCommand::from_sqe(sqe).qid;
            format!("a Fabrics Connect (qid {qid})")
        } else {
            format!(
                "a command (opcode {:#04x}) before the queue's Fabrics Connect",
                sqe.opcode()
            )
        };
        let line = format!(
            "refused {}: host -, subsystem -, cntlid -, qid -: {what} (answered {status}){}",
            r::where_from(c.as_ref()),
            why_refused_before_connect(status)
        );
        self.shared
            .refusals
            .report(r::REFUSED_BEFORE_CONNECT, c.and_then(|c| c.peer), &line);
    }

    pub(super) fn report_termination(
        &mut self,
        qp: QpHandle,
        by_host: bool,
        icreq: bool,
        fes: u16,
        fei: u32,
    ) {
        use crate::refusals as r;
        let key = queue_key(self.index, qp);
        let c = self.shared.conn(key);
        let what = fes_text(fes);
        let (label, line) = if by_host {
            (
                r::H2C_TERM_REQ_RECEIVED,
                format!("the host terminated the connection with an H2CTermReq (FES {fes:#x}: {what}, FEI {fei})"),
            )
        } else if icreq {
            (
                r::ICREQ_REJECTED,
                format!("ICReq rejected with a C2HTermReq (FES {fes:#x}: {what}, FEI {fei} = byte offset of the bad field)"),
            )
        } else {
            (
                r::C2H_TERM_REQ_SENT,
                format!("the host broke NVMe/TCP: sent a C2HTermReq (FES {fes:#x}: {what}, FEI {fei} = byte offset of the bad field) and closed the connection"),
            )
        };
        let line = format!("{}: {line}", self.who(qp, c.as_ref()));
        self.shared
            .refusals
            .report(label, c.and_then(|c| c.peer), &line);
    }

    /// Where queue `qp` came from and whose it is, for a refusal line: `peer ... on
    /// listener ...: host "...", subsystem "...", cntlid N, qid N` (dashes before Connect).
    pub(super) fn who(&self, qp: QpHandle, c: Option<&crate::refusals::ConnInfo>) -> String {
        let queue = self.qps.get(&qp).and_then(|a| a.queue);
        let (host, sub) = queue
            .and_then(|q| self.shared.target().controller_nqns(q.cntlid))
            .unwrap_or_default();
        format!(
            "{}: host {host:?}, subsystem {sub:?}, cntlid {}, qid {}",
            crate::refusals::where_from(c),
            queue.map_or_else(|| "-".into(), |q| q.cntlid.to_string()),
            queue.map_or_else(|| "-".into(), |q| q.qid.to_string()),
        )
    }

    /// An NVMe/RDMA queue lost to a transport failure (`kind` Io or Protocol): a refusal
    /// line with who it was, counted as `rdma_transport_error`. (NVMe/TCP reports its
    /// protocol errors with their C2HTermReq; its socket errors are hosts going away.)
    pub(super) fn report_rdma_error(&mut self, qp: QpHandle, kind: sta::TransportErrorKind) {
        use crate::refusals as r;
        let key = queue_key(self.index, qp);
        if self.shared.transport_of(key) != "rdma" {
            return;
        }
        let c = self.shared.conn(key);
        let what = if kind == sta::TransportErrorKind::Protocol {
            "the host broke the NVMe/RDMA transport binding (a capsule shorter than an SQE \
             or longer than the receive buffer)"
        } else {
            "the RDMA connection failed (a work request the NIC failed, such as a key or \
             address of the host's SGL it refused or a host that stopped answering; or the \
             connection manager lost the connection; the engine's line before says which, \
             when it was a work request)"
        };
        let line = format!("{}: {what}: queue closed", self.who(qp, c.as_ref()));
        self.shared
            .refusals
            .report(r::RDMA_TRANSPORT_ERROR, c.and_then(|c| c.peer), &line);
    }

    /// A peer lost its connection to one of the engine's bounds or deadlines
    /// (`termreq`: with a C2HTermReq, counted with the other C2HTermReqs sent): logged at
    /// warn with the peer and the reason, rate-limited per peer and limit (the engine
    /// counted the hit in `nvmft_limit_hits_total`).
    pub(super) fn report_limit(&mut self, qp: QpHandle, limit: sta::Limit, termreq: bool) {
        use crate::refusals as r;
        let key = queue_key(self.index, qp);
        let c = self.shared.conn(key);
        if termreq {
            self.shared.refusals.count(r::C2H_TERM_REQ_SENT);
        }
        let line = format!(
            "{}: the peer {} (limit {}): connection closed{}",
            self.who(qp, c.as_ref()),
            limit.describe(),
            limit.label(),
            if termreq { " with a C2HTermReq" } else { "" },
        );
        self.shared
            .refusals
            .log(limit.label(), c.and_then(|c| c.peer), &line);
    }
}

/// A few words for a TermReq's Fatal Error Status (NVMe/TCP 1.0 Figure 23).
fn fes_text(fes: u16) -> &'static str {
    use nvmf::tcp::fes;
    match fes {
        fes::INVALID_HEADER_FIELD => "invalid PDU header field",
        fes::PDU_SEQUENCE_ERROR => "PDU sequence error",
        fes::HEADER_DIGEST_ERROR => "header digest error",
        fes::DATA_TRANSFER_OUT_OF_RANGE => "data transfer out of range",
        fes::DATA_TRANSFER_LIMIT_EXCEEDED => "data transfer limit exceeded",
        fes::UNSUPPORTED_PARAMETER => "unsupported parameter",
        _ => "unknown",
    }
}

/// What the engine's answer to a command before Connect means, for the refusal line
/// (`: ...`), or nothing where the status says it all.
fn why_refused_before_connect(status: nvmf::spec::Status) -> &'static str {
    use nvmf::spec::Status as S;
    match status {
        S::COMMAND_INTERRUPTED => {
            ": no data buffer or command slot was free on its IO thread (held by other \
             connections); the host may retry"
        }
        S::DATA_SGL_LENGTH_INVALID => {
            ": its data length is not the command's (a Connect carries 1024 bytes)"
        }
        S::SGL_DESCRIPTOR_TYPE_INVALID | S::SGL_OFFSET_INVALID => {
            ": its data descriptor is malformed"
        }
        S::COMMAND_SEQUENCE_ERROR => ": a queue's first command must be a Fabrics Connect",
        _ => "",
    }
}
