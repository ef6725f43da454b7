//! The soft engine's counters: written by one IO thread each (plain loads and stores, no
//! locked instruction, no shared cache line written by two threads) and summed over
//! threads when the application reads [`crate::Stats`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nvmf::spec::Status;

use crate::stats::{
    error_status_index, latency_bucket, LatencyTotals, NsTotals, QueueStats, QueueTotals,
    StatsSource, ThreadTotals, ERROR_STATUSES, LATENCY_BOUNDS_US,
};
use crate::SubsysId;

/// Single-writer increment: a plain load and store, no locked instruction.
#[inline]
pub(crate) fn bump(c: &AtomicU64, by: u64) {
    c.store(
        c.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

/// A latency histogram written by one thread and read by scrapers.
#[derive(Debug, Default)]
pub(crate) struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    sum_ns: AtomicU64,
}

impl LatencyHistogram {
    #[inline]
    pub(crate) fn record(&self, ns: u64) {
        bump(&self.buckets[latency_bucket(ns)], 1);
        bump(&self.sum_ns, ns);
    }

    fn add_to(&self, t: &mut LatencyTotals) {
        for (t, b) in t.buckets.iter_mut().zip(self.buckets.iter()) {
            *t += b.load(Ordering::Relaxed);
        }
        t.sum_ns += self.sum_ns.load(Ordering::Relaxed);
    }
}

/// Per-(thread, namespace) I/O counters.
#[derive(Debug, Default)]
pub(crate) struct NsCounters {
    pub read_cmds: AtomicU64,
    pub write_cmds: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub other_cmds: AtomicU64,
    pub errors: AtomicU64,
    /// Errors by status: [`ERROR_STATUSES`] order, then "other".
    pub errors_by_status: [AtomicU64; ERROR_STATUSES.len() + 1],
    /// Requests this thread has in the namespace's backend queue right now (a gauge).
    pub queue_depth: AtomicU64,
    /// Capsule arrival to completion queued, per operation.
    pub read_latency: LatencyHistogram,
    pub write_latency: LatencyHistogram,
    pub other_latency: LatencyHistogram,
}

impl NsCounters {
    #[inline]
    pub(crate) fn count_error(&self, s: Status) {
        bump(&self.errors, 1);
        bump(&self.errors_by_status[error_status_index(s)], 1);
    }

    fn add_to(&self, t: &mut NsTotals) {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        t.read_cmds += l(&self.read_cmds);
        t.write_cmds += l(&self.write_cmds);
        t.read_bytes += l(&self.read_bytes);
        t.write_bytes += l(&self.write_bytes);
        t.other_cmds += l(&self.other_cmds);
        t.errors += l(&self.errors);
        for (t, c) in t
            .errors_by_status
            .iter_mut()
            .zip(self.errors_by_status.iter())
        {
            *t += l(c);
        }
        t.queue_depth += l(&self.queue_depth);
        self.read_latency.add_to(&mut t.read_latency);
        self.write_latency.add_to(&mut t.write_latency);
        self.other_latency.add_to(&mut t.other_latency);
    }
}

/// Per-QP offloaded I/O counters, written by the QP's thread.
#[derive(Debug, Default)]
pub(crate) struct QueueCounters {
    pub read_cmds: AtomicU64,
    pub write_cmds: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub other_cmds: AtomicU64,
    pub errors: AtomicU64,
}

impl QueueCounters {
    fn totals(&self) -> QueueTotals {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        QueueTotals {
            read_cmds: l(&self.read_cmds),
            write_cmds: l(&self.write_cmds),
            read_bytes: l(&self.read_bytes),
            write_bytes: l(&self.write_bytes),
            other_cmds: l(&self.other_cmds),
            errors: l(&self.errors),
        }
    }
}

/// Per-IO-thread engine counters.
#[derive(Debug, Default)]
pub(crate) struct ThreadCounters {
    pub offloaded: AtomicU64,
    pub non_offloaded: AtomicU64,
    pub busy_polls: AtomicU64,
    pub idle_polls: AtomicU64,
    pub qps: AtomicU64,
    /// Live QPs' counters by handle (locked when a QP comes and goes, and by readers;
    /// never per command).
    queues: Mutex<Vec<(u64, Arc<QueueCounters>)>>,
    /// Hits of each [`crate::Limit`], in [`crate::Limit::ALL`] order.
    pub limit_hits: [AtomicU64; crate::Limit::ALL.len()],
}

impl ThreadCounters {
    #[inline]
    pub(crate) fn hit(&self, l: crate::Limit) {
        bump(&self.limit_hits[l.index()], 1);
    }

    /// Counters for a new QP.
    pub(crate) fn add_queue(&self, qp: u64) -> Arc<QueueCounters> {
        let c = Arc::new(QueueCounters::default());
        self.queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((qp, c.clone()));
        c
    }

    /// The QP is gone: its counters go with it.
    pub(crate) fn remove_queue(&self, qp: u64) {
        self.queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(h, _)| *h != qp);
    }
}

/// Every thread's counters, registered as threads and namespaces appear (the only lock,
/// taken at registration and by readers, never on the data path).
///
/// A namespace's counters on one thread live as long as the thread serves it. Counters
/// no thread uses any more are handed to the next thread that serves the same namespace
/// (its totals stay cumulative across a removal and re-add), and those of a destroyed
/// subsystem are dropped: adding and removing namespaces by reload, however often,
/// keeps this bounded.
#[derive(Default)]
pub(crate) struct StatsRegistry {
    ns: Mutex<NsRegistry>,
    threads: Mutex<Vec<Arc<ThreadCounters>>>,
}

#[derive(Default)]
struct NsRegistry {
    list: Vec<(SubsysId, u32, Arc<NsCounters>)>,
    /// Destroyed subsystems whose counters some thread may still hold.
    gone: Vec<SubsysId>,
}

impl NsRegistry {
    /// Drops the counters of destroyed subsystems that no thread holds.
    fn prune(&mut self) {
        if self.gone.is_empty() {
            return;
        }
        let gone = &self.gone;
        self.list
            .retain(|(s, _, c)| !gone.contains(s) || Arc::strong_count(c) > 1);
        let list = &self.list;
        self.gone.retain(|g| list.iter().any(|(s, _, _)| s == g));
    }
}

impl StatsRegistry {
    pub(crate) fn register_ns(&self, subsys: SubsysId, nsid: u32) -> Arc<NsCounters> {
        let mut r = self.ns.lock().unwrap_or_else(|e| e.into_inner());
        r.prune();
        // Counters of this namespace that no thread holds (it was removed here before).
        let idle = r
            .list
            .iter()
            .find(|(s, n, c)| *s == subsys && *n == nsid && Arc::strong_count(c) == 1);
        if let Some((_, _, c)) = idle {
            // A gauge, not a total: the new holder publishes its own.
            c.queue_depth.store(0, Ordering::Relaxed);
            return c.clone();
        }
        let c = Arc::new(NsCounters::default());
        r.list.push((subsys, nsid, c.clone()));
        c
    }

    /// The subsystem is destroyed: its counters go once no thread holds them.
    pub(crate) fn forget_subsystem(&self, subsys: SubsysId) {
        let mut r = self.ns.lock().unwrap_or_else(|e| e.into_inner());
        r.gone.push(subsys);
        r.prune();
    }

    pub(crate) fn register_thread(&self) -> Arc<ThreadCounters> {
        let c = Arc::new(ThreadCounters::default());
        self.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(c.clone());
        c
    }
}

impl StatsSource for StatsRegistry {
    fn namespace(&self, subsys: SubsysId, nsid: u32) -> NsTotals {
        let r = self.ns.lock().unwrap_or_else(|e| e.into_inner());
        let mut t = NsTotals::default();
        for (_, _, c) in r.list.iter().filter(|(s, n, _)| *s == subsys && *n == nsid) {
            c.add_to(&mut t);
        }
        t
    }

    fn namespaces(&self) -> Vec<(SubsysId, u32)> {
        let r = self.ns.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<(SubsysId, u32)> = r.list.iter().map(|(s, n, _)| (*s, *n)).collect();
        v.sort_by_key(|(s, n)| (s.0, *n));
        v.dedup();
        v
    }

    fn threads(&self) -> Vec<ThreadTotals> {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|c| ThreadTotals {
                offloaded: l(&c.offloaded),
                non_offloaded: l(&c.non_offloaded),
                busy_polls: l(&c.busy_polls),
                idle_polls: l(&c.idle_polls),
                qps: l(&c.qps),
                limit_hits: std::array::from_fn(|i| l(&c.limit_hits[i])),
            })
            .collect()
    }

    fn queues(&self) -> Vec<QueueStats> {
        let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for (thread, t) in threads.iter().enumerate() {
            let queues = t.queues.lock().unwrap_or_else(|e| e.into_inner());
            out.extend(queues.iter().map(|(qp, c)| QueueStats {
                thread,
                qp: *qp,
                totals: c.totals(),
            }));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_counters_are_reported_per_thread_while_the_qp_lives() {
        let reg = StatsRegistry::default();
        let t0 = reg.register_thread();
        let t1 = reg.register_thread();
        let a = t0.add_queue(7);
        let b = t1.add_queue(7);
        bump(&a.write_cmds, 2);
        bump(&a.write_bytes, 8192);
        bump(&b.read_cmds, 1);
        let mut q = reg.queues();
        q.sort_by_key(|s| s.thread);
        assert_eq!(q.len(), 2);
        assert_eq!((q[0].thread, q[0].qp), (0, 7));
        assert_eq!((q[0].totals.write_cmds, q[0].totals.write_bytes), (2, 8192));
        assert_eq!((q[1].thread, q[1].totals.read_cmds), (1, 1));
        // A closed QP's counters leave with it; the same handle on another thread stays.
        t0.remove_queue(7);
        let q = reg.queues();
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].thread, 1);
    }

    /// Counters no thread holds are handed on for the same namespace (totals stay
    /// cumulative), and a destroyed subsystem's go once nothing holds them: adding and
    /// removing namespaces over and over keeps the registry's size.
    #[test]
    fn removed_namespaces_leave_nothing_behind() {
        let r = StatsRegistry::default();
        let len = || r.ns.lock().unwrap().list.len();
        let (a, b) = (SubsysId(0), SubsysId(1));
        for _ in 0..100 {
            let one = r.register_ns(a, 1);
            let two = r.register_ns(a, 1);
            bump(&one.read_cmds, 1);
            drop((one, two));
        }
        assert_eq!(len(), 2, "two threads' counters for a's namespace 1");
        assert_eq!(
            r.namespace(a, 1).read_cmds,
            100,
            "totals are kept across re-adds"
        );
        let held = r.register_ns(b, 1);
        drop(r.register_ns(b, 2));
        r.forget_subsystem(b);
        assert_eq!(len(), 3, "b's namespace 1 is still held");
        drop(held);
        drop(r.register_ns(a, 2));
        assert_eq!(len(), 3, "b's went once let go; a's namespace 2 came");
        assert!(r.ns.lock().unwrap().gone.is_empty());
    }
}
