/* doca_sta_handle.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_STA_HANDLE_H
#define DOCA_DOUBLE_STA_HANDLE_H
#ifdef __cplusplus
extern "C" {
#endif
#include <stdint.h>
#define DOCA_STA_COMPLETION_SIZE (16)
/* One 16-byte NVMe completion queue entry. */
typedef uint8_t doca_sta_nvme_completion_t[DOCA_STA_COMPLETION_SIZE];
struct doca_sta_qp_handle;
struct doca_sta_subs_handle;
struct doca_sta_ns_handle;
struct doca_sta_eu_handle;
struct doca_sta_be_handle;
struct doca_sta_be_q_handle;
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_STA_HANDLE_H */
