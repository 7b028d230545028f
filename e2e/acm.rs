//! Reporting to ACM on real API servers, with the suite playing ACM's framework addon step by
//! step (`support::acm`, one function per step of the addon's source): the management
//! cluster's summary row, and one row per hosted cluster where the addons run in hosted mode.
//! The agent writes no Policy of its own; what reaches the hub is what status-sync makes of
//! the agent's Events and template status.

// An e2e scenario reads as one story, set up, acted and checked in order: the 100-line and
// seven-argument limits hold the shipped code in src/ (clippy.toml).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)]

mod support;

use support::acm::{self, emit_template_error, hub_row, spec_sync, template_sync};
use support::{AGENT_NS, eventually, start_agent, template_rows, wait_compliant};

use std::time::Duration;

use hcp_fleet_agent::controller::acm::managed_clusters::{
    EXTERNAL_KUBECONFIG, MANAGED_CLUSTER_ANNOTATION,
};
use hcp_fleet_model::crd::{AdmissionHealthPolicy, ComplianceHistory, HostedCluster, Policy};
use hcp_fleet_render::config::AgentConfig;
use hcp_fleet_testbed::assets::Feature;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

/// Two hosted clusters with real admission services. The management cluster has ACM's current
/// Policy CRD where the asset script or `HCP_FLEET_UPSTREAM_CRDS` provided it (the test bed
/// installs it: `LocalFleet::policy_crd`), else the repository's.
async fn fleet_with_acm() -> (hcp_fleet_testbed::LocalFleet, Client, support::Pods) {
    support::fleet_with_pods(2).await
}

/// Waits until the hub's row for template `template` of Policy `policy` in `ns` says `want`
/// with `needle` in its newest entry; returns its history.
async fn hub_says(
    mgmt: &Client,
    ns: &str,
    policy: &str,
    template: &str,
    want: &str,
    needle: &str,
) -> Vec<ComplianceHistory> {
    eventually(
        &format!("the hub's row for {ns} says {want} ({needle})"),
        // A stopped server is seen within about 15 s (its keepalive); the rest is a loaded
        // machine's margin.
        Duration::from_secs(60),
        || async move {
            match hub_row(mgmt, ns, policy, template).await? {
                (c, h) if c == want && h.first().is_some_and(|e| e.message.contains(needle)) => {
                    Ok(())
                }
                (c, h) => Err(format!("{c} {:?}", h.first().map(|e| &e.message))),
            }
        },
    )
    .await;
    hub_row(mgmt, ns, policy, template)
        .await
        .map(|(_, h)| h)
        .expect("the hub's row")
}

/// The verdicts a row's history went through, newest first, each run of entries with the
/// same verdict (and any message) once.
fn verdicts(h: &[ComplianceHistory]) -> Vec<&str> {
    let mut v: Vec<&str> = h
        .iter()
        .map(|e| e.message.split(';').next().unwrap_or(""))
        .collect();
    v.dedup();
    v
}

/// Starts a stopped hosted kube-apiserver again.
async fn restart(fleet: &mut hcp_fleet_testbed::LocalFleet, name: &str) {
    fleet
        .hosted_mut(name)
        .expect("hosted cluster")
        .start()
        .await
        .expect("restarts");
}

/// Status-sync's reading of the Event reasons: `(?i)^policy:\s*(?:([a-z0-9.-]+)\s*\/)?(.+)`.
#[test]
fn reasons_read_as_status_sync_reads_them() {
    use acm::reason_template;
    assert_eq!(reason_template("policy: ns/tmpl"), Some("tmpl"));
    // The space after the slash stays in the name, as in ACM: such a reason names no template.
    assert_eq!(reason_template("Policy:ns / tmpl"), Some(" tmpl"));
    assert_eq!(reason_template("policy: tmpl"), Some("tmpl"));
    assert_eq!(reason_template("policy: klusterlet-a.b/t-1"), Some("t-1"));
    assert_eq!(reason_template("policy: ns/"), Some("ns/"));
    assert_eq!(reason_template("compliance: ns/tmpl"), None);
    assert_eq!(reason_template("policy:"), None);
}

/// The management cluster's row: the fleet Policy of `policies/` replicated into the cluster's
/// namespace, its template synced, the agent's summary read back through status-sync. Along
/// the way: a Policy saying `Enforce` and `High` (D4); template-sync's error, then silence
/// (D2); a broken hosted cluster and its recovery; Events expired, the template's history
/// keeping what they said (D6); the hub Policy deleted and created again (D1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acm_reads_the_fleet_verdict_from_events_on_the_replicated_policy() {
    let (mut fleet, mgmt, _pods) = fleet_with_acm().await;
    // The labelled-CRD cache: template-sync syncs the agent's kind.
    assert!(
        acm::template_kinds(&mgmt)
            .await
            .contains(&"AdmissionHealthPolicy".to_string())
    );
    // What an earlier release wrote outside ACM's flow: removed when the agent starts.
    for (ns, name) in [
        ("clusters-hc-1", "hcp-fleet-admission"),
        (AGENT_NS, "hcp-fleet-rollup"),
    ] {
        let legacy: Policy = serde_json::from_value(serde_json::json!({
            "apiVersion": "policy.open-cluster-management.io/v1", "kind": "Policy",
            "metadata": {"name": name, "namespace": ns,
                "labels": {"app.kubernetes.io/managed-by": "hcp-fleet-agent"}},
            "spec": {"disabled": false, "policy-templates": []},
        }))
        .expect("legacy Policy");
        Api::<Policy>::namespaced(mgmt.clone(), ns)
            .create(&Default::default(), &legacy)
            .await
            .expect("create legacy Policy");
    }
    let _agent = start_agent(&mgmt, AgentConfig::default()).await;
    wait_compliant(&mgmt, &["hc-1", "hc-2"]).await;

    let cluster_ns = "local-cluster";
    let docs = acm::hub_objects();
    let (root, root_name) = acm::root_policy(&docs, "hcp-fleet-agent");
    let replica = spec_sync(&mgmt, &root, &root_name, cluster_ns, cluster_ns).await;
    let uid = replica.uid().expect("uid");
    assert_eq!(
        replica.spec.policy_templates[1].object_definition["kind"],
        "AdmissionHealthPolicy"
    );
    // The Policy leaves each template its own remediationAction (ACM would copy a Policy-level
    // one onto the agent's report-only template).
    assert!(
        root["spec"].get("remediationAction").is_none(),
        "{}",
        root["spec"]
    );
    assert_eq!(
        replica.spec.policy_templates[1].object_definition["spec"]["remediationAction"],
        "inform"
    );
    // Strict field validation, as template-sync creates: a field the CRD does not have is
    // refused, not dropped.
    let strict = support::serves(
        &fleet.version,
        Feature::CrdCel,
        "template-sync's strict field validation",
    );
    if strict {
        let refused = template_sync(&mgmt, &replica, 1, true, |t| {
            t["metadata"]["name"] = "with-a-stray-field".into();
            t["spec"]["remediationActionn"] = "inform".into();
        })
        .await;
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains("remediationActionn")),
            "{refused:?}"
        );
    }
    // A Policy written by hand may say `Enforce` and `High`, in ACM's capitalised forms, which
    // its CRDs take: so does the template's (D4).
    let enforce_high = |t: &mut serde_json::Value| {
        t["spec"]["remediationAction"] = "Enforce".into();
        t["spec"]["severity"] = "High".into();
    };
    let template = template_sync(&mgmt, &replica, 1, strict, enforce_high)
        .await
        .expect("a template saying Enforce and High");
    let template_name = template.name_any();
    let row = |want: &'static str, needle: &'static str| {
        hub_says(&mgmt, cluster_ns, &root_name, &template_name, want, needle)
    };
    let history = row("Compliant", "2 of 2 hosted cluster(s) compliant").await;
    assert!(
        history[0].message.starts_with("Compliant; notification - "),
        "{history:?}"
    );

    // Template-sync reports an error on the template, then recovers without a word: it never
    // reports a third-party kind as recovered. Its error is the hub's newest entry until the
    // agent, seeing that in the Policy's status, says its verdict again (D2).
    emit_template_error(
        &mgmt,
        &replica,
        &template_name,
        "Failed to create the template: the server is busy",
    )
    .await;
    let history = row("Compliant", "2 of 2 hosted cluster(s) compliant").await;
    assert!(
        history.iter().any(|h| h.message.contains("template-error")),
        "the error stays in the history, below the verdict said again: {history:?}"
    );

    // hc-2's kube-apiserver goes away: the summary names it, newest first, the old one kept.
    fleet.hosted_mut("hc-2").expect("hc-2").stop();
    let history = row(
        "NonCompliant",
        "HCP clusters-hc-2/hc-2 NonCompliant: hosted-webhooks",
    )
    .await;
    assert!(
        history[0]
            .message
            .starts_with("NonCompliant; violation - 1 non-compliant"),
        "{history:?}"
    );
    assert!(
        history
            .iter()
            .any(|h| h.message.starts_with("Compliant; notification - 2 of 2")),
        "{history:?}"
    );
    // The summary's related objects: the worst only.
    let (state, _, related) = template_rows(&mgmt, cluster_ns, &template_name)
        .await
        .expect("rows");
    assert_eq!(
        (state.as_str(), related.as_slice()),
        ("NonCompliant", &["clusters-hc-2".to_string()][..])
    );

    // Events expire (an hour, by default) or are lost; the template's own history keeps what
    // they said, each entry named after its Event so status-sync counts them once (D6). The
    // Policy's status is reset first, so only the Events and the template speak.
    let policies: Api<Policy> = Api::namespaced(mgmt.clone(), cluster_ns);
    let names = |h: &[ComplianceHistory]| {
        h.iter()
            .filter(|e| !e.message.contains("template-error"))
            .map(|e| (e.event_name.clone(), e.message.clone()))
            .collect::<Vec<_>>()
    };
    let with_events = names(&history);
    let events = Api::<Event>::namespaced(mgmt.clone(), cluster_ns);
    for e in events
        .list(&Default::default())
        .await
        .expect("events")
        .items
    {
        events
            .delete(&e.name_any(), &Default::default())
            .await
            .expect("expire the event");
    }
    policies
        .patch_status(
            &root_name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"details": null, "compliant": null}})),
        )
        .await
        .expect("reset the status");
    let (_, from_template) = hub_row(&mgmt, cluster_ns, &root_name, &template_name)
        .await
        .expect("status sync");
    assert_eq!(
        names(&from_template),
        with_events,
        "the template's history says what the Events said, once each"
    );

    // hc-2 back: the summary says so.
    restart(&mut fleet, "hc-2").await;
    row("Compliant", "2 of 2 hosted cluster(s) compliant").await;

    // The hub Policy deleted and created again (D1): the replica and its template come back
    // with the same names and new UIDs, and the verdict is reported to the new ones at once,
    // though it has not changed.
    policies
        .delete(&root_name, &Default::default())
        .await
        .expect("delete the replica");
    let templates = Api::<AdmissionHealthPolicy>::namespaced(mgmt.clone(), cluster_ns);
    templates
        .delete(&template_name, &Default::default())
        .await
        .expect("delete the template");
    eventually("the old template gone", Duration::from_secs(10), || async {
        match templates.get_opt(&template_name).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let again = spec_sync(&mgmt, &root, &root_name, cluster_ns, cluster_ns).await;
    assert_ne!(again.uid().expect("uid"), uid);
    template_sync(&mgmt, &again, 1, strict, enforce_high)
        .await
        .expect("the template again");
    let history = row("Compliant", "2 of 2 hosted cluster(s) compliant").await;
    assert_eq!(history.len(), 1, "a new Policy's first entry: {history:?}");
    // No Policy but ACM's own replica: the agent writes none, and removed the old ones.
    let all = Api::<Policy>::all(mgmt.clone())
        .list(&Default::default())
        .await
        .expect("list");
    assert_eq!(
        all.items.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        [root_name]
    );
}

/// A klusterlet kubeconfig whose server is the kube-apiserver Service of `hcp_ns`.
async fn put_klusterlet_kubeconfig(mgmt: &Client, cluster: &str, hcp_ns: &str) {
    let ns = format!("klusterlet-{cluster}");
    hcp_fleet_testbed::fixtures::ensure_namespace(mgmt, &ns, Default::default())
        .await
        .expect("the klusterlet's namespace");
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://kube-apiserver.{hcp_ns}.svc:6443\n    certificate-authority-data: Zm9v\nusers:\n- name: u\n  user:\n    token: not-a-real-token\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
    );
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": EXTERNAL_KUBECONFIG, "namespace": ns},
        "stringData": {"kubeconfig": yaml},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(mgmt.clone(), &ns)
        .patch(
            EXTERNAL_KUBECONFIG,
            &PatchParams::apply("acm-test").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("the klusterlet's kubeconfig");
}

/// Hosted-mode addons: ACM's framework addon for managed cluster X runs on the management
/// cluster in `klusterlet-X`; spec-sync copies the hosted clusters' Policy there and
/// template-sync creates the agent's template labelled with X. X is matched to one HCP by
/// the HostedCluster's managed-cluster annotation, its name, or ACM's discovery name
/// (`<prefix>-<name>`), and the klusterlet's own kubeconfig must agree. Each row says its
/// hosted cluster's verdict and only that; breaking one hosted cluster turns only its row
/// NonCompliant, and back. A name that maps to no HCP, or a mapping the klusterlet's kubeconfig
/// contradicts, is NonCompliant saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hosted_cluster_is_its_own_row_with_hosted_mode_addons() {
    let (mut fleet, mgmt, _pods) = fleet_with_acm().await;
    // hc-1 was imported as prod-hc-1 (the annotation ACM sets); hc-2 was discovered, with
    // this management cluster's discovery prefix.
    Api::<HostedCluster>::namespaced(mgmt.clone(), "clusters")
        .patch(
            "hc-1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                MANAGED_CLUSTER_ANNOTATION: "prod-hc-1"}}})),
        )
        .await
        .expect("annotate hc-1");
    let mut cfg = AgentConfig::default();
    cfg.reporting.discovery_prefix = "mgmt".into();
    let _agent = start_agent(&mgmt, cfg).await;
    wait_compliant(&mgmt, &["hc-1", "hc-2"]).await;
    put_klusterlet_kubeconfig(&mgmt, "mgmt-hc-2", "clusters-hc-2").await;

    let docs = acm::hub_objects();
    let (root, root_name) = acm::root_policy(&docs, "hcp-fleet-agent-hosted-clusters");
    let template_name = hcp_fleet_cli::packaging::HOSTED_CLUSTER_TEMPLATE_NAME;
    // One replica and one template per managed cluster, in its klusterlet namespace. "hc-1"
    // is not a managed cluster here (hc-1 is prod-hc-1), nor is "hc-9".
    for x in ["prod-hc-1", "mgmt-hc-2", "hc-1", "hc-9"] {
        let ns = format!("klusterlet-{x}");
        let replica = spec_sync(&mgmt, &root, &root_name, &ns, x).await;
        let t = template_sync(&mgmt, &replica, 0, false, |_| {})
            .await
            .expect("template");
        assert_eq!(t.name_any(), template_name);
        assert_eq!(
            t.labels().get(acm::CLUSTER_NAME).map(String::as_str),
            Some(x)
        );
    }
    let row = |x: &'static str, want: &'static str, needle: &'static str| {
        let ns = format!("klusterlet-{x}");
        let (mgmt, root_name) = (mgmt.clone(), root_name.clone());
        async move { hub_says(&mgmt, &ns, &root_name, template_name, want, needle).await }
    };
    row(
        "prod-hc-1",
        "Compliant",
        "prod-hc-1 (HCP clusters-hc-1/hc-1): the admission guards",
    )
    .await;
    row(
        "mgmt-hc-2",
        "Compliant",
        "mgmt-hc-2 (HCP clusters-hc-2/hc-2): the admission guards",
    )
    .await;
    row(
        "hc-1",
        "NonCompliant",
        "no HostedCluster on this management cluster is managed cluster hc-1",
    )
    .await;
    row(
        "hc-9",
        "NonCompliant",
        "no HostedCluster on this management cluster is managed cluster hc-9",
    )
    .await;
    // Each template holds its own hosted cluster only.
    for (x, ns) in [
        ("prod-hc-1", "clusters-hc-1"),
        ("mgmt-hc-2", "clusters-hc-2"),
    ] {
        let (_, _, related) = template_rows(&mgmt, &format!("klusterlet-{x}"), template_name)
            .await
            .expect("rows");
        assert_eq!(related, [ns]);
    }

    // The management cluster's own (fleet) row, beside them.
    let (fleet_root, fleet_root_name) = acm::root_policy(&docs, "hcp-fleet-agent");
    let local = "local-cluster";
    let fleet_replica = spec_sync(&mgmt, &fleet_root, &fleet_root_name, local, local).await;
    let fleet_template = template_sync(&mgmt, &fleet_replica, 1, false, |_| {})
        .await
        .expect("the fleet template")
        .name_any();

    // hc-2's kube-apiserver goes away: only its row turns NonCompliant, and says why; then
    // it comes back. The fleet's row names it as its own row does: the managed cluster and
    // the HCP.
    fleet.hosted_mut("hc-2").expect("hc-2").stop();
    row(
        "mgmt-hc-2",
        "NonCompliant",
        "mgmt-hc-2 (HCP clusters-hc-2/hc-2) NonCompliant",
    )
    .await;
    hub_says(
        &mgmt,
        local,
        &fleet_root_name,
        &fleet_template,
        "NonCompliant",
        "mgmt-hc-2 (HCP clusters-hc-2/hc-2) NonCompliant",
    )
    .await;
    let (c, h) = hub_row(&mgmt, "klusterlet-prod-hc-1", &root_name, template_name)
        .await
        .expect("prod-hc-1's row");
    assert_eq!(
        (c.as_str(), verdicts(&h)),
        ("Compliant", vec!["Compliant"]),
        "prod-hc-1's row is untouched: {h:?}"
    );
    restart(&mut fleet, "hc-2").await;
    let h = row(
        "mgmt-hc-2",
        "Compliant",
        "mgmt-hc-2 (HCP clusters-hc-2/hc-2): the admission guards",
    )
    .await;
    // The verdicts, not the entries: while the server is down the reason may change (no
    // answer within the timeout, then the connection refused), each its own entry.
    assert_eq!(
        verdicts(&h),
        ["Compliant", "NonCompliant", "Compliant"],
        "{h:?}"
    );

    // The klusterlet of prod-hc-1 reaches hc-2's kube-apiserver: the mapping is contradicted,
    // and the row says so until they agree again.
    put_klusterlet_kubeconfig(&mgmt, "prod-hc-1", "clusters-hc-2").await;
    row(
        "prod-hc-1",
        "NonCompliant",
        "reaches the kube-apiserver in clusters-hc-2",
    )
    .await;
    put_klusterlet_kubeconfig(&mgmt, "prod-hc-1", "clusters-hc-1").await;
    row(
        "prod-hc-1",
        "Compliant",
        "prod-hc-1 (HCP clusters-hc-1/hc-1): the admission guards",
    )
    .await;
}
