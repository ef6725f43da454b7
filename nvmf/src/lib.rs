//! `nvmf`: the NVMe over Fabrics protocol, with no I/O and no clock.
//!
//! Bytes and time go in, PDUs, completions and actions come out (the quinn-proto way), so
//! everything here is testable without a network and fuzzable.
//!
//! - [`spec`]: NVMe Base 2.0 / NVM Command Set 1.0 / NVMe-oF 1.1 structures (SQE, CQE,
//!   status, SGL, Identify, log pages, features, Fabrics Connect).
//! - [`tcp`]: NVMe/TCP Transport Specification 1.0 PDUs, digests, the receive framer and
//!   the queue state machines of both sides.
//! - [`rdma`]: the NVMe/RDMA binding (NVMe-oF 1.1 section 7.3): CM private data, keyed
//!   SGLs, send-queue credits and the controller-side queue machine.
//! - [`queue`] (SQHD and Connect parameters) and [`command`] (offloaded opcodes, transfer
//!   lengths, SGL checks): what both transports share.
//! - [`copy`]: Copy source ranges and the fused Compare and Write pairing rules.
//! - [`target`]: subsystems, namespaces, hosts, the controller state machine, admin and
//!   Fabrics command handling, the discovery subsystem.
//! - [`auth`]: DH-HMAC-CHAP in-band authentication (secrets, FFDHE, messages, both
//!   sides' state machines) and the PSK derivations of TLS for NVMe/TCP.
//!
//! Not implemented: the TLS handshake itself (the transport's socket shell runs it with
//! the PSKs [`auth::tls`] derives), namespace management, metadata/protection information.
#![forbid(unsafe_code)]

pub mod auth;
pub mod command;
pub mod copy;
pub mod queue;
pub mod rdma;
pub mod spec;
pub mod target;
pub mod tcp;
