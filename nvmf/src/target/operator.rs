//! What an operator may do to a running target beyond configuration: tear down
//! controllers on request (the control socket's `disconnect`).
//!
//! A disconnected controller is retired exactly as a keep-alive expiry retires one:
//! every queue comes back as an [`Action::Disconnect`], held AERs are dropped with the
//! admin queue, and commands that still arrive get no answer. No AEN is sent: the host
//! learns by losing its connections, which is what Linux nvmet does when its
//! controller is torn down, and the Linux host answers that with error recovery and a
//! reconnect (after `reconnect_delay`, 10 s by default), as it would after a network
//! outage. The subsystem and the host's access are unchanged, so the reconnect succeeds.

use super::{Action, Target};

/// One controller an operator's disconnect retired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disconnected {
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
    /// Queues asked to disconnect (admin queue included).
    pub queues: usize,
}

impl Target {
    /// Retires every live controller of host `hostnqn` (discovery controllers included).
    /// Returns what was retired and the queue actions to route.
    pub fn disconnect_host(&mut self, hostnqn: &str) -> (Vec<Disconnected>, Vec<Action>) {
        self.disconnect_where(|_, _, host| host == hostnqn)
    }

    /// Retires controller `cntlid` if it belongs to subsystem `subnqn` (the discovery
    /// NQN names discovery controllers).
    pub fn disconnect_controller(
        &mut self,
        subnqn: &str,
        cntlid: u16,
    ) -> (Vec<Disconnected>, Vec<Action>) {
        self.disconnect_where(|id, sub, _| id == cntlid && sub == subnqn)
    }

    fn disconnect_where(
        &mut self,
        pred: impl Fn(u16, &str, &str) -> bool,
    ) -> (Vec<Disconnected>, Vec<Action>) {
        let gone: Vec<Disconnected> = self
            .controllers
            .values()
            .filter(|c| !c.retired && pred(c.cntlid, &c.subnqn, &c.hostnqn))
            .map(|c| Disconnected {
                cntlid: c.cntlid,
                subnqn: c.subnqn.clone(),
                hostnqn: c.hostnqn.clone(),
                queues: 1 + c.io_queues.len(),
            })
            .collect();
        let ids: Vec<u16> = gone.iter().map(|d| d.cntlid).collect();
        self.retire_controllers_where(|c| ids.contains(&c.cntlid));
        (gone, self.take_actions())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::fabrics::{ConnectCommand, ConnectData};
    use crate::target::{QueueOrigin, SubsystemConfig, TargetOptions};
    use std::time::Instant;
    use zerocopy::IntoBytes;

    const NQN: &str = "nqn.2026-11.dev.nvmf-target:op";
    const H1: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000a1";
    const H2: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000a2";

    fn connect(t: &mut Target, key: u64, host: &str) -> u16 {
        let sqe = ConnectCommand {
            recfmt: 0,
            qid: 0,
            sqsize: 31,
            cattr: 0,
            kato: 0,
        }
        .to_sqe(1);
        let data = ConnectData::new([key as u8; 16], 0xffff, NQN, host);
        let (cqe, ok) = t.connect(
            Instant::now(),
            key,
            &QueueOrigin::default(),
            &sqe,
            data.as_bytes(),
        );
        assert!(cqe.status().is_success(), "{}", cqe.status());
        ok.expect("connected").cntlid
    }

    fn target() -> Target {
        let mut t = Target::new(TargetOptions::default());
        t.add_subsystem(SubsystemConfig {
            nqn: NQN.into(),
            serial: "s".into(),
            model: "m".into(),
            allow_any_host: true,
            hosts: Vec::new(),
            listeners: None,
        })
        .unwrap();
        t
    }

    #[test]
    fn disconnect_host_retires_only_that_hosts_controllers() {
        let mut t = target();
        let a = connect(&mut t, 1, H1);
        let b = connect(&mut t, 2, H2);
        let (gone, actions) = t.disconnect_host(H1);
        assert_eq!(gone.len(), 1);
        assert_eq!((gone[0].cntlid, gone[0].queues), (a, 1));
        assert!(matches!(
            actions.as_slice(),
            [Action::Disconnect { key: 1, .. }]
        ));
        let r = t.report();
        let ca = r.controllers.iter().find(|c| c.cntlid == a).unwrap();
        let cb = r.controllers.iter().find(|c| c.cntlid == b).unwrap();
        assert!(ca.retired && !cb.retired);
        // Asking again finds nothing left to retire.
        assert!(t.disconnect_host(H1).0.is_empty());
    }

    #[test]
    fn disconnect_controller_needs_the_right_subsystem() {
        let mut t = target();
        let a = connect(&mut t, 1, H1);
        assert!(t.disconnect_controller("nqn.other:x", a).0.is_empty());
        assert!(t.disconnect_controller(NQN, a.wrapping_add(1)).0.is_empty());
        let (gone, actions) = t.disconnect_controller(NQN, a);
        assert_eq!(gone[0].hostnqn, H1);
        assert_eq!(actions.len(), 1);
    }
}
