//! NVMe over Fabrics command fields (NVMe-oF 1.1 section 3; NVMe Base 2.0 section 6):
//! Connect (Figures 19-21), Property Get/Set (Figures 25-28) and the controller
//! properties they reach (NVMe Base 2.0 section 3.1.3: CAP, VS, CC, CSTS, CRTO).
//!
//! The Connect, Property Get and Property Set commands are plain [`Sqe`]s; the helpers
//! here name their dwords. The 1024-byte Connect data is [`ConnectData`].
//!
//! Not implemented: Authentication Send/Receive fields (DH-HMAC-CHAP), the Disconnect
//! command's RECFMT beyond 0.

use super::Sqe;
use zerocopy::little_endian::U16;
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// Byte offsets of Connect command fields within the 64-byte SQE, used in the IPO field
/// of a Connect Invalid Parameters response (NVMe-oF 1.1 Figure 20).
pub mod connect_sqe_offset {
    pub const RECFMT: u16 = 40;
    pub const QID: u16 = 42;
    pub const SQSIZE: u16 = 44;
    pub const CATTR: u16 = 46;
    pub const KATO: u16 = 48;
}

/// Byte offsets of Connect data fields (Figure 20), for IPO with IATTR = 1.
pub mod connect_data_offset {
    pub const HOSTID: u16 = 0;
    pub const CNTLID: u16 = 16;
    pub const SUBNQN: u16 = 256;
    pub const HOSTNQN: u16 = 512;
}

/// CATTR bit 2: the host asks to disable SQ flow control (SQHD reported as FFFFh).
pub const CATTR_DISABLE_SQ_FLOW_CONTROL: u8 = 1 << 2;
/// CNTLID in Connect data asking for any controller (dynamic controller model).
pub const CNTLID_DYNAMIC: u16 = 0xffff;

/// The Connect command's own fields, decoded from the SQE (CDW10-12).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectCommand {
    /// Record format, 0 is the only one defined.
    pub recfmt: u16,
    /// Queue ID: 0 is the admin queue.
    pub qid: u16,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    /// Connect attributes (bit 2 disable SQ flow control; bits 1:0 priority).
    pub cattr: u8,
    /// Keep Alive Timeout in milliseconds (admin queue only).
    pub kato: u32,
}

impl ConnectCommand {
    pub fn from_sqe(sqe: &Sqe) -> ConnectCommand {
        ConnectCommand {
            recfmt: sqe.cdw10 as u16,
            qid: (sqe.cdw10 >> 16) as u16,
            sqsize: sqe.cdw11 as u16,
            cattr: (sqe.cdw11 >> 16) as u8,
            kato: sqe.cdw12,
        }
    }
    /// Writes the fields into an SQE and makes it a Connect command with this CID.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut sqe = Sqe::default();
        sqe.set_opcode_cid(super::opcodes::FABRICS, cid);
        sqe.nsid = super::opcodes::fabrics::CONNECT as u32;
        sqe.cdw10 = self.recfmt as u32 | (self.qid as u32) << 16;
        sqe.cdw11 = self.sqsize as u32 | (self.cattr as u32) << 16;
        sqe.cdw12 = self.kato;
        sqe
    }
}

/// Connect command data (NVMe-oF 1.1 Figure 20), 1024 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct ConnectData {
    pub hostid: [u8; 16],
    pub cntlid: U16,
    pub rsvd18: [u8; 238],
    /// NUL-terminated UTF-8.
    pub subnqn: [u8; 256],
    /// NUL-terminated UTF-8.
    pub hostnqn: [u8; 256],
    pub rsvd768: [u8; 256],
}
const _: () = assert!(core::mem::size_of::<ConnectData>() == 1024);

impl Default for ConnectData {
    fn default() -> Self {
        ConnectData::new_zeroed()
    }
}

impl ConnectData {
    pub const SIZE: usize = 1024;

    pub fn from_bytes(b: &[u8]) -> Option<ConnectData> {
        ConnectData::read_from_prefix(b).ok().map(|(d, _)| d)
    }
    pub fn new(hostid: [u8; 16], cntlid: u16, subnqn: &str, hostnqn: &str) -> ConnectData {
        let mut d = ConnectData {
            hostid,
            cntlid: cntlid.into(),
            ..Default::default()
        };
        copy_nul_terminated(&mut d.subnqn, subnqn);
        copy_nul_terminated(&mut d.hostnqn, hostnqn);
        d
    }
    /// SUBNQN as a string if it is NUL-terminated UTF-8.
    pub fn subnqn(&self) -> Option<&str> {
        nul_terminated_str(&self.subnqn)
    }
    /// HOSTNQN as a string if it is NUL-terminated UTF-8.
    pub fn hostnqn(&self) -> Option<&str> {
        nul_terminated_str(&self.hostnqn)
    }
}

/// The string before the first NUL, if there is a NUL and the bytes are UTF-8.
pub fn nul_terminated_str(b: &[u8]) -> Option<&str> {
    let end = b.iter().position(|&c| c == 0)?;
    core::str::from_utf8(&b[..end]).ok()
}

/// Copies `s` into `dst`, truncated so that at least one NUL remains, NUL-filled.
pub fn copy_nul_terminated(dst: &mut [u8], s: &str) {
    dst.fill(0);
    let n = s.len().min(dst.len().saturating_sub(1));
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Longest NQN the spec allows (NVMe Base 2.0 section 4.5), excluding the NUL.
pub const NQN_MAX_LEN: usize = 223;

/// Whether `nqn` has the shape the spec requires: `nqn.yyyy-mm.` followed by a reverse
/// domain name (or `nqn.2014-08.org.nvmexpress:uuid:...`), printable ASCII, at most 223
/// bytes.
pub fn is_valid_nqn(nqn: &str) -> bool {
    let b = nqn.as_bytes();
    if b.len() > NQN_MAX_LEN || b.len() < 13 || !b.starts_with(b"nqn.") {
        return false;
    }
    let date = &b[4..12];
    let date_ok = date[..4].iter().all(u8::is_ascii_digit)
        && date[4] == b'-'
        && date[5..7].iter().all(u8::is_ascii_digit)
        && date[7] == b'.';
    date_ok && b[12..].iter().all(|c| c.is_ascii_graphic())
}

/// Response DW0 of Connect Invalid Parameters: IPO in bits 15:0, IATTR in bits 23:16
/// (bit 16 set: the offset is in the Connect data, clear: in the SQE).
pub fn invalid_parameter_dw0(in_data: bool, offset: u16) -> u32 {
    (in_data as u32) << 16 | offset as u32
}

/// Property Get / Property Set fields (NVMe-oF 1.1 Figures 25 and 27).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PropertyCommand {
    /// ATTRIB bits 2:0: 0 = 4-byte property, 1 = 8-byte property.
    pub attrib: u8,
    /// OFST: property offset.
    pub offset: u32,
    /// VALUE (Property Set only).
    pub value: u64,
}

impl PropertyCommand {
    pub fn from_sqe(sqe: &Sqe) -> PropertyCommand {
        PropertyCommand {
            attrib: sqe.cdw10 as u8,
            offset: sqe.cdw11,
            value: sqe.cdw12 as u64 | (sqe.cdw13 as u64) << 32,
        }
    }
    pub fn is_8_bytes(&self) -> bool {
        self.attrib & 7 == 1
    }
    /// An SQE for Property Get (`set == false`) or Property Set.
    pub fn to_sqe(&self, cid: u16, set: bool) -> Sqe {
        let mut sqe = Sqe::default();
        sqe.set_opcode_cid(super::opcodes::FABRICS, cid);
        sqe.nsid = if set {
            super::opcodes::fabrics::PROPERTY_SET
        } else {
            super::opcodes::fabrics::PROPERTY_GET
        } as u32;
        sqe.cdw10 = self.attrib as u32;
        sqe.cdw11 = self.offset;
        sqe.cdw12 = self.value as u32;
        sqe.cdw13 = (self.value >> 32) as u32;
        sqe
    }
}

/// Controller property offsets (NVMe Base 2.0 Figure 33).
pub mod property {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const INTMS: u32 = 0x0c;
    pub const INTMC: u32 = 0x10;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1c;
    pub const NSSR: u32 = 0x20;
    pub const CRTO: u32 = 0x68;
}

/// Controller Capabilities (CAP) fields.
pub mod cap {
    pub const MQES_MASK: u64 = 0xffff;
    pub const CQR: u64 = 1 << 16;
    pub const TO_SHIFT: u32 = 24;
    /// CSS bit 0 (CAP bit 37): NVM command set.
    pub const CSS_NVM: u64 = 1 << 37;
    /// CSS bit 6 (CAP bit 43): one or more I/O command sets (CC.CSS 110b may be used).
    pub const CSS_IOCS: u64 = 1 << 43;
    pub const MPSMIN_SHIFT: u32 = 48;
    pub const MPSMAX_SHIFT: u32 = 52;
}

/// Controller Configuration (CC) fields.
pub mod cc {
    pub const EN: u32 = 1 << 0;
    /// CC.CSS values: NVM command set, all supported I/O command sets, admin only.
    pub const CSS_NVM: u32 = 0b000;
    pub const CSS_ALL_IOCS: u32 = 0b110;
    pub const CSS_ADMIN_ONLY: u32 = 0b111;
    pub fn css(cc: u32) -> u32 {
        (cc >> 4) & 7
    }
    pub fn mps(cc: u32) -> u32 {
        (cc >> 7) & 0xf
    }
    pub fn ams(cc: u32) -> u32 {
        (cc >> 11) & 7
    }
    pub fn shn(cc: u32) -> u32 {
        (cc >> 14) & 3
    }
    pub fn iosqes(cc: u32) -> u32 {
        (cc >> 16) & 0xf
    }
    pub fn iocqes(cc: u32) -> u32 {
        (cc >> 20) & 0xf
    }
}

/// Controller Status (CSTS) fields.
pub mod csts {
    pub const RDY: u32 = 1 << 0;
    /// Controller Fatal Status.
    pub const CFS: u32 = 1 << 1;
    pub const SHST_MASK: u32 = 3 << 2;
    pub const SHST_OCCURRING: u32 = 1 << 2;
    pub const SHST_COMPLETE: u32 = 2 << 2;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn connect_data_roundtrip(bytes in proptest::collection::vec(any::<u8>(), 1024)) {
            let d = ConnectData::from_bytes(&bytes).unwrap();
            prop_assert_eq!(d.as_bytes(), &bytes[..]);
        }
        #[test]
        fn connect_command_roundtrip(recfmt: u16, qid: u16, sqsize: u16, cattr: u8, kato: u32, cid: u16) {
            let c = ConnectCommand { recfmt, qid, sqsize, cattr, kato };
            let sqe = c.to_sqe(cid);
            prop_assert_eq!(ConnectCommand::from_sqe(&sqe), c);
            prop_assert!(sqe.is_fabrics());
            prop_assert_eq!(sqe.cid(), cid);
            // The offsets used for IPO point at these fields in the SQE bytes.
            let b = sqe.as_bytes();
            let at = |o: u16| u16::from_le_bytes([b[o as usize], b[o as usize + 1]]);
            prop_assert_eq!(at(connect_sqe_offset::QID), qid);
            prop_assert_eq!(at(connect_sqe_offset::SQSIZE), sqsize);
            prop_assert_eq!(b[connect_sqe_offset::CATTR as usize], cattr);
        }
        /// Connect data arrives from the wire: any length, any bytes.
        #[test]
        fn connect_data_from_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..1100)) {
            let d = ConnectData::from_bytes(&bytes);
            prop_assert_eq!(d.is_some(), bytes.len() >= ConnectData::SIZE);
            if let Some(d) = d {
                for n in [d.subnqn(), d.hostnqn()].into_iter().flatten() {
                    prop_assert!(n.len() < 256 && !n.contains('\0'));
                    if is_valid_nqn(n) {
                        prop_assert!(n.len() <= NQN_MAX_LEN && n.starts_with("nqn."));
                    }
                }
            }
        }
        #[test]
        fn nul_terminated_copy_roundtrip(s in "\\PC{0,300}", len in 0usize..300) {
            let mut dst = vec![0xaau8; len];
            copy_nul_terminated(&mut dst, &s);
            if len > 0 {
                prop_assert_eq!(dst[len - 1], 0);
            }
            // ASCII comes back as its prefix; a cut inside a UTF-8 sequence reads as None.
            if let Some(back) = nul_terminated_str(&dst) {
                prop_assert!(s.starts_with(back));
            } else {
                prop_assert!(len == 0 || !s.is_ascii());
            }
        }
        #[test]
        fn nqn_check_any_string(s in "(nqn\\.[0-9]{4}-[0-9]{2}\\.)?\\PC{0,240}") {
            if is_valid_nqn(&s) {
                prop_assert!((13..=NQN_MAX_LEN).contains(&s.len()));
                prop_assert!(s.bytes().all(|b| b.is_ascii_graphic()));
            }
        }
        #[test]
        fn property_roundtrip(attrib in 0u8..2, offset: u32, value: u64, set: bool) {
            let p = PropertyCommand { attrib, offset, value };
            prop_assert_eq!(PropertyCommand::from_sqe(&p.to_sqe(3, set)), p);
        }
    }

    #[test]
    fn connect_data_fields() {
        let d = ConnectData::new(
            [7; 16],
            0xffff,
            "nqn.2014-08.org.nvmexpress.discovery",
            "nqn.2014-08.org.nvmexpress:uuid:1",
        );
        let b = d.as_bytes();
        assert_eq!(&b[16..18], &[0xff, 0xff]);
        assert_eq!(&b[256..260], b"nqn.");
        assert_eq!(&b[512..516], b"nqn.");
        assert_eq!(d.subnqn(), Some("nqn.2014-08.org.nvmexpress.discovery"));
    }

    #[test]
    fn nqn_validation() {
        assert!(is_valid_nqn("nqn.2014-08.org.nvmexpress.discovery"));
        assert!(is_valid_nqn(
            "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6"
        ));
        assert!(is_valid_nqn("nqn.2016-06.io.spdk:cnode1"));
        assert!(!is_valid_nqn("iqn.2016-06.io.spdk:cnode1"));
        assert!(!is_valid_nqn("nqn.20x6-06.io.spdk:cnode1"));
        assert!(!is_valid_nqn("nqn.2016-06"));
        assert!(!is_valid_nqn("nqn.2016-06.io spdk"));
        assert!(!is_valid_nqn(&format!(
            "nqn.2016-06.io.{}",
            "a".repeat(300)
        )));
    }

    /// Connect as the wire carries it (NVMe-oF 1.1 Figure 19: opcode 7Fh, FCTYPE 01h at
    /// byte 4, RECFMT at 40, QID at 42, SQSIZE at 44, CATTR at 46, KATO at 48).
    #[test]
    fn connect_command_fixed_bytes() {
        let mut b = [0u8; 64];
        b[0] = 0x7f;
        b[2] = 0x07; // CID 7
        b[4] = 0x01; // FCTYPE: Connect
        b[42] = 0x03; // QID 3
        b[44] = 0x7f; // SQSIZE 127 (0's based)
        b[46] = 0x04; // CATTR: disable SQ flow control
        let sqe = Sqe::from_bytes(&b).unwrap();
        let c = ConnectCommand::from_sqe(&sqe);
        assert_eq!(
            (c.recfmt, c.qid, c.sqsize, c.cattr, c.kato),
            (0, 3, 127, 4, 0)
        );
        assert_eq!(c.to_sqe(7).as_bytes(), &b[..]);
        // An admin queue with KATO 120 000 ms (0001D4C0h).
        b[42] = 0;
        b[44] = 0x1f;
        b[46] = 0;
        b[48..52].copy_from_slice(&[0xc0, 0xd4, 0x01, 0x00]);
        let c = ConnectCommand::from_sqe(&Sqe::from_bytes(&b).unwrap());
        assert_eq!((c.qid, c.sqsize, c.kato), (0, 31, 120_000));
        assert_eq!(c.to_sqe(7).as_bytes(), &b[..]);
    }

    /// Connect data (NVMe-oF 1.1 Figure 20): HOSTID 0-15, CNTLID 16-17, SUBNQN 256-511,
    /// HOSTNQN 512-767, NUL-padded, 1024 bytes.
    #[test]
    fn connect_data_fixed_bytes() {
        let sub = "nqn.2026-11.dev.nvmf-target:x";
        let host = "nqn.2014-08.org.nvmexpress:uuid:1";
        let mut b = [0u8; 1024];
        b[..16].copy_from_slice(&[0xab; 16]);
        b[16..18].copy_from_slice(&[0xff, 0xff]); // CNTLID FFFFh: dynamic
        b[256..256 + sub.len()].copy_from_slice(sub.as_bytes());
        b[512..512 + host.len()].copy_from_slice(host.as_bytes());
        let d = ConnectData::new([0xab; 16], 0xffff, sub, host);
        assert_eq!(d.as_bytes(), &b[..]);
        assert_eq!(d.subnqn(), Some(sub));
    }

    /// Property Set of CC and Property Get of CAP (NVMe-oF 1.1 Figures 25 and 27: FCTYPE
    /// at byte 4 (04h Get, 00h Set), ATTRIB at 40, OFST at 44, VALUE at 48).
    #[test]
    fn property_fixed_bytes() {
        let mut set = [0u8; 64];
        set[0] = 0x7f;
        set[44] = 0x14; // OFST: CC
        set[48..52].copy_from_slice(&[0x01, 0x00, 0x46, 0x00]); // EN, IOSQES 6, IOCQES 4
        let p = PropertyCommand::from_sqe(&Sqe::from_bytes(&set).unwrap());
        assert_eq!(
            (p.attrib, p.offset, p.value),
            (0, property::CC, 0x0046_0001)
        );
        assert_eq!(p.to_sqe(0, true).as_bytes(), &set[..]);
        let mut get = [0u8; 64];
        get[0] = 0x7f;
        get[2] = 0x05; // CID 5
        get[4] = 0x04; // FCTYPE: Property Get
        get[40] = 0x01; // ATTRIB: 8 bytes
        let p = PropertyCommand::from_sqe(&Sqe::from_bytes(&get).unwrap());
        assert!(p.is_8_bytes());
        assert_eq!(p.offset, property::CAP);
        assert_eq!(p.to_sqe(5, false).as_bytes(), &get[..]);
    }
}
