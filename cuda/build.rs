//! Compiles the workspace's `kernels/` crate to PTX and hands it to `src/ptx.rs`.
//!
//! The nested build uses rustc's own NVPTX backend on the stable toolchain (docs/gpu.md, "Kernels and PTX"):
//! `RUSTC_BOOTSTRAP=1 cargo rustc --release --target nvptx64-nvidia-cuda -Zbuild-std=core -- --emit=asm
//! -C target-cpu=sm_80`. It runs on a small manifest generated under `OUT_DIR` whose library is
//! `kernels/src/lib.rs`, detached from this workspace (`[workspace]` of its own) and with its own target
//! directory under `OUT_DIR`: so it never touches the workspace's `Cargo.lock`, never waits on the outer
//! build's lock, and works the same under `cargo build`, `cargo test`, `cargo clippy`, with or without
//! `CARGO_TARGET_DIR`, on a clean clone.
//!
//! It never fails the outer build. Without `rust-src` (or if the nested build fails) it prints one
//! `cargo:warning`, writes an empty PTX file and a note saying why, and `pipefill::ptx` then reports
//! "PTX not built: run `rustup component add rust-src` and rebuild". `tests/ptx.rs` fails in CI when the
//! PTX is missing, so a broken kernel does not go unnoticed.
//!
//! Cargo reruns this script when `rust-src` is installed (see `watch_rust_src`), so "add it and
//! rebuild" builds the PTX without touching any file here.
//!
//! Outputs in `OUT_DIR`: `kernels.ptx` (empty when not built) and `kernels-ptx-note.txt` (empty when built,
//! else the reason).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The GPU target and the oldest architecture the PTX is generated for (it assembles for any later one).
const TARGET: &str = "nvptx64-nvidia-cuda";
const ARCH: &str = "sm_80";
/// Written to `OUT_DIR`: the PTX and the reason it is missing.
const PTX_FILE: &str = "kernels.ptx";
const NOTE_FILE: &str = "kernels-ptx-note.txt";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../kernels/src");
    println!("cargo:rerun-if-changed=../kernels/Cargo.toml");
    println!("cargo:rerun-if-env-changed=PIPEFILL_SKIP_PTX");

    let out_dir =
        PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts"));
    // The workspace root (this crate is `cuda/` in it): `kernels/` sits beside this crate.
    let manifest_dir = PathBuf::from(
        env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR for build scripts"),
    )
    .join("..");

    let (ptx, note) = match build_ptx(&manifest_dir, &out_dir) {
        Ok(ptx) => (ptx, String::new()),
        Err(reason) => {
            println!("cargo:warning=PTX not built ({reason}); the CUDA path will be unavailable. Fix: run `rustup component add rust-src` and rebuild");
            (String::new(), reason)
        }
    };
    write_if_changed(&out_dir.join(PTX_FILE), &ptx);
    write_if_changed(&out_dir.join(NOTE_FILE), &note);
}

/// Runs the nested build and returns the PTX text, or a one-line reason why there is none.
fn build_ptx(manifest_dir: &Path, out_dir: &Path) -> Result<String, String> {
    if env::var_os("PIPEFILL_SKIP_PTX").is_some_and(|v| v == "1") {
        return Err("PIPEFILL_SKIP_PTX=1 is set".into());
    }
    let sysroot = sysroot()?;
    watch_rust_src(&sysroot);
    if !sysroot
        .join("lib/rustlib/src/rust/library/core/Cargo.toml")
        .is_file()
    {
        return Err("the rust-src component is not installed".into());
    }
    let crate_dir = write_kernel_crate(manifest_dir, out_dir)?;
    let target_dir = out_dir.join("ptx-target");
    let output = nested_build(&crate_dir, &target_dir)
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let first_error = stderr
            .lines()
            .find(|l| l.starts_with("error"))
            .unwrap_or("no error line")
            .to_string();
        return Err(format!("nested nvptx build failed: {first_error}"));
    }
    read_ptx(&target_dir)
}

/// The sysroot of the `rustc` cargo builds with (`RUSTC`, as cargo hands it to build scripts).
fn sysroot() -> Result<PathBuf, String> {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("cannot run rustc: {e}"))?;
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Makes cargo rerun this script when `rust-src` is installed or removed, so the documented fix
/// (`rustup component add rust-src`, then rebuild) works without touching anything here.
///
/// rustup rewrites `lib/rustlib/components` (the list of installed components) on every
/// `rustup component add` or `remove`: watching that one file is cheap. A toolchain without it
/// (not installed by rustup) gets the whole `lib/rustlib` folder watched instead, which is where
/// `rust-src` lands. Only paths that exist are named: cargo reruns a script on every build while a
/// watched path is missing.
fn watch_rust_src(sysroot: &Path) {
    let rustlib = sysroot.join("lib/rustlib");
    let components = rustlib.join("components");
    for path in [components, rustlib] {
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
            return;
        }
    }
}

/// Writes the kernels' detached manifest under `out_dir` (library `kernels/src/lib.rs`, a
/// `[workspace]` of its own) and returns its folder.
fn write_kernel_crate(manifest_dir: &Path, out_dir: &Path) -> Result<PathBuf, String> {
    let crate_dir = out_dir.join("ptx-crate");
    fs::create_dir_all(&crate_dir)
        .map_err(|e| format!("cannot create {}: {e}", crate_dir.display()))?;
    let lib = manifest_dir.join("kernels/src/lib.rs");
    let manifest = format!(
        "[package]\nname = \"pipefill-kernels\"\nversion = \"0.0.0\"\nedition = \"2021\"\nrust-version = \"1.85\"\npublish = false\n\n\
         [lib]\npath = {lib:?}\n\n[workspace]\n\n[profile.release]\nopt-level = 3\ncodegen-units = 1\n",
        lib = lib.display().to_string(),
    );
    write_if_changed(&crate_dir.join("Cargo.toml"), &manifest);
    Ok(crate_dir)
}

/// The nested `cargo rustc` that emits the kernels as PTX into `target_dir`, with the outer
/// build's host settings kept away from it.
fn nested_build(crate_dir: &Path, target_dir: &Path) -> Command {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(crate_dir)
        .args([
            "rustc",
            "--release",
            "--quiet",
            "--target",
            TARGET,
            "-Zbuild-std=core",
        ])
        .arg("--manifest-path")
        .arg(crate_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .args(["--", "--emit=asm", "-C"])
        .arg(format!("target-cpu={ARCH}"))
        .env("RUSTC_BOOTSTRAP", "1");
    // The outer build's settings are for the host (or for clippy): keep them away from the GPU build.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "CARGO_PROFILE_RELEASE_DEBUG",
        "CARGO_PROFILE_RELEASE_LTO",
        "CARGO_PROFILE_RELEASE_PANIC",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// The newest kernels `.s` file of the nested build, checked to hold kernel entry points.
fn read_ptx(target_dir: &Path) -> Result<String, String> {
    let deps = target_dir.join(TARGET).join("release/deps");
    let newest = fs::read_dir(&deps)
        .map_err(|e| format!("cannot read {}: {e}", deps.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "s")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("pipefill_kernels-"))
        })
        .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok());
    let path = newest.ok_or_else(|| format!("no PTX (.s) file in {}", deps.display()))?;
    let ptx =
        fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !ptx.contains(".entry") {
        return Err(format!("{} has no kernel entry points", path.display()));
    }
    Ok(ptx)
}

/// Writes `text` to `path` unless it already holds exactly that (keeps mtimes, so nothing rebuilds needlessly).
fn write_if_changed(path: &Path, text: &str) {
    if fs::read_to_string(path).is_ok_and(|old| old == text) {
        return;
    }
    if let Err(e) = fs::write(path, text) {
        panic!("cannot write {}: {e}", path.display());
    }
}
