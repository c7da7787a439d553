//! Collective communication through a plugin's collectives table (ABI 1.3).
//!
//! [`Plugin::collectives`] is `None` for a plugin without the table (older
//! than 1.3, a NULL `get_collectives`, or one that reported an error for
//! it); the host then runs collectives through host memory. Otherwise it
//! creates unique ids and [`Communicator`]s, whose operations enqueue on a
//! stream of the communicator's device.
//!
//! A communicator's settings ([`CommConfig`]: the timeout and blocking or
//! non-blocking creation) reach a plugin through the optional
//! `comm_init_rank_config` entry of ABI 1.5. A plugin without it (older than
//! 1.5, or leaving it NULL) gets `comm_init_rank`: creation then always
//! blocks, the plugin uses its own timeout, and the caller enforces the one
//! it wants ([`Collectives::has_config`] tells which case applies).
//!
//! The operations take raw device pointers, as PyTorch's process groups
//! hand over `tensor.data_ptr()`: the core does not know the shim's
//! allocations, so it cannot check that a pointer lies in one, and the
//! operations are `unsafe fn`s whose contract says so. What the core checks
//! is what it can: ranks, roots and peers in range, element counts whose
//! byte size does not overflow, a communicator not yet destroyed. A plugin
//! checks the pointers against its own allocations (the simulator does).
//!
//! Thread-safety follows the header: operations on one communicator are
//! serialized here (one lock per communicator), while [`Communicator::abort`]
//! and [`Communicator::async_error`] run from any thread at any time, also
//! while an operation blocks, which is how a watchdog unblocks a hung rank.
//! Every call is recorded in flight and refused in a bad fork, like every
//! other plugin call.
//!
//! # Adding a collective
//!
//! The data-moving collectives are listed once, in [`for_each_collective!`](crate::for_each_collective):
//! one entry there gives the core's [`Communicator`] method (with its
//! checks), the entry's type in the validated table the core reads from the
//! plugin, and the method of `torch_fl._native.Communicator`. Dtypes and
//! reduction operators cross into Python as the ABI's codes, from the ABI
//! crate's `TFL_DTYPE_TORCH_NAMES` and `TFL_REDUCE_OP_TORCH_NAMES`. A new
//! collective still touches, besides its table entry:
//!
//! 1. the ABI: `crates/torchfl-ffi/include/torch_fl/plugin.h`, its Rust
//!    mirror (`TFL_Collectives` in `crates/torchfl-ffi/src/lib.rs`) and the
//!    layout test (`crates/torchfl-ffi/tests/layout.rs`);
//! 2. the stub line in `python/torch_fl/_native.pyi` (this crate's tests
//!    render it from the table and fail until the stub has it; stubtest
//!    checks the rest);
//! 3. the Python backend (`python/torch_fl/distributed/`): `NativeComm` in
//!    `_native_comm.py`, `StagedComm` in `_staged.py` (the gloo fallback),
//!    and the `_Comm` protocol and c10d method in `_backend.py`;
//! 4. the plugins implementing it: the simulator
//!    (`crates/torchfl-sim/src/abi/collectives.rs` and
//!    `src/runtime/collectives/`).

use std::ffi::CStr;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::Duration;

use torchfl_ffi::*;

use crate::error::{Error, PluginStatus, Result};
use crate::ffi::{AbiArg, CollTable};
use crate::plugin::{Calling, Plugin};

pub use torchfl_ffi::TFL_DType;

/// A reduction operator (`TFL_ReduceOp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum divided by the world size.
    Avg,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [Self; 5] = [Self::Sum, Self::Prod, Self::Min, Self::Max, Self::Avg];

    /// The operator of a `TFL_ReduceOp` value (what the host's Python
    /// passes, from `torch_fl._native.REDUCE_OPS`); `None` for another.
    pub fn from_raw(raw: TFL_ReduceOp) -> Option<Self> {
        Self::ALL.into_iter().find(|op| op.raw() == raw)
    }

    /// The `TFL_ReduceOp` value.
    pub fn raw(self) -> TFL_ReduceOp {
        match self {
            Self::Sum => TFL_REDUCE_SUM,
            Self::Prod => TFL_REDUCE_PROD,
            Self::Min => TFL_REDUCE_MIN,
            Self::Max => TFL_REDUCE_MAX,
            Self::Avg => TFL_REDUCE_AVG,
        }
    }

    /// The name in `torch.distributed.ReduceOp` (`"SUM"`), from the ABI's
    /// [`TFL_REDUCE_OP_TORCH_NAMES`].
    pub fn torch_name(self) -> &'static str {
        TFL_REDUCE_OP_TORCH_NAMES.iter().find(|(v, _)| *v == self.raw()).map_or("?", |(_, n)| *n)
    }
}

/// The dtypes the collectives take: those of [`TFL_DTYPE_TORCH_NAMES`] but
/// unsigned integers wider than 8 bits and complex numbers.
pub fn collective_dtype(dtype: TFL_DType) -> bool {
    dtype.lanes == 1
        && match dtype.code {
            TFL_DTYPE_UINT => dtype.bits == 8,
            TFL_DTYPE_COMPLEX => false,
            _ => dtype.torch_name().is_some(),
        }
}

/// A unique id: what every rank passes to [`Collectives::init_rank`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; TFL_UNIQUE_ID_BYTES]);

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

impl UniqueId {
    /// An id from bytes received from rank 0; `None` when the length is not
    /// [`TFL_UNIQUE_ID_BYTES`].
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }
}

/// Settings of a new communicator: ABI 1.5's `TFL_CommConfig`, passed by
/// [`Collectives::init_rank_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommConfig {
    /// How long the communicator waits for its peers: the rendezvous and
    /// every later wait for a peer. `None` (or zero): the plugin's default.
    /// Sent in whole milliseconds, rounded up.
    pub timeout: Option<Duration>,
    /// `true`: creation returns once every rank has joined. `false`
    /// (NCCL's `blocking = 0`): it returns at once; joining completes in the
    /// background, operations issued meanwhile wait for it, and a failure
    /// to join becomes the communicator's asynchronous error
    /// ([`Communicator::async_error`]). Honoured only when
    /// [`Collectives::has_config`]; otherwise creation blocks.
    pub blocking: bool,
}

impl Default for CommConfig {
    /// The plugin's default timeout, blocking: what `comm_init_rank` does.
    fn default() -> Self {
        Self { timeout: None, blocking: true }
    }
}

impl CommConfig {
    /// The ABI struct, its `struct_size` covering every 1.5 field.
    fn to_raw(self) -> TFL_CommConfig {
        let timeout_ms = self.timeout.map_or(0, |d| {
            // Round up, so that a sub-millisecond timeout is not "default".
            u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
        });
        TFL_CommConfig {
            struct_size: struct_size!(TFL_CommConfig, blocking),
            timeout_ms,
            blocking: i32::from(self.blocking),
        }
    }
}

/// A plugin's collectives, from [`Plugin::collectives`].
#[derive(Debug, Clone, Copy)]
pub struct Collectives<'a> {
    plugin: &'a Arc<Plugin>,
}

impl Plugin {
    /// The plugin's collectives, or `None` when it offers none.
    pub fn collectives(self: &Arc<Self>) -> Option<Collectives<'_>> {
        self.collectives.is_some().then_some(Collectives { plugin: self })
    }

    /// Whether the plugin offers collectives (ABI 1.3).
    pub fn has_collectives(&self) -> bool {
        self.collectives.is_some()
    }

    /// Whether the plugin's collectives take communicator settings (ABI
    /// 1.5's `comm_init_rank_config`); see [`Collectives::has_config`].
    pub fn has_comm_config(&self) -> bool {
        self.collectives.as_ref().is_some_and(|t| t.comm_init_rank_config.is_some())
    }

    /// The gate of every collectives call: refused in a bad fork, recorded
    /// in flight while the guard lives.
    fn coll_gate(&self, function: &'static CStr) -> Result<(Calling<'_>, &CollTable)> {
        let calling = self.table(function)?;
        let table = self.collectives.as_ref().ok_or_else(|| Error::Unimplemented {
            plugin: self.label().to_owned(),
            what: "collectives (the plugin has no collectives table)".to_owned(),
        })?;
        Ok((calling, table))
    }
}

impl Collectives<'_> {
    /// Creates a unique id for a new group (in one process, rank 0's).
    pub fn unique_id(&self) -> Result<UniqueId> {
        let (calling, t) = self.plugin.coll_gate(c"get_unique_id")?;
        let mut id = TFL_UniqueId { bytes: [0; TFL_UNIQUE_ID_BYTES] };
        // SAFETY: the entry was found in executable memory at load; `id` is
        // a writable host struct.
        let status = unsafe { (t.get_unique_id)(&mut id) };
        calling.coll_check(status).map_err(|s| self.plugin.runtime_error("get_unique_id", s))?;
        Ok(UniqueId(id.bytes))
    }

    /// Whether [`Collectives::init_rank_with`] reaches the plugin with its
    /// settings (the plugin fills ABI 1.5's `comm_init_rank_config`, and
    /// both sides speak 1.5). When `false`, creation always blocks and the
    /// plugin applies its own timeout: a caller that wants another one
    /// enforces it itself (by aborting the communicator).
    pub fn has_config(&self) -> bool {
        self.plugin.has_comm_config()
    }

    /// Joins the group `id` as `rank` of `world_size` on `device`; blocks
    /// until every rank joined or the plugin's timeout passed. Calls the
    /// 1.3 entry `comm_init_rank` whatever the plugin's minor, which the ABI
    /// defines to do what [`Collectives::init_rank_with`] with
    /// [`CommConfig::default`] does.
    pub fn init_rank(&self, id: &UniqueId, world_size: i32, rank: i32, device: i32) -> Result<Communicator> {
        self.create(id, world_size, rank, device, None)
    }

    /// Joins the group `id` as `rank` of `world_size` on `device` with
    /// `config`: through `comm_init_rank_config` when the plugin offers it
    /// ([`Collectives::has_config`]), else through `comm_init_rank`, which
    /// blocks until every rank joined or the plugin's own timeout passed
    /// (non-blocking creation is then not available, and `config.timeout`
    /// is the caller's to enforce).
    pub fn init_rank_with(
        &self,
        id: &UniqueId,
        world_size: i32,
        rank: i32,
        device: i32,
        config: &CommConfig,
    ) -> Result<Communicator> {
        self.create(id, world_size, rank, device, Some(config))
    }

    /// `config`: through `comm_init_rank_config` when the plugin has it.
    fn create(
        &self,
        id: &UniqueId,
        world_size: i32,
        rank: i32,
        device: i32,
        config: Option<&CommConfig>,
    ) -> Result<Communicator> {
        self.plugin.check_device(device)?;
        if world_size < 1 || !(0..world_size).contains(&rank) {
            return Err(Error::InvalidCall {
                plugin: self.plugin.label().to_owned(),
                reason: format!(
                    "comm_init_rank: rank {rank} is not in 0..{world_size} (world size {world_size})"
                ),
            });
        }
        let raw_id = TFL_UniqueId { bytes: id.0 };
        let mut comm: *mut TFL_Comm = std::ptr::null_mut();
        let with_config = self.plugin.collectives.as_ref().and_then(|t| t.comm_init_rank_config);
        let function = if let (Some(init), Some(config)) = (with_config, config) {
            let raw_config = config.to_raw();
            let (calling, _) = self.plugin.coll_gate(c"comm_init_rank_config")?;
            // SAFETY: the entry was found in executable memory at load;
            // `raw_id`, `raw_config` and `comm` are host values valid for
            // the call.
            let status = unsafe { init(&raw_id, world_size, rank, device, &raw_config, &mut comm) };
            calling.coll_check(status).map_err(|s| self.plugin.runtime_error("comm_init_rank_config", s))?;
            "comm_init_rank_config"
        } else {
            let (calling, t) = self.plugin.coll_gate(c"comm_init_rank")?;
            // SAFETY: entry checked at load; `raw_id` and `comm` are host
            // values valid for the call.
            let status = unsafe { (t.comm_init_rank)(&raw_id, world_size, rank, device, &mut comm) };
            calling.coll_check(status).map_err(|s| self.plugin.runtime_error("comm_init_rank", s))?;
            "comm_init_rank"
        };
        if comm.is_null() {
            return Err(Error::InvalidCall {
                plugin: self.plugin.label().to_owned(),
                reason: format!("{function} succeeded but returned a NULL communicator"),
            });
        }
        Ok(Communicator {
            plugin: Arc::clone(self.plugin),
            raw: comm,
            device,
            rank,
            world_size,
            serial: Mutex::new(()),
            live: RwLock::new(true),
        })
    }
}

/// This process' member of a group of ranks. Dropping it destroys it.
pub struct Communicator {
    plugin: Arc<Plugin>,
    raw: *mut TFL_Comm,
    device: i32,
    rank: i32,
    world_size: i32,
    /// Serializes the operations, as the header requires of the host.
    serial: Mutex<()>,
    /// False once destroyed; abort and the async-error query hold it for
    /// reading, destroy for writing, so neither can meet a freed handle.
    live: RwLock<bool>,
}

// SAFETY: the handle is opaque; the header allows calls from any thread as
// long as operations are serialized, which `serial` does.
unsafe impl Send for Communicator {}
// SAFETY: as for Send.
unsafe impl Sync for Communicator {}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Communicator({}:{} rank {}/{} {:p})",
            self.plugin.name(),
            self.device,
            self.rank,
            self.world_size,
            self.raw
        )
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The collectives that move data: the one table of them. Each entry is
/// the operation's name (its `TFL_Collectives` entry), its documentation,
/// the safety clause of its buffers, its arguments in the entry's order
/// (the core's types; the entry takes `comm` and `stream` after them) and
/// the checks the core makes before calling the plugin (methods of a
/// private `Checks`: `root`, `peer`, `elements`, `blocks`).
///
/// `for_each_collective!(callback)` calls `callback! { [] entry... }`;
/// `for_each_collective!(callback, tokens...)` passes `tokens` inside the
/// brackets. It expands the core's [`Communicator`] methods, the entries'
/// types in the validated collectives table (`ffi/collectives.rs`), the PyO3
/// methods of `torch_fl._native.Communicator` (`crates/torchfl-python`), and
/// a test renders the `.pyi` stub lines from it.
///
/// See the module documentation for what else a new collective touches.
#[macro_export]
macro_rules! for_each_collective {
    ($callback:ident $(, $($extra:tt)*)?) => {
        $callback! {
            [$($($extra)*)?]
            {
                name: all_reduce,
                doc: "`recv[i] = op(send[i] over ranks)`, `count` elements (in place when `send == recv`).",
                safety: "`send` and `recv` are valid for `count` elements of `dtype`.",
                args: (
                    send: *const ::std::ffi::c_void,
                    recv: *mut ::std::ffi::c_void,
                    count: usize,
                    dtype: $crate::collectives::TFL_DType,
                    op: $crate::collectives::ReduceOp
                ),
                checks: (elements(count, dtype)),
            }
            {
                name: broadcast,
                doc: "`recv = send of root` on every rank, `count` elements.",
                safety: "`send` and `recv` are valid for `count` elements of `dtype`.",
                args: (
                    send: *const ::std::ffi::c_void,
                    recv: *mut ::std::ffi::c_void,
                    count: usize,
                    dtype: $crate::collectives::TFL_DType,
                    root: i32
                ),
                checks: (root(root), elements(count, dtype)),
            }
            {
                name: reduce,
                doc: "`recv on root = op(send over ranks)`, `count` elements.",
                safety: "`send` and `recv` are valid for `count` elements of `dtype`.",
                args: (
                    send: *const ::std::ffi::c_void,
                    recv: *mut ::std::ffi::c_void,
                    count: usize,
                    dtype: $crate::collectives::TFL_DType,
                    op: $crate::collectives::ReduceOp,
                    root: i32
                ),
                checks: (root(root), elements(count, dtype)),
            }
            {
                name: all_gather,
                doc: "`recv = concat(send over ranks)` in rank order; recv holds `world_size * send_count`.",
                safety: "`send` is valid for `send_count` elements of `dtype`, `recv` for `world_size * send_count`.",
                args: (
                    send: *const ::std::ffi::c_void,
                    recv: *mut ::std::ffi::c_void,
                    send_count: usize,
                    dtype: $crate::collectives::TFL_DType
                ),
                checks: (blocks(send_count, dtype)),
            }
            {
                name: reduce_scatter,
                doc: "`recv` (`recv_count` elements) = block `rank` of `op(send over ranks)`.",
                safety: "`send` is valid for `world_size * recv_count` elements of `dtype`, `recv` for `recv_count`.",
                args: (
                    send: *const ::std::ffi::c_void,
                    recv: *mut ::std::ffi::c_void,
                    recv_count: usize,
                    dtype: $crate::collectives::TFL_DType,
                    op: $crate::collectives::ReduceOp
                ),
                checks: (blocks(recv_count, dtype)),
            }
            {
                name: all_to_all,
                doc: "Block j of `send` goes to rank j, as block `rank` of its `recv`.",
                safety: "`send` and `recv` are valid for `world_size * count_per_rank` elements of `dtype` and do \
                         not overlap.",
                args: (
                    send: *const ::std::ffi::c_void,
                    recv: *mut ::std::ffi::c_void,
                    count_per_rank: usize,
                    dtype: $crate::collectives::TFL_DType
                ),
                checks: (blocks(count_per_rank, dtype)),
            }
            {
                name: send,
                doc: "Sends `count` elements at `ptr` to `peer`.",
                safety: "`ptr` is valid for `count` elements of `dtype`.",
                args: (
                    ptr: *const ::std::ffi::c_void,
                    count: usize,
                    dtype: $crate::collectives::TFL_DType,
                    peer: i32
                ),
                checks: (peer(peer), elements(count, dtype)),
            }
            {
                name: recv,
                doc: "Receives `count` elements from `peer` into `ptr`.",
                safety: "`ptr` is valid for `count` elements of `dtype`.",
                args: (
                    ptr: *mut ::std::ffi::c_void,
                    count: usize,
                    dtype: $crate::collectives::TFL_DType,
                    peer: i32
                ),
                checks: (peer(peer), elements(count, dtype)),
            }
        }
    };
}

impl AbiArg for ReduceOp {
    type Raw = TFL_ReduceOp;
    fn abi(self) -> TFL_ReduceOp {
        self.raw()
    }
}

/// The checks of one operation (the `checks` of [`for_each_collective!`]).
struct Checks<'a> {
    comm: &'a Communicator,
    function: &'static str,
}

impl Checks<'_> {
    /// A root in range.
    fn root(&self, r: i32) -> Result<()> {
        self.comm.check_rank(self.function, "root", r)
    }
    /// A peer in range.
    fn peer(&self, r: i32) -> Result<()> {
        self.comm.check_rank(self.function, "peer", r)
    }
    /// `count` elements whose bytes fit the address space.
    fn elements(&self, count: usize, dtype: TFL_DType) -> Result<()> {
        self.comm.check_count(self.function, count, 1, dtype)
    }
    /// `world_size` blocks of `count` elements whose bytes fit.
    fn blocks(&self, count: usize, dtype: TFL_DType) -> Result<()> {
        self.comm.check_count(self.function, count, self.comm.world_size as usize, dtype)
    }
}

/// Expands the table into [`Communicator`]'s methods.
macro_rules! communicator_methods {
    ([] $({
        name: $name:ident,
        doc: $doc:literal,
        safety: $safety:literal,
        args: ($($arg:ident : $ty:ty),* $(,)?),
        checks: ($($check:ident($($carg:ident),*)),* $(,)?),
    })*) => {
        impl Communicator {
            $(
                #[doc = $doc]
                ///
                /// # Safety
                /// The buffers are device pointers of this communicator's
                /// device, valid until `stream` has run the operation (or
                /// the call returned, for a NULL stream), and `stream` is
                /// NULL or a live stream of the device.
                #[doc = $safety]
                #[allow(clippy::too_many_arguments)] // NCCL's signatures
                pub unsafe fn $name(&self, $($arg: $ty,)* stream: *mut TFL_Stream) -> Result<()> {
                    let checks = Checks { comm: self, function: stringify!($name) };
                    $(checks.$check($($carg),*)?;)*
                    // SAFETY: the caller's contract; the entry was checked
                    // at load; the handle is live (checked in run).
                    self.run(Op { comm: self, name: to_cstr!($name) }, |t| unsafe {
                        (t.$name)($($arg.abi(),)* self.raw, stream)
                    })
                }
            )*
        }
    };
}

/// The C string of an identifier.
macro_rules! to_cstr {
    ($name:ident) => {
        match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
            Ok(c) => c,
            Err(_) => c"?",
        }
    };
}

for_each_collective!(communicator_methods);

/// One operation's arguments, checked and ready to call.
struct Op<'a> {
    comm: &'a Communicator,
    name: &'static CStr,
}

impl Communicator {
    /// The device the communicator runs on.
    pub fn device(&self) -> i32 {
        self.device
    }
    /// This process' rank.
    pub fn rank(&self) -> i32 {
        self.rank
    }
    /// The number of ranks.
    pub fn world_size(&self) -> i32 {
        self.world_size
    }
    /// The plugin.
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    fn invalid(&self, function: &str, reason: String) -> Error {
        Error::InvalidCall { plugin: self.plugin.label().to_owned(), reason: format!("{function}: {reason}") }
    }

    fn check_rank(&self, function: &str, what: &str, r: i32) -> Result<()> {
        if (0..self.world_size).contains(&r) {
            Ok(())
        } else {
            Err(self.invalid(
                function,
                format!("{what} {r} is not a rank of this group (0..{})", self.world_size),
            ))
        }
    }

    fn check_count(&self, function: &str, count: usize, blocks: usize, dtype: TFL_DType) -> Result<()> {
        let fits = count
            .checked_mul(blocks)
            .and_then(|n| n.checked_mul(dtype.itemsize().max(1)))
            .is_some_and(|b| b <= isize::MAX as usize);
        if fits {
            Ok(())
        } else {
            Err(self.invalid(function, format!("{count} elements overflow the address space")))
        }
    }

    /// Runs `f` with the table, serialized, on a live communicator.
    fn run(&self, op: Op<'_>, f: impl FnOnce(&CollTable) -> *mut TFL_Error) -> Result<()> {
        let _serial = lock(&op.comm.serial);
        let live = read(&self.live);
        let name = op.name.to_str().unwrap_or("?");
        if !*live {
            return Err(self.invalid(name, "the communicator was destroyed".to_owned()));
        }
        let (calling, t) = self.plugin.coll_gate(op.name)?;
        calling.coll_check(f(t)).map_err(|s| self.plugin.runtime_error(static_name(name), s))
    }

    /// Opens a group of operations (nestable).
    pub fn group_start(&self) -> Result<()> {
        // SAFETY: the handle is live (checked in run); entry checked at load.
        self.run(Op { comm: self, name: c"group_start" }, |t| unsafe { (t.group_start)(self.raw) })
    }

    /// Closes a group; the outermost launches it.
    pub fn group_end(&self) -> Result<()> {
        // SAFETY: as in group_start.
        self.run(Op { comm: self, name: c"group_end" }, |t| unsafe { (t.group_end)(self.raw) })
    }

    /// The communicator's first asynchronous failure, if any. Any thread,
    /// any time; `None` after destroy.
    pub fn async_error(&self) -> Result<Option<PluginStatus>> {
        let live = read(&self.live);
        if !*live {
            return Ok(None);
        }
        let (calling, t) = self.plugin.coll_gate(c"comm_get_async_error")?;
        let mut error: *mut TFL_Error = std::ptr::null_mut();
        // SAFETY: the handle is live while `live` is held; `error` is a
        // writable host pointer.
        let status = unsafe { (t.comm_get_async_error)(self.raw, &mut error) };
        calling.coll_check(status).map_err(|s| self.plugin.runtime_error("comm_get_async_error", s))?;
        Ok(calling.take_error(error))
    }

    /// Aborts: waiting operations fail promptly, later ones are refused.
    /// Any thread, any time; a no-op after destroy.
    pub fn abort(&self) -> Result<()> {
        let live = read(&self.live);
        if !*live {
            return Ok(());
        }
        let (calling, t) = self.plugin.coll_gate(c"comm_abort")?;
        // SAFETY: as in async_error.
        calling
            .coll_check(unsafe { (t.comm_abort)(self.raw) })
            .map_err(|s| self.plugin.runtime_error("comm_abort", s))
    }

    /// Waits for queued operations and releases the communicator; later
    /// calls fail (abort and the error query do nothing). Idempotent.
    pub fn destroy(&self) -> Result<()> {
        let _serial = lock(&self.serial);
        let mut live = self.live.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !*live {
            return Ok(());
        }
        *live = false;
        if crate::fork::in_bad_fork() {
            return Ok(()); // leaked: the plugin must not be called in this child
        }
        let (calling, t) = self.plugin.coll_gate(c"comm_destroy")?;
        // SAFETY: live until now, and no other call can start (`live` is
        // false and held for writing).
        calling
            .coll_check(unsafe { (t.comm_destroy)(self.raw) })
            .map_err(|s| self.plugin.runtime_error("comm_destroy", s))
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            crate::log::plugin_message(self.plugin.label(), TFL_LOG_ERROR, &e.to_string());
        }
    }
}

/// The static name of a collectives entry, as `Error::RuntimeCall` wants.
fn static_name(name: &str) -> &'static str {
    crate::ffi::COLLECTIVE_ENTRIES.iter().copied().find(|n| *n == name).unwrap_or("collectives")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `.pyi` line of each table entry: every argument is an `int` in
    /// Python (pointers, counts, ranks and the codes of dtypes and ops).
    macro_rules! stub_lines {
        ([] $({ name: $name:ident, doc: $doc:literal, safety: $safety:literal, args: ($($arg:ident : $ty:ty),* $(,)?), checks: $checks:tt, })*) => {
            vec![$(format!(
                "    def {}(self, {}stream: int) -> None: ...",
                stringify!($name),
                concat!($(stringify!($arg), ": int, "),*)
            )),*]
        };
    }

    #[test]
    fn the_stub_declares_every_collective_of_the_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../python/torch_fl/_native.pyi");
        let stub = std::fs::read_to_string(path).expect("python/torch_fl/_native.pyi");
        let lines: Vec<String> = for_each_collective!(stub_lines);
        for line in &lines {
            assert!(
                stub.lines().any(|l| l == line),
                "python/torch_fl/_native.pyi lacks the line of a collective of for_each_collective!:\n{line}"
            );
        }
        let declared = stub.lines().filter(|l| l.ends_with("stream: int) -> None: ...")).count();
        assert_eq!(declared, lines.len(), "the stub declares collectives for_each_collective! lacks");
    }

    #[test]
    fn the_default_config_is_what_comm_init_rank_does() {
        let d = CommConfig::default();
        assert_eq!(d, CommConfig { timeout: None, blocking: true });
        let raw = d.to_raw();
        assert_eq!(raw.struct_size, struct_size!(TFL_CommConfig, blocking));
        assert_eq!((raw.timeout_ms, raw.blocking), (0, 1));
    }

    #[test]
    fn timeouts_travel_in_milliseconds_rounded_up() {
        let raw = |timeout: Option<Duration>| CommConfig { timeout, blocking: false }.to_raw();
        assert_eq!(raw(Some(Duration::from_secs(1800))).timeout_ms, 1_800_000);
        assert_eq!(raw(Some(Duration::from_micros(1500))).timeout_ms, 2);
        assert_eq!(raw(Some(Duration::from_nanos(1))).timeout_ms, 1, "not the default");
        assert_eq!(raw(Some(Duration::ZERO)).timeout_ms, 0, "zero is the default");
        assert_eq!(raw(Some(Duration::MAX)).timeout_ms, u64::MAX);
        assert_eq!(raw(None).blocking, 0);
    }
}
