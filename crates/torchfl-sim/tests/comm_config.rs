//! Communicator settings (ABI 1.5's `comm_init_rank_config`) through the C
//! ABI, against the process-wide instance with two devices: each device is
//! one rank, as two processes with one device each would be.
//!
//! `TORCH_FL_SIM_COLL_TIMEOUT` is process-wide, so every test holds `ENV`:
//! the one that sets the variable cannot change another's timeout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_void, CString};
use std::ptr::{null, null_mut};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use torchfl_ffi::*;

mod common;
use common::st;
use torchfl_sim::runtime::collectives::TIMEOUT_ENV;

static ENV: Mutex<()> = Mutex::new(());
static INIT: Once = Once::new();

const F32: TFL_DType = TFL_DType { code: TFL_DTYPE_FLOAT, bits: 32, lanes: 1 };

/// The plugin (initialized once, two devices), its collectives table as a
/// 1.5 host sees it, and the lock on the environment.
fn setup() -> (&'static TFL_PluginApi, TFL_Collectives, MutexGuard<'static, ()>) {
    let guard = ENV.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // SAFETY: NULL host is allowed.
    let api = unsafe { &*torchfl_sim::torch_fl_plugin_get_api(null()) };
    INIT.call_once(|| {
        let options = CString::new("devices=2;memory=16MiB").unwrap();
        let args =
            TFL_InitArgs { struct_size: struct_size!(TFL_InitArgs, options), options: options.as_ptr() };
        st(api, unsafe { api.initialize.unwrap()(&args) }).unwrap();
    });
    let mut coll: TFL_Collectives = unsafe { std::mem::zeroed() };
    coll.struct_size = struct_size!(TFL_Collectives, comm_init_rank_config);
    st(api, unsafe { api.get_collectives.unwrap()(&mut coll) }).unwrap();
    assert!(coll.comm_init_rank_config.is_some(), "the simulator offers the 1.5 entry");
    (api, coll, guard)
}

fn unique_id(coll: &TFL_Collectives) -> TFL_UniqueId {
    let mut id = TFL_UniqueId { bytes: [0; TFL_UNIQUE_ID_BYTES] };
    assert!(unsafe { coll.get_unique_id.unwrap()(&mut id) }.is_null());
    id
}

fn config(timeout: Duration, blocking: bool) -> TFL_CommConfig {
    TFL_CommConfig {
        struct_size: struct_size!(TFL_CommConfig, blocking),
        timeout_ms: timeout.as_millis() as u64,
        blocking: i32::from(blocking),
    }
}

/// `comm_init_rank_config` for rank `rank` of 2 on device `rank`.
fn init(
    api: &TFL_PluginApi,
    coll: &TFL_Collectives,
    id: &TFL_UniqueId,
    rank: i32,
    config: &TFL_CommConfig,
) -> Result<*mut TFL_Comm, (i32, String)> {
    let mut comm = null_mut();
    st(api, unsafe { coll.comm_init_rank_config.unwrap()(id, 2, rank, rank, config, &mut comm) })?;
    assert!(!comm.is_null());
    Ok(comm)
}

fn async_error(api: &TFL_PluginApi, coll: &TFL_Collectives, comm: *mut TFL_Comm) -> Option<String> {
    let mut e = null_mut();
    st(api, unsafe { coll.comm_get_async_error.unwrap()(comm, &mut e) }).unwrap();
    st(api, e).err().map(|(_, m)| m)
}

fn upload(api: &TFL_PluginApi, device: i32, v: &[f32]) -> *mut c_void {
    let mut p = null_mut();
    st(api, unsafe { api.allocate.unwrap()(device, v.len() * 4, &mut p) }).unwrap();
    let args = TFL_CopyArgs {
        struct_size: struct_size!(TFL_CopyArgs, stream),
        kind: TFL_COPY_HOST_TO_DEVICE,
        dst_device: device,
        src_device: device,
        dst: p,
        src: v.as_ptr().cast(),
        nbytes: v.len() * 4,
        stream: null_mut(),
    };
    st(api, unsafe { api.copy.unwrap()(&args) }).unwrap();
    p
}

fn download(api: &TFL_PluginApi, device: i32, p: *mut c_void, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    let args = TFL_CopyArgs {
        struct_size: struct_size!(TFL_CopyArgs, stream),
        kind: TFL_COPY_DEVICE_TO_HOST,
        dst_device: device,
        src_device: device,
        dst: v.as_mut_ptr().cast(),
        src: p,
        nbytes: n * 4,
        stream: null_mut(),
    };
    st(api, unsafe { api.copy.unwrap()(&args) }).unwrap();
    v
}

fn default_stream(api: &TFL_PluginApi, device: i32) -> *mut TFL_Stream {
    let mut s = null_mut();
    st(api, unsafe { api.default_stream.unwrap()(device, &mut s) }).unwrap();
    s
}

fn all_reduce(
    api: &TFL_PluginApi,
    coll: &TFL_Collectives,
    comm: *mut TFL_Comm,
    buf: *mut c_void,
    n: usize,
    device: i32,
) {
    let s = default_stream(api, device);
    st(api, unsafe { coll.all_reduce.unwrap()(buf, buf, n, F32, TFL_REDUCE_SUM, comm, s) }).unwrap();
}

/// Rank 0 asks for `config`; rank 1 never joins. Returns the error and how
/// long comm_init_rank_config took to report it.
fn lonely_rank(api: &TFL_PluginApi, coll: &TFL_Collectives, config: &TFL_CommConfig) -> (String, Duration) {
    let id = unique_id(coll);
    let start = Instant::now();
    let (code, message) = init(api, coll, &id, 0, config).unwrap_err();
    assert_eq!(code, TFL_ERROR_FAILED_PRECONDITION, "{message}");
    (message, start.elapsed())
}

#[test]
fn the_configured_timeout_bounds_the_rendezvous() {
    let (api, coll, _env) = setup();
    std::env::remove_var(TIMEOUT_ENV);
    let (message, took) = lonely_rank(api, &coll, &config(Duration::from_secs(1), true));
    assert!(message.contains("not every rank joined"), "{message}");
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn the_environment_variable_overrides_the_configured_timeout() {
    let (api, coll, _env) = setup();
    std::env::set_var(TIMEOUT_ENV, "1");
    let (message, took) = lonely_rank(api, &coll, &config(Duration::from_secs(600), true));
    std::env::remove_var(TIMEOUT_ENV);
    assert!(message.contains("not every rank joined"), "{message}");
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn a_non_blocking_communicator_returns_at_once_and_runs_queued_work_once_its_peer_joins() {
    let (api, coll, _env) = setup();
    std::env::remove_var(TIMEOUT_ENV);
    let id = unique_id(&coll);
    let start = Instant::now();
    let comm0 = init(api, &coll, &id, 0, &config(Duration::from_secs(30), false)).unwrap();
    assert!(start.elapsed() < Duration::from_secs(2), "returned before rank 1 joined");
    // Enqueued before the group exists: it waits for the join, in order.
    let buf0 = upload(api, 0, &[1.0, 2.0, 3.0, 4.0]);
    all_reduce(api, &coll, comm0, buf0, 4, 0);
    assert_eq!(async_error(api, &coll, comm0), None);
    std::thread::sleep(Duration::from_millis(200));
    let comm1 = std::thread::scope(|s| {
        let rank1 = s.spawn(|| {
            let comm1 = init(api, &coll, &id, 1, &config(Duration::from_secs(30), true)).unwrap();
            let buf1 = upload(api, 1, &[10.0, 20.0, 30.0, 40.0]);
            all_reduce(api, &coll, comm1, buf1, 4, 1);
            st(api, unsafe { api.device_synchronize.unwrap()(1) }).unwrap();
            assert_eq!(download(api, 1, buf1, 4), vec![11.0, 22.0, 33.0, 44.0]);
            comm1 as usize
        });
        st(api, unsafe { api.device_synchronize.unwrap()(0) }).unwrap();
        rank1.join().unwrap()
    });
    assert_eq!(download(api, 0, buf0, 4), vec![11.0, 22.0, 33.0, 44.0]);
    assert_eq!(async_error(api, &coll, comm0), None);
    for comm in [comm0, comm1 as *mut TFL_Comm] {
        st(api, unsafe { coll.comm_destroy.unwrap()(comm) }).unwrap();
    }
}

#[test]
fn a_non_blocking_join_that_fails_is_the_asynchronous_error() {
    let (api, coll, _env) = setup();
    std::env::remove_var(TIMEOUT_ENV);
    let id = unique_id(&coll);
    let comm = init(api, &coll, &id, 0, &config(Duration::from_secs(1), false)).unwrap();
    let buf = upload(api, 0, &[1.0; 4]);
    all_reduce(api, &coll, comm, buf, 4, 0); // waits for a join that fails
    let e = st(api, unsafe { api.device_synchronize.unwrap()(0) }).unwrap_err();
    assert!(e.1.contains("not every rank joined"), "{e:?}");
    let sticky = async_error(api, &coll, comm).expect("the communicator keeps its failure");
    assert!(sticky.contains("not every rank joined"), "{sticky}");
    // Later operations fail at once; destroy does not wait.
    let s = default_stream(api, 0);
    let e =
        st(api, unsafe { coll.all_reduce.unwrap()(buf, buf, 4, F32, TFL_REDUCE_SUM, comm, s) }).unwrap_err();
    assert!(e.1.contains("failed earlier"), "{e:?}");
    assert_eq!(download(api, 0, buf, 4), vec![1.0; 4]);
    st(api, unsafe { coll.comm_destroy.unwrap()(comm) }).unwrap();
    // The same failure also reached the device directly: let it arrive and
    // clear it.
    std::thread::sleep(Duration::from_millis(300));
    let _ = st(api, unsafe { api.device_synchronize.unwrap()(0) });
    // Without any operation queued, the device's next synchronize still
    // reports the failure.
    let id = unique_id(&coll);
    let start = Instant::now();
    let comm = init(api, &coll, &id, 0, &config(Duration::from_secs(1), false)).unwrap();
    let deadline = start + Duration::from_secs(20);
    let e = loop {
        match st(api, unsafe { api.device_synchronize.unwrap()(0) }) {
            Err(e) => break e,
            Ok(()) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(()) => panic!("the failure to join never reached the device"),
        }
    };
    assert!(e.1.contains("not every rank joined"), "{e:?}");
    assert!(start.elapsed() >= Duration::from_millis(900), "this join's failure, after its timeout");
    assert!(async_error(api, &coll, comm).is_some());
    st(api, unsafe { coll.comm_destroy.unwrap()(comm) }).unwrap();
}

#[test]
fn abort_during_a_non_blocking_join_returns_promptly() {
    let (api, coll, _env) = setup();
    std::env::remove_var(TIMEOUT_ENV);
    let id = unique_id(&coll);
    let comm = init(api, &coll, &id, 0, &config(Duration::from_secs(60), false)).unwrap();
    let buf = upload(api, 0, &[1.0; 4]);
    all_reduce(api, &coll, comm, buf, 4, 0); // waits for a join that never comes
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    st(api, unsafe { coll.comm_abort.unwrap()(comm) }).unwrap();
    let e = st(api, unsafe { api.device_synchronize.unwrap()(0) }).unwrap_err();
    assert!(e.1.contains("aborted"), "{e:?}");
    let s = default_stream(api, 0);
    let e =
        st(api, unsafe { coll.all_reduce.unwrap()(buf, buf, 4, F32, TFL_REDUCE_SUM, comm, s) }).unwrap_err();
    assert!(e.1.contains("aborted"), "{e:?}");
    st(api, unsafe { coll.comm_destroy.unwrap()(comm) }).unwrap();
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
}

#[test]
fn a_config_from_an_older_host_or_none_means_the_defaults() {
    let (api, coll, _env) = setup();
    std::env::remove_var(TIMEOUT_ENV);
    // A world of one joins at once, whatever the settings.
    let id = unique_id(&coll);
    let bare =
        TFL_CommConfig { struct_size: struct_size!(TFL_CommConfig, struct_size), timeout_ms: 7, blocking: 0 };
    for config in [null(), &bare as *const TFL_CommConfig] {
        let id = if config.is_null() { id } else { unique_id(&coll) };
        let mut comm = null_mut();
        st(api, unsafe { coll.comm_init_rank_config.unwrap()(&id, 1, 0, 0, config, &mut comm) }).unwrap();
        let buf = upload(api, 0, &[2.0; 3]);
        all_reduce(api, &coll, comm, buf, 3, 0);
        st(api, unsafe { api.device_synchronize.unwrap()(0) }).unwrap();
        assert_eq!(download(api, 0, buf, 3), vec![2.0; 3]);
        st(api, unsafe { coll.comm_destroy.unwrap()(comm) }).unwrap();
    }
    // Invalid arguments are still reported synchronously when non-blocking.
    let mut comm = null_mut();
    let e = st(api, unsafe {
        coll.comm_init_rank_config.unwrap()(&id, 2, 2, 0, &config(Duration::from_secs(1), false), &mut comm)
    })
    .unwrap_err();
    assert_eq!(e.0, TFL_ERROR_INVALID_ARGUMENT, "{e:?}");
    assert!(comm.is_null(), "outputs untouched on failure");
}
