//! Opening the configured backends.

use std::sync::Arc;
use std::time::Duration;

use backend::Backend;

use crate::config::{BackendConfig, BackendKind};

/// A backend that could not be opened: which one, what it is, why.
#[derive(Debug, thiserror::Error)]
#[error("backend {name}: {what}: {source}")]
pub(super) struct OpenError {
    name: String,
    what: String,
    #[source]
    source: backend::Error,
}

pub(super) fn open_backend(b: &BackendConfig) -> Result<Arc<dyn Backend>, OpenError> {
    let err = |what: String| {
        let name = b.name.clone();
        move |source| OpenError { name, what, source }
    };
    Ok(match &b.kind {
        BackendKind::Ram { size, block_size } => {
            backend::ram::RamBackend::new(*size, *block_size).map_err(err("RAM".into()))?
        }
        BackendKind::File {
            path,
            size,
            block_size,
            direct,
        } => backend::file::FileBackend::open(
            path,
            backend::file::FileOptions {
                create_size: *size,
                block_size: *block_size,
                direct: *direct,
            },
        )
        .map_err(err(path.display().to_string()))?,
        BackendKind::Nvme {
            pci,
            nsid,
            io_timeout_ms,
            sgl,
        } => {
            let mut opts = backend::NvmeOptions {
                nsid: *nsid,
                ..Default::default()
            };
            opts.driver.use_sgl = *sgl;
            if let Some(ms) = io_timeout_ms {
                opts.io_timeout = Duration::from_millis(*ms);
                opts.abort_timeout = opts.io_timeout.min(Duration::from_secs(2));
            }
            // Its SMART / Health log is read by the runtime's drive-health poller.
            backend::NvmeBackend::open_pci(pci, opts)
                .map_err(err(format!("nvme {pci} namespace {nsid}")))?
        }
    })
}
