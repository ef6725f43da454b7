//! The Grafana dashboard (contrib/grafana/nvmf-target.json) against a real daemon: the
//! JSON parses, every metric its PromQL queries name exists in a scrape of a running
//! daemon after some I/O (with every label value its `label="value"` matchers ask for,
//! and every label its `by (...)` clauses group on), it covers what the issue asks
//! (IOPS, bandwidth, latency percentiles, hosts, refusals, offloaded share), and
//! `promtool check rules` accepts each query as PromQL (Grafana's `$variables`
//! substituted). Without promtool that last test is SKIPPED (`common/skip.rs`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/contrib/grafana/nvmf-target.json"
);

fn main() {
    let promtool = match Command::new("promtool").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("promtool is not installed (Debian: apt-get install prometheus)".to_string()),
    };
    skip::run(vec![
        skip::trial(
            "every_series_the_dashboard_queries_exists_in_a_real_scrape",
            None,
            every_series_the_dashboard_queries_exists_in_a_real_scrape,
        ),
        skip::trial(
            "promtool_accepts_every_dashboard_query",
            promtool,
            promtool_accepts_every_dashboard_query,
        ),
    ]);
}

/// Every PromQL string of the dashboard: panel targets (rows included) and template
/// variable queries, with where each came from.
fn queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(DASHBOARD).expect("read the dashboard");
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is valid JSON");
    let mut out = Vec::new();
    fn panels(list: &Value, out: &mut Vec<(String, String)>) {
        for p in list.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?").to_string();
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().expect("every target has an expr");
                out.push((format!("panel {title:?}"), expr.to_string()));
            }
            panels(&p["panels"], out);
        }
    }
    panels(&dash["panels"], &mut out);
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(q) = v["definition"].as_str() {
            // label_values(<selector>, label): the selector is the PromQL part.
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|s| s.rsplit_once(','))
                .map(|(sel, _)| sel.to_string())
                .unwrap_or_else(|| q.to_string());
            out.push((format!("variable {}", v["name"]), inner));
        }
    }
    assert!(out.len() > 10, "too few queries: {out:?}");
    out
}

/// A metric named in a query, with the equality matchers that follow it.
#[derive(Debug)]
struct Selector {
    name: String,
    equal: Vec<(String, String)>,
}

fn selectors(expr: &str) -> Vec<Selector> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("nvmft_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].to_string();
        let mut equal = Vec::new();
        let after = &tail[end..];
        if let Some(body) = after.strip_prefix('{') {
            let close = body.find('}').expect("a closed selector");
            for m in body[..close].split(',') {
                let m = m.trim();
                if m.contains("=~") || m.contains("!=") || m.contains("!~") {
                    continue;
                }
                if let Some((k, v)) = m.split_once('=') {
                    equal.push((k.trim().to_string(), v.trim().trim_matches('"').to_string()));
                }
            }
        }
        out.push(Selector { name, equal });
        rest = &tail[end..];
    }
    out
}

/// Labels of every `by (...)` clause.
fn by_labels(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("by (") {
        let tail = &rest[i + 4..];
        let close = tail.find(')').expect("closed by clause");
        out.extend(tail[..close].split(',').map(|l| l.trim().to_string()));
        rest = &tail[close..];
    }
    out
}

/// Samples of a text-format scrape: name -> every label set.
fn samples(text: &str) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let mut out: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, labels) = match line.find('{') {
            Some(i) => {
                let close = line.rfind('}').expect("closed labels");
                (&line[..i], &line[i + 1..close])
            }
            None => (line.split(' ').next().unwrap_or_default(), ""),
        };
        let mut set = BTreeMap::new();
        // Label values here have no commas or quotes inside (NQNs, numbers, words).
        for kv in labels.split(',').filter(|s| !s.is_empty()) {
            if let Some((k, v)) = kv.split_once('=') {
                set.insert(k.to_string(), v.trim_matches('"').to_string());
            }
        }
        out.entry(name.to_string()).or_default().push(set);
    }
    out
}

fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to /metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read the scrape");
    let (head, body) = raw.split_once("\r\n\r\n").expect("HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

fn every_series_the_dashboard_queries_exists_in_a_real_scrape() {
    let _w = watchdog("grafana_series", Duration::from_secs(60));
    let queries = queries();

    // What the issue asks the dashboard to show.
    let all: String = queries.iter().map(|(_, q)| q.as_str()).collect();
    for want in [
        "rate(nvmft_namespace_commands_total",
        "rate(nvmft_namespace_io_bytes_total",
        "histogram_quantile(0.99, sum by (le, op) (rate(nvmft_namespace_latency_seconds_bucket",
        "count by (host) (nvmft_controllers",
        "sum by (reason) (increase(nvmft_refusals_total",
        "nvmft_io_thread_capsules_total{instance=~\"$instance\", path=\"offloaded\"}",
    ] {
        assert!(
            all.contains(want),
            "the dashboard has no query with {want:?}"
        );
    }

    // A daemon with metrics, a host doing I/O, and one refusal.
    let mport = free_port();
    let d = Daemon::start(&format!("{CONFIG}metrics:\n  address: 127.0.0.1:{mport}\n"));
    let opts = host_opts();
    let mut c = controller(&d, 1, &opts);
    let data = pattern(3, 8192);
    assert_ok(c.io[0].write(1, 0, &data, false).expect("write"), "write");
    let mut back = vec![0u8; 8192];
    assert_ok(c.io[0].read(1, 0, 16, &mut back).expect("read"), "read");
    let mut h = nvmf_initiator::TcpHost::connect(d.addr(), host_opts()).expect("ICReq");
    assert!(h
        .connect_admin("nqn.2026-11.dev.nvmf-target:nope", 0)
        .is_err());

    let scraped = samples(&scrape(SocketAddr::from(([127, 0, 0, 1], mport))));
    let mut checked = BTreeSet::new();
    for (at, q) in &queries {
        let sels = selectors(q);
        assert!(!sels.is_empty(), "{at}: no nvmft_ metric in {q:?}");
        for s in &sels {
            let Some(sets) = scraped.get(&s.name) else {
                panic!(
                    "{at}: {} is not in the scrape (names there: {:?})",
                    s.name,
                    scraped.keys().collect::<Vec<_>>()
                );
            };
            for (k, v) in &s.equal {
                assert!(
                    sets.iter().any(|l| l.get(k) == Some(v)),
                    "{at}: no {}{{{k}=\"{v}\"}} in the scrape: {sets:?}",
                    s.name
                );
            }
            checked.insert(s.name.clone());
        }
        for label in by_labels(q) {
            assert!(
                sels.iter()
                    .any(|s| scraped[&s.name].iter().any(|l| l.contains_key(&label))),
                "{at}: groups by {label:?}, which none of its series carries: {q}"
            );
        }
    }
    eprintln!(
        "dashboard: {} queries over {} series, all present: {checked:?}",
        queries.len(),
        checked.len()
    );
}

fn promtool_accepts_every_dashboard_query() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (_, q)) in queries().iter().enumerate() {
        let q = q
            .replace("$__rate_interval", "1m")
            .replace("$instance", ".*")
            .replace("$subsystem", ".*");
        let quoted = serde_json::to_string(&q).unwrap();
        rules += &format!("      - record: dashboard:query{i}\n        expr: {quoted}\n");
    }
    let path = dir.path().join("rules.yml");
    std::fs::write(&path, &rules).unwrap();
    let o = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&path)
        .output()
        .expect("run promtool");
    assert!(
        o.status.success(),
        "promtool check rules: {}{}\n{rules}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}
