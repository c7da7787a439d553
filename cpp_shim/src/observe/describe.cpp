// The argument descriptions of the device trace ("f32[4, 4], i64[], 2.5"),
// for a kernel's call frame and for a CPU fallback's boxed arguments.
#include <c10/util/StringUtil.h>

#include <sstream>
#include <string>

#include "observe/trace.h"

namespace torchfl {
namespace {
const char* dtype_name(const TFL_DType& t) {
  switch (t.code) {
    case TFL_DTYPE_FLOAT:
      return t.bits == 16 ? "f16" : t.bits == 32 ? "f32" : t.bits == 64 ? "f64" : "f?";
    case TFL_DTYPE_BFLOAT:
      return "bf16";
    case TFL_DTYPE_INT:
      return t.bits == 8 ? "i8" : t.bits == 16 ? "i16" : t.bits == 32 ? "i32" : t.bits == 64 ? "i64" : "i?";
    case TFL_DTYPE_UINT:
      return t.bits == 8 ? "u8" : t.bits == 16 ? "u16" : t.bits == 32 ? "u32" : t.bits == 64 ? "u64" : "u?";
    case TFL_DTYPE_COMPLEX:
      return t.bits == 64 ? "c64" : t.bits == 128 ? "c128" : "c?";
    case TFL_DTYPE_BOOL:
      return "b8";
    default:
      return "?";
  }
}

template <typename T>
void append_list(std::string& out, const T* items, size_t len) {
  out += '[';
  for (size_t i = 0; i < len; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(items[i]);
  }
  out += ']';
}

void append_tensor(std::string& out, const TFL_Tensor* t) {
  if (t == nullptr) {
    out += "None";
    return;
  }
  out += dtype_name(t->dtype);
  append_list(out, t->shape, t->ndim > 0 && t->shape != nullptr ? static_cast<size_t>(t->ndim) : 0);
}

void append_scalar(std::string& out, const TFL_Scalar& s) {
  switch (s.kind) {
    case TFL_SCALAR_INT:
      out += std::to_string(s.v.i);
      return;
    case TFL_SCALAR_FLOAT:
      out += c10::str(s.v.f);
      return;
    case TFL_SCALAR_BOOL:
      out += s.v.b != 0 ? "True" : "False";
      return;
    case TFL_SCALAR_COMPLEX:
      out += c10::str("(", s.v.c[0], "+", s.v.c[1], "j)");
      return;
    default:
      out += "?";
  }
}

void append_value(std::string& out, const TFL_Value* v) {
  if (v == nullptr) {
    out += "None";
    return;
  }
  switch (v->tag) {
    case TFL_VALUE_TENSOR:
      append_tensor(out, v->u.tensor);
      return;
    case TFL_VALUE_TENSOR_LIST:
      out += '(';
      for (size_t i = 0; i < v->u.tensor_list.len; ++i) {
        if (i > 0) out += ", ";
        append_tensor(out, v->u.tensor_list.items[i]);
      }
      out += ')';
      return;
    case TFL_VALUE_INT:
      out += std::to_string(v->u.i);
      return;
    case TFL_VALUE_FLOAT:
      out += c10::str(v->u.f);
      return;
    case TFL_VALUE_BOOL:
      out += v->u.b != 0 ? "True" : "False";
      return;
    case TFL_VALUE_SCALAR:
      append_scalar(out, v->u.scalar);
      return;
    case TFL_VALUE_INT_LIST:
      append_list(out, v->u.int_list.items, v->u.int_list.len);
      return;
    case TFL_VALUE_FLOAT_LIST:
      append_list(out, v->u.float_list.items, v->u.float_list.len);
      return;
    case TFL_VALUE_BOOL_LIST:
      append_list(out, v->u.bool_list.items, v->u.bool_list.len);
      return;
    case TFL_VALUE_STRING:
      out += '\'';
      out.append(v->u.string.data, v->u.string.len);
      out += '\'';
      return;
    default:
      out += "None";
  }
}

const char* scalar_type_short(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float:
      return "f32";
    case c10::ScalarType::Double:
      return "f64";
    case c10::ScalarType::Half:
      return "f16";
    case c10::ScalarType::BFloat16:
      return "bf16";
    case c10::ScalarType::Long:
      return "i64";
    case c10::ScalarType::Int:
      return "i32";
    case c10::ScalarType::Bool:
      return "b8";
    default:
      return c10::toString(t);
  }
}

}  // namespace

std::string describe_frame(const TFL_CallFrame& frame) {
  std::string out;
  for (size_t i = 0; i < frame.num_args; ++i) {
    if (i > 0) out += ", ";
    append_value(out, frame.args[i]);
  }
  return out;
}

std::string describe_arguments(c10::ArrayRef<c10::IValue> args) {
  std::string out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0) out += ", ";
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        out += "None";
        continue;
      }
      out += scalar_type_short(t.scalar_type());
      const auto sizes = t.sizes();
      append_list(out, sizes.data(), sizes.size());
    } else if (v.isNone()) {
      out += "None";
    } else if (v.isInt() || v.isDouble() || v.isBool() || v.isIntList() || v.isString()) {
      std::ostringstream s;
      s << v;
      out += s.str();
    } else {
      out += v.tagKind();
    }
  }
  return out;
}

}  // namespace torchfl
