//! The command line: one binary, several commands (docs/architecture.md). The commands that
//! are not the agent's or the admission service's own work live here, one file each.

#[cfg(feature = "testbed")]
pub mod dev;
#[cfg(feature = "testbed")]
pub mod packaging;
pub mod render;
pub mod status;
pub mod uninstall;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::telemetry::{self, LogFormat};

/// Output a command could not write: an object that would not serialize.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("YAML: {0}")]
    Yaml(#[from] serde_saphyr::ser::Error),
}

#[derive(Debug, Parser)]
#[command(
    name = "hcp-fleet-agent",
    version,
    about = "Admission webhooks across a HyperShift fleet"
)]
pub(crate) struct Cli {
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "HCP_FLEET_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The controller on the management cluster.
    Agent(crate::agent::AgentArgs),
    /// The admission service the agent deploys into each HCP namespace.
    Webhook(crate::admission::WebhookArgs),
    /// A local fleet: etcd, a management and N hosted kube-apiservers, HCP fixtures.
    #[cfg(feature = "testbed")]
    Dev(crate::cmd::dev::DevArgs),
    /// The fleet table, read from the health records, and a summary line.
    Status(crate::cmd::status::StatusArgs),
    /// Print every manifest the agent would apply for an HCP.
    Render(crate::cmd::render::RenderArgs),
    /// Fleet packaging: the chart's values schema, the ACM Policy and SelectorSyncSet.
    #[cfg(feature = "testbed")]
    Package(crate::cmd::packaging::PackageArgs),
    /// Remove what the agent put into the fleet (after the agent itself is gone).
    Uninstall(crate::cmd::uninstall::UninstallArgs),
    /// Ask an agent's health port whether it is ready (the chart's helm test).
    Ready(crate::liveness::ReadyArgs),
    /// The version, the crypto library this binary was built with, and whether its TLS runs
    /// in FIPS mode.
    Version,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    crate::tls::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        #[cfg(feature = "testbed")]
        Command::Dev(args) => runtime.block_on(crate::cmd::dev::run(args)),
        Command::Agent(args) => {
            // The composition root: the only place that picks the test bed's seam.
            let endpoints = match endpoints(args.local_mode) {
                Ok(e) => e,
                Err(why) => {
                    eprintln!("error: {why}");
                    return ExitCode::from(2);
                }
            };
            runtime.block_on(crate::agent::run(args, endpoints))
        }
        Command::Status(args) => runtime.block_on(crate::cmd::status::run(args)),
        Command::Render(args) => crate::cmd::render::run(args),
        #[cfg(feature = "testbed")]
        Command::Package(args) => crate::cmd::packaging::run(args),
        Command::Uninstall(args) => runtime.block_on(crate::cmd::uninstall::run(args)),
        Command::Ready(args) => runtime.block_on(crate::liveness::ready(args)),
        Command::Webhook(args) => runtime.block_on(crate::admission::run(args)),
        Command::Version => {
            println!("hcp-fleet-agent {}", env!("CARGO_PKG_VERSION"));
            println!("crypto: {}", crate::crypto::LIBRARY);
            println!("fips: {}", crate::crypto::fips_mode());
            ExitCode::SUCCESS
        }
    }
}

/// How hosted kube-apiservers reach the admission services: in the cluster, or (`--local-mode`,
/// the test bed's) at the addresses its stand-in kubelet publishes.
#[cfg(feature = "testbed")]
fn endpoints(
    local: bool,
) -> Result<std::sync::Arc<dyn crate::controller::AdmissionEndpoints>, &'static str> {
    Ok(if local {
        crate::localcp::kubelet::endpoints()
    } else {
        std::sync::Arc::new(crate::controller::InCluster)
    })
}

/// This build has no test bed (the image's): `--local-mode` is refused.
#[cfg(not(feature = "testbed"))]
fn endpoints(
    local: bool,
) -> Result<std::sync::Arc<dyn crate::controller::AdmissionEndpoints>, &'static str> {
    if local {
        return Err("--local-mode needs the test bed, which this build leaves out");
    }
    Ok(std::sync::Arc::new(crate::controller::InCluster))
}
