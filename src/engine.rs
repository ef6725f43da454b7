//! The one place that names a concrete engine. `engine:` in the config picks it; the rest
//! of the daemon is written against `sta::Engine` and never sees which one runs.
//!
//! - `soft` (the default): `sta::soft`, the contract on host CPU cores, NVMe/TCP and
//!   NVMe/RDMA.
//! - `doca`: DOCA STA on a BlueField-3 DPA. Not in this binary yet (issue 12 brings it,
//!   over `doca-sys`); a config that asks for it is refused when it is checked
//!   (`EngineKind::unavailable`).

use std::path::PathBuf;

use crate::config::{Config, EngineKind};

/// Build the configured engine and run the daemon on it.
pub fn run(cfg: Config, config_path: Option<PathBuf>) -> anyhow::Result<()> {
    match cfg.engine {
        EngineKind::Soft => {
            let l = &cfg.limits;
            let soft = sta::soft::SoftConfig {
                limits: sta::EngineLimits {
                    icreq_timeout: l.icreq_timeout,
                    connect_timeout: l.connect_timeout,
                    host_data_timeout: l.host_data_timeout,
                    drain_timeout: l.drain_timeout,
                    connection_buffer_bytes: usize::try_from(l.connection_buffer)
                        .unwrap_or(usize::MAX),
                },
                ..sta::soft::SoftConfig::with_max_io_size(cfg.max_io_size)
            };
            let engine = sta::soft::Sta::new(soft);
            crate::daemon::run(engine, cfg, config_path)
        }
        EngineKind::Doca => anyhow::bail!(
            "engine: doca: {}",
            EngineKind::Doca.unavailable().unwrap_or("unavailable")
        ),
    }
}

/// An engine for the daemon's unit tests (metrics, watchdog): the default one.
#[cfg(test)]
pub fn for_tests() -> sta::soft::Sta {
    sta::soft::Sta::new(sta::soft::SoftConfig::default())
}
