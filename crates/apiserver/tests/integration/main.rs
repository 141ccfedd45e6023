//! Integration tests of the embedded API server over real HTTP.
//!
//! One binary for all of this crate's integration tests: one link instead of one per file, which is most of
//! the test build's disk and link time. Each file is a module; `cargo test --test integration <file>::` runs one.

mod apply;
mod control_plane;
mod crd_corpus;
mod crds;
mod crud;
mod dry_run;
mod errors;
mod event_ttl;
mod gc;
mod kube_answers;
mod listener;
mod node_credentials;
mod persistence;
mod protobuf;
mod queries;
mod requests;
mod runtime;
mod support;
mod watch;
