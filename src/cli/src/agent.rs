//! `hcp-fleet-agent agent`: load and validate the configuration, discover what the management
//! cluster offers, and run the HCP controller until SIGTERM. `start` is the same agent in
//! process, for `dev` and the e2e tests.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, RwLock};

use kube::Client;
use tokio::task::JoinHandle;

use hcp_fleet_agent::controller;
use hcp_fleet_agent::controller::{AdmissionEndpoints, Context, RunOptions};
use hcp_fleet_agent::metrics::Metrics;
use hcp_fleet_render::config::AgentConfig;

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// Configuration file (YAML); built-in defaults when absent.
    #[arg(long, env = "HCP_FLEET_CONFIG")]
    pub config: Option<PathBuf>,
    /// Namespace of the agent (its Lease).
    #[arg(long, env = "POD_NAMESPACE", default_value = "hcp-fleet-agent")]
    pub namespace: String,
    /// Overrides `concurrency` from the file.
    #[arg(long, env = "HCP_FLEET_CONCURRENCY")]
    pub concurrency: Option<u16>,
    /// Overrides `admission.image` from the file.
    #[arg(long, env = "HCP_FLEET_ADMISSION_IMAGE")]
    pub admission_image: Option<String>,
    /// The local test bed: loopback SANs, and admission URLs from the address the stand-in
    /// kubelet publishes (the command line wires the test bed's `AdmissionEndpoints`). Never
    /// for a real cluster.
    #[arg(long, hide = true)]
    pub local_mode: bool,
    /// Run the controller only while holding the Lease `hcp-fleet-agent` in `--namespace`
    /// (for more than one replica).
    #[arg(long, env = "HCP_FLEET_LEADER_ELECT")]
    pub leader_elect: bool,
    /// How long a lease lasts without renewal; a standby takes over within it.
    #[arg(long, default_value_t = 15, env = "HCP_FLEET_LEASE_DURATION_SECONDS")]
    pub lease_duration_seconds: u64,
    /// Where `/metrics`, `/healthz` and `/readyz` are served over plain HTTP: a loopback
    /// address only (anything else is refused). Prometheus scrapes `--secure-metrics-addr`.
    #[arg(long, env = "HCP_FLEET_METRICS_ADDR", default_value = "127.0.0.1:8080")]
    pub metrics_addr: std::net::SocketAddr,
    /// Where `/metrics` is served over HTTPS to callers whose bearer token a TokenReview
    /// accepts and a SubjectAccessReview allows `get` on `/metrics` (`secure_metrics`).
    #[arg(long, env = "HCP_FLEET_SECURE_METRICS_ADDR")]
    pub secure_metrics_addr: Option<std::net::SocketAddr>,
    /// `tls.crt` and `tls.key` for `--secure-metrics-addr` (re-read when they change);
    /// without it a self-signed certificate is made at start.
    #[arg(long, env = "HCP_FLEET_METRICS_TLS_DIR")]
    pub metrics_tls_dir: Option<std::path::PathBuf>,
    /// The Service Prometheus scrapes, named in the self-signed certificate.
    #[arg(
        long,
        env = "HCP_FLEET_METRICS_SERVICE",
        default_value = "hcp-fleet-agent-metrics"
    )]
    pub metrics_service: String,
    /// Where `/healthz` and `/readyz` alone are served, for the kubelet's probes.
    #[arg(long, env = "HCP_FLEET_HEALTH_ADDR")]
    pub health_addr: Option<std::net::SocketAddr>,
    /// The chart's ClusterRoleBinding that lets ACM's framework addon sync the agent's template
    /// kind; set, its subjects follow every service account named `--framework-service-account`
    /// (`controller::template_access`).
    #[arg(long, env = "HCP_FLEET_TEMPLATE_SYNC_BINDING")]
    pub template_sync_binding: Option<String>,
    /// The name of ACM's framework addon service account, in every namespace it runs in.
    #[arg(
        long,
        env = "HCP_FLEET_FRAMEWORK_SERVICE_ACCOUNT",
        default_value = "governance-policy-framework-sa"
    )]
    pub framework_service_account: String,
    /// The namespace of the addon's default-mode install, whose account stays in the binding
    /// whether it exists or not (the chart names it there).
    #[arg(long, env = "HCP_FLEET_FRAMEWORK_NAMESPACE")]
    pub framework_namespace: Option<String>,
}

/// Loads the file and applies the overrides; every problem is reported at once.
pub(crate) fn load_config(
    args: &AgentArgs,
) -> Result<AgentConfig, hcp_fleet_render::config::ConfigError> {
    let mut cfg = crate::config_file::load_or_default(args.config.as_deref())?;
    if let Some(c) = args.concurrency {
        cfg.concurrency = c;
    }
    if let Some(i) = &args.admission_image {
        cfg.admission.image = i.clone();
    }
    let origin = args
        .config
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "built-in defaults with overrides".into());
    cfg.validated(&origin)
}

/// A running in-process agent; dropping it stops the controller.
pub struct AgentHandle {
    pub context: Arc<Context>,
    /// Awaits the controller and says so when it ends on its own.
    task: JoinHandle<()>,
    controller: tokio::task::AbortHandle,
    reload_tx: tokio::sync::mpsc::UnboundedSender<()>,
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        // Stopped on purpose: the watcher first, so the end is not taken for a failure.
        self.task.abort();
        self.controller.abort();
        self.context.metrics.liveness.idle();
    }
}

impl AgentHandle {
    /// Swaps in a new configuration (already validated) and reconciles every HCP with it.
    pub fn set_config(&self, cfg: AgentConfig) {
        match self.context.config.write() {
            Ok(mut c) => *c = Arc::new(cfg),
            Err(p) => *p.into_inner() = Arc::new(cfg),
        }
        let _ = self.reload_tx.send(());
    }

    /// Ends the controller as a crash would (the test hook, `HCP_FLEET_TEST_HOOKS`).
    pub fn kill_controller(&self) {
        self.controller.abort();
    }

    /// Re-reads the configuration; a bad one is refused and the running one kept, and says
    /// so where an SRE looks: `hcp_fleet_config_last_reload_successful` 0 (the alert
    /// `HcpFleetConfigurationRefused`) and a Warning Event on the agent's AdmissionRollout.
    pub fn reload(&self, args: &AgentArgs) -> Result<bool, hcp_fleet_render::config::ConfigError> {
        self.reload_from(|| load_config(args))
    }

    /// `reload` with the configuration from `load` (`dev --config`: the file with the test
    /// bed's loopback servers allowed): refused or taken the same way.
    pub fn reload_from(
        &self,
        load: impl FnOnce() -> Result<AgentConfig, hcp_fleet_render::config::ConfigError>,
    ) -> Result<bool, hcp_fleet_render::config::ConfigError> {
        let new = match load() {
            Ok(new) => {
                self.context.metrics.config_read(true);
                self.context.set_config_refused(None);
                new
            }
            Err(e) => {
                self.context.metrics.config_read(false);
                self.context.set_config_refused(Some(e.to_string()));
                self.context.warn_about_agent(
                    "ConfigurationRefused",
                    format!(
                        "the new configuration was refused; the agent runs the last good one: {e}"
                    ),
                );
                return Err(e);
            }
        };
        if *self.context.config() == new {
            return Ok(false);
        }
        self.set_config(new);
        Ok(true)
    }
}

/// `/metrics` (OpenMetrics text), `/healthz` and `/readyz` for the agent. Served from the
/// start, leader or not: a standby reports `hcp_fleet_leader 0`.
pub(crate) fn router(metrics: Arc<Metrics>) -> axum::Router {
    use axum::http::{StatusCode, header};
    use axum::routing::get;
    let live = metrics.clone();
    let ready_metrics = metrics.clone();
    axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let body = metrics.encode();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        body,
                    )
                }
            }),
        )
        .route(
            "/healthz",
            get(move || async move {
                match live.liveness.check() {
                    Ok(()) => (StatusCode::OK, "ok".to_string()),
                    Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why.to_string()),
                }
            }),
        )
        .route("/readyz", get(move || ready(ready_metrics.clone())))
}

/// Ready unless another installation of the agent owns HCPs this one was asked to serve:
/// `helm install --wait` of a second release then fails, naming the owner, instead of the two
/// fighting in silence.
async fn ready(metrics: Arc<Metrics>) -> (axum::http::StatusCode, String) {
    match metrics.owned_elsewhere_text() {
        None => (axum::http::StatusCode::OK, "ok".into()),
        Some(why) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

/// `/healthz` and `/readyz` alone (the kubelet's probes reach the pod's address, where the
/// metrics are not served in the clear).
pub fn health_router(metrics: Arc<Metrics>) -> axum::Router {
    use axum::http::StatusCode;
    use axum::routing::get;
    let ready_metrics = metrics.clone();
    axum::Router::new()
        .route(
            "/healthz",
            get(move || async move {
                match metrics.liveness.check() {
                    Ok(()) => (StatusCode::OK, "ok".to_string()),
                    Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why.to_string()),
                }
            }),
        )
        .route("/readyz", get(move || ready(ready_metrics.clone())))
}

/// Serves `router` on `listener` until the task is aborted.
pub fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) -> JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router(metrics)).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    })
}

#[derive(Clone)]
pub struct StartOptions {
    pub agent_namespace: String,
    /// How the hosted kube-apiserver reaches the admission services (`controller::InCluster`
    /// in a real cluster).
    pub endpoints: Arc<dyn AdmissionEndpoints>,
}

pub async fn start(
    client: Client,
    cfg: AgentConfig,
    opts: StartOptions,
) -> Result<AgentHandle, kube::Error> {
    start_with_metrics(client, cfg, opts, Arc::new(Metrics::new())).await
}

/// `start`, with a metrics registry the caller already counts management requests into.
pub async fn start_with_metrics(
    client: Client,
    cfg: AgentConfig,
    opts: StartOptions,
    metrics: Arc<Metrics>,
) -> Result<AgentHandle, kube::Error> {
    let caps = controller::discover(&client).await;
    let (ctx, rx) = Context::new(
        client,
        Arc::new(RwLock::new(Arc::new(cfg))),
        metrics,
        caps,
        RunOptions {
            agent_namespace: opts.agent_namespace,
            endpoints: opts.endpoints,
        },
    );
    // The configuration it starts with was read and accepted.
    ctx.metrics.config_read(true);
    let c2 = ctx.clone();
    let (reload_tx, reload_rx) = tokio::sync::mpsc::unbounded_channel();
    let run = tokio::spawn(async move {
        controller::run(
            c2,
            rx,
            reload_rx,
            Box::pin(futures::future::pending::<()>()),
        )
        .await;
    });
    let controller = run.abort_handle();
    let c3 = ctx.clone();
    let task = tokio::spawn(async move {
        let why = match run.await {
            Ok(()) => "its event stream ended".to_string(),
            Err(e) if e.is_panic() => "it panicked".to_string(),
            Err(_) => "it was cancelled".to_string(),
        };
        tracing::error!(%why, "the controller ended");
        c3.metrics.liveness.end(why);
    });
    Ok(AgentHandle {
        context: ctx,
        task,
        controller,
        reload_tx,
    })
}

/// The agent's HTTP servers: plain `/metrics` and health on loopback, health alone where the
/// kubelet probes, `/metrics` over HTTPS behind token and access reviews. Aborted on drop.
pub(crate) struct Servers(Vec<JoinHandle<()>>);

impl Drop for Servers {
    fn drop(&mut self) {
        self.0.iter().for_each(JoinHandle::abort);
    }
}

/// Why the agent's HTTP servers did not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "--metrics-addr {0} is not a loopback address: plain-HTTP metrics are served on \
         loopback only; give Prometheus --secure-metrics-addr, and the kubelet --health-addr"
    )]
    NotLoopback(std::net::SocketAddr),
    #[error("the metrics serving certificate: {0}")]
    Certificate(#[from] hcp_fleet_agent::secure_metrics::MetricsTlsError),
}

async fn serve_all(
    args: &AgentArgs,
    metrics: &Arc<Metrics>,
    client: &kube::Client,
) -> Result<Servers, ServeError> {
    let bind = |addr: std::net::SocketAddr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Listen { addr, source })
    };
    if !args.metrics_addr.ip().is_loopback() {
        return Err(ServeError::NotLoopback(args.metrics_addr));
    }
    let mut tasks = vec![serve(bind(args.metrics_addr).await?, metrics.clone())];
    tracing::info!(addr = %args.metrics_addr, "serving /metrics, /healthz and /readyz (loopback)");
    if let Some(addr) = args.health_addr {
        let listener = bind(addr).await?;
        let app = health_router(metrics.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "health server stopped");
            }
        }));
        tracing::info!(%addr, "serving /healthz and /readyz");
    }
    if let Some(addr) = args.secure_metrics_addr {
        let ns = &args.namespace;
        let svc = &args.metrics_service;
        let names = vec![
            format!("{svc}.{ns}.svc"),
            format!("{svc}.{ns}.svc.cluster.local"),
            "localhost".to_string(),
        ];
        let tls = hcp_fleet_agent::secure_metrics::tls(args.metrics_tls_dir.as_deref(), &names)?;
        let app = hcp_fleet_agent::secure_metrics::router(metrics.clone(), client.clone());
        tasks.push(hcp_fleet_agent::secure_metrics::serve(
            bind(addr).await?,
            tls,
            app,
        ));
        tracing::info!(%addr, self_signed = args.metrics_tls_dir.is_none(), "serving /metrics over HTTPS to callers allowed get on /metrics");
    }
    Ok(Servers(tasks))
}

/// `endpoints`: how hosted kube-apiservers reach the admission services (the command line
/// passes `controller::InCluster`, or the test bed's with `--local-mode`).
pub async fn run(args: AgentArgs, endpoints: Arc<dyn AdmissionEndpoints>) -> ExitCode {
    let cfg = match load_config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let metrics = Arc::new(Metrics::new());
    let config = match kube::Config::infer().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: no usable kubeconfig or in-cluster configuration: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The controller's requests share one ceiling; the Lease has a client of its own, so a
    // queue of reconcile requests can never hold a renewal back until the lease expires.
    let clients = hcp_fleet_agent::metrics::counted_client(
        config.clone(),
        metrics.management_requests.clone(),
        Some(hcp_fleet_agent::metrics::RequestLimit::of(
            &cfg.management_api,
        )),
    )
    .and_then(|c| {
        hcp_fleet_agent::metrics::counted_client(config, metrics.management_requests.clone(), None)
            .map(|l| (c, l))
    });
    let (client, lease_client) = match clients {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: building the management client: {e}");
            return ExitCode::FAILURE;
        }
    };
    let servers = match serve_all(&args, &metrics, &lease_client).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = || StartOptions {
        agent_namespace: args.namespace.clone(),
        endpoints: endpoints.clone(),
    };
    // Every replica keeps it (its writes are the same, and only when the accounts change), so
    // a new hosted cluster's addon is let in even while no replica leads.
    let _template_access = args.template_sync_binding.clone().map(|binding| {
        hcp_fleet_agent::controller::acm::template_access::spawn(
            client.clone(),
            binding,
            args.framework_service_account.clone(),
            args.framework_namespace.clone(),
        )
    });
    let code = if args.leader_elect {
        run_leader_elected(client, lease_client, &args, metrics, opts).await
    } else {
        match start_with_metrics(client, cfg, opts(), metrics.clone()).await {
            Ok(handle) => {
                metrics.leader.set(1);
                match wait_and_reload(&handle, &args).await {
                    None => ExitCode::SUCCESS,
                    Some(why) => {
                        eprintln!("error: the controller ended ({why}); exiting");
                        ExitCode::FAILURE
                    }
                }
            }
            Err(e) => {
                eprintln!("error: starting the agent: {e}");
                ExitCode::FAILURE
            }
        }
    };
    drop(servers);
    code
}

/// Runs the controller only while this replica holds the Lease `hcp-fleet-agent` in the
/// agent's namespace. Losing the lease drops the controller at once (its tasks are tied to
/// it), so a former leader stops writing; the standby takes over within the lease duration.
///
/// kube-lease-manager reports a change of holder, but a leader cut off from the API server
/// hears nothing and would go on believing it leads. So the leader also watches the Lease
/// itself, like client-go's renew deadline: every renewal it sees moves its deadline to the
/// renewal plus the lease duration less a margin, and a leader that sees none by then stops
/// writing, before a standby can take the expired lease.
async fn run_leader_elected(
    client: kube::Client,
    lease_client: kube::Client,
    args: &AgentArgs,
    metrics: Arc<Metrics>,
    opts: impl Fn() -> StartOptions,
) -> ExitCode {
    use futures::StreamExt;
    use tokio::time::Instant;
    let identity = replica_identity();
    let duration = args.lease_duration_seconds;
    let (_, margin) = lease_timing(duration);
    let lease_duration = std::time::Duration::from_secs(duration);
    let manager =
        match lease_manager(lease_client.clone(), &args.namespace, &identity, duration).await {
            Ok(m) => m,
            Err(e) => {
                eprintln!(
                    "error: leader election on Lease {}/{LEASE_NAME}: {e}",
                    args.namespace
                );
                return ExitCode::FAILURE;
            }
        };
    let (mut leading, lease_task) = manager.watch().await;
    let Some((mut term, mut int)) = stop_signals() else {
        eprintln!("error: cannot install signal handlers");
        return ExitCode::FAILURE;
    };
    let mut renewals = std::pin::pin!(lease_renewals(lease_client, &args.namespace));
    let mut file = ConfigWatch::new(args.config.clone());
    let mut hook = TestHook::new();
    let mut code = ExitCode::SUCCESS;
    // Until when this replica may write without seeing its lease renewed again.
    let mut deadline = Instant::now();
    let mut handle: Option<AgentHandle> = None;
    tracing::info!(%identity, "waiting for the leader lease");
    loop {
        let mut start_now = false;
        tokio::select! {
            changed = leading.changed() => {
                if changed.is_err() {
                    break;
                }
                let is_leader = *leading.borrow_and_update();
                if is_leader {
                    // The lease manager has just written the lease.
                    deadline = Instant::now() + lease_duration.saturating_sub(margin);
                    start_now = handle.is_none();
                } else if handle.is_some() {
                    tracing::warn!(%identity, "lost the leader lease; stopping the controller");
                    stop_leading(&mut handle, &metrics);
                }
            }
            seen = renewals.next() => {
                match seen {
                    Some(Ok(lease)) => {
                        if let Some(until) = lease_deadline(&lease, &identity, lease_duration, margin) {
                            deadline = until;
                            if handle.is_none() && *leading.borrow() && Instant::now() < deadline {
                                tracing::info!(%identity, "the leader lease is confirmed again");
                                start_now = true;
                            }
                        } else if handle.is_some() && held_by_another(&lease, &identity) {
                            // A starved leader's deadline timer can fire late; the Lease naming
                            // someone else is proof enough, and the lease manager would only
                            // tell us at its next poll.
                            tracing::warn!(%identity, "the leader lease names another holder; stopping the controller");
                            stop_leading(&mut handle, &metrics);
                        }
                    }
                    // Retried with backoff; a refusal (RBAC) shows here, and without renewals seen
                    // the leader stops at its deadline, which the NoLeader alert reports.
                    Some(Err(e)) => tracing::warn!(error = %hcp_fleet_agent::human::WatchError(&e), "watching the leader lease"),
                    None => break,
                }
            }
            _ = tokio::time::sleep_until(deadline), if handle.is_some() => {
                tracing::error!(%identity, "no renewal of the leader lease seen; stopping writes before it can expire");
                stop_leading(&mut handle, &metrics);
            }
            // The leader applies a changed file as a single replica does; a standby reads
            // the file when it takes over.
            _ = file.due() => {
                if let Some(h) = &handle {
                    reload(h, args);
                }
            }
            // A controller that ended on its own (a panic) leaves this replica unable to do
            // its job: give the Lease back and exit non-zero, so a standby leads at once and
            // the kubelet restarts this one.
            why = metrics.liveness.ended() => {
                tracing::error!(%identity, %why, "the controller ended; handing the leader lease back and exiting");
                code = ExitCode::FAILURE;
                break;
            }
            _ = hook.fired() => {
                if let Some(h) = &handle {
                    h.kill_controller();
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
        if start_now {
            tracing::info!(%identity, "acquired the leader lease; starting the controller");
            handle = start_leading(&client, args, opts(), &metrics).await;
        }
    }
    // Stop writing first, then hand the lease back (dropping the receiver releases it).
    stop_leading(&mut handle, &metrics);
    drop(leading);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), lease_task).await;
    code
}

/// Stops the controller of a replica that no longer leads, and drops its per-hosted-cluster
/// series (its last verdicts would linger beside the new leader's).
fn stop_leading(handle: &mut Option<AgentHandle>, metrics: &Metrics) {
    *handle = None;
    metrics.leader.set(0);
    metrics.forget_fleet();
}

/// SIGTERM and SIGINT, each a stream of its own.
fn stop_signals() -> Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)> {
    use tokio::signal::unix::{SignalKind, signal};
    Some((
        signal(SignalKind::terminate()).ok()?,
        signal(SignalKind::interrupt()).ok()?,
    ))
}

/// Every write of the Lease `hcp-fleet-agent` in `namespace` (retried with backoff): the
/// renewals a leader must keep seeing.
fn lease_renewals(
    client: kube::Client,
    namespace: &str,
) -> impl futures::Stream<
    Item = Result<k8s_openapi::api::coordination::v1::Lease, kube::runtime::watcher::Error>,
> {
    use kube::runtime::{WatchStreamExt, watcher};
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client, namespace);
    watcher(
        leases,
        watcher::Config::default().fields(&format!("metadata.name={LEASE_NAME}")),
    )
    .default_backoff()
    .applied_objects()
}

/// This replica's name on the Lease: its pod's, else one made from the process id.
fn replica_identity() -> String {
    std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("hcp-fleet-agent-{}", std::process::id()))
}

/// The controller of a replica that has just taken the lease, with the configuration read
/// now; `None` (said in the log) when the configuration is refused or the start fails, and
/// the next lease event tries again.
async fn start_leading(
    client: &kube::Client,
    args: &AgentArgs,
    opts: StartOptions,
    metrics: &Arc<Metrics>,
) -> Option<AgentHandle> {
    let cfg = match load_config(args) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "configuration refused");
            return None;
        }
    };
    match start_with_metrics(client.clone(), cfg, opts, metrics.clone()).await {
        Ok(h) => {
            metrics.leader.set(1);
            Some(h)
        }
        Err(e) => {
            tracing::error!(error = %e, "starting the controller failed");
            None
        }
    }
}

/// The leader election of one replica `identity` on the Lease `hcp-fleet-agent` in `namespace`.
///
/// Each replica writes the Lease as its own field manager: taking a free Lease is a
/// server-side apply of `holderIdentity`, and only between different managers does the API
/// server refuse the second of two such applies (409). Under one shared manager both would
/// succeed, the later silently overwriting the earlier, and two replicas that start together
/// could each believe, for up to a renewal interval, that it leads.
pub async fn lease_manager(
    client: kube::Client,
    namespace: &str,
    identity: &str,
    duration: u64,
) -> Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError> {
    let (grace, _) = lease_timing(duration);
    kube_lease_manager::LeaseManagerBuilder::new(client, LEASE_NAME)
        .with_namespace(namespace)
        .with_identity(identity)
        .with_duration(duration)
        .with_grace(grace)
        .with_field_manager(lease_field_manager(identity))
        .build()
        .await
}

/// The field manager of `identity`'s writes to the Lease (see [`lease_manager`]).
pub(crate) fn lease_field_manager(identity: &str) -> String {
    format!(
        "{}-lease-{identity}",
        hcp_fleet_render::management::FIELD_MANAGER
    )
}

/// For a lease of `duration` seconds: how long before expiry the lease manager renews
/// (`grace`, seconds), and how long before expiry a leader that has seen no renewal stops
/// (`margin`). Renewing at half the lease leaves the renewal most of the other half to land
/// and be seen before the deadline (2.4 s for a 6 s lease, 6.5 s for 15 s), so a slow API
/// server delays a renewal without making the leader stop; a margin of a tenth (at least
/// 0.5 s) keeps the stop ahead of a standby's takeover.
pub(crate) fn lease_timing(duration: u64) -> (u64, std::time::Duration) {
    let grace = duration.saturating_sub(duration / 2).max(1);
    let margin = std::time::Duration::from_millis((duration * 100).max(500));
    (grace, margin)
}

use hcp_fleet_model::names::LEASE_NAME;

/// Whether `lease` names a holder other than `identity` (an empty or missing holder is a
/// released lease, not a rival).
pub(crate) fn held_by_another(
    lease: &k8s_openapi::api::coordination::v1::Lease,
    identity: &str,
) -> bool {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .is_some_and(|h| !h.is_empty() && h != identity)
}

/// If `identity` holds `lease`, until when it may write: the recorded renewal plus the lease
/// duration, less `margin`. The lease manager writes renewTime from this replica's own clock,
/// so the comparison needs no agreement between clocks.
pub(crate) fn lease_deadline(
    lease: &k8s_openapi::api::coordination::v1::Lease,
    identity: &str,
    duration: std::time::Duration,
    margin: std::time::Duration,
) -> Option<tokio::time::Instant> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed = spec.renew_time.as_ref()?.0;
    let age = jiff::Timestamp::now().duration_since(renewed);
    let age = std::time::Duration::try_from(age).unwrap_or_default();
    Some(tokio::time::Instant::now() + duration.saturating_sub(margin).saturating_sub(age))
}

/// Until SIGINT/SIGTERM: reload the configuration on SIGHUP, and when the file changes (a
/// mounted ConfigMap is swapped in place, so its content is compared every few seconds; this
/// reads a local file, not the API).
/// Until a signal (None) or the controller's end (why).
async fn wait_and_reload(handle: &AgentHandle, args: &AgentArgs) -> Option<String> {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        let _ = tokio::signal::ctrl_c().await;
        return None;
    };
    let mut file = ConfigWatch::new(args.config.clone());
    let mut hook = TestHook::new();
    let liveness = &handle.context.metrics.liveness;
    loop {
        tokio::select! {
            _ = term.recv() => return None,
            _ = int.recv() => return None,
            why = liveness.ended() => return Some(why),
            _ = file.due() => reload(handle, args),
            _ = hook.fired() => handle.kill_controller(),
        }
    }
}

/// A test-only hook, off unless `HCP_FLEET_TEST_HOOKS` is set: SIGUSR2 ends the controller as
/// a crash would, so the e2e suite can see what follows (docs/testbed.md).
struct TestHook(Option<tokio::signal::unix::Signal>);

impl TestHook {
    fn new() -> Self {
        let on = std::env::var_os("HCP_FLEET_TEST_HOOKS").is_some_and(|v| !v.is_empty());
        Self(
            on.then(|| {
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2()).ok()
            })
            .flatten(),
        )
    }

    async fn fired(&mut self) {
        match &mut self.0 {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending().await,
        }
    }
}

fn reload(handle: &AgentHandle, args: &AgentArgs) {
    match handle.reload(args) {
        Ok(true) => tracing::info!("configuration reloaded"),
        Ok(false) => {}
        Err(e) => {
            tracing::error!(error = %e, "new configuration refused; keeping the last good one")
        }
    }
}

/// When the configuration file is to be read again: on SIGHUP, and when its content changes
/// (a mounted ConfigMap is swapped in place, so the content is compared every 5 s).
pub struct ConfigWatch {
    path: Option<PathBuf>,
    last: Option<Vec<u8>>,
    tick: tokio::time::Interval,
    hup: Option<tokio::signal::unix::Signal>,
}

impl ConfigWatch {
    /// Watches `path` (none: only SIGHUP), as read now.
    pub fn new(path: Option<PathBuf>) -> Self {
        let last = path.as_ref().and_then(|p| std::fs::read(p).ok());
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            path,
            last,
            tick,
            hup: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
        }
    }

    /// Resolves when the file should be re-read (cancel-safe: usable in `select!`).
    pub async fn due(&mut self) {
        loop {
            let forced = tokio::select! {
                _ = async {
                    match self.hup.as_mut() {
                        Some(h) => { h.recv().await; }
                        None => futures::future::pending::<()>().await,
                    }
                } => true,
                _ = self.tick.tick() => false,
            };
            let now = self.path.as_ref().and_then(|p| std::fs::read(p).ok());
            if forced || now != self.last {
                self.last = now;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use std::time::Duration;

    fn lease(holder: &str, renewed_secs_ago: i64) -> Lease {
        let renewed = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(renewed_secs_ago);
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(renewed)),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_deadline_counts_from_the_recorded_renewal() {
        let (d, m) = (Duration::from_secs(15), Duration::from_millis(2500));
        let now = tokio::time::Instant::now();
        let fresh = lease_deadline(&lease("me", 0), "me", d, m).expect("holder");
        let fresh_left = fresh.duration_since(now);
        assert!(
            fresh_left > Duration::from_secs(12) && fresh_left <= Duration::from_millis(12_600),
            "{fresh_left:?}"
        );
        let old = lease_deadline(&lease("me", 10), "me", d, m).expect("holder");
        let old_left = old.duration_since(now);
        assert!(old_left <= Duration::from_millis(2_600), "{old_left:?}");
        // Expired long ago: the deadline is already here, never in the future.
        let gone = lease_deadline(&lease("me", 60), "me", d, m).expect("holder");
        assert!(gone.duration_since(now) < Duration::from_millis(100));
    }

    #[test]
    fn a_renewal_has_time_to_land_before_the_deadline() {
        for d in [3u64, 6, 10, 15, 60] {
            let (grace, margin) = lease_timing(d);
            let renew_at = Duration::from_secs(d - grace);
            let deadline = Duration::from_secs(d) - margin;
            assert!(
                renew_at < deadline,
                "{d}s: renew {renew_at:?}, deadline {deadline:?}"
            );
            assert!(
                deadline - renew_at >= Duration::from_millis(1500),
                "{d}s: {:?} of slack",
                deadline - renew_at
            );
            assert!(
                margin >= Duration::from_millis(500),
                "{d}s: stop ahead of a takeover"
            );
        }
    }

    #[test]
    fn another_holder_gives_no_deadline() {
        let d = Duration::from_secs(15);
        assert!(lease_deadline(&lease("other", 0), "me", d, Duration::ZERO).is_none());
        assert!(held_by_another(&lease("other", 0), "me"));
        assert!(!held_by_another(&lease("me", 0), "me"));
        assert!(!held_by_another(&lease("", 0), "me"));
        assert!(!held_by_another(&Lease::default(), "me"));
        assert!(lease_deadline(&Lease::default(), "me", d, Duration::ZERO).is_none());
    }
}
