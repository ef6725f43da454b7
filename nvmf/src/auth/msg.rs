//! Authentication Send/Receive payloads for DH-HMAC-CHAP (NVMe Base 2.0 section 8.13.5,
//! Figures 459-466) and the two commands' fields.
//!
//! All multi-byte fields are little endian. Every message starts with AUTH_TYPE (00h
//! common messages: Negotiate and the Failures; 01h DH-HMAC-CHAP messages), AUTH_ID and
//! two reserved bytes, then the transaction identifier T_ID.

use crate::spec::{opcodes, Sqe};

/// AUTH_TYPE values.
pub mod auth_type {
    pub const COMMON: u8 = 0x00;
    pub const DHCHAP: u8 = 0x01;
}

/// AUTH_ID values.
pub mod auth_id {
    pub const NEGOTIATE: u8 = 0x00;
    pub const CHALLENGE: u8 = 0x01;
    pub const REPLY: u8 = 0x02;
    pub const SUCCESS1: u8 = 0x03;
    pub const SUCCESS2: u8 = 0x04;
    pub const FAILURE2: u8 = 0xf0;
    pub const FAILURE1: u8 = 0xf1;
}

/// AUTHID of the DH-HMAC-CHAP protocol descriptor.
pub const DHCHAP_AUTHID: u8 = 0x01;
/// REASON CODE of Failure1/Failure2: authentication failure.
pub const REASON_FAILED: u8 = 0x01;
/// Hash and DH group identifiers one descriptor can list (IDLIST is 60 bytes: hash IDs
/// at 0..30, DH group IDs at 30..60).
pub const MAX_IDS: usize = 30;
/// Size of one protocol descriptor.
pub const DESCRIPTOR_SIZE: usize = 64;
/// Fixed part of Challenge, Reply, Success1 and Success2.
pub const HEADER_16: usize = 16;
/// Size of Failure1/Failure2.
pub const FAILURE_SIZE: usize = 8;
/// Fixed part of AUTH_Negotiate (before the descriptors).
pub const NEGOTIATE_HEADER: usize = 8;

/// An Authentication Send or Receive command's own fields (CDW10-11): SECP, SPSP0,
/// SPSP1 in CDW10 bits 31:24, 15:8, 23:16; TL (Send) or AL (Receive) in CDW11.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuthCommand {
    pub secp: u8,
    pub spsp0: u8,
    pub spsp1: u8,
    /// Transfer length (Send) or allocation length (Receive).
    pub len: u32,
}

impl AuthCommand {
    pub fn dhchap(len: u32) -> AuthCommand {
        AuthCommand {
            secp: super::SECP_NVME_AUTH,
            spsp0: super::SPSP_DHCHAP,
            spsp1: super::SPSP_DHCHAP,
            len,
        }
    }
    pub fn from_sqe(sqe: &Sqe) -> AuthCommand {
        AuthCommand {
            spsp0: (sqe.cdw10 >> 8) as u8,
            spsp1: (sqe.cdw10 >> 16) as u8,
            secp: (sqe.cdw10 >> 24) as u8,
            len: sqe.cdw11,
        }
    }
    /// An Authentication Send (`send`) or Receive SQE with this CID.
    pub fn to_sqe(&self, cid: u16, send: bool) -> Sqe {
        let mut sqe = Sqe::default();
        sqe.set_opcode_cid(opcodes::FABRICS, cid);
        sqe.nsid = if send {
            opcodes::fabrics::AUTHENTICATION_SEND
        } else {
            opcodes::fabrics::AUTHENTICATION_RECEIVE
        } as u32;
        sqe.cdw10 = (self.spsp0 as u32) << 8 | (self.spsp1 as u32) << 16 | (self.secp as u32) << 24;
        sqe.cdw11 = self.len;
        sqe
    }
    /// Byte offsets in the SQE, for error locations.
    pub const SPSP0_OFFSET: u16 = 41;
    pub const SPSP1_OFFSET: u16 = 42;
    pub const SECP_OFFSET: u16 = 43;
    pub const LEN_OFFSET: u16 = 44;
}

/// A DH-HMAC-CHAP message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// AUTH_Negotiate (host to controller): the DH-HMAC-CHAP descriptor's hash and DH group
    /// identifiers as listed (unknown ones kept, so the controller can skip them).
    Negotiate {
        t_id: u16,
        sc_c: u8,
        hashes: Vec<u8>,
        dhgroups: Vec<u8>,
    },
    /// DH-HMAC-CHAP_Challenge (controller to host): C1 (HL bytes) and the controller's
    /// DH public value (empty for the NULL group).
    Challenge {
        t_id: u16,
        hash: u8,
        dhgroup: u8,
        seqnum: u32,
        challenge: Vec<u8>,
        dh_value: Vec<u8>,
    },
    /// DH-HMAC-CHAP_Reply (host to controller): response R1, challenge C2 (meaningful
    /// when `cvalid`), the host's DH public value.
    Reply {
        t_id: u16,
        cvalid: bool,
        seqnum: u32,
        response: Vec<u8>,
        challenge: Vec<u8>,
        dh_value: Vec<u8>,
    },
    /// DH-HMAC-CHAP_Success1 (controller to host): HL and, for bidirectional
    /// authentication, the controller's response R2.
    Success1 {
        t_id: u16,
        hl: u8,
        response: Option<Vec<u8>>,
    },
    /// DH-HMAC-CHAP_Success2 (host to controller): the host verified R2.
    Success2 { t_id: u16 },
    /// AUTH_Failure1 (controller to host) or AUTH_Failure2 (host to controller).
    Failure {
        failure1: bool,
        t_id: u16,
        reason: u8,
        explanation: u8,
    },
}

/// Why a payload could not be decoded; the answer is a Failure with reason
/// "incorrect payload" or "incorrect protocol message".
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("message too short ({0} bytes)")]
    Short(usize),
    #[error("unknown AUTH_TYPE {0:#x} / AUTH_ID {1:#x}")]
    Unknown(u8, u8),
    #[error("field {0} is inconsistent with the message length")]
    Field(&'static str),
}

fn u16le(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32le(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Message {
    pub fn t_id(&self) -> u16 {
        match self {
            Message::Negotiate { t_id, .. }
            | Message::Challenge { t_id, .. }
            | Message::Reply { t_id, .. }
            | Message::Success1 { t_id, .. }
            | Message::Success2 { t_id }
            | Message::Failure { t_id, .. } => *t_id,
        }
    }

    /// Decodes one message. Bytes after the message's own length (a host may send a
    /// longer TL than it filled) are ignored, as nvmet ignores them.
    pub fn decode(b: &[u8]) -> Result<Message, DecodeError> {
        if b.len() < FAILURE_SIZE {
            return Err(DecodeError::Short(b.len()));
        }
        let t_id = u16le(b, 4);
        match (b[0], b[1]) {
            (auth_type::COMMON, auth_id::NEGOTIATE) => {
                let sc_c = b[6];
                let napd = b[7] as usize;
                if napd == 0 {
                    return Err(DecodeError::Field("NAPD"));
                }
                let mut found = None;
                for i in 0..napd {
                    let at = NEGOTIATE_HEADER + i * DESCRIPTOR_SIZE;
                    let d = b
                        .get(at..at + DESCRIPTOR_SIZE)
                        .ok_or(DecodeError::Short(b.len()))?;
                    if d[0] == DHCHAP_AUTHID && found.is_none() {
                        found = Some(d);
                    }
                }
                let d = found.ok_or(DecodeError::Field("AUTHID"))?;
                let (halen, dhlen) = (d[2] as usize, d[3] as usize);
                if halen > MAX_IDS || dhlen > MAX_IDS {
                    return Err(DecodeError::Field("HALEN/DHLEN"));
                }
                Ok(Message::Negotiate {
                    t_id,
                    sc_c,
                    hashes: d[4..4 + halen].to_vec(),
                    dhgroups: d[4 + MAX_IDS..4 + MAX_IDS + dhlen].to_vec(),
                })
            }
            (auth_type::COMMON, id @ (auth_id::FAILURE1 | auth_id::FAILURE2)) => {
                Ok(Message::Failure {
                    failure1: id == auth_id::FAILURE1,
                    t_id,
                    reason: b[6],
                    explanation: b[7],
                })
            }
            (auth_type::DHCHAP, id) => {
                if b.len() < HEADER_16 {
                    return Err(DecodeError::Short(b.len()));
                }
                let hl = b[6] as usize;
                let dhvlen = u16le(b, 10) as usize;
                let seqnum = u32le(b, 12);
                let take = |at: usize, n: usize, what| {
                    b.get(at..at + n)
                        .map(<[u8]>::to_vec)
                        .ok_or(DecodeError::Field(what))
                };
                match id {
                    auth_id::CHALLENGE => Ok(Message::Challenge {
                        t_id,
                        hash: b[8],
                        dhgroup: b[9],
                        seqnum,
                        challenge: take(16, hl, "HL")?,
                        dh_value: take(16 + hl, dhvlen, "DHVLEN")?,
                    }),
                    auth_id::REPLY => Ok(Message::Reply {
                        t_id,
                        cvalid: b[8] & 1 != 0,
                        seqnum,
                        response: take(16, hl, "HL")?,
                        challenge: take(16 + hl, hl, "HL")?,
                        dh_value: take(16 + 2 * hl, dhvlen, "DHVLEN")?,
                    }),
                    auth_id::SUCCESS1 => {
                        let rvalid = b[8] & 1 != 0;
                        Ok(Message::Success1 {
                            t_id,
                            hl: hl as u8,
                            response: if rvalid {
                                Some(take(16, hl, "HL")?)
                            } else {
                                None
                            },
                        })
                    }
                    auth_id::SUCCESS2 => Ok(Message::Success2 { t_id }),
                    _ => Err(DecodeError::Unknown(b[0], b[1])),
                }
            }
            (t, id) => Err(DecodeError::Unknown(t, id)),
        }
    }

    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let head = |ty: u8, id: u8, t_id: u16, len: usize| {
            let mut v = vec![0u8; len];
            v[0] = ty;
            v[1] = id;
            v[4..6].copy_from_slice(&t_id.to_le_bytes());
            v
        };
        match self {
            Message::Negotiate {
                t_id,
                sc_c,
                hashes,
                dhgroups,
            } => {
                let mut v = head(
                    auth_type::COMMON,
                    auth_id::NEGOTIATE,
                    *t_id,
                    NEGOTIATE_HEADER + DESCRIPTOR_SIZE,
                );
                v[6] = *sc_c;
                v[7] = 1;
                let d = &mut v[NEGOTIATE_HEADER..];
                d[0] = DHCHAP_AUTHID;
                let h = &hashes[..hashes.len().min(MAX_IDS)];
                let g = &dhgroups[..dhgroups.len().min(MAX_IDS)];
                d[2] = h.len() as u8;
                d[3] = g.len() as u8;
                d[4..4 + h.len()].copy_from_slice(h);
                d[4 + MAX_IDS..4 + MAX_IDS + g.len()].copy_from_slice(g);
                v
            }
            Message::Challenge {
                t_id,
                hash,
                dhgroup,
                seqnum,
                challenge,
                dh_value,
            } => {
                let mut v = head(auth_type::DHCHAP, auth_id::CHALLENGE, *t_id, HEADER_16);
                v[6] = challenge.len() as u8;
                v[8] = *hash;
                v[9] = *dhgroup;
                v[10..12].copy_from_slice(&(dh_value.len() as u16).to_le_bytes());
                v[12..16].copy_from_slice(&seqnum.to_le_bytes());
                v.extend_from_slice(challenge);
                v.extend_from_slice(dh_value);
                v
            }
            Message::Reply {
                t_id,
                cvalid,
                seqnum,
                response,
                challenge,
                dh_value,
            } => {
                let mut v = head(auth_type::DHCHAP, auth_id::REPLY, *t_id, HEADER_16);
                v[6] = response.len() as u8;
                v[8] = *cvalid as u8;
                v[10..12].copy_from_slice(&(dh_value.len() as u16).to_le_bytes());
                v[12..16].copy_from_slice(&seqnum.to_le_bytes());
                v.extend_from_slice(response);
                // C2 is always HL bytes, zero when not valid (the Linux host sends it so).
                let mut c = challenge.clone();
                c.resize(response.len(), 0);
                v.extend_from_slice(&c);
                v.extend_from_slice(dh_value);
                v
            }
            Message::Success1 { t_id, hl, response } => {
                let mut v = head(auth_type::DHCHAP, auth_id::SUCCESS1, *t_id, HEADER_16);
                v[6] = *hl;
                if let Some(r) = response {
                    v[8] = 1;
                    v.extend_from_slice(r);
                }
                v
            }
            Message::Success2 { t_id } => {
                head(auth_type::DHCHAP, auth_id::SUCCESS2, *t_id, HEADER_16)
            }
            Message::Failure {
                failure1,
                t_id,
                reason,
                explanation,
            } => {
                let id = if *failure1 {
                    auth_id::FAILURE1
                } else {
                    auth_id::FAILURE2
                };
                let mut v = head(auth_type::COMMON, id, *t_id, FAILURE_SIZE);
                v[6] = *reason;
                v[7] = *explanation;
                v
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The Negotiate the Linux host sends (drivers/nvme/host/auth.c: one DH-HMAC-CHAP
    /// descriptor listing SHA-256/384/512 and the NULL group plus FFDHE 2048..8192),
    /// byte for byte.
    #[test]
    fn negotiate_fixed_bytes() {
        let m = Message::Negotiate {
            t_id: 0x0102,
            sc_c: 0,
            hashes: vec![1, 2, 3],
            dhgroups: vec![0, 1, 2, 3, 4, 5],
        };
        let b = m.encode();
        assert_eq!(b.len(), 72);
        assert_eq!(&b[..12], &[0, 0, 0, 0, 0x02, 0x01, 0, 1, 1, 0, 3, 6]);
        assert_eq!(&b[12..15], &[1, 2, 3]);
        assert!(b[15..42].iter().all(|&x| x == 0));
        assert_eq!(&b[42..48], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(Message::decode(&b).unwrap(), m);
    }

    #[test]
    fn challenge_fixed_bytes() {
        let m = Message::Challenge {
            t_id: 7,
            hash: 1,
            dhgroup: 0,
            seqnum: 0x11223344,
            challenge: vec![0xcc; 32],
            dh_value: vec![],
        };
        let b = m.encode();
        assert_eq!(
            &b[..16],
            &[1, 1, 0, 0, 7, 0, 32, 0, 1, 0, 0, 0, 0x44, 0x33, 0x22, 0x11]
        );
        assert_eq!(b.len(), 48);
        assert_eq!(Message::decode(&b).unwrap(), m);
    }

    #[test]
    fn reply_success_failure_fixed_bytes() {
        let r = Message::Reply {
            t_id: 9,
            cvalid: true,
            seqnum: 5,
            response: vec![0xaa; 48],
            challenge: vec![0xbb; 48],
            dh_value: vec![0xdd; 256],
        };
        let b = r.encode();
        assert_eq!(&b[..16], &[1, 2, 0, 0, 9, 0, 48, 0, 1, 0, 0, 1, 5, 0, 0, 0]);
        assert_eq!(b.len(), 16 + 96 + 256);
        assert_eq!(Message::decode(&b).unwrap(), r);

        let s1 = Message::Success1 {
            t_id: 9,
            hl: 32,
            response: Some(vec![0xee; 32]),
        };
        let b = s1.encode();
        assert_eq!(&b[..16], &[1, 3, 0, 0, 9, 0, 32, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Message::decode(&b).unwrap(), s1);
        let s1 = Message::Success1 {
            t_id: 9,
            hl: 32,
            response: None,
        };
        assert_eq!(s1.encode().len(), 16);

        let s2 = Message::Success2 { t_id: 0xabcd };
        assert_eq!(
            s2.encode(),
            vec![1, 4, 0, 0, 0xcd, 0xab, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        let f1 = Message::Failure {
            failure1: true,
            t_id: 3,
            reason: REASON_FAILED,
            explanation: 0x01,
        };
        assert_eq!(f1.encode(), vec![0, 0xf1, 0, 0, 3, 0, 1, 1]);
        let f2 = Message::Failure {
            failure1: false,
            t_id: 3,
            reason: REASON_FAILED,
            explanation: 0x07,
        };
        assert_eq!(f2.encode(), vec![0, 0xf0, 0, 0, 3, 0, 1, 7]);
        assert_eq!(Message::decode(&f2.encode()).unwrap(), f2);
    }

    #[test]
    fn malformed() {
        assert_eq!(Message::decode(&[0; 4]), Err(DecodeError::Short(4)));
        // Negotiate with NAPD 0, or a descriptor that does not fit.
        let mut n = Message::Negotiate {
            t_id: 1,
            sc_c: 0,
            hashes: vec![1],
            dhgroups: vec![0],
        }
        .encode();
        n[7] = 0;
        assert_eq!(Message::decode(&n), Err(DecodeError::Field("NAPD")));
        n[7] = 2;
        assert!(matches!(Message::decode(&n), Err(DecodeError::Short(_))));
        n[7] = 1;
        n[8 + 2] = 31;
        assert!(Message::decode(&n).is_err());
        // A Reply whose HL runs past the end.
        let mut r = Message::Reply {
            t_id: 1,
            cvalid: false,
            seqnum: 0,
            response: vec![0; 32],
            challenge: vec![],
            dh_value: vec![],
        }
        .encode();
        r[6] = 64;
        assert_eq!(Message::decode(&r), Err(DecodeError::Field("HL")));
        assert!(matches!(
            Message::decode(&[2, 0, 0, 0, 0, 0, 0, 0]),
            Err(DecodeError::Unknown(2, 0))
        ));
    }

    #[test]
    fn auth_command_fields() {
        let c = AuthCommand::dhchap(4096);
        let sqe = c.to_sqe(5, false);
        assert_eq!(sqe.fctype(), opcodes::fabrics::AUTHENTICATION_RECEIVE);
        use zerocopy::IntoBytes;
        let b = sqe.as_bytes();
        assert_eq!(b[AuthCommand::SECP_OFFSET as usize], 0xe9);
        assert_eq!(b[AuthCommand::SPSP0_OFFSET as usize], 1);
        assert_eq!(b[AuthCommand::SPSP1_OFFSET as usize], 1);
        assert_eq!(&b[44..48], &4096u32.to_le_bytes());
        assert_eq!(AuthCommand::from_sqe(&sqe), c);
    }

    proptest! {
        /// Bytes from the wire: decoding never panics, and what decodes re-encodes to a
        /// message that decodes the same.
        #[test]
        fn decode_any(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Ok(m) = Message::decode(&bytes) {
                prop_assert_eq!(Message::decode(&m.encode()).unwrap(), m);
            }
        }
    }
}
