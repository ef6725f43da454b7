//! Helpers shared by the loopback measurement examples (`loopback_floor`, `splice_send`,
//! `uring_sockets`), included by each with `#[path = "common/measure.rs"] mod measure;`.
//! Each example uses a part of them.
#![allow(dead_code)]

use std::io::{ErrorKind, Write};
use std::net::TcpStream;

/// Pins the calling thread to CPU `cpu`.
pub fn pin(cpu: usize) -> std::io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(std::io::Error::from)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(std::io::Error::from)
}

/// CPU time (user + system) the calling thread has used, seconds.
pub fn thread_cpu() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    let u = getrusage(UsageWho::RUSAGE_THREAD).expect("getrusage of this thread");
    let s = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 * 1e-6;
    s(u.user_time()) + s(u.system_time())
}

/// The median of `v` (the mean of the two middle values for an even count); sorts `v`.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Writes everything, spinning on WouldBlock (non-blocking sockets whose peer drains
/// them).
pub fn write_all(s: &mut TcpStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match s.write(buf) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                std::hint::spin_loop()
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
