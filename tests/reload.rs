//! Live reload (SIGHUP) end to end: namespaces appear and disappear under connected
//! hosts, which get the Namespace Attribute Changed event and the Changed Namespace
//! List; an invalid file changes nothing.

mod common;

use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use nvmf::spec::Status;
use nvmf_initiator::TcpHost;

const ONE_NS: &str = "\
io_threads: 2
listeners:
  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: {port}}
backends:
  - {name: ram0, type: ram, size: 64MiB, block_size: 512}
  - {name: ram2, type: ram, size: 16MiB, block_size: 512}
subsystems:
  - nqn: nqn.2026-11.dev.nvmf-target:e2e
    allow_any_host: true
    namespaces:
      - {nsid: 1, backend: ram0}
";

fn write_config(d: &Daemon, text: &str) {
    std::fs::write(d.dir().join("nvmf-target.yaml"), d.fill(text)).expect("rewrite config");
}

/// Waits for the log to contain `what` (the daemon logs each reload step).
fn wait_log(d: &Daemon, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.log().contains(what) {
        assert!(
            Instant::now() < deadline,
            "log never said {what:?}:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn active_nsids(admin: &mut TcpHost) -> Vec<u32> {
    let list = admin
        .identify(2, 0)
        .expect("Identify active namespace list");
    list.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .take_while(|&n| n != 0)
        .collect()
}

#[test]
fn reload_adds_and_removes_a_namespace_under_a_connected_host() {
    let _w = watchdog("reload_adds_and_removes", Duration::from_secs(60));
    let mut d = Daemon::start(ONE_NS);
    let opts = host_opts();
    let mut c = controller(&d, 1, &opts);
    assert_eq!(active_nsids(&mut c.admin), vec![1]);
    // Enable Namespace Attribute Notices (Async Event Configuration bit 8), as the Linux
    // host does after connecting.
    c.admin
        .set_features(0x0b, 0, 1 << 8, false)
        .expect("Set Features: Async Event Config");

    // Add namespace 2: the held AER completes with Namespace Attribute Changed (type 2
    // notice, info 00h, log page 04h), the changed list names 2, and the existing I/O
    // queue serves it without reconnecting.
    let aer = submit_aer(&mut c.admin);
    write_config(
        &d,
        &ONE_NS.replace(
            "      - {nsid: 1, backend: ram0}\n",
            "      - {nsid: 1, backend: ram0}\n      - {nsid: 2, backend: ram2}\n",
        ),
    );
    d.signal(Signal::SIGHUP);
    let done = c
        .admin
        .poll_completion()
        .expect("AER completion after adding a namespace");
    assert_eq!(done.cid, aer);
    assert_ok(done.cqe.status(), "AER");
    assert_eq!(
        done.cqe.dw0, 0x0004_0002,
        "AER dw0: notice / NS attribute changed / log 04h"
    );
    let changed = c
        .admin
        .get_log_page(0x04, 0xffff_ffff, 0, 4096, false)
        .expect("log 04h");
    assert_eq!(u32::from_le_bytes(changed[0..4].try_into().unwrap()), 2);
    assert_eq!(u32::from_le_bytes(changed[4..8].try_into().unwrap()), 0);
    assert_eq!(active_nsids(&mut c.admin), vec![1, 2]);
    let data = pattern(42, 8192);
    let q = &mut c.io[0];
    assert_ok(
        q.write(2, 8, &data, false).expect("write ns 2"),
        "write to the new namespace",
    );
    let mut back = vec![0u8; 8192];
    assert_ok(
        q.read(2, 8, 16, &mut back).expect("read ns 2"),
        "read from the new namespace",
    );
    assert!(back == data, "new namespace returned other data");

    // Remove it again: another AER completes, I/O to it fails with Invalid Namespace,
    // namespace 1 keeps working on the same queue.
    let aer = submit_aer(&mut c.admin);
    write_config(&d, ONE_NS);
    d.signal(Signal::SIGHUP);
    let done = c
        .admin
        .poll_completion()
        .expect("AER completion after removing a namespace");
    assert_eq!((done.cid, done.cqe.dw0), (aer, 0x0004_0002));
    wait_log(&d, "drained and detached");
    assert_eq!(active_nsids(&mut c.admin), vec![1]);
    let q = &mut c.io[0];
    let s = q.read(2, 8, 16, &mut back).expect("read removed ns");
    assert_status(
        s,
        Status::INVALID_NAMESPACE,
        "read from a removed namespace",
    );
    assert_ok(
        q.read(1, 0, 16, &mut back).expect("read ns 1"),
        "namespace 1 after the removal",
    );
    d.stop();
}

#[test]
fn invalid_reload_changes_nothing() {
    let _w = watchdog("invalid_reload_changes_nothing", Duration::from_secs(60));
    let mut d = Daemon::start(ONE_NS);
    let opts = host_opts();
    let mut c = controller(&d, 1, &opts);
    let data = pattern(7, 4096);
    assert_ok(c.io[0].write(1, 0, &data, false).expect("write"), "write");

    // A file with an unknown backend reference: rejected as a whole, with file:line.
    write_config(
        &d,
        &ONE_NS.replace("{nsid: 1, backend: ram0}", "{nsid: 1, backend: nope}"),
    );
    d.signal(Signal::SIGHUP);
    wait_log(&d, "reload rejected");
    assert!(
        d.log().contains("nvmf-target.yaml:"),
        "no file:line in:\n{}",
        d.log()
    );
    let mut back = vec![0u8; 4096];
    assert_ok(
        c.io[0].read(1, 0, 8, &mut back).expect("read"),
        "read after a rejected reload",
    );
    assert!(back == data);
    assert_eq!(active_nsids(&mut c.admin), vec![1]);

    // The same file again: no changes.
    write_config(&d, ONE_NS);
    d.signal(Signal::SIGHUP);
    wait_log(&d, "reload: no changes");
    d.stop();
}

#[test]
fn a_host_taken_off_the_list_by_reload_is_disconnected_and_named_in_the_log() {
    let _w = watchdog("host_taken_off_the_list", Duration::from_secs(60));
    let opts = host_opts();
    let allowed = ONE_NS.replace(
        "    allow_any_host: true\n",
        &format!("    allow_any_host: false\n    hosts: [{}]\n", opts.hostnqn),
    );
    let mut d = Daemon::start(&allowed);
    let mut c = controller(&d, 1, &opts);
    let mut back = vec![0u8; 4096];
    assert_ok(
        c.io[0].read(1, 0, 8, &mut back).expect("read"),
        "read while allowed",
    );

    write_config(
        &d,
        &ONE_NS.replace(
            "    allow_any_host: true\n",
            "    allow_any_host: false\n    hosts: [nqn.2026-11.dev.test:someone-else]\n",
        ),
    );
    d.signal(Signal::SIGHUP);
    let line = format!(
        "controller {} of host \"{}\" disconnected: the host is no longer allowed",
        c.cntlid, opts.hostnqn
    );
    wait_log(&d, &line);
    // The host's queues are closed. The IO threads hear of it by message, after the
    // reload's log line: a command that reaches a thread not yet scheduled since may still
    // be served (a loaded machine leaves a thread waiting for milliseconds), so the queue
    // must stop serving soon, not at once.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut served = 0;
    while c.io[0].read(1, 0, 8, &mut back).is_ok() {
        served += 1;
        assert!(
            Instant::now() < deadline,
            "the removed host's queue still serves 5 s after the reload ({served} reads)"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    d.stop();
}

const NAMED_LISTENER: &str = "\
io_threads: 1
listeners:
  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: {port}}
backends:
  - {name: ram0, type: ram, size: 16MiB, block_size: 512}
subsystems:
  - nqn: nqn.2026-11.dev.nvmf-target:e2e
    allow_any_host: true
    listeners: [tcp0]
    namespaces:
      - {nsid: 1, backend: ram0}
";

/// A listener moved by reload to an address it cannot bind keeps listening where it was
/// (before, the old socket was closed first and the daemon listened nowhere); moved to
/// one it can bind, the subsystem that names it follows at once (before, the subsystem
/// stayed bound to the old address until a restart, and every new Connect was refused
/// with DNR and it left the discovery log), and the controllers that came through the
/// old address are disconnected.
#[test]
fn a_listener_move_keeps_the_old_address_on_failure_and_takes_its_subsystem_along() {
    let _w = watchdog("listener_move", Duration::from_secs(60));
    let mut d = Daemon::start(NAMED_LISTENER);
    let opts = host_opts();
    let mut c = controller(&d, 1, &opts);
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a busy port");
    let busy_port = busy.local_addr().unwrap().port();
    let moved = |port: u16| NAMED_LISTENER.replace("port: {port}}", &format!("port: {port}}}"));
    write_config(&d, &moved(busy_port));
    d.signal(Signal::SIGHUP);
    wait_log(&d, "Address already in use");
    // Still served on the old address, by a new host too.
    let mut c2 = controller(&d, 1, &opts);
    assert_ok(
        c2.io[0]
            .write(1, 0, &pattern(1, 512), false)
            .expect("write"),
        "I/O on the kept listener",
    );
    drop(busy);

    let port = free_port();
    write_config(&d, &moved(port));
    d.signal(Signal::SIGHUP);
    wait_log(&d, &format!("listening on 127.0.0.1:{port}"));
    wait_log(
        &d,
        "subsystem nqn.2026-11.dev.nvmf-target:e2e: listeners tcp0",
    );
    let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut h = TcpHost::connect(to, opts.clone()).expect("ICReq on the new address");
    h.connect_admin(SUBNQN, 0)
        .expect("Connect to the subsystem on its listener's new address");
    assert!(
        TcpHost::connect(d.addr(), opts.clone()).is_err(),
        "the old address still listens"
    );
    // Connections made through the old address go, as Linux nvmet and SPDK close a
    // removed listener's: the host reconnects where it is told.
    wait_log(&d, "disconnected: its listener was removed or moved");
    let mut back = vec![0u8; 512];
    assert!(
        c.io[0].read(1, 0, 1, &mut back).is_err(),
        "a queue connected through the old address still serves"
    );
    d.stop();
}

/// A namespace moved by reload to a backend that fails to open stays on its old backend
/// with its data (before, it was removed first and lost until the next good reload), and
/// the next reload of the same file tries the move again.
#[test]
fn a_namespace_moved_to_a_backend_that_cannot_open_stays_where_it_was() {
    let _w = watchdog("namespace_move_fails", Duration::from_secs(60));
    let mut d = Daemon::start(ONE_NS);
    let opts = host_opts();
    let mut c = controller(&d, 1, &opts);
    let data = pattern(9, 4096);
    assert_ok(c.io[0].write(1, 0, &data, false).expect("write"), "write");
    let bad = ONE_NS
        .replace(
            "  - {name: ram2, type: ram, size: 16MiB, block_size: 512}\n",
            "  - {name: ram2, type: ram, size: 16MiB, block_size: 512}\n  - {name: big, type: ram, size: 1000TiB}\n",
        )
        .replace("{nsid: 1, backend: ram0}", "{nsid: 1, backend: big}");
    write_config(&d, &bad);
    d.signal(Signal::SIGHUP);
    wait_log(&d, "reload applied with");
    assert_eq!(active_nsids(&mut c.admin), vec![1]);
    assert!(
        d.log()
            .contains("namespace 1 stays as it was, on backend ram0"),
        "{}",
        d.log()
    );
    let mut back = vec![0u8; 4096];
    assert_ok(
        c.io[0].read(1, 0, 8, &mut back).expect("read"),
        "read after the failed move",
    );
    assert!(back == data, "the namespace lost its data");
    // The same file again: the move is tried again (it is still to do).
    d.signal(Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.log().matches("reload applied with").count() < 2 {
        assert!(Instant::now() < deadline, "not tried again:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Back to the file it runs: nothing to do.
    write_config(&d, ONE_NS);
    d.signal(Signal::SIGHUP);
    wait_log(&d, "reload: no changes");
    d.stop();
}

/// Two listeners that swap ports in one reload: each new address is held by the other
/// until it moves, so binding first fails for both; they are closed and opened again
/// (before, both stayed where they were and every later reload failed the same way).
#[test]
fn two_listeners_can_swap_ports() {
    let _w = watchdog("two_listeners_can_swap_ports", Duration::from_secs(60));
    let other = free_port();
    let two = ONE_NS.replace(
        "  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: {port}}\n",
        &format!(
            "  - {{name: tcp0, transport: tcp, address: 127.0.0.1, port: {{port}}}}\n  - {{name: tcp1, transport: tcp, address: 127.0.0.1, port: {other}}}\n"
        ),
    );
    let mut d = Daemon::start(&two);
    let swapped = two
        .replace("port: {port}}", "port: PORT_A}")
        .replace(&format!("port: {other}}}"), "port: {port}}")
        .replace("port: PORT_A}", &format!("port: {other}}}"));
    write_config(&d, &swapped);
    d.signal(Signal::SIGHUP);
    wait_log(&d, "reload applied");
    assert!(
        !d.log().contains("reload applied with"),
        "the swap failed:\n{}",
        d.log()
    );
    let opts = host_opts();
    for port in [d.port(), other] {
        let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut h = TcpHost::connect(to, opts.clone()).expect("ICReq after the swap");
        h.connect_admin(SUBNQN, 0).expect("Connect after the swap");
    }
    // What runs is the file: nothing left to do.
    d.signal(Signal::SIGHUP);
    wait_log(&d, "reload: no changes");
    d.stop();
}
