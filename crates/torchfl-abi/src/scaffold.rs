//! `torchfl-abi new`: writes a plugin project a vendor starts a port from.
//!
//! The project builds, passes `verify`, installs as a torch-fl plugin package
//! (entry point group `torch_fl.plugins`) and has a CI script running
//! `verify` and `python -m torch_fl compat`. The files are templates in
//! `templates/` (`{{key}}` placeholders), compiled into the tool so that it
//! works from the wheel as well as from a checkout.
//!
//! A Rust project depends on a vendored copy of the `torchfl-ffi` crate
//! (`vendor/torchfl-ffi`), not on a path into a torch-fl checkout or on a
//! crates.io version: the tool may come from the wheel, where no checkout
//! exists, and a registry needs the network. Vendoring is also what a C
//! plugin does with `torch_fl/plugin.h`: the ABI version changes only when
//! the vendor replaces the copy.
//!
//! `examples/c_plugin` is this command's output for the device `minimal_c`
//! (`tests/examples.rs` fails when they differ): the example a vendor reads
//! is then the project they get, and torch-fl's test plugins, built on the
//! example, exercise the template's code.

use std::path::{Path, PathBuf};

use torchfl_ffi::{TFL_ABI_VERSION_MAJOR, TFL_ABI_VERSION_MINOR};

/// Exit code for a refused request (bad name, non-empty directory): usage.
const EXIT_USAGE: u8 = 2;
/// Exit code when a file cannot be written.
const EXIT_IO: u8 = 1;

/// The plugin's language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Lang {
    /// C99 with the header-only helpers (torch_fl/plugin_helpers.h), built
    /// by setuptools' C compiler support.
    C,
    /// A Cargo cdylib crate depending only on torchfl-ffi (vendored).
    Rust,
}

#[derive(Debug, clap::Args)]
pub(crate) struct NewArgs {
    /// The device name (torch.device("<DEVICE>")): a lowercase identifier
    /// ([a-z][a-z_]*) that is not a PyTorch device type.
    device: String,
    /// The plugin's language.
    #[arg(long, value_enum, default_value_t = Lang::C)]
    lang: Lang,
    /// Directory to create (default: ./torchfl-<DEVICE>); it must not exist
    /// or be empty.
    #[arg(long, value_name = "PATH")]
    dir: Option<PathBuf>,
}

/// (path in the project, template). Paths are templates too.
type Files = &'static [(&'static str, &'static str)];

const COMMON: Files = &[
    ("README.md", include_str!("../templates/common/README.md")),
    ("pyproject.toml", include_str!("../templates/common/pyproject.toml")),
];

const C: Files = &[
    ("csrc/{{device}}_plugin.c", include_str!("../templates/c/plugin.c")),
    ("setup.py", include_str!("../templates/c/setup.py")),
    ("ci.sh", include_str!("../templates/c/ci.sh")),
    (".gitignore", include_str!("../templates/c/gitignore")),
    ("src/{{package}}/__init__.py", include_str!("../templates/common/__init__.py")),
    ("include/torch_fl/plugin.h", torchfl_ffi::HEADER),
    ("include/torch_fl/plugin_helpers.h", torchfl_ffi::HELPERS_HEADER),
];

const RUST: Files = &[
    ("Cargo.toml", include_str!("../templates/rust/Cargo.toml")),
    ("src/lib.rs", include_str!("../templates/rust/lib.rs")),
    ("setup.py", include_str!("../templates/rust/setup.py")),
    ("ci.sh", include_str!("../templates/rust/ci.sh")),
    (".gitignore", include_str!("../templates/rust/gitignore")),
    ("python/{{package}}/__init__.py", include_str!("../templates/common/__init__.py")),
    ("vendor/torchfl-ffi/Cargo.toml", include_str!("../templates/rust/ffi-Cargo.toml")),
    ("vendor/torchfl-ffi/rustfmt.toml", include_str!("../templates/rust/ffi-rustfmt.toml")),
];

const C_LAYOUT: &str = "\
```
csrc/{{device}}_plugin.c         the plugin: runtime entries, kernels, op table
include/torch_fl/plugin.h        the ABI (a copy; `torchfl-abi header --include-dir include` refreshes it)
include/torch_fl/plugin_helpers.h  optional helpers: errors, synchronous streams/events, memory counters
src/{{package}}/__init__.py      the entry point's object: the library's path
setup.py, pyproject.toml         the package: setuptools compiles csrc/ into {{package}}/_plugin*.so
ci.sh                            build, torchfl-abi verify, python -m torch_fl compat
```";

const RUST_LAYOUT: &str = "\
```
src/lib.rs                       the plugin: runtime entries, kernels, op table
vendor/torchfl-ffi/              the ABI's Rust mirror (a copy; builds offline)
python/{{package}}/__init__.py   the entry point's object: the library's path
setup.py, pyproject.toml         the package: setup.py runs cargo and ships lib{{library}}.so
ci.sh                            build, torchfl-abi verify, python -m torch_fl compat
```";

/// Everything the templates' placeholders stand for.
fn values(device: &str, lang: Lang) -> Vec<(&'static str, String)> {
    let (lang_name, layout, python_dir, glob, kernels) = match lang {
        Lang::C => (
            "c",
            C_LAYOUT,
            "src",
            "_plugin*.so".to_owned(),
            "add.Tensor, mul.Tensor, neg, relu and fill_.Scalar",
        ),
        Lang::Rust => {
            ("rust", RUST_LAYOUT, "python", format!("libtorchfl_{device}.so"), "add.Tensor and mul.Tensor")
        }
    };
    vec![
        // First: the layout text holds placeholders of its own.
        ("layout", layout.to_owned()),
        ("device", device.to_owned()),
        ("package", format!("torchfl_{device}")),
        ("library", format!("torchfl_{device}")),
        ("dist", format!("torchfl-{}", device.replace('_', "-"))),
        ("lang", lang_name.to_owned()),
        ("kernels", kernels.to_owned()),
        ("python_dir", python_dir.to_owned()),
        ("library_glob", glob),
        ("torchfl_version", env!("CARGO_PKG_VERSION").to_owned()),
        ("rust_version", env!("CARGO_PKG_RUST_VERSION").to_owned()),
        ("abi", format!("{TFL_ABI_VERSION_MAJOR}.{TFL_ABI_VERSION_MINOR}")),
    ]
}

fn render(template: &str, values: &[(&str, String)]) -> String {
    values
        .iter()
        .fold(template.to_owned(), |text, (key, value)| text.replace(&format!("{{{{{key}}}}}"), value))
}

/// The project's files, rendered: (relative path, text, executable).
pub(crate) fn project_files(device: &str, lang: Lang) -> Vec<(PathBuf, String, bool)> {
    let values = values(device, lang);
    let own = match lang {
        Lang::C => C,
        Lang::Rust => RUST,
    };
    let mut files: Vec<(PathBuf, String, bool)> = COMMON
        .iter()
        .chain(own)
        .map(|(path, template)| {
            // The copied headers are not templates: they are written verbatim.
            let text =
                if path.starts_with("include/") { (*template).to_owned() } else { render(template, &values) };
            (PathBuf::from(render(path, &values)), text, path.ends_with(".sh"))
        })
        .collect();
    if lang == Lang::Rust {
        for (path, text) in torchfl_ffi::CRATE_SOURCES {
            files.push((Path::new("vendor/torchfl-ffi").join(path), (*text).to_owned(), false));
        }
    }
    files
}

/// Refuses a path that exists and is not an empty directory.
fn check_target(dir: &Path) -> Result<(), String> {
    match std::fs::read_dir(dir).map(|mut entries| entries.next().is_none()) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "{} is not empty; choose another --dir or remove it first (nothing was written)",
            dir.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) if dir.exists() => {
            Err(format!("{} exists and is not a directory (nothing was written)", dir.display()))
        }
        Err(e) => Err(format!("cannot read {}: {e}", dir.display())),
    }
}

fn write_file(path: &Path, text: &str, executable: bool) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(fail)?;
    }
    std::fs::write(path, text).map_err(fail)?;
    #[cfg(unix)]
    if executable {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(fail)?;
    }
    #[cfg(not(unix))]
    let _ = executable;
    Ok(())
}

/// `header --include-dir DIR`: DIR/torch_fl/plugin.h and plugin_helpers.h.
pub(crate) fn write_headers(dir: &Path) -> Result<(), String> {
    write_file(&dir.join("torch_fl/plugin.h"), torchfl_ffi::HEADER, false)?;
    write_file(&dir.join("torch_fl/plugin_helpers.h"), torchfl_ffi::HELPERS_HEADER, false)
}

/// Runs `torchfl-abi new`; returns the exit code.
pub(crate) fn run(args: &NewArgs) -> u8 {
    if let Err(e) = torchfl_core::device::validate_device_name(&args.device) {
        eprintln!("torchfl-abi new: {e}");
        return EXIT_USAGE;
    }
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("torchfl-{}", args.device.replace('_', "-"))));
    if let Err(e) = check_target(&dir) {
        eprintln!("torchfl-abi new: {e}");
        return EXIT_USAGE;
    }
    for (path, text, executable) in project_files(&args.device, args.lang) {
        if let Err(e) = write_file(&dir.join(path), &text, executable) {
            eprintln!("torchfl-abi new: {e}");
            return EXIT_IO;
        }
    }
    let lang = match args.lang {
        Lang::C => "C",
        Lang::Rust => "Rust",
    };
    // `pip install name` would look for a package on an index: show a path.
    let shown =
        if dir.is_absolute() || dir.starts_with(".") { dir.clone() } else { Path::new(".").join(&dir) };
    let shown = shown.display();
    println!("Wrote a {lang} plugin project for the device '{}' in {shown}.", args.device);
    println!("  cd {shown} && ./ci.sh      build, torchfl-abi verify, python -m torch_fl compat");
    println!("  pip install {shown}        install it as a torch-fl plugin package");
    println!("See {shown}/README.md for the layout and the next steps.");
    0
}
