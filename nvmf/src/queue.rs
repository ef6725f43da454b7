//! Submission-queue rules every transport applies the same way, as pure functions the
//! engines call per capsule and per completion: the SQ Head Pointer a completion reports
//! (NVMe Base 2.0 section 4.1, NVMe-oF 1.1 section 3.3.1 on SQ flow control) and how a
//! command's data SGL length must match the length its other fields imply.
//!
//! Nothing here keeps state: the transport stores the head and the queue size it learned
//! from Fabrics Connect and passes them in.

use crate::spec::Status;

/// SQHD of every completion of a queue whose host disabled SQ flow control (Connect CATTR
/// bit 2): NVMe-oF 1.1 section 3.3.1 says the controller shall report FFFFh then.
pub const SQHD_FLOW_CONTROL_DISABLED: u16 = 0xffff;

/// Entries of an admin queue before Connect has said how many (the 32 every host uses).
pub const DEFAULT_ADMIN_SQ_ENTRIES: u32 = 32;

/// The head after one more command was taken from a queue of `entries` entries
/// (SQSIZE + 1). The head wraps at the queue size the host negotiated, admin queue included.
pub fn advance_sq_head(head: u16, entries: u32) -> u16 {
    let entries = entries.clamp(1, 0x1_0000);
    ((head as u32 + 1) % entries) as u16
}

/// The SQHD a completion carries: the current head, or FFFFh when the host disabled SQ
/// flow control on this queue. Every completion of the queue gets it, the ones the
/// engine builds itself included.
pub fn sqhd(head: u16, flow_control_disabled: bool) -> u16 {
    if flow_control_disabled {
        SQHD_FLOW_CONTROL_DISABLED
    } else {
        head
    }
}

/// How a command's data SGL length must relate to the transfer its other fields imply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SglRule {
    /// Exactly the transfer (Read, Write, Compare): a longer SGL is as wrong as a shorter
    /// one. Linux nvmet checks `transfer_len == data_len` the same way.
    Exact,
    /// At least the transfer (Dataset Management: the host may describe a whole buffer
    /// of which the ranges use the front, and nvmet accepts that).
    AtLeast,
}

/// `Ok` when an SGL of `sgl_len` bytes fits a transfer of `transfer` bytes under `rule`,
/// otherwise Data SGL Length Invalid (NVMe Base 2.0 Figure 101, SC 0Fh).
pub fn check_sgl_length(sgl_len: u32, transfer: u32, rule: SglRule) -> Result<(), Status> {
    let ok = match rule {
        SglRule::Exact => sgl_len == transfer,
        SglRule::AtLeast => sgl_len >= transfer,
    };
    if ok {
        Ok(())
    } else {
        Err(Status::DATA_SGL_LENGTH_INVALID)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn admin_head_wraps_at_the_negotiated_size() {
        // An admin queue of 128 entries (SQSIZE 127) wraps at 128, not 32.
        let mut h = 0;
        for _ in 0..40 {
            h = advance_sq_head(h, 128);
        }
        assert_eq!(h, 40);
        let mut h = 127;
        h = advance_sq_head(h, 128);
        assert_eq!(h, 0);
        // Two entries (SQSIZE 1), the smallest queue.
        assert_eq!(advance_sq_head(1, 2), 0);
        assert_eq!(advance_sq_head(0, 65536), 1);
        assert_eq!(advance_sq_head(65535, 65536), 0);
    }

    #[test]
    fn flow_control_disabled_reports_ffffh() {
        assert_eq!(sqhd(7, true), 0xffff);
        assert_eq!(sqhd(7, false), 7);
    }

    #[test]
    fn sgl_length_rules() {
        assert_eq!(check_sgl_length(4096, 4096, SglRule::Exact), Ok(()));
        assert_eq!(
            check_sgl_length(8192, 4096, SglRule::Exact),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
        assert_eq!(
            check_sgl_length(2048, 4096, SglRule::Exact),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
        assert_eq!(check_sgl_length(8192, 32, SglRule::AtLeast), Ok(()));
        assert_eq!(
            check_sgl_length(16, 32, SglRule::AtLeast),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
    }

    proptest! {
        #[test]
        fn head_stays_below_the_queue_size(head in any::<u16>(), entries in 2u32..=65536) {
            let h = advance_sq_head((head as u32 % entries) as u16, entries);
            prop_assert!((h as u32) < entries);
        }
    }
}
