//! By default a broken contract rule aborts the process with one line naming the rule and
//! the section of doca-sta-api.md it comes from. Each case runs in a child process (this
//! test binary again, one ignored helper test selected by name) and the parent checks it
//! died of SIGABRT with that message.

// `unsafe` allowed here: these tests drive the double through its C ABI (doca-sys's
// function table): every call is an FFI call with raw pointers.
#![allow(unsafe_code)]

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use common::*;
use doca_sys::*;

/// Run the ignored helper `name` in a child and return its stderr; it must abort.
fn child_aborts(name: &str) -> String {
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            name,
            "--nocapture",
            "--test-threads=1",
        ])
        .env("DOCA_DOUBLE_ABORT_CHILD", "1")
        .env_remove("DOCA_DOUBLE_CONTRACT")
        .output()
        .expect("spawn the child");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "child {name} should abort; stderr:\n{err}"
    );
    err
}

fn in_child() -> bool {
    if std::env::var_os("DOCA_DOUBLE_ABORT_CHILD").is_none() {
        eprintln!("helper for a child process; run by its parent test");
        return false;
    }
    let e = env();
    // SAFETY: plain setter: abort mode.
    unsafe { (e.x.set_contract_mode)(0) };
    true
}

#[test]
#[ignore = "run by add_ns_before_subsystem_create_aborts in a child process"]
fn child_add_ns_with_a_handle_never_created() {
    if !in_child() {
        return;
    }
    let f = Fx::main_only();
    let d = &env().d;
    let mut be = std::ptr::null_mut();
    let mut ns = std::ptr::null_mut();
    // SAFETY: breaking the rule on purpose: a subsystem handle that was never created.
    unsafe {
        ok((d.doca_sta_be_create)(f.sta, &mut be), "be");
        (d.doca_sta_subsystem_add_ns)(0xD0CA_0B00_0000_9999 as *mut _, 1, 512, 1, be, &mut ns);
    }
    unreachable!("the double aborts");
}

#[test]
fn add_ns_before_subsystem_create_aborts() {
    let err = child_aborts("child_add_ns_with_a_handle_never_created");
    assert!(
        err.contains("doca-double: contract violation in doca_sta_subsystem_add_ns: [arg.handle]")
            && err.contains("doca-sta-api.md 3.1"),
        "{err}"
    );
}

/// In the child: an IO context created and never started, and a CM id, handed to `call`,
/// which breaks the rule "QPs only on a running IO context" (the double aborts).
fn on_an_io_context_never_started(call: impl FnOnce(&Fx, *mut doca_sta_io, *mut rdma_cm_id)) -> ! {
    let f = Fx::main_only();
    let mut io = std::ptr::null_mut();
    let mut id = std::ptr::null_mut();
    // SAFETY: FFI calls that create the objects the broken call is given.
    unsafe {
        ok((env().d.doca_sta_io_create)(f.sta, &mut io), "io");
        ok((env().x.loop_create)(&mut id), "loop");
    }
    call(&f, io, id);
    unreachable!("the double aborts");
}

#[test]
#[ignore = "run by qp_connect_before_the_io_context_starts_aborts in a child process"]
fn child_qp_connect_before_start() {
    if !in_child() {
        return;
    }
    on_an_io_context_never_started(|f, io, id| {
        // SAFETY: breaking the rule on purpose: the IO context was never started.
        unsafe {
            (env().d.doca_sta_io_qp_connect)(
                io,
                f.dev,
                id,
                std::ptr::null(),
                0,
                std::ptr::null_mut(),
                &mut std::ptr::null_mut(),
            );
        }
    })
}

#[test]
fn qp_connect_before_the_io_context_starts_aborts() {
    let err = child_aborts("child_qp_connect_before_start");
    assert!(
        err.contains("in doca_sta_io_qp_connect: [order.io-running]"),
        "{err}"
    );
}

#[test]
#[ignore = "run by qp_accept_before_the_io_context_starts_aborts in a child process"]
fn child_qp_accept_before_start() {
    if !in_child() {
        return;
    }
    on_an_io_context_never_started(|f, io, id| {
        // SAFETY: breaking the rule on purpose: the IO context was never started. No QP
        // handle can exist yet (doca_sta_io_qp_alloc needs a running context too), so the
        // call has none; the context is what the double checks first.
        unsafe {
            (env().d.doca_sta_io_qp_accept)(
                io,
                std::ptr::null_mut(),
                f.dev,
                id,
                std::ptr::null(),
                0,
                std::ptr::null_mut(),
            );
        }
    })
}

#[test]
fn qp_accept_before_the_io_context_starts_aborts() {
    let err = child_aborts("child_qp_accept_before_start");
    assert!(
        err.contains("in doca_sta_io_qp_accept: [order.io-running]"),
        "{err}"
    );
}

#[test]
#[ignore = "run by destroying_a_main_context_with_subsystems_aborts in a child process"]
fn child_leak_at_teardown() {
    if !in_child() {
        return;
    }
    let f = Fx::main_only();
    let d = &env().d;
    let mut subs = std::ptr::null_mut();
    // SAFETY: breaking the rule on purpose: the subsystem is never destroyed.
    unsafe {
        ok(
            (d.doca_sta_subsystem_create)(f.sta, c"nqn.2026-11.dev.test:leak".as_ptr(), &mut subs),
            "subs",
        );
        let ctx = (d.doca_sta_as_ctx)(f.sta);
        ok((d.doca_ctx_stop)(ctx), "stop");
        (d.doca_sta_destroy)(f.sta);
    }
    unreachable!("the double aborts");
}

#[test]
fn destroying_a_main_context_with_subsystems_aborts() {
    let err = child_aborts("child_leak_at_teardown");
    assert!(
        err.contains("[teardown.leak]") && err.contains("1 subsystem(s) not destroyed"),
        "{err}"
    );
}

#[test]
fn report_mode_returns_the_rule_code_instead() {
    let _g = serial();
    let d = &env().d;
    let mut ns = std::ptr::null_mut();
    // SAFETY: breaking the rule on purpose, in report mode.
    let r = unsafe {
        (d.doca_sta_subsystem_add_ns)(
            0xD0CA_0B00_0000_9999 as *mut _,
            1,
            512,
            1,
            std::ptr::null_mut(),
            &mut ns,
        )
    };
    assert_eq!(r, DOCA_ERROR_INVALID_VALUE);
    expect_violation("arg.handle");
}
