//! Two plugins exporting the same kernel names, one loaded RTLD_GLOBAL: the
//! ELF loader may bind the second plugin's op table to the first one's
//! kernels. TFL_EXPORT's protected visibility prevents it, and the loader
//! detects it when a plugin is built without.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly
#![cfg(target_os = "linux")]

use torchfl_core::{load, LoadOptions};
use torchfl_testkit::fixture;

#[test]
fn interposed_kernels_are_detected_and_protected_exports_are_immune() {
    let global = fixture("interpose_global", &["FIXTURE_NAME=\"interpose_global\""]);
    // SAFETY: loading a test fixture whose initialisers are trivial.
    let lib = unsafe {
        libloading::os::unix::Library::open(
            Some(&global),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
        )
    }
    .unwrap();

    let exposed = fixture(
        "interpose_default_visibility",
        &["FIXTURE_NAME=\"exposed\"", "TFL_EXPORT=__attribute__((visibility(\"default\")))"],
    );
    let err = load(&exposed, &LoadOptions::default()).unwrap_err();
    assert_eq!(err.kind(), "KernelSymbol", "{err}");
    assert!(err.to_string().contains("RTLD_GLOBAL"), "{err}");

    let protected = fixture("interpose_protected", &["FIXTURE_NAME=\"protected\""]);
    let plugin = load(&protected, &LoadOptions::default()).unwrap();
    assert_eq!(plugin.name(), "protected");
    std::mem::forget(lib);
}
