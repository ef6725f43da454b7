//! Completion status (NVMe Base 2.0, Figure 92 "Completion Queue Entry: Status Field"):
//! the error type of the command path.

/// Status Code Type values.
pub mod sct {
    pub const GENERIC: u8 = 0;
    pub const COMMAND_SPECIFIC: u8 = 1;
    pub const MEDIA: u8 = 2;
    pub const PATH: u8 = 3;
    pub const VENDOR: u8 = 7;
}

/// The status of a completed command: what the host sees in CQE DW3 bits 31:17.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Status {
    pub sct: u8,
    pub sc: u8,
    /// Do Not Retry.
    pub dnr: bool,
    /// More information in the Error Information log.
    pub more: bool,
}

macro_rules! statuses {
    ($($(#[$m:meta])* $name:ident = ($sct:expr, $sc:expr, $dnr:expr);)*) => {
        impl Status {
            $($(#[$m])* pub const $name: Status = Status { sct: $sct, sc: $sc, dnr: $dnr, more: false };)*
        }
    };
}

statuses! {
    SUCCESS = (sct::GENERIC, 0x00, false);
    INVALID_OPCODE = (sct::GENERIC, 0x01, true);
    INVALID_FIELD = (sct::GENERIC, 0x02, true);
    COMMAND_ID_CONFLICT = (sct::GENERIC, 0x03, true);
    DATA_TRANSFER_ERROR = (sct::GENERIC, 0x04, false);
    INTERNAL_ERROR = (sct::GENERIC, 0x06, false);
    ABORT_REQUESTED = (sct::GENERIC, 0x07, false);
    ABORTED_SQ_DELETION = (sct::GENERIC, 0x08, false);
    /// The other command of a fused pair failed (NVMe Base 2.0 section 3.4.2).
    ABORTED_FAILED_FUSED = (sct::GENERIC, 0x09, false);
    /// The first command of a fused pair came without its second one, or the reverse.
    ABORTED_MISSING_FUSED = (sct::GENERIC, 0x0a, false);
    INVALID_NAMESPACE = (sct::GENERIC, 0x0b, true);
    COMMAND_SEQUENCE_ERROR = (sct::GENERIC, 0x0c, true);
    INVALID_SGL_SEGMENT_DESCRIPTOR = (sct::GENERIC, 0x0d, true);
    INVALID_NUMBER_OF_SGL_DESCRIPTORS = (sct::GENERIC, 0x0e, true);
    DATA_SGL_LENGTH_INVALID = (sct::GENERIC, 0x0f, true);
    SGL_DESCRIPTOR_TYPE_INVALID = (sct::GENERIC, 0x11, true);
    SGL_OFFSET_INVALID = (sct::GENERIC, 0x16, true);
    HOST_IDENTIFIER_INCONSISTENT = (sct::GENERIC, 0x18, true);
    KEEP_ALIVE_TIMER_EXPIRED = (sct::GENERIC, 0x19, false);
    COMMAND_ABORTED_BY_HOST = (sct::GENERIC, 0x1c, false);
    /// The controller could not finish the command for a reason of its own (here: out of
    /// buffers); the host should retry it (NVMe Base 2.0 Figure 101).
    COMMAND_INTERRUPTED = (sct::GENERIC, 0x21, false);
    TRANSIENT_TRANSPORT_ERROR = (sct::GENERIC, 0x22, false);
    LBA_OUT_OF_RANGE = (sct::GENERIC, 0x80, true);
    CAPACITY_EXCEEDED = (sct::GENERIC, 0x81, true);
    NAMESPACE_NOT_READY = (sct::GENERIC, 0x82, false);
    /// The command conflicts with a reservation on the namespace (NVMe Base 2.0 section
    /// 8.19); retrying does not help, so DNR is set, as nvmet and SPDK do.
    RESERVATION_CONFLICT = (sct::GENERIC, 0x83, true);

    INVALID_QUEUE_IDENTIFIER = (sct::COMMAND_SPECIFIC, 0x01, true);
    INVALID_QUEUE_SIZE = (sct::COMMAND_SPECIFIC, 0x02, true);
    ABORT_COMMAND_LIMIT_EXCEEDED = (sct::COMMAND_SPECIFIC, 0x03, true);
    ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED = (sct::COMMAND_SPECIFIC, 0x05, true);
    INVALID_FIRMWARE_SLOT = (sct::COMMAND_SPECIFIC, 0x06, true);
    INVALID_FORMAT = (sct::COMMAND_SPECIFIC, 0x0a, true);
    INVALID_LOG_PAGE = (sct::COMMAND_SPECIFIC, 0x09, true);
    FEATURE_ID_NOT_SAVEABLE = (sct::COMMAND_SPECIFIC, 0x0d, true);
    FEATURE_NOT_CHANGEABLE = (sct::COMMAND_SPECIFIC, 0x0e, true);
    FEATURE_NOT_NAMESPACE_SPECIFIC = (sct::COMMAND_SPECIFIC, 0x0f, true);
    /// NVM command set: Dataset Management / Write Zeroes with conflicting attributes.
    CONFLICTING_ATTRIBUTES = (sct::COMMAND_SPECIFIC, 0x80, true);
    /// NVM command set: a Copy beyond MSSRL, MCL or MSRC.
    COMMAND_SIZE_LIMIT_EXCEEDED = (sct::COMMAND_SPECIFIC, 0x83, true);
    /// Fabrics Connect (NVMe-oF 1.1 Figure 21).
    CONNECT_INCOMPATIBLE_FORMAT = (sct::COMMAND_SPECIFIC, 0x80, true);
    CONNECT_CONTROLLER_BUSY = (sct::COMMAND_SPECIFIC, 0x81, false);
    CONNECT_INVALID_PARAMETERS = (sct::COMMAND_SPECIFIC, 0x82, true);
    CONNECT_RESTART_DISCOVERY = (sct::COMMAND_SPECIFIC, 0x83, true);
    CONNECT_INVALID_HOST = (sct::COMMAND_SPECIFIC, 0x84, true);
    /// Fabrics: a command on a queue type it does not apply to (Disconnect on the admin
    /// queue).
    INVALID_QUEUE_TYPE = (sct::COMMAND_SPECIFIC, 0x85, true);
    /// A command other than Authentication Send/Receive on a queue that must
    /// authenticate first (NVMe Base 2.0 Figure 103; nvmet's NVME_SC_AUTH_REQUIRED).
    AUTHENTICATION_REQUIRED = (sct::COMMAND_SPECIFIC, 0x91, true);

    /// Path Related Status (SCT 3h): the controller cannot reach the namespace's storage
    /// (NVMe Base 2.0 Figure 103). Without DNR a multipath host retries on another path.
    INTERNAL_PATH_ERROR = (sct::PATH, 0x00, false);

    WRITE_FAULT = (sct::MEDIA, 0x80, false);
    UNRECOVERED_READ_ERROR = (sct::MEDIA, 0x81, false);
    COMPARE_FAILURE = (sct::MEDIA, 0x85, true);
    ACCESS_DENIED = (sct::MEDIA, 0x86, true);

    /// Path related (SCT 3h, NVMe Base 2.0 Figure 100): the namespace is in the ANA
    /// Persistent Loss, Inaccessible or Change state on this controller. DNR stays clear:
    /// the Linux host fails a command with a path status over to another path
    /// (`nvme_decide_disposition`: only without DNR) and re-reads the ANA log.
    ANA_PERSISTENT_LOSS = (sct::PATH, 0x01, false);
    ANA_INACCESSIBLE = (sct::PATH, 0x02, false);
    ANA_TRANSITION = (sct::PATH, 0x03, false);
}

impl Status {
    pub fn is_success(&self) -> bool {
        self.sct == 0 && self.sc == 0
    }
    /// The 16-bit CQE status word with the phase tag clear.
    pub fn to_field(self) -> u16 {
        (self.sc as u16) << 1
            | ((self.sct & 7) as u16) << 9
            | (self.more as u16) << 14
            | (self.dnr as u16) << 15
    }
    pub fn from_field(f: u16) -> Status {
        Status {
            sc: (f >> 1) as u8,
            sct: ((f >> 9) & 7) as u8,
            more: f & (1 << 14) != 0,
            dnr: f & (1 << 15) != 0,
        }
    }
    pub const fn with_dnr(self, dnr: bool) -> Status {
        Status { dnr, ..self }
    }
}

impl Status {
    /// The spec's name of a status the data path answers (generic, media and path
    /// statuses; command-specific ones depend on the opcode), for log lines.
    pub fn name(self) -> Option<&'static str> {
        let s = Status {
            dnr: false,
            more: false,
            ..self
        };
        let known: &[(Status, &str)] = &[
            (Status::SUCCESS, "Successful Completion"),
            (Status::INVALID_OPCODE, "Invalid Command Opcode"),
            (Status::INVALID_FIELD, "Invalid Field in Command"),
            (Status::DATA_TRANSFER_ERROR, "Data Transfer Error"),
            (Status::INTERNAL_ERROR, "Internal Error"),
            (Status::ABORT_REQUESTED, "Command Abort Requested"),
            (
                Status::ABORTED_SQ_DELETION,
                "Command Aborted due to SQ Deletion",
            ),
            (
                Status::ABORTED_FAILED_FUSED,
                "Command Aborted due to Failed Fused Command",
            ),
            (
                Status::ABORTED_MISSING_FUSED,
                "Command Aborted due to Missing Fused Command",
            ),
            (Status::INVALID_NAMESPACE, "Invalid Namespace or Format"),
            (Status::DATA_SGL_LENGTH_INVALID, "Data SGL Length Invalid"),
            (
                Status::SGL_DESCRIPTOR_TYPE_INVALID,
                "SGL Descriptor Type Invalid",
            ),
            (Status::SGL_OFFSET_INVALID, "SGL Offset Invalid"),
            (Status::COMMAND_INTERRUPTED, "Command Interrupted"),
            (
                Status::TRANSIENT_TRANSPORT_ERROR,
                "Transient Transport Error",
            ),
            (Status::LBA_OUT_OF_RANGE, "LBA Out of Range"),
            (Status::CAPACITY_EXCEEDED, "Capacity Exceeded"),
            (Status::NAMESPACE_NOT_READY, "Namespace Not Ready"),
            (Status::RESERVATION_CONFLICT, "Reservation Conflict"),
            (Status::WRITE_FAULT, "Write Fault"),
            (Status::UNRECOVERED_READ_ERROR, "Unrecovered Read Error"),
            (Status::COMPARE_FAILURE, "Compare Failure"),
            (Status::ACCESS_DENIED, "Access Denied"),
            (Status::INTERNAL_PATH_ERROR, "Internal Path Error"),
            (
                Status::ANA_PERSISTENT_LOSS,
                "Asymmetric Access Persistent Loss",
            ),
            (Status::ANA_INACCESSIBLE, "Asymmetric Access Inaccessible"),
            (Status::ANA_TRANSITION, "Asymmetric Access Transition"),
        ];
        known
            .iter()
            .find(|(k, _)| k.sct == s.sct && k.sc == s.sc)
            .map(|(_, n)| *n)
    }
}

impl core::fmt::Display for Status {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "sct {:#x} sc {:#04x}{}",
            self.sct,
            self.sc,
            if self.dnr { " dnr" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn names_ignore_dnr_and_know_only_their_type() {
        assert_eq!(Status::CAPACITY_EXCEEDED.name(), Some("Capacity Exceeded"));
        assert_eq!(
            Status::INTERNAL_ERROR.with_dnr(true).name(),
            Some("Internal Error")
        );
        assert_eq!(Status::WRITE_FAULT.name(), Some("Write Fault"));
        // 01h/80h is Conflicting Attributes for DSM and Incompatible Format for Connect.
        assert_eq!(Status::CONFLICTING_ATTRIBUTES.name(), None);
    }

    #[test]
    fn field_roundtrip() {
        for s in [
            Status::LBA_OUT_OF_RANGE,
            Status::CONNECT_INVALID_HOST,
            Status::SUCCESS,
        ] {
            assert_eq!(Status::from_field(s.to_field()), s);
        }
        // Invalid Namespace with DNR, as the kernel decodes it: 0x400b.
        assert_eq!(Status::INVALID_NAMESPACE.to_field() >> 1, 0x400b);
    }
}
