//! The algorithms: ring all-reduce, all-gather and reduce-scatter, direct
//! broadcast, reduce and all-to-all, over a [`Mesh`].
//!
//! They run on a stream's worker thread, on device memory resolved to real
//! addresses when the operation was enqueued ([`Raw`]). In each ring step a
//! rank sends one segment to the next rank (on a scoped thread) while it
//! receives another from the previous one, so no step waits for a socket
//! buffer the peer is not draining.

use super::reduce::{combine, divide, Op};
use super::transport::{Header, Mesh};
use crate::dtype::DType;
use crate::error::Result;

/// A range of device memory resolved to a real address, valid (allocated,
/// and not used by other work) while the operation that holds it runs:
/// the runtime's stream-ordered free keeps it allocated until then.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Raw {
    pub addr: usize,
    pub len: usize,
}

impl Raw {
    /// Bytes `lo..hi` of the range.
    ///
    /// # Safety
    /// No `&mut` to an overlapping part may be live.
    unsafe fn bytes(&self, lo: usize, hi: usize) -> &[u8] {
        assert!(lo <= hi && hi <= self.len, "sim: collective range out of bounds");
        // SAFETY: within the validated range (checked above); aliasing is
        // the caller's promise.
        unsafe { std::slice::from_raw_parts((self.addr + lo) as *const u8, hi - lo) }
    }

    /// Bytes `lo..hi`, writable.
    ///
    /// # Safety
    /// No other reference to an overlapping part may be live.
    #[allow(clippy::mut_from_ref)] // the range is device memory, not `self`
    unsafe fn bytes_mut(&self, lo: usize, hi: usize) -> &mut [u8] {
        assert!(lo <= hi && hi <= self.len, "sim: collective range out of bounds");
        // SAFETY: as in `bytes`.
        unsafe { std::slice::from_raw_parts_mut((self.addr + lo) as *mut u8, hi - lo) }
    }
}

/// Copies `len` bytes from `src` to `dst` (which may overlap).
///
/// # Safety
/// Both are valid resolved ranges of at least `len` bytes.
pub(crate) unsafe fn move_bytes(src: usize, dst: usize, len: usize) {
    if src != dst && len > 0 {
        // SAFETY: the caller's contract; `copy` tolerates overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
    }
}

/// What one operation needs besides its buffers.
pub(crate) struct Ctx<'a> {
    pub mesh: &'a Mesh,
    pub what: &'a str,
    pub header: Header,
    pub elem: DType,
}

/// Bounds (in bytes) of segment `i` of `count` elements split `n` ways.
fn segment(count: usize, n: usize, i: usize, size: usize) -> (usize, usize) {
    ((i * count / n) * size, ((i + 1) * count / n) * size)
}

/// One ring step: sends `buf[send]` to the next rank while receiving into
/// `dst` from the previous one.
fn ring_step(c: &Ctx<'_>, buf: Raw, send: (usize, usize), dst: &mut [u8]) -> Result<()> {
    let (n, r) = (c.mesh.world, c.mesh.rank);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    std::thread::scope(|s| {
        // SAFETY: the segment sent and the one received are different
        // segments of `buf` (or `dst` is a separate buffer).
        let sender = s.spawn(|| c.mesh.send(c.what, next, &c.header, unsafe { buf.bytes(send.0, send.1) }));
        let received = c.mesh.recv(c.what, prev, &c.header, dst);
        let sent =
            sender.join().unwrap_or_else(|_| Err(crate::error::Error::internal("sim: sender panicked")));
        received.and(sent)
    })
}

/// Ring reduce-scatter in place over `buf` (`count` elements): afterwards
/// this rank's segment `rank` holds the reduction (divided for AVG).
fn ring_reduce_scatter(c: &Ctx<'_>, buf: Raw, count: usize, op: Op) -> Result<()> {
    let (n, r, size) = (c.mesh.world, c.mesh.rank, c.elem.itemsize());
    let mut tmp = Vec::new();
    for step in 0..n - 1 {
        let send = segment(count, n, (r + 2 * n - step - 1) % n, size);
        let recv = segment(count, n, (r + 2 * n - step - 2) % n, size);
        tmp.resize(recv.1 - recv.0, 0);
        ring_step(c, buf, send, &mut tmp)?;
        // SAFETY: the sender of this step has finished (scoped thread).
        combine(unsafe { buf.bytes_mut(recv.0, recv.1) }, &tmp, c.elem, op);
    }
    if op == Op::Avg {
        let own = segment(count, n, r, size);
        // SAFETY: no transfer is running.
        divide(unsafe { buf.bytes_mut(own.0, own.1) }, c.elem, n);
    }
    Ok(())
}

/// Ring all-gather in place over `buf` (`count` elements), starting from
/// this rank's segment `rank`.
fn ring_all_gather(c: &Ctx<'_>, buf: Raw, count: usize) -> Result<()> {
    let (n, r, size) = (c.mesh.world, c.mesh.rank, c.elem.itemsize());
    for step in 0..n - 1 {
        let send = segment(count, n, (r + n - step) % n, size);
        let recv = segment(count, n, (r + 2 * n - step - 1) % n, size);
        // SAFETY: the received segment differs from the one being sent.
        ring_step(c, buf, send, unsafe { buf.bytes_mut(recv.0, recv.1) })?;
    }
    Ok(())
}

/// All-reduce in place over `buf`.
pub(crate) fn all_reduce(c: &Ctx<'_>, buf: Raw, count: usize, op: Op) -> Result<()> {
    if c.mesh.world == 1 {
        if op == Op::Avg {
            // SAFETY: nothing else uses the buffer.
            divide(unsafe { buf.bytes_mut(0, buf.len) }, c.elem, 1);
        }
        return Ok(());
    }
    ring_reduce_scatter(c, buf, count, op)?;
    ring_all_gather(c, buf, count)
}

/// All-gather: `buf` holds `world` blocks of `count`, this rank's own
/// already in place.
pub(crate) fn all_gather(c: &Ctx<'_>, buf: Raw, count: usize) -> Result<()> {
    if c.mesh.world == 1 {
        return Ok(());
    }
    ring_all_gather(c, buf, count * c.mesh.world)
}

/// Reduce-scatter: reduces the `world` blocks of `work` (a copy of the
/// send buffer) and returns this rank's block's byte range in it.
pub(crate) fn reduce_scatter(c: &Ctx<'_>, work: Raw, block: usize, op: Op) -> Result<(usize, usize)> {
    let (n, r, size) = (c.mesh.world, c.mesh.rank, c.elem.itemsize());
    if n == 1 {
        if op == Op::Avg {
            // SAFETY: nothing else uses the buffer.
            divide(unsafe { work.bytes_mut(0, work.len) }, c.elem, 1);
        }
        return Ok((0, block * size));
    }
    ring_reduce_scatter(c, work, block * n, op)?;
    Ok(segment(block * n, n, r, size))
}

/// Broadcast: root sends `buf` to every rank; the others receive it.
pub(crate) fn broadcast(c: &Ctx<'_>, buf: Raw, root: usize) -> Result<()> {
    if c.mesh.rank == root {
        // SAFETY: only read while the sends run.
        let data = unsafe { buf.bytes(0, buf.len) };
        (0..c.mesh.world).filter(|&j| j != root).try_for_each(|j| c.mesh.send(c.what, j, &c.header, data))
    } else {
        // SAFETY: nothing else uses the buffer.
        c.mesh.recv(c.what, root, &c.header, unsafe { buf.bytes_mut(0, buf.len) })
    }
}

/// Reduce: every rank sends `acc` (its copy of the send buffer) to root,
/// which reduces into its own `acc`.
pub(crate) fn reduce(c: &Ctx<'_>, acc: &mut [u8], root: usize, op: Op) -> Result<()> {
    let n = c.mesh.world;
    if c.mesh.rank != root {
        return c.mesh.send(c.what, root, &c.header, acc);
    }
    let mut tmp = vec![0u8; acc.len()];
    for j in (0..n).filter(|&j| j != root) {
        c.mesh.recv(c.what, j, &c.header, &mut tmp)?;
        combine(acc, &tmp, c.elem, op);
    }
    if op == Op::Avg {
        divide(acc, c.elem, n);
    }
    Ok(())
}

/// All-to-all between separate buffers of `world` blocks of `block` bytes.
/// Rank r sends to r+1, r+2, ... while receiving from r-1, r-2, ..., the
/// order in which every pair meets.
pub(crate) fn all_to_all(c: &Ctx<'_>, send: Raw, recv: Raw, block: usize) -> Result<()> {
    let (n, r) = (c.mesh.world, c.mesh.rank);
    // SAFETY: send and recv do not overlap (the ABI's precondition, checked
    // when enqueued); each block of recv is written once.
    unsafe { move_bytes(send.addr + r * block, recv.addr + r * block, block) };
    std::thread::scope(|s| {
        let sender = s.spawn(|| {
            (1..n).try_for_each(|k| {
                let j = (r + k) % n;
                // SAFETY: send is only read.
                c.mesh.send(c.what, j, &c.header, unsafe { send.bytes(j * block, (j + 1) * block) })
            })
        });
        let received = (1..n).try_for_each(|k| {
            let j = (r + n - k) % n;
            // SAFETY: distinct blocks of recv, written one at a time.
            c.mesh.recv(c.what, j, &c.header, unsafe { recv.bytes_mut(j * block, (j + 1) * block) })
        });
        let sent =
            sender.join().unwrap_or_else(|_| Err(crate::error::Error::internal("sim: sender panicked")));
        received.and(sent)
    })
}

/// Sends `buf` to `peer`.
pub(crate) fn send(c: &Ctx<'_>, buf: Raw, peer: usize) -> Result<()> {
    // SAFETY: only read.
    c.mesh.send(c.what, peer, &c.header, unsafe { buf.bytes(0, buf.len) })
}

/// Receives into `buf` from `peer`.
pub(crate) fn recv(c: &Ctx<'_>, buf: Raw, peer: usize) -> Result<()> {
    // SAFETY: nothing else uses the buffer.
    c.mesh.recv(c.what, peer, &c.header, unsafe { buf.bytes_mut(0, buf.len) })
}
