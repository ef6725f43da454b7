//! The main thread's side of the control socket (`crate::control`): the socket's thread
//! parses requests and hands them here; they are answered between two passes of the
//! main loop, with the runtime at hand, from the target's report, the engine's counters
//! and the daemon's own connection records. Nothing here runs on an IO thread or takes
//! a lock the data path takes (the target's lock is the slow path's, as for /metrics).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crossbeam_channel::{bounded, Receiver};
use nvmf::target::report::TargetReport;
use serde_json::Value;
use sta::Engine;

use super::runtime::Runtime;
use super::shared::{queue_key_of, thread_of};
use crate::control::protocol::{
    reply_err, reply_ok, AnaGroupInfo, AnaPathState, Command, ControllerInfo, ControllerIo,
    DisconnectTarget, Disconnected, DisconnectedController, IoThreadStatus, ListenerStatus,
    NamespaceInfo, QueueInfo, ReloadResult, RunningConfig, Status, SubsystemInfo,
};
use crate::control::server::{self, ControlRequest, ControlServer, MAX_CLIENTS};

/// The control socket as the main loop sees it.
pub(super) struct ControlHook {
    rx: Receiver<ControlRequest>,
    started: SystemTime,
    config_path: Option<PathBuf>,
    engine: &'static str,
    /// The text of the config file last loaded (for `--check-config --diff`).
    pub text: String,
    /// That file as loaded; [`Runtime::cfg`] is what runs of it.
    file: crate::config::Config,
    /// Held to keep serving; dropping it closes the socket.
    _server: Option<ControlServer>,
}

impl ControlHook {
    /// Binds the socket the config asks for (none when `control: {enabled: false}`).
    pub fn start(
        cfg: &crate::config::Config,
        config_path: Option<&Path>,
        text: String,
        engine: &'static str,
        started: SystemTime,
    ) -> anyhow::Result<ControlHook> {
        let (tx, rx) = bounded(MAX_CLIENTS);
        let server = match &cfg.control {
            Some(c) => server::start(c, tx)?,
            None => {
                tracing::info!("control socket disabled (control.enabled: false)");
                None
            }
        };
        Ok(ControlHook {
            rx,
            started,
            config_path: config_path.map(Path::to_path_buf),
            engine,
            text,
            file: cfg.clone(),
            _server: server,
        })
    }

    /// Answers every request waiting.
    pub fn serve_pending<E: Engine>(&mut self, rt: &mut Runtime<E>) {
        while let Ok(req) = self.rx.try_recv() {
            let line = match self.answer(rt, &req) {
                Ok(v) => reply_ok(v),
                Err(e) => reply_err(&e),
            };
            // The client thread may have given up (its deadline); nothing else waits.
            let _ = req.reply.send(line);
        }
    }

    fn answer<E: Engine>(
        &mut self,
        rt: &mut Runtime<E>,
        req: &ControlRequest,
    ) -> Result<Value, String> {
        let json = |v: Result<Value, serde_json::Error>| v.map_err(|e| format!("internal: {e}"));
        match &req.command {
            Command::Status => json(serde_json::to_value(self.status(rt))),
            Command::Subsystems => json(serde_json::to_value(subsystems(rt))),
            Command::Controllers => json(serde_json::to_value(controllers(rt))),
            Command::Disconnect(t) => json(serde_json::to_value(disconnect(rt, t, &req.peer)?)),
            Command::Reload => {
                tracing::info!("ctl reload requested by {}", req.peer);
                let r = self.reload(rt)?;
                json(serde_json::to_value(r))
            }
            Command::Config => json(serde_json::to_value(RunningConfig {
                path: self.config_path.as_ref().map(|p| p.display().to_string()),
                text: self.text.clone(),
                pending: self.pending(rt),
            })),
        }
    }

    /// A reload, as SIGHUP does it (systemd hears RELOADING/READY around it).
    pub fn reload<E: Engine>(&mut self, rt: &mut Runtime<E>) -> Result<ReloadResult, String> {
        crate::notify::reloading();
        let r = rt.reload(self.config_path.as_deref());
        crate::notify::status(&match &r {
            Ok(r) if r.errors.is_empty() => "serving; reloaded".to_string(),
            Ok(r) => format!(
                "serving; reload applied with {} error(s) (see the log)",
                r.errors.len()
            ),
            Err(_) => "serving; reload rejected, configuration unchanged".to_string(),
        });
        crate::notify::ready();
        let r = r?;
        self.text = r.text;
        self.file = r.file;
        Ok(ReloadResult {
            config: rt.cfg.source.clone(),
            changed: !r.changes.is_empty(),
            changes: r.changes,
            errors: r.errors,
        })
    }

    /// The change from what runs to the file last loaded: empty when the daemon runs it
    /// all.
    fn pending<E: Engine>(&self, rt: &Runtime<E>) -> Vec<String> {
        let mut d = crate::reload::diff(&rt.cfg, &self.file);
        rt.resizes_live_or_at_restart(&mut d);
        d.summary()
    }

    fn status<E: Engine>(&self, rt: &Runtime<E>) -> Status {
        let report = rt.shared.target().report();
        let uptime = SystemTime::now()
            .duration_since(self.started)
            .unwrap_or(Duration::ZERO);
        Status {
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
            started: rfc3339(self.started),
            uptime_seconds: uptime.as_secs(),
            engine: self.engine.to_string(),
            config: rt.cfg.source.clone(),
            io_threads: rt
                .shared
                .stats
                .threads()
                .iter()
                .enumerate()
                .map(|(index, t)| IoThreadStatus {
                    index,
                    qps: t.qps,
                    busy_polls: t.busy_polls,
                    idle_polls: t.idle_polls,
                    offloaded: t.offloaded,
                    non_offloaded: t.non_offloaded,
                })
                .collect(),
            // What is open, not what the file says (a listener a reload could not
            // open is not listening).
            listeners: rt
                .shared
                .listeners
                .all()
                .into_iter()
                .map(|(name, l)| ListenerStatus {
                    name,
                    transport: match l.transport {
                        nvmf::target::Transport::Tcp => "tcp",
                        nvmf::target::Transport::Rdma => "rdma",
                    }
                    .to_string(),
                    address: l.addr.to_string(),
                    port: l.port,
                })
                .collect(),
            subsystems: report.subsystems.iter().filter(|s| !s.is_discovery).count(),
            controllers: report.controllers.iter().filter(|c| !c.retired).count(),
            pending: self.pending(rt),
        }
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn subsystems<E: Engine>(rt: &Runtime<E>) -> Vec<SubsystemInfo> {
    let report: TargetReport = rt.shared.target().report();
    let mut out = Vec::new();
    for s in report.subsystems.iter().filter(|s| !s.is_discovery) {
        let cfg = rt.cfg.subsystems.iter().find(|c| c.nqn == s.nqn);
        let id = rt.shared.subsystems.id(&s.nqn);
        let namespaces: Vec<NamespaceInfo> = s
            .namespaces
            .iter()
            .map(|n| {
                let ns_cfg = cfg.and_then(|c| c.namespaces.iter().find(|x| x.nsid == n.nsid));
                let backend = ns_cfg.map_or_else(String::new, |x| x.backend.clone());
                let t = id
                    .map(|id| rt.shared.stats.namespace(id, n.nsid))
                    .unwrap_or_default();
                NamespaceInfo {
                    nsid: n.nsid,
                    backend_description: rt
                        .backends
                        .get(&backend)
                        .map_or_else(String::new, |b| b.describe()),
                    backend,
                    block_size: n.block_size,
                    blocks: n.num_blocks,
                    size_bytes: n.size_bytes(),
                    uuid: ns_cfg.map_or_else(String::new, |x| {
                        uuid::Uuid::from_bytes(x.uuid).hyphenated().to_string()
                    }),
                    read_commands: t.read_cmds,
                    write_commands: t.write_cmds,
                    read_bytes: t.read_bytes,
                    write_bytes: t.write_bytes,
                    errors: t.errors,
                    ana_group: ns_cfg.map_or(1, |x| x.ana_group),
                    visible_to: ns_cfg.and_then(|x| x.hosts.clone()),
                }
            })
            .collect();
        let ana_groups = ana_groups(rt, &s.nqn, &namespaces);
        out.push(SubsystemInfo {
            nqn: s.nqn.clone(),
            serial: cfg.map_or_else(String::new, |c| c.serial.clone()),
            model: cfg.map_or_else(String::new, |c| c.model.clone()),
            allow_any_host: s.allow_any_host,
            hosts: cfg.map_or_else(Vec::new, |c| c.hosts.clone()),
            listeners: cfg
                .filter(|c| !c.all_listeners)
                .map_or_else(Vec::new, |c| c.listeners.clone()),
            all_listeners: cfg.is_none_or(|c| c.all_listeners),
            controllers: report
                .controllers
                .iter()
                .filter(|c| c.subnqn == s.nqn && !c.retired)
                .count(),
            namespaces,
            ana_groups,
        });
    }
    out
}

/// The live ANA state (the target's, as hosts read it in the ANA log) of each group
/// `namespaces` use, on each open listener.
fn ana_groups<E: Engine>(
    rt: &Runtime<E>,
    nqn: &str,
    namespaces: &[NamespaceInfo],
) -> Vec<AnaGroupInfo> {
    let ids: std::collections::BTreeSet<u32> = namespaces.iter().map(|n| n.ana_group).collect();
    let listeners = rt.shared.listeners.all();
    let target = rt.shared.target();
    ids.into_iter()
        .map(|id| AnaGroupInfo {
            id,
            states: listeners
                .iter()
                .filter_map(|(name, l)| {
                    target.ana_state(nqn, id, l).map(|st| AnaPathState {
                        listener: name.clone(),
                        state: st.name().to_string(),
                    })
                })
                .collect(),
        })
        .collect()
}

fn controllers<E: Engine>(rt: &Runtime<E>) -> Vec<ControllerInfo> {
    let report = rt.shared.target().report();
    let now = SystemTime::now();
    // The engine's per-QP counters by the daemon's queue key.
    let per_queue: std::collections::HashMap<u64, sta::QueueTotals> = rt
        .shared
        .stats
        .queues()
        .into_iter()
        .map(|q| (queue_key_of(q.thread, q.qp), q.totals))
        .collect();
    report
        .controllers
        .iter()
        .map(|c| {
            let conn = rt.shared.conn(c.admin_queue);
            let fact = rt.shared.queue_facts.get(c.admin_queue);
            let queue = |qid: u16, key: u64| QueueInfo {
                qid,
                depth: rt.shared.queue_facts.get(key).and_then(|f| f.depth),
                io_thread: thread_of(key),
            };
            let mut queues = vec![queue(0, c.admin_queue)];
            queues.extend(c.io_queues.iter().map(|&(qid, key)| queue(qid, key)));
            let keys = std::iter::once(c.admin_queue).chain(c.io_queues.iter().map(|q| q.1));
            let counted: Vec<&sta::QueueTotals> = keys.filter_map(|k| per_queue.get(&k)).collect();
            // An engine that counts per QP counts every live one, the admin queue too;
            // one that does not (none found) gets null rather than zeros.
            let io = (!counted.is_empty()).then(|| {
                let mut io = ControllerIo::default();
                for t in &counted {
                    io.read_commands += t.read_cmds;
                    io.write_commands += t.write_cmds;
                    io.read_bytes += t.read_bytes;
                    io.write_bytes += t.write_bytes;
                    io.other_commands += t.other_cmds;
                    io.errors += t.errors;
                }
                io
            });
            ControllerInfo {
                cntlid: c.cntlid,
                subsystem: c.subnqn.clone(),
                host_nqn: c.hostnqn.clone(),
                host_address: conn.as_ref().and_then(|i| i.peer).map(|p| p.to_string()),
                listener: conn.and_then(|i| i.listener),
                transport: rt.shared.transport_of(c.admin_queue).to_string(),
                connected_since: fact.map(|f| rfc3339(f.opened)),
                connected_seconds: fact.map(|f| {
                    now.duration_since(f.opened)
                        .unwrap_or(Duration::ZERO)
                        .as_secs()
                }),
                discovery: c.is_discovery,
                enabled: c.enabled,
                retired: c.retired,
                kato_ms: c.kato_ms,
                errors: c.errors,
                queues,
                io,
            }
        })
        .collect()
}

fn disconnect<E: Engine>(
    rt: &Runtime<E>,
    t: &DisconnectTarget,
    peer: &str,
) -> Result<Disconnected, String> {
    let (gone, actions) = {
        let mut target = rt.shared.target();
        match t {
            DisconnectTarget::Host(h) => target.disconnect_host(h),
            DisconnectTarget::Controller { subsystem, cntlid } => {
                target.disconnect_controller(subsystem, *cntlid)
            }
        }
    };
    if gone.is_empty() {
        return Err(match t {
            DisconnectTarget::Host(h) => format!("no controller of host {h} is connected"),
            DisconnectTarget::Controller { subsystem, cntlid } => {
                format!("no live controller {cntlid} in subsystem {subsystem}")
            }
        });
    }
    for d in &gone {
        tracing::info!(
            "ctl disconnect by {peer}: controller {} (host {}, subsystem {}): tearing down \
             {} queue(s); the host will see its connections close",
            d.cntlid,
            d.hostnqn,
            d.subnqn,
            d.queues
        );
    }
    rt.shared.route(actions);
    Ok(Disconnected {
        controllers: gone
            .into_iter()
            .map(|d| DisconnectedController {
                cntlid: d.cntlid,
                subsystem: d.subnqn,
                host_nqn: d.hostnqn,
                queues: d.queues,
            })
            .collect(),
    })
}
