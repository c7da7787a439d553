//! The device runtime over OpenCL: one context holding every device of one
//! platform, buffers behind device addresses ([`AddressMap`]), in-order
//! queues as streams, markers as events.
//!
//! How the ABI's rules map onto OpenCL:
//! - `allocate` is `clCreateBuffer` plus an address range; the plugin keeps
//!   its own count against `CL_DEVICE_GLOBAL_MEM_SIZE`, because drivers
//!   allocate lazily and would report a lack of memory at first use, inside
//!   some later command, instead of in `allocate`.
//! - `deallocate` is `clReleaseMemObject`, which OpenCL defines to delete the
//!   buffer only once the commands queued on it have finished: exactly the
//!   ABI's stream-ordered free.
//! - A NULL stream is "synchronous, after everything queued on the device":
//!   every queue of the device is finished first.
//! - An event is the last marker recorded on a queue; a stream waits for one
//!   through a barrier with that marker in its wait list, which OpenCL
//!   orders across queues of one context.

use std::ffi::CString;
use std::ptr;
use std::sync::{Arc, Mutex, PoisonError};

mod clock;
mod copy;
mod stream;

use stream::Progress;
pub use stream::{Event, Stream};

use crate::address_map::AddressMap;
use crate::cl::{self, Cl};
use crate::error::{Error, Result};

/// A `cl_*` handle stored as an integer, so the structs holding it are
/// `Send` and `Sync`: OpenCL objects may be used from any thread (OpenCL
/// 1.1+, except `clSetKernelArg` on one kernel, which the kernel cache
/// serializes).
pub(crate) type Handle = usize;

/// What a device address maps to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Buffer {
    /// The `cl_mem`; 0 for a 0-byte allocation, which has no buffer.
    pub(crate) mem: Handle,
    pub(crate) device: usize,
    pub(crate) nbytes: usize,
}

/// Memory counters of one device (`TFL_MemoryStats`).
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryStats {
    /// Bytes in live allocations.
    pub allocated: u64,
    /// The largest `allocated` since the last reset.
    pub peak: u64,
    /// Successful allocations.
    pub allocations: u64,
    /// Frees.
    pub frees: u64,
    /// Allocations refused for lack of memory.
    pub ooms: u64,
}

/// One OpenCL device.
#[derive(Debug)]
pub(crate) struct Device {
    pub(crate) id: Handle,
    pub(crate) name: CString,
    pub(crate) total_memory: u64,
    max_alloc: u64,
    pub(crate) compute_units: i32,
    pub(crate) version: (i32, i32),
    pub(crate) fp16: bool,
    default_stream: Box<Stream>,
    /// Every live queue of the device (the default one first), for NULL
    /// streams and `device_synchronize`, with its progress and its stream's
    /// `TFL_Stream*` (for activity records). Held while finishing them, so
    /// that a stream destroyed meanwhile is released only afterwards.
    queues: Mutex<Vec<(Handle, Arc<Progress>, usize)>>,
    /// A queue of its own for `activity_clock`'s markers (see
    /// [`Runtime::activity_clock`]), made at first use.
    clock_queue: Mutex<Option<Handle>>,
    stats: Mutex<MemoryStats>,
}

/// The runtime behind the ABI: the platform's devices and their memory.
#[derive(Debug)]
pub struct Runtime {
    pub(crate) cl: &'static Cl,
    pub(crate) platform: String,
    pub(crate) context: Handle,
    pub(crate) devices: Vec<Device>,
    memory: AddressMap<Buffer>,
}

/// Which platform to use: `platform=<index>` in the options, else
/// `TORCH_FL_OPENCL_PLATFORM`, else the first platform with a device.
fn platform_choice(options: Option<&str>) -> Result<Option<usize>> {
    let mut choice = std::env::var("TORCH_FL_OPENCL_PLATFORM").ok().filter(|s| !s.is_empty());
    for pair in options.unwrap_or("").split(';').map(str::trim).filter(|s| !s.is_empty()) {
        match pair.split_once('=') {
            Some(("platform", v)) => choice = Some(v.trim().to_owned()),
            _ => {
                return Err(Error::invalid(format!(
                    "opencl: initialize: unknown option {pair:?}; the only option is platform=<index>"
                )))
            }
        }
    }
    choice
        .map(|v| {
            v.parse::<usize>().map_err(|_| {
                Error::invalid(format!("opencl: platform={v:?} is not a platform index (0, 1, ...)"))
            })
        })
        .transpose()
}

/// `"OpenCL 3.0 PoCL ..."` -> (3, 0).
fn parse_version(text: &str) -> (i32, i32) {
    let number = text.split_whitespace().nth(1).unwrap_or("");
    let mut parts = number.split('.').map(|p| p.parse::<i32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

impl Runtime {
    /// Opens OpenCL, picks the platform and creates the context, one
    /// default queue per device.
    pub fn new(options: Option<&str>) -> Result<Self> {
        let choice = platform_choice(options)?;
        let cl = Cl::get()?;
        let (platform, ids) = Self::choose(cl, choice)?.map_err(Error::precondition)?;
        // SAFETY: `platform` came from clGetPlatformIDs.
        let platform_name = unsafe {
            Cl::info_string(cl.get_platform_info, platform, cl::PLATFORM_NAME, "clGetPlatformInfo")
        }?;
        let raw: Vec<cl::DeviceId> = ids.iter().map(|&d| d as cl::DeviceId).collect();
        let mut status = 0;
        // SAFETY: `raw` holds the platform's device ids; no callback.
        let context = unsafe {
            (cl.create_context)(
                ptr::null(),
                raw.len() as u32,
                raw.as_ptr(),
                None,
                ptr::null_mut(),
                &mut status,
            )
        };
        Cl::check(status, "clCreateContext", &platform_name)?;
        let mut rt = Self {
            cl,
            platform: platform_name,
            context: context as Handle,
            devices: Vec::new(),
            memory: AddressMap::default(),
        };
        for id in ids {
            let device = rt.open_device(id)?;
            rt.devices.push(device);
        }
        Ok(rt)
    }

    /// How many devices [`Runtime::new`] would open with `options`,
    /// without creating a context: the platform and device enumeration
    /// only (ABI 1.6 `probe_devices`). Zero when the platforms list no
    /// device; an error when there is no driver at all or the chosen
    /// platform does not exist.
    pub fn probe(options: Option<&str>) -> Result<usize> {
        let choice = platform_choice(options)?;
        let cl = Cl::get()?;
        Ok(Self::choose(cl, choice)?.map_or(0, |(_, ids)| ids.len()))
    }

    /// The platform to use (`choice`, else the first with a device) and its
    /// devices; `Ok(Err(why))` when it has none.
    #[allow(clippy::type_complexity)]
    fn choose(
        cl: &Cl,
        choice: Option<usize>,
    ) -> Result<std::result::Result<(cl::PlatformId, Vec<Handle>), String>> {
        let platforms = Self::platforms(cl)?;
        if let Some(c) = choice.filter(|&c| c >= platforms.len()) {
            return Err(Error::invalid(format!(
                "opencl: platform {c} does not exist: the OpenCL loader lists {} platform(s)",
                platforms.len()
            )));
        }
        for (index, &platform) in platforms.iter().enumerate() {
            if choice.is_some_and(|c| c != index) {
                continue;
            }
            let devices = Self::device_ids(cl, platform)?;
            if !devices.is_empty() {
                return Ok(Ok((platform, devices)));
            }
        }
        Ok(Err(match choice {
            Some(c) => format!("opencl: platform {c} has no devices"),
            None => {
                "opencl: no OpenCL device: the installed platforms list no devices. Install a driver for \
                     your device, or PoCL (`apt install pocl-opencl-icd`) for the CPU"
                    .to_owned()
            }
        }))
    }

    fn platforms(cl: &Cl) -> Result<Vec<cl::PlatformId>> {
        let mut count = 0u32;
        // SAFETY: a count query.
        let status = unsafe { (cl.get_platform_ids)(0, ptr::null_mut(), &mut count) };
        if status == -1001 || (status == cl::SUCCESS && count == 0) {
            return Err(Error::precondition(
                "opencl: no OpenCL platform: the OpenCL loader found no driver (no ICD in \
                 /etc/OpenCL/vendors). Install one: PoCL (`apt install pocl-opencl-icd`) runs \
                 OpenCL on the CPU; GPU vendors ship their own",
            ));
        }
        Cl::check(status, "clGetPlatformIDs", "")?;
        let mut platforms = vec![ptr::null_mut(); count as usize];
        // SAFETY: `platforms` has room for `count` ids.
        let status = unsafe { (cl.get_platform_ids)(count, platforms.as_mut_ptr(), ptr::null_mut()) };
        Cl::check(status, "clGetPlatformIDs", "")?;
        Ok(platforms)
    }

    fn device_ids(cl: &Cl, platform: cl::PlatformId) -> Result<Vec<Handle>> {
        let mut count = 0u32;
        // SAFETY: a count query on a platform from clGetPlatformIDs.
        let status =
            unsafe { (cl.get_device_ids)(platform, cl::DEVICE_TYPE_ALL, 0, ptr::null_mut(), &mut count) };
        if status == -1 {
            return Ok(Vec::new()); // CL_DEVICE_NOT_FOUND
        }
        Cl::check(status, "clGetDeviceIDs", "")?;
        let count = count.min(torchfl_ffi::TFL_MAX_DEVICES as u32);
        let mut ids = vec![ptr::null_mut(); count as usize];
        // SAFETY: `ids` has room for `count` ids.
        let status = unsafe {
            (cl.get_device_ids)(platform, cl::DEVICE_TYPE_ALL, count, ids.as_mut_ptr(), ptr::null_mut())
        };
        Cl::check(status, "clGetDeviceIDs", "")?;
        Ok(ids.into_iter().map(|d| d as Handle).collect())
    }

    fn open_device(&self, id: Handle) -> Result<Device> {
        let cl = self.cl;
        let raw = id as cl::DeviceId;
        let info = cl.get_device_info;
        // SAFETY: `raw` is a device of the context; each parameter is read
        // with its CL type (cl_ulong, cl_uint, or a string).
        let (name, total_memory, max_alloc, compute_units, version, extensions) = unsafe {
            (
                Cl::info_string(info, raw, cl::DEVICE_NAME, "clGetDeviceInfo")?,
                Cl::info_value::<_, u64>(info, raw, cl::DEVICE_GLOBAL_MEM_SIZE, "clGetDeviceInfo")?,
                Cl::info_value::<_, u64>(info, raw, cl::DEVICE_MAX_MEM_ALLOC_SIZE, "clGetDeviceInfo")?,
                Cl::info_value::<_, u32>(info, raw, cl::DEVICE_MAX_COMPUTE_UNITS, "clGetDeviceInfo")?,
                Cl::info_string(info, raw, cl::DEVICE_VERSION, "clGetDeviceInfo")?,
                Cl::info_string(info, raw, cl::DEVICE_EXTENSIONS, "clGetDeviceInfo")?,
            )
        };
        let queue = self.create_queue(id)?;
        let progress = Arc::new(Progress::default());
        let index = self.devices.len();
        let default_stream =
            Box::new(Stream { device: index, queue, default: true, progress: progress.clone() });
        let handle = default_stream.handle();
        Ok(Device {
            id,
            name: CString::new(name.replace('\0', " ")).unwrap_or_default(),
            total_memory,
            max_alloc,
            compute_units: i32::try_from(compute_units).unwrap_or(i32::MAX),
            version: parse_version(&version),
            fp16: extensions.split_whitespace().any(|e| e == "cl_khr_fp16"),
            default_stream,
            queues: Mutex::new(vec![(queue, progress, handle)]),
            clock_queue: Mutex::new(None),
            stats: Mutex::new(MemoryStats::default()),
        })
    }

    fn create_queue(&self, device: Handle) -> Result<Handle> {
        let mut status = 0;
        // SAFETY: the device belongs to the context.
        let queue = unsafe {
            (self.cl.create_command_queue)(
                self.context as cl::Context,
                device as cl::DeviceId,
                cl::QUEUE_PROFILING_ENABLE,
                &mut status,
            )
        };
        Cl::check(status, "clCreateCommandQueue", "")?;
        Ok(queue as Handle)
    }

    /// The OpenCL platform's name (`CL_PLATFORM_NAME`), e.g. "Portable
    /// Computing Language".
    pub fn platform_name(&self) -> &str {
        &self.platform
    }

    /// The number of devices.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// `device` as an index, or INVALID_ARGUMENT.
    pub fn check_device(&self, device: i32) -> Result<usize> {
        usize::try_from(device).ok().filter(|&d| d < self.devices.len()).ok_or_else(|| {
            Error::invalid(format!(
                "opencl: device {device} does not exist ({} device(s))",
                self.devices.len()
            ))
        })
    }

    pub(crate) fn device(&self, device: usize) -> &Device {
        &self.devices[device]
    }

    /// Whether every device has `cl_khr_fp16`.
    pub fn all_fp16(&self) -> bool {
        !self.devices.is_empty() && self.devices.iter().all(|d| d.fp16)
    }

    // -----------------------------------------------------------------
    // Memory
    // -----------------------------------------------------------------

    /// `allocate`: a buffer of `nbytes` behind a fresh device address.
    pub fn allocate(&self, device: usize, nbytes: usize) -> Result<usize> {
        let dev = &self.devices[device];
        {
            let mut stats = dev.stats.lock().unwrap_or_else(PoisonError::into_inner);
            let fits =
                (nbytes as u64) <= dev.max_alloc && stats.allocated + nbytes as u64 <= dev.total_memory;
            if !fits {
                stats.ooms += 1;
                return Err(Error::out_of_memory(format!(
                    "opencl: device {device} ({}): cannot allocate {nbytes} bytes: {} of {} bytes in use, \
                     and one buffer may hold at most {} bytes (CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
                    dev.name.to_string_lossy(),
                    stats.allocated,
                    dev.total_memory,
                    dev.max_alloc
                )));
            }
            stats.allocated += nbytes as u64;
            stats.peak = stats.peak.max(stats.allocated);
            stats.allocations += 1;
        }
        let created = self.create_buffer(nbytes).and_then(|mem| {
            let addr = self.memory.insert(nbytes, Buffer { mem, device, nbytes });
            if addr.is_err() && mem != 0 {
                // SAFETY: the buffer was just created and is referenced nowhere.
                unsafe { (self.cl.release_mem_object)(mem as cl::Mem) };
            }
            addr
        });
        if created.is_err() {
            let mut stats = dev.stats.lock().unwrap_or_else(PoisonError::into_inner);
            stats.allocated -= nbytes as u64;
            stats.allocations -= 1;
            stats.ooms += 1;
        }
        created
    }

    fn create_buffer(&self, nbytes: usize) -> Result<Handle> {
        if nbytes == 0 {
            return Ok(0); // OpenCL has no empty buffers; the address is enough.
        }
        let mut status = 0;
        // SAFETY: no host pointer; the context is live.
        let mem = unsafe {
            (self.cl.create_buffer)(
                self.context as cl::Context,
                cl::MEM_READ_WRITE,
                nbytes,
                ptr::null_mut(),
                &mut status,
            )
        };
        Cl::check(status, "clCreateBuffer", format_args!("{nbytes} bytes"))?;
        Ok(mem as Handle)
    }

    /// `deallocate`: releases the buffer (OpenCL deletes it once queued
    /// commands that use it have run) and its address range.
    pub fn deallocate(&self, device: usize, addr: usize) -> Result<()> {
        let not_ours =
            || Error::invalid(format!("opencl: deallocate: 0x{addr:x} is not an allocation of this plugin"));
        // Checked before the range is released, so that a wrong device
        // leaves the allocation intact.
        match self.memory.resolve(addr, 0, &"deallocate") {
            Ok((buffer, 0)) if buffer.device != device => {
                return Err(Error::invalid(format!(
                    "opencl: deallocate: 0x{addr:x} was allocated on device {}, not {device}",
                    buffer.device
                )))
            }
            Ok((_, 0)) => {}
            _ => return Err(not_ours()),
        }
        let buffer = self.memory.remove(addr).ok_or_else(not_ours)?;
        if buffer.mem != 0 {
            // SAFETY: the buffer came from clCreateBuffer and is released once.
            let status = unsafe { (self.cl.release_mem_object)(buffer.mem as cl::Mem) };
            Cl::check(status, "clReleaseMemObject", "")?;
        }
        let mut stats = self.devices[device].stats.lock().unwrap_or_else(PoisonError::into_inner);
        stats.allocated -= buffer.nbytes as u64;
        stats.frees += 1;
        Ok(())
    }

    /// The buffer and byte offset of `[addr, addr + nbytes)` on `device`.
    pub(crate) fn resolve(
        &self,
        device: usize,
        addr: usize,
        nbytes: usize,
        what: &dyn std::fmt::Display,
    ) -> Result<(Buffer, usize)> {
        let (buffer, offset) = self.memory.resolve(addr, nbytes, what)?;
        if buffer.device != device {
            return Err(Error::invalid(format!(
                "opencl: {what}: 0x{addr:x} is memory of device {}, not of device {device}",
                buffer.device
            )));
        }
        Ok((buffer, offset))
    }

    /// Live allocations (address ranges).
    pub fn live_allocations(&self) -> usize {
        self.memory.len()
    }

    /// The device's memory counters.
    pub fn memory_stats(&self, device: usize) -> MemoryStats {
        *self.devices[device].stats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Resets the peak to the current allocation.
    pub fn reset_peak(&self, device: usize) {
        let mut stats = self.devices[device].stats.lock().unwrap_or_else(PoisonError::into_inner);
        stats.peak = stats.allocated;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_options_parse() {
        assert_eq!(parse_version("OpenCL 3.0 PoCL 3.1+debian"), (3, 0));
        assert_eq!(parse_version("OpenCL 1.2 "), (1, 2));
        assert_eq!(parse_version("garbage"), (0, 0));
        assert_eq!(platform_choice(Some("platform=1")).unwrap(), Some(1));
        assert!(platform_choice(Some("devices=2")).unwrap_err().message().contains("unknown option"));
        assert!(platform_choice(Some("platform=gpu"))
            .unwrap_err()
            .message()
            .contains("not a platform index"));
    }
}
