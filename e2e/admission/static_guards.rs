//! The static guards (docs/static-guards.md): loaded by the hosted kube-apiserver from files the
//! agent writes into a ConfigMap of the HCP namespace, which the test bed mounts as a kubelet
//! would (`localcp::static_volumes`), on 1.36 with the feature gate on.

use super::*;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ListParams;

const RBAC: &str = "protected-rbac.hcp-fleet.openshift.io";

fn static_name(guard: &str) -> String {
    format!("{guard}{}", hcp_fleet_render::hosted::static_guards::SUFFIX)
}

/// Whether protected RBAC has its API-side policy, and whether hc-1's ConfigMap of static
/// guards exists.
async fn paths(bed: &Bed, hosted: &Client) -> Result<(bool, bool), String> {
    let policy = Api::<ValidatingAdmissionPolicy>::all(hosted.clone())
        .get_opt(RBAC)
        .await
        .map_err(|e| e.to_string())?
        .is_some();
    let files = Api::<ConfigMap>::namespaced(bed.mgmt.clone(), NS)
        .get_opt(hcp_fleet_render::hosted::static_guards::CONFIG_MAP)
        .await
        .map_err(|e| e.to_string())?
        .is_some();
    Ok((policy, files))
}

/// Waits (60 s at most) until `paths` says `want`.
async fn wait_paths(bed: &Bed, hosted: &Client, want: (bool, bool), what: &str) {
    eventually(what, Duration::from_secs(60), || {
        let p = paths(bed, hosted);
        async move {
            match p.await? {
                now if now == want => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
}

/// Waits (30 s at most) until hc-1's static guards' ConfigMap holds `rendered` again.
async fn configmap_back(
    cms: &Api<ConfigMap>,
    rendered: &Option<std::collections::BTreeMap<String, String>>,
    what: &str,
) {
    let name = hcp_fleet_render::hosted::static_guards::CONFIG_MAP;
    eventually(what, Duration::from_secs(30), || async move {
        match cms.get_opt(name).await {
            Ok(Some(cm)) if &cm.data == rendered => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// Waits (30 s at most) until alice's delete of cluster-admin is denied again.
async fn alice_denied_again(bed: &Bed, what: &str) {
    eventually(what, Duration::from_secs(30), || {
        let r = kubectl(bed, DELETE_AS_ALICE);
        async move {
            match r {
                (false, out) if out.contains(PROTECTED) => Ok(()),
                (_, out) => Err(out),
            }
        }
    })
    .await;
}

/// How many guards the agent reports on `engine` for hc-1 (`hcp_fleet_guards`).
fn guards_on(bed: &Bed, engine: &str) -> f64 {
    let text = bed.agent.context.metrics.encode();
    let hc1 = support::sum_by_label(
        &text
            .lines()
            .filter(|l| l.contains(&format!("hcp_namespace=\"{NS}\"")))
            .collect::<Vec<_>>()
            .join("\n"),
        "hcp_fleet_guards",
        "engine",
    );
    hc1.get(engine).copied().unwrap_or(0.0)
}

/// The guards hc-1's static guards' ConfigMap carries, validating and mutating.
async fn carried_by_files(bed: &Bed) -> std::collections::BTreeSet<String> {
    let cm = Api::<ConfigMap>::namespaced(bed.mgmt.clone(), NS)
        .get(hcp_fleet_render::hosted::static_guards::CONFIG_MAP)
        .await
        .expect("the static guards' ConfigMap");
    hcp_fleet_render::hosted::static_guards::guards_in(&cm).expect("the agent's files")
}

/// The path hc-1's record gives each guard.
async fn recorded_paths(bed: &Bed) -> std::collections::BTreeMap<String, String> {
    Api::<hcp_fleet_model::crd::AdmissionHealth>::namespaced(bed.mgmt.clone(), NS)
        .list(&ListParams::default())
        .await
        .expect("records")
        .items
        .into_iter()
        .flat_map(|r| r.status.map(|s| s.guards).unwrap_or_default())
        .map(|g| (g.name, g.path))
        .collect()
}

/// `with_engine(engine)` with the Service tag kept on its webhook: an admission service that
/// some guard needs, to be stopped while the static guards hold (on 1.36 every other guard
/// runs inside the hosted kube-apiserver, and the HCP would have none).
fn with_service(engine: GuardEngine) -> AgentConfig {
    let mut cfg = with_engine(engine);
    for w in &mut cfg.webhooks {
        if w.path == hcp_fleet_guards::service_tags::ROW.path {
            w.engine = GuardEngine::Webhook;
        }
    }
    cfg
}

/// Under 50 guarded requests a second, the guards move from API-side policies to the static
/// guards (written, proven in force by their probe, then the policies deleted) and later back
/// (the policies written and proven, then the files emptied): no request is let through.
/// Meanwhile a hosted cluster's most privileged admin can do nothing to them through the API:
/// creating one of their names is refused, deleting, patching or listing finds nothing, and
/// 30 s of deleting everything there is lets no guarded request through. A changed mode is in
/// force as soon as the test bed's kubelet has written the file (the figures are printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_guards_hold_against_every_api_request_and_switch_without_a_gap() {
    let assets = support::assets_or_skip_reason().expect("test bed assets");
    if !support::serves(
        &assets.version,
        Feature::StaticManifests,
        "the static guards' switch, API refusals and sustained deletions",
    ) {
        return;
    }
    let _turn = LOAD_TURN.lock().await;
    let bed = bed(with_service(GuardEngine::Policy)).await;
    let hosted = hc1_admin(&bed).await;
    assert_eq!(paths(&bed, &hosted).await, Ok((true, false)));

    // API-side policies to the static guards, under load.
    let load = GuardLoad::start(alice(&bed).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let asked = Instant::now();
    bed.set_config(with_service(GuardEngine::Static));
    wait_paths(
        &bed,
        &hosted,
        (false, true),
        "the guards moved to the static guards",
    )
    .await;
    let moved = asked.elapsed();
    // Every guard with a CEL form, and the Service annotation (a mutation in warn mode, which
    // warns from the validating file), is loaded from files; none is left on a policy.
    let carried = carried_by_files(&bed).await;
    let with_cel = AgentConfig::default()
        .webhooks
        .iter()
        .filter(|w| has_cel_form(&w.path))
        .count();
    assert!(
        carried.len() > with_cel
            && carried.contains(hcp_fleet_guards::service_annotation::ROW.name),
        "{carried:?}"
    );
    assert_eq!(guards_on(&bed, "static"), carried.len() as f64);
    assert_eq!(guards_on(&bed, "policy"), 0.0);

    // Nothing a hosted cluster's admin sends through the API reaches them.
    let policies = Api::<ValidatingAdmissionPolicy>::all(hosted.clone());
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(hosted.clone());
    let forged: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "metadata": {"name": static_name(RBAC)},
        "spec": {
            "matchConstraints": {"resourceRules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}]},
            "validations": [{"expression": "true"}],
        },
    }))
    .expect("policy");
    match policies.create(&PostParams::default(), &forged).await {
        Err(kube::Error::Api(s)) => assert!(
            s.code == 422
                && s.message
                    .contains("are reserved for static manifest-based configurations"),
            "{s:?}"
        ),
        other => panic!("a policy of the reserved name was not refused: {other:?}"),
    }
    for guard in [RBAC, "scc.hcp-fleet.openshift.io"] {
        let name = static_name(guard);
        let gone =
            |r: Result<_, kube::Error>| matches!(r, Err(kube::Error::Api(s)) if s.code == 404);
        assert!(gone(
            policies
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ())
        ));
        assert!(gone(
            bindings
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ())
        ));
        let patch = serde_json::json!({"spec": {"validationActions": ["Audit"]}});
        assert!(gone(
            bindings
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
        ));
    }
    let listed = policies.list(&ListParams::default()).await.expect("list");
    assert!(
        listed.items.iter().all(|p| !p
            .metadata
            .name
            .as_deref()
            .unwrap_or("")
            .ends_with(".static.k8s.io")),
        "no static guard is listed through the API"
    );

    // 30 s of deleting every policy and binding there is, by collection and by the static
    // names, as fast as the server answers.
    let until = Instant::now() + Duration::from_secs(30);
    let mut deletes = 0u32;
    while Instant::now() < until {
        let dp = DeleteParams::default();
        let _ = policies
            .delete_collection(&dp, &ListParams::default())
            .await;
        let _ = bindings
            .delete_collection(&dp, &ListParams::default())
            .await;
        for guard in [RBAC, "probe.hcp-fleet.openshift.io"] {
            let _ = policies.delete(&static_name(guard), &dp).await;
            let _ = bindings.delete(&static_name(guard), &dp).await;
        }
        deletes += 6;
    }
    let counts = load.stop().await;
    eprintln!(
        "static guards: moved from policies in {moved:?}; then {deletes} deletions in 30 s; load {counts:?}"
    );
    assert_nothing_let_through(&counts, 1_000);
    assert!(
        counts.by_static > 0,
        "the static guards answered: {counts:?}"
    );

    // The ConfigMap is the agent's whole: an edit (under the agent's own field manager name
    // too) and a deletion are put back and counted.
    let cms = Api::<ConfigMap>::namespaced(bed.mgmt.clone(), NS);
    let cm_name = hcp_fleet_render::hosted::static_guards::CONFIG_MAP;
    let rendered = cms.get(cm_name).await.expect("configmap").data;
    let counted = || {
        support::drift_count(
            &bed.agent,
            "hcp_fleet_management_drift_total",
            NS,
            "hc-1",
            "ConfigMap",
        )
    };
    let before = counted();
    let edit = serde_json::json!({"data": {"policies.yaml": "", "extra.yaml": "x"}});
    cms.patch(
        cm_name,
        &PatchParams {
            field_manager: Some("hcp-fleet-agent".into()),
            ..Default::default()
        },
        &Patch::Merge(&edit),
    )
    .await
    .expect("edit");
    configmap_back(&cms, &rendered, "the edit undone").await;
    cms.delete(cm_name, &DeleteParams::default())
        .await
        .expect("delete");
    configmap_back(&cms, &rendered, "the deletion undone").await;
    // Counted once each (the count may follow the repair it counts by a moment).
    eventually("both repairs counted", Duration::from_secs(10), || async {
        let now = counted();
        (now >= before + 2.0)
            .then_some(())
            .ok_or_else(|| format!("{before} -> {now}"))
    })
    .await;
    // Denied throughout: while the files were gone the API-side policies stood in, and they
    // stay until the static guards are proven in force again (a reload of the restored files).
    eventually(
        "the static guard answering again",
        Duration::from_secs(60),
        || {
            let r = kubectl(&bed, DELETE_AS_ALICE);
            async move {
                match r {
                    (true, out) => panic!("let through while the files came back: {out}"),
                    (false, out) if out.contains(&static_name(RBAC)) => Ok(()),
                    (false, out) => Err(out),
                }
            }
        },
    )
    .await;

    // With the admission service stopped (the webhook guards fail open), the static guards
    // keep denying, and their files are still put back: they are written beside the admission
    // service's objects, not after its gate.
    let pids = webhook_pids(bed.pods.path());
    signal_all(&pids, libc::SIGSTOP);
    service_reported_down(&bed).await;
    cms.delete(cm_name, &DeleteParams::default())
        .await
        .expect("delete");
    configmap_back(
        &cms,
        &rendered,
        "the deletion undone while the service is down",
    )
    .await;
    // Denied throughout, the service still stopped: by the API-side policy that stands in
    // while the server has not yet reloaded the restored files (how long the files were gone
    // for it depends on the volume's sync and the server's reload), then by the static guard.
    let stood_in = std::cell::Cell::new(0);
    eventually(
        "the static guard denying with the admission service stopped",
        Duration::from_secs(60),
        || {
            let r = kubectl(&bed, DELETE_AS_ALICE);
            let stood_in = &stood_in;
            async move {
                match r {
                    (true, out) => panic!("let through with the service stopped: {out}"),
                    (false, out) if out.contains(&static_name(RBAC)) => Ok(()),
                    (false, out) => {
                        stood_in.set(stood_in.get() + 1);
                        Err(out)
                    }
                }
            }
        },
    )
    .await;
    signal_all(&pids, libc::SIGCONT);
    eprintln!(
        "[static guards] service stopped: {} answers by the API-side stand-in before the static guard's",
        stood_in.get()
    );
    wait_concern(&bed.mgmt, "admission-service", "Compliant").await;

    // A changed mode: in force once the agent has written the file and the server reloaded it.
    let asked = Instant::now();
    bed.agent
        .set_config(with_mode(with_service(GuardEngine::Static), Mode::Warn));
    let warned = format!(
        "Warning: Validation failed for ValidatingAdmissionPolicy '{0}' with binding '{0}': {RBAC} (warn mode) would deny: {PROTECTED}",
        static_name(RBAC)
    );
    eventually("warn mode in force", Duration::from_secs(30), || {
        let r = kubectl(&bed, DELETE_AS_ALICE);
        let want = warned.clone();
        async move {
            match r {
                (true, out) if out.contains(&want) => Ok(()),
                (_, out) => Err(out),
            }
        }
    })
    .await;
    eprintln!(
        "static guards: warn mode in force {:?} after the configuration changed",
        asked.elapsed()
    );
    bed.set_config(with_service(GuardEngine::Static));
    alice_denied_again(&bed, "enforce again").await;

    // A changed exemption (alice exempt), the same way.
    let asked = Instant::now();
    let mut exempt = with_service(GuardEngine::Static);
    exempt.admission.exempt_users.push("alice".into());
    bed.set_config(exempt);
    eventually("alice exempt", Duration::from_secs(30), || {
        let r = kubectl(&bed, DELETE_AS_ALICE);
        async move {
            match r {
                (true, out) if !out.contains("Warning") => Ok(()),
                (_, out) => Err(out),
            }
        }
    })
    .await;
    eprintln!(
        "static guards: an exemption in force {:?} after the configuration changed",
        asked.elapsed()
    );
    bed.set_config(with_service(GuardEngine::Static));
    alice_denied_again(&bed, "alice guarded again").await;

    // And back to the API-side policies, under load: the files go only after the policies
    // are proven.
    let load = GuardLoad::start(alice(&bed).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    bed.set_config(with_service(GuardEngine::Policy));
    wait_paths(
        &bed,
        &hosted,
        (true, false),
        "the guards back on API-side policies",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counts = load.stop().await;
    eprintln!("static guards: back to policies; load {counts:?}");
    assert_nothing_let_through(&counts, 300);
    assert!(
        counts.by_static > 0 && counts.by_static < counts.denied,
        "both answered during the move: {counts:?}"
    );
    wait_concern(&bed.mgmt, "hosted-webhooks", "Compliant").await;
}

/// A hosted cluster's admin who creates, through the API, a policy under the static probe's
/// reserved name that answers the static probe in its words (on a server without the feature
/// gate the API accepts the name, with a warning): the agent does not take it for the files,
/// keeps every guard on its API-side policy, and says so; with the gate on (1.36 test bed) the
/// API refuses the name, and nothing needs saying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_static_probe_keeps_the_api_side_guards() {
    let assets = support::assets_or_skip_reason().expect("test bed assets");
    if !support::serves(
        &assets.version,
        Feature::AdmissionPolicies,
        "a forged static probe (no admission policies to forge it with)",
    ) {
        return;
    }
    let bed = bed(with_engine(GuardEngine::Static)).await;
    let hosted = hc1_admin(&bed).await;
    let cms = Api::<ConfigMap>::namespaced(bed.mgmt.clone(), NS);
    let cm_name = hcp_fleet_render::hosted::static_guards::CONFIG_MAP;
    // A tenant who knows the configuration computes the revision; the test reads it.
    let revision_of = |cm: Option<ConfigMap>| {
        cm.and_then(|cm| cm.metadata.annotations).and_then(|a| {
            a.get(hcp_fleet_render::hosted::static_guards::REVISION_ANNOTATION)
                .cloned()
        })
    };
    eventually(
        "the static guards' ConfigMap",
        Duration::from_secs(30),
        || {
            let cms = cms.clone();
            async move {
                match cms.get_opt(cm_name).await {
                    Ok(cm) if revision_of(cm.clone()).is_some() => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;
    let revision = revision_of(cms.get_opt(cm_name).await.expect("read")).expect("revision");
    let probe = hcp_fleet_render::hosted::static_guards::probe_name();
    let forged: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "metadata": {"name": probe},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
                // The labels the agent's probe requests carry, as a tenant's webhook sees them.
                "objectSelector": {"matchLabels": {
                    hcp_fleet_guards::catalogue::PROBE_LABEL: "policy",
                    "hcp-fleet.openshift.io/probe-revision": revision,
                }},
            },
            "validations": [{"expression": "false", "message": hcp_fleet_guards::catalogue::POLICY_PROBE_ANSWER, "reason": "Forbidden"}],
        },
    }))
    .expect("policy");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": probe},
        "spec": {"policyName": probe, "validationActions": ["Deny"]},
    }))
    .expect("binding");
    let policies = Api::<ValidatingAdmissionPolicy>::all(hosted.clone());
    let created = policies.create(&PostParams::default(), &forged).await;
    if bed.fleet.version.serves(Feature::StaticManifests) {
        match created {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 422, "{s:?}"),
            other => panic!("the reserved name was not refused: {other:?}"),
        }
        return;
    }
    created.expect("the API accepts the reserved name without the feature gate");
    Api::<ValidatingAdmissionPolicyBinding>::all(hosted.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    eventually(
        "the forgery named in the record",
        Duration::from_secs(60),
        || async {
            match newest(&bed.mgmt, "hosted-webhooks").await {
                (Some(c), m) if c == "NonCompliant" && m.contains("exists through the API") => {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    // Every guard is still on its API-side policy, and denies.
    assert!(!support::absent(&policies, RBAC).await);
    assert_eq!(guards_on(&bed, "static"), 0.0);
    let (ok, out) = kubectl(&bed, DELETE_AS_ALICE);
    assert!(
        !ok && out.contains(&format!("ValidatingAdmissionPolicy '{RBAC}'")),
        "{out}"
    );
}

/// HyperShift's kube-apiserver mounting the static guards' ConfigMap (as docs/static-guards.md
/// asks of it) offers the files to engine `auto`: with the default configuration every guard
/// with a CEL form and both Service mutations move from the hosted cluster's API into the
/// files once proven in force, and back to the API when the mount goes, each way under 50
/// guarded requests a second with none let through. The record's paths say which; auto asked
/// for nothing it did not get, so neither move is a finding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_takes_the_files_the_kube_apiserver_mounts_and_leaves_them_without_a_gap() {
    use hcp_fleet_guards::service_tags::{ROW as TAGS, TAGS_ANNOTATION};
    let assets = support::assets_or_skip_reason().expect("test bed assets");
    if !support::serves(
        &assets.version,
        Feature::StaticManifests,
        "engine auto taking the static guards where the kube-apiserver mounts them",
    ) {
        return;
    }
    let _turn = LOAD_TURN.lock().await;
    let bed = bed(AgentConfig::default()).await;
    let hosted = hc1_admin(&bed).await;
    let mount = "/etc/kubernetes/hcp-fleet-guards";
    // HyperShift's Deployment as today: no such mount, so nothing is offered.
    hcp_fleet_testbed::fixtures::put_kube_apiserver(&bed.mgmt, "hc-1", mount, false)
        .await
        .expect("kube-apiserver Deployment");
    wait_concern(&bed.mgmt, "hosted-webhooks", "Compliant").await;
    assert_eq!(paths(&bed, &hosted).await, Ok((true, false)));
    assert_eq!(
        recorded_paths(&bed).await.get(RBAC).map(String::as_str),
        Some("policy")
    );

    // Mounted: into the files, under load.
    let load = GuardLoad::start(alice(&bed).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let asked = Instant::now();
    hcp_fleet_testbed::fixtures::put_kube_apiserver(&bed.mgmt, "hc-1", mount, true)
        .await
        .expect("mount");
    wait_paths(
        &bed,
        &hosted,
        (false, true),
        "auto moved the guards into the files",
    )
    .await;
    let moved = asked.elapsed();
    eventually(
        "the Service tag's API-side policy gives way to its file",
        Duration::from_secs(60),
        || async {
            match support::mutating_policy_exists(&hosted, TAGS.name).await {
                Ok(false) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counts = load.stop().await;
    eprintln!("auto: into the files in {moved:?}; load {counts:?}");
    assert_nothing_let_through(&counts, 200);
    assert!(
        counts.by_static > 0,
        "the static guards answered: {counts:?}"
    );
    let carried = carried_by_files(&bed).await;
    for guard in [
        RBAC,
        TAGS.name,
        hcp_fleet_guards::service_annotation::ROW.name,
    ] {
        assert!(carried.contains(guard), "{guard} in {carried:?}");
    }
    assert_eq!(guards_on(&bed, "static"), carried.len() as f64);
    assert_eq!(guards_on(&bed, "policy"), 0.0);
    // The tag is still made, by the policy loaded from files.
    let svc = support::load_balancer("lb", serde_json::json!({"team": "a"}));
    hcp_fleet_testbed::fixtures::ensure_namespace(&hosted, "team-a", Default::default())
        .await
        .expect("namespace");
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let created = Api::<k8s_openapi::api::core::v1::Service>::namespaced(hosted.clone(), "team-a")
        .create(&dry, &svc)
        .await
        .expect("dry-run create");
    assert_eq!(
        created
            .metadata
            .annotations
            .unwrap_or_default()
            .get(TAGS_ANNOTATION)
            .map(String::as_str),
        Some("red-hat-managed=true")
    );
    eventually(
        "the record gives each carried guard the files",
        Duration::from_secs(60),
        || async {
            let paths = recorded_paths(&bed).await;
            if carried
                .iter()
                .all(|g| paths.get(g).map(String::as_str) == Some("static"))
            {
                Ok(())
            } else {
                Err(format!("{paths:?}"))
            }
        },
    )
    .await;
    wait_concern(&bed.mgmt, "hosted-webhooks", "Compliant").await;

    // Unmounted: back to the API, under load, the files removed only after the policies are
    // proven.
    let load = GuardLoad::start(alice(&bed).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    hcp_fleet_testbed::fixtures::put_kube_apiserver(&bed.mgmt, "hc-1", mount, false)
        .await
        .expect("unmount");
    wait_paths(
        &bed,
        &hosted,
        (true, false),
        "auto moved the guards back to the API",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counts = load.stop().await;
    eprintln!("auto: back to the API; load {counts:?}");
    assert_nothing_let_through(&counts, 200);
    assert!(
        support::mutating_policy_exists(&hosted, TAGS.name)
            .await
            .expect("get"),
        "the Service tag's policy is back"
    );
    assert_eq!(
        recorded_paths(&bed).await.get(RBAC).map(String::as_str),
        Some("policy")
    );
    wait_concern(&bed.mgmt, "hosted-webhooks", "Compliant").await;
}
