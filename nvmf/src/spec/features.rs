//! Get Features / Set Features (NVMe Base 2.0 section 5.15, 5.27): feature identifiers,
//! command fields and the value layouts the target uses.
//!
//! Not implemented: saveable features (SV / SEL = saved), host memory buffer, timestamp,
//! autonomous power state transitions, host behavior support, LBA range type.

use super::Sqe;

/// Feature identifiers (NVMe Base 2.0 Figure 317).
pub mod fid {
    pub const ARBITRATION: u8 = 0x01;
    pub const POWER_MANAGEMENT: u8 = 0x02;
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    pub const INTERRUPT_VECTOR_CONFIG: u8 = 0x09;
    pub const WRITE_ATOMICITY: u8 = 0x0a;
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0b;
    pub const KEEP_ALIVE_TIMER: u8 = 0x0f;
    pub const HOST_IDENTIFIER: u8 = 0x81;
    /// Reservation Notification Mask (namespace scope, per controller).
    pub const RESERVATION_NOTIFICATION_MASK: u8 = 0x82;
    /// Reservation Persistence: PTPL (namespace scope).
    pub const RESERVATION_PERSISTENCE: u8 = 0x83;
}

/// Get Features SEL values.
pub mod sel {
    pub const CURRENT: u8 = 0;
    pub const DEFAULT: u8 = 1;
    pub const SAVED: u8 = 2;
    pub const SUPPORTED_CAPABILITIES: u8 = 3;
}

/// Supported-capabilities bits returned for SEL = 3 (NVMe Base 2.0 Figure 195).
pub mod capabilities {
    pub const SAVEABLE: u32 = 1 << 0;
    pub const NAMESPACE_SPECIFIC: u32 = 1 << 1;
    pub const CHANGEABLE: u32 = 1 << 2;
}

/// Asynchronous Event Configuration bits (Figure 325).
pub mod async_event_config {
    pub const NS_ATTRIBUTE_NOTICES: u32 = 1 << 8;
    /// Asymmetric Namespace Access Change Notices.
    pub const ANA_CHANGE_NOTICES: u32 = 1 << 11;
    pub const DISCOVERY_LOG_CHANGE_NOTICES: u32 = 1 << 31;
}

/// The fields of Get Features / Set Features that select the feature.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeatureCommand {
    pub fid: u8,
    /// Get Features: SEL (CDW10 bits 10:8).
    pub sel: u8,
    /// Set Features: Save (CDW10 bit 31).
    pub sv: bool,
    /// Feature specific value (CDW11).
    pub value: u32,
}

impl FeatureCommand {
    pub fn from_sqe(sqe: &Sqe) -> FeatureCommand {
        FeatureCommand {
            fid: sqe.cdw10 as u8,
            sel: ((sqe.cdw10 >> 8) & 7) as u8,
            sv: sqe.cdw10 & (1 << 31) != 0,
            value: sqe.cdw11,
        }
    }
    pub fn write_to(&self, sqe: &mut Sqe) {
        sqe.cdw10 = self.fid as u32 | ((self.sel & 7) as u32) << 8 | (self.sv as u32) << 31;
        sqe.cdw11 = self.value;
    }
}

/// Number of Queues (Figure 322): NSQR/NSQA bits 15:0, NCQR/NCQA bits 31:16, 0's based.
pub fn number_of_queues(nsq_0based: u16, ncq_0based: u16) -> u32 {
    nsq_0based as u32 | (ncq_0based as u32) << 16
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use zerocopy::IntoBytes;

    proptest! {
        #[test]
        fn feature_command_roundtrip(fid: u8, sel in 0u8..8, sv: bool, value: u32) {
            let f = FeatureCommand { fid, sel, sv, value };
            let mut sqe = Sqe::default();
            f.write_to(&mut sqe);
            prop_assert_eq!(FeatureCommand::from_sqe(&sqe), f);
        }
        #[test]
        fn feature_command_from_any_sqe(cdw10: u32, cdw11: u32) {
            let sqe = Sqe { cdw10, cdw11, ..Default::default() };
            let f = FeatureCommand::from_sqe(&sqe);
            prop_assert!(f.sel < 8);
            let mut again = Sqe::default();
            f.write_to(&mut again);
            prop_assert_eq!(FeatureCommand::from_sqe(&again), f);
            prop_assert_eq!(again.cdw11, cdw11);
        }
    }

    /// Get/Set Features fields as the wire carries them (CDW10: FID 7:0, SEL 10:8 for
    /// Get, SV 31 for Set; CDW11 the value; FIDs per NVMe Base 2.0 Figure 317).
    #[test]
    fn feature_command_fixed_bytes() {
        // Set Features, Number of Queues (07h): 4 SQs and 4 CQs (0's based 3 and 3,
        // Figure 322), saved.
        let mut b = [0u8; 64];
        b[0] = 0x09;
        b[40..44].copy_from_slice(&[0x07, 0x00, 0x00, 0x80]);
        b[44..48].copy_from_slice(&[0x03, 0x00, 0x03, 0x00]);
        let sqe = crate::spec::Sqe::from_bytes(&b).unwrap();
        let f = FeatureCommand::from_sqe(&sqe);
        assert_eq!((f.fid, f.sel, f.sv, f.value), (0x07, 0, true, 0x0003_0003));
        let mut built = crate::spec::Sqe::default();
        built.set_opcode_cid(0x09, 0);
        f.write_to(&mut built);
        assert_eq!(built.as_bytes(), &b[..]);
        // Get Features, Arbitration (01h), SEL 3 (supported capabilities).
        let mut b = [0u8; 64];
        b[0] = 0x0a;
        b[40..44].copy_from_slice(&[0x01, 0x03, 0x00, 0x00]);
        let f = FeatureCommand::from_sqe(&crate::spec::Sqe::from_bytes(&b).unwrap());
        assert_eq!((f.fid, f.sel, f.sv), (0x01, 3, false));
    }
}
