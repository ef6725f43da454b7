//! The part of a reference application that closes a queue and carries out what
//! `nvmf::target::Target` asks for ([`Action`]), as the daemon's IO threads do
//! (`src/daemon/io_thread.rs`). Shared by the contract suite's `World` (`suite.rs`) and the
//! engine fuzz target (`fuzz/src/engine.rs`, which includes this file with `#[path]`), so
//! that the two applications cannot drift apart.

use std::collections::HashMap;

use nvmf::spec::Cqe;
use nvmf::target::{Action, QueueRef, Target};
use sta::{CmdToken, QpHandle};

/// What the application keeps per QP.
#[derive(Default)]
pub struct QpApp {
    /// The queue the QP's Connect made, once it did.
    pub queue: Option<QueueRef>,
    /// The application closed the queue (the QP is going away).
    pub closed: bool,
}

/// Held completions (AERs): (cntlid, cid) -> (qp, token).
pub type Held = HashMap<(u16, u16), (QpHandle, CmdToken)>;

/// An application around a `Target`: its state, and how it answers, disconnects and
/// aborts through its engine.
pub trait Glue {
    fn target(&mut self) -> &mut Target;
    fn apps(&mut self) -> &mut HashMap<QpHandle, QpApp>;
    fn held(&mut self) -> &mut Held;
    /// Sends `cqe` (after `data_len` bytes of data) for the command `token` on `qp`.
    fn answer(&mut self, qp: QpHandle, token: CmdToken, cqe: &Cqe, data_len: u32);
    /// Asks the engine to disconnect `qp`.
    fn disconnect(&mut self, qp: QpHandle);
    /// Asks the engine to abort command `cid` on `qp`; whether it did.
    fn cmd_abort(&mut self, qp: QpHandle, cid: u16) -> bool;

    /// The QP is gone or going: its held commands are forgotten, and the target closes its
    /// queue (once).
    fn close_queue(&mut self, qp: QpHandle) {
        let Some(app) = self.apps().get_mut(&qp) else {
            return;
        };
        if app.closed {
            return;
        }
        app.closed = true;
        let queue = app.queue;
        self.held().retain(|_, (h, _)| *h != qp);
        if let Some(q) = queue {
            let actions = self.target().queue_closed(q, qp.as_u64());
            self.apply(actions);
        }
    }

    /// Carries out the target's actions.
    fn apply(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::CompleteHeld { queue, cqe, .. } => {
                    if let Some((qp, token)) = self.held().remove(&(queue.cntlid, cqe.cid)) {
                        self.answer(qp, token, &cqe, 0);
                    }
                }
                Action::Disconnect { key, .. } => {
                    if let Some(qp) = self.qp_of_key(key) {
                        self.disconnect(qp);
                    }
                }
                Action::Abort {
                    key,
                    cid,
                    abort,
                    abort_cid,
                    ..
                } => {
                    let aborted = self
                        .qp_of_key(key)
                        .is_some_and(|qp| self.cmd_abort(qp, cid));
                    let actions = self.target().abort_done(abort, abort_cid, aborted);
                    self.apply(actions);
                }
            }
        }
    }

    /// The QP a target key names (the application keys queues by `QpHandle::as_u64`).
    fn qp_of_key(&mut self, key: u64) -> Option<QpHandle> {
        self.apps().keys().copied().find(|q| q.as_u64() == key)
    }
}
