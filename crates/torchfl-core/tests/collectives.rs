//! The collectives table (ABI 1.3) as the host sees it: validated at load,
//! absent means none, and the safe wrapper over the simulator's table
//! across two ranks of one process (two threads on two devices).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use torchfl_core::{load, AbiVersion, CommConfig, LoadOptions, Plugin, ReduceOp, UniqueId};
use torchfl_ffi::TFL_DType;
use torchfl_testkit::{fixture, sim_plugin};

/// Held by every test that runs collectives on the simulator's devices:
/// tests of one binary run in parallel and share one simulator, and two
/// groups enqueued on the same default streams in opposite orders would
/// wait for each other (as two NCCL communicators on one stream can).
static DEVICES: Mutex<()> = Mutex::new(());

fn devices() -> MutexGuard<'static, ()> {
    DEVICES.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn load_default(path: &Path) -> Result<Arc<Plugin>, torchfl_core::Error> {
    load(path, &LoadOptions::default())
}

#[test]
fn a_get_collectives_entry_that_is_not_code_is_refused() {
    let err = load_default(&fixture("coll_data", &["FIXTURE_COLLECTIVES_IS_DATA"])).unwrap_err();
    assert_eq!(err.kind(), "InvalidPlugin", "{err}");
    assert!(err.to_string().contains("get_collectives"), "{err}");
}

#[test]
fn a_collectives_table_with_a_null_entry_is_refused_naming_it() {
    let err = load_default(&fixture("coll_null", &["FIXTURE_COLLECTIVES_NULL_ENTRY"])).unwrap_err();
    assert_eq!(err.kind(), "InvalidPlugin", "{err}");
    assert!(err.to_string().contains("TFL_Collectives.all_reduce"), "{err}");
}

#[test]
fn absent_or_unavailable_collectives_mean_none() {
    // An error from get_collectives: the plugin loads without collectives.
    let p = load_default(&fixture("coll_unavailable", &["FIXTURE_COLLECTIVES_UNAVAILABLE"])).unwrap();
    assert_eq!(p.abi().effective, AbiVersion::new(1, 3));
    assert!(!p.has_collectives() && p.collectives().is_none());
    // A 1.0 plugin, whose table ends before the entry.
    let old = load_default(&fixture("coll_old", &[])).unwrap();
    assert!(!old.has_collectives());
    assert!(old.optional_entries().contains(&("get_collectives", false)));
    // A 1.3 plugin's table ends before the 1.4 host-memory entries: they are
    // absent, and the plugin loads.
    assert!(p.optional_entries().contains(&("host_allocate", false)));
    assert!(p.optional_entries().contains(&("host_deallocate", false)));
}

#[test]
fn a_host_allocate_entry_that_is_not_code_is_refused() {
    let err = load_default(&fixture("host_alloc_data", &["FIXTURE_HOST_ALLOC_IS_DATA"])).unwrap_err();
    assert_eq!(err.kind(), "InvalidPlugin", "{err}");
    assert!(err.to_string().contains("host_allocate"), "{err}");
}

#[test]
fn the_simulator_offers_collectives_and_they_reduce_across_ranks() {
    let _devices = devices();
    let options = LoadOptions { init_options: "devices=2".to_owned(), ..Default::default() };
    let sim = load(&sim_plugin(), &options).unwrap();
    assert!(sim.optional_entries().contains(&("get_collectives", true)));
    assert!(sim.optional_entries().contains(&("host_allocate", true)));
    assert!(sim.optional_entries().contains(&("host_deallocate", true)));
    let coll = sim.collectives().expect("the simulator has a collectives table");
    assert!(coll.has_config() && sim.has_comm_config(), "the simulator speaks 1.5");
    let id = coll.unique_id().unwrap();
    assert_eq!(UniqueId::from_bytes(&id.0), Some(id));
    let f32 = TFL_DType { code: torchfl_ffi::TFL_DTYPE_FLOAT, bits: 32, lanes: 1 };
    let results: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let sim = Arc::clone(&sim);
                s.spawn(move || {
                    let comm = sim.collectives().unwrap().init_rank(&id, 2, rank, rank).unwrap();
                    let buf = sim.allocate(rank, 16).unwrap();
                    let v: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
                        .iter()
                        .flat_map(|x| (x * (rank + 1) as f32).to_ne_bytes())
                        .collect();
                    sim.copy_to_device(&buf, 0, &v).unwrap();
                    let stream = sim.default_stream(rank).unwrap();
                    // SAFETY: `buf` is a live 16-byte allocation of the
                    // communicator's device; the stream is synchronized
                    // before it is freed.
                    unsafe {
                        comm.all_reduce(buf.as_ptr(), buf.as_ptr(), 4, f32, ReduceOp::Sum, stream.raw())
                    }
                    .unwrap();
                    stream.synchronize().unwrap();
                    assert!(comm.async_error().unwrap().is_none());
                    // Out-of-range arguments are refused before the plugin is called.
                    // SAFETY: refused before any pointer is used.
                    let e = unsafe { comm.broadcast(buf.as_ptr(), buf.as_ptr(), 4, f32, 5, stream.raw()) }
                        .unwrap_err();
                    assert!(e.to_string().contains("root 5 is not a rank"), "{e}");
                    let mut back = vec![0u8; 16];
                    sim.copy_to_host(&buf, 0, &mut back).unwrap();
                    comm.destroy().unwrap();
                    // SAFETY: as above; the communicator is destroyed, so this is refused.
                    let e = unsafe {
                        comm.all_reduce(buf.as_ptr(), buf.as_ptr(), 4, f32, ReduceOp::Sum, stream.raw())
                    }
                    .unwrap_err();
                    assert!(e.to_string().contains("destroyed"), "{e}");
                    back
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let expect: Vec<u8> = [3.0f32, 6.0, 9.0, 12.0].iter().flat_map(|x| x.to_ne_bytes()).collect();
    assert_eq!(results, vec![expect.clone(), expect]);
}

/// Two ranks (threads on devices 0 and 1) create their communicators with
/// `config`, rank 1 joining `delay` after rank 0; each all-reduces once.
fn two_ranks_with(sim: &Arc<Plugin>, config: CommConfig, delay: Duration) -> Vec<Vec<f32>> {
    let coll = sim.collectives().unwrap();
    let id = coll.unique_id().unwrap();
    let f32 = TFL_DType { code: torchfl_ffi::TFL_DTYPE_FLOAT, bits: 32, lanes: 1 };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let sim = Arc::clone(sim);
                s.spawn(move || {
                    std::thread::sleep(delay * rank as u32);
                    let start = Instant::now();
                    let comm =
                        sim.collectives().unwrap().init_rank_with(&id, 2, rank, rank, &config).unwrap();
                    if rank == 0 && !config.blocking && delay >= Duration::from_millis(500) {
                        assert!(start.elapsed() < delay, "non-blocking creation waited for rank 1");
                    }
                    let buf = sim.allocate(rank, 8).unwrap();
                    let v: Vec<u8> =
                        [1.0f32 + rank as f32, 10.0].iter().flat_map(|x| x.to_ne_bytes()).collect();
                    sim.copy_to_device(&buf, 0, &v).unwrap();
                    let stream = sim.default_stream(rank).unwrap();
                    // SAFETY: `buf` is a live 8-byte allocation of the
                    // communicator's device; the stream is synchronized
                    // before it is freed.
                    unsafe {
                        comm.all_reduce(buf.as_ptr(), buf.as_ptr(), 2, f32, ReduceOp::Sum, stream.raw())
                    }
                    .unwrap();
                    stream.synchronize().unwrap();
                    assert!(comm.async_error().unwrap().is_none());
                    let mut back = vec![0u8; 8];
                    sim.copy_to_host(&buf, 0, &mut back).unwrap();
                    comm.destroy().unwrap();
                    back.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn communicator_settings_reach_the_simulator() {
    let _devices = devices();
    // Plugins initialize once per process: this returns the same simulator
    // as the other test of this binary.
    let options = LoadOptions { init_options: "devices=2".to_owned(), ..Default::default() };
    let sim = load(&sim_plugin(), &options).unwrap();
    assert!(sim.has_comm_config());
    let expect = vec![vec![3.0f32, 20.0]; 2];
    let timeout = Some(Duration::from_secs(30));
    let blocking = CommConfig { timeout, blocking: true };
    assert_eq!(two_ranks_with(&sim, blocking, Duration::ZERO), expect);
    let non_blocking = CommConfig { timeout, blocking: false };
    assert_eq!(two_ranks_with(&sim, non_blocking, Duration::from_millis(600)), expect);
    // A rank alone fails after the timeout it asked for.
    let coll = sim.collectives().unwrap();
    let id = coll.unique_id().unwrap();
    let start = Instant::now();
    let short = CommConfig { timeout: Some(Duration::from_secs(1)), blocking: true };
    let e = coll.init_rank_with(&id, 2, 0, 0, &short).unwrap_err();
    assert!(e.to_string().contains("comm_init_rank_config"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(15), "{:?}", start.elapsed());
}
