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
    encode_after(&[], value)
}

/// `prefix` followed by the encoding of `value`, in one buffer of the final size (a frame's
/// header and body).
pub fn encode_after<T: Serialize>(prefix: &[u8], value: &T) -> Vec<u8> {
    // Sized first: growing the buffer while encoding a frame that carries a fragment would copy
    // the fragment once per doubling (a profile of 1 MiB gets showed as many bytes moved by those
    // reallocations as by the encoding itself). Counting is cheap: no bytes are written.
    // postcard fails only for types serde cannot describe, never for our message types.
    let size = postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default())
        .unwrap_or_else(|e| unreachable!("postcard size: {e}"));
    let mut buffer = Vec::with_capacity(prefix.len() + size);
    buffer.extend_from_slice(prefix);
    postcard::serialize_with_flavor(value, Presized(buffer))
        .unwrap_or_else(|e| unreachable!("postcard encode: {e}"))
}

/// A postcard output that appends to a vector allocated at the final size.
struct Presized(Vec<u8>);

impl postcard::ser_flavors::Flavor for Presized {
    type Output = Vec<u8>;

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
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

/// Byte strings shorter than this are copied out of a frame even by [`decode_shared`]: a small
/// value kept by a caller should not pin the (possibly much larger) receive buffer it came in.
const SHARE_BYTES_MIN: usize = 4 * 1024;

thread_local! {
    /// The buffer [`decode_shared`] is decoding on this thread, for [`shared_bytes`] to slice.
    static SOURCE: std::cell::RefCell<Option<bytes::Bytes>> = const { std::cell::RefCell::new(None) };
}

/// [`decode`], except that fields marked `#[serde(with = "wire::shared_bytes")]` of 4 KiB or
/// more become slices of `bytes` instead of copies: a fragment arrives in a frame (or a record
/// read from disk) that is already an owned buffer, and copying it again costs as much as
/// hashing it.
pub fn decode_shared<T: DeserializeOwned>(
    bytes: &bytes::Bytes,
    max: usize,
) -> Result<T, WireError> {
    let previous = SOURCE.with(|source| source.replace(Some(bytes.clone())));
    let decoded = decode(bytes, max);
    SOURCE.with(|source| source.replace(previous));
    decoded
}

/// Serde for a `Bytes` field that [`decode_shared`] fills without copying. The encoding is
/// exactly `Bytes`'s own (a postcard byte string), so marking a field changes no format.
pub mod shared_bytes {
    use bytes::Bytes;
    use serde::{Deserializer, Serializer, de};

    /// Writes the bytes as a byte string.
    pub fn serialize<S: Serializer>(bytes: &Bytes, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    /// Reads a byte string, as a slice of the buffer being decoded when it lies inside it.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Bytes, D::Error> {
        deserializer.deserialize_bytes(SharedVisitor)
    }

    struct SharedVisitor;

    impl<'de> de::Visitor<'de> for SharedVisitor {
        type Value = Bytes;

        fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
            formatter.write_str("a byte string")
        }

        fn visit_borrowed_bytes<E: de::Error>(self, borrowed: &'de [u8]) -> Result<Bytes, E> {
            Ok(super::share(borrowed))
        }

        fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Bytes, E> {
            Ok(Bytes::copy_from_slice(bytes))
        }

        fn visit_byte_buf<E: de::Error>(self, bytes: Vec<u8>) -> Result<Bytes, E> {
            Ok(Bytes::from(bytes))
        }
    }
}

/// `borrowed` as a slice of the buffer [`decode_shared`] is decoding, if it lies inside it and is
/// large enough to be worth sharing; otherwise a copy.
fn share(borrowed: &[u8]) -> bytes::Bytes {
    if borrowed.len() >= SHARE_BYTES_MIN {
        let shared = SOURCE.with(|source| {
            let source = source.borrow();
            let source = source.as_ref()?;
            let start = source.as_ptr() as usize;
            let at = borrowed.as_ptr() as usize;
            let inside = at >= start && at + borrowed.len() <= start + source.len();
            inside.then(|| source.slice_ref(borrowed))
        });
        if let Some(shared) = shared {
            return shared;
        }
    }
    bytes::Bytes::copy_from_slice(borrowed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Carrier {
        before: u32,
        #[serde(with = "shared_bytes")]
        payload: Bytes,
        plain: Bytes,
    }

    fn carrier(len: usize) -> Carrier {
        Carrier {
            before: 7,
            payload: Bytes::from((0..len).map(|i| i as u8).collect::<Vec<u8>>()),
            plain: Bytes::from_static(b"tail"),
        }
    }

    fn points_into(inner: &Bytes, outer: &Bytes) -> bool {
        let (start, at) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
        at >= start && at + inner.len() <= start + outer.len()
    }

    #[test]
    fn encoding_is_postcards_own_and_a_shared_field_encodes_like_bytes() {
        let value = carrier(10_000);
        let encoded = encode(&value);
        assert_eq!(encoded, postcard::to_stdvec(&value).unwrap());
        let as_plain = (value.before, value.payload.clone(), value.plain.clone());
        assert_eq!(encoded, encode(&as_plain));
        assert_eq!(encoded.capacity(), encoded.len());
    }

    #[test]
    fn a_large_field_is_a_slice_of_the_frame_and_a_small_one_a_copy() {
        let frame = Bytes::from(encode(&carrier(64 * 1024)));
        let decoded: Carrier = decode_shared(&frame, usize::MAX).unwrap();
        assert_eq!(decoded, carrier(64 * 1024));
        assert!(points_into(&decoded.payload, &frame));

        let frame = Bytes::from(encode(&carrier(100)));
        let decoded: Carrier = decode_shared(&frame, usize::MAX).unwrap();
        assert_eq!(decoded, carrier(100));
        assert!(!points_into(&decoded.payload, &frame));
    }

    #[test]
    fn plain_decoding_copies_and_limits_still_hold() {
        let encoded = encode(&carrier(64 * 1024));
        let decoded: Carrier = decode(&encoded, usize::MAX).unwrap();
        assert_eq!(decoded, carrier(64 * 1024));
        let frame = Bytes::from(encoded);
        assert!(matches!(
            decode_shared::<Carrier>(&frame, 100),
            Err(WireError::TooLarge { .. })
        ));
        let mut trailing = frame.to_vec();
        trailing.push(0);
        assert!(decode_shared::<Carrier>(&Bytes::from(trailing), usize::MAX).is_err());
        // Nothing of the frame stays behind for a later decode on this thread.
        SOURCE.with(|source| assert!(source.borrow().is_none()));
    }
}
