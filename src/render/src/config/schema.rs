//! The agent's guardrails in the chart's values schema (`make chart` writes it), made from the
//! same tables the agent validates with, so `helm install` refuses what the agent would refuse
//! at start.

use super::validate::{BOUNDS, Exempted, MIN_EXEMPT_PREFIX, WEBHOOK_TIMEOUT, exemption_problem};

/// The chart's values schema given the agent's guardrails (`BOUNDS`, `WEBHOOK_TIMEOUT`, the
/// exemption rules), in `AgentConfig`'s schema as schemars makes it (its `$defs` still in
/// place), so `helm install` refuses what the agent would refuse at start.
pub fn add_guardrails(schema: &mut serde_json::Value) {
    use serde_json::json;
    for b in BOUNDS {
        let at = match b.schema_def {
            Some(def) => &mut schema["$defs"][def]["properties"][b.field],
            None => &mut schema["properties"][b.field],
        };
        at["minimum"] = json!(b.min);
        match b.max {
            Some(max) => at["maximum"] = json!(max),
            None => {
                if let Some(o) = at.as_object_mut() {
                    o.remove("maximum");
                }
            }
        }
    }
    let timeout = &mut schema["$defs"]["WebhookDefinition"]["properties"]["timeoutSeconds"];
    timeout["minimum"] = json!(WEBHOOK_TIMEOUT.start());
    timeout["maximum"] = json!(WEBHOOK_TIMEOUT.end());
    // Every list `admission_problems` holds to the exemption guardrails, here as there.
    for (def, field, kind) in [
        ("AdmissionConfig", "exemptUsers", Exempted::User),
        ("AdmissionConfig", "exemptGroups", Exempted::Group),
        ("AdmissionConfig", "exemptNamespaces", Exempted::Namespace),
        ("AdmissionConfig", "customerNamespaces", Exempted::Namespace),
        ("Members", "users", Exempted::User),
        ("Members", "groups", Exempted::Group),
        ("WebhookDefinition", "exemptUsers", Exempted::User),
        ("WebhookDefinition", "exemptGroups", Exempted::Group),
    ] {
        schema["$defs"][def]["properties"][field]["items"] = exemption_schema(kind);
    }
}

/// One exemption entry's schema: `exemption_problem`'s shape as a pattern (no control
/// character, no surrounding space, a `*` only at the end of a prefix long enough, none for
/// groups), and the entries that fit the shape but are refused by name (every service
/// account, the canaries) listed, found by asking `exemption_problem` itself.
pub(crate) fn exemption_schema(kind: Exempted) -> serde_json::Value {
    use hcp_fleet_guards::canary::{CANARY_GROUP, CANARY_USER};
    // RE2 (helm's JSON Schema validator is Go's): `\p{Cc}` is what `char::is_control` is.
    let inner = r"[^*\p{Cc}]";
    let edge = r"[^\s*\p{Cc}]";
    let exact = format!("{edge}(?:{inner}*{edge})?");
    let pattern = match kind {
        Exempted::Group => format!("^{exact}$"),
        _ => format!(
            r"^(?:{exact}|{edge}{inner}{{{},}}\*)$",
            MIN_EXEMPT_PREFIX - 1
        ),
    };
    let named: &[&str] = match kind {
        Exempted::User => &[CANARY_USER, "system:serviceaccount:"],
        Exempted::Group => &[CANARY_GROUP],
        Exempted::Namespace => &[],
    };
    let mut refused: Vec<String> = Vec::new();
    for base in named {
        let mut candidates = vec![base.to_string()];
        candidates.extend(
            base.char_indices()
                .map(|(i, _)| format!("{}*", &base[..i]))
                .chain([format!("{base}*")]),
        );
        for c in candidates {
            if c.chars().count() > MIN_EXEMPT_PREFIX
                && exemption_problem("", &c, kind).is_some()
                && !refused.contains(&c)
            {
                refused.push(c);
            }
        }
    }
    let mut item = serde_json::json!({"type": "string", "pattern": pattern});
    if !refused.is_empty() {
        item["not"] = serde_json::json!({ "enum": refused });
    }
    item
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::*;

    /// Every list the agent holds to the exemption guardrails is held to them by the chart's
    /// schema as well: "*" (which means everyone) refused by both, in each of them.
    #[test]
    fn every_exemption_list_the_agent_checks_the_values_schema_checks() {
        let mut schema = serde_json::to_value(schemars::schema_for!(AgentConfig)).expect("schema");
        add_guardrails(&mut schema);
        let cases: [(&[&str], &str, &str); 8] = [
            (
                &["admission", "exemptUsers"],
                "AdmissionConfig",
                "exemptUsers",
            ),
            (
                &["admission", "exemptGroups"],
                "AdmissionConfig",
                "exemptGroups",
            ),
            (
                &["admission", "exemptNamespaces"],
                "AdmissionConfig",
                "exemptNamespaces",
            ),
            (
                &["admission", "customerNamespaces"],
                "AdmissionConfig",
                "customerNamespaces",
            ),
            (
                &["admission", "identityClasses", "sre", "users"],
                "Members",
                "users",
            ),
            (
                &["admission", "identityClasses", "machinery", "groups"],
                "Members",
                "groups",
            ),
            (
                &["webhooks", "0", "exemptUsers"],
                "WebhookDefinition",
                "exemptUsers",
            ),
            (
                &["webhooks", "0", "exemptGroups"],
                "WebhookDefinition",
                "exemptGroups",
            ),
        ];
        for (path, def, field) in cases {
            let items = &schema["$defs"][def]["properties"][field]["items"];
            let re = regex::Regex::new(items["pattern"].as_str().expect("a pattern"))
                .expect("the pattern compiles");
            assert!(!re.is_match("*"), "{def}.{field} lets '*' through");
            assert!(re.is_match("osd-sre-admins"), "{def}.{field}");
            let mut c = serde_json::to_value(AgentConfig::default()).expect("json");
            let mut at = &mut c;
            for part in path {
                at = match part.parse::<usize>() {
                    Ok(i) => &mut at[i],
                    Err(_) => &mut at[*part],
                };
            }
            *at = serde_json::json!(["*"]);
            let cfg: AgentConfig = serde_json::from_value(c).expect("typed");
            let last = path.last().copied().unwrap_or_default();
            assert!(
                cfg.problems()
                    .iter()
                    .any(|p| p.contains(last) && p.contains("\"*\"")),
                "the agent refuses '*' in {path:?}: {:?}",
                cfg.problems()
            );
        }
    }

    /// The chart's schema and the agent refuse the same numbers: at each bound's edge, the
    /// schema's `minimum`/`maximum` are the agent's, and one past them the agent refuses.
    #[test]
    fn the_values_schema_bounds_are_the_agents() {
        let mut schema = serde_json::to_value(schemars::schema_for!(AgentConfig)).expect("schema");
        add_guardrails(&mut schema);
        for b in BOUNDS {
            let at = match b.schema_def {
                Some(def) => &schema["$defs"][def]["properties"][b.field],
                None => &schema["properties"][b.field],
            };
            assert_eq!(at["minimum"], serde_json::json!(b.min), "{}", b.path);
            assert_eq!(
                at.get("maximum").and_then(|m| m.as_i64()),
                b.max,
                "{}",
                b.path
            );
            let with = |v: i64| {
                let mut c = serde_json::to_value(AgentConfig::default()).expect("json");
                let mut at = &mut c;
                for part in b.path.split('.') {
                    at = &mut at[part];
                }
                *at = serde_json::json!(v);
                let cfg: AgentConfig = serde_json::from_value(c).expect("typed");
                cfg.problems()
                    .into_iter()
                    .filter(|p| p.starts_with(&format!("{} must be", b.path)))
                    .count()
            };
            assert_eq!(with(b.min), 0, "{} at its minimum", b.path);
            assert_eq!(with(b.min - 1), 1, "{} below its minimum", b.path);
            if let Some(max) = b.max {
                assert_eq!(with(max), 0, "{} at its maximum", b.path);
                assert_eq!(with(max + 1), 1, "{} above its maximum", b.path);
            }
        }
        let t = &schema["$defs"]["WebhookDefinition"]["properties"]["timeoutSeconds"];
        assert_eq!(
            (t["minimum"].as_i64(), t["maximum"].as_i64()),
            (Some(1), Some(5))
        );
    }

    /// An exemption entry passes the chart's schema exactly when it passes the agent: the
    /// issue's `*` and `sre*` among groups, every kind of refusal, and the defaults.
    #[test]
    fn the_values_schema_refuses_the_exemptions_the_agent_refuses_and_no_others() {
        let mut corpus: Vec<String> = [
            "*",
            "sre*",
            "abc*",
            "abcd*",
            "abcde*",
            "a*b",
            "ab**",
            "system:*",
            "syst*",
            "system:serviceaccount:*",
            "system:serviceaccount:kube-system:*",
            "system:serviceaccount:openshift-*",
            " alice",
            "alice ",
            "al\u{7}ice",
            "x\u{85}y",
            "",
            " ",
            "alice",
            "a",
            "ab c",
            "hcp-fleet.openshift.io:canary",
            "hcp-fleet*",
            "hcp-*",
            "hcp-fleet.openshift.io:canary*",
            "system:authenticated",
            "system:authenticated*",
            "osd-sre-admins",
        ]
        .map(String::from)
        .to_vec();
        let d = AdmissionConfig::default();
        for list in [&d.exempt_users, &d.exempt_groups, &d.exempt_namespaces] {
            corpus.extend(list.iter().cloned());
        }
        for kind in [Exempted::User, Exempted::Group, Exempted::Namespace] {
            let schema = exemption_schema(kind);
            let re = regex::Regex::new(schema["pattern"].as_str().expect("pattern"))
                .expect("the pattern compiles");
            let refused_by_name = schema["not"]["enum"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for entry in &corpus {
                let by_schema =
                    re.is_match(entry) && !refused_by_name.contains(&serde_json::json!(entry));
                let by_agent = exemption_problem("f", entry, kind).is_none();
                assert_eq!(by_schema, by_agent, "{kind:?} {entry:?}");
            }
        }
        // The issue's values, refused by both.
        assert!(exemption_problem("f", "*", Exempted::User).is_some());
        assert!(exemption_problem("f", "sre*", Exempted::Group).is_some());
    }
}
