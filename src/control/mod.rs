//! The control socket: how an operator (or a script) sees and steers a running daemon
//! without reading its logs, the way SPDK's `rpc.py` and `nvmetcli ls` do for theirs.
//!
//! - `protocol.rs`: the wire format, one JSON object a line each way, versioned; the
//!   request parser and the reply types (their field names are the stable interface
//!   documented in docs/control.md).
//! - `server.rs`: the socket (mode, owner check by `SO_PEERCRED`, bounds: request size,
//!   read deadline, concurrent clients). It runs on its own thread and never touches the
//!   data path: every command it parses is handed to the daemon's main thread, which
//!   answers between two passes of its loop (`crate::daemon`'s control hook).
//! - `client.rs`: `nvmf-target ctl ...` and `--check-config --diff`, in the same binary.

pub mod client;
pub mod protocol;
pub mod server;
