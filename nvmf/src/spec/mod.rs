//! NVMe base and NVMe-oF spec types shared by every layer: the 64-byte submission queue
//! entry, the 16-byte completion queue entry, status codes, SGL descriptors and opcodes.
//!
//! Field names follow the NVMe Base Specification 2.0 (Figures "Common Command Format",
//! "Common Completion Queue Entry Layout", "SGL Descriptor Format") and NVMe over Fabrics
//! 1.1. Every wire structure is `#[repr(C)]` with a compile-time size check and is
//! converted to and from bytes with `zerocopy` (no `unsafe` in this crate).

pub mod fabrics;
pub mod features;
pub mod identify;
pub mod log;
pub mod opcodes;
pub mod status;

pub use status::Status;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Submission queue entry (NVMe Base 2.0, Figure 88 "Common Command Format").
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Sqe {
    /// CDW0: OPC (7:0), FUSE (9:8), PSDT (15:14), CID (31:16).
    pub cdw0: u32,
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    pub mptr: u64,
    /// DPTR: SGL entry 1 (fabrics always use SGLs).
    pub dptr: SglDescriptor,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
}
const _: () = assert!(core::mem::size_of::<Sqe>() == 64);

impl Sqe {
    pub const SIZE: usize = 64;

    pub fn opcode(&self) -> u8 {
        self.cdw0 as u8
    }
    pub fn cid(&self) -> u16 {
        (self.cdw0 >> 16) as u16
    }
    /// PSDT: 00b PRPs, 01b/10b SGLs.
    pub fn psdt(&self) -> u8 {
        ((self.cdw0 >> 14) & 3) as u8
    }
    pub fn fuse(&self) -> u8 {
        ((self.cdw0 >> 8) & 3) as u8
    }
    pub fn set_opcode_cid(&mut self, opcode: u8, cid: u16) {
        self.cdw0 = (self.cdw0 & 0x0000_ff00) | opcode as u32 | (cid as u32) << 16;
    }
    /// Fabrics commands (opcode 7Fh) carry FCTYPE in byte 4 (where NSID sits otherwise).
    pub fn fctype(&self) -> u8 {
        self.nsid as u8
    }
    pub fn is_fabrics(&self) -> bool {
        self.opcode() == opcodes::FABRICS
    }
    /// Starting LBA of Read/Write/Compare/Write Zeroes (CDW10-11).
    pub fn slba(&self) -> u64 {
        self.cdw10 as u64 | (self.cdw11 as u64) << 32
    }
    /// The first logical block an I/O queue command addresses (CDW10-11: SLBA, or SDLBA
    /// for Copy), for the commands that address blocks; `None` for the others. Admin
    /// opcodes overlap these: ask only of I/O queue commands.
    pub fn io_lba(&self) -> Option<u64> {
        opcodes::io::addresses_blocks(self.opcode()).then(|| self.slba())
    }
    /// Number of logical blocks, 0's based in CDW12 bits 15:0, returned 1-based.
    pub fn nlb(&self) -> u32 {
        (self.cdw12 & 0xffff) + 1
    }
    /// Force Unit Access (CDW12 bit 30) of Read/Write.
    pub fn fua(&self) -> bool {
        self.cdw12 & (1 << 30) != 0
    }
    pub fn from_bytes(b: &[u8]) -> Option<Sqe> {
        Sqe::read_from_prefix(b).ok().map(|(s, _)| s)
    }
    /// Which way the command moves data, from the opcode's low two bits (NVMe Base 2.0
    /// Figure 28; Fabrics commands use FCTYPE's the same way).
    pub fn data_direction(&self) -> DataDirection {
        let bits = if self.is_fabrics() {
            self.fctype()
        } else {
            self.opcode()
        } & 3;
        match bits {
            0 => DataDirection::None,
            1 => DataDirection::HostToController,
            2 => DataDirection::ControllerToHost,
            _ => DataDirection::Bidirectional,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataDirection {
    None,
    HostToController,
    ControllerToHost,
    Bidirectional,
}

/// Completion queue entry (NVMe Base 2.0, Figure 90).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Cqe {
    /// Command specific DW0.
    pub dw0: u32,
    pub dw1: u32,
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    /// Phase tag (bit 0) and Status Field (bits 15:1).
    pub status: u16,
}
const _: () = assert!(core::mem::size_of::<Cqe>() == 16);

impl Cqe {
    pub const SIZE: usize = 16;

    pub fn new(cid: u16, status: Status) -> Cqe {
        Cqe {
            cid,
            status: status.to_field(),
            ..Default::default()
        }
    }
    pub fn success(cid: u16) -> Cqe {
        Cqe::new(cid, Status::SUCCESS)
    }
    pub fn status(&self) -> Status {
        Status::from_field(self.status)
    }
    pub fn from_bytes(b: &[u8]) -> Option<Cqe> {
        Cqe::read_from_prefix(b).ok().map(|(c, _)| c)
    }
}

/// SGL descriptor (NVMe Base 2.0, Figure 112). The last byte is the SGL identifier:
/// type in bits 7:4, sub type in bits 3:0. For keyed data block descriptors (type 4) the
/// length is 3 bytes (bytes 8-10) and the key 4 bytes (bytes 11-14).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct SglDescriptor {
    pub addr: u64,
    pub bytes: [u8; 7],
    pub id: u8,
}
const _: () = assert!(core::mem::size_of::<SglDescriptor>() == 16);

pub mod sgl {
    //! SGL descriptor type and sub type values.
    pub const TYPE_DATA_BLOCK: u8 = 0x0;
    pub const TYPE_BIT_BUCKET: u8 = 0x1;
    pub const TYPE_SEGMENT: u8 = 0x2;
    pub const TYPE_LAST_SEGMENT: u8 = 0x3;
    pub const TYPE_KEYED_DATA_BLOCK: u8 = 0x4;
    pub const TYPE_TRANSPORT_DATA_BLOCK: u8 = 0x5;
    pub const SUBTYPE_ADDRESS: u8 = 0x0;
    pub const SUBTYPE_OFFSET: u8 = 0x1;
    pub const SUBTYPE_TRANSPORT: u8 = 0xA;
    pub const SUBTYPE_INVALIDATE_KEY: u8 = 0xF;
}

impl SglDescriptor {
    pub fn sgl_type(&self) -> u8 {
        self.id >> 4
    }
    pub fn subtype(&self) -> u8 {
        self.id & 0xf
    }
    /// Length of an unkeyed descriptor (bytes 8-11).
    pub fn length(&self) -> u32 {
        u32::from_le_bytes([self.bytes[0], self.bytes[1], self.bytes[2], self.bytes[3]])
    }
    /// Length of a keyed data block descriptor (bytes 8-10).
    pub fn keyed_length(&self) -> u32 {
        u32::from_le_bytes([self.bytes[0], self.bytes[1], self.bytes[2], 0])
    }
    /// Key of a keyed data block descriptor (bytes 11-14).
    pub fn key(&self) -> u32 {
        u32::from_le_bytes([self.bytes[3], self.bytes[4], self.bytes[5], self.bytes[6]])
    }
    pub fn unkeyed(sgl_type: u8, subtype: u8, addr: u64, len: u32) -> SglDescriptor {
        let l = len.to_le_bytes();
        SglDescriptor {
            addr,
            bytes: [l[0], l[1], l[2], l[3], 0, 0, 0],
            id: sgl_type << 4 | subtype,
        }
    }
    pub fn keyed(subtype: u8, addr: u64, len: u32, key: u32) -> SglDescriptor {
        let l = len.to_le_bytes();
        let k = key.to_le_bytes();
        SglDescriptor {
            addr,
            bytes: [l[0], l[1], l[2], k[0], k[1], k[2], k[3]],
            id: sgl::TYPE_KEYED_DATA_BLOCK << 4 | subtype,
        }
    }
}

/// Test helper: decoding the front of `bytes` as `T` and encoding it again gives the same
/// bytes (every spec structure is plain data, so this holds for any input).
#[cfg(test)]
pub(crate) fn roundtrip<T: FromBytes + IntoBytes + Immutable + KnownLayout>(bytes: &[u8]) -> bool {
    let (v, _) = T::read_from_prefix(bytes).unwrap();
    v.as_bytes() == &bytes[..core::mem::size_of::<T>()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn sqe_roundtrip(bytes in proptest::collection::vec(any::<u8>(), 64)) {
            let sqe = Sqe::from_bytes(&bytes).unwrap();
            prop_assert_eq!(sqe.as_bytes(), &bytes[..]);
        }
        #[test]
        fn cqe_roundtrip(bytes in proptest::collection::vec(any::<u8>(), 16)) {
            let cqe = Cqe::from_bytes(&bytes).unwrap();
            prop_assert_eq!(cqe.as_bytes(), &bytes[..]);
            prop_assert_eq!(Cqe::new(cqe.cid, cqe.status()).status(), cqe.status());
        }
        #[test]
        fn keyed_sgl_fields(addr: u64, len in 0u32..(1 << 24), key: u32) {
            let d = SglDescriptor::keyed(sgl::SUBTYPE_INVALIDATE_KEY, addr, len, key);
            prop_assert_eq!((d.addr, d.keyed_length(), d.key()), (addr, len, key));
            prop_assert_eq!((d.sgl_type(), d.subtype()), (4, 0xf));
        }
    }

    #[test]
    fn cdw0_fields() {
        let mut s = Sqe::default();
        s.set_opcode_cid(opcodes::io::WRITE, 0xbeef);
        assert_eq!((s.opcode(), s.cid()), (0x01, 0xbeef));
        assert_eq!(s.data_direction(), DataDirection::HostToController);
        s.set_opcode_cid(opcodes::FABRICS, 1);
        s.nsid = opcodes::fabrics::CONNECT as u32;
        assert_eq!(s.data_direction(), DataDirection::HostToController);
        s.nsid = opcodes::fabrics::PROPERTY_GET as u32;
        assert_eq!(s.data_direction(), DataDirection::None);
    }

    /// A Read command as the wire carries it (NVMe Base 2.0 Figure 88 "Common Command
    /// Format": CDW0 with OPC 7:0, PSDT 15:14, CID 31:16; NSID at byte 4; SGL1 at bytes
    /// 24-39 per Figure 112, identifier in byte 15 of the descriptor; CDW10-12 at 40-51).
    #[test]
    fn sqe_fixed_bytes() {
        let mut b = [0u8; 64];
        b[0] = 0x02; // OPC: Read
        b[1] = 0x40; // PSDT 01b: SGLs
        b[2..4].copy_from_slice(&[0x34, 0x12]); // CID 1234h
        b[4] = 1; // NSID 1
        b[32..36].copy_from_slice(&[0x00, 0x10, 0x00, 0x00]); // SGL length 4096
        b[39] = 0x5a; // SGL identifier: Transport SGL Data Block (5h), Transport (Ah)
        b[40..44].copy_from_slice(&[0xef, 0xcd, 0xab, 0x89]); // SLBA bits 31:0
        b[44] = 0x01; // SLBA bits 63:32
        b[48] = 0x07; // NLB, 0's based: 8 blocks
        let sqe = Sqe::from_bytes(&b).unwrap();
        assert_eq!(
            (sqe.opcode(), sqe.psdt(), sqe.cid()),
            (opcodes::io::READ, 1, 0x1234)
        );
        assert_eq!(
            (sqe.nsid, sqe.cdw10, sqe.cdw11, sqe.cdw12),
            (1, 0x89ab_cdef, 1, 7)
        );
        assert_eq!((sqe.dptr.sgl_type(), sqe.dptr.subtype()), (5, 0xa));
        assert_eq!(sqe.dptr.length(), 4096);
        let mut built = Sqe::default();
        built.set_opcode_cid(opcodes::io::READ, 0x1234);
        built.cdw0 |= 1 << 14;
        built.nsid = 1;
        built.dptr = SglDescriptor::unkeyed(
            sgl::TYPE_TRANSPORT_DATA_BLOCK,
            sgl::SUBTYPE_TRANSPORT,
            0,
            4096,
        );
        built.cdw10 = 0x89ab_cdef;
        built.cdw11 = 1;
        built.cdw12 = 7;
        assert_eq!(built.as_bytes(), &b[..]);
    }

    /// A completion as the wire carries it (NVMe Base 2.0 Figure 90: DW0, DW1, SQHD at
    /// byte 8, SQID at 10, CID at 12, Phase bit 0 and the Status Field of Figure 92 in
    /// bits 15:1 of bytes 14-15: SC 8:1, SCT 11:9, M 14, DNR 15).
    #[test]
    fn cqe_fixed_bytes() {
        let b: [u8; 16] = [
            0x03, 0x00, 0x01, 0x00, // DW0
            0, 0, 0, 0, // DW1
            0x1f, 0x00, // SQHD 31
            0x01, 0x00, // SQID 1
            0x34, 0x12, // CID 1234h
            0x04, 0x80, // SC 02h (Invalid Field in Command), SCT 0, DNR
        ];
        let cqe = Cqe::from_bytes(&b).unwrap();
        let st = cqe.status();
        assert_eq!((st.sct, st.sc, st.dnr, st.more), (0, 0x02, true, false));
        assert_eq!(
            (cqe.dw0, cqe.sqhd, cqe.sqid, cqe.cid),
            (0x0001_0003, 31, 1, 0x1234)
        );
        let mut built = Cqe::new(0x1234, Status::INVALID_FIELD.with_dnr(true));
        built.dw0 = 0x0001_0003;
        built.sqhd = 31;
        built.sqid = 1;
        assert_eq!(built.as_bytes(), &b[..]);
        // SCT 2h (Media and Data Integrity), SC 81h (Unrecovered Read Error), no DNR.
        let f = Status::UNRECOVERED_READ_ERROR.with_dnr(false).to_field();
        assert_eq!(f.to_le_bytes(), [0x02, 0x05]);
    }
}
