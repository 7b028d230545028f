//! `make bench` (engines part): guarded requests through a real hosted kube-apiserver, with the
//! guards on webhooks (the API server calls the real admission service over TLS, run by the
//! test bed's kubelet) and then on ValidatingAdmissionPolicies (evaluated by the API server
//! itself), side by side in one run on the newest test-bed version. Three requests:
//! - a regular user's denied delete of a protected ClusterRole (the protected-RBAC guard);
//! - an exempt identity's (`system:admin`) allowed update of the ingress config's spec (the
//!   ingress-config guard, which exempts it);
//! - a LoadBalancer Service created (dry run) without the AWS tag, which comes back tagged:
//!   the Service tag mutation, through its webhook and (where the server serves
//!   MutatingAdmissionPolicy, 1.36) through its mutating policy.
//!
//! For each: requests per second and client-side p50/p99 latency of a closed loop of
//! BENCH_CLIENTS clients (default 8) for BENCH_SECONDS (default 5), and how many of them
//! reached the admission service (its own request counter). Everything shares the machine's
//! two cores: the figures compare the engines, they do not size a production server.

// An e2e scenario reads as one story, set up, acted and checked in order: the 100-line and
// seven-argument limits hold the shipped code in src/ (clippy.toml).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)]

#[path = "support/mod.rs"]
mod support;

use support::env_num;

use std::time::{Duration, Instant};

use hcp_fleet_cli::agent;

use hcp_fleet_cli::agent::StartOptions;
use hcp_fleet_guards::catalogue::GuardEngine;
use hcp_fleet_guards::{has_cel_form, has_mutation_form};
use hcp_fleet_render::config::AgentConfig;
use hcp_fleet_testbed::{LocalFleet, kubelet};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};

const NS: &str = "clusters-hc-1";
const RBAC: &str = "protected-rbac.hcp-fleet.openshift.io";
const INGRESS: &str = "ingress-config.hcp-fleet.openshift.io";
const TAGS: &str = "service-tags.hcp-fleet.openshift.io";
const PROTECTED: &str = "hcp-fleet: deleting the protected ClusterRole \"cluster-admin\"";

fn with_engine(engine: GuardEngine) -> AgentConfig {
    let mut cfg = hcp_fleet_testbed::allow_loopback(AgentConfig::default());
    for w in &mut cfg.webhooks {
        if has_cel_form(&w.path) || has_mutation_form(&w.path) {
            w.engine = engine;
        }
    }
    cfg
}

fn ingress_api(client: Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("config.openshift.io", "v1", "Ingress"),
        "ingresses",
    );
    Api::all_with(client, &ar)
}

/// The hosted cluster as the bench needs it: alice may delete cluster roles (only the guard
/// stops her), system:admin may do anything (and is exempt), the ingress config exists.
async fn prepare(fleet: &LocalFleet) -> Result<(), String> {
    let admin = fleet
        .hosted("hc-1")
        .ok_or("no hc-1")?
        .client()
        .await
        .map_err(|e| e.to_string())?;
    let e = |e: kube::Error| e.to_string();
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "bench-alice"},
        "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["delete"]}],
    }))
    .map_err(|e| e.to_string())?;
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .map_err(e)?;
    for (name, role, user) in [
        ("bench-alice", "bench-alice", "alice"),
        ("bench-admin", "cluster-admin", "system:admin"),
    ] {
        let b: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }))
        .map_err(|e| e.to_string())?;
        Api::<ClusterRoleBinding>::all(admin.clone())
            .create(&PostParams::default(), &b)
            .await
            .map_err(e)?;
    }
    let ingress = serde_json::json!({"apiVersion": "config.openshift.io/v1", "kind": "Ingress",
        "metadata": {"name": "cluster"}, "spec": {"domain": "apps.hc-1.example.com"}});
    ingress_api(admin)
        .create(
            &PostParams::default(),
            &serde_json::from_value(ingress).map_err(|e| e.to_string())?,
        )
        .await
        .map_err(e)?;
    Ok(())
}

#[derive(Clone, Copy)]
enum Request {
    DeniedDelete,
    ExemptUpdate,
    TaggedService,
}

/// One request; `Ok` when it ended as the guard must end it (denied with the guard's text, or
/// allowed), with who denied it (true: an admission policy).
async fn once(what: Request, alice: &Client, admin: &Client, n: u64) -> Result<bool, String> {
    match what {
        Request::DeniedDelete => {
            let dp = DeleteParams {
                dry_run: true,
                ..DeleteParams::default()
            };
            match Api::<ClusterRole>::all(alice.clone())
                .delete("cluster-admin", &dp)
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(PROTECTED) => {
                    Ok(s.message.contains("ValidatingAdmissionPolicy"))
                }
                other => Err(format!(
                    "alice's delete was not denied by the guard: {other:?}"
                )),
            }
        }
        Request::ExemptUpdate => {
            let pp = PatchParams {
                dry_run: true,
                ..PatchParams::default()
            };
            let patch =
                serde_json::json!({"spec": {"domain": format!("apps-{n}.hc-1.example.com")}});
            ingress_api(admin.clone())
                .patch("cluster", &pp, &Patch::Merge(&patch))
                .await
                .map(|_| false)
                .map_err(|e| format!("system:admin's update was refused: {e}"))
        }
        Request::TaggedService => {
            use hcp_fleet_guards::service_tags::{TAG, TAGS_ANNOTATION};
            use k8s_openapi::api::core::v1::Service;
            let svc = support::load_balancer(&format!("lb-{n}"), serde_json::Value::Null);
            let pp = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            let created = Api::<Service>::namespaced(admin.clone(), "default")
                .create(&pp, &svc)
                .await
                .map_err(|e| format!("the Service create was refused: {e}"))?;
            let tagged = created
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(TAGS_ANNOTATION))
                .is_some_and(|v| v == TAG);
            if tagged {
                Ok(false)
            } else {
                Err(format!(
                    "the Service came back untagged: {:?}",
                    created.metadata.annotations
                ))
            }
        }
    }
}

/// Until three tagged Services in a row leave the admission service's count for the Service
/// tag as `by_policy` says (still: its mutating policy tags them; growing: its webhook does).
async fn mutation_in_force(mgmt: &Client, admin: &Client, by_policy: bool) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut streak = 0;
    while streak < 3 {
        if Instant::now() > deadline {
            return Err(format!(
                "the Service tag did not move to its {} within 60s",
                if by_policy { "policy" } else { "webhook" }
            ));
        }
        let before = support::service_requests(mgmt, NS, TAGS).await;
        once(Request::TaggedService, admin, admin, 0).await?;
        let after = support::service_requests(mgmt, NS, TAGS).await;
        if (after == before) == by_policy {
            streak += 1;
        } else {
            streak = 0;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

struct Row {
    rps: f64,
    p50: f64,
    p99: f64,
    service_calls: f64,
    by_policy: usize,
    total: usize,
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

async fn measure(
    mgmt: &Client,
    what: Request,
    alice: &Client,
    admin: &Client,
    clients: u64,
    secs: u64,
) -> Result<Row, String> {
    let hook = match what {
        Request::DeniedDelete => RBAC,
        Request::ExemptUpdate => INGRESS,
        Request::TaggedService => TAGS,
    };
    // Warm-up: connections and the API server's caches.
    for n in 0..20 {
        once(what, alice, admin, n).await?;
    }
    let calls0 = support::service_requests(mgmt, NS, hook).await;
    let until = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (alice, admin) = (alice.clone(), admin.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut by_policy = 0usize;
                let mut n = c * 1_000_000;
                while Instant::now() < until {
                    let t0 = Instant::now();
                    by_policy += usize::from(once(what, &alice, &admin, n).await?);
                    lat.push(t0.elapsed());
                    n += 1;
                }
                Ok::<_, String>((lat, by_policy))
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut by_policy = 0;
    for t in tasks {
        let (lat, p) = t.await.map_err(|e| e.to_string())??;
        all.extend(lat);
        by_policy += p;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let calls1 = support::service_requests(mgmt, NS, hook).await;
    all.sort();
    Ok(Row {
        rps: all.len() as f64 / elapsed,
        p50: pct(&all, 50.0),
        p99: pct(&all, 99.0),
        service_calls: calls1 - calls0,
        by_policy,
        total: all.len(),
    })
}

fn main() {
    support::bench_main(Some(2), run);
}

async fn run() -> Result<(), String> {
    let secs = env_num("BENCH_SECONDS", 5);
    let clients = env_num("BENCH_CLIENTS", 8);
    let (fleet, mgmt, _pods) = support::fleet_with_pods(1).await;
    if !fleet.version.at_least(1, 30) {
        println!(
            "engines benchmark: the test bed's kube-apiserver {} serves no ValidatingAdmissionPolicy; nothing to compare",
            fleet.version
        );
        return Ok(());
    }
    let agent = agent::start(
        mgmt.clone(),
        with_engine(GuardEngine::Webhook),
        StartOptions {
            agent_namespace: "hcp-fleet-agent".into(),
            endpoints: kubelet::endpoints(),
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    prepare(&fleet).await?;
    let alice = support::hosted_client_as(&fleet, "hc-1", "alice").await;
    let admin = support::hosted_client_as(&fleet, "hc-1", "system:admin").await;

    println!(
        "engines benchmark: guarded requests through a real hosted kube-apiserver {} (test bed),",
        fleet.version
    );
    println!(
        "{clients} closed-loop clients for {secs}s per row; the admission service is the real process over TLS;"
    );
    println!("API servers, etcd, the service and this load share the machine's two cores");
    println!(
        "{:<8} {:<37} {:>8} {:>8} {:>8} {:>14}",
        "engine", "request", "req/s", "p50 ms", "p99 ms", "service calls"
    );
    for engine in [GuardEngine::Webhook, GuardEngine::Policy] {
        agent.set_config(with_engine(engine));
        let want_policy = engine == GuardEngine::Policy;
        // In force when three denials in a row come from the engine asked for.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut streak = 0;
        while streak < 3 {
            if Instant::now() > deadline {
                return Err(format!("the guards did not move to {engine:?} within 60s"));
            }
            match once(Request::DeniedDelete, &alice, &admin, 0).await {
                Ok(p) if p == want_policy => streak += 1,
                _ => {
                    streak = 0;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        let name = if want_policy { "policy" } else { "webhook" };
        let mutating = fleet
            .version
            .serves(hcp_fleet_testbed::assets::Feature::MutatingPolicies);
        if mutating {
            mutation_in_force(&mgmt, &admin, want_policy).await?;
        }
        let rows = [
            (Request::DeniedDelete, "denied ClusterRole delete (alice)"),
            (
                Request::ExemptUpdate,
                "exempt ingress update (system:admin)",
            ),
            (
                Request::TaggedService,
                "LoadBalancer Service tagged (admin)",
            ),
        ];
        // The Service tag is a mutating policy only where MutatingAdmissionPolicy is served.
        for (what, label) in rows
            .into_iter()
            .filter(|(w, _)| mutating || !matches!(w, Request::TaggedService))
        {
            let r = measure(&mgmt, what, &alice, &admin, clients, secs).await?;
            if matches!(what, Request::DeniedDelete) && (r.by_policy == r.total) != want_policy {
                return Err(format!(
                    "{name}: {} of {} denials came from a policy",
                    r.by_policy, r.total
                ));
            }
            if matches!(what, Request::TaggedService) && (r.service_calls == 0.0) != want_policy {
                return Err(format!(
                    "{name}: {} of {} tagged Services were tagged by the service",
                    r.service_calls, r.total
                ));
            }
            println!(
                "{:<8} {:<37} {:>8.0} {:>8.2} {:>8.2} {:>14.0}",
                name, label, r.rps, r.p50, r.p99, r.service_calls
            );
        }
    }
    drop(agent);
    Ok(())
}
