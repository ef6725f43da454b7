//! The capsule path of the double over its loopback host (no RDMA hardware here): a QP
//! accepted on a loopback cm_id, a Fabrics Connect handed up and answered, offloaded
//! Read/Write/Flush through the backend queue's rings served by the RAM drive, the
//! non-offload callback and the three response tasks, validation and NVMe errors,
//! transport errors, backend timeout, backend-queue destroy, namespace removal with I/O
//! in flight, disconnect. Verbs are not involved: the loopback link moves the bytes that
//! RDMA READ/WRITE/SEND would, checking keys and bounds as a NIC does.

// `unsafe` allowed here: these tests drive the double through its C ABI (doca-sys's
// function table): every call is an FFI call with raw pointers.
#![allow(unsafe_code)]

mod common;

use std::ffi::c_void;

use common::*;
use doca_sys::*;

const BE_NSID: u32 = 5;

struct Conn {
    id: *mut rdma_cm_id,
    qp: *mut doca_sta_qp_handle,
    /// The IO context that owns the QP.
    io: *mut doca_sta_io,
}

struct Setup {
    f: Fx,
    nb: NullBackend,
    subs: *mut doca_sta_subs_handle,
    ns: *mut doca_sta_ns_handle,
}

fn setup() -> Setup {
    setup_with(Fx::new())
}

fn setup_with(f: Fx) -> Setup {
    let d = &env().d;
    let nb = NullBackend::new(&f, 64);
    let mut subs = std::ptr::null_mut();
    let mut ns = std::ptr::null_mut();
    // SAFETY: table calls.
    unsafe {
        ok(
            (d.doca_sta_subsystem_create)(f.sta, c"nqn.2026-11.dev.test:io".as_ptr(), &mut subs),
            "subsystem",
        );
        ok((d.doca_sta_subsystem_add_dev)(subs, f.dev), "subsystem dev");
        ok(
            (d.doca_sta_subsystem_add_ns)(subs, 1, 512, BE_NSID, nb.be, &mut ns),
            "ns",
        );
    }
    f.pump(1); // delivers the IO context's state callback
    take_log();
    Setup { f, nb, subs, ns }
}

fn send(c: &Conn, capsule: &[u8]) {
    // SAFETY: the loopback id is live; the capsule is copied.
    ok(
        unsafe {
            (env().x.loop_send)(
                c.id,
                capsule.as_ptr() as *const c_void,
                capsule.len() as u32,
            )
        },
        "loop_send",
    );
}

fn recv(c: &Conn) -> Option<([u8; 16], u32)> {
    let mut cqe = [0u8; 16];
    let mut inv = 0u32;
    // SAFETY: 16 writable bytes, valid out pointer.
    match unsafe { (env().x.loop_recv)(c.id, cqe.as_mut_ptr(), &mut inv) } {
        1 => Some((cqe, inv)),
        _ => None,
    }
}

fn region(c: &Conn, rkey: u32, buf: &mut [u8]) {
    // SAFETY: the buffer outlives the connection in every test.
    ok(
        unsafe {
            (env().x.loop_add_region)(
                c.id,
                rkey,
                buf.as_mut_ptr() as *mut c_void,
                buf.len() as u64,
            )
        },
        "region",
    );
}

/// Submit a response task and free it after its completion callback.
fn respond(s: &Setup, t: *mut doca_sta_producer_task_send, user: u64) {
    let d = &env().d;
    // SAFETY: a task the double just allocated.
    unsafe {
        let task = (d.doca_sta_producer_send_task_as_task)(t);
        ok((d.doca_task_submit)(task), "submit");
        s.f.pump(2);
        let log = take_log();
        assert!(
            log.contains(&Ev::TaskOk {
                task: t as usize,
                user
            }),
            "task {user} completed: {log:?}"
        );
        (d.doca_task_free)(task);
    }
}

fn send_task(s: &Setup, c: &Conn, token: u64, cqe: [u8; 16], user: u64) {
    let d = &env().d;
    let mut t = std::ptr::null_mut();
    let mut cqe = cqe;
    // SAFETY: table call; the CQE is copied at alloc.
    ok(
        unsafe {
            (d.doca_sta_io_task_non_offload_rdma_send_alloc_init)(
                c.io,
                data_u64(user),
                c.qp,
                cqe.as_mut_ptr(),
                data_u64(token),
                &mut t,
            )
        },
        "send task",
    );
    respond(s, t, user);
}

/// Accept a loopback connection as an I/O queue and run its Fabrics Connect.
fn connect(s: &Setup) -> Conn {
    connect_on(s, s.f.io)
}

/// As [`connect`], on IO context `io`.
fn connect_on(s: &Setup, io: *mut doca_sta_io) -> Conn {
    let d = &env().d;
    let x = &env().x;
    let mut id = std::ptr::null_mut();
    let mut qp = std::ptr::null_mut();
    // SAFETY: table and extension calls with valid pointers.
    unsafe {
        ok((x.loop_create)(&mut id), "loop_create");
        ok((d.doca_sta_io_qp_alloc)(io, s.f.dev, &mut qp), "qp_alloc");
        let pd = nvmf::rdma::accept_private_data(32);
        ok(
            (d.doca_sta_io_qp_accept)(
                io,
                qp,
                s.f.dev,
                id,
                pd.as_ptr() as *const c_void,
                32,
                std::ptr::null_mut(),
            ),
            "accept",
        );
        let mut got = [0u8; 32];
        assert_eq!((x.loop_accept_data)(id, got.as_mut_ptr(), 32), 32);
        assert_eq!(
            got, pd,
            "the host sees the application's accept private data"
        );
        ok(
            (d.doca_sta_io_qp_connect_established)(io, qp),
            "established",
        );
        ok(
            (d.doca_sta_io_qp_set_user_data)(io, qp, data_u64(0xabc)),
            "user data",
        );
    }
    let c = Conn { id, qp, io };
    send(&c, &connect_capsule(1, 1, 31));
    s.f.pump(1);
    let log = take_log();
    let [Ev::NonOffload {
        qp: q,
        sqe,
        len,
        valid,
        token,
        payload,
    }] = &log[..]
    else {
        panic!("one non-offload callback for the Connect: {log:?}")
    };
    assert_eq!(*q, qp as usize);
    assert_eq!((sqe[0], sqe[4]), (0x7f, 0x01));
    assert_eq!(
        (*len, *valid),
        (1024, true),
        "in-capsule Connect data is in the payload"
    );
    // SAFETY: the payload holds `len` bytes during the command's life.
    let data = unsafe { std::slice::from_raw_parts(*payload as *const u8, 1024) };
    assert!(data.iter().all(|&b| b == 0xC0));
    // SAFETY: table calls (doca-sta-api.md 5.10 step 4).
    unsafe {
        ok(
            (d.doca_sta_io_qp_add_subsystem)(io, s.subs, qp),
            "add_subsystem",
        );
        ok(
            (d.doca_sta_io_qp_connect_set_sq_size)(io, qp, 31),
            "sq size",
        );
    }
    send_task(s, &c, *token, app_cqe(1, 0, 0), 1);
    let (cqe, _) = recv(&c).expect("Connect response");
    assert_eq!((cqe_cid(&cqe), cqe_status(&cqe)), (1, (0, 0)));
    c
}

fn disconnect(s: &Setup, c: Conn) {
    let d = &env().d;
    let mut t = std::ptr::null_mut();
    // SAFETY: table calls (5.11).
    unsafe {
        ok(
            (d.doca_sta_io_task_disconnect_alloc_init)(c.io, data_u64(77), c.qp, &mut t),
            "disconnect task",
        );
        respond(s, t, 77);
        ok((d.doca_sta_io_qp_destroy)(c.io, c.qp), "qp destroy");
        ok((env().x.loop_destroy)(c.id), "loop destroy");
    }
}

fn teardown(s: Setup) {
    let d = &env().d;
    // SAFETY: table calls (5.12, 5.16).
    unsafe {
        if !s.ns.is_null() {
            ok((d.doca_sta_subsystem_rm_ns)(s.subs, s.ns), "rm_ns");
        }
        ok((d.doca_sta_subsystem_destroy)(s.subs), "subsystem destroy");
    }
    s.nb.destroy(&s.f);
    s.f.teardown();
    assert_eq!(take_violation(), None);
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn offloaded_write_and_read_go_through_the_backend_rings() {
    let _g = serial();
    let s = setup();
    let c = connect(&s);
    // WRITE 4 KiB at LBA 8 from host memory (keyed SGL).
    let mut wbuf = pattern(4096, 7);
    region(&c, 0x1111, &mut wbuf);
    send(
        &c,
        &sqe(
            0x01,
            10,
            1,
            wbuf.as_ptr() as u64,
            4096,
            0x1111,
            KEYED,
            [8, 0, 7],
        ),
    );
    s.f.pump(3);
    let (cqe, _) = recv(&c).expect("write completion");
    assert_eq!((cqe_cid(&cqe), cqe_status(&cqe)), (10, (0, 0)));
    // The command reached the backend as an NVMe command in the SQ ring.
    let e = s.nb.sqe(0);
    assert_eq!(e[0], 0x01);
    assert_eq!(e[1] & 0xC0, 0, "PRPs, not SGLs, toward the drive");
    assert_eq!(u32::from_le_bytes(e[4..8].try_into().unwrap()), BE_NSID);
    let prp1 = u64::from_le_bytes(e[24..32].try_into().unwrap());
    assert!(
        prp1 >= PHYS_OFF,
        "PRP1 {prp1:#x} is the allocator's physical address"
    );
    assert_eq!(u32::from_le_bytes(e[40..44].try_into().unwrap()), 8, "SLBA");
    assert_eq!(s.nb.sq_tail_doorbell(), 1);
    assert_eq!(s.nb.cq_head_doorbell(), 1);
    // READ it back into another host buffer, with Invalidate.
    let mut rbuf = vec![0u8; 4096];
    region(&c, 0x2222, &mut rbuf);
    send(
        &c,
        &sqe(
            0x02,
            11,
            1,
            rbuf.as_ptr() as u64,
            4096,
            0x2222,
            KEYED_INVALIDATE,
            [8, 0, 7],
        ),
    );
    s.f.pump(3);
    let (cqe, inv) = recv(&c).expect("read completion");
    assert_eq!((cqe_cid(&cqe), cqe_status(&cqe)), (11, (0, 0)));
    assert_eq!(inv, 0x2222, "SEND with Invalidate of the host's key");
    assert_eq!(rbuf, wbuf);
    // 32 KiB: PRP list.
    let mut big = pattern(32768, 3);
    region(&c, 0x3333, &mut big);
    send(
        &c,
        &sqe(
            0x01,
            12,
            1,
            big.as_ptr() as u64,
            32768,
            0x3333,
            KEYED,
            [100, 0, 63],
        ),
    );
    s.f.pump(3);
    assert_eq!(cqe_status(&recv(&c).expect("big write").0), (0, 0));
    let mut big_r = vec![0u8; 32768];
    region(&c, 0x4444, &mut big_r);
    send(
        &c,
        &sqe(
            0x02,
            13,
            1,
            big_r.as_ptr() as u64,
            32768,
            0x4444,
            KEYED,
            [100, 0, 63],
        ),
    );
    s.f.pump(3);
    assert_eq!(cqe_status(&recv(&c).expect("big read").0), (0, 0));
    assert_eq!(big_r, big);
    // 8 KiB: PRP1 and PRP2.
    let mut two = pattern(8192, 11);
    region(&c, 0x6666, &mut two);
    send(
        &c,
        &sqe(
            0x01,
            17,
            1,
            two.as_ptr() as u64,
            8192,
            0x6666,
            KEYED,
            [300, 0, 15],
        ),
    );
    s.f.pump(3);
    assert_eq!(cqe_status(&recv(&c).expect("8k write").0), (0, 0));
    // Another 8 KiB write elsewhere, so no stale buffer content can pass for the data.
    let mut other = pattern(8192, 200);
    region(&c, 0x8888, &mut other);
    send(
        &c,
        &sqe(
            0x01,
            19,
            1,
            other.as_ptr() as u64,
            8192,
            0x8888,
            KEYED,
            [400, 0, 15],
        ),
    );
    s.f.pump(3);
    assert_eq!(cqe_status(&recv(&c).expect("other write").0), (0, 0));
    let mut two_r = vec![0u8; 8192];
    region(&c, 0x7777, &mut two_r);
    send(
        &c,
        &sqe(
            0x02,
            18,
            1,
            two_r.as_ptr() as u64,
            8192,
            0x7777,
            KEYED,
            [300, 0, 15],
        ),
    );
    s.f.pump(3);
    assert_eq!(cqe_status(&recv(&c).expect("8k read").0), (0, 0));
    assert_eq!(two_r, two);
    // In-capsule WRITE of one block, then FLUSH.
    let blk = pattern(512, 99);
    let mut cap = sqe(0x01, 14, 1, 0, 512, 0, INCAPSULE, [200, 0, 0]).to_vec();
    cap.extend_from_slice(&blk);
    send(&c, &cap);
    send(&c, &sqe(0x00, 15, 1, 0, 0, 0, INCAPSULE, [0, 0, 0]));
    s.f.pump(3);
    let mut got: Vec<(u16, (u8, u8))> = std::iter::from_fn(|| recv(&c))
        .map(|(q, _)| (cqe_cid(&q), cqe_status(&q)))
        .collect();
    got.sort();
    assert_eq!(got, vec![(14, (0, 0)), (15, (0, 0))]);
    let mut one = vec![0u8; 512];
    region(&c, 0x5555, &mut one);
    send(
        &c,
        &sqe(
            0x02,
            16,
            1,
            one.as_ptr() as u64,
            512,
            0x5555,
            KEYED,
            [200, 0, 0],
        ),
    );
    s.f.pump(3);
    assert_eq!(cqe_status(&recv(&c).expect("read block").0), (0, 0));
    assert_eq!(one, blk);
    assert!(
        take_log()
            .iter()
            .all(|e| !matches!(e, Ev::NonOffload { .. })),
        "nothing was handed up"
    );
    // Namespace counters.
    let d = &env().d;
    // SAFETY: table call; the entries are library-owned.
    unsafe {
        let mut e = std::ptr::null();
        let mut n = 0u16;
        ok(
            (d.doca_sta_get_ns_stats)(s.subs, s.ns, &mut e, &mut n),
            "ns stats",
        );
        let v: Vec<u64> = (0..n as usize).map(|i| *(*e.add(i)).val).collect();
        assert_eq!(&v[..3], &[4, 5, 1], "reads, writes, flushes");
        assert_eq!(v[3], 4096 + 32768 + 8192 + 512);
    }
    disconnect(&s, c);
    teardown(s);
}

#[test]
fn non_offloaded_commands_are_answered_with_the_three_tasks() {
    let _g = serial();
    let s = setup();
    let c = connect(&s);
    let d = &env().d;
    // Identify-like command with a 4 KiB keyed SGL: WRITE+SEND.
    let mut host = vec![0u8; 4096];
    region(&c, 0x10, &mut host);
    send(
        &c,
        &sqe(
            0x06,
            20,
            0,
            host.as_ptr() as u64,
            4096,
            0x10,
            KEYED,
            [1, 0, 0],
        ),
    );
    s.f.pump(1);
    let log = take_log();
    let [Ev::NonOffload {
        len,
        valid,
        token,
        payload,
        ..
    }] = &log[..]
    else {
        panic!("{log:?}")
    };
    assert_eq!((*len, *valid), (4096, false));
    // SAFETY: the payload is the engine's buffer of `len` bytes for this command.
    unsafe { std::ptr::write_bytes(*payload as *mut u8, 0x5A, 4096) };
    let mut t = std::ptr::null_mut();
    let mut cqe = app_cqe(20, 0, 0);
    // SAFETY: table call.
    ok(
        unsafe {
            (d.doca_sta_io_task_non_offload_rdma_write_send_alloc_init)(
                s.f.io,
                data_u64(2),
                c.qp,
                cqe.as_mut_ptr(),
                data_u64(*token),
                &mut t,
            )
        },
        "write_send",
    );
    // A second answer to the same command is refused while the first is in flight.
    let mut t2 = std::ptr::null_mut();
    respond(&s, t, 2);
    assert!(
        host.iter().all(|&b| b == 0x5A),
        "payload written to the host"
    );
    let (cqe_got, _) = recv(&c).expect("response");
    assert_eq!(cqe_cid(&cqe_got), 20);
    // SAFETY: table call with a token already answered.
    let r = unsafe {
        (d.doca_sta_io_task_non_offload_rdma_send_alloc_init)(
            s.f.io,
            data_u64(3),
            c.qp,
            cqe.as_mut_ptr(),
            data_u64(*token),
            &mut t2,
        )
    };
    assert_eq!(r, DOCA_ERROR_BAD_STATE);
    expect_violation("state.command");

    // Host-to-controller data (DSM ranges, keyed): READ task, then SEND.
    let mut ranges = pattern(16, 1);
    region(&c, 0x20, &mut ranges);
    send(
        &c,
        &sqe(
            0x09,
            21,
            1,
            ranges.as_ptr() as u64,
            16,
            0x20,
            KEYED,
            [0, 4, 0],
        ),
    );
    s.f.pump(1);
    let log = take_log();
    let [Ev::NonOffload {
        len,
        valid,
        token,
        payload,
        ..
    }] = &log[..]
    else {
        panic!("{log:?}")
    };
    assert_eq!((*len, *valid), (16, false));
    let mut t = std::ptr::null_mut();
    // SAFETY: table call.
    ok(
        unsafe {
            (d.doca_sta_io_task_non_offload_rdma_read_alloc_init)(
                s.f.io,
                data_u64(4),
                c.qp,
                data_u64(*token),
                &mut t,
            )
        },
        "read task",
    );
    respond(&s, t, 4);
    // SAFETY: the payload holds the host's 16 bytes now.
    let got = unsafe { std::slice::from_raw_parts(*payload as *const u8, 16) };
    assert_eq!(got, &ranges[..]);
    // Reading again: the data is already there.
    // SAFETY: table call.
    let r = unsafe {
        (d.doca_sta_io_task_non_offload_rdma_read_alloc_init)(
            s.f.io,
            data_u64(5),
            c.qp,
            data_u64(*token),
            &mut t,
        )
    };
    assert_eq!(r, DOCA_ERROR_BAD_STATE);
    expect_violation("state.rdma-read");
    send_task(&s, &c, *token, app_cqe(21, 0, 0), 6);
    assert_eq!(cqe_cid(&recv(&c).expect("dsm response").0), 21);

    // A READ to a namespace the subsystem lacks is not offloaded: the application answers.
    send(&c, &sqe(0x02, 22, 9, 0, 512, 0x30, KEYED, [0, 0, 0]));
    s.f.pump(1);
    let log = take_log();
    let [Ev::NonOffload { sqe: q, token, .. }] = &log[..] else {
        panic!("{log:?}")
    };
    assert_eq!(u32::from_le_bytes(q[4..8].try_into().unwrap()), 9);
    send_task(&s, &c, *token, app_cqe(22, 0, 0x0b), 7);
    assert_eq!(cqe_status(&recv(&c).expect("invalid ns").0), (0, 0x0b));
    disconnect(&s, c);
    teardown(s);
}

#[test]
fn bad_capsules_get_the_nvme_status_and_a_cqe_notify_event() {
    let _g = serial();
    let s = setup();
    let c = connect(&s);
    // SGL shorter than NLB x block size: Data SGL Length Invalid, answered by the engine.
    let mut b = vec![0u8; 1024];
    region(&c, 0x40, &mut b);
    send(
        &c,
        &sqe(0x02, 30, 1, b.as_ptr() as u64, 1024, 0x40, KEYED, [0, 0, 7]),
    );
    s.f.pump(3);
    assert_eq!(cqe_status(&recv(&c).expect("validation").0), (0, 0x0f));
    // Past the end of the drive: LBA Out of Range from the backend.
    send(
        &c,
        &sqe(
            0x02,
            31,
            1,
            b.as_ptr() as u64,
            512,
            0x40,
            KEYED,
            [0, 0x1000, 0],
        ),
    );
    s.f.pump(3);
    assert_eq!(cqe_status(&recv(&c).expect("out of range").0), (0, 0x80));
    let cqes: Vec<(u32, u16, u8)> = take_log()
        .into_iter()
        .filter_map(|e| match e {
            Ev::Cqe {
                typ, cid, opcode, ..
            } => Some((typ, cid, opcode)),
            _ => None,
        })
        .collect();
    assert_eq!(
        cqes,
        vec![
            (DOCA_STA_CQE_NOTIF_NVME_OF_VALIDATION_ERR, 30, 0x02),
            (DOCA_STA_CQE_NOTIF_NVME_COMP_ERR, 31, 0x02)
        ]
    );
    disconnect(&s, c);
    teardown(s);
}

#[test]
fn a_remote_access_error_is_a_transport_error_event() {
    let _g = serial();
    let s = setup();
    let c = connect(&s);
    // WRITE whose keyed SGL names a key the host never registered.
    send(&c, &sqe(0x01, 40, 1, 0x1000, 512, 0xdead, KEYED, [0, 0, 0]));
    s.f.pump(3);
    let t: Vec<Ev> = take_log()
        .into_iter()
        .filter(|e| matches!(e, Ev::Transport { .. }))
        .collect();
    assert_eq!(
        t,
        vec![Ev::Transport {
            qp: c.qp as usize,
            op: 2,
            syndrome: 10
        }],
        "RDMA READ, remote access error"
    );
    disconnect(&s, c);
    teardown(s);
}

#[test]
fn a_stalled_backend_times_out_and_destroying_its_queue_aborts_what_is_outstanding() {
    let _g = serial();
    let mut s = setup();
    let c = connect(&s);
    let d = &env().d;
    let x = &env().x;
    // SAFETY: extension calls on live handles.
    unsafe {
        ok((x.null_drive_stall)(s.nb.be, 1), "stall");
        ok((x.set_be_timeout_ms)(s.f.sta, 1), "timeout");
    }
    let mut b = vec![0u8; 512];
    region(&c, 0x50, &mut b);
    send(
        &c,
        &sqe(0x02, 50, 1, b.as_ptr() as u64, 512, 0x50, KEYED, [0, 0, 0]),
    );
    s.f.pump(2);
    assert!(recv(&c).is_none(), "the stalled drive answers nothing");
    std::thread::sleep(std::time::Duration::from_millis(5));
    s.f.pump(2);
    let log = take_log();
    assert!(
        log.contains(&Ev::BeTimeout {
            be: s.nb.be as usize,
            beq: s.nb.beq as usize
        }),
        "backend timeout event: {log:?}"
    );
    // Retire the queue while the command is outstanding: answered with Aborted - SQ Deletion.
    let mut t = std::ptr::null_mut();
    // SAFETY: table calls.
    unsafe {
        ok(
            (d.doca_sta_be_destroy_queue_task_alloc_init)(s.nb.beq, data_u64(8), &mut t),
            "beq destroy",
        );
        respond(&s, t, 8);
    }
    assert_eq!(cqe_status(&recv(&c).expect("aborted").0), (0, 0x08));
    // With no queue left the namespace is not ready.
    send(
        &c,
        &sqe(0x02, 51, 1, b.as_ptr() as u64, 512, 0x50, KEYED, [0, 0, 0]),
    );
    s.f.pump(2);
    assert_eq!(cqe_status(&recv(&c).expect("not ready").0), (0, 0x82));
    disconnect(&s, c);
    // SAFETY: table calls: the queue is gone already; remove the rest by hand.
    unsafe {
        ok((d.doca_sta_subsystem_rm_ns)(s.subs, s.ns), "rm_ns");
        s.ns = std::ptr::null_mut();
        for m in s.nb.mmaps.drain(..) {
            ok((d.doca_mmap_destroy)(m), "mmap");
        }
        ok((d.doca_sta_be_destroy)(s.nb.be), "be");
        ok((d.doca_sta_subsystem_destroy)(s.subs), "subsystem");
    }
    s.f.teardown();
    assert_eq!(take_violation(), None);
}

#[test]
fn namespace_removal_waits_for_io_in_flight() {
    let _g = serial();
    let mut s = setup();
    let c = connect(&s);
    let d = &env().d;
    // SAFETY: extension call.
    ok(unsafe { (env().x.null_drive_stall)(s.nb.be, 1) }, "stall");
    let mut b = pattern(512, 5);
    region(&c, 0x60, &mut b);
    send(
        &c,
        &sqe(0x01, 60, 1, b.as_ptr() as u64, 512, 0x60, KEYED, [0, 0, 0]),
    );
    s.f.pump(2);
    let mut t = std::ptr::null_mut();
    // SAFETY: table calls.
    unsafe {
        ok(
            (d.doca_sta_subsystem_task_rm_ns_alloc_init)(s.subs, s.ns, data_u64(9), &mut t),
            "rm_ns task",
        );
        ok(
            (d.doca_task_submit)((d.doca_sta_producer_send_task_as_task)(t)),
            "submit",
        );
    }
    s.f.pump(3);
    assert!(
        !take_log()
            .iter()
            .any(|e| matches!(e, Ev::TaskOk { user: 9, .. })),
        "a write is still in flight"
    );
    // New I/O to the namespace is no longer offloaded.
    send(
        &c,
        &sqe(0x02, 61, 1, b.as_ptr() as u64, 512, 0x60, KEYED, [0, 0, 0]),
    );
    s.f.pump(1);
    let log = take_log();
    let token = log
        .iter()
        .find_map(|e| match e {
            Ev::NonOffload { token, .. } => Some(*token),
            _ => None,
        })
        .expect("handed up while the namespace is being removed");
    // SAFETY: extension call.
    ok(unsafe { (env().x.null_drive_stall)(s.nb.be, 0) }, "resume");
    s.f.pump(3);
    assert_eq!(cqe_status(&recv(&c).expect("write done").0), (0, 0));
    assert!(
        take_log().contains(&Ev::TaskOk {
            task: t as usize,
            user: 9
        }),
        "removal completes after the write"
    );
    // SAFETY: table call.
    unsafe { (d.doca_task_free)((d.doca_sta_producer_send_task_as_task)(t)) };
    send_task(&s, &c, token, app_cqe(61, 0, 0x82), 10);
    assert_eq!(cqe_status(&recv(&c).expect("answered").0), (0, 0x82));
    s.ns = std::ptr::null_mut();
    disconnect(&s, c);
    teardown(s);
}

#[test]
fn qp_rules() {
    let _g = serial();
    let s = setup();
    let c = connect(&s);
    let d = &env().d;
    // SAFETY: table calls on live handles, each breaking one rule.
    unsafe {
        assert_eq!(
            (d.doca_sta_io_qp_connect_set_sq_size)(s.f.io, c.qp, 15),
            DOCA_ERROR_BAD_STATE
        );
        expect_violation("state.sq-size");
        assert_eq!(
            (d.doca_sta_io_qp_connect_established)(s.f.io, c.qp),
            DOCA_ERROR_BAD_STATE
        );
        expect_violation("state.qp");
        assert_eq!(
            (d.doca_sta_io_qp_destroy)(s.f.io, c.qp),
            DOCA_ERROR_BAD_STATE
        );
        expect_violation("teardown.qp");
        assert_eq!((d.doca_sta_subsystem_destroy)(s.subs), DOCA_ERROR_IN_USE);
        expect_violation("teardown.subsystem");
        // The IO context belongs to this thread now.
        let (io, qp) = (s.f.io as usize, c.qp as usize);
        let r = std::thread::spawn(move || {
            (d.doca_sta_io_qp_connect_established)(
                io as *mut doca_sta_io,
                qp as *mut doca_sta_qp_handle,
            )
        })
        .join()
        .unwrap();
        assert_eq!(r, DOCA_ERROR_BAD_STATE);
        expect_violation("order.io-thread");
        let mut info = (0u32, 0u16, 0u16);
        ok((d.doca_sta_io_qp_get_id)(c.qp, &mut info.0), "qp id");
        ok((d.doca_sta_io_qp_get_group_id)(c.qp, &mut info.1), "group");
        ok(
            (d.doca_sta_io_qp_get_index_in_group)(c.qp, &mut info.2),
            "index",
        );
        assert_eq!((info.1, info.2), (0, 0));
        let mut u = data_u64(0);
        ok((d.doca_sta_io_qp_get_user_data)(c.qp, &mut u), "user data");
        assert_eq!(data_as_u64(u), 0xabc);
    }
    // The host goes away: posted receives flush, no transport error is reported.
    // SAFETY: extension call.
    ok(
        unsafe { (env().x.loop_disconnect)(c.id) },
        "host disconnect",
    );
    s.f.pump(2);
    assert!(!take_log().iter().any(|e| matches!(e, Ev::Transport { .. })));
    disconnect(&s, c);
    teardown(s);
}

static PROGRESS_PE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

unsafe extern "C" fn progress_inside(_t: *mut doca_sta_producer_task_send, _u: doca_data) {
    let pe = PROGRESS_PE.load(std::sync::atomic::Ordering::Relaxed) as *mut doca_pe;
    // SAFETY: breaking the rule on purpose (report mode).
    let r = unsafe { (env().d.doca_pe_progress)(pe) };
    assert_eq!(r, 0);
}

#[test]
fn progress_from_inside_a_callback_breaks_the_contract() {
    let _g = serial();
    let d = &env().d;
    let f = Fx::main_only();
    PROGRESS_PE.store(f.pe as usize, std::sync::atomic::Ordering::Relaxed);
    // A main context whose rm_ns callbacks call doca_pe_progress.
    let dev = open_dev("tdev1");
    let mut sta = std::ptr::null_mut();
    let mut pe = std::ptr::null_mut();
    // SAFETY: table calls.
    unsafe {
        ok((d.doca_sta_create)(dev, &mut sta), "create");
        ok((d.doca_pe_create)(&mut pe), "pe");
        ok(
            (d.doca_pe_connect_ctx)(pe, (d.doca_sta_as_ctx)(sta)),
            "connect",
        );
        ok((d.doca_sta_add_dev)(sta, dev), "add_dev");
        ok(
            (d.doca_sta_mem_allocator_register)(sta, Some(zmalloc), Some(zfree), Some(vtophys)),
            "alloc",
        );
        ok((d.doca_sta_set_max_sta_io)(sta, 1), "max");
        ok(
            (d.doca_sta_subsystem_task_rm_ns_set_conf)(
                sta,
                Some(progress_inside),
                Some(progress_inside),
            ),
            "conf",
        );
        assert_eq!(
            (d.doca_ctx_start)((d.doca_sta_as_ctx)(sta)),
            DOCA_ERROR_IN_PROGRESS
        );
        (d.doca_pe_progress)(pe);
        let mut subs = std::ptr::null_mut();
        ok(
            (d.doca_sta_subsystem_create)(sta, c"nqn.2026-11.dev.test:cb".as_ptr(), &mut subs),
            "subs",
        );
        let mut be = std::ptr::null_mut();
        ok((d.doca_sta_be_create)(sta, &mut be), "be");
        let mut ns = std::ptr::null_mut();
        ok(
            (d.doca_sta_subsystem_add_ns)(subs, 1, 512, 1, be, &mut ns),
            "ns",
        );
        let mut t = std::ptr::null_mut();
        ok(
            (d.doca_sta_subsystem_task_rm_ns_alloc_init)(subs, ns, data_u64(0), &mut t),
            "task",
        );
        let task = (d.doca_sta_producer_send_task_as_task)(t);
        ok((d.doca_task_submit)(task), "submit");
        (d.doca_pe_progress)(pe);
        expect_violation("order.progress-in-callback");
        (d.doca_task_free)(task);
        ok((d.doca_sta_subsystem_destroy)(subs), "subs destroy");
        ok((d.doca_sta_be_destroy)(be), "be destroy");
        let ctx = (d.doca_sta_as_ctx)(sta);
        ok((d.doca_ctx_stop)(ctx), "stop");
        ok((d.doca_sta_destroy)(sta), "destroy");
        ok((d.doca_pe_destroy)(pe), "pe destroy");
        ok((d.doca_dev_close)(dev), "close");
    }
    f.teardown();
    assert_eq!(take_violation(), None);
}

/// Issue 12 (second attempt), hypothesis 2: a backend queue is shared by the IO contexts,
/// and whichever context's progress reaps a completion used to post the answer on the
/// QP's link itself, also for a QP of another IO context (the real library makes every QP
/// call on the thread owning the QP). Now the answer waits for the owner's own progress,
/// and the owner's PE is woken for it. Fails before the change: context 1's progress sent
/// context 2's completion.
#[test]
fn an_io_context_posts_only_its_own_qps_and_wakes_the_owner_of_the_others() {
    let _g = serial();
    let s = setup_with(Fx::two_io());
    let d = &env().d;
    let x = &env().x;
    let c = connect_on(&s, s.f.io2);
    let mut b = vec![0u8; 512];
    region(&c, 0x60, &mut b);
    // SAFETY: extension call on a live backend.
    unsafe { ok((x.null_drive_stall)(s.nb.be, 1), "stall") };
    send(
        &c,
        &sqe(0x02, 60, 1, b.as_ptr() as u64, 512, 0x60, KEYED, [0, 0, 0]),
    );
    // The owner takes the capsule and puts it in the backend queue (stalled: unserved).
    // SAFETY: live PE, not inside a callback.
    unsafe { (d.doca_pe_progress)(s.f.io2_pe) };
    assert!(recv(&c).is_none(), "the stalled drive answers nothing");
    // The other context's progress serves and reaps the queue.
    let mut fd: doca_notification_handle_t = Default::default();
    // SAFETY: live PEs, valid out pointer, not inside a callback.
    unsafe {
        ok((x.null_drive_stall)(s.nb.be, 0), "unstall");
        ok(
            (d.doca_pe_get_notification_handle)(s.f.io2_pe, &mut fd),
            "notification handle",
        );
        ok((d.doca_pe_clear_notification)(s.f.io2_pe, fd), "clear");
        (d.doca_pe_progress)(s.f.io_pe);
    }
    assert!(
        recv(&c).is_none(),
        "IO context 1's progress posted the answer on a QP of IO context 2"
    );
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: a valid pollfd, no wait.
    let ready = unsafe { libc::poll(&mut p, 1, 0) };
    assert_eq!(ready, 1, "the owner's PE is woken");
    // SAFETY: live PE, not inside a callback.
    unsafe { (d.doca_pe_progress)(s.f.io2_pe) };
    let (cqe, _) = recv(&c).expect("the owner posts the answer");
    assert_eq!((cqe_cid(&cqe), cqe_status(&cqe)), (60, (0, 0)));
    disconnect(&s, c);
    teardown(s);
}
