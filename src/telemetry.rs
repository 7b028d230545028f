//! Logging: human-readable by default, JSON with `--log-format json` (what the agent's
//! Deployment uses). Level from RUST_LOG, defaulting to info.

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// kube's client logs every failed request at error level, including the expected refusals
/// while a server boots; our own errors carry the same cause with the HCP in context.
const DEFAULT_FILTER: &str = "info,kube_client::client::builder=off";

pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests) is harmless: the first subscriber stays.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
