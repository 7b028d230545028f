//! An HCP paused and resumed, the agent uninstalled, management objects deleted or edited.

use super::*;

/// Pausing one HCP: the agent leaves it alone (drift stays unrepaired) and its health record
/// says Pending with the reason; removing the annotation resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_hcp_is_left_alone_and_resumes() {
    use hcp_fleet_model::crd::HostedControlPlane;
    use hcp_fleet_model::crd::hostedcontrolplane::PAUSE_ANNOTATION;
    use kube::api::{Patch, PatchParams};
    let (fleet, mgmt, _pods) = support::fleet_with_pods(1).await;
    let agent = start_agent(&mgmt, AgentConfig::default()).await;
    wait_compliant(&mgmt, &["hc-1"]).await;
    let ns = hcp_namespace("hc-1");
    let hcps: Api<HostedControlPlane> = Api::namespaced(mgmt.clone(), &ns);
    // Since when, and by whom: the gauge the pause alert reads, and the record's start.
    let paused_series = || {
        agent
            .context
            .metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("hcp_fleet_paused_since_timestamp_seconds{"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let patch = |body: serde_json::Value| {
        let hcps = hcps.clone();
        async move {
            hcps.patch("hc-1", &PatchParams::default(), &Patch::Merge(body))
                .await
                .expect("patch the HCP")
        }
    };
    // The agent's annotation, then HyperShift's own spec.pausedUntil: each pauses it alike.
    let ways = [
        (
            serde_json::json!({"metadata": {"annotations": {PAUSE_ANNOTATION: "true"}}}),
            serde_json::json!({"metadata": {"annotations": {PAUSE_ANNOTATION: null}}}),
            "paused by hcp-fleet.openshift.io/paused",
            "annotation",
        ),
        (
            serde_json::json!({"spec": {"pausedUntil": "true"}}),
            serde_json::json!({"spec": {"pausedUntil": null}}),
            "paused by spec.pausedUntil",
            "hypershift",
        ),
    ];
    for (pause, resume, reason, by) in ways {
        let before = jiff::Timestamp::now().as_second();
        patch(pause).await;
        eventually(reason, Duration::from_secs(20), || {
            let mgmt = mgmt.clone();
            let ns = ns.clone();
            async move {
                let p = health(&mgmt, &ns).await?;
                let h = history_messages(&p, "hosted-webhooks");
                match (compliant(&p), h.first()) {
                    (Some("Pending"), Some(m)) if m.contains(reason) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        })
        .await;
        let since = health(&mgmt, &ns)
            .await
            .expect("record")
            .status
            .and_then(|s| s.paused_since)
            .expect("the record says since when");
        let since = since
            .parse::<jiff::Timestamp>()
            .expect("RFC 3339")
            .as_second();
        assert!(since >= before - 1, "{since} {before}");
        assert_eq!(
            paused_series(),
            [format!(
                "hcp_fleet_paused_since_timestamp_seconds{{hcp_namespace=\"{ns}\",hosted_cluster=\"hc-1\",reason=\"{by}\"}} {since}"
            )]
        );
        let vapi = delete_validating(&fleet, "hc-1").await;
        // A repair takes well under a second when not paused (drift test above); give it
        // ten times that and see nothing come back.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            vapi.is_gone().await,
            "{reason}: a paused HCP's drift is left alone"
        );
        patch(resume).await;
        eventually(
            "resumed: the webhook is back",
            Duration::from_secs(30),
            || vapi.present(),
        )
        .await;
        wait_compliant(&mgmt, &["hc-1"]).await;
        assert!(paused_series().is_empty(), "{:?}", paused_series());
        assert_eq!(
            health(&mgmt, &ns)
                .await
                .expect("record")
                .status
                .and_then(|s| s.paused_since),
            None
        );
    }

    // A pause older than maxPauseHours no longer holds: the agent repairs drift again, and the
    // record and the gauge keep the pause's start, so its alert goes on.
    patch(serde_json::json!({"metadata": {"annotations": {PAUSE_ANNOTATION: "true"}}})).await;
    eventually("paused again", Duration::from_secs(20), || async {
        match health(&mgmt, &ns)
            .await?
            .status
            .and_then(|s| s.paused_since)
        {
            Some(_) => Ok(()),
            None => Err("not yet".to_string()),
        }
    })
    .await;
    let long_ago = jiff::Timestamp::now().as_second() - 2 * 3600;
    let long_ago_text = jiff::Timestamp::from_second(long_ago)
        .expect("t")
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    Api::<hcp_fleet_model::crd::AdmissionHealth>::namespaced(mgmt.clone(), &ns)
        .patch_status(
            support::record_of(&ns),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"pausedSince": long_ago_text}})),
        )
        .await
        .expect("a pause begun two hours ago");
    let mut cfg = hcp_fleet_testbed::allow_loopback(AgentConfig::default());
    cfg.max_pause_hours = 1;
    agent.set_config(cfg);
    let vapi = delete_validating(&fleet, "hc-1").await;
    // The backdated start reaches the agent through its watch of the records, which need not
    // have delivered it by the reconcile the new configuration starts (a loaded machine): the
    // time a real pause takes to pass its maximum is stood in for by touching the HCP until a
    // reconcile reads the start (in a cluster the agent comes back when the maximum is up).
    let nudges = std::sync::atomic::AtomicU32::new(0);
    eventually(
        "a pause past its maximum: drift repaired",
        Duration::from_secs(20),
        || async {
            let found = vapi.present().await;
            if found.is_err() {
                let n = nudges.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n % 10 == 9 {
                    patch(serde_json::json!({"metadata": {"annotations": {"e2e/nudge": n.to_string()}}})).await;
                }
            }
            found
        },
    )
    .await;
    // The repair is written inside the pass, the record and the gauge after it: the webhook can
    // be back a moment before the pass reports, so the gauge is waited for, not read at once.
    eventually(
        "the gauge keeps the pause's start",
        Duration::from_secs(10),
        || async {
            let series = paused_series();
            if series.iter().any(|l| {
                l.contains("reason=\"annotation\"") && l.ends_with(&format!(" {long_ago}"))
            }) {
                Ok(())
            } else {
                Err(format!("{series:?}"))
            }
        },
    )
    .await;
}

/// A record an earlier release wrote (named `hcp-fleet-admission` in every namespace): the
/// agent carries its status over to the record named after the hosted cluster, then deletes
/// it, and `status` shows the cluster once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_releases_record_is_carried_over_and_deleted() {
    use hcp_fleet_render::reporting::record::LEGACY_HEALTH_NAME;
    use kube::api::{Patch, PatchParams, PostParams};
    let (fleet, mgmt, _pods) = support::fleet_with_pods(1).await;
    let ns = hcp_namespace("hc-1");
    let records: Api<AdmissionHealth> = Api::namespaced(mgmt.clone(), &ns);
    // The claim as earlier releases spelled it (`hosted_cluster_uid`).
    let hc1 = fleet
        .hosted("hc-1")
        .expect("hc-1")
        .client()
        .await
        .expect("client");
    let claimed = Api::<k8s_openapi::api::core::v1::Namespace>::all(hc1)
        .get("kube-system")
        .await
        .expect("kube-system")
        .metadata
        .uid
        .expect("uid");
    let legacy: AdmissionHealth = serde_json::from_value(serde_json::json!({
        "apiVersion": "hcp-fleet.openshift.io/v1alpha1",
        "kind": "AdmissionHealth",
        "metadata": {
            "name": LEGACY_HEALTH_NAME,
            "labels": {
                "app.kubernetes.io/managed-by": "hcp-fleet-agent",
                "hcp-fleet.openshift.io/hosted-cluster": "hc-1",
            },
        },
        "spec": {"cluster": "hc-1", "hosted_cluster_uid": claimed},
    }))
    .expect("record");
    assert_eq!(legacy.spec.claimed_uid(), Some(claimed.as_str()));
    records
        .create(&PostParams::default(), &legacy)
        .await
        .expect("an earlier release's record");
    records
        .patch_status(
            LEGACY_HEALTH_NAME,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"driftRepairs": 41}})),
        )
        .await
        .expect("its status");
    let _agent = start_agent(&mgmt, AgentConfig::default()).await;
    wait_compliant(&mgmt, &["hc-1"]).await;
    eventually(
        "carried over, then deleted",
        Duration::from_secs(20),
        || async {
            let new = records.get("hc-1").await.map_err(|e| e.to_string())?;
            let repairs = new.status.map(|s| s.drift_repairs).unwrap_or_default();
            let old = records
                .get_opt(LEGACY_HEALTH_NAME)
                .await
                .map_err(|e| e.to_string())?;
            let spelled = (
                new.spec.hosted_cluster_uid.as_deref() == Some(claimed.as_str()),
                new.spec.legacy_hosted_cluster_uid.is_none(),
            );
            match (repairs >= 41 && spelled == (true, true), old) {
                (true, None) => Ok(()),
                (carried, old) => Err(format!(
                    "carried {carried}, old still there {}",
                    old.is_some()
                )),
            }
        },
    )
    .await;
}

/// Removing the agent cleanly: `uninstall` refuses while an agent leads; then removes the
/// hosted webhooks before the admission services, keeps both for a hosted cluster it cannot
/// reach (and fails, so it can be run again), and removes the roll-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_removes_webhooks_first_and_keeps_what_it_cannot_reach() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::PostParams;
    let (mut fleet, mgmt, _pods) = support::fleet_with_pods(2).await;
    // Every guard through the service: what an unreachable cluster keeps is the service its
    // webhooks call.
    let agent = start_agent(&mgmt, support::through_the_service()).await;
    wait_compliant(&mgmt, &["hc-1", "hc-2"]).await;
    let kubeconfig = fleet.management.kubeconfig_path.clone();
    // The test bed's configuration: uninstall talks only to the API servers it allows.
    let config = kubeconfig.with_file_name("uninstall-config.yaml");
    std::fs::write(&config, hcp_fleet_testbed::agent_config_yaml()).expect("config");
    let uninstall = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"))
            .args(["uninstall", "--namespace", AGENT_NS, "--config"])
            .arg(&config)
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .expect("uninstall")
    };

    // An agent that still leads would put everything back: refused, nothing touched.
    let leases: Api<Lease> = Api::namespaced(mgmt.clone(), AGENT_NS);
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hcp-fleet-agent"},
        "spec": {
            "holderIdentity": "agent-x",
            "leaseDurationSeconds": 60,
            "renewTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string(),
        },
    }))
    .expect("lease");
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("lease");
    let out = uninstall();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent-x still holds the Lease"));
    let hc1 = fleet
        .hosted("hc-1")
        .expect("hc-1")
        .client()
        .await
        .expect("hc-1");
    let vapi = Api::<ValidatingWebhookConfiguration>::all(hc1.clone());
    assert!(vapi.get_opt(VALIDATING_NAME).await.expect("get").is_some());
    leases
        .delete("hcp-fleet-agent", &DeleteParams::default())
        .await
        .expect("lease gone");

    // The agent is gone, and hc-2's API server is down.
    drop(agent);
    fleet.hosted_mut("hc-2").expect("hc-2").stop();
    let out = uninstall();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "clusters-hc-1: removed {} hosted object(s)",
            support::hosted_objects(&support::through_the_service(), &fleet.version)
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("error: clusters-hc-2: hosted cluster"),
        "{stdout}"
    );
    assert_eq!(support::owned_hosted_objects(&hc1).await, 0);
    let ns1 = hcp_namespace("hc-1");
    let ns2 = hcp_namespace("hc-2");
    let deployments = |ns: &str| Api::<Deployment>::namespaced(mgmt.clone(), ns);
    assert!(
        deployments(&ns1)
            .get_opt("hcp-fleet-admission")
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        Api::<Secret>::namespaced(mgmt.clone(), &ns1)
            .get_opt("hcp-fleet-admission-tls")
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        Api::<AdmissionHealth>::namespaced(mgmt.clone(), &ns1)
            .get_opt(support::record_of(&ns1))
            .await
            .expect("get")
            .is_none()
    );
    // The unreachable cluster's webhooks still point at its admission service: kept.
    assert!(
        deployments(&ns2)
            .get_opt("hcp-fleet-admission")
            .await
            .expect("get")
            .is_some()
    );
}

/// Every object of the admission service on the management side is watched: deleted or
/// edited by someone else, it is back as rendered, and counted as drift on the metric and in
/// the health record. How fast is the benches' to measure (`make bench`: drift repaired); the
/// times are printed here, and bounded only by what a loaded machine meets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn management_objects_deleted_or_edited_come_back() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
    let (_fleet, mgmt, _pods) = support::fleet_with_pods(1).await;
    // Every guard through the service, so that there is one on every server.
    let agent = start_agent(&mgmt, support::through_the_service()).await;
    wait_compliant(&mgmt, &["hc-1"]).await;
    let ns = "clusters-hc-1";
    let svc = "hcp-fleet-admission";
    let caps = hcp_fleet_agent::controller::discover(&mgmt).await;
    // The serving Secret before the CA's: a new CA means a new serving certificate, which the
    // pass that repairs the CA writes just after it. Deleted next, the serving Secret could be
    // put back by that write as the new certificate (a change the agent asked for, not drift)
    // before the pass that would count its deletion: under load it was, and nothing counted.
    let mut objects: Vec<(&str, ApiResource, String)> = vec![
        (
            "Secret",
            ApiResource::erase::<Secret>(&()),
            format!("{svc}-tls"),
        ),
        (
            "Secret",
            ApiResource::erase::<Secret>(&()),
            format!("{svc}-ca"),
        ),
        ("Service", ApiResource::erase::<Service>(&()), svc.into()),
        (
            "NetworkPolicy",
            ApiResource::erase::<NetworkPolicy>(&()),
            svc.into(),
        ),
        (
            "ServiceAccount",
            ApiResource::erase::<ServiceAccount>(&()),
            svc.into(),
        ),
    ];
    let pdb = caps
        .pdb_api
        .api_resource()
        .expect("both versions serve a PDB API");
    objects.push(("PodDisruptionBudget", pdb, svc.into()));
    let drift_of = |kind: &str| {
        let needle = format!(
            "hcp_fleet_management_drift_total{{hcp_namespace=\"{ns}\",hosted_cluster=\"hc-1\",kind=\"{kind}\"}}"
        );
        metric(&agent.context.metrics.encode(), &needle).unwrap_or(0.0)
    };
    // Counted by the reconcile that repaired it, just after its write: the repaired object
    // can be seen a moment before the counter moves.
    let drift_counted = |what: &str, kind: &'static str, counted: f64| {
        let what = what.to_string();
        let drift_of = &drift_of;
        async move {
            eventually(&what, Duration::from_secs(5), || {
                let now = drift_of(kind);
                async move {
                    if now > counted {
                        Ok(())
                    } else {
                        Err(format!("{now}"))
                    }
                }
            })
            .await
        }
    };
    let mut took = Vec::new();
    for (kind, ar, name) in &objects {
        let api = Api::<DynamicObject>::namespaced_with(mgmt.clone(), ns, ar);
        let before = api.get(name).await.expect("in place").uid();
        let counted = drift_of(kind);
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
        let t0 = Instant::now();
        eventually(
            &format!("{kind} {name} recreated"),
            Duration::from_secs(10),
            || {
                let api = api.clone();
                let before = before.clone();
                async move {
                    match api.get_opt(name).await {
                        Ok(Some(o)) if o.uid() != before => Ok(()),
                        other => Err(format!("{:?}", other.map(|o| o.map(|o| o.uid())))),
                    }
                }
            },
        )
        .await;
        let back = t0.elapsed();
        drift_counted(&format!("{kind} drift counted"), kind, counted).await;
        took.push(format!("{kind}/{name} {back:?}"));
    }
    // An edit, not a deletion: the NetworkPolicy opened to everyone is closed again.
    let np = Api::<NetworkPolicy>::namespaced(mgmt.clone(), ns);
    let counted = drift_of("NetworkPolicy");
    let open = serde_json::json!({"spec": {"ingress": [{}]}});
    np.patch(svc, &PatchParams::default(), &Patch::Merge(&open))
        .await
        .expect("edit");
    let t0 = Instant::now();
    eventually("NetworkPolicy restored", Duration::from_secs(10), || {
        let np = np.clone();
        async move {
            let p = np.get(svc).await.map_err(|e| e.to_string())?;
            let from = p
                .spec
                .and_then(|s| s.ingress)
                .and_then(|i| i.first().and_then(|r| r.from.clone()));
            if from.is_some_and(|f| !f.is_empty()) {
                Ok(())
            } else {
                Err("still open".into())
            }
        }
    })
    .await;
    let back = t0.elapsed();
    took.push(format!("NetworkPolicy edit {back:?}"));
    drift_counted("the edit counts as drift", "NetworkPolicy", counted).await;
    // Its spec is the agent's whole: an egress section another manager adds beside the
    // rendered ingress is removed as fast as a changed rule.
    let counted = drift_of("NetworkPolicy");
    let beside =
        serde_json::json!({"spec": {"egress": [{}], "policyTypes": ["Ingress", "Egress"]}});
    let pp = PatchParams {
        field_manager: Some("someone-else".into()),
        ..Default::default()
    };
    np.patch(svc, &pp, &Patch::Merge(&beside))
        .await
        .expect("add egress");
    let t0 = Instant::now();
    eventually(
        "the egress section removed",
        Duration::from_secs(10),
        || {
            let np = np.clone();
            async move {
                let p = np.get(svc).await.map_err(|e| e.to_string())?;
                match p.spec.and_then(|s| s.egress) {
                    None => Ok(()),
                    Some(e) => Err(format!("egress still there: {e:?}")),
                }
            }
        },
    )
    .await;
    let back = t0.elapsed();
    took.push(format!("NetworkPolicy egress added {back:?}"));
    drift_counted(
        "the egress section counts as drift",
        "NetworkPolicy",
        counted,
    )
    .await;
    // The Deployment's pods' spec is the agent's whole: a field it does not render, added by
    // someone else, is removed as fast as a changed one; so is one written under the agent's
    // own field manager name (only its apply is its own, #48); and a server default someone
    // changed is put back once, not at every look after (the agent's replace leaves no entry
    // of its own that would read as someone else's).
    let deployments = Api::<Deployment>::namespaced(mgmt.clone(), ns);
    type PodCheck = fn(&k8s_openapi::api::core::v1::PodSpec) -> bool;
    let cases: [(&str, serde_json::Value, &str, PodCheck); 4] = [
        (
            "hostNetwork",
            serde_json::json!({"spec": {"template": {"spec": {"hostNetwork": true}}}}),
            "someone-else",
            |p| p.host_network != Some(true),
        ),
        (
            "an initContainer",
            serde_json::json!({"spec": {"template": {"spec": {"initContainers": [
                {"name": "sneaky", "image": "registry.example.com/sneaky:1"}
            ]}}}}),
            "someone-else",
            |p| p.init_containers.as_ref().is_none_or(|c| c.is_empty()),
        ),
        (
            "hostNetwork under the agent's own field manager name",
            serde_json::json!({"spec": {"template": {"spec": {"hostNetwork": true}}}}),
            "hcp-fleet-agent",
            |p| p.host_network != Some(true),
        ),
        (
            "terminationGracePeriodSeconds (a server default) changed",
            serde_json::json!({"spec": {"template": {"spec": {"terminationGracePeriodSeconds": 5}}}}),
            "someone-else",
            |p| p.termination_grace_period_seconds == Some(30),
        ),
    ];
    for (what, patch, manager, put_back) in cases {
        let counted = drift_of("Deployment");
        let pp = PatchParams {
            field_manager: Some(manager.into()),
            ..Default::default()
        };
        deployments
            .patch(svc, &pp, &Patch::Strategic(&patch))
            .await
            .expect(what);
        let t0 = Instant::now();
        eventually(
            &format!("{what}: put back in the Deployment"),
            Duration::from_secs(10),
            || {
                let deployments = deployments.clone();
                async move {
                    let d = deployments.get(svc).await.map_err(|e| e.to_string())?;
                    let pod = d.spec.and_then(|s| s.template.spec).unwrap_or_default();
                    if put_back(&pod) {
                        Ok(())
                    } else {
                        Err(format!(
                            "hostNetwork {:?}, initContainers {:?}, terminationGracePeriodSeconds {:?}",
                            pod.host_network,
                            pod.init_containers.map(|c| c.len()),
                            pod.termination_grace_period_seconds,
                        ))
                    }
                }
            },
        )
        .await;
        let back = t0.elapsed();
        took.push(format!("Deployment {what} {back:?}"));
        drift_counted(&format!("{what} counts as drift"), "Deployment", counted).await;
        // Once: no repair after the one that put it back.
        let repaired = drift_of("Deployment");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            drift_of("Deployment"),
            repaired,
            "{what}: repaired again and again"
        );
    }
    // The HCP ends Compliant with its (new) certificate in the hosted cluster.
    wait_compliant(&mgmt, &["hc-1"]).await;
    eprintln!("management drift repaired: {}", took.join(", "));
}
