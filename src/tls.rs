//! TLS for NVMe/TCP listeners: the PSK table the engine's TLS server reads, built from
//! the configuration (every host with a `tls_psk`, for every subsystem it may use and for
//! the discovery subsystem), and replaced whole on reload.

use crate::config::Config;
use nvmf::target::DISCOVERY_NQN;
use nvmf_tls::PskTable;

/// Every (identity -> TLS PSK) the configured hosts may present: for each host with a
/// PSK, each subsystem that lets it in, and the discovery subsystem; both identity
/// versions (the Linux host's tlshd offers the key's description, version 0 or 1).
pub fn psk_table(cfg: &Config) -> PskTable {
    let mut t = PskTable::default();
    for h in &cfg.hosts {
        let Some(psk) = &h.tls_psk else { continue };
        t.insert_configured_with(psk, &h.nqn, DISCOVERY_NQN, h.tls_derivation);
        for s in &cfg.subsystems {
            if s.allow_any_host || s.hosts.contains(&h.nqn) {
                t.insert_configured_with(psk, &h.nqn, &s.nqn, h.tls_derivation);
            }
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf::auth::tls::{ConfiguredPsk, TlsPsk};
    use nvmf::auth::HashId;

    #[test]
    fn table_covers_allowed_subsystems_and_discovery() {
        let psk = ConfiguredPsk::from_bytes(Some(HashId::Sha256), &[3; 32]).unwrap();
        let h = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
        let yaml = format!(
            "\
listeners:
  - {{name: l, transport: tcp, address: 127.0.0.1, port: 4420, tls: required}}
backends:
  - {{name: a, type: ram, size: 4M}}
  - {{name: b, type: ram, size: 4M}}
hosts:
  - nqn: {h}
    tls_psk: \"{}\"
  - nqn: nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002
subsystems:
  - nqn: nqn.2026-11.dev.example:open
    allow_any_host: true
    namespaces: [{{nsid: 1, backend: a}}]
  - nqn: nqn.2026-11.dev.example:closed
    hosts: [nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002]
    namespaces: [{{nsid: 1, backend: b}}]
",
            *psk.to_text()
        );
        let cfg = Config::parse(&yaml, "t.yaml").unwrap();
        let t = psk_table(&cfg);
        // (discovery + open) x (v1, v0); not the closed subsystem, no other host.
        assert_eq!(t.len(), 4);
        let retained = psk.retained(h);
        for sub in [DISCOVERY_NQN, "nqn.2026-11.dev.example:open"] {
            let v1 = TlsPsk::v1(HashId::Sha256, &retained, h, sub, false);
            let e = t.get(v1.identity.as_bytes()).unwrap();
            assert_eq!((e.hostnqn.as_str(), e.subnqn.as_str()), (h, sub));
        }
        let closed = TlsPsk::v0(
            HashId::Sha256,
            &retained,
            h,
            "nqn.2026-11.dev.example:closed",
        );
        assert!(t.get(closed.identity.as_bytes()).is_none());
    }
}
