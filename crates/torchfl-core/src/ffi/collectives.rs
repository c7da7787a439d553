//! The collectives table (ABI 1.3): reading it once after `initialize`, and
//! every call through it.
//!
//! The host allocates the `TFL_Collectives` the plugin fills, so nothing of
//! the plugin's memory is read but the function pointers it wrote, and each
//! is called only once it was found in executable memory.

use std::ffi::c_void;

use torchfl_ffi::*;

use super::probe::MemoryMap;
use super::table::ApiTable;
use crate::error::PluginStatus;

type Status = *mut TFL_Error;

/// Defines `CollTable` (every entry required once the table exists) and
/// its validated constructor from what the plugin wrote.
macro_rules! coll_table {
    ($($name:ident : $ty:ty,)*) => {
        /// A validated copy of a plugin's collectives table.
        #[derive(Clone, Copy)]
        pub(crate) struct CollTable {
            $(pub $name: $ty,)*
        }

        impl std::fmt::Debug for CollTable {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("CollTable")
            }
        }

        /// Names of the collectives entries, in table order.
        pub(crate) const COLLECTIVE_ENTRIES: &[&str] = &[$(stringify!($name)),*];

        impl CollTable {
            fn from_filled(map: &MemoryMap, t: &TFL_Collectives) -> Result<Self, String> {
                $(
                    let $name = t.$name.ok_or_else(|| format!(
                        "get_collectives succeeded but left TFL_Collectives.{} NULL: every entry of the \
                         collectives table is required (return an error from get_collectives to offer no \
                         collectives)", stringify!($name)))?;
                    map.executable($name as usize).map_err(|at| format!(
                        "TFL_Collectives.{} does not point to code: {at}", stringify!($name)))?;
                )*
                Ok(Self { $($name,)* })
            }
        }
    };
}

coll_table! {
    get_unique_id: unsafe extern "C" fn(*mut TFL_UniqueId) -> Status,
    comm_init_rank: unsafe extern "C" fn(*const TFL_UniqueId, i32, i32, i32, *mut *mut TFL_Comm) -> Status,
    comm_destroy: unsafe extern "C" fn(*mut TFL_Comm) -> Status,
    comm_abort: unsafe extern "C" fn(*mut TFL_Comm) -> Status,
    comm_get_async_error: unsafe extern "C" fn(*mut TFL_Comm, *mut *mut TFL_Error) -> Status,
    all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, TFL_DType, i32, *mut TFL_Comm, *mut TFL_Stream) -> Status,
    broadcast: unsafe extern "C" fn(*const c_void, *mut c_void, usize, TFL_DType, i32, *mut TFL_Comm, *mut TFL_Stream) -> Status,
    reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, TFL_DType, i32, i32, *mut TFL_Comm, *mut TFL_Stream) -> Status,
    all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, TFL_DType, *mut TFL_Comm, *mut TFL_Stream) -> Status,
    reduce_scatter: unsafe extern "C" fn(*const c_void, *mut c_void, usize, TFL_DType, i32, *mut TFL_Comm, *mut TFL_Stream) -> Status,
    all_to_all: unsafe extern "C" fn(*const c_void, *mut c_void, usize, TFL_DType, *mut TFL_Comm, *mut TFL_Stream) -> Status,
    send: unsafe extern "C" fn(*const c_void, usize, TFL_DType, i32, *mut TFL_Comm, *mut TFL_Stream) -> Status,
    recv: unsafe extern "C" fn(*mut c_void, usize, TFL_DType, i32, *mut TFL_Comm, *mut TFL_Stream) -> Status,
    group_start: unsafe extern "C" fn(*mut TFL_Comm) -> Status,
    group_end: unsafe extern "C" fn(*mut TFL_Comm) -> Status,
}

/// What asking a plugin for its collectives found.
#[derive(Debug)]
pub(crate) enum CollectivesLookup {
    /// A table with every entry pointing to code.
    Present(CollTable),
    /// No collectives, and why (for the log): an older plugin, a NULL
    /// entry, or an error from get_collectives.
    Absent(String),
}

impl ApiTable {
    /// Asks for the collectives table, after initialize. `minor` is the
    /// negotiated ABI minor: below 1.3 the host does not ask. An error is a
    /// malformed table, which refuses the plugin.
    pub(crate) fn collectives(&self, map: &MemoryMap, minor: u32) -> Result<CollectivesLookup, String> {
        if minor < 3 {
            return Ok(CollectivesLookup::Absent(format!(
                "the plugin speaks ABI 1.{minor}, collectives came in 1.3"
            )));
        }
        let Some(get) = self.get_collectives else {
            return Ok(CollectivesLookup::Absent("its get_collectives entry is NULL".to_owned()));
        };
        let mut out = TFL_Collectives {
            struct_size: struct_size!(TFL_Collectives, group_end),
            get_unique_id: None,
            comm_init_rank: None,
            comm_destroy: None,
            comm_abort: None,
            comm_get_async_error: None,
            all_reduce: None,
            broadcast: None,
            reduce: None,
            all_gather: None,
            reduce_scatter: None,
            all_to_all: None,
            send: None,
            recv: None,
            group_start: None,
            group_end: None,
        };
        // SAFETY: get_collectives was found in executable memory when the
        // table was read; `out` is a host struct whose struct_size says how
        // much the plugin may write.
        if let Err(status) = self.check(unsafe { get(&mut out) }) {
            return Ok(CollectivesLookup::Absent(format!("get_collectives reported {status}")));
        }
        CollTable::from_filled(map, &out).map(CollectivesLookup::Present)
    }

    /// Converts a status of a collectives entry (same error objects as
    /// every entry).
    pub(crate) fn coll_check(&self, status: Status) -> Result<(), PluginStatus> {
        self.check(status)
    }

    /// Takes an error object the plugin handed over as an output (not as a
    /// status), releasing it.
    pub(crate) fn take_error(&self, error: *mut TFL_Error) -> Option<PluginStatus> {
        self.check(error).err()
    }
}
