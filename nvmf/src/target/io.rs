//! I/O queue commands that reach the target: the reservation commands (Register 0Dh,
//! Report 0Eh, Acquire 11h, Release 15h), and anything the engine did not offload.
//!
//! Every command naming a namespace is checked as the engine checks offloaded ones
//! (visibility, the ANA state of the queue's listener, then the reservation), so the
//! answer does not depend on which path a command took.

use super::refusal::RefusalReason as R;
use super::reservation;
use super::{Reply, Target};
use crate::spec::{opcodes::io as op, Sqe, Status};

pub(super) fn execute(
    t: &mut Target,
    cntlid: u16,
    sqe: &Sqe,
    data: &mut [u8],
) -> Result<Reply, Status> {
    let opcode = sqe.opcode();
    let resv = matches!(
        opcode,
        op::RESERVATION_REGISTER
            | op::RESERVATION_REPORT
            | op::RESERVATION_ACQUIRE
            | op::RESERVATION_RELEASE
    );
    let known = matches!(
        opcode,
        op::FLUSH | op::WRITE | op::READ | op::COMPARE | op::WRITE_ZEROES | op::DATASET_MANAGEMENT
    ) || (resv && t.opts.reservations)
        || (opcode == op::COPY && t.opts.copy_max_bytes > 0);
    if !known {
        return Err(Status::INVALID_OPCODE);
    }
    let ctrl = t
        .controllers
        .get(&cntlid)
        .ok_or(Status::COMMAND_SEQUENCE_ERROR)?;
    let subnqn = ctrl.subnqn.clone();
    let host_id = ctrl.hostid;
    let by = reservation::RegisteredBy::new(&ctrl.hostnqn, ctrl.origin.peer);
    let listener = ctrl.origin.listener.clone();
    let subsys = t.subsystems.get(&subnqn).ok_or(Status::INTERNAL_ERROR)?;
    let nsid = sqe.nsid;
    if subsys
        .lost
        .get(&nsid)
        .is_some_and(|n| n.visible_to(&ctrl.hostnqn))
    {
        // Its storage is gone (`Target::namespace_lost`).
        return Err(Status::INTERNAL_PATH_ERROR);
    }
    let ns = subsys
        .namespaces
        .get(&nsid)
        .filter(|n| n.visible_to(&ctrl.hostnqn))
        .ok_or(Status::INVALID_NAMESPACE)?;
    if let Some(st) = subsys.ana.state(ns.group(), listener.as_ref()).io_status() {
        return Err(st);
    }
    let resv = subsys.resv.get(&nsid).ok_or(Status::INTERNAL_ERROR)?;
    let fx = match opcode {
        op::RESERVATION_REPORT => return report(resv, sqe, data),
        op::RESERVATION_REGISTER | op::RESERVATION_ACQUIRE | op::RESERVATION_RELEASE => {
            let ptpl_capable = t.opts.ptpl_capable;
            // A host NQN at its registrant quota replaces its own stale registrations
            // (Host IDs no live controller of the subsystem has: a host without a fixed
            // Host ID gets a new one at each connect) before it is refused.
            let at_quota = opcode == op::RESERVATION_REGISTER
                && resv.refuse_new(&host_id, sqe.cdw10, by)
                    == Some(reservation::RegistrantsRefusal::HostQuota);
            let live: std::collections::HashSet<reservation::HostId> = if at_quota {
                t.controllers
                    .values()
                    .filter(|c| c.subnqn == subnqn && !c.retired)
                    .map(|c| c.hostid)
                    .collect()
            } else {
                Default::default()
            };
            let subsys = t
                .subsystems
                .get_mut(&subnqn)
                .ok_or(Status::INTERNAL_ERROR)?;
            let r = subsys.resv.get_mut(&nsid).ok_or(Status::INTERNAL_ERROR)?;
            let ptpl_before = r.ptpl;
            if at_quota {
                r.evict_stale(by, &live);
            }
            let fx = match opcode {
                op::RESERVATION_REGISTER => {
                    r.register_by(&host_id, sqe.cdw10, data, ptpl_capable, by)
                }
                op::RESERVATION_ACQUIRE => r.acquire(&host_id, sqe.cdw10, data),
                _ => r.release(&host_id, sqe.cdw10, data),
            };
            let fx = match fx {
                Err(status)
                    if opcode == op::RESERVATION_REGISTER
                        && status == reservation::REGISTRANTS_FULL =>
                {
                    use reservation::RegistrantsRefusal as Why;
                    let why = match r.refuse_new(&host_id, sqe.cdw10, by) {
                        Some(Why::HostQuota) => R::RegistrantsQuota {
                            nsid,
                            max: reservation::MAX_REGISTRANTS_PER_HOST,
                            by_address: false,
                        },
                        Some(Why::PeerQuota) => R::RegistrantsQuota {
                            nsid,
                            max: reservation::MAX_REGISTRANTS_PER_HOST,
                            by_address: true,
                        },
                        _ => R::RegistrantsFull {
                            nsid,
                            max: reservation::MAX_REGISTRANTS,
                        },
                    };
                    t.refused_command(cntlid, status, why);
                    return Err(status);
                }
                fx => fx?,
            };
            if (fx.changed && (r.ptpl || ptpl_before)) || fx.ptpl_changed {
                t.ptpl_version += 1;
            }
            fx
        }
        _ => {
            if let Some(a) = super::access::access_of(opcode) {
                resv.check(&host_id, a)?;
            }
            return other(ns, sqe);
        }
    };
    if fx.changed {
        t.publish(&subnqn, nsid);
    }
    t.notify_reservation(&subnqn, nsid, &fx.notify);
    Reply::ok()
}

/// Reservation Report: NUMD (CDW10, 0's based) dwords of the status data structure, EDS
/// in CDW11 bit 0.
fn report(r: &reservation::Reservations, sqe: &Sqe, data: &mut [u8]) -> Result<Reply, Status> {
    let eds = sqe.cdw11 & 1 != 0;
    if !eds {
        return Err(Status::HOST_IDENTIFIER_INCONSISTENT);
    }
    let len = (sqe.cdw10 as u64 + 1) * 4;
    if len > data.len() as u64 {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    let len = len as usize;
    let page = reservation::report(r, eds);
    let n = len.min(page.len());
    data[..n].copy_from_slice(&page[..n]);
    data[n..len].fill(0);
    Reply::data(len)
}

/// An I/O command the engine did not offload.
fn other(ns: &super::NamespaceConfig, sqe: &Sqe) -> Result<Reply, Status> {
    // (Copy reaches here only where the engine runs it: see `execute`.)
    let offloadable = matches!(
        sqe.opcode(),
        op::FLUSH
            | op::WRITE
            | op::READ
            | op::COMPARE
            | op::WRITE_ZEROES
            | op::DATASET_MANAGEMENT
            | op::COPY
    );
    if !offloadable {
        return Err(Status::INVALID_OPCODE);
    }
    // Flush broadcast (NSID FFFFFFFFh) is advertised as unsupported (VWC bits 2:1 = 10b).
    if sqe.opcode() == op::FLUSH && !ns.volatile_write_cache {
        // Nothing volatile to flush.
        return Reply::ok();
    }
    // The engine runs these for attached namespaces; one reaching us means the
    // namespace is not attached yet (or is going away): the host may retry.
    Err(Status::NAMESPACE_NOT_READY)
}
