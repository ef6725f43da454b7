//! Admin commands on an enabled controller's admin queue (NVMe Base 2.0 section 5):
//! Identify, Get Log Page, Get/Set Features, Keep Alive, Asynchronous Event Request and
//! Abort. Discovery controllers accept the subset NVMe-oF 1.1 section 5 requires
//! (Identify Controller, the discovery and error logs, features 0Bh and 0Fh).

use super::{
    ana, discovery, reservation, Action, CounterSource, EventKind, Features, NamespaceConfig,
    QueueRef, Reply, Subsystem, Target, TargetOptions, ABORT_LIMIT, AER_LIMIT, ERROR_LOG_ENTRIES,
    VERSION_1_4,
};
use crate::spec::features::{self, async_event_config, capabilities, fid, sel, FeatureCommand};
use crate::spec::identify::{
    cns, copy_space_padded, csi, ctrl as idc, IdentifyController, IdentifyControllerNvm,
    IdentifyNamespace, IdentifyNamespaceIndependent, IdentifyNamespaceNvm, IoCommandSetVector,
    NamespaceList, NsIdDescriptor, IDENTIFY_DATA_SIZE,
};
use crate::spec::log::{
    data_units, effects, lid, CommandEffectsLog, FirmwareSlotLog, GetLogPage, SmartLog, LSUPP,
    SUPPORTED_LOG_PAGES_SIZE,
};
use crate::spec::{fabrics, opcodes::admin as op, opcodes::io, Sqe, Status};
use std::time::Instant;
use zerocopy::IntoBytes;

/// Broadcast namespace ID.
const NSID_ALL: u32 = 0xffff_ffff;

pub(super) fn execute(
    t: &mut Target,
    now: Instant,
    cntlid: u16,
    sqe: &Sqe,
    data: &mut [u8],
    counters: &dyn CounterSource,
) -> Result<Reply, Status> {
    let Target {
        opts,
        controllers,
        subsystems,
        listeners,
        listener_tls,
        genctr,
        started,
        referrals,
        actions,
        ptpl_version,
        ..
    } = t;
    let ctrl = controllers
        .get_mut(&cntlid)
        .ok_or(Status::COMMAND_SEQUENCE_ERROR)?;
    if sqe.opcode() == op::SET_FEATURES {
        let f = FeatureCommand::from_sqe(sqe);
        if !ctrl.is_discovery && f.fid == fid::RESERVATION_PERSISTENCE {
            let subsys = subsystems
                .get_mut(&ctrl.subnqn)
                .ok_or(Status::INTERNAL_ERROR)?;
            return set_persistence(opts, subsys, sqe, ptpl_version);
        }
    }
    let subsys = subsystems.get(&ctrl.subnqn).ok_or(Status::INTERNAL_ERROR)?;
    match sqe.opcode() {
        op::IDENTIFY => identify(opts, ctrl, subsys, sqe, data),
        op::GET_LOG_PAGE => {
            let g = GetLogPage::from_sqe(sqe);
            let page = match (ctrl.is_discovery, g.lid) {
                (d, lid::SUPPORTED_LOG_PAGES) => supported_logs(d),
                (_, lid::ERROR_INFORMATION) => error_log(ctrl),
                (true, lid::DISCOVERY) => discovery::log_page(
                    listeners,
                    listener_tls,
                    subsystems,
                    referrals,
                    *genctr,
                    &ctrl.hostnqn,
                    ctrl.origin.local,
                ),
                (false, lid::ANA) => ana_log(ctrl, subsys, g.lsp & 1 != 0),
                (false, lid::RESERVATION_NOTIFICATION) => {
                    // Each read returns the oldest page and removes it (RAE or not: RAE
                    // only keeps the event masked), once the read is answered (below): a
                    // refused read, or one from past the page's end, loses nothing.
                    let e = ctrl.resv_log.front().copied().unwrap_or_default();
                    let left = ctrl.resv_log.len().saturating_sub(1).min(255) as u8;
                    e.encode(left).to_vec()
                }
                (false, lid::SMART_HEALTH) => {
                    let hours =
                        started.map_or(0, |s| now.saturating_duration_since(s).as_secs() / 3600);
                    smart_log(ctrl, subsys, sqe.nsid, counters, hours)?
                }
                (false, lid::FIRMWARE_SLOT) => firmware_slot_log(opts),
                (false, lid::CHANGED_NS_LIST) => changed_ns_log(ctrl),
                // Per command set (CSI in CDW14). The NVM command set is the only one we
                // serve; for Key Value (01h) and Zoned (02h) the admin commands are the
                // same and no I/O command is supported. nvme-cli 2.13 asks for the zoned
                // one whenever CAP.CSS says command sets are selectable, and fails the
                // whole `nvme effects-log` when refused (nvmet, built with zoned support,
                // answers it). Reserved CSIs are Invalid Log Page.
                (false, lid::COMMANDS_EFFECTS) if g.csi == csi::NVM => effects_log(opts, true),
                (false, lid::COMMANDS_EFFECTS) if g.csi <= csi::ZONED => effects_log(opts, false),
                // NVMe Base 2.0 5.16: an unsupported or reserved LID is Invalid Log Page.
                _ => return Err(Status::INVALID_LOG_PAGE),
            };
            let reply = copy_log(&g, &page, data)?;
            // Read: only a read that returned some of the page (not one from its end).
            if g.lid == lid::RESERVATION_NOTIFICATION && g.lpo < page.len() as u64 {
                ctrl.resv_log.pop_front();
            }
            if !g.rae {
                log_read(ctrl, g.lid);
                // More reservation pages wait: tell the host again.
                if g.lid == lid::RESERVATION_NOTIFICATION && !ctrl.resv_log.is_empty() {
                    ctrl.raise(EventKind::ReservationLog, actions);
                }
            }
            Ok(reply)
        }
        op::GET_FEATURES => get_features(opts, ctrl, subsys, sqe, data),
        op::SET_FEATURES => set_features(now, opts, ctrl, subsys, sqe),
        op::KEEP_ALIVE => {
            ctrl.restart_keep_alive(now, opts);
            Reply::ok()
        }
        op::ASYNC_EVENT_REQUEST => {
            if let Some(dw0) = ctrl.pending_events.pop_front() {
                return Reply::dw0(dw0);
            }
            // The CID of one still held: the host counts that one as gone (it reset the
            // controller, which keeps held AERs, see `Controller::reset`) and sent it
            // again. Hold it once; the transport replaces its old command with the new.
            if ctrl.aers.contains(&sqe.cid()) {
                return Ok(Reply::Held);
            }
            if ctrl.aers.len() >= AER_LIMIT {
                return Err(Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED);
            }
            ctrl.aers.push_back(sqe.cid());
            Ok(Reply::Held)
        }
        op::ABORT if !ctrl.is_discovery => abort(ctrl, sqe, actions),
        _ => Err(Status::INVALID_OPCODE),
    }
}

/// The host read a log page without RAE: clear what reading clears, unmask its events
/// and forget one of its kind still waiting for an AER.
fn log_read(ctrl: &mut super::Controller, lid: u8) {
    let kind = match lid {
        lid::CHANGED_NS_LIST => {
            ctrl.changed_ns.clear();
            ctrl.changed_ns_overflow = false;
            EventKind::NamespaceAttribute
        }
        lid::DISCOVERY => EventKind::DiscoveryLog,
        lid::ANA => EventKind::AnaChange,
        lid::RESERVATION_NOTIFICATION => EventKind::ReservationLog,
        lid::SMART_HEALTH => {
            for kind in [
                EventKind::SmartReliability,
                EventKind::SmartTemperature,
                EventKind::SmartSpare,
            ] {
                unmask(ctrl, kind);
            }
            return;
        }
        _ => return,
    };
    unmask(ctrl, kind);
}

fn unmask(ctrl: &mut super::Controller, kind: EventKind) {
    ctrl.masked &= !kind.bit();
    let stale = kind.dw0();
    ctrl.pending_events.retain(|&e| e != stale);
}

/// Abort (NVMe Base 2.0 section 5.1): SQID in CDW10 bits 15:0, CID in bits 31:16. A held
/// Asynchronous Event Request is aborted here; a command of an I/O queue is the engine's
/// (it is aborted if it has not started: still queued or waiting for host data), so the
/// Abort is held until [`Target::abort_done`]. Anything else is "not aborted" (DW0 bit 0
/// set), which the spec allows for any command.
fn abort(
    ctrl: &mut super::Controller,
    sqe: &Sqe,
    actions: &mut Vec<Action>,
) -> Result<Reply, Status> {
    let sqid = sqe.cdw10 as u16;
    let cid = (sqe.cdw10 >> 16) as u16;
    if sqid == 0 {
        if let Some(i) = ctrl.aers.iter().position(|&c| c == cid) {
            ctrl.aers.remove(i);
            actions.push(Action::CompleteHeld {
                queue: QueueRef {
                    cntlid: ctrl.cntlid,
                    qid: 0,
                },
                key: ctrl.admin_key,
                cqe: crate::spec::Cqe::new(cid, Status::ABORT_REQUESTED),
            });
            return Reply::dw0(0);
        }
        return Reply::dw0(1);
    }
    let Some(&key) = ctrl.io_queues.get(&sqid) else {
        return Reply::dw0(1);
    };
    if ctrl.aborts >= ABORT_LIMIT {
        return Err(Status::ABORT_COMMAND_LIMIT_EXCEEDED);
    }
    ctrl.aborts += 1;
    actions.push(Action::Abort {
        queue: QueueRef {
            cntlid: ctrl.cntlid,
            qid: sqid,
        },
        key,
        cid,
        abort: QueueRef {
            cntlid: ctrl.cntlid,
            qid: 0,
        },
        abort_cid: sqe.cid(),
    });
    Ok(Reply::Held)
}

/// The ANA log page as this controller sees it: a descriptor for every group that holds
/// a namespace the host can see, with the state on the controller's listener.
fn ana_log(ctrl: &super::Controller, subsys: &Subsystem, rgo: bool) -> Vec<u8> {
    let mut groups: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    for (id, ns) in subsys
        .namespaces
        .iter()
        .filter(|(_, n)| n.visible_to(&ctrl.hostnqn))
    {
        groups.entry(ns.group()).or_default().push(*id);
    }
    let descs: Vec<ana::GroupDescriptor> = groups
        .into_iter()
        .map(|(grpid, nsids)| ana::GroupDescriptor {
            grpid,
            chgcnt: subsys.ana.group_chgcnt(grpid),
            state: subsys.ana.state(grpid, ctrl.origin.listener.as_ref()),
            nsids,
        })
        .collect();
    ana::log_page(subsys.ana.chgcnt(), &descs, rgo)
}

/// Set Features Reservation Persistence (83h): PTPL for one namespace, or every one with
/// NSID FFFFFFFFh. Only where the target can persist (RESCAP bit 0).
fn set_persistence(
    opts: &TargetOptions,
    subsys: &mut Subsystem,
    sqe: &Sqe,
    ptpl_version: &mut u64,
) -> Result<Reply, Status> {
    let f = FeatureCommand::from_sqe(sqe);
    if f.sv {
        return Err(Status::FEATURE_ID_NOT_SAVEABLE);
    }
    if !opts.ptpl_capable {
        return Err(Status::INVALID_FIELD);
    }
    let on = f.value & 1 != 0;
    let ids: Vec<u32> = if sqe.nsid == NSID_ALL {
        subsys.namespaces.keys().copied().collect()
    } else if subsys.namespaces.contains_key(&sqe.nsid) {
        vec![sqe.nsid]
    } else {
        return Err(Status::INVALID_NAMESPACE);
    };
    for id in ids {
        if let Some(r) = subsys.resv.get_mut(&id) {
            if r.ptpl != on {
                r.ptpl = on;
                *ptpl_version += 1;
            }
        }
    }
    Reply::ok()
}

/// Copies `page[LPO..]` into `data` for NUMD dwords, zero-filling past the page's end.
fn copy_log(g: &GetLogPage, page: &[u8], data: &mut [u8]) -> Result<Reply, Status> {
    if g.lpo & 3 != 0 || g.lpo > page.len() as u64 {
        return Err(Status::INVALID_FIELD);
    }
    if g.len_bytes() > data.len() as u64 {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    let len = g.len_bytes() as usize;
    let start = g.lpo as usize;
    let n = len.min(page.len() - start);
    data[..n].copy_from_slice(&page[start..start + n]);
    data[n..len].fill(0);
    Reply::data(len)
}

fn error_log(ctrl: &super::Controller) -> Vec<u8> {
    let mut page = vec![0u8; ERROR_LOG_ENTRIES * 64];
    for (slot, e) in page.chunks_exact_mut(64).zip(&ctrl.error_log) {
        slot.copy_from_slice(e.as_bytes());
    }
    page
}

fn smart_log(
    ctrl: &super::Controller,
    subsys: &Subsystem,
    nsid: u32,
    counters: &dyn CounterSource,
    power_on_hours: u64,
) -> Result<Vec<u8>, Status> {
    let nsids: Vec<u32> = if nsid == 0 || nsid == NSID_ALL {
        subsys.namespaces.keys().copied().collect()
    } else if subsys.namespaces.contains_key(&nsid) {
        vec![nsid]
    } else {
        return Err(Status::INVALID_NAMESPACE);
    };
    let mut sum = super::IoCounters::default();
    let mut drives = Vec::new();
    for id in nsids {
        let mut c = counters.namespace_counters(&subsys.cfg.nqn, id);
        if let Some(d) = subsys.device_health.get(&id) {
            // The drive counts its media errors itself (ours would count them twice).
            drives.push(d);
            c.media_errors = 0;
        }
        sum.read_cmds = sum.read_cmds.saturating_add(c.read_cmds);
        sum.write_cmds = sum.write_cmds.saturating_add(c.write_cmds);
        sum.read_bytes = sum.read_bytes.saturating_add(c.read_bytes);
        sum.write_bytes = sum.write_bytes.saturating_add(c.write_bytes);
        sum.media_errors = sum.media_errors.saturating_add(c.media_errors);
    }
    // No thermal sensor, spare or wear exists behind a software target: temperature is
    // reported as 0 (not available), spare as 100 %, wear as 0 %, unless a real drive
    // backs the namespace(s) (super::health).
    let mut log = SmartLog {
        available_spare: 100,
        available_spare_threshold: 10,
        data_units_read: data_units(sum.read_bytes).into(),
        data_units_written: data_units(sum.write_bytes).into(),
        host_read_commands: (sum.read_cmds as u128).into(),
        host_write_commands: (sum.write_cmds as u128).into(),
        power_on_hours: (power_on_hours as u128).into(),
        media_errors: (sum.media_errors as u128).into(),
        num_error_log_entries: (ctrl.error_count as u128).into(),
        ..Default::default()
    };
    let drive_errors: u128 = drives.iter().map(|d| d.media_errors.get()).sum();
    log.media_errors = (log.media_errors.get().saturating_add(drive_errors)).into();
    super::health::merge_drive_fields(&mut log, &drives);
    Ok(log.as_bytes().to_vec())
}

fn firmware_slot_log(opts: &TargetOptions) -> Vec<u8> {
    let mut log = FirmwareSlotLog {
        afi: 1,
        ..Default::default()
    };
    copy_space_padded(&mut log.frs[0], &opts.firmware_revision);
    log.as_bytes().to_vec()
}

fn changed_ns_log(ctrl: &super::Controller) -> Vec<u8> {
    let list = if ctrl.changed_ns_overflow {
        NamespaceList::from_ids([NSID_ALL])
    } else {
        NamespaceList::from_ids(ctrl.changed_ns.iter().copied())
    };
    list.as_bytes().to_vec()
}

/// Supported Log Pages (LID 00h, NVMe Base 2.0 Figure 203): LSUPP for each page this
/// kind of controller answers.
fn supported_logs(is_discovery: bool) -> Vec<u8> {
    let mut page = vec![0u8; SUPPORTED_LOG_PAGES_SIZE];
    let lids: &[u8] = if is_discovery {
        &[
            lid::SUPPORTED_LOG_PAGES,
            lid::ERROR_INFORMATION,
            lid::DISCOVERY,
        ]
    } else {
        &[
            lid::SUPPORTED_LOG_PAGES,
            lid::ERROR_INFORMATION,
            lid::SMART_HEALTH,
            lid::FIRMWARE_SLOT,
            lid::CHANGED_NS_LIST,
            lid::COMMANDS_EFFECTS,
            lid::ANA,
            lid::RESERVATION_NOTIFICATION,
        ]
    };
    for &l in lids {
        page[l as usize * 4..l as usize * 4 + 4].copy_from_slice(&LSUPP.to_le_bytes());
    }
    page
}

/// The Commands Supported and Effects log: admin commands, and with `nvm` the NVM
/// command set's I/O commands.
fn effects_log(opts: &TargetOptions, nvm: bool) -> Vec<u8> {
    let mut log = CommandEffectsLog::default();
    for opc in [
        op::GET_LOG_PAGE,
        op::IDENTIFY,
        op::ABORT,
        op::SET_FEATURES,
        op::GET_FEATURES,
        op::ASYNC_EVENT_REQUEST,
        op::KEEP_ALIVE,
    ] {
        log.acs[opc as usize] = effects::CSUPP.into();
    }
    for (opc, e) in [
        (io::FLUSH, effects::CSUPP),
        (io::WRITE, effects::CSUPP | effects::LBCC),
        (io::READ, effects::CSUPP),
        (io::COMPARE, effects::CSUPP),
        (io::WRITE_ZEROES, effects::CSUPP | effects::LBCC),
        (io::DATASET_MANAGEMENT, effects::CSUPP | effects::LBCC),
        (io::RESERVATION_REGISTER, effects::CSUPP),
        (io::RESERVATION_REPORT, effects::CSUPP),
        (io::RESERVATION_ACQUIRE, effects::CSUPP),
        (io::RESERVATION_RELEASE, effects::CSUPP),
        (io::COPY, effects::CSUPP | effects::LBCC),
    ] {
        if opc == io::COPY && opts.copy_max_bytes == 0 {
            continue;
        }
        let resv = matches!(
            opc,
            io::RESERVATION_REGISTER
                | io::RESERVATION_REPORT
                | io::RESERVATION_ACQUIRE
                | io::RESERVATION_RELEASE
        );
        if (resv && !opts.reservations) || !nvm {
            continue;
        }
        log.iocs[opc as usize] = e.into();
    }
    log.as_bytes().to_vec()
}

/// Identify Controller as this target presents it.
pub(super) fn identify_controller(
    opts: &TargetOptions,
    ctrl: &super::Controller,
    subsys: &Subsystem,
) -> IdentifyController {
    let mut id = IdentifyController::default();
    copy_space_padded(&mut id.sn, &subsys.cfg.serial);
    copy_space_padded(&mut id.mn, &subsys.cfg.model);
    copy_space_padded(&mut id.fr, &opts.firmware_revision);
    fabrics::copy_nul_terminated(&mut id.subnqn, &subsys.cfg.nqn);
    id.rab = 6;
    id.mdts = opts.mdts;
    id.cntlid = ctrl.cntlid.into();
    id.ver = VERSION_1_4.into();
    id.acl = 3;
    id.aerl = (AER_LIMIT - 1) as u8;
    id.elpe = (ERROR_LOG_ENTRIES - 1) as u8;
    id.npss = 0;
    id.sqes = 0x66;
    id.cqes = 0x44;
    // Keep Alive granularity in 100 ms units.
    id.kas = 1.into();
    // CTRATT bit 0: 128-bit host identifiers (the only kind fabrics have, and what
    // Get Features Host Identifier returns); nvmet sets it too.
    id.ctratt = idc::CTRATT_HOST_ID_128.into();
    // Keyed SGL data blocks exist only on RDMA; on TCP the bit would promise something
    // the transport cannot carry (nvmet sets it only for transports with keyed SGLs).
    let keyed = ctrl
        .origin
        .listener
        .as_ref()
        .is_some_and(|l| l.transport == super::Transport::Rdma);
    let mut sgls = idc::SGLS_SUPPORTED | idc::SGLS_OFFSET;
    if keyed {
        sgls |= idc::SGLS_KEYED;
    }
    id.sgls = sgls.into();
    id.icdoff = 0.into();
    id.fcatt = 0;
    id.msdbd = 1;
    // OFCS bit 0: Disconnect is supported.
    id.ofcs = 1.into();
    if ctrl.is_discovery {
        id.cntrltype = idc::CNTRLTYPE_DISCOVERY;
        id.oaes = idc::OAES_DISCOVERY_CHANGE.into();
        id.lpa = idc::LPA_EXTENDED;
        id.maxcmd = super::ADMIN_QUEUE_ENTRIES.into();
        // No I/O queues, no I/O capsules: NVMe-oF 1.1 says IOCCSZ/IORCSZ are reserved
        // (0) for discovery controllers, and nvmet leaves them 0.
        id.ioccsz = 0.into();
        id.iorcsz = 0.into();
    } else {
        id.cntrltype = idc::CNTRLTYPE_IO;
        // ANA reporting is always on (one default group, optimized everywhere), as
        // nvmet has it. The Linux host then needs MNAN in 1..=NN.
        id.cmic = idc::CMIC_MULTI_PORT | idc::CMIC_MULTI_CTRL | idc::CMIC_ANA;
        id.oaes = (idc::OAES_NS_ATTR | idc::OAES_ANA_CHANGE).into();
        id.anatt = ana::ANATT_SECONDS;
        id.anacap = idc::ANACAP_ALL_STATES | idc::ANACAP_GRPID_STATIC;
        id.anagrpmax = ana::ANAGRPMAX.into();
        id.nanagrpid = ana::ANAGRPMAX.into();
        id.mnan = opts.max_namespaces.into();
        id.frmw = idc::FRMW_SLOT1_RO_ONE_SLOT;
        id.lpa = idc::LPA_SMART_PER_NS | idc::LPA_CMD_EFFECTS | idc::LPA_EXTENDED;
        id.maxcmd = opts.max_queue_depth.into();
        id.nn = opts.max_namespaces.into();
        let mut oncs = idc::ONCS_COMPARE | idc::ONCS_DSM | idc::ONCS_WRITE_ZEROES;
        if opts.reservations {
            oncs |= idc::ONCS_RESERVATIONS;
        }
        if opts.copy_max_bytes > 0 {
            oncs |= idc::ONCS_COPY;
            id.ocfs = idc::OCFS_FORMAT0.into();
        }
        id.oncs = oncs.into();
        if opts.fused_compare_write {
            id.fuses = idc::FUSES_COMPARE_AND_WRITE.into();
        }
        id.vwc = idc::VWC_FLUSH_BROADCAST_UNSUPPORTED;
        if subsys.has_volatile_cache() {
            id.vwc |= idc::VWC_PRESENT;
        }
        id.ioccsz = ((64 + opts.ioccsz_bytes) / 16).into();
        id.iorcsz = 1.into();
    }
    id
}

/// RESCAP: every reservation type, IEKEY as NVMe 1.3+ defines it, and PTPL where the
/// target can persist reservations.
fn rescap(opts: &TargetOptions) -> u8 {
    use crate::spec::identify::rescap as rc;
    if !opts.reservations {
        return 0;
    }
    let mut r = rc::ALL_TYPES | rc::IEKEY_13;
    if opts.ptpl_capable {
        r |= rc::PTPL;
    }
    r
}

fn identify_namespace(
    opts: &TargetOptions,
    ns: &NamespaceConfig,
    state: ana::AnaState,
) -> IdentifyNamespace {
    // A namespace this path cannot reach reports no utilization (SPDK does the same).
    let nuse = match state {
        ana::AnaState::Inaccessible | ana::AnaState::PersistentLoss => 0,
        _ => ns.num_blocks,
    };
    let mut id = IdentifyNamespace {
        nsze: ns.num_blocks.into(),
        ncap: ns.num_blocks.into(),
        nuse: nuse.into(),
        nlbaf: 0,
        flbas: 0,
        nmic: 1,
        rescap: rescap(opts),
        anagrpid: ns.group().into(),
        nguid: ns.nguid,
        eui64: ns.eui64,
        ..Default::default()
    };
    id.lbaf[0].lbads = ns.block_size.trailing_zeros() as u8;
    if opts.copy_max_bytes > 0 {
        let l = crate::copy::CopyLimits::for_buffer(
            opts.copy_max_bytes,
            ns.block_size.trailing_zeros(),
        );
        id.mssrl = (l.max_range.min(u16::MAX as u32) as u16).into();
        id.mcl = l.max_total.into();
        id.msrc = (l.max_ranges - 1) as u8;
    }
    id
}

/// The namespace `nsid` names, `None` if it is a valid but inactive ID (for this host:
/// a namespace it may not see is inactive to it).
fn namespace<'a>(
    opts: &TargetOptions,
    subsys: &'a Subsystem,
    hostnqn: &str,
    nsid: u32,
) -> Result<Option<&'a NamespaceConfig>, Status> {
    if nsid == 0 || nsid > opts.max_namespaces {
        return Err(Status::INVALID_NAMESPACE);
    }
    Ok(subsys
        .namespaces
        .get(&nsid)
        .filter(|n| n.visible_to(hostnqn)))
}

fn identify(
    opts: &TargetOptions,
    ctrl: &super::Controller,
    subsys: &Subsystem,
    sqe: &Sqe,
    data: &mut [u8],
) -> Result<Reply, Status> {
    let cns = sqe.cdw10 as u8;
    let cs = (sqe.cdw11 >> 24) as u8;
    if data.len() < IDENTIFY_DATA_SIZE {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    if ctrl.is_discovery && cns != cns::CONTROLLER {
        return Err(Status::INVALID_FIELD);
    }
    let nsid = sqe.nsid;
    let zeros = || vec![0u8; IDENTIFY_DATA_SIZE];
    let active_list = || {
        if nsid >= 0xffff_fffe {
            return Err(Status::INVALID_NAMESPACE);
        }
        let ids = subsys
            .namespaces
            .range(nsid.saturating_add(1)..)
            .filter(|(_, n)| n.visible_to(&ctrl.hostnqn))
            .map(|(&id, _)| id);
        Ok(NamespaceList::from_ids(ids).as_bytes().to_vec())
    };
    let page = match cns {
        cns::CONTROLLER => identify_controller(opts, ctrl, subsys).as_bytes().to_vec(),
        cns::NAMESPACE => match namespace(opts, subsys, &ctrl.hostnqn, nsid)? {
            Some(ns) => {
                let state = subsys.ana.state(ns.group(), ctrl.origin.listener.as_ref());
                identify_namespace(opts, ns, state).as_bytes().to_vec()
            }
            None => zeros(),
        },
        cns::ACTIVE_NS_LIST => active_list()?,
        cns::CS_ACTIVE_NS_LIST if cs == csi::NVM => active_list()?,
        cns::NS_ID_DESCRIPTORS => {
            let ns =
                namespace(opts, subsys, &ctrl.hostnqn, nsid)?.ok_or(Status::INVALID_NAMESPACE)?;
            let mut list = Vec::new();
            if ns.eui64 != [0; 8] {
                list.push(NsIdDescriptor::Eui64(ns.eui64));
            }
            if ns.nguid != [0; 16] {
                list.push(NsIdDescriptor::Nguid(ns.nguid));
            }
            if ns.uuid != [0; 16] {
                list.push(NsIdDescriptor::Uuid(ns.uuid));
            }
            list.push(NsIdDescriptor::Csi(csi::NVM));
            NsIdDescriptor::encode_list(&list)
        }
        cns::CS_NAMESPACE if cs == csi::NVM => {
            match namespace(opts, subsys, &ctrl.hostnqn, nsid)? {
                Some(_) => IdentifyNamespaceNvm::default().as_bytes().to_vec(),
                None => zeros(),
            }
        }
        cns::CS_CONTROLLER if cs == csi::NVM => {
            IdentifyControllerNvm::default().as_bytes().to_vec()
        }
        cns::IO_COMMAND_SET => {
            // CNTID (CDW10 31:16) names the controller asked about: this one, FFFFh
            // (SPDK's target accepts these two) or 0, which hosts that do not fill the
            // field send (no dynamic controller has ID 0, so it cannot mean another).
            let cntid = (sqe.cdw10 >> 16) as u16;
            if cntid != 0xffff && cntid != 0 && cntid != ctrl.cntlid {
                return Err(Status::INVALID_FIELD);
            }
            IoCommandSetVector::nvm_only().as_bytes().to_vec()
        }
        cns::CS_INDEPENDENT_NAMESPACE => match namespace(opts, subsys, &ctrl.hostnqn, nsid)? {
            Some(ns) => {
                let id = IdentifyNamespaceIndependent {
                    nmic: 1,
                    nstat: 1,
                    rescap: rescap(opts),
                    anagrpid: ns.group().into(),
                    ..Default::default()
                };
                id.as_bytes().to_vec()
            }
            None => zeros(),
        },
        _ => return Err(Status::INVALID_FIELD),
    };
    data[..IDENTIFY_DATA_SIZE].copy_from_slice(&page);
    Reply::data(IDENTIFY_DATA_SIZE)
}

/// Features a controller of this kind supports. Interrupt Coalescing and Interrupt Vector
/// Configuration are not among them: NVMe Base 2.1 prohibits both on fabrics controllers
/// (nvmet answers them Invalid Field too).
fn feature_supported(is_discovery: bool, f: u8) -> bool {
    if is_discovery {
        return matches!(f, fid::ASYNC_EVENT_CONFIG | fid::KEEP_ALIVE_TIMER);
    }
    matches!(
        f,
        fid::ARBITRATION
            | fid::POWER_MANAGEMENT
            | fid::TEMPERATURE_THRESHOLD
            | fid::ERROR_RECOVERY
            | fid::VOLATILE_WRITE_CACHE
            | fid::NUMBER_OF_QUEUES
            | fid::WRITE_ATOMICITY
            | fid::ASYNC_EVENT_CONFIG
            | fid::KEEP_ALIVE_TIMER
            | fid::HOST_IDENTIFIER
            | fid::RESERVATION_NOTIFICATION_MASK
            | fid::RESERVATION_PERSISTENCE
    )
}

/// Features whose value is kept per namespace (NVMe Base 2.0 Figure 317, scope
/// "Namespace"): Error Recovery (its DULBE bit is a namespace property) and the two
/// reservation features.
fn namespace_scoped(f: u8) -> bool {
    matches!(
        f,
        fid::ERROR_RECOVERY | fid::RESERVATION_NOTIFICATION_MASK | fid::RESERVATION_PERSISTENCE
    )
}

/// The NSID rules of Get/Set Features (NVMe Base 2.0 sections 5.15, 5.27): an NSID that
/// cannot name a namespace is Invalid Namespace; Set Features of a controller-scoped
/// feature naming one namespace is Feature Not Namespace Specific (0h and FFFFFFFFh mean
/// "the controller"). Get Features of a controller-scoped feature ignores the NSID, as
/// nvmet and SPDK do: nvme-cli sends the namespace's NSID when pointed at a namespace
/// block device. Write Atomicity Normal is accepted with any NSID and applies to the
/// controller (SPDK does not treat it as controller-scoped either).
fn check_feature_nsid(opts: &TargetOptions, f: u8, nsid: u32, set: bool) -> Result<(), Status> {
    if nsid != NSID_ALL && nsid > opts.max_namespaces {
        return Err(Status::INVALID_NAMESPACE);
    }
    let one_namespace = nsid != 0 && nsid != NSID_ALL;
    if set && one_namespace && !namespace_scoped(f) && f != fid::WRITE_ATOMICITY {
        return Err(Status::FEATURE_NOT_NAMESPACE_SPECIFIC);
    }
    Ok(())
}

/// Asynchronous Event Configuration bits a controller of this kind implements.
fn async_events_supported(is_discovery: bool) -> u32 {
    if is_discovery {
        async_event_config::DISCOVERY_LOG_CHANGE_NOTICES
    } else {
        async_event_config::NS_ATTRIBUTE_NOTICES
            | async_event_config::ANA_CHANGE_NOTICES
            | super::health::CRITICAL_WARNING_BITS
    }
}

/// Temperature Threshold: TMPSEL (19:16) must name the composite sensor; THSEL (21:20)
/// picks over (0) or under (1). Returns whether it is the under threshold.
fn temperature_select(cdw11: u32) -> Result<bool, Status> {
    match ((cdw11 >> 16) & 0xf, (cdw11 >> 20) & 3) {
        (0, 0) => Ok(false),
        (0, 1) => Ok(true),
        _ => Err(Status::INVALID_FIELD),
    }
}

fn get_features(
    opts: &TargetOptions,
    ctrl: &super::Controller,
    subsys: &Subsystem,
    sqe: &Sqe,
    data: &mut [u8],
) -> Result<Reply, Status> {
    let f = FeatureCommand::from_sqe(sqe);
    if !feature_supported(ctrl.is_discovery, f.fid) {
        return Err(Status::INVALID_FIELD);
    }
    check_feature_nsid(opts, f.fid, sqe.nsid, false)?;
    if f.fid == fid::VOLATILE_WRITE_CACHE && !subsys.has_volatile_cache() {
        return Err(Status::INVALID_FIELD);
    }
    let one_namespace = sqe.nsid != 0 && sqe.nsid != NSID_ALL;
    if namespace_scoped(f.fid) && one_namespace && !subsys.namespaces.contains_key(&sqe.nsid) {
        return Err(Status::INVALID_NAMESPACE);
    }
    let defaults;
    let feats = match f.sel {
        sel::CURRENT => &ctrl.features,
        // Nothing is saveable, so the saved value is the default.
        sel::DEFAULT | sel::SAVED => {
            defaults = Features::defaults(opts.max_io_queues);
            &defaults
        }
        sel::SUPPORTED_CAPABILITIES => {
            let caps = match f.fid {
                // The cache can only be left on (see `set_features`).
                fid::HOST_IDENTIFIER | fid::VOLATILE_WRITE_CACHE => 0,
                f if namespace_scoped(f) => {
                    capabilities::CHANGEABLE | capabilities::NAMESPACE_SPECIFIC
                }
                _ => capabilities::CHANGEABLE,
            };
            return Reply::dw0(caps);
        }
        _ => return Err(Status::INVALID_FIELD),
    };
    let current = f.sel == sel::CURRENT;
    let value = match f.fid {
        fid::ARBITRATION => feats.arbitration,
        fid::POWER_MANAGEMENT => feats.power_management,
        fid::TEMPERATURE_THRESHOLD => {
            if temperature_select(f.value)? {
                feats.temperature_under as u32
            } else {
                feats.temperature_over as u32
            }
        }
        fid::ERROR_RECOVERY if current && one_namespace => ctrl
            .ns_error_recovery
            .get(&sqe.nsid)
            .copied()
            .unwrap_or(feats.error_recovery),
        fid::ERROR_RECOVERY => feats.error_recovery,
        fid::VOLATILE_WRITE_CACHE => feats.volatile_write_cache as u32,
        fid::NUMBER_OF_QUEUES => {
            let n = feats.io_queues.saturating_sub(1);
            features::number_of_queues(n, n)
        }
        fid::WRITE_ATOMICITY => feats.write_atomicity,
        fid::ASYNC_EVENT_CONFIG => feats.async_event_config,
        // Per namespace: Get Features names one (Invalid Namespace for FFFFFFFFh, as SPDK).
        fid::RESERVATION_NOTIFICATION_MASK | fid::RESERVATION_PERSISTENCE => {
            if !one_namespace || !subsys.namespaces.contains_key(&sqe.nsid) {
                return Err(Status::INVALID_NAMESPACE);
            }
            if f.fid == fid::RESERVATION_PERSISTENCE {
                if !current {
                    return Reply::dw0(0);
                }
                subsys.resv.get(&sqe.nsid).map_or(0, |r| r.ptpl as u32)
            } else if current {
                ctrl.resv_masks
                    .get(&sqe.nsid)
                    .copied()
                    .unwrap_or(ctrl.resv_mask_default)
            } else {
                0
            }
        }
        // A discovery controller's is the default it runs with when the host set 0.
        fid::KEEP_ALIVE_TIMER => {
            if current {
                ctrl.effective_kato_ms(opts)
            } else {
                0
            }
        }
        fid::HOST_IDENTIFIER => {
            // Only the 128-bit form (EXHID) exists on fabrics.
            if f.value & 1 == 0 {
                return Err(Status::INVALID_FIELD);
            }
            if data.len() < 16 {
                return Err(Status::DATA_SGL_LENGTH_INVALID);
            }
            data[..16].copy_from_slice(&ctrl.hostid);
            return Reply::data(16);
        }
        _ => return Err(Status::INVALID_FIELD),
    };
    Reply::dw0(value)
}

fn set_features(
    now: Instant,
    opts: &TargetOptions,
    ctrl: &mut super::Controller,
    subsys: &Subsystem,
    sqe: &Sqe,
) -> Result<Reply, Status> {
    let f = FeatureCommand::from_sqe(sqe);
    if !feature_supported(ctrl.is_discovery, f.fid) {
        return Err(Status::INVALID_FIELD);
    }
    if f.sv {
        return Err(Status::FEATURE_ID_NOT_SAVEABLE);
    }
    check_feature_nsid(opts, f.fid, sqe.nsid, true)?;
    let one_namespace = sqe.nsid != 0 && sqe.nsid != NSID_ALL;
    if namespace_scoped(f.fid) && one_namespace && !subsys.namespaces.contains_key(&sqe.nsid) {
        return Err(Status::INVALID_NAMESPACE);
    }
    let v = f.value;
    let feats = &mut ctrl.features;
    match f.fid {
        fid::ARBITRATION => feats.arbitration = v,
        fid::POWER_MANAGEMENT => {
            // Power state 0 is the only one (NPSS = 0).
            if v & 0x1f != 0 {
                return Err(Status::INVALID_FIELD);
            }
            feats.power_management = v & 0xff;
        }
        fid::TEMPERATURE_THRESHOLD => {
            if temperature_select(v)? {
                feats.temperature_under = v as u16;
            } else {
                feats.temperature_over = v as u16;
            }
        }
        fid::ERROR_RECOVERY => {
            // DULBE (bit 16) needs deallocated-block errors, which are not reported.
            if v & (1 << 16) != 0 {
                return Err(Status::INVALID_FIELD);
            }
            if one_namespace {
                ctrl.ns_error_recovery.insert(sqe.nsid, v & 0xffff);
            } else {
                // 0h or FFFFFFFFh: every namespace.
                feats.error_recovery = v & 0xffff;
                ctrl.ns_error_recovery.clear();
            }
        }
        fid::VOLATILE_WRITE_CACHE => {
            if !subsys.has_volatile_cache() {
                return Err(Status::INVALID_FIELD);
            }
            // Turning the cache off would promise durable writes, which the backends
            // are not told to provide.
            if v & 1 == 0 {
                return Err(Status::FEATURE_NOT_CHANGEABLE);
            }
            feats.volatile_write_cache = true;
        }
        fid::NUMBER_OF_QUEUES => {
            let (nsqr, ncqr) = (v as u16, (v >> 16) as u16);
            if nsqr == 0xffff || ncqr == 0xffff {
                return Err(Status::INVALID_FIELD);
            }
            if !ctrl.io_queues.is_empty() {
                return Err(Status::COMMAND_SEQUENCE_ERROR);
            }
            let granted = (nsqr.min(ncqr) + 1).min(opts.max_io_queues);
            feats.io_queues = granted;
            let n = granted.saturating_sub(1);
            return Reply::dw0(features::number_of_queues(n, n));
        }
        fid::WRITE_ATOMICITY => feats.write_atomicity = v & 1,
        fid::ASYNC_EVENT_CONFIG => {
            feats.async_event_config = v & async_events_supported(ctrl.is_discovery)
        }
        fid::RESERVATION_NOTIFICATION_MASK => {
            if v & !reservation::NOTIFICATION_MASK_ALL != 0 {
                return Err(Status::INVALID_FIELD);
            }
            if one_namespace {
                ctrl.resv_masks.insert(sqe.nsid, v);
            } else {
                ctrl.resv_mask_default = v;
                ctrl.resv_masks.clear();
            }
        }
        fid::KEEP_ALIVE_TIMER => {
            ctrl.kato_ms = super::kato_granular(v);
            ctrl.restart_keep_alive(now, opts);
        }
        // The host identifier comes with Connect on fabrics.
        fid::HOST_IDENTIFIER => return Err(Status::COMMAND_SEQUENCE_ERROR),
        _ => return Err(Status::INVALID_FIELD),
    }
    Reply::ok()
}
