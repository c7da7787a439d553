//! The collectives check (ABI 1.3, with 1.5's communicator settings when
//! the plugin offers them): a unique id, a communicator of one rank through
//! each creation entry, an all-reduce on a stream that must leave the data
//! as it was (the sum over one rank), no asynchronous error, destroy.
//!
//! A world of one needs no second process, yet exercises every entry a
//! rank calls; a plugin without collectives is skipped, not failed (they
//! are optional: torch.distributed then stages them through host memory).

use std::sync::Arc;
use std::time::Duration;

use torchfl_core::{CommConfig, Communicator, Error, Plugin, ReduceOp};
use torchfl_ffi::TFL_DType;

use super::{device_plugin, Ctx, NotPassed, Outcome};

/// The timeout the checked communicators ask for: a world of one joins at
/// once, so this only bounds a plugin that hangs.
const TIMEOUT: Duration = Duration::from_secs(10);

const DATA: &[f32] = &[1.5, -2.0, 3.25, 0.0, 7.0, -0.125, 1e6];

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn context(what: &'static str) -> impl Fn(Error) -> String {
    move |e| format!("{what}: {e}")
}

/// All-reduces `DATA` in place and out of place on a created stream of
/// device 0, checks the result and the async error, and destroys `comm`.
fn exercise(p: &Arc<Plugin>, comm: &Communicator) -> Result<(), String> {
    let e = context;
    let bytes = DATA.len() * 4;
    let stream = p.create_stream(0, 0).map_err(e("stream_create"))?;
    let send = p.allocate(0, bytes).map_err(e("allocate"))?;
    let recv = p.allocate(0, bytes).map_err(e("allocate"))?;
    p.copy_to_device(&send, 0, &to_bytes(DATA)).map_err(e("copy"))?;
    p.set_memory(&recv, 0, 0, bytes, None).map_err(e("set_memory"))?;
    crate::protocol::note("all_reduce on a stream");
    for (which, dst) in
        [("all_reduce (out of place)", recv.as_ptr()), ("all_reduce (in place)", send.as_ptr())]
    {
        // SAFETY: both buffers are live allocations of `bytes` bytes on the
        // communicator's device (0), kept until the stream is synchronized;
        // the stream is a live stream of that device.
        unsafe {
            comm.all_reduce(send.as_ptr(), dst, DATA.len(), TFL_DType::F32, ReduceOp::Sum, stream.raw())
        }
        .map_err(e(which))?;
    }
    stream.synchronize().map_err(e("stream_synchronize after all_reduce"))?;
    for (which, buf) in [("out of place", &recv), ("in place", &send)] {
        let mut back = vec![0u8; bytes];
        p.copy_to_host(buf, 0, &mut back).map_err(e("copy"))?;
        if back != to_bytes(DATA) {
            let got: Vec<f32> =
                back.chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect();
            return Err(format!(
                "all_reduce SUM ({which}) over a world of one changed the data: {got:?} instead of {DATA:?}"
            ));
        }
    }
    match comm.async_error() {
        Ok(None) => {}
        Ok(Some(status)) => {
            return Err(format!(
                "comm_get_async_error reports {} after a successful all_reduce: {}",
                status.code, status.message
            ))
        }
        Err(err) => return Err(format!("comm_get_async_error: {err}")),
    }
    crate::protocol::note("comm_destroy");
    comm.destroy().map_err(e("comm_destroy"))
}

/// Creates a communicator with `create` (on a fresh unique id) and
/// exercises it; `what` names the path in failures.
fn check_one(
    p: &Arc<Plugin>,
    what: &str,
    create: impl FnOnce(&torchfl_core::UniqueId) -> torchfl_core::Result<Communicator>,
) -> Result<(), String> {
    let coll = p.collectives().ok_or_else(|| "the collectives table disappeared".to_owned())?;
    crate::protocol::note(&format!("get_unique_id for {what}"));
    let id = coll.unique_id().map_err(|e| format!("get_unique_id: {e}"))?;
    crate::protocol::note(&format!("{what}: a world of one on device 0"));
    let comm = create(&id).map_err(|e| format!("{what}: {e}"))?;
    exercise(p, &comm).map_err(|e| format!("{what}: {e}"))
}

pub(super) fn check_collectives(ctx: &mut Ctx<'_>) -> Outcome {
    let p = device_plugin(ctx)?;
    let Some(coll) = p.collectives() else {
        return Err(NotPassed::Skip(
            "not offered: the plugin has no collectives table (optional; torch.distributed then stages \
             collectives through host memory)"
                .to_owned(),
        ));
    };
    // Every communicator below needs a unique id of its own; one that cannot
    // be made fails the check once, not once per communicator.
    crate::protocol::note("get_unique_id");
    coll.unique_id().map_err(|e| NotPassed::Fail(format!("get_unique_id: {e}")))?;
    let mut checked = vec!["comm_init_rank"];
    let mut failures = Vec::new();
    if let Err(e) = check_one(&p, "comm_init_rank", |id| coll.init_rank(id, 1, 0, 0)) {
        failures.push(e);
    }
    if coll.has_config() {
        for (what, blocking) in
            [("comm_init_rank_config (blocking)", true), ("comm_init_rank_config (non-blocking)", false)]
        {
            let config = CommConfig { timeout: Some(TIMEOUT), blocking };
            if let Err(e) = check_one(&p, what, |id| coll.init_rank_with(id, 1, 0, 0, &config)) {
                failures.push(e);
            }
            checked.push(what);
        }
    }
    if !failures.is_empty() {
        return Err(NotPassed::Fail(failures.join("; ")));
    }
    Ok(format!(
        "a world of one through {}: all_reduce SUM on a stream, no asynchronous error, destroyed{}",
        checked.join(", "),
        if coll.has_config() { "" } else { " (comm_init_rank_config not offered: optional, ABI 1.5)" }
    ))
}
