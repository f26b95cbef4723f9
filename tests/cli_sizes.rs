//! Sizes are checked against memory before anything is allocated: `train` and `profile` refuse a
//! model, batch or rank count that cannot fit with exit code 2, the flags, the estimate, the memory
//! available and the fix (instead of aborting on a failed allocation), and run sizes that fit.

mod common;
use common::{assert_refused, pipefill, scratch};

#[test]
fn a_hidden_width_of_a_hundred_million_is_refused_with_the_numbers() {
    // 7 hidden layers of 1e8 x 1e8 weights: 2.8e17 bytes of weights alone, above 1 PiB.
    let (code, out, err) = pipefill(&["train", "--hidden", "100000000"]);
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty(), "{out}");
    for needle in [
        "--hidden 100000000",
        "needs an estimated",
        "weights 248.7 PiB (280000009200000064 B)",
        "optimizer state",
        "activations",
        "above the 1.0 PiB",
        "fix: shrink --hidden or --layers",
    ] {
        assert!(err.contains(needle), "expected `{needle}` in: {err}");
    }
    assert_eq!(err.lines().count(), 1, "one message: {err}");
}

#[test]
fn every_size_flag_is_checked_before_allocating() {
    assert_refused([
        (
            vec!["profile", "--hidden", "100000000", "--out", "never.json"],
            "fix: shrink --hidden or --layers",
        ),
        // 1e13 rows of activations.
        (
            vec!["train", "--batch", "10000000000000", "--microbatches", "1"],
            "fix: shrink --batch, or --hidden or --layers",
        ),
        (
            vec![
                "profile",
                "--hidden",
                "8",
                "--sizes",
                "10000000000000",
                "--out",
                "never.json",
            ],
            "fix: shrink --batch or --sizes",
        ),
        // 600 million ranks: their threads' stacks alone are 1.1 PiB.
        (vec!["train", "--ranks", "600000000"], "give fewer --ranks"),
        // 2e12 layers: 2 PiB of bookkeeping, refused before the list of layers is built.
        (
            vec!["train", "--layers", "2000000000000", "--hidden", "1"],
            "--layers 2000000000000: the run needs an estimated",
        ),
        // Products that overflow 64 bits.
        (
            vec!["train", "--hidden", "18446744073709551615"],
            "overflow a 64-bit byte count",
        ),
    ]);
}

#[test]
fn a_model_file_too_large_is_refused_naming_the_file() {
    let dir = scratch("cli-sizes");
    let path = dir.join("huge.toml");
    std::fs::write(
        &path,
        "input = 4\n[[layers]]\nwidth = 1000000000000\n[[layers]]\nwidth = 2\n",
    )
    .unwrap();
    let (code, _, err) = pipefill(&["train", "--model", path.to_str().unwrap(), "--ranks", "1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("huge.toml"), "{err}");
    assert!(
        err.contains("shrink --batch, or the layer widths or count in the --model file"),
        "{err}"
    );
}

#[test]
fn a_size_that_fits_is_not_refused() {
    // 2 layers of width 2048: 16 MiB of weights and gradients, far below any machine's memory.
    let out = scratch("cli-sizes-fit").join("costs.json");
    let (code, _, err) = pipefill(&[
        "profile",
        "--hidden",
        "2048",
        "--layers",
        "2",
        "--batch",
        "8",
        "--microbatches",
        "1",
        "--sizes",
        "none",
        "--fit-rows",
        "0",
        "--warmup",
        "0",
        "--repeats",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.is_file());
}

#[test]
fn data_parallel_replicas_count_in_the_memory_estimate() {
    // 8 layers 8192 wide with AdamW: about 8.6 GB for one copy of the model, 64 copies about
    // 550 GB: refused up front, naming the replicas (before, the estimate held one copy).
    let (code, out, err) = pipefill(&[
        "train",
        "--hidden",
        "8192",
        "--data-parallel",
        "64",
        "--steps",
        "1",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--data-parallel 64"), "{err}");
    assert!(out.is_empty(), "{out}");
}
