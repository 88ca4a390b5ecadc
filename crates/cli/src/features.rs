//! Every user-facing feature in this build, gathered from the crates that declare them: the
//! one list `pagewise doctor`'s "used by" column comes from. A crate adds a feature with one
//! entry in its `FEATURES`; a new crate adds its slice here.

use pagewise_kernel::features::Feature;

/// The features of this build, by crate.
pub const REGISTRY: &[&[Feature]] = &[
    pagewise_hugepage::FEATURES,
    pagewise_kvcache::FEATURES,
    pagewise_dlm::FEATURES,
    pagewise_reclaim::FEATURES,
    crate::eval::FEATURES,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_is_well_formed() {
        assert_eq!(pagewise_kernel::features::check(REGISTRY), Vec::<String>::new());
    }

    #[test]
    fn every_experiment_is_registered_and_every_registered_experiment_exists() {
        let names: Vec<&str> = pagewise_eval::experiments().iter().map(|e| e.name()).collect();
        let registered: Vec<&str> =
            crate::eval::FEATURES.iter().map(|f| f.name.strip_prefix("pagewise eval ").expect("prefix")).collect();
        for n in &names {
            assert!(registered.contains(n), "experiment {n} declares no kernel capabilities in eval::FEATURES");
        }
        for r in &registered {
            assert!(names.contains(r), "eval::FEATURES names {r}, which is not an experiment");
        }
    }
}
