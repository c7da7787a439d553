//! `torchfl-abi inspect`: what a plugin is and what it offers.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use torchfl_core::{load, watch, LoadOptions, Plugin};

use crate::report;

fn flag_names(flags: u64) -> Vec<&'static str> {
    [
        (torchfl_ffi::TFL_OP_RANDOM, "random"),
        (torchfl_ffi::TFL_OP_DYNAMIC_SHAPE, "dynamic_shape"),
        (torchfl_ffi::TFL_OP_NONDETERMINISTIC, "nondeterministic"),
        (torchfl_ffi::TFL_OP_EXTERNAL, "external"),
    ]
    .into_iter()
    .filter_map(|(bit, name)| (flags & bit != 0).then_some(name))
    .collect()
}

/// Loads the plugin on a watched thread: a plugin whose constructors or
/// `initialize` never return is reported after `timeout_s` (its thread is
/// left behind, and the process exits), as `verify` reports a hung check.
fn load_bounded(path: &Path, options: &str, timeout_s: u64) -> torchfl_core::Result<Arc<Plugin>> {
    let options = LoadOptions { init_options: options.to_owned(), ..Default::default() };
    let owned = path.to_owned();
    let job = watch::spawn(&path.display().to_string(), move || load(&owned, &options))?;
    let limit = Duration::from_secs(timeout_s.max(1));
    let waited = job.wait_with(
        Some(limit),
        Duration::from_millis(20),
        |j, slice| j.wait(slice),
        || Ok::<(), std::convert::Infallible>(()),
    );
    match waited {
        Ok(result) => result,
        Err(never) => match never {},
    }
}

pub(crate) fn run(path: &Path, options: &str, json: bool, timeout_s: u64) -> u8 {
    let plugin = match load_bounded(path, options, timeout_s) {
        Ok(p) => p,
        Err(e) => {
            report::load_failure(&e, json);
            return crate::EXIT_LOAD_FAILURE;
        }
    };
    let devices: Vec<serde_json::Value> = (0..plugin.device_count())
        .map(|d| match plugin.device_properties(d) {
            Ok(p) => json!({
                "index": d,
                "name": p.name,
                "total_memory": p.total_memory,
                "compute_units": p.compute_units,
                "memory_alignment": p.memory_alignment,
                "capability": [p.capability.0, p.capability.1],
            }),
            Err(e) => json!({"index": d, "error": e.to_string()}),
        })
        .collect();
    if json {
        let mut doc = report::identity_json(&plugin);
        doc["devices"] = json!(devices);
        doc["optional_entries"] = plugin
            .optional_entries()
            .into_iter()
            .map(|(name, present)| (name.to_owned(), json!(present)))
            .collect();
        doc["warnings"] = plugin
            .warnings()
            .iter()
            .map(|w| json!({"stage": w.stage.check_id(), "kind": w.kind.as_str(), "subject": w.subject, "message": w.message}))
            .collect();
        doc["ops"] = plugin
            .ops()
            .iter()
            .map(|op| {
                json!({
                    "name": op.name,
                    "symbol": op.symbol,
                    "flags": flag_names(op.flags),
                    "schema": op.schema,
                    "infer_outputs": op.infer_outputs.is_some(),
                })
            })
            .collect();
        println!("{doc:#}");
    } else {
        print_human(&plugin, &devices);
    }
    0
}

fn print_human(plugin: &Plugin, devices: &[serde_json::Value]) {
    let info = plugin.info();
    let abi = plugin.abi();
    println!(
        "{} {} ({})",
        info.name,
        info.plugin_version,
        plugin.path().map_or("-".into(), |p| p.display().to_string())
    );
    println!("  vendor        {}", info.vendor);
    println!("  chip family   {}", info.chip_family);
    println!("  min torch     {}", info.min_torch_version.as_deref().unwrap_or("any"));
    println!(
        "  ABI           plugin {}, host {}, using {} ({})",
        abi.plugin,
        abi.host,
        abi.effective,
        abi.relation()
    );
    println!("  capabilities  {}", info.capabilities.names().join(", "));
    let optional: Vec<String> = plugin
        .optional_entries()
        .into_iter()
        .map(|(n, present)| format!("{n}{}", if present { "" } else { " (absent)" }))
        .collect();
    println!("  optional      {}", optional.join(", "));
    println!("  devices       {}", devices.len());
    for d in devices {
        match d.get("error") {
            Some(e) => println!("    {}: error: {e}", d["index"]),
            None => println!(
                "    {}: {}, {} MiB, {} compute units, capability {}.{}",
                d["index"],
                d["name"].as_str().unwrap_or("?"),
                d["total_memory"].as_u64().unwrap_or(0) >> 20,
                d["compute_units"],
                d["capability"][0],
                d["capability"][1]
            ),
        }
    }
    for w in plugin.warnings() {
        println!("  warning       {w}");
    }
    println!("  ops           {}", plugin.ops().len());
    for op in plugin.ops() {
        let flags = flag_names(op.flags);
        let flags = if flags.is_empty() { String::new() } else { format!("  [{}]", flags.join(", ")) };
        println!("    {:32} {}{flags}", op.name, op.symbol);
        if let Some(schema) = &op.schema {
            let infer = if op.infer_outputs.is_some() { "with infer_outputs" } else { "no infer_outputs" };
            println!("    {:32}   {schema}  ({infer})", "");
        }
    }
}
