//! The receive framer: bytes in, validated PDUs out.
//!
//! Validation follows the order of the common header fields (PDU-type, FLAGS, HLEN, PDO,
//! PLEN) so the lowest incorrect field is the one reported, then the header digest, then
//! the type-specific fields, then the data digest. The common header is validated as soon
//! as its 8 bytes are present, so an oversized PLEN is refused before anything is
//! buffered for it.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Controller,
    Host,
}

/// The host's receive limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostLimits {
    /// HPDA sent in ICReq: controller-to-host data is aligned to `(hpda+1)*4`.
    pub hpda: u8,
    /// Largest C2HData data length accepted (the host's buffer bound).
    pub max_c2h_data: u32,
}

/// Where a streamed H2CData PDU stands (see [`RxFramer::set_split_min`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inflow {
    None,
    /// `left` payload bytes come next; they are handed to [`RxFramer::inflow`], not
    /// parsed. `crc` accumulates the data digest when the PDU carries one.
    Data {
        left: u32,
        crc: Option<DataDigest>,
    },
    /// The payload is in: the data digest (4 bytes) is next when `crc` is set; without
    /// one the tail is reported at once.
    Tail {
        crc: Option<DataDigest>,
    },
}

/// Receive framer for one NVMe/TCP connection, either role.
///
/// Feed it the connection's unconsumed received bytes; it parses the PDU at the front in
/// place. It keeps no copy of the bytes, so a PDU split across reads is simply parsed again
/// once the rest has arrived ([`needed`](Self::needed) says how much to wait for). After a
/// [`TermError`] the framer is dead and returns the same error forever.
///
/// Controller side, a large H2CData PDU may instead be *streamed* (see
/// [`set_split_min`](Self::set_split_min)): its validated header is reported as
/// [`Pdu::H2CDataHead`], the engine moves the payload itself (straight from the socket
/// into the command's buffer, so it is copied once) and shows each piece to
/// [`inflow`](Self::inflow), and [`Pdu::H2CDataTail`] ends the PDU with its data digest's
/// verdict.
#[derive(Clone, Debug)]
pub struct RxFramer {
    role: Role,
    ic_done: bool,
    digests: Digests,
    /// Required alignment of received data, in bytes.
    rx_align: u32,
    max_incapsule_data: u32,
    /// MAXH2CDATA (controller) or the C2HData bound (host).
    max_data: u32,
    needed: usize,
    failed: Option<TermError>,
    /// Controller side: H2CData PDUs with at least this much data that are not wholly
    /// in the buffer are streamed (0: never).
    split_min: u32,
    inflow: Inflow,
}

/// Offsets of the common header fields, reported as FEI.
const FEI_TYPE: u32 = 0;
const FEI_FLAGS: u32 = 1;
const FEI_HLEN: u32 = 2;
const FEI_PDO: u32 = 3;
const FEI_PLEN: u32 = 4;

impl RxFramer {
    /// A controller-side (target) framer. It expects an ICReq first.
    pub fn new_controller(limits: ControllerLimits) -> RxFramer {
        RxFramer {
            role: Role::Controller,
            ic_done: false,
            digests: Digests::NONE,
            rx_align: (limits.cpda.min(MAX_PDA) as u32 + 1) * 4,
            max_incapsule_data: limits.max_incapsule_data,
            max_data: limits.max_h2c_data,
            needed: COMMON_HEADER_LEN,
            failed: None,
            split_min: 0,
            inflow: Inflow::None,
        }
    }

    /// A host-side (initiator) framer. It expects an ICResp first.
    pub fn new_host(limits: HostLimits) -> RxFramer {
        RxFramer {
            role: Role::Host,
            ic_done: false,
            digests: Digests::NONE,
            rx_align: (limits.hpda.min(MAX_PDA) as u32 + 1) * 4,
            max_incapsule_data: 0,
            max_data: limits.max_c2h_data,
            needed: COMMON_HEADER_LEN,
            failed: None,
            split_min: 0,
            inflow: Inflow::None,
        }
    }

    /// The digests negotiated by ICReq/ICResp; they apply to every later PDU. Set them
    /// right after parsing ICReq (controller) or ICResp (host).
    pub fn set_digests(&mut self, d: Digests) {
        self.digests = d;
    }

    pub fn digests(&self) -> Digests {
        self.digests
    }

    /// Tighten (or widen) the in-capsule data limit once Fabrics Connect has said whether
    /// this is the admin queue (at least [`ADMIN_MAX_INCAPSULE_DATA`]) or an I/O queue
    /// (IOCCSZ*16 - 64).
    pub fn set_max_incapsule_data(&mut self, n: u32) {
        self.max_incapsule_data = n;
    }

    /// Host side: once ICResp arrived, the controller's CPDA does not matter for receiving,
    /// but a host framer may widen its C2HData bound.
    pub fn set_max_data(&mut self, n: u32) {
        self.max_data = n;
    }

    /// Controller side: stream H2CData PDUs carrying at least `n` bytes of data whose end
    /// is not in the buffer yet (0, the default, turns streaming off). Streaming starts
    /// once the header, its digest and the padding up to PDO have arrived.
    pub fn set_split_min(&mut self, n: u32) {
        self.split_min = if self.role == Role::Controller { n } else { 0 };
    }

    /// Payload bytes of a streamed PDU still to come (to be shown to
    /// [`inflow`](Self::inflow)); `None` when no payload is being streamed.
    pub fn inflow_left(&self) -> Option<u32> {
        match self.inflow {
            Inflow::Data { left, .. } => Some(left),
            _ => None,
        }
    }

    /// The next bytes of a streamed payload, as they arrived (the engine has put them
    /// in its buffer). Returns how many were taken: at most [`inflow_left`](Self::inflow_left).
    pub fn inflow(&mut self, data: &[u8]) -> usize {
        let Inflow::Data { left, mut crc } = self.inflow else {
            return 0;
        };
        let n = data.len().min(left as usize);
        if let Some(c) = crc.as_mut() {
            c.update(&data[..n]);
        }
        let left = left - n as u32;
        self.inflow = if left == 0 {
            Inflow::Tail { crc }
        } else {
            Inflow::Data { left, crc }
        };
        n
    }

    /// After `parse` returned `Ok(None)`: the buffer must hold at least this many bytes
    /// before the next `parse` can make progress.
    pub fn needed(&self) -> usize {
        self.needed
    }

    /// Whether ICReq (controller) / ICResp (host) has been received.
    pub fn ic_done(&self) -> bool {
        self.ic_done
    }

    /// Parses one complete PDU at the front of `buf`.
    ///
    /// `Ok(None)`: incomplete, [`needed`](Self::needed) tells how many bytes at least.
    /// `Ok(Some((pdu, consumed)))`: drop `consumed` bytes from the front once done with
    /// `pdu`. `Err(e)`: fatal, see [`TermError`].
    pub fn parse<'a>(&mut self, buf: &'a [u8]) -> Result<Option<(Pdu<'a>, usize)>, TermError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        match self.inflow {
            Inflow::None => {}
            // The payload is the engine's to move (`inflow`).
            Inflow::Data { .. } => {
                self.needed = 0;
                return Ok(None);
            }
            Inflow::Tail { crc: None } => {
                self.inflow = Inflow::None;
                self.needed = COMMON_HEADER_LEN;
                return Ok(Some((
                    Pdu::H2CDataTail {
                        data_digest_ok: true,
                    },
                    0,
                )));
            }
            Inflow::Tail { crc: Some(c) } => {
                let Some(d) = buf.get(..DIGEST_LEN) else {
                    self.needed = DIGEST_LEN;
                    return Ok(None);
                };
                self.inflow = Inflow::None;
                self.needed = COMMON_HEADER_LEN;
                let ok = u32::from_le_bytes([d[0], d[1], d[2], d[3]]) == c.finish();
                return Ok(Some((Pdu::H2CDataTail { data_digest_ok: ok }, DIGEST_LEN)));
            }
        }
        match self.parse_inner(buf) {
            Ok(Some(p)) => {
                self.needed = COMMON_HEADER_LEN;
                Ok(Some(p))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                self.failed = Some(e);
                Err(e)
            }
        }
    }

    fn parse_inner<'a>(&mut self, buf: &'a [u8]) -> Result<Option<(Pdu<'a>, usize)>, TermError> {
        let Ok((ch, _)) = CommonHeader::read_from_prefix(buf) else {
            self.needed = COMMON_HEADER_LEN;
            return Ok(None);
        };
        let ty = ch.pdu_type;
        let hlen = ch.hlen as usize;
        let plen = ch.plen.get() as usize;
        let header_len = hlen
            .clamp(COMMON_HEADER_LEN, TERM_REQ_MAX_DATA)
            .min(buf.len()) as u16;
        let fail = |fes: u16, fei: u32| TermError {
            fes,
            fei,
            header_len,
            send_term_req: true,
        };

        // PDU-type: direction, then connection state.
        let (ic_type, term_type) = match self.role {
            Role::Controller => (pdu_type::IC_REQ, pdu_type::H2C_TERM_REQ),
            Role::Host => (pdu_type::IC_RESP, pdu_type::C2H_TERM_REQ),
        };
        let valid_flags = match (self.role, ty) {
            (Role::Controller, pdu_type::IC_REQ) | (Role::Host, pdu_type::IC_RESP) => 0,
            (Role::Controller, pdu_type::H2C_TERM_REQ) | (Role::Host, pdu_type::C2H_TERM_REQ) => 0,
            (Role::Controller, pdu_type::CAPSULE_CMD) => flags::HDGSTF | flags::DDGSTF,
            (Role::Controller, pdu_type::H2C_DATA) => {
                flags::HDGSTF | flags::DDGSTF | flags::LAST_PDU
            }
            (Role::Host, pdu_type::CAPSULE_RESP) | (Role::Host, pdu_type::R2T) => flags::HDGSTF,
            (Role::Host, pdu_type::C2H_DATA) => {
                flags::HDGSTF | flags::DDGSTF | flags::LAST_PDU | flags::SUCCESS
            }
            _ => return Err(fail(fes::INVALID_HEADER_FIELD, FEI_TYPE)),
        };
        if ty == term_type {
            return self.parse_term_req(buf, &ch);
        }
        if ty == ic_type {
            if self.ic_done {
                return Err(fail(fes::PDU_SEQUENCE_ERROR, FEI_TYPE));
            }
            return self.parse_ic(buf, &ch, fail);
        }
        if !self.ic_done {
            return Err(fail(fes::PDU_SEQUENCE_ERROR, FEI_TYPE));
        }

        // FLAGS: only the type's flags, digests present exactly when negotiated (the data
        // digest only when there is data), SUCCESS only with LAST_PDU.
        if ch.flags & !valid_flags != 0 {
            return Err(fail(fes::INVALID_HEADER_FIELD, FEI_FLAGS));
        }
        let hd = self.digests.hd_len();
        let full_hlen = hlen + hd;
        let has_data = plen != full_hlen;
        let mut want = 0;
        if self.digests.header {
            want |= flags::HDGSTF;
        }
        if self.digests.data && has_data {
            want |= flags::DDGSTF;
        }
        if (want & valid_flags) != ch.flags & (flags::HDGSTF | flags::DDGSTF) {
            return Err(fail(fes::INVALID_HEADER_FIELD, FEI_FLAGS));
        }
        if ch.flags & (flags::SUCCESS | flags::LAST_PDU) == flags::SUCCESS {
            return Err(fail(fes::INVALID_HEADER_FIELD, FEI_FLAGS));
        }

        // HLEN.
        let (expected_hlen, carries_data) = match ty {
            pdu_type::CAPSULE_CMD => (CAPSULE_CMD_HLEN, true),
            pdu_type::H2C_DATA | pdu_type::C2H_DATA => (SHORT_HLEN, true),
            _ => (SHORT_HLEN, false),
        };
        if hlen != expected_hlen {
            return Err(fail(fes::INVALID_HEADER_FIELD, FEI_HLEN));
        }

        // A PDU shorter than its own header is wrong in PLEN, whatever PDO says (a
        // data-less capsule legitimately carries PDO 0, so PDO cannot be blamed).
        if plen < full_hlen {
            return Err(fail(fes::INVALID_HEADER_FIELD, FEI_PLEN));
        }

        // PDO.
        let pdo = ch.pdo as usize;
        if !carries_data || !has_data {
            if pdo != 0 && !(carries_data && pdo == full_hlen) {
                return Err(fail(fes::INVALID_HEADER_FIELD, FEI_PDO));
            }
        } else if pdo < full_hlen || pdo > plen || !(pdo as u32).is_multiple_of(self.rx_align) {
            return Err(fail(fes::INVALID_HEADER_FIELD, FEI_PDO));
        }

        // PLEN: consistent with the header, then within the limits.
        if plen < full_hlen || (!carries_data && has_data) {
            return Err(fail(fes::INVALID_HEADER_FIELD, FEI_PLEN));
        }
        let dd = if ch.flags & flags::DDGSTF != 0 {
            DIGEST_LEN
        } else {
            0
        };
        let data_len = if has_data {
            match (plen - pdo).checked_sub(dd) {
                Some(n) if n > 0 => n,
                _ => return Err(fail(fes::INVALID_HEADER_FIELD, FEI_PLEN)),
            }
        } else {
            0
        };
        let limit = match ty {
            pdu_type::CAPSULE_CMD => self.max_incapsule_data,
            pdu_type::H2C_DATA | pdu_type::C2H_DATA => self.max_data,
            _ => 0,
        };
        if data_len as u64 > limit as u64 {
            return Err(fail(fes::DATA_TRANSFER_LIMIT_EXCEEDED, FEI_PLEN));
        }
        if (ty == pdu_type::H2C_DATA || ty == pdu_type::C2H_DATA) && data_len == 0 {
            return Err(fail(fes::INVALID_HEADER_FIELD, FEI_PLEN));
        }

        if buf.len() < plen {
            if ty == pdu_type::H2C_DATA
                && self.split_min > 0
                && data_len as u64 >= self.split_min as u64
            {
                return self.split_h2c_data(buf, &ch, hlen, pdo, data_len, dd > 0, fail);
            }
            self.needed = plen;
            return Ok(None);
        }
        let pdu = &buf[..plen];

        if self.digests.header {
            let got = u32::from_le_bytes([pdu[hlen], pdu[hlen + 1], pdu[hlen + 2], pdu[hlen + 3]]);
            if got != super::data_digest(&pdu[..hlen]) {
                return Err(fail(fes::HEADER_DIGEST_ERROR, 0));
            }
        }
        let data = &pdu[if has_data { pdo } else { 0 }..][..data_len];
        let data_digest_ok = dd == 0 || {
            let d = &pdu[plen - DIGEST_LEN..];
            u32::from_le_bytes([d[0], d[1], d[2], d[3]]) == data_digest(data)
        };

        let out = match ty {
            pdu_type::CAPSULE_CMD => {
                let Some(sqe) = Sqe::from_bytes(&pdu[COMMON_HEADER_LEN..CAPSULE_CMD_HLEN]) else {
                    return Err(fail(fes::INVALID_HEADER_FIELD, FEI_HLEN));
                };
                Pdu::CapsuleCmd {
                    sqe,
                    data,
                    data_digest_ok,
                }
            }
            pdu_type::CAPSULE_RESP => {
                let Some(cqe) = Cqe::from_bytes(&pdu[COMMON_HEADER_LEN..SHORT_HLEN]) else {
                    return Err(fail(fes::INVALID_HEADER_FIELD, FEI_HLEN));
                };
                Pdu::CapsuleResp { cqe }
            }
            _ => {
                let Ok((h, _)) = DataHeader::read_from_prefix(pdu) else {
                    return Err(fail(fes::INVALID_HEADER_FIELD, FEI_HLEN));
                };
                let last = ch.flags & flags::LAST_PDU != 0;
                let datal_ok = h.datal.get() as usize == data_len;
                match ty {
                    pdu_type::H2C_DATA if datal_ok => Pdu::H2CData {
                        cccid: h.cccid.get(),
                        ttag: h.ttag.get(),
                        datao: h.datao.get(),
                        data,
                        last,
                        data_digest_ok,
                    },
                    pdu_type::C2H_DATA if datal_ok => Pdu::C2HData {
                        cccid: h.cccid.get(),
                        datao: h.datao.get(),
                        data,
                        last,
                        success: ch.flags & flags::SUCCESS != 0,
                        data_digest_ok,
                    },
                    pdu_type::R2T => Pdu::R2T {
                        cccid: h.cccid.get(),
                        ttag: h.ttag.get(),
                        r2to: h.datao.get(),
                        r2tl: h.datal.get(),
                    },
                    // DATAL disagrees with PLEN - PDO.
                    _ => return Err(fail(fes::INVALID_HEADER_FIELD, 16)),
                }
            }
        };
        Ok(Some((out, plen)))
    }

    /// The head of a streamed H2CData PDU (common checks done): once everything up to
    /// PDO is in, the header digest and DATAL are checked as for a whole PDU and the
    /// payload becomes the engine's to move.
    #[allow(clippy::too_many_arguments)]
    fn split_h2c_data<'a>(
        &mut self,
        buf: &'a [u8],
        ch: &CommonHeader,
        hlen: usize,
        pdo: usize,
        data_len: usize,
        ddgst: bool,
        fail: impl Fn(u16, u32) -> TermError,
    ) -> Result<Option<(Pdu<'a>, usize)>, TermError> {
        if buf.len() < pdo {
            self.needed = pdo;
            return Ok(None);
        }
        if self.digests.header {
            let got = u32::from_le_bytes([buf[hlen], buf[hlen + 1], buf[hlen + 2], buf[hlen + 3]]);
            if got != super::data_digest(&buf[..hlen]) {
                return Err(fail(fes::HEADER_DIGEST_ERROR, 0));
            }
        }
        let Ok((h, _)) = DataHeader::read_from_prefix(buf) else {
            return Err(fail(fes::INVALID_HEADER_FIELD, FEI_HLEN));
        };
        if h.datal.get() as usize != data_len {
            // DATAL disagrees with PLEN - PDO.
            return Err(fail(fes::INVALID_HEADER_FIELD, 16));
        }
        self.inflow = Inflow::Data {
            left: data_len as u32,
            crc: ddgst.then(DataDigest::new),
        };
        Ok(Some((
            Pdu::H2CDataHead {
                cccid: h.cccid.get(),
                ttag: h.ttag.get(),
                datao: h.datao.get(),
                len: data_len as u32,
                last: ch.flags & flags::LAST_PDU != 0,
            },
            pdo,
        )))
    }

    /// ICReq / ICResp: fixed 128-byte PDUs without digests.
    fn parse_ic<'a>(
        &mut self,
        buf: &'a [u8],
        ch: &CommonHeader,
        fail: impl Fn(u16, u32) -> TermError,
    ) -> Result<Option<(Pdu<'a>, usize)>, TermError> {
        if ch.flags != 0 {
            return Err(fail(fes::INVALID_HEADER_FIELD, FEI_FLAGS));
        }
        if ch.hlen as usize != IC_PDU_LEN {
            return Err(fail(fes::INVALID_HEADER_FIELD, FEI_HLEN));
        }
        if ch.pdo != 0 {
            return Err(fail(fes::INVALID_HEADER_FIELD, FEI_PDO));
        }
        if ch.plen.get() as usize != IC_PDU_LEN {
            return Err(fail(fes::INVALID_HEADER_FIELD, FEI_PLEN));
        }
        if buf.len() < IC_PDU_LEN {
            self.needed = IC_PDU_LEN;
            return Ok(None);
        }
        // Both ICs share the layout up to the 4-byte field at offset 12.
        let Ok((p, _)) = IcReqPdu::read_from_prefix(buf) else {
            return Err(fail(fes::INVALID_HEADER_FIELD, FEI_PLEN));
        };
        if p.pfv.get() != 0 {
            return Err(fail(fes::UNSUPPORTED_PARAMETER, 8));
        }
        if p.hpda > MAX_PDA {
            return Err(fail(fes::INVALID_HEADER_FIELD, 10));
        }
        let digests = dgst_from_bits(p.dgst);
        let pdu = match self.role {
            Role::Controller => Pdu::IcReq(IcReq {
                pfv: 0,
                hpda: p.hpda,
                digests,
                maxr2t: p.maxr2t.get(),
            }),
            Role::Host => {
                let maxh2cdata = p.maxr2t.get();
                if maxh2cdata < MIN_MAXH2CDATA || !maxh2cdata.is_multiple_of(4) {
                    return Err(fail(fes::INVALID_HEADER_FIELD, 12));
                }
                Pdu::IcResp(IcResp {
                    pfv: 0,
                    cpda: p.hpda,
                    digests,
                    maxh2cdata,
                })
            }
        };
        self.ic_done = true;
        Ok(Some((pdu, IC_PDU_LEN)))
    }

    /// H2CTermReq / C2HTermReq: any malformation closes the connection without answer.
    fn parse_term_req<'a>(
        &mut self,
        buf: &'a [u8],
        ch: &CommonHeader,
    ) -> Result<Option<(Pdu<'a>, usize)>, TermError> {
        let plen = ch.plen.get() as usize;
        if ch.hlen as usize != SHORT_HLEN || !(SHORT_HLEN..=TERM_REQ_MAX_PLEN).contains(&plen) {
            return Err(TermError {
                fes: fes::INVALID_HEADER_FIELD,
                fei: if ch.hlen as usize != SHORT_HLEN {
                    FEI_HLEN
                } else {
                    FEI_PLEN
                },
                header_len: COMMON_HEADER_LEN as u16,
                send_term_req: false,
            });
        }
        if buf.len() < plen {
            self.needed = plen;
            return Ok(None);
        }
        let Ok((h, _)) = TermReqHeader::read_from_prefix(buf) else {
            self.needed = SHORT_HLEN;
            return Ok(None);
        };
        let (fes, fei) = (h.fes.get(), h.fei.get());
        let pdu = match self.role {
            Role::Controller => Pdu::H2CTermReq { fes, fei },
            Role::Host => Pdu::C2HTermReq { fes, fei },
        };
        Ok(Some((pdu, plen)))
    }
}
