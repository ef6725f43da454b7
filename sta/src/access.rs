//! Namespace access views: what the offloaded path must refuse on a namespace
//! (reservation conflicts, ANA path states, namespaces a host may not see). `nvmf::target`
//! decides it; the application pushes it as an immutable [`NamespaceAccess`] through the
//! main context's [`AccessPublisher`] (cloneable, usable from any thread, so an IO thread
//! that just ran a Reservation Acquire publishes before it completes the command). Each
//! I/O QP is told its [`AccessKey`] (host and listener) with
//! [`IoContext::qp_set_access`](crate::IoContext::qp_set_access).
//!
//! An engine checks every offloaded command against the view without a lock: an IO
//! context keeps its own copy and reloads it only when the namespace's epoch (one atomic
//! load per command) moved. DOCA STA has no such hook on the DPA: an engine that cannot
//! honour views says so in [`Caps::access_views`](crate::Caps::access_views), and the
//! daemon then must not offer reservations or non-optimized ANA states for the namespaces
//! it offloads there (the `doca` engine: its namespaces are offloaded whole, so the daemon
//! builds its target with `TargetOptions::reservations` off (RESCAP 0, ONCS bit 5 clear,
//! the reservation commands Invalid Opcode) and the config check refuses ANA groups).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use nvmf::target::{AccessKey, NamespaceAccess};

use crate::SubsysId;

/// One namespace's current access view and its epoch (bumped on every publish).
#[derive(Debug)]
pub(crate) struct AccessCell {
    pub epoch: AtomicU64,
    view: Mutex<Arc<NamespaceAccess>>,
}

impl AccessCell {
    pub(crate) fn new() -> AccessCell {
        AccessCell {
            epoch: AtomicU64::new(1),
            view: Mutex::new(Arc::new(NamespaceAccess::open())),
        }
    }
    /// The view now (a lock, taken only when the epoch moved).
    pub(crate) fn load(&self) -> Arc<NamespaceAccess> {
        self.view.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Access cells by (subsystem, nsid).
type AccessCells = std::collections::HashMap<(u32, u32), Arc<AccessCell>>;

/// Publishes namespace access views to every IO context (see the module docs). Cheap to
/// clone; `publish` takes a short lock, never one the data path takes per command.
#[derive(Clone, Default)]
pub struct AccessPublisher {
    cells: Arc<Mutex<AccessCells>>,
}

impl AccessPublisher {
    /// The cell of a namespace, created (open) if it has none yet.
    pub(crate) fn cell(&self, subsys: SubsysId, nsid: u32) -> Arc<AccessCell> {
        self.cells
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((subsys.0, nsid))
            .or_insert_with(|| Arc::new(AccessCell::new()))
            .clone()
    }

    pub(crate) fn forget(&self, subsys: SubsysId, nsid: u32) {
        self.cells
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(subsys.0, nsid));
    }

    /// From now on, every command an IO context takes for this namespace is checked
    /// against `view`. May be called before the namespace is added (the engine starts
    /// with it then).
    pub fn publish(&self, subsys: SubsysId, nsid: u32, view: Arc<NamespaceAccess>) {
        let cell = self.cell(subsys, nsid);
        *cell.view.lock().unwrap_or_else(|e| e.into_inner()) = view;
        cell.epoch.fetch_add(1, Ordering::Release);
    }
}
