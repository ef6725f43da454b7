/* doca_sta_io_non_offload.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_STA_IO_NON_OFFLOAD_H
#define DOCA_DOUBLE_STA_IO_NON_OFFLOAD_H
#ifdef __cplusplus
extern "C" {
#endif
#include <stdbool.h>
#include <stdint.h>
#include <doca_compat.h>
#include <doca_error.h>
#include <doca_types.h>
#include <doca_sta_handle.h>
#include <doca_sta_task.h>
struct doca_sta_io;
/* A capsule the engine did not offload: the 64-byte SQE, the command payload buffer
 * (engine-owned), whether the host data is already in it, and the value that names the
 * command to the response task. */
typedef void (*doca_sta_io_non_offload_cb_t)(struct doca_sta_qp_handle *qp_handle, union doca_data user_data,
					     const uint8_t *nvme_cmd, uint8_t *payload, uint32_t payload_len,
					     bool payload_valid, union doca_data non_offload_user_data);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_non_offload_register_cb(struct doca_sta_io *sta_io, doca_sta_io_non_offload_cb_t non_offload_cb,
								   union doca_data user_data);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_task_non_offload_set_rdma_write_send_conf(struct doca_sta_io *sta_io,
										     doca_sta_task_completion_cb_t task_completion_cb,
										     doca_sta_task_completion_cb_t task_error_cb);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_task_non_offload_set_rdma_read_conf(struct doca_sta_io *sta_io,
									       doca_sta_task_completion_cb_t task_completion_cb,
									       doca_sta_task_completion_cb_t task_error_cb);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_task_non_offload_rdma_write_send_alloc_init(struct doca_sta_io *sta_io, union doca_data user_data,
										       struct doca_sta_qp_handle *qp_handle,
										       doca_sta_nvme_completion_t completion,
										       union doca_data non_offload_user_data,
										       struct doca_sta_producer_task_send **task);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_task_non_offload_rdma_send_alloc_init(struct doca_sta_io *sta_io, union doca_data user_data,
										 struct doca_sta_qp_handle *qp_handle,
										 doca_sta_nvme_completion_t completion,
										 union doca_data non_offload_user_data,
										 struct doca_sta_producer_task_send **task);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_task_non_offload_rdma_read_alloc_init(struct doca_sta_io *sta_io, union doca_data user_data,
										 struct doca_sta_qp_handle *qp_handle,
										 union doca_data non_offload_user_data,
										 struct doca_sta_producer_task_send **task);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_STA_IO_NON_OFFLOAD_H */
