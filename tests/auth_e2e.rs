//! DH-HMAC-CHAP end to end: the daemon with `hosts:` credentials, the repo's NVMe/TCP
//! host running `nvmf::auth::host` over Authentication Send/Receive on every queue.
//! Unidirectional and bidirectional, FFDHE and NULL groups, the wrong secret refused and
//! logged with the host and the reason, a host without credentials refused by a
//! `require_auth` subsystem, nothing but authentication before it, and a secret rotated in
//! its file by SIGHUP.

mod common;

use common::*;
use nix::sys::signal::Signal;
use nvmf::auth::host::{HostConfig, HostError, HostTransaction};
use nvmf::auth::key::DhchapKey;
use nvmf::auth::msg::AuthCommand;
use nvmf::auth::{HashId, CONNECT_AUTHREQ_ATR};
use nvmf_initiator::{HostOptions, TcpHost};
use std::time::Duration;

const AUTH_NQN: &str = "nqn.2026-11.dev.nvmf-target:auth";
const H1: &str = "nqn.2014-08.org.nvmexpress:uuid:a0a0a0a0-0000-4000-8000-0000000000e1";
const H2: &str = "nqn.2014-08.org.nvmexpress:uuid:a0a0a0a0-0000-4000-8000-0000000000e2";
const STRANGER: &str = "nqn.2014-08.org.nvmexpress:uuid:a0a0a0a0-0000-4000-8000-0000000000e3";

fn key(t: Option<HashId>, fill: u8, len: usize) -> DhchapKey {
    DhchapKey::from_bytes(t, &vec![fill; len]).unwrap()
}

fn config(h2_file: &str) -> String {
    format!(
        "\
io_threads: 2
listeners:
  - {{name: tcp0, transport: tcp, address: 127.0.0.1, port: {{port}}}}
backends:
  - {{name: ram0, type: ram, size: 16MiB, block_size: 512}}
  - {{name: ram1, type: ram, size: 16MiB, block_size: 512}}
hosts:
  - nqn: {H1}
    dhchap_secret: \"{}\"
    dhchap_ctrl_secret: \"{}\"
  - nqn: {H2}
    dhchap_secret_file: {h2_file}
    dhchap_dhgroups: ['null']
    dhchap_hashes: [sha384]
subsystems:
  - nqn: {AUTH_NQN}
    allow_any_host: true
    require_auth: true
    namespaces:
      - {{nsid: 1, backend: ram0}}
      - {{nsid: 2, backend: ram1, hosts: [{H1}]}}
",
        *key(Some(HashId::Sha256), 0x11, 32).to_text(),
        *key(None, 0x22, 48).to_text()
    )
}

fn opts(hostnqn: &str) -> HostOptions {
    HostOptions {
        hostnqn: hostnqn.to_string(),
        ..host_opts()
    }
}

/// The host side of DH-HMAC-CHAP on one connected queue.
fn authenticate(
    h: &mut TcpHost,
    hostnqn: &str,
    key: DhchapKey,
    ctrl_key: Option<DhchapKey>,
) -> Result<(), HostError> {
    let mut tx = HostTransaction::new(HostConfig::new(hostnqn, AUTH_NQN, key, ctrl_key), 7);
    let mut rng = |b: &mut [u8]| getrandom::getrandom(b).expect("getrandom");
    let send = |h: &mut TcpHost, m: &[u8]| {
        let sqe = AuthCommand::dhchap(m.len() as u32).to_sqe(0, true);
        let (cqe, _) = h.submit_admin_raw(sqe, m, 0).expect("Authentication Send");
        assert_ok(cqe.status(), "Authentication Send");
    };
    let receive = |h: &mut TcpHost| {
        let sqe = AuthCommand::dhchap(4096).to_sqe(0, false);
        let (cqe, data) = h
            .submit_admin_raw(sqe, &[], 4096)
            .expect("Authentication Receive");
        assert_ok(cqe.status(), "Authentication Receive");
        data
    };
    send(h, &tx.negotiate());
    let reply = tx.on_challenge(&receive(h), &mut rng)?;
    send(h, &reply);
    match tx.on_success1(&receive(h)) {
        Ok(Some(s2)) => {
            send(h, &s2);
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => {
            if let Some(r) = e.failure2_reason() {
                send(h, &tx.failure2(r));
            }
            Err(e)
        }
    }
}

/// Admin Connect; returns the host, the CNTLID and whether ATR was set.
fn connect(d: &Daemon, hostnqn: &str) -> (TcpHost, u16, bool) {
    let mut h = TcpHost::connect(d.addr(), opts(hostnqn)).expect("ICReq");
    let sqe = nvmf::spec::fabrics::ConnectCommand {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    }
    .to_sqe(0);
    let data = nvmf::spec::fabrics::ConnectData::new([1; 16], 0xffff, AUTH_NQN, hostnqn);
    let (cqe, _) = h
        .submit_admin_raw(sqe, zerocopy::IntoBytes::as_bytes(&data), 0)
        .expect("Connect");
    assert_ok(cqe.status(), "Connect");
    (h, cqe.dw0 as u16, cqe.dw0 & CONNECT_AUTHREQ_ATR != 0)
}

#[test]
fn dhchap_end_to_end() {
    let _w = watchdog("dhchap_end_to_end", Duration::from_secs(120));
    let keydir = tempfile::tempdir().unwrap();
    let h2_file = keydir.path().join("h2.key");
    write_secret(&h2_file, &key(None, 0x33, 32));
    let mut d = Daemon::start(&config(h2_file.to_str().unwrap()));

    // H1: ATR set; nothing but authentication until it is done.
    let (mut a, cntlid, atr) = connect(&d, H1);
    assert!(atr, "Connect must ask for authentication");
    let err = a.enable_controller().unwrap_err().to_string();
    assert!(err.contains("0x91") || err.contains("145"), "{err}");
    // Bidirectional, FFDHE (the default policy prefers ffdhe2048).
    authenticate(
        &mut a,
        H1,
        key(Some(HashId::Sha256), 0x11, 32),
        Some(key(None, 0x22, 48)),
    )
    .expect("bidirectional authentication");
    a.enable_controller().expect("CC.EN after authentication");
    // The DH threads ran that authentication 10 nicer than the IO threads (whatever
    // nice value the test itself runs at).
    let io = thread_nices(&d, "nvmft-io");
    assert!(!io.is_empty() && io.iter().all(|&n| n == io[0]), "{io:?}");
    let dh = (io[0] + 10).min(19);
    assert_eq!(thread_nices(&d, "nvmft-dh"), vec![dh, dh]);
    let _ = request_queues(&mut a, 1);
    // The I/O queue authenticates too, then carries I/O.
    let mut io = TcpHost::connect(d.addr(), opts(H1)).expect("ICReq (I/O)");
    io.connect_io(AUTH_NQN, cntlid, 1, 31).expect("I/O Connect");
    let data = pattern(3, 4096);
    let s = io.write(1, 0, &data, false).expect("write before auth");
    assert_eq!(
        code(s),
        (1, 0x91),
        "I/O before authentication: Authentication Required"
    );
    let s = io
        .write(2, 0, &data, false)
        .expect("write before auth (nsid 2)");
    assert_eq!(code(s), (1, 0x91), "nsid 2 before authentication");
    authenticate(&mut io, H1, key(Some(HashId::Sha256), 0x11, 32), None).expect("I/O queue auth");
    assert_ok(io.write(1, 0, &data, false).unwrap(), "write");
    let mut back = vec![0u8; 4096];
    assert_ok(io.read(1, 0, 8, &mut back).unwrap(), "read");
    assert_eq!(back, data);
    // Namespace 2 is visible to H1 only: the engine serves it on this queue only if the
    // queue's access key (bound together with the subsystem, after authentication) names
    // H1; a queue offloaded without it would get Invalid Namespace.
    let data2 = pattern(4, 4096);
    assert_ok(io.write(2, 0, &data2, false).unwrap(), "write nsid 2");
    assert_ok(io.read(2, 0, 8, &mut back).unwrap(), "read nsid 2");
    assert_eq!(back, data2);
    let log = d.log();
    assert!(
        log.contains("with DH-HMAC-CHAP: hash sha256, DH group ffdhe2048, bidirectional"),
        "{log}"
    );

    // The wrong secret: Failure1, the connection goes, the log names host and reason.
    let (mut a, _, _) = connect(&d, H1);
    let e = authenticate(&mut a, H1, key(Some(HashId::Sha256), 0x99, 32), None).unwrap_err();
    assert_eq!(e, HostError::Refused(nvmf::auth::FailureReason::Failed));
    wait_for_log(&d, "the response did not verify (wrong secret)");
    let line = d
        .log()
        .lines()
        .find(|l| l.contains("wrong secret"))
        .unwrap()
        .to_string();
    assert!(
        line.contains(H1) && line.contains("reason=\"authentication_failed\""),
        "{line}"
    );

    // No credentials on a require_auth subsystem: Connect Invalid Host, and logged.
    let mut h = TcpHost::connect(d.addr(), opts(STRANGER)).expect("ICReq");
    let e = h.connect_admin(AUTH_NQN, 0).unwrap_err().to_string();
    assert!(e.contains("0x84") || e.contains("132"), "{e}");
    wait_for_log(&d, "no secret is configured for this host");

    // H2: NULL group and SHA-384 (its policy), secret from a file; then rotation.
    let (mut a, _, _) = connect(&d, H2);
    authenticate(&mut a, H2, key(None, 0x33, 32), None).expect("H2 with its file secret");
    a.enable_controller().expect("enable");
    assert!(d.log().contains("hash sha384, DH group null"));
    write_secret(&h2_file, &key(None, 0x44, 32));
    d.signal(Signal::SIGHUP);
    wait_for_log(&d, "host credentials or require_auth: updated");
    // The live controller keeps running; new authentications need the new secret.
    a.keep_alive().expect("still connected after the rotation");
    let (mut b, _, _) = connect(&d, H2);
    assert!(authenticate(&mut b, H2, key(None, 0x33, 32), None).is_err());
    let (mut b, _, _) = connect(&d, H2);
    authenticate(&mut b, H2, key(None, 0x44, 32), None).expect("rotated secret");
    d.stop();
}

/// Nice values of the daemon's threads whose names start with `prefix`.
fn thread_nices(d: &Daemon, prefix: &str) -> Vec<i64> {
    let pid = d.pid().expect("running");
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // pid (comm) state ... : fields after the comm's ')', nice is the 19th of stat.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let comm = head.split_once('(').map_or("", |(_, c)| c);
        if comm.starts_with(prefix) {
            let f: Vec<&str> = rest.split_whitespace().collect();
            out.push(f[16].parse().unwrap());
        }
    }
    out
}

fn write_secret(path: &std::path::Path, k: &DhchapKey) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, k.to_text().as_bytes()).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn wait_for_log(d: &Daemon, needle: &str) {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < end {
        if d.log().contains(needle) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no {needle:?} in the daemon's log:\n{}", d.log());
}

/// A secret file others can read stops the daemon at start-up, naming the file and the
/// fix.
#[test]
fn world_readable_secret_file_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("h2.key");
    write_secret(&f, &key(None, 0x33, 32));
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, config(f.to_str().unwrap()).replace("{port}", "4420")).unwrap();
    let out = std::process::Command::new(daemon_binary())
        .args(["--check-config", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        err.contains("hosts[1].dhchap_secret_file") && err.contains("chmod 600"),
        "{err}"
    );
}
