//! Builds the plugins the test suites load: the simulated plugin, the OpenCL
//! plugin, the plain C example, and the fault-injection fixtures of
//! `tests/plugins/`.
//!
//! C plugins are compiled with the system C compiler (`$CC`, else `cc`)
//! and the flags of `tests/plugins/cflags.txt`, the ones pytest's builds use
//! too, into `target/test-plugins/`, once per variant and rebuilt when a
//! source changes. Test-only code: failures panic with the compiler's output.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The repository root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

/// Cargo's target directory.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// The profile directory the running test binary was built into
/// (`target/debug` or `target/release`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test binary>
    exe.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_else(|| target_dir().join("debug"))
}

fn dylib_name(stem: &str) -> String {
    format!("{}{stem}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

/// The shared library of plugin crate `package` (library `stem`), built (or
/// brought up to date) with the same profile as the running tests: a
/// workspace `cargo test` links the crates' rlibs into the tests but leaves
/// their cdylibs unbuilt.
fn cargo_plugin(package: &str, stem: &str) -> PathBuf {
    let dir = profile_dir();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", package]).current_dir(workspace_root());
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().unwrap_or_else(|e| panic!("run cargo to build {package}: {e}"));
    assert!(status.success(), "building {package} failed");
    let path = dir.join(dylib_name(stem));
    assert!(path.exists(), "{} missing after building {package}", path.display());
    path
}

/// The simulated plugin's shared library (see [`cargo_plugin`]).
pub fn sim_plugin() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| cargo_plugin("torchfl-sim", "torchfl_sim")).clone()
}

/// The OpenCL plugin's shared library (`crates/torchfl-opencl`).
pub fn opencl_plugin() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| cargo_plugin("torchfl-opencl", "torchfl_opencl")).clone()
}

fn newest_mtime(paths: &[PathBuf]) -> std::time::SystemTime {
    paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max()
        .unwrap_or(std::time::SystemTime::UNIX_EPOCH)
}

/// The C example: `torchfl-abi new`'s rendering (examples/c_plugin).
const C_EXAMPLE: &str = "examples/c_plugin/csrc/minimal_c_plugin.c";
/// What every test plugin includes to build on the example.
const TEST_PLUGIN_BASE: &str = "tests/plugins/base.h";
/// The compiler flags every test plugin is built with, pytest's included.
const CFLAGS: &str = "tests/plugins/cflags.txt";

/// The flags of `tests/plugins/cflags.txt`, relative to the repository root.
fn cflags(root: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root.join(CFLAGS)).unwrap_or_else(|e| panic!("{CFLAGS}: {e}"));
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .flat_map(str::split_whitespace)
        .map(str::to_owned)
        .collect()
}

/// Compiles `source` (relative to the repository root) into a shared
/// library named after `variant`, with `defines` passed as `-D` flags.
pub fn build_c_plugin(source: &str, variant: &str, defines: &[&str]) -> PathBuf {
    build_c_plugin_at(&workspace_root().join(source), variant, defines)
}

/// [`build_c_plugin`] for a source anywhere.
pub fn build_c_plugin_at(source: &Path, variant: &str, defines: &[&str]) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let root = workspace_root();
    let out_dir = target_dir().join("test-plugins");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join(dylib_name(&format!("fixture_{variant}")));
    let inputs = [
        source.to_path_buf(),
        root.join(C_EXAMPLE),
        root.join(TEST_PLUGIN_BASE),
        root.join(CFLAGS),
        torchfl_ffi::include_dir().join("torch_fl/plugin.h"),
        torchfl_ffi::include_dir().join("torch_fl/plugin_helpers.h"),
    ];
    // Flags are part of the identity: a flag file records them.
    let flags_file = out.with_extension("flags");
    let cflags = cflags(&root);
    let flags =
        cflags.iter().map(String::as_str).chain(defines.iter().copied()).collect::<Vec<_>>().join(" ");
    let up_to_date = out.exists()
        && std::fs::read_to_string(&flags_file).is_ok_and(|f| f == flags)
        && std::fs::metadata(&out).and_then(|m| m.modified()).is_ok_and(|t| t >= newest_mtime(&inputs));
    if up_to_date {
        return out;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    // Build under a temporary name, then rename: another test process may be
    // loading the previous file.
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let mut cmd = Command::new(&cc);
    cmd.current_dir(&root).args(&cflags);
    for d in defines {
        cmd.arg(format!("-D{d}"));
    }
    cmd.arg(source).arg("-o").arg(&tmp);
    let output = cmd.output().unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(
        output.status.success(),
        "compiling {} ({variant}) failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::rename(&tmp, &out).unwrap();
    std::fs::write(&flags_file, flags).unwrap();
    out
}

/// The plain-C example plugin of `examples/c_plugin/`.
pub fn c_example_plugin() -> PathBuf {
    build_c_plugin(C_EXAMPLE, "c_example", &[])
}

/// A fault-injection variant of `tests/plugins/fixture_plugin.c`.
pub fn fixture(variant: &str, defines: &[&str]) -> PathBuf {
    build_c_plugin("tests/plugins/fixture_plugin.c", variant, defines)
}

/// A C plugin on the C example (tests/plugins/base.h) with `n` operators named
/// `bench_op_<i>.Tensor`, for measuring registration cost at realistic
/// table sizes.
pub fn many_ops_plugin(n: usize) -> PathBuf {
    let dir = target_dir().join("test-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join(format!("many_ops_{n}.c"));
    let mut c = String::from(
        "#include \"base.h\"\n\
         #define BENCH_KERNEL(i) TFL_EXPORT TFL_Error* torch_fl_op_bench_op_##i##_Tensor(const TFL_CallFrame* f) \
         { return torch_fl_op_neg(f); }\n",
    );
    for i in 0..n {
        c.push_str(&format!("BENCH_KERNEL({i})\n"));
    }
    c.push_str("static const TFL_OpEntry g_many_ops[] = {\n");
    for i in 0..n {
        c.push_str(&format!("  TFLH_OP(\"bench_op_{i}.Tensor\", torch_fl_op_bench_op_{i}_Tensor),\n"));
    }
    c.push_str(
        "};\n\
         static TFL_Error* many_get_op_table(TFL_OpTable* out) {\n\
           out->entries = g_many_ops; out->num_entries = sizeof g_many_ops / sizeof g_many_ops[0];\n\
           out->entry_size = sizeof(TFL_OpEntry); return NULL;\n}\n\
         static TFL_PluginApi g_many_api;\n\
         TFL_EXPORT const TFL_PluginApi* torch_fl_plugin_get_api(const TFL_HostApi* host) {\n\
           g_host = host; g_many_api = g_api; g_many_api.get_op_table = many_get_op_table; return &g_many_api;\n}\n",
    );
    if std::fs::read_to_string(&source).ok().as_deref() != Some(c.as_str()) {
        std::fs::write(&source, c).unwrap();
    }
    build_c_plugin_at(&source, &format!("many_ops_{n}"), &[])
}
