//! The controller side of one NVMe/TCP connection (one queue) as a state machine: bytes
//! in, validated capsules and host data out, every PDU the controller sends built here.
//!
//! What it owns (NVMe/TCP 1.0 sections 3.3 and 3.6):
//!
//! - the receive framer and connection initialization: ICReq checked (PFV 0, HPDA; the
//!   framer refuses the rest) and answered with ICResp (PFV 0, our CPDA and MAXH2CDATA,
//!   the digests the host asked for);
//! - capsule intake, counting capsules for SQHD ([`crate::queue::SqHead`]);
//! - host data transfers keyed by TTAG (the engine's command slot): an R2T registers the
//!   range it solicits; each H2CData must name a solicited TTAG (FES Invalid PDU Header
//!   Field, FEI 10 otherwise), that command's CCCID (FEI 8), the next offset (FES Data
//!   Transfer Out of Range) and stay inside the range, and LAST_PDU may only mark the PDU
//!   that completes the range (FES Invalid PDU Header Field, FEI 1: a host that says it is
//!   done early would otherwise hold the buffer until the host-data deadline; a last PDU
//!   without the flag is accepted, as nvmet and SPDK do); data digests are checked per PDU
//!   and reported once the transfer is complete; large H2CData PDUs may be streamed
//!   (checked at their header, payload moved by the engine straight into its buffer,
//!   digest checked at the end: [`ControllerQueue::set_stream_host_data`]);
//! - responses: C2HData (one PDU, LAST_PDU, padded to the host's HPDA) with the SUCCESS
//!   flag when the host disabled SQ flow control and the completion is plain success
//!   (section 3.3.6.4: no CapsuleResp then), otherwise a CapsuleResp; SQHD and SQID
//!   filled in;
//! - fatal errors: a C2HTermReq carrying the header of the PDU in error (section 3.6.2.4;
//!   as much of it as has arrived: a bad common header is refused as soon as its 8 bytes
//!   are in, without waiting for the rest), after which the machine takes no more input;
//! - submission queue flow control: a queue holds SQSIZE + 1 entries (32 before Connect).
//!   The engine reports each command it has finished with ([`ControllerQueue::command_released`],
//!   once its response is on the wire, so before the host can have seen it); a capsule
//!   arriving while SQSIZE + 1 commands are outstanding breaks flow control (NVMe-oF: the
//!   host shall not submit to a full queue) and ends the connection with a C2HTermReq,
//!   PDU Sequence Error. Linux nvmet closes the queue in that case too ("out of commands");
//! - giving up on a connection the machine has nothing against but time (host data that
//!   never came): [`ControllerQueue::abort`].
//!
//! Output goes through [`TxSink`]: PDU headers (and small PDUs) as bytes, command data as
//! a reference to the engine's buffer so it is never copied, and a release marker once a
//! command's last byte is queued. Data digests are computed over the buffer slice the
//! engine passes in. The machine allocates nothing per PDU once its tables have grown to
//! the queue depth.
//!
//! Not implemented: more than one R2T outstanding per command (the engine solicits a
//! command's whole transfer with one R2T; MAXR2T is therefore never exceeded), TLS.

use super::*;
use crate::queue::{QueueParams, SqHead};

/// Where a connection's output goes, in order.
pub trait TxSink {
    /// PDU header bytes (or a whole small PDU, or a data digest), copied.
    fn header(&mut self, bytes: &[u8]);
    /// `len` bytes at `offset` of the data buffer of the engine's command `slot`.
    fn data(&mut self, slot: u32, offset: u32, len: u32);
    /// Once everything queued before this is sent, command `slot` may be released.
    fn release(&mut self, slot: u32);
}

/// Why the controller ended a connection (for logs and counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FatalCause {
    /// The framer refused a PDU (its FES/FEI say which field).
    Malformed,
    /// ICReq refused (unsupported PFV or HPDA).
    IcReqRejected,
    /// H2CData for no outstanding R2T.
    UnknownTtag,
    /// H2CData whose CCCID is not that of the command its TTAG names.
    WrongCccid,
    /// H2CData at the wrong offset or past the solicited range.
    DataOutOfRange,
    /// H2CData flagged LAST_PDU that does not complete its R2T's range.
    EarlyLastPdu,
    /// A capsule arrived while the queue's SQSIZE + 1 entries were all outstanding.
    QueueOverflow,
    /// The engine gave up waiting for the host (see [`ControllerQueue::abort`]).
    Aborted,
}

/// What one received PDU meant to the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControllerEvent<'a> {
    /// ICReq accepted; the ICResp is queued.
    Connected(IcReq),
    /// A command capsule with its in-capsule data (empty if none). With
    /// `data_digest_ok` false the data digest failed: fail just this command with
    /// Transient Transport Error.
    Command {
        sqe: Sqe,
        data: &'a [u8],
        data_digest_ok: bool,
    },
    /// Solicited host data: copy `data` to offset `offset` of command `ttag`'s buffer.
    /// `complete` is set on the PDU that finishes the R2T's range: `Some(true)` when
    /// every data digest of the transfer matched. The end of a streamed PDU comes as
    /// `HostData` with empty `data` at the offset where the PDU's data ended.
    HostData {
        ttag: u16,
        offset: u32,
        data: &'a [u8],
        complete: Option<bool>,
    },
    /// A valid H2CData header whose `len` bytes of data at `offset` of command `ttag`'s
    /// buffer are streamed (see [`ControllerQueue::set_stream_host_data`]): move them as
    /// [`ControllerQueue::inflow`] says.
    HostDataStart { ttag: u16, offset: u32, len: u32 },
    /// The host sent H2CTermReq: close without answering. FES and FEI are the host's, or,
    /// for a TermReq too malformed to read, what is wrong with it (no TermReq answers a
    /// TermReq, NVMe/TCP 1.0 section 3.6.2.4).
    HostTerminated { fes: u16, fei: u32 },
    /// A fatal error: a C2HTermReq is queued; close once it is sent.
    Fatal {
        fes: u16,
        fei: u32,
        cause: FatalCause,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    AwaitIcReq,
    Ready,
    /// TermReq sent or received: no more input.
    Stopped,
}

/// One R2T's outstanding range.
#[derive(Clone, Copy, Debug)]
struct Transfer {
    ttag: u16,
    cccid: u16,
    /// Next expected DATAO.
    next: u32,
    end: u32,
    digests_ok: bool,
}

/// The payload of a streamed H2CData PDU still to come: `len` bytes for offset `offset`
/// of command `ttag`'s buffer. With `discard` the command's transfer was cancelled (or
/// replaced) meanwhile: take the bytes off the wire and drop them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inflow {
    pub ttag: u16,
    pub offset: u32,
    pub len: u32,
    pub discard: bool,
}

/// The streamed PDU in progress.
#[derive(Clone, Copy, Debug)]
struct Stream {
    ttag: u16,
    /// Where the PDU's data ends; the next byte's offset is this minus what the framer
    /// still expects.
    end: u32,
    orphan: bool,
}

/// Byte offsets of H2CData header fields (NVMe/TCP 1.0 Figure 30), reported as FEI.
const FEI_FLAGS: u32 = 1;
const FEI_CCCID: u32 = 8;
const FEI_TTAG: u32 = 10;
const FEI_DATAO: u32 = 12;

/// One NVMe/TCP connection, controller side.
#[derive(Debug)]
pub struct ControllerQueue {
    framer: RxFramer,
    limits: ControllerLimits,
    state: State,
    digests: Digests,
    hpda: u8,
    head: SqHead,
    transfers: Vec<Transfer>,
    scratch: Vec<u8>,
    /// Commands received and not yet released by the engine.
    outstanding: u32,
    stream: Option<Stream>,
}

impl ControllerQueue {
    /// A new connection: the host's ICReq comes first.
    pub fn new(limits: ControllerLimits) -> ControllerQueue {
        ControllerQueue {
            framer: RxFramer::new_controller(limits),
            limits,
            state: State::AwaitIcReq,
            digests: Digests::NONE,
            hpda: 0,
            head: SqHead::new(),
            transfers: Vec::new(),
            scratch: Vec::new(),
            outstanding: 0,
            stream: None,
        }
    }

    /// Stream H2CData PDUs with at least `min_len` bytes of data (0: never): instead of
    /// waiting for the whole PDU, [`receive`](Self::receive) reports
    /// [`ControllerEvent::HostDataStart`] once its header is in, the engine moves the
    /// payload into the command's buffer itself (e.g. reading the socket straight into
    /// it) showing each piece to [`inflow_received`](Self::inflow_received), and a
    /// [`ControllerEvent::HostData`] with empty data ends the PDU. Large writes are then
    /// copied once, by the kernel.
    pub fn set_stream_host_data(&mut self, min_len: u32) {
        self.framer.set_split_min(min_len);
    }

    /// The streamed payload still to come, if any. While it is `Some`, the bytes at the
    /// front of the input are payload: give them to [`inflow_received`](Self::inflow_received),
    /// not to [`receive`](Self::receive).
    pub fn inflow(&self) -> Option<Inflow> {
        let s = self.stream?;
        let left = self.framer.inflow_left()?;
        Some(Inflow {
            ttag: s.ttag,
            offset: s.end - left,
            len: left,
            discard: s.orphan,
        })
    }

    /// The next `data.len()` bytes of the streamed payload arrived (and are where
    /// [`inflow`](Self::inflow) said, unless discarded); they count toward its data
    /// digest. Returns how many were taken (never more than the payload has left).
    pub fn inflow_received(&mut self, data: &[u8]) -> usize {
        if self.stream.is_none() {
            return 0;
        }
        self.framer.inflow(data)
    }

    /// Fabrics Connect answered: the queue's ID, SQSIZE and flow-control mode.
    pub fn set_params(&mut self, p: QueueParams) {
        self.head.set_params(p);
    }

    pub fn params(&self) -> QueueParams {
        self.head.params()
    }

    /// The digests ICReq/ICResp negotiated.
    pub fn digests(&self) -> Digests {
        self.digests
    }

    /// Whether input is over (TermReq sent or received).
    pub fn stopped(&self) -> bool {
        self.state == State::Stopped
    }

    /// Whether the connection is still waiting for its ICReq.
    pub fn awaiting_icreq(&self) -> bool {
        self.state == State::AwaitIcReq
    }

    /// Commands received and not released yet (see [`Self::command_released`]).
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// The engine is done with one command: its response went out (or the command was
    /// dropped without one, e.g. an Asynchronous Event Request the host replaced after a
    /// reset). Its queue entry is free again.
    pub fn command_released(&mut self) {
        self.outstanding = self.outstanding.saturating_sub(1);
    }

    /// Give up on the connection for a reason that is not in any PDU (host data that did
    /// not come in time): a C2HTermReq with `fes`, FEI 0 and no PDU header, and no more
    /// input. `None` when input is over already.
    pub fn abort(&mut self, out: &mut impl TxSink, fes: u16) -> Option<ControllerEvent<'static>> {
        if self.state == State::Stopped {
            return None;
        }
        Some(self.fatal(out, fes, 0, &[], FatalCause::Aborted))
    }

    /// At least this many bytes must be buffered before [`receive`](Self::receive) can
    /// make progress (after it returned nothing).
    pub fn needed(&self) -> usize {
        self.framer.needed()
    }

    /// Parse the PDU at the front of `buf` and act on it. Returns how many bytes to drop
    /// from the front and what the PDU meant; `(0, None)` means more bytes are needed (or
    /// input is over); `(n, None)`: drop `n` bytes (the end of a streamed PDU nobody
    /// waits for), and more are needed. Anything owed to the host (ICResp, C2HTermReq) goes to `out`.
    pub fn receive<'a>(
        &mut self,
        buf: &'a [u8],
        out: &mut impl TxSink,
    ) -> (usize, Option<ControllerEvent<'a>>) {
        if self.state == State::Stopped {
            return (0, None);
        }
        let (pdu, used) = match self.framer.parse(buf) {
            Ok(Some(p)) => p,
            Ok(None) => return (0, None),
            Err(e) if !e.send_term_req => {
                // A malformed H2CTermReq: the host is ending the connection anyway.
                self.state = State::Stopped;
                self.transfers.clear();
                return (
                    0,
                    Some(ControllerEvent::HostTerminated {
                        fes: e.fes,
                        fei: e.fei,
                    }),
                );
            }
            Err(e) => {
                let cause =
                    if self.state == State::AwaitIcReq && buf.first() == Some(&pdu_type::IC_REQ) {
                        FatalCause::IcReqRejected
                    } else {
                        FatalCause::Malformed
                    };
                let hdr = e.offending_header(buf);
                return (0, Some(self.fatal(out, e.fes, e.fei, hdr, cause)));
            }
        };
        let ev = match pdu {
            Pdu::IcReq(r) => {
                self.digests = r.digests;
                self.hpda = r.hpda;
                self.framer.set_digests(r.digests);
                self.state = State::Ready;
                self.scratch.clear();
                encode_ic_resp(&mut self.scratch, &self.limits.ic_resp(&r));
                out.header(&self.scratch);
                ControllerEvent::Connected(r)
            }
            Pdu::CapsuleCmd {
                sqe,
                data,
                data_digest_ok,
            } => {
                let entries = self.head.params().sqsize as u32 + 1;
                if self.outstanding >= entries {
                    let hdr = pdu_header(&buf[..used]);
                    let ev = self.fatal(
                        out,
                        fes::PDU_SEQUENCE_ERROR,
                        0,
                        hdr,
                        FatalCause::QueueOverflow,
                    );
                    return (used, Some(ev));
                }
                self.outstanding += 1;
                self.head.capsule_received();
                ControllerEvent::Command {
                    sqe,
                    data,
                    data_digest_ok,
                }
            }
            Pdu::H2CData {
                cccid,
                ttag,
                datao,
                data,
                data_digest_ok,
                last,
            } => match self.claim(cccid, ttag, datao, data.len() as u32, last) {
                Ok(()) => ControllerEvent::HostData {
                    ttag,
                    offset: datao,
                    data,
                    complete: self.settle(ttag, data_digest_ok),
                },
                Err((fei, cause)) => {
                    let hdr = pdu_header(&buf[..used]);
                    return (used, Some(self.data_fatal(out, fei, cause, hdr)));
                }
            },
            Pdu::H2CDataHead {
                cccid,
                ttag,
                datao,
                len,
                last,
            } => match self.claim(cccid, ttag, datao, len, last) {
                Ok(()) => {
                    self.stream = Some(Stream {
                        ttag,
                        end: datao + len,
                        orphan: false,
                    });
                    ControllerEvent::HostDataStart {
                        ttag,
                        offset: datao,
                        len,
                    }
                }
                Err((fei, cause)) => {
                    let hdr = pdu_header(&buf[..used]);
                    return (used, Some(self.data_fatal(out, fei, cause, hdr)));
                }
            },
            Pdu::H2CDataTail { data_digest_ok } => {
                match self.stream.take() {
                    Some(s) if !s.orphan => ControllerEvent::HostData {
                        ttag: s.ttag,
                        offset: s.end,
                        data: &[],
                        complete: self.settle(s.ttag, data_digest_ok),
                    },
                    // The transfer is gone (its TTAG may name a new one already): nothing
                    // to report; go on with the next PDU.
                    _ => {
                        let (more, ev) = self.receive(&buf[used..], out);
                        return (used + more, ev);
                    }
                }
            }
            Pdu::H2CTermReq { fes, fei } => {
                self.state = State::Stopped;
                ControllerEvent::HostTerminated { fes, fei }
            }
            // A controller-side framer yields nothing else.
            _ => {
                let hdr = pdu_header(&buf[..used]);
                return (
                    used,
                    Some(self.fatal(
                        out,
                        fes::INVALID_HEADER_FIELD,
                        0,
                        hdr,
                        FatalCause::Malformed,
                    )),
                );
            }
        };
        (used, Some(ev))
    }

    /// Check one H2CData PDU's header against its R2T and account its range.
    fn claim(
        &mut self,
        cccid: u16,
        ttag: u16,
        datao: u32,
        len: u32,
        last: bool,
    ) -> Result<(), (u32, FatalCause)> {
        let Some(t) = self.transfers.iter_mut().find(|t| t.ttag == ttag) else {
            return Err((FEI_TTAG, FatalCause::UnknownTtag));
        };
        if t.cccid != cccid {
            return Err((FEI_CCCID, FatalCause::WrongCccid));
        }
        let end = datao as u64 + len as u64;
        if datao != t.next || end > t.end as u64 {
            return Err((FEI_DATAO, FatalCause::DataOutOfRange));
        }
        if last && end < t.end as u64 {
            return Err((FEI_FLAGS, FatalCause::EarlyLastPdu));
        }
        t.next = end as u32;
        Ok(())
    }

    /// A claimed PDU's data is in, with its digest verdict: `Some(all digests ok)` once
    /// the R2T's range is complete (the transfer is then over).
    fn settle(&mut self, ttag: u16, digest_ok: bool) -> Option<bool> {
        let i = self.transfers.iter().position(|t| t.ttag == ttag)?;
        let t = &mut self.transfers[i];
        t.digests_ok &= digest_ok;
        if t.next < t.end {
            return None;
        }
        let ok = t.digests_ok;
        self.transfers.swap_remove(i);
        Some(ok)
    }

    /// The C2HTermReq for an H2CData PDU its R2T does not allow.
    fn data_fatal(
        &mut self,
        out: &mut impl TxSink,
        fei: u32,
        cause: FatalCause,
        hdr: &[u8],
    ) -> ControllerEvent<'static> {
        let fes = if cause == FatalCause::DataOutOfRange {
            fes::DATA_TRANSFER_OUT_OF_RANGE
        } else {
            fes::INVALID_HEADER_FIELD
        };
        self.fatal(out, fes, fei, hdr, cause)
    }

    fn fatal(
        &mut self,
        out: &mut impl TxSink,
        fes: u16,
        fei: u32,
        offending_header: &[u8],
        cause: FatalCause,
    ) -> ControllerEvent<'static> {
        self.scratch.clear();
        encode_term_req(&mut self.scratch, true, fes, fei, offending_header);
        out.header(&self.scratch);
        self.state = State::Stopped;
        self.transfers.clear();
        self.stream = None;
        ControllerEvent::Fatal { fes, fei, cause }
    }

    /// Solicit `len` bytes of command `cccid`'s data at `offset` with an R2T whose TTAG is
    /// the engine's slot `ttag`. A second R2T for the same TTAG replaces the first.
    pub fn request_data(
        &mut self,
        out: &mut impl TxSink,
        cccid: u16,
        ttag: u16,
        offset: u32,
        len: u32,
    ) {
        self.cancel_transfer(ttag);
        self.transfers.push(Transfer {
            ttag,
            cccid,
            next: offset,
            end: offset.saturating_add(len),
            digests_ok: true,
        });
        self.scratch.clear();
        encode_r2t(&mut self.scratch, cccid, ttag, offset, len, self.digests);
        out.header(&self.scratch);
    }

    /// Forget the outstanding R2T of `ttag` (its command ended another way); later
    /// H2CData for it is a fatal error.
    pub fn cancel_transfer(&mut self, ttag: u16) {
        self.transfers.retain(|t| t.ttag != ttag);
        // A PDU of it being streamed keeps coming: its bytes go nowhere.
        if let Some(s) = self.stream.as_mut().filter(|s| s.ttag == ttag) {
            s.orphan = true;
        }
    }

    /// R2Ts outstanding.
    pub fn transfers(&self) -> usize {
        self.transfers.len()
    }

    /// Answer command `slot`: `data` (a prefix of the slot's buffer, possibly empty) as
    /// one C2HData PDU, then the completion unless C2HData's SUCCESS flag carries it, then
    /// the slot's release marker. SQHD and SQID are filled in.
    pub fn respond(&mut self, out: &mut impl TxSink, slot: u32, cqe: Cqe, data: &[u8]) {
        self.send_response(out, Some(slot), cqe, data.len() as u32, Some(data));
        out.release(slot);
    }

    /// As [`ControllerQueue::respond`], for `len` bytes of data the caller sends from
    /// somewhere the digest cannot be computed from now (bytes it will only read when the
    /// output is written). Returns false, and queues nothing, when the queue has the data
    /// digest on: such data must go through [`ControllerQueue::respond`].
    pub fn respond_unhashed(
        &mut self,
        out: &mut impl TxSink,
        slot: u32,
        cqe: Cqe,
        len: u32,
    ) -> bool {
        if self.digests.data {
            return false;
        }
        self.send_response(out, Some(slot), cqe, len, None);
        out.release(slot);
        true
    }

    /// Answer a command that got no slot: the completion only. The command is released
    /// at once (there is nothing to wait for).
    pub fn respond_untracked(&mut self, out: &mut impl TxSink, cqe: Cqe) {
        self.send_response(out, None, cqe, 0, Some(&[]));
        self.command_released();
    }

    /// Whether a completion may ride on C2HData's SUCCESS flag (NVMe/TCP 1.0 section
    /// 3.3.6.4 and Figure 29): only with SQ flow control disabled (the host needs no
    /// SQHD) and only when the host can rebuild the completion from nothing but the CID:
    /// success with DW0 and DW1 zero.
    fn success_flag(&self, cqe: &Cqe, data_len: usize) -> bool {
        data_len > 0
            && self.head.params().sq_flow_control_disabled
            && cqe.status().is_success()
            && cqe.dw0 == 0
            && cqe.dw1 == 0
    }

    /// `data` is the payload for the data digest; `None` only when the digest is off.
    fn send_response(
        &mut self,
        out: &mut impl TxSink,
        slot: Option<u32>,
        mut cqe: Cqe,
        len: u32,
        data: Option<&[u8]>,
    ) {
        self.head.complete(&mut cqe);
        let success = self.success_flag(&cqe, len as usize);
        if let (Some(slot), false) = (slot, len == 0) {
            self.scratch.clear();
            encode_c2h_data_header(
                &mut self.scratch,
                cqe.cid,
                0,
                len,
                true,
                success,
                self.digests,
                self.hpda,
            );
            out.header(&self.scratch);
            out.data(slot, 0, len);
            if self.digests.data {
                out.header(&data_digest(data.unwrap_or_default()).to_le_bytes());
            }
        }
        if !success {
            self.scratch.clear();
            encode_capsule_resp(&mut self.scratch, &cqe, self.digests);
            out.header(&self.scratch);
        }
    }
}
