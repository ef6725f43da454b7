//! The discovery log page (NVMe-oF 1.1 section 5.3, Figures 31-33) as one host sees it:
//! an NVMe subsystem entry (SUBTYPE 2) per (subsystem the host may use, listener that
//! exposes it), a current discovery subsystem entry (SUBTYPE 3) per listener, and a
//! referral (SUBTYPE 1) per configured referral to another discovery service (SUBNQN the
//! well-known discovery NQN, PORTID 0: the referred service's port is not ours to know,
//! as nvmet's referrals carry the port ID the administrator gave them).
//!
//! A listener on a wildcard address (0.0.0.0, ::) cannot be published as such: a host
//! cannot connect to 0.0.0.0. Like Linux nvmet (which fills TRADDR of a wildcard port from
//! the discovery connection's own socket address), its entries carry the local address of
//! the connection the discovery host came in on, when the listener covers that address
//! (see [`ListenerInfo::covers`]); a wildcard listener that does not (an IPv4 wildcard
//! seen from an IPv6 connection) is left out, since no address of it is known to work.

use super::{
    ListenerInfo, ListenerTls, Referral, Subsystem, Transport, ADMIN_QUEUE_ENTRIES, DISCOVERY_NQN,
};
use crate::spec::fabrics::copy_nul_terminated;
use crate::spec::identify::copy_space_padded;
use crate::spec::log::{disc, DiscoveryLogEntry, DiscoveryLogHeader, RdmaTsas};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use zerocopy::IntoBytes;

/// The address to publish for listener `l` to a host that came in on `local`: the
/// listener's own, or for a wildcard listener the connection's local address.
fn published_addr(l: &ListenerInfo, local: Option<IpAddr>) -> Option<IpAddr> {
    if !l.addr.is_unspecified() {
        return Some(l.addr);
    }
    local
        .map(|a| a.to_canonical())
        .filter(|&a| !a.is_unspecified() && l.covers(a))
}

fn entry(
    portid: u16,
    l: &ListenerInfo,
    tls: ListenerTls,
    addr: IpAddr,
    subtype: u8,
    subnqn: &str,
) -> DiscoveryLogEntry {
    let mut e = DiscoveryLogEntry {
        trtype: match l.transport {
            Transport::Tcp => disc::TRTYPE_TCP,
            Transport::Rdma => disc::TRTYPE_RDMA,
        },
        adrfam: match addr {
            IpAddr::V4(_) => disc::ADRFAM_IPV4,
            IpAddr::V6(_) => disc::ADRFAM_IPV6,
        },
        subtype,
        treq: disc::TREQ_SECURE_CHANNEL_NOT_SPECIFIED | disc::TREQ_DISABLE_SQ_FLOW,
        portid: portid.into(),
        cntlid: 0xffffu16.into(),
        asqsz: ADMIN_QUEUE_ENTRIES.into(),
        ..Default::default()
    };
    if subtype == disc::SUBTYPE_CURRENT_DISCOVERY {
        // Every port returns the same log, and discovery controllers keep KATO and AENs.
        e.eflags = (disc::EFLAGS_DUPRETINFO | disc::EFLAGS_EPCSD).into();
    }
    copy_space_padded(&mut e.trsvcid, &l.port.to_string());
    copy_space_padded(&mut e.traddr, &addr.to_string());
    copy_nul_terminated(&mut e.subnqn, subnqn);
    if l.transport == Transport::Rdma {
        let tsas = RdmaTsas {
            qptype: disc::RDMA_QPTYPE_CONNECTED,
            prtype: disc::RDMA_PRTYPE_NOT_SPECIFIED,
            cms: disc::RDMA_CMS_RDMA_CM,
            ..Default::default()
        };
        e.tsas.copy_from_slice(tsas.as_bytes());
    } else {
        // TLS listeners: SECTYPE TLS 1.3 and whether the secure channel is required, as
        // nvmet publishes them. Plain listeners keep "not specified" (see the constant).
        e.tsas[0] = match tls {
            ListenerTls::None => disc::TCP_SECTYPE_NONE,
            ListenerTls::Optional | ListenerTls::Required => disc::TCP_SECTYPE_TLS13,
        };
        let secure = match tls {
            ListenerTls::None => disc::TREQ_SECURE_CHANNEL_NOT_SPECIFIED,
            ListenerTls::Optional => disc::TREQ_SECURE_CHANNEL_NOT_REQUIRED,
            ListenerTls::Required => disc::TREQ_SECURE_CHANNEL_REQUIRED,
        };
        e.treq = secure | disc::TREQ_DISABLE_SQ_FLOW;
    }
    e
}

/// The entries `hostnqn` may see, in a stable order; `local` is the local address of the
/// discovery connection (for wildcard listeners).
pub(super) fn entries(
    listeners: &[(u16, ListenerInfo)],
    tls: &HashMap<ListenerInfo, ListenerTls>,
    subsystems: &BTreeMap<String, Subsystem>,
    referrals: &[Referral],
    hostnqn: &str,
    local: Option<IpAddr>,
) -> Vec<DiscoveryLogEntry> {
    let mut out = Vec::new();
    let tls_of = |l: &ListenerInfo| tls.get(l).copied().unwrap_or_default();
    let published: Vec<(u16, &ListenerInfo, IpAddr)> = listeners
        .iter()
        .filter_map(|(p, l)| published_addr(l, local).map(|a| (*p, l, a)))
        .collect();
    for s in subsystems
        .values()
        .filter(|s| !s.is_discovery && s.allows(hostnqn))
    {
        for &(portid, l, addr) in &published {
            if s.cfg.listeners.as_ref().is_none_or(|ls| ls.contains(l)) {
                out.push(entry(
                    portid,
                    l,
                    tls_of(l),
                    addr,
                    disc::SUBTYPE_NVME,
                    &s.cfg.nqn,
                ));
            }
        }
    }
    for &(portid, l, addr) in &published {
        out.push(entry(
            portid,
            l,
            tls_of(l),
            addr,
            disc::SUBTYPE_CURRENT_DISCOVERY,
            DISCOVERY_NQN,
        ));
    }
    for r in referrals {
        let l = ListenerInfo {
            transport: r.transport,
            addr: r.addr,
            port: r.port,
        };
        // Whether the referred service wants TLS is not ours to know (the config does not
        // say): "not specified", as a plain listener of ours.
        let mut e = entry(
            0,
            &l,
            ListenerTls::None,
            r.addr,
            disc::SUBTYPE_REFERRAL,
            DISCOVERY_NQN,
        );
        e.eflags = 0.into();
        out.push(e);
    }
    out
}

/// The whole log page: 1024-byte header then the entries.
pub(super) fn log_page(
    listeners: &[(u16, ListenerInfo)],
    tls: &HashMap<ListenerInfo, ListenerTls>,
    subsystems: &BTreeMap<String, Subsystem>,
    referrals: &[Referral],
    genctr: u64,
    hostnqn: &str,
    local: Option<IpAddr>,
) -> Vec<u8> {
    let entries = entries(listeners, tls, subsystems, referrals, hostnqn, local);
    let header = DiscoveryLogHeader {
        genctr: genctr.into(),
        numrec: (entries.len() as u64).into(),
        recfmt: 0.into(),
        ..Default::default()
    };
    let mut page = Vec::with_capacity(1024 * (entries.len() + 1));
    page.extend_from_slice(header.as_bytes());
    for e in &entries {
        page.extend_from_slice(e.as_bytes());
    }
    page
}
