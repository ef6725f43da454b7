//! Engine statistics as the application reads them: per-namespace totals (commands, bytes,
//! errors by NVMe status, latency histograms, backend queue depth) and per-IO-thread
//! totals (offloaded and non-offloaded capsules, busy and idle passes, QPs).
//!
//! How an engine keeps them is its own business: the soft engine counts per IO thread in
//! single-writer atomics and sums them when read (`soft::counters`); a DOCA engine would
//! read `doca_sta_get_ns_stats` / `doca_sta_get_eu_stats` (DOCA STA's statistics calls).
//! Reading never takes a lock the data path holds.

use std::sync::Arc;

use nvmf::spec::Status;

use crate::SubsysId;

/// Upper bounds (µs) of the latency histogram buckets; a last bucket catches the rest.
pub const LATENCY_BOUNDS_US: [u64; 14] = [
    5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 50_000, 100_000, 1_000_000,
];

/// Index of the latency bucket a duration of `ns` nanoseconds falls in.
pub fn latency_bucket(ns: u64) -> usize {
    let us = ns / 1000;
    LATENCY_BOUNDS_US
        .iter()
        .position(|&b| us < b)
        .unwrap_or(LATENCY_BOUNDS_US.len())
}

/// Summed histogram: per-bucket counts (not cumulative) and the total in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyTotals {
    pub buckets: [u64; LATENCY_BOUNDS_US.len() + 1],
    pub sum_ns: u64,
}

impl LatencyTotals {
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// The error statuses counted one by one (everything else is counted as "other"): the
/// ones the engine and its backends produce. Label, status.
pub const ERROR_STATUSES: [(&str, Status); 22] = [
    ("lba_out_of_range", Status::LBA_OUT_OF_RANGE),
    ("capacity_exceeded", Status::CAPACITY_EXCEEDED),
    ("invalid_field", Status::INVALID_FIELD),
    ("invalid_opcode", Status::INVALID_OPCODE),
    ("invalid_namespace", Status::INVALID_NAMESPACE),
    ("data_sgl_length_invalid", Status::DATA_SGL_LENGTH_INVALID),
    (
        "sgl_descriptor_type_invalid",
        Status::SGL_DESCRIPTOR_TYPE_INVALID,
    ),
    ("sgl_offset_invalid", Status::SGL_OFFSET_INVALID),
    ("internal_error", Status::INTERNAL_ERROR),
    (
        "transient_transport_error",
        Status::TRANSIENT_TRANSPORT_ERROR,
    ),
    ("abort_requested", Status::ABORT_REQUESTED),
    ("aborted_sq_deletion", Status::ABORTED_SQ_DELETION),
    ("namespace_not_ready", Status::NAMESPACE_NOT_READY),
    ("write_fault", Status::WRITE_FAULT),
    ("unrecovered_read_error", Status::UNRECOVERED_READ_ERROR),
    ("compare_failure", Status::COMPARE_FAILURE),
    ("reservation_conflict", Status::RESERVATION_CONFLICT),
    ("ana_inaccessible", Status::ANA_INACCESSIBLE),
    ("ana_persistent_loss", Status::ANA_PERSISTENT_LOSS),
    ("ana_transition", Status::ANA_TRANSITION),
    ("internal_path_error", Status::INTERNAL_PATH_ERROR),
    ("command_interrupted", Status::COMMAND_INTERRUPTED),
];

/// Index into [`ERROR_STATUSES`] (by SCT and SC; DNR does not matter), or its length for
/// "other".
pub fn error_status_index(s: Status) -> usize {
    ERROR_STATUSES
        .iter()
        .position(|(_, e)| e.sct == s.sct && e.sc == s.sc)
        .unwrap_or(ERROR_STATUSES.len())
}

/// One namespace's counters, summed over IO threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NsTotals {
    pub read_cmds: u64,
    pub write_cmds: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub other_cmds: u64,
    pub errors: u64,
    /// [`ERROR_STATUSES`] order, then "other".
    pub errors_by_status: [u64; ERROR_STATUSES.len() + 1],
    /// Requests in the namespace's backend queues now, all threads.
    pub queue_depth: u64,
    pub read_latency: LatencyTotals,
    pub write_latency: LatencyTotals,
    pub other_latency: LatencyTotals,
}

impl NsTotals {
    /// Commands that failed with a media or data integrity error (SCT 2), Compare Failure
    /// and Access Denied excepted (the data differs or access is refused: the media is
    /// fine): what SMART reports as Media and Data Integrity Errors.
    pub fn media_errors(&self) -> u64 {
        ERROR_STATUSES
            .iter()
            .zip(self.errors_by_status)
            .filter(|((_, s), _)| {
                s.sct == nvmf::spec::status::sct::MEDIA
                    && (s.sc, s.sct) != (Status::COMPARE_FAILURE.sc, Status::COMPARE_FAILURE.sct)
                    && (s.sc, s.sct) != (Status::ACCESS_DENIED.sc, Status::ACCESS_DENIED.sct)
            })
            .map(|(_, n)| n)
            .sum()
    }
}

/// One IO context's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadTotals {
    /// Capsules the engine served itself.
    pub offloaded: u64,
    /// Capsules handed to the application.
    pub non_offloaded: u64,
    /// Progress passes that did something, and passes that found nothing to do (the
    /// watchdog takes their sum as a sign of life).
    pub busy_polls: u64,
    pub idle_polls: u64,
    /// QPs the context holds now.
    pub qps: u64,
    /// Hits of each [`crate::Limit`], in [`crate::Limit::ALL`] order.
    pub limit_hits: [u64; crate::Limit::ALL.len()],
}

/// One QP's offloaded I/O, since it was accepted (the application sums a controller's
/// queues; the admin path's commands are the application's own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueTotals {
    pub read_cmds: u64,
    pub write_cmds: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub other_cmds: u64,
    pub errors: u64,
}

/// A live QP's counters: its IO context (creation order, as in
/// [`StatsSource::threads`]) and handle ([`crate::QpHandle::as_u64`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueStats {
    pub thread: usize,
    pub qp: u64,
    pub totals: QueueTotals,
}

/// What an engine implements so that its counters can be read from any thread.
pub trait StatsSource: Send + Sync {
    /// Sum of one namespace's counters over all IO contexts (counters of a namespace that
    /// was removed and re-added keep counting from where they were).
    fn namespace(&self, subsys: SubsysId, nsid: u32) -> NsTotals;
    /// Every (subsystem, nsid) that has counters, once each, sorted.
    fn namespaces(&self) -> Vec<(SubsysId, u32)>;
    /// Per-IO-context counters, in creation order.
    fn threads(&self) -> Vec<ThreadTotals>;
    /// Every live QP's counters. An engine that does not count per QP reports none.
    fn queues(&self) -> Vec<QueueStats> {
        Vec::new()
    }
}

/// A read-only view of an engine's counters, cheap to clone into other threads.
#[derive(Clone)]
pub struct Stats(Arc<dyn StatsSource>);

impl Stats {
    pub fn new(source: Arc<dyn StatsSource>) -> Stats {
        Stats(source)
    }
    /// See [`StatsSource::namespace`].
    pub fn namespace(&self, subsys: SubsysId, nsid: u32) -> NsTotals {
        self.0.namespace(subsys, nsid)
    }
    /// See [`StatsSource::namespaces`].
    pub fn namespaces(&self) -> Vec<(SubsysId, u32)> {
        self.0.namespaces()
    }
    /// See [`StatsSource::threads`].
    pub fn threads(&self) -> Vec<ThreadTotals> {
        self.0.threads()
    }
    /// See [`StatsSource::queues`].
    pub fn queues(&self) -> Vec<QueueStats> {
        self.0.queues()
    }

    /// Hits of every [`crate::Limit`], summed over IO contexts: (label, count), zeros
    /// included, in [`crate::Limit::ALL`] order.
    pub fn limit_hits(&self) -> Vec<(&'static str, u64)> {
        let threads = self.threads();
        crate::Limit::ALL
            .iter()
            .map(|l| {
                let n = threads.iter().map(|t| t.limit_hits[l.index()]).sum();
                (l.label(), n)
            })
            .collect()
    }
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stats")
            .field("threads", &self.threads().len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_follow_the_bounds() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(4_999), 0);
        assert_eq!(latency_bucket(5_000), 1);
        assert_eq!(latency_bucket(999_999_999), LATENCY_BOUNDS_US.len() - 1);
        assert_eq!(latency_bucket(1_000_000_000), LATENCY_BOUNDS_US.len());
    }

    #[test]
    fn media_errors_leave_out_compare_failure() {
        let mut t = NsTotals::default();
        t.errors_by_status[error_status_index(Status::UNRECOVERED_READ_ERROR)] = 2;
        t.errors_by_status[error_status_index(Status::COMPARE_FAILURE)] = 5;
        t.errors_by_status[error_status_index(Status::INVALID_FIELD)] = 7;
        assert_eq!(t.media_errors(), 2);
        assert_eq!(error_status_index(Status::SUCCESS), ERROR_STATUSES.len());
        // What the backends answer for a full store and a drive that did not answer.
        for (s, label) in [
            (Status::CAPACITY_EXCEEDED, "capacity_exceeded"),
            (Status::ABORT_REQUESTED, "abort_requested"),
        ] {
            assert_eq!(ERROR_STATUSES[error_status_index(s)].0, label);
        }
    }
}
