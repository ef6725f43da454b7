/* doca_log.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_LOG_H
#define DOCA_DOUBLE_LOG_H

#include <stdint.h>
#include <stdio.h>
#include <doca_error.h>
#ifdef __cplusplus
extern "C" {
#endif
struct doca_log_backend;
enum doca_log_level {
	DOCA_LOG_LEVEL_DISABLE = 10, DOCA_LOG_LEVEL_CRIT = 20, DOCA_LOG_LEVEL_ERROR = 30,
	DOCA_LOG_LEVEL_WARNING = 40, DOCA_LOG_LEVEL_INFO = 50, DOCA_LOG_LEVEL_DEBUG = 60,
	DOCA_LOG_LEVEL_TRACE = 70,
};
doca_error_t doca_log_backend_create_standard(void);
doca_error_t doca_log_backend_create_with_file_sdk(FILE *fptr, struct doca_log_backend **backend);
doca_error_t doca_log_backend_set_sdk_level(struct doca_log_backend *backend, uint32_t level);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_LOG_H */
