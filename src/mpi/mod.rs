//! One process per rank over MPI (feature `mpi`): the MPI world of a `mpirun` launch and the
//! messages between its processes, through the `mpi` crate (rsmpi) against the system's MPI library
//! (OpenMPI or MPICH); [`MpiTransport`], the runtime's transport between processes; and
//! [`GradientMean`], the data-parallel all-reduce of a stage's gradients across replicas.
//!
//! A run of `P` ranks and `D` replicas has `P * D` processes: process `w` is rank `w % P` of
//! replica `w / P` ([`Place`]). The pipeline's messages travel on the communicator of the replica
//! (split by replica, ordered by rank); the gradients on the communicator of the rank (split by
//! rank, ordered by replica).

mod comm;
mod reduce;
mod transport;

pub use comm::Comm;
pub use reduce::GradientMean;
pub use transport::MpiTransport;

use std::ops::Deref;

use mpi::environment::Universe;
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
    /// The world has another number of processes than the run has ranks times replicas.
    #[error("{}", world_size_text(*world, *ranks, *replicas))]
    WorldSize {
        /// Processes in the world.
        world: usize,
        /// Ranks of a pipeline.
        ranks: usize,
        /// Data-parallel replicas of the pipeline.
        replicas: usize,
    },
    /// MPI did not make the sub-communicator asked for.
    #[error("MPI could not split the world by {by} {color}")]
    Split {
        /// What the world was split by (`replica` or `rank`).
        by: &'static str,
        /// This process's value of it.
        color: usize,
    },
    /// A call that only the thread that initialised MPI may make came from another thread.
    #[error("MPI was called from a thread other than the one that initialised it")]
    WrongThread,
}

fn world_size_text(world: usize, ranks: usize, replicas: usize) -> String {
    if replicas == 1 {
        format!(
            "the MPI world has {world} processes for {ranks} ranks: one process per rank is needed"
        )
    } else {
        format!(
            "the MPI world has {world} processes for {ranks} ranks x {replicas} replicas: one \
             process per rank of each replica ({} in all) is needed",
            ranks * replicas
        )
    }
}

/// Where a process sits in a run of `ranks` ranks and `replicas` replicas: process `world` is rank
/// `world % ranks` of replica `world / ranks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The process's index in the world.
    pub world: usize,
    /// Its pipeline rank.
    pub rank: usize,
    /// Its data-parallel replica.
    pub replica: usize,
    /// Ranks of a pipeline, `P`.
    pub ranks: usize,
    /// Replicas, `D`.
    pub replicas: usize,
}

impl Place {
    /// The place of process `world` (`ranks` at least 1).
    pub fn of(world: usize, ranks: usize, replicas: usize) -> Self {
        let ranks = ranks.max(1);
        Place {
            world,
            rank: world % ranks,
            replica: world / ranks,
            ranks,
            replicas,
        }
    }

    /// The world index of `rank` of `replica`.
    pub fn process(&self, replica: usize, rank: usize) -> usize {
        replica * self.ranks + rank
    }

    /// `rank R`, or `rank R of replica D (process W)` when there are replicas: how errors name it.
    pub fn name(&self) -> String {
        if self.replicas > 1 {
            format!(
                "rank {} of replica {} (process {})",
                self.rank, self.replica, self.world
            )
        } else {
            format!("rank {}", self.rank)
        }
    }
}

/// The MPI world of this process: MPI initialised at [`World::init`], finalised on drop. It
/// dereferences to the world's [`Comm`].
pub struct World {
    // Dropping the universe finalises MPI: it must outlive every use of `comm`.
    comm: Comm,
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
            comm: Comm::new(universe.world()),
            universe,
        })
    }

    /// Refuses a world whose size is not `ranks * replicas` ([`MpiError::WorldSize`]).
    pub fn expect_size(&self, ranks: usize, replicas: usize) -> Result<(), MpiError> {
        match self.size() {
            world if world == ranks * replicas => Ok(()),
            world => Err(MpiError::WorldSize {
                world,
                ranks,
                replicas,
            }),
        }
    }

    /// The communicator of this process's replica (ranks in pipeline order) and, with more than
    /// one replica, that of its rank (replicas in order). Every process must call this at once.
    pub fn split(&self, place: &Place) -> Result<(Comm, Option<Comm>), MpiError> {
        let pipe = self.comm.split(place.replica, place.rank, "replica")?;
        // Every process takes part in a split, so all split by rank or none does.
        let grads = if place.replicas > 1 {
            Some(self.comm.split(place.rank, place.replica, "rank")?)
        } else {
            None
        };
        Ok((pipe, grads))
    }

    /// Makes the buffer of [`Comm::send_buffered`] at least `bytes` long (MPI's attached buffer;
    /// each message also takes MPI's per-message overhead in it).
    pub fn reserve_send_buffer(&mut self, bytes: usize) {
        if self.universe.buffer_size() < bytes {
            self.universe.set_buffer_size(bytes);
        }
    }
}

impl Deref for World {
    type Target = Comm;

    fn deref(&self) -> &Comm {
        &self.comm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_w_is_rank_w_mod_p_of_replica_w_div_p() {
        let p = Place::of(5, 2, 3);
        assert_eq!((p.rank, p.replica), (1, 2));
        assert_eq!(p.process(p.replica, p.rank), 5);
        assert_eq!(p.name(), "rank 1 of replica 2 (process 5)");
        assert_eq!(Place::of(1, 2, 1).name(), "rank 1");
        let e = MpiError::WorldSize {
            world: 3,
            ranks: 2,
            replicas: 2,
        };
        assert!(e.to_string().contains("2 ranks x 2 replicas"), "{e}");
    }
}
