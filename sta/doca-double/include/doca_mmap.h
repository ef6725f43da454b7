/* doca_mmap.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_MMAP_H
#define DOCA_DOUBLE_MMAP_H

#include <stddef.h>
#include <stdint.h>
#include <doca_error.h>
#include <doca_types.h>
#ifdef __cplusplus
extern "C" {
#endif
struct doca_dev;
struct doca_mmap;
doca_error_t doca_mmap_create(struct doca_mmap **mmap);
doca_error_t doca_mmap_add_dev(struct doca_mmap *mmap, struct doca_dev *dev);
doca_error_t doca_mmap_set_memrange(struct doca_mmap *mmap, void *addr, size_t len);
doca_error_t doca_mmap_set_dmabuf_memrange(struct doca_mmap *mmap, int dmabuf_fd, void *addr, size_t dmabuf_offset, size_t len);
doca_error_t doca_mmap_set_permissions(struct doca_mmap *mmap, uint32_t access_mask);
doca_error_t doca_mmap_start(struct doca_mmap *mmap);
doca_error_t doca_mmap_stop(struct doca_mmap *mmap);
doca_error_t doca_mmap_destroy(struct doca_mmap *mmap);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_MMAP_H */
