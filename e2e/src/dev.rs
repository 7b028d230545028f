//! `hcp-fleet-agent dev`: the whole job on an embedded default. It brings up the local fleet
//! (etcd, a management kube-apiserver, N hosted kube-apiservers, HCP fixtures), runs the agent
//! on it, prints the fleet's health once it has converged, and keeps running until Ctrl-C.
//! The admission services are real: the test bed's stand-in kubelet runs this binary's
//! `webhook` command for each admission Deployment, and the hosted kube-apiservers call them.
//! Each hosted cluster has a data plane (its controller manager, a scheduler, two kubelets),
//! and once the guards are in force the platform and a customer's work are written into it
//! (`hcp_fleet_testbed::platform`); the summary says whether any guard refused any of it.

use std::path::PathBuf;
use std::process::ExitCode;

use hcp_fleet_testbed as localcp;

use hcp_fleet_testbed::FleetOptions;

use hcp_fleet_testbed::LocalFleet;

#[derive(Debug, clap::Args)]
pub struct DevArgs {
    /// How many hosted clusters (each a kube-apiserver and an HCP namespace).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub hosted_clusters: u16,
    /// A fixed port for the management kube-apiserver (default: any free port).
    #[arg(long)]
    pub management_port: Option<u16>,
    /// The port of the agent's /metrics, /healthz and /readyz on 127.0.0.1 (default: any free
    /// port; the address is printed).
    #[arg(long, default_value_t = 0)]
    pub metrics_port: u16,
    /// Where to put the fleet's state directory (removed on exit).
    #[arg(long)]
    pub state_parent: Option<PathBuf>,
    /// Directory with kube-apiserver, kube-controller-manager, etcd and kubectl (default: KUBEBUILDER_ASSETS, then the
    /// cache filled by hack/testbed-assets.sh).
    #[arg(long, env = "KUBEBUILDER_ASSETS")]
    pub assets: Option<PathBuf>,
    /// The agent's configuration file (YAML, as the chart's `config`; the built-in defaults
    /// without one), with the test bed's loopback API servers allowed. Read again when it
    /// changes, as the agent reads its mounted ConfigMap: a bad one is refused and the running
    /// one kept.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Also the ACM hub's rows for the fleet (Governance: the management cluster's and each
    /// hosted cluster's), ACM's framework addon replayed as the e2e suite replays it
    /// (`e2e/src/hub.rs`), printed once the fleet has converged and again when one changes.
    #[arg(long)]
    pub acm: bool,
}

/// The configuration `dev` runs the agent with: the file (or the defaults), validated as the
/// agent validates it, with the test bed's loopback servers allowed.
fn dev_config(
    path: Option<&std::path::Path>,
) -> Result<hcp_fleet_render::config::AgentConfig, hcp_fleet_render::config::ConfigError> {
    hcp_fleet_cli::config_file::load_or_default(path).map(localcp::allow_loopback)
}

/// When `path` changes (or on SIGHUP: the agent's own `ConfigWatch`), has the agent take it as
/// it takes its own file (`AgentHandle::reload_from`: refused with
/// `hcp_fleet_config_last_reload_successful` 0 and a Warning Event, or swapped in and every HCP
/// reconciled), saying which on stdout.
async fn reload_on_change(agent: &hcp_fleet_cli::agent::AgentHandle, path: &std::path::Path) {
    let mut file = hcp_fleet_cli::agent::ConfigWatch::new(Some(path.to_path_buf()));
    loop {
        file.due().await;
        match agent.reload_from(|| dev_config(Some(path))) {
            Ok(true) => println!("configuration reloaded from {}", path.display()),
            Ok(false) => {}
            Err(e) => println!("configuration refused, the agent runs the last good one: {e}"),
        }
    }
}

pub async fn run(args: DevArgs) -> ExitCode {
    // A bad file is refused before anything starts.
    let cfg = match dev_config(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = FleetOptions {
        assets_dir: args.assets.clone(),
        management_port: args.management_port,
        state_parent: args.state_parent.clone(),
        ..FleetOptions::with_hosted(usize::from(args.hosted_clusters))
    };
    eprintln!(
        "starting a local fleet: etcd, a management kube-apiserver and {} hosted kube-apiservers…",
        args.hosted_clusters
    );
    // Ctrl-C during start-up must also clean up: race the start against the signal, so the
    // half-built fleet is dropped (and its processes stopped) either way.
    let started = tokio::select! {
        r = LocalFleet::start(opts) => r,
        _ = shutdown_signal() => {
            eprintln!("interrupted during start-up; stopped everything");
            return ExitCode::from(130);
        }
    };
    let mut fleet = match started {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The agent and the test bed's stand-in kubelet, on the local fleet.
    let (agent, kubelet) = match start_agent(&fleet, cfg).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The agent's /metrics, as the chart's Deployment serves it (on loopback here).
    let metrics = match tokio::net::TcpListener::bind(("127.0.0.1", args.metrics_port)).await {
        Ok(l) => {
            let addr = l.local_addr().ok();
            let _served = hcp_fleet_cli::agent::serve(l, agent.context.metrics.clone());
            addr
        }
        Err(e) => {
            eprintln!(
                "warning: the agent's /metrics is not served: 127.0.0.1:{}: {e}",
                args.metrics_port
            );
            None
        }
    };
    print_summary(&fleet, args.assets.as_deref(), metrics);
    let names: Vec<String> = fleet.hosted.keys().cloned().collect();
    match wait_for_fleet(&fleet, &names).await {
        Ok(table) => {
            println!("Fleet health (from the AdmissionHealth records):");
            println!("{table}");
            println!(
                "Admission services (their pods on the management cluster; each guard's path, from the record):"
            );
            for line in admission_lines(&fleet, &names, &agent.context.config()).await {
                println!("  {line}");
            }
            println!();
        }
        Err(e) => eprintln!("warning: the fleet did not converge: {e}"),
    }
    platforms(&fleet, &names).await;
    let hub = if args.acm {
        hub_rows(&fleet, &names).await
    } else {
        None
    };
    if let Some(path) = &args.config {
        println!(
            "the agent's configuration: {} (read again when it changes)",
            path.display()
        );
    }
    println!("READY");
    until_stopped(&agent, args.config.as_deref(), hub).await;
    drop(agent);
    kubelet.abort();
    eprintln!("stopping the local fleet…");
    fleet.shutdown();
    drop(fleet);
    eprintln!("stopped; state directory removed");
    ExitCode::SUCCESS
}

/// Until Ctrl-C: the configuration file read again when it changes (`--config`), the hub's
/// rows printed when they change (`--acm`).
async fn until_stopped(
    agent: &hcp_fleet_cli::agent::AgentHandle,
    config: Option<&std::path::Path>,
    hub: Option<Hub>,
) {
    let reload = async {
        match config {
            Some(path) => reload_on_change(agent, path).await,
            None => std::future::pending().await,
        }
    };
    let rows = async {
        match hub {
            Some(hub) => watch_hub(hub).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = reload => {}
        () = rows => {}
        () = shutdown_signal() => {}
    }
}

/// The hub's rows on the demo (`--acm`): where they are read, and what was printed of each.
struct Hub {
    mgmt: kube::Client,
    rows: Vec<crate::hub::Row>,
    shown: std::collections::BTreeMap<String, String>,
}

/// The hub's rows (`--acm`), set up and printed once each has a verdict (a minute at most).
async fn hub_rows(fleet: &LocalFleet, names: &[String]) -> Option<Hub> {
    let mgmt = match fleet.management.client().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("warning: no hub rows: {e}");
            return None;
        }
    };
    let rows = crate::hub::rows(&mgmt, names).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let shown = loop {
        let shown = crate::hub::read(&mgmt, &rows).await;
        let pending = shown
            .values()
            .any(|t| !t.starts_with("Compliant") && !t.starts_with("NonCompliant"));
        if !pending || std::time::Instant::now() > deadline {
            break shown;
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    };
    println!(
        "ACM hub (Governance: one row per managed cluster, as ACM's framework addon, replayed, reports them):"
    );
    for line in crate::hub::lines(&shown) {
        println!("{line}");
    }
    Some(Hub { mgmt, rows, shown })
}

/// Reads the hub's rows every 5 s and prints those that changed.
async fn watch_hub(hub: Hub) {
    let Hub {
        mgmt,
        rows,
        mut shown,
    } = hub;
    let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        every.tick().await;
        let now = crate::hub::read(&mgmt, &rows).await;
        let changed: std::collections::BTreeMap<String, String> = now
            .iter()
            .filter(|(ns, t)| shown.get(*ns) != Some(*t))
            .map(|(ns, t)| (ns.clone(), t.clone()))
            .collect();
        if !changed.is_empty() {
            println!("ACM hub, changed:");
            for line in crate::hub::lines(&changed) {
                println!("{line}");
            }
        }
        shown = now;
    }
}

/// Each hosted cluster's platform, and a customer's work, under the guards just installed: what
/// was written and refused, and the kubelets' token requests.
async fn platforms(fleet: &LocalFleet, names: &[String]) {
    for name in names {
        match localcp::platform::install(fleet, name).await {
            Ok(r) => {
                let refused = r.refused();
                let tokens = fleet
                    .data_plane(name)
                    .map(|d| d.tokens())
                    .unwrap_or_default();
                let denied = tokens.iter().filter(|t| t.outcome.is_err()).count();
                println!(
                    "{name}: data plane on {} nodes: {} writes by the platform and a customer, {} refused; {} kubelet token requests so far, {denied} refused",
                    fleet.data_plane(name).map_or(0, |d| d.nodes.len()),
                    r.writes.len(),
                    refused.len(),
                    tokens.len(),
                );
                for w in refused {
                    println!("  refused: {} by {}: {:?}", w.what, w.by, w.outcome);
                }
            }
            Err(e) => eprintln!("warning: {name}'s data plane: {e}"),
        }
    }
}

fn print_summary(
    fleet: &LocalFleet,
    assets: Option<&std::path::Path>,
    metrics: Option<std::net::SocketAddr>,
) {
    let kubectl = localcp::Assets::resolve(assets)
        .map(|a| a.kubectl.display().to_string())
        .unwrap_or_else(|_| "kubectl".to_string());
    println!("Local fleet is up. State: {}", fleet.state_dir().display());
    println!();
    println!("  {:<12} {:<26} KUBECONFIG", "CLUSTER", "API SERVER");
    println!(
        "  {:<12} {:<26} {}",
        "management",
        fleet.management.url(),
        fleet.management.kubeconfig_path.display()
    );
    for (name, s) in &fleet.hosted {
        println!(
            "  {:<12} {:<26} {}",
            name,
            s.url(),
            s.kubeconfig_path.display()
        );
    }
    println!();
    println!(
        "Try (the servers run Kubernetes {} over etcd {}):",
        fleet.version,
        fleet
            .etcd_version
            .as_deref()
            .unwrap_or("of an unknown version")
    );
    println!(
        "  {kubectl} --kubeconfig {} get hostedcontrolplanes -A",
        fleet.management.kubeconfig_path.display()
    );
    if let Some((_, s)) = fleet.hosted.iter().next() {
        println!(
            "  {kubectl} --kubeconfig {} get namespaces",
            s.kubeconfig_path.display()
        );
    }
    if let Some(addr) = metrics {
        println!("  curl -s http://{addr}/metrics | grep ^hcp_fleet_   # the agent's metrics");
    }
    let pids: Vec<String> = fleet.pids().iter().map(u32::to_string).collect();
    println!();
    println!("pids: {}", pids.join(" "));
    println!("Press Ctrl-C to stop; every process is stopped and the state directory removed.");
}

/// One line per hosted cluster: how many admission pods its HCP namespace runs (the
/// Deployment's ready replicas, as the stand-in kubelet reports them), and how many of its
/// guards take each path. A cluster whose every guard runs inside its hosted kube-apiserver
/// (1.36 with the defaults) has none.
async fn admission_lines(
    fleet: &LocalFleet,
    names: &[String],
    cfg: &hcp_fleet_render::config::AgentConfig,
) -> Vec<String> {
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::Api;
    let Ok(mgmt) = fleet.management.client().await else {
        return vec!["(the management cluster did not answer)".into()];
    };
    let mut lines = Vec::new();
    for name in names {
        let ns = localcp::fixtures::hcp_namespace(name);
        let deployment = Api::<Deployment>::namespaced(mgmt.clone(), &ns)
            .get_opt(&cfg.admission.service_name)
            .await
            .ok()
            .flatten();
        let record = Api::<hcp_fleet_model::crd::AdmissionHealth>::namespaced(mgmt.clone(), &ns)
            .get_opt(hcp_fleet_render::reporting::record::health_name(name))
            .await
            .ok()
            .flatten();
        let guards = record
            .and_then(|r| r.status)
            .map(|s| s.guards)
            .unwrap_or_default();
        let mut paths: std::collections::BTreeMap<&str, usize> = Default::default();
        for g in &guards {
            *paths.entry(g.path.as_str()).or_default() += 1;
        }
        let paths = paths
            .iter()
            .map(|(p, n)| format!("{p}={n}"))
            .collect::<Vec<_>>()
            .join(",");
        let pods = match deployment {
            None => {
                "no admission pods: every guard runs inside the hosted kube-apiserver".to_string()
            }
            Some(d) => format!(
                "{} admission pod(s): {} guard(s) call the service",
                d.status.and_then(|s| s.ready_replicas).unwrap_or(0),
                guards.iter().filter(|g| g.path == "webhook").count()
            ),
        };
        lines.push(format!("{name:<12} {pods} ({paths})"));
    }
    lines
}

/// Why `dev` has no agent or no fleet table.
#[derive(Debug, thiserror::Error)]
enum DevError {
    #[error(transparent)]
    TestBed(#[from] localcp::LocalCpError),
    #[error("starting the agent: {0}")]
    Agent(#[source] kube::Error),
    #[error("timed out:\n{0}")]
    NotConverged(String),
}

async fn start_agent(
    fleet: &LocalFleet,
    cfg: hcp_fleet_render::config::AgentConfig,
) -> Result<
    (
        hcp_fleet_cli::agent::AgentHandle,
        tokio::task::JoinHandle<()>,
    ),
    DevError,
> {
    let mgmt = fleet.management.client().await?;
    // The stand-in kubelet runs this very binary's `webhook` command for each admission pod.
    let kubelet = localcp::kubelet::spawn(
        mgmt.clone(),
        localcp::kubelet::KubeletOptions {
            binary: std::env::current_exe().ok(),
            dir: fleet.state_dir().join("kubelet"),
        },
    );
    let agent = hcp_fleet_cli::agent::start(
        mgmt,
        cfg,
        hcp_fleet_cli::agent::StartOptions {
            agent_namespace: "hcp-fleet-agent".into(),
            endpoints: localcp::kubelet::endpoints(),
        },
    )
    .await
    .map_err(DevError::Agent)?;
    Ok((agent, kubelet))
}

/// Waits (60 s at most) until every hosted cluster's health record has a verdict, then renders the
/// fleet table (the same one `hcp-fleet-agent status` prints).
async fn wait_for_fleet(fleet: &LocalFleet, names: &[String]) -> Result<String, DevError> {
    let mgmt = fleet.management.client().await?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let rows = hcp_fleet_cli::status::fleet_rows(&mgmt, &Default::default())
            .await
            .unwrap_or_default();
        let done = rows.len() == names.len()
            && rows
                .iter()
                .all(|r| r.compliant != "Pending" && r.compliant != "-");
        if done {
            return Ok(hcp_fleet_cli::status::render_table(&rows));
        }
        if std::time::Instant::now() > deadline {
            return Err(DevError::NotConverged(hcp_fleet_cli::status::render_table(
                &rows,
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        _ => {
            // Without signal handlers, Ctrl-C would kill us before Drop runs; PDEATHSIG
            // still takes the children down with us.
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
