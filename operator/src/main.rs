//! hangar-operator. The Sandbox lifecycle controller and EC2 node provider
//! arrive with the lifecycle issue; until then this binary only reports
//! that, so the chart's Deployment has an image entrypoint to point at.

fn main() -> std::process::ExitCode {
    eprintln!("hangar-operator {}: no controllers are built in yet", env!("CARGO_PKG_VERSION"));
    std::process::ExitCode::FAILURE
}
