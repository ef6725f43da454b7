//! In-band authentication (NVMe Base 2.0 section 8.13, DH-HMAC-CHAP from TP 8006) and the
//! pure parts of TLS for NVMe/TCP (TP 8011, TP 8018): no I/O, no clock, no entropy source
//! of its own. Time comes in as `now`, random bytes through [`Entropy`].
//!
//! - [`key`]: the `DHHC-1:` secret representation (`nvme gen-dhchap-key`), its CRC, and
//!   the key transformation the hash field selects.
//! - [`dh`]: the RFC 7919 FFDHE groups 2048..8192 and a Diffie-Hellman exchange in them
//!   (constant-time modular exponentiation from `crypto-bigint`).
//! - [`msg`]: the Authentication Send/Receive payloads: AUTH_Negotiate,
//!   DH-HMAC-CHAP_Challenge/_Reply/_Success1/_Success2/_Failure1/_Failure2.
//! - [`ctrl`]: the controller side of one queue's transaction; [`host`]: the host side.
//! - [`tls`]: the `NVMeTLSkey-1:` PSK interchange format, retained-PSK and TLS-PSK
//!   derivation, the PSK identity strings tlshd and the Linux host use, and the PSK a
//!   DH-HMAC-CHAP transaction generates for secure channel concatenation (TP 8018).
//!
//! Crypto is RustCrypto's (`hmac`, `sha2`, `hkdf`) and `crypto-bigint`'s; nothing here
//! implements a primitive.
//!
//! Not implemented: authentication protocols other than DH-HMAC-CHAP (there are none
//! defined), the `NVMe0R0x` (pre-TP 8018) identity without a digest on the controller
//! side's lookup table (it is produced, see [`tls::identity_v0`]).

pub mod ctrl;
pub mod dh;
pub mod host;
pub mod key;
pub mod msg;
pub mod tls;

mod ffdhe_primes;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha384, Sha512};
use zeroize::Zeroizing;

/// Security protocol of Authentication Send/Receive for NVMe in-band authentication
/// (SECP E9h).
pub const SECP_NVME_AUTH: u8 = 0xe9;
/// SPSP0 and SPSP1 of Authentication Send/Receive for DH-HMAC-CHAP: both 01h.
pub const SPSP_DHCHAP: u8 = 0x01;

/// Connect response DW0 bit 17: Authentication Transaction Required (ATR).
pub const CONNECT_AUTHREQ_ATR: u32 = 1 << 17;
/// Connect response DW0 bit 18: Authentication and Secure Channel Required (ASCR).
pub const CONNECT_AUTHREQ_ASCR: u32 = 1 << 18;

/// A hash function of DH-HMAC-CHAP (HashID values of the protocol descriptor and the
/// `DHHC-1:hh:` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HashId {
    Sha256 = 1,
    Sha384 = 2,
    Sha512 = 3,
}

impl HashId {
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    pub fn from_id(id: u8) -> Option<HashId> {
        match id {
            1 => Some(HashId::Sha256),
            2 => Some(HashId::Sha384),
            3 => Some(HashId::Sha512),
            _ => None,
        }
    }
    pub fn id(self) -> u8 {
        self as u8
    }
    /// Output length in bytes (the HL field).
    pub fn output_len(self) -> usize {
        match self {
            HashId::Sha256 => 32,
            HashId::Sha384 => 48,
            HashId::Sha512 => 64,
        }
    }
    /// The name nvme-cli and nvmet use (`hmac(sha256)` without the `hmac()`).
    pub fn name(self) -> &'static str {
        match self {
            HashId::Sha256 => "sha256",
            HashId::Sha384 => "sha384",
            HashId::Sha512 => "sha512",
        }
    }
    pub fn from_name(s: &str) -> Option<HashId> {
        let s = s.trim_start_matches("hmac(").trim_end_matches(')');
        HashId::ALL.into_iter().find(|h| h.name() == s)
    }
    /// H(data).
    pub fn digest(self, parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        fn run<D: Digest>(parts: &[&[u8]]) -> Vec<u8> {
            let mut d = D::new();
            for p in parts {
                d.update(p);
            }
            d.finalize().to_vec()
        }
        Zeroizing::new(match self {
            HashId::Sha256 => run::<Sha256>(parts),
            HashId::Sha384 => run::<Sha384>(parts),
            HashId::Sha512 => run::<Sha512>(parts),
        })
    }
    /// HMAC(key, parts concatenated).
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            // HMAC takes keys of any length (RFC 2104): new_from_slice cannot fail.
            let mut m = <M as Mac>::new_from_slice(key).expect("HMAC accepts any key length");
            for p in parts {
                m.update(p);
            }
            m.finalize().into_bytes().to_vec()
        }
        Zeroizing::new(match self {
            HashId::Sha256 => run::<Hmac<Sha256>>(key, parts),
            HashId::Sha384 => run::<Hmac<Sha384>>(key, parts),
            HashId::Sha512 => run::<Hmac<Sha512>>(key, parts),
        })
    }
}

/// A Diffie-Hellman group of DH-HMAC-CHAP (DH group identifiers; 00h is the NULL group:
/// no exchange, the challenge is used as it is).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DhGroup {
    Null = 0,
    Ffdhe2048 = 1,
    Ffdhe3072 = 2,
    Ffdhe4096 = 3,
    Ffdhe6144 = 4,
    Ffdhe8192 = 5,
}

impl DhGroup {
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    pub fn from_id(id: u8) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| *g as u8 == id)
    }
    pub fn id(self) -> u8 {
        self as u8
    }
    /// Bytes of a public value or shared secret (the DHVLEN of this group), 0 for NULL.
    pub fn value_len(self) -> usize {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 256,
            DhGroup::Ffdhe3072 => 384,
            DhGroup::Ffdhe4096 => 512,
            DhGroup::Ffdhe6144 => 768,
            DhGroup::Ffdhe8192 => 1024,
        }
    }
    /// The name nvme-cli and nvmet use (`null`, `ffdhe2048`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }
    pub fn from_name(s: &str) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| g.name() == s)
    }
}

/// Where random bytes come from (challenges, sequence numbers, DH private keys): the
/// daemon's is the operating system's generator, tests use a seeded one.
pub trait Entropy {
    fn fill(&mut self, buf: &mut [u8]);
}

impl<F: FnMut(&mut [u8])> Entropy for F {
    fn fill(&mut self, buf: &mut [u8]) {
        self(buf)
    }
}

/// DH-HMAC-CHAP failure reason code explanations (REASON CODE 01h "authentication
/// failure"), as carried by Failure1/Failure2 (NVMe Base 2.0 Figure 465; the Linux
/// kernel's `NVME_AUTH_DHCHAP_FAILURE_*` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureReason {
    /// The response did not verify (wrong secret).
    Failed = 0x01,
    /// The authentication protocol is not usable.
    NotUsable = 0x02,
    /// Secure channel concatenation mismatch.
    ConcatMismatch = 0x03,
    /// No hash function in common.
    HashUnusable = 0x04,
    /// No DH group in common, or a DH value that is not usable.
    DhGroupUnusable = 0x05,
    /// A message with bad fields or lengths.
    IncorrectPayload = 0x06,
    /// A message that does not fit the protocol's state.
    IncorrectProtocolMessage = 0x07,
}

impl FailureReason {
    pub fn from_code(c: u8) -> Option<FailureReason> {
        use FailureReason::*;
        [
            Failed,
            NotUsable,
            ConcatMismatch,
            HashUnusable,
            DhGroupUnusable,
            IncorrectPayload,
            IncorrectProtocolMessage,
        ]
        .into_iter()
        .find(|r| *r as u8 == c)
    }
    pub fn code(self) -> u8 {
        self as u8
    }
    /// In words, for log lines.
    pub fn text(self) -> &'static str {
        match self {
            FailureReason::Failed => "the response did not verify (wrong secret)",
            FailureReason::NotUsable => "authentication protocol not usable",
            FailureReason::ConcatMismatch => "secure channel concatenation mismatch",
            FailureReason::HashUnusable => "no usable hash function in common",
            FailureReason::DhGroupUnusable => "no usable DH group in common, or a bad DH value",
            FailureReason::IncorrectPayload => "malformed authentication message",
            FailureReason::IncorrectProtocolMessage => {
                "authentication message out of sequence or for another transaction"
            }
        }
    }
}

/// SC_C, the secure channel concatenation field of AUTH_Negotiate (TP 8018).
/// The body both key texts share (`DHHC-1:hh:<body>:`, `NVMeTLSkey-1:hh:<body>:`):
/// base64 of the key followed by its IEEE CRC-32, little endian.
mod interchange {
    use base64::Engine;
    use zeroize::Zeroizing;

    /// Why a body was not accepted.
    pub(super) enum BodyError {
        Base64,
        /// The key length found (without the CRC).
        Length(usize),
        Crc,
    }

    /// The key in `b64`, which must be one of `key_lens` bytes long.
    pub(super) fn decode(b64: &str, key_lens: &[usize]) -> Result<Zeroizing<Vec<u8>>, BodyError> {
        let mut raw = Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| BodyError::Base64)?,
        );
        let key_len = raw.len().saturating_sub(4);
        if raw.len() < 4 || !key_lens.contains(&key_len) {
            return Err(BodyError::Length(key_len));
        }
        let (key, crc) = raw.split_at(key_len);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(BodyError::Crc);
        }
        raw.truncate(key_len);
        Ok(raw)
    }

    /// `<prefix>:<hh>:<body>:`, the way nvme-cli prints it.
    pub(super) fn encode(prefix: &str, hh: u8, key: &[u8]) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(key.to_vec());
        raw.extend_from_slice(&crc32fast::hash(key).to_le_bytes());
        Zeroizing::new(format!(
            "{prefix}:{hh:02}:{}:",
            base64::engine::general_purpose::STANDARD.encode(&raw)
        ))
    }
}

pub mod sc_c {
    /// No secure channel concatenation.
    pub const NOSC: u8 = 0;
    /// Concatenate, generating a new TLS PSK (the admin queue of a new association).
    pub const NEWTLSPSK: u8 = 1;
    /// Concatenate, replacing the TLS PSK in use (re-authentication over TLS).
    pub const REPLACETLSPSK: u8 = 2;
}

/// Constant-time equality of two byte strings (lengths are not secret).
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// RFC 4231 test case 2 ("Jefe") for the three hashes.
    #[test]
    fn hmac_rfc4231_case2() {
        let data = b"what do ya want for nothing?";
        assert_eq!(
            *HashId::Sha256.hmac(b"Jefe", &[&data[..10], &data[10..]]),
            hex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        );
        assert_eq!(
            *HashId::Sha384.hmac(b"Jefe", &[data]),
            hex("af45d2e376484031617f78d2b58a6b1b9c7ef464f5a01b47e42ec3736322445e8e2240ca5e69e2c78b3239ecfab21649")
        );
        assert_eq!(
            *HashId::Sha512.hmac(b"Jefe", &[data]),
            hex("164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737")
        );
    }

    /// RFC 4231 test case 6: a key longer than the block size is hashed first.
    #[test]
    fn hmac_rfc4231_case6_long_key() {
        let key = [0xaa; 131];
        let data = b"Test Using Larger Than Block-Size Key - Hash Key First";
        assert_eq!(
            *HashId::Sha256.hmac(&key, &[data]),
            hex("60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")
        );
    }

    #[test]
    fn ids_and_names() {
        for h in HashId::ALL {
            assert_eq!(HashId::from_id(h.id()), Some(h));
            assert_eq!(HashId::from_name(h.name()), Some(h));
            assert_eq!(h.digest(&[b""]).len(), h.output_len());
        }
        assert_eq!(HashId::from_name("hmac(sha384)"), Some(HashId::Sha384));
        assert_eq!(HashId::from_id(0), None);
        assert_eq!(HashId::from_id(4), None);
        for g in DhGroup::ALL {
            assert_eq!(DhGroup::from_id(g.id()), Some(g));
            assert_eq!(DhGroup::from_name(g.name()), Some(g));
        }
        assert_eq!(DhGroup::from_id(6), None);
        for c in 1..=7 {
            assert_eq!(FailureReason::from_code(c).unwrap().code(), c);
        }
        assert_eq!(FailureReason::from_code(0), None);
    }

    #[test]
    fn constant_time_eq() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }
}
