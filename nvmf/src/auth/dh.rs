//! Finite-field Diffie-Hellman in the RFC 7919 groups (generator 2), for the augmented
//! challenge of DH-HMAC-CHAP.
//!
//! Arithmetic is `crypto-bigint`'s `BoxedMontyForm`: Montgomery multiplication with a
//! constant-time exponentiation, so the private exponent does not leak through timing.
//! (`num-bigint-dig` was the other candidate; its `modpow` is not constant time.) The
//! private exponent is 512 random bits: more than twice the strength of the largest group
//! (RFC 7919 section 5.2 asks for at least twice the security strength), and it keeps an
//! 8192-bit exponentiation fast. Public values and shared secrets travel as big-endian
//! numbers left-padded to the group's size, as the Linux kernel's `ffdhe*(dh)` produces
//! and expects.

use super::ffdhe_primes::*;
use super::{DhGroup, Entropy};
use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use std::sync::OnceLock;
use zeroize::Zeroizing;

/// Bits of the private exponent.
const PRIVATE_BITS: u32 = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DhError {
    #[error("the NULL group has no Diffie-Hellman exchange")]
    NullGroup,
    #[error("DH value of {got} bytes, the group needs {want}")]
    Length { got: usize, want: usize },
    #[error("DH public value out of range (must be 1 < y < p - 1)")]
    Range,
}

struct Group {
    params: BoxedMontyParams,
    p_minus_1: BoxedUint,
    bits: u32,
}

fn prime_hex(g: DhGroup) -> &'static str {
    match g {
        DhGroup::Null => "",
        DhGroup::Ffdhe2048 => FFDHE2048,
        DhGroup::Ffdhe3072 => FFDHE3072,
        DhGroup::Ffdhe4096 => FFDHE4096,
        DhGroup::Ffdhe6144 => FFDHE6144,
        DhGroup::Ffdhe8192 => FFDHE8192,
    }
}

fn group(g: DhGroup) -> Result<&'static Group, DhError> {
    static GROUPS: [OnceLock<Group>; 5] = [const { OnceLock::new() }; 5];
    let i = (g.id() as usize).checked_sub(1).ok_or(DhError::NullGroup)?;
    Ok(GROUPS[i].get_or_init(|| {
        let bits = (g.value_len() * 8) as u32;
        let p =
            BoxedUint::from_be_hex(prime_hex(g), bits).expect("FFDHE prime constant is valid hex");
        let p_minus_1 = p.wrapping_sub(&BoxedUint::one_with_precision(bits));
        let odd = Odd::new(p).expect("FFDHE primes are odd");
        Group {
            params: BoxedMontyParams::new(odd),
            p_minus_1,
            bits,
        }
    }))
}

/// One side's ephemeral key pair in a group.
pub struct KeyPair {
    group: DhGroup,
    private: BoxedUint,
    public: Vec<u8>,
}

impl Drop for KeyPair {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.private.zeroize();
    }
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPair")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl KeyPair {
    /// A fresh key pair: x random (512 bits, never 0), public value 2^x mod p.
    pub fn generate(g: DhGroup, entropy: &mut dyn Entropy) -> Result<KeyPair, DhError> {
        let grp = group(g)?;
        let mut x = Zeroizing::new([0u8; (PRIVATE_BITS / 8) as usize]);
        loop {
            entropy.fill(&mut x[..]);
            if x.iter().any(|&b| b != 0) {
                break;
            }
        }
        let private = BoxedUint::from_be_slice(&x[..], grp.bits).expect("512 bits fit the group");
        let two = BoxedMontyForm::new(
            BoxedUint::from_be_slice(&[2], grp.bits).expect("2 fits"),
            grp.params.clone(),
        );
        let y = two.pow_bounded_exp(&private, PRIVATE_BITS).retrieve();
        Ok(KeyPair {
            group: g,
            private,
            public: padded(&y, g.value_len()),
        })
    }

    pub fn group(&self) -> DhGroup {
        self.group
    }
    /// The public value, big endian, exactly the group's size.
    pub fn public(&self) -> &[u8] {
        &self.public
    }

    /// The shared secret (peer^x mod p, padded to the group's size). The peer's value
    /// must be the group's size and 1 < y < p - 1 (a value of 0, 1 or p - 1 would force
    /// the secret into a subgroup of size 2 or 1).
    pub fn shared_secret(&self, peer: &[u8]) -> Result<Zeroizing<Vec<u8>>, DhError> {
        let grp = group(self.group)?;
        let want = self.group.value_len();
        if peer.len() != want {
            return Err(DhError::Length {
                got: peer.len(),
                want,
            });
        }
        let y = BoxedUint::from_be_slice(peer, grp.bits).map_err(|_| DhError::Range)?;
        let one = BoxedUint::one_with_precision(grp.bits);
        if y <= one || y >= grp.p_minus_1 {
            return Err(DhError::Range);
        }
        let s = BoxedMontyForm::new(y, grp.params.clone())
            .pow_bounded_exp(&self.private, PRIVATE_BITS)
            .retrieve();
        Ok(Zeroizing::new(padded(&s, want)))
    }
}

fn padded(n: &BoxedUint, len: usize) -> Vec<u8> {
    let b = n.to_be_bytes();
    let mut out = vec![0u8; len];
    let skip = b.len().saturating_sub(len);
    let src = &b[skip..];
    out[len - src.len()..].copy_from_slice(src);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn counter_entropy(seed: u8) -> impl FnMut(&mut [u8]) {
        let mut n = seed as u64;
        move |buf: &mut [u8]| {
            for b in buf.iter_mut() {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *b = (n >> 33) as u8;
            }
        }
    }

    /// The constants are RFC 7919's primes: top and bottom 64 bits set (p = 2^b -
    /// 2^(b-64) + {...} * 2^64 - 1), the right size, 2^(p-1) = 1 mod p (Fermat) and
    /// q = (p-1)/2 passes the same test (a safe prime). The hex was taken from OpenSSL 3's
    /// built-in ffdhe groups and checked against the RFC's formula with e.
    #[test]
    fn primes_are_rfc7919() {
        for g in &DhGroup::ALL[1..] {
            let hex = prime_hex(*g);
            assert_eq!(hex.len() * 4, g.value_len() * 8, "{g:?}");
            assert!(hex.starts_with("FFFFFFFFFFFFFFFF") && hex.ends_with("FFFFFFFFFFFFFFFF"));
            let grp = group(*g).unwrap();
            let two = BoxedMontyForm::new(
                BoxedUint::from_be_slice(&[2], grp.bits).unwrap(),
                grp.params.clone(),
            );
            let one = BoxedUint::one_with_precision(grp.bits);
            assert_eq!(two.pow(&grp.p_minus_1).retrieve(), one, "{g:?} Fermat");
            // 2 is a quadratic residue mod a safe prime p = 7 mod 8, so 2^q = 1 too.
            let q = grp.p_minus_1.shr_vartime(1).unwrap();
            assert_eq!(
                two.pow(&q).retrieve(),
                one,
                "{g:?} generates the q-subgroup"
            );
        }
    }

    #[test]
    fn exchange_agrees() {
        for g in [DhGroup::Ffdhe2048, DhGroup::Ffdhe8192] {
            let a = KeyPair::generate(g, &mut counter_entropy(1)).unwrap();
            let b = KeyPair::generate(g, &mut counter_entropy(2)).unwrap();
            assert_eq!(a.public().len(), g.value_len());
            assert_ne!(a.public(), b.public());
            let s1 = a.shared_secret(b.public()).unwrap();
            let s2 = b.shared_secret(a.public()).unwrap();
            assert_eq!(*s1, *s2);
            assert_eq!(s1.len(), g.value_len());
        }
    }

    #[test]
    fn bad_peer_values() {
        let g = DhGroup::Ffdhe2048;
        let a = KeyPair::generate(g, &mut counter_entropy(3)).unwrap();
        let n = g.value_len();
        let mut v = vec![0u8; n];
        assert_eq!(a.shared_secret(&v).unwrap_err(), DhError::Range);
        v[n - 1] = 1;
        assert_eq!(a.shared_secret(&v).unwrap_err(), DhError::Range);
        let pm1 = padded(&group(g).unwrap().p_minus_1, n);
        assert_eq!(a.shared_secret(&pm1).unwrap_err(), DhError::Range);
        assert_eq!(a.shared_secret(&[0xff; 256]).unwrap_err(), DhError::Range);
        assert!(matches!(
            a.shared_secret(&[2u8; 255]),
            Err(DhError::Length {
                got: 255,
                want: 256
            })
        ));
        v[n - 1] = 2;
        assert!(a.shared_secret(&v).is_ok());
        assert!(KeyPair::generate(DhGroup::Null, &mut counter_entropy(0)).is_err());
    }

    /// A known private key gives the public value computed independently (Python's
    /// arbitrary-precision `pow` with the RFC 7919 prime).
    #[test]
    fn known_public_value() {
        // x = 0x01 followed by 63 zero bytes = 2^504; 2^(2^504) mod p computed with
        // Python: pow(2, 2**504, p_ffdhe2048), first and last 8 bytes below.
        let mut x = [0u8; 64];
        x[0] = 1;
        let mut fixed = move |buf: &mut [u8]| buf.copy_from_slice(&x[..buf.len()]);
        let a = KeyPair::generate(DhGroup::Ffdhe2048, &mut fixed).unwrap();
        let hexs: String = a.public().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(&hexs[..16], KNOWN_PUB_2048_HEAD);
        assert_eq!(&hexs[hexs.len() - 16..], KNOWN_PUB_2048_TAIL);
    }

    const KNOWN_PUB_2048_HEAD: &str = "6b7e513002ba6e24";
    const KNOWN_PUB_2048_TAIL: &str = "fe126c2402ab217f";
}
