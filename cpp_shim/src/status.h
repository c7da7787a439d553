// Turning plugin errors (TFL_Error*) into C++ exceptions.
//
// Every plugin entry returns NULL or an error object the caller owns. The
// shim never lets one escape: TFL_CHECK_STATUS copies code and message,
// releases the object with the error_destroy of the plugin that created it
// (a kernel's errors belong to the kernel's owner, which may not be the
// device plugin), and throws the c10 exception that maps to the right Python
// type: torch.OutOfMemoryError, NotImplementedError or RuntimeError.
//
// It is a macro, not a function, so that the c10::Error carries the file and
// line of the plugin call that failed.
#pragma once

#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

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

// Copies code and message out of `error` (non-NULL) and destroys it with
// `api->error_destroy`. Codes this shim does not know (from a newer plugin)
// become TFL_ERROR_UNKNOWN, as the ABI requires.
PluginStatus take_status(const TFL_PluginApi* api, TFL_Error* error);

// "INVALID_ARGUMENT", "OUT_OF_MEMORY", ...
const char* status_code_name(int32_t code) noexcept;

}  // namespace torchfl

// Evaluates `expr` (a TFL_Error*) once; on error throws with a message that
// names the plugin, `what` (the entry or operator) and the status code.
// Optional trailing arguments are appended to the message (c10::str style),
// e.g. a hint on what the user can do.
#define TFL_CHECK_STATUS(owner, what, expr, ...)                                                                   \
  do {                                                                                                             \
    TFL_Error* tfl_error_ = (expr);                                                                                \
    if (C10_UNLIKELY(tfl_error_ != nullptr)) {                                                                     \
      const ::torchfl::PluginRef& tfl_owner_ = (owner);                                                            \
      const ::torchfl::PluginStatus tfl_status_ = ::torchfl::take_status(tfl_owner_.api, tfl_error_);              \
      TORCH_CHECK_WITH(OutOfMemoryError, tfl_status_.code != TFL_ERROR_OUT_OF_MEMORY, "plugin ", tfl_owner_.label, \
                       ": ", what, " failed (", ::torchfl::status_code_name(tfl_status_.code),                     \
                       "): ", tfl_status_.message __VA_OPT__(, ) __VA_ARGS__);                                     \
      TORCH_CHECK_NOT_IMPLEMENTED(tfl_status_.code != TFL_ERROR_UNIMPLEMENTED, "plugin ", tfl_owner_.label, ": ",  \
                                  what, " failed (", ::torchfl::status_code_name(tfl_status_.code),                \
                                  "): ", tfl_status_.message __VA_OPT__(, ) __VA_ARGS__);                          \
      TORCH_CHECK(false, "plugin ", tfl_owner_.label, ": ", what, " failed (",                                     \
                  ::torchfl::status_code_name(tfl_status_.code),                                                   \
                  "): ", tfl_status_.message __VA_OPT__(, ) __VA_ARGS__);                                          \
    }                                                                                                              \
  } while (0)
