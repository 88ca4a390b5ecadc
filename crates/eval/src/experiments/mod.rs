//! The experiments, one module each.

use crate::Experiment;

pub mod hps_micro;
pub mod hps_tracker_cost;
pub mod thp_baseline;

/// Every experiment, in the order `pagewise eval all` runs them.
pub fn all() -> Vec<&'static dyn Experiment> {
    vec![&thp_baseline::ThpBaseline, &hps_micro::HpsMicro, &hps_tracker_cost::HpsTrackerCost]
}
