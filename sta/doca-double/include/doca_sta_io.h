/* doca_sta_io.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_STA_IO_H
#define DOCA_DOUBLE_STA_IO_H
#ifdef __cplusplus
extern "C" {
#endif
#include <stdint.h>
#include <doca_compat.h>
#include <doca_error.h>
#include <doca_types.h>
#include <doca_sta_handle.h>
#include <doca_sta_task.h>
struct doca_sta;
struct doca_sta_io;
struct doca_ctx;
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_create(struct doca_sta *sta, struct doca_sta_io **sta_io);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_destroy(struct doca_sta_io *sta_io);
DOCA_EXPERIMENTAL struct doca_ctx *doca_sta_io_as_ctx(struct doca_sta_io *sta_io);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_task_disconnect_set_conf(struct doca_sta_io *sta_io, doca_sta_task_completion_cb_t task_completion_cb,
								    doca_sta_task_completion_cb_t task_error_cb);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_task_disconnect_alloc_init(struct doca_sta_io *sta_io, union doca_data user_data,
								      struct doca_sta_qp_handle *qp_handle,
								      struct doca_sta_producer_task_send **task);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_STA_IO_H */
