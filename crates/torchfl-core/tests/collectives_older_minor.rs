//! A plugin whose collectives stop at an older minor keeps working: the
//! simulator met by a host that announces ABI 1.4 (its own process, since
//! a plugin initializes once per process and keeps the minor it negotiated)
//! fills the table only up to `group_end`, and communicator settings fall
//! back to the blocking `comm_init_rank`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use torchfl_core::{load, AbiVersion, CommConfig, LoadOptions, ReduceOp};
use torchfl_ffi::TFL_DType;
use torchfl_testkit::sim_plugin;

#[test]
fn a_1_4_collectives_table_loads_and_settings_fall_back_to_comm_init_rank() {
    let options = LoadOptions {
        init_options: "devices=2".to_owned(),
        host_version: Some(AbiVersion::new(1, 4)),
        ..Default::default()
    };
    let sim = load(&sim_plugin(), &options).unwrap();
    assert_eq!(sim.abi().effective, AbiVersion::new(1, 4));
    assert!(sim.has_collectives());
    assert!(!sim.has_comm_config(), "a 1.4 table has no comm_init_rank_config");
    let coll = sim.collectives().unwrap();
    assert!(!coll.has_config());
    let id = coll.unique_id().unwrap();
    // Non-blocking is asked for but not available: creation blocks, so
    // both ranks must create concurrently, and it still works.
    let config = CommConfig { timeout: Some(Duration::from_secs(30)), blocking: false };
    let f32 = TFL_DType { code: torchfl_ffi::TFL_DTYPE_FLOAT, bits: 32, lanes: 1 };
    let sums: Vec<f32> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let sim = Arc::clone(&sim);
                s.spawn(move || {
                    let comm =
                        sim.collectives().unwrap().init_rank_with(&id, 2, rank, rank, &config).unwrap();
                    let buf = sim.allocate(rank, 4).unwrap();
                    sim.copy_to_device(&buf, 0, &(rank as f32 + 1.0).to_ne_bytes()).unwrap();
                    let stream = sim.default_stream(rank).unwrap();
                    // SAFETY: `buf` is a live 4-byte allocation of the
                    // communicator's device; the stream is synchronized
                    // before it is freed.
                    unsafe {
                        comm.all_reduce(buf.as_ptr(), buf.as_ptr(), 1, f32, ReduceOp::Sum, stream.raw())
                    }
                    .unwrap();
                    stream.synchronize().unwrap();
                    let mut back = [0u8; 4];
                    sim.copy_to_host(&buf, 0, &mut back).unwrap();
                    comm.destroy().unwrap();
                    f32::from_ne_bytes(back)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, vec![3.0, 3.0]);
}
