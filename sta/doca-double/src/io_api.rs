//! IO contexts and QPs: `doca_sta_io.h`, `doca_sta_io_qp.h`, `doca_sta_io_non_offload.h`
//! and the transport-error event of `doca_sta_event.h`.
//!
//! `qp_accept`/`qp_connect` take the application's `rdma_cm_id` (a connect request the
//! application took from its own CM event channel), create the completion queue and the
//! RC QP on the id's verbs device, post receives for the queue depth (the CRQSIZE of the
//! accept private data the application passes, else the maximum queue size) and accept
//! with that private data. `qp_accept` leaves the id to the application; `qp_connect`
//! takes it over and destroys it with the QP, or at once when it fails (doca-sta-api.md
//! 5.9). An id made by `doca_double_loop_create` is accepted onto the loopback host.
//!
//! Why one file of ~1000 lines: these headers describe one object family (an IO context,
//! its QPs and their tasks), whose checks share the same lookups; the data path they
//! start lives in `engine`.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_void, CString};

use doca_sys::*;

use crate::contract::{self, broken, code, finish, Broken, Res};
use crate::engine::{self, caps};
use crate::link::{self, Link};
use crate::out;
use crate::sta_api::new_task;
use crate::stats::{self, Counters};
use crate::world::*;

fn config_io(w: &mut World, io: *const doca_sta_io, what: &str) -> Res<u64> {
    let (id, i) = w.io(io)?;
    if !i.ctx.idle() {
        return broken(
            &contract::CONFIG_BEFORE_START,
            format!("{what} after doca_ctx_start of the IO context"),
        );
    }
    Ok(id)
}

/// An IO context in use: running, and on its thread.
fn running_io(w: &mut World, io: *const doca_sta_io) -> Res<u64> {
    let (id, i) = w.io(io)?;
    if !i.ctx.running() {
        return broken(
            &contract::IO_RUNNING,
            format!(
                "IO context #{id} is not running (doca_ctx_start, then progress until RUNNING)"
            ),
        );
    }
    engine::check_owner(w, id)?;
    Ok(id)
}

/// A QP of IO context `io`.
fn own_qp(w: &mut World, io: u64, qp: *const doca_sta_qp_handle) -> Res<u64> {
    let (id, q) = w.qp(qp)?;
    if q.io != io {
        return broken(
            &contract::QP_OWNER,
            format!("QP #{id} belongs to IO context #{}, used with #{io}", q.io),
        );
    }
    Ok(id)
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_create(
    sta: *mut doca_sta,
    io: *mut *mut doca_sta_io,
) -> doca_error_t {
    finish(
        "doca_sta_io_create",
        (|| {
            out::check(io, "sta_io")?;
            let mut w = world();
            let (sid, _) = w.sta(sta)?;
            let s = &w.stas[&sid];
            if !s.ctx.running() {
                return broken(
                    &contract::MAIN_RUNNING,
                    "doca_sta_io_create while the main context is not running",
                );
            }
            if s.ios.len() >= s.max_io as usize {
                return broken(
                    &contract::IO_COUNT,
                    format!("doca_sta_set_max_sta_io allowed {} IO context(s)", s.max_io),
                );
            }
            let used: Vec<u16> = s
                .ios
                .iter()
                .filter_map(|i| w.ios.get(i).map(|i| i.index))
                .collect();
            let index = (0..).find(|i| !used.contains(i)).unwrap_or(0);
            let id = w.new_id(Kind::Io);
            let mk_eu = |w: &mut World, typ, num: u16, name: String, names| {
                let e = w.new_id(Kind::Eu);
                w.eus.insert(
                    e,
                    Eu {
                        sta: sid,
                        name: CString::new(name).expect("no NUL"),
                        typ,
                        id: num,
                        of: id,
                        stats: Counters::new(names),
                    },
                );
                w.stas.get_mut(&sid).expect("live").eus.push(e);
                e
            };
            let eu_comp = mk_eu(
                &mut w,
                DOCA_STA_EU_COMP,
                index,
                format!("comp{index}"),
                stats::EU_COMP,
            );
            let eu_tx = mk_eu(
                &mut w,
                DOCA_STA_EU_TX,
                0x100 + index,
                format!("tx{index}"),
                stats::EU_TX,
            );
            w.ios.insert(
                id,
                Io {
                    ctx: Ctx::new(),
                    sta: sid,
                    index,
                    qps: Vec::new(),
                    non_offload: None,
                    ws_conf: None,
                    rd_conf: None,
                    disc_conf: None,
                    terr_cb: None,
                    owner: None,
                    verbs: Default::default(),
                    bufs: Vec::new(),
                    bufs_total: 0,
                    eu_comp,
                    eu_tx,
                    tasks: 0,
                },
            );
            let s = w.stas.get_mut(&sid).expect("live");
            s.ios.push(id);
            s.io_created += 1;
            out::put(io, ptr(Kind::Io, id))
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_destroy(io: *mut doca_sta_io) -> doca_error_t {
    finish(
        "doca_sta_io_destroy",
        (|| {
            let mut w = world();
            let (id, i) = w.io(io)?;
            if !i.ctx.idle() {
                return broken(
                    &contract::TEARDOWN,
                    "doca_sta_io_destroy of an IO context that is not stopped",
                );
            }
            if !i.qps.is_empty() {
                return broken(
                    &contract::TEARDOWN,
                    format!(
                        "doca_sta_io_destroy with {} QP(s) not destroyed",
                        i.qps.len()
                    ),
                );
            }
            let mut i = w.ios.remove(&id).expect("live");
            if let Some(p) = i.ctx.pe.and_then(|p| w.pes.get_mut(&p)) {
                p.ctxs.retain(|c| *c != CtxRef::Io(id));
            }
            let alloc = w.stas.get(&i.sta).and_then(|s| s.alloc);
            for mut b in i.bufs.drain(..) {
                link::dereg(&mut b);
                if let Some(a) = alloc.as_ref() {
                    crate::mem::free_buf(a, &mut w.mem, b);
                }
            }
            if let Ok(lib) = sta::verbs::lib() {
                i.verbs.destroy(lib);
            }
            for e in [i.eu_comp, i.eu_tx] {
                w.eus.remove(&e);
            }
            if let Some(s) = w.stas.get_mut(&i.sta) {
                s.ios.retain(|&x| x != id);
                s.eus.retain(|&e| e != i.eu_comp && e != i.eu_tx);
            }
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_as_ctx(io: *mut doca_sta_io) -> *mut doca_ctx {
    let mut w = world();
    match w.io(io) {
        Ok((id, _)) => CtxRef::Io(id).handle(),
        Err(b) => {
            drop(w);
            contract::violation("doca_sta_io_as_ctx", b.rule, b.detail);
            std::ptr::null_mut()
        }
    }
}

fn set_conf(
    func: &str,
    io: *mut doca_sta_io,
    ok: TaskCb,
    err: TaskCb,
    f: fn(&mut Io) -> &mut Option<(TaskCb, TaskCb)>,
) -> doca_error_t {
    finish(
        func,
        (|| {
            let mut w = world();
            let id = config_io(&mut w, io, func)?;
            if ok.is_none() || err.is_none() {
                return broken(
                    &contract::NULL_ARG,
                    "task completion and error callbacks must both be given",
                );
            }
            *f(w.ios.get_mut(&id).expect("live")) = Some((ok, err));
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_task_disconnect_set_conf(
    io: *mut doca_sta_io,
    ok: TaskCb,
    err: TaskCb,
) -> doca_error_t {
    set_conf("doca_sta_io_task_disconnect_set_conf", io, ok, err, |i| {
        &mut i.disc_conf
    })
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_task_non_offload_set_rdma_write_send_conf(
    io: *mut doca_sta_io,
    ok: TaskCb,
    err: TaskCb,
) -> doca_error_t {
    set_conf(
        "doca_sta_io_task_non_offload_set_rdma_write_send_conf",
        io,
        ok,
        err,
        |i| &mut i.ws_conf,
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_task_non_offload_set_rdma_read_conf(
    io: *mut doca_sta_io,
    ok: TaskCb,
    err: TaskCb,
) -> doca_error_t {
    set_conf(
        "doca_sta_io_task_non_offload_set_rdma_read_conf",
        io,
        ok,
        err,
        |i| &mut i.rd_conf,
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_non_offload_register_cb(
    io: *mut doca_sta_io,
    cb: doca_sta_io_non_offload_cb_t,
    user: doca_data,
) -> doca_error_t {
    finish(
        "doca_sta_io_non_offload_register_cb",
        (|| {
            let mut w = world();
            let id = config_io(&mut w, io, "doca_sta_io_non_offload_register_cb")?;
            out::check_cb(cb)?;
            w.ios.get_mut(&id).expect("live").non_offload = Some((cb, data_as_u64(user)));
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_event_transport_err_register_cb(
    io: *mut doca_sta_io,
    cb: doca_sta_event_transport_err_cb_t,
    user: doca_data,
) -> doca_error_t {
    finish(
        "doca_sta_io_event_transport_err_register_cb",
        (|| {
            let mut w = world();
            let id = config_io(&mut w, io, "doca_sta_io_event_transport_err_register_cb")?;
            out::check_cb(cb)?;
            w.ios.get_mut(&id).expect("live").terr_cb = Some((cb, data_as_u64(user)));
            Ok(())
        })(),
    )
}

// --- QPs --------------------------------------------------------------------------------

fn alloc_qp(w: &mut World, io: u64, dev: *const doca_dev) -> Res<u64> {
    let (d, _) = w.dev(dev)?;
    let sta = w.ios[&io].sta;
    if !w.stas[&sta].net_devs.contains(&d) {
        return broken(
            &contract::DEV_ADDED,
            "QP on a device not added with doca_sta_add_dev",
        );
    }
    if w.stas[&sta].qp_count >= caps::MAX_QPS {
        return code(DOCA_ERROR_FULL);
    }
    let reused = w.reusable_qps.as_mut().and_then(Vec::pop);
    let id = reused.unwrap_or_else(|| w.new_id(Kind::Qp));
    let i = w.ios.get_mut(&io).expect("live");
    let index = i.qps.len() as u16;
    i.qps.push(id);
    w.stas.get_mut(&sta).expect("live").qp_count += 1;
    w.qps.insert(
        id,
        Qp {
            io,
            dev: d,
            user: 0,
            st: QpSt::Allocated,
            subs: None,
            sq_size: None,
            qid: 0,
            sqhd: 0,
            depth: caps::MAX_IO_QUEUE_SIZE as u16,
            link: None,
            cmds: Vec::new(),
            free_cmds: Vec::new(),
            disc_task: None,
            disc_done: false,
            error_reported: false,
            index,
            qpn: 0,
        },
    );
    Ok(id)
}

fn remove_qp(w: &mut World, id: u64) {
    let Some(mut q) = w.qps.remove(&id) else {
        return;
    };
    if let Some(ids) = w.reusable_qps.as_mut() {
        ids.push(id);
    }
    if let Some(l) = q.link.take() {
        l.destroy(&mut w.loops);
    }
    if let Some(s) = q.subs.and_then(|s| w.subs.get_mut(&s)) {
        s.qps = s.qps.saturating_sub(1);
    }
    let sta = w.ios.get(&q.io).map(|i| i.sta);
    if let Some(s) = sta.and_then(|s| w.stas.get_mut(&s)) {
        s.qp_count = s.qp_count.saturating_sub(1);
    }
    if let Some(i) = w.ios.get_mut(&q.io) {
        i.qps.retain(|&x| x != id);
        // The QP is gone, so no work request refers to the buffers any more.
        for c in q.cmds.iter_mut() {
            if let Some(b) = c.buf.take() {
                i.bufs.push(b);
            }
        }
    }
}

fn verbs_name(id: *mut sta::verbs::ffi::RdmaCmIdRaw) -> Option<String> {
    // SAFETY: the application hands a live rdma_cm_id; `verbs` is its device context and
    // `device` the struct ibv_device it belongs to (the first field of ibv_context).
    let dev = unsafe {
        let ctx = (*id).verbs;
        if ctx.is_null() {
            return None;
        }
        (*ctx).device
    };
    // SAFETY: libibverbs is loaded (the id came from librdmacm, which needs it).
    let verbs = unsafe { libloading::Library::new("libibverbs.so.1") }.ok()?;
    // SAFETY: ibv_get_device_name(struct ibv_device *) -> const char * (rdma-core ABI).
    let f = unsafe {
        verbs.get::<unsafe extern "C" fn(*mut c_void) -> *const std::ffi::c_char>(
            b"ibv_get_device_name\0",
        )
    }
    .ok()?;
    // SAFETY: a NUL-terminated name owned by the device, copied at once.
    let p = unsafe { f(dev) };
    if p.is_null() {
        return None;
    }
    // SAFETY: as above.
    Some(
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned(),
    )
}

#[allow(clippy::too_many_arguments)]
fn accept(
    w: &mut World,
    io: u64,
    qp: u64,
    dev: *const doca_dev,
    cm_id: *mut rdma_cm_id,
    priv_data: *const c_void,
    priv_size: u32,
    subs: *mut doca_sta_subs_handle,
    owns_id: bool,
) -> Res<()> {
    let (d, _) = w.dev(dev)?;
    let q = &w.qps[&qp];
    if q.st != QpSt::Allocated {
        return broken(
            &contract::QP_STATE,
            format!("accept on a QP in state {:?}", q.st),
        );
    }
    if q.dev != d {
        return broken(
            &contract::DEV_ADDED,
            "accept on a device other than the one the QP was allocated on",
        );
    }
    if cm_id.is_null() {
        return broken(&contract::NULL_ARG, "cm_id is NULL");
    }
    if priv_size > 196 || (priv_size > 0 && priv_data.is_null()) {
        return broken(
            &contract::RANGE,
            format!("private data of {priv_size} bytes (at most 196, not NULL)"),
        );
    }
    let pd: Vec<u8> = if priv_size > 0 {
        // SAFETY: `priv_size` readable bytes at `priv_data` (checked non-NULL).
        unsafe { std::slice::from_raw_parts(priv_data as *const u8, priv_size as usize) }.to_vec()
    } else {
        Vec::new()
    };
    let subs_id = if subs.is_null() {
        None
    } else {
        let (sid, s) = w.subsys(subs)?;
        if !s.devs.contains(&d) {
            return broken(
                &contract::DEV_ADDED,
                "the subsystem was not given this device (doca_sta_subsystem_add_dev)",
            );
        }
        Some(sid)
    };
    // NVMe-oF accept private data: RECFMT, CRQSIZE (the queue depth served).
    let depth = if pd.len() >= 4 {
        u16::from_le_bytes([pd[2], pd[3]])
    } else {
        0
    };
    let depth = if depth == 0 {
        caps::MAX_IO_QUEUE_SIZE as u16
    } else {
        depth.min(caps::MAX_IO_QUEUE_SIZE as u16)
    };
    let v = cm_id as u64;
    let mut link = match decode(v) {
        Some((k, lid)) if k == Kind::Loop as u8 => {
            let Some(h) = w.loops.get_mut(&lid) else {
                return Err(w.missing(Kind::Loop, lid).into());
            };
            if h.attached {
                return broken(
                    &contract::QP_STATE,
                    "this loopback cm_id was accepted already",
                );
            }
            h.attached = true;
            h.accept_data = pd;
            Link::new_loop(lid, depth)
        }
        Some(_) => {
            return Err(Broken::new(
                &contract::HANDLE,
                "cm_id is a handle of this library, not an rdma_cm_id",
            )
            .into())
        }
        None => {
            let info = w.devs[&d].info;
            let di = &w.devinfos[&info];
            if !di.verbs {
                return broken(
                    &contract::DEV_ADDED,
                    format!(
                        "{} is a test device without verbs; it cannot carry an rdma_cm_id",
                        di.name
                    ),
                );
            }
            let want = di.name.clone();
            let raw = cm_id as *mut sta::verbs::ffi::RdmaCmIdRaw;
            if let Some(got) = verbs_name(raw) {
                if got != want {
                    return broken(
                        &contract::DEV_ADDED,
                        format!("the cm_id arrived on {got}, the doca_dev is {want}"),
                    );
                }
            }
            let io_verbs = &mut w.ios.get_mut(&io).expect("live").verbs;
            match link::accept_verbs(io_verbs, raw, depth, &pd) {
                Ok((l, fd)) => {
                    // The QP's own completion channel; closing it (after the grace
                    // period, sta::verbs::reap_dead_channels) takes it out of the epoll set.
                    let pe = w.ios[&io].ctx.pe;
                    if let Some(p) = pe.and_then(|p| w.pes.get(&p)) {
                        p.notify.add_fd(fd);
                    }
                    l
                }
                Err(e) => {
                    eprintln!("doca-double: QP accept on {want} failed: {e}");
                    return code(DOCA_ERROR_DRIVER);
                }
            }
        }
    };
    if owns_id {
        link::set_owns_id(&mut link);
    }
    let qpn = link.qpn();
    let q = w.qps.get_mut(&qp).expect("live");
    q.link = Some(link);
    q.depth = depth;
    q.qpn = qpn;
    q.st = QpSt::Accepted;
    if let Some(s) = subs_id {
        q.subs = Some(s);
        w.subs.get_mut(&s).expect("live").qps += 1;
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_qp_alloc(
    io: *mut doca_sta_io,
    dev: *const doca_dev,
    qp: *mut *mut doca_sta_qp_handle,
) -> doca_error_t {
    finish(
        "doca_sta_io_qp_alloc",
        (|| {
            out::check(qp, "qp_handle")?;
            let mut w = world();
            let io = running_io(&mut w, io)?;
            let id = alloc_qp(&mut w, io, dev)?;
            out::put(qp, ptr(Kind::Qp, id))
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_qp_accept(
    io: *mut doca_sta_io,
    qp: *mut doca_sta_qp_handle,
    dev: *const doca_dev,
    cm_id: *mut rdma_cm_id,
    priv_data: *const c_void,
    priv_size: u32,
    subs: *mut doca_sta_subs_handle,
) -> doca_error_t {
    finish(
        "doca_sta_io_qp_accept",
        (|| {
            let mut w = world();
            let io = running_io(&mut w, io)?;
            let q = own_qp(&mut w, io, qp)?;
            accept(&mut w, io, q, dev, cm_id, priv_data, priv_size, subs, false)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_qp_connect(
    io: *mut doca_sta_io,
    dev: *const doca_dev,
    cm_id: *mut rdma_cm_id,
    priv_data: *const c_void,
    priv_size: u32,
    subs: *mut doca_sta_subs_handle,
    qp: *mut *mut doca_sta_qp_handle,
) -> doca_error_t {
    let r = (|| {
        out::check(qp, "qp_handle")?;
        let mut w = world();
        let io = running_io(&mut w, io)?;
        let id = alloc_qp(&mut w, io, dev)?;
        if let Err(e) = accept(&mut w, io, id, dev, cm_id, priv_data, priv_size, subs, true) {
            remove_qp(&mut w, id);
            return Err(e);
        }
        out::put(qp, ptr(Kind::Qp, id))
    })();
    if r.is_err() && !cm_id.is_null() && decode(cm_id as u64).is_none() {
        // The library owns the id whatever the outcome (doca-sta-api.md 5.9).
        if let Ok(lib) = sta::verbs::lib() {
            // SAFETY: the application gave up this connect-request id; nobody uses it.
            unsafe {
                (lib.reject)(cm_id as *mut _, std::ptr::null(), 0);
                (lib.destroy_id)(cm_id as *mut _);
            }
        }
    }
    finish("doca_sta_io_qp_connect", r)
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_qp_set_user_data(
    io: *mut doca_sta_io,
    qp: *mut doca_sta_qp_handle,
    user: doca_data,
) -> doca_error_t {
    finish(
        "doca_sta_io_qp_set_user_data",
        (|| {
            let mut w = world();
            let (io, _) = w.io(io)?;
            let q = own_qp(&mut w, io, qp)?;
            w.qps.get_mut(&q).expect("live").user = data_as_u64(user);
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_qp_get_user_data(
    qp: *const doca_sta_qp_handle,
    user: *mut doca_data,
) -> doca_error_t {
    finish(
        "doca_sta_io_qp_get_user_data",
        (|| {
            out::check(user, "user_data")?;
            let u = world().qp(qp)?.1.user;
            out::put(user, data_u64(u))
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_qp_connect_set_sq_size(
    io: *mut doca_sta_io,
    qp: *mut doca_sta_qp_handle,
    sq_size: u16,
) -> doca_error_t {
    finish(
        "doca_sta_io_qp_connect_set_sq_size",
        (|| {
            let mut w = world();
            let io = running_io(&mut w, io)?;
            let id = own_qp(&mut w, io, qp)?;
            let q = w.qps.get_mut(&id).expect("live");
            if q.sq_size.is_some() {
                return broken(&contract::SQ_SIZE, "called a second time for this QP");
            }
            if sq_size == 0 || sq_size as u32 + 1 > caps::MAX_IO_QUEUE_SIZE {
                return broken(
                    &contract::SQ_SIZE,
                    format!(
                        "sq_size {sq_size} (0's based; at most {})",
                        caps::MAX_IO_QUEUE_SIZE - 1
                    ),
                );
            }
            if !q
                .cmds
                .iter()
                .any(|c| matches!(c.st, CmdSt::App | CmdSt::AppReading))
            {
                return broken(
                    &contract::SQ_SIZE,
                    "no non-offloaded command (the Fabrics Connect) is outstanding on the QP",
                );
            }
            q.sq_size = Some(sq_size);
            q.sqhd %= sq_size + 1;
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_qp_connect_established(
    io: *mut doca_sta_io,
    qp: *mut doca_sta_qp_handle,
) -> doca_error_t {
    finish(
        "doca_sta_io_qp_connect_established",
        (|| {
            let mut w = world();
            let io = running_io(&mut w, io)?;
            let id = own_qp(&mut w, io, qp)?;
            let q = w.qps.get_mut(&id).expect("live");
            if q.st != QpSt::Accepted {
                return broken(
                    &contract::QP_STATE,
                    format!("connect_established on a QP in state {:?}", q.st),
                );
            }
            q.st = QpSt::Established;
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_qp_destroy(
    io: *mut doca_sta_io,
    qp: *mut doca_sta_qp_handle,
) -> doca_error_t {
    finish(
        "doca_sta_io_qp_destroy",
        (|| {
            let mut w = world();
            let (io, _) = w.io(io)?;
            engine::check_owner(&mut w, io)?;
            let id = own_qp(&mut w, io, qp)?;
            let st = w.qps[&id].st;
            if !matches!(st, QpSt::Allocated | QpSt::Disconnected) {
                return broken(
                    &contract::QP_DESTROY,
                    format!("QP #{id} destroyed in state {st:?}"),
                );
            }
            remove_qp(&mut w, id);
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_qp_add_subsystem(
    io: *mut doca_sta_io,
    subs: *const doca_sta_subs_handle,
    qp: *mut doca_sta_qp_handle,
) -> doca_error_t {
    finish(
        "doca_sta_io_qp_add_subsystem",
        (|| {
            let mut w = world();
            let io = running_io(&mut w, io)?;
            let id = own_qp(&mut w, io, qp)?;
            let (sid, _) = w.subsys(subs)?;
            let dev = w.qps[&id].dev;
            if !w.subs[&sid].devs.contains(&dev) {
                return broken(
                    &contract::DEV_ADDED,
                    "the subsystem was not given the QP's device (doca_sta_subsystem_add_dev)",
                );
            }
            let q = w.qps.get_mut(&id).expect("live");
            if q.subs.is_some() {
                return broken(&contract::QP_STATE, "the QP already has a subsystem");
            }
            if !matches!(q.st, QpSt::Accepted | QpSt::Established) {
                return broken(
                    &contract::QP_STATE,
                    format!("subsystem added to a QP in state {:?}", q.st),
                );
            }
            q.subs = Some(sid);
            w.subs.get_mut(&sid).expect("live").qps += 1;
            Ok(())
        })(),
    )
}

macro_rules! qp_getter {
    ($f:ident, $t:ty, |$w:ident, $q:ident| $v:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $f(qp: *mut doca_sta_qp_handle, out: *mut $t) -> doca_error_t {
            finish(
                stringify!($f),
                (|| {
                    out::check(out, "output")?;
                    let mut $w = world();
                    let (_, $q) = $w.qp(qp)?;
                    let v: $t = $v;
                    out::put(out, v)
                })(),
            )
        }
    };
}

qp_getter!(doca_sta_io_qp_get_id, u32, |w, q| q.qpn);
qp_getter!(doca_sta_io_qp_get_port_id, u16, |w, _q| 1);
qp_getter!(doca_sta_io_qp_get_index_in_group, u16, |w, q| q.index);

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_qp_get_group_id(
    qp: *mut doca_sta_qp_handle,
    out: *mut u16,
) -> doca_error_t {
    finish(
        "doca_sta_io_qp_get_group_id",
        (|| {
            out::check(out, "group_id")?;
            let mut w = world();
            let io = w.qp(qp)?.1.io;
            let v = w.ios.get(&io).map_or(0, |i| i.index);
            out::put(out, v)
        })(),
    )
}

// --- tasks ------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_task_disconnect_alloc_init(
    io: *mut doca_sta_io,
    user: doca_data,
    qp: *mut doca_sta_qp_handle,
    task: *mut *mut doca_sta_producer_task_send,
) -> doca_error_t {
    finish(
        "doca_sta_io_task_disconnect_alloc_init",
        (|| {
            out::check(task, "task")?;
            let mut w = world();
            let io = running_io(&mut w, io)?;
            let q = own_qp(&mut w, io, qp)?;
            if w.ios[&io].disc_conf.is_none() {
                return broken(
                    &contract::TASK_CONF,
                    "doca_sta_io_task_disconnect_set_conf was not called",
                );
            }
            let (id, t) = new_task(
                &mut w,
                TaskKind::Disconnect,
                CtxRef::Io(io),
                data_as_u64(user),
            );
            t.qp = q;
            out::put(task, ptr(Kind::StaTask, id))
        })(),
    )
}

#[allow(clippy::too_many_arguments)]
fn response_task(
    func: &str,
    kind: TaskKind,
    io: *mut doca_sta_io,
    user: doca_data,
    qp: *mut doca_sta_qp_handle,
    completion: *mut u8,
    nouser: doca_data,
    task: *mut *mut doca_sta_producer_task_send,
) -> doca_error_t {
    finish(
        func,
        (|| {
            out::check(task, "task")?;
            if kind != TaskKind::RdmaRead {
                out::check(completion, "completion")?;
            }
            let mut w = world();
            let io = running_io(&mut w, io)?;
            let q = own_qp(&mut w, io, qp)?;
            let conf = if kind == TaskKind::RdmaRead {
                w.ios[&io].rd_conf
            } else {
                w.ios[&io].ws_conf
            };
            if conf.is_none() {
                return broken(&contract::TASK_CONF, "the task's set_conf was not called");
            }
            let tok = data_as_u64(nouser);
            let (qid, slot, gen) = engine::untoken(tok);
            engine::check_cmd(&w, qid, slot, gen, q)?;
            let c = &w.qps[&q].cmds[slot as usize];
            match kind {
                TaskKind::RdmaRead if c.keyed.is_none() || c.valid => {
                    return broken(
                        &contract::RDMA_READ,
                        if c.valid {
                            "the command's data is already in the payload"
                        } else {
                            "the command has no keyed SGL to read from"
                        },
                    );
                }
                TaskKind::RdmaWriteSend if c.keyed.is_none() => {
                    return broken(
                        &contract::WRITE_SEND,
                        "the command has no keyed SGL to write to",
                    );
                }
                _ => {}
            }
            let mut cqe = [0u8; 16];
            if !completion.is_null() {
                // SAFETY: a doca_sta_nvme_completion_t: 16 readable bytes. Copied, so the
                // caller's buffer need not outlive the call.
                unsafe { std::ptr::copy_nonoverlapping(completion, cqe.as_mut_ptr(), 16) };
            }
            let (id, t) = new_task(&mut w, kind, CtxRef::Io(io), data_as_u64(user));
            t.qp = q;
            t.token = tok;
            t.cqe = cqe;
            out::put(task, ptr(Kind::StaTask, id))
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_task_non_offload_rdma_write_send_alloc_init(
    io: *mut doca_sta_io,
    user: doca_data,
    qp: *mut doca_sta_qp_handle,
    completion: *mut u8,
    nouser: doca_data,
    task: *mut *mut doca_sta_producer_task_send,
) -> doca_error_t {
    response_task(
        "doca_sta_io_task_non_offload_rdma_write_send_alloc_init",
        TaskKind::RdmaWriteSend,
        io,
        user,
        qp,
        completion,
        nouser,
        task,
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_task_non_offload_rdma_send_alloc_init(
    io: *mut doca_sta_io,
    user: doca_data,
    qp: *mut doca_sta_qp_handle,
    completion: *mut u8,
    nouser: doca_data,
    task: *mut *mut doca_sta_producer_task_send,
) -> doca_error_t {
    response_task(
        "doca_sta_io_task_non_offload_rdma_send_alloc_init",
        TaskKind::RdmaSend,
        io,
        user,
        qp,
        completion,
        nouser,
        task,
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_sta_io_task_non_offload_rdma_read_alloc_init(
    io: *mut doca_sta_io,
    user: doca_data,
    qp: *mut doca_sta_qp_handle,
    nouser: doca_data,
    task: *mut *mut doca_sta_producer_task_send,
) -> doca_error_t {
    response_task(
        "doca_sta_io_task_non_offload_rdma_read_alloc_init",
        TaskKind::RdmaRead,
        io,
        user,
        qp,
        std::ptr::null_mut(),
        nouser,
        task,
    )
}
