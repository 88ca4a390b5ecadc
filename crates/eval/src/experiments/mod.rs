//! The experiments, one module each.

use crate::Experiment;

pub mod dlm_autotune;
pub mod dlm_failover;
pub mod dlm_fault;
pub mod dlm_pagesize;
pub mod dlm_programs;
pub mod dlm_vs_swap;
pub mod hps_kvcache;
pub mod hps_micro;
pub mod hps_programs;
pub mod hps_tracker_cost;
pub mod reclaim_load;
pub mod reclaim_percore;
pub mod reclaim_split;
pub mod spark_hugepages;
pub mod thp_baseline;

/// Every experiment, in the order `pagewise eval all` runs them.
pub fn all() -> Vec<&'static dyn Experiment> {
    vec![
        &thp_baseline::ThpBaseline,
        &hps_micro::HpsMicro,
        &hps_tracker_cost::HpsTrackerCost,
        &hps_kvcache::HpsKvcache,
        &hps_programs::HpsPrograms,
        &dlm_fault::DlmFault,
        &dlm_pagesize::DlmPagesize,
        &dlm_autotune::DlmAutotune,
        &dlm_vs_swap::DlmVsSwap,
        &dlm_programs::DlmPrograms,
        &dlm_failover::DlmFailover,
        &reclaim_percore::ReclaimPercore,
        &reclaim_split::ReclaimSplit,
        &spark_hugepages::SparkHugepages,
    ]
}
