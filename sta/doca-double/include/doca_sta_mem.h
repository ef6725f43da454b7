/* doca_sta_mem.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_STA_MEM_H
#define DOCA_DOUBLE_STA_MEM_H
#ifdef __cplusplus
extern "C" {
#endif
#include <stddef.h>
#include <stdint.h>
#include <doca_compat.h>
#include <doca_error.h>
struct doca_sta;
/* Zero-filled pinned memory, at least cache-line aligned; the physical address through
 * phys_addr when it is not NULL. */
typedef void *(*doca_sta_zmalloc_cb_t)(size_t size, size_t align, uint64_t *phys_addr);
typedef void (*doca_sta_free_cb_t)(void *buf);
#define DOCA_STA_VTOPHYS_ERROR (0xFFFFFFFFFFFFFFFFULL)
/* Physical address of [buf, buf + size), or DOCA_STA_VTOPHYS_ERROR. */
typedef uint64_t (*doca_sta_vtophys_cb_t)(const void *buf, uint32_t size);
DOCA_EXPERIMENTAL doca_error_t doca_sta_mem_allocator_register(const struct doca_sta *sta, doca_sta_zmalloc_cb_t alloc_cb,
							       doca_sta_free_cb_t free_cb, doca_sta_vtophys_cb_t vtophys_cb);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_STA_MEM_H */
