//! The `torchfl-abi` command; see the library for what it does.

fn main() -> std::process::ExitCode {
    // Rust ignores SIGPIPE, which turns `torchfl-abi inspect | head` into a
    // panic on the next write; a command-line tool should just stop.
    #[cfg(unix)]
    // SAFETY: called before any other thread exists; restoring a signal's
    // default disposition has no other effect on the process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    std::process::ExitCode::from(torchfl_abi::run(std::env::args_os()))
}
