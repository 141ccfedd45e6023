//! The AWS provider: EC2 machines from Gardener's own AWS MachineClasses (the reference's `AWSProviderSpec`
//! unchanged), behind the [`mcm_driver::Driver`] trait. See docs/providers/aws.md.
//!
//! - [`spec`]: the providerSpec JSON; [`validation`]: the reference's rules, every problem with its field path.
//! - [`client`]: a Query-API client (SigV4 signed with ring in [`sigv4`], XML read with roxmltree), errors mapped
//!   to machine codes, throttling/5xx/transport failures retried with back-off and jitter.
//! - [`AwsDriver`]: CreateMachine (idempotent through tags and a ClientToken), InitializeMachine, DeleteMachine,
//!   GetMachineStatus, ListMachines (paginated), GetVolumeIDs.
//!
//! The endpoints follow `AWS_ENDPOINT_URL_EC2` / `AWS_ENDPOINT_URL_STS` / `AWS_ENDPOINT_URL` ([`AwsConfig::from_env`]).
//! No credential, token or userData is ever logged or put in an error.

pub mod client;
mod driver;
pub mod ec2;
pub mod metrics;
pub mod params;
pub mod sigv4;
pub mod spec;
pub mod testing;
pub mod validation;

pub use client::{AwsError, QueryClient, RetryPolicy, Target};
pub use driver::{
    AwsConfig, AwsDriver, CSI_DRIVER, EC2_ENDPOINT_ENV, ENDPOINT_ENV, PROVIDER_ID_PREFIX, STS_ENDPOINT_ENV,
    client_token, instance_id, optional_methods, provider_id,
};
pub use spec::AwsProviderSpec;
