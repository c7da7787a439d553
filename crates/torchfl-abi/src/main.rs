//! The `torchfl-abi` command; see the library for what it does.

fn main() -> std::process::ExitCode {
    torchfl_abi::run(std::env::args_os())
}
