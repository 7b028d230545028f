//! The command line: every command of the agent's binary, one file each (docs/architecture.md,
//! "Crates"): `agent` (the agent process: configuration and its reload, leader election, the
//! controller, the health and metrics servers), `webhook` (the admission service's process),
//! `status`, `render`, `uninstall`, `ready`, and `package` (registered by `hcp-fleet-dev`).
//!
//! Two binaries share it: `hcp-fleet-agent` (this crate's, the image's) with `Command` alone,
//! and `hcp-fleet-dev` (e2e/), which adds `dev` and `package` through `Extra` and answers
//! `agent --local-mode` with the test bed's endpoints. So the image's dependency graph has no
//! test bed by construction.

pub mod agent;
pub mod config_file;
pub mod packaging;
pub mod ready;
pub mod render;
pub mod status;
pub mod telemetry;
pub mod uninstall;
pub mod webhook;

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use hcp_fleet_agent::controller::{AdmissionEndpoints, InCluster};
use telemetry::LogFormat;

/// Every process of both binaries allocates with mimalloc, not glibc's malloc: a restarted
/// agent at 3,000 HCPs spent over half its CPU in glibc's allocator (`_int_malloc`,
/// `malloc_consolidate`, `unlink_chunk`: the JSON of every hosted object read and written,
/// freed across the runtime's threads), `perf record -a` during the scale benchmark's restart.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Output a command could not write: an object that would not serialize.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OutputError {
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
struct Cli<E: Extra> {
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "HCP_FLEET_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Commands<E>,
}

// Parsed once at start-up and consumed at once: its size is of no account.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Commands<E: Extra> {
    #[command(flatten)]
    Base(Command),
    #[command(flatten)]
    Extra(E),
}

/// The commands of every build.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// The controller on the management cluster.
    Agent(agent::AgentArgs),
    /// The admission service the agent deploys into each HCP namespace.
    Webhook(webhook::WebhookArgs),
    /// The fleet table, read from the health records, and a summary line.
    Status(status::StatusArgs),
    /// Print every manifest the agent would apply for an HCP.
    Render(render::RenderArgs),
    /// Remove what the agent put into the fleet (after the agent itself is gone).
    Uninstall(uninstall::UninstallArgs),
    /// Ask an agent's health port whether it is ready (the chart's helm test).
    Ready(ready::ReadyArgs),
    /// The version, the crypto library this binary was built with, and whether its TLS runs
    /// in FIPS mode.
    Version,
}

/// Commands a binary adds to `Command`: `hcp-fleet-dev`'s, or none (`NoExtra`, the image's).
pub trait Extra: Subcommand + std::fmt::Debug {
    fn run(self, runtime: &tokio::runtime::Runtime) -> ExitCode;
}

/// The image's binary adds no command.
#[derive(Debug, Subcommand)]
pub enum NoExtra {}

impl Extra for NoExtra {
    fn run(self, _: &tokio::runtime::Runtime) -> ExitCode {
        match self {}
    }
}

/// Where `agent --local-mode` finds the admission services: the test bed's stand-in kubelet
/// publishes their addresses. `None` in a build without the test bed, which refuses the flag.
pub(crate) type LocalEndpoints = fn() -> Arc<dyn AdmissionEndpoints>;

/// The binary's entry point: `E` the commands it adds, `local` its test bed's endpoints.
pub fn main_with<E: Extra>(local: Option<LocalEndpoints>) -> ExitCode {
    let cli = Cli::<E>::parse();
    telemetry::init(cli.log_format);
    hcp_fleet_guards::crypto::install_provider();
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
        Commands::Base(c) => run(c, local, &runtime),
        Commands::Extra(e) => e.run(&runtime),
    }
}

/// The commands of every build, out of `main_with`: not generic, so the agent's and the
/// service's code is compiled once, in this crate, rather than again into each binary that
/// instantiates `main_with` (the image's release build spent 100 s of two cores on that).
fn run(
    command: Command,
    local: Option<LocalEndpoints>,
    runtime: &tokio::runtime::Runtime,
) -> ExitCode {
    match command {
        Command::Agent(args) => {
            // The composition root: the only place that picks the test bed's seam.
            let endpoints = match endpoints(args.local_mode, local) {
                Ok(e) => e,
                Err(why) => {
                    eprintln!("error: {why}");
                    return ExitCode::from(2);
                }
            };
            runtime.block_on(agent::run(args, endpoints))
        }
        Command::Status(args) => runtime.block_on(status::run(args)),
        Command::Render(args) => render::run(args),
        Command::Uninstall(args) => runtime.block_on(uninstall::run(args)),
        Command::Ready(args) => runtime.block_on(ready::ready(args)),
        Command::Webhook(args) => runtime.block_on(webhook::run(args, webhook::default_settings())),
        Command::Version => {
            println!("hcp-fleet-agent {}", env!("CARGO_PKG_VERSION"));
            println!("crypto: {}", hcp_fleet_guards::crypto::LIBRARY);
            println!("fips: {}", hcp_fleet_guards::crypto::fips_mode());
            ExitCode::SUCCESS
        }
    }
}

/// How hosted kube-apiservers reach the admission services: in the cluster, or (`--local-mode`,
/// the test bed's) at the addresses its stand-in kubelet publishes.
fn endpoints(
    local_mode: bool,
    local: Option<LocalEndpoints>,
) -> Result<Arc<dyn AdmissionEndpoints>, &'static str> {
    match (local_mode, local) {
        (false, _) => Ok(Arc::new(InCluster)),
        (true, Some(local)) => Ok(local()),
        (true, None) => Err("--local-mode needs the test bed, which this build leaves out"),
    }
}
