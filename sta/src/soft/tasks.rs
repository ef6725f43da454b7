//! What the application asks of an IO context (DOCA STA's tasks and QP calls): bind a QP
//! to a subsystem and tell it the Connect parameters, answer a non-offloaded command with
//! one of the three data tasks, and disconnect a QP.
//!
//! The task names are DOCA's, chosen for RDMA; on NVMe/TCP the same three tasks mean:
//!
//! | task | NVMe/RDMA | NVMe/TCP |
//! |---|---|---|
//! | `rdma_read` (fetch the host's data) | RDMA READ of the keyed SGL | R2T, then the host's H2CData PDUs |
//! | `rdma_write_send` (data, then the completion) | RDMA WRITE, then SEND (with Invalidate when asked) | C2HData, then CapsuleResp (or C2HData with SUCCESS) |
//! | `rdma_send` (completion only) | SEND | CapsuleResp |
//!
//! The application does not care which transport a QP uses.

use nvmf::queue::QueueParams;
use nvmf::spec::Cqe;

use super::cmd::{Fused, Link, St, FENCE_BIT};
use super::io::{post_rdma, qp_ref, StaIo};
use super::tcp_link;
use crate::{AccessKey, CmdToken, Event, QpHandle, SubsysId, TaskError, TaskKind};

impl StaIo {
    pub(crate) fn qp_set_user_data(&mut self, qp: QpHandle, user: u64) -> Result<(), TaskError> {
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        q.st.user = user;
        Ok(())
    }

    /// DOCA `doca_sta_io_qp_add_subsystem`: binds an I/O queue (never an admin queue) to a
    /// subsystem; from now on the engine serves its I/O commands to that subsystem's
    /// namespaces.
    pub(crate) fn qp_add_subsystem(
        &mut self,
        qp: QpHandle,
        subsys: SubsysId,
    ) -> Result<(), TaskError> {
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        q.st.subsys = Some(subsys);
        Ok(())
    }

    /// Who an I/O queue's commands come from: the Host Identifier and host NQN of its
    /// controller and the listener it came in on (`nvmf::target::ConnectOk::access`). The
    /// engine checks every offloaded command of the QP against the namespace's published
    /// access view with this key. Not a DOCA call: DOCA STA has no per-command hook (see
    /// the crate docs).
    pub fn qp_set_access(&mut self, qp: QpHandle, key: AccessKey) -> Result<(), TaskError> {
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        q.st.access = key;
        Ok(())
    }

    /// Abort command `cid` of `qp` (the Abort admin command, NVMe Base 2.0 section 5.1) if
    /// it has not reached the backend. A command still waiting for the host's data is
    /// marked: its data is still taken in (the host was asked for it; dropping it would
    /// break the transport), then it is answered Abort Requested and never runs. A command
    /// queued behind a full backend queue is taken off the queue and answered at once.
    /// Returns whether the command was aborted; one already at the backend, handed to the
    /// application, or not found is not (the spec allows that for any command).
    pub fn cmd_abort(&mut self, qp: QpHandle, cid: u16) -> bool {
        let Some(idx) =
            self.core.cmds.iter().position(|c| {
                c.st != St::Free && c.qp == qp && c.sqe.cid() == cid && c.op.is_some()
            })
        else {
            return false;
        };
        let idx = idx as u32;
        let c = &mut self.core.cmds[idx as usize];
        if c.fused != Fused::None {
            // Half of a fused Compare and Write runs with its partner or not at all: an
            // abort of one half would leave the other waiting for it forever. Not
            // aborted (the spec allows that for any command); the pair completes.
            return false;
        }
        match c.st {
            St::H2C => {
                c.aborted = true;
                true
            }
            St::WaitBuf => {
                // Waiting for its connection's buffer budget: nothing started yet.
                let Some(q) = qp_ref(&mut self.qps, qp) else {
                    return false;
                };
                q.st.waiting.retain(|&w| w != idx);
                self.core
                    .fail(&mut q.st, idx, nvmf::spec::Status::ABORT_REQUESTED);
                true
            }
            St::Backend => {
                let tag = c.tag(idx);
                let (ns_idx, pending) = (c.ns, c.pending);
                let Some(ns) = self
                    .core
                    .ns
                    .get_mut(ns_idx as usize)
                    .and_then(|n| n.as_mut())
                else {
                    return false;
                };
                // Only if none of its requests reached the backend yet.
                let queued = ns
                    .pending
                    .iter()
                    .filter(|r| r.tag & !FENCE_BIT == tag)
                    .count();
                if queued == 0 || queued != pending as usize {
                    return false;
                }
                let mut bufs = Vec::new();
                ns.pending.retain_mut(|r| {
                    if r.tag & !FENCE_BIT == tag {
                        ns.fences.ended(r.tag);
                        if let Some(b) = r.buf.take() {
                            bufs.push(b);
                        }
                        false
                    } else {
                        true
                    }
                });
                ns.publish_depth();
                for b in bufs {
                    self.core.pool.put(b);
                }
                let Some(q) = qp_ref(&mut self.qps, qp) else {
                    return false;
                };
                self.core
                    .fail(&mut q.st, idx, nvmf::spec::Status::ABORT_REQUESTED);
                true
            }
            _ => false,
        }
    }

    /// DOCA `doca_sta_io_qp_connect_set_sq_size`, plus what the transports need from the
    /// Connect command: the queue id and whether SQ flow control is disabled. Call it for
    /// every queue, the admin queue included: completions then carry SQHD wrapping at
    /// SQSIZE + 1 (or FFFFh without flow control), and on TCP a successful read's C2HData
    /// may carry the SUCCESS flag instead of a response capsule.
    pub(crate) fn qp_connect_set_params(
        &mut self,
        qp: QpHandle,
        qid: u16,
        sqsize: u16,
        sqflow_disabled: bool,
    ) -> Result<(), TaskError> {
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        q.st.link.set_params(QueueParams {
            qid,
            sqsize,
            sq_flow_control_disabled: sqflow_disabled,
        });
        // An RDMA queue gets the rest of its receives now (`rdma_link::PRE_CONNECT_RECVS`);
        // they go out with the Connect's answer.
        if let (Link::Rdma(r), Some(rt)) = (&mut q.st.link, &self.rdma) {
            if let Err(e) = r.grow_receives(rt.lib) {
                tracing::warn!(
                    qp = qp.as_u64(),
                    "cannot register the receive buffers of a connected RDMA queue: {e}"
                );
                return Err(TaskError::Transport);
            }
        }
        // The queue has a controller now: the Connect deadline is met, and its commands
        // may take data.
        q.st.qid = Some(qid);
        Ok(())
    }

    /// Free a non-offloaded command without answering it: the host no longer counts it
    /// as outstanding (an Asynchronous Event Request held across a controller reset and
    /// then sent again with the same CID). Its queue entry is free again.
    pub fn cmd_drop(&mut self, qp: QpHandle, token: CmdToken) -> Result<(), TaskError> {
        self.app_cmd(qp, token)?;
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        self.core.release(&mut q.st, token.idx);
        Ok(())
    }

    /// The payload buffer of a non-offloaded command the application holds (not while
    /// its host data is being fetched, not once it was answered).
    pub(crate) fn payload(&mut self, token: CmdToken) -> Result<&mut [u8], TaskError> {
        let c = self.core.cmd_mut(token).ok_or(TaskError::NoCommand)?;
        match c.st {
            St::App => {}
            St::H2C => return Err(TaskError::BadState),
            _ => return Err(TaskError::NoCommand),
        }
        let len = c.len as usize;
        Ok(match c.buf.as_mut() {
            Some(b) => &mut b.as_mut_slice()[..len],
            None => &mut [],
        })
    }

    /// DOCA `doca_sta_io_task_disconnect_alloc_init` + submit: stop taking input, let the
    /// QP's in-flight backend I/O finish, drop its unsent output, close the socket, then
    /// report `TaskDone { kind: QpDisconnect }`. The handle is dead afterwards (DOCA's
    /// `qp_destroy` is folded in). Tokens of the QP's non-offloaded commands die with it.
    pub(crate) fn qp_disconnect(&mut self, qp: QpHandle, user: u64) -> Result<(), TaskError> {
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        if q.st.disconnect.is_some() {
            return Err(TaskError::QpClosing);
        }
        q.st.disconnect = Some(user);
        q.st.rx_stopped = true;
        q.st.waiting.clear();
        match &mut q.st.link {
            Link::Rdma(r) => {
                // Post what is queued (a final response) best effort, then disconnect: the
                // QP goes to the error state and everything outstanding flushes.
                if let Some(rt) = self.rdma.as_mut() {
                    if let Err(e) = post_rdma(rt, r, &self.core.cmds) {
                        // The QP is going down anyway; the host sees the disconnect.
                        tracing::debug!(qp = qp.as_u64(), "disconnect: last post failed: {e}");
                    }
                    r.machine.discard_work();
                    r.disconnect(rt.lib);
                }
            }
            Link::Tcp(t) => {
                // Flush what is already queued (e.g. a final response) best effort, then
                // drop the rest.
                if let Err(e) = tcp_link::flush(t, &mut self.core.cmds, &mut self.released) {
                    // The socket is closing anyway; the host sees the connection go.
                    tracing::debug!(qp = qp.as_u64(), "disconnect: last write failed: {e}");
                }
                t.tx.discard(&mut self.released);
                for c in self.released.drain(..) {
                    self.core.release(&mut q.st, c);
                }
            }
        }
        q.st.clear_tx();
        self.disconnecting.push(qp);
        Ok(())
    }

    /// The command of `token` on `qp`, waiting for the application.
    fn app_cmd(&mut self, qp: QpHandle, token: CmdToken) -> Result<(), TaskError> {
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        if q.st.disconnect.is_some() {
            return Err(TaskError::QpClosing);
        }
        let c = self.core.cmd_mut(token).ok_or(TaskError::NoCommand)?;
        if c.qp != qp {
            return Err(TaskError::NoCommand);
        }
        if c.st != St::App {
            return Err(TaskError::BadState);
        }
        Ok(())
    }

    /// DOCA `rdma_read` task: fetch the host's data for a non-offloaded command into its
    /// payload (TCP: R2T, then the host's H2CData; RDMA: RDMA READ of the keyed SGL).
    /// `TaskDone { kind: RdmaRead }` follows.
    pub(crate) fn rdma_read(
        &mut self,
        qp: QpHandle,
        token: CmdToken,
        user: u64,
    ) -> Result<(), TaskError> {
        self.app_cmd(qp, token)?;
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        let c = &mut self.core.cmds[token.idx as usize];
        c.user = user;
        if c.got >= c.len {
            self.core.events.push_back(Event::TaskDone {
                kind: TaskKind::RdmaRead,
                qp,
                user,
                result: Ok(()),
            });
            return Ok(());
        }
        if matches!(q.st.link, Link::Rdma(_)) && nvmf::rdma::KeyedSgl::parse(&c.sqe.dptr).is_none()
        {
            return Err(TaskError::BadState);
        }
        self.core.fetch_host_data(&mut q.st, token.idx);
        Ok(())
    }

    /// DOCA `rdma_write_send` task: send `data_len` bytes of the payload to the host
    /// (TCP: C2HData; RDMA: RDMA WRITE), then the completion. `data_len` is clamped to
    /// the payload length.
    pub(crate) fn rdma_write_send(
        &mut self,
        qp: QpHandle,
        token: CmdToken,
        cqe: &Cqe,
        data_len: u32,
        user: u64,
    ) -> Result<(), TaskError> {
        self.app_cmd(qp, token)?;
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        self.core.respond(&mut q.st, token.idx, *cqe, data_len);
        self.core.events.push_back(Event::TaskDone {
            kind: TaskKind::RdmaWriteSend,
            qp,
            user,
            result: Ok(()),
        });
        Ok(())
    }

    /// DOCA `rdma_send` task: send the completion only (TCP: CapsuleResp; RDMA: SEND).
    pub(crate) fn rdma_send(
        &mut self,
        qp: QpHandle,
        token: CmdToken,
        cqe: &Cqe,
        user: u64,
    ) -> Result<(), TaskError> {
        self.app_cmd(qp, token)?;
        let q = qp_ref(&mut self.qps, qp).ok_or(TaskError::NoQp)?;
        self.core.respond(&mut q.st, token.idx, *cqe, 0);
        self.core.events.push_back(Event::TaskDone {
            kind: TaskKind::RdmaSend,
            qp,
            user,
            result: Ok(()),
        });
        Ok(())
    }
}
