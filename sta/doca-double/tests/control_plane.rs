//! The control plane of the double, driven through doca-sys's function table: loading,
//! context start/stop order and state callbacks, devices, subsystems, namespaces,
//! backends and their queues, main-context tasks, statistics.

// `unsafe` allowed here: these tests drive the double through its C ABI (doca-sys's
// function table): every call is an FFI call with raw pointers.
#![allow(unsafe_code)]

mod common;

use std::ffi::{c_void, CStr};

use common::*;
use doca_sys::*;

#[test]
fn the_table_loads_the_double_from_the_build_output() {
    let _g = serial();
    let e = env();
    assert!(e.d.is_double());
    let p = e.d.paths().last().unwrap();
    assert_eq!(p.file_name().unwrap(), "libdoca_sta.so", "{p:?}");
    assert_eq!(e.d.error_name(DOCA_ERROR_BAD_STATE), "DOCA_ERROR_BAD_STATE");
    assert_eq!(e.d.error_name(DOCA_SUCCESS), "DOCA_SUCCESS");
    assert!(!e.d.error_descr(DOCA_ERROR_NO_MEMORY).is_empty());
    let d = &e.d;
    let mut v = 0u32;
    // SAFETY: table calls with valid out pointers.
    unsafe {
        ok((d.doca_sta_get_max_io_size)(&mut v), "max io size");
        assert_eq!(v, 128 * 1024);
        ok((d.doca_sta_get_max_ioccsz)(&mut v), "ioccsz");
        assert_eq!(v, 64 + 8192);
        assert!((d.doca_sta_is_logical_block_size_supported)(512));
        assert!((d.doca_sta_is_logical_block_size_supported)(4096));
        assert!(!(d.doca_sta_is_logical_block_size_supported)(1000));
    }
}

#[test]
fn a_directory_in_the_env_var_is_searched_first() {
    let _g = serial();
    let dir = env()
        .d
        .paths()
        .last()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    // The harness pointed NVMF_DOCA_LIB_DIR at the test binary's directory.
    let dirs = search_dirs();
    assert_eq!(dirs[0], dir);
    assert_eq!(dirs.last().unwrap(), &sdk_lib_dir());
}

#[test]
fn devices_list_the_test_devices() {
    let _g = serial();
    let d = &env().d;
    let dev = open_dev("tdev1");
    // SAFETY: table calls with valid buffers.
    unsafe {
        let info = (d.doca_dev_as_devinfo)(dev);
        assert!(!info.is_null());
        let mut buf = [0 as std::ffi::c_char; 64];
        ok(
            (d.doca_devinfo_get_ibdev_name)(info, buf.as_mut_ptr(), 64),
            "name",
        );
        assert_eq!(CStr::from_ptr(buf.as_ptr()).to_str().unwrap(), "tdev1");
        // Too small a buffer is an error, not an overflow.
        assert_eq!(
            (d.doca_devinfo_get_ibdev_name)(info, buf.as_mut_ptr(), 3),
            DOCA_ERROR_INVALID_VALUE
        );
        let mut pci = [0 as std::ffi::c_char; 13];
        assert_eq!(
            (d.doca_devinfo_get_pci_addr_str)(info, pci.as_mut_ptr()),
            DOCA_ERROR_NOT_FOUND
        );
        ok((d.doca_dev_close)(dev), "close");
    }
}

#[test]
fn main_context_starts_through_progress_and_stops() {
    let _g = serial();
    let f = Fx::main_only();
    let d = &env().d;
    // SAFETY: table calls.
    let ctx = unsafe { (d.doca_sta_as_ctx)(f.sta) } as usize;
    let states: Vec<(u32, u32)> = take_log()
        .into_iter()
        .filter_map(|e| match e {
            Ev::State { ctx: c, prev, next } if c == ctx => Some((prev, next)),
            _ => None,
        })
        .collect();
    assert_eq!(
        states,
        vec![
            (DOCA_CTX_STATE_IDLE, DOCA_CTX_STATE_STARTING),
            (DOCA_CTX_STATE_STARTING, DOCA_CTX_STATE_RUNNING)
        ]
    );
    let mut n = 0u16;
    // SAFETY: as above.
    unsafe {
        ok((d.doca_sta_get_max_sta_io)(f.sta, &mut n), "get max io");
        assert_eq!(n, 2);
        // Configuration after start breaks the contract.
        assert_eq!((d.doca_sta_set_max_sta_io)(f.sta, 4), DOCA_ERROR_BAD_STATE);
    }
    expect_violation("order.config-before-start");
    f.teardown();
    assert!(take_log().iter().any(
        |e| matches!(e, Ev::State { ctx: c, next, .. } if *c == ctx && *next == DOCA_CTX_STATE_IDLE)
    ));
}

#[test]
fn start_without_a_pe_is_not_connected_and_without_allocator_breaks_the_contract() {
    let _g = serial();
    let d = &env().d;
    let dev = open_dev("tdev0");
    let mut sta = std::ptr::null_mut();
    let mut pe = std::ptr::null_mut();
    // SAFETY: table calls.
    unsafe {
        ok((d.doca_sta_create)(dev, &mut sta), "create");
        let ctx = (d.doca_sta_as_ctx)(sta);
        assert_eq!((d.doca_ctx_start)(ctx), DOCA_ERROR_NOT_CONNECTED);
        ok((d.doca_pe_create)(&mut pe), "pe");
        ok((d.doca_pe_connect_ctx)(pe, ctx), "connect");
        ok((d.doca_sta_add_dev)(sta, dev), "add_dev");
        ok((d.doca_sta_set_max_sta_io)(sta, 1), "max io");
        assert_eq!((d.doca_ctx_start)(ctx), DOCA_ERROR_BAD_STATE);
        let v = expect_violation("order.start-ready");
        assert!(v.contains("memory allocator"), "{v}");
        ok((d.doca_sta_destroy)(sta), "destroy");
        ok((d.doca_pe_destroy)(pe), "pe destroy");
        ok((d.doca_dev_close)(dev), "close");
    }
}

#[test]
fn subsystems_namespaces_and_their_rules() {
    let _g = serial();
    let f = Fx::main_only();
    let d = &env().d;
    // SAFETY: table calls; handles from the double.
    unsafe {
        let mut subs = std::ptr::null_mut();
        ok(
            (d.doca_sta_subsystem_create)(f.sta, c"nqn.2026-11.dev.test:a".as_ptr(), &mut subs),
            "subsystem",
        );
        let mut dup = std::ptr::null_mut();
        assert_eq!(
            (d.doca_sta_subsystem_create)(f.sta, c"nqn.2026-11.dev.test:a".as_ptr(), &mut dup),
            DOCA_ERROR_ALREADY_EXIST
        );
        ok(
            (d.doca_sta_subsystem_add_dev)(subs, f.dev),
            "subsystem add_dev",
        );
        let other = open_dev("tdev1");
        assert_eq!(
            (d.doca_sta_subsystem_add_dev)(subs, other),
            DOCA_ERROR_BAD_STATE
        );
        expect_violation("order.dev-added");
        let mut be = std::ptr::null_mut();
        ok((d.doca_sta_be_create)(f.sta, &mut be), "be");
        let mut ns = std::ptr::null_mut();
        ok(
            (d.doca_sta_subsystem_add_ns)(subs, 1, 512, 1, be, &mut ns),
            "ns 1",
        );
        let mut ns2 = std::ptr::null_mut();
        ok(
            (d.doca_sta_subsystem_add_ns)(subs, 2, 4096, 2, be, &mut ns2),
            "ns 2",
        );
        let mut bad = std::ptr::null_mut();
        assert_eq!(
            (d.doca_sta_subsystem_add_ns)(subs, 1, 512, 3, be, &mut bad),
            DOCA_ERROR_INVALID_VALUE
        );
        assert!(expect_violation("arg.namespace").contains("already in the subsystem"));
        assert_eq!(
            (d.doca_sta_subsystem_add_ns)(subs, 3, 1000, 3, be, &mut bad),
            DOCA_ERROR_INVALID_VALUE
        );
        assert!(expect_violation("arg.namespace").contains("block size 1000"));
        assert_eq!(
            (d.doca_sta_subsystem_add_ns)(subs, 0, 512, 3, be, &mut bad),
            DOCA_ERROR_INVALID_VALUE
        );
        expect_violation("arg.namespace");
        // A subsystem with namespaces cannot be destroyed; neither can a backend in use.
        assert_eq!((d.doca_sta_subsystem_destroy)(subs), DOCA_ERROR_IN_USE);
        expect_violation("teardown.subsystem");
        assert_eq!((d.doca_sta_be_destroy)(be), DOCA_ERROR_IN_USE);
        expect_violation("teardown.backend");
        // Remove ns 1 by task: the callback comes from the main PE.
        let mut t = std::ptr::null_mut();
        ok(
            (d.doca_sta_subsystem_task_rm_ns_alloc_init)(subs, ns, data_u64(11), &mut t),
            "rm_ns task",
        );
        let task = (d.doca_sta_producer_send_task_as_task)(t);
        ok((d.doca_task_submit)(task), "submit");
        let mut inflight = 0usize;
        ok(
            (d.doca_pe_get_num_inflight_tasks)(f.pe, &mut inflight),
            "inflight",
        );
        assert_eq!(inflight, 1);
        assert_eq!(
            (d.doca_task_submit)(task),
            DOCA_ERROR_BAD_STATE,
            "submitted twice"
        );
        expect_violation("state.task");
        take_log();
        f.pump(1);
        assert_eq!(
            take_log(),
            vec![Ev::TaskOk {
                task: t as usize,
                user: 11
            }]
        );
        ok((d.doca_task_get_status)(task), "status");
        (d.doca_task_free)(task);
        // The namespace is gone: its handle is now a destroyed object.
        let mut e = std::ptr::null();
        let mut n = 0u16;
        assert_eq!(
            (d.doca_sta_get_ns_stats)(subs, ns, &mut e, &mut n),
            DOCA_ERROR_INVALID_VALUE
        );
        expect_violation("arg.destroyed");
        // Synchronous removal of ns 2 (nothing in flight).
        ok((d.doca_sta_subsystem_rm_ns)(subs, ns2), "rm_ns");
        ok((d.doca_sta_subsystem_destroy)(subs), "subsystem destroy");
        // add_ns on the destroyed subsystem: the handle is dead.
        assert_eq!(
            (d.doca_sta_subsystem_add_ns)(subs, 5, 512, 5, be, &mut bad),
            DOCA_ERROR_INVALID_VALUE
        );
        expect_violation("arg.destroyed");
        ok((d.doca_sta_be_destroy)(be), "be destroy");
        ok((d.doca_dev_close)(other), "close other");
    }
    f.teardown();
    assert!(take_violation().is_none());
}

#[test]
fn backend_queue_rules_and_destroy_task() {
    let _g = serial();
    let f = Fx::main_only();
    let d = &env().d;
    let nb = NullBackend::new(&f, 64);
    // SAFETY: table calls.
    unsafe {
        // A ring whose entry count is not a power of two.
        let ring = app_mem(48 * 64);
        let cq = app_mem(48 * 16);
        let mut ms = Vec::new();
        for (a, l) in [(ring, 48 * 64), (cq, 48 * 16)] {
            let mut m = std::ptr::null_mut();
            ok((d.doca_mmap_create)(&mut m), "mmap");
            ok((d.doca_mmap_add_dev)(m, f.dev), "add_dev");
            ok((d.doca_mmap_set_memrange)(m, a as *mut c_void, l), "range");
            ok((d.doca_mmap_start)(m), "start");
            ms.push(m);
        }
        let mut q = std::ptr::null_mut();
        assert_eq!(
            (d.doca_sta_be_add_queue)(nb.be, ms[0], nb.mmaps[2], 0, ms[1], nb.mmaps[2], 8, &mut q),
            DOCA_ERROR_INVALID_VALUE
        );
        assert!(expect_violation("arg.be-queue").contains("power of two"));
        // A doorbell offset outside the doorbell mmap.
        assert_eq!(
            (d.doca_sta_be_add_queue)(
                nb.be,
                nb.mmaps[0],
                nb.mmaps[2],
                16,
                nb.mmaps[1],
                nb.mmaps[2],
                8,
                &mut q
            ),
            DOCA_ERROR_INVALID_VALUE
        );
        expect_violation("arg.be-queue");
        // Configuring a started mmap.
        assert_eq!(
            (d.doca_mmap_set_permissions)(ms[0], 0),
            DOCA_ERROR_BAD_STATE
        );
        expect_violation("state.mmap");
        // Destroying an mmap a queue uses.
        assert_eq!((d.doca_mmap_destroy)(nb.mmaps[0]), DOCA_ERROR_BAD_STATE);
        expect_violation("state.mmap");
        for m in ms {
            ok((d.doca_mmap_destroy)(m), "mmap destroy");
        }
        zfree(ring as *mut c_void);
        zfree(cq as *mut c_void);
        // The mapping info names the queue's execution unit; stats start at zero.
        let mut e = std::ptr::null();
        let mut n = 0u16;
        ok(
            (d.doca_sta_get_be_queue_mapping_info)(nb.beq, &mut e, &mut n),
            "mapping",
        );
        assert_eq!(n, 1);
        assert_eq!(CStr::from_ptr((*e).name).to_str().unwrap(), "beq_eu_id");
        ok(
            (d.doca_sta_get_be_queue_stats)(nb.be, nb.beq, &mut e, &mut n),
            "beq stats",
        );
        assert_eq!(n, 4);
        assert_eq!(*(*e).val, 0);
    }
    nb.destroy(&f);
    f.teardown();
    assert!(take_violation().is_none());
}

#[test]
fn io_contexts_follow_the_main_context() {
    let _g = serial();
    let d = &env().d;
    let f = Fx::main_only();
    // SAFETY: table calls.
    unsafe {
        let mut io = std::ptr::null_mut();
        ok((d.doca_sta_io_create)(f.sta, &mut io), "io 1");
        let mut io2 = std::ptr::null_mut();
        ok((d.doca_sta_io_create)(f.sta, &mut io2), "io 2");
        let mut io3 = std::ptr::null_mut();
        assert_eq!((d.doca_sta_io_create)(f.sta, &mut io3), DOCA_ERROR_FULL);
        expect_violation("order.io-count");
        // A QP before the IO context runs (the brief's example).
        let mut qp = std::ptr::null_mut();
        assert_eq!(
            (d.doca_sta_io_qp_alloc)(io, f.dev, &mut qp),
            DOCA_ERROR_BAD_STATE
        );
        expect_violation("order.io-running");
        // Starting it without its callbacks configured.
        let mut pe = std::ptr::null_mut();
        ok((d.doca_pe_create)(&mut pe), "pe");
        let ctx = (d.doca_sta_io_as_ctx)(io);
        ok((d.doca_pe_connect_ctx)(pe, ctx), "connect");
        assert_eq!((d.doca_ctx_start)(ctx), DOCA_ERROR_BAD_STATE);
        assert!(
            expect_violation("order.start-ready").contains("doca_sta_io_non_offload_register_cb")
        );
        // Stopping the main context while... (IO contexts idle: allowed), but destroying
        // it with IO contexts alive is a leak.
        ok((d.doca_sta_io_destroy)(io2), "io2 destroy");
        let main = (d.doca_sta_as_ctx)(f.sta);
        assert_eq!((d.doca_sta_destroy)(f.sta), DOCA_ERROR_IN_USE);
        expect_violation("teardown.leak");
        ok((d.doca_sta_io_destroy)(io), "io destroy");
        ok((d.doca_pe_destroy)(pe), "pe destroy");
        let _ = main;
    }
    f.teardown();
    assert!(take_violation().is_none());
}

#[test]
fn statistics_list_execution_units() {
    let _g = serial();
    let f = Fx::new();
    let d = &env().d;
    let nb = NullBackend::new(&f, 64);
    // SAFETY: table calls with arrays of the announced size.
    unsafe {
        let mut max = 0u32;
        ok(
            (d.doca_sta_get_max_num_eus_available)(f.sta, &mut max),
            "max eus",
        );
        let mut arr = vec![std::ptr::null_mut(); max as usize];
        let mut n = max;
        ok(
            (d.doca_sta_get_eu_handle)(f.sta, arr.as_mut_ptr(), &mut n),
            "eus",
        );
        assert_eq!(n, 3, "comp + tx of the IO context, beq of the queue");
        let mut types = Vec::new();
        for eu in &arr[..n as usize] {
            let mut t = 0;
            ok((d.doca_sta_get_eu_type)(*eu, &mut t), "type");
            let mut name = std::ptr::null();
            ok((d.doca_sta_get_eu_name)(*eu, &mut name), "name");
            let mut st = 0;
            ok((d.doca_sta_get_eu_state)(*eu, &mut st), "state");
            assert_eq!(st, DOCA_STA_EU_STATE_STARTED);
            let mut e = std::ptr::null();
            let mut k = 0u16;
            ok((d.doca_sta_get_eu_stats)(*eu, &mut e, &mut k), "stats");
            assert!(k > 0);
            let mut q = 0u16;
            ok(
                (d.doca_sta_get_eu_connect_qp_stats)(*eu, std::ptr::null_mut(), &mut q),
                "qps",
            );
            assert_eq!(q, 0);
            types.push((t, CStr::from_ptr(name).to_str().unwrap().to_string()));
        }
        types.sort();
        assert_eq!(
            types,
            vec![
                (DOCA_STA_EU_COMP, "comp0".to_string()),
                (DOCA_STA_EU_TX, "tx0".to_string()),
                (DOCA_STA_EU_BEQ, "beq0".to_string())
            ]
        );
        ok(
            (d.doca_sta_eu_reset_stats_type)(f.sta, DOCA_STA_EU_MAX),
            "reset all",
        );
    }
    nb.destroy(&f);
    f.teardown();
    assert!(take_violation().is_none());
}

#[test]
fn teardown_frees_what_the_allocator_gave() {
    let _g = serial();
    let before = live_allocations();
    let f = Fx::new();
    f.teardown();
    assert_eq!(live_allocations(), before);
    assert_eq!(take_violation(), None);
}
