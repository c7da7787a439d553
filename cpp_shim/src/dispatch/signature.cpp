#include "dispatch/signature.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace torchfl {
namespace {

enum Tag : int64_t {
  kNone = 0,
  kTensor,
  kTensorList,
  kInt,
  kDouble,
  kBool,
  kScalarKind,
  kIntList,
  kDoubleList,
  kBoolList,
  kString,
  kDevice,
  kGenerator,
  kOther,
};

int64_t bits_of(double d) {
  int64_t b;
  std::memcpy(&b, &d, sizeof(b));
  return b;
}

}  // namespace

void append_value(Signature& key, const at::Tensor& t) {
  if (!t.defined()) {
    key.push_back(kNone);
    return;
  }
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const int64_t placement =
      impl->device().type() == c10::DeviceType::PrivateUse1 ? 0 : (impl->is_wrapped_number() ? 2 : 1);
  const int64_t bits = (impl->is_conj() ? 1 : 0) | (impl->is_neg() ? 2 : 0);
  key.push_back(kTensor);
  key.push_back(static_cast<int64_t>(impl->dtype().toScalarType()));
  key.push_back(placement | (bits << 4));
  const auto sizes = impl->sizes();
  key.push_back(static_cast<int64_t>(sizes.size()));
  key.append(sizes.begin(), sizes.end());
  const auto strides = impl->strides();
  key.append(strides.begin(), strides.end());
}

void append_scalar_kind(Signature& key, const c10::Scalar& s) {
  key.push_back(kScalarKind);
  key.push_back(s.isBoolean()                         ? 1
                : s.isSymbolic()                      ? 4
                : s.isIntegral(/*includeBool=*/false) ? 2
                : s.isFloatingPoint()                 ? 3
                                                      : 4);
}

void append_value(Signature& key, bool v) {
  key.push_back(kBool);
  key.push_back(v ? 1 : 0);
}

void append_value(Signature& key, int64_t v) {
  key.push_back(kInt);
  key.push_back(v);
}

void append_value(Signature& key, double v) {
  key.push_back(kDouble);
  key.push_back(bits_of(v));
}

void append_value(Signature& key, std::optional<c10::ScalarType> v) {
  if (v.has_value()) {
    append_value(key, static_cast<int64_t>(*v));
  } else {
    key.push_back(kNone);
  }
}

void append_value(Signature& key, c10::IntArrayRef v) {
  key.push_back(kIntList);
  key.push_back(static_cast<int64_t>(v.size()));
  key.append(v.begin(), v.end());
}

void append_value(Signature& key, at::OptionalIntArrayRef v) {
  if (v.has_value()) {
    append_value(key, *v);
  } else {
    key.push_back(kNone);
  }
}

void append_signature(c10::ArrayRef<c10::IValue> args, c10::ArrayRef<uint8_t> is_scalar, bool scalar_values,
                      Signature& key) {
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    if (v.isNone()) {
      key.push_back(kNone);
    } else if (v.isTensor()) {
      append_value(key, v.toTensor());
    } else if (i < is_scalar.size() && is_scalar[i] && !scalar_values) {
      // Only the kind of a Scalar matters for output metadata.
      append_scalar_kind(key, v.toScalar());
    } else if (v.isInt()) {
      append_value(key, v.toInt());
    } else if (v.isDouble()) {
      append_value(key, v.toDouble());
    } else if (v.isBool()) {
      append_value(key, v.toBool());
    } else if (v.isTensorList()) {
      const c10::List<at::Tensor> list = v.toTensorList();
      key.push_back(kTensorList);
      key.push_back(static_cast<int64_t>(list.size()));
      for (const at::Tensor& t : list) append_value(key, t);
    } else if (v.isOptionalTensorList()) {
      const auto list = v.toOptionalTensorList();
      key.push_back(kTensorList);
      key.push_back(static_cast<int64_t>(list.size()));
      for (const std::optional<at::Tensor>& t : list) {
        if (t.has_value()) {
          append_value(key, *t);
        } else {
          key.push_back(kNone);
        }
      }
    } else if (v.isIntList()) {
      const c10::List<int64_t> list = v.toIntList();
      key.push_back(kIntList);
      key.push_back(static_cast<int64_t>(list.size()));
      for (int64_t x : list) key.push_back(x);  // as append_value(IntArrayRef)
    } else if (v.isDoubleList()) {
      const c10::List<double> list = v.toDoubleList();
      key.push_back(kDoubleList);
      key.push_back(static_cast<int64_t>(list.size()));
      for (double x : list) key.push_back(bits_of(x));
    } else if (v.isBoolList()) {
      const c10::List<bool> list = v.toBoolList();
      key.push_back(kBoolList);
      key.push_back(static_cast<int64_t>(list.size()));
      for (bool x : list) key.push_back(x ? 1 : 0);
    } else if (v.isString()) {
      const std::string& s = v.toStringRef();
      key.push_back(kString);
      key.push_back(static_cast<int64_t>(s.size()));
      for (size_t j = 0; j < s.size(); j += sizeof(int64_t)) {
        int64_t chunk = 0;
        std::memcpy(&chunk, s.data() + j, std::min(sizeof(chunk), s.size() - j));
        key.push_back(chunk);
      }
    } else if (v.isDevice()) {
      key.push_back(kDevice);
      key.push_back(static_cast<int64_t>(v.toDevice().type()));
    } else if (v.isGenerator()) {
      key.push_back(kGenerator);
    } else if (v.isScalar()) {  // a Scalar whose value counts (factories)
      key.push_back(kDouble);
      key.push_back(bits_of(v.toScalar().toDouble()));
    } else {
      key.push_back(kOther);
      key.push_back(static_cast<int64_t>(v.hash().toInt()));
    }
  }
}

}  // namespace torchfl
