//! The soft engine's IO context behind the contract's traits: each method is the
//! inherent one of the same name (in `io` and `tasks`), with the contract's error types.
//! (The main context, `Sta`, implements [`crate::Engine`] directly in `mod.rs`.)

use std::net::TcpStream;
use std::time::Duration;

use super::{StaIo, StaIoSeed};
use crate::verbs::{ConnRequest, RdmaCmEvent};
use crate::{
    AcceptError, AccessKey, CmdToken, Cqe, EngineError, Event, IoContext, IoSeed, QpHandle,
    SubsysId, TaskError, TlsAccept, TlsPeerInfo,
};

impl IoSeed for StaIoSeed {
    type Io = StaIo;

    fn start(self) -> Result<StaIo, EngineError> {
        StaIoSeed::start(self)
    }
}

impl IoContext for StaIo {
    fn progress(&mut self, max_wait: Duration) -> bool {
        StaIo::progress(self, max_wait)
    }
    fn poll_event(&mut self) -> Option<Event> {
        StaIo::poll_event(self)
    }
    fn busy(&self) -> bool {
        StaIo::busy(self)
    }
    fn qp_count(&self) -> usize {
        StaIo::qp_count(self)
    }
    fn commands_in_flight(&self) -> usize {
        StaIo::commands_in_flight(self)
    }
    fn qp_accept_tcp(&mut self, sock: TcpStream, user: u64) -> Result<QpHandle, AcceptError> {
        Ok(StaIo::qp_accept_tcp(self, sock, user)?)
    }
    fn qp_accept_tcp_tls(
        &mut self,
        sock: TcpStream,
        user: u64,
        tls: &TlsAccept,
    ) -> Result<QpHandle, AcceptError> {
        Ok(StaIo::qp_accept_tcp_tls(self, sock, user, tls)?)
    }
    fn qp_tls(&mut self, qp: QpHandle) -> Option<Result<TlsPeerInfo, String>> {
        StaIo::qp_tls(self, qp)
    }
    fn qp_accept_rdma(
        &mut self,
        req: ConnRequest,
        depth: u16,
        user: u64,
    ) -> Result<QpHandle, AcceptError> {
        StaIo::qp_accept_rdma(self, req, depth, user).map_err(|e| AcceptError::Rejected {
            status: e.status,
            error: Box::new(e.error),
        })
    }
    fn qp_rdma_cm_event(&mut self, qp: QpHandle, ev: RdmaCmEvent) -> Result<(), TaskError> {
        StaIo::qp_rdma_cm_event(self, qp, ev)
    }
    fn qp_set_user_data(&mut self, qp: QpHandle, user: u64) -> Result<(), TaskError> {
        StaIo::qp_set_user_data(self, qp, user)
    }
    fn qp_add_subsystem(&mut self, qp: QpHandle, subsys: SubsysId) -> Result<(), TaskError> {
        StaIo::qp_add_subsystem(self, qp, subsys)
    }
    fn qp_connect_set_params(
        &mut self,
        qp: QpHandle,
        qid: u16,
        sqsize: u16,
        sqflow_disabled: bool,
    ) -> Result<(), TaskError> {
        StaIo::qp_connect_set_params(self, qp, qid, sqsize, sqflow_disabled)
    }
    fn qp_set_access(&mut self, qp: QpHandle, key: AccessKey) -> Result<(), TaskError> {
        StaIo::qp_set_access(self, qp, key)
    }
    fn cmd_abort(&mut self, qp: QpHandle, cid: u16) -> bool {
        StaIo::cmd_abort(self, qp, cid)
    }
    fn ns_fence(&mut self, subsys: SubsysId, nsid: u32) -> crate::Fence {
        StaIo::ns_fence(self, subsys, nsid)
    }
    fn cmd_drop(&mut self, qp: QpHandle, token: CmdToken) -> Result<(), TaskError> {
        StaIo::cmd_drop(self, qp, token)
    }
    fn qp_disconnect(&mut self, qp: QpHandle, user: u64) -> Result<(), TaskError> {
        StaIo::qp_disconnect(self, qp, user)
    }
    fn payload(&mut self, token: CmdToken) -> Result<&mut [u8], TaskError> {
        StaIo::payload(self, token)
    }
    fn rdma_read(&mut self, qp: QpHandle, token: CmdToken, user: u64) -> Result<(), TaskError> {
        StaIo::rdma_read(self, qp, token, user)
    }
    fn rdma_write_send(
        &mut self,
        qp: QpHandle,
        token: CmdToken,
        cqe: &Cqe,
        data_len: u32,
        user: u64,
    ) -> Result<(), TaskError> {
        StaIo::rdma_write_send(self, qp, token, cqe, data_len, user)
    }
    fn rdma_send(
        &mut self,
        qp: QpHandle,
        token: CmdToken,
        cqe: &Cqe,
        user: u64,
    ) -> Result<(), TaskError> {
        StaIo::rdma_send(self, qp, token, cqe, user)
    }
}
