//! The engine contract suite: the rules of `sta::contract`, checked through the traits
//! alone, so that every engine and every transport runs the same scenarios.
//!
//! `suite.rs` holds the scenarios, generic over a [`suite::Fabric`] (an engine, a backend
//! it can stall, and hosts it can connect) and played by a small application around
//! `nvmf::target::Target`. What runs where:
//!
//! | engine | transport | host | where |
//! |---|---|---|---|
//! | soft | NVMe/TCP | `nvmf::tcp::HostQueue` on a loopback socket (`tcp.rs`) | here, every `cargo test` |
//! | soft | NVMe/RDMA | needs an RDMA host side (this repo has none yet); the same engine code above the link is exercised here over TCP, and its RDMA link by the Linux host in the interop VM (Soft-RoCE, `tests/interop` scenario `nvmft-rdma`) | — |
//! | doca | NVMe/RDMA | the DOCA double's loopback host (`doca_double_loop_*`: capsules in, completions out, memory under an rkey; `doca.rs`) | here, every `cargo test` with the `doca` feature (the workspace enables it), against `sta/doca-double`; never on a BlueField |
//!
//! A new fabric implements `Fabric` and `Host` and adds one `#[test]` per scenario, as
//! below. The scenarios need no sleep or simulated time: they run the engine and the
//! host on the test's thread and wait on conditions, each wait bounded (10 s).

#[cfg(feature = "doca")]
mod doca;
mod suite;
mod tcp;

use tcp::SoftTcp;

/// The same ten scenarios on the doca engine with the DOCA double, one at a time (the
/// double is one per process).
#[cfg(feature = "doca")]
mod doca_scenarios {
    use super::doca::{serial, DocaLoop};
    use super::suite;

    macro_rules! scenario {
        ($($name:ident),* $(,)?) => {$(
            #[test]
            fn $name() {
                let _one_at_a_time = serial();
                suite::$name(DocaLoop::new());
            }
        )*};
    }

    scenario!(
        caps_are_usable,
        control_plane,
        admin_path,
        io_is_offloaded,
        host_data_by_rdma_read,
        stale_handles_are_errors,
        disconnect_and_user_data,
        host_close_is_a_transport_error,
        ns_remove_waits_for_inflight_io,
        hung_backend,
    );
}

#[test]
fn soft_tcp_caps_are_usable() {
    suite::caps_are_usable(SoftTcp::new());
}

#[test]
fn soft_tcp_control_plane() {
    suite::control_plane(SoftTcp::new());
}

#[test]
fn soft_tcp_admin_path() {
    suite::admin_path(SoftTcp::new());
}

#[test]
fn soft_tcp_io_is_offloaded() {
    suite::io_is_offloaded(SoftTcp::new());
}

#[test]
fn soft_tcp_host_data_by_rdma_read() {
    suite::host_data_by_rdma_read(SoftTcp::new());
}

#[test]
fn soft_tcp_stale_handles_are_errors() {
    suite::stale_handles_are_errors(SoftTcp::new());
}

#[test]
fn soft_tcp_disconnect_and_user_data() {
    suite::disconnect_and_user_data(SoftTcp::new());
}

#[test]
fn soft_tcp_host_close_is_a_transport_error() {
    suite::host_close_is_a_transport_error(SoftTcp::new());
}

#[test]
fn soft_tcp_ns_remove_waits_for_inflight_io() {
    suite::ns_remove_waits_for_inflight_io(SoftTcp::new());
}

#[test]
fn soft_tcp_hung_backend() {
    suite::hung_backend(SoftTcp::new());
}
