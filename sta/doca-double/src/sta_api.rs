//! The main context and its objects: `doca_sta.h`, `doca_sta_task.h`, `doca_sta_mem.h`,
//! `doca_sta_event.h`, `doca_sta_be.h`, `doca_sta_subsystem.h`, `doca_sta_stats.h`.
//!
//! Not supported (they return `DOCA_ERROR_NOT_SUPPORTED` after checking their handles):
//! nothing. Of the EU-error event, only registration is meaningful: the double's
//! execution units never fail, so `doca_sta_event_eu_err_*` getters never see an event.
//!
//! Why one file of ~1350 lines: the exports follow doca-sta-api.md section 4 table by
//! table, so the ABI can be checked against that list in one read; each function is a
//! short checked wrapper over `world`, with no state of its own to separate.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, CStr, CString};

use doca_sys::*;

use crate::contract::{self, broken, code, finish, Res};
use crate::drive::{DriveQueue, RamDrive};
use crate::engine::caps;
use crate::out;
use crate::stats::{self, Counters};
use crate::world::*;

fn config_sta(w: &mut World, sta: *const doca_sta, what: &str) -> Res<u64> {
    let (id, s) = w.sta(sta)?;
    if !s.ctx.idle() {
        return broken(
            &contract::CONFIG_BEFORE_START,
            format!("{what} after doca_ctx_start of the main context"),
        );
    }
    Ok(id)
}

fn cb_pair(ok: TaskCb, err: TaskCb) -> Res<(TaskCb, TaskCb)> {
    if ok.is_none() || err.is_none() {
        return broken(
            &contract::NULL_ARG,
            "task completion and error callbacks must both be given",
        );
    }
    Ok((ok, err))
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_cap_is_supported(d: *const doca_devinfo) -> doca_error_t {
    finish(
        "doca_sta_cap_is_supported",
        (|| {
            world().devinfo(d)?;
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_create(
    dev: *mut doca_dev,
    sta: *mut *mut doca_sta,
) -> doca_error_t {
    finish(
        "doca_sta_create",
        (|| {
            out::check(sta, "sta")?;
            let mut w = world();
            let (d, _) = w.dev(dev)?;
            let id = w.new_id(Kind::Sta);
            let ms = std::env::var("DOCA_DOUBLE_BE_TIMEOUT_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(30_000);
            w.stas.insert(
                id,
                Sta {
                    ctx: Ctx::new(),
                    dev: d,
                    net_devs: Vec::new(),
                    max_io: 0,
                    ios: Vec::new(),
                    io_created: 0,
                    subs: Vec::new(),
                    bes: Vec::new(),
                    alloc: None,
                    rm_ns_conf: None,
                    beq_conf: None,
                    be_timeout_cb: None,
                    eu_err_cb: None,
                    cqe_cb: None,
                    tasks: Vec::new(),
                    eus: Vec::new(),
                    be_timeout: std::time::Duration::from_millis(ms),
                    cqe_events: Default::default(),
                    qp_count: 0,
                },
            );
            out::put(sta, ptr(Kind::Sta, id))
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_destroy(sta: *mut doca_sta) -> doca_error_t {
    finish(
        "doca_sta_destroy",
        (|| {
            let mut w = world();
            let (id, s) = w.sta(sta)?;
            if !s.ctx.idle() {
                return broken(
                    &contract::TEARDOWN,
                    "doca_sta_destroy of a main context that is not stopped",
                );
            }
            let left = [
                (s.ios.len(), "IO context(s)"),
                (s.subs.len(), "subsystem(s)"),
                (s.bes.len(), "backend(s)"),
            ];
            let leaks: Vec<String> = left
                .iter()
                .filter(|(n, _)| *n > 0)
                .map(|(n, what)| format!("{n} {what}"))
                .collect();
            if !leaks.is_empty() {
                return broken(
                    &contract::TEARDOWN,
                    format!("doca_sta_destroy with {} not destroyed", leaks.join(", ")),
                );
            }
            let s = w.stas.remove(&id).expect("live");
            if let Some(p) = s.ctx.pe.and_then(|p| w.pes.get_mut(&p)) {
                p.ctxs.retain(|c| *c != CtxRef::Sta(id));
            }
            for e in s.eus {
                w.eus.remove(&e);
            }
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_add_dev(sta: *mut doca_sta, dev: *mut doca_dev) -> doca_error_t {
    finish(
        "doca_sta_add_dev",
        (|| {
            let mut w = world();
            let id = config_sta(&mut w, sta, "doca_sta_add_dev")?;
            let (d, _) = w.dev(dev)?;
            let s = w.stas.get_mut(&id).expect("live");
            if !s.net_devs.contains(&d) {
                if s.net_devs.len() >= caps::MAX_DEVS as usize {
                    return code(DOCA_ERROR_FULL);
                }
                s.net_devs.push(d);
            }
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_set_max_sta_io(sta: *mut doca_sta, n: u16) -> doca_error_t {
    finish(
        "doca_sta_set_max_sta_io",
        (|| {
            let mut w = world();
            let id = config_sta(&mut w, sta, "doca_sta_set_max_sta_io")?;
            if n == 0 || n as u32 > caps::MAX_IO_THREADS {
                return broken(
                    &contract::RANGE,
                    format!("max_io_num {n} is not in 1..={}", caps::MAX_IO_THREADS),
                );
            }
            w.stas.get_mut(&id).expect("live").max_io = n;
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_get_max_sta_io(
    sta: *const doca_sta,
    n: *mut u16,
) -> doca_error_t {
    finish(
        "doca_sta_get_max_sta_io",
        (|| {
            out::check(n, "max_io_num")?;
            let v = world().sta(sta)?.1.max_io;
            out::put(n, v)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_as_ctx(sta: *mut doca_sta) -> *mut doca_ctx {
    let mut w = world();
    match w.sta(sta) {
        Ok((id, _)) => CtxRef::Sta(id).handle(),
        Err(b) => {
            drop(w);
            contract::violation("doca_sta_as_ctx", b.rule, b.detail);
            std::ptr::null_mut()
        }
    }
}

macro_rules! global_cap {
    ($f:ident, $v:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $f(out: *mut u32) -> doca_error_t {
            finish(
                stringify!($f),
                (|| {
                    out::check(out, "output")?;
                    out::put(out, $v)
                })(),
            )
        }
    };
}

macro_rules! sta_cap {
    ($f:ident, |$s:ident| $v:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $f(sta: *const doca_sta, out: *mut u32) -> doca_error_t {
            finish(
                stringify!($f),
                (|| {
                    out::check(out, "output")?;
                    let mut w = world();
                    let (_, $s) = w.sta(sta)?;
                    let v: u32 = $v;
                    out::put(out, v)
                })(),
            )
        }
    };
}

global_cap!(doca_sta_get_max_devs, caps::MAX_DEVS);
global_cap!(doca_sta_get_max_subsys, caps::MAX_SUBSYS);
global_cap!(doca_sta_get_max_ns_per_subs, caps::MAX_NS_PER_SUBS);
global_cap!(doca_sta_get_max_qps, caps::MAX_QPS);
global_cap!(doca_sta_get_max_io_threads, caps::MAX_IO_THREADS);
global_cap!(doca_sta_get_max_io_size, caps::MAX_IO_SIZE);
global_cap!(doca_sta_get_min_ioccsz, caps::MIN_IOCCSZ);
global_cap!(doca_sta_get_max_ioccsz, caps::MAX_IOCCSZ);
global_cap!(doca_sta_get_min_iorcsz, caps::MIN_IORCSZ);
global_cap!(doca_sta_get_max_iorcsz, caps::MAX_IORCSZ);
global_cap!(doca_sta_get_max_icdoff, caps::MAX_ICDOFF);
global_cap!(doca_sta_get_max_be, caps::MAX_BE);
global_cap!(doca_sta_get_max_qs_per_be, caps::MAX_QS_PER_BE);
sta_cap!(doca_sta_get_max_num_eus_available, |s| 2
    * caps::MAX_IO_THREADS.min(s.max_io.max(1) as u32)
    + caps::MAX_BE * caps::MAX_QS_PER_BE);
sta_cap!(doca_sta_get_max_num_connected_qp_per_eu, |_s| {
    caps::MAX_QP_PER_EU
});
sta_cap!(doca_sta_get_max_io_num_per_dev, |_s| {
    caps::MAX_IO_NUM_PER_DEV
});
sta_cap!(doca_sta_get_max_io_queue_size, |_s| caps::MAX_IO_QUEUE_SIZE);

#[no_mangle]
pub extern "C" fn doca_sta_is_logical_block_size_supported(bs: u32) -> bool {
    caps::BLOCK_SIZES.contains(&bs)
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_producer_send_task_as_task(
    t: *mut doca_sta_producer_task_send,
) -> *mut doca_task {
    let w = world();
    match w.id_of(Kind::StaTask, t as u64) {
        Ok(id) if w.tasks.contains_key(&id) => ptr(Kind::Task, id),
        Ok(id) => {
            let b = w.missing(Kind::StaTask, id);
            drop(w);
            contract::violation("doca_sta_producer_send_task_as_task", b.rule, b.detail);
            std::ptr::null_mut()
        }
        Err(b) => {
            drop(w);
            contract::violation("doca_sta_producer_send_task_as_task", b.rule, b.detail);
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_mem_allocator_register(
    sta: *const doca_sta,
    z: doca_sta_zmalloc_cb_t,
    f: doca_sta_free_cb_t,
    v: doca_sta_vtophys_cb_t,
) -> doca_error_t {
    finish(
        "doca_sta_mem_allocator_register",
        (|| {
            let mut w = world();
            let id = config_sta(&mut w, sta, "doca_sta_mem_allocator_register")?;
            let (Some(zmalloc), Some(free), Some(vtophys)) = (z, f, v) else {
                return broken(
                    &contract::NULL_ARG,
                    "zmalloc, free and vtophys must all be given",
                );
            };
            w.stas.get_mut(&id).expect("live").alloc = Some(Alloc {
                zmalloc,
                free,
                vtophys,
            });
            Ok(())
        })(),
    )
}

// --- events -----------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn doca_sta_event_be_timeout_register_cb(
    sta: *mut doca_sta,
    cb: doca_sta_event_be_timeout_cb_t,
    user: doca_data,
) -> doca_error_t {
    finish(
        "doca_sta_event_be_timeout_register_cb",
        (|| {
            let mut w = world();
            let id = config_sta(&mut w, sta, "doca_sta_event_be_timeout_register_cb")?;
            out::check_cb(cb)?;
            w.stas.get_mut(&id).expect("live").be_timeout_cb = Some((cb, data_as_u64(user)));
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_event_eu_err_register_cb(
    sta: *mut doca_sta,
    cb: doca_sta_event_eu_err_cb_t,
    user: doca_data,
) -> doca_error_t {
    finish(
        "doca_sta_event_eu_err_register_cb",
        (|| {
            let mut w = world();
            let id = config_sta(&mut w, sta, "doca_sta_event_eu_err_register_cb")?;
            out::check_cb(cb)?;
            w.stas.get_mut(&id).expect("live").eu_err_cb = Some((cb, data_as_u64(user)));
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_event_cqe_notify_register_cb(
    sta: *mut doca_sta,
    cb: doca_sta_event_cqe_notify_cb_t,
    user: doca_data,
) -> doca_error_t {
    finish(
        "doca_sta_event_cqe_notify_register_cb",
        (|| {
            let mut w = world();
            let id = config_sta(&mut w, sta, "doca_sta_event_cqe_notify_register_cb")?;
            out::check_cb(cb)?;
            w.stas.get_mut(&id).expect("live").cqe_cb = Some((cb, data_as_u64(user)));
            Ok(())
        })(),
    )
}

/// The event behind a handle (valid during its callback only).
fn event(w: &World, kind: Kind, e: u64) -> Res<&Event> {
    let id = w.id_of(kind, e)?;
    match w.events.get(&id) {
        Some(ev) => Ok(ev),
        None => broken(
            &contract::DESTROYED,
            format!("{} #{id} used after its callback returned", kind.name()),
        ),
    }
}

macro_rules! ev_getter {
    ($f:ident, $evty:ty, $kind:expr, $outty:ty, |$w:ident, $ev:ident| $val:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $f(e: *const $evty, out: *mut $outty) -> doca_error_t {
            finish(
                stringify!($f),
                (|| {
                    out::check(out, "output")?;
                    let $w = world();
                    let $ev = event(&$w, $kind, e as u64)?;
                    let v: $outty = $val;
                    out::put(out, v)
                })(),
            )
        }
    };
}

fn as_transport(e: &Event) -> &TransportEv {
    match e {
        Event::Transport(t) => t,
        _ => unreachable!("kind checked"),
    }
}
fn as_timeout(e: &Event) -> &BeTimeoutEv {
    match e {
        Event::BeTimeout(t) => t,
        _ => unreachable!("kind checked"),
    }
}
fn as_cqe(e: &Event) -> &CqeEvent {
    match e {
        Event::Cqe(t) => t,
        _ => unreachable!("kind checked"),
    }
}

ev_getter!(
    doca_sta_event_transport_err_get_qp_handle,
    doca_sta_event_transport_err,
    Kind::EvTransport,
    *const doca_sta_qp_handle,
    |_w, ev| ptr(Kind::Qp, as_transport(ev).qp)
);
ev_getter!(
    doca_sta_event_transport_err_get_operation,
    doca_sta_event_transport_err,
    Kind::EvTransport,
    u32,
    |_w, ev| as_transport(ev).op
);
ev_getter!(
    doca_sta_event_transport_err_get_syndrome,
    doca_sta_event_transport_err,
    Kind::EvTransport,
    u32,
    |_w, ev| as_transport(ev).syndrome
);
ev_getter!(
    doca_sta_event_transport_err_get_vendor_syndrome,
    doca_sta_event_transport_err,
    Kind::EvTransport,
    u32,
    |_w, ev| as_transport(ev).vendor
);
ev_getter!(
    doca_sta_event_be_timeout_get_be_handle,
    doca_sta_event_be_timeout,
    Kind::EvBeTimeout,
    *const doca_sta_be_handle,
    |_w, ev| ptr(Kind::Be, as_timeout(ev).be)
);
ev_getter!(
    doca_sta_event_be_timeout_get_be_queue_handle,
    doca_sta_event_be_timeout,
    Kind::EvBeTimeout,
    *const doca_sta_be_q_handle,
    |_w, ev| ptr(Kind::BeQ, as_timeout(ev).beq)
);
ev_getter!(
    doca_sta_event_eu_err_is_fatal_error,
    doca_sta_event_eu_err,
    Kind::EvEuErr,
    bool,
    |_w, _ev| false
);
ev_getter!(
    doca_sta_event_eu_err_get_eu_handle,
    doca_sta_event_eu_err,
    Kind::EvEuErr,
    *const doca_sta_eu_handle,
    |_w, _ev| std::ptr::null()
);
ev_getter!(
    doca_sta_event_cqe_notify_get_cqe_notify_type,
    doca_sta_event_cqe_notify,
    Kind::EvCqe,
    doca_sta_cqe_notify_type,
    |_w, ev| as_cqe(ev).typ
);
ev_getter!(
    doca_sta_event_cqe_notify_get_subsystem_handle,
    doca_sta_event_cqe_notify,
    Kind::EvCqe,
    *const doca_sta_subs_handle,
    |_w, ev| ptr(Kind::Subs, as_cqe(ev).subs)
);
ev_getter!(
    doca_sta_event_cqe_notify_get_qp_handle,
    doca_sta_event_cqe_notify,
    Kind::EvCqe,
    *const doca_sta_qp_handle,
    |_w, ev| ptr(Kind::Qp, as_cqe(ev).qp)
);
ev_getter!(
    doca_sta_event_cqe_notify_get_param_err_location,
    doca_sta_event_cqe_notify,
    Kind::EvCqe,
    u16,
    |_w, ev| as_cqe(ev).pel
);

#[no_mangle]
pub unsafe extern "C" fn doca_sta_event_cqe_notify_get_cqe(
    e: *const doca_sta_event_cqe_notify,
    cqe: *mut u8,
) -> doca_error_t {
    finish(
        "doca_sta_event_cqe_notify_get_cqe",
        (|| {
            out::check(cqe, "cqe")?;
            let w = world();
            let c = as_cqe(event(&w, Kind::EvCqe, e as u64)?).cqe;
            // SAFETY: the caller gives a doca_sta_nvme_completion_t (16 bytes).
            unsafe { std::ptr::copy_nonoverlapping(c.as_ptr(), cqe, 16) };
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_event_cqe_notify_get_capsule_params(
    e: *const doca_sta_event_cqe_notify,
    opcode: *mut u8,
    cid: *mut u16,
    nsid: *mut u16,
    lba: *mut u64,
) -> doca_error_t {
    finish(
        "doca_sta_event_cqe_notify_get_capsule_params",
        (|| {
            out::check(opcode, "opcode")?;
            out::check(cid, "cid")?;
            out::check(nsid, "nsid")?;
            out::check(lba, "lba")?;
            let w = world();
            let c = as_cqe(event(&w, Kind::EvCqe, e as u64)?).clone();
            out::put(opcode, c.opcode)?;
            out::put(cid, c.cid)?;
            // The header's NSID is 16 bits wide.
            out::put(nsid, c.nsid as u16)?;
            out::put(lba, c.lba)
        })(),
    )
}

// --- backends ---------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn doca_sta_be_create(
    sta: *mut doca_sta,
    be: *mut *mut doca_sta_be_handle,
) -> doca_error_t {
    finish(
        "doca_sta_be_create",
        (|| {
            out::check(be, "be_handle")?;
            let mut w = world();
            let (sid, s) = w.sta(sta)?;
            if s.bes.len() >= caps::MAX_BE as usize {
                return code(DOCA_ERROR_FULL);
            }
            let id = w.new_id(Kind::Be);
            w.bes.insert(
                id,
                Be {
                    sta: sid,
                    queues: Vec::new(),
                    drive: RamDrive::new(),
                    nss: 0,
                },
            );
            w.stas.get_mut(&sid).expect("live").bes.push(id);
            out::put(be, ptr(Kind::Be, id))
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_be_destroy(be: *mut doca_sta_be_handle) -> doca_error_t {
    finish(
        "doca_sta_be_destroy",
        (|| {
            let mut w = world();
            let (id, b) = w.be(be)?;
            if !b.queues.is_empty() || b.nss > 0 {
                return broken(
                    &contract::BE_TEARDOWN,
                    format!(
                        "backend destroyed with {} queue(s) and {} namespace(s)",
                        b.queues.len(),
                        b.nss
                    ),
                );
            }
            let b = w.bes.remove(&id).expect("live");
            if let Some(s) = w.stas.get_mut(&b.sta) {
                s.bes.retain(|&x| x != id);
            }
            Ok(())
        })(),
    )
}

#[allow(clippy::too_many_arguments)]
#[no_mangle]
pub unsafe extern "C" fn doca_sta_be_add_queue(
    be: *mut doca_sta_be_handle,
    sq: *mut doca_mmap,
    sq_db: *mut doca_mmap,
    sq_db_off: u16,
    cq: *mut doca_mmap,
    cq_db: *mut doca_mmap,
    cq_db_off: u16,
    beq: *mut *mut doca_sta_be_q_handle,
) -> doca_error_t {
    finish(
        "doca_sta_be_add_queue",
        (|| {
            out::check(beq, "be_q_handle")?;
            let mut w = world();
            let (bid, b) = w.be(be)?;
            let sta = b.sta;
            let nq = b.queues.len();
            let sta_dev = w.stas[&sta].dev;
            let mut ids = [0u64; 4];
            for (i, (m, what)) in [
                (sq, "SQ"),
                (sq_db, "SQ doorbell"),
                (cq, "CQ"),
                (cq_db, "CQ doorbell"),
            ]
            .into_iter()
            .enumerate()
            {
                let (id, x) = w.mmap(m)?;
                if !x.started {
                    return broken(
                        &contract::BE_QUEUE,
                        format!("the {what} mmap is not started"),
                    );
                }
                if !x.devs.contains(&sta_dev) {
                    return broken(
                        &contract::BE_QUEUE,
                        format!("the {what} mmap was not given the STA device (doca_mmap_add_dev)"),
                    );
                }
                ids[i] = id;
            }
            let (s, sdb, c, cdb) = (
                &w.mmaps[&ids[0]],
                &w.mmaps[&ids[1]],
                &w.mmaps[&ids[2]],
                &w.mmaps[&ids[3]],
            );
            if s.len % 64 != 0 || c.len % 16 != 0 {
                return broken(
                    &contract::BE_QUEUE,
                    format!(
                        "SQ ring of {} bytes / CQ ring of {} bytes is not whole entries",
                        s.len, c.len
                    ),
                );
            }
            let entries = s.len / 64;
            if entries != c.len / 16
                || !entries.is_power_of_two()
                || !(2..=65536).contains(&entries)
            {
                return broken(
                &contract::BE_QUEUE,
                format!("SQ has {} entries and CQ {}; they must be equal, a power of two, 2..=65536", entries, c.len / 16),
            );
            }
            for (m, off, what) in [(sdb, sq_db_off, "SQ"), (cdb, cq_db_off, "CQ")] {
                if off as usize + 4 > m.len || off % 4 != 0 {
                    return broken(&contract::BE_QUEUE, format!("{what} doorbell offset {off} is not a 4-byte slot inside its {}-byte mmap", m.len));
                }
            }
            if nq >= caps::MAX_QS_PER_BE as usize {
                return code(DOCA_ERROR_FULL);
            }
            let null = !sdb.dmabuf && !cdb.dmabuf;
            let (sq_va, cq_va) = (s.addr, c.addr);
            let (sq_db_va, cq_db_va) =
                (sdb.addr + sq_db_off as usize, cdb.addr + cq_db_off as usize);
            for i in ids {
                w.mmaps.get_mut(&i).expect("live").users += 1;
            }
            let id = w.new_id(Kind::BeQ);
            let eu = w.new_id(Kind::Eu);
            let eu_num = 0x200 + w.beqs.len() as u16;
            w.eus.insert(
                eu,
                Eu {
                    sta,
                    name: CString::new(format!("beq{}", eu_num - 0x200)).expect("no NUL"),
                    typ: DOCA_STA_EU_BEQ,
                    id: eu_num,
                    of: id,
                    stats: Counters::new(stats::BEQ),
                },
            );
            w.stas.get_mut(&sta).expect("live").eus.push(eu);
            let mut map = Counters::new(stats::BEQ_MAP);
            map.set(0, eu_num as u64);
            let entries = entries as u32;
            w.beqs.insert(
                id,
                BeQ {
                    be: bid,
                    mmaps: ids,
                    entries,
                    sq_va,
                    cq_va,
                    sq_db_va,
                    cq_db_va,
                    sq_tail: 0,
                    cq_head: 0,
                    phase: true,
                    slots: vec![None; entries as usize],
                    free_cids: (0..entries as u16 - 1).rev().collect(),
                    waiting: Default::default(),
                    null,
                    drive_q: DriveQueue::new(),
                    destroying: false,
                    eu,
                    stats: Counters::new(stats::BEQ),
                    map,
                },
            );
            w.bes.get_mut(&bid).expect("live").queues.push(id);
            out::put(beq, ptr(Kind::BeQ, id))
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_be_task_destroy_queue_set_conf(
    sta: *mut doca_sta,
    ok: TaskCb,
    err: TaskCb,
) -> doca_error_t {
    finish(
        "doca_sta_be_task_destroy_queue_set_conf",
        (|| {
            let mut w = world();
            let id = config_sta(&mut w, sta, "doca_sta_be_task_destroy_queue_set_conf")?;
            w.stas.get_mut(&id).expect("live").beq_conf = Some(cb_pair(ok, err)?);
            Ok(())
        })(),
    )
}

pub fn new_task(w: &mut World, kind: TaskKind, owner: CtxRef, user: u64) -> (u64, &mut Task) {
    let id = w.new_id(Kind::StaTask);
    w.kinds.insert(id, Kind::StaTask);
    let t = w.tasks.entry(id).or_insert(Task {
        kind,
        owner,
        user,
        st: TaskSt::Idle,
        status: DOCA_SUCCESS,
        qp: 0,
        token: 0,
        cqe: [0; 16],
        ns: 0,
        beq: 0,
        subs: 0,
    });
    (id, t)
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_be_destroy_queue_task_alloc_init(
    beq: *mut doca_sta_be_q_handle,
    user: doca_data,
    task: *mut *mut doca_sta_producer_task_send,
) -> doca_error_t {
    finish(
        "doca_sta_be_destroy_queue_task_alloc_init",
        (|| {
            out::check(task, "task")?;
            let mut w = world();
            let (qid, q) = w.beq(beq)?;
            let be = q.be;
            let sta = w.bes[&be].sta;
            if w.stas[&sta].beq_conf.is_none() {
                return broken(
                    &contract::TASK_CONF,
                    "doca_sta_be_task_destroy_queue_set_conf was not called",
                );
            }
            let (id, t) = new_task(
                &mut w,
                TaskKind::BeqDestroy,
                CtxRef::Sta(sta),
                data_as_u64(user),
            );
            t.beq = qid;
            out::put(task, ptr(Kind::StaTask, id))
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_get_be_queue_mapping_info(
    beq: *const doca_sta_be_q_handle,
    entries: *mut *const doca_sta_eu_ctr_entry,
    n: *mut u16,
) -> doca_error_t {
    finish(
        "doca_sta_get_be_queue_mapping_info",
        (|| {
            out::check(entries, "entries")?;
            out::check(n, "num_entries")?;
            let mut w = world();
            let (_, q) = w.beq(beq)?;
            let (p, c) = q.map.entries();
            out::put(entries, p)?;
            out::put(n, c)
        })(),
    )
}

// --- subsystems and namespaces ----------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn doca_sta_subsystem_create(
    sta: *mut doca_sta,
    nqn: *const c_char,
    subs: *mut *mut doca_sta_subs_handle,
) -> doca_error_t {
    finish(
        "doca_sta_subsystem_create",
        (|| {
            out::check(nqn, "nqn")?;
            out::check(subs, "subs_handle")?;
            // SAFETY: a NUL-terminated string from the caller (checked non-NULL).
            let s = unsafe { CStr::from_ptr(nqn) }
                .to_string_lossy()
                .into_owned();
            if s.is_empty() || s.len() > 223 {
                return broken(
                    &contract::RANGE,
                    format!("NQN of {} bytes (1..=223)", s.len()),
                );
            }
            let mut w = world();
            let (sid, st) = w.sta(sta)?;
            if st.subs.len() >= caps::MAX_SUBSYS as usize {
                return code(DOCA_ERROR_FULL);
            }
            let subs_list = st.subs.clone();
            if subs_list
                .iter()
                .any(|x| w.subs.get(x).is_some_and(|x| x.nqn == s))
            {
                return code(DOCA_ERROR_ALREADY_EXIST);
            }
            let id = w.new_id(Kind::Subs);
            w.subs.insert(
                id,
                Subs {
                    sta: sid,
                    nqn: s,
                    devs: Vec::new(),
                    nss: Vec::new(),
                    qps: 0,
                },
            );
            w.stas.get_mut(&sid).expect("live").subs.push(id);
            out::put(subs, ptr(Kind::Subs, id))
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_subsystem_add_dev(
    subs: *mut doca_sta_subs_handle,
    dev: *const doca_dev,
) -> doca_error_t {
    finish(
        "doca_sta_subsystem_add_dev",
        (|| {
            let mut w = world();
            let (sid, s) = w.subsys(subs)?;
            let sta = s.sta;
            let (d, _) = w.dev(dev)?;
            if !w.stas[&sta].net_devs.contains(&d) {
                return broken(
                    &contract::DEV_ADDED,
                    "the device was not added to the main context with doca_sta_add_dev",
                );
            }
            let s = w.subs.get_mut(&sid).expect("live");
            if !s.devs.contains(&d) {
                s.devs.push(d);
            }
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_subsystem_task_rm_ns_set_conf(
    sta: *mut doca_sta,
    ok: TaskCb,
    err: TaskCb,
) -> doca_error_t {
    finish(
        "doca_sta_subsystem_task_rm_ns_set_conf",
        (|| {
            let mut w = world();
            let id = config_sta(&mut w, sta, "doca_sta_subsystem_task_rm_ns_set_conf")?;
            w.stas.get_mut(&id).expect("live").rm_ns_conf = Some(cb_pair(ok, err)?);
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_subsystem_destroy(
    subs: *mut doca_sta_subs_handle,
) -> doca_error_t {
    finish(
        "doca_sta_subsystem_destroy",
        (|| {
            let mut w = world();
            let (id, s) = w.subsys(subs)?;
            if !s.nss.is_empty() || s.qps > 0 {
                return broken(
                    &contract::SUBSYS_NS,
                    format!(
                        "subsystem {} destroyed with {} namespace(s) and {} QP(s)",
                        s.nqn,
                        s.nss.len(),
                        s.qps
                    ),
                );
            }
            let s = w.subs.remove(&id).expect("live");
            if let Some(st) = w.stas.get_mut(&s.sta) {
                st.subs.retain(|&x| x != id);
            }
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_subsystem_add_ns(
    subs: *mut doca_sta_subs_handle,
    fe: u32,
    bs: u32,
    be_nsid: u32,
    be: *mut doca_sta_be_handle,
    ns: *mut *mut doca_sta_ns_handle,
) -> doca_error_t {
    finish(
        "doca_sta_subsystem_add_ns",
        (|| {
            out::check(ns, "ns_handle")?;
            let mut w = world();
            let (sid, s) = w.subsys(subs)?;
            let (sta, list) = (s.sta, s.nss.clone());
            let (bid, b) = w.be(be)?;
            if b.sta != sta {
                return broken(
                    &contract::HANDLE,
                    "the backend belongs to another main context",
                );
            }
            if fe == 0 || fe == u32::MAX {
                return broken(&contract::NS_ARGS, format!("front-end NSID {fe:#x}"));
            }
            if list
                .iter()
                .any(|n| w.nss.get(n).is_some_and(|n| n.fe == fe))
            {
                return broken(
                    &contract::NS_ARGS,
                    format!("NSID {fe} is already in the subsystem"),
                );
            }
            if be_nsid == 0 {
                return broken(&contract::NS_ARGS, "backend NSID 0");
            }
            if !caps::BLOCK_SIZES.contains(&bs) {
                return broken(
                    &contract::NS_ARGS,
                    format!("block size {bs} (supported: 512, 4096)"),
                );
            }
            if list.len() >= caps::MAX_NS_PER_SUBS as usize {
                return code(DOCA_ERROR_FULL);
            }
            let id = w.new_id(Kind::Ns);
            w.nss.insert(
                id,
                Ns {
                    subs: sid,
                    fe,
                    bs,
                    be_nsid,
                    be: bid,
                    removing: false,
                    by_task: false,
                    inflight: 0,
                    stats: Counters::new(stats::NS),
                },
            );
            w.subs.get_mut(&sid).expect("live").nss.push(id);
            w.bes.get_mut(&bid).expect("live").nss += 1;
            out::put(ns, ptr(Kind::Ns, id))
        })(),
    )
}

fn ns_of(
    w: &mut World,
    subs: *mut doca_sta_subs_handle,
    ns: *mut doca_sta_ns_handle,
) -> Res<(u64, u64)> {
    let (sid, _) = w.subsys(subs)?;
    let (nid, n) = w.ns(ns)?;
    if n.subs != sid {
        return broken(
            &contract::NS_STATE,
            "the namespace belongs to another subsystem",
        );
    }
    Ok((sid, nid))
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_subsystem_rm_ns(
    subs: *mut doca_sta_subs_handle,
    ns: *mut doca_sta_ns_handle,
) -> doca_error_t {
    finish(
        "doca_sta_subsystem_rm_ns",
        (|| {
            let mut w = world();
            let (sid, nid) = ns_of(&mut w, subs, ns)?;
            let n = w.nss.get_mut(&nid).expect("live");
            if n.by_task {
                return broken(&contract::NS_STATE, "namespace is being removed by a task");
            }
            // New I/O to it stops now; the call succeeds once nothing is in flight (until
            // then it answers DOCA_ERROR_AGAIN and may be called again).
            n.removing = true;
            if n.inflight > 0 {
                return code(DOCA_ERROR_AGAIN);
            }
            let n = w.nss.remove(&nid).expect("live");
            w.subs
                .get_mut(&sid)
                .expect("live")
                .nss
                .retain(|&x| x != nid);
            if let Some(b) = w.bes.get_mut(&n.be) {
                b.nss = b.nss.saturating_sub(1);
            }
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_subsystem_task_rm_ns_alloc_init(
    subs: *mut doca_sta_subs_handle,
    ns: *mut doca_sta_ns_handle,
    user: doca_data,
    task: *mut *mut doca_sta_producer_task_send,
) -> doca_error_t {
    finish(
        "doca_sta_subsystem_task_rm_ns_alloc_init",
        (|| {
            out::check(task, "task")?;
            let mut w = world();
            let (sid, nid) = ns_of(&mut w, subs, ns)?;
            let sta = w.subs[&sid].sta;
            if w.stas[&sta].rm_ns_conf.is_none() {
                return broken(
                    &contract::TASK_CONF,
                    "doca_sta_subsystem_task_rm_ns_set_conf was not called",
                );
            }
            let (id, t) = new_task(&mut w, TaskKind::RmNs, CtxRef::Sta(sta), data_as_u64(user));
            t.ns = nid;
            t.subs = sid;
            out::put(task, ptr(Kind::StaTask, id))
        })(),
    )
}

// --- statistics -------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn doca_sta_get_eu_handle(
    sta: *const doca_sta,
    arr: *mut *mut doca_sta_eu_handle,
    n: *mut u32,
) -> doca_error_t {
    finish(
        "doca_sta_get_eu_handle",
        (|| {
            out::check(arr, "eu_handle_arr")?;
            out::check(n, "arr_size")?;
            let mut w = world();
            let (_, s) = w.sta(sta)?;
            let eus = s.eus.clone();
            // SAFETY: `n` is a valid in/out pointer (checked non-NULL).
            let cap = unsafe { n.read() } as usize;
            let k = eus.len().min(cap);
            for (i, e) in eus.iter().take(k).enumerate() {
                // SAFETY: the caller's array has `cap` >= k entries.
                unsafe { arr.add(i).write(ptr(Kind::Eu, *e)) };
            }
            out::put(n, k as u32)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_get_eu_name(
    eu: *const doca_sta_eu_handle,
    name: *mut *const c_char,
) -> doca_error_t {
    finish(
        "doca_sta_get_eu_name",
        (|| {
            out::check(name, "name")?;
            let mut w = world();
            let p = w.eu(eu)?.1.name.as_ptr();
            out::put(name, p)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_get_eu_type(
    eu: *const doca_sta_eu_handle,
    t: *mut dpa_sta_eu_type,
) -> doca_error_t {
    finish(
        "doca_sta_get_eu_type",
        (|| {
            out::check(t, "type")?;
            let v = world().eu(eu)?.1.typ;
            out::put(t, v)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_get_eu_id(
    eu: *const doca_sta_eu_handle,
    id: *mut u16,
) -> doca_error_t {
    finish(
        "doca_sta_get_eu_id",
        (|| {
            out::check(id, "eu_id")?;
            let v = world().eu(eu)?.1.id;
            out::put(id, v)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_get_eu_port(
    eu: *const doca_sta_eu_handle,
    port: *mut u16,
) -> doca_error_t {
    finish(
        "doca_sta_get_eu_port",
        (|| {
            out::check(port, "port")?;
            world().eu(eu)?;
            out::put(port, 1)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_get_eu_state(
    eu: *mut doca_sta_eu_handle,
    st: *mut dpa_sta_eu_state,
) -> doca_error_t {
    finish(
        "doca_sta_get_eu_state",
        (|| {
            out::check(st, "state")?;
            let mut w = world();
            let (_, e) = w.eu(eu)?;
            let (typ, of, sta) = (e.typ, e.of, e.sta);
            let running = match typ {
                DOCA_STA_EU_BEQ => w.stas.get(&sta).is_some_and(|s| s.ctx.running()),
                _ => w.ios.get(&of).is_some_and(|i| i.ctx.running()),
            };
            out::put(
                st,
                if running {
                    DOCA_STA_EU_STATE_STARTED
                } else {
                    DOCA_STA_EU_STATE_IDLE
                },
            )
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_get_eu_stats(
    eu: *mut doca_sta_eu_handle,
    entries: *mut *const doca_sta_eu_ctr_entry,
    n: *mut u16,
) -> doca_error_t {
    finish(
        "doca_sta_get_eu_stats",
        (|| {
            out::check(entries, "entries")?;
            out::check(n, "num_entries")?;
            let mut w = world();
            let (p, c) = w.eu(eu)?.1.stats.entries();
            out::put(entries, p)?;
            out::put(n, c)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_eu_reset_stats_handle(
    eu: *mut doca_sta_eu_handle,
) -> doca_error_t {
    finish(
        "doca_sta_eu_reset_stats_handle",
        (|| {
            world().eu(eu)?.1.stats.reset();
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_eu_reset_stats_type(
    sta: *mut doca_sta,
    t: dpa_sta_eu_type,
) -> doca_error_t {
    finish(
        "doca_sta_eu_reset_stats_type",
        (|| {
            let mut w = world();
            let (_, s) = w.sta(sta)?;
            if t == DOCA_STA_EU_TYPE_UNKNOWN || t > DOCA_STA_EU_MAX {
                return broken(&contract::RANGE, format!("EU type {t}"));
            }
            for e in s.eus.clone() {
                if let Some(e) = w.eus.get_mut(&e) {
                    if t == DOCA_STA_EU_MAX || e.typ == t {
                        e.stats.reset();
                    }
                }
            }
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_get_eu_connect_qp_stats(
    eu: *mut doca_sta_eu_handle,
    arr: *mut *mut doca_sta_qp_handle,
    n: *mut u16,
) -> doca_error_t {
    finish(
        "doca_sta_get_eu_connect_qp_stats",
        (|| {
            out::check(n, "arr_size")?;
            let mut w = world();
            let (_, e) = w.eu(eu)?;
            let (typ, of) = (e.typ, e.of);
            let qps: Vec<u64> = if typ == DOCA_STA_EU_COMP {
                w.ios.get(&of).map(|i| i.qps.clone()).unwrap_or_default()
            } else {
                Vec::new()
            };
            if arr.is_null() {
                return out::put(n, qps.len().min(u16::MAX as usize) as u16);
            }
            // SAFETY: valid in/out pointer (checked).
            let cap = unsafe { n.read() } as usize;
            let k = qps.len().min(cap);
            for (i, q) in qps.iter().take(k).enumerate() {
                // SAFETY: the caller's array has `cap` >= k entries.
                unsafe { arr.add(i).write(ptr(Kind::Qp, *q)) };
            }
            out::put(n, k as u16)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_get_be_queue_stats(
    be: *mut doca_sta_be_handle,
    beq: *mut doca_sta_be_q_handle,
    entries: *mut *const doca_sta_eu_ctr_entry,
    n: *mut u16,
) -> doca_error_t {
    finish(
        "doca_sta_get_be_queue_stats",
        (|| {
            out::check(entries, "entries")?;
            out::check(n, "num_entries")?;
            let mut w = world();
            let (bid, _) = w.be(be)?;
            let (_, q) = w.beq(beq)?;
            if q.be != bid {
                return broken(
                    &contract::HANDLE,
                    "the backend queue belongs to another backend",
                );
            }
            let (p, c) = q.stats.entries();
            out::put(entries, p)?;
            out::put(n, c)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_get_ns_stats(
    subs: *mut doca_sta_subs_handle,
    ns: *mut doca_sta_ns_handle,
    entries: *mut *const doca_sta_eu_ctr_entry,
    n: *mut u16,
) -> doca_error_t {
    finish(
        "doca_sta_get_ns_stats",
        (|| {
            out::check(entries, "entries")?;
            out::check(n, "num_entries")?;
            let mut w = world();
            let (_, nid) = ns_of(&mut w, subs, ns)?;
            let (p, c) = w.nss[&nid].stats.entries();
            out::put(entries, p)?;
            out::put(n, c)
        })(),
    )
}
