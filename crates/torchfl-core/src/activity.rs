//! Activity records and ranges (ABI 1.8) from Rust: turn a plugin's
//! recording on, tag calls with correlation ids, drain what it recorded,
//! read its clock, and forward user ranges.
//!
//! This is what `torchfl-abi verify` checks a plugin's activity table with;
//! the C++ shim drives the same entries for `torch_fl.trace` and
//! `torch.profiler`. Every drained record is checked before it becomes an
//! [`ActivityRecord`]: its size, kind, flags, times, and names that end
//! within their arrays. A malformed one is an error naming the record.

use std::ffi::{c_char, CString};

use torchfl_ffi::*;

use crate::error::{Error, PluginStatus, Result, StatusCode};
use crate::ffi::ActivityCall;
use crate::plugin::Plugin;

/// What a record describes (`TFL_ActivityKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActivityKind {
    /// A native runtime call the plugin made (host clock).
    Api,
    /// A kernel's execution on the device.
    Kernel,
    /// A copy's execution on the device.
    Copy,
    /// A fill's execution on the device.
    Memset,
    /// A wait: the host blocked on the device.
    Sync,
    /// A program or kernel build (host clock).
    Build,
    /// A user range, push to pop (host clock).
    Range,
    /// A user mark (host clock).
    Mark,
}

impl ActivityKind {
    /// Every kind, in `TFL_ActivityKind` order.
    pub const ALL: [Self; 8] =
        [Self::Api, Self::Kernel, Self::Copy, Self::Memset, Self::Sync, Self::Build, Self::Range, Self::Mark];

    /// The kind of a `TFL_ActivityKind` value; `None` for an unknown one.
    pub fn from_raw(raw: u32) -> Option<Self> {
        Self::ALL.get(usize::try_from(raw).ok()?.checked_sub(1)?).copied()
    }

    /// The `TFL_ActivityKind` value.
    pub fn raw(self) -> u32 {
        match self {
            Self::Api => TFL_ACTIVITY_API,
            Self::Kernel => TFL_ACTIVITY_KERNEL,
            Self::Copy => TFL_ACTIVITY_COPY,
            Self::Memset => TFL_ACTIVITY_MEMSET,
            Self::Sync => TFL_ACTIVITY_SYNC,
            Self::Build => TFL_ACTIVITY_BUILD,
            Self::Range => TFL_ACTIVITY_RANGE,
            Self::Mark => TFL_ACTIVITY_MARK,
        }
    }

    /// Its bit for [`Plugin::activity_enable`].
    pub fn bit(self) -> u32 {
        1 << self.raw()
    }

    /// `"api"`, `"kernel"`...: how traces name it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Kernel => "kernel",
            Self::Copy => "copy",
            Self::Memset => "memset",
            Self::Sync => "sync",
            Self::Build => "build",
            Self::Range => "range",
            Self::Mark => "mark",
        }
    }
}

/// One record, checked and copied out of the drain buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityRecord {
    /// What it describes.
    pub kind: ActivityKind,
    /// Its times are on the host's `CLOCK_MONOTONIC` (else the device's).
    pub host_clock: bool,
    /// The device, if any.
    pub device: Option<i32>,
    /// The stream's handle as an address (0: none).
    pub stream: usize,
    /// The host's correlation id (0: none).
    pub correlation_id: u64,
    /// Start, nanoseconds.
    pub start_ns: u64,
    /// End, nanoseconds (`>= start_ns`).
    pub end_ns: u64,
    /// The native call, kernel or range.
    pub name: String,
    /// Details, possibly empty.
    pub detail: String,
}

/// What one [`Plugin::activity_drain`] returned.
#[derive(Debug, Clone, Default)]
pub struct Drained {
    /// The complete records, oldest first.
    pub records: Vec<ActivityRecord>,
    /// Records the plugin lost to its bound since the previous drain.
    pub dropped: u64,
}

/// Records asked for per drain call; the drain repeats until fewer come.
const DRAIN_CAPACITY: usize = 256;

/// The text of a NUL-terminated field, or why it is not one.
fn field_text(bytes: &[c_char], what: &str) -> std::result::Result<String, String> {
    // `c_char` is i8 or u8 by platform: reinterpret each as a byte.
    let bytes: Vec<u8> = bytes.iter().map(|&c| c.to_ne_bytes()[0]).collect();
    let end =
        bytes.iter().position(|&b| b == 0).ok_or_else(|| format!("its {what} is not NUL-terminated"))?;
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

/// Checks one drained record (see the module docs).
fn checked(raw: &TFL_ActivityRecord) -> std::result::Result<ActivityRecord, String> {
    let minimum = struct_size!(TFL_ActivityRecord, detail);
    if raw.struct_size < minimum || raw.struct_size > std::mem::size_of::<TFL_ActivityRecord>() {
        return Err(format!("its struct_size is {}, not {minimum}", raw.struct_size));
    }
    let kind = ActivityKind::from_raw(raw.kind)
        .ok_or_else(|| format!("its kind {} is not a TFL_ActivityKind", raw.kind))?;
    if raw.flags & !TFL_ACTIVITY_HOST_CLOCK != 0 {
        return Err(format!("its flags {:#x} have bits the ABI does not define", raw.flags));
    }
    if raw.end_ns < raw.start_ns {
        return Err(format!("it ends ({} ns) before it starts ({} ns)", raw.end_ns, raw.start_ns));
    }
    if raw.device < -1 {
        return Err(format!("its device is {}", raw.device));
    }
    Ok(ActivityRecord {
        kind,
        host_clock: raw.flags & TFL_ACTIVITY_HOST_CLOCK != 0,
        device: (raw.device >= 0).then_some(raw.device),
        stream: raw.stream as usize,
        correlation_id: raw.correlation_id,
        start_ns: raw.start_ns,
        end_ns: raw.end_ns,
        name: field_text(&raw.name, "name")?,
        detail: field_text(&raw.detail, "detail")?,
    })
}

impl Plugin {
    /// Whether the plugin offers activity records (a validated ABI 1.8
    /// activity table).
    pub fn has_activity(&self) -> bool {
        self.activity_table().is_some()
    }

    /// Whether it also forwards user ranges (`range_push`, `range_pop`,
    /// `range_mark`).
    pub fn has_ranges(&self) -> bool {
        self.activity_table().is_some_and(|t| t.range_push.is_some())
    }

    /// Makes one call through the activity table.
    fn activity_call(&self, call: ActivityCall<'_>, name: &'static str) -> Result<()> {
        let Some(t) = self.activity_table() else {
            return Err(Error::Unimplemented {
                plugin: self.label().to_owned(),
                what: format!(
                    "{name}: the plugin offers no activity records (the optional ABI 1.8 get_activity)"
                ),
            });
        };
        let table = self.table(crate::inflight::intern(name))?;
        table.activity_call(t, call).map_err(|s| self.runtime_error(name, s))
    }

    /// Records the kinds whose bits (`ActivityKind::bit`) are set from now
    /// on; 0 stops.
    pub fn activity_enable(&self, kinds: u32) -> Result<()> {
        self.activity_call(ActivityCall::Enable(kinds), "activity_enable")
    }

    /// The calling thread's correlation id for what it does next (0: none).
    pub fn activity_set_correlation(&self, id: u64) -> Result<()> {
        self.activity_call(ActivityCall::SetCorrelation(id), "activity_set_correlation")
    }

    /// Every complete record the plugin holds, checked, oldest first.
    ///
    /// # Errors
    /// The plugin's error, or [`Error::RuntimeCall`] naming a malformed
    /// record (or a count larger than the buffer).
    pub fn activity_drain(&self) -> Result<Drained> {
        let mut out = Drained::default();
        let mut buffer = vec![TFL_ActivityRecord::zeroed(); DRAIN_CAPACITY];
        loop {
            let mut written = 0usize;
            let mut dropped = 0u64;
            self.activity_call(
                ActivityCall::Drain(&mut buffer, &mut written, &mut dropped),
                "activity_drain",
            )?;
            out.dropped = out.dropped.saturating_add(dropped);
            let malformed = |message: String| Error::RuntimeCall {
                plugin: self.label().to_owned(),
                function: "activity_drain",
                status: PluginStatus { code: StatusCode::Internal, message },
            };
            let Some(filled) = buffer.get(..written) else {
                return Err(malformed(format!(
                    "it reported {written} records written into a buffer of {DRAIN_CAPACITY}"
                )));
            };
            for (i, raw) in filled.iter().enumerate() {
                let record = checked(raw)
                    .map_err(|why| malformed(format!("record {i} of the drain is malformed: {why}")))?;
                out.records.push(record);
            }
            if written < DRAIN_CAPACITY {
                return Ok(out);
            }
            buffer.fill(TFL_ActivityRecord::zeroed());
        }
    }

    /// One device time of `device` and the host's `CLOCK_MONOTONIC` time at
    /// the same moment, in nanoseconds: `(device_ns, host_ns)`.
    pub fn activity_clock(&self, device: i32) -> Result<(u64, u64)> {
        let (mut device_ns, mut host_ns) = (0u64, 0u64);
        self.activity_call(ActivityCall::Clock(device, &mut device_ns, &mut host_ns), "activity_clock")?;
        Ok((device_ns, host_ns))
    }

    /// Opens a user range on the calling thread.
    ///
    /// # Errors
    /// [`Error::Unimplemented`] without annotations, or a name with a NUL.
    pub fn range_push(&self, name: &str) -> Result<()> {
        let name = self.range_name(name)?;
        self.activity_call(ActivityCall::Push(&name), "range_push")
    }

    /// Closes the calling thread's innermost range.
    pub fn range_pop(&self) -> Result<()> {
        self.activity_call(ActivityCall::Pop, "range_pop")
    }

    /// Marks an instant.
    pub fn range_mark(&self, name: &str) -> Result<()> {
        let name = self.range_name(name)?;
        self.activity_call(ActivityCall::Mark(&name), "range_mark")
    }

    fn range_name(&self, name: &str) -> Result<CString> {
        CString::new(name).map_err(|_| Error::InvalidCall {
            plugin: self.label().to_owned(),
            reason: format!("the range name {name:?} contains a NUL byte"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u32) -> TFL_ActivityRecord {
        let mut r = TFL_ActivityRecord::zeroed();
        r.struct_size = struct_size!(TFL_ActivityRecord, detail);
        r.kind = kind;
        r.start_ns = 5;
        r.end_ns = 7;
        r
    }

    #[test]
    fn kinds_round_trip_and_bits_fill_the_mask() {
        let mut mask = 0;
        for kind in ActivityKind::ALL {
            assert_eq!(ActivityKind::from_raw(kind.raw()), Some(kind));
            mask |= kind.bit();
        }
        assert_eq!(mask, TFL_ACTIVITY_ALL_KINDS);
        assert_eq!(ActivityKind::from_raw(0), None);
        assert_eq!(ActivityKind::from_raw(9), None);
    }

    #[test]
    fn well_formed_records_are_copied_out() {
        let mut raw = record(TFL_ACTIVITY_KERNEL);
        raw.name[..3].copy_from_slice(&[b'a' as c_char, b'd' as c_char, b'd' as c_char]);
        raw.device = 0;
        raw.correlation_id = 42;
        let r = checked(&raw).expect("well formed");
        assert_eq!(
            (r.kind, r.name.as_str(), r.device, r.correlation_id),
            (ActivityKind::Kernel, "add", Some(0), 42)
        );
        assert!(!r.host_clock);
    }

    #[test]
    fn malformed_records_say_what_is_wrong() {
        let mut small = record(TFL_ACTIVITY_API);
        small.struct_size = 16;
        assert!(checked(&small).unwrap_err().contains("struct_size"));
        assert!(checked(&record(12)).unwrap_err().contains("kind 12"));
        let mut backwards = record(TFL_ACTIVITY_API);
        backwards.end_ns = 1;
        assert!(checked(&backwards).unwrap_err().contains("before it starts"));
        let mut flags = record(TFL_ACTIVITY_API);
        flags.flags = 6;
        assert!(checked(&flags).unwrap_err().contains("flags"));
        let mut unterminated = record(TFL_ACTIVITY_API);
        unterminated.name = [b'x' as c_char; TFL_ACTIVITY_NAME_BYTES];
        assert!(checked(&unterminated).unwrap_err().contains("name is not NUL-terminated"));
    }
}
