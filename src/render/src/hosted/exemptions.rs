//! The agent's exemptions in CEL, as the hosted kube-apiserver evaluates them: shared by the
//! webhooks' `matchConditions` and the admission policies, so both engines exempt alike. The
//! CEL literals themselves are the guards' (`guards::cel`).

use serde_json::{Value, json};

use hcp_fleet_guards::cel::matches_any;
use hcp_fleet_guards::identities::{in_groups_cel, user_matches_cel};
use hcp_fleet_guards::{Scope, Settings};

/// The exemptions of the guard served on `path` (its identity classes resolved into its
/// hook's users and groups; for the workload guards, `admission.exemptNamespaces` too) as
/// `matchConditions`: every one must hold for a guard to judge the request, so each says "not
/// exempt this way". The same rules the service applies (`hcp_fleet_webhook::decision`),
/// evaluated by the API server instead.
///
/// `scope` says which apply: the identity guards leave out the namespaces, the probe all. From
/// the same `Settings` the service and the guards read, so the engines exempt from one value.
pub(crate) fn conditions(a: &Settings, path: &str, scope: Scope) -> Vec<Value> {
    let mut out = Vec::new();
    if scope == Scope::Everyone {
        return out;
    }
    let (users, groups) = a
        .hook(path)
        .map(|h| (h.exempt_users.as_slice(), h.exempt_groups.as_slice()))
        .unwrap_or_default();
    if let Some(user) = user_matches_cel("request.userInfo.username", users, &a.customer_namespaces)
    {
        out.push(json!({"name": "not-an-exempt-user", "expression": format!("!({user})")}));
    }
    if !groups.is_empty() {
        out.push(json!({
            "name": "not-in-an-exempt-group",
            "expression": format!("!{}", in_groups_cel(groups)),
        }));
    }
    if scope == Scope::Identities {
        return out;
    }
    if let Some(ns) = matches_any("request.namespace", &a.exempt_namespaces) {
        out.push(json!({
            "name": "not-in-an-exempt-namespace",
            "expression": format!("!(has(request.namespace) && ({ns}))"),
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_say_what_the_service_exempts() {
        let mut a = Settings {
            webhooks: vec![hcp_fleet_guards::HookSetting {
                name: "g".into(),
                path: "/g".into(),
                mode: hcp_fleet_model::Mode::Enforce,
                exempt_users: vec![
                    "system:admin".into(),
                    "system:serviceaccount:hypershift:*".into(),
                ],
                exempt_groups: vec!["system:masters".into()],
            }],
            exempt_namespaces: vec!["kube-*".into(), "default".into(), "it's".into()],
            ..Default::default()
        };
        let c = conditions(&a, "/g", Scope::Workloads);
        assert_eq!(conditions(&a, "/g", Scope::Identities), c[..2]);
        assert!(conditions(&a, "/g", Scope::Everyone).is_empty());
        assert_eq!(
            c[0]["expression"],
            "!(request.userInfo.username in ['system:admin'] || (request.userInfo.username.startsWith('system:serviceaccount:hypershift:')))"
        );
        assert_eq!(
            c[1]["expression"],
            "!(has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in ['system:masters']))"
        );
        assert_eq!(
            c[2]["expression"],
            "!(has(request.namespace) && (request.namespace in ['default', 'it\\'s'] || request.namespace.startsWith('kube-')))"
        );
        // Nothing exempt: no condition at all.
        a.webhooks[0].exempt_users.clear();
        a.webhooks[0].exempt_groups.clear();
        a.exempt_namespaces.clear();
        assert!(conditions(&a, "/g", Scope::Workloads).is_empty());
    }
}
