//! `hcp-fleet-dev`: the agent's binary with the test bed, for `make demo`, the e2e tests and
//! the benchmarks. Every command of `hcp-fleet-agent`, `agent --local-mode` (the admission
//! services at the addresses the test bed's stand-in kubelet publishes), and two more: `dev`
//! (a local fleet with the agent on it) and `package` (the chart's generated files).

mod dev;
mod hub;
#[cfg(test)]
mod repo_checks;

use std::process::ExitCode;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
enum DevCommand {
    /// A local fleet: etcd, a management and N hosted kube-apiservers, HCP fixtures.
    Dev(dev::DevArgs),
    /// Fleet packaging: the chart's values schema, the ACM Policy and SelectorSyncSet.
    Package(hcp_fleet_cli::packaging::PackageArgs),
    /// The admission bench's baseline: `webhook`'s server stack answering every review with a
    /// fixed response (`make bench`). Only this binary has it, never the image's.
    WebhookBaseline(hcp_fleet_cli::webhook::WebhookArgs),
}

impl hcp_fleet_cli::Extra for DevCommand {
    fn run(self, runtime: &tokio::runtime::Runtime) -> ExitCode {
        match self {
            DevCommand::Dev(args) => runtime.block_on(dev::run(args)),
            DevCommand::Package(args) => hcp_fleet_cli::packaging::run(args),
            DevCommand::WebhookBaseline(args) => {
                runtime.block_on(hcp_fleet_cli::webhook::run_with(
                    args,
                    hcp_fleet_cli::webhook::default_settings(),
                    hcp_fleet_webhook::server::baseline_router,
                ))
            }
        }
    }
}

fn main() -> ExitCode {
    hcp_fleet_cli::main_with::<DevCommand>(Some(hcp_fleet_testbed::kubelet::endpoints))
}
