//! Connection information of a queue pair, serialisable to bytes for a key-value store.

use crate::error::{Error, Result};

/// What a peer needs to connect its queue pair to ours: QP number, LID (InfiniBand), GID
/// (RoCE and routed InfiniBand), path MTU and the first packet sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEndpoint {
    /// QP number (24 bits).
    pub qp_num: u32,
    /// Local identifier of the port (0 on RoCE).
    pub lid: u16,
    /// GID, network order.
    pub gid: [u8; 16],
    /// Active MTU of the port, verbs' enum (1 = 256 ... 5 = 4096).
    pub mtu: u8,
    /// First packet sequence number (24 bits).
    pub psn: u32,
}

const MAGIC: [u8; 3] = *b"IBX";
const VERSION: u8 = 1;

impl QpEndpoint {
    /// Encoded length.
    pub const BYTES: usize = 32;

    /// `"IBX", version, qp_num, psn, lid, mtu, 0, gid` (integers little-endian).
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[..3].copy_from_slice(&MAGIC);
        b[3] = VERSION;
        b[4..8].copy_from_slice(&self.qp_num.to_le_bytes());
        b[8..12].copy_from_slice(&self.psn.to_le_bytes());
        b[12..14].copy_from_slice(&self.lid.to_le_bytes());
        b[14] = self.mtu;
        b[16..32].copy_from_slice(&self.gid);
        b
    }

    /// Inverse of [`QpEndpoint::to_bytes`], checking every field.
    pub fn from_bytes(b: &[u8]) -> Result<QpEndpoint> {
        let bad = |reason: &str| Error::BadEndpoint {
            len: b.len(),
            reason: reason.to_string(),
        };
        if b.len() != Self::BYTES {
            return Err(bad("an endpoint is 32 bytes"));
        }
        if b[..3] != MAGIC {
            return Err(bad("not an ibverbx endpoint (magic)"));
        }
        if b[3] != VERSION {
            return Err(bad(&format!(
                "version {} (this build reads {VERSION})",
                b[3]
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let ep = QpEndpoint {
            qp_num: u32_at(4),
            psn: u32_at(8),
            lid: u16::from_le_bytes([b[12], b[13]]),
            mtu: b[14],
            gid: b[16..32].try_into().map_err(|_| bad("gid"))?,
        };
        if ep.qp_num >> 24 != 0 || ep.psn >> 24 != 0 {
            return Err(bad("qp number and psn are 24-bit"));
        }
        if !(1..=5).contains(&ep.mtu) {
            return Err(bad(&format!("mtu {} is not 1..=5", ep.mtu)));
        }
        Ok(ep)
    }

    /// Several endpoints (one per physical QP of a virtual connection) in one byte string.
    pub fn encode_many(eps: &[QpEndpoint]) -> Vec<u8> {
        eps.iter().flat_map(|e| e.to_bytes()).collect()
    }

    /// Inverse of [`QpEndpoint::encode_many`].
    pub fn decode_many(b: &[u8]) -> Result<Vec<QpEndpoint>> {
        if b.len() % Self::BYTES != 0 {
            return Err(Error::BadEndpoint {
                len: b.len(),
                reason: "not a whole number of endpoints".into(),
            });
        }
        b.chunks(Self::BYTES).map(QpEndpoint::from_bytes).collect()
    }
}

/// Path MTU in bytes for verbs' enum value (0 when unknown).
pub fn mtu_bytes(mtu: u8) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let ep = QpEndpoint {
            qp_num: 0x12_3456,
            lid: 7,
            gid: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
            mtu: 5,
            psn: 0xab_cdef,
        };
        let b = ep.to_bytes();
        assert_eq!(QpEndpoint::from_bytes(&b).unwrap(), ep);
        let many = QpEndpoint::encode_many(&[ep, ep]);
        assert_eq!(QpEndpoint::decode_many(&many).unwrap(), vec![ep, ep]);
        assert!(QpEndpoint::from_bytes(&b[..31]).is_err());
        let mut bad = b;
        bad[14] = 9;
        assert!(QpEndpoint::from_bytes(&bad)
            .unwrap_err()
            .to_string()
            .contains("mtu"));
        let mut bad = b;
        bad[0] = b'x';
        assert!(QpEndpoint::from_bytes(&bad).is_err());
        let mut bad = b;
        bad[7] = 1;
        assert!(QpEndpoint::from_bytes(&bad).is_err());
        assert_eq!(mtu_bytes(5), 4096);
        assert_eq!(mtu_bytes(1), 256);
    }
}
