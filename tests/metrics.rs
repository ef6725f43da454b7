//! Prometheus `/metrics` end to end: the daemon serves the exposition on the configured
//! address, every line of it is valid text format 0.0.4, counters move after I/O done by
//! a real NVMe/TCP host, `promtool check metrics` accepts it, and a taken metrics port
//! stops start-up with a clear error.
//!
//! `promtool` must be installed (Debian: `apt-get install -y --no-install-recommends
//! prometheus`); without it the promtool test fails and says so.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use nvmf::spec::Status;

/// [`common::CONFIG`] plus a metrics address; `{mport}` is filled in by [`start`].
fn config_with_metrics(mport: u16) -> String {
    format!("{CONFIG}metrics:\n  address: 127.0.0.1:{mport}\n")
}

/// The daemon and its metrics address.
fn start() -> (Daemon, SocketAddr) {
    let mport = free_port();
    let d = Daemon::start(&config_with_metrics(mport));
    (d, SocketAddr::from(([127, 0, 0, 1], mport)))
}

/// One HTTP exchange; returns (status code, headers, body).
fn http(addr: SocketAddr, request: &str) -> (u16, String, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("connect to metrics at {addr}: {e}"),
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).expect("send request");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read response");
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of headers in {raw:?}"));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    (status, head.to_string(), body.to_string())
}

fn scrape(addr: SocketAddr) -> String {
    let (status, head, body) = http(addr, "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n");
    assert_eq!(status, 200, "{head}\n{body}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    body
}

/// A sample: metric name, labels, value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses text format 0.0.4 strictly: every line is a HELP, a TYPE or a sample; every
/// sample belongs to a family with HELP and TYPE given before it; names and label names
/// are valid; label values are properly quoted; values are numbers.
fn parse(text: &str) -> (BTreeMap<String, String>, Vec<Sample>) {
    let valid_name = |s: &str| {
        !s.is_empty()
            && !s.starts_with(|c: char| c.is_ascii_digit())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut helps: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let at = format!("line {}: {line:?}", i + 1);
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or_else(|| panic!("{at}"));
            assert!(valid_name(name), "{at}: metric name");
            assert!(!help.is_empty(), "{at}: empty help");
            assert!(
                helps.insert(name.into(), help.into()).is_none(),
                "{at}: second HELP"
            );
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or_else(|| panic!("{at}"));
            assert!(valid_name(name), "{at}: metric name");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{at}: type"
            );
            assert!(helps.contains_key(name), "{at}: TYPE before HELP");
            assert!(
                types.insert(name.into(), kind.into()).is_none(),
                "{at}: second TYPE"
            );
            continue;
        }
        assert!(!line.starts_with('#'), "{at}: stray comment");
        assert!(!line.is_empty(), "{at}: empty line");
        // name{labels} value
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{at}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("{at}: value")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("{at}: labels"));
                (name, parse_labels(body, &at))
            }
        };
        assert!(valid_name(name), "{at}: metric name");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                name.strip_suffix(suffix)
                    .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(name);
        let kind = types
            .get(family)
            .unwrap_or_else(|| panic!("{at}: sample without a TYPE"));
        if kind == "counter" {
            assert!(name.ends_with("_total"), "{at}: counter without _total");
            assert!(value >= 0.0, "{at}: negative counter");
        }
        if name.ends_with("_bucket") {
            assert!(labels.contains_key("le"), "{at}: bucket without le");
        }
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    (types, samples)
}

fn parse_labels(mut s: &str, at: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    while !s.is_empty() {
        let (name, rest) = s.split_once("=\"").unwrap_or_else(|| panic!("{at}: label"));
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{at}: label name {name:?}"
        );
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    other => panic!("{at}: bad escape {other:?}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("{at}: unterminated label value"),
            }
        };
        assert!(
            out.insert(name.to_string(), value).is_none(),
            "{at}: repeated label"
        );
        s = &rest[end + 1..];
        s = s.strip_prefix(',').unwrap_or(s);
    }
    out
}

/// The value of the one sample named `name` whose labels include `want`.
fn value(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = samples
        .iter()
        .filter(|s| {
            s.name == name
                && want
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {name}{want:?}, found {found:?}"
    );
    found[0].value
}

/// A series' labels without `le`, in order.
type LabelKey = Vec<(String, String)>;

/// Histograms: buckets cumulative and ending in +Inf equal to _count.
fn check_histograms(types: &BTreeMap<String, String>, samples: &[Sample]) {
    for (family, _) in types.iter().filter(|(_, t)| *t == "histogram") {
        let mut series: BTreeMap<LabelKey, Vec<(f64, f64)>> = BTreeMap::new();
        for s in samples
            .iter()
            .filter(|s| s.name == format!("{family}_bucket"))
        {
            let mut key: Vec<(String, String)> = s.labels.clone().into_iter().collect();
            key.retain(|(k, _)| k != "le");
            let le = match s.labels["le"].as_str() {
                "+Inf" => f64::INFINITY,
                v => v.parse().expect("le is a number"),
            };
            series.entry(key).or_default().push((le, s.value));
        }
        for (key, buckets) in series {
            for w in buckets.windows(2) {
                assert!(w[0].0 < w[1].0, "{family}{key:?}: le not increasing");
                assert!(w[0].1 <= w[1].1, "{family}{key:?}: buckets not cumulative");
            }
            let last = buckets.last().expect("a bucket");
            assert_eq!(last.0, f64::INFINITY, "{family}{key:?}: no +Inf bucket");
            let labels: Vec<(&str, &str)> =
                key.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let count = value(samples, &format!("{family}_count"), &labels);
            assert_eq!(last.1, count, "{family}{key:?}: +Inf bucket != _count");
        }
    }
}

#[test]
fn exposition_parses_and_counters_move_after_io() {
    let _w = watchdog("metrics_exposition", Duration::from_secs(60));
    let (mut d, maddr) = start();
    let before = scrape(maddr);
    let (types, s0) = parse(&before);
    check_histograms(&types, &s0);
    for family in [
        "nvmft_namespace_commands_total",
        "nvmft_namespace_io_bytes_total",
        "nvmft_namespace_errors_total",
        "nvmft_namespace_status_errors_total",
        "nvmft_namespace_backend_queue_depth",
        "nvmft_namespace_latency_seconds",
        "nvmft_namespace_size_bytes",
        "nvmft_controllers",
        "nvmft_connections",
        "nvmft_io_thread_polls_total",
        "nvmft_io_thread_capsules_total",
        "nvmft_io_thread_queue_pairs",
        "nvmft_start_time_seconds",
        "nvmft_uptime_seconds",
        "nvmft_limit_hits_total",
        "nvmft_peer_connections",
    ] {
        assert!(types.contains_key(family), "{family} missing:\n{before}");
    }
    // Every limit is exported from the start (zero until hit), the engine's and the
    // daemon's.
    for limit in [
        "icreq_timeout",
        "connect_timeout",
        "host_data_timeout",
        "partial_pdu_timeout",
        "drain_timeout",
        "send_queue",
        "queue_depth",
        "connection_buffers",
        "buffer_pool",
        "command_slots",
        "peer_buffers",
        "peer_command_slots",
        "connections",
        "connections_per_peer",
        "unconnected_connections",
        "accept_open_files",
    ] {
        assert!(
            s0.iter().any(|x| x.name == "nvmft_limit_hits_total"
                && x.labels.get("limit").map(String::as_str) == Some(limit)),
            "nvmft_limit_hits_total{{limit=\"{limit}\"}} missing:\n{before}"
        );
    }
    let ns1 = [("subsystem", SUBNQN), ("nsid", "1")];
    assert_eq!(
        value(&s0, "nvmft_namespace_size_bytes", &ns1),
        NS1_SIZE as f64
    );
    assert_eq!(value(&s0, "nvmft_io_threads", &[]), 2.0);
    let start_time = value(&s0, "nvmft_start_time_seconds", &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        start_time <= now && now - start_time < 60.0,
        "start time {start_time}"
    );
    let w0 = value(
        &s0,
        "nvmft_namespace_commands_total",
        &[ns1[0], ns1[1], ("op", "write")],
    );
    let r0 = value(
        &s0,
        "nvmft_namespace_commands_total",
        &[ns1[0], ns1[1], ("op", "read")],
    );

    // A host: one controller with one I/O queue, 16 writes and 16 reads of 4 KiB.
    let opts = host_opts();
    let mut c = controller(&d, 1, &opts);
    let data = pattern(7, 4096);
    for i in 0..16u64 {
        assert_ok(
            c.io[0].write(1, i * 8, &data, false).expect("write"),
            "write",
        );
        let mut back = vec![0u8; 4096];
        assert_ok(c.io[0].read(1, i * 8, 8, &mut back).expect("read"), "read");
        assert!(back == data, "read back differs");
    }
    // One error of a known kind: a read past the end.
    let mut back = vec![0u8; 4096];
    let past_end = NS1_SIZE / NS1_BLOCK as u64;
    let st = c.io[0]
        .read(1, past_end, 8, &mut back)
        .expect("read past the end");
    assert_eq!(
        st.sc,
        Status::LBA_OUT_OF_RANGE.sc,
        "read past the end: {st}"
    );

    let after = scrape(maddr);
    let (types, s1) = parse(&after);
    check_histograms(&types, &s1);
    let op = |o: &'static str| [ns1[0], ns1[1], ("op", o)];
    assert!(value(&s1, "nvmft_namespace_commands_total", &op("write")) >= w0 + 16.0);
    assert!(value(&s1, "nvmft_namespace_commands_total", &op("read")) >= r0 + 16.0);
    assert!(value(&s1, "nvmft_namespace_io_bytes_total", &op("write")) >= 16.0 * 4096.0);
    assert!(value(&s1, "nvmft_namespace_io_bytes_total", &op("read")) >= 16.0 * 4096.0);
    assert!(value(&s1, "nvmft_namespace_latency_seconds_count", &op("write")) >= 16.0);
    assert!(value(&s1, "nvmft_namespace_latency_seconds_sum", &op("read")) > 0.0);
    let status = |v: &'static str| [ns1[0], ns1[1], ("status", v)];
    let lba = "nvmft_namespace_status_errors_total";
    assert_eq!(
        value(&s1, lba, &status("lba_out_of_range")) - value(&s0, lba, &status("lba_out_of_range")),
        1.0,
        "{after}"
    );
    assert_eq!(
        value(&s1, "nvmft_namespace_backend_queue_depth", &ns1),
        0.0,
        "at rest"
    );
    let host = [
        ("subsystem", SUBNQN),
        ("host", opts.hostnqn.as_str()),
        ("transport", "tcp"),
    ];
    assert_eq!(value(&s1, "nvmft_controllers", &host), 1.0, "{after}");
    assert_eq!(value(&s1, "nvmft_connections", &host), 2.0, "{after}");
    assert_eq!(
        value(&s1, "nvmft_peer_connections", &[("state", "connected")]),
        2.0,
        "{after}"
    );
    assert_eq!(
        value(&s1, "nvmft_peer_connections", &[("state", "unconnected")]),
        0.0,
        "{after}"
    );
    let sum_over_threads = |s: &[Sample], name: &str, k: &str, v: &str| -> f64 {
        s.iter()
            .filter(|x| x.name == name && x.labels.get(k).map(String::as_str) == Some(v))
            .map(|x| x.value)
            .sum()
    };
    let capsules = "nvmft_io_thread_capsules_total";
    assert!(
        sum_over_threads(&s1, capsules, "path", "offloaded")
            >= sum_over_threads(&s0, capsules, "path", "offloaded") + 32.0
    );
    assert!(
        sum_over_threads(&s1, capsules, "path", "non_offloaded")
            > sum_over_threads(&s0, capsules, "path", "non_offloaded"),
        "Connect, Property Set, Set Features are not offloaded"
    );
    let qps: f64 = s1
        .iter()
        .filter(|x| x.name == "nvmft_io_thread_queue_pairs")
        .map(|x| x.value)
        .sum();
    assert!(qps >= 2.0, "admin + I/O queue pairs, got {qps}");
    assert!(
        sum_over_threads(&s1, "nvmft_io_thread_polls_total", "state", "busy")
            > sum_over_threads(&s0, "nvmft_io_thread_polls_total", "state", "busy")
    );

    // The host goes away: its controller leaves the exposition.
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, s) = parse(&scrape(maddr));
        if !s.iter().any(|x| {
            x.name == "nvmft_controllers"
                && x.labels.get("host").map(String::as_str) == Some(opts.hostnqn.as_str())
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "controller still reported after the host left"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    d.stop();
}

/// Refusals are counted by reason: every reason is exported (zero until it happens),
/// and each refused Connect, rejected ICReq and C2HTermReq moves its own series.
#[test]
fn refusals_are_counted_by_reason() {
    let _w = watchdog("metrics_refusals", Duration::from_secs(60));
    let (mut d, maddr) = start();
    let (types, s0) = parse(&scrape(maddr));
    assert_eq!(
        types.get("nvmft_refusals_total").map(String::as_str),
        Some("counter")
    );
    let reasons = [
        "host_not_allowed",
        "unknown_subsystem",
        "empty_host_nqn_not_allowed",
        "controller_fatal_status",
        "keep_alive_expired",
        "icreq_rejected",
        "c2h_term_req_sent",
        "h2c_term_req_received",
    ];
    for r in reasons {
        assert_eq!(
            value(&s0, "nvmft_refusals_total", &[("reason", r)]),
            0.0,
            "{r}"
        );
    }
    // Three hosts not on RESTRICTED_NQN's list, one unknown subsystem, one empty host NQN
    // where a list applies.
    for _ in 0..3 {
        let mut h = nvmf_initiator::TcpHost::connect(d.addr(), host_opts()).expect("ICReq");
        assert!(h.connect_admin(RESTRICTED_NQN, 0).is_err());
    }
    let mut h = nvmf_initiator::TcpHost::connect(d.addr(), host_opts()).expect("ICReq");
    assert!(h
        .connect_admin("nqn.2026-11.dev.nvmf-target:nope", 0)
        .is_err());
    let mut h = nvmf_initiator::TcpHost::connect(d.addr(), host_opts().with_empty_hostnqn())
        .expect("ICReq");
    assert!(h.connect_admin(RESTRICTED_NQN, 0).is_err());
    // An ICReq with PFV 1.
    let mut h = nvmf_initiator::TcpHost::connect_raw(d.addr(), host_opts()).expect("connect");
    let mut ic = Vec::new();
    nvmf::tcp::encode_ic_req(
        &mut ic,
        &nvmf::tcp::IcReq {
            pfv: 1,
            ..Default::default()
        },
    );
    h.send_raw(&ic).expect("send");
    assert!(h.recv_pdu().is_ok(), "C2HTermReq");
    let want = [
        ("host_not_allowed", 3.0),
        ("unknown_subsystem", 1.0),
        ("empty_host_nqn_not_allowed", 1.0),
        ("icreq_rejected", 1.0),
        ("c2h_term_req_sent", 0.0),
    ];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, s1) = parse(&scrape(maddr));
        let got: Vec<f64> = want
            .iter()
            .map(|(r, _)| value(&s1, "nvmft_refusals_total", &[("reason", r)]))
            .collect();
        if got.iter().zip(&want).all(|(g, (_, w))| g == w) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "refusal counters {got:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_serves(&mut d);
}

#[test]
fn http_answers_and_content_negotiation() {
    let _w = watchdog("metrics_http", Duration::from_secs(60));
    let (mut d, maddr) = start();
    let (st, head, body) = http(
        maddr,
        "GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n\r\n",
    );
    assert_eq!(st, 200);
    assert!(
        head.contains("Content-Type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    assert!(body.contains("# TYPE nvmft_namespace_commands counter"));
    assert_eq!(http(maddr, "GET / HTTP/1.1\r\n\r\n").0, 404);
    assert_eq!(http(maddr, "GET /metrics/x HTTP/1.1\r\n\r\n").0, 404);
    assert_eq!(http(maddr, "DELETE /metrics HTTP/1.1\r\n\r\n").0, 405);
    assert_eq!(http(maddr, "this is not http\r\n\r\n").0, 400);
    // Still serving, and NVMe/TCP unaffected.
    parse(&scrape(maddr));
    assert_serves(&mut d);
    d.stop();
}

/// A client holding every connection of the endpoint idle cannot keep a scraper out: the
/// scrape takes the place of the oldest idle connection, and the cut is counted. (Before,
/// the scrape got 503 until the idle ones' request deadline freed them.)
#[test]
fn idle_connections_do_not_keep_a_scraper_out() {
    let _w = watchdog("metrics_idle_hog", Duration::from_secs(60));
    let (mut d, maddr) = start();
    parse(&scrape(maddr));
    // Three times the cap, each sending nothing, held open.
    let idle: Vec<TcpStream> = (0..24)
        .map(|_| TcpStream::connect(maddr).expect("connect"))
        .collect();
    // Let the endpoint accept them all.
    std::thread::sleep(Duration::from_millis(300));
    let body = scrape(maddr);
    let (_, samples) = parse(&body);
    let evicted = value(
        &samples,
        "nvmft_metrics_connections_cut_total",
        &[("reason", "evicted")],
    );
    assert!(
        evicted >= 17.0,
        "24 idle + 1 scrape over a cap of 8: {evicted}"
    );
    drop(idle);
    assert_serves(&mut d);
    d.stop();
}

#[test]
fn promtool_check_metrics_accepts_the_exposition() {
    let _w = watchdog("metrics_promtool", Duration::from_secs(60));
    let promtool = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    if Command::new(&promtool).arg("--version").output().is_err() {
        panic!(
            "`{promtool}` not found: this test runs `promtool check metrics` on a scrape. \
             Install it (Debian/Ubuntu: `apt-get install -y --no-install-recommends prometheus`) \
             or point PROMTOOL at it."
        );
    }
    let (mut d, maddr) = start();
    // Some I/O first, so histograms and counters have values.
    let opts = host_opts();
    let mut c = controller(&d, 1, &opts);
    assert_ok(
        c.io[0]
            .write(1, 0, &pattern(1, 4096), false)
            .expect("write"),
        "write",
    );
    let text = scrape(maddr);
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().expect("promtool output");
    // promtool exits 3 on lint problems and prints them; a clean exposition prints nothing.
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics failed ({}):\n{}{}\n---- exposition ----\n{text}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    drop(c);
    d.stop();
}

#[test]
fn a_taken_metrics_port_stops_start_up() {
    let _w = watchdog("metrics_port_taken", Duration::from_secs(30));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mport = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("nvmf-target.yaml");
    let text = config_with_metrics(mport)
        .replace("{port}", &free_port().to_string())
        .replace("{dir}", &dir.path().display().to_string());
    std::fs::write(&cfg, text).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_nvmf-target"))
        .arg("--config")
        .arg(&cfg)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nvmf-target");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("nvmf-target kept running with its metrics port taken");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(!status.success(), "exit status {status}; log:\n{log}");
    assert!(
        log.contains("metrics") && log.contains(&mport.to_string()),
        "the error names the metrics address; log:\n{log}"
    );
    drop(taken);
}
