//! `doca-double`: a test double of NVIDIA DOCA STA (DOCA 3.3), built as `libdoca_sta.so`,
//! exporting the same C ABI: all 94 `doca_sta_*` functions and the 40 DOCA Core
//! functions the STA flow calls (`doca_error_*`, `doca_devinfo_*`, `doca_dev_*`,
//! `doca_pe_*`, `doca_ctx_*`, `doca_task_*`, `doca_mmap_*`, `doca_log_*`; the list is
//! `sta/doca-sys/core-functions.txt`). Its C headers are `include/`, written from the
//! documented prototypes (shared/doca-sta-api.md), not copied from NVIDIA.
//!
//! What it is: a working STA on host CPUs. Devices are the machine's RDMA verbs devices
//! (Soft-RoCE in the interop VM); QPs are created on the `rdma_cm_id`s the application
//! hands to `doca_sta_io_qp_accept`/`_connect`; capsules arrive by RDMA RECV. Offloaded
//! Read/Write/Flush (I/O queues bound to a subsystem, namespaces added with
//! `doca_sta_subsystem_add_ns`) become NVMe commands in the backend queue registered with
//! `doca_sta_be_add_queue` (SQ ring entries, SQ tail doorbell through the doorbell mmap)
//! and complete from its CQ (phase tag, CQ head doorbell); data moves with RDMA
//! READ/WRITE between the host's keyed SGL and buffers allocated through the
//! application's allocator (`doca_sta_mem_allocator_register`; PRPs carry its vtophys
//! address). Backend queues whose doorbells are plain memory (not a dmabuf of a BAR) are
//! served by a RAM drive inside the double ([`drive`]). Everything else reaches the
//! non-offload callback; the three response tasks, the disconnect, namespace-removal and
//! backend-queue-destroy tasks, the transport-error, backend-timeout and CQE-notify events
//! and the statistics calls work as doca-sta-api.md describes. See [`engine`] for the
//! capsule path and [`pe`] for progress and callbacks.
//!
//! What it checks: the contract rules of [`contract`] (call order, object state, argument
//! ranges, teardown leaks); a broken rule aborts with a message naming the rule and the
//! section of doca-sta-api.md it comes from (or, in report mode, returns an error).
//!
//! For tests without RDMA hardware: `DOCA_DOUBLE_TEST_DEVICES=name,...` adds devices
//! without verbs (control plane only), and `doca_double_loop_*` ([`ext`]) is a loopback
//! host: a test sends capsules and reads completions, and registers memory the double
//! RDMA-reads and -writes under an rkey. The path above the link is the same as on verbs.
//!
//! What it does not do: run on a DPA or a BlueField (it is host code); SRQ, multiple SGL
//! descriptors, admin commands to the backend, Write Zeroes/DSM offload (STA offloads
//! Read, Write and Flush only); execution-unit errors (never raised); notification for a
//! main PE beyond its eventfd. Verbs are only exercised in the interop VM.
//!
//! Environment: `DOCA_DOUBLE_CONTRACT=report`, `DOCA_DOUBLE_TEST_DEVICES`,
//! `DOCA_DOUBLE_NULL_DRIVE_MB` (RAM drive size per backend, default 1024),
//! `DOCA_DOUBLE_BE_TIMEOUT_MS` (backend timeout, default 30000).

// `unsafe` allowed here: the whole crate is a C-ABI library: every export is an extern "C"
// function taking raw pointers from C callers, and the double touches memory (rings, DMA
// buffers) by address as the real engine does.
#![allow(unsafe_code)]

pub mod contract;
pub mod core_api;
pub mod drive;
pub mod engine;
pub mod ext;
pub mod io_api;
pub mod link;
pub mod mem;
pub mod pe;
pub mod sta_api;
pub mod stats;
pub mod world;

/// Output and argument pointers.
pub(crate) mod out {
    use crate::contract::{self, broken, Res};

    pub fn check<T>(p: *const T, name: &str) -> Res<()> {
        if p.is_null() {
            return broken(&contract::NULL_ARG, format!("`{name}` is NULL"));
        }
        Ok(())
    }

    pub fn check_cb<T>(cb: Option<T>) -> Res<()> {
        if cb.is_none() {
            return broken(&contract::NULL_ARG, "the callback is NULL");
        }
        Ok(())
    }

    pub fn put<T>(p: *mut T, v: T) -> Res<()> {
        check(p, "output")?;
        // SAFETY: the C contract of every DOCA getter: `p` points to writable memory for
        // one T (checked non-NULL).
        unsafe { p.write(v) };
        Ok(())
    }
}

/// Compile-time proof that every exported function has exactly the prototype bindgen
/// read from NVIDIA's DOCA 3.3 headers: each is stored into the field of the same name
/// of doca-sys's function table, whose types are bindgen's.
#[allow(dead_code)]
fn abi_matches_the_doca_headers(t: &mut doca_sys::DocaLib) {
    use crate::{core_api::*, io_api::*, pe::*, sta_api::*};
    t.doca_error_get_name = doca_error_get_name;
    t.doca_error_get_descr = doca_error_get_descr;
    t.doca_devinfo_create_list = doca_devinfo_create_list;
    t.doca_devinfo_destroy_list = doca_devinfo_destroy_list;
    t.doca_devinfo_get_ibdev_name = doca_devinfo_get_ibdev_name;
    t.doca_devinfo_get_iface_name = doca_devinfo_get_iface_name;
    t.doca_devinfo_get_pci_addr_str = doca_devinfo_get_pci_addr_str;
    t.doca_dev_open = doca_dev_open;
    t.doca_dev_close = doca_dev_close;
    t.doca_dev_as_devinfo = doca_dev_as_devinfo;
    t.doca_pe_create = doca_pe_create;
    t.doca_pe_destroy = doca_pe_destroy;
    t.doca_pe_connect_ctx = doca_pe_connect_ctx;
    t.doca_pe_progress = doca_pe_progress;
    t.doca_pe_get_num_inflight_tasks = doca_pe_get_num_inflight_tasks;
    t.doca_pe_get_notification_handle = doca_pe_get_notification_handle;
    t.doca_pe_request_notification = doca_pe_request_notification;
    t.doca_pe_clear_notification = doca_pe_clear_notification;
    t.doca_task_submit = doca_task_submit;
    t.doca_task_try_submit = doca_task_try_submit;
    t.doca_task_free = doca_task_free;
    t.doca_task_get_status = doca_task_get_status;
    t.doca_ctx_start = doca_ctx_start;
    t.doca_ctx_stop = doca_ctx_stop;
    t.doca_ctx_get_state = doca_ctx_get_state;
    t.doca_ctx_set_state_changed_cb = doca_ctx_set_state_changed_cb;
    t.doca_ctx_set_user_data = doca_ctx_set_user_data;
    t.doca_ctx_get_user_data = doca_ctx_get_user_data;
    t.doca_ctx_get_num_inflight_tasks = doca_ctx_get_num_inflight_tasks;
    t.doca_mmap_create = doca_mmap_create;
    t.doca_mmap_add_dev = doca_mmap_add_dev;
    t.doca_mmap_set_memrange = doca_mmap_set_memrange;
    t.doca_mmap_set_dmabuf_memrange = doca_mmap_set_dmabuf_memrange;
    t.doca_mmap_set_permissions = doca_mmap_set_permissions;
    t.doca_mmap_start = doca_mmap_start;
    t.doca_mmap_stop = doca_mmap_stop;
    t.doca_mmap_destroy = doca_mmap_destroy;
    t.doca_log_backend_create_standard = doca_log_backend_create_standard;
    t.doca_log_backend_create_with_file_sdk = doca_log_backend_create_with_file_sdk;
    t.doca_log_backend_set_sdk_level = doca_log_backend_set_sdk_level;
    t.doca_sta_add_dev = doca_sta_add_dev;
    t.doca_sta_as_ctx = doca_sta_as_ctx;
    t.doca_sta_be_add_queue = doca_sta_be_add_queue;
    t.doca_sta_be_create = doca_sta_be_create;
    t.doca_sta_be_destroy = doca_sta_be_destroy;
    t.doca_sta_be_destroy_queue_task_alloc_init = doca_sta_be_destroy_queue_task_alloc_init;
    t.doca_sta_be_task_destroy_queue_set_conf = doca_sta_be_task_destroy_queue_set_conf;
    t.doca_sta_cap_is_supported = doca_sta_cap_is_supported;
    t.doca_sta_create = doca_sta_create;
    t.doca_sta_destroy = doca_sta_destroy;
    t.doca_sta_eu_reset_stats_handle = doca_sta_eu_reset_stats_handle;
    t.doca_sta_eu_reset_stats_type = doca_sta_eu_reset_stats_type;
    t.doca_sta_event_be_timeout_get_be_handle = doca_sta_event_be_timeout_get_be_handle;
    t.doca_sta_event_be_timeout_get_be_queue_handle = doca_sta_event_be_timeout_get_be_queue_handle;
    t.doca_sta_event_be_timeout_register_cb = doca_sta_event_be_timeout_register_cb;
    t.doca_sta_event_cqe_notify_get_capsule_params = doca_sta_event_cqe_notify_get_capsule_params;
    t.doca_sta_event_cqe_notify_get_cqe = doca_sta_event_cqe_notify_get_cqe;
    t.doca_sta_event_cqe_notify_get_cqe_notify_type = doca_sta_event_cqe_notify_get_cqe_notify_type;
    t.doca_sta_event_cqe_notify_get_param_err_location =
        doca_sta_event_cqe_notify_get_param_err_location;
    t.doca_sta_event_cqe_notify_get_qp_handle = doca_sta_event_cqe_notify_get_qp_handle;
    t.doca_sta_event_cqe_notify_get_subsystem_handle =
        doca_sta_event_cqe_notify_get_subsystem_handle;
    t.doca_sta_event_cqe_notify_register_cb = doca_sta_event_cqe_notify_register_cb;
    t.doca_sta_event_eu_err_get_eu_handle = doca_sta_event_eu_err_get_eu_handle;
    t.doca_sta_event_eu_err_is_fatal_error = doca_sta_event_eu_err_is_fatal_error;
    t.doca_sta_event_eu_err_register_cb = doca_sta_event_eu_err_register_cb;
    t.doca_sta_event_transport_err_get_operation = doca_sta_event_transport_err_get_operation;
    t.doca_sta_event_transport_err_get_qp_handle = doca_sta_event_transport_err_get_qp_handle;
    t.doca_sta_event_transport_err_get_syndrome = doca_sta_event_transport_err_get_syndrome;
    t.doca_sta_event_transport_err_get_vendor_syndrome =
        doca_sta_event_transport_err_get_vendor_syndrome;
    t.doca_sta_get_be_queue_mapping_info = doca_sta_get_be_queue_mapping_info;
    t.doca_sta_get_be_queue_stats = doca_sta_get_be_queue_stats;
    t.doca_sta_get_eu_connect_qp_stats = doca_sta_get_eu_connect_qp_stats;
    t.doca_sta_get_eu_handle = doca_sta_get_eu_handle;
    t.doca_sta_get_eu_id = doca_sta_get_eu_id;
    t.doca_sta_get_eu_name = doca_sta_get_eu_name;
    t.doca_sta_get_eu_port = doca_sta_get_eu_port;
    t.doca_sta_get_eu_state = doca_sta_get_eu_state;
    t.doca_sta_get_eu_stats = doca_sta_get_eu_stats;
    t.doca_sta_get_eu_type = doca_sta_get_eu_type;
    t.doca_sta_get_max_be = doca_sta_get_max_be;
    t.doca_sta_get_max_devs = doca_sta_get_max_devs;
    t.doca_sta_get_max_icdoff = doca_sta_get_max_icdoff;
    t.doca_sta_get_max_io_num_per_dev = doca_sta_get_max_io_num_per_dev;
    t.doca_sta_get_max_io_queue_size = doca_sta_get_max_io_queue_size;
    t.doca_sta_get_max_io_size = doca_sta_get_max_io_size;
    t.doca_sta_get_max_io_threads = doca_sta_get_max_io_threads;
    t.doca_sta_get_max_ioccsz = doca_sta_get_max_ioccsz;
    t.doca_sta_get_max_iorcsz = doca_sta_get_max_iorcsz;
    t.doca_sta_get_max_ns_per_subs = doca_sta_get_max_ns_per_subs;
    t.doca_sta_get_max_num_connected_qp_per_eu = doca_sta_get_max_num_connected_qp_per_eu;
    t.doca_sta_get_max_num_eus_available = doca_sta_get_max_num_eus_available;
    t.doca_sta_get_max_qps = doca_sta_get_max_qps;
    t.doca_sta_get_max_qs_per_be = doca_sta_get_max_qs_per_be;
    t.doca_sta_get_max_sta_io = doca_sta_get_max_sta_io;
    t.doca_sta_get_max_subsys = doca_sta_get_max_subsys;
    t.doca_sta_get_min_ioccsz = doca_sta_get_min_ioccsz;
    t.doca_sta_get_min_iorcsz = doca_sta_get_min_iorcsz;
    t.doca_sta_get_ns_stats = doca_sta_get_ns_stats;
    t.doca_sta_io_as_ctx = doca_sta_io_as_ctx;
    t.doca_sta_io_create = doca_sta_io_create;
    t.doca_sta_io_destroy = doca_sta_io_destroy;
    t.doca_sta_io_event_transport_err_register_cb = doca_sta_io_event_transport_err_register_cb;
    t.doca_sta_io_non_offload_register_cb = doca_sta_io_non_offload_register_cb;
    t.doca_sta_io_qp_accept = doca_sta_io_qp_accept;
    t.doca_sta_io_qp_add_subsystem = doca_sta_io_qp_add_subsystem;
    t.doca_sta_io_qp_alloc = doca_sta_io_qp_alloc;
    t.doca_sta_io_qp_connect = doca_sta_io_qp_connect;
    t.doca_sta_io_qp_connect_established = doca_sta_io_qp_connect_established;
    t.doca_sta_io_qp_connect_set_sq_size = doca_sta_io_qp_connect_set_sq_size;
    t.doca_sta_io_qp_destroy = doca_sta_io_qp_destroy;
    t.doca_sta_io_qp_get_group_id = doca_sta_io_qp_get_group_id;
    t.doca_sta_io_qp_get_id = doca_sta_io_qp_get_id;
    t.doca_sta_io_qp_get_index_in_group = doca_sta_io_qp_get_index_in_group;
    t.doca_sta_io_qp_get_port_id = doca_sta_io_qp_get_port_id;
    t.doca_sta_io_qp_get_user_data = doca_sta_io_qp_get_user_data;
    t.doca_sta_io_qp_set_user_data = doca_sta_io_qp_set_user_data;
    t.doca_sta_io_task_disconnect_alloc_init = doca_sta_io_task_disconnect_alloc_init;
    t.doca_sta_io_task_disconnect_set_conf = doca_sta_io_task_disconnect_set_conf;
    t.doca_sta_io_task_non_offload_rdma_read_alloc_init =
        doca_sta_io_task_non_offload_rdma_read_alloc_init;
    t.doca_sta_io_task_non_offload_rdma_send_alloc_init =
        doca_sta_io_task_non_offload_rdma_send_alloc_init;
    t.doca_sta_io_task_non_offload_rdma_write_send_alloc_init =
        doca_sta_io_task_non_offload_rdma_write_send_alloc_init;
    t.doca_sta_io_task_non_offload_set_rdma_read_conf =
        doca_sta_io_task_non_offload_set_rdma_read_conf;
    t.doca_sta_io_task_non_offload_set_rdma_write_send_conf =
        doca_sta_io_task_non_offload_set_rdma_write_send_conf;
    t.doca_sta_is_logical_block_size_supported = doca_sta_is_logical_block_size_supported;
    t.doca_sta_mem_allocator_register = doca_sta_mem_allocator_register;
    t.doca_sta_producer_send_task_as_task = doca_sta_producer_send_task_as_task;
    t.doca_sta_set_max_sta_io = doca_sta_set_max_sta_io;
    t.doca_sta_subsystem_add_dev = doca_sta_subsystem_add_dev;
    t.doca_sta_subsystem_add_ns = doca_sta_subsystem_add_ns;
    t.doca_sta_subsystem_create = doca_sta_subsystem_create;
    t.doca_sta_subsystem_destroy = doca_sta_subsystem_destroy;
    t.doca_sta_subsystem_rm_ns = doca_sta_subsystem_rm_ns;
    t.doca_sta_subsystem_task_rm_ns_alloc_init = doca_sta_subsystem_task_rm_ns_alloc_init;
    t.doca_sta_subsystem_task_rm_ns_set_conf = doca_sta_subsystem_task_rm_ns_set_conf;
}
