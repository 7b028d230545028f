//! A hostile tenant: tampering with a guard, imitating the probe's answer, a guard that stops denying its canary.

use super::*;

/// A hosted cluster's admin cannot quietly switch a guard off: each tampering with the
/// protected-RBAC guard (a selector merged in, its failure policy, its rules, its URL; where
/// the guards run as ValidatingAdmissionPolicies, their constraints, validations and the
/// binding's matchResources and actions) is undone within a second, counted as drift, named
/// in the health record with the field and the field manager that changed it, and the guarded
/// request by a non-exempt user is denied again. Fields the agent does not render count too:
/// a selector the tenant adds makes the guard match nothing while every rendered field stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_tampering_with_a_guard_is_undone_counted_and_named() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, ValidatingWebhookConfiguration,
    };
    use kube::api::DynamicObject;
    let bed = bed(AgentConfig::default()).await;
    let hosted = hc1_admin(&bed).await;
    let rbac = "protected-rbac.hcp-fleet.openshift.io";
    let policies = support::serves(
        &bed.fleet.version,
        Feature::AdmissionPolicies,
        "tampering with ValidatingAdmissionPolicies and bindings (the guards run as webhooks here)",
    );
    // (kind, object name, what, strategic merge patch) as a tenant's `kubectl patch` sends it.
    let mut cases: Vec<(&str, &str, &str, serde_json::Value)> = Vec::new();
    if policies {
        cases.extend([
            ("ValidatingAdmissionPolicy", rbac, "an object selector merged into matchConstraints",
             serde_json::json!({"spec": {"matchConstraints": {"objectSelector": {"matchLabels": {"tenant": "off"}}}}})),
            ("ValidatingAdmissionPolicy", rbac, "its validation made true",
             serde_json::json!({"spec": {"validations": [{"expression": "true"}]}})),
            ("ValidatingAdmissionPolicy", rbac, "a matchCondition that never holds",
             serde_json::json!({"spec": {"matchConditions": [{"name": "tenant", "expression": "false"}]}})),
            ("ValidatingAdmissionPolicyBinding", rbac, "matchResources added to the binding",
             serde_json::json!({"spec": {"matchResources": {"objectSelector": {"matchLabels": {"tenant": "off"}}}}})),
            ("ValidatingAdmissionPolicyBinding", rbac, "validationActions set to Audit",
             serde_json::json!({"spec": {"validationActions": ["Audit"]}})),
        ]);
    } else {
        let hook = |patch: serde_json::Value| {
            let mut entry = serde_json::json!({"name": rbac});
            if let (Some(e), Some(p)) = (entry.as_object_mut(), patch.as_object()) {
                e.extend(p.clone());
            }
            serde_json::json!({"webhooks": [entry]})
        };
        let vwc = hcp_fleet_render::hosted::webhooks::VALIDATING_NAME;
        cases.extend([
            ("ValidatingWebhookConfiguration", vwc, "an object selector merged in",
             hook(serde_json::json!({"objectSelector": {"matchLabels": {"tenant": "off"}}}))),
            ("ValidatingWebhookConfiguration", vwc, "its failure policy changed",
             hook(serde_json::json!({"failurePolicy": "Fail"}))),
            ("ValidatingWebhookConfiguration", vwc, "its rules narrowed to nothing",
             hook(serde_json::json!({"rules": [{"operations": ["DELETE"], "apiGroups": ["none.example.com"], "apiVersions": ["v1"], "resources": ["nothing"]}]}))),
            ("ValidatingWebhookConfiguration", vwc, "its URL pointed elsewhere",
             hook(serde_json::json!({"clientConfig": {"url": "https://127.0.0.1:1/nowhere"}}))),
        ]);
    }
    let resource = |kind: &str| -> kube::core::ApiResource {
        match kind {
            "ValidatingAdmissionPolicy" => {
                kube::core::ApiResource::erase::<ValidatingAdmissionPolicy>(&())
            }
            "ValidatingAdmissionPolicyBinding" => {
                kube::core::ApiResource::erase::<ValidatingAdmissionPolicyBinding>(&())
            }
            _ => kube::core::ApiResource::erase::<ValidatingWebhookConfiguration>(&()),
        }
    };
    // The part the agent renders whole, without what the server keeps for itself.
    let shape = |o: &DynamicObject| {
        let v = serde_json::to_value(o).unwrap_or_default();
        serde_json::json!([v["spec"], v["webhooks"]])
    };
    let drift = |kind: &str| webhook_drift(&bed, kind);
    // The same, written under the agent's own field manager name, which any client can
    // claim (`kubectl --field-manager=hcp-fleet-agent`): the name proves nothing.
    let agent = "hcp-fleet-agent";
    let (spoofed, named): (Vec<_>, &str) = if policies {
        (
            vec![(
                "ValidatingAdmissionPolicy",
                rbac,
                "excludeResourceRules added under the agent's name",
                serde_json::json!({"spec": {"matchConstraints": {"excludeResourceRules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}]}}}),
            )],
            "excludeResourceRules",
        )
    } else {
        let vwc = hcp_fleet_render::hosted::webhooks::VALIDATING_NAME;
        (
            vec![(
                "ValidatingWebhookConfiguration",
                vwc,
                "an object selector merged in under the agent's name",
                serde_json::json!({"webhooks": [{"name": rbac, "objectSelector": {"matchLabels": {"tenant": "off"}}}]}),
            )],
            "objectSelector",
        )
    };
    let (ok, out) = kubectl(&bed, DELETE_AS_ALICE);
    assert!(!ok && out.contains(PROTECTED), "guarded before: {out}");
    let mut took = Vec::new();
    let writes = cases
        .into_iter()
        .map(|c| (c, "tenant-admin"))
        .chain(spoofed.into_iter().map(|c| (c, agent)));
    for ((kind, name, what, patch), manager) in writes {
        let api = Api::<DynamicObject>::all_with(hosted.clone(), &resource(kind));
        let rendered = shape(&api.get(name).await.expect("installed"));
        let counted = drift(kind);
        let pp = PatchParams {
            field_manager: Some(manager.into()),
            ..Default::default()
        };
        api.patch(name, &pp, &Patch::Strategic(&patch))
            .await
            .unwrap_or_else(|e| panic!("{kind} {what}: {e}"));
        let t0 = Instant::now();
        eventually(
            &format!("{kind}: {what} undone"),
            Duration::from_secs(10),
            || {
                let api = api.clone();
                let rendered = rendered.clone();
                async move {
                    let now = shape(&api.get(name).await.map_err(|e| e.to_string())?);
                    if now == rendered {
                        Ok(())
                    } else {
                        Err(now.to_string())
                    }
                }
            },
        )
        .await;
        let back = t0.elapsed();
        took.push((what, back));
        eventually(
            &format!("{kind}: {what} counted"),
            Duration::from_secs(5),
            || {
                let now = drift(kind);
                async move {
                    if now > counted {
                        Ok(())
                    } else {
                        Err(format!("{now}"))
                    }
                }
            },
        )
        .await;
        eventually(
            &format!("{kind}: {what}: the guard denies again"),
            Duration::from_secs(10),
            || {
                let r = kubectl(&bed, DELETE_AS_ALICE);
                async move {
                    match r {
                        (false, out) if out.contains(PROTECTED) => Ok(()),
                        (_, out) => Err(out),
                    }
                }
            },
        )
        .await;
    }
    // The record names the field manager behind the change.
    let h = Api::<AdmissionHealth>::namespaced(bed.mgmt.clone(), NS)
        .get(support::record_of(NS))
        .await
        .expect("health record");
    let history: Vec<String> = h
        .status
        .unwrap_or_default()
        .concerns
        .into_iter()
        .filter(|c| c.name == "hosted-webhooks")
        .flat_map(|c| c.history.into_iter().map(|e| e.message))
        .collect();
    assert!(
        history
            .iter()
            .any(|m| m.contains("(by tenant-admin)") && m.contains("by someone else")),
        "{history:?}"
    );
    // Under the agent's own name, the record names what differs.
    assert!(
        history
            .iter()
            .any(|m| m.contains(named) && m.contains("by someone else")),
        "{history:?}"
    );
    // Each tampering is an Event on the record too, naming the object, the fields and who.
    let tampered = || async {
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(bed.mgmt.clone(), NS)
            .list(&Default::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter(|e| {
                        e.reason.as_deref() == Some("Tampered")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                                == Some(support::record_of(NS))
                    })
                    .filter_map(|e| e.note)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    eventually("Tampered events", Duration::from_secs(10), || async {
        let notes = tampered().await;
        let tenant = notes
            .iter()
            .any(|n| n.contains("(by tenant-admin)") && n.contains("by someone else"));
        let claimed = notes
            .iter()
            .any(|n| n.contains("under the agent's own field manager name") && n.contains(named));
        // Bounded: ten a minute at most, however many tamperings (this test makes six).
        if tenant && claimed && notes.len() <= 10 {
            Ok(())
        } else {
            Err(format!("{notes:?}"))
        }
    })
    .await;
    eprintln!(
        "tampering undone: {}",
        took.iter()
            .map(|(w, t)| format!("{w} {t:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// The probe passes only on the admission service's own answer: a webhook of the hosted
/// cluster's admins, named like the probe and answering in the same words (here the agent's
/// own binary, run without the HCP's probe key), cannot make a path that does not prove itself
/// look Compliant. The service that cannot prove (its mounted key replaced) and the imitation
/// are both reported; with the key back and the imitation gone, Compliant again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imitation_of_the_probes_answer_never_passes_for_the_service() {
    use hcp_fleet_guards::catalogue::{PROBE_ANSWER, PROBE_LABEL};
    use hcp_fleet_guards::probe::{KEY_FILE, ProbeKey, ROW};
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::ConfigMap;
    let mut cfg = through_the_service();
    cfg.probe_interval_seconds = 5;
    let bed = bed(cfg).await;
    let hosted = hc1_admin(&bed).await;
    let (_, m) = newest(&bed.mgmt, "e2e-probe").await;
    assert!(
        m.contains("answered the probe") && !m.contains("without"),
        "{m}"
    );

    // The imitation: the same webhook name, the same words, its own service and CA.
    let (mut faker, port, ca_pem, _dir) = standalone_service().await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let vwc: ValidatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "tenant-probe"},
        "webhooks": [{
            "name": ROW.name,
            "clientConfig": {
                "url": format!("https://127.0.0.1:{port}{}", ROW.path),
                "caBundle": base64::Engine::encode(&b64, &ca_pem),
            },
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
            "objectSelector": {"matchExpressions": [{"key": PROBE_LABEL, "operator": "Exists"}]},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
        }],
    }))
    .expect("configuration");
    let vapi = Api::<ValidatingWebhookConfiguration>::all(hosted.clone());
    let pp = PostParams {
        field_manager: Some("tenant-admin".into()),
        ..Default::default()
    };
    vapi.create(&pp, &vwc).await.expect("tenant webhook");
    // It answers in the words of the service, under the service's webhook name.
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"generateName": "imitation-", "labels": {PROBE_LABEL: "true"}},
    }))
    .expect("configmap");
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually("the imitation answers", Duration::from_secs(10), || {
        let api = Api::<ConfigMap>::namespaced(hosted.clone(), "default");
        let cm = cm.clone();
        let dry = dry.clone();
        async move {
            match api.create(&dry, &cm).await {
                Err(kube::Error::Api(s))
                    if s.message.contains(&format!(
                        "\"{}\" denied the request: {PROBE_ANSWER}",
                        ROW.name
                    )) =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;

    // The service loses its key (its pods' mounted copy replaced): nothing that answers can
    // prove the path any more.
    let key_file = bed.pods.path().join(NS).join(KEY_FILE);
    let real = std::fs::read_to_string(&key_file).expect("the pods hold the probe key");
    assert!(ProbeKey::from_hex(&real).is_some(), "a probe key: {real:?}");
    let wrong = ProbeKey::generate().expect("random").to_hex();
    std::fs::write(&key_file, &wrong).expect("replace the key");
    let t0 = Instant::now();
    eventually(
        "e2e-probe NonCompliant, naming the missing proof",
        Duration::from_secs(30),
        || async {
            match newest(&bed.mgmt, "e2e-probe").await {
                (Some(c), m)
                    if c == "NonCompliant"
                        && m.contains("without the admission service's proof") =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let reported = t0.elapsed();

    // The key back and the imitation gone: proven again.
    std::fs::write(&key_file, &real).expect("restore the key");
    vapi.delete("tenant-probe", &DeleteParams::default())
        .await
        .expect("delete the imitation");
    let _ = faker.kill();
    let _ = faker.wait();
    wait_concern(&bed.mgmt, "e2e-probe", "Compliant").await;
    let (_, m) = newest(&bed.mgmt, "e2e-probe").await;
    assert!(
        m.contains("answered the probe") && !m.contains("without"),
        "{m}"
    );
    eprintln!("an unproven probe answer reported NonCompliant after {reported:?}");
}

/// A mutating webhook of the hosted cluster's admins, served over TLS by this test (the crate's
/// own server stack, an axum handler of its own): `patch` makes the JSON patch it answers with
/// from the request's object.
pub(crate) async fn tenant_mutator(
    patch: fn(&serde_json::Value) -> serde_json::Value,
) -> (tokio::task::JoinHandle<()>, u16, String, tempfile::TempDir) {
    use axum::routing::post;
    use hcp_fleet_webhook::server;
    use hcp_fleet_webhook::tls::ReloadingCert;
    let (ca, dir) = loopback_serving_files("tenant mutator CA");
    let cert =
        ReloadingCert::new(dir.path().join("tls.crt"), dir.path().join("tls.key")).expect("cert");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let app = axum::Router::new().route(
        "/mutate",
        post(move |body: axum::body::Bytes| async move {
            let review: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let patch = patch(&review["request"]["object"]);
            let b64 = base64::engine::general_purpose::STANDARD;
            let out = serde_json::json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": review["request"]["uid"],
                    "allowed": true,
                    "patchType": "JSONPatch",
                    "patch": base64::Engine::encode(&b64, patch.to_string()),
                },
            });
            (
                [(http::header::CONTENT_TYPE, "application/json")],
                out.to_string(),
            )
        }),
    );
    let task = tokio::spawn(server::serve(
        listener,
        server::tls_config(cert as Arc<dyn rustls::server::ResolvesServerCert>),
        app,
        server::Limits::default(),
        Box::pin(std::future::pending()),
    ));
    (task, port, ca.cert_pem, dir)
}

/// `tenant_mutator(patch)`, registered in the hosted cluster as the MutatingWebhookConfiguration
/// `name` for `rules` (failing closed, as a tenant who means it would): the server's task, its
/// files, and the configurations' API to remove it with.
pub(crate) async fn install_tenant_mutator(
    hosted: &Client,
    name: &str,
    rules: serde_json::Value,
    patch: fn(&serde_json::Value) -> serde_json::Value,
) -> (
    tokio::task::JoinHandle<()>,
    tempfile::TempDir,
    Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>,
) {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    let (task, port, ca_pem, dir) = tenant_mutator(patch).await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mwc: MutatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": format!("{name}.tenant.example.com"),
            "clientConfig": {
                "url": format!("https://127.0.0.1:{port}/mutate"),
                "caBundle": base64::Engine::encode(&b64, &ca_pem),
            },
            "rules": rules,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
        }],
    }))
    .expect("configuration");
    let api = Api::<MutatingWebhookConfiguration>::all(hosted.clone());
    api.create(&PostParams::default(), &mwc)
        .await
        .expect("the tenant's mutating webhook");
    (task, dir, api)
}

/// How many canaries `cfg` plans (its enforced guards with one), and how long a round of them
/// and the probe takes at `cfg`'s probe interval.
fn canary_round(cfg: &AgentConfig) -> (usize, Duration) {
    let settings = hcp_fleet_guards::Settings::from(cfg);
    let planned = cfg
        .webhooks
        .iter()
        .filter(|w| w.mode == Mode::Enforce)
        .filter(|w| {
            hcp_fleet_guards::for_path(&w.path)
                .and_then(|g| g.canary(&settings))
                .is_some()
        })
        .count();
    let every = u64::from(cfg.probe_interval_seconds);
    (planned, Duration::from_secs(every * (planned as u64 + 1)))
}

/// The admission service's request counts for each of `webhooks`, in order.
async fn requests_of(bed: &Bed, webhooks: &[&str]) -> Vec<f64> {
    futures::future::join_all(webhooks.iter().map(|w| service_requests(bed, w))).await
}

/// Each enforced guard is tried by its canary, one per probe round: a dry-run request it must
/// deny, sent as a non-exempt user the agent grants just those requests. A guard that stops
/// denying its canary (here a tenant's mutating webhook rewrites what the featuregate guard
/// would judge, so the API server lets the forbidden feature set through) is reported
/// NonCompliant, naming the guard, within one round of the canaries; once it denies again,
/// Compliant again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_that_stops_denying_its_canary_is_named_noncompliant() {
    use hcp_fleet_render::hosted::canary::RBAC_NAME;
    let mut cfg = through_the_service();
    cfg.probe_interval_seconds = 5;
    let (_, round) = canary_round(&cfg);
    let bed = bed(cfg).await;
    let hosted = hc1_admin(&bed).await;
    // A round in, every guard has been tried: the canaries' RBAC is there, and the service
    // answered the canaries of the guards that could be tried here (the test bed has no SCCs
    // and no ingress configuration to delete: those are not tried).
    let tried = [
        "protected-rbac.hcp-fleet.openshift.io",
        "featuregate.hcp-fleet.openshift.io",
        "identity-groups.hcp-fleet.openshift.io",
        "identity-namespaces.hcp-fleet.openshift.io",
    ];
    let before: Vec<f64> = requests_of(&bed, &tried).await;
    eventually("every canary sent", round * 2, || async {
        let now: Vec<f64> = requests_of(&bed, &tried).await;
        let rbac = Api::<ClusterRole>::all(hosted.clone())
            .get_opt(RBAC_NAME)
            .await;
        match (now.iter().zip(&before).all(|(n, b)| n > b), rbac) {
            (true, Ok(Some(_))) => Ok(()),
            other => Err(format!("{now:?} {other:?}")),
        }
    })
    .await;
    let (c, m) = newest(&bed.mgmt, "e2e-probe").await;
    assert_eq!(c.as_deref(), Some("Compliant"), "{m}");

    // The tenant's mutation: the featuregate guard sees no forbidden feature set any more.
    // It removes every FeatureGate's feature set on its way in: the guard never sees the
    // forbidden one, so it denies nothing.
    let (mutator, _dir, mapi) = install_tenant_mutator(
        &hosted,
        "tenant-feature-set",
        serde_json::json!([{"operations": ["CREATE"], "apiGroups": ["config.openshift.io"], "apiVersions": ["v1"], "resources": ["featuregates"]}]),
        |_| serde_json::json!([{"op": "remove", "path": "/spec/featureSet"}]),
    )
    .await;
    let t0 = Instant::now();
    eventually(
        "e2e-probe NonCompliant, naming the featuregate guard",
        round * 2,
        || async {
            match newest(&bed.mgmt, "e2e-probe").await {
                (Some(c), m)
                    if c == "NonCompliant"
                        && m.contains(
                            "guard featuregate.hcp-fleet.openshift.io did not deny its canary",
                        )
                        && m.contains("let through") =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let named = t0.elapsed();
    assert!(
        named <= round + Duration::from_secs(5),
        "named after {named:?} (a round: {round:?})"
    );

    mapi.delete("tenant-feature-set", &DeleteParams::default())
        .await
        .expect("delete the mutation");
    mutator.abort();
    eventually("e2e-probe Compliant again", round * 2, || async {
        match newest(&bed.mgmt, "e2e-probe").await {
            (Some(c), m) if c == "Compliant" => Ok(m),
            other => Err(format!("{other:?}")),
        }
        .map(|_| ())
    })
    .await;
    eprintln!(
        "a guard letting its canary through named NonCompliant after {named:?} (round {round:?})"
    );
}

/// A mutation's canary (`guards::canary`, a dry-run create in `default`) counts only with the
/// admission service's proof of its nonce and the guard's change on the object the server
/// returns. A tenant's mutating webhook, called after the agent's, that strips the Service tag
/// from every Service gets the Service-tag guard named NonCompliant ("came back without its
/// change": the proof was there, through the real server); one that strips the proof from
/// pods gets the pod image spec guard named ("without the admission service's proof"). Each
/// is Compliant again once the tenant's webhook goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutation_undone_on_its_canary_is_named_noncompliant() {
    use hcp_fleet_guards::canary::PROOF_ANNOTATION;
    use hcp_fleet_guards::service_tags::TAGS_ANNOTATION;
    let mut cfg = through_the_service();
    cfg.probe_interval_seconds = 5;
    // The validating guards warn (they have no canary then), so a round is the mutations'
    // two canaries and the probe's: 15 s, not 50.
    for w in &mut cfg.webhooks {
        let kind = hcp_fleet_guards::for_path(&w.path).map(|g| g.row().definition().kind);
        if kind == Some(hcp_fleet_guards::catalogue::WebhookKind::Validating) {
            w.mode = Mode::Warn;
        }
    }
    let (planned, round) = canary_round(&cfg);
    assert_eq!(planned, 2, "the mutations' canaries alone");
    let bed = bed(cfg).await;
    let hosted = hc1_admin(&bed).await;
    let mutations = [
        "service-tags.hcp-fleet.openshift.io",
        "pod-image-spec.hcp-fleet.openshift.io",
    ];
    let before: Vec<f64> = requests_of(&bed, &mutations).await;
    eventually("the mutations' canaries sent", round * 2, || async {
        let now: Vec<f64> = requests_of(&bed, &mutations).await;
        if now.iter().zip(&before).all(|(n, b)| n > b) {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    // Both canaries proven: Compliant.
    let (c, m) = newest(&bed.mgmt, "e2e-probe").await;
    assert_eq!(c.as_deref(), Some("Compliant"), "{m}");

    fn strip(object: &serde_json::Value, key: &str) -> serde_json::Value {
        let escaped = key.replace('~', "~0").replace('/', "~1");
        match object["metadata"]["annotations"].get(key) {
            Some(_) => {
                serde_json::json!([{"op": "remove", "path": format!("/metadata/annotations/{escaped}")}])
            }
            None => serde_json::json!([]),
        }
    }
    /// The tenant's configuration name, the resource it mutates, its patch, and how the
    /// record names the guard it undoes.
    type Undoing = (&'static str, &'static str, Patcher, &'static str);
    type Patcher = fn(&serde_json::Value) -> serde_json::Value;
    let cases: [Undoing; 2] = [
        (
            "tenant-untag",
            "services",
            |o| strip(o, TAGS_ANNOTATION),
            "guard service-tags.hcp-fleet.openshift.io ran on its canary",
        ),
        (
            "tenant-unprove",
            "pods",
            |o| strip(o, PROOF_ANNOTATION),
            "guard pod-image-spec.hcp-fleet.openshift.io did not act on its canary",
        ),
    ];
    for (name, resource, patch, named) in cases {
        let rules = serde_json::json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": [resource]}]);
        let (mutator, _dir, mapi) = install_tenant_mutator(&hosted, name, rules, patch).await;
        let t0 = Instant::now();
        eventually(
            &format!("e2e-probe NonCompliant: {named}"),
            round * 2,
            || async {
                match newest(&bed.mgmt, "e2e-probe").await {
                    (Some(c), m) if c == "NonCompliant" && m.contains(named) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        let took = t0.elapsed();
        assert!(
            took <= round + Duration::from_secs(5),
            "{name}: named after {took:?} (a round: {round:?})"
        );
        mapi.delete(name, &DeleteParams::default())
            .await
            .expect("delete the mutation");
        mutator.abort();
        eventually("e2e-probe Compliant again", round * 2, || async {
            match newest(&bed.mgmt, "e2e-probe").await {
                (Some(c), _) if c == "Compliant" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        eprintln!(
            "{name}: the mutation's guard named NonCompliant after {took:?} (round {round:?})"
        );
    }
}

/// The annotation the tenant's renaming mutation reads the new name from.
const RENAME_TO: &str = "tenant.example.com/rename-to";

/// A hosted cluster's admin gets nothing through by the forms a kubectl user rarely types,
/// on either engine: a collection delete (the API server sends the guards one DELETE per
/// object with no name in the request) is denied for each protected object in it, and a
/// mutating webhook of the tenant's own that renames an object on its way in (a Group into
/// an exempt one, a namespace into a reserved one) is judged by the name that would be
/// stored, not the one the client asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collection_deletes_and_a_tenants_renaming_are_judged_as_stored() {
    for engine in [GuardEngine::Webhook, GuardEngine::Policy] {
        if engine == GuardEngine::Policy
            && !support::serves(
                &hcp_fleet_testbed::Assets::resolve(None)
                    .expect("assets")
                    .version,
                Feature::AdmissionPolicies,
                "collection deletes and renaming mutations through the admission policies (the webhooks judged them above)",
            )
        {
            continue;
        }
        let bed = bed(with_engine(engine)).await;
        let hosted = hc1_admin(&bed).await;
        let by = |guard: &str| match engine {
            GuardEngine::Policy => format!(
                "ValidatingAdmissionPolicy '{guard}' with binding '{guard}' denied request: hcp-fleet:"
            ),
            _ => format!("admission webhook \"{guard}\" denied the request: hcp-fleet:"),
        };
        // An exempt Group to delete.
        let group = |name: &str, annotations: serde_json::Value| {
            serde_json::json!({
                "apiVersion": "user.openshift.io/v1", "kind": "Group",
                "metadata": {"name": name, "annotations": annotations}, "users": [],
            })
        };
        let (ok, out) = kubectl_stdin(
            &bed,
            &["apply", "-f", "-"],
            &group("osd-sre-admins", serde_json::json!({})).to_string(),
        );
        assert!(ok, "the exempt Group: {out}");

        // Collection deletes, by field selector, as a tenant would send them.
        for (path, guard, named) in [
            (
                "/apis/rbac.authorization.k8s.io/v1/clusterroles?fieldSelector=metadata.name%3Dcluster-admin&dryRun=All",
                "protected-rbac.hcp-fleet.openshift.io",
                "ClusterRole \"cluster-admin\"",
            ),
            (
                "/apis/user.openshift.io/v1/groups?fieldSelector=metadata.name%3Dosd-sre-admins&dryRun=All",
                "identity-groups.hcp-fleet.openshift.io",
                "Group \"osd-sre-admins\"",
            ),
        ] {
            let (ok, out) = kubectl(&bed, &["--as=alice", "delete", "--raw", path]);
            assert!(
                !ok && out.contains(&by(guard)) && out.contains(named),
                "{engine:?}: a collection delete of {named}: {out}"
            );
        }

        // The tenant's renaming mutation, on Groups and namespaces.
        let (mutator, _dir, mapi) = install_tenant_mutator(
            &hosted,
            "tenant-renamer",
            serde_json::json!([
                {"operations": ["CREATE"], "apiGroups": ["user.openshift.io"], "apiVersions": ["v1"], "resources": ["groups"]},
                {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces"]},
            ]),
            |object| match object["metadata"]["annotations"][RENAME_TO].as_str() {
                Some(to) => serde_json::json!([{"op": "replace", "path": "/metadata/name", "value": to}]),
                None => serde_json::json!([]),
            },
        )
        .await;
        // The mutation is real: an exempt identity's object comes out renamed.
        eventually(
            "the tenant's mutation renames",
            Duration::from_secs(20),
            || async {
                let (ok, out) = kubectl_stdin(
                    &bed,
                    &["create", "--dry-run=server", "-o", "name", "-f", "-"],
                    &group("team-b", serde_json::json!({RENAME_TO: "renamed-b"})).to_string(),
                );
                if ok && out.contains("renamed-b") {
                    Ok(())
                } else {
                    Err(out)
                }
            },
        )
        .await;
        let renamed = [
            (
                group(
                    "team-a",
                    serde_json::json!({RENAME_TO: "osd-sre-cluster-admins"}),
                ),
                "identity-groups.hcp-fleet.openshift.io",
                "Group \"osd-sre-cluster-admins\"",
            ),
            (
                serde_json::json!({
                    "apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": "team-z", "annotations": {RENAME_TO: "openshift-evil"}},
                }),
                "identity-namespaces.hcp-fleet.openshift.io",
                "namespace \"openshift-evil\"",
            ),
        ];
        for (object, guard, named) in renamed {
            let (ok, out) = kubectl_stdin(
                &bed,
                &["--as=alice", "create", "--dry-run=server", "-f", "-"],
                &object.to_string(),
            );
            assert!(
                !ok && out.contains(&by(guard)) && out.contains(named),
                "{engine:?}: created under another name, renamed to {named} by the tenant: {out}"
            );
        }
        mapi.delete("tenant-renamer", &Default::default())
            .await
            .expect("delete the renaming webhook");
        mutator.abort();
    }
}

/// Where the Service tag is a mutating policy (1.36), a tenant's mutating webhook that strips
/// the tag from every Service does not keep it off: the policy's `reinvocationPolicy: IfNeeded`
/// has the API server run it again once the webhook changed the object, and the Service comes
/// back tagged. (On a webhook, `reinvocationPolicy: Never` as MCVW's, the tenant's webhook
/// wins, and the canary names the guard: `a_mutation_undone_on_its_canary_is_named_noncompliant`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_webhook_cannot_untag_a_service_its_mutating_policy_tags() {
    use hcp_fleet_guards::service_tags::{ROW, TAG, TAGS_ANNOTATION};
    use k8s_openapi::api::core::v1::Service;
    let assets = hcp_fleet_testbed::Assets::resolve(None).expect("assets");
    if !support::serves(
        &assets.version,
        Feature::MutatingPolicies,
        "a tenant's webhook against the Service tag's mutating policy",
    ) {
        return;
    }
    let bed = bed(AgentConfig::default()).await;
    let hosted = hc1_admin(&bed).await;
    assert!(
        support::mutating_policy_exists(&hosted, ROW.name)
            .await
            .expect("get")
    );
    // Strips the tag, and marks what it saw, so the test knows the webhook ran.
    fn untag(object: &serde_json::Value) -> serde_json::Value {
        let escaped = TAGS_ANNOTATION.replace('~', "~0").replace('/', "~1");
        let annotations = &object["metadata"]["annotations"];
        if !annotations.is_object() {
            return serde_json::json!([{"op": "add", "path": "/metadata/annotations", "value": {SEEN: "yes"}}]);
        }
        let mut ops = vec![
            serde_json::json!({"op": "add", "path": "/metadata/annotations/tenant.example.com~1seen", "value": "yes"}),
        ];
        if annotations.get(TAGS_ANNOTATION).is_some() {
            ops.push(serde_json::json!({"op": "remove", "path": format!("/metadata/annotations/{escaped}")}));
        }
        serde_json::Value::Array(ops)
    }
    const SEEN: &str = "tenant.example.com/seen";
    let rules = serde_json::json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["services"]}]);
    let (mutator, _dir, mapi) = install_tenant_mutator(&hosted, "tenant-untag", rules, untag).await;
    let svc = support::load_balancer("lb", serde_json::Value::Null);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let services = Api::<Service>::namespaced(hosted.clone(), "default");
    // Once the tenant's webhook is in force (its mark on the answer), the answer is tagged
    // all the same: the policy ran again after it.
    let mut seen = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen < 3 {
        assert!(Instant::now() < deadline, "the tenant's webhook never ran");
        let created = services.create(&dry, &svc).await.expect("dry-run create");
        let a = created.metadata.annotations.unwrap_or_default();
        if a.contains_key(SEEN) {
            seen += 1;
            assert_eq!(
                a.get(TAGS_ANNOTATION).map(String::as_str),
                Some(TAG),
                "the tenant's webhook stripped the tag for good: {a:?}"
            );
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    mapi.delete("tenant-untag", &DeleteParams::default())
        .await
        .expect("delete the tenant's webhook");
    mutator.abort();
}
