//! Collective communication across processes (the ABI 1.3 collectives
//! table), each process with its own simulated devices.
//!
//! - [`transport`]: loopback TCP: the rendezvous a unique id names, a full
//!   mesh of connections per communicator, framed messages whose headers
//!   catch ranks that issue mismatched collectives;
//! - [`algo`]: ring all-reduce, all-gather and reduce-scatter, direct
//!   broadcast, reduce, all-to-all and send/recv;
//! - [`reduce`]: dtypes and reduction operators over byte buffers;
//! - this file: [`Comm`] and the [`Runtime`] methods that validate an
//!   operation's buffers and enqueue it on a stream.
//!
//! Operations run on the stream's worker like kernels, so they are ordered
//! with kernels, copies and events, and the host runs ahead. A
//! communicator runs its operations in the order they were issued, even
//! when they were enqueued on different streams (a ticket taken at enqueue
//! time), because every rank must meet the same sequence on the wire. A
//! failure (a peer gone, a timeout, a mismatch, an abort) is the
//! operation's error, so the device's next synchronize reports it, and the
//! communicator's sticky error ([`Comm::async_error`]); later operations
//! then fail at once, as a failed NCCL communicator does.
//!
//! Timeouts: `TORCH_FL_SIM_COLL_TIMEOUT` (seconds, default 300) bounds the
//! rendezvous and every wait for a peer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use torchfl_ffi::TFL_DType;

use crate::error::{Error, Result};
use crate::runtime::{Runtime, StreamHandle};
use crate::stream::{lock, Work};

mod algo;
mod reduce;
mod transport;

use algo::{move_bytes, Ctx, Raw};
use reduce::{Elem, Op};
pub use reduce_api::ReduceOp;
use transport::{Header, IdInfo, Mesh};

/// The reduction operators, as the ABI numbers them (re-exported for Rust
/// callers of the [`Runtime`] API).
mod reduce_api {
    /// A `TFL_ReduceOp` value.
    pub type ReduceOp = i32;
}

/// The environment variable holding the timeout in seconds.
pub const TIMEOUT_ENV: &str = "TORCH_FL_SIM_COLL_TIMEOUT";
/// The default timeout: long enough for a slow rank to load and compile.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The configured timeout; an unparsable value is an error naming it.
pub fn timeout() -> Result<Duration> {
    match std::env::var(TIMEOUT_ENV) {
        Err(_) => Ok(DEFAULT_TIMEOUT),
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => Ok(Duration::from_secs_f64(s)),
            _ => Err(Error::invalid(format!(
                "sim: {TIMEOUT_ENV}={v:?}: expected a positive number of seconds"
            ))),
        },
    }
}

/// A unique id for a new group; this process serves its rendezvous.
pub fn unique_id() -> Result<[u8; torchfl_ffi::TFL_UNIQUE_ID_BYTES]> {
    unique_id_with(timeout()?)
}

/// [`unique_id`] whose rendezvous waits at most `timeout` for the ranks.
pub fn unique_id_with(timeout: Duration) -> Result<[u8; torchfl_ffi::TFL_UNIQUE_ID_BYTES]> {
    Ok(transport::start_rendezvous(timeout)?.encode())
}

/// What an operation does, with its buffers resolved.
#[derive(Debug, Clone, Copy)]
enum Kind {
    AllReduce { send: Raw, recv: Raw, op: Op },
    Broadcast { send: Option<Raw>, recv: Raw, root: usize },
    Reduce { send: Raw, recv: Option<Raw>, op: Op, root: usize },
    AllGather { send: Raw, recv: Raw },
    ReduceScatter { send: Raw, recv: Raw, op: Op },
    AllToAll { send: Raw, recv: Raw },
    Send { buf: Raw, peer: usize },
    Recv { buf: Raw, peer: usize },
}

/// One operation of a communicator.
#[derive(Debug, Clone, Copy)]
struct Pending {
    kind: Kind,
    name: &'static str,
    header: Header,
    elem: Elem,
    /// Elements per rank as the header counts them.
    count: usize,
}

/// The operations of an open group.
#[derive(Debug, Default)]
struct Group {
    depth: usize,
    ops: Vec<Pending>,
    stream: Option<Option<StreamHandle>>,
}

/// This process' member of a group of ranks.
#[derive(Debug)]
pub struct Comm {
    mesh: Mesh,
    device: usize,
    /// The first failure; sticky.
    error: Mutex<Option<Error>>,
    /// (issued, completed) operations: an operation runs when `completed`
    /// reaches its ticket.
    tickets: Mutex<(u64, u64)>,
    turn: Condvar,
    group: Mutex<Group>,
    aborted: AtomicBool,
}

pub(crate) fn describe(h: &Header) -> String {
    let name = match h.kind {
        1 => "all_reduce",
        2 => "broadcast",
        3 => "reduce",
        4 => "all_gather",
        5 => "reduce_scatter",
        6 => "all_to_all",
        7 => "send/recv",
        _ => "an unknown operation",
    };
    format!(
        "{name}(count={}, dtype code {} bits {}, op {}, root {})",
        h.count, h.dtype.0, h.dtype.1, h.op, h.root
    )
}

impl Comm {
    /// Joins the group of `id` as `rank` of `world` on `device`; blocks
    /// until all ranks have joined or the timeout.
    pub fn init(
        id: &[u8; torchfl_ffi::TFL_UNIQUE_ID_BYTES],
        world: usize,
        rank: usize,
        device: usize,
    ) -> Result<Arc<Self>> {
        Self::init_with(id, world, rank, device, timeout()?)
    }

    /// [`Comm::init`] with an explicit timeout for the rendezvous and every
    /// later wait for a peer.
    pub fn init_with(
        id: &[u8; torchfl_ffi::TFL_UNIQUE_ID_BYTES],
        world: usize,
        rank: usize,
        device: usize,
        timeout: Duration,
    ) -> Result<Arc<Self>> {
        if world == 0 || rank >= world {
            return Err(Error::invalid(format!("sim: comm_init_rank: rank {rank} is not in 0..{world}")));
        }
        let info = IdInfo::decode(id)?;
        let mesh = Mesh::connect(info, world, rank, timeout)?;
        Ok(Arc::new(Self {
            mesh,
            device,
            error: Mutex::new(None),
            tickets: Mutex::new((0, 0)),
            turn: Condvar::new(),
            group: Mutex::new(Group::default()),
            aborted: AtomicBool::new(false),
        }))
    }

    /// The device the communicator runs on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The first asynchronous failure, if any (it stays set).
    pub fn async_error(&self) -> Option<Error> {
        lock(&self.error).clone()
    }

    /// Fails waiting operations promptly and refuses later ones.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        self.mesh.abort();
        self.record(Error::precondition("sim: the communicator was aborted"));
        let _guard = lock(&self.tickets);
        self.turn.notify_all();
    }

    /// Waits until every operation issued so far has run (or failed).
    pub fn wait_idle(&self) {
        let mut t = lock(&self.tickets);
        while t.1 < t.0 && !self.aborted.load(Ordering::Acquire) {
            t = self.turn.wait(t).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    fn record(&self, e: Error) {
        lock(&self.error).get_or_insert(e);
    }

    fn check_usable(&self, what: &str) -> Result<()> {
        if let Some(e) = lock(&self.error).as_ref() {
            return Err(Error::precondition(format!(
                "sim: {what}: the communicator failed earlier and must be aborted and re-created: {}",
                e.message()
            )));
        }
        Ok(())
    }

    /// Runs `ops` (one operation, or a group) once their turn comes.
    fn run(&self, ticket: u64, ops: &[Pending]) -> Result<()> {
        {
            let mut t = lock(&self.tickets);
            while t.1 != ticket && !self.aborted.load(Ordering::Acquire) {
                t = self.turn.wait(t).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
        let what = ops.first().map_or("group", |p| p.name);
        let result = self.check_usable(what).and_then(|()| self.execute(ops));
        if let Err(e) = &result {
            self.record(e.clone());
        }
        let mut t = lock(&self.tickets);
        t.1 = t.1.max(ticket + 1);
        self.turn.notify_all();
        result
    }

    fn execute(&self, ops: &[Pending]) -> Result<()> {
        let ctx = |p: &Pending| Ctx { mesh: &self.mesh, what: p.name, header: p.header, elem: p.elem };
        // Collectives in order, then the point-to-point operations with one
        // thread per (peer, direction), so that exchanges cannot deadlock.
        for p in ops.iter().filter(|p| !matches!(p.kind, Kind::Send { .. } | Kind::Recv { .. })) {
            run_collective(&ctx(p), p)?;
        }
        let mut lanes: Vec<((usize, bool), Vec<&Pending>)> = Vec::new();
        for p in ops {
            let key = match p.kind {
                Kind::Send { peer, .. } => (peer, true),
                Kind::Recv { peer, .. } => (peer, false),
                _ => continue,
            };
            match lanes.iter_mut().find(|l| l.0 == key) {
                Some(l) => l.1.push(p),
                None => lanes.push((key, vec![p])),
            }
        }
        if lanes.len() == 1 {
            return lanes[0].1.iter().try_for_each(|p| run_p2p(&ctx(p), p));
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = lanes
                .iter()
                .map(|(_, lane)| s.spawn(|| lane.iter().try_for_each(|p| run_p2p(&ctx(p), p))))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| Err(Error::internal("sim: a send/recv thread panicked")))
                })
                .fold(Ok(()), Result::and)
        })
    }
}

fn run_collective(c: &Ctx<'_>, p: &Pending) -> Result<()> {
    let size = p.elem.size();
    match p.kind {
        Kind::AllReduce { send, recv, op } => {
            // SAFETY: both ranges were resolved at enqueue and stay allocated
            // until this work has run.
            unsafe { move_bytes(send.addr, recv.addr, recv.len) };
            algo::all_reduce(c, recv, p.count, op)
        }
        Kind::Broadcast { send, recv, root } => {
            if let Some(send) = send {
                // SAFETY: as above.
                unsafe { move_bytes(send.addr, recv.addr, recv.len) };
            }
            algo::broadcast(c, recv, root)
        }
        Kind::Reduce { send, recv, op, root } => {
            let mut acc = vec![0u8; send.len];
            // SAFETY: as above; `acc` is a host buffer of the same length.
            unsafe { move_bytes(send.addr, acc.as_mut_ptr() as usize, send.len) };
            algo::reduce(c, &mut acc, root, op)?;
            if let Some(recv) = recv {
                // SAFETY: as above.
                unsafe { move_bytes(acc.as_ptr() as usize, recv.addr, recv.len) };
            }
            Ok(())
        }
        Kind::AllGather { send, recv } => {
            // SAFETY: as above; in place when send is block `rank` of recv.
            unsafe { move_bytes(send.addr, recv.addr + c.mesh.rank * send.len, send.len) };
            algo::all_gather(c, recv, p.count)
        }
        Kind::ReduceScatter { send, recv, op } => {
            let mut work = vec![0u8; send.len];
            // SAFETY: as above.
            unsafe { move_bytes(send.addr, work.as_mut_ptr() as usize, send.len) };
            let raw = Raw { addr: work.as_mut_ptr() as usize, len: work.len() };
            let (lo, hi) = algo::reduce_scatter(c, raw, p.count, op)?;
            debug_assert_eq!(hi - lo, p.count * size);
            // SAFETY: as above.
            unsafe { move_bytes(raw.addr + lo, recv.addr, recv.len) };
            Ok(())
        }
        Kind::AllToAll { send, recv } => algo::all_to_all(c, send, recv, p.count * size),
        Kind::Send { .. } | Kind::Recv { .. } => run_p2p(c, p),
    }
}

fn run_p2p(c: &Ctx<'_>, p: &Pending) -> Result<()> {
    match p.kind {
        Kind::Send { buf, peer } => algo::send(c, buf, peer),
        Kind::Recv { buf, peer } => algo::recv(c, buf, peer),
        _ => run_collective(c, p),
    }
}

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
    fn coll_buf(&self, comm: &Comm, what: &str, which: &str, ptr: u64, bytes: usize) -> Result<Raw> {
        let addr =
            self.resolve(comm.device, ptr, 0, bytes as i128, &format_args!("{what} ({which} buffer)"))?;
        Ok(Raw { addr, len: bytes })
    }

    fn coll_rank(comm: &Comm, what: &str, which: &str, r: i32) -> Result<usize> {
        usize::try_from(r).ok().filter(|&r| r < comm.mesh.world).ok_or_else(|| {
            Error::invalid(format!(
                "sim: {what}: {which} {r} is not a rank of this communicator (0..{})",
                comm.mesh.world
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
        let elem = Elem::from_ffi(a.dtype)?;
        let world = comm.mesh.world;
        let bytes = a
            .count
            .checked_mul(elem.size())
            .ok_or_else(|| Error::invalid(format!("sim: {what}: count overflows")))?;
        let all = bytes
            .checked_mul(world)
            .ok_or_else(|| Error::invalid(format!("sim: {what}: count overflows")))?;
        let op = || Op::from_ffi(a.op, elem);
        let me = comm.mesh.rank;
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
