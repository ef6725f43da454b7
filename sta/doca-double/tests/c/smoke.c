/*
 * A C program written against the doca-double headers (include/), built and run by
 * tests/c_abi.rs against libdoca_sta.so. It follows the STA call order of
 * shared/doca-sta-api.md section 5 on a test device, takes one loopback connection
 * through Fabrics Connect (non-offload callback + send task), writes and reads 4 KiB
 * through the offload path (null backend), and tears everything down. If our headers
 * disagreed with the library's ABI, the values checked here would come out wrong.
 */
#define _POSIX_C_SOURCE 200809L
#define DOCA_ALLOW_EXPERIMENTAL_API
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <doca_ctx.h>
#include <doca_dev.h>
#include <doca_error.h>
#include <doca_log.h>
#include <doca_mmap.h>
#include <doca_pe.h>
#include <doca_sta.h>
#include <doca_sta_be.h>
#include <doca_sta_event.h>
#include <doca_sta_io.h>
#include <doca_sta_io_non_offload.h>
#include <doca_sta_io_qp.h>
#include <doca_sta_mem.h>
#include <doca_sta_stats.h>
#include <doca_sta_subsystem.h>
#include <doca_sta_task.h>
#include <doca_double.h>

#define CHECK(call)                                                                           \
	do {                                                                                  \
		doca_error_t r_ = (call);                                                     \
		if (r_ != DOCA_SUCCESS) {                                                     \
			fprintf(stderr, "smoke: %s failed: %s\n", #call, doca_error_get_name(r_)); \
			exit(1);                                                              \
		}                                                                             \
	} while (0)
#define EXPECT(cond)                                                                          \
	do {                                                                                  \
		if (!(cond)) {                                                                \
			fprintf(stderr, "smoke: expected %s (line %d)\n", #cond, __LINE__);   \
			exit(1);                                                              \
		}                                                                             \
	} while (0)

static void *zmalloc_cb(size_t size, size_t align, uint64_t *phys)
{
	void *p = NULL;
	if (align < 64)
		align = 64;
	if (posix_memalign(&p, align, size) != 0)
		return NULL;
	memset(p, 0, size);
	if (phys)
		*phys = (uint64_t)(uintptr_t)p; /* identity: "physical" = virtual */
	return p;
}
static void free_cb(void *p) { free(p); }
static uint64_t vtophys_cb(const void *p, uint32_t size)
{
	(void)size;
	return (uint64_t)(uintptr_t)p;
}

static int running, tasks_done, tasks_failed;
static union doca_data last_token;
static int non_offloaded;
static uint32_t last_len;
static bool last_valid;
static uint8_t last_opcode;

static void state_cb(const union doca_data u, struct doca_ctx *ctx, enum doca_ctx_states prev, enum doca_ctx_states next)
{
	(void)u; (void)ctx; (void)prev;
	if (next == DOCA_CTX_STATE_RUNNING)
		running++;
}
static void task_ok(struct doca_sta_producer_task_send *t, union doca_data u)
{
	(void)u;
	tasks_done++;
	doca_task_free(doca_sta_producer_send_task_as_task(t));
}
static void task_err(struct doca_sta_producer_task_send *t, union doca_data u)
{
	(void)u;
	tasks_failed++;
	doca_task_free(doca_sta_producer_send_task_as_task(t));
}
static void non_offload_cb(struct doca_sta_qp_handle *qp, union doca_data u, const uint8_t *cmd, uint8_t *payload,
			   uint32_t len, bool valid, union doca_data token)
{
	(void)qp; (void)payload;
	EXPECT(u.u64 == 42);
	non_offloaded++;
	last_opcode = cmd[0];
	last_len = len;
	last_valid = valid;
	last_token = token;
}

static void sqe_keyed(uint8_t *s, uint8_t opc, uint16_t cid, uint32_t nsid, void *addr, uint32_t len, uint32_t key,
		      uint64_t slba, uint16_t nlb0)
{
	uint64_t a = (uint64_t)(uintptr_t)addr;
	memset(s, 0, 64);
	s[0] = opc;
	s[1] = 0x40;
	memcpy(s + 2, &cid, 2);
	memcpy(s + 4, &nsid, 4);
	memcpy(s + 24, &a, 8);
	memcpy(s + 32, &len, 3);
	memcpy(s + 35, &key, 4);
	s[39] = 0x40;
	memcpy(s + 40, &slba, 8);
	memcpy(s + 48, &nlb0, 2);
}

int main(void)
{
	struct doca_devinfo **list;
	uint32_t n, i;
	struct doca_dev *dev = NULL;
	struct doca_sta *sta;
	struct doca_pe *pe, *io_pe;
	struct doca_sta_io *io;
	struct doca_log_backend *log;
	char name[DOCA_DEVINFO_IBDEV_NAME_SIZE];

	CHECK(doca_log_backend_create_standard());
	CHECK(doca_log_backend_create_with_file_sdk(stderr, &log));
	CHECK(doca_log_backend_set_sdk_level(log, DOCA_LOG_LEVEL_ERROR));
	CHECK(doca_devinfo_create_list(&list, &n));
	for (i = 0; i < n; i++) {
		CHECK(doca_devinfo_get_ibdev_name(list[i], name, sizeof(name)));
		if (strcmp(name, "cdev0") == 0 && doca_sta_cap_is_supported(list[i]) == DOCA_SUCCESS)
			CHECK(doca_dev_open(list[i], &dev));
	}
	CHECK(doca_devinfo_destroy_list(list));
	EXPECT(dev != NULL);

	CHECK(doca_sta_create(dev, &sta));
	uint32_t v;
	CHECK(doca_sta_get_max_io_queue_size(sta, &v));
	EXPECT(v == 128);
	CHECK(doca_pe_create(&pe));
	CHECK(doca_pe_connect_ctx(pe, doca_sta_as_ctx(sta)));
	CHECK(doca_sta_add_dev(sta, dev));
	CHECK(doca_ctx_set_state_changed_cb(doca_sta_as_ctx(sta), state_cb));
	CHECK(doca_sta_subsystem_task_rm_ns_set_conf(sta, task_ok, task_err));
	CHECK(doca_sta_be_task_destroy_queue_set_conf(sta, task_ok, task_err));
	CHECK(doca_sta_mem_allocator_register(sta, zmalloc_cb, free_cb, vtophys_cb));
	CHECK(doca_sta_set_max_sta_io(sta, 1));
	doca_error_t r = doca_ctx_start(doca_sta_as_ctx(sta));
	EXPECT(r == DOCA_SUCCESS || r == DOCA_ERROR_IN_PROGRESS);
	for (i = 0; i < 10 && !running; i++)
		doca_pe_progress(pe);
	EXPECT(running == 1);

	struct doca_sta_subs_handle *subs;
	struct doca_sta_be_handle *be;
	struct doca_sta_be_q_handle *beq;
	struct doca_sta_ns_handle *ns;
	struct doca_mmap *m[3];
	void *mem[3];
	size_t len[3] = {64 * 64, 64 * 16, 16};
	CHECK(doca_sta_subsystem_create(sta, "nqn.2026-11.dev.test:c", &subs));
	CHECK(doca_sta_subsystem_add_dev(subs, dev));
	CHECK(doca_sta_be_create(sta, &be));
	for (i = 0; i < 3; i++) {
		mem[i] = zmalloc_cb(len[i], 4096, NULL);
		CHECK(doca_mmap_create(&m[i]));
		CHECK(doca_mmap_add_dev(m[i], dev));
		CHECK(doca_mmap_set_memrange(m[i], mem[i], len[i]));
		CHECK(doca_mmap_set_permissions(m[i], DOCA_ACCESS_FLAG_LOCAL_READ_WRITE));
		CHECK(doca_mmap_start(m[i]));
	}
	CHECK(doca_sta_be_add_queue(be, m[0], m[2], 0, m[1], m[2], 8, &beq));
	CHECK(doca_sta_subsystem_add_ns(subs, 1, 4096, 1, be, &ns));

	CHECK(doca_sta_io_create(sta, &io));
	CHECK(doca_pe_create(&io_pe));
	CHECK(doca_pe_connect_ctx(io_pe, doca_sta_io_as_ctx(io)));
	CHECK(doca_sta_io_task_disconnect_set_conf(io, task_ok, task_err));
	CHECK(doca_sta_io_non_offload_register_cb(io, non_offload_cb, (union doca_data){.u64 = 42}));
	CHECK(doca_sta_io_task_non_offload_set_rdma_write_send_conf(io, task_ok, task_err));
	CHECK(doca_sta_io_task_non_offload_set_rdma_read_conf(io, task_ok, task_err));
	CHECK(doca_ctx_start(doca_sta_io_as_ctx(io)));

	/* One loopback connection: Fabrics Connect handed up, answered with a send task. */
	struct rdma_cm_id *id;
	struct doca_sta_qp_handle *qp;
	uint8_t accept_pd[32] = {0, 0, 32, 0};
	CHECK(doca_double_loop_create(&id));
	CHECK(doca_sta_io_qp_connect(io, dev, id, accept_pd, sizeof(accept_pd), subs, &qp));
	CHECK(doca_sta_io_qp_connect_established(io, qp));
	uint8_t cap[64 + 1024];
	memset(cap, 0, sizeof(cap));
	cap[0] = 0x7f; cap[1] = 0x40; cap[2] = 1; cap[4] = 0x01; cap[39] = 0x01;
	cap[32] = 0x00; cap[33] = 0x04; /* SGL length 1024 */
	cap[42] = 1; cap[44] = 31; /* QID 1, SQSIZE 31 */
	CHECK(doca_double_loop_send(id, cap, sizeof(cap)));
	for (i = 0; i < 3; i++)
		doca_pe_progress(io_pe);
	EXPECT(non_offloaded == 1 && last_opcode == 0x7f && last_len == 1024 && last_valid);
	CHECK(doca_sta_io_qp_connect_set_sq_size(io, qp, 31));
	doca_sta_nvme_completion_t cqe = {0};
	cqe[12] = 1;
	struct doca_sta_producer_task_send *t;
	CHECK(doca_sta_io_task_non_offload_rdma_send_alloc_init(io, (union doca_data){.u64 = 1}, qp, cqe, last_token, &t));
	CHECK(doca_task_submit(doca_sta_producer_send_task_as_task(t)));
	for (i = 0; i < 3; i++)
		doca_pe_progress(io_pe);
	EXPECT(tasks_done == 1);
	uint8_t got[16];
	uint32_t inval;
	EXPECT(doca_double_loop_recv(id, got, &inval) == 1 && got[12] == 1);

	/* 4 KiB written and read back through the offload path. */
	static uint8_t wbuf[4096], rbuf[4096];
	for (i = 0; i < sizeof(wbuf); i++)
		wbuf[i] = (uint8_t)(i * 7 + 3);
	CHECK(doca_double_loop_add_region(id, 0x11, wbuf, sizeof(wbuf)));
	CHECK(doca_double_loop_add_region(id, 0x22, rbuf, sizeof(rbuf)));
	uint8_t s[64];
	sqe_keyed(s, 0x01, 2, 1, wbuf, 4096, 0x11, 5, 0);
	CHECK(doca_double_loop_send(id, s, 64));
	for (i = 0; i < 4; i++)
		doca_pe_progress(io_pe);
	EXPECT(doca_double_loop_recv(id, got, &inval) == 1 && got[12] == 2 && (got[14] >> 1) == 0);
	sqe_keyed(s, 0x02, 3, 1, rbuf, 4096, 0x22, 5, 0);
	CHECK(doca_double_loop_send(id, s, 64));
	for (i = 0; i < 4; i++)
		doca_pe_progress(io_pe);
	EXPECT(doca_double_loop_recv(id, got, &inval) == 1 && got[12] == 3 && (got[14] >> 1) == 0);
	EXPECT(memcmp(wbuf, rbuf, sizeof(wbuf)) == 0);
	EXPECT(non_offloaded == 1);

	/* Statistics: the namespace saw one read and one write. */
	const struct doca_sta_eu_ctr_entry *e;
	uint16_t ne;
	CHECK(doca_sta_get_ns_stats(subs, ns, &e, &ne));
	EXPECT(ne >= 2 && strcmp(e[0].name, "read_cmds") == 0 && *e[0].val == 1 && *e[1].val == 1);

	/* Teardown in the documented order. */
	CHECK(doca_sta_io_task_disconnect_alloc_init(io, (union doca_data){.u64 = 2}, qp, &t));
	CHECK(doca_task_submit(doca_sta_producer_send_task_as_task(t)));
	for (i = 0; i < 3; i++)
		doca_pe_progress(io_pe);
	EXPECT(tasks_done == 2);
	CHECK(doca_sta_io_qp_destroy(io, qp));
	CHECK(doca_ctx_stop(doca_sta_io_as_ctx(io)));
	CHECK(doca_sta_io_destroy(io));
	CHECK(doca_pe_destroy(io_pe));
	CHECK(doca_sta_subsystem_task_rm_ns_alloc_init(subs, ns, (union doca_data){.u64 = 3}, &t));
	CHECK(doca_task_submit(doca_sta_producer_send_task_as_task(t)));
	CHECK(doca_sta_be_destroy_queue_task_alloc_init(beq, (union doca_data){.u64 = 4}, &t));
	CHECK(doca_task_submit(doca_sta_producer_send_task_as_task(t)));
	for (i = 0; i < 3; i++)
		doca_pe_progress(pe);
	EXPECT(tasks_done == 4 && tasks_failed == 0);
	for (i = 0; i < 3; i++) {
		CHECK(doca_mmap_destroy(m[i]));
		free(mem[i]);
	}
	CHECK(doca_sta_be_destroy(be));
	CHECK(doca_sta_subsystem_destroy(subs));
	r = doca_ctx_stop(doca_sta_as_ctx(sta));
	EXPECT(r == DOCA_SUCCESS || r == DOCA_ERROR_IN_PROGRESS);
	for (i = 0; i < 3; i++)
		doca_pe_progress(pe);
	CHECK(doca_sta_destroy(sta));
	CHECK(doca_pe_destroy(pe));
	CHECK(doca_dev_close(dev));
	printf("smoke: ok (%s)\n", doca_double_version());
	return 0;
}
