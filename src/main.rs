//! The `pipefill` command line. All the work is in the library; see `pipefill --help`.

fn main() {
    restore_default_sigpipe();
    pipefill::alloc::keep_freed_memory();
    std::process::exit(pipefill::cli::main());
}

/// Rust ignores SIGPIPE, so `pipefill ... | head` would panic on the closed pipe; restore the default
/// (end quietly), as command-line tools do.
#[cfg(unix)]
fn restore_default_sigpipe() {
    // SAFETY: called first thing in `main`, before any thread exists; SIG_DFL is a valid handler.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn restore_default_sigpipe() {}
