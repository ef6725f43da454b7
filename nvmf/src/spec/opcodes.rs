//! Opcodes: admin (NVMe Base 2.0 Figure 138), NVM I/O (NVM Command Set 1.0 Figure 14)
//! and Fabrics command types (NVMe-oF 1.1 Figure 18).

/// Every Fabrics command has this opcode; FCTYPE selects the command.
pub const FABRICS: u8 = 0x7f;

pub mod admin {
    pub const DELETE_IO_SQ: u8 = 0x00;
    pub const CREATE_IO_SQ: u8 = 0x01;
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const DELETE_IO_CQ: u8 = 0x04;
    pub const CREATE_IO_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    pub const NS_MANAGEMENT: u8 = 0x0d;
    pub const FW_COMMIT: u8 = 0x10;
    pub const FW_IMAGE_DOWNLOAD: u8 = 0x11;
    pub const DEVICE_SELF_TEST: u8 = 0x14;
    pub const NS_ATTACHMENT: u8 = 0x15;
    pub const KEEP_ALIVE: u8 = 0x18;
    pub const DIRECTIVE_SEND: u8 = 0x19;
    pub const DIRECTIVE_RECEIVE: u8 = 0x1a;
    pub const VIRTUALIZATION_MANAGEMENT: u8 = 0x1c;
    pub const NVME_MI_SEND: u8 = 0x1d;
    pub const NVME_MI_RECEIVE: u8 = 0x1e;
    pub const DOORBELL_BUFFER_CONFIG: u8 = 0x7c;
    pub const FORMAT_NVM: u8 = 0x80;
    pub const SECURITY_SEND: u8 = 0x81;
    pub const SECURITY_RECEIVE: u8 = 0x82;
    pub const SANITIZE: u8 = 0x84;
}

pub mod io {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_UNCORRECTABLE: u8 = 0x04;
    pub const COMPARE: u8 = 0x05;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    pub const VERIFY: u8 = 0x0c;
    pub const RESERVATION_REGISTER: u8 = 0x0d;
    pub const RESERVATION_REPORT: u8 = 0x0e;
    pub const RESERVATION_ACQUIRE: u8 = 0x11;
    pub const RESERVATION_RELEASE: u8 = 0x15;
    pub const COPY: u8 = 0x19;

    /// I/O commands whose CDW10-11 is a first logical block (SLBA; SDLBA for Copy).
    pub fn addresses_blocks(opcode: u8) -> bool {
        matches!(
            opcode,
            READ | WRITE | WRITE_UNCORRECTABLE | COMPARE | WRITE_ZEROES | VERIFY | COPY
        )
    }
}

pub mod fabrics {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const AUTHENTICATION_SEND: u8 = 0x05;
    pub const AUTHENTICATION_RECEIVE: u8 = 0x06;
    pub const DISCONNECT: u8 = 0x08;
}
