//! `hcp-fleet-agent status`: the fleet table (hosted cluster, compliance, each concern, drift
//! repairs, last change) read from the per-HCP Policies.

use std::process::ExitCode;

use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::crd::Policy;
use crate::reporting::{CLUSTER_LABEL, Concern, DRIFT_ANNOTATION, POLICY_NAME};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetRow {
    pub cluster: String,
    pub namespace: String,
    pub compliant: String,
    /// Per concern, in `Concern::ALL` order.
    pub concerns: Vec<String>,
    pub drift_repairs: u64,
    pub last_change: String,
}

/// A row from one per-HCP Policy.
pub fn row(p: &Policy) -> FleetRow {
    let st = p.status.clone().unwrap_or_default();
    let of = |t: &str| {
        st.details
            .iter()
            .find(|d| d.template_meta.name == t)
            .and_then(|d| d.compliant.clone())
            .unwrap_or_else(|| "-".into())
    };
    let last_change = st
        .details
        .iter()
        .filter_map(|d| d.history.first())
        .map(|h| h.last_timestamp.clone())
        .max()
        .unwrap_or_else(|| "-".into());
    let namespace = p.namespace().unwrap_or_default();
    FleetRow {
        cluster: p
            .labels()
            .get(CLUSTER_LABEL)
            .cloned()
            .unwrap_or_else(|| namespace.clone()),
        namespace,
        compliant: st.compliant.clone().unwrap_or_else(|| "-".into()),
        concerns: Concern::ALL.iter().map(|c| of(c.template_name())).collect(),
        drift_repairs: p
            .annotations()
            .get(DRIFT_ANNOTATION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        last_change,
    }
}

pub fn render_table(rows: &[FleetRow]) -> String {
    let mut out = format!(
        "{:<14} {:<13} {:<18} {:<13} {:<16} {:<13} {:<6} {}\n",
        "CLUSTER",
        "COMPLIANT",
        "ADMISSION-SERVICE",
        "CERTIFICATE",
        "HOSTED-WEBHOOKS",
        "E2E-PROBE",
        "DRIFT",
        "LAST-CHANGE"
    );
    for r in rows {
        let c = |i: usize| r.concerns.get(i).map(String::as_str).unwrap_or("-");
        out.push_str(&format!(
            "{:<14} {:<13} {:<18} {:<13} {:<16} {:<13} {:<6} {}\n",
            r.cluster,
            r.compliant,
            c(0),
            c(1),
            c(2),
            c(3),
            r.drift_repairs,
            r.last_change
        ));
    }
    out
}

/// Every per-HCP Policy the agent wrote, sorted by cluster.
pub async fn fleet_rows(client: &Client) -> Result<Vec<FleetRow>, kube::Error> {
    let api: Api<Policy> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!(
        "{}={}",
        crate::management::MANAGED_BY,
        crate::management::MANAGED_BY_VALUE
    ));
    let mut rows: Vec<FleetRow> = api
        .list(&lp)
        .await?
        .items
        .iter()
        .filter(|p| p.name_any() == POLICY_NAME)
        .map(row)
        .collect();
    rows.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    Ok(rows)
}

pub async fn run() -> ExitCode {
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: no usable kubeconfig: {e}");
            return ExitCode::FAILURE;
        }
    };
    match fleet_rows(&client).await {
        Ok(rows) if rows.is_empty() => {
            println!("no hosted clusters reported yet");
            ExitCode::SUCCESS
        }
        Ok(rows) => {
            print!("{}", render_table(&rows));
            ExitCode::SUCCESS
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            eprintln!(
                "error: the Policy CRD (policy.open-cluster-management.io/v1) is not installed here; the agent reports through metrics only"
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: listing Policies: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reporting::{Observation, next_status, render_policy};
    use std::collections::BTreeMap;

    #[test]
    fn a_row_shows_each_concern_and_the_drift_count() {
        let mut p = render_policy("clusters-hc-1", "hc-1");
        let mut obs: crate::reporting::Observations = Concern::ALL
            .iter()
            .map(|c| (*c, Observation::compliant("ok")))
            .collect();
        obs.insert(Concern::HostedWebhooks, Observation::violation("no answer"));
        p.status = Some(next_status(
            "clusters-hc-1",
            None,
            &obs,
            "2026-11-22T10:00:00Z",
            true,
        ));
        p.metadata.annotations = Some(BTreeMap::from([(
            DRIFT_ANNOTATION.to_string(),
            "3".to_string(),
        )]));
        let r = row(&p);
        assert_eq!(r.cluster, "hc-1");
        assert_eq!(r.compliant, "NonCompliant");
        assert_eq!(
            r.concerns,
            vec!["Compliant", "Compliant", "NonCompliant", "Compliant"]
        );
        assert_eq!(r.drift_repairs, 3);
        assert_eq!(r.last_change, "2026-11-22T10:00:00Z");
        let t = render_table(&[r]);
        assert!(
            t.lines().nth(1).is_some_and(|l| l.starts_with("hc-1 ")),
            "{t}"
        );
    }
}
