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

/// Runs `pipefill ARGS` with `env` set, standard output into `out` (a file: large outputs are not
/// held by the test); returns exit code, stderr and the child's peak RSS in KiB (Linux `wait4`;
/// 0 elsewhere).
fn measured(args: &[&str], env: &[(&str, &str)], out: &std::path::Path) -> (i32, String, i64) {
    use std::process::{Command, Stdio};
    let stderr = out.with_extension("err");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pipefill"))
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::from(std::fs::File::create(out).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(&stderr).unwrap()))
        .spawn()
        .expect("run pipefill");
    let (code, rss) = wait_with_rss(&mut child);
    (code, std::fs::read_to_string(&stderr).unwrap(), rss)
}

#[cfg(target_os = "linux")]
fn wait_with_rss(child: &mut std::process::Child) -> (i32, i64) {
    /// `struct rusage` of 64-bit Linux: two `timeval`s, then `ru_maxrss` (KiB) and 13 more longs.
    #[repr(C)]
    struct Rusage {
        times: [i64; 4],
        maxrss: i64,
        rest: [i64; 13],
    }
    extern "C" {
        fn wait4(pid: i32, status: *mut i32, options: i32, rusage: *mut Rusage) -> i32;
    }
    let mut status = 0i32;
    let mut usage = Rusage {
        times: [0; 4],
        maxrss: 0,
        rest: [0; 13],
    };
    // SAFETY: `status` and `usage` are valid for writes; the pid is our own unwaited child.
    let pid = unsafe { wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4 failed");
    // Exited normally: the exit code; killed: -1.
    let code = if status & 0x7f == 0 {
        (status >> 8) & 0xff
    } else {
        -1
    };
    (code, usage.maxrss)
}

#[cfg(not(target_os = "linux"))]
fn wait_with_rss(child: &mut std::process::Child) -> (i32, i64) {
    let status = child.wait().expect("wait for pipefill");
    (status.code().unwrap_or(-1), 0)
}

#[test]
fn a_text_grid_of_4096_ranks_is_written_row_by_row() {
    // 4096 x 8192 cells, 268 MB of text: it held 3.1 GB before the grid was streamed.
    let dir = scratch("cli-sizes-grid");
    let out = dir.join("grid.txt");
    let args = [
        "schedule",
        "--schedule",
        "gpipe",
        "--ranks",
        "4096",
        "--microbatches",
        "1",
    ];
    let (code, err, rss) = measured(&args, &[], &out);
    assert_eq!(code, 0, "{err}");
    let bytes = std::fs::metadata(&out).unwrap().len();
    assert!(bytes > 200_000_000, "the grid is {bytes} bytes");
    assert!(rss < 300 * 1024, "peak RSS {rss} KiB for a streamed grid");
    std::fs::remove_file(&out).unwrap();
    // Four times the ranks: 4.5 GiB of text, refused before a line is written.
    let (code, _, err) = pipefill(&[
        "schedule",
        "--schedule",
        "gpipe",
        "--ranks",
        "16384",
        "--microbatches",
        "1",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("use --format csv or --format json"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn a_trace_of_512_by_512_is_written_event_by_event() {
    // 524,288 actions: the trace took 6.0 GB (11.5 KB per action) when built as one JSON value.
    let dir = scratch("cli-sizes-trace");
    let trace = dir.join("t.json");
    let args = [
        "simulate",
        "--schedule",
        "1f1b",
        "--ranks",
        "512",
        "--microbatches",
        "512",
        "--gantt",
        "never",
        "--trace",
        trace.to_str().unwrap(),
    ];
    let (code, err, rss) = measured(&args, &[], &dir.join("stdout.txt"));
    assert_eq!(code, 0, "{err}");
    assert!(
        rss < 1024 * 1024,
        "peak RSS {rss} KiB with a streamed trace"
    );
    // Only its ends are read: the test process stays small (a child's peak RSS counts the
    // parent's pages at the fork, for the other tests' measurements).
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(&trace).unwrap();
    let mut head = [0u8; 40];
    f.read_exact(&mut head).unwrap();
    assert_eq!(&head, br#"{"displayTimeUnit":"ms","traceEvents":[{"#);
    let mut tail = [0u8; 3];
    f.seek(SeekFrom::End(-3)).unwrap();
    f.read_exact(&mut tail).unwrap();
    assert_eq!(&tail, b"}]}");
    assert!(f.metadata().unwrap().len() > 100_000_000);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn chunks_that_leave_a_stage_without_a_layer_are_refused_up_front() {
    // 2 ranks x 4,000,000 chunks for 8 layers: it allocated 12 GB before the planner refused it.
    let (code, out, err) = pipefill(&["train", "--chunks", "4000000"]);
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("--chunks 4000000"), "{err}");
    assert!(err.contains("give --chunks <= 4"), "{err}");
}

#[test]
fn auto_stays_within_its_budget_at_a_thousand_chunks() {
    // Every list construction of 192,000 actions x 8,000 stages is past the 0.3 s budget: before,
    // the constructive phase ran outside it (452 s).
    let auto = |extra: &[&str]| {
        let mut a = vec![
            "schedule",
            "--schedule",
            "auto",
            "--ranks",
            "8",
            "--microbatches",
            "8",
            "--chunks",
            "1000",
            "--format",
            "csv",
        ];
        a.extend_from_slice(extra);
        let t = std::time::Instant::now();
        let r = pipefill(&a);
        (r, t.elapsed().as_secs_f64())
    };
    let ((code, _, err), secs) = auto(&[]);
    assert_eq!(code, 0, "{err}");
    assert!(secs < 30.0, "took {secs} s");
    // No family fits two in flight, and nothing can be built in the budget: refused, naming it.
    let ((code, _, err), secs) = auto(&["--max-in-flight", "2"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--time-budget"), "{err}");
    assert!(err.contains("raise it to at least"), "{err}");
    assert!(secs < 30.0, "took {secs} s");
}

/// A cost file of `n` layers (uneven times) in `dir`.
fn many_layers(dir: &std::path::Path, n: usize) -> std::path::PathBuf {
    let layers: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"name":"l{i}","forward":{},"backward":0.002,"activation_bytes":1000,"parameter_bytes":1000}}"#,
                0.001 + (i % 7) as f64 * 1e-4
            )
        })
        .collect();
    let path = dir.join(format!("costs-{n}.json"));
    let text = format!(
        r#"{{"layers":[{}],"meta":{{"microbatch_size":8}}}}"#,
        layers.join(",")
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn plan_and_partition_refuse_work_of_many_minutes_up_front() {
    let dir = scratch("cli-sizes-layers");
    let ten_k = many_layers(&dir, 10_000);
    let hundred_k = many_layers(&dir, 100_000);
    for (args, fix) in [
        (
            vec![
                "plan",
                "--costs",
                ten_k.to_str().unwrap(),
                "--ranks",
                "4",
                "--global-batch",
                "64",
            ],
            "a smaller --max-microbatches",
        ),
        (
            vec![
                "plan",
                "--costs",
                ten_k.to_str().unwrap(),
                "--workers",
                "8",
                "--global-batch",
                "64",
            ],
            "fewer --workers",
        ),
        (
            vec![
                "partition",
                "--costs",
                hundred_k.to_str().unwrap(),
                "--stages",
                "8",
            ],
            "fewer --stages",
        ),
    ] {
        let t = std::time::Instant::now();
        let (code, out, err) = pipefill(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains("takes an estimated"), "{err}");
        assert!(err.contains(fix), "{err}");
        assert!(
            t.elapsed().as_secs() < 60,
            "{args:?} took {:?}",
            t.elapsed()
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn long_work_shows_progress_only_when_asked_or_on_a_terminal() {
    // 10,000 layers into 4 stages: an estimated 4 s.
    let dir = scratch("cli-sizes-progress");
    let costs = many_layers(&dir, 10_000);
    let args = [
        "partition",
        "--costs",
        costs.to_str().unwrap(),
        "--stages",
        "4",
    ];
    let (code, err, _) = measured(&args, &[], &dir.join("quiet.txt"));
    assert_eq!(code, 0, "{err}");
    let quiet = std::fs::read_to_string(dir.join("quiet.txt")).unwrap();
    assert!(
        err.is_empty(),
        "stderr is not a terminal: no progress, got {err}"
    );
    let (code, err, _) = measured(&args, &[("PIPEFILL_PROGRESS", "1")], &dir.join("asked.txt"));
    assert_eq!(code, 0, "{err}");
    // The first line comes at the start (the estimate decides, not the machine's speed).
    assert!(err.contains("started, an estimated"), "{err}");
    let asked = std::fs::read_to_string(dir.join("asked.txt")).unwrap();
    assert_eq!(asked, quiet, "progress must not touch standard output");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn schedules_at_the_pair_limit_are_refused_by_their_memory_estimate() {
    // 8192 x 8192 pairs are within the P x V x M limit, but their 201 million actions need about
    // 24 GiB; with 2 GB allowed they are refused before anything is generated.
    let dir = scratch("cli-sizes-pairs");
    let args = [
        "schedule",
        "--schedule",
        "zb-h1",
        "--ranks",
        "8192",
        "--microbatches",
        "8192",
        "--format",
        "csv",
    ];
    let (code, err, rss) = measured(
        &args,
        &[("PIPEFILL_MAX_MEMORY", "2000000000")],
        &dir.join("out.csv"),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("201326592 actions need an estimated"), "{err}");
    assert!(
        err.contains("fewer --ranks, --chunks or --microbatches"),
        "{err}"
    );
    assert!(rss < 100 * 1024, "peak RSS {rss} KiB before refusing");
    let (code, _, err) = pipefill_env(&args, &[("PIPEFILL_MAX_MEMORY", "lots")]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("PIPEFILL_MAX_MEMORY=`lots` is not a byte count"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `pipefill ARGS` with `env` set: exit code, stdout, stderr.
fn pipefill_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pipefill"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run pipefill");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn steps_whose_kept_reports_cannot_fit_are_refused_up_front() {
    // 10 million steps of 96 actions keep about 123 GB of reports; with 2 GB allowed, refused
    // before training (it used to grow ~123 bytes per action per step until memory ran out).
    let (code, out, err) = pipefill_env(
        &["train", "--steps", "10000000"],
        &[("PIPEFILL_MAX_MEMORY", "2000000000")],
    );
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("--steps 10000000"), "{err}");
    assert!(err.contains("fewer --steps"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
