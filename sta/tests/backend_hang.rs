//! A backend that never answers: the soft engine reports the backend timeout to the main
//! context, and `be_queue_destroy` answers the host at once and frees the queue; the
//! namespace's I/O then reaches the application (non-offloaded). Also a namespace removed
//! while a write waits for its data. Driven by a minimal application on this thread and
//! the `nvmf-initiator` host on another, over loopback.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use backend::{Backend, BackendQueue, Completion, Error, IoStatus, Request, SubmitError};
use nvmf::spec::{opcodes, Cqe, DataDirection, Sqe, Status};
use nvmf_initiator::{HostOptions, TcpHost, Xfer};
use sta::soft::{SoftConfig, Sta, StaIo};
use sta::{Engine, Event, IoContext, MainEvent, SubsysId, TaskKind};

const NQN: &str = "nqn.2026-11.dev.nvmf-target:hang";

/// Holds every request that touches blocks `0..STUCK_BLOCKS` until `release` is set
/// (never, in these tests, before the destroy), and answers the others at its next poll.
/// Counts its queues dropped (`dropped`): the engine lets go of a namespace's queue once
/// nothing of it is left on the thread.
#[derive(Debug)]
struct Stuck {
    release: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
}

/// The blocks whose requests [`Stuck`] holds.
const STUCK_BLOCKS: u64 = 8;

struct StuckQueue {
    held: Vec<Request>,
    /// Requests to other blocks, answered at the next poll.
    done: Vec<Request>,
    release: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
}

impl Drop for StuckQueue {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

impl Backend for Stuck {
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        1 << 20
    }
    fn volatile_write_cache(&self) -> bool {
        false
    }
    fn describe(&self) -> String {
        "stuck".into()
    }
    fn create_queue(self: Arc<Self>, _depth: u32) -> Result<Box<dyn BackendQueue>, Error> {
        Ok(Box::new(StuckQueue {
            held: Vec::new(),
            done: Vec::new(),
            release: self.release.clone(),
            dropped: self.dropped.clone(),
        }))
    }
    fn flush_sync(&self) -> Result<(), Error> {
        Ok(())
    }
}

impl BackendQueue for StuckQueue {
    fn submit(&mut self, req: Request) -> Result<(), SubmitError> {
        if req.lba < STUCK_BLOCKS {
            self.held.push(req);
        } else {
            self.done.push(req);
        }
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        let mut answer = std::mem::take(&mut self.done);
        if self.release.load(Ordering::Relaxed) {
            answer.append(&mut self.held);
        }
        let n = answer.len();
        out.extend(answer.into_iter().map(|r| Completion {
            tag: r.tag,
            status: IoStatus::Ok,
            buf: r.buf,
        }));
        n
    }
    fn in_flight(&self) -> usize {
        self.held.len() + self.done.len()
    }
}

#[test]
fn hung_backend_times_out_and_queue_destroy_answers_the_host() {
    let StuckTarget {
        mut sta,
        subsys,
        mut io,
        listener,
        addr,
        release,
        ..
    } = stuck_target(Duration::from_millis(200));
    let (tx, rx) = mpsc::channel();
    let host = std::thread::spawn(move || {
        let mut h = io_queue_host(addr);
        let mut buf = vec![0u8; 4096];
        // Stuck in the backend until the queue is destroyed.
        tx.send(h.read(1, 0, 8, &mut buf).expect("first read"))
            .unwrap();
        // After the destroy the namespace is not offloaded: the application answers.
        tx.send(h.read(1, 0, 8, &mut buf).expect("second read"))
            .unwrap();
    });

    let mut timeouts = 0;
    let mut destroyed = false;
    let mut statuses: Vec<Status> = Vec::new();
    serve(
        &mut sta,
        &mut io,
        &listener,
        subsys,
        |sta, ev| match ev {
            MainEvent::BackendTimeout {
                subsys: s,
                nsid,
                commands,
                ..
            } => {
                assert_eq!((s, nsid, commands), (subsys, 1, 1));
                timeouts += 1;
                sta.be_queue_destroy(subsys, 1, 77).unwrap();
            }
            MainEvent::BeQueueDestroyed {
                subsys: s,
                nsid,
                user,
            } => {
                assert_eq!((s, nsid, user), (subsys, 1, 77));
                destroyed = true;
            }
            other => panic!("unexpected {other:?}"),
        },
        || {
            while let Ok(s) = rx.try_recv() {
                statuses.push(s);
            }
            statuses.len() >= 2
        },
    );
    host.join().unwrap();
    assert_eq!(
        timeouts, 1,
        "the backend timeout is reported once per command"
    );
    assert!(destroyed, "be_queue_destroy reported its end");
    assert_eq!(statuses[0], Status::ABORTED_SQ_DELETION.with_dnr(false));
    assert_eq!(statuses[1], Status::NAMESPACE_NOT_READY);
    // Errors are counted by status.
    let t = sta.stats().namespace(subsys, 1);
    assert_eq!(t.errors, 1);
    assert_eq!(
        t.errors_by_status[sta::error_status_index(Status::ABORTED_SQ_DELETION)],
        1
    );
    // The backend finally answers: the abandoned request is discarded, nothing breaks.
    release.store(true, Ordering::Relaxed);
    for _ in 0..50 {
        io.progress(Duration::from_millis(1));
    }
    assert_eq!(sta.stats().namespace(subsys, 1).queue_depth, 0);
}

/// The host side: I/O queue 1 of controller 1 on `addr`, connected (15 s timeouts).
fn io_queue_host(addr: std::net::SocketAddr) -> TcpHost {
    let opts = HostOptions {
        timeout: Duration::from_secs(15),
        ..HostOptions::default()
    };
    let mut h = TcpHost::connect(addr, opts).expect("ICReq");
    h.connect_io(NQN, 1, 1, 31).expect("I/O queue Connect");
    h
}

/// An engine with one namespace on a [`Stuck`] backend, its IO context, a listener for
/// the host, and the backend's switches: `release` lets it answer what it holds,
/// `dropped` counts its queues dropped.
struct StuckTarget {
    sta: Sta,
    subsys: SubsysId,
    io: StaIo,
    listener: TcpListener,
    addr: std::net::SocketAddr,
    release: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
}

/// A [`StuckTarget`] whose engine reports a backend timeout after `backend_timeout`.
fn stuck_target(backend_timeout: Duration) -> StuckTarget {
    let (release, dropped) = (Arc::default(), Arc::default());
    let mut sta = Sta::new(SoftConfig {
        backend_timeout,
        ..SoftConfig::default()
    });
    let subsys = sta.subsystem_create(NQN).unwrap();
    sta.ns_add(
        subsys,
        1,
        Arc::new(Stuck {
            release: Arc::clone(&release),
            dropped: Arc::clone(&dropped),
        }),
    )
    .unwrap();
    let io = sta.io_create().unwrap().start().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    StuckTarget {
        sta,
        subsys,
        io,
        listener,
        addr,
        release,
        dropped,
    }
}

/// Plays the application on this thread until `done`: accepts connections, answers
/// Connects (I/O queue 1 of controller 1) and the I/O the engine hands over
/// (Namespace Not Ready, as for a namespace it no longer serves), and gives every main
/// event to `main`.
fn serve(
    sta: &mut Sta,
    io: &mut StaIo,
    listener: &TcpListener,
    subsys: SubsysId,
    mut main: impl FnMut(&mut Sta, MainEvent),
    mut done: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut waiting_read = None;
    while !done() {
        assert!(Instant::now() < deadline, "timed out");
        if let Ok((sock, _)) = listener.accept() {
            io.qp_accept_tcp(sock, 0).unwrap();
        }
        io.progress(Duration::from_millis(1));
        while let Some(ev) = io.poll_event() {
            match ev {
                Event::NonOffload {
                    qp,
                    token,
                    sqe,
                    payload_valid,
                    ..
                } => {
                    let connect = sqe.is_fabrics() && sqe.fctype() == opcodes::fabrics::CONNECT;
                    if connect
                        && !payload_valid
                        && sqe.data_direction() == DataDirection::HostToController
                    {
                        waiting_read = Some((qp, token, sqe));
                        io.rdma_read(qp, token, 1).unwrap();
                        continue;
                    }
                    if connect {
                        io.qp_add_subsystem(qp, subsys).unwrap();
                        io.qp_connect_set_params(qp, 1, 31, false).unwrap();
                        let mut cqe = Cqe::success(sqe.cid());
                        cqe.dw0 = 1;
                        io.rdma_send(qp, token, &cqe, 0).unwrap();
                    } else {
                        // What an application answers for I/O the engine no longer serves.
                        let cqe = Cqe::new(sqe.cid(), Status::NAMESPACE_NOT_READY);
                        io.rdma_send(qp, token, &cqe, 0).unwrap();
                    }
                }
                Event::TaskDone {
                    kind: TaskKind::RdmaRead,
                    ..
                } => {
                    let (qp, token, sqe) = waiting_read.take().unwrap();
                    io.qp_add_subsystem(qp, subsys).unwrap();
                    io.qp_connect_set_params(qp, 1, 31, false).unwrap();
                    let mut cqe = Cqe::success(sqe.cid());
                    cqe.dw0 = 1;
                    io.rdma_send(qp, token, &cqe, 0).unwrap();
                }
                _ => {}
            }
        }
        while let Some(ev) = sta.progress() {
            main(sta, ev);
        }
    }
}

/// Answers the oldest request it holds every `every`, in order, except that with
/// `lose_first` the first request it gets is never answered (a lost command).
#[derive(Debug)]
struct Slow {
    every: Duration,
    lose_first: bool,
}

struct SlowQueue {
    held: std::collections::VecDeque<Request>,
    lost: Vec<Request>,
    lose_next: bool,
    every: Duration,
    last: Instant,
}

impl Backend for Slow {
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        1 << 20
    }
    fn volatile_write_cache(&self) -> bool {
        false
    }
    fn describe(&self) -> String {
        "slow".into()
    }
    fn create_queue(self: Arc<Self>, _depth: u32) -> Result<Box<dyn BackendQueue>, Error> {
        Ok(Box::new(SlowQueue {
            held: Default::default(),
            lost: Vec::new(),
            lose_next: self.lose_first,
            every: self.every,
            last: Instant::now(),
        }))
    }
    fn flush_sync(&self) -> Result<(), Error> {
        Ok(())
    }
}

impl BackendQueue for SlowQueue {
    fn submit(&mut self, req: Request) -> Result<(), SubmitError> {
        if std::mem::take(&mut self.lose_next) {
            self.lost.push(req);
        } else {
            self.held.push_back(req);
        }
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        if self.last.elapsed() < self.every {
            return 0;
        }
        let Some(r) = self.held.pop_front() else {
            return 0;
        };
        self.last = Instant::now();
        out.push(Completion {
            tag: r.tag,
            status: IoStatus::Ok,
            buf: r.buf,
        });
        1
    }
    fn in_flight(&self) -> usize {
        self.held.len() + self.lost.len()
    }
}

/// Starts an engine with `backend` as namespace 1 and a host on another thread that runs
/// `host` on its I/O queue, sending each status it gets; serves until `until` says the
/// statuses are all in. Returns what the main context reported and the statuses.
fn run_host_on(
    backend: Slow,
    limit: Duration,
    host: impl FnOnce(&mut TcpHost, mpsc::Sender<Status>) + Send + 'static,
    until: impl Fn(&[Status]) -> bool,
) -> (Vec<MainEvent>, Vec<Status>) {
    let cfg = SoftConfig {
        backend_timeout: limit,
        ..SoftConfig::default()
    };
    let mut sta = Sta::new(cfg);
    let subsys = sta.subsystem_create(NQN).unwrap();
    sta.ns_add(subsys, 1, Arc::new(backend)).unwrap();
    let mut io = sta.io_create().unwrap().start().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    let host = std::thread::spawn(move || {
        let mut h = io_queue_host(addr);
        host(&mut h, tx);
    });
    let mut events = Vec::new();
    let mut statuses = Vec::new();
    serve(
        &mut sta,
        &mut io,
        &listener,
        subsys,
        |sta, ev| {
            if let MainEvent::BackendTimeout { subsys, nsid, .. } = ev {
                sta.be_queue_destroy(subsys, nsid, 1).unwrap();
            }
            events.push(ev);
        },
        || {
            while let Ok(s) = rx.try_recv() {
                statuses.push(s);
            }
            until(&statuses)
        },
    );
    host.join().unwrap();
    (events, statuses)
}

fn read_4k() -> nvmf_initiator::Request {
    nvmf_initiator::Request::read(1, 0, 8, vec![0; 4096])
}

/// A backend that works off a long queue slowly but steadily is not hung: the last of 31
/// reads waits 620 ms with a 400 ms limit, yet every 20 ms a read completes, so no
/// timeout is reported and every read succeeds (a host that queues much work must not
/// get the namespace taken from every host). The gap between completions is a twentieth
/// of the limit, so that a loaded machine that leaves the engine's thread unscheduled for
/// a while does not make a hang of it.
#[test]
fn a_slow_backend_that_keeps_completing_is_not_hung() {
    let reads = 31;
    let (events, statuses) = run_host_on(
        Slow {
            every: Duration::from_millis(20),
            lose_first: false,
        },
        Duration::from_millis(400),
        move |h, tx| {
            for _ in 0..reads {
                h.submit(read_4k()).expect("submit a read");
            }
            for _ in 0..reads {
                let c = h.poll_completion().expect("a read's completion");
                tx.send(c.cqe.status()).unwrap();
            }
        },
        move |s| s.len() == reads,
    );
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(statuses, vec![Status::SUCCESS; reads]);
}

/// One command the backend never answers, while it keeps answering the others, is
/// reported once it is outstanding ten times the limit, and the queue's destroy answers
/// it; a backend that stops answering altogether is reported after the limit.
#[test]
fn a_lost_command_is_reported_at_ten_times_the_limit_while_others_complete() {
    // Eight reads stay in flight beside the lost one, so the backend has work whatever the
    // host thread's scheduling: with one read at a time, a host thread off the CPU for
    // longer than the limit left only the lost command outstanding, and a loaded machine
    // saw a full hang reported at 1x the limit (2 of 30 runs under load).
    let limit = Duration::from_millis(300);
    let lost = Status::ABORTED_SQ_DELETION.with_dnr(false);
    let t0 = Instant::now();
    let (events, statuses) = run_host_on(
        Slow {
            every: Duration::from_millis(10),
            lose_first: true,
        },
        limit,
        move |h, tx| {
            let first = h.submit(read_4k()).expect("submit the lost read");
            // Eight reads in flight after it, one more for each answered, until the lost
            // one is answered; only the reads that succeed and the lost one's answer are
            // sent on.
            for _ in 0..7 {
                h.submit(read_4k()).expect("submit a read");
            }
            loop {
                h.submit(read_4k()).expect("submit a read");
                let c = h.poll_completion().expect("a completion");
                if c.cid == first {
                    tx.send(c.cqe.status()).unwrap();
                    return;
                }
                if c.cqe.status().is_success() {
                    tx.send(c.cqe.status()).unwrap();
                }
            }
        },
        move |s| s.last().is_some_and(|l| !l.is_success()),
    );
    let took = t0.elapsed();
    assert!(took >= limit * 10, "reported after {took:?}: {events:?}");
    assert!(
        matches!(
            events.first(),
            Some(MainEvent::BackendTimeout {
                nsid: 1,
                commands: 1,
                ..
            })
        ),
        "{events:?}"
    );
    assert_eq!(statuses.last(), Some(&lost));
    assert!(statuses.len() > 20, "{} reads done", statuses.len());
}

/// `ns_fence` is done only once the backend requests in flight for the namespace when it
/// was made have completed: with a read held by the backend it stays open, a fence on a
/// namespace this context does not serve is done at once, and releasing the backend
/// lets both fences made meanwhile through.
#[test]
fn a_fence_waits_for_the_requests_in_flight() {
    let StuckTarget {
        mut sta,
        subsys,
        mut io,
        listener,
        addr,
        release,
        ..
    } = stuck_target(Duration::from_secs(60));
    let (tx, rx) = mpsc::channel();
    let host = std::thread::spawn(move || {
        let mut h = io_queue_host(addr);
        let mut buf = vec![0u8; 4096];
        tx.send(h.read(1, 0, 8, &mut buf).expect("read")).unwrap();
    });
    let stats = sta.stats();
    serve(
        &mut sta,
        &mut io,
        &listener,
        subsys,
        |_, ev| panic!("unexpected {ev:?}"),
        || stats.namespace(subsys, 1).queue_depth == 1,
    );
    let fence = io.ns_fence(subsys, 1);
    let elsewhere = io.ns_fence(subsys, 9);
    for _ in 0..20 {
        io.progress(Duration::from_millis(1));
    }
    assert!(elsewhere.is_done(), "nothing of namespace 9 runs here");
    assert!(!fence.is_done(), "the read is still at the backend");
    let second = io.ns_fence(subsys, 1);
    io.progress(Duration::from_millis(1));
    assert!(!second.is_done());
    release.store(true, Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(fence.is_done() && second.is_done()) {
        assert!(Instant::now() < deadline, "the fences never finished");
        io.progress(Duration::from_millis(1));
    }
    let mut got = None;
    while got.is_none() {
        assert!(Instant::now() < deadline, "the read was never answered");
        io.progress(Duration::from_millis(1));
        got = rx.try_recv().ok();
    }
    assert_eq!(got, Some(Status::SUCCESS));
    host.join().unwrap();
}

/// Sends each request on `h`, remembering its name by CID in `names` (for [`answers`]).
fn submit_named<const N: usize>(
    h: &mut TcpHost,
    names: &mut HashMap<u16, &'static str>,
    reqs: [(&'static str, nvmf_initiator::Request); N],
) {
    for (what, req) in reqs {
        names.insert(h.submit(req).expect("submit"), what);
    }
}

/// The next `n` completions on `h`, by the name their command was sent under, in the
/// order they came.
fn answers(
    h: &mut TcpHost,
    names: &HashMap<u16, &'static str>,
    n: usize,
) -> Vec<(&'static str, Status)> {
    (0..n)
        .map(|_| {
            let c = h.poll_completion().expect("completion");
            (names[&c.cid], c.cqe.status())
        })
        .collect()
}

/// A Dataset Management that deallocates `nlb` blocks at `slba` of namespace 1.
fn deallocate(slba: u64, nlb: u32) -> nvmf_initiator::Request {
    let mut sqe = Sqe {
        nsid: 1,
        cdw11: 1 << 2,
        ..Default::default()
    };
    sqe.set_opcode_cid(opcodes::io::DATASET_MANAGEMENT, 0);
    let mut range = vec![0u8; 4];
    range.extend_from_slice(&nlb.to_le_bytes());
    range.extend_from_slice(&slba.to_le_bytes());
    nvmf_initiator::Request::new(sqe, Xfer::ToController, range)
}

/// A Copy of one block at `from` to `to` (namespace 1).
fn copy_block(from: u64, to: u64) -> nvmf_initiator::Request {
    let mut sqe = Sqe {
        nsid: 1,
        cdw10: to as u32,
        cdw11: (to >> 32) as u32,
        ..Default::default()
    };
    sqe.set_opcode_cid(opcodes::io::COPY, 0);
    let data = nvmf::copy::encode_ranges(&[(from, 1)]);
    nvmf_initiator::Request::new(sqe, Xfer::ToController, data)
}

/// One block of namespace 1 at LBA 0: `opcode` with `fuse` (0 none, 1 first, 2 second).
fn block0(opcode: u8, fuse: u8) -> nvmf_initiator::Request {
    let mut sqe = Sqe {
        nsid: 1,
        ..Default::default()
    };
    sqe.set_opcode_cid(opcode, 0);
    sqe.cdw0 |= u32::from(fuse) << 8;
    nvmf_initiator::Request::new(sqe, Xfer::ToController, vec![0x5a; 512])
}

/// A fused pair whose compare the backend holds keeps block 0: a second pair and a plain
/// write to it wait on the IO thread for its range. When the backend times out and its
/// queue is destroyed, every one of them is answered, and once the backend gives back
/// what it held the namespace leaves the thread for good: nothing waits on for a range
/// that no pair will ever let go of (the engine drops the backend's queue).
#[test]
fn queue_destroy_answers_the_commands_waiting_for_a_pairs_range_and_lets_the_namespace_go() {
    let StuckTarget {
        mut sta,
        subsys,
        mut io,
        listener,
        addr,
        release,
        dropped,
    } = stuck_target(Duration::from_millis(200));
    let (tx, rx) = mpsc::channel();
    let host = std::thread::spawn(move || {
        use opcodes::io::{COMPARE, WRITE};
        let mut h = io_queue_host(addr);
        let mut names = HashMap::new();
        // Pair A (its compare sticks in the backend), pair B, a plain write: all block 0.
        let sent = [
            ("compare a", block0(COMPARE, 1)),
            ("write a", block0(WRITE, 2)),
            ("compare b", block0(COMPARE, 1)),
            ("write b", block0(WRITE, 2)),
            ("write", block0(WRITE, 0)),
        ];
        submit_named(&mut h, &mut names, sent);
        tx.send(answers(&mut h, &names, 5)).unwrap();
    });
    let destroyed = std::cell::Cell::new(false);
    let mut statuses = None;
    serve(
        &mut sta,
        &mut io,
        &listener,
        subsys,
        |sta, ev| match ev {
            MainEvent::BackendTimeout {
                subsys: s, nsid, ..
            } => {
                assert_eq!((s, nsid), (subsys, 1));
                sta.be_queue_destroy(subsys, 1, 5).unwrap();
            }
            MainEvent::BeQueueDestroyed { user: 5, .. } => destroyed.set(true),
            other => panic!("unexpected {other:?}"),
        },
        || {
            if let Ok(s) = rx.try_recv() {
                statuses = Some(s);
            }
            statuses.is_some() && destroyed.get()
        },
    );
    host.join().unwrap();
    let statuses = statuses.unwrap();
    println!("answers: {statuses:?}");
    assert!(
        statuses.iter().all(|s| !s.1.is_success()),
        "nothing of block 0 ran: {statuses:?}"
    );
    let st = |what: &str| statuses.iter().find(|s| s.0 == what).unwrap().1;
    assert_eq!(st("compare a"), Status::ABORTED_SQ_DELETION.with_dnr(false));
    assert_eq!(st("write"), Status::ABORTED_SQ_DELETION.with_dnr(false));
    assert_eq!(
        dropped.load(Ordering::Relaxed),
        0,
        "the compare is still held"
    );
    // The backend gives back the compare's read: nothing of the namespace is left.
    release.store(true, Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(10);
    while dropped.load(Ordering::Relaxed) == 0 {
        assert!(
            Instant::now() < deadline,
            "the namespace's queue was never let go (commands still wait for the pair's range)"
        );
        io.progress(Duration::from_millis(1));
    }
    assert_eq!(sta.stats().namespace(subsys, 1).queue_depth, 0);
}

/// A pair whose compare the backend holds keeps block 0; a deallocation or a Copy to other
/// blocks goes on meanwhile (from the same queue), while one that writes block 0 waits
/// for the pair: it is answered after the pair's write, not beside its compare.
#[test]
fn deallocate_and_copy_wait_only_for_pairs_on_their_blocks() {
    let StuckTarget {
        mut sta,
        subsys,
        mut io,
        listener,
        addr,
        release,
        ..
    } = stuck_target(Duration::from_secs(60));
    let (tx, rx) = mpsc::channel();
    let host = std::thread::spawn(move || {
        use opcodes::io::{COMPARE, WRITE};
        let mut h = io_queue_host(addr);
        let mut names = HashMap::new();
        let sent = [
            ("compare", block0(COMPARE, 1)),
            ("write", block0(WRITE, 2)),
            ("far dsm", deallocate(1000, 8)),
            ("far copy", copy_block(2000, 3000)),
        ];
        submit_named(&mut h, &mut names, sent);
        let mut order = answers(&mut h, &names, 2);
        // Both went on while the pair holds block 0.
        tx.send(order.clone()).unwrap();
        let sent = [
            ("near dsm", deallocate(0, 1)),
            ("near copy", copy_block(2000, 0)),
        ];
        submit_named(&mut h, &mut names, sent);
        order.extend(answers(&mut h, &names, 4));
        tx.send(order).unwrap();
    });
    let mut first = None;
    serve(
        &mut sta,
        &mut io,
        &listener,
        subsys,
        |_, ev| panic!("unexpected {ev:?}"),
        || {
            first = first.take().or_else(|| rx.try_recv().ok());
            first.is_some()
        },
    );
    let first = first.unwrap();
    println!("while the pair is held: {first:?}");
    let mut far: Vec<_> = first.iter().map(|f| f.0).collect();
    far.sort_unstable();
    assert_eq!(far, ["far copy", "far dsm"]);
    assert!(first.iter().all(|f| f.1 == Status::SUCCESS), "{first:?}");
    // The near ones reach the engine and wait; then the backend lets the compare go.
    for _ in 0..50 {
        io.progress(Duration::from_millis(1));
    }
    release.store(true, Ordering::Relaxed);
    let mut all = None;
    serve(
        &mut sta,
        &mut io,
        &listener,
        subsys,
        |_, ev| panic!("unexpected {ev:?}"),
        || {
            all = all.take().or_else(|| rx.try_recv().ok());
            all.is_some()
        },
    );
    host.join().unwrap();
    let all = all.unwrap();
    println!("in all: {all:?}");
    // The backend's compare read holds no real data: the pair fails its compare, or
    // succeeds should the bytes happen to match.
    let st = |what: &str| all.iter().find(|f| f.0 == what).unwrap().1;
    assert!(
        matches!(
            (st("compare"), st("write")),
            (Status::SUCCESS, Status::SUCCESS)
                | (Status::COMPARE_FAILURE, Status::ABORTED_FAILED_FUSED)
        ),
        "{all:?}"
    );
    assert_eq!(
        (st("near dsm"), st("near copy")),
        (Status::SUCCESS, Status::SUCCESS)
    );
    let at = |what: &str| all.iter().position(|f| f.0 == what).unwrap();
    assert!(at("write") < at("near dsm"), "{all:?}");
    assert!(at("write") < at("near copy"), "{all:?}");
}

/// The 4 KiB at LBA 100 of `ram` (512-byte blocks).
fn ram_bytes(ram: &backend::RamBackend) -> Vec<u8> {
    let (off, len) = ram.byte_range(100, 8).unwrap();
    let mut out = vec![0u8; len];
    let mut set = backend::ram::LendSet::default();
    assert!(set.add(off, len));
    assert!(ram.lend(&set, |l| l.copy_to(off, &mut out)));
    out
}

/// A write whose data the host holds back past its namespace's removal (the target sent
/// its R2T) finishes on that namespace's backend, and the removal waits for it. Before,
/// the removal went through at once, the write never completed, and a namespace added
/// meanwhile took the removed one's slot: the late data landed in it.
#[test]
fn a_write_waiting_for_its_data_when_its_namespace_goes_lands_there_only() {
    let old = backend::RamBackend::new(1 << 20, 512).unwrap();
    let new = backend::RamBackend::new(1 << 20, 512).unwrap();
    let mut sta = Sta::new(SoftConfig::default());
    let subsys = sta.subsystem_create(NQN).unwrap();
    sta.ns_add(subsys, 1, old.clone()).unwrap();
    let mut io = sta.io_create().unwrap().start().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let host = std::thread::spawn(move || {
        let mut h = io_queue_host(addr);
        // No in-capsule data: the target asks for it (R2T), which the host answers only
        // when it polls, after the removal.
        h.set_max_incapsule(0);
        let cid = h
            .submit(nvmf_initiator::Request::write(
                1,
                100,
                8,
                vec![0xa7; 4096],
                false,
            ))
            .expect("submit");
        tx.send(None).unwrap();
        go_rx.recv().unwrap();
        tx.send(Some(h.wait(cid).expect("completion").cqe.status()))
            .unwrap();
    });
    let removed = std::cell::Cell::new(false);
    let mut submitted = false;
    serve(
        &mut sta,
        &mut io,
        &listener,
        subsys,
        |_, ev| panic!("unexpected {ev:?}"),
        || {
            submitted |= rx.try_recv().is_ok();
            submitted
        },
    );
    // The capsule reaches the engine, which asks for the data.
    for _ in 0..50 {
        io.progress(Duration::from_millis(1));
    }
    sta.ns_remove(subsys, 1, 3).unwrap();
    for _ in 0..50 {
        io.progress(Duration::from_millis(1));
        while let Some(ev) = sta.progress() {
            assert!(matches!(ev, MainEvent::NsRemoved { user: 3, .. }), "{ev:?}");
            removed.set(true);
        }
    }
    assert!(
        !removed.get(),
        "the removal waits for the write bound to the namespace"
    );
    // Another namespace comes while the write waits.
    sta.ns_add(subsys, 1, new.clone()).unwrap();
    for _ in 0..20 {
        io.progress(Duration::from_millis(1));
    }
    go_tx.send(()).unwrap();
    let mut status = None;
    serve(
        &mut sta,
        &mut io,
        &listener,
        subsys,
        |_, ev| match ev {
            MainEvent::NsRemoved { user: 3, .. } => removed.set(true),
            other => panic!("unexpected {other:?}"),
        },
        || {
            status = status.or_else(|| rx.try_recv().ok().flatten());
            status.is_some() && removed.get()
        },
    );
    host.join().unwrap();
    println!("the late write: {status:?}");
    assert_eq!(status, Some(Status::SUCCESS));
    assert_eq!(
        ram_bytes(&old),
        vec![0xa7; 4096],
        "it landed where it was sent"
    );
    assert_eq!(
        ram_bytes(&new),
        vec![0; 4096],
        "nothing of it in the new namespace"
    );
}
