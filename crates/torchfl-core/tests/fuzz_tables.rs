//! Fuzzing plugin validation: random and mutated function tables, identity
//! structs, op tables and strings, built in memory and run through the
//! loader's stages (`fuzz_frames.rs` does call frames). Every input must end
//! in `Ok` or an error: a crash or a panic fails the run.
//!
//! Plugin structs are placed so that they end right before an unreadable
//! page, so a host that reads past what a plugin declares (a table shorter
//! than its struct_size, a count past its array, a string without NUL)
//! faults here instead of passing by luck.
//!
//! `cargo test` runs a bounded number of cases (a few seconds). Longer runs:
//!
//! ```sh
//! TORCHFL_FUZZ_CASES=200000 cargo test --release -p torchfl-core --test fuzz_tables --test fuzz_frames
//! ```
//!
//! (`make fuzz`). A failure prints the shrunk input; add it to
//! `tests/malformed.rs` as a fixture when it is a class of its own.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly
#![cfg(target_os = "linux")]

use std::cell::RefCell;
use std::ffi::{c_char, c_void};
use std::ptr;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use torchfl_core::init::Initialization;
use torchfl_core::{schema, validate, LoadOptions, Opening, Stage};
use torchfl_ffi::*;

/// Cases per property: `TORCHFL_FUZZ_CASES`, else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("TORCHFL_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn runner(default_cases: u32) -> TestRunner {
    TestRunner::new(Config { cases: cases(default_cases), failure_persistence: None, ..Config::default() })
}

// ---------------------------------------------------------------------------
// Memory that ends at an unreadable page
// ---------------------------------------------------------------------------

/// Pages of readable memory followed by one unreadable page.
struct Guarded {
    base: *mut u8,
    len: usize,
    page: usize,
}

impl Guarded {
    fn new(pages: usize) -> Self {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
        let len = pages * page;
        // SAFETY: an anonymous private mapping; the result is checked.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len + page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        // SAFETY: the last page lies inside the mapping just made.
        assert_eq!(unsafe { libc::mprotect(base.cast::<u8>().add(len).cast(), page, libc::PROT_NONE) }, 0);
        Self { base: base.cast(), len, page }
    }

    /// Copies `bytes` so that they end where the unreadable page starts.
    fn place_at_end(&self, bytes: &[u8]) -> usize {
        assert!(bytes.len() <= self.len);
        // SAFETY: the destination range lies in the readable pages.
        unsafe {
            let at = self.base.add(self.len - bytes.len());
            ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len());
            at as usize
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, no longer used.
        unsafe { libc::munmap(self.base.cast(), self.len + self.page) };
    }
}

// ---------------------------------------------------------------------------
// What a case is made of
// ---------------------------------------------------------------------------

/// A data pointer a plugin hands back.
#[derive(Debug, Clone)]
enum Ptr {
    Null,
    /// The string at this index of the case's pool, NUL-terminated.
    Str(usize),
    /// Bytes with no NUL that end at an unreadable page.
    Unterminated,
    /// Any address at all: the host must check before reading.
    Address(usize),
}

/// A function pointer a plugin hands back. Never a random address: one
/// inside executable memory would be called, as the ABI allows.
#[derive(Debug, Clone, Copy)]
enum Func {
    Real,
    Null,
    /// The address of data (a static table).
    Data,
    /// An address no process maps.
    NonCanonical,
}

fn ptr_strategy() -> impl Strategy<Value = Ptr> {
    prop_oneof![
        2 => Just(Ptr::Null),
        6 => (0usize..16).prop_map(Ptr::Str),
        1 => Just(Ptr::Unterminated),
        1 => any::<usize>().prop_map(Ptr::Address),
        1 => prop_oneof![Just(8usize), Just(4096), Just(0xdead_0000), Just(usize::MAX - 7)].prop_map(Ptr::Address),
    ]
}

fn func_strategy() -> impl Strategy<Value = Func> {
    prop_oneof![12 => Just(Func::Real), 1 => Just(Func::Null), 1 => Just(Func::Data), 1 => Just(Func::NonCanonical)]
}

/// Names, symbols and schemas plugins declare, valid and not.
const SEEDS: &[&str] = &[
    "add.Tensor",
    "torch_fl_op_add_Tensor",
    "fx::scale",
    "torch_fl_op_fx__scale",
    "scale(Tensor x, float factor) -> Tensor",
    "scale(Tensor x, float factor -> Tensor",
    "relu_(Tensor(a!) self) -> Tensor(a!)",
    "frobnicate.Tensor",
    "2.4",
    "banana",
    "",
    "aten::add.Tensor",
    "minimal_c",
];

fn string_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::sample::select(SEEDS).prop_map(|s| s.as_bytes().to_vec()),
        3 => proptest::collection::vec(any::<u8>(), 0..48),
        2 => (proptest::sample::select(SEEDS), proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4))
            .prop_map(|(s, edits)| {
                let mut b = s.as_bytes().to_vec();
                for (at, byte) in edits {
                    if b.is_empty() {
                        b.push(byte);
                    } else {
                        let i = at % b.len();
                        b[i] = byte;
                    }
                }
                b
            }),
        1 => (0usize..2).prop_map(|extra| vec![b'x'; TFL_MAX_STRING_LENGTH + extra]),
    ]
}

fn size_strategy(known: usize) -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => Just(known),
        1 => Just(0usize),
        1 => Just(8usize),
        1 => Just(16usize),
        1 => 0usize..(known + 64),
        1 => Just(TFL_MAX_STRUCT_SIZE + 1),
        1 => any::<usize>(),
    ]
}

#[derive(Debug, Clone)]
struct Entry {
    struct_size: usize,
    name: Ptr,
    symbol: Ptr,
    kernel: Func,
    flags: u64,
    schema: Ptr,
    infer: Func,
}

fn entry_strategy() -> impl Strategy<Value = Entry> {
    (
        size_strategy(56),
        ptr_strategy(),
        ptr_strategy(),
        func_strategy(),
        any::<u64>(),
        ptr_strategy(),
        prop_oneof![4 => Just(Func::Null), 1 => func_strategy()],
    )
        .prop_map(|(struct_size, name, symbol, kernel, flags, schema, infer)| Entry {
            struct_size,
            name,
            symbol,
            kernel,
            flags,
            schema,
            infer,
        })
}

/// A whole plugin, as the host sees it through its bootstrap function.
#[derive(Debug, Clone)]
struct Case {
    pool: Vec<Vec<u8>>,
    api_returned: Ptr,
    /// Bytes of the table actually there, before an unreadable page.
    api_bytes: usize,
    api_size: usize,
    major: u32,
    minor: u32,
    entries: Vec<Func>,
    info_returned: bool,
    info_bytes: usize,
    info_size: usize,
    info_strings: [Ptr; 5],
    op_status_fails: bool,
    error_message: Ptr,
    ops: Vec<Entry>,
    /// How many of `ops` are in memory; `num_entries` may claim more.
    num_entries: usize,
    entry_size: usize,
    entries_ptr_null: bool,
    device_count: i32,
    device_name: Ptr,
    total_memory: u64,
    null_stream: bool,
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let table = (
        proptest::collection::vec(string_strategy(), 16),
        prop_oneof![8 => Just(Ptr::Str(0)), 1 => Just(Ptr::Null), 1 => any::<usize>().prop_map(Ptr::Address)],
        size_strategy(240),
        size_strategy(240),
        prop_oneof![6 => Just(1u32), 1 => Just(0u32), 1 => Just(2u32), 1 => Just(u32::MAX), 1 => any::<u32>()],
        prop_oneof![6 => Just(1u32), 1 => Just(1000u32), 1 => Just(1001u32), 1 => any::<u32>()],
        proptest::collection::vec(func_strategy(), 28),
    );
    let identity = (
        prop_oneof![9 => Just(true), 1 => Just(false)],
        size_strategy(56),
        size_strategy(56),
        proptest::array::uniform5(ptr_strategy()),
        prop_oneof![9 => Just(false), 1 => Just(true)],
        ptr_strategy(),
    );
    let ops = (
        proptest::collection::vec(entry_strategy(), 0..6),
        prop_oneof![3 => Just(0usize), 2 => 0usize..8, 1 => Just(1usize << 40), 1 => any::<usize>()],
        prop_oneof![4 => Just(56usize), 2 => Just(64usize), 1 => Just(48usize), 1 => 0usize..80, 1 => Just(5000usize)],
        prop_oneof![9 => Just(false), 1 => Just(true)],
    );
    let devices = (
        prop_oneof![3 => Just(1i32), 1 => Just(0i32), 1 => Just(-1i32), 1 => Just(65i32), 1 => 0i32..4],
        ptr_strategy(),
        prop_oneof![3 => Just(1u64 << 30), 1 => Just(0u64), 1 => any::<u64>()],
        prop_oneof![4 => Just(false), 1 => Just(true)],
    );
    (table, identity, ops, devices).prop_map(
        |(
            (pool, api_returned, api_bytes, api_size, major, minor, entries),
            (info_returned, info_bytes, info_size, info_strings, op_status_fails, error_message),
            (ops, num_entries, entry_size, entries_ptr_null),
            (device_count, device_name, total_memory, null_stream),
        )| Case {
            pool,
            api_returned,
            api_bytes: api_bytes.min(4096),
            api_size,
            major,
            minor,
            entries,
            info_returned,
            info_bytes: info_bytes.min(4096),
            info_size,
            info_strings,
            op_status_fails,
            error_message,
            num_entries,
            entry_size,
            entries_ptr_null,
            ops,
            device_count,
            device_name,
            total_memory,
            null_stream,
        },
    )
}

// ---------------------------------------------------------------------------
// The fake plugin: functions that hand back the case's memory
// ---------------------------------------------------------------------------

/// Addresses of the current case's memory, for the fake plugin functions.
#[derive(Default, Clone)]
struct Active {
    api: usize,
    info: usize,
    op_status_fails: bool,
    error_message: usize,
    entries: usize,
    num_entries: usize,
    entry_size: usize,
    device_count: i32,
    device_name: usize,
    total_memory: u64,
    null_stream: bool,
}

thread_local! {
    static ACTIVE: RefCell<Active> = RefCell::new(Active::default());
}

fn active() -> Active {
    ACTIVE.with(|a| a.borrow().clone())
}

/// Data where a function should be, and the opaque error and stream
/// handles of the fake plugin (never written).
static DATA: [u64; 8] = [0x5555; 8];

unsafe extern "C" fn fake_get_api(_host: *const TFL_HostApi) -> *const TFL_PluginApi {
    active().api as *const TFL_PluginApi
}
unsafe extern "C" fn fake_error_code(_e: *const TFL_Error) -> i32 {
    TFL_ERROR_INTERNAL
}
unsafe extern "C" fn fake_error_message(_e: *const TFL_Error) -> *const c_char {
    active().error_message as *const c_char
}
unsafe extern "C" fn fake_error_destroy(_e: *mut TFL_Error) {}
unsafe extern "C" fn fake_get_info() -> *const TFL_PluginInfo {
    active().info as *const TFL_PluginInfo
}
unsafe extern "C" fn fake_initialize(_args: *const TFL_InitArgs) -> *mut TFL_Error {
    ptr::null_mut()
}
unsafe extern "C" fn fake_get_op_table(out: *mut TFL_OpTable) -> *mut TFL_Error {
    let a = active();
    if a.op_status_fails {
        return DATA.as_ptr().cast_mut().cast();
    }
    // SAFETY: the host passes a writable table.
    unsafe {
        (*out).entries = a.entries as *const TFL_OpEntry;
        (*out).num_entries = a.num_entries;
        (*out).entry_size = a.entry_size;
    }
    ptr::null_mut()
}
unsafe extern "C" fn fake_device_count(out: *mut i32) -> *mut TFL_Error {
    // SAFETY: the host passes a writable count.
    unsafe { *out = active().device_count };
    ptr::null_mut()
}
unsafe extern "C" fn fake_device_properties(_d: i32, out: *mut TFL_DeviceProperties) -> *mut TFL_Error {
    let a = active();
    // SAFETY: the host passes writable properties of its struct_size.
    unsafe {
        (*out).name = a.device_name as *const c_char;
        (*out).total_memory = a.total_memory;
    }
    ptr::null_mut()
}
unsafe extern "C" fn fake_default_stream(_d: i32, out: *mut *mut TFL_Stream) -> *mut TFL_Error {
    let stream = if active().null_stream { ptr::null_mut() } else { DATA.as_ptr().cast_mut().cast() };
    // SAFETY: the host passes a writable out-pointer.
    unsafe { *out = stream };
    ptr::null_mut()
}
/// Every other entry: never called by validation, but must be code.
unsafe extern "C" fn fake_other() -> *mut TFL_Error {
    ptr::null_mut()
}
unsafe extern "C" fn fake_kernel(_f: *const TFL_CallFrame) -> *mut TFL_Error {
    ptr::null_mut()
}

/// The C example's operators: (name, symbol, kernel address). Its library
/// is loaded RTLD_GLOBAL, so the in-process loader resolves the symbols.
fn example_ops() -> &'static [(&'static str, &'static str, usize)] {
    static OPS: OnceLock<Vec<(&'static str, &'static str, usize)>> = OnceLock::new();
    OPS.get_or_init(|| {
        let path = torchfl_testkit::c_example_plugin();
        // SAFETY: loading the project's own example plugin.
        let lib = unsafe {
            libloading::os::unix::Library::open(
                Some(&path),
                libloading::os::unix::RTLD_NOW | libc::RTLD_GLOBAL,
            )
        }
        .unwrap();
        let ops: Vec<_> = [
            ("add.Tensor", "torch_fl_op_add_Tensor"),
            ("mul.Tensor", "torch_fl_op_mul_Tensor"),
            ("neg", "torch_fl_op_neg"),
            ("relu", "torch_fl_op_relu"),
            ("fill_.Scalar", "torch_fl_op_fill__Scalar"),
        ]
        .into_iter()
        .map(|(name, symbol)| {
            // SAFETY: only the address is read.
            let address =
                unsafe { lib.get::<*const c_void>(symbol.as_bytes()) }.map(|s| *s as usize).unwrap();
            (name, symbol, address)
        })
        .collect();
        std::mem::forget(lib);
        ops
    })
}

/// The fake for table entry `i` (0 = error_code).
fn real_entry(i: usize) -> usize {
    let f: [usize; 10] = [
        fake_error_code as *const () as usize,
        fake_error_message as *const () as usize,
        fake_error_destroy as *const () as usize,
        fake_get_info as *const () as usize,
        fake_initialize as *const () as usize,
        fake_get_op_table as *const () as usize,
        fake_device_count as *const () as usize,
        fake_device_properties as *const () as usize,
        fake_other as *const () as usize,
        fake_other as *const () as usize,
    ];
    match i {
        0..=9 => f[i],
        13 => fake_default_stream as *const () as usize,
        _ => fake_other as *const () as usize,
    }
}

fn func_address(f: Func, real: usize) -> usize {
    match f {
        Func::Real => real,
        Func::Null => 0,
        Func::Data => DATA.as_ptr() as usize,
        Func::NonCanonical => 0xdead_beef_0000_0000,
    }
}

/// The case laid out in memory: what the fake functions hand back.
struct Laid {
    _regions: Vec<Guarded>,
    _pool: Vec<Vec<u8>>,
}

fn lay_out(case: &Case) -> Laid {
    let pool: Vec<Vec<u8>> = case
        .pool
        .iter()
        .map(|s| {
            let mut z = s.clone();
            z.push(0);
            z
        })
        .collect();
    let unterminated = Guarded::new(1);
    let dangling = unterminated.place_at_end(b"no NUL before the end");
    let address = |p: &Ptr| -> usize {
        match p {
            Ptr::Null => 0,
            Ptr::Str(i) => pool[*i % pool.len()].as_ptr() as usize,
            Ptr::Unterminated => dangling,
            Ptr::Address(a) => *a,
        }
    };
    let word = |v: usize| v.to_ne_bytes();

    // TFL_PluginApi: size, versions, 28 entries; only api_bytes of it exist.
    let mut api = Vec::new();
    api.extend_from_slice(&word(case.api_size));
    api.extend_from_slice(&case.major.to_ne_bytes());
    api.extend_from_slice(&case.minor.to_ne_bytes());
    for (i, f) in case.entries.iter().enumerate() {
        api.extend_from_slice(&word(func_address(*f, real_entry(i))));
    }
    api.truncate(case.api_bytes.max(1));
    let api_region = Guarded::new(1);
    let api_at = api_region.place_at_end(&api);

    let mut info = Vec::new();
    info.extend_from_slice(&word(case.info_size));
    for p in &case.info_strings {
        info.extend_from_slice(&word(address(p)));
    }
    info.extend_from_slice(&word(0b11));
    info.truncate(case.info_bytes.max(1));
    let info_region = Guarded::new(1);
    let info_at = info_region.place_at_end(&info);

    // Op entries every entry_size bytes (at least a word apart), ending at
    // the unreadable page.
    let stride = case.entry_size.clamp(8, 4096);
    let mut table = vec![0u8; stride * case.ops.len()];
    for (i, e) in case.ops.iter().enumerate() {
        let fields = [
            e.struct_size,
            address(&e.name),
            address(&e.symbol),
            func_address(e.kernel, example_ops()[i % example_ops().len()].2),
            e.flags as usize,
            address(&e.schema),
            func_address(e.infer, fake_kernel as *const () as usize),
        ];
        let bytes: Vec<u8> = fields.iter().flat_map(|v| v.to_ne_bytes()).take(stride).collect();
        table[i * stride..i * stride + bytes.len()].copy_from_slice(&bytes);
    }
    let table_region = Guarded::new(table.len().div_ceil(4096).max(1) + 1);
    let table_at = table_region.place_at_end(&table);

    ACTIVE.with(|a| {
        *a.borrow_mut() = Active {
            api: match case.api_returned {
                Ptr::Null => 0,
                Ptr::Address(x) => x,
                Ptr::Str(_) | Ptr::Unterminated => api_at,
            },
            info: if case.info_returned { info_at } else { 0 },
            op_status_fails: case.op_status_fails,
            error_message: address(&case.error_message),
            entries: if case.entries_ptr_null { 0 } else { table_at },
            num_entries: if case.num_entries == 0 { 0 } else { case.num_entries },
            entry_size: case.entry_size,
            device_count: case.device_count,
            device_name: address(&case.device_name),
            total_memory: case.total_memory,
            null_stream: case.null_stream,
        }
    });
    Laid { _regions: vec![unterminated, api_region, info_region, table_region], _pool: pool }
}

/// A well-formed plugin: the C example's operators and a valid identity.
fn valid_case() -> Case {
    let ops = example_ops();
    let mut pool: Vec<Vec<u8>> = ops.iter().map(|o| o.0.as_bytes().to_vec()).collect();
    pool.extend(ops.iter().map(|o| o.1.as_bytes().to_vec()));
    pool.extend(
        ["minimal_c", "vendor", "chip", "0.1.0", "2.4", "scale(Tensor x) -> Tensor"]
            .map(|s| s.as_bytes().to_vec()),
    );
    Case {
        pool,
        api_returned: Ptr::Str(0),
        api_bytes: 240,
        api_size: 240,
        major: 1,
        minor: 1,
        entries: vec![Func::Real; 28],
        info_returned: true,
        info_bytes: 56,
        info_size: 56,
        info_strings: [Ptr::Str(10), Ptr::Str(11), Ptr::Str(12), Ptr::Str(13), Ptr::Str(14)],
        op_status_fails: false,
        error_message: Ptr::Str(11),
        ops: (0..5)
            .map(|i| Entry {
                struct_size: 56,
                name: Ptr::Str(i),
                symbol: Ptr::Str(5 + i),
                kernel: Func::Real,
                flags: 0,
                schema: Ptr::Null,
                infer: Func::Null,
            })
            .collect(),
        num_entries: 5,
        entry_size: 56,
        entries_ptr_null: false,
        device_count: 2,
        device_name: Ptr::Str(12),
        total_memory: 1 << 30,
        null_stream: false,
    }
}

/// One change to a well-formed plugin.
#[derive(Debug, Clone)]
enum Mutation {
    ApiSize(usize),
    ApiBytes(usize),
    Version(u32, u32),
    Entry(usize, Func),
    Info(usize, usize),
    InfoString(usize, Ptr),
    Pool(usize, Vec<u8>),
    Count(usize),
    EntrySize(usize),
    EntryStructSize(usize, usize),
    EntryString(usize, u8, Ptr),
    EntryFunc(usize, bool, Func),
    OpStatus(Ptr),
    Devices(i32, Ptr, u64, bool),
}

fn mutation_strategy() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        size_strategy(240).prop_map(Mutation::ApiSize),
        (0usize..260).prop_map(Mutation::ApiBytes),
        (any::<u32>(), prop_oneof![Just(0u32), Just(1), Just(1001), any::<u32>()])
            .prop_map(|(a, b)| Mutation::Version(a % 3, b)),
        (0usize..28, func_strategy()).prop_map(|(i, f)| Mutation::Entry(i, f)),
        (size_strategy(56), 0usize..64).prop_map(|(a, b)| Mutation::Info(a, b)),
        (0usize..5, ptr_strategy()).prop_map(|(i, p)| Mutation::InfoString(i, p)),
        (0usize..16, string_strategy()).prop_map(|(i, b)| Mutation::Pool(i, b)),
        prop_oneof![0usize..12, Just(5 * 56), Just(1usize << 40), any::<usize>()].prop_map(Mutation::Count),
        prop_oneof![Just(48usize), Just(64), 0usize..80, Just(5000)].prop_map(Mutation::EntrySize),
        (0usize..5, size_strategy(56)).prop_map(|(i, n)| Mutation::EntryStructSize(i, n)),
        (0usize..5, 0u8..3, ptr_strategy()).prop_map(|(i, w, p)| Mutation::EntryString(i, w, p)),
        (0usize..5, any::<bool>(), func_strategy()).prop_map(|(i, w, f)| Mutation::EntryFunc(i, w, f)),
        ptr_strategy().prop_map(Mutation::OpStatus),
        (prop_oneof![Just(0i32), Just(-1), Just(65), 0i32..4], ptr_strategy(), any::<u64>(), any::<bool>())
            .prop_map(|(n, p, m, s)| Mutation::Devices(n, p, m % 3, s)),
    ]
}

fn apply(mut c: Case, mutations: Vec<Mutation>) -> Case {
    for m in mutations {
        match m {
            Mutation::ApiSize(n) => c.api_size = n,
            Mutation::ApiBytes(n) => c.api_bytes = n,
            Mutation::Version(a, b) => (c.major, c.minor) = (a, b),
            Mutation::Entry(i, f) => c.entries[i] = f,
            Mutation::Info(size, bytes) => (c.info_size, c.info_bytes) = (size, bytes),
            Mutation::InfoString(i, p) => c.info_strings[i] = p,
            Mutation::Pool(i, b) => c.pool[i] = b,
            Mutation::Count(n) => c.num_entries = n,
            Mutation::EntrySize(n) => c.entry_size = n,
            Mutation::EntryStructSize(i, n) => c.ops[i].struct_size = n,
            Mutation::EntryString(i, 0, p) => c.ops[i].name = p,
            Mutation::EntryString(i, 1, p) => c.ops[i].symbol = p,
            Mutation::EntryString(i, _, p) => c.ops[i].schema = p,
            Mutation::EntryFunc(i, true, f) => c.ops[i].kernel = f,
            Mutation::EntryFunc(i, false, f) => c.ops[i].infer = f,
            Mutation::OpStatus(p) => (c.op_status_fails, c.error_message) = (true, p),
            Mutation::Devices(n, p, m, s) => {
                (c.device_count, c.device_name, c.total_memory, c.null_stream) = (n, p, m, s);
            }
        }
    }
    c
}

/// Random plugins, and well-formed ones with a few mutations.
fn plugin_strategy() -> impl Strategy<Value = Case> {
    prop_oneof![
        1 => case_strategy(),
        3 => proptest::collection::vec(mutation_strategy(), 0..4).prop_map(|m| apply(valid_case(), m)),
    ]
}

/// How many cases got through each stage, to show the fuzzing reaches the
/// later ones.
static PASSED: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];

/// Runs every loading stage the case gets through.
fn validate(case: &Case) {
    let laid = lay_out(case);
    let options = LoadOptions::default();
    let mut opening = Opening::in_process(fake_get_api, &options);
    for stage in [Stage::Handshake, Stage::FunctionTable, Stage::Identity, Stage::OpTable] {
        if opening.run_to(stage).is_err() {
            drop(laid);
            return;
        }
        PASSED[stage as usize].fetch_add(1, Ordering::Relaxed);
    }
    if let Ok(library) = opening.finish() {
        // The initialization stages, without joining the process' plugins.
        if let Ok(mut init) = Initialization::new(library, &options) {
            for stage in [Stage::Initialize, Stage::Devices, Stage::Streams] {
                if init.run_to(stage).is_err() {
                    break;
                }
                PASSED[stage as usize].fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    drop(laid);
}

#[test]
fn random_and_mutated_plugins_are_refused_or_loaded_never_crash() {
    runner(1500)
        .run(&plugin_strategy(), |case| {
            validate(&case);
            Ok(())
        })
        .unwrap();
    let passed: Vec<usize> = PASSED.iter().map(|n| n.load(Ordering::Relaxed)).collect();
    eprintln!("cases past each stage (file..streams): {passed:?}");
    assert!(passed[Stage::OpTable as usize] > 0 && passed[Stage::Streams as usize] > 0, "{passed:?}");
}

#[test]
fn the_well_formed_case_loads() {
    let case = valid_case();
    let laid = lay_out(&case);
    let options = LoadOptions::default();
    let library = Opening::in_process(fake_get_api, &options).finish().unwrap();
    assert_eq!(library.info().name, "minimal_c");
    assert_eq!(library.ops().len(), 5);
    let mut init = Initialization::new(library, &options).unwrap();
    init.run_to(Stage::Streams).unwrap();
    assert_eq!(init.devices().len(), 2);
    drop(laid);
}

#[test]
fn random_schemas_parse_or_are_refused() {
    let text = prop_oneof![
        string_strategy().prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        "[a-zA-Z_:.()\\[\\]?!*,= ->|0-9'\"]{0,80}".prop_map(|s| s),
    ];
    runner(3000)
        .run(&(text, any::<bool>()), |(text, infer)| {
            let _ = schema::parse(&text);
            let _ = validate::check_custom_schema("fx::scale", &text, infer);
            Ok(())
        })
        .unwrap();
}
