//! `hcp-fleet-agent`, the binary the image ships: the commands of every build, no test bed.

use std::process::ExitCode;

fn main() -> ExitCode {
    hcp_fleet_cli::main_with::<hcp_fleet_cli::NoExtra>(None)
}
