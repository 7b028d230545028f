//! The vocabulary every other crate speaks, with no I/O: the resource types the agent reads and
//! writes (`crd`: AdmissionHealth, AdmissionRollout, HostedControlPlane, ACM's Policy), their
//! conditions, the names of objects (`names`), how a live object is compared with a desired one
//! (`compare`), and a guard's `Mode`.

pub mod compare;
pub mod crd;
mod mode;
pub mod names;

pub use mode::Mode;
