//! The slice of the NVMe Base and NVM Command Set specifications the driver and the
//! emulated controller share: controller registers, the 64-byte submission and 16-byte
//! completion entries, opcodes, status codes and the Identify fields we read.
//!
//! Field names follow the specifications (NVMe Base 2.0, section 3.1 registers, 4.2 SQE,
//! 4.6 CQE, 5 admin commands; NVM Command Set 1.0, section 3 I/O commands).

#![forbid(unsafe_code)]

/// Controller Capabilities (64-bit).
pub const REG_CAP: usize = 0x00;
/// Version.
pub const REG_VS: usize = 0x08;
/// Controller Configuration.
pub const REG_CC: usize = 0x14;
/// Controller Status.
pub const REG_CSTS: usize = 0x1C;
/// Admin Queue Attributes.
pub const REG_AQA: usize = 0x24;
/// Admin Submission Queue Base Address (64-bit).
pub const REG_ASQ: usize = 0x28;
/// Admin Completion Queue Base Address (64-bit).
pub const REG_ACQ: usize = 0x30;
/// First doorbell (SQ 0 tail).
pub const REG_DOORBELLS: usize = 0x1000;

/// Byte offset in BAR0 of queue `qid`'s SQ tail doorbell (`cq == false`) or CQ head
/// doorbell (`cq == true`), for a doorbell stride of `4 << dstrd` bytes.
pub fn doorbell_offset(qid: u16, cq: bool, dstrd: u8) -> usize {
    REG_DOORBELLS + (2 * usize::from(qid) + usize::from(cq)) * (4usize << dstrd)
}

/// Decoded CAP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap {
    /// Maximum Queue Entries Supported, 0-based.
    pub mqes: u16,
    /// Contiguous Queues Required.
    pub cqr: bool,
    /// Timeout in 500 ms units (worst case for CSTS.RDY to change).
    pub to: u8,
    /// Doorbell stride: `4 << dstrd` bytes.
    pub dstrd: u8,
    /// NVM command set supported (CSS bit 0).
    pub css_nvm: bool,
    /// Memory page size minimum: `4096 << mpsmin`.
    pub mpsmin: u8,
    /// Memory page size maximum: `4096 << mpsmax`.
    pub mpsmax: u8,
}

impl Cap {
    pub fn from_u64(v: u64) -> Cap {
        Cap {
            mqes: v as u16,
            cqr: v >> 16 & 1 != 0,
            to: (v >> 24) as u8,
            dstrd: (v >> 32 & 0xF) as u8,
            css_nvm: v >> 37 & 1 != 0,
            mpsmin: (v >> 48 & 0xF) as u8,
            mpsmax: (v >> 52 & 0xF) as u8,
        }
    }

    pub fn to_u64(self) -> u64 {
        u64::from(self.mqes)
            | u64::from(self.cqr) << 16
            | u64::from(self.to) << 24
            | u64::from(self.dstrd & 0xF) << 32
            | u64::from(self.css_nvm) << 37
            | u64::from(self.mpsmin & 0xF) << 48
            | u64::from(self.mpsmax & 0xF) << 52
    }
}

/// CC.EN
pub const CC_EN: u32 = 1;
/// CC.SHN = 01b (normal shutdown).
pub const CC_SHN_NORMAL: u32 = 1 << 14;
/// CC.SHN mask.
pub const CC_SHN_MASK: u32 = 3 << 14;
/// CC for the NVM command set, 4 KiB pages, round robin, 64-byte SQEs, 16-byte CQEs
/// (without EN).
pub const CC_CONFIG: u32 = (6 << 16) | (4 << 20);
/// CSTS.RDY
pub const CSTS_RDY: u32 = 1;
/// CSTS.CFS (controller fatal status).
pub const CSTS_CFS: u32 = 2;
/// CSTS.SHST mask and "shutdown complete".
pub const CSTS_SHST_MASK: u32 = 3 << 2;
pub const CSTS_SHST_DONE: u32 = 2 << 2;

/// Memory page size the driver uses (CC.MPS = 0).
pub const PAGE: usize = 4096;

/// Admin opcodes.
pub mod admin {
    pub const DELETE_IO_SQ: u8 = 0x00;
    pub const CREATE_IO_SQ: u8 = 0x01;
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const DELETE_IO_CQ: u8 = 0x04;
    pub const CREATE_IO_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0A;
}

/// NVM command set I/O opcodes.
pub mod io {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DSM: u8 = 0x09;
}

/// Feature identifiers.
pub const FID_NUMBER_OF_QUEUES: u8 = 0x07;
/// Log page identifier of SMART / Health Information.
pub const LID_SMART: u8 = 0x02;
/// Size of the SMART / Health Information log page.
pub const SMART_LOG_LEN: usize = 512;

/// Status code type and code as they appear in a completion (without phase bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    pub sct: u8,
    pub sc: u8,
    /// Do Not Retry.
    pub dnr: bool,
}

impl Status {
    pub const SUCCESS: Status = Status::generic(0x00);
    pub const INVALID_OPCODE: Status = Status::generic(0x01);
    pub const INVALID_FIELD: Status = Status::generic(0x02);
    pub const DATA_TRANSFER_ERROR: Status = Status::generic(0x04);
    pub const INTERNAL_ERROR: Status = Status::generic(0x06);
    pub const ABORT_REQUESTED: Status = Status::generic(0x07);
    pub const ABORTED_SQ_DELETION: Status = Status::generic(0x08);
    pub const INVALID_NAMESPACE: Status = Status::generic(0x0B);
    pub const DATA_SGL_LENGTH_INVALID: Status = Status::generic(0x0F);
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Status = Status::generic(0x11);
    pub const INVALID_PRP_OFFSET: Status = Status::generic(0x13);
    pub const LBA_OUT_OF_RANGE: Status = Status::generic(0x80);
    pub const NAMESPACE_NOT_READY: Status = Status::generic(0x82);
    pub const CQ_INVALID: Status = Status::specific(0x00);
    pub const INVALID_QUEUE_ID: Status = Status::specific(0x01);
    pub const INVALID_QUEUE_SIZE: Status = Status::specific(0x02);
    pub const WRITE_FAULT: Status = Status::media(0x80);
    pub const UNRECOVERED_READ_ERROR: Status = Status::media(0x81);

    pub const fn generic(sc: u8) -> Status {
        Status {
            sct: 0,
            sc,
            dnr: false,
        }
    }
    pub const fn specific(sc: u8) -> Status {
        Status {
            sct: 1,
            sc,
            dnr: false,
        }
    }
    pub const fn media(sc: u8) -> Status {
        Status {
            sct: 2,
            sc,
            dnr: false,
        }
    }
    pub const fn dnr(mut self) -> Status {
        self.dnr = true;
        self
    }
    pub fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }
    /// Same code, ignoring DNR.
    pub fn same(self, other: Status) -> bool {
        self.sct == other.sct && self.sc == other.sc
    }
    /// The 15-bit Status Field (bits 31:17 of CQE DW3) without the phase bit.
    pub fn to_field(self) -> u16 {
        u16::from(self.sc) | u16::from(self.sct & 7) << 8 | u16::from(self.dnr) << 14
    }
    pub fn from_field(f: u16) -> Status {
        Status {
            sc: f as u8,
            sct: (f >> 8 & 7) as u8,
            dnr: f >> 14 & 1 != 0,
        }
    }
}

/// A 64-byte submission queue entry, as 16 little-endian dwords.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sqe {
    pub dw: [u32; 16],
}

/// PSDT = 01b: the data pointer is one SGL descriptor (NVMe Base 2.0, 4.2).
pub const PSDT_SGL: u32 = 1 << 14;

impl Sqe {
    pub fn new(opcode: u8, nsid: u32) -> Sqe {
        let mut s = Sqe::default();
        s.dw[0] = u32::from(opcode);
        s.dw[1] = nsid;
        s
    }
    pub fn opcode(&self) -> u8 {
        self.dw[0] as u8
    }
    pub fn psdt(&self) -> u32 {
        self.dw[0] >> 14 & 3
    }
    pub fn cid(&self) -> u16 {
        (self.dw[0] >> 16) as u16
    }
    pub fn set_cid(&mut self, cid: u16) {
        self.dw[0] = self.dw[0] & 0xFFFF | u32::from(cid) << 16;
    }
    pub fn nsid(&self) -> u32 {
        self.dw[1]
    }
    pub fn prp1(&self) -> u64 {
        u64::from(self.dw[6]) | u64::from(self.dw[7]) << 32
    }
    pub fn prp2(&self) -> u64 {
        u64::from(self.dw[8]) | u64::from(self.dw[9]) << 32
    }
    pub fn set_prp(&mut self, prp1: u64, prp2: u64) {
        self.dw[0] &= !(3 << 14);
        self.dw[6] = prp1 as u32;
        self.dw[7] = (prp1 >> 32) as u32;
        self.dw[8] = prp2 as u32;
        self.dw[9] = (prp2 >> 32) as u32;
    }
    /// One SGL Data Block descriptor (type 0h, subtype 0h) covering `len` bytes at `addr`.
    pub fn set_sgl_data_block(&mut self, addr: u64, len: u32) {
        self.dw[0] = self.dw[0] & !(3 << 14) | PSDT_SGL;
        self.dw[6] = addr as u32;
        self.dw[7] = (addr >> 32) as u32;
        self.dw[8] = len;
        // Bytes 12..15 of the descriptor: reserved, type/subtype in the last byte (0).
        self.dw[9] = 0;
    }
    /// The SGL1 descriptor: (address, length, descriptor type byte).
    pub fn sgl1(&self) -> (u64, u32, u8) {
        (self.prp1(), self.dw[8], (self.dw[9] >> 24) as u8)
    }
    pub fn slba(&self) -> u64 {
        u64::from(self.dw[10]) | u64::from(self.dw[11]) << 32
    }
    pub fn set_slba(&mut self, lba: u64) {
        self.dw[10] = lba as u32;
        self.dw[11] = (lba >> 32) as u32;
    }
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        for (i, d) in self.dw.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&d.to_le_bytes());
        }
        b
    }
    pub fn from_bytes(b: &[u8; 64]) -> Sqe {
        let mut s = Sqe::default();
        for (i, d) in s.dw.iter_mut().enumerate() {
            *d = u32::from_le_bytes([b[i * 4], b[i * 4 + 1], b[i * 4 + 2], b[i * 4 + 3]]);
        }
        s
    }
}

/// A 16-byte completion queue entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cqe {
    /// Command specific result (DW0).
    pub result: u32,
    /// SQ head pointer.
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    pub phase: bool,
    pub status: u16,
}

impl Cqe {
    pub fn status(&self) -> Status {
        Status::from_field(self.status)
    }
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.result.to_le_bytes());
        b[8..10].copy_from_slice(&self.sqhd.to_le_bytes());
        b[10..12].copy_from_slice(&self.sqid.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        let sf = u16::from(self.phase) | self.status << 1;
        b[14..16].copy_from_slice(&sf.to_le_bytes());
        b
    }
    pub fn from_bytes(b: &[u8; 16]) -> Cqe {
        let sf = u16::from_le_bytes([b[14], b[15]]);
        Cqe {
            result: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            sqhd: u16::from_le_bytes([b[8], b[9]]),
            sqid: u16::from_le_bytes([b[10], b[11]]),
            cid: u16::from_le_bytes([b[12], b[13]]),
            phase: sf & 1 != 0,
            status: sf >> 1,
        }
    }
}

/// What the driver reads from Identify Controller (CNS 01h).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentifyController {
    pub vid: u16,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    /// Maximum Data Transfer Size: `4096 << mdts` bytes (minimum page size), 0 = no limit.
    pub mdts: u8,
    pub cntlid: u16,
    /// Abort Command Limit, 0-based.
    pub acl: u8,
    /// Number of Namespaces.
    pub nn: u32,
    /// Optional NVM Command Support (bit 2 DSM, bit 3 Write Zeroes).
    pub oncs: u16,
    /// Volatile Write Cache present.
    pub vwc: bool,
    /// SGL Support (bits 1:0 nonzero: SGLs supported for NVM commands).
    pub sgls: u32,
}

pub const ONCS_DSM: u16 = 1 << 2;
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;

fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches([' ', '\0'])
        .to_owned()
}

fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
fn le64(b: &[u8], off: usize) -> u64 {
    u64::from(le32(b, off)) | u64::from(le32(b, off + 4)) << 32
}

impl IdentifyController {
    /// Parses the 4096-byte data structure.
    pub fn parse(b: &[u8; 4096]) -> IdentifyController {
        IdentifyController {
            vid: le16(b, 0),
            serial: ascii(&b[4..24]),
            model: ascii(&b[24..64]),
            firmware: ascii(&b[64..72]),
            mdts: b[77],
            cntlid: le16(b, 78),
            acl: b[258],
            nn: le32(b, 516),
            oncs: le16(b, 520),
            vwc: b[525] & 1 != 0,
            sgls: le32(b, 536),
        }
    }

    /// Writes the fields above (and SQES/CQES) into a zeroed 4096-byte structure.
    pub fn encode(&self, b: &mut [u8; 4096]) {
        let put = |dst: &mut [u8], s: &str| {
            dst.fill(b' ');
            let n = s.len().min(dst.len());
            dst[..n].copy_from_slice(&s.as_bytes()[..n]);
        };
        b[0..2].copy_from_slice(&self.vid.to_le_bytes());
        put(&mut b[4..24], &self.serial);
        put(&mut b[24..64], &self.model);
        put(&mut b[64..72], &self.firmware);
        b[77] = self.mdts;
        b[78..80].copy_from_slice(&self.cntlid.to_le_bytes());
        b[80..84].copy_from_slice(&0x0001_0400u32.to_le_bytes());
        b[258] = self.acl;
        b[261] = 1 << 0; // LPA: SMART log per namespace
        b[512] = 0x66; // SQES: 64 bytes
        b[513] = 0x44; // CQES: 16 bytes
        b[516..520].copy_from_slice(&self.nn.to_le_bytes());
        b[520..522].copy_from_slice(&self.oncs.to_le_bytes());
        b[525] = u8::from(self.vwc);
        b[536..540].copy_from_slice(&self.sgls.to_le_bytes());
    }

    /// Whether the controller accepts SGLs for NVM commands.
    pub fn supports_sgl(&self) -> bool {
        self.sgls & 3 != 0
    }
}

/// What the driver reads from Identify Namespace (CNS 00h).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentifyNamespace {
    /// Namespace Size in logical blocks.
    pub nsze: u64,
    /// Logical block size in bytes of the format in use.
    pub block_size: u32,
    /// Metadata bytes per block of the format in use.
    pub ms: u16,
    /// Deallocate Logical Block Features: bits 2:0 = 001b means a deallocated block
    /// reads as zeroes (otherwise its content after Dataset Management is undefined).
    pub dlfeat: u8,
}

impl IdentifyNamespace {
    /// Whether Dataset Management (deallocate) leaves blocks that read as zeroes.
    pub fn deallocate_reads_zeroes(&self) -> bool {
        self.dlfeat & 7 == 1
    }
}

impl IdentifyNamespace {
    pub fn parse(b: &[u8; 4096]) -> IdentifyNamespace {
        let flbas = b[26];
        // FLBAS bits 3:0 plus (NVMe 2.0) bits 6:5 as the upper bits of the index.
        let idx = usize::from(flbas & 0xF) | usize::from(flbas >> 5 & 3) << 4;
        let lbaf = le32(b, 128 + 4 * idx.min(63));
        let lbads = (lbaf >> 16) as u8;
        IdentifyNamespace {
            nsze: le64(b, 0),
            block_size: if (9..=16).contains(&lbads) {
                1 << lbads
            } else {
                0
            },
            ms: lbaf as u16,
            dlfeat: b[33],
        }
    }

    pub fn encode(&self, b: &mut [u8; 4096]) {
        b[0..8].copy_from_slice(&self.nsze.to_le_bytes());
        b[8..16].copy_from_slice(&self.nsze.to_le_bytes());
        b[16..24].copy_from_slice(&self.nsze.to_le_bytes());
        b[24] = 1 << 3; // NSFEAT: DEALLOCATED/UNWRITTEN ERROR; reads of deallocated blocks are 0
        b[25] = 0; // NLBAF: one format
        b[26] = 0; // FLBAS: format 0
        b[33] = self.dlfeat;
        let lbaf = u32::from(self.ms) | (self.block_size.trailing_zeros()) << 16;
        b[128..132].copy_from_slice(&lbaf.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_roundtrip_and_fields() {
        let mut s = Sqe::new(io::WRITE, 7);
        s.set_cid(0xBEEF);
        s.set_prp(0x1234_5678_9000, 0xABCD_0000);
        s.set_slba(0x1_0000_0002);
        s.dw[12] = 15 | 1 << 30;
        let b = s.to_bytes();
        assert_eq!(b[0], io::WRITE);
        assert_eq!(u16::from_le_bytes([b[2], b[3]]), 0xBEEF);
        let t = Sqe::from_bytes(&b);
        assert_eq!(t, s);
        assert_eq!(t.cid(), 0xBEEF);
        assert_eq!(t.prp1(), 0x1234_5678_9000);
        assert_eq!(t.prp2(), 0xABCD_0000);
        assert_eq!(t.slba(), 0x1_0000_0002);
        assert_eq!(t.psdt(), 0);
        let mut g = s;
        g.set_sgl_data_block(0x5000, 8192);
        assert_eq!(g.psdt(), 1);
        assert_eq!(g.sgl1(), (0x5000, 8192, 0));
        assert_eq!(g.cid(), 0xBEEF);
    }

    #[test]
    fn cqe_roundtrip() {
        let c = Cqe {
            result: 0xDEAD_BEEF,
            sqhd: 17,
            sqid: 3,
            cid: 99,
            phase: true,
            status: Status::LBA_OUT_OF_RANGE.dnr().to_field(),
        };
        let b = c.to_bytes();
        assert_eq!(b[14] & 1, 1);
        let d = Cqe::from_bytes(&b);
        assert_eq!(d, c);
        assert!(d.status().same(Status::LBA_OUT_OF_RANGE));
        assert!(d.status().dnr);
        assert_eq!(
            Status::from_field(Status::WRITE_FAULT.to_field()),
            Status::WRITE_FAULT
        );
    }

    #[test]
    fn cap_roundtrip_and_doorbells() {
        let cap = Cap {
            mqes: 1023,
            cqr: true,
            to: 20,
            dstrd: 1,
            css_nvm: true,
            mpsmin: 0,
            mpsmax: 4,
        };
        assert_eq!(Cap::from_u64(cap.to_u64()), cap);
        assert_eq!(doorbell_offset(0, false, 0), 0x1000);
        assert_eq!(doorbell_offset(0, true, 0), 0x1004);
        assert_eq!(doorbell_offset(3, true, 0), 0x1000 + 7 * 4);
        assert_eq!(doorbell_offset(3, false, 1), 0x1000 + 6 * 8);
    }

    #[test]
    fn identify_roundtrip() {
        let c = IdentifyController {
            vid: 0x1b36,
            serial: "SN1".into(),
            model: "model".into(),
            firmware: "1.0".into(),
            mdts: 5,
            cntlid: 1,
            acl: 3,
            nn: 2,
            oncs: ONCS_DSM | ONCS_WRITE_ZEROES,
            vwc: true,
            sgls: 1,
        };
        let mut b = [0u8; 4096];
        c.encode(&mut b);
        assert_eq!(IdentifyController::parse(&b), c);
        let n = IdentifyNamespace {
            nsze: 1 << 20,
            block_size: 4096,
            ms: 0,
            dlfeat: 1,
        };
        let mut b = [0u8; 4096];
        n.encode(&mut b);
        assert_eq!(IdentifyNamespace::parse(&b), n);
    }
}
