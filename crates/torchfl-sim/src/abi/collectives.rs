//! The `TFL_Collectives` entries (ABI 1.3): conversions around
//! [`crate::collectives`], in the shape of [`super::runtime_entries`].
//!
//! Communicators cross the ABI as opaque handles looked up in a registry,
//! like streams and events, so a made-up or destroyed handle is an
//! `INVALID_ARGUMENT` error rather than a crash.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use torchfl_ffi::{struct_size, TFL_Collectives, TFL_Comm, TFL_DType, TFL_Error, TFL_Stream, TFL_UniqueId};

use super::{guard, into_raw, null_arg, opt_stream, runtime};
use crate::collectives::{self, CollArgs, CollOp, Comm};
use crate::error::{Error, Result};
use crate::stream::lock;

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

/// # Safety
/// `id` must be NULL or readable; `out` NULL or writable.
unsafe extern "C" fn comm_init_rank(
    id: *const TFL_UniqueId,
    world: i32,
    rank: i32,
    dev: i32,
    out: *mut *mut TFL_Comm,
) -> *mut TFL_Error {
    guard("comm_init_rank", || {
        let rt = runtime()?;
        let device = rt.check_device(i64::from(dev))?;
        if id.is_null() || out.is_null() {
            return Err(null_arg("comm_init_rank", if id.is_null() { "id" } else { "out_comm" }));
        }
        // SAFETY: non-NULL and readable per the ABI.
        let bytes = unsafe { id.read() }.bytes;
        let (world, rank) = match (usize::try_from(world), usize::try_from(rank)) {
            (Ok(w), Ok(r)) => (w, r),
            _ => {
                return Err(Error::invalid(format!("sim: comm_init_rank: rank {rank} of world size {world}")))
            }
        };
        let c = Comm::init(&bytes, world, rank, device)?;
        let handle = NEXT.fetch_add(1, Ordering::Relaxed) << 4;
        lock(&COMMS).get_or_insert_with(HashMap::new).insert(handle, c);
        // SAFETY: non-NULL and writable per the ABI.
        unsafe { out.write(handle as usize as *mut TFL_Comm) };
        Ok(())
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
