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
//!
//! `memory` is an accounting limit per device: memory is allocated from the
//! host on demand, so a large default costs nothing and lets realistic
//! models run, while a small value lets tests provoke out-of-memory errors.
//! `sync` executes all stream work inline on the calling thread, which makes
//! a failing kernel show up in the call that launched it (for debugging).
//! `strict` hands out tagged, non-dereferenceable device pointers so that a
//! host that touches device memory directly crashes at once instead of
//! working by accident on the simulator and failing on real hardware.

use crate::error::{Error, Result};

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Number of simulated devices.
    pub devices: usize,
    /// Per-device memory capacity in bytes (an accounting limit).
    pub memory: u64,
    /// Asynchronous or synchronous execution.
    pub mode: Mode,
    /// Hand out tagged device pointers that the host cannot dereference.
    pub strict: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self { devices: 2, memory: 16 << 30, mode: Mode::Async, strict: false }
    }
}

/// The recognised keys and their environment variables.
const KEYS: [(&str, &str); 4] = [
    ("devices", "TORCH_FL_SIM_DEVICES"),
    ("memory", "TORCH_FL_SIM_MEMORY"),
    ("mode", "TORCH_FL_SIM_MODE"),
    ("strict", "TORCH_FL_SIM_STRICT"),
];

impl Config {
    /// Defaults overridden by the process environment, then by `options`
    /// (the `TFL_InitArgs.options` string; `None` or `""` for none).
    pub fn resolve(options: Option<&str>) -> Result<Self> {
        let mut config = Self::from_env_with(|name| std::env::var(name).ok())?;
        if let Some(options) = options {
            config.apply_options(options)?;
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
    pub fn apply_options(&mut self, options: &str) -> Result<()> {
        for segment in options.split(';') {
            let segment = segment.trim();
            if segment.is_empty() {
                continue;
            }
            let Some((key, value)) = segment.split_once('=') else {
                return Err(Error::invalid(format!("sim: option {segment:?} is not of the form key=value")));
            };
            let (key, value) = (key.trim(), value.trim());
            if !KEYS.iter().any(|(k, _)| *k == key) {
                return Err(Error::invalid(format!(
                    "sim: unknown option key {key:?} (known keys: devices, memory, mode, strict)"
                )));
            }
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
            "strict" => {
                self.strict = match value.to_ascii_lowercase().as_str() {
                    "1" | "true" => true,
                    "0" | "false" => false,
                    _ => return Err("expected 0 or 1".to_owned()),
                }
            }
            _ => return Err(format!("unknown key {key:?}")),
        }
        Ok(())
    }
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
        assert_eq!(c, Config { devices: 4, memory: 1 << 30, mode: Mode::Sync, strict: true });
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
}
