//! What the canaries need in a hosted cluster (`guards::canary`): the RBAC that lets the canary
//! user send each request as far as admission (a request RBAC refuses never reaches a guard),
//! and each request as the agent sends it, impersonating that user.
//!
//! The RBAC grants exactly the canaries' verbs on their resources (a delete only on the one
//! object named). It is written when a canary is refused by RBAC, not at every reconcile, so a
//! steady fleet pays nothing for it; the uninstall removes it with the agent's other objects.

use serde_json::{Value, json};

use super::objects::owned_metadata;
use hcp_fleet_guards::canary::{CANARY_GROUP, CANARY_USER, Canary, NONCE_EXTRA, Verb};

/// The ClusterRole's and the ClusterRoleBinding's name.
pub const RBAC_NAME: &str = "hcp-fleet-canary";

/// The ClusterRole granting the canaries' requests, and its binding to `CANARY_USER`.
pub fn rbac(canaries: &[&Canary], hcp_namespace: &str) -> (Value, Value) {
    let mut rules: Vec<Value> = canaries
        .iter()
        .map(|c| {
            let mut r = json!({
                "apiGroups": [c.group],
                "resources": [c.resource],
                "verbs": [c.verb.as_str()],
            });
            // RBAC cannot limit a create by name.
            if c.verb == Verb::Delete {
                r["resourceNames"] = json!([c.name]);
            }
            r
        })
        .collect();
    rules.sort_by_key(Value::to_string);
    rules.dedup();
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": owned_metadata(RBAC_NAME, hcp_namespace),
        "rules": rules,
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": owned_metadata(RBAC_NAME, hcp_namespace),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": RBAC_NAME},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": CANARY_USER}],
    });
    (role, binding)
}

/// The canary's dry-run request as `CANARY_USER`, carrying `nonce` in the user's extra.
pub fn request(c: &Canary, nonce: &str) -> Result<http::Request<Vec<u8>>, http::Error> {
    let (method, body) = match c.verb {
        Verb::Create => (
            http::Method::POST,
            c.object.as_ref().map(Value::to_string).unwrap_or_default(),
        ),
        Verb::Delete => (
            http::Method::DELETE,
            json!({"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]}).to_string(),
        ),
    };
    http::Request::builder()
        .method(method)
        .uri(c.path())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header("Impersonate-User", CANARY_USER)
        .header("Impersonate-Group", CANARY_GROUP)
        .header(format!("Impersonate-Extra-{NONCE_EXTRA}"), nonce)
        .body(body.into_bytes())
}

/// Whether an API error is RBAC refusing the canary user (so the RBAC is missing or was
/// changed), rather than a guard's denial.
pub fn refused_by_rbac(status: &kube::core::Status) -> bool {
    status.code == 403
        && status
            .message
            .contains(&format!("User \"{CANARY_USER}\" cannot"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AgentConfig;
    use hcp_fleet_guards::canary::GENERATED_NAME;
    use hcp_fleet_guards::{ALL, Settings};

    #[test]
    fn the_rbac_grants_exactly_the_canaries_requests() {
        let a = Settings::from(&AgentConfig::default());
        let canaries: Vec<Canary> = ALL.iter().filter_map(|g| g.canary(&a)).collect();
        let refs: Vec<&Canary> = canaries.iter().collect();
        let (role, binding) = rbac(&refs, "clusters-a");
        let rules = role["rules"].as_array().expect("rules");
        assert_eq!(rules.len(), canaries.len());
        for c in &canaries {
            assert!(
                rules.iter().any(|r| r["apiGroups"] == json!([c.group])
                    && r["resources"] == json!([c.resource])
                    && r["verbs"] == json!([c.verb.as_str()])
                    && (c.verb == Verb::Create || r["resourceNames"] == json!([c.name]))),
                "{c:?}"
            );
        }
        // No wildcard, no verb beyond the canaries' two.
        let text = role.to_string();
        assert!(!text.contains("\"*\""), "{text}");
        for r in rules {
            let v = r["verbs"][0].as_str().unwrap_or_default();
            assert!(v == "create" || v == "delete", "{r}");
        }
        assert_eq!(binding["subjects"][0]["name"], CANARY_USER);
        assert_eq!(binding["roleRef"]["name"], RBAC_NAME);
        assert_eq!(
            role["metadata"]["labels"][crate::hosted::objects::OWNED_LABEL],
            "true"
        );
    }

    #[test]
    fn a_canary_request_impersonates_the_canary_user_with_its_nonce() {
        let a = Settings::from(&AgentConfig::default());
        for c in ALL.iter().filter_map(|g| g.canary(&a)) {
            let r = request(&c, "00ff").expect("request");
            let h = |k: &str| {
                r.headers()
                    .get(k)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            assert_eq!(h("impersonate-user").as_deref(), Some(CANARY_USER));
            assert_eq!(h("impersonate-group").as_deref(), Some(CANARY_GROUP));
            assert_eq!(
                h(&format!("impersonate-extra-{NONCE_EXTRA}")).as_deref(),
                Some("00ff")
            );
            assert!(r.uri().to_string().ends_with("?dryRun=All"));
            let body: Value = serde_json::from_slice(r.body()).expect("json body");
            match c.verb {
                // A mutation's canary is named by the server (`generateName`), in `default`.
                Verb::Create if c.mutates() => {
                    assert_eq!(body["metadata"]["generateName"], json!(GENERATED_NAME));
                    assert_eq!(body["metadata"].get("name"), None);
                    assert!(r.uri().path().starts_with("/api/v1/namespaces/default/"));
                }
                Verb::Create => assert_eq!(body["metadata"]["name"], json!(c.name)),
                Verb::Delete => assert_eq!(body["dryRun"], json!(["All"])),
            }
        }
    }
}

#[cfg(test)]
mod guard_canaries {
    //! Which guards have a canary under the agent's default configuration (the guards' own
    //! crate knows no configuration).
    use crate::config::AgentConfig;
    use hcp_fleet_guards::{ALL, Settings};

    /// Every guard that denies something under the default configuration has a canary, but
    /// those that cannot be tried without a namespace or an object the cluster may lack.
    #[test]
    fn the_guards_with_canaries_are_the_ones_expected() {
        let a = Settings::from(&AgentConfig::default());
        let with: Vec<&str> = ALL
            .iter()
            .filter(|g| g.canary(&a).is_some())
            .map(|g| g.row().name)
            .collect();
        assert_eq!(
            with,
            [
                "protected-rbac.hcp-fleet.openshift.io",
                "featuregate.hcp-fleet.openshift.io",
                "scc.hcp-fleet.openshift.io",
                "ingress-config.hcp-fleet.openshift.io",
                "platform-config.hcp-fleet.openshift.io",
                "identity-groups.hcp-fleet.openshift.io",
                "identity-namespaces.hcp-fleet.openshift.io",
                "service-tags.hcp-fleet.openshift.io",
                "pod-image-spec.hcp-fleet.openshift.io",
            ]
        );
        let paths: Vec<String> = ALL
            .iter()
            .filter_map(|g| g.canary(&a))
            .map(|c| c.path())
            .collect();
        assert!(
            paths.iter().all(|p| p.ends_with("?dryRun=All")),
            "{paths:?}"
        );
        assert!(paths.contains(
            &"/apis/rbac.authorization.k8s.io/v1/clusterroles/cluster-admin?dryRun=All".to_string()
        ));
        assert!(paths.contains(&"/api/v1/namespaces?dryRun=All".to_string()));
        assert!(paths.contains(&"/api/v1/namespaces/default/services?dryRun=All".to_string()));
        assert!(paths.contains(&"/api/v1/namespaces/default/pods?dryRun=All".to_string()));
    }

    /// A configuration whose exemptions leave no name to try gives no canary, not a wrong one.
    #[test]
    fn no_canary_without_a_name_to_try() {
        let mut a = Settings::from(&AgentConfig::default());
        a.exempt_groups = vec!["system:masters".into()];
        a.exempt_namespaces = vec!["default".into()];
        a.exempt_users.clear();
        let g = |name: &str| ALL.iter().find(|g| g.row().name == name).expect("guard");
        assert_eq!(g("identity-groups.hcp-fleet.openshift.io").canary(&a), None);
        assert_eq!(
            g("identity-namespaces.hcp-fleet.openshift.io").canary(&a),
            None
        );
    }

    /// docs/admission.md's canary table names exactly the guards that have a canary.
    #[test]
    fn the_admission_doc_lists_every_canary() {
        let doc = include_str!("../../../../docs/admission.md");
        let section = doc
            .split("## Canaries")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("a Canaries section");
        let rows: Vec<&str> = section
            .lines()
            .filter_map(|l| l.strip_prefix("| "))
            .filter_map(|l| l.split(" |").next())
            .filter(|n| n.ends_with(".hcp-fleet.openshift.io"))
            .collect();
        let a = Settings::from(&AgentConfig::default());
        let with: Vec<&str> = ALL
            .iter()
            .filter(|g| g.canary(&a).is_some())
            .map(|g| g.row().name)
            .collect();
        assert_eq!(rows, with);
    }
}
