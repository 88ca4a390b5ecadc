//! The headline figures: one line per goal the project set itself, in one place.
//!
//! Each names the experiment and the `summary` key of its `result.json`, the goal and where it
//! was set (the issue). `docs/FIGURES.md` opens with them (`pagewise eval report`): this run's
//! value with its interval, whether the goal is met, and the command that reproduces it. An
//! experiment that does not exist yet, or did not run, or a key its result lacks, is shown as
//! not measured, never filled in.
//!
//! A new experiment with a goal adds its line here. The interval of a value is read from the
//! same summary by convention: `KEY_ci95_low`/`KEY_ci95_high` (a 95% interval of a median, as
//! [`crate::stats::median_ci95`] gives), else `KEY_min`/`KEY_max` (the range over repetitions);
//! `KEY_censored` marks a bound ([`crate::Censored`]).

/// What a headline must reach.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Goal {
    /// The value must be at most this.
    AtMost(f64),
    /// The value must be at least this.
    AtLeast(f64),
    /// The value must lie in `[low, high]`.
    Between(f64, f64),
    /// Reported for what it says; no goal was set.
    Report,
}

/// Whether a value meets its goal, as far as the run can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    /// The value is a bound on the wrong side of the goal: the run cannot tell.
    Unknown,
    /// No goal.
    NoGoal,
}

impl Goal {
    /// Whether `v` (exact) meets the goal; always for [`Goal::Report`].
    pub fn holds(self, v: f64) -> bool {
        match self {
            Goal::AtMost(x) => v <= x,
            Goal::AtLeast(x) => v >= x,
            Goal::Between(lo, hi) => (lo..=hi).contains(&v),
            Goal::Report => true,
        }
    }

    /// The verdict on `value`, which may be a bound: a lower bound (the true value is at least
    /// `value`) settles an "at most" goal only when it already misses it, and so on.
    pub fn verdict(self, value: f64, censored: Option<crate::Censored>) -> Verdict {
        use crate::Censored::*;
        if self == Goal::Report {
            return Verdict::NoGoal;
        }
        if value.is_nan() {
            return Verdict::Unknown;
        }
        let holds = self.holds(value);
        // Which way the true value may lie from `value`: up (lower bound), down, or anywhere.
        let settled = match (censored, self) {
            (None, _) => true,
            (Some(Unknown), _) => false,
            (Some(LowerBound), Goal::AtMost(_)) | (Some(UpperBound), Goal::AtLeast(_)) => !holds,
            (Some(LowerBound), Goal::AtLeast(_)) | (Some(UpperBound), Goal::AtMost(_)) => holds,
            (Some(_), _) => false,
        };
        match (settled, holds) {
            (false, _) => Verdict::Unknown,
            (true, true) => Verdict::Met,
            (true, false) => Verdict::Missed,
        }
    }

    /// The goal as a reader writes it: `≤ 1.15`, `≥ 0.98`, `0.90–1.10`, `—`.
    pub fn text(self) -> String {
        match self {
            Goal::AtMost(x) => format!("≤ {}", trim(x)),
            Goal::AtLeast(x) => format!("≥ {}", trim(x)),
            Goal::Between(lo, hi) => format!("{}–{}", trim(lo), trim(hi)),
            Goal::Report => "— (reported)".into(),
        }
    }
}

/// A goal's number without trailing zeros (1.15, 0.9, 0).
fn trim(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// One headline figure.
#[derive(Clone, Copy, Debug)]
pub struct Headline {
    /// The system it is about, as the README names them.
    pub system: &'static str,
    /// `pagewise eval NAME`.
    pub experiment: &'static str,
    /// The key of the experiment's `summary`.
    pub key: &'static str,
    pub goal: Goal,
    /// What the figure says, in a few words.
    pub what: &'static str,
    /// Where the goal was set.
    pub source: &'static str,
}

const fn h(
    system: &'static str,
    experiment: &'static str,
    key: &'static str,
    goal: Goal,
    what: &'static str,
    source: &'static str,
) -> Headline {
    Headline { system, experiment, key, goal, what, source }
}

const HPS: &str = "HPS";
const PER_DATA: &str = "per-data hugepages";
const RECLAIM: &str = "reclaim";
const DLM: &str = "DLM";

/// Every headline, by system. Goals from the issues (`issues show N`).
#[rustfmt::skip]
pub const HEADLINES: &[Headline] = &[
    h(HPS, "thp-baseline", "thp_vs_4k_1gib", Goal::Report, "hugepages vs 4 KiB pages, pointer chasing at 1 GiB: the TLB effect every HPS figure rests on", "issue 2"),
    h(HPS, "hps-micro", "hps_vs_thp_throughput_min", Goal::AtLeast(0.98), "HPS throughput vs THP, worst access pattern", "issue 4"),
    h(HPS, "hps-micro", "hps_vs_thp_rss_increase_max", Goal::AtMost(0.05), "HPS memory increase over no hugepages, as a share of THP's, worst pattern", "issue 4"),
    h(HPS, "hps-micro", "rounds_to_steady_max", Goal::AtMost(10.0), "rounds until HPS's throughput is steady", "issue 4"),
    h(HPS, "hps-tracker-cost", "cost_vs_sweep_floor", Goal::AtMost(1.5), "tracker CPU per pass vs a bare MADV_DONTNEED sweep", "issue 4"),
    h(HPS, "hps-tracker-cost", "tracked_throughput_ratio", Goal::AtLeast(0.9), "application throughput tracked vs untracked", "issue 4"),
    h(HPS, "hps-tracker-cost", "periods_to_find", Goal::AtMost(5.0), "tracking periods to find a planted hot set", "issue 4"),
    h(HPS, "hps-kvcache", "ycsb_kvcache_vs_memcached", Goal::AtLeast(1.0), "kvcache vs memcached, YCSB's own client", "issue 23"),
    h(HPS, "hps-kvcache", "memcslap_kvcache_vs_memcached", Goal::AtLeast(1.0), "kvcache vs memcached, memcslap", "issue 23"),
    h(HPS, "hps-kvcache", "hps_vs_thp_throughput", Goal::AtLeast(0.99), "kvcache with HPS vs kvcache with THP, throughput", "issue 10"),
    h(HPS, "hps-kvcache", "hps_vs_thp_rss_increase", Goal::AtMost(0.05), "kvcache with HPS: memory increase as a share of THP's", "issue 10"),
    h(HPS, "hps-kvcache", "hot_arena_vs_hot_set_after_drift", Goal::AtMost(1.2), "hot arena vs hot set after the hot set drifted", "issue 10"),
    h(HPS, "hps-kvcache", "memcached_hps_vs_largepages", Goal::AtLeast(0.99), "memcached under `pagewise hps run` vs memcached -L, throughput", "issue 10"),
    h(HPS, "hps-kvcache", "memcached_hps_rss_increase_vs_largepages", Goal::AtMost(0.10), "memcached under `pagewise hps run`: memory increase as a share of -L's", "issue 10"),
    h(HPS, "hps-programs", "hps_run_vs_best_time_max", Goal::AtMost(1.02), "third-party programs under `pagewise hps run` vs the faster of plain and THP always, worst program", "issue 22"),
    h(HPS, "hps-programs", "hps_run_memory_vs_goal_max", Goal::AtMost(1.0), "their memory under `pagewise hps run` vs plain + 5% of THP always's increase, worst program", "issue 22"),
    h(PER_DATA, "spark-hugepages", "part_vs_off_time", Goal::AtMost(0.85), "Spark, Storage Memory on hugepages (the agent) vs no hugepages, run time", "issue 11"),
    h(PER_DATA, "spark-hugepages", "part_vs_entire_time", Goal::AtMost(1.0), "Spark, the agent vs THP for the whole JVM, run time", "issue 11"),
    h(PER_DATA, "spark-hugepages", "part_hugepage_bytes_vs_cached", Goal::Between(0.9, 1.1), "Spark, the agent's hugepage bytes vs the cached bytes", "issue 11"),
    h(RECLAIM, "reclaim-percore", "protected_core_reclaim_events", Goal::AtMost(0.0), "reclaim events on the protected core under reclaimd", "issue 5"),
    h(RECLAIM, "reclaim-percore", "protected_p99_vs_idle", Goal::AtMost(1.5), "protected task's p99 allocation latency vs no pressure", "issue 5"),
    h(RECLAIM, "reclaim-percore", "pressure_throughput_ratio", Goal::AtLeast(0.9), "the pressure job's throughput under reclaimd vs the kernel's default", "issue 5"),
    h(RECLAIM, "reclaim-split", "worst_reclaim_ratio_standard", Goal::AtMost(0.1), "worst reclaim on the workers' path, split vs default, standard pattern", "issues 5, 23"),
    h(RECLAIM, "reclaim-split", "worst_reclaim_ratio_slab_heavy", Goal::AtMost(0.1), "worst reclaim on the workers' path, split vs default, slab-heavy pattern", "issue 23"),
    h(RECLAIM, "reclaim-split", "standard_time_ratio", Goal::AtMost(1.05), "job time, split vs default, standard pattern", "issue 23"),
    h(RECLAIM, "reclaim-split", "slab_heavy_time_ratio", Goal::AtMost(1.10), "job time, split vs default, slab-heavy pattern", "issues 5, 23"),
    h(DLM, "dlm-fault", "fault_vs_busy_pingpong_16k", Goal::AtMost(1.3), "a 16 KiB remote fault vs a busy-polling TCP request/reply of the same bytes", "issue 9"),
    h(DLM, "dlm-fault", "fault_vs_busy_pingpong_max", Goal::AtMost(1.3), "the same, worst unit size 4 KiB–1 MiB", "issue 9"),
    h(DLM, "dlm-fault", "stream_vs_tcp_ratio", Goal::AtLeast(0.7), "sequential streaming through faults vs TCP streaming", "issue 9"),
    h(DLM, "dlm-autotune", "auto_vs_best_fixed_max", Goal::AtMost(1.15), "auto page size vs the best fixed size, worst local-memory ratio (the project's solver)", "issue 9"),
    h(DLM, "dlm-autotune", "auto_vs_128k_at_5pct", Goal::AtMost(0.2), "auto page size vs fixed 128 KiB at 5% local memory", "issue 9"),
    h(DLM, "dlm-vs-swap", "dlm_vs_zram_time", Goal::Report, "an unmodified program under `pagewise run` vs Linux swap on zram, same local memory (10%)", "issue 23"),
    h(DLM, "dlm-vs-swap", "dlm_vs_swap_time", Goal::Report, "the same vs Linux swap on a disk swap file", "issue 9"),
    h(DLM, "dlm-programs", "auto_vs_best_fixed_max", Goal::AtMost(1.15), "auto page size vs the best fixed size on third-party programs, worst program and ratio", "issue 22"),
    h(DLM, "dlm-programs", "run_vs_library_time_4k", Goal::AtMost(1.1), "`pagewise run` vs the same program calling dlm_alloc, 4 KiB units", "issue 22"),
    h(DLM, "dlm-programs", "run_vs_library_time_128k", Goal::AtMost(1.1), "the same, 128 KiB units", "issue 22"),
    h(DLM, "dlm-failover", "redundant_vs_none_time", Goal::AtMost(1.15), "redundancy on, no failure, vs no redundancy", "issue 24"),
    h(DLM, "dlm-failover", "one_failure_vs_none_time", Goal::AtMost(1.5), "one memory server SIGKILLed mid-run vs no redundancy", "issue 24"),
    h(DLM, "dlm-failover", "redundancy_memory_overhead", Goal::AtMost(1.5), "memory stored per byte of data with ec:2+1", "issue 24"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Censored::*;

    #[test]
    fn verdicts_respect_bounds() {
        let g = Goal::AtMost(1.15);
        assert_eq!(g.verdict(1.0, None), Verdict::Met);
        assert_eq!(g.verdict(1.2, None), Verdict::Missed);
        // A lower bound above the goal misses it; below, the run cannot tell.
        assert_eq!(g.verdict(1.2, Some(LowerBound)), Verdict::Missed);
        assert_eq!(g.verdict(1.0, Some(LowerBound)), Verdict::Unknown);
        // An upper bound below the goal meets it.
        assert_eq!(g.verdict(1.0, Some(UpperBound)), Verdict::Met);
        assert_eq!(g.verdict(1.2, Some(UpperBound)), Verdict::Unknown);
        assert_eq!(g.verdict(1.0, Some(Unknown)), Verdict::Unknown);
        let g = Goal::AtLeast(0.98);
        assert_eq!(g.verdict(0.99, Some(LowerBound)), Verdict::Met);
        assert_eq!(g.verdict(0.97, Some(UpperBound)), Verdict::Missed);
        assert_eq!(Goal::Between(0.9, 1.1).verdict(1.05, None), Verdict::Met);
        assert_eq!(Goal::Between(0.9, 1.1).verdict(1.2, None), Verdict::Missed);
        assert_eq!(Goal::Between(0.9, 1.1).verdict(1.2, Some(LowerBound)), Verdict::Unknown);
        assert_eq!(Goal::Report.verdict(3.0, None), Verdict::NoGoal);
        assert_eq!(g.verdict(f64::NAN, None), Verdict::Unknown);
    }

    #[test]
    fn goals_read_as_written() {
        assert_eq!(Goal::AtMost(1.15).text(), "≤ 1.15");
        assert_eq!(Goal::AtLeast(0.9).text(), "≥ 0.9");
        assert_eq!(Goal::AtMost(0.0).text(), "≤ 0");
        assert_eq!(Goal::Between(0.9, 1.1).text(), "0.9–1.1");
    }

    /// Every headline names a snake_case key once per experiment; an experiment that exists
    /// is spelled as `pagewise eval list` spells it.
    #[test]
    fn headlines_are_well_formed() {
        let mut seen = std::collections::BTreeSet::new();
        for hl in HEADLINES {
            assert!(hl.key.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'), "{}", hl.key);
            assert!(seen.insert((hl.experiment, hl.key)), "{} {} twice", hl.experiment, hl.key);
            assert!(hl.experiment.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
        }
        // The experiments the headlines name that exist today.
        let known: Vec<&str> = crate::experiments().iter().map(|e| e.name()).collect();
        for e in ["thp-baseline", "hps-micro", "hps-kvcache", "spark-hugepages", "reclaim-split", "dlm-vs-swap"] {
            assert!(known.contains(&e), "{e} is an experiment");
            assert!(HEADLINES.iter().any(|hl| hl.experiment == e), "{e} has a headline");
        }
    }
}
