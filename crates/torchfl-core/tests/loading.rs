//! Loading: the handshake matrix, validation of the tables, and each way a
//! plugin can be broken, against the fault-injection fixtures.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use std::path::Path;
use std::sync::Arc;

use torchfl_core::{load, AbiVersion, Error, LoadOptions, Plugin, PluginLibrary};
use torchfl_testkit::fixture;

fn load_default(path: &Path) -> Result<Arc<Plugin>, Error> {
    load(path, &LoadOptions::default())
}

fn expect_err(path: &Path, kind: &str) -> String {
    let err = load_default(path).expect_err("loading should fail");
    assert_eq!(err.kind(), kind, "unexpected error: {err}");
    assert!(err.is_load_error());
    err.to_string()
}

#[test]
fn a_working_plugin_loads_with_its_identity_and_ops() {
    let p = load_default(&fixture("good", &[])).unwrap();
    assert_eq!(p.name(), "minimal_c");
    assert_eq!(p.info().vendor, "torch-fl examples");
    // The fixture is a 1.0 plugin; this host works at its minor.
    assert_eq!(p.abi().effective, AbiVersion::new(1, 0));
    assert_eq!(p.abi().host, AbiVersion::HOST);
    assert_eq!(p.device_count(), 1);
    assert!(p.capabilities().host_addressable_memory());
    assert!(!p.capabilities().async_streams());
    let ops: Vec<&str> = p.ops().iter().map(|o| o.name.as_str()).collect();
    assert_eq!(ops, ["add.Tensor", "mul.Tensor", "neg", "relu", "fill_.Scalar"]);
    assert_eq!(p.op("fill_.Scalar").unwrap().symbol, "torch_fl_op_fill__Scalar");
    assert!(p.label().contains("'minimal_c'"), "{}", p.label());
}

#[test]
fn loading_the_same_library_twice_returns_the_same_plugin() {
    let path = fixture("twice", &[]);
    let a = load_default(&path).unwrap();
    let b = load_default(&path).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    // A plugin initializes once per process: other options cannot apply.
    let err = load(&path, &LoadOptions { init_options: "x=1".into(), ..Default::default() }).unwrap_err();
    assert_eq!(err.kind(), "AlreadyInitialized", "{err}");
}

#[test]
fn init_options_reach_the_plugin_and_its_error_comes_back() {
    let err =
        load(&fixture("opts", &[]), &LoadOptions { init_options: "bogus=1".into(), ..Default::default() })
            .unwrap_err();
    assert_eq!(err.kind(), "InitFailed");
    assert!(err.to_string().contains("takes no options, got \"bogus=1\""), "{err}");
}

// --- The handshake matrix -------------------------------------------------

#[test]
fn newer_minor_loads_and_its_unknown_fields_are_ignored() {
    let p = load_default(&fixture("newer_minor", &["FIXTURE_NEWER_TABLE"])).unwrap();
    let abi = p.abi();
    assert_eq!(abi.plugin, AbiVersion::new(1, 9));
    assert_eq!(abi.effective, AbiVersion::HOST);
    assert!(abi.relation().contains("newer"));
    // Larger op entries are stepped over by entry_size.
    assert_eq!(p.ops().len(), 5);
    assert_eq!(p.ops()[4].name, "fill_.Scalar");
}

#[test]
fn older_minor_host_works_at_the_lower_minor() {
    // A host at 1.3 meeting this 1.0 plugin.
    let options = LoadOptions { host_version: Some(AbiVersion::new(1, 3)), ..Default::default() };
    let p = load(&fixture("older_minor", &[]), &options).unwrap();
    assert_eq!(p.abi().plugin, AbiVersion::new(1, 0));
    assert_eq!(p.abi().host, AbiVersion::new(1, 3));
    assert_eq!(p.abi().effective, AbiVersion::new(1, 0));
    assert!(p.abi().relation().contains("older"));
}

#[test]
fn a_smaller_table_from_an_older_plugin_is_read_with_defaults() {
    // The fixture poisons the bytes past its struct_size: reading them
    // would crash the test.
    let p = load_default(&fixture("older_table", &["FIXTURE_OLDER_TABLE"])).unwrap();
    assert_eq!(p.table_size(), std::mem::offset_of!(torchfl_ffi::TFL_PluginApi, event_elapsed_time));
    assert!(p.optional_entries().iter().all(|(_, present)| !present), "{:?}", p.optional_entries());
    let err = p.memory_stats(0).unwrap_err();
    assert_eq!(err.kind(), "Unimplemented");
    assert!(err.to_string().contains("memory_stats"), "{err}");
    // Required behaviour still works.
    let buf = p.allocate(0, 64).unwrap();
    p.copy_to_device(&buf, 0, &[7u8; 64]).unwrap();
    let mut back = [0u8; 64];
    p.copy_to_host(&buf, 0, &mut back).unwrap();
    assert_eq!(back, [7u8; 64]);
}

#[test]
fn device_capability_is_read_only_from_a_1_2_plugin() {
    // The fixture's code writes the 1.2 fields whenever the struct covers
    // them, so only the struct size the host offers keeps them at default.
    let current = load_default(&fixture("minor_2", &["FIXTURE_ABI_MINOR=2"])).unwrap();
    assert_eq!(current.abi().effective, AbiVersion::new(1, 2));
    assert_eq!(current.device_properties(0).unwrap().capability, (1, 0));
    let older = load_default(&fixture("minor_1", &["FIXTURE_ABI_MINOR=1"])).unwrap();
    let props = older.device_properties(0).unwrap();
    assert_eq!(props.capability, (0, 0), "a 1.1 plugin could not declare it");
    assert_eq!(props.name, "minimal-c host device", "the 1.0 fields are still read");
    // A host at 1.1 meeting a 1.2 plugin does not ask either.
    let options = LoadOptions { host_version: Some(AbiVersion::new(1, 1)), ..Default::default() };
    let old_host = load(&fixture("minor_2_old_host", &["FIXTURE_ABI_MINOR=2"]), &options).unwrap();
    assert_eq!(old_host.device_properties(0).unwrap().capability, (0, 0));
}

#[test]
fn major_too_new_is_refused_naming_both_versions() {
    let msg = expect_err(&fixture("major_new", &["FIXTURE_ABI_MAJOR=2"]), "AbiMismatch");
    assert!(msg.contains("ABI 2.0") && msg.contains("speaks ABI 1.8"), "{msg}");
    assert!(msg.contains("Upgrade torch-fl"), "{msg}");
    assert!(msg.contains("fixture_major_new"), "names the file: {msg}");
}

#[test]
fn major_too_old_is_refused_with_rebuild_advice() {
    let msg =
        expect_err(&fixture("major_old", &["FIXTURE_ABI_MAJOR=0", "FIXTURE_ABI_MINOR=9"]), "AbiMismatch");
    assert!(msg.contains("ABI 0.9"), "{msg}");
    assert!(msg.contains("Rebuild the plugin against the torch_fl/plugin.h"), "{msg}");
}

// --- Malformed plugins ------------------------------------------------------

#[test]
fn missing_file() {
    let msg = expect_err(Path::new("/nonexistent/libnope.so"), "FileNotFound");
    assert!(msg.contains("/nonexistent/libnope.so"), "{msg}");
}

#[test]
fn a_file_that_is_not_a_shared_library() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("libfake.so");
    std::fs::write(&p, "#!/bin/sh\necho this is a script, not a plugin\n").unwrap();
    let msg = expect_err(&p, "NotASharedLibrary");
    assert!(msg.contains("no ELF header"), "{msg}");
}

#[test]
fn missing_bootstrap_symbol() {
    let msg = expect_err(&fixture("no_bootstrap", &["FIXTURE_NO_BOOTSTRAP"]), "MissingBootstrapSymbol");
    assert!(msg.contains("torch_fl_plugin_get_api"), "{msg}");
}

#[test]
fn bootstrap_returning_null() {
    let msg = expect_err(&fixture("null_api", &["FIXTURE_NULL_API"]), "InvalidPlugin");
    assert!(msg.contains("returned NULL"), "{msg}");
}

#[test]
fn a_table_too_small_for_the_required_entries() {
    let msg = expect_err(&fixture("tiny_table", &["FIXTURE_TINY_TABLE"]), "InvalidPlugin");
    assert!(msg.contains("struct_size"), "{msg}");
}

#[test]
fn each_required_entry_missing_is_named() {
    for entry in Plugin::required_entries() {
        let define = format!("FIXTURE_NULL_ENTRY={entry}");
        let path = fixture(&format!("null_{entry}"), &[define.as_str()]);
        match load_default(&path) {
            Err(Error::MissingRequiredEntry { entry: named, .. }) => assert_eq!(named, *entry),
            other => panic!("NULL {entry}: expected MissingRequiredEntry, got {other:?}"),
        }
    }
}

#[test]
fn null_optional_entries_load_and_report_unimplemented() {
    let p = load_default(&fixture("null_optional", &["FIXTURE_NULL_OPTIONAL"])).unwrap();
    assert!(p.optional_entries().iter().all(|(_, present)| !present));
    assert_eq!(p.memory_stats(0).unwrap_err().kind(), "Unimplemented");
    assert_eq!(p.reset_peak_memory_stats(0).unwrap_err().kind(), "Unimplemented");
    p.empty_cache(0).unwrap(); // absent empty_cache is a no-op
    let a = p.create_event(0, true).unwrap();
    let b = p.create_event(0, true).unwrap();
    assert_eq!(a.elapsed_ms(&b).unwrap_err().kind(), "Unimplemented");
}

#[test]
fn init_failure_carries_the_plugins_message() {
    let msg = expect_err(&fixture("init_fails", &["FIXTURE_INIT_FAILS"]), "InitFailed");
    assert!(msg.contains("no accelerator found on the PCI bus"), "{msg}");
    assert!(msg.contains("DEVICE_LOST"), "{msg}");
    assert!(msg.contains("'minimal_c'"), "{msg}");
}

#[test]
fn an_init_message_that_is_not_utf8_is_decoded_lossily() {
    let msg = expect_err(
        &fixture("init_fails_utf8", &["FIXTURE_INIT_FAILS", "FIXTURE_INVALID_UTF8"]),
        "InitFailed",
    );
    // Each invalid sequence (0xE9; 0x80; 0xE2 0x82) becomes one U+FFFD.
    assert!(msg.contains("on the PCI bus (injected) [caf\u{FFFD} \u{FFFD} \u{FFFD}]"), "{msg}");
}

#[test]
fn a_declared_kernel_without_its_exported_symbol() {
    let path = fixture("missing_symbol", &["FIXTURE_MISSING_SYMBOL"]);
    let msg = expect_err(&path, "KernelSymbol");
    assert!(msg.contains("mul_.Tensor") && msg.contains("torch_fl_op_mul__Tensor"), "{msg}");
    assert!(msg.contains("no exported kernel symbol"), "{msg}");
}

#[test]
fn an_unconventional_symbol_name_is_refused() {
    let msg = expect_err(&fixture("wrong_symbol", &["FIXTURE_WRONG_SYMBOL_NAME"]), "KernelSymbol");
    assert!(msg.contains("my_add_kernel") && msg.contains("torch_fl_op_add_Tensor"), "{msg}");
}

#[test]
fn opening_without_initializing_reads_identity_only() {
    let lib =
        PluginLibrary::open(&fixture("open_only", &["FIXTURE_INIT_FAILS"]), &LoadOptions::default()).unwrap();
    assert_eq!(lib.info().name, "minimal_c");
    assert_eq!(lib.abi().effective, AbiVersion::new(1, 0));
}

/// A fresh directory of this test process's own.
fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("torchfl-core-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[cfg(unix)]
#[test]
fn a_plugin_other_users_can_write_is_refused_unless_allowed() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile_dir("insecure");
    let path = dir.join("libfixture_insecure.so");
    std::fs::copy(fixture("insecure", &[]), &path).unwrap();
    let set_mode = |p: &std::path::Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };

    set_mode(&path, 0o666);
    let msg = expect_err(&path, "InsecurePermissions");
    assert!(
        msg.contains("writable by every user") && msg.contains("TORCH_FL_ALLOW_WRITABLE_PLUGINS"),
        "{msg}"
    );
    let allowed = LoadOptions { allow_writable_by_others: true, ..Default::default() };
    PluginLibrary::open(&path, &allowed).unwrap();

    // A group-writable file is fine; a world-writable directory is not,
    // unless it is sticky like /tmp.
    set_mode(&path, 0o664);
    set_mode(&dir, 0o777);
    let msg = expect_err(&path, "InsecurePermissions");
    assert!(msg.contains("without the sticky bit"), "{msg}");
    set_mode(&dir, 0o1777);
    PluginLibrary::open(&path, &LoadOptions::default()).unwrap();
    set_mode(&dir, 0o755);
}
