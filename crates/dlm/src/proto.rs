//! The wire format of PROTOCOL.md: the 32-byte header, opcodes and status codes.
//! Pure encoding and decoding; no I/O.

/// "PDLM" as little-endian bytes.
pub const MAGIC: u32 = 0x4D4C_4450;
/// Version 2 added the handshake (HELLO, AUTH); a version 1 peer is refused with BAD_VERSION.
pub const VERSION: u8 = 2;
pub const HEADER_LEN: usize = 32;
/// Largest payload either side accepts.
pub const MAX_PAYLOAD: u32 = 64 << 20;
/// Base page sizes a client may use.
pub const MIN_BASE_PAGE: u32 = 4096;
/// Smallest granule a region may use (ALLOC's `B`): a client's base page, or under erasure
/// coding one piece of it (B/K, `redundancy.rs`).
pub const MIN_GRANULE: u32 = 256;
pub const MAX_BASE_PAGE: u32 = 16 << 20;
/// Replies carry the request's opcode with this bit set.
pub const REPLY_BIT: u8 = 0x80;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Opcode {
    Alloc = 1,
    Free = 2,
    Read = 3,
    Write = 4,
    Stats = 5,
    Discard = 6,
    /// Handshake, first message: the client's nonce (PROTOCOL.md, "Handshake").
    Hello = 7,
    /// Handshake, second message: the client's proof.
    Auth = 8,
}

impl Opcode {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Opcode::Alloc,
            2 => Opcode::Free,
            3 => Opcode::Read,
            4 => Opcode::Write,
            5 => Opcode::Stats,
            6 => Opcode::Discard,
            7 => Opcode::Hello,
            8 => Opcode::Auth,
            _ => return None,
        })
    }
}

/// Reply status codes (PROTOCOL.md, "Replies").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Status {
    Ok = 0,
    BadMagic = 1,
    BadVersion = 2,
    BadOpcode = 3,
    BadRegion = 4,
    OutOfRange = 5,
    BadSize = 6,
    NoSpace = 7,
    Server = 8,
    /// The handshake failed, or a request came before it completed.
    Auth = 9,
}

impl Status {
    pub fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::BadMagic,
            2 => Status::BadVersion,
            3 => Status::BadOpcode,
            4 => Status::BadRegion,
            5 => Status::OutOfRange,
            6 => Status::BadSize,
            7 => Status::NoSpace,
            8 => Status::Server,
            9 => Status::Auth,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::BadMagic => "BAD_MAGIC",
            Status::BadVersion => "BAD_VERSION",
            Status::BadOpcode => "BAD_OPCODE",
            Status::BadRegion => "BAD_REGION",
            Status::OutOfRange => "OUT_OF_RANGE",
            Status::BadSize => "BAD_SIZE",
            Status::NoSpace => "NO_SPACE",
            Status::Server => "SERVER",
            Status::Auth => "AUTH",
        }
    }
}

/// The fixed header of every message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub magic: u32,
    pub version: u8,
    pub opcode: u8,
    pub status: u16,
    pub request_id: u32,
    pub set_count: u32,
    pub region: u32,
    pub length: u32,
    pub page: u64,
}

impl Header {
    /// A request header with the magic and version filled in.
    pub fn request(op: Opcode, request_id: u32) -> Self {
        Header { magic: MAGIC, version: VERSION, opcode: op as u8, request_id, ..Default::default() }
    }

    /// The reply header answering `req` with `status`.
    pub fn reply_to(req: &Header, status: Status, length: u32) -> Self {
        Header {
            magic: MAGIC,
            version: VERSION,
            opcode: req.opcode | REPLY_BIT,
            status: status as u16,
            request_id: req.request_id,
            set_count: req.set_count,
            region: req.region,
            length,
            page: req.page,
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4] = self.version;
        b[5] = self.opcode;
        b[6..8].copy_from_slice(&self.status.to_le_bytes());
        b[8..12].copy_from_slice(&self.request_id.to_le_bytes());
        b[12..16].copy_from_slice(&self.set_count.to_le_bytes());
        b[16..20].copy_from_slice(&self.region.to_le_bytes());
        b[20..24].copy_from_slice(&self.length.to_le_bytes());
        b[24..32].copy_from_slice(&self.page.to_le_bytes());
        b
    }

    /// Decode without judging the contents (see [`Header::check`]).
    pub fn decode(b: &[u8; HEADER_LEN]) -> Self {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut p = [0u8; 8];
        p.copy_from_slice(&b[24..32]);
        Header {
            magic: u32_at(0),
            version: b[4],
            opcode: b[5],
            status: u16::from_le_bytes([b[6], b[7]]),
            request_id: u32_at(8),
            set_count: u32_at(12),
            region: u32_at(16),
            length: u32_at(20),
            page: u64::from_le_bytes(p),
        }
    }

    /// Check magic, version and the payload bound: the conditions under which the stream can
    /// no longer be trusted and the connection must close.
    pub fn check(&self) -> Result<(), (Status, String)> {
        if self.magic != MAGIC {
            return Err((Status::BadMagic, format!("bad magic {:#010x}", self.magic)));
        }
        if self.version != VERSION {
            return Err((
                Status::BadVersion,
                format!(
                    "this server speaks DLM protocol version {VERSION} (with a shared-secret handshake); \
                     the client speaks version {}: update the client",
                    self.version
                ),
            ));
        }
        if self.length > MAX_PAYLOAD {
            return Err((Status::BadSize, format!("payload of {} bytes exceeds {}", self.length, MAX_PAYLOAD)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn header_roundtrips(opcode: u8, status: u16, id: u32, sc: u32, region: u32, length: u32, page: u64) {
            let h = Header { magic: MAGIC, version: VERSION, opcode, status, request_id: id, set_count: sc, region, length, page };
            prop_assert_eq!(Header::decode(&h.encode()), h);
        }
    }

    #[test]
    fn magic_reads_as_pdlm() {
        let h = Header::request(Opcode::Read, 7);
        assert_eq!(&h.encode()[0..4], b"PDLM");
    }

    #[test]
    fn check_rejects_the_stream_breaking_cases() {
        let mut h = Header::request(Opcode::Read, 1);
        assert!(h.check().is_ok());
        h.length = MAX_PAYLOAD + 1;
        assert_eq!(h.check().unwrap_err().0, Status::BadSize);
        h.length = 0;
        h.version = 9;
        assert_eq!(h.check().unwrap_err().0, Status::BadVersion);
        h.magic = 0;
        assert_eq!(h.check().unwrap_err().0, Status::BadMagic);
    }
}
