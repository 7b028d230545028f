//! The switch-over from MCVW's package to the agent (docs/operations.md, "Switching over from
//! MCVW"), played on the test bed with a stand-in for MCVW's package: its configurations as
//! MCVW's build writes them for HyperShift (`sre-<webhook>`, `<webhook>.managed.openshift.io`,
//! a URL, failurePolicy Ignore, a 2 s timeout), pointing at a small service that answers two of
//! its webhooks as MCVW's source does (clusterroles-validation, service-mutation).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use base64::Engine as _;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{DeleteParams, PostParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};

use super::*;
use hcp_fleet_render::switch_over::GUARDS_PROVEN_LABEL;

/// MCVW's words when its clusterroles-validation denies (pkg/webhooks/clusterrole).
fn mcvw_denial(role: &str) -> String {
    format!("Deleting ClusterRole {role} is not allowed")
}
const OURS: &str = "hcp-fleet: deleting the protected ClusterRole \"cluster-admin\"";
const TAGS: &str = "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags";

/// clusterroles-validation as MCVW decides it: a DELETE of a protected role (its list, or
/// `backplane-*`) by anyone but its allowed users and group, `system:` users other than
/// system:admin and `kube:` users, is denied.
fn clusterroles_validation(req: &Value) -> Value {
    let user = req["userInfo"]["username"].as_str().unwrap_or_default();
    let groups: Vec<&str> = req["userInfo"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let name = req["oldObject"]["metadata"]["name"]
        .as_str()
        .unwrap_or_default();
    let protected = [
        "cluster-admin",
        "view",
        "edit",
        "admin",
        "system:admin",
        "system:node",
        "system:kube-scheduler",
        "system:kube-controller-manager",
    ]
    .contains(&name)
        || name.starts_with("backplane-");
    let system = user.starts_with("system:") && user != "system:admin";
    let allowed_identity = ["backplane-cluster-admin", "system:admin"].contains(&user)
        || groups.contains(&"system:serviceaccounts:openshift-backplane-srep");
    let deny = user == "system:unauthenticated"
        || (!system
            && !user.starts_with("kube:")
            && protected
            && !allowed_identity
            && req["operation"] == "DELETE");
    if deny {
        json!({"uid": req["uid"], "allowed": false, "status": {"code": 403, "message": mcvw_denial(name)}})
    } else {
        json!({"uid": req["uid"], "allowed": true})
    }
}

/// service-mutation as MCVW decides it: a LoadBalancer Service without `red-hat-managed=true`
/// among its tags gets it first, its other tags after (any other `red-hat-managed=` dropped).
fn service_mutation(req: &Value) -> Value {
    let svc = &req["object"];
    let tags = svc["metadata"]["annotations"][TAGS].as_str();
    let has = tags.is_some_and(|t| t.split(',').any(|t| t == "red-hat-managed=true"));
    if svc["spec"]["type"] != "LoadBalancer" || has {
        return json!({"uid": req["uid"], "allowed": true});
    }
    let op = match (svc["metadata"]["annotations"].is_object(), tags) {
        (false, _) => {
            json!({"op": "add", "path": "/metadata/annotations", "value": {TAGS: "red-hat-managed=true"}})
        }
        (true, None) => {
            json!({"op": "add", "path": format!("/metadata/annotations/{}", TAGS.replace('/', "~1")), "value": "red-hat-managed=true"})
        }
        (true, Some(t)) => {
            let mut v = vec!["red-hat-managed=true"];
            v.extend(t.split(',').filter(|t| !t.starts_with("red-hat-managed=")));
            json!({"op": "replace", "path": format!("/metadata/annotations/{}", TAGS.replace('/', "~1")), "value": v.join(",")})
        }
    };
    let patch = base64::engine::general_purpose::STANDARD.encode(json!([op]).to_string());
    json!({"uid": req["uid"], "allowed": true, "patchType": "JSONPatch", "patch": patch})
}

/// `delay_ms` holds clusterroles-validation's answer back: on webhooks alone the API server
/// reports whichever denial arrives first, so the test chooses who that is.
async fn answer(req: Request<Incoming>, delay_ms: u64) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let Ok(body) = req.into_body().collect().await else {
        return Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .body(Full::new(Bytes::new()))
            .unwrap_or_default();
    };
    let review: Value = serde_json::from_slice(&body.to_bytes()).unwrap_or_default();
    let request = &review["request"];
    let response = match path.as_str() {
        "/clusterroles-validation" => {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            clusterroles_validation(request)
        }
        "/service-mutation" => service_mutation(request),
        _ => json!({"uid": request["uid"], "allowed": true}),
    };
    let out = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
    Response::new(Full::new(Bytes::from(out.to_string())))
}

/// The stand-in MCVW service on a loopback port, and the CA its certificate is signed by.
struct StandIn {
    port: u16,
    ca_pem: String,
    /// How long clusterroles-validation waits before it answers, in milliseconds.
    delay_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl StandIn {
    async fn start() -> StandIn {
        hcp_fleet_guards::crypto::install_provider();
        let (ca, srv) = support::loopback_serving_pair("mcvw");
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(srv.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .expect("certificate");
        let key = PrivateKeyDer::from_pem_slice(srv.key_pem.as_bytes()).expect("key");
        let cfg = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("tls");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen");
        let port = listener.local_addr().expect("addr").port();
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delay = delay_ms.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let delay = delay.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(|req| {
                        let delay_ms = delay.load(Ordering::Relaxed);
                        async move { Ok::<_, std::convert::Infallible>(answer(req, delay_ms).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        StandIn {
            port,
            ca_pem: ca.cert_pem,
            delay_ms,
            task,
        }
    }

    /// The configurations MCVW's package puts in the hosted cluster for these two webhooks.
    fn configurations(&self) -> (Value, Value) {
        let hook = |name: &str, rules: Value| {
            json!({
                "name": format!("{name}.managed.openshift.io"),
                "clientConfig": {
                    "url": format!("https://127.0.0.1:{}/{name}", self.port),
                    "caBundle": base64::engine::general_purpose::STANDARD.encode(&self.ca_pem),
                },
                "rules": rules,
                "failurePolicy": "Ignore",
                "matchPolicy": "Equivalent",
                "sideEffects": "None",
                "timeoutSeconds": 2,
                "admissionReviewVersions": ["v1"],
            })
        };
        let validating = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "sre-clusterroles-validation"},
            "webhooks": [hook("clusterroles-validation", json!([{"operations": ["DELETE"], "apiGroups": ["rbac.authorization.k8s.io"], "apiVersions": ["v1"], "resources": ["clusterroles"], "scope": "Cluster"}]))],
        });
        let mutating = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "sre-service-mutation"},
            "webhooks": [hook("service-mutation", json!([{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["services"], "scope": "Namespaced"}]))],
        });
        (validating, mutating)
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Who denied each of a tenant's guarded requests, sent every 100 ms until stopped.
#[derive(Debug, Default)]
struct Tally {
    by_mcvw: usize,
    by_agent: usize,
    allowed: usize,
    other: Vec<String>,
}

fn tenant_load(roles: Api<ClusterRole>) -> (Arc<AtomicBool>, tokio::task::JoinHandle<Tally>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let task = tokio::spawn(async move {
        let mut t = Tally::default();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let dp = DeleteParams {
            dry_run: true,
            ..DeleteParams::default()
        };
        while !flag.load(Ordering::Relaxed) {
            tick.tick().await;
            match roles.delete("cluster-admin", &dp).await {
                Ok(_) => t.allowed += 1,
                Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(OURS) => {
                    t.by_agent += 1;
                }
                Err(kube::Error::Api(s))
                    if s.code == 403 && s.message.contains(&mcvw_denial("cluster-admin")) =>
                {
                    t.by_mcvw += 1;
                }
                Err(e) => t.other.push(e.to_string()),
            }
        }
        t
    });
    (stop, task)
}

/// An HCP running MCVW's package moves to the agent with a tenant's guarded request sent ten
/// times a second throughout: MCVW's configurations and the agent's stand side by side (the
/// agent leaves MCVW's alone, and the two Service mutations agree), the agent labels the HCP
/// namespace only once its probe and every canary have proven its guards, the label is what
/// the fleet's MCVW Policy deselects (ACM's prune played here: the configurations deleted,
/// the service stopped), and not one request gets through at any point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcvw_hands_over_to_the_agent_without_a_gap() {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    let (fleet, mgmt, _pods) = support::fleet_with_pods(1).await;
    let ns = hcp_namespace("hc-1");
    let admin = fleet
        .hosted("hc-1")
        .expect("hc-1")
        .client()
        .await
        .expect("admin");

    // MCVW's package, as it runs today.
    let mcvw = StandIn::start().await;
    let (validating, mutating) = mcvw.configurations();
    let vapi = Api::<ValidatingWebhookConfiguration>::all(admin.clone());
    let mapi = Api::<MutatingWebhookConfiguration>::all(admin.clone());
    let v = vapi
        .create(
            &PostParams::default(),
            &serde_json::from_value(validating).expect("vwc"),
        )
        .await
        .expect("MCVW's validating configuration");
    let m = mapi
        .create(
            &PostParams::default(),
            &serde_json::from_value(mutating).expect("mwc"),
        )
        .await
        .expect("MCVW's mutating configuration");

    // A tenant (a regular user RBAC lets delete ClusterRoles and create Services).
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "tenant-alice"},
        "rules": [
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["get", "delete"]},
            {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "create"]},
        ],
    }))
    .expect("role");
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "tenant-alice"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tenant-alice"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
    }))
    .expect("binding");
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    let alice = fleet
        .hosted_client_for("hc-1", "alice", &["system:authenticated"])
        .await
        .expect("alice");
    let roles = Api::<ClusterRole>::all(alice.clone());
    // MCVW guards before the agent comes (and RBAC has learnt of alice's binding).
    eventually("MCVW denies", Duration::from_secs(30), || {
        let roles = roles.clone();
        async move {
            let dp = DeleteParams {
                dry_run: true,
                ..DeleteParams::default()
            };
            match roles.delete("cluster-admin", &dp).await {
                Err(kube::Error::Api(s)) if s.message.contains(&mcvw_denial("cluster-admin")) => {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    let (stop, load) = tenant_load(roles);

    // The agent, with the switch-over on.
    let mut cfg = AgentConfig::default();
    cfg.switch_over.label_proven_namespaces = true;
    cfg.probe_interval_seconds = 5;
    let _agent = start_agent(&mgmt, cfg).await;
    wait_compliant(&mgmt, &["hc-1"]).await;
    let namespaces = Api::<Namespace>::all(mgmt.clone());
    let label_of = |n: Namespace| {
        n.metadata
            .labels
            .and_then(|l| l.get(GUARDS_PROVEN_LABEL).cloned())
    };
    // Compliant is the probe; the label waits for every canary as well (one per round).
    assert_eq!(
        label_of(namespaces.get(&ns).await.expect("namespace")),
        None,
        "labelled before every canary was tried"
    );
    if !fleet.version.serves(Feature::AdmissionPolicies) {
        // Webhooks only (1.20): the API server calls both validating webhooks at once and
        // reports whichever denial arrives first. While MCVW's answers first (its stand-in is in
        // this process, usually quicker than the admission service), the canaries it answers
        // prove nothing and are no alarm either: two rounds of every canary, Compliant
        // throughout. Whether the agent's answer ever wins that race is the machine's to say, so
        // the label is not asserted either way here.
        let settings = hcp_fleet_guards::Settings::from(&AgentConfig::default());
        let canaries = hcp_fleet_guards::ALL
            .iter()
            .filter(|g| g.canary(&settings).is_some())
            .count() as u64;
        let until = tokio::time::Instant::now() + Duration::from_secs(2 * canaries * 5 + 5);
        while tokio::time::Instant::now() < until {
            let record = health(&mgmt, &ns).await.expect("record");
            assert_eq!(
                compliant(&record),
                Some("Compliant"),
                "a canary MCVW answered first raised an alarm: {:?}",
                record.status
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // Then MCVW's pod slows (it sits a network hop away in a real management cluster):
        // the agent's denial arrives first, and its canaries prove its guards.
        mcvw.delay_ms.store(1_500, Ordering::Relaxed);
    }
    eventually(
        "the namespace labelled guards-proven",
        Duration::from_secs(180),
        || {
            let namespaces = namespaces.clone();
            let ns = ns.clone();
            async move {
                match label_of(namespaces.get(&ns).await.map_err(|e| e.to_string())?) {
                    Some(v) if v == "true" => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;
    // The record says so in the probe's message.
    eventually(
        "the record says the guards are proven",
        Duration::from_secs(30),
        || {
            let mgmt = mgmt.clone();
            let ns = ns.clone();
            async move {
                let record = health(&mgmt, &ns).await?;
                // Newest first.
                let probe = history_messages(&record, "e2e-probe")
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                if compliant(&record) == Some("Compliant")
                    && probe.contains("every guard proven in force")
                {
                    Ok(())
                } else {
                    Err(format!("{:?}: {probe}", compliant(&record)))
                }
            }
        },
    )
    .await;

    // Side by side: MCVW's configurations as they were, and one Service mutated by both.
    let unchanged = |live: Result<Option<String>, kube::Error>, before: &Option<String>| {
        live.expect("MCVW's configuration") == *before
    };
    assert!(
        unchanged(
            vapi.get("sre-clusterroles-validation")
                .await
                .map(|o| o.metadata.resource_version),
            &v.metadata.resource_version
        ),
        "sre-clusterroles-validation changed by the agent"
    );
    assert!(
        unchanged(
            mapi.get("sre-service-mutation")
                .await
                .map(|o| o.metadata.resource_version),
            &m.metadata.resource_version
        ),
        "sre-service-mutation changed by the agent"
    );
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": "lb", "annotations": {TAGS: "team=a"}},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
    }))
    .expect("service");
    let created = Api::<k8s_openapi::api::core::v1::Service>::namespaced(alice, "default")
        .create(&PostParams::default(), &svc)
        .await
        .expect("a LoadBalancer Service");
    assert_eq!(
        created
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TAGS))
            .map(String::as_str),
        Some("red-hat-managed=true,team=a"),
        "both mutations in force give the tags once"
    );

    // ACM's prune of MCVW's package in a namespace its Policy no longer selects.
    vapi.delete("sre-clusterroles-validation", &DeleteParams::default())
        .await
        .expect("delete");
    mapi.delete("sre-service-mutation", &DeleteParams::default())
        .await
        .expect("delete");
    drop(mcvw);
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let tally = load.await.expect("load");
    assert_eq!(
        (tally.allowed, tally.other.len()),
        (0, 0),
        "guarded requests let through or unanswered: {tally:?}"
    );
    assert!(
        tally.by_mcvw > 0 && tally.by_agent > 0,
        "MCVW's guard, then the agent's: {tally:?}"
    );
    // MCVW gone: the agent's guard alone answers.
    let dp = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    let alone = Api::<ClusterRole>::all(
        fleet
            .hosted_client_for("hc-1", "alice", &["system:authenticated"])
            .await
            .expect("alice"),
    )
    .delete("cluster-admin", &dp)
    .await;
    assert!(
        matches!(&alone, Err(kube::Error::Api(s)) if s.message.contains(OURS)),
        "{alone:?}"
    );
}

/// The chart grants the agent the namespace patch only while the switch-over is on.
#[test]
fn the_chart_grants_namespace_patch_only_for_the_switch_over() {
    let patches_namespaces = |extra: &[&str]| {
        support::chart::render(extra)
            .iter()
            .filter(|o| o["kind"] == "ClusterRole")
            .flat_map(|o| o["rules"].as_array().cloned().unwrap_or_default())
            .any(|r| {
                r["resources"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|x| x == "namespaces"))
                    && r["verbs"]
                        .as_array()
                        .is_some_and(|v| v.iter().any(|x| x == "patch"))
            })
    };
    assert!(!patches_namespaces(&[]));
    assert!(patches_namespaces(&[
        "--set",
        "config.switchOver.labelProvenNamespaces=true"
    ]));
}
