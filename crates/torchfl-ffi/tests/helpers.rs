//! `torch_fl/plugin_helpers.h`: compiles as strict C99, C11 and C++17 and
//! every helper behaves as documented (`tests/c/use_helpers.c` and, for the
//! activity records, `tests/c/use_activity_helpers.c` check each one and name
//! the first that fails).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use std::path::Path;
use std::process::Command;

fn compiler(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

#[test]
fn helpers_compile_strictly_and_behave_as_documented() {
    compile_and_run("use_helpers");
}

#[test]
fn activity_helpers_compile_strictly_and_behave_as_documented() {
    compile_and_run("use_activity_helpers");
}

/// Builds `tests/c/<name>.c` as C99, C11 and C++17 with warnings as errors,
/// and runs each build: it must print `ok`.
fn compile_and_run(name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let strict = ["-Wall", "-Wextra", "-Werror", "-pedantic"];
    for (cc, std) in [
        (compiler("CC", "cc"), "-std=c99"),
        (compiler("CC", "cc"), "-std=c11"),
        (compiler("CXX", "c++"), "-std=c++17"),
    ] {
        let exe = dir.path().join(format!("{name}{}", std.replace(['-', '='], "_")));
        let mut cmd = Command::new(&cc);
        cmd.arg(std).args(strict);
        if std.contains("++") {
            cmd.args(["-x", "c++"]);
        }
        let output = cmd
            .arg("-I")
            .arg(torchfl_ffi::include_dir())
            .arg(&source)
            .arg("-o")
            .arg(&exe)
            .arg("-lpthread")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
        assert!(output.status.success(), "{cc} {std} failed:\n{}", String::from_utf8_lossy(&output.stderr));
        let run = Command::new(&exe).output().unwrap();
        let stdout = String::from_utf8_lossy(&run.stdout);
        assert!(run.status.success() && stdout.trim() == "ok", "{std}: {stdout}");
    }
}

/// Without POSIX clocks the header stops with a message saying what to do,
/// instead of an implicit-declaration error deep inside it.
#[test]
fn helpers_explain_the_missing_posix_define() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("no_posix.c");
    std::fs::write(&source, "#include \"torch_fl/plugin_helpers.h\"\nint main(void) { return 0; }\n")
        .unwrap();
    let cc = compiler("CC", "cc");
    let output = Command::new(&cc)
        .args(["-std=c99", "-fsyntax-only", "-I"])
        .arg(torchfl_ffi::include_dir())
        .arg(&source)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "compiled without _POSIX_C_SOURCE");
    assert!(stderr.contains("#define _POSIX_C_SOURCE 200809L before including any header"), "{stderr}");
}

#[test]
fn the_helpers_constant_is_the_file() {
    let file = torchfl_ffi::include_dir().join("torch_fl/plugin_helpers.h");
    assert_eq!(std::fs::read_to_string(file).unwrap(), torchfl_ffi::HELPERS_HEADER);
}

/// `CRATE_SOURCES` (what `torchfl-abi new --lang rust` vendors) lists every
/// source file of the crate, so a vendored copy builds.
#[test]
fn crate_sources_cover_the_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut on_disk = Vec::new();
    for dir in ["src", "include/torch_fl"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            on_disk.push(format!("{dir}/{}", entry.unwrap().file_name().to_string_lossy()));
        }
    }
    on_disk.sort();
    let mut listed: Vec<String> = torchfl_ffi::CRATE_SOURCES.iter().map(|(p, _)| (*p).to_owned()).collect();
    listed.sort();
    assert_eq!(listed, on_disk);
    for (path, text) in torchfl_ffi::CRATE_SOURCES {
        assert_eq!(std::fs::read_to_string(root.join(path)).unwrap(), *text, "{path}");
    }
}
