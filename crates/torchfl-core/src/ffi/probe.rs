//! Where a plugin's pointers point: which memory is mapped readable and
//! which executable, so that the host never dereferences a plugin-provided
//! range, nor calls a plugin-provided pointer, that would crash it.
//!
//! Sources, cheapest first:
//! - the program headers of every loaded object (`dl_iterate_phdr`): a
//!   plugin's tables, strings and functions normally lie in its own image,
//!   so most checks need no system call;
//! - for other memory (tables on the heap, strings built at run time):
//!   `process_vm_readv` on this very process, one byte per page, which
//!   reports an unmapped or unreadable page as `EFAULT` instead of faulting;
//! - `/proc/self/maps`, read once per snapshot and only when needed: for code
//!   outside every image (a JIT-compiling plugin's kernels) and where
//!   `process_vm_readv` is not permitted (some seccomp profiles).
//!
//! A snapshot is taken per validation pass. Another thread unmapping plugin
//! memory between the check and the read is outside what can be defended.
//!
//! Off Linux nothing can be checked: every range counts as readable and every
//! pointer as executable (the limits and NULL checks still apply).

use std::ffi::c_char;
use std::fmt;
use std::sync::{Arc, OnceLock};

use torchfl_ffi::TFL_MAX_STRING_LENGTH;

/// One mapped range and what it permits.
#[derive(Debug, Clone)]
struct Range {
    start: usize,
    end: usize,
    readable: bool,
    executable: bool,
    /// The `/proc/self/maps` path, for messages. Empty for image segments:
    /// their object's name is looked up only when a message needs it
    /// ([`object_name_at`]): copying the names of the few hundred objects
    /// of a process that imported torch cost ~40 µs per snapshot.
    name: Arc<str>,
}

/// Why a plugin string could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StringFault {
    /// The first byte is not readable memory.
    Unreadable(usize),
    /// Readable memory ends after this many bytes, with no NUL.
    Unterminated(usize),
    /// No NUL within [`TFL_MAX_STRING_LENGTH`] bytes.
    TooLong,
    /// The bytes are not UTF-8.
    NotUtf8,
}

impl fmt::Display for StringFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreadable(at) => write!(f, "points to unreadable memory ({at:#x})"),
            Self::Unterminated(n) => {
                write!(f, "is not NUL-terminated: readable memory ends {n} bytes after its start")
            }
            Self::TooLong => {
                write!(f, "has no NUL within TFL_MAX_STRING_LENGTH ({TFL_MAX_STRING_LENGTH}) bytes")
            }
            Self::NotUtf8 => write!(f, "is not valid UTF-8"),
        }
    }
}

/// Plain data that may be filled from plugin memory byte by byte.
///
/// # Safety
/// Every bit pattern, all-zero included, is a valid value of the type
/// (integers, raw pointers, `Option` of function pointers).
pub(crate) unsafe trait Plain: Copy {}

// SAFETY: integers, raw pointers and Option<fn> fields only.
unsafe impl Plain for torchfl_ffi::TFL_PluginApi {}
// SAFETY: as above.
unsafe impl Plain for torchfl_ffi::TFL_PluginInfo {}
// SAFETY: as above.
unsafe impl Plain for torchfl_ffi::TFL_OpEntry {}

/// The process' mappings as far as one validation pass needs them.
#[derive(Debug)]
pub(crate) struct MemoryMap {
    /// PT_LOAD segments of every loaded object, sorted by start.
    images: Arc<Vec<Range>>,
    /// `/proc/self/maps`, read on first need; `None` when unavailable.
    maps: OnceLock<Option<Vec<Range>>>,
    /// Ranges outside the images that a probe found readable, so that an
    /// array probed whole is not probed again entry by entry.
    probed: std::cell::RefCell<Vec<(usize, usize)>>,
}

fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        #[cfg(unix)]
        {
            // SAFETY: sysconf has no preconditions.
            let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            usize::try_from(n).ok().filter(|&n| n.is_power_of_two()).unwrap_or(4096)
        }
        #[cfg(not(unix))]
        4096
    })
}

/// Index of the first range of `ranges` (sorted by start; neighbours may
/// overlap by the page rounding of segments) that can contain `addr`.
fn first_candidate(ranges: &[Range], addr: usize) -> usize {
    ranges.partition_point(|r| r.start <= addr).saturating_sub(2)
}

/// The range of `ranges` containing `addr`, if any.
fn containing(ranges: &[Range], addr: usize) -> Option<&Range> {
    ranges[first_candidate(ranges, addr)..].iter().take_while(|r| r.start <= addr).find(|r| addr < r.end)
}

/// Whether the sorted, possibly overlapping `ranges` cover `start..end`
/// with ranges for which `ok` holds.
fn covered(ranges: &[Range], start: usize, end: usize, ok: impl Fn(&Range) -> bool) -> bool {
    let mut at = start;
    let candidates = &ranges[first_candidate(ranges, start)..];
    for r in candidates.iter().take_while(|r| r.start < end).filter(|r| r.end > start) {
        if r.start > at {
            return false;
        }
        if !ok(r) {
            return false;
        }
        at = at.max(r.end);
        if at >= end {
            return true;
        }
    }
    at >= end
}

impl MemoryMap {
    /// A map that knows no image yet (every check probes), for before the
    /// plugin is loaded.
    pub(crate) fn empty() -> Self {
        Self {
            images: Arc::new(Vec::new()),
            maps: OnceLock::new(),
            probed: std::cell::RefCell::new(Vec::new()),
        }
    }

    /// The loaded objects' segments now.
    pub(crate) fn snapshot() -> Self {
        Self { images: image_segments(), maps: OnceLock::new(), probed: std::cell::RefCell::new(Vec::new()) }
    }

    fn maps(&self) -> Option<&[Range]> {
        self.maps.get_or_init(read_proc_maps).as_deref()
    }

    /// Whether `len` bytes at `addr` can be read without a fault.
    pub(crate) fn readable(&self, addr: usize, len: usize) -> bool {
        if len == 0 {
            return true;
        }
        let Some(end) = addr.checked_add(len) else { return false };
        if !cfg!(target_os = "linux") {
            return addr != 0;
        }
        if covered(&self.images, addr, end, |r| r.readable) {
            return true;
        }
        if self.probed.borrow().iter().any(|&(s, e)| s <= addr && end <= e) {
            return true;
        }
        match probe_pages(addr, end) {
            Some(true) => {
                self.probed.borrow_mut().push((addr, end));
                true
            }
            Some(false) => false,
            None => match self.maps() {
                Some(maps) => covered(maps, addr, end, |r| r.readable),
                // Nothing can tell: only NULL's page is known bad.
                None => addr >= page_size(),
            },
        }
    }

    /// `Ok` when a function at `addr` lies in executable memory; otherwise
    /// where it points instead, for the message.
    pub(crate) fn executable(&self, addr: usize) -> Result<(), String> {
        if !cfg!(target_os = "linux") {
            return Ok(());
        }
        if addr < page_size() {
            return Err(format!("{addr:#x}, in the unmapped first page (a small integer, not a pointer)"));
        }
        if let Some(image) = containing(&self.images, addr) {
            if image.executable {
                return Ok(());
            }
            return Err(format!(
                "{addr:#x}, in the data of {} (a variable, not a function)",
                object_name_at(addr)
            ));
        }
        // Code outside every image: a JIT's, in an anonymous executable
        // mapping. Only the process map tells.
        match self.maps() {
            Some(maps) => match containing(maps, addr) {
                Some(r) if r.executable => Ok(()),
                Some(r) => Err(format!(
                    "{addr:#x}, in non-executable memory ({})",
                    if r.name.is_empty() { "an anonymous mapping, such as the heap" } else { &r.name }
                )),
                None => Err(format!("{addr:#x}, which is not mapped")),
            },
            None if !self.readable(addr, 1) => Err(format!("{addr:#x}, which is not mapped")),
            None => Ok(()),
        }
    }

    /// Copies the first `len` bytes of the plugin struct at `ptr` into a
    /// zeroed `T` (`len` is clamped to `T`'s size). `None` when `ptr` is
    /// NULL or the bytes are not readable. Unaligned pointers are fine.
    pub(crate) fn copy<T: Plain>(&self, ptr: *const T, len: usize) -> Option<T> {
        let len = len.min(size_of::<T>());
        if ptr.is_null() || !self.readable(ptr as usize, len) {
            return None;
        }
        // SAFETY: `T: Plain` admits all-zero.
        let mut out: T = unsafe { std::mem::zeroed() };
        // SAFETY: `len` bytes at `ptr` are readable (checked above) and fit
        // in `out`; byte copies have no alignment requirement.
        unsafe {
            std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), std::ptr::from_mut(&mut out).cast::<u8>(), len)
        };
        Some(out)
    }

    /// Copies the NUL-terminated UTF-8 string at `ptr`, checking each page
    /// before reading it; `Ok(None)` for NULL.
    pub(crate) fn string(&self, ptr: *const c_char) -> Result<Option<String>, StringFault> {
        if ptr.is_null() {
            return Ok(None);
        }
        let page = page_size();
        let mut bytes: Vec<u8> = Vec::new();
        let mut at = ptr as usize;
        loop {
            let page_end = (at / page).saturating_add(1).saturating_mul(page);
            let chunk = (page_end - at).min(TFL_MAX_STRING_LENGTH + 1 - bytes.len());
            if !self.readable(at, chunk) {
                return Err(if bytes.is_empty() {
                    StringFault::Unreadable(at)
                } else {
                    StringFault::Unterminated(bytes.len())
                });
            }
            // SAFETY: `chunk` bytes at `at` are readable (checked above) and
            // the plugin owns them for the process' lifetime.
            let part = unsafe { std::slice::from_raw_parts(at as *const u8, chunk) };
            if let Some(nul) = part.iter().position(|&b| b == 0) {
                bytes.extend_from_slice(&part[..nul]);
                break;
            }
            bytes.extend_from_slice(part);
            if bytes.len() > TFL_MAX_STRING_LENGTH {
                return Err(StringFault::TooLong);
            }
            at += chunk;
        }
        String::from_utf8(bytes).map(Some).map_err(|_| StringFault::NotUtf8)
    }
}

/// Copies a plugin string for a message (an error's text): NULL, unreadable
/// or unterminated text becomes a description, invalid UTF-8 is replaced,
/// and the text is cut at [`TFL_MAX_STRING_LENGTH`] bytes.
pub(crate) fn message_string(ptr: *const c_char) -> String {
    let map = MemoryMap::empty();
    if ptr.is_null() {
        return String::new();
    }
    let page = page_size();
    let mut bytes: Vec<u8> = Vec::new();
    let mut at = ptr as usize;
    while bytes.len() < TFL_MAX_STRING_LENGTH {
        let page_end = (at / page).saturating_add(1).saturating_mul(page);
        let chunk = (page_end - at).min(TFL_MAX_STRING_LENGTH - bytes.len());
        if !map.readable(at, chunk) {
            bytes.extend_from_slice(b" [the rest of the message is unreadable memory]");
            break;
        }
        // SAFETY: readable, checked just above; borrowed until error_destroy.
        let part = unsafe { std::slice::from_raw_parts(at as *const u8, chunk) };
        if let Some(nul) = part.iter().position(|&b| b == 0) {
            bytes.extend_from_slice(&part[..nul]);
            return String::from_utf8_lossy(&bytes).into_owned();
        }
        bytes.extend_from_slice(part);
        at += chunk;
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Asks the kernel to copy one byte of every page of `start..end` out of
/// this very process: `Some(false)` as soon as one page is not readable,
/// `None` when the system call is unavailable or not permitted.
#[cfg(target_os = "linux")]
fn probe_pages(start: usize, end: usize) -> Option<bool> {
    const BATCH: usize = 512;
    let page = page_size();
    let mut sink = [0u8; BATCH];
    let mut remote = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 1 }; BATCH];
    let mut at = start;
    while at < end {
        let mut n = 0;
        while n < BATCH && at < end {
            remote[n].iov_base = at as *mut libc::c_void;
            n += 1;
            at = (at / page + 1).saturating_mul(page);
        }
        let local = libc::iovec { iov_base: sink.as_mut_ptr().cast(), iov_len: n };
        // SAFETY: process_vm_readv only writes `n` bytes into `sink`, which
        // `local` describes; the remote addresses are read by the kernel,
        // which reports a fault as EFAULT instead of raising a signal.
        let read = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, remote.as_ptr(), n as _, 0) };
        if read < 0 {
            return match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EFAULT) => Some(false),
                _ => None,
            };
        }
        if usize::try_from(read).ok() != Some(n) {
            return Some(false);
        }
    }
    Some(true)
}

#[cfg(not(target_os = "linux"))]
fn probe_pages(_start: usize, _end: usize) -> Option<bool> {
    None
}

/// The loader's counts of objects loaded and unloaded so far, which change
/// whenever the set of loaded objects does; `None` when the loader does not
/// report them.
#[cfg(target_os = "linux")]
fn load_counters() -> Option<(u64, u64)> {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `&mut Option` passed below, alive for the
        // whole dl_iterate_phdr call.
        let out = unsafe { &mut *data.cast::<Option<(u64, u64)>>() };
        if size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + size_of::<u64>() {
            // SAFETY: the loader passes a valid dl_phdr_info of `size` bytes,
            // which covers both counters.
            let info = unsafe { &*info };
            *out = Some((info.dlpi_adds, info.dlpi_subs));
        }
        1 // the first object is enough: the counters are the same for all
    }
    let mut out: Option<(u64, u64)> = None;
    // SAFETY: `first` matches the callback signature and only writes `out`,
    // which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), std::ptr::from_mut(&mut out).cast()) };
    out
}

/// PT_LOAD segments of every loaded object, sorted by start; reused while
/// no object was loaded or unloaded.
#[cfg(target_os = "linux")]
fn image_segments() -> Arc<Vec<Range>> {
    /// The segments, with the loader's counters when they were read.
    type Cached = Option<((u64, u64), Arc<Vec<Range>>)>;
    static CACHE: std::sync::Mutex<Cached> = std::sync::Mutex::new(None);
    let counters = load_counters();
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let (Some(now), Some((then, images))) = (counters, cache.as_ref()) {
        if now == *then {
            return Arc::clone(images);
        }
    }
    let mut images = read_image_segments();
    images.sort_by_key(|r| r.start);
    let images = Arc::new(images);
    *cache = counters.map(|c| (c, Arc::clone(&images)));
    images
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
type Phdr = libc::Elf64_Phdr;
#[cfg(all(target_os = "linux", target_pointer_width = "32"))]
type Phdr = libc::Elf32_Phdr;

/// Calls `each(object, its program headers)` for every loaded object.
#[cfg(target_os = "linux")]
fn for_each_object(mut each: impl FnMut(&libc::dl_phdr_info, &[Phdr])) {
    type Visitor<'a> = &'a mut dyn FnMut(&libc::dl_phdr_info, &[Phdr]);
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `&mut Visitor` passed below, alive for the
        // whole dl_iterate_phdr call, which calls us on one thread.
        let each = unsafe { &mut *data.cast::<Visitor<'_>>() };
        // SAFETY: the loader passes a valid dl_phdr_info for the callback.
        let info = unsafe { &*info };
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        each(info, headers);
        0
    }
    let mut visitor: Visitor<'_> = &mut each;
    // SAFETY: `visit` matches the callback signature and only touches
    // `visitor` through the pointer passed, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), std::ptr::from_mut(&mut visitor).cast()) };
}

/// The page-rounded bounds of a PT_LOAD segment of an object loaded at `base`.
#[cfg(target_os = "linux")]
fn segment_bounds(base: usize, h: &Phdr) -> (usize, usize) {
    let page = page_size();
    let start = base.wrapping_add(h.p_vaddr as usize);
    let end = start.wrapping_add(h.p_memsz as usize);
    (start & !(page - 1), end.div_ceil(page).saturating_mul(page))
}

#[cfg(target_os = "linux")]
fn read_image_segments() -> Vec<Range> {
    let mut out: Vec<Range> = Vec::new();
    let unnamed: Arc<str> = Arc::from("");
    for_each_object(|info, headers| {
        for h in headers.iter().filter(|h| h.p_type == libc::PT_LOAD) {
            let (start, end) = segment_bounds(info.dlpi_addr as usize, h);
            out.push(Range {
                start,
                end,
                readable: h.p_flags & libc::PF_R != 0,
                executable: h.p_flags & libc::PF_X != 0,
                name: Arc::clone(&unnamed),
            });
        }
    });
    out
}

/// The loaded object whose image contains `addr`, for a message: its path,
/// "the main program", or, should it have been unloaded since the
/// snapshot, "a library unloaded since".
#[cfg(target_os = "linux")]
fn object_name_at(addr: usize) -> String {
    let mut found: Option<String> = None;
    for_each_object(|info, headers| {
        if found.is_some() {
            return;
        }
        let contains = headers.iter().filter(|h| h.p_type == libc::PT_LOAD).any(|h| {
            let (start, end) = segment_bounds(info.dlpi_addr as usize, h);
            (start..end).contains(&addr)
        });
        if contains {
            let name = if info.dlpi_name.is_null() {
                String::new()
            } else {
                // SAFETY: non-NULL dlpi_name is NUL-terminated.
                unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_string_lossy().into_owned()
            };
            found = Some(name);
        }
    });
    match found {
        Some(name) if name.is_empty() => "the main program".to_owned(),
        Some(name) => name,
        None => "a library unloaded since".to_owned(),
    }
}

#[cfg(not(target_os = "linux"))]
fn object_name_at(_addr: usize) -> String {
    "the main program".to_owned()
}

#[cfg(not(target_os = "linux"))]
fn image_segments() -> Arc<Vec<Range>> {
    Arc::new(Vec::new())
}

/// `/proc/self/maps`, parsed; `None` when it cannot be read.
fn read_proc_maps() -> Option<Vec<Range>> {
    let text = std::fs::read_to_string("/proc/self/maps").ok()?;
    let mut ranges: Vec<Range> = text.lines().filter_map(parse_maps_line).collect();
    ranges.sort_by_key(|r| r.start);
    Some(ranges)
}

/// `start-end perms offset dev inode [path]`.
fn parse_maps_line(line: &str) -> Option<Range> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.as_bytes();
    let name = fields.nth(3).unwrap_or("").into();
    Some(Range {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        readable: perms.first() == Some(&b'r'),
        executable: perms.get(2) == Some(&b'x'),
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_parse() {
        let r = parse_maps_line("7f00-7f80 r-xp 00000000 08:01 42   /usr/lib/libc.so.6").unwrap();
        assert_eq!((r.start, r.end, r.readable, r.executable), (0x7f00, 0x7f80, true, true));
        assert_eq!(&*r.name, "/usr/lib/libc.so.6");
        let anon = parse_maps_line("1000-2000 ---p 00000000 00:00 0").unwrap();
        assert!(!anon.readable && !anon.executable && anon.name.is_empty());
        assert!(parse_maps_line("garbage").is_none());
    }

    #[test]
    fn coverage_needs_contiguous_permitted_ranges() {
        let r = |start, end, readable| Range { start, end, readable, executable: false, name: "".into() };
        let ranges = [r(0, 10, true), r(10, 20, true), r(30, 40, true), r(40, 50, false)];
        assert!(covered(&ranges, 2, 18, |r| r.readable));
        assert!(!covered(&ranges, 15, 35, |r| r.readable), "a gap");
        assert!(!covered(&ranges, 35, 45, |r| r.readable), "not readable");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn readable_and_executable_memory_is_told_apart() {
        let map = MemoryMap::snapshot();
        let on_heap = vec![1u8; 10_000];
        assert!(map.readable(on_heap.as_ptr() as usize, on_heap.len()));
        assert!(!map.readable(0, 1));
        assert!(!map.readable(16, 8));
        assert!(!map.readable(usize::MAX - 4, 8), "wraps around");
        static DATA: [u8; 4] = [1, 2, 3, 4];
        assert!(map.readable(DATA.as_ptr() as usize, 4));
        assert!(map.executable(maps_lines_parse as *const () as usize).is_ok());
        let data = map.executable(DATA.as_ptr() as usize).unwrap_err();
        assert!(data.contains("not a function"), "{data}");
        assert!(map.executable(on_heap.as_ptr() as usize).is_err());
        assert!(map.executable(8).unwrap_err().contains("first page"));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn strings_stop_at_unreadable_memory_and_at_the_limit() {
        let map = MemoryMap::snapshot();
        assert_eq!(map.string(c"add.Tensor".as_ptr()), Ok(Some("add.Tensor".to_owned())));
        assert_eq!(map.string(std::ptr::null()), Ok(None));
        assert_eq!(map.string(64 as *const c_char), Err(StringFault::Unreadable(64)));
        let long = vec![b'x'; TFL_MAX_STRING_LENGTH + 10];
        assert_eq!(map.string(long.as_ptr().cast()), Err(StringFault::TooLong));
        let bad = [0xffu8, 0xfe, 0];
        assert_eq!(map.string(bad.as_ptr().cast()), Err(StringFault::NotUtf8));
        assert_eq!(message_string(c"fine".as_ptr()), "fine");
    }
}
