//! The examples are `torchfl-abi new`'s output, byte for byte: the templates
//! are their only source, so a template change that is not carried to the
//! examples, or an edit made to an example instead of the templates, fails
//! here instead of leaving two copies of the plugin to drift apart.
//!
//! Regenerate the examples after a template change with
//! `TORCHFL_BLESS=1 cargo test -p torchfl-abi --test examples`: it replaces
//! each example directory with a fresh rendering.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const ABI: &str = env!("CARGO_BIN_EXE_torchfl-abi");

/// Set to 1, the test rewrites the examples instead of failing.
const BLESS: &str = "TORCHFL_BLESS";

/// (directory under examples/, the `torchfl-abi` arguments that render it).
/// The device keeps the name the test suites and the documentation use.
const EXAMPLES: &[(&str, &[&str])] = &[("c_plugin", &["new", "minimal_c", "--lang", "c"])];

/// Relative path -> (contents, executable).
type Tree = BTreeMap<String, (Vec<u8>, bool)>;

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn render(args: &[&str], dir: &Path) {
    let out = Command::new(ABI).args(args).arg("--dir").arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "torchfl-abi {} --dir {}: {}",
        args.join(" "),
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The directory patterns of the project's own .gitignore: an example that
/// was built (`ci.sh`) or pip-installed in place holds their output, which
/// is not part of the example. Patterns are `name/` or `*suffix/`, the forms
/// the templates use, and match any component of a path.
fn ignored_names(gitignore: &str) -> Vec<String> {
    gitignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_end_matches('/').to_owned())
        .collect()
}

fn is_ignored(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| p.strip_prefix('*').map_or(name == p, |suffix| name.ends_with(suffix)))
}

fn read_tree(root: &Path, ignored: &[String]) -> Tree {
    fn walk(root: &Path, dir: &Path, ignored: &[String], out: &mut Tree) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            if is_ignored(ignored, &entry.file_name().to_string_lossy()) {
                continue;
            }
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, ignored, out);
            } else {
                let relative = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(relative, (std::fs::read(&path).unwrap(), executable(&path)));
            }
        }
    }
    let mut out = Tree::new();
    if root.exists() {
        walk(root, root, ignored, &mut out);
    }
    out
}

#[cfg(unix)]
fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
fn executable(_: &Path) -> bool {
    false
}

/// Where two texts first differ, for a failure that shows what to look at.
fn first_difference(rendered: &[u8], example: &[u8]) -> String {
    let (rendered, example) = (String::from_utf8_lossy(rendered), String::from_utf8_lossy(example));
    let (mut r, mut e) = (rendered.lines(), example.lines());
    for line in 1.. {
        match (r.next(), e.next()) {
            (None, None) => break,
            (a, b) if a != b => {
                let shown = |l: Option<&str>| {
                    l.map_or_else(|| "the end of the file".to_owned(), |l| format!("{l:?}"))
                };
                return format!("line {line}: rendered {}, example {}", shown(a), shown(b));
            }
            _ => {}
        }
    }
    "line endings or the final newline".to_owned()
}

fn differences(rendered: &Tree, example: &Tree) -> Vec<String> {
    let mut out = Vec::new();
    for (path, (text, exec)) in rendered {
        match example.get(path) {
            None => out.push(format!("missing from the example: {path}")),
            Some((t, _)) if t != text => out.push(format!("differs: {path}: {}", first_difference(text, t))),
            Some((_, e)) if e != exec => {
                out.push(format!("differs: {path}: executable {e}, rendered {exec}"))
            }
            Some(_) => {}
        }
    }
    out.extend(example.keys().filter(|p| !rendered.contains_key(*p)).map(|p| format!("not rendered: {p}")));
    out
}

#[test]
fn the_examples_are_what_torchfl_abi_new_renders() {
    let bless = std::env::var_os(BLESS).is_some_and(|v| v == "1");
    let tmp = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (name, args) in EXAMPLES {
        let fresh = tmp.path().join(name);
        render(args, &fresh);
        let ignored = ignored_names(&std::fs::read_to_string(fresh.join(".gitignore")).unwrap_or_default());
        let example = examples_dir().join(name);
        let diff = differences(&read_tree(&fresh, &ignored), &read_tree(&example, &ignored));
        if diff.is_empty() {
            continue;
        }
        let command = format!("torchfl-abi {} --dir examples/{name}", args.join(" "));
        if bless {
            // Wholesale, build outputs included: whatever the example held
            // beyond the rendering is what the comparison found wrong.
            if example.exists() {
                std::fs::remove_dir_all(&example).unwrap();
            }
            render(args, &example);
            eprintln!("{BLESS}=1: rewrote examples/{name} ({command})");
        } else {
            failures
                .push(format!("examples/{name} is not the output of `{command}`:\n  {}", diff.join("\n  ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n\nThe examples are rendered from crates/torchfl-abi/templates: make the change there, then \
         regenerate them with\n    {BLESS}=1 cargo test -p torchfl-abi --test examples\n(it replaces each \
         example directory with a fresh `torchfl-abi new` rendering; review the result with git diff).",
        failures.join("\n\n")
    );
}
