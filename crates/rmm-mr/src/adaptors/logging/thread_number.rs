//! [`current_thread_number`]: a numeric id for the `Thread` column.

/// A number unique to the calling thread within this process (1, 2, 3, … in order of first
/// use, by this function or the resources, which number threads the same way), stable for the
/// thread's life.
///
/// RMM's `Thread` column holds spdlog's `%t`, the kernel thread id on Linux, which the standard
/// library does not expose. The replay benchmark only groups events by this value, so any id
/// that tells threads apart replays identically; a caller with access to the kernel id may put
/// that in [`MemoryEvent::thread`](super::MemoryEvent::thread) instead.
pub fn current_thread_number() -> u64 {
    crate::util::thread_life::thread_number()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_within_a_thread_distinct_across_threads() {
        let here = current_thread_number();
        assert_ne!(here, 0);
        assert_eq!(here, current_thread_number());
        let others: Vec<u64> = (0..4)
            .map(|_| std::thread::spawn(current_thread_number).join().unwrap())
            .collect();
        let mut all = others.clone();
        all.push(here);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 5, "{others:?} and {here}");
    }
}
