//! Commands end to end on the local stack: the operator numbers them, the
//! real worker hands them to the real supervisor on a simulated node, the
//! output goes sealed into the store and is read back with the keys the
//! operator sealed under the organisation key.

use std::collections::BTreeSet;
use std::time::Duration;

use hangar_crds::{Command, CommandPhase, Phase, Sandbox};
use hangar_e2e::commands::{
    self as cmds, concat, phase as cphase, read_output, sh, stream, wait_command, wait_command_phase,
};
use hangar_e2e::sessions::{self, ensure_namespace, wait_phase};
use hangar_e2e::{LocalStack, shared_stack};
use hangar_output::Stream;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

fn number(c: &Command) -> u32 {
    c.status.as_ref().and_then(|s| s.number).expect("numbered") as u32
}

async fn set_state(api: &Api<Sandbox>, state: &str) {
    sessions::set_state(api, "box", state).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_reads_back_exactly_from_any_offset_with_streams_marked() {
    let stack = shared_stack();
    let (_, api, s) = sessions::running_box(stack, "cmd-output").await;
    let sid = s.uid().unwrap();
    // Separate writes, so each chunk is one stream.
    let script = "for i in 1 2 3; do echo out-$i; sleep 0.05; echo err-$i >&2; sleep 0.05; done; printf tail; exit 3";
    cmds::create(&api, &sh("c1", "box", script)).await;
    let done = wait_command_phase(stack, &api, "c1", CommandPhase::Exited).await;
    let st = done.status.clone().unwrap();
    assert_eq!(st.exit_code, Some(3));
    assert_eq!(st.number, Some(1));
    assert_eq!(st.job_id.as_deref(), Some(format!("{sid}/cmd/1").as_str()));
    assert_eq!(st.attempt, Some(1));
    assert!(st.started_at.is_some() && st.finished_at.is_some() && st.queued_at.is_some());

    let keys = cmds::output_keys(&stack.cp.client().await.unwrap(), &sid, 1).await;
    let all = read_output(stack, &keys, &sid, 1, 0).await;
    assert_eq!(stream(&all, Stream::Stdout), b"out-1\nout-2\nout-3\ntail");
    assert_eq!(stream(&all, Stream::Stderr), b"err-1\nerr-2\nerr-3\n");
    let whole = concat(&all);
    assert_eq!(whole, b"out-1\nerr-1\nout-2\nerr-2\nout-3\nerr-3\ntail", "one stream of bytes in the order written");
    assert_eq!(st.output_bytes, Some(whole.len() as i64));
    let mut at = 0;
    for c in &all {
        assert_eq!(c.offset, at, "offsets are continuous");
        at += c.data.len() as u64;
    }
    for after in 0..=whole.len() as u64 {
        assert_eq!(concat(&read_output(stack, &keys, &sid, 1, after).await), &whole[after as usize..], "from {after}");
    }
    // At rest the chunks are sealed: no plaintext in the raw objects.
    for raw in stack.output_store().raw_objects(&sid, 1).await.unwrap() {
        for word in [&b"out-"[..], b"err-", b"tail"] {
            assert!(!raw.windows(word.len()).any(|w| w == word), "plaintext in a stored object");
        }
    }
    // Without the key nothing opens.
    let wrong = std::collections::HashMap::from([(1u32, [7u8; 32])]);
    let key = |a: u32| wrong.get(&a).map(|k| hangar_output::AttemptKey::from_bytes(k).unwrap());
    assert!(stack.output_store().read_after(&sid, 1, 0, &key).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_cancels_and_final_statuses() {
    let stack = shared_stack();
    let (_, api, _) = sessions::running_box(stack, "cmd-statuses").await;
    let mut slow = sh("slow", "box", "echo started; exec sleep 300");
    slow.spec.timeout_seconds = 1;
    cmds::create(&api, &slow).await;
    // Takes a second to end after SIGTERM, so `cancelling` is visible.
    cmds::create(&api, &sh("cancel-me", "box", "trap 'sleep 1; exit 0' TERM; echo ready; sleep 300 & wait")).await;
    cmds::create(&api, &sh("ok", "box", "exit 0")).await;

    let t = wait_command_phase(stack, &api, "slow", CommandPhase::TimedOut).await;
    assert_eq!(t.status.as_ref().unwrap().exit_code, None);

    wait_command_phase(stack, &api, "cancel-me", CommandPhase::Running).await;
    cmds::cancel(&api, "cancel-me").await;
    wait_command_phase(stack, &api, "cancel-me", CommandPhase::Cancelling).await;
    wait_command_phase(stack, &api, "cancel-me", CommandPhase::Cancelled).await;
    let ok = wait_command_phase(stack, &api, "ok", CommandPhase::Exited).await;
    assert_eq!(ok.status.as_ref().unwrap().exit_code, Some(0));

    // A final status never changes, whoever tries.
    let back = json!({"status": {"phase": "running"}});
    let err = api.patch_status("ok", &PatchParams::default(), &Patch::Merge(&back)).await.unwrap_err();
    assert!(err.to_string().contains("sandbox_request_invalid: a command never leaves a final status"), "{err}");
    let renumber = json!({"status": {"number": 9}});
    let err = api.patch_status("ok", &PatchParams::default(), &Patch::Merge(&renumber)).await.unwrap_err();
    assert!(err.to_string().contains("number never changes"), "{err}");
    let rejob = json!({"status": {"jobId": "another-session/cmd/1"}});
    let err = api.patch_status("ok", &PatchParams::default(), &Patch::Merge(&rejob)).await.unwrap_err();
    assert!(err.to_string().contains("jobId is written once"), "{err}");
    // Bound to its session by uid: never moved to another session.
    assert!(ok.status.as_ref().unwrap().sandbox_uid.is_some(), "numbered and bound");
    let rebind = json!({"status": {"sandboxUid": "a-later-session"}});
    let err = api.patch_status("ok", &PatchParams::default(), &Patch::Merge(&rebind)).await.unwrap_err();
    assert!(err.to_string().contains("sandboxUid is written once"), "{err}");
    // A running command never goes back to queued (to be run again).
    cmds::create(&api, &sh("hold", "box", "exec sleep 300")).await;
    wait_command_phase(stack, &api, "hold", CommandPhase::Running).await;
    let requeue = json!({"status": {"phase": "queued"}});
    let err = api.patch_status("hold", &PatchParams::default(), &Patch::Merge(&requeue)).await.unwrap_err();
    assert!(err.to_string().contains("phase only moves forward"), "{err}");
    cmds::cancel(&api, "hold").await;
    wait_command_phase(stack, &api, "hold", CommandPhase::Cancelled).await;
    // Cancel is final, and cancelling an exited command changes nothing.
    cmds::cancel(&api, "ok").await;
    let undo =
        api.patch("cancel-me", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"cancel": false}}))).await;
    assert!(undo.unwrap_err().to_string().contains("sandbox_command_cancelled"));
    let still = wait_command(stack, &api, "ok", "seen", |c| c.spec.cancel).await;
    assert_eq!(cphase(&still), Some(CommandPhase::Exited));
}

/// Commands that wait for a file in the workspace, so the test decides when
/// they end.
fn gated(name: &str) -> Command {
    sh(name, "box", "while [ ! -f gate ]; do sleep 0.05; done; echo done")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_run_at_once_numbers_have_no_gaps_and_a_cancelled_queued_command_never_runs() {
    let stack = shared_stack();
    let (boxes, api, s) = sessions::running_box(stack, "cmd-limits").await;
    let volume = s.status.as_ref().unwrap().volume_id.clone().unwrap();
    let workspace = stack.sim.volume_dir(&volume);
    // 20 created at once.
    let creates = (1..=20).map(|i| {
        let api = api.clone();
        async move { cmds::create(&api, &gated(&format!("g{i:02}"))).await }
    });
    futures::future::join_all(creates).await;
    let mut all = Vec::new();
    for i in 1..=20 {
        all.push(
            wait_command(stack, &api, &format!("g{i:02}"), "numbered", |c| {
                c.status.as_ref().and_then(|s| s.number).is_some()
            })
            .await,
        );
    }
    let numbers: BTreeSet<u32> = all.iter().map(number).collect();
    assert_eq!(numbers, (1..=20).collect(), "1..20, no gap, no duplicate");

    // Sixteen run; the rest wait, lowest numbers first.
    let list = loop {
        let list = api.list(&Default::default()).await.unwrap().items;
        let running = list.iter().filter(|c| cphase(c) == Some(CommandPhase::Running)).count();
        assert!(running <= 16, "{running} running at once");
        if running == 16 {
            break list;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut queued: Vec<u32> = list.iter().filter(|c| cphase(c) == Some(CommandPhase::Queued)).map(number).collect();
    queued.sort();
    assert_eq!(queued, vec![17, 18, 19, 20], "the highest numbers wait");
    let counts = |total, unfinished, running| {
        move |s: &Sandbox| {
            s.status
                .as_ref()
                .and_then(|st| st.commands.as_ref())
                .is_some_and(|c| (c.total, c.unfinished, c.running) == (total, unfinished, running))
        }
    };
    sessions::wait_for(stack, &boxes, "box", "counting 20 commands, 16 running", counts(20, 20, 16)).await;

    // Cancel a queued one: it never runs, even when a slot frees.
    let victim = list.iter().find(|c| number(c) == 20).unwrap().name_any();
    cmds::cancel(&api, &victim).await;
    let c = wait_command_phase(stack, &api, &victim, CommandPhase::Cancelled).await;
    assert!(c.status.as_ref().unwrap().started_at.is_none());

    std::fs::write(workspace.join("gate"), b"").unwrap();
    for c in &all {
        if c.name_any() == victim {
            continue;
        }
        let done = wait_command_phase(stack, &api, &c.name_any(), CommandPhase::Exited).await;
        assert_eq!(done.status.as_ref().unwrap().exit_code, Some(0));
    }
    let c = api.get(&victim).await.unwrap();
    assert_eq!(cphase(&c), Some(CommandPhase::Cancelled));
    assert!(c.status.as_ref().unwrap().started_at.is_none(), "a cancelled command never started");
    sessions::wait_for(stack, &boxes, "box", "counting 20 commands, all finished", counts(20, 0, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_kills_running_commands_and_queued_ones_run_after_resume() {
    let stack = shared_stack();
    let (boxes, api, s) = sessions::running_box(stack, "cmd-pause").await;
    let sid = s.uid().unwrap();
    for i in 1..=16 {
        cmds::create(&api, &sh(&format!("r{i:02}"), "box", "echo before-pause; exec sleep 300")).await;
    }
    for i in 1..=16 {
        wait_command(stack, &api, &format!("r{i:02}"), "running with output", |c| {
            cphase(c) == Some(CommandPhase::Running)
        })
        .await;
    }
    cmds::create(&api, &sh("queued", "box", "echo ran-in-attempt-2; cat notes")).await;
    wait_command_phase(stack, &api, "queued", CommandPhase::Queued).await;

    set_state(&boxes, "Paused").await;
    wait_phase(stack, &boxes, "box", Phase::Paused).await;
    for i in 1..=16 {
        let c = wait_command_phase(stack, &api, &format!("r{i:02}"), CommandPhase::KilledAtPause).await;
        assert_eq!(c.status.as_ref().unwrap().attempt, Some(1));
    }
    assert_eq!(cphase(&api.get("queued").await.unwrap()), Some(CommandPhase::Queued), "queued stays queued");
    // Sent while paused: numbered and queued; one cancelled never runs.
    cmds::create(&api, &sh("while-paused", "box", "echo sent-while-paused")).await;
    cmds::create(&api, &sh("cancelled-while-paused", "box", "echo must-not-run > ran")).await;
    wait_command_phase(stack, &api, "while-paused", CommandPhase::Queued).await;
    wait_command_phase(stack, &api, "cancelled-while-paused", CommandPhase::Queued).await;
    cmds::cancel(&api, "cancelled-while-paused").await;
    wait_command_phase(stack, &api, "cancelled-while-paused", CommandPhase::Cancelled).await;
    let volume = s.status.as_ref().unwrap().volume_id.clone().unwrap();
    std::fs::write(stack.sim.volume_dir(&volume).join("notes"), b"kept across the pause\n").unwrap();

    set_state(&boxes, "Running").await;
    wait_phase(stack, &boxes, "box", Phase::Running).await;
    let q = wait_command_phase(stack, &api, "queued", CommandPhase::Exited).await;
    assert_eq!(q.status.as_ref().unwrap().attempt, Some(2), "ran in the new attempt");
    wait_command_phase(stack, &api, "while-paused", CommandPhase::Exited).await;
    assert_eq!(cphase(&api.get("cancelled-while-paused").await.unwrap()), Some(CommandPhase::Cancelled));
    assert!(!stack.sim.volume_dir(&volume).join("ran").exists(), "a cancelled command never ran");

    // Output of both attempts reads back, each under its own attempt's key.
    let keys = cmds::output_keys(&stack.cp.client().await.unwrap(), &sid, 2).await;
    assert!(keys.contains_key(&1) && keys.contains_key(&2) && keys[&1] != keys[&2]);
    let first = number(&api.get("r01").await.unwrap());
    assert_eq!(concat(&read_output(stack, &keys, &sid, first, 0).await), b"before-pause\n");
    let n = number(&q);
    assert_eq!(concat(&read_output(stack, &keys, &sid, n, 0).await), b"ran-in-attempt-2\nkept across the pause\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_stream_loses_and_repeats_nothing() {
    let stack = shared_stack();
    let (_, api, s) = sessions::running_box(stack, "cmd-worker-kill").await;
    let sid = s.uid().unwrap();
    let node = s.status.as_ref().unwrap().instance_id.clone().unwrap();
    let script = "i=1; while [ $i -le 300 ]; do echo line-$i; echo err-$i >&2; i=$((i+1)); sleep 0.01; done";
    cmds::create(&api, &sh("stream", "box", script)).await;
    wait_command_phase(stack, &api, "stream", CommandPhase::Running).await;
    // Some output is stored, then the worker dies (SIGKILL) mid-stream.
    let store = stack.output_store();
    let deadline = std::time::Instant::now() + sessions::DEADLINE;
    while store.stored_end(&sid, 1).await.unwrap() == 0 {
        assert!(std::time::Instant::now() < deadline, "no output stored");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = stack.sim.pid(&node, "worker").expect("worker pid");
    // SAFETY: the simulated node's worker, started by this test's stack.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let c = wait_command_phase(stack, &api, "stream", CommandPhase::Exited).await;
    assert_ne!(stack.sim.pid(&node, "worker"), Some(pid), "a new worker finished the job");
    let keys = cmds::output_keys(&stack.cp.client().await.unwrap(), &sid, 1).await;
    let all = read_output(stack, &keys, &sid, 1, 0).await;
    let want_out: String = (1..=300).map(|i| format!("line-{i}\n")).collect();
    let want_err: String = (1..=300).map(|i| format!("err-{i}\n")).collect();
    assert_eq!(String::from_utf8(stream(&all, Stream::Stdout)).unwrap(), want_out);
    assert_eq!(String::from_utf8(stream(&all, Stream::Stderr)).unwrap(), want_err);
    assert_eq!(c.status.as_ref().unwrap().output_bytes, Some((want_out.len() + want_err.len()) as i64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_running_when_its_container_died_ends_outcome_unknown_and_never_reruns() {
    let stack = shared_stack();
    let (_, api, s) = sessions::running_box(stack, "cmd-unknown").await;
    let node = s.status.as_ref().unwrap().instance_id.clone().unwrap();
    let volume = s.status.as_ref().unwrap().volume_id.clone().unwrap();
    cmds::create(&api, &sh("victim", "box", "echo run >> runs; exec sleep 300")).await;
    wait_command_phase(stack, &api, "victim", CommandPhase::Running).await;
    let runs = stack.sim.volume_dir(&volume).join("runs");
    let deadline = std::time::Instant::now() + sessions::DEADLINE;
    while !runs.exists() {
        assert!(std::time::Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = stack.sim.pid(&node, "supervisor").expect("supervisor pid");
    // SAFETY: the simulated agent container's PID 1.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let c = wait_command_phase(stack, &api, "victim", CommandPhase::OutcomeUnknown).await;
    assert!(c.status.as_ref().unwrap().reason.is_some());
    // A new command runs in the restarted container; the victim did not run again.
    cmds::create(&api, &sh("after", "box", "cat runs")).await;
    wait_command_phase(stack, &api, "after", CommandPhase::Exited).await;
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "run\n", "ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_for_a_missing_or_ended_session_is_refused_and_nothing_is_created() {
    let stack = shared_stack();
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, "cmd-refused").await;
    let api: Api<Command> = Api::namespaced(client.clone(), "cmd-refused");
    let err = api.create(&PostParams::default(), &sh("orphan", "nope", "true")).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(e) if e.code == 404 && e.message.contains("sandbox_not_found: no Sandbox nope")),
        "{err}"
    );
    assert!(api.get_opt("orphan").await.unwrap().is_none());

    let boxes: Api<Sandbox> = Api::namespaced(client, "cmd-refused");
    boxes.create(&PostParams::default(), &sessions::sandbox("box", "commands", json!({}))).await.unwrap();
    set_state(&boxes, "Ended").await;
    let err = api.create(&PostParams::default(), &sh("late", "box", "true")).await.unwrap_err();
    assert!(matches!(&err, kube::Error::Api(e) if e.code == 409 && e.message.contains("sandbox_ended:")), "{err}");
    assert!(api.get_opt("late").await.unwrap().is_none());
}

/// Creates `names` at once and waits until each has a number.
async fn create_all(stack: &LocalStack, api: &Api<Command>, commands: Vec<Command>) {
    let names: Vec<String> = commands.iter().map(|c| c.name_any()).collect();
    futures::future::join_all(commands.iter().map(|c| cmds::create(api, c))).await;
    for n in names {
        wait_command(stack, api, &n, "final", |c| cphase(c).is_some_and(CommandPhase::is_final)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_65th_unfinished_and_the_248th_command_are_refused() {
    let stack = shared_stack();
    let (_, api, s) = sessions::running_box(stack, "cmd-admission").await;
    let workspace = stack.sim.volume_dir(s.status.as_ref().unwrap().volume_id.as_ref().unwrap());
    let limit = |e: kube::Error, text: &str| {
        assert!(
            matches!(&e, kube::Error::Api(a) if a.code == 409 && a.message.contains(&format!("sandbox_command_limit: {text}"))),
            "{e}"
        );
    };

    // 64 unfinished (16 running, 48 queued): the 65th is refused.
    let gated_64: Vec<Command> = (1..=64).map(|i| gated(&format!("u{i:02}"))).collect();
    futures::future::join_all(gated_64.iter().map(|c| cmds::create(&api, c))).await;
    let err = api.create(&PostParams::default(), &sh("u65", "box", "true")).await.unwrap_err();
    limit(err, "at most 64 commands of a session may be unfinished");
    assert!(api.get_opt("u65").await.unwrap().is_none());
    std::fs::write(workspace.join("gate"), b"").unwrap();
    for i in 1..=64 {
        wait_command_phase(stack, &api, &format!("u{i:02}"), CommandPhase::Exited).await;
    }

    // Up to 247 in all, sent 61 at a time (cancelled at once, so they end
    // without running): every number 1..247 given exactly once.
    let mut next = 65;
    while next <= 247 {
        let batch: Vec<Command> = (next..=(next + 60).min(247))
            .map(|i| {
                let mut c = sh(&format!("k{i:03}"), "box", "true");
                c.spec.cancel = true;
                c
            })
            .collect();
        next += batch.len();
        create_all(stack, &api, batch).await;
    }
    let err = api.create(&PostParams::default(), &sh("k248", "box", "true")).await.unwrap_err();
    limit(err, "a session takes at most 247 commands");
    let list = api.list(&Default::default()).await.unwrap().items;
    let numbers: BTreeSet<u32> = list.iter().map(number).collect();
    assert_eq!(list.len(), 247);
    assert_eq!(numbers, (1..=247).collect(), "no gap, no duplicate");
}
