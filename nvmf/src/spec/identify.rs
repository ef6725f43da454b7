//! Identify data structures (NVMe Base 2.0 section 5.17.2; NVM Command Set 1.0 section
//! 4.1.5): Identify Controller (CNS 01h, with the NVMe-oF fields), Identify Namespace
//! (CNS 00h), Namespace Identification Descriptors (CNS 03h), active namespace ID lists
//! (CNS 02h/07h), I/O command set independent Identify Namespace (CNS 08h), the NVM
//! command set specific controller (CNS 06h) and namespace (CNS 05h) structures and the
//! I/O Command Set data structure (CNS 1Ch).
//!
//! Multi-byte fields are little-endian (`zerocopy::little_endian`), so the structs have
//! alignment 1 and no padding; sizes are checked at compile time.
//!
//! Not implemented: namespace management lists (CNS 10h-13h), NVM sets, UUID lists,
//! zoned/KV command set structures.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// CNS values (NVMe Base 2.0 Figure 274).
pub mod cns {
    pub const NAMESPACE: u8 = 0x00;
    pub const CONTROLLER: u8 = 0x01;
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    pub const NS_ID_DESCRIPTORS: u8 = 0x03;
    pub const CS_NAMESPACE: u8 = 0x05;
    pub const CS_CONTROLLER: u8 = 0x06;
    pub const CS_ACTIVE_NS_LIST: u8 = 0x07;
    pub const CS_INDEPENDENT_NAMESPACE: u8 = 0x08;
    /// I/O Command Set data structure (the supported command set combinations).
    pub const IO_COMMAND_SET: u8 = 0x1c;
}

/// Command set identifiers.
pub mod csi {
    pub const NVM: u8 = 0x00;
    pub const KEY_VALUE: u8 = 0x01;
    pub const ZONED: u8 = 0x02;
}

/// Size of every Identify data structure.
pub const IDENTIFY_DATA_SIZE: usize = 4096;

/// Power State Descriptor (NVMe Base 2.0 Figure 276), 32 bytes.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct PowerStateDescriptor {
    /// Maximum power, in 0.01 W units (or 0.0001 W when MXPS is set).
    pub mp: U16,
    pub rsvd2: u8,
    /// Bit 0 MXPS, bit 1 NOPS.
    pub flags: u8,
    pub enlat: U32,
    pub exlat: U32,
    pub rrt: u8,
    pub rrl: u8,
    pub rwt: u8,
    pub rwl: u8,
    pub idlp: U16,
    pub ips: u8,
    pub rsvd19: u8,
    pub actp: U16,
    pub apw_aps: u8,
    pub rsvd23: [u8; 9],
}
const _: () = assert!(core::mem::size_of::<PowerStateDescriptor>() == 32);

/// Identify Controller data structure (NVMe Base 2.0 Figure 275), 4096 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct IdentifyController {
    pub vid: U16,
    pub ssvid: U16,
    /// Serial number, ASCII, space padded.
    pub sn: [u8; 20],
    /// Model number, ASCII, space padded.
    pub mn: [u8; 40],
    /// Firmware revision, ASCII, space padded.
    pub fr: [u8; 8],
    pub rab: u8,
    pub ieee: [u8; 3],
    pub cmic: u8,
    pub mdts: u8,
    pub cntlid: U16,
    pub ver: U32,
    pub rtd3r: U32,
    pub rtd3e: U32,
    pub oaes: U32,
    pub ctratt: U32,
    pub rrls: U16,
    pub rsvd102: [u8; 9],
    pub cntrltype: u8,
    pub fguid: [u8; 16],
    pub crdt1: U16,
    pub crdt2: U16,
    pub crdt3: U16,
    pub rsvd134: [u8; 119],
    pub nvmsr: u8,
    pub vwci: u8,
    pub mec: u8,
    pub oacs: U16,
    pub acl: u8,
    pub aerl: u8,
    pub frmw: u8,
    pub lpa: u8,
    pub elpe: u8,
    pub npss: u8,
    pub avscc: u8,
    pub apsta: u8,
    pub wctemp: U16,
    pub cctemp: U16,
    pub mtfa: U16,
    pub hmpre: U32,
    pub hmmin: U32,
    pub tnvmcap: [u8; 16],
    pub unvmcap: [u8; 16],
    pub rpmbs: U32,
    pub edstt: U16,
    pub dsto: u8,
    pub fwug: u8,
    pub kas: U16,
    pub hctma: U16,
    pub mntmt: U16,
    pub mxtmt: U16,
    pub sanicap: U32,
    pub hmminds: U32,
    pub hmmaxd: U16,
    pub nsetidmax: U16,
    pub endgidmax: U16,
    pub anatt: u8,
    pub anacap: u8,
    pub anagrpmax: U32,
    pub nanagrpid: U32,
    pub pels: U32,
    pub domainid: U16,
    pub rsvd358: [u8; 10],
    pub megcap: [u8; 16],
    pub rsvd384: [u8; 128],
    pub sqes: u8,
    pub cqes: u8,
    pub maxcmd: U16,
    pub nn: U32,
    pub oncs: U16,
    pub fuses: U16,
    pub fna: u8,
    pub vwc: u8,
    pub awun: U16,
    pub awupf: U16,
    pub icsvscc: u8,
    pub nwpc: u8,
    pub acwu: U16,
    pub ocfs: U16,
    pub sgls: U32,
    pub mnan: U32,
    pub maxdna: [u8; 16],
    pub maxcna: U32,
    pub rsvd564: [u8; 204],
    /// NVM Subsystem NVMe Qualified Name, NUL-terminated UTF-8.
    pub subnqn: [u8; 256],
    pub rsvd1024: [u8; 768],
    /// I/O Queue Command Capsule Supported Size, in 16-byte units (NVMe-oF).
    pub ioccsz: U32,
    /// I/O Queue Response Capsule Supported Size, in 16-byte units.
    pub iorcsz: U32,
    /// In Capsule Data Offset, in 16-byte units.
    pub icdoff: U16,
    /// Fabrics Controller Attributes (bit 0: static controller model).
    pub fcatt: u8,
    /// Maximum SGL Data Block Descriptors.
    pub msdbd: u8,
    /// Optional Fabric Commands Support.
    pub ofcs: U16,
    pub dctype: u8,
    pub rsvd1807: [u8; 241],
    pub psd: [PowerStateDescriptor; 32],
    pub vs: [u8; 1024],
}
const _: () = assert!(core::mem::size_of::<IdentifyController>() == IDENTIFY_DATA_SIZE);

impl Default for IdentifyController {
    fn default() -> Self {
        IdentifyController::new_zeroed()
    }
}

/// Identify Namespace RESCAP (NVMe Base 2.0 Figure 280): bit 0 Persist Through Power Loss,
/// bits 1-6 the six reservation types, bit 7 Ignore Existing Key behaves as NVMe 1.3 and
/// later define it.
pub mod rescap {
    pub const PTPL: u8 = 1 << 0;
    pub const ALL_TYPES: u8 = 0b0111_1110;
    pub const IEKEY_13: u8 = 1 << 7;
}

/// Identify Controller bit values used by the target.
pub mod ctrl {
    /// CMIC bit 0: may have two or more ports; bit 1: may have two or more controllers.
    pub const CMIC_MULTI_PORT: u8 = 1 << 0;
    pub const CMIC_MULTI_CTRL: u8 = 1 << 1;
    /// CMIC bit 3: Asymmetric Namespace Access reporting.
    pub const CMIC_ANA: u8 = 1 << 3;
    /// OAES bit 11: ANA Change Notices.
    pub const OAES_ANA_CHANGE: u32 = 1 << 11;
    /// ANACAP: bit 0 optimized, 1 non-optimized, 2 inaccessible, 3 persistent loss, 4
    /// change state reported; bit 6: ANAGRPID does not change while the namespace is
    /// attached.
    pub const ANACAP_ALL_STATES: u8 = 0b1_1111;
    pub const ANACAP_GRPID_STATIC: u8 = 1 << 6;
    /// ONCS bit 5: reservations; bit 8: Copy.
    pub const ONCS_RESERVATIONS: u16 = 1 << 5;
    pub const ONCS_COPY: u16 = 1 << 8;
    /// FUSES bit 0: Compare and Write fused operation.
    pub const FUSES_COMPARE_AND_WRITE: u16 = 1 << 0;
    /// OCFS bit 0: Copy descriptor format 0.
    pub const OCFS_FORMAT0: u16 = 1 << 0;
    /// OAES bit 8: Namespace Attribute Notices.
    pub const OAES_NS_ATTR: u32 = 1 << 8;
    /// OAES bit 31: Discovery Log Page Change Notices.
    pub const OAES_DISCOVERY_CHANGE: u32 = 1 << 31;
    pub const CNTRLTYPE_IO: u8 = 1;
    pub const CNTRLTYPE_DISCOVERY: u8 = 2;
    /// LPA: bit 0 SMART per namespace, bit 1 Commands Supported and Effects, bit 2
    /// extended data for Get Log Page (NUMDU, LPO).
    pub const LPA_SMART_PER_NS: u8 = 1 << 0;
    pub const LPA_CMD_EFFECTS: u8 = 1 << 1;
    pub const LPA_EXTENDED: u8 = 1 << 2;
    /// ONCS bits: Compare, Dataset Management, Write Zeroes.
    pub const ONCS_COMPARE: u16 = 1 << 0;
    pub const ONCS_DSM: u16 = 1 << 2;
    pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;
    /// VWC bit 0: a volatile write cache is present.
    pub const VWC_PRESENT: u8 = 1 << 0;
    /// VWC bits 2:1 = 10b: NSID FFFFFFFFh is not supported for Flush.
    pub const VWC_FLUSH_BROADCAST_UNSUPPORTED: u8 = 0b10 << 1;
    /// VWC bits 2:1 = 11b: NSID FFFFFFFFh is supported for Flush.
    pub const VWC_FLUSH_BROADCAST_SUPPORTED: u8 = 0b11 << 1;
    /// SGLS bits 1:0 = 01b: SGLs supported; bit 2: keyed SGL data block; bit 20:
    /// address field of SGL data blocks may be an offset (in-capsule data).
    pub const SGLS_SUPPORTED: u32 = 1 << 0;
    pub const SGLS_KEYED: u32 = 1 << 2;
    pub const SGLS_OFFSET: u32 = 1 << 20;
    /// FRMW bit 0: slot 1 read only; bits 3:1 number of slots.
    pub const FRMW_SLOT1_RO_ONE_SLOT: u8 = 1 << 0 | 1 << 1;
    /// CTRATT bit 0 (HIDS): the controller supports a 128-bit Host Identifier.
    pub const CTRATT_HOST_ID_128: u32 = 1 << 0;
}

/// I/O Command Set data structure (NVMe Base 2.0 Figure 288, CNS 1Ch): 512 I/O command
/// set combinations of 64 bits each, bit n set when command set n (CSI) is in it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct IoCommandSetVector {
    pub combinations: [U64; 512],
}
const _: () = assert!(core::mem::size_of::<IoCommandSetVector>() == IDENTIFY_DATA_SIZE);

impl IoCommandSetVector {
    /// One combination, index 0, with the NVM command set (CSI 00h) only.
    pub fn nvm_only() -> IoCommandSetVector {
        let mut v = IoCommandSetVector::new_zeroed();
        v.combinations[0] = (1u64 << csi::NVM).into();
        v
    }
}

/// Writes `s` into `dst` as ASCII padded with spaces (SN, MN, FR, TRADDR, TRSVCID).
pub fn copy_space_padded(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    let n = s.len().min(dst.len());
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// LBA Format (NVM Command Set 1.0 Figure 98), packed in one dword.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct LbaFormat {
    /// Metadata size in bytes.
    pub ms: U16,
    /// LBA data size as a power of two.
    pub lbads: u8,
    /// Relative performance (bits 1:0).
    pub rp: u8,
}
const _: () = assert!(core::mem::size_of::<LbaFormat>() == 4);

/// Identify Namespace data structure for the NVM command set (NVM Command Set 1.0
/// Figure 97), 4096 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct IdentifyNamespace {
    pub nsze: U64,
    pub ncap: U64,
    pub nuse: U64,
    pub nsfeat: u8,
    pub nlbaf: u8,
    pub flbas: u8,
    pub mc: u8,
    pub dpc: u8,
    pub dps: u8,
    /// Bit 0: may be attached to two or more controllers.
    pub nmic: u8,
    pub rescap: u8,
    pub fpi: u8,
    pub dlfeat: u8,
    pub nawun: U16,
    pub nawupf: U16,
    pub nacwu: U16,
    pub nabsn: U16,
    pub nabo: U16,
    pub nabspf: U16,
    pub noiob: U16,
    pub nvmcap: [u8; 16],
    pub npwg: U16,
    pub npwa: U16,
    pub npdg: U16,
    pub npda: U16,
    pub nows: U16,
    pub mssrl: U16,
    pub mcl: U32,
    pub msrc: u8,
    pub rsvd81: u8,
    pub nulbaf: u8,
    pub rsvd83: [u8; 9],
    pub anagrpid: U32,
    pub rsvd96: [u8; 3],
    pub nsattr: u8,
    pub nvmsetid: U16,
    pub endgid: U16,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    pub lbaf: [LbaFormat; 64],
    pub rsvd384: [u8; 2688],
    pub vs: [u8; 1024],
}
const _: () = assert!(core::mem::size_of::<IdentifyNamespace>() == IDENTIFY_DATA_SIZE);

impl Default for IdentifyNamespace {
    fn default() -> Self {
        IdentifyNamespace::new_zeroed()
    }
}

/// I/O Command Set Independent Identify Namespace (NVMe Base 2.0 Figure 280), CNS 08h.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct IdentifyNamespaceIndependent {
    pub nsfeat: u8,
    pub nmic: u8,
    pub rescap: u8,
    pub fpi: u8,
    pub anagrpid: U32,
    pub nsattr: u8,
    pub rsvd9: u8,
    pub nvmsetid: U16,
    pub endgid: U16,
    /// Namespace Status: bit 0 namespace ready.
    pub nstat: u8,
    pub rsvd15: [u8; 4081],
}
const _: () = assert!(core::mem::size_of::<IdentifyNamespaceIndependent>() == IDENTIFY_DATA_SIZE);

impl Default for IdentifyNamespaceIndependent {
    fn default() -> Self {
        IdentifyNamespaceIndependent::new_zeroed()
    }
}

/// NVM Command Set specific Identify Controller (NVM Command Set 1.0 Figure 100), CNS 06h
/// CSI 00h.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct IdentifyControllerNvm {
    /// Verify Size Limit (2^n units of CAP.MPSMIN, 0 = no limit).
    pub vsl: u8,
    /// Write Zeroes Size Limit.
    pub wzsl: u8,
    /// Write Uncorrectable Size Limit.
    pub wusl: u8,
    /// Dataset Management Ranges Limit.
    pub dmrl: u8,
    /// Dataset Management Range Size Limit, in logical blocks.
    pub dmrsl: U32,
    /// Dataset Management Size Limit, in logical blocks.
    pub dmsl: U64,
    pub rsvd16: [u8; 4080],
}
const _: () = assert!(core::mem::size_of::<IdentifyControllerNvm>() == IDENTIFY_DATA_SIZE);

impl Default for IdentifyControllerNvm {
    fn default() -> Self {
        IdentifyControllerNvm::new_zeroed()
    }
}

/// NVM Command Set specific Identify Namespace (NVM Command Set 1.0 Figure 99), CNS 05h
/// CSI 00h.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct IdentifyNamespaceNvm {
    /// Logical Block Storage Tag Mask.
    pub lbstm: U64,
    /// Protection Information Capabilities.
    pub pic: u8,
    pub rsvd9: [u8; 3],
    /// Extended LBA Formats.
    pub elbaf: [U32; 64],
    pub rsvd268: [u8; 3828],
}
const _: () = assert!(core::mem::size_of::<IdentifyNamespaceNvm>() == IDENTIFY_DATA_SIZE);

impl Default for IdentifyNamespaceNvm {
    fn default() -> Self {
        IdentifyNamespaceNvm::new_zeroed()
    }
}

/// A list of up to 1024 namespace IDs (CNS 02h, 07h; also the Changed Namespace List log).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NamespaceList {
    pub ids: [U32; 1024],
}
const _: () = assert!(core::mem::size_of::<NamespaceList>() == IDENTIFY_DATA_SIZE);

impl Default for NamespaceList {
    fn default() -> Self {
        NamespaceList::new_zeroed()
    }
}

impl NamespaceList {
    pub const CAPACITY: usize = 1024;

    /// The first 1024 IDs of `ids`, zero-filled after.
    pub fn from_ids(ids: impl IntoIterator<Item = u32>) -> NamespaceList {
        let mut l = NamespaceList::default();
        for (slot, id) in l.ids.iter_mut().zip(ids) {
            *slot = id.into();
        }
        l
    }
    /// The IDs before the first zero entry.
    pub fn to_ids(&self) -> Vec<u32> {
        self.ids
            .iter()
            .map(|i| i.get())
            .take_while(|&i| i != 0)
            .collect()
    }
}

/// Namespace Identifier Type values (NVMe Base 2.0 Figure 279).
pub mod nidt {
    pub const EUI64: u8 = 1;
    pub const NGUID: u8 = 2;
    pub const UUID: u8 = 3;
    pub const CSI: u8 = 4;
}

/// One Namespace Identification Descriptor (CNS 03h).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NsIdDescriptor {
    Eui64([u8; 8]),
    Nguid([u8; 16]),
    Uuid([u8; 16]),
    Csi(u8),
}

impl NsIdDescriptor {
    fn nidt(&self) -> u8 {
        match self {
            NsIdDescriptor::Eui64(_) => nidt::EUI64,
            NsIdDescriptor::Nguid(_) => nidt::NGUID,
            NsIdDescriptor::Uuid(_) => nidt::UUID,
            NsIdDescriptor::Csi(_) => nidt::CSI,
        }
    }
    fn nid(&self) -> &[u8] {
        match self {
            NsIdDescriptor::Eui64(v) => v,
            NsIdDescriptor::Nguid(v) | NsIdDescriptor::Uuid(v) => v,
            NsIdDescriptor::Csi(v) => core::slice::from_ref(v),
        }
    }

    /// Encodes a descriptor list into a 4096-byte Identify buffer: each entry is NIDT,
    /// NIDL, 2 reserved bytes, then NIDL bytes of identifier; a zero NIDT ends the list.
    pub fn encode_list(list: &[NsIdDescriptor]) -> Vec<u8> {
        let mut out = vec![0u8; IDENTIFY_DATA_SIZE];
        let mut at = 0;
        for d in list {
            let nid = d.nid();
            if at + 4 + nid.len() > out.len() {
                break;
            }
            out[at] = d.nidt();
            out[at + 1] = nid.len() as u8;
            out[at + 4..at + 4 + nid.len()].copy_from_slice(nid);
            at += 4 + nid.len();
        }
        out
    }

    /// Decodes a descriptor list; unknown types or wrong lengths end it with `None`.
    pub fn decode_list(b: &[u8]) -> Option<Vec<NsIdDescriptor>> {
        let mut out = Vec::new();
        let mut at = 0;
        while at + 4 <= b.len() && b[at] != 0 {
            let (t, l) = (b[at], b[at + 1] as usize);
            let nid = b.get(at + 4..at + 4 + l)?;
            out.push(match (t, l) {
                (nidt::EUI64, 8) => NsIdDescriptor::Eui64(nid.try_into().ok()?),
                (nidt::NGUID, 16) => NsIdDescriptor::Nguid(nid.try_into().ok()?),
                (nidt::UUID, 16) => NsIdDescriptor::Uuid(nid.try_into().ok()?),
                (nidt::CSI, 1) => NsIdDescriptor::Csi(nid[0]),
                _ => return None,
            });
            at += 4 + l;
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::roundtrip;
    use core::mem::offset_of;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn identify_structs_roundtrip(bytes in proptest::collection::vec(any::<u8>(), 4096)) {
            prop_assert!(roundtrip::<IdentifyController>(&bytes));
            prop_assert!(roundtrip::<IdentifyNamespace>(&bytes));
            prop_assert!(roundtrip::<IdentifyNamespaceIndependent>(&bytes));
            prop_assert!(roundtrip::<IdentifyControllerNvm>(&bytes));
            prop_assert!(roundtrip::<IdentifyNamespaceNvm>(&bytes));
            prop_assert!(roundtrip::<NamespaceList>(&bytes));
        }
        #[test]
        fn ns_list_roundtrip(mut ids in proptest::collection::vec(1u32.., 0..1024)) {
            ids.sort_unstable();
            prop_assert_eq!(NamespaceList::from_ids(ids.clone()).to_ids(), ids);
        }
        /// A host decodes descriptors from the wire: any bytes decode or refuse, and what
        /// decodes re-encodes to the same list.
        #[test]
        fn ns_descriptors_from_any_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..4096),
            seeded in proptest::collection::vec((1u8..5, prop_oneof![Just(1u8), Just(8), Just(16), any::<u8>()]), 0..20),
        ) {
            // Half-plausible headers spread over random bytes reach deeper than noise.
            let mut b = bytes;
            let mut at = 0;
            for (t, l) in seeded {
                if at + 4 > b.len() {
                    break;
                }
                b[at] = t;
                b[at + 1] = l;
                at += 4 + l as usize;
            }
            if let Some(list) = NsIdDescriptor::decode_list(&b) {
                let again = NsIdDescriptor::encode_list(&list);
                prop_assert_eq!(NsIdDescriptor::decode_list(&again), Some(list));
            }
        }
        #[test]
        fn space_padded_any(s in "\\PC{0,60}", len in 0usize..50) {
            let mut dst = vec![0u8; len];
            copy_space_padded(&mut dst, &s);
            let n = s.len().min(len);
            prop_assert_eq!(&dst[..n], &s.as_bytes()[..n]);
            prop_assert!(dst[n..].iter().all(|&c| c == b' '));
        }
        #[test]
        fn ns_list_from_any_ids(ids in proptest::collection::vec(any::<u32>(), 0..1500)) {
            let l = NamespaceList::from_ids(ids.clone());
            let back = l.to_ids();
            let expect: Vec<u32> = ids.iter().copied().take(NamespaceList::CAPACITY).take_while(|&i| i != 0).collect();
            prop_assert_eq!(back, expect);
        }
        #[test]
        fn ns_descriptors_roundtrip(eui: [u8; 8], nguid: [u8; 16], uuid: [u8; 16], csi: u8) {
            let list = vec![
                NsIdDescriptor::Eui64(eui),
                NsIdDescriptor::Nguid(nguid),
                NsIdDescriptor::Uuid(uuid),
                NsIdDescriptor::Csi(csi),
            ];
            let b = NsIdDescriptor::encode_list(&list);
            prop_assert_eq!(b.len(), 4096);
            prop_assert_eq!(NsIdDescriptor::decode_list(&b), Some(list));
        }
    }

    #[test]
    fn controller_offsets() {
        assert_eq!(offset_of!(IdentifyController, sn), 4);
        assert_eq!(offset_of!(IdentifyController, mn), 24);
        assert_eq!(offset_of!(IdentifyController, fr), 64);
        assert_eq!(offset_of!(IdentifyController, cmic), 76);
        assert_eq!(offset_of!(IdentifyController, mdts), 77);
        assert_eq!(offset_of!(IdentifyController, cntlid), 78);
        assert_eq!(offset_of!(IdentifyController, ver), 80);
        assert_eq!(offset_of!(IdentifyController, oaes), 92);
        assert_eq!(offset_of!(IdentifyController, cntrltype), 111);
        assert_eq!(offset_of!(IdentifyController, oacs), 256);
        assert_eq!(offset_of!(IdentifyController, kas), 320);
        assert_eq!(offset_of!(IdentifyController, sqes), 512);
        assert_eq!(offset_of!(IdentifyController, nn), 516);
        assert_eq!(offset_of!(IdentifyController, oncs), 520);
        assert_eq!(offset_of!(IdentifyController, vwc), 525);
        assert_eq!(offset_of!(IdentifyController, sgls), 536);
        assert_eq!(offset_of!(IdentifyController, subnqn), 768);
        assert_eq!(offset_of!(IdentifyController, ioccsz), 1792);
        assert_eq!(offset_of!(IdentifyController, iorcsz), 1796);
        assert_eq!(offset_of!(IdentifyController, icdoff), 1800);
        assert_eq!(offset_of!(IdentifyController, fcatt), 1802);
        assert_eq!(offset_of!(IdentifyController, msdbd), 1803);
        assert_eq!(offset_of!(IdentifyController, ofcs), 1804);
        assert_eq!(offset_of!(IdentifyController, psd), 2048);
    }

    #[test]
    fn namespace_offsets() {
        assert_eq!(offset_of!(IdentifyNamespace, nsfeat), 24);
        assert_eq!(offset_of!(IdentifyNamespace, nmic), 30);
        assert_eq!(offset_of!(IdentifyNamespace, dlfeat), 33);
        assert_eq!(offset_of!(IdentifyNamespace, npwg), 64);
        assert_eq!(offset_of!(IdentifyNamespace, anagrpid), 92);
        assert_eq!(offset_of!(IdentifyNamespace, nsattr), 99);
        assert_eq!(offset_of!(IdentifyNamespace, nguid), 104);
        assert_eq!(offset_of!(IdentifyNamespace, eui64), 120);
        assert_eq!(offset_of!(IdentifyNamespace, lbaf), 128);
        assert_eq!(offset_of!(IdentifyNamespaceIndependent, anagrpid), 4);
        assert_eq!(offset_of!(IdentifyNamespaceIndependent, nstat), 14);
        assert_eq!(offset_of!(IdentifyNamespaceNvm, elbaf), 12);
        assert_eq!(offset_of!(IdentifyControllerNvm, dmsl), 8);
    }
}
