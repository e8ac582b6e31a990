//! Erasure coding behind one trait.
//!
//! PoWerStore stores a value as `n = 3f+1` fragments of which any `k = f+1` rebuild it (§3.1).
//! The code is systematic: fragments `0..k` are the value itself, cut in pieces, so a reader that
//! receives and verifies all of them concatenates instead of decoding. Decoding in
//! reed-solomon-simd starts by evaluating an erasure-locator polynomial over all of GF(2^16),
//! ~180 µs whatever the size, which depends only on which fragments are missing: it is
//! remembered ([`RememberedLocators`]), and a 64 KiB decode takes ~50 µs instead of ~200. Values
//! up to [`REPLICATE_BYTES_MAX`] are replicated whole instead: every fragment is the value, any
//! single verified fragment is enough, and the extra storage is a few KiB. The reader's `t+1` agreement on the cross-checksum is unchanged either
//! way, so the protocol's guarantees do not depend on the choice.

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// Values this small are replicated rather than coded.
pub const REPLICATE_BYTES_MAX: u64 = 4 * 1024;

/// How a value was cut into fragments. Stored inside the cross-checksum, so a reader uses the
/// layout that `f+1` servers vouch for, never one a single server claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Layout {
    /// The value's length in bytes, before padding.
    pub len: u64,
    /// The scheme.
    pub scheme: Scheme,
}

/// An erasure-coding scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Scheme {
    /// Every fragment is the whole value.
    Replicated {
        /// Number of fragments.
        total: u16,
    },
    /// Systematic Reed-Solomon: `data` fragments hold the padded value, `total - data` parity.
    ReedSolomon {
        /// `k`: fragments needed to rebuild.
        data: u16,
        /// `n`: fragments produced.
        total: u16,
    },
}

/// Why fragments could not be turned back into a value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer usable fragments than the scheme needs.
    #[error("{have} usable fragments; {need} are needed")]
    TooFew {
        /// Fragments offered with a valid index and size.
        have: usize,
        /// Fragments the scheme needs.
        need: usize,
    },
    /// The layout itself is impossible (zero fragments, more data than total, absurd length).
    #[error("invalid layout {0:?}")]
    InvalidLayout(Layout),
    /// The codec refused the input.
    #[error("codec: {0}")]
    Codec(String),
}

impl Layout {
    /// The layout Bulwark uses for a value of `len` bytes on `n` nodes tolerating `f` faults.
    pub fn for_value(len: usize, n: usize, f: usize) -> Layout {
        let len = len as u64;
        let scheme = if len <= REPLICATE_BYTES_MAX {
            Scheme::Replicated { total: n as u16 }
        } else {
            Scheme::ReedSolomon {
                data: (f + 1) as u16,
                total: n as u16,
            }
        };
        Layout { len, scheme }
    }

    /// Fragments produced.
    pub fn total(&self) -> usize {
        match self.scheme {
            Scheme::Replicated { total } | Scheme::ReedSolomon { total, .. } => total as usize,
        }
    }

    /// Fragments needed to rebuild.
    pub fn needed(&self) -> usize {
        match self.scheme {
            Scheme::Replicated { .. } => 1,
            Scheme::ReedSolomon { data, .. } => data as usize,
        }
    }

    /// The exact length every fragment of this layout has. reed-solomon-simd needs an even,
    /// non-zero shard size.
    pub fn fragment_len(&self) -> usize {
        match self.scheme {
            Scheme::Replicated { .. } => self.len as usize,
            Scheme::ReedSolomon { data, .. } => {
                let data = (data as u64).max(1);
                let per = self.len.div_ceil(data).max(2);
                (per + (per & 1)) as usize
            }
        }
    }

    /// Whether the layout is internally consistent and within `value_bytes_max`.
    pub fn is_valid(&self, value_bytes_max: usize) -> bool {
        if self.len > value_bytes_max as u64 {
            return false;
        }
        match self.scheme {
            Scheme::Replicated { total } => total >= 1 && self.len <= REPLICATE_BYTES_MAX,
            Scheme::ReedSolomon { data, total } => {
                data >= 1 && total > data && self.len > REPLICATE_BYTES_MAX
            }
        }
    }
}

/// Turns values into fragments and back. One trait so that the codec behind it can be swapped
/// and benchmarked (crates.md).
pub trait ErasureCodec: Send + Sync {
    /// Cuts `value` into `layout.total()` fragments, each `layout.fragment_len()` bytes.
    fn encode(&self, layout: &Layout, value: &[u8]) -> Result<Vec<Bytes>, DecodeError>;

    /// Rebuilds the value from `(index, fragment)` pairs that the caller has already verified
    /// against the agreed cross-checksum. Extra fragments are ignored; indexes must be distinct.
    fn decode(&self, layout: &Layout, fragments: &[(usize, Bytes)]) -> Result<Bytes, DecodeError> {
        let originals = self.originals(layout, fragments)?;
        Ok(join(layout, originals))
    }

    /// The first `layout.needed()` fragments (those the value is cut into, padding included),
    /// the ones given as they are and the rest rebuilt from `(index, fragment)` pairs as in
    /// [`ErasureCodec::decode`].
    fn originals(
        &self,
        layout: &Layout,
        fragments: &[(usize, Bytes)],
    ) -> Result<Vec<Bytes>, DecodeError>;

    /// The fragments after the first `layout.needed()`, computed from those (`originals`, each
    /// `layout.fragment_len()` bytes): with them, the codeword `originals` begin.
    fn recovery(&self, layout: &Layout, originals: &[Bytes]) -> Result<Vec<Bytes>, DecodeError>;
}

/// The value the first `layout.needed()` fragments hold.
pub fn join(layout: &Layout, originals: Vec<Bytes>) -> Bytes {
    if let [whole] = &originals[..] {
        return whole.slice(..(layout.len as usize).min(whole.len()));
    }
    let mut value = BytesMut::with_capacity(originals.iter().map(Bytes::len).sum());
    for piece in &originals {
        value.extend_from_slice(piece);
    }
    value.truncate(layout.len as usize);
    value.freeze()
}

/// Reed-Solomon over GF(2^16) from `reed-solomon-simd`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReedSolomonSimd;

impl ErasureCodec for ReedSolomonSimd {
    fn encode(&self, layout: &Layout, value: &[u8]) -> Result<Vec<Bytes>, DecodeError> {
        if value.len() as u64 != layout.len {
            return Err(DecodeError::InvalidLayout(*layout));
        }
        match layout.scheme {
            Scheme::Replicated { total } => {
                let whole = Bytes::copy_from_slice(value);
                Ok(vec![whole; total as usize])
            }
            Scheme::ReedSolomon { data, .. } => {
                let shard = layout.fragment_len();
                let mut originals = Vec::with_capacity(data as usize);
                for index in 0..data as usize {
                    let start = (index * shard).min(value.len());
                    let end = ((index + 1) * shard).min(value.len());
                    let mut piece = BytesMut::zeroed(shard);
                    piece[..end - start].copy_from_slice(&value[start..end]);
                    originals.push(piece.freeze());
                }
                let recovery = self.recovery(layout, &originals)?;
                originals.extend(recovery);
                Ok(originals)
            }
        }
    }

    fn originals(
        &self,
        layout: &Layout,
        fragments: &[(usize, Bytes)],
    ) -> Result<Vec<Bytes>, DecodeError> {
        let shard = layout.fragment_len();
        let total = layout.total();
        let usable: Vec<&(usize, Bytes)> = fragments
            .iter()
            .filter(|(index, bytes)| *index < total && bytes.len() == shard)
            .collect();
        let need = layout.needed();
        let have = usable.len();
        let too_few = || DecodeError::TooFew { have, need };
        if have < need {
            return Err(too_few());
        }
        match layout.scheme {
            Scheme::Replicated { .. } => Ok(vec![usable[0].1.clone()]),
            Scheme::ReedSolomon { data, .. } => {
                let data = data as usize;
                let mut originals: Vec<Option<Bytes>> = vec![None; data];
                for (index, bytes) in &usable {
                    if *index < data {
                        originals[*index] = Some(bytes.clone());
                    }
                }
                if originals.iter().any(Option::is_none) {
                    restore(data, total - data, shard, &usable, &mut originals)?;
                }
                originals
                    .into_iter()
                    .map(|o| o.ok_or_else(too_few))
                    .collect()
            }
        }
    }

    fn recovery(&self, layout: &Layout, originals: &[Bytes]) -> Result<Vec<Bytes>, DecodeError> {
        let shard = layout.fragment_len();
        if originals.len() != layout.needed() || originals.iter().any(|o| o.len() != shard) {
            return Err(DecodeError::InvalidLayout(*layout));
        }
        match layout.scheme {
            Scheme::Replicated { total } => Ok(vec![originals[0].clone(); total as usize - 1]),
            Scheme::ReedSolomon { data, total } => {
                let recovery = reed_solomon_simd::encode(
                    data as usize,
                    (total - data) as usize,
                    originals.iter(),
                )
                .map_err(|e| DecodeError::Codec(e.to_string()))?;
                Ok(recovery.into_iter().map(Bytes::from).collect())
            }
        }
    }
}

/// Fills the missing entries of `originals` from `usable`, through reed-solomon-simd with the
/// erasure locators remembered ([`RememberedLocators`]).
fn restore(
    data: usize,
    recovery: usize,
    shard: usize,
    usable: &[&(usize, Bytes)],
    originals: &mut [Option<Bytes>],
) -> Result<(), DecodeError> {
    use reed_solomon_simd::rate::{DefaultRateDecoder, RateDecoder};
    let codec = |e: reed_solomon_simd::Error| DecodeError::Codec(e.to_string());
    let engine = RememberedLocators(reed_solomon_simd::engine::DefaultEngine::new());
    let mut decoder =
        DefaultRateDecoder::new(data, recovery, shard, engine, None).map_err(codec)?;
    for (index, bytes) in usable {
        if *index < data {
            decoder.add_original_shard(*index, bytes).map_err(codec)?;
        } else {
            decoder
                .add_recovery_shard(index - data, bytes)
                .map_err(codec)?;
        }
    }
    let result = decoder.decode().map_err(codec)?;
    for (index, slot) in originals.iter_mut().enumerate() {
        if slot.is_none() {
            *slot = result.restored_original(index).map(Bytes::copy_from_slice);
        }
    }
    Ok(())
}

/// Erasure locators already evaluated, by the input they were evaluated for.
type Locators = Vec<((usize, Vec<(u32, u16)>), Box<[u16]>)>;

/// Locators kept at most: 128 KiB each. A group of `3f+1` has `C(3f+1, f+1)` ways to be missing
/// shards, and a reader meets few of them.
const LOCATORS_MAX: usize = 32;

/// reed-solomon-simd's default engine with one step remembered: evaluating the erasure-locator
/// polynomial over all of GF(2^16) (`Engine::eval_poly`), which costs ~180 µs here whatever the
/// shard size (most of a 64 KiB decode) and depends only on which shards are missing. Its result
/// is a pure function of its input, so a remembered one is the same array recomputed.
struct RememberedLocators(reed_solomon_simd::engine::DefaultEngine);

static LOCATORS: std::sync::Mutex<Locators> = std::sync::Mutex::new(Vec::new());

impl reed_solomon_simd::engine::Engine for RememberedLocators {
    fn fft(
        &self,
        data: &mut reed_solomon_simd::engine::ShardsRefMut,
        pos: usize,
        size: usize,
        truncated_size: usize,
        skew_delta: usize,
    ) {
        self.0.fft(data, pos, size, truncated_size, skew_delta);
    }

    fn ifft(
        &self,
        data: &mut reed_solomon_simd::engine::ShardsRefMut,
        pos: usize,
        size: usize,
        truncated_size: usize,
        skew_delta: usize,
    ) {
        self.0.ifft(data, pos, size, truncated_size, skew_delta);
    }

    fn mul(&self, x: &mut [[u8; 64]], log_m: u16) {
        self.0.mul(x, log_m);
    }

    fn eval_poly(erasures: &mut [u16; reed_solomon_simd::engine::GF_ORDER], truncated_size: usize) {
        use reed_solomon_simd::engine::DefaultEngine;
        // The whole input as a short key: its size and its non-zero entries. An input with many
        // (the low-rate decoder's) is evaluated every time.
        let mut nonzero = Vec::new();
        for (index, value) in erasures.iter().enumerate() {
            if *value != 0 {
                if nonzero.len() == 64 {
                    DefaultEngine::eval_poly(erasures, truncated_size);
                    return;
                }
                nonzero.push((index as u32, *value));
            }
        }
        let key = (truncated_size, nonzero);
        if let Ok(known) = LOCATORS.lock()
            && let Some((_, locator)) = known.iter().find(|(k, _)| *k == key)
        {
            erasures.copy_from_slice(&locator[..]);
            return;
        }
        DefaultEngine::eval_poly(erasures, truncated_size);
        if let Ok(mut known) = LOCATORS.lock()
            && !known.iter().any(|(k, _)| *k == key)
        {
            if known.len() >= LOCATORS_MAX {
                known.remove(0);
            }
            known.push((key, erasures.to_vec().into_boxed_slice()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip_from_every_subset(len: usize, f: usize) {
        let n = 3 * f + 1;
        let value: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
        let layout = Layout::for_value(len, n, f);
        assert!(layout.is_valid(usize::MAX));
        let fragments = ReedSolomonSimd.encode(&layout, &value).unwrap();
        assert_eq!(fragments.len(), n);
        assert!(fragments.iter().all(|f| f.len() == layout.fragment_len()));
        let need = layout.needed();
        // Every subset of exactly `need` fragments rebuilds the value.
        for mask in 0u32..(1 << n) {
            if mask.count_ones() as usize != need {
                continue;
            }
            let chosen: Vec<(usize, Bytes)> = (0..n)
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| (i, fragments[i].clone()))
                .collect();
            assert_eq!(
                ReedSolomonSimd.decode(&layout, &chosen).unwrap().as_ref(),
                &value[..]
            );
            // And the whole codeword: the first fragments, then the rest computed from them.
            let originals = ReedSolomonSimd.originals(&layout, &chosen).unwrap();
            let recovery = ReedSolomonSimd.recovery(&layout, &originals).unwrap();
            let codeword: Vec<Bytes> = originals.into_iter().chain(recovery).collect();
            assert_eq!(codeword, fragments);
        }
        let too_few: Vec<(usize, Bytes)> =
            (0..need - 1).map(|i| (i, fragments[i].clone())).collect();
        assert!(ReedSolomonSimd.decode(&layout, &too_few).is_err());
    }

    #[test]
    fn every_k_subset_rebuilds() {
        for f in 1..=3 {
            for len in [0, 1, 100, 4096, 4097, 10_001, 65_536] {
                roundtrip_from_every_subset(len, f);
            }
        }
    }

    #[test]
    fn remembered_locators_rebuild_what_fresh_ones_do() {
        // f = 2: 34 ways to miss a data fragment among 3 of 7, more than are remembered, so some
        // are forgotten and evaluated again. Each decoded twice, the second time from memory.
        let layout = Layout::for_value(50_000, 7, 2);
        let value: Vec<u8> = (0..50_000).map(|i| (i * 13 + 5) as u8).collect();
        let fragments = ReedSolomonSimd.encode(&layout, &value).unwrap();
        for _ in 0..2 {
            for mask in 0u32..(1 << 7) {
                if mask.count_ones() != 3 || mask & 0b111 == 0b111 {
                    continue;
                }
                let chosen: Vec<(usize, Bytes)> = (0..7)
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| (i, fragments[i].clone()))
                    .collect();
                let rebuilt = ReedSolomonSimd.decode(&layout, &chosen).unwrap();
                assert!(rebuilt.as_ref() == &value[..], "mask {mask:07b}");
            }
        }
        let known = LOCATORS.lock().unwrap().len();
        assert!(known > 0 && known <= LOCATORS_MAX, "{known}");
    }

    #[test]
    fn fragments_of_wrong_size_or_index_are_not_counted() {
        let layout = Layout::for_value(10_000, 4, 1);
        let fragments = ReedSolomonSimd.encode(&layout, &vec![1u8; 10_000]).unwrap();
        let bad = vec![(0, fragments[0].slice(1..)), (9, fragments[1].clone())];
        assert_eq!(
            ReedSolomonSimd.decode(&layout, &bad),
            Err(DecodeError::TooFew { have: 0, need: 2 })
        );
    }

    proptest! {
        #[test]
        fn any_value_roundtrips_through_parity(value in proptest::collection::vec(any::<u8>(), 0..20_000)) {
            let layout = Layout::for_value(value.len(), 4, 1);
            let fragments = ReedSolomonSimd.encode(&layout, &value).unwrap();
            let parity_only = vec![(2, fragments[2].clone()), (3, fragments[3].clone())];
            let need_parity = matches!(layout.scheme, Scheme::ReedSolomon { .. });
            let chosen = if need_parity { parity_only } else { vec![(3, fragments[3].clone())] };
            let rebuilt = ReedSolomonSimd.decode(&layout, &chosen).unwrap();
            prop_assert_eq!(rebuilt.as_ref(), &value[..]);
        }
    }
}
