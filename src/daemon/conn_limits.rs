//! Connection limits (`limits:` in the YAML): how many connections the daemon holds in
//! total, from one peer address, and before their Fabrics Connect, in all and from one
//! peer address. A connection over a limit is closed at once (TCP) or rejected (an RDMA
//! connect request), logged at warn with the peer (rate-limited like refusals) and counted
//! in `nvmft_limit_hits_total{limit="..."}`; nobody else's connection is touched.
//!
//! The per-peer limit on connections before Connect is what keeps one address from
//! holding the whole pre-Connect budget (silent connections, re-opened as the ICReq
//! deadline closes them) and so locking every other host out. Many addresses together
//! can still fill the budget; then the refusal names the address holding the most.
//!
//! Each admitted connection holds a [`ConnSlot`] from accept until its queue pair is
//! gone; dropping the slot gives its place back, whichever thread drops it (the main
//! thread when the connection never reached an IO thread, the IO thread otherwise).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::config::Limits;

/// Which connection limit refused a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnLimit {
    /// `limits.max_connections`.
    Total,
    /// `limits.max_connections_per_peer`.
    PerPeer,
    /// `limits.max_unconnected`: connections not yet past their Fabrics Connect.
    Unconnected,
    /// `limits.max_unconnected_per_peer`: connections from one peer address not yet past
    /// their Fabrics Connect.
    UnconnectedPerPeer,
}

impl ConnLimit {
    pub const ALL: [ConnLimit; 4] = [
        ConnLimit::Total,
        ConnLimit::PerPeer,
        ConnLimit::Unconnected,
        ConnLimit::UnconnectedPerPeer,
    ];

    /// Metric label and log reason.
    pub fn label(self) -> &'static str {
        match self {
            ConnLimit::Total => "connections",
            ConnLimit::PerPeer => "connections_per_peer",
            ConnLimit::Unconnected => "unconnected_connections",
            ConnLimit::UnconnectedPerPeer => "unconnected_connections_per_peer",
        }
    }

    fn index(self) -> usize {
        match self {
            ConnLimit::Total => 0,
            ConnLimit::PerPeer => 1,
            ConnLimit::Unconnected => 2,
            ConnLimit::UnconnectedPerPeer => 3,
        }
    }
}

/// What one peer address holds.
#[derive(Clone, Copy, Default)]
struct PeerCount {
    total: u32,
    unconnected: u32,
}

#[derive(Default)]
struct State {
    total: u32,
    unconnected: u32,
    /// Peers holding at least one connection.
    per_peer: HashMap<IpAddr, PeerCount>,
}

/// The daemon's connection accounting, shared by every thread.
pub(crate) struct ConnLimits {
    max_total: u32,
    max_per_peer: u32,
    max_unconnected: u32,
    max_unconnected_per_peer: u32,
    state: Mutex<State>,
    hits: [AtomicU64; 4],
}

impl ConnLimits {
    pub fn new(l: &Limits) -> ConnLimits {
        ConnLimits {
            max_total: l.max_connections,
            max_per_peer: l.max_connections_per_peer,
            max_unconnected: l.max_unconnected,
            max_unconnected_per_peer: l.max_unconnected_per_peer,
            state: Mutex::new(State::default()),
            hits: Default::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Plain counters: usable even if a thread panicked holding the lock.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for one more connection from `peer` (`None`: the address is not known,
    /// only the total and unconnected limits apply), or the limit it ran into (counted).
    /// A peer over one of its own limits is told so before a daemon-wide limit, so that
    /// the refusal names the limit that peer ran into.
    pub fn admit(self: &Arc<Self>, peer: Option<IpAddr>) -> Result<ConnSlot, ConnLimit> {
        let peer = peer.map(|p| p.to_canonical());
        let mut s = self.state();
        let mine = peer
            .and_then(|p| s.per_peer.get(&p).copied())
            .unwrap_or_default();
        let refused = if s.total >= self.max_total {
            Some(ConnLimit::Total)
        } else if mine.total >= self.max_per_peer {
            Some(ConnLimit::PerPeer)
        } else if mine.unconnected >= self.max_unconnected_per_peer {
            Some(ConnLimit::UnconnectedPerPeer)
        } else if s.unconnected >= self.max_unconnected {
            Some(ConnLimit::Unconnected)
        } else {
            None
        };
        if let Some(l) = refused {
            drop(s);
            self.hits[l.index()].fetch_add(1, Ordering::Relaxed);
            return Err(l);
        }
        s.total += 1;
        s.unconnected += 1;
        if let Some(p) = peer {
            let c = s.per_peer.entry(p).or_default();
            c.total += 1;
            c.unconnected += 1;
        }
        Ok(ConnSlot {
            limits: self.clone(),
            peer,
            connected: false,
        })
    }

    /// Hits of each limit: (label, count).
    pub fn hits(&self) -> Vec<(&'static str, u64)> {
        ConnLimit::ALL
            .iter()
            .map(|l| (l.label(), self.hits[l.index()].load(Ordering::Relaxed)))
            .collect()
    }

    /// (connections held, of which not yet past Connect, peer addresses).
    pub fn held(&self) -> (u32, u32, usize) {
        let s = self.state();
        (s.total, s.unconnected, s.per_peer.len())
    }

    /// `limits.max_unconnected_per_peer`.
    pub fn max_unconnected_per_peer(&self) -> u32 {
        self.max_unconnected_per_peer
    }

    /// The peer address holding the most connections not yet past Connect, and how
    /// many (for the line that refuses a connection over `max_unconnected`: it names the
    /// likely culprit, not only the peer refused). One pass over the peers, only when a
    /// refusal is logged.
    pub fn most_unconnected(&self) -> Option<(IpAddr, u32)> {
        self.most_by(|c| c.unconnected)
    }

    /// The peer address holding the most connections, and how many (for the line that
    /// refuses a connection over `max_connections`).
    pub fn most_connections(&self) -> Option<(IpAddr, u32)> {
        self.most_by(|c| c.total)
    }

    fn most_by(&self, count: impl Fn(&PeerCount) -> u32) -> Option<(IpAddr, u32)> {
        let s = self.state();
        s.per_peer
            .iter()
            .map(|(p, c)| (*p, count(c)))
            .filter(|&(_, n)| n > 0)
            // Ties go to the lower address, so the answer does not depend on hash order.
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
    }
}

/// One admitted connection's place (see the module docs).
pub(crate) struct ConnSlot {
    limits: Arc<ConnLimits>,
    peer: Option<IpAddr>,
    connected: bool,
}

impl ConnSlot {
    /// The connection's Fabrics Connect succeeded: it no longer counts as unconnected.
    pub fn connected(&mut self) {
        if !self.connected {
            self.connected = true;
            let mut s = self.limits.state();
            s.unconnected = s.unconnected.saturating_sub(1);
            if let Some(c) = self.peer.and_then(|p| s.per_peer.get_mut(&p)) {
                c.unconnected = c.unconnected.saturating_sub(1);
            }
        }
    }
}

impl std::fmt::Debug for ConnSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnSlot")
            .field("peer", &self.peer)
            .field("connected", &self.connected)
            .finish()
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut s = self.limits.state();
        s.total = s.total.saturating_sub(1);
        if !self.connected {
            s.unconnected = s.unconnected.saturating_sub(1);
        }
        if let Some(p) = self.peer {
            if let Some(c) = s.per_peer.get_mut(&p) {
                c.total = c.total.saturating_sub(1);
                if !self.connected {
                    c.unconnected = c.unconnected.saturating_sub(1);
                }
                if c.total == 0 {
                    s.per_peer.remove(&p);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: u32, per_peer: u32, unconnected: u32) -> Arc<ConnLimits> {
        limits_with(total, per_peer, unconnected, unconnected)
    }

    fn limits_with(
        total: u32,
        per_peer: u32,
        unconnected: u32,
        unconnected_per_peer: u32,
    ) -> Arc<ConnLimits> {
        Arc::new(ConnLimits::new(&Limits {
            max_connections: total,
            max_connections_per_peer: per_peer,
            max_unconnected: unconnected,
            max_unconnected_per_peer: unconnected_per_peer,
            ..Limits::default()
        }))
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().expect("ip"))
    }

    #[test]
    fn per_peer_limit_leaves_other_peers_alone() {
        let l = limits(10, 2, 10);
        let a1 = l.admit(ip("10.0.0.1")).expect("first");
        let _a2 = l.admit(ip("10.0.0.1")).expect("second");
        assert_eq!(l.admit(ip("10.0.0.1")).unwrap_err(), ConnLimit::PerPeer);
        // The same peer as an IPv4-mapped IPv6 address is the same peer.
        assert_eq!(
            l.admit(ip("::ffff:10.0.0.1")).unwrap_err(),
            ConnLimit::PerPeer
        );
        let _b = l.admit(ip("10.0.0.2")).expect("another peer");
        drop(a1);
        let _a3 = l.admit(ip("10.0.0.1")).expect("a place came back");
        assert_eq!(l.hits()[1], ("connections_per_peer", 2));
    }

    #[test]
    fn unconnected_limit_counts_only_connections_before_connect() {
        let l = limits(10, 10, 2);
        let mut a = l.admit(ip("10.0.0.1")).expect("a");
        let _b = l.admit(ip("10.0.0.2")).expect("b");
        assert_eq!(l.admit(ip("10.0.0.3")).unwrap_err(), ConnLimit::Unconnected);
        a.connected();
        a.connected(); // once only
        let _c = l.admit(ip("10.0.0.3")).expect("a is past Connect");
        assert_eq!(l.held(), (3, 2, 3));
        drop(a);
        assert_eq!(l.held(), (2, 2, 2));
    }

    #[test]
    fn total_limit_and_everything_given_back() {
        let l = limits(2, 10, 10);
        let mut slots: Vec<_> = (0..2).map(|_| l.admit(None).expect("slot")).collect();
        assert_eq!(l.admit(ip("10.0.0.9")).unwrap_err(), ConnLimit::Total);
        slots[0].connected();
        slots.clear();
        assert_eq!(l.held(), (0, 0, 0));
        assert_eq!(
            l.hits(),
            vec![
                ("connections", 1),
                ("connections_per_peer", 0),
                ("unconnected_connections", 0),
                ("unconnected_connections_per_peer", 0)
            ]
        );
    }

    #[test]
    fn one_peer_cannot_take_the_whole_unconnected_budget() {
        let l = limits_with(100, 50, 8, 3);
        let mut a: Vec<_> = (0..3)
            .map(|_| l.admit(ip("10.0.0.1")).expect("a"))
            .collect();
        assert_eq!(
            l.admit(ip("10.0.0.1")).unwrap_err(),
            ConnLimit::UnconnectedPerPeer
        );
        // The same peer as an IPv4-mapped IPv6 address is the same peer.
        assert_eq!(
            l.admit(ip("::ffff:10.0.0.1")).unwrap_err(),
            ConnLimit::UnconnectedPerPeer
        );
        // Another peer still gets in, up to its own share.
        let b: Vec<_> = (0..3)
            .map(|_| l.admit(ip("10.0.0.2")).expect("b"))
            .collect();
        // Past Connect, a connection no longer counts against the peer's share.
        a[0].connected();
        let _a4 = l.admit(ip("10.0.0.1")).expect("a's first is past Connect");
        // A connection whose peer is not known is held only to the global limits.
        let _n = l.admit(None).expect("unknown peer");
        assert_eq!(l.held(), (8, 7, 2));
        // The global budget (8) is full: the refusal names the peer holding the most.
        let _c = l.admit(ip("10.0.0.3")).expect("c");
        assert_eq!(l.admit(ip("10.0.0.4")).unwrap_err(), ConnLimit::Unconnected);
        assert_eq!(l.most_unconnected(), Some((ip("10.0.0.1").unwrap(), 3)));
        assert_eq!(l.most_connections(), Some((ip("10.0.0.1").unwrap(), 4)));
        drop(a);
        assert_eq!(l.most_unconnected(), Some((ip("10.0.0.2").unwrap(), 3)));
        drop(b);
        assert_eq!(l.hits()[3], ("unconnected_connections_per_peer", 2));
        assert_eq!(l.hits()[2], ("unconnected_connections", 1));
    }

    #[test]
    fn dropping_a_connected_slot_leaves_the_peers_unconnected_count() {
        let l = limits_with(10, 10, 10, 2);
        let mut a = l.admit(ip("10.0.0.1")).expect("a");
        let _b = l.admit(ip("10.0.0.1")).expect("b");
        a.connected();
        drop(a);
        let _c = l.admit(ip("10.0.0.1")).expect("a place came back");
        assert_eq!(
            l.admit(ip("10.0.0.1")).unwrap_err(),
            ConnLimit::UnconnectedPerPeer
        );
        assert_eq!(l.held(), (2, 2, 1));
    }
}
