//! What the soft engine hands its backend, seen by a backend that records every request:
//! Write Zeroes carries the host's FUA down (so the zeroes are durable before the
//! completion), and Compare's bytes count as read bytes (SMART's Data Units Read).
//! Driven by a minimal application on this thread and the `nvmf-initiator` host on
//! another, over loopback.

use std::net::TcpListener;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use backend::{Backend, BackendQueue, Completion, Error, IoStatus, Op, Request, SubmitError};
use nvmf::spec::{opcodes, Cqe, DataDirection, Sqe, Status};
use nvmf_initiator::{HostOptions, TcpHost};
use sta::{Event, SoftConfig, Sta, TaskKind};

const NQN: &str = "nqn.2026-11.dev.nvmf-target:ops";

/// Answers every request at once (zeroes for reads) and records (op, lba, nblocks).
#[derive(Debug, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<(Op, u64, u32)>>>,
}

struct RecorderQueue {
    seen: Arc<Mutex<Vec<(Op, u64, u32)>>>,
    done: Vec<Completion>,
}

impl Backend for Recorder {
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        1 << 20
    }
    fn volatile_write_cache(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        "recorder".into()
    }
    fn create_queue(self: Arc<Self>, _depth: u32) -> Result<Box<dyn BackendQueue>, Error> {
        Ok(Box::new(RecorderQueue {
            seen: self.seen.clone(),
            done: Vec::new(),
        }))
    }
    fn flush_sync(&self) -> Result<(), Error> {
        Ok(())
    }
}

impl BackendQueue for RecorderQueue {
    fn submit(&mut self, mut req: Request) -> Result<(), SubmitError> {
        self.seen
            .lock()
            .unwrap()
            .push((req.op, req.lba, req.nblocks));
        if let (Op::Read, Some(b)) = (req.op, req.buf.as_mut()) {
            b.set_len(req.nblocks as usize * 512);
            b.zero();
        }
        self.done.push(Completion {
            tag: req.tag,
            status: IoStatus::Ok,
            buf: req.buf,
        });
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        let n = self.done.len();
        out.append(&mut self.done);
        n
    }
    fn in_flight(&self) -> usize {
        self.done.len()
    }
}

#[test]
fn write_zeroes_fua_reaches_the_backend_and_compare_counts_as_read() {
    let rec = Recorder::default();
    let seen = rec.seen.clone();
    let mut sta = Sta::new(SoftConfig::default());
    let subsys = sta.subsystem_create(NQN);
    sta.ns_add(subsys, 1, Arc::new(rec)).unwrap();
    let mut io = sta.io_create().start().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    let host = std::thread::spawn(move || {
        let opts = HostOptions {
            timeout: Duration::from_secs(15),
            ..HostOptions::default()
        };
        let mut h = TcpHost::connect(addr, opts).expect("ICReq");
        h.connect_io(NQN, 1, 1, 31).expect("I/O queue Connect");
        let wz = |fua: bool| {
            let mut s = Sqe {
                nsid: 1,
                cdw10: 100,
                cdw12: 7 | if fua { 1 << 30 } else { 0 },
                ..Default::default()
            };
            s.set_opcode_cid(opcodes::io::WRITE_ZEROES, 0);
            s
        };
        for fua in [true, false] {
            let (cqe, _) = h.submit_admin_raw(wz(fua), &[], 0).expect("write zeroes");
            tx.send(cqe.status()).unwrap();
        }
        // The recorder reads zeroes: a compare of zeroes matches.
        tx.send(h.compare(1, 0, &[0u8; 8192]).expect("compare"))
            .unwrap();
    });

    let deadline = Instant::now() + Duration::from_secs(20);
    let mut statuses: Vec<Status> = Vec::new();
    let mut waiting = None;
    while statuses.len() < 3 {
        assert!(Instant::now() < deadline, "timed out: {statuses:?}");
        if let Ok((sock, _)) = listener.accept() {
            io.qp_accept_tcp(sock, 0).unwrap();
        }
        io.progress(Duration::from_millis(1));
        while let Some(ev) = io.poll_event() {
            let answer = |io: &mut sta::soft::StaIo, qp, token, sqe: Sqe| {
                io.qp_add_subsystem(qp, subsys).unwrap();
                io.qp_connect_set_params(qp, 1, 31, false).unwrap();
                let mut cqe = Cqe::success(sqe.cid());
                cqe.dw0 = 1;
                io.rdma_send(qp, token, &cqe, 0).unwrap();
            };
            match ev {
                Event::NonOffload {
                    qp,
                    token,
                    sqe,
                    payload_valid,
                    ..
                } => {
                    assert!(sqe.is_fabrics() && sqe.fctype() == opcodes::fabrics::CONNECT);
                    if !payload_valid && sqe.data_direction() == DataDirection::HostToController {
                        waiting = Some((qp, token, sqe));
                        io.rdma_read(qp, token, 1).unwrap();
                    } else {
                        answer(&mut io, qp, token, sqe);
                    }
                }
                Event::TaskDone {
                    kind: TaskKind::RdmaRead,
                    ..
                } => {
                    let (qp, token, sqe) = waiting.take().unwrap();
                    answer(&mut io, qp, token, sqe);
                }
                _ => {}
            }
        }
        while let Ok(s) = rx.try_recv() {
            statuses.push(s);
        }
    }
    host.join().unwrap();
    assert!(statuses.iter().all(|s| s.is_success()), "{statuses:?}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        &seen[..2],
        &[
            (Op::WriteZeroes { fua: true }, 100, 8),
            (Op::WriteZeroes { fua: false }, 100, 8)
        ],
        "Write Zeroes with FUA reaches the backend with FUA"
    );
    let t = sta.stats().namespace(subsys, 1);
    assert_eq!(t.read_cmds, 1, "Compare counts as a read command");
    assert_eq!(t.read_bytes, 8192, "and its bytes as read bytes");
}
