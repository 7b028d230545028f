//! CEL, as the hosted kube-apiserver evaluates it: literals, name patterns, the agent's
//! exemptions and the guards' messages. Shared by the webhooks' `matchConditions` and the
//! admission policies, so both engines say the same thing.

use serde_json::{Value, json};

use crate::catalogue::denial::{Piece, pieces};
use crate::config::AdmissionConfig;
use crate::guards::Scope;

/// A CEL string literal.
pub fn string(s: &str) -> String {
    let escaped = s
        .replace('\\', "\\\\")
        .replace('\'', "\\'")
        .replace('\n', "\\n")
        .replace('\r', "\\r");
    format!("'{escaped}'")
}

/// A CEL list of string literals.
pub fn list<S: AsRef<str>>(items: &[S]) -> String {
    let items: Vec<String> = items.iter().map(|s| string(s.as_ref())).collect();
    format!("[{}]", items.join(", "))
}

/// `value` matches one of `patterns` (exact names, or prefixes ending in '*'), in CEL; `None`
/// when there is no pattern (nothing matches).
pub fn matches_any(value: &str, patterns: &[String]) -> Option<String> {
    let exact: Vec<&String> = patterns.iter().filter(|p| !p.ends_with('*')).collect();
    let mut terms: Vec<String> = Vec::new();
    if !exact.is_empty() {
        terms.push(format!("{value} in {}", list(&exact)));
    }
    terms.extend(
        patterns
            .iter()
            .filter_map(|p| p.strip_suffix('*'))
            .map(|prefix| format!("{value}.startsWith({})", string(prefix))),
    );
    (!terms.is_empty()).then(|| terms.join(" || "))
}

/// A denial template (`catalogue::denial`) as a CEL string expression, each placeholder
/// replaced by the CEL expression `values` gives for it. A placeholder without one stays
/// literal text, as `denial::fill` leaves it.
pub fn message(template: &str, values: &[(&str, &str)]) -> String {
    let parts: Vec<String> = pieces(template)
        .into_iter()
        .map(|p| match p {
            Piece::Text(t) => string(t),
            Piece::Value(k) => match values.iter().find(|(key, _)| *key == k) {
                Some((_, expr)) => format!("({expr})"),
                None => string(&format!("{{{k}}}")),
            },
        })
        .collect();
    if parts.is_empty() {
        string("")
    } else {
        parts.join(" + ")
    }
}

/// The exemptions of the admission service (`admission.exemptUsers`, `exemptGroups`,
/// `exemptNamespaces`) as `matchConditions`: every one must hold for a guard to judge the
/// request, so each says "not exempt this way". The same rules the service applies
/// (`admission::policies`), evaluated by the API server instead.
///
/// `scope` says which apply: the identity guards leave out the namespaces, the probe all.
pub(crate) fn exemption_conditions(a: &AdmissionConfig, scope: Scope) -> Vec<Value> {
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
    fn exemption_conditions_say_what_the_service_exempts() {
        let mut a = AdmissionConfig {
            exempt_users: vec![
                "system:admin".into(),
                "system:serviceaccount:hypershift:*".into(),
            ],
            exempt_groups: vec!["system:masters".into()],
            exempt_namespaces: vec!["kube-*".into(), "default".into(), "it's".into()],
            ..Default::default()
        };
        let c = exemption_conditions(&a, Scope::Workloads);
        assert_eq!(exemption_conditions(&a, Scope::Identities), c[..2]);
        assert!(exemption_conditions(&a, Scope::Everyone).is_empty());
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
        assert!(exemption_conditions(&a, Scope::Workloads).is_empty());
    }

    #[test]
    fn literals_are_escaped() {
        assert_eq!(string("it's a \\ \n"), "'it\\'s a \\\\ \\n'");
        assert_eq!(list(&["a", "b"]), "['a', 'b']");
    }

    #[test]
    fn a_message_is_the_template_with_values_as_expressions() {
        assert_eq!(
            message("x {a} y {b}", &[("a", "request.name")]),
            "'x ' + (request.name) + ' y ' + '{b}'"
        );
        assert_eq!(message("plain", &[]), "'plain'");
    }
}
