//! Copies between host and device memory and within it, and fills.

use std::ffi::c_void;
use std::ptr;

use torchfl_ffi as ffi;

use super::{Runtime, Stream};
use crate::activity::{Site, Work, RECORDER};
use crate::cl::{self, Cl};
use crate::error::{Error, Result};

/// The host end of a transfer.
#[derive(Debug, Clone, Copy)]
enum HostSide {
    /// Host to device, from this memory.
    From(*const c_void),
    /// Device to host, into this memory.
    Into(*mut c_void),
}

impl Runtime {
    // -----------------------------------------------------------------
    // Copies and fills
    // -----------------------------------------------------------------

    /// Host to device: `src` is host memory valid for `nbytes` (and, on a
    /// stream, until the stream has run the copy).
    ///
    /// # Safety
    /// `src` must be readable for `nbytes` bytes for as long as the ABI says.
    pub unsafe fn copy_to_device(
        &self,
        device: usize,
        dst: usize,
        src: *const c_void,
        nbytes: usize,
        stream: Option<&Stream>,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.host_transfer(device, dst, HostSide::From(src), nbytes, stream) }
    }

    /// Device to host.
    ///
    /// # Safety
    /// `dst` must be writable for `nbytes` bytes for as long as the ABI says.
    pub unsafe fn copy_to_host(
        &self,
        device: usize,
        dst: *mut c_void,
        src: usize,
        nbytes: usize,
        stream: Option<&Stream>,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.host_transfer(device, src, HostSide::Into(dst), nbytes, stream) }
    }

    /// `clEnqueueWriteBuffer` or `clEnqueueReadBuffer` between host memory
    /// and `nbytes` at device address `addr`.
    ///
    /// # Safety
    /// The host side must be valid for `nbytes` bytes for as long as the ABI
    /// says (the call, or until the stream has run the copy).
    unsafe fn host_transfer(
        &self,
        device: usize,
        addr: usize,
        host: HostSide,
        nbytes: usize,
        stream: Option<&Stream>,
    ) -> Result<()> {
        let what = match host {
            HostSide::From(_) => "copy destination",
            HostSide::Into(_) => "copy source",
        };
        let (buffer, offset) = self.resolve(device, addr, nbytes, &what)?;
        let (stream, blocking) = self.queue_for(device, stream)?;
        if nbytes == 0 {
            return Ok(());
        }
        let (queue, mem, blocking) = (stream.queue as cl::Queue, buffer.mem as cl::Mem, u32::from(blocking));
        let (call, work) = match host {
            HostSide::From(_) => ("clEnqueueWriteBuffer", "memcpy HtoD"),
            HostSide::Into(_) => ("clEnqueueReadBuffer", "memcpy DtoH"),
        };
        let status = RECORDER.enqueue(
            self.cl,
            Site { call, device, stream: stream.handle(), detail: format_args!("{nbytes} bytes") },
            Work { kind: ffi::TFL_ACTIVITY_COPY, name: work, detail: format_args!("{nbytes} bytes") },
            |event| {
                // SAFETY: the region lies inside the buffer (resolved above); the
                // host side per this function's contract; `event` is NULL or
                // writable.
                unsafe {
                    match host {
                        HostSide::From(src) => (self.cl.enqueue_write_buffer)(
                            queue,
                            mem,
                            blocking,
                            offset,
                            nbytes,
                            src,
                            0,
                            ptr::null(),
                            event,
                        ),
                        HostSide::Into(dst) => (self.cl.enqueue_read_buffer)(
                            queue,
                            mem,
                            blocking,
                            offset,
                            nbytes,
                            dst,
                            0,
                            ptr::null(),
                            event,
                        ),
                    }
                }
            },
        );
        Cl::check(status, call, format_args!("{nbytes} bytes"))
    }

    /// Device to device, also between devices of the context; runs on the
    /// source device's stream.
    pub fn copy_device(
        &self,
        dst_device: usize,
        dst: usize,
        src_device: usize,
        src: usize,
        nbytes: usize,
        stream: Option<&Stream>,
    ) -> Result<()> {
        let (to, to_offset) = self.resolve(dst_device, dst, nbytes, &"copy destination")?;
        let (from, from_offset) = self.resolve(src_device, src, nbytes, &"copy source")?;
        if stream.is_none() && dst_device != src_device {
            self.synchronize_device(dst_device)?;
        }
        let (stream, blocking) = self.queue_for(src_device, stream)?;
        if nbytes == 0 || (to.mem == from.mem && to_offset == from_offset) {
            return Ok(());
        }
        if to.mem == from.mem && to_offset.abs_diff(from_offset) < nbytes {
            return Err(Error::unimplemented(format!(
                "opencl: copy: the {nbytes}-byte source and destination overlap inside one buffer, \
                 which clEnqueueCopyBuffer refuses (CL_MEM_COPY_OVERLAP)"
            )));
        }
        let status = RECORDER.enqueue(
            self.cl,
            Site {
                call: "clEnqueueCopyBuffer",
                device: src_device,
                stream: stream.handle(),
                detail: format_args!("{nbytes} bytes"),
            },
            Work {
                kind: ffi::TFL_ACTIVITY_COPY,
                name: "memcpy DtoD",
                detail: format_args!("{nbytes} bytes"),
            },
            |event| {
                // SAFETY: both regions lie inside their buffers; `event` is NULL
                // or writable.
                unsafe {
                    (self.cl.enqueue_copy_buffer)(
                        stream.queue as cl::Queue,
                        from.mem as cl::Mem,
                        to.mem as cl::Mem,
                        from_offset,
                        to_offset,
                        nbytes,
                        0,
                        ptr::null(),
                        event,
                    )
                }
            },
        );
        Cl::check(status, "clEnqueueCopyBuffer", format_args!("{nbytes} bytes"))?;
        if blocking {
            self.finish_stream(stream, format_args!("copy"))?;
        }
        Ok(())
    }

    /// `set_memory`: `nbytes` at `addr` set to `value`.
    pub fn set_memory(
        &self,
        device: usize,
        addr: usize,
        value: u8,
        nbytes: usize,
        stream: Option<&Stream>,
    ) -> Result<()> {
        let (buffer, offset) = self.resolve(device, addr, nbytes, &"set_memory")?;
        let (stream, blocking) = self.queue_for(device, stream)?;
        if nbytes == 0 {
            return Ok(());
        }
        let status = RECORDER.enqueue(
            self.cl,
            Site {
                call: "clEnqueueFillBuffer",
                device,
                stream: stream.handle(),
                detail: format_args!("{nbytes} bytes"),
            },
            Work {
                kind: ffi::TFL_ACTIVITY_MEMSET,
                name: "memset",
                detail: format_args!("{nbytes} bytes value=0x{value:02x}"),
            },
            |event| {
                // SAFETY: the region lies inside the buffer; the 1-byte pattern
                // is copied by the call; `event` is NULL or writable.
                unsafe {
                    (self.cl.enqueue_fill_buffer)(
                        stream.queue as cl::Queue,
                        buffer.mem as cl::Mem,
                        (&value as *const u8).cast(),
                        1,
                        offset,
                        nbytes,
                        0,
                        ptr::null(),
                        event,
                    )
                }
            },
        );
        Cl::check(status, "clEnqueueFillBuffer", format_args!("{nbytes} bytes"))?;
        if blocking {
            self.finish_stream(stream, format_args!("set_memory"))?;
        }
        Ok(())
    }
}
