/*
 * Input of bindgen for doca-sys: the DOCA Core headers the STA flow needs, then the
 * eleven DOCA STA headers (DOCA 3.3). doca_types.h comes first so that `union doca_data`
 * is complete where doca_sta_io_qp.h only forward-declares it and takes it by value.
 * <stdio.h> for the FILE * of doca_log_backend_create_with_file_sdk().
 */
#include <stdio.h>
#include <doca_types.h>
#include <doca_error.h>
#include <doca_dev.h>
#include <doca_ctx.h>
#include <doca_pe.h>
#include <doca_mmap.h>
#include <doca_log.h>
#include <doca_sta.h>
#include <doca_sta_handle.h>
#include <doca_sta_task.h>
#include <doca_sta_mem.h>
#include <doca_sta_event.h>
#include <doca_sta_be.h>
#include <doca_sta_subsystem.h>
#include <doca_sta_io.h>
#include <doca_sta_io_qp.h>
#include <doca_sta_io_non_offload.h>
#include <doca_sta_stats.h>
