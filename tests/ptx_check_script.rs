//! Keeps `scripts/gpu/ptx_check.py` (the CuPy check of the PTX that runs on the GPU machine, where there
//! is no Rust) in step with the Rust launch math:
//!
//! - every launch configuration `--print-launches` prints for a tensor-core check (grid, block, dynamic
//!   shared bytes, entry) equals [`launch`] and [`entry_name`] for the same product, precision and shape;
//!   every product and precision is covered by at least two shapes; the script's maximum equals
//!   [`MAX_SHARED_BYTES`]; its SIMT grids equal [`gemm_grid`] and [`elementwise_grid`];
//! - without CuPy (or a GPU), `--module /nonexistent` exits 3 with a `NOT VERIFIED: <why>` line.
//!
//! `--print-launches` needs only `python3` (no NumPy); without `python3` each test prints
//! `skipped: <why>` and passes.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

use pipefill::ptx::tensor_core::{entry_name, launch, Precision, Product, MAX_SHARED_BYTES};
use pipefill_kernels::{elementwise_grid, gemm_grid, THREADS};
use serde_json::Value;

/// Runs the script with `args`, or `None` (after printing `skipped: ...`) when `python3` cannot start.
fn run_script(args: &[&str]) -> Option<Output> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu/ptx_check.py");
    match Command::new("python3").arg(&script).args(args).output() {
        Ok(out) => Some(out),
        Err(e) => {
            println!("skipped: python3 could not be started ({e})");
            None
        }
    }
}

fn int(v: &Value, key: &str) -> usize {
    let n = v[key].as_u64();
    n.unwrap_or_else(|| panic!("{key} is not an unsigned integer in {v}")) as usize
}

fn triple(v: &Value, key: &str) -> (u32, u32, u32) {
    let d: Vec<u32> = v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} is not an array in {v}"))
        .iter()
        .map(|x| x.as_u64().expect("a dimension") as u32)
        .collect();
    assert_eq!(d.len(), 3, "{key} of {v}");
    (d[0], d[1], d[2])
}

#[test]
fn printed_launches_equal_the_rust_launch_math() {
    let Some(out) = run_script(&["--print-launches"]) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "--print-launches failed: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("--print-launches prints JSON");
    assert_eq!(int(&v, "threads"), THREADS);
    assert_eq!(int(&v, "max_shared_bytes"), MAX_SHARED_BYTES);
    let mut shapes: HashMap<(Product, Precision), usize> = HashMap::new();
    for l in v["tensor_core"].as_array().expect("tensor_core") {
        let product = match l["product"].as_str() {
            Some("Forward") => Product::Forward,
            Some("BackwardInput") => Product::BackwardInput,
            Some("BackwardWeight") => Product::BackwardWeight,
            _ => panic!("unknown product in {l}"),
        };
        let precision = match l["precision"].as_str() {
            Some("Tf32") => Precision::Tf32,
            Some("Bf16") => Precision::Bf16,
            _ => panic!("unknown precision in {l}"),
        };
        let (rows, inputs, outputs) = (int(l, "rows"), int(l, "inputs"), int(l, "outputs"));
        let want = launch(product, precision, rows, inputs, outputs);
        let got = (
            triple(l, "grid"),
            triple(l, "block"),
            int(l, "shared_bytes") as u32,
        );
        assert_eq!(got, (want.grid, want.block, want.shared_bytes), "{l}");
        assert_eq!(l["entry"].as_str(), Some(entry_name(product, precision)));
        *shapes.entry((product, precision)).or_default() += 1;
    }
    assert_eq!(shapes.len(), 6, "every product in both precisions");
    assert!(shapes.values().all(|&n| n >= 2), "two shapes each");
    let simt = v["simt"].as_array().expect("simt");
    assert!(!simt.is_empty());
    for l in simt {
        let want = match l["kind"].as_str() {
            Some("gemm") => gemm_grid(int(l, "m"), int(l, "n")),
            Some("elementwise") => elementwise_grid(int(l, "n")),
            _ => panic!("unknown kind in {l}"),
        };
        assert_eq!(triple(l, "grid"), want, "{l}");
        assert_eq!(triple(l, "block"), (THREADS as u32, 1, 1), "{l}");
        assert_eq!(int(l, "shared_bytes"), 0, "{l}");
    }
}

#[test]
fn without_cupy_the_check_is_not_verified() {
    let Some(out) = run_script(&["--module", "/nonexistent"]) else {
        return;
    };
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    match out.status.code() {
        Some(3) => {
            assert!(
                stdout.lines().any(|l| l.starts_with("NOT VERIFIED: ")),
                "exit 3 without a NOT VERIFIED line: {stdout}"
            );
            assert!(!stdout.contains("MISMATCH"), "{stdout}");
            println!("{}", stdout.trim());
        }
        // CuPy and a GPU are here after all: then the missing module must fail the run.
        Some(1) if stdout.contains("cannot load module /nonexistent") => {
            println!("note: CuPy and a GPU are present; the missing module failed the run")
        }
        code => panic!("exit {code:?}\nstdout: {stdout}\nstderr: {stderr}"),
    }
}
