//! Harness for the end-to-end tests: runs the `nvmf-target` binary on a loopback port
//! with a config written to a temporary directory, and connects hosts to it with the
//! `nvmf-initiator` crate.
//!
//! Everything is bounded in time: start-up waits at most [`START_TIMEOUT`], a graceful
//! stop at most [`STOP_TIMEOUT`], every host socket operation [`HOST_TIMEOUT`], and
//! [`watchdog`] aborts a test (killing its daemons first) that runs past its budget.
//! `Drop` kills the daemon, so a failing test never leaves one behind; it also prints the
//! daemon's log when the test is failing.

#![allow(dead_code)]

pub mod prom;
pub mod skip;

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use nvmf::spec::Status;
use nvmf_initiator::{Error, HostOptions, TcpHost};

pub const SUBNQN: &str = "nqn.2026-11.dev.nvmf-target:e2e";
/// A subsystem only [`ALLOWED_HOST`] may connect to.
pub const RESTRICTED_NQN: &str = "nqn.2026-11.dev.nvmf-target:restricted";
pub const ALLOWED_HOST: &str =
    "nqn.2014-08.org.nvmexpress:uuid:0b5c1d2e-3f40-4152-8364-a5b6c7d8e9f0";
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

pub const START_TIMEOUT: Duration = Duration::from_secs(10);
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);
pub const HOST_TIMEOUT: Duration = Duration::from_secs(10);

/// Namespace 1: RAM, 64 MiB of 512-byte blocks. Namespace 2: a file, 64 MiB of 4 KiB
/// blocks. The restricted subsystem has one small RAM namespace.
pub const NS1_SIZE: u64 = 64 << 20;
pub const NS1_BLOCK: u32 = 512;
pub const NS2_SIZE: u64 = 64 << 20;
pub const NS2_BLOCK: u32 = 4096;

/// The default test config. `{port}` and `{dir}` are replaced by [`Daemon::start`]. The
/// control socket is in the test's directory (the default, /run/nvmf-target, is one path
/// for every daemon of the machine).
pub const CONFIG: &str = "\
control: {path: \"{dir}/ctl/control.sock\"}
io_threads: 2
listeners:
  - {name: tcp0, transport: tcp, address: 127.0.0.1, port: {port}}
backends:
  - {name: ram0, type: ram, size: 64MiB, block_size: 512}
  - {name: f0, type: file, path: {dir}/f0.img, size: 64MiB, block_size: 4096}
  - {name: ram1, type: ram, size: 4MiB, block_size: 512}
subsystems:
  - nqn: nqn.2026-11.dev.nvmf-target:e2e
    allow_any_host: true
    namespaces:
      - {nsid: 1, backend: ram0}
      - {nsid: 2, backend: f0}
  - nqn: nqn.2026-11.dev.nvmf-target:restricted
    allow_any_host: false
    hosts: [nqn.2014-08.org.nvmexpress:uuid:0b5c1d2e-3f40-4152-8364-a5b6c7d8e9f0]
    namespaces:
      - {nsid: 1, backend: ram1}
";

/// The daemon under test: this build's, or the binary `NVMF_E2E_BIN` names (to run the
/// same tests against another build, e.g. to see a new test fail on the old code).
pub fn daemon_binary() -> PathBuf {
    std::env::var_os("NVMF_E2E_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_nvmf-target")))
}

/// PIDs of every daemon still running, for the watchdog.
static RUNNING: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// One running (or stopped) `nvmf-target` process.
pub struct Daemon {
    dir: tempfile::TempDir,
    template: String,
    port: u16,
    child: Option<Child>,
    starts: u32,
    log_path: PathBuf,
    /// A command the daemon runs under (e.g. `prlimit --nofile=128:128 --`), if any.
    wrapper: Vec<String>,
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

impl Daemon {
    /// Starts the daemon with the default [`CONFIG`].
    pub fn start_default() -> Daemon {
        Daemon::start(CONFIG)
    }

    /// Writes `template` (with `{port}` and `{dir}` filled in) and starts the daemon on
    /// it; waits until the port answers an ICReq. Retries with another port if the one
    /// picked was taken in the meantime.
    pub fn start(template: &str) -> Daemon {
        Daemon::start_under(&[], template)
    }

    /// [`Daemon::start`], with the daemon run by `wrapper` (a command that execs the
    /// rest of its arguments, so the PID is the daemon's).
    pub fn start_under(wrapper: &[&str], template: &str) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("nvmft-e2e-")
            .tempdir()
            .expect("tempdir");
        let mut d = Daemon {
            dir,
            template: template.to_string(),
            port: free_port(),
            child: None,
            starts: 0,
            log_path: PathBuf::new(),
            wrapper: wrapper.iter().map(|s| s.to_string()).collect(),
        };
        for attempt in 0.. {
            match d.try_start() {
                Ok(()) => return d,
                Err(log) if attempt < 3 && is_bind_failure(&log) => d.port = free_port(),
                Err(log) => panic!("nvmf-target did not start; its log:\n{log}"),
            }
        }
        unreachable!()
    }

    /// Starts again with the same config, port and files (after `stop` or `kill9`).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart while running");
        // The port was ours a moment ago; give the kernel a little time if a bind races.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.try_start() {
                Ok(()) => return,
                Err(log) if is_bind_failure(&log) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200))
                }
                Err(log) => panic!("nvmf-target did not restart; its log:\n{log}"),
            }
        }
    }

    fn config_text(&self) -> String {
        self.fill(&self.template)
    }

    /// `template` as this daemon's config file: `{port}` and `{dir}` filled in, and a
    /// control socket in its directory unless the template says where (or that there is
    /// none). Daemons of tests running side by side would otherwise all take the default
    /// path, and one's exit would remove another's socket.
    pub fn fill(&self, template: &str) -> String {
        let mut text = template.to_string();
        if !text.lines().any(|l| l.starts_with("control:")) {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str("control: {path: \"{dir}/control.sock\"}\n");
        }
        text.replace("{port}", &self.port.to_string())
            .replace("{dir}", &self.dir.path().display().to_string())
    }

    fn try_start(&mut self) -> Result<(), String> {
        self.starts += 1;
        let cfg = self.dir.path().join("nvmf-target.yaml");
        std::fs::write(&cfg, self.config_text()).expect("write config");
        self.log_path = self.dir.path().join(format!("daemon-{}.log", self.starts));
        let log = File::create(&self.log_path).expect("create log file");
        let mut cmd = match self.wrapper.split_first() {
            Some((w, args)) => {
                let mut c = Command::new(w);
                c.args(args).arg(daemon_binary());
                c
            }
            None => Command::new(daemon_binary()),
        };
        let child = cmd
            .arg("--config")
            .arg(&cfg)
            .arg("-v")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn nvmf-target");
        RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(child.id());
        self.child = Some(child);

        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.forget_child();
                return Err(format!("(exited early: {st})\n{}", self.log()));
            }
            // Ready when a connection gets its ICResp.
            let probe = HostOptions {
                timeout: Duration::from_millis(500),
                ..HostOptions::default()
            };
            if TcpHost::connect(self.addr(), probe).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill9();
                return Err(format!(
                    "(not answering ICReq on {} after {START_TIMEOUT:?})\n{}",
                    self.addr(),
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }
    pub fn port(&self) -> u16 {
        self.port
    }
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The log (stderr) of the current (or last) run.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_else(|e| format!("<no log: {e}>"))
    }

    /// Every run's log, oldest first.
    pub fn all_logs(&self) -> String {
        let mut s = String::new();
        for i in 1..=self.starts {
            let p = self.dir.path().join(format!("daemon-{i}.log"));
            s += &format!("---- run {i} ----\n");
            s += &std::fs::read_to_string(p).unwrap_or_default();
        }
        s
    }

    /// Still running?
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Sends a signal.
    pub fn signal(&self, sig: Signal) {
        if let Some(pid) = self.pid() {
            kill(Pid::from_raw(pid as i32), sig).expect("kill");
        }
    }

    /// SIGTERM, then waits for the exit; panics unless the daemon exits with status 0
    /// within [`STOP_TIMEOUT`] (after a SIGKILL on timeout).
    pub fn stop(&mut self) {
        let st = self.stop_within(STOP_TIMEOUT);
        match st {
            Ok(st) if st.success() => {}
            Ok(st) => panic!(
                "nvmf-target exited with {st} on SIGTERM; log:\n{}",
                self.log()
            ),
            Err(waited) => panic!(
                "nvmf-target did not exit within {waited:?} of SIGTERM (killed); log:\n{}",
                self.log()
            ),
        }
    }

    /// SIGTERM, then waits up to `limit`; on timeout SIGKILLs and returns `Err(limit)`.
    pub fn stop_within(&mut self, limit: Duration) -> Result<ExitStatus, Duration> {
        self.signal_and_wait(Signal::SIGTERM, limit)
    }

    /// Sends `sig`, then waits up to `limit` for the exit; on timeout SIGKILLs and returns
    /// `Err(limit)`.
    pub fn signal_and_wait(
        &mut self,
        sig: Signal,
        limit: Duration,
    ) -> Result<ExitStatus, Duration> {
        let Some(child) = self.child.as_mut() else {
            panic!("signal {sig}: not running")
        };
        let _ = kill(Pid::from_raw(child.id() as i32), sig);
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                self.forget_child();
                return Ok(st);
            }
            if Instant::now() >= deadline {
                self.kill9();
                return Err(limit);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            unregister(c.id());
        }
    }

    fn forget_child(&mut self) {
        if let Some(c) = self.child.take() {
            unregister(c.id());
        }
    }
}

fn unregister(pid: u32) {
    RUNNING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|&p| p != pid);
}

fn is_bind_failure(log: &str) -> bool {
    log.contains("bind") && (log.contains("in use") || log.contains("AddrInUse"))
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "==== nvmf-target log ({}, port {}) ====\n{}\n==== end of log ====",
                self.dir.path().display(),
                self.port,
                self.all_logs()
            );
        }
        self.kill9();
    }
}

/// Aborts the whole test process (after killing every daemon) if the returned guard is
/// not dropped within `limit`: a hung test must not hang the suite.
pub fn watchdog(name: &'static str, limit: Duration) -> Watchdog {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if d.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if d.load(Ordering::SeqCst) {
            return;
        }
        eprintln!("watchdog: test {name} still running after {limit:?}; killing daemons, aborting");
        for pid in RUNNING.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
        std::process::abort();
    });
    Watchdog(done)
}

pub struct Watchdog(Arc<AtomicBool>);

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

// ------------------------------------------------------------------------- hosts

/// Host options with a fresh host NQN/ID and the test timeout.
pub fn host_opts() -> HostOptions {
    HostOptions {
        timeout: HOST_TIMEOUT,
        ..HostOptions::default()
    }
}

/// IOCCSZ*16 - 64 that the target advertises: (64 + 8192) / 16 * 16 - 64.
pub const IO_INCAPSULE: u32 = 8192;

/// Admin queue to `nqn`, connected (KATO 0: no keep-alive) and enabled.
pub fn admin(d: &Daemon, nqn: &str, opts: &HostOptions) -> (TcpHost, u16) {
    let mut h = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq/ICResp (admin)");
    let cntlid = h.connect_admin(nqn, 0).expect("Connect (admin queue)");
    h.enable_controller().expect("CC.EN=1 -> CSTS.RDY");
    (h, cntlid)
}

/// I/O queue `qid` of controller `cntlid`, SQSIZE 31 (0's based).
pub fn io_queue(d: &Daemon, nqn: &str, cntlid: u16, qid: u16, opts: &HostOptions) -> TcpHost {
    let mut h = TcpHost::connect(d.addr(), opts.clone()).expect("ICReq/ICResp (I/O)");
    h.connect_io(nqn, cntlid, qid, 31)
        .unwrap_or_else(|e| panic!("Connect (I/O queue {qid}): {e}"));
    h
}

/// Asks for `n` I/O queues with Set Features (Number of Queues); returns how many
/// submission queues were granted (1-based).
pub fn request_queues(admin: &mut TcpHost, n: u16) -> u16 {
    let n0 = (n - 1) as u32;
    let dw0 = admin
        .set_features(0x07, 0, n0 | n0 << 16, false)
        .expect("Set Features: Number of Queues");
    let nsqa = (dw0 & 0xffff) as u16 + 1;
    let ncqa = (dw0 >> 16) as u16 + 1;
    nsqa.min(ncqa)
}

/// A controller on `SUBNQN` with its admin queue and `n` I/O queues.
pub struct Ctrl {
    pub admin: TcpHost,
    pub cntlid: u16,
    pub io: Vec<TcpHost>,
}

pub fn controller(d: &Daemon, n: u16, opts: &HostOptions) -> Ctrl {
    let (mut admin, cntlid) = admin(d, SUBNQN, opts);
    let granted = request_queues(&mut admin, n);
    assert!(granted >= n, "asked for {n} I/O queues, granted {granted}");
    let io = (1..=n)
        .map(|q| io_queue(d, SUBNQN, cntlid, q, opts))
        .collect();
    Ctrl { admin, cntlid, io }
}

/// The daemon still serves: a fresh connection connects, enables and identifies.
pub fn assert_serves(d: &mut Daemon) {
    assert!(d.is_running(), "the daemon exited; log:\n{}", d.log());
    let opts = host_opts();
    let mut c = controller(d, 1, &opts);
    let id = c
        .admin
        .identify(1, 0)
        .expect("Identify Controller on a fresh connection");
    assert_eq!(u16::from_le_bytes([id[78], id[79]]), c.cntlid);
    let q = &mut c.io[0];
    let data = pattern(0xfeed, 4096);
    assert_ok(q.write(1, 1000, &data, false).expect("write"), "write");
    let mut back = vec![0u8; 4096];
    assert_ok(q.read(1, 1000, 8, &mut back).expect("read"), "read");
    assert!(back == data, "read back differs on a fresh connection");
}

// ------------------------------------------------------------------------- data, status

/// Deterministic bytes for `seed`: no two seeds (or offsets) look alike.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// `(sct, sc)` of a status, the part the tests compare.
pub fn code(s: Status) -> (u8, u8) {
    (s.sct, s.sc)
}

#[track_caller]
pub fn assert_ok(s: Status, what: &str) {
    assert!(s.is_success(), "{what}: expected success, got {s}");
}

#[track_caller]
pub fn assert_status(s: Status, want: Status, what: &str) {
    assert_eq!(code(s), code(want), "{what}: expected {want}, got {s}");
}

/// The status of a helper's `Error::Status`, or a panic naming what went wrong.
#[track_caller]
pub fn err_status<T: std::fmt::Debug>(r: Result<T, Error>, what: &str) -> Status {
    match r {
        Err(Error::Status(s, _)) => s,
        other => panic!("{what}: expected an error status, got {other:?}"),
    }
}

pub fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(b[off..off + 2].try_into().unwrap())
}
pub fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
pub fn le64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}
pub fn le128(b: &[u8], off: usize) -> u128 {
    u128::from_le_bytes(b[off..off + 16].try_into().unwrap())
}
/// A NUL-terminated (or full-length) string field.
pub fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}
/// A space-padded ASCII field.
pub fn padded(b: &[u8]) -> String {
    cstr(b).trim_end_matches(' ').to_string()
}

/// Runs `reqs` on `q` with at most `depth` outstanding; returns the completions in the
/// order of `reqs`.
pub fn run_pipelined(
    q: &mut TcpHost,
    reqs: Vec<nvmf_initiator::Request>,
    depth: usize,
) -> Vec<nvmf_initiator::Completion> {
    let n = reqs.len();
    let mut out: Vec<Option<nvmf_initiator::Completion>> = (0..n).map(|_| None).collect();
    let mut by_cid = std::collections::HashMap::new();
    let mut it = reqs.into_iter().enumerate();
    let depth = depth.clamp(1, q.queue_depth());
    let mut inflight = 0;
    loop {
        while inflight < depth {
            let Some((i, r)) = it.next() else { break };
            let cid = q
                .submit(r)
                .unwrap_or_else(|e| panic!("submit request {i}: {e}"));
            by_cid.insert(cid, i);
            inflight += 1;
        }
        if inflight == 0 {
            break;
        }
        let c = q
            .poll_completion()
            .expect("completion of a pipelined request");
        let i = by_cid
            .remove(&c.cid)
            .expect("completion for a CID we submitted");
        out[i] = Some(c);
        inflight -= 1;
    }
    out.into_iter()
        .map(|c| c.expect("every request completed"))
        .collect()
}

/// Discovery log entries: (TRTYPE, ADRFAM, TRSVCID, TRADDR, SUBNQN).
pub fn discovery_entries(h: &mut TcpHost) -> Vec<(u8, u8, String, String, String)> {
    let head = h.get_log_page(0x70, 0, 0, 1024, false).expect("log header");
    let n = le64(&head, 8) as u32;
    let body = h
        .get_log_page(0x70, 0, 1024, 1024 * n, false)
        .expect("log entries");
    body.chunks(1024)
        .map(|e| {
            (
                e[0],
                e[1],
                padded(&e[32..64]),
                padded(&e[512..768]),
                cstr(&e[256..512]),
            )
        })
        .collect()
}

/// The directory of the DOCA double cargo built for this test run: beside the test binary
/// (`target/<profile>/deps`), as nvmf-target's dev-dependency `doca-double`.
pub fn doca_double_dir() -> PathBuf {
    let deps = std::env::current_exe()
        .expect("test binary")
        .parent()
        .expect("its directory")
        .to_path_buf();
    assert!(
        deps.join("libdoca_sta.so").is_file(),
        "the DOCA double (libdoca_sta.so) is not in {}: `cargo test -p nvmf-target` builds \
         it there, as the dev-dependency doca-double (Cargo.toml); run this test through it",
        deps.display()
    );
    deps
}

/// Sends an Asynchronous Event Request on `admin` without waiting (it completes when the
/// target raises an event); returns its CID.
pub fn submit_aer(admin: &mut TcpHost) -> u16 {
    let mut sqe = nvmf::spec::Sqe::default();
    sqe.set_opcode_cid(nvmf::spec::opcodes::admin::ASYNC_EVENT_REQUEST, 0);
    admin
        .submit(nvmf_initiator::Request::new(
            sqe,
            nvmf_initiator::Xfer::None,
            Vec::new(),
        ))
        .expect("submit AER")
}
