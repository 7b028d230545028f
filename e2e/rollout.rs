//! Progressive rollout and per-HCP overrides against real kube-apiservers, real admission
//! services and two agent processes with leader election: a good revision reaches the canary
//! first and then one HCP at a time (read from the Deployments' own history, not from logs),
//! carrying on across a leader killed between batches; a revision whose image never becomes
//! available and one whose probe fails halt after the canary, which goes back while the other
//! HCPs never see them; an override is checked by the API server, pins an HCP, and its removal
//! returns the HCP to the fleet's revision.

// An e2e scenario reads as one story, set up, acted and checked in order: the 100-line and
// seven-argument limits hold the shipped code in src/ (clippy.toml).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)]

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hcp_fleet_guards::catalogue::LabelSelector;
use hcp_fleet_model::crd::admission_rollout::{
    AdmissionRollout, HostedAdmissionOverride, ROLLOUT_NAME, RolloutPhase,
};
use hcp_fleet_model::crd::{AdmissionHealth, HostedControlPlane};
use hcp_fleet_model::names::{MANAGED_BY, MANAGED_BY_VALUE};
use hcp_fleet_render::config::{AgentConfig, MaxUnavailable};
use hcp_fleet_render::management::deployment_rolled_out;
use hcp_fleet_render::rollout::{REVISION_ANNOTATION, Revision};
use hcp_fleet_testbed::assets::Feature;
use hcp_fleet_testbed::fixtures::hcp_namespace;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use support::eventually;

const AGENT_NS: &str = "hcp-fleet-agent";
const CANARY: (&str, &str) = ("hcp-fleet.openshift.io/wave", "canary");

/// The test bed's configuration with a quick rollout: the canary label, one HCP at a time,
/// 3 s of soak, 40 s to be done. Every guard on its webhook: what rolls out here is the
/// admission Deployment, which a 1.36 hosted cluster needs no longer with the defaults.
fn config() -> AgentConfig {
    let mut cfg = hcp_fleet_testbed::allow_loopback(support::through_the_service());
    cfg.rollout.canary_selector = LabelSelector {
        match_labels: BTreeMap::from([(CANARY.0.to_string(), CANARY.1.to_string())]),
        ..Default::default()
    };
    cfg.rollout.max_unavailable = MaxUnavailable::Count(1);
    cfg.rollout.soak_seconds = 3;
    cfg.rollout.deadline_seconds = 40;
    cfg
}

fn with_mode(mut cfg: AgentConfig, guard: &str, mode: hcp_fleet_model::Mode) -> AgentConfig {
    for w in &mut cfg.webhooks {
        if w.name.starts_with(guard) {
            w.mode = mode;
        }
    }
    cfg
}

fn write(paths: &[std::path::PathBuf], cfg: &AgentConfig) -> String {
    let yaml = serde_saphyr::to_string(cfg).expect("yaml");
    for p in paths {
        std::fs::write(p, &yaml).expect("config");
    }
    Revision::of(cfg).id
}

async fn rollout(mgmt: &Client) -> Result<AdmissionRollout, String> {
    Api::<AdmissionRollout>::namespaced(mgmt.clone(), AGENT_NS)
        .get(ROLLOUT_NAME)
        .await
        .map_err(|e| e.to_string())
}

/// Waits until the rollout is in `phase` with `stable` as its stable revision (and `target`
/// as its target, when given: a second halt on the same stable revision is told apart).
async fn wait_phase(
    mgmt: &Client,
    phase: RolloutPhase,
    stable: &str,
    target: Option<&str>,
    within: Duration,
) -> AdmissionRollout {
    eventually(&format!("rollout {phase:?} on {stable}"), within, || {
        let mgmt = mgmt.clone();
        let stable = stable.to_string();
        let target = target.map(str::to_string);
        async move {
            let st = rollout(&mgmt).await?.status.unwrap_or_default();
            let on = |r: &Option<hcp_fleet_model::crd::admission_rollout::RevisionRecord>| {
                r.as_ref().map(|r| r.revision.clone())
            };
            let ok = st.phase == phase
                && on(&st.stable).as_deref() == Some(stable.as_str())
                && target.is_none_or(|t| on(&st.target) == Some(t));
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "{} {:?} -> {:?}: {}",
                    st.phase.as_str(),
                    on(&st.stable),
                    on(&st.target),
                    st.message
                ))
            }
        }
    })
    .await;
    rollout(mgmt).await.expect("read")
}

/// What the Deployments said over time: (when, namespace, revision annotation, rolled out).
type History = Arc<Mutex<Vec<(Instant, String, String, bool)>>>;

fn record(mgmt: &Client) -> (History, tokio::task::JoinHandle<()>) {
    let history: History = Arc::default();
    let h = history.clone();
    let api = Api::<Deployment>::all(mgmt.clone());
    let task = tokio::spawn(async move {
        let mut events = watcher(
            api,
            watcher::Config::default().labels(&format!("{MANAGED_BY}={MANAGED_BY_VALUE}")),
        )
        .default_backoff()
        .applied_objects()
        .boxed();
        while let Some(Ok(d)) = events.next().await {
            let rev = d
                .annotations()
                .get(REVISION_ANNOTATION)
                .cloned()
                .unwrap_or_default();
            let entry = (
                Instant::now(),
                d.namespace().unwrap_or_default(),
                rev,
                deployment_rolled_out(&d),
            );
            h.lock().expect("history").push(entry);
        }
    });
    (history, task)
}

/// When each namespace's Deployment first carried `rev`, and first had it rolled out.
fn intervals(history: &History, rev: &str) -> BTreeMap<String, (Instant, Option<Instant>)> {
    let mut out: BTreeMap<String, (Instant, Option<Instant>)> = BTreeMap::new();
    for (at, ns, r, done) in history.lock().expect("history").iter() {
        if r != rev {
            continue;
        }
        let e = out.entry(ns.clone()).or_insert((*at, None));
        if *done && e.1.is_none() {
            e.1 = Some(*at);
        }
    }
    out
}

/// Makes hosted cluster `name`'s HCP a canary, by its label.
async fn label_canary(mgmt: &Client, name: &str) {
    Api::<HostedControlPlane>::namespaced(mgmt.clone(), &hcp_namespace(name))
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"labels": {CANARY.0: CANARY.1}}})),
        )
        .await
        .expect("label the canary");
}

/// Every Event in the agent's namespace.
async fn agent_events(mgmt: &Client) -> Vec<k8s_openapi::api::events::v1::Event> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(mgmt.clone(), AGENT_NS)
        .list(&Default::default())
        .await
        .expect("events")
        .items
}

/// The Event among `events` with `reason` that mentions `needle`, if any.
fn event_of<'e>(
    events: &'e [k8s_openapi::api::events::v1::Event],
    reason: &str,
    needle: &str,
) -> Option<&'e k8s_openapi::api::events::v1::Event> {
    events.iter().find(|e| {
        e.reason.as_deref() == Some(reason) && e.note.as_deref().is_some_and(|n| n.contains(needle))
    })
}

/// Whether an Event in the agent's namespace has `reason` and mentions `needle`.
async fn agent_event(mgmt: &Client, reason: &str, needle: &str) -> bool {
    event_of(&agent_events(mgmt).await, reason, needle).is_some()
}

async fn revision_of(mgmt: &Client, ns: &str) -> Option<String> {
    let h = Api::<AdmissionHealth>::namespaced(mgmt.clone(), ns)
        .get(support::record_of(ns))
        .await
        .ok()?;
    h.status?.revision
}

async fn wait_on(mgmt: &Client, ns: &str, rev: &str, within: Duration) {
    eventually(
        &format!("{ns} Compliant and rolled out on {rev}"),
        within,
        || {
            let mgmt = mgmt.clone();
            async move {
                let h = Api::<AdmissionHealth>::namespaced(mgmt.clone(), ns)
                    .get(support::record_of(ns))
                    .await
                    .map_err(|e| e.to_string())?;
                let st = h.status.unwrap_or_default();
                if st.revision.as_deref() == Some(rev) && st.revision_ready_since.is_some() {
                    Ok(())
                } else {
                    Err(format!(
                        "{:?} {:?} ready {:?}",
                        st.revision, st.compliant, st.revision_ready_since
                    ))
                }
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waves_a_leader_change_and_two_bad_revisions_that_halt_and_roll_back() {
    let (fleet, mgmt, _pods) = support::fleet_with_pods(3).await;
    let names = ["hc-1", "hc-2", "hc-3"];
    let nss: Vec<String> = names.iter().map(|n| hcp_namespace(n)).collect();
    // hc-1 is the canary, by its HCP's label.
    label_canary(&mgmt, "hc-1").await;
    let kubeconfig = &fleet.management.kubeconfig_path;
    let mut paths = Vec::new();
    let mut agents = Vec::new();
    let rev0 = {
        for name in ["agent-a", "agent-b"] {
            let port = hcp_fleet_testbed::free_port().expect("port");
            let path = kubeconfig.with_file_name(format!("rollout-{name}-{port}.yaml"));
            paths.push(path.clone());
            write(&paths, &config());
            let (child, addr) = support::spawn_elected_agent_with(
                name,
                kubeconfig,
                AGENT_NS,
                Some(10),
                &path,
                port,
                &[],
            );
            agents.push((name, child, addr));
        }
        Revision::of(&config()).id
    };
    for ns in &nss {
        wait_on(&mgmt, ns, &rev0, Duration::from_secs(90)).await;
    }
    wait_phase(
        &mgmt,
        RolloutPhase::Complete,
        &rev0,
        None,
        Duration::from_secs(20),
    )
    .await;

    // A good revision (a guard to warn: every Deployment's settings change).
    let (history, _recorder) = record(&mgmt);
    let good = with_mode(config(), "featuregate", hcp_fleet_model::Mode::Warn);
    let rev1 = write(&paths, &good);
    // Kill the leader once the canary is done and before the last batch has finished.
    eventually("the canary is done", Duration::from_secs(60), || {
        let mgmt = mgmt.clone();
        async move {
            let st = rollout(&mgmt).await?.status.unwrap_or_default();
            if st.done.iter().any(|d| d == "clusters-hc-1") {
                Ok(())
            } else {
                Err(st.message)
            }
        }
    })
    .await;
    let leader =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(mgmt.clone(), AGENT_NS)
            .get("hcp-fleet-agent")
            .await
            .expect("lease")
            .spec
            .and_then(|s| s.holder_identity)
            .expect("holder");
    let before_kill = rollout(&mgmt)
        .await
        .expect("rollout")
        .status
        .unwrap_or_default();
    assert_ne!(
        before_kill.phase,
        RolloutPhase::Complete,
        "killed mid-rollout: {}",
        before_kill.message
    );
    let idx = agents
        .iter()
        .position(|(n, _, _)| *n == leader)
        .expect("leader");
    drop(agents.remove(idx));
    let killed = Instant::now();
    wait_phase(
        &mgmt,
        RolloutPhase::Complete,
        &rev1,
        None,
        Duration::from_secs(120),
    )
    .await;
    eprintln!(
        "rollout of {rev1} completed {:?} after the leader was killed",
        killed.elapsed()
    );
    for ns in &nss {
        assert_eq!(revision_of(&mgmt, ns).await.as_deref(), Some(rev1.as_str()));
    }
    // From the Deployments' history: the canary first, then one at a time.
    let spans = intervals(&history, &rev1);
    assert_eq!(spans.len(), 3, "{spans:?}");
    let canary = spans["clusters-hc-1"];
    let canary_done = canary.1.expect("the canary rolled out");
    let mut ordered: Vec<(Instant, Instant)> = spans
        .values()
        .map(|(a, b)| (*a, b.expect("rolled out")))
        .collect();
    ordered.sort();
    for (ns, (start, _)) in &spans {
        if ns != "clusters-hc-1" {
            assert!(
                *start > canary_done,
                "{ns} started before the canary was done"
            );
        }
    }
    for w in ordered.windows(2) {
        assert!(
            w[1].0 >= w[0].1,
            "two HCPs were rolling out at once: {ordered:?}"
        );
    }
    // The standby carried on: nothing done before the kill was rolled out again.
    for ns in &before_kill.done {
        let again = history
            .lock()
            .expect("history")
            .iter()
            .filter(|(at, n, r, _)| n == ns && *at > killed && *r != rev1)
            .count();
        assert_eq!(
            again, 0,
            "{ns} was handed another revision after the leader change"
        );
    }

    // A revision whose image never becomes available: halted at the canary, which goes back.
    let mut broken = good.clone();
    broken.admission.image = "quay.invalid/broken/admission:1".into();
    let rev2 = write(&paths, &broken);
    let halted = wait_phase(
        &mgmt,
        RolloutPhase::Halted,
        &rev1,
        None,
        Duration::from_secs(90),
    )
    .await;
    let st = halted.status.unwrap_or_default();
    assert!(
        st.message.contains("clusters-hc-1") && st.message.contains("not done within 40s"),
        "{}",
        st.message
    );
    assert_eq!(
        st.failed
            .iter()
            .map(|f| f.namespace.as_str())
            .collect::<Vec<_>>(),
        vec!["clusters-hc-1"]
    );
    wait_on(&mgmt, &nss[0], &rev1, Duration::from_secs(60)).await;
    let (_, body) = support::http_get(agents[0].2, "/metrics")
        .await
        .expect("metrics");
    assert!(body.contains("hcp_fleet_rollout_halted 1"), "{body}");
    assert!(
        agent_event(&mgmt, "RolloutHalted", "clusters-hc-1").await,
        "a RolloutHalted Event names the canary"
    );

    // A revision whose probe is never answered (its probe webhook's selector leaves the probe's
    // namespace out): NonCompliant on the canary, halted at once.
    let mut deaf = good.clone();
    for w in &mut deaf.webhooks {
        if w.name.starts_with("probe") {
            w.namespace_selector = Some(LabelSelector {
                match_labels: BTreeMap::from([(
                    "hcp-fleet-test/never".to_string(),
                    "true".to_string(),
                )]),
                ..Default::default()
            });
        }
    }
    let rev3 = write(&paths, &deaf);
    let st = wait_phase(
        &mgmt,
        RolloutPhase::Halted,
        &rev1,
        Some(&rev3),
        Duration::from_secs(90),
    )
    .await
    .status
    .unwrap_or_default();
    assert_eq!(
        st.stable.as_ref().map(|s| s.revision.as_str()),
        Some(rev1.as_str())
    );
    assert!(
        st.message
            .contains("clusters-hc-1: NonCompliant on the new revision"),
        "{}",
        st.message
    );
    wait_on(&mgmt, &nss[0], &rev1, Duration::from_secs(60)).await;
    // Neither bad revision ever reached the others, which stayed on rev1 and Compliant.
    for bad in [&rev2, &rev3] {
        let spans = intervals(&history, bad);
        assert_eq!(
            spans.keys().collect::<Vec<_>>(),
            vec!["clusters-hc-1"],
            "{bad}: {spans:?}"
        );
    }
    for ns in &nss[1..] {
        wait_on(&mgmt, ns, &rev1, Duration::from_secs(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_is_checked_pins_its_hcp_and_its_removal_rejoins_the_fleet() {
    let (fleet, mgmt, _pods) = support::fleet_with_pods(2).await;
    let mut cfg = config();
    cfg.rollout.canary_selector = LabelSelector::default();
    cfg.rollout.max_unavailable = MaxUnavailable::Percent("100%".into());
    let rev0 = Revision::of(&cfg).id;
    let (ns1, ns2) = (hcp_namespace("hc-1"), hcp_namespace("hc-2"));
    let overrides = Api::<HostedAdmissionOverride>::namespaced(mgmt.clone(), &ns2);
    let create = |spec: serde_json::Value| {
        let overrides = overrides.clone();
        async move {
            let o: HostedAdmissionOverride = serde_json::from_value(serde_json::json!({
                "apiVersion": "hcp-fleet.openshift.io/v1alpha1",
                "kind": "HostedAdmissionOverride",
                "metadata": {"name": "override"},
                "spec": spec,
            }))
            .expect("override");
            overrides.create(&PostParams::default(), &o).await
        }
    };
    // The API server refuses a malformed one: its schema everywhere, its CEL rules where run.
    let err = create(serde_json::json!({"revision": "not-a-hash"}))
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("spec.revision"), "{err}");
    if support::serves(
        &fleet.version,
        Feature::CrdCel,
        "the override CRD's CEL rules refused by the API server (the agent's own check is asserted below)",
    ) {
        let err = create(serde_json::json!({"guards": [{"name": "probe.hcp-fleet.openshift.io", "mode": "off"}]}))
            .await
            .expect_err("refused by CEL");
        assert!(
            err.to_string().contains("its mode cannot be overridden"),
            "{err}"
        );
    }

    // Pin hc-2 to the revision it will run, with a guard on warn and one more exempt user,
    // before the agent starts: the rollout has recorded no revision yet when the override is
    // first checked, and the revision the HCP runs counts as held all the same.
    create(serde_json::json!({
        "revision": rev0,
        "reason": "e2e: held back",
        "guards": [{"name": "scc.hcp-fleet.openshift.io", "mode": "warn"}],
        "exemptUsers": ["alice"],
    }))
    .await
    .expect("a good override");
    let agent = hcp_fleet_cli::agent::start(
        mgmt.clone(),
        cfg.clone(),
        hcp_fleet_cli::agent::StartOptions {
            agent_namespace: AGENT_NS.into(),
            endpoints: hcp_fleet_testbed::kubelet::endpoints(),
        },
    )
    .await
    .expect("agent");
    eventually("the override is accepted", Duration::from_secs(30), || {
        let overrides = overrides.clone();
        async move {
            let st = overrides
                .get("override")
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            if st.accepted.as_deref() == Some("True")
                && st.message.contains("scc.hcp-fleet.openshift.io warn")
            {
                Ok(())
            } else {
                Err(format!("{st:?}"))
            }
        }
    })
    .await;
    wait_on(&mgmt, &ns1, &rev0, Duration::from_secs(90)).await;
    wait_on(&mgmt, &ns2, &rev0, Duration::from_secs(90)).await;
    let next = with_mode(cfg.clone(), "featuregate", hcp_fleet_model::Mode::Warn);
    let rev1 = Revision::of(&next).id;
    agent.set_config(next);
    wait_on(&mgmt, &ns1, &rev1, Duration::from_secs(60)).await;
    wait_phase(
        &mgmt,
        RolloutPhase::Complete,
        &rev1,
        None,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        revision_of(&mgmt, &ns2).await.as_deref(),
        Some(rev0.as_str()),
        "the pinned HCP kept its revision"
    );
    let d = Api::<Deployment>::namespaced(mgmt.clone(), &ns2)
        .get("hcp-fleet-admission")
        .await
        .expect("deployment");
    assert_eq!(d.annotations().get(REVISION_ANNOTATION), Some(&rev0));

    // Removing the override returns hc-2 to the fleet's revision.
    overrides
        .delete("override", &DeleteParams::default())
        .await
        .expect("delete");
    wait_on(&mgmt, &ns2, &rev1, Duration::from_secs(60)).await;
    drop(fleet);
}

/// A tenant who makes their own cluster's probe fail (a webhook of theirs, failing closed, on
/// the probe's ConfigMaps) does not halt a rollout across the others: that HCP is excused
/// (an Event says why), keeps the new revision, and the rollout completes, with the default
/// threshold of one failure. The canary is the tenant's cluster, the worst place for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_failing_its_own_probe_does_not_halt_the_rollout() {
    use hcp_fleet_guards::catalogue::PROBE_LABEL;
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    let (fleet, mgmt, _pods) = support::fleet_with_pods(3).await;
    let nss: Vec<String> = ["hc-1", "hc-2", "hc-3"]
        .iter()
        .map(|n| hcp_namespace(n))
        .collect();
    label_canary(&mgmt, "hc-2").await;
    let mut cfg = config();
    cfg.probe_interval_seconds = 5;
    let agent = support::start_agent(&mgmt, cfg.clone()).await;
    let rev0 = Revision::of(&cfg).id;
    for ns in &nss {
        wait_on(&mgmt, ns, &rev0, Duration::from_secs(90)).await;
    }
    support::wait_compliant(&mgmt, &["hc-1", "hc-2", "hc-3"]).await;
    // hc-2's admins: every probe ConfigMap now fails at a webhook of theirs that answers nothing.
    // A mutating one: those run before any validating webhook, so the probe always fails at
    // it. A validating one would race the agent's own probe webhook (the API server returns
    // the first denial to come back), and the probe would pass whenever the agent's won.
    let hosted = fleet
        .hosted("hc-2")
        .expect("hc-2")
        .client()
        .await
        .expect("hc-2 client");
    let mwc: MutatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "tenant-breaks-the-probe"},
        "webhooks": [{
            "name": "breaker.tenant.example.com",
            "clientConfig": {"url": "https://127.0.0.1:1/nothing", "caBundle": "Zm9v"},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
            "objectSelector": {"matchExpressions": [{"key": PROBE_LABEL, "operator": "Exists"}]},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail",
            "timeoutSeconds": 1,
        }],
    }))
    .expect("configuration");
    Api::<MutatingWebhookConfiguration>::all(hosted)
        .create(&PostParams::default(), &mwc)
        .await
        .expect("the tenant's webhook");
    eventually("hc-2's probe fails", Duration::from_secs(30), || async {
        let h = support::health(&mgmt, &nss[1]).await?;
        let probe = h
            .status
            .iter()
            .flat_map(|s| s.concerns.iter())
            .find(|c| c.name == "e2e-probe")
            .and_then(|c| c.history.first())
            .map(|e| e.message.clone())
            .unwrap_or_default();
        if probe.starts_with("NonCompliant")
            && probe.contains(hcp_fleet_guards::probe::FOREIGN_ANSWER)
        {
            Ok(())
        } else {
            Err(probe)
        }
    })
    .await;
    // A new revision: the canary (hc-2) is excused, the others get it, the rollout completes.
    let next = with_mode(cfg.clone(), "featuregate", hcp_fleet_model::Mode::Warn);
    let rev1 = Revision::of(&next).id;
    agent.set_config(next);
    let done = wait_phase(
        &mgmt,
        RolloutPhase::Complete,
        &rev1,
        None,
        Duration::from_secs(120),
    )
    .await;
    for ns in &nss {
        assert_eq!(
            revision_of(&mgmt, ns).await.as_deref(),
            Some(rev1.as_str()),
            "{ns}"
        );
    }
    assert!(done.status.unwrap_or_default().failed.is_empty());
    // The Events follow the status write the phase was read from.
    eventually(
        "an Event says why hc-2 was not held against the revision",
        Duration::from_secs(60),
        || async {
            let events = agent_events(&mgmt).await;
            match event_of(&events, "RolloutNotHeldAgainst", "clusters-hc-2") {
                Some(_) => Ok(()),
                None => Err(format!(
                    "no such Event yet; the agent's: {:#?}",
                    events
                        .iter()
                        .map(|e| format!(
                            "{}: {}",
                            e.reason.as_deref().unwrap_or(""),
                            e.note.as_deref().unwrap_or("")
                        ))
                        .collect::<Vec<_>>()
                )),
            }
        },
    )
    .await;
}
