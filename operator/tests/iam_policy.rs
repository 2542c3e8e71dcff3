//! The operator's IAM policy (`docs/iam/operator-policy.json`) grants
//! exactly the AWS calls the operator's code makes: every EC2 and SQS
//! operation its clients call, `ec2:CreateTags` only for tag-on-create,
//! `iam:PassRole` for the instance profile, `s3:PutObject` for the session
//! certificates. A call added without a policy change, or an action left in
//! the policy that no code calls, fails here.

use std::collections::BTreeSet;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root")
}

/// `PascalCase` of every `<client>.<operation>()` in `file`, where the
/// client is named `client` (EC2) or `sqs`.
fn operations(file: &str, client: &str) -> BTreeSet<String> {
    let text: String =
        std::fs::read_to_string(root().join(file)).expect("source").chars().filter(|c| !c.is_whitespace()).collect();
    let needle = format!("{client}.");
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices(&needle) {
        let rest = &text[at + needle.len()..];
        let name: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
        if !name.is_empty() && rest[name.len()..].starts_with("()") && name.contains('_') {
            let pascal: String = name.split('_').map(|w| w[..1].to_ascii_uppercase() + &w[1..]).collect();
            found.insert(pascal);
        }
    }
    found
}

fn policy_actions(service: &str) -> BTreeSet<String> {
    let policy: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("docs/iam/operator-policy.json")).unwrap()).unwrap();
    let mut actions = BTreeSet::new();
    for statement in policy["Statement"].as_array().unwrap() {
        assert_eq!(statement["Effect"], "Allow");
        assert!(statement["Sid"].is_string(), "every statement says why: {statement}");
        for a in statement["Action"].as_array().unwrap() {
            let (svc, action) = a.as_str().unwrap().split_once(':').unwrap();
            assert_ne!(action, "*", "no wildcard actions");
            if svc == service {
                actions.insert(action.to_owned());
            }
        }
    }
    actions
}

#[test]
fn the_policy_grants_exactly_the_calls_the_operator_makes() {
    let mut ec2 = BTreeSet::new();
    for file in ["instances.rs", "volumes.rs", "mod.rs", "watcher.rs"] {
        ec2.extend(operations(&format!("operator/src/ec2/{file}"), "client"));
    }
    assert!(ec2.contains("RunInstances") && ec2.contains("DeleteVolume"), "the scan finds the calls: {ec2:?}");
    // Tags go on at RunInstances/CreateVolume (TagSpecifications), which
    // EC2 authorises as CreateTags with ec2:CreateAction.
    ec2.insert("CreateTags".into());
    assert_eq!(policy_actions("ec2"), ec2);

    let sqs = operations("operator/src/ec2/interruption_queue.rs", "sqs");
    assert_eq!(policy_actions("sqs"), sqs);
    assert_eq!(policy_actions("iam"), BTreeSet::from(["PassRole".to_owned()]));
    assert_eq!(policy_actions("s3"), BTreeSet::from(["PutObject".to_owned()]));
}
