// Turning plugin errors (TFL_Error*) into C++ exceptions.
//
// Every plugin entry returns NULL or an error object the caller owns. The
// shim never lets one escape: TFL_CHECK_STATUS copies code and message,
// releases the object with the error_destroy of the plugin that created it
// (a kernel's errors belong to the kernel's owner, which may not be the
// device plugin), and throws the c10 exception that maps to the right Python
// type, as CUDA's runtime checks do:
//   OUT_OF_MEMORY   c10::OutOfMemoryError  -> torch.OutOfMemoryError
//   UNIMPLEMENTED   c10::NotImplementedError -> NotImplementedError
//   anything else   c10::AcceleratorError  -> torch.AcceleratorError (a
//                   RuntimeError), whose error_code is the TFL_ErrorCode
//
// It is a macro, not a function, so that the c10::Error carries the file and
// line of the plugin call that failed.
#pragma once

#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/inflight.h"
#include "torch_fl/plugin.h"

namespace torchfl {

// A plugin as messages name it, with the table that releases its errors.
struct PluginRef {
  const TFL_PluginApi* api = nullptr;
  const char* label = "";  // "'sim' (/path/libtorchfl_sim.so)"
};

// An error's content after the error object itself was released.
struct PluginStatus {
  int32_t code = TFL_ERROR_UNKNOWN;
  std::string message;
};

// `text` with every byte sequence that is not valid UTF-8 replaced by U+FFFD.
// Plugin text must pass through here before it reaches an exception or a
// warning: Python decodes C++ messages as strict UTF-8, and an invalid byte
// would turn the error into a UnicodeDecodeError.
std::string valid_utf8(std::string_view text);

// Copies code and message out of `error` (non-NULL) and destroys it with
// `api->error_destroy`. The message is made valid UTF-8 (valid_utf8). Codes
// this shim does not know (from a newer plugin) become TFL_ERROR_UNKNOWN, as
// the ABI requires.
PluginStatus take_status(const TFL_PluginApi* api, TFL_Error* error);

// "INVALID_ARGUMENT", "OUT_OF_MEMORY", ...
const char* status_code_name(int32_t code) noexcept;

// Throws the exception for `status` (see the top of this file) with the
// message "plugin <label>: <what> failed (<CODE>): <message><detail>".
[[noreturn]] void throw_status(const c10::SourceLocation& where, const PluginRef& owner, const PluginStatus& status,
                               const std::string& what, const std::string& detail);

}  // namespace torchfl

// Evaluates `expr` (a TFL_Error*) once, recorded as the plugin call in
// flight (inflight.h; `what` must outlive the call); on error throws with a message that
// names the plugin, `what` (the entry or operator) and the status code.
// Optional trailing arguments are appended to the message (c10::str style),
// e.g. a hint on what the user can do.
#define TFL_CHECK_STATUS(owner, what, expr, ...)                                                                    \
  do {                                                                                                              \
    const ::torchfl::PluginRef& tfl_owner_ = (owner);                                                               \
    TFL_Error* tfl_error_ = nullptr;                                                                                \
    {                                                                                                               \
      const ::torchfl::InFlightScope tfl_in_flight_(tfl_owner_.label, ::torchfl::inflight_name(what));              \
      tfl_error_ = (expr);                                                                                          \
    }                                                                                                               \
    if (C10_UNLIKELY(tfl_error_ != nullptr)) {                                                                      \
      ::torchfl::throw_status(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, tfl_owner_, \
                              ::torchfl::take_status(tfl_owner_.api, tfl_error_), c10::str(what),                   \
                              c10::str(__VA_ARGS__));                                                               \
    }                                                                                                               \
  } while (0)
