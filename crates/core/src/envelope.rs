//! The frame envelope every node and client exchanges: a fixed-width header that says which
//! service, replica group and epoch a frame is for and which operation it belongs to, then the
//! service's own body, opaque at this layer.
//!
//! A node routes a frame to the replica that serves `(service, group)` and a client routes a reply
//! to the operation waiting for `op` by reading these 24 bytes alone: the body is decoded only by
//! the one machine that understands it, and a frame for a group or epoch the node does not serve
//! is refused without decoding anything. The header is fixed-width rather than postcard so that
//! reading it costs nothing and the body stays a zero-copy slice of the received buffer.

use crate::ids::{Epoch, GroupId, ServiceId};
use crate::wire::{self, Serialize};
use bytes::Bytes;
use serde::Deserialize;

/// The header's format; a frame with another version is refused before anything else is read.
pub const ENVELOPE_VERSION: u8 = 1;

/// Header bytes: version, kind, service (2), group (4), epoch (8), op (8).
pub const HEADER_BYTES: usize = 24;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A request to a replica (or to the node itself, for [`ServiceId::SYSTEM`]).
    Request,
    /// A replica's reply to a request.
    Reply,
    /// A refusal by the node before any replica saw the request; the body is a [`Refusal`].
    Refused,
    /// A message from one replica to another of its group; nothing answers it by op.
    Message,
}

impl Kind {
    fn to_byte(self) -> u8 {
        match self {
            Kind::Request => 0,
            Kind::Reply => 1,
            Kind::Refused => 2,
            Kind::Message => 3,
        }
    }

    fn from_byte(byte: u8) -> Option<Kind> {
        match byte {
            0 => Some(Kind::Request),
            1 => Some(Kind::Reply),
            2 => Some(Kind::Refused),
            3 => Some(Kind::Message),
            _ => None,
        }
    }
}

/// Where a frame goes and what it answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// Request, reply or refusal.
    pub kind: Kind,
    /// The service whose machine reads the body.
    pub service: ServiceId,
    /// The replica group addressed (the group that answers, in a reply).
    pub group: GroupId,
    /// The configuration the sender believes in.
    pub epoch: Epoch,
    /// The operation: chosen by the requester, echoed by every reply and refusal.
    pub op: u64,
}

impl Header {
    /// A request header.
    pub fn request(service: ServiceId, group: GroupId, epoch: Epoch, op: u64) -> Header {
        Header {
            kind: Kind::Request,
            service,
            group,
            epoch,
            op,
        }
    }

    /// The header of this request's reply: the same routing, kind `Reply`.
    pub fn reply(&self) -> Header {
        Header {
            kind: Kind::Reply,
            ..*self
        }
    }

    /// The header of a refusal of this request.
    pub fn refused(&self) -> Header {
        Header {
            kind: Kind::Refused,
            ..*self
        }
    }

    /// The fixed-width encoding.
    pub fn to_bytes(&self) -> [u8; HEADER_BYTES] {
        let mut bytes = [0u8; HEADER_BYTES];
        bytes[0] = ENVELOPE_VERSION;
        bytes[1] = self.kind.to_byte();
        bytes[2..4].copy_from_slice(&self.service.0.to_be_bytes());
        bytes[4..8].copy_from_slice(&self.group.0.to_be_bytes());
        bytes[8..16].copy_from_slice(&self.epoch.0.to_be_bytes());
        bytes[16..24].copy_from_slice(&self.op.to_be_bytes());
        bytes
    }

    /// Reads a header from the first [`HEADER_BYTES`] of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Header, EnvelopeError> {
        let Some(bytes) = bytes.get(..HEADER_BYTES) else {
            return Err(EnvelopeError::Short { len: bytes.len() });
        };
        if bytes[0] != ENVELOPE_VERSION {
            return Err(EnvelopeError::Version { found: bytes[0] });
        }
        let kind = Kind::from_byte(bytes[1]).ok_or(EnvelopeError::Kind { found: bytes[1] })?;
        let field = |range: std::ops::Range<usize>| -> u64 {
            bytes[range]
                .iter()
                .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
        };
        Ok(Header {
            kind,
            service: ServiceId(field(2..4) as u16),
            group: GroupId(field(4..8) as u32),
            epoch: Epoch(field(8..16)),
            op: field(16..24),
        })
    }
}

/// A frame: a header and its body, the service's own encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// Routing.
    pub header: Header,
    /// The body, a slice of the received frame.
    pub body: Bytes,
}

impl Envelope {
    /// Splits a received frame; the body is not copied and not yet decoded.
    pub fn decode(frame: Bytes) -> Result<Envelope, EnvelopeError> {
        let header = Header::from_bytes(&frame)?;
        Ok(Envelope {
            header,
            body: frame.slice(HEADER_BYTES..),
        })
    }

    /// Decodes the body as `T` under `max` bytes; byte strings marked `wire::shared_bytes`
    /// stay slices of the frame.
    pub fn body<T: wire::DeserializeOwned>(&self, max: usize) -> Result<T, wire::WireError> {
        wire::decode_shared(&self.body, max)
    }
}

/// Encodes a frame: `header`, then `body` in the wire encoding, in one allocation of the final size.
pub fn frame<T: Serialize>(header: &Header, body: &T) -> Bytes {
    Bytes::from(wire::encode_after(&header.to_bytes(), body))
}

/// Encodes a frame whose body is already encoded.
pub fn frame_raw(header: &Header, body: &[u8]) -> Bytes {
    let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
    bytes.extend_from_slice(&header.to_bytes());
    bytes.extend_from_slice(body);
    Bytes::from(bytes)
}

/// Why a node refused a frame before any replica read it. Each says what the sender needs to
/// catch up: a sender in an older epoch learns the node's epoch (and, once configurations are
/// certified, fetches the newer one); a sender that picked the wrong group learns the node does
/// not serve it in that epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The sender's epoch is not the node's.
    #[error("wrong epoch: the node is in epoch {}", current.0)]
    WrongEpoch {
        /// The node's epoch.
        current: Epoch,
    },
    /// The node serves no replica of this group for this service in the sender's epoch.
    #[error("the node serves no replica of group {} for service {}", group.0, service.0)]
    WrongGroup {
        /// The service asked for.
        service: ServiceId,
        /// The group asked for.
        group: GroupId,
    },
    /// The node runs no such service.
    #[error("the node runs no service {}", service.0)]
    UnknownService {
        /// The service asked for.
        service: ServiceId,
    },
    /// The peer may not use this service (a client speaking as a node, say).
    #[error("not allowed: {0}")]
    NotAllowed(String),
}

/// Why a frame's header could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Fewer bytes than a header.
    #[error("frame of {len} bytes is shorter than a header")]
    Short {
        /// The frame's length.
        len: usize,
    },
    /// An envelope version this build does not speak.
    #[error("envelope version {found}; this build speaks {ENVELOPE_VERSION}")]
    Version {
        /// The version byte.
        found: u8,
    },
    /// An unknown kind byte.
    #[error("unknown frame kind {found}")]
    Kind {
        /// The kind byte.
        found: u8,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header::request(ServiceId(7), GroupId(0xdead_beef), Epoch(u64::MAX - 1), 42)
    }

    #[test]
    fn a_header_round_trips_and_a_body_stays_a_slice() {
        let frame = frame(&header(), &(1u32, Bytes::from_static(b"body")));
        let envelope = Envelope::decode(frame.clone()).unwrap();
        assert_eq!(envelope.header, header());
        let (n, body): (u32, Bytes) = envelope.body(1024).unwrap();
        assert_eq!((n, &body[..]), (1, &b"body"[..]));
        assert_eq!(
            envelope.body.as_ptr(),
            frame[HEADER_BYTES..].as_ptr(),
            "the body is not copied"
        );
        assert_eq!(header().reply().kind, Kind::Reply);
        assert_eq!(header().refused().op, 42);
    }

    #[test]
    fn short_unknown_and_future_headers_are_refused() {
        assert_eq!(
            Envelope::decode(Bytes::from_static(&[1, 0, 0])),
            Err(EnvelopeError::Short { len: 3 })
        );
        let mut bytes = header().to_bytes();
        bytes[0] = 2;
        assert_eq!(
            Header::from_bytes(&bytes),
            Err(EnvelopeError::Version { found: 2 })
        );
        let mut bytes = header().to_bytes();
        bytes[1] = 9;
        assert_eq!(
            Header::from_bytes(&bytes),
            Err(EnvelopeError::Kind { found: 9 })
        );
    }

    #[test]
    fn any_bytes_decode_to_a_header_or_an_error() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..64 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    (state >> 56) as u8
                })
                .collect();
            let _ = Envelope::decode(Bytes::from(bytes));
        }
    }
}
