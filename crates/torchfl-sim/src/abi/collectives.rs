//! The `TFL_Collectives` entries (ABI 1.3, and 1.5's
//! `comm_init_rank_config`): conversions around [`crate::runtime::collectives`], in
//! the shape of [`super::runtime_entries`].
//!
//! Communicators cross the ABI as opaque handles looked up in a registry,
//! like streams and events, so a made-up or destroyed handle is an
//! `INVALID_ARGUMENT` error rather than a crash.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use torchfl_ffi::{
    has_field, struct_size, TFL_Collectives, TFL_Comm, TFL_CommConfig, TFL_DType, TFL_Error, TFL_Stream,
    TFL_UniqueId,
};

use super::{guard, into_raw, null_arg, opt_stream, runtime};
use crate::error::{Error, Result};
use crate::runtime::collectives::{self, CollArgs, CollOp, Comm};
use crate::runtime::stream::lock;

static COMMS: Mutex<Option<HashMap<u64, Arc<Comm>>>> = Mutex::new(None);
static NEXT: AtomicU64 = AtomicU64::new(1);

fn comm(handle: *mut TFL_Comm) -> Result<Arc<Comm>> {
    lock(&COMMS).as_ref().and_then(|m| m.get(&(handle as usize as u64)).cloned()).ok_or_else(|| {
        Error::invalid(format!(
            "sim: unknown communicator handle {handle:p} (never created or already destroyed)"
        ))
    })
}

/// Fills the collectives table.
///
/// # Safety
/// `out` must be NULL or point to a `TFL_Collectives` of the size its
/// `struct_size` says, writable.
pub(super) unsafe extern "C" fn get_collectives(out: *mut TFL_Collectives) -> *mut TFL_Error {
    guard("get_collectives", || {
        if out.is_null() {
            return Err(null_arg("get_collectives", "out"));
        }
        // SAFETY: non-NULL; the host's struct starts with struct_size, and
        // `wr!` writes only the fields that size covers.
        unsafe {
            let size = rd!(out, struct_size);
            if size < struct_size!(TFL_Collectives, struct_size) {
                return Err(Error::invalid("sim: get_collectives: struct_size is too small"));
            }
            wr!(out, TFL_Collectives, size, get_unique_id, Some(get_unique_id));
            wr!(out, TFL_Collectives, size, comm_init_rank, Some(comm_init_rank));
            wr!(out, TFL_Collectives, size, comm_destroy, Some(comm_destroy));
            wr!(out, TFL_Collectives, size, comm_abort, Some(comm_abort));
            wr!(out, TFL_Collectives, size, comm_get_async_error, Some(comm_get_async_error));
            wr!(out, TFL_Collectives, size, all_reduce, Some(all_reduce));
            wr!(out, TFL_Collectives, size, broadcast, Some(broadcast));
            wr!(out, TFL_Collectives, size, reduce, Some(reduce));
            wr!(out, TFL_Collectives, size, all_gather, Some(all_gather));
            wr!(out, TFL_Collectives, size, reduce_scatter, Some(reduce_scatter));
            wr!(out, TFL_Collectives, size, all_to_all, Some(all_to_all));
            wr!(out, TFL_Collectives, size, send, Some(send));
            wr!(out, TFL_Collectives, size, recv, Some(recv));
            wr!(out, TFL_Collectives, size, group_start, Some(group_start));
            wr!(out, TFL_Collectives, size, group_end, Some(group_end));
            wr!(out, TFL_Collectives, size, comm_init_rank_config, Some(comm_init_rank_config));
        }
        Ok(())
    })
}

/// # Safety
/// `out` must be NULL or valid for a write.
unsafe extern "C" fn get_unique_id(out: *mut TFL_UniqueId) -> *mut TFL_Error {
    guard("get_unique_id", || {
        if out.is_null() {
            return Err(null_arg("get_unique_id", "out"));
        }
        let bytes = collectives::unique_id()?;
        // SAFETY: non-NULL and writable per the ABI.
        unsafe { out.write(TFL_UniqueId { bytes }) };
        Ok(())
    })
}

/// What `comm_init_rank_config` was asked for: `TFL_CommConfig`'s fields
/// as far as the host's struct covers them, the defaults past that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Settings {
    /// `None`: no preference (`timeout_ms` 0 or absent).
    timeout: Option<Duration>,
    blocking: bool,
}

impl Settings {
    const DEFAULT: Self = Self { timeout: None, blocking: true };

    /// Reads the host's config; NULL means the defaults.
    ///
    /// # Safety
    /// `config` must be NULL or point to a readable `TFL_CommConfig` of the
    /// size its `struct_size` says.
    unsafe fn read(config: *const TFL_CommConfig) -> Self {
        if config.is_null() {
            return Self::DEFAULT;
        }
        // SAFETY: non-NULL per the contract; every field is read only when
        // the host's struct_size covers it.
        unsafe {
            let size = rd!(config, struct_size);
            let timeout_ms =
                if has_field!(TFL_CommConfig, timeout_ms, size) { rd!(config, timeout_ms) } else { 0 };
            let blocking = !has_field!(TFL_CommConfig, blocking, size) || rd!(config, blocking) != 0;
            Self { timeout: (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms)), blocking }
        }
    }
}

/// Creates a communicator for `comm_init_rank` and `comm_init_rank_config`.
///
/// # Safety
/// `id` must be NULL or readable; `out` NULL or writable.
unsafe fn init(
    what: &str,
    id: *const TFL_UniqueId,
    world: i32,
    rank: i32,
    dev: i32,
    settings: Settings,
    out: *mut *mut TFL_Comm,
) -> Result<()> {
    let rt = runtime()?;
    let device = rt.check_device(i64::from(dev))?;
    if id.is_null() || out.is_null() {
        return Err(null_arg(what, if id.is_null() { "id" } else { "out_comm" }));
    }
    // SAFETY: non-NULL and readable per the ABI.
    let bytes = unsafe { id.read() }.bytes;
    let (world, rank) = match (usize::try_from(world), usize::try_from(rank)) {
        (Ok(w), Ok(r)) => (w, r),
        _ => return Err(Error::invalid(format!("sim: {what}: rank {rank} of world size {world}"))),
    };
    let timeout = collectives::timeout_for(settings.timeout)?;
    let c = if settings.blocking {
        Comm::init_with(&bytes, world, rank, device, timeout)?
    } else {
        // A failure to join is also the device's asynchronous error.
        Comm::start(&bytes, world, rank, device, timeout, move |e| {
            if let Ok(rt) = runtime() {
                let _ = rt.record_async_error(device, e);
            }
        })?
    };
    let handle = NEXT.fetch_add(1, Ordering::Relaxed) << 4;
    lock(&COMMS).get_or_insert_with(HashMap::new).insert(handle, c);
    // SAFETY: non-NULL and writable per the ABI.
    unsafe { out.write(handle as usize as *mut TFL_Comm) };
    Ok(())
}

/// # Safety
/// `id` must be NULL or readable; `out` NULL or writable.
unsafe extern "C" fn comm_init_rank(
    id: *const TFL_UniqueId,
    world: i32,
    rank: i32,
    dev: i32,
    out: *mut *mut TFL_Comm,
) -> *mut TFL_Error {
    // SAFETY: forwarded contract.
    guard("comm_init_rank", || unsafe {
        init("comm_init_rank", id, world, rank, dev, Settings::DEFAULT, out)
    })
}

/// # Safety
/// `id` must be NULL or readable; `config` NULL or a readable
/// `TFL_CommConfig` of its `struct_size`; `out` NULL or writable.
unsafe extern "C" fn comm_init_rank_config(
    id: *const TFL_UniqueId,
    world: i32,
    rank: i32,
    dev: i32,
    config: *const TFL_CommConfig,
    out: *mut *mut TFL_Comm,
) -> *mut TFL_Error {
    guard("comm_init_rank_config", || {
        // SAFETY: forwarded contract.
        let settings = unsafe { Settings::read(config) };
        // SAFETY: forwarded contract.
        unsafe { init("comm_init_rank_config", id, world, rank, dev, settings, out) }
    })
}

unsafe extern "C" fn comm_destroy(handle: *mut TFL_Comm) -> *mut TFL_Error {
    guard("comm_destroy", || {
        let c = comm(handle)?;
        c.wait_idle();
        lock(&COMMS).as_mut().map(|m| m.remove(&(handle as usize as u64)));
        Ok(())
    })
}

unsafe extern "C" fn comm_abort(handle: *mut TFL_Comm) -> *mut TFL_Error {
    guard("comm_abort", || {
        comm(handle)?.abort();
        Ok(())
    })
}

/// # Safety
/// `out` must be NULL or valid for a write.
unsafe extern "C" fn comm_get_async_error(handle: *mut TFL_Comm, out: *mut *mut TFL_Error) -> *mut TFL_Error {
    guard("comm_get_async_error", || {
        let c = comm(handle)?;
        if out.is_null() {
            return Err(null_arg("comm_get_async_error", "out_error"));
        }
        let e = c.async_error().map_or(std::ptr::null_mut(), into_raw);
        // SAFETY: non-NULL and writable per the ABI.
        unsafe { out.write(e) };
        Ok(())
    })
}

#[allow(clippy::too_many_arguments)] // one place for every operation's arguments
fn op(
    which: CollOp,
    handle: *mut TFL_Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: TFL_DType,
    op: i32,
    rank: i32,
    stream: *mut TFL_Stream,
) -> *mut TFL_Error {
    guard("collective", || {
        let rt = runtime()?;
        let c = comm(handle)?;
        let args = CollArgs {
            send: send as usize as u64,
            recv: recv as usize as u64,
            count,
            dtype,
            op,
            rank,
            stream: opt_stream(stream),
        };
        rt.collective(&c, which, &args)
    })
}

unsafe extern "C" fn all_reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: TFL_DType,
    o: i32,
    c: *mut TFL_Comm,
    s: *mut TFL_Stream,
) -> *mut TFL_Error {
    op(CollOp::AllReduce, c, send, recv, count, dtype, o, 0, s)
}

unsafe extern "C" fn broadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: TFL_DType,
    root: i32,
    c: *mut TFL_Comm,
    s: *mut TFL_Stream,
) -> *mut TFL_Error {
    op(CollOp::Broadcast, c, send, recv, count, dtype, 0, root, s)
}

#[allow(clippy::too_many_arguments)] // NCCL's signature
unsafe extern "C" fn reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: TFL_DType,
    o: i32,
    root: i32,
    c: *mut TFL_Comm,
    s: *mut TFL_Stream,
) -> *mut TFL_Error {
    op(CollOp::Reduce, c, send, recv, count, dtype, o, root, s)
}

unsafe extern "C" fn all_gather(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: TFL_DType,
    c: *mut TFL_Comm,
    s: *mut TFL_Stream,
) -> *mut TFL_Error {
    op(CollOp::AllGather, c, send, recv, count, dtype, 0, 0, s)
}

unsafe extern "C" fn reduce_scatter(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: TFL_DType,
    o: i32,
    c: *mut TFL_Comm,
    s: *mut TFL_Stream,
) -> *mut TFL_Error {
    op(CollOp::ReduceScatter, c, send, recv, count, dtype, o, 0, s)
}

unsafe extern "C" fn all_to_all(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: TFL_DType,
    c: *mut TFL_Comm,
    s: *mut TFL_Stream,
) -> *mut TFL_Error {
    op(CollOp::AllToAll, c, send, recv, count, dtype, 0, 0, s)
}

unsafe extern "C" fn send(
    buf: *const c_void,
    count: usize,
    dtype: TFL_DType,
    peer: i32,
    c: *mut TFL_Comm,
    s: *mut TFL_Stream,
) -> *mut TFL_Error {
    op(CollOp::Send, c, buf, std::ptr::null_mut(), count, dtype, 0, peer, s)
}

unsafe extern "C" fn recv(
    buf: *mut c_void,
    count: usize,
    dtype: TFL_DType,
    peer: i32,
    c: *mut TFL_Comm,
    s: *mut TFL_Stream,
) -> *mut TFL_Error {
    op(CollOp::Recv, c, std::ptr::null(), buf, count, dtype, 0, peer, s)
}

unsafe extern "C" fn group_start(handle: *mut TFL_Comm) -> *mut TFL_Error {
    guard("group_start", || runtime()?.group_start(&*comm(handle)?))
}

unsafe extern "C" fn group_end(handle: *mut TFL_Comm) -> *mut TFL_Error {
    guard("group_end", || runtime()?.group_end(&comm(handle)?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_config_is_read_as_far_as_its_struct_size_covers() {
        let full = TFL_CommConfig {
            struct_size: struct_size!(TFL_CommConfig, blocking),
            timeout_ms: 1500,
            blocking: 0,
        };
        // SAFETY: host structs valid for the calls.
        let read = |c: &TFL_CommConfig| unsafe { Settings::read(c) };
        assert_eq!(read(&full), Settings { timeout: Some(Duration::from_millis(1500)), blocking: false });
        let no_blocking = TFL_CommConfig { struct_size: struct_size!(TFL_CommConfig, timeout_ms), ..full };
        assert_eq!(
            read(&no_blocking),
            Settings { timeout: Some(Duration::from_millis(1500)), blocking: true }
        );
        let bare = TFL_CommConfig { struct_size: struct_size!(TFL_CommConfig, struct_size), ..full };
        assert_eq!(read(&bare), Settings::DEFAULT);
        assert_eq!(read(&TFL_CommConfig { timeout_ms: 0, ..full }).timeout, None, "0: the default");
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { Settings::read(std::ptr::null()) }, Settings::DEFAULT);
    }

    fn filled(struct_size: usize) -> TFL_Collectives {
        // SAFETY: all-zero is a valid TFL_Collectives (NULL entries).
        let mut out: TFL_Collectives = unsafe { std::mem::zeroed() };
        out.struct_size = struct_size;
        // SAFETY: `out` is a writable host struct of that size.
        assert!(unsafe { get_collectives(&mut out) }.is_null());
        out
    }

    #[test]
    fn the_1_5_entry_is_written_only_into_a_1_5_table() {
        let new = filled(struct_size!(TFL_Collectives, comm_init_rank_config));
        assert!(new.comm_init_rank_config.is_some() && new.group_end.is_some());
        let old = filled(struct_size!(TFL_Collectives, group_end));
        assert!(old.group_end.is_some());
        assert!(old.comm_init_rank_config.is_none(), "past a 1.3 host's struct");
    }
}
