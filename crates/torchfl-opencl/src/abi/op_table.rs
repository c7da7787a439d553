//! The exported kernel symbols and the op table: each entry names an
//! operator and how its frame maps onto a kernel ([`Form`]).

use std::ptr::{self, addr_of};
use std::sync::OnceLock;

use torchfl_ffi::struct_size;
use torchfl_ffi::{TFL_CallFrame, TFL_Error, TFL_OpEntry, TFL_OpTable};

use super::frame::{operand, read_frame, value_scalar, value_tensor, Call};
use super::{check_size, guard, null_arg, ops, runtime, PROGRAMS};
use crate::error::{Error, Result};
use crate::kernels::{self, BinaryOp, Launch, Number, Operand, ProgramCache, UnaryOp, View};

/// How an operator's arguments map onto a kernel.
#[derive(Debug, Clone, Copy)]
enum Form {
    /// `(self, other[, alpha]) -> out`; in place when out is self.
    Binary(BinaryOp, bool),
    /// `(self) -> out`; in place when out is self.
    Unary(UnaryOp),
    /// `copy_(self, src, non_blocking)`: out (self) = src.
    Copy,
    /// `fill_(self, value)`: out (self) = value.
    Fill,
    /// `zero_(self)`: out (self) = 0.
    Zero,
    /// `mm(self, mat2)` and `bmm(self, mat2)`.
    MatMul,
    /// `addmm(self, mat1, mat2, beta, alpha)`.
    AddMm,
    /// Any other operator: the function decodes the call's arguments itself
    /// (checking their count) and launches.
    Custom(fn(&Call<'_>) -> Result<()>),
}

impl Form {
    fn arg_count(self) -> usize {
        match self {
            Form::Binary(_, true) | Form::Copy => 3,
            Form::Binary(_, false) | Form::Fill | Form::MatMul => 2,
            Form::AddMm => 5,
            Form::Unary(_) | Form::Zero => 1,
            Form::Custom(_) => 0,
        }
    }
}

/// Every kernel: decodes the frame by `form` and launches.
///
/// # Safety
/// `frame` must be a valid call frame.
unsafe fn run(frame: *const TFL_CallFrame, name: &str, form: Form) -> *mut TFL_Error {
    guard(name, || {
        let rt = runtime()?;
        if let Form::Custom(kernel) = form {
            // SAFETY: per this function's contract.
            return kernel(&unsafe { Call::new(rt, frame, name)? });
        }
        // SAFETY: per this function's contract; everything read is borrowed
        // for the call only.
        unsafe {
            let f = read_frame(rt, frame, name)?;
            let want = form.arg_count();
            if f.args.len() != want || f.outputs.len() != 1 {
                return Err(Error::invalid(format!(
                    "opencl: {}: expected {want} arguments and 1 output, got {} and {}",
                    f.op,
                    f.args.len(),
                    f.outputs.len()
                )));
            }
            let tensor = |i: usize, what: &str| {
                value_tensor(f.args[i])
                    .ok_or_else(|| Error::invalid(format!("opencl: {}: {what} is not a tensor", f.op)))
            };
            let out = operand(&f, f.outputs[0], "the output")?;
            let cache = PROGRAMS.get_or_init(ProgramCache::default);
            let launch = Launch { rt, cache, stream: f.stream, op: f.op };
            match form {
                Form::Binary(op, has_alpha) => {
                    let a = operand(&f, tensor(0, "self")?, "self")?;
                    // `.Scalar` overloads pass `other` as a number.
                    let b = match value_tensor(f.args[1]) {
                        Some(t) => operand(&f, t, "other")?,
                        None => Operand::Host(value_scalar(f.args[1], f.op)?),
                    };
                    let alpha = if has_alpha { value_scalar(f.args[2], f.op)? } else { Number::Int(1) };
                    kernels::binary(&launch, op, &a, &b, alpha, &out)
                }
                Form::Unary(op) => {
                    let a = operand(&f, tensor(0, "self")?, "self")?;
                    kernels::unary(&launch, op, &a, Number::Int(0), &out)
                }
                Form::Copy => {
                    let src = operand(&f, tensor(1, "src")?, "src")?;
                    kernels::unary(&launch, UnaryOp::Copy, &src, Number::Int(0), &out)
                }
                Form::Fill => {
                    let value = value_scalar(f.args[1], f.op)?;
                    kernels::unary(&launch, UnaryOp::Fill, &out, value, &out)
                }
                Form::Zero => kernels::unary(&launch, UnaryOp::Fill, &out, Number::Int(0), &out),
                Form::MatMul | Form::AddMm => {
                    fn view<'v>(o: Operand<'v>, op: &str, what: &str) -> Result<View<'v>> {
                        match o {
                            Operand::Device(v) => Ok(v),
                            Operand::Host(_) => {
                                Err(Error::unimplemented(format!("opencl: {op}: {what} is a host number")))
                            }
                        }
                    }
                    let first = usize::from(matches!(form, Form::AddMm));
                    let a = view(operand(&f, tensor(first, "mat1")?, "mat1")?, f.op, "mat1")?;
                    let b = view(operand(&f, tensor(first + 1, "mat2")?, "mat2")?, f.op, "mat2")?;
                    let out = view(out, f.op, "the output")?;
                    let (c, beta, alpha) = if first == 1 {
                        let c = view(operand(&f, tensor(0, "self")?, "self")?, f.op, "self")?;
                        (Some(c), value_scalar(f.args[3], f.op)?, value_scalar(f.args[4], f.op)?)
                    } else {
                        (None, Number::Int(0), Number::Int(1))
                    };
                    kernels::gemm(&launch, a, b, c, out, alpha, beta)
                }
                Form::Custom(_) => unreachable!("handled above"),
            }
        }
    })
}

macro_rules! kernels {
    ($($symbol:ident = $name:literal, $form:expr;)*) => {
        $(
            /// An exported kernel (`TFL_KernelFn`): `#[no_mangle]` exports
            /// it from the cdylib whatever its Rust visibility.
            ///
            /// # Safety
            /// `frame` must be a valid call frame.
            #[no_mangle]
            unsafe extern "C" fn $symbol(frame: *const TFL_CallFrame) -> *mut TFL_Error {
                // SAFETY: forwarded contract.
                unsafe { run(frame, $name, $form) }
            }
        )*

        /// The op table, one entry per kernel.
        fn op_entries() -> Vec<TFL_OpEntry> {
            vec![$(
                TFL_OpEntry {
                    struct_size: struct_size!(TFL_OpEntry, infer_outputs),
                    name: concat!($name, "\0").as_ptr().cast(),
                    symbol: concat!(stringify!($symbol), "\0").as_ptr().cast(),
                    kernel: Some($symbol),
                    flags: 0,
                    schema: ptr::null(),
                    infer_outputs: None,
                },
            )*]
        }
    };
}

use BinaryOp::{Add, Div, Eq, Ge, Gt, Le, Lt, Mul, Ne, Sub};
use UnaryOp::{Abs, Cos, Exp, Log, Neg, Reciprocal, Relu, Rsqrt, Sigmoid, Sin, Sqrt, Tanh};

kernels! {
    torch_fl_op_add_Tensor = "add.Tensor", Form::Binary(Add, true);
    torch_fl_op_add__Tensor = "add_.Tensor", Form::Binary(Add, true);
    torch_fl_op_sub_Tensor = "sub.Tensor", Form::Binary(Sub, true);
    torch_fl_op_sub__Tensor = "sub_.Tensor", Form::Binary(Sub, true);
    torch_fl_op_mul_Tensor = "mul.Tensor", Form::Binary(Mul, false);
    torch_fl_op_mul__Tensor = "mul_.Tensor", Form::Binary(Mul, false);
    torch_fl_op_div_Tensor = "div.Tensor", Form::Binary(Div, false);
    torch_fl_op_div__Tensor = "div_.Tensor", Form::Binary(Div, false);
    torch_fl_op_add_Scalar = "add.Scalar", Form::Binary(Add, true);
    torch_fl_op_add__Scalar = "add_.Scalar", Form::Binary(Add, true);
    torch_fl_op_sub_Scalar = "sub.Scalar", Form::Binary(Sub, true);
    torch_fl_op_sub__Scalar = "sub_.Scalar", Form::Binary(Sub, true);
    torch_fl_op_mul_Scalar = "mul.Scalar", Form::Binary(Mul, false);
    torch_fl_op_mul__Scalar = "mul_.Scalar", Form::Binary(Mul, false);
    torch_fl_op_div_Scalar = "div.Scalar", Form::Binary(Div, false);
    torch_fl_op_div__Scalar = "div_.Scalar", Form::Binary(Div, false);
    torch_fl_op_eq_Tensor = "eq.Tensor", Form::Binary(Eq, false);
    torch_fl_op_eq_Scalar = "eq.Scalar", Form::Binary(Eq, false);
    torch_fl_op_ne_Tensor = "ne.Tensor", Form::Binary(Ne, false);
    torch_fl_op_ne_Scalar = "ne.Scalar", Form::Binary(Ne, false);
    torch_fl_op_lt_Tensor = "lt.Tensor", Form::Binary(Lt, false);
    torch_fl_op_lt_Scalar = "lt.Scalar", Form::Binary(Lt, false);
    torch_fl_op_le_Tensor = "le.Tensor", Form::Binary(Le, false);
    torch_fl_op_le_Scalar = "le.Scalar", Form::Binary(Le, false);
    torch_fl_op_gt_Tensor = "gt.Tensor", Form::Binary(Gt, false);
    torch_fl_op_gt_Scalar = "gt.Scalar", Form::Binary(Gt, false);
    torch_fl_op_ge_Tensor = "ge.Tensor", Form::Binary(Ge, false);
    torch_fl_op_ge_Scalar = "ge.Scalar", Form::Binary(Ge, false);
    torch_fl_op_relu = "relu", Form::Unary(Relu);
    torch_fl_op_relu_ = "relu_", Form::Unary(Relu);
    torch_fl_op_neg = "neg", Form::Unary(Neg);
    torch_fl_op_abs = "abs", Form::Unary(Abs);
    torch_fl_op_exp = "exp", Form::Unary(Exp);
    torch_fl_op_log = "log", Form::Unary(Log);
    torch_fl_op_sqrt = "sqrt", Form::Unary(Sqrt);
    torch_fl_op_rsqrt = "rsqrt", Form::Unary(Rsqrt);
    torch_fl_op_sigmoid = "sigmoid", Form::Unary(Sigmoid);
    torch_fl_op_tanh = "tanh", Form::Unary(Tanh);
    torch_fl_op_sin = "sin", Form::Unary(Sin);
    torch_fl_op_cos = "cos", Form::Unary(Cos);
    torch_fl_op_reciprocal = "reciprocal", Form::Unary(Reciprocal);
    torch_fl_op_copy_ = "copy_", Form::Copy;
    torch_fl_op_fill__Scalar = "fill_.Scalar", Form::Fill;
    torch_fl_op_zero_ = "zero_", Form::Zero;
    torch_fl_op_mm = "mm", Form::MatMul;
    torch_fl_op_bmm = "bmm", Form::MatMul;
    torch_fl_op_addmm = "addmm", Form::AddMm;
    // -- pointwise operators of up to three operands (ops/pointwise.rs) --
    torch_fl_op_threshold_backward = "threshold_backward", Form::Custom(ops::pointwise::threshold_backward);
    torch_fl_op_gelu = "gelu", Form::Custom(ops::pointwise::gelu);
    torch_fl_op_gelu_backward = "gelu_backward", Form::Custom(ops::pointwise::gelu_backward);
    torch_fl_op_addcmul = "addcmul", Form::Custom(ops::pointwise::addcmul);
    torch_fl_op_addcdiv = "addcdiv", Form::Custom(ops::pointwise::addcdiv);
    torch_fl_op_lerp_Scalar = "lerp.Scalar", Form::Custom(ops::pointwise::lerp);
    torch_fl_op_lerp_Tensor = "lerp.Tensor", Form::Custom(ops::pointwise::lerp);
    torch_fl_op_masked_fill__Scalar = "masked_fill_.Scalar", Form::Custom(ops::pointwise::masked_fill);
    torch_fl_op_masked_fill__Tensor = "masked_fill_.Tensor", Form::Custom(ops::pointwise::masked_fill);
    torch_fl_op_where_self = "where.self", Form::Custom(ops::pointwise::where_self);
    torch_fl_op_where_self_out = "where.self_out", Form::Custom(ops::pointwise::where_self);
    torch_fl_op_bitwise_not = "bitwise_not", Form::Custom(ops::pointwise::bitwise_not);
    torch_fl_op_pow_Tensor_Scalar = "pow.Tensor_Scalar", Form::Custom(ops::pointwise::pow_tensor_scalar);
    // -- position-dependent operators (ops/positional.rs) --
    torch_fl_op_tril = "tril", Form::Custom(ops::positional::tril);
    torch_fl_op_triu = "triu", Form::Custom(ops::positional::triu);
    torch_fl_op_arange_start_out = "arange.start_out", Form::Custom(ops::positional::arange_start_out);
    // -- convolution (ops/conv.rs) --
    torch_fl_op_convolution = "convolution", Form::Custom(ops::conv::convolution);
    torch_fl_op_convolution_backward = "convolution_backward", Form::Custom(ops::conv::convolution_backward);
    // -- 2-D pooling (ops/pool.rs) --
    torch_fl_op_max_pool2d_with_indices = "max_pool2d_with_indices",
        Form::Custom(ops::pool::max_pool2d_with_indices);
    torch_fl_op_max_pool2d_with_indices_backward = "max_pool2d_with_indices_backward",
        Form::Custom(ops::pool::max_pool2d_with_indices_backward);
    torch_fl_op_avg_pool2d = "avg_pool2d", Form::Custom(ops::pool::avg_pool2d);
    torch_fl_op_avg_pool2d_backward = "avg_pool2d_backward", Form::Custom(ops::pool::avg_pool2d_backward);
    torch_fl_op__adaptive_avg_pool2d = "_adaptive_avg_pool2d", Form::Custom(ops::pool::adaptive_avg_pool2d);
    torch_fl_op__adaptive_avg_pool2d_backward = "_adaptive_avg_pool2d_backward",
        Form::Custom(ops::pool::adaptive_avg_pool2d_backward);
    // -- indexing and joining (ops/index.rs) --
    torch_fl_op_index_select = "index_select", Form::Custom(ops::index::index_select);
    torch_fl_op_embedding_dense_backward = "embedding_dense_backward",
        Form::Custom(ops::index::embedding_dense_backward);
    torch_fl_op_cat = "cat", Form::Custom(ops::index::cat);
    // -- reductions (ops/reduce.rs) --
    torch_fl_op_sum = "sum", Form::Custom(ops::reduce::sum);
    torch_fl_op_sum_dim_IntList = "sum.dim_IntList", Form::Custom(ops::reduce::sum_dim);
    torch_fl_op_mean_dim = "mean.dim", Form::Custom(ops::reduce::mean_dim);
    torch_fl_op_argmax = "argmax", Form::Custom(ops::reduce::argmax);
    torch_fl_op_argmin = "argmin", Form::Custom(ops::reduce::argmin);
    torch_fl_op_max_dim = "max.dim", Form::Custom(ops::reduce::max_dim);
    torch_fl_op_min_dim = "min.dim", Form::Custom(ops::reduce::min_dim);
    torch_fl_op_max = "max", Form::Custom(ops::reduce::max);
    torch_fl_op_min = "min", Form::Custom(ops::reduce::min);
    torch_fl_op_amax = "amax", Form::Custom(ops::reduce::amax);
    torch_fl_op_amin = "amin", Form::Custom(ops::reduce::amin);
    // -- softmax (ops/softmax.rs) --
    torch_fl_op__softmax = "_softmax", Form::Custom(ops::softmax::softmax);
    torch_fl_op__log_softmax = "_log_softmax", Form::Custom(ops::softmax::log_softmax);
    torch_fl_op__softmax_backward_data =
        "_softmax_backward_data", Form::Custom(ops::softmax::softmax_backward_data);
    torch_fl_op__log_softmax_backward_data =
        "_log_softmax_backward_data", Form::Custom(ops::softmax::log_softmax_backward_data);
    // -- the negative log-likelihood loss (ops/loss.rs) --
    torch_fl_op_nll_loss_forward = "nll_loss_forward", Form::Custom(ops::loss::nll_loss_forward);
    torch_fl_op_nll_loss_backward = "nll_loss_backward", Form::Custom(ops::loss::nll_loss_backward);
    torch_fl_op_nll_loss2d_forward = "nll_loss2d_forward", Form::Custom(ops::loss::nll_loss2d_forward);
    torch_fl_op_nll_loss2d_backward = "nll_loss2d_backward", Form::Custom(ops::loss::nll_loss2d_backward);
    // -- normalization (ops/norm.rs) --
    torch_fl_op_native_batch_norm = "native_batch_norm", Form::Custom(ops::norm::native_batch_norm);
    torch_fl_op__native_batch_norm_legit_no_stats =
        "_native_batch_norm_legit.no_stats", Form::Custom(ops::norm::native_batch_norm_legit_no_stats);
    torch_fl_op__native_batch_norm_legit_no_training =
        "_native_batch_norm_legit_no_training", Form::Custom(ops::norm::native_batch_norm_legit_no_training);
    torch_fl_op_native_batch_norm_backward =
        "native_batch_norm_backward", Form::Custom(ops::norm::native_batch_norm_backward);
    torch_fl_op_native_layer_norm = "native_layer_norm", Form::Custom(ops::norm::native_layer_norm);
    torch_fl_op_native_layer_norm_backward =
        "native_layer_norm_backward", Form::Custom(ops::norm::native_layer_norm_backward);
}

struct Table(Vec<TFL_OpEntry>);
// SAFETY: the entries point at 'static strings and functions only.
unsafe impl Sync for Table {}
// SAFETY: as above.
unsafe impl Send for Table {}
static TABLE: OnceLock<Table> = OnceLock::new();

/// # Safety
/// `out` must be NULL or a `TFL_OpTable` with `struct_size` set.
pub(super) unsafe extern "C" fn get_op_table(out: *mut TFL_OpTable) -> *mut TFL_Error {
    guard("get_op_table", || {
        if out.is_null() {
            return Err(null_arg("get_op_table", "out"));
        }
        let table = &TABLE.get_or_init(|| Table(op_entries())).0;
        // SAFETY: valid for the call; the 1.0 fields are checked to fit.
        unsafe {
            check_size(addr_of!((*out).struct_size), struct_size!(TFL_OpTable, entry_size), "get_op_table")?;
            addr_of_mut_write(out, table);
        }
        Ok(())
    })
}

/// # Safety
/// `out` must be writable for the 1.0 fields of `TFL_OpTable`.
unsafe fn addr_of_mut_write(out: *mut TFL_OpTable, table: &'static [TFL_OpEntry]) {
    // SAFETY: per the contract.
    unsafe {
        ptr::addr_of_mut!((*out).entries).write(table.as_ptr());
        ptr::addr_of_mut!((*out).num_entries).write(table.len());
        ptr::addr_of_mut!((*out).entry_size).write(std::mem::size_of::<TFL_OpEntry>());
    }
}
