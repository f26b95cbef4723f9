//! The balancers other pipeline systems use, reimplemented for comparison with [`super::optimal`].
//!
//! Each returns stage boundaries (`S + 1` layer indices from `0` to `L`); evaluate them with
//! [`super::Problem::evaluate`]. They reproduce the behaviour of the originals, including their
//! non-optimal answers:
//!
//! - [`uniform`]: equal layer counts, the remainder going to the first stages.
//! - [`deepspeed_balanced`]: DeepSpeed's `partition_balanced` (its default `parameters` method feeds it
//!   parameter counts): a dynamic programme over prefixes that keeps, for each prefix and stage count,
//!   the split with the smallest *max minus min* stage weight, ties going to the later split point.
//!   Max minus min does not decompose over prefixes, so the programme is a heuristic even for its own
//!   objective, and it does not minimise the largest stage: `[77,56,10,8,4,9,88,1,3,1,10]` into 4 gives
//!   a largest stage of 103 where 88 is possible.
//! - [`time_greedy`]: torchgpipe's `balance_by_time`, i.e. its `blockpartition.solve`: the block
//!   partition local search of Bárány et al. on costs normalised to `[0, 1]` by `(x - min) / (max -
//!   min)`, stopping once the largest block is within 1 of the smallest (in normalised units):
//!   `[81,99,98,67,67,96,57]` into 4 gives 287 where 180 is possible.

use super::Partition;
use crate::cost::split_even;

/// Equal layer counts ([`crate::cost::split_even`]: `L / S` each, the first `L % S` stages one more).
///
/// When `L < S` there is no valid split; the result then has `min(L, S)` one-layer stages and
/// empty ones after (the callers check `L >= S` first).
pub fn uniform(layers: usize, stages: usize) -> Vec<usize> {
    let counts = split_even(layers, stages)
        .unwrap_or_else(|_| (0..stages).map(|s| usize::from(s < layers)).collect());
    Partition::boundaries_from_counts(&counts)
}

/// DeepSpeed's `partition_balanced`: minimise `max - min` of stage weights over prefixes, keeping
/// one (max, min) pair per state; `>=` comparisons, so ties take the latest split point. When there
/// are no more layers than stages it falls back to one layer per stage (DeepSpeed's uniform case).
pub fn deepspeed_balanced(weights: &[u64], stages: usize) -> Vec<usize> {
    let n = weights.len();
    if n <= stages {
        return uniform(n, stages);
    }
    // Weights as f64 so that the "infinite" states behave as in the original's numpy arrays.
    let mut prefix = vec![0.0f64; n + 1];
    for (i, w) in weights.iter().enumerate() {
        prefix[i + 1] = prefix[i] + *w as f64;
    }
    let inf = f64::INFINITY;
    let mut dp_max = vec![vec![inf; stages + 1]; n + 1];
    let mut dp_min = vec![vec![inf; stages + 1]; n + 1];
    let mut dp_cost = vec![vec![inf; stages + 1]; n + 1];
    let mut position = vec![vec![0usize; stages + 1]; n + 1];
    dp_max[0][0] = 0.0;
    dp_cost[0][0] = 0.0;
    for i in 1..=n {
        for j in 1..=i.min(stages) {
            for k in 0..i {
                let seg = prefix[i] - prefix[k];
                let max_sum = dp_max[k][j - 1].max(seg);
                let min_sum = dp_min[k][j - 1].min(seg);
                let cost = max_sum - min_sum;
                if dp_cost[i][j] >= cost {
                    dp_cost[i][j] = cost;
                    dp_max[i][j] = max_sum;
                    dp_min[i][j] = min_sum;
                    position[i][j] = k;
                }
            }
        }
    }
    let mut parts = vec![n];
    for j in (1..=stages).rev() {
        let last = parts[parts.len() - 1];
        parts.push(position[last][j]);
    }
    parts.reverse();
    parts
}

/// torchgpipe's `blockpartition.solve` on per-layer times (what `balance_by_time` does).
///
/// Starts from `L / S` layers per block (the last block takes the rest), then repeatedly takes a
/// largest block `p` (ties: the last one) and a smallest block `q` (ties: the first one) and moves one
/// layer from the neighbour of `q` on `p`'s side into `q`, until the largest normalised block sum is
/// within 1 of the smallest. Two guards the original lacks, so the result is always a valid split:
/// it stops if a move would empty a block, and after `16 L S` moves.
pub fn time_greedy(times: &[u64], stages: usize) -> Vec<usize> {
    let n = times.len();
    if stages == 0 || n < stages {
        return uniform(n, stages);
    }
    let lo = times.iter().copied().min().unwrap_or(0) as f64;
    let span = times.iter().copied().max().unwrap_or(0) as f64 - lo;
    let normal: Vec<f64> = times
        .iter()
        .map(|&t| {
            if span == 0.0 {
                0.0
            } else {
                (t as f64 - lo) / span
            }
        })
        .collect();
    // splits[i] is the end of block i.
    let mut splits: Vec<usize> = (0..stages - 1).map(|x| n / stages * (x + 1)).collect();
    splits.push(n);
    let block = |splits: &[usize], i: usize| -> f64 {
        let start = if i > 0 { splits[i - 1] } else { 0 };
        normal[start..splits[i]].iter().sum()
    };
    let extreme = |splits: &[usize], want_max: bool| -> (f64, usize) {
        let mut best = (block(splits, 0), 0);
        for i in 1..stages {
            let v = block(splits, i);
            // Python's max over (size, index) tuples prefers the later index on ties; min the earlier.
            if (want_max && v >= best.0) || (!want_max && v < best.0) {
                best = (v, i);
            }
        }
        best
    };
    let size = |splits: &[usize], i: usize| splits[i] - if i > 0 { splits[i - 1] } else { 0 };
    let mut moves = 0usize;
    let budget = 16 * n * stages;
    'outer: loop {
        let (max_size, p) = extreme(&splits, true);
        loop {
            let (min_size, q) = extreme(&splits, false);
            if max_size <= min_size + 1.0 || moves >= budget {
                break 'outer;
            }
            let h = if p < q { q - 1 } else { q + 1 };
            if size(&splits, h) <= 1 {
                break 'outer;
            }
            if p < q {
                splits[h] -= 1;
            } else {
                splits[q] += 1;
            }
            moves += 1;
            if p == h {
                break;
            }
        }
    }
    let mut b = Vec::with_capacity(stages + 1);
    b.push(0);
    b.extend(splits);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums(w: &[u64], b: &[usize]) -> Vec<u64> {
        b.windows(2).map(|x| w[x[0]..x[1]].iter().sum()).collect()
    }

    #[test]
    fn uniform_gives_remainder_to_last_stages() {
        assert_eq!(uniform(10, 4), vec![0, 3, 6, 8, 10]);
        assert_eq!(uniform(8, 4), vec![0, 2, 4, 6, 8]);
    }

    #[test]
    fn deepspeed_reproduces_its_published_split() {
        let w = [77, 56, 10, 8, 4, 9, 88, 1, 3, 1, 10];
        let b = deepspeed_balanced(&w, 4);
        assert_eq!(b, vec![0, 1, 2, 6, 11]);
        assert_eq!(sums(&w, &b), vec![77, 56, 31, 103]);
    }

    #[test]
    fn torchgpipe_reproduces_its_split() {
        let w = [81, 99, 98, 67, 67, 96, 57];
        let b = time_greedy(&w, 4);
        assert_eq!(b, vec![0, 1, 2, 3, 7]);
        assert_eq!(sums(&w, &b), vec![81, 99, 98, 287]);
        let w2 = [77, 56, 10, 8, 4, 9, 88, 1, 3, 1, 10];
        assert_eq!(sums(&w2, &time_greedy(&w2, 4)), vec![77, 66, 21, 103]);
    }

    #[test]
    fn time_greedy_always_valid() {
        for n in 1..12u64 {
            let w: Vec<u64> = (0..n).map(|i| (i * 37 + 11) % 23).collect();
            for s in 1..=n as usize {
                let b = time_greedy(&w, s);
                assert_eq!(b.len(), s + 1);
                assert!(b.windows(2).all(|x| x[0] < x[1]), "{w:?} {s} {b:?}");
                assert_eq!(*b.last().unwrap(), n as usize);
            }
        }
    }
}
