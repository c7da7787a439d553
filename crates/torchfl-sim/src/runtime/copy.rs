//! Copies between host and device memory and between devices, and
//! `set_memory`: the runtime's byte-moving services.
//!
//! They share one implementation ([`Runtime::copy_raw`]) whose device
//! endpoints are validated like a kernel's tensors and whose work is
//! stream-ordered like a kernel's, so a copy is never a way around the
//! runtime's memory checks.

use std::sync::Arc;
use std::time::Duration;

use super::activity::{copy_detail, ActivityKind};
use super::{Runtime, StreamHandle};
use crate::error::{Error, Result};
use crate::runtime::stream::Work;

/// Direction of a copy (`TFL_CopyKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// Host memory to device memory.
    HostToDevice,
    /// Device memory to host memory.
    DeviceToHost,
    /// Device memory to device memory, possibly across devices.
    DeviceToDevice,
}

/// A copy request with raw addresses, as `TFL_CopyArgs` carries it.
#[derive(Debug, Clone, Copy)]
pub struct RawCopy {
    /// Direction.
    pub kind: CopyKind,
    /// Destination device (ignored for device-to-host).
    pub dst_device: usize,
    /// Source device (ignored for host-to-device).
    pub src_device: usize,
    /// Destination address (a device pointer or a host address).
    pub dst: u64,
    /// Source address.
    pub src: u64,
    /// Bytes to copy.
    pub nbytes: usize,
    /// `None`: synchronous. Otherwise the stream that runs the copy (of the
    /// destination device for host-to-device, of the source device else).
    pub stream: Option<StreamHandle>,
}

impl Runtime {
    /// Copies between host and device memory or between devices.
    ///
    /// # Safety
    /// For host endpoints, `dst`/`src` must be valid for writes/reads of
    /// `nbytes` bytes; with a stream, they must stay valid (and, for the
    /// source, unchanged) until the stream has run the copy. Device
    /// endpoints are validated.
    pub unsafe fn copy_raw(&self, c: &RawCopy) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.copy_impl(c, None) }
    }

    /// [`Runtime::copy_raw`], keeping `staging` alive until the copy ran.
    ///
    /// # Safety
    /// As for [`Runtime::copy_raw`].
    unsafe fn copy_impl(&self, c: &RawCopy, staging: Option<Arc<[u8]>>) -> Result<()> {
        // The one cost of activity records on this path while they are off.
        let kinds = self.activity.kinds();
        let api = if kinds == 0 { None } else { self.api_begin() };
        let n = c.nbytes as i128;
        let (dst, src, stream_device, touched): (usize, usize, usize, Vec<usize>) = match c.kind {
            CopyKind::HostToDevice => {
                self.device(c.dst_device)?;
                let dst = self.resolve(c.dst_device, c.dst, 0, n, &"copy (destination)")?;
                (dst, c.src as usize, c.dst_device, vec![c.dst_device])
            }
            CopyKind::DeviceToHost => {
                self.device(c.src_device)?;
                let src = self.resolve(c.src_device, c.src, 0, n, &"copy (source)")?;
                (c.dst as usize, src, c.src_device, vec![c.src_device])
            }
            CopyKind::DeviceToDevice => {
                self.device(c.dst_device)?;
                self.device(c.src_device)?;
                let dst = self.resolve(c.dst_device, c.dst, 0, n, &"copy (destination)")?;
                let src = self.resolve(c.src_device, c.src, 0, n, &"copy (source)")?;
                (dst, src, c.src_device, vec![c.src_device, c.dst_device])
            }
        };
        if c.nbytes > 0 && (dst == 0 || src == 0) {
            return Err(Error::invalid("sim: copy: NULL host pointer"));
        }
        let nbytes = c.nbytes;
        // Device time of the copy, and whether the caller must wait for it
        // (a pageable host buffer): zero and no without a cost model.
        let (delay, pageable) = match &self.cost {
            None => (Duration::ZERO, false),
            Some(cost) => {
                Self::charge_launch(cost);
                match c.kind {
                    CopyKind::HostToDevice => self.host_copy_time(cost, c.src, nbytes),
                    CopyKind::DeviceToHost => self.host_copy_time(cost, c.dst, nbytes),
                    CopyKind::DeviceToDevice => {
                        (cost.peer_copy_time(nbytes, c.src_device != c.dst_device), false)
                    }
                }
            }
        };
        let work = move || {
            let _staging = staging;
            crate::runtime::cost::device_wait(delay);
            if nbytes > 0 {
                // SAFETY: device ranges were validated above and stay
                // allocated until this work has run (stream-ordered free);
                // host ranges are valid per this function's contract.
                // `copy` tolerates overlap (a copy within one allocation).
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, nbytes) };
            }
            Ok(())
        };
        if kinds & ActivityKind::Copy.bit() != 0 {
            let at = Self::placement(stream_device, c.stream);
            let (name, direction) = copy_names(c);
            let work =
                self.timed_device_work(ActivityKind::Copy, at, name, copy_detail(nbytes, direction), work);
            // SAFETY: forwarded contract.
            return unsafe { self.run_copy(c, stream_device, touched, pageable, work, api) };
        }
        // SAFETY: forwarded contract.
        unsafe { self.run_copy(c, stream_device, touched, pageable, work, api) }
    }

    /// Runs or submits a validated copy's `work`, and finishes its API
    /// record.
    ///
    /// # Safety
    /// As for [`Runtime::copy_raw`]; `work` is the copy of `c`.
    #[inline(always)]
    unsafe fn run_copy(
        &self,
        c: &RawCopy,
        stream_device: usize,
        touched: Vec<usize>,
        pageable: bool,
        work: impl FnOnce() -> Result<()> + Send + 'static,
        api: Option<super::activity::ApiCall>,
    ) -> Result<()> {
        if super::inline_active() {
            return work(); // inside a launched graph: in graph order, now
        }
        match c.stream {
            Some(h) => {
                let s = self.stream_on(h, stream_device, "copy")?;
                let position = s.submit(Work::new(work))?;
                if pageable {
                    // cudaMemcpyAsync from or to pageable memory returns
                    // only once the copy has run.
                    s.fence_at(position).wait();
                }
                if let Some(call) = api {
                    self.api_copy(call, c, stream_device, "simMemcpyAsync");
                }
                Ok(())
            }
            None => {
                for device in touched {
                    self.drain_device(self.device(device)?);
                }
                let outcome = work();
                if let Some(call) = api {
                    self.api_copy(call, c, stream_device, "simMemcpy");
                }
                outcome
            }
        }
    }

    /// Finishes a copy's API record.
    #[cold]
    fn api_copy(&self, call: super::activity::ApiCall, c: &RawCopy, device: usize, name: &str) {
        let (_, direction) = copy_names(c);
        let stream = c.stream.map_or(0, StreamHandle::to_raw);
        self.api_end(call, name, device, stream, |d| *d = copy_detail(c.nbytes, direction));
    }

    /// Copies `src` into device memory at `dst`. With a stream the bytes are
    /// first staged, so `src` may be reused at once.
    pub fn copy_to_device(
        &self,
        device: usize,
        dst: u64,
        src: &[u8],
        stream: Option<StreamHandle>,
    ) -> Result<()> {
        let staging: Option<Arc<[u8]>> = stream.map(|_| Arc::from(src));
        let src_addr = staging.as_ref().map_or(src.as_ptr(), |s| s.as_ptr());
        let copy = RawCopy {
            kind: CopyKind::HostToDevice,
            dst_device: device,
            src_device: device,
            dst,
            src: src_addr as u64,
            nbytes: src.len(),
            stream,
        };
        // SAFETY: a synchronous copy reads `src` before returning; an
        // asynchronous one reads the staging buffer, which its work owns.
        unsafe { self.copy_impl(&copy, staging) }
    }

    /// Copies device memory at `src` into `dst`, synchronously.
    pub fn copy_to_host(&self, device: usize, src: u64, dst: &mut [u8]) -> Result<()> {
        let copy = RawCopy {
            kind: CopyKind::DeviceToHost,
            dst_device: device,
            src_device: device,
            dst: dst.as_mut_ptr() as u64,
            src,
            nbytes: dst.len(),
            stream: None,
        };
        // SAFETY: `dst` is valid for `len` bytes and the copy is synchronous.
        unsafe { self.copy_raw(&copy) }
    }

    /// Copies `nbytes` between device buffers, possibly across devices; with
    /// a stream, it must belong to `src_device`.
    pub fn copy_device_to_device(
        &self,
        dst_device: usize,
        dst: u64,
        src_device: usize,
        src: u64,
        nbytes: usize,
        stream: Option<StreamHandle>,
    ) -> Result<()> {
        let copy =
            RawCopy { kind: CopyKind::DeviceToDevice, dst_device, src_device, dst, src, nbytes, stream };
        // SAFETY: both endpoints are device memory, which copy_raw validates.
        unsafe { self.copy_raw(&copy) }
    }

    /// Sets `nbytes` at `ptr` to `value`; `None` stream: synchronous.
    pub fn set_memory(
        &self,
        device: usize,
        ptr: u64,
        value: u8,
        nbytes: usize,
        stream: Option<StreamHandle>,
    ) -> Result<()> {
        // The one cost of activity records on this path while they are off.
        let kinds = self.activity.kinds();
        let api = if kinds == 0 { None } else { self.api_begin() };
        let d = self.device(device)?;
        let addr = self.resolve(device, ptr, 0, nbytes as i128, &"set_memory")?;
        if let Some(cost) = &self.cost {
            Self::charge_launch(cost);
        }
        let work = move || {
            // SAFETY: the range was validated above and stays allocated
            // until this work has run (stream-ordered free).
            unsafe { std::ptr::write_bytes(addr as *mut u8, value, nbytes) };
            Ok(())
        };
        if kinds & ActivityKind::Memset.bit() != 0 {
            let at = Self::placement(device, stream);
            let mut detail = super::activity::Detail::new();
            let _ =
                std::fmt::Write::write_fmt(&mut detail, format_args!("{nbytes} bytes, value {value:#04x}"));
            let work = self.timed_device_work(ActivityKind::Memset, at, "Memset", detail, work);
            return self.run_memset(d, device, stream, work, api, (nbytes, value));
        }
        self.run_memset(d, device, stream, work, api, (nbytes, value))
    }

    /// Runs or submits a validated fill's `work`, and finishes its API
    /// record.
    #[inline(always)]
    fn run_memset(
        &self,
        d: &super::Device,
        device: usize,
        stream: Option<StreamHandle>,
        work: impl FnOnce() -> Result<()> + Send + 'static,
        api: Option<super::activity::ApiCall>,
        (nbytes, value): (usize, u8),
    ) -> Result<()> {
        let (name, outcome) = match stream {
            Some(h) => {
                ("simMemsetAsync", self.stream_on(h, device, "set_memory")?.submit(Work::new(work)).map(drop))
            }
            None => {
                self.drain_device(d);
                ("simMemset", work())
            }
        };
        if let Some(call) = api {
            self.api_end(call, name, device, stream.map_or(0, StreamHandle::to_raw), |detail| {
                let _ =
                    std::fmt::Write::write_fmt(detail, format_args!("{nbytes} bytes, value {value:#04x}"));
            });
        }
        outcome
    }
}

/// A copy's COPY-record name and its direction in words.
fn copy_names(c: &RawCopy) -> (&'static str, &'static str) {
    match c.kind {
        CopyKind::HostToDevice => ("Memcpy HtoD", "host to device"),
        CopyKind::DeviceToHost => ("Memcpy DtoH", "device to host"),
        CopyKind::DeviceToDevice if c.src_device != c.dst_device => ("Memcpy PtoP", "device to peer device"),
        CopyKind::DeviceToDevice => ("Memcpy DtoD", "device to device"),
    }
}
