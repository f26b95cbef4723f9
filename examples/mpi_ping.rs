//! MPI smoke check (feature `mpi`): `mpirun -n 2 target/release/examples/mpi_ping` passes a tensor
//! from process 0 to process 1 and back, doubled, and checks the world size against its argument
//! (default 2). Prints `mpi_ping ok` on process 0; exits 2 on a world of another size.

use pipefill::mpi::World;
use pipefill_host::runtime::Tensor;

fn main() {
    let ranks: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2);
    let world = match World::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = world.expect_size(ranks) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let sent = match Tensor::new(vec![2, 3], vec![0.5, -1.0, 2.0, 1e-7, 3.25, -0.0]) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let result = match world.rank() {
        0 => {
            world.send_tensor(1, 7, &sent);
            world.recv_tensor(1, 8).map(|back| {
                let want: Vec<f32> = sent.data().iter().map(|v| v * 2.0).collect();
                back.shape() == sent.shape() && back.data() == want
            })
        }
        1 => world.recv_tensor(0, 7).and_then(|t| {
            let doubled: Vec<f32> = t.data().iter().map(|v| v * 2.0).collect();
            let back = Tensor::new(t.shape().to_vec(), doubled).map_err(|e| {
                pipefill::mpi::MpiError::BadMessage {
                    from: 0,
                    tag: 7,
                    reason: e.to_string(),
                }
            })?;
            world.send_tensor(0, 8, &back);
            Ok(true)
        }),
        _ => Ok(true),
    };
    world.barrier();
    match result {
        Ok(true) if world.rank() == 0 => println!("mpi_ping ok"),
        Ok(true) => {}
        Ok(false) => {
            eprintln!(
                "error: process {}: the tensor came back changed",
                world.rank()
            );
            world.abort(1);
        }
        Err(e) => {
            eprintln!("error: process {}: {e}", world.rank());
            world.abort(1);
        }
    }
}
