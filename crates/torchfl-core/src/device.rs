//! The process' custom device: its name and the plugins that serve it.
//!
//! PyTorch has one `PrivateUse1` dispatch key, renamed once per process, so
//! a process has at most one torch-fl device name. The first plugin bound
//! to it provides the device runtime (memory, copies, streams, events);
//! further plugins contribute kernels only, composed by priority through the
//! [`OpRegistry`]. Their kernels receive the runtime plugin's memory, so a
//! further plugin is accepted only when it can use that memory: it is the
//! same chip family, or both plugins declare host-addressable memory.
//!
//! Torch-free: the Python package asks this module what to register and
//! hands the answer to the C++ shim.

use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::plugin::Plugin;
use crate::registry::{OpRegistry, Registration};

/// PyTorch's own device type names (`c10::DeviceType`), which a custom
/// device cannot take.
pub const RESERVED_DEVICE_NAMES: &[&str] = &[
    "cpu",
    "cuda",
    "mkldnn",
    "opengl",
    "opencl",
    "ideep",
    "hip",
    "fpga",
    "maia",
    "xla",
    "vulkan",
    "metal",
    "xpu",
    "mps",
    "meta",
    "hpu",
    "ve",
    "lazy",
    "ipu",
    "mtia",
    "privateuseone",
    "privateuse1",
];

/// Checks that `name` can become the custom device's name.
pub fn validate_device_name(name: &str) -> Result<()> {
    let invalid =
        |reason: &str| Error::InvalidDeviceName { name: name.to_owned(), reason: reason.to_owned() };
    let mut chars = name.chars();
    // PyTorch's device strings (`c10::Device`) take letters and `_` only:
    // a name with a digit would register, then fail in `torch.device(...)`.
    let well_formed = matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c == '_');
    if !well_formed {
        return Err(invalid(
            "it must start with a lowercase letter and contain only [a-z_] (PyTorch's device strings have no digits)",
        ));
    }
    if RESERVED_DEVICE_NAMES.contains(&name) {
        return Err(invalid("it is one of PyTorch's built-in device types"));
    }
    Ok(())
}

/// The custom device and the plugins serving it.
#[derive(Debug)]
pub struct DeviceBinding {
    name: String,
    runtime: Arc<Plugin>,
    registry: OpRegistry,
}

impl DeviceBinding {
    /// The device name PyTorch knows it by (`"sim"` in `sim:0`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The plugin providing memory, copies, streams and events.
    pub fn runtime(&self) -> &Arc<Plugin> {
        &self.runtime
    }
    /// Which bound plugin serves each operator on this device.
    pub fn registry(&self) -> &OpRegistry {
        &self.registry
    }
}

/// What binding one more plugin changed.
#[derive(Debug)]
pub struct BindReport {
    /// The process' device, now including the plugin.
    pub device: Arc<DeviceBinding>,
    /// Whether this call created the device (and `plugin` is its runtime).
    pub created: bool,
    /// Operators whose serving kernel changed: register these.
    pub changed: Vec<Arc<Registration>>,
}

static BOUND: Mutex<Option<Arc<DeviceBinding>>> = Mutex::new(None);

/// The device bound in this process, if any.
pub fn bound_device() -> Option<Arc<DeviceBinding>> {
    BOUND.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Why `plugin` cannot use `runtime`'s memory, if it cannot.
fn incompatibility(runtime: &Plugin, plugin: &Plugin) -> Option<String> {
    if std::ptr::eq(runtime, plugin) || runtime.info().chip_family == plugin.info().chip_family {
        return None;
    }
    if runtime.capabilities().host_addressable_memory() && plugin.capabilities().host_addressable_memory() {
        return None;
    }
    Some(format!(
        "its chip family '{}' differs from '{}' and the two do not both declare host-addressable memory",
        plugin.info().chip_family,
        runtime.info().chip_family
    ))
}

/// Binds `plugin` to the device `name` at `priority` (higher wins per
/// operator; ties keep the earlier plugin).
pub fn bind(name: &str, plugin: &Arc<Plugin>, priority: i32) -> Result<BindReport> {
    validate_device_name(name)?;
    let mut bound = BOUND.lock().unwrap_or_else(|p| p.into_inner());
    let (device, created) = match bound.as_ref() {
        Some(device) if device.name != name => {
            return Err(Error::DeviceNameConflict {
                existing: device.name.clone(),
                requested: name.to_owned(),
            });
        }
        Some(device) => {
            if let Some(reason) = incompatibility(&device.runtime, plugin) {
                return Err(Error::IncompatiblePlugin {
                    plugin: plugin.label().to_owned(),
                    device: name.to_owned(),
                    runtime: device.runtime.label().to_owned(),
                    reason,
                });
            }
            (Arc::clone(device), false)
        }
        None => {
            let device = Arc::new(DeviceBinding {
                name: name.to_owned(),
                runtime: Arc::clone(plugin),
                registry: OpRegistry::new(),
            });
            *bound = Some(Arc::clone(&device));
            (device, true)
        }
    };
    // Winners are compared by kernel address: registrations are rebuilt on
    // every register call, and re-registering at another priority can hand
    // other plugins' operators back too.
    let winners = |registry: &OpRegistry| -> Vec<(String, usize)> {
        registry
            .ops()
            .into_iter()
            .filter_map(|op| registry.lookup(&op).map(|r| (op, r.kernel.kernel as usize)))
            .collect()
    };
    let before = winners(&device.registry);
    device.registry.register(plugin, priority);
    let changed = winners(&device.registry)
        .into_iter()
        .filter(|entry| !before.contains(entry))
        .filter_map(|(op, _)| device.registry.lookup(&op))
        .collect();
    Ok(BindReport { device, created, changed })
}

/// Parses the numeric prefix of a version ("2.14.1+cu130" -> [2, 14, 1]).
fn version_numbers(v: &str) -> Vec<u64> {
    v.split(['.', '+', '-'])
        .map_while(|part| {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// Compares two dotted versions numerically, missing parts as 0.
pub fn version_at_least(found: &str, required: &str) -> bool {
    let (f, r) = (version_numbers(found), version_numbers(required));
    let n = f.len().max(r.len());
    let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    (0..n).map(|i| at(&f, i).cmp(&at(&r, i))).find(|o| o.is_ne()) != Some(std::cmp::Ordering::Less)
}

/// Refuses a plugin whose `min_torch_version` is newer than `torch_version`.
pub fn check_torch_version(plugin: &Plugin, torch_version: &str) -> Result<()> {
    match &plugin.info().min_torch_version {
        Some(required) if !version_at_least(torch_version, required) => Err(Error::TorchTooOld {
            plugin: plugin.label().to_owned(),
            required: required.clone(),
            found: torch_version.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// Keys `metadata=` may check, and the plugin's value for each.
pub fn reported_metadata(plugin: &Plugin) -> Vec<(&'static str, String)> {
    let info = plugin.info();
    vec![
        ("name", info.name.clone()),
        ("vendor", info.vendor.clone()),
        ("chip_family", info.chip_family.clone()),
        ("plugin_version", info.plugin_version.clone()),
        ("min_torch_version", info.min_torch_version.clone().unwrap_or_default()),
        ("abi_version", plugin.abi().plugin.to_string()),
    ]
}

/// The keys `metadata=` may name, in the order [`check_metadata`] reports them.
pub const METADATA_KEYS: [&str; 6] =
    ["name", "vendor", "chip_family", "plugin_version", "min_torch_version", "abi_version"];

/// Checks user expectations (`metadata=`) against what the plugin reports.
/// Versions compare numerically ("2.4" equals "2.4.0").
pub fn check_metadata<'a>(
    plugin: &Plugin,
    expected: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<()> {
    let reported = reported_metadata(plugin);
    for (key, want) in expected {
        let mismatch = |found: String| Error::MetadataMismatch {
            plugin: plugin.label().to_owned(),
            key: key.to_owned(),
            expected: want.to_owned(),
            found,
        };
        let Some((_, found)) = reported.iter().find(|(k, _)| *k == key) else {
            let known: Vec<&str> = reported.iter().map(|(k, _)| *k).collect();
            return Err(mismatch(format!("nothing: the known keys are {}", known.join(", "))));
        };
        let equal = if key.ends_with("version") {
            version_at_least(found, want) && version_at_least(want, found)
        } else {
            found == want
        };
        if !equal {
            return Err(mismatch(found.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_keys_are_the_reported_ones() {
        let src = include_str!("device.rs");
        for key in METADATA_KEYS {
            assert!(src.contains(&format!("(\"{key}\", ")), "{key} is not reported");
        }
    }

    #[test]
    fn device_names() {
        for ok in ["sim", "npu", "ascend", "my_chip"] {
            validate_device_name(ok).unwrap();
        }
        for bad in ["", "Sim", "2x", "a-b", "my_chip2", "cuda", "cpu", "meta", "privateuseone", "with space"]
        {
            assert_eq!(validate_device_name(bad).unwrap_err().kind(), "InvalidDeviceName", "{bad}");
        }
        assert!(validate_device_name("cuda").unwrap_err().to_string().contains("built-in"));
    }

    #[test]
    fn versions_compare_numerically() {
        assert!(version_at_least("2.14.1+cu130", "2.4"));
        assert!(version_at_least("2.4.0", "2.4"));
        assert!(!version_at_least("2.3.9", "2.4"));
        assert!(version_at_least("10.0", "9.9.9"));
        assert!(!version_at_least("2.14.1", "2.15"));
    }
}
