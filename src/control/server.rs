//! The control socket's server: a Unix stream socket on its own thread.
//!
//! Bounds (DESIGN: every resource a peer can make us hold has a bound, a deadline and a
//! counter; the peers here are local, but a stuck script must not wedge the daemon):
//! - at most [`MAX_CLIENTS`] connections at once; one more gets a `busy` error and is
//!   closed;
//! - a request line is at most [`MAX_REQUEST_BYTES`]; a longer one gets an error and
//!   the connection is closed;
//! - a request line must be complete within [`READ_DEADLINE`] of the previous reply (or
//!   of the connection); a slow or idle client gets an error and is closed;
//! - the main thread answers within [`REPLY_DEADLINE`] or the client gets an error.
//!
//! Permission: the socket file has the configured mode (0600 by default), and every
//! connection's peer credentials (`SO_PEERCRED`) are checked before anything it sends is
//! read: root, the daemon's own user, and members (by primary group) of the configured
//! `group` pass; anyone else gets `permission denied` and is closed. Every outcome is
//! counted in [`ControlCounters`] (logged when the socket closes).
//!
//! The thread never touches the data path: a parsed command travels to the main thread
//! as a [`ControlRequest`] and the reply comes back on a channel.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use crossbeam_channel::{bounded, Sender};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

use super::protocol::{parse_request, reply_err, Command};
use crate::config::ControlConfig;

/// Most control connections served at once.
pub const MAX_CLIENTS: usize = 8;
/// Longest request line, newline excluded.
pub const MAX_REQUEST_BYTES: usize = 4096;
/// Time a client has to send a complete request line.
pub const READ_DEADLINE: Duration = Duration::from_secs(5);
/// Time the main thread has to answer (a reload opens backends, which can take a while).
pub const REPLY_DEADLINE: Duration = Duration::from_secs(60);
/// Time a reply may take to be written (a client that does not read is dropped).
const WRITE_DEADLINE: Duration = Duration::from_secs(5);
/// How often the accept loop looks at its stop flag.
const ACCEPT_TICK: Duration = Duration::from_millis(200);

/// A command for the main thread, with where its reply line goes.
pub struct ControlRequest {
    pub command: Command,
    /// Who asked, for log lines (`uid 0 pid 1234`).
    pub peer: String,
    pub reply: Sender<String>,
}

/// What the server has done (logged when the socket closes).
#[derive(Debug, Default)]
pub struct ControlCounters {
    pub accepted: AtomicU64,
    pub refused_busy: AtomicU64,
    pub refused_permission: AtomicU64,
    pub bad_requests: AtomicU64,
    pub oversized: AtomicU64,
    pub timed_out: AtomicU64,
    pub commands: AtomicU64,
}

/// Who may use the socket besides root.
#[derive(Clone, Copy, Debug)]
struct Allowed {
    uid: u32,
    gid: Option<u32>,
}

impl Allowed {
    fn permits(&self, uid: u32, gid: u32) -> bool {
        self.owner(uid) || self.gid == Some(gid)
    }
    /// Root or the daemon's own user.
    fn owner(&self, uid: u32) -> bool {
        uid == 0 || uid == self.uid
    }
}

/// The running server; dropping it stops the thread and removes the socket file.
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<ControlCounters>,
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("control socket thread panicked");
            }
        }
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        tracing::info!(
            "control socket {} closed: {} connection(s), {} command(s), refused {} busy / {} \
             permission, {} bad, {} oversized, {} timed out",
            self.path.display(),
            n(&c.accepted),
            n(&c.commands),
            n(&c.refused_busy),
            n(&c.refused_permission),
            n(&c.bad_requests),
            n(&c.oversized),
            n(&c.timed_out)
        );
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("control socket {}: cannot remove: {e}", self.path.display()),
        }
    }
}

/// Binds the socket `cfg` describes and starts serving it; commands go to `to_main`.
/// An explicitly configured path that cannot be served is an error; the default path
/// only gets a warning (and the daemon runs without a control socket), see
/// [`ControlConfig::explicit`].
pub fn start(
    cfg: &ControlConfig,
    to_main: Sender<ControlRequest>,
) -> anyhow::Result<Option<ControlServer>> {
    match bind(cfg) {
        Ok(listener) => {
            let gid = match &cfg.group {
                Some(g) => Some(chgrp(&cfg.path, g)?),
                None => None,
            };
            let allowed = Allowed {
                uid: nix::unistd::geteuid().as_raw(),
                gid,
            };
            let stop = Arc::new(AtomicBool::new(false));
            let counters = Arc::new(ControlCounters::default());
            let (s, c) = (stop.clone(), counters.clone());
            let thread = std::thread::Builder::new()
                .name("nvmft-ctl".into())
                .spawn(move || accept_loop(listener, allowed, to_main, s, c))
                .context("spawning the control socket thread")?;
            tracing::info!(
                "control socket {} (mode {:04o}{})",
                cfg.path.display(),
                cfg.mode,
                cfg.group
                    .as_ref()
                    .map_or(String::new(), |g| format!(", group {g}"))
            );
            Ok(Some(ControlServer {
                path: cfg.path.clone(),
                stop,
                thread: Some(thread),
                counters,
            }))
        }
        Err(e) if !cfg.explicit => {
            tracing::warn!(
                "no control socket: {e:#} (set control.path in the config to choose another \
                 place, or control.enabled: false to silence this)"
            );
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn bind(cfg: &ControlConfig) -> anyhow::Result<UnixListener> {
    let path = &cfg.path;
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            // Traversable by the group/others the socket's own mode may admit, not listable.
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o711)
                .create(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => bail!(
                "{}: another daemon is serving this control socket",
                path.display()
            ),
            Err(_) => {
                // Left behind by a daemon that did not stop cleanly.
                tracing::info!("control socket {}: removing a stale socket", path.display());
                std::fs::remove_file(path)
                    .with_context(|| format!("removing stale socket {}", path.display()))?;
            }
        },
        Ok(_) => bail!("{}: exists and is not a socket", path.display()),
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("{}", path.display())),
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(cfg.mode))
        .with_context(|| format!("chmod {:04o} {}", cfg.mode, path.display()))?;
    listener
        .set_nonblocking(true)
        .context("control socket: non-blocking")?;
    Ok(listener)
}

/// Gives the socket file to `group` (so its members pass the mode bits); returns the gid.
fn chgrp(path: &Path, group: &str) -> anyhow::Result<u32> {
    let g = nix::unistd::Group::from_name(group)
        .with_context(|| format!("control.group: looking up group {group:?}"))?
        .with_context(|| format!("control.group: no group named {group:?}"))?;
    nix::unistd::chown(path, None, Some(g.gid))
        .with_context(|| format!("control.group: chgrp {group} {}", path.display()))?;
    Ok(g.gid.as_raw())
}

fn accept_loop(
    listener: UnixListener,
    allowed: Allowed,
    to_main: Sender<ControlRequest>,
    stop: Arc<AtomicBool>,
    counters: Arc<ControlCounters>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::SeqCst) {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, PollTimeout::from(ACCEPT_TICK.as_millis() as u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("control socket: poll: {e}");
                std::thread::sleep(ACCEPT_TICK);
                continue;
            }
        }
        loop {
            let mut stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!("control socket: accept: {e}");
                    break;
                }
            };
            counters.accepted.fetch_add(1, Ordering::Relaxed);
            if active.load(Ordering::SeqCst) >= MAX_CLIENTS {
                counters.refused_busy.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "control socket: {MAX_CLIENTS} clients already connected; refusing one"
                );
                refuse(
                    &mut stream,
                    &format!(
                        "busy: {MAX_CLIENTS} control clients are already connected; try again"
                    ),
                );
                continue;
            }
            active.fetch_add(1, Ordering::SeqCst);
            let client = Client {
                stream,
                active: active.clone(),
            };
            let (tx, c) = (to_main.clone(), counters.clone());
            let spawned = std::thread::Builder::new()
                .name("nvmft-ctl-client".into())
                .spawn(move || serve_client(client, allowed, &tx, &c));
            if let Err(e) = spawned {
                // The closure, and the client in it, is dropped: its slot is freed.
                tracing::warn!("control socket: cannot start a client thread: {e}");
            }
        }
    }
}

/// One client's connection and its slot among [`MAX_CLIENTS`]: the slot is given back
/// before the connection closes, so a client that saw the close can count on it.
struct Client {
    stream: UnixStream,
    active: Arc<AtomicUsize>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.active.fetch_sub(1, Ordering::SeqCst);
        // `stream` is dropped (closed) after this body.
    }
}

/// Best effort: a refused client may already be gone.
fn refuse(stream: &mut UnixStream, why: &str) {
    if stream.set_nonblocking(false).is_ok() {
        let _ = stream.set_write_timeout(Some(WRITE_DEADLINE));
        let _ = stream.write_all(format!("{}\n", reply_err(why)).as_bytes());
    }
}

enum ReadLine {
    Line(Vec<u8>),
    Eof,
    TooLong,
    Timeout,
}

fn serve_client(
    mut client: Client,
    allowed: Allowed,
    to_main: &Sender<ControlRequest>,
    counters: &ControlCounters,
) {
    let stream = &mut client.stream;
    let cred = match getsockopt(&*stream, PeerCredentials) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("control socket: cannot read the peer's credentials: {e}");
            return refuse(stream, "permission denied: peer credentials unavailable");
        }
    };
    let peer = format!("uid {} pid {}", cred.uid(), cred.pid());
    if !allowed.permits(cred.uid(), cred.gid()) {
        counters.refused_permission.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            "control socket: refused {peer} gid {}: only root, uid {}{} may use it",
            cred.gid(),
            allowed.uid,
            allowed
                .gid
                .map_or(String::new(), |g| format!(" and group {g}"))
        );
        return refuse(
            stream,
            &format!(
                "permission denied: uid {} may not use this control socket",
                cred.uid()
            ),
        );
    }
    if stream.set_nonblocking(false).is_err()
        || stream.set_write_timeout(Some(WRITE_DEADLINE)).is_err()
    {
        return;
    }
    let mut buf = Vec::new();
    loop {
        let reply = match read_line(stream, &mut buf) {
            ReadLine::Line(line) => {
                let text = String::from_utf8_lossy(&line);
                match parse_request(text.trim()) {
                    // The config text may hold secrets (keys, PSKs): only root and the
                    // daemon's user, who can read the file anyway, get it; not `group`.
                    Ok(Command::Config) if !allowed.owner(cred.uid()) => {
                        counters.refused_permission.fetch_add(1, Ordering::Relaxed);
                        reply_err(&format!(
                            "permission denied: uid {} may not read the running config (root \
                             and the daemon's user only)",
                            cred.uid()
                        ))
                    }
                    Ok(command) => {
                        counters.commands.fetch_add(1, Ordering::Relaxed);
                        ask_main(to_main, command, &peer)
                    }
                    Err(e) => {
                        counters.bad_requests.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!("control socket: {peer}: {e}");
                        reply_err(&e)
                    }
                }
            }
            ReadLine::Eof => return,
            ReadLine::TooLong => {
                counters.oversized.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("control socket: {peer}: request longer than {MAX_REQUEST_BYTES} bytes; closing");
                return refuse(
                    stream,
                    &format!(
                        "request too large: a request line is at most {MAX_REQUEST_BYTES} bytes"
                    ),
                );
            }
            ReadLine::Timeout => {
                counters.timed_out.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    "control socket: {peer}: no complete request within {READ_DEADLINE:?}; closing"
                );
                return refuse(
                    stream,
                    &format!("timeout: no complete request line within {READ_DEADLINE:?}"),
                );
            }
        };
        if stream.write_all(format!("{reply}\n").as_bytes()).is_err() {
            return;
        }
    }
}

/// One line from `stream` within [`READ_DEADLINE`]; bytes after it stay in `buf`.
fn read_line(stream: &mut UnixStream, buf: &mut Vec<u8>) -> ReadLine {
    let deadline = Instant::now() + READ_DEADLINE;
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(i) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).take(i).collect();
            if line.len() > MAX_REQUEST_BYTES {
                return ReadLine::TooLong;
            }
            return ReadLine::Line(line);
        }
        if buf.len() > MAX_REQUEST_BYTES {
            return ReadLine::TooLong;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return ReadLine::Timeout;
        }
        match stream.read(&mut chunk) {
            // A last line without its newline still counts (`printf '...' | socat`).
            Ok(0) if buf.iter().any(|b| !b.is_ascii_whitespace()) => {
                return ReadLine::Line(std::mem::take(buf))
            }
            Ok(0) => return ReadLine::Eof,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return ReadLine::Eof,
        }
    }
}

fn ask_main(to_main: &Sender<ControlRequest>, command: Command, peer: &str) -> String {
    let (tx, rx) = bounded(1);
    let req = ControlRequest {
        command,
        peer: peer.to_string(),
        reply: tx,
    };
    if to_main.send(req).is_err() {
        return reply_err("the daemon is stopping");
    }
    match rx.recv_timeout(REPLY_DEADLINE) {
        Ok(line) => line,
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => reply_err(&format!(
            "the daemon's main thread did not answer within {REPLY_DEADLINE:?}"
        )),
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
            reply_err("the daemon is stopping")
        }
    }
}
