//! Connection limits (`limits:` in the YAML): how many connections the daemon holds in
//! total, from one peer address, and before their Fabrics Connect. A connection over a
//! limit is closed at once (TCP) or rejected (an RDMA connect request), logged at warn
//! with the peer (rate-limited like refusals) and counted in
//! `nvmft_limit_hits_total{limit="..."}`; nobody else's connection is touched.
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
}

impl ConnLimit {
    pub const ALL: [ConnLimit; 3] = [ConnLimit::Total, ConnLimit::PerPeer, ConnLimit::Unconnected];

    /// Metric label and log reason.
    pub fn label(self) -> &'static str {
        match self {
            ConnLimit::Total => "connections",
            ConnLimit::PerPeer => "connections_per_peer",
            ConnLimit::Unconnected => "unconnected_connections",
        }
    }

    fn index(self) -> usize {
        match self {
            ConnLimit::Total => 0,
            ConnLimit::PerPeer => 1,
            ConnLimit::Unconnected => 2,
        }
    }
}

#[derive(Default)]
struct State {
    total: u32,
    unconnected: u32,
    per_peer: HashMap<IpAddr, u32>,
}

/// The daemon's connection accounting, shared by every thread.
pub(crate) struct ConnLimits {
    max_total: u32,
    max_per_peer: u32,
    max_unconnected: u32,
    state: Mutex<State>,
    hits: [AtomicU64; 3],
}

impl ConnLimits {
    pub fn new(l: &Limits) -> ConnLimits {
        ConnLimits {
            max_total: l.max_connections,
            max_per_peer: l.max_connections_per_peer,
            max_unconnected: l.max_unconnected,
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
    pub fn admit(self: &Arc<Self>, peer: Option<IpAddr>) -> Result<ConnSlot, ConnLimit> {
        let peer = peer.map(|p| p.to_canonical());
        let mut s = self.state();
        let refused = if s.total >= self.max_total {
            Some(ConnLimit::Total)
        } else if s.unconnected >= self.max_unconnected {
            Some(ConnLimit::Unconnected)
        } else if peer
            .is_some_and(|p| s.per_peer.get(&p).copied().unwrap_or(0) >= self.max_per_peer)
        {
            Some(ConnLimit::PerPeer)
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
            *s.per_peer.entry(p).or_default() += 1;
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
            if let Some(n) = s.per_peer.get_mut(&p) {
                *n -= 1;
                if *n == 0 {
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
        Arc::new(ConnLimits::new(&Limits {
            max_connections: total,
            max_connections_per_peer: per_peer,
            max_unconnected: unconnected,
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
                ("unconnected_connections", 0)
            ]
        );
    }
}
