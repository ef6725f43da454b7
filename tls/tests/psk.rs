//! The PSK server against three clients: this crate's OpenSSL client (both cipher
//! suites), OpenSSL's `openssl s_client` and GnuTLS's `gnutls-cli` (the library the Linux
//! host's tlshd uses), each over loopback TCP. External clients that are not installed
//! are skipped by the workspace's convention (`tests/common/skip.rs`: listed as ignored
//! with `SKIPPED: <test>: <reason>`, never `ok`).

#[path = "../../tests/common/skip.rs"]
mod skip;

use nvmf::auth::tls::ConfiguredPsk;
use nvmf::auth::HashId;
use nvmf_tls::{client_context, server_context, Handshake, PskEntry, PskTable, TlsError};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, RwLock};
use std::time::Duration;

fn main() {
    let missing = |prog: &str, hint: &str| {
        (!installed(prog)).then(|| format!("{prog} is not installed{hint}"))
    };
    skip::run(vec![
        skip::trial(
            "both_cipher_suites_with_our_client",
            None,
            both_cipher_suites_with_our_client,
        ),
        skip::trial(
            "unknown_identity_and_wrong_key_are_refused",
            None,
            unknown_identity_and_wrong_key_are_refused,
        ),
        skip::trial(
            "table_swap_applies_to_new_connections",
            None,
            table_swap_applies_to_new_connections,
        ),
        skip::trial(
            "gnutls_client",
            missing("gnutls-cli", " (apt-get install gnutls-bin)"),
            gnutls_client,
        ),
        skip::trial("openssl_s_client", missing("openssl", ""), openssl_s_client),
        skip::trial(
            "finite_field_key_exchange_is_not_taken",
            missing("openssl", ""),
            finite_field_key_exchange_is_not_taken,
        ),
    ]);
}

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:5e5e5e5e-0000-4000-8000-000000000001";
const SUB: &str = "nqn.2026-11.dev.nvmf-target:tls";

fn table(psks: &[&ConfiguredPsk]) -> Arc<RwLock<PskTable>> {
    let mut t = PskTable::default();
    for p in psks {
        t.insert_configured(p, HOST, SUB);
    }
    Arc::new(RwLock::new(t))
}

/// Serves one connection: handshake, read a line, answer "pong <host NQN> <cipher>".
/// Returns the port and a receiver for the server's view (Ok(host, cipher) or the error).
/// What the server saw: (host NQN of the PSK, cipher suite) or the handshake error.
type ServerView = Result<(String, String), String>;

fn serve_one(table: Arc<RwLock<PskTable>>) -> (u16, mpsc::Receiver<ServerView>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let ctx = server_context(table).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let r = match Handshake::accept(&ctx, s).finish() {
            Ok(mut tls) => {
                let peer = nvmf_tls::peer_psk(tls.ssl()).map(|p| p.hostnqn.clone());
                let cipher = tls.ssl().current_cipher().map(|c| c.name().to_string());
                let mut buf = [0u8; 64];
                let n = tls.read(&mut buf).unwrap_or(0);
                if buf[..n].starts_with(b"ping") {
                    let line = format!(
                        "pong {} {}\n",
                        peer.clone().unwrap_or_default(),
                        cipher.clone().unwrap_or_default()
                    );
                    let _ = tls.write_all(line.as_bytes());
                    let _ = tls.flush();
                }
                // Let the client read before the connection goes.
                std::thread::sleep(Duration::from_millis(200));
                Ok((peer.unwrap_or_default(), cipher.unwrap_or_default()))
            }
            Err(e) => Err(e.to_string()),
        };
        let _ = tx.send(r);
    });
    (port, rx)
}

fn our_client(port: u16, entry: PskEntry) -> Result<String, TlsError> {
    let ctx = client_context(Arc::new(entry))?;
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = Handshake::connect(&ctx, s).finish()?;
    tls.write_all(b"ping\n").unwrap();
    let mut line = String::new();
    BufReader::new(&mut tls).read_line(&mut line).unwrap();
    Ok(line)
}

fn both_cipher_suites_with_our_client() {
    for (hash, len, suite) in [
        (HashId::Sha256, 32, "TLS_AES_128_GCM_SHA256"),
        (HashId::Sha384, 48, "TLS_AES_256_GCM_SHA384"),
    ] {
        let psk = ConfiguredPsk::from_bytes(Some(hash), &vec![0x42; len]).unwrap();
        for (i, p) in psk.tls_psks(HOST, SUB).into_iter().enumerate() {
            let (port, rx) = serve_one(table(&[&psk]));
            let line = our_client(port, PskEntry::new(&p, HOST, SUB)).unwrap();
            assert_eq!(line.trim(), format!("pong {HOST} {suite}"), "identity {i}");
            let (host, cipher) = rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
            assert_eq!((host.as_str(), cipher.as_str()), (HOST, suite));
        }
    }
}

fn unknown_identity_and_wrong_key_are_refused() {
    let psk = ConfiguredPsk::from_bytes(Some(HashId::Sha256), &[1; 32]).unwrap();
    let other = ConfiguredPsk::from_bytes(Some(HashId::Sha256), &[2; 32]).unwrap();
    // Another host's identity: the server names it.
    let (port, rx) = serve_one(table(&[&psk]));
    let mut p = other
        .tls_psks("nqn.2014-08.org.nvmexpress:uuid:other", SUB)
        .remove(0);
    let id = p.identity.clone();
    assert!(our_client(port, PskEntry::new(&p, HOST, SUB)).is_err());
    let err = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap_err();
    assert!(err.contains(&id), "{err}");
    // A long unknown identity (the peer's choice, up to 64 KiB) is cut short in the error.
    let (port, rx) = serve_one(table(&[&psk]));
    p.identity = "x".repeat(3000);
    assert!(our_client(port, PskEntry::new(&p, HOST, SUB)).is_err());
    let err = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap_err();
    assert!(err.contains(&"x".repeat(200)), "{err}");
    assert!(err.contains("... (3000 bytes)") && err.len() < 400, "{err}");
    // The right identity with the wrong key: the binder does not verify.
    let (port, rx) = serve_one(table(&[&psk]));
    p = other.tls_psks(HOST, SUB).remove(0);
    assert!(our_client(port, PskEntry::new(&p, HOST, SUB)).is_err());
    assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap().is_err());
}

/// The PSK table is read per handshake: a replaced table (reload) applies to the next
/// connection.
fn table_swap_applies_to_new_connections() {
    let a = ConfiguredPsk::from_bytes(None, &[5; 32]).unwrap();
    let b = ConfiguredPsk::from_bytes(None, &[6; 32]).unwrap();
    let t = table(&[&a]);
    let ctx = server_context(t.clone()).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let mut out = Vec::new();
        for _ in 0..2 {
            let (s, _) = l.accept().unwrap();
            out.push(Handshake::accept(&ctx, s).finish().is_ok());
        }
        out
    });
    let pb = b.tls_psks(HOST, SUB).remove(0);
    assert!(our_client_handshake_only(port, &pb).is_err());
    *t.write().unwrap() = {
        let mut n = PskTable::default();
        n.insert_configured(&b, HOST, SUB);
        n
    };
    assert!(our_client_handshake_only(port, &pb).is_ok());
    assert_eq!(h.join().unwrap(), vec![false, true]);
}

fn our_client_handshake_only(port: u16, p: &nvmf::auth::tls::TlsPsk) -> Result<(), TlsError> {
    let ctx = client_context(Arc::new(PskEntry::new(p, HOST, SUB)))?;
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = Handshake::connect(&ctx, s).finish()?;
    // TLS 1.3: the server's verdict on the client's Finished arrives with the first read.
    tls.write_all(b"x")
        .map_err(|e| TlsError::Handshake(e.to_string()))?;
    let mut b = [0u8; 1];
    match tls.read(&mut b) {
        Ok(_) => Ok(()),
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut =>
        {
            Ok(())
        }
        Err(e) => Err(TlsError::Handshake(e.to_string())),
    }
}

/// Runs an external client that talks on stdin/stdout: writes "ping", waits (bounded) for
/// a line starting "pong", then closes stdin. Returns that line, or None when not seen.
fn external_client(mut cmd: Command) -> Option<String> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("pong") {
                let _ = tx.send(line);
                return;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let _ = stdin.write_all(b"ping\n");
    let _ = stdin.flush();
    let got = rx.recv_timeout(Duration::from_secs(10)).ok();
    drop(stdin);
    std::thread::sleep(Duration::from_millis(100));
    let _ = child.kill();
    let _ = child.wait();
    got
}

fn installed(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// GnuTLS (tlshd's library) as the client, with the version 1 identity and TLS PSK the
/// Linux host derives from an `NVMeTLSkey-1:01:` key.
fn gnutls_client() {
    let psk = ConfiguredPsk::from_bytes(Some(HashId::Sha256), &[9; 32]).unwrap();
    let p = psk.tls_psks(HOST, SUB).remove(0);
    let (port, rx) = serve_one(table(&[&psk]));
    let mut cmd = Command::new("gnutls-cli");
    cmd.args([
        "--priority",
        "NORMAL:-VERS-ALL:+VERS-TLS1.3:-KX-ALL:+ECDHE-PSK:+DHE-PSK:+PSK",
        "--pskusername",
        &p.identity,
        "--pskkey",
        &hex(&p.key),
        "-p",
        &port.to_string(),
        "127.0.0.1",
    ]);
    let line = external_client(cmd);
    let server = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        line,
        Some(format!("pong {HOST} TLS_AES_128_GCM_SHA256")),
        "server: {server:?}"
    );
    assert!(server.is_ok());
}

/// OpenSSL's own command-line client with the version 0 identity.
fn openssl_s_client() {
    let (line, server) = s_client_with_groups(None);
    let line = line.expect("openssl s_client got no answer over TLS");
    assert_eq!(line, format!("pong {HOST} TLS_AES_128_GCM_SHA256"));
    assert!(server.is_ok(), "{server:?}");
}

/// `openssl s_client` with a valid PSK (version 0 identity), offering key exchange
/// `groups` (None: its defaults): the line it got back (None: no answer) and what the
/// server saw.
fn s_client_with_groups(groups: Option<&str>) -> (Option<String>, ServerView) {
    let psk = ConfiguredPsk::from_bytes(None, &[7; 32]).unwrap();
    let p = psk.tls_psks(HOST, SUB).remove(1);
    assert!(p.identity.starts_with("NVMe0R01 "));
    let (port, rx) = serve_one(table(&[&psk]));
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-quiet", "-tls1_3"]);
    if let Some(g) = groups {
        cmd.args(["-groups", g]);
    }
    cmd.args([
        "-ciphersuites",
        "TLS_AES_128_GCM_SHA256",
        "-psk_identity",
        &p.identity,
        "-psk",
        &hex(&p.key),
        "-connect",
        &format!("127.0.0.1:{port}"),
    ]);
    let line = external_client(cmd);
    (line, rx.recv_timeout(Duration::from_secs(10)).unwrap())
}

/// A client offering only a finite-field group (ffdhe8192: about 100 ms of the IO
/// thread's CPU per handshake) is refused; offering it first and X25519 second, the
/// server takes X25519.
fn finite_field_key_exchange_is_not_taken() {
    let (line, server) = s_client_with_groups(Some("ffdhe8192"));
    assert_eq!(line, None);
    assert!(server.is_err(), "{server:?}");
    let (line, server) = s_client_with_groups(Some("ffdhe8192:X25519"));
    assert_eq!(
        line.as_deref(),
        Some(format!("pong {HOST} TLS_AES_128_GCM_SHA256").as_str())
    );
    assert!(server.is_ok(), "{server:?}");
}
