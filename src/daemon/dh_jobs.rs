//! DH-HMAC-CHAP's arithmetic on threads of its own.
//!
//! A DH key pair or shared secret costs up to tens of milliseconds (FFDHE-8192). Done where
//! the Authentication Send arrives, it stalled the IO thread that carries every other
//! queue of that thread, under the target's lock that every Connect needs. The target
//! leaves it as a job instead (`nvmf::target::DhJob`); the IO thread hands the job here and
//! goes on, and a DH thread runs it, gives the result to the target and routes the
//! completion of the held Send back to the queue's IO thread.
//!
//! Bounds: a queue has at most one job out (the target refuses a second authentication
//! command meanwhile), so the jobs of live queues are bounded by the connections the
//! limits allow; a job whose queue went, or whose transaction started over, is skipped
//! unrun when its turn comes, and an address's abandoned and restarted transactions are
//! throttled (the target's strikes). Jobs are served one address at a time in turn, so an
//! address with many jobs waiting delays another address's by at most one job each round.
//! The wait is the target's: the host's authentication deadlines do not run while its job
//! is out. A DH thread that panics stops the daemon, as an IO thread does.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use nvmf::target::DhJob;

use super::shared::Shared;

/// How many DH threads run jobs.
pub(super) const DH_THREADS: usize = 2;

/// The jobs waiting, by address, and what became of the others.
#[derive(Default)]
pub(super) struct DhQueue {
    waiting: Mutex<Turns<DhJob>>,
    ready: Condvar,
    /// Jobs run.
    run: AtomicU64,
    /// Jobs skipped because nobody waited for them any more.
    skipped: AtomicU64,
    /// DH threads running.
    alive: AtomicUsize,
}

/// Round robin over addresses: `turns` holds each address with jobs once.
struct Turns<T> {
    turns: VecDeque<Option<IpAddr>>,
    jobs: HashMap<Option<IpAddr>, VecDeque<T>>,
    len: usize,
}

impl<T> Default for Turns<T> {
    fn default() -> Self {
        Turns {
            turns: VecDeque::new(),
            jobs: HashMap::new(),
            len: 0,
        }
    }
}

impl<T> Turns<T> {
    fn push(&mut self, peer: Option<IpAddr>, job: T) {
        let q = self.jobs.entry(peer).or_default();
        if q.is_empty() {
            self.turns.push_back(peer);
        }
        q.push_back(job);
        self.len += 1;
    }

    /// The next address's oldest job; the address goes to the back of the line if it
    /// has more.
    fn pop(&mut self) -> Option<T> {
        let peer = self.turns.pop_front()?;
        let q = self.jobs.get_mut(&peer)?;
        let job = q.pop_front();
        if q.is_empty() {
            self.jobs.remove(&peer);
        } else {
            self.turns.push_back(peer);
        }
        self.len -= usize::from(job.is_some());
        job
    }
}

impl DhQueue {
    pub fn push(&self, jobs: Vec<DhJob>) {
        if jobs.is_empty() {
            return;
        }
        let mut w = crate::lock(&self.waiting);
        for j in jobs {
            w.push(j.peer, j);
        }
        drop(w);
        self.ready.notify_all();
    }

    fn pop(&self) -> DhJob {
        let mut w = crate::lock(&self.waiting);
        loop {
            if let Some(j) = w.pop() {
                return j;
            }
            w = self.ready.wait(w).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// DH threads still running (fewer than [`DH_THREADS`]: one panicked).
    pub fn alive(&self) -> usize {
        self.alive.load(Ordering::SeqCst)
    }

    /// Jobs waiting now, jobs run, jobs skipped.
    pub fn counts(&self) -> (u64, u64, u64) {
        let waiting = crate::lock(&self.waiting).len;
        (
            waiting as u64,
            self.run.load(Ordering::Relaxed),
            self.skipped.load(Ordering::Relaxed),
        )
    }
}

/// Start the DH threads. They wait on the queue for the life of the process.
pub(super) fn spawn(shared: &Arc<Shared>) -> std::io::Result<()> {
    for i in 0..DH_THREADS {
        super::service_thread::spawn(
            shared,
            format!("nvmft-dh{i}"),
            "a DH thread",
            |s| &s.dh.alive,
            run,
        )?;
    }
    Ok(())
}

/// How much nicer the DH threads run than the IO threads (which keep the daemon's own
/// nice value): DH work a peer causes (FFDHE-8192 costs about 25 ms a job) takes a
/// contended CPU from them at most about a tenth of the time (CFS weights 110 against
/// 1024 at nice 0), yet still runs when every core is busy.
pub const DH_NICE: i32 = 10;

#[allow(unsafe_code)]
fn lower_priority() {
    // SAFETY: getpriority and setpriority have no memory preconditions; on Linux,
    // PRIO_PROCESS with who 0 reads or changes the calling thread only (getpriority
    // returns the nice value itself with the glibc wrapper).
    let now = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let nice = (now + DH_NICE).min(19);
    // SAFETY: as above.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if rc != 0 {
        tracing::warn!(
            "a DH thread could not lower its priority to nice {nice}: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn run(shared: &Shared) {
    lower_priority();
    // Challenges' DH private keys come from the kernel's generator, as the target's own
    // entropy does (getrandom(2) fails only on kernels older than 3.17).
    let mut entropy = |buf: &mut [u8]| {
        getrandom::getrandom(buf).expect("the operating system's random generator failed")
    };
    loop {
        let job = shared.dh.pop();
        if !shared.target().dh_wanted(&job.id) {
            shared.dh.skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let done = job.work.run(&mut entropy);
        shared.dh.run.fetch_add(1, Ordering::Relaxed);
        let (actions, notices) = {
            let mut t = shared.target();
            (t.dh_done(job.id, done, Instant::now()), t.take_notices())
        };
        shared.report_notices(notices);
        shared.route(actions);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Addresses take turns: one with many jobs waiting does not keep another's waiting
    /// behind all of them.
    #[test]
    fn addresses_take_turns() {
        let a: Option<IpAddr> = Some("10.0.0.1".parse().unwrap());
        let b: Option<IpAddr> = Some("10.0.0.2".parse().unwrap());
        let mut t = Turns::default();
        for n in 0..5 {
            t.push(a, ('a', n));
        }
        t.push(b, ('b', 0));
        t.push(None, ('-', 0));
        t.push(b, ('b', 1));
        assert_eq!(t.len, 8);
        let order: Vec<(char, i32)> = std::iter::from_fn(|| t.pop()).collect();
        assert_eq!(
            order,
            [
                ('a', 0),
                ('b', 0),
                ('-', 0),
                ('a', 1),
                ('b', 1),
                ('a', 2),
                ('a', 3),
                ('a', 4)
            ]
        );
        assert_eq!(t.len, 0);
        assert!(t.jobs.is_empty() && t.turns.is_empty());
    }
}
