//! What STA does between calls: context start/stop, tasks, and the data path run from
//! `doca_pe_progress` (the DPA's work, done on the host CPU here).
//!
//! Capsule path (per IO context, for each QP):
//! 1. A RECV completes: the SQE and any in-capsule data are copied into a command slot and
//!    the receive is reposted. A Fabrics Connect tells the double the queue id.
//! 2. Offloaded when the QP is bound to a subsystem and its SQ size is set (the Connect
//!    was answered), the opcode is Read, Write or Flush, and the NSID names a namespace of
//!    that subsystem that is not being removed. The double validates the capsule (SGL type,
//!    SGL length against NLB x block size, transfer size); a bad one is answered with the
//!    NVMe status and reported as a CQE-notify validation event.
//! 3. Write: RDMA READ of the host's keyed SGL into a data buffer (or the in-capsule data
//!    is copied). Then an NVMe command (the host's CDW10-15, the backend NSID, PRPs of
//!    the buffer's physical address from the application's allocator, a CID of the backend
//!    queue) is written into the SQ ring of a backend queue of the namespace's backend,
//!    and the SQ tail doorbell is written through the doorbell mmap.
//! 4. The backend queue's CQ is polled (phase tag); the CQ head doorbell is written after
//!    each batch. Read: RDMA WRITE of the data to the host, then SEND of the completion
//!    (with Invalidate when the SGL asked for it). A failed NVMe command is answered with
//!    its status and reported as a CQE-notify completion-error event.
//! 5. Everything else goes to the non-offload callback with the SQE, a payload buffer
//!    (its length: the keyed SGL length, or the in-capsule data received) and whether
//!    the host's data is already in it.
//!
//! The double writes SQHD into every completion it sends (also the application's): only
//! the engine knows how many capsules it took from the queue, offloaded ones included.
//!
//! Why one file of ~1400 lines: it is one state machine (a capsule from RECV to the
//! backend ring, its completion back to the host, and the tasks and events that cut into
//! it); split by step, every step would need the others' private state.

use std::time::Instant;

use doca_sys::*;
use nvmf::rdma::KeyedSgl;
use nvmf::spec::{opcodes, sgl, SglDescriptor, Status};

use crate::contract::{self, broken, code, Broken, Res};
use crate::link::{Op, Wc, WcKind, NO_SLOT};
use crate::mem;
use crate::stats;
use crate::world::*;

/// Caps the double reports (doca_sta_get_max_*).
pub mod caps {
    pub const MAX_DEVS: u32 = 8;
    pub const MAX_SUBSYS: u32 = 64;
    pub const MAX_NS_PER_SUBS: u32 = 64;
    pub const MAX_QPS: u32 = 1024;
    pub const MAX_IO_THREADS: u32 = 64;
    pub const MAX_IO_SIZE: u32 = 128 * 1024;
    pub const MAX_IO_NUM_PER_DEV: u32 = 1024;
    pub const MAX_IO_QUEUE_SIZE: u32 = 128;
    /// Capsule sizes in bytes: a 64-byte SQE plus up to 8 KiB of in-capsule data.
    pub const MIN_IOCCSZ: u32 = 64;
    pub const MAX_IOCCSZ: u32 = 64 + 8192;
    pub const MIN_IORCSZ: u32 = 16;
    pub const MAX_IORCSZ: u32 = 16;
    pub const MAX_ICDOFF: u32 = 0;
    pub const MAX_BE: u32 = 64;
    pub const MAX_QS_PER_BE: u32 = 8;
    pub const MAX_QP_PER_EU: u32 = 256;
    pub const BLOCK_SIZES: [u32; 2] = [512, 4096];
}

pub fn token(qp: u64, slot: u16, gen: u16) -> u64 {
    qp << 32 | (slot as u64) << 16 | gen as u64
}

pub fn untoken(t: u64) -> (u64, u16, u16) {
    (t >> 32, (t >> 16) as u16, t as u16)
}

pub fn check_owner(w: &mut World, io: u64) -> Result<(), Broken> {
    let me = std::thread::current().id();
    let Some(i) = w.ios.get_mut(&io) else {
        return Ok(());
    };
    match i.owner {
        None => {
            if i.ctx.running() {
                i.owner = Some(me);
            }
            Ok(())
        }
        Some(t) if t == me => Ok(()),
        Some(t) => Err(Broken::new(
            &contract::IO_THREAD,
            format!("IO context #{io} belongs to thread {t:?}, used from {me:?}"),
        )),
    }
}

pub fn inflight(w: &World, c: CtxRef) -> usize {
    match c {
        CtxRef::Sta(s) => w.stas.get(&s).map_or(0, |s| s.tasks.len()),
        CtxRef::Io(i) => w.ios.get(&i).map_or(0, |i| i.tasks as usize),
    }
}

// --- contexts ---------------------------------------------------------------------------

pub fn ctx_start(w: &mut World, c: CtxRef) -> Res<()> {
    let x = w.ctx(c);
    if !x.idle() {
        return broken(
            &contract::CTX_STATE,
            "doca_ctx_start on a context that is not idle",
        );
    }
    if x.pe.is_none() {
        return code(DOCA_ERROR_NOT_CONNECTED);
    }
    match c {
        CtxRef::Sta(id) => {
            let s = &w.stas[&id];
            let mut missing = Vec::new();
            if s.net_devs.is_empty() {
                missing.push("a network device (doca_sta_add_dev)");
            }
            if s.alloc.is_none() {
                missing.push("the memory allocator (doca_sta_mem_allocator_register)");
            }
            if s.max_io == 0 {
                missing.push("the IO context count (doca_sta_set_max_sta_io)");
            }
            if !missing.is_empty() {
                return broken(
                    &contract::START_READY,
                    format!("main context started without {}", missing.join(", ")),
                );
            }
            w.set_ctx_state(c, DOCA_CTX_STATE_STARTING);
            code(DOCA_ERROR_IN_PROGRESS)
        }
        CtxRef::Io(id) => {
            let i = &w.ios[&id];
            if !w.stas.get(&i.sta).is_some_and(|s| s.ctx.running()) {
                return broken(
                    &contract::MAIN_RUNNING,
                    "IO context started while the main context is not running",
                );
            }
            let mut missing = Vec::new();
            if i.non_offload.is_none() {
                missing.push("doca_sta_io_non_offload_register_cb");
            }
            if i.disc_conf.is_none() {
                missing.push("doca_sta_io_task_disconnect_set_conf");
            }
            if i.rd_conf.is_none() {
                missing.push("doca_sta_io_task_non_offload_set_rdma_read_conf");
            }
            if i.ws_conf.is_none() {
                missing.push("doca_sta_io_task_non_offload_set_rdma_write_send_conf");
            }
            if !missing.is_empty() {
                return broken(
                    &contract::START_READY,
                    format!("IO context started without {}", missing.join(", ")),
                );
            }
            w.set_ctx_state(c, DOCA_CTX_STATE_RUNNING);
            Ok(())
        }
    }
}

pub fn ctx_stop(w: &mut World, c: CtxRef) -> Res<()> {
    if w.ctx(c).idle() {
        return broken(&contract::CTX_STATE, "doca_ctx_stop on an idle context");
    }
    match c {
        CtxRef::Sta(id) => {
            let s = &w.stas[&id];
            if let Some(i) = s
                .ios
                .iter()
                .find(|i| w.ios.get(i).is_some_and(|i| !i.ctx.idle()))
            {
                return broken(
                    &contract::TEARDOWN,
                    format!("main context stopped while IO context #{i} is not stopped"),
                );
            }
            if s.tasks.is_empty() {
                w.set_ctx_state(c, DOCA_CTX_STATE_IDLE);
                Ok(())
            } else {
                w.set_ctx_state(c, DOCA_CTX_STATE_STOPPING);
                code(DOCA_ERROR_IN_PROGRESS)
            }
        }
        CtxRef::Io(id) => {
            let i = w.ios.get_mut(&id).expect("live");
            if !i.qps.is_empty() {
                return broken(
                    &contract::TEARDOWN,
                    format!("IO context stopped with {} QP(s) not destroyed (doca_sta_io_qp_destroy first)", i.qps.len()),
                );
            }
            i.owner = None;
            if i.tasks == 0 {
                w.set_ctx_state(c, DOCA_CTX_STATE_IDLE);
                Ok(())
            } else {
                w.set_ctx_state(c, DOCA_CTX_STATE_STOPPING);
                code(DOCA_ERROR_IN_PROGRESS)
            }
        }
    }
}

/// One pass of a context's work; true if anything happened.
pub fn step(w: &mut World, c: CtxRef) -> bool {
    match c {
        CtxRef::Sta(id) => step_sta(w, id),
        CtxRef::Io(id) => step_io(w, id),
    }
}

// --- tasks ------------------------------------------------------------------------------

pub fn submit(w: &mut World, id: u64) -> Res<()> {
    let t = &w.tasks[&id];
    let (kind, owner, qp, tok) = (t.kind, t.owner, t.qp, t.token);
    if !w.ctx(owner).running() {
        return broken(
            &contract::CTX_STATE,
            "a task is submitted while its context is not running",
        );
    }
    if let CtxRef::Io(io) = owner {
        check_owner(w, io)?;
    }
    match kind {
        TaskKind::RmNs => {
            let ns = w.tasks[&id].ns;
            let Some(n) = w.nss.get_mut(&ns) else {
                return broken(
                    &contract::NS_STATE,
                    "the namespace of this task was removed already",
                );
            };
            if n.removing {
                return broken(
                    &contract::NS_STATE,
                    format!("namespace {} is already being removed", n.fe),
                );
            }
            n.removing = true;
            n.by_task = true;
        }
        TaskKind::BeqDestroy => {
            let q = w.tasks[&id].beq;
            let Some(b) = w.beqs.get_mut(&q) else {
                return broken(
                    &contract::BE_QUEUE_STATE,
                    "the backend queue of this task is gone",
                );
            };
            if b.destroying {
                return broken(&contract::BE_QUEUE_STATE, "backend queue destroyed twice");
            }
            b.destroying = true;
            abort_beq(w, q);
            wake_owners(w, None);
        }
        TaskKind::Disconnect => {
            let q = w
                .qps
                .get_mut(&qp)
                .ok_or_else(|| Broken::new(&contract::DESTROYED, "QP destroyed"))?;
            if !matches!(q.st, QpSt::Accepted | QpSt::Established) {
                return broken(
                    &contract::QP_STATE,
                    format!("disconnect of a QP in state {:?}", q.st),
                );
            }
            q.st = QpSt::Disconnecting;
            q.disc_task = Some(id);
            if let Some(l) = q.link.as_mut() {
                l.disconnect(&mut w.loops);
            }
        }
        TaskKind::RdmaRead | TaskKind::RdmaWriteSend | TaskKind::RdmaSend => {
            let (qid, slot, gen) = untoken(tok);
            check_cmd(w, qid, slot, gen, qp)?;
        }
    }
    let t = w.tasks.get_mut(&id).expect("live");
    t.st = TaskSt::Submitted;
    t.status = DOCA_SUCCESS;
    match owner {
        CtxRef::Sta(s) => w.stas.get_mut(&s).expect("live").tasks.push(id),
        CtxRef::Io(i) => w.ios.get_mut(&i).expect("live").tasks += 1,
    }
    if matches!(
        kind,
        TaskKind::RdmaRead | TaskKind::RdmaWriteSend | TaskKind::RdmaSend
    ) {
        start_response(w, id);
    }
    Ok(())
}

/// The command a response task names must be one the callback handed up on `qp`.
pub fn check_cmd(w: &World, qid: u64, slot: u16, gen: u16, qp: u64) -> Res<()> {
    if qid != qp {
        return broken(
            &contract::COMMAND,
            "non_offload_user_data names a command of another QP",
        );
    }
    let Some(q) = w.qps.get(&qid) else {
        return broken(
            &contract::COMMAND,
            "non_offload_user_data names a command of a destroyed QP",
        );
    };
    match q.cmds.get(slot as usize) {
        Some(c) if c.gen == gen && c.st == CmdSt::App && c.kind == CmdKind::NonOffload => Ok(()),
        Some(c) if c.gen == gen && matches!(c.st, CmdSt::AppReading | CmdSt::AppSending) => broken(
            &contract::COMMAND,
            "a task for this command is already in flight",
        ),
        _ => broken(
            &contract::COMMAND,
            "non_offload_user_data names no command waiting for an answer (answered already?)",
        ),
    }
}

fn start_response(w: &mut World, id: u64) {
    let t = &w.tasks[&id];
    let (kind, qpid, tok, mut cqe) = (t.kind, t.qp, t.token, t.cqe);
    let (_, slot, _) = untoken(tok);
    let Some(q) = w.qps.get_mut(&qpid) else {
        return;
    };
    if !matches!(q.st, QpSt::Accepted | QpSt::Established) || q.link.is_none() {
        // The QP is going away: the application drains its commands itself (5.11).
        let c = &mut q.cmds[slot as usize];
        if kind != TaskKind::RdmaRead {
            c.st = CmdSt::AppSending;
        }
        c.task = Some(id);
        w.finish_task(id, DOCA_ERROR_NOT_CONNECTED);
        if kind != TaskKind::RdmaRead {
            free_cmd(w, qpid, slot);
        }
        return;
    }
    let sqhd = q.sqhd;
    let io = q.io;
    let dev = q.link.as_ref().and_then(|l| l.dev());
    let c = &mut q.cmds[slot as usize];
    c.task = Some(id);
    let keyed = c.keyed;
    let len = c.len;
    cqe[8..10].copy_from_slice(&sqhd.to_le_bytes());
    match kind {
        TaskKind::RdmaRead => {
            c.st = CmdSt::AppReading;
            let k = keyed.expect("checked at alloc");
            let Some((laddr, lkey)) = buf_key(w, io, qpid, slot, dev) else {
                w.finish_task(id, DOCA_ERROR_NO_MEMORY);
                if let Some(c) = w.qps.get_mut(&qpid).map(|q| &mut q.cmds[slot as usize]) {
                    c.st = CmdSt::App;
                    c.task = None;
                }
                return;
            };
            post(
                w,
                qpid,
                Op::Read {
                    slot,
                    laddr,
                    lkey,
                    len,
                    raddr: k.addr,
                    rkey: k.key,
                },
            );
            bump_tx(w, io, stats::tx::READS);
        }
        TaskKind::RdmaWriteSend | TaskKind::RdmaSend => {
            c.st = CmdSt::AppSending;
            if kind == TaskKind::RdmaWriteSend {
                let k = keyed.expect("checked at alloc");
                if let Some((laddr, lkey)) = buf_key(w, io, qpid, slot, dev) {
                    post(
                        w,
                        qpid,
                        Op::Write {
                            slot,
                            laddr,
                            lkey,
                            len,
                            raddr: k.addr,
                            rkey: k.key,
                        },
                    );
                    bump_tx(w, io, stats::tx::WRITES);
                }
            }
            let inv = keyed.filter(|k| k.invalidate).map(|k| k.key);
            post(w, qpid, Op::Send { slot, cqe, inv });
            bump_tx(w, io, stats::tx::SENDS);
        }
        _ => {}
    }
}

fn bump_tx(w: &mut World, io: u64, i: usize) {
    if let Some(e) = w.ios.get(&io).map(|i| i.eu_tx) {
        if let Some(e) = w.eus.get_mut(&e) {
            e.stats.add(i, 1);
        }
    }
}

fn bump_comp(w: &mut World, io: u64, i: usize) {
    if let Some(e) = w.ios.get(&io).map(|i| i.eu_comp) {
        if let Some(e) = w.eus.get_mut(&e) {
            e.stats.add(i, 1);
        }
    }
}

fn post(w: &mut World, qp: u64, op: Op) {
    if let Some(l) = w.qps.get_mut(&qp).and_then(|q| q.link.as_mut()) {
        l.post(op);
    }
}

/// Address and local key of a command's buffer.
fn buf_key(w: &mut World, io: u64, qp: u64, slot: u16, dev: Option<usize>) -> Option<(u64, u32)> {
    let World { qps, ios, .. } = w;
    let b = qps.get_mut(&qp)?.cmds[slot as usize].buf.as_mut()?;
    let lkey = match dev {
        Some(d) => {
            let lib = sta::verbs::lib().ok()?;
            ios.get_mut(&io)?.verbs.lkey(lib, d, b)?
        }
        None => 0,
    };
    Some((b.va as u64, lkey))
}

// --- command slots ----------------------------------------------------------------------

fn size_class(len: usize) -> usize {
    len.max(mem::PAGE).next_power_of_two()
}

/// A buffer of at least `len` bytes for a command of IO context `io`.
fn get_buf(w: &mut World, io: u64, len: usize) -> Res<Buf> {
    let cap = size_class(len);
    let i = w.ios.get_mut(&io).expect("live");
    if let Some(p) = i.bufs.iter().position(|b| b.cap == cap) {
        return Ok(i.bufs.swap_remove(p));
    }
    let sta = i.sta;
    let alloc = w.stas[&sta].alloc.expect("checked at start");
    let b = mem::alloc_buf(&alloc, &mut w.mem, cap)?;
    w.ios.get_mut(&io).expect("live").bufs_total += 1;
    Ok(b)
}

/// Free a command slot; its buffer goes back to the IO context's pool.
pub fn free_cmd(w: &mut World, qp: u64, slot: u16) {
    let Some(q) = w.qps.get_mut(&qp) else { return };
    let io = q.io;
    let c = &mut q.cmds[slot as usize];
    if c.st == CmdSt::Free {
        return;
    }
    c.st = CmdSt::Free;
    c.gen = c.gen.wrapping_add(1);
    c.task = None;
    c.keyed = None;
    let b = c.buf.take();
    q.free_cmds.push(slot);
    if let (Some(b), Some(i)) = (b, w.ios.get_mut(&io)) {
        i.bufs.push(b);
    }
}

fn alloc_slot(q: &mut Qp) -> Option<u16> {
    if let Some(s) = q.free_cmds.pop() {
        return Some(s);
    }
    if q.cmds.len() < q.depth as usize * 2 {
        q.cmds.push(Cmd::new());
        return Some(q.cmds.len() as u16 - 1);
    }
    None
}

fn completion(cid: u16, sqhd: u16, sqid: u16, status: Status, dw0: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0..4].copy_from_slice(&dw0.to_le_bytes());
    c[8..10].copy_from_slice(&sqhd.to_le_bytes());
    c[10..12].copy_from_slice(&sqid.to_le_bytes());
    c[12..14].copy_from_slice(&cid.to_le_bytes());
    c[14..16].copy_from_slice(&status.to_field().to_le_bytes());
    c
}

/// Answer an offloaded command with `status` (data first when `data_len` > 0).
fn respond(w: &mut World, qp: u64, slot: u16, status: Status, data_len: u32) {
    let Some(q) = w.qps.get_mut(&qp) else { return };
    let io = q.io;
    let (sqhd, qid) = (q.sqhd, q.qid);
    let dev = q.link.as_ref().and_then(|l| l.dev());
    if !matches!(q.st, QpSt::Accepted | QpSt::Established) {
        free_cmd(w, qp, slot);
        return;
    }
    let c = &mut q.cmds[slot as usize];
    let cid = u16::from_le_bytes([c.sqe[2], c.sqe[3]]);
    c.st = CmdSt::Sending;
    let keyed = c.keyed;
    if data_len > 0 {
        if let (Some(k), Some((laddr, lkey))) = (keyed, buf_key(w, io, qp, slot, dev)) {
            post(
                w,
                qp,
                Op::Write {
                    slot,
                    laddr,
                    lkey,
                    len: data_len,
                    raddr: k.addr,
                    rkey: k.key,
                },
            );
            bump_tx(w, io, stats::tx::WRITES);
        }
    }
    let inv = keyed
        .filter(|k| k.invalidate && status.is_success())
        .map(|k| k.key);
    post(
        w,
        qp,
        Op::Send {
            slot,
            cqe: completion(cid, sqhd, qid, status, 0),
            inv,
        },
    );
    bump_tx(w, io, stats::tx::SENDS);
}

/// Answer a capsule that got no command slot.
fn respond_no_slot(w: &mut World, qp: u64, sqe: &[u8], status: Status) {
    let Some(q) = w.qps.get_mut(&qp) else { return };
    let cid = u16::from_le_bytes([sqe[2], sqe[3]]);
    let cqe = completion(cid, q.sqhd, q.qid, status, 0);
    if let Some(l) = q.link.as_mut() {
        l.post(Op::Send {
            slot: NO_SLOT,
            cqe,
            inv: None,
        });
    }
}

fn raise_cqe_event(
    w: &mut World,
    qp: u64,
    slot: u16,
    typ: doca_sta_cqe_notify_type,
    status: Status,
) {
    let Some(q) = w.qps.get(&qp) else { return };
    let c = &q.cmds[slot as usize];
    let s = &c.sqe;
    let dw = |i: usize| u32::from_le_bytes(s[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
    let cid = u16::from_le_bytes([s[2], s[3]]);
    let ev = CqeEvent {
        typ,
        cqe: completion(cid, q.sqhd, q.qid, status, 0),
        subs: q.subs.unwrap_or(0),
        qp,
        opcode: s[0],
        cid,
        nsid: dw(1),
        lba: dw(10) as u64 | (dw(11) as u64) << 32,
        pel: 0,
    };
    let sta = w.ios.get(&q.io).map(|i| i.sta);
    if let Some(s) = sta.and_then(|s| w.stas.get_mut(&s)) {
        if s.cqe_cb.is_some() && s.cqe_events.len() < 4096 {
            s.cqe_events.push_back(ev);
        }
    }
}

// --- capsules ---------------------------------------------------------------------------

fn on_recv(w: &mut World, qp: u64, rslot: u16, len: u32) {
    let Some(q) = w.qps.get_mut(&qp) else { return };
    let Some(l) = q.link.as_mut() else { return };
    let capsule = l.recv_buf(rslot, len as usize).to_vec();
    l.repost(rslot);
    let io = q.io;
    if capsule.len() < 64 {
        transport_error(w, qp, 0x80, 0xFFFF, capsule.len() as u32);
        return;
    }
    bump_comp(w, io, stats::comp::CAPSULES);
    let q = w.qps.get_mut(&qp).expect("live");
    let modulo = q.sq_size.map_or(65536u32, |s| s as u32 + 1);
    q.sqhd = ((q.sqhd as u32 + 1) % modulo) as u16;
    let (sqe, data) = capsule.split_at(64);
    if sqe[0] == opcodes::FABRICS && sqe[4] == opcodes::fabrics::CONNECT {
        q.qid = u16::from_le_bytes([sqe[42], sqe[43]]);
    }
    let Some(slot) = alloc_slot(q) else {
        // The host has more commands outstanding than the queue it negotiated.
        respond_no_slot(w, qp, sqe, Status::COMMAND_SEQUENCE_ERROR);
        return;
    };
    let c = &mut q.cmds[slot as usize];
    c.sqe.copy_from_slice(sqe);
    c.start = Instant::now();
    c.valid = false;
    c.len = 0;
    let d = SglDescriptor {
        addr: u64::from_le_bytes(sqe[24..32].try_into().expect("8 bytes")),
        bytes: sqe[32..39].try_into().expect("7 bytes"),
        id: sqe[39],
    };
    c.keyed = KeyedSgl::parse(&d);
    if let Some(ns) = offload_ns(w, qp, sqe) {
        start_offload(w, qp, slot, ns, &d, data);
    } else {
        start_non_offload(w, qp, slot, &d, data);
    }
}

/// The namespace an offloadable capsule goes to, if it is offloaded.
fn offload_ns(w: &World, qp: u64, sqe: &[u8]) -> Option<u64> {
    let q = &w.qps[&qp];
    let subs = q.subs?;
    q.sq_size?;
    if !matches!(
        sqe[0],
        opcodes::io::READ | opcodes::io::WRITE | opcodes::io::FLUSH
    ) || sqe[1] & 0x03 != 0
    {
        return None;
    }
    let nsid = u32::from_le_bytes(sqe[4..8].try_into().expect("4 bytes"));
    w.subs
        .get(&subs)?
        .nss
        .iter()
        .copied()
        .find(|n| w.nss.get(n).is_some_and(|n| n.fe == nsid && !n.removing))
}

fn start_non_offload(w: &mut World, qp: u64, slot: u16, d: &SglDescriptor, data: &[u8]) {
    let io = w.qps[&qp].io;
    let keyed = w.qps[&qp].cmds[slot as usize].keyed;
    let incap = d.sgl_type() == sgl::TYPE_DATA_BLOCK && d.subtype() == sgl::SUBTYPE_OFFSET;
    let (len, valid) = match (keyed, incap) {
        (Some(k), _) => (k.len.min(caps::MAX_IO_SIZE), false),
        (None, true) => (data.len() as u32, true),
        _ => (0, false),
    };
    let buf = match get_buf(w, io, len as usize) {
        Ok(b) => b,
        Err(e) => {
            if let contract::Fail::Rule(b) = e {
                contract::violation("doca_pe_progress", b.rule, b.detail);
            }
            respond_no_slot(
                w,
                qp,
                &w.qps[&qp].cmds[slot as usize].sqe.clone()[..],
                Status::INTERNAL_ERROR,
            );
            free_cmd(w, qp, slot);
            return;
        }
    };
    if valid {
        // SAFETY: the buffer holds at least `len` bytes (size class of len).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.va, data.len()) };
    } else {
        // Pool buffers are reused across commands and hosts: what the application does
        // not fill must not carry another command's data to this host.
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(buf.va, 0, len as usize) };
    }
    let q = w.qps.get_mut(&qp).expect("live");
    let user = q.user;
    let _ = user;
    let c = &mut q.cmds[slot as usize];
    c.kind = CmdKind::NonOffload;
    c.st = CmdSt::App;
    c.len = len;
    c.valid = valid;
    let (cmd, payload, gen) = (c.sqe.as_ptr(), buf.va, c.gen);
    c.buf = Some(buf);
    bump_comp(w, io, stats::comp::NON_OFFLOADED);
    let Some((cb, user)) = w.ios.get(&io).and_then(|i| i.non_offload) else {
        return;
    };
    w.queue_cb(
        CtxRef::Io(io),
        Cb::NonOffload {
            cb,
            qp,
            user,
            cmd,
            payload,
            len,
            valid,
            token: token(qp, slot, gen),
        },
    );
}

fn start_offload(w: &mut World, qp: u64, slot: u16, ns: u64, d: &SglDescriptor, data: &[u8]) {
    let io = w.qps[&qp].io;
    bump_comp(w, io, stats::comp::OFFLOADED);
    let n = &w.nss[&ns];
    let bs = n.bs;
    let c = &w.qps[&qp].cmds[slot as usize];
    let op = c.sqe[0];
    let nlb = (u32::from_le_bytes(c.sqe[48..52].try_into().expect("4 bytes")) & 0xFFFF) as u64 + 1;
    let kind = match op {
        opcodes::io::READ => CmdKind::Read,
        opcodes::io::WRITE => CmdKind::Write,
        _ => CmdKind::Flush,
    };
    let len = if kind == CmdKind::Flush {
        0
    } else {
        nlb * bs as u64
    };
    let keyed = c.keyed;
    let incap = d.sgl_type() == sgl::TYPE_DATA_BLOCK && d.subtype() == sgl::SUBTYPE_OFFSET;
    let check = || -> Result<(), Status> {
        if kind == CmdKind::Flush {
            return Ok(());
        }
        if len > caps::MAX_IO_SIZE as u64 {
            return Err(Status::INVALID_FIELD);
        }
        match (keyed, incap) {
            (Some(k), _) if k.len as u64 != len => Err(Status::DATA_SGL_LENGTH_INVALID),
            (Some(_), _) => Ok(()),
            (None, true) if kind == CmdKind::Write => {
                if d.addr != 0 {
                    Err(Status::SGL_OFFSET_INVALID)
                } else if d.length() as u64 != len || data.len() < len as usize {
                    Err(Status::DATA_SGL_LENGTH_INVALID)
                } else {
                    Ok(())
                }
            }
            _ => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
        }
    };
    {
        let q = w.qps.get_mut(&qp).expect("live");
        let c = &mut q.cmds[slot as usize];
        c.kind = kind;
        c.ns = ns;
        c.len = len as u32;
    }
    if let Err(st) = check() {
        if let Some(n) = w.nss.get_mut(&ns) {
            n.stats.add(stats::ns::ERRORS, 1);
        }
        raise_cqe_event(w, qp, slot, DOCA_STA_CQE_NOTIF_NVME_OF_VALIDATION_ERR, st);
        respond(w, qp, slot, st, 0);
        return;
    }
    if len > 0 {
        match get_buf(w, io, len as usize) {
            Ok(b) => {
                if incap && keyed.is_none() {
                    // SAFETY: the buffer holds at least `len` bytes; `data` has `len`.
                    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), b.va, len as usize) };
                }
                w.qps.get_mut(&qp).expect("live").cmds[slot as usize].buf = Some(b);
                // Registered here, on the QP's own thread: the RDMA WRITE of a Read's data
                // may be queued by whichever thread reaps the backend completion.
                let dev = w.qps[&qp].link.as_ref().and_then(|l| l.dev());
                if dev.is_some() && buf_key(w, io, qp, slot, dev).is_none() {
                    respond(w, qp, slot, Status::INTERNAL_ERROR, 0);
                    return;
                }
            }
            Err(e) => {
                if let contract::Fail::Rule(b) = e {
                    contract::violation("doca_pe_progress", b.rule, b.detail);
                }
                respond(w, qp, slot, Status::INTERNAL_ERROR, 0);
                return;
            }
        }
    }
    w.nss.get_mut(&ns).expect("live").inflight += 1;
    if let (CmdKind::Write, Some(k)) = (kind, keyed) {
        let dev = w.qps[&qp].link.as_ref().and_then(|l| l.dev());
        w.qps.get_mut(&qp).expect("live").cmds[slot as usize].st = CmdSt::HostRead;
        match buf_key(w, io, qp, slot, dev) {
            Some((laddr, lkey)) => {
                post(
                    w,
                    qp,
                    Op::Read {
                        slot,
                        laddr,
                        lkey,
                        len: len as u32,
                        raddr: k.addr,
                        rkey: k.key,
                    },
                );
                bump_tx(w, io, stats::tx::READS);
            }
            None => {
                w.nss.get_mut(&ns).expect("live").inflight -= 1;
                respond(w, qp, slot, Status::INTERNAL_ERROR, 0);
            }
        }
        return;
    }
    be_submit(w, qp, slot);
}

// --- backend queues ---------------------------------------------------------------------

/// Put an offloaded command into a backend queue of its namespace's backend.
fn be_submit(w: &mut World, qp: u64, slot: u16) {
    let (io, ns, gen) = {
        let q = &w.qps[&qp];
        let c = &q.cmds[slot as usize];
        (q.io, c.ns, c.gen)
    };
    let Some(n) = w.nss.get(&ns) else { return };
    let (be, be_nsid) = (n.be, n.be_nsid);
    let index = w.ios.get(&io).map_or(0, |i| i.index as usize);
    let queues: Vec<u64> = w
        .bes
        .get(&be)
        .map(|b| {
            b.queues
                .iter()
                .copied()
                .filter(|q| w.beqs.get(q).is_some_and(|q| !q.destroying))
                .collect()
        })
        .unwrap_or_default();
    if queues.is_empty() {
        w.nss.get_mut(&ns).expect("live").inflight -= 1;
        respond(w, qp, slot, Status::NAMESPACE_NOT_READY, 0);
        return;
    }
    let bq = queues[index % queues.len()];
    let q = w.beqs.get_mut(&bq).expect("live");
    let Some(cid) = q.free_cids.pop() else {
        q.waiting.push_back((qp, slot, gen));
        w.qps.get_mut(&qp).expect("live").cmds[slot as usize].st = CmdSt::BeWait;
        return;
    };
    let c = &mut w.qps.get_mut(&qp).expect("live").cmds[slot as usize];
    c.st = CmdSt::Backend;
    let mut sqe = [0u8; 64];
    sqe[0] = c.sqe[0];
    sqe[2..4].copy_from_slice(&cid.to_le_bytes());
    sqe[4..8].copy_from_slice(&be_nsid.to_le_bytes());
    if let Some(b) = c.buf.as_ref() {
        let (p1, p2) = mem::prps(b, c.len as usize);
        sqe[24..32].copy_from_slice(&p1.to_le_bytes());
        sqe[32..40].copy_from_slice(&p2.to_le_bytes());
    }
    sqe[40..64].copy_from_slice(&c.sqe[40..64]);
    let q = w.beqs.get_mut(&bq).expect("live");
    q.slots[cid as usize] = Some(Pending {
        qp,
        slot,
        gen,
        submitted: Instant::now(),
        timeout_reported: false,
    });
    // SAFETY: the SQ ring is a started mmap of `entries` 64-byte slots (checked at
    // be_add_queue) that the application keeps until the queue is destroyed; the doorbell
    // lies inside its mmap and is 4-byte aligned.
    unsafe {
        std::ptr::copy_nonoverlapping(
            sqe.as_ptr(),
            (q.sq_va + q.sq_tail as usize * 64) as *mut u8,
            64,
        );
        q.sq_tail = (q.sq_tail + 1) % q.entries;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        (q.sq_db_va as *mut u32).write_volatile(q.sq_tail);
    }
    q.stats.add(stats::beq::SUBMITTED, 1);
    let eu = q.eu;
    if let Some(e) = w.eus.get_mut(&eu) {
        e.stats.add(stats::beq::SUBMITTED, 1);
    }
}

/// Serve (RAM drive) and reap one backend queue; true if anything completed.
fn poll_beq(w: &mut World, bq: u64) -> bool {
    let Some(q) = w.beqs.get_mut(&bq) else {
        return false;
    };
    if q.destroying {
        return false;
    }
    if q.null {
        let World {
            beqs,
            bes,
            nss,
            mem,
            ..
        } = &mut *w;
        let q = beqs.get_mut(&bq).expect("live");
        if let Some(b) = bes.get_mut(&q.be) {
            let be = q.be;
            let bs_of = |nsid: u32| {
                nss.values()
                    .find(|n| n.be == be && n.be_nsid == nsid)
                    .map(|n| n.bs)
            };
            let rings = crate::drive::Rings {
                entries: q.entries,
                sq_va: q.sq_va,
                cq_va: q.cq_va,
                sq_db_va: q.sq_db_va,
                cq_db_va: q.cq_db_va,
            };
            crate::drive::service(&mut b.drive, &mut q.drive_q, &rings, mem, &bs_of);
        }
    }
    let q = w.beqs.get_mut(&bq).expect("live");
    let mut done = Vec::new();
    loop {
        let slot = (q.cq_va + q.cq_head as usize * 16) as *const u8;
        // SAFETY: the CQ ring is a started mmap of `entries` 16-byte slots.
        let status = unsafe { (slot.add(14) as *const u16).read_volatile() };
        if (status & 1 == 1) != q.phase {
            break;
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let mut cqe = [0u8; 16];
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(slot, cqe.as_mut_ptr(), 16) };
        q.cq_head = (q.cq_head + 1) % q.entries;
        if q.cq_head == 0 {
            q.phase = !q.phase;
        }
        let cid = u16::from_le_bytes([cqe[12], cqe[13]]);
        if let Some(p) = q.slots.get_mut(cid as usize).and_then(Option::take) {
            q.free_cids.push(cid);
            done.push((p, Status::from_field(status & !1)));
        }
    }
    if done.is_empty() {
        return false;
    }
    // SAFETY: the CQ head doorbell lies inside its started mmap, 4-byte aligned.
    unsafe { (q.cq_db_va as *mut u32).write_volatile(q.cq_head) };
    let eu = q.eu;
    for (_, st) in &done {
        q.stats.add(stats::beq::COMPLETED, 1);
        if !st.is_success() {
            q.stats.add(stats::beq::ERRORS, 1);
        }
    }
    if let Some(e) = w.eus.get_mut(&eu) {
        e.stats.add(stats::beq::COMPLETED, done.len() as u64);
    }
    for (p, st) in done {
        be_done(w, p.qp, p.slot, p.gen, st);
    }
    // Commands waiting for a slot of this queue.
    while let Some(q) = w.beqs.get_mut(&bq) {
        if q.free_cids.is_empty() {
            break;
        }
        let Some((qp, slot, gen)) = q.waiting.pop_front() else {
            break;
        };
        if w.qps.get(&qp).is_some_and(|q| {
            q.cmds[slot as usize].gen == gen && q.cmds[slot as usize].st == CmdSt::BeWait
        }) {
            be_submit(w, qp, slot);
        }
    }
    true
}

fn be_done(w: &mut World, qp: u64, slot: u16, gen: u16, st: Status) {
    let Some(q) = w.qps.get(&qp) else { return };
    let c = &q.cmds[slot as usize];
    if c.gen != gen || !matches!(c.st, CmdSt::Backend | CmdSt::BeWait) {
        return;
    }
    let (ns, kind, len) = (c.ns, c.kind, c.len);
    if let Some(n) = w.nss.get_mut(&ns) {
        n.inflight = n.inflight.saturating_sub(1);
        if st.is_success() {
            match kind {
                CmdKind::Read => {
                    n.stats.add(stats::ns::READS, 1);
                    n.stats.add(stats::ns::READ_BYTES, len as u64);
                }
                CmdKind::Write => {
                    n.stats.add(stats::ns::WRITES, 1);
                    n.stats.add(stats::ns::WRITE_BYTES, len as u64);
                }
                _ => n.stats.add(stats::ns::FLUSHES, 1),
            }
        } else {
            n.stats.add(stats::ns::ERRORS, 1);
        }
    }
    if !st.is_success() {
        raise_cqe_event(w, qp, slot, DOCA_STA_CQE_NOTIF_NVME_COMP_ERR, st);
    }
    let data = if st.is_success() && kind == CmdKind::Read {
        len
    } else {
        0
    };
    respond(w, qp, slot, st, data);
}

/// A backend queue is being destroyed: every command on it or waiting for it is
/// answered with "aborted: SQ deletion" at once.
fn abort_beq(w: &mut World, bq: u64) {
    let Some(q) = w.beqs.get_mut(&bq) else { return };
    let mut victims: Vec<(u64, u16, u16)> = q
        .slots
        .iter_mut()
        .filter_map(|s| s.take())
        .map(|p| (p.qp, p.slot, p.gen))
        .collect();
    victims.extend(q.waiting.drain(..));
    for (qp, slot, gen) in victims {
        be_done(w, qp, slot, gen, Status::ABORTED_SQ_DELETION);
    }
}

// --- QP work ----------------------------------------------------------------------------

fn transport_error(w: &mut World, qp: u64, op: u32, syndrome: u32, vendor: u32) {
    let Some(q) = w.qps.get_mut(&qp) else { return };
    if q.error_reported || q.st == QpSt::Disconnecting || q.st == QpSt::Disconnected {
        return;
    }
    q.error_reported = true;
    let io = q.io;
    bump_tx(w, io, stats::tx::ERRORS);
    let Some((cb, user)) = w.ios.get(&io).and_then(|i| i.terr_cb) else {
        return;
    };
    let ev = w.new_id(Kind::EvTransport);
    w.events.insert(
        ev,
        Event::Transport(TransportEv {
            qp,
            op,
            syndrome,
            vendor,
        }),
    );
    w.queue_cb(CtxRef::Io(io), Cb::TransportErr { cb, ev, user });
}

fn on_wc(w: &mut World, qp: u64, wc: Wc) {
    if wc.kind == WcKind::Recv {
        if wc.ok {
            on_recv(w, qp, wc.slot, wc.len);
        } else if !wc.flush {
            transport_error(w, qp, 0x80, wc.status, wc.vendor);
        }
        return;
    }
    if !wc.ok && !wc.flush {
        let op = match wc.kind {
            WcKind::Read => 2,
            WcKind::Write => 1,
            _ => 0,
        };
        transport_error(w, qp, op, wc.status, wc.vendor);
    }
    if wc.slot == NO_SLOT {
        return;
    }
    let Some(q) = w.qps.get_mut(&qp) else { return };
    let Some(c) = q.cmds.get_mut(wc.slot as usize) else {
        return;
    };
    let slot = wc.slot;
    match (wc.kind, c.st) {
        (WcKind::Read, CmdSt::AppReading) => {
            let t = c.task.take();
            if wc.ok {
                c.valid = true;
            }
            c.st = CmdSt::App;
            if let Some(t) = t {
                w.finish_task(
                    t,
                    if wc.ok {
                        DOCA_SUCCESS
                    } else {
                        DOCA_ERROR_IO_FAILED
                    },
                );
            }
        }
        (WcKind::Read, CmdSt::HostRead) => {
            if wc.ok {
                be_submit(w, qp, slot);
            } else {
                let ns = c.ns;
                if let Some(n) = w.nss.get_mut(&ns) {
                    n.inflight = n.inflight.saturating_sub(1);
                }
                free_cmd(w, qp, slot);
            }
        }
        (WcKind::Send, CmdSt::AppSending) => {
            let t = c.task.take();
            free_cmd(w, qp, slot);
            if let Some(t) = t {
                w.finish_task(
                    t,
                    if wc.ok {
                        DOCA_SUCCESS
                    } else {
                        DOCA_ERROR_IO_FAILED
                    },
                );
            }
            if let Some(io) = w.qps.get(&qp).map(|q| q.io) {
                bump_comp(w, io, stats::comp::COMPLETIONS);
            }
        }
        (WcKind::Send, CmdSt::Sending) => {
            free_cmd(w, qp, slot);
            if let Some(io) = w.qps.get(&qp).map(|q| q.io) {
                bump_comp(w, io, stats::comp::COMPLETIONS);
            }
        }
        _ => {}
    }
}

fn step_qp(w: &mut World, qp: u64) -> bool {
    let mut wcs = Vec::new();
    {
        let World { qps, loops, .. } = &mut *w;
        let Some(l) = qps.get_mut(&qp).and_then(|q| q.link.as_mut()) else {
            return false;
        };
        l.poll(loops, &mut wcs);
    }
    let did = !wcs.is_empty();
    for wc in wcs {
        on_wc(w, qp, wc);
    }
    flush_qp(w, qp);
    // A disconnect finishes once nothing of the QP is in the backend or on the wire.
    let Some(q) = w.qps.get_mut(&qp) else {
        return did;
    };
    if q.st == QpSt::Disconnecting
        && !q.backend_busy()
        && !q.link.as_ref().is_some_and(|l| l.busy())
    {
        q.st = QpSt::Disconnected;
        q.disc_done = true;
        // Offloaded commands left (answers flushed) are the engine's to free.
        let slots: Vec<u16> = q
            .cmds
            .iter()
            .enumerate()
            .filter(|(_, c)| matches!(c.st, CmdSt::Sending))
            .map(|(i, _)| i as u16)
            .collect();
        let t = q.disc_task.take();
        for s in slots {
            free_cmd(w, qp, s);
        }
        if let Some(t) = t {
            w.finish_task(t, DOCA_SUCCESS);
        }
        return true;
    }
    did
}

/// Wake the PEs of IO contexts (other than `except`) whose QPs have work queued by
/// another thread (backend completions reaped there, or a backend queue aborted by the
/// main context): only the owning thread posts it (`flush_qp` from its `step_qp`).
pub fn wake_owners(w: &mut World, except: Option<u64>) {
    let mut ios: Vec<u64> = w
        .qps
        .values()
        .filter(|q| Some(q.io) != except && q.link.as_ref().is_some_and(|l| l.queued()))
        .map(|q| q.io)
        .collect();
    ios.sort_unstable();
    ios.dedup();
    for io in ios {
        let pe = w.ios.get(&io).and_then(|i| i.ctx.pe);
        if let Some(p) = pe.and_then(|p| w.pes.get(&p)) {
            p.notify.wake();
        }
    }
}

/// Whether the local buffer of an RDMA READ/WRITE is the data buffer of the live command
/// it was posted for, in a state that expects that transfer, and large enough: what the
/// loopback link checks before it moves bytes (issue 12, hypothesis 1: a transfer into a
/// buffer already given back would overwrite whatever lives there now).
pub fn target_owned(cmds: &[Cmd], op: &Op) -> bool {
    let (slot, laddr, len, read) = match *op {
        Op::Read {
            slot, laddr, len, ..
        } => (slot, laddr, len, true),
        Op::Write {
            slot, laddr, len, ..
        } => (slot, laddr, len, false),
        Op::Send { .. } => return true,
    };
    let Some(c) = cmds.get(slot as usize) else {
        return false;
    };
    let expects = if read {
        matches!(c.st, CmdSt::HostRead | CmdSt::AppReading)
    } else {
        matches!(c.st, CmdSt::Sending | CmdSt::AppSending)
    };
    expects
        && c.buf
            .as_ref()
            .is_some_and(|b| b.va as u64 == laddr && len as usize <= b.cap)
}

fn flush_qp(w: &mut World, qp: u64) {
    let World { qps, loops, .. } = &mut *w;
    let Some(q) = qps.get_mut(&qp) else { return };
    let Qp { link, cmds, .. } = q;
    let Some(l) = link.as_mut() else { return };
    if let Err(e) = l.flush(loops, &|op| target_owned(cmds, op)) {
        let _ = e;
        transport_error(w, qp, 0, 0xFFFE, 0);
    }
}

fn step_io(w: &mut World, io: u64) -> bool {
    let Some(i) = w.ios.get(&io) else {
        return false;
    };
    if i.ctx.idle() {
        return false;
    }
    let sta = i.sta;
    let qps = i.qps.clone();
    let mut did = false;
    for &q in &qps {
        did |= step_qp(w, q);
    }
    let beqs: Vec<u64> = w
        .stas
        .get(&sta)
        .map(|s| {
            s.bes
                .iter()
                .flat_map(|b| w.bes.get(b).map(|b| b.queues.clone()).unwrap_or_default())
                .collect()
        })
        .unwrap_or_default();
    let mut be_did = false;
    for q in beqs {
        be_did |= poll_beq(w, q);
    }
    if be_did {
        did = true;
        // Answers produced by backend completions go out in this pass for this context's
        // QPs; another context's QPs are posted by their own thread (the library wants
        // every QP call on the thread that owns the QP), woken here.
        for &q in &qps {
            flush_qp(w, q);
        }
        wake_owners(w, Some(io));
    }
    let i = w.ios.get(&io).expect("live");
    if i.ctx.state == DOCA_CTX_STATE_STOPPING && i.tasks == 0 {
        w.set_ctx_state(CtxRef::Io(io), DOCA_CTX_STATE_IDLE);
        did = true;
    }
    did
}

fn step_sta(w: &mut World, id: u64) -> bool {
    let Some(s) = w.stas.get(&id) else {
        return false;
    };
    let mut did = false;
    match s.ctx.state {
        DOCA_CTX_STATE_STARTING => {
            w.set_ctx_state(CtxRef::Sta(id), DOCA_CTX_STATE_RUNNING);
            return true;
        }
        DOCA_CTX_STATE_IDLE => return false,
        _ => {}
    }
    // Main-context tasks.
    for t in w.stas[&id].tasks.clone() {
        let task = &w.tasks[&t];
        match task.kind {
            TaskKind::RmNs => {
                let ns = task.ns;
                if w.nss.get(&ns).is_none_or(|n| n.inflight == 0) {
                    if let Some(n) = w.nss.remove(&ns) {
                        if let Some(s) = w.subs.get_mut(&n.subs) {
                            s.nss.retain(|&x| x != ns);
                        }
                        if let Some(b) = w.bes.get_mut(&n.be) {
                            b.nss = b.nss.saturating_sub(1);
                        }
                    }
                    w.finish_task(t, DOCA_SUCCESS);
                    did = true;
                }
            }
            TaskKind::BeqDestroy => {
                let bq = task.beq;
                if let Some(q) = w.beqs.remove(&bq) {
                    for m in q.mmaps {
                        if let Some(m) = w.mmaps.get_mut(&m) {
                            m.users = m.users.saturating_sub(1);
                        }
                    }
                    if let Some(b) = w.bes.get_mut(&q.be) {
                        b.queues.retain(|&x| x != bq);
                    }
                    w.eus.remove(&q.eu);
                    if let Some(s) = w.stas.get_mut(&id) {
                        s.eus.retain(|&e| e != q.eu);
                    }
                }
                w.finish_task(t, DOCA_SUCCESS);
                did = true;
            }
            _ => {}
        }
    }
    // Backend timeouts: one event per command that crossed the limit.
    let limit = w.stas[&id].be_timeout;
    let cb = w.stas[&id].be_timeout_cb;
    let now = Instant::now();
    let mut evs = Vec::new();
    for b in w.stas[&id].bes.clone() {
        let queues = w.bes.get(&b).map(|b| b.queues.clone()).unwrap_or_default();
        for bq in queues {
            let Some(q) = w.beqs.get_mut(&bq) else {
                continue;
            };
            for p in q.slots.iter_mut().flatten() {
                if !p.timeout_reported && now.duration_since(p.submitted) > limit {
                    p.timeout_reported = true;
                    q.stats.add(stats::beq::TIMEOUTS, 1);
                    evs.push((b, bq));
                }
            }
        }
    }
    if let Some((cb, user)) = cb {
        for (be, beq) in evs {
            let ev = w.new_id(Kind::EvBeTimeout);
            w.events
                .insert(ev, Event::BeTimeout(BeTimeoutEv { be, beq }));
            w.queue_cb(CtxRef::Sta(id), Cb::BeTimeout { cb, ev, user });
            did = true;
        }
    }
    // CQE-notify events raised by IO contexts.
    let pending: Vec<CqeEvent> = w
        .stas
        .get_mut(&id)
        .expect("live")
        .cqe_events
        .drain(..)
        .collect();
    if let Some((cb, user)) = w.stas[&id].cqe_cb {
        for e in pending {
            let ev = w.new_id(Kind::EvCqe);
            w.events.insert(ev, Event::Cqe(e));
            w.queue_cb(CtxRef::Sta(id), Cb::CqeNotify { cb, ev, user });
            did = true;
        }
    }
    let s = &w.stas[&id];
    if s.ctx.state == DOCA_CTX_STATE_STOPPING && s.tasks.is_empty() {
        w.set_ctx_state(CtxRef::Sta(id), DOCA_CTX_STATE_IDLE);
        did = true;
    }
    did
}

// --- notification -----------------------------------------------------------------------

pub fn arm(w: &mut World, pe: u64) {
    let ctxs = w.pes.get(&pe).map(|p| p.ctxs.clone()).unwrap_or_default();
    for c in ctxs {
        if let CtxRef::Io(io) = c {
            for q in w.ios.get(&io).map(|i| i.qps.clone()).unwrap_or_default() {
                if let Some(l) = w.qps.get_mut(&q).and_then(|q| q.link.as_mut()) {
                    l.arm();
                }
            }
        }
    }
}

pub fn drain_channels(w: &mut World, pe: u64) {
    let ctxs = w.pes.get(&pe).map(|p| p.ctxs.clone()).unwrap_or_default();
    for c in ctxs {
        if let CtxRef::Io(io) = c {
            for q in w.ios.get(&io).map(|i| i.qps.clone()).unwrap_or_default() {
                if let Some(l) = w.qps.get_mut(&q).and_then(|q| q.link.as_mut()) {
                    l.drain_events();
                }
            }
        }
    }
    // Channels of destroyed CQs (any IO context's): drained unread, closed after their
    // grace period (see link.rs `VerbsIo`).
    let late = sta::verbs::reap_dead_channels(Instant::now());
    if late > 0 {
        eprintln!(
            "doca-double: discarded {late} completion event(s) for a CQ already destroyed \
             ({} so far; the kernel's rdma_rxe raises them late, see link.rs VerbsIo)",
            sta::verbs::late_cq_events()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_must_target_the_buffer_of_its_live_command() {
        let mut mem = vec![0u8; 8192];
        let va = mem.as_mut_ptr();
        let mut c = Cmd::new();
        c.st = CmdSt::HostRead;
        c.buf = Some(Buf {
            va,
            phys: 0,
            cap: 4096,
            prp_va: std::ptr::null_mut(),
            prp_phys: 0,
            mrs: Vec::new(),
        });
        let mut cmds = vec![Cmd::new(), c];
        let read = |laddr: u64, len: u32| Op::Read {
            slot: 1,
            laddr,
            lkey: 0,
            len,
            raddr: 0,
            rkey: 0,
        };
        let write = Op::Write {
            slot: 1,
            laddr: va as u64,
            lkey: 0,
            len: 4096,
            raddr: 0,
            rkey: 0,
        };
        assert!(target_owned(&cmds, &read(va as u64, 4096)));
        assert!(
            !target_owned(&cmds, &read(va as u64, 4097)),
            "past the buffer"
        );
        assert!(
            !target_owned(&cmds, &read(va as u64 + 4096, 512)),
            "not its buffer"
        );
        assert!(
            !target_owned(&cmds, &write),
            "a READ is expected, not a WRITE"
        );
        cmds[1].st = CmdSt::Sending;
        assert!(target_owned(&cmds, &write));
        // Freed: the buffer went back to the pool.
        cmds[1].st = CmdSt::Free;
        cmds[1].buf = None;
        assert!(!target_owned(&cmds, &write));
        assert!(!target_owned(&cmds, &read(va as u64, 512)));
        assert!(
            !target_owned(&cmds[..1], &write),
            "a slot the QP does not have"
        );
    }
}
