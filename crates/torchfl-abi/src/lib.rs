//! `torchfl-abi`: the vendor's tool to inspect and verify a torch-fl plugin,
//! with no PyTorch involved.
//!
//! A library so that the Python wheel can install the same command
//! (`torch_fl` calls [`run`]); `src/main.rs` is the standalone binary.
//!
//! Exit codes: 0 success, 1 a check failed (including a crash or a timeout
//! of the plugin during a check), 2 bad usage, 3 the plugin could not be
//! loaded at all. `new` (`scaffold.rs`): 0 written, 2 refused (device name,
//! non-empty directory), 1 a file could not be written.
//!
//! `verify` runs the checks in a child process (see `isolate.rs` for the
//! design and how the executable is found when called from Python).

mod inspect;
mod isolate;
mod protocol;
mod report;
mod scaffold;
mod verify;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use torchfl_core::{Discovery, LoadOptions};

/// Exit code when the plugin cannot be loaded (clap uses 2 for usage).
pub(crate) const EXIT_LOAD_FAILURE: u8 = 3;
/// Exit code when a check fails.
pub(crate) const EXIT_CHECK_FAILURE: u8 = 1;

#[derive(Debug, Parser)]
#[command(name = "torchfl-abi", version, about = "Inspect and verify torch-fl accelerator plugins")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Args)]
struct Target {
    /// Plugin file, or a plugin name to find through TORCH_FL_PLUGIN_PATH.
    plugin: String,
    /// Options passed to the plugin's initialize ("key=value;key=value").
    #[arg(long, default_value = "")]
    options: String,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct InspectArgs {
    #[command(flatten)]
    target: Target,
    /// Seconds loading and initializing the plugin may take before inspect
    /// gives up, naming the call the plugin is stuck in.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    timeout: u64,
}

#[derive(Debug, clap::Args)]
struct VerifyArgs {
    #[command(flatten)]
    target: Target,
    /// Seconds any one check may take before it is reported as hung and the
    /// checking process is killed.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    timeout: u64,
    /// Run the checks in this process: no crash isolation, no timeout.
    #[arg(long)]
    in_process: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show a plugin's identity, ABI version, capabilities, devices and ops.
    Inspect(InspectArgs),
    /// Run the ABI conformance checks in a child process; exits 0 when all
    /// pass, 1 when one fails, crashes or hangs, 3 when the plugin cannot be
    /// loaded.
    Verify(VerifyArgs),
    /// Internal: runs the checks and streams their results to `verify`.
    #[command(name = "__verify-child", hide = true)]
    VerifyChild(Target),
    /// Print the kernel symbol a plugin must export for an operator.
    Symbol {
        /// Operator name, e.g. add.Tensor or add_.Tensor.
        op: String,
    },
    /// Write the plugin ABI header (torch_fl/plugin.h) to stdout or a file.
    Header {
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// The optional header-only helpers (torch_fl/plugin_helpers.h)
        /// instead of the ABI header.
        #[arg(long)]
        helpers: bool,
        /// Write both headers as DIR/torch_fl/plugin.h and
        /// DIR/torch_fl/plugin_helpers.h (the helpers include plugin.h from
        /// their own directory); compile with -I DIR.
        #[arg(long, value_name = "DIR", conflicts_with_all = ["output", "helpers"])]
        include_dir: Option<PathBuf>,
    },
    /// Write a new plugin project for DEVICE: a plugin that passes `verify`,
    /// packaged as a torch-fl plugin package, with a CI script.
    New(scaffold::NewArgs),
}

/// Resolves a plugin argument: an existing path, else a name to discover.
fn resolve(target: &Target) -> Result<PathBuf, torchfl_core::Error> {
    let path = PathBuf::from(&target.plugin);
    if path.exists() || target.plugin.contains('/') {
        return Ok(path);
    }
    let discovery = Discovery::from_env();
    for file in discovery.plugin_path_files() {
        if let Ok(lib) = torchfl_core::PluginLibrary::open(&file, &LoadOptions::default()) {
            if lib.info().name == target.plugin {
                return Ok(file);
            }
        }
    }
    Err(torchfl_core::Error::PluginNotFound {
        name: target.plugin.clone(),
        searched: discovery.plugin_path_files().iter().map(|p| p.display().to_string()).collect(),
    })
}

/// Runs the tool with `args` (including the program name) and returns its
/// exit code (0 success, 1 a check failed, 2 usage, 3 could not load). Usage errors and `--help` print and return as clap decides.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return u8::try_from(e.exit_code()).unwrap_or(2);
        }
    };
    let (target, timeout, verify) = match cli.command {
        Command::Inspect(args) => (args.target, args.timeout, None),
        Command::Verify(args) => (args.target, args.timeout, Some(args.in_process)),
        Command::VerifyChild(target) => {
            return isolate::run_child(std::path::Path::new(&target.plugin), &target.options)
        }
        Command::Symbol { op } => return symbol(&op),
        Command::Header { output, helpers, include_dir } => return header(output, helpers, include_dir),
        Command::New(args) => return scaffold::run(&args),
    };
    let path = match resolve(&target) {
        Ok(path) => path,
        Err(e) => {
            report::load_failure(&e, target.json);
            return EXIT_LOAD_FAILURE;
        }
    };
    match verify {
        None => inspect::run(&path, &target.options, target.json, timeout),
        Some(in_process) => match isolate::child_executable().filter(|_| !in_process) {
            Some(exe) => isolate::run_supervised(&exe, &path, &target.options, target.json, timeout),
            None => verify::run_in_process(&path, &target.options, target.json, timeout),
        },
    }
}

fn symbol(op: &str) -> u8 {
    match torchfl_ffi::kernel_symbol(op) {
        Ok(symbol) => {
            println!("{symbol}");
            0
        }
        Err(e) => {
            eprintln!("torchfl-abi: {op:?} is not an operator name: {e}");
            2
        }
    }
}

fn header(output: Option<PathBuf>, helpers: bool, include_dir: Option<PathBuf>) -> u8 {
    let written = match (include_dir, output) {
        (Some(dir), _) => scaffold::write_headers(&dir),
        (None, None) => {
            print!("{}", if helpers { torchfl_ffi::HELPERS_HEADER } else { torchfl_ffi::HEADER });
            return 0;
        }
        (None, Some(path)) => {
            let text = if helpers { torchfl_ffi::HELPERS_HEADER } else { torchfl_ffi::HEADER };
            std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
        }
    };
    match written {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("torchfl-abi: {e}");
            1
        }
    }
}
