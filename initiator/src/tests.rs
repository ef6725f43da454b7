//! The host against a tiny in-process fake target built on `nvmf::tcp`'s controller-side
//! framer and encoders: a whole conversation on loopback, both ends of the codec at once.

use super::*;
use nvmf::spec::opcodes;
use nvmf::tcp::{self, ControllerLimits, RxFramer};
use std::collections::HashMap;
use std::net::TcpListener;

const MAXH2CDATA: u32 = 4096;
const LBA: usize = 512;

/// Serves one connection until EOF or a fatal error; returns the FES it sent, if any.
fn serve(mut s: TcpStream) -> Option<u16> {
    let limits = ControllerLimits {
        max_h2c_data: MAXH2CDATA,
        max_incapsule_data: 8192,
        cpda: 0,
    };
    let mut f = RxFramer::new_controller(limits);
    let mut buf = Vec::new();
    let mut tmp = vec![0u8; 65536];
    let mut disk = vec![0u8; 1 << 20];
    let mut pending: HashMap<u16, (Sqe, Vec<u8>, usize)> = HashMap::new();
    let (mut d, mut hpda, mut qid, mut cc) = (Digests::NONE, 0u8, 0u16, 0u32);
    let mut out = Vec::new();
    loop {
        loop {
            let (ready, n) = match f.parse(&buf) {
                Ok(Some((p, n))) => match p {
                    Pdu::IcReq(r) => {
                        out.clear();
                        tcp::encode_ic_resp(&mut out, &limits.ic_resp(&r));
                        s.write_all(&out).ok()?;
                        f.set_digests(r.digests);
                        (d, hpda) = (r.digests, r.hpda);
                        (None, n)
                    }
                    Pdu::CapsuleCmd { sqe, data, .. } => {
                        let len = sqe.dptr.length() as usize;
                        let h2c = if sqe.is_fabrics() {
                            sqe.fctype() & 3 == 1
                        } else {
                            sqe.opcode() & 3 == 1
                        };
                        if h2c && data.is_empty() && len > 0 {
                            // Ask for the data in 8 KiB R2Ts, all at once.
                            out.clear();
                            for (i, off) in (0..len).step_by(8192).enumerate() {
                                let l = (len - off).min(8192) as u32;
                                tcp::encode_r2t(&mut out, sqe.cid(), i as u16, off as u32, l, d);
                            }
                            s.write_all(&out).ok()?;
                            pending.insert(sqe.cid(), (sqe, vec![0; len], 0));
                            (None, n)
                        } else {
                            (Some((sqe, data.to_vec())), n)
                        }
                    }
                    Pdu::H2CData {
                        cccid, datao, data, ..
                    } => {
                        let (sqe, b, got) = pending.get_mut(&cccid)?;
                        b[datao as usize..datao as usize + data.len()].copy_from_slice(data);
                        *got += data.len();
                        if *got == b.len() {
                            let (sqe, b) = (*sqe, std::mem::take(b));
                            pending.remove(&cccid);
                            (Some((sqe, b)), n)
                        } else {
                            (None, n)
                        }
                    }
                    Pdu::H2CTermReq { .. } => return None,
                    _ => return None,
                },
                Ok(None) => break,
                Err(e) => {
                    out.clear();
                    tcp::encode_term_req(&mut out, true, e.fes, e.fei, e.offending_header(&buf));
                    let _ = s.write_all(&out);
                    return Some(e.fes);
                }
            };
            buf.drain(..n);
            if let Some((sqe, data)) = ready {
                let (status, value, rd) = execute(&sqe, &data, &mut disk, &mut qid, &mut cc);
                out.clear();
                let mut success_flag = false;
                if !rd.is_empty() {
                    // Odd CIDs get their data in 3000-byte pieces ending with SUCCESS.
                    success_flag = status.is_success() && sqe.cid() % 2 == 1;
                    let chunks: Vec<_> = rd.chunks(3000).collect();
                    for (i, c) in chunks.iter().enumerate() {
                        let last = i + 1 == chunks.len();
                        tcp::encode_c2h_data(
                            &mut out,
                            sqe.cid(),
                            (i * 3000) as u32,
                            c,
                            last,
                            last && success_flag,
                            d,
                            hpda,
                        );
                    }
                }
                if !success_flag {
                    let mut cqe = Cqe::new(sqe.cid(), status);
                    cqe.dw0 = value as u32;
                    cqe.dw1 = (value >> 32) as u32;
                    tcp::encode_capsule_resp(&mut out, &cqe, d);
                }
                s.write_all(&out).ok()?;
            }
        }
        let n = s.read(&mut tmp).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

fn execute(
    sqe: &Sqe,
    data: &[u8],
    disk: &mut [u8],
    qid: &mut u16,
    cc: &mut u32,
) -> (Status, u64, Vec<u8>) {
    let ok = |v: u64| (Status::SUCCESS, v, Vec::new());
    if sqe.is_fabrics() {
        return match sqe.fctype() {
            opcodes::fabrics::CONNECT => {
                assert_eq!(data.len(), 1024);
                *qid = ConnectCommand::from_sqe(sqe).qid;
                ok(1)
            }
            opcodes::fabrics::PROPERTY_GET => match PropertyCommand::from_sqe(sqe).offset {
                fabrics::property::CAP => ok(1 << 24 | 127),
                fabrics::property::CC => ok(*cc as u64),
                fabrics::property::CSTS => ok((*cc & 1) as u64),
                _ => ok(0),
            },
            opcodes::fabrics::PROPERTY_SET => {
                *cc = PropertyCommand::from_sqe(sqe).value as u32;
                ok(0)
            }
            _ => (Status::INVALID_OPCODE, 0, Vec::new()),
        };
    }
    if *qid == 0 {
        return match sqe.opcode() {
            admin::IDENTIFY => (
                Status::SUCCESS,
                0,
                (0..4096).map(|i| (i as u8) ^ sqe.cdw10 as u8).collect(),
            ),
            admin::GET_LOG_PAGE => {
                let numd = (sqe.cdw10 >> 16 | sqe.cdw11 << 16) as usize + 1;
                (
                    Status::SUCCESS,
                    0,
                    (0..numd * 4)
                        .map(|i| (i + sqe.cdw12 as usize) as u8)
                        .collect(),
                )
            }
            admin::GET_FEATURES | admin::SET_FEATURES => ok(sqe.cdw11 as u64),
            admin::KEEP_ALIVE => ok(0),
            _ => (Status::INVALID_OPCODE, 0, Vec::new()),
        };
    }
    let (off, len) = (sqe.slba() as usize * LBA, sqe.nlb() as usize * LBA);
    if matches!(
        sqe.opcode(),
        io::READ | io::WRITE | io::COMPARE | io::WRITE_ZEROES
    ) && off + len > disk.len()
    {
        return (Status::LBA_OUT_OF_RANGE, 0, Vec::new());
    }
    match sqe.opcode() {
        io::READ => (Status::SUCCESS, 0, disk[off..off + len].to_vec()),
        io::WRITE => {
            disk[off..off + len].copy_from_slice(data);
            ok(0)
        }
        io::COMPARE if disk[off..off + len] == *data => ok(0),
        io::COMPARE => (Status::COMPARE_FAILURE, 0, Vec::new()),
        io::FLUSH => ok(0),
        io::WRITE_ZEROES => {
            disk[off..off + len].fill(0);
            ok(0)
        }
        io::DATASET_MANAGEMENT => {
            for r in data.chunks(16) {
                let nlb = u32::from_le_bytes(r[4..8].try_into().unwrap()) as usize;
                let slba = u64::from_le_bytes(r[8..16].try_into().unwrap()) as usize;
                disk[slba * LBA..(slba + nlb) * LBA].fill(0);
            }
            ok(0)
        }
        _ => (Status::INVALID_OPCODE, 0, Vec::new()),
    }
}

/// A fake target on loopback serving one connection; the handle returns the FES it sent.
fn fake_target() -> (std::net::SocketAddr, std::thread::JoinHandle<Option<u16>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        serve(s)
    });
    (addr, t)
}

fn opts(header_digest: bool, data_digest: bool) -> HostOptions {
    HostOptions {
        header_digest,
        data_digest,
        timeout: Duration::from_secs(5),
        ..Default::default()
    }
}

#[test]
fn admin_conversation() {
    for (hd, dd) in [(false, false), (true, true)] {
        let (addr, t) = fake_target();
        let mut h = TcpHost::connect(addr, opts(hd, dd)).unwrap();
        assert_eq!(
            h.digests(),
            Digests {
                header: hd,
                data: dd
            }
        );
        assert_eq!(
            h.connect_admin("nqn.2024-01.io.example:sub", 15000)
                .unwrap(),
            1
        );
        h.enable_controller().unwrap();
        assert_eq!(
            h.property_get(fabrics::property::CSTS, false).unwrap() & 1,
            1
        );
        let id = h.identify(1, 0).unwrap();
        assert_eq!((id.len(), id[0], id[4095]), (4096, 1, 0xfe));
        let log = h.get_log_page(2, 0xffff_ffff, 8, 512, false).unwrap();
        assert_eq!((log.len(), log[0], log[1]), (512, 8, 9));
        assert_eq!(h.get_features(7, 0, 0x0003_0003).unwrap(), 0x0003_0003);
        assert_eq!(h.set_features(7, 0, 5, false).unwrap(), 5);
        h.keep_alive().unwrap();
        let mut sqe = Sqe::default();
        sqe.set_opcode_cid(0x7e, 0);
        let (cqe, _) = h.submit_admin_raw(sqe, &[], 0).unwrap();
        assert_eq!(cqe.status(), Status::INVALID_OPCODE);
        drop(h);
        assert_eq!(t.join().unwrap(), None);
    }
}

#[test]
fn io_in_capsule_and_r2t() {
    for (hd, dd) in [(false, false), (true, false), (true, true)] {
        let (addr, t) = fake_target();
        let mut h = TcpHost::connect(addr, opts(hd, dd)).unwrap();
        // The I/O queue Connect data goes by R2T (io_max_incapsule 0).
        h.connect_io("nqn.2024-01.io.example:sub", 1, 1, 127)
            .unwrap();
        assert_eq!(h.queue_depth(), 127);
        let data: Vec<u8> = (0..20 * LBA).map(|i| (i * 7 + i / LBA) as u8).collect();
        assert_eq!(h.write(1, 10, &data, false).unwrap(), Status::SUCCESS);
        h.set_max_incapsule(4096);
        assert_eq!(
            h.write(1, 100, &data[..4096], true).unwrap(),
            Status::SUCCESS
        );
        let mut back = vec![0; data.len()];
        assert_eq!(h.read(1, 10, 20, &mut back).unwrap(), Status::SUCCESS);
        assert_eq!(back, data);
        let mut back = vec![0; 4096];
        assert_eq!(h.read(1, 100, 8, &mut back).unwrap(), Status::SUCCESS);
        assert_eq!(back, data[..4096]);
        assert_eq!(h.compare(1, 10, &data[..LBA]).unwrap(), Status::SUCCESS);
        assert_eq!(
            h.compare(1, 11, &data[..LBA]).unwrap(),
            Status::COMPARE_FAILURE
        );
        assert_eq!(h.flush(1).unwrap(), Status::SUCCESS);
        assert_eq!(h.write_zeroes(1, 10, 1).unwrap(), Status::SUCCESS);
        assert_eq!(
            h.dsm_deallocate(1, &[(11, 1), (100, 8)]).unwrap(),
            Status::SUCCESS
        );
        let mut back = vec![0xff; 3 * LBA];
        h.read(1, 10, 3, &mut back).unwrap();
        assert!(back[..2 * LBA].iter().all(|&b| b == 0));
        assert_eq!(back[2 * LBA..], data[2 * LBA..3 * LBA]);
        assert_eq!(
            h.read(1, 1 << 20, 1, &mut back[..LBA]).unwrap(),
            Status::LBA_OUT_OF_RANGE
        );
        assert!(matches!(
            h.write(1, 0, &[0; 100], false),
            Err(Error::InvalidArgument(_))
        ));
        drop(h);
        assert_eq!(t.join().unwrap(), None);
    }
}

#[test]
fn pipelined_writes_and_reads() {
    let (addr, t) = fake_target();
    let mut h = TcpHost::connect(addr, opts(true, true)).unwrap();
    h.connect_io("nqn.2024-01.io.example:sub", 1, 1, 31)
        .unwrap();
    let mut bufs: Vec<Vec<u8>> = (0..16).map(|i| vec![i as u8 + 1; 16 * LBA]).collect();
    let mut cids = Vec::new();
    for (i, b) in bufs.drain(..).enumerate() {
        cids.push(
            h.submit(Request::write(1, i as u64 * 16, 16, b, false))
                .unwrap(),
        );
    }
    assert_eq!(h.outstanding(), 16);
    for _ in 0..16 {
        let c = h.poll_completion().unwrap();
        assert!(c.cqe.status().is_success());
        bufs.push(c.buf);
    }
    for (i, b) in bufs.drain(..).enumerate() {
        h.submit(Request::read(1, i as u64 * 16, 16, b)).unwrap();
    }
    let mut seen = 0;
    for _ in 0..16 {
        let c = h.poll_completion().unwrap();
        assert!(c.cqe.status().is_success());
        let first = c.buf[0];
        assert!(first >= 1 && c.buf.iter().all(|&b| b == first));
        seen |= 1u32 << (first - 1);
    }
    assert_eq!(seen, 0xffff);
    assert_eq!(h.outstanding(), 0);
    drop(h);
    assert_eq!(t.join().unwrap(), None);
}

#[test]
fn raw_malformed_pdu_gets_term_req() {
    let (addr, t) = fake_target();
    let mut h = TcpHost::connect_raw(addr, opts(false, false)).unwrap();
    // A CapsuleCmd before ICReq: PDU Sequence Error.
    let mut b = Vec::new();
    tcp::encode_capsule_cmd(&mut b, &Sqe::default(), &[], Digests::NONE, 0);
    h.send_raw(&b).unwrap();
    assert_eq!(
        h.recv_pdu().unwrap(),
        OwnedPdu::C2HTermReq {
            fes: tcp::fes::PDU_SEQUENCE_ERROR,
            fei: 0
        }
    );
    assert!(matches!(h.recv_pdu(), Err(Error::Eof)));
    assert_eq!(t.join().unwrap(), Some(tcp::fes::PDU_SEQUENCE_ERROR));
}

#[test]
fn recv_times_out() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || l.accept().map(|(s, _)| s));
    let o = HostOptions {
        timeout: Duration::from_millis(100),
        ..Default::default()
    };
    assert!(matches!(TcpHost::connect(addr, o), Err(Error::Timeout)));
    drop(t.join());
}
