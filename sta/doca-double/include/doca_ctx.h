/* doca_ctx.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_CTX_H
#define DOCA_DOUBLE_CTX_H

#include <stddef.h>
#include <doca_error.h>
#include <doca_types.h>
#ifdef __cplusplus
extern "C" {
#endif
struct doca_ctx;
enum doca_ctx_states {
	DOCA_CTX_STATE_IDLE = 0,
	DOCA_CTX_STATE_STARTING = 1,
	DOCA_CTX_STATE_RUNNING = 2,
	DOCA_CTX_STATE_STOPPING = 3,
};
typedef void (*doca_ctx_state_changed_callback_t)(const union doca_data user_data, struct doca_ctx *ctx,
						  enum doca_ctx_states prev_state, enum doca_ctx_states next_state);
doca_error_t doca_ctx_start(struct doca_ctx *ctx);
doca_error_t doca_ctx_stop(struct doca_ctx *ctx);
doca_error_t doca_ctx_get_state(const struct doca_ctx *ctx, enum doca_ctx_states *state);
doca_error_t doca_ctx_set_state_changed_cb(struct doca_ctx *ctx, doca_ctx_state_changed_callback_t cb);
doca_error_t doca_ctx_set_user_data(struct doca_ctx *ctx, union doca_data user_data);
doca_error_t doca_ctx_get_user_data(const struct doca_ctx *ctx, union doca_data *user_data);
doca_error_t doca_ctx_get_num_inflight_tasks(const struct doca_ctx *ctx, size_t *num_inflight_tasks);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_CTX_H */
