//! `examples/custom_device.rs`, checked: the embedder's own device and stage type train ZB-V to the
//! losses of `sequential_step`, step by step, and the loss goes down.

#[allow(dead_code)]
#[path = "../examples/custom_device.rs"]
mod example;

/// Tolerance: the pipelined step adds each stage's weight gradient in the schedule's microbatch
/// order (W passes), the sequential one in microbatch order; f32 sums of 8 terms in another order
/// differ by a few ulps, and the weights they update carry that into later steps.
const TOL: f32 = 1e-5;

#[test]
fn the_custom_device_trains_zbv_to_the_sequential_losses() {
    for ranks in [1, 2, 3] {
        let losses = example::train(ranks, 30).unwrap();
        for (i, (pipelined, sequential)) in losses.iter().enumerate() {
            assert!(
                (pipelined - sequential).abs() <= TOL * sequential.abs().max(1.0),
                "P={ranks} step {i}: {pipelined} vs sequential {sequential}"
            );
        }
        let (first, last) = (losses[0].1, losses[losses.len() - 1].1);
        assert!(
            last < 0.5 * first,
            "P={ranks}: loss {first} -> {last} did not fall"
        );
    }
}
