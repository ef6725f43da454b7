//! The main thread's loop: wait (at most 100 ms) for a TCP connection or a signal, then
//! accept, reload on SIGHUP, answer the control socket, run the keep-alive timers, drain
//! the engine's main events and feed the systemd watchdog. Returns why it stopped.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use nvmf::target::Action;
use sta::Engine;

use super::control::ControlHook;
use super::runtime::Runtime;
use super::shared::Shared;
use super::IoThreadSet;

/// How often the keep-alive timers run (and how long the loop sleeps at most).
const TICK: Duration = Duration::from_millis(100);

pub(super) fn serve<E: Engine>(
    rt: &mut Runtime<E>,
    sfd: &SignalFd,
    ctl: &mut ControlHook,
    threads: &IoThreadSet,
) -> String {
    let mut watchdog = crate::notify::Watchdog::from_env();
    let mut next_timer = Instant::now();
    loop {
        wait(rt, sfd);
        match sfd.read_signal() {
            Ok(Some(si)) => match Signal::try_from(si.ssi_signo as i32) {
                Ok(Signal::SIGHUP) => {
                    tracing::info!("SIGHUP: reloading");
                    // Logged as it is applied; the control socket's copy of the running
                    // text follows a successful load.
                    let _ = ctl.reload(rt);
                }
                Ok(s) => return format!("{s:?}"),
                // Only the three signals of the mask reach the signalfd.
                Err(e) => tracing::warn!("signalfd: unknown signal {}: {e}", si.ssi_signo),
            },
            Ok(None) => {}
            Err(e) => tracing::warn!("signalfd read: {e}"),
        }
        rt.listeners.accept(&rt.shared);
        ctl.serve_pending(rt);
        let now = Instant::now();
        if now >= next_timer {
            next_timer = now + TICK;
            keep_alive_timers(&rt.shared, now);
            rt.drive_health();
        }
        rt.engine_events();
        if threads.alive() < threads.count() {
            return "an IO thread exited".to_string();
        }
        if rt.shared.dh.alive() < super::dh_jobs::DH_THREADS {
            return "a DH thread exited".to_string();
        }
        if rt.shared.ptpl.as_ref().is_some_and(|w| !w.alive()) {
            return "the reservation state file's writer exited".to_string();
        }
        // Fed only while every IO thread is still making passes.
        if let Some(w) = watchdog.as_mut() {
            w.tick(Instant::now(), &rt.shared.stats, threads.count());
        }
    }
}

/// Until a TCP listener or the signalfd is readable, or [`TICK`] has passed.
fn wait<E: Engine>(rt: &Runtime<E>, sfd: &SignalFd) {
    let mut fds: Vec<PollFd> = rt
        .listeners
        .tcp_fds()
        .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
        .collect();
    fds.push(PollFd::new(sfd.as_fd(), PollFlags::POLLIN));
    match nix::poll::poll(&mut fds, PollTimeout::from(TICK.as_millis() as u16)) {
        // EINTR: the loop comes round again at once.
        Ok(_) | Err(nix::errno::Errno::EINTR) => {}
        Err(e) => {
            // Not expected with valid descriptors; do not spin if it repeats.
            tracing::warn!("poll: {e}");
            std::thread::sleep(TICK);
        }
    }
}

/// Keep-alive expiry and the refusal log's window.
fn keep_alive_timers(shared: &Shared, now: Instant) {
    let (actions, notices) = {
        let mut t = shared.target();
        (t.poll_timeouts(now), t.take_notices())
    };
    let expired = !notices.0.is_empty();
    shared.report_notices(notices);
    if expired {
        for a in &actions {
            if let Action::Disconnect { queue, .. } = a {
                tracing::info!(
                    "keep-alive expired: controller {} queue {} torn down",
                    queue.cntlid,
                    queue.qid
                );
            }
        }
    }
    shared.route(actions);
    shared.refusals.flush();
}
