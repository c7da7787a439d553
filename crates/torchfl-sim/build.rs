//! Binds the plugin's own kernel references locally.
//!
//! The op table holds pointers to the exported kernels. With plain default
//! ELF visibility those references go through the GOT, so a second plugin
//! exporting the same kernel names and loaded with `RTLD_GLOBAL` would
//! interpose its kernels into this plugin's table (the host detects that and
//! refuses the plugin). The ABI header asks for protected visibility or, for
//! toolchains that export symbols another way, `-Bsymbolic-functions`; Rust
//! has no stable protected visibility, so the cdylib is linked with it.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let family = std::env::var("CARGO_CFG_TARGET_FAMILY").unwrap_or_default();
    let elf = family == "unix" && !matches!(os.as_str(), "macos" | "ios" | "tvos" | "watchos");
    if elf {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    }
}
