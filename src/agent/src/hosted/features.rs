//! What a hosted API server serves that the guards can use: found by asking it, never by its
//! version (an OpenShift build may carry a feature its version does not).

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use serde_json::json;

use hcp_fleet_render::hosted::objects::HostedFeatures;

/// The name of the object `discover_features` offers in a dry run (never stored).
pub(crate) const FEATURE_CHECK_NAME: &str = "hcp-fleet-agent-feature-check";

/// Asks the hosted API server, by a dry-run create of a webhook configuration, which of the
/// features the guards can use it keeps. A server that does not know a field drops it (older
/// servers ignore strict field validation), so what comes back says what is served.
pub(crate) async fn discover_features(
    client: &kube::Client,
) -> Result<HostedFeatures, kube::Error> {
    let check: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": FEATURE_CHECK_NAME},
        "webhooks": [{
            "name": "feature-check.hcp-fleet.openshift.io",
            "clientConfig": {"url": "https://127.0.0.1:1/feature-check"},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "matchConditions": [{"name": "always", "expression": "true"}],
        }],
    }))
    .map_err(kube::Error::SerdeError)?;
    let pp = kube::api::PostParams {
        dry_run: true,
        field_manager: Some(hcp_fleet_render::management::FIELD_MANAGER.into()),
    };
    let answered = kube::Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&pp, &check)
        .await?;
    let match_conditions = answered
        .webhooks
        .iter()
        .flatten()
        .any(|w| w.match_conditions.as_ref().is_some_and(|m| !m.is_empty()));
    // Served means listed under v1: a server with only the beta API is left to the webhooks.
    let resources = client
        .list_api_group_resources("admissionregistration.k8s.io/v1")
        .await?;
    let listed = |name: &str| resources.resources.iter().any(|r| r.name == name);
    let admission_policies =
        listed("validatingadmissionpolicies") && listed("validatingadmissionpolicybindings");
    let mutating_policies =
        listed("mutatingadmissionpolicies") && listed("mutatingadmissionpolicybindings");
    Ok(HostedFeatures {
        match_conditions,
        admission_policies,
        mutating_policies,
        // Found per reconcile by the static probe, not by discovery.
        static_guards: false,
        static_mutating: false,
        static_offered: false,
    })
}
