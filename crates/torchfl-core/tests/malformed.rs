//! Malformed plugins the loader must refuse, or warn about, without reading
//! past their memory: each fixture of `tests/plugins/fixture_plugin.c` with
//! its exact outcome. `torchfl-abi verify` is held to the same corpus in
//! `crates/torchfl-abi/tests/malformed.rs`, and `register_device_plugin` in
//! `tests/test_broken_plugins.py`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use std::path::Path;
use std::sync::Arc;

use torchfl_core::{load, Error, LoadOptions, Plugin, Stage, WarningKind};
use torchfl_testkit::fixture;

fn load_default(path: &Path) -> Result<Arc<Plugin>, Error> {
    load(path, &LoadOptions::default())
}

/// Loading `path` fails with `kind` at `stage`; returns the message.
fn refused(path: &Path, kind: &str, stage: Stage) -> String {
    let err = load_default(path).expect_err("loading should fail");
    assert_eq!(err.kind(), kind, "unexpected error: {err}");
    assert_eq!(err.load_stage(), Some(stage), "{err}");
    assert!(err.is_load_error());
    err.to_string()
}

#[test]
fn an_op_count_in_bytes_is_refused_at_the_first_entry_past_the_array() {
    let msg =
        refused(&fixture("ops_bytes", &["FIXTURE_OPS_COUNT_IN_BYTES"]), "InvalidPlugin", Stage::OpTable);
    assert!(msg.contains("op table entry 5 has a NULL name"), "{msg}");
    assert!(msg.contains("looks like the array's size in bytes (5 entries of 64 bytes)"), "{msg}");
    assert!(msg.contains("sizeof ops / sizeof ops[0]"), "{msg}");
}

#[test]
fn a_huge_op_count_is_refused_before_any_entry_is_read() {
    let msg = refused(&fixture("ops_huge", &["FIXTURE_OPS_COUNT_HUGE"]), "InvalidPlugin", Stage::OpTable);
    assert!(msg.contains("num_entries is 1099511627776, more than TFL_MAX_OP_ENTRIES (65536)"), "{msg}");
}

#[test]
fn a_count_past_the_array_stops_at_unreadable_memory() {
    // Entry 5 lies in a page the fixture made unreadable: reading it would
    // kill the test.
    let msg =
        refused(&fixture("ops_past_end", &["FIXTURE_OPS_COUNT_PAST_END"]), "InvalidPlugin", Stage::OpTable);
    assert!(msg.contains("op table entry 5") && msg.contains("is not readable memory"), "{msg}");
    assert!(msg.contains("'minimal_c'"), "names the plugin: {msg}");
}

#[test]
fn a_bootstrap_symbol_that_is_data_is_never_called() {
    let msg = refused(
        &fixture("bootstrap_data", &["FIXTURE_BOOTSTRAP_IS_DATA"]),
        "InvalidPlugin",
        Stage::Handshake,
    );
    assert!(msg.contains("torch_fl_plugin_get_api is not a function"), "{msg}");
    assert!(msg.contains("in the data of") && msg.contains("fixture_bootstrap_data"), "{msg}");
}

#[test]
fn an_identity_with_struct_size_zero_says_so() {
    let msg =
        refused(&fixture("info_size0", &["FIXTURE_INFO_STRUCT_SIZE_ZERO"]), "InvalidPlugin", Stage::Identity);
    assert!(msg.contains("TFL_PluginInfo.struct_size is 0, too small for the required fields"), "{msg}");
    assert!(msg.contains("TFL_STRUCT_SIZE(TFL_PluginInfo, capabilities)"), "{msg}");
    assert!(!msg.contains("NULL or empty"), "{msg}");
}

#[test]
fn an_implausible_abi_major_is_a_malformed_table() {
    let msg =
        refused(&fixture("major_max", &["FIXTURE_ABI_MAJOR=0xFFFFFFFFu"]), "InvalidPlugin", Stage::Handshake);
    assert!(msg.contains("abi_major is 4294967295, which is not an ABI version"), "{msg}");
    assert!(!msg.contains("Upgrade torch-fl"), "{msg}");
}

#[test]
fn a_min_torch_version_that_is_not_a_version_is_refused() {
    let msg = refused(
        &fixture("torch_banana", &["FIXTURE_MIN_TORCH_VERSION=\"banana\""]),
        "InvalidPlugin",
        Stage::Identity,
    );
    assert!(msg.contains("min_torch_version \"banana\" is not a PyTorch version"), "{msg}");
}

#[test]
fn a_null_default_stream_is_refused_at_the_streams_stage() {
    let msg =
        refused(&fixture("null_stream", &["FIXTURE_NULL_DEFAULT_STREAM"]), "InvalidPlugin", Stage::Streams);
    assert!(msg.contains("default_stream(0) returned NULL"), "{msg}");
}

#[test]
fn zero_devices_load() {
    let p = load_default(&fixture("zero_devices", &["FIXTURE_ZERO_DEVICES"])).unwrap();
    assert_eq!(p.device_count(), 0);
    assert!(p.warnings().is_empty(), "{:?}", p.warnings());
}

#[test]
fn zero_total_memory_is_a_warning() {
    let p = load_default(&fixture("zero_memory", &["FIXTURE_ZERO_MEMORY"])).unwrap();
    let [w] = p.warnings() else { panic!("{:?}", p.warnings()) };
    assert_eq!((w.stage, w.kind), (Stage::Devices, WarningKind::ZeroTotalMemory));
    assert!(w.message.contains("device 0 reports total_memory = 0"), "{w}");
}

#[test]
fn an_unknown_aten_operator_is_kept_with_a_warning() {
    let p = load_default(&fixture("unknown_aten", &["FIXTURE_UNKNOWN_ATEN_OP"])).unwrap();
    let [w] = p.warnings() else { panic!("{:?}", p.warnings()) };
    assert_eq!((w.stage, w.kind), (Stage::OpTable, WarningKind::UnknownAtenOperator));
    assert!(w.message.contains("operator 'frobnicate.Tensor' is not an ATen operator of PyTorch"), "{w}");
    // Registration asks the installed PyTorch, which may know it.
    assert!(p.op("frobnicate.Tensor").is_some());
}

#[test]
fn custom_operators_with_bad_schemas_are_left_out_with_a_warning() {
    let cases = [
        (
            "bad_schema",
            "FIXTURE_BAD_SCHEMA",
            "its schema \"scale(Tensor x, float factor -> Tensor\" is not valid: at column",
        ),
        ("schema_name", "FIXTURE_SCHEMA_NAME_MISMATCH", "declares 'scaled', not 'scale'"),
    ];
    for (variant, define, expected) in cases {
        let p = load_default(&fixture(variant, &[define])).unwrap();
        let [w] = p.warnings() else { panic!("{variant}: {:?}", p.warnings()) };
        assert_eq!((w.stage, w.kind), (Stage::OpTable, WarningKind::CustomOperatorSchema), "{variant}");
        assert!(w.message.starts_with("custom operator 'fx::scale' is not registered: "), "{w}");
        assert!(w.message.contains(expected), "{variant}: {w}");
        assert!(p.op("fx::scale").is_none(), "{variant}: left out");
        assert!(p.op("add.Tensor").is_some(), "{variant}: the rest stays");
    }
}
