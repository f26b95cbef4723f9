//! The first GPU bench, and the template for the others: host time of one `cuCtxSynchronize` on an
//! idle primary context of device 0 (median of single calls), the least a host wait on the GPU
//! costs the stream runtime.
//!
//! Without a CUDA driver it prints `skipped: no CUDA device (set PIPEFILL_REQUIRE_GPU=1 to fail instead)` and exits 0;
//! with `PIPEFILL_REQUIRE_GPU=1` it fails instead (`support/gpu.rs`).
//!
//! ```sh
//! cargo bench --bench gpu_sync
//! ```

use std::ffi::{c_int, c_void};
use std::process::ExitCode;
use std::time::Instant;

#[allow(dead_code)]
#[path = "support/mod.rs"]
mod support;

use support::stats::Spread;

#[path = "support/gpu.rs"]
mod gpu;

/// Relative change that counts as a regression (not yet measured on a GPU: a guess).
const THRESHOLD: f64 = 0.25;

type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuPrimaryCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
type CuCtxSetCurrent = unsafe extern "C" fn(*mut c_void) -> c_int;
type CuCtxSynchronize = unsafe extern "C" fn() -> c_int;

/// Median microseconds of one `cuCtxSynchronize` over `calls` calls after a warm-up, and the
/// spread of the calls measured.
fn sync_us(driver: &gpu::Driver, calls: usize) -> Result<(f64, Option<Spread>), String> {
    // SAFETY: the signatures are the CUDA driver API's (cuda.h).
    let (get, retain, set, sync) = unsafe {
        (
            driver.symbol::<CuDeviceGet>(c"cuDeviceGet"),
            driver.symbol::<CuPrimaryCtxRetain>(c"cuDevicePrimaryCtxRetain"),
            driver.symbol::<CuCtxSetCurrent>(c"cuCtxSetCurrent"),
            driver.symbol::<CuCtxSynchronize>(c"cuCtxSynchronize"),
        )
    };
    let (Some(get), Some(retain), Some(set), Some(sync)) = (get, retain, set, sync) else {
        return Err("the CUDA driver lacks a context function".into());
    };
    let check = |what: &str, rc: c_int| {
        (rc == 0)
            .then_some(())
            .ok_or(format!("{what} failed: CUresult {rc}"))
    };
    let (mut dev, mut ctx): (c_int, *mut c_void) = (0, std::ptr::null_mut());
    // SAFETY: valid out pointers; the context stays retained until the process ends.
    unsafe {
        check("cuDeviceGet", get(&mut dev, 0))?;
        check("cuDevicePrimaryCtxRetain", retain(&mut ctx, dev))?;
        check("cuCtxSetCurrent", set(ctx))?;
    }
    let mut times = Vec::with_capacity(calls);
    for i in 0..calls + calls / 10 {
        let t = Instant::now();
        // SAFETY: a context is current on this thread.
        check("cuCtxSynchronize", unsafe { sync() })?;
        if i >= calls / 10 {
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let spread = Spread::of(&times);
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], spread))
}

fn main() -> ExitCode {
    let mut run = support::Run::start("gpu_sync");
    let name = "gpu_sync/ctx_synchronize";
    if !run.should_measure(run.args.filter(), &[name]) {
        return ExitCode::SUCCESS;
    }
    let driver = gpu::gpu_or_skip("gpu_sync");
    let calls = if run.quick() { 1_000 } else { 20_000 };
    match sync_us(&driver, calls) {
        Ok((us, spread)) => {
            println!(
                "cuCtxSynchronize on an idle context, device 0 of {}: {us:.2} us (median of {calls})",
                driver.devices
            );
            if let Some(sp) = spread {
                println!("calls: {}", sp.describe(1.0, "us"));
            }
            run.lower(name, us, "us", THRESHOLD);
            run.finish()
        }
        Err(e) => {
            eprintln!("error: bench gpu_sync: {e}");
            ExitCode::from(1)
        }
    }
}
