//! Validating an operation's buffers and enqueueing it on a stream: the
//! [`Runtime`] methods behind the `TFL_Collectives` operations, and groups.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use torchfl_ffi::TFL_DType;

use super::reduce::{elem_from_ffi, Op};
use super::transport::Header;
use super::{Comm, Kind, Pending, Raw, ReduceOp};
use crate::error::{Error, Result};
use crate::runtime::stream::{lock, Work};
use crate::runtime::{Runtime, StreamHandle};

/// An operation's arguments as the ABI passes them.
#[derive(Debug, Clone, Copy)]
pub struct CollArgs {
    /// Send buffer (device pointer), or 0 where the ABI allows NULL.
    pub send: u64,
    /// Receive buffer (device pointer), or 0 where the ABI allows NULL.
    pub recv: u64,
    /// Elements, as the operation counts them.
    pub count: usize,
    /// Element type.
    pub dtype: TFL_DType,
    /// `TFL_ReduceOp` (ignored by operations without one).
    pub op: ReduceOp,
    /// Root or peer rank (ignored by operations without one).
    pub rank: i32,
    /// `None`: synchronous.
    pub stream: Option<StreamHandle>,
}

/// Which operation [`Runtime::collective`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollOp {
    /// `all_reduce`
    AllReduce,
    /// `broadcast`
    Broadcast,
    /// `reduce`
    Reduce,
    /// `all_gather`
    AllGather,
    /// `reduce_scatter`
    ReduceScatter,
    /// `all_to_all`
    AllToAll,
    /// `send`
    Send,
    /// `recv`
    Recv,
}

impl CollOp {
    fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "all_reduce",
            Self::Broadcast => "broadcast",
            Self::Reduce => "reduce",
            Self::AllGather => "all_gather",
            Self::ReduceScatter => "reduce_scatter",
            Self::AllToAll => "all_to_all",
            Self::Send => "send",
            Self::Recv => "recv",
        }
    }

    fn code(self) -> u8 {
        match self {
            Self::AllReduce => 1,
            Self::Broadcast => 2,
            Self::Reduce => 3,
            Self::AllGather => 4,
            Self::ReduceScatter => 5,
            Self::AllToAll => 6,
            Self::Send | Self::Recv => 7,
        }
    }
}

impl Runtime {
    /// Reports `error` as an asynchronous failure of `device`: its next
    /// synchronize returns it (a non-blocking communicator's failure to
    /// join, which no queued operation may carry). Queued behind the
    /// default stream's work; in synchronous mode there is nothing to
    /// report it to, and it is dropped.
    pub fn record_async_error(&self, device: usize, error: Error) -> Result<()> {
        let stream = self.stream(self.default_stream(device)?)?;
        if matches!(self.config().mode, crate::runtime::config::Mode::Sync) {
            return Ok(());
        }
        stream.submit(Work::new(move || Err(error))).map(drop)
    }

    fn coll_buf(&self, comm: &Comm, what: &str, which: &str, ptr: u64, bytes: usize) -> Result<Raw> {
        let addr =
            self.resolve(comm.device, ptr, 0, bytes as i128, &format_args!("{what} ({which} buffer)"))?;
        Ok(Raw { addr, len: bytes })
    }

    fn coll_rank(comm: &Comm, what: &str, which: &str, r: i32) -> Result<usize> {
        usize::try_from(r).ok().filter(|&r| r < comm.world).ok_or_else(|| {
            Error::invalid(format!(
                "sim: {what}: {which} {r} is not a rank of this communicator (0..{})",
                comm.world
            ))
        })
    }

    /// Validates one operation and enqueues it on `a.stream` (or runs it,
    /// for a synchronous call), or adds it to the open group.
    pub fn collective(&self, comm: &Arc<Comm>, which: CollOp, a: &CollArgs) -> Result<()> {
        let what = which.name();
        if comm.aborted.load(Ordering::Acquire) {
            return Err(Error::precondition(format!("sim: {what}: the communicator was aborted")));
        }
        comm.check_usable(what)?;
        let elem = elem_from_ffi(a.dtype)?;
        let world = comm.world;
        let bytes = a
            .count
            .checked_mul(elem.itemsize())
            .ok_or_else(|| Error::invalid(format!("sim: {what}: count overflows")))?;
        let all = bytes
            .checked_mul(world)
            .ok_or_else(|| Error::invalid(format!("sim: {what}: count overflows")))?;
        let op = || Op::from_ffi(a.op, elem);
        let me = comm.rank;
        let (kind, op_code, root) = match which {
            CollOp::AllReduce => {
                let op = op()?;
                let send = self.coll_buf(comm, what, "send", a.send, bytes)?;
                (
                    Kind::AllReduce { send, recv: self.coll_buf(comm, what, "recv", a.recv, bytes)?, op },
                    op.code(),
                    0,
                )
            }
            CollOp::Broadcast => {
                let root = Self::coll_rank(comm, what, "root", a.rank)?;
                let send =
                    if me == root { Some(self.coll_buf(comm, what, "send", a.send, bytes)?) } else { None };
                (
                    Kind::Broadcast { send, recv: self.coll_buf(comm, what, "recv", a.recv, bytes)?, root },
                    255,
                    a.rank,
                )
            }
            CollOp::Reduce => {
                let op = op()?;
                let root = Self::coll_rank(comm, what, "root", a.rank)?;
                let recv =
                    if me == root { Some(self.coll_buf(comm, what, "recv", a.recv, bytes)?) } else { None };
                let send = self.coll_buf(comm, what, "send", a.send, bytes)?;
                (Kind::Reduce { send, recv, op, root }, op.code(), a.rank)
            }
            CollOp::AllGather => {
                let send = self.coll_buf(comm, what, "send", a.send, bytes)?;
                (Kind::AllGather { send, recv: self.coll_buf(comm, what, "recv", a.recv, all)? }, 255, 0)
            }
            CollOp::ReduceScatter => {
                let op = op()?;
                let send = self.coll_buf(comm, what, "send", a.send, all)?;
                (
                    Kind::ReduceScatter { send, recv: self.coll_buf(comm, what, "recv", a.recv, bytes)?, op },
                    op.code(),
                    0,
                )
            }
            CollOp::AllToAll => {
                let send = self.coll_buf(comm, what, "send", a.send, all)?;
                let recv = self.coll_buf(comm, what, "recv", a.recv, all)?;
                if send.addr < recv.addr + all && recv.addr < send.addr + all && all > 0 {
                    return Err(Error::invalid("sim: all_to_all: the send and receive buffers overlap"));
                }
                (Kind::AllToAll { send, recv }, 255, 0)
            }
            CollOp::Send | CollOp::Recv => {
                let peer = Self::coll_rank(comm, what, "peer", a.rank)?;
                if peer == me {
                    return Err(Error::invalid(format!("sim: {what}: peer {peer} is this rank")));
                }
                if which == CollOp::Send {
                    (Kind::Send { buf: self.coll_buf(comm, what, "send", a.send, bytes)?, peer }, 255, 0)
                } else {
                    (Kind::Recv { buf: self.coll_buf(comm, what, "recv", a.recv, bytes)?, peer }, 255, 0)
                }
            }
        };
        let header = Header {
            kind: which.code(),
            dtype: (a.dtype.code, a.dtype.bits),
            op: op_code,
            root,
            count: a.count as u64,
        };
        let pending = Pending { kind, name: what, header, elem, count: a.count };
        {
            let mut g = lock(&comm.group);
            if g.depth > 0 {
                match g.stream {
                    Some(s) if s != a.stream => {
                        return Err(Error::invalid(format!(
                            "sim: {what}: every operation of a group must use the same stream"
                        )))
                    }
                    _ => g.stream = Some(a.stream),
                }
                g.ops.push(pending);
                return Ok(());
            }
        }
        self.submit_ops(comm, vec![pending], a.stream)
    }

    /// Opens a group (nestable).
    pub fn group_start(&self, comm: &Comm) -> Result<()> {
        lock(&comm.group).depth += 1;
        Ok(())
    }

    /// Closes a group; the outermost one launches its operations.
    pub fn group_end(&self, comm: &Arc<Comm>) -> Result<()> {
        let (ops, stream) = {
            let mut g = lock(&comm.group);
            if g.depth == 0 {
                return Err(Error::precondition("sim: group_end without group_start"));
            }
            g.depth -= 1;
            if g.depth > 0 {
                return Ok(());
            }
            (std::mem::take(&mut g.ops), g.stream.take().flatten())
        };
        if ops.is_empty() {
            return Ok(());
        }
        self.submit_ops(comm, ops, stream)
    }

    fn submit_ops(&self, comm: &Arc<Comm>, ops: Vec<Pending>, stream: Option<StreamHandle>) -> Result<()> {
        let what = ops.first().map_or("group", |p| p.name);
        let target = match stream {
            Some(h) => Some(self.stream_on(h, comm.device, what)?),
            None => None,
        };
        let ticket = {
            let mut t = lock(&comm.tickets);
            t.0 += 1;
            t.0 - 1
        };
        let c = Arc::clone(comm);
        let job = move || c.run(ticket, &ops);
        match target {
            Some(s) => s.submit(Work::new(job)).map(drop).inspect_err(|_| {
                // Never queued: let later tickets run.
                let mut t = lock(&comm.tickets);
                t.1 = t.1.max(ticket + 1);
                comm.turn.notify_all();
            }),
            None => {
                self.drain_device(self.device(comm.device)?);
                job()
            }
        }
    }
}
