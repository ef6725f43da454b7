//! DOCA Core progress engine, contexts and tasks (`doca_pe.h`, `doca_ctx.h`).
//!
//! `doca_pe_progress` runs the engine work of every context connected to the PE (the
//! main context's tasks and events, an IO context's QPs and backend queues), then calls
//! the callbacks that work produced, with the double's lock released, so a callback may
//! call back into the library (allocate and submit tasks, free them) but not
//! `doca_pe_progress` (rule `order.progress-in-callback`).
//!
//! Notification handle: an epoll descriptor per PE holding an eventfd (written whenever a
//! callback is queued for the PE) and the completion channels of its IO context's RDMA
//! devices; `doca_pe_request_notification` arms the QPs' completion queues.

#![allow(clippy::missing_safety_doc)]

use std::cell::Cell;
use std::os::fd::RawFd;

use doca_sys::*;

use crate::contract::{self, broken, code, finish, Res};
use crate::world::{world, Cb, CtxRef, Kind, Pe, TaskSt};
use crate::{engine, out};

thread_local! {
    static IN_CB: Cell<bool> = const { Cell::new(false) };
}

/// An eventfd inside an epoll set.
pub struct Notify {
    efd: RawFd,
    epfd: RawFd,
}

impl Notify {
    pub fn new() -> Res<Notify> {
        // SAFETY: plain syscalls; the descriptors are owned here and closed on drop.
        unsafe {
            let efd = libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC);
            let epfd = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            if efd < 0 || epfd < 0 {
                if efd >= 0 {
                    libc::close(efd);
                }
                if epfd >= 0 {
                    libc::close(epfd);
                }
                return code(DOCA_ERROR_OPERATING_SYSTEM);
            }
            let n = Notify { efd, epfd };
            n.add_fd(efd);
            Ok(n)
        }
    }

    pub fn add_fd(&self, fd: RawFd) {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: both descriptors are live; `ev` is initialised.
        unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
    }

    pub fn wake(&self) {
        let one = 1u64;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(self.efd, &one as *const u64 as *const _, 8) };
    }

    pub fn clear(&self) {
        let mut v = 0u64;
        // SAFETY: reading 8 bytes from our non-blocking eventfd.
        unsafe { libc::read(self.efd, &mut v as *mut u64 as *mut _, 8) };
    }

    pub fn handle(&self) -> RawFd {
        self.epfd
    }
}

impl Drop for Notify {
    fn drop(&mut self) {
        // SAFETY: ours, closed once.
        unsafe {
            libc::close(self.efd);
            libc::close(self.epfd);
        }
    }
}

fn invoke(cb: &Cb) {
    IN_CB.with(|c| c.set(true));
    // SAFETY: each callback pointer was registered by the application for exactly this
    // use with the prototype of doca-sta-api.md 3.4; the pointer arguments (command,
    // payload, event and task handles) stay valid for the duration of the call.
    unsafe {
        match *cb {
            Cb::CtxState {
                cb,
                user,
                ctx,
                prev,
                next,
            } => {
                if let Some(f) = cb {
                    f(data_u64(user), ctx.handle(), prev, next)
                }
            }
            Cb::Task { cb, task, user } => {
                if let Some(f) = cb {
                    f(crate::world::ptr(Kind::StaTask, task), data_u64(user))
                }
            }
            Cb::NonOffload {
                cb,
                qp,
                user,
                cmd,
                payload,
                len,
                valid,
                token,
            } => {
                if let Some(f) = cb {
                    f(
                        crate::world::ptr(Kind::Qp, qp),
                        data_u64(user),
                        cmd,
                        payload,
                        len,
                        valid,
                        data_u64(token),
                    )
                }
            }
            Cb::TransportErr { cb, ev, user } => {
                if let Some(f) = cb {
                    f(crate::world::ptr(Kind::EvTransport, ev), data_u64(user))
                }
            }
            Cb::BeTimeout { cb, ev, user } => {
                if let Some(f) = cb {
                    f(crate::world::ptr(Kind::EvBeTimeout, ev), data_u64(user))
                }
            }
            Cb::CqeNotify { cb, ev, user } => {
                if let Some(f) = cb {
                    f(crate::world::ptr(Kind::EvCqe, ev), data_u64(user))
                }
            }
        }
    }
    IN_CB.with(|c| c.set(false));
}

#[no_mangle]
pub unsafe extern "C" fn doca_pe_create(pe: *mut *mut doca_pe) -> doca_error_t {
    finish(
        "doca_pe_create",
        (|| {
            out::check(pe, "pe")?;
            let notify = Notify::new()?;
            let mut w = world();
            let id = w.new_id(Kind::Pe);
            w.pes.insert(
                id,
                Pe {
                    ctxs: Vec::new(),
                    cbs: Default::default(),
                    notify,
                },
            );
            out::put(pe, crate::world::ptr(Kind::Pe, id))
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_pe_destroy(pe: *mut doca_pe) -> doca_error_t {
    finish(
        "doca_pe_destroy",
        (|| {
            let mut w = world();
            let (id, p) = w.pe(pe)?;
            let ctxs = p.ctxs.clone();
            for c in &ctxs {
                if !w.ctx(*c).idle() {
                    return broken(
                        &contract::TEARDOWN,
                        format!(
                            "PE #{id} is destroyed while a context connected to it is not stopped"
                        ),
                    );
                }
            }
            for c in ctxs {
                w.ctx(c).pe = None;
            }
            w.pes.remove(&id);
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_pe_connect_ctx(pe: *mut doca_pe, ctx: *mut doca_ctx) -> doca_error_t {
    finish(
        "doca_pe_connect_ctx",
        (|| {
            let mut w = world();
            let (pid, _) = w.pe(pe)?;
            let c = w.ctx_ref(ctx)?;
            let x = w.ctx(c);
            if x.pe.is_some() {
                return broken(
                    &contract::CTX_STATE,
                    "the context is already connected to a PE",
                );
            }
            if !x.idle() {
                return broken(
                    &contract::CTX_STATE,
                    "a context is connected to a PE before it starts",
                );
            }
            x.pe = Some(pid);
            w.pes.get_mut(&pid).expect("live").ctxs.push(c);
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_pe_progress(pe: *mut doca_pe) -> u8 {
    if IN_CB.with(|c| c.get()) {
        contract::violation(
            "doca_pe_progress",
            &contract::PROGRESS_IN_CB,
            "called from inside a callback",
        );
        return 0;
    }
    let (cbs, did) = {
        let mut w = world();
        let pid = match w.pe(pe) {
            Ok((id, _)) => id,
            Err(b) => {
                drop(w);
                contract::violation("doca_pe_progress", b.rule, b.detail);
                return 0;
            }
        };
        let ctxs = w.pes[&pid].ctxs.clone();
        let mut did = false;
        for c in ctxs {
            if let CtxRef::Io(io) = c {
                if let Err(b) = engine::check_owner(&mut w, io) {
                    drop(w);
                    contract::violation("doca_pe_progress", b.rule, b.detail);
                    return 0;
                }
            }
            did |= engine::step(&mut w, c);
        }
        let cbs: Vec<Cb> = w.pes.get_mut(&pid).expect("live").cbs.drain(..).collect();
        for cb in &cbs {
            if let Cb::Task { task, .. } = cb {
                if let Some(t) = w.tasks.get_mut(task) {
                    t.st = TaskSt::Idle;
                }
            }
        }
        (cbs, did)
    };
    for cb in &cbs {
        invoke(cb);
    }
    let evs: Vec<u64> = cbs
        .iter()
        .filter_map(|c| match *c {
            Cb::TransportErr { ev, .. } | Cb::BeTimeout { ev, .. } | Cb::CqeNotify { ev, .. } => {
                Some(ev)
            }
            _ => None,
        })
        .collect();
    if !evs.is_empty() {
        let mut w = world();
        for e in evs {
            w.events.remove(&e);
        }
    }
    (did || !cbs.is_empty()) as u8
}

#[no_mangle]
pub unsafe extern "C" fn doca_pe_get_num_inflight_tasks(
    pe: *const doca_pe,
    n: *mut usize,
) -> doca_error_t {
    finish(
        "doca_pe_get_num_inflight_tasks",
        (|| {
            out::check(n, "num_inflight_tasks")?;
            let mut w = world();
            let (_, p) = w.pe(pe)?;
            let ctxs = p.ctxs.clone();
            let total = ctxs.iter().map(|c| engine::inflight(&w, *c)).sum();
            out::put(n, total)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_pe_get_notification_handle(
    pe: *const doca_pe,
    h: *mut doca_notification_handle_t,
) -> doca_error_t {
    finish(
        "doca_pe_get_notification_handle",
        (|| {
            out::check(h, "handle")?;
            let mut w = world();
            let (_, p) = w.pe(pe)?;
            let fd = p.notify.handle();
            out::put(h, fd)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_pe_request_notification(pe: *mut doca_pe) -> doca_error_t {
    finish(
        "doca_pe_request_notification",
        (|| {
            let mut w = world();
            let (pid, _) = w.pe(pe)?;
            engine::arm(&mut w, pid);
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_pe_clear_notification(
    pe: *mut doca_pe,
    _h: doca_notification_handle_t,
) -> doca_error_t {
    finish(
        "doca_pe_clear_notification",
        (|| {
            let mut w = world();
            let (pid, p) = w.pe(pe)?;
            p.notify.clear();
            engine::drain_channels(&mut w, pid);
            Ok(())
        })(),
    )
}

fn task_id(w: &mut crate::world::World, t: *const doca_task) -> Result<u64, contract::Broken> {
    let id = w.id_of(Kind::Task, t as u64)?;
    if w.tasks.contains_key(&id) {
        Ok(id)
    } else {
        Err(w.missing(Kind::Task, id))
    }
}

fn submit(func: &str, task: *mut doca_task) -> doca_error_t {
    finish(
        func,
        (|| {
            let mut w = world();
            let id = task_id(&mut w, task)?;
            if w.tasks[&id].st != TaskSt::Idle {
                return broken(
                    &contract::TASK_STATE,
                    format!("task #{id} is submitted again before its callback ran"),
                );
            }
            engine::submit(&mut w, id)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_task_submit(task: *mut doca_task) -> doca_error_t {
    submit("doca_task_submit", task)
}

#[no_mangle]
pub unsafe extern "C" fn doca_task_try_submit(task: *mut doca_task) -> doca_error_t {
    submit("doca_task_try_submit", task)
}

#[no_mangle]
pub unsafe extern "C" fn doca_task_free(task: *mut doca_task) {
    let r = finish(
        "doca_task_free",
        (|| {
            let mut w = world();
            let id = task_id(&mut w, task)?;
            let t = &w.tasks[&id];
            if t.st != TaskSt::Idle {
                return broken(
                    &contract::TASK_STATE,
                    format!("task #{id} is freed while submitted"),
                );
            }
            w.tasks.remove(&id);
            Ok(())
        })(),
    );
    let _ = r;
}

#[no_mangle]
pub unsafe extern "C" fn doca_task_get_status(task: *const doca_task) -> doca_error_t {
    let mut w = world();
    match task_id(&mut w, task) {
        Ok(id) => w.tasks[&id].status,
        Err(b) => {
            drop(w);
            contract::violation("doca_task_get_status", b.rule, b.detail)
        }
    }
}

// --- doca_ctx ---------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn doca_ctx_start(ctx: *mut doca_ctx) -> doca_error_t {
    finish(
        "doca_ctx_start",
        (|| {
            let mut w = world();
            let c = w.ctx_ref(ctx)?;
            engine::ctx_start(&mut w, c)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_ctx_stop(ctx: *mut doca_ctx) -> doca_error_t {
    finish(
        "doca_ctx_stop",
        (|| {
            let mut w = world();
            let c = w.ctx_ref(ctx)?;
            engine::ctx_stop(&mut w, c)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_ctx_get_state(
    ctx: *const doca_ctx,
    state: *mut doca_ctx_states,
) -> doca_error_t {
    finish(
        "doca_ctx_get_state",
        (|| {
            out::check(state, "state")?;
            let mut w = world();
            let c = w.ctx_ref(ctx)?;
            let s = w.ctx(c).state;
            out::put(state, s)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_ctx_set_state_changed_cb(
    ctx: *mut doca_ctx,
    cb: doca_ctx_state_changed_callback_t,
) -> doca_error_t {
    finish(
        "doca_ctx_set_state_changed_cb",
        (|| {
            let mut w = world();
            let c = w.ctx_ref(ctx)?;
            let x = w.ctx(c);
            if !x.idle() {
                return broken(
                    &contract::CONFIG_BEFORE_START,
                    "state callback set on a started context",
                );
            }
            x.state_cb = cb;
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_ctx_set_user_data(
    ctx: *mut doca_ctx,
    user: doca_data,
) -> doca_error_t {
    finish(
        "doca_ctx_set_user_data",
        (|| {
            let mut w = world();
            let c = w.ctx_ref(ctx)?;
            w.ctx(c).user = data_as_u64(user);
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_ctx_get_user_data(
    ctx: *const doca_ctx,
    user: *mut doca_data,
) -> doca_error_t {
    finish(
        "doca_ctx_get_user_data",
        (|| {
            out::check(user, "user_data")?;
            let mut w = world();
            let c = w.ctx_ref(ctx)?;
            let u = w.ctx(c).user;
            out::put(user, data_u64(u))
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_ctx_get_num_inflight_tasks(
    ctx: *const doca_ctx,
    n: *mut usize,
) -> doca_error_t {
    finish(
        "doca_ctx_get_num_inflight_tasks",
        (|| {
            out::check(n, "num_inflight_tasks")?;
            let w = world();
            let c = w.ctx_ref(ctx)?;
            let v = engine::inflight(&w, c);
            out::put(n, v)
        })(),
    )
}
