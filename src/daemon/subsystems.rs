//! The subsystem registry: the one place a subsystem is added to, and removed from, both
//! the target (protocol: Connect, Identify, discovery) and the engine (data path: the
//! namespaces an I/O queue's commands are served from), and the one map between the two
//! names of a subsystem, its NQN and the engine's [`SubsysId`].

use std::collections::HashMap;
use std::sync::Mutex;

use nvmf::target::{Action, SubsystemConfig, TargetError};
use sta::{Engine, EngineError, SubsysId};

use super::shared::Shared;

/// NQN <-> engine id, for every subsystem registered with both.
#[derive(Default)]
pub(super) struct Subsystems {
    ids: Mutex<HashMap<String, SubsysId>>,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum RegisterError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
}

impl Subsystems {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, SubsysId>> {
        // Plain data: usable even if a thread panicked holding the lock.
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The engine's id of subsystem `nqn`.
    pub fn id(&self, nqn: &str) -> Option<SubsysId> {
        self.map().get(nqn).copied()
    }

    /// The NQN of engine subsystem `id` (or `#id` for one no longer registered), for logs.
    pub fn name(&self, id: SubsysId) -> String {
        self.map()
            .iter()
            .find(|(_, v)| **v == id)
            .map_or_else(|| format!("#{}", id.0), |(k, _)| k.clone())
    }

    /// Every registered subsystem.
    pub fn all(&self) -> Vec<(SubsysId, String)> {
        self.map()
            .iter()
            .map(|(nqn, id)| (*id, nqn.clone()))
            .collect()
    }
}

impl Shared {
    /// Register a subsystem with the target and the engine. If the engine refuses it, the
    /// target forgets it again: either both know it or neither does.
    pub fn add_subsystem<E: Engine>(
        &self,
        engine: &mut E,
        cfg: SubsystemConfig,
    ) -> Result<SubsysId, RegisterError> {
        let nqn = cfg.nqn.clone();
        self.target().add_subsystem(cfg)?;
        match engine.subsystem_create(&nqn) {
            Ok(id) => {
                self.subsystems.map().insert(nqn, id);
                Ok(id)
            }
            Err(e) => {
                // Nobody could connect in between: no controller to retire.
                let actions = self.target().remove_subsystem(&nqn);
                self.route(actions);
                Err(e.into())
            }
        }
    }

    /// Removal, first step: the target forgets the subsystem (Connects to it are refused)
    /// and retires its controllers; the returned actions disconnect their queues. The
    /// engine keeps serving its namespaces until they are removed.
    pub fn retire_subsystem(&self, nqn: &str) -> Vec<Action> {
        self.target().remove_subsystem(nqn)
    }

    /// Removal, second step (its namespaces' `ns_remove` tasks are submitted): the NQN
    /// no longer names the engine's subsystem, whose id is returned for the last step,
    /// `Engine::subsystem_destroy` once those tasks have completed (`Runtime`).
    pub fn forget_subsystem(&self, nqn: &str) -> Option<SubsysId> {
        self.subsystems.map().remove(nqn)
    }
}
