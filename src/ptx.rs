//! The PTX compiled from `kernels/` by `build.rs` (to be written by the kernels issue).
