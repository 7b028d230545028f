//! The controller's I/O helpers, which the phases share: writing what the agent owns
//! (`apply`), reading it back from the watches already running (`cache`, `text_store`), the
//! watches beside the controller's own (`watches`: each hosted cluster's drift watch, the HCP
//! deletion watch), the index of Services that could condemn guest webhooks
//! (`guest_services`) and the index of the hosted clusters the health records claim
//! (`claims`).

pub(in crate::controller) mod apply;
pub(in crate::controller) mod cache;
pub(in crate::controller) mod claims;
pub(in crate::controller) mod guest_services;
pub(in crate::controller) mod text_store;
pub(in crate::controller) mod watches;
