//! The chart's alerts and dashboard against a real Prometheus (Debian's `prometheus` package,
//! installed by hack/prometheus.sh): promtool checks the rules and runs their unit tests
//! (e2e/monitoring/alerts.test.yaml, every alert firing and quiet), and a Prometheus server
//! scrapes a fleet of the test bed (the agent and the admission services, over verified TLS),
//! evaluates every rule and every dashboard query, and each returns series labelled as the
//! panel or the alert's text expects. Where the package cannot be had, one line says what is
//! skipped.

// An e2e scenario reads as one story, set up, acted and checked in order: the 100-line and
// seven-argument limits hold the shipped code in src/ (clippy.toml).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)]

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hcp_fleet_cli::agent;
use hcp_fleet_testbed::fixtures::{
    AGENT_NAMESPACE, SERVICE_NETWORK_KUBECONFIG, put_kubeconfig_secret,
};
use hcp_fleet_testbed::kubelet::LOCAL_REPLICAS_ANNOTATION;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::{Api, ResourceExt};
use serde_json::Value;
use support::chart::{MONITORING_API, render, repo};
use support::{eventually, start_agent, wait_compliant};

/// promtool and prometheus: from PROMTOOL and PROMETHEUS (`make test` sets them from
/// hack/prometheus.sh), else the PATH; `None`, with one line saying what is skipped, where
/// neither has them.
fn tools(test: &str) -> Option<(PathBuf, PathBuf)> {
    let find = |var: &str, name: &str| -> Option<PathBuf> {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("PATH").and_then(|p| {
                    std::env::split_paths(&p)
                        .map(|d| d.join(name))
                        .find(|f| f.is_file())
                })
            })
    };
    match (
        find("PROMTOOL", "promtool"),
        find("PROMETHEUS", "prometheus"),
    ) {
        (Some(t), Some(p)) => Some((t, p)),
        _ => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "skipped: {test} (no promtool or prometheus: Debian's prometheus package, which hack/prometheus.sh installs, could not be had)"
            );
            None
        }
    }
}

/// The chart's PrometheusRule as a Prometheus rule file (its `spec`), rendered as the release
/// `hcp-fleet-agent` in its namespace where the Prometheus Operator's API is served.
fn rule_file() -> Value {
    let objs = render(MONITORING_API);
    let rule = objs
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("PrometheusRule");
    rule["spec"].clone()
}

/// Every alerting rule of a rule file: (name, expression, annotations).
fn alerts(rules: &Value) -> Vec<(String, String, Value)> {
    rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| {
            Some((
                r["alert"].as_str()?.to_string(),
                r["expr"].as_str()?.to_string(),
                r["annotations"].clone(),
            ))
        })
        .collect()
}

fn write_rules(dir: &Path) -> Value {
    let rules = rule_file();
    std::fs::write(
        dir.join("rules.yaml"),
        serde_saphyr::to_string(&rules).expect("yaml"),
    )
    .expect("write rules");
    rules
}

fn run(cmd: &Path, args: &[&str], dir: &Path) -> String {
    let (ok, text) = support::run_to_text(Command::new(cmd).args(args).current_dir(dir));
    assert!(ok, "{} {args:?}:\n{text}", cmd.display());
    text
}

/// promtool's own check and unit tests of the rules; every alert has a test in which it fires
/// and one in which it stays quiet; the inhibition the runbook documents names real alerts and
/// the scope label the rules carry.
#[test]
fn promtool_checks_the_rules_and_every_alert_fires_and_stays_quiet_in_its_tests() {
    let Some((promtool, _)) = tools("promtool check rules and promtool test rules") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let rules = write_rules(dir.path());
    let out = run(&promtool, &["check", "rules", "rules.yaml"], dir.path());
    let names: Vec<String> = alerts(&rules).into_iter().map(|a| a.0).collect();
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", names.len())),
        "{out}"
    );
    let tests = std::fs::read_to_string(repo().join("e2e/monitoring/alerts.test.yaml"))
        .expect("alerts.test.yaml");
    std::fs::write(dir.path().join("alerts.test.yaml"), &tests).expect("copy");
    let out = run(
        &promtool,
        &["test", "rules", "alerts.test.yaml"],
        dir.path(),
    );
    assert!(out.contains("SUCCESS"), "{out}");
    let doc: Value = serde_saphyr::from_str(&tests).expect("tests parse");
    let (mut fires, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for case in doc["tests"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["alert_rule_test"].as_array().cloned().unwrap_or_default())
    {
        let name = case["alertname"].as_str().unwrap_or_default().to_string();
        if case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
            fires.insert(name);
        } else {
            quiet.insert(name);
        }
    }
    for n in &names {
        assert!(fires.contains(n), "no test in which {n} fires");
        assert!(quiet.contains(n), "no test in which {n} stays quiet");
    }
    // The runbook's Alertmanager inhibition: its sources are alerts of the rules, and its
    // targets the scope label the per-cluster alerts carry.
    let runbook = std::fs::read_to_string(repo().join("docs/runbook.md")).expect("runbook");
    let snippet = runbook
        .split("```yaml\ninhibit_rules:")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("the runbook's inhibit_rules block");
    let inhibit: Value =
        serde_saphyr::from_str(&format!("inhibit_rules:{snippet}")).expect("inhibit_rules parse");
    let scopes: BTreeSet<String> = rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["labels"]["hcp_fleet_scope"].as_str().map(String::from))
        .collect();
    assert_eq!(
        scopes,
        BTreeSet::from(["fleet".into(), "hosted-cluster".into()])
    );
    for rule in inhibit["inhibit_rules"].as_array().expect("rules") {
        for m in rule["source_matchers"].as_array().expect("sources") {
            let m = m.as_str().unwrap_or_default();
            let alternatives = m
                .split_once('=')
                .map(|(_, v)| v.trim_start_matches('~').trim_matches('"'))
                .unwrap_or_default();
            for a in alternatives.split('|') {
                assert!(names.iter().any(|n| n == a), "{a} is not an alert: {m}");
            }
        }
        let targets: Vec<&str> = rule["target_matchers"]
            .as_array()
            .expect("targets")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(targets, [r#"hcp_fleet_scope="hosted-cluster""#]);
    }
}

/// A free port on the loopback (the listener is closed before Prometheus binds it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port")
}

/// One instant query: its result vector.
async fn query(base: &str, expr: &str) -> Result<Vec<Value>, String> {
    let url = format!("{base}/api/v1/query");
    let body = reqwest_like_get(&url, &[("query", expr)]).await?;
    let doc: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    if doc["status"] != "success" {
        return Err(format!("{expr}: {doc}"));
    }
    match doc["data"]["resultType"].as_str() {
        Some("vector") => Ok(doc["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()),
        Some("scalar") => Ok(vec![doc["data"]["result"].clone()]),
        other => Err(format!("{expr}: result type {other:?}")),
    }
}

/// GET over plain HTTP to Prometheus on the loopback, with a query string.
async fn reqwest_like_get(url: &str, params: &[(&str, &str)]) -> Result<String, String> {
    let rest = url.strip_prefix("http://").ok_or("http only")?;
    let (host, path) = rest.split_once('/').ok_or("no path")?;
    let addr: std::net::SocketAddr = host.parse().map_err(|e| format!("{host}: {e}"))?;
    let query: String = params
        .iter()
        .map(|(k, v)| format!("{k}={}", percent(v)))
        .collect::<Vec<_>>()
        .join("&");
    let (code, body) = support::http_get(addr, &format!("/{path}?{query}")).await?;
    if code != 200 {
        return Err(format!("HTTP {code}: {body}"));
    }
    Ok(body)
}

fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The labels a query's series carry by its own outermost `by (…)` (an aggregation, or
/// under `histogram_quantile`), `le` aside; none for an aggregation without one.
fn outer_labels(expr: &str) -> Vec<String> {
    let mut e = expr.trim().trim_start_matches('(').trim_start();
    // Functions that keep their argument's labels: look inside.
    for f in ["topk(", "bottomk(", "histogram_quantile("] {
        if let Some(rest) = e.strip_prefix(f) {
            e = rest.split_once(',').map_or(rest, |(_, r)| r.trim_start());
            e = e.trim_start_matches('(').trim_start();
        }
    }
    let word: String = e.chars().take_while(char::is_ascii_alphanumeric).collect();
    let after = e[word.len()..].trim_start();
    match after.strip_prefix("by (") {
        Some(rest) => rest
            .split(')')
            .next()
            .unwrap_or_default()
            .split(',')
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty() && l != "le")
            .collect(),
        None => Vec::new(),
    }
}

/// The `$labels.x` an alert's annotations name.
fn annotation_labels(annotations: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for v in annotations
        .as_object()
        .into_iter()
        .flatten()
        .map(|(_, v)| v)
    {
        let text = v.as_str().unwrap_or_default();
        for part in text.split("$labels.").skip(1) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.insert(name);
        }
    }
    out
}

/// The ServiceMonitor the agent wrote for `ns`'s admission service, as Prometheus would read
/// it: (replica addresses, CA PEM, server name, path).
async fn admission_target(mgmt: &kube::Client, ns: &str) -> (Vec<String>, String, String, String) {
    use hcp_fleet_render::config::MonitoringApi;
    use hcp_fleet_render::management::service_monitor_resource;
    let ar = service_monitor_resource(MonitoringApi::Coreos).expect("a group");
    let sm = Api::<kube::api::DynamicObject>::namespaced_with(mgmt.clone(), ns, &ar)
        .get("hcp-fleet-admission")
        .await
        .expect("the ServiceMonitor");
    let ep = &sm.data["spec"]["endpoints"][0];
    let tls = &ep["tlsConfig"];
    let (secret, key) = (
        tls["ca"]["secret"]["name"].as_str().expect("CA secret"),
        tls["ca"]["secret"]["key"].as_str().expect("CA key"),
    );
    let ca = Api::<Secret>::namespaced(mgmt.clone(), ns)
        .get(secret)
        .await
        .expect("CA")
        .data
        .and_then(|d| {
            d.get(key)
                .map(|b| String::from_utf8_lossy(&b.0).to_string())
        })
        .expect("CA key");
    let svc = Api::<Service>::namespaced(mgmt.clone(), ns)
        .get("hcp-fleet-admission")
        .await
        .expect("Service");
    let replicas = svc
        .annotations()
        .get(LOCAL_REPLICAS_ANNOTATION)
        .cloned()
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    (
        replicas,
        ca,
        tls["serverName"].as_str().expect("serverName").to_string(),
        ep["path"].as_str().expect("path").to_string(),
    )
}

/// A Prometheus server scraping a fleet of two hosted clusters (hc-1 healthy, with drift
/// repaired and an override; hc-2's credentials revoked) evaluates every rule without error,
/// every dashboard query returns series with the labels its panel groups by, and each alert
/// the fleet's state meets returns series with every label its text names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_evaluates_every_rule_and_dashboard_query_on_a_fleet() {
    let Some((_, prometheus)) =
        tools("the real Prometheus's evaluation of the alerts and dashboard")
    else {
        return;
    };
    let (fleet, mgmt, _pods) = support::fleet_with_pods(2).await;
    support::install_monitoring_crds(&mgmt).await;
    // Every guard through the service, so that every rule over the admission replicas'
    // series has some to read.
    let agent = start_agent(&mgmt, support::through_the_service()).await;
    wait_compliant(&mgmt, &["hc-1", "hc-2"]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let agent_addr = listener.local_addr().expect("addr");
    let _server = agent::serve(listener, agent.context.metrics.clone());

    // What the dashboard shows must exist: an override, and (once Prometheus watches, so it
    // sees the counters rise from zero) a broken cluster and a drift repaired.
    let overrides =
        Api::<hcp_fleet_model::crd::admission_rollout::HostedAdmissionOverride>::namespaced(
            mgmt.clone(),
            "clusters-hc-1",
        );
    let o: hcp_fleet_model::crd::admission_rollout::HostedAdmissionOverride =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "hcp-fleet.openshift.io/v1alpha1",
            "kind": "HostedAdmissionOverride",
            "metadata": {"name": "ticket"},
            // A reason only: accepted, and nothing to roll out (the replicas Prometheus is
            // given below stay the ones that serve).
            "spec": {"reason": "OHSS-1: monitoring test"},
        }))
        .expect("override");
    overrides
        .create(&Default::default(), &o)
        .await
        .expect("create override");

    // Prometheus: the agent as the chart's ServiceMonitor names it (job and namespace), each
    // admission service as the agent's ServiceMonitor does (HTTPS, its CA, its DNS name).
    let dir = tempfile::tempdir().expect("tmp");
    let rules = write_rules(dir.path());
    let mut scrape = vec![serde_json::json!({
        // The job the Prometheus Operator names after the chart's Service.
        "job_name": "hcp-fleet-agent-metrics",
        "static_configs": [{"targets": [agent_addr.to_string()], "labels": {"namespace": AGENT_NAMESPACE}}],
    })];
    for ns in ["clusters-hc-1", "clusters-hc-2"] {
        let (targets, ca, server_name, path) = admission_target(&mgmt, ns).await;
        let ca_file = dir.path().join(format!("{ns}-ca.crt"));
        std::fs::write(&ca_file, ca).expect("ca");
        scrape.push(serde_json::json!({
            "job_name": format!("hcp-fleet-admission-{ns}"),
            "scheme": "https",
            "metrics_path": path,
            "tls_config": {"ca_file": ca_file, "server_name": server_name},
            "static_configs": [{"targets": targets, "labels": {"namespace": ns}}],
        }));
    }
    let config = serde_json::json!({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [dir.path().join("rules.yaml")],
        "scrape_configs": scrape,
    });
    std::fs::write(
        dir.path().join("prometheus.yml"),
        serde_saphyr::to_string(&config).expect("yaml"),
    )
    .expect("config");
    let port = free_port();
    let _prom = support::KillOnDrop(
        Command::new(&prometheus)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).expect("log"))
            .spawn()
            .expect("prometheus"),
    );
    let base = format!("http://127.0.0.1:{port}");

    // Every target up (the admission services over verified TLS), and hc-2 reported broken.
    eventually("every target up", Duration::from_secs(60), || async {
        let up = query(&base, "up").await?;
        let down: Vec<&Value> = up.iter().filter(|s| s["value"][1] != "1").collect();
        if up.len() >= 3 && down.is_empty() {
            Ok(())
        } else {
            Err(format!("{up:?}"))
        }
    })
    .await;
    // hc-2's credentials revoked: 401 from its API server, hosted-access errors counted.
    let good = fleet.hosted("hc-2").expect("hc-2").kubeconfig_yaml.clone();
    let mut revoked: Value = serde_saphyr::from_str(&good).expect("kubeconfig");
    revoked["users"][0]["user"] = serde_json::json!({"token": "revoked"});
    put_kubeconfig_secret(
        &Api::<Secret>::namespaced(mgmt.clone(), "clusters-hc-2"),
        SERVICE_NETWORK_KUBECONFIG,
        "kubeconfig",
        &serde_json::to_string(&revoked).expect("json"),
    )
    .await
    .expect("secret");
    eventually(
        "hc-2 NonCompliant in Prometheus",
        Duration::from_secs(60),
        || async {
            let v = query(
                &base,
                r#"hcp_fleet_hosted_cluster_compliance{hosted_cluster="hc-2"} == 1"#,
            )
            .await?;
            if v.is_empty() {
                Err("not yet".into())
            } else {
                Ok(())
            }
        },
    )
    .await;
    let vapi = support::delete_validating(&fleet, "hc-1").await;
    eventually("the repair", Duration::from_secs(20), || vapi.present()).await;
    // Rates need two samples within their window.
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Every rule evaluated against the real series, without error.
    eventually("every rule evaluated", Duration::from_secs(30), || async {
        let body = reqwest_like_get(&format!("{base}/api/v1/rules"), &[]).await?;
        let doc: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let rules: Vec<&Value> = doc["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        let bad: Vec<String> = rules
            .iter()
            .filter(|r| r["health"] != "ok")
            .map(|r| format!("{}: {} {}", r["name"], r["health"], r["lastError"]))
            .collect();
        if rules.len() == alerts(&rule_file()).len() && bad.is_empty() {
            Ok(())
        } else {
            Err(format!("{} rules, not ok: {bad:?}", rules.len()))
        }
    })
    .await;

    // Every dashboard query, with Grafana's interval as the panel would get it.
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("charts/hcp-fleet-agent/dashboards/hcp-fleet.json"))
            .expect("dashboard"),
    )
    .expect("dashboard json");
    let mut checked = 0;
    for panel in dash["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let Some(expr) = t["expr"].as_str() else {
                continue;
            };
            let q = grafana(expr);
            // `target` is empty (so absent in Prometheus) while no revision is on its way
            // (docs/metrics.md, hcp_fleet_rollout_info).
            let want: Vec<String> = outer_labels(&q)
                .into_iter()
                .filter(|l| l != "target")
                .collect();
            let mut series = query(&base, &q)
                .await
                .unwrap_or_else(|e| panic!("panel {}: {e}", panel["title"]));
            // A panel that lists only what is wrong (`… != 1`) is empty while nothing is: its
            // shape is read from what it filters.
            if series.is_empty()
                && let Some(all) = without_filter(&q)
            {
                series = query(&base, &all).await.expect("unfiltered");
            }
            assert!(
                !series.is_empty(),
                "panel {}: {q} returned nothing",
                panel["title"]
            );
            for s in &series {
                for l in &want {
                    assert!(
                        s["metric"][l].as_str().is_some_and(|v| !v.is_empty()),
                        "panel {}: {q}: a series without {l}: {s}",
                        panel["title"]
                    );
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 20, "{checked} queries");

    // The alerts the fleet's state meets return series with every label their text names.
    let active = [
        "HcpFleetHostedClusterNonCompliant",
        "HcpFleetHostedClusterUnreachable",
        "HcpFleetKubeconfigsRefused",
        "HcpFleetGuardTampered",
    ];
    for (name, expr, annotations) in alerts(&rules) {
        if !active.contains(&name.as_str()) {
            continue;
        }
        // A rate needs the counter's rise inside its window: asked until it shows.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let series = loop {
            let found = query(&base, &expr).await.expect("query");
            if !found.is_empty() {
                break found;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{name}: {expr} found nothing on this fleet"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        for l in annotation_labels(&annotations) {
            for s in &series {
                assert!(
                    s["metric"][&l].as_str().is_some_and(|v| !v.is_empty()),
                    "{name}: its text names $labels.{l}, which {s} lacks"
                );
            }
        }
    }
    drop(agent);
}

/// `q` without its trailing comparison with a number (`… != 1`), if it has one.
fn without_filter(q: &str) -> Option<String> {
    for op in [" != ", " == ", " > ", " < "] {
        if let Some((left, right)) = q.rsplit_once(op)
            && right.trim().parse::<f64>().is_ok()
        {
            return Some(left.to_string());
        }
    }
    None
}

/// A dashboard expression as Grafana sends it: its variables replaced (every cluster; the
/// rate interval of a 1 s scrape).
fn grafana(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$cluster", ".*")
        .replace("$hosted_cluster", ".*")
        .replace("$hcp_namespace", ".*")
        .replace("$topn", "10")
}

#[test]
fn outer_labels_read_the_outermost_grouping() {
    assert_eq!(outer_labels("max by (a, b) (m)"), ["a", "b"]);
    assert_eq!(
        outer_labels("histogram_quantile(0.99, sum by (le, c) (rate(x[1m])))"),
        ["c"]
    );
    assert!(outer_labels("count(max by (a) (m) == 1) or vector(0)").is_empty());
    assert_eq!(outer_labels("(min by (h) (m) - time()) / 86400"), ["h"]);
    assert_eq!(
        outer_labels("topk(10, histogram_quantile(0.99, sum by (le, h) (rate(x[1m]))))"),
        ["h"]
    );
    assert_eq!(
        outer_labels("bottomk(5, (min by (h) (m) - time()) / 86400)"),
        ["h"]
    );
    assert_eq!(
        without_filter("min by (h) (m) != 1").as_deref(),
        Some("min by (h) (m)")
    );
    assert_eq!(without_filter("count(m == 1) or vector(0)"), None);
}
