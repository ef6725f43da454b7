//! The soft engine over NVMe/TCP on loopback: the fabric the suite runs against here.
//!
//! The host is `nvmf::tcp::HostQueue` (the same host machine the repo's initiator uses)
//! over a non-blocking loopback socket, pumped on the test's own thread between engine
//! passes, so a whole conversation runs on one thread without timing games. The backend
//! is the RAM backend behind a gate that holds requests while the test stalls it.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backend::{Backend, BackendQueue, Completion, Error, Request, SubmitError};
use nvmf::spec::{Cqe, Sqe};
use nvmf::tcp::{Digests, HostConfig, HostError, HostEvent, HostQueue, TxSink, Xfer};
use sta::soft::{SoftConfig, Sta, StaIo};
use sta::{IoContext, QpHandle};

use crate::suite::{Dir, Fabric, Host, BLOCK, BLOCKS};

pub struct SoftTcp {
    listener: TcpListener,
    stall: Arc<AtomicBool>,
}

impl SoftTcp {
    pub fn new() -> SoftTcp {
        let listener = TcpListener::bind("127.0.0.1:0").expect("loopback listener");
        SoftTcp {
            listener,
            stall: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Fabric for SoftTcp {
    type Engine = Sta;
    type Host = TcpTestHost;

    fn name(&self) -> &'static str {
        "soft engine, NVMe/TCP over loopback"
    }

    fn engine(&mut self, backend_timeout: Duration) -> Sta {
        Sta::new(SoftConfig {
            backend_timeout,
            ..SoftConfig::default()
        })
    }

    fn backend(&mut self) -> Arc<dyn Backend> {
        let ram = backend::RamBackend::new(BLOCKS * BLOCK as u64, BLOCK).expect("RAM backend");
        Arc::new(Gate {
            inner: ram,
            stall: self.stall.clone(),
        })
    }

    fn stall(&mut self, _engine: &mut Sta, on: bool) {
        self.stall.store(on, Ordering::SeqCst);
    }

    fn connect(&mut self, io: &mut StaIo, user: u64) -> (QpHandle, TcpTestHost) {
        let host = TcpStream::connect(self.listener.local_addr().expect("address"))
            .expect("connect over loopback");
        host.set_nonblocking(true).expect("non-blocking");
        host.set_nodelay(true).expect("nodelay");
        let (sock, _) = self.listener.accept().expect("accept");
        let qp = io.qp_accept_tcp(sock, user).expect("qp_accept_tcp");
        let mut machine = HostQueue::new(
            HostConfig {
                digests: Digests::NONE,
                hpda: 0,
                maxr2t: 0,
                max_c2h_data: 16 << 20,
            },
            32,
        );
        let mut out = Out::default();
        machine.start(&mut out);
        let mut h = TcpTestHost {
            sock: host,
            machine,
            out,
            bufs: vec![Vec::new(); 256],
            tx: VecDeque::new(),
            rx: Vec::new(),
            done: Vec::new(),
            error: None,
            gone: false,
        };
        h.flush_out();
        (qp, h)
    }
}

/// The RAM backend, holding every request while `stall` is set.
#[derive(Debug)]
struct Gate {
    inner: Arc<backend::RamBackend>,
    stall: Arc<AtomicBool>,
}

struct GateQueue {
    inner: Box<dyn BackendQueue>,
    stall: Arc<AtomicBool>,
    held: VecDeque<Request>,
}

impl Backend for Gate {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }
    fn volatile_write_cache(&self) -> bool {
        false
    }
    fn describe(&self) -> String {
        "gated ram".into()
    }
    fn create_queue(self: Arc<Self>, depth: u32) -> Result<Box<dyn BackendQueue>, Error> {
        Ok(Box::new(GateQueue {
            inner: self.inner.clone().create_queue(depth)?,
            stall: self.stall.clone(),
            held: VecDeque::new(),
        }))
    }
    fn flush_sync(&self) -> Result<(), Error> {
        self.inner.flush_sync()
    }
    fn grow(&self, to: Option<u64>) -> Result<u64, Error> {
        self.inner.grow(to)
    }
}

impl BackendQueue for GateQueue {
    fn submit(&mut self, req: Request) -> Result<(), SubmitError> {
        self.held.push_back(req);
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        if !self.stall.load(Ordering::SeqCst) {
            while let Some(r) = self.held.pop_front() {
                if let Err(SubmitError::Full(r) | SubmitError::Closed(r)) = self.inner.submit(r) {
                    self.held.push_front(r);
                    break;
                }
            }
        }
        self.inner.poll(out)
    }
    fn in_flight(&self) -> usize {
        self.held.len() + self.inner.in_flight()
    }
}

/// Host output: header bytes inline, data as references into the command's buffer.
#[derive(Default)]
struct Out {
    bytes: Vec<u8>,
    segs: Vec<(bool, usize, u32, u32)>,
}

impl TxSink for Out {
    fn header(&mut self, b: &[u8]) {
        self.segs.push((false, self.bytes.len(), 0, b.len() as u32));
        self.bytes.extend_from_slice(b);
    }
    fn data(&mut self, cid: u32, off: u32, len: u32) {
        self.segs.push((true, cid as usize, off, len));
    }
    fn release(&mut self, _: u32) {}
}

/// One host queue over a loopback socket.
pub struct TcpTestHost {
    sock: TcpStream,
    machine: HostQueue,
    out: Out,
    /// Per CID: data to send, or the buffer being filled.
    bufs: Vec<Vec<u8>>,
    tx: VecDeque<u8>,
    rx: Vec<u8>,
    done: Vec<(u16, Cqe, Vec<u8>)>,
    error: Option<HostError>,
    gone: bool,
}

impl TcpTestHost {
    fn flush_out(&mut self) {
        for &(data, a, off, len) in &self.out.segs {
            let s: &[u8] = if data {
                &self.bufs[a][off as usize..(off + len) as usize]
            } else {
                &self.out.bytes[a..a + len as usize]
            };
            self.tx.extend(s.iter().copied());
        }
        self.out.segs.clear();
        self.out.bytes.clear();
    }

    fn parse(&mut self) -> bool {
        let mut did = false;
        while self.error.is_none() {
            let (used, ev) = match self.machine.receive(&self.rx, &mut self.out) {
                Ok(r) => r,
                Err(e) => {
                    self.error = Some(e);
                    return true;
                }
            };
            let Some(ev) = ev else { break };
            did = true;
            match ev {
                HostEvent::Data { cid, offset, data } => {
                    let b = &mut self.bufs[cid as usize];
                    b[offset as usize..offset as usize + data.len()].copy_from_slice(data);
                }
                HostEvent::R2T {
                    cid,
                    ttag,
                    offset,
                    len,
                } => {
                    let part =
                        self.bufs[cid as usize][offset as usize..(offset + len) as usize].to_vec();
                    self.machine
                        .send_data(&mut self.out, cid, ttag, offset, &part);
                }
                HostEvent::Completion { cid, cqe } => {
                    let buf = std::mem::take(&mut self.bufs[cid as usize]);
                    self.done.push((cid, cqe, buf));
                }
                HostEvent::Connected(_) => {}
            }
            self.rx.drain(..used);
            self.flush_out();
        }
        did
    }
}

impl Host for TcpTestHost {
    fn ready(&self) -> bool {
        self.machine.ic_resp().is_some()
    }

    fn submit(&mut self, sqe: Sqe, dir: Dir) -> u16 {
        let (xfer, buf) = match dir {
            Dir::None => (Xfer::None, Vec::new()),
            Dir::ToController(b) => (Xfer::ToController, b),
            Dir::FromController(n) => (Xfer::FromController, vec![0; n as usize]),
        };
        let cid = self
            .machine
            .submit(&mut self.out, sqe, xfer, &buf)
            .expect("a free CID");
        self.bufs[cid as usize] = buf;
        self.flush_out();
        cid
    }

    fn pump(&mut self) -> bool {
        let mut did = false;
        while !self.tx.is_empty() && !self.gone {
            let (a, _) = self.tx.as_slices();
            match self.sock.write(a) {
                Ok(0) => break,
                Ok(n) => {
                    self.tx.drain(..n);
                    did = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.gone = true;
                    break;
                }
            }
        }
        let mut buf = [0u8; 65536];
        loop {
            match self.sock.read(&mut buf) {
                Ok(0) => {
                    self.gone = true;
                    break;
                }
                Ok(n) => {
                    self.rx.extend_from_slice(&buf[..n]);
                    did = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.gone = true;
                    break;
                }
            }
        }
        did | self.parse()
    }

    fn take(&mut self, cid: u16) -> Option<(Cqe, Vec<u8>)> {
        let i = self.done.iter().position(|d| d.0 == cid)?;
        let (_, cqe, data) = self.done.remove(i);
        Some((cqe, data))
    }

    fn set_depth(&mut self, depth: usize) {
        self.machine.set_depth(depth);
    }

    fn close(&mut self) {
        // A socket the target closed first cannot be shut down again: nothing to do then.
        if let Err(e) = self.sock.shutdown(std::net::Shutdown::Both) {
            assert_eq!(e.kind(), ErrorKind::NotConnected, "shutdown: {e}");
        }
        self.gone = true;
    }

    fn gone(&self) -> bool {
        self.gone
    }

    fn error(&self) -> Option<String> {
        self.error.as_ref().map(|e| e.to_string())
    }
}
