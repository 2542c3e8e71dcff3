//! A dependency that does not answer at start-up is waited for, never a
//! reason to exit: the operator, started while EC2 answers every
//! DescribeInstances with a server error, stays up and not ready, retries
//! with backoff, and becomes ready once EC2 answers.

use std::time::{Duration, Instant};

use hangar_e2e::ec2_faults::{Fault, FaultProxy};
use hangar_e2e::process::http_get;
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};

#[test]
fn the_operator_waits_for_ec2_instead_of_exiting() {
    let cp = ControlPlane::start().expect("control plane");
    let stack = LocalStack::start(cp, StackOptions::default()).expect("stack");
    let proxy = FaultProxy::start(stack.moto.port);
    proxy.inject(Fault {
        action: "DescribeInstances",
        body_contains: vec![],
        code: "InternalError",
        status: 500,
        times: 3,
    });
    stack.operator().restart_with_endpoint(&proxy.endpoint()).expect("operator alive");
    let pid = stack.operator().pid();
    let port = stack.operator().admin_port;
    let readyz = || http_get(port, "/readyz").map(|(s, _)| s).unwrap_or(0);

    assert_eq!(readyz(), 503, "not ready while EC2 fails");
    let deadline = Instant::now() + Duration::from_secs(60);
    while readyz() != 200 {
        assert!(!stack.operator().has_exited(), "the operator exited:\n{}", stack.operator().log_tail(20));
        assert!(Instant::now() < deadline, "never ready:\n{}", stack.operator().log_tail(20));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(stack.operator().pid(), pid, "the same process, never restarted");
    let failed = proxy.seen("").iter().filter(|c| c.injected == Some("InternalError")).count();
    assert_eq!(failed, 3, "every injected failure was met and retried");
    assert!(stack.operator().log_tail(200).contains("not ready"), "why it waits is logged");
}
