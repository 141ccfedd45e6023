//! End-to-end tests of the `mcm` binary: real child processes, real HTTP, real `kubectl`.
//!
//! One binary for all of this crate's integration tests: one link instead of one per file, which is most of
//! the test build's disk and link time. Each file is a module; `cargo test --test e2e <file>::` runs one.

mod apiserver_crds_kubectl;
mod apiserver_kubectl;
mod apiserver_kubectl_apply;
mod apiserver_kubectl_create;
mod apiserver_kubectl_dry_run;
mod apiserver_kubectl_sort;
mod apiserver_pause;
mod bench_command;
mod capi_command;
mod cli_output;
mod crds_command;
mod deploy_layouts;
mod deploy_manifests;
mod deploy_rbac;
mod examples_command;
mod leader_failover;
mod metrics_surface;
mod node_agent;
mod provider_aws;
mod provider_aws_e2e;
mod provider_call;
mod provider_command;
mod provider_python;
mod reference_sample_args;
mod run_command;
mod secret_leak;
mod store_group_commit;
mod support;
mod up_command;
