//! The allocator's unit tests: accounting, stream-ordered frees, strict
//! mode's tagged pointers and range resolution.

use super::*;
use crate::error::ErrorCode;
use crate::runtime::config::Mode;
use crate::runtime::stream::{ErrorSink, Stream, Work};
use std::sync::Arc;

#[test]
fn accounting_peak_and_oom() {
    let m = DeviceMemory::new(0, 1000, false);
    let a = m.allocate(600).unwrap();
    assert_eq!(a % ALIGNMENT as u64, 0);
    let e = m.allocate(500).unwrap_err();
    assert_eq!(e.code(), ErrorCode::OutOfMemory);
    for part in ["500", "600", "1000"] {
        assert!(e.message().contains(part), "{}", e.message());
    }
    let b = m.allocate(400).unwrap();
    m.deallocate(a, |_| {}).unwrap();
    let s = m.stats();
    assert_eq!(s.allocated_bytes, 400);
    assert_eq!(s.reserved_bytes, 1000, "the freed block is cached");
    assert_eq!(s.peak_allocated_bytes, 1000);
    assert_eq!((s.num_allocations, s.num_frees, s.num_ooms), (2, 1, 1));
    m.empty_cache();
    assert_eq!(m.stats().reserved_bytes, 400, "empty_cache gives it back");
    m.reset_peak();
    assert_eq!(m.stats().peak_allocated_bytes, 400);
    m.deallocate(b, |_| {}).unwrap();
    assert!(m.deallocate(b, |_| {}).is_err(), "double free");
}

#[test]
fn cached_blocks_are_reused_by_size() {
    let m = DeviceMemory::new(0, 1 << 20, false);
    let p = m.allocate(256).unwrap();
    m.deallocate(p, |_| {}).unwrap();
    let q = m.allocate(128).unwrap();
    assert_ne!(p, q, "another size: a new block");
    assert_eq!(m.allocate(256).unwrap(), p, "the same size: the cached block");
    let s = m.stats();
    assert_eq!((s.allocated_bytes, s.reserved_bytes), (384, 384));
    assert_eq!((s.num_allocations, s.num_frees), (3, 1));
    assert!(m.resolve(p, 0, 256, &"t").is_ok(), "live again, with its size");
    assert!(m.resolve(p, 0, 257, &"t").is_err());
    m.deallocate(p, |_| {}).unwrap();
    assert!(m.resolve(p, 0, 1, &"t").is_err(), "a cached block is not live");
    assert!(m.deallocate(p, |_| {}).is_err(), "nor can it be freed again");
}

#[test]
fn an_allocation_that_does_not_fit_gives_the_cache_back() {
    let m = DeviceMemory::new(0, 1000, false);
    let a = m.allocate(600).unwrap();
    m.deallocate(a, |_| {}).unwrap();
    assert_eq!(m.stats().reserved_bytes, 600);
    let b = m.allocate(700).unwrap();
    let s = m.stats();
    assert_eq!((s.allocated_bytes, s.reserved_bytes, s.num_ooms), (700, 700, 0));
    m.deallocate(b, |_| {}).unwrap();
}

/// A stream whose work waits at a gate until the test opens it.
fn gated_stream() -> (Arc<Stream>, Arc<(Mutex<bool>, std::sync::Condvar)>) {
    let s = Stream::new(1, 0, false, Mode::Async, Arc::new(ErrorSink::default()), None).unwrap();
    let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let g = Arc::clone(&gate);
    s.submit(Work::new(move || {
        let mut open = lock(&g.0);
        while !*open {
            open = g.1.wait(open).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        Ok(())
    }))
    .unwrap();
    (s, gate)
}

fn open(gate: &(Mutex<bool>, std::sync::Condvar)) {
    *lock(&gate.0) = true;
    gate.1.notify_all();
}

#[test]
fn retired_blocks_are_reused_only_after_their_work() {
    let m = DeviceMemory::new(0, 1 << 20, false);
    let (s, gate) = gated_stream();
    let p = m.allocate(64).unwrap();
    let q = m.allocate(64).unwrap();
    m.deallocate(p, |f| f.push(s.fence())).unwrap();
    m.deallocate(q, |f| f.push(s.fence())).unwrap();
    let r = m.allocate(64).unwrap();
    assert!(r != p && r != q, "queued work may still use p and q");
    let st = m.stats();
    assert_eq!((st.allocated_bytes, st.reserved_bytes), (64, 192));
    open(&gate);
    s.synchronize();
    m.sweep();
    let mut again = [m.allocate(64).unwrap(), m.allocate(64).unwrap()];
    again.sort_unstable();
    let mut freed = [p, q];
    freed.sort_unstable();
    assert_eq!(again, freed, "both reused once the work has run");
    s.close();
    s.join();
}

#[test]
fn retired_blocks_are_reclaimed_in_order() {
    let m = DeviceMemory::new(0, 1 << 20, false);
    let (s, gate) = gated_stream();
    let p = m.allocate(32).unwrap();
    m.deallocate(p, |f| f.push(s.fence())).unwrap();
    // More frees behind it, with more work.
    let mut later = Vec::new();
    for _ in 0..100 {
        s.submit(Work::new(|| Ok(()))).unwrap();
        let x = m.allocate(32).unwrap();
        m.deallocate(x, |f| f.push(s.fence())).unwrap();
        later.push(x);
    }
    assert!(m.allocate(16).is_ok(), "other sizes are unaffected");
    assert_eq!(m.stats().reserved_bytes, 32 * 101 + 16);
    open(&gate);
    s.synchronize();
    let st = m.stats();
    assert_eq!((st.allocated_bytes, st.reserved_bytes), (16, 32 * 101 + 16), "cached");
    m.empty_cache();
    assert_eq!(m.stats().reserved_bytes, 16, "given back");
    s.close();
    s.join();
}

#[test]
fn the_cache_is_bounded() {
    let m = DeviceMemory::new(0, 4 * CACHE_LIMIT, false);
    let big = (CACHE_LIMIT / 2 + 64) as usize;
    let (p, q) = (m.allocate(big).unwrap(), m.allocate(big).unwrap());
    m.deallocate(p, |_| {}).unwrap();
    m.deallocate(q, |_| {}).unwrap();
    let s = m.stats();
    assert_eq!((s.allocated_bytes, s.reserved_bytes), (0, big as u64), "one cached, one given back");
    m.empty_cache();
    assert_eq!(m.stats().reserved_bytes, 0);
}

#[test]
fn zero_byte_allocations_are_unique() {
    let m = DeviceMemory::new(0, 10, false);
    let a = m.allocate(0).unwrap();
    let b = m.allocate(0).unwrap();
    assert!(a != 0 && b != 0 && a != b);
    assert_eq!(m.stats().allocated_bytes, 0);
    m.deallocate(a, |_| {}).unwrap();
    m.deallocate(b, |_| {}).unwrap();
}

#[test]
fn remembered_blocks_are_forgotten_when_freed() {
    let m = DeviceMemory::new(0, 1 << 20, false);
    let p = m.allocate(64).unwrap();
    let q = m.allocate(32).unwrap();
    assert!(m.resolve(p, 0, 64, &"t").is_ok());
    assert!(m.resolve(q, 0, 32, &"t").is_ok());
    assert!(m.resolve(p, 16, 64, &"t").is_ok(), "remembered");
    assert!(m.resolve(p, 0, 65, &"t").is_err(), "a remembered block still bounds the range");
    assert!(m.resolve(p, 8, 4, &"t").is_err(), "reversed ranges are refused");
    assert!(m.resolve(p, -1, 4, &"t").is_err());
    m.deallocate(p, |_| {}).unwrap();
    let e = m.resolve(p, 0, 64, &"t").unwrap_err();
    assert!(e.message().contains("is not inside a live allocation"), "{}", e.message());
    assert!(m.resolve(q, 0, 32, &"t").is_ok(), "other blocks are looked up again");
    let other = DeviceMemory::new(0, 1 << 20, false);
    assert!(other.resolve(q, 0, 32, &"t").is_err(), "memories are per allocator");
    m.deallocate(q, |_| {}).unwrap();
    assert!(m.resolve(q, 0, 1, &"t").is_err());
}

#[test]
fn strict_tags_and_ranges() {
    let m = DeviceMemory::new(1, 1 << 20, true);
    let p = m.allocate(256).unwrap();
    assert_eq!(p & TAG_MASK, strict_tag(1));
    assert_eq!(tagged_device(p), Some(1));
    assert!(m.resolve(p + 128, 0, 128, &"t").is_ok());
    assert!(m.resolve(p + 128, 0, 129, &"t").is_err());
    assert!(m.resolve(p, -1, 4, &"t").is_err());
    let e = m.resolve(p - strict_tag(1), 0, 4, &"t").unwrap_err();
    assert!(e.message().contains("tag"), "{}", e.message());
    let other = DeviceMemory::new(0, 1 << 20, true);
    let e = other.resolve(p, 0, 4, &"copy").unwrap_err();
    assert!(e.message().contains("belongs to device 1"), "{}", e.message());
    m.deallocate(p, |_| {}).unwrap();
}
