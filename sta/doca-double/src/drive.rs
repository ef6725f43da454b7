//! The RAM drive behind backend queues that have no NVMe drive (SPDK's "null" backend,
//! doca-sta-api.md 5.6: the application gives SQ/CQ memory and a 16-byte doorbell area).
//!
//! It behaves as an NVMe controller's I/O queue pair would: it reads the SQ tail doorbell,
//! fetches 64-byte commands from the SQ ring, moves data through the PRPs (translating the
//! bus addresses back through the application's allocator, as DMA would), posts 16-byte
//! completions with the phase tag to the CQ ring and never overruns the CQ head doorbell.
//! Storage is sparse (4 KiB pages allocated on first write; unwritten blocks read as
//! zeroes), bounded by `DOCA_DOUBLE_NULL_DRIVE_MB` (default 1024) per backend. Commands:
//! Read, Write, Flush; anything else gets Invalid Opcode.

use std::collections::HashMap;

use nvmf::spec::{opcodes, Status};

use crate::mem::{MemMap, PAGE};

pub struct RamDrive {
    pages: HashMap<u64, Box<[u8]>>,
    pub cap: u64,
    /// Test hook: a stalled drive fetches no commands (a hung backend).
    pub stalled: bool,
}

impl Default for RamDrive {
    fn default() -> Self {
        Self::new()
    }
}

impl RamDrive {
    pub fn new() -> RamDrive {
        let mb = std::env::var("DOCA_DOUBLE_NULL_DRIVE_MB")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1024);
        RamDrive {
            pages: HashMap::new(),
            cap: mb << 20,
            stalled: false,
        }
    }

    fn read(&self, off: u64, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            let pos = off + done as u64;
            let (pg, po) = (pos / PAGE as u64, (pos % PAGE as u64) as usize);
            let n = (PAGE - po).min(out.len() - done);
            match self.pages.get(&pg) {
                Some(p) => out[done..done + n].copy_from_slice(&p[po..po + n]),
                None => out[done..done + n].fill(0),
            }
            done += n;
        }
    }

    fn write(&mut self, off: u64, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let pos = off + done as u64;
            let (pg, po) = (pos / PAGE as u64, (pos % PAGE as u64) as usize);
            let n = (PAGE - po).min(data.len() - done);
            let p = self
                .pages
                .entry(pg)
                .or_insert_with(|| vec![0u8; PAGE].into_boxed_slice());
            p[po..po + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }
}

/// The drive's side of one queue pair.
pub struct DriveQueue {
    pub sq_head: u32,
    pub cq_tail: u32,
    pub phase: bool,
}

impl Default for DriveQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl DriveQueue {
    pub fn new() -> DriveQueue {
        DriveQueue {
            sq_head: 0,
            cq_tail: 0,
            phase: true,
        }
    }
}

/// The rings of one queue pair as the drive sees them.
pub struct Rings {
    pub entries: u32,
    pub sq_va: usize,
    pub cq_va: usize,
    pub sq_db_va: usize,
    pub cq_db_va: usize,
}

/// The (virtual address, length) runs a PRP pair describes for `len` bytes.
fn prp_runs(mem: &MemMap, prp1: u64, prp2: u64, len: usize) -> Option<Vec<(usize, usize)>> {
    let mut runs = Vec::new();
    let first = (PAGE - (prp1 as usize % PAGE)).min(len);
    runs.push((mem.to_va(prp1, first)?, first));
    let mut left = len - first;
    if left == 0 {
        return Some(runs);
    }
    if left <= PAGE {
        runs.push((mem.to_va(prp2, left)?, left));
        return Some(runs);
    }
    // PRP2 points at a list (one page of entries is enough for the sizes we send; a list
    // chained through its last entry is followed too).
    let mut list = prp2;
    loop {
        let entries = (PAGE - (list as usize % PAGE)) / 8;
        let lva = mem.to_va(list, entries * 8)?;
        for i in 0..entries {
            // SAFETY: `lva` maps `entries * 8` bytes of the application's memory.
            let e = unsafe { (lva as *const u64).add(i).read_volatile() };
            if i == entries - 1 && left > PAGE {
                list = e;
                break;
            }
            let n = left.min(PAGE);
            runs.push((mem.to_va(e, n)?, n));
            left -= n;
            if left == 0 {
                return Some(runs);
            }
        }
    }
}

fn execute(
    drive: &mut RamDrive,
    mem: &MemMap,
    sqe: &[u8; 64],
    bs_of: &dyn Fn(u32) -> Option<u32>,
) -> Status {
    let dw = |i: usize| u32::from_le_bytes(sqe[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
    let opcode = sqe[0];
    let nsid = dw(1);
    let Some(bs) = bs_of(nsid) else {
        return Status::INVALID_NAMESPACE;
    };
    match opcode {
        opcodes::io::FLUSH => Status::SUCCESS,
        opcodes::io::READ | opcodes::io::WRITE => {
            if sqe[1] & 0xC0 != 0 {
                // PSDT: only PRPs reach a PCIe drive.
                return Status::INVALID_FIELD;
            }
            let slba = dw(10) as u64 | (dw(11) as u64) << 32;
            let blocks = (dw(12) & 0xFFFF) as u64 + 1;
            let len = (blocks * bs as u64) as usize;
            let end = slba
                .checked_add(blocks)
                .and_then(|e| e.checked_mul(bs as u64));
            if end.is_none_or(|e| e > drive.cap) {
                return Status::LBA_OUT_OF_RANGE;
            }
            let prp1 = u64::from_le_bytes(sqe[24..32].try_into().expect("8 bytes"));
            let prp2 = u64::from_le_bytes(sqe[32..40].try_into().expect("8 bytes"));
            let Some(runs) = prp_runs(mem, prp1, prp2, len) else {
                return Status::DATA_TRANSFER_ERROR;
            };
            let mut off = slba * bs as u64;
            for (va, n) in runs {
                // SAFETY: `va..va+n` lies inside one allocation made through the
                // application's allocator (checked by `to_va`), which the double owns
                // while the command is outstanding.
                let s = unsafe { std::slice::from_raw_parts_mut(va as *mut u8, n) };
                if opcode == opcodes::io::READ {
                    drive.read(off, s);
                } else {
                    drive.write(off, s);
                }
                off += n as u64;
            }
            Status::SUCCESS
        }
        _ => Status::INVALID_OPCODE,
    }
}

/// Run the drive on one queue pair: fetch what the SQ tail doorbell says is there, post
/// completions while the CQ has room. Returns how many commands completed.
pub fn service(
    drive: &mut RamDrive,
    q: &mut DriveQueue,
    r: &Rings,
    mem: &MemMap,
    bs_of: &dyn Fn(u32) -> Option<u32>,
) -> u32 {
    if drive.stalled {
        return 0;
    }
    // SAFETY: the doorbells are inside started mmaps the application registered for this
    // queue (checked at be_add_queue); 4-byte aligned reads.
    let tail = unsafe { (r.sq_db_va as *const u32).read_volatile() } % r.entries;
    // SAFETY: as above.
    let cq_head = unsafe { (r.cq_db_va as *const u32).read_volatile() } % r.entries;
    let mut n = 0;
    while q.sq_head != tail {
        if (q.cq_tail + 1) % r.entries == cq_head {
            break; // CQ full: wait for the host to consume
        }
        let mut sqe = [0u8; 64];
        // SAFETY: the SQ ring holds `entries` 64-byte slots (checked at be_add_queue).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (r.sq_va + q.sq_head as usize * 64) as *const u8,
                sqe.as_mut_ptr(),
                64,
            )
        };
        q.sq_head = (q.sq_head + 1) % r.entries;
        let st = execute(drive, mem, &sqe, bs_of);
        let mut cqe = [0u8; 16];
        cqe[8..10].copy_from_slice(&(q.sq_head as u16).to_le_bytes());
        cqe[10..12].copy_from_slice(&1u16.to_le_bytes());
        cqe[12..14].copy_from_slice(&sqe[2..4]);
        let status = st.to_field() | q.phase as u16;
        cqe[14..16].copy_from_slice(&status.to_le_bytes());
        let slot = (r.cq_va + q.cq_tail as usize * 16) as *mut u8;
        // SAFETY: the CQ ring holds `entries` 16-byte slots. The status word (with the
        // phase tag) is written last, as a device's completion write would appear.
        unsafe {
            std::ptr::copy_nonoverlapping(cqe.as_ptr(), slot, 14);
            (slot.add(14) as *mut u16).write_volatile(status.to_le());
        }
        q.cq_tail = (q.cq_tail + 1) % r.entries;
        if q.cq_tail == 0 {
            q.phase = !q.phase;
        }
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_storage_reads_zeroes_and_spans_pages() {
        let mut d = RamDrive::new();
        let data: Vec<u8> = (0..6000u32).map(|i| i as u8).collect();
        d.write(4000, &data);
        let mut out = vec![0xAAu8; 6100];
        d.read(3950, &mut out);
        assert!(out[..50].iter().all(|&b| b == 0));
        assert_eq!(&out[50..6050], &data[..]);
        assert!(out[6050..].iter().all(|&b| b == 0));
    }
}
