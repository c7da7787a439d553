//! Other libraries' operators in the op table (`TFL_OP_EXTERNAL`, ABI 1.3):
//! listed, with their schemas, to hosts that know the flag, and left out
//! for older hosts, which would define them and break the library that
//! owns them. Its own test binary: the plugin remembers the last host that
//! bootstrapped it, so no other test may bootstrap it concurrently.
#![allow(clippy::unwrap_used, clippy::undocumented_unsafe_blocks)]

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use torchfl_ffi::*;

/// The op table as the host at `minor` sees it: `(name, flags, schema)`.
fn table_for(minor: u32) -> Vec<(String, u64, Option<String>)> {
    // Leaked: the plugin keeps the host table for the life of the process.
    let host: &'static TFL_HostApi = Box::leak(Box::new(TFL_HostApi {
        struct_size: struct_size!(TFL_HostApi, log),
        abi_major: 1,
        abi_minor: minor,
        context: null_mut(),
        log: None,
    }));
    let api = unsafe { &*torchfl_sim::torch_fl_plugin_get_api(host) };
    let mut table = TFL_OpTable {
        struct_size: struct_size!(TFL_OpTable, entry_size),
        entries: null(),
        num_entries: 0,
        entry_size: 0,
    };
    assert!(unsafe { api.get_op_table.unwrap()(&mut table) }.is_null());
    (0..table.num_entries)
        .map(|i| {
            let e = unsafe { &*(table.entries as *const u8).add(i * table.entry_size).cast::<TFL_OpEntry>() };
            let text = |p: *const std::ffi::c_char| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned();
            (text(e.name), e.flags, (!e.schema.is_null()).then(|| text(e.schema)))
        })
        .collect()
}

#[test]
fn external_entries_are_listed_only_to_hosts_that_know_the_flag() {
    let current = table_for(TFL_ABI_VERSION_MINOR);
    let external: Vec<_> = current.iter().filter(|(_, flags, _)| flags & TFL_OP_EXTERNAL != 0).collect();
    let names: Vec<&str> = external.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names, ["torchvision::nms", "torchvision::roi_align", "torchvision::_roi_align_backward"]);
    for (name, flags, schema) in &external {
        let schema = schema.as_deref().unwrap();
        assert!(schema.starts_with(name.trim_start_matches("torchvision::")), "{name}: {schema}");
        assert_eq!(flags & TFL_OP_DYNAMIC_SHAPE != 0, name == "torchvision::nms", "{name}");
    }
    assert!(current
        .iter()
        .all(|(n, flags, _)| n.starts_with("torchvision::") == (flags & TFL_OP_EXTERNAL != 0)));

    let older = table_for(2);
    assert_eq!(older.len(), current.len() - external.len());
    assert!(older
        .iter()
        .all(|(n, flags, _)| !n.starts_with("torchvision::") && flags & TFL_OP_EXTERNAL == 0));
}
