//! NVMe/TCP Transport Specification 1.0 (NVMe-oF 1.1 TCP binding): PDU layouts, header and
//! data digests, PDU data alignment, the receive framer and allocation-free encoders.
//!
//! # Shape
//!
//! - [`RxFramer`] turns received bytes into validated [`Pdu`]s, parsing in place: a PDU
//!   borrows the caller's receive buffer, in-capsule and H2C/C2H data included. It never
//!   panics on wire input; a malformed PDU yields a [`TermError`] carrying the Fatal Error
//!   Status (FES) and Fatal Error Information (FEI) to put in the C2HTermReq (H2CTermReq on
//!   the host side). One framer serves either role: [`RxFramer::new_controller`] (the
//!   target) or [`RxFramer::new_host`] (the initiator).
//! - Encoders (`encode_*`) append to a caller-owned `Vec<u8>`, which is reused, so nothing
//!   allocates per PDU once the vector has capacity. Encoders for data-carrying PDUs write
//!   only the header, header digest and PDO padding; the caller then sends the data (by
//!   `writev`, without copying) followed by [`data_digest`] as 4 little-endian bytes when
//!   the data digest is enabled.
//!
//! # Wire facts (NVMe/TCP 1.0, section 3.6)
//!
//! Every PDU starts with the 8-byte common header (PDU-type, FLAGS, HLEN, PDO, PLEN). HLEN
//! is the PDU header length without the header digest; PDO the offset of the data from the
//! start of the PDU (0 when there is none); PLEN the whole PDU length including digests and
//! padding. The header digest (HDGST, CRC32C of the HLEN header bytes) follows the header
//! on every PDU except ICReq, ICResp and the two TermReqs when it was negotiated; the data
//! digest (DDGST, CRC32C of the data only, padding excluded) follows the data of
//! CapsuleCmd, H2CData and C2HData when negotiated and data is present. Digests are stored
//! little-endian. Data in PDUs the controller receives starts at a multiple of
//! `(CPDA + 1) * 4` bytes, in PDUs the host receives at a multiple of `(HPDA + 1) * 4`.
//!
//! On top of the framer and the encoders sit the two queue state machines: one
//! connection's controller side ([`ControllerQueue`]: ICReq/ICResp, capsule intake, R2T
//! and H2CData accounting by TTAG, C2HData and its SUCCESS flag, SQHD, digests, TermReq)
//! and its host side ([`HostQueue`]), both writing through [`TxSink`].
//!
//! # Not implemented
//!
//! TLS (secure channel), the TP 8011 ICReq/ICResp extensions. The framer itself does not
//! track command state: that is the queue machines' job.

mod controller;
mod framer;
mod host;
#[cfg(test)]
mod tests;

pub use controller::{ControllerEvent, ControllerQueue, FatalCause, Inflow, TxSink};
pub use framer::{HostLimits, RxFramer};
pub use host::{HostConfig, HostError, HostEvent, HostQueue, Xfer};

use crate::spec::{sgl, Cqe, SglDescriptor, Sqe};
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// PDU-type values (NVMe/TCP 1.0 Figure 11).
pub mod pdu_type {
    pub const IC_REQ: u8 = 0x00;
    pub const IC_RESP: u8 = 0x01;
    pub const H2C_TERM_REQ: u8 = 0x02;
    pub const C2H_TERM_REQ: u8 = 0x03;
    pub const CAPSULE_CMD: u8 = 0x04;
    pub const CAPSULE_RESP: u8 = 0x05;
    pub const H2C_DATA: u8 = 0x06;
    pub const C2H_DATA: u8 = 0x07;
    pub const R2T: u8 = 0x09;
}

/// Common header FLAGS bits.
pub mod flags {
    /// Header digest present.
    pub const HDGSTF: u8 = 1 << 0;
    /// Data digest present.
    pub const DDGSTF: u8 = 1 << 1;
    /// H2CData/C2HData: last data PDU of the transfer.
    pub const LAST_PDU: u8 = 1 << 2;
    /// C2HData: the command completed successfully, no CapsuleResp follows (needs LAST_PDU).
    pub const SUCCESS: u8 = 1 << 3;
}

/// Fatal Error Status values of H2CTermReq/C2HTermReq (NVMe/TCP 1.0 Figure 23/25).
pub mod fes {
    /// FEI: byte offset of the invalid field in the PDU header.
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    pub const PDU_SEQUENCE_ERROR: u16 = 0x02;
    pub const HEADER_DIGEST_ERROR: u16 = 0x03;
    /// H2CData/C2HData outside the range of the command's data (or of the R2T).
    pub const DATA_TRANSFER_OUT_OF_RANGE: u16 = 0x04;
    /// Also used for "R2T Limit Exceeded" (same value).
    pub const DATA_TRANSFER_LIMIT_EXCEEDED: u16 = 0x05;
    pub const R2T_LIMIT_EXCEEDED: u16 = 0x05;
    /// FEI: byte offset of the unsupported parameter (ICReq PFV).
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

/// Length of the common header.
pub const COMMON_HEADER_LEN: usize = 8;
/// Length of a header or data digest.
pub const DIGEST_LEN: usize = 4;
/// HLEN (and PLEN) of ICReq and ICResp.
pub const IC_PDU_LEN: usize = 128;
/// HLEN of CapsuleCmd: common header + 64-byte SQE.
pub const CAPSULE_CMD_HLEN: usize = 72;
/// HLEN of CapsuleResp, H2CData, C2HData, R2T and the TermReqs.
pub const SHORT_HLEN: usize = 24;
/// At most this many bytes of the offending PDU header go into a TermReq.
pub const TERM_REQ_MAX_DATA: usize = 128;
/// Largest valid TermReq PLEN (24 + 128).
pub const TERM_REQ_MAX_PLEN: usize = SHORT_HLEN + TERM_REQ_MAX_DATA;
/// The admin queue accepts at least 8 KiB of in-capsule data (NVMe/TCP 1.0 section 2.2):
/// use `max(this, IOCCSZ*16 - 64)` as the admin queue's in-capsule limit.
pub const ADMIN_MAX_INCAPSULE_DATA: u32 = 8192;
/// Smallest valid MAXH2CDATA.
pub const MIN_MAXH2CDATA: u32 = 4096;
/// Largest PDU data alignment value (HPDA/CPDA are 0's based dwords, 0..=31).
pub const MAX_PDA: u8 = 31;

/// ICReq/ICResp DGST field bits.
const DGST_HDGST: u8 = 1 << 0;
const DGST_DDGST: u8 = 1 << 1;

/// The 8-byte common header (NVMe/TCP 1.0 Figure 10).
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
pub struct CommonHeader {
    pub pdu_type: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: U32,
}
const _: () = assert!(core::mem::size_of::<CommonHeader>() == COMMON_HEADER_LEN);

/// ICReq PDU (Figure 26).
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct IcReqPdu {
    pub ch: CommonHeader,
    pub pfv: U16,
    pub hpda: u8,
    pub dgst: u8,
    pub maxr2t: U32,
    pub rsvd: [u8; 112],
}
const _: () = assert!(core::mem::size_of::<IcReqPdu>() == IC_PDU_LEN);

/// ICResp PDU (Figure 27).
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct IcRespPdu {
    pub ch: CommonHeader,
    pub pfv: U16,
    pub cpda: u8,
    pub dgst: u8,
    pub maxh2cdata: U32,
    pub rsvd: [u8; 112],
}
const _: () = assert!(core::mem::size_of::<IcRespPdu>() == IC_PDU_LEN);

/// H2CTermReq/C2HTermReq header (Figures 22/24); up to 128 bytes of the offending header
/// follow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct TermReqHeader {
    pub ch: CommonHeader,
    pub fes: U16,
    pub fei: U32,
    pub rsvd: [u8; 10],
}
const _: () = assert!(core::mem::size_of::<TermReqHeader>() == SHORT_HLEN);

/// H2CData header (Figure 30). C2HData (Figure 29) has the same layout with TTAG reserved;
/// R2T (Figure 31) has R2TO/R2TL where this has DATAO/DATAL.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct DataHeader {
    pub ch: CommonHeader,
    pub cccid: U16,
    pub ttag: U16,
    pub datao: U32,
    pub datal: U32,
    pub rsvd: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<DataHeader>() == SHORT_HLEN);

/// Which digests a connection uses, as negotiated by ICReq/ICResp.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

impl Digests {
    pub const NONE: Digests = Digests {
        header: false,
        data: false,
    };
    pub const BOTH: Digests = Digests {
        header: true,
        data: true,
    };

    fn hd_len(self) -> usize {
        if self.header {
            DIGEST_LEN
        } else {
            0
        }
    }
}

/// The controller's receive limits for one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControllerLimits {
    /// MAXH2CDATA advertised in ICResp: the largest H2CData data length accepted.
    pub max_h2c_data: u32,
    /// Largest in-capsule data accepted in a CapsuleCmd. The queue is not known until
    /// Fabrics Connect, so start with the larger of the admin rule
    /// ([`ADMIN_MAX_INCAPSULE_DATA`]) and the I/O queue's IOCCSZ, and tighten it with
    /// [`RxFramer::set_max_incapsule_data`] once Connect has named the queue.
    pub max_incapsule_data: u32,
    /// CPDA advertised in ICResp: host-to-controller data is aligned to `(cpda+1)*4`.
    pub cpda: u8,
}

impl ControllerLimits {
    /// The ICResp answering `req`: PFV 0, this connection's CPDA and MAXH2CDATA, and the
    /// digests the host asked for (this target supports both).
    pub fn ic_resp(&self, req: &IcReq) -> IcResp {
        IcResp {
            pfv: 0,
            cpda: self.cpda,
            digests: req.digests,
            maxh2cdata: self.max_h2c_data,
        }
    }
}

/// Initialize Connection Request fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IcReq {
    /// PDU Format Version; 0 is NVMe/TCP 1.0.
    pub pfv: u16,
    /// Host PDU Data Alignment (0's based dwords) for controller-to-host data.
    pub hpda: u8,
    /// Digests the host asks for.
    pub digests: Digests,
    /// Maximum outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
}

/// Initialize Connection Response fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IcResp {
    pub pfv: u16,
    /// Controller PDU Data Alignment (0's based dwords) for host-to-controller data.
    pub cpda: u8,
    /// Digests the connection uses.
    pub digests: Digests,
    /// Largest H2CData data length the controller accepts.
    pub maxh2cdata: u32,
}

fn dgst_bits(d: Digests) -> u8 {
    (if d.header { DGST_HDGST } else { 0 }) | (if d.data { DGST_DDGST } else { 0 })
}

fn dgst_from_bits(b: u8) -> Digests {
    Digests {
        header: b & DGST_HDGST != 0,
        data: b & DGST_DDGST != 0,
    }
}

/// One received, validated PDU. Data slices borrow the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pdu<'a> {
    /// Controller side: the first PDU of a connection.
    IcReq(IcReq),
    /// Controller side: a command capsule with its in-capsule data (empty if none).
    /// `data_digest_ok` is false when the data digest did not match: fail just this
    /// command with Transient Transport Error.
    CapsuleCmd {
        sqe: Sqe,
        data: &'a [u8],
        data_digest_ok: bool,
    },
    /// Controller side: data for an R2T (or, for DATAO 0 without R2T, none: the engine
    /// checks CCCID/TTAG/DATAO against its state).
    H2CData {
        cccid: u16,
        ttag: u16,
        datao: u32,
        data: &'a [u8],
        last: bool,
        data_digest_ok: bool,
    },
    /// Controller side, streaming (see [`RxFramer::set_split_min`]): an H2CData header;
    /// its `len` payload bytes are the engine's to move and show to [`RxFramer::inflow`].
    H2CDataHead {
        cccid: u16,
        ttag: u16,
        datao: u32,
        len: u32,
        last: bool,
    },
    /// Controller side, streaming: the streamed payload and its data digest (if any) are
    /// in; `data_digest_ok` is false when the digest did not match.
    H2CDataTail { data_digest_ok: bool },
    /// Controller side: the host terminates the connection; close it, send nothing.
    H2CTermReq { fes: u16, fei: u32 },
    /// Host side: answer to ICReq.
    IcResp(IcResp),
    /// Host side: a response capsule.
    CapsuleResp { cqe: Cqe },
    /// Host side: read data. With `success` no CapsuleResp follows.
    C2HData {
        cccid: u16,
        datao: u32,
        data: &'a [u8],
        last: bool,
        success: bool,
        data_digest_ok: bool,
    },
    /// Host side: the controller is ready for `r2tl` bytes at offset `r2to`.
    R2T {
        cccid: u16,
        ttag: u16,
        r2to: u32,
        r2tl: u32,
    },
    /// Host side: the controller terminates the connection.
    C2HTermReq { fes: u16, fei: u32 },
}

/// A fatal transport error found in received bytes. The connection is over: when
/// `send_term_req` is set, send a TermReq with [`encode_term_req`]`(.., self.fes,
/// self.fei, self.offending_header(buf))`, then close; otherwise (a malformed TermReq)
/// just close.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("NVMe/TCP fatal error: FES {fes:#04x}, FEI {fei}")]
pub struct TermError {
    pub fes: u16,
    pub fei: u32,
    /// How many bytes at the front of the buffer passed to `parse` hold the offending PDU
    /// header (at most 128).
    pub header_len: u16,
    /// False when the offending PDU was itself a TermReq: close without answering.
    pub send_term_req: bool,
}

impl TermError {
    /// The offending PDU header, to echo in the TermReq: the front of the buffer that was
    /// passed to the failing `parse`.
    pub fn offending_header<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[..(self.header_len as usize).min(buf.len())]
    }
}

/// The header of the PDU at the front of `buf` (its HLEN bytes, at most 128), for the
/// PDU Header field of a TermReq that answers it (NVMe/TCP 1.0 Figures 22/24).
pub fn pdu_header(buf: &[u8]) -> &[u8] {
    let hlen = buf.get(2).map_or(COMMON_HEADER_LEN, |&h| h as usize);
    &buf[..hlen
        .clamp(COMMON_HEADER_LEN, TERM_REQ_MAX_DATA)
        .min(buf.len())]
}

/// CRC32C of `data`, as NVMe/TCP header and data digests use it (sent little-endian).
/// `crc-fast` picks the widest carry-less multiply the CPU offers (AVX-512 VPCLMULQDQ,
/// else PCLMULQDQ with the SSE4.2 crc32 instruction).
#[inline]
pub fn data_digest(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// Incremental data digest for data split across buffers:
/// `let mut d = DataDigest::new(); d.update(a); d.update(b); d.finish()` equals
/// `data_digest(a ++ b)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataDigest(u32);

impl DataDigest {
    pub fn new() -> DataDigest {
        DataDigest(0)
    }
    #[inline]
    pub fn update(&mut self, data: &[u8]) {
        if self.0 == 0 {
            // A CRC of 0 leaves the register at its initial all-ones value (nothing digested
            // yet, the common case, or a prefix that happened to end there): continuing is
            // a fresh digest.
            self.0 = data_digest(data);
            return;
        }
        // Resume from the finished CRC: the register is the CRC before its final XOR.
        let mut d = crc_fast::Digest::new_with_init_state(
            crc_fast::CrcAlgorithm::Crc32Iscsi,
            u64::from(!self.0),
        );
        d.update(data);
        self.0 = d.finalize() as u32;
    }
    pub fn finish(self) -> u32 {
        self.0
    }
}

/// Bytes a PDU with `hlen` header bytes needs before its data: header, header digest and
/// padding to the `(pda+1)*4` alignment. This is the PDO when data is present.
#[inline]
pub fn data_offset(hlen: usize, d: Digests, pda: u8) -> usize {
    let align = (pda.min(MAX_PDA) as usize + 1) * 4;
    (hlen + d.hd_len()).div_ceil(align) * align
}

fn push_common(out: &mut Vec<u8>, pdu_type: u8, flags: u8, hlen: usize, pdo: usize, plen: usize) {
    let ch = CommonHeader {
        pdu_type,
        flags,
        hlen: hlen as u8,
        pdo: pdo as u8,
        plen: U32::new(plen as u32),
    };
    out.extend_from_slice(ch.as_bytes());
}

/// After the header bytes starting at `start` were appended: the header digest if enabled.
fn push_header_digest(out: &mut Vec<u8>, start: usize, d: Digests) {
    if d.header {
        let crc = data_digest(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
    }
}

/// Writes the header of a data PDU (header, digest, padding) and returns nothing; the
/// caller follows with `datal` bytes of data and the data digest when `d.data`.
#[allow(clippy::too_many_arguments)]
fn push_data_pdu_header(
    out: &mut Vec<u8>,
    pdu_type: u8,
    mut fl: u8,
    hdr_tail: &[u8],
    hlen: usize,
    datal: u32,
    d: Digests,
    pda: u8,
) {
    let start = out.len();
    let has_data = datal > 0;
    if d.header {
        fl |= flags::HDGSTF;
    }
    if d.data && has_data {
        fl |= flags::DDGSTF;
    }
    let (pdo, plen) = if has_data {
        let pdo = data_offset(hlen, d, pda);
        let dd = if d.data { DIGEST_LEN } else { 0 };
        (pdo, pdo + datal as usize + dd)
    } else {
        (0, hlen + d.hd_len())
    };
    push_common(out, pdu_type, fl, hlen, pdo, plen);
    out.extend_from_slice(hdr_tail);
    push_header_digest(out, start, d);
    if has_data {
        out.resize(start + pdo, 0);
    }
}

/// Appends an ICReq (host side).
pub fn encode_ic_req(out: &mut Vec<u8>, r: &IcReq) {
    let pdu = IcReqPdu {
        ch: CommonHeader {
            pdu_type: pdu_type::IC_REQ,
            flags: 0,
            hlen: IC_PDU_LEN as u8,
            pdo: 0,
            plen: U32::new(IC_PDU_LEN as u32),
        },
        pfv: U16::new(r.pfv),
        hpda: r.hpda,
        dgst: dgst_bits(r.digests),
        maxr2t: U32::new(r.maxr2t),
        rsvd: [0; 112],
    };
    out.extend_from_slice(pdu.as_bytes());
}

/// Appends an ICResp (controller side).
pub fn encode_ic_resp(out: &mut Vec<u8>, r: &IcResp) {
    let pdu = IcRespPdu {
        ch: CommonHeader {
            pdu_type: pdu_type::IC_RESP,
            flags: 0,
            hlen: IC_PDU_LEN as u8,
            pdo: 0,
            plen: U32::new(IC_PDU_LEN as u32),
        },
        pfv: U16::new(r.pfv),
        cpda: r.cpda,
        dgst: dgst_bits(r.digests),
        maxh2cdata: U32::new(r.maxh2cdata),
        rsvd: [0; 112],
    };
    out.extend_from_slice(pdu.as_bytes());
}

/// Appends a CapsuleResp (controller side).
pub fn encode_capsule_resp(out: &mut Vec<u8>, cqe: &Cqe, d: Digests) {
    let start = out.len();
    let fl = if d.header { flags::HDGSTF } else { 0 };
    push_common(
        out,
        pdu_type::CAPSULE_RESP,
        fl,
        SHORT_HLEN,
        0,
        SHORT_HLEN + d.hd_len(),
    );
    out.extend_from_slice(cqe.as_bytes());
    push_header_digest(out, start, d);
}

/// Appends an R2T (controller side): the host may send `r2tl` bytes at offset `r2to`.
pub fn encode_r2t(out: &mut Vec<u8>, cccid: u16, ttag: u16, r2to: u32, r2tl: u32, d: Digests) {
    let start = out.len();
    let fl = if d.header { flags::HDGSTF } else { 0 };
    let h = DataHeader {
        ch: CommonHeader {
            pdu_type: pdu_type::R2T,
            flags: fl,
            hlen: SHORT_HLEN as u8,
            pdo: 0,
            plen: U32::new((SHORT_HLEN + d.hd_len()) as u32),
        },
        cccid: U16::new(cccid),
        ttag: U16::new(ttag),
        datao: U32::new(r2to),
        datal: U32::new(r2tl),
        rsvd: [0; 4],
    };
    out.extend_from_slice(h.as_bytes());
    push_header_digest(out, start, d);
}

/// Appends a C2HData header (controller side), its header digest and padding to the
/// host's `hpda`. The caller then sends `datal` bytes of data and, if `d.data`, the
/// [`data_digest`] of that data as 4 little-endian bytes. `success` needs `last`.
#[allow(clippy::too_many_arguments)]
pub fn encode_c2h_data_header(
    out: &mut Vec<u8>,
    cccid: u16,
    datao: u32,
    datal: u32,
    last: bool,
    success: bool,
    d: Digests,
    hpda: u8,
) {
    let fl = (if last { flags::LAST_PDU } else { 0 }) | (if success { flags::SUCCESS } else { 0 });
    let h = data_header_tail(cccid, 0, datao, datal);
    push_data_pdu_header(out, pdu_type::C2H_DATA, fl, &h, SHORT_HLEN, datal, d, hpda);
}

/// Appends an H2CData header (host side) padded to the controller's `cpda`; the caller
/// then sends the data and, if `d.data`, its digest.
#[allow(clippy::too_many_arguments)]
pub fn encode_h2c_data_header(
    out: &mut Vec<u8>,
    cccid: u16,
    ttag: u16,
    datao: u32,
    datal: u32,
    last: bool,
    d: Digests,
    cpda: u8,
) {
    let fl = if last { flags::LAST_PDU } else { 0 };
    let h = data_header_tail(cccid, ttag, datao, datal);
    push_data_pdu_header(out, pdu_type::H2C_DATA, fl, &h, SHORT_HLEN, datal, d, cpda);
}

fn data_header_tail(cccid: u16, ttag: u16, datao: u32, datal: u32) -> [u8; 16] {
    let mut t = [0u8; 16];
    t[0..2].copy_from_slice(&cccid.to_le_bytes());
    t[2..4].copy_from_slice(&ttag.to_le_bytes());
    t[4..8].copy_from_slice(&datao.to_le_bytes());
    t[8..12].copy_from_slice(&datal.to_le_bytes());
    t
}

/// Appends a CapsuleCmd header (host side) for `data_len` bytes of in-capsule data padded
/// to the controller's `cpda`; the caller then sends the data and, if `d.data` and
/// `data_len > 0`, its digest.
pub fn encode_capsule_cmd_header(
    out: &mut Vec<u8>,
    sqe: &Sqe,
    data_len: u32,
    d: Digests,
    cpda: u8,
) {
    push_data_pdu_header(
        out,
        pdu_type::CAPSULE_CMD,
        0,
        sqe.as_bytes(),
        CAPSULE_CMD_HLEN,
        data_len,
        d,
        cpda,
    );
}

/// Appends a whole CapsuleCmd (host side): header, in-capsule data and data digest.
pub fn encode_capsule_cmd(out: &mut Vec<u8>, sqe: &Sqe, data: &[u8], d: Digests, cpda: u8) {
    encode_capsule_cmd_header(out, sqe, data.len() as u32, d, cpda);
    push_data_and_digest(out, data, d);
}

/// Appends a whole H2CData PDU (host side) with its data and data digest.
#[allow(clippy::too_many_arguments)]
pub fn encode_h2c_data(
    out: &mut Vec<u8>,
    cccid: u16,
    ttag: u16,
    datao: u32,
    data: &[u8],
    last: bool,
    d: Digests,
    cpda: u8,
) {
    encode_h2c_data_header(out, cccid, ttag, datao, data.len() as u32, last, d, cpda);
    push_data_and_digest(out, data, d);
}

/// Appends a whole C2HData PDU (controller side, for simple paths and tests).
#[allow(clippy::too_many_arguments)]
pub fn encode_c2h_data(
    out: &mut Vec<u8>,
    cccid: u16,
    datao: u32,
    data: &[u8],
    last: bool,
    success: bool,
    d: Digests,
    hpda: u8,
) {
    encode_c2h_data_header(out, cccid, datao, data.len() as u32, last, success, d, hpda);
    push_data_and_digest(out, data, d);
}

fn push_data_and_digest(out: &mut Vec<u8>, data: &[u8], d: Digests) {
    if !data.is_empty() {
        out.extend_from_slice(data);
        if d.data {
            out.extend_from_slice(&data_digest(data).to_le_bytes());
        }
    }
}

/// Appends a C2HTermReq (`to_host`, controller side) or H2CTermReq carrying `fes`, `fei`
/// and the first 128 bytes of `offending_header`. TermReqs never carry digests.
pub fn encode_term_req(
    out: &mut Vec<u8>,
    to_host: bool,
    fes: u16,
    fei: u32,
    offending_header: &[u8],
) {
    let data = &offending_header[..offending_header.len().min(TERM_REQ_MAX_DATA)];
    let h = TermReqHeader {
        ch: CommonHeader {
            pdu_type: if to_host {
                pdu_type::C2H_TERM_REQ
            } else {
                pdu_type::H2C_TERM_REQ
            },
            flags: 0,
            hlen: SHORT_HLEN as u8,
            pdo: 0,
            plen: U32::new((SHORT_HLEN + data.len()) as u32),
        },
        fes: U16::new(fes),
        fei: U32::new(fei),
        rsvd: [0; 10],
    };
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
}

#[cfg(test)]
mod queue_tests;
