mod common;

use std::sync::Arc;

use backend::{Backend, IoStatus, Op, RamBackend};
use common::*;

#[test]
fn two_queues_on_two_threads() {
    two_queues_two_threads(RamBackend::new(8 << 20, 4096).unwrap());
    two_queues_two_threads(RamBackend::new(1 << 20, 512).unwrap());
    // Large enough for non-temporal stores: what one thread wrote, the other reads back.
    two_queues_two_threads(RamBackend::new(512 << 20, 4096).unwrap());
    two_queues_two_threads(RamBackend::new(512 << 20, 512).unwrap());
}

#[test]
fn fua_flush_write_zeroes_deallocate() {
    fua_flush_zeroes_dealloc(RamBackend::new(16 << 20, 4096).unwrap());
    fua_flush_zeroes_dealloc(RamBackend::new(2 << 20, 512).unwrap());
    fua_flush_zeroes_dealloc(RamBackend::new(512 << 20, 512).unwrap());
}

#[test]
fn out_of_range_and_malformed() {
    bad_requests(RamBackend::new(1 << 20, 4096).unwrap());
}

#[test]
fn properties() {
    let r = RamBackend::new(1 << 20, 512).unwrap();
    assert_eq!(r.block_size(), 512);
    assert_eq!(r.num_blocks(), 2048);
    assert!(!r.volatile_write_cache());
    assert!(RamBackend::new(1000, 512).is_err());
    assert!(RamBackend::new(0, 512).is_err());
    assert!(RamBackend::new(1 << 20, 1000).is_err());
    assert!(RamBackend::new(1 << 20, 256).is_err());
}

#[test]
fn huge_pages_advised_where_the_kernel_has_them() {
    let r = RamBackend::new(64 << 20, 4096).unwrap();
    // madvise(MADV_HUGEPAGE) succeeds whenever THP is built in, whatever its mode.
    let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists();
    assert_eq!(r.huge_pages(), thp);
}

#[test]
fn lazily_allocated_and_freed() {
    let r = RamBackend::new(1 << 30, 4096).unwrap();
    // A 1 GiB namespace commits (almost) nothing up front.
    assert!(
        r.resident_bytes() < 8 << 20,
        "resident {}",
        r.resident_bytes()
    );
    let be: Arc<dyn Backend> = r.clone();
    let mut q = be.create_queue(4).unwrap();
    // Never-written blocks read as zeroes without committing memory.
    assert!(read(&mut *q, 4096, 100_000, 16).iter().all(|&b| b == 0));
    let data = vec![0xa5u8; 16 << 20];
    assert_eq!(write(&mut *q, 4096, 1000, &data, false), IoStatus::Ok);
    let after_write = r.resident_bytes();
    assert!(after_write >= 16 << 20);
    assert!(after_write < 64 << 20, "resident {after_write}");
    // Deallocate gives the memory back.
    assert_eq!(
        run(&mut *q, Op::Deallocate, 1000, 4096, None).status,
        IoStatus::Ok
    );
    assert!(
        r.resident_bytes() < after_write - (8 << 20),
        "resident {}",
        r.resident_bytes()
    );
    assert!(read(&mut *q, 4096, 1000, 4096).iter().all(|&b| b == 0));
}
