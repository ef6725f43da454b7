//! Counters behind `doca_sta_get_*_stats`: library-owned `doca_sta_eu_ctr_entry` arrays
//! whose `val` points at the live value (doca-sta-api.md 5.17).

use std::ffi::CStr;

use doca_sys::doca_sta_eu_ctr_entry;

pub const EU_COMP: &[&CStr] = &[c"capsules", c"offloaded", c"non_offloaded", c"completions"];
pub const EU_TX: &[&CStr] = &[c"rdma_reads", c"rdma_writes", c"sends", c"errors"];
pub const BEQ: &[&CStr] = &[c"submitted", c"completed", c"errors", c"timeouts"];
pub const NS: &[&CStr] = &[
    c"read_cmds",
    c"write_cmds",
    c"flush_cmds",
    c"read_bytes",
    c"write_bytes",
    c"errors",
];
pub const BEQ_MAP: &[&CStr] = &[c"beq_eu_id"];

pub mod comp {
    pub const CAPSULES: usize = 0;
    pub const OFFLOADED: usize = 1;
    pub const NON_OFFLOADED: usize = 2;
    pub const COMPLETIONS: usize = 3;
}
pub mod tx {
    pub const READS: usize = 0;
    pub const WRITES: usize = 1;
    pub const SENDS: usize = 2;
    pub const ERRORS: usize = 3;
}
pub mod beq {
    pub const SUBMITTED: usize = 0;
    pub const COMPLETED: usize = 1;
    pub const ERRORS: usize = 2;
    pub const TIMEOUTS: usize = 3;
}
pub mod ns {
    pub const READS: usize = 0;
    pub const WRITES: usize = 1;
    pub const FLUSHES: usize = 2;
    pub const READ_BYTES: usize = 3;
    pub const WRITE_BYTES: usize = 4;
    pub const ERRORS: usize = 5;
}

/// Named counters with a stable entry array.
pub struct Counters {
    vals: Box<[u64]>,
    entries: Box<[doca_sta_eu_ctr_entry]>,
}

impl Counters {
    pub fn new(names: &'static [&'static CStr]) -> Counters {
        let vals = vec![0u64; names.len()].into_boxed_slice();
        let entries = names
            .iter()
            .enumerate()
            .map(|(i, n)| doca_sta_eu_ctr_entry {
                name: n.as_ptr(),
                val: &vals[i] as *const u64,
            })
            .collect();
        Counters { vals, entries }
    }
    pub fn add(&mut self, i: usize, by: u64) {
        self.vals[i] = self.vals[i].wrapping_add(by);
    }
    pub fn set(&mut self, i: usize, v: u64) {
        self.vals[i] = v;
    }
    pub fn get(&self, i: usize) -> u64 {
        self.vals[i]
    }
    pub fn reset(&mut self) {
        self.vals.iter_mut().for_each(|v| *v = 0);
    }
    pub fn entries(&self) -> (*const doca_sta_eu_ctr_entry, u16) {
        (self.entries.as_ptr(), self.entries.len() as u16)
    }
}
