/* doca_sta_io_qp.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_STA_IO_QP_H
#define DOCA_DOUBLE_STA_IO_QP_H
#ifdef __cplusplus
extern "C" {
#endif
#include <stdint.h>
#include <doca_compat.h>
#include <doca_error.h>
#include <doca_types.h>
#include <doca_sta_handle.h>
struct rdma_cm_id;
struct doca_dev;
struct doca_sta_io;
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_qp_alloc(struct doca_sta_io *sta_io, const struct doca_dev *dev, struct doca_sta_qp_handle **qp_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_qp_accept(struct doca_sta_io *sta_io, struct doca_sta_qp_handle *qp_handle, const struct doca_dev *dev,
						     struct rdma_cm_id *cm_id, const void *priv_data, uint32_t priv_size,
						     struct doca_sta_subs_handle *subs_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_qp_connect(struct doca_sta_io *sta_io, const struct doca_dev *dev, struct rdma_cm_id *cm_id,
						      const void *priv_data, uint32_t priv_size, struct doca_sta_subs_handle *subs_handle,
						      struct doca_sta_qp_handle **qp_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_qp_set_user_data(struct doca_sta_io *sta_io, struct doca_sta_qp_handle *qp_handle, union doca_data user_data);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_qp_get_user_data(const struct doca_sta_qp_handle *qp_handle, union doca_data *user_data);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_qp_connect_set_sq_size(struct doca_sta_io *sta_io, struct doca_sta_qp_handle *qp_handle, uint16_t sq_size);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_qp_connect_established(struct doca_sta_io *sta_io, struct doca_sta_qp_handle *qp_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_qp_destroy(struct doca_sta_io *sta_io, struct doca_sta_qp_handle *qp_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_qp_add_subsystem(struct doca_sta_io *sta_io, const struct doca_sta_subs_handle *subs_handle,
							    struct doca_sta_qp_handle *qp_handle);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_qp_get_id(struct doca_sta_qp_handle *qp_handle, uint32_t *qp_id);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_qp_get_port_id(struct doca_sta_qp_handle *qp_handle, uint16_t *port_id);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_qp_get_group_id(struct doca_sta_qp_handle *qp_handle, uint16_t *group_id);
DOCA_EXPERIMENTAL doca_error_t doca_sta_io_qp_get_index_in_group(struct doca_sta_qp_handle *qp_handle, uint16_t *qp_idx);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_STA_IO_QP_H */
