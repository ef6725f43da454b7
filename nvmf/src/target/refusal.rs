//! Why the target refused a host or took something away from it, in a form a daemon can
//! log and count: every refused Connect, every CC.EN that ended in CSTS.CFS and every
//! keep-alive expiry becomes a [`Refusal`] (and a few noteworthy acceptances a
//! [`Notice::EmptyHostNqnAccepted`]), queued in the [`Target`](super::Target) until
//! [`Target::take_notices`](super::Target::take_notices) drains them.
//!
//! Each [`RefusalReason`] has a stable snake_case [`label`](RefusalReason::label) for
//! metrics (the set is [`RefusalReason::LABELS`]) and a sentence (`Display`) for logs.

use super::QueueKey;
use crate::spec::Status;
use std::fmt;

/// What was refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefusalReason {
    /// A command other than Connect on a queue that has not connected.
    NotConnected,
    /// A second Connect on a queue that is already connected.
    AlreadyConnected,
    /// Connect RECFMT other than 0.
    IncompatibleFormat { recfmt: u16 },
    /// Connect data shorter than its 1024 bytes.
    ShortConnectData { len: usize },
    /// SUBNQN not NUL-terminated UTF-8 or not an NQN.
    InvalidSubsystemNqn,
    /// HOSTNQN not NUL-terminated UTF-8 or not an NQN.
    InvalidHostNqn,
    /// No subsystem has that NQN.
    UnknownSubsystem,
    /// The subsystem exists but is not exposed on the listener the host came in on.
    SubsystemNotOnListener,
    /// The subsystem's host list does not name the host.
    HostNotAllowed,
    /// An empty Host NQN (what SPDK's `spdk_nvme_perf` sends when `-r` has no hostnqn)
    /// to a subsystem with a host list.
    EmptyHostNqnNotAllowed,
    /// Admin Connect naming a CNTLID (only the dynamic model, FFFFh, exists).
    StaticControllerId { cntlid: u16 },
    /// Admin queue SQSIZE (0's based) out of range.
    AdminQueueSize { sqsize: u16, max: u16 },
    /// I/O queue SQSIZE (0's based) out of range.
    IoQueueSize { sqsize: u16, max: u16 },
    /// Every controller ID is in use.
    ControllerIdsExhausted,
    /// I/O Connect naming a CNTLID that is not a live controller of that subsystem and host.
    UnknownController { cntlid: u16 },
    /// I/O Connect to a discovery controller.
    IoQueueOnDiscovery,
    /// I/O Connect before the controller was enabled (CC.EN = 1, CSTS.RDY = 1).
    ControllerNotEnabled,
    /// I/O Connect for a QID above the granted number of queues.
    QueueIdOutOfRange { qid: u16, max: u16 },
    /// I/O Connect for a QID that is already connected.
    QueueIdInUse { qid: u16 },
    /// CC.EN = 1 with a configuration the controller cannot run: it reports CSTS.CFS.
    InvalidControllerConfiguration { field: &'static str, value: u32 },
    /// No Keep Alive (or other admin command) within KATO: the controller is destroyed.
    KeepAliveExpired { kato_ms: u32 },
    /// The subsystem requires authentication and the target holds no DH-HMAC-CHAP
    /// secret for this host.
    NoCredentials,
    /// DH-HMAC-CHAP failed: we sent AUTH_Failure1 (wrong secret, nothing in common, a
    /// bad message) or the host sent AUTH_Failure2 (`by_host`). The controller is
    /// destroyed, as nvmet does.
    AuthenticationFailed {
        reason: crate::auth::FailureReason,
        by_host: bool,
    },
    /// A queue that must authenticate did not finish within the time allowed.
    AuthenticationTimeout { secs: u64 },
    /// The host closed the admin queue without authenticating (the Linux host does so
    /// when the target asks for authentication and it has no secret).
    AuthenticationAbandoned,
    /// A command other than Authentication Send/Receive before the queue authenticated.
    AuthenticationRequired { opcode: u8 },
    /// The host NQN failed or abandoned `strikes` authentications from this address
    /// within the last `secs`, and has `under_way` first authentications of other
    /// controllers from there still running: together at the bound, no new transaction
    /// (and no DH work) until some end or age out.
    AuthenticationThrottled {
        strikes: usize,
        under_way: usize,
        secs: u64,
    },
    /// An authenticated queue began more than `count` DH-HMAC-CHAP transactions within
    /// `secs` (answered Command Interrupted; the queue stays).
    ReauthenticationTooSoon { count: usize, secs: u64 },
    /// The queue came over TLS with a PSK for another host or subsystem than the Connect
    /// names (a PSK is bound to one host NQN and one subsystem NQN).
    TlsIdentityMismatch { identity: String },
    /// Reservation Register would add a registrant to a namespace that has
    /// [`MAX_REGISTRANTS`](super::reservation::MAX_REGISTRANTS) already.
    RegistrantsFull { nsid: u32, max: usize },
    /// A Register that would add a registrant past what one host NQN (or, `by_address`,
    /// one peer address) may hold on the namespace.
    RegistrantsQuota {
        nsid: u32,
        max: usize,
        by_address: bool,
    },
}

impl RefusalReason {
    /// Every label [`label`](Self::label) can return, for metrics that export them all.
    pub const LABELS: &'static [&'static str] = &[
        "not_connected",
        "already_connected",
        "incompatible_format",
        "short_connect_data",
        "invalid_subsystem_nqn",
        "invalid_host_nqn",
        "unknown_subsystem",
        "subsystem_not_on_listener",
        "host_not_allowed",
        "empty_host_nqn_not_allowed",
        "static_controller_id",
        "invalid_admin_queue_size",
        "invalid_io_queue_size",
        "controller_ids_exhausted",
        "unknown_controller",
        "io_queue_on_discovery",
        "controller_not_enabled",
        "queue_id_out_of_range",
        "queue_id_in_use",
        "controller_fatal_status",
        "keep_alive_expired",
        "no_credentials",
        "authentication_failed",
        "authentication_timeout",
        "authentication_abandoned",
        "authentication_required",
        "tls_identity_mismatch",
        "authentication_throttled",
        "reauthentication_too_soon",
        "reservation_registrants_full",
        "reservation_registrants_quota",
    ];

    /// A stable snake_case name for metrics labels.
    pub fn label(&self) -> &'static str {
        use RefusalReason as R;
        match self {
            R::NotConnected => "not_connected",
            R::AlreadyConnected => "already_connected",
            R::IncompatibleFormat { .. } => "incompatible_format",
            R::ShortConnectData { .. } => "short_connect_data",
            R::InvalidSubsystemNqn => "invalid_subsystem_nqn",
            R::InvalidHostNqn => "invalid_host_nqn",
            R::UnknownSubsystem => "unknown_subsystem",
            R::SubsystemNotOnListener => "subsystem_not_on_listener",
            R::HostNotAllowed => "host_not_allowed",
            R::EmptyHostNqnNotAllowed => "empty_host_nqn_not_allowed",
            R::StaticControllerId { .. } => "static_controller_id",
            R::AdminQueueSize { .. } => "invalid_admin_queue_size",
            R::IoQueueSize { .. } => "invalid_io_queue_size",
            R::ControllerIdsExhausted => "controller_ids_exhausted",
            R::UnknownController { .. } => "unknown_controller",
            R::IoQueueOnDiscovery => "io_queue_on_discovery",
            R::ControllerNotEnabled => "controller_not_enabled",
            R::QueueIdOutOfRange { .. } => "queue_id_out_of_range",
            R::QueueIdInUse { .. } => "queue_id_in_use",
            R::InvalidControllerConfiguration { .. } => "controller_fatal_status",
            R::KeepAliveExpired { .. } => "keep_alive_expired",
            R::NoCredentials => "no_credentials",
            R::AuthenticationFailed { .. } => "authentication_failed",
            R::AuthenticationTimeout { .. } => "authentication_timeout",
            R::AuthenticationAbandoned => "authentication_abandoned",
            R::AuthenticationThrottled { .. } => "authentication_throttled",
            R::ReauthenticationTooSoon { .. } => "reauthentication_too_soon",
            R::AuthenticationRequired { .. } => "authentication_required",
            R::TlsIdentityMismatch { .. } => "tls_identity_mismatch",
            R::RegistrantsFull { .. } => "reservation_registrants_full",
            R::RegistrantsQuota { .. } => "reservation_registrants_quota",
        }
    }
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use RefusalReason as R;
        match self {
            R::NotConnected => f.write_str("a command other than Fabrics Connect on a queue that has not connected"),
            R::AlreadyConnected => f.write_str("a second Fabrics Connect on a queue that is already connected"),
            R::IncompatibleFormat { recfmt } => {
                write!(f, "Connect record format {recfmt} is not supported (only 0)")
            }
            R::ShortConnectData { len } => {
                write!(f, "Connect data is {len} bytes, it must be 1024")
            }
            R::InvalidSubsystemNqn => f.write_str("the subsystem NQN in the Connect data is not a valid NQN"),
            R::InvalidHostNqn => f.write_str("the host NQN in the Connect data is not a valid NQN"),
            R::UnknownSubsystem => f.write_str("no subsystem has this NQN"),
            R::SubsystemNotOnListener => f.write_str("the subsystem is not exposed on the listener the host connected to"),
            R::HostNotAllowed => f.write_str("the host NQN is not in the subsystem's hosts list"),
            R::EmptyHostNqnNotAllowed => f.write_str(
                "the host sent an empty host NQN (SPDK's spdk_nvme_perf does when -r has no hostnqn) \
                 and the subsystem only allows the hosts in its list",
            ),
            R::StaticControllerId { cntlid } => write!(
                f,
                "admin Connect asked for controller ID {cntlid:#06x}; only the dynamic model (0xffff) is supported"
            ),
            R::AdminQueueSize { sqsize, max } => write!(
                f,
                "admin queue SQSIZE {sqsize} (0's based) is outside 1..={max}"
            ),
            R::IoQueueSize { sqsize, max } => write!(
                f,
                "I/O queue SQSIZE {sqsize} (0's based) is outside 1..={max}"
            ),
            R::ControllerIdsExhausted => f.write_str("every controller ID is in use"),
            R::UnknownController { cntlid } => write!(
                f,
                "I/O queue Connect names controller {cntlid}, which is not a live controller of this subsystem and host"
            ),
            R::IoQueueOnDiscovery => f.write_str("I/O queue Connect to a discovery controller"),
            R::ControllerNotEnabled => f.write_str("I/O queue Connect before the controller was enabled (CC.EN=1)"),
            R::QueueIdOutOfRange { qid, max } => write!(
                f,
                "I/O queue ID {qid} is above the {max} queue(s) granted (Set Features Number of Queues)"
            ),
            R::QueueIdInUse { qid } => write!(f, "I/O queue ID {qid} is already connected"),
            R::InvalidControllerConfiguration { field, value } => write!(
                f,
                "CC.EN=1 with {field}={value}, which this controller does not support: CSTS.CFS set"
            ),
            R::KeepAliveExpired { kato_ms } => write!(
                f,
                "no Keep Alive within the keep-alive timeout ({kato_ms} ms): controller destroyed"
            ),
            R::NoCredentials => f.write_str(
                "the subsystem requires DH-HMAC-CHAP authentication and no secret is configured for this host",
            ),
            R::AuthenticationFailed { reason, by_host: false } => write!(
                f,
                "DH-HMAC-CHAP authentication failed: {} (sent AUTH_Failure1): controller destroyed",
                reason.text()
            ),
            R::AuthenticationFailed { reason, by_host: true } => write!(
                f,
                "DH-HMAC-CHAP authentication failed on the host's side: {} (host sent AUTH_Failure2): controller destroyed",
                reason.text()
            ),
            R::AuthenticationTimeout { secs } => write!(
                f,
                "the queue did not complete DH-HMAC-CHAP authentication within {secs} s: controller destroyed"
            ),
            R::AuthenticationAbandoned => f.write_str(
                "the host closed the connection without authenticating (the target asked for DH-HMAC-CHAP; \
                 a host without a secret, e.g. nvme connect without --dhchap-secret, gives up so)",
            ),
            R::AuthenticationRequired { opcode } => write!(
                f,
                "command (opcode {opcode:#04x}) before the queue authenticated: answered Authentication Required"
            ),
            R::AuthenticationThrottled {
                strikes,
                under_way,
                secs,
            } => write!(
                f,
                "this host failed or abandoned {strikes} DH-HMAC-CHAP authentications from this address in the \
                 last {secs} s{}: no new one until they age out (AUTH_Send answered Command Interrupted): \
                 controller destroyed",
                if *under_way > 0 {
                    format!(" and has {under_way} more under way on other controllers")
                } else {
                    String::new()
                }
            ),
            R::ReauthenticationTooSoon { count, secs } => write!(
                f,
                "re-authentication past {count} in {secs} s on this queue (AUTH_Send \
                 answered Command Interrupted; the queue stays authenticated)"
            ),
            R::TlsIdentityMismatch { identity } => write!(
                f,
                "the connection's TLS PSK ({identity:?}) is not for this host and subsystem"
            ),
            R::RegistrantsFull { nsid, max } => write!(
                f,
                "Reservation Register: namespace {nsid} has {max} registrants already, the \
                 most it keeps"
            ),
            R::RegistrantsQuota {
                nsid,
                max,
                by_address,
            } => write!(
                f,
                "Reservation Register: {max} Host IDs registered on namespace {nsid} {} \
                 already, the most one {} may add (a host registers one)",
                if *by_address {
                    "from this address"
                } else {
                    "by this host NQN"
                },
                if *by_address { "address" } else { "host NQN" }
            ),
        }
    }
}

/// One refusal, with what is known of who was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: RefusalReason,
    /// The transport queue it happened on (for keep-alive expiry: the admin queue).
    pub key: QueueKey,
    pub hostnqn: Option<String>,
    pub subnqn: Option<String>,
    pub cntlid: Option<u16>,
    pub qid: Option<u16>,
    /// The status the host got; `None` when no command was answered (keep-alive expiry,
    /// CSTS.CFS which the host reads with Property Get).
    pub status: Option<Status>,
}

/// Something the daemon should tell the operator about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    Refused(Refusal),
    /// The first Connect with an empty Host NQN to this subsystem was accepted (it allows
    /// any host, as SPDK's target does). Reported once per subsystem for the target's
    /// lifetime.
    EmptyHostNqnAccepted {
        subnqn: String,
        key: QueueKey,
    },
    /// A queue completed DH-HMAC-CHAP authentication.
    Authenticated(super::Authenticated),
    /// Secure channel concatenation made a TLS PSK the transport must now accept.
    GeneratedPsk(super::GeneratedPsk),
    /// The host reset a controller (CC.EN 1 -> 0): its I/O queues were disconnected.
    ControllerReset(ControllerReset),
}

/// What [`Notice::ControllerReset`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerReset {
    pub key: QueueKey,
    pub hostnqn: String,
    pub subnqn: String,
    pub cntlid: u16,
    /// I/O queues it had, now disconnected.
    pub io_queues: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_listed_snake_case_and_unique() {
        let samples = [
            RefusalReason::NotConnected,
            RefusalReason::AlreadyConnected,
            RefusalReason::IncompatibleFormat { recfmt: 1 },
            RefusalReason::ShortConnectData { len: 5 },
            RefusalReason::InvalidSubsystemNqn,
            RefusalReason::InvalidHostNqn,
            RefusalReason::UnknownSubsystem,
            RefusalReason::SubsystemNotOnListener,
            RefusalReason::HostNotAllowed,
            RefusalReason::EmptyHostNqnNotAllowed,
            RefusalReason::StaticControllerId { cntlid: 1 },
            RefusalReason::AdminQueueSize {
                sqsize: 0,
                max: 4095,
            },
            RefusalReason::IoQueueSize {
                sqsize: 0,
                max: 127,
            },
            RefusalReason::ControllerIdsExhausted,
            RefusalReason::UnknownController { cntlid: 9 },
            RefusalReason::IoQueueOnDiscovery,
            RefusalReason::ControllerNotEnabled,
            RefusalReason::QueueIdOutOfRange { qid: 9, max: 4 },
            RefusalReason::QueueIdInUse { qid: 1 },
            RefusalReason::InvalidControllerConfiguration {
                field: "CC.MPS",
                value: 1,
            },
            RefusalReason::KeepAliveExpired { kato_ms: 5000 },
            RefusalReason::NoCredentials,
            RefusalReason::AuthenticationFailed {
                reason: crate::auth::FailureReason::Failed,
                by_host: false,
            },
            RefusalReason::AuthenticationTimeout { secs: 30 },
            RefusalReason::AuthenticationAbandoned,
            RefusalReason::AuthenticationRequired { opcode: 6 },
            RefusalReason::AuthenticationThrottled {
                strikes: 16,
                under_way: 0,
                secs: 60,
            },
            RefusalReason::ReauthenticationTooSoon { count: 4, secs: 60 },
            RefusalReason::TlsIdentityMismatch {
                identity: "NVMe0R01 a b".into(),
            },
            RefusalReason::RegistrantsFull { nsid: 1, max: 1024 },
            RefusalReason::RegistrantsQuota {
                nsid: 1,
                max: 64,
                by_address: true,
            },
        ];
        assert_eq!(samples.len(), RefusalReason::LABELS.len());
        let mut seen = std::collections::BTreeSet::new();
        for r in &samples {
            let l = r.label();
            assert!(RefusalReason::LABELS.contains(&l), "{l} not in LABELS");
            assert!(
                l.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{l}"
            );
            assert!(seen.insert(l), "{l} twice");
            assert!(!r.to_string().is_empty());
        }
    }
}
