//! The agent's exemptions in CEL, as the hosted kube-apiserver evaluates them: shared by the
//! webhooks' `matchConditions` and the admission policies, so both engines exempt alike. The
//! CEL literals themselves are the guards' (`guards::cel`).

use serde_json::{Value, json};

use hcp_fleet_guards::cel::list;

use hcp_fleet_guards::cel::matches_any;
use hcp_fleet_guards::{Scope, Settings};

/// The exemptions of the admission service (`admission.exemptUsers`, `exemptGroups`,
/// `exemptNamespaces`) as `matchConditions`: every one must hold for a guard to judge the
/// request, so each says "not exempt this way". The same rules the service applies
/// (`hcp_fleet_webhook::decision`), evaluated by the API server instead.
///
/// `scope` says which apply: the identity guards leave out the namespaces, the probe all. From
/// the same `Settings` the service and the guards read, so the engines exempt from one value.
pub(crate) fn conditions(a: &Settings, scope: Scope) -> Vec<Value> {
    let mut out = Vec::new();
    if scope == Scope::Everyone {
        return out;
    }
    if let Some(user) = matches_any("request.userInfo.username", &a.exempt_users) {
        out.push(json!({"name": "not-an-exempt-user", "expression": format!("!({user})")}));
    }
    if !a.exempt_groups.is_empty() {
        out.push(json!({
            "name": "not-in-an-exempt-group",
            "expression": format!(
                "!(has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in {}))",
                list(&a.exempt_groups)
            ),
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
            exempt_users: vec![
                "system:admin".into(),
                "system:serviceaccount:hypershift:*".into(),
            ],
            exempt_groups: vec!["system:masters".into()],
            exempt_namespaces: vec!["kube-*".into(), "default".into(), "it's".into()],
            ..Default::default()
        };
        let c = conditions(&a, Scope::Workloads);
        assert_eq!(conditions(&a, Scope::Identities), c[..2]);
        assert!(conditions(&a, Scope::Everyone).is_empty());
        assert_eq!(
            c[0]["expression"],
            "!(request.userInfo.username in ['system:admin'] || request.userInfo.username.startsWith('system:serviceaccount:hypershift:'))"
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
        a.exempt_users.clear();
        a.exempt_groups.clear();
        a.exempt_namespaces.clear();
        assert!(conditions(&a, Scope::Workloads).is_empty());
    }
}
