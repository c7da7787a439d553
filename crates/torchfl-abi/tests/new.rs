//! `torchfl-abi new`: the projects it writes build, pass `verify` through
//! their own CI script, and are packaged as torch-fl plugin packages; bad
//! names and non-empty directories are refused without writing anything.
//! Also `header --helpers` and `header --include-dir`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use std::path::Path;
use std::process::{Command, Output};

const ABI: &str = env!("CARGO_BIN_EXE_torchfl-abi");

fn abi_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(ABI).args(args).current_dir(dir).output().unwrap()
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file under `dir`, relative, sorted.
fn files(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// No placeholder left unrendered in any written file (the copies of
/// torch-fl's own files are compared verbatim instead).
fn assert_rendered(dir: &Path) {
    for file in files(dir).into_iter().filter(|f| !f.starts_with("vendor/") && !f.starts_with("include/")) {
        let body = read(&dir.join(&file));
        assert!(!body.contains("{{"), "{file} has an unrendered placeholder");
    }
}

/// The package shape of torch-fl's plugin packages (examples/c_plugin is one).
fn assert_plugin_package(dir: &Path, device: &str, python_dir: &str) {
    let pyproject = read(&dir.join("pyproject.toml"));
    let dist = format!("torchfl-{}", device.replace('_', "-"));
    assert!(pyproject.contains(&format!("name = \"{dist}\"")), "{pyproject}");
    assert!(pyproject.contains("dependencies = [\"torch-fl>="), "{pyproject}");
    assert!(!pyproject.contains("\"torch\""), "a plugin package must not depend on torch:\n{pyproject}");
    assert!(pyproject.contains("[project.entry-points.\"torch_fl.plugins\"]"), "{pyproject}");
    assert!(pyproject.contains(&format!("{device} = \"torchfl_{device}:plugin\"")), "{pyproject}");
    assert!(pyproject.contains(&format!("where = [\"{python_dir}\"]")), "{pyproject}");
    let init = read(&dir.join(format!("{python_dir}/torchfl_{device}/__init__.py")));
    assert!(init.contains("def plugin() -> dict[str, object]:"), "{init}");
    let ci = read(&dir.join("ci.sh"));
    assert!(ci.contains("\"$TORCHFL_ABI\" verify \"$LIB\""), "{ci}");
    assert!(ci.contains(&format!("-m torch_fl compat --device {device} --plugin \"$LIB\"")), "{ci}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("ci.sh")).unwrap().permissions().mode();
        assert_eq!(mode & 0o111, 0o111, "ci.sh is not executable");
    }
}

/// Runs the project's own ci.sh, without the PyTorch part, with this
/// torchfl-abi; returns its output after asserting it passed with `summary`
/// (the C template records activity, the Rust one does not).
fn run_ci(dir: &Path, summary: &str) -> String {
    let out = Command::new("bash")
        .arg(dir.join("ci.sh"))
        .env("SKIP_COMPAT", "1")
        .env("TORCHFL_ABI", ABI)
        // The project builds into its own target/ whatever the environment says.
        .env("CARGO_TARGET_DIR", dir.join("elsewhere"))
        .output()
        .unwrap();
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "ci.sh failed:\n{all}");
    assert!(all.contains(summary), "{summary:?} not in:\n{all}");
    all
}

#[test]
fn a_c_project_builds_and_passes_verify_through_its_ci_script() {
    let tmp = tempfile::tempdir().unwrap();
    let out = abi_in(tmp.path(), &["new", "npu"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The default directory, and a pip command that names a path, not an index package.
    assert!(text(&out.stdout).contains("pip install ./torchfl-npu"), "{}", text(&out.stdout));
    let dir = tmp.path().join("torchfl-npu");
    assert_eq!(
        files(&dir),
        [
            ".gitignore",
            "README.md",
            "ci.sh",
            "csrc/npu_plugin.c",
            "include/torch_fl/plugin.h",
            "include/torch_fl/plugin_helpers.h",
            "pyproject.toml",
            "setup.py",
            "src/torchfl_npu/__init__.py",
        ]
    );
    assert_rendered(&dir);
    assert_plugin_package(&dir, "npu", "src");
    assert_eq!(read(&dir.join("include/torch_fl/plugin.h")), torchfl_ffi::HEADER);
    assert_eq!(read(&dir.join("include/torch_fl/plugin_helpers.h")), torchfl_ffi::HELPERS_HEADER);
    let setup = read(&dir.join("setup.py"));
    assert!(setup.contains("\"torchfl_npu._plugin\"") && setup.contains("csrc/npu_plugin.c"), "{setup}");

    let ci = run_ci(&dir, "19 passed, 0 failed, 2 skipped");
    assert!(ci.contains("'npu' 0.1.0"), "the plugin is not named after the device:\n{ci}");
    assert!(dir.join("build/libtorchfl_npu.so").exists());
}

/// Builds a new cargo project (no dependency but the vendored torchfl-ffi,
/// offline); a few seconds on an idle machine.
#[test]
fn a_rust_project_builds_offline_and_passes_verify_through_its_ci_script() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("plugin");
    let out = abi_in(tmp.path(), &["new", "my_dev", "--lang", "rust", "--dir", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let mut expected = vec![
        ".gitignore".to_owned(),
        "Cargo.toml".to_owned(),
        "README.md".to_owned(),
        "ci.sh".to_owned(),
        "pyproject.toml".to_owned(),
        "python/torchfl_my_dev/__init__.py".to_owned(),
        "setup.py".to_owned(),
        "src/lib.rs".to_owned(),
        "vendor/torchfl-ffi/Cargo.toml".to_owned(),
        "vendor/torchfl-ffi/rustfmt.toml".to_owned(),
    ];
    expected.extend(torchfl_ffi::CRATE_SOURCES.iter().map(|(p, _)| format!("vendor/torchfl-ffi/{p}")));
    expected.sort();
    assert_eq!(files(&dir), expected);
    assert_rendered(&dir);
    assert_plugin_package(&dir, "my_dev", "python");
    let cargo = read(&dir.join("Cargo.toml"));
    assert!(
        cargo.contains("name = \"torchfl-my_dev\"") && cargo.contains("crate-type = [\"cdylib\"]"),
        "{cargo}"
    );
    // torchfl-ffi is the only dependency, and a path one.
    let deps = cargo.split("[dependencies]").nth(1).unwrap().split("\n[").next().unwrap();
    let deps: Vec<_> = deps.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).collect();
    assert_eq!(deps, ["torchfl-ffi = { path = \"vendor/torchfl-ffi\" }"]);
    for (path, source) in torchfl_ffi::CRATE_SOURCES {
        assert_eq!(read(&dir.join("vendor/torchfl-ffi").join(path)), *source, "{path}");
    }

    let ci = run_ci(&dir, "18 passed, 0 failed, 3 skipped");
    assert!(ci.contains("'my_dev' 0.1.0"), "the plugin is not named after the device:\n{ci}");
    assert!(dir.join("target/release/libtorchfl_my_dev.so").exists());

    // A clean start: formatted, and no clippy warning in the vendor's own code.
    for args in [&["fmt", "--check"][..], &["clippy", "--offline", "--release", "--", "-D", "warnings"]] {
        let out = Command::new(env!("CARGO"))
            .args(args)
            .current_dir(&dir)
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .unwrap();
        assert!(out.status.success(), "cargo {args:?}:\n{}{}", text(&out.stdout), text(&out.stderr));
    }
}

#[test]
fn device_names_follow_the_registration_rules() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, why) in [
        ("Npu", "must start with a lowercase letter and contain only [a-z_]"),
        ("npu2", "PyTorch's device strings have no digits"),
        ("1npu", "must start with a lowercase letter"),
        ("my-dev", "contain only [a-z_]"),
        ("", "must start with a lowercase letter"),
        ("cuda", "one of PyTorch's built-in device types"),
        ("privateuseone", "one of PyTorch's built-in device types"),
    ] {
        let out = abi_in(tmp.path(), &["new", name]);
        assert_eq!(out.status.code(), Some(2), "{name:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(&format!("'{name}' cannot be a torch-fl device name")), "{stderr}");
        assert!(stderr.contains(why), "{name:?}: {stderr}");
    }
    assert!(files(tmp.path()).is_empty(), "a refused name wrote {:?}", files(tmp.path()));
}

#[test]
fn an_existing_directory_is_used_only_when_empty() {
    let tmp = tempfile::tempdir().unwrap();
    let busy = tmp.path().join("busy");
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("notes.txt"), "mine").unwrap();
    let out = abi_in(tmp.path(), &["new", "npu", "--dir", "busy"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("busy is not empty"), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("nothing was written"), "{}", text(&out.stderr));
    assert_eq!(files(&busy), ["notes.txt"]);
    assert_eq!(read(&busy.join("notes.txt")), "mine");

    std::fs::write(tmp.path().join("file"), "x").unwrap();
    let out = abi_in(tmp.path(), &["new", "npu", "--dir", "file", "--lang", "rust"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("exists and is not a directory"), "{}", text(&out.stderr));

    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = abi_in(tmp.path(), &["new", "npu", "--dir", "empty"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(empty.join("csrc/npu_plugin.c").exists());

    let out = abi_in(tmp.path(), &["new", "npu", "--lang", "fortran"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!tmp.path().join("torchfl-npu").exists());
}

#[test]
fn header_writes_the_helpers_too() {
    let tmp = tempfile::tempdir().unwrap();
    let out = abi_in(tmp.path(), &["header", "--helpers"]);
    assert_eq!(text(&out.stdout), torchfl_ffi::HELPERS_HEADER);
    let out = abi_in(tmp.path(), &["header", "--helpers", "-o", "h.h"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(read(&tmp.path().join("h.h")), torchfl_ffi::HELPERS_HEADER);
    let out = abi_in(tmp.path(), &["header", "--include-dir", "inc"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(read(&tmp.path().join("inc/torch_fl/plugin.h")), torchfl_ffi::HEADER);
    assert_eq!(read(&tmp.path().join("inc/torch_fl/plugin_helpers.h")), torchfl_ffi::HELPERS_HEADER);
    // -o and --include-dir say different things: refused.
    assert_eq!(abi_in(tmp.path(), &["header", "--include-dir", "inc", "-o", "x.h"]).status.code(), Some(2));
}
