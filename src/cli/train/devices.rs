//! `pipefill train --backend cuda --devices one|per-rank|auto`: which GPU each rank runs on.
//!
//! `one`: every rank on GPU 0 (the ranks' streams share its SMs: kernel-level overlap, a research
//! use; the candidates are ranked by the shared-device simulation). `per-rank`: rank `r` on GPU
//! `r mod count` (payloads crossing GPUs are peer-copied; the candidates are ranked by the
//! per-rank simulation, independent devices). `auto` (the default): `per-rank` when the machine has
//! at least two GPUs and the run has at least two ranks, else `one`. `--graph` works with both: a
//! captured step across GPUs holds every GPU's kernels and the peer copies in one graph
//! (`cuda/src/streams/graph.rs`; not yet run on a machine with two GPUs).

use serde_json::json;

/// `--devices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DevicesFlag {
    /// Every rank on GPU 0.
    One,
    /// Rank r on GPU r mod (GPUs on the machine); needs at least two GPUs.
    PerRank,
    /// per-rank when the machine has two GPUs or more (and the run two ranks or more), else one.
    #[default]
    Auto,
}

impl DevicesFlag {
    /// The flag's value as typed.
    pub fn name(self) -> &'static str {
        match self {
            DevicesFlag::One => "one",
            DevicesFlag::PerRank => "per-rank",
            DevicesFlag::Auto => "auto",
        }
    }
}

/// The devices a CUDA run uses, resolved from `--devices` and the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceChoice {
    /// What was asked.
    pub asked: DevicesFlag,
    /// Whether each rank has its own GPU (`per-rank`) rather than all sharing GPU 0 (`one`).
    pub per_rank: bool,
    /// GPUs on the machine.
    pub available: usize,
    /// The GPU ordinal of each rank.
    pub rank_gpus: Vec<usize>,
}

impl DeviceChoice {
    /// Resolves `flag` for `ranks` ranks on a machine with `available` GPUs. The error is a
    /// usage message naming the flag and the fix.
    pub fn resolve(flag: DevicesFlag, ranks: usize, available: usize) -> Result<Self, String> {
        let per_rank = match flag {
            DevicesFlag::One => false,
            DevicesFlag::PerRank if available < 2 => {
                return Err(format!(
                    "--devices per-rank: this machine has {available} GPU(s), and one GPU per \
                     rank needs at least 2: give --devices one (every rank on GPU 0) or auto"
                ))
            }
            DevicesFlag::PerRank => true,
            DevicesFlag::Auto => available >= 2 && ranks >= 2,
        };
        let rank_gpus = (0..ranks)
            .map(|r| if per_rank { r % available } else { 0 })
            .collect();
        Ok(DeviceChoice {
            asked: flag,
            per_rank,
            available,
            rank_gpus,
        })
    }

    /// Whether every rank sits on one GPU.
    pub fn shared(&self) -> bool {
        self.gpus_used() <= 1
    }

    /// GPUs this run uses (ordinals `0..gpus_used()`).
    pub fn gpus_used(&self) -> usize {
        self.rank_gpus.iter().max().map_or(1, |m| m + 1)
    }

    /// `one` or `per-rank`.
    pub fn mode(&self) -> &'static str {
        if self.per_rank {
            "per-rank"
        } else {
            "one"
        }
    }

    /// The line printed when the run starts, e.g. `--devices auto: per-rank (4 ranks on 2 GPUs:
    /// rank r on GPU r mod 2)`.
    pub fn describe(&self) -> String {
        let ranks = self.rank_gpus.len();
        let what = if self.per_rank {
            format!(
                "per-rank ({ranks} ranks on {} GPUs: rank r on GPU r mod {}; crossing payloads \
                 are peer-copied)",
                self.gpus_used(),
                self.available
            )
        } else {
            format!(
                "one (all {ranks} ranks on GPU 0, their streams sharing it; the machine has {} \
                 GPU(s))",
                self.available
            )
        };
        format!("--devices {}: {what}", self.asked.name())
    }

    /// The `devices` object of `--format json`.
    pub fn json(&self) -> serde_json::Value {
        json!({
            "asked": self.asked.name(),
            "mode": self.mode(),
            "gpus_available": self.available,
            "gpus_used": self.gpus_used(),
            "rank_gpu": self.rank_gpus,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{DeviceChoice, DevicesFlag};

    #[test]
    fn auto_takes_one_gpu_per_rank_only_with_two_gpus_or_more() {
        let one = DeviceChoice::resolve(DevicesFlag::Auto, 4, 1).unwrap();
        assert!(!one.per_rank && one.shared());
        assert_eq!(one.rank_gpus, vec![0; 4]);
        let two = DeviceChoice::resolve(DevicesFlag::Auto, 4, 2).unwrap();
        assert!(two.per_rank && !two.shared());
        assert_eq!(two.rank_gpus, vec![0, 1, 0, 1]);
        assert_eq!(two.gpus_used(), 2);
        let eight = DeviceChoice::resolve(DevicesFlag::Auto, 3, 8).unwrap();
        assert_eq!(
            (eight.rank_gpus.clone(), eight.gpus_used()),
            (vec![0, 1, 2], 3)
        );
        // One rank: one GPU.
        assert!(
            !DeviceChoice::resolve(DevicesFlag::Auto, 1, 2)
                .unwrap()
                .per_rank
        );
        assert!(DeviceChoice::resolve(DevicesFlag::Auto, 4, 2)
            .unwrap()
            .describe()
            .starts_with("--devices auto: per-rank"));
    }

    #[test]
    fn per_rank_needs_two_gpus() {
        let e = DeviceChoice::resolve(DevicesFlag::PerRank, 2, 1).unwrap_err();
        assert!(e.contains("--devices one"), "{e}");
        let two = DeviceChoice::resolve(DevicesFlag::PerRank, 2, 2).unwrap();
        assert_eq!(two.rank_gpus, vec![0, 1]);
        let one = DeviceChoice::resolve(DevicesFlag::One, 4, 4).unwrap();
        assert!(one.shared());
        assert_eq!(one.json()["mode"], "one");
    }
}
