//! Asymmetric Namespace Access (NVMe Base 2.0 section 8.1): ANA groups, their state on
//! each listener (a listener is one NVM subsystem port; a controller's state is that of
//! the port its admin queue came in on), and the ANA log page (LID 0Ch, section 5.16.1.13).
//!
//! ANA reporting is always on, as Linux nvmet has it: without configuration every
//! namespace is in group 1 and group 1 is optimized on every listener, so hosts with
//! native multipath find the paths they expect. Configured groups give a state per
//! listener; a listener a group does not name is optimized.
//!
//! Change counts: the subsystem keeps one ANA change count (the log header's CHGCNT),
//! bumped whenever a group's state changes on any listener; a group descriptor's CHGCNT
//! is the count at that group's last change (nvmet reports the same global value in
//! both). Counts skip 0 when they wrap.

use super::ListenerInfo;
use crate::spec::Status;
use std::collections::BTreeMap;

/// Highest ANA group ID (ANAGRPMAX) and the number of groups (NANAGRPID), nvmet's 128.
/// The Linux host sizes its ANA log buffer as 16 + NANAGRPID * 32 + MNAN * 4 bytes and
/// disables ANA if that exceeds MDTS; 128 groups and 1024 namespaces make 8208 bytes.
pub const ANAGRPMAX: u32 = 128;
/// ANA Transition Time in seconds (ANATT), nvmet's and SPDK's 10. The Linux host resets
/// a controller whose groups stay in the Change state longer than twice this.
pub const ANATT_SECONDS: u8 = 10;
/// The group of namespaces that name none.
pub const DEFAULT_GROUP: u32 = 1;

/// ANA states (NVMe Base 2.0 Figure 227).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AnaState {
    Optimized = 0x1,
    NonOptimized = 0x2,
    Inaccessible = 0x3,
    PersistentLoss = 0x4,
    Change = 0xf,
}

impl AnaState {
    /// The status an I/O command gets on a path in this state, `None` where it runs.
    /// SCT 3h without DNR: the Linux host fails over and re-reads the ANA log.
    pub fn io_status(self) -> Option<Status> {
        match self {
            AnaState::Optimized | AnaState::NonOptimized => None,
            AnaState::Inaccessible => Some(Status::ANA_INACCESSIBLE),
            AnaState::PersistentLoss => Some(Status::ANA_PERSISTENT_LOSS),
            AnaState::Change => Some(Status::ANA_TRANSITION),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non_optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent_loss",
            AnaState::Change => "change",
        }
    }
}

/// One configured ANA group: its state on the listeners it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnaGroup {
    pub id: u32,
    pub states: Vec<(ListenerInfo, AnaState)>,
}

#[derive(Clone, Debug, Default)]
struct GroupState {
    states: Vec<(ListenerInfo, AnaState)>,
    chgcnt: u64,
}

/// The ANA groups of one subsystem.
#[derive(Clone, Debug, Default)]
pub(super) struct AnaTable {
    groups: BTreeMap<u32, GroupState>,
    chgcnt: u64,
}

impl AnaTable {
    /// The state of group `grpid` on `listener` (`None`: the queue's listener is not
    /// known, which only in-process tests produce).
    pub(super) fn state(&self, grpid: u32, listener: Option<&ListenerInfo>) -> AnaState {
        let Some(l) = listener else {
            return AnaState::Optimized;
        };
        self.groups
            .get(&grpid)
            .and_then(|g| g.states.iter().find(|(x, _)| x == l))
            .map_or(AnaState::Optimized, |(_, s)| *s)
    }

    pub(super) fn chgcnt(&self) -> u64 {
        self.chgcnt
    }

    pub(super) fn group_chgcnt(&self, grpid: u32) -> u64 {
        self.groups.get(&grpid).map_or(0, |g| g.chgcnt)
    }

    fn bump(&mut self) -> u64 {
        self.chgcnt = self.chgcnt.wrapping_add(1).max(1);
        self.chgcnt
    }

    /// Namespaces moved between `groups`: their descriptors in the ANA log changed, so
    /// each gets a new change count.
    pub(super) fn members_changed(&mut self, groups: &[u32]) {
        let c = self.bump();
        for g in groups {
            self.groups.entry(*g).or_default().chgcnt = c;
        }
    }

    /// Replaces the configuration; returns the listeners on which some group's state
    /// changed (their controllers get an ANA Change event), with the groups that changed.
    pub(super) fn set(&mut self, groups: &[AnaGroup]) -> Vec<(ListenerInfo, u32)> {
        let mut changed: Vec<(ListenerInfo, u32)> = Vec::new();
        let mut ids: Vec<u32> = self.groups.keys().copied().collect();
        ids.extend(groups.iter().map(|g| g.id));
        ids.sort_unstable();
        ids.dedup();
        let mut listeners: Vec<ListenerInfo> = Vec::new();
        for g in self.groups.values() {
            listeners.extend(g.states.iter().map(|(l, _)| l.clone()));
        }
        for g in groups {
            listeners.extend(g.states.iter().map(|(l, _)| l.clone()));
        }
        let new: BTreeMap<u32, Vec<(ListenerInfo, AnaState)>> =
            groups.iter().map(|g| (g.id, g.states.clone())).collect();
        for id in ids {
            let new_states = new.get(&id).cloned().unwrap_or_default();
            let mut group_changed = false;
            for l in &listeners {
                let before = self.state(id, Some(l));
                let after = new_states
                    .iter()
                    .find(|(x, _)| x == l)
                    .map_or(AnaState::Optimized, |(_, s)| *s);
                if before != after && !changed.contains(&(l.clone(), id)) {
                    changed.push((l.clone(), id));
                    group_changed = true;
                }
            }
            let cnt = if group_changed {
                Some(self.bump())
            } else {
                None
            };
            let g = self.groups.entry(id).or_default();
            g.states = new_states;
            if let Some(c) = cnt {
                g.chgcnt = c;
            }
        }
        changed
    }
}

/// One group as one controller sees it, for [`log_page`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupDescriptor {
    pub grpid: u32,
    pub chgcnt: u64,
    pub state: AnaState,
    /// Ascending (the Linux host walks its namespace list and this one in step).
    pub nsids: Vec<u32>,
}

/// The ANA log page: a 16-byte header (CHGCNT, NGRPS) and a 32-byte descriptor per group
/// (ANAGRPID, NNSIDS, CHGCNT, ANAS) followed by its NSIDs; with `rgo` (Return Groups
/// Only, LSP bit 0) NNSIDS is 0 and no NSIDs follow.
pub fn log_page(chgcnt: u64, groups: &[GroupDescriptor], rgo: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + groups.len() * 32);
    out.extend_from_slice(&chgcnt.to_le_bytes());
    out.extend_from_slice(&(groups.len() as u16).to_le_bytes());
    out.extend_from_slice(&[0u8; 6]);
    for g in groups {
        let n = if rgo { 0 } else { g.nsids.len() as u32 };
        out.extend_from_slice(&g.grpid.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&g.chgcnt.to_le_bytes());
        out.push(g.state as u8);
        out.extend_from_slice(&[0u8; 15]);
        if !rgo {
            for id in &g.nsids {
                out.extend_from_slice(&id.to_le_bytes());
            }
        }
    }
    out
}
