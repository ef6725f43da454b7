//! What every fabrics queue tracks regardless of transport: its parameters from Fabrics
//! Connect and the submission queue head it reports in each completion (SQHD).
//!
//! NVMe-oF 1.1 section 2.4.1 ("Submission queue flow control"): the controller reports in
//! every completion how far it has consumed the submission queue, so a host can reuse SQ
//! slots. A fabrics controller consumes a capsule when it arrives, so the head is the
//! number of capsules received, modulo the queue size the host asked for in Connect
//! (SQSIZE is 0's based: the queue has SQSIZE + 1 entries). When the host disabled SQ flow
//! control (Connect CATTR bit 2), SQHD is reserved and this target reports FFFFh, as Linux
//! nvmet does (`nvmet_req_complete` sets 0xffff when `sqhd_disabled`).
//!
//! The SGL length rules every transport shares live with the offloaded commands
//! ([`crate::command`]).

use crate::spec::Cqe;

/// SQHD of every completion of a queue whose host disabled SQ flow control (Connect CATTR
/// bit 2), the completions the engine builds itself included.
pub const SQHD_FLOW_CONTROL_DISABLED: u16 = 0xffff;

/// A queue's parameters, known once Fabrics Connect has been answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueParams {
    /// Queue ID: 0 is the admin queue.
    pub qid: u16,
    /// Submission queue size, 0's based (the queue has `sqsize + 1` entries).
    pub sqsize: u16,
    /// The host disabled SQ flow control: SQHD is FFFFh in every completion.
    pub sq_flow_control_disabled: bool,
}

impl Default for QueueParams {
    /// Before Connect: an admin queue of the 32 entries every controller accepts.
    fn default() -> Self {
        QueueParams {
            qid: 0,
            sqsize: crate::target::ADMIN_QUEUE_ENTRIES - 1,
            sq_flow_control_disabled: false,
        }
    }
}

/// The submission queue head of one queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SqHead {
    params: QueueParams,
    /// Capsules received so far, modulo the queue size.
    head: u32,
}

impl SqHead {
    pub fn new() -> SqHead {
        SqHead::default()
    }

    /// Connect answered: the queue's ID, size and flow-control mode. The head keeps
    /// counting from where it is (the Connect capsule itself was the first entry).
    pub fn set_params(&mut self, p: QueueParams) {
        self.params = p;
        self.head %= self.entries();
    }

    pub fn params(&self) -> QueueParams {
        self.params
    }

    fn entries(&self) -> u32 {
        self.params.sqsize as u32 + 1
    }

    /// One more capsule was taken off the submission queue.
    pub fn capsule_received(&mut self) {
        self.head = (self.head + 1) % self.entries();
    }

    /// The SQHD value for a completion sent now.
    pub fn sqhd(&self) -> u16 {
        if self.params.sq_flow_control_disabled {
            SQHD_FLOW_CONTROL_DISABLED
        } else {
            self.head as u16
        }
    }

    /// Fill the fields of a completion that belong to the queue: SQHD and SQID.
    pub fn complete(&self, cqe: &mut Cqe) {
        cqe.sqhd = self.sqhd();
        cqe.sqid = self.params.qid;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn admin_default_wraps_at_32() {
        let mut h = SqHead::new();
        for _ in 0..31 {
            h.capsule_received();
        }
        assert_eq!(h.sqhd(), 31);
        h.capsule_received();
        assert_eq!(h.sqhd(), 0);
    }

    #[test]
    fn negotiated_admin_size_and_flow_control_off() {
        let mut h = SqHead::new();
        h.capsule_received(); // the Connect capsule
        h.set_params(QueueParams {
            qid: 0,
            sqsize: 127,
            sq_flow_control_disabled: false,
        });
        for _ in 0..40 {
            h.capsule_received();
        }
        assert_eq!(
            h.sqhd(),
            41,
            "an admin queue of 128 entries does not wrap at 32"
        );
        h.set_params(QueueParams {
            qid: 3,
            sqsize: 127,
            sq_flow_control_disabled: true,
        });
        let mut cqe = Cqe::default();
        h.complete(&mut cqe);
        assert_eq!((cqe.sqhd, cqe.sqid), (0xffff, 3));
    }

    proptest! {
        #[test]
        fn head_is_count_modulo_entries(sqsize in 1u16..1024, n in 0u32..5000) {
            let mut h = SqHead::new();
            h.set_params(QueueParams { qid: 1, sqsize, sq_flow_control_disabled: false });
            for _ in 0..n {
                h.capsule_received();
            }
            prop_assert_eq!(h.sqhd() as u32, n % (sqsize as u32 + 1));
        }
    }
}
