//! The C allocator: its per-thread arenas capped, and its free pages given
//! back to the system now and then.
//!
//! glibc gives a thread that allocates under contention an arena of its
//! own (64 MiB reserved each, up to 8 per core), and memory freed in one
//! arena is never reused by another: at 5,000 sessions the operator,
//! whose runtime and blocking threads all build and drop cached objects,
//! held six nearly full arenas (661 MiB resident). Two arenas keep the
//! heap shared at little contention for these allocation rates.
//!
//! glibc also keeps the pages it has freed inside an arena resident until
//! the top of the heap is free, which after a ramp (every object decoded,
//! cached, replaced) it seldom is: a standby that loaded the same 5,000
//! sessions afresh held 332 MiB where the leader held 478. `malloc_trim`
//! hands those pages back; once a minute it costs a few milliseconds.
//! Builds on musl (the images) have neither arenas nor this retention;
//! there both do nothing.

/// Call first thing in `main`.
pub fn cap_allocator_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code, reason = "mallopt is a C call; it only sets an allocator tunable")]
    // SAFETY: M_ARENA_MAX takes any positive count; nothing else is touched.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Starts a thread that hands the allocator's free pages back to the
/// system every minute (glibc only).
pub fn trim_free_memory_periodically() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        /// How often the free pages are handed back.
        const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(60);
        let spawned = std::thread::Builder::new().name("malloc-trim".into()).spawn(|| {
            loop {
                std::thread::sleep(TRIM_EVERY);
                trim_free_memory();
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start the allocator trim thread");
        }
    }
}

/// Hands the allocator's free pages back to the system now.
pub fn trim_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code, reason = "malloc_trim is a C call; it only releases free memory")]
    // SAFETY: malloc_trim takes the padding to keep (0) and touches only
    // memory the allocator holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    /// Free memory handed back lowers the resident size (glibc): a large
    /// heap of small blocks freed all but its last block stays resident
    /// until trimmed.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn trimming_hands_freed_pages_back() {
        fn rss_kib() -> u64 {
            let status = std::fs::read_to_string("/proc/self/status").expect("status");
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .expect("VmRSS")
        }
        // 64 MiB in 4 KiB blocks (under the mmap threshold, so on the
        // heap), then all freed but the last: the top stays in use.
        let mut blocks: Vec<Vec<u8>> = (0..16_384).map(|i| vec![(i % 251) as u8; 4096]).collect();
        let last = blocks.pop().expect("a block");
        drop(blocks);
        let before = rss_kib();
        super::trim_free_memory();
        let after = rss_kib();
        assert!(before > after + 32 * 1024, "resident {before} KiB before the trim, {after} KiB after");
        assert_eq!(last[0], (16_383 % 251) as u8);
    }
}
