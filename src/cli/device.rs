//! `pipefill device`: what the CUDA backend finds on this machine ([`crate::cuda::inspect`]).
//!
//! ```text
//! pipefill device [--json]
//! ```
//!
//! Prints the driver's CUDA version, every device (name, architecture, memory, multiprocessors,
//! compute mode), NCCL's version, the path of every CUDA library the process loaded, which image
//! the kernels load from (a matching `PIPEFILL_CUBIN`, else the embedded PTX), the JIT's wall time
//! and logs, and each kernel's registers and memory. Exit 0 when the kernels load, 1 when they do
//! not (everything found is printed first, the JIT's log included), 2 when there is no CUDA driver
//! or device.

use crate::cli::CliError;
use crate::cuda::inspect::{inspect, DeviceReport};

/// Flags of `pipefill device`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `pipefill device`.
pub fn run(args: Args) -> Result<(), CliError> {
    let report = inspect().map_err(|e| {
        if e.is_unavailable() {
            CliError::Usage(format!(
                "{e}; `pipefill device` needs the NVIDIA driver and a GPU (the CPU backend needs neither)"
            ))
        } else {
            CliError::Failed(e.to_string())
        }
    })?;
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::Failed(format!("cannot write the report as JSON: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", text(&report));
    }
    match &report.module.load_error {
        None => Ok(()),
        Some(e) => Err(CliError::Failed(format!("the kernels did not load: {e}"))),
    }
}

/// The report as text.
fn text(r: &DeviceReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "driver: CUDA {}", r.driver_cuda_version);
    for d in &r.devices {
        let _ = writeln!(
            s,
            "device {}: {} (sm_{}{}), {:.1} GiB, {} multiprocessors, compute mode {}",
            d.ordinal,
            d.name,
            d.capability[0],
            d.capability[1],
            d.memory_bytes as f64 / f64::from(1u32 << 30),
            d.multiprocessors,
            d.compute_mode
        );
    }
    match (&r.nccl_version, &r.nccl_note) {
        (Some(v), _) => {
            let _ = writeln!(s, "nccl: {v}");
        }
        (None, note) => {
            let _ = writeln!(s, "nccl: none ({})", note.as_deref().unwrap_or("unknown"));
        }
    }
    let _ = writeln!(s, "libraries: {}", r.libraries.join(", "));
    let m = &r.module;
    let _ = writeln!(s, "module: {}", m.source);
    let _ = writeln!(s, "jit: {:.1} ms", m.jit_wall_ms);
    for (name, log) in [
        ("jit error log", &m.jit_error_log),
        ("jit info log", &m.jit_info_log),
    ] {
        if !log.trim().is_empty() {
            let _ = writeln!(s, "{name}:\n{}", log.trim_end());
        }
    }
    if let Some(e) = &m.load_error {
        let _ = writeln!(s, "load error: {e}");
    }
    if !m.kernels.is_empty() {
        let _ = writeln!(
            s,
            "\n| kernel | registers | static shared B | local B | max threads |"
        );
        let _ = writeln!(s, "| --- | --- | --- | --- | --- |");
        for k in &m.kernels {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                k.name, k.registers, k.static_shared_bytes, k.local_bytes, k.max_threads_per_block
            );
        }
    }
    s
}
