//! What every Bulwark fuzz target asserts about a decoder: hostile bytes never panic it, and
//! whatever it accepts encodes back to bytes it decodes to the same value.

use bulwark_core::wire::{self, DeserializeOwned, Serialize};

/// Decodes `bytes` as a `T` under `max`, as a node or client would; where that succeeds, checks
/// that the value's encoding decodes again to a value with the same encoding
/// (decode(encode(x)) = x, compared on encodings since not every message type is `Eq`).
pub fn round_trip<T: Serialize + DeserializeOwned>(bytes: &[u8], max: usize) -> Option<T> {
    let value: T = wire::decode(bytes, max).ok()?;
    let encoded = wire::encode(&value);
    let again: T = wire::decode(&encoded, usize::MAX).unwrap_or_else(|error| {
        panic!("an encoding of an accepted value does not decode: {error}")
    });
    assert!(
        wire::encode(&again) == encoded,
        "decode(encode(x)) differs from x"
    );
    Some(value)
}
