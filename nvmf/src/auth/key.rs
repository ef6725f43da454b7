//! DH-HMAC-CHAP secrets in the representation `nvme gen-dhchap-key` prints and the Linux
//! host and nvmet take: `DHHC-1:hh:<base64 of key || CRC-32(key) little endian>:`.
//!
//! `hh` names the key transformation: `00` none (the secret is used as it is), `01`,
//! `02`, `03` transform it with HMAC-SHA-256/384/512 keyed by the secret over the NQN of
//! its owner and `"NVMe-over-Fabrics"` (NVMe Base 2.0 section 8.13.5.7). The key is 32,
//! 48 or 64 bytes; the CRC is the IEEE 802.3 CRC-32 (the one zlib computes).

use super::HashId;
use zeroize::Zeroizing;

/// Why a `DHHC-1:` string was not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("not a DH-HMAC-CHAP secret: it must start with \"DHHC-1:\"")]
    Prefix,
    #[error("the key transformation field must be 00, 01, 02 or 03, found {0:?}")]
    Transform(String),
    #[error("the key is not valid base64")]
    Base64,
    #[error("the key is {0} bytes; it must be 32, 48 or 64 (plus a 4-byte CRC)")]
    Length(usize),
    #[error("the key's CRC-32 does not match (mistyped or truncated secret)")]
    Crc,
    #[error("the secret must end with ':'")]
    Suffix,
}

/// A parsed DH-HMAC-CHAP secret. Its bytes are zeroed when dropped and never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct DhchapKey {
    transform: Option<HashId>,
    key: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for DhchapKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DhchapKey")
            .field("transform", &self.transform)
            .field("len", &self.key.len())
            .finish_non_exhaustive()
    }
}

impl DhchapKey {
    /// Parses `DHHC-1:hh:base64:`. Surrounding whitespace (a file's trailing newline) is
    /// ignored. The trailing ':' is required, as nvme-cli always writes it; nvmet and
    /// the Linux host also accept it missing, and so do we, since files edited by hand
    /// lose it.
    pub fn parse(s: &str) -> Result<DhchapKey, KeyError> {
        let s = s.trim();
        let rest = s.strip_prefix("DHHC-1:").ok_or(KeyError::Prefix)?;
        let (hh, rest) = rest.split_once(':').ok_or(KeyError::Prefix)?;
        let transform = match hh {
            "00" => None,
            "01" | "02" | "03" => HashId::from_id(hh.as_bytes()[1] - b'0'),
            _ => return Err(KeyError::Transform(hh.chars().take(8).collect())),
        };
        let b64 = rest.strip_suffix(':').unwrap_or(rest);
        if b64.contains(':') {
            return Err(KeyError::Suffix);
        }
        use super::interchange::{decode, BodyError};
        let key = decode(b64, &[32, 48, 64]).map_err(|e| match e {
            BodyError::Base64 => KeyError::Base64,
            BodyError::Length(n) => KeyError::Length(n),
            BodyError::Crc => KeyError::Crc,
        })?;
        Ok(DhchapKey { transform, key })
    }

    /// A key from raw bytes (32, 48 or 64 of them).
    pub fn from_bytes(transform: Option<HashId>, key: &[u8]) -> Result<DhchapKey, KeyError> {
        if !matches!(key.len(), 32 | 48 | 64) {
            return Err(KeyError::Length(key.len()));
        }
        Ok(DhchapKey {
            transform,
            key: Zeroizing::new(key.to_vec()),
        })
    }

    /// The `DHHC-1:` text, as `nvme gen-dhchap-key` prints it.
    pub fn to_text(&self) -> Zeroizing<String> {
        super::interchange::encode("DHHC-1", self.transform.map_or(0, HashId::id), &self.key)
    }

    pub fn transform_hash(&self) -> Option<HashId> {
        self.transform
    }
    pub fn len(&self) -> usize {
        self.key.len()
    }
    pub fn is_empty(&self) -> bool {
        self.key.is_empty()
    }

    /// The key the responses are computed with: the secret itself when `hh` is 00,
    /// else HMAC-H(secret, NQN || "NVMe-over-Fabrics") with H the hash `hh` names and
    /// NQN the owner's (the host's NQN for a host secret, the subsystem's for a
    /// controller secret).
    pub fn transformed(&self, nqn: &str) -> Zeroizing<Vec<u8>> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => h.hmac(&self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Print and parse agree, and the CRC is zlib's CRC-32 stored little endian.
    #[test]
    fn parse_and_print_round_trip() {
        let key: Vec<u8> = (0u8..32).collect();
        let k = DhchapKey::from_bytes(None, &key).unwrap();
        let text = k.to_text();
        assert!(text.starts_with("DHHC-1:00:") && text.ends_with(':'));
        assert_eq!(DhchapKey::parse(&text).unwrap(), k);
    }

    /// Bytes 00..1f with hh 01: the text computed independently with Python's
    /// `base64.b64encode(k + struct.pack('<I', zlib.crc32(k)))` (CRC 0x91267E8A).
    #[test]
    fn parse_independent_vector() {
        let text = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
        let k = DhchapKey::parse(text).unwrap();
        assert_eq!(k.transform_hash(), Some(HashId::Sha256));
        assert_eq!(
            k,
            DhchapKey::from_bytes(Some(HashId::Sha256), &(0u8..32).collect::<Vec<_>>()).unwrap()
        );
        assert_eq!(*k.to_text(), text);
    }

    #[test]
    fn rejects() {
        let good = DhchapKey::from_bytes(Some(HashId::Sha512), &[7u8; 64])
            .unwrap()
            .to_text();
        assert!(DhchapKey::parse(&good).is_ok());
        // Missing trailing ':' is tolerated (nvmet and the Linux host accept it).
        assert!(DhchapKey::parse(&good[..good.len() - 1]).is_ok());
        assert_eq!(DhchapKey::parse("DHHC-2:00:abcd:"), Err(KeyError::Prefix));
        assert!(matches!(
            DhchapKey::parse(&good.replace("DHHC-1:03:", "DHHC-1:04:")),
            Err(KeyError::Transform(_))
        ));
        assert_eq!(DhchapKey::parse("DHHC-1:00:!!!!:"), Err(KeyError::Base64));
        // A flipped character changes the key or the CRC.
        let mut bad = good.to_string();
        let i = 12;
        let c = if &bad[i..i + 1] == "A" { "B" } else { "A" };
        bad.replace_range(i..i + 1, c);
        assert_eq!(DhchapKey::parse(&bad), Err(KeyError::Crc));
        // 16 bytes of key is too short.
        let short = format!(
            "DHHC-1:00:{}:",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [0u8; 20])
        );
        assert_eq!(DhchapKey::parse(&short), Err(KeyError::Length(16)));
        assert!(DhchapKey::from_bytes(None, &[0; 31]).is_err());
    }

    #[test]
    fn transformation() {
        let k = DhchapKey::from_bytes(None, &[1u8; 32]).unwrap();
        assert_eq!(*k.transformed("nqn.x"), vec![1u8; 32]);
        let k = DhchapKey::from_bytes(Some(HashId::Sha384), &[1u8; 32]).unwrap();
        let t = k.transformed("nqn.2014-08.org.nvmexpress:uuid:1");
        assert_eq!(t.len(), 48);
        assert_eq!(
            *t,
            *HashId::Sha384.hmac(
                &[1u8; 32],
                &[b"nqn.2014-08.org.nvmexpress:uuid:1NVMe-over-Fabrics"]
            )
        );
        assert_ne!(*t, *k.transformed("nqn.2014-08.org.nvmexpress:uuid:2"));
    }

    #[test]
    fn debug_hides_the_key() {
        let k = DhchapKey::from_bytes(None, &[0x5a; 32]).unwrap();
        let s = format!("{k:?}");
        assert!(!s.contains("90") && !s.contains("5a"), "{s}");
    }
}
