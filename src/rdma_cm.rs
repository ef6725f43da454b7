//! The daemon's RDMA connection manager service (DESIGN.md, "The spine", step 1).
//!
//! One RDMA CM event channel carries every RDMA listener and the connections they accept.
//! A CM thread reads it: a CONNECT_REQUEST has its NVMe-oF RDMA private data checked
//! (RECFMT, QID, HRQSIZE, HSQSIZE; a bad one is rejected with the NVMe-oF reject status),
//! then goes to the IO thread with the fewest QPs, which creates the QP and accepts
//! (`StaIo::qp_accept_rdma`). Later events of that connection (ESTABLISHED, DISCONNECTED,
//! DEVICE_REMOVAL, TIMEWAIT_EXIT) follow it to the same IO thread.
//!
//! Listeners are created and closed by the main thread (config apply and reload).
//! rdma-core is loaded at run time: without it, or without an RDMA device, starting the
//! service fails with a message that says which is missing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nvmf::rdma::{CmLimits, CmRequest, RejectStatus};
pub(crate) use sta::verbs::RdmaCmEvent;
use sta::verbs::{CmChannel, CmEvent, CmIdKey, CmListener, ConnRequest, VerbsError};

/// What the CM thread sends to an IO thread.
pub(crate) enum RdmaMsg {
    /// Accept this connection: `depth` commands may be outstanding (HSQSIZE + 1).
    Connect {
        req: ConnRequest,
        depth: u16,
        qid: u16,
    },
    /// A CM event for a connection that IO thread accepted.
    Event { id: CmIdKey, ev: RdmaCmEvent },
}

/// Picks the IO thread for a new connection (and counts it there).
pub(crate) type Pick = Box<dyn Fn() -> usize + Send>;
/// Sends a message to IO thread `n`.
pub(crate) type Dispatch = Box<dyn Fn(usize, RdmaMsg) + Send>;
/// Told of each connect request about to be rejected (to log and count it).
pub(crate) type Rejected = Box<dyn Fn(&ConnRequest, RejectStatus) + Send>;

pub(crate) struct RdmaService {
    channel: Arc<CmChannel>,
    listeners: HashMap<String, CmListener>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RdmaService {
    /// Open rdma-core, the event channel, and start the CM thread.
    pub fn start(
        limits: CmLimits,
        pick: Pick,
        dispatch: Dispatch,
        rejected: Rejected,
    ) -> Result<RdmaService, VerbsError> {
        let channel = Arc::new(CmChannel::new()?);
        let stop = Arc::new(AtomicBool::new(false));
        let (ch, st) = (channel.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("nvmft-rdma-cm".into())
            .spawn(move || cm_thread(&ch, &st, limits, pick, dispatch, rejected))
            .map_err(VerbsError::Thread)?;
        Ok(RdmaService {
            channel,
            listeners: HashMap::new(),
            stop,
            thread: Some(thread),
        })
    }

    pub fn listen(&mut self, name: &str, addr: SocketAddr) -> Result<(), VerbsError> {
        let l = self.channel.listen(addr)?;
        self.listeners.insert(name.to_string(), l);
        Ok(())
    }

    /// Close a listener; true if it existed.
    pub fn unlisten(&mut self, name: &str) -> bool {
        self.listeners.remove(name).is_some()
    }

    pub fn close_listeners(&mut self) {
        self.listeners.clear();
    }

    /// Stop the CM thread and free the channel (every accepted id must be gone: call
    /// once the IO threads have drained).
    pub fn shutdown(mut self) {
        self.listeners.clear();
        self.stop.store(true, Ordering::SeqCst);
        join_cm_thread(self.thread.take());
    }
}

/// Wait for the CM thread; a panic in it was already printed by the panic hook, this line
/// says what it means.
fn join_cm_thread(t: Option<JoinHandle<()>>) {
    if let Some(t) = t {
        if t.join().is_err() {
            tracing::error!("the RDMA CM thread panicked; RDMA connections were not served");
        }
    }
}

impl Drop for RdmaService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if self.thread.is_some() {
            // Not shut down properly (IO threads may still own ids): leave the channel.
            join_cm_thread(self.thread.take());
            self.listeners.clear();
            std::mem::forget(self.channel.clone());
        }
    }
}

fn cm_thread(
    ch: &CmChannel,
    stop: &AtomicBool,
    limits: CmLimits,
    pick: Pick,
    dispatch: Dispatch,
    rejected: Rejected,
) {
    // Which IO thread owns each accepted cm_id.
    let mut owners: HashMap<u64, usize> = HashMap::new();
    while !stop.load(Ordering::SeqCst) {
        let Some(ev) = ch.get_event(Duration::from_millis(100)) else {
            continue;
        };
        let (id, ev) = match ev {
            CmEvent::ConnectRequest(req) => {
                let checked = CmRequest::validate(&req.private_data, &limits).and_then(|x| {
                    // We fetch host data with RDMA READ: the host must allow some.
                    if req.initiator_depth == 0 {
                        Err(RejectStatus::InvalidOrd)
                    } else {
                        Ok(x)
                    }
                });
                match checked {
                    Ok((r, depth)) => {
                        let t = pick();
                        tracing::debug!(
                            "rdma: connect request qid {} depth {depth} hrqsize {} to io thread {t}",
                            r.qid,
                            r.hrqsize
                        );
                        owners.insert(req.key().as_u64(), t);
                        dispatch(
                            t,
                            RdmaMsg::Connect {
                                req,
                                depth,
                                qid: r.qid,
                            },
                        );
                    }
                    Err(status) => {
                        rejected(&req, status);
                        req.reject(status);
                    }
                }
                continue;
            }
            CmEvent::Established(id) => (id, RdmaCmEvent::Established),
            CmEvent::Disconnected(id) => (id, RdmaCmEvent::Disconnected),
            CmEvent::DeviceRemoval(id) | CmEvent::ConnectError(id) => (id, RdmaCmEvent::Lost),
            CmEvent::TimewaitExit(id) => {
                if let Some(t) = owners.remove(&id.as_u64()) {
                    dispatch(
                        t,
                        RdmaMsg::Event {
                            id,
                            ev: RdmaCmEvent::Lost,
                        },
                    );
                }
                continue;
            }
            CmEvent::Other(n) => {
                tracing::debug!("rdma: CM event {n} ignored");
                continue;
            }
        };
        // After these the IO thread tears the connection down and destroys the id; a
        // later TIMEWAIT_EXIT (if any) has nothing left to tell.
        let owner = if ev == RdmaCmEvent::Established {
            owners.get(&id.as_u64()).copied()
        } else {
            owners.remove(&id.as_u64())
        };
        match owner {
            Some(t) => dispatch(t, RdmaMsg::Event { id, ev }),
            None => tracing::warn!("rdma: CM event {ev:?} for an unknown id"),
        }
    }
}
