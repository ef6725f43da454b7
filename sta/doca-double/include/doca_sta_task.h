/* doca_sta_task.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_STA_TASK_H
#define DOCA_DOUBLE_STA_TASK_H
#ifdef __cplusplus
extern "C" {
#endif
#include <stdint.h>
#include <doca_compat.h>
#include <doca_error.h>
#include <doca_types.h>
struct doca_task;
struct doca_sta_producer_task_send;
/* Completion and error callback of every STA task. */
typedef void (*doca_sta_task_completion_cb_t)(struct doca_sta_producer_task_send *task, union doca_data task_user_data);
DOCA_EXPERIMENTAL struct doca_task *doca_sta_producer_send_task_as_task(struct doca_sta_producer_task_send *task);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_STA_TASK_H */
