//! What the configuration says about who may do what, turned into the target's terms:
//! host credentials and `require_auth` (DH-HMAC-CHAP), ANA groups per listener,
//! discovery referrals, and the reservation state file (PTPL) read at start-up.

use nvmf::target::{AnaGroup, AnaState, PersistedReservation, Referral, Transport};

use super::listeners::listener_info;
use super::shared::Shared;
use crate::config::{
    AnaGroupConfig, AnaStateName, Config, ListenerConfig, ReferralConfig, TransportKind,
};
use crate::ptpl::PtplStore;

/// Host credentials and `require_auth` into the target (start-up and reload). The secrets
/// were read and checked when the config was loaded.
pub(super) fn apply_auth(shared: &Shared, cfg: &Config) {
    let creds: Vec<(String, nvmf::target::HostCredentials)> = cfg
        .hosts
        .iter()
        .filter_map(|h| {
            let d = h.dhchap.as_ref()?;
            Some((
                h.nqn.clone(),
                nvmf::target::HostCredentials {
                    secrets: nvmf::auth::ctrl::Secrets {
                        host: d.secret.clone(),
                        ctrl: d.ctrl_secret.clone(),
                    },
                    policy: nvmf::auth::ctrl::Policy {
                        hashes: d.hashes.clone(),
                        dhgroups: d.dhgroups.clone(),
                    },
                },
            ))
        })
        .collect();
    let n = creds.len();
    let mut t = shared.target();
    t.set_host_credentials(creds);
    for s in &cfg.subsystems {
        t.set_subsystem_auth_required(&s.nqn, s.require_auth);
    }
    drop(t);
    tracing::info!("DH-HMAC-CHAP: {n} host(s) with secrets");
}

/// The TLS PSK table follows hosts and subsystems (who may use which subsystem); it is
/// small, so it is simply rebuilt on every apply. Generated PSKs do not survive a reload:
/// the host authenticates again.
pub(super) fn rebuild_psk_table(shared: &Shared, cfg: &Config) {
    let table = crate::tls::psk_table(cfg);
    let n = table.len();
    *shared.psk.write().unwrap_or_else(|e| e.into_inner()) = table;
    if n > 0 {
        tracing::info!("TLS: {n} PSK identities");
    }
}

fn ana_state(s: AnaStateName) -> AnaState {
    match s {
        AnaStateName::Optimized => AnaState::Optimized,
        AnaStateName::NonOptimized => AnaState::NonOptimized,
        AnaStateName::Inaccessible => AnaState::Inaccessible,
        AnaStateName::PersistentLoss => AnaState::PersistentLoss,
        AnaStateName::Change => AnaState::Change,
    }
}

/// A subsystem's ANA groups with their states per listener (listeners named by the
/// config, known to be in `cfg`).
pub(super) fn ana_groups(groups: &[AnaGroupConfig], listeners: &[ListenerConfig]) -> Vec<AnaGroup> {
    groups
        .iter()
        .map(|g| AnaGroup {
            id: g.id,
            states: g
                .states
                .iter()
                .filter_map(|(name, st)| {
                    let l = listeners.iter().find(|l| l.name == *name)?;
                    Some((listener_info(l), ana_state(*st)))
                })
                .collect(),
        })
        .collect()
}

/// Discovery referrals in the target's terms.
pub(super) fn referrals(refs: &[ReferralConfig]) -> Vec<Referral> {
    refs.iter()
        .map(|r| Referral {
            transport: match r.transport {
                TransportKind::Tcp => Transport::Tcp,
                TransportKind::Rdma => Transport::Rdma,
            },
            addr: r.address,
            port: r.port,
        })
        .collect()
}

/// The reservation state file, if reservations can persist, and what it holds.
///
/// Reservations persist (PTPL) when there is a state file the daemon can write; with the
/// embedded default, or a directory it may not write (ProtectSystem=strict makes /etc
/// read-only: point reservations.state_file at /var/lib/nvmf-target), hosts are told
/// PTPL is not supported rather than promised something a restart would lose.
pub(super) fn open_ptpl(
    cfg: &Config,
) -> anyhow::Result<(Option<PtplStore>, Vec<PersistedReservation>)> {
    let store = match &cfg.reservations.state_file {
        None => None,
        Some(path) => {
            let store = PtplStore::new(path.clone());
            match store.probe() {
                Ok(()) => Some(store),
                Err(e) => {
                    tracing::warn!(
                        "reservations: cannot write next to {} ({e}); reservations will not \
                         persist through restarts (set reservations.state_file to a writable \
                         place, e.g. /var/lib/nvmf-target/reservations.ptpl)",
                        path.display()
                    );
                    None
                }
            }
        }
    };
    let persisted = match &store {
        Some(s) => s
            .load(cfg.reservations.if_missing, cfg.reservations.if_corrupt)
            .map_err(|e| anyhow::anyhow!(e))?,
        None => Vec::new(),
    };
    Ok((store, persisted))
}
