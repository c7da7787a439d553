#include "dispatch/call_frame.h"

#include <c10/util/Exception.h>

#include <cstring>

#include "dispatch/dtype.h"
#include "memory/storage_resize.h"

namespace torchfl {

namespace {
constexpr size_t kTensorSize = TFL_STRUCT_SIZE(TFL_Tensor, flags);
constexpr size_t kValueSize = TFL_STRUCT_SIZE(TFL_Value, u);
constexpr size_t kFrameSize = TFL_STRUCT_SIZE(TFL_CallFrame, rng_offset);
}  // namespace

bool describe_tensor(const at::Tensor& t, TFL_Tensor* out) noexcept {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!to_tfl_dtype(impl->dtype().toScalarType(), &out->dtype)) return false;
  out->struct_size = kTensorSize;
  out->byte_offset = static_cast<uint64_t>(impl->storage_offset()) * impl->dtype().itemsize();
  const c10::Device device = impl->device();
  if (device.is_meta()) {
    // An infer_outputs call (meta_kernel.h): metadata only. Fake tensors'
    // storages refuse data access, so it is not even asked for.
    out->data = nullptr;
    out->device_type = TFL_DEVICE_PLUGIN;
    out->device_index = 0;
  } else if (device.type() == c10::DeviceType::PrivateUse1) {
    // The allocation's base pointer plus a byte offset, as the ABI asks:
    // the plugin can then validate the whole view against its allocation.
    out->data = const_cast<void*>(impl->unsafe_storage().data());
    out->device_type = TFL_DEVICE_PLUGIN;
    out->device_index = device.index();
  } else {
    // Only 0-dim CPU tensors get here (the device check refuses others).
    out->data = const_cast<void*>(impl->unsafe_storage().data());
    out->device_type = TFL_DEVICE_HOST;
    out->device_index = 0;
  }
  out->ndim = static_cast<int32_t>(impl->dim());
  out->shape = impl->sizes().data();
  out->strides = impl->strides().data();
  out->flags = impl->is_wrapped_number() ? TFL_TENSOR_WRAPPED_NUMBER : 0;
  return true;
}

TFL_Value& CallFrameBuilder::push_value(int32_t tag) {
  TFL_Value& v = values_.emplace_back();
  std::memset(&v, 0, sizeof(v));
  v.struct_size = kValueSize;
  v.tag = tag;
  return v;
}

void CallFrameBuilder::add_none() {
  push_value(TFL_VALUE_NONE);
}

bool CallFrameBuilder::add_tensor(const at::Tensor& t) {
  if (!t.defined()) {
    add_none();
    return true;
  }
  fixups_.push_back({static_cast<uint32_t>(values_.size()), static_cast<uint32_t>(tensors_.size()), Fixup::Tensor});
  push_value(TFL_VALUE_TENSOR);
  return describe_tensor(t, &tensors_.emplace_back());
}

bool CallFrameBuilder::add_tensor_list(const c10::List<at::Tensor>& list) {
  TFL_Value& v = push_value(TFL_VALUE_TENSOR_LIST);
  v.u.tensor_list.len = list.size();
  fixups_.push_back(
      {static_cast<uint32_t>(values_.size() - 1), static_cast<uint32_t>(list_items_.size()), Fixup::TensorList});
  // Items hold tensor indices + 1 until finish(); 0 would mean "absent".
  bool ok = true;
  for (const at::Tensor& t : list) {
    list_items_.push_back(reinterpret_cast<const TFL_Tensor*>(tensors_.size() + 1));
    ok = describe_tensor(t, &tensors_.emplace_back()) && ok;
  }
  return ok;
}

bool CallFrameBuilder::add_optional_tensor_list(const c10::List<std::optional<at::Tensor>>& list) {
  TFL_Value& v = push_value(TFL_VALUE_TENSOR_LIST);
  v.u.tensor_list.len = list.size();
  fixups_.push_back(
      {static_cast<uint32_t>(values_.size() - 1), static_cast<uint32_t>(list_items_.size()), Fixup::TensorList});
  bool ok = true;
  for (const std::optional<at::Tensor>& t : list) {
    if (!t.has_value() || !t->defined()) {
      list_items_.push_back(nullptr);
      continue;
    }
    list_items_.push_back(reinterpret_cast<const TFL_Tensor*>(tensors_.size() + 1));
    ok = describe_tensor(*t, &tensors_.emplace_back()) && ok;
  }
  return ok;
}

void CallFrameBuilder::add_int(int64_t v) {
  push_value(TFL_VALUE_INT).u.i = v;
}

void CallFrameBuilder::add_float(double v) {
  push_value(TFL_VALUE_FLOAT).u.f = v;
}

void CallFrameBuilder::add_bool(bool v) {
  push_value(TFL_VALUE_BOOL).u.b = v ? 1 : 0;
}

void CallFrameBuilder::add_scalar(const c10::Scalar& s) {
  TFL_Scalar& out = push_value(TFL_VALUE_SCALAR).u.scalar;
  if (s.isBoolean()) {
    out.kind = TFL_SCALAR_BOOL;
    out.v.b = s.toBool() ? 1 : 0;
  } else if (s.isIntegral(/*includeBool=*/false)) {
    out.kind = TFL_SCALAR_INT;
    out.v.i = s.toLong();
  } else if (s.isComplex()) {
    out.kind = TFL_SCALAR_COMPLEX;
    const c10::complex<double> c = s.toComplexDouble();
    out.v.c[0] = c.real();
    out.v.c[1] = c.imag();
  } else {
    out.kind = TFL_SCALAR_FLOAT;
    out.v.f = s.toDouble();
  }
}

void CallFrameBuilder::add_int_list(c10::ArrayRef<int64_t> v) {
  TFL_Value& value = push_value(TFL_VALUE_INT_LIST);
  value.u.int_list.len = v.size();
  fixups_.push_back({static_cast<uint32_t>(values_.size() - 1), static_cast<uint32_t>(ints_.size()), Fixup::IntList});
  ints_.append(v.begin(), v.end());
}

void CallFrameBuilder::add_int_list(const c10::List<int64_t>& v) {
  TFL_Value& value = push_value(TFL_VALUE_INT_LIST);
  value.u.int_list.len = v.size();
  fixups_.push_back({static_cast<uint32_t>(values_.size() - 1), static_cast<uint32_t>(ints_.size()), Fixup::IntList});
  for (int64_t x : v) ints_.push_back(x);
}

void CallFrameBuilder::add_float_list(const c10::List<double>& v) {
  TFL_Value& value = push_value(TFL_VALUE_FLOAT_LIST);
  value.u.float_list.len = v.size();
  fixups_.push_back(
      {static_cast<uint32_t>(values_.size() - 1), static_cast<uint32_t>(floats_.size()), Fixup::FloatList});
  for (double x : v) floats_.push_back(x);
}

void CallFrameBuilder::add_bool_list(const c10::List<bool>& v) {
  TFL_Value& value = push_value(TFL_VALUE_BOOL_LIST);
  value.u.bool_list.len = v.size();
  fixups_.push_back({static_cast<uint32_t>(values_.size() - 1), static_cast<uint32_t>(bools_.size()), Fixup::BoolList});
  for (bool x : v) bools_.push_back(x ? 1 : 0);
}

void CallFrameBuilder::add_string(const std::string& s) {
  TFL_Value& value = push_value(TFL_VALUE_STRING);
  value.u.string.data = s.c_str();  // owned by the IValue on the stack
  value.u.string.len = s.size();
}

bool CallFrameBuilder::add_output(const at::Tensor& t) {
  if (!t.defined()) {
    // An output PyTorch leaves undefined (convolution_backward's masked
    // gradients): 1-D, zero elements, NULL data, as the ABI specifies.
    static constexpr int64_t kZero[1] = {0};
    static constexpr int64_t kOne[1] = {1};
    TFL_Tensor& out = outputs_.emplace_back();
    std::memset(&out, 0, sizeof(out));
    out.struct_size = kTensorSize;
    out.device_type = TFL_DEVICE_PLUGIN;  // device_index: set by finish()
    out.dtype = {TFL_DTYPE_FLOAT, 32, 1};
    out.ndim = 1;
    out.shape = kZero;
    out.strides = kOne;
    out.flags = TFL_TENSOR_UNDEFINED;
    return true;
  }
  return describe_tensor(t, &outputs_.emplace_back());
}

TFL_CallFrame* CallFrameBuilder::finish(const char* op_name, int32_t device_index, TFL_Stream* stream,
                                        TFL_ResizeOutputFn resize_output, void* host_context) {
  for (TFL_Tensor& out : outputs_) {
    if (out.flags & TFL_TENSOR_UNDEFINED) out.device_index = device_index;
  }
  // No buffer grows from here on, so pointers into them are stable.
  for (TFL_Tensor const*& item : list_items_) {
    if (item != nullptr) {
      item = &tensors_[reinterpret_cast<uintptr_t>(item) - 1];
    }
  }
  for (const PendingFixup& f : fixups_) {
    TFL_Value& v = values_[f.value];
    switch (f.kind) {
      case Fixup::Tensor:
        v.u.tensor = &tensors_[f.start];
        break;
      case Fixup::TensorList:
        v.u.tensor_list.items = list_items_.data() + f.start;
        break;
      case Fixup::IntList:
        v.u.int_list.items = ints_.data() + f.start;
        break;
      case Fixup::FloatList:
        v.u.float_list.items = floats_.data() + f.start;
        break;
      case Fixup::BoolList:
        v.u.bool_list.items = bools_.data() + f.start;
        break;
    }
  }
  value_ptrs_.resize(values_.size());
  for (size_t i = 0; i < values_.size(); ++i) value_ptrs_[i] = &values_[i];
  output_ptrs_.resize(outputs_.size());
  for (size_t i = 0; i < outputs_.size(); ++i) output_ptrs_[i] = &outputs_[i];

  frame_.struct_size = kFrameSize;
  frame_.op_name = op_name;
  frame_.device_index = device_index;
  frame_.stream = stream;
  frame_.args = value_ptrs_.data();
  frame_.num_args = value_ptrs_.size();
  frame_.outputs = output_ptrs_.data();
  frame_.num_outputs = output_ptrs_.size();
  frame_.resize_output = resize_output;
  frame_.host_context = host_context;
  frame_.rng_seed = 0;
  frame_.rng_offset = 0;
  return &frame_;
}

int32_t resize_output_callback(const TFL_CallFrame* frame, size_t index, int32_t ndim, const int64_t* shape) noexcept {
  auto* ctx = static_cast<ResizeContext*>(frame->host_context);
  if (ctx == nullptr || index >= ctx->count || ndim < 0 || (ndim > 0 && shape == nullptr)) {
    return TFL_ERROR_INVALID_ARGUMENT;
  }
  try {
    at::Tensor& out = ctx->outputs[index];
    resize_device_tensor(out, c10::IntArrayRef(shape, ndim), std::nullopt);
    if (!out.is_contiguous()) {
      // The ABI promises a contiguous result.
      out.unsafeGetTensorImpl()->empty_tensor_restride(c10::MemoryFormat::Contiguous);
      ensure_storage_fits(out);
    }
    describe_tensor(out, &ctx->descriptors[index]);
    return 0;
  } catch (const c10::OutOfMemoryError& e) {
    ctx->error = e.what_without_backtrace();
    return TFL_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    ctx->error = e.what();
    return TFL_ERROR_INVALID_ARGUMENT;
  }
}

}  // namespace torchfl
