/* doca_double.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_H
#define DOCA_DOUBLE_H
#ifdef __cplusplus
extern "C" {
#endif
#include <stdint.h>
#include <doca_error.h>
#include <doca_sta_handle.h>
/* The double's own calls (not DOCA API): see sta/doca-double/src/ext.rs. */
struct rdma_cm_id;
struct doca_sta;
const char *doca_double_version(void);
void doca_double_set_contract_mode(int report);
int doca_double_take_violation(char *buf, uint32_t len);
uint64_t doca_double_live_objects(void);
doca_error_t doca_double_loop_create(struct rdma_cm_id **id);
doca_error_t doca_double_loop_destroy(struct rdma_cm_id *id);
doca_error_t doca_double_loop_add_region(struct rdma_cm_id *id, uint32_t rkey, void *addr, uint64_t len);
doca_error_t doca_double_loop_send(struct rdma_cm_id *id, const void *capsule, uint32_t len);
int doca_double_loop_recv(struct rdma_cm_id *id, uint8_t *cqe, uint32_t *inval);
int doca_double_loop_accept_data(struct rdma_cm_id *id, uint8_t *buf, uint32_t len);
doca_error_t doca_double_loop_disconnect(struct rdma_cm_id *id);
int doca_double_loop_connected(struct rdma_cm_id *id);
doca_error_t doca_double_null_drive_stall(struct doca_sta_be_handle *be, int stalled);
doca_error_t doca_double_set_be_timeout_ms(struct doca_sta *sta, uint32_t ms);
/* 1: new QPs get the handle of the QP destroyed last (as a library whose handles are
 * addresses may); 0: handles are never reused (the default). */
void doca_double_reuse_qp_handles(int on);
/* A device BAR window mapped in this process (VFIO mmap) registered without a dma-buf:
 * for kernels that cannot export one; the double rings doorbells there by CPU stores. */
doca_error_t doca_double_mmap_set_bar_memrange(struct doca_mmap *mmap, void *addr, size_t len);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_H */
