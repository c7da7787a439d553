//! Fuzzing call frames: random tensors (shapes, strides, offsets, dtypes,
//! buffers too small for them), scalars, lists and strings, checked by the
//! host's launcher and passed to the C example's kernels, which must refuse
//! what they cannot run. Every call ends in `Ok` or an error: a crash, a
//! panic or an overflow fails the run. `fuzz_tables.rs` says how to run
//! longer (`TORCHFL_FUZZ_CASES`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use torchfl_core::call::contiguous_strides;
use torchfl_core::{load, Arg, LoadOptions, Plugin, ScalarArg, TensorArg};
use torchfl_ffi::TFL_DType;

fn runner(default_cases: u32) -> TestRunner {
    let cases =
        std::env::var("TORCHFL_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default_cases);
    TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() })
}

#[derive(Debug, Clone)]
struct TensorSpec {
    dtype: TFL_DType,
    shape: Vec<i64>,
    /// `None`: contiguous.
    strides: Option<Vec<i64>>,
    offset: u64,
    buffer: usize,
}

fn dim() -> impl Strategy<Value = i64> {
    prop_oneof![6 => 0i64..6, 1 => Just(-1i64), 1 => Just(i64::MAX), 1 => Just(1i64 << 40), 1 => any::<i64>()]
}

fn tensor_strategy() -> impl Strategy<Value = TensorSpec> {
    let dtype = proptest::sample::select(vec![
        TFL_DType::F32,
        TFL_DType::F32,
        TFL_DType::F16,
        TFL_DType::I64,
        TFL_DType::BOOL,
        TFL_DType::U8,
    ]);
    (
        dtype,
        proptest::collection::vec(dim(), 0..5),
        prop_oneof![3 => Just(None), 1 => proptest::collection::vec(dim(), 0..5).prop_map(Some)],
        prop_oneof![4 => Just(0u64), 1 => 0u64..64, 1 => any::<u64>()],
        prop_oneof![1 => Just(0usize), 4 => 0usize..512],
    )
        .prop_map(|(dtype, shape, strides, offset, buffer)| TensorSpec {
            dtype,
            shape,
            strides,
            offset,
            buffer,
        })
}

#[derive(Debug, Clone)]
enum ArgSpec {
    None,
    Tensor(TensorSpec),
    List(Vec<TensorSpec>),
    Int(i64),
    Float(f64),
    Bool(bool),
    Scalar(ScalarArg),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Bools(Vec<bool>),
    Str(String),
}

fn arg_strategy() -> impl Strategy<Value = ArgSpec> {
    prop_oneof![
        1 => Just(ArgSpec::None),
        6 => tensor_strategy().prop_map(ArgSpec::Tensor),
        1 => proptest::collection::vec(tensor_strategy(), 0..3).prop_map(ArgSpec::List),
        1 => any::<i64>().prop_map(ArgSpec::Int),
        1 => any::<f64>().prop_map(ArgSpec::Float),
        1 => any::<bool>().prop_map(ArgSpec::Bool),
        3 => prop_oneof![
            any::<i64>().prop_map(ScalarArg::Int),
            any::<f64>().prop_map(ScalarArg::Float),
            any::<bool>().prop_map(ScalarArg::Bool),
        ]
        .prop_map(ArgSpec::Scalar),
        1 => proptest::collection::vec(any::<i64>(), 0..4).prop_map(ArgSpec::Ints),
        1 => proptest::collection::vec(any::<f64>(), 0..4).prop_map(ArgSpec::Floats),
        1 => proptest::collection::vec(any::<bool>(), 0..4).prop_map(ArgSpec::Bools),
        1 => "[a-z\\x00]{0,8}".prop_map(ArgSpec::Str),
    ]
}

#[derive(Debug, Clone)]
struct Call {
    op: usize,
    args: Vec<ArgSpec>,
    outputs: Vec<TensorSpec>,
}

fn call_strategy() -> impl Strategy<Value = Call> {
    (
        any::<usize>(),
        proptest::collection::vec(arg_strategy(), 0..5),
        proptest::collection::vec(tensor_strategy(), 0..3),
    )
        .prop_map(|(op, args, outputs)| Call { op, args, outputs })
}

/// A call the C example's elementwise kernels can run: float32 tensors of
/// one shape, and a Scalar, with a few of the parts randomized.
fn runnable_call_strategy() -> impl Strategy<Value = Call> {
    (any::<usize>(), proptest::collection::vec(1i64..5, 0..4), any::<f64>(), 0usize..4, tensor_strategy())
        .prop_map(|(op, shape, alpha, replaced, random)| {
            let numel: i64 = shape.iter().product();
            let t = TensorSpec {
                dtype: TFL_DType::F32,
                shape,
                strides: None,
                offset: 0,
                buffer: usize::try_from(numel * 4).unwrap_or(0),
            };
            let mut args = vec![
                ArgSpec::Tensor(t.clone()),
                ArgSpec::Tensor(t.clone()),
                ArgSpec::Scalar(ScalarArg::Float(alpha)),
            ];
            let mut outputs = vec![t];
            match replaced {
                0 => args[1] = ArgSpec::Tensor(random),
                1 => outputs[0] = random,
                2 => args.truncate(op % 3),
                _ => {}
            }
            Call { op, args, outputs }
        })
}

/// How many calls reached a kernel, and how many it ran.
static REACHED: AtomicUsize = AtomicUsize::new(0);
static RAN: AtomicUsize = AtomicUsize::new(0);

fn plugin() -> Arc<Plugin> {
    load(&torchfl_testkit::c_example_plugin(), &LoadOptions::default()).unwrap()
}

/// Builds the call (buffers, descriptors) and launches it; `Err` results
/// are expected, crashes and panics are not.
fn run(p: &Arc<Plugin>, call: &Call) {
    let buffers: Vec<_> = call
        .args
        .iter()
        .flat_map(|a| match a {
            ArgSpec::Tensor(t) => vec![t.buffer],
            ArgSpec::List(ts) => ts.iter().map(|t| t.buffer).collect(),
            _ => Vec::new(),
        })
        .chain(call.outputs.iter().map(|t| t.buffer))
        .map(|n| p.allocate(0, n).unwrap())
        .collect();
    let mut next = buffers.iter();
    let mut tensor = |t: &TensorSpec| {
        let buffer = next.next().unwrap();
        let strides = t.strides.clone().unwrap_or_else(|| contiguous_strides(&t.shape));
        TensorArg::strided(buffer, t.dtype, &t.shape, &strides, t.offset).ok()
    };
    let mut args = Vec::new();
    for a in &call.args {
        args.push(match a {
            ArgSpec::None => Arg::None,
            ArgSpec::Tensor(t) => match tensor(t) {
                Some(t) => Arg::Tensor(t),
                None => return,
            },
            ArgSpec::List(ts) => match ts.iter().map(&mut tensor).collect::<Option<Vec<_>>>() {
                Some(ts) => Arg::TensorList(ts),
                None => return,
            },
            ArgSpec::Int(i) => Arg::Int(*i),
            ArgSpec::Float(f) => Arg::Float(*f),
            ArgSpec::Bool(b) => Arg::Bool(*b),
            ArgSpec::Scalar(s) => Arg::Scalar(*s),
            ArgSpec::Ints(v) => Arg::IntList(v.clone()),
            ArgSpec::Floats(v) => Arg::FloatList(v.clone()),
            ArgSpec::Bools(v) => Arg::BoolList(v.clone()),
            ArgSpec::Str(s) => Arg::Str(s.clone()),
        });
    }
    let Some(outputs) = call.outputs.iter().map(&mut tensor).collect::<Option<Vec<_>>>() else { return };
    let op = &p.ops()[call.op % p.ops().len()];
    let stream = p.default_stream(0).unwrap();
    REACHED.fetch_add(1, Ordering::Relaxed);
    if p.launch(op, &stream, &args, &outputs).is_ok() {
        RAN.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn random_call_frames_are_run_or_refused_never_crash() {
    let p = plugin();
    runner(2000)
        .run(&prop_oneof![call_strategy(), runnable_call_strategy()], |call| {
            run(&p, &call);
            Ok(())
        })
        .unwrap();
    let (reached, ran) = (REACHED.load(Ordering::Relaxed), RAN.load(Ordering::Relaxed));
    eprintln!("{reached} calls reached a kernel, {ran} ran");
    assert!(reached > 0 && ran > 0, "the fuzzing must reach the kernels: {reached} reached, {ran} ran");
}

#[test]
fn tensor_extents_never_overflow() {
    let p = plugin();
    let buffer = p.allocate(0, 64).unwrap();
    runner(2000)
        .run(&tensor_strategy(), |t| {
            let strides = t.strides.clone().unwrap_or_else(|| contiguous_strides(&t.shape));
            if let Ok(arg) = TensorArg::strided(&buffer, t.dtype, &t.shape, &strides, t.offset) {
                prop_assert_eq!(arg.shape(), &t.shape[..]);
            }
            Ok(())
        })
        .unwrap();
}
