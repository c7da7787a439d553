//! Locks the released ABI layouts (1.0 to 1.8).
//!
//! Two independent checks:
//! - `released_layout_is_locked`: every offset of every released struct, as
//!   numbers. Changing one is an ABI break and must fail here first.
//! - `rust_mirror_matches_the_c_header`: the C compiler's view of the header
//!   equals Rust's view of the mirror, field by field.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly
#![cfg(target_pointer_width = "64")]

use std::mem::{offset_of, size_of};
use std::process::Command;

use torchfl_ffi::*;

/// (struct, field, Rust offset, Rust field size) for every field of every
/// struct that crosses the boundary.
macro_rules! fields {
    ($($ty:ident { $($field:ident),* $(,)? })*) => {
        vec![$($(
            (
                stringify!($ty),
                stringify!($field),
                offset_of!($ty, $field),
                torchfl_ffi::struct_size!($ty, $field) - offset_of!($ty, $field),
            ),
        )*)*]
    };
}

fn all_fields() -> Vec<(&'static str, &'static str, usize, usize)> {
    fields! {
        TFL_HostApi { struct_size, abi_major, abi_minor, context, log }
        TFL_PluginInfo { struct_size, name, vendor, chip_family, plugin_version, min_torch_version, capabilities }
        TFL_DeviceProperties { struct_size, name, total_memory, compute_units, memory_alignment, capability_major, capability_minor }
        TFL_MemoryStats { struct_size, allocated_bytes, peak_allocated_bytes, reserved_bytes, total_bytes, num_allocations, num_frees, num_ooms }
        TFL_CopyArgs { struct_size, kind, dst_device, src_device, dst, src, nbytes, stream }
        TFL_DType { code, bits, lanes }
        TFL_Tensor { struct_size, data, byte_offset, device_type, device_index, dtype, ndim, shape, strides, flags }
        TFL_Scalar { kind, v }
        TFL_Value { struct_size, tag, u }
        TFL_CallFrame { struct_size, op_name, device_index, stream, args, num_args, outputs, num_outputs, resize_output, host_context, rng_seed, rng_offset }
        TFL_OpEntry { struct_size, name, symbol, kernel, flags, schema, infer_outputs }
        TFL_OutputMeta { struct_size, dtype, ndim, shape }
        TFL_OpTable { struct_size, entries, num_entries, entry_size }
        TFL_InitArgs { struct_size, options }
        TFL_PluginApi {
            struct_size, abi_major, abi_minor,
            error_code, error_message, error_destroy,
            get_info, initialize, get_op_table,
            device_count, device_properties, device_synchronize,
            allocate, deallocate, copy, set_memory,
            default_stream, stream_create, stream_destroy, stream_synchronize, stream_query, stream_wait_event,
            event_create, event_destroy, event_record, event_query, event_synchronize,
            event_elapsed_time, memory_stats, reset_peak_memory_stats, empty_cache,
            get_collectives,
            host_allocate, host_deallocate,
            probe_devices,
            get_graphs,
            get_activity,
        }
        TFL_UniqueId { bytes }
        TFL_Collectives {
            struct_size, get_unique_id, comm_init_rank, comm_destroy, comm_abort, comm_get_async_error,
            all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all, send, recv,
            group_start, group_end,
            comm_init_rank_config,
        }
        TFL_CommConfig { struct_size, timeout_ms, blocking }
        TFL_Graphs {
            struct_size, stream_begin_capture, stream_end_capture, graph_instantiate, graph_launch,
            graph_exec_destroy, graph_destroy,
        }
        TFL_GraphLaunchArgs { struct_size, rng_seed, rng_offset_base }
        TFL_Activity {
            struct_size, activity_enable, activity_set_correlation, activity_drain, activity_clock,
            range_push, range_pop, range_mark,
        }
        TFL_ActivityRecord {
            struct_size, kind, flags, device, reserved, stream, correlation_id, start_ns, end_ns, name, detail,
        }
    }
}

#[test]
fn released_layout_is_locked() {
    // The version fields sit at a fixed offset forever (rule 2 of the ABI).
    assert_eq!(offset_of!(TFL_PluginApi, abi_major), 8);
    assert_eq!(offset_of!(TFL_PluginApi, abi_minor), 12);
    assert_eq!(offset_of!(TFL_HostApi, abi_major), 8);
    assert_eq!(offset_of!(TFL_HostApi, abi_minor), 12);

    // ABI 1.0 sizes, as TFL_STRUCT_SIZE(type, last field).
    assert_eq!(struct_size!(TFL_HostApi, log), 32);
    assert_eq!(struct_size!(TFL_PluginInfo, capabilities), 56);
    assert_eq!(struct_size!(TFL_DeviceProperties, memory_alignment), 32);
    assert_eq!(struct_size!(TFL_MemoryStats, num_ooms), 64);
    assert_eq!(struct_size!(TFL_CopyArgs, stream), 56);
    assert_eq!(struct_size!(TFL_Tensor, flags), 64);
    assert_eq!(struct_size!(TFL_Value, u), 40);
    assert_eq!(struct_size!(TFL_CallFrame, rng_offset), 96);
    assert_eq!(struct_size!(TFL_OpEntry, schema), 48);
    assert_eq!(struct_size!(TFL_OpTable, entry_size), 32);
    assert_eq!(struct_size!(TFL_InitArgs, options), 16);
    assert_eq!(struct_size!(TFL_PluginApi, empty_cache), 240);

    // ABI 1.1 additions.
    assert_eq!(struct_size!(TFL_OpEntry, infer_outputs), 56);
    assert_eq!(struct_size!(TFL_OutputMeta, shape), 144);

    // ABI 1.2 additions.
    assert_eq!(struct_size!(TFL_DeviceProperties, capability_minor), 40);

    // ABI 1.3 additions: the collectives extension.
    assert_eq!(struct_size!(TFL_PluginApi, get_collectives), 248);
    assert_eq!(struct_size!(TFL_Collectives, group_end), 128);

    // ABI 1.4 additions: page-locked host memory.
    assert_eq!(struct_size!(TFL_PluginApi, host_deallocate), 264);

    // ABI 1.5 additions: communicator settings.
    assert_eq!(struct_size!(TFL_Collectives, comm_init_rank_config), 136);
    assert_eq!(offset_of!(TFL_Collectives, comm_init_rank_config), 128);
    assert_eq!(struct_size!(TFL_CommConfig, blocking), 20);
    assert_eq!(offset_of!(TFL_CommConfig, timeout_ms), 8);

    // ABI 1.6 additions: device discovery without initialization.
    assert_eq!(struct_size!(TFL_PluginApi, probe_devices), 272);
    assert_eq!(offset_of!(TFL_CommConfig, blocking), 16);

    // ABI 1.7 additions: device graphs.
    assert_eq!(struct_size!(TFL_PluginApi, get_graphs), 280);
    assert_eq!(struct_size!(TFL_Graphs, graph_destroy), 56);
    assert_eq!(struct_size!(TFL_GraphLaunchArgs, rng_offset_base), 24);

    // ABI 1.8 additions: activity records and ranges.
    assert_eq!(struct_size!(TFL_PluginApi, get_activity), 288);
    assert_eq!(struct_size!(TFL_Activity, range_mark), 64);
    assert_eq!(struct_size!(TFL_ActivityRecord, detail), 248);
    assert_eq!(offset_of!(TFL_ActivityRecord, name), 56);

    // Frozen value types.
    assert_eq!(size_of::<TFL_DType>(), 4);
    assert_eq!(size_of::<TFL_Scalar>(), 24);
    assert_eq!(size_of::<TFL_UniqueId>(), TFL_UNIQUE_ID_BYTES);

    // Every function-table entry is one pointer, in declaration order.
    let api: Vec<_> = all_fields().into_iter().filter(|f| f.0 == "TFL_PluginApi").collect();
    for (i, (_, field, offset, size)) in api.iter().skip(3).enumerate() {
        assert_eq!(*offset, 16 + 8 * i, "TFL_PluginApi.{field} moved");
        assert_eq!(*size, 8, "TFL_PluginApi.{field} is not one pointer");
    }
    let graphs: Vec<_> = all_fields().into_iter().filter(|f| f.0 == "TFL_Graphs").collect();
    for (i, (_, field, offset, size)) in graphs.iter().skip(1).enumerate() {
        assert_eq!(*offset, 8 + 8 * i, "TFL_Graphs.{field} moved");
        assert_eq!(*size, 8, "TFL_Graphs.{field} is not one pointer");
    }
    let activity: Vec<_> = all_fields().into_iter().filter(|f| f.0 == "TFL_Activity").collect();
    for (i, (_, field, offset, size)) in activity.iter().skip(1).enumerate() {
        assert_eq!(*offset, 8 + 8 * i, "TFL_Activity.{field} moved");
        assert_eq!(*size, 8, "TFL_Activity.{field} is not one pointer");
    }
    let coll: Vec<_> = all_fields().into_iter().filter(|f| f.0 == "TFL_Collectives").collect();
    for (i, (_, field, offset, size)) in coll.iter().skip(1).enumerate() {
        assert_eq!(*offset, 8 + 8 * i, "TFL_Collectives.{field} moved");
        assert_eq!(*size, 8, "TFL_Collectives.{field} is not one pointer");
    }
}

#[test]
fn has_field_follows_struct_size() {
    let old = offset_of!(TFL_PluginApi, event_elapsed_time);
    assert!(has_field!(TFL_PluginApi, event_synchronize, old));
    assert!(!has_field!(TFL_PluginApi, event_elapsed_time, old));
    assert!(has_field!(TFL_PluginApi, empty_cache, struct_size!(TFL_PluginApi, empty_cache)));
}

fn c_compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_owned())
}

fn cxx_compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".to_owned())
}

fn compile(compiler: &str, args: &[&str], source: &std::path::Path, out: &std::path::Path) {
    let include = include_dir();
    let output = Command::new(compiler)
        .args(args)
        .arg("-I")
        .arg(&include)
        .arg(source)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        output.status.success(),
        "{compiler} {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn rust_mirror_matches_the_c_header() {
    let dir = tempfile::tempdir().unwrap();
    let mut src = String::from(
        "#include <stdio.h>\n#include \"torch_fl/plugin.h\"\n\
         #define F(T, f) printf(\"%s %s %zu %zu\\n\", #T, #f, offsetof(T, f), sizeof(((T*)0)->f));\n\
         int main(void) {\n",
    );
    for (ty, field, _, _) in all_fields() {
        src.push_str(&format!("  F({ty}, {field})\n"));
    }
    src.push_str("  return 0;\n}\n");
    let source = dir.path().join("layout.c");
    std::fs::write(&source, src).unwrap();
    let exe = dir.path().join("layout");
    compile(&c_compiler(), &["-std=c99", "-Wall", "-Wextra", "-Werror"], &source, &exe);
    let out = Command::new(&exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let c_view: Vec<(String, String, usize, usize)> = text
        .lines()
        .map(|l| {
            let p: Vec<_> = l.split(' ').collect();
            (p[0].to_owned(), p[1].to_owned(), p[2].parse().unwrap(), p[3].parse().unwrap())
        })
        .collect();
    let rust_view: Vec<_> =
        all_fields().into_iter().map(|(t, f, o, s)| (t.to_owned(), f.to_owned(), o, s)).collect();
    assert_eq!(c_view, rust_view);
}

/// The limits the host enforces are the same numbers in C and in Rust.
#[test]
fn limits_match_the_c_header() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("limits.c");
    std::fs::write(
        &source,
        "#include <stdio.h>\n#include \"torch_fl/plugin.h\"\n\
         int main(void) {\n\
           printf(\"%u %zu %zu %zu %zu %d\\n\", TFL_MAX_ABI_VERSION, TFL_MAX_STRUCT_SIZE, TFL_MAX_OP_ENTRIES,\n\
                  TFL_MAX_OP_ENTRY_SIZE, TFL_MAX_STRING_LENGTH, TFL_MAX_DEVICES);\n\
           return 0;\n\
         }\n",
    )
    .unwrap();
    let exe = dir.path().join("limits");
    compile(&c_compiler(), &["-std=c99", "-Wall", "-Wextra", "-Werror"], &source, &exe);
    let text = String::from_utf8(Command::new(&exe).output().unwrap().stdout).unwrap();
    let rust = format!(
        "{TFL_MAX_ABI_VERSION} {TFL_MAX_STRUCT_SIZE} {TFL_MAX_OP_ENTRIES} {TFL_MAX_OP_ENTRY_SIZE} \
         {TFL_MAX_STRING_LENGTH} {TFL_MAX_DEVICES}"
    );
    assert_eq!(text.trim(), rust);
}

/// The header must compile cleanly as strict C99, C11 and C++17, the
/// languages vendors build plugins in.
#[test]
fn header_compiles_as_c99_c11_and_cxx17_with_warnings_as_errors() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("use_header.c");
    // Uses every macro so a typo in one cannot hide.
    std::fs::write(
        &source,
        "#include \"torch_fl/plugin.h\"\n\
         #include \"torch_fl/plugin.h\" /* include guard */\n\
         static const char* bootstrap = TFL_BOOTSTRAP_SYMBOL;\n\
         static const char* prefix = TFL_KERNEL_SYMBOL_PREFIX;\n\
         int main(void) {\n\
           TFL_PluginApi api;\n\
           api.struct_size = TFL_STRUCT_SIZE(TFL_PluginApi, empty_cache);\n\
           api.abi_major = TFL_ABI_VERSION_MAJOR;\n\
           api.abi_minor = TFL_ABI_VERSION_MINOR;\n\
           volatile uint64_t bits = TFL_CAP_HOST_ADDRESSABLE_MEMORY | TFL_CAP_ASYNC_STREAMS |\n\
                                    TFL_CAP_EVENT_TIMING | TFL_CAP_CACHING_ALLOCATOR |\n\
                                    TFL_OP_RANDOM | TFL_OP_DYNAMIC_SHAPE |\n\
                                    TFL_OP_NONDETERMINISTIC | TFL_OP_EXTERNAL | TFL_EVENT_TIMING;\n\
           TFL_Collectives coll;\n\
           TFL_UniqueId id;\n\
           TFL_CommConfig config;\n\
           coll.struct_size = TFL_STRUCT_SIZE(TFL_Collectives, group_end);\n\
           config.struct_size = TFL_STRUCT_SIZE(TFL_CommConfig, blocking);\n\
           config.timeout_ms = 1000;\n\
           config.blocking = 0;\n\
           id.bytes[TFL_UNIQUE_ID_BYTES - 1] = (uint8_t)TFL_REDUCE_AVG;\n\
           return (TFL_HAS_FIELD(TFL_PluginApi, empty_cache, api.struct_size) &&\n\
                   !TFL_HAS_FIELD(TFL_PluginApi, get_collectives, api.struct_size) &&\n\
                   !TFL_HAS_FIELD(TFL_PluginApi, host_deallocate, api.struct_size) &&\n\
                   TFL_HAS_FIELD(TFL_Collectives, group_end, coll.struct_size) &&\n\
                   !TFL_HAS_FIELD(TFL_Collectives, comm_init_rank_config, coll.struct_size) &&\n\
                   TFL_HAS_FIELD(TFL_CommConfig, blocking, config.struct_size) &&\n\
                   config.timeout_ms == 1000 && config.blocking == 0 &&\n\
                   id.bytes[127] == TFL_REDUCE_AVG + TFL_REDUCE_SUM &&\n\
                   bootstrap[0] == 't' && prefix[0] == 't' && bits != 0) ? 0 : 1;\n\
         }\n",
    )
    .unwrap();
    let strict = ["-Wall", "-Wextra", "-Werror", "-pedantic", "-Wno-unused-parameter"];
    for (compiler, std) in
        [(c_compiler(), "-std=c99"), (c_compiler(), "-std=c11"), (cxx_compiler(), "-std=c++17")]
    {
        let mut args = vec![std];
        args.extend(strict);
        if compiler == cxx_compiler() {
            args.extend(["-x", "c++"]);
        }
        let exe = dir.path().join(format!("use_header{}", std.replace(['-', '='], "_")));
        compile(&compiler, &args, &source, &exe);
        let status = Command::new(&exe).status().unwrap();
        assert!(status.success(), "header check program failed for {std}");
    }
}
