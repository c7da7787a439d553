//! Binding plugins to the process' one custom device name. One test: the
//! binding is process-wide, and each test file is its own process.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use std::sync::Arc;

use torchfl_core::device::{bind, bound_device, check_metadata, check_torch_version};
use torchfl_core::{load, LoadOptions, Plugin};
use torchfl_testkit::{fixture, sim_plugin};

fn named(name: &str, extra: &[&str]) -> Arc<Plugin> {
    let define = format!("FIXTURE_NAME=\"{name}\"");
    let mut defines = vec![define.as_str()];
    defines.extend_from_slice(extra);
    load(&fixture(&format!("device_{name}"), &defines), &LoadOptions::default()).unwrap()
}

fn winners(ops: &[Arc<torchfl_core::Registration>]) -> Vec<(String, String)> {
    let mut v: Vec<_> = ops.iter().map(|r| (r.kernel.name.clone(), r.plugin.name().to_owned())).collect();
    v.sort();
    v
}

#[test]
fn one_device_name_composed_plugins_and_their_checks() {
    assert!(bound_device().is_none());
    let base = named("base", &[]);
    let fused = named("fused", &["FIXTURE_FAILING_KERNEL"]);

    assert_eq!(bind("cuda", &base, 0).unwrap_err().kind(), "InvalidDeviceName");

    let first = bind("npu", &base, 0).unwrap();
    assert!(first.created);
    assert!(Arc::ptr_eq(first.device.runtime(), &base));
    assert_eq!(first.changed.len(), 5, "every op of the first plugin is new");

    let err = bind("other", &fused, 0).unwrap_err();
    assert_eq!(err.kind(), "DeviceNameConflict");
    assert!(err.to_string().contains("'npu'") && err.to_string().contains("'other'"), "{err}");

    // A higher-priority plugin takes every op it implements.
    let second = bind("npu", &fused, 10).unwrap();
    assert!(!second.created);
    assert!(Arc::ptr_eq(second.device.runtime(), &base), "the runtime stays the first plugin");
    assert_eq!(winners(&second.changed).len(), 6);
    assert!(winners(&second.changed).iter().all(|(_, p)| p == "fused"));

    // Lowering it hands the shared ops back; sub.Tensor stays (only fused has it).
    let third = bind("npu", &fused, -1).unwrap();
    let changed = winners(&third.changed);
    assert_eq!(changed.len(), 5, "{changed:?}");
    assert!(changed.iter().all(|(_, p)| p == "base"));
    assert_eq!(bound_device().unwrap().registry().served_by("sub.Tensor").as_deref(), Some("fused"));

    // A plugin that cannot use host memory cannot join a host-memory device.
    let strict =
        load(&sim_plugin(), &LoadOptions { init_options: "strict=1".into(), ..Default::default() }).unwrap();
    let err = bind("npu", &strict, 0).unwrap_err();
    assert_eq!(err.kind(), "IncompatiblePlugin", "{err}");
    assert!(err.to_string().contains("host-addressable"), "{err}");

    // Metadata and torch-version checks.
    check_metadata(&base, [("name", "base"), ("abi_version", "1.0.0")]).unwrap();
    let err = check_metadata(&base, [("vendor", "someone else")]).unwrap_err();
    assert_eq!(err.kind(), "MetadataMismatch");
    assert!(err.to_string().contains("torch-fl examples"), "{err}");
    let err = check_metadata(&base, [("colour", "blue")]).unwrap_err();
    assert!(err.to_string().contains("known keys"), "{err}");
    check_torch_version(&strict, "2.14.1+cu130").unwrap();
    let err = check_torch_version(&strict, "2.3.1").unwrap_err();
    assert_eq!(err.kind(), "TorchTooOld");
    assert!(err.to_string().contains(">= 2.4"), "{err}");
}
