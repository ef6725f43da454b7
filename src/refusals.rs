//! Refusals as the operator sees them: every refused ICReq or Connect, every CSTS.CFS,
//! every C2HTermReq sent or H2CTermReq received and every keep-alive expiry is logged at
//! warn with the peer address, the listener, the host NQN, the subsystem NQN, the
//! CNTLID/QID and the reason in words, and counted by reason for `/metrics`
//! (`nvmft_refusals_total{reason="..."}`).
//!
//! Logging is rate-limited per peer (IP address) and reason: at most
//! [`LINES_PER_WINDOW`] lines per [`WINDOW`], then one "suppressed K similar" line when
//! the window is over, so a host retrying in a tight loop cannot flood the journal (and
//! one kind of refusal flooding does not hide another). The table is bounded
//! ([`MAX_PEERS`] entries). All peers together get at most [`GLOBAL_LINES_PER_WINDOW`]
//! lines per reason and window, so many addresses (cheap with IPv6) cannot flood the
//! journal either, nor one reason hide another; what that suppresses is reported in one
//! line per reason, and at most [`SUMMARY_LINES`] per-peer summaries are written at once. Counting never stops. None of this is on the I/O path:
//! only refusals reach it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nvmf::target::{Refusal, RefusalReason};

/// Log lines per peer per [`WINDOW`].
pub const LINES_PER_WINDOW: u32 = 5;
/// The rate limit's window.
pub const WINDOW: Duration = Duration::from_secs(10);
/// (Peer, reason) pairs tracked at once; the oldest window makes room for a new one.
pub const MAX_PEERS: usize = 1024;
/// Log lines of one reason from all peers together per [`WINDOW`].
pub const GLOBAL_LINES_PER_WINDOW: u32 = 100;
/// Per-peer "suppressed" summaries written at once; the rest go in one line.
pub const SUMMARY_LINES: usize = 20;

/// Reasons the engine reports (NVMe/TCP connection termination), next to the target's
/// [`RefusalReason::LABELS`].
pub const ICREQ_REJECTED: &str = "icreq_rejected";
pub const C2H_TERM_REQ_SENT: &str = "c2h_term_req_sent";
pub const H2C_TERM_REQ_RECEIVED: &str = "h2c_term_req_received";
/// An NVMe/RDMA connect request rejected by the CM thread (the RDMA analog of a rejected
/// ICReq: bad private data, queue too deep, no resources).
pub const RDMA_CONNECT_REJECTED: &str = "rdma_connect_rejected";
/// A TLS handshake failed or timed out, or a plain host came to a TLS-required listener.
pub const TLS_HANDSHAKE_FAILED: &str = "tls_handshake_failed";
/// The engine answered a command with an error before the queue's Connect was answered
/// (a malformed Connect: its SGL and its data disagree).
pub const REFUSED_BEFORE_CONNECT: &str = "refused_before_connect";
/// An NVMe/RDMA queue closed for a transport failure: a work request failed (a key or
/// address in the host's SGL the NIC refused, the host stopped answering) or the host
/// broke the transport binding (a capsule shorter than an SQE or longer than IOCCSZ).
pub const RDMA_TRANSPORT_ERROR: &str = "rdma_transport_error";
const ENGINE_LABELS: [&str; 7] = [
    ICREQ_REJECTED,
    C2H_TERM_REQ_SENT,
    H2C_TERM_REQ_RECEIVED,
    RDMA_CONNECT_REJECTED,
    TLS_HANDSHAKE_FAILED,
    REFUSED_BEFORE_CONNECT,
    RDMA_TRANSPORT_ERROR,
];

/// What is known of a connection, for log lines: who it came from and on which listener.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnInfo {
    pub peer: Option<SocketAddr>,
    pub listener: Option<String>,
}

/// Whether one more line for a peer may be logged now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Log,
    Suppress,
}

#[derive(Clone, Copy, Debug)]
struct Window {
    start: Instant,
    lines: u32,
    suppressed: u64,
}

/// Who a rate-limit window is for: a peer (if known) and a reason label.
pub type Source = (Option<IpAddr>, &'static str);

/// Lines a window that is over suppressed: one peer's, or all peers' of one reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Summary {
    Peer(Source, u64),
    AllPeers(&'static str, u64),
}

/// The per-(peer, reason) rate limit and the daemon-wide one, with explicit time (tested
/// without a clock).
#[derive(Debug, Default)]
pub struct Limiter {
    peers: HashMap<Source, Window>,
    /// The daemon-wide window of each reason.
    global: HashMap<&'static str, Window>,
}

impl Limiter {
    /// One more event from `peer` at `now`. `over` collects what windows that ended had
    /// suppressed, to be reported.
    pub fn admit(&mut self, now: Instant, peer: Source, over: &mut Vec<Summary>) -> Admit {
        match self.admit_peer(now, peer, over) {
            Admit::Log => self.admit_global(now, peer.1, over),
            Admit::Suppress => Admit::Suppress,
        }
    }

    /// A line the peer's window lets through, against the daemon-wide budget of its
    /// reason.
    fn admit_global(
        &mut self,
        now: Instant,
        label: &'static str,
        over: &mut Vec<Summary>,
    ) -> Admit {
        self.expire_global(now, over);
        let w = self.global.entry(label).or_insert(Window {
            start: now,
            lines: 0,
            suppressed: 0,
        });
        if w.lines < GLOBAL_LINES_PER_WINDOW {
            w.lines += 1;
            Admit::Log
        } else {
            w.suppressed += 1;
            Admit::Suppress
        }
    }

    fn expire_global(&mut self, now: Instant, over: &mut Vec<Summary>) {
        self.global.retain(|label, w| {
            let live = now.saturating_duration_since(w.start) < WINDOW;
            if !live && w.suppressed > 0 {
                over.push(Summary::AllPeers(label, w.suppressed));
            }
            live
        });
    }

    fn admit_peer(&mut self, now: Instant, peer: Source, over: &mut Vec<Summary>) -> Admit {
        if let Some(w) = self.peers.get_mut(&peer) {
            if now.saturating_duration_since(w.start) < WINDOW {
                if w.lines < LINES_PER_WINDOW {
                    w.lines += 1;
                    return Admit::Log;
                }
                w.suppressed += 1;
                return Admit::Suppress;
            }
            if w.suppressed > 0 {
                over.push(Summary::Peer(peer, w.suppressed));
            }
            *w = Window {
                start: now,
                lines: 1,
                suppressed: 0,
            };
            return Admit::Log;
        }
        if self.peers.len() >= MAX_PEERS {
            self.expire(now, over);
        }
        if self.peers.len() >= MAX_PEERS {
            // Still full of live windows: the oldest goes (its suppressed count is
            // reported now rather than lost).
            if let Some((&oldest, w)) = self.peers.iter().min_by_key(|(_, w)| w.start) {
                if w.suppressed > 0 {
                    over.push(Summary::Peer(oldest, w.suppressed));
                }
                self.peers.remove(&oldest);
            }
        }
        self.peers.insert(
            peer,
            Window {
                start: now,
                lines: 1,
                suppressed: 0,
            },
        );
        Admit::Log
    }

    /// Drops windows that are over at `now`, reporting those that suppressed lines.
    pub fn expire(&mut self, now: Instant, over: &mut Vec<Summary>) {
        self.expire_global(now, over);
        self.peers.retain(|peer, w| {
            let live = now.saturating_duration_since(w.start) < WINDOW;
            if !live && w.suppressed > 0 {
                over.push(Summary::Peer(*peer, w.suppressed));
            }
            live
        });
    }

    #[cfg(test)]
    pub fn peers(&self) -> usize {
        self.peers.len()
    }
}

/// Counters by reason and the rate-limited log. Shared by every thread.
pub struct RefusalLog {
    counts: Vec<(&'static str, AtomicU64)>,
    limiter: Mutex<Limiter>,
}

impl Default for RefusalLog {
    fn default() -> Self {
        RefusalLog::new()
    }
}

impl RefusalLog {
    pub fn new() -> RefusalLog {
        let counts = RefusalReason::LABELS
            .iter()
            .chain(ENGINE_LABELS.iter())
            .map(|&l| (l, AtomicU64::new(0)))
            .collect();
        RefusalLog {
            counts,
            limiter: Mutex::new(Limiter::default()),
        }
    }

    /// Counts one refusal with this label.
    pub fn count(&self, label: &str) {
        if let Some((_, c)) = self.counts.iter().find(|(l, _)| *l == label) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every reason with its count (zeros included), in a stable order.
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        self.counts
            .iter()
            .map(|(l, c)| (*l, c.load(Ordering::Relaxed)))
            .collect()
    }

    /// Counts `label` and logs `line` at warn unless `peer` is over its rate for it.
    pub fn report(&self, label: &str, peer: Option<SocketAddr>, line: &str) {
        self.count(label);
        let label = self
            .counts
            .iter()
            .map(|(l, _)| *l)
            .find(|l| *l == label)
            .unwrap_or("other");
        self.log(label, peer, line);
    }

    /// Logs `line` at warn unless `peer` is over its rate for `label`, counting nothing
    /// here (limit hits are counted where the limit is, `nvmft_limit_hits_total`).
    pub fn log(&self, label: &'static str, peer: Option<SocketAddr>, line: &str) {
        self.log_with(label, peer, || line.to_string());
    }

    /// [`RefusalLog::log`] with the line made only if it is logged (for a line that
    /// costs something to make).
    pub fn log_with(
        &self,
        label: &'static str,
        peer: Option<SocketAddr>,
        line: impl FnOnce() -> String,
    ) {
        let ip = peer.map(|p| p.ip().to_canonical());
        let mut over = Vec::new();
        let admit = self
            .limiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(Instant::now(), (ip, label), &mut over);
        log_suppressed(&over);
        if admit == Admit::Log {
            tracing::warn!(reason = label, "{}", line());
        }
    }

    /// Reports windows that ended with suppressed lines (call now and then).
    pub fn flush(&self) {
        let mut over = Vec::new();
        self.limiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .expire(Instant::now(), &mut over);
        log_suppressed(&over);
    }
}

fn log_suppressed(over: &[Summary]) {
    let mut peers = Vec::new();
    for s in over {
        match *s {
            Summary::AllPeers(label, n) => tracing::warn!(
                reason = label,
                "suppressed {n} refusal line(s) of this reason from all peers together (at \
                 most {GLOBAL_LINES_PER_WINDOW} per {}s; all are counted in \
                 nvmft_refusals_total or nvmft_limit_hits_total)",
                WINDOW.as_secs()
            ),
            Summary::Peer(src, n) => peers.push((src, n)),
        }
    }
    if peers.len() > SUMMARY_LINES {
        let rest = &peers[SUMMARY_LINES..];
        let lines: u64 = rest.iter().map(|(_, n)| n).sum();
        tracing::warn!(
            "suppressed {lines} more refusal line(s) from {} more peer(s) and reason(s)",
            rest.len()
        );
    }
    for ((peer, label), n) in peers.into_iter().take(SUMMARY_LINES) {
        let who = peer.map_or_else(|| "an unknown peer".to_string(), |p| p.to_string());
        tracing::warn!(
            reason = label,
            "suppressed {n} similar refusal line(s) from {who} (at most {LINES_PER_WINDOW} per {}s per peer and reason; all are counted in nvmft_refusals_total or nvmft_limit_hits_total)",
            WINDOW.as_secs()
        );
    }
}

/// "peer 10.0.0.2:51234 on listener tcp0"
pub fn where_from(c: Option<&ConnInfo>) -> String {
    let peer = c
        .and_then(|c| c.peer)
        .map_or_else(|| "unknown peer".to_string(), |p| format!("peer {p}"));
    let listener = c.and_then(|c| c.listener.as_deref()).map_or_else(
        || "an unknown listener".to_string(),
        |l| format!("listener {l}"),
    );
    format!("{peer} on {listener}")
}

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref()
        .map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// The log line of a target refusal.
pub fn describe(r: &Refusal, c: Option<&ConnInfo>) -> String {
    let host = match r.hostnqn.as_deref() {
        Some("") => "\"\" (empty)".to_string(),
        Some(h) => format!("{h:?}"),
        None => "-".to_string(),
    };
    let status = r
        .status
        .map_or_else(String::new, |s| format!(" (answered {s})"));
    format!(
        "refused {}: host {host}, subsystem {}, cntlid {}, qid {}: {}{status}",
        where_from(c),
        r.subnqn
            .as_deref()
            .map_or_else(|| "-".to_string(), |s| format!("{s:?}")),
        opt(&r.cntlid),
        opt(&r.qid),
        r.reason,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_n_lines_per_window_then_a_summary() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        let a: Source = (Some("10.0.0.1".parse().unwrap()), "x");
        let b: Source = (Some("10.0.0.2".parse().unwrap()), "x");
        let a_other: Source = (a.0, "y");
        let mut over = Vec::new();
        let admitted = (0..20)
            .filter(|i| l.admit(t0 + Duration::from_millis(*i), a, &mut over) == Admit::Log)
            .count();
        assert_eq!(admitted, LINES_PER_WINDOW as usize);
        // Another peer, or another reason from the same peer, has its own budget.
        assert_eq!(l.admit(t0, b, &mut over), Admit::Log);
        assert_eq!(l.admit(t0, a_other, &mut over), Admit::Log);
        assert!(over.is_empty());
        // The window ends: the next event logs and reports what was suppressed.
        assert_eq!(l.admit(t0 + WINDOW, a, &mut over), Admit::Log);
        assert_eq!(over, vec![Summary::Peer(a, 20 - LINES_PER_WINDOW as u64)]);
        // Expiry reports nothing for windows that suppressed nothing.
        over.clear();
        l.expire(t0 + 3 * WINDOW, &mut over);
        assert!(over.is_empty());
        assert_eq!(l.peers(), 0);
    }

    #[test]
    fn the_peer_table_is_bounded() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        let mut over = Vec::new();
        for i in 0..(MAX_PEERS as u32 + 100) {
            let ip = IpAddr::from(i.to_be_bytes());
            l.admit(
                t0 + Duration::from_micros(i as u64),
                (Some(ip), "x"),
                &mut over,
            );
            assert!(l.peers() <= MAX_PEERS);
        }
    }

    /// 2,000 peers with one refusal each in one window (the hostile-peer audit's flood of
    /// bad ICReqs from 2,000 addresses): the daemon-wide budget lets through its lines,
    /// and the rest is reported once the window is over.
    #[test]
    fn many_peers_together_get_the_daemon_wide_budget() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        let mut over = Vec::new();
        let admitted = (0..2000u32)
            .filter(|&i| {
                let src = (Some(IpAddr::from((0x0a00_0000 + i).to_be_bytes())), "x");
                l.admit(t0 + Duration::from_micros(i.into()), src, &mut over) == Admit::Log
            })
            .count();
        assert_eq!(admitted, GLOBAL_LINES_PER_WINDOW as usize);
        assert!(over.is_empty());
        // Another reason has its own daemon-wide budget: one kind of flood does not hide
        // another.
        let other = (Some("10.9.9.8".parse().unwrap()), "y");
        assert_eq!(l.admit(t0, other, &mut over), Admit::Log);
        l.expire(t0 + WINDOW + Duration::from_millis(10), &mut over);
        assert!(
            over.contains(&Summary::AllPeers(
                "x",
                2000 - u64::from(GLOBAL_LINES_PER_WINDOW)
            )),
            "{over:?}"
        );
        // A new window has the whole budget again.
        let src = (Some("10.9.9.9".parse().unwrap()), "x");
        assert_eq!(l.admit(t0 + 2 * WINDOW, src, &mut over), Admit::Log);
    }

    #[test]
    fn counts_every_label_and_ignores_unknown_ones() {
        let log = RefusalLog::new();
        log.count("host_not_allowed");
        log.count("host_not_allowed");
        log.count(ICREQ_REJECTED);
        log.count("no_such_label");
        let c = log.counts();
        assert_eq!(c.len(), RefusalReason::LABELS.len() + ENGINE_LABELS.len());
        let get = |l: &str| c.iter().find(|(x, _)| *x == l).unwrap().1;
        assert_eq!(get("host_not_allowed"), 2);
        assert_eq!(get(ICREQ_REJECTED), 1);
        assert_eq!(get("keep_alive_expired"), 0);
    }

    #[test]
    fn describe_names_everything_known() {
        let r = Refusal {
            reason: RefusalReason::EmptyHostNqnNotAllowed,
            key: 1,
            hostnqn: Some(String::new()),
            subnqn: Some("nqn.2026-11.dev.nvmf-target:x".into()),
            cntlid: Some(0xffff),
            qid: Some(0),
            status: Some(nvmf::spec::Status::CONNECT_INVALID_HOST),
        };
        let c = ConnInfo {
            peer: Some("127.0.0.1:5000".parse().unwrap()),
            listener: Some("tcp0".into()),
        };
        let line = describe(&r, Some(&c));
        for part in [
            "peer 127.0.0.1:5000",
            "listener tcp0",
            "host \"\" (empty)",
            "nqn.2026-11.dev.nvmf-target:x",
            "cntlid 65535",
            "qid 0",
            "spdk_nvme_perf",
            "sc 0x84",
        ] {
            assert!(line.contains(part), "{part:?} missing from {line}");
        }
    }
}
