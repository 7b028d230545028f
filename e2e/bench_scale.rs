//! `make bench`: one agent (a release process, leader-elected as the chart runs it) and a
//! thousand HCPs on a real management kube-apiserver of the newest test-bed version.
//!
//! The hosted side is mostly SIMULATED: 1,000 real hosted kube-apiservers do not fit on one
//! machine, so all but BENCH_SCALE_REAL of them are played by one HTTPS server in this process
//! (`simhosted`: real TLS, a CA and SNI name per cluster, the part of the Kubernetes API the
//! agent uses, the probe answered as a working admission service would). The real ones (16 by
//! default) are kube-apiservers of the test bed's newest version calling real admission
//! services over TLS (docs/benchmarks.md has every run), so both kinds
//! are printed side by side. Every figure from simulated clusters is marked as such.
//!
//! For each size of BENCH_SCALE_SIZES (default 250,1000; the growth curves of
//! docs/benchmarks.md are 250,1000,2000,3000 and 1000,3000,5000), in one run:
//! - fresh install: the agent starts with nothing of its own anywhere, until every HCP's
//!   health record is Compliant (the previous size's objects are first removed with the
//!   agent's own `uninstall`), and the management requests it made, per HCP, by verb and
//!   resource (the test bed's own lookups are not the agent's: its stand-in kubelet publishes
//!   addresses on the Service, which the agent reads from its watch);
//! - the agent's RSS after convergence, and per HCP (the growth between sizes);
//! - BENCH_IDLE_SECONDS (default 60) of idle: the agent's CPU, its management requests (by
//!   verb and resource) and its hosted requests per cluster;
//! - the peak write rate on the management kube-apiserver (writes per second, sampled);
//! - a restart over the converged fleet: SIGTERM, a new agent, until its own reconciles have
//!   found every HCP Compliant, and the management writes it made (the Lease's apart).
//!
//! At the largest size, also: drift repair latency (BENCH_SCALE_DRIFTS, default 100 simulated
//! and every real cluster), a new HCP until Compliant (BENCH_SCALE_NEW simulated, default 10,
//! and one real), and a configuration change (a guard's mode flipped) until every cluster
//! carries it.
//!
//! BENCH_SCALE_SERVICE=1 gives every HCP an admission service; BENCH_SCALE_CONCURRENCY and
//! BENCH_SCALE_RPS set the agent's `concurrency` and management request rate (the defaults'
//! otherwise), to size them.

// An e2e scenario reads as one story, set up, acted and checked in order: the 100-line and
// seven-argument limits hold the shipped code in src/ (clippy.toml).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)]

#[path = "bench_scale/figures.rs"]
mod figures;
#[path = "bench_scale/report.rs"]
mod report;
#[path = "support/mod.rs"]
mod support;
use figures::*;
use report::print_report;

use support::{cpu_ticks, env_num, guarded, percentile, proc_status_kib};

#[path = "simhosted/mod.rs"]
mod simhosted;

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hcp_fleet_model::Mode;
use hcp_fleet_model::crd::{AdmissionHealth, ComplianceState};
use hcp_fleet_render::config::AgentConfig;
use hcp_fleet_render::hosted::webhooks::VALIDATING_NAME;
use hcp_fleet_testbed::fixtures;
use hcp_fleet_testbed::fixtures::hcp_namespace;
use hcp_fleet_testbed::{FleetOptions, LocalFleet, allow_loopback, free_port, kubelet};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicyBinding, ValidatingWebhookConfiguration,
};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use simhosted::{Kind, SimFleet};

/// When each HCP namespace's health record turned Compliant (and still is).
#[derive(Clone, Default)]
struct Health(Arc<Mutex<HashMap<String, Instant>>>);

impl Health {
    fn watch(&self, mgmt: Client) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let api: Api<AdmissionHealth> = Api::all(mgmt);
            let mut s = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
            while let Some(ev) = s.next().await {
                let Ok(ev) = ev else { continue };
                let Ok(mut m) = me.0.lock() else { return };
                match ev {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        if !hcp_fleet_render::reporting::record::is_health_record(&p) {
                            continue;
                        }
                        let ns = p.namespace().unwrap_or_default();
                        let ok = p.status.as_ref().and_then(|s| s.compliant)
                            == Some(ComplianceState::Compliant);
                        if ok {
                            m.entry(ns).or_insert_with(Instant::now);
                        } else {
                            m.remove(&ns);
                        }
                    }
                    watcher::Event::Delete(p) => {
                        m.remove(&p.namespace().unwrap_or_default());
                    }
                    _ => {}
                }
            }
        })
    }

    fn since(&self, ns: &str) -> Option<Instant> {
        self.0.lock().ok()?.get(ns).copied()
    }

    /// Waits until every namespace of `of` is Compliant; when each turned so.
    async fn all(&self, of: &[String], within: Duration) -> Result<Vec<Instant>, String> {
        let deadline = Instant::now() + within;
        loop {
            let got: Vec<Option<Instant>> = of.iter().map(|ns| self.since(ns)).collect();
            if got.iter().all(Option::is_some) {
                return Ok(got.into_iter().flatten().collect());
            }
            if Instant::now() > deadline {
                let missing: Vec<&String> = of
                    .iter()
                    .zip(&got)
                    .filter(|(_, g)| g.is_none())
                    .map(|(n, _)| n)
                    .take(5)
                    .collect();
                return Err(format!(
                    "only {}/{} Compliant within {within:?} (not yet: {missing:?}…)",
                    got.iter().filter(|g| g.is_some()).count(),
                    of.len()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

const COMPLIANCE: &str = "hcp_fleet_hosted_cluster_compliance";

/// A management write other than the Lease's (which every replica renews whatever it does).
fn is_fleet_write(key: &str) -> bool {
    let mut it = key.split(' ');
    let (verb, resource) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
    is_write(verb) && resource != "leases"
}

/// The requests the sampled simulated cluster has served, by call (`simhosted::Requests`).
fn sampled_calls(sim: &SimFleet) -> BTreeMap<String, u64> {
    sim.clusters()
        .find_map(|c| c.requests.calls())
        .unwrap_or_default()
}

/// CPU ticks (`support::TICKS_PER_SECOND`) of the processes a restart runs on. On a machine of
/// two cores the restart is the CPU of all of them, so its wall time moves with what the
/// simulated clusters and the servers spend as much as with the agent's own work; these say
/// whose work it was.
#[derive(Clone, Copy, Default)]
struct RestartCpu {
    agent: u64,
    /// This process: the simulated clusters' server, and the benchmark's own looks.
    simulated: u64,
    /// The management kube-apiserver.
    management: u64,
    /// The real hosted kube-apiservers and etcd.
    real: u64,
    /// The whole machine's busy ticks (every CPU).
    machine: u64,
}

impl RestartCpu {
    fn now(fleet: &LocalFleet, agent: &Agent) -> Self {
        let management = fleet.management.pid();
        let real = fleet
            .pids()
            .into_iter()
            .filter(|p| Some(*p) != management)
            .map(cpu_ticks)
            .sum();
        Self {
            agent: cpu_ticks(agent.pid),
            simulated: cpu_ticks(std::process::id()),
            management: management.map(cpu_ticks).unwrap_or_default(),
            real,
            machine: machine_busy_ticks(),
        }
    }

    /// From `self` (the agent's taken as zero: a new process) to `later`.
    fn until(&self, later: &Self) -> Self {
        Self {
            agent: later.agent,
            simulated: later.simulated.saturating_sub(self.simulated),
            management: later.management.saturating_sub(self.management),
            real: later.real.saturating_sub(self.real),
            machine: later.machine.saturating_sub(self.machine),
        }
    }
}

/// The machine's busy ticks over all its CPUs (`/proc/stat`'s first line: all but idle and
/// iowait).
fn machine_busy_ticks() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return 0;
    };
    let Some(line) = stat.lines().next() else {
        return 0;
    };
    line.split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse::<u64>().ok())
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .sum()
}

/// A restarted agent over a converged fleet: how long until its own reconciles have found
/// every HCP Compliant (its compliance gauge, 0 for each; the records already said so), and
/// the management writes it made until then and for 5 s after (the Lease's apart), by verb
/// and resource; and whose CPU it was, from `cpu0` (read as the agent started).
async fn restarted(
    fleet: &LocalFleet,
    agent: &Agent,
    cpu0: RestartCpu,
    n: usize,
    within: Duration,
) -> Result<(Duration, f64, BTreeMap<String, f64>, RestartCpu), String> {
    let deadline = Instant::now() + within;
    // How many were Compliant at each look: where the time goes (the agent's start, its first
    // listings, the reconciles' steady rate) is the shape of this line.
    let mut seen = Vec::new();
    let took = loop {
        let text = agent.metrics().await?;
        let ok = samples(&text, COMPLIANCE)
            .values()
            .filter(|v| **v == 0.0)
            .count();
        seen.push(format!(
            "{:.1}s {ok}",
            agent.started.elapsed().as_secs_f64()
        ));
        if ok >= n {
            eprintln!(
                "bench: {n}: Compliant after the restart, by look: {}",
                seen.join(", ")
            );
            break (
                agent.started.elapsed(),
                cpu0.until(&RestartCpu::now(fleet, agent)),
            );
        }
        if Instant::now() > deadline {
            return Err(format!(
                "restart: only {ok}/{n} Compliant within {within:?}"
            ));
        }
        // Once a second: each look encodes every HCP's series (megabytes at 3,000), work a
        // Prometheus scraping every 30 s does not ask of the agent; five looks a second were
        // a fifth of the restarted agent's CPU (perf).
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let by: BTreeMap<String, f64> = management_delta("", &agent.metrics().await?)
        .into_iter()
        .filter(|(k, _)| is_fleet_write(k))
        .collect();
    let (took, cpu) = took;
    // A fold from 0.0: `sum` of no f64 is -0.0, which prints as "-0".
    Ok((took, by.values().fold(0.0, |a, b| a + b), by, cpu))
}

/// The agent as a separate release process.
struct Agent {
    child: Child,
    pid: u32,
    addr: std::net::SocketAddr,
    started: Instant,
}

impl Agent {
    async fn start(
        config: &std::path::Path,
        kubeconfig: &std::path::Path,
    ) -> Result<Agent, String> {
        let port = free_port().map_err(|e| e.to_string())?;
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}")
            .parse()
            .map_err(|e| format!("{e}"))?;
        let started = Instant::now();
        // BENCH_AGENT_WRAPPER: a command to run the agent under (a heap profiler, say:
        // `heaptrack`); its figures are then the wrapped agent's.
        let wrapper = std::env::var("BENCH_AGENT_WRAPPER").unwrap_or_default();
        let mut words = wrapper.split_whitespace();
        let mut cmd = match words.next() {
            Some(w) => {
                let mut c = Command::new(w);
                c.args(words).arg(env!("CARGO_BIN_EXE_hcp-fleet-dev"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev")),
        };
        let child = cmd
            .args(["agent", "--config"])
            .arg(config)
            .args([
                "--local-mode",
                "--metrics-addr",
                &addr.to_string(),
                "--namespace",
                "hcp-fleet-agent",
                "--leader-elect",
            ])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "warn,kube_client=off")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting the agent: {e}"))?;
        let pid = child.id();
        let mut agent = Agent {
            child,
            pid,
            addr,
            started,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while support::http_get(addr, "/readyz").await.map(|r| r.0) != Ok(200) {
            if Instant::now() > deadline {
                agent.stop();
                return Err("agent not ready within 30s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(agent)
    }

    async fn metrics(&self) -> Result<String, String> {
        support::http_get(self.addr, "/metrics").await.map(|r| r.1)
    }

    fn stop(&mut self) {
        // SIGTERM: it hands the Lease back, so the next agent leads at once.
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn reload(&self) {
        let _ = Command::new("kill")
            .args(["-HUP", &self.pid.to_string()])
            .status();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The highest management write rate seen (writes per second, over one-second samples).
struct WriteSampler {
    peak: Arc<Mutex<f64>>,
    task: tokio::task::JoinHandle<()>,
}

impl WriteSampler {
    fn start(addr: std::net::SocketAddr) -> WriteSampler {
        let peak = Arc::new(Mutex::new(0.0f64));
        let p = peak.clone();
        let task = tokio::spawn(async move {
            let mut last: Option<(Instant, f64)> = None;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Ok((_, text)) = support::http_get(addr, "/metrics").await else {
                    continue;
                };
                let now = (Instant::now(), management_writes(&text));
                if let Some((t, w)) = last {
                    let rate = (now.1 - w) / now.0.duration_since(t).as_secs_f64();
                    if let Ok(mut p) = p.lock() {
                        *p = f64::max(*p, rate);
                    }
                }
                last = Some(now);
            }
        });
        WriteSampler { peak, task }
    }

    fn take(&self) -> f64 {
        self.peak
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or(0.0)
    }
}

impl Drop for WriteSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one size measured.
#[derive(Default)]
struct SizeFigures {
    n: usize,
    converge: Duration,
    converge_real: Duration,
    converge_sim: Duration,
    rss_kib: u64,
    peak_rss_kib: u64,
    /// The admission Deployments on the management cluster after convergence, and their
    /// replicas (the admission pods: run by the test bed's kubelet for the real clusters,
    /// simulated for the rest).
    admission_deployments: usize,
    admission_pods: i64,
    /// The REAL admission pods (the test bed's kubelet runs them for the real clusters):
    /// how many processes, their RSS after convergence and their CPU over the idle window.
    real_pods: usize,
    real_pods_rss_kib: u64,
    real_pods_cpu_pct: f64,
    cpu_idle_pct: f64,
    mgmt_idle: BTreeMap<String, f64>,
    hosted_idle_real: f64,
    hosted_idle_sim: f64,
    sim_seen_idle: f64,
    hosted_converge_real: f64,
    hosted_converge_sim: f64,
    /// The restart's requests: to the management cluster (all of them, the Lease's too), and
    /// to each hosted cluster (the real ones' average, the simulated ones').
    restart_mgmt: f64,
    restart_hosted_real: f64,
    restart_hosted_sim: f64,
    /// One simulated cluster's requests during the restart, by call, most first.
    restart_calls: Vec<(String, u64)>,
    mgmt_converge: f64,
    mgmt_writes_converge: f64,
    mgmt_converge_by: BTreeMap<String, f64>,
    peak_writes: f64,
    uninstall: Option<Duration>,
    /// A restart over the converged fleet: until every HCP is found Compliant, and the
    /// management writes (the Lease's apart) it made.
    restart: Duration,
    restart_writes: f64,
    restart_by: BTreeMap<String, f64>,
    /// Whose CPU the restart was, from the new agent's start until the fleet was Compliant.
    restart_cpu: RestartCpu,
}

/// What only the largest size measured.
#[derive(Default)]
struct AtScale {
    drift_sim: Vec<Duration>,
    drift_real: Vec<Duration>,
    new_sim: Vec<Duration>,
    new_real: Vec<Duration>,
    config_all: Duration,
    config_each: Vec<Duration>,
    config_real_max: Duration,
    peak_writes: f64,
    status_time: Duration,
    status_lines: usize,
    status_summary: String,
    /// A tenant's guarded requests through one real hosted cluster: (request, engine, figures).
    tenant: Vec<(&'static str, &'static str, guarded::Row)>,
}

fn main() {
    support::bench_logs();
    support::bench_main(None, run);
}

/// The configuration the agent runs with: the defaults, loopback allowed, and the guard
/// `flip` in warn mode (the configuration change).
fn agent_config(flip: bool) -> Result<String, String> {
    let mut cfg = allow_loopback(AgentConfig::default());
    // The configuration flip measures how fast a change reaches every HCP at once, as before
    // progressive rollouts (a rollout's pace is its soak time and batch width, by design).
    cfg.rollout.enabled = false;
    // BENCH_SCALE_SERVICE=1: the Service tag on its webhook, so every HCP needs an admission
    // service (as before 1.36's MutatingAdmissionPolicy): the fleet with the service, to set
    // beside the default, where every guard runs inside the hosted kube-apiservers (real 1.36
    // ones and simulated ones alike) and no HCP has one. The protected-RBAC guard goes with it,
    // so the tenant's denied delete (`tenant_requests`) is timed through the webhook too.
    if env_num("BENCH_SCALE_SERVICE", 0) == 1 {
        for w in &mut cfg.webhooks {
            if w.path == hcp_fleet_guards::service_tags::ROW.path
                || w.path == hcp_fleet_guards::protected_rbac::ROW.path
            {
                w.engine = hcp_fleet_guards::catalogue::GuardEngine::Webhook;
            }
        }
    }
    // BENCH_SCALE_CONCURRENCY: the reconciles at once (the default's otherwise), to size it.
    if let Some(c) = std::env::var("BENCH_SCALE_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cfg.concurrency = c;
    }
    if let Some(rps) = std::env::var("BENCH_SCALE_RPS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cfg.management_api.requests_per_second = rps;
        cfg.management_api.burst = rps.saturating_mul(2);
    }
    if flip {
        let w = cfg
            .webhooks
            .iter_mut()
            .find(|w| w.path == hcp_fleet_guards::featuregate::ROW.path)
            .ok_or("no feature-gate guard in the defaults")?;
        w.mode = Mode::Warn;
    }
    serde_saphyr::to_string(&cfg).map_err(|e| e.to_string())
}

fn flipped_guard() -> Result<String, String> {
    AgentConfig::default()
        .webhooks
        .iter()
        .find(|w| w.path == hcp_fleet_guards::featuregate::ROW.path)
        .map(|w| w.name.clone())
        .ok_or_else(|| "no feature-gate guard in the defaults".into())
}

/// How a real cluster is seen to carry the configuration change.
enum RealFlip {
    /// Its guard's ValidatingAdmissionPolicyBinding says Warn.
    Binding(Api<ValidatingAdmissionPolicyBinding>),
    /// Its health record names a revision other than this one, fully rolled out.
    Revision(Api<AdmissionHealth>, String, Option<String>),
}

impl RealFlip {
    async fn done(&self, guard: &str) -> bool {
        match self {
            RealFlip::Binding(api) => api
                .get_opt(guard)
                .await
                .ok()
                .flatten()
                .and_then(|b| serde_json::to_value(b).ok())
                .is_some_and(|b| carries_flip(&b)),
            RealFlip::Revision(api, name, before) => api
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|h| h.status)
                .is_some_and(|s| s.revision != *before && s.revision_ready_since.is_some()),
        }
    }
}

fn carries_flip(binding: &serde_json::Value) -> bool {
    binding["spec"]["validationActions"]
        .as_array()
        .is_some_and(|a| a.iter().any(|v| v == "Warn"))
}

async fn run() -> Result<(), String> {
    let mut sizes: Vec<usize> = std::env::var("BENCH_SCALE_SIZES")
        .unwrap_or_else(|_| "250,1000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .filter(|n| *n > 0)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let max = *sizes.last().ok_or("BENCH_SCALE_SIZES names no size")?;
    let real_n = (env_num("BENCH_SCALE_REAL", 16) as usize).min(sizes[0]);
    let idle = Duration::from_secs(env_num("BENCH_IDLE_SECONDS", 60));
    let drifts = env_num("BENCH_SCALE_DRIFTS", 100) as usize;
    let new_n = env_num("BENCH_SCALE_NEW", 10) as usize;
    let deadline = Duration::from_secs(env_num("BENCH_SCALE_DEADLINE_SECONDS", 900));

    let real_names: Vec<String> = (1..=real_n).map(|i| format!("real-{i}")).collect();
    let sim_names: Vec<String> = (1..=max - real_n).map(|i| format!("sim-{i}")).collect();
    let sim_new: Vec<String> = (1..=new_n).map(|i| format!("sim-new-{i}")).collect();
    let mut hosted = real_names.clone();
    hosted.push("real-new".into());
    eprintln!(
        "bench: starting etcd, a management and {} real hosted kube-apiservers…",
        hosted.len()
    );
    let t = Instant::now();
    let fleet = LocalFleet::start(FleetOptions {
        hosted_clusters: hosted,
        install_fixtures: false,
        // The bench measures the agent against the hosted API servers; sixteen controller
        // managers and their kubelets would only load the two cores it shares (what a data
        // plane means for the guards is e2e/data_plane.rs's).
        data_plane: false,
        ..FleetOptions::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    eprintln!("bench: real fleet up in {}", secs(t.elapsed()));
    let mgmt = fleet.management.client().await.map_err(|e| e.to_string())?;
    fixtures::install_crds(&mgmt, &fleet.hcp_crd(), &fleet.policy_crd())
        .await
        .map_err(|e| e.to_string())?;
    fixtures::create_agent_namespace(&mgmt)
        .await
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    let all_sim: Vec<String> = sim_names.iter().chain(&sim_new).cloned().collect();
    let probe_keys = simhosted::ProbeKeys::default();
    let sim = SimFleet::start(&all_sim, probe_keys.clone()).await?;
    eprintln!(
        "bench: {} SIMULATED hosted clusters on {} (certificates made in {})",
        all_sim.len(),
        sim.addr,
        secs(t.elapsed())
    );
    let _real_kubelet = kubelet::spawn_for(
        mgmt.clone(),
        kubelet::KubeletOptions {
            binary: Some(env!("CARGO_BIN_EXE_hcp-fleet-dev").into()),
            dir: fleet.state_dir().join("kubelet"),
        },
        is_real,
    );
    let service = AgentConfig::default().admission.service_name;
    let _sim_pods = simhosted::kubelet::spawn(mgmt.clone(), service.clone(), probe_keys, |ns| {
        ns.starts_with("clusters-sim-")
    })
    .await?;
    let health = Health::default();
    let _health_watch = health.watch(mgmt.clone());
    let config_path = fleet.state_dir().join("agent-config.yaml");
    let kubeconfig = fleet.management.kubeconfig_path.clone();

    let kubeconfig_of = |name: &str| -> Option<String> {
        if let Some(s) = fleet.hosted(name) {
            return Some(s.kubeconfig_yaml.clone());
        }
        sim.cluster(name).map(|c| c.kubeconfig.clone())
    };
    let mut created = 0usize;
    let members: Vec<String> = real_names.iter().chain(&sim_names).cloned().collect();
    let mut figures: Vec<SizeFigures> = Vec::new();
    let mut at_scale = AtScale::default();
    for (i, &n) in sizes.iter().enumerate() {
        let last = i + 1 == sizes.len();
        let t = Instant::now();
        let todo: Vec<(String, String)> = members[created..n]
            .iter()
            .filter_map(|name| kubeconfig_of(name).map(|k| (name.clone(), k)))
            .collect();
        let results: Vec<Result<(), String>> = futures::stream::iter(todo)
            .map(|(name, kc)| {
                let mgmt = mgmt.clone();
                async move {
                    fixtures::create_hcp(&mgmt, &name, &kc)
                        .await
                        .map_err(|e| e.to_string())
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        results.into_iter().collect::<Result<Vec<()>, String>>()?;
        created = n;
        eprintln!(
            "bench: {n} HCPs on the management cluster ({} to add)",
            secs(t.elapsed())
        );

        std::fs::write(&config_path, agent_config(false)?).map_err(|e| e.to_string())?;
        let namespaces: Vec<String> = members[..n].iter().map(|m| hcp_namespace(m)).collect();
        let mut agent = Agent::start(&config_path, &kubeconfig).await?;
        let mut sampler = Some(WriteSampler::start(agent.addr));
        let when = health.all(&namespaces, deadline).await?;
        let started = agent.started;
        let since = |pred: &dyn Fn(&str) -> bool| {
            namespaces
                .iter()
                .zip(&when)
                .filter(|(ns, _)| pred(ns))
                .map(|(_, w)| w.saturating_duration_since(started))
                .max()
                .unwrap_or_default()
        };
        let mut f = SizeFigures {
            n,
            converge: since(&|_| true),
            converge_real: since(&is_real),
            converge_sim: since(&|ns| !is_real(ns)),
            ..SizeFigures::default()
        };
        eprintln!(
            "bench: {n} Compliant in {} after a cold start; settling, then idling {}…",
            secs(f.converge),
            secs(idle)
        );
        // The last status writes land, and whatever the convergence queued drains.
        tokio::time::sleep(Duration::from_secs(5)).await;
        // The sampler reads /metrics every second, a thousand HCPs' series each time: it
        // stops before the idle figures, which a Prometheus scraping every 30 s would not skew.
        f.peak_writes = sampler.take().map_or(0.0, |s| s.take());
        let m0 = agent.metrics().await?;
        f.rss_kib = proc_status_kib(agent.pid, "VmRSS:");
        (f.admission_deployments, f.admission_pods) = admission_pods(&mgmt, &service).await?;
        let pod_pids = support::processes_mentioning(&fleet.state_dir().join("kubelet"));
        f.real_pods = pod_pids.len();
        f.real_pods_rss_kib = pod_pids.iter().map(|p| proc_status_kib(*p, "VmRSS:")).sum();
        let pod_ticks0: u64 = pod_pids.iter().map(|p| cpu_ticks(*p)).sum();
        let sim0: Vec<u64> = sim.clusters().map(|c| c.requests.total()).collect();
        let ticks0 = cpu_ticks(agent.pid);
        tokio::time::sleep(idle).await;
        let ticks1 = cpu_ticks(agent.pid);
        let pod_ticks1: u64 = pod_pids.iter().map(|p| cpu_ticks(*p)).sum();
        f.real_pods_cpu_pct = support::core_percent(pod_ticks1.saturating_sub(pod_ticks0), idle);
        let m1 = agent.metrics().await?;
        let sim1: Vec<u64> = sim.clusters().map(|c| c.requests.total()).collect();
        f.peak_rss_kib = proc_status_kib(agent.pid, "VmHWM:");
        f.cpu_idle_pct = support::core_percent(ticks1.saturating_sub(ticks0), idle);
        let per_min = 60.0 / idle.as_secs_f64();
        f.mgmt_idle = management_delta(&m0, &m1)
            .into_iter()
            .map(|(k, v)| (k, v * per_min))
            .collect();
        let hosted_idle = hosted_delta(&m0, &m1);
        let avg = |pred: &dyn Fn(&str) -> bool, m: &BTreeMap<String, f64>| {
            let v: Vec<f64> = namespaces
                .iter()
                .filter(|ns| pred(ns))
                .map(|ns| m.get(ns).copied().unwrap_or(0.0))
                .collect();
            if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
        };
        f.hosted_idle_real = avg(&is_real, &hosted_idle) * per_min;
        f.hosted_idle_sim = avg(&|ns| !is_real(ns), &hosted_idle) * per_min;
        let sim_members = n - real_n;
        let seen: u64 = sim0.iter().zip(&sim1).map(|(a, b)| b - a).sum();
        f.sim_seen_idle = if sim_members == 0 {
            0.0
        } else {
            seen as f64 / sim_members as f64 * per_min
        };
        let hosted_conv = hosted_delta("", &m0);
        f.hosted_converge_real = avg(&is_real, &hosted_conv);
        f.hosted_converge_sim = avg(&|ns| !is_real(ns), &hosted_conv);
        f.mgmt_converge = samples(&m0, MGMT_REQUESTS).values().sum();
        f.mgmt_writes_converge = management_writes(&m0);
        f.mgmt_converge_by = management_delta("", &m0);
        eprintln!("bench: {n}: restarting the agent over the converged fleet…");
        let calls_before = sampled_calls(&sim);
        agent.stop();
        // Taken as the new agent starts (the stopped one's ticks no longer count).
        let cpu0 = RestartCpu::now(&fleet, &agent);
        agent = Agent::start(&config_path, &kubeconfig).await?;
        let restart = restarted(&fleet, &agent, cpu0, n, deadline).await?;
        f.restart = restart.0;
        f.restart_writes = restart.1;
        f.restart_by = restart.2;
        f.restart_cpu = restart.3;
        let after_restart = agent.metrics().await?;
        let mut calls: Vec<(String, u64)> = sampled_calls(&sim)
            .into_iter()
            .map(|(k, v)| {
                let n = v - calls_before.get(&k).copied().unwrap_or(0);
                (k, n)
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        calls.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        f.restart_calls = calls;
        f.restart_mgmt = samples(&after_restart, MGMT_REQUESTS).values().sum();
        let hosted_restart = hosted_delta("", &after_restart);
        f.restart_hosted_real = avg(&is_real, &hosted_restart);
        f.restart_hosted_sim = avg(&|ns| !is_real(ns), &hosted_restart);
        eprintln!(
            "bench: {n} reported Compliant again {} after the restart ({:.0} writes)",
            secs(f.restart),
            f.restart_writes
        );

        if last {
            sampler = Some(WriteSampler::start(agent.addr));
            at_scale = measure_at_scale(
                &mgmt,
                &fleet,
                &sim,
                &health,
                &agent,
                &config_path,
                &namespaces,
                drifts,
                &sim_new,
            )
            .await?;
            at_scale.peak_writes = sampler.take().map_or(0.0, |s| s.take());
        }
        agent.stop();
        if !last {
            let t = Instant::now();
            let out = Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"))
                .args(["uninstall", "--config"])
                .arg(&config_path)
                .args(["--namespace", "hcp-fleet-agent"])
                .env("KUBECONFIG", &kubeconfig)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .status()
                .map_err(|e| format!("uninstall: {e}"))?;
            if !out.success() {
                return Err(format!("uninstall failed ({out})"));
            }
            f.uninstall = Some(t.elapsed());
            let left: usize = sim.clusters().map(|c| c.object_count()).sum();
            if left > 0 {
                return Err(format!(
                    "uninstall left {left} objects in simulated clusters"
                ));
            }
            eprintln!("bench: uninstalled from {n} HCPs in {}", secs(t.elapsed()));
        }
        figures.push(f);
    }
    print_report(&fleet, real_n, idle, &figures, &at_scale);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn measure_at_scale(
    mgmt: &Client,
    fleet: &LocalFleet,
    sim: &SimFleet,
    health: &Health,
    agent: &Agent,
    config_path: &std::path::Path,
    namespaces: &[String],
    drifts: usize,
    sim_new: &[String],
) -> Result<AtScale, String> {
    let mut out = AtScale::default();
    let n = namespaces.len();
    // Drift: one at a time, each repaired before the next; the latency is from the change to
    // the agent's repairing write (simulated: the server's own clock; real: seen by polling).
    eprintln!("bench: drift repair at {n}…");
    let sims: Vec<&Arc<simhosted::SimCluster>> = namespaces
        .iter()
        .filter(|ns| !is_real(ns))
        .filter_map(|ns| sim.cluster(ns.trim_start_matches("clusters-")))
        .collect();
    let step = (sims.len() / drifts.max(1)).max(1);
    for (i, c) in sims.iter().step_by(step).take(drifts).enumerate() {
        let (kind, name) = if i % 2 == 0 {
            let b = c
                .objects(Kind::Vapb)
                .into_iter()
                .find(|b| b["spec"]["matchResources"].is_null())
                .ok_or_else(|| format!("{}: no guard binding installed", c.name))?;
            (
                Kind::Vapb,
                b["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        } else if c.object(Kind::Vwc, VALIDATING_NAME).is_some() {
            (Kind::Vwc, VALIDATING_NAME.to_string())
        } else {
            // No webhook where every guard runs inside the hosted kube-apiserver: the Service
            // tag's mutating binding instead.
            (
                Kind::Mapb,
                hcp_fleet_guards::service_tags::ROW.name.to_string(),
            )
        };
        let t0 = if kind != Kind::Vwc {
            c.tamper(kind, &name, None)
        } else {
            c.tamper(
                kind,
                &name,
                Some(&|v: &mut serde_json::Value| {
                    v["webhooks"][0]["timeoutSeconds"] = serde_json::json!(29)
                }),
            )
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(w) = c.written_at(kind, &name).filter(|w| *w > t0) {
                out.drift_sim.push(w.duration_since(t0));
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{}: {} {name} not repaired within 10s",
                    c.name,
                    kind.kind()
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for ns in namespaces.iter().filter(|ns| is_real(ns)) {
        let name = ns.trim_start_matches("clusters-");
        let Some(s) = fleet.hosted(name) else {
            continue;
        };
        // The validating webhook configuration where there is one (a 1.20 server serves no
        // ValidatingAdmissionPolicy, so there every guard is a webhook in it), else (every
        // guard inside a 1.36 server) protected RBAC's policy binding.
        let hosted = s.client().await.map_err(|e| e.to_string())?;
        let hooks: Api<ValidatingWebhookConfiguration> = Api::all(hosted.clone());
        let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(hosted);
        let rbac = hcp_fleet_guards::protected_rbac::ROW.name;
        let hooked = hooks
            .get_opt(VALIDATING_NAME)
            .await
            .map_err(|e| e.to_string())?
            .is_some();
        let t0 = Instant::now();
        if hooked {
            hooks
                .delete(VALIDATING_NAME, &Default::default())
                .await
                .map(|_| ())
        } else {
            bindings.delete(rbac, &Default::default()).await.map(|_| ())
        }
        .map_err(|e| format!("{ns}: deleting the agent's object: {e}"))?;
        let deadline = t0 + Duration::from_secs(10);
        loop {
            let back = if hooked {
                hooks.get_opt(VALIDATING_NAME).await.map(|o| o.is_some())
            } else {
                bindings.get_opt(rbac).await.map(|o| o.is_some())
            }
            .map_err(|e| e.to_string())?;
            if back {
                out.drift_real.push(t0.elapsed());
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{ns}: the agent's object not repaired within 10s"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    // New HCPs, one at a time, while the others exist.
    eprintln!("bench: new HCPs while {n} exist…");
    for name in sim_new {
        let c = sim.cluster(name).ok_or("no such simulated cluster")?;
        fixtures::create_hcp(mgmt, name, &c.kubeconfig)
            .await
            .map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        let ns = hcp_namespace(name);
        let at = health
            .all(std::slice::from_ref(&ns), Duration::from_secs(60))
            .await?;
        out.new_sim.push(at[0].saturating_duration_since(t0));
    }
    if let Some(s) = fleet.hosted("real-new") {
        fixtures::create_hcp(mgmt, "real-new", &s.kubeconfig_yaml)
            .await
            .map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        let ns = hcp_namespace("real-new");
        let at = health
            .all(std::slice::from_ref(&ns), Duration::from_secs(60))
            .await?;
        out.new_real.push(at[0].saturating_duration_since(t0));
    }

    // A configuration change: one guard's mode flipped, until every cluster carries it.
    eprintln!(
        "bench: a configuration change across {} HCPs…",
        n + sim_new.len() + 1
    );
    let guard = flipped_guard()?;
    std::fs::write(config_path, agent_config(true)?).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    agent.reload();
    let mut pending_sim: Vec<&Arc<simhosted::SimCluster>> = namespaces
        .iter()
        .filter(|ns| !is_real(ns))
        .filter_map(|ns| sim.cluster(ns.trim_start_matches("clusters-")))
        .chain(sim_new.iter().filter_map(|n| sim.cluster(n)))
        .collect();
    // A real cluster carries the change in its guard's binding where the server runs the guard
    // as a ValidatingAdmissionPolicy; on a server without (1.20) the guard is a webhook, and
    // the change reaches it as a new admission service revision, rolled out.
    let mut pending_real: Vec<(String, RealFlip)> = Vec::new();
    for ns in namespaces
        .iter()
        .filter(|ns| is_real(ns))
        .cloned()
        .chain(["clusters-real-new".to_string()])
    {
        if let Some(s) = fleet.hosted(ns.trim_start_matches("clusters-")) {
            let c = s.client().await.map_err(|e| e.to_string())?;
            let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(c);
            let how = if bindings.get_opt(&guard).await.ok().flatten().is_some() {
                RealFlip::Binding(bindings)
            } else {
                let records: Api<AdmissionHealth> = Api::namespaced(mgmt.clone(), &ns);
                let name = support::record_of(&ns).to_string();
                let before = records
                    .get_opt(&name)
                    .await
                    .map_err(|e| e.to_string())?
                    .and_then(|h| h.status.and_then(|s| s.revision));
                RealFlip::Revision(records, name, before)
            };
            pending_real.push((ns, how));
        }
    }
    let deadline = t0 + Duration::from_secs(600);
    let mut last_real = t0;
    let mut tick = 0u64;
    while !pending_sim.is_empty() || !pending_real.is_empty() {
        pending_sim.retain(|c| {
            let done = c
                .object(Kind::Vapb, &guard)
                .is_some_and(|b| carries_flip(&b));
            if done {
                let at = c
                    .written_at(Kind::Vapb, &guard)
                    .unwrap_or_else(Instant::now);
                out.config_each.push(at.saturating_duration_since(t0));
            }
            !done
        });
        if tick.is_multiple_of(10) {
            let mut still = Vec::new();
            for (ns, how) in pending_real.drain(..) {
                if how.done(&guard).await {
                    last_real = Instant::now();
                    out.config_each.push(t0.elapsed());
                } else {
                    still.push((ns, how));
                }
            }
            pending_real = still;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "configuration change: {} simulated and {} real clusters still without it after 600s",
                pending_sim.len(),
                pending_real.len()
            ));
        }
        tick += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    out.config_each.sort();
    out.config_all = out.config_each.last().copied().unwrap_or_default();
    out.config_real_max = last_real.saturating_duration_since(t0);
    // And every HCP Compliant again under the new configuration.
    let mut all: Vec<String> = namespaces.to_vec();
    all.extend(sim_new.iter().map(|n| hcp_namespace(n)));
    health.all(&all, Duration::from_secs(300)).await?;
    // The fleet table an SRE asks for at this size.
    let t = Instant::now();
    let table = Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"))
        .arg("status")
        .env("KUBECONFIG", &fleet.management.kubeconfig_path)
        .output()
        .map_err(|e| format!("status: {e}"))?;
    out.status_time = t.elapsed();
    let text = String::from_utf8_lossy(&table.stdout);
    out.status_lines = text.lines().count();
    out.status_summary = text.lines().last().unwrap_or_default().to_string();
    out.tenant = tenant_requests(mgmt, fleet, namespaces).await?;
    Ok(out)
}

/// A tenant's guarded requests through the first real hosted cluster while the agent holds the
/// whole fleet (`support::guarded`, the engines bench's rows): what a guard costs a request at
/// this size, on the engine the configuration gives it (every guard inside the kube-apiserver
/// by default; the two on the admission service's webhooks with BENCH_SCALE_SERVICE=1).
async fn tenant_requests(
    mgmt: &Client,
    fleet: &LocalFleet,
    namespaces: &[String],
) -> Result<Vec<(&'static str, &'static str, guarded::Row)>, String> {
    use guarded::Request;
    let Some(ns) = namespaces.iter().find(|ns| is_real(ns)) else {
        return Ok(Vec::new());
    };
    let name = ns.trim_start_matches("clusters-");
    let hosted = fleet.hosted(name).ok_or_else(|| format!("no {name}"))?;
    let admin = hosted.client().await.map_err(|e| e.to_string())?;
    guarded::prepare(admin, None).await?;
    let alice = support::hosted_client_as(fleet, name, "alice").await;
    let admin = support::hosted_client_as(fleet, name, "system:admin").await;
    let (secs, clients) = (env_num("BENCH_SECONDS", 5), env_num("BENCH_CLIENTS", 8));
    eprintln!(
        "bench: a tenant's guarded requests through {name}, {clients} clients for {secs}s each…"
    );
    let mut rows = Vec::new();
    for (what, label) in [
        (Request::DeniedDelete, "denied ClusterRole delete (alice)"),
        (
            Request::TaggedService,
            "LoadBalancer Service tagged (admin)",
        ),
    ] {
        let r = guarded::measure(mgmt, ns, what, &alice, &admin, clients, secs).await?;
        let engine = match what {
            Request::DeniedDelete if r.by_policy == r.total => "policy",
            Request::DeniedDelete if r.by_policy == 0 => "webhook",
            Request::TaggedService if r.service_calls == 0.0 => "policy",
            Request::TaggedService if r.service_calls >= r.total as f64 => "webhook",
            _ => {
                return Err(format!(
                    "{label}: the engines were mixed during the run ({} of {} by a policy, {} service calls)",
                    r.by_policy, r.total, r.service_calls
                ));
            }
        };
        rows.push((label, engine, r));
    }
    Ok(rows)
}
