//! [`GradientMean`]: the data-parallel reduction of a stage's gradients over MPI, the runtime's
//! [`Reducer`](pipefill_host::runtime::Reducer) for one process per rank.

use std::mem::ManuallyDrop;
use std::thread::ThreadId;

use mpi::collective::{CommunicatorCollectives, SystemOperation};
use pipefill_host::runtime::StageError;

use super::{Comm, MpiError};

/// The mean of a stage's gradients over the replicas of one rank: an MPI all-reduce (sum) on the
/// communicator of that rank's processes (one per replica), divided by the replica count.
///
/// Every replica of a rank runs the same lowered list, so they reduce their stages in the same
/// order and the collectives pair up. MPI is initialised `Funneled`: only the thread that made
/// this value may reduce; another thread gets an error and touches nothing of MPI (dropped on
/// another thread, the communicator is leaked rather than freed there).
pub struct GradientMean {
    comm: ManuallyDrop<Comm>,
    owner: ThreadId,
}

// SAFETY: the communicator is touched only by `reduce` and `drop`, which both check first that
// they run on `owner`, the thread that created the value (the one that initialised MPI,
// `Funneled`); on any other thread `reduce` returns an error and `drop` leaks the communicator,
// so no other thread ever calls MPI through it.
unsafe impl Sync for GradientMean {}
// SAFETY: as for `Sync`.
unsafe impl Send for GradientMean {}

impl Drop for GradientMean {
    fn drop(&mut self) {
        if std::thread::current().id() == self.owner {
            // SAFETY: dropped once, here, and never used after.
            unsafe { ManuallyDrop::drop(&mut self.comm) }
        }
    }
}

impl GradientMean {
    /// The reduction over `comm`, the processes of one rank across replicas; call on the thread
    /// that initialised MPI.
    pub fn new(comm: Comm) -> Self {
        GradientMean {
            comm: ManuallyDrop::new(comm),
            owner: std::thread::current().id(),
        }
    }

    /// Leaves in `grads` the mean over replicas of every replica's `grads` (every replica calls
    /// this for the same stage, with buffers of the same lengths).
    pub fn reduce(&self, mut grads: Vec<&mut [f32]>) -> Result<(), StageError> {
        if std::thread::current().id() != self.owner {
            return Err(StageError::new(MpiError::WrongThread.to_string()));
        }
        let flat: Vec<f32> = grads.iter().flat_map(|g| g.iter().copied()).collect();
        let mut sum = vec![0.0f32; flat.len()];
        self.comm
            .raw()
            .all_reduce_into(&flat[..], &mut sum[..], SystemOperation::sum());
        let n = self.comm.size() as f32;
        let mut at = 0;
        for g in grads.iter_mut() {
            let len = g.len();
            for (dst, s) in g.iter_mut().zip(&sum[at..at + len]) {
                *dst = s / n;
            }
            at += len;
        }
        Ok(())
    }
}
