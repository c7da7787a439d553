//! `torchfl-abi` end to end: exit codes, human and JSON output, and the exact
//! failure each broken fixture produces.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use std::path::Path;
use std::process::{Command, Output};

use torchfl_testkit::{build_c_plugin_at, c_example_plugin, fixture, sim_plugin};

fn abi(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_torchfl-abi")).args(args).output().unwrap()
}

/// Runs the tool on a plugin that never returns, under a bound of the
/// test's own: without the tool's `--timeout` the test must fail, not hang.
/// (A hang guard, not a speed check: the bound is far above any timeout
/// the tests pass.)
fn abi_on_a_hanging_plugin(args: &[&str], what: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_torchfl-abi"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            let _ = child.wait();
            panic!("torchfl-abi hung on {what}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn verify_json(plugin: &Path) -> (i32, serde_json::Value) {
    let out = abi(&["verify", "--json", plugin.to_str().unwrap()]);
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bad JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap(), doc)
}

/// The status and detail of check `id`.
fn check<'a>(doc: &'a serde_json::Value, id: &str) -> (&'a str, &'a str) {
    let c = doc["checks"].as_array().unwrap().iter().find(|c| c["id"] == id).unwrap();
    (c["status"].as_str().unwrap(), c["detail"].as_str().unwrap())
}

#[test]
fn verify_passes_on_the_c_example() {
    let (code, doc) = verify_json(&c_example_plugin());
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["summary"]["failed"], 0);
    // Its only skips: collectives and native graphs, which it does not
    // offer (both optional).
    assert_eq!(doc["summary"]["skipped"], 2);
    assert_eq!(check(&doc, "collectives").0, "skip");
    assert!(check(&doc, "collectives").1.contains("not offered"), "{doc:#}");
    assert_eq!(check(&doc, "graphs").0, "skip");
    assert!(check(&doc, "graphs").1.contains("no native graphs"), "{doc:#}");
    // It records activity through the helpers' buffer, ranges included.
    let (status, detail) = check(&doc, "activity");
    assert_eq!(status, "pass", "{doc:#}");
    assert!(detail.contains("range and mark recorded"), "{detail}");
    assert_eq!(doc["identity"]["name"], "minimal_c");
    assert_eq!(doc["isolation"], "child process");
    assert!(doc["abort"].is_null());
    for c in doc["checks"].as_array().unwrap() {
        assert!(c["duration_ms"].as_f64().unwrap() >= 0.0, "{c:#}");
    }
    assert!(check(&doc, "kernels").1.contains("add.Tensor, mul.Tensor"), "{doc:#}");
    let human = abi(&["verify", c_example_plugin().to_str().unwrap()]);
    let text = String::from_utf8(human.stdout).unwrap();
    assert!(
        text.contains("PASS  out_of_memory") && text.contains("19 passed, 0 failed, 2 skipped"),
        "{text}"
    );
}

#[test]
fn verify_passes_on_the_simulated_plugin() {
    let (code, doc) = verify_json(&sim_plugin());
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["summary"]["failed"], 0, "{doc:#}");
    assert_eq!(doc["summary"]["skipped"], 0, "{doc:#}");
    assert_eq!(doc["identity"]["name"], "sim");
    assert_eq!(check(&doc, "kernels").0, "pass");
    assert!(check(&doc, "kernels").1.contains("div.Tensor"), "{doc:#}");
    assert!(check(&doc, "concurrency").1.contains("add.Tensor"), "{doc:#}");
    let (status, detail) = check(&doc, "collectives");
    assert_eq!(status, "pass", "{doc:#}");
    assert!(detail.contains("comm_init_rank_config (non-blocking)"), "{detail}");
    assert_eq!(check(&doc, "graphs").0, "pass", "{doc:#}");
    let (status, detail) = check(&doc, "activity");
    assert_eq!(status, "pass", "{doc:#}");
    assert!(detail.contains("add.Tensor") && detail.contains("range and mark recorded"), "{detail}");
    assert_eq!(doc["summary"]["passed"], 21, "{doc:#}");
    assert!(doc["identity"]["capabilities"].as_array().unwrap().contains(&"host_addressable_memory".into()));
}

#[test]
fn verify_passes_on_the_simulated_plugin_in_strict_and_sync_modes() {
    let out = abi(&["verify", "--json", "--options", "strict=1;mode=sync", sim_plugin().to_str().unwrap()]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{doc:#}");
    // Capabilities are read after initialize: these options withdraw both.
    let caps = doc["identity"]["capabilities"].as_array().unwrap();
    assert!(!caps.contains(&"host_addressable_memory".into()), "{caps:?}");
    assert!(!caps.contains(&"async_streams".into()), "{caps:?}");
    assert!(!caps.contains(&"caching_allocator".into()), "{caps:?}");
    // The ABI 1.4 capability follows the simulator's self_caching option.
    let out = abi(&["verify", "--json", "--options", "self_caching=1", sim_plugin().to_str().unwrap()]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{doc:#}");
    assert!(
        doc["identity"]["capabilities"].as_array().unwrap().contains(&"caching_allocator".into()),
        "{doc:#}"
    );
}

#[test]
fn inspect_reports_the_simulators_pinned_memory_entries() {
    let out = abi(&["inspect", "--json", sim_plugin().to_str().unwrap()]);
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["abi"]["effective"], "1.8");
    assert_eq!(doc["optional_entries"]["host_allocate"], true);
    assert_eq!(doc["optional_entries"]["host_deallocate"], true);
}

#[test]
fn each_broken_plugin_fails_its_own_check_with_a_specific_message() {
    let dir = tempfile::tempdir().unwrap();
    let text_file = dir.path().join("libtext.so");
    std::fs::write(&text_file, "not a plugin, just text, long enough for a header").unwrap();
    let cases: Vec<(std::path::PathBuf, &str, &str)> = vec![
        (dir.path().join("libmissing.so"), "file", "does not exist"),
        (text_file, "file", "no ELF header"),
        (
            fixture("no_bootstrap", &["FIXTURE_NO_BOOTSTRAP"]),
            "handshake",
            "does not export the bootstrap symbol",
        ),
        (fixture("major_new", &["FIXTURE_ABI_MAJOR=2"]), "handshake", "ABI 2.0"),
        (fixture("major_old", &["FIXTURE_ABI_MAJOR=0", "FIXTURE_ABI_MINOR=9"]), "handshake", "ABI 0.9"),
        (fixture("null_api", &["FIXTURE_NULL_API"]), "handshake", "returned NULL"),
        (fixture("tiny_table", &["FIXTURE_TINY_TABLE"]), "function_table", "struct_size is"),
        (
            fixture("null_allocate", &["FIXTURE_NULL_ENTRY=allocate"]),
            "function_table",
            "TFL_PluginApi.allocate NULL",
        ),
        (fixture("missing_symbol", &["FIXTURE_MISSING_SYMBOL"]), "op_table", "torch_fl_op_mul__Tensor"),
        (fixture("wrong_symbol", &["FIXTURE_WRONG_SYMBOL_NAME"]), "op_table", "my_add_kernel"),
        (fixture("init_fails", &["FIXTURE_INIT_FAILS"]), "initialize", "no accelerator found"),
    ];
    for (path, failing, message) in cases {
        let (code, doc) = verify_json(&path);
        assert_eq!(code, 3, "{}: load failures exit with 3\n{doc:#}", path.display());
        let (status, detail) = check(&doc, failing);
        assert_eq!(status, "fail", "{}: {doc:#}", path.display());
        assert!(detail.contains(message), "{}: {detail}", path.display());
        let failed = doc["checks"].as_array().unwrap().iter().filter(|c| c["status"] == "fail").count();
        assert_eq!(failed, 1, "{}: exactly one failure\n{doc:#}", path.display());
    }
}

/// The C example with an activity table, `tests/plugins/activity_fixture.c`,
/// breaking the rules its defines name.
fn activity_fixture(variant: &str, defines: &[&str]) -> std::path::PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/plugins/activity_fixture.c");
    build_c_plugin_at(&source, &format!("activity_{variant}"), defines)
}

#[test]
fn the_activity_check_passes_a_conforming_table_and_names_each_broken_rule() {
    let (code, doc) = verify_json(&activity_fixture("ok", &[]));
    assert_eq!(code, 0, "{doc:#}");
    let (status, detail) = check(&doc, "activity");
    assert_eq!(status, "pass", "{doc:#}");
    assert!(detail.contains("(api 1, kernel 1)") && detail.contains("range and mark recorded"), "{detail}");
    // Ranges are optional: their absence is said, not failed.
    let (code, doc) = verify_json(&activity_fixture("no_ranges", &["FXA_NO_RANGES"]));
    assert_eq!(code, 0, "{doc:#}");
    assert!(check(&doc, "activity").1.contains("no ranges"), "{doc:#}");

    let cases: &[(&str, &str, &[&str])] = &[
        ("bad_mask", "FXA_ACCEPT_BAD_MASK", &["activity_enable(0x100000)", "must be INVALID_ARGUMENT"]),
        ("no_kernel", "FXA_NO_KERNEL", &["the add's kernel execution has no KERNEL record", "0x7f10001"]),
        ("wrong_id", "FXA_WRONG_ID", &["KERNEL record \"add.Tensor\"", "0x7f10008", "never set"]),
        ("ignore_off", "FXA_IGNORE_OFF", &["recording was off", "0x7f10002"]),
        ("mark_span", "FXA_MARK_SPAN", &["MARK record \"verify-mark\"", "start == end"]),
        ("clock_pair", "FXA_CLOCK_PAIR_OFFSET", &["mapped through the clock pair", "outside the window"]),
    ];
    for (variant, define, words) in cases {
        let (code, doc) = verify_json(&activity_fixture(variant, &[define]));
        assert_eq!(code, 1, "{define}: {doc:#}");
        let (status, detail) = check(&doc, "activity");
        assert_eq!(status, "fail", "{define}: {doc:#}");
        for w in *words {
            assert!(detail.contains(w), "{define}: {w:?} not in {detail}");
        }
        assert_eq!(doc["summary"]["failed"], 1, "{define}: only the activity check fails\n{doc:#}");
    }
}

#[test]
fn a_loadable_plugin_failing_a_check_exits_with_1() {
    let (code, doc) = verify_json(&fixture("wrong_oom_code", &["FIXTURE_WRONG_OOM_CODE"]));
    assert_eq!(code, 1, "{doc:#}");
    let (status, detail) = check(&doc, "out_of_memory");
    assert_eq!(status, "fail");
    assert!(detail.contains("INTERNAL") && detail.contains("instead of OUT_OF_MEMORY"), "{detail}");
}

#[test]
fn optional_entries_absent_are_skipped_not_failed() {
    let (code, doc) = verify_json(&fixture("null_optional", &["FIXTURE_NULL_OPTIONAL"]));
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(check(&doc, "memory_stats").0, "skip");
    assert!(check(&doc, "events").1.contains("not implemented"));
}

#[test]
fn inspect_lists_identity_devices_and_ops() {
    let out = abi(&["inspect", "--json", c_example_plugin().to_str().unwrap()]);
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["name"], "minimal_c");
    assert_eq!(doc["abi"]["effective"], "1.8");
    assert_eq!(doc["devices"].as_array().unwrap().len(), 1);
    assert_eq!(doc["devices"][0]["capability"], serde_json::json!([1, 0]));
    assert_eq!(doc["ops"][0]["symbol"], "torch_fl_op_add_Tensor");
    assert_eq!(doc["optional_entries"]["empty_cache"], false);
    assert_eq!(doc["optional_entries"]["host_allocate"], false);

    let human = String::from_utf8(abi(&["inspect", c_example_plugin().to_str().unwrap()]).stdout).unwrap();
    assert!(human.contains("fill_.Scalar") && human.contains("torch_fl_op_fill__Scalar"), "{human}");
    assert!(human.contains("capability 1.0"), "{human}");
}

#[test]
fn inspect_of_a_broken_plugin_exits_with_3_and_says_why() {
    let out = abi(&["inspect", fixture("major_new", &["FIXTURE_ABI_MAJOR=2"]).to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ABI 2.0"));
}

#[test]
fn symbol_and_header_helpers() {
    let out = abi(&["symbol", "add_.Tensor"]);
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), "torch_fl_op_add__Tensor");
    assert_eq!(abi(&["symbol", "not an op"]).status.code(), Some(2));
    let header = abi(&["header"]);
    assert_eq!(String::from_utf8(header.stdout).unwrap(), torchfl_ffi::HEADER);
}

#[test]
fn a_plugin_name_is_looked_up_in_the_plugin_path() {
    let run = |name: &str| {
        Command::new(env!("CARGO_BIN_EXE_torchfl-abi"))
            .args(["inspect", name])
            .env("TORCH_FL_PLUGIN_PATH", c_example_plugin())
            .output()
            .unwrap()
    };
    let out = run("no_such_plugin");
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no torch-fl plugin named 'no_such_plugin'"));
    let by_name = run("minimal_c");
    assert!(by_name.status.success(), "{}", String::from_utf8_lossy(&by_name.stderr));
}

#[test]
fn a_crashing_kernel_is_reported_with_its_signal_and_check() {
    let plugin = fixture("crashing_kernel", &["FIXTURE_CRASHING_KERNEL"]);
    let (code, doc) = verify_json(&plugin);
    assert_eq!(code, 1, "{doc:#}");
    let (status, detail) = check(&doc, "kernels");
    assert_eq!(status, "fail");
    assert!(detail.contains("crashed with SIGSEGV (signal 11) during check kernels"), "{detail}");
    assert!(detail.contains("last step: calling div.Tensor on device 0"), "{detail}");
    assert_eq!(doc["abort"]["kind"], "crash");
    assert_eq!(doc["abort"]["check"], "kernels");
    assert_eq!(doc["abort"]["signal_name"], "SIGSEGV");
    assert_eq!(doc["abort"]["signal"], 11);
    // Checks before the crash ran; the ones after it are reported, not run.
    assert_eq!(check(&doc, "error_objects").0, "pass");
    assert_eq!(check(&doc, "graphs").0, "not_run");
    assert_eq!(check(&doc, "activity").0, "not_run");
    assert_eq!(check(&doc, "concurrency").0, "not_run");
    assert_eq!(check(&doc, "collectives").0, "not_run");
    assert_eq!(doc["summary"]["failed"], 1, "{doc:#}");
    assert_eq!(doc["summary"]["not_run"], 4, "{doc:#}");

    let human = abi(&["verify", plugin.to_str().unwrap()]);
    assert_eq!(human.status.code(), Some(1));
    let text = String::from_utf8(human.stdout).unwrap();
    assert!(text.contains("FAIL  kernels") && text.contains("SIGSEGV"), "{text}");
    assert!(text.contains("4 not run"), "{text}");
}

#[test]
fn a_failing_kernel_is_reported_with_its_message() {
    let (code, doc) = verify_json(&fixture("failing_kernel", &["FIXTURE_FAILING_KERNEL"]));
    assert_eq!(code, 1, "{doc:#}");
    let (status, detail) = check(&doc, "kernels");
    assert_eq!(status, "fail");
    assert!(
        detail.contains("sub.Tensor") && detail.contains("fixture: sub.Tensor failed on purpose"),
        "{detail}"
    );
    assert!(detail.contains("INTERNAL"), "{detail}");
    assert!(doc["abort"].is_null());
    // Only that check fails, and the checks after it still run.
    assert_eq!(doc["summary"]["failed"], 1, "{doc:#}");
    assert_eq!(check(&doc, "concurrency").0, "pass");
}

#[test]
fn a_hanging_plugin_is_bounded_by_the_timeout() {
    let plugin = fixture("hanging_sync", &["FIXTURE_HANGING_SYNC"]);
    let out = abi_on_a_hanging_plugin(
        &["verify", "--json", "--timeout", "2", plugin.to_str().unwrap()],
        "a plugin whose synchronize never returns",
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{doc:#}");
    assert_eq!(doc["abort"]["kind"], "timeout", "{doc:#}");
    let hung = doc["abort"]["check"].as_str().unwrap();
    let (status, detail) = check(&doc, hung);
    assert_eq!(status, "fail");
    assert!(detail.contains("timed out after 2 s"), "{detail}");
    assert!(doc["summary"]["not_run"].as_u64().unwrap() >= 1, "{doc:#}");
    assert_eq!(check(&doc, "concurrency").0, "not_run");
}

#[test]
fn in_process_verify_gives_the_same_report() {
    let out = abi(&["verify", "--json", "--in-process", c_example_plugin().to_str().unwrap()]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{doc:#}");
    assert_eq!(doc["isolation"], "in-process");
    assert_eq!(doc["summary"]["passed"], 19, "{doc:#}");
}

/// A host whose executable is not `torchfl-abi` (Python calling
/// `torchfl_abi::run`) runs the checks in-process, unless TORCHFL_ABI_EXE
/// names the tool to isolate them in.
#[test]
fn an_embedding_host_isolates_through_torchfl_abi_exe() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("python-host");
    std::fs::copy(env!("CARGO_BIN_EXE_torchfl-abi"), &host).unwrap();
    let crashing = fixture("crashing_kernel", &["FIXTURE_CRASHING_KERNEL"]);

    let plain = Command::new(&host)
        .args(["verify", "--json", c_example_plugin().to_str().unwrap()])
        .env_remove("TORCHFL_ABI_EXE")
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert_eq!(plain.status.code(), Some(0), "{doc:#}");
    assert_eq!(doc["isolation"], "in-process");

    let isolated = Command::new(&host)
        .args(["verify", "--json", crashing.to_str().unwrap()])
        .env("TORCHFL_ABI_EXE", env!("CARGO_BIN_EXE_torchfl-abi"))
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&isolated.stdout).unwrap();
    assert_eq!(isolated.status.code(), Some(1), "{doc:#}");
    assert_eq!(doc["isolation"], "child process");
    assert_eq!(doc["abort"]["signal_name"], "SIGSEGV");
}

#[test]
fn the_library_entry_point_still_runs_verify() {
    // This test binary is not torchfl-abi, so `run` verifies in-process.
    let code = torchfl_abi::run(["torchfl-abi", "verify", "--json", c_example_plugin().to_str().unwrap()]);
    assert_eq!(code, 0);
    let code = torchfl_abi::run(["torchfl-abi", "verify", "--no-such-flag", "x"]);
    assert_eq!(code, 2);
}

#[test]
fn a_plugin_printing_to_stdout_does_not_corrupt_the_json_report() {
    let out =
        abi(&["verify", "--json", fixture("chatty_stdout", &["FIXTURE_CHATTY_STDOUT"]).to_str().unwrap()]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(out.status.code(), Some(0), "{doc:#}");
    assert_eq!(doc["summary"]["passed"], 18, "{doc:#}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("fixture: initializing, chatty on stdout"));
}

#[test]
fn a_numerically_wrong_plugin_fails_the_kernels_check() {
    let (code, doc) = verify_json(&fixture("wrong_numbers", &["FIXTURE_WRONG_NUMBERS"]));
    assert_eq!(code, 1, "{doc:#}");
    let (status, detail) = check(&doc, "kernels");
    assert_eq!(status, "fail");
    assert!(detail.contains("sub.Tensor"), "{detail}");
}

#[cfg(unix)]
#[test]
fn a_plugin_other_users_can_write_cannot_be_loaded() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("torchfl-abi-writable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("libfixture_writable.so");
    std::fs::copy(fixture("writable", &[]), &path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (code, doc) = verify_json(&path);
    assert_eq!(code, 3, "{doc:#}");
    assert!(doc.to_string().contains("writable by every user"), "{doc:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn inspect_gives_up_on_a_plugin_whose_initialize_never_returns() {
    let plugin = fixture("hanging_init", &["FIXTURE_HANGING_INIT"]);
    let out = abi_on_a_hanging_plugin(
        &["inspect", "--json", "--timeout", "1", plugin.to_str().unwrap()],
        "a plugin whose initialize never returns",
    );
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["loaded"], false, "{doc:#}");
    assert_eq!(doc["error"]["kind"], "InitTimeout", "{doc:#}");
    let message = doc["error"]["message"].as_str().unwrap();
    assert!(message.contains("initialize"), "{message}");
}
