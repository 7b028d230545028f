//! The dashboard and the alerts name only what the agent and the admission services export.

use super::*;

/// Every query in the dashboard and every alert expression names only metrics the agent or
/// the admission service export, and the dashboard is well-formed Grafana JSON.
#[test]
fn dashboard_and_alerts_name_only_exported_metrics() {
    let mut exported = exported_series();
    // Prometheus's own series of each target (HcpFleetAgentDown reads the agent's).
    exported.insert("up".to_string());
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join(CHART).join("dashboards/hcp-fleet.json"))
            .expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    // What Grafana needs to load a dashboard: a uid and title, a schema version, panels with
    // ids, types and grid positions, targets with refIds, and datasource variables it defines.
    for key in ["uid", "title", "schemaVersion", "panels", "templating"] {
        assert!(dash.get(key).is_some(), "dashboard.{key}");
    }
    assert!(dash["schemaVersion"].as_u64().is_some_and(|v| v >= 36));
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    let mut exprs = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for p in dash["panels"].as_array().expect("panels") {
        assert!(
            ids.insert(p["id"].as_u64().expect("panel id")),
            "unique panel ids"
        );
        assert!(p["type"].as_str().is_some(), "panel type");
        for k in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][k].as_u64().is_some(), "gridPos.{k}");
        }
        if p["type"] == "row" {
            continue;
        }
        let uid = p["datasource"]["uid"].as_str().expect("datasource uid");
        let var = uid.trim_start_matches("${").trim_end_matches('}');
        assert!(
            vars.contains(&var),
            "datasource {uid} is a defined variable"
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {} has a query", p["title"]);
        for t in targets {
            assert!(t["refId"].as_str().is_some());
            exprs.push(t["expr"].as_str().expect("expr").to_string());
        }
    }
    let rules = render(MONITORING_API);
    let rule = rules
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("PrometheusRule");
    let mut alerts = Vec::new();
    for r in rule["spec"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
    {
        alerts.push(r["alert"].as_str().expect("alert").to_string());
        exprs.push(r["expr"].as_str().expect("expr").to_string());
        let runbook = r["annotations"]["runbook_url"]
            .as_str()
            .expect("runbook_url");
        let anchor = runbook.rsplit('#').next().expect("anchor");
        let doc = std::fs::read_to_string(repo().join("docs/runbook.md")).expect("runbook");
        assert!(
            doc.lines()
                .any(|l| l.starts_with("## ") && l[3..].trim().to_lowercase() == anchor),
            "docs/runbook.md has a section for {anchor}"
        );
    }
    for want in [
        "HcpFleetHostedClusterNonCompliant",
        "HcpFleetWebhookDriftRepeated",
        "HcpFleetCertificateExpiringSoon",
        "HcpFleetAdmissionErrors",
        "HcpFleetProbeFailing",
        "HcpFleetNoLeader",
        "HcpFleetManyHostedClustersNonCompliant",
        "HcpFleetAgentDown",
        "HcpFleetCertificateExpiryCritical",
        "HcpFleetHostedClusterUnreachable",
        "HcpFleetKubeconfigsRefused",
        "HcpFleetReconcileErrors",
        "HcpFleetOverrideRefused",
    ] {
        assert!(alerts.iter().any(|a| a == want), "alert {want}");
    }
    // The alert and the probe's report (docs/admission.md, "When a guard denies the cluster")
    // count the same senders as the cluster's own.
    let breaks = rule["spec"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .find(|r| r["alert"] == "HcpFleetGuardBreaksTheCluster")
        .expect("alert HcpFleetGuardBreaksTheCluster");
    let senders = format!(
        "sender=~\"{}\"",
        hcp_fleet_guards::identities::CLUSTER_SENDERS.join("|")
    );
    assert!(
        breaks["expr"]
            .as_str()
            .is_some_and(|e| e.contains(&senders)),
        "HcpFleetGuardBreaksTheCluster matches {senders}: {}",
        breaks["expr"]
    );
    for e in &exprs {
        let names = metric_names(e);
        assert!(!names.is_empty(), "{e} queries a metric");
        for n in names {
            assert!(
                exported.contains(&n),
                "{n} (in {e}) is not exported; exported: {exported:?}"
            );
        }
    }
}

/// The sample names the agent's and the admission service's registries expose (the same
/// registries their `/metrics` endpoints encode). A labelled family shows nothing until it
/// has a series, so each gets one.
pub(crate) fn exported_series() -> std::collections::BTreeSet<String> {
    use hcp_fleet_agent::metrics::{DriftLabels, HcpLabels, PhaseLabels};
    let m = Metrics::new();
    let hcp = HcpLabels {
        hcp_namespace: "clusters-a".into(),
        hosted_cluster: "a".into(),
    };
    m.compliance.get_or_create(&hcp).set(0);
    m.drift
        .get_or_create(&DriftLabels {
            hcp_namespace: "clusters-a".into(),
            hosted_cluster: "a".into(),
            kind: "validating".into(),
        })
        .inc();
    m.webhooks_desired.get_or_create(&hcp).set(2);
    m.webhooks_installed.get_or_create(&hcp).set(2);
    m.cert_expiry.get_or_create(&hcp).set(1);
    m.hosted_latency.get_or_create(&hcp).observe(0.01);
    m.hosted_errors.get_or_create(&hcp).inc();
    m.probe_success.get_or_create(&hcp).set(1);
    m.hosted_requests.get_or_create(&hcp).inc();
    m.management_requests
        .get_or_create(&hcp_fleet_agent::metrics::RequestLabels {
            verb: "patch".into(),
            resource: "leases".into(),
        })
        .inc();
    m.reconcile_errors
        .get_or_create(&PhaseLabels {
            phase: "certificates".into(),
        })
        .inc();
    m.set_revision("clusters-a", "a", Some("0123456789abcdef"));
    m.set_override("clusters-a", "a", Some(false));
    m.set_paused(
        "clusters-a",
        "a",
        Some((
            hcp_fleet_render::reporting::record::PauseReason::Override,
            jiff::Timestamp::UNIX_EPOCH,
        )),
    );
    m.rollout
        .get_or_create(&hcp_fleet_agent::metrics::RolloutLabels {
            stable: "0123456789abcdef".into(),
            target: String::new(),
            phase: "Complete".into(),
        })
        .set(1);
    m.rollout_hcps
        .get_or_create(&hcp_fleet_agent::metrics::RolloutStateLabels {
            state: "waiting".into(),
        })
        .set(0);
    let a = hcp_fleet_webhook::server::AdmissionMetrics::new();
    a.count("w", "allowed", "enforced");
    a.count_denial("w", "node");
    a.observe_latency("w".into(), 0.001);
    let text = format!("{}{}", m.encode(), a.encode());
    let samples: std::collections::BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect();
    // Every registered family must have shown up, or a query could be wrongly refused.
    let families = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
    assert!(families >= 16, "{families} families:\n{text}");
    samples
}

/// Metric names in a PromQL expression: identifiers outside label matchers, strings, and
/// range selectors that are not functions, aggregations, keywords or grouping labels.
pub(crate) fn metric_names(expr: &str) -> Vec<String> {
    const NOT_METRICS: &[&str] = &[
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "rate",
        "increase",
        "irate",
        "histogram_quantile",
        "time",
        "vector",
        "absent",
        "offset",
        "bool",
        "topk",
        "bottomk",
    ];
    let mut names = Vec::new();
    let (mut depth_brace, mut depth_bracket) = (0, 0);
    let mut in_string = false;
    let mut grouping = false;
    let mut chars = expr.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if in_string {
            in_string = c != '"';
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => depth_brace += 1,
            '}' => depth_brace -= 1,
            '[' => depth_bracket += 1,
            ']' => depth_bracket -= 1,
            ')' => grouping = false,
            c if c.is_ascii_alphabetic() || c == '_' || c == '$' => {
                let mut end = i + c.len_utf8();
                while let Some(&(j, d)) = chars.peek() {
                    if d.is_ascii_alphanumeric() || d == '_' || d == ':' {
                        end = j + d.len_utf8();
                        chars.next();
                    } else {
                        break;
                    }
                }
                let word = &expr[i..end];
                if depth_brace > 0 || depth_bracket > 0 || word.starts_with('$') {
                    continue;
                }
                if ["by", "without", "on", "ignoring"].contains(&word) {
                    grouping = true;
                    continue;
                }
                if grouping || NOT_METRICS.contains(&word) {
                    continue;
                }
                names.push(word.to_string());
            }
            _ => {}
        }
    }
    names
}

#[test]
fn promql_metric_names_are_found_and_labels_are_not() {
    assert_eq!(
        metric_names(
            r#"sum by (namespace) (rate(hcp_fleet_admission_requests_total{outcome=~"bad|x"}[5m])) / max(up) > 0.05"#
        ),
        ["hcp_fleet_admission_requests_total", "up"]
    );
    assert_eq!(
        metric_names(
            "histogram_quantile(0.99, sum by (le, webhook) (rate(a_bucket[$__rate_interval])))"
        ),
        ["a_bucket"]
    );
    assert_eq!(metric_names("sum(x) < 1 or absent(y)"), ["x", "y"]);
}
