/* doca_dev.h — part of the doca-double headers (nvmf-target, sta/doca-double/include).
 * Written from the prototypes in shared/doca-sta-api.md so that programs written for the
 * DOCA 3.3 STA API compile against the test double; not NVIDIA's header. */
#ifndef DOCA_DOUBLE_DEV_H
#define DOCA_DOUBLE_DEV_H

#include <stdint.h>
#include <doca_error.h>
#ifdef __cplusplus
extern "C" {
#endif
#define DOCA_DEVINFO_IFACE_NAME_SIZE 256
#define DOCA_DEVINFO_IBDEV_NAME_SIZE 64
#define DOCA_DEVINFO_PCI_ADDR_SIZE 13
struct doca_devinfo;
struct doca_dev;
doca_error_t doca_devinfo_create_list(struct doca_devinfo ***dev_list, uint32_t *nb_devs);
doca_error_t doca_devinfo_destroy_list(struct doca_devinfo **dev_list);
doca_error_t doca_devinfo_get_ibdev_name(const struct doca_devinfo *devinfo, char *ibdev_name, uint32_t size);
doca_error_t doca_devinfo_get_iface_name(const struct doca_devinfo *devinfo, char *iface_name, uint32_t size);
doca_error_t doca_devinfo_get_pci_addr_str(const struct doca_devinfo *devinfo, char *pci_addr_str);
doca_error_t doca_dev_open(struct doca_devinfo *devinfo, struct doca_dev **dev);
doca_error_t doca_dev_close(struct doca_dev *dev);
struct doca_devinfo *doca_dev_as_devinfo(const struct doca_dev *dev);
#ifdef __cplusplus
}
#endif
#endif /* DOCA_DOUBLE_DEV_H */
