#![warn(missing_docs)]
//! # pipefill-cuda
//!
//! The CUDA backend: the built-in layers (`pipefill-model`) run by the Rust kernels (`kernels/`,
//! compiled to PTX by this crate's `build.rs`, embedded as [`ptx`]) on an NVIDIA GPU, through
//! cudarc with the driver loaded at run time.
//!
//! Nothing here needs CUDA to build: the driver is loaded when first used, after checking it is
//! there ([`driver_present`]), and a machine without it gets [`CudaError::NoDriver`] or
//! [`CudaError::NoDevice`] (never a panic). The only thing to install is the NVIDIA driver.
//!
//! | module | what |
//! | --- | --- |
//! | [`device`] | discovery ([`probe`], [`device_count`]) and [`Gpu`]: a context per device, the PTX loaded once, kernels found lazily by name |
//! | [`module`] | loading the kernels: a matching cubin (`PIPEFILL_CUBIN`) first, the embedded PTX otherwise, the JIT's logs on a failure |
//! | [`inspect`] | what the backend finds here: driver, devices, NCCL, the libraries loaded, the kernels' JIT report (`pipefill device`) |
//! | [`tensor`] | [`DeviceTensor`]: a device buffer with a shape, the payload device stages exchange |
//! | [`launch`] | [`Launcher`]: one typed, size-checked launch per kernel of [`crate::ptx::entry`] |
//! | [`tc_launch`] | the tensor-core GEMMs and BF16 conversions as more [`Launcher`] methods (shared-memory limit raised once per kernel) |
//! | [`products`] | the three products of a layer in each precision (conversions around the BF16 ones) |
//! | [`precision`] | [`Precision`]: TF32 tensor cores (default), exact fp32 SIMT, or BF16 tensor cores for the device layers |
//! | [`layer`] | [`DeviceLinear`]: `Y = act(X W + b)` with gradients and optimizer state on the device |
//! | [`stage`] | [`CudaStage`]: a run of layers on a stream; device methods plus the runtime's `Stage` trait |
//! | [`streams`] | [`CudaStreams`]: the stream runtime's `Device` on CUDA (streams, events, timing marks), its stage and loss wrappers, [`DeviceTensor`] as the payload |
//! | [`loss`] | MSE and softmax cross-entropy on the device |
//! | [`nccl`] | [`NcclLink`]: NCCL point-to-point and all-reduce between processes, the id passed by MPI or a file |
//! | [`peer`] | [`NcclPeer`]: the per-rank stream runner's link between GPU ranks in separate processes (NCCL on one communication stream) |
//! | [`rank`] | [`CudaRank`]: one GPU rank in its own process: its stages, the per-rank runner, NCCL |
//! | [`timing`] | [`Span`]: device time between two timing events |
//! | [`profile`](mod@profile) | the per-layer F/I/W profile timed with events (`pipefill profile --backend cuda`) |
//! | [`overlap`] | one stage's F and another's B on two streams, alone and together (`pipefill bench overlap`) |
//! | [`skip`] | [`gpu_or_skip`]: how GPU tests and benches skip on machines without a GPU |
//! | [`ptx`] | the PTX `build.rs` compiled from `kernels/`, embedded, with its entry points |

pub mod device;
pub mod error;
pub mod inspect;
pub mod launch;
pub mod layer;
pub mod loss;
pub mod module;
pub mod nccl;
pub mod overlap;
pub mod peer;
pub mod precision;
pub mod products;
pub mod profile;
pub mod ptx;
pub mod rank;
pub mod skip;
pub mod stage;
pub mod streams;
pub mod tc_launch;
pub mod tensor;
pub mod timing;

pub use device::{device_count, driver_present, probe, DeviceInfo, Gpu};
pub use error::CudaError;
pub use launch::{Launcher, LinearDims};
pub use layer::DeviceLinear;
pub use loss::{loss_and_grad, DeviceTarget};
pub use module::{JitLog, ModuleSource};
pub use nccl::{NcclError, NcclLink, UniqueId};
pub use peer::{NcclPeer, PeerOpenError};
pub use precision::{Precision, UnknownPrecision};
pub use rank::{CudaRank, CudaRankError, RankModel};
pub use skip::{gpu_or_skip, SKIP_LINE};
pub use stage::{CudaStage, CudaStash};
pub use streams::{CudaLoss, CudaStreams, DeviceLoss, OnCudaStreams};
pub use tc_launch::TcElem;
pub use tensor::DeviceTensor;
pub use timing::Span;
