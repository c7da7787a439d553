//! A child forked after a plugin was initialized never calls it: every API
//! that would returns `Error::BadFork`, and dropping inherited handles leaks
//! instead of calling the plugin. The plugin is the fixture's fork trap,
//! which aborts when called in a forked child (a plugin with worker threads,
//! such as the simulator, would hang instead: tests/test_fork.py). Its own
//! test binary: it forks, so it must be the only test in its process that
//! initializes plugins.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use std::io::Read;
use std::os::fd::FromRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};

use torchfl_core::{fork, load, Arg, Error, LoadOptions, TensorArg};
use torchfl_ffi::TFL_DType;
use torchfl_testkit::{c_example_plugin, fixture};

/// Runs `body` in a forked child and returns what it reported: "ok", or
/// what went wrong. The child kills itself after 30 s, so a hang fails the
/// test instead of stalling it.
fn in_child(body: impl FnOnce() -> Result<(), String>) -> String {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child runs `body`, writes to the pipe and calls _exit; it
    // never returns into the test harness.
    match unsafe { libc::fork() } {
        -1 => panic!("fork failed"),
        0 => {
            // SAFETY: plain libc calls on descriptors this process owns.
            unsafe {
                libc::alarm(30);
                libc::close(fds[0]);
            }
            let report = match catch_unwind(AssertUnwindSafe(body)) {
                Ok(Ok(())) => "ok".to_owned(),
                Ok(Err(why)) => why,
                Err(_) => "the child panicked".to_owned(),
            };
            // SAFETY: writes an owned buffer to our end of the pipe, then
            // exits without running the parent's atexit handlers.
            unsafe {
                libc::write(fds[1], report.as_ptr().cast(), report.len());
                libc::_exit(0)
            }
        }
        pid => {
            // SAFETY: closes the child's end in the parent; the read end is
            // ours alone and becomes a File that closes it.
            let mut reader = unsafe {
                libc::close(fds[1]);
                std::fs::File::from_raw_fd(fds[0])
            };
            let mut report = String::new();
            reader.read_to_string(&mut report).unwrap();
            let mut status = 0;
            // SAFETY: `pid` is our child; `status` is writable.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "the child did not exit cleanly (status {status:#x}: a hang ends with SIGALRM); it said: {report}"
            );
            report
        }
    }
}

fn expect_bad_fork<T: std::fmt::Debug>(what: &str, r: Result<T, Error>) -> Result<(), String> {
    match r {
        Err(e @ Error::BadFork { .. }) => {
            let m = e.to_string();
            if m.contains("forked subprocess") && m.contains("'spawn'") && m.contains("fork_trap") {
                Ok(())
            } else {
                Err(format!("{what}: unclear message: {m}"))
            }
        }
        other => Err(format!("{what}: expected BadFork, got {other:?}")),
    }
}

#[test]
fn a_forked_child_refuses_every_plugin_call_and_leaks_on_drop() {
    let (trap, other) = (fixture("fork_trap", &["FIXTURE_FORK_TRAP"]), c_example_plugin());
    assert!(!fork::initialized());
    assert_eq!(in_child(|| Ok(())), "ok");

    let p = load(&trap, &LoadOptions::default()).unwrap();
    assert!(fork::initialized() && !fork::in_bad_fork());
    let a = p.allocate(0, 16).unwrap();
    p.copy_to_device(&a, 0, &[1u8; 16]).unwrap();
    let stream = p.create_stream(0, 0).unwrap();
    let event = p.create_event(0, false).unwrap();
    event.record(&stream).unwrap();
    p.synchronize(0).unwrap();

    let report = in_child(|| {
        if !fork::in_bad_fork() || fork::initialized() {
            return Err("the child is not marked as a bad fork".into());
        }
        let mut host = [0u8; 16];
        expect_bad_fork("synchronize", p.synchronize(0))?;
        expect_bad_fork("allocate", p.allocate(0, 16))?;
        expect_bad_fork("memory_stats", p.memory_stats(0))?;
        expect_bad_fork("device_properties", p.device_properties(0))?;
        expect_bad_fork("empty_cache", p.empty_cache(0))?;
        expect_bad_fork("default_stream", p.default_stream(0))?;
        expect_bad_fork("create_stream", p.create_stream(0, 0))?;
        expect_bad_fork("create_event", p.create_event(0, true))?;
        expect_bad_fork("copy_to_host", p.copy_to_host(&a, 0, &mut host))?;
        expect_bad_fork("copy_to_device", p.copy_to_device(&a, 0, &host))?;
        expect_bad_fork("set_memory", p.set_memory(&a, 0, 0, 16, None))?;
        expect_bad_fork("stream synchronize", stream.synchronize())?;
        expect_bad_fork("event query", event.query())?;
        let add = p.op("add.Tensor").ok_or("the fixture has no add.Tensor")?;
        let t = || TensorArg::contiguous(&a, TFL_DType::F32, &[4]).unwrap();
        expect_bad_fork("launch", p.launch(add, &stream, &[Arg::Tensor(t()), Arg::Tensor(t())], &[t()]))?;
        expect_bad_fork("load another plugin", load(&other, &LoadOptions::default()))?;
        expect_bad_fork("load the same plugin", load(&trap, &LoadOptions::default()))?;
        // Destructors run in the child too: they must leak, not call the
        // plugin (the trap would abort the child).
        drop((event, stream, a));
        Ok(())
    });
    assert_eq!(report, "ok");
}
