//! Pure renderings: from an HCP, the agent's configuration and a certificate, what the agent
//! wants to exist, computed without I/O so that a unit test can say everything about it.
//!
//! - `config`: the agent's configuration, validated;
//! - `certificates`: the serving and probe certificates' policy (issue, renew, trust);
//! - `management`: the objects in each HCP namespace (the admission service and its own);
//! - `hosted`: what goes into each hosted cluster (webhook configurations, admission
//!   policies, static manifests, canaries' RBAC), and how a live object is compared with it;
//! - `rollout` and `overrides`: which configuration an HCP gets while a rollout moves;
//! - `reporting`: the health record and its ACM Policy status from what a reconcile saw;
//! - `internal_registry`: what the pod image spec mutation knows of a hosted cluster's
//!   internal registry, and the ConfigMap that carries it to the admission service;
//! - `switch_over`: when an HCP's guards are proven in force for MCVW's package to go, and
//!   the label that says so.
//!
//! The controllers that apply these live in `hcp-fleet-agent`.

pub mod certificates;
pub mod config;
pub mod hosted;
pub mod internal_registry;
pub mod management;
pub mod overrides;
pub mod reporting;
pub mod rollout;
pub mod switch_over;
