//! One process per rank over MPI (feature `mpi`): the MPI world of a `mpirun` launch and the
//! messages between its processes, through the `mpi` crate (rsmpi) against the system's MPI library
//! (OpenMPI or MPICH); [`MpiTransport`], the runtime's transport between processes.

mod transport;

pub use transport::MpiTransport;

use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::point_to_point::{Destination, Source};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::Threading;

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
}

/// The MPI world of this process: MPI initialised at [`World::init`], finalised on drop.
pub struct World {
    // Dropping the universe finalises MPI: it must outlive every use of `comm`.
    comm: SimpleCommunicator,
    universe: Universe,
}

impl World {
    /// Initialises MPI (MPI is called from the main thread only: `Funneled`).
    pub fn init() -> Result<Self, MpiError> {
        let wanted = Threading::Funneled;
        let (universe, got) =
            mpi::initialize_with_threading(wanted).ok_or(MpiError::AlreadyInitialized)?;
        if got < wanted {
            return Err(MpiError::Threading { wanted, got });
        }
        Ok(World {
            comm: universe.world(),
            universe,
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

    /// Sends `values` to process `to` with `tag` (blocking until MPI holds the buffer).
    pub fn send_slice<T: Equivalence>(&self, to: usize, tag: i32, values: &[T]) {
        self.comm
            .process_at_rank(to as i32)
            .send_with_tag(values, tag);
    }

    /// Receives the values that process `from` sends with `tag`.
    pub fn recv_vec<T: Equivalence>(&self, from: usize, tag: i32) -> Vec<T> {
        self.comm
            .process_at_rank(from as i32)
            .receive_vec_with_tag::<T>(tag)
            .0
    }

    /// Sends `values` to process `to` with `tag` through the send buffer
    /// ([`reserve_send_buffer`](World::reserve_send_buffer)): returns at once, whether or not the
    /// receiver is waiting, so two ranks that send to each other cannot block each other.
    pub fn send_buffered<T: Equivalence>(&self, to: usize, tag: i32, values: &[T]) {
        self.comm
            .process_at_rank(to as i32)
            .buffered_send_with_tag(values, tag);
    }

    /// Makes the buffer of [`send_buffered`](World::send_buffered) at least `bytes` long (MPI's
    /// attached buffer; each message also takes MPI's per-message overhead in it).
    pub fn reserve_send_buffer(&mut self, bytes: usize) {
        if self.universe.buffer_size() < bytes {
            self.universe.set_buffer_size(bytes);
        }
    }

    /// The largest of every process's `value` (each process calls this with its own).
    pub fn max_over_world(&self, value: u64) -> u64 {
        let mut out = 0u64;
        mpi::collective::CommunicatorCollectives::all_reduce_into(
            &self.comm,
            &value,
            &mut out,
            mpi::collective::SystemOperation::max(),
        );
        out
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
