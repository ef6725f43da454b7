//! The config file as written: serde types that keep each value's source location.
//!
//! Everything is checked later (`validate`), so the types here accept more than is valid
//! (`u64` ports, strings for addresses) and the checks can report all problems at once,
//! with a location. Backends are one flat struct rather than a `type`-tagged enum because
//! `Spanned` loses its location inside internally tagged enums.

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use serde_saphyr::Spanned;

use super::{AnaStateName, EngineKind, StartPolicy, TransportKind};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub io_threads: Option<Spanned<u64>>,
    pub cpus: Option<Spanned<Vec<Spanned<u64>>>>,
    #[serde(default)]
    pub listeners: Vec<Spanned<RawListener>>,
    #[serde(default)]
    pub backends: Vec<Spanned<RawBackend>>,
    #[serde(default)]
    pub subsystems: Vec<Spanned<RawSubsystem>>,
    pub metrics: Option<Spanned<RawMetrics>>,
    pub max_io_size: Option<Spanned<RawSize>>,
    pub engine: Option<Spanned<EngineKind>>,
    pub control: Option<Spanned<super::control::RawControl>>,
    /// Settings of `engine: doca`.
    pub doca: Option<Spanned<RawDoca>>,
    /// Per-host credentials (DH-HMAC-CHAP secrets, TLS PSK).
    #[serde(default)]
    pub hosts: Vec<Spanned<RawHost>>,
    pub reservations: Option<Spanned<RawReservations>>,
    #[serde(default)]
    pub referrals: Vec<Spanned<RawReferral>>,
    pub limits: Option<Spanned<RawLimits>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDoca {
    /// ibdev name of the STA device (the BlueField function with the DPA).
    pub sta_device: Spanned<String>,
    /// ibdev names of the RDMA devices that carry NVMe-oF.
    pub net_devices: Spanned<Vec<Spanned<String>>>,
    /// Entries of each backend queue handed to DOCA (power of two).
    pub be_queue_entries: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHost {
    pub nqn: Spanned<String>,
    pub dhchap_secret: Option<Spanned<String>>,
    pub dhchap_secret_file: Option<Spanned<String>>,
    pub dhchap_ctrl_secret: Option<Spanned<String>>,
    pub dhchap_ctrl_secret_file: Option<Spanned<String>>,
    pub dhchap_hashes: Option<Spanned<Vec<Spanned<String>>>>,
    pub dhchap_dhgroups: Option<Spanned<Vec<Spanned<String>>>>,
    pub tls_psk: Option<Spanned<String>>,
    pub tls_psk_file: Option<Spanned<String>>,
    pub tls_psk_derivation: Option<Spanned<String>>,
}

/// Where reservations that persist through power loss are kept, and what to do when
/// that file is missing or unreadable at start-up.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReservations {
    pub state_file: Option<Spanned<String>>,
    pub if_missing: Option<Spanned<StartPolicy>>,
    pub if_corrupt: Option<Spanned<StartPolicy>>,
}

/// A discovery referral (a SUBTYPE 1 entry).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReferral {
    pub transport: Spanned<TransportKind>,
    pub address: Spanned<String>,
    pub port: Spanned<u64>,
}

/// One ANA group of a subsystem: its state per listener name.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAnaGroup {
    pub id: Spanned<u64>,
    #[serde(default)]
    pub states: std::collections::BTreeMap<String, Spanned<AnaStateName>>,
}

/// `limits:` (every field optional; timeouts in milliseconds).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    pub max_connections: Option<Spanned<u64>>,
    pub max_connections_per_peer: Option<Spanned<u64>>,
    pub max_unconnected: Option<Spanned<u64>>,
    pub max_unconnected_per_peer: Option<Spanned<u64>>,
    pub icreq_timeout_ms: Option<Spanned<u64>>,
    pub connect_timeout_ms: Option<Spanned<u64>>,
    pub host_data_timeout_ms: Option<Spanned<u64>>,
    pub drain_timeout_ms: Option<Spanned<u64>>,
    pub connection_buffer: Option<Spanned<RawSize>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListener {
    pub name: Spanned<String>,
    pub transport: Spanned<TransportKind>,
    pub address: Spanned<String>,
    pub port: Spanned<u64>,
    pub tls: Option<Spanned<super::TlsMode>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawBackendType {
    Ram,
    File,
    Nvme,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackend {
    pub name: Spanned<String>,
    #[serde(rename = "type")]
    pub kind: Spanned<RawBackendType>,
    pub size: Option<Spanned<RawSize>>,
    pub block_size: Option<Spanned<u64>>,
    pub path: Option<Spanned<String>>,
    pub direct: Option<Spanned<bool>>,
    /// nvme: PCI address of the drive (bound to vfio-pci).
    pub pci: Option<Spanned<String>>,
    /// nvme: namespace ID on the drive.
    pub nsid: Option<Spanned<u64>>,
    /// nvme: command timeout before Abort (milliseconds).
    pub io_timeout_ms: Option<Spanned<u64>>,
    /// nvme: false = PRPs even when the drive supports SGLs.
    pub sgl: Option<Spanned<bool>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSubsystem {
    pub nqn: Spanned<String>,
    pub serial: Option<Spanned<String>>,
    pub model: Option<Spanned<String>>,
    #[serde(default)]
    pub allow_any_host: bool,
    #[serde(default)]
    pub hosts: Vec<Spanned<String>>,
    /// Refuse hosts that have no DH-HMAC-CHAP secret (`hosts:` at the top level).
    #[serde(default)]
    pub require_auth: bool,
    pub listeners: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub ana_groups: Vec<Spanned<RawAnaGroup>>,
    #[serde(default)]
    pub namespaces: Vec<Spanned<RawNamespace>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNamespace {
    pub nsid: Spanned<u64>,
    pub backend: Spanned<String>,
    pub uuid: Option<Spanned<String>>,
    pub nguid: Option<Spanned<String>>,
    pub eui64: Option<Spanned<String>>,
    pub ana_group: Option<Spanned<u64>>,
    pub hosts: Option<Spanned<Vec<Spanned<String>>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    pub address: Spanned<String>,
    /// The address may be reachable from other hosts (no warning at start-up).
    #[serde(default)]
    pub allow_remote: bool,
}

/// A size as written: a plain integer (bytes) or text with a unit (`1GiB`), parsed by
/// `size::parse_size` during validation so that a bad unit is one error among others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RawSize {
    Bytes(u64),
    Text(String),
}

impl<'de> Deserialize<'de> for RawSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;

        impl Visitor<'_> for SizeVisitor {
            type Value = RawSize;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a size in bytes, e.g. 1073741824 or 1GiB")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawSize, E> {
                Ok(RawSize::Bytes(v))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawSize, E> {
                u64::try_from(v)
                    .map(RawSize::Bytes)
                    .map_err(|_| E::custom(format!("size must not be negative, got {v}")))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawSize, E> {
                Ok(RawSize::Text(v.to_owned()))
            }
        }

        deserializer.deserialize_any(SizeVisitor)
    }
}
