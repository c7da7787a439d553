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
//! The shim compiles with `-Wall -Wextra -Werror`; PyTorch's headers are
//! system includes, so only warnings in the shim's own code count. Set
//! `TORCHFL_SHIM_WERROR=0` to keep the warnings but not fail on them, for a
//! compiler newer than CI's that warns about something new.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the build needs to know about the installed torch.
struct Torch {
    version: String,
    include_dirs: Vec<PathBuf>,
    lib_dir: PathBuf,
    cxx11_abi: bool,
}

const TORCH_QUERY: &str = "\
import json, os, sysconfig, torch
from torch.utils import cpp_extension
print(json.dumps({
    'version': torch.__version__.split('+')[0],
    'include_dirs': cpp_extension.include_paths() + [sysconfig.get_paths()['include']],
    'lib_dir': os.path.join(os.path.dirname(torch.__file__), 'lib'),
    'cxx11_abi': bool(torch._C._GLIBCXX_USE_CXX11_ABI),
}))";

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

fn json_field<'a>(json: &'a str, key: &str) -> &'a str {
    // The query prints one flat JSON object whose values are strings,
    // booleans or string lists; a tiny reader avoids a build dependency.
    let start = json
        .find(&format!("\"{key}\": "))
        .map(|i| i + key.len() + 4)
        .unwrap_or_else(|| fail(format!("no {key} in {json}")));
    let rest = &json[start..];
    let end = if rest.starts_with('[') {
        rest.find(']').map_or(rest.len(), |i| i + 1)
    } else {
        rest.find([',', '}']).unwrap_or(rest.len())
    };
    &rest[..end]
}

fn query_torch() -> Torch {
    let py = python();
    let out = Command::new(&py)
        .args(["-c", TORCH_QUERY])
        .output()
        .unwrap_or_else(|e| fail(format!("cannot run {py}: {e}")));
    if !out.status.success() {
        fail(format!(
            "{py} cannot import torch. Install the pinned torch first, then build without isolation:\n  \
             pip install torch==2.14.1 && pip install --no-build-isolation .\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let json = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let unquote = |s: &str| s.trim().trim_matches('"').to_owned();
    let include_dirs = json_field(&json, "include_dirs")
        .trim_matches(['[', ']'])
        .split(',')
        .map(unquote)
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect();
    Torch {
        version: unquote(json_field(&json, "version")),
        include_dirs,
        lib_dir: PathBuf::from(unquote(json_field(&json, "lib_dir"))),
        cxx11_abi: json_field(&json, "cxx11_abi").trim() == "true",
    }
}

fn warnings_are_errors() -> bool {
    !env::var("TORCHFL_SHIM_WERROR").is_ok_and(|v| v.trim() == "0")
}

fn build_shim(root: &Path, torch: &Torch, out_dir: &Path) -> PathBuf {
    let shim_dir = root.join("cpp_shim");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(shim_dir.join("src"))
        .unwrap_or_else(|e| fail(format!("cannot read cpp_shim/src: {e}")))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cpp"))
        .collect();
    sources.sort();
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .opt_level(2)
        .pic(true)
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(warnings_are_errors())
        // Only the tfl_shim_* interface is exported (see cpp_shim/README.md).
        .flag("-fvisibility=hidden")
        .flag("-fvisibility-inlines-hidden")
        .define("_GLIBCXX_USE_CXX11_ABI", if torch.cxx11_abi { "1" } else { "0" })
        .define("TORCHFL_TORCH_VERSION", Some(format!("\"{}\"", torch.version).as_str()))
        .include(shim_dir.join("include"))
        .include(torchfl_ffi_include(root))
        .files(&sources);
    for dir in &torch.include_dirs {
        // System includes: warnings inside PyTorch's headers (GCC's
        // -Winterference-size, unused parameters) are not the shim's to fix.
        build.flag("-isystem").flag(dir);
    }
    let objects = build.compile_intermediates();
    let lib = out_dir.join("libtorchfl_shim.so");
    let cxx = build.get_compiler();
    let status = Command::new(cxx.path())
        .arg("-shared")
        .arg("-o")
        .arg(&lib)
        .args(&objects)
        .arg(format!("-L{}", torch.lib_dir.display()))
        // torch_python: torch::utils' device_lazy_init fork handler (fork.cpp).
        .args(["-ltorch", "-ltorch_cpu", "-lc10", "-ltorch_python"])
        // Installed beside torch in site-packages: torch_fl/_lib -> torch/lib.
        .arg("-Wl,-rpath,$ORIGIN/../../torch/lib")
        .arg(format!("-Wl,-rpath,{}", torch.lib_dir.display()))
        .status()
        .unwrap_or_else(|e| fail(format!("cannot run the C++ linker: {e}")));
    if !status.success() {
        fail("linking the C++ shim failed (see the output above)".to_owned());
    }
    lib
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
/// `package_lib/shim_src` (`src/`, `include/`), so an installed torch-fl can
/// compile its shim for another supported torch at first import
/// (python/torch_fl/_shim.py).
fn copy_shim_sources(root: &Path, package_lib: &Path) {
    let dest = package_lib.join("shim_src");
    let _ = std::fs::remove_dir_all(&dest); // no stale files from an older tree
    let copy_dir = |from: &Path, to: &Path| {
        std::fs::create_dir_all(to).unwrap_or_else(|e| fail(format!("cannot create {}: {e}", to.display())));
        let entries =
            std::fs::read_dir(from).unwrap_or_else(|e| fail(format!("cannot read {}: {e}", from.display())));
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.is_file() && path.extension().is_some_and(|x| x == "cpp" || x == "h") {
                let target = to.join(entry.file_name());
                std::fs::copy(&path, &target)
                    .unwrap_or_else(|e| fail(format!("cannot copy {}: {e}", path.display())));
            }
        }
    };
    copy_dir(&root.join("cpp_shim/src"), &dest.join("src"));
    copy_dir(&root.join("cpp_shim/include"), &dest.join("include"));
    copy_dir(&torchfl_ffi_include(root).join("torch_fl"), &dest.join("include/torch_fl"));
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
    for watched in ["cpp_shim", "crates/torchfl-sim", "crates/torchfl-ffi/include"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    let torch = query_torch();
    println!("cargo:rustc-env=TORCHFL_BUILT_TORCH_VERSION={}", torch.version);
    let package_lib = root.join("python/torch_fl/_lib");
    std::fs::create_dir_all(&package_lib)
        .unwrap_or_else(|e| fail(format!("cannot create {}: {e}", package_lib.display())));
    copy_into(&package_lib, &build_shim(&root, &torch, &out_dir));
    copy_into(&package_lib, &bundled_sim(&root));
    copy_shim_sources(&root, &package_lib);
}
