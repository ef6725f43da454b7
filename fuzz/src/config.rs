//! The `config` harness: random text into the daemon's YAML config parser.
//!
//! The daemon is a binary crate, so its `src/config.rs` (and `src/config/*.rs`) is
//! compiled here in place; it needs only serde, serde-saphyr, thiserror, uuid and
//! nix (CPU affinity).

use crate::daemon_src::config as daemon_config;

use daemon_config::Config;

/// Parses `data` (UTF-8, lossily) as a config; any result is fine, a panic is a finding.
pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match Config::parse(&text, "fuzz.yaml") {
        Ok(cfg) => {
            // A config that parsed is complete: every subsystem has its identity.
            for s in &cfg.subsystems {
                assert!(!s.serial.is_empty(), "empty serial in {cfg:?}");
            }
            let _ = format!("{cfg:?}");
        }
        Err(e) => {
            for d in e.diagnostics() {
                assert!(d.line >= 1 && d.column >= 1, "unlocated diagnostic {d:?}");
            }
            let _ = e.to_string();
        }
    }
    let _ = daemon_config::parse_size(&text);
}

/// Seeds: the embedded default and a few shapes the schema knows.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut v = vec![daemon_config::EMBEDDED_DEFAULT.as_bytes().to_vec()];
    for extra in [
        "io_threads: 2\nlisteners:\n  - {name: t, transport: tcp, address: 127.0.0.1, port: 4420}\n",
        "cpus: [0, 1]\n",
        "metrics: 127.0.0.1:9100\n",
        "subsystems: []\n",
        "a: &x [*x]\n",
        "{",
    ] {
        v.push(extra.as_bytes().to_vec());
    }
    for dir in [
        concat!(env!("CARGO_MANIFEST_DIR"), "/../etc"),
        concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/interop/configs"),
    ] {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                    if let Ok(b) = std::fs::read(&p) {
                        v.push(b);
                    }
                }
            }
        }
    }
    v
}
