//! The admission path under load: a stopped service, engines switched, certificates replaced, a rolling restart, nothing let through.

use super::*;

/// An admission service that stops answering (SIGSTOP) is reported NonCompliant within 5 s,
/// from the Deployment the agent already watches (the readiness probe takes the replica out),
/// not from the once-a-minute probe; meanwhile the guard is off (failurePolicy Ignore), which
/// is exactly why it must be reported. Resumed, it is Compliant again. Killed, likewise, until
/// a rollout restart brings it back enforcing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_admission_service_is_reported_within_five_seconds() {
    let bed = bed(through_the_service()).await;
    let pids = webhook_pids(bed.pods.path());
    assert_eq!(pids.len(), 2, "two admission replicas for hc-1: {pids:?}");
    signal_all(&pids, libc::SIGSTOP);
    let stopped = Instant::now();
    service_reported_down(&bed).await;
    let detected = stopped.elapsed();
    // Fail open meanwhile: the call times out and Ignore lets the request through.
    let (ok, out) = kubectl(&bed, DELETE_AS_ALICE);
    assert!(ok, "fail open: {out}");
    signal_all(&pids, libc::SIGCONT);
    let resumed = Instant::now();
    wait_concern(&bed.mgmt, "admission-service", "Compliant").await;
    wait_concern(&bed.mgmt, "e2e-probe", "Compliant").await;
    let recovered = resumed.elapsed();
    assert!(
        detected <= Duration::from_secs(5),
        "a stopped admission service reported after {detected:?}"
    );
    let (ok, out) = kubectl(&bed, DELETE_AS_ALICE);
    assert!(!ok && out.contains(PROTECTED), "enforcing again: {out}");

    // Killed: reported the same way, and back (kubectl rollout restart) enforcing.
    signal_all(&pids, libc::SIGKILL);
    for pid in &pids {
        assert!(support::wait_gone(*pid, Duration::from_secs(5)));
    }
    service_reported_down(&bed).await;
    rollout_restart(&bed).await;
    wait_concern(&bed.mgmt, "e2e-probe", "Compliant").await;
    let (ok, out) = kubectl(&bed, DELETE_AS_ALICE);
    assert!(!ok && out.contains(PROTECTED), "{out}");
    eprintln!(
        "stopped admission service: NonCompliant after {detected:?}, Compliant {recovered:?} after SIGCONT"
    );
}

/// Sends `sig` to each of the test bed's own child processes `pids`.
// Sends signals to child processes (libc::kill).
#[allow(unsafe_code)]
pub(crate) fn signal_all(pids: &[u32], sig: i32) {
    for pid in pids {
        assert_eq!(unsafe { libc::kill(*pid as i32, sig) }, 0);
    }
}

/// hc-1's admission-service concern reports no ready replica (within 30 s).
pub(crate) async fn service_reported_down(bed: &Bed) {
    eventually(
        "admission-service NonCompliant",
        Duration::from_secs(30),
        || async {
            match newest(&bed.mgmt, "admission-service").await {
                (Some(c), m) if c == "NonCompliant" && m.contains("no ready replica") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// `kubectl rollout restart` of hc-1's admission Deployment.
pub(crate) async fn rollout_restart(bed: &Bed) {
    let patch = serde_json::json!({"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": jiff::Timestamp::now().to_string()}}}}});
    Api::<Deployment>::namespaced(bed.mgmt.clone(), NS)
        .patch(
            "hcp-fleet-admission",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("restart");
}

/// hc-1's admin client.
pub(crate) async fn hc1_admin(bed: &Bed) -> Client {
    bed.fleet
        .hosted("hc-1")
        .expect("hc-1")
        .client()
        .await
        .expect("hosted")
}

/// Every CA the agent's configurations in `hosted` trust now, as one bundle.
pub(crate) async fn trust_of(hosted: &Client) -> String {
    hcp_fleet_agent::controller::installed_trust(hosted)
        .await
        .expect("trust")
}

/// Every guarded request sent (at least `min`) was answered by the service, and denied.
pub(crate) fn assert_nothing_let_through(counts: &LoadCounts, min: usize) {
    assert!(counts.sent >= min, "{counts:?}");
    assert_eq!(
        (counts.allowed, counts.other),
        (0, 0),
        "guarded requests let through or unanswered: {counts:?}"
    );
    assert_eq!(counts.denied, counts.sent, "{counts:?}");
}

/// alice's client in the hosted cluster (impersonated through the admin kubeconfig): a
/// regular user whom the guard must stop from deleting a protected ClusterRole.
pub(crate) async fn alice(bed: &Bed) -> Api<ClusterRole> {
    Api::all(support::hosted_client_as(&bed.fleet, "hc-1", "alice").await)
}

/// One load test at a time: each claims 50 guarded requests per second on a machine of two
/// cores; four at once would measure the machine, not the guard (a webhook call then misses
/// its 2 s timeout now and then, and failurePolicy Ignore lets it through).
pub(crate) static LOAD_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Guarded requests at a steady 50 per second through the hosted kube-apiserver (alice
/// deleting cluster-admin, dry run), counted by outcome until stopped.
pub(crate) struct GuardLoad {
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<LoadCounts>,
}

#[derive(Debug, Default)]
pub(crate) struct LoadCounts {
    sent: usize,
    pub(crate) denied: usize,
    /// Denied by an admission policy (the rest of `denied` by the webhook).
    pub(crate) by_policy: usize,
    /// Of `by_policy`, by one loaded from files (`.static.k8s.io`).
    pub(crate) by_static: usize,
    /// Let through: what failurePolicy Ignore does when the service cannot be reached.
    allowed: usize,
    other: usize,
    samples: Vec<String>,
}

impl GuardLoad {
    pub(crate) fn start(roles: Api<ClusterRole>) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            let mut sent = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                tick.tick().await;
                let roles = roles.clone();
                sent.push(tokio::spawn(async move {
                    let dp = DeleteParams {
                        dry_run: true,
                        ..DeleteParams::default()
                    };
                    roles.delete("cluster-admin", &dp).await.map(|_| ())
                }));
            }
            let mut c = LoadCounts {
                sent: sent.len(),
                ..Default::default()
            };
            for t in sent {
                match t.await {
                    Ok(Err(kube::Error::Api(s)))
                        if s.code == 403 && s.message.contains(PROTECTED) =>
                    {
                        c.denied += 1;
                        if s.message.contains("ValidatingAdmissionPolicy") {
                            c.by_policy += 1;
                        }
                        if s.message.contains(".static.k8s.io'") {
                            c.by_static += 1;
                        }
                    }
                    Ok(Ok(())) => c.allowed += 1,
                    other => {
                        c.other += 1;
                        if c.samples.len() < 5 {
                            c.samples.push(format!("{other:?}"));
                        }
                    }
                }
            }
            c
        });
        Self { stop, task }
    }

    pub(crate) async fn stop(self) -> LoadCounts {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("load")
    }
}

/// LoadBalancer Services created (dry run) at a steady 10 per second through the hosted
/// kube-apiserver by its admin, each checked for the AWS tag the Service-tag mutation adds,
/// until stopped: (sent, tagged, samples of the others).
pub(crate) struct TagLoad {
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(usize, usize, Vec<String>)>,
}

impl TagLoad {
    pub(crate) fn start(hosted: Client) -> Self {
        use hcp_fleet_guards::service_tags::{TAG, TAGS_ANNOTATION};
        use k8s_openapi::api::core::v1::Service;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let services = Api::<Service>::namespaced(hosted, "default");
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut sent = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                tick.tick().await;
                let services = services.clone();
                let n = sent.len();
                sent.push(tokio::spawn(async move {
                    let svc = support::load_balancer(&format!("lb-{n}"), serde_json::Value::Null);
                    let dry = PostParams {
                        dry_run: true,
                        ..Default::default()
                    };
                    let created = services
                        .create(&dry, &svc)
                        .await
                        .map_err(|e| e.to_string())?;
                    let tags = created
                        .metadata
                        .annotations
                        .and_then(|a| a.get(TAGS_ANNOTATION).cloned());
                    if tags.as_deref() == Some(TAG) {
                        Ok(())
                    } else {
                        Err(format!("untagged: {tags:?}"))
                    }
                }));
            }
            let total = sent.len();
            let (mut tagged, mut samples) = (0, Vec::new());
            for t in sent {
                match t.await {
                    Ok(Ok(())) => tagged += 1,
                    other => {
                        if samples.len() < 5 {
                            samples.push(format!("{other:?}"));
                        }
                    }
                }
            }
            (total, tagged, samples)
        });
        Self { stop, task }
    }

    pub(crate) async fn stop(self) -> (usize, usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("tag load")
    }
}

/// Until `paths()` reads `want` (webhook entry, policy), for at most 30 s.
async fn until_paths<F, Fut>(what: &str, want: (bool, bool), paths: &F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(bool, bool), String>>,
{
    eventually(what, Duration::from_secs(30), || {
        let p = paths();
        async move {
            match p.await? {
                now if now == want => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
}

/// The guards moved from webhooks to admission policies and back under 50 guarded requests per
/// second: each move writes the new path, waits until the API server answers its probe, and
/// only then removes the old one, so every request is denied with the guard's text, by one
/// path or the other. Where every guard can run inside the hosted kube-apiserver (1.36) the
/// move makes the HCP need no admission service: it is retired once no webhook calls it, and
/// made again, available, before the move back puts a guard on it. Where mutating policies are served (1.36) the Service tag moves with
/// them, under 10 LoadBalancer Services a second, every one of which comes back tagged. On a
/// server without admission policies (1.20) the move is refused by the server's discovery: the
/// webhooks keep guarding (the tag's too), and nothing is let through either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_engines_under_load_lets_nothing_through() {
    use hcp_fleet_render::hosted::webhooks::VALIDATING_NAME;
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingWebhookConfiguration,
    };
    let _turn = LOAD_TURN.lock().await;
    let bed = bed(through_the_service()).await;
    let served = support::serves(
        &bed.fleet.version,
        Feature::AdmissionPolicies,
        "switches between a webhook and an admission policy (the webhook alone is exercised)",
    );
    let hosted = hc1_admin(&bed).await;
    let rbac = "protected-rbac.hcp-fleet.openshift.io";
    // Which paths carry protected RBAC now: (webhook entry, policy).
    let paths = || {
        let hosted = hosted.clone();
        async move {
            let hook = Api::<ValidatingWebhookConfiguration>::all(hosted.clone())
                .get_opt(VALIDATING_NAME)
                .await
                .map_err(|e| e.to_string())?
                .and_then(|v| v.webhooks)
                .unwrap_or_default()
                .iter()
                .any(|w| w.name == rbac);
            let policy = if served {
                Api::<ValidatingAdmissionPolicy>::all(hosted)
                    .get_opt(rbac)
                    .await
                    .map_err(|e| e.to_string())?
                    .is_some()
            } else {
                false
            };
            Ok::<_, String>((hook, policy))
        }
    };
    assert_eq!(paths().await, Ok((true, false)));
    // The Service tag moves with them where mutating policies are served (engine auto puts it
    // on its policy there): (webhook entry, mutating policy).
    let mutating = bed.fleet.version.serves(Feature::MutatingPolicies);
    let tag = hcp_fleet_guards::service_tags::ROW.name;
    let tag_paths = || {
        let hosted = hosted.clone();
        async move {
            let hook = support::mutating_webhook_entry(&hosted, tag).await?;
            let policy = mutating && support::mutating_policy_exists(&hosted, tag).await?;
            Ok::<_, String>((hook, policy))
        }
    };
    assert_eq!(tag_paths().await, Ok((true, false)));
    let tags = TagLoad::start(hosted.clone());
    let load = GuardLoad::start(alice(&bed).await);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;

    bed.set_config(with_engine(GuardEngine::Policy));
    if served {
        until_paths("the guards moved to policies", (false, true), &paths).await;
    } else {
        wait_concern(&bed.mgmt, "hosted-webhooks", "NonCompliant").await;
        assert_eq!(
            paths().await,
            Ok((true, false)),
            "the webhook keeps guarding"
        );
    }
    let tag_moved = if mutating {
        (false, true)
    } else {
        (true, false)
    };
    until_paths("the Service tag on its path", tag_moved, &tag_paths).await;
    // Where mutating policies are served every guard now runs inside the hosted
    // kube-apiserver (the pod image spec mutation has no registry to rewrite for): the
    // admission service goes, once no webhook calls it (#61).
    let ns = hcp_fleet_testbed::fixtures::hcp_namespace("hc-1");
    if mutating {
        eventually(
            "the admission service retired",
            Duration::from_secs(30),
            || async {
                let there = support::admission_objects(&bed.mgmt, &ns).await;
                there.is_empty().then_some(()).ok_or(format!("{there:?}"))
            },
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;

    bed.set_config(through_the_service());
    until_paths("the guards back on webhooks", (true, false), &paths).await;
    // Back before any guard depended on it: a webhook is proven through it before its
    // policy goes.
    let there = support::admission_objects(&bed.mgmt, &ns).await;
    assert!(
        there.iter().any(|o| o.starts_with("Deployment ")),
        "the admission service back: {there:?}"
    );
    until_paths(
        "the Service tag back on its webhook",
        (true, false),
        &tag_paths,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let counts = load.stop().await;
    let (sent, tagged, untagged) = tags.stop().await;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "engine switches under load: {counts:?}; Services {tagged} of {sent} tagged in {secs:.1}s"
    );
    assert_nothing_let_through(&counts, 500);
    assert!(sent >= 100, "{sent}");
    assert_eq!(
        tagged, sent,
        "Services left untagged while the tag moved: {untagged:?}"
    );
    if served {
        assert!(
            counts.by_policy > 0 && counts.by_policy < counts.denied,
            "both engines answered during the run: {counts:?}"
        );
    } else {
        assert_eq!(counts.by_policy, 0, "{counts:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_replaced_under_load_loses_no_request() {
    let _turn = LOAD_TURN.lock().await;
    let bed = bed(through_the_service()).await;
    let load = GuardLoad::start(alice(&bed).await);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    // Renew the serving certificate as the agent does: same CA, new key.
    let secrets: Api<Secret> = Api::namespaced(bed.mgmt.clone(), NS);
    let ca = secrets
        .get("hcp-fleet-admission-ca")
        .await
        .expect("ca secret");
    let data = ca.data.unwrap_or_default();
    let text = |k: &str| String::from_utf8(data.get(k).expect(k).0.clone()).expect("utf8");
    let ca = KeyedCert {
        cert_pem: text("ca.crt"),
        key_pem: text("ca.key"),
    };
    let sans = management::serving_sans(
        &AgentConfig::default(),
        NS,
        &kubelet::LocalEndpoints.extra_sans(),
    );
    let new = certificates::issue(
        &ca,
        &sans[0],
        &Usage::Server { sans: sans.clone() },
        time::Duration::days(30),
    )
    .expect("issue");
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let patch =
        serde_json::json!({"data": {"tls.crt": b64(&new.cert_pem), "tls.key": b64(&new.key_pem)}});
    secrets
        .patch(
            "hcp-fleet-admission-tls",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("rotate");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let counts = load.stop().await;
    let elapsed = started.elapsed();
    let log =
        std::fs::read_to_string(bed.pods.path().join(NS).join("webhook.log")).unwrap_or_default();
    assert!(
        log.contains("serving certificate reloaded"),
        "the certificate was really replaced: {log}"
    );
    assert_nothing_let_through(&counts, 900);
    eprintln!(
        "{} requests in {elapsed:?} across a certificate renewal: {} denied, {} allowed",
        counts.sent, counts.denied, counts.allowed
    );
}

/// Both certificate Secrets deleted and the Deployment touched under load: the agent makes a
/// new CA, but the hosted caBundle trusts it before any replica serves a certificate from it,
/// and keeps the old CA until every replica has moved on. Not one guarded request gets
/// through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_certificate_secrets_deleted_under_load_let_nothing_through() {
    let _turn = LOAD_TURN.lock().await;
    let bed = bed(through_the_service()).await;
    let hosted = hc1_admin(&bed).await;
    let trust = || trust_of(&hosted);
    let before = trust().await;
    let load = GuardLoad::start(alice(&bed).await);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let secrets: Api<Secret> = Api::namespaced(bed.mgmt.clone(), NS);
    for s in ["hcp-fleet-admission-ca", "hcp-fleet-admission-tls"] {
        secrets
            .delete(s, &DeleteParams::default())
            .await
            .expect("delete");
    }
    // And the Deployment touched at once, as in the incident this guards against: replicas
    // restart while the certificates are being replaced.
    rollout_restart(&bed).await;
    // The old CA goes from the caBundle once the service serves the new certificate.
    eventually(
        "the caBundle holds only the new CA",
        Duration::from_secs(20),
        || {
            let before = before.clone();
            async move {
                let now = trust().await;
                let n = certificates::bundle_ders(&now).len();
                if n == 1 && now != before {
                    Ok(())
                } else {
                    Err(format!("{n} certificate(s) in the caBundle"))
                }
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let counts = load.stop().await;
    let log =
        std::fs::read_to_string(bed.pods.path().join(NS).join("webhook.log")).unwrap_or_default();
    assert!(log.contains("serving certificate reloaded"), "{log}");
    assert_nothing_let_through(&counts, 400);
    eprintln!(
        "Secrets deleted under load: {} requests, {} denied, {} allowed",
        counts.sent, counts.denied, counts.allowed
    );
}

/// Two CA changes under load, one after the other.
///
/// - The CA Secret replaced on its own (a restore from backup, say): the serving certificate
///   in the TLS Secret was not issued by it. The agent issues one from the new CA, trusting it
///   on the hosted side first.
/// - That CA comes due: the agent rotates it when due (no event announces it), the new CA
///   reaches the hosted caBundle before any replica serves a certificate from it, and the
///   previous CA stays there.
///
/// Not one guarded request gets through either change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_ca_and_a_planned_rotation_under_load_let_nothing_through() {
    let _turn = LOAD_TURN.lock().await;
    let bed = bed(through_the_service()).await;
    let hosted = hc1_admin(&bed).await;
    let trust = || trust_of(&hosted);
    let secrets: Api<Secret> = Api::namespaced(bed.mgmt.clone(), NS);
    let secret_text = |name: &'static str, key: &'static str| {
        let secrets = secrets.clone();
        async move {
            let s = secrets.get(name).await.expect(name);
            let data = s.data.unwrap_or_default();
            data.get(key)
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        }
    };
    // A CA that comes due about 45 s from now: generated with a lifetime L (back-dated five
    // minutes, as the agent's are), it is rotated with less than p% of L left.
    let pct = i64::from(
        AgentConfig::default()
            .certificates
            .renew_at_remaining_percent,
    );
    let lifetime: i64 = (45 * 100 + 300 * pct) / (100 - pct);
    let name = certificates::agent_ca_name(time::OffsetDateTime::now_utc());
    let ca = certificates::generate_ca(&name, time::Duration::seconds(lifetime)).expect("ca");
    let facts = certificates::inspect(&ca.cert_pem).expect("facts");
    let due_unix = facts.not_after - (facts.not_after - facts.not_before) * pct / 100;
    let left = due_unix - jiff::Timestamp::now().as_second();
    let due = Instant::now() + Duration::from_secs(u64::try_from(left).expect("due ahead"));

    // 1. The CA Secret replaced on its own, under load.
    let load = GuardLoad::start(alice(&bed).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let patch = serde_json::json!({"data": {
        "ca.crt": b64(&ca.cert_pem),
        "ca.key": b64(&ca.key_pem),
        "previous-ca.crt": null,
    }});
    secrets
        .patch(
            "hcp-fleet-admission-ca",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("replace the CA");
    eventually(
        "the hosted side trusts only the replaced CA",
        Duration::from_secs(20),
        || async {
            let ders = certificates::bundle_ders(&trust().await);
            if ders == certificates::bundle_ders(&ca.cert_pem) {
                Ok(())
            } else {
                Err(format!("{} certificate(s)", ders.len()))
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let replaced = load.stop().await;
    assert_nothing_let_through(&replaced, 150);
    let serving = secret_text("hcp-fleet-admission-tls", "tls.crt")
        .await
        .expect("tls.crt");
    assert!(
        certificates::issued_by(&serving, &ca.cert_pem).expect("parse"),
        "the serving certificate is issued by the replaced CA"
    );
    assert!(
        Instant::now() + Duration::from_secs(5) < due,
        "set up before the CA came due"
    );

    // 2. The replaced CA comes due, under load.
    let load = GuardLoad::start(alice(&bed).await);
    // Rotated when due: the CA Secret's new CA first in the bundle, the old one kept after it.
    eventually("the CA rotated", Duration::from_secs(90), || async {
        let ders = certificates::bundle_ders(&trust().await);
        let current = secret_text("hcp-fleet-admission-ca", "ca.crt")
            .await
            .unwrap_or_default();
        let old = certificates::bundle_ders(&ca.cert_pem);
        let new = certificates::bundle_ders(&current);
        if ders.len() == 2 && ders[1] == old[0] && new.first() == ders.first() {
            Ok(())
        } else {
            Err(format!("{} certificate(s)", ders.len()))
        }
    })
    .await;
    let rotated_after_due = Instant::now().saturating_duration_since(due);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rotated = load.stop().await;
    assert_eq!(
        secret_text("hcp-fleet-admission-ca", "previous-ca.crt")
            .await
            .as_deref(),
        Some(ca.cert_pem.as_str())
    );
    let log =
        std::fs::read_to_string(bed.pods.path().join(NS).join("webhook.log")).unwrap_or_default();
    assert!(log.contains("serving certificate reloaded"), "{log}");
    assert_nothing_let_through(&rotated, 250);
    eprintln!(
        "CA replaced under load: {} requests, {} denied, {} allowed; planned CA rotation under load: in the caBundle {rotated_after_due:?} after it came due; {} requests, {} denied, {} allowed",
        replaced.sent,
        replaced.denied,
        replaced.allowed,
        rotated.sent,
        rotated.denied,
        rotated.allowed
    );
}

/// A rolling restart under load (`kubectl rollout restart`): replicas are replaced one at a
/// time, never fewer ready than wanted (maxUnavailable 0, maxSurge 1), each old one drained
/// out of the routes before it stops. Not one guarded request gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_lets_nothing_through() {
    let _turn = LOAD_TURN.lock().await;
    let bed = bed(through_the_service()).await;
    let before = webhook_pids(bed.pods.path());
    assert_eq!(before.len(), 2, "{before:?}");
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(bed.mgmt.clone(), NS);
    let ready_replicas = || async {
        services
            .get("hcp-fleet-admission")
            .await
            .ok()
            .and_then(|s| {
                s.metadata
                    .annotations?
                    .get(kubelet::LOCAL_REPLICAS_ANNOTATION)
                    .map(|a| a.split(',').filter(|x| !x.is_empty()).count())
            })
            .unwrap_or(0)
    };
    let load = GuardLoad::start(alice(&bed).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    rollout_restart(&bed).await;
    // Until every replica is new: how many were ready, sampled all along.
    let started = Instant::now();
    let mut samples = Vec::new();
    loop {
        samples.push(ready_replicas().await);
        let now = webhook_pids(bed.pods.path());
        if now.len() == 2 && now.iter().all(|p| !before.contains(p)) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "rollout did not finish: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rollout = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counts = load.stop().await;
    let (min, max) = (
        samples.iter().min().copied().unwrap_or(0),
        samples.iter().max().copied().unwrap_or(0),
    );
    assert!(
        min >= 2,
        "fewer ready replicas than wanted during the rollout: {samples:?}"
    );
    assert!(max <= 3, "more than one surge replica: {samples:?}");
    assert_nothing_let_through(&counts, 200);
    eprintln!(
        "rolling restart under load: {rollout:?}, ready replicas between {min} and {max}; {} requests, {} denied, {} allowed",
        counts.sent, counts.denied, counts.allowed
    );
}
