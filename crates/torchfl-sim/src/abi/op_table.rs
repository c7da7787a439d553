//! The op table and the exported kernels, expanded from
//! [`for_each_op!`](crate::kernels::for_each_op).
//!
//! Every kernel symbol has the same body, [`kernel_entry`]: decode the frame
//! ([`super::frame`]), run the kernel's validation, enqueue its work. The
//! custom operators' `infer_outputs` functions follow the same shape
//! ([`infer_entry`]). Both are generated per operator from the one table,
//! and each symbol is derived from its operator's name by the build script,
//! so that a name, its symbol, its `TFL_OpEntry` and the kernel it runs
//! cannot drift apart.

use std::ptr::{self, addr_of};
use std::sync::OnceLock;

use torchfl_ffi::{self as ffi, struct_size};
use torchfl_ffi::{TFL_CallFrame, TFL_Error, TFL_OpEntry, TFL_OpTable, TFL_OutputMeta};

use super::frame::{borrow_list, decode_tensor, decode_value, frame_op_name, read_frame, Role};
use super::{check_size, guard, null_arg, opt_stream, runtime};
use crate::error::{Error, Result};
use crate::kernels::{
    activation, amp, attention, conv, fused, index_put, indexing, linalg, loss, nonzero, norm, optim,
    pointwise, pool, random, randperm, reduction, smooth_l1, softmax, threshold, topk, torchvision_ops,
    upsample, vision_pointwise,
};
use crate::kernels::{
    for_each_op, ArgList, Frame, InferFn, KernelFn, OutputList, OutputResizer, Rng, TensorRef,
};
// Language models
use crate::kernels::{fused_adam, isin, positional, sampling, scan, scatter, sort, transcendental};
use crate::runtime::{Runtime, StreamHandle};

// The op table's stride is `size_of::<TFL_OpEntry>()`; it must be the 1.1
// size the entries declare in their struct_size.
const _: () = assert!(
    std::mem::size_of::<TFL_OpEntry>()
        == std::mem::offset_of!(TFL_OpEntry, infer_outputs)
            + std::mem::size_of::<Option<ffi::TFL_InferOutputsFn>>()
);

static OP_TABLE: OnceLock<OpEntries> = OnceLock::new();

struct OpEntries(Vec<TFL_OpEntry>);
// SAFETY: entries hold pointers to 'static C strings and functions only.
unsafe impl Sync for OpEntries {}
// SAFETY: as above.
unsafe impl Send for OpEntries {}

/// # Safety
/// `out` must be NULL or point to a `TFL_OpTable` whose `struct_size` the
/// host has set.
pub(super) unsafe extern "C" fn get_op_table(out: *mut TFL_OpTable) -> *mut TFL_Error {
    guard("get_op_table", || {
        if out.is_null() {
            return Err(null_arg("get_op_table", "out"));
        }
        let all = &OP_TABLE.get_or_init(|| OpEntries(op_entries())).0;
        // A host older than 1.3 would define an external operator from its
        // schema and break the library that owns it: it gets the others.
        let listed = if super::host_abi_minor().is_some_and(|minor| minor >= 3) {
            all.len()
        } else {
            all.len() - NUM_EXTERNAL
        };
        // SAFETY: `out` is valid for the call; fields are written only when
        // the host's struct_size covers them.
        unsafe {
            let size = check_size(
                addr_of!((*out).struct_size),
                struct_size!(TFL_OpTable, entry_size),
                "get_op_table",
            )?;
            wr!(out, TFL_OpTable, size, entries, all.as_ptr());
            wr!(out, TFL_OpTable, size, num_entries, listed);
            // Our entries are `TFL_OpEntry` values of a Vec, laid out
            // size_of apart; with every field 8 bytes wide that is also the
            // 1.1 struct size (asserted at the top of this module).
            wr!(out, TFL_OpTable, size, entry_size, std::mem::size_of::<TFL_OpEntry>());
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Kernel and infer entries
// ---------------------------------------------------------------------------

/// Decodes the host's frame and launches `kernel` on it. Everything the
/// kernel reads stays borrowed from the frame (valid for the call); only
/// what its work needs later is copied, by the kernel.
///
/// # Safety
/// `frame` must be NULL or a valid `TFL_CallFrame` for the duration of the
/// call, as the header specifies.
pub(super) unsafe fn launch_frame(
    rt: &Runtime,
    frame: *const TFL_CallFrame,
    name: &'static str,
    kernel: KernelFn,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let f = unsafe { read_frame(frame, name)? };
    // SAFETY: as above.
    let op_name = unsafe { frame_op_name(&f, name) };
    let op: &str = &op_name;
    let device = rt
        .check_device(i64::from(f.device_index))
        .map_err(|e| Error::invalid(format!("sim: {op}: {}", e.message().trim_start_matches("sim: "))))?;
    let stream = opt_stream(f.stream)
        .ok_or_else(|| Error::invalid(format!("sim: {op}: the frame's stream is NULL")))?;
    // SAFETY: the header guarantees `num_args` argument pointers and
    // `num_outputs` output pointers, each valid for the call.
    let (arg_ptrs, out_ptrs) =
        unsafe { (borrow_list(f.args, f.num_args, &op)?, borrow_list(f.outputs, f.num_outputs, &op)?) };
    let mut args = ArgList::new();
    for (i, &a) in arg_ptrs.iter().enumerate() {
        // SAFETY: as above.
        args.push(unsafe { decode_value(Some(rt), a, op, i)? });
    }
    let mut outputs = OutputList::new();
    for (i, &o) in out_ptrs.iter().enumerate() {
        // SAFETY: as above.
        outputs.push(unsafe { decode_tensor(Some(rt), o, op, Role::Output(i))? });
    }
    // On a capturing stream, decoding was the validation: the launch itself
    // is recorded (ABI 1.7 graphs).
    if record_kernel(rt, stream, frame, name, kernel) {
        return Ok(());
    }
    let op_name = if op.is_empty() { name } else { op };
    let rng = Rng { seed: f.rng_seed, offset: f.rng_offset };
    let host_resizer = f.resize_output.map(|resize| HostResizer { rt, frame, resize, outputs: out_ptrs, op });
    let resizer = host_resizer.as_ref().map(|r| r as &dyn OutputResizer);
    rt.launch_kernel(kernel, &Frame { op_name, device, stream, args: &args, outputs: &outputs, rng, resizer })
}

/// A captured frame: the host keeps it valid and unchanged until the graph
/// and its execs are destroyed (header, "Device graphs").
#[derive(Clone, Copy)]
struct HostFrame(*const TFL_CallFrame);

// SAFETY: the frame is only read, and the host keeps it alive and unchanged
// for as long as any graph or exec holding it exists, on whatever thread
// the graph runs.
unsafe impl Send for HostFrame {}
// SAFETY: as above.
unsafe impl Sync for HostFrame {}

impl HostFrame {
    /// A copy of the frame struct (its pointers still the host's).
    ///
    /// # Safety
    /// The host must still hold the graph the frame was captured into.
    unsafe fn read(self) -> TFL_CallFrame {
        // SAFETY: forwarded contract; the frame's struct_size was checked
        // when it was captured, so the whole 1.0 struct is readable.
        unsafe { self.0.read() }
    }
}

/// Records a kernel launch on a capturing stream (validated as far as
/// decoding goes); false when `stream` does not capture.
fn record_kernel(
    rt: &Runtime,
    stream: StreamHandle,
    frame: *const TFL_CallFrame,
    name: &'static str,
    kernel: KernelFn,
) -> bool {
    if !rt.capturing(stream) {
        return false;
    }
    let frame = HostFrame(frame);
    rt.record(
        stream,
        Box::new(move |seed, base| {
            // SAFETY: a graph runs only while the host holds it.
            let mut copy = unsafe { frame.read() };
            copy.rng_seed = seed;
            copy.rng_offset = base.wrapping_add(copy.rng_offset);
            // SAFETY: `copy` is a frame whose pointers are the captured
            // frame's, valid as above.
            unsafe { launch_frame(runtime()?, &copy, name, kernel) }
        }),
    )
}

/// The host's `resize_output` for one launch.
struct HostResizer<'f> {
    rt: &'f Runtime,
    frame: *const TFL_CallFrame,
    resize: ffi::TFL_ResizeOutputFn,
    outputs: &'f [*mut ffi::TFL_Tensor],
    op: &'f str,
}

impl OutputResizer for HostResizer<'_> {
    fn resize(&self, i: usize, shape: &[i64]) -> Result<TensorRef<'_>> {
        let op = self.op;
        let Some(&descriptor) = self.outputs.get(i) else {
            return Err(Error::invalid(format!("sim: {op}: no output {i} to resize")));
        };
        let ndim =
            i32::try_from(shape.len()).map_err(|_| Error::invalid(format!("sim: {op}: too many dims")))?;
        // SAFETY: the frame is the host's, valid for the whole kernel call
        // (this resizer lives only during the launch); the callback reads
        // `ndim` sizes from `shape` and is called from within the call, as
        // the header requires.
        let code = unsafe { (self.resize)(self.frame, i, ndim, shape.as_ptr()) };
        match code {
            0 => {}
            ffi::TFL_ERROR_OUT_OF_MEMORY => {
                return Err(Error::out_of_memory(format!("sim: {op}: resizing output {i} to {shape:?}")))
            }
            code => {
                return Err(Error::invalid(format!(
                    "sim: {op}: the host could not resize output {i} to {shape:?} (status {code})"
                )))
            }
        }
        // SAFETY: the host rewrote the descriptor it owns; it stays valid
        // for the rest of the call.
        unsafe { decode_tensor(Some(self.rt), descriptor, op, Role::Output(i)) }
    }
}

/// The body of every exported kernel.
///
/// # Safety
/// As for [`launch_frame`].
unsafe fn kernel_entry(name: &'static str, kernel: KernelFn, frame: *const TFL_CallFrame) -> *mut TFL_Error {
    guard(name, || {
        let rt = runtime()?;
        // SAFETY: forwarded contract.
        unsafe { launch_frame(rt, frame, name, kernel) }
    })
}

/// Decodes an `infer_outputs` frame (no data, no stream, no outputs), runs
/// `infer` on it and writes `out[..num_outputs]`, all of it or nothing.
///
/// # Safety
/// `frame` must be NULL or a valid `TFL_CallFrame` for the duration of the
/// call, with NULL tensor data allowed, as the header specifies for
/// `TFL_InferOutputsFn`; `out` must be NULL or point to `num_outputs`
/// `TFL_OutputMeta`s whose `struct_size` the host has set.
unsafe fn infer_frame(
    frame: *const TFL_CallFrame,
    name: &'static str,
    infer: InferFn,
    out: *mut TFL_OutputMeta,
    num_outputs: usize,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let f = unsafe { read_frame(frame, name)? };
    // SAFETY: as above.
    let op_name = unsafe { frame_op_name(&f, name) };
    let op: &str = if op_name.is_empty() { name } else { &op_name };
    // SAFETY: the header guarantees `num_args` argument pointers, each
    // valid for the call.
    let arg_ptrs = unsafe { borrow_list(f.args, f.num_args, &op)? };
    let mut args = ArgList::new();
    for (i, &a) in arg_ptrs.iter().enumerate() {
        // SAFETY: as above; without a runtime no tensor data is read.
        args.push(unsafe { decode_value(None, a, op, i)? });
    }
    let metas = infer(op, &args)?;
    if num_outputs != metas.len() {
        return Err(Error::invalid(format!(
            "sim: {op}: infer_outputs was given {num_outputs} output(s), the operator returns {}",
            metas.len()
        )));
    }
    if out.is_null() && num_outputs > 0 {
        return Err(null_arg(op, "out"));
    }
    // Validate everything before writing anything.
    for (i, m) in metas.iter().enumerate() {
        if m.shape.len() > ffi::TFL_MAX_OUTPUT_DIMS {
            return Err(Error::invalid(format!(
                "sim: {op}: output {i} has {} dimensions, more than TFL_MAX_OUTPUT_DIMS ({})",
                m.shape.len(),
                ffi::TFL_MAX_OUTPUT_DIMS
            )));
        }
    }
    for (i, m) in metas.iter().enumerate() {
        let mut shape = [0i64; ffi::TFL_MAX_OUTPUT_DIMS];
        shape[..m.shape.len()].copy_from_slice(&m.shape);
        let ndim = m.shape.len() as i32;
        // SAFETY: `out` holds `num_outputs` host structs (contract) and
        // `i < num_outputs`; each field is written only when the host's
        // struct_size covers it.
        unsafe {
            let p = out.add(i);
            let size = rd!(p, struct_size);
            wr!(p, TFL_OutputMeta, size, dtype, m.dtype.to_ffi());
            wr!(p, TFL_OutputMeta, size, ndim, ndim);
            wr!(p, TFL_OutputMeta, size, shape, shape);
        }
    }
    Ok(())
}

/// The body of every custom operator's `infer_outputs`: like
/// [`kernel_entry`], a panic or an error becomes an error object.
///
/// # Safety
/// As for [`infer_frame`].
unsafe fn infer_entry(
    name: &'static str,
    infer: InferFn,
    frame: *const TFL_CallFrame,
    out: *mut TFL_OutputMeta,
    num_outputs: usize,
) -> *mut TFL_Error {
    // SAFETY: forwarded contract.
    guard(name, || unsafe { infer_frame(frame, name, infer, out, num_outputs) })
}

/// Whether `schema` declares operator `name` without its namespace:
/// `"sim::fused_gelu"` and `"fused_gelu(Tensor x) -> Tensor"`. A `const
/// fn` so that a mismatch fails the build.
pub(super) const fn schema_declares(name: &str, schema: &str) -> bool {
    let (n, s) = (name.as_bytes(), schema.as_bytes());
    // The operator after the last "::".
    let mut start = 0;
    let mut i = 0;
    while i + 1 < n.len() {
        if n[i] == b':' && n[i + 1] == b':' {
            start = i + 2;
        }
        i += 1;
    }
    let mut j = 0;
    while start + j < n.len() {
        if j >= s.len() || s[j] != n[start + j] {
            return false;
        }
        j += 1;
    }
    j < s.len() && s[j] == b'('
}

// `kernel_symbol!("add.Tensor")`: `"torch_fl_op_add_Tensor"`, derived by
// the build script from the operator names of `for_each_op!`.
include!(concat!(env!("OUT_DIR"), "/kernel_symbols.rs"));

/// One exported kernel, as the op-table entry's pointer to it: an
/// `extern "C"` function exported under the symbol the build script
/// derived from the operator's name ([`torchfl_ffi::kernel_symbol`]), so
/// the two cannot drift apart.
macro_rules! export_kernel {
    ($name:tt, $kernel:path) => {{
        #[doc = concat!("Exported kernel for `", $name, "`.")]
        ///
        /// # Safety
        /// `frame` must be a valid `TFL_CallFrame` for the duration of
        /// the call, as the ABI header specifies.
        #[export_name = kernel_symbol!($name)]
        unsafe extern "C" fn kernel(frame: *const TFL_CallFrame) -> *mut TFL_Error {
            // SAFETY: forwarded contract.
            unsafe { kernel_entry($name, $kernel, frame) }
        }
        Some(kernel)
    }};
}

macro_rules! define_exports {
    (
        aten: [$($name:tt => $kernel:path $([$flags:expr])?),* $(,)?],
        custom: [$(
            $cname:tt => $ckernel:path {
                schema: $schema:literal,
                infer: $infer:path $(,)?
            } $([$cflags:expr])?
        ),* $(,)?],
        external: [$(
            $ename:tt => $ekernel:path { schema: $eschema:literal $(,)? } $([$eflags:expr])?
        ),* $(,)?] $(,)?
    ) => {
        $(
            const _: () = assert!(
                schema_declares($cname, $schema),
                concat!("the schema of ", $cname, " declares another operator: ", $schema)
            );
        )*
        $(
            const _: () = assert!(
                schema_declares($ename, $eschema),
                concat!("the schema of ", $ename, " declares another operator: ", $eschema)
            );
        )*

        /// How many entries at the end of [`op_entries`] are other
        /// libraries' operators (`TFL_OP_EXTERNAL`).
        pub(super) const NUM_EXTERNAL: usize = { let names: &[&str] = &[$($ename),*]; names.len() };

        /// The op table's entries, in `for_each_op!` order: aten operators
        /// (no schema, no infer function), custom ones, then other
        /// libraries' (schema, no infer function). The exported kernels
        /// are defined here, one per entry.
        pub(super) fn op_entries() -> Vec<TFL_OpEntry> {
            vec![
                $(TFL_OpEntry {
                    struct_size: struct_size!(TFL_OpEntry, infer_outputs),
                    name: concat!($name, "\0").as_ptr().cast(),
                    symbol: concat!(kernel_symbol!($name), "\0").as_ptr().cast(),
                    kernel: export_kernel!($name, $kernel),
                    flags: 0 $(| $flags)?,
                    schema: ptr::null(),
                    infer_outputs: None,
                },)*
                $(TFL_OpEntry {
                    struct_size: struct_size!(TFL_OpEntry, infer_outputs),
                    name: concat!($cname, "\0").as_ptr().cast(),
                    symbol: concat!(kernel_symbol!($cname), "\0").as_ptr().cast(),
                    kernel: export_kernel!($cname, $ckernel),
                    flags: 0 $(| $cflags)?,
                    schema: concat!($schema, "\0").as_ptr().cast(),
                    infer_outputs: {
                        /// The entry's `TFL_InferOutputsFn`.
                        ///
                        /// # Safety
                        /// As the ABI header specifies for
                        /// `TFL_InferOutputsFn`: `frame` valid for the
                        /// call, `out` holding `num_outputs` entries.
                        unsafe extern "C" fn infer(
                            frame: *const TFL_CallFrame,
                            out: *mut TFL_OutputMeta,
                            num_outputs: usize,
                        ) -> *mut TFL_Error {
                            // SAFETY: forwarded contract.
                            unsafe { infer_entry($cname, $infer, frame, out, num_outputs) }
                        }
                        Some(infer)
                    },
                },)*
                $(TFL_OpEntry {
                    struct_size: struct_size!(TFL_OpEntry, infer_outputs),
                    name: concat!($ename, "\0").as_ptr().cast(),
                    symbol: concat!(kernel_symbol!($ename), "\0").as_ptr().cast(),
                    kernel: export_kernel!($ename, $ekernel),
                    flags: ffi::TFL_OP_EXTERNAL $(| $eflags)?,
                    schema: concat!($eschema, "\0").as_ptr().cast(),
                    infer_outputs: None,
                },)*
            ]
        }
    };
}
for_each_op!(define_exports);
