//! `dev --acm`: the ACM hub's rows for the local fleet, as ACM shows them. ACM's code cannot run
//! in the test bed, so its governance-policy-framework addon is replayed by the same steps the
//! e2e suite takes (`e2e/support/acm.rs`, each following the addon's source): spec-sync copies
//! the hub's Policies of `policies/policy.yaml` to the managed side (the fleet's into
//! `local-cluster`, the hosted clusters' into `klusterlet-<cluster>` as hosted-mode addons do),
//! template-sync creates the agent's templates, and status-sync reads each row back from the
//! agent's Events, which is what Governance on the hub lists.

use std::collections::BTreeMap;

use kube::{Client, ResourceExt};

#[allow(dead_code, clippy::all, clippy::pedantic)]
#[path = "../support/acm.rs"]
mod acm;

/// One row on the hub: the managed side's namespace, the replicated Policy and the agent's
/// template in it.
pub struct Row {
    namespace: String,
    policy: String,
    template: String,
}

/// The fleet's row (the management cluster, `local-cluster`) and one per hosted cluster in
/// `names` (its managed cluster named as the hosted cluster), replicated and synced once.
/// Each replayed step that fails says so and leaves its row out.
pub async fn rows(mgmt: &Client, names: &[String]) -> Vec<Row> {
    let mut rows = Vec::new();
    let wanted = std::iter::once(("hcp-fleet-agent", "local-cluster".to_string(), 1)).chain(
        names
            .iter()
            .map(|n| ("hcp-fleet-agent-hosted-clusters", n.clone(), 0)),
    );
    for (root, cluster, template) in wanted {
        let (mgmt, root, for_task) = (mgmt.clone(), root.to_string(), cluster.clone());
        // The replay's steps are the tests' (they panic on an API error): one task each, so a
        // failed step costs its row, not the demo.
        let synced = tokio::spawn(async move {
            let cluster = for_task;
            let docs = acm::hub_objects();
            let (root, root_name) = acm::root_policy(&docs, &root);
            let ns = if cluster == "local-cluster" {
                cluster.clone()
            } else {
                format!("klusterlet-{cluster}")
            };
            let replica = acm::spec_sync(&mgmt, &root, &root_name, &ns, &cluster).await;
            acm::template_sync(&mgmt, &replica, template, false, |_| {})
                .await
                .map(|t| Row {
                    namespace: ns,
                    policy: root_name,
                    template: t.name_any(),
                })
        })
        .await;
        match synced {
            Ok(Ok(row)) => rows.push(row),
            Ok(Err(e)) => eprintln!("warning: the hub's row for {cluster}: {e}"),
            Err(e) => eprintln!("warning: the hub's row for {cluster}: {e}"),
        }
    }
    rows
}

/// Each row as the hub shows it after one status-sync: its compliance and newest message, by
/// namespace.
pub async fn read(mgmt: &Client, rows: &[Row]) -> BTreeMap<String, String> {
    let mut shown = BTreeMap::new();
    for r in rows {
        let text = match acm::hub_row(mgmt, &r.namespace, &r.policy, &r.template).await {
            Ok((compliant, history)) => format!(
                "{:<13} {}",
                if compliant.is_empty() {
                    "Pending"
                } else {
                    &compliant
                },
                history.first().map_or("", |h| h.message.as_str())
            ),
            Err(e) => format!("(not read: {e})"),
        };
        shown.insert(r.namespace.clone(), text);
    }
    shown
}

/// The rows as lines, for stdout.
pub fn lines(shown: &BTreeMap<String, String>) -> Vec<String> {
    shown
        .iter()
        .map(|(ns, text)| format!("  {ns:<24} {text}"))
        .collect()
}
