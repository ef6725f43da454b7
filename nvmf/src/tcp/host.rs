//! The host side of one NVMe/TCP connection (one queue) as a state machine, the mirror
//! image of [`super::ControllerQueue`]: it sends ICReq and checks ICResp, builds command
//! capsules (data in-capsule when it fits the queue's limit, otherwise a Transport SGL
//! Data Block and the data on R2T), answers R2Ts with H2CData PDUs of at most MAXH2CDATA
//! bytes, and checks every C2HData and CapsuleResp against the command it names.
//!
//! Command IDs are slots of a table of the queue's depth; the caller keeps each command's
//! buffer and passes it in when the machine needs its bytes (in-capsule data, H2CData,
//! digests), so the machine never copies data. Output goes through the same
//! [`TxSink`] as the controller's: headers inline, data as `(cid, offset, len)`.
//!
//! Used by the repo's blocking test host (`nvmf-initiator`) and by in-memory
//! conversations with the engine (the soft engine's pair harness).
//!
//! SQ flow control: when the host disabled it (Connect CATTR bit 2, told to the machine with
//! [`HostQueue::set_sq_flow_control_disabled`]), every CapsuleResp must report SQHD FFFFh
//! and one that does not is [`HostError::Unexpected`].
//!
//! Not implemented: SQ flow-control accounting (with flow control on, SQHD is not checked;
//! the caller keeps at most SQSIZE commands outstanding), TLS, more than one command per
//! H2CData burst.

use super::*;

/// Which way a command moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Xfer {
    None,
    /// The caller's buffer is sent (in-capsule or on R2T).
    ToController,
    /// The caller's buffer is filled from C2HData.
    FromController,
}

/// How the host asks for the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// Digests asked for in ICReq; an ICResp granting others is refused.
    pub digests: Digests,
    /// HPDA sent in ICReq (C2H data alignment `(hpda+1)*4`).
    pub hpda: u8,
    /// MAXR2T sent in ICReq (0's based).
    pub maxr2t: u32,
    /// Largest C2HData accepted.
    pub max_c2h_data: u32,
}

/// A well-formed PDU that is wrong for the state of the queue, or a refused ICResp.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The controller broke framing; an H2CTermReq is queued.
    #[error("malformed PDU from the target: {0}")]
    Protocol(TermError),
    /// The controller sent C2HTermReq.
    #[error("target terminated the connection: FES {fes:#x} FEI {fei}")]
    Terminated { fes: u16, fei: u32 },
    /// ICResp not acceptable (digests not granted).
    #[error("ICResp rejected: {0}")]
    IcResp(String),
    /// Unknown CID, data out of range, data for a write...
    #[error("unexpected from the target: {0}")]
    Unexpected(String),
    #[error("all {0} command slots are in use")]
    QueueFull(usize),
}

/// What one received PDU meant to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostEvent<'a> {
    /// ICResp accepted; commands may be submitted.
    Connected(IcResp),
    /// Read data for command `cid`: copy `data` to `offset` of its buffer.
    Data {
        cid: u16,
        offset: u32,
        data: &'a [u8],
    },
    /// The controller asks for `len` bytes at `offset` of command `cid`'s data: call
    /// [`HostQueue::send_data`] with that part of the buffer.
    R2T {
        cid: u16,
        ttag: u16,
        offset: u32,
        len: u32,
    },
    /// Command `cid` completed (its slot is free again). A data digest error on its read
    /// data turns success into Data Transfer Error.
    Completion { cid: u16, cqe: Cqe },
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    busy: bool,
    to_controller: bool,
    from_controller: bool,
    len: u32,
    digest_error: bool,
}

/// One NVMe/TCP connection, host side.
#[derive(Debug)]
pub struct HostQueue {
    cfg: HostConfig,
    framer: RxFramer,
    ic: Option<IcResp>,
    /// In-capsule data limit of this queue.
    max_incapsule: u32,
    slots: Vec<Slot>,
    free: Vec<u16>,
    scratch: Vec<u8>,
    /// A C2HData with SUCCESS was reported as data; its completion comes next.
    pending_success: Option<u16>,
    /// SQ flow control is disabled on this queue: completions must report SQHD FFFFh.
    sqhd_disabled: bool,
}

impl HostQueue {
    /// A connection with `depth` command slots (CIDs `0..depth`) before Connect.
    pub fn new(cfg: HostConfig, depth: usize) -> HostQueue {
        let mut q = HostQueue {
            cfg,
            framer: RxFramer::new_host(HostLimits {
                hpda: cfg.hpda,
                max_c2h_data: cfg.max_c2h_data,
            }),
            ic: None,
            max_incapsule: ADMIN_MAX_INCAPSULE_DATA,
            slots: Vec::new(),
            free: Vec::new(),
            scratch: Vec::with_capacity(TERM_REQ_MAX_PLEN),
            pending_success: None,
            sqhd_disabled: false,
        };
        q.set_depth(depth);
        q
    }

    /// Queue ICReq (the first PDU of a connection).
    pub fn start(&mut self, out: &mut impl TxSink) {
        self.scratch.clear();
        encode_ic_req(
            &mut self.scratch,
            &IcReq {
                pfv: 0,
                hpda: self.cfg.hpda,
                digests: self.cfg.digests,
                maxr2t: self.cfg.maxr2t,
            },
        );
        out.header(&self.scratch);
    }

    /// Grow the CID table to `n` slots (Connect granted a deeper queue).
    pub fn set_depth(&mut self, n: usize) {
        while self.slots.len() < n {
            self.slots.push(Slot::default());
            self.free.push((self.slots.len() - 1) as u16);
        }
        // Lowest CIDs first, for readable traces.
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// The host asked for SQ flow control to be disabled on this queue (Connect CATTR bit
    /// 2): from now on every CapsuleResp must report SQHD FFFFh (the Connect's own
    /// completion included: nvmet and this target both report it there already).
    pub fn set_sq_flow_control_disabled(&mut self, disabled: bool) {
        self.sqhd_disabled = disabled;
    }

    /// In-capsule data limit for the commands submitted from now on.
    pub fn set_max_incapsule(&mut self, n: u32) {
        self.max_incapsule = n;
    }

    pub fn ic_resp(&self) -> Option<IcResp> {
        self.ic
    }

    /// The digests in force (none before ICResp).
    pub fn digests(&self) -> Digests {
        self.ic.map_or(Digests::NONE, |r| r.digests)
    }

    pub fn depth(&self) -> usize {
        self.slots.len()
    }

    /// Commands submitted and not completed.
    pub fn outstanding(&self) -> usize {
        self.slots.iter().filter(|s| s.busy).count()
    }

    pub fn needed(&self) -> usize {
        self.framer.needed()
    }

    /// Queue a command capsule. The machine fills in CID, PSDT and SGL1; `buf` is the
    /// data to send (`ToController`: in-capsule when it fits, otherwise on R2T) or the
    /// buffer to fill (`FromController`: only its length matters). Returns the CID.
    pub fn submit(
        &mut self,
        out: &mut impl TxSink,
        mut sqe: Sqe,
        xfer: Xfer,
        buf: &[u8],
    ) -> Result<u16, HostError> {
        let Some(cid) = self.free.pop() else {
            return Err(HostError::QueueFull(self.slots.len()));
        };
        let len = if xfer == Xfer::None {
            0
        } else {
            buf.len() as u32
        };
        let in_capsule = xfer == Xfer::ToController && len > 0 && len <= self.max_incapsule;
        sqe.set_opcode_cid(sqe.opcode(), cid);
        sqe.cdw0 = (sqe.cdw0 & !(3 << 14)) | 1 << 14; // PSDT 01b: SGLs
        sqe.dptr = if in_capsule {
            SglDescriptor::unkeyed(sgl::TYPE_DATA_BLOCK, sgl::SUBTYPE_OFFSET, 0, len)
        } else {
            SglDescriptor::unkeyed(
                sgl::TYPE_TRANSPORT_DATA_BLOCK,
                sgl::SUBTYPE_TRANSPORT,
                0,
                len,
            )
        };
        let cpda = self.ic.map_or(0, |r| r.cpda);
        let data: &[u8] = if in_capsule { buf } else { &[] };
        let d = self.digests();
        self.scratch.clear();
        encode_capsule_cmd_header(&mut self.scratch, &sqe, data.len() as u32, d, cpda);
        out.header(&self.scratch);
        if !data.is_empty() {
            out.data(cid as u32, 0, len);
            if d.data {
                out.header(&data_digest(data).to_le_bytes());
            }
        }
        self.slots[cid as usize] = Slot {
            busy: true,
            to_controller: xfer == Xfer::ToController,
            from_controller: xfer == Xfer::FromController,
            len,
            digest_error: false,
        };
        Ok(cid)
    }

    /// Answer an R2T: `data` is the part of command `cid`'s buffer it asked for (from
    /// `offset`); it goes out as H2CData PDUs of at most MAXH2CDATA bytes, the last one
    /// flagged LAST_PDU.
    pub fn send_data(
        &mut self,
        out: &mut impl TxSink,
        cid: u16,
        ttag: u16,
        offset: u32,
        data: &[u8],
    ) {
        let (cpda, max) = self
            .ic
            .map_or((0, MIN_MAXH2CDATA), |r| (r.cpda, r.maxh2cdata.max(4)));
        let d = self.digests();
        let end = data.len() as u32;
        let mut off = 0u32;
        while off < end {
            let n = max.min(end - off);
            let last = off + n == end;
            self.scratch.clear();
            encode_h2c_data_header(&mut self.scratch, cid, ttag, offset + off, n, last, d, cpda);
            out.header(&self.scratch);
            out.data(cid as u32, offset + off, n);
            if d.data {
                let part = &data[off as usize..(off + n) as usize];
                out.header(&data_digest(part).to_le_bytes());
            }
            off += n;
        }
    }

    /// Parse the PDU at the front of `buf` and check it against the queue. Returns how
    /// many bytes to drop and what it meant; `(0, None)` means more bytes are needed.
    pub fn receive<'a>(
        &mut self,
        buf: &'a [u8],
        out: &mut impl TxSink,
    ) -> Result<(usize, Option<HostEvent<'a>>), HostError> {
        if let Some(cid) = self.pending_success.take() {
            let ev = self.complete(Cqe::success(cid))?;
            return Ok((0, Some(ev)));
        }
        let Some((pdu, used)) = self.receive_raw(buf, out)? else {
            return Ok((0, None));
        };
        let ev = match pdu {
            Pdu::IcResp(r) => {
                if r.digests != self.cfg.digests {
                    return Err(HostError::IcResp(format!(
                        "asked digests {:?}, got {:?}",
                        self.cfg.digests, r.digests
                    )));
                }
                HostEvent::Connected(r)
            }
            Pdu::CapsuleResp { cqe } => {
                // (The completion made up for a C2HData with SUCCESS has no SQHD to
                // check.)
                if self.sqhd_disabled && cqe.sqhd != crate::queue::SQHD_FLOW_CONTROL_DISABLED {
                    return Err(unexpected(format!(
                        "SQHD {:#06x} in the completion of CID {}: SQ flow control is \
                         disabled on this queue, it must be 0xffff",
                        cqe.sqhd, cqe.cid
                    )));
                }
                self.complete(cqe)?
            }
            Pdu::C2HData {
                cccid,
                datao,
                data,
                last,
                success,
                data_digest_ok,
            } => {
                let Some(s) = self.slots.get_mut(cccid as usize).filter(|s| s.busy) else {
                    return Err(unexpected(format!("C2HData for idle CID {cccid}")));
                };
                if !s.from_controller {
                    return Err(unexpected(format!("C2HData for non-read CID {cccid}")));
                }
                let end = datao as u64 + data.len() as u64;
                if end > s.len as u64 {
                    return Err(unexpected(format!(
                        "C2HData {datao}+{} beyond the {}-byte buffer of CID {cccid}",
                        data.len(),
                        s.len
                    )));
                }
                s.digest_error |= !data_digest_ok;
                if success && last {
                    // No CapsuleResp follows: the completion is reported on the next call,
                    // after the caller has taken the data.
                    self.pending_success = Some(cccid);
                }
                HostEvent::Data {
                    cid: cccid,
                    offset: datao,
                    data,
                }
            }
            Pdu::R2T {
                cccid,
                ttag,
                r2to,
                r2tl,
            } => {
                let Some(s) = self.slots.get(cccid as usize).filter(|s| s.busy) else {
                    return Err(unexpected(format!("R2T for idle CID {cccid}")));
                };
                let end = r2to as u64 + r2tl as u64;
                if !s.to_controller || end > s.len as u64 || r2tl == 0 {
                    return Err(unexpected(format!(
                        "R2T {r2to}+{r2tl} for CID {cccid} with {} bytes to write",
                        if s.to_controller { s.len } else { 0 }
                    )));
                }
                HostEvent::R2T {
                    cid: cccid,
                    ttag,
                    offset: r2to,
                    len: r2tl,
                }
            }
            Pdu::C2HTermReq { fes, fei } => return Err(HostError::Terminated { fes, fei }),
            other => return Err(unexpected(format!("{other:?}"))),
        };
        Ok((used, Some(ev)))
    }
}

impl HostQueue {
    /// Parse the PDU at the front of `buf` with no command checks (for tests that look
    /// at raw PDUs). An ICResp still sets the connection's digests and CPDA; a framing
    /// error queues an H2CTermReq carrying the offending header.
    pub fn receive_raw<'a>(
        &mut self,
        buf: &'a [u8],
        out: &mut impl TxSink,
    ) -> Result<Option<(Pdu<'a>, usize)>, HostError> {
        match self.framer.parse(buf) {
            Ok(Some((pdu, used))) => {
                if let Pdu::IcResp(r) = pdu {
                    self.ic = Some(r);
                    self.framer.set_digests(r.digests);
                }
                Ok(Some((pdu, used)))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                if e.send_term_req {
                    self.scratch.clear();
                    encode_term_req(
                        &mut self.scratch,
                        false,
                        e.fes,
                        e.fei,
                        e.offending_header(buf),
                    );
                    out.header(&self.scratch);
                }
                Err(HostError::Protocol(e))
            }
        }
    }

    /// A completion for `cqe.cid`: the slot is freed.
    fn complete(&mut self, mut cqe: Cqe) -> Result<HostEvent<'static>, HostError> {
        let cid = cqe.cid;
        let Some(s) = self.slots.get_mut(cid as usize).filter(|s| s.busy) else {
            return Err(unexpected(format!("completion for idle CID {cid}")));
        };
        if s.digest_error && cqe.status().is_success() {
            cqe.status = crate::spec::Status::DATA_TRANSFER_ERROR.to_field();
        }
        *s = Slot::default();
        self.free.push(cid);
        Ok(HostEvent::Completion { cid, cqe })
    }
}

fn unexpected(s: String) -> HostError {
    HostError::Unexpected(s)
}
