//! The discovery log page (NVMe-oF 1.1 section 5.3, Figures 31-33) as one host sees it:
//! an NVMe subsystem entry (SUBTYPE 2) per (subsystem the host may use, listener that
//! exposes it) and a current discovery subsystem entry (SUBTYPE 3) per listener.

use super::{ListenerInfo, Subsystem, Transport, ADMIN_QUEUE_ENTRIES, DISCOVERY_NQN};
use crate::spec::fabrics::copy_nul_terminated;
use crate::spec::identify::copy_space_padded;
use crate::spec::log::{disc, DiscoveryLogEntry, DiscoveryLogHeader, RdmaTsas};
use std::collections::BTreeMap;
use std::net::IpAddr;
use zerocopy::IntoBytes;

fn entry(portid: u16, l: &ListenerInfo, subtype: u8, subnqn: &str) -> DiscoveryLogEntry {
    let mut e = DiscoveryLogEntry {
        trtype: match l.transport {
            Transport::Tcp => disc::TRTYPE_TCP,
            Transport::Rdma => disc::TRTYPE_RDMA,
        },
        adrfam: match l.addr {
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
    copy_space_padded(&mut e.traddr, &l.addr.to_string());
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
        e.tsas[0] = disc::TCP_SECTYPE_NONE;
    }
    e
}

/// The entries `hostnqn` may see, in a stable order.
pub(super) fn entries(
    listeners: &[(u16, ListenerInfo)],
    subsystems: &BTreeMap<String, Subsystem>,
    hostnqn: &str,
) -> Vec<DiscoveryLogEntry> {
    let mut out = Vec::new();
    for s in subsystems
        .values()
        .filter(|s| !s.is_discovery && s.allows(hostnqn))
    {
        for (portid, l) in listeners {
            if s.cfg.listeners.as_ref().is_none_or(|ls| ls.contains(l)) {
                out.push(entry(*portid, l, disc::SUBTYPE_NVME, &s.cfg.nqn));
            }
        }
    }
    for (portid, l) in listeners {
        out.push(entry(
            *portid,
            l,
            disc::SUBTYPE_CURRENT_DISCOVERY,
            DISCOVERY_NQN,
        ));
    }
    out
}

/// The whole log page: 1024-byte header then the entries.
pub(super) fn log_page(
    listeners: &[(u16, ListenerInfo)],
    subsystems: &BTreeMap<String, Subsystem>,
    genctr: u64,
    hostnqn: &str,
) -> Vec<u8> {
    let entries = entries(listeners, subsystems, hostnqn);
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
