//! Every call across the plugin boundary and into the dynamic loader.
//!
//! This module is the only place that dereferences pointers a plugin hands
//! back, and the only place that calls a plugin function pointer. Everything
//! above it works with owned Rust values and `Result`.
//!
//! - this file: dynamic loading and the host services a plugin may call;
//! - `table`: the handshake, copies of the plugin's tables, and the calls
//!   through its function table;
//! - `probe`: which memory is mapped readable or executable;
//! - `collectives`, `graphs`, `activity`: the extension tables a plugin fills.
//!
//! Trust model: a plugin is native code running in our process, so it can do
//! anything. What the host can defend against is a plugin that is *wrong*:
//! every struct, array and string it hands back is copied only after the
//! range was found mapped readable and within the header's limits, and every
//! function pointer is called only once it points into executable memory.
//! A plugin that crashes in its own code is reported by `torchfl-abi
//! verify`, which runs it in a child process.

use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};
use std::ptr;

use torchfl_ffi::*;

mod activity;
mod collectives;
pub(crate) mod crash;
mod graphs;
pub(crate) mod probe;
mod table;

pub(crate) use activity::*;
pub(crate) use collectives::*;
pub(crate) use graphs::*;
pub(crate) use table::*;

// ---------------------------------------------------------------------------
// Dynamic loading
// ---------------------------------------------------------------------------

/// Opens a shared library, binding all symbols now so that a plugin with
/// unresolved dependencies fails here, with the loader's message, rather
/// than at its first kernel call.
pub(crate) fn open_library(path: &Path) -> Result<libloading::Library, String> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: loading runs the library's initialisers. That is the point
        // of loading a plugin; the user chose the file (explicitly or through
        // TORCH_FL_PLUGIN_PATH), and the caller checked that it is a shared
        // library for this architecture.
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map(Into::into).map_err(|e| e.to_string())
    }
    #[cfg(not(unix))]
    {
        // SAFETY: as above: running the initialisers of a user-chosen plugin.
        unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())
    }
}

/// Returns a handle to a library that is already loaded in the process
/// without loading anything (RTLD_NOLOAD); `None` for the main program's
/// own path when it cannot be reopened.
#[cfg(unix)]
pub(crate) fn reopen_loaded(path: Option<&Path>) -> Option<libloading::Library> {
    use libloading::os::unix::{Library, RTLD_LAZY};
    match path {
        // SAFETY: RTLD_NOLOAD only returns a handle to an object that is
        // already loaded, so no initialiser runs.
        Some(p) => unsafe { Library::open(Some(p), RTLD_LAZY | libc::RTLD_NOLOAD) }.ok().map(Into::into),
        None => Some(Library::this().into()),
    }
}

/// The paths of every shared object loaded in this process, in load order
/// (`dl_iterate_phdr`). The main program is reported as `None`.
#[cfg(target_os = "linux")]
pub(crate) fn loaded_objects() -> Vec<Option<PathBuf>> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `&mut Vec` passed below, alive for the whole
        // dl_iterate_phdr call, and the loader calls us on one thread.
        let out = unsafe { &mut *data.cast::<Vec<Option<PathBuf>>>() };
        // SAFETY: the loader passes a valid dl_phdr_info for the duration of
        // the callback; dlpi_name is NULL or a NUL-terminated string.
        let name = unsafe { (*info).dlpi_name };
        if name.is_null() {
            out.push(None);
        } else {
            // SAFETY: non-NULL dlpi_name is NUL-terminated (see above).
            let s = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
            out.push(if s.is_empty() { None } else { Some(PathBuf::from(s)) });
        }
        0
    }
    let mut out: Vec<Option<PathBuf>> = Vec::new();
    // SAFETY: `visit` matches the callback signature and only touches `out`
    // through the pointer we pass, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), ptr::from_mut(&mut out).cast()) };
    out
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn loaded_objects() -> Vec<Option<PathBuf>> {
    vec![None]
}

/// The address the library exports the bootstrap symbol at, `None` when it
/// does not export it. Not yet callable: see [`bootstrap_function`].
pub(crate) fn bootstrap_address(lib: &libloading::Library) -> Option<usize> {
    symbol_address(lib, TFL_BOOTSTRAP_SYMBOL)
}

/// The bootstrap symbol as the function the ABI says it is, once `address`
/// was found in executable memory (a variable of that name would crash the
/// host when called).
pub(crate) fn bootstrap_function(
    map: &probe::MemoryMap,
    address: usize,
) -> Result<TFL_GetPluginApiFn, String> {
    map.executable(address).map_err(|at| {
        format!(
            "the exported symbol {TFL_BOOTSTRAP_SYMBOL} is not a function: it lies at {at}. Export the bootstrap \
             function itself (TFL_EXPORT const TFL_PluginApi* {TFL_BOOTSTRAP_SYMBOL}(const TFL_HostApi*)), not a \
             variable or table of that name"
        )
    })?;
    // SAFETY: `address` is a non-NULL symbol address in executable memory;
    // the ABI fixes the bootstrap symbol's type as TFL_GetPluginApiFn for
    // every version.
    Ok(unsafe { std::mem::transmute::<usize, TFL_GetPluginApiFn>(address) })
}

/// The function `name` exported by `lib`, as a kernel: `Ok(None)` when it
/// is not exported, `Err` (where it points) when it is not code.
pub(crate) fn kernel_by_symbol(
    lib: &libloading::Library,
    name: &str,
) -> Result<Option<TFL_KernelFn>, String> {
    let Some(address) = symbol_address(lib, name) else { return Ok(None) };
    probe::MemoryMap::snapshot().executable(address)?;
    // SAFETY: a non-NULL address in executable memory, exported under a
    // name the caller uses as a kernel: the ABI's contract for kernel
    // symbols gives it the kernel signature.
    Ok(Some(unsafe { std::mem::transmute::<usize, TFL_KernelFn>(address) }))
}

/// The address of an exported symbol, or `None` when it is not exported.
pub(crate) fn symbol_address(lib: &libloading::Library, name: &str) -> Option<usize> {
    // SAFETY: we only read the symbol's address and never call or
    // dereference it through this type.
    unsafe { lib.get::<*const c_void>(name.as_bytes()) }.ok().map(|s| *s as usize).filter(|&a| a != 0)
}

// ---------------------------------------------------------------------------
// Host services
// ---------------------------------------------------------------------------

/// What a plugin's log calls are attributed to.
#[derive(Debug)]
struct HostContext {
    label: String,
}

unsafe extern "C" fn host_log(context: *mut c_void, level: i32, message: *const c_char) {
    if message.is_null() {
        return;
    }
    // SAFETY: `context` is the leaked HostContext created in `host_api`, so
    // it is valid for the process' lifetime; NULL is tolerated.
    let label = unsafe { context.cast::<HostContext>().as_ref() }.map_or("?", |c| c.label.as_str());
    // Read page by page, within TFL_MAX_STRING_LENGTH: a plugin logging a
    // bad pointer gets a note in the message, not a crash.
    let text = probe::message_string(message);
    crate::log::plugin_message(label, level, &text);
}

/// Builds the host-services table handed to one plugin. It must outlive the
/// plugin, which may keep the pointer, and plugins are never unloaded, so it
/// is leaked: one small allocation per loaded library.
pub(crate) fn host_api(label: &str, version: (u32, u32)) -> &'static TFL_HostApi {
    let context: &'static mut HostContext = Box::leak(Box::new(HostContext { label: label.to_owned() }));
    Box::leak(Box::new(TFL_HostApi {
        struct_size: struct_size!(TFL_HostApi, log),
        abi_major: version.0,
        abi_minor: version.1,
        context: ptr::from_mut(context).cast(),
        log: Some(host_log),
    }))
}
