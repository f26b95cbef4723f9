//! The two-process NCCL launch of the GPU tests (`tests/gpu_nccl.rs`, `tests/gpu_bf16.rs`): a test
//! re-runs its own executable as two ranks on GPU 0 (`NCCL_MULTI_RANK_GPU_ENABLE=1`); rank 0 writes
//! the NCCL unique id to a file, rank 1 reads it (no MPI needed).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pipefill::cuda::nccl::{nccl_present, NcclError, UniqueId};
use pipefill::cuda::{gpu_or_skip, Gpu, NcclPeer, PeerOpenError};

/// Set in the two child processes: their rank.
const CHILD: &str = "PIPEFILL_NCCL_TEST_RANK";
/// Set in the children: the id file.
const ID_FILE: &str = "PIPEFILL_NCCL_TEST_ID";
/// A child's exit code when NCCL refused (not a failure of pipefill).
const REFUSED: i32 = 3;

/// In a child started by [`two_ranks`]: its rank and the id file; `None` in the parent.
pub fn child_rank() -> Option<(usize, PathBuf)> {
    let (rank, file) = (std::env::var(CHILD).ok()?, std::env::var(ID_FILE).ok()?);
    Some((rank.parse().expect("a rank"), PathBuf::from(file)))
}

/// Ends a child with the "NCCL refused" note and exit code (the parent passes with the note).
pub fn refused(e: &NcclError) -> ! {
    println!("NCCL refused: {e}");
    std::process::exit(REFUSED)
}

/// The NCCL unique id: made and written to `id_file` by rank 0, read from it by rank 1.
pub fn unique_id(rank: usize, id_file: &Path) -> UniqueId {
    if rank == 0 {
        let id = UniqueId::new().unwrap_or_else(|e| refused(&e));
        id.write(id_file).expect("write the id");
        id
    } else {
        UniqueId::wait_for(id_file, Duration::from_secs(60)).expect("the id from rank 0")
    }
}

/// This rank's NCCL peer of two; a refusal by NCCL ends the child with [`refused`].
pub fn open_or_refuse(gpu: &Arc<Gpu>, rank: usize, id: UniqueId) -> NcclPeer {
    NcclPeer::open(gpu, rank, 2, id).unwrap_or_else(|e| match e {
        PeerOpenError::Nccl(e) => refused(&e),
        other => panic!("rank {rank}: {other}"),
    })
}

/// Runs `test` of this executable as two ranks on GPU 0; their outputs, each exited 0. `None`
/// (with a note printed) without a GPU or where NCCL refuses.
///
/// Each child's stdout and stderr go to a file of its own (a pipe nobody reads would block a chatty
/// child once full); the files are read after both have ended. When one rank fails, the other is
/// given [`GRACE`] to end by itself and is then killed: a failed rank costs seconds, not the deadline.
pub fn two_ranks(test: &str) -> Option<Vec<String>> {
    gpu_or_skip(test)?;
    if !nccl_present() {
        println!("NCCL refused: {}", NcclError::NoLibrary);
        return None;
    }
    let dir = std::env::temp_dir().join(format!("pipefill-nccl-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let id_file = dir.join("nccl-id");
    let exe = std::env::current_exe().expect("this test's executable");
    let logs: Vec<PathBuf> = (0..2).map(|r| dir.join(format!("rank-{r}.log"))).collect();
    let mut children: Vec<_> = logs
        .iter()
        .enumerate()
        .map(|(rank, log)| {
            let out = File::create(log).expect("a rank's log file");
            let err = out.try_clone().expect("the log file twice");
            Command::new(&exe)
                .args(["--exact", test, "--include-ignored", "--nocapture"])
                .arg("--test-threads=1")
                .env(CHILD, rank.to_string())
                .env(ID_FILE, &id_file)
                .env("NCCL_MULTI_RANK_GPU_ENABLE", "1")
                .stdout(Stdio::from(out))
                .stderr(Stdio::from(err))
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let codes = wait_all(test, &mut children, GRACE);
    let outputs: Vec<String> = logs
        .iter()
        .map(|log| std::fs::read_to_string(log).unwrap_or_else(|e| format!("(no log: {e})")))
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    if let Some(stuck) = codes.iter().position(Option::is_none) {
        panic!(
            "{test}: rank {stuck} did not end (killed); outputs:\n{}",
            outputs.join("\n")
        );
    }
    if codes.contains(&Some(REFUSED)) {
        println!(
            "NCCL refused two ranks on one device; not run:\n{}",
            outputs.join("\n")
        );
        return None;
    }
    for (rank, (code, out)) in codes.iter().zip(&outputs).enumerate() {
        assert_eq!(*code, Some(0), "{test} rank {rank}:\n{out}");
    }
    Some(outputs)
}

/// How long the other rank may take to end once one rank has failed.
const GRACE: Duration = Duration::from_secs(10);

/// Waits up to 120 s for both children (and `grace` once one has failed); their exit codes,
/// `None` for a child that had to be killed.
pub fn wait_all(test: &str, children: &mut [Child], grace: Duration) -> [Option<i32>; 2] {
    let mut deadline = Instant::now() + Duration::from_secs(120);
    let mut codes = [None; 2];
    while codes.iter().any(Option::is_none) {
        for (c, code) in children.iter_mut().zip(codes.iter_mut()) {
            if code.is_none() {
                *code = c.try_wait().expect("wait").map(|s| s.code().unwrap_or(-1));
                if matches!(*code, Some(c) if c != 0) {
                    deadline = deadline.min(Instant::now() + grace);
                }
            }
        }
        if Instant::now() > deadline {
            eprintln!("{test}: a rank did not end in time; killing it");
            for (c, code) in children.iter_mut().zip(&codes) {
                if code.is_none() {
                    drop(c.kill());
                    drop(c.wait());
                }
            }
            return codes;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    codes
}
