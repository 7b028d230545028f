use std::process::ExitCode;

fn main() -> ExitCode {
    hcp_fleet_agent::cmd::main()
}
