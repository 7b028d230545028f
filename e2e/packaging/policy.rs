//! The management ValidatingAdmissionPolicy, and the helm test.

use super::*;

/// The management cluster's ValidatingAdmissionPolicy (the chart renders it where the API
/// serves the kind, 1.30+), its CEL run through a CEL interpreter (cel-rust) on a table of
/// the agent's own writes, wherever the test runs: the matchCondition selects the agent's
/// ServiceAccount only; namespaced writes only in HCP namespaces; the admission Deployment
/// only as the admission ServiceAccount and with an image of the admission image's repository.
#[test]
fn the_management_policy_holds_the_agent_to_hcp_namespaces_and_its_image() {
    use ::cel::{Context, Env, Value as Cel};
    let objs = render(&[
        "--api-versions",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
    ]);
    let policy = objs
        .iter()
        .find(|o| o["kind"] == "ValidatingAdmissionPolicy")
        .expect("the policy, where the API serves it");
    let binding = objs
        .iter()
        .find(|o| o["kind"] == "ValidatingAdmissionPolicyBinding")
        .expect("its binding");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert!(
        !render(&[])
            .iter()
            .any(|o| o["kind"] == "ValidatingAdmissionPolicy"),
        "left out where the API does not serve it"
    );
    let env = {
        let mut env = Env::stdlib();
        env.add_extension(::cel::extensions::strings)
            .expect("strings");
        std::sync::Arc::new(env)
    };
    let eval = |expr: &str, vars: &[(&str, &Value)]| -> bool {
        let program = env
            .compile(expr)
            .unwrap_or_else(|e| panic!("{expr}: {e:?}"));
        let mut ctx = Context::with_env(env.clone());
        for (name, v) in vars {
            ctx.add_variable_from_value(*name, ::cel::to_value(v).expect("value"));
        }
        match program.execute(&ctx) {
            Ok(Cel::Bool(b)) => b,
            other => panic!("{expr}: {other:?}"),
        }
    };
    let condition = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .expect("condition");
    let rules: Vec<(&str, &str)> = policy["spec"]["validations"]
        .as_array()
        .expect("validations")
        .iter()
        .map(|v| {
            (
                v["expression"].as_str().expect("expression"),
                v["message"].as_str().expect("message"),
            )
        })
        .collect();
    // The first message that refuses, if any, of a request by `user`.
    let judge =
        |user: &str, kind: &str, op: &str, ns_labels: Value, object: Value| -> Option<String> {
            let request =
                json!({"userInfo": {"username": user}, "kind": {"kind": kind}, "operation": op});
            // A namespace without labels has no `labels` field at all, as the API server sends it.
            let ns = match ns_labels {
                Value::Null => json!({"metadata": {"name": "x"}}),
                labels => json!({"metadata": {"name": "x", "labels": labels}}),
            };
            if !eval(condition, &[("request", &request)]) {
                return None;
            }
            let vars = [
                ("request", &request),
                ("namespaceObject", &ns),
                ("object", &object),
            ];
            rules
                .iter()
                .find(|(expr, _)| !eval(expr, &vars))
                .map(|(_, m)| m.to_string())
        };
    let agent = "system:serviceaccount:hcp-fleet-agent:hcp-fleet-agent";
    let hcp = json!({"hypershift.openshift.io/hosted-control-plane": "true"});
    let deployment = |sa: &str, image: &str| json!({"spec": {"template": {"spec": {"serviceAccountName": sa, "containers": [{"name": "webhook", "image": image}]}}}});
    let good = deployment(
        "hcp-fleet-admission",
        "quay.io/hcp-fleet/hcp-fleet-agent:0.1.0",
    );
    let cases: Vec<(&str, Option<String>, Option<&str>)> = vec![
        (
            "a Secret in an HCP namespace",
            judge(agent, "Secret", "CREATE", hcp.clone(), json!({})),
            None,
        ),
        (
            "a Secret in kube-system",
            judge(
                agent,
                "Secret",
                "CREATE",
                json!({"kubernetes.io/metadata.name": "kube-system"}),
                json!({}),
            ),
            Some("only in HCP namespaces"),
        ),
        (
            "a namespace without labels",
            judge(agent, "Secret", "UPDATE", Value::Null, json!({})),
            Some("only in HCP namespaces"),
        ),
        (
            "a namespace labelled false",
            judge(
                agent,
                "Service",
                "CREATE",
                json!({"hypershift.openshift.io/hosted-control-plane": "false"}),
                json!({}),
            ),
            Some("only in HCP namespaces"),
        ),
        (
            "the admission Deployment",
            judge(agent, "Deployment", "UPDATE", hcp.clone(), good.clone()),
            None,
        ),
        (
            "by digest",
            judge(
                agent,
                "Deployment",
                "CREATE",
                hcp.clone(),
                deployment(
                    "hcp-fleet-admission",
                    "quay.io/hcp-fleet/hcp-fleet-agent@sha256:0123",
                ),
            ),
            None,
        ),
        (
            "another image",
            judge(
                agent,
                "Deployment",
                "CREATE",
                hcp.clone(),
                deployment("hcp-fleet-admission", "evil.example.com/miner:1"),
            ),
            Some("with an image of quay.io/hcp-fleet/hcp-fleet-agent"),
        ),
        (
            "a look-alike repository",
            judge(
                agent,
                "Deployment",
                "CREATE",
                hcp.clone(),
                deployment(
                    "hcp-fleet-admission",
                    "quay.io/hcp-fleet/hcp-fleet-agent-evil:1",
                ),
            ),
            Some("with an image of"),
        ),
        (
            "another ServiceAccount",
            judge(
                agent,
                "Deployment",
                "UPDATE",
                hcp.clone(),
                deployment("default", "quay.io/hcp-fleet/hcp-fleet-agent:0.1.0"),
            ),
            Some("runs as hcp-fleet-admission"),
        ),
        (
            "deleting it",
            judge(agent, "Deployment", "DELETE", hcp.clone(), Value::Null),
            None,
        ),
        (
            "someone else, anywhere",
            judge("system:admin", "Secret", "CREATE", Value::Null, json!({})),
            None,
        ),
    ];
    for (what, got, want) in cases {
        match (got.as_deref(), want) {
            (None, None) => {}
            (Some(m), Some(needle)) if m.contains(needle) => {}
            other => panic!("{what}: {other:?}"),
        }
    }
}

/// The chart's `helm test` asks the agent's health port through its Service with the `ready`
/// command: the pod names the Service and port the chart renders, and the command answers 0
/// for a ready agent and 1, saying why, for one that is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helm_test_asks_the_agents_health_port_with_the_ready_command() {
    let objs = render(&[]);
    let test = objs
        .iter()
        .find(|o| o["metadata"]["annotations"]["helm.sh/hook"] == "test")
        .expect("a helm test");
    let args: Vec<&str> = test["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(args[0], "ready");
    let service = objs
        .iter()
        .find(|o| o["kind"] == "Service")
        .expect("the agent's Service");
    let health = service["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == "health")
        .expect("a health port");
    let want = format!(
        "--addr={}.{AGENT_NAMESPACE}.svc:{}",
        service["metadata"]["name"].as_str().expect("name"),
        health["port"]
    );
    assert_eq!(args[1], want);

    let metrics = std::sync::Arc::new(Metrics::new());
    metrics.liveness.beat();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = hcp_fleet_cli::agent::health_router(metrics);
    let _server = tokio::spawn(async move { axum::serve(listener, app).await });
    let ready = |addr: String| {
        Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"))
            .args(["ready", "--addr", &addr, "--timeout-seconds", "3"])
            .output()
            .expect("ready")
    };
    let out = tokio::task::spawn_blocking(move || ready(addr.to_string()))
        .await
        .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let out = tokio::task::spawn_blocking(move || ready(closed.to_string()))
        .await
        .expect("join");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("connecting"));
}
