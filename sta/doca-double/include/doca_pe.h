/* doca_pe.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_PE_H
#define DOCA_DOUBLE_PE_H

#include <stddef.h>
#include <stdint.h>
#include <doca_error.h>
#include <doca_types.h>
#ifdef __cplusplus
extern "C" {
#endif
struct doca_ctx;
struct doca_pe;
struct doca_task;
doca_error_t doca_pe_create(struct doca_pe **pe);
doca_error_t doca_pe_destroy(struct doca_pe *pe);
doca_error_t doca_pe_connect_ctx(struct doca_pe *pe, struct doca_ctx *ctx);
uint8_t doca_pe_progress(struct doca_pe *pe);
doca_error_t doca_pe_get_num_inflight_tasks(const struct doca_pe *pe, size_t *num_inflight_tasks);
doca_error_t doca_pe_get_notification_handle(const struct doca_pe *pe, doca_notification_handle_t *handle);
doca_error_t doca_pe_request_notification(struct doca_pe *pe);
doca_error_t doca_pe_clear_notification(struct doca_pe *pe, doca_notification_handle_t handle);
doca_error_t doca_task_submit(struct doca_task *task);
doca_error_t doca_task_try_submit(struct doca_task *task);
void doca_task_free(struct doca_task *task);
doca_error_t doca_task_get_status(const struct doca_task *task);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_PE_H */
