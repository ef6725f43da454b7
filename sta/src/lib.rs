//! `sta`: the offload-engine contract, modelled on NVIDIA DOCA STA, and its engines.
//!
//! - [`contract`]: the traits an engine implements ([`Engine`], [`IoSeed`],
//!   [`IoContext`]) and the values that cross them (handles, [`Event`], [`MainEvent`],
//!   [`Caps`], errors). The daemon is written against these alone.
//! - [`access`]: namespace access views (reservations, ANA, visibility) the application
//!   publishes and the engine checks on its offloaded path ([`AccessPublisher`]).
//! - [`stats`]: the counters an engine exposes ([`Stats`]), read at scrape time.
//! - [`log_every`]: at most one log line per period for events without end ([`LogEvery`]).
//! - [`soft`]: the engine that runs the contract on host CPU cores, over NVMe/TCP and
//!   NVMe/RDMA (any verbs device, Soft-RoCE included), as a shell of sockets, epoll,
//!   backend queues and verbs around `nvmf`'s transport queue machines.
//! - [`verbs`]: rdma-core (libibverbs, librdmacm) loaded at run time: the verbs and CM
//!   calls the soft engine's RDMA link and the daemon's CM service use.
//!
//! - [`doca`] (cargo feature `doca`): the engine over NVIDIA DOCA STA (a BlueField-3
//!   DPA serves the offloaded path), loaded at run time through `doca-sys`; the contract
//!   suite in `tests/contract/` runs against it with the DOCA double (`sta/doca-double`)
//!   over the double's loopback host.
//!
//! `unsafe` lives in [`verbs`], the `doca` engine (FFI) and the soft engine's RDMA link (C calls, memory the NIC
//! reads and writes); each of those modules says so at its top.

pub mod access;
pub mod contract;
#[cfg(feature = "doca")]
pub mod doca;
pub mod log_every;
pub mod soft;
pub mod stats;
pub mod verbs;

pub(crate) use access::AccessCell;
pub use access::{AccessKey, AccessPublisher, NamespaceAccess};
pub use contract::{
    AcceptError, Caps, CmdToken, CommandFailure, Engine, EngineError, EngineLimits, Event, Fence,
    IoContext, IoSeed, Limit, MainEvent, QpHandle, SubsysId, TaskError, TaskKind, TlsAccept,
    TlsPeerInfo, TransportErrorKind,
};
pub use log_every::LogEvery;
pub use nvmf::spec::{Cqe, Sqe, Status};
pub use stats::{
    error_status_index, LatencyTotals, NsTotals, QueueStats, QueueTotals, Stats, StatsSource,
    ThreadTotals, ERROR_STATUSES, LATENCY_BOUNDS_US,
};
