//! `hcp-fleet-agent status` (also `kubectl hcp-fleet status`, installed as a kubectl plugin):
//! the fleet table (hosted cluster, compliance, each concern, drift repairs, last change) read
//! from the per-HCP `AdmissionHealth` records, as a table, a wide table, JSON or YAML, once or
//! as the records change.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;

use futures::StreamExt;
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use super::OutputError;
use hcp_fleet_agent::human::KubeError;
use hcp_fleet_model::crd::{AdmissionHealth, HostedControlPlane};
use hcp_fleet_render::reporting::Concern;
use hcp_fleet_render::reporting::record::{READY, is_health_record};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetRow {
    pub(crate) cluster: String,
    pub(crate) namespace: String,
    pub compliant: String,
    /// Per concern, in `Concern::ALL` order.
    #[serde(serialize_with = "concerns_by_name")]
    pub(crate) concerns: Vec<String>,
    pub(crate) drift_repairs: u64,
    pub(crate) last_change: String,
    /// The revision it was last reconciled to.
    pub(crate) revision: String,
    /// The installation of the agent that owns it (its namespace; `-` before one claimed it).
    pub(crate) owner: String,
    /// Why it is not Compliant (its `Ready` condition's message); empty when it is.
    pub(crate) reason: String,
    /// How many guards take each path in the hosted cluster (`paths`); empty before any was
    /// installed.
    #[serde(serialize_with = "paths_by_name")]
    pub(crate) paths: Vec<(String, usize)>,
}

/// The paths as `{"policy": 13, "none": 1}` in JSON and YAML.
fn paths_by_name<S: serde::Serializer>(v: &[(String, usize)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(v.len()))?;
    for (path, n) in v {
        m.serialize_entry(path, n)?;
    }
    m.end()
}

/// How many of `guards` take each path, in a fixed order: `webhook` (which needs the admission
/// service), `policy`, `static`, `none`, then any other a newer agent writes.
pub(crate) fn paths(guards: &[hcp_fleet_model::crd::GuardPath]) -> Vec<(String, usize)> {
    const ORDER: [&str; 4] = ["webhook", "policy", "static", "none"];
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for g in guards {
        *counts.entry(g.path.as_str()).or_default() += 1;
    }
    let rank = |p: &str| ORDER.iter().position(|o| *o == p).unwrap_or(ORDER.len());
    let mut v: Vec<(String, usize)> = counts
        .into_iter()
        .map(|(p, n)| (p.to_string(), n))
        .collect();
    v.sort_by_key(|(p, _)| rank(p));
    v
}

/// The `PATHS` cell: `policy=13,none=1`; `-` before any guard was installed.
fn paths_cell(v: &[(String, usize)]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.iter()
        .map(|(p, n)| format!("{p}={n}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The concerns as `{"admission-service": "Compliant", …}` in JSON and YAML.
fn concerns_by_name<S: serde::Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(v.len()))?;
    for (c, state) in Concern::ALL.iter().zip(v) {
        m.serialize_entry(c.template_name(), state)?;
    }
    m.end()
}

/// A row from one health record.
pub(crate) fn row(h: &AdmissionHealth) -> FleetRow {
    let st = h.status.clone().unwrap_or_default();
    let state = |s: Option<hcp_fleet_model::crd::ComplianceState>| {
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
    let reason = match hcp_fleet_model::crd::conditions::find(&st.conditions, READY) {
        Some(c) if c.status == hcp_fleet_model::crd::ConditionStatus::True => String::new(),
        Some(c) => c.message.clone(),
        // A record of an earlier release, without conditions: the newest word of each concern
        // that is not Compliant.
        None => st
            .concerns
            .iter()
            .filter(|d| d.compliant != Some(hcp_fleet_model::crd::ComplianceState::Compliant))
            .filter_map(|d| {
                d.history
                    .first()
                    .map(|h| format!("{}: {}", d.name, h.message))
            })
            .collect::<Vec<_>>()
            .join("; "),
    };
    FleetRow {
        cluster: h.spec.cluster.clone(),
        namespace: h.namespace().unwrap_or_default(),
        compliant: state(st.compliant),
        concerns: Concern::ALL.iter().map(|c| of(c.template_name())).collect(),
        drift_repairs: st.drift_repairs,
        last_change,
        revision: st.revision.clone().unwrap_or_else(|| "-".into()),
        owner: h.spec.owner.clone().unwrap_or_else(|| "-".into()),
        reason: hcp_fleet_render::reporting::untrusted(&reason, 2048),
        paths: paths(&st.guards),
    }
}

/// How many hosted clusters run each revision.
pub(crate) fn revision_counts(rows: &[FleetRow]) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for r in rows {
        *by.entry(r.revision.clone()).or_default() += 1;
    }
    by
}

/// How many hosted clusters run each revision, most first: `revisions: a 998, b 2`.
pub(crate) fn revisions(rows: &[FleetRow]) -> String {
    let mut v: Vec<(String, usize)> = revision_counts(rows).into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let parts: Vec<String> = v.iter().map(|(r, n)| format!("{r} {n}")).collect();
    format!("revisions: {}", parts.join(", "))
}

/// The rollout's line and one line per override (the agent's CRDs may be absent: nothing then).
async fn rollout_lines(client: &Client) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(list) =
        Api::<hcp_fleet_model::crd::admission_rollout::AdmissionRollout>::all(client.clone())
            .list(&ListParams::default())
            .await
    {
        for r in list.items {
            let st = r.status.unwrap_or_default();
            out.push(format!("rollout: {}: {}", st.phase.as_str(), st.message));
        }
    }
    if let Ok(list) =
        Api::<hcp_fleet_model::crd::admission_rollout::HostedAdmissionOverride>::all(client.clone())
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

/// `-o wide` adds these after `HEADERS`. `PATHS`: how many guards take each path in the hosted
/// cluster; one with no `webhook` needs no admission service, and has none.
const WIDE_HEADERS: [&str; 5] = ["NAMESPACE", "OWNER", "REVISION", "PATHS", "REASON"];

/// A table's layout: each column as wide as its widest cell (a hosted cluster name of any
/// length keeps the rows in line), two spaces between columns, no trailing padding. `--watch`
/// keeps the first layout for the rows that follow, as kubectl does.
pub(crate) struct Table {
    wide: bool,
    widths: Vec<usize>,
}

impl Table {
    pub(crate) fn new(rows: &[FleetRow], wide: bool) -> Self {
        let mut widths: Vec<usize> = Self::headers(wide)
            .iter()
            .map(|h| h.chars().count())
            .collect();
        for r in rows {
            for (w, cell) in widths.iter_mut().zip(Self::cells(r, wide)) {
                *w = (*w).max(cell.chars().count());
            }
        }
        Self { wide, widths }
    }

    fn headers(wide: bool) -> Vec<&'static str> {
        let mut h = HEADERS.to_vec();
        if wide {
            h.extend(WIDE_HEADERS);
        }
        h
    }

    fn cells(r: &FleetRow, wide: bool) -> Vec<String> {
        let c = |i: usize| r.concerns.get(i).cloned().unwrap_or_else(|| "-".into());
        let mut cells = vec![
            r.cluster.clone(),
            r.compliant.clone(),
            c(0),
            c(1),
            c(2),
            c(3),
            r.drift_repairs.to_string(),
            r.last_change.clone(),
        ];
        if wide {
            cells.push(r.namespace.clone());
            cells.push(r.owner.clone());
            cells.push(r.revision.clone());
            cells.push(paths_cell(&r.paths));
            cells.push(if r.reason.is_empty() {
                "-".into()
            } else {
                r.reason.clone()
            });
        }
        cells
    }

    fn line(&self, row: &[String]) -> String {
        let mut l = String::new();
        for (i, (cell, w)) in row.iter().zip(&self.widths).enumerate() {
            if i + 1 == row.len() {
                l.push_str(cell);
            } else {
                l.push_str(&format!("{cell:<w$}  "));
            }
        }
        l.push('\n');
        l
    }

    pub(crate) fn header(&self) -> String {
        let h: Vec<String> = Self::headers(self.wide)
            .into_iter()
            .map(String::from)
            .collect();
        self.line(&h)
    }

    pub(crate) fn row(&self, r: &FleetRow) -> String {
        self.line(&Self::cells(r, self.wide))
    }

    pub(crate) fn render(&self, rows: &[FleetRow]) -> String {
        let mut out = self.header();
        for r in rows {
            out.push_str(&self.row(r));
        }
        out
    }
}

/// The table (`Table`'s layout).
pub fn render_table(rows: &[FleetRow]) -> String {
    Table::new(rows, false).render(rows)
}

/// How many hosted clusters are in each state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Summary {
    pub(crate) total: usize,
    pub(crate) compliant: usize,
    pub(crate) non_compliant: usize,
    pub(crate) pending: usize,
    pub(crate) not_reported: usize,
}

pub(crate) fn counts(rows: &[FleetRow]) -> Summary {
    let count = |s: &str| rows.iter().filter(|r| r.compliant == s).count();
    let (compliant, non_compliant, pending) =
        (count("Compliant"), count("NonCompliant"), count("Pending"));
    Summary {
        total: rows.len(),
        compliant,
        non_compliant,
        pending,
        not_reported: rows.len() - compliant - non_compliant - pending,
    }
}

/// The last line under the table: how many hosted clusters, and how many in each state.
pub(crate) fn summary(rows: &[FleetRow]) -> String {
    let c = counts(rows);
    let mut line = format!(
        "{} hosted cluster(s): {} Compliant, {} NonCompliant, {} Pending",
        c.total, c.compliant, c.non_compliant, c.pending
    );
    if c.not_reported > 0 {
        line.push_str(&format!(", {} not reported yet", c.not_reported));
    }
    line
}

/// Whether a row is a problem: anything but Compliant.
pub(crate) fn is_problem(r: &FleetRow) -> bool {
    r.compliant != "Compliant"
}

/// The rows an SRE asked for: all, or (`problems`) only those not Compliant.
pub(crate) fn select(rows: Vec<FleetRow>, problems: bool) -> Vec<FleetRow> {
    if problems {
        rows.into_iter().filter(is_problem).collect()
    } else {
        rows
    }
}

/// `-o json` and `-o yaml`: the rows shown, the summary of all, and with `--rollout` the
/// revisions and the rollout's and overrides' lines.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Report {
    pub(crate) clusters: Vec<FleetRow>,
    pub(crate) summary: Summary,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) revisions: Option<BTreeMap<String, usize>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) rollout: Vec<String>,
}

/// Records per page: a thousand health records (each with its history) in one response would
/// be megabytes for the API server to hold at once.
const PAGE: u32 = 250;

/// Which hosted clusters: `-n` (one HCP namespace) and `-l` (a label selector on the
/// HostedControlPlanes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub(crate) namespace: Option<String>,
    pub(crate) selector: Option<String>,
}

impl Filter {
    fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
}

/// The HCP namespaces `filter` selects.
async fn hcp_namespaces(client: &Client, filter: &Filter) -> Result<BTreeSet<String>, kube::Error> {
    let mut existing = BTreeSet::new();
    let hcps: Api<HostedControlPlane> = filter.api(client);
    let mut lp = ListParams::default().limit(PAGE);
    if let Some(sel) = &filter.selector {
        lp = lp.labels(sel);
    }
    loop {
        let page = hcps.list_metadata(&lp).await?;
        existing.extend(page.items.iter().filter_map(|h| h.namespace()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    Ok(existing)
}

fn records_selector() -> String {
    format!(
        "{}={}",
        hcp_fleet_model::names::MANAGED_BY,
        hcp_fleet_model::names::MANAGED_BY_VALUE
    )
}

/// Every health record whose HCP still exists (and `filter` selects), sorted by cluster. A
/// deleted HCP's record lingers until the garbage collector removes it (never, where none
/// runs); its row would report a cluster that is gone.
pub async fn fleet_rows(client: &Client, filter: &Filter) -> Result<Vec<FleetRow>, kube::Error> {
    let existing = hcp_namespaces(client, filter).await?;
    rows_in(client, filter, &existing).await
}

/// The rows of the records in the HCP namespaces `existing`, sorted by cluster.
async fn rows_in(
    client: &Client,
    filter: &Filter,
    existing: &BTreeSet<String>,
) -> Result<Vec<FleetRow>, kube::Error> {
    let api: Api<AdmissionHealth> = filter.api(client);
    let mut lp = ListParams::default()
        .labels(&records_selector())
        .limit(PAGE);
    let mut rows = Vec::new();
    loop {
        let page = api.list(&lp).await?;
        rows.extend(
            page.items
                .iter()
                .filter(|p| is_health_record(p))
                .filter(|p| p.namespace().is_some_and(|ns| existing.contains(&ns)))
                .map(|p| {
                    (
                        p.name_any() == hcp_fleet_render::reporting::record::LEGACY_HEALTH_NAME,
                        row(p),
                    )
                }),
        );
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    // An earlier release's record beside the new one (the moment the agent carries it over)
    // is the same cluster once.
    let current: BTreeSet<String> = rows
        .iter()
        .filter(|(legacy, _)| !legacy)
        .map(|(_, r)| r.namespace.clone())
        .collect();
    let mut rows: Vec<FleetRow> = rows
        .into_iter()
        .filter(|(legacy, r)| !legacy || !current.contains(&r.namespace))
        .map(|(_, r)| r)
        .collect();
    rows.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    Ok(rows)
}

/// How `status` prints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    #[default]
    Table,
    /// The table with the HCP namespace, revision and why it is not Compliant.
    Wide,
    Json,
    Yaml,
}

#[derive(Debug, Default, clap::Args)]
pub(crate) struct StatusArgs {
    /// Only the hosted clusters that are not Compliant (the summary still counts all); exits 1
    /// when there is any. Exits 2 when it cannot look (kubeconfig, namespace, records).
    #[arg(long)]
    pub(crate) problems: bool,
    /// Also how many hosted clusters run each revision, the rollout's phase and why, and every
    /// HostedAdmissionOverride with whether it was accepted.
    #[arg(long)]
    pub(crate) rollout: bool,
    /// table, wide, json or yaml.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub(crate) output: Output,
    /// The kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then the in-cluster account).
    #[arg(long)]
    pub(crate) kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub(crate) context: Option<String>,
    /// Only the hosted cluster of this HCP namespace.
    #[arg(short = 'n', long)]
    pub(crate) namespace: Option<String>,
    /// Only the hosted clusters whose HostedControlPlane matches this label selector.
    #[arg(short = 'l', long)]
    pub(crate) selector: Option<String>,
    /// After the table, print each row again whenever it changes (until interrupted).
    #[arg(short = 'w', long)]
    pub(crate) watch: bool,
}

/// The management cluster's client, as kubectl picks it: `--kubeconfig`, else `$KUBECONFIG`
/// or `~/.kube/config`, else the in-cluster account; `--context` within the file.
pub(crate) async fn client(args: &StatusArgs) -> Result<Client, ClientSetupError> {
    let opts = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let config = match &args.kubeconfig {
        Some(path) => {
            let at = |source| ClientSetupError::Kubeconfig {
                path: path.clone(),
                source,
            };
            let kc = Kubeconfig::read_from(path).map_err(at)?;
            kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .map_err(at)?
        }
        None if args.context.is_some() => kube::Config::from_kubeconfig(&opts)
            .await
            .map_err(ClientSetupError::Context)?,
        None => kube::Config::infer()
            .await
            .map_err(ClientSetupError::Infer)?,
    };
    Client::try_from(config).map_err(ClientSetupError::Build)
}

/// Why `status` (and `uninstall`) have no client for the management cluster.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientSetupError {
    #[error("kubeconfig {}: {source}", .path.display())]
    Kubeconfig {
        path: std::path::PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("kubeconfig: {0}")]
    Context(#[source] kube::config::KubeconfigError),
    #[error("no usable kubeconfig or in-cluster account: {0}")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("building the client: {}", KubeError(.0))]
    Build(#[source] kube::Error),
}

/// `status` exits 1 for what it found (`--problems` and a hosted cluster not Compliant) and
/// 2 when it could not look (no kubeconfig, no such namespace, no records to read), so a
/// script tells "the fleet has a problem" from "the check did not run".
pub(crate) const EXIT_PROBLEMS: u8 = 1;
pub(crate) const EXIT_ERROR: u8 = 2;

pub(crate) async fn run(args: StatusArgs) -> ExitCode {
    let client = match client(&args).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    // A namespace that is not there holds no hosted cluster: said, not shown as an empty fleet.
    if let Some(ns) = &args.namespace {
        match Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .get_opt(ns)
            .await
        {
            Ok(Some(_)) => {}
            Ok(None) => {
                eprintln!("error: namespace {ns:?} not found");
                return ExitCode::from(EXIT_ERROR);
            }
            // Not allowed to read namespaces: the listing below says what it finds.
            Err(kube::Error::Api(s)) if s.code == 403 => {}
            Err(e) => {
                eprintln!("error: reading namespace {ns:?}: {}", KubeError(&e));
                return ExitCode::from(EXIT_ERROR);
            }
        }
    }
    let filter = Filter {
        namespace: args.namespace.clone(),
        selector: args.selector.clone(),
    };
    // The HCPs listed once: the rows and `--watch` both read them.
    let listed = async {
        let existing = hcp_namespaces(&client, &filter).await?;
        let rows = rows_in(&client, &filter, &existing).await?;
        Ok::<_, kube::Error>((existing, rows))
    }
    .await;
    let (existing, rows) = match listed {
        Ok(listed) => listed,
        Err(kube::Error::Api(s)) if s.code == 404 => {
            eprintln!(
                "error: the AdmissionHealth CRD (admissionhealths.hcp-fleet.openshift.io) is not installed here; the agent reports through metrics only"
            );
            return ExitCode::from(EXIT_ERROR);
        }
        Err(e) => {
            eprintln!("error: listing AdmissionHealth records: {}", KubeError(&e));
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let problems = rows.iter().any(is_problem);
    let rollout = if args.rollout {
        rollout_lines(&client).await
    } else {
        Vec::new()
    };
    match print(&args, rows.clone(), rollout) {
        Ok(out) => print!("{out}"),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    }
    if args.watch {
        return watch(&client, &args, &filter, &existing, rows).await;
    }
    // As a check in a script: `status --problems` fails while any hosted cluster is not
    // Compliant.
    if args.problems && problems {
        ExitCode::from(EXIT_PROBLEMS)
    } else {
        ExitCode::SUCCESS
    }
}

/// What `status` prints once, in the asked-for output.
pub(crate) fn print(
    args: &StatusArgs,
    rows: Vec<FleetRow>,
    rollout: Vec<String>,
) -> Result<String, OutputError> {
    let summary_all = counts(&rows);
    let total = summary(&rows);
    let by_revision = args.rollout.then(|| revision_counts(&rows));
    let revisions_line = args.rollout.then(|| revisions(&rows));
    let shown = select(rows, args.problems);
    match args.output {
        Output::Json | Output::Yaml => {
            let report = Report {
                clusters: shown,
                summary: summary_all,
                revisions: by_revision,
                rollout,
            };
            if args.output == Output::Json {
                Ok(serde_json::to_string_pretty(&report)? + "\n")
            } else {
                Ok(serde_saphyr::to_string(&report)?)
            }
        }
        Output::Table | Output::Wide => {
            let mut out = String::new();
            if summary_all.total == 0 {
                return Ok("no hosted clusters reported yet\n".into());
            }
            if !shown.is_empty() {
                out.push_str(&Table::new(&shown, args.output == Output::Wide).render(&shown));
            }
            if let Some(line) = revisions_line {
                out.push_str(&line);
                out.push('\n');
                for l in rollout {
                    out.push_str(&l);
                    out.push('\n');
                }
            }
            out.push_str(&total);
            out.push('\n');
            Ok(out)
        }
    }
}

/// `--watch`: each row again whenever its record changes (only problems with `--problems`),
/// one line each in a table (the first table's layout), one document each in JSON or YAML.
async fn watch(
    client: &Client,
    args: &StatusArgs,
    filter: &Filter,
    selected: &BTreeSet<String>,
    rows: Vec<FleetRow>,
) -> ExitCode {
    let table = Table::new(&rows, args.output == Output::Wide);
    let mut last: BTreeMap<String, FleetRow> =
        rows.into_iter().map(|r| (r.namespace.clone(), r)).collect();
    let api: Api<AdmissionHealth> = filter.api(client);
    let cfg = watcher::Config::default().labels(&records_selector());
    let mut events = watcher(api, cfg).boxed();
    while let Some(ev) = events.next().await {
        let h = match ev {
            Ok(watcher::Event::Apply(h) | watcher::Event::InitApply(h)) => h,
            Ok(_) => continue,
            Err(e) => {
                eprintln!(
                    "warning: {}; watching again",
                    hcp_fleet_agent::human::WatchError(&e)
                );
                continue;
            }
        };
        let ns = h.namespace().unwrap_or_default();
        // A cluster the selector did not pick at the start stays out (an HCP created later
        // and matching is shown by the next `status`).
        if !is_health_record(&h) || (filter.selector.is_some() && !selected.contains(&ns)) {
            continue;
        }
        let r = row(&h);
        let was_problem = last.get(&ns).is_some_and(is_problem);
        if last.get(&ns) == Some(&r) || (args.problems && !is_problem(&r) && !was_problem) {
            continue;
        }
        last.insert(ns, r.clone());
        let out = match args.output {
            Output::Table | Output::Wide => table.row(&r),
            Output::Json => serde_json::to_string(&r)
                .map(|s| s + "\n")
                .unwrap_or_default(),
            Output::Yaml => serde_saphyr::to_string(&r)
                .map(|s| format!("---\n{s}"))
                .unwrap_or_default(),
        };
        print!("{out}");
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcp_fleet_render::reporting::Observation;
    use hcp_fleet_render::reporting::record::{next_status, render_health};

    #[test]
    fn a_row_shows_each_concern_and_the_drift_count() {
        let mut p = render_health("clusters-hc-1", "hc-1", None, None);
        let mut obs: hcp_fleet_render::reporting::Observations = Concern::ALL
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
            None,
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
            owner: "hcp-fleet-agent".into(),
            reason: String::new(),
            // As the record of an HCP with every guard inside its hosted kube-apiserver.
            paths: paths(
                &std::iter::repeat_n("policy", 13)
                    .chain(["none"])
                    .map(|p| hcp_fleet_model::crd::GuardPath {
                        name: format!("g-{p}"),
                        path: p.into(),
                    })
                    .collect::<Vec<_>>(),
            ),
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
    fn json_and_yaml_say_what_the_table_says_and_wide_says_why() {
        let mut bad = fleet_row("b", "NonCompliant");
        bad.reason = "hosted-webhooks: 401 Unauthorized".into();
        let rows = vec![fleet_row("a", "Compliant"), bad];
        let args = |output, problems| StatusArgs {
            output,
            problems,
            ..Default::default()
        };
        let json = print(&args(Output::Json, false), rows.clone(), vec![]).expect("json");
        let doc: serde_json::Value = serde_json::from_str(&json).expect("parses");
        assert_eq!(doc["clusters"][1]["cluster"], "b");
        assert_eq!(
            doc["clusters"][1]["concerns"]["hosted-webhooks"],
            "NonCompliant"
        );
        assert_eq!(
            doc["clusters"][1]["reason"],
            "hosted-webhooks: 401 Unauthorized"
        );
        assert_eq!(
            doc["clusters"][1]["paths"],
            serde_json::json!({"policy": 13, "none": 1})
        );
        assert_eq!(
            doc["summary"],
            serde_json::json!({"total": 2, "compliant": 1, "nonCompliant": 1, "pending": 0, "notReported": 0})
        );
        let yaml = print(&args(Output::Yaml, true), rows.clone(), vec![]).expect("yaml");
        let doc: serde_json::Value = serde_saphyr::from_str(&yaml).expect("parses");
        assert_eq!(
            doc["clusters"].as_array().map(Vec::len),
            Some(1),
            "problems only"
        );
        assert_eq!(doc["summary"]["total"], 2, "the summary counts all");
        let wide = print(&args(Output::Wide, false), rows.clone(), vec![]).expect("wide");
        let header = wide.lines().next().unwrap_or_default();
        let last: Vec<&str> = header.split_whitespace().rev().take(5).collect();
        assert_eq!(
            last,
            ["REASON", "PATHS", "REVISION", "OWNER", "NAMESPACE"],
            "{wide}"
        );
        assert!(
            wide.lines()
                .nth(2)
                .is_some_and(|l| l.contains("clusters-b  hcp-fleet-agent  r0 ")
                    && l.contains("  policy=13,none=1  ")
                    && l.ends_with("  hosted-webhooks: 401 Unauthorized")),
            "{wide}"
        );
        let table = print(&args(Output::Table, false), rows, vec![]).expect("table");
        assert!(
            !table.contains("REASON")
                && table.ends_with("2 hosted cluster(s): 1 Compliant, 1 NonCompliant, 0 Pending\n"),
            "{table}"
        );
    }

    #[test]
    fn a_row_says_why_from_the_ready_condition_or_an_older_records_history() {
        let mut h = render_health("clusters-hc-1", "hc-1", None, None);
        let mut obs: hcp_fleet_render::reporting::Observations = Concern::ALL
            .iter()
            .map(|c| (*c, Observation::compliant("ok")))
            .collect();
        obs.insert(Concern::Certificate, Observation::violation("expired"));
        let st = next_status(None, &obs, "t", 0, "r", true, Some(1));
        h.status = Some(st.clone());
        assert_eq!(row(&h).reason, "certificate: expired");
        h.status = Some(hcp_fleet_model::crd::AdmissionHealthStatus {
            conditions: vec![],
            ..st
        });
        assert_eq!(
            row(&h).reason,
            "certificate: NonCompliant; violation - expired"
        );
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
