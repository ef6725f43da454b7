//! Why this file is (just) over 800 lines: the scrape server is small; most of the file is
//! the exposition (`Snapshot` and its `Collector`), every series with its help text and
//! labels, which reads best in one list.
//!
//! Prometheus `/metrics`: a tiny HTTP/1.1 server on one std `TcpListener` thread.
//!
//! A scrape reads everything it reports at that moment: the engine's per-thread counters
//! (`sta::Stats`, summed over IO threads, never locked by the data path), a
//! [`TargetReport`] (the target's mutex is held only while the report is copied) and the
//! subsystem id → NQN map. Nothing on the data path knows a scrape happened.
//!
//! The exposition is built with `prometheus-client` (OpenMetrics text). A client that
//! asks for `application/openmetrics-text` (Prometheus does) gets it as is; any other
//! client gets the Prometheus text format 0.0.4 (`text/plain; version=0.0.4`), which is
//! the same text with counters' `HELP`/`TYPE` renamed to their `_total` sample name and
//! without the `# UNIT`/`# EOF` lines (what `promtool check metrics` and curl users read).
//!
//! HTTP: `GET`/`HEAD /metrics` (a query string is ignored) → 200, any other path → 404,
//! another method on `/metrics` → 405, a malformed request → 400, a request head over
//! [`MAX_REQUEST_HEAD`] → 431. Every response closes the connection. Each connection gets
//! its own short-lived thread, at most [`MAX_CONNECTIONS`] at once, and must deliver its
//! request head within [`REQUEST_DEADLINE`] in total, so a slow or silent client costs one
//! thread for a bounded time. When all are taken, a new connection takes the place of
//! one still waiting for its request head, or one whose response has taken more than
//! [`SLOW_RESPONSE`] so far: the oldest of the client address holding the most
//! connections (closed unanswered or cut). So one client holding idle connections, or
//! reading its responses slowly, cannot keep a scraper out, which sends its request as
//! soon as it connects and reads the answer at once. Only when no connection may be cut
//! is the new one answered 503 and closed. Both are counted in
//! `metrics_connections_cut_total{reason=evicted/busy}`. A response must be written
//! within [`WRITE_TIMEOUT`] in all. Refused requests (400, 404, 405, 431, the head
//! deadline) are counted in `metrics_requests_refused_total{reason}`; refusals and cuts are
//! logged at info, at most one line per 10 s.
//!
//! Metrics (all prefixed `nvmft_`):
//!
//! | name | type | labels |
//! |---|---|---|
//! | `namespace_commands_total` | counter | subsystem, nsid, op=read/write/other |
//! | `namespace_io_bytes_total` | counter | subsystem, nsid, op=read/write |
//! | `namespace_errors_total` | counter | subsystem, nsid |
//! | `namespace_status_errors_total` | counter | subsystem, nsid, status (lba_out_of_range, ..., other) |
//! | `namespace_backend_queue_depth` | gauge | subsystem, nsid |
//! | `namespace_latency_seconds` | histogram | subsystem, nsid, op |
//! | `namespace_size_bytes` | gauge | subsystem, nsid |
//! | `subsystem_namespaces` | gauge | subsystem |
//! | `subsystems` | gauge | |
//! | `controllers` | gauge | subsystem, host, transport (past 128 hosts of a subsystem, the rest as `host="(others)"`) |
//! | `connections` | gauge | subsystem, host, transport (one per queue: admin + I/O; hosts as for `controllers`) |
//! | `listeners` | gauge | transport |
//! | `discovery_generation` | gauge | |
//! | `io_threads` | gauge | |
//! | `io_thread_polls_total` | counter | thread, state=busy/idle |
//! | `io_thread_capsules_total` | counter | thread, path=offloaded/non_offloaded |
//! | `io_thread_queue_pairs` | gauge | thread |
//! | `refusals_total` | counter | reason (`RefusalReason::LABELS` and icreq_rejected, c2h_term_req_sent, h2c_term_req_received, rdma_connect_rejected, tls_handshake_failed, refused_before_connect, rdma_transport_error) |
//! | `limit_hits_total` | counter | limit (the engine's `sta::Limit` labels: icreq_timeout, connect_timeout, host_data_timeout, partial_pdu_timeout, drain_timeout, send_queue, queue_depth, connection_buffers, buffer_pool, command_slots, peer_buffers, peer_command_slots; the daemon's: connections, connections_per_peer, unconnected_connections, unconnected_connections_per_peer, accept_open_files) |
//! | `rdma_late_completion_events_total` | counter | (completion events the kernel queued for a CQ already destroyed, discarded unread: `sta::verbs::CqChannel`) |
//! | `rdma_completion_channels_closed_early_total` | counter | (channels of destroyed CQs closed before their grace period, at most `sta::verbs::MAX_BURIED` waiting) |
//! | `peer_connections` | gauge | state=connected/unconnected (connections held under `limits:`, before and after their Fabrics Connect) |
//! | `auth_dh_jobs_waiting` | gauge | (DH-HMAC-CHAP key pairs and shared secrets waiting for the DH threads) |
//! | `auth_dh_jobs_total` | counter | state=run/skipped (skipped: the queue went or its transaction started over before its turn) |
//! | `metrics_connections_cut_total` | counter | reason=evicted/busy (this endpoint's own connections, see above) |
//! | `metrics_requests_refused_total` | counter | reason=bad_request/not_found/method_not_allowed/head_too_large/head_timeout |
//! | `start_time_seconds` | gauge | |
//! | `uptime_seconds` | gauge | |
//! | `build_info` | gauge (1) | version |
//!
//! Per-namespace series are reported for the namespaces attached now, as the target's
//! report lists them: the engine keeps a removed namespace's counters (they count on if it
//! comes back), but its series leave the scrape with the reload that removed it.
//! `subsystems` counts the configured subsystems, as `ctl status` does; the discovery
//! subsystem is not one of them.
//!
//! Not reported, because nothing counts them (yet): errors of the non-offloaded path per
//! namespace (the target answers those, not the engine), bytes of "other" commands (DSM,
//! WRITE ZEROES, COMPARE move no host data or are not counted as bytes), per-transport
//! queue counts beyond what the daemon's `transport_of` says. Errors by status cover the
//! engine's statuses one by one (`sta::ERROR_STATUSES`) and the rest as `other`.

use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::lock;
use nvmf::target::report::TargetReport;
use nvmf::target::QueueKey;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use sta::{LatencyTotals, SubsysId, LATENCY_BOUNDS_US};

/// Longest request head (request line + headers) accepted.
pub const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// Time a client has to deliver its whole request head.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Time allowed for writing a whole response (a client that reads it slowly is cut off).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// A response still being written after this long may lose its place to a new
/// connection when all are taken (see the module docs).
pub const SLOW_RESPONSE: Duration = Duration::from_secs(2);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 8;

/// Content type of the OpenMetrics text exposition.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Content type of the Prometheus text format 0.0.4.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Where a scrape reads its numbers. Every closure runs on the metrics thread at scrape
/// time only.
pub struct MetricsSource {
    /// The engine's counters.
    pub stats: sta::Stats,
    /// A snapshot of the target (lock, `report()`, unlock).
    pub report: Box<dyn Fn() -> TargetReport + Send + Sync>,
    /// The engine's subsystem ids and their NQNs.
    pub subsystems: Box<dyn Fn() -> Vec<(SubsysId, String)> + Send + Sync>,
    /// The transport ("tcp", "rdma") a queue key belongs to.
    pub transport_of: Box<dyn Fn(QueueKey) -> &'static str + Send + Sync>,
    /// Refusals by reason (every reason, zeros included).
    pub refusals: Box<dyn Fn() -> Vec<(&'static str, u64)> + Send + Sync>,
    /// Hits of every bound and deadline held to peers, by limit (zeros included).
    pub limit_hits: Box<dyn Fn() -> Vec<(&'static str, u64)> + Send + Sync>,
    /// Connections held: (past their Fabrics Connect, not yet).
    pub peer_connections: Box<dyn Fn() -> (u64, u64) + Send + Sync>,
    /// DH-HMAC-CHAP jobs: (waiting, run, skipped).
    pub dh_jobs: Box<dyn Fn() -> (u64, u64, u64) + Send + Sync>,
    /// When the daemon started.
    pub started: SystemTime,
}

/// Binds `addr` (an error if it is taken) and serves `/metrics` on a thread of its own
/// until the process exits.
pub fn serve(addr: SocketAddr, source: MetricsSource) -> std::io::Result<JoinHandle<()>> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    let source = Arc::new(source);
    let live = Arc::new(Mutex::new(Live::default()));
    let h = std::thread::Builder::new()
        .name("nvmft-metrics".into())
        .spawn(move || {
            tracing::info!("metrics on http://{local}/metrics");
            for conn in listener.incoming() {
                let stream = match conn {
                    Ok(s) => s,
                    Err(e) => {
                        // EMFILE and friends: do not spin.
                        tracing::warn!("metrics: accept: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                };
                let Ok(peer) = stream.peer_addr() else {
                    continue;
                };
                let id = match lock(&live).admit(&stream, peer.ip(), Instant::now()) {
                    Some(id) => id,
                    None => {
                        let n = CUT_BUSY.fetch_add(1, Ordering::Relaxed) + 1;
                        log_cut(Some(peer.ip()), "busy (answered 503)", n);
                        let mut s = stream;
                        // A scraper that cannot be told "busy" gets the close instead.
                        let by = Instant::now() + Duration::from_secs(1);
                        let _ = respond(&mut s, by, 503, "text/plain", b"busy\n", false);
                        continue;
                    }
                };
                let source = source.clone();
                let live2 = live.clone();
                let spawned = std::thread::Builder::new()
                    .name("nvmft-metrics-conn".into())
                    .spawn(move || {
                        handle(stream, &source, || {
                            lock(&live2).head_read(id, Instant::now())
                        });
                        lock(&live2).gone(id);
                    });
                if let Err(e) = spawned {
                    lock(&live).gone(id);
                    tracing::warn!("metrics: cannot spawn a connection thread: {e}");
                }
            }
        })?;
    Ok(h)
}

/// Distinct `host` label values per subsystem in `controllers` and `connections`; the
/// rest are summed under [`OTHER_HOSTS`].
pub const MAX_HOST_LABELS: usize = 128;
/// The `host` label of the hosts past [`MAX_HOST_LABELS`] (not a valid NQN: no clash).
pub const OTHER_HOSTS: &str = "(others)";

/// Connections cut: answered 503 (every one was past its request head), or evicted.
static CUT_BUSY: AtomicU64 = AtomicU64::new(0);
static CUT_EVICTED: AtomicU64 = AtomicU64::new(0);

/// Why a request to this endpoint was refused (`metrics_requests_refused_total{reason}`).
#[derive(Clone, Copy)]
enum Refused {
    BadRequest,
    NotFound,
    MethodNotAllowed,
    HeadTooLarge,
    HeadTimeout,
}

impl Refused {
    const ALL: [Refused; 5] = [
        Refused::BadRequest,
        Refused::NotFound,
        Refused::MethodNotAllowed,
        Refused::HeadTooLarge,
        Refused::HeadTimeout,
    ];

    fn label(self) -> &'static str {
        match self {
            Refused::BadRequest => "bad_request",
            Refused::NotFound => "not_found",
            Refused::MethodNotAllowed => "method_not_allowed",
            Refused::HeadTooLarge => "head_too_large",
            Refused::HeadTimeout => "head_timeout",
        }
    }
}

/// Requests refused so far, by [`Refused`] (its discriminant).
static REFUSED: [AtomicU64; Refused::ALL.len()] = [const { AtomicU64::new(0) }; 5];
/// When a refusal or cut was last logged: at most one line per [`REFUSAL_LOG_EVERY`].
static REFUSAL_LOGGED: Mutex<Option<Instant>> = Mutex::new(None);
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Counts a refused request from `peer` and logs it, rate-limited: the line says how many
/// there were in all.
fn refused(peer: Option<IpAddr>, why: Refused) {
    let n = REFUSED[why as usize].fetch_add(1, Ordering::Relaxed) + 1;
    log_cut(peer, why.label(), n);
}

/// Logs (at info, at most once per [`REFUSAL_LOG_EVERY`]) that a connection from `peer`
/// was refused or cut for `what`, the `n`th so.
fn log_cut(peer: Option<IpAddr>, what: &str, n: u64) {
    let now = Instant::now();
    let mut last = lock(&REFUSAL_LOGGED);
    if last.is_some_and(|t| now.duration_since(t) < REFUSAL_LOG_EVERY) {
        return;
    }
    *last = Some(now);
    let from = peer.map_or_else(|| "?".to_string(), |ip| ip.to_string());
    tracing::info!(
        "metrics: connection from {from} refused or cut: {what} ({n} so far for this \
         reason; nvmft_metrics_requests_refused_total and nvmft_metrics_connections_cut_total \
         count them all; logged at most every {}s)",
        REFUSAL_LOG_EVERY.as_secs()
    );
}

/// The connections being served.
#[derive(Default)]
struct Live {
    next: u64,
    conns: Vec<LiveConn>,
}

struct LiveConn {
    id: u64,
    ip: IpAddr,
    /// A handle to shut the connection down with (its thread holds the other); `None`
    /// when none could be made (out of file descriptors): it is then never cut.
    stream: Option<TcpStream>,
    /// When its request head was in (`None`: not yet).
    head_at: Option<Instant>,
}

impl Live {
    /// A place for a new connection from `ip` (see the module docs), or `None`: answer
    /// 503.
    fn admit(&mut self, stream: &TcpStream, ip: IpAddr, now: Instant) -> Option<u64> {
        if self.conns.len() >= MAX_CONNECTIONS {
            let i = self.eviction_candidate(now)?;
            let c = self.conns.remove(i);
            // Its thread's read or write returns at once and the thread ends (it may have
            // been about to end anyway: counted as cut all the same).
            if let Some(s) = c.stream {
                let _ = s.shutdown(Shutdown::Both);
            }
            let n = CUT_EVICTED.fetch_add(1, Ordering::Relaxed) + 1;
            log_cut(
                Some(c.ip),
                "evicted (closed unanswered for a new connection)",
                n,
            );
        }
        self.next += 1;
        self.conns.push(LiveConn {
            id: self.next,
            ip,
            // Out of descriptors this fails: the scrape is served all the same (that is
            // when the operator needs it most), only it cannot be cut.
            stream: stream.try_clone().ok(),
            head_at: None,
        });
        Some(self.next)
    }

    /// The connection a new one replaces: of those still waiting for their request head
    /// or still being answered after [`SLOW_RESPONSE`], the oldest of the address with the
    /// most connections.
    fn eviction_candidate(&self, now: Instant) -> Option<usize> {
        let held = |ip: IpAddr| self.conns.iter().filter(|c| c.ip == ip).count();
        self.conns
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                c.stream.is_some()
                    && c.head_at
                        .is_none_or(|t| now.duration_since(t) >= SLOW_RESPONSE)
            })
            // Most connections first, then the oldest (lowest id).
            .max_by_key(|(_, c)| (held(c.ip), std::cmp::Reverse(c.id)))
            .map(|(i, _)| i)
    }

    fn head_read(&mut self, id: u64, now: Instant) {
        if let Some(c) = self.conns.iter_mut().find(|c| c.id == id) {
            c.head_at = Some(now);
        }
    }

    fn gone(&mut self, id: u64) {
        self.conns.retain(|c| c.id != id);
    }
}

/// Serves one request on `stream`, then closes it. `head_read` is called once the
/// request head is in.
fn handle(mut stream: TcpStream, source: &MetricsSource, head_read: impl FnOnce()) {
    // Results on this socket are the scraper's problem: a failed timeout setting or reply
    // ends in the close, and the next scrape starts over.
    let peer = stream.peer_addr().ok().map(|a| a.ip());
    let head = match read_head(&mut stream) {
        Ok(h) => h,
        Err(HeadError::TooLarge) => {
            refused(peer, Refused::HeadTooLarge);
            let _ = respond(
                &mut stream,
                Instant::now() + WRITE_TIMEOUT,
                431,
                "text/plain",
                b"request head too large\n",
                false,
            );
            return;
        }
        Err(HeadError::Deadline) => return refused(peer, Refused::HeadTimeout),
        Err(HeadError::Closed) => return,
    };
    head_read();
    let (status, ctype, body, head_only) = match parse_request(&head) {
        Err(()) => (400, "text/plain", b"bad request\n".to_vec(), false),
        Ok(req) if req.path != "/metrics" => (404, "text/plain", b"not found\n".to_vec(), false),
        Ok(req) if req.method != "GET" && req.method != "HEAD" => {
            (405, "text/plain", b"use GET\n".to_vec(), false)
        }
        Ok(req) => {
            let om = wants_openmetrics(req.accept.as_deref());
            let text = scrape(source);
            if om {
                (
                    200,
                    OPENMETRICS_CONTENT_TYPE,
                    text.into_bytes(),
                    req.method == "HEAD",
                )
            } else {
                (
                    200,
                    TEXT_CONTENT_TYPE,
                    openmetrics_to_text(&text).into_bytes(),
                    req.method == "HEAD",
                )
            }
        }
    };
    match status {
        400 => refused(peer, Refused::BadRequest),
        404 => refused(peer, Refused::NotFound),
        405 => refused(peer, Refused::MethodNotAllowed),
        _ => {}
    }
    let by = Instant::now() + WRITE_TIMEOUT;
    let _ = respond(&mut stream, by, status, ctype, &body, head_only);
}

enum HeadError {
    TooLarge,
    /// Not in within [`REQUEST_DEADLINE`].
    Deadline,
    Closed,
}

/// Reads up to the blank line that ends the request head, within [`REQUEST_DEADLINE`]
/// and [`MAX_REQUEST_HEAD`] bytes.
fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, HeadError> {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HeadError::Deadline);
        }
        if stream.set_read_timeout(Some(left)).is_err() {
            return Err(HeadError::Closed);
        }
        let n = match stream.read(&mut chunk) {
            Ok(0) => return Err(HeadError::Closed),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(HeadError::Deadline)
            }
            Err(_) => return Err(HeadError::Closed),
        };
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = find_head_end(&buf[from..]) {
            // (The head can end in the read that took it past the bound.)
            if from + end > MAX_REQUEST_HEAD {
                return Err(HeadError::TooLarge);
            }
            buf.truncate(from + end);
            return Ok(buf);
        }
        if buf.len() > MAX_REQUEST_HEAD {
            return Err(HeadError::TooLarge);
        }
    }
}

/// Offset just past the first `\r\n\r\n` (or a bare `\n\n`, which RFC 9112 lets a server
/// accept).
fn find_head_end(b: &[u8]) -> Option<usize> {
    (0..b.len()).find_map(|i| {
        if b[i..].starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else if b[i..].starts_with(b"\n\n") {
            Some(i + 2)
        } else {
            None
        }
    })
}

#[derive(Debug, PartialEq, Eq)]
struct Request {
    method: String,
    /// The path without its query string.
    path: String,
    accept: Option<String>,
}

/// Parses a request head (request line and header fields, RFC 9112 section 2-5).
fn parse_request(head: &[u8]) -> Result<Request, ()> {
    let text = std::str::from_utf8(head).map_err(|_| ())?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let line = lines.next().ok_or(())?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(());
    };
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    if !token(method) || !target.starts_with('/') || !matches!(version, "HTTP/1.0" | "HTTP/1.1") {
        return Err(());
    }
    if target.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err(());
    }
    let mut accept = None;
    for l in lines {
        if l.is_empty() {
            break;
        }
        let (name, value) = l.split_once(':').ok_or(())?;
        if !token(name) {
            return Err(());
        }
        if name.eq_ignore_ascii_case("accept") {
            let v = value.trim();
            accept = Some(match accept {
                None => v.to_string(),
                Some(prev) => format!("{prev},{v}"),
            });
        }
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    Ok(Request {
        method: method.to_string(),
        path: path.to_string(),
        accept,
    })
}

/// Content negotiation: OpenMetrics when the client rates it at least as high as plain
/// text (what Prometheus sends), plain text otherwise (curl's `*/*`, no header).
fn wants_openmetrics(accept: Option<&str>) -> bool {
    let Some(accept) = accept else {
        return false;
    };
    let (mut om, mut text) = (0.0f32, 0.0f32);
    for range in accept.split(',') {
        let mut params = range.split(';').map(str::trim);
        let media = params.next().unwrap_or("").to_ascii_lowercase();
        let q = params
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
            .and_then(|(_, v)| v.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        match media.as_str() {
            "application/openmetrics-text" => om = om.max(q),
            "text/plain" | "text/*" | "*/*" => text = text.max(q),
            _ => {}
        }
    }
    om > 0.0 && om >= text
}

/// Writes the response, all of it by `deadline`.
fn respond(
    stream: &mut TcpStream,
    deadline: Instant,
    status: u16,
    ctype: &str,
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status == 405 {
        head.push_str("Allow: GET, HEAD\r\n");
    }
    head.push_str("\r\n");
    write_all_by(stream, head.as_bytes(), deadline)?;
    if !head_only {
        write_all_by(stream, body, deadline)?;
    }
    // Let the client read everything before the close (no RST over unread request bytes);
    // a client that left already needs nothing more.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    Ok(())
}

/// `write_all` with one deadline for the whole of `buf`, however slowly the peer reads.
fn write_all_by(stream: &mut TcpStream, mut buf: &[u8], deadline: Instant) -> std::io::Result<()> {
    while !buf.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(buf) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Prometheus text format 0.0.4 from `prometheus-client`'s OpenMetrics text: counters
/// are described under their sample name (`x_total`), `# UNIT` and `# EOF` go.
pub fn openmetrics_to_text(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    let mut help: Option<&str> = None;
    for line in om.lines() {
        if line.starts_with("# HELP ") {
            if let Some(h) = help.take() {
                out.push_str(h);
                out.push('\n');
            }
            help = Some(line);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let renamed = (kind == "counter").then(|| format!("{name}_total"));
            if let Some(h) = help.take() {
                match (
                    &renamed,
                    h.strip_prefix("# HELP ").and_then(|r| r.split_once(' ')),
                ) {
                    (Some(n), Some((_, text))) => {
                        let _ = writeln!(out, "# HELP {n} {text}");
                    }
                    _ => {
                        out.push_str(h);
                        out.push('\n');
                    }
                }
            }
            let _ = writeln!(out, "# TYPE {} {kind}", renamed.as_deref().unwrap_or(name));
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
        } else {
            if let Some(h) = help.take() {
                out.push_str(h);
                out.push('\n');
            }
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// One scrape: the OpenMetrics text of everything [`MetricsSource`] can tell.
pub fn scrape(source: &MetricsSource) -> String {
    let snap = Snapshot::take(source);
    let mut registry = Registry::with_prefix("nvmft");
    registry.register_collector(Box::new(snap));
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        tracing::error!("metrics: encoding failed");
    }
    out
}

type Labels = Vec<(&'static str, String)>;

/// The numbers of one scrape, read from the source up front so no lock is held while
/// encoding.
#[derive(Debug, Default)]
struct Snapshot {
    ns_commands: Vec<(Labels, u64)>,
    ns_bytes: Vec<(Labels, u64)>,
    ns_errors: Vec<(Labels, u64)>,
    ns_status_errors: Vec<(Labels, u64)>,
    ns_queue_depth: Vec<(Labels, u64)>,
    ns_latency: Vec<(Labels, LatencyTotals)>,
    ns_size: Vec<(Labels, u64)>,
    subsystem_namespaces: Vec<(Labels, u64)>,
    subsystems: u64,
    controllers: Vec<(Labels, u64)>,
    connections: Vec<(Labels, u64)>,
    listeners: Vec<(Labels, u64)>,
    discovery_generation: u64,
    io_threads: u64,
    thread_polls: Vec<(Labels, u64)>,
    thread_capsules: Vec<(Labels, u64)>,
    thread_qps: Vec<(Labels, u64)>,
    refusals: Vec<(Labels, u64)>,
    limit_hits: Vec<(Labels, u64)>,
    peer_connections: Vec<(Labels, u64)>,
    dh_waiting: u64,
    dh_jobs: Vec<(Labels, u64)>,
    rdma_late_events: u64,
    rdma_channels_closed_early: u64,
    metrics_cut: Vec<(Labels, u64)>,
    metrics_refused: Vec<(Labels, u64)>,
    start_time: f64,
    uptime: f64,
}

impl Snapshot {
    fn take(src: &MetricsSource) -> Snapshot {
        let mut s = Snapshot::default();
        let names: std::collections::HashMap<SubsysId, String> =
            (src.subsystems)().into_iter().collect();
        let report = (src.report)();
        let attached: std::collections::HashSet<(&str, u32)> = report
            .subsystems
            .iter()
            .flat_map(|sub| sub.namespaces.iter().map(|ns| (sub.nqn.as_str(), ns.nsid)))
            .collect();
        for (id, nsid) in src.stats.namespaces() {
            let Some(nqn) = names.get(&id) else { continue };
            if !attached.contains(&(nqn.as_str(), nsid)) {
                continue;
            }
            let t = src.stats.namespace(id, nsid);
            let base =
                || -> Labels { vec![("subsystem", nqn.clone()), ("nsid", nsid.to_string())] };
            let with = |op: &str| -> Labels {
                let mut l = base();
                l.push(("op", op.to_string()));
                l
            };
            s.ns_commands.push((with("read"), t.read_cmds));
            s.ns_commands.push((with("write"), t.write_cmds));
            s.ns_commands.push((with("other"), t.other_cmds));
            s.ns_bytes.push((with("read"), t.read_bytes));
            s.ns_bytes.push((with("write"), t.write_bytes));
            s.ns_errors.push((base(), t.errors));
            let status_names = sta::ERROR_STATUSES.iter().map(|(n, _)| *n).chain(["other"]);
            for (name, n) in status_names.zip(t.errors_by_status) {
                let mut l = base();
                l.push(("status", name.to_string()));
                s.ns_status_errors.push((l, n));
            }
            s.ns_queue_depth.push((base(), t.queue_depth));
            s.ns_latency.push((with("read"), t.read_latency));
            s.ns_latency.push((with("write"), t.write_latency));
            s.ns_latency.push((with("other"), t.other_latency));
        }

        for sub in &report.subsystems {
            if sub.is_discovery {
                // Not a configured subsystem (see `subsystems`); it has no namespaces.
                continue;
            }
            s.subsystem_namespaces.push((
                vec![("subsystem", sub.nqn.clone())],
                sub.namespaces.len() as u64,
            ));
            for ns in &sub.namespaces {
                s.ns_size.push((
                    vec![
                        ("subsystem", sub.nqn.clone()),
                        ("nsid", ns.nsid.to_string()),
                    ],
                    ns.size_bytes(),
                ));
            }
        }
        s.subsystems = report
            .subsystems
            .iter()
            .filter(|sub| !sub.is_discovery)
            .count() as u64;
        // (subsystem, host, transport) -> (controllers, queues)
        let mut by_host: std::collections::BTreeMap<(String, String, &'static str), (u64, u64)> =
            Default::default();
        for c in &report.controllers {
            let e = by_host
                .entry((
                    c.subnqn.clone(),
                    c.hostnqn.clone(),
                    (src.transport_of)(c.admin_queue),
                ))
                .or_default();
            e.0 += 1;
            e.1 += c.queue_count() as u64;
        }
        // Host NQNs are the peers' to choose (any host may open discovery controllers): past
        // the first MAX_HOST_LABELS of a subsystem (in NQN order), they are summed under
        // one `host="(others)"`, so a peer inventing NQNs cannot grow every scrape and the
        // monitoring's series without bound. Totals stay exact.
        let mut series: std::collections::BTreeMap<(String, String, &'static str), (u64, u64)> =
            Default::default();
        // This host's rank among its subsystem's (one host may come once per transport).
        let (mut prev, mut rank) = (None::<(&String, &String)>, 0usize);
        for ((sub, host, tr), &(ctrls, queues)) in &by_host {
            match prev {
                Some((s, h)) if s == sub => rank += usize::from(h != host),
                _ => rank = 0,
            }
            prev = Some((sub, host));
            let label = if rank < MAX_HOST_LABELS {
                host.clone()
            } else {
                OTHER_HOSTS.to_string()
            };
            let e = series.entry((sub.clone(), label, *tr)).or_default();
            e.0 += ctrls;
            e.1 += queues;
        }
        for ((sub, host, tr), (ctrls, queues)) in series {
            let l: Labels = vec![
                ("subsystem", sub),
                ("host", host),
                ("transport", tr.to_string()),
            ];
            s.controllers.push((l.clone(), ctrls));
            s.connections.push((l, queues));
        }
        let mut by_transport: std::collections::BTreeMap<&'static str, u64> = Default::default();
        for (_, l) in &report.listeners {
            let t = match l.transport {
                nvmf::target::Transport::Tcp => "tcp",
                nvmf::target::Transport::Rdma => "rdma",
            };
            *by_transport.entry(t).or_default() += 1;
        }
        s.listeners = by_transport
            .into_iter()
            .map(|(t, n)| (vec![("transport", t.to_string())], n))
            .collect();
        s.discovery_generation = report.discovery_generation;

        let threads = src.stats.threads();
        s.io_threads = threads.len() as u64;
        for (i, t) in threads.iter().enumerate() {
            let l = |k: &'static str, v: &str| -> Labels {
                vec![("thread", i.to_string()), (k, v.to_string())]
            };
            s.thread_polls.push((l("state", "busy"), t.busy_polls));
            s.thread_polls.push((l("state", "idle"), t.idle_polls));
            s.thread_capsules
                .push((l("path", "offloaded"), t.offloaded));
            s.thread_capsules
                .push((l("path", "non_offloaded"), t.non_offloaded));
            s.thread_qps.push((vec![("thread", i.to_string())], t.qps));
        }

        s.refusals = (src.refusals)()
            .into_iter()
            .map(|(reason, n)| (vec![("reason", reason.to_string())], n))
            .collect();
        s.limit_hits = (src.limit_hits)()
            .into_iter()
            .map(|(limit, n)| (vec![("limit", limit.to_string())], n))
            .collect();
        s.rdma_late_events = sta::verbs::late_cq_events();
        s.rdma_channels_closed_early = sta::verbs::early_closed_channels();
        s.metrics_cut = vec![
            (
                vec![("reason", "evicted".to_string())],
                CUT_EVICTED.load(Ordering::Relaxed),
            ),
            (
                vec![("reason", "busy".to_string())],
                CUT_BUSY.load(Ordering::Relaxed),
            ),
        ];
        s.metrics_refused = Refused::ALL
            .iter()
            .map(|&r| {
                let n = REFUSED[r as usize].load(Ordering::Relaxed);
                (vec![("reason", r.label().to_string())], n)
            })
            .collect();
        let (connected, unconnected) = (src.peer_connections)();
        s.peer_connections = vec![
            (vec![("state", "connected".to_string())], connected),
            (vec![("state", "unconnected".to_string())], unconnected),
        ];
        let (waiting, run, skipped) = (src.dh_jobs)();
        s.dh_waiting = waiting;
        s.dh_jobs = vec![
            (vec![("state", "run".to_string())], run),
            (vec![("state", "skipped".to_string())], skipped),
        ];

        let start = src.started.duration_since(UNIX_EPOCH).unwrap_or_default();
        s.start_time = start.as_secs_f64();
        s.uptime = SystemTime::now()
            .duration_since(src.started)
            .unwrap_or_default()
            .as_secs_f64();
        s
    }
}

fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    values: &[(Labels, u64)],
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (labels, v) in values {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    values: &[(Labels, u64)],
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (labels, v) in values {
        ConstGauge::new(*v as i64).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn gauge<V: prometheus_client::encoding::EncodeGaugeValue + Clone + std::fmt::Debug>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: V,
) -> Result<(), std::fmt::Error> {
    let m = enc.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    ConstGauge::new(v).encode(m)
}

/// Bucket upper bounds in seconds and per-bucket counts, the last one `+Inf`.
fn latency_buckets(t: &LatencyTotals) -> Vec<(f64, u64)> {
    LATENCY_BOUNDS_US
        .iter()
        .map(|&us| us as f64 / 1e6)
        .chain(std::iter::once(f64::INFINITY))
        .zip(t.buckets.iter().copied())
        .collect()
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut enc;
        counters(
            e,
            "namespace_commands",
            "Commands completed by the engine on a namespace, by operation.",
            None,
            &self.ns_commands,
        )?;
        counters(
            e,
            "namespace_io",
            "Data moved for reads and writes on a namespace.",
            Some(&Unit::Bytes),
            &self.ns_bytes,
        )?;
        counters(
            e,
            "namespace_errors",
            "Commands on a namespace that completed with an error status.",
            None,
            &self.ns_errors,
        )?;
        counters(
            e,
            "namespace_status_errors",
            "Commands on a namespace that completed with an error, by NVMe status.",
            None,
            &self.ns_status_errors,
        )?;
        gauges(
            e,
            "namespace_backend_queue_depth",
            "Requests in the namespace's backend queues now (all IO threads).",
            None,
            &self.ns_queue_depth,
        )?;
        {
            let mut m = e.encode_descriptor(
                "namespace_latency",
                "Time from capsule arrival to completion queued, by operation.",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for (labels, t) in &self.ns_latency {
                m.encode_family(labels)?
                    .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                        t.sum_ns as f64 / 1e9,
                        t.count(),
                        &latency_buckets(t),
                        None,
                    )?;
            }
        }
        gauges(
            e,
            "namespace_size",
            "Capacity of an attached namespace.",
            Some(&Unit::Bytes),
            &self.ns_size,
        )?;
        gauges(
            e,
            "subsystem_namespaces",
            "Namespaces attached to a subsystem.",
            None,
            &self.subsystem_namespaces,
        )?;
        gauge(
            e,
            "subsystems",
            "Configured subsystems (the discovery subsystem is not one).",
            None,
            self.subsystems as i64,
        )?;
        gauges(
            e,
            "controllers",
            "Live controllers by subsystem, host and transport.",
            None,
            &self.controllers,
        )?;
        gauges(
            e,
            "connections",
            "Connected queues (admin and I/O, one transport connection each) by subsystem, host and transport.",
            None,
            &self.connections,
        )?;
        gauges(
            e,
            "listeners",
            "Listening addresses by transport.",
            None,
            &self.listeners,
        )?;
        gauge(
            e,
            "discovery_generation",
            "Discovery log generation counter (GENCTR); it moves on every change hosts can discover.",
            None,
            self.discovery_generation as i64,
        )?;
        gauge(e, "io_threads", "IO threads.", None, self.io_threads as i64)?;
        counters(
            e,
            "io_thread_polls",
            "Engine progress passes of an IO thread that found work (busy) or none (idle).",
            None,
            &self.thread_polls,
        )?;
        counters(
            e,
            "io_thread_capsules",
            "Command capsules an IO thread's engine served itself (offloaded) or handed to the daemon (non_offloaded).",
            None,
            &self.thread_capsules,
        )?;
        gauges(
            e,
            "io_thread_queue_pairs",
            "Queue pairs an IO thread owns.",
            None,
            &self.thread_qps,
        )?;
        counters(
            e,
            "refusals",
            "Hosts refused or cut off, by reason: rejected ICReqs and Connects, CSTS.CFS, keep-alive expiry, TermReqs sent or received (each is also logged at warn, rate-limited per peer).",
            None,
            &self.refusals,
        )?;
        counters(
            e,
            "limit_hits",
            "Times a peer ran into a bound or deadline (limits: in the config, and the engine's own), by limit; the ones that cost the peer its connection are also logged at warn, rate-limited per peer.",
            None,
            &self.limit_hits,
        )?;
        gauges(
            e,
            "peer_connections",
            "Connections held under limits:, past their Fabrics Connect (connected) or not yet (unconnected).",
            None,
            &self.peer_connections,
        )?;
        gauge(
            e,
            "auth_dh_jobs_waiting",
            "DH-HMAC-CHAP key pairs and shared secrets waiting for the DH threads.",
            None,
            self.dh_waiting as i64,
        )?;
        counters(
            e,
            "auth_dh_jobs",
            "DH-HMAC-CHAP key pairs and shared secrets the DH threads ran, or skipped because their queue went or started over first.",
            None,
            &self.dh_jobs,
        )?;
        counters(
            e,
            "rdma_late_completion_events",
            "RDMA completion events the kernel queued for a completion queue already destroyed (Soft-RoCE before Linux 6.4 does), discarded without being read.",
            None,
            &[(Vec::new(), self.rdma_late_events)],
        )?;
        counters(
            e,
            "rdma_completion_channels_closed_early",
            "Completion channels of destroyed RDMA completion queues closed before their grace period for late events was over, because as many as sta::verbs::MAX_BURIED were waiting (connections opened and closed fast).",
            None,
            &[(Vec::new(), self.rdma_channels_closed_early)],
        )?;
        counters(
            e,
            "metrics_connections_cut",
            "Connections to this endpoint closed unanswered for a new one while all were taken (evicted: it had not sent its request yet), or answered 503 (busy: every connection was past its request).",
            None,
            &self.metrics_cut,
        )?;
        counters(
            e,
            "metrics_requests_refused",
            "Requests to this endpoint refused: malformed (bad_request), another path (not_found), another method (method_not_allowed), a head over 8 KiB (head_too_large), or not sent within the deadline (head_timeout).",
            None,
            &self.metrics_refused,
        )?;
        gauge(
            e,
            "start_time",
            "When the daemon started, seconds since the Unix epoch.",
            Some(&Unit::Seconds),
            self.start_time,
        )?;
        gauge(
            e,
            "uptime",
            "Seconds since the daemon started.",
            Some(&Unit::Seconds),
            self.uptime,
        )?;
        {
            let mut m = e.encode_descriptor(
                "build_info",
                "Always 1; the labels name the running build.",
                None,
                MetricType::Gauge,
            )?;
            let labels: Labels = vec![("version", env!("CARGO_PKG_VERSION").to_string())];
            ConstGauge::new(1i64).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
