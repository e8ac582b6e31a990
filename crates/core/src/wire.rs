//! The wire and disk encoding: postcard over serde, with hard size limits.
//!
//! Every frame a peer sends is bounded by [`FRAME_BYTES_MAX`] before it is decoded, and decoded
//! values are checked again by the protocol (vector lengths against `n`, fragment sizes against
//! the layout). Signatures, where they appear, cover the exact encoded bytes we received.

/// Re-exported so crates that store encoded records can name the bounds without depending on serde.
pub use serde::{Serialize, de::DeserializeOwned};

/// The largest frame a node or client accepts: the largest object plus room for metadata.
/// PoWerStore never sends more than half an object per frame (`k >= 2`), but the ABD and Phalanx
/// baselines move whole values, and every protocol must take the same objects.
pub const FRAME_BYTES_MAX: usize = crate::OBJECT_BYTES_MAX + 1024 * 1024;

/// Why bytes could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The input exceeds the limit for its kind.
    #[error("{len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Offered length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// Malformed input.
    #[error("malformed: {0}")]
    Malformed(#[from] postcard::Error),
}

/// Encodes `value`.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // postcard fails only for types serde cannot describe, never for our message types.
    postcard::to_stdvec(value).unwrap_or_else(|e| unreachable!("postcard encode: {e}"))
}

/// Decodes `bytes` if they are at most `max` long and form exactly one `T`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], max: usize) -> Result<T, WireError> {
    if bytes.len() > max {
        return Err(WireError::TooLarge {
            len: bytes.len(),
            max,
        });
    }
    let (value, rest) = postcard::take_from_bytes(bytes)?;
    if !rest.is_empty() {
        return Err(WireError::Malformed(
            postcard::Error::DeserializeBadEncoding,
        ));
    }
    Ok(value)
}
