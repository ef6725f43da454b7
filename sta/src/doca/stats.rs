//! The doca engine's counters as [`crate::stats::StatsSource`]: per namespace from
//! `doca_sta_get_ns_stats`, per IO context from the engine's own counters (capsules
//! handed up, progress passes, QPs) plus the offloaded capsules of the completion
//! execution unit with the context's index (`doca_sta_get_eu_handle`, type
//! `DOCA_STA_EU_COMP`, `doca_sta_get_eu_stats`).
//!
//! Counter names: no public source lists DOCA's (doca-sta-api.md 10). We read the names
//! the DOCA double uses (`read_cmds`, `write_cmds`, `flush_cmds`, `read_bytes`,
//! `write_bytes`, `errors`; EU `offloaded`); a name the library does not report counts
//! as 0. DOCA keeps no latency histograms or per-status error counts: those stay 0 under
//! this engine, and /metrics says so by their absence of growth, not by invention.
//!
//! Threads: these getters run on the metrics thread while IO threads progress. DOCA does
//! not document their thread safety; SPDK calls them from its RPC thread while its pollers
//! run, and the main-context objects they name are kept alive by the state lock held here.

use std::ffi::{c_char, CStr};
use std::sync::atomic::Ordering;

use doca_sys::*;

use super::{lib, lock, Core, MainState};
use crate::stats::{NsTotals, StatsSource, ThreadTotals};
use crate::SubsysId;

/// (name, value) pairs of a DOCA counter array.
fn entries(p: *const doca_sta_eu_ctr_entry, n: u16) -> Vec<(String, u64)> {
    if p.is_null() {
        return Vec::new();
    }
    (0..n as usize)
        .filter_map(|i| {
            // SAFETY: DOCA returned `n` entries at `p`; each names a live counter.
            unsafe {
                let e = &*p.add(i);
                if e.name.is_null() || e.val.is_null() {
                    return None;
                }
                Some((
                    CStr::from_ptr(e.name as *const c_char)
                        .to_string_lossy()
                        .into_owned(),
                    e.val.read_volatile(),
                ))
            }
        })
        .collect()
}

fn get(v: &[(String, u64)], name: &str) -> u64 {
    v.iter().find(|(n, _)| n == name).map_or(0, |(_, x)| *x)
}

impl Core {
    /// Counters of a live namespace plus what it had counted before a removal.
    pub(super) fn ns_totals_locked(&self, st: &MainState, subsys: SubsysId, nsid: u32) -> NsTotals {
        let mut t = st
            .stats_base
            .get(&(subsys.0, nsid))
            .copied()
            .unwrap_or_default();
        let Some(s) = st.subsys.get(&subsys.0) else {
            return t;
        };
        let Some(ns) = s.ns.get(&nsid).filter(|n| !n.raw.is_null()) else {
            return t;
        };
        let d = lib();
        let (mut p, mut n) = (std::ptr::null(), 0u16);
        // SAFETY: live subsystem and namespace (the state lock keeps them so); the array
        // is the library's.
        if unsafe { (d.doca_sta_get_ns_stats)(s.raw, ns.raw, &mut p, &mut n) } != DOCA_SUCCESS {
            return t;
        }
        let v = entries(p, n);
        t.read_cmds += get(&v, "read_cmds");
        t.write_cmds += get(&v, "write_cmds");
        t.other_cmds += get(&v, "flush_cmds");
        t.read_bytes += get(&v, "read_bytes");
        t.write_bytes += get(&v, "write_bytes");
        t.errors += get(&v, "errors");
        // Unclassified: DOCA does not say which status each error had.
        t.errors_by_status[crate::stats::ERROR_STATUSES.len()] += get(&v, "errors");
        if !ns.be.beq.is_null() && !ns.be.be.is_null() {
            let (mut p, mut n) = (std::ptr::null(), 0u16);
            // SAFETY: a live backend and queue of ours.
            if unsafe { (d.doca_sta_get_be_queue_stats)(ns.be.be, ns.be.beq, &mut p, &mut n) }
                == DOCA_SUCCESS
            {
                let v = entries(p, n);
                t.queue_depth = get(&v, "submitted")
                    .saturating_sub(get(&v, "completed"))
                    .saturating_sub(get(&v, "errors"));
            }
        }
        t
    }

    /// `offloaded` of the completion EU whose id is each IO context's index.
    fn offloaded_by_eu(&self, n: usize) -> Vec<u64> {
        let d = lib();
        let mut out = vec![0u64; n];
        let mut max = 0u32;
        // SAFETY: the live main context.
        if unsafe { (d.doca_sta_get_max_num_eus_available)(self.sta, &mut max) } != DOCA_SUCCESS {
            return out;
        }
        let mut arr = vec![std::ptr::null_mut(); max.min(4096) as usize];
        let mut k = arr.len() as u32;
        // SAFETY: an array of `k` entries.
        if unsafe { (d.doca_sta_get_eu_handle)(self.sta, arr.as_mut_ptr(), &mut k) } != DOCA_SUCCESS
        {
            return out;
        }
        for eu in arr.into_iter().take(k as usize) {
            let (mut typ, mut id) = (0, 0u16);
            // SAFETY: EU handles the library just returned.
            unsafe {
                if (d.doca_sta_get_eu_type)(eu, &mut typ) != DOCA_SUCCESS
                    || typ != DOCA_STA_EU_COMP
                    || (d.doca_sta_get_eu_id)(eu, &mut id) != DOCA_SUCCESS
                {
                    continue;
                }
            }
            let Some(slot) = out.get_mut(id as usize) else {
                continue;
            };
            let (mut p, mut n) = (std::ptr::null(), 0u16);
            // SAFETY: as above.
            if unsafe { (d.doca_sta_get_eu_stats)(eu, &mut p, &mut n) } == DOCA_SUCCESS {
                *slot += get(&entries(p, n), "offloaded");
            }
        }
        out
    }
}

impl StatsSource for Core {
    fn namespace(&self, subsys: SubsysId, nsid: u32) -> NsTotals {
        let st = lock(&self.state);
        self.ns_totals_locked(&st, subsys, nsid)
    }

    fn namespaces(&self) -> Vec<(SubsysId, u32)> {
        let st = lock(&self.state);
        let mut v: Vec<(SubsysId, u32)> = st
            .stats_base
            .keys()
            .map(|(s, n)| (SubsysId(*s), *n))
            .collect();
        for (sid, s) in &st.subsys {
            v.extend(s.ns.keys().map(|n| (SubsysId(*sid), *n)));
        }
        v.sort_by_key(|(s, n)| (s.0, *n));
        v.dedup();
        v
    }

    fn threads(&self) -> Vec<ThreadTotals> {
        let st = lock(&self.state);
        let off = self.offloaded_by_eu(st.threads.len());
        st.threads
            .iter()
            .zip(off)
            .map(|(c, offloaded)| ThreadTotals {
                offloaded,
                non_offloaded: c.non_offloaded.load(Ordering::Relaxed),
                busy_polls: c.busy.load(Ordering::Relaxed),
                idle_polls: c.idle.load(Ordering::Relaxed),
                qps: c.qps.load(Ordering::Relaxed),
                // The bounds and deadlines on peers are the DPA's (DOCA STA reports no
                // such counters); none is counted here.
                limit_hits: Default::default(),
            })
            .collect()
    }
}
