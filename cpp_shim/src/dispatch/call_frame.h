// Building a TFL_CallFrame from PyTorch values.
//
// Everything lives in small inline buffers on the caller's stack, so a
// typical call (a few tensors and scalars) builds its frame without touching
// the heap. Because the buffers may still grow while arguments are added,
// values refer to tensors and lists by index until finish() turns the
// indices into pointers; nothing may be added after finish().
//
// Tensor descriptors point straight into the TensorImpl's size and stride
// arrays, which stay valid while the caller holds the tensors (the
// dispatcher's stack does).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <cstdint>

#include "torch_fl/plugin.h"

namespace torchfl {

// Describes `t` (a device tensor, or a 0-dim host tensor) in `out`. Returns
// false when its dtype cannot be expressed in the ABI.
bool describe_tensor(const at::Tensor& t, TFL_Tensor* out) noexcept;

class CallFrameBuilder {
 public:
  CallFrameBuilder() = default;
  CallFrameBuilder(const CallFrameBuilder&) = delete;
  CallFrameBuilder& operator=(const CallFrameBuilder&) = delete;

  // Each add_* appends one argument. The tensor forms return false when a
  // dtype cannot be described (the call must then fall back).
  void add_none();
  bool add_tensor(const at::Tensor& t);
  bool add_tensor_list(const c10::List<at::Tensor>& list);
  bool add_optional_tensor_list(const c10::List<std::optional<at::Tensor>>& list);
  void add_int(int64_t v);
  void add_float(double v);
  void add_bool(bool v);
  void add_scalar(const c10::Scalar& s);
  void add_int_list(c10::ArrayRef<int64_t> v);
  void add_int_list(const c10::List<int64_t>& v);
  void add_float_list(const c10::List<double>& v);
  void add_bool_list(const c10::List<bool>& v);
  void add_string(const std::string& s);

  bool add_output(const at::Tensor& t);

  // Fixes up pointers and returns the frame. `resize_output` and
  // `host_context` as in TFL_CallFrame.
  TFL_CallFrame* finish(const char* op_name, int32_t device_index, TFL_Stream* stream, TFL_ResizeOutputFn resize_output,
                        void* host_context);

  TFL_Tensor* output_descriptors() { return outputs_.data(); }
  size_t num_outputs() const { return outputs_.size(); }

 private:
  enum class Fixup : uint8_t { Tensor, TensorList, IntList, FloatList, BoolList };
  struct PendingFixup {
    uint32_t value;  // index into values_
    uint32_t start;  // index into the buffer the kind names
    Fixup kind;
  };

  TFL_Value& push_value(int32_t tag);

  c10::SmallVector<TFL_Value, 8> values_;
  c10::SmallVector<const TFL_Value*, 8> value_ptrs_;
  c10::SmallVector<TFL_Tensor, 6> tensors_;
  c10::SmallVector<const TFL_Tensor*, 4> list_items_;
  c10::SmallVector<int64_t, 16> ints_;
  c10::SmallVector<double, 4> floats_;
  c10::SmallVector<uint8_t, 8> bools_;
  c10::SmallVector<PendingFixup, 8> fixups_;
  c10::SmallVector<TFL_Tensor, 2> outputs_;
  c10::SmallVector<TFL_Tensor*, 2> output_ptrs_;
  TFL_CallFrame frame_{};
};

// The TFL_ResizeOutputFn the shim passes to every kernel; `host_context`
// must point at a ResizeContext.
struct ResizeContext {
  at::Tensor* outputs;      // the output tensors, in frame order
  TFL_Tensor* descriptors;  // frame->outputs storage, same order
  size_t count;
  std::string error;  // why the last resize failed, for messages
};
int32_t resize_output_callback(const TFL_CallFrame* frame, size_t index, int32_t ndim, const int64_t* shape) noexcept;

}  // namespace torchfl
