//! [`KeyMap`]: the hash map a rank keeps its per-step state in (stashes by stage and microbatch,
//! the mailbox and the outbox by edge), with a hasher made for those keys.
//!
//! The keys are a few small integers (a stage, a microbatch, a flow), produced by the rank's own
//! schedule, not chosen by a network peer: the standard library's SipHash, which resists keys
//! chosen to collide, costs more than the rest of an action's bookkeeping. [`SmallKeyHasher`] mixes
//! each integer into the state with a rotate, an xor and a multiply by an odd constant (the scheme
//! of rustc's `FxHasher`, written here), so a key of two or three integers hashes in a handful of
//! instructions. Keys come from a schedule that validated, so their values are bounded by `S` and
//! `M`; a schedule file crafted to collide could at worst slow its own step.
//!
//! Measured with `cargo bench --bench instructions -- executor` (docs/measurements.md, "Executor
//! instructions per action").

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hash map keyed by small integers (see the [module docs](self)).
pub(crate) type KeyMap<K, V> = HashMap<K, V, BuildHasherDefault<SmallKeyHasher>>;

/// The multiplier: an odd 64-bit constant with well-spread bits (the golden ratio's, as in
/// rustc's `FxHasher`).
const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// A hasher for keys of a few integers: each word is folded in as
/// `state = (state.rotate_left(5) ^ word) * SEED`.
#[derive(Default, Clone, Copy)]
pub(crate) struct SmallKeyHasher {
    state: u64,
}

impl SmallKeyHasher {
    #[inline(always)]
    fn add(&mut self, word: u64) {
        self.state = (self.state.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for SmallKeyHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline(always)]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline(always)]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline(always)]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline(always)]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline(always)]
    fn write_isize(&mut self, i: isize) {
        self.add(i as u64);
    }

    #[inline(always)]
    fn finish(&self) -> u64 {
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::{BuildHasher, Hash};

    fn hash<K: Hash>(k: &K) -> u64 {
        BuildHasherDefault::<SmallKeyHasher>::default().hash_one(k)
    }

    #[test]
    fn distinct_small_keys_hash_apart_and_the_map_finds_them() {
        // Every (stage, microbatch) pair of a large step hashes to its own value, and the low bits
        // the table indexes with are spread (no bucket gets more than a few keys).
        let keys: Vec<(usize, usize)> = (0..64)
            .flat_map(|s| (0..512).map(move |m| (s, m)))
            .collect();
        let hashes: HashSet<u64> = keys.iter().map(hash).collect();
        assert_eq!(hashes.len(), keys.len());
        // hashbrown indexes with the low bits and tags with the top seven: both must spread.
        for bits in [|h: u64| (h & 0xffff) as usize, |h: u64| (h >> 48) as usize] {
            let mut buckets = vec![0u32; 1 << 16];
            for k in &keys {
                buckets[bits(hash(k))] += 1;
            }
            assert!(
                buckets.iter().all(|&n| n <= 8),
                "{:?}",
                buckets.iter().max()
            );
        }
        let mut map: KeyMap<(usize, usize), usize> = KeyMap::default();
        for (i, k) in keys.iter().enumerate() {
            map.insert(*k, i);
        }
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(map.remove(k), Some(i));
        }
        assert!(map.is_empty());
    }

    #[test]
    fn byte_writes_fold_every_byte() {
        let mut a = SmallKeyHasher::default();
        a.write(b"0123456789");
        let mut b = SmallKeyHasher::default();
        b.write(b"0123456788");
        assert_ne!(a.finish(), b.finish());
    }
}
