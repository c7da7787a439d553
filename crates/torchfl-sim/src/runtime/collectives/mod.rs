//! Collective communication across processes (the ABI 1.3 collectives
//! table), each process with its own simulated devices.
//!
//! - [`transport`]: TCP: the rendezvous a unique id names, a full
//!   mesh of connections per communicator, framed messages whose headers
//!   catch ranks that issue mismatched collectives;
//! - [`algo`]: ring all-reduce, all-gather and reduce-scatter, direct
//!   broadcast, reduce, all-to-all and send/recv;
//! - [`reduce`]: dtypes and reduction operators over byte buffers;
//! - [`iface`]: the local address the transport listens on;
//! - [`enqueue`]: the [`Runtime`](crate::Runtime) methods that validate an
//!   operation's buffers and enqueue it on a stream;
//! - this file: [`Comm`], a communicator, and how it runs its operations.
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
//! Timeouts: the rendezvous and every wait for a peer are bounded by
//! `TORCH_FL_SIM_COLL_TIMEOUT` (seconds) when it is set, else by the
//! timeout the host asked for (ABI 1.5's `TFL_CommConfig.timeout_ms`, see
//! [`timeout_for`]), else by 300 s. The rendezvous server behind a unique id
//! lives for the variable's timeout (or 300 s), since `get_unique_id` knows
//! no other.
//!
//! Non-blocking creation (`TFL_CommConfig.blocking = 0`, [`Comm::start`]):
//! the [`Comm`] exists before its mesh of connections does; a named thread
//! connects it, operations wait for the connection on the stream worker
//! (in their issue order, as always), and a failure to connect becomes the
//! sticky error. Abort does not wait for the connection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::stream::lock;
use crate::runtime::StreamHandle;

mod algo;
mod enqueue;
mod iface;
mod reduce;
mod transport;

use algo::{move_bytes, Ctx, Raw};
pub use enqueue::{CollArgs, CollOp};
pub use iface::IFNAME_ENV;
use reduce::Op;
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

/// The timeout of a communicator whose host asked for `requested` (ABI
/// 1.5's `timeout_ms`; `None` or zero: no preference): the variable when
/// it is set (an override, for tests and debugging), else `requested`, else
/// [`DEFAULT_TIMEOUT`].
pub fn timeout_for(requested: Option<Duration>) -> Result<Duration> {
    if std::env::var_os(TIMEOUT_ENV).is_some() {
        return timeout();
    }
    Ok(requested.filter(|d| !d.is_zero()).unwrap_or(DEFAULT_TIMEOUT))
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
    elem: DType,
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
    world: usize,
    rank: usize,
    /// Set once connected (at creation, unless created non-blocking).
    mesh: OnceLock<Mesh>,
    /// True while a non-blocking creation is still connecting; guards the
    /// hand-over of `mesh` against a concurrent abort.
    connecting: Mutex<bool>,
    connected: Condvar,
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
        let info = Self::check_args(id, world, rank)?;
        let mesh = Mesh::connect(info, world, rank, timeout)?;
        let comm = Self::unconnected(world, rank, device, false);
        // A new OnceLock: the set cannot fail.
        let _ = comm.mesh.set(mesh);
        Ok(Arc::new(comm))
    }

    /// Creates the communicator without waiting for its group (ABI 1.5's
    /// non-blocking creation): a thread named `sim-coll-connect` joins it
    /// within `timeout`, operations issued meanwhile wait for it, and a
    /// failure to join becomes the sticky error ([`Comm::async_error`]) and
    /// is also handed to `on_failure` (the ABI reports it as the device's
    /// asynchronous error). Invalid arguments and an id this simulator did
    /// not make are still reported here.
    pub fn start(
        id: &[u8; torchfl_ffi::TFL_UNIQUE_ID_BYTES],
        world: usize,
        rank: usize,
        device: usize,
        timeout: Duration,
        on_failure: impl FnOnce(Error) + Send + 'static,
    ) -> Result<Arc<Self>> {
        let info = Self::check_args(id, world, rank)?;
        let comm = Arc::new(Self::unconnected(world, rank, device, true));
        let c = Arc::clone(&comm);
        std::thread::Builder::new()
            .name("sim-coll-connect".to_owned())
            .spawn(move || {
                let outcome = Mesh::connect(info, world, rank, timeout);
                if let Err(e) = c.finish_connect(outcome) {
                    on_failure(e);
                }
            })
            .map_err(|e| {
                Error::internal(format!("sim: comm_init_rank_config: cannot start a thread: {e}"))
            })?;
        Ok(comm)
    }

    fn check_args(id: &[u8; torchfl_ffi::TFL_UNIQUE_ID_BYTES], world: usize, rank: usize) -> Result<IdInfo> {
        if world == 0 || rank >= world {
            return Err(Error::invalid(format!("sim: comm_init_rank: rank {rank} is not in 0..{world}")));
        }
        IdInfo::decode(id)
    }

    fn unconnected(world: usize, rank: usize, device: usize, connecting: bool) -> Self {
        Self {
            world,
            rank,
            mesh: OnceLock::new(),
            connecting: Mutex::new(connecting),
            connected: Condvar::new(),
            device,
            error: Mutex::new(None),
            tickets: Mutex::new((0, 0)),
            turn: Condvar::new(),
            group: Mutex::new(Group::default()),
            aborted: AtomicBool::new(false),
        }
    }

    /// Hands the outcome of a non-blocking connection over; returns the
    /// failure to report, if any (none for a communicator aborted meanwhile,
    /// whose connections are closed at once).
    fn finish_connect(&self, outcome: Result<Mesh>) -> Result<()> {
        let mut connecting = lock(&self.connecting);
        *connecting = false;
        let aborted = self.aborted.load(Ordering::Acquire);
        let reported = match outcome {
            Ok(mesh) => {
                let mesh = self.mesh.get_or_init(|| mesh);
                if aborted {
                    mesh.abort();
                }
                Ok(())
            }
            Err(_) if aborted => Ok(()),
            Err(e) => {
                self.record(e.clone());
                Err(e)
            }
        };
        self.connected.notify_all();
        reported
    }

    /// Waits until the communicator is connected (at once unless created
    /// non-blocking); an error when connecting failed or it was aborted.
    fn wait_connected(&self, what: &str) -> Result<&Mesh> {
        let mut connecting = lock(&self.connecting);
        while *connecting && !self.aborted.load(Ordering::Acquire) {
            connecting = self.connected.wait(connecting).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        drop(connecting);
        if self.aborted.load(Ordering::Acquire) {
            return Err(Error::precondition(format!("sim: {what}: the communicator was aborted")));
        }
        self.mesh.get().ok_or_else(|| match self.async_error() {
            Some(e) => e,
            None => Error::internal(format!("sim: {what}: the communicator has no connections")),
        })
    }

    /// Whether the communicator is connected to its group (always, unless
    /// created non-blocking and still joining, or failed to join).
    pub fn is_connected(&self) -> bool {
        self.mesh.get().is_some()
    }

    /// The device the communicator runs on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// This process' rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The first asynchronous failure, if any (it stays set).
    pub fn async_error(&self) -> Option<Error> {
        lock(&self.error).clone()
    }

    /// Fails waiting operations promptly and refuses later ones. Does not
    /// wait for a non-blocking creation still connecting: its connections
    /// are closed when it completes.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        self.record(Error::precondition("sim: the communicator was aborted"));
        {
            // Under `connecting`, so that a connection completing right now
            // either sees `aborted` or is seen here.
            let _connecting = lock(&self.connecting);
            if let Some(mesh) = self.mesh.get() {
                mesh.abort();
            }
            self.connected.notify_all();
        }
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
        let result = self
            .wait_connected(what)
            .and_then(|mesh| self.check_usable(what).map(|()| mesh))
            .and_then(|mesh| self.execute(mesh, ops));
        if let Err(e) = &result {
            self.record(e.clone());
        }
        let mut t = lock(&self.tickets);
        t.1 = t.1.max(ticket + 1);
        self.turn.notify_all();
        result
    }

    fn execute(&self, mesh: &Mesh, ops: &[Pending]) -> Result<()> {
        let ctx = |p: &Pending| Ctx { mesh, what: p.name, header: p.header, elem: p.elem };
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
    let size = p.elem.itemsize();
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
