#include "runtime/fork.h"

#include <c10/util/Exception.h>
#include <torch/csrc/utils/device_lazy_init.h>

#include <pthread.h>

#include <mutex>

#include "runtime/runtime.h"

namespace torchfl {

namespace detail {
std::atomic<bool> g_in_bad_fork{false};
}  // namespace detail

namespace {

std::atomic<bool> g_attaching{false};

// Runs in the child of every fork(), before fork() returns there: only
// atomics.
void on_fork_child() {
  if (g_attaching.load(std::memory_order_relaxed)) {
    detail::g_in_bad_fork.store(true, std::memory_order_relaxed);
  }
}

[[maybe_unused]] const bool g_handler_registered = [] {
  // Fails only without memory for the registration; children then are not
  // marked, as on a platform without fork.
  (void)pthread_atfork(nullptr, nullptr, &on_fork_child);
  return true;
}();

}  // namespace

void note_device_attaching() {
  static std::once_flag once;
  std::call_once(once, [] {
    // PyTorch's own mark: in a child it sets torch::utils'
    // is_device_in_bad_fork(PrivateUse1) and makes device_lazy_init call
    // torch.<name>._lazy_init() again, so Python factories and .to() raise
    // before they dispatch (as for CUDA).
    torch::utils::register_fork_handler_for_device_init(c10::DeviceType::PrivateUse1);
  });
  g_attaching.store(true, std::memory_order_seq_cst);
}

void raise_bad_fork(const char* what, const char* name) {
  const std::string detail = what == nullptr
                                 ? std::string()
                                 : c10::str(" (", what, name != nullptr ? " " : "", name != nullptr ? name : "", ")");
  // attached_device() is an atomic load: no lock a parent thread may have
  // held. It is null only for a fork in the middle of attaching.
  const AttachedDevice* d = attached_device();
  const std::string device = device_type_name();
  TORCH_CHECK(false, "Cannot use the '", device, "' device in a forked subprocess", detail,
              ": the process it was forked from had already initialized the device's plugin ",
              d != nullptr ? d->plugin_label : std::string("(being attached at fork time)"),
              ", whose threads and device state do not survive fork(). To use '", device,
              "' with multiprocessing, use the 'spawn' or 'forkserver' start method "
              "(multiprocessing.set_start_method('spawn'), torch.multiprocessing.spawn, or "
              "DataLoader(..., multiprocessing_context='spawn')) and create '",
              device,
              "' tensors in the child only. DataLoader workers that load CPU data only can keep the 'fork' start "
              "method.");
}

}  // namespace torchfl
