//! kube-runtime controllers that observe, call `mcm-core`, and act: today the machine controller (creation,
//! health, node sync; a minimal deletion until the deletion flow lands). See docs/machine-controller.md.

pub mod events;
pub mod machine;
