//! # pagewise-eval: experiments that reproduce each paper's evaluation
//!
//! Each experiment compares a Pagewise system with the baselines its paper used, every
//! configuration in the same run with repetitions interleaved, and reports ratios between
//! configurations measured in that run. `pagewise eval NAME [--quick|--full]` runs one;
//! results go to `results/NAME/` in quick mode and `results/NAME-full/` in full mode
//! (`result.json` with a `summary` of named figures, `table.md`, `plot.svg`);
//! `pagewise eval report` renders them into `docs/FIGURES.md` ([`figures`]), headlines
//! ([`headlines`]) first.

pub mod experiments;
pub mod figures;
pub mod harness;
pub mod headlines;
pub mod net;
pub mod paging;
pub mod programs;
pub mod report;
pub mod sample;
pub mod stats;

pub use harness::{interleave, run_experiment, run_experiment_on, Context, Experiment, HostMemory, Mode};
pub use report::{Censored, Plot, Report, Table};
pub use stats::{ratio, Latency, Summary};

/// Every experiment, in the order `pagewise eval all` runs them.
pub fn experiments() -> Vec<&'static dyn Experiment> {
    experiments::all()
}

/// Look an experiment up by name.
pub fn find(name: &str) -> Option<&'static dyn Experiment> {
    experiments().into_iter().find(|e| e.name() == name)
}

/// Sizes in bytes as people read them.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn human_bytes_reads_well() {
        assert_eq!(super::human_bytes(64 << 20), "64 MiB");
        assert_eq!(super::human_bytes(1536 << 20), "1.5 GiB");
        assert_eq!(super::human_bytes(100), "100 B");
    }

    #[test]
    fn experiment_names_are_unique() {
        let names: Vec<&str> = super::experiments().iter().map(|e| e.name()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
    }
}
