//! The `connect_data` harness: a Fabrics Connect (SQE + Connect data) into
//! `Target::connect`, on a target that already has an enabled SUB1/HOST1 controller
//! (CNTLID 1, HOSTID 01h...) and one for SUB2 (CNTLID 2), so I/O queue Connects can
//! name live controllers.
//!
//! Input: `[mode, sqe (64), data...]`. `mode` bit 0 forces the Connect opcode and FCTYPE
//! (else the SQE is taken as is); bits 1-2 pick the data length (1024, shorter, longer,
//! or whatever the input has left, up to 4 KiB).
//!
//! Checks (in [`World::connect`](crate::capsule::World::connect)): success comes with
//! a ConnectOk whose CNTLID is in 1..=FFEFh and echoed in DW0, whose QID is the SQE's and
//! whose subsystem exists; a queue is never granted twice. Then: a successful I/O queue
//! takes a command, the same Connect again is refused (the queue exists), and once the
//! queue is closed its key is gone from the target.

use crate::capsule::{connect_data, connect_sqe, World, HOST2, SUB2};
use nvmf::spec::fabrics::ConnectData;
use nvmf::spec::opcodes::{self, io};
use nvmf::spec::Sqe;
use nvmf::target::{IoCounters, Outcome, TargetOptions};
use zerocopy::IntoBytes;

pub fn run(input: &[u8]) {
    let mut inp = crate::Input::new(input);
    let mode = inp.u8();
    let mut sqe = Sqe::from_bytes(&inp.bytes(64)).expect("64 bytes");
    if mode & 1 != 0 {
        sqe.set_opcode_cid(opcodes::FABRICS, sqe.cid());
        sqe.nsid = (sqe.nsid & !0xff) | opcodes::fabrics::CONNECT as u32;
    }
    let data = match (mode >> 1) & 3 {
        0 => inp.bytes(ConnectData::SIZE),
        1 => {
            let n = inp.u16() as usize % ConnectData::SIZE;
            inp.bytes(n)
        }
        2 => inp.bytes(ConnectData::SIZE + 1 + mode as usize),
        _ => {
            let rest = inp.rest();
            rest[..rest.len().min(4096)].to_vec()
        }
    };

    let mut w = World::new(TargetOptions::default(), 0, IoCounters::default());
    let key = 7;
    let (_, other) = w.connect(
        key,
        &connect_sqe(0, 31, 0),
        &connect_data(0xffff, SUB2, HOST2),
    );
    assert!(other.is_some(), "SUB2 admin Connect refused");
    let before = w.queues.len();

    let (cqe, ok) = w.connect(1000, &sqe, &data);
    let Some(ok) = ok else {
        assert_eq!(w.queues.len(), before);
        return;
    };
    let q = ok.queue();
    if ok.qid != 0 {
        // The queue works: a command the engine did not offload gets an answer.
        let mut read = Sqe {
            nsid: 1,
            ..Default::default()
        };
        read.set_opcode_cid(io::READ, 9);
        match w.execute(q, &read, 4096) {
            Outcome::Complete { cqe, .. } => assert_eq!(cqe.sqid, ok.qid),
            Outcome::Deferred | Outcome::Dropped => panic!("I/O command held or dropped"),
        }
        // The same Connect again: that queue exists.
        let (again, dup) = w.connect(1001, &sqe, &data);
        assert!(dup.is_none(), "I/O queue {q:?} connected twice: {again:?}");
    }
    let actions = w.close(q, 1000);
    w.handle(actions);
    if ok.qid == 0 {
        assert!(
            w.t.subsystem_of(ok.cntlid).is_none(),
            "controller outlived its admin queue"
        );
    }
    let _ = cqe;
}

/// Valid Connects: admin to each subsystem, I/O to the live controllers, and near-misses.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    let sub1 = crate::capsule::SUB1;
    let host1 = crate::capsule::HOST1;
    for (sqe, data) in [
        (connect_sqe(0, 31, 0), connect_data(0xffff, sub1, host1)),
        (
            connect_sqe(0, 127, 120_000),
            connect_data(0xffff, SUB2, HOST2),
        ),
        (
            connect_sqe(0, 31, 0),
            connect_data(0xffff, nvmf::target::DISCOVERY_NQN, HOST2),
        ),
        (connect_sqe(1, 127, 0), connect_data(1, sub1, host1)),
        (connect_sqe(3, 127, 0), connect_data(1, sub1, host1)),
        (connect_sqe(64, 1, 0), connect_data(1, sub1, host1)),
        (connect_sqe(1, 127, 0), connect_data(2, SUB2, HOST2)),
        (connect_sqe(2, 127, 0), connect_data(1, sub1, HOST2)),
    ] {
        let mut s = vec![0u8];
        s.extend_from_slice(sqe.as_bytes());
        s.extend_from_slice(&data);
        v.push(s);
    }
    v
}
