//! The `pipefill` command line. All the work is in the library; see `pipefill --help`.

fn main() {
    std::process::exit(pipefill::cli::main());
}
