/* doca_sta_be.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_STA_BE_H
#define DOCA_DOUBLE_STA_BE_H
#ifdef __cplusplus
extern "C" {
#endif
#include <stdint.h>
#include <doca_compat.h>
#include <doca_error.h>
#include <doca_types.h>
#include <doca_mmap.h>
#include <doca_sta_handle.h>
#include <doca_sta_task.h>
#include <doca_sta_stats.h>
struct doca_sta;
DOCA_EXPERIMENTAL doca_error_t doca_sta_be_create(struct doca_sta *sta, struct doca_sta_be_handle **be_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_be_destroy(struct doca_sta_be_handle *be_handle);
/* One NVMe I/O SQ/CQ pair: rings and doorbells given as (mmap, byte offset). */
DOCA_EXPERIMENTAL doca_error_t doca_sta_be_add_queue(struct doca_sta_be_handle *be_handle, struct doca_mmap *sq,
						     struct doca_mmap *sq_db_reg, uint16_t sq_db_offset, struct doca_mmap *cq,
						     struct doca_mmap *cq_db_reg, uint16_t cq_db_offset,
						     struct doca_sta_be_q_handle **be_q_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_be_task_destroy_queue_set_conf(struct doca_sta *sta, doca_sta_task_completion_cb_t task_completion_cb,
								       doca_sta_task_completion_cb_t task_error_cb);
DOCA_EXPERIMENTAL doca_error_t doca_sta_be_destroy_queue_task_alloc_init(struct doca_sta_be_q_handle *be_q_handle, union doca_data user_data,
									 struct doca_sta_producer_task_send **task);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_be_queue_mapping_info(const struct doca_sta_be_q_handle *be_q_handle,
								  const struct doca_sta_eu_ctr_entry **entries, uint16_t *num_entries);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_STA_BE_H */
