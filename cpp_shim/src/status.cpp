#include "status.h"

namespace torchfl {

PluginStatus take_status(const TFL_PluginApi* api, TFL_Error* error) {
  PluginStatus status;
  const int32_t code = api->error_code(error);
  status.code = (code >= TFL_ERROR_UNKNOWN && code <= TFL_ERROR_FAILED_PRECONDITION) ? code : TFL_ERROR_UNKNOWN;
  const char* message = api->error_message(error);
  // Copy before destroying: the message lives inside the error object.
  try {
    status.message = message != nullptr ? message : "(no message)";
  } catch (...) {
    api->error_destroy(error);
    throw;
  }
  api->error_destroy(error);
  return status;
}

const char* status_code_name(int32_t code) noexcept {
  switch (code) {
    case TFL_ERROR_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case TFL_ERROR_OUT_OF_MEMORY:
      return "OUT_OF_MEMORY";
    case TFL_ERROR_UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case TFL_ERROR_INTERNAL:
      return "INTERNAL";
    case TFL_ERROR_DEVICE_LOST:
      return "DEVICE_LOST";
    case TFL_ERROR_FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    default:
      return "UNKNOWN";
  }
}

}  // namespace torchfl
