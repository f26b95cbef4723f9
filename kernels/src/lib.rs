//! pipefill-kernels: layer and fused-activation kernels (placeholder until the kernels issue lands).
#![no_std]
