//! The output store on a real directory: offsets, streams, replay from any
//! offset, re-send after a crash, sealing at rest, erasure.

use hangar_output::{AttemptKey, Chunk, OutputStore, OutputWriter, ReadError, Stream};

const SESSION: &str = "6d0f7a52-1111-4c1e-9a53-0c8f3b2a9e10";

fn key(bytes: &[u8; 32]) -> AttemptKey {
    AttemptKey::from_bytes(bytes).unwrap()
}

fn concat(chunks: &[Chunk]) -> Vec<u8> {
    chunks.iter().flat_map(|c| c.data.iter().copied()).collect()
}

#[tokio::test]
async fn output_reads_back_from_any_offset_with_streams_marked() {
    let dir = tempfile::tempdir().unwrap();
    let store = OutputStore::local(&dir.path().join("store")).unwrap();
    let k = AttemptKey::generate().unwrap();
    let mut w = OutputWriter::open(store.clone(), dir.path().join("spool"), SESSION, 1, 1, key(&k)).await.unwrap();
    w.append(Stream::Stdout, b"hello ").await.unwrap();
    w.append(Stream::Stderr, b"warning\n").await.unwrap();
    w.append(Stream::Stdout, b"world\n").await.unwrap();
    let keys = |a: u32| (a == 1).then(|| key(&k));

    let all = store.read_after(SESSION, 1, 0, &keys).await.unwrap();
    assert_eq!(concat(&all), b"hello warning\nworld\n");
    assert_eq!(
        all.iter().map(|c| (c.stream, c.offset)).collect::<Vec<_>>(),
        [(Stream::Stdout, 0), (Stream::Stderr, 6), (Stream::Stdout, 14)]
    );
    for after in 0..=20u64 {
        let tail = store.read_after(SESSION, 1, after, &keys).await.unwrap();
        assert_eq!(concat(&tail), &b"hello warning\nworld\n"[after as usize..], "from offset {after}");
    }
    assert_eq!(store.stored_end(SESSION, 1).await.unwrap(), 20);

    // Sealed at rest: the plaintext is nowhere in the stored objects.
    for raw in store.raw_objects(SESSION, 1).await.unwrap() {
        for word in [&b"hello"[..], b"warning", b"world"] {
            assert!(!raw.windows(word.len()).any(|w| w == word), "plaintext in a stored object");
        }
    }
}

#[tokio::test]
async fn a_capped_read_says_more_follows_until_the_last_page() {
    let dir = tempfile::tempdir().unwrap();
    let store = OutputStore::local(&dir.path().join("store")).unwrap();
    let k = AttemptKey::generate().unwrap();
    let mut w = OutputWriter::open(store.clone(), dir.path().join("spool"), SESSION, 4, 1, key(&k)).await.unwrap();
    for part in [&b"aaaa"[..], b"bbbb", b"cccc"] {
        w.append(Stream::Stdout, part).await.unwrap();
    }
    let keys = |_: u32| Some(key(&k));
    // Pages of at most 5 bytes (whole chunks, the one reaching the cap
    // included): 8 bytes then 4, and only the last has nothing after it.
    let (mut after, mut pages) = (0u64, Vec::new());
    loop {
        let page = store.read_after_at_most(SESSION, 4, after, 5, &keys).await.unwrap();
        after += page.chunks.iter().map(|c| c.data.len() as u64).sum::<u64>();
        pages.push((concat(&page.chunks), page.more));
        if !page.more {
            break;
        }
    }
    assert_eq!(pages, [(b"aaaabbbb".to_vec(), true), (b"cccc".to_vec(), false)]);
}

#[tokio::test]
async fn a_chunk_spooled_before_a_crash_is_sent_once_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = OutputStore::local(&dir.path().join("store")).unwrap();
    let spool = dir.path().join("spool");
    let k = AttemptKey::generate().unwrap();
    let mut w = OutputWriter::open(store.clone(), spool.clone(), SESSION, 2, 1, key(&k)).await.unwrap();
    w.append(Stream::Stdout, b"first ").await.unwrap();
    w.append_spooled_only(Stream::Stdout, b"second ").unwrap();
    drop(w); // the worker dies before the upload
    let keys = |_: u32| Some(key(&k));
    assert_eq!(concat(&store.read_after(SESSION, 2, 0, &keys).await.unwrap()), b"first ", "not uploaded yet");
    // A restarted worker sends what is spooled before it opens anything.
    hangar_output::resend_spooled(&store, &spool, SESSION).await.unwrap();
    assert_eq!(concat(&store.read_after(SESSION, 2, 0, &keys).await.unwrap()), b"first second ");

    let mut w = OutputWriter::open(store.clone(), spool, SESSION, 2, 1, key(&k)).await.unwrap();
    assert_eq!(w.offset(), 13, "continues after the re-sent chunk");
    w.append(Stream::Stdout, b"third").await.unwrap();
    assert_eq!(concat(&store.read_after(SESSION, 2, 0, &keys).await.unwrap()), b"first second third");
}

#[tokio::test]
async fn each_attempt_has_its_key_and_a_destroyed_key_erases_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let store = OutputStore::local(&dir.path().join("store")).unwrap();
    let spool = dir.path().join("spool");
    let (k1, k2) = (AttemptKey::generate().unwrap(), AttemptKey::generate().unwrap());
    let mut w = OutputWriter::open(store.clone(), spool.clone(), SESSION, 3, 1, key(&k1)).await.unwrap();
    w.append(Stream::Stdout, b"attempt one;").await.unwrap();
    let mut w = OutputWriter::open(store.clone(), spool, SESSION, 3, 2, key(&k2)).await.unwrap();
    w.append(Stream::Stdout, b"attempt two").await.unwrap();

    let both = |a: u32| match a {
        1 => Some(key(&k1)),
        2 => Some(key(&k2)),
        _ => None,
    };
    assert_eq!(concat(&store.read_after(SESSION, 3, 0, &both).await.unwrap()), b"attempt one;attempt two");
    let wrong = |_: u32| Some(key(&k2));
    assert!(matches!(store.read_after(SESSION, 3, 0, &wrong).await, Err(ReadError::Seal(..))));
    let erased = |_: u32| None;
    assert!(matches!(store.read_after(SESSION, 3, 0, &erased).await, Err(ReadError::Erased(1))));
}

#[tokio::test]
async fn a_chunk_delivered_again_is_stored_once_and_a_gap_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = OutputStore::local(&dir.path().join("store")).unwrap();
    let k = AttemptKey::generate().unwrap();
    let mut w = OutputWriter::open(store.clone(), dir.path().join("spool"), SESSION, 3, 1, key(&k)).await.unwrap();
    assert_eq!(w.write_at(Stream::Stdout, 0, b"abc".to_vec()).await.unwrap(), 3);
    assert_eq!(w.write_at(Stream::Stdout, 0, b"abc".to_vec()).await.unwrap(), 3, "the same chunk again");
    assert_eq!(w.write_at(Stream::Stderr, 3, b"def".to_vec()).await.unwrap(), 6);
    assert!(matches!(
        w.write_at(Stream::Stdout, 9, b"x".to_vec()).await,
        Err(hangar_output::WriteError::Gap { expected: 6, got: 9 })
    ));
    let keys = |_: u32| Some(key(&k));
    let all = store.read_after(SESSION, 3, 0, &keys).await.unwrap();
    assert_eq!(concat(&all), b"abcdef");
    assert_eq!(store.raw_objects(SESSION, 3).await.unwrap().len(), 2, "two chunks, not three");
}
