/* doca_sta_event.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_STA_EVENT_H
#define DOCA_DOUBLE_STA_EVENT_H
#ifdef __cplusplus
extern "C" {
#endif
#include <stdbool.h>
#include <stdint.h>
#include <doca_compat.h>
#include <doca_error.h>
#include <doca_types.h>
#include <doca_sta_handle.h>
struct doca_sta;
struct doca_sta_io;
struct doca_sta_event_transport_err;
struct doca_sta_event_be_timeout;
struct doca_sta_event_eu_err;
struct doca_sta_event_cqe_notify;
enum doca_sta_cqe_notify_type {
	DOCA_STA_CQE_NOTIF_NVME_OF_VALIDATION_ERR,
	DOCA_STA_CQE_NOTIF_NVME_COMP_ERR,
};
typedef void (*doca_sta_event_transport_err_cb_t)(const struct doca_sta_event_transport_err *event, union doca_data user_data);
typedef void (*doca_sta_event_be_timeout_cb_t)(const struct doca_sta_event_be_timeout *event, union doca_data user_data);
typedef void (*doca_sta_event_eu_err_cb_t)(const struct doca_sta_event_eu_err *event, union doca_data user_data);
typedef void (*doca_sta_event_cqe_notify_cb_t)(const struct doca_sta_event_cqe_notify *event, union doca_data user_data);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_event_transport_err_register_cb(struct doca_sta_io *sta_io, doca_sta_event_transport_err_cb_t event_cb, union doca_data user_data);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_transport_err_get_qp_handle(const struct doca_sta_event_transport_err *event, const struct doca_sta_qp_handle **qp_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_transport_err_get_operation(const struct doca_sta_event_transport_err *event, uint32_t *operation);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_transport_err_get_syndrome(const struct doca_sta_event_transport_err *event, uint32_t *syndrome);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_transport_err_get_vendor_syndrome(const struct doca_sta_event_transport_err *event, uint32_t *vendor_syndrome);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_be_timeout_register_cb(struct doca_sta *sta, doca_sta_event_be_timeout_cb_t event_cb, union doca_data user_data);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_be_timeout_get_be_handle(const struct doca_sta_event_be_timeout *event, const struct doca_sta_be_handle **be_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_be_timeout_get_be_queue_handle(const struct doca_sta_event_be_timeout *event, const struct doca_sta_be_q_handle **be_queue_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_eu_err_register_cb(struct doca_sta *sta, doca_sta_event_eu_err_cb_t event_cb, union doca_data user_data);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_eu_err_is_fatal_error(const struct doca_sta_event_eu_err *event, bool *is_fatal_error);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_eu_err_get_eu_handle(const struct doca_sta_event_eu_err *event, const struct doca_sta_eu_handle **eu_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_cqe_notify_register_cb(struct doca_sta *sta, doca_sta_event_cqe_notify_cb_t event_cb, union doca_data user_data);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_cqe_notify_get_cqe_notify_type(const struct doca_sta_event_cqe_notify *event, enum doca_sta_cqe_notify_type *cqe_error_type);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_cqe_notify_get_cqe(const struct doca_sta_event_cqe_notify *event, doca_sta_nvme_completion_t cqe);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_cqe_notify_get_subsystem_handle(const struct doca_sta_event_cqe_notify *event, const struct doca_sta_subs_handle **subs_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_cqe_notify_get_qp_handle(const struct doca_sta_event_cqe_notify *event, const struct doca_sta_qp_handle **qp_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_cqe_notify_get_capsule_params(const struct doca_sta_event_cqe_notify *event, uint8_t *opcode, uint16_t *cid, uint16_t *nsid, uint64_t *lba);
DOCA_EXPERIMENTAL doca_error_t doca_sta_event_cqe_notify_get_param_err_location(const struct doca_sta_event_cqe_notify *event, uint16_t *pel);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_STA_EVENT_H */
