//! A tenant's guarded requests through a real hosted kube-apiserver, timed in a closed loop:
//! the engines bench's rows (`bench_engines.rs`), and the scale bench's at its largest size
//! (`bench_scale.rs`), so both say what a guard costs a tenant's request on each engine.

use std::time::{Duration, Instant};

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};

pub const RBAC: &str = "protected-rbac.hcp-fleet.openshift.io";
pub const INGRESS: &str = "ingress-config.hcp-fleet.openshift.io";
pub const TAGS: &str = "service-tags.hcp-fleet.openshift.io";
pub const PROTECTED: &str = "hcp-fleet: deleting the protected ClusterRole \"cluster-admin\"";

pub fn ingress_api(client: Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("config.openshift.io", "v1", "Ingress"),
        "ingresses",
    );
    Api::all_with(client, &ar)
}

/// The hosted cluster as the bench needs it: alice may delete cluster roles (only the guard
/// stops her), system:admin may do anything (and is exempt), and, with `domain`, the ingress
/// config exists (the exempt update's row; the CRD must be served).
pub async fn prepare(admin: Client, domain: Option<&str>) -> Result<(), String> {
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
    let Some(domain) = domain else {
        return Ok(());
    };
    let ingress = serde_json::json!({"apiVersion": "config.openshift.io/v1", "kind": "Ingress",
        "metadata": {"name": "cluster"}, "spec": {"domain": domain}});
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
pub enum Request {
    DeniedDelete,
    ExemptUpdate,
    TaggedService,
}

/// One request; `Ok` when it ended as the guard must end it (denied with the guard's text, or
/// allowed), with who denied it (true: an admission policy).
pub async fn once(what: Request, alice: &Client, admin: &Client, n: u64) -> Result<bool, String> {
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
                serde_json::json!({"spec": {"domain": format!("apps-{n}.bench.example.com")}});
            ingress_api(admin.clone())
                .patch("cluster", &pp, &Patch::Merge(&patch))
                .await
                .map(|_| false)
                .map_err(|e| format!("system:admin's update was refused: {e}"))
        }
        Request::TaggedService => {
            use hcp_fleet_guards::service_tags::{TAG, TAGS_ANNOTATION};
            use k8s_openapi::api::core::v1::Service;
            let svc = super::load_balancer(&format!("lb-{n}"), serde_json::Value::Null);
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

pub struct Row {
    pub rps: f64,
    pub p50: f64,
    pub p99: f64,
    pub service_calls: f64,
    pub by_policy: usize,
    pub total: usize,
}

pub async fn measure(
    mgmt: &Client,
    ns: &str,
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
    let calls0 = super::service_requests(mgmt, ns, hook).await;
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
    let calls1 = super::service_requests(mgmt, ns, hook).await;
    all.sort();
    Ok(Row {
        rps: all.len() as f64 / elapsed,
        p50: super::percentile_ms(&all, 50.0),
        p99: super::percentile_ms(&all, 99.0),
        service_calls: calls1 - calls0,
        by_policy,
        total: all.len(),
    })
}
