// A bounded, thread-safe memo table from argument signatures
// (signature.h) to inferred output metadata, one per plugin kernel.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace torchfl {

// The metadata of one output.
struct OutputSpec {
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  // For out= arguments: PyTorch would resize this output (to sizes/strides).
  bool resize = false;
  // The operator returns an undefined tensor here (e.g. a gradient that
  // convolution_backward's output_mask turned off).
  bool undefined = false;
};

struct InferredOutputs {
  c10::SmallVector<OutputSpec, 2> outputs;
  // The meta kernel needs data for this signature (indexing with a boolean
  // mask): the entry only records that, and each call infers its outputs
  // by running the meta kernel on the real arguments.
  bool data_dependent = false;
};

class OutputCache {
 public:
  // Lock-free on a hit in the calling thread's front cache.
  std::shared_ptr<const InferredOutputs> find(c10::ArrayRef<int64_t> key) const;
  void insert(c10::ArrayRef<int64_t> key, std::shared_ptr<const InferredOutputs> value);

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(c10::ArrayRef<int64_t> k) const noexcept;
    size_t operator()(const std::vector<int64_t>& k) const noexcept { return (*this)(c10::ArrayRef<int64_t>(k)); }
  };
  struct Equal {
    using is_transparent = void;
    bool operator()(c10::ArrayRef<int64_t> a, c10::ArrayRef<int64_t> b) const noexcept { return a.equals(b); }
  };
  // A generous bound: one entry per distinct input layout of one operator.
  static constexpr size_t kMaxEntries = 4096;

  mutable std::mutex mutex_;
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<const InferredOutputs>, Hash, Equal> map_;
};

}  // namespace torchfl
