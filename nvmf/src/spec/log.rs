//! Log pages (NVMe Base 2.0 section 5.16; NVMe-oF 1.1 section 5.3): Error Information
//! (01h), SMART / Health Information (02h), Firmware Slot Information (03h), Changed
//! Namespace List (04h, same layout as [`NamespaceList`](super::identify::NamespaceList)),
//! Commands Supported and Effects (05h) and the Discovery log (70h), plus the Get Log
//! Page command fields. Supported Log Pages (00h) is 256 dwords with [`LSUPP`] set for
//! each supported page.
//!
//! The ANA log (0Ch) and the Reservation Notification log (80h) are encoded by
//! `target::ana` and `target::reservation`.
//!
//! Not implemented: telemetry, device self-test, persistent event, the extended discovery
//! log format (TP8013/8014 ports and referrals beyond SUBTYPE 1).

use super::Sqe;
use zerocopy::little_endian::{U128, U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// Log page identifiers.
pub mod lid {
    pub const SUPPORTED_LOG_PAGES: u8 = 0x00;
    pub const ERROR_INFORMATION: u8 = 0x01;
    pub const SMART_HEALTH: u8 = 0x02;
    pub const FIRMWARE_SLOT: u8 = 0x03;
    pub const CHANGED_NS_LIST: u8 = 0x04;
    pub const COMMANDS_EFFECTS: u8 = 0x05;
    /// Asymmetric Namespace Access.
    pub const ANA: u8 = 0x0c;
    pub const DISCOVERY: u8 = 0x70;
    pub const RESERVATION_NOTIFICATION: u8 = 0x80;
}

/// Size of the Supported Log Pages log (LID 00h): 256 four-byte entries.
pub const SUPPORTED_LOG_PAGES_SIZE: usize = 1024;
/// Supported Log Pages entry bit 0: the log page is supported.
pub const LSUPP: u32 = 1 << 0;

/// Get Log Page command fields (NVMe Base 2.0 Figures 197-201).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GetLogPage {
    pub lid: u8,
    /// Log Specific Parameter (bits 14:8 of CDW10).
    pub lsp: u8,
    /// Retain Asynchronous Event.
    pub rae: bool,
    /// Number of dwords, 0's based (NUMDU:NUMDL).
    pub numd: u32,
    pub lsi: u16,
    /// Log Page Offset in bytes.
    pub lpo: u64,
    pub csi: u8,
}

impl GetLogPage {
    pub fn from_sqe(sqe: &Sqe) -> GetLogPage {
        GetLogPage {
            lid: sqe.cdw10 as u8,
            lsp: ((sqe.cdw10 >> 8) & 0x7f) as u8,
            rae: sqe.cdw10 & (1 << 15) != 0,
            numd: (sqe.cdw10 >> 16) | (sqe.cdw11 & 0xffff) << 16,
            lsi: (sqe.cdw11 >> 16) as u16,
            lpo: sqe.cdw12 as u64 | (sqe.cdw13 as u64) << 32,
            csi: (sqe.cdw14 >> 24) as u8,
        }
    }
    /// Writes these fields into `sqe` (CDW10-14) without touching the other dwords.
    pub fn write_to(&self, sqe: &mut Sqe) {
        sqe.cdw10 = self.lid as u32
            | ((self.lsp & 0x7f) as u32) << 8
            | (self.rae as u32) << 15
            | (self.numd & 0xffff) << 16;
        sqe.cdw11 = self.numd >> 16 | (self.lsi as u32) << 16;
        sqe.cdw12 = self.lpo as u32;
        sqe.cdw13 = (self.lpo >> 32) as u32;
        sqe.cdw14 = (self.csi as u32) << 24;
    }
    /// Transfer length in bytes.
    pub fn len_bytes(&self) -> u64 {
        (self.numd as u64 + 1) * 4
    }
}

/// Error Information log entry (NVMe Base 2.0 Figure 205), 64 bytes.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct ErrorInformationEntry {
    pub error_count: U64,
    pub sqid: U16,
    pub cid: U16,
    /// Status field (bit 0 phase tag, bits 15:1 status) as in the CQE.
    pub status: U16,
    /// Byte (7:0) and bit (10:8) of the command parameter in error, FFFFh if none.
    pub parameter_error_location: U16,
    pub lba: U64,
    pub nsid: U32,
    pub vs: u8,
    pub trtype: u8,
    pub rsvd30: [u8; 2],
    pub cs: U64,
    pub trtype_specific: U16,
    pub rsvd42: [u8; 22],
}
const _: () = assert!(core::mem::size_of::<ErrorInformationEntry>() == 64);

/// SMART / Health Information log (NVMe Base 2.0 Figure 207), 512 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct SmartLog {
    pub critical_warning: u8,
    /// Composite temperature in kelvins.
    pub composite_temperature: U16,
    pub available_spare: u8,
    pub available_spare_threshold: u8,
    pub percentage_used: u8,
    pub endurance_group_critical_warning: u8,
    pub rsvd7: [u8; 25],
    /// 512-byte units read, in thousands, rounded up.
    pub data_units_read: U128,
    pub data_units_written: U128,
    pub host_read_commands: U128,
    pub host_write_commands: U128,
    pub controller_busy_time: U128,
    pub power_cycles: U128,
    pub power_on_hours: U128,
    pub unsafe_shutdowns: U128,
    pub media_errors: U128,
    pub num_error_log_entries: U128,
    pub warning_temperature_time: U32,
    pub critical_temperature_time: U32,
    pub temperature_sensor: [U16; 8],
    pub thermal_mgmt_temp1_transitions: U32,
    pub thermal_mgmt_temp2_transitions: U32,
    pub thermal_mgmt_temp1_time: U32,
    pub thermal_mgmt_temp2_time: U32,
    pub rsvd232: [u8; 280],
}
const _: () = assert!(core::mem::size_of::<SmartLog>() == 512);

impl Default for SmartLog {
    fn default() -> Self {
        SmartLog::new_zeroed()
    }
}

/// The SMART "data units" for a byte count: 512-byte units, reported in thousands and
/// rounded up (NVMe Base 2.0 Figure 207, Data Units Read).
pub fn data_units(bytes: u64) -> u128 {
    (bytes as u128).div_ceil(512).div_ceil(1000)
}

/// Firmware Slot Information log (NVMe Base 2.0 Figure 208), 512 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct FirmwareSlotLog {
    /// Active Firmware Info: bits 2:0 active slot, bits 6:4 slot for next reset.
    pub afi: u8,
    pub rsvd1: [u8; 7],
    /// Firmware Revision for Slot 1-7, ASCII.
    pub frs: [[u8; 8]; 7],
    pub rsvd64: [u8; 448],
}
const _: () = assert!(core::mem::size_of::<FirmwareSlotLog>() == 512);

impl Default for FirmwareSlotLog {
    fn default() -> Self {
        FirmwareSlotLog::new_zeroed()
    }
}

/// Commands Supported and Effects log (NVMe Base 2.0 Figure 210), 4096 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct CommandEffectsLog {
    /// Admin Command Supported, indexed by opcode.
    pub acs: [U32; 256],
    /// I/O Command Supported, indexed by opcode.
    pub iocs: [U32; 256],
    pub rsvd2048: [u8; 2048],
}
const _: () = assert!(core::mem::size_of::<CommandEffectsLog>() == 4096);

impl Default for CommandEffectsLog {
    fn default() -> Self {
        CommandEffectsLog::new_zeroed()
    }
}

/// Commands Supported and Effects entry bits (NVMe Base 2.0 Figure 211).
pub mod effects {
    /// Command Supported.
    pub const CSUPP: u32 = 1 << 0;
    /// Logical Block Content Change.
    pub const LBCC: u32 = 1 << 1;
    /// Namespace Capability Change.
    pub const NCC: u32 = 1 << 2;
    /// Namespace Inventory Change.
    pub const NIC: u32 = 1 << 3;
    /// Controller Capability Change.
    pub const CCC: u32 = 1 << 4;
}

/// Discovery log page header (NVMe-oF 1.1 Figure 31), 1024 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct DiscoveryLogHeader {
    /// Generation Counter: changes whenever the log's content changes.
    pub genctr: U64,
    /// Number of Records.
    pub numrec: U64,
    /// Record Format, 0.
    pub recfmt: U16,
    pub rsvd18: [u8; 1006],
}
const _: () = assert!(core::mem::size_of::<DiscoveryLogHeader>() == 1024);

impl Default for DiscoveryLogHeader {
    fn default() -> Self {
        DiscoveryLogHeader::new_zeroed()
    }
}

/// Discovery log page entry (NVMe-oF 1.1 Figure 32), 1024 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct DiscoveryLogEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    pub treq: u8,
    pub portid: U16,
    pub cntlid: U16,
    /// Admin Max SQ Size.
    pub asqsz: U16,
    pub eflags: U16,
    pub rsvd12: [u8; 20],
    /// Transport Service Identifier, ASCII, space padded (TCP/RDMA: the port number).
    pub trsvcid: [u8; 32],
    pub rsvd64: [u8; 192],
    /// NUL-terminated UTF-8.
    pub subnqn: [u8; 256],
    /// Transport Address, ASCII, space padded.
    pub traddr: [u8; 256],
    /// Transport Specific Address Subtype ([`RdmaTsas`] for RDMA).
    pub tsas: [u8; 256],
}
const _: () = assert!(core::mem::size_of::<DiscoveryLogEntry>() == 1024);

impl Default for DiscoveryLogEntry {
    fn default() -> Self {
        DiscoveryLogEntry::new_zeroed()
    }
}

/// Discovery log entry field values.
pub mod disc {
    pub const TRTYPE_RDMA: u8 = 1;
    pub const TRTYPE_FC: u8 = 2;
    pub const TRTYPE_TCP: u8 = 3;
    pub const ADRFAM_IPV4: u8 = 1;
    pub const ADRFAM_IPV6: u8 = 2;
    /// Referral to another discovery service.
    pub const SUBTYPE_REFERRAL: u8 = 1;
    pub const SUBTYPE_NVME: u8 = 2;
    pub const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;
    /// TREQ bits 1:0 = 00b: secure channel requirement not specified. What the Linux
    /// target sends: nvme-cli 2.3/libnvme 1.3 turns "not required" (10b) into a `tls`
    /// connect option that kernel 6.1 rejects, so `nvme connect-all` would connect nothing.
    pub const TREQ_SECURE_CHANNEL_NOT_SPECIFIED: u8 = 0b00;
    /// TREQ bits 1:0 = 10b: secure channel not required.
    pub const TREQ_SECURE_CHANNEL_NOT_REQUIRED: u8 = 0b10;
    /// TREQ bits 1:0 = 01b: secure channel required.
    pub const TREQ_SECURE_CHANNEL_REQUIRED: u8 = 0b01;
    /// TREQ bit 2: SQ flow control disable supported.
    pub const TREQ_DISABLE_SQ_FLOW: u8 = 1 << 2;
    /// EFLAGS bit 0: duplicate returned information; bit 1: explicit persistent
    /// connection support for discovery.
    pub const EFLAGS_DUPRETINFO: u16 = 1 << 0;
    pub const EFLAGS_EPCSD: u16 = 1 << 1;
    /// RDMA QPTYPE: reliable connected; PRTYPE: no provider specified; CMS: RDMA_CM.
    pub const RDMA_QPTYPE_CONNECTED: u8 = 1;
    pub const RDMA_PRTYPE_NOT_SPECIFIED: u8 = 1;
    pub const RDMA_CMS_RDMA_CM: u8 = 1;
    /// TCP SECTYPE: no security.
    pub const TCP_SECTYPE_NONE: u8 = 0;
    /// TCP SECTYPE: TLS 1.3 (NVMe/TCP Transport Specification, TP 8011).
    pub const TCP_SECTYPE_TLS13: u8 = 2;
}

/// RDMA Transport Specific Address Subtype (NVMe-oF 1.1 Figure 33), 256 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct RdmaTsas {
    pub qptype: u8,
    pub prtype: u8,
    pub cms: u8,
    pub rsvd3: [u8; 5],
    pub pkey: U16,
    pub rsvd10: [u8; 246],
}
const _: () = assert!(core::mem::size_of::<RdmaTsas>() == 256);

impl Default for RdmaTsas {
    fn default() -> Self {
        RdmaTsas::new_zeroed()
    }
}

/// Async event types and information (NVMe Base 2.0 Figures 146-150): the CQE DW0 of a
/// completed Asynchronous Event Request is type | info << 8 | log page << 16.
pub mod aen {
    /// SMART / Health status (type 1h) and its information (Base 2.0 Figure 148).
    pub const TYPE_SMART_HEALTH: u8 = 1;
    pub const INFO_RELIABILITY: u8 = 0x00;
    pub const INFO_TEMPERATURE: u8 = 0x01;
    pub const INFO_SPARE_BELOW_THRESHOLD: u8 = 0x02;
    pub const TYPE_NOTICE: u8 = 2;
    /// I/O Command specific status (type 6h).
    pub const TYPE_IO_COMMAND_SPECIFIC: u8 = 6;
    pub const INFO_NS_ATTRIBUTE_CHANGED: u8 = 0x00;
    pub const INFO_ANA_CHANGE: u8 = 0x03;
    /// Type 6h information 00h: Reservation Log Page Available.
    pub const INFO_RESERVATION_LOG_AVAILABLE: u8 = 0x00;
    pub const INFO_DISCOVERY_LOG_CHANGED: u8 = 0xf0;
    pub fn dw0(event_type: u8, info: u8, log_page: u8) -> u32 {
        event_type as u32 | (info as u32) << 8 | (log_page as u32) << 16
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
        fn log_structs_roundtrip(bytes in proptest::collection::vec(any::<u8>(), 4096)) {
            prop_assert!(roundtrip::<ErrorInformationEntry>(&bytes));
            prop_assert!(roundtrip::<SmartLog>(&bytes));
            prop_assert!(roundtrip::<FirmwareSlotLog>(&bytes));
            prop_assert!(roundtrip::<CommandEffectsLog>(&bytes));
            prop_assert!(roundtrip::<DiscoveryLogHeader>(&bytes));
            prop_assert!(roundtrip::<DiscoveryLogEntry>(&bytes));
            prop_assert!(roundtrip::<RdmaTsas>(&bytes));
        }
        /// Any SQE decodes; its fields write back to the same dwords and the transfer
        /// length is NUMD+1 dwords, never overflowing.
        #[test]
        fn get_log_page_from_any_sqe(bytes in proptest::collection::vec(any::<u8>(), 64)) {
            let sqe = Sqe::read_from_bytes(&bytes[..]).unwrap();
            let g = GetLogPage::from_sqe(&sqe);
            prop_assert!(g.len_bytes() >= 4 && g.len_bytes() <= 1 << 34);
            prop_assert_eq!(g.len_bytes() % 4, 0);
            let mut again = sqe;
            g.write_to(&mut again);
            prop_assert_eq!(GetLogPage::from_sqe(&again), g);
            prop_assert_eq!((again.cdw12, again.cdw13), (sqe.cdw12, sqe.cdw13));
        }
        #[test]
        fn get_log_page_roundtrip(lid: u8, lsp in 0u8..0x80, rae: bool, numd: u32, lsi: u16, lpo: u64, csi: u8) {
            let g = GetLogPage { lid, lsp, rae, numd, lsi, lpo, csi };
            let mut sqe = Sqe::default();
            g.write_to(&mut sqe);
            prop_assert_eq!(GetLogPage::from_sqe(&sqe), g);
        }
    }

    #[test]
    fn offsets() {
        assert_eq!(offset_of!(SmartLog, composite_temperature), 1);
        assert_eq!(offset_of!(SmartLog, data_units_read), 32);
        assert_eq!(offset_of!(SmartLog, host_write_commands), 80);
        assert_eq!(offset_of!(SmartLog, media_errors), 160);
        assert_eq!(offset_of!(SmartLog, warning_temperature_time), 192);
        assert_eq!(offset_of!(SmartLog, temperature_sensor), 200);
        assert_eq!(offset_of!(FirmwareSlotLog, frs), 8);
        assert_eq!(offset_of!(ErrorInformationEntry, nsid), 24);
        assert_eq!(offset_of!(ErrorInformationEntry, cs), 32);
        assert_eq!(offset_of!(CommandEffectsLog, iocs), 1024);
        assert_eq!(offset_of!(DiscoveryLogEntry, portid), 4);
        assert_eq!(offset_of!(DiscoveryLogEntry, asqsz), 8);
        assert_eq!(offset_of!(DiscoveryLogEntry, eflags), 10);
        assert_eq!(offset_of!(DiscoveryLogEntry, trsvcid), 32);
        assert_eq!(offset_of!(DiscoveryLogEntry, subnqn), 256);
        assert_eq!(offset_of!(DiscoveryLogEntry, traddr), 512);
        assert_eq!(offset_of!(DiscoveryLogEntry, tsas), 768);
        assert_eq!(offset_of!(RdmaTsas, pkey), 8);
    }

    #[test]
    fn units() {
        assert_eq!(data_units(0), 0);
        assert_eq!(data_units(1), 1);
        assert_eq!(data_units(512 * 1000), 1);
        assert_eq!(data_units(512 * 1000 + 1), 2);
    }

    /// Get Log Page as the wire carries it (NVMe Base 2.0 Figures 197-201: CDW10 LID 7:0,
    /// LSP 14:8, RAE 15, NUMDL 31:16; CDW11 NUMDU 15:0, LSI 31:16; CDW12/13 LPOL/LPOU;
    /// CDW14 CSI 31:24).
    #[test]
    fn get_log_page_fixed_bytes() {
        // SMART / Health (02h), 512 bytes (NUMD 127), RAE set.
        let mut b = [0u8; 64];
        b[0] = 0x02; // opcode: Get Log Page
        b[40..44].copy_from_slice(&[0x02, 0x80, 0x7f, 0x00]);
        let sqe = Sqe::from_bytes(&b).unwrap();
        let g = GetLogPage::from_sqe(&sqe);
        assert_eq!(
            (g.lid, g.lsp, g.rae, g.numd, g.len_bytes()),
            (2, 0, true, 127, 512)
        );
        let mut built = Sqe::default();
        built.set_opcode_cid(0x02, 0);
        g.write_to(&mut built);
        assert_eq!(built.as_bytes(), &b[..]);
        // Discovery (70h) from byte 1024, NUMD 100FFh (NUMDU 1), LSI 0, CSI 0.
        let mut b = [0u8; 64];
        b[0] = 0x02;
        b[40..44].copy_from_slice(&[0x70, 0x00, 0xff, 0x00]);
        b[44] = 0x01;
        b[48..52].copy_from_slice(&[0x00, 0x04, 0x00, 0x00]);
        let g = GetLogPage::from_sqe(&Sqe::from_bytes(&b).unwrap());
        assert_eq!((g.lid, g.numd, g.lpo), (0x70, 0x1_00ff, 1024));
        let mut built = Sqe::default();
        built.set_opcode_cid(0x02, 0);
        g.write_to(&mut built);
        assert_eq!(built.as_bytes(), &b[..]);
    }
}
