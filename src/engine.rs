//! The one place that names a concrete engine. `engine:` in the config picks it; the rest
//! of the daemon is written against `sta::Engine` and never sees which one runs.
//!
//! - `soft` (the default): `sta::soft`, the contract on host CPU cores, NVMe/TCP and
//!   NVMe/RDMA.
//! - `doca`: `sta::doca`, DOCA STA on a BlueField-3 DPA, NVMe/RDMA only. Built in by
//!   default (cargo feature `doca`): DOCA is loaded at run time, so the same binary runs
//!   without it and says what is missing only when the config asks for it.

use std::path::PathBuf;

use crate::config::{Config, EngineKind};

/// Build the configured engine and run the daemon on it.
pub fn run(cfg: Config, text: String, config_path: Option<PathBuf>) -> anyhow::Result<()> {
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
            crate::daemon::run(engine, cfg, text, config_path)
        }
        #[cfg(feature = "doca")]
        EngineKind::Doca => {
            let engine = doca_engine(&cfg)?;
            crate::daemon::run(engine, cfg, text, config_path)
        }
        #[cfg(not(feature = "doca"))]
        EngineKind::Doca => anyhow::bail!(
            "engine: doca: {}",
            EngineKind::Doca.unavailable().unwrap_or("unavailable")
        ),
    }
}

/// The doca engine for `cfg`: the library (its search path named when it is missing),
/// then devices and the main context (the failing DOCA call named, with DOCA's reason).
#[cfg(feature = "doca")]
pub fn doca_engine(cfg: &Config) -> anyhow::Result<sta::doca::Sta> {
    let Some(s) = &cfg.doca else {
        anyhow::bail!("engine: doca needs a `doca:` section (the config check requires it)");
    };
    let lib = sta::doca::library().map_err(|e| anyhow::anyhow!("engine: doca: {e}"))?;
    tracing::info!(
        "doca: loaded {:?}{}",
        lib.paths(),
        if lib.is_double() {
            " (the workspace's DOCA test double, not NVIDIA's library)"
        } else {
            ""
        }
    );
    let net: Vec<&str> = s.net_devices.iter().map(String::as_str).collect();
    let mut dc = sta::doca::DocaConfig::new(&s.sta_device, &net);
    dc.io_contexts = u16::try_from(cfg.threads.count()).unwrap_or(u16::MAX);
    dc.max_io_size = cfg.max_io_size;
    dc.be_queue_entries = s.be_queue_entries;
    sta::doca::Sta::new(dc).map_err(|e| anyhow::anyhow!("engine: doca: {e}"))
}

/// An engine for the daemon's unit tests (metrics, watchdog): the default one.
#[cfg(test)]
pub fn for_tests() -> sta::soft::Sta {
    sta::soft::Sta::new(sta::soft::SoftConfig::default())
}
