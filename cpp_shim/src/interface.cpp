// The table of include/torchfl_shim.h that the Rust core calls: attach,
// register, current stream. Every exception stops here and becomes a return
// code plus message, because the caller is Rust.

#include "interface.h"

#include <torch/headeronly/version.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include "dispatch/registration.h"
#include "observe/kineto_profiler.h"
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

int32_t table_attach_device(const TFL_ShimDevice* device, char* error, size_t error_len) {
  return guarded(error, error_len, TFL_SHIM_ERROR_INVALID, [&] {
    if (device == nullptr) {
      throw torchfl::ShimError(TFL_SHIM_ERROR_INVALID, "TFL_ShimInterface.attach_device: device is NULL");
    }
    torchfl::attach_device(*device);
    torchfl::register_kineto_profiler();
  });
}

int32_t table_register_kernel(const TFL_ShimKernel* kernel, int32_t* outcome, char* error, size_t error_len) {
  return guarded(error, error_len, TFL_SHIM_ERROR_TORCH, [&] {
    if (kernel == nullptr || outcome == nullptr) {
      throw torchfl::ShimError(TFL_SHIM_ERROR_INVALID,
                               "TFL_ShimInterface.register_kernel: kernel and outcome are required");
    }
    *outcome = static_cast<int32_t>(torchfl::register_kernel(*kernel));
  });
}

int32_t table_current_stream(int32_t device, void** out_stream, char* error, size_t error_len) {
  return guarded(error, error_len, TFL_SHIM_ERROR_TORCH, [&] {
    TORCH_CHECK(out_stream != nullptr, "TFL_ShimInterface.current_stream: out_stream is NULL");
    const auto index = static_cast<c10::DeviceIndex>(device);
    torchfl::check_device_index(index);
    *out_stream = torchfl::current_plugin_stream(index);
  });
}

}  // namespace

namespace torchfl {

const TFL_ShimInterface* shim_interface() {
  static const TFL_ShimInterface table = {
      sizeof(TFL_ShimInterface), TFL_SHIM_INTERFACE_VERSION, TORCH_VERSION,
      table_attach_device,       table_register_kernel,      table_current_stream,
  };
  return &table;
}

}  // namespace torchfl
