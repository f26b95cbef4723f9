//! How busy the machine is when `train` starts: the load average and the runnable threads, read
//! from `/proc` (Linux; elsewhere nothing is known and nothing is said). When other work and the
//! run's ranks together want more cores than there are, the ranks time-share and the measured
//! bubbles include time they were ready but not running: `train` says so on stderr.

use serde::Serialize;

/// The machine's load as `train` found it before its steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Load {
    /// The load average over the last minute (`/proc/loadavg`).
    pub load_average: f64,
    /// Threads runnable at the moment of reading, this process's reading thread not counted
    /// (`procs_running` of `/proc/stat`).
    pub runnable: usize,
}

impl Load {
    /// The load now, or `None` where `/proc` cannot be read.
    pub fn sample() -> Option<Load> {
        let loadavg = std::fs::read_to_string("/proc/loadavg").ok()?;
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        Load::parse(&loadavg, &stat)
    }

    /// The load from the text of `/proc/loadavg` and `/proc/stat`.
    fn parse(loadavg: &str, stat: &str) -> Option<Load> {
        let load_average = loadavg.split_whitespace().next()?.parse().ok()?;
        let running: usize = stat
            .lines()
            .find_map(|l| l.strip_prefix("procs_running"))?
            .trim()
            .parse()
            .ok()?;
        Some(Load {
            load_average,
            runnable: running.saturating_sub(1),
        })
    }

    /// The work already on the machine, in cores: the larger of the load average and the
    /// runnable threads.
    pub fn others(&self) -> f64 {
        self.load_average.max(self.runnable as f64)
    }

    /// `true` when that work and `ranks` busy ranks want more than `cores` cores.
    pub fn loaded(&self, cores: usize, ranks: usize) -> bool {
        self.others() + ranks as f64 > cores as f64
    }

    /// The one-line warning for a loaded machine, `None` when the ranks fit beside the other work.
    pub fn warning(&self, cores: usize, ranks: usize) -> Option<String> {
        self.loaded(cores, ranks).then(|| {
            format!(
                "warning: the machine is busy: load average {:.2} (1 min) and {} other runnable \
                 threads on {cores} cores, beside {ranks} ranks: the measured bubbles include time \
                 the ranks were ready but not running (the 'descheduled' column, hatched in the SVG)",
                self.load_average, self.runnable
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Load;

    const STAT: &str = "cpu  1 2 3 4\nctxt 99\nprocs_running 3\nprocs_blocked 0\n";

    #[test]
    fn reads_the_load_average_and_the_runnable_threads() {
        let l = Load::parse("1.50 0.80 0.40 3/900 12345\n", STAT).unwrap();
        // This process's reading thread is one of the 3 running.
        assert_eq!(
            l,
            Load {
                load_average: 1.5,
                runnable: 2
            }
        );
        assert_eq!(l.others(), 2.0);
        assert_eq!(Load::parse("", STAT), None);
        assert_eq!(Load::parse("1.0 1 1", "cpu 1\n"), None);
    }

    #[test]
    fn warns_only_when_the_ranks_do_not_fit_beside_the_other_work() {
        let l = Load::parse("0.90 0.5 0.5 1/9 1\n", "procs_running 2\n").unwrap();
        // One core's worth of other work: 2 ranks fit on 4 cores, 4 ranks do not.
        assert!(l.warning(4, 2).is_none());
        let w = l.warning(4, 4).unwrap();
        assert!(
            w.starts_with("warning: the machine is busy: load average 0.90 (1 min) and 1 other")
        );
        assert!(
            w.contains("on 4 cores, beside 4 ranks") && !w.contains('\n'),
            "{w}"
        );
        let quiet = Load::parse("0.00 0 0 1/9 1\n", "procs_running 1\n").unwrap();
        assert!(quiet.warning(2, 2).is_none());
    }
}
