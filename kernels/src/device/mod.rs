//! The kernel bodies, written once against [`Grid`](crate::grid::Grid): the GPU entry points call them
//! with the PTX thread context, the host tests with an emulated block of OS threads.
//!
//! Every body is `unsafe`: it reads and writes through raw pointers whose sizes the launcher promises.
//! Each documents the buffers it touches (row-major `f32`), the grid it expects, and what it computes.
//! Null is allowed only where a pointer is documented as optional.

pub mod convert;
pub mod elementwise;
pub mod linear;
pub mod linear_tc;
pub mod reduce;
