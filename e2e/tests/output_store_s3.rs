//! The output store's S3 path against moto's S3 (the production
//! configuration): chunks by offset, streams marked, sealed at rest.

use hangar_e2e::Moto;
use hangar_e2e::process::http_request;
use hangar_output::{AttemptKey, OutputStore, OutputWriter, Stream};

#[tokio::test]
async fn output_round_trips_through_s3_sealed() {
    let moto = Moto::start(None).expect("moto");
    let auth =
        "AWS4-HMAC-SHA256 Credential=AKIDLOCAL/20261130/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0";
    let (status, body) = http_request(moto.port, "PUT", "/hangar-output", &[("Authorization", auth)]).unwrap();
    assert_eq!(status, 200, "create bucket: {body}");
    // SAFETY: this test binary has this one test; nothing else reads the
    // environment concurrently.
    #[allow(unsafe_code, reason = "set_var is unsafe since edition 2024; see SAFETY")]
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
    }
    let store = OutputStore::s3("hangar-output", "us-east-1", Some(&moto.endpoint())).expect("S3 store");
    let spool = tempfile_dir();
    let k = AttemptKey::generate().unwrap();
    let key = || AttemptKey::from_bytes(k.as_slice()).unwrap();
    let mut w = OutputWriter::open(store.clone(), spool.clone(), "session-s3", 7, 1, key()).await.unwrap();
    w.append(Stream::Stdout, b"compiling...\n").await.unwrap();
    w.append(Stream::Stderr, b"warning: unused\n").await.unwrap();
    w.append(Stream::Stdout, b"done\n").await.unwrap();

    let keys = |_: u32| Some(key());
    let chunks = store.read_after("session-s3", 7, 0, &keys).await.unwrap();
    let text: Vec<u8> = chunks.iter().flat_map(|c| c.data.iter().copied()).collect();
    assert_eq!(text, b"compiling...\nwarning: unused\ndone\n");
    assert_eq!(chunks[1].stream, Stream::Stderr);
    assert_eq!(chunks[1].offset, 13);
    let tail = store.read_after("session-s3", 7, 20, &keys).await.unwrap();
    let tail: Vec<u8> = tail.iter().flat_map(|c| c.data.iter().copied()).collect();
    assert_eq!(tail, b": unused\ndone\n");
    assert_eq!(store.stored_end("session-s3", 7).await.unwrap(), 34);
    for raw in store.raw_objects("session-s3", 7).await.unwrap() {
        assert!(!raw.windows(7).any(|w| w == b"warning"), "plaintext at rest in S3");
    }
    let _ = std::fs::remove_dir_all(spool);
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("hangar-s3-spool-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
