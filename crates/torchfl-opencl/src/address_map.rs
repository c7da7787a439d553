//! Device addresses for memory that has none: OpenCL buffers are handles
//! (`cl_mem`), while the ABI's device pointers take arithmetic (a view's
//! storage offset, the host's caching allocator handing out `segment + k`,
//! a collective's `buffer + offset`).
//!
//! This is the address-map scheme of `docs/plugin-abi.md` ("Handle-based
//! memory"): each allocation reserves a range of the process' address
//! space with `mmap(PROT_NONE)`, which costs no memory and which the kernel
//! never hands to anything else while it is reserved. The range's start is
//! the pointer `allocate` returns; any address inside it resolves to the
//! buffer and an offset. Because the range is inaccessible, host code that
//! dereferences a device pointer by mistake faults at once instead of
//! corrupting memory, and no host pointer can ever be mistaken for a device
//! one.

use std::collections::BTreeMap;
use std::sync::{PoisonError, RwLock};

use crate::error::{Error, Result};

/// One reserved range and what it maps to.
#[derive(Debug)]
struct Region<H> {
    len: usize,
    handle: H,
}

/// Reserved address ranges, each mapped to a handle `H` (a buffer).
#[derive(Debug)]
pub struct AddressMap<H> {
    regions: RwLock<BTreeMap<usize, Region<H>>>,
}

impl<H> Default for AddressMap<H> {
    fn default() -> Self {
        Self { regions: RwLock::new(BTreeMap::new()) }
    }
}

fn page_round(nbytes: usize) -> usize {
    const PAGE: usize = 4096;
    nbytes.max(1).div_ceil(PAGE) * PAGE
}

impl<H: Copy> AddressMap<H> {
    /// Reserves a fresh range of `nbytes` (at least one page, page-aligned,
    /// so 64-byte alignment holds) for `handle` and returns its start.
    pub fn insert(&self, nbytes: usize, handle: H) -> Result<usize> {
        let len = page_round(nbytes);
        // SAFETY: an anonymous PROT_NONE mapping at an address the kernel
        // chooses touches no existing mapping; MAP_NORESERVE commits nothing.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(Error::out_of_memory(format!(
                "opencl: cannot reserve {len} bytes of address space for a device allocation: {}",
                std::io::Error::last_os_error()
            )));
        }
        let start = addr as usize;
        self.regions.write().unwrap_or_else(PoisonError::into_inner).insert(start, Region { len, handle });
        Ok(start)
    }

    /// Releases the range that starts at `start` and returns its handle;
    /// `None` when no range starts there (not a pointer `insert` returned,
    /// or one already removed).
    pub fn remove(&self, start: usize) -> Option<H> {
        let region = self.regions.write().unwrap_or_else(PoisonError::into_inner).remove(&start)?;
        // SAFETY: the range was mapped by `insert` and is unmapped once,
        // here; nothing dereferences it.
        unsafe { libc::munmap(start as *mut libc::c_void, region.len) };
        Some(region.handle)
    }

    /// The handle and byte offset of `[addr, addr + nbytes)`, which must lie
    /// inside one range. `what` names the pointer in the error.
    pub fn resolve(&self, addr: usize, nbytes: usize, what: &dyn std::fmt::Display) -> Result<(H, usize)> {
        let regions = self.regions.read().unwrap_or_else(PoisonError::into_inner);
        let found = regions.range(..=addr).next_back();
        match found {
            Some((&start, region)) if addr - start < region.len.max(1) => {
                let offset = addr - start;
                if offset.checked_add(nbytes).is_none_or(|end| end > region.len) {
                    return Err(Error::invalid(format!(
                        "opencl: {what}: {nbytes} bytes at 0x{addr:x} run past the end of the \
                         allocation at 0x{start:x} ({} bytes reserved)",
                        region.len
                    )));
                }
                Ok((region.handle, offset))
            }
            _ => Err(Error::invalid(format!(
                "opencl: {what}: 0x{addr:x} is not a device pointer of this plugin (freed, or \
                 never allocated here)"
            ))),
        }
    }

    /// How many ranges are reserved.
    pub fn len(&self) -> usize {
        self.regions.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no range is reserved.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_inside_an_allocation_resolve_to_its_handle_and_offset() {
        let map = AddressMap::default();
        let a = map.insert(10_000, 7u32).unwrap();
        let b = map.insert(0, 8u32).unwrap();
        assert_ne!(a, b);
        assert_eq!(a % 4096, 0);
        assert_eq!(map.resolve(a, 10_000, &"x").unwrap(), (7, 0));
        assert_eq!(map.resolve(a + 4100, 16, &"x").unwrap(), (7, 4100));
        assert_eq!(map.resolve(b, 0, &"x").unwrap(), (8, 0));
        let past = map.resolve(a + 12_000, 1000, &"copy destination").unwrap_err();
        assert!(
            past.message().contains("copy destination") && past.message().contains("past the end"),
            "{past}"
        );
        assert_eq!(map.remove(a), Some(7));
        assert_eq!(map.remove(a), None);
        let freed = map.resolve(a, 1, &"x").unwrap_err();
        assert!(freed.message().contains("not a device pointer"), "{freed}");
        assert_eq!(map.len(), 1);
    }

    #[test]
    fn a_device_address_is_inaccessible_to_host_code() {
        let map = AddressMap::default();
        let a = map.insert(64, ()).unwrap();
        // mincore fails with ENOMEM for unmapped memory but succeeds for a
        // PROT_NONE mapping: the range is reserved, and not readable.
        let mut vec = [0u8; 1];
        // SAFETY: mincore only inspects the mapping.
        let rc = unsafe { libc::mincore(a as *mut libc::c_void, 4096, vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        map.remove(a);
    }
}
