//! The provider gRPC protocol (proto/mcm/provider/v1/provider.proto): providers run out of process, in any language,
//! as gRPC servers; the machine controller is their client (the CSI model, see docs/providers-grpc.md).
//!
//! - [`GrpcDriver`]: a `mcm_driver::Driver` backed by a remote provider (unix socket, or TCP with TLS and client
//!   certificates), with a deadline on every call and back-off while the provider is unreachable.
//! - [`serve`]: any `Driver` as a provider server, for providers written in Rust.
//! - [`ProviderEnv`]: the `MC_` environment variables a provider reads.
//! - [`status`]: machine codes on the wire (0-16 as gRPC codes, 17 in a status detail).
//! - [`conformance`]: the provider conformance suite (`mcm provider test`).
//! - [`fuzzing`]: the wire decoding the fuzz targets exercise.

mod authority;
mod client;
pub mod conformance;
mod convert;
mod endpoint;
pub mod env;
pub mod fuzzing;
mod server;
pub mod status;
mod tls;

pub use client::{ClientError, ClientOptions, GrpcDriver};
pub use endpoint::{Endpoint, EndpointError};
pub use env::{EnvError, ProviderEnv};
pub use server::{PROTOCOL_VERSION, ProviderInfo, ServeError, serve};
pub use tls::{TlsError, TlsFiles};

#[allow(missing_docs, clippy::pedantic)]
pub mod proto {
    //! The generated messages, clients and servers.
    tonic::include_proto!("mcm.provider.v1");
}
