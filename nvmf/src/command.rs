//! Transport-independent logic of the commands an engine serves itself (the offloaded
//! path, DESIGN.md "The spine" step 3): which opcodes those are, how long their data
//! transfer is, where SGL1 says the data lives on each transport and whether it matches
//! the transfer, and the Dataset Management range list.
//!
//! Both transports use the same rules; only the SGL descriptor types differ (NVMe-oF 1.1
//! section 7.3.2 for RDMA, NVMe/TCP 1.0 section 3.3.2 for TCP):
//!
//! - in-capsule data: an SGL Data Block descriptor with sub type Offset (NVMe Base 2.0
//!   Figure 116), on either transport; the offset must be 0 (this target supports no
//!   in-capsule data offset) and the length must equal the in-capsule data received;
//! - NVMe/TCP: a Transport SGL Data Block descriptor (type 5h, sub type Ah) for data moved
//!   by R2T/H2CData or C2HData;
//! - NVMe/RDMA: a Keyed SGL Data Block descriptor (type 4h, sub type 0h or Fh) naming host
//!   memory the target reads or writes with RDMA.
//!
//! The SGL must describe exactly the command's transfer: shorter or longer is Data SGL
//! Length Invalid, as Linux nvmet answers (`nvmet_check_transfer_len`). Dataset
//! Management is the exception, as in nvmet (`nvmet_check_data_len_lte`): the Linux host
//! always sends a 4 KiB range buffer (room for 256 ranges) whatever NR says, so a longer
//! SGL is accepted there and only the NR + 1 ranges are read.
//!
//! Not implemented: SGL segments (more than one descriptor), bit buckets, metadata.

use crate::rdma::KeyedSgl;
use crate::spec::{opcodes, sgl, DataDirection, Sqe, Status};
use crate::target::Transport;

/// The I/O commands an engine may serve itself (NVM Command Set 1.0 Figure 14).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OffloadOp {
    Read,
    Write,
    Flush,
    WriteZeroes,
    DatasetManagement,
    Compare,
    /// Copy (NVM Command Set 1.0 section 3.2.2), format 0 source ranges: see [`crate::copy`].
    Copy,
}

impl OffloadOp {
    /// The offloadable command of an I/O queue opcode, if it is one.
    pub fn from_opcode(opcode: u8) -> Option<OffloadOp> {
        Some(match opcode {
            opcodes::io::READ => OffloadOp::Read,
            opcodes::io::WRITE => OffloadOp::Write,
            opcodes::io::FLUSH => OffloadOp::Flush,
            opcodes::io::WRITE_ZEROES => OffloadOp::WriteZeroes,
            opcodes::io::DATASET_MANAGEMENT => OffloadOp::DatasetManagement,
            opcodes::io::COPY => OffloadOp::Copy,
            opcodes::io::COMPARE => OffloadOp::Compare,
            _ => return None,
        })
    }

    /// Which way the data moves (the opcode's low two bits, NVMe Base 2.0 Figure 28).
    pub fn direction(self) -> DataDirection {
        match self {
            OffloadOp::Read => DataDirection::ControllerToHost,
            OffloadOp::Write
            | OffloadOp::DatasetManagement
            | OffloadOp::Compare
            | OffloadOp::Copy => DataDirection::HostToController,
            OffloadOp::Flush | OffloadOp::WriteZeroes => DataDirection::None,
        }
    }

    /// Whether SGL1 may describe more than the transfer (only the transfer is moved):
    /// Dataset Management, whose range buffer the Linux host sizes for 256 ranges
    /// (`nvme_setup_discard` allocates `NVME_DSM_MAX_RANGES` entries).
    pub fn sgl_may_exceed_transfer(self) -> bool {
        self == OffloadOp::DatasetManagement
    }

    /// Whether SLBA/NLB name blocks that must lie inside the namespace.
    pub fn uses_lba_range(self) -> bool {
        matches!(
            self,
            OffloadOp::Read | OffloadOp::Write | OffloadOp::Compare | OffloadOp::WriteZeroes
        )
    }

    /// Bytes the command transfers on a namespace of `1 << block_shift`-byte blocks: NLB
    /// blocks for Read/Write/Compare, (NR + 1) 16-byte ranges for Dataset Management
    /// (NVM Command Set 1.0 Figure 39), none for Flush and Write Zeroes.
    pub fn transfer_len(self, sqe: &Sqe, block_shift: u32) -> u64 {
        match self {
            OffloadOp::Read | OffloadOp::Write | OffloadOp::Compare => {
                (sqe.nlb() as u64) << block_shift
            }
            OffloadOp::DatasetManagement => dsm_range_count(sqe) as u64 * DSM_RANGE_LEN as u64,
            OffloadOp::Copy => crate::copy::data_len(sqe) as u64,
            OffloadOp::Flush | OffloadOp::WriteZeroes => 0,
        }
    }
}

/// SLBA + NLB inside a namespace of `nblocks` blocks, or LBA Out of Range.
pub fn check_lba_range(sqe: &Sqe, nblocks: u64) -> Result<(), Status> {
    match sqe.slba().checked_add(sqe.nlb() as u64) {
        Some(end) if end <= nblocks => Ok(()),
        _ => Err(Status::LBA_OUT_OF_RANGE),
    }
}

/// Where SGL1 of a command says its data lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataSgl {
    /// No data descriptor this transport understands, and no in-capsule data.
    None,
    /// `len` bytes of in-capsule data, already received with the capsule, starting
    /// `offset` bytes into it (the SGL's Address field: Identify Controller SGLS bit 20
    /// offers offsets, and hosts may use them, as nvmet-rdma and SPDK accept).
    InCapsule { len: u32, offset: u32 },
    /// NVMe/TCP: `len` bytes moved by R2T/H2CData (host to controller) or C2HData.
    Transport { len: u32 },
    /// NVMe/RDMA: host memory moved by RDMA READ or WRITE.
    Keyed(KeyedSgl),
}

impl DataSgl {
    /// Classify SGL1 of `sqe` on `transport`; `in_capsule` is how many bytes of data came
    /// with the capsule. In-capsule data starts at the SGL's offset (SGL Offset Invalid
    /// when it would then run past the bytes that came) and ends where they end (Data SGL
    /// Length Invalid otherwise). A descriptor the transport
    /// does not use, or an NVMe/TCP transport data block (data by R2T), is SGL
    /// Descriptor Type Invalid when data came with the capsule, and
    /// [`DataSgl::None`] otherwise (hosts send a zeroed SGL with data-less commands).
    pub fn parse(sqe: &Sqe, transport: Transport, in_capsule: usize) -> Result<DataSgl, Status> {
        let d = sqe.dptr;
        match (d.sgl_type(), d.subtype(), transport) {
            (sgl::TYPE_DATA_BLOCK, sgl::SUBTYPE_OFFSET, _) => {
                // An offset whose data would run past what came is the offset's fault (as
                // nvmet-rdma answers); otherwise the length must end where the data ends.
                let end = d.addr.checked_add(u64::from(d.length()));
                if d.addr != 0 && end.is_none_or(|e| e > in_capsule as u64) {
                    return Err(Status::SGL_OFFSET_INVALID);
                }
                if end != Some(in_capsule as u64) {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                let offset = d.addr as u32;
                Ok(DataSgl::InCapsule {
                    len: d.length(),
                    offset,
                })
            }
            // Data that came with the capsule while SGL1 says it will come by R2T: the
            // capsule contradicts itself (answered below, not R2T'd).
            (sgl::TYPE_TRANSPORT_DATA_BLOCK, sgl::SUBTYPE_TRANSPORT, Transport::Tcp)
                if in_capsule == 0 =>
            {
                Ok(DataSgl::Transport { len: d.length() })
            }
            (sgl::TYPE_KEYED_DATA_BLOCK, _, Transport::Rdma) => match KeyedSgl::parse(&d) {
                Some(k) => Ok(DataSgl::Keyed(k)),
                None => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
            },
            _ if in_capsule == 0 => Ok(DataSgl::None),
            _ => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
        }
    }

    /// The data length the descriptor describes (0 for [`DataSgl::None`]).
    pub fn len(&self) -> u32 {
        match *self {
            DataSgl::None => 0,
            DataSgl::InCapsule { len, .. } | DataSgl::Transport { len } => len,
            DataSgl::Keyed(k) => k.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Check the descriptor against `op`'s transfer of `len` bytes: a transfer needs a
    /// descriptor of exactly its length (Data SGL Length Invalid otherwise; longer is
    /// accepted only where [`OffloadOp::sgl_may_exceed_transfer`]), and SGL Descriptor
    /// Type Invalid when there is none; in-capsule data only goes from host to controller.
    pub fn check_transfer(&self, op: OffloadOp, len: u32) -> Result<(), Status> {
        if len == 0 {
            return Ok(());
        }
        let dir = op.direction();
        match self {
            DataSgl::None => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
            s if s.len() < len => Err(Status::DATA_SGL_LENGTH_INVALID),
            s if s.len() > len && !op.sgl_may_exceed_transfer() => {
                Err(Status::DATA_SGL_LENGTH_INVALID)
            }
            DataSgl::InCapsule { .. } if dir != DataDirection::HostToController => {
                Err(Status::DATA_SGL_LENGTH_INVALID)
            }
            _ => Ok(()),
        }
    }
}

/// Bytes of one Dataset Management range (NVM Command Set 1.0 Figure 40).
pub const DSM_RANGE_LEN: usize = 16;
/// Most ranges one Dataset Management command carries (NR is 8 bits, 0's based).
pub const DSM_MAX_RANGES: usize = 256;
/// CDW11 bit 2: Attribute - Deallocate (AD).
const DSM_ATTR_DEALLOCATE: u32 = 1 << 2;

/// Number of ranges of a Dataset Management command (NR + 1).
pub fn dsm_range_count(sqe: &Sqe) -> usize {
    (sqe.cdw10 & 0xff) as usize + 1
}

/// Whether the Dataset Management command asks to deallocate its ranges (the other
/// attributes are hints this target ignores).
pub fn dsm_deallocate(sqe: &Sqe) -> bool {
    sqe.cdw11 & DSM_ATTR_DEALLOCATE != 0
}

/// The (SLBA, NLB) ranges of a Dataset Management range list (`data`, NR + 1 entries of
/// Figure 40: context attributes, length in blocks, starting LBA) to deallocate on a
/// namespace of `nblocks` blocks, into `out`, in LBA order with overlapping and adjacent
/// ranges merged (deallocation is the same however the list is cut up, and a host must not
/// get to ask for more work than the blocks it names: 256 copies of the whole namespace
/// become one); ranges of length 0 are skipped. Returns how many were written, or LBA Out
/// of Range for a range past the end.
pub fn dsm_ranges(
    sqe: &Sqe,
    data: &[u8],
    nblocks: u64,
    out: &mut [(u64, u32); DSM_MAX_RANGES],
) -> Result<usize, Status> {
    let mut n = 0;
    for r in data.chunks_exact(DSM_RANGE_LEN).take(dsm_range_count(sqe)) {
        let len = u32::from_le_bytes([r[4], r[5], r[6], r[7]]);
        let slba = u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]);
        if len == 0 {
            continue;
        }
        if slba.checked_add(len as u64).is_none_or(|e| e > nblocks) {
            return Err(Status::LBA_OUT_OF_RANGE);
        }
        out[n] = (slba, len);
        n += 1;
    }
    out[..n].sort_unstable();
    let mut merged = 0;
    for i in 0..n {
        let (slba, len) = out[i];
        if merged > 0 {
            let (last, last_len) = &mut out[merged - 1];
            let end = *last + u64::from(*last_len);
            let new_end = (slba + u64::from(len)).max(end);
            // One range's length is a u32; a longer union stays two ranges.
            if slba <= end && new_end - *last <= u64::from(u32::MAX) {
                *last_len = (new_end - *last) as u32;
                continue;
            }
        }
        out[merged] = (slba, len);
        merged += 1;
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SglDescriptor;
    use proptest::prelude::*;

    fn sqe(opcode: u8, nlb: u32, dptr: SglDescriptor) -> Sqe {
        let mut s = Sqe::default();
        s.set_opcode_cid(opcode, 7);
        s.cdw12 = nlb - 1;
        s.dptr = dptr;
        s
    }

    #[test]
    fn offloaded_opcodes_and_directions() {
        use DataDirection::*;
        for (op, want, dir) in [
            (0x00, OffloadOp::Flush, None),
            (0x01, OffloadOp::Write, HostToController),
            (0x02, OffloadOp::Read, ControllerToHost),
            (0x05, OffloadOp::Compare, HostToController),
            (0x08, OffloadOp::WriteZeroes, None),
            (0x09, OffloadOp::DatasetManagement, HostToController),
            (0x19, OffloadOp::Copy, HostToController),
        ] {
            let o = OffloadOp::from_opcode(op).unwrap();
            assert_eq!((o, o.direction()), (want, dir));
            // The opcode's own direction bits agree (NVMe Base 2.0 Figure 28).
            let mut s = Sqe::default();
            s.set_opcode_cid(op, 0);
            assert_eq!(s.data_direction(), dir, "opcode {op:#x}");
        }
        for op in [0x04, 0x0c, 0x0d, 0x7f, 0xff] {
            assert_eq!(OffloadOp::from_opcode(op), Option::None);
        }
    }

    #[test]
    fn transfer_lengths() {
        let s = sqe(0x02, 8, SglDescriptor::default());
        assert_eq!(OffloadOp::Read.transfer_len(&s, 9), 4096);
        assert_eq!(OffloadOp::Write.transfer_len(&s, 12), 32768);
        assert_eq!(OffloadOp::WriteZeroes.transfer_len(&s, 12), 0);
        let mut d = s;
        d.cdw10 = 255;
        assert_eq!(OffloadOp::DatasetManagement.transfer_len(&d, 9), 4096);
        assert_eq!(check_lba_range(&s, 8), Ok(()));
        assert_eq!(check_lba_range(&s, 7), Err(Status::LBA_OUT_OF_RANGE));
        let mut far = s;
        far.cdw10 = u32::MAX;
        far.cdw11 = u32::MAX;
        assert_eq!(
            check_lba_range(&far, u64::MAX),
            Err(Status::LBA_OUT_OF_RANGE)
        );
    }

    /// SGL descriptors as the Linux hosts build them, byte for byte (NVMe Base 2.0
    /// Figure 112: address, length, then the identifier byte type << 4 | sub type).
    #[test]
    fn sgl_classification_from_wire_bytes() {
        let from = |b: [u8; 16]| Sqe {
            dptr: zerocopy::FromBytes::read_from_bytes(&b[..]).unwrap(),
            ..Default::default()
        };
        // nvme-tcp in-capsule: data block, offset, 4096 bytes: id 0x01.
        let ic = from([0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x10, 0, 0, 0, 0, 0, 0x01]);
        assert_eq!(
            DataSgl::parse(&ic, Transport::Tcp, 4096),
            Ok(DataSgl::InCapsule {
                len: 4096,
                offset: 0
            })
        );
        assert_eq!(
            DataSgl::parse(&ic, Transport::Tcp, 512),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
        // nvme-tcp transport data block: id 0x5a, 128 KiB.
        let t = from([0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x02, 0, 0, 0, 0, 0x5a]);
        assert_eq!(
            DataSgl::parse(&t, Transport::Tcp, 0),
            Ok(DataSgl::Transport { len: 128 * 1024 })
        );
        assert_eq!(DataSgl::parse(&t, Transport::Rdma, 0), Ok(DataSgl::None));
        // ... with data in the capsule all the same.
        assert_eq!(
            DataSgl::parse(&t, Transport::Tcp, 4096),
            Err(Status::SGL_DESCRIPTOR_TYPE_INVALID)
        );
        // nvme-rdma keyed data block with invalidate: addr, 3-byte length, key, id 0x4f.
        let k = from([
            0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x00, 0x10, 0x00, 0xef, 0xbe, 0xad,
            0xde, 0x4f,
        ]);
        assert_eq!(
            DataSgl::parse(&k, Transport::Rdma, 0),
            Ok(DataSgl::Keyed(KeyedSgl {
                addr: 0x1122_3344_5566_7788,
                len: 4096,
                key: 0xdead_beef,
                invalidate: true
            }))
        );
        assert_eq!(DataSgl::parse(&k, Transport::Tcp, 0), Ok(DataSgl::None));
        assert_eq!(
            DataSgl::parse(&k, Transport::Tcp, 16),
            Err(Status::SGL_DESCRIPTOR_TYPE_INVALID)
        );
        // In-capsule with a non-zero offset: 512 bytes from byte 8 of 520.
        let off = from([8, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0, 0, 0, 0, 0, 0x01]);
        assert_eq!(
            DataSgl::parse(&off, Transport::Tcp, 520),
            Ok(DataSgl::InCapsule {
                len: 512,
                offset: 8
            })
        );
        // Running past the end of what came, or not ending where it ends.
        assert_eq!(
            DataSgl::parse(&off, Transport::Tcp, 512),
            Err(Status::SGL_OFFSET_INVALID)
        );
        assert_eq!(
            DataSgl::parse(&off, Transport::Tcp, 1024),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
        assert_eq!(
            DataSgl::parse(&off, Transport::Rdma, 4),
            Err(Status::SGL_OFFSET_INVALID)
        );
        let far = from([0, 0, 0, 0, 1, 0, 0, 0, 0x00, 0x02, 0, 0, 0, 0, 0, 0x01]);
        assert_eq!(
            DataSgl::parse(&far, Transport::Tcp, 512),
            Err(Status::SGL_OFFSET_INVALID)
        );
    }

    #[test]
    fn transfer_checks() {
        use OffloadOp::*;
        let t = DataSgl::Transport { len: 4096 };
        assert_eq!(t.check_transfer(Read, 4096), Ok(()));
        // Shorter and longer than the transfer: nvmet's Data SGL Length Invalid.
        assert_eq!(
            t.check_transfer(Read, 8192),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
        assert_eq!(
            t.check_transfer(Write, 2048),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
        // Dataset Management: the Linux host's 4 KiB range buffer for one range.
        assert_eq!(t.check_transfer(DatasetManagement, 16), Ok(()));
        assert_eq!(
            DataSgl::Transport { len: 8 }.check_transfer(DatasetManagement, 16),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
        assert_eq!(
            DataSgl::None.check_transfer(Write, 512),
            Err(Status::SGL_DESCRIPTOR_TYPE_INVALID)
        );
        assert_eq!(DataSgl::None.check_transfer(Flush, 0), Ok(()));
        let ic = DataSgl::InCapsule {
            len: 512,
            offset: 0,
        };
        assert_eq!(ic.check_transfer(Write, 512), Ok(()));
        assert_eq!(
            ic.check_transfer(Read, 512),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
    }

    #[test]
    fn dsm_range_list_from_wire_bytes() {
        let mut s = Sqe::default();
        s.set_opcode_cid(opcodes::io::DATASET_MANAGEMENT, 1);
        s.cdw10 = 2; // three ranges
        s.cdw11 = 1 << 2;
        assert!(dsm_deallocate(&s));
        // Figure 40: context attributes (4), length in LBAs (4), starting LBA (8).
        let mut data = Vec::new();
        for (len, slba) in [(8u32, 16u64), (0, 99), (1, 1023)] {
            data.extend_from_slice(&0u32.to_le_bytes());
            data.extend_from_slice(&len.to_le_bytes());
            data.extend_from_slice(&slba.to_le_bytes());
        }
        assert_eq!(&data[16..24], &[0, 0, 0, 0, 0, 0, 0, 0]);
        let mut out = [(0, 0); DSM_MAX_RANGES];
        assert_eq!(dsm_ranges(&s, &data, 1024, &mut out), Ok(2));
        assert_eq!(&out[..2], &[(16, 8), (1023, 1)]);
        assert_eq!(
            dsm_ranges(&s, &data, 1023, &mut out),
            Err(Status::LBA_OUT_OF_RANGE)
        );
    }

    fn dsm_list(ranges: &[(u32, u64)]) -> (Sqe, Vec<u8>) {
        let mut s = Sqe::default();
        s.set_opcode_cid(opcodes::io::DATASET_MANAGEMENT, 1);
        s.cdw10 = ranges.len() as u32 - 1;
        s.cdw11 = 1 << 2;
        let mut data = Vec::new();
        for &(len, slba) in ranges {
            data.extend_from_slice(&0u32.to_le_bytes());
            data.extend_from_slice(&len.to_le_bytes());
            data.extend_from_slice(&slba.to_le_bytes());
        }
        (s, data)
    }

    #[test]
    fn dsm_ranges_are_merged_so_a_list_asks_no_more_work_than_its_blocks() {
        let mut out = [(0, 0); DSM_MAX_RANGES];
        // 256 copies of the whole namespace: one range.
        let (s, data) = dsm_list(&[(1 << 20, 0); DSM_MAX_RANGES]);
        assert_eq!(dsm_ranges(&s, &data, 1 << 20, &mut out), Ok(1));
        assert_eq!(out[0], (0, 1 << 20));
        // Unordered, overlapping, adjacent and apart.
        let (s, data) = dsm_list(&[(10, 100), (5, 0), (10, 105), (1, 5), (3, 50), (0, 7)]);
        assert_eq!(dsm_ranges(&s, &data, 1000, &mut out), Ok(3));
        assert_eq!(&out[..3], &[(0, 6), (50, 3), (100, 15)]);
        // A union longer than a u32 of blocks stays two ranges.
        let big = u32::MAX;
        let (s, data) = dsm_list(&[(big, 0), (big, 1)]);
        assert_eq!(dsm_ranges(&s, &data, 1 << 40, &mut out), Ok(2));
        assert_eq!(&out[..2], &[(0, big), (1, big)]);
    }

    proptest! {
        #[test]
        fn parse_never_panics_and_respects_the_transport(
            raw in proptest::collection::vec(any::<u8>(), 16), in_capsule in 0usize..9000,
            rdma: bool,
        ) {
            let s = Sqe {
                dptr: zerocopy::FromBytes::read_from_bytes(&raw[..]).unwrap(),
                ..Default::default()
            };
            let t = if rdma { Transport::Rdma } else { Transport::Tcp };
            match DataSgl::parse(&s, t, in_capsule) {
                Ok(DataSgl::Keyed(k)) => {
                    prop_assert!(rdma);
                    prop_assert_eq!(k.encode(), s.dptr);
                }
                Ok(DataSgl::Transport { len }) => {
                    prop_assert!(!rdma);
                    prop_assert_eq!(len, s.dptr.length());
                }
                Ok(DataSgl::InCapsule { len, offset }) => {
                    prop_assert_eq!(len as usize + offset as usize, in_capsule)
                }
                Ok(DataSgl::None) => prop_assert_eq!(in_capsule, 0),
                Err(_) => {}
            }
        }
    }
}
