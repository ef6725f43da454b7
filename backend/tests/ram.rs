mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use backend::ram::LendSet;
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

#[test]
fn lent_bytes_are_what_a_read_returns() {
    use backend::ram::{LendSet, STRIPE_BYTES};
    let r = RamBackend::new(4 << 20, 512).unwrap();
    let be: Arc<dyn Backend> = r.clone();
    let mut q = be.create_queue(4).unwrap();
    let lender = q.ram_store().expect("a RAM queue lends");
    assert!(Arc::ptr_eq(&lender, &r));
    let data: Vec<u8> = (0..(256u32 << 10))
        .map(|i| (i * 13 + i / 509) as u8)
        .collect();
    // 256 KiB from block 100: unaligned to the 64 KiB stripes, so it spans five.
    assert_eq!(write(&mut *q, 512, 100, &data, false), IoStatus::Ok);
    let (off, len) = r.byte_range(100, 512).unwrap();
    assert_eq!((off, len), (100 * 512, 256 << 10));
    assert_eq!(r.byte_range(8191, 2), None, "past the end");
    let mut set = LendSet::default();
    assert!(set.is_empty());
    assert!(set.add(off, len));
    r.lend(&set, |lent| {
        assert_eq!(lent.bytes(off, len).unwrap(), &data[..]);
        assert_eq!(lent.bytes(off + 1000, 10).unwrap(), &data[1000..1010]);
        // Bytes of a stripe the set does not hold are not handed out.
        // (the range ends inside stripe 4: its locked tail is lent, stripe 5 is not)
        assert_eq!((off + len - 1) / STRIPE_BYTES, 4);
        assert!(lent.bytes(off + len, 512).is_some());
        assert!(lent.bytes(5 * STRIPE_BYTES, 512).is_none());
        assert!(lent.bytes(3 << 20, 512).is_none());
        assert!(lent.bytes(4 << 20, 1).is_none(), "past the end");
    });
    // What the read path returns agrees.
    assert_eq!(read(&mut *q, 512, 100, 512), data);
}

#[test]
fn a_lend_set_is_bounded() {
    use backend::ram::{LendSet, LEND_MAX_LOCKS, STRIPE_BYTES};
    let mut set = LendSet::default();
    for i in 0..LEND_MAX_LOCKS {
        assert!(set.add(i * STRIPE_BYTES, 4096), "lock {i}");
    }
    // Stripes already held cost nothing more.
    assert!(set.add(0, 4 * STRIPE_BYTES));
    // One more is refused, and a refused range adds nothing.
    assert!(!set.add(LEND_MAX_LOCKS * STRIPE_BYTES, 4096));
    assert!(!set.add((LEND_MAX_LOCKS - 1) * STRIPE_BYTES, 2 * STRIPE_BYTES));
    let r = RamBackend::new(((LEND_MAX_LOCKS + 2) * STRIPE_BYTES) as u64, 4096).unwrap();
    r.lend(&set, |lent| {
        assert!(lent.bytes(0, LEND_MAX_LOCKS * STRIPE_BYTES).is_some());
        assert!(lent.bytes(LEND_MAX_LOCKS * STRIPE_BYTES, 4096).is_none());
    });
    set.clear();
    assert!(set.is_empty());
}

/// While bytes are lent, a writer of those stripes on another thread waits; once the
/// lend is over it goes ahead. Writers of other stripes do not wait.
#[test]
fn a_writer_waits_for_a_lend() {
    use backend::ram::{LendSet, STRIPE_BYTES};
    use std::sync::atomic::{AtomicBool, Ordering};
    let r = RamBackend::new(4 << 20, 4096).unwrap();
    let mut set = LendSet::default();
    assert!(set.add(0, 4096));
    let done_same = Arc::new(AtomicBool::new(false));
    let done_other = Arc::new(AtomicBool::new(false));
    let writer = |lba: u64, flag: Arc<AtomicBool>| {
        let be: Arc<dyn Backend> = r.clone();
        std::thread::spawn(move || {
            let mut q = be.create_queue(1).unwrap();
            assert_eq!(
                write(&mut *q, 4096, lba, &[0x5a; 4096], false),
                IoStatus::Ok
            );
            flag.store(true, Ordering::SeqCst);
        })
    };
    let (a, b) = r.lend(&set, |lent| {
        let before = lent.bytes(0, 4096).unwrap().to_vec();
        let a = writer(0, done_same.clone());
        let b = writer((STRIPE_BYTES / 4096) as u64, done_other.clone());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !done_other.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            done_other.load(Ordering::SeqCst),
            "a writer of another stripe waited"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            !done_same.load(Ordering::SeqCst),
            "a writer of a lent stripe went ahead"
        );
        assert_eq!(lent.bytes(0, 4096).unwrap(), &before[..]);
        (a, b)
    });
    a.join().unwrap();
    b.join().unwrap();
    assert!(done_same.load(Ordering::SeqCst));
}

/// Lenders on several threads with overlapping sets, and writers hammering the same
/// stripes: every lend sees whole blocks (each block one writer's pattern) and nobody
/// deadlocks (the test ends).
#[test]
fn lenders_and_writers_neither_deadlock_nor_tear_blocks() {
    use backend::ram::{LendSet, STRIPE_BYTES};
    let r = RamBackend::new(16 << 20, 4096).unwrap();
    let stripes = 16u64;
    let blocks_per_stripe = (STRIPE_BYTES / 4096) as u64;
    let mut threads = Vec::new();
    for t in 0..3u8 {
        let be: Arc<dyn Backend> = r.clone();
        threads.push(std::thread::spawn(move || {
            let mut q = be.create_queue(1).unwrap();
            for i in 0..3000u64 {
                let lba = (i * 7 + u64::from(t)) % stripes * blocks_per_stripe + i % 3;
                let v = (t + 1) * 16 + (i % 16) as u8;
                assert_eq!(write(&mut *q, 4096, lba, &[v; 4096], false), IoStatus::Ok);
            }
        }));
    }
    for t in 0..3usize {
        let r = r.clone();
        threads.push(std::thread::spawn(move || {
            for i in 0..3000usize {
                // Sets built in different orders on different threads.
                let mut set = LendSet::default();
                let mut ranges = Vec::new();
                for k in 0..5usize {
                    let s = if t % 2 == 0 {
                        (i + k * 3) % 16
                    } else {
                        (i + 15 - k * 3) % 16
                    };
                    let off = s * STRIPE_BYTES + (i % 3) * 4096;
                    assert!(set.add(off, 4096));
                    ranges.push(off);
                }
                r.lend(&set, |lent| {
                    for &off in &ranges {
                        let b = lent.bytes(off, 4096).unwrap();
                        assert!(b.iter().all(|&x| x == b[0]), "torn block at {off}");
                    }
                });
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn the_longest_lendable_range_fits_an_empty_set_anywhere() {
    use backend::ram::{LendSet, LEND_MAX_BYTES, STRIPE_BYTES};
    for start in [0, 512, STRIPE_BYTES - 512, 5 * STRIPE_BYTES + 4096] {
        let mut set = LendSet::default();
        assert!(set.add(start, LEND_MAX_BYTES), "from {start}");
        let mut set = LendSet::default();
        // One stripe longer and not stripe-aligned: 65 stripes.
        assert!(
            !set.add(start + 1024, LEND_MAX_BYTES + STRIPE_BYTES),
            "from {start}"
        );
    }
}

#[test]
fn long_zeroing_takes_a_step_per_poll() {
    let be = RamBackend::new(32 << 20, 4096).unwrap();
    long_zeroing_is_done_a_step_per_poll(be, (18 << 20) / 4096);
}

#[test]
fn queue_readers_never_see_a_torn_block() {
    readers_never_see_a_torn_block(RamBackend::new(4 << 20, 4096).unwrap());
}

/// A namespace grows in place: data written before stays, a queue made before the grow
/// serves the new blocks, lending covers them, and what cannot be done (shrink, a size
/// that is not whole blocks, past the reserve) fails and leaves the size alone.
#[test]
fn grows_in_place_and_old_queues_serve_the_new_blocks() {
    use backend::ram::LendSet;
    const BS: usize = 4096;
    let r = RamBackend::new(1 << 20, BS as u32).unwrap();
    let old = r.num_blocks();
    let be: Arc<dyn Backend> = r.clone();
    let mut q = be.clone().create_queue(4).unwrap();
    let before: Vec<u8> = (0..4).flat_map(|i| pattern(i, 1, BS)).collect();
    assert_eq!(write(&mut *q, BS, 0, &before, false), IoStatus::Ok);
    // Past the end before the grow.
    assert_eq!(
        run(&mut *q, Op::Read, old, 1, Some(backend::IoBuf::new(BS))).status,
        IoStatus::OutOfRange
    );

    // Nothing to re-read for RAM; the same size is no change.
    assert_eq!(be.grow(None).unwrap(), old);
    assert_eq!(be.grow(Some(1 << 20)).unwrap(), old);
    // Shrinking, and sizes that are not whole blocks, are refused.
    let e = be.grow(Some(512 << 10)).unwrap_err().to_string();
    assert!(e.contains("cannot shrink"), "{e}");
    assert!(be.grow(Some((4 << 20) + 512)).is_err());
    assert_eq!(r.num_blocks(), old);

    let new = be.grow(Some(4 << 20)).unwrap();
    assert_eq!(new, (4 << 20) / BS as u64);
    assert_eq!(be.num_blocks(), new);
    serves_grown_range(&mut *q, BS, old, new, &before);

    // Lending: the new range is in the store and can be lent.
    let store = q.ram_store().expect("a RAM queue lends");
    let (off, len) = store
        .byte_range(new - 1, 1)
        .expect("the last block is in range");
    assert!(store.byte_range(new, 1).is_none());
    let mut set = LendSet::default();
    assert!(set.add(off, len));
    let last = pattern(new - 1, 9, BS);
    assert!(store.lend(&set, |l| l.bytes(off, len) == Some(&last[..])));
    assert!(store.write_blocks(new - 2, 1, &pattern(new - 2, 3, BS)));
    assert_eq!(read(&mut *q, BS, new - 2, 1), pattern(new - 2, 3, BS));

    // The reserve: 8 times the size at creation (1 MiB here); past it, an error that says
    // to restart, and the size stays.
    assert_eq!(r.reserved_bytes(), 8 << 20);
    let e = be.grow(Some(16 << 20)).unwrap_err().to_string();
    assert!(e.contains("restart"), "{e}");
    assert_eq!(be.num_blocks(), new);
    // Up to the reserve exactly is fine, and a queue made now sees it too.
    assert_eq!(be.grow(Some(8 << 20)).unwrap(), (8 << 20) / BS as u64);
    let mut q2 = be.clone().create_queue(4).unwrap();
    assert_eq!(read(&mut *q2, BS, new - 1, 1), last);
    assert_eq!(read(&mut *q, BS, (8 << 20) / BS as u64 - 1, 1), vec![0; BS]);
    // resident_bytes looks at the used part only.
    assert!(r.resident_bytes() <= 8 << 20);
}

/// The size at creation decides the reserve: 8 times it, at most 1 TiB, and a grow
/// published on one thread is what every thread sees.
#[test]
fn grow_reserve_policy_and_other_threads() {
    let r = RamBackend::new(64 << 20, 4096).unwrap();
    assert_eq!(r.reserved_bytes(), 512 << 20);
    let be: Arc<dyn Backend> = r.clone();
    let grower = {
        let be = be.clone();
        std::thread::spawn(move || be.grow(Some(128 << 20)).unwrap())
    };
    let n = grower.join().unwrap();
    assert_eq!(be.num_blocks(), n);
    assert_eq!(n, (128 << 20) / 4096);
    let big = RamBackend::new(256 << 30, 4096).unwrap();
    assert_eq!(big.reserved_bytes(), 1 << 40);
    assert!(big.resident_bytes() < 64 << 20);
}

/// Readers on other threads hammer the last block of whatever the size is now (through a
/// queue made before every grow, and through lending) while the main thread grows the
/// store in 64 KiB steps. A torn or mis-ordered publication would fault (PROT_NONE) or
/// answer OutOfRange for a block below `num_blocks()`.
#[test]
fn readers_race_a_growing_store() {
    const BS: usize = 4096;
    let be = RamBackend::new(64 << 10, BS as u32).unwrap();
    assert!(be.reserved_bytes() >= 512 << 10);
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut threads = Vec::new();
    for t in 0..4 {
        let be = be.clone();
        let (stop, rounds) = (stop.clone(), rounds.clone());
        threads.push(std::thread::spawn(move || {
            let mut q = be.clone().create_queue(4).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let nb = be.num_blocks();
                let lba = nb - 1;
                if t % 2 == 0 {
                    let data = pattern(lba, 1, BS);
                    assert_eq!(
                        write(&mut *q, BS, lba, &data, false),
                        IoStatus::Ok,
                        "lba {lba}"
                    );
                    let _ = read(&mut *q, BS, lba, 1);
                } else {
                    let (off, len) = be.byte_range(lba, 1).expect("below num_blocks");
                    let mut set = LendSet::default();
                    assert!(set.add(off, len));
                    let sum: u64 = be.lend(&set, |l| {
                        l.bytes(off, len)
                            .unwrap()
                            .iter()
                            .map(|&b| u64::from(b))
                            .sum()
                    });
                    std::hint::black_box(sum);
                }
                rounds.fetch_add(1, Ordering::AcqRel);
            }
        }));
    }
    // Each grow waits for the readers to have made progress (however loaded the
    // machine), so reads and grows interleave.
    let mut size = 64u64 << 10;
    while size + (64 << 10) <= be.reserved_bytes() as u64 {
        let seen = rounds.load(Ordering::Acquire);
        size += 64 << 10;
        assert_eq!(be.grow(Some(size)).unwrap(), size / BS as u64);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while rounds.load(Ordering::Acquire) < seen + 4 && !threads.iter().any(|t| t.is_finished())
        {
            assert!(std::time::Instant::now() < deadline, "the readers stalled");
            std::thread::yield_now();
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("a reader thread");
    }
}

/// Huge and odd sizes are errors, never a panic or a wrap-around, and the size stays.
#[test]
fn grow_rejects_huge_and_odd_sizes() {
    let be = RamBackend::new(1 << 20, 512).unwrap();
    for s in [u64::MAX, u64::MAX - 511, 1 << 63, (1 << 20) + 100] {
        assert!(be.grow(Some(s)).is_err(), "{s}");
        assert_eq!(be.num_blocks(), 2048);
    }
}
