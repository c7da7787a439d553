//! What the host checks in a plugin's declared data, in one place.
//!
//! `register_device_plugin` (through [`crate::load`]) and `torchfl-abi
//! verify` run the same checks, in the same stages, with the same words: a
//! plugin cannot pass one and fail the other. Each check is chosen once to be
//! either
//!
//! - a **refusal**: the plugin is not loaded, and the error names the plugin
//!   and the field (an [`Error`](crate::Error), most often
//!   [`Error::InvalidPlugin`](crate::Error::InvalidPlugin)); or
//! - a **warning**: the plugin loads without what the warning names (an
//!   operator is left out), or with a property that will read wrong. The
//!   warnings are [`Finding`]s: `register_device_plugin` shows each as a
//!   Python warning, and `verify` fails the check of its stage with the same
//!   text, so a vendor's CI catches what a user would see as a warning.
//!
//! docs/plugin-abi.md ("What the host validates") lists every check in one
//! table. Memory safety (ranges mapped readable, pointers executable, the
//! header's limits) is enforced while reading, in the `ffi` module; this
//! module judges the copies.

use std::collections::HashSet;

use torchfl_ffi::{parse_op_name, OpName};

use crate::ffi::{RawInfo, RawString};
use crate::schema::{self, Schema};
use crate::types::{Capabilities, OpKernel, PluginInfo};
pub use crate::types::{Finding, Stage, WarningKind};

/// A plugin string field: its text or `None`, or the refusal's reason.
fn string(field: &str, raw: RawString) -> Result<Option<String>, String> {
    raw.map_err(|fault| format!("{field} {fault}"))
}

/// Whether `v` is a PyTorch version: `MAJOR.MINOR[.PATCH...]`, optionally
/// followed by a pre-release or local suffix (`2.5.0a0`, `2.4+cpu`,
/// `2.6.0.dev20240101`).
pub fn is_version(v: &str) -> bool {
    let numeric_end = v.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(v.len());
    let (numbers, suffix) = v.split_at(numeric_end);
    let numbers = numbers.strip_suffix('.').filter(|_| !suffix.is_empty()).unwrap_or(numbers);
    let parts: Vec<&str> = numbers.split('.').collect();
    let numeric = parts.len() >= 2 && parts.iter().all(|p| !p.is_empty() && p.len() <= 9);
    let suffix_ok = suffix.is_empty()
        || (matches!(suffix.as_bytes()[0], b'a' | b'b' | b'r' | b'd' | b'p' | b'+' | b'-')
            && suffix.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-._".contains(&b)));
    numeric && suffix_ok
}

/// Judges the identity. An error is the reason for refusing it.
pub(crate) fn identity(raw: RawInfo) -> Result<PluginInfo, String> {
    let required = |field: &str, value: RawString| -> Result<String, String> {
        string(&format!("TFL_PluginInfo.{field}"), value)?
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("TFL_PluginInfo.{field} is NULL or empty"))
    };
    let name = required("name", raw.name)?;
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("TFL_PluginInfo.name {name:?} must be made of [A-Za-z0-9_]"));
    }
    let min_torch_version =
        string("TFL_PluginInfo.min_torch_version", raw.min_torch_version)?.filter(|s| !s.is_empty());
    if let Some(v) = &min_torch_version {
        if !is_version(v) {
            return Err(format!(
                "TFL_PluginInfo.min_torch_version {v:?} is not a PyTorch version: write MAJOR.MINOR[.PATCH] \
                 (e.g. \"2.4\"), or NULL for no constraint"
            ));
        }
    }
    Ok(PluginInfo {
        name,
        vendor: required("vendor", raw.vendor)?,
        chip_family: required("chip_family", raw.chip_family)?,
        plugin_version: required("plugin_version", raw.plugin_version)?,
        min_torch_version,
        capabilities: Capabilities::from_bits(raw.capabilities),
    })
}

/// The PyTorch release whose ATen operators [`is_aten_operator`] knows.
pub fn aten_catalog_version() -> &'static str {
    CATALOG.lines().next().and_then(|l| l.strip_prefix("# PyTorch ")).unwrap_or("?")
}

const CATALOG: &str = include_str!("../data/aten_operators.txt");

/// Whether `name` (`add.Tensor`, `relu`) is an ATen operator of the PyTorch
/// release torch-fl was built against ([`aten_catalog_version`]).
pub fn is_aten_operator(name: &str) -> bool {
    // A binary search over the sorted lines of the text itself: no list to
    // build on the first load, a few lines read per lookup.
    let text = CATALOG.as_bytes();
    let mut lo = text.iter().position(|&b| b == b'\n').map_or(text.len(), |i| i + 1); // after the header
    let mut hi = text.len();
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        // `lo` is always a line start, so the line holding `mid` starts at
        // or after it.
        let start = text[lo..mid].iter().rposition(|&b| b == b'\n').map_or(lo, |i| lo + i + 1);
        let end = text[start..].iter().position(|&b| b == b'\n').map_or(text.len(), |i| start + i);
        match text[start..end].cmp(name.as_bytes()) {
            std::cmp::Ordering::Equal => return true,
            std::cmp::Ordering::Less => lo = end + 1,
            std::cmp::Ordering::Greater => hi = start,
        }
    }
    false
}

/// The message for an op-table `aten` operator that `torch_version` does
/// not have: the same words from `verify` (the catalog's release) and from
/// registration (the installed release).
pub fn unknown_aten_operator(name: &str, torch_version: &str) -> String {
    format!(
        "operator '{name}' is not an ATen operator of PyTorch {torch_version}, so it is not registered: check the name \
         and overload against PyTorch's native_functions.yaml (a misspelling, or an operator of another PyTorch \
         release)"
    )
}

/// What the op-table check decided about one entry that passed the
/// structural checks.
pub(crate) enum Verdict {
    /// Register it.
    Keep,
    /// Register it, but warn (an ATen operator unknown to the catalog).
    KeepWithWarning(Finding),
    /// Leave it out, with this warning.
    Drop(Finding),
}

fn custom_op_warning(name: &str, problem: String) -> Finding {
    Finding {
        stage: Stage::OpTable,
        kind: WarningKind::CustomOperatorSchema,
        subject: name.to_owned(),
        message: format!("custom operator '{name}' is not registered: {problem}"),
    }
}

/// One entry's name, schema and kernel kind, after the structural checks:
/// an aten operator the catalog lacks is a warning, a custom operator whose
/// schema the ABI cannot serve is left out.
pub(crate) fn operator(name: &str, parsed: &OpName<'_>, schema_text: Option<&str>, infer: bool) -> Verdict {
    if parsed.namespace == "aten" {
        let bare = name.strip_prefix("aten::").unwrap_or(name);
        if is_aten_operator(bare) {
            return Verdict::Keep;
        }
        return Verdict::KeepWithWarning(Finding {
            stage: Stage::OpTable,
            kind: WarningKind::UnknownAtenOperator,
            subject: name.to_owned(),
            message: unknown_aten_operator(name, aten_catalog_version()),
        });
    }
    let Some(text) = schema_text else {
        return Verdict::Keep; // refused before: a custom operator needs a schema
    };
    match custom_schema(parsed, text, infer) {
        Ok(_) => Verdict::Keep,
        Err(problem) => Verdict::Drop(custom_op_warning(name, problem)),
    }
}

/// Parses and checks a custom operator's schema against its op-table name.
pub(crate) fn custom_schema(parsed: &OpName<'_>, text: &str, infer: bool) -> Result<Schema, String> {
    let s = schema::parse(text).map_err(|e| format!("its schema {text:?} is not valid: {e}"))?;
    let overload = parsed.overload;
    if s.name != parsed.op
        || s.overload != overload
        || s.namespace.as_deref().is_some_and(|ns| ns != parsed.namespace)
    {
        let declared = format!(
            "{}{}{}",
            s.namespace.as_deref().map(|ns| format!("{ns}::")).unwrap_or_default(),
            s.name,
            if s.overload.is_empty() { String::new() } else { format!(".{}", s.overload) }
        );
        let wanted = format!(
            "{}{}",
            parsed.op,
            if overload.is_empty() { String::new() } else { format!(".{overload}") }
        );
        return Err(format!(
            "its schema {text:?} declares '{declared}', not '{wanted}': the schema starts with the operator's name \
             without its namespace"
        ));
    }
    s.check_kind(infer).map_err(|e| format!("its schema {text:?} does not fit a plugin kernel: {e}"))?;
    Ok(s)
}

/// Checks `schema` as the schema of the custom operator `op_name`
/// (`ns::op[.overload]`), as loading a plugin's op table does: `Err` says
/// why registration would leave the operator out.
pub fn check_custom_schema(op_name: &str, schema: &str, has_infer_outputs: bool) -> Result<(), String> {
    let parsed = parse_op_name(op_name).map_err(|e| format!("{op_name:?} is not an operator name: {e}"))?;
    custom_schema(&parsed, schema, has_infer_outputs).map(drop)
}

/// Custom backwards (`ns::op_backward`) whose arity breaks the backward
/// convention, among the kept operators: each is a warning, and the
/// backward is left out (the forward stays, without a gradient).
pub(crate) fn backward_arity(ops: &[OpKernel]) -> Vec<Finding> {
    let schemas: Vec<(&OpKernel, Schema)> = ops
        .iter()
        .filter_map(|op| {
            let parsed = parse_op_name(&op.name).ok()?;
            let text = op.schema.as_deref()?;
            (parsed.namespace != "aten")
                .then(|| custom_schema(&parsed, text, op.infer_outputs.is_some()).ok())?
                .map(|s| (op, s))
        })
        .collect();
    let mut found = Vec::new();
    for (forward, fs) in &schemas {
        let Ok(parsed) = parse_op_name(&forward.name) else { continue };
        let overload =
            if parsed.overload.is_empty() { String::new() } else { format!(".{}", parsed.overload) };
        let backward_name = format!("{}::{}_backward{overload}", parsed.namespace, parsed.op);
        let Some((backward, bs)) = schemas.iter().find(|(op, _)| op.name == backward_name) else { continue };
        let (n_args, n_returns) = (fs.returns.len() + fs.arguments.len(), fs.tensor_arguments());
        if bs.arguments.len() != n_args || bs.returns.len() != n_returns {
            found.push(Finding {
                stage: Stage::OpTable,
                kind: WarningKind::BackwardArity,
                subject: backward.name.clone(),
                message: format!(
                    "custom operator '{}' is not registered, so '{}' has no gradient: a backward takes one gradient \
                     per forward output and the forward's arguments ({} + {} = {n_args}) and returns one gradient per \
                     Tensor argument ({n_returns}), but its schema has {} arguments and {} returns",
                    backward.name,
                    forward.name,
                    fs.returns.len(),
                    fs.arguments.len(),
                    bs.arguments.len(),
                    bs.returns.len()
                ),
            });
        }
    }
    found
}

/// Refuses a second entry of the same name.
pub(crate) fn unique(names: &mut HashSet<String>, name: &str) -> Result<(), String> {
    if names.insert(name.to_owned()) {
        Ok(())
    } else {
        Err(format!("operator '{name}' appears twice in the op table"))
    }
}

/// Judges `device_count`.
pub(crate) fn device_count(n: i32) -> Result<i32, String> {
    if (0..=torchfl_ffi::TFL_MAX_DEVICES).contains(&n) {
        Ok(n)
    } else {
        Err(format!(
            "device_count reported {n}; a plugin has 0 to TFL_MAX_DEVICES ({}) devices",
            torchfl_ffi::TFL_MAX_DEVICES
        ))
    }
}

/// Judges one device's properties: a refusal's reason, or warnings.
pub(crate) fn device_properties(
    device: i32,
    name: RawString,
    total_memory: u64,
) -> Result<Vec<Finding>, String> {
    string(&format!("device_properties({device}).name"), name)?;
    let mut warnings = Vec::new();
    if total_memory == 0 {
        warnings.push(Finding {
            stage: Stage::Devices,
            kind: WarningKind::ZeroTotalMemory,
            subject: format!("device {device}"),
            message: format!(
                "device {device} reports total_memory = 0: memory statistics and memory-fraction limits will be \
                 wrong; report the device's capacity in bytes"
            ),
        });
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        for ok in ["2.4", "2.4.1", "2.14.1+cu130", "2.5.0a0", "2.6.0.dev20240101", "10.0", "2.4rc1"] {
            assert!(is_version(ok), "{ok}");
        }
        for bad in ["", "2", "banana", ">=2.4", "2.x", "2..4", ".2.4", "2.4 ", "v2.4", "2.4/cpu"] {
            assert!(!is_version(bad), "{bad}");
        }
    }

    #[test]
    fn the_catalog_knows_aten_operators() {
        assert!(is_aten_operator("add.Tensor"));
        // Every listed name is found, and nothing between them.
        for name in CATALOG.lines().skip(1) {
            assert!(is_aten_operator(name), "{name}");
            assert!(!is_aten_operator(&format!("{name}_x_")), "{name}_x_");
        }
        assert!(!is_aten_operator("") && !is_aten_operator("# PyTorch"));
        assert!(is_aten_operator("convolution_backward"));
        assert!(!is_aten_operator("add.Tensr"));
        assert!(!is_aten_operator("frobnicate"));
        assert!(aten_catalog_version().starts_with('2'), "{}", aten_catalog_version());
    }

    #[test]
    fn custom_schemas_must_declare_their_entry() {
        let p = parse_op_name("fx::gelu").unwrap();
        custom_schema(&p, "gelu(Tensor x) -> Tensor", true).unwrap();
        custom_schema(&p, "fx::gelu(Tensor x) -> Tensor", true).unwrap();
        let e = custom_schema(&p, "fused_gelu(Tensor x) -> Tensor", true).unwrap_err();
        assert!(e.contains("declares 'fused_gelu', not 'gelu'"), "{e}");
        let e = custom_schema(&p, "other::gelu(Tensor x) -> Tensor", true).unwrap_err();
        assert!(e.contains("declares 'other::gelu'"), "{e}");
        let e = custom_schema(&p, "gelu(Tensor x -> Tensor", true).unwrap_err();
        assert!(e.contains("is not valid: at column"), "{e}");
    }

    #[test]
    fn device_counts() {
        assert_eq!(device_count(0), Ok(0));
        assert!(device_count(-1).unwrap_err().contains("TFL_MAX_DEVICES"));
        assert!(device_count(1000).is_err());
    }
}
