//! The control socket end to end, against the daemon binary: `nvmf-target ctl` with real
//! hosts connected through our initiator (status, subsystems, controllers), `disconnect`
//! observed by the host, a peer without permission refused (the client run as another
//! uid with `setpriv`; SKIPPED when that cannot be done here), malformed, oversized and
//! slow requests answered with an error while the daemon keeps serving, the client cap,
//! and `--check-config --diff` / `ctl reload` printing the same summary for each kind of
//! change.
//!
//! `harness = false` (libtest-mimic) for the skip convention of `common/skip.rs`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn main() {
    let as_nobody = nobody_missing();
    skip::run(vec![
        skip::trial(
            "status_subsystems_and_controllers_show_connected_hosts",
            None,
            status_subsystems_and_controllers_show_connected_hosts,
        ),
        skip::trial(
            "disconnect_is_seen_by_the_host_which_can_reconnect",
            None,
            disconnect_is_seen_by_the_host_which_can_reconnect,
        ),
        skip::trial(
            "bad_oversized_slow_and_surplus_clients_get_errors_and_the_daemon_serves_on",
            None,
            bad_oversized_slow_and_surplus_clients_get_errors_and_the_daemon_serves_on,
        ),
        skip::trial(
            "diff_and_ctl_reload_print_each_kind_of_change",
            None,
            diff_and_ctl_reload_print_each_kind_of_change,
        ),
        skip::trial(
            "a_listener_a_reload_could_not_open_is_opened_by_the_next_reload",
            None,
            a_listener_a_reload_could_not_open_is_opened_by_the_next_reload,
        ),
        skip::trial(
            "subsystems_show_ana_states_and_namespace_visibility",
            None,
            subsystems_show_ana_states_and_namespace_visibility,
        ),
        skip::trial(
            "another_user_is_refused",
            as_nobody,
            another_user_is_refused,
        ),
        skip::trial(
            "reload_without_a_control_socket_signals_the_daemon",
            None,
            reload_without_a_control_socket_signals_the_daemon,
        ),
    ]);
}

/// The unit's ExecReload (`ctl --config FILE reload --or-signal $MAINPID`) still reloads
/// a daemon that has no control socket (`control: {enabled: false}`): it sends SIGHUP and
/// says so; without --or-signal it fails and says why. It never asks the default socket,
/// which may be another daemon's (it did: this test, run beside a daemon on the default
/// path, saw that daemon reload its own file).
fn reload_without_a_control_socket_signals_the_daemon() {
    let cfg = CONFIG.replace(
        "control: {path: \"{dir}/ctl/control.sock\"}",
        "control: {enabled: false}",
    );
    assert_ne!(cfg, CONFIG, "common::CONFIG's control line changed");
    let mut d = Daemon::start(&cfg);
    let file = d.dir().join("nvmf-target.yaml");
    let run = |extra: &[&str]| {
        Command::new(daemon_binary())
            .args(["ctl", "--config"])
            .arg(&file)
            .arg("reload")
            .args(extra)
            .output()
            .expect("run nvmf-target ctl")
    };
    let o = run(&[]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("disables the control socket"),
        "{}",
        text(&o)
    );
    let pid = d.pid().expect("pid").to_string();
    let o = run(&["--or-signal", &pid]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("disables the control socket: sent SIGHUP"),
        "{}",
        text(&o)
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.log().contains("reload: no changes") {
        assert!(Instant::now() < deadline, "no reload:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    d.stop();
}

/// The default test config ([`CONFIG`] has the control socket in the test's directory,
/// in a subdirectory the daemon creates (0711), so the permission test can reach it)
/// with the socket's mode set.
fn config_with_control(mode: &str) -> String {
    let with_mode = format!("control: {{path: \"{{dir}}/ctl/control.sock\", mode: \"{mode}\"}}");
    let cfg = CONFIG.replace("control: {path: \"{dir}/ctl/control.sock\"}", &with_mode);
    assert_ne!(cfg, CONFIG, "common::CONFIG's control line changed");
    cfg
}

fn socket(d: &Daemon) -> PathBuf {
    d.dir().join("ctl/control.sock")
}

/// `nvmf-target ctl --socket <d's socket> <args>`.
fn ctl(d: &Daemon, args: &[&str]) -> Output {
    Command::new(daemon_binary())
        .arg("ctl")
        .arg("--socket")
        .arg(socket(d))
        .args(args)
        .output()
        .expect("run nvmf-target ctl")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[track_caller]
fn ctl_ok(d: &Daemon, args: &[&str]) -> String {
    let o = ctl(d, args);
    assert!(o.status.success(), "ctl {args:?} failed: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[track_caller]
fn ctl_json(d: &Daemon, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = ctl_ok(d, &all);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("ctl {args:?}: not JSON ({e}): {out}"))
}

fn status_subsystems_and_controllers_show_connected_hosts() {
    let _w = watchdog("status_subsystems_controllers", Duration::from_secs(60));
    let d = Daemon::start(&config_with_control("0600"));
    let sock = socket(&d);
    let mode = std::fs::metadata(&sock)
        .expect("socket exists")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode");

    // Nothing connected yet.
    let st = ctl_json(&d, &["status"]);
    assert_eq!(st["engine"], "soft");
    assert_eq!(st["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(st["pid"].as_u64(), d.pid().map(u64::from));
    assert_eq!(st["io_threads"].as_array().map(Vec::len), Some(2));
    assert_eq!(st["subsystems"], 2);
    let l = &st["listeners"][0];
    assert_eq!(
        (l["name"].as_str(), l["transport"].as_str()),
        (Some("tcp0"), Some("tcp"))
    );
    assert_eq!(l["port"].as_u64(), Some(u64::from(d.port())));
    assert_eq!(ctl_ok(&d, &["controllers"]), "no controllers connected\n");

    // A controller with two I/O queues of depth 32, and some I/O.
    let opts = host_opts();
    let mut c = controller(&d, 2, &opts);
    let data = pattern(7, 4096);
    assert_ok(c.io[0].write(1, 0, &data, false).expect("write"), "write");
    let mut back = vec![0u8; 4096];
    assert_ok(c.io[1].read(1, 0, 8, &mut back).expect("read"), "read");
    let host_addr = c
        .admin
        .stream()
        .local_addr()
        .expect("local addr")
        .to_string();

    let list = ctl_json(&d, &["controllers"]);
    let list = list.as_array().expect("an array of controllers");
    let me = list
        .iter()
        .find(|x| x["cntlid"].as_u64() == Some(u64::from(c.cntlid)))
        .unwrap_or_else(|| panic!("controller {} not listed: {list:?}", c.cntlid));
    assert_eq!(me["subsystem"], SUBNQN);
    assert_eq!(me["host_nqn"], opts.hostnqn.as_str());
    assert_eq!(me["host_address"], host_addr.as_str());
    assert_eq!(me["listener"], "tcp0");
    assert_eq!(me["transport"], "tcp");
    assert_eq!(me["enabled"], true);
    assert_eq!(me["retired"], false);
    assert_eq!(me["discovery"], false);
    let queues = me["queues"].as_array().expect("queues");
    let qids: Vec<u64> = queues.iter().filter_map(|q| q["qid"].as_u64()).collect();
    assert_eq!(qids, [0, 1, 2]);
    let depths: Vec<u64> = queues.iter().filter_map(|q| q["depth"].as_u64()).collect();
    assert_eq!(depths, [u64::from(opts.admin_sqsize) + 1, 32, 32]);
    assert!(me["connected_since"]
        .as_str()
        .is_some_and(|s| s.ends_with('Z')));
    assert!(me["connected_seconds"].as_u64().is_some_and(|s| s < 60));
    // The engine's per-queue counters, summed for the controller: one write on queue 1,
    // one read on queue 2.
    let io = &me["io"];
    assert_eq!(
        (io["write_commands"].as_u64(), io["read_commands"].as_u64()),
        (Some(1), Some(1)),
        "{me}"
    );
    assert_eq!(
        (
            io["write_bytes"].as_u64(),
            io["read_bytes"].as_u64(),
            io["errors"].as_u64()
        ),
        (Some(4096), Some(4096), Some(0))
    );

    let st = ctl_json(&d, &["status"]);
    assert_eq!(st["controllers"], 1);
    let qps: u64 = st["io_threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["qps"].as_u64())
        .sum();
    assert_eq!(qps, 3, "admin + 2 I/O queues: {st}");

    // Namespaces with their backends and the I/O just done; the restricted subsystem's
    // allow list.
    let subs = ctl_json(&d, &["subsystems"]);
    let e2e = subs
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["nqn"] == SUBNQN)
        .expect("e2e subsystem");
    assert_eq!(e2e["controllers"], 1);
    assert_eq!(e2e["allow_any_host"], true);
    assert_eq!(e2e["all_listeners"], true);
    let ns1 = &e2e["namespaces"][0];
    assert_eq!(
        (ns1["nsid"].as_u64(), ns1["backend"].as_str()),
        (Some(1), Some("ram0"))
    );
    assert_eq!(ns1["size_bytes"].as_u64(), Some(NS1_SIZE));
    assert_eq!(ns1["write_commands"].as_u64(), Some(1));
    assert_eq!(ns1["read_commands"].as_u64(), Some(1));
    assert_eq!(ns1["write_bytes"].as_u64(), Some(4096));
    assert_eq!(e2e["namespaces"][1]["backend"], "f0");
    let r = subs
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["nqn"] == RESTRICTED_NQN)
        .expect("restricted subsystem");
    assert_eq!(r["allow_any_host"], false);
    assert_eq!(r["hosts"][0], ALLOWED_HOST);

    // The tables say the same for a human.
    let table = ctl_ok(&d, &["controllers"]);
    assert!(table.starts_with("CNTLID"), "{table}");
    assert!(
        table.contains(&opts.hostnqn) && table.contains(&host_addr),
        "{table}"
    );
    assert!(
        table.contains("tcp0/tcp") && table.contains("3 (32,32,32)"),
        "{table}"
    );
    let table = ctl_ok(&d, &["status"]);
    assert!(
        table.contains("engine soft") && table.contains("tcp0"),
        "{table}"
    );
    let table = ctl_ok(&d, &["subsystems"]);
    assert!(table.contains(SUBNQN) && table.contains("ram0") && table.contains(ALLOWED_HOST));
}

fn subsystems_show_ana_states_and_namespace_visibility() {
    let _w = watchdog("ana", Duration::from_secs(60));
    let d = Daemon::start(
        "control: {path: \"{dir}/ctl/control.sock\"}
listeners:
  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: {port}}
backends:
  - {name: a, type: ram, size: 4MiB, block_size: 512}
  - {name: b, type: ram, size: 4MiB, block_size: 512}
subsystems:
  - nqn: nqn.2026-11.dev.nvmf-target:e2e
    allow_any_host: true
    ana_groups:
      - {id: 2, states: {tcp0: inaccessible}}
    namespaces:
      - {nsid: 1, backend: a}
      - {nsid: 2, backend: b, ana_group: 2, hosts: [nqn.2026-11.dev.example:h1]}
",
    );
    let subs = ctl_json(&d, &["subsystems"]);
    let s = &subs[0];
    let ns = s["namespaces"].as_array().expect("namespaces");
    assert_eq!(
        (ns[0]["ana_group"].as_u64(), &ns[0]["visible_to"]),
        (Some(1), &Value::Null)
    );
    assert_eq!(ns[1]["ana_group"].as_u64(), Some(2));
    assert_eq!(ns[1]["visible_to"][0], "nqn.2026-11.dev.example:h1");
    let groups = s["ana_groups"].as_array().expect("ana_groups");
    let state = |id: u64| {
        let g = groups
            .iter()
            .find(|g| g["id"].as_u64() == Some(id))
            .expect("group");
        (
            g["states"][0]["listener"].as_str().map(str::to_owned),
            g["states"][0]["state"].as_str().map(str::to_owned),
        )
    };
    assert_eq!(state(1), (Some("tcp0".into()), Some("optimized".into())));
    assert_eq!(state(2), (Some("tcp0".into()), Some("inaccessible".into())));
    let table = ctl_ok(&d, &["subsystems"]);
    assert!(
        table.contains("ANA group 1: tcp0 optimized")
            && table.contains("ANA group 2: tcp0 inaccessible"),
        "{table}"
    );
}

fn disconnect_is_seen_by_the_host_which_can_reconnect() {
    let _w = watchdog("disconnect", Duration::from_secs(60));
    let d = Daemon::start(&config_with_control("0600"));
    let (o1, o2) = (host_opts(), host_opts());
    let mut c1 = controller(&d, 1, &o1);
    let mut c2 = controller(&d, 1, &o2);

    // By host NQN: every queue of host 1 closes; host 2 is untouched.
    let out = ctl_ok(&d, &["disconnect", "--host", &o1.hostnqn]);
    assert!(
        out.contains(&format!("disconnected controller {}", c1.cntlid))
            && out.contains("2 queue(s)"),
        "{out}"
    );
    assert_closed(&mut c1.admin, "host 1 admin queue");
    assert_closed(&mut c1.io[0], "host 1 I/O queue");
    c2.admin.identify(1, 0).expect("host 2 still served");
    assert!(
        d.log().contains("ctl disconnect by uid 0"),
        "log line:\n{}",
        d.log()
    );

    // By SUBNQN:CNTLID.
    let arg = format!("{SUBNQN}:{}", c2.cntlid);
    let j = ctl_json(&d, &["disconnect", "--controller", &arg]);
    assert_eq!(
        j["controllers"][0]["cntlid"].as_u64(),
        Some(u64::from(c2.cntlid))
    );
    assert_eq!(j["controllers"][0]["host_nqn"], o2.hostnqn.as_str());
    assert_closed(&mut c2.admin, "host 2 admin queue");

    // Nothing left to disconnect: a clear error and exit status 1.
    let o = ctl(&d, &["disconnect", "--host", &o1.hostnqn]);
    assert!(!o.status.success());
    assert!(text(&o).contains("no controller of host"), "{}", text(&o));
    let o = ctl(&d, &["disconnect", "--controller", "nqn.x:y:notanumber"]);
    assert!(
        !o.status.success() && text(&o).contains("CNTLID"),
        "{}",
        text(&o)
    );

    // The host reconnects as the Linux host does, and the list shows it once the old
    // controllers are gone.
    let c1 = controller(&d, 1, &o1);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let list = ctl_json(&d, &["controllers"]);
        let ids: Vec<u64> = list
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|x| x["cntlid"].as_u64())
            .collect();
        if ids == [u64::from(c1.cntlid)] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "old controllers still listed: {list}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The target closed this queue's connection: the next command fails.
#[track_caller]
fn assert_closed(h: &mut nvmf_initiator::TcpHost, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut buf = [0u8; 1];
        h.stream()
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("set timeout");
        match h.stream().read(&mut buf) {
            Ok(0) => return,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Ok(_) => panic!("{what}: unexpected bytes after disconnect"),
            Err(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still open 10 s after disconnect"
        );
    }
}

/// One raw request line; the reply line.
fn raw(stream: &mut UnixStream, line: &[u8]) -> Value {
    stream.write_all(line).expect("write request");
    let mut reply = String::new();
    BufReader::new(&*stream)
        .read_line(&mut reply)
        .expect("read reply");
    serde_json::from_str(&reply).unwrap_or_else(|e| panic!("reply not JSON ({e}): {reply:?}"))
}

fn connect(d: &Daemon) -> UnixStream {
    let s = UnixStream::connect(socket(d)).expect("connect to the control socket");
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s
}

fn bad_oversized_slow_and_surplus_clients_get_errors_and_the_daemon_serves_on() {
    let _w = watchdog("bad_requests", Duration::from_secs(90));
    let mut d = Daemon::start(&config_with_control("0600"));

    // The client cap, first, while no other client holds a slot (a closed client's
    // thread frees its slot a moment after the close): 8 idle clients hold every slot, a
    // 9th is refused at once; the idle ones are dropped at the read deadline (5 s) with
    // an error.
    let started = Instant::now();
    let mut idle: Vec<UnixStream> = (0..8).map(|_| connect(&d)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut extra = connect(&d);
    let mut reply = String::new();
    BufReader::new(&mut extra)
        .read_line(&mut reply)
        .expect("busy reply");
    assert!(reply.contains("busy"), "{reply}");
    for s in &mut idle {
        let mut reply = String::new();
        BufReader::new(&*s)
            .read_line(&mut reply)
            .expect("timeout reply");
        assert!(reply.contains("timeout"), "{reply}");
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(4) && waited < Duration::from_secs(12),
        "idle clients dropped after {waited:?}, expected the 5 s deadline"
    );
    // Malformed and unknown requests: an error each, the connection stays usable.
    let mut s = connect(&d);
    for (line, want) in [
        (&b"this is not json\n"[..], "not a JSON object"),
        (b"{\"command\":\"status\"}\n", "missing \"version\""),
        (
            b"{\"version\":9,\"command\":\"status\"}\n",
            "unsupported protocol version 9",
        ),
        (
            b"{\"version\":1,\"command\":\"format-all\"}\n",
            "unknown command",
        ),
        (
            b"{\"version\":1,\"command\":\"disconnect\"}\n",
            "either \"host\"",
        ),
        (b"\xff\xfe\n", "not a JSON object"),
    ] {
        let r = raw(&mut s, line);
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(r["version"], 1);
        let e = r["error"].as_str().unwrap_or_default();
        assert!(
            e.contains(want),
            "{:?}: {e:?} lacks {want:?}",
            String::from_utf8_lossy(line)
        );
    }
    let r = raw(&mut s, b"{\"version\":1,\"command\":\"status\"}\n");
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"]["engine"], "soft");
    drop(s);

    // Oversized: an error, then the connection is closed.
    let mut s = connect(&d);
    let r = raw(&mut s, &vec![b'x'; 5000]);
    assert!(
        r["error"].as_str().unwrap().contains("request too large"),
        "{r}"
    );
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).expect("closed after the error");
    assert!(rest.is_empty());

    // A slow client that trickles a line over the deadline is dropped too.
    let mut slow = connect(&d);
    slow.write_all(b"{\"version\":1,").unwrap();
    let mut reply = String::new();
    BufReader::new(&slow)
        .read_line(&mut reply)
        .expect("timeout reply");
    assert!(reply.contains("timeout"), "{reply}");

    // The daemon is unaffected: hosts and the socket are served.
    assert_serves(&mut d);
    assert!(ctl_ok(&d, &["status"]).contains("engine soft"));
    d.stop();
    assert!(!socket(&d).exists(), "the socket file is removed at stop");
}

/// A config file in the daemon's directory (placeholders filled).
fn write_file(d: &Daemon, name: &str, text: &str) -> PathBuf {
    let text = text
        .replace("{port}", &d.port().to_string())
        .replace("{dir}", &d.dir().display().to_string());
    let p = d.dir().join(name);
    std::fs::write(&p, text).expect("write config");
    p
}

fn check_diff(file: &Path) -> Output {
    Command::new(daemon_binary())
        .arg("--check-config")
        .arg("--config")
        .arg(file)
        .arg("--diff")
        .output()
        .expect("run --check-config --diff")
}

/// Every kind of change at once against [`CONFIG`]: a listener added, a backend removed
/// and one added, a subsystem added and one removed, a namespace removed and one added,
/// and two that need a restart (IO threads, and a subsystem's model). Hosts changes are
/// checked on their own.
const CHANGED: &str = "\
io_threads: 3
control: {path: \"{dir}/ctl/control.sock\", mode: \"0600\"}
listeners:
  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: {port}}
  - {name: tcp1, transport: tcp, address: 127.0.0.1, port: 1}
backends:
  - {name: ram0, type: ram, size: 64MiB, block_size: 512}
  - {name: ram1, type: ram, size: 4MiB, block_size: 512}
  - {name: ram9, type: ram, size: 4MiB, block_size: 512}
subsystems:
  - nqn: nqn.2026-11.dev.nvmf-target:e2e
    allow_any_host: true
    model: another-model
    namespaces:
      - {nsid: 1, backend: ram0}
      - {nsid: 3, backend: ram9}
  - nqn: nqn.2026-11.dev.nvmf-target:added
    allow_any_host: false
    hosts: [nqn.2014-08.org.nvmexpress:uuid:0b5c1d2e-3f40-4152-8364-a5b6c7d8e9f0]
";

fn diff_and_ctl_reload_print_each_kind_of_change() {
    let _w = watchdog("diff", Duration::from_secs(60));
    let d = Daemon::start(&config_with_control("0600"));

    // The running file itself: no changes.
    let same = d.dir().join("nvmf-target.yaml");
    let o = check_diff(&same);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).starts_with("no changes"), "{}", text(&o));

    // A port that is free for the new listener.
    let changed = CHANGED.replace("port: 1}", &format!("port: {}}}", free_port()));
    let file = write_file(&d, "changed.yaml", &changed);
    let o = check_diff(&file);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let restricted = "nqn.2026-11.dev.nvmf-target:restricted";
    let want = [
        format!("subsystem {SUBNQN} namespace 2: remove"),
        format!("subsystem {restricted} namespace 1: remove"),
        format!("subsystem {restricted}: remove"),
        "backend f0: remove".to_string(),
        "listener tcp1: add (tcp 127.0.0.1:".to_string(),
        "backend ram9: add".to_string(),
        "subsystem nqn.2026-11.dev.nvmf-target:added: add".to_string(),
        format!("subsystem {SUBNQN} namespace 3: add on backend ram9"),
        "restart required: io threads: 2 unpinned -> 3 unpinned".to_string(),
        "restart required: subsystem nqn.2026-11.dev.nvmf-target:e2e".to_string(),
    ];
    for w in &want {
        assert!(out.contains(w.as_str()), "diff lacks {w:?}:\n{out}");
    }
    // Hosts: the same host list edit against the restricted subsystem kept.
    let hosts_only = CONFIG.replace(
        "hosts: [nqn.2014-08.org.nvmexpress:uuid:0b5c1d2e-3f40-4152-8364-a5b6c7d8e9f0]",
        "hosts: [nqn.2014-08.org.nvmexpress:uuid:0b5c1d2e-3f40-4152-8364-a5b6c7d8e9f0, nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555]",
    );
    let hosts_file = write_file(&d, "hosts.yaml", &hosts_only);
    let o = check_diff(&hosts_file);
    let hosts_out = text(&o);
    assert!(
        hosts_out.contains(&format!("subsystem {restricted}: hosts"))
            && hosts_out.contains("11111111-2222-3333-4444-555555555555")
            && hosts_out.contains("1 change(s)"),
        "{hosts_out}"
    );

    // --diff names the daemon through the file's control.path; a wrong one is an error.
    let o = Command::new(daemon_binary())
        .args([
            "--check-config",
            "--diff",
            "--socket",
            "/nonexistent/ctl.sock",
            "--config",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!o.status.success() && text(&o).contains("no daemon at /nonexistent/ctl.sock"));

    // ctl reload of that file prints the same lines, and the daemon now runs it.
    std::fs::copy(&file, &same).expect("install the changed config");
    let o = ctl(&d, &["reload"]);
    let reloaded = text(&o);
    assert!(o.status.success(), "{reloaded}");
    for line in out.lines().skip(1) {
        assert!(
            reloaded.contains(line.trim()),
            "reload lacks {line:?}:\n{reloaded}"
        );
    }
    assert!(
        reloaded.contains("; 2 more changes at the next restart"),
        "{reloaded}"
    );
    // The file is what the daemon loaded, but two of its changes wait for a restart:
    // --diff and ctl status say so, from the running value to the file's.
    let o = check_diff(&same);
    let pending = text(&o);
    assert!(pending.starts_with("no changes"), "{pending}");
    assert!(pending.contains("not running yet (2 items)"), "{pending}");
    assert!(
        pending.contains("restart required: io threads: 2 unpinned -> 3 unpinned"),
        "{pending}"
    );
    let status = ctl_ok(&d, &["status"]);
    assert!(
        status.contains("restart required: io threads: 2 unpinned -> 3 unpinned"),
        "{status}"
    );
    // `--json` after the subcommand works too.
    let json = ctl_ok(&d, &["status", "--json"]);
    let json: Value = serde_json::from_str(&json).expect("status --json");
    assert_eq!(json["pending"].as_array().map(Vec::len), Some(2), "{json}");
    let subs = ctl_json(&d, &["subsystems"]);
    let nqns: Vec<&str> = subs
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["nqn"].as_str())
        .collect();
    assert_eq!(nqns, ["nqn.2026-11.dev.nvmf-target:added", SUBNQN]);

    // An invalid file: ctl reload fails with the file's errors, nothing changes.
    std::fs::write(&same, "io_threads: nope\n").unwrap();
    let o = ctl(&d, &["reload"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("reload rejected") && text(&o).contains("io_threads"),
        "{}",
        text(&o)
    );
    assert_eq!(ctl_json(&d, &["subsystems"]), subs);
}

/// A reload whose listener cannot bind (the port is taken) applies the rest, and the
/// daemon does not count the listener as running: --diff and ctl status show it as still
/// to do, and a reload of the same file once the port is free opens it.
fn a_listener_a_reload_could_not_open_is_opened_by_the_next_reload() {
    let _w = watchdog("listener retry", Duration::from_secs(60));
    let d = Daemon::start(&config_with_control("0600"));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port to hold");
    let port = taken.local_addr().unwrap().port();
    let same = d.dir().join("nvmf-target.yaml");
    let running = std::fs::read_to_string(&same).expect("the running config");
    let with_listener = running.replace(
        "listeners:\n",
        &format!(
            "listeners:\n  - {{name: tcp9, transport: tcp, address: 127.0.0.1, port: {port}}}\n"
        ),
    );
    assert_ne!(with_listener, running);
    std::fs::write(&same, &with_listener).unwrap();

    let o = ctl(&d, &["reload"]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("listener tcp9: add"), "{out}");
    assert!(out.contains("1 error"), "{out}");
    let o = check_diff(&same);
    let pending = text(&o);
    assert!(pending.starts_with("no changes"), "{pending}");
    assert!(
        pending.contains("not running yet (1 item)")
            && pending.contains(&format!("listener tcp9: add (tcp 127.0.0.1:{port})")),
        "{pending}"
    );
    let status = ctl_json(&d, &["status"]);
    assert!(
        !status["listeners"].to_string().contains("tcp9"),
        "{status}"
    );

    drop(taken);
    let o = ctl(&d, &["reload"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("applied 1 change\n") && out.contains("listener tcp9: add"),
        "{out}"
    );
    let status = ctl_json(&d, &["status"]);
    assert!(status["listeners"].to_string().contains("tcp9"), "{status}");
    assert_eq!(status["pending"], serde_json::json!([]), "{status}");
    let o = check_diff(&same);
    assert!(!text(&o).contains("not running yet"), "{}", text(&o));
    std::net::TcpStream::connect(("127.0.0.1", port)).expect("tcp9 listens");
}

/// Why the client cannot be run as another user here, if it cannot.
fn nobody_missing() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root: cannot run the client as another user".into());
    }
    match Command::new("setpriv").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("setpriv (util-linux) is not installed".into()),
    }
}

/// The client as uid/gid 65534 (nobody).
fn ctl_as_nobody(sock: &Path) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(daemon_binary())
        .arg("ctl")
        .arg("--socket")
        .arg(sock)
        .arg("status")
        .output()
        .expect("run setpriv")
}

fn another_user_is_refused() {
    let _w = watchdog("another_user", Duration::from_secs(60));
    // Mode 0600: the kernel refuses the connect itself.
    let d = Daemon::start(&config_with_control("0600"));
    std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let o = ctl_as_nobody(&socket(&d));
    assert!(
        !o.status.success(),
        "nobody got through a 0600 socket: {}",
        text(&o)
    );
    assert!(text(&o).contains("permission denied"), "{}", text(&o));

    // Mode 0666: the connect succeeds, the daemon's SO_PEERCRED check refuses the peer
    // before reading a request.
    let d2 = Daemon::start(&config_with_control("0666"));
    std::fs::set_permissions(d2.dir(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let o = ctl_as_nobody(&socket(&d2));
    assert!(!o.status.success(), "nobody was served: {}", text(&o));
    assert!(
        text(&o).contains("permission denied: uid 65534 may not use this control socket"),
        "{}",
        text(&o)
    );
    assert!(
        d2.log().contains("control socket: refused uid 65534"),
        "{}",
        d2.log()
    );
    // Root still is served.
    assert!(ctl_ok(&d2, &["status"]).contains("engine soft"));

    // control.group: members (by primary group) are served, but do not get the config
    // text (it may hold secrets), so --diff is refused to them.
    let d3 = Daemon::start(
        "control: {path: \"{dir}/ctl/control.sock\", mode: \"0660\", group: nogroup}
listeners:
  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: {port}}
backends:
  - {name: ram0, type: ram, size: 4MiB, block_size: 512}
subsystems:
  - nqn: nqn.2026-11.dev.nvmf-target:e2e
    allow_any_host: true
    namespaces:
      - {nsid: 1, backend: ram0}
",
    );
    std::fs::set_permissions(d3.dir(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let cfg = d3.dir().join("nvmf-target.yaml");
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = ctl_as_nobody(&socket(&d3));
    assert!(
        o.status.success(),
        "a member of control.group was refused: {}",
        text(&o)
    );
    assert!(text(&o).contains("engine soft"), "{}", text(&o));
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(daemon_binary())
        .args(["--check-config", "--diff", "--socket"])
        .arg(socket(&d3))
        .arg("--config")
        .arg(&cfg)
        .output()
        .expect("run setpriv");
    assert!(
        !o.status.success(),
        "a group member read the config: {}",
        text(&o)
    );
    assert!(
        text(&o).contains("may not read the running config"),
        "{}",
        text(&o)
    );
}
