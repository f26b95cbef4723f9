//! The tensor-core kernels against cuBLAS and cuBLASLt (issue #12): each product of a linear layer at
//! square sizes and at the built-in model's shapes, time per call (CUDA events around back-to-back
//! launches, criterion's `iter_custom`) and TFLOP/s (`2 m n k / t`), for
//!
//! - the Rust kernels: `pf simt fp32` (the tiled SIMT kernels), `pf tf32`, `pf bf16` (tensor cores;
//!   fused epilogues: the forward adds the bias and applies GELU without storing `Z`, the input
//!   gradient computes and stores `dZ = dY gelu'(Z)`, the weight gradient also sums `db`);
//! - cuBLAS SGEMM (`cublas fp32`) and SGEMM in TF32 math mode (`cublas tf32`), GEMM only, and each
//!   followed by the separate activation kernel (`+ act`: `pf_activation_forward` after the forward
//!   GEMM, which adds no bias; `pf_activation_backward` before the input-gradient GEMM);
//! - cuBLASLt with the fused GELU + bias epilogue, TF32 and BF16 (`cublaslt tf32/bf16 gelu+bias`).
//!
//! After criterion it prints a table and the issue's ratios (speed of the Rust kernel over the other,
//! above 1 when the Rust kernel is faster): fused forward vs cuBLASLt fused in the same precision
//! (aim: at least 0.9 at 4096) and vs GEMM + separate activation (aim: above 1); fused input
//! gradient vs GEMM + separate `act'` (aim: above 1).
//!
//! `PIPEFILL_KERNELS_SIZES` picks the shapes: comma-separated square sizes and `model` (default
//! `1024,2048,4096,8192,model`). Without a GPU it prints `skipped: no CUDA device (set
//! PIPEFILL_REQUIRE_GPU=1 to fail instead)` and exits 0. cuBLAS rows are left out (said once) when
//! libcublas / libcublasLt cannot be loaded. cudarc's cuBLASLt call builds its descriptors and asks
//! for a heuristic on every call: at small sizes that host work may be what its time shows.
//!
//! ```sh
//! cargo bench --bench kernels
//! ```

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use pipefill::cuda::timing::{mark, Span};
use pipefill::cuda::{gpu_or_skip, Gpu, Launcher, LinearDims};
use pipefill_kernels::Activation;

#[allow(dead_code)]
#[path = "support/mod.rs"]
mod support;

#[path = "kernels/blas.rs"]
mod blas;
#[path = "kernels/bufs.rs"]
mod bufs;

use blas::{Blas, Gemm3};
use bufs::Bufs;

/// Regression threshold of the criterion medians (kernel times on one GPU are steady; a guess until
/// measured).
const THRESHOLD: f64 = 0.10;

/// One implementation of a product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Imp {
    PfSimt,
    PfTf32,
    PfBf16,
    CublasFp32,
    CublasTf32,
    CublasFp32Act,
    CublasTf32Act,
    LtTf32,
    LtBf16,
}

impl Imp {
    fn name(self) -> &'static str {
        match self {
            Imp::PfSimt => "pf simt fp32",
            Imp::PfTf32 => "pf tf32",
            Imp::PfBf16 => "pf bf16",
            Imp::CublasFp32 => "cublas fp32",
            Imp::CublasTf32 => "cublas tf32",
            Imp::CublasFp32Act => "cublas fp32 + act",
            Imp::CublasTf32Act => "cublas tf32 + act",
            Imp::LtTf32 => "cublaslt tf32 gelu+bias",
            Imp::LtBf16 => "cublaslt bf16 gelu+bias",
        }
    }

    fn needs_blas(self) -> bool {
        !matches!(self, Imp::PfSimt | Imp::PfTf32 | Imp::PfBf16)
    }

    /// The implementations of `g` (cuBLASLt's fused epilogue exists for the forward only; the weight
    /// gradient has no activation).
    fn of(g: Gemm3) -> &'static [Imp] {
        use Imp::*;
        match g {
            Gemm3::Forward => &[
                PfSimt,
                PfTf32,
                PfBf16,
                CublasFp32,
                CublasTf32,
                CublasFp32Act,
                CublasTf32Act,
                LtTf32,
                LtBf16,
            ],
            Gemm3::InputGrad => &[
                PfSimt,
                PfTf32,
                PfBf16,
                CublasFp32,
                CublasTf32,
                CublasFp32Act,
                CublasTf32Act,
            ],
            Gemm3::WeightGrad => &[PfSimt, PfTf32, PfBf16, CublasFp32, CublasTf32],
        }
    }
}

fn product_name(g: Gemm3) -> &'static str {
    match g {
        Gemm3::Forward => "forward XW+b gelu",
        Gemm3::InputGrad => "input-grad dZ W^T",
        Gemm3::WeightGrad => "weight-grad X^T dZ",
    }
}

/// Everything one shape's launches need.
struct Ctx {
    la: Launcher,
    blas: Option<Blas>,
    bufs: Bufs,
    shape: (usize, usize, usize),
}

impl Ctx {
    fn dims(&self, act: Activation) -> LinearDims {
        let (rows, inputs, outputs) = self.shape;
        LinearDims {
            rows,
            inputs,
            outputs,
            act,
        }
    }
}

/// The cuBLAS handles, when loaded.
fn handles(blas: &Option<Blas>) -> Result<&Blas, String> {
    blas.as_ref().ok_or_else(|| "cuBLAS not loaded".to_string())
}

/// Enqueues one call of `imp` computing `g` on `c`'s buffers.
fn enqueue(c: &mut Ctx, g: Gemm3, imp: Imp) -> Result<(), String> {
    match g {
        Gemm3::Forward => forward(c, imp),
        Gemm3::InputGrad => input_grad(c, imp),
        Gemm3::WeightGrad => weight_grad(c, imp),
    }
}

fn forward(c: &mut Ctx, imp: Imp) -> Result<(), String> {
    let d = c.dims(Activation::Gelu);
    let s = |e: pipefill::cuda::CudaError| e.to_string();
    let b = &mut c.bufs;
    let (la, shape) = (&c.la, c.shape);
    match imp {
        Imp::PfSimt => la
            .linear_forward(&b.x, &b.w, &b.b, &mut b.y, None, d)
            .map_err(s),
        Imp::PfTf32 => la
            .linear_forward_tc(&b.x, &b.w, &b.b, &mut b.y, None, d)
            .map_err(s),
        Imp::PfBf16 => la
            .linear_forward_tc(&b.x16, &b.w16, &b.b, &mut b.y16, None, d)
            .map_err(s),
        Imp::CublasFp32 | Imp::CublasTf32 | Imp::CublasFp32Act | Imp::CublasTf32Act => {
            let bl = handles(&c.blas)?;
            let h = if matches!(imp, Imp::CublasFp32 | Imp::CublasFp32Act) {
                &bl.exact
            } else {
                &bl.tf32
            };
            blas::sgemm(h, Gemm3::Forward, shape, &b.x, &b.w, &mut b.z, 0.0)?;
            if matches!(imp, Imp::CublasFp32Act | Imp::CublasTf32Act) {
                la.activation_forward(&b.z, &mut b.y, Activation::Gelu)
                    .map_err(s)?;
            }
            Ok(())
        }
        Imp::LtTf32 => blas::lt_gelu_tf32(&handles(&c.blas)?.lt, shape, &b.x, &b.w, &b.b, &mut b.y),
        Imp::LtBf16 => {
            blas::lt_gelu_bf16(&handles(&c.blas)?.lt, shape, &b.xh, &b.wh, &b.bh, &mut b.yh)
        }
    }
}

fn input_grad(c: &mut Ctx, imp: Imp) -> Result<(), String> {
    let d = c.dims(Activation::Gelu);
    let s = |e: pipefill::cuda::CudaError| e.to_string();
    let b = &mut c.bufs;
    let (la, shape) = (&c.la, c.shape);
    match imp {
        Imp::PfSimt => la
            .linear_backward_input(&b.dy, Some(&b.z), &b.w, &mut b.dx, Some(&mut b.dz), d)
            .map_err(s),
        Imp::PfTf32 => la
            .linear_backward_input_tc(&b.dy, Some(&b.z), &b.w, &mut b.dx, Some(&mut b.dz), d)
            .map_err(s),
        Imp::PfBf16 => la
            .linear_backward_input_tc(
                &b.dy16,
                Some(&b.z16),
                &b.w16,
                &mut b.dx16,
                Some(&mut b.dz16),
                d,
            )
            .map_err(s),
        _ => {
            let bl = handles(&c.blas)?;
            let h = if matches!(imp, Imp::CublasFp32 | Imp::CublasFp32Act) {
                &bl.exact
            } else {
                &bl.tf32
            };
            if matches!(imp, Imp::CublasFp32Act | Imp::CublasTf32Act) {
                la.activation_backward(&b.dy, &b.z, &mut b.dz, Activation::Gelu)
                    .map_err(s)?;
            }
            blas::sgemm(h, Gemm3::InputGrad, shape, &b.dz, &b.w, &mut b.dx, 0.0)
        }
    }
}

fn weight_grad(c: &mut Ctx, imp: Imp) -> Result<(), String> {
    let d = c.dims(Activation::Identity);
    let s = |e: pipefill::cuda::CudaError| e.to_string();
    let b = &mut c.bufs;
    let (la, shape) = (&c.la, c.shape);
    match imp {
        Imp::PfSimt => la
            .linear_backward_weight(&b.x, &b.dy, &mut b.dw, Some(&mut b.db), d)
            .map_err(s),
        Imp::PfTf32 => la
            .linear_backward_weight_tc(&b.x, &b.dy, &mut b.dw, Some(&mut b.db), d)
            .map_err(s),
        Imp::PfBf16 => la
            .linear_backward_weight_tc(&b.x16, &b.dy16, &mut b.dw, Some(&mut b.db), d)
            .map_err(s),
        _ => {
            let bl = handles(&c.blas)?;
            let h = if imp == Imp::CublasFp32 {
                &bl.exact
            } else {
                &bl.tf32
            };
            blas::sgemm(h, Gemm3::WeightGrad, shape, &b.x, &b.dy, &mut b.dw, 1.0)
        }
    }
}

/// Device seconds of `iters` back-to-back calls.
fn time(c: &mut Ctx, g: Gemm3, imp: Imp, iters: u64) -> Result<f64, String> {
    let start = mark(c.la.stream()).map_err(|e| e.to_string())?;
    for _ in 0..iters {
        enqueue(c, g, imp)?;
    }
    let end = mark(c.la.stream()).map_err(|e| e.to_string())?;
    Span::between(start, end)
        .seconds()
        .map_err(|e| e.to_string())
}

/// Per-call seconds of every sample criterion took, by `(product, shape, implementation)`.
type Samples = BTreeMap<(u8, (usize, usize, usize), Imp), Vec<f64>>;

fn product_key(g: Gemm3) -> u8 {
    g as u8
}

/// The shapes `PIPEFILL_KERNELS_SIZES` asks for (`model`: the built-in model's layers, 256 -> 256 and
/// 256 -> 16 on 32-row microbatches, `train`'s defaults).
fn shapes() -> Result<Vec<(usize, usize, usize)>, String> {
    let text = std::env::var("PIPEFILL_KERNELS_SIZES")
        .unwrap_or_else(|_| "1024,2048,4096,8192,model".into());
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim) {
        match part {
            "model" => out.extend([(32, 256, 256), (32, 256, 16)]),
            n => match n.parse::<usize>() {
                Ok(n) if n > 0 => out.push((n, n, n)),
                _ => {
                    return Err(format!(
                        "PIPEFILL_KERNELS_SIZES: `{n}` is neither a size >= 1 nor `model`; give e.g. `1024,4096,model`"
                    ))
                }
            },
        }
    }
    Ok(out)
}

/// Benches every product and implementation at `shape`, keeping each sample's per-call time.
fn bench_shape(
    cr: &mut Criterion,
    gpu: &Arc<Gpu>,
    blas_ok: bool,
    shape: (usize, usize, usize),
    samples: &RefCell<Samples>,
) -> Result<(), String> {
    let la = Launcher::new(gpu.clone(), gpu.new_stream().map_err(|e| e.to_string())?);
    let blas = if blas_ok {
        Some(Blas::new(la.stream())?)
    } else {
        None
    };
    let bufs = Bufs::new(&la, shape)?;
    let ctx = RefCell::new(Ctx {
        la,
        blas,
        bufs,
        shape,
    });
    let (rows, inputs, outputs) = shape;
    let flops = 2 * rows * inputs * outputs;
    let label = format!("{rows}x{inputs}x{outputs}");
    for g in [Gemm3::Forward, Gemm3::InputGrad, Gemm3::WeightGrad] {
        let mut group = cr.benchmark_group(format!("kernels/{}", product_name(g)));
        group
            .sampling_mode(SamplingMode::Flat)
            .throughput(Throughput::Elements(flops as u64));
        for &imp in Imp::of(g).iter().filter(|i| blas_ok || !i.needs_blas()) {
            // One untimed call first: loads the kernel, raises its shared memory, finds a bad launch.
            enqueue(&mut ctx.borrow_mut(), g, imp)
                .map_err(|e| format!("{} {label}: {e}", imp.name()))?;
            group.bench_function(BenchmarkId::new(imp.name(), &label), |b| {
                b.iter_custom(|iters| {
                    let t = time(&mut ctx.borrow_mut(), g, imp, iters)
                        .unwrap_or_else(|e| panic!("{} {label}: {e}", imp.name()));
                    samples
                        .borrow_mut()
                        .entry((product_key(g), shape, imp))
                        .or_default()
                        .push(t / iters as f64);
                    Duration::from_secs_f64(t)
                })
            });
        }
        group.finish();
    }
    let done = ctx.borrow().la.stream().synchronize();
    done.map_err(|e| e.to_string())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The table of medians and the issue's ratios.
fn report(samples: &Samples) {
    println!("\nkernels: time per call (median of criterion's samples) and TFLOP/s (2 m n k / t)");
    println!(
        "{:<20} {:<16} {:<26} {:>10} {:>9}",
        "product", "rows x in x out", "implementation", "ms", "TFLOP/s"
    );
    let med: BTreeMap<_, f64> = samples.iter().map(|(k, v)| (*k, median(v))).collect();
    for (&(p, (r, i, o), imp), &t) in &med {
        let g = [Gemm3::Forward, Gemm3::InputGrad, Gemm3::WeightGrad][p as usize];
        let tflops = 2.0 * (r * i * o) as f64 / t / 1e12;
        println!(
            "{:<20} {:<16} {:<26} {:>10.4} {:>9.2}",
            product_name(g),
            format!("{r}x{i}x{o}"),
            imp.name(),
            t * 1e3,
            tflops
        );
    }
    println!("\nratios: speed of the Rust kernel over the other (t_other / t_pf; > 1: the Rust kernel is faster)");
    let ratios = [
        (
            Gemm3::Forward,
            Imp::PfTf32,
            Imp::LtTf32,
            "aim >= 0.9 at 4096",
        ),
        (
            Gemm3::Forward,
            Imp::PfBf16,
            Imp::LtBf16,
            "aim >= 0.9 at 4096",
        ),
        (Gemm3::Forward, Imp::PfTf32, Imp::CublasTf32Act, "aim > 1"),
        (Gemm3::Forward, Imp::PfSimt, Imp::CublasFp32Act, "aim > 1"),
        (Gemm3::InputGrad, Imp::PfTf32, Imp::CublasTf32Act, "aim > 1"),
        (Gemm3::InputGrad, Imp::PfSimt, Imp::CublasFp32Act, "aim > 1"),
        (
            Gemm3::WeightGrad,
            Imp::PfTf32,
            Imp::CublasTf32,
            "GEMM only: no db on the cuBLAS side",
        ),
    ];
    let shapes: Vec<_> = med
        .keys()
        .map(|k| k.1)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for (g, pf, other, aim) in ratios {
        for &s in &shapes {
            let key = |imp| (product_key(g), s, imp);
            if let (Some(a), Some(b)) = (med.get(&key(pf)), med.get(&key(other))) {
                println!(
                    "  {} {}x{}x{}: {} vs {}: {:.2}x ({aim})",
                    product_name(g),
                    s.0,
                    s.1,
                    s.2,
                    pf.name(),
                    other.name(),
                    b / a
                );
            }
        }
    }
}

fn main() -> ExitCode {
    let run = support::Run::start("kernels").criterion_threshold(THRESHOLD);
    let Some(gpu) = gpu_or_skip("bench kernels") else {
        return ExitCode::SUCCESS;
    };
    let shapes = match shapes() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: bench kernels: {e}");
            return ExitCode::from(2);
        }
    };
    let blas_ok = blas::present();
    if !blas_ok {
        println!("bench kernels: libcublas / libcublasLt not found: the cuBLAS rows are left out");
    }
    let mut cr = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_millis(400))
        .nresamples(1000)
        .configure_from_args();
    let samples = RefCell::new(Samples::new());
    for shape in shapes {
        if let Err(e) = bench_shape(&mut cr, &gpu, blas_ok, shape, &samples) {
            eprintln!("error: bench kernels at {shape:?}: {e}");
            return ExitCode::from(1);
        }
    }
    cr.final_summary();
    report(&samples.borrow());
    run.finish_criterion()
}
