//! `webhook`: the admission service's process (`hcp_fleet_webhook`): its arguments, the
//! serving certificate's reload, the listener, and the drain on SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hcp_fleet_guards::Settings;
use hcp_fleet_guards::settings::SETTINGS_ENV;
use hcp_fleet_webhook::server::{self, Limits};
use hcp_fleet_webhook::tls::ReloadingCert;

#[derive(Debug, clap::Args)]
pub struct WebhookArgs {
    /// Directory holding tls.crt and tls.key (the mounted Secret).
    #[arg(long)]
    pub(crate) cert_dir: PathBuf,
    #[arg(long, default_value_t = 8443)]
    pub(crate) port: u16,
    #[arg(long, default_value = "0.0.0.0")]
    pub(crate) bind: String,
    /// Webhook modes and exemptions (JSON), as the agent renders them into the Deployment.
    #[arg(long, env = SETTINGS_ENV)]
    pub(crate) settings: Option<String>,
    /// The internal registry's file (the agent's ConfigMap, mounted): what the pod image spec
    /// mutation rewrites images with. Absent: nothing is rewritten.
    #[arg(long, env = hcp_fleet_guards::pod_image_spec::FILE_ENV)]
    pub(crate) internal_registry: Option<PathBuf>,
    /// How often the internal registry's file is checked for a change.
    #[arg(long, default_value_t = 2000)]
    pub(crate) internal_registry_check_ms: u64,
    /// How often the certificate files are checked for a change.
    #[arg(long, default_value_t = 1000)]
    pub(crate) cert_check_ms: u64,
    /// After SIGTERM, how long the service goes on answering before it drains: readiness
    /// fails at once (the endpoints drop it), and meanwhile every HTTP/1.1 answer asks the
    /// client to close its connection, so no client is left sending on a connection the
    /// service is about to close (a request lost that way is let through by failurePolicy
    /// Ignore).
    #[arg(long, default_value_t = 5)]
    pub(crate) shutdown_delay_seconds: u64,
    /// Connections open at once; one more is closed at once.
    #[arg(long, env = "HCP_FLEET_MAX_CONNECTIONS", default_value_t = server::DEFAULT_MAX_CONNECTIONS)]
    pub(crate) max_connections: usize,
    /// Microseconds a connection thread spins, watching its connections, before it sleeps:
    /// the next request on a busy keep-alive connection then finds it running (0: never spin;
    /// docs/admission.md "Performance").
    #[arg(long, env = "HCP_FLEET_SPIN_MICROS", default_value_t = server::DEFAULT_SPIN_MICROS)]
    pub(crate) spin_micros: u64,
}

/// What the service decides with when no settings are given: the agent's default
/// configuration's (the service knows the guards, not the agent's configuration).
pub fn default_settings() -> Settings {
    Settings::from(&hcp_fleet_render::config::AgentConfig::default())
}

/// Serves until SIGTERM or SIGINT, then drains. `default` is what the service decides with when
/// no settings are given ([`default_settings`] for the image's command).
pub async fn run(args: WebhookArgs, default: Settings) -> ExitCode {
    run_with(args, default, server::router).await
}

/// `run` with another router on the same server stack: the admission bench's baseline, which
/// answers every review with a fixed response, is `hcp-fleet-dev webhook-baseline` (never in the
/// image's binary, which has only `run`).
pub async fn run_with(
    args: WebhookArgs,
    default: Settings,
    router: fn(Arc<server::AppState>) -> axum::Router,
) -> ExitCode {
    let settings = match &args.settings {
        Some(json) => match serde_json::from_str::<Settings>(json) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: {} is not valid settings JSON: {e}", SETTINGS_ENV);
                return ExitCode::from(2);
            }
        },
        None => default,
    };
    let cert =
        match ReloadingCert::new(args.cert_dir.join("tls.crt"), args.cert_dir.join("tls.key")) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: serving certificate: {e}");
                return ExitCode::FAILURE;
            }
        };
    let addr = match server::bind_addr(args.port, &args.bind) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: listen address {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let _reloader = cert.watch(Duration::from_millis(args.cert_check_ms.max(50)));
    let limits = Limits {
        max_connections: args.max_connections.max(1),
        // At most a millisecond: a longer spin only burns CPU.
        spin: Duration::from_micros(args.spin_micros.min(1000)),
        ..Limits::default()
    };
    let state = server::AppState::new(
        settings,
        limits.clone(),
        Some(args.cert_dir.join(hcp_fleet_guards::probe::KEY_FILE)),
    );
    let _registry = args.internal_registry.clone().map(|path| {
        hcp_fleet_webhook::internal_registry::watch(
            path,
            state.clone(),
            Duration::from_millis(args.internal_registry_check_ms.max(50)),
        )
    });
    let app = router(state.clone());
    tracing::info!(%addr, crypto = hcp_fleet_guards::crypto::LIBRARY, fips = hcp_fleet_guards::crypto::fips_mode(), "admission service listening");
    let drain_state = state.clone();
    let delay = Duration::from_secs(args.shutdown_delay_seconds);
    let shutdown = async move {
        use tokio::signal::unix::{SignalKind, signal};
        if let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        } else {
            let _ = tokio::signal::ctrl_c().await;
        }
        // Fail readiness first so endpoints stop sending new connections; keep answering
        // (closing each HTTP/1.1 connection after its answer) while they catch up; then drain.
        drain_state.draining.store(true, Ordering::Relaxed);
        tracing::info!(delay_seconds = delay.as_secs(), "draining");
        tokio::time::sleep(delay).await;
    };
    server::serve(
        listener,
        server::tls_config(cert as Arc<dyn rustls::server::ResolvesServerCert>),
        app,
        limits,
        Box::pin(shutdown),
    )
    .await;
    ExitCode::SUCCESS
}
