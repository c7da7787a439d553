//! ABI versions and the negotiation rule (docs/plugin-abi.md, "Versioning").
//!
//! - Majors differ: refuse, and touch nothing else in the plugin.
//! - Minors differ: both sides work at the lower minor. Fields newer than
//!   that are never read; the plugin's `struct_size` says which exist.

use std::fmt;

/// A `{major, minor}` ABI version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AbiVersion {
    /// Incompatible across values: host and plugin must agree.
    pub major: u32,
    /// Append-only within a major: peers work at the lower of two minors.
    pub minor: u32,
}

impl AbiVersion {
    /// The version `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// The version this build of torch-fl speaks.
    pub const HOST: Self = Self::new(torchfl_ffi::TFL_ABI_VERSION_MAJOR, torchfl_ffi::TFL_ABI_VERSION_MINOR);
}

impl fmt::Display for AbiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The outcome of a successful handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// The version the host offered: [`AbiVersion::HOST`] unless
    /// `LoadOptions::host_version` overrides it.
    pub host: AbiVersion,
    /// The version the plugin's function table declares.
    pub plugin: AbiVersion,
    /// The version both sides use: same major, the lower minor.
    pub effective: AbiVersion,
}

impl Negotiated {
    /// How the plugin's minor relates to the host's, for diagnostics.
    pub fn relation(&self) -> &'static str {
        match self.plugin.minor.cmp(&self.host.minor) {
            std::cmp::Ordering::Less => "older minor: newer host features are off",
            std::cmp::Ordering::Equal => "exact match",
            std::cmp::Ordering::Greater => "newer minor: the plugin's newer fields are ignored",
        }
    }
}

/// Applies the version rule; `None` when the majors differ (the caller knows
/// both versions and builds the message).
pub fn negotiate(host: AbiVersion, plugin: AbiVersion) -> Option<Negotiated> {
    if host.major != plugin.major {
        return None;
    }
    let effective = AbiVersion::new(host.major, host.minor.min(plugin.minor));
    Some(Negotiated { host, plugin, effective })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_matrix() {
        let host = AbiVersion::new(1, 4);
        let cases = [
            (AbiVersion::new(1, 4), Some(AbiVersion::new(1, 4))),
            (AbiVersion::new(1, 3), Some(AbiVersion::new(1, 3))), // older minor
            (AbiVersion::new(1, 0), Some(AbiVersion::new(1, 0))), // older minor
            (AbiVersion::new(1, 9), Some(AbiVersion::new(1, 4))), // newer minor
            (AbiVersion::new(2, 0), None),                        // major too new
            (AbiVersion::new(0, 7), None),                        // major too old
        ];
        for (plugin, expected) in cases {
            let got = negotiate(host, plugin).map(|n| n.effective);
            assert_eq!(got, expected, "plugin {plugin}");
        }
    }

    #[test]
    fn relation_is_described() {
        let n = negotiate(AbiVersion::new(1, 2), AbiVersion::new(1, 5)).unwrap();
        assert!(n.relation().contains("newer"));
        let n = negotiate(AbiVersion::new(1, 2), AbiVersion::new(1, 0)).unwrap();
        assert!(n.relation().contains("older"));
    }

    #[test]
    fn host_version_matches_the_header() {
        assert_eq!(AbiVersion::HOST.to_string(), "1.8");
    }
}
