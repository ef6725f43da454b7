//! Every function of the table, with the prototype `shared/doca-sta-api.md` documents
//! (sections 4 and 6, transcribed independently of bindgen's output). The table's field
//! types are bindgen's, so this file compiles only if the bindings have each function
//! with exactly that signature: a missing function or a changed parameter is a build
//! error here. The runtime test checks the table holds these functions and no others.

use std::ffi::{c_char, c_int, c_void};

use doca_sys::*;

#[allow(dead_code, clippy::type_complexity)]
fn documented_prototypes(l: &DocaLib) {
    let _: unsafe extern "C" fn(*const doca_devinfo) -> doca_error_t = l.doca_sta_cap_is_supported;
    let _: unsafe extern "C" fn(*mut doca_dev, *mut *mut doca_sta) -> doca_error_t =
        l.doca_sta_create;
    let _: unsafe extern "C" fn(*mut doca_sta) -> doca_error_t = l.doca_sta_destroy;
    let _: unsafe extern "C" fn(*mut doca_sta, *mut doca_dev) -> doca_error_t = l.doca_sta_add_dev;
    let _: unsafe extern "C" fn(*mut doca_sta, u16) -> doca_error_t = l.doca_sta_set_max_sta_io;
    let _: unsafe extern "C" fn(*const doca_sta, *mut u16) -> doca_error_t =
        l.doca_sta_get_max_sta_io;
    let _: unsafe extern "C" fn(*mut doca_sta) -> *mut doca_ctx = l.doca_sta_as_ctx;
    let _: unsafe extern "C" fn(*mut u32) -> doca_error_t = l.doca_sta_get_max_devs;
    let _: unsafe extern "C" fn(*const doca_sta, *mut u32) -> doca_error_t =
        l.doca_sta_get_max_num_eus_available;
    let _: unsafe extern "C" fn(*const doca_sta, *mut u32) -> doca_error_t =
        l.doca_sta_get_max_num_connected_qp_per_eu;
    let _: unsafe extern "C" fn(*mut u32) -> doca_error_t = l.doca_sta_get_max_subsys;
    let _: unsafe extern "C" fn(*mut u32) -> doca_error_t = l.doca_sta_get_max_ns_per_subs;
    let _: unsafe extern "C" fn(*mut u32) -> doca_error_t = l.doca_sta_get_max_qps;
    let _: unsafe extern "C" fn(*mut u32) -> doca_error_t = l.doca_sta_get_max_io_threads;
    let _: unsafe extern "C" fn(*mut u32) -> doca_error_t = l.doca_sta_get_max_io_size;
    let _: unsafe extern "C" fn(*const doca_sta, *mut u32) -> doca_error_t =
        l.doca_sta_get_max_io_num_per_dev;
    let _: unsafe extern "C" fn(*const doca_sta, *mut u32) -> doca_error_t =
        l.doca_sta_get_max_io_queue_size;
    let _: unsafe extern "C" fn(*mut u32) -> doca_error_t = l.doca_sta_get_min_ioccsz;
    let _: unsafe extern "C" fn(*mut u32) -> doca_error_t = l.doca_sta_get_max_ioccsz;
    let _: unsafe extern "C" fn(*mut u32) -> doca_error_t = l.doca_sta_get_min_iorcsz;
    let _: unsafe extern "C" fn(*mut u32) -> doca_error_t = l.doca_sta_get_max_iorcsz;
    let _: unsafe extern "C" fn(*mut u32) -> doca_error_t = l.doca_sta_get_max_icdoff;
    let _: unsafe extern "C" fn(*mut u32) -> doca_error_t = l.doca_sta_get_max_be;
    let _: unsafe extern "C" fn(*mut u32) -> doca_error_t = l.doca_sta_get_max_qs_per_be;
    let _: unsafe extern "C" fn(u32) -> bool = l.doca_sta_is_logical_block_size_supported;
    let _: unsafe extern "C" fn(*mut doca_sta_producer_task_send) -> *mut doca_task =
        l.doca_sta_producer_send_task_as_task;
    let _: unsafe extern "C" fn(
        *const doca_sta,
        doca_sta_zmalloc_cb_t,
        doca_sta_free_cb_t,
        doca_sta_vtophys_cb_t,
    ) -> doca_error_t = l.doca_sta_mem_allocator_register;
    let _: unsafe extern "C" fn(
        *mut doca_sta_io,
        doca_sta_event_transport_err_cb_t,
        doca_data,
    ) -> doca_error_t = l.doca_sta_io_event_transport_err_register_cb;
    let _: unsafe extern "C" fn(
        *const doca_sta_event_transport_err,
        *mut *const doca_sta_qp_handle,
    ) -> doca_error_t = l.doca_sta_event_transport_err_get_qp_handle;
    let _: unsafe extern "C" fn(*const doca_sta_event_transport_err, *mut u32) -> doca_error_t =
        l.doca_sta_event_transport_err_get_operation;
    let _: unsafe extern "C" fn(*const doca_sta_event_transport_err, *mut u32) -> doca_error_t =
        l.doca_sta_event_transport_err_get_syndrome;
    let _: unsafe extern "C" fn(*const doca_sta_event_transport_err, *mut u32) -> doca_error_t =
        l.doca_sta_event_transport_err_get_vendor_syndrome;
    let _: unsafe extern "C" fn(
        *mut doca_sta,
        doca_sta_event_be_timeout_cb_t,
        doca_data,
    ) -> doca_error_t = l.doca_sta_event_be_timeout_register_cb;
    let _: unsafe extern "C" fn(
        *const doca_sta_event_be_timeout,
        *mut *const doca_sta_be_handle,
    ) -> doca_error_t = l.doca_sta_event_be_timeout_get_be_handle;
    let _: unsafe extern "C" fn(
        *const doca_sta_event_be_timeout,
        *mut *const doca_sta_be_q_handle,
    ) -> doca_error_t = l.doca_sta_event_be_timeout_get_be_queue_handle;
    let _: unsafe extern "C" fn(
        *mut doca_sta,
        doca_sta_event_eu_err_cb_t,
        doca_data,
    ) -> doca_error_t = l.doca_sta_event_eu_err_register_cb;
    let _: unsafe extern "C" fn(*const doca_sta_event_eu_err, *mut bool) -> doca_error_t =
        l.doca_sta_event_eu_err_is_fatal_error;
    let _: unsafe extern "C" fn(
        *const doca_sta_event_eu_err,
        *mut *const doca_sta_eu_handle,
    ) -> doca_error_t = l.doca_sta_event_eu_err_get_eu_handle;
    let _: unsafe extern "C" fn(
        *mut doca_sta,
        doca_sta_event_cqe_notify_cb_t,
        doca_data,
    ) -> doca_error_t = l.doca_sta_event_cqe_notify_register_cb;
    let _: unsafe extern "C" fn(
        *const doca_sta_event_cqe_notify,
        *mut doca_sta_cqe_notify_type,
    ) -> doca_error_t = l.doca_sta_event_cqe_notify_get_cqe_notify_type;
    let _: unsafe extern "C" fn(*const doca_sta_event_cqe_notify, *mut u8) -> doca_error_t =
        l.doca_sta_event_cqe_notify_get_cqe;
    let _: unsafe extern "C" fn(
        *const doca_sta_event_cqe_notify,
        *mut *const doca_sta_subs_handle,
    ) -> doca_error_t = l.doca_sta_event_cqe_notify_get_subsystem_handle;
    let _: unsafe extern "C" fn(
        *const doca_sta_event_cqe_notify,
        *mut *const doca_sta_qp_handle,
    ) -> doca_error_t = l.doca_sta_event_cqe_notify_get_qp_handle;
    let _: unsafe extern "C" fn(
        *const doca_sta_event_cqe_notify,
        *mut u8,
        *mut u16,
        *mut u16,
        *mut u64,
    ) -> doca_error_t = l.doca_sta_event_cqe_notify_get_capsule_params;
    let _: unsafe extern "C" fn(*const doca_sta_event_cqe_notify, *mut u16) -> doca_error_t =
        l.doca_sta_event_cqe_notify_get_param_err_location;
    let _: unsafe extern "C" fn(*mut doca_sta, *mut *mut doca_sta_be_handle) -> doca_error_t =
        l.doca_sta_be_create;
    let _: unsafe extern "C" fn(*mut doca_sta_be_handle) -> doca_error_t = l.doca_sta_be_destroy;
    let _: unsafe extern "C" fn(
        *mut doca_sta_be_handle,
        *mut doca_mmap,
        *mut doca_mmap,
        u16,
        *mut doca_mmap,
        *mut doca_mmap,
        u16,
        *mut *mut doca_sta_be_q_handle,
    ) -> doca_error_t = l.doca_sta_be_add_queue;
    let _: unsafe extern "C" fn(
        *mut doca_sta,
        doca_sta_task_completion_cb_t,
        doca_sta_task_completion_cb_t,
    ) -> doca_error_t = l.doca_sta_be_task_destroy_queue_set_conf;
    let _: unsafe extern "C" fn(
        *mut doca_sta_be_q_handle,
        doca_data,
        *mut *mut doca_sta_producer_task_send,
    ) -> doca_error_t = l.doca_sta_be_destroy_queue_task_alloc_init;
    let _: unsafe extern "C" fn(
        *const doca_sta_be_q_handle,
        *mut *const doca_sta_eu_ctr_entry,
        *mut u16,
    ) -> doca_error_t = l.doca_sta_get_be_queue_mapping_info;
    let _: unsafe extern "C" fn(
        *mut doca_sta,
        *const c_char,
        *mut *mut doca_sta_subs_handle,
    ) -> doca_error_t = l.doca_sta_subsystem_create;
    let _: unsafe extern "C" fn(*mut doca_sta_subs_handle, *const doca_dev) -> doca_error_t =
        l.doca_sta_subsystem_add_dev;
    let _: unsafe extern "C" fn(
        *mut doca_sta,
        doca_sta_task_completion_cb_t,
        doca_sta_task_completion_cb_t,
    ) -> doca_error_t = l.doca_sta_subsystem_task_rm_ns_set_conf;
    let _: unsafe extern "C" fn(*mut doca_sta_subs_handle) -> doca_error_t =
        l.doca_sta_subsystem_destroy;
    let _: unsafe extern "C" fn(
        *mut doca_sta_subs_handle,
        u32,
        u32,
        u32,
        *mut doca_sta_be_handle,
        *mut *mut doca_sta_ns_handle,
    ) -> doca_error_t = l.doca_sta_subsystem_add_ns;
    let _: unsafe extern "C" fn(
        *mut doca_sta_subs_handle,
        *mut doca_sta_ns_handle,
    ) -> doca_error_t = l.doca_sta_subsystem_rm_ns;
    let _: unsafe extern "C" fn(
        *mut doca_sta_subs_handle,
        *mut doca_sta_ns_handle,
        doca_data,
        *mut *mut doca_sta_producer_task_send,
    ) -> doca_error_t = l.doca_sta_subsystem_task_rm_ns_alloc_init;
    let _: unsafe extern "C" fn(*mut doca_sta, *mut *mut doca_sta_io) -> doca_error_t =
        l.doca_sta_io_create;
    let _: unsafe extern "C" fn(*mut doca_sta_io) -> doca_error_t = l.doca_sta_io_destroy;
    let _: unsafe extern "C" fn(*mut doca_sta_io) -> *mut doca_ctx = l.doca_sta_io_as_ctx;
    let _: unsafe extern "C" fn(
        *mut doca_sta_io,
        doca_sta_task_completion_cb_t,
        doca_sta_task_completion_cb_t,
    ) -> doca_error_t = l.doca_sta_io_task_disconnect_set_conf;
    let _: unsafe extern "C" fn(
        *mut doca_sta_io,
        doca_data,
        *mut doca_sta_qp_handle,
        *mut *mut doca_sta_producer_task_send,
    ) -> doca_error_t = l.doca_sta_io_task_disconnect_alloc_init;
    let _: unsafe extern "C" fn(
        *mut doca_sta_io,
        *const doca_dev,
        *mut *mut doca_sta_qp_handle,
    ) -> doca_error_t = l.doca_sta_io_qp_alloc;
    let _: unsafe extern "C" fn(
        *mut doca_sta_io,
        *mut doca_sta_qp_handle,
        *const doca_dev,
        *mut rdma_cm_id,
        *const c_void,
        u32,
        *mut doca_sta_subs_handle,
    ) -> doca_error_t = l.doca_sta_io_qp_accept;
    let _: unsafe extern "C" fn(
        *mut doca_sta_io,
        *const doca_dev,
        *mut rdma_cm_id,
        *const c_void,
        u32,
        *mut doca_sta_subs_handle,
        *mut *mut doca_sta_qp_handle,
    ) -> doca_error_t = l.doca_sta_io_qp_connect;
    let _: unsafe extern "C" fn(
        *mut doca_sta_io,
        *mut doca_sta_qp_handle,
        doca_data,
    ) -> doca_error_t = l.doca_sta_io_qp_set_user_data;
    let _: unsafe extern "C" fn(*const doca_sta_qp_handle, *mut doca_data) -> doca_error_t =
        l.doca_sta_io_qp_get_user_data;
    let _: unsafe extern "C" fn(*mut doca_sta_io, *mut doca_sta_qp_handle, u16) -> doca_error_t =
        l.doca_sta_io_qp_connect_set_sq_size;
    let _: unsafe extern "C" fn(*mut doca_sta_io, *mut doca_sta_qp_handle) -> doca_error_t =
        l.doca_sta_io_qp_connect_established;
    let _: unsafe extern "C" fn(*mut doca_sta_io, *mut doca_sta_qp_handle) -> doca_error_t =
        l.doca_sta_io_qp_destroy;
    let _: unsafe extern "C" fn(
        *mut doca_sta_io,
        *const doca_sta_subs_handle,
        *mut doca_sta_qp_handle,
    ) -> doca_error_t = l.doca_sta_io_qp_add_subsystem;
    let _: unsafe extern "C" fn(*mut doca_sta_qp_handle, *mut u32) -> doca_error_t =
        l.doca_sta_io_qp_get_id;
    let _: unsafe extern "C" fn(*mut doca_sta_qp_handle, *mut u16) -> doca_error_t =
        l.doca_sta_io_qp_get_port_id;
    let _: unsafe extern "C" fn(*mut doca_sta_qp_handle, *mut u16) -> doca_error_t =
        l.doca_sta_io_qp_get_group_id;
    let _: unsafe extern "C" fn(*mut doca_sta_qp_handle, *mut u16) -> doca_error_t =
        l.doca_sta_io_qp_get_index_in_group;
    let _: unsafe extern "C" fn(
        *mut doca_sta_io,
        doca_sta_io_non_offload_cb_t,
        doca_data,
    ) -> doca_error_t = l.doca_sta_io_non_offload_register_cb;
    let _: unsafe extern "C" fn(
        *mut doca_sta_io,
        doca_sta_task_completion_cb_t,
        doca_sta_task_completion_cb_t,
    ) -> doca_error_t = l.doca_sta_io_task_non_offload_set_rdma_write_send_conf;
    let _: unsafe extern "C" fn(
        *mut doca_sta_io,
        doca_sta_task_completion_cb_t,
        doca_sta_task_completion_cb_t,
    ) -> doca_error_t = l.doca_sta_io_task_non_offload_set_rdma_read_conf;
    let _: unsafe extern "C" fn(
        *mut doca_sta_io,
        doca_data,
        *mut doca_sta_qp_handle,
        *mut u8,
        doca_data,
        *mut *mut doca_sta_producer_task_send,
    ) -> doca_error_t = l.doca_sta_io_task_non_offload_rdma_write_send_alloc_init;
    let _: unsafe extern "C" fn(
        *mut doca_sta_io,
        doca_data,
        *mut doca_sta_qp_handle,
        *mut u8,
        doca_data,
        *mut *mut doca_sta_producer_task_send,
    ) -> doca_error_t = l.doca_sta_io_task_non_offload_rdma_send_alloc_init;
    let _: unsafe extern "C" fn(
        *mut doca_sta_io,
        doca_data,
        *mut doca_sta_qp_handle,
        doca_data,
        *mut *mut doca_sta_producer_task_send,
    ) -> doca_error_t = l.doca_sta_io_task_non_offload_rdma_read_alloc_init;
    let _: unsafe extern "C" fn(
        *const doca_sta,
        *mut *mut doca_sta_eu_handle,
        *mut u32,
    ) -> doca_error_t = l.doca_sta_get_eu_handle;
    let _: unsafe extern "C" fn(*const doca_sta_eu_handle, *mut *const c_char) -> doca_error_t =
        l.doca_sta_get_eu_name;
    let _: unsafe extern "C" fn(*const doca_sta_eu_handle, *mut dpa_sta_eu_type) -> doca_error_t =
        l.doca_sta_get_eu_type;
    let _: unsafe extern "C" fn(*const doca_sta_eu_handle, *mut u16) -> doca_error_t =
        l.doca_sta_get_eu_id;
    let _: unsafe extern "C" fn(*const doca_sta_eu_handle, *mut u16) -> doca_error_t =
        l.doca_sta_get_eu_port;
    let _: unsafe extern "C" fn(*mut doca_sta_eu_handle, *mut dpa_sta_eu_state) -> doca_error_t =
        l.doca_sta_get_eu_state;
    let _: unsafe extern "C" fn(
        *mut doca_sta_eu_handle,
        *mut *const doca_sta_eu_ctr_entry,
        *mut u16,
    ) -> doca_error_t = l.doca_sta_get_eu_stats;
    let _: unsafe extern "C" fn(*mut doca_sta_eu_handle) -> doca_error_t =
        l.doca_sta_eu_reset_stats_handle;
    let _: unsafe extern "C" fn(*mut doca_sta, dpa_sta_eu_type) -> doca_error_t =
        l.doca_sta_eu_reset_stats_type;
    let _: unsafe extern "C" fn(
        *mut doca_sta_eu_handle,
        *mut *mut doca_sta_qp_handle,
        *mut u16,
    ) -> doca_error_t = l.doca_sta_get_eu_connect_qp_stats;
    let _: unsafe extern "C" fn(
        *mut doca_sta_be_handle,
        *mut doca_sta_be_q_handle,
        *mut *const doca_sta_eu_ctr_entry,
        *mut u16,
    ) -> doca_error_t = l.doca_sta_get_be_queue_stats;
    let _: unsafe extern "C" fn(
        *mut doca_sta_subs_handle,
        *mut doca_sta_ns_handle,
        *mut *const doca_sta_eu_ctr_entry,
        *mut u16,
    ) -> doca_error_t = l.doca_sta_get_ns_stats;
    let _: unsafe extern "C" fn(doca_error_t) -> *const c_char = l.doca_error_get_name;
    let _: unsafe extern "C" fn(doca_error_t) -> *const c_char = l.doca_error_get_descr;
    let _: unsafe extern "C" fn(*mut *mut *mut doca_devinfo, *mut u32) -> doca_error_t =
        l.doca_devinfo_create_list;
    let _: unsafe extern "C" fn(*mut *mut doca_devinfo) -> doca_error_t =
        l.doca_devinfo_destroy_list;
    let _: unsafe extern "C" fn(*const doca_devinfo, *mut c_char, u32) -> doca_error_t =
        l.doca_devinfo_get_ibdev_name;
    let _: unsafe extern "C" fn(*const doca_devinfo, *mut c_char, u32) -> doca_error_t =
        l.doca_devinfo_get_iface_name;
    let _: unsafe extern "C" fn(*const doca_devinfo, *mut c_char) -> doca_error_t =
        l.doca_devinfo_get_pci_addr_str;
    let _: unsafe extern "C" fn(*mut doca_devinfo, *mut *mut doca_dev) -> doca_error_t =
        l.doca_dev_open;
    let _: unsafe extern "C" fn(*mut doca_dev) -> doca_error_t = l.doca_dev_close;
    let _: unsafe extern "C" fn(*const doca_dev) -> *mut doca_devinfo = l.doca_dev_as_devinfo;
    let _: unsafe extern "C" fn(*mut *mut doca_pe) -> doca_error_t = l.doca_pe_create;
    let _: unsafe extern "C" fn(*mut doca_pe) -> doca_error_t = l.doca_pe_destroy;
    let _: unsafe extern "C" fn(*mut doca_pe, *mut doca_ctx) -> doca_error_t =
        l.doca_pe_connect_ctx;
    let _: unsafe extern "C" fn(*mut doca_pe) -> u8 = l.doca_pe_progress;
    let _: unsafe extern "C" fn(*const doca_pe, *mut usize) -> doca_error_t =
        l.doca_pe_get_num_inflight_tasks;
    let _: unsafe extern "C" fn(*const doca_pe, *mut doca_notification_handle_t) -> doca_error_t =
        l.doca_pe_get_notification_handle;
    let _: unsafe extern "C" fn(*mut doca_pe) -> doca_error_t = l.doca_pe_request_notification;
    let _: unsafe extern "C" fn(*mut doca_pe, doca_notification_handle_t) -> doca_error_t =
        l.doca_pe_clear_notification;
    let _: unsafe extern "C" fn(*mut doca_task) -> doca_error_t = l.doca_task_submit;
    let _: unsafe extern "C" fn(*mut doca_task) -> doca_error_t = l.doca_task_try_submit;
    let _: unsafe extern "C" fn(*mut doca_task) = l.doca_task_free;
    let _: unsafe extern "C" fn(*const doca_task) -> doca_error_t = l.doca_task_get_status;
    let _: unsafe extern "C" fn(*mut doca_ctx) -> doca_error_t = l.doca_ctx_start;
    let _: unsafe extern "C" fn(*mut doca_ctx) -> doca_error_t = l.doca_ctx_stop;
    let _: unsafe extern "C" fn(*const doca_ctx, *mut doca_ctx_states) -> doca_error_t =
        l.doca_ctx_get_state;
    let _: unsafe extern "C" fn(*mut doca_ctx, doca_ctx_state_changed_callback_t) -> doca_error_t =
        l.doca_ctx_set_state_changed_cb;
    let _: unsafe extern "C" fn(*mut doca_ctx, doca_data) -> doca_error_t =
        l.doca_ctx_set_user_data;
    let _: unsafe extern "C" fn(*const doca_ctx, *mut doca_data) -> doca_error_t =
        l.doca_ctx_get_user_data;
    let _: unsafe extern "C" fn(*const doca_ctx, *mut usize) -> doca_error_t =
        l.doca_ctx_get_num_inflight_tasks;
    let _: unsafe extern "C" fn(*mut *mut doca_mmap) -> doca_error_t = l.doca_mmap_create;
    let _: unsafe extern "C" fn(*mut doca_mmap, *mut doca_dev) -> doca_error_t =
        l.doca_mmap_add_dev;
    let _: unsafe extern "C" fn(*mut doca_mmap, *mut c_void, usize) -> doca_error_t =
        l.doca_mmap_set_memrange;
    let _: unsafe extern "C" fn(*mut doca_mmap, c_int, *mut c_void, usize, usize) -> doca_error_t =
        l.doca_mmap_set_dmabuf_memrange;
    let _: unsafe extern "C" fn(*mut doca_mmap, u32) -> doca_error_t = l.doca_mmap_set_permissions;
    let _: unsafe extern "C" fn(*mut doca_mmap) -> doca_error_t = l.doca_mmap_start;
    let _: unsafe extern "C" fn(*mut doca_mmap) -> doca_error_t = l.doca_mmap_stop;
    let _: unsafe extern "C" fn(*mut doca_mmap) -> doca_error_t = l.doca_mmap_destroy;
    let _: unsafe extern "C" fn() -> doca_error_t = l.doca_log_backend_create_standard;
    let _: unsafe extern "C" fn(*mut FILE, *mut *mut doca_log_backend) -> doca_error_t =
        l.doca_log_backend_create_with_file_sdk;
    let _: unsafe extern "C" fn(*mut doca_log_backend, u32) -> doca_error_t =
        l.doca_log_backend_set_sdk_level;
}

/// The documented function names, in the order above.
const DOCUMENTED: &str = include_str!("signatures.rs");

#[test]
fn table_holds_exactly_the_documented_functions() {
    let documented: std::collections::BTreeSet<&str> = DOCUMENTED
        .split(';')
        .filter_map(|stmt| stmt.split_whitespace().last()?.strip_prefix("l."))
        .filter(|n| n.starts_with("doca_"))
        .collect();
    let table: std::collections::BTreeSet<&str> = include_str!("../src/bindings.rs")
        .split("pub struct DocaLib {")
        .nth(1)
        .and_then(|s| s.split("\n}").next())
        .expect("DocaLib in bindings.rs")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub ")?.split(':').next())
        .collect();
    assert_eq!(
        documented.len(),
        134,
        "94 STA + 40 Core functions documented"
    );
    assert_eq!(
        documented
            .iter()
            .filter(|n| n.starts_with("doca_sta_"))
            .count(),
        94
    );
    assert_eq!(table, documented);
    let _ = documented_prototypes;
    let _: *const c_void = std::ptr::null();
}
