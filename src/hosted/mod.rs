//! The hosted clusters: access through each HCP's kubeconfig secret, and the guards installed
//! there: webhook configurations (`webhooks`) and, where served, admission policies
//! (`policies`), both rendered purely from the configuration over what they have in common
//! (`objects`); what the canaries that prove each guard need there (`canary`); and the lean
//! list-then-watch the drift watch reads them with (`watch`).

pub mod admission_policies;
pub mod canary;
#[cfg(test)]
mod cel_cases;
pub mod clients;
pub mod exemptions;
pub mod kubeconfig;
pub mod objects;
pub mod static_guards;
#[cfg(test)]
mod tampering;
pub mod wanted;
pub mod watch;
pub mod webhooks;
