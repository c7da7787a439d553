//! The collectives table (ABI 1.3, with the optional `comm_init_rank_config`
//! of 1.5): reading it once after `initialize`, and every call through it.
//!
//! The host allocates the `TFL_Collectives` the plugin fills, so nothing of
//! the plugin's memory is read but the function pointers it wrote, and each
//! is called only once it was found in executable memory. The struct the
//! host offers ends with the negotiated minor's last entry, so a 1.3 or 1.4
//! plugin is never asked for (or trusted with) the 1.5 one.

use torchfl_ffi::*;

use super::probe::MemoryMap;
use super::table::ApiTable;
use crate::error::PluginStatus;

type Status = *mut TFL_Error;

/// `comm_init_rank_config` (ABI 1.5).
pub(crate) type InitRankConfigFn = unsafe extern "C" fn(
    *const TFL_UniqueId,
    i32,
    i32,
    i32,
    *const TFL_CommConfig,
    *mut *mut TFL_Comm,
) -> Status;

/// Defines `CollTable` (every 1.3 entry required once the table exists,
/// the 1.5 entry optional) and its validated constructor from what the
/// plugin wrote.
macro_rules! coll_table {
    ($($name:ident : $ty:ty,)*) => {
        /// A validated copy of a plugin's collectives table.
        #[derive(Clone, Copy)]
        pub(crate) struct CollTable {
            $(pub $name: $ty,)*
            /// 1.5, optional: `None` when the plugin or the negotiated minor
            /// is older, or the plugin left it NULL.
            pub comm_init_rank_config: Option<InitRankConfigFn>,
        }

        impl std::fmt::Debug for CollTable {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("CollTable")
            }
        }

        /// Names of the collectives entries, in table order.
        pub(crate) const COLLECTIVE_ENTRIES: &[&str] = &[$(stringify!($name)),*];

        impl CollTable {
            /// `offered`: the struct_size the host offered (the negotiated
            /// minor's); the optional 1.5 entry is read only when both it
            /// and the size the plugin left cover it.
            fn from_filled(map: &MemoryMap, t: &TFL_Collectives, offered: usize) -> Result<Self, String> {
                $(
                    let $name = t.$name.ok_or_else(|| format!(
                        "get_collectives succeeded but left TFL_Collectives.{} NULL: every 1.3 entry of the \
                         collectives table is required (return an error from get_collectives to offer no \
                         collectives)", stringify!($name)))?;
                    map.executable($name as usize).map_err(|at| format!(
                        "TFL_Collectives.{} does not point to code: {at}", stringify!($name)))?;
                )*
                let covered = |size: usize| has_field!(TFL_Collectives, comm_init_rank_config, size);
                let comm_init_rank_config = match t.comm_init_rank_config {
                    Some(f) if covered(offered) && covered(t.struct_size) => {
                        map.executable(f as usize).map_err(|at| format!(
                            "TFL_Collectives.comm_init_rank_config does not point to code: {at} (leave the \
                             optional entry NULL instead)"))?;
                        Some(f)
                    }
                    _ => None,
                };
                Ok(Self { $($name,)* comm_init_rank_config })
            }
        }
    };
}

/// An argument of a collective (`crate::for_each_collective!`) as the ABI
/// entry takes it.
pub(crate) trait AbiArg {
    /// The ABI's type.
    type Raw;
    /// The value as the ABI takes it.
    fn abi(self) -> Self::Raw;
}

macro_rules! abi_as_is {
    ($($t:ty),*) => {$(
        impl AbiArg for $t {
            type Raw = $t;
            fn abi(self) -> $t {
                self
            }
        }
    )*};
}
abi_as_is!(*const std::ffi::c_void, *mut std::ffi::c_void, usize, i32, TFL_DType);

/// Feeds `coll_table!` the entries around the data collectives, whose
/// types come from `for_each_collective!` (each argument as the ABI takes
/// it, then the communicator and the stream).
macro_rules! coll_table_with_collectives {
    ([[$($before:tt)*] [$($after:tt)*]] $({
        name: $name:ident,
        doc: $doc:literal,
        safety: $safety:literal,
        args: ($($arg:ident : $ty:ty),* $(,)?),
        checks: $checks:tt,
    })*) => {
        coll_table! {
            $($before)*
            $($name: unsafe extern "C" fn(
                $(<$ty as AbiArg>::Raw,)* *mut TFL_Comm, *mut TFL_Stream
            ) -> Status,)*
            $($after)*
        }
    };
}

crate::for_each_collective! {
    coll_table_with_collectives,
    [
        get_unique_id: unsafe extern "C" fn(*mut TFL_UniqueId) -> Status,
        comm_init_rank: unsafe extern "C" fn(*const TFL_UniqueId, i32, i32, i32, *mut *mut TFL_Comm) -> Status,
        comm_destroy: unsafe extern "C" fn(*mut TFL_Comm) -> Status,
        comm_abort: unsafe extern "C" fn(*mut TFL_Comm) -> Status,
        comm_get_async_error: unsafe extern "C" fn(*mut TFL_Comm, *mut *mut TFL_Error) -> Status,
    ]
    [
        group_start: unsafe extern "C" fn(*mut TFL_Comm) -> Status,
        group_end: unsafe extern "C" fn(*mut TFL_Comm) -> Status,
    ]
}

/// What asking a plugin for an extension table (collectives, graphs) found.
#[derive(Debug)]
pub(crate) enum Extension<T> {
    /// A table with every entry pointing to code.
    Present(T),
    /// No such extension, and why (for the log): an older plugin, a NULL
    /// entry, or an error from the entry that fills the table.
    Absent(String),
}

impl ApiTable {
    /// Asks for the collectives table, after initialize. `minor` is the
    /// negotiated ABI minor: below 1.3 the host does not ask, and the struct
    /// it offers ends with that minor's last entry (`group_end` for 1.3 and
    /// 1.4, `comm_init_rank_config` from 1.5). An error is a malformed
    /// table, which refuses the plugin.
    pub(crate) fn collectives(&self, map: &MemoryMap, minor: u32) -> Result<Extension<CollTable>, String> {
        if minor < 3 {
            return Ok(Extension::Absent(format!(
                "the plugin speaks ABI 1.{minor}, collectives came in 1.3"
            )));
        }
        let Some(get) = self.get_collectives else {
            return Ok(Extension::Absent("its get_collectives entry is NULL".to_owned()));
        };
        let offered = if minor >= 5 {
            struct_size!(TFL_Collectives, comm_init_rank_config)
        } else {
            struct_size!(TFL_Collectives, group_end)
        };
        let mut out = TFL_Collectives {
            struct_size: offered,
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
            comm_init_rank_config: None,
        };
        // SAFETY: get_collectives was found in executable memory when the
        // table was read; `out` is a host struct whose struct_size says how
        // much the plugin may write.
        if let Err(status) = self.check(unsafe { get(&mut out) }) {
            return Ok(Extension::Absent(format!("get_collectives reported {status}")));
        }
        CollTable::from_filled(map, &out, offered).map(Extension::Present)
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
