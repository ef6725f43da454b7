//! Checks shared by the RAM and file backend tests: each takes any `Arc<dyn Backend>`.
#![allow(dead_code)]

#[path = "../../../tests/common/skip.rs"]
pub mod skip;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use backend::{Backend, BackendQueue, Completion, IoBuf, IoStatus, Op, Request, SubmitError};

/// Deterministic content of block `lba` written in round `round`.
pub fn pattern(lba: u64, round: u64, bs: usize) -> Vec<u8> {
    let mut x =
        lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ round.wrapping_mul(0xd1b5_4a32_d192_ed03) | 1;
    (0..bs)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Polls until `n` completions arrived (or panics after 20 s: a hang is a bug).
pub fn wait(q: &mut dyn BackendQueue, n: usize) -> Vec<Completion> {
    let start = Instant::now();
    let mut out = Vec::new();
    while out.len() < n {
        q.poll(&mut out);
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no completion after 20 s"
        );
        if out.len() < n {
            std::thread::yield_now();
        }
    }
    assert_eq!(out.len(), n, "more completions than requests");
    out
}

/// Runs one request to completion.
pub fn run(
    q: &mut dyn BackendQueue,
    op: Op,
    lba: u64,
    nblocks: u32,
    buf: Option<IoBuf>,
) -> Completion {
    q.submit(Request {
        tag: 7,
        op,
        lba,
        nblocks,
        buf,
    })
    .expect("submit");
    let mut c = wait(q, 1);
    let c = c.pop().unwrap();
    assert_eq!(c.tag, 7);
    c
}

pub fn write(q: &mut dyn BackendQueue, bs: usize, lba: u64, data: &[u8], fua: bool) -> IoStatus {
    let n = (data.len() / bs) as u32;
    run(q, Op::Write { fua }, lba, n, Some(IoBuf::from_slice(data))).status
}

pub fn read(q: &mut dyn BackendQueue, bs: usize, lba: u64, nblocks: u32) -> Vec<u8> {
    let c = run(
        q,
        Op::Read,
        lba,
        nblocks,
        Some(IoBuf::new(nblocks as usize * bs)),
    );
    assert_eq!(c.status, IoStatus::Ok);
    let b = c.buf.expect("read returns its buffer");
    assert_eq!(b.len(), nblocks as usize * bs);
    b.as_slice().to_vec()
}

/// Two threads, each with its own queue, write interleaved blocks at queue depth 16,
/// then each reads back every block (its own and the other's) and checks the pattern.
/// Then both overwrite the same blocks concurrently; every block must end up wholly one
/// writer's version (no torn blocks).
pub fn two_queues_two_threads(backend: Arc<dyn Backend>) {
    let bs = backend.block_size() as usize;
    let blocks = backend.num_blocks().min(512);
    let barrier = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let backend = Arc::clone(&backend);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let mut q = backend.create_queue(16).expect("queue");
                // Phase 1: disjoint writes, 16 in flight.
                let mine: Vec<u64> = (0..blocks).filter(|l| l % 2 == t).collect();
                for chunk in mine.chunks(16) {
                    for &lba in chunk {
                        let buf = IoBuf::from_slice(&pattern(lba, 1, bs));
                        q.submit(Request {
                            tag: lba,
                            op: Op::Write { fua: false },
                            lba,
                            nblocks: 1,
                            buf: Some(buf),
                        })
                        .unwrap();
                    }
                    for c in wait(&mut *q, chunk.len()) {
                        assert_eq!(c.status, IoStatus::Ok, "write lba {}", c.tag);
                        assert!(c.buf.is_some());
                    }
                }
                barrier.wait();
                // Phase 2: read everything back, 16 in flight.
                let all: Vec<u64> = (0..blocks).collect();
                for chunk in all.chunks(16) {
                    for &lba in chunk {
                        let buf = IoBuf::new(bs);
                        q.submit(Request {
                            tag: lba,
                            op: Op::Read,
                            lba,
                            nblocks: 1,
                            buf: Some(buf),
                        })
                        .unwrap();
                    }
                    for c in wait(&mut *q, chunk.len()) {
                        assert_eq!(c.status, IoStatus::Ok);
                        assert!(
                            c.buf.unwrap().as_slice() == pattern(c.tag, 1, bs),
                            "lba {} differs",
                            c.tag
                        );
                    }
                }
                barrier.wait();
                // Phase 3: overlapping multi-block writes from both threads.
                for _ in 0..4 {
                    let lba = 0;
                    let n = blocks.min(64) as u32;
                    let mut data = Vec::new();
                    for l in 0..u64::from(n) {
                        data.extend(pattern(l, 100 + t, bs));
                    }
                    assert_eq!(write(&mut *q, bs, lba, &data, false), IoStatus::Ok);
                }
                barrier.wait();
                let n = blocks.min(64) as u32;
                let got = read(&mut *q, bs, 0, n);
                for (l, block) in got.chunks(bs).enumerate() {
                    let l = l as u64;
                    assert!(
                        block == pattern(l, 100, bs) || block == pattern(l, 101, bs),
                        "block {l} is torn or foreign"
                    );
                }
                assert_eq!(q.in_flight(), 0);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

pub fn fua_flush_zeroes_dealloc(backend: Arc<dyn Backend>) {
    let bs = backend.block_size() as usize;
    let mut q = backend.clone().create_queue(8).unwrap();
    let q = &mut *q;
    let data: Vec<u8> = (0..4).flat_map(|l| pattern(l, 7, bs)).collect();
    assert_eq!(write(q, bs, 10, &data, true), IoStatus::Ok);
    assert_eq!(read(q, bs, 10, 4), data);
    assert_eq!(run(q, Op::Flush, 0, 0, None).status, IoStatus::Ok);

    // Write Zeroes in the middle: neighbours untouched.
    assert_eq!(
        run(q, Op::WriteZeroes { fua: false }, 11, 2, None).status,
        IoStatus::Ok
    );
    let got = read(q, bs, 10, 4);
    assert_eq!(&got[..bs], &data[..bs]);
    assert!(got[bs..3 * bs].iter().all(|&b| b == 0));
    assert_eq!(&got[3 * bs..], &data[3 * bs..]);

    // Deallocate reads back zeroes, small and large ranges.
    assert_eq!(run(q, Op::Deallocate, 10, 1, None).status, IoStatus::Ok);
    assert!(read(q, bs, 10, 1).iter().all(|&b| b == 0));
    let big = (backend.num_blocks().min(2048)) as u32;
    let fill: Vec<u8> = (0..u64::from(big))
        .flat_map(|l| pattern(l, 9, bs))
        .collect();
    assert_eq!(write(q, bs, 0, &fill, false), IoStatus::Ok);
    assert_eq!(
        run(q, Op::Deallocate, 1, big - 2, None).status,
        IoStatus::Ok
    );
    let got = read(q, bs, 0, big);
    assert_eq!(&got[..bs], &fill[..bs]);
    assert!(got[bs..(big as usize - 1) * bs].iter().all(|&b| b == 0));
    assert_eq!(
        &got[(big as usize - 1) * bs..],
        &fill[(big as usize - 1) * bs..]
    );
    assert_eq!(
        run(q, Op::WriteZeroes { fua: false }, 0, big, None).status,
        IoStatus::Ok
    );
    assert!(read(q, bs, 0, big).iter().all(|&b| b == 0));
    assert_eq!(q.in_flight(), 0);
}

pub fn bad_requests(backend: Arc<dyn Backend>) {
    let bs = backend.block_size() as usize;
    let n = backend.num_blocks();
    let mut q = backend.clone().create_queue(4).unwrap();
    let q = &mut *q;
    for (op, lba, nblocks) in [
        (Op::Read, n, 1),
        (Op::Read, n - 1, 2),
        (Op::Write { fua: false }, u64::MAX, 1),
        (Op::Write { fua: true }, u64::MAX - 1, u32::MAX),
        (Op::WriteZeroes { fua: false }, n, 1),
        (Op::Deallocate, 0, u32::MAX),
    ] {
        let buf = matches!(op, Op::Read | Op::Write { .. }).then(|| IoBuf::new(bs * 2));
        let c = run(q, op, lba, nblocks, buf);
        assert_eq!(
            c.status,
            IoStatus::OutOfRange,
            "{op:?} lba {lba} n {nblocks}"
        );
        if matches!(op, Op::Read | Op::Write { .. }) {
            assert!(c.buf.is_some(), "buffer comes back even on error");
        }
    }
    // Last block is in range.
    assert_eq!(read(q, bs, n - 1, 1).len(), bs);
    // Missing or short buffers are refused, not read past.
    assert_eq!(run(q, Op::Read, 0, 1, None).status, IoStatus::Unsupported);
    assert_eq!(
        run(q, Op::Write { fua: false }, 0, 1, None).status,
        IoStatus::Unsupported
    );
    let mut short = IoBuf::new(bs);
    short.set_len(bs - 1);
    assert_eq!(
        run(q, Op::Write { fua: false }, 0, 1, Some(short)).status,
        IoStatus::Unsupported
    );
    let small = IoBuf::new(bs);
    let too_many = (small.capacity() / bs + 1) as u32;
    assert_eq!(
        run(q, Op::Read, 0, too_many, Some(small)).status,
        IoStatus::Unsupported
    );
    // Depth is enforced with Full, and the request comes back.
    for i in 0..4 {
        q.submit(Request {
            tag: i,
            op: Op::Flush,
            lba: 0,
            nblocks: 0,
            buf: None,
        })
        .unwrap();
    }
    match q.submit(Request {
        tag: 99,
        op: Op::Flush,
        lba: 0,
        nblocks: 0,
        buf: None,
    }) {
        Err(SubmitError::Full(r)) => assert_eq!(r.tag, 99),
        other => panic!("expected Full, got {other:?}"),
    }
    let mut tags: Vec<u64> = wait(q, 4).iter().map(|c| c.tag).collect();
    tags.sort();
    assert_eq!(tags, [0, 1, 2, 3]);
    assert_eq!(q.in_flight(), 0);
}

/// The backing file (at `path`, 1 MiB of 4 KiB blocks) shrinks under the backend: reads
/// past the new end fail with ReadError (after a short read for a straddling request)
/// instead of spinning or panicking.
pub fn reads_past_a_shrunk_end(backend: Arc<dyn Backend>, path: &std::path::Path) {
    let mut q = backend.create_queue(4).unwrap();
    let data: Vec<u8> = (0..8).flat_map(|l| pattern(l, 3, 4096)).collect();
    assert_eq!(write(&mut *q, 4096, 0, &data, false), IoStatus::Ok);
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(4 * 4096)
        .unwrap();
    assert_eq!(read(&mut *q, 4096, 0, 4), &data[..4 * 4096]);
    let c = run(&mut *q, Op::Read, 2, 4, Some(IoBuf::new(4 * 4096)));
    assert_eq!(c.status, IoStatus::ReadError);
    let c = run(&mut *q, Op::Read, 100, 1, Some(IoBuf::new(4096)));
    assert_eq!(c.status, IoStatus::ReadError);
    assert_eq!(q.in_flight(), 0);
}

/// A Deallocate of `nblocks` blocks (more than `backend::ram::ZERO_STEP` bytes) from LBA
/// 0 on a written range, then a small read: the read completes at the first poll while
/// the zeroing takes a poll per step, and the range then reads as zeroes.
pub fn long_zeroing_is_done_a_step_per_poll(backend: Arc<dyn Backend>, nblocks: u32) {
    let bs = backend.block_size() as usize;
    let len = nblocks as usize * bs;
    assert!(len > backend::ram::ZERO_STEP, "the range fits one step");
    let mut q = backend.create_queue(8).unwrap();
    let data = pattern(1, 9, len);
    assert_eq!(write(&mut *q, bs, 0, &data, false), IoStatus::Ok);
    let req = |tag, op, lba, nblocks, buf| Request {
        tag,
        op,
        lba,
        nblocks,
        buf,
    };
    q.submit(req(1, Op::Deallocate, 0, nblocks, None)).unwrap();
    q.submit(req(
        2,
        Op::Read,
        u64::from(nblocks),
        1,
        Some(IoBuf::new(bs)),
    ))
    .unwrap();
    let mut out = Vec::new();
    q.poll(&mut out);
    let tags: Vec<u64> = out.iter().map(|c| c.tag).collect();
    assert_eq!(
        tags,
        [2],
        "the read waited for the whole zeroing, or the zeroing did not wait"
    );
    let steps = len.div_ceil(backend::ram::ZERO_STEP);
    for _ in 1..steps - 1 {
        out.clear();
        q.poll(&mut out);
        assert!(out.is_empty(), "the zeroing finished early");
    }
    out.clear();
    q.poll(&mut out);
    assert_eq!(out.len(), 1, "the zeroing did not finish in {steps} polls");
    assert_eq!((out[0].tag, out[0].status), (1, IoStatus::Ok));
    assert_eq!(q.in_flight(), 0);
    assert!(read(&mut *q, bs, 0, nblocks).iter().all(|&b| b == 0));
}

/// One thread writes 128 KiB ranges of one byte value (a new value each time) through its
/// queue, another reads the same range through its own: every block it reads is wholly
/// one version. (Ranges span stripes and may mix versions between blocks.)
pub fn readers_never_see_a_torn_block(backend: Arc<dyn Backend>) {
    let bs = backend.block_size() as usize;
    let n = ((128 << 10) / bs) as u32;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (backend, stop) = (backend.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut q = backend.create_queue(4).unwrap();
            let mut v = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                v = v.wrapping_add(1);
                assert_eq!(
                    write(&mut *q, bs, 0, &vec![v; 128 << 10], false),
                    IoStatus::Ok
                );
            }
        })
    };
    let mut q = backend.create_queue(4).unwrap();
    let until = Instant::now() + Duration::from_millis(700);
    let mut reads = 0;
    while Instant::now() < until {
        let data = read(&mut *q, bs, 0, n);
        for (b, block) in data.chunks(bs).enumerate() {
            assert!(
                block.iter().all(|&x| x == block[0]),
                "block {b} of read {reads} is torn"
            );
        }
        reads += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
}

/// After a namespace grew from `old` to `new` blocks: queue `q`, made before the grow,
/// serves the blocks it gained (a write past the old end reads back, one spanning the old
/// end too), the last new block is in range and the one after it is not; and `before`,
/// written at block 0 before the grow, is still there.
pub fn serves_grown_range(q: &mut dyn BackendQueue, bs: usize, old: u64, new: u64, before: &[u8]) {
    assert!(
        new > old + 4,
        "grow by more than a few blocks for this check"
    );
    assert_eq!(read(q, bs, 0, (before.len() / bs) as u32), before);
    let span = [pattern(old - 1, 9, bs), pattern(old, 9, bs)].concat();
    assert_eq!(write(q, bs, old - 1, &span, false), IoStatus::Ok);
    assert_eq!(read(q, bs, old - 1, 2), span);
    let last = pattern(new - 1, 9, bs);
    assert_eq!(write(q, bs, new - 1, &last, true), IoStatus::Ok);
    assert_eq!(read(q, bs, new - 1, 1), last);
    for (op, lba, n) in [
        (Op::Read, new, 1),
        (Op::Read, new - 1, 2),
        (Op::Write { fua: false }, new, 1),
        (Op::WriteZeroes { fua: false }, new - 1, 2),
    ] {
        let buf = matches!(op, Op::Read | Op::Write { .. }).then(|| IoBuf::new(bs * 2));
        assert_eq!(
            run(q, op, lba, n, buf).status,
            IoStatus::OutOfRange,
            "{op:?} {lba}+{n} past the new end {new}"
        );
    }
    // Zeroing inside the new range works too.
    assert_eq!(
        run(q, Op::WriteZeroes { fua: false }, old, 1, None).status,
        IoStatus::Ok
    );
    assert!(read(q, bs, old, 1).iter().all(|&b| b == 0));
}
