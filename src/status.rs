//! `hcp-fleet-agent status`: the fleet table (hosted cluster, compliance, each concern, drift
//! repairs, last change) read from the per-HCP `AdmissionHealth` records.

use std::process::ExitCode;

use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::crd::AdmissionHealth;
use crate::reporting::{Concern, HEALTH_NAME};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetRow {
    pub cluster: String,
    pub namespace: String,
    pub compliant: String,
    /// Per concern, in `Concern::ALL` order.
    pub concerns: Vec<String>,
    pub drift_repairs: u64,
    pub last_change: String,
    /// The revision it was last reconciled to.
    pub revision: String,
}

/// A row from one health record.
pub fn row(h: &AdmissionHealth) -> FleetRow {
    let st = h.status.clone().unwrap_or_default();
    let state = |s: Option<crate::crd::ComplianceState>| {
        s.map_or_else(|| "-".to_string(), |s| s.as_str().to_string())
    };
    let of = |t: &str| {
        state(
            st.concerns
                .iter()
                .find(|d| d.name == t)
                .and_then(|d| d.compliant),
        )
    };
    let last_change = st
        .concerns
        .iter()
        .filter_map(|d| d.history.first())
        .map(|h| h.last_timestamp.clone())
        .max()
        .unwrap_or_else(|| "-".into());
    FleetRow {
        cluster: h.spec.cluster.clone(),
        namespace: h.namespace().unwrap_or_default(),
        compliant: state(st.compliant),
        concerns: Concern::ALL.iter().map(|c| of(c.template_name())).collect(),
        drift_repairs: st.drift_repairs,
        last_change,
        revision: st.revision.clone().unwrap_or_else(|| "-".into()),
    }
}

/// How many hosted clusters run each revision, most first: `revisions: a 998, b 2`.
pub fn revisions(rows: &[FleetRow]) -> String {
    let mut by: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for r in rows {
        *by.entry(r.revision.as_str()).or_default() += 1;
    }
    let mut v: Vec<(&str, usize)> = by.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let parts: Vec<String> = v.iter().map(|(r, n)| format!("{r} {n}")).collect();
    format!("revisions: {}", parts.join(", "))
}

/// The rollout's line and one line per override (the agent's CRDs may be absent: nothing then).
async fn rollout_lines(client: &Client) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(list) = Api::<crate::crd::rollout::AdmissionRollout>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        for r in list.items {
            let st = r.status.unwrap_or_default();
            out.push(format!("rollout: {}: {}", st.phase.as_str(), st.message));
        }
    }
    if let Ok(list) = Api::<crate::crd::rollout::HostedAdmissionOverride>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        for o in list.items {
            let st = o.status.clone().unwrap_or_default();
            out.push(format!(
                "override {}/{}: accepted {}: {}{}",
                o.namespace().unwrap_or_default(),
                o.name_any(),
                st.accepted.as_deref().unwrap_or("-"),
                st.message,
                o.spec
                    .reason
                    .as_deref()
                    .map(|r| format!(" (reason: {r})"))
                    .unwrap_or_default()
            ));
        }
    }
    out
}

const HEADERS: [&str; 8] = [
    "CLUSTER",
    "COMPLIANT",
    "ADMISSION-SERVICE",
    "CERTIFICATE",
    "HOSTED-WEBHOOKS",
    "E2E-PROBE",
    "DRIFT",
    "LAST-CHANGE",
];

/// The table, each column as wide as its widest cell (a hosted cluster name of any length keeps
/// the rows in line), two spaces between columns, no trailing padding.
pub fn render_table(rows: &[FleetRow]) -> String {
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            let c = |i: usize| r.concerns.get(i).cloned().unwrap_or_else(|| "-".into());
            [
                r.cluster.clone(),
                r.compliant.clone(),
                c(0),
                c(1),
                c(2),
                c(3),
                r.drift_repairs.to_string(),
                r.last_change.clone(),
            ]
        })
        .collect();
    let mut widths = HEADERS.map(|h| h.chars().count());
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |row: &[&str]| {
        let mut l = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                l.push_str(cell);
            } else {
                l.push_str(&format!("{cell:<w$}  "));
            }
        }
        l.push('\n');
        l
    };
    let mut out = line(&HEADERS);
    for row in &cells {
        out.push_str(&line(&row.each_ref().map(String::as_str)));
    }
    out
}

/// The last line under the table: how many hosted clusters, and how many in each state.
pub fn summary(rows: &[FleetRow]) -> String {
    let count = |s: &str| rows.iter().filter(|r| r.compliant == s).count();
    let other = rows.len()
        - ["Compliant", "NonCompliant", "Pending"]
            .iter()
            .map(|s| count(s))
            .sum::<usize>();
    let mut line = format!(
        "{} hosted cluster(s): {} Compliant, {} NonCompliant, {} Pending",
        rows.len(),
        count("Compliant"),
        count("NonCompliant"),
        count("Pending")
    );
    if other > 0 {
        line.push_str(&format!(", {other} not reported yet"));
    }
    line
}

/// The rows an SRE asked for: all, or (`problems`) only those not Compliant.
pub fn select(rows: Vec<FleetRow>, problems: bool) -> Vec<FleetRow> {
    if problems {
        rows.into_iter()
            .filter(|r| r.compliant != "Compliant")
            .collect()
    } else {
        rows
    }
}

/// Records per page: a thousand health records (each with its history) in one response would
/// be megabytes for the API server to hold at once.
const PAGE: u32 = 250;

/// Every health record whose HCP still exists, sorted by cluster. A deleted HCP's record
/// lingers until the garbage collector removes it (never, where none runs); its row would
/// report a cluster that is gone.
pub async fn fleet_rows(client: &Client) -> Result<Vec<FleetRow>, kube::Error> {
    let mut existing = std::collections::BTreeSet::new();
    let hcps = Api::<crate::crd::HostedControlPlane>::all(client.clone());
    let mut lp = ListParams::default().limit(PAGE);
    loop {
        let page = hcps.list_metadata(&lp).await?;
        existing.extend(page.items.iter().filter_map(|h| h.namespace()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    let api: Api<AdmissionHealth> = Api::all(client.clone());
    let mut lp = ListParams::default()
        .labels(&format!(
            "{}={}",
            crate::management::MANAGED_BY,
            crate::management::MANAGED_BY_VALUE
        ))
        .limit(PAGE);
    let mut rows = Vec::new();
    loop {
        let page = api.list(&lp).await?;
        rows.extend(
            page.items
                .iter()
                .filter(|p| p.name_any() == HEALTH_NAME)
                .filter(|p| p.namespace().is_some_and(|ns| existing.contains(&ns)))
                .map(row),
        );
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    rows.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    Ok(rows)
}

#[derive(Debug, Default, clap::Args)]
pub struct StatusArgs {
    /// Only the hosted clusters that are not Compliant (the summary line still counts all).
    #[arg(long)]
    pub problems: bool,
    /// Also how many hosted clusters run each revision, the rollout's phase and why, and every
    /// HostedAdmissionOverride with whether it was accepted.
    #[arg(long)]
    pub rollout: bool,
}

pub async fn run(args: StatusArgs) -> ExitCode {
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
            let total = summary(&rows);
            let by_revision = args.rollout.then(|| revisions(&rows));
            let shown = select(rows, args.problems);
            if !shown.is_empty() {
                print!("{}", render_table(&shown));
            }
            if let Some(by_revision) = by_revision {
                println!("{by_revision}");
                for line in rollout_lines(&client).await {
                    println!("{line}");
                }
            }
            println!("{total}");
            ExitCode::SUCCESS
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            eprintln!(
                "error: the AdmissionHealth CRD (admissionhealths.hcp-fleet.openshift.io) is not installed here; the agent reports through metrics only"
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: listing AdmissionHealth records: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reporting::{Observation, next_status, render_health};

    #[test]
    fn a_row_shows_each_concern_and_the_drift_count() {
        let mut p = render_health("clusters-hc-1", "hc-1", None);
        let mut obs: crate::reporting::Observations = Concern::ALL
            .iter()
            .map(|c| (*c, Observation::compliant("ok")))
            .collect();
        obs.insert(Concern::HostedWebhooks, Observation::violation("no answer"));
        p.status = Some(next_status(
            None,
            &obs,
            "2026-11-22T10:00:00Z",
            3,
            "r",
            true,
        ));
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

    fn fleet_row(cluster: &str, compliant: &str) -> FleetRow {
        FleetRow {
            cluster: cluster.into(),
            namespace: format!("clusters-{cluster}"),
            compliant: compliant.into(),
            concerns: vec![compliant.into(); 4],
            drift_repairs: 12,
            last_change: "2026-11-22T10:00:00Z".into(),
            revision: if compliant == "Compliant" { "r1" } else { "r0" }.into(),
        }
    }

    #[test]
    fn revisions_count_the_fleet_most_first() {
        let rows = vec![
            fleet_row("a", "Compliant"),
            fleet_row("b", "NonCompliant"),
            fleet_row("c", "Compliant"),
        ];
        assert_eq!(revisions(&rows), "revisions: r1 2, r0 1");
    }

    /// Where each column starts on a line: after every run of two or more spaces.
    fn column_starts(line: &str) -> Vec<usize> {
        let b = line.as_bytes();
        (1..b.len())
            .filter(|&i| b[i] != b' ' && i >= 2 && b[i - 1] == b' ' && b[i - 2] == b' ')
            .collect()
    }

    #[test]
    fn columns_fit_the_longest_name_and_stay_in_line() {
        let long = "hostile-authprovider-with-a-very-long-hosted-cluster-name";
        let t = render_table(&[
            fleet_row("hc-1", "Compliant"),
            fleet_row(long, "NonCompliant"),
            fleet_row("x", "Pending"),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        let header = column_starts(lines[0]);
        assert_eq!(header.len(), 7, "{t}");
        for l in &lines[1..] {
            assert_eq!(column_starts(l), header, "out of line:\n{t}");
            assert!(!l.ends_with(' '), "no trailing padding: {l:?}");
        }
        assert!(lines[2].starts_with(long), "{t}");
    }

    #[test]
    fn the_summary_counts_every_state_and_problems_shows_the_rest() {
        let rows = vec![
            fleet_row("a", "Compliant"),
            fleet_row("b", "NonCompliant"),
            fleet_row("c", "Pending"),
            fleet_row("d", "-"),
            fleet_row("e", "Compliant"),
        ];
        assert_eq!(
            summary(&rows),
            "5 hosted cluster(s): 2 Compliant, 1 NonCompliant, 1 Pending, 1 not reported yet"
        );
        let shown: Vec<String> = select(rows.clone(), true)
            .into_iter()
            .map(|r| r.cluster)
            .collect();
        assert_eq!(shown, ["b", "c", "d"]);
        assert_eq!(select(rows, false).len(), 5);
    }

    #[test]
    fn a_thousand_rows_stay_in_line() {
        let rows: Vec<FleetRow> = (0..1000)
            .map(|i| fleet_row(&format!("hc-{i}"), "Compliant"))
            .collect();
        let t = render_table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 1001);
        let header = column_starts(lines[0]);
        assert!(lines.iter().all(|l| column_starts(l) == header));
    }
}
