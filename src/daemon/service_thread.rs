//! The daemon's helper threads that run for the life of the process (the DH threads, the
//! PTPL file's writer): each is counted while it runs, and the main loop stops the daemon
//! when one is gone, as it does for an IO thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::shared::Shared;

/// Spawns thread `name`, which runs `run` with the shared state and is counted in the
/// counter `count` picks out of it until it ends (only by panicking: `run` never
/// returns). `what` names it in the panic's log line.
pub(super) fn spawn(
    shared: &Arc<Shared>,
    name: String,
    what: &'static str,
    count: fn(&Shared) -> &AtomicUsize,
    run: fn(&Shared),
) -> std::io::Result<()> {
    count(shared).fetch_add(1, Ordering::SeqCst);
    let mine = shared.clone();
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let _alive = Alive(count(&mine), what);
        run(&mine)
    });
    if let Err(e) = spawned {
        count(shared).fetch_sub(1, Ordering::SeqCst);
        return Err(e);
    }
    Ok(())
}

/// Counts a thread out when it ends.
struct Alive<'a>(&'a AtomicUsize, &'static str);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!(
                "{} panicked: stopping the daemon (exit status 1, so the service manager \
                 restarts it)",
                self.1
            );
        }
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
