//! Which path the guards take, and what the agent keeps for them: the objects it keeps in a
//! hosted cluster (`Kept`, the drift the tests make), the admission service's objects on the
//! management side, and the configurations that route every guard through the service.

/// One object the agent keeps in a hosted cluster: its validating webhook configuration
/// where a guard takes the webhook path, else (every guard inside the hosted kube-apiserver,
/// 1.36 with the defaults) protected RBAC's ValidatingAdmissionPolicy.
#[derive(Clone)]
pub struct Kept {
    api: kube::Api<kube::api::DynamicObject>,
    pub name: String,
}

impl Kept {
    /// The agent's validating configuration in `hosted`, if it has one, else protected RBAC's
    /// policy.
    pub async fn validating(hosted: kube::Client) -> Kept {
        use hcp_fleet_render::hosted::webhooks::VALIDATING_NAME;
        use kube::core::{ApiResource, GroupVersionKind};
        let resource = |kind: &str, plural: &str| {
            ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
                plural,
            )
        };
        let hooks = kube::Api::<kube::api::DynamicObject>::all_with(
            hosted.clone(),
            &resource(
                "ValidatingWebhookConfiguration",
                "validatingwebhookconfigurations",
            ),
        );
        if hooks
            .get_opt(VALIDATING_NAME)
            .await
            .expect("the agent's configuration")
            .is_some()
        {
            return Kept {
                api: hooks,
                name: VALIDATING_NAME.into(),
            };
        }
        Kept {
            api: kube::Api::all_with(
                hosted,
                &resource("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
            ),
            name: hcp_fleet_guards::protected_rbac::ROW.name.into(),
        }
    }

    /// Ok once it exists (again).
    pub fn present(&self) -> impl std::future::Future<Output = Result<(), String>> + use<> {
        let (api, name) = (self.api.clone(), self.name.clone());
        async move {
            api.get(&name)
                .await
                .map(|_| ())
                .map_err(|e| format!("{name}: {e}"))
        }
    }

    /// Whether it is gone (a failed read says no).
    pub async fn is_gone(&self) -> bool {
        matches!(self.api.get_opt(&self.name).await, Ok(None))
    }

    /// Whether it is there (a failed read says no).
    pub async fn is_present(&self) -> bool {
        matches!(self.api.get_opt(&self.name).await, Ok(Some(_)))
    }

    /// Its annotation `key`, as the server has it now.
    pub async fn annotation(&self, key: &str) -> Option<String> {
        self.api
            .get(&self.name)
            .await
            .expect("the agent's object")
            .metadata
            .annotations
            .and_then(|mut a| a.remove(key))
    }

    /// A merge patch, as the hosted cluster's admins send one.
    pub async fn patch(&self, patch: serde_json::Value) {
        self.api
            .patch(
                &self.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(patch),
            )
            .await
            .expect("patched");
    }

    pub async fn delete(&self) {
        self.api
            .delete(&self.name, &Default::default())
            .await
            .expect("delete");
    }
}

/// Drift, as someone in the hosted cluster makes it: deletes what the agent keeps there
/// (`Kept::validating`) in `cluster`, and returns it to see whether it comes back.
pub async fn delete_validating(fleet: &hcp_fleet_testbed::LocalFleet, cluster: &str) -> Kept {
    let hosted = fleet
        .hosted(cluster)
        .expect("hosted cluster")
        .client()
        .await
        .expect("client");
    let kept = Kept::validating(hosted).await;
    kept.delete().await;
    kept
}

/// The admission service's objects that exist in the HCP namespace `ns` (kind and name):
/// its Deployment, Service, ServiceAccount, NetworkPolicy, PodDisruptionBudget (policy/v1,
/// where served), ServiceMonitor (where its CRD is installed), the Secrets of its CA and
/// serving certificate, and the ConfigMap of the pod image spec mutation. Empty for an HCP
/// whose every guard runs inside its hosted kube-apiserver.
pub async fn admission_objects(mgmt: &kube::Client, ns: &str) -> Vec<String> {
    use hcp_fleet_render::management;
    use kube::api::DynamicObject;
    use kube::core::{ApiResource, GroupVersionKind};
    let cfg = hcp_fleet_render::config::AgentConfig::default();
    let svc = cfg.admission.service_name.clone();
    // (group, kind, plural, name), each at v1.
    let objects = [
        ("apps", "Deployment", "deployments", svc.clone()),
        ("", "Service", "services", svc.clone()),
        ("", "ServiceAccount", "serviceaccounts", svc.clone()),
        (
            "networking.k8s.io",
            "NetworkPolicy",
            "networkpolicies",
            svc.clone(),
        ),
        (
            "policy",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            svc.clone(),
        ),
        (
            "monitoring.coreos.com",
            "ServiceMonitor",
            "servicemonitors",
            svc,
        ),
        ("", "Secret", "secrets", management::ca_secret_name(&cfg)),
        ("", "Secret", "secrets", management::tls_secret_name(&cfg)),
        (
            "",
            "ConfigMap",
            "configmaps",
            hcp_fleet_render::internal_registry::CONFIG_MAP.to_string(),
        ),
    ];
    let mut there = Vec::new();
    for (group, kind, plural, name) in objects {
        let api = kube::Api::<DynamicObject>::namespaced_with(
            mgmt.clone(),
            ns,
            &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", kind), plural),
        );
        let found = match api.get_opt(&name).await {
            Ok(found) => found.is_some(),
            // A kind the server does not serve: a 404 that is no Status.
            Err(kube::Error::Api(e)) if e.code == 404 => false,
            Err(e) => panic!("read {kind} {name}: {e}"),
        };
        if found {
            there.push(format!("{kind} {name}"));
        }
    }
    there
}

/// What the agent installs in a hosted cluster with the default configuration, as the renderer
/// renders it for a server of `version` (no internal registry read: the pod image spec
/// mutation's policy is not among them): the webhook configurations where a guard takes the
/// webhook path (before 1.36: all of them), the policies and bindings where they are served,
/// each set with its probe's.
pub fn default_hosted_objects(version: &hcp_fleet_testbed::assets::KubeVersion) -> usize {
    hosted_objects(&hcp_fleet_render::config::AgentConfig::default(), version)
}

/// `default_hosted_objects` under `cfg`.
pub fn hosted_objects(
    cfg: &hcp_fleet_render::config::AgentConfig,
    version: &hcp_fleet_testbed::assets::KubeVersion,
) -> usize {
    use hcp_fleet_render::hosted::objects::HostedFeatures;
    use hcp_fleet_testbed::assets::Feature;
    let features = HostedFeatures {
        match_conditions: version.serves(Feature::MatchConditions),
        admission_policies: version.serves(Feature::AdmissionPolicies),
        mutating_policies: version.serves(Feature::MutatingPolicies),
        static_guards: false,
        static_mutating: false,
        static_offered: false,
    };
    let r =
        hcp_fleet_render::hosted::webhooks::render(cfg, "ns", "https://x", "CA", features, None)
            .expect("the default rendering");
    let p = &r.policies;
    usize::from(r.validating.is_some())
        + usize::from(r.mutating.is_some())
        + p.policies.len()
        + p.bindings.len()
        + p.mutating.len()
        + p.mutating_bindings.len()
}

/// The default configuration with every guard on its webhook, so that every guarded request
/// calls the admission service: for the tests whose subject is the service (its objects, its
/// rollouts, its metrics, its certificates). With the defaults a 1.36 hosted cluster needs no
/// service at all (docs/configuration.md).
pub fn through_the_service() -> hcp_fleet_render::config::AgentConfig {
    let mut cfg = hcp_fleet_render::config::AgentConfig::default();
    for w in &mut cfg.webhooks {
        w.engine = hcp_fleet_guards::catalogue::GuardEngine::Webhook;
    }
    cfg
}

/// `through_the_service` as the test bed's agent configuration file
/// (`hcp_fleet_testbed::agent_config_yaml`), for spawned agents.
pub fn through_the_service_yaml() -> String {
    // JSON is YAML: the entries as the configuration's own types write them.
    let hooks = serde_json::to_string(&through_the_service().webhooks).expect("json");
    format!(
        "{}webhooks: {hooks}\n",
        hcp_fleet_testbed::agent_config_yaml()
    )
}
