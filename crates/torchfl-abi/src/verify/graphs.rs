//! The optional native-graphs check (ABI 1.7): kernels captured on a stream
//! run only when the graph is launched, once per launch, on the inputs'
//! values at launch time.

use torchfl_core::{Arg, Error, ScalarArg, TensorArg};
use torchfl_ffi::TFL_DType;

use super::runtime::{close, from_bytes, to_bytes, KERNEL_A, KERNEL_B};
use super::{device_plugin, Ctx, NotPassed, Outcome};

pub(super) fn check_graphs(ctx: &mut Ctx<'_>) -> Outcome {
    let p = device_plugin(ctx)?;
    if !p.has_graphs() {
        return Err(NotPassed::Skip("no native graphs (the optional ABI 1.7 get_graphs)".into()));
    }
    let (Some(add), Some(mul)) = (p.op("add.Tensor"), p.op("mul.Tensor")) else {
        return Err(NotPassed::Skip(
            "the check captures add.Tensor and mul.Tensor, which the plugin lacks".into(),
        ));
    };
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    let n = KERNEL_A.len();
    let bytes = n * 4;
    let shape = [n as i64];
    let stream = p.create_stream(0, 0).map_err(fail)?;
    let alloc = || p.allocate(0, bytes);
    let (a, b, sum, out) =
        (alloc().map_err(fail)?, alloc().map_err(fail)?, alloc().map_err(fail)?, alloc().map_err(fail)?);
    p.copy_to_device(&a, 0, &to_bytes(KERNEL_A)).map_err(fail)?;
    p.copy_to_device(&b, 0, &to_bytes(KERNEL_B)).map_err(fail)?;
    p.set_memory(&out, 0, 0, bytes, None).map_err(fail)?;
    let t = |buf| TensorArg::contiguous(buf, TFL_DType::F32, &shape);
    let read_out = || -> Result<Vec<f32>, NotPassed> {
        stream.synchronize().map_err(fail)?;
        let mut back = vec![0u8; bytes];
        p.copy_to_host(&out, 0, &mut back).map_err(fail)?;
        Ok(from_bytes(&back))
    };

    crate::protocol::note("capturing add.Tensor and mul.Tensor on a created stream");
    let mut capture = p.begin_capture(&stream).map_err(fail)?;
    capture
        .launch(
            add,
            &[
                Arg::Tensor(t(&a).map_err(fail)?),
                Arg::Tensor(t(&b).map_err(fail)?),
                Arg::Scalar(ScalarArg::Float(1.0)),
            ],
            &[t(&sum).map_err(fail)?],
        )
        .map_err(fail)?;
    capture
        .launch(
            mul,
            &[Arg::Tensor(t(&sum).map_err(fail)?), Arg::Tensor(t(&b).map_err(fail)?)],
            &[t(&out).map_err(fail)?],
        )
        .map_err(fail)?;
    let graph = capture.end().map_err(fail)?;
    if read_out()?.iter().any(|&x| x != 0.0) {
        return Err(NotPassed::Fail(
            "a kernel called on a capturing stream ran at capture: it must only be recorded".into(),
        ));
    }
    let mut exec = graph.instantiate().map_err(fail)?;
    let expect = |a: &[f32]| -> Vec<f32> { a.iter().zip(KERNEL_B).map(|(&x, &y)| (x + y) * y).collect() };
    let compare = |got: Vec<f32>, want: Vec<f32>, when: &str| -> Result<(), NotPassed> {
        match got.iter().zip(&want).position(|(&x, &y)| !close(x, y)) {
            None => Ok(()),
            Some(i) => Err(NotPassed::Fail(format!(
                "{when}: element {i} of (a + b) * b is {} instead of {}",
                got[i], want[i]
            ))),
        }
    };
    exec.launch(&stream, 0, 0).map_err(fail)?;
    compare(read_out()?, expect(KERNEL_A), "first launch")?;
    // New input values, then two launches: each reads the buffers anew.
    let a2: Vec<f32> = KERNEL_A.iter().map(|x| x * 3.0 - 1.0).collect();
    p.copy_to_device(&a, 0, &to_bytes(&a2)).map_err(fail)?;
    exec.launch(&stream, 0, 0).map_err(fail)?;
    exec.launch(&stream, 0, 0).map_err(fail)?;
    compare(read_out()?, expect(&a2), "launches after the inputs changed")?;
    drop(exec);
    drop(graph);
    Ok("captured add and mul ran only when launched, on the inputs at launch time".into())
}
