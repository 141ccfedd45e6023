//! Integration tests of the controllers against the embedded API server over real HTTP with the real `kube` client.
//!
//! One binary for all of this crate's integration tests: one link instead of one per file, which is most of
//! the test build's disk and link time. Each file is a module; `cargo test --test integration <file>::` runs one.

mod admission_policy;
mod apiserver_outage;
mod class_references;
mod corpus;
mod crash_points;
mod in_place_machine;
mod in_place_update;
mod initialization_faults;
mod invalid_input;
mod leader_election;
mod machine_controller;
mod machine_deletion;
mod machine_lifecycle;
mod machinedeployment_autoscaler;
mod machinedeployment_stale_status;
mod machinedeployment_strategies;
mod machineset_controller;
mod metrics;
mod min_ready_seconds;
mod node_deletion;
mod orphan_collection;
mod outage_suite;
mod overshoot_freeze;
mod preservation;
mod shutdown;
mod stored_only;
mod support;
mod undecodable_objects;
mod unknown_status_values;
