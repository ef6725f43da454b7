//! Opening the configured backends.

use std::sync::Arc;
use std::time::Duration;

use backend::Backend;

use crate::config::{BackendConfig, BackendKind};
use crate::startup_checks::{gib, memory_and_swap};

/// A backend that could not be opened: which one, what it is (unless the backend's own
/// error already says it), why.
#[derive(Debug, thiserror::Error)]
pub(super) struct OpenError {
    name: String,
    what: Option<String>,
    #[source]
    source: backend::Error,
}

impl OpenError {
    /// The backend's own error.
    pub(super) fn cause(&self) -> &backend::Error {
        &self.source
    }
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "backend {}: ", self.name)?;
        if let Some(what) = &self.what {
            write!(f, "{what}: ")?;
        }
        write!(f, "{}", self.source)
    }
}

/// Memory is taken as a RAM namespace's blocks are written: one larger than the machine
/// could ever hold would end, once hosts filled it, with the daemon killed for everyone.
/// Such a size is a typo (TiB for GiB), refused (at open, and when a reload grows one).
pub(super) fn ram_size_fits(size: u64) -> Result<(), backend::Error> {
    match memory_and_swap().filter(|&m| size > m) {
        Some(limit) => Err(backend::Error::Invalid(format!(
            "{} is more than this machine's memory and swap together ({})",
            gib(size),
            gib(limit)
        ))),
        None => Ok(()),
    }
}

/// Grows backend `name` in place ([`Backend::grow`]) to what `kind`, its definition in
/// the file, asks for when `resize` (a reload changed its size), else to what its
/// storage holds now (a file or device grown on disk). The capacity in blocks before
/// and after.
pub(super) fn grow_backend(
    name: &str,
    be: &dyn Backend,
    kind: &BackendKind,
    resize: bool,
) -> Result<(u64, u64), OpenError> {
    let err = |source| OpenError {
        name: name.to_string(),
        what: Some("cannot grow".into()),
        source,
    };
    let to = match kind {
        BackendKind::Ram { size, .. } if resize => {
            ram_size_fits(*size).map_err(err)?;
            Some(*size)
        }
        BackendKind::File { size, .. } if resize => *size,
        _ => None,
    };
    let before = be.num_blocks();
    let after = be.grow(to).map_err(err)?;
    Ok((before, after))
}

pub(super) fn open_backend(b: &BackendConfig) -> Result<Arc<dyn Backend>, OpenError> {
    let err = |what: Option<String>| {
        let name = b.name.clone();
        move |source| OpenError { name, what, source }
    };
    Ok(match &b.kind {
        BackendKind::Ram { size, block_size } => {
            ram_size_fits(*size).map_err(err(Some("RAM".into())))?;
            backend::ram::RamBackend::new(*size, *block_size).map_err(err(Some("RAM".into())))?
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
        // Every error of the file backend starts with the path already.
        .map_err(err(None))?,
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
                .map_err(err(Some(format!("nvme {pci} namespace {nsid}"))))?
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_cannot_be_opened_is_named_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("missing").join("x.img");
        let b = BackendConfig {
            name: "f0".into(),
            kind: BackendKind::File {
                path: path.clone(),
                size: Some(1 << 20),
                block_size: None,
                direct: None,
            },
        };
        let msg = open_backend(&b).expect_err("no such directory").to_string();
        let shown = path.display().to_string();
        assert_eq!(msg.matches(&shown).count(), 1, "{msg}");
        assert!(msg.starts_with(&format!("backend f0: {shown}: ")), "{msg}");
    }

    /// A RAM backend larger than memory and swap together is refused, saying both sizes;
    /// one that fits opens.
    #[test]
    fn a_ram_backend_larger_than_the_machine_is_refused() {
        let ram = |size: u64| BackendConfig {
            name: "r0".into(),
            kind: BackendKind::Ram {
                size,
                block_size: 512,
            },
        };
        let limit = memory_and_swap().expect("/proc/meminfo");
        let msg = open_backend(&ram(64 << 40))
            .expect_err("64 TiB")
            .to_string();
        assert!(
            msg.starts_with("backend r0: RAM: 64.0 TiB is more than this machine's memory"),
            "{msg}"
        );
        assert!(msg.contains(&gib(limit)), "{msg}");
        assert!(open_backend(&ram(1 << 20)).is_ok());
    }
}
