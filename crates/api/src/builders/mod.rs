//! Chainable builders of the objects tests are made of: the four kinds of this API and the core/v1 Node and Pod.
//!
//! Compiled only with the `builders` feature, which only test builds switch on (a crate's
//! `[dev-dependencies] mcm-api = { ..., features = ["builders"] }`), so that the fixtures of every test suite have
//! one home instead of a `fn machine(` per test file. Each builder starts from a name and an otherwise empty object
//! (no namespace, no status) and sets only what its calls say, so a test reads as the list of fields it relies on:
//!
//! ```
//! use mcm_api::{MachinePhase, builders::{MachineBuilder, MachineSetBuilder}};
//!
//! let set = MachineSetBuilder::new("ms").namespace("ns").uid("uid-ms").replicas(2).build();
//! let machine = MachineBuilder::new("m1")
//!     .namespace("ns")
//!     .phase(MachinePhase::Running)
//!     .node("n1")
//!     .owned_by(&set)
//!     .label("app", "web")
//!     .build();
//! assert_eq!(machine.metadata.owner_references.unwrap()[0].name, "ms");
//! ```

mod class;
mod core_kinds;
mod machine;
mod meta;
mod sets;

pub use class::MachineClassBuilder;
pub use core_kinds::{NodeBuilder, PodBuilder};
pub use machine::MachineBuilder;
pub use meta::controller_reference;
pub use sets::{MachineDeploymentBuilder, MachineSetBuilder};

#[cfg(test)]
mod tests;
