//! The EC2 and S3 endpoint the operator will be tested against: moto's
//! server from the cached venv, on a free loopback port, keeps state across
//! calls and finds instances by tag (what crash-safe launching relies on).

use hangar_e2e::Moto;
use hangar_e2e::moto::auth_header as auth;
use hangar_e2e::process::http_request;

fn ec2(moto: &Moto, query: &str) -> String {
    let (status, body) =
        http_request(moto.port, "GET", &format!("/?{query}&Version=2016-11-15"), &[("Authorization", &auth("ec2"))])
            .expect("EC2 request");
    assert_eq!(status, 200, "{query}: {body}");
    body
}

#[test]
fn ec2_keeps_instances_and_filters_them_by_tag() {
    let moto = Moto::start(None).expect("start moto");
    assert!(ec2(&moto, "Action=DescribeInstances").contains("<reservationSet/>"), "a new endpoint starts empty");

    let run = ec2(
        &moto,
        "Action=RunInstances&ImageId=ami-12345678&MinCount=1&MaxCount=1&InstanceType=t4g.small\
         &TagSpecification.1.ResourceType=instance\
         &TagSpecification.1.Tag.1.Key=hangar.dev/session-id&TagSpecification.1.Tag.1.Value=s-1",
    );
    let id = run.split("<instanceId>").nth(1).and_then(|r| r.split('<').next()).expect("an instance id");
    assert!(id.starts_with("i-"), "{run}");

    let found = ec2(&moto, "Action=DescribeInstances&Filter.1.Name=tag:hangar.dev/session-id&Filter.1.Value.1=s-1");
    assert!(found.contains(id), "tag filter finds the instance: {found}");
    let other = ec2(&moto, "Action=DescribeInstances&Filter.1.Name=tag:hangar.dev/session-id&Filter.1.Value.1=s-2");
    assert!(!other.contains(id), "tag filter excludes other sessions: {other}");
}

#[test]
fn s3_stores_buckets() {
    let moto = Moto::start(None).expect("start moto");
    let s3 = auth("s3");
    let (status, body) = http_request(moto.port, "PUT", "/hangar-output", &[("Authorization", &s3)]).unwrap();
    assert_eq!(status, 200, "create bucket: {body}");
    let (status, body) = http_request(moto.port, "GET", "/", &[("Authorization", &s3)]).unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("<Name>hangar-output</Name>"), "{body}");
}
