//! [`Comm`]: one MPI communicator (the world, a replica's pipeline or a rank's replicas) and the
//! messages this crate sends on it.

use mpi::datatype::Equivalence;
use mpi::point_to_point::{Destination, Source};
use mpi::topology::{Color, Communicator, SimpleCommunicator};

use super::MpiError;

/// An MPI communicator; process indices are ranks within it.
pub struct Comm {
    comm: SimpleCommunicator,
}

impl Comm {
    pub(super) fn new(comm: SimpleCommunicator) -> Self {
        Comm { comm }
    }

    /// The communicator of the processes that pass the same `color`, ordered by `key` (every
    /// process of this one must call it at once).
    pub(super) fn split(
        &self,
        color: usize,
        key: usize,
        by: &'static str,
    ) -> Result<Comm, MpiError> {
        let split = MpiError::Split { by, color };
        let c = i32::try_from(color).map_err(|_| MpiError::Split { by, color })?;
        let k = i32::try_from(key).map_err(|_| MpiError::Split { by, color })?;
        self.comm
            .split_by_color_with_key(Color::with_value(c), k)
            .map(Comm::new)
            .ok_or(split)
    }

    pub(super) fn raw(&self) -> &SimpleCommunicator {
        &self.comm
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    /// Processes in the communicator.
    pub fn size(&self) -> usize {
        self.comm.size() as usize
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
    /// ([`World::reserve_send_buffer`](super::World::reserve_send_buffer)): returns at once,
    /// whether or not the receiver is waiting, so two ranks that send to each other cannot block
    /// each other.
    pub fn send_buffered<T: Equivalence>(&self, to: usize, tag: i32, values: &[T]) {
        self.comm
            .process_at_rank(to as i32)
            .buffered_send_with_tag(values, tag);
    }

    /// The largest of every process's `value` (each process calls this with its own).
    pub fn max_over(&self, value: u64) -> u64 {
        let mut out = 0u64;
        mpi::collective::CommunicatorCollectives::all_reduce_into(
            &self.comm,
            &value,
            &mut out,
            mpi::collective::SystemOperation::max(),
        );
        out
    }

    /// Process `root`'s `bytes`, copied into every process's `bytes` (all pass buffers of one
    /// length; every process must call this at once).
    pub fn broadcast(&self, root: usize, bytes: &mut [u8]) {
        mpi::collective::Root::broadcast_into(&self.comm.process_at_rank(root as i32), bytes);
    }

    /// This process's index among the processes of its node: from the launcher's environment
    /// (`OMPI_COMM_WORLD_LOCAL_RANK` under Open MPI, `MPI_LOCALRANKID` under MPICH,
    /// `SLURM_LOCALID` under `srun`), else from an MPI shared-memory split of this communicator
    /// (which every process must then call at once: the variables are set for all or none).
    pub fn local_rank(&self) -> usize {
        let from_env = [
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "MPI_LOCALRANKID",
            "SLURM_LOCALID",
        ]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse::<usize>().ok());
        from_env.unwrap_or_else(|| {
            let node = self.comm.split_shared(self.comm.rank());
            node.rank() as usize
        })
    }

    /// Waits until every process reaches this call.
    pub fn barrier(&self) {
        mpi::collective::CommunicatorCollectives::barrier(&self.comm);
    }

    /// Ends every process of the job with `code` (a failed rank takes the job down, no process
    /// hangs).
    pub fn abort(&self, code: i32) -> ! {
        self.comm.abort(code)
    }
}
