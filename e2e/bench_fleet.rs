//! `make bench`: the agent (a separate release process, so its memory and CPU are its own)
//! against 16 real hosted kube-apiservers. Prints:
//! - time from an HCP becoming ready to its health record being Compliant (p50, p99, max);
//! - the agent's resident memory (now and peak) and CPU over 60 idle seconds;
//! - API requests the agent sent per hosted cluster (its own counters) during convergence
//!   and during the 60 idle seconds, and to the management cluster.
//!
//! Environment: BENCH_HOSTED (default 16), BENCH_IDLE_SECONDS (default 60).

// An e2e scenario reads as one story, set up, acted and checked in order: the 100-line and
// seven-argument limits hold the shipped code in src/ (clippy.toml).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)]

#[path = "support/mod.rs"]
mod support;

use support::{cpu_ticks, env_num, percentile, proc_status_kib};

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hcp_fleet_model::crd::AdmissionHealth;
use hcp_fleet_testbed::fixtures;
use hcp_fleet_testbed::fixtures::hcp_namespace;
use hcp_fleet_testbed::{FleetOptions, LocalFleet, free_port, kubelet};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};

/// Sum of a metric's samples per hcp_namespace label (or under "" without one).
fn per_namespace(text: &str, metric: &str) -> BTreeMap<String, f64> {
    support::sum_by_label(text, metric, "hcp_namespace")
}

fn main() {
    support::bench_logs();
    support::bench_main(None, run);
}

async fn run() -> Result<(), String> {
    let n = env_num("BENCH_HOSTED", 16) as usize;
    let idle = Duration::from_secs(env_num("BENCH_IDLE_SECONDS", 60));
    eprintln!("bench: starting etcd, a management and {n} hosted kube-apiservers…");
    let t = Instant::now();
    let fleet = LocalFleet::start(FleetOptions {
        install_fixtures: false,
        // As in the scale bench: the agent against the API servers, no data planes beside.
        data_plane: false,
        ..FleetOptions::with_hosted(n)
    })
    .await
    .map_err(|e| e.to_string())?;
    eprintln!("bench: fleet up in {:.1}s", t.elapsed().as_secs_f64());
    let mgmt = fleet.management.client().await.map_err(|e| e.to_string())?;
    fixtures::install_crds(&mgmt, &fleet.hcp_crd(), &fleet.policy_crd())
        .await
        .map_err(|e| e.to_string())?;
    fixtures::create_agent_namespace(&mgmt)
        .await
        .map_err(|e| e.to_string())?;
    let _kubelet = kubelet::spawn(
        mgmt.clone(),
        kubelet::KubeletOptions {
            binary: Some(env!("CARGO_BIN_EXE_hcp-fleet-dev").into()),
            dir: fleet.state_dir().join("kubelet"),
        },
    );

    // The agent, as it runs in a cluster: its own process, its own metrics endpoint.
    let port = free_port().map_err(|e| e.to_string())?;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let config = fleet.state_dir().join("agent-config.yaml");
    std::fs::write(&config, hcp_fleet_testbed::agent_config_yaml()).map_err(|e| e.to_string())?;
    let mut agent = Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"))
        .args(["agent", "--config"])
        .arg(&config)
        .args([
            "--local-mode",
            "--metrics-addr",
            &addr.to_string(),
            "--namespace",
            "hcp-fleet-agent",
            // As the chart runs it: the idle figures include the Lease's renewals and watch.
            "--leader-elect",
        ])
        .env("KUBECONFIG", &fleet.management.kubeconfig_path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting the agent: {e}"))?;
    let pid = agent.id();
    let ready_deadline = Instant::now() + Duration::from_secs(30);
    while support::http_get(addr, "/readyz").await.map(|r| r.0) != Ok(200) {
        if Instant::now() > ready_deadline {
            let _ = agent.kill();
            return Err("agent not ready within 30s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Watch the health records to timestamp each hosted cluster's first Compliant.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let policies: Api<AdmissionHealth> = Api::all(mgmt.clone());
    let watch = tokio::spawn(async move {
        let mut s = std::pin::pin!(
            watcher(policies, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(Ok(p)) = s.next().await {
            if hcp_fleet_render::reporting::record::is_health_record(&p)
                && p.status.as_ref().and_then(|s| s.compliant)
                    == Some(hcp_fleet_model::crd::ComplianceState::Compliant)
            {
                let _ = tx.send((p.namespace().unwrap_or_default(), Instant::now()));
            }
        }
    });

    // The HCPs appear, ready, one after another (as HyperShift brings them up).
    let mut ready_at = BTreeMap::new();
    for (name, s) in &fleet.hosted {
        fixtures::create_hcp(&mgmt, name, &s.kubeconfig_yaml)
            .await
            .map_err(|e| e.to_string())?;
        ready_at.insert(hcp_namespace(name), Instant::now());
    }
    let mut compliant_at: BTreeMap<String, Instant> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while compliant_at.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some((ns, at))) => {
                compliant_at.entry(ns).or_insert(at);
            }
            _ => {
                let _ = agent.kill();
                return Err(format!(
                    "only {}/{n} Compliant within 120s",
                    compliant_at.len()
                ));
            }
        }
    }
    watch.abort();
    let mut lat: Vec<Duration> = compliant_at
        .iter()
        .filter_map(|(ns, c)| ready_at.get(ns).map(|r| c.saturating_duration_since(*r)))
        .collect();
    lat.sort();
    // Let the last status writes land before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, m0) = support::http_get(addr, "/metrics").await?;
    let rss_converged = proc_status_kib(pid, "VmRSS:");

    eprintln!("bench: converged; idling {}s…", idle.as_secs());
    let ticks0 = cpu_ticks(pid);
    tokio::time::sleep(idle).await;
    let ticks1 = cpu_ticks(pid);
    let (_, m1) = support::http_get(addr, "/metrics").await?;
    let rss_idle = proc_status_kib(pid, "VmRSS:");
    let rss_peak = proc_status_kib(pid, "VmHWM:");
    let _ = agent.kill();
    let _ = agent.wait();

    let hosted0 = per_namespace(&m0, "hcp_fleet_hosted_api_requests_total");
    let hosted1 = per_namespace(&m1, "hcp_fleet_hosted_api_requests_total");
    let mgmt0 = per_namespace(&m0, "hcp_fleet_management_api_requests_total")
        .values()
        .sum::<f64>();
    let mgmt1 = per_namespace(&m1, "hcp_fleet_management_api_requests_total")
        .values()
        .sum::<f64>();
    let conv: Vec<f64> = hosted0.values().copied().collect();
    let idle_per: Vec<f64> = hosted1
        .iter()
        .map(|(k, v)| v - hosted0.get(k).copied().unwrap_or(0.0))
        .collect();
    let avg = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let cpu_pct = support::core_percent(ticks1.saturating_sub(ticks0), idle);

    println!(
        "fleet benchmark: {n} hosted kube-apiservers ({}), agent as a separate release process",
        fleet.version
    );
    println!(
        "  HCP ready -> record Compliant   p50 {:>7.0} ms   p99 {:>7.0} ms   max {:>7.0} ms",
        percentile(&lat, 50.0).as_secs_f64() * 1000.0,
        percentile(&lat, 99.0).as_secs_f64() * 1000.0,
        lat.last().copied().unwrap_or_default().as_secs_f64() * 1000.0
    );
    println!(
        "  agent resident memory           converged {:.1} MiB   after idle {:.1} MiB   peak {:.1} MiB",
        rss_converged as f64 / 1024.0,
        rss_idle as f64 / 1024.0,
        rss_peak as f64 / 1024.0
    );
    println!(
        "  agent CPU while idle            {cpu_pct:.2}% of one core over {}s",
        idle.as_secs()
    );
    println!(
        "  hosted API requests / cluster   convergence avg {:.1} max {:.0}   idle {}s avg {:.2} max {:.0}",
        avg(&conv),
        max(&conv),
        idle.as_secs(),
        avg(&idle_per),
        max(&idle_per)
    );
    println!(
        "  management API requests         convergence {:.0} ({:.1} per cluster)   idle {}s {:.0}",
        mgmt0,
        mgmt0 / n as f64,
        idle.as_secs(),
        mgmt1 - mgmt0
    );
    Ok(())
}
