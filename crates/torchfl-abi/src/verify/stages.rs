//! The loading checks: one per stage of the core's loader, run through the
//! very code `register_device_plugin` runs. A stage's refusal fails its
//! check (and skips the later stages), a stage's warnings fail its check
//! with the words registration warns with (loading goes on), and a crash is
//! reported by the parent against the check that was running.

use std::sync::Arc;

use torchfl_core::init::Initialization;
use torchfl_core::{Finding, LoadOptions, Opening, Plugin, Stage};

use super::{devices, runtime, Ctx, NotPassed, Outcome};
use crate::report::NO_DEVICES;

fn options(ctx: &Ctx<'_>) -> LoadOptions {
    LoadOptions { init_options: ctx.options.to_owned(), ..Default::default() }
}

/// The initialization stages' state, created from the finished opening.
fn initialization<'c>(ctx: &'c mut Ctx<'_>) -> Result<&'c mut Initialization, torchfl_core::Error> {
    if ctx.init.is_none() {
        let opening = match ctx.opening.take() {
            Some(opening) => opening,
            None => Opening::new(ctx.path, &options(ctx)),
        };
        let library = opening.finish()?;
        ctx.init = Some(Initialization::new(library, &options(ctx))?);
    }
    ctx.init.as_mut().ok_or_else(|| torchfl_core::Error::InvalidCall {
        plugin: ctx.path.display().to_string(),
        reason: "initialization is missing".to_owned(),
    })
}

/// Runs the loader up to `stage`. A failure of an earlier stage skips this
/// check; this stage's failure or warnings fail it.
fn run_stage(ctx: &mut Ctx<'_>, stage: Stage) -> Result<(), NotPassed> {
    if let Some(e) = &ctx.load_error {
        let at = e.load_stage().unwrap_or(Stage::Initialize);
        return Err(NotPassed::Skip(format!("not reached: '{}' failed", at.check_id())));
    }
    let result = if stage <= Stage::OpTable {
        let options = options(ctx);
        ctx.opening.get_or_insert_with(|| Opening::new(ctx.path, &options)).run_to(stage)
    } else {
        initialization(ctx).and_then(|init| init.run_to(stage))
    };
    if let Err(e) = result {
        let message = e.to_string();
        ctx.load_error = Some(e);
        return Err(NotPassed::Fail(message));
    }
    let warnings: Vec<&Finding> = match (&ctx.opening, &ctx.init) {
        (_, Some(init)) => init.warnings().iter().collect(),
        (Some(opening), None) => opening.warnings().iter().collect(),
        (None, None) => Vec::new(),
    };
    let here: Vec<String> = warnings.iter().filter(|f| f.stage == stage).map(|f| f.message.clone()).collect();
    if here.is_empty() {
        Ok(())
    } else {
        Err(NotPassed::Fail(format!("registration warns: {}", here.join("; "))))
    }
}

fn opening<'c>(ctx: &'c Ctx<'_>) -> Result<&'c Opening, NotPassed> {
    ctx.opening.as_ref().ok_or_else(|| NotPassed::Skip("the plugin did not load".into()))
}

pub(super) fn check_file(ctx: &mut Ctx<'_>) -> Outcome {
    run_stage(ctx, Stage::File)?;
    Ok(format!("ELF shared object for {}", std::env::consts::ARCH))
}

pub(super) fn check_handshake(ctx: &mut Ctx<'_>) -> Outcome {
    run_stage(ctx, Stage::Handshake)?;
    let abi = opening(ctx)?.negotiated().ok_or_else(|| NotPassed::Skip("no handshake".into()))?;
    Ok(format!(
        "plugin ABI {}, host ABI {}: using {} ({})",
        abi.plugin,
        abi.host,
        abi.effective,
        abi.relation()
    ))
}

pub(super) fn check_function_table(ctx: &mut Ctx<'_>) -> Outcome {
    run_stage(ctx, Stage::FunctionTable)?;
    let opening = opening(ctx)?;
    let optional: Vec<&str> = opening
        .optional_entries()
        .into_iter()
        .filter_map(|(name, present)| present.then_some(name))
        .collect();
    Ok(format!(
        "{} bytes, {} required entries, optional: {}",
        opening.table_size().unwrap_or(0),
        Plugin::required_entries().len(),
        if optional.is_empty() { "none".to_owned() } else { optional.join(", ") }
    ))
}

pub(super) fn check_identity(ctx: &mut Ctx<'_>) -> Outcome {
    run_stage(ctx, Stage::Identity)?;
    let info = opening(ctx)?.info().ok_or_else(|| NotPassed::Skip("no identity".into()))?;
    Ok(format!(
        "'{}' {} by {} ({}), min torch {}, capabilities: {}",
        info.name,
        info.plugin_version,
        info.vendor,
        info.chip_family,
        info.min_torch_version.as_deref().unwrap_or("any"),
        info.capabilities.names().join(", ")
    ))
}

pub(super) fn check_op_table(ctx: &mut Ctx<'_>) -> Outcome {
    run_stage(ctx, Stage::OpTable)?;
    let ops = opening(ctx)?.ops();
    let custom = ops.iter().filter(|op| op.schema.is_some()).count();
    Ok(format!(
        "{} operators ({custom} custom, schemas valid), each kernel exported under its conventional symbol",
        ops.len()
    ))
}

/// ABI 1.6 `probe_devices`, before initialize: it must succeed and count
/// what initialize will find (compared by [`check_init`]), twice alike,
/// since the host may probe any number of times.
pub(super) fn check_probe(ctx: &mut Ctx<'_>) -> Outcome {
    if ctx.load_error.is_some() {
        return Err(NotPassed::Skip("not reached: the plugin did not load".into()));
    }
    let options = ctx.options.to_owned();
    let init = initialization(ctx).map_err(|e| NotPassed::Skip(format!("the plugin did not load: {e}")))?;
    let first = init.library().probe_devices(&options).map_err(|e| NotPassed::Fail(e.to_string()))?;
    let Some(first) = first else {
        return Err(NotPassed::Skip(
            "not offered: the entry is optional; without it autoload assumes the plugin's devices are present".into(),
        ));
    };
    let second = init.library().probe_devices(&options).map_err(|e| NotPassed::Fail(e.to_string()))?;
    if second != Some(first) {
        return Err(NotPassed::Fail(format!(
            "probe_devices answered {first} and then {second:?} device(s): it must not change the plugin's state"
        )));
    }
    ctx.probed = Some(first);
    Ok(format!("{first} device(s) without initializing"))
}

pub(super) fn check_init(ctx: &mut Ctx<'_>) -> Outcome {
    run_stage(ctx, Stage::Initialize)?;
    let count = ctx.init.as_ref().map_or(0, Initialization::device_count);
    if let Some(probed) = ctx.probed {
        if usize::try_from(count).ok() != Some(probed) {
            return Err(NotPassed::Fail(format!(
                "initialize found {count} device(s) but probe_devices counted {probed} with the same options"
            )));
        }
        return Ok(format!("{count} device(s), as probe_devices counted"));
    }
    Ok(format!("{count} device(s)"))
}

pub(super) fn check_properties(ctx: &mut Ctx<'_>) -> Outcome {
    run_stage(ctx, Stage::Devices)?;
    let init = ctx.init.as_ref().ok_or_else(|| NotPassed::Skip("the plugin did not initialize".into()))?;
    if init.devices().is_empty() {
        return Err(NotPassed::Skip(NO_DEVICES.to_owned()));
    }
    let names: Vec<String> =
        init.devices().iter().map(|p| format!("{} ({} MiB)", p.name, p.total_memory >> 20)).collect();
    Ok(names.join(", "))
}

/// The last stage (a default stream on every device) completes loading;
/// then a created stream is exercised on every device.
pub(super) fn check_streams(ctx: &mut Ctx<'_>) -> Outcome {
    run_stage(ctx, Stage::Streams)?;
    let init = ctx.init.take().ok_or_else(|| NotPassed::Skip("the plugin did not initialize".into()))?;
    let plugin: Arc<Plugin> = match init.finish() {
        Ok(plugin) => plugin,
        Err(e) => {
            let message = e.to_string();
            ctx.load_error = Some(e);
            return Err(NotPassed::Fail(message));
        }
    };
    ctx.plugin = Some(Arc::clone(&plugin));
    if plugin.device_count() == 0 {
        return Err(NotPassed::Skip(NO_DEVICES.to_owned()));
    }
    for d in devices(&plugin) {
        runtime::exercise_streams(&plugin, d)?;
    }
    Ok("a default stream on every device; created, used, queried and destroyed a stream on each".into())
}
