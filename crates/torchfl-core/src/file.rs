//! The first loading stage: is this path a plugin file we may load?
//!
//! Symbolic links are resolved first (a loop and a dangling link are each
//! reported as such), and only a regular file is ever opened: a FIFO, a
//! socket or a device is refused from its metadata, never opened, so
//! nothing blocks. The file is then read for its ELF header (opened
//! non-blocking, and checked again through the open descriptor), since the
//! dynamic loader's messages for a text file or a foreign architecture are
//! cryptic. Files other users can write are refused as SSH refuses such keys.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Checks `path` and returns the file to hand to the dynamic loader: the
/// path with every symbolic link resolved.
pub(crate) fn check(path: &Path, allow_writable_by_others: bool) -> Result<PathBuf> {
    let real = resolve(path)?;
    check_type(path, &real)?;
    if !allow_writable_by_others && !allowed_by_env() {
        check_permissions(path, &real)?;
    }
    check_elf(path, &real)?;
    Ok(real)
}

fn not_lib(path: &Path, reason: impl Into<String>) -> Error {
    Error::NotASharedLibrary { path: path.to_owned(), reason: reason.into() }
}

/// Resolves every symbolic link of `path`, telling a missing file, a
/// dangling link and a loop apart.
fn resolve(path: &Path) -> Result<PathBuf> {
    let missing = |detail: String| Error::FileNotFound { path: path.to_owned(), detail };
    match fs::canonicalize(path) {
        Ok(real) => Ok(real),
        Err(e) if is_loop(&e) => Err(not_lib(
            path,
            "it is a symbolic link that loops back on itself (too many levels of symbolic links): point the link \
             at the plugin file",
        )),
        Err(e) => match fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = fs::read_link(path).map(|t| t.display().to_string()).unwrap_or_else(|_| "?".into());
                Err(missing(format!(" (it is a symbolic link to {target}, which does not exist)")))
            }
            Ok(_) => Err(not_lib(path, format!("it cannot be resolved: {e}"))),
            Err(_) => Err(missing(String::new())),
        },
    }
}

#[cfg(unix)]
fn is_loop(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ELOOP)
}

#[cfg(not(unix))]
fn is_loop(_e: &std::io::Error) -> bool {
    false
}

/// Why a non-regular file cannot be a plugin.
fn file_type_reason(meta: &fs::Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        return None;
    }
    if t.is_dir() {
        return Some("it is a directory; name the plugin file, or put the directory in TORCH_FL_PLUGIN_PATH");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return Some("it is a FIFO (named pipe), not a regular file; it was not opened");
        }
        if t.is_socket() {
            return Some("it is a socket, not a regular file");
        }
        if t.is_char_device() || t.is_block_device() {
            return Some("it is a device file, not a regular file");
        }
    }
    Some("it is not a regular file")
}

/// Refuses anything but a regular file, from its metadata alone.
fn check_type(path: &Path, real: &Path) -> Result<()> {
    let meta = fs::metadata(real)
        .map_err(|_| Error::FileNotFound { path: path.to_owned(), detail: String::new() })?;
    match file_type_reason(&meta) {
        None => Ok(()),
        Some(reason) => Err(not_lib(path, reason)),
    }
}

fn allowed_by_env() -> bool {
    std::env::var_os(crate::error::ALLOW_WRITABLE_PLUGINS_ENV).is_some_and(|v| v == "1")
}

/// Refuses a plugin that other users could replace or modify: a
/// world-writable file, or one in a world-writable directory without the
/// sticky bit (where anyone may rename it away and put their own in its
/// place). Group-writable files are accepted: umask 002 makes them the
/// norm on systems with per-user groups.
#[cfg(unix)]
fn check_permissions(path: &Path, real: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    const OTHERS_WRITE: u32 = 0o002;
    const STICKY: u32 = 0o1000;
    let insecure = |why: String| Error::InsecurePermissions { path: path.to_owned(), why };
    let mode = fs::metadata(real)
        .map_err(|_| Error::FileNotFound { path: path.to_owned(), detail: String::new() })?
        .permissions()
        .mode();
    if mode & OTHERS_WRITE != 0 {
        return Err(insecure(format!("the file is writable by every user (mode {:o})", mode & 0o7777)));
    }
    if let Some(dir) = real.parent() {
        if let Ok(meta) = fs::metadata(dir) {
            let dmode = meta.permissions().mode();
            if dmode & OTHERS_WRITE != 0 && dmode & STICKY == 0 {
                return Err(insecure(format!(
                    "its directory {} is writable by every user without the sticky bit (mode {:o})",
                    dir.display(),
                    dmode & 0o7777
                )));
            }
        }
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_permissions(_path: &Path, _real: &Path) -> Result<()> {
    Ok(())
}

/// Opens a regular file for reading without blocking, even if it was
/// replaced by a FIFO since it was checked.
fn open_nonblocking(real: &Path) -> std::io::Result<fs::File> {
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(real)
}

/// Refuses files that cannot be a plugin for this process before handing
/// them to the dynamic loader, whose messages for these cases are cryptic
/// ("invalid ELF header", "wrong ELF class").
fn check_elf(path: &Path, real: &Path) -> Result<()> {
    if !cfg!(target_os = "linux") {
        return Ok(());
    }
    let mut file = open_nonblocking(real).map_err(|e| not_lib(path, format!("cannot read it: {e}")))?;
    // The path may have changed since check_type: judge what was opened.
    let meta = file.metadata().map_err(|e| not_lib(path, format!("cannot read it: {e}")))?;
    if let Some(reason) = file_type_reason(&meta) {
        return Err(not_lib(path, reason));
    }
    let mut header = [0u8; 20];
    let n = file.read(&mut header).map_err(|e| not_lib(path, format!("cannot read it: {e}")))?;
    if n < header.len() || header[..4] != *b"\x7fELF" {
        return Err(not_lib(path, "it has no ELF header"));
    }
    let little_endian = header[5] == 1;
    let half = |i: usize| {
        let b = [header[i], header[i + 1]];
        if little_endian {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        }
    };
    let (e_type, e_machine) = (half(16), half(18));
    let class_bits = if header[4] == 2 { 64 } else { 32 };
    if let Some(host) = host_elf_machine() {
        if e_machine != host || class_bits != usize::BITS {
            let found = format!("{} ({class_bits}-bit ELF)", elf_machine_name(e_machine));
            return Err(Error::WrongArchitecture {
                path: path.to_owned(),
                found,
                expected: std::env::consts::ARCH.to_owned(),
            });
        }
    }
    match e_type {
        3 => Ok(()),
        1 => Err(not_lib(path, "it is a relocatable object file (.o); link it with -shared")),
        2 => Err(not_lib(path, "it is an executable, not a shared library; link it with -shared")),
        4 => Err(not_lib(path, "it is a core dump")),
        t => Err(not_lib(path, format!("its ELF type is {t}, not a shared object"))),
    }
}

/// ELF machine numbers of the architectures torch-fl builds for.
fn elf_machine_name(machine: u16) -> String {
    match machine {
        3 => "x86 (32-bit)".into(),
        8 => "MIPS".into(),
        20 => "PowerPC".into(),
        21 => "PowerPC64".into(),
        22 => "s390x".into(),
        40 => "ARM (32-bit)".into(),
        62 => "x86_64".into(),
        183 => "aarch64".into(),
        243 => "RISC-V".into(),
        258 => "LoongArch".into(),
        other => format!("ELF machine {other}"),
    }
}

fn host_elf_machine() -> Option<u16> {
    match std::env::consts::ARCH {
        "x86" => Some(3),
        "x86_64" => Some(62),
        "arm" => Some(40),
        "aarch64" => Some(183),
        "powerpc64" => Some(21),
        "s390x" => Some(22),
        "riscv64" => Some(243),
        "loongarch64" => Some(258),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_default(path: &Path) -> Result<PathBuf> {
        check(path, true)
    }

    #[test]
    fn missing_file_is_file_not_found() {
        let err = check_default(Path::new("/definitely/not/here.so")).unwrap_err();
        assert_eq!(err.kind(), "FileNotFound");
    }

    #[test]
    fn a_text_file_is_not_a_shared_library() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("plugin.so");
        fs::write(&p, "this is not a plugin, just some text that is long enough").unwrap();
        let err = check_default(&p).unwrap_err();
        assert_eq!(err.kind(), "NotASharedLibrary");
        assert!(err.to_string().contains("ELF"), "{err}");
    }

    #[test]
    fn a_directory_is_refused_with_advice() {
        let dir = tempfile::tempdir().unwrap();
        let err = check_default(dir.path()).unwrap_err();
        assert!(err.to_string().contains("directory"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn links_fifos_and_loops_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let dangling = dir.path().join("libdangling.so");
        std::os::unix::fs::symlink(dir.path().join("gone.so"), &dangling).unwrap();
        let err = check_default(&dangling).unwrap_err();
        assert_eq!(err.kind(), "FileNotFound");
        assert!(err.to_string().contains("symbolic link to") && err.to_string().contains("gone.so"), "{err}");

        let a = dir.path().join("liba.so");
        let b = dir.path().join("libb.so");
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        let err = check_default(&a).unwrap_err();
        assert_eq!(err.kind(), "NotASharedLibrary");
        assert!(err.to_string().contains("loops back on itself"), "{err}");

        let fifo = dir.path().join("libfifo.so");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let err = check_default(&fifo).unwrap_err();
        assert!(err.to_string().contains("FIFO"), "{err}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_foreign_architecture_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("foreign.so");
        let mut h = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
        h.resize(16, 0);
        h.extend_from_slice(&3u16.to_le_bytes()); // ET_DYN
        let foreign: u16 = if std::env::consts::ARCH == "aarch64" { 62 } else { 183 };
        h.extend_from_slice(&foreign.to_le_bytes());
        h.resize(64, 0);
        fs::write(&p, h).unwrap();
        let err = check_default(&p).unwrap_err();
        assert_eq!(err.kind(), "WrongArchitecture", "{err}");
        assert!(err.to_string().contains(std::env::consts::ARCH), "{err}");
    }
}
