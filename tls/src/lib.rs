//! `nvmf-tls`: TLS 1.3 with external (out-of-band) pre-shared keys for NVMe/TCP (TP 8011,
//! NVMe/TCP Transport Specification section 3.6), on OpenSSL.
//!
//! The NVMe side of it (PSK interchange format, retained and TLS PSK derivation, PSK
//! identities) is `nvmf::auth::tls`; this crate turns those PSKs into OpenSSL contexts:
//!
//! - [`PskTable`]: identity -> (TLS PSK, its hash, host NQN, subsystem NQN); shared by
//!   the server context, swapped whole by a reload.
//! - [`server_context`]: TLS 1.3 only, TLS_AES_128_GCM_SHA256 and TLS_AES_256_GCM_SHA384,
//!   no certificate, no session tickets; the PSK is found by the identity the client
//!   offers (`SSL_CTX_set_psk_find_session_callback`), so SHA-384 PSKs work too (the
//!   older `psk_server_callback` only does SHA-256 suites in TLS 1.3).
//! - [`client_context`]: offers one PSK (`SSL_CTX_set_psk_use_session_callback`), for the
//!   repo's initiator.
//! - [`Handshake`]: a handshake that runs over a non-blocking socket, one step per
//!   readiness event.
//!
//! Why OpenSSL: rustls has no external PSKs yet, BoringSSL refuses external TLS 1.3 PSKs
//! by design; OpenSSL 3 (Debian's libssl3) has them. The Linux host's handshake daemon
//! (tlshd) uses GnuTLS; the tests also run GnuTLS's `gnutls-cli` against the server when
//! it is installed.
//!
//! `unsafe` here is the FFI OpenSSL demands for the two PSK session callbacks the `openssl`
//! crate does not wrap; every block says why it is sound.
//!
//! Not implemented: TLS 1.2, certificates, session resumption, kTLS offload (the record
//! layer runs in user space, see the README's TLS section).
// Talks to C (OpenSSL's PSK session callbacks), see above.
#![allow(unsafe_code)]

use foreign_types::ForeignTypeRef;
use nvmf::auth::tls::{cipher_suite, ConfiguredPsk, TlsPsk};
use nvmf::auth::HashId;
use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{
    ClientHelloResponse, HandshakeError, Ssl, SslContextBuilder, SslMethod, SslOptions, SslRef,
    SslVerifyMode, SslVersion,
};
pub use openssl::ssl::{MidHandshakeSslStream, SslContext, SslStream};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::raw::c_int;
use std::sync::{Arc, OnceLock, RwLock};
use zeroize::Zeroizing;

/// Both NVMe/TCP TLS 1.3 cipher suites (TP 8011 requires TLS_AES_128_GCM_SHA256, allows
/// TLS_AES_256_GCM_SHA384).
pub const CIPHER_SUITES: &str = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("OpenSSL: {0}")]
    OpenSsl(#[from] ErrorStack),
    #[error("TLS handshake failed: {0}")]
    Handshake(String),
    #[error("the host offered PSK identity {0:?}, which no configured host has")]
    UnknownIdentity(String),
}

/// One PSK the server accepts (or the client offers).
pub struct PskEntry {
    pub identity: String,
    pub hash: HashId,
    key: Zeroizing<Vec<u8>>,
    /// The host and subsystem the PSK is for (from the configuration, not the identity
    /// text).
    pub hostnqn: String,
    pub subnqn: String,
}

impl std::fmt::Debug for PskEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PskEntry")
            .field("identity", &self.identity)
            .field("hash", &self.hash)
            .finish_non_exhaustive()
    }
}

impl PskEntry {
    pub fn new(psk: &TlsPsk, hostnqn: &str, subnqn: &str) -> PskEntry {
        PskEntry {
            identity: psk.identity.clone(),
            hash: psk.hash,
            key: psk.key.clone(),
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
        }
    }
    /// The TLS 1.3 cipher suite this PSK works with.
    pub fn cipher_suite(&self) -> &'static str {
        cipher_suite(self.hash)
    }
}

/// PSK identity -> PSK.
#[derive(Debug, Default)]
pub struct PskTable {
    map: HashMap<Vec<u8>, Arc<PskEntry>>,
}

/// The table a server context reads, replaced whole on reload.
pub type SharedPskTable = Arc<RwLock<PskTable>>;

impl PskTable {
    /// Adds every identity a host may offer for its configured PSK and this subsystem
    /// (version 1 with digest, version 0).
    pub fn insert_configured(&mut self, psk: &ConfiguredPsk, hostnqn: &str, subnqn: &str) {
        self.insert_configured_with(psk, hostnqn, subnqn, Default::default());
    }
    /// [`insert_configured`](Self::insert_configured) for a host that derives its PSKs
    /// with `d`.
    pub fn insert_configured_with(
        &mut self,
        psk: &ConfiguredPsk,
        hostnqn: &str,
        subnqn: &str,
        d: nvmf::auth::tls::Derivation,
    ) {
        for p in psk.tls_psks_with(hostnqn, subnqn, d) {
            self.insert(PskEntry::new(&p, hostnqn, subnqn));
        }
    }
    pub fn insert(&mut self, e: PskEntry) {
        self.map.insert(e.identity.as_bytes().to_vec(), Arc::new(e));
    }
    pub fn get(&self, identity: &[u8]) -> Option<Arc<PskEntry>> {
        self.map.get(identity).cloned()
    }
    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

fn table_index() -> Index<SslContext, SharedPskTable> {
    static I: OnceLock<Index<SslContext, SharedPskTable>> = OnceLock::new();
    *I.get_or_init(|| SslContext::new_ex_index().expect("OpenSSL ex_data index"))
}
fn client_index() -> Index<SslContext, Arc<PskEntry>> {
    static I: OnceLock<Index<SslContext, Arc<PskEntry>>> = OnceLock::new();
    *I.get_or_init(|| SslContext::new_ex_index().expect("OpenSSL ex_data index"))
}
fn peer_index() -> Index<Ssl, Arc<PskEntry>> {
    static I: OnceLock<Index<Ssl, Arc<PskEntry>>> = OnceLock::new();
    *I.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL ex_data index"))
}
fn unknown_index() -> Index<Ssl, String> {
    static I: OnceLock<Index<Ssl, String>> = OnceLock::new();
    *I.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL ex_data index"))
}

/// The libssl 3 functions for external TLS 1.3 PSKs that `openssl-sys` does not declare
/// (prototypes from OpenSSL's ssl.h).
mod ffi {
    use openssl_sys::{EVP_MD, SSL, SSL_CIPHER, SSL_CTX, SSL_SESSION};
    use std::os::raw::c_int;

    pub type FindSessionCb = unsafe extern "C" fn(
        ssl: *mut SSL,
        identity: *const u8,
        identity_len: usize,
        sess: *mut *mut SSL_SESSION,
    ) -> c_int;
    pub type UseSessionCb = unsafe extern "C" fn(
        ssl: *mut SSL,
        md: *const EVP_MD,
        id: *mut *const u8,
        idlen: *mut usize,
        sess: *mut *mut SSL_SESSION,
    ) -> c_int;

    extern "C" {
        pub fn SSL_SESSION_new() -> *mut SSL_SESSION;
        pub fn SSL_CTX_set_psk_find_session_callback(ctx: *mut SSL_CTX, cb: Option<FindSessionCb>);
        pub fn SSL_CTX_set_psk_use_session_callback(ctx: *mut SSL_CTX, cb: Option<UseSessionCb>);
        pub fn SSL_SESSION_set1_master_key(
            s: *mut SSL_SESSION,
            key: *const u8,
            len: usize,
        ) -> c_int;
        pub fn SSL_CIPHER_find(ssl: *mut SSL, ptr: *const u8) -> *const SSL_CIPHER;
        pub fn SSL_SESSION_set_cipher(s: *mut SSL_SESSION, cipher: *const SSL_CIPHER) -> c_int;
        pub fn SSL_SESSION_set_protocol_version(s: *mut SSL_SESSION, version: c_int) -> c_int;
    }
}

/// TLS1_3_VERSION from OpenSSL's headers.
const TLS1_3_VERSION: c_int = 0x0304;

/// An SSL_SESSION carrying `entry`'s key, for its cipher suite, TLS 1.3; null on failure.
///
/// # Safety
/// `ssl` must be a live SSL handle inside one of its callbacks.
unsafe fn psk_session(
    ssl: *mut openssl_sys::SSL,
    entry: &PskEntry,
) -> *mut openssl_sys::SSL_SESSION {
    // The two TLS 1.3 cipher suite code points: 0x13,0x01 AES-128-GCM-SHA256 and
    // 0x13,0x02 AES-256-GCM-SHA384.
    let id: [u8; 2] = match entry.hash {
        HashId::Sha384 => [0x13, 0x02],
        _ => [0x13, 0x01],
    };
    // SAFETY: `ssl` is live (caller's contract); `id` is two readable bytes, which is what
    // SSL_CIPHER_find reads.
    let cipher = unsafe { ffi::SSL_CIPHER_find(ssl, id.as_ptr()) };
    if cipher.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: SSL_SESSION_new takes no arguments and returns an owned session or null.
    let s = unsafe { ffi::SSL_SESSION_new() };
    if s.is_null() {
        return s;
    }
    // SAFETY: `s` is the session just created; the key slice is valid for its length and
    // OpenSSL copies it; `cipher` came from SSL_CIPHER_find and is static.
    let ok = unsafe {
        ffi::SSL_SESSION_set1_master_key(s, entry.key.as_ptr(), entry.key.len()) == 1
            && ffi::SSL_SESSION_set_cipher(s, cipher) == 1
            && ffi::SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) == 1
    };
    if !ok {
        // SAFETY: `s` is ours and not handed to OpenSSL yet.
        unsafe { openssl_sys::SSL_SESSION_free(s) };
        return std::ptr::null_mut();
    }
    s
}

/// Server side: the PSK for the identity the client offers.
unsafe extern "C" fn find_session(
    ssl: *mut openssl_sys::SSL,
    identity: *const u8,
    identity_len: usize,
    sess: *mut *mut openssl_sys::SSL_SESSION,
) -> c_int {
    let r = std::panic::catch_unwind(|| {
        // SAFETY: OpenSSL calls this with a live SSL and the identity bytes it received
        // (valid for `identity_len`); `sess` is a valid out-pointer. SslRef does not take
        // ownership.
        let (ssl_ref, id, sess) = unsafe {
            (
                SslRef::from_ptr_mut(ssl),
                std::slice::from_raw_parts(identity, identity_len),
                &mut *sess,
            )
        };
        *sess = std::ptr::null_mut();
        let entry = ssl_ref
            .ssl_context()
            .ex_data(table_index())
            .and_then(|t| t.read().unwrap_or_else(|e| e.into_inner()).get(id));
        match entry {
            Some(e) => {
                // SAFETY: inside the callback, `ssl` is live.
                let s = unsafe { psk_session(ssl, &e) };
                if s.is_null() {
                    return 0;
                }
                *sess = s;
                ssl_ref.set_ex_data(peer_index(), e);
                1
            }
            None => {
                // No such PSK: continue without one; with no certificate the handshake
                // then fails, and the caller can say which identity it was.
                ssl_ref.set_ex_data(unknown_index(), String::from_utf8_lossy(id).into_owned());
                1
            }
        }
    });
    r.unwrap_or(0)
}

/// Client side: offer our one PSK.
unsafe extern "C" fn use_session(
    ssl: *mut openssl_sys::SSL,
    md: *const openssl_sys::EVP_MD,
    id: *mut *const u8,
    idlen: *mut usize,
    sess: *mut *mut openssl_sys::SSL_SESSION,
) -> c_int {
    let r = std::panic::catch_unwind(|| {
        // SAFETY: OpenSSL calls this with a live SSL and valid out-pointers.
        let (ssl_ref, sess) = unsafe { (SslRef::from_ptr_mut(ssl), &mut *sess) };
        *sess = std::ptr::null_mut();
        let Some(e) = ssl_ref.ssl_context().ex_data(client_index()).cloned() else {
            return 1;
        };
        if !md.is_null() {
            // After a HelloRetryRequest OpenSSL asks again with the negotiated hash: offer
            // the PSK only if it is for that hash.
            // SAFETY: `md` is a live EVP_MD owned by OpenSSL for the call.
            let want = unsafe { openssl::hash::MessageDigest::from_ptr(md) }.type_();
            let ours = match e.hash {
                HashId::Sha384 => openssl::nid::Nid::SHA384,
                _ => openssl::nid::Nid::SHA256,
            };
            if want != ours {
                return 1;
            }
        }
        // SAFETY: inside the callback, `ssl` is live.
        let s = unsafe { psk_session(ssl, &e) };
        if s.is_null() {
            return 0;
        }
        // SAFETY: out-pointers are valid; the identity bytes live in the context's ex_data
        // (an Arc kept by the SSL_CTX), which outlives the handshake.
        unsafe {
            *id = e.identity.as_ptr();
            *idlen = e.identity.len();
        }
        *sess = s;
        1
    });
    r.unwrap_or(0)
}

/// Characters of an unknown PSK identity kept for the error (the rest is counted).
const SHOWN_IDENTITY_CHARS: usize = 200;

/// Key exchange groups the server accepts (`server_context`).
pub const SERVER_GROUPS: &str = "X25519:P-256:P-384:P-521";

fn tls13_only(b: &mut SslContextBuilder, suites: &str) -> Result<(), ErrorStack> {
    b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_ciphersuites(suites)?;
    // No resumption: every connection proves the PSK again; no tickets to keep.
    b.set_num_tickets(0)?;
    b.set_options(SslOptions::NO_TICKET);
    Ok(())
}

/// A TLS 1.3 server context that accepts the PSKs in `table` (read at each handshake,
/// so replacing its contents takes effect for new connections).
pub fn server_context(table: SharedPskTable) -> Result<SslContext, TlsError> {
    let mut b = SslContext::builder(SslMethod::tls_server())?;
    tls13_only(&mut b, CIPHER_SUITES)?;
    // Elliptic-curve key exchange only. OpenSSL's defaults also take the finite-field
    // groups, and a handshake runs on an IO thread: a client with a PSK that offers only
    // ffdhe8192 cost it about 100 ms per handshake (x25519: under 2 ms), which stalled
    // every other queue on the thread. A client that sends another key share gets a
    // HelloRetryRequest for one of these; tlshd (GnuTLS), SPDK and OpenSSL offer them.
    b.set_groups_list(SERVER_GROUPS)?;
    b.set_verify(SslVerifyMode::NONE);
    // OpenSSL picks the cipher suite (by the client's preference) before it looks at the
    // PSK, and ignores a PSK whose hash is not the suite's: GnuTLS offers AES-256 first,
    // so a SHA-256 PSK would be dropped and the handshake fail for want of a certificate.
    // Peek at the ClientHello's pre_shared_key identities and narrow this connection's
    // suites to the one the first known PSK is for.
    let peek = table.clone();
    b.set_client_hello_callback(move |ssl, _alert| {
        if let Some(e) = offered_identities(ssl)
            .into_iter()
            .find_map(|id| peek.read().unwrap_or_else(|e| e.into_inner()).get(&id))
        {
            ssl.set_ciphersuites(e.cipher_suite())?;
        }
        Ok(ClientHelloResponse::SUCCESS)
    });
    b.set_ex_data(table_index(), table);
    // SAFETY: the builder's SSL_CTX is live; the callback is a plain function with the
    // signature OpenSSL's header gives for SSL_psk_find_session_cb_func.
    unsafe { ffi::SSL_CTX_set_psk_find_session_callback(b.as_ptr(), Some(find_session)) };
    Ok(b.build())
}

/// The PSK identities of the ClientHello's pre_shared_key extension (RFC 8446 section
/// 4.2.11), in order; empty when there is none or it is malformed.
fn offered_identities(ssl: &mut SslRef) -> Vec<Vec<u8>> {
    const PRE_SHARED_KEY: u32 = 41;
    let mut out: *const u8 = std::ptr::null();
    let mut len = 0usize;
    // SAFETY: called from the client hello callback with a live SSL; OpenSSL fills `out`
    // with a pointer into its ClientHello buffer, valid for `len` bytes during the call.
    let found = unsafe {
        openssl_sys::SSL_client_hello_get0_ext(ssl.as_ptr(), PRE_SHARED_KEY, &mut out, &mut len)
    };
    if found != 1 || out.is_null() {
        return Vec::new();
    }
    // SAFETY: see above; the slice is only read before returning.
    let ext = unsafe { std::slice::from_raw_parts(out, len) };
    let mut ids = Vec::new();
    let Some(total) = ext
        .get(..2)
        .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
    else {
        return ids;
    };
    let mut list = ext.get(2..2 + total).unwrap_or(&[]);
    while list.len() >= 2 {
        let n = u16::from_be_bytes([list[0], list[1]]) as usize;
        // identity, then a 4-byte obfuscated ticket age.
        let Some(id) = list.get(2..2 + n) else { break };
        ids.push(id.to_vec());
        list = list.get(2 + n + 4..).unwrap_or(&[]);
    }
    ids
}

/// A TLS 1.3 client context that offers `psk` (and only its cipher suite).
pub fn client_context(psk: Arc<PskEntry>) -> Result<SslContext, TlsError> {
    let mut b = SslContext::builder(SslMethod::tls_client())?;
    tls13_only(&mut b, psk.cipher_suite())?;
    b.set_verify(SslVerifyMode::NONE);
    b.set_ex_data(client_index(), psk);
    // SAFETY: as in server_context, for SSL_psk_use_session_cb_func.
    unsafe { ffi::SSL_CTX_set_psk_use_session_callback(b.as_ptr(), Some(use_session)) };
    Ok(b.build())
}

/// The PSK a finished server handshake used.
pub fn peer_psk(ssl: &SslRef) -> Option<Arc<PskEntry>> {
    ssl.ex_data(peer_index()).cloned()
}

/// A handshake in progress over a (possibly non-blocking) stream.
pub enum Handshake<S> {
    Done(SslStream<S>),
    /// Waiting for the socket: call [`Handshake::resume`] when it is readable (or
    /// writable).
    Pending(MidHandshakeSslStream<S>),
    Failed(TlsError),
}

impl<S: Read + Write> Handshake<S> {
    /// Starts the server side.
    pub fn accept(ctx: &SslContext, stream: S) -> Handshake<S> {
        match Ssl::new(ctx) {
            Ok(ssl) => Self::from(ssl.accept(stream)),
            Err(e) => Handshake::Failed(e.into()),
        }
    }
    /// Starts the client side.
    pub fn connect(ctx: &SslContext, stream: S) -> Handshake<S> {
        match Ssl::new(ctx) {
            Ok(ssl) => Self::from(ssl.connect(stream)),
            Err(e) => Handshake::Failed(e.into()),
        }
    }
    /// One more step of a pending handshake.
    pub fn resume(mid: MidHandshakeSslStream<S>) -> Handshake<S> {
        Self::from(mid.handshake())
    }
    /// Runs to the end (blocking streams).
    pub fn finish(mut self) -> Result<SslStream<S>, TlsError> {
        loop {
            match self {
                Handshake::Done(s) => return Ok(s),
                Handshake::Failed(e) => return Err(e),
                Handshake::Pending(m) => self = Handshake::resume(m),
            }
        }
    }

    fn from(r: Result<SslStream<S>, HandshakeError<S>>) -> Handshake<S> {
        match r {
            Ok(s) => Handshake::Done(s),
            Err(HandshakeError::WouldBlock(m)) => Handshake::Pending(m),
            Err(HandshakeError::SetupFailure(e)) => Handshake::Failed(e.into()),
            Err(HandshakeError::Failure(m)) => {
                if let Some(id) = m.ssl().ex_data(unknown_index()) {
                    // For the log: an identity can be up to 64 KiB of the peer's choosing.
                    let shown = match id.char_indices().nth(SHOWN_IDENTITY_CHARS) {
                        Some((cut, _)) => format!("{}... ({} bytes)", &id[..cut], id.len()),
                        None => id.clone(),
                    };
                    return Handshake::Failed(TlsError::UnknownIdentity(shown));
                }
                Handshake::Failed(TlsError::Handshake(m.error().to_string()))
            }
        }
    }
}
