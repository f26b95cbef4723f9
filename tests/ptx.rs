//! Assembles the embedded PTX with `ptxas` for `sm_80` and `sm_90`: fails on any error, warning or register
//! spill (an entry's out-of-line callees count against it), on any local memory (stack frame) in a
//! tensor-core kernel (their accumulators must stay in registers), checks that every entry point in
//! `pipefill::ptx::entry` is there, and prints registers, shared memory and spills per entry point (run
//! with `--nocapture` to see the table). Another test checks that each tensor-core entry holds `mma.sync`,
//! `cp.async` (and, in BF16, `ldmatrix`) instructions.
//!
//! `ptxas` is looked up in `PIPEFILL_PTXAS` (a path), then on `PATH`, then in the Python package of the
//! PyPI wheel `nvidia-cuda-nvcc-cu12` (`nvidia/cuda_nvcc/bin/ptxas`). When it is missing, or the PTX was
//! not built, the test prints why and passes, unless `PIPEFILL_REQUIRE_PTXAS=1` (set by `.ci/run`), which
//! makes either a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use pipefill::ptx::{entry, ptx, tensor_core};

/// The architectures the PTX must assemble for: Ampere (the PTX's own target) and Hopper.
const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

/// What `ptxas -v` reports for one entry point.
#[derive(Debug, Default, Clone, PartialEq)]
struct EntryReport {
    name: String,
    registers: u32,
    shared_bytes: u32,
    stack_bytes: u32,
    spill_store_bytes: u32,
    spill_load_bytes: u32,
}

fn required() -> bool {
    std::env::var("PIPEFILL_REQUIRE_PTXAS").is_ok_and(|v| v == "1")
}

/// Skips (prints the reason, passes) or, when required, fails.
fn skip_or_fail(reason: &str) {
    if required() {
        panic!("{reason} (PIPEFILL_REQUIRE_PTXAS=1 makes this a failure)");
    }
    println!("SKIPPED: {reason} (set PIPEFILL_REQUIRE_PTXAS=1 to make this a failure)");
}

/// `ptxas` from `PIPEFILL_PTXAS`, `PATH`, or the `nvidia-cuda-nvcc-cu12` Python wheel.
fn find_ptxas() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PIPEFILL_PTXAS") {
        return Some(PathBuf::from(path));
    }
    if Command::new("ptxas")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Some(PathBuf::from("ptxas"));
    }
    let script = "import nvidia.cuda_nvcc as m; print(list(m.__path__)[0])";
    for python in ["python3", "python"] {
        let Ok(out) = Command::new(python).args(["-c", script]).output() else {
            continue;
        };
        if out.status.success() {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            let ptxas = dir.join("bin").join("ptxas");
            if ptxas.is_file() {
                return Some(ptxas);
            }
        }
    }
    None
}

/// Parses `ptxas -v` output into one report per entry point.
fn parse_verbose(stderr: &str) -> Vec<EntryReport> {
    let mut reports: Vec<EntryReport> = Vec::new();
    for line in stderr.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            reports.push(EntryReport {
                name,
                ..EntryReport::default()
            });
            continue;
        }
        let Some(report) = reports.last_mut() else {
            continue;
        };
        // The entry's own properties, then those of each out-of-line function it calls: spills add up,
        // the stack is the deepest frame.
        if line.contains("bytes stack frame") {
            report.stack_bytes = report
                .stack_bytes
                .max(number_before(line, "bytes stack frame"));
            report.spill_store_bytes += number_before(line, "bytes spill stores");
            report.spill_load_bytes += number_before(line, "bytes spill loads");
        } else if line.contains("registers") {
            report.registers = number_before(line, "registers");
            report.shared_bytes = number_before(line, "bytes smem");
        }
    }
    reports
}

/// The integer just before `label` in `line` (0 when the label is absent).
fn number_before(line: &str, label: &str) -> u32 {
    line.split(label)
        .next()
        .filter(|_| line.contains(label))
        .and_then(|head| {
            head.split(|c: char| !c.is_ascii_digit())
                .rfind(|s| !s.is_empty())
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Runs `ptxas -v` on the PTX file for one architecture; panics on a failed run or any warning.
fn assemble(ptxas: &Path, ptx_file: &Path, arch: &str) -> Vec<EntryReport> {
    let cubin = ptx_file.with_extension(format!("{arch}.cubin"));
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(ptx_file)
        .arg("-o")
        .arg(&cubin)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", ptxas.display()));
    let _ = std::fs::remove_file(&cubin);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ptxas -arch={arch} failed:\n{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("warning") || l.contains("error"))
        .collect();
    assert!(
        warnings.is_empty(),
        "ptxas -arch={arch} warned:\n{}",
        warnings.join("\n")
    );
    parse_verbose(&stderr)
}

#[test]
fn ptx_assembles_without_spills_for_sm80_and_sm90() {
    let text = match ptx() {
        Ok(text) => text,
        Err(e) => return skip_or_fail(&e.to_string()),
    };
    for name in entry::ALL {
        assert!(
            text.contains(&format!(".entry {name}(")),
            "entry point {name} is listed in pipefill::ptx::entry but missing from the PTX"
        );
    }
    let Some(ptxas) = find_ptxas() else {
        return skip_or_fail(
            "ptxas not found (set PIPEFILL_PTXAS, put it on PATH, or `pip install nvidia-cuda-nvcc-cu12==12.9.86`)",
        );
    };

    let file = std::env::temp_dir().join(format!("pipefill-kernels-{}.ptx", std::process::id()));
    std::fs::write(&file, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", file.display()));
    let mut failures = Vec::new();
    for arch in ARCHS {
        let mut reports = assemble(&ptxas, &file, arch);
        reports.sort_by(|a, b| a.name.cmp(&b.name));
        println!("ptxas -arch={arch} ({}):", ptxas.display());
        println!(
            "  {:<32} {:>9} {:>11} {:>11} {:>11}",
            "entry", "registers", "smem bytes", "stack bytes", "spill bytes"
        );
        for r in &reports {
            let spill = r.spill_store_bytes + r.spill_load_bytes;
            println!(
                "  {:<32} {:>9} {:>11} {:>11} {:>11}",
                r.name, r.registers, r.shared_bytes, r.stack_bytes, spill
            );
            if spill > 0 {
                failures.push(format!(
                    "{arch} {}: {spill} bytes of register spills",
                    r.name
                ));
            }
            if entry::TENSOR_CORE.contains(&r.name.as_str()) && r.stack_bytes > 0 {
                failures.push(format!(
                    "{arch} {}: {} bytes of local memory (accumulators or staged values left registers)",
                    r.name, r.stack_bytes
                ));
            }
        }
        for name in entry::ALL {
            if !reports.iter().any(|r| r.name == name) {
                failures.push(format!("{arch}: ptxas did not report entry {name}"));
            }
        }
    }
    let _ = std::fs::remove_file(&file);
    print_dynamic_shared();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Prints the dynamic shared memory of each tensor-core kernel (`ptxas` reports static shared memory only).
fn print_dynamic_shared() {
    use tensor_core::{entry_name, launch, Precision, Product};
    println!("dynamic shared memory (tensor_core::launch):");
    for precision in [Precision::Tf32, Precision::Bf16] {
        for product in [
            Product::Forward,
            Product::BackwardInput,
            Product::BackwardWeight,
        ] {
            let l = launch(product, precision, 1, 1, 1);
            println!(
                "  {:<32} {:>7} bytes",
                entry_name(product, precision),
                l.shared_bytes
            );
        }
    }
}

/// The body of entry `name` in the PTX text (from its `.entry` line to the next entry or function).
fn entry_body<'a>(text: &'a str, name: &str) -> &'a str {
    let start = text
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("entry {name} missing from the PTX"));
    let rest = &text[start + 1..];
    let end = [".entry ", ".func "]
        .iter()
        .filter_map(|m| rest.find(m))
        .min()
        .unwrap_or(rest.len());
    &text[start..start + 1 + end]
}

#[test]
fn tensor_core_entries_use_mma_sync_and_cp_async() {
    let text = match ptx() {
        Ok(text) => text,
        Err(e) => return skip_or_fail(&e.to_string()),
    };
    for name in entry::TENSOR_CORE {
        let body = entry_body(text, name);
        let (mma, ldmatrix) = if name.ends_with("_tf32") {
            ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", None)
        } else {
            (
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                Some("ldmatrix.sync.aligned.m8n8.x4"),
            )
        };
        assert!(body.contains(mma), "{name} has no `{mma}`");
        for needed in [
            "cp.async.cg.shared.global",
            "cp.async.wait_group",
            "cp.async.commit_group",
        ] {
            assert!(body.contains(needed), "{name} has no `{needed}`");
        }
        if let Some(ld) = ldmatrix {
            assert!(body.contains(ld), "{name} has no `{ld}`");
        }
    }
    // And the SIMT kernels do not (the check above can tell the two apart).
    assert!(!entry_body(text, entry::LINEAR_FORWARD).contains("mma.sync"));
}

#[test]
fn parses_ptxas_verbose_output() {
    let sample = "ptxas info    : 0 bytes gmem\n\
        ptxas info    : Compiling entry function 'pf_a' for 'sm_90'\n\
        ptxas info    : Function properties for pf_a\n    \
        8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
        ptxas info    : Used 94 registers, used 1 barriers, 8704 bytes smem, 408 bytes cmem[0]\n\
        ptxas info    : Function properties for callee\n    \
        16 bytes stack frame, 8 bytes spill stores, 0 bytes spill loads\n\
        ptxas info    : Compiling entry function 'pf_b' for 'sm_90'\n    \
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
        ptxas info    : Used 22 registers, used 0 barriers\n";
    let reports = parse_verbose(sample);
    assert_eq!(
        reports,
        vec![
            EntryReport {
                name: "pf_a".into(),
                registers: 94,
                shared_bytes: 8704,
                stack_bytes: 16,
                spill_store_bytes: 12,
                spill_load_bytes: 12
            },
            EntryReport {
                name: "pf_b".into(),
                registers: 22,
                ..EntryReport::default()
            },
        ]
    );
}
