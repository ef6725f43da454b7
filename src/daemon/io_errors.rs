//! Commands the engine failed by itself (`sta::Event::CommandFailed`): the target never
//! saw them, so they go into their controllers' Error Information logs here, and the
//! ones the storage failed (a media error, a full file system, a drive's own status) are
//! logged with the namespace, the block and who sent them.
//!
//! A host can make the engine fail commands as fast as it sends them (reads past the
//! end, say), so each IO thread gathers one pass's failures and takes the target's lock
//! once for them, and its log lines are bounded: at most one per [`LOG_EVERY`], which
//! says how many it did not print.

use std::time::{Duration, Instant};

use nvmf::spec::opcodes::io;
use nvmf::target::{CommandError, QueueRef};
use sta::{CommandFailure, IoContext, LogEvery, QpHandle};

use super::io_thread::IoThread;

/// At most one storage-error line per IO thread this often.
pub(super) const LOG_EVERY: Duration = Duration::from_secs(10);

/// One IO thread's failures of the current pass (with their queue as it was when the
/// failure came: a disconnect later in the pass does not lose it) and its log bound.
pub(super) struct Failures {
    pass: Vec<(QpHandle, Option<QueueRef>, CommandFailure)>,
    /// Storage-error lines: at most one per [`LOG_EVERY`].
    lines: LogEvery,
}

impl Default for Failures {
    fn default() -> Self {
        Failures {
            pass: Vec::new(),
            lines: LogEvery::new(LOG_EVERY),
        }
    }
}

impl Failures {
    pub fn push(&mut self, qp: QpHandle, queue: Option<QueueRef>, f: CommandFailure) {
        self.pass.push((qp, queue, f));
    }

    pub fn is_empty(&self) -> bool {
        self.pass.is_empty()
    }
}

/// An I/O opcode's name, for log lines.
pub(super) fn io_opcode_name(op: u8) -> String {
    match op {
        io::FLUSH => "Flush".into(),
        io::WRITE => "Write".into(),
        io::READ => "Read".into(),
        io::WRITE_UNCORRECTABLE => "Write Uncorrectable".into(),
        io::COMPARE => "Compare".into(),
        io::WRITE_ZEROES => "Write Zeroes".into(),
        io::DATASET_MANAGEMENT => "Dataset Management".into(),
        io::VERIFY => "Verify".into(),
        io::COPY => "Copy".into(),
        _ => format!("opcode {op:#04x}"),
    }
}

impl<I: IoContext> IoThread<I> {
    /// The pass's failures into their controllers' Error Information logs (one lock),
    /// and the storage's failures logged (bounded, see the module).
    pub(super) fn record_failures(&mut self) {
        let pass = std::mem::take(&mut self.failures.pass);
        let errors: Vec<(QueueRef, CommandError)> = pass
            .iter()
            .filter_map(|(_, q, f)| Some(((*q)?, f.error)))
            .collect();
        if !errors.is_empty() {
            self.shared.target().record_engine_errors(&errors);
        }
        let now = Instant::now();
        let debug = tracing::enabled!(tracing::Level::DEBUG);
        for (qp, _, f) in pass.iter().filter(|(_, _, f)| f.from_backend) {
            // A failing disk fails many commands at once: words only for a line printed.
            let quiet = self.failures.lines.admit(now);
            if quiet.is_none() && !debug {
                continue;
            }
            let e = &f.error;
            let what = format!(
                "{}{} of namespace {}",
                io_opcode_name(f.opcode),
                e.lba.map_or_else(String::new, |l| format!(" at LBA {l}")),
                e.nsid
            );
            let status = e
                .status
                .name()
                .map_or_else(|| e.status.to_string(), |n| format!("{n} ({})", e.status));
            tracing::debug!(
                qp = qp.as_u64(),
                cid = e.cid,
                "io{}: {what} failed in its backend: {status}",
                self.index,
            );
            let Some(quiet) = quiet else {
                continue;
            };
            let c = self.shared.conn(super::shared::queue_key(self.index, *qp));
            let more = if quiet > 0 {
                format!(
                    " ({quiet} more storage error(s) on this IO thread since the last such \
                     line, not logged)"
                )
            } else {
                String::new()
            };
            tracing::warn!(
                "I/O error: {what} failed in its backend: {status} (command {} from {}){more}; \
                 the host got this status, and the command is in its controller's Error \
                 Information log",
                e.cid,
                self.who(*qp, c.as_ref()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_names() {
        assert_eq!(io_opcode_name(io::READ), "Read");
        assert_eq!(io_opcode_name(0x7e), "opcode 0x7e");
    }
}
