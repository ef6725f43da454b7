//! The contract the double checks: each rule, the section of `shared/doca-sta-api.md` it
//! comes from, and what happens when an application breaks it.
//!
//! By default a broken rule aborts the process after printing one line to stderr:
//!
//! ```text
//! doca-double: contract violation in doca_sta_subsystem_add_ns: [order.subsystem-live] ...
//! ```
//!
//! With `DOCA_DOUBLE_CONTRACT=report` in the environment (or after
//! `doca_double_set_contract_mode(1)`), the call instead returns the rule's error code and
//! the message is kept for `doca_double_take_violation()`, so one test process can check
//! many rules.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};

use doca_sys::*;

/// One rule of the contract.
#[derive(Debug)]
pub struct Rule {
    pub id: &'static str,
    /// Where the rule comes from (section of shared/doca-sta-api.md).
    pub cite: &'static str,
    pub text: &'static str,
    /// What the call returns in report mode.
    pub code: doca_error_t,
}

macro_rules! rules {
    ($($name:ident = ($id:literal, $cite:literal, $code:ident, $text:literal);)*) => {
        $(pub const $name: Rule = Rule { id: $id, cite: $cite, text: $text, code: $code };)*
        /// Every rule, for the documentation test.
        pub const ALL: &[&Rule] = &[$(&$name),*];
    };
}

rules! {
    HANDLE = ("arg.handle", "3.1", DOCA_ERROR_INVALID_VALUE,
        "a handle must be one this library returned, of the type the parameter names, and not NULL");
    DESTROYED = ("arg.destroyed", "3.1", DOCA_ERROR_INVALID_VALUE,
        "a destroyed object must not be used again");
    NULL_ARG = ("arg.null", "4", DOCA_ERROR_INVALID_VALUE,
        "pointer parameters (outputs, callbacks, names) must not be NULL");
    RANGE = ("arg.range", "4.1, 4.6, 4.8", DOCA_ERROR_INVALID_VALUE,
        "numeric arguments must be inside the limits the library reports");
    CONFIG_BEFORE_START = ("order.config-before-start", "1 (kind C), 5.3 steps 7-13, 5.8 steps 21-25", DOCA_ERROR_BAD_STATE,
        "configuration calls (task confs, callbacks, allocator, devices, IO count) are made while the owning context is idle");
    START_READY = ("order.start-ready", "5.3 steps 7, 11, 12; 5.8 steps 21-25", DOCA_ERROR_BAD_STATE,
        "a context starts only when configured: the main context needs a network device, the allocator and set_max_sta_io; an IO context needs the non-offload callback and the disconnect, read and write_send task confs");
    MAIN_RUNNING = ("order.main-running", "5.8 (SPDK and the probe create IO contexts after the main context runs)", DOCA_ERROR_BAD_STATE,
        "IO contexts are created and started only while the main context is running");
    IO_COUNT = ("order.io-count", "5.3 step 12", DOCA_ERROR_FULL,
        "no more IO contexts than doca_sta_set_max_sta_io allowed");
    IO_RUNNING = ("order.io-running", "5.9; brief: qp_accept before doca_ctx_start", DOCA_ERROR_BAD_STATE,
        "QPs and IO tasks are used only while their IO context is running");
    IO_THREAD = ("order.io-thread", "4.8 (last paragraph), 5.14", DOCA_ERROR_BAD_STATE,
        "an IO context, its QPs, tasks and PE are used from one thread (the first that used it after start)");
    QP_OWNER = ("order.qp-owner", "4.8 (last paragraph)", DOCA_ERROR_BAD_STATE,
        "a QP is used only with the IO context that allocated it");
    DEV_ADDED = ("order.dev-added", "5.2 step 3, 5.3 step 7, 5.5 step 16", DOCA_ERROR_BAD_STATE,
        "QPs and subsystems use network devices added with doca_sta_add_dev; a QP's device must be one its subsystem was given with doca_sta_subsystem_add_dev");
    QP_STATE = ("state.qp", "4.8, 5.9", DOCA_ERROR_BAD_STATE,
        "QP calls follow alloc -> accept -> established; accept once, established once, subsystem once");
    SQ_SIZE = ("state.sq-size", "4.8 (connect_set_sq_size), 5.10 step 4", DOCA_ERROR_BAD_STATE,
        "connect_set_sq_size is called once per QP, while a non-offloaded command (the Fabrics Connect) is outstanding, with 1 <= sq_size < max_io_queue_size");
    QP_DESTROY = ("teardown.qp", "5.11", DOCA_ERROR_BAD_STATE,
        "an accepted QP is destroyed only after its disconnect task completed");
    TASK_CONF = ("order.task-conf", "1 (kind T), 5.3 steps 9-10, 5.8 steps 21-25", DOCA_ERROR_BAD_STATE,
        "a task is allocated only after its completion callbacks were configured");
    TASK_STATE = ("state.task", "3.4 (task ownership), 5.10 step 7", DOCA_ERROR_BAD_STATE,
        "a submitted task is neither submitted again nor freed before its callback ran");
    PROGRESS_IN_CB = ("order.progress-in-callback", "3.4", DOCA_ERROR_BAD_STATE,
        "doca_pe_progress is never called from inside a callback");
    COMMAND = ("state.command", "3.4 (non_offload_user_data), 5.10", DOCA_ERROR_BAD_STATE,
        "a response task names a command the non-offload callback handed up on that QP and that has no answer yet");
    RDMA_READ = ("state.rdma-read", "5.10 steps 2-3", DOCA_ERROR_BAD_STATE,
        "rdma_read is for a command with a keyed host buffer whose data is not in the payload yet");
    WRITE_SEND = ("state.write-send", "5.10 step 5", DOCA_ERROR_BAD_STATE,
        "rdma_write_send is for a command with a keyed host buffer to write to");
    SUBSYS_NS = ("teardown.subsystem", "4.6 (destroy: only once it has no namespaces), 5.12", DOCA_ERROR_IN_USE,
        "a subsystem is destroyed only without namespaces and without QPs bound to it");
    NS_ARGS = ("arg.namespace", "4.6 (add_ns), 4.1 (is_logical_block_size_supported)", DOCA_ERROR_INVALID_VALUE,
        "a namespace has a front-end NSID in 1..=0xFFFFFFFE unused in its subsystem, a backend NSID >= 1 and a supported block size");
    NS_STATE = ("state.namespace", "4.6, 5.12", DOCA_ERROR_BAD_STATE,
        "a namespace is removed once, through its own subsystem");
    BE_TEARDOWN = ("teardown.backend", "4.5, 5.13", DOCA_ERROR_IN_USE,
        "a backend is destroyed only after its queues were destroyed and no namespace uses it");
    BE_QUEUE = ("arg.be-queue", "4.5 (be_add_queue), 5.6", DOCA_ERROR_INVALID_VALUE,
        "backend queue rings are started mmaps on the STA device, SQ 64 and CQ 16 bytes per entry, the same power-of-two entry count (2..=65536), doorbells inside their mmap");
    BE_QUEUE_STATE = ("state.be-queue", "4.5, 5.13", DOCA_ERROR_BAD_STATE,
        "a backend queue is destroyed once, by its task");
    MMAP_STATE = ("state.mmap", "5.6 (create, add_dev, memrange, permissions, start)", DOCA_ERROR_BAD_STATE,
        "an mmap is configured before doca_mmap_start, started with a memory range, and not destroyed while a backend queue uses it");
    CTX_STATE = ("state.ctx", "5.3 step 14, 5.15, 6 (core semantics)", DOCA_ERROR_BAD_STATE,
        "doca_ctx_start on an idle context, doca_ctx_stop on a started one; a context is connected to one PE, before start");
    TEARDOWN = ("teardown.leak", "5.15, 5.16", DOCA_ERROR_IN_USE,
        "objects are destroyed children first: QPs before their IO context, IO contexts, subsystems and backends before the main context, contexts before their PE, users of a device before doca_dev_close; contexts are stopped before they are destroyed");
    ALLOCATOR = ("arg.allocator", "3.4 (allocator semantics), 5.4", DOCA_ERROR_NO_MEMORY,
        "the registered allocator returns zeroed, aligned memory that vtophys translates in one contiguous run");
}

static REPORT_MODE: AtomicBool = AtomicBool::new(false);
static INIT: Once = Once::new();
static VIOLATIONS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn init() {
    INIT.call_once(|| {
        if std::env::var("DOCA_DOUBLE_CONTRACT").as_deref() == Ok("report") {
            REPORT_MODE.store(true, Ordering::Relaxed);
        }
    });
}

pub fn set_report_mode(on: bool) {
    init();
    REPORT_MODE.store(on, Ordering::Relaxed);
}

/// Oldest violation reported and not taken yet.
pub fn take() -> Option<String> {
    let mut v = VIOLATIONS.lock().unwrap_or_else(|e| e.into_inner());
    if v.is_empty() {
        None
    } else {
        Some(v.remove(0))
    }
}

/// The call `func` broke `rule`: abort, or (report mode) record and return the rule's code.
#[cold]
pub fn violation(func: &str, rule: &Rule, detail: impl std::fmt::Display) -> doca_error_t {
    init();
    let msg = format!(
        "doca-double: contract violation in {func}: [{}] {} (doca-sta-api.md {}): {detail}",
        rule.id, rule.text, rule.cite
    );
    if REPORT_MODE.load(Ordering::Relaxed) {
        VIOLATIONS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(msg);
        rule.code
    } else {
        eprintln!("{msg}");
        std::process::abort();
    }
}

/// A rule broken inside a call: carried up to the exported function, which reports it.
#[derive(Debug)]
pub struct Broken {
    pub rule: &'static Rule,
    pub detail: String,
}

impl Broken {
    pub fn new(rule: &'static Rule, detail: impl Into<String>) -> Broken {
        Broken {
            rule,
            detail: detail.into(),
        }
    }
}

/// What an internal call returns: a DOCA error code (not a violation) or a broken rule.
#[derive(Debug)]
pub enum Fail {
    Code(doca_error_t),
    Rule(Broken),
}

impl From<Broken> for Fail {
    fn from(b: Broken) -> Fail {
        Fail::Rule(b)
    }
}

pub type Res<T> = Result<T, Fail>;

/// Shorthand: fail with a broken rule.
pub fn broken<T>(rule: &'static Rule, detail: impl Into<String>) -> Res<T> {
    Err(Fail::Rule(Broken::new(rule, detail)))
}

/// Shorthand: fail with a plain DOCA error code.
pub fn code<T>(c: doca_error_t) -> Res<T> {
    Err(Fail::Code(c))
}

/// Turn an internal result into the C return value, reporting a broken rule.
pub fn finish(func: &str, r: Res<()>) -> doca_error_t {
    match r {
        Ok(()) => DOCA_SUCCESS,
        Err(Fail::Code(c)) => c,
        Err(Fail::Rule(b)) => violation(func, b.rule, b.detail),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_rule_is_documented_in_the_readme() {
        let readme = include_str!("../README.md");
        for r in super::ALL {
            assert!(
                readme.contains(&format!("| `{}` | {} |", r.id, r.cite)),
                "{} missing from README.md",
                r.id
            );
        }
        let mut ids: Vec<&str> = super::ALL.iter().map(|r| r.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), super::ALL.len(), "rule ids are unique");
    }
}
