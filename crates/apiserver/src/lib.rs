//! The embedded Kubernetes-compatible API server for the subset this project uses.
//!
//! It serves the core, coordination, storage, policy and events resources the controllers and kubectl need, and the
//! custom resources of the CustomResourceDefinitions it is given (the four machine kinds among them, pre-installed), following the Kubernetes API conventions for that subset. It is the embedded
//! default under `mcm up` and the ground of every integration and end-to-end test. See docs/apiserver.md.

pub mod admission;
pub mod apply;
pub mod auth;
pub mod crd;
pub mod csr;
pub mod defaults;
pub mod discovery;
pub mod disruption;
pub mod error;
pub mod event_ttl;
pub mod files;
pub mod gc;
pub mod hooks;
pub mod limits;
pub mod listener;
pub mod metadata;
pub mod naming;
pub mod nodelifecycle;
pub mod objects;
pub mod openapi;
pub mod options;
pub mod patch;
pub mod pki;
pub mod pods;
pub mod preinstalled;
pub mod protobuf;
pub mod registry;
pub mod requests;
pub mod rest;
pub mod schema_check;
pub mod secret_data;
pub mod selectors;
pub mod server;
pub mod store;
pub mod table;
pub mod watch;
pub mod x509;

pub use server::{ApiServer, Config};
