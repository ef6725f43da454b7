//! Fuzz harnesses for nvmf-target, one per parser (STYLE.md point 7):
//!
//! - [`tcp_framer`]: NVMe/TCP receive framing ([`nvmf::tcp::RxFramer`]), both roles.
//! - [`tcp_queue`]: whole PDU streams into the controller-side NVMe/TCP queue machine
//!   ([`nvmf::tcp::ControllerQueue`]) with a toy engine answering it.
//! - [`capsule`]: admin/fabrics/I/O capsules into a [`nvmf::target::Target`] with a
//!   connected, enabled controller.
//! - [`connect_data`]: Fabrics Connect SQE + Connect data into `Target::connect`.
//! - [`engine`]: hostile NVMe/TCP byte streams into the soft engine's IO context over
//!   loopback, with a `Target` as the application; checks everything is released.
//! - [`auth`]: DH-HMAC-CHAP messages into both sides' state machines.
//! - [`config`]: YAML text into the daemon's config parser (`src/config.rs`, compiled here
//!   in place).
//!
//! Each harness is a plain `fn(&[u8])` that panics on a finding. The binaries in
//! `fuzz_targets/` wrap them in `libfuzzer_sys::fuzz_target!` under cargo-fuzz
//! (`--cfg fuzzing`) and in [`runner::main`] otherwise, which replays files and mutates
//! seeds for a bounded time on a stable toolchain.

pub mod auth;
pub mod capsule;
pub mod config;
pub mod connect_data;
pub mod engine;
pub mod runner;
pub mod tcp_framer;
pub mod tcp_queue;

/// The daemon's own source, compiled in place for the `config` harness. The daemon is a
/// binary crate; its config module needs only serde, serde-saphyr, thiserror, uuid and nix. The
/// inline module points at the daemon's `src/` so that `config.rs` keeps its usual
/// place and its `mod raw;` etc. resolve to `src/config/*.rs`.
#[path = "../../src"]
#[allow(dead_code, unused_imports, clippy::all)]
mod daemon_src {
    pub mod config;
}

/// Reads bytes off the front of the fuzz input; past the end it yields zeros, so every
/// input decodes to something.
pub struct Input<'a> {
    buf: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(buf: &'a [u8]) -> Input<'a> {
        Input { buf }
    }
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    pub fn u8(&mut self) -> u8 {
        let (&b, rest) = self.buf.split_first().unwrap_or((&0, &[]));
        self.buf = rest;
        b
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    /// Exactly `n` bytes, zero-padded past the end of the input.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let k = n.min(self.buf.len());
        let mut v = self.buf[..k].to_vec();
        v.resize(n, 0);
        self.buf = &self.buf[k..];
        v
    }
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
}
