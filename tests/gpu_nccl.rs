//! NCCL between two processes on one GPU (`NCCL_MULTI_RANK_GPU_ENABLE=1`): the test starts two copies
//! of itself, rank 0 writes the NCCL unique id to a file and rank 1 reads it (no MPI needed); each
//! rank sends its buffer to the other in one group (send and receive paired), then both all-reduce
//! (sum). Every value is checked on the host against what the other rank holds.
//!
//! Without a GPU it prints `skipped: no CUDA device (set PIPEFILL_REQUIRE_GPU=1 to fail instead)`
//! and passes; with `PIPEFILL_REQUIRE_GPU=1` it fails instead. Where NCCL is missing or refuses two
//! ranks on one device, it prints `NCCL refused: ...` and passes (a note, not a result).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pipefill::cuda::nccl::{nccl_present, NcclError, NcclLink, UniqueId};
use pipefill::cuda::{gpu_or_skip, Gpu};

/// Set in the two child processes: their rank.
const CHILD: &str = "PIPEFILL_NCCL_TEST_RANK";
/// Set in the children: the id file.
const ID_FILE: &str = "PIPEFILL_NCCL_TEST_ID";
/// A child's exit code when NCCL refused (not a failure of pipefill).
const REFUSED: i32 = 3;
const TEST: &str = "two_processes_exchange_and_reduce_over_nccl_on_one_gpu";
const N: usize = 1000;

fn values(rank: usize) -> Vec<f32> {
    (0..N).map(|i| (rank + 1) as f32 * i as f32).collect()
}

/// One rank: exchange with the other, then all-reduce; checked against the other rank's values.
fn child(rank: usize, id_file: PathBuf) {
    let gpu = Gpu::open(0).expect("device 0");
    let stream = gpu.new_stream().expect("a stream");
    let id = if rank == 0 {
        let id = UniqueId::new().unwrap_or_else(|e| refused(&e));
        id.write(&id_file).expect("write the id");
        id
    } else {
        UniqueId::wait_for(&id_file, Duration::from_secs(60)).expect("the id from rank 0")
    };
    let link = NcclLink::open(stream.clone(), rank, 2, id).unwrap_or_else(|e| refused(&e));
    let mine = stream.clone_htod(&values(rank)).expect("copy in");
    let mut theirs = stream.alloc_zeros::<f32>(N).expect("alloc");
    link.exchange(&mine, &mut theirs, 1 - rank)
        .expect("exchange");
    let mut sum = stream.clone_htod(&values(rank)).expect("copy in");
    link.all_reduce_sum(&mut sum).expect("all-reduce");
    let got = stream.clone_dtoh(&theirs).expect("copy out");
    let summed = stream.clone_dtoh(&sum).expect("copy out");
    stream.synchronize().expect("synchronize");
    assert_eq!(
        got,
        values(1 - rank),
        "rank {rank}: what the other rank sent"
    );
    let want: Vec<f32> = values(0)
        .iter()
        .zip(values(1))
        .map(|(a, b)| a + b)
        .collect();
    assert_eq!(summed, want, "rank {rank}: the all-reduce");
    println!("nccl rank {rank}: ok");
}

fn refused(e: &NcclError) -> ! {
    println!("NCCL refused: {e}");
    std::process::exit(REFUSED)
}

#[test]
fn two_processes_exchange_and_reduce_over_nccl_on_one_gpu() {
    if let (Ok(rank), Ok(file)) = (std::env::var(CHILD), std::env::var(ID_FILE)) {
        return child(rank.parse().expect("a rank"), PathBuf::from(file));
    }
    if gpu_or_skip("gpu_nccl").is_none() {
        return;
    }
    if !nccl_present() {
        println!("NCCL refused: {}", NcclError::NoLibrary);
        return;
    }
    let dir = std::env::temp_dir().join(format!("pipefill-nccl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let id_file = dir.join("nccl-id");
    let exe = std::env::current_exe().expect("this test's executable");
    let mut children: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(&exe)
                .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
                .env(CHILD, rank.to_string())
                .env(ID_FILE, &id_file)
                .env("NCCL_MULTI_RANK_GPU_ENABLE", "1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut codes = [None; 2];
    while codes.iter().any(Option::is_none) {
        for (c, code) in children.iter_mut().zip(codes.iter_mut()) {
            if code.is_none() {
                *code = c.try_wait().expect("wait").map(|s| s.code().unwrap_or(-1));
            }
        }
        if Instant::now() > deadline {
            children.iter_mut().for_each(|c| drop(c.kill()));
            panic!("the two NCCL ranks did not finish in 120 s (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let outputs: Vec<String> = children
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().expect("output");
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    if codes.contains(&Some(REFUSED)) {
        println!(
            "NCCL refused two ranks on one device; not run:\n{}",
            outputs.join("\n")
        );
        return;
    }
    for (rank, (code, out)) in codes.iter().zip(&outputs).enumerate() {
        assert_eq!(*code, Some(0), "rank {rank}:\n{out}");
        assert!(out.contains(&format!("nccl rank {rank}: ok")), "{out}");
    }
}
