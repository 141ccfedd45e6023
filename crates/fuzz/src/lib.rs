//! The bodies of the fuzz targets, in one place: the cargo-fuzz targets under `fuzz/` (long runs, nightly) and the
//! bounded fixed-seed run of `tests/bounded.rs` (every `cargo test`, stable) both call these functions with raw
//! bytes. Each turns the bytes into a structured input ([`arbitrary::Unstructured`]), runs the code under test and
//! checks what must hold whatever the input: no panic, and each target's own invariants. See docs/reliability.md.

pub mod api_request;
pub mod grpc_wire;
pub mod json;
pub mod patches;
pub mod protobuf_wire;
pub mod provider_specs;
pub mod selectors;

/// A target's body: runs one input, panics on a bug.
pub type Target = fn(&[u8]);

/// Every target by name, as `fuzz/` and the bounded run name them.
pub const TARGETS: [(&str, Target); 6] = [
    ("api_request", api_request::run),
    ("selectors", selectors::run),
    ("patches", patches::run),
    ("provider_specs", provider_specs::run),
    ("grpc_wire", grpc_wire::run),
    ("protobuf_wire", protobuf_wire::run),
];
