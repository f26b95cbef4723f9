//! Compiles `kernels/` to PTX (placeholder until the kernels issue lands).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
