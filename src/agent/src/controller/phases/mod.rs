//! The phases of one reconcile (docs/architecture.md, "One reconcile, phase by phase"), each a
//! module that takes what the phases before it produced and returns its product; the order
//! they run in is `reconcile::phases`.
//!
//! | module | phase |
//! |---|---|
//! | `hosted_access` | the hosted client from the kubeconfig Secret, and the claim on its cluster |
//! | `internal_registry` | the hosted cluster's image registry config, for the pod image spec mutation |
//! | `static_guards` | the static guards' ConfigMap, written so no guard is without a path, and whether they are in force |
//! | `certificates` | the CA and serving certificate |
//! | `trust` | the hosted caBundle trusts whatever any replica serves (trust first, retire last) |
//! | `admission_service` | the management-side objects of the admission service, and its availability |
//! | `hosted_webhooks` | webhook configurations and admission policies in the hosted cluster |
//! | `probe`, `canary`, `proof` | the end-to-end proof: the probe and its task, the canaries, whose answer it is |
//! | `switch_over` | the namespace's switch-over label, once the guards are proven |

pub(in crate::controller) mod admission_service;
pub(in crate::controller) mod canary;
pub(in crate::controller) mod certificates;
pub(in crate::controller) mod hosted_access;
pub(in crate::controller) mod hosted_webhooks;
pub(in crate::controller) mod internal_registry;
pub(in crate::controller) mod probe;
pub(in crate::controller) mod proof;
pub(in crate::controller) mod static_guards;
pub(in crate::controller) mod switch_over;
pub(in crate::controller) mod trust;
