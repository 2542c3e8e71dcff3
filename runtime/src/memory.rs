//! The C allocator's per-thread arenas, capped.
//!
//! glibc gives a thread that allocates under contention an arena of its
//! own (64 MiB reserved each, up to 8 per core), and memory freed in one
//! arena is never reused by another: at 5,000 sessions the operator,
//! whose runtime and blocking threads all build and drop cached objects,
//! held six nearly full arenas (661 MiB resident). Two arenas keep the
//! heap shared at little contention for these allocation rates. Builds on
//! musl (the images) have no arenas; there this does nothing.

/// Call first thing in `main`.
pub fn cap_allocator_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code, reason = "mallopt is a C call; it only sets an allocator tunable")]
    // SAFETY: M_ARENA_MAX takes any positive count; nothing else is touched.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
