//! Discovery by device name: TORCH_FL_PLUGIN_PATH entries, libraries already
//! loaded into the process, and embedder-provided candidates.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use torchfl_core::{load_preloaded, Discovery, LoadOptions, Origin};
use torchfl_testkit::fixture;

fn named_fixture(name: &str) -> std::path::PathBuf {
    let define = format!("FIXTURE_NAME=\"{name}\"");
    fixture(&format!("disc_{name}"), &[define.as_str()])
}

#[test]
fn plugin_path_files_and_directories_are_searched_by_identity() {
    let wanted = named_fixture("disc_wanted");
    let other = named_fixture("disc_other");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&wanted, dir.path().join("libvendor.so")).unwrap();
    std::fs::write(dir.path().join("libbroken.so"), b"garbage").unwrap();

    // A file entry that is another plugin, then a directory holding the one.
    let value = format!("{}:{}", other.display(), dir.path().display());
    let (plugin, origin) =
        Discovery::with_plugin_path(&value).find("disc_wanted", &LoadOptions::default()).unwrap();
    assert_eq!(plugin.name(), "disc_wanted");
    assert_eq!(origin, Origin::PluginPath(dir.path().join("libvendor.so")));

    let err = Discovery::with_plugin_path(&value).find("absent", &LoadOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("plugin 'disc_other'"), "{msg}");
    assert!(msg.contains("libbroken.so (not loadable: NotASharedLibrary)"), "{msg}");
}

#[test]
fn a_library_loaded_by_someone_else_is_found_by_name() {
    let path = named_fixture("disc_preloaded");
    assert!(load_preloaded("disc_preloaded", &LoadOptions::default()).unwrap().is_none());
    // What ctypes.CDLL(path, mode=RTLD_GLOBAL) does.
    // SAFETY: loading a test fixture whose initialisers are trivial.
    let lib = unsafe {
        libloading::os::unix::Library::open(
            Some(&path),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
        )
    }
    .unwrap();
    let plugin = load_preloaded("disc_preloaded", &LoadOptions::default()).unwrap().expect("found preloaded");
    assert_eq!(plugin.name(), "disc_preloaded");
    assert_eq!(plugin.path(), Some(path.as_path()));
    let (again, origin) =
        Discovery::with_plugin_path("").find("disc_preloaded", &LoadOptions::default()).unwrap();
    assert!(std::sync::Arc::ptr_eq(&plugin, &again));
    assert_eq!(origin, Origin::Preloaded);
    std::mem::forget(lib); // plugins are never unloaded
}

#[test]
fn embedder_candidates_come_last() {
    let mut d = Discovery::with_plugin_path("");
    d.add_candidate("disc_bundled", named_fixture("disc_bundled"), "the bundled test plugin");
    let (plugin, origin) = d.find("disc_bundled", &LoadOptions::default()).unwrap();
    assert_eq!(plugin.name(), "disc_bundled");
    assert_eq!(origin, Origin::Extra("the bundled test plugin".into()));
}
