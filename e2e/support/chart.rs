//! The chart as helm renders it, shared by the packaging and monitoring tests.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

pub const CHART: &str = "charts/hcp-fleet-agent";

pub fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// helm, as `make test` provides it (HELM), or fetched and cached by the project's script.
pub fn helm() -> PathBuf {
    if let Some(h) = std::env::var_os("HELM").filter(|h| !h.is_empty()) {
        return h.into();
    }
    let out = Command::new("bash")
        .arg(repo().join("hack/helm.sh"))
        .output()
        .expect("run hack/helm.sh");
    assert!(
        out.status.success(),
        "hack/helm.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

pub fn run_helm(args: &[&str]) -> String {
    let out = Command::new(helm())
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What a cluster with the Prometheus Operator serves (`helm template` cannot ask).
pub const MONITORING_API: &[&str] = &[
    "--api-versions",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "--api-versions",
    "monitoring.coreos.com/v1/PrometheusRule",
];

/// The chart rendered with `extra` arguments, as the agent's namespace and release name.
pub fn render(extra: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "template",
        "hcp-fleet-agent",
        CHART,
        "--namespace",
        hcp_fleet_testbed::fixtures::AGENT_NAMESPACE,
    ];
    args.extend_from_slice(extra);
    hcp_fleet_cli::packaging::parse_rendered(&run_helm(&args)).expect("rendered chart parses")
}
