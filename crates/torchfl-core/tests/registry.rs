//! The op registry across several plugins, and concurrent use.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use std::sync::Arc;
use std::thread;

use torchfl_core::{load, Arg, LoadOptions, OpRegistry, Plugin, ScalarArg, TensorArg};
use torchfl_ffi::TFL_DType;
use torchfl_testkit::fixture;

fn named(name: &str, extra: &[&str]) -> Arc<Plugin> {
    let define = format!("FIXTURE_NAME=\"{name}\"");
    let mut defines = vec![define.as_str()];
    defines.extend_from_slice(extra);
    load(&fixture(&format!("named_{name}"), &defines), &LoadOptions::default()).unwrap()
}

#[test]
fn highest_priority_wins_and_ties_keep_the_first_registration() {
    let base = named("base", &[]);
    let fused = named("fused", &["FIXTURE_FAILING_KERNEL"]);
    let late = named("late", &[]);

    let reg = OpRegistry::new();
    reg.register(&base, 0);
    reg.register(&late, 0);
    // Tie at priority 0: the earlier registration keeps the op.
    assert_eq!(reg.served_by("add.Tensor").as_deref(), Some("base"));

    reg.register(&fused, 10);
    assert_eq!(reg.served_by("add.Tensor").as_deref(), Some("fused"));
    // Only `fused` has sub.Tensor.
    assert_eq!(reg.served_by("sub.Tensor").as_deref(), Some("fused"));
    assert_eq!(reg.served_by("mm"), None);

    let order: Vec<String> =
        reg.candidates("relu").iter().map(|r| format!("{}:{}", r.plugin.name(), r.priority)).collect();
    assert_eq!(order, ["fused:10", "base:0", "late:0"]);

    let overrides = reg.overrides(&fused);
    assert!(overrides.contains(&("add.Tensor".to_owned(), vec!["base".to_owned(), "late".to_owned()])));
    assert!(!overrides.iter().any(|(op, _)| op == "sub.Tensor"), "nothing to override for sub.Tensor");
    assert!(reg.ops_served_by(&base).is_empty());
    assert_eq!(reg.ops_served_by(&fused).len(), 6);

    // Re-registering changes the priority but not the registration order.
    reg.register(&late, 20);
    assert_eq!(reg.served_by("add.Tensor").as_deref(), Some("late"));
    reg.register(&late, 0);
    reg.register(&fused, 0);
    assert_eq!(reg.served_by("add.Tensor").as_deref(), Some("base"));
    assert_eq!(reg.ops().len(), 6);
    let plugins: Vec<String> = reg.plugins().iter().map(|p| p.name().to_owned()).collect();
    assert_eq!(plugins, ["base", "late", "fused"], "registration order, unchanged by re-registering");
}

#[test]
fn concurrent_lookups_registrations_and_kernel_calls() {
    let p = named("threads", &[]);
    let other = named("threads_other", &[]);
    let reg = Arc::new(OpRegistry::new());
    reg.register(&p, 0);

    let writer = {
        let reg = Arc::clone(&reg);
        let other = Arc::clone(&other);
        thread::spawn(move || {
            for i in 0..200 {
                reg.register(&other, if i % 2 == 0 { -1 } else { -2 });
            }
        })
    };
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let reg = Arc::clone(&reg);
            let p = Arc::clone(&p);
            thread::spawn(move || {
                let stream = p.create_stream(0, 0).unwrap();
                for i in 0..100 {
                    let r = reg.lookup("add.Tensor").expect("add.Tensor is always served");
                    assert_eq!(r.plugin.name(), "threads", "lower priority never wins");
                    let n = 64;
                    let a = p.allocate(0, n * 4).unwrap();
                    let x: Vec<u8> = (0..n).flat_map(|k| ((t * 1000 + i + k) as f32).to_ne_bytes()).collect();
                    p.copy_to_device(&a, 0, &x).unwrap();
                    let out = p.allocate(0, n * 4).unwrap();
                    let view = |b| TensorArg::contiguous(b, TFL_DType::F32, &[n as i64]).unwrap();
                    p.launch(
                        &r.kernel,
                        &stream,
                        &[Arg::Tensor(view(&a)), Arg::Tensor(view(&a)), Arg::Scalar(ScalarArg::Int(1))],
                        &[view(&out)],
                    )
                    .unwrap();
                    stream.synchronize().unwrap();
                    let mut back = vec![0u8; n * 4];
                    p.copy_to_host(&out, 0, &mut back).unwrap();
                    for (k, c) in back.chunks_exact(4).enumerate() {
                        let v = f32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
                        assert_eq!(v, 2.0 * (t * 1000 + i + k) as f32);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    writer.join().unwrap();
}

#[test]
fn a_kernel_of_one_plugin_cannot_be_launched_with_another() {
    let a = named("owner_a", &[]);
    let b = named("owner_b", &[]);
    let stream = a.default_stream(0).unwrap();
    let buf = a.allocate(0, 4).unwrap();
    let t = TensorArg::contiguous(&buf, TFL_DType::F32, &[1]).unwrap();
    let err = a.launch(b.op("neg").unwrap(), &stream, &[Arg::Tensor(t.clone())], &[t]).unwrap_err();
    assert_eq!(err.kind(), "InvalidCall");
}
