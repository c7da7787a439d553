#include "graphs/graph_impl.h"

#if __has_include(<ATen/core/GraphImplInterface.h>)
#include <ATen/core/GraphImplInterface.h>
#include <c10/core/DeviceType.h>

#include <memory>
#include <mutex>

#include "graphs/graph.h"

namespace torchfl::graphs {
namespace {

capture::Mode mode_of(at::GraphCaptureMode mode) {
  switch (mode) {
    case at::GraphCaptureMode::ThreadLocal:
      return capture::Mode::ThreadLocal;
    case at::GraphCaptureMode::Relaxed:
      return capture::Mode::Relaxed;
    default:  // Default is backend-defined: global, as CUDA's
      return capture::Mode::Global;
  }
}

class AcceleratorGraph final : public at::GraphImplInterface {
 public:
  explicit AcceleratorGraph(const at::GraphImplArgs& args) : graph_(args.keep_graph) {}

  void capture_begin(c10::MempoolId_t pool, at::GraphCaptureMode mode) override {
    graph_.capture_begin({pool.first, pool.second}, mode_of(mode));
  }
  void capture_end() override { graph_.capture_end(); }
  void instantiate() override { graph_.instantiate(); }
  void replay() override { graph_.replay(); }
  void reset() override { graph_.reset(); }
  c10::MempoolId_t pool() const override {
    const caching::PoolId id = graph_.pool();
    return {id.first, id.second};
  }
  void enable_debug_mode() override { graph_.enable_debug_mode(); }
  void debug_dump(const std::string& path) override { graph_.debug_dump(path); }

 private:
  Graph graph_;
};

}  // namespace

bool register_graph_impl() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string key = c10::get_privateuse1_backend(/*lower_case=*/false);
    // Registering a key twice throws; another extension may own it.
    if (!at::GraphImplRegistry()->Has(key)) {
      at::GraphImplRegistry()->Register(key, [](at::GraphImplArgs args) -> std::unique_ptr<at::GraphImplInterface> {
        return std::make_unique<AcceleratorGraph>(args);
      });
    }
  });
  return true;
}

}  // namespace torchfl::graphs

#else

namespace torchfl::graphs {

bool register_graph_impl() {
  return false;
}

}  // namespace torchfl::graphs

#endif
