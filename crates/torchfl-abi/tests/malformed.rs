//! `torchfl-abi verify` on the malformed-plugin corpus: each refusal in the
//! check of its loading stage, with the words `register_device_plugin`
//! raises (tests/test_broken_plugins.py holds registration to the same
//! corpus), each warning as a failure of its stage, files that are not
//! plugins, and a plugin with no device.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use std::path::{Path, PathBuf};
use std::process::Command;

use torchfl_testkit::fixture;

fn verify_json(plugin: &Path) -> (i32, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_torchfl-abi"))
        .args(["verify", "--json", "--timeout", "60", plugin.to_str().unwrap()])
        .output()
        .unwrap();
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bad JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap(), doc)
}

fn check<'a>(doc: &'a serde_json::Value, id: &str) -> (&'a str, &'a str) {
    let c = doc["checks"].as_array().unwrap().iter().find(|c| c["id"] == id).unwrap();
    (c["status"].as_str().unwrap(), c["detail"].as_str().unwrap())
}

fn failed(doc: &serde_json::Value) -> Vec<&str> {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| c["id"].as_str().unwrap())
        .collect()
}

/// Refused: exit 3, the stage's check fails with `message`, the checks
/// before it pass and nothing crashed.
#[test]
fn each_refusal_fails_the_check_of_its_stage() {
    let cases: Vec<(PathBuf, &str, &str)> = vec![
        (
            fixture("ops_bytes", &["FIXTURE_OPS_COUNT_IN_BYTES"]),
            "op_table",
            "looks like the array's size in bytes",
        ),
        (
            fixture("ops_huge", &["FIXTURE_OPS_COUNT_HUGE"]),
            "op_table",
            "more than TFL_MAX_OP_ENTRIES (65536)",
        ),
        (
            fixture("ops_past_end", &["FIXTURE_OPS_COUNT_PAST_END"]),
            "op_table",
            "counts past the end of the array",
        ),
        (
            fixture("bootstrap_data", &["FIXTURE_BOOTSTRAP_IS_DATA"]),
            "handshake",
            "torch_fl_plugin_get_api is not a function",
        ),
        (
            fixture("info_size0", &["FIXTURE_INFO_STRUCT_SIZE_ZERO"]),
            "identity",
            "TFL_PluginInfo.struct_size is 0, too small",
        ),
        (
            fixture("major_max", &["FIXTURE_ABI_MAJOR=0xFFFFFFFFu"]),
            "handshake",
            "4294967295, which is not an ABI version",
        ),
        (
            fixture("torch_banana", &["FIXTURE_MIN_TORCH_VERSION=\"banana\""]),
            "identity",
            "\"banana\" is not a PyTorch version",
        ),
        (
            fixture("null_stream", &["FIXTURE_NULL_DEFAULT_STREAM"]),
            "streams",
            "default_stream(0) returned NULL",
        ),
    ];
    for (path, stage, message) in cases {
        let (code, doc) = verify_json(&path);
        let name = path.display();
        assert_eq!(code, 3, "{name}: a refused plugin exits with 3\n{doc:#}");
        assert!(doc["abort"].is_null(), "{name}: nothing crashed\n{doc:#}");
        assert_eq!(doc["outcome"], "not_loaded", "{name}");
        assert_eq!(failed(&doc), [stage], "{name}: exactly its stage fails\n{doc:#}");
        let (_, detail) = check(&doc, stage);
        assert!(detail.contains(message), "{name}: {detail}");
        assert!(detail.starts_with("plugin "), "{name}: registration's words, naming the plugin: {detail}");
        let before = doc["checks"].as_array().unwrap().iter().take_while(|c| c["id"] != stage);
        assert!(before.clone().all(|c| c["status"] == "pass"), "{name}\n{doc:#}");
    }
}

/// Warned about: the stage's check fails with the warning (exit 1) and the
/// plugin still loads, as it registers.
#[test]
fn each_warning_fails_the_check_of_its_stage() {
    let cases: Vec<(PathBuf, &str, &str)> = vec![
        (
            fixture("unknown_aten", &["FIXTURE_UNKNOWN_ATEN_OP"]),
            "op_table",
            "'frobnicate.Tensor' is not an ATen operator",
        ),
        (
            fixture("bad_schema", &["FIXTURE_BAD_SCHEMA"]),
            "op_table",
            "custom operator 'fx::scale' is not registered",
        ),
        (
            fixture("schema_name", &["FIXTURE_SCHEMA_NAME_MISMATCH"]),
            "op_table",
            "declares 'scaled', not 'scale'",
        ),
        (fixture("zero_memory", &["FIXTURE_ZERO_MEMORY"]), "device_properties", "total_memory = 0"),
    ];
    for (path, stage, message) in cases {
        let (code, doc) = verify_json(&path);
        let name = path.display();
        assert_eq!(code, 1, "{name}\n{doc:#}");
        assert_eq!(doc["outcome"], "failed", "{name}");
        assert_eq!(failed(&doc), [stage], "{name}\n{doc:#}");
        let (_, detail) = check(&doc, stage);
        assert!(detail.starts_with("registration warns: ") && detail.contains(message), "{name}: {detail}");
        assert_eq!(doc["identity"]["name"], "minimal_c", "{name}: it loaded");
    }
}

#[test]
fn a_plugin_without_devices_is_its_own_outcome() {
    let (code, doc) = verify_json(&fixture("zero_devices", &["FIXTURE_ZERO_DEVICES"]));
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["outcome"], "no_devices", "{doc:#}");
    assert_eq!(doc["summary"]["failed"], 0, "{doc:#}");
    assert_eq!(check(&doc, "initialize"), ("pass", "0 device(s), as probe_devices counted"));
    assert_eq!(check(&doc, "device_properties"), ("skip", "no devices, device checks skipped"));
    assert_eq!(check(&doc, "kernels"), ("skip", "no devices, device checks skipped"));
    assert_eq!(check(&doc, "error_objects").0, "pass", "errors need no device");
    let out = Command::new(env!("CARGO_BIN_EXE_torchfl-abi"))
        .args(["verify", fixture("zero_devices", &["FIXTURE_ZERO_DEVICES"]).to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("\nno devices, device checks skipped\n"), "{text}");
}

#[cfg(unix)]
#[test]
fn files_that_are_not_plugins_fail_the_file_check_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("libfifo.so");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let looped = dir.path().join("libloop.so");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    let dangling = dir.path().join("libdangling.so");
    std::os::unix::fs::symlink(dir.path().join("gone.so"), &dangling).unwrap();
    for (path, message) in [
        (fifo, "it is a FIFO (named pipe), not a regular file"),
        (looped, "symbolic link that loops back on itself"),
        (dangling, "it is a symbolic link to"),
    ] {
        let (code, doc) = verify_json(&path);
        assert_eq!(code, 3, "{}\n{doc:#}", path.display());
        assert_eq!(failed(&doc), ["file"], "{doc:#}");
        assert!(check(&doc, "file").1.contains(message), "{doc:#}");
    }
}

#[test]
fn a_crash_names_the_plugin() {
    let (code, doc) = verify_json(&fixture("crashing_kernel", &["FIXTURE_CRASHING_KERNEL"]));
    assert_eq!(code, 1);
    let message = doc["abort"]["message"].as_str().unwrap();
    assert!(message.starts_with("plugin 'minimal_c' ("), "{message}");
    assert!(message.contains("libfixture_crashing_kernel"), "{message}");
    assert_eq!(doc["outcome"], "aborted");
}
