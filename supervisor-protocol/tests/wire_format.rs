//! The wire format is what a worker and a supervisor of different builds
//! agree on: a change here is a protocol change.

use hangar_supervisor_protocol::{EndedBy, FromSupervisor, Hello, OutputStream, Sequenced, ToSupervisor};
use serde_json::json;

#[test]
fn worker_messages_keep_their_wire_format() {
    let run = ToSupervisor::Run {
        id: 7,
        argv: vec!["ls".into()],
        env: vec![("A".into(), "b".into())],
        cwd: None,
        timeout_seconds: 5,
    };
    assert_eq!(
        serde_json::to_value(&run).unwrap(),
        json!({"type": "run", "id": 7, "argv": ["ls"], "env": [["A", "b"]], "cwd": null, "timeout_seconds": 5})
    );
    assert_eq!(serde_json::to_value(ToSupervisor::Cancel { id: 7 }).unwrap(), json!({"type": "cancel", "id": 7}));
    assert_eq!(serde_json::to_value(ToSupervisor::KillAll).unwrap(), json!({"type": "kill_all"}));
    assert_eq!(serde_json::to_value(ToSupervisor::Ack { upto: 3 }).unwrap(), json!({"type": "ack", "upto": 3}));
}

#[test]
fn supervisor_messages_keep_their_wire_format() {
    let hello: Hello = serde_json::from_str(r#"{"boot":"1-2","known":[1,3]}"#).unwrap();
    assert_eq!(hello, Hello { boot: "1-2".into(), known: vec![1, 3] });
    let exited = Sequenced {
        seq: 4,
        msg: FromSupervisor::Exited { id: 7, exit_code: None, signal: Some(9), ended_by: EndedBy::KillAll },
    };
    assert_eq!(
        serde_json::to_value(&exited).unwrap(),
        json!({"seq": 4, "msg": {"type": "exited", "id": 7, "exit_code": null, "signal": 9, "ended_by": "kill_all"}})
    );
    let output: Sequenced = serde_json::from_value(json!({
        "seq": 1, "msg": {"type": "output", "id": 7, "stream": "stderr", "offset": 10, "data_b64": "aGk="}
    }))
    .unwrap();
    assert_eq!(
        output.msg,
        FromSupervisor::Output { id: 7, stream: OutputStream::Stderr, offset: 10, data_b64: "aGk=".into() }
    );
    assert_eq!(
        serde_json::to_value(FromSupervisor::AgentExited { exit_code: Some(0), signal: None }).unwrap(),
        json!({"type": "agent_exited", "exit_code": 0, "signal": null})
    );
    assert_eq!(
        serde_json::to_value(FromSupervisor::Failed { id: 2, message: "no such file".into() }).unwrap(),
        json!({"type": "failed", "id": 2, "message": "no such file"})
    );
    assert_eq!(
        serde_json::to_value(FromSupervisor::Started { id: 2, pid: 40 }).unwrap(),
        json!({"type": "started", "id": 2, "pid": 40})
    );
}
