//! The ACM side of the agent: what the hub is told (`hub`, the templates' verdicts), which
//! HCP an ACM managed cluster is (`managed_clusters`), and who may sync the agent's template
//! kind (`template_access`, the template-sync keeper). The per-HCP record is the report's
//! (`controller/report.rs`); this is everything that exists only because ACM does.

pub(crate) mod hub;
pub mod managed_clusters;
pub mod template_access;
