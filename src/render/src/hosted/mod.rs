//! What goes into the hosted clusters: webhook configurations (`webhooks`) and, where served, admission policies
//! (`policies`; what every hosted cluster's share is rendered once per configuration,
//! `shared_policies`), both rendered purely from the configuration over what they have in common
//! (`objects`); what the canaries that prove each guard need there (`canary`);. Access to the hosted clusters (clients,
//! the drift watch, kubeconfig checks) is I/O, in `hcp_fleet_agent::hosted`.

pub mod admission_policies;
pub mod canary;
#[cfg(test)]
mod cel_cases;
#[cfg(test)]
mod cel_mutation_cases;
pub mod exemptions;
pub mod objects;
mod shared_policies;
pub mod static_guards;
#[cfg(test)]
mod tampering;
pub mod wanted;
pub mod webhooks;
