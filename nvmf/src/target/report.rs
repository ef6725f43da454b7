//! A read-only snapshot of a [`Target`] for metrics and status pages: which subsystems,
//! namespaces and listeners exist and which controllers are connected.
//!
//! [`Target::report`] copies what it needs into plain values, so a caller that keeps the
//! target behind a mutex holds the lock only while the copy is made, never while it
//! formats or sends anything. Nothing here changes the target.
//!
//! What it does not report: I/O counters (the engine keeps those per thread, see
//! `sta::Stats`) and the transport of a queue (the target only knows the transport's
//! opaque [`QueueKey`]; the transport maps keys back to itself).

use super::{ListenerInfo, QueueKey, Target};

/// Everything [`Target::report`] copies out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetReport {
    /// Every subsystem, the discovery subsystem included, ordered by NQN.
    pub subsystems: Vec<SubsystemReport>,
    /// Live controllers, ordered by CNTLID.
    pub controllers: Vec<ControllerReport>,
    /// Listeners in the order they were added, with their discovery PORTID.
    pub listeners: Vec<(u16, ListenerInfo)>,
    /// The discovery log's generation counter (GENCTR).
    pub discovery_generation: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubsystemReport {
    pub nqn: String,
    pub is_discovery: bool,
    pub allow_any_host: bool,
    /// Hosts on the allow list.
    pub allowed_hosts: usize,
    /// Attached namespaces, ordered by NSID.
    pub namespaces: Vec<NamespaceReport>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceReport {
    pub nsid: u32,
    pub block_size: u32,
    pub num_blocks: u64,
}

impl NamespaceReport {
    /// Capacity in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.num_blocks.saturating_mul(self.block_size as u64)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerReport {
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
    pub is_discovery: bool,
    /// CC.EN = 1 and CSTS.RDY = 1.
    pub enabled: bool,
    /// The admin queue's transport key.
    pub admin_queue: QueueKey,
    /// Connected I/O queues: (QID, transport key), ordered by QID.
    pub io_queues: Vec<(u16, QueueKey)>,
    /// Commands this controller's slow path failed (the Error Information log's
    /// ERROR COUNT: it counts every entry ever recorded, not only the ones still kept).
    pub errors: u64,
    /// Keep-alive timeout the controller runs with, in milliseconds (0: none): the
    /// host's, rounded up to 100 ms, or a discovery controller's default when it set 0.
    pub kato_ms: u32,
    /// Retired by the target (subsystem or host removed, keep-alive expired): its queues
    /// are being disconnected.
    pub retired: bool,
}

impl ControllerReport {
    /// Admin queue plus I/O queues.
    pub fn queue_count(&self) -> usize {
        1 + self.io_queues.len()
    }
}

impl Target {
    /// A snapshot of the target's state (see the module docs).
    pub fn report(&self) -> TargetReport {
        TargetReport {
            subsystems: self
                .subsystems
                .values()
                .map(|s| SubsystemReport {
                    nqn: s.cfg.nqn.clone(),
                    is_discovery: s.is_discovery,
                    allow_any_host: s.cfg.allow_any_host,
                    allowed_hosts: s.cfg.hosts.len(),
                    namespaces: s
                        .namespaces
                        .values()
                        .map(|n| NamespaceReport {
                            nsid: n.nsid,
                            block_size: n.block_size,
                            num_blocks: n.num_blocks,
                        })
                        .collect(),
                })
                .collect(),
            controllers: self
                .controllers
                .values()
                .map(|c| ControllerReport {
                    cntlid: c.cntlid,
                    subnqn: c.subnqn.clone(),
                    hostnqn: c.hostnqn.clone(),
                    is_discovery: c.is_discovery,
                    enabled: c.enabled(),
                    admin_queue: c.admin_key,
                    io_queues: c.io_queues.iter().map(|(q, k)| (*q, *k)).collect(),
                    errors: c.error_count,
                    kato_ms: c.effective_kato_ms(&self.opts),
                    retired: c.retired,
                })
                .collect(),
            listeners: self.listeners.clone(),
            discovery_generation: self.genctr,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::fabrics::{ConnectCommand, ConnectData};
    use crate::target::{
        NamespaceConfig, SubsystemConfig, TargetOptions, Transport, DISCOVERY_NQN,
    };
    use std::time::Instant;
    use zerocopy::IntoBytes;

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000aa";

    fn connect(t: &mut Target, key: QueueKey, qid: u16, cntlid: u16, nqn: &str) -> u16 {
        let sqe = ConnectCommand {
            recfmt: 0,
            qid,
            sqsize: 31,
            cattr: 0,
            kato: 0,
        }
        .to_sqe(1);
        let data = ConnectData::new([9; 16], cntlid, nqn, HOST);
        let (cqe, ok) = t.connect(
            Instant::now(),
            key,
            &crate::target::QueueOrigin::default(),
            &sqe,
            data.as_bytes(),
        );
        assert!(cqe.status().is_success(), "connect: {}", cqe.status());
        ok.expect("connected").cntlid
    }

    #[test]
    fn report_lists_controllers_with_their_queues() {
        let mut t = Target::new(TargetOptions::default());
        let nqn = "nqn.2026-11.dev.nvmf-target:c";
        t.add_subsystem(SubsystemConfig {
            nqn: nqn.into(),
            serial: "c".into(),
            model: "m".into(),
            allow_any_host: true,
            hosts: Vec::new(),
            listeners: None,
        })
        .unwrap();
        let cntlid = connect(&mut t, 7, 0, 0xffff, nqn);
        let disc = connect(&mut t, 8, 0, 0xffff, DISCOVERY_NQN);
        let r = t.report();
        assert_eq!(r.controllers.len(), 2);
        let c = r.controllers.iter().find(|c| c.cntlid == cntlid).unwrap();
        assert_eq!((c.subnqn.as_str(), c.hostnqn.as_str()), (nqn, HOST));
        assert!(!c.is_discovery && !c.enabled);
        assert_eq!((c.admin_queue, c.queue_count()), (7, 1));
        let d = r.controllers.iter().find(|c| c.cntlid == disc).unwrap();
        assert!(d.is_discovery);
    }

    #[test]
    fn report_lists_subsystems_namespaces_and_listeners() {
        let mut t = Target::new(TargetOptions::default());
        let empty = t.report();
        assert_eq!(empty.subsystems.len(), 1);
        assert!(empty.subsystems[0].is_discovery);
        assert_eq!(empty.subsystems[0].nqn, DISCOVERY_NQN);
        assert!(empty.controllers.is_empty());

        t.add_listener(ListenerInfo {
            transport: Transport::Tcp,
            addr: "127.0.0.1".parse().unwrap(),
            port: 4420,
        });
        t.add_subsystem(SubsystemConfig {
            nqn: "nqn.2026-11.dev.nvmf-target:r".into(),
            serial: "r".into(),
            model: "m".into(),
            allow_any_host: false,
            hosts: vec!["nqn.2014-08.org.nvmexpress:uuid:1".into()],
            listeners: None,
        })
        .unwrap();
        t.add_namespace(
            "nqn.2026-11.dev.nvmf-target:r",
            NamespaceConfig {
                nsid: 3,
                block_size: 4096,
                num_blocks: 10,
                uuid: [1; 16],
                nguid: [2; 16],
                eui64: [3; 8],
                volatile_write_cache: false,
                anagrpid: 0,
                hosts: None,
            },
        )
        .unwrap();
        let r = t.report();
        assert_eq!(r.listeners.len(), 1);
        assert_eq!(r.listeners[0].1.port, 4420);
        assert!(r.discovery_generation > empty.discovery_generation);
        let s = r
            .subsystems
            .iter()
            .find(|s| s.nqn == "nqn.2026-11.dev.nvmf-target:r")
            .expect("the new subsystem");
        assert!(!s.is_discovery && !s.allow_any_host);
        assert_eq!(s.allowed_hosts, 1);
        assert_eq!(
            s.namespaces,
            vec![NamespaceReport {
                nsid: 3,
                block_size: 4096,
                num_blocks: 10
            }]
        );
        assert_eq!(s.namespaces[0].size_bytes(), 40960);
    }
}
