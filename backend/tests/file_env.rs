//! File backend tests that need something of the machine: a tmpfs (/dev/shm), a loop
//! device (losetup, root), mounting a small tmpfs (root). Without it a test is SKIPPED
//! (`common/skip.rs`), never passed.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use backend::{Backend, FileBackend, FileOptions, IoStatus};
use common::*;

const SHM: &str = "/dev/shm";

fn modes() -> Vec<Option<bool>> {
    vec![Some(false), None]
}

fn main() {
    let tmpfs = tempfile::tempdir_in(SHM)
        .err()
        .map(|e| format!("no writable {SHM}: {e}"));
    let tmpfs_probe = tmpfs.clone();
    let loopdev = match Command::new("losetup").arg("--find").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "losetup --find: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("cannot run losetup: {e}")),
    };
    // /proc/self belongs to the process's effective user.
    let root =
        std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0);
    let small_tmpfs = loopdev
        .clone()
        .or_else(|| (!root).then(|| "mounting a tmpfs needs root".to_string()));
    skip::run(vec![
        skip::trial("on_tmpfs", tmpfs.clone(), on_tmpfs),
        skip::trial(
            "allocated_file_on_tmpfs_is_a_store",
            tmpfs.clone(),
            mapped_on_tmpfs,
        ),
        skip::trial(
            "a_mapped_file_is_served_where_io_uring_is_blocked",
            tmpfs.clone(),
            mapped_without_io_uring,
        ),
        skip::trial(
            "a_failed_write_fails_alone_and_only_writeback_errors_latch",
            tmpfs,
            failed_writes_on_tmpfs,
        ),
        skip::trial(
            "a_mapped_file_grows_and_stays_mapped",
            tmpfs_probe.clone(),
            mapped_file_grows,
        ),
        skip::trial(
            "a_mapped_file_grows_while_its_gone_check_runs",
            tmpfs_probe.clone(),
            mapped_gone_check_races_grow,
        ),
        skip::trial(
            "a_mapped_file_on_a_full_tmpfs_does_not_grow_and_stays_whole",
            small_tmpfs.clone(),
            mapped_grow_on_a_full_tmpfs,
        ),
        skip::trial(
            "block_device_grows_via_loop",
            loopdev.clone(),
            block_device_grows_via_loop,
        ),
        skip::trial("block_device_via_loop", loopdev, block_device_via_loop),
        skip::trial(
            "writeback_error_fails_every_flush_on_every_queue",
            small_tmpfs.clone(),
            writeback_error_fails_every_flush_on_every_queue,
        ),
        skip::trial(
            "a_fua_write_without_room_on_ext4_leaves_flush_working",
            small_tmpfs.clone(),
            fua_write_without_room_on_ext4,
        ),
        skip::trial(
            "a_failed_sync_of_an_inline_fua_write_latches",
            tmpfs_probe.clone(),
            failed_sync_of_an_inline_fua_write_latches,
        ),
        skip::trial(
            "a_fua_write_that_meets_a_writeback_error_latches",
            small_tmpfs,
            a_fua_write_that_meets_a_writeback_error_latches,
        ),
    ]);
}

/// The same checks on tmpfs (/dev/shm), whose fallocate and O_DIRECT support differ
/// from ext4's.
fn on_tmpfs() {
    let dir = tempfile::tempdir_in(SHM).expect("the probe found /dev/shm writable");
    for direct in modes() {
        let path = dir.path().join(format!("ns-{direct:?}.img"));
        let opts = FileOptions {
            create_size: Some(16 << 20),
            block_size: Some(4096),
            direct,
        };
        let be = FileBackend::open(&path, opts).unwrap();
        eprintln!("tmpfs: direct={}", be.is_direct());
        // tmpfs cannot do non-blocking I/O, so io_uring would hand every request to a
        // worker thread: the queue copies inline instead (and every check below runs
        // through that path).
        assert!(be.is_inline(), "a file on tmpfs is served inline");
        assert!(!be.is_mapped(), "a sparse file on tmpfs is not mapped");
        two_queues_two_threads(be.clone());
        fua_flush_zeroes_dealloc(be.clone());
        bad_requests(be);
        let small = dir.path().join(format!("shrink-{direct:?}.img"));
        let opts = FileOptions {
            create_size: Some(1 << 20),
            block_size: Some(4096),
            direct,
        };
        reads_past_a_shrunk_end(FileBackend::open(&small, opts).unwrap(), &small);
    }
}

/// Blocks `io_uring_setup` for the calling thread (and threads it starts) with a seccomp
/// filter that answers `EPERM`, as container runtimes' default profiles do.
fn block_io_uring_in_this_thread() {
    fail_syscall_in_this_thread(libc::SYS_io_uring_setup, libc::EPERM);
}

/// From now on, syscall `nr` fails with `errno` in the calling thread (and threads it
/// starts), through a seccomp filter; there is no way back, so call it in a thread of
/// its own.
#[allow(unsafe_code)]
fn fail_syscall_in_this_thread(nr: libc::c_long, errno: i32) {
    use libc::{sock_filter, sock_fprog, BPF_ABS, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let nr = nr as u32;
    let filter = [
        // A = seccomp_data.nr
        sock_filter {
            code: (BPF_LD | BPF_W | BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: (BPF_JMP | BPF_JEQ | BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: nr,
        },
        sock_filter {
            code: (BPF_RET | BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | errno as u32,
        },
        sock_filter {
            code: (BPF_RET | BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let prog = sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: plain prctl calls; `prog` points to a valid filter that outlives the call
    // (the kernel copies it).
    unsafe {
        assert_eq!(
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
            0,
            "no_new_privs"
        );
        let rc = libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const sock_fprog,
        );
        assert_eq!(rc, 0, "seccomp filter: {}", std::io::Error::last_os_error());
    }
}

/// Where io_uring is blocked (seccomp in a container, kernel.io_uring_disabled), a file
/// namespace in memory that is mapped still works: its queue needs no ring (Flush is an
/// inline fdatasync). A sparse file's queue, which does need one, fails with the hint.
fn mapped_without_io_uring() {
    use backend::{IoBuf, IoStatus, Op};
    const SIZE: u64 = 4 << 20;
    let dir = tempfile::tempdir_in(SHM).expect("the probe found /dev/shm writable");
    let full = dir.path().join("full.img");
    std::fs::write(&full, vec![0u8; SIZE as usize]).unwrap();
    let sparse = dir.path().join("sparse.img");
    // The filter stays with the thread: a thread of its own, so no other test gets it.
    std::thread::spawn(move || {
        block_io_uring_in_this_thread();
        let opts = FileOptions {
            create_size: Some(SIZE),
            block_size: Some(4096),
            direct: None,
        };
        let be = FileBackend::open(&sparse, opts).unwrap();
        assert!(!be.is_mapped());
        let e = be.create_queue(8).err().expect("io_uring is not blocked");
        assert!(e.to_string().contains("io_uring"), "{e}");

        let opts = FileOptions {
            create_size: None,
            block_size: Some(4096),
            direct: None,
        };
        let be = FileBackend::open(&full, opts).unwrap();
        assert!(be.is_mapped());
        let mut q = be
            .clone()
            .create_queue(8)
            .expect("a mapped file's queue needs io_uring");
        let data = pattern(3, 1, 16384);
        assert_eq!(write(&mut *q, 4096, 10, &data, false), IoStatus::Ok);
        assert_eq!(write(&mut *q, 4096, 20, &data, true), IoStatus::Ok);
        assert_eq!(run(&mut *q, Op::Flush, 0, 0, None).status, IoStatus::Ok);
        assert_eq!(read(&mut *q, 4096, 10, 4), data);
        assert_eq!(read(&mut *q, 4096, 20, 4), data);
        let c = run(&mut *q, Op::WriteZeroes { fua: true }, 10, 4, None);
        assert_eq!(c.status, IoStatus::Ok);
        assert_eq!(read(&mut *q, 4096, 10, 4), vec![0; 16384]);
        let c = run(&mut *q, Op::Read, 0, 1, Some(IoBuf::new(4096)));
        assert_eq!(c.status, IoStatus::Ok);
        drop(q);
        fua_flush_zeroes_dealloc(be);
    })
    .join()
    .expect("the test thread panicked");
}

/// A write that fails fails alone (audit F1, F8, F3). A file on tmpfs is served inline
/// with `pwrite` and `fdatasync` (see `on_tmpfs`), so a seccomp filter on `pwrite64` in
/// the queue's thread makes its writes fail with any errno, as a real store would:
///
/// - no errno but a vanished device takes the store out (`Unavailable`): reads and
///   Flush keep working after a refused (`EPERM`), full (`ENOSPC`), transient or unknown
///   failure;
/// - a write without room is Capacity Exceeded (`NoSpace`);
/// - a FUA write that failed before storing anything does not make later Flushes fail,
///   while one that failed with `EIO` on a buffered file does (its sync may have
///   consumed another page's writeback error), as does any errno that does not say the
///   write was refused before it stored anything.
fn failed_writes_on_tmpfs() {
    use backend::{IoStatus, Op};
    let dir = tempfile::tempdir_in(SHM).expect("the probe found /dev/shm writable");
    let cases = [
        (libc::EPERM, IoStatus::Refused, false),
        (libc::EROFS, IoStatus::Refused, false),
        (libc::ENOSPC, IoStatus::NoSpace, false),
        (libc::EDQUOT, IoStatus::NoSpace, false),
        (libc::EFBIG, IoStatus::NoSpace, false),
        (libc::EAGAIN, IoStatus::Busy, false),
        (libc::ENOMEM, IoStatus::Busy, false),
        // A buffered sync that timed out below may have lost dirty pages: it latches.
        (libc::ETIMEDOUT, IoStatus::Busy, true),
        (libc::EINVAL, IoStatus::Failed, false),
        (libc::EIO, IoStatus::WriteFault, true),
    ];
    for (i, (errno, want, latches)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("ns{i}.img"));
        std::thread::spawn(move || {
            let (be, mut q) = inline_queue(&path);
            let data = pattern(1, 1, 4096);
            assert_eq!(write(&mut *q, 4096, 0, &data, false), IoStatus::Ok);
            fail_syscall_in_this_thread(libc::SYS_pwrite64, errno);
            let other = pattern(2, 1, 4096);
            let plain = write(&mut *q, 4096, 1, &other, false);
            let fua = write(&mut *q, 4096, 1, &other, true);
            assert_eq!((plain, fua), (want, want), "errno {errno}");
            assert!(!be.is_gone(), "errno {errno}: the store is still there");
            assert_eq!(read(&mut *q, 4096, 0, 1), data, "errno {errno}");
            let flush = run(&mut *q, Op::Flush, 0, 0, None).status;
            if latches {
                assert_eq!(flush, IoStatus::WriteFault, "errno {errno}: latched");
                assert!(be.flush_sync().is_err());
            } else {
                assert_eq!(flush, IoStatus::Ok, "errno {errno}: nothing to latch");
                assert!(be.flush_sync().is_ok());
            }
        })
        .join()
        .expect("the test thread panicked");
    }
}

/// Whether the file at `path` has every one of its `len` bytes allocated.
fn allocated(path: &std::path::Path, len: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512 >= len
}

/// A file on tmpfs written in full is served as a store over its pages: the queue
/// offers it for lending, every request goes through it (same checks as any file),
/// zeroing keeps the file allocated, and the bytes it lends are the file's. A file that
/// shrinks or is deleted under it makes the queue say it is gone, and the store's own
/// copies then fail instead of faulting.
fn mapped_on_tmpfs() {
    use backend::{IoBuf, IoStatus, Op};
    use std::os::unix::fs::FileExt;
    const SIZE: u64 = 16 << 20;
    let dir = tempfile::tempdir_in(SHM).expect("the probe found /dev/shm writable");
    for direct in modes() {
        let path = dir.path().join(format!("full-{direct:?}.img"));
        std::fs::write(&path, vec![0u8; SIZE as usize]).unwrap();
        let opts = FileOptions {
            create_size: None,
            block_size: Some(4096),
            direct,
        };
        let be = FileBackend::open(&path, opts.clone()).unwrap();
        assert!(be.is_mapped(), "an allocated file on tmpfs is mapped");
        two_queues_two_threads(be.clone());
        fua_flush_zeroes_dealloc(be.clone());
        bad_requests(be.clone());
        long_zeroing_is_done_a_step_per_poll(be.clone(), ((SIZE / 2) / 4096) as u32 + 1);
        readers_never_see_a_torn_block(be.clone());
        assert!(allocated(&path, SIZE), "zeroing punched a hole in the file");

        // Written through a queue: in the file, and lent as the file's bytes.
        let mut q = be.clone().create_queue(8).unwrap();
        let data = pattern(5, 1, 8192);
        assert_eq!(write(&mut *q, 4096, 5, &data, false), IoStatus::Ok);
        let mut in_file = vec![0; 8192];
        std::fs::File::open(&path)
            .unwrap()
            .read_exact_at(&mut in_file, 5 * 4096)
            .unwrap();
        assert_eq!(in_file, data, "a write did not reach the file");
        let store = q.ram_store().expect("the queue offers its store");
        let (off, len) = store.byte_range(5, 2).unwrap();
        let mut set = backend::ram::LendSet::default();
        assert!(set.add(off, len));
        assert!(store.lend(&set, |l| l.bytes(off, len) == Some(&data[..])));
        assert!(!q.check_gone());

        // Shrunk under the store: gone at the next check, no SIGBUS anywhere.
        let mut q = be.clone().create_queue(8).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(SIZE / 2)
            .unwrap();
        let (off, len) = store.byte_range(3000, 2).unwrap();
        let mut set = backend::ram::LendSet::default();
        assert!(set.add(off, len));
        store.lend(&set, |l| {
            let mut buf = vec![0; len];
            assert!(!l.copy_to(off, &mut buf), "a copy past the end succeeded");
            // The kernel reading the mapping past the end fails the call (EFAULT).
            let (_rx, mut tx) = std::io::pipe().unwrap();
            let e = std::io::Write::write(&mut tx, l.bytes(off, 4096).unwrap()).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
        });
        assert!(q.check_gone(), "a shrunk mapped file is not gone");
        assert!(be.is_gone());
        let c = run(&mut *q, Op::Read, 0, 1, Some(IoBuf::new(4096)));
        assert_eq!(c.status, IoStatus::Unavailable);
        drop((q, store, be));

        // Deleted: gone at the next check.
        std::fs::write(&path, vec![0u8; SIZE as usize]).unwrap();
        let be = FileBackend::open(&path, opts.clone()).unwrap();
        assert!(be.is_mapped());
        let mut q = be.clone().create_queue(8).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(q.check_gone(), "a deleted mapped file is not gone");

        // Pages freed under the store (a hole punched from outside): gone.
        std::fs::write(&path, vec![0u8; SIZE as usize]).unwrap();
        let be = FileBackend::open(&path, opts.clone()).unwrap();
        assert!(be.is_mapped());
        let mut q = be.clone().create_queue(8).unwrap();
        assert!(!q.check_gone());
        sh(
            "fallocate",
            &[
                "--punch-hole",
                "-o",
                "0",
                "-l",
                "65536",
                path.to_str().unwrap(),
            ],
        )
        .unwrap();
        assert!(
            q.check_gone(),
            "a mapped file with a hole punched is not gone"
        );
        drop((q, be));

        // A sparse file whose blocks were reserved past its end (its block count looks
        // full): the namespace's pages are reserved at open, or it is not mapped.
        let odd = dir.path().join(format!("reserved-past-end-{direct:?}.img"));
        let odd_str = odd.to_str().unwrap();
        sh("truncate", &["-s", &SIZE.to_string(), odd_str]).unwrap();
        sh(
            "fallocate",
            &[
                "-n",
                "-o",
                &SIZE.to_string(),
                "-l",
                &SIZE.to_string(),
                odd_str,
            ],
        )
        .unwrap();
        let be = FileBackend::open(&odd, opts.clone()).unwrap();
        if be.is_mapped() {
            assert!(
                allocated(&odd, 2 * SIZE),
                "mapped with holes in the namespace"
            );
        }
        drop(be);

        // Reserved with fallocate (never written): mapped too, and reads zeroes.
        let reserved = dir.path().join(format!("fallocated-{direct:?}.img"));
        let out = Command::new("fallocate")
            .args(["-l", &SIZE.to_string()])
            .arg(&reserved)
            .output()
            .expect("run fallocate (util-linux)");
        assert!(out.status.success(), "fallocate: {out:?}");
        let be = FileBackend::open(&reserved, opts).unwrap();
        assert!(be.is_mapped(), "a file reserved in full is not mapped");
        let mut q = be.clone().create_queue(8).unwrap();
        assert_eq!(read(&mut *q, 4096, 7, 2), vec![0; 8192]);
        let store = q.ram_store().unwrap();
        let (off, len) = store.byte_range(100, 4).unwrap();
        let mut set = backend::ram::LendSet::default();
        assert!(set.add(off, len));
        assert!(store.lend(&set, |l| l
            .bytes(off, len)
            .is_some_and(|b| b.iter().all(|&x| x == 0))));
    }
}

/// Block-device path, on a loop device over a temp file when this machine allows it.
fn block_device_via_loop() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("loop.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let out = Command::new("losetup")
        .args(["--find", "--show", "--sector-size", "512"])
        .arg(&img)
        .output();
    let o = out.expect("losetup ran for the probe");
    assert!(
        o.status.success(),
        "losetup could not attach: {}",
        String::from_utf8_lossy(&o.stderr).trim()
    );
    let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            // Best effort: a loop device left attached is harmless and visible in losetup.
            if let Err(e) = Command::new("losetup").arg("-d").arg(&self.0).status() {
                eprintln!("losetup -d {}: {e}", self.0);
            }
        }
    }
    let _guard = Detach(dev.clone());
    eprintln!("block_device_via_loop: using {dev}");
    let be = FileBackend::open(&dev, FileOptions::default()).unwrap();
    assert!(be.is_block_device());
    assert_eq!(be.block_size(), 512);
    assert_eq!(be.num_blocks(), (32 << 20) / 512);
    eprintln!("block_device_via_loop: direct={}", be.is_direct());
    // A block size below the device's logical block size is refused.
    assert!(FileBackend::open(
        &dev,
        FileOptions {
            block_size: Some(256),
            ..Default::default()
        }
    )
    .is_err());
    two_queues_two_threads(be.clone());
    fua_flush_zeroes_dealloc(be.clone());
    bad_requests(be.clone());
    let be4k = FileBackend::open(
        &dev,
        FileOptions {
            block_size: Some(4096),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(be4k.num_blocks(), (32 << 20) / 4096);
    fua_flush_zeroes_dealloc(be4k);
    be.flush_sync().unwrap();
}

/// Runs `cmd`, returning its trimmed stdout, or why it failed.
fn sh(cmd: &str, args: &[&str]) -> Result<String, String> {
    match Command::new(cmd).args(args).output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).trim().to_string()),
        Ok(o) => Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run {cmd}: {e}")),
    }
}

/// Undoes [`thin_loop_device`]: detaches the loop device and unmounts the tmpfs (best
/// effort: a leftover is visible in losetup and mount).
struct ThinLoop {
    mnt: String,
    dev: Option<String>,
}

impl Drop for ThinLoop {
    fn drop(&mut self) {
        if let Some(dev) = &self.dev {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
        // The loop device lets go of its file a moment after `losetup -d`.
        for _ in 0..40 {
            match Command::new("umount").arg(&self.mnt).output() {
                Ok(o) if o.status.success() => return,
                _ => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        }
    }
}

/// A loop device whose 64 MiB backing file sits on a 4 MiB tmpfs (under `dir`), opened
/// buffered: writes are accepted into the page cache and fail at writeback (`ENOSPC`
/// from the tmpfs), like a thin volume that ran out.
fn thin_loop_device(dir: &std::path::Path) -> (ThinLoop, std::sync::Arc<FileBackend>) {
    let mnt = dir.join("small");
    std::fs::create_dir(&mnt).unwrap();
    let mnt_s = mnt.to_str().unwrap().to_string();
    sh("mount", &["-t", "tmpfs", "-o", "size=4m", "tmpfs", &mnt_s])
        .unwrap_or_else(|e| panic!("as root, mounting a tmpfs: {e}"));
    let mut guard = ThinLoop {
        mnt: mnt_s,
        dev: None,
    };
    let img = mnt.join("thin.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let dev = sh("losetup", &["--find", "--show", img.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("losetup (the probe found it usable): {e}"));
    guard.dev = Some(dev.clone());
    let be = FileBackend::open(
        &dev,
        FileOptions {
            direct: Some(false),
            block_size: Some(4096),
            ..Default::default()
        },
    )
    .unwrap();
    (guard, be)
}

/// A writeback error (the device under a buffered backend fails after the writes were
/// accepted into the page cache) must fail every later Flush, on every IO thread's
/// queue: Linux reports it once per open file description (errseq), so queues sharing
/// one would let all but one Flush succeed over lost data. Made real with a loop device
/// whose backing file sits on a tmpfs too small for it.
fn writeback_error_fails_every_flush_on_every_queue() {
    use backend::{IoStatus, Op};
    let dir = tempfile::tempdir().unwrap();
    let (guard, be) = thin_loop_device(dir.path());
    let mut a = be.clone().create_queue(16).unwrap();
    let mut b = be.clone().create_queue(16).unwrap();
    // 16 MiB of buffered writes: accepted into the page cache, far more than the 4 MiB
    // the tmpfs can hold behind the loop device.
    let chunk = vec![0x5au8; 1 << 20];
    for i in 0..16u64 {
        assert_eq!(
            write(a.as_mut(), 4096, i * 256, &chunk, false),
            IoStatus::Ok
        );
    }
    let fa = run(a.as_mut(), Op::Flush, 0, 0, None).status;
    let fb = run(b.as_mut(), Op::Flush, 0, 0, None).status;
    assert_eq!(
        fa,
        IoStatus::WriteFault,
        "the queue that wrote sees the error"
    );
    assert_eq!(fb, IoStatus::WriteFault, "and so does every other queue");
    // The data is lost: no later Flush may say otherwise.
    let again = run(a.as_mut(), Op::Flush, 0, 0, None).status;
    assert_eq!(again, IoStatus::WriteFault, "a later Flush fails too");
    assert!(be.flush_sync().is_err(), "and so does the shutdown flush");
    drop((a, b, be, guard));
}

/// A buffered FUA write whose sync meets a writeback error must latch it: the sync
/// reports (and so consumes, for this queue's file description) the error of every dirty
/// page of the file, and a later Flush on the same queue would otherwise succeed over
/// the lost data. (The loop device reports the full tmpfs under it as `EIO`.)
fn a_fua_write_that_meets_a_writeback_error_latches() {
    use backend::{IoStatus, Op};
    let dir = tempfile::tempdir().unwrap();
    let (guard, be) = thin_loop_device(dir.path());
    let mut a = be.clone().create_queue(16).unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    for i in 0..16u64 {
        assert_eq!(
            write(a.as_mut(), 4096, i * 256, &chunk, false),
            IoStatus::Ok
        );
    }
    // Something else writes the device's dirty pages back (the kernel's flusher, or
    // here `sync` on a description of its own): the error is recorded for the device,
    // and this queue's description has not seen it yet.
    let dev = be.describe();
    let _ = Command::new("sync").arg(&dev).status();
    let fua = write(a.as_mut(), 4096, 8000, &[0x33u8; 4096], true);
    assert_ne!(fua, IoStatus::Ok, "the FUA write cannot be made durable");
    let flush = run(a.as_mut(), Op::Flush, 0, 0, None).status;
    assert_eq!(
        flush,
        IoStatus::WriteFault,
        "the FUA write ({fua:?}) met the writeback error: later Flushes fail"
    );
    drop((a, be, guard));
}

/// A FUA write that finds no room on a file system (ext4, buffered, `ENOSPC` from the
/// write itself) is Capacity Exceeded and latches nothing (audit F3, F8): Flush and FUA
/// writes to blocks that are allocated keep working. The check behind it
/// (`Step::CheckWriteback`) finds no writeback error on the backend's description.
fn fua_write_without_room_on_ext4() {
    use backend::{IoStatus, Op};
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    sh("mkfs.ext4", &["-q", "-F", img.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("mkfs.ext4: {e}"));
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mnt_s = mnt.to_str().unwrap().to_string();
    sh("mount", &["-o", "loop", img.to_str().unwrap(), &mnt_s])
        .unwrap_or_else(|e| panic!("as root, mounting an ext4 image: {e}"));
    let guard = ThinLoop {
        mnt: mnt_s,
        dev: None,
    };
    let be = FileBackend::open(
        mnt.join("ns.img"),
        FileOptions {
            create_size: Some(64 << 20),
            block_size: Some(4096),
            direct: Some(false),
        },
    )
    .unwrap();
    assert!(!be.is_inline() && !be.is_direct());
    let mut q = be.clone().create_queue(8).unwrap();
    let chunk = vec![0x11u8; 1 << 20];
    let mut full = None;
    for i in 0..64u64 {
        let st = write(q.as_mut(), 4096, i * 256, &chunk, false);
        if st != IoStatus::Ok {
            full = Some((i, st));
            break;
        }
    }
    let (i, st) = full.expect("a 16 MiB file system cannot take 64 MiB");
    assert_eq!(st, IoStatus::NoSpace, "chunk {i}");
    let fua = write(q.as_mut(), 4096, 16000, &[0x22u8; 4096], true);
    assert_eq!(
        fua,
        IoStatus::NoSpace,
        "a FUA write into unallocated blocks"
    );
    assert_eq!(
        run(q.as_mut(), Op::Flush, 0, 0, None).status,
        IoStatus::Ok,
        "nothing was lost: Flush stays good"
    );
    assert_eq!(
        write(q.as_mut(), 4096, 0, &[0x33u8; 4096], true),
        IoStatus::Ok,
        "a FUA write to allocated blocks"
    );
    assert!(be.flush_sync().is_ok());
    drop((q, be, guard));
}

/// A FUA write to a file in memory is a `pwrite` then an `fdatasync` (`inline_rw`): if
/// the write went in and the sync failed, that is a writeback error whatever the errno,
/// and it latches; here `fdatasync` fails with `ENOSPC` through a seccomp filter, as a
/// full thin store can answer at writeback.
fn failed_sync_of_an_inline_fua_write_latches() {
    use backend::{IoStatus, Op};
    let dir = tempfile::tempdir_in(SHM).expect("the probe found /dev/shm writable");
    let path = dir.path().join("ns.img");
    std::thread::spawn(move || {
        let (_be, mut q) = inline_queue(&path);
        fail_syscall_in_this_thread(libc::SYS_fdatasync, libc::ENOSPC);
        let fua = write(&mut *q, 4096, 1, &pattern(3, 1, 4096), true);
        assert_eq!(fua, IoStatus::NoSpace);
        // The Flush itself goes through io_uring, which the filter does not see.
        assert_eq!(
            run(&mut *q, Op::Flush, 0, 0, None).status,
            IoStatus::WriteFault,
            "the failed sync latched"
        );
    })
    .join()
    .expect("the test thread panicked");
}

/// A 1 MiB buffered file of 4 KiB blocks at `path` (on a tmpfs: served inline, not
/// mapped) and a queue on it.
fn inline_queue(
    path: &std::path::Path,
) -> (std::sync::Arc<FileBackend>, Box<dyn backend::BackendQueue>) {
    let opts = FileOptions {
        create_size: Some(1 << 20),
        block_size: Some(4096),
        direct: Some(false),
    };
    let be = FileBackend::open(path, opts).unwrap();
    assert!(be.is_inline() && !be.is_mapped(), "served inline");
    let q = be.clone().create_queue(4).unwrap();
    (be, q)
}

/// A mapped file on tmpfs grows: truncated bigger behind the backend, `grow(None)`
/// allocates the new range and the store serves it (a queue made before the grow, and
/// lending); the gone check does not take the grown file for a lost one; `grow(Some(n))`
/// extends and allocates; past the mapping's reserve, and below the namespace, it fails
/// and nothing changes.
fn mapped_file_grows() {
    use std::os::unix::fs::FileExt;
    const BS: usize = 4096;
    const SIZE: u64 = 1 << 20;
    let dir = tempfile::tempdir_in(SHM).expect("the probe found /dev/shm writable");
    for direct in modes() {
        let path = dir.path().join(format!("grow-{direct:?}.img"));
        std::fs::write(&path, vec![0u8; SIZE as usize]).unwrap();
        let resize = |len: u64| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(len)
                .unwrap()
        };
        let file_len = || std::fs::metadata(&path).unwrap().len();
        let opts = FileOptions {
            create_size: None,
            block_size: Some(BS as u32),
            direct,
        };
        let be = FileBackend::open(&path, opts.clone()).unwrap();
        assert!(be.is_mapped(), "an allocated file on tmpfs is mapped");
        let mut q = be.clone().create_queue(8).unwrap();
        let store = q.ram_store().expect("the queue offers its store");
        assert_eq!(store.reserved_bytes() as u64, 8 * SIZE);
        let before: Vec<u8> = (0..2).flat_map(|i| pattern(i, 1, BS)).collect();
        assert_eq!(write(&mut *q, BS, 0, &before, false), IoStatus::Ok);
        let old = be.num_blocks();

        // Truncated bigger from outside: a hole past the old end, which `grow` allocates.
        resize(4 * SIZE);
        assert!(!q.check_gone(), "a file that grew is not gone");
        let new = be.grow(None).unwrap();
        assert_eq!(new, 4 * SIZE / BS as u64);
        assert_eq!(be.num_blocks(), new);
        assert!(allocated(&path, 4 * SIZE), "the new range is not allocated");
        assert!(!q.check_gone(), "a grown mapped file is taken for gone");
        assert!(!be.is_gone());
        serves_grown_range(&mut *q, BS, old, new, &before);

        // The store lends the new range, and what it lends is the file's.
        let last = pattern(new - 1, 9, BS);
        assert!(store.byte_range(new, 1).is_none());
        let (off, len) = store.byte_range(new - 1, 1).unwrap();
        let mut set = backend::ram::LendSet::default();
        assert!(set.add(off, len));
        assert!(store.lend(&set, |l| l.bytes(off, len) == Some(&last[..])));
        let mut in_file = vec![0; BS];
        std::fs::File::open(&path)
            .unwrap()
            .read_exact_at(&mut in_file, (new - 1) * BS as u64)
            .unwrap();
        assert_eq!(in_file, last);

        // The configuration asks for more: extended and allocated.
        assert_eq!(be.grow(Some(6 * SIZE)).unwrap(), 6 * SIZE / BS as u64);
        assert_eq!(file_len(), 6 * SIZE);
        assert!(allocated(&path, 6 * SIZE));
        assert!(!q.check_gone());
        assert_eq!(read(&mut *q, BS, 6 * SIZE / BS as u64 - 1, 1), vec![0; BS]);

        // Past the reserve (8 MiB): an error that says to restart; nothing changes.
        let e = be.grow(Some(16 * SIZE)).unwrap_err().to_string();
        assert!(e.contains("restart"), "{e}");
        assert_eq!(be.num_blocks(), 6 * SIZE / BS as u64);
        assert_eq!(file_len(), 6 * SIZE);
        resize(16 * SIZE);
        assert!(be.grow(None).is_err());
        assert_eq!(be.num_blocks(), 6 * SIZE / BS as u64);
        assert!(!q.check_gone());

        // Truncated below the namespace: an error, the capacity stays (and the queue's
        // check then takes the namespace out, as for any shrunk mapped file).
        resize(2 * SIZE);
        let e = be.grow(None).unwrap_err().to_string();
        assert!(e.contains("cannot shrink"), "{e}");
        assert_eq!(be.num_blocks(), 6 * SIZE / BS as u64);
        assert!(q.check_gone());
        drop((q, store, be));

        // Pages freed in the grown range from outside: gone, as in the first part (the
        // allocated count the check compares with covers the new range too).
        std::fs::write(&path, vec![0u8; SIZE as usize]).unwrap();
        let be = FileBackend::open(&path, opts).unwrap();
        assert!(be.is_mapped());
        let mut q = be.clone().create_queue(8).unwrap();
        assert_eq!(be.grow(Some(4 * SIZE)).unwrap(), 4 * SIZE / BS as u64);
        assert!(!q.check_gone());
        let at = (3 * SIZE).to_string();
        sh(
            "fallocate",
            &[
                "--punch-hole",
                "-o",
                &at,
                "-l",
                "65536",
                path.to_str().unwrap(),
            ],
        )
        .unwrap();
        assert!(q.check_gone(), "a hole in the grown range is not seen");
    }
}

/// Detaches a loop device when dropped (best effort: a leftover shows in `losetup`).
struct LoopDevice(String);

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if let Err(e) = sh("losetup", &["-d", &self.0]) {
            eprintln!("{e}");
        }
    }
}

/// A block device that grows (its loop file extended, `losetup -c`) is picked up by
/// `grow(None)`, and a queue made before serves the new blocks; asking for more than the
/// device holds is an error.
fn block_device_grows_via_loop() {
    const BS: usize = 4096;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("grow.img");
    let img_file = std::fs::File::create(&img).unwrap();
    img_file.set_len(8 << 20).unwrap();
    let dev = sh("losetup", &["--find", "--show", img.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("losetup (the probe found it usable): {e}"));
    let _detach = LoopDevice(dev.clone());
    let be = FileBackend::open(
        &dev,
        FileOptions {
            block_size: Some(BS as u32),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(be.is_block_device());
    let old = be.num_blocks();
    assert_eq!(old, (8 << 20) / BS as u64);
    let mut q = be.clone().create_queue(4).unwrap();
    let before: Vec<u8> = (0..2).flat_map(|i| pattern(i, 1, BS)).collect();
    assert_eq!(write(&mut *q, BS, 0, &before, false), IoStatus::Ok);
    assert_eq!(be.grow(None).unwrap(), old);
    let e = be.grow(Some(16 << 20)).unwrap_err().to_string();
    assert!(e.contains("block device has"), "{e}");
    assert_eq!(be.num_blocks(), old);

    img_file.set_len(32 << 20).unwrap();
    sh("losetup", &["-c", &dev]).unwrap();
    let new = be.grow(None).unwrap();
    assert_eq!(new, (32 << 20) / BS as u64);
    assert_eq!(be.num_blocks(), new);
    serves_grown_range(&mut *q, BS, old, new, &before);
    assert_eq!(
        be.grow(Some(16 << 20)).unwrap(),
        new,
        "within the device: no change"
    );
    be.flush_sync().unwrap();
}

/// A 1 MiB file at `p` (on a memory file system), written in full and opened buffered
/// with `bs`-byte blocks: served from its pages.
fn mapped_mib(p: &std::path::Path, bs: usize) -> std::sync::Arc<FileBackend> {
    std::fs::write(p, vec![0u8; 1 << 20]).unwrap();
    let fb = FileBackend::open(
        p,
        FileOptions {
            block_size: Some(bs as u32),
            direct: Some(false),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(fb.is_mapped());
    fb
}

/// A mapped tmpfs file: the gone check runs on another thread (as an IO thread's does)
/// while the main thread grows the file step by step; it must never fire.
fn mapped_gone_check_races_grow() {
    const BS: usize = 4096;
    let dir = tempfile::tempdir_in(SHM).unwrap();
    let p = dir.path().join("m.img");
    let fb = mapped_mib(&p, BS);
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let checker = {
        let fb = fb.clone();
        let (stop, rounds) = (stop.clone(), rounds.clone());
        std::thread::spawn(move || {
            let mut q = fb.clone().create_queue(4).unwrap();
            while !stop.load(Ordering::Relaxed) {
                assert!(!q.check_gone(), "gone check fired during a grow");
                let nb = fb.num_blocks();
                assert_eq!(
                    write(&mut *q, BS, nb - 1, &pattern(nb - 1, 1, BS), false),
                    IoStatus::Ok
                );
                rounds.fetch_add(1, Ordering::AcqRel);
            }
        })
    };
    // Each grow waits for the checker to have run once more (however loaded the
    // machine), so checks and grows interleave.
    let mut size = 1u64 << 20;
    for _ in 0..100 {
        let seen = rounds.load(Ordering::Acquire);
        size += 64 << 10;
        fb.grow(Some(size)).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while rounds.load(Ordering::Acquire) == seen && !checker.is_finished() {
            assert!(std::time::Instant::now() < deadline, "the checker stalled");
            std::thread::yield_now();
        }
    }
    stop.store(true, Ordering::Relaxed);
    checker.join().expect("the checker thread");
    assert!(!fb.is_gone());
}

/// A 4 MiB tmpfs mounted under `dir` (root), unmounted when dropped.
struct SmallTmpfs(std::path::PathBuf);

impl SmallTmpfs {
    fn mount(dir: &std::path::Path) -> SmallTmpfs {
        let p = dir.join("small");
        std::fs::create_dir(&p).unwrap();
        sh(
            "mount",
            &["-t", "tmpfs", "-o", "size=4m", "tmpfs", p.to_str().unwrap()],
        )
        .unwrap_or_else(|e| panic!("as root, mounting a tmpfs: {e}"));
        SmallTmpfs(p)
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A mapped file on a full tmpfs: the grow fails with ENOSPC, and everything is as it was
/// (size, allocation, capacity, no gone); freeing space lets the next grow succeed.
fn mapped_grow_on_a_full_tmpfs() {
    const BS: usize = 4096;
    let dir = tempfile::tempdir().unwrap();
    let fs = SmallTmpfs::mount(dir.path());
    let p = fs.0.join("m.img");
    let fb = mapped_mib(&p, BS);
    let mut q = fb.clone().create_queue(4).unwrap();
    let store = q.ram_store().unwrap();
    let filler = fs.0.join("filler");
    std::fs::write(&filler, vec![1u8; 2 << 20]).unwrap();
    let blocks = |p: &std::path::Path| {
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(p).unwrap())
    };
    let (len0, blocks0, nb0) = (
        std::fs::metadata(&p).unwrap().len(),
        blocks(&p),
        fb.num_blocks(),
    );

    // Asked by the config: 3 MiB does not fit (1 MiB free).
    let e = fb.grow(Some(3 << 20)).unwrap_err().to_string();
    assert!(e.contains("cannot allocate"), "{e}");
    assert_eq!(
        std::fs::metadata(&p).unwrap().len(),
        len0,
        "file size changed"
    );
    assert_eq!(blocks(&p), blocks0, "allocation changed");
    assert_eq!(fb.num_blocks(), nb0);
    assert!(store.byte_range(nb0, 1).is_none());
    assert!(!q.check_gone(), "a failed grow took the namespace out");

    // Grown on disk (sparse) past what tmpfs can allocate: grow(None) fails too.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(3 << 20)
        .unwrap();
    assert!(fb.grow(None).is_err());
    assert_eq!(fb.num_blocks(), nb0);
    assert!(!q.check_gone());
    // The IO path still works at the old end.
    assert_eq!(
        write(&mut *q, BS, nb0 - 1, &pattern(1, 1, BS), false),
        IoStatus::Ok
    );

    // Space freed: the next reload's grow succeeds.
    std::fs::remove_file(&filler).unwrap();
    assert_eq!(fb.grow(None).unwrap(), (3 << 20) / BS as u64);
    assert!(!q.check_gone());
    let first = read(&mut *q, BS, 0, 1);
    serves_grown_range(&mut *q, BS, nb0, fb.num_blocks(), &first);
    drop((q, store, fb));
}
