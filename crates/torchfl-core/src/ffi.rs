//! Every call across the plugin boundary and into the dynamic loader.
//!
//! This module is the only place that dereferences pointers a plugin hands
//! back, and the only place that calls a plugin function pointer. Everything
//! above it works with owned Rust values and `Result`.
//!
//! Trust model: a plugin is native code running in our process, so it can do
//! anything; the obligations we can discharge are the ones the ABI states
//! (struct sizes, NULL entries, ownership of errors and strings). A plugin
//! that lies about them is reported by `torchfl-abi verify`, which runs it in
//! a child process.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr;

use torchfl_ffi::*;

use crate::error::{PluginStatus, StatusCode};

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

/// Looks up the bootstrap symbol.
pub(crate) fn bootstrap_symbol(lib: &libloading::Library) -> Option<TFL_GetPluginApiFn> {
    // SAFETY: the ABI fixes this symbol's type as TFL_GetPluginApiFn for
    // every version; a library exporting the name with another type breaks
    // the ABI, which verify reports.
    unsafe { lib.get::<TFL_GetPluginApiFn>(TFL_BOOTSTRAP_SYMBOL.as_bytes()) }.ok().map(|s| *s)
}

/// The address of an exported symbol, or `None` when it is not exported.
/// The function `name` exported by `lib`, as a kernel.
pub(crate) fn kernel_by_symbol(lib: &libloading::Library, name: &str) -> Option<TFL_KernelFn> {
    // SAFETY: the caller vouches that a symbol named as a kernel has the
    // kernel signature (the ABI's contract for kernel symbols); a symbol
    // that is not a function is never called before that promise is made.
    unsafe { lib.get::<TFL_KernelFn>(name.as_bytes()) }.ok().map(|s| *s)
}

pub(crate) fn symbol_address(lib: &libloading::Library, name: &str) -> Option<usize> {
    // SAFETY: we only read the symbol's address and never call or
    // dereference it through this type.
    unsafe { lib.get::<*const c_void>(name.as_bytes()) }.ok().map(|s| *s as usize)
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
    // SAFETY: the ABI requires a NUL-terminated string borrowed for the call.
    let text = unsafe { CStr::from_ptr(message) }.to_string_lossy();
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

// ---------------------------------------------------------------------------
// The handshake and the plugin's tables
// ---------------------------------------------------------------------------

/// The version header of a plugin's table, read before anything else.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TableHeader {
    pub api: *const TFL_PluginApi,
    pub struct_size: usize,
    pub major: u32,
    pub minor: u32,
}

/// Calls the bootstrap function and reads only the version header.
pub(crate) fn handshake(
    get_api: TFL_GetPluginApiFn,
    host: &'static TFL_HostApi,
) -> Result<TableHeader, String> {
    // SAFETY: the host table is valid for the process' lifetime, as the ABI
    // requires; the function has the ABI's fixed bootstrap signature.
    let api = unsafe { get_api(host) };
    if api.is_null() {
        return Err("torch_fl_plugin_get_api returned NULL".to_owned());
    }
    // SAFETY: a non-NULL table starts with struct_size (rule 3 of the ABI).
    let struct_size = unsafe { ptr::addr_of!((*api).struct_size).read() };
    if struct_size < struct_size!(TFL_PluginApi, abi_minor) {
        return Err(format!(
            "its TFL_PluginApi.struct_size is {struct_size}, too small to hold the version fields"
        ));
    }
    // SAFETY: struct_size covers both version fields, checked just above.
    let (major, minor) =
        unsafe { (ptr::addr_of!((*api).abi_major).read(), ptr::addr_of!((*api).abi_minor).read()) };
    Ok(TableHeader { api, struct_size, major, minor })
}

/// Reads one table field, or `None` when the plugin's struct_size does not
/// cover it (an older plugin): the reader's default.
macro_rules! read_field {
    ($header:expr, $field:ident) => {
        if has_field!(TFL_PluginApi, $field, $header.struct_size) {
            // SAFETY: struct_size covers the field, so it lies inside the
            // plugin's table, which lives as long as the process.
            unsafe { ptr::addr_of!((*$header.api).$field).read() }
        } else {
            None
        }
    };
}

type Status = *mut TFL_Error;

/// Defines `ApiTable` with required entries as plain function pointers and
/// optional ones as `Option`, and its constructor from a plugin's table.
macro_rules! api_table {
    (
        required { $($req:ident : $req_ty:ty,)* }
        optional { $($opt:ident : $opt_ty:ty,)* }
    ) => {
        /// A validated copy of a plugin's function table.
        #[derive(Clone, Copy)]
        pub(crate) struct ApiTable {
            $(pub $req: $req_ty,)*
            $(pub $opt: Option<$opt_ty>,)*
        }

        impl std::fmt::Debug for ApiTable {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct("ApiTable")
                    $(.field(stringify!($opt), &self.$opt.is_some()))*
                    .finish_non_exhaustive()
            }
        }

        /// Names of the required entries, in table order.
        pub(crate) const REQUIRED_ENTRIES: &[&str] = &[$(stringify!($req)),*];
        impl ApiTable {
            /// Reads the table behind a successful handshake. Fails with the
            /// first missing required entry's name.
            pub(crate) fn read(header: &TableHeader) -> Result<Self, TableError> {
                let last_required = struct_size!(TFL_PluginApi, event_synchronize);
                if header.struct_size < last_required {
                    return Err(TableError::TooSmall { size: header.struct_size, needed: last_required });
                }
                Ok(Self {
                    $($req: read_field!(header, $req).ok_or(TableError::MissingEntry(stringify!($req)))?,)*
                    $($opt: read_field!(header, $opt),)*
                })
            }

            /// Which optional entries the plugin provides.
            pub(crate) fn optional_presence(&self) -> Vec<(&'static str, bool)> {
                vec![$((stringify!($opt), self.$opt.is_some())),*]
            }
        }
    };
}

api_table! {
    required {
        error_code: unsafe extern "C" fn(*const TFL_Error) -> i32,
        error_message: unsafe extern "C" fn(*const TFL_Error) -> *const c_char,
        error_destroy: unsafe extern "C" fn(*mut TFL_Error),
        get_info: unsafe extern "C" fn() -> *const TFL_PluginInfo,
        initialize: unsafe extern "C" fn(*const TFL_InitArgs) -> Status,
        get_op_table: unsafe extern "C" fn(*mut TFL_OpTable) -> Status,
        device_count: unsafe extern "C" fn(*mut i32) -> Status,
        device_properties: unsafe extern "C" fn(i32, *mut TFL_DeviceProperties) -> Status,
        device_synchronize: unsafe extern "C" fn(i32) -> Status,
        allocate: unsafe extern "C" fn(i32, usize, *mut *mut c_void) -> Status,
        deallocate: unsafe extern "C" fn(i32, *mut c_void) -> Status,
        copy: unsafe extern "C" fn(*const TFL_CopyArgs) -> Status,
        set_memory: unsafe extern "C" fn(i32, *mut c_void, u8, usize, *mut TFL_Stream) -> Status,
        default_stream: unsafe extern "C" fn(i32, *mut *mut TFL_Stream) -> Status,
        stream_create: unsafe extern "C" fn(i32, i32, *mut *mut TFL_Stream) -> Status,
        stream_destroy: unsafe extern "C" fn(*mut TFL_Stream) -> Status,
        stream_synchronize: unsafe extern "C" fn(*mut TFL_Stream) -> Status,
        stream_query: unsafe extern "C" fn(*mut TFL_Stream, *mut u8) -> Status,
        stream_wait_event: unsafe extern "C" fn(*mut TFL_Stream, *mut TFL_Event) -> Status,
        event_create: unsafe extern "C" fn(i32, u32, *mut *mut TFL_Event) -> Status,
        event_destroy: unsafe extern "C" fn(*mut TFL_Event) -> Status,
        event_record: unsafe extern "C" fn(*mut TFL_Event, *mut TFL_Stream) -> Status,
        event_query: unsafe extern "C" fn(*mut TFL_Event, *mut u8) -> Status,
        event_synchronize: unsafe extern "C" fn(*mut TFL_Event) -> Status,
    }
    optional {
        event_elapsed_time: unsafe extern "C" fn(*mut TFL_Event, *mut TFL_Event, *mut f32) -> Status,
        memory_stats: unsafe extern "C" fn(i32, *mut TFL_MemoryStats) -> Status,
        reset_peak_memory_stats: unsafe extern "C" fn(i32) -> Status,
        empty_cache: unsafe extern "C" fn(i32) -> Status,
    }
}

#[derive(Debug)]
pub(crate) enum TableError {
    TooSmall { size: usize, needed: usize },
    MissingEntry(&'static str),
}

/// The plugin's identity, copied out of its static strings.
#[derive(Debug, Clone)]
pub(crate) struct RawInfo {
    pub name: Option<String>,
    pub vendor: Option<String>,
    pub chip_family: Option<String>,
    pub plugin_version: Option<String>,
    pub min_torch_version: Option<String>,
    pub capabilities: u64,
}

/// Copies a borrowed C string; `None` for NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string valid for this call.
unsafe fn owned_string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: guaranteed by the caller.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

/// One operator-table entry, copied out.
#[derive(Debug, Clone)]
pub(crate) struct RawOpEntry {
    pub name: Option<String>,
    pub symbol: Option<String>,
    pub kernel: Option<TFL_KernelFn>,
    pub flags: u64,
    pub schema: Option<String>,
    pub infer_outputs: Option<TFL_InferOutputsFn>,
}

/// A 1.0 plugin and a 1.0 host agree on this entry layout; a reader steps by
/// the plugin's entry_size and reads only what it covers.
macro_rules! entry_field {
    ($entry:expr, $size:expr, $field:ident, $default:expr) => {
        if has_field!(TFL_OpEntry, $field, $size) {
            // SAFETY: the entry is entry_size bytes long (checked by the
            // caller) and entry_size covers this field.
            unsafe { ptr::addr_of!((*$entry).$field).read() }
        } else {
            $default
        }
    };
}

impl ApiTable {
    /// Turns a returned status into a `Result`, copying the message and
    /// releasing the plugin's error object.
    pub(crate) fn check(&self, status: Status) -> Result<(), PluginStatus> {
        if status.is_null() {
            return Ok(());
        }
        // SAFETY: a non-NULL status returned by this plugin is an error
        // object it created and we own; we release it exactly once, after
        // copying what we need (the message lives until error_destroy).
        let (code, message) = unsafe {
            let code = (self.error_code)(status);
            let message = owned_string((self.error_message)(status)).unwrap_or_default();
            (self.error_destroy)(status);
            (code, message)
        };
        Err(PluginStatus { code: StatusCode::from_raw(code), message })
    }

    pub(crate) fn info(&self) -> Option<RawInfo> {
        // SAFETY: get_info takes no arguments and returns NULL or a pointer
        // to a static TFL_PluginInfo.
        let info = unsafe { (self.get_info)() };
        if info.is_null() {
            return None;
        }
        // SAFETY: a non-NULL info starts with struct_size.
        let size = unsafe { ptr::addr_of!((*info).struct_size).read() };
        macro_rules! field {
            ($f:ident, $default:expr) => {
                if has_field!(TFL_PluginInfo, $f, size) {
                    // SAFETY: struct_size covers the field.
                    unsafe { ptr::addr_of!((*info).$f).read() }
                } else {
                    $default
                }
            };
        }
        let strings = [
            field!(name, ptr::null()),
            field!(vendor, ptr::null()),
            field!(chip_family, ptr::null()),
            field!(plugin_version, ptr::null()),
            field!(min_torch_version, ptr::null()),
        ];
        // SAFETY: string fields are NULL or static NUL-terminated strings.
        let [name, vendor, chip_family, plugin_version, min_torch_version] =
            strings.map(|p| unsafe { owned_string(p) });
        Some(RawInfo {
            name,
            vendor,
            chip_family,
            plugin_version,
            min_torch_version,
            capabilities: field!(capabilities, 0),
        })
    }

    /// Reads the whole operator table. Errors are descriptions of what is
    /// malformed.
    pub(crate) fn op_table(&self) -> Result<Vec<RawOpEntry>, String> {
        let mut table = TFL_OpTable {
            struct_size: struct_size!(TFL_OpTable, entry_size),
            entries: ptr::null(),
            num_entries: 0,
            entry_size: 0,
        };
        // SAFETY: `table` is a valid, writable TFL_OpTable whose struct_size
        // tells the plugin how much it may write.
        let status = unsafe { (self.get_op_table)(&mut table) };
        self.check(status).map_err(|s| format!("get_op_table failed: {s}"))?;
        if table.num_entries == 0 {
            return Ok(Vec::new());
        }
        if table.entries.is_null() {
            return Err(format!("get_op_table reports {} entries but a NULL array", table.num_entries));
        }
        let min_entry = struct_size!(TFL_OpEntry, kernel);
        if table.entry_size < min_entry {
            return Err(format!(
                "op table entry_size {} is smaller than the {min_entry} bytes every entry needs",
                table.entry_size
            ));
        }
        let base = table.entries.cast::<u8>();
        (0..table.num_entries)
            .map(|i| {
                // SAFETY: the plugin promises num_entries entries of
                // entry_size bytes each in a static array.
                let entry = unsafe { base.add(i * table.entry_size) }.cast::<TFL_OpEntry>();
                // SAFETY: each entry starts with struct_size.
                let own_size = unsafe { ptr::addr_of!((*entry).struct_size).read() };
                if own_size > table.entry_size {
                    return Err(format!(
                        "op table entry {i} has struct_size {own_size}, larger than the table's entry_size {}",
                        table.entry_size
                    ));
                }
                let size = table.entry_size.min(own_size.max(min_entry));
                let strings = [
                    entry_field!(entry, size, name, ptr::null()),
                    entry_field!(entry, size, symbol, ptr::null()),
                    entry_field!(entry, size, schema, ptr::null()),
                ];
                // SAFETY: names, symbols and schemas are NULL or static
                // NUL-terminated strings.
                let [name, symbol, schema] = strings.map(|p| unsafe { owned_string(p) });
                Ok(RawOpEntry {
                    name,
                    symbol,
                    kernel: entry_field!(entry, size, kernel, None),
                    flags: entry_field!(entry, size, flags, 0),
                    schema,
                    infer_outputs: entry_field!(entry, size, infer_outputs, None),
                })
            })
            .collect()
    }

    pub(crate) fn initialize(&self, options: &str) -> Result<(), PluginStatus> {
        let options = CString::new(options).map_err(|_| PluginStatus {
            code: StatusCode::InvalidArgument,
            message: "plugin options contain a NUL byte".to_owned(),
        })?;
        let args =
            TFL_InitArgs { struct_size: struct_size!(TFL_InitArgs, options), options: options.as_ptr() };
        // SAFETY: `args` and the string it points to outlive the call.
        self.check(unsafe { (self.initialize)(&args) })
    }

    pub(crate) fn device_count(&self) -> Result<i32, PluginStatus> {
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer for the call.
        self.check(unsafe { (self.device_count)(&mut n) })?;
        Ok(n)
    }

    /// The properties of `device` and its name. `minor` is the negotiated
    /// ABI minor: the struct offered to the plugin ends with that version's
    /// last field, so fields newer than the plugin keep their defaults (0).
    pub(crate) fn device_properties(
        &self,
        device: i32,
        minor: u32,
    ) -> Result<(Option<String>, TFL_DeviceProperties), PluginStatus> {
        let struct_size = if minor >= 2 {
            struct_size!(TFL_DeviceProperties, capability_minor)
        } else {
            struct_size!(TFL_DeviceProperties, memory_alignment)
        };
        let mut p = TFL_DeviceProperties {
            struct_size,
            name: ptr::null(),
            total_memory: 0,
            compute_units: 0,
            memory_alignment: 0,
            capability_major: 0,
            capability_minor: 0,
        };
        // SAFETY: `p` is writable, and at least as large as the struct_size we set.
        self.check(unsafe { (self.device_properties)(device, &mut p) })?;
        // SAFETY: the name is NULL or a static string owned by the plugin.
        let name = unsafe { owned_string(p.name) };
        Ok((name, p))
    }

    pub(crate) fn device_synchronize(&self, device: i32) -> Result<(), PluginStatus> {
        // SAFETY: plain value argument.
        self.check(unsafe { (self.device_synchronize)(device) })
    }

    pub(crate) fn allocate(&self, device: i32, nbytes: usize) -> Result<*mut c_void, PluginStatus> {
        let mut p = ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        self.check(unsafe { (self.allocate)(device, nbytes, &mut p) })?;
        if p.is_null() {
            return Err(PluginStatus {
                code: StatusCode::Internal,
                message: "allocate succeeded but returned NULL (the ABI requires a non-NULL pointer)".into(),
            });
        }
        Ok(p)
    }

    /// # Safety
    /// `ptr` came from `allocate` on `device` and is not used afterwards.
    pub(crate) unsafe fn deallocate(&self, device: i32, ptr: *mut c_void) -> Result<(), PluginStatus> {
        // SAFETY: guaranteed by the caller.
        self.check(unsafe { (self.deallocate)(device, ptr) })
    }

    /// # Safety
    /// The pointers in `args` are valid for `nbytes` in the memory their
    /// kind says; with a stream, host memory stays valid until the stream
    /// executes the copy.
    pub(crate) unsafe fn copy(&self, args: &TFL_CopyArgs) -> Result<(), PluginStatus> {
        // SAFETY: guaranteed by the caller.
        self.check(unsafe { (self.copy)(args) })
    }

    /// # Safety
    /// `ptr` points into an allocation of `device` with `nbytes` bytes left.
    pub(crate) unsafe fn set_memory(
        &self,
        device: i32,
        ptr: *mut c_void,
        value: u8,
        nbytes: usize,
        stream: *mut TFL_Stream,
    ) -> Result<(), PluginStatus> {
        // SAFETY: guaranteed by the caller.
        self.check(unsafe { (self.set_memory)(device, ptr, value, nbytes, stream) })
    }

    pub(crate) fn default_stream(&self, device: i32) -> Result<*mut TFL_Stream, PluginStatus> {
        let mut s = ptr::null_mut();
        // SAFETY: `s` is a valid out-pointer.
        self.check(unsafe { (self.default_stream)(device, &mut s) })?;
        Ok(s)
    }

    pub(crate) fn stream_create(&self, device: i32, priority: i32) -> Result<*mut TFL_Stream, PluginStatus> {
        let mut s = ptr::null_mut();
        // SAFETY: `s` is a valid out-pointer.
        self.check(unsafe { (self.stream_create)(device, priority, &mut s) })?;
        Ok(s)
    }

    /// # Safety
    /// `stream` is a live stream of this plugin (for the destroy: a created,
    /// not default, one that is not used afterwards).
    pub(crate) unsafe fn stream_call(
        &self,
        which: StreamCall,
        stream: *mut TFL_Stream,
    ) -> Result<bool, PluginStatus> {
        let mut done = 0u8;
        // SAFETY: guaranteed by the caller; `done` is a valid out-pointer.
        let status = unsafe {
            match which {
                StreamCall::Destroy => (self.stream_destroy)(stream),
                StreamCall::Synchronize => (self.stream_synchronize)(stream),
                StreamCall::Query => (self.stream_query)(stream, &mut done),
            }
        };
        self.check(status)?;
        Ok(done != 0)
    }

    /// # Safety
    /// `stream` and `event` are live handles of this plugin.
    pub(crate) unsafe fn stream_wait_event(
        &self,
        stream: *mut TFL_Stream,
        event: *mut TFL_Event,
    ) -> Result<(), PluginStatus> {
        // SAFETY: guaranteed by the caller.
        self.check(unsafe { (self.stream_wait_event)(stream, event) })
    }

    pub(crate) fn event_create(&self, device: i32, flags: u32) -> Result<*mut TFL_Event, PluginStatus> {
        let mut e = ptr::null_mut();
        // SAFETY: `e` is a valid out-pointer.
        self.check(unsafe { (self.event_create)(device, flags, &mut e) })?;
        Ok(e)
    }

    /// # Safety
    /// `event` is a live event of this plugin (and, for Destroy, unused
    /// afterwards); `stream`, for Record, a live stream.
    pub(crate) unsafe fn event_call(
        &self,
        which: EventCall,
        event: *mut TFL_Event,
        stream: *mut TFL_Stream,
    ) -> Result<bool, PluginStatus> {
        let mut done = 0u8;
        // SAFETY: guaranteed by the caller; `done` is a valid out-pointer.
        let status = unsafe {
            match which {
                EventCall::Destroy => (self.event_destroy)(event),
                EventCall::Record => (self.event_record)(event, stream),
                EventCall::Query => (self.event_query)(event, &mut done),
                EventCall::Synchronize => (self.event_synchronize)(event),
            }
        };
        self.check(status)?;
        Ok(done != 0)
    }

    /// `None` when the plugin does not implement elapsed time.
    ///
    /// # Safety
    /// Both events are live events of this plugin.
    pub(crate) unsafe fn event_elapsed_time(
        &self,
        start: *mut TFL_Event,
        end: *mut TFL_Event,
    ) -> Option<Result<f32, PluginStatus>> {
        let f = self.event_elapsed_time?;
        let mut ms = 0f32;
        // SAFETY: guaranteed by the caller; `ms` is a valid out-pointer.
        Some(self.check(unsafe { f(start, end, &mut ms) }).map(|()| ms))
    }

    /// `None` when the plugin does not report memory statistics.
    pub(crate) fn memory_stats(&self, device: i32) -> Option<Result<TFL_MemoryStats, PluginStatus>> {
        let f = self.memory_stats?;
        let mut stats =
            TFL_MemoryStats { struct_size: struct_size!(TFL_MemoryStats, num_ooms), ..Default::default() };
        // SAFETY: `stats` is writable with the struct_size we set.
        Some(self.check(unsafe { f(device, &mut stats) }).map(|()| stats))
    }

    /// Calls an optional per-device entry; `None` when absent.
    pub(crate) fn device_call(&self, which: DeviceCall, device: i32) -> Option<Result<(), PluginStatus>> {
        let f = match which {
            DeviceCall::ResetPeak => self.reset_peak_memory_stats?,
            DeviceCall::EmptyCache => self.empty_cache?,
        };
        // SAFETY: plain value argument.
        Some(self.check(unsafe { f(device) }))
    }

    /// Runs a kernel.
    ///
    /// # Safety
    /// `frame` and everything it points to are valid for the call, and its
    /// tensors describe memory of the frame's device large enough for their
    /// shapes and strides.
    pub(crate) unsafe fn call_kernel(
        &self,
        kernel: TFL_KernelFn,
        frame: &TFL_CallFrame,
    ) -> Result<(), PluginStatus> {
        // SAFETY: guaranteed by the caller.
        self.check(unsafe { kernel(frame) })
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum StreamCall {
    Destroy,
    Synchronize,
    Query,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum EventCall {
    Destroy,
    Record,
    Query,
    Synchronize,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum DeviceCall {
    ResetPeak,
    EmptyCache,
}

/// The `resize_output` callback of frames built by this crate's launcher,
/// which has no dynamic-shape support: it reports UNIMPLEMENTED.
pub(crate) unsafe extern "C" fn resize_output_unsupported(
    _frame: *const TFL_CallFrame,
    _index: usize,
    _ndim: i32,
    _shape: *const i64,
) -> i32 {
    TFL_ERROR_UNIMPLEMENTED
}
