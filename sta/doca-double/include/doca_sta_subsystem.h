/* doca_sta_subsystem.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_STA_SUBSYSTEM_H
#define DOCA_DOUBLE_STA_SUBSYSTEM_H
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
struct doca_dev;
DOCA_EXPERIMENTAL doca_error_t doca_sta_subsystem_create(struct doca_sta *sta, const char *nqn, struct doca_sta_subs_handle **subs_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_subsystem_add_dev(struct doca_sta_subs_handle *subs_handle, const struct doca_dev *dev);
DOCA_EXPERIMENTAL doca_error_t doca_sta_subsystem_task_rm_ns_set_conf(struct doca_sta *sta, doca_sta_task_completion_cb_t task_completion_cb,
								      doca_sta_task_completion_cb_t task_error_cb);
DOCA_EXPERIMENTAL doca_error_t doca_sta_subsystem_destroy(struct doca_sta_subs_handle *subs_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_subsystem_add_ns(struct doca_sta_subs_handle *subs_handle, uint32_t fe_ns_id, uint32_t ns_block_size,
							 uint32_t be_ns_id, struct doca_sta_be_handle *be_handle,
							 struct doca_sta_ns_handle **ns_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_subsystem_rm_ns(struct doca_sta_subs_handle *subs_handle, struct doca_sta_ns_handle *ns_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_subsystem_task_rm_ns_alloc_init(struct doca_sta_subs_handle *subs_handle, struct doca_sta_ns_handle *ns_handle,
									union doca_data user_data, struct doca_sta_producer_task_send **task);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_STA_SUBSYSTEM_H */
