mod common;

use std::sync::Arc;

use backend::{Backend, BackendQueue, FileBackend, FileOptions, IoStatus, Op};
use common::*;

fn temp_backend(
    size: u64,
    block_size: u32,
    direct: Option<bool>,
) -> (tempfile::TempDir, Arc<FileBackend>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ns0.img");
    let opts = FileOptions {
        create_size: Some(size),
        block_size: Some(block_size),
        direct,
    };
    let be = FileBackend::open(&path, opts).unwrap();
    (dir, be)
}

fn modes() -> Vec<Option<bool>> {
    vec![Some(false), None]
}

#[test]
fn two_queues_on_two_threads() {
    for direct in modes() {
        let (_d, be) = temp_backend(8 << 20, 4096, direct);
        eprintln!("file backend direct={}", be.is_direct());
        two_queues_two_threads(be);
    }
    let (_d, be) = temp_backend(1 << 20, 512, None);
    two_queues_two_threads(be);
}

#[test]
fn fua_flush_write_zeroes_deallocate() {
    for direct in modes() {
        let (_d, be) = temp_backend(16 << 20, 4096, direct);
        fua_flush_zeroes_dealloc(be);
    }
}

#[test]
fn out_of_range_and_malformed() {
    let (_d, be) = temp_backend(1 << 20, 4096, None);
    bad_requests(be);
}

#[test]
fn create_extends_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.img");
    // Missing file without create_size: an open error naming the path.
    let err = FileBackend::open(&path, FileOptions::default()).unwrap_err();
    assert!(err.to_string().contains("x.img"), "{err}");
    let be = FileBackend::open(
        &path,
        FileOptions {
            create_size: Some(1 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
    assert!(be.volatile_write_cache());
    assert_eq!(be.num_blocks() * u64::from(be.block_size()), 1 << 20);
    drop(be);
    // Reopening with a larger create_size extends; a smaller one never truncates.
    let be = FileBackend::open(
        &path,
        FileOptions {
            create_size: Some(2 << 20),
            block_size: Some(4096),
            direct: None,
        },
    )
    .unwrap();
    assert_eq!(be.num_blocks(), 512);
    let be2 = FileBackend::open(
        &path,
        FileOptions {
            create_size: Some(4096),
            block_size: Some(4096),
            direct: None,
        },
    )
    .unwrap();
    assert_eq!(be2.num_blocks(), 512);
    // Not a power of two, too small, not a file.
    assert!(FileBackend::open(
        &path,
        FileOptions {
            block_size: Some(1000),
            ..Default::default()
        }
    )
    .is_err());
    assert!(FileBackend::open(
        &path,
        FileOptions {
            block_size: Some(4 << 20),
            ..Default::default()
        }
    )
    .is_err());
    assert!(FileBackend::open(dir.path(), FileOptions::default()).is_err());
}

/// Deallocate / Write Zeroes when the filesystem has no usable fallocate mode: plain
/// writes from the zero buffer, in chunks, for ranges larger than that buffer.
#[test]
fn zero_write_fallback() {
    for direct in modes() {
        let (_d, be) = temp_backend(32 << 20, 4096, direct);
        be.disable_fallocate();
        fua_flush_zeroes_dealloc(be.clone());
        let mut q = be.clone().create_queue(4).unwrap();
        let data: Vec<u8> = (0..4096).flat_map(|l| pattern(l, 5, 4096)).collect();
        assert_eq!(write(&mut *q, 4096, 1000, &data, false), IoStatus::Ok);
        assert_eq!(
            run(&mut *q, Op::WriteZeroes { fua: false }, 1001, 4094, None).status,
            IoStatus::Ok
        );
        let got = read(&mut *q, 4096, 1000, 4096);
        assert_eq!(&got[..4096], &data[..4096]);
        assert!(got[4096..4095 * 4096].iter().all(|&b| b == 0));
        assert_eq!(&got[4095 * 4096..], &data[4095 * 4096..]);
    }
}

/// A write acknowledged and then flushed is in the file for anyone who reads it after
/// the backend is gone.
#[test]
fn flushed_write_is_in_the_file() {
    for direct in modes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("persist.img");
        let be = FileBackend::open(
            &path,
            FileOptions {
                create_size: Some(1 << 20),
                block_size: Some(4096),
                direct,
            },
        )
        .unwrap();
        let data: Vec<u8> = (0..3).flat_map(|l| pattern(l, 42, 4096)).collect();
        {
            let mut q = be.clone().create_queue(4).unwrap();
            assert_eq!(write(&mut *q, 4096, 5, &data, false), IoStatus::Ok);
            assert_eq!(write(&mut *q, 4096, 200, &data[..4096], true), IoStatus::Ok);
            assert_eq!(run(&mut *q, Op::Flush, 0, 0, None).status, IoStatus::Ok);
        }
        be.flush_sync().unwrap();
        drop(be);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 1 << 20);
        assert_eq!(&bytes[5 * 4096..8 * 4096], &data[..]);
        assert_eq!(&bytes[200 * 4096..201 * 4096], &data[..4096]);
        assert!(bytes[..5 * 4096].iter().all(|&b| b == 0));
    }
}

/// The file shrinks under the backend (see `reads_past_a_shrunk_end`).
#[test]
fn file_truncated_underneath() {
    for direct in modes() {
        let (d, be) = temp_backend(1 << 20, 4096, direct);
        reads_past_a_shrunk_end(be, &d.path().join("ns0.img"));
    }
}

/// Dropping a queue with I/O in flight waits for the kernel instead of freeing buffers
/// it may still write.
#[test]
fn drop_with_io_in_flight() {
    let (_d, be) = temp_backend(4 << 20, 4096, None);
    let mut q = be.clone().create_queue(32).unwrap();
    for i in 0..32u64 {
        let op = if i % 2 == 0 {
            Op::Read
        } else {
            Op::Write { fua: false }
        };
        let buf = backend::IoBuf::new(64 << 10);
        q.submit(backend::Request {
            tag: i,
            op,
            lba: i * 16,
            nblocks: 16,
            buf: Some(buf),
        })
        .unwrap();
    }
    let mut out = Vec::new();
    q.poll(&mut out);
    drop(q);
}

#[allow(dead_code)]
fn assert_queue_object_safe(_: &dyn BackendQueue) {}

/// A backing file deleted under the daemon: every write after that would go to an inode
/// nobody can reach again, so the backend reports itself gone (`Unavailable`), which the
/// engine answers with a path error a multipath host fails over on.
#[test]
fn deleted_backing_file_is_gone() {
    let (dir, be) = temp_backend(1 << 20, 4096, None);
    let mut q = be.clone().create_queue(4).unwrap();
    let data = vec![7u8; 4096];
    assert_eq!(write(q.as_mut(), 4096, 0, &data, false), IoStatus::Ok);
    std::fs::remove_file(dir.path().join("ns0.img")).unwrap();
    // The backend looks at the file at most once a second on the I/O path, and at every
    // Flush.
    assert_eq!(
        run(q.as_mut(), Op::Flush, 0, 0, None).status,
        IoStatus::Unavailable
    );
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(
        write(q.as_mut(), 4096, 0, &data, false),
        IoStatus::Unavailable
    );
    let c = run(q.as_mut(), Op::Read, 0, 1, Some(backend::IoBuf::new(4096)));
    assert_eq!(c.status, IoStatus::Unavailable);
}

/// A file that grows behind the backend (`truncate -s`) is picked up by `grow(None)`;
/// `grow(Some(n))` extends the file; a queue made before either serves the new blocks.
/// A file found smaller than the namespace is an error that leaves the capacity alone.
#[test]
fn grows_with_its_file_and_old_queues_serve_the_new_blocks() {
    const BS: usize = 4096;
    for direct in modes() {
        let (dir, be) = temp_backend(1 << 20, BS as u32, direct);
        let path = dir.path().join("ns0.img");
        let resize = |len: u64| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(len)
                .unwrap()
        };
        let file_len = || std::fs::metadata(&path).unwrap().len();
        let old = be.num_blocks();
        assert_eq!(old, 256);
        let mut q = be.clone().create_queue(4).unwrap();
        let before: Vec<u8> = (0..4).flat_map(|i| pattern(i, 1, BS)).collect();
        assert_eq!(write(&mut *q, BS, 0, &before, false), IoStatus::Ok);
        assert_eq!(be.grow(None).unwrap(), old, "nothing changed");

        // Truncated bigger from outside: unchanged until asked, then the new size.
        resize(4 << 20);
        assert_eq!(be.num_blocks(), old);
        let new = be.grow(None).unwrap();
        assert_eq!(new, 1024);
        assert_eq!(be.num_blocks(), new);
        serves_grown_range(&mut *q, BS, old, new, &before);

        // The configuration asks for more: the file is extended.
        assert_eq!(be.grow(Some(8 << 20)).unwrap(), 2048);
        assert_eq!(file_len(), 8 << 20);
        let last = pattern(2047, 4, BS);
        assert_eq!(write(&mut *q, BS, 2047, &last, false), IoStatus::Ok);
        assert_eq!(read(&mut *q, BS, 2047, 1), last);
        // Less than the file holds: nothing to do. Not whole blocks: the file gets the
        // bytes, the namespace the whole blocks.
        assert_eq!(be.grow(Some(1 << 20)).unwrap(), 2048);
        assert_eq!(be.grow(Some((8 << 20) + 6000)).unwrap(), 2049);
        assert_eq!(file_len(), (8 << 20) + 6000);

        // Truncated below the namespace: an error that says so, and nothing changes (the
        // file is not extended back over the lost data either).
        resize(2 << 20);
        for to in [None, Some(16 << 20)] {
            let e = be.grow(to).unwrap_err().to_string();
            assert!(e.contains("cannot shrink"), "{e}");
            assert_eq!(be.num_blocks(), 2049);
            assert_eq!(file_len(), 2 << 20);
        }
    }
}

/// Huge sizes are errors, never a panic or a wrap-around; an odd size reaches the file,
/// and the namespace gets the whole blocks of it.
#[test]
fn grow_rejects_huge_sizes_and_rounds_odd_ones_down() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.img");
    std::fs::write(&p, vec![0u8; 1 << 20]).unwrap();
    let fb = FileBackend::open(&p, FileOptions::default()).unwrap();
    let nb = fb.num_blocks();
    for s in [u64::MAX, 1 << 63] {
        assert!(fb.grow(Some(s)).is_err(), "{s}");
        assert_eq!(fb.num_blocks(), nb);
    }
    let got = fb.grow(Some((2 << 20) + 100)).unwrap();
    assert_eq!(got, (2 << 20) / u64::from(fb.block_size()));
    assert_eq!(std::fs::metadata(&p).unwrap().len(), (2 << 20) + 100);
}
