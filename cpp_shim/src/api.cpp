// The C interface (include/torchfl_shim.h). The only extern "C" code of the
// shim: every exception stops here and becomes a return code plus message.

// The shim is built with -fvisibility=hidden; only this interface is
// exported. First include, so these declarations are the first ones seen.
#pragma GCC visibility push(default)
#include "torchfl_shim.h"
#pragma GCC visibility pop

#include <torch/headeronly/version.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "dispatch/fallback.h"
#include "dispatch/registration.h"
#include "memory/device_allocator.h"
#include "observe/kineto_profiler.h"
#include "observe/layer_profile.h"
#include "observe/trace.h"
#include "runtime/py_generator.h"
#include "runtime/runtime.h"
#include "runtime/shim_error.h"
#include "runtime/streams.h"

namespace {

void write_error(char* error, size_t error_len, const char* message) {
  if (error == nullptr || error_len == 0) return;
  const size_t n = std::min(std::strlen(message), error_len - 1);
  std::memcpy(error, message, n);
  error[n] = '\0';
}

// Runs `body`, turning exceptions into a TFL_SHIM_* code. `torch_code` is
// what a c10::Error (PyTorch refusing something) maps to.
template <typename F>
int32_t guarded(char* error, size_t error_len, int32_t torch_code, F&& body) {
  try {
    body();
    return TFL_SHIM_OK;
  } catch (const torchfl::ShimError& e) {
    write_error(error, error_len, e.what());
    return e.code;
  } catch (const c10::Error& e) {
    write_error(error, error_len, e.what_without_backtrace());
    return torch_code;
  } catch (const std::exception& e) {
    write_error(error, error_len, e.what());
    return torch_code;
  } catch (...) {
    write_error(error, error_len, "unknown C++ exception");
    return torch_code;
  }
}

// Backing store for the names tfl_shim_fallback_counts hands out.
std::mutex g_counts_mutex;
std::vector<std::string>& count_names() {
  static auto* names = new std::vector<std::string>();
  return *names;
}

}  // namespace

extern "C" {

uint32_t tfl_shim_interface_version(void) {
  return TFL_SHIM_INTERFACE_VERSION;
}

const char* tfl_shim_torch_version(void) {
  return TORCH_VERSION;
}

int32_t tfl_shim_attach_device(const TFL_ShimDevice* device, char* error, size_t error_len) {
  return guarded(error, error_len, TFL_SHIM_ERROR_INVALID, [&] {
    if (device == nullptr) {
      throw torchfl::ShimError(TFL_SHIM_ERROR_INVALID, "tfl_shim_attach_device: device is NULL");
    }
    torchfl::attach_device(*device);
    torchfl::register_kineto_profiler();
  });
}

int32_t tfl_shim_register_kernel(const TFL_ShimKernel* kernel, int32_t* outcome, char* error, size_t error_len) {
  return guarded(error, error_len, TFL_SHIM_ERROR_TORCH, [&] {
    if (kernel == nullptr || outcome == nullptr) {
      throw torchfl::ShimError(TFL_SHIM_ERROR_INVALID, "tfl_shim_register_kernel: kernel and outcome are required");
    }
    *outcome = static_cast<int32_t>(torchfl::register_kernel(*kernel));
  });
}

void tfl_shim_set_fallback_mode(int32_t mode) {
  torchfl::set_fallback_mode(mode == TFL_SHIM_FALLBACK_ERROR ? torchfl::FallbackMode::Error
                                                             : torchfl::FallbackMode::Cpu);
}

int32_t tfl_shim_fallback_mode(void) {
  return static_cast<int32_t>(torchfl::fallback_mode());
}

size_t tfl_shim_fallback_counts(TFL_ShimFallbackCount* out, size_t capacity) {
  try {
    std::vector<torchfl::FallbackCount> counts = torchfl::fallback_counts();
    std::lock_guard<std::mutex> lock(g_counts_mutex);
    std::vector<std::string>& names = count_names();
    names.clear();
    for (const auto& c : counts) names.push_back(c.op_name);
    for (size_t i = 0; out != nullptr && i < counts.size() && i < capacity; ++i) {
      out[i].op_name = names[i].c_str();
      out[i].count = counts[i].count;
    }
    return counts.size();
  } catch (...) {
    return 0;
  }
}

void tfl_shim_reset_fallback_counts(void) {
  try {
    torchfl::reset_fallback_counts();
  } catch (...) {
  }
}

void tfl_shim_set_layer_profiling(int32_t on) {
  torchfl::set_layer_profiling(on != 0);
}

void tfl_shim_layer_profile(TFL_ShimLayerProfile* out) {
  if (out == nullptr) return;
  const torchfl::LayerProfile p = torchfl::layer_profile();
  *out = {p.entries, p.entry_ns, p.kernel_ns, p.kernel_calls, p.alloc_ns, p.alloc_calls};
}

void tfl_shim_reset_layer_profile(void) {
  torchfl::reset_layer_profile();
}

int32_t tfl_shim_layer_profile_operators(char* out, size_t capacity, size_t* out_len, char* error, size_t error_len) {
  return guarded(error, error_len, TFL_SHIM_ERROR_TORCH, [&] {
    TORCH_CHECK(out_len != nullptr, "tfl_shim_layer_profile_operators: out_len is NULL");
    const std::string json = torchfl::layer_profile_operators_json();
    *out_len = json.size();
    if (out != nullptr && capacity >= json.size()) std::memcpy(out, json.data(), json.size());
  });
}

int32_t tfl_shim_memory_snapshot(char* out, size_t capacity, size_t* out_len, char* error, size_t error_len) {
  return guarded(error, error_len, TFL_SHIM_ERROR_TORCH, [&] {
    TORCH_CHECK(out_len != nullptr, "tfl_shim_memory_snapshot: out_len is NULL");
    const std::string json = torchfl::memory_snapshot_json();
    *out_len = json.size();
    if (out != nullptr && capacity >= json.size()) std::memcpy(out, json.data(), json.size());
  });
}

int32_t tfl_shim_trace_begin(uint64_t* out_start, char* error, size_t error_len) {
  return guarded(error, error_len, TFL_SHIM_ERROR_TORCH, [&] {
    TORCH_CHECK(out_start != nullptr, "tfl_shim_trace_begin: out_start is NULL");
    *out_start = torchfl::trace_begin();
  });
}

int32_t tfl_shim_trace_collect(uint64_t start, char* out, size_t capacity, size_t* out_len, char* error,
                               size_t error_len) {
  return guarded(error, error_len, TFL_SHIM_ERROR_TORCH, [&] {
    TORCH_CHECK(out_len != nullptr, "tfl_shim_trace_collect: out_len is NULL");
    const std::string json = torchfl::trace_json(start);
    *out_len = json.size();
    if (out != nullptr && capacity >= json.size()) std::memcpy(out, json.data(), json.size());
  });
}

void tfl_shim_trace_end(void) {
  torchfl::trace_end();
}

int32_t tfl_shim_allocator_backend(int32_t* out_caching, char* error, size_t error_len) {
  return guarded(error, error_len, TFL_SHIM_ERROR_TORCH, [&] {
    TORCH_CHECK(out_caching != nullptr, "tfl_shim_allocator_backend: out_caching is NULL");
    *out_caching = torchfl::caching_enabled() ? 1 : 0;
  });
}

int32_t tfl_shim_current_stream(int32_t device, void** out_stream, char* error, size_t error_len) {
  return guarded(error, error_len, TFL_SHIM_ERROR_TORCH, [&] {
    TORCH_CHECK(out_stream != nullptr, "tfl_shim_current_stream: out_stream is NULL");
    const auto index = static_cast<c10::DeviceIndex>(device);
    torchfl::check_device_index(index);
    *out_stream = torchfl::current_plugin_stream(index);
  });
}

int32_t tfl_shim_default_generator(int32_t device, void** out_generator, char* error, size_t error_len) {
  return guarded(error, error_len, TFL_SHIM_ERROR_TORCH, [&] {
    TORCH_CHECK(out_generator != nullptr, "tfl_shim_default_generator: out_generator is NULL");
    const auto index = static_cast<c10::DeviceIndex>(device);
    torchfl::check_device_index(index);
    *out_generator = torchfl::default_generator_object(index);
  });
}

int32_t tfl_shim_wait_current_stream_if_pending(int32_t device, int32_t* out_waited, char* error, size_t error_len) {
  return guarded(error, error_len, TFL_SHIM_ERROR_TORCH, [&] {
    TORCH_CHECK(out_waited != nullptr, "tfl_shim_wait_current_stream_if_pending: out_waited is NULL");
    const auto index = static_cast<c10::DeviceIndex>(device);
    if (index >= 0) torchfl::check_device_index(index);
    *out_waited = torchfl::wait_current_stream_if_pending(index) ? 1 : 0;
  });
}

void tfl_shim_sync_counts(TFL_ShimSyncCounts* out) {
  if (out == nullptr) return;
  const torchfl::SyncCounts c = torchfl::sync_counts();
  *out = {c.host_kernel_waits, c.copy_waits};
}

void tfl_shim_reset_sync_counts(void) {
  torchfl::reset_sync_counts();
}

}  // extern "C"
