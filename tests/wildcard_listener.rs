//! A listener on the wildcard address, end to end: discovery publishes the address each
//! host reached, never 0.0.0.0. Binding 0.0.0.0 is done inside a private network
//! namespace (so nothing outside this test can reach the daemon), which needs
//! CAP_SYS_ADMIN and `ip`; without them the test is SKIPPED (`common/skip.rs`).

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use nvmf_initiator::TcpHost;

fn main() {
    // Probed on a thread of its own: the namespace it makes dies with it.
    let missing = std::thread::spawn(private_network)
        .join()
        .unwrap_or_else(|_| Err("the probe panicked".into()))
        .err()
        .map(|why| format!("no private network namespace for a wildcard listener: {why}"));
    skip::run(vec![skip::trial(
        "discovery_over_a_wildcard_listener_publishes_the_reached_address",
        missing,
        discovery_over_a_wildcard_listener_publishes_the_reached_address,
    )]);
}

/// Runs the rest of the calling test thread (and the daemons it starts) in a network
/// namespace of its own with loopback up and 10.99.0.1 on it, so a listener may bind the
/// wildcard address without being reachable from anywhere else. `Err` says why not.
fn private_network() -> Result<(), String> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("unshare(CLONE_NEWNET): {e} (needs CAP_SYS_ADMIN)"))?;
    let cmds: [&[&str]; 2] = [
        &["link", "set", "lo", "up"],
        &["addr", "add", "10.99.0.1/32", "dev", "lo"],
    ];
    for args in cmds {
        let st = Command::new("ip")
            .args(args)
            .status()
            .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
        if !st.success() {
            return Err(format!("ip {}: {st}", args.join(" ")));
        }
    }
    Ok(())
}

const WILDCARD: &str = "\
io_threads: 1
listeners:
  - {name: any4, transport: tcp, address: 0.0.0.0, port: {port}}
backends:
  - {name: ram0, type: ram, size: 4MiB, block_size: 512}
subsystems:
  - nqn: nqn.2026-11.dev.nvmf-target:e2e
    allow_any_host: true
    namespaces:
      - {nsid: 1, backend: ram0}
";

/// 5a: a listener on 0.0.0.0 is published with the address the discovery host reached,
/// never as 0.0.0.0 (which nvme connect-all would then try).
fn discovery_over_a_wildcard_listener_publishes_the_reached_address() {
    let _w = watchdog("wildcard_traddr", Duration::from_secs(60));
    private_network().expect("the probe found a private network namespace possible");
    let mut d = Daemon::start(WILDCARD);
    for addr in ["127.0.0.1", "10.99.0.1"] {
        let mut h = TcpHost::connect((addr, d.port()), host_opts()).expect("ICReq");
        h.connect_admin(DISCOVERY_NQN, 0)
            .expect("Connect discovery");
        h.enable_controller().expect("enable");
        let entries = discovery_entries(&mut h);
        assert_eq!(entries.len(), 2, "{entries:?}");
        for (trtype, adrfam, trsvcid, traddr, _) in &entries {
            assert_eq!((*trtype, *adrfam), (3, 1), "TCP, IPv4");
            assert_eq!(traddr, addr, "TRADDR when discovered through {addr}");
            assert_eq!(*trsvcid, d.port().to_string());
        }
        // And the published address works.
        let mut c = TcpHost::connect((addr, d.port()), host_opts()).expect("ICReq");
        c.connect_admin(SUBNQN, 0)
            .expect("Connect at the published address");
    }
    assert_serves(&mut d);
}
