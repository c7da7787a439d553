#include "memory/copy.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <vector>

#include "dispatch/plugin_kernel.h"
#include "memory/device_allocator.h"
#include "memory/host_allocator.h"
#include "memory/storage_resize.h"
#include "runtime/fork.h"
#include "runtime/runtime.h"
#include "runtime/status.h"
#include "runtime/streams.h"

namespace torchfl {
namespace {

// The host waits for a copy only where its caller reads host memory next;
// counted for the tests that check the host is not blocked otherwise.
void wait_for_copy(TFL_Stream* stream) {
  note_copy_wait();
  stream_synchronize(stream);
}

// Events that order a cross-device copy between the two devices' streams,
// kept for the whole process instead of created per copy (as CUDA's event
// pool): an event is free again once the wait on it is queued, because
// stream_wait_event captures the event's last record when it is called
// (plugin.h). Never destroyed: the plugin outlives every copy.
class EventPool {
 public:
  TFL_Event* acquire(c10::DeviceIndex device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<TFL_Event*>& free = free_[device];
      if (!free.empty()) {
        TFL_Event* event = free.back();
        free.pop_back();
        return event;
      }
    }
    const AttachedDevice& d = runtime();
    TFL_Event* created = nullptr;
    TFL_CHECK_STATUS(d.ref(), "event_create", d.api->event_create(device, TFL_EVENT_DEFAULT, &created));
    TORCH_CHECK(created != nullptr, "plugin ", d.plugin_label, ": event_create returned NULL");
    return created;
  }
  void release(c10::DeviceIndex device, TFL_Event* event) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      free_[device].push_back(event);
    } catch (...) {
      // Out of memory: the event is leaked, which is harmless.
    }
  }

 private:
  std::mutex mutex_;
  std::vector<TFL_Event*> free_[kMaxDevices];
};

EventPool& event_pool() {
  static EventPool* pool = new EventPool();  // leaked: used until exit
  return *pool;
}

// Makes work queued on `waiter` from now on wait for the work queued so far
// on `producer` (of `device`), without blocking the host.
void order_after(c10::DeviceIndex device, TFL_Stream* producer, TFL_Stream* waiter) {
  const AttachedDevice& d = runtime();
  TFL_Event* event = event_pool().acquire(device);
  struct Release {
    c10::DeviceIndex device;
    TFL_Event* event;
    ~Release() { event_pool().release(device, event); }
  } release{device, event};
  TFL_CHECK_STATUS(d.ref(), "event_record", d.api->event_record(event, producer));
  TFL_CHECK_STATUS(d.ref(), "stream_wait_event", d.api->stream_wait_event(waiter, event));
}

bool is_dense(const at::Tensor& t) {
  return t.is_non_overlapping_and_dense();
}

// No lazy conjugate/negative bit: the bytes are the values.
bool plain(const at::Tensor& t) {
  return !t.is_conj() && !t.is_neg();
}

// Same sizes, and the same strides wherever a dimension has more than one
// element: then two dense tensors store their elements in the same order.
bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  if (!a.sizes().equals(b.sizes())) return false;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

// Whether copying the dense span byte for byte moves every value right.
bool bytewise(const at::Tensor& dst, const at::Tensor& src) {
  return dst.scalar_type() == src.scalar_type() && plain(dst) && plain(src) && is_dense(dst) && is_dense(src) &&
         same_layout(dst, src);
}

// A dense tensor's elements occupy numel * itemsize bytes starting at its
// first element (PyTorch strides are never negative).
size_t span_bytes(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

// Pointer arithmetic only: never dereferenced on the host.
void* device_ptr(const at::Tensor& t) {
  return t.data_ptr();
}
const void* device_cptr(const at::Tensor& t) {
  return t.const_data_ptr();
}

// Smallest and largest storage element a tensor with elements touches.
std::pair<int64_t, int64_t> extent(const at::Tensor& t) {
  int64_t hi = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) hi += (t.size(d) - 1) * t.stride(d);
  return {t.storage_offset(), hi};
}

at::Tensor device_empty_contiguous(const at::Tensor& like) {
  return at::detail::empty_generic(like.sizes(), device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   like.scalar_type(), std::nullopt);
}

at::Tensor apply_lazy_bits(at::Tensor host, const at::Tensor& like) {
  if (like.is_conj()) host = host.conj();
  if (like.is_neg()) host = host._neg_view();
  return host;
}

void host_to_device(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK_NOT_IMPLEMENTED(plain(dst), "copying into a conjugate or negative view of a ", device_type_name(),
                              " tensor is not supported; copy into the base "
                              "tensor instead");
  const c10::DeviceIndex device = dst.device().index();
  CurrentDeviceScope scope(device);
  const c10::Stream stream = current_stream(device);
  TFL_Stream* pstream = current_plugin_stream(device);

  if (is_dense(dst)) {
    if (non_blocking && bytewise(dst, src) && is_pinned_data(src.storage().data_ptr())) {
      copy_h2d(device, device_ptr(dst), src.const_data_ptr(), span_bytes(dst), pstream);
      record_host_use(src.storage().data_ptr(), stream);
      return;
    }
    // Stage through a pinned buffer laid out like dst. The CPU copy_ does
    // any dtype conversion and broadcasting, and the caller's memory is
    // free again when we return, while the device copy itself stays queued
    // (the allocator keeps the staging block until the stream ran it).
    at::Tensor staging = at::detail::empty_strided_generic(
        dst.sizes(), dst.strides(), host_allocator(), c10::DispatchKeySet(c10::DispatchKey::CPU), dst.scalar_type());
    staging.copy_(src);
    copy_h2d(device, device_ptr(dst), staging.const_data_ptr(), span_bytes(dst), pstream);
    record_host_use(staging.storage().data_ptr(), stream);
    return;
  }

  // A strided destination: upload densely, then scatter on the device.
  at::Tensor dense = device_empty_contiguous(dst);
  host_to_device(src, dense, non_blocking);
  if (run_plugin_copy(dst, dense)) return;

  // No on-device strided copy: read-modify-write the destination's extent
  // through the host.
  const auto [lo, hi] = extent(dst);
  const size_t item = dst.element_size();
  const size_t nbytes = static_cast<size_t>(hi - lo + 1) * item;
  at::Tensor host = at::empty({hi - lo + 1}, at::TensorOptions().dtype(dst.scalar_type()));
  void* base = static_cast<char*>(const_cast<void*>(dst.storage().data())) + static_cast<size_t>(lo) * item;
  copy_d2h(device, host.data_ptr(), base, nbytes, pstream);
  wait_for_copy(pstream);
  host.as_strided(dst.sizes(), dst.strides(), 0).copy_(src);
  copy_h2d(device, base, host.const_data_ptr(), nbytes, pstream);
  wait_for_copy(pstream);  // `host` is pageable and dies here
}

void device_to_host(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  if (bytewise(dst, src)) {
    const c10::DeviceIndex device = src.device().index();
    CurrentDeviceScope scope(device);
    TFL_Stream* pstream = current_plugin_stream(device);
    copy_d2h(device, dst.data_ptr(), device_cptr(src), span_bytes(src), pstream);
    if (non_blocking && is_pinned_data(dst.storage().data_ptr())) {
      record_host_use(dst.storage().data_ptr(), current_stream(device));
    } else {
      wait_for_copy(pstream);  // the caller may read dst right away
    }
    return;
  }
  dst.copy_(to_host(src));
}

// A byte copy between two devices, as CUDA's copy_device_to_device does it:
// on the source device's current stream, after the work queued so far on
// the current streams of both devices (the destination may still be read or
// written there), and before whatever is queued on the destination's current
// stream afterwards. The host never waits.
void copy_across_devices(const at::Tensor& dst, const at::Tensor& src) {
  check_not_forked("copy (device to device)");
  const c10::DeviceIndex dst_device = dst.device().index();
  const c10::DeviceIndex src_device = src.device().index();
  TFL_Stream* dst_stream = current_plugin_stream(dst_device);
  TFL_Stream* copy_stream = current_plugin_stream(src_device);
  order_after(dst_device, dst_stream, copy_stream);
  copy_d2d(dst_device, device_ptr(dst), src_device, device_cptr(src), span_bytes(dst), copy_stream);
  order_after(src_device, copy_stream, dst_stream);
}

at::Tensor device_empty(c10::DeviceIndex device, at::IntArrayRef sizes, at::ScalarType dtype) {
  CurrentDeviceScope scope(device);
  return at::detail::empty_generic(sizes, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype,
                                   std::nullopt);
}

// A converting, broadcasting or strided copy between two devices, on the
// devices with the plugin's copy_ kernel, as CUDA does with peer access:
// convert on the source device into a dense buffer shaped and typed like
// dst, move the bytes across, and scatter into dst on its device. Returns
// false, having written nothing into dst, when the source side cannot be
// done on the device.
bool convert_across_devices(const at::Tensor& dst, const at::Tensor& src) {
  if (!plain(src) || !plain(dst)) return false;
  const c10::DeviceIndex dst_device = dst.device().index();
  const c10::DeviceIndex src_device = src.device().index();
  at::Tensor staged = device_empty(src_device, dst.sizes(), dst.scalar_type());
  {
    CurrentDeviceScope scope(src_device);
    if (!run_plugin_copy(staged, src)) return false;
  }
  if (bytewise(dst, staged)) {
    copy_across_devices(dst, staged);
    return true;
  }
  at::Tensor landing = device_empty(dst_device, dst.sizes(), dst.scalar_type());
  copy_across_devices(landing, staged);
  CurrentDeviceScope scope(dst_device);
  if (!run_plugin_copy(dst, landing)) host_to_device(to_host(landing), dst, /*non_blocking=*/false);
  return true;
}

void device_to_device(const at::Tensor& src, const at::Tensor& dst) {
  const c10::DeviceIndex dst_device = dst.device().index();
  const c10::DeviceIndex src_device = src.device().index();
  if (src_device == dst_device) {
    CurrentDeviceScope scope(dst_device);
    if (bytewise(dst, src)) {
      copy_d2d(dst_device, device_ptr(dst), src_device, device_cptr(src), span_bytes(dst),
               current_plugin_stream(dst_device));
      return;
    }
    if (plain(src) && plain(dst) && run_plugin_copy(dst, src)) return;
  } else if (bytewise(dst, src)) {
    copy_across_devices(dst, src);
    return;
  } else if (convert_across_devices(dst, src)) {
    return;
  }
  host_to_device(to_host(src), dst, /*non_blocking=*/false);
}

}  // namespace

at::Tensor to_host(const at::Tensor& src) {
  const at::TensorOptions cpu = at::TensorOptions().dtype(src.scalar_type()).device(c10::kCPU);
  if (src.numel() == 0) return at::empty_strided(src.sizes(), src.strides(), cpu);
  const c10::DeviceIndex device = src.device().index();
  CurrentDeviceScope scope(device);
  TFL_Stream* pstream = current_plugin_stream(device);
  at::Tensor host;
  if (is_dense(src)) {
    host = at::empty_strided(src.sizes(), src.strides(), cpu);
    copy_d2h(device, host.data_ptr(), device_cptr(src), span_bytes(src), pstream);
  } else {
    const auto [lo, hi] = extent(src);
    const size_t item = src.element_size();
    // Move the smaller of: the strided view's whole extent, or a dense
    // on-device gather (which needs the plugin's copy_ kernel).
    if (plain(src) && static_cast<size_t>(hi - lo + 1) > 2 * static_cast<size_t>(src.numel())) {
      at::Tensor dense = device_empty_contiguous(src);
      if (run_plugin_copy(dense, src)) return to_host(dense);
    }
    at::Tensor buffer = at::empty({hi - lo + 1}, cpu);
    const char* base = static_cast<const char*>(src.storage().data()) + static_cast<size_t>(lo) * item;
    copy_d2h(device, buffer.data_ptr(), base, static_cast<size_t>(hi - lo + 1) * item, pstream);
    host = buffer.as_strided(src.sizes(), src.strides(), 0);
  }
  wait_for_copy(pstream);
  return apply_lazy_bits(std::move(host), src);
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.defined() && dst.defined(), "_copy_from: undefined tensor");
  if (dst.numel() == 0) return dst;
  const bool src_on_device = self.is_privateuseone();
  const bool dst_on_device = dst.is_privateuseone();
  if (src_on_device && dst_on_device) {
    device_to_device(self, dst);
  } else if (dst_on_device) {
    // CPU, or another device type (CUDA) through the host.
    const at::Tensor host = self.is_cpu() ? self : self.to(c10::kCPU);
    host_to_device(host, dst, non_blocking && self.is_cpu());
  } else {
    TORCH_INTERNAL_ASSERT(src_on_device, "_copy_from: neither tensor is a ", device_type_name(), " tensor");
    if (dst.is_cpu()) {
      device_to_host(self, dst, non_blocking);
    } else {
      const_cast<at::Tensor&>(dst).copy_(to_host(self));
    }
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (!dst.sizes().equals(self.sizes())) {
    if (dst.is_privateuseone()) {
      resize_device_tensor(dst, self.sizes(), std::nullopt);
    } else {
      dst.resize_(self.sizes());
    }
  }
  return copy_from(self, dst, /*non_blocking=*/false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(), " elements cannot be converted to Scalar");
  const c10::DeviceIndex device = self.device().index();
  CurrentDeviceScope scope(device);
  TFL_Stream* pstream = current_plugin_stream(device);
  at::Tensor host = at::empty({}, at::TensorOptions().dtype(self.scalar_type()).device(c10::kCPU));
  copy_d2h(device, host.data_ptr(), device_cptr(self), self.element_size(), pstream);
  wait_for_copy(pstream);
  host = apply_lazy_bits(std::move(host), self);
  return at::_local_scalar_dense(host.resolve_conj().resolve_neg());
}

}  // namespace torchfl
