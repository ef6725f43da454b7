//! The namespace access view: what the offloaded data path must refuse on one namespace,
//! as an immutable value the target publishes and the engine reads without a lock.
//!
//! The target owns reservations, ANA states and per-host visibility; the engine runs
//! READ/WRITE/... itself and never asks the target. So whenever one of those changes, the
//! target builds a new [`NamespaceAccess`] for the namespace ([`Target::take_access_updates`](super::Target::take_access_updates))
//! and the daemon hands it to the engine's access publisher before the command that
//! changed it completes. The engine keeps, per QP, the [`AccessKey`] of the queue's
//! controller (its host and the listener it came in on) and calls
//! [`NamespaceAccess::check`] for every command: a namespace without reservations,
//! restrictions or unusual ANA states has an [`NamespaceAccess::is_open`] view, and the
//! check is one branch.
//!
//! Checks in the order nvmet and SPDK apply them: visibility (Invalid Namespace, as for a
//! namespace that does not exist), ANA state of the queue's listener (path status), then
//! the reservation (Reservation Conflict).

use super::ana::AnaState;
use super::reservation::{Access, Held, HostId, Reservations};
use crate::spec::Status;

/// Who is asking and over which path: fixed per queue at Connect.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AccessKey {
    /// The controller's Host Identifier (its admin Connect's HOSTID).
    pub host_id: HostId,
    /// The host NQN, interned by the target (for per-host visibility).
    pub host: u64,
    /// PORTID of the listener the queue came in on (0: not known).
    pub port: u16,
}

/// What one namespace allows, immutable once published.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceAccess {
    /// Hosts (interned NQNs) that may see it; `None`: every host of the subsystem.
    visible: Option<Vec<u64>>,
    /// Ports whose ANA state refuses I/O, with that state.
    ana: Vec<(u16, AnaState)>,
    /// The reservation, if one is held, and the registrants' Host Identifiers (sorted:
    /// every I/O under a reservation looks its host up).
    held: Option<Held>,
    registrants: Vec<HostId>,
    /// The namespace's storage is gone ([`super::Target::namespace_lost`]): every
    /// command is answered Internal Path Error, on every IO thread (one thread's backend
    /// error takes the namespace out for all of them, and a backend that works again
    /// must not serve a namespace the hosts were told is gone).
    lost: bool,
}

impl NamespaceAccess {
    /// A view that refuses nothing.
    pub fn open() -> NamespaceAccess {
        NamespaceAccess::default()
    }

    /// The view of a namespace whose storage is gone: it refuses everything.
    pub fn lost() -> NamespaceAccess {
        NamespaceAccess {
            lost: true,
            ..NamespaceAccess::default()
        }
    }

    /// Built by the target from its state.
    pub(super) fn new(
        visible: Option<Vec<u64>>,
        ana: Vec<(u16, AnaState)>,
        resv: Option<&Reservations>,
    ) -> NamespaceAccess {
        let mut visible = visible;
        if let Some(v) = visible.as_mut() {
            v.sort_unstable();
            v.dedup();
        }
        let ana = ana
            .into_iter()
            .filter(|(_, s)| s.io_status().is_some())
            .collect();
        let (held, registrants) = match resv {
            Some(r) if r.held.is_some() => {
                let mut ids: Vec<HostId> = r.registrants.iter().map(|x| x.host_id).collect();
                ids.sort_unstable();
                (r.held, ids)
            }
            _ => (None, Vec::new()),
        };
        NamespaceAccess {
            visible,
            ana,
            held,
            registrants,
            lost: false,
        }
    }

    /// Nothing to check: the engine may skip [`NamespaceAccess::check`].
    pub fn is_open(&self) -> bool {
        self.visible.is_none() && self.ana.is_empty() && self.held.is_none() && !self.lost
    }

    /// Whether the queue `key` may run a command of kind `access` on this namespace.
    /// `access` is `None` for commands outside both reservation command groups.
    #[inline]
    pub fn check(&self, key: &AccessKey, access: Option<Access>) -> Result<(), Status> {
        if self.is_open() {
            return Ok(());
        }
        if self.lost {
            return Err(Status::INTERNAL_PATH_ERROR);
        }
        if let Some(v) = &self.visible {
            if v.binary_search(&key.host).is_err() {
                return Err(Status::INVALID_NAMESPACE);
            }
        }
        if let Some((_, s)) = self.ana.iter().find(|(p, _)| *p == key.port) {
            if let Some(st) = s.io_status() {
                return Err(st);
            }
        }
        if let (Some(h), Some(access)) = (self.held, access) {
            let registrant = self.registrants.binary_search(&key.host_id).is_ok();
            let holder = if h.rtype.all_registrants() {
                registrant
            } else {
                h.holder == key.host_id
            };
            if !super::reservation::allowed(h.rtype, holder, registrant, access) {
                return Err(Status::RESERVATION_CONFLICT);
            }
        }
        Ok(())
    }
}

/// The reservation command group an I/O opcode belongs to (NVM Command Set 1.0 Figure
/// 14 opcodes): reads (Read, Compare, Verify), writes (Write, Write Zeroes, Dataset
/// Management, Write Uncorrectable, Copy, Flush), or neither.
pub fn access_of(opcode: u8) -> Option<Access> {
    use crate::spec::opcodes::io;
    match opcode {
        io::READ | io::COMPARE | io::VERIFY => Some(Access::Read),
        io::WRITE
        | io::WRITE_ZEROES
        | io::DATASET_MANAGEMENT
        | io::WRITE_UNCORRECTABLE
        | io::COPY
        | io::FLUSH => Some(Access::Write),
        _ => None,
    }
}
