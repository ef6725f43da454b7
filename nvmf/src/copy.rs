//! Copy (NVM Command Set 1.0 section 3.2.2, opcode 19h) and fused Compare and Write (NVMe
//! Base 2.0 section 3.4.2): the command fields, source range descriptors (format 0) and
//! the rules an engine applies before it touches the media.
//!
//! - Copy: CDW10-11 SDLBA (destination), CDW12 bits 7:0 NR (0's based number of ranges),
//!   bits 11:8 DESFMT (only format 0 here: OCFS bit 0). The host data is NR + 1 source
//!   range descriptors of 32 bytes: bytes 8-15 SLBA, bytes 16-17 NLB (0's based). Limits
//!   (Identify Namespace MSSRL, MCL, MSRC) are checked here: a range longer than MSSRL, a
//!   total above MCL or more ranges than MSRC + 1 is Command Size Limit Exceeded; a range
//!   or the destination past the end of the namespace is LBA Out of Range.
//! - Fused Compare and Write: the first command (FUSE 01b) is a Compare, the second (FUSE
//!   10b) a Write, adjacent in the submission queue, on the same namespace and the same
//!   LBA range. Anything else fails the first with Command Aborted due to Missing Fused
//!   Command and a lone second the same way ([`fused_pair_status`]).

use crate::spec::{opcodes, Sqe, Status};

/// Bytes of one format 0 source range descriptor.
pub const RANGE_LEN: usize = 32;
/// Most ranges one Copy may carry (MSRC + 1). 128 ranges of 32 bytes are one 4 KiB page.
pub const MAX_RANGES: usize = 128;
/// FUSE values (CDW0 bits 9:8).
pub const FUSE_FIRST: u8 = 0b01;
pub const FUSE_SECOND: u8 = 0b10;
/// Reserved: answered Invalid Field.
pub const FUSE_RESERVED: u8 = 0b11;

/// The limits a namespace advertises for Copy, in logical blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyLimits {
    /// MSSRL: longest single source range.
    pub max_range: u32,
    /// MCL: most blocks one Copy moves.
    pub max_total: u32,
    /// MSRC + 1: most ranges.
    pub max_ranges: usize,
}

impl CopyLimits {
    /// What an engine that copies through one buffer of `max_bytes` can do on a
    /// namespace of `1 << block_shift`-byte blocks.
    pub fn for_buffer(max_bytes: u32, block_shift: u32) -> CopyLimits {
        let blocks = (max_bytes >> block_shift).clamp(1, 1 << 16);
        CopyLimits {
            max_range: blocks,
            max_total: blocks,
            max_ranges: MAX_RANGES,
        }
    }
}

/// Number of source ranges (NR + 1).
pub fn range_count(sqe: &Sqe) -> usize {
    (sqe.cdw12 & 0xff) as usize + 1
}

/// Descriptor format (DESFMT).
pub fn descriptor_format(sqe: &Sqe) -> u8 {
    ((sqe.cdw12 >> 8) & 0xf) as u8
}

/// Destination (SDLBA).
pub fn destination(sqe: &Sqe) -> u64 {
    sqe.slba()
}

/// The blocks a Copy writes: its destination and the sum of its (format 0) source
/// ranges' lengths, read from `data` without any check (`None` if `data` is short). The
/// command may still be refused ([`source_ranges`]); it then writes nothing.
pub fn destination_range(sqe: &Sqe, data: &[u8]) -> Option<(u64, u32)> {
    let n = range_count(sqe);
    let descs = data.get(..n * RANGE_LEN)?;
    let total = descs
        .chunks_exact(RANGE_LEN)
        .map(|d| u32::from(u16::from_le_bytes([d[16], d[17]])) + 1)
        .fold(0u32, u32::saturating_add);
    Some((destination(sqe), total))
}

/// Bytes of host data a Copy carries.
pub fn data_len(sqe: &Sqe) -> usize {
    range_count(sqe) * RANGE_LEN
}

/// Checks the command fields (format, range count) before any data is fetched.
pub fn check_command(sqe: &Sqe, limits: &CopyLimits) -> Result<(), Status> {
    if descriptor_format(sqe) != 0 {
        return Err(Status::INVALID_FIELD);
    }
    if range_count(sqe) > limits.max_ranges {
        return Err(Status::COMMAND_SIZE_LIMIT_EXCEEDED);
    }
    Ok(())
}

/// The (SLBA, NLB) source ranges in `data` (format 0), checked against `limits` and a
/// namespace of `nblocks` blocks; the destination is checked for the total too. Returns
/// the ranges and the total number of blocks.
pub fn source_ranges(
    sqe: &Sqe,
    data: &[u8],
    limits: &CopyLimits,
    nblocks: u64,
) -> Result<(Vec<(u64, u32)>, u64), Status> {
    check_command(sqe, limits)?;
    let n = range_count(sqe);
    if data.len() < n * RANGE_LEN {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    let mut out = Vec::with_capacity(n);
    let mut total: u64 = 0;
    for d in data.chunks_exact(RANGE_LEN).take(n) {
        let slba = u64::from_le_bytes(d[8..16].try_into().unwrap_or_default());
        let nlb = u16::from_le_bytes([d[16], d[17]]) as u32 + 1;
        if nlb > limits.max_range {
            return Err(Status::COMMAND_SIZE_LIMIT_EXCEEDED);
        }
        if slba.checked_add(nlb as u64).is_none_or(|e| e > nblocks) {
            return Err(Status::LBA_OUT_OF_RANGE);
        }
        total += nlb as u64;
        out.push((slba, nlb));
    }
    if total > limits.max_total as u64 {
        return Err(Status::COMMAND_SIZE_LIMIT_EXCEEDED);
    }
    if destination(sqe)
        .checked_add(total)
        .is_none_or(|e| e > nblocks)
    {
        return Err(Status::LBA_OUT_OF_RANGE);
    }
    Ok((out, total))
}

/// Encodes format 0 descriptors (for hosts and tests).
pub fn encode_ranges(ranges: &[(u64, u32)]) -> Vec<u8> {
    let mut out = vec![0u8; ranges.len() * RANGE_LEN];
    for (d, &(slba, nlb)) in out.chunks_exact_mut(RANGE_LEN).zip(ranges) {
        d[8..16].copy_from_slice(&slba.to_le_bytes());
        d[16..18].copy_from_slice(&((nlb - 1) as u16).to_le_bytes());
    }
    out
}

/// Whether `first` (FUSE 01b) and `second` (FUSE 10b) make a Compare and Write pair:
/// `Ok` if so; otherwise the status for the first command (the second then gets Missing
/// Fused too, or runs on its own if it is not fused at all).
pub fn fused_pair_status(first: &Sqe, second: &Sqe) -> Result<(), Status> {
    let ok = first.opcode() == opcodes::io::COMPARE
        && first.fuse() == FUSE_FIRST
        && second.opcode() == opcodes::io::WRITE
        && second.fuse() == FUSE_SECOND
        && first.nsid == second.nsid
        && first.slba() == second.slba()
        && first.nlb() == second.nlb();
    if ok {
        Ok(())
    } else {
        Err(Status::ABORTED_MISSING_FUSED)
    }
}

/// Whether two LBA ranges overlap.
pub fn overlaps(a: (u64, u32), b: (u64, u32)) -> bool {
    a.0 < b.0.saturating_add(b.1 as u64) && b.0 < a.0.saturating_add(a.1 as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn copy_sqe(dest: u64, nr: u32, fmt: u32) -> Sqe {
        let mut s = Sqe {
            nsid: 1,
            cdw10: dest as u32,
            cdw11: (dest >> 32) as u32,
            cdw12: nr | fmt << 8,
            ..Default::default()
        };
        s.set_opcode_cid(opcodes::io::COPY, 1);
        s
    }

    #[test]
    fn format0_descriptors_from_wire_bytes() {
        // Two ranges: LBA 0x10 x 8 blocks, LBA 0x100 x 1 block; to LBA 0x1000.
        let s = copy_sqe(0x1000, 1, 0);
        let mut d = vec![0u8; 64];
        d[8] = 0x10;
        d[16] = 7;
        d[32 + 8 + 1] = 0x01;
        assert_eq!(encode_ranges(&[(0x10, 8), (0x100, 1)]), d);
        let l = CopyLimits::for_buffer(1 << 20, 9);
        assert_eq!(l.max_range, 2048);
        assert_eq!(
            source_ranges(&s, &d, &l, 1 << 20),
            Ok((vec![(0x10, 8), (0x100, 1)], 9))
        );
        // What it writes: 9 blocks at the destination; nothing known from half the data.
        assert_eq!(destination_range(&s, &d), Some((0x1000, 9)));
        assert_eq!(destination_range(&s, &d[..32]), None);
        // Past the end: a source, then the destination.
        assert_eq!(
            source_ranges(&s, &d, &l, 0x100),
            Err(Status::LBA_OUT_OF_RANGE)
        );
        let far = copy_sqe((1 << 20) - 4, 1, 0);
        assert_eq!(
            source_ranges(&far, &d, &l, 1 << 20),
            Err(Status::LBA_OUT_OF_RANGE)
        );
        // Limits.
        let small = CopyLimits {
            max_range: 4,
            max_total: 100,
            max_ranges: 2,
        };
        assert_eq!(
            source_ranges(&s, &d, &small, 1 << 20),
            Err(Status::COMMAND_SIZE_LIMIT_EXCEEDED)
        );
        let few = CopyLimits {
            max_range: 100,
            max_total: 8,
            max_ranges: 2,
        };
        assert_eq!(
            source_ranges(&s, &d, &few, 1 << 20),
            Err(Status::COMMAND_SIZE_LIMIT_EXCEEDED)
        );
        let one = CopyLimits {
            max_range: 100,
            max_total: 100,
            max_ranges: 1,
        };
        assert_eq!(
            check_command(&s, &one),
            Err(Status::COMMAND_SIZE_LIMIT_EXCEEDED)
        );
        // Other descriptor formats, short data.
        assert_eq!(
            check_command(&copy_sqe(0, 0, 1), &l),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            source_ranges(&s, &d[..32], &l, 1 << 20),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
    }

    #[test]
    fn fused_pairs() {
        let mut c = Sqe {
            nsid: 1,
            cdw10: 5,
            cdw12: 3,
            ..Default::default()
        };
        c.cdw0 = opcodes::io::COMPARE as u32 | (FUSE_FIRST as u32) << 8;
        let mut w = c;
        w.cdw0 = opcodes::io::WRITE as u32 | (FUSE_SECOND as u32) << 8;
        assert_eq!(fused_pair_status(&c, &w), Ok(()));
        let mut other = w;
        other.cdw10 = 6;
        assert_eq!(
            fused_pair_status(&c, &other),
            Err(Status::ABORTED_MISSING_FUSED)
        );
        let mut unfused = w;
        unfused.cdw0 = opcodes::io::WRITE as u32;
        assert_eq!(
            fused_pair_status(&c, &unfused),
            Err(Status::ABORTED_MISSING_FUSED)
        );
    }

    proptest! {
        #[test]
        fn overlap_is_symmetric_and_exact(a in 0u64..100, an in 1u32..50, b in 0u64..100, bn in 1u32..50) {
            let o = overlaps((a, an), (b, bn));
            prop_assert_eq!(o, overlaps((b, bn), (a, an)));
            let brute = (a..a + an as u64).any(|x| (b..b + bn as u64).contains(&x));
            prop_assert_eq!(o, brute);
        }
        #[test]
        fn any_descriptor_bytes_parse_or_refuse(data in proptest::collection::vec(any::<u8>(), 0..300), nr in 0u32..10) {
            let s = copy_sqe(0, nr, 0);
            let l = CopyLimits::for_buffer(1 << 20, 9);
            if let Ok((r, total)) = source_ranges(&s, &data, &l, 1 << 30) {
                prop_assert_eq!(r.len(), nr as usize + 1);
                prop_assert_eq!(total, r.iter().map(|x| x.1 as u64).sum::<u64>());
                let masked: Vec<u8> = data[..r.len() * 32]
                    .iter()
                    .enumerate()
                    .map(|(i, &b)| if (8..18).contains(&(i % 32)) { b } else { 0 })
                    .collect();
                prop_assert_eq!(encode_ranges(&r), masked);
            }
        }
    }
}
