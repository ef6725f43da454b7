//! A hostile NVMe/RDMA host for the interop guest's Soft-RoCE (`tests/interop/scenarios/
//! nvmft-rdma.sh`): it connects an admin queue the way the Linux host does (CM private
//! data, RNR retry 7 in its request, Connect data by keyed SGL read by the target), then
//! sends commands and posts no receive for their answers. The target's SENDs then meet
//! RNR NAKs, which the host's request told the target's QP to retry forever: only the
//! target's own deadline can end it. Prints what happened and exits 0 when the target
//! disconnected the queue within `--expect-within` seconds, 1 when it did not (or on any
//! setup error).
//!
//! ```sh
//! rdma_silent_host --addr 198.18.0.1:4421 --subnqn NQN [--commands 8] [--expect-within 20]
//! rdma_silent_host --addr 198.18.0.1:4421 --subnqn NQN --bad-key
//! rdma_silent_host --addr 198.18.0.1:4421 --no-connect 32 [--hold 5]
//! ```
//!
//! `--bad-key` sends a Connect whose data key the NIC refuses; `--no-connect N` opens N
//! I/O-queue connections (depth 128) that never send a Fabrics Connect and holds them.
//!
//! Exactly what a hostile host can do, nothing the kernel initiator would: it proves the
//! target bounds how long such a host holds a queue and its command slots.

// `unsafe` allowed here: rdma-core's C API through the pointers `sta::verbs::ffi` loads.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use nvmf::rdma::{CmRequest, KeyedSgl};
use nvmf::spec::fabrics::{ConnectCommand, ConnectData, CNTLID_DYNAMIC};
use nvmf::spec::{Cqe, Sqe};
use sta::verbs::ffi::{self, IbvCq, IbvQp, IbvRecvWr, IbvSendWr, IbvSge, IbvWc, Lib};
use zerocopy::{FromBytes, IntoBytes};

struct Args {
    addr: SocketAddr,
    subnqn: String,
    hostnqn: String,
    commands: u16,
    expect_within: Duration,
    /// Give the Connect's data a key the NIC refuses (the target's RDMA READ of it fails)
    /// instead of taking no answers.
    bad_key: bool,
    /// Hold this many I/O-queue connections that never send a Fabrics Connect.
    no_connect: Option<u32>,
    hold: Duration,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        addr: "198.18.0.1:4421".parse().unwrap(),
        subnqn: String::new(),
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:5e1e0700-0000-4000-8000-0000000000a1".into(),
        commands: 8,
        expect_within: Duration::from_secs(20),
        bad_key: false,
        no_connect: None,
        hold: Duration::from_secs(5),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        if k == "--bad-key" {
            a.bad_key = true;
            continue;
        }
        let v = it.next().ok_or_else(|| format!("{k} needs a value"))?;
        match k.as_str() {
            "--addr" => a.addr = v.parse().map_err(|e| format!("--addr {v}: {e}"))?,
            "--subnqn" => a.subnqn = v,
            "--hostnqn" => a.hostnqn = v,
            "--no-connect" => {
                a.no_connect = Some(v.parse().map_err(|e| format!("--no-connect: {e}"))?)
            }
            "--hold" => {
                a.hold = Duration::from_secs(v.parse().map_err(|e| format!("--hold: {e}"))?)
            }
            "--commands" => a.commands = v.parse().map_err(|e| format!("--commands: {e}"))?,
            "--expect-within" => {
                a.expect_within =
                    Duration::from_secs(v.parse().map_err(|e| format!("--expect-within: {e}"))?)
            }
            _ => return Err(format!("unknown option {k}")),
        }
    }
    if a.subnqn.is_empty() && a.no_connect.is_none() {
        return Err("--subnqn is required".into());
    }
    Ok(a)
}

fn main() -> ExitCode {
    match args().and_then(run) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("rdma_silent_host: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The next CM event on `ch`, which must be `want` (its status 0); acked.
fn expect_event(lib: &Lib, ch: *mut ffi::RdmaEventChannel, want: u32) -> Result<(), String> {
    let mut ev: *mut ffi::RdmaCmEventRaw = null_mut();
    // SAFETY: `ch` is a live event channel; `ev` receives an event we ack below.
    if unsafe { (lib.get_cm_event)(ch, &mut ev) } != 0 {
        return Err(format!(
            "rdma_get_cm_event: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: librdmacm handed us this event; it stays valid until acked.
    let (event, status) = unsafe { ((*ev).event, (*ev).status) };
    // SAFETY: acked once.
    unsafe { (lib.ack_cm_event)(ev) };
    if event != want || status != 0 {
        return Err(format!("CM event {event} status {status}, wanted {want}"));
    }
    Ok(())
}

/// Poll `cq` until a completion of `wr_id` comes (or `limit` passes).
fn wait_wc(cq: *mut IbvCq, wr_id: u64, limit: Duration) -> Result<IbvWc, String> {
    let start = Instant::now();
    loop {
        let mut wc = IbvWc::default();
        // SAFETY: `cq` is live; its context's ops table is rdma-core's.
        let n = unsafe { ((*(*cq).context).ops.poll_cq)(cq, 1, &mut wc) };
        if n < 0 {
            return Err("ibv_poll_cq failed".into());
        }
        if n == 1 {
            if wc.status != ffi::IBV_WC_SUCCESS {
                return Err(format!(
                    "WR {} completed with status {}",
                    wc.wr_id, wc.status
                ));
            }
            if wc.wr_id == wr_id {
                return Ok(wc);
            }
            continue;
        }
        if start.elapsed() > limit {
            return Err(format!("no completion of WR {wr_id} in {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn post_send(qp: *mut IbvQp, wr_id: u64, sge: &mut IbvSge) -> Result<(), String> {
    let mut wr = IbvSendWr {
        wr_id,
        sg_list: sge,
        num_sge: 1,
        opcode: ffi::IBV_WR_SEND,
        send_flags: ffi::IBV_SEND_SIGNALED,
        ..Default::default()
    };
    let mut bad: *mut IbvSendWr = null_mut();
    // SAFETY: `qp` is live, `wr` and its SGE point into a registered buffer that outlives
    // the send (the process waits for its completion or exits).
    let rc = unsafe { ((*(*qp).context).ops.post_send)(qp, &mut wr, &mut bad) };
    if rc != 0 {
        return Err(format!("ibv_post_send: {rc}"));
    }
    Ok(())
}

/// One RC connection through the CM, established; everything leaked with the process.
struct Conn {
    ch: *mut ffi::RdmaEventChannel,
    ctx: *mut ffi::IbvContext,
    pd: *mut ffi::IbvPd,
    cq: *mut IbvCq,
    qp: *mut IbvQp,
}

/// Resolve `addr`, create a QP of `depth` work requests and ask for NVMe/RDMA queue `qid`
/// of depth `depth` (CM private data as the Linux host sends it, RNR retry 7); `before`
/// runs between QP creation and the request (to post receives).
fn cm_connect(
    lib: &Lib,
    addr: SocketAddr,
    qid: u16,
    depth: u16,
    before: impl FnOnce(&Conn) -> Result<(), String>,
) -> Result<Conn, String> {
    // SAFETY: every pointer passed below comes from the call before it and lives to the
    // end of the process (nothing is destroyed).
    unsafe {
        let ch = (lib.create_event_channel)();
        if ch.is_null() {
            return Err("rdma_create_event_channel failed".into());
        }
        let mut id: *mut ffi::RdmaCmIdRaw = null_mut();
        if (lib.create_id)(ch, &mut id, null_mut(), ffi::RDMA_PS_TCP) != 0 {
            return Err("rdma_create_id failed".into());
        }
        let (dst, _) = sta::verbs::sockaddr_of(addr);
        let dst = &dst as *const libc::sockaddr_storage as *const libc::sockaddr;
        if (lib.resolve_addr)(id, std::ptr::null(), dst, 2000) != 0 {
            return Err("rdma_resolve_addr failed".into());
        }
        expect_event(lib, ch, ffi::RDMA_CM_EVENT_ADDR_RESOLVED)?;
        if (lib.resolve_route)(id, 2000) != 0 {
            return Err("rdma_resolve_route failed".into());
        }
        expect_event(lib, ch, ffi::RDMA_CM_EVENT_ROUTE_RESOLVED)?;
        let ctx = (*id).verbs;
        let pd = (lib.alloc_pd)(ctx);
        let cq = (lib.create_cq)(ctx, 64, null_mut(), null_mut(), 0);
        if pd.is_null() || cq.is_null() {
            return Err("ibv_alloc_pd/ibv_create_cq failed".into());
        }
        let mut attr = ffi::IbvQpInitAttr {
            qp_context: null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: null_mut(),
            cap: ffi::IbvQpCap {
                max_send_wr: depth as u32,
                max_recv_wr: depth as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        if (lib.create_qp)(id, pd, &mut attr) != 0 {
            return Err("rdma_create_qp failed".into());
        }
        let c = Conn {
            ch,
            ctx,
            pd,
            cq,
            qp: (*id).qp,
        };
        before(&c)?;
        let pdata = CmRequest {
            recfmt: 0,
            qid,
            hrqsize: depth,
            hsqsize: depth - 1,
            cntlid: 0,
        }
        .encode();
        let mut param = ffi::RdmaConnParam {
            private_data: pdata.as_ptr() as *const c_void,
            private_data_len: pdata.len() as u8,
            responder_resources: 4,
            initiator_depth: 4,
            flow_control: 1,
            retry_count: 7,
            // What the Linux and SPDK hosts ask for: the target's QP retries RNR forever.
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        };
        if (lib.connect)(id, &mut param) != 0 {
            return Err("rdma_connect failed".into());
        }
        expect_event(lib, ch, ffi::RDMA_CM_EVENT_ESTABLISHED)?;
        Ok(c)
    }
}

/// `--no-connect N`: N I/O-queue connections (depth 128) that never send a Fabrics
/// Connect, held for `hold`; Ok(true) when all were established.
fn hold_unconnected(lib: &Lib, a: &Args, n: u32, hold: Duration) -> Result<bool, String> {
    let mut conns = Vec::new();
    for _ in 0..n {
        conns.push(cm_connect(lib, a.addr, 1, 128, |_| Ok(()))?);
    }
    println!("established {n} connections (queue 1, depth 128), no Fabrics Connect; holding");
    std::thread::sleep(hold);
    println!("done holding");
    Ok(true)
}

fn run(a: Args) -> Result<bool, String> {
    let lib = sta::verbs::lib().map_err(|e| e.to_string())?;
    if let Some(n) = a.no_connect {
        return hold_unconnected(lib, &a, n, a.hold);
    }
    let depth: u16 = 32;
    // Layout: [0, 1024) Connect data, then one CQE slot, then SQEs, 64 bytes each.
    let cqe_off = 1024usize;
    let sqe_off = 2048usize;
    let buf: &'static mut [u8] = Box::leak(vec![0u8; 8192].into_boxed_slice());
    let base = buf.as_ptr() as u64;
    let mut keys = (0, 0);
    // One receive, posted before the request: for the Connect's answer. None after it.
    let c = cm_connect(lib, a.addr, 0, depth, |c| {
        // SAFETY: `buf` is leaked (lives to the end of the process); `c` is live.
        unsafe {
            let mr = (lib.reg_mr)(
                c.pd,
                buf.as_ptr() as *mut c_void,
                buf.len(),
                ffi::IBV_ACCESS_LOCAL_WRITE
                    | ffi::IBV_ACCESS_REMOTE_READ
                    | ffi::IBV_ACCESS_REMOTE_WRITE,
            );
            if mr.is_null() {
                return Err(format!("ibv_reg_mr: {}", std::io::Error::last_os_error()));
            }
            keys = ((*mr).lkey, (*mr).rkey);
            let mut rsge = IbvSge {
                addr: base + cqe_off as u64,
                length: Cqe::SIZE as u32,
                lkey: keys.0,
            };
            let mut rwr = IbvRecvWr {
                wr_id: 1,
                next: null_mut(),
                sg_list: &mut rsge,
                num_sge: 1,
            };
            let mut bad: *mut IbvRecvWr = null_mut();
            if ((*c.ctx).ops.post_recv)(c.qp, &mut rwr, &mut bad) != 0 {
                return Err("ibv_post_recv failed".into());
            }
        }
        Ok(())
    })?;
    let (lkey, rkey) = keys;
    let (ch, cq, qp) = (c.ch, c.cq, c.qp);
    // Fabrics Connect, its data read by the target (keyed SGL), KATO 0.
    let cd = ConnectData::new([0xa1; 16], CNTLID_DYNAMIC, &a.subnqn, &a.hostnqn);
    buf[..1024].copy_from_slice(cd.as_bytes());
    let mut sqe = ConnectCommand {
        recfmt: 0,
        qid: 0,
        sqsize: depth - 1,
        cattr: 0,
        kato: 0,
    }
    .to_sqe(1);
    sqe.dptr = KeyedSgl {
        addr: base,
        len: 1024,
        key: if a.bad_key { rkey ^ 0x5a5a_0000 } else { rkey },
        invalidate: false,
    }
    .encode();
    buf[sqe_off..sqe_off + 64].copy_from_slice(sqe.as_bytes());
    let mut ssge = IbvSge {
        addr: base + sqe_off as u64,
        length: 64,
        lkey,
    };
    post_send(qp, 100, &mut ssge)?;
    if a.bad_key {
        // No completion to wait for: the target's READ with the bad key puts our QP in
        // error as well (the responder's remote access error), which may flush the send
        // before its acknowledgement comes.
        println!("sent a Connect whose data has a key our NIC refuses");
        return wait_disconnect(lib, ch, a.expect_within);
    }
    wait_wc(cq, 100, Duration::from_secs(10))?;
    wait_wc(cq, 1, Duration::from_secs(10))?;
    let cqe = Cqe::read_from_bytes(&buf[cqe_off..cqe_off + Cqe::SIZE]).map_err(|_| "CQE layout")?;
    if !cqe.status().is_success() {
        return Err(format!("Connect answered {}", cqe.status()));
    }
    let cntlid = cqe.dw0 as u16;
    println!("connected: admin queue, cntlid {cntlid}, KATO 0; no receives posted from now on");

    // Commands with no data (Get Features, Number of Queues): each answer is a SEND
    // the host has no receive for.
    for i in 0..a.commands {
        let mut s = Sqe::default();
        s.set_opcode_cid(0x0a, 10 + i);
        s.cdw10 = 0x07;
        let off = sqe_off + 64 * (1 + i as usize);
        buf[off..off + 64].copy_from_slice(s.as_bytes());
        let mut sge = IbvSge {
            addr: base + off as u64,
            length: 64,
            lkey,
        };
        post_send(qp, 200 + i as u64, &mut sge)?;
        wait_wc(cq, 200 + i as u64, Duration::from_secs(10))?;
    }
    println!(
        "sent {} commands; waiting up to {:?} for the target to end the queue",
        a.commands, a.expect_within
    );
    wait_disconnect(lib, ch, a.expect_within)
}

/// Waits up to `limit` for the target to disconnect: Ok(true) when it did.
fn wait_disconnect(
    lib: &Lib,
    ch: *mut ffi::RdmaEventChannel,
    limit: Duration,
) -> Result<bool, String> {
    // SAFETY: `ch` is the live event channel of the connection; events are acked once.
    unsafe {
        let start = Instant::now();
        let fd = (*ch).fd;
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            let left = limit.saturating_sub(start.elapsed());
            if left.is_zero() {
                println!(
                    "FAIL: the target still holds the queue after {:?}",
                    start.elapsed()
                );
                return Ok(false);
            }
            if libc::poll(&mut pfd, 1, left.as_millis().min(1000) as c_int) <= 0 {
                continue;
            }
            let mut ev: *mut ffi::RdmaCmEventRaw = null_mut();
            if (lib.get_cm_event)(ch, &mut ev) != 0 {
                return Err("rdma_get_cm_event".into());
            }
            let event = (*ev).event;
            (lib.ack_cm_event)(ev);
            if event == ffi::RDMA_CM_EVENT_DISCONNECTED {
                println!(
                    "OK: the target disconnected the queue after {:.1} s",
                    start.elapsed().as_secs_f64()
                );
                return Ok(true);
            }
            println!("CM event {event}");
        }
    }
}
