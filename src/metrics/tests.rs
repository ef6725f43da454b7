//! Tests of `metrics`.

use super::*;
use sta::Engine;

fn req(s: &str) -> Result<Request, ()> {
    parse_request(s.as_bytes())
}

#[test]
fn request_parsing() {
    let r = req("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: text/plain\r\n\r\n").unwrap();
    assert_eq!(r.method, "GET");
    assert_eq!(r.path, "/metrics");
    assert_eq!(r.accept.as_deref(), Some("text/plain"));
    let r = req("HEAD /metrics HTTP/1.0\n\n").unwrap();
    assert_eq!((r.method.as_str(), r.accept), ("HEAD", None));
    for bad in [
        "",
        "GET\r\n\r\n",
        "GET /metrics\r\n\r\n",
        "GET /metrics HTTP/2\r\n\r\n",
        "GET metrics HTTP/1.1\r\n\r\n",
        "GET  /metrics HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/1.1 x\r\n\r\n",
        "G(T /metrics HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nBad Name: x\r\n\r\n",
    ] {
        assert!(req(bad).is_err(), "{bad:?} must be refused");
    }
    assert!(parse_request(b"GET /\xff HTTP/1.1\r\n\r\n").is_err());
}

#[test]
fn head_end() {
    assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
    assert_eq!(find_head_end(b"GET / HTTP/1.1\n\n"), Some(16));
    assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n"), None);
}

#[test]
fn negotiation() {
    // What Prometheus 2.x sends.
    assert!(wants_openmetrics(Some(
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    )));
    assert!(!wants_openmetrics(None));
    assert!(!wants_openmetrics(Some("*/*")));
    assert!(!wants_openmetrics(Some("text/plain")));
    assert!(!wants_openmetrics(Some(
        "text/plain;q=1, application/openmetrics-text;q=0.5"
    )));
    assert!(!wants_openmetrics(Some("application/openmetrics-text;q=0")));
    assert!(wants_openmetrics(Some("application/openmetrics-text")));
}

#[test]
fn conversion_renames_counters_and_drops_openmetrics_lines() {
    let om = "# HELP nvmft_c Some help.\n# TYPE nvmft_c counter\nnvmft_c_total{a=\"b\"} 3\n\
              # HELP nvmft_size_bytes Size.\n# TYPE nvmft_size_bytes gauge\n# UNIT nvmft_size_bytes bytes\nnvmft_size_bytes 7\n# EOF\n";
    assert_eq!(
        openmetrics_to_text(om),
        "# HELP nvmft_c_total Some help.\n# TYPE nvmft_c_total counter\nnvmft_c_total{a=\"b\"} 3\n\
         # HELP nvmft_size_bytes Size.\n# TYPE nvmft_size_bytes gauge\nnvmft_size_bytes 7\n"
    );
}

fn source(stats: sta::Stats) -> MetricsSource {
    MetricsSource {
        stats,
        report: Box::new(TargetReport::default),
        subsystems: Box::new(Vec::new),
        transport_of: Box::new(|_| "tcp"),
        refusals: Box::new(|| vec![("host_not_allowed", 2)]),
        limit_hits: Box::new(|| vec![("icreq_timeout", 3), ("connections_per_peer", 0)]),
        peer_connections: Box::new(|| (5, 1)),
        dh_jobs: Box::new(|| (3, 40, 2)),
        started: SystemTime::now(),
    }
}

#[test]
fn scrape_of_an_idle_engine_is_well_formed() {
    let mut sta = crate::engine::for_tests();
    let id = sta
        .subsystem_create("nqn.2026-11.dev.nvmf-target:m")
        .expect("subsystem");
    let mut src = source(sta.stats());
    src.subsystems = Box::new(move || vec![(id, "nqn.2026-11.dev.nvmf-target:m".into())]);
    let om = scrape(&src);
    assert!(om.ends_with("# EOF\n"), "{om}");
    for name in [
        "nvmft_subsystems 0",
        "nvmft_io_threads 0",
        "# TYPE nvmft_namespace_latency_seconds histogram",
        "nvmft_build_info{version=",
        "nvmft_refusals_total{reason=\"host_not_allowed\"} 2",
        "nvmft_limit_hits_total{limit=\"icreq_timeout\"} 3",
        "nvmft_limit_hits_total{limit=\"connections_per_peer\"} 0",
        "nvmft_peer_connections{state=\"connected\"} 5",
        "nvmft_peer_connections{state=\"unconnected\"} 1",
        "nvmft_auth_dh_jobs_waiting 3",
        "nvmft_auth_dh_jobs_total{state=\"run\"} 40",
        "nvmft_auth_dh_jobs_total{state=\"skipped\"} 2",
    ] {
        assert!(om.contains(name), "{name} missing from\n{om}");
    }
    let text = openmetrics_to_text(&om);
    assert!(!text.contains("# EOF") && !text.contains("# UNIT"));
}

/// Counters for namespaces 1 and 2 of subsystem 7, as an engine keeps them after
/// namespace 2 was removed.
struct KeptCounters;

impl sta::StatsSource for KeptCounters {
    fn namespace(&self, _: SubsysId, nsid: u32) -> sta::NsTotals {
        sta::NsTotals {
            read_cmds: u64::from(nsid),
            queue_depth: 1,
            ..Default::default()
        }
    }
    fn namespaces(&self) -> Vec<(SubsysId, u32)> {
        vec![(SubsysId(7), 1), (SubsysId(7), 2)]
    }
    fn threads(&self) -> Vec<sta::ThreadTotals> {
        Vec::new()
    }
}

#[test]
fn only_attached_namespaces_and_configured_subsystems_are_reported() {
    use nvmf::target::report::{NamespaceReport, SubsystemReport};
    const NQN: &str = "nqn.2026-11.dev.nvmf-target:m";
    let mut src = source(sta::Stats::new(Arc::new(KeptCounters)));
    src.subsystems = Box::new(|| vec![(SubsysId(7), NQN.into())]);
    src.report = Box::new(|| TargetReport {
        subsystems: vec![
            SubsystemReport {
                nqn: NQN.into(),
                is_discovery: false,
                allow_any_host: true,
                allowed_hosts: 0,
                namespaces: vec![NamespaceReport {
                    nsid: 1,
                    block_size: 512,
                    num_blocks: 8,
                }],
            },
            SubsystemReport {
                nqn: "nqn.2014-08.org.nvmexpress.discovery".into(),
                is_discovery: true,
                allow_any_host: true,
                allowed_hosts: 0,
                namespaces: Vec::new(),
            },
        ],
        ..TargetReport::default()
    });
    let text = openmetrics_to_text(&scrape(&src));
    for line in [
        "nvmft_subsystems 1",
        "nvmft_namespace_commands_total{subsystem=\"nqn.2026-11.dev.nvmf-target:m\",nsid=\"1\",op=\"read\"} 1",
        "nvmft_namespace_backend_queue_depth{subsystem=\"nqn.2026-11.dev.nvmf-target:m\",nsid=\"1\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
    }
    let removed: Vec<&str> = text.lines().filter(|l| l.contains("nsid=\"2\"")).collect();
    assert!(removed.is_empty(), "namespace 2 is gone: {removed:#?}");
    assert!(
        text.contains("# HELP nvmft_subsystems Configured subsystems"),
        "{text}"
    );
}

#[test]
fn histogram_buckets_are_seconds_and_cumulative() {
    let mut t = LatencyTotals::default();
    t.buckets[0] = 2; // < 5 us
    t.buckets[3] = 1; // < 50 us
    t.buckets[LATENCY_BOUNDS_US.len()] = 1; // over the last bound
    t.sum_ns = 2_000_000_000;
    let b = latency_buckets(&t);
    assert_eq!(b.len(), LATENCY_BOUNDS_US.len() + 1);
    assert_eq!(b[0], (5e-6, 2));
    assert_eq!(b.last().copied(), Some((f64::INFINITY, 1)));
    let snap = Snapshot {
        ns_latency: vec![(vec![("op", "read".to_string())], t)],
        ..Snapshot::default()
    };
    let mut reg = Registry::with_prefix("nvmft");
    reg.register_collector(Box::new(snap));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
    for line in [
        "nvmft_namespace_latency_seconds_count{op=\"read\"} 4",
        "nvmft_namespace_latency_seconds_sum{op=\"read\"} 2.0",
        "nvmft_namespace_latency_seconds_bucket{le=\"0.000005\",op=\"read\"} 2",
        // Cumulative: the 50 us bucket holds the 2 below 5 us and the 1 below 50 us.
        "nvmft_namespace_latency_seconds_bucket{le=\"0.00005\",op=\"read\"} 3",
        "nvmft_namespace_latency_seconds_bucket{le=\"1.0\",op=\"read\"} 3",
        "nvmft_namespace_latency_seconds_bucket{le=\"+Inf\",op=\"read\"} 4",
    ] {
        assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
    }
}

fn get(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn http_status_codes_and_bounds() {
    let probe = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let sta = crate::engine::for_tests();
    serve(addr, source(sta.stats())).expect("serve");
    // The port is ours now: a second server must fail to bind.
    assert!(serve(addr, source(sta.stats())).is_err());

    let ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(
        ok.contains(&format!("Content-Type: {TEXT_CONTENT_TYPE}\r\n")),
        "{ok}"
    );
    assert!(
        ok.contains("# TYPE nvmft_io_thread_polls_total counter"),
        "{ok}"
    );
    assert!(!ok.contains("# EOF"));

    let om = get(
        addr,
        "GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0\r\n\r\n",
    );
    assert!(
        om.contains(&format!("Content-Type: {OPENMETRICS_CONTENT_TYPE}\r\n")),
        "{om}"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");

    let head = get(addr, "HEAD /metrics HTTP/1.1\r\n\r\n");
    assert!(
        head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"),
        "{head}"
    );

    assert!(get(addr, "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
    assert!(get(addr, "GET /metricsx HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
    let post = get(addr, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert!(
        post.starts_with("HTTP/1.1 405 ") && post.contains("Allow: GET, HEAD"),
        "{post}"
    );
    assert!(get(addr, "hello\r\n\r\n").starts_with("HTTP/1.1 400 "));
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000));
    assert!(get(addr, &huge).starts_with("HTTP/1.1 431 "));
    // The bound is exact: one byte past it is refused, whatever the reads' sizes.
    let head = |n: usize| format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(n));
    let fits = MAX_REQUEST_HEAD - head(0).len();
    assert!(get(addr, &head(fits)).starts_with("HTTP/1.1 200 "));
    assert!(get(addr, &head(fits + 1)).starts_with("HTTP/1.1 431 "));

    // A client that never finishes its request does not block others.
    let mut silent = TcpStream::connect(addr).unwrap();
    silent.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    let t0 = Instant::now();
    assert!(get(addr, "GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200 "));
    assert!(t0.elapsed() < Duration::from_secs(3));
    // ... and is dropped after the deadline.
    silent
        .set_read_timeout(Some(REQUEST_DEADLINE + Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 16];
    let t0 = Instant::now();
    let n = silent.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    assert!(t0.elapsed() <= REQUEST_DEADLINE + Duration::from_secs(1));

    // Each refusal above is counted by its reason (other tests in this process may add
    // to them: at least).
    let text = get(addr, "GET /metrics HTTP/1.1\r\n\r\n");
    for (reason, least) in [
        ("bad_request", 1),
        ("not_found", 2),
        ("method_not_allowed", 1),
        ("head_too_large", 2),
        ("head_timeout", 1),
    ] {
        let prefix = format!("nvmft_metrics_requests_refused_total{{reason=\"{reason}\"}} ");
        let n: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("{prefix} missing"))
            .parse()
            .expect("a count");
        assert!(n >= least, "{reason}: {n}");
    }
}

/// When every place is taken, a new connection replaces one still waiting for its
/// request, or one whose response is slow: the oldest of the address holding the most;
/// connections being answered (not slowly) are never cut, and with none to cut the
/// answer is 503 (`None`).
#[test]
fn a_new_connection_replaces_the_oldest_idle_one_of_the_busiest_address() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stream = || std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
        "10.0.0.1".parse().unwrap(),
        "10.0.0.2".parse().unwrap(),
        "10.0.0.3".parse().unwrap(),
    );
    let t0 = Instant::now();
    let mut live = Live::default();
    // a: 5 connections, b: 3 (one being answered).
    let mut ids = Vec::new();
    for ip in [b, a, a, b, a, a, b, a] {
        ids.push((ip, live.admit(&stream(), ip, t0).unwrap()));
    }
    live.head_read(ids[0].1, t0);
    let count = |live: &Live, ip: IpAddr| live.conns.iter().filter(|x| x.ip == ip).count();
    // c comes: a's oldest (ids[1]) goes.
    live.admit(&stream(), c, t0).unwrap();
    assert!(live.conns.iter().all(|x| x.id != ids[1].1));
    assert_eq!(count(&live, a), 4);
    // Until a and b are level, a loses; then the oldest waiting of either.
    live.admit(&stream(), c, t0).unwrap();
    assert_eq!(count(&live, a), 3);
    // Now a 3, b 3 (b's oldest is being answered), c 2: a's oldest waiting is ids[4]
    // (id 5), b's is ids[3] (id 4): b's is older and goes.
    live.admit(&stream(), c, t0).unwrap();
    assert!(live.conns.iter().all(|x| x.id != ids[3].1));
    // Every connection being answered: no place.
    for x in live.conns.iter_mut() {
        x.head_at = Some(t0);
    }
    assert_eq!(live.admit(&stream(), c, t0), None);
    assert_eq!(live.conns.len(), MAX_CONNECTIONS);
    // Answers that take longer than SLOW_RESPONSE may be cut: a and c hold 3 each, b 2,
    // so the older of a's and c's oldest goes: a's ids[4].
    let later = t0 + SLOW_RESPONSE;
    assert_eq!(
        (count(&live, a), count(&live, b), count(&live, c)),
        (3, 2, 3)
    );
    live.admit(&stream(), b, later).unwrap();
    assert!(live.conns.iter().all(|x| x.id != ids[4].1));
    assert_eq!(live.conns.len(), MAX_CONNECTIONS);
}

/// Hosts past the first MAX_HOST_LABELS of a subsystem are summed under one
/// `host="(others)"` series (peers choose host NQNs, discovery needs no allow list), and
/// the totals stay exact.
#[test]
fn host_labels_are_capped_per_subsystem() {
    use nvmf::target::report::ControllerReport;
    let ctrl = |i: usize, sub: &str| ControllerReport {
        cntlid: i as u16,
        subnqn: sub.to_string(),
        hostnqn: format!("nqn.2026-11.dev.example:h{i:04}"),
        is_discovery: false,
        enabled: true,
        admin_queue: i as u64,
        io_queues: vec![(1, 10_000 + i as u64)],
        errors: 0,
        kato_ms: 0,
        retired: false,
    };
    let n = MAX_HOST_LABELS + 72;
    let mut controllers: Vec<ControllerReport> = (0..n)
        .map(|i| ctrl(i, "nqn.2026-11.dev.example:a"))
        .collect();
    controllers.push(ctrl(1, "nqn.2026-11.dev.example:b"));
    let sta = crate::engine::for_tests();
    let mut src = source(sta.stats());
    src.report = Box::new(move || TargetReport {
        controllers: controllers.clone(),
        ..Default::default()
    });
    let text = openmetrics_to_text(&scrape(&src));
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("nvmft_controllers{"))
        .collect();
    let of_a: Vec<&&str> = series.iter().filter(|l| l.contains(":a\"")).collect();
    assert_eq!(of_a.len(), MAX_HOST_LABELS + 1, "{series:#?}");
    assert!(
        of_a.iter()
            .any(|l| l.contains("host=\"(others)\"") && l.ends_with(" 72")),
        "{series:#?}"
    );
    assert!(
        series
            .iter()
            .any(|l| l.contains(":b\"") && l.contains("h0001") && l.ends_with(" 1")),
        "another subsystem has its own count: {series:#?}"
    );
    let queues: u64 = text
        .lines()
        .filter(|l| l.starts_with("nvmft_connections{") && l.contains(":a\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(queues, 2 * n as u64, "every queue counted once");
}
