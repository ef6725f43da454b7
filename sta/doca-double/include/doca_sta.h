/* doca_sta.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_STA_H
#define DOCA_DOUBLE_STA_H
#ifdef __cplusplus
extern "C" {
#endif
#include <stdbool.h>
#include <stdint.h>
#include <doca_compat.h>
#include <doca_error.h>
struct doca_devinfo;
struct doca_dev;
struct doca_ctx;
struct doca_sta;
DOCA_EXPERIMENTAL doca_error_t doca_sta_cap_is_supported(const struct doca_devinfo *devinfo);
DOCA_EXPERIMENTAL doca_error_t doca_sta_create(struct doca_dev *dev, struct doca_sta **sta);
DOCA_EXPERIMENTAL doca_error_t doca_sta_destroy(struct doca_sta *sta);
DOCA_EXPERIMENTAL doca_error_t doca_sta_add_dev(struct doca_sta *sta, struct doca_dev *dev);
DOCA_EXPERIMENTAL doca_error_t doca_sta_set_max_sta_io(struct doca_sta *sta, uint16_t max_io_num);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_sta_io(const struct doca_sta *sta, uint16_t *max_io_num);
DOCA_EXPERIMENTAL struct doca_ctx *doca_sta_as_ctx(struct doca_sta *sta);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_devs(uint32_t *max_devs);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_num_eus_available(const struct doca_sta *sta, uint32_t *max_eus);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_num_connected_qp_per_eu(const struct doca_sta *sta, uint32_t *max_connected_qps);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_subsys(uint32_t *max_subsys);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_ns_per_subs(uint32_t *max_ns_per_subsys);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_qps(uint32_t *max_qps);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_io_threads(uint32_t *max_io_threads);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_io_size(uint32_t *max_io_size);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_io_num_per_dev(const struct doca_sta *sta, uint32_t *max_ios);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_io_queue_size(const struct doca_sta *sta, uint32_t *max_io_queue_size);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_min_ioccsz(uint32_t *ioccsz);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_ioccsz(uint32_t *ioccsz);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_min_iorcsz(uint32_t *iorcsz);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_iorcsz(uint32_t *iorcsz);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_icdoff(uint32_t *icdoff);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_be(uint32_t *max_be);
DOCA_EXPERIMENTAL doca_error_t doca_sta_get_max_qs_per_be(uint32_t *max_qs_per_be);
DOCA_EXPERIMENTAL bool doca_sta_is_logical_block_size_supported(uint32_t block_size);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_STA_H */
