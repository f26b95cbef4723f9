//! NCCL between processes (one process per rank on GPU ranks): [`NcclLink`], a communicator bound
//! to one CUDA stream with point-to-point sends and receives (paired in a group where two ranks
//! exchange at once) and an all-reduce, and [`UniqueId`], the id every process of a communicator
//! must share, passed through MPI (its bytes) or, where there is no MPI, a file that rank 0 writes
//! and the others wait for.
//!
//! libnccl is loaded at run time (cudarc's `nccl` with `dynamic-loading`): nothing here needs CUDA
//! or NCCL to build, and a machine without libnccl gets [`NcclError::NoLibrary`], never a panic.
//!
//! The per-rank stream runner uses these through [`NcclPeer`](super::NcclPeer) (one rank's sends and
//! receives on one communication stream, in the order all ranks share), and
//! `train --backend cuda --launcher mpi` through [`CudaRank`](super::CudaRank).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::{result as nccl_result, Comm, Id, ReduceOp};

/// Bytes of an NCCL unique id.
pub const ID_BYTES: usize = 128;

/// Why an NCCL operation could not be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NcclError {
    /// libnccl cannot be loaded on this machine.
    #[error("no NCCL library found: libnccl.so cannot be loaded (install NCCL, e.g. the nvidia-nccl-cu12 wheel, and put it on LD_LIBRARY_PATH)")]
    NoLibrary,
    /// An NCCL call failed.
    #[error("NCCL {op} failed: {code}")]
    Call {
        /// What was being done (`"init rank 1 of 2"`, `"send to 1"`, ...).
        op: String,
        /// NCCL's result code.
        code: String,
    },
    /// The unique-id file could not be written or read, or does not hold an id.
    #[error("the NCCL id file `{path}`: {reason}")]
    IdFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// Rank 0 did not write the id file in time.
    #[error("no NCCL id in `{path}` after {seconds} s: did rank 0 start?")]
    IdTimeout {
        /// The file.
        path: PathBuf,
        /// Seconds waited.
        seconds: u64,
    },
    /// The communicator was aborted ([`NcclLink::abort`]); nothing more can be enqueued on it.
    #[error("NCCL {op}: the communicator was aborted after a failure on this rank")]
    Aborted {
        /// The operation refused.
        op: &'static str,
    },
    /// The NCCL library is older than 2.9, the first whose calls a CUDA graph can capture.
    #[error("NCCL {found} cannot be captured in a CUDA graph (--graph with --launcher mpi needs NCCL 2.9 or newer): install a newer NCCL (the nvidia-nccl-cu12 wheel), or drop --graph")]
    TooOldForGraphs {
        /// The version found, `major.minor.patch`.
        found: String,
    },
    /// Two buffers of an exchange or a reduction do not have the same length.
    #[error("NCCL {op}: buffers of {a} and {b} values")]
    Length {
        /// The operation.
        op: &'static str,
        /// One length.
        a: usize,
        /// The other.
        b: usize,
    },
}

/// Whether libnccl can be loaded here.
pub fn nccl_present() -> bool {
    // SAFETY: only tries to open the library by its usual names.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// The smallest NCCL version whose calls stream capture records into a CUDA graph (2.9.0, as
/// `ncclGetVersion` codes it: `major * 10000 + minor * 100 + patch` from 2.9 on).
pub const GRAPH_NCCL_VERSION: i32 = 20900;

/// The loaded NCCL's version code (`ncclGetVersion`), or [`NcclError::NoLibrary`].
pub fn nccl_version() -> Result<i32, NcclError> {
    if !nccl_present() {
        return Err(NcclError::NoLibrary);
    }
    nccl_result::get_nccl_version().map_err(call("get version"))
}

/// `major.minor.patch` of an `ncclGetVersion` code (`major * 1000 + minor * 100 + patch` before
/// 2.9, `major * 10000 + minor * 100 + patch` from 2.9 on).
pub fn version_name(code: i32) -> String {
    let major = if code >= 10000 {
        code / 10000
    } else {
        code / 1000
    };
    let rest = if code >= 10000 {
        code % 10000
    } else {
        code % 1000
    };
    format!("{major}.{}.{}", rest / 100, rest % 100)
}

/// Refuses an NCCL too old for graph capture ([`NcclError::TooOldForGraphs`]).
pub fn check_graph_version(code: i32) -> Result<(), NcclError> {
    if code < GRAPH_NCCL_VERSION {
        return Err(NcclError::TooOldForGraphs {
            found: version_name(code),
        });
    }
    Ok(())
}

fn call(op: impl Into<String>) -> impl FnOnce(nccl_result::NcclError) -> NcclError {
    move |e| NcclError::Call {
        op: op.into(),
        code: format!("{:?}", e.0),
    }
}

/// The id of one NCCL communicator: made by rank 0, given to every rank before
/// [`NcclLink::open`].
#[derive(Debug, Clone, Copy)]
pub struct UniqueId(Id);

impl UniqueId {
    /// A new id (on rank 0).
    pub fn new() -> Result<Self, NcclError> {
        if !nccl_present() {
            return Err(NcclError::NoLibrary);
        }
        Id::new().map(UniqueId).map_err(call("get unique id"))
    }

    /// Its bytes, to send to the other ranks (over MPI, or [`write`](UniqueId::write)).
    pub fn to_bytes(&self) -> [u8; ID_BYTES] {
        self.0.internal().map(|c| c as u8)
    }

    /// The id of `bytes` (what [`to_bytes`](UniqueId::to_bytes) gave), or `None` when they are not
    /// [`ID_BYTES`] long.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let raw: [u8; ID_BYTES] = bytes.try_into().ok()?;
        Some(UniqueId(Id::uninit(raw.map(|b| b as core::ffi::c_char))))
    }

    /// Writes the id to `path` atomically (a temporary file renamed into place), so a reader never
    /// sees half an id.
    pub fn write(&self, path: &Path) -> Result<(), NcclError> {
        let fail = |e: std::io::Error| NcclError::IdFile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, self.to_bytes()).map_err(fail)?;
        std::fs::rename(&tmp, path).map_err(fail)
    }

    /// Waits up to `timeout` for `path` to hold an id (written by [`write`](UniqueId::write)).
    pub fn wait_for(path: &Path, timeout: Duration) -> Result<Self, NcclError> {
        let start = Instant::now();
        loop {
            match std::fs::read(path) {
                Ok(bytes) => {
                    return UniqueId::from_bytes(&bytes).ok_or_else(|| NcclError::IdFile {
                        path: path.to_path_buf(),
                        reason: format!("{} bytes, an id has {ID_BYTES}", bytes.len()),
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(NcclError::IdFile {
                        path: path.to_path_buf(),
                        reason: e.to_string(),
                    })
                }
            }
            if start.elapsed() > timeout {
                return Err(NcclError::IdTimeout {
                    path: path.to_path_buf(),
                    seconds: timeout.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// One rank's NCCL communicator, its operations enqueued on one CUDA stream.
///
/// [`abort`](Self::abort) ends the communicator at once (`ncclCommAbort`): operations still
/// pending on it are abandoned, so a rank that failed does not stay blocked on sends and receives
/// its peers will never match; every later operation is [`NcclError::Aborted`].
pub struct NcclLink {
    comm: Option<Comm>,
    rank: usize,
    ranks: usize,
}

impl NcclLink {
    /// Joins the communicator `id` as `rank` of `ranks`, enqueuing on `stream` (every rank calls
    /// this at once; it returns when all have joined).
    pub fn open(
        stream: Arc<CudaStream>,
        rank: usize,
        ranks: usize,
        id: UniqueId,
    ) -> Result<Self, NcclError> {
        if !nccl_present() {
            return Err(NcclError::NoLibrary);
        }
        Comm::from_rank(stream, rank, ranks, id.0)
            .map(|comm| NcclLink {
                comm: Some(comm),
                rank,
                ranks,
            })
            .map_err(call(format!("init rank {rank} of {ranks}")))
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The communicator, unless it was aborted.
    fn comm(&self, op: &'static str) -> Result<&Comm, NcclError> {
        self.comm.as_ref().ok_or(NcclError::Aborted { op })
    }

    /// Whether [`abort`](Self::abort) has ended the communicator.
    pub fn aborted(&self) -> bool {
        self.comm.is_none()
    }

    /// Ends the communicator now (`ncclCommAbort`), abandoning whatever is pending on it; a no-op
    /// the second time. A failure of the abort itself is reported on stderr: there is nothing
    /// more to do about it (cudarc reports it by panicking in `Drop`, which is caught here).
    pub fn abort(&mut self) {
        if let Some(comm) = self.comm.take() {
            let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(comm)));
            if ended.is_err() {
                eprintln!("warning: ncclCommAbort failed; the communicator may leak");
            }
        }
    }

    fn peer(peer: usize) -> i32 {
        i32::try_from(peer).unwrap_or(i32::MAX)
    }

    /// Enqueues sending `data` to `peer` (matched, in order, by the peer's [`recv`](Self::recv)).
    pub fn send(&self, data: &CudaSlice<f32>, peer: usize) -> Result<(), NcclError> {
        self.comm("send")?
            .send(data, Self::peer(peer))
            .map_err(call(format!("send to {peer}")))
    }

    /// Enqueues receiving into `buf` from `peer`.
    pub fn recv(&self, buf: &mut CudaSlice<f32>, peer: usize) -> Result<(), NcclError> {
        self.comm("receive")?
            .recv(buf, Self::peer(peer))
            .map(|_| ())
            .map_err(call(format!("receive from {peer}")))
    }

    /// Enqueues sending BF16 bits `data` to `peer` as `ncclBfloat16` (2 bytes a value; matched by
    /// the peer's [`recv_bf16`](Self::recv_bf16)).
    pub fn send_bf16(&self, data: &CudaSlice<u16>, peer: usize) -> Result<(), NcclError> {
        // SAFETY: `half::bf16` is a `u16` bit pattern (same size, every pattern valid).
        let view =
            unsafe { data.transmute::<half::bf16>(data.len()) }.ok_or(NcclError::Length {
                op: "bf16 send",
                a: data.len(),
                b: 0,
            })?;
        self.comm("send")?
            .send(&view, Self::peer(peer))
            .map_err(call(format!("send (bf16) to {peer}")))
    }

    /// Enqueues receiving BF16 bits into `buf` from `peer` (`ncclBfloat16`).
    pub fn recv_bf16(&self, buf: &mut CudaSlice<u16>, peer: usize) -> Result<(), NcclError> {
        let n = buf.len();
        // SAFETY: as in `send_bf16`: NCCL writes `n` BF16 values, each a valid `u16`.
        let mut view = unsafe { buf.transmute_mut::<half::bf16>(n) }.ok_or(NcclError::Length {
            op: "bf16 receive",
            a: n,
            b: 0,
        })?;
        self.comm("receive")?
            .recv(&mut view, Self::peer(peer))
            .map(|_| ())
            .map_err(call(format!("receive (bf16) from {peer}")))
    }

    /// Enqueues a send of `data` to `peer` and a receive into `buf` from it as one NCCL group, so
    /// two ranks that exchange at once cannot block each other (both buffers of one length, else
    /// [`NcclError::Length`]).
    pub fn exchange(
        &self,
        data: &CudaSlice<f32>,
        buf: &mut CudaSlice<f32>,
        peer: usize,
    ) -> Result<(), NcclError> {
        if data.len() != buf.len() {
            return Err(NcclError::Length {
                op: "exchange",
                a: data.len(),
                b: buf.len(),
            });
        }
        nccl_result::group_start().map_err(call("group start"))?;
        let inner = self.send(data, peer).and_then(|()| self.recv(buf, peer));
        // The group is closed whatever happened inside it.
        let end = nccl_result::group_end().map_err(call("group end"));
        inner.and(end.map(|_| ()))
    }

    /// Enqueues the sum over ranks of every rank's `buf`, left in `buf` on every rank.
    pub fn all_reduce_sum(&self, buf: &mut CudaSlice<f32>) -> Result<(), NcclError> {
        self.comm("all-reduce")?
            .all_reduce_in_place(buf, &ReduceOp::Sum)
            .map(|_| ())
            .map_err(call("all-reduce"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_before_2_9_is_refused_for_graphs_naming_its_version() {
        assert_eq!(version_name(2804), "2.8.4");
        assert_eq!(version_name(22105), "2.21.5");
        assert_eq!(version_name(22703), "2.27.3");
        assert_eq!(version_name(21805), "2.18.5");
        let e = check_graph_version(2804).unwrap_err().to_string();
        assert!(e.contains("NCCL 2.8.4") && e.contains("2.9"), "{e}");
        assert!(check_graph_version(20900).is_ok());
        assert!(check_graph_version(22105).is_ok());
    }

    #[test]
    fn an_id_survives_its_bytes_and_its_file() {
        let raw: Vec<u8> = (0..ID_BYTES as u32).map(|i| (i * 7 % 256) as u8).collect();
        let id = UniqueId::from_bytes(&raw).expect("128 bytes");
        assert_eq!(id.to_bytes().to_vec(), raw);
        assert!(UniqueId::from_bytes(&raw[..100]).is_none());
        let dir = std::env::temp_dir().join(format!("pipefill-nccl-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("id");
        id.write(&path).unwrap();
        let back = UniqueId::wait_for(&path, Duration::from_secs(1)).unwrap();
        assert_eq!(back.to_bytes().to_vec(), raw);
        std::fs::write(&path, b"short").unwrap();
        assert!(matches!(
            UniqueId::wait_for(&path, Duration::from_secs(1)),
            Err(NcclError::IdFile { .. })
        ));
        let missing = dir.join("none");
        assert!(matches!(
            UniqueId::wait_for(&missing, Duration::from_millis(50)),
            Err(NcclError::IdTimeout { .. })
        ));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn without_libnccl_a_new_id_is_no_library_not_a_panic() {
        if !nccl_present() {
            assert_eq!(UniqueId::new().unwrap_err(), NcclError::NoLibrary);
        }
    }
}
