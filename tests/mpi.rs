//! MPI (feature `mpi`): two processes under `mpirun` pass a tensor there and back, and a world of
//! the wrong size is refused. Needs `mpirun` (OpenMPI or MPICH) on the path; `.ci/run` installs it.
#![cfg(feature = "mpi")]

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/examples/mpi_ping`, built by `cargo test` beside the test binaries.
fn example() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_pipefill"));
    bin.parent()
        .expect("target folder")
        .join("examples/mpi_ping")
}

/// `mpirun -n N mpi_ping ARG`: exit code, stdout, stderr. Root is allowed (CI runs as root).
fn mpirun(n: usize, arg: &str) -> (i32, String, String) {
    let out = Command::new("mpirun")
        .args(["--oversubscribe", "-n", &n.to_string()])
        .arg(example())
        .arg(arg)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .expect("run mpirun (install OpenMPI: see .ci/run)");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn two_processes_pass_a_tensor_there_and_back() {
    let (code, out, err) = mpirun(2, "2");
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("mpi_ping ok"), "{out}\n{err}");
}

#[test]
fn a_world_of_another_size_is_refused() {
    let (code, out, err) = mpirun(2, "3");
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(
        err.contains("the MPI world has 2 processes for 3 ranks"),
        "{out}\n{err}"
    );
}
