//! `mcm`: the one binary of the machine controller manager.

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// A declarative manager of Kubernetes worker machines, compatible with machine.sapcloud.io/v1alpha1.
#[derive(Debug, Parser)]
#[command(name = "mcm", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions of the four kinds (MachineClass, Machine, MachineSet,
    /// MachineDeployment) as YAML, ready for `kubectl apply -f -`.
    Crds,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds => {
            let crds = mcm_api::crd::all().context("generating the CRDs")?;
            let yaml = mcm_api::crd::to_yaml(&crds).context("writing the CRDs as YAML")?;
            std::io::stdout()
                .lock()
                .write_all(yaml.as_bytes())
                .context("writing to standard output")?;
        }
    }
    Ok(())
}
