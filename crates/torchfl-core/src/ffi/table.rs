//! The handshake, validated copies of the plugin's tables, and every call
//! through its function table.
//!
//! Plugin structs are copied into host memory (through
//! [`MemoryMap::copy`], which checks the range first) before any field is
//! read, so a table shorter than it claims, or a pointer into unmapped
//! memory, is an error value here and never a fault.

use std::ffi::{c_char, c_void, CString};
use std::ptr;

use torchfl_ffi::*;

use super::probe::{self, MemoryMap, StringFault};
use crate::error::{PluginStatus, StatusCode};

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
    map: &MemoryMap,
    get_api: TFL_GetPluginApiFn,
    host: &'static TFL_HostApi,
) -> Result<TableHeader, String> {
    // SAFETY: `get_api` was found in executable memory by the caller; the
    // host table is valid for the process' lifetime, as the ABI requires;
    // the function has the ABI's fixed bootstrap signature.
    let api = unsafe { get_api(host) };
    if api.is_null() {
        return Err("torch_fl_plugin_get_api returned NULL".to_owned());
    }
    let version_fields = struct_size!(TFL_PluginApi, abi_minor);
    let head = map.copy(api, version_fields).ok_or_else(|| {
        format!("torch_fl_plugin_get_api returned {api:p}, which is not readable memory: return the address of the table")
    })?;
    let struct_size = head.struct_size;
    if struct_size < version_fields {
        return Err(format!(
            "its TFL_PluginApi.struct_size is {struct_size}, too small to hold the version fields: set it with \
             TFL_STRUCT_SIZE(TFL_PluginApi, empty_cache)"
        ));
    }
    for (field, value) in [("abi_major", head.abi_major), ("abi_minor", head.abi_minor)] {
        if value > TFL_MAX_ABI_VERSION {
            return Err(format!(
                "its TFL_PluginApi.{field} is {value}, which is not an ABI version (versions stay below \
                 TFL_MAX_ABI_VERSION, {TFL_MAX_ABI_VERSION}): the table is uninitialized or not a TFL_PluginApi; set \
                 abi_major and abi_minor to TFL_ABI_VERSION_MAJOR and TFL_ABI_VERSION_MINOR"
            ));
        }
    }
    if struct_size > TFL_MAX_STRUCT_SIZE {
        return Err(format!(
            "its TFL_PluginApi.struct_size is {struct_size}, more than TFL_MAX_STRUCT_SIZE ({TFL_MAX_STRUCT_SIZE}): \
             not a struct size; set it with TFL_STRUCT_SIZE(TFL_PluginApi, empty_cache)"
        ));
    }
    Ok(TableHeader { api, struct_size, major: head.abi_major, minor: head.abi_minor })
}

/// Reads one field of the plugin's table from the host's copy, or `None`
/// when the plugin's struct_size does not cover it (an older plugin): the
/// reader's default.
macro_rules! read_field {
    ($copy:expr, $size:expr, $field:ident) => {
        if has_field!(TFL_PluginApi, $field, $size) {
            $copy.$field
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
            /// Copies the table behind a successful handshake. Fails with the
            /// first missing required entry, or the first entry that does not
            /// point into executable memory.
            pub(crate) fn read(map: &MemoryMap, header: &TableHeader) -> Result<Self, TableError> {
                let last_required = struct_size!(TFL_PluginApi, event_synchronize);
                if header.struct_size < last_required {
                    return Err(TableError::TooSmall { size: header.struct_size, needed: last_required });
                }
                let copy = map.copy(header.api, header.struct_size).ok_or(TableError::Unreadable)?;
                let size = header.struct_size;
                $(
                    let $req = read_field!(copy, size, $req).ok_or(TableError::MissingEntry(stringify!($req)))?;
                    map.executable($req as usize)
                        .map_err(|at| TableError::NotCode { entry: stringify!($req), at })?;
                )*
                $(
                    let $opt = read_field!(copy, size, $opt);
                    if let Some(f) = $opt {
                        map.executable(f as usize).map_err(|at| TableError::NotCode { entry: stringify!($opt), at })?;
                    }
                )*
                Ok(Self { $($req,)* $($opt,)* })
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
        get_collectives: unsafe extern "C" fn(*mut TFL_Collectives) -> Status,
        host_allocate: unsafe extern "C" fn(usize, *mut *mut c_void) -> Status,
        host_deallocate: unsafe extern "C" fn(*mut c_void) -> Status,
        probe_devices: unsafe extern "C" fn(*const c_char, *mut i32) -> Status,
        get_graphs: unsafe extern "C" fn(*mut TFL_Graphs) -> Status,
        get_activity: unsafe extern "C" fn(*mut TFL_Activity) -> Status,
    }
}

#[derive(Debug)]
pub(crate) enum TableError {
    TooSmall { size: usize, needed: usize },
    Unreadable,
    MissingEntry(&'static str),
    NotCode { entry: &'static str, at: String },
}

/// A string field as read from plugin memory: its text, `None` for NULL, or
/// why it could not be read.
pub(crate) type RawString = Result<Option<String>, StringFault>;

/// The plugin's identity, copied out of its static strings.
#[derive(Debug, Clone)]
pub(crate) struct RawInfo {
    pub name: RawString,
    pub vendor: RawString,
    pub chip_family: RawString,
    pub plugin_version: RawString,
    pub min_torch_version: RawString,
    pub capabilities: u64,
}

/// What get_op_table returned, checked against the header's limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawOpTable {
    pub entries: usize,
    pub num_entries: usize,
    pub entry_size: usize,
}

/// One operator-table entry, copied out.
#[derive(Debug, Clone)]
pub(crate) struct RawOpEntry {
    pub name: RawString,
    pub symbol: RawString,
    pub kernel: Option<TFL_KernelFn>,
    pub flags: u64,
    pub schema: RawString,
    pub infer_outputs: Option<TFL_InferOutputsFn>,
}

/// ", which looks like ..." when `n` is the byte size of the entries
/// before it (the `sizeof ops` slip): empty otherwise.
/// With `valid`, only when exactly that many entries preceded a bad one.
pub(crate) fn bytes_hint(n: usize, entry_size: usize, valid: Option<usize>) -> String {
    let sizes = [entry_size, struct_size!(TFL_OpEntry, schema), struct_size!(TFL_OpEntry, infer_outputs)];
    let fits = |s: usize| {
        s >= MIN_ENTRY_SIZE
            && n % s == 0
            && n / s > 0
            && n / s <= TFL_MAX_OP_ENTRIES
            && valid.is_none_or(|v| v == n / s)
    };
    match sizes.into_iter().find(|&s| fits(s)) {
        Some(s) => format!(
            "; it looks like the array's size in bytes ({} entries of {s} bytes): set num_entries to the number of \
             entries, sizeof ops / sizeof ops[0]",
            n / s
        ),
        None => String::new(),
    }
}

/// The smallest entry that holds everything 1.0 requires.
pub(crate) const MIN_ENTRY_SIZE: usize =
    std::mem::offset_of!(TFL_OpEntry, kernel) + size_of::<Option<TFL_KernelFn>>();

/// Reads one field of a copied entry, or the default when `size` does not
/// cover it: a reader steps by the plugin's entry_size and reads only what
/// the entry's own struct_size covers.
macro_rules! entry_field {
    ($entry:expr, $size:expr, $field:ident, $default:expr) => {
        if has_field!(TFL_OpEntry, $field, $size) {
            $entry.$field
        } else {
            $default
        }
    };
}

/// Reads op-table entry `index` of `table`, after checking that its bytes
/// are mapped readable. An error is a description of what is wrong.
pub(crate) fn op_entry(map: &MemoryMap, table: &RawOpTable, index: usize) -> Result<RawOpEntry, String> {
    let at = table.entries.wrapping_add(index * table.entry_size);
    let copy = map.copy(at as *const TFL_OpEntry, table.entry_size).ok_or_else(|| {
        let why = if index == 0 {
            "TFL_OpTable.entries does not point to the array".to_owned()
        } else {
            format!("num_entries ({}) counts past the end of the array", table.num_entries)
        };
        format!("op table entry {index} ({at:#x}, {} bytes) is not readable memory: {why}", table.entry_size)
    })?;
    if copy.struct_size > table.entry_size {
        return Err(format!(
            "op table entry {index} has struct_size {}, larger than the table's entry_size {}",
            copy.struct_size, table.entry_size
        ));
    }
    let size = table.entry_size.min(copy.struct_size.max(MIN_ENTRY_SIZE));
    Ok(RawOpEntry {
        name: map.string(entry_field!(copy, size, name, ptr::null())),
        symbol: map.string(entry_field!(copy, size, symbol, ptr::null())),
        kernel: entry_field!(copy, size, kernel, None),
        flags: entry_field!(copy, size, flags, 0),
        schema: map.string(entry_field!(copy, size, schema, ptr::null())),
        infer_outputs: entry_field!(copy, size, infer_outputs, None),
    })
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
            let message = probe::message_string((self.error_message)(status));
            (self.error_destroy)(status);
            (code, message)
        };
        Err(PluginStatus { code: StatusCode::from_raw(code), message })
    }

    /// Calls get_info and copies the identity. An error describes what is
    /// malformed.
    pub(crate) fn info(&self, map: &MemoryMap) -> Result<RawInfo, String> {
        // SAFETY: get_info (in executable memory, checked at read) takes no
        // arguments and returns NULL or a pointer to a static TFL_PluginInfo.
        let info = unsafe { (self.get_info)() };
        if info.is_null() {
            return Err("get_info returned NULL".to_owned());
        }
        let size = map
            .copy(info, size_of::<usize>())
            .ok_or_else(|| format!("get_info returned {info:p}, which is not readable memory"))?
            .struct_size;
        let required = struct_size!(TFL_PluginInfo, plugin_version);
        if size < required {
            return Err(format!(
                "TFL_PluginInfo.struct_size is {size}, too small for the required fields name, vendor, chip_family and \
                 plugin_version ({required} bytes): set it with TFL_STRUCT_SIZE(TFL_PluginInfo, capabilities)"
            ));
        }
        if size > TFL_MAX_STRUCT_SIZE {
            return Err(format!(
                "TFL_PluginInfo.struct_size is {size}, more than TFL_MAX_STRUCT_SIZE ({TFL_MAX_STRUCT_SIZE}): not a \
                 struct size; set it with TFL_STRUCT_SIZE(TFL_PluginInfo, capabilities)"
            ));
        }
        let copy = map.copy(info, size).ok_or_else(|| {
            format!("TFL_PluginInfo at {info:p} is not readable for its struct_size of {size} bytes")
        })?;
        macro_rules! field {
            ($f:ident, $default:expr) => {
                if has_field!(TFL_PluginInfo, $f, size) {
                    copy.$f
                } else {
                    $default
                }
            };
        }
        Ok(RawInfo {
            name: map.string(field!(name, ptr::null())),
            vendor: map.string(field!(vendor, ptr::null())),
            chip_family: map.string(field!(chip_family, ptr::null())),
            plugin_version: map.string(field!(plugin_version, ptr::null())),
            min_torch_version: map.string(field!(min_torch_version, ptr::null())),
            capabilities: field!(capabilities, 0),
        })
    }

    /// Calls get_op_table and checks what it reports against the header's
    /// limits, before any entry is read. An error describes what is
    /// malformed.
    pub(crate) fn op_table(&self) -> Result<RawOpTable, String> {
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
        let (n, size) = (table.num_entries, table.entry_size);
        let raw = RawOpTable { entries: table.entries as usize, num_entries: n, entry_size: size };
        if n == 0 {
            return Ok(raw);
        }
        if n > TFL_MAX_OP_ENTRIES {
            return Err(format!(
                "TFL_OpTable.num_entries is {n}, more than TFL_MAX_OP_ENTRIES ({TFL_MAX_OP_ENTRIES}){}",
                bytes_hint(n, size, None)
            ));
        }
        if table.entries.is_null() {
            return Err(format!("get_op_table reports {n} entries but a NULL array"));
        }
        if size < MIN_ENTRY_SIZE {
            return Err(format!(
                "op table entry_size {size} is smaller than the {MIN_ENTRY_SIZE} bytes every entry needs: set it \
                 to sizeof(TFL_OpEntry)"
            ));
        }
        if size > TFL_MAX_OP_ENTRY_SIZE {
            return Err(format!(
                "op table entry_size {size} is more than TFL_MAX_OP_ENTRY_SIZE ({TFL_MAX_OP_ENTRY_SIZE}): set it to \
                 sizeof(TFL_OpEntry)"
            ));
        }
        Ok(raw)
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

    /// ABI 1.6 `probe_devices(options)`: `None` when the plugin does not
    /// offer it.
    pub(crate) fn probe_devices(&self, options: &str) -> Option<Result<i32, PluginStatus>> {
        let probe = self.probe_devices?;
        let Ok(options) = CString::new(options) else {
            return Some(Err(PluginStatus {
                code: StatusCode::InvalidArgument,
                message: "plugin options contain a NUL byte".to_owned(),
            }));
        };
        let mut n = 0;
        // SAFETY: the entry is code (checked at read); the string and `n`
        // outlive the call.
        let status = unsafe { probe(options.as_ptr(), &mut n) };
        Some(self.check(status).map(|()| n))
    }

    pub(crate) fn device_count(&self) -> Result<i32, PluginStatus> {
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer for the call.
        self.check(unsafe { (self.device_count)(&mut n) })?;
        Ok(n)
    }

    /// The properties of `device` and its name as read from plugin memory
    /// (NULL, text, or why it is unreadable). `minor` is the negotiated ABI
    /// minor: the struct offered to the plugin ends with that version's last
    /// field, so fields newer than the plugin keep their defaults (0).
    pub(crate) fn device_properties(
        &self,
        map: &MemoryMap,
        device: i32,
        minor: u32,
    ) -> Result<(RawString, TFL_DeviceProperties), PluginStatus> {
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
        Ok((map.string(p.name), p))
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
