//! The activity table (ABI 1.8) as the host sees it: validated at load
//! (a missing required entry or half the range entries refuses the
//! plugin), absent means none, and the safe wrapper over the simulator's
//! records.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use torchfl_core::{load, ActivityKind, LoadOptions, Plugin};
use torchfl_testkit::fixture;

fn load_default(path: &Path) -> Result<Arc<Plugin>, torchfl_core::Error> {
    load(path, &LoadOptions::default())
}

#[test]
fn an_activity_table_with_a_null_entry_is_refused_naming_it() {
    let err = load_default(&fixture("activity_null", &["FIXTURE_ACTIVITY_NULL_ENTRY"])).unwrap_err();
    assert_eq!(err.kind(), "InvalidPlugin", "{err}");
    assert!(err.to_string().contains("TFL_Activity.activity_drain"), "{err}");
}

#[test]
fn range_entries_come_all_or_none() {
    let err = load_default(&fixture("activity_half_ranges", &["FIXTURE_ACTIVITY_HALF_RANGES"])).unwrap_err();
    assert_eq!(err.kind(), "InvalidPlugin", "{err}");
    assert!(err.to_string().contains("range_push, range_pop and range_mark"), "{err}");
}

#[test]
fn a_plugin_without_the_table_has_no_records() {
    let old = load_default(&fixture("activity_old", &[])).unwrap();
    assert!(!old.has_activity() && !old.has_ranges());
    let err = old.activity_enable(ActivityKind::Kernel.bit()).unwrap_err();
    assert_eq!(err.kind(), "Unimplemented", "{err}");
    assert!(err.to_string().contains("get_activity"), "{err}");
}
