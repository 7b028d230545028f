//! Figures from the agent's /metrics text: samples, request deltas by verb and resource, durations as printed.

use super::*;

/// A metric's samples: label text (inside the braces) → value.
pub(crate) fn samples(text: &str, metric: &str) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix(metric) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => match r.rsplit_once("} ") {
                Some((l, v)) => (l.to_string(), v),
                None => continue,
            },
            None => match rest.strip_prefix(' ') {
                Some(v) => (String::new(), v),
                None => continue,
            },
        };
        if let Ok(v) = value.trim().parse::<f64>() {
            *m.entry(labels).or_insert(0.0) += v;
        }
    }
    m
}

pub(crate) fn label<'a>(labels: &'a str, name: &str) -> &'a str {
    labels
        .split(&format!("{name}=\""))
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or("")
}

pub(crate) const MGMT_REQUESTS: &str = "hcp_fleet_management_api_requests_total";
pub(crate) const HOSTED_REQUESTS: &str = "hcp_fleet_hosted_api_requests_total";

pub(crate) fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

pub(crate) fn management_writes(text: &str) -> f64 {
    samples(text, MGMT_REQUESTS)
        .iter()
        .filter(|(l, _)| is_write(label(l, "verb")))
        .map(|(_, v)| v)
        .sum()
}

/// Management requests by "verb resource", `after - before`.
pub(crate) fn management_delta(before: &str, after: &str) -> BTreeMap<String, f64> {
    let b = samples(before, MGMT_REQUESTS);
    let mut out = BTreeMap::new();
    for (l, v) in samples(after, MGMT_REQUESTS) {
        let d = v - b.get(&l).copied().unwrap_or(0.0);
        if d > 0.0 {
            out.insert(
                format!("{} {}", label(&l, "verb"), label(&l, "resource")),
                d,
            );
        }
    }
    out
}

/// Hosted requests per HCP namespace, `after - before`.
pub(crate) fn hosted_delta(before: &str, after: &str) -> BTreeMap<String, f64> {
    let per_ns = |t: &str| {
        let mut m: BTreeMap<String, f64> = BTreeMap::new();
        for (l, v) in samples(t, HOSTED_REQUESTS) {
            *m.entry(label(&l, "hcp_namespace").to_string()).or_default() += v;
        }
        m
    };
    let b = per_ns(before);
    per_ns(after)
        .into_iter()
        .map(|(ns, v)| {
            let d = v - b.get(&ns).copied().unwrap_or(0.0);
            (ns, d)
        })
        .collect()
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

pub(crate) fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

pub(crate) fn is_real(ns: &str) -> bool {
    ns.starts_with("clusters-real-")
}

/// The admission Deployments in the HCP namespaces, and their replicas.
pub(crate) async fn admission_pods(mgmt: &Client, service: &str) -> Result<(usize, i64), String> {
    let lp = kube::api::ListParams::default().fields(&format!("metadata.name={service}"));
    let listed = Api::<k8s_openapi::api::apps::v1::Deployment>::all(mgmt.clone())
        .list(&lp)
        .await
        .map_err(|e| e.to_string())?;
    let pods = listed
        .items
        .iter()
        .map(|d| i64::from(d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)))
        .sum();
    Ok((listed.items.len(), pods))
}
