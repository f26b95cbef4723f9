//! The calling thread's CPU time: how long it has run on a core, not counting the time it waited
//! or was descheduled. Read where wall time would mix a call's own cost with other work on the
//! machine ([`crate::profile::TimeSource::ThreadCpu`]).

/// Seconds of CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`); `None` where the
/// clock cannot be read.
///
/// ```
/// let start = pipefill_host::cpu_time::thread_cpu_seconds();
/// let mut x = 0u64;
/// for i in 0..1_000_000u64 {
///     x = x.wrapping_mul(31).wrapping_add(i);
/// }
/// std::hint::black_box(x);
/// if let (Some(a), Some(b)) = (start, pipefill_host::cpu_time::thread_cpu_seconds()) {
///     assert!(b >= a);
/// }
/// ```
pub fn thread_cpu_seconds() -> Option<f64> {
    ::cpu_time::ThreadTime::try_now()
        .ok()
        .map(|t| t.as_duration().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::thread_cpu_seconds;
    use std::time::{Duration, Instant};

    #[test]
    #[cfg(unix)]
    fn counts_work_and_not_sleep() {
        let a = thread_cpu_seconds().expect("the thread CPU clock reads on Unix");
        std::thread::sleep(Duration::from_millis(50));
        let b = thread_cpu_seconds().expect("reads again");
        // Sleeping uses (almost) no CPU time.
        assert!(
            b - a < 0.02,
            "slept 50 ms, the thread's CPU clock moved {} s",
            b - a
        );
        let wall = Instant::now();
        let mut x = 1u64;
        while wall.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let c = thread_cpu_seconds().expect("reads again");
        // Spinning uses CPU time, at most the wall time it took (plus clock granularity).
        assert!(c > b, "spun 30 ms, the thread's CPU clock did not move");
        assert!(c - b <= wall.elapsed().as_secs_f64() + 0.005);
    }
}
