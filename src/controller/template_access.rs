//! Who may sync the agent's ACM template kind: the subjects of the chart's template-sync
//! ClusterRoleBinding, kept in step with every service account of ACM's framework addon on
//! this cluster.
//!
//! The template CRD carries ACM's `policy-type: template` label, so every framework-addon
//! instance lists the kind in its own namespace on each Policy reconcile
//! (governance-policy-framework-addon, `controllers/templatesync/template_sync.go`,
//! `cleanUpExcessTemplates`). Where ACM runs the addons in hosted mode there is one instance
//! per hosted cluster, in `klusterlet-<name>`, each with its own account; one of them without
//! the right ends every reconcile of that cluster's Policies, the SRE's others included, in
//! "forbidden". So the binding names every account of the addon's name, in whatever namespace
//! (a default-mode install, `klusterlet-*`, an AddOnDeploymentConfig's `agentInstallNamespace`),
//! as soon as it appears. The agent may update that one binding only, and bind that one role
//! only (chart RBAC).

use std::collections::BTreeSet;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Subject};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tracing::{info, warn};

/// The subjects the binding should have: one per account, sorted, without duplicates.
pub fn subjects(accounts: impl IntoIterator<Item = (String, String)>) -> Vec<Subject> {
    let set: BTreeSet<(String, String)> = accounts.into_iter().collect();
    set.into_iter()
        .map(|(namespace, name)| Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: Some(namespace),
            api_group: None,
        })
        .collect()
}

/// The running `keep` task; dropping it stops the task.
pub struct Keeper(tokio::task::JoinHandle<()>);

impl Drop for Keeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts `keep`.
pub fn spawn(client: Client, binding: String, account: String, always: Option<String>) -> Keeper {
    Keeper(tokio::spawn(keep(client, binding, account, always)))
}

/// Keeps `binding`'s subjects equal to the service accounts named `account` (in any
/// namespace), and the one in `always` whether it exists or not (the chart's own subject: the
/// binding as the chart and ACM's ConfigurationPolicy write it must stay a subset, or they
/// would put it back at every look), for as long as it runs. A write that fails (the binding
/// missing, RBAC) is logged and tried again at the next change.
pub async fn keep(client: Client, binding: String, account: String, always: Option<String>) {
    let accounts: Api<ServiceAccount> = Api::all(client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(client);
    let (store, writer) = kube::runtime::reflector::store();
    let cfg = watcher::Config::default().fields(&format!("metadata.name={account}"));
    let mut events = watcher(accounts, cfg)
        .default_backoff()
        .reflect(writer)
        .boxed();
    let mut written: Option<Vec<Subject>> = None;
    while let Some(ev) = events.next().await {
        match ev {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
            }
            Ok(_) => continue,
            Err(e) => {
                warn!(error = %crate::human::WatchError(&e), "watching ACM's framework addon service accounts");
                continue;
            }
        }
        if store.wait_until_ready().await.is_err() {
            return;
        }
        let want = subjects(
            store
                .state()
                .iter()
                .map(|sa| (sa.namespace().unwrap_or_default(), sa.name_any()))
                .chain(always.iter().map(|ns| (ns.clone(), account.clone()))),
        );
        if written.as_ref() == Some(&want) {
            continue;
        }
        let patch = serde_json::json!({"subjects": want});
        match bindings
            .patch(&binding, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(binding = %binding, accounts = want.len(), "ACM template-sync access follows the framework addon's service accounts");
                written = Some(want);
            }
            Err(e) => {
                warn!(error = %crate::human::KubeError(&e), binding = %binding, "updating the template-sync ClusterRoleBinding failed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_subject_per_account_sorted() {
        let s = subjects([
            (
                "klusterlet-b".to_string(),
                "governance-policy-framework-sa".to_string(),
            ),
            (
                "klusterlet-a".to_string(),
                "governance-policy-framework-sa".to_string(),
            ),
            (
                "klusterlet-a".to_string(),
                "governance-policy-framework-sa".to_string(),
            ),
        ]);
        let ns: Vec<_> = s.iter().filter_map(|s| s.namespace.clone()).collect();
        assert_eq!(ns, ["klusterlet-a", "klusterlet-b"]);
        assert!(
            s.iter()
                .all(|s| s.kind == "ServiceAccount" && s.api_group.is_none())
        );
    }
}
