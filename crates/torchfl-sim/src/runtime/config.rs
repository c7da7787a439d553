//! Runtime configuration: options string over environment over defaults.
//!
//! The host passes plugin options through `TFL_InitArgs.options` as
//! `"key=value;key=value"`. Users and CI usually configure the simulator
//! through the environment instead, because they do not control the host's
//! initialization call; so each key has a `TORCH_FL_SIM_*` twin. Options win
//! over the environment, which wins over the defaults:
//!
//! | key       | environment             | values                          | default |
//! |-----------|-------------------------|---------------------------------|---------|
//! | `devices` | `TORCH_FL_SIM_DEVICES`  | `0`..=`64`                      | `2`     |
//! | `memory`  | `TORCH_FL_SIM_MEMORY`   | bytes: `4096`, `512MiB`, `4GiB` | `16GiB` |
//! | `mode`    | `TORCH_FL_SIM_MODE`     | `async` \| `sync`               | `async` |
//! | `strict`  | `TORCH_FL_SIM_STRICT`   | `0` \| `1`                      | `0`     |
//! | `cost_model` | `TORCH_FL_SIM_COST_MODEL` | `off` \| `pcie-gpu`        | `off`   |
//! | `alloc_latency_us` | `TORCH_FL_SIM_ALLOC_LATENCY_US` | µs, `0`..=`1000000` | preset |
//! | `alloc_sync` | `TORCH_FL_SIM_ALLOC_SYNC` | `0` \| `1`                   | preset  |
//! | `launch_latency_us` | `TORCH_FL_SIM_LAUNCH_LATENCY_US` | µs, `0`..=`1000000` | preset |
//! | `copy_latency_us` | `TORCH_FL_SIM_COPY_LATENCY_US` | µs, `0`..=`1000000` | preset |
//! | `pinned_gbps` | `TORCH_FL_SIM_PINNED_GBPS` | GB/s, `0.001`..=`10000`, `0` = free | preset |
//! | `pageable_gbps` | `TORCH_FL_SIM_PAGEABLE_GBPS` | GB/s, as `pinned_gbps` | preset |
//! | `compute_factor` | `TORCH_FL_SIM_COMPUTE_FACTOR` | `1.0`..=`1000`        | preset  |
//! | `self_caching` | `TORCH_FL_SIM_SELF_CACHING` | `0` \| `1`               | `0`     |
//!
//! `memory` is an accounting limit per device: memory is allocated from the
//! host on demand, so a large default costs nothing and lets realistic
//! models run, while a small value lets tests provoke out-of-memory errors.
//! `sync` executes all stream work inline on the calling thread, which makes
//! a failing kernel show up in the call that launched it (for debugging).
//! `strict` hands out tagged, non-dereferenceable device pointers so that a
//! host that touches device memory directly crashes at once instead of
//! working by accident on the simulator and failing on real hardware.
//!
//! # Cost model
//!
//! `cost_model` picks a preset ([`CostModel::OFF`], the default, charges
//! nothing, so tests stay fast; `pcie-gpu` is [`CostModel::PCIE_GPU`], a
//! discrete GPU on PCIe 4.0 x16: allocation 100 µs synchronizing the device,
//! launch 5 µs, copy latency 10 µs, pinned 20 GB/s, pageable 6 GB/s, compute
//! factor 1). Each individual key overrides its figure of the preset,
//! whatever the order and wherever the two come from (options or
//! environment). Where each cost is charged is described in [`super::cost`]:
//! allocation and launch latency on the calling host thread (busy waits),
//! copy and compute time on the device timeline (the stream's worker), a
//! pageable host copy also blocking the caller until it ran.
//!
//! `self_caching=1` makes the plugin report `TFL_CAP_CACHING_ALLOCATOR`, so
//! the host passes every allocation straight through; the plugin then acts
//! as a stream-ordered pool: only an allocation its cache cannot serve pays
//! `alloc_latency_us`, without synchronizing, and `deallocate` is free. It
//! is independent of `cost_model`.

use crate::error::{Error, Result};
use crate::runtime::cost::CostModel;

/// Largest accepted device count (strict-mode pointer tags must fit in a byte).
pub const MAX_DEVICES: usize = 64;

/// How stream work executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Each stream is an in-order queue run by its own worker thread; the
    /// host blocks only in synchronize calls.
    Async,
    /// Everything runs inline on the calling thread before the call returns.
    Sync,
}

/// The simulator's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Number of simulated devices.
    pub devices: usize,
    /// Per-device memory capacity in bytes (an accounting limit).
    pub memory: u64,
    /// Asynchronous or synchronous execution.
    pub mode: Mode,
    /// Hand out tagged device pointers that the host cannot dereference.
    pub strict: bool,
    /// What operations cost (the preset with the individual keys applied).
    pub cost: CostModel,
    /// Report `TFL_CAP_CACHING_ALLOCATOR` and act as a stream-ordered pool.
    pub self_caching: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            devices: 2,
            memory: 16 << 30,
            mode: Mode::Async,
            strict: false,
            cost: CostModel::OFF,
            self_caching: false,
        }
    }
}

/// The recognised keys and their environment variables. `cost_model` comes
/// before the individual cost keys: they override the preset.
const KEYS: [(&str, &str); 13] = [
    ("devices", "TORCH_FL_SIM_DEVICES"),
    ("memory", "TORCH_FL_SIM_MEMORY"),
    ("mode", "TORCH_FL_SIM_MODE"),
    ("strict", "TORCH_FL_SIM_STRICT"),
    ("cost_model", "TORCH_FL_SIM_COST_MODEL"),
    ("alloc_latency_us", "TORCH_FL_SIM_ALLOC_LATENCY_US"),
    ("alloc_sync", "TORCH_FL_SIM_ALLOC_SYNC"),
    ("launch_latency_us", "TORCH_FL_SIM_LAUNCH_LATENCY_US"),
    ("copy_latency_us", "TORCH_FL_SIM_COPY_LATENCY_US"),
    ("pinned_gbps", "TORCH_FL_SIM_PINNED_GBPS"),
    ("pageable_gbps", "TORCH_FL_SIM_PAGEABLE_GBPS"),
    ("compute_factor", "TORCH_FL_SIM_COMPUTE_FACTOR"),
    ("self_caching", "TORCH_FL_SIM_SELF_CACHING"),
];

/// The individual cost keys, which override the preset.
const COST_KEYS: [&str; 7] = [
    "alloc_latency_us",
    "alloc_sync",
    "launch_latency_us",
    "copy_latency_us",
    "pinned_gbps",
    "pageable_gbps",
    "compute_factor",
];

/// Largest accepted latency, in microseconds (one second).
const MAX_LATENCY_US: u64 = 1_000_000;

impl Config {
    /// Defaults overridden by the process environment, then by `options`
    /// (the `TFL_InitArgs.options` string; `None` or `""` for none).
    pub fn resolve(options: Option<&str>) -> Result<Self> {
        Self::resolve_with(options, |name| std::env::var(name).ok())
    }

    /// [`Config::resolve`] with the variables `lookup` returns (testable
    /// form). The individual cost keys override the preset wherever either
    /// comes from, so an option `cost_model=pcie-gpu` keeps an environment
    /// `TORCH_FL_SIM_ALLOC_LATENCY_US`.
    pub fn resolve_with(options: Option<&str>, lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut config = Self::from_env_with(&lookup)?;
        if let Some(options) = options {
            config.apply_options(options)?;
            let preset_in_options = parse_options(options)?.iter().any(|(k, _)| *k == "cost_model");
            if preset_in_options {
                // Re-apply the individual keys that the new preset replaced:
                // from the environment first, then from the options.
                for (key, var) in KEYS.iter().filter(|(k, _)| COST_KEYS.contains(k)) {
                    if let Some(value) = lookup(var) {
                        config
                            .set(key, value.trim())
                            .map_err(|why| Error::invalid(format!("sim: {var}={value:?}: {why}")))?;
                    }
                }
                for (key, value) in parse_options(options)? {
                    if COST_KEYS.contains(&key) {
                        config
                            .set(key, value)
                            .map_err(|why| Error::invalid(format!("sim: option {key}={value:?}: {why}")))?;
                    }
                }
            }
        }
        Ok(config)
    }

    /// Defaults overridden by the process environment.
    pub fn from_env() -> Result<Self> {
        Self::from_env_with(|name| std::env::var(name).ok())
    }

    /// Defaults overridden by the variables `lookup` returns (testable form
    /// of [`Config::from_env`]).
    pub fn from_env_with(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut config = Self::default();
        for (key, var) in KEYS {
            if let Some(value) = lookup(var) {
                config
                    .set(key, value.trim())
                    .map_err(|why| Error::invalid(format!("sim: {var}={value:?}: {why}")))?;
            }
        }
        Ok(config)
    }

    /// Applies `"key=value;key=value"` on top of `self`. Empty segments are
    /// ignored; an unknown key or a bad value is `INVALID_ARGUMENT`.
    /// A `cost_model` key is applied before the individual cost keys of the
    /// same string, whatever their order.
    pub fn apply_options(&mut self, options: &str) -> Result<()> {
        let mut pairs = parse_options(options)?;
        // Stable: the preset first, everything else in its given order.
        pairs.sort_by_key(|(k, _)| *k != "cost_model");
        for (key, value) in pairs {
            self.set(key, value)
                .map_err(|why| Error::invalid(format!("sim: option {key}={value:?}: {why}")))?;
        }
        Ok(())
    }

    /// Sets one known key; the error says why the value is bad.
    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "devices" => {
                let n: usize =
                    value.parse().map_err(|_| "expected a device count (an integer)".to_owned())?;
                if n > MAX_DEVICES {
                    return Err(format!("at most {MAX_DEVICES} devices are supported"));
                }
                self.devices = n;
            }
            "memory" => self.memory = parse_size(value)?,
            "mode" => {
                self.mode = match value.to_ascii_lowercase().as_str() {
                    "async" => Mode::Async,
                    "sync" => Mode::Sync,
                    _ => return Err("expected \"async\" or \"sync\"".to_owned()),
                }
            }
            "strict" => self.strict = parse_flag(value)?,
            "cost_model" => {
                self.cost = match value.to_ascii_lowercase().as_str() {
                    "off" => CostModel::OFF,
                    "pcie-gpu" => CostModel::PCIE_GPU,
                    _ => return Err("expected \"off\" or \"pcie-gpu\"".to_owned()),
                }
            }
            "alloc_latency_us" => self.cost.alloc_latency_ns = parse_latency_ns(value)?,
            "alloc_sync" => self.cost.alloc_sync = parse_flag(value)?,
            "launch_latency_us" => self.cost.launch_latency_ns = parse_latency_ns(value)?,
            "copy_latency_us" => self.cost.copy_latency_ns = parse_latency_ns(value)?,
            "pinned_gbps" => self.cost.pinned_bytes_per_s = parse_gbps(value)?,
            "pageable_gbps" => self.cost.pageable_bytes_per_s = parse_gbps(value)?,
            "compute_factor" => {
                let f: f64 = value.parse().map_err(|_| "expected a number from 1.0 to 1000".to_owned())?;
                if !(1.0..=1000.0).contains(&f) {
                    return Err(
                        "expected a number from 1.0 to 1000 (a slower chip, never a faster one)".to_owned()
                    );
                }
                self.cost.compute_factor = f;
            }
            "self_caching" => self.self_caching = parse_flag(value)?,
            _ => return Err(format!("unknown key {key:?}")),
        }
        Ok(())
    }
}

/// Splits `"key=value;key=value"` into trimmed pairs of known keys; empty
/// segments are skipped.
fn parse_options(options: &str) -> Result<Vec<(&'static str, &str)>> {
    let mut pairs = Vec::new();
    for segment in options.split(';') {
        let segment = segment.trim();
        if segment.is_empty() {
            continue;
        }
        let Some((key, value)) = segment.split_once('=') else {
            return Err(Error::invalid(format!("sim: option {segment:?} is not of the form key=value")));
        };
        let (key, value) = (key.trim(), value.trim());
        let Some((known, _)) = KEYS.iter().find(|(k, _)| *k == key) else {
            let names: Vec<&str> = KEYS.iter().map(|(k, _)| *k).collect();
            return Err(Error::invalid(format!(
                "sim: unknown option key {key:?} (known keys: {})",
                names.join(", ")
            )));
        };
        pairs.push((*known, value));
    }
    Ok(pairs)
}

fn parse_flag(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err("expected 0 or 1".to_owned()),
    }
}

/// Microseconds (a decimal number allowed: `2.5`) to nanoseconds.
fn parse_latency_ns(value: &str) -> Result<u64, String> {
    let range = format!("expected microseconds from 0 to {MAX_LATENCY_US}");
    let us: f64 = value.parse().map_err(|_| range.clone())?;
    if !(0.0..=MAX_LATENCY_US as f64).contains(&us) {
        return Err(range);
    }
    Ok((us * 1_000.0).round() as u64)
}

/// GB/s (decimal gigabytes; `0` for "no transfer cost") to bytes per second.
fn parse_gbps(value: &str) -> Result<u64, String> {
    let range = "expected GB/s from 0.001 to 10000 (0: transfers cost nothing)";
    let gbps: f64 = value.parse().map_err(|_| range.to_owned())?;
    if gbps == 0.0 {
        return Ok(0);
    }
    if !(0.001..=10_000.0).contains(&gbps) {
        return Err(range.to_owned());
    }
    Ok((gbps * 1e9).round() as u64)
}

/// Parses a byte size: a plain integer, or an integer followed by one of
/// `B`, `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024) or `KB`, `MB`, `GB`, `TB`
/// (powers of 1000); units are case-insensitive. Zero is refused: a device
/// that cannot hold a byte is a configuration mistake.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err("expected a size such as 4096, 512MiB or 4GiB".to_owned());
    }
    let number: u64 = digits.parse().map_err(|_| "size does not fit in 64 bits".to_owned())?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "tib" | "t" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!("unknown size unit {other:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"))
        }
    };
    let bytes = number.checked_mul(multiplier).ok_or_else(|| "size does not fit in 64 bits".to_owned())?;
    if bytes == 0 {
        return Err("memory capacity must be greater than zero".to_owned());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> =
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn defaults() {
        let c = Config::from_env_with(env(&[])).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.devices, 2);
        assert_eq!(c.memory, 16 << 30);
        assert_eq!(c.mode, Mode::Async);
        assert!(!c.strict);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("4gib"), Ok(4 << 30));
        assert_eq!(parse_size("1 KiB"), Ok(1024));
        assert_eq!(parse_size("3KB"), Ok(3000));
        assert_eq!(parse_size("10B"), Ok(10));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        for bad in ["", "MiB", "-1", "1.5GiB", "4 parsecs", "0", "99999999999999999999", "17179869184TiB"] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn environment_overrides_defaults() {
        let c = Config::from_env_with(env(&[
            ("TORCH_FL_SIM_DEVICES", "4"),
            ("TORCH_FL_SIM_MEMORY", "1GiB"),
            ("TORCH_FL_SIM_MODE", "sync"),
            ("TORCH_FL_SIM_STRICT", "1"),
        ]))
        .unwrap();
        assert_eq!(
            c,
            Config { devices: 4, memory: 1 << 30, mode: Mode::Sync, strict: true, ..Config::default() }
        );
    }

    #[test]
    fn options_override_environment() {
        let mut c = Config::from_env_with(env(&[("TORCH_FL_SIM_DEVICES", "4")])).unwrap();
        c.apply_options(" devices = 3 ; memory=512MiB;; mode=ASYNC;strict=0;").unwrap();
        assert_eq!(c.devices, 3);
        assert_eq!(c.memory, 512 << 20);
        assert_eq!(c.mode, Mode::Async);
        assert!(!c.strict);
        c.apply_options("").unwrap();
        assert_eq!(c.devices, 3);
    }

    #[test]
    fn unknown_key_is_named() {
        let e = Config::default().apply_options("devices=1;colour=blue").unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        assert!(e.message().contains("\"colour\""), "{}", e.message());
    }

    #[test]
    fn bad_values_name_key_and_value() {
        for (opts, key, value) in [
            ("devices=two", "devices", "two"),
            ("devices=65", "devices", "65"),
            ("memory=lots", "memory", "lots"),
            ("mode=eager", "mode", "eager"),
            ("strict=maybe", "strict", "maybe"),
            ("cost_model=tpu", "cost_model", "tpu"),
            ("alloc_latency_us=-1", "alloc_latency_us", "-1"),
            ("alloc_latency_us=2000000", "alloc_latency_us", "2000000"),
            ("alloc_sync=2", "alloc_sync", "2"),
            ("launch_latency_us=fast", "launch_latency_us", "fast"),
            ("copy_latency_us=NaN", "copy_latency_us", "NaN"),
            ("pinned_gbps=-3", "pinned_gbps", "-3"),
            ("pageable_gbps=1e9", "pageable_gbps", "1e9"),
            ("compute_factor=0.5", "compute_factor", "0.5"),
            ("compute_factor=inf", "compute_factor", "inf"),
            ("self_caching=yes", "self_caching", "yes"),
        ] {
            let e = Config::default().apply_options(opts).unwrap_err();
            assert_eq!(e.code(), ErrorCode::InvalidArgument);
            assert!(e.message().contains(key) && e.message().contains(value), "{opts}: {}", e.message());
        }
        let e = Config::default().apply_options("devices").unwrap_err();
        assert!(e.message().contains("key=value"), "{}", e.message());
    }

    #[test]
    fn bad_environment_names_variable() {
        let e = Config::from_env_with(env(&[("TORCH_FL_SIM_MODE", "fast")])).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        assert!(e.message().contains("TORCH_FL_SIM_MODE") && e.message().contains("fast"));
    }

    #[test]
    fn cost_model_is_off_by_default() {
        let c = Config::resolve_with(None, env(&[])).unwrap();
        assert!(c.cost.is_off() && !c.self_caching);
    }

    #[test]
    fn preset_and_individual_overrides() {
        let c = Config::resolve_with(Some("cost_model=pcie-gpu"), env(&[])).unwrap();
        assert_eq!(c.cost, CostModel::PCIE_GPU);
        // An individual key wins over the preset, in either order.
        for opts in ["alloc_latency_us=250;cost_model=pcie-gpu", "cost_model=pcie-gpu;alloc_latency_us=250"] {
            let c = Config::resolve_with(Some(opts), env(&[])).unwrap();
            assert_eq!(c.cost, CostModel { alloc_latency_ns: 250_000, ..CostModel::PCIE_GPU }, "{opts}");
        }
        // Every key, from the environment, over the preset from the options.
        let c = Config::resolve_with(
            Some("cost_model=pcie-gpu"),
            env(&[
                ("TORCH_FL_SIM_ALLOC_LATENCY_US", "7.5"),
                ("TORCH_FL_SIM_ALLOC_SYNC", "0"),
                ("TORCH_FL_SIM_LAUNCH_LATENCY_US", "1"),
                ("TORCH_FL_SIM_COPY_LATENCY_US", "2"),
                ("TORCH_FL_SIM_PINNED_GBPS", "12.5"),
                ("TORCH_FL_SIM_PAGEABLE_GBPS", "0"),
                ("TORCH_FL_SIM_COMPUTE_FACTOR", "2.5"),
                ("TORCH_FL_SIM_SELF_CACHING", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(
            c.cost,
            CostModel {
                alloc_latency_ns: 7_500,
                alloc_sync: false,
                launch_latency_ns: 1_000,
                copy_latency_ns: 2_000,
                pinned_bytes_per_s: 12_500_000_000,
                pageable_bytes_per_s: 0,
                compute_factor: 2.5,
            }
        );
        assert!(c.self_caching);
        // Options win over the environment for the same key.
        let c = Config::resolve_with(
            Some("launch_latency_us=3;cost_model=off"),
            env(&[("TORCH_FL_SIM_LAUNCH_LATENCY_US", "9"), ("TORCH_FL_SIM_COST_MODEL", "pcie-gpu")]),
        )
        .unwrap();
        assert_eq!(c.cost, CostModel { launch_latency_ns: 3_000, ..CostModel::OFF });
        // A preset from the environment, a key from the options.
        let c =
            Config::resolve_with(Some("compute_factor=4"), env(&[("TORCH_FL_SIM_COST_MODEL", "PCIE-GPU")]))
                .unwrap();
        assert_eq!(c.cost, CostModel { compute_factor: 4.0, ..CostModel::PCIE_GPU });
    }

    #[test]
    fn bad_cost_environment_names_variable_and_range() {
        let e = Config::resolve_with(None, env(&[("TORCH_FL_SIM_PINNED_GBPS", "lots")])).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        let m = e.message();
        assert!(m.contains("TORCH_FL_SIM_PINNED_GBPS") && m.contains("lots") && m.contains("0.001"), "{m}");
        let e = Config::resolve_with(Some("alloc_latency_us=-5"), env(&[])).unwrap_err();
        assert!(e.message().contains("0 to 1000000"), "{}", e.message());
    }
}
