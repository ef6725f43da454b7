//! TLS 1.3 with PSKs for NVMe/TCP end to end: the daemon with `tls: required` and
//! `tls: optional` listeners and `hosts[].tls_psk`, the repo's host as an OpenSSL client
//! with the identities the Linux host uses (version 1 with digest, version 0), both cipher
//! suites, verified I/O; refusals (plain TCP on a required listener, an unknown PSK, a PSK
//! used for another host's Connect) logged; discovery publishing TLS; TLS and
//! DH-HMAC-CHAP at once; an `openssl s_client` handshake against the daemon (skipped,
//! by the convention of `common/skip.rs`, where the `openssl` command is missing).

mod common;

use common::*;
use nvmf::auth::key::DhchapKey;
use nvmf::auth::tls::ConfiguredPsk;
use nvmf::auth::HashId;
use nvmf_initiator::{HostOptions, TcpHost};
use nvmf_tls::PskEntry;
use std::sync::Arc;
use std::time::Duration;

fn main() {
    let openssl = std::process::Command::new("sh")
        .args(["-c", "command -v openssl"])
        .output()
        .is_ok_and(|o| o.status.success());
    skip::run(vec![
        skip::trial("tls_end_to_end", None, tls_end_to_end),
        skip::trial(
            "openssl_s_client_handshake",
            (!openssl).then(|| "the openssl command is not installed".to_string()),
            openssl_s_client_handshake,
        ),
    ]);
}

const TLS_NQN: &str = "nqn.2026-11.dev.nvmf-target:tls";
const H1: &str = "nqn.2014-08.org.nvmexpress:uuid:7e7e7e7e-0000-4000-8000-0000000000e1";
const H2: &str = "nqn.2014-08.org.nvmexpress:uuid:7e7e7e7e-0000-4000-8000-0000000000e2";
const H3: &str = "nqn.2014-08.org.nvmexpress:uuid:7e7e7e7e-0000-4000-8000-0000000000e3";

fn psk1() -> ConfiguredPsk {
    ConfiguredPsk::from_bytes(Some(HashId::Sha256), &[0x61; 32]).unwrap()
}
fn psk2() -> ConfiguredPsk {
    ConfiguredPsk::from_bytes(Some(HashId::Sha384), &[0x62; 48]).unwrap()
}
fn psk3() -> ConfiguredPsk {
    ConfiguredPsk::from_bytes(None, &[0x64; 32]).unwrap()
}
fn dh1() -> DhchapKey {
    DhchapKey::from_bytes(Some(HashId::Sha256), &[0x63; 32]).unwrap()
}

/// `{port}` (what the harness probes with a plain ICReq) is the optional-TLS listener;
/// the required one is `req_port`.
fn config(req_port: u16) -> String {
    format!(
        "\
io_threads: 2
listeners:
  - {{name: opt, transport: tcp, address: 127.0.0.1, port: {{port}}, tls: optional}}
  - {{name: tls, transport: tcp, address: 127.0.0.1, port: {req_port}, tls: required}}
backends:
  - {{name: ram0, type: ram, size: 16MiB, block_size: 512}}
hosts:
  - nqn: {H1}
    tls_psk: \"{}\"
    dhchap_secret: \"{}\"
  - nqn: {H2}
    tls_psk: \"{}\"
  - nqn: {H3}
    tls_psk: \"{}\"
subsystems:
  - nqn: {TLS_NQN}
    allow_any_host: true
    namespaces:
      - {{nsid: 1, backend: ram0}}
",
        *psk1().to_text(),
        *dh1().to_text(),
        *psk2().to_text(),
        *psk3().to_text()
    )
}

fn tls_opts(host: &str, psk: &ConfiguredPsk, version: usize, sub: &str) -> HostOptions {
    let p = psk.tls_psks(host, sub).remove(version);
    HostOptions {
        hostnqn: host.to_string(),
        tls: Some(Arc::new(PskEntry::new(&p, host, sub))),
        ..host_opts()
    }
}

fn io_roundtrip(d: &Daemon, port: u16, opts: &HostOptions, auth: Option<DhchapKey>) {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut a = TcpHost::connect(addr, opts.clone()).expect("TLS + ICReq (admin)");
    let cntlid = a.connect_admin(TLS_NQN, 0).expect("Connect");
    if let Some(k) = &auth {
        a.authenticate(TLS_NQN, k.clone(), None)
            .expect("DH-HMAC-CHAP over TLS");
    }
    a.enable_controller().expect("enable");
    let _ = request_queues(&mut a, 1);
    let mut io = TcpHost::connect(addr, opts.clone()).expect("TLS + ICReq (I/O)");
    io.connect_io(TLS_NQN, cntlid, 1, 31).expect("I/O Connect");
    if let Some(k) = auth {
        io.authenticate(TLS_NQN, k, None)
            .expect("I/O queue auth over TLS");
    }
    // Larger than one TLS record, to cross record boundaries both ways.
    let data = pattern(9, 128 * 1024);
    assert_ok(io.write(1, 64, &data, false).unwrap(), "write over TLS");
    let mut back = vec![0u8; data.len()];
    assert_ok(io.read(1, 64, 256, &mut back).unwrap(), "read over TLS");
    assert!(back == data, "data changed over TLS");
    let _ = d;
}

fn wait_for_log(d: &Daemon, needle: &str) -> String {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < end {
        if let Some(l) = d.log().lines().find(|l| l.contains(needle)) {
            return l.to_string();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no {needle:?} in the daemon's log:\n{}", d.log());
}

fn tls_end_to_end() {
    let _w = watchdog("tls_end_to_end", Duration::from_secs(120));
    let port = free_port();
    let d = Daemon::start(&config(port));
    let opt_port = d.port();
    let req = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    // A connection that never begins its TLS handshake: closed at the handshake's
    // deadline (10 s), and logged as that (checked at the end), not as a missing ICReq.
    let silent = std::net::TcpStream::connect(req).unwrap();
    let silent_port = silent.local_addr().unwrap().port();

    // SHA-256 PSK (hh 00, used as the retained PSK), version 1 identity (with digest),
    // then version 0; a SHA-384 PSK (hh 02).
    io_roundtrip(&d, port, &tls_opts(H3, &psk3(), 0, TLS_NQN), None);
    let line = wait_for_log(&d, "TLS 1.3 (TLS_AES_128_GCM_SHA256) with PSK \"NVMe1R01 ");
    assert!(line.contains(H3), "{line}");
    io_roundtrip(&d, port, &tls_opts(H3, &psk3(), 1, TLS_NQN), None);
    io_roundtrip(&d, port, &tls_opts(H2, &psk2(), 0, TLS_NQN), None);
    wait_for_log(&d, "TLS 1.3 (TLS_AES_256_GCM_SHA384) with PSK \"NVMe1R02 ");

    // The optional listener takes TLS and plain TCP.
    io_roundtrip(&d, opt_port, &tls_opts(H2, &psk2(), 0, TLS_NQN), None);
    io_roundtrip(&d, opt_port, &host_opts(), None);

    // Both at once: H1 has a DH-HMAC-CHAP secret too; it authenticates inside TLS.
    io_roundtrip(&d, port, &tls_opts(H1, &psk1(), 0, TLS_NQN), Some(dh1()));
    wait_for_log(&d, "authenticated to subsystem");

    // Plain TCP to the required listener: no ICResp, and a line saying why.
    let plain = TcpHost::connect(req, host_opts());
    assert!(
        plain.is_err(),
        "plain TCP accepted by a tls: required listener"
    );
    let line = wait_for_log(&d, "TLS required on this listener");
    assert!(
        line.contains("reason=\"tls_handshake_failed\"") || line.contains("listener tls"),
        "{line}"
    );

    // A PSK nobody configured: refused, naming the identity.
    let stranger = ConfiguredPsk::from_bytes(Some(HashId::Sha256), &[0x70; 32]).unwrap();
    let e = TcpHost::connect(req, tls_opts(H1, &stranger, 0, TLS_NQN)).err();
    assert!(e.is_some(), "an unknown PSK was accepted");
    // H1's identity with another key: the binder does not verify.
    let mut o = tls_opts(H1, &psk1(), 0, TLS_NQN);
    let p = stranger.tls_psks(H1, TLS_NQN).remove(0);
    o.tls = Some(Arc::new(PskEntry::new(
        &nvmf::auth::tls::TlsPsk {
            identity: psk1().tls_psks(H1, TLS_NQN).remove(0).identity,
            ..p
        },
        H1,
        TLS_NQN,
    )));
    assert!(
        TcpHost::connect(req, o).is_err(),
        "a wrong key was accepted"
    );

    // H1's PSK used to Connect as H2: Connect Invalid Host, with the reason.
    let mut o = tls_opts(H1, &psk1(), 0, TLS_NQN);
    o.hostnqn = H2.to_string();
    let mut h = TcpHost::connect(req, o).expect("TLS with H1's PSK");
    let e = h.connect_admin(TLS_NQN, 0).unwrap_err().to_string();
    assert!(e.contains("0x84") || e.contains("132"), "{e}");
    wait_for_log(&d, "is not for this host and subsystem");

    // Discovery over TLS (the discovery NQN has its PSK too) shows the listeners' TLS.
    let mut disc =
        TcpHost::connect(req, tls_opts(H1, &psk1(), 0, DISCOVERY_NQN)).expect("TLS to discovery");
    disc.connect_admin(DISCOVERY_NQN, 0)
        .expect("discovery Connect");
    disc.enable_controller().unwrap();
    let page = disc
        .get_log_page(0x70, 0, 0, 4096, false)
        .expect("discovery log");
    let entries: Vec<&[u8]> = page[1024..].chunks(1024).collect();
    let tls_entry = entries
        .iter()
        .find(|e| e[0] == 3 && std::str::from_utf8(&e[32..64]).unwrap().trim() == port.to_string())
        .expect("an entry for the TLS listener");
    assert_eq!(tls_entry[3] & 3, 0b01, "TREQ: secure channel required");
    assert_eq!(tls_entry[768], 2, "TSAS SECTYPE: TLS 1.3");

    let me = format!("127.0.0.1:{silent_port}");
    let end = std::time::Instant::now() + Duration::from_secs(20);
    let line = loop {
        let log = d.log();
        if let Some(l) = log
            .lines()
            .find(|l| l.contains("did not finish the TLS handshake in time"))
        {
            break l.to_string();
        }
        assert!(std::time::Instant::now() < end, "not closed:\n{log}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(line.contains(&me), "{line}");
    assert_eq!(line.matches("TLS handshake failed").count(), 1, "{line}");
    assert!(
        !d.log()
            .lines()
            .any(|l| l.contains(&me) && l.contains("ICReq")),
        "{}",
        d.log()
    );
    drop(silent);
}

/// OpenSSL's command-line client completes a TLS 1.3 PSK handshake with the daemon (the
/// version 0 identity, SHA-256), and the daemon answers its ICReq inside TLS.
fn openssl_s_client_handshake() {
    let _w = watchdog("openssl_s_client_handshake", Duration::from_secs(60));
    let port = free_port();
    let _d = Daemon::start(&config(port));
    let p = psk1().tls_psks(H1, TLS_NQN).remove(1);
    let hex: String = p.key.iter().map(|b| format!("{b:02x}")).collect();
    // An ICReq: PDU type 0, HLEN 128, PLEN 128, PFV 0, HPDA 0, no digests, MAXR2T 0.
    let mut icreq = vec![0u8; 128];
    icreq[1] = 0;
    icreq[2] = 128;
    icreq[4..8].copy_from_slice(&128u32.to_le_bytes());
    let mut child = std::process::Command::new("timeout")
        .args(["10", "openssl", "s_client", "-quiet", "-tls1_3"])
        .args(["-ciphersuites", "TLS_AES_128_GCM_SHA256"])
        .args(["-psk_identity", &p.identity, "-psk", &hex])
        .args(["-connect", &format!("127.0.0.1:{port}")])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    use std::io::{Read, Write};
    let mut stdin = child.stdin.take().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    stdin.write_all(&icreq).unwrap();
    stdin.flush().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut resp = [0u8; 8];
    let got = out.read_exact(&mut resp);
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    got.expect("no ICResp through openssl s_client");
    assert_eq!(resp[0], 1, "ICResp PDU type");
    assert_eq!(u32::from_le_bytes(resp[4..8].try_into().unwrap()), 128);
}
