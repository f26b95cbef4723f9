//! One process per rank over MPI (feature `mpi`): the MPI world of a `mpirun` launch and the
//! point-to-point moves of tensors between its processes, through the `mpi` crate (rsmpi) against
//! the system's MPI library (OpenMPI or MPICH).
//!
//! A tensor crosses as two messages with the same tag, its shape (`u64`s) then its values (`f32`);
//! MPI keeps messages of one sender, receiver and tag in order, so the pair cannot be split.

use mpi::environment::Universe;
use mpi::point_to_point::{Destination, Source};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::Threading;
use pipefill_host::runtime::Tensor;

/// An error of the MPI front end.
#[derive(Debug, thiserror::Error)]
pub enum MpiError {
    /// MPI was initialised already in this process (it can be only once).
    #[error("MPI is already initialised in this process")]
    AlreadyInitialized,
    /// The MPI library cannot give the thread support asked for.
    #[error("the MPI library gives thread support {got:?}, {wanted:?} is needed")]
    Threading {
        /// What was asked for.
        wanted: Threading,
        /// What the library gives.
        got: Threading,
    },
    /// The world has another number of processes than the run has ranks.
    #[error(
        "the MPI world has {world} processes for {ranks} ranks: one process per rank is needed"
    )]
    WorldSize {
        /// Processes in the world.
        world: usize,
        /// Ranks of the run.
        ranks: usize,
    },
    /// A received message is not what a tensor's send makes.
    #[error("message from process {from} (tag {tag}): {reason}")]
    BadMessage {
        /// The sender.
        from: usize,
        /// The tag.
        tag: i32,
        /// What is wrong.
        reason: String,
    },
}

/// The MPI world of this process: MPI initialised at [`World::init`], finalised on drop.
pub struct World {
    // Dropping the universe finalises MPI: it must outlive every use of `comm`.
    comm: SimpleCommunicator,
    _universe: Universe,
}

impl World {
    /// Initialises MPI (calls come from one thread at a time: `Serialized`).
    pub fn init() -> Result<Self, MpiError> {
        let wanted = Threading::Serialized;
        let (universe, got) =
            mpi::initialize_with_threading(wanted).ok_or(MpiError::AlreadyInitialized)?;
        if got < wanted {
            return Err(MpiError::Threading { wanted, got });
        }
        Ok(World {
            comm: universe.world(),
            _universe: universe,
        })
    }

    /// This process's rank in the world.
    pub fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    /// Processes in the world.
    pub fn size(&self) -> usize {
        self.comm.size() as usize
    }

    /// Refuses a world whose size is not `ranks` ([`MpiError::WorldSize`]).
    pub fn expect_size(&self, ranks: usize) -> Result<(), MpiError> {
        match self.size() {
            world if world == ranks => Ok(()),
            world => Err(MpiError::WorldSize { world, ranks }),
        }
    }

    /// Sends `tensor` to process `to` with `tag` (blocking until MPI holds the buffers).
    pub fn send_tensor(&self, to: usize, tag: i32, tensor: &Tensor) {
        let shape: Vec<u64> = tensor.shape().iter().map(|&d| d as u64).collect();
        let p = self.comm.process_at_rank(to as i32);
        p.send_with_tag(&shape[..], tag);
        p.send_with_tag(tensor.data(), tag);
    }

    /// Receives the tensor that process `from` sends with `tag`.
    pub fn recv_tensor(&self, from: usize, tag: i32) -> Result<Tensor, MpiError> {
        let p = self.comm.process_at_rank(from as i32);
        let (shape, _) = p.receive_vec_with_tag::<u64>(tag);
        let (data, _) = p.receive_vec_with_tag::<f32>(tag);
        let bad = |reason: String| MpiError::BadMessage { from, tag, reason };
        let shape = shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| bad(format!("dimension {d} is too large"))))
            .collect::<Result<Vec<_>, _>>()?;
        Tensor::new(shape, data).map_err(|e| bad(e.to_string()))
    }

    /// Waits until every process reaches this call.
    pub fn barrier(&self) {
        mpi::collective::CommunicatorCollectives::barrier(&self.comm);
    }

    /// Ends every process of the world with `code` (a failed rank takes the job down, no process
    /// hangs).
    pub fn abort(&self, code: i32) -> ! {
        self.comm.abort(code)
    }
}
