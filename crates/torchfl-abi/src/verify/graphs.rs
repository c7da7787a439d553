//! The optional native-graphs check (ABI 1.7): kernels captured on a stream
//! run only when the graph is launched, once per launch, on the inputs'
//! values at launch time.

use torchfl_core::Error;

use super::operands::Operands;
use super::runtime::{close, to_bytes, KERNEL_A, KERNEL_B};
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
    let stream = p.create_stream(0, 0).map_err(fail)?;
    let operands = Operands::new(&p).map_err(fail)?;
    let (a, b) = (&operands.a, &operands.b);
    let (sum, out) = (operands.output().map_err(fail)?, operands.output().map_err(fail)?);
    let read_out = || operands.read(&stream, &out).map_err(fail);

    crate::protocol::note("capturing add.Tensor and mul.Tensor on a created stream");
    let mut capture = p.begin_capture(&stream).map_err(fail)?;
    capture
        .launch(add, &operands.add_args(a, b).map_err(fail)?, &[operands.tensor(&sum).map_err(fail)?])
        .map_err(fail)?;
    capture
        .launch(mul, &operands.mul_args(&sum, b).map_err(fail)?, &[operands.tensor(&out).map_err(fail)?])
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
    p.copy_to_device(a, 0, &to_bytes(&a2)).map_err(fail)?;
    exec.launch(&stream, 0, 0).map_err(fail)?;
    exec.launch(&stream, 0, 0).map_err(fail)?;
    compare(read_out()?, expect(&a2), "launches after the inputs changed")?;
    drop(exec);
    drop(graph);
    Ok("captured add and mul ran only when launched, on the inputs at launch time".into())
}
