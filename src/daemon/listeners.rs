//! Listeners, TCP and RDMA, in one collection of one type. The main thread owns it:
//! config apply opens and closes listeners, the main loop accepts TCP connections, the
//! graceful stop closes them all. RDMA listeners live on the RDMA CM service (started
//! with the first of them), whose thread takes their connect requests.
//!
//! Other threads need to know which listener a connection came in on (an RDMA connect
//! request only says its local address; a TCP connection on a TLS listener is accepted
//! with that listener's TLS settings): [`ListenerDirectory`] is the read view of the
//! collection they use, written only by [`Listeners`].

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvmf::target::{ListenerInfo, Transport};
use sta::verbs::VerbsError;

use super::shared::{Shared, ThreadMsg};
use crate::config::{ListenerConfig, TlsMode, TransportKind};
use crate::rdma_cm::RdmaService;
use crate::refusals::ConnInfo;

/// I/O queues a controller may have (also the highest QID an RDMA connect may ask for).
pub(super) const MAX_IO_QUEUES: u16 = 64;
/// Deepest NVMe/RDMA admin queue (HSQSIZE + 1) a connect request may ask for: SPDK's RDMA
/// default `max_aq_depth`. Every entry costs a posted receive of SQE + in-capsule data
/// (NVMe/TCP admin queues cost nothing per entry and take up to 4096, see
/// `nvmf::target::MAX_ADMIN_SQSIZE`).
const RDMA_ADMIN_QUEUE_DEPTH: u16 = 128;
/// Longest a host may take for the TLS handshake (a half-open one holds a QP and a
/// socket).
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub(super) enum ListenerError {
    #[error("bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Rdma(#[from] VerbsError),
    #[error("TLS: {0}")]
    Tls(#[from] nvmf_tls::TlsError),
}

/// The TLS settings of listener `l`, if it has TLS (a TCP matter: the config refuses it
/// elsewhere).
fn tls_accept(
    shared: &Shared,
    l: &ListenerConfig,
) -> Result<Option<sta::TlsAccept>, ListenerError> {
    Ok(match l.tls {
        TlsMode::None => None,
        _ if l.transport != TransportKind::Tcp => None,
        mode => Some(sta::TlsAccept {
            ctx: nvmf_tls::server_context(shared.psk.clone())?,
            required: mode == TlsMode::Required,
            handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
        }),
    })
}

/// TCP listener `name` (`info`) takes connections with these TLS settings from now on,
/// and the discovery log says so.
fn set_tls(shared: &Shared, name: &str, info: &ListenerInfo, tls: Option<sta::TlsAccept>) {
    shared.target().set_listener_tls(
        info,
        match &tls {
            None => nvmf::target::ListenerTls::None,
            Some(t) if t.required => nvmf::target::ListenerTls::Required,
            Some(_) => nvmf::target::ListenerTls::Optional,
        },
    );
    match tls {
        Some(t) => shared.listeners.tls_entries().insert(name.to_string(), t),
        None => shared.listeners.tls_entries().remove(name),
    };
}

/// The protocol's description of a configured listener.
pub(super) fn listener_info(l: &ListenerConfig) -> ListenerInfo {
    ListenerInfo {
        transport: match l.transport {
            TransportKind::Tcp => Transport::Tcp,
            TransportKind::Rdma => Transport::Rdma,
        },
        addr: l.address,
        port: l.port,
    }
}

/// Every open listener by name, readable from any thread.
#[derive(Default)]
pub(super) struct ListenerDirectory {
    list: Mutex<Vec<(String, ListenerInfo)>>,
    /// TLS settings of the TCP listeners that have TLS, by listener name.
    tls: Mutex<HashMap<String, sta::TlsAccept>>,
}

impl ListenerDirectory {
    fn entries(&self) -> std::sync::MutexGuard<'_, Vec<(String, ListenerInfo)>> {
        // Plain data: usable even if a thread panicked holding the lock.
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tls_entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, sta::TlsAccept>> {
        self.tls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The TLS settings of TCP listener `name`, if it has TLS.
    pub fn tls(&self, name: &str) -> Option<sta::TlsAccept> {
        self.tls_entries().get(name).cloned()
    }

    /// The listener of `transport` whose address covers `local` (exact addresses before
    /// wildcards), for connections that do not say which listener took them (RDMA).
    pub fn find(&self, transport: Transport, local: SocketAddr) -> Option<(String, ListenerInfo)> {
        let fits = |l: &ListenerInfo| {
            l.transport == transport && l.port == local.port() && l.covers(local.ip())
        };
        self.entries()
            .iter()
            .filter(|(_, l)| fits(l))
            .min_by_key(|(_, l)| l.addr.is_unspecified())
            .cloned()
    }

    /// Every open listener, in the order they were opened.
    pub fn all(&self) -> Vec<(String, ListenerInfo)> {
        self.entries().clone()
    }
}

enum Socket {
    Tcp(TcpListener),
    /// Listening on the RDMA CM service under the listener's name.
    Rdma,
}

struct Listener {
    name: String,
    info: ListenerInfo,
    socket: Socket,
}

/// After accept found no file descriptor left, the TCP listeners rest this long before
/// accepting again (waiting connections stay in the kernel's backlog meanwhile) instead
/// of spinning on a listener that stays readable.
pub(super) const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// At most one log line per this while accept keeps running out of file descriptors.
pub(super) const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Accept failed for lack of file descriptors or kernel memory: retrying at once fails
/// the same way.
fn out_of_descriptors(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    matches!(
        e.raw_os_error().map(Errno::from_raw),
        Some(Errno::EMFILE | Errno::ENFILE | Errno::ENOBUFS | Errno::ENOMEM)
    )
}

/// The accept back-off's state.
struct AcceptBackoff {
    /// No accept before this.
    until: Option<Instant>,
    /// Its lines: at most one per [`ACCEPT_LOG_INTERVAL`].
    lines: sta::LogEvery,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff {
            until: None,
            lines: sta::LogEvery::new(ACCEPT_LOG_INTERVAL),
        }
    }
}

/// The daemon's listeners and the RDMA CM service that serves the RDMA ones.
#[derive(Default)]
pub(super) struct Listeners {
    list: Vec<Listener>,
    rdma: Option<RdmaService>,
    backoff: AcceptBackoff,
}

impl Listeners {
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Open listener `l`: bind (TCP) or listen on the CM service (RDMA, starting it first
    /// if needed), then make it known to the target (discovery log, Connect checks) and
    /// to the other threads.
    pub fn open(
        &mut self,
        shared: &Arc<Shared>,
        l: &ListenerConfig,
        max_queue_depth: u16,
    ) -> Result<(), ListenerError> {
        let (socket, tls) = self.bind(shared, l, max_queue_depth)?;
        self.register(shared, l, socket, tls);
        Ok(())
    }

    /// Replace open listener `old` by `new` (same name, another address or other
    /// settings). On the same TCP address only the TLS settings change (the socket
    /// stays); on another, the new socket is bound before the old one is closed, so a
    /// failed bind leaves the old listener serving; on RDMA (the CM service listens by
    /// name) the old one is closed first and opened again if the new one fails. On
    /// error, whether the old one still listens.
    pub fn replace(
        &mut self,
        shared: &Arc<Shared>,
        old: &ListenerConfig,
        new: &ListenerConfig,
        max_queue_depth: u16,
    ) -> Result<(), (ListenerError, bool)> {
        let same_address = listener_info(old) == listener_info(new);
        if same_address && new.transport == TransportKind::Tcp {
            // Other settings (TLS) on the same address: the socket and the target's
            // listener (its PORTID, which connected queues' ANA checks use) stay, so no
            // connect is refused meanwhile; only the TLS settings change.
            let tls = tls_accept(shared, new).map_err(|e| (e, true))?;
            if let Some(l) = self.list.iter().find(|l| l.name == old.name) {
                set_tls(shared, &l.name, &l.info, tls);
                tracing::info!(
                    "listener {}: now {} on {}:{}",
                    new.name,
                    if new.tls == TlsMode::None {
                        "without TLS".to_string()
                    } else {
                        format!("TLS {}", new.tls)
                    },
                    new.address,
                    new.port
                );
                return Ok(());
            }
        }
        if !same_address && new.transport == TransportKind::Tcp {
            let (socket, tls) = self
                .bind(shared, new, max_queue_depth)
                .map_err(|e| (e, true))?;
            self.close(shared, &old.name);
            self.register(shared, new, socket, tls);
            return Ok(());
        }
        self.close(shared, &old.name);
        let Err(e) = self.open(shared, new, max_queue_depth) else {
            return Ok(());
        };
        match self.open(shared, old, max_queue_depth) {
            Ok(()) => {
                tracing::warn!(
                    "listener {}: kept its old settings ({}:{}): the new ones failed",
                    old.name,
                    old.address,
                    old.port
                );
                Err((e, true))
            }
            Err(again) => {
                tracing::error!(
                    "listener {}: the old settings could not be opened again either: {again}",
                    old.name
                );
                Err((e, false))
            }
        }
    }

    /// The fallible half of [`Listeners::open`]: the socket (or the CM service's listen)
    /// and the TLS context.
    fn bind(
        &mut self,
        shared: &Arc<Shared>,
        l: &ListenerConfig,
        max_queue_depth: u16,
    ) -> Result<(Socket, Option<sta::TlsAccept>), ListenerError> {
        let addr = SocketAddr::new(l.address, l.port);
        let tls = tls_accept(shared, l)?;
        let socket = match l.transport {
            TransportKind::Tcp => {
                let sock = TcpListener::bind(addr)
                    .and_then(|s| s.set_nonblocking(true).map(|()| s))
                    .map_err(|source| ListenerError::Bind { addr, source })?;
                Socket::Tcp(sock)
            }
            TransportKind::Rdma => {
                let service = match self.rdma.as_mut() {
                    Some(s) => s,
                    None => self.rdma.insert(start_rdma(shared, max_queue_depth)?),
                };
                service.listen(&l.name, addr)?;
                Socket::Rdma
            }
        };
        Ok((socket, tls))
    }

    /// The infallible half of [`Listeners::open`]: make the bound listener known to the
    /// target (discovery log, Connect checks) and to the other threads.
    fn register(
        &mut self,
        shared: &Arc<Shared>,
        l: &ListenerConfig,
        socket: Socket,
        tls: Option<sta::TlsAccept>,
    ) {
        let addr = SocketAddr::new(l.address, l.port);
        let info = listener_info(l);
        if l.transport == TransportKind::Tcp {
            set_tls(shared, &l.name, &info, tls);
        }
        shared.target().add_listener(info.clone());
        shared
            .listeners
            .entries()
            .push((l.name.clone(), info.clone()));
        tracing::info!(
            "listening on {addr} (nvme/{}, listener {})",
            l.transport,
            l.name
        );
        self.list.push(Listener {
            name: l.name.clone(),
            info,
            socket,
        });
    }

    /// Close listener `name`: it leaves the target and the directory (connections it
    /// accepted are not touched here; a reload retires them: `retire_out_of_policy`).
    /// False if it was not open.
    pub fn close(&mut self, shared: &Shared, name: &str) -> bool {
        let Some(i) = self.list.iter().position(|l| l.name == name) else {
            return false;
        };
        let l = self.list.remove(i);
        if let (Socket::Rdma, Some(r)) = (&l.socket, self.rdma.as_mut()) {
            r.unlisten(name);
        }
        shared.target().remove_listener(&l.info);
        shared.listeners.entries().retain(|(n, _)| n != name);
        shared.listeners.tls_entries().remove(name);
        tracing::info!("listener {name} closed");
        true
    }

    /// The TCP listeners' sockets, for the main loop's poll (none while accept backs off).
    pub fn tcp_fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        let resting = self.backoff.until.is_some_and(|t| Instant::now() < t);
        self.list
            .iter()
            .filter(move |_| !resting)
            .filter_map(|l| match &l.socket {
                Socket::Tcp(s) => Some(s.as_fd()),
                Socket::Rdma => None,
            })
    }

    /// Accept every waiting TCP connection and hand each to the IO thread with the fewest
    /// QPs (or close it at once when it is over a connection limit). Out of file
    /// descriptors, stop accepting for [`ACCEPT_BACKOFF`] and say so at most once per
    /// [`ACCEPT_LOG_INTERVAL`].
    pub fn accept(&mut self, shared: &Shared) {
        let now = Instant::now();
        if self.backoff.until.is_some_and(|t| now < t) {
            return;
        }
        self.backoff.until = None;
        for l in &self.list {
            let Socket::Tcp(sock) = &l.socket else {
                continue;
            };
            loop {
                match sock.accept() {
                    Ok((conn, peer)) => {
                        let slot = match shared.conn_limits.admit(Some(peer.ip())) {
                            Ok(s) => s,
                            Err(limit) => {
                                // Dropping the socket closes it; nothing was read from it.
                                drop(conn);
                                let info = ConnInfo {
                                    peer: Some(peer),
                                    listener: Some(l.name.clone()),
                                };
                                shared.limit_refused(limit, &info);
                                continue;
                            }
                        };
                        let t = shared.pick_thread();
                        tracing::debug!("connection from {peer} on {} to io thread {t}", l.name);
                        let msg = ThreadMsg::Conn {
                            sock: conn,
                            peer,
                            listener: l.name.clone(),
                            info: l.info.clone(),
                            slot,
                        };
                        shared.send(t, msg);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if out_of_descriptors(&e) => {
                        shared.accept_backoff();
                        let b = &mut self.backoff;
                        b.until = Some(now + ACCEPT_BACKOFF);
                        if let Some(quiet) = b.lines.admit(now) {
                            tracing::warn!(
                                "accept on {}: {e}: not accepting for {ACCEPT_BACKOFF:?} at a \
                                 time ({} time(s) since the last such line; raise the \
                                 service's LimitNOFILE= or lower limits.max_connections)",
                                l.name,
                                quiet + 1
                            );
                        }
                        return;
                    }
                    // A connection that went before it was taken: the next one may be fine.
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => continue,
                    Err(e) => {
                        tracing::warn!("accept on {}: {e}", l.name);
                        break;
                    }
                }
            }
        }
    }

    /// Graceful stop, first step: no new connections (the CM service keeps running for
    /// the connections being drained).
    pub fn close_all(&mut self) {
        self.list.clear();
        if let Some(r) = self.rdma.as_mut() {
            r.close_listeners();
        }
    }

    /// Graceful stop, last step, once every IO thread has drained (every accepted CM id
    /// is gone with its QP): stop the CM service.
    pub fn shutdown_rdma(&mut self) {
        if let Some(r) = self.rdma.take() {
            r.shutdown();
        }
    }
}

/// Start the RDMA CM service: connections go to the IO thread with the fewest QPs.
fn start_rdma(shared: &Arc<Shared>, max_queue_depth: u16) -> Result<RdmaService, VerbsError> {
    let (a, b, c) = (shared.clone(), shared.clone(), shared.clone());
    RdmaService::start(
        nvmf::rdma::CmLimits {
            max_queue_depth,
            admin_queue_depth: RDMA_ADMIN_QUEUE_DEPTH,
            max_io_queues: MAX_IO_QUEUES,
        },
        Box::new(move || a.pick_thread()),
        Box::new(move |t, m| b.send(t, ThreadMsg::Rdma(m))),
        Box::new(move |req, status| {
            let listener = req
                .local
                .and_then(|l| c.listeners.find(Transport::Rdma, l))
                .map(|(n, _)| n);
            let conn = ConnInfo {
                peer: req.peer,
                listener,
            };
            let line = format!(
                "{}: rdma: rejecting a connect request ({status:?}: the NVMe-oF RDMA private \
                 data is invalid or asks for more than this target allows; private data {:02x?})",
                crate::refusals::where_from(Some(&conn)),
                &req.private_data[..req.private_data.len().min(32)]
            );
            c.refusals
                .report(crate::refusals::RDMA_CONNECT_REJECTED, conn.peer, &line);
        }),
    )
}
