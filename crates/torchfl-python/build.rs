//! With the `bundle` feature (set by maturin, see pyproject.toml), builds the
//! two native libraries the Python package ships beside this extension, into
//! `python/torch_fl/_lib/`:
//!
//! - `libtorchfl_shim.so`, the C++ shim, compiled against the PyTorch
//!   installed in the Python environment doing the build (hence
//!   `pip install --no-build-isolation`); the torch version is recorded so
//!   that importing under another torch fails with a clear message;
//! - `libtorchfl_sim.so`, the simulated accelerator (a plugin is a separate
//!   shared library: it is loaded like any vendor plugin). When
//!   `TORCHFL_BUNDLE_SIM` names an already built library (the Makefile
//!   passes `target/release/libtorchfl_sim.so`, which it builds anyway for
//!   `torchfl-abi verify`), that file is bundled; otherwise a nested `cargo
//!   build` makes one in its own target directory. The simulator is the
//!   slowest crate to compile, so CI builds it in release mode once.
//!
//! Without the feature (plain `cargo build`/`clippy`), nothing is built and
//! no Python or torch is needed.
//!
//! The shim's recipe (sources, flags, the precompiled header, the link) is
//! `python/torch_fl/_shim_build.py`, the one the first-use build under
//! another torch runs too; this script runs it with the build's Python. It
//! compiles with `-Wall -Wextra -Werror`; PyTorch's headers are system
//! includes, so only warnings in the shim's own code count. Set
//! `TORCHFL_SHIM_WERROR=0` to keep the warnings but not fail on them, for a
//! compiler newer than CI's that warns about something new.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> String {
    env::var("PYO3_PYTHON")
        .or_else(|_| env::var("PYTHON_SYS_EXECUTABLE"))
        .unwrap_or_else(|_| "python3".to_owned())
}

fn fail(message: String) -> ! {
    // A build script reports errors by panicking; this is the message
    // `pip install` shows.
    panic!("\n\ntorch-fl build: {message}\n\n");
}

fn warnings_are_errors() -> bool {
    !env::var("TORCHFL_SHIM_WERROR").is_ok_and(|v| v.trim() == "0")
}

/// Builds the shim with the package's own recipe (python/torch_fl/_shim_build.py,
/// also used for the first-use build under another torch); returns the
/// library and the torch release it was built against.
fn build_shim(root: &Path, out_dir: &Path) -> (PathBuf, String) {
    let py = python();
    let lib = out_dir.join("libtorchfl_shim.so");
    let mut cmd = Command::new(&py);
    cmd.arg(root.join("python/torch_fl/_shim_build.py"))
        .arg(root.join("cpp_shim"))
        .arg("--out")
        .arg(&lib)
        .arg("--include")
        .arg(torchfl_ffi_include(root))
        // Installed beside torch in site-packages: torch_fl/_lib -> torch/lib;
        // the build's own torch for running from the build tree.
        .args(["--rpath", "$ORIGIN/../../torch/lib", "--rpath-torch"]);
    if !warnings_are_errors() {
        cmd.arg("--no-werror");
    }
    if let Ok(jobs) = env::var("NUM_JOBS") {
        cmd.args(["--jobs", &jobs]);
    }
    let out = cmd.output().unwrap_or_else(|e| fail(format!("cannot run {py}: {e}")));
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("No module named 'torch'") {
            fail(format!(
                "{py} cannot import torch. Install the pinned torch first, then build without isolation:\n  \
                 pip install torch==2.14.1 && pip install --no-build-isolation .\n{stderr}"
            ));
        }
        fail(format!("compiling the C++ shim failed:\n{stderr}"));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The recipe's last line: {"torch_version": "2.14.1"}.
    let version = stdout
        .lines()
        .last()
        .and_then(|line| line.split('"').nth(3))
        .unwrap_or_else(|| fail(format!("the shim build printed no torch version: {stdout}")))
        .to_owned();
    (lib, version)
}

fn torchfl_ffi_include(root: &Path) -> PathBuf {
    root.join("crates/torchfl-ffi/include")
}

fn build_sim(root: &Path) -> PathBuf {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    // A separate target directory: the outer build holds the lock on its own.
    let target_dir = root.join("target/bundle");
    let status = Command::new(cargo)
        .current_dir(root)
        .args(["build", "--release", "-p", "torchfl-sim", "--lib", "--target-dir"])
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .status()
        .unwrap_or_else(|e| fail(format!("cannot run cargo to build the simulated plugin: {e}")));
    if !status.success() {
        fail("building the simulated plugin failed (see the output above)".to_owned());
    }
    target_dir.join("release/libtorchfl_sim.so")
}

/// The simulated plugin to bundle: `TORCHFL_BUNDLE_SIM`, or a fresh build.
fn bundled_sim(root: &Path) -> PathBuf {
    println!("cargo:rerun-if-env-changed=TORCHFL_BUNDLE_SIM");
    let Some(given) = env::var_os("TORCHFL_BUNDLE_SIM").filter(|v| !v.is_empty()) else {
        return build_sim(root);
    };
    let path = PathBuf::from(given);
    if !path.is_file() {
        fail(format!(
            "TORCHFL_BUNDLE_SIM={} is not a file: build it with `cargo build --release -p torchfl-sim`, or unset \
             the variable to let this build make one",
            path.display()
        ));
    }
    println!("cargo:rerun-if-changed={}", path.display());
    path
}

fn copy_into(package_lib: &Path, file: &Path) {
    let dest = package_lib.join(file.file_name().unwrap_or_default());
    // Replace atomically: a running Python may have the old file mapped.
    let tmp = dest.with_extension("so.tmp");
    std::fs::copy(file, &tmp).unwrap_or_else(|e| fail(format!("cannot copy {}: {e}", file.display())));
    std::fs::rename(&tmp, &dest).unwrap_or_else(|e| fail(format!("cannot install {}: {e}", dest.display())));
}

/// Copies the shim's C++ sources and the headers they include into
/// `package_lib/shim_src` (`src/` with its folders, `include/`), so an
/// installed torch-fl can compile its shim for another supported torch at
/// first import (python/torch_fl/_shim.py).
fn copy_shim_sources(root: &Path, package_lib: &Path) {
    let dest = package_lib.join("shim_src");
    let _ = std::fs::remove_dir_all(&dest); // no stale files from an older tree
    copy_tree(&root.join("cpp_shim/src"), &dest.join("src"));
    copy_tree(&root.join("cpp_shim/include"), &dest.join("include"));
    copy_tree(&torchfl_ffi_include(root).join("torch_fl"), &dest.join("include/torch_fl"));
}

/// Copies the `.cpp` and `.h` files under `from` to `to`, folders included.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| fail(format!("cannot create {}: {e}", to.display())));
    let entries =
        std::fs::read_dir(from).unwrap_or_else(|e| fail(format!("cannot read {}: {e}", from.display())));
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let target = to.join(entry.file_name());
        if path.is_dir() {
            copy_tree(&path, &target);
        } else if path.extension().is_some_and(|x| x == "cpp" || x == "h") {
            std::fs::copy(&path, &target)
                .unwrap_or_else(|e| fail(format!("cannot copy {}: {e}", path.display())));
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    println!("cargo:rerun-if-env-changed=TORCHFL_SHIM_WERROR");
    if env::var_os("CARGO_FEATURE_BUNDLE").is_none() {
        return;
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest.join("../..");
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap_or_default());
    for watched in
        ["cpp_shim", "python/torch_fl/_shim_build.py", "crates/torchfl-sim", "crates/torchfl-ffi/include"]
    {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    let (shim, torch_version) = build_shim(&root, &out_dir);
    println!("cargo:rustc-env=TORCHFL_BUILT_TORCH_VERSION={torch_version}");
    let package_lib = root.join("python/torch_fl/_lib");
    std::fs::create_dir_all(&package_lib)
        .unwrap_or_else(|e| fail(format!("cannot create {}: {e}", package_lib.display())));
    copy_into(&package_lib, &shim);
    copy_into(&package_lib, &bundled_sim(&root));
    copy_shim_sources(&root, &package_lib);
}
