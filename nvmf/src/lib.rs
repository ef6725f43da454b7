//! `nvmf`: the NVMe over Fabrics protocol, with no I/O and no clock.
//!
//! Bytes and time go in, PDUs, completions and actions come out (the quinn-proto way), so
//! everything here is testable without a network and fuzzable.
//!
//! - [`spec`]: NVMe Base 2.0 / NVM Command Set 1.0 / NVMe-oF 1.1 structures (SQE, CQE,
//!   status, SGL, Identify, log pages, features, Fabrics Connect).
//! - [`tcp`]: NVMe/TCP Transport Specification 1.0 PDUs, digests and the receive framer.
//! - [`queue`]: submission-queue rules the transports share (SQHD, SGL lengths).
//! - [`copy`]: Copy source ranges and the fused Compare and Write pairing rules.
//! - [`target`]: subsystems, namespaces, hosts, the controller state machine, admin and
//!   Fabrics command handling, the discovery subsystem.
//!
//! Not implemented: NVMe authentication (DH-HMAC-CHAP), TLS, namespace management,
//! metadata/protection information.
#![forbid(unsafe_code)]

pub mod copy;
pub mod queue;
pub mod spec;
pub mod target;
pub mod tcp;
