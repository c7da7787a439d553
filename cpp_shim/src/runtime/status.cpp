#include "runtime/status.h"

namespace torchfl {
namespace {

// The length of the valid UTF-8 sequence starting at `s[i]` (1 to 4), or 0
// when it is invalid; `*bad` is then how many bytes form the maximal invalid
// prefix that one U+FFFD replaces (Unicode's "maximal subpart" practice, the
// count Python's errors="replace" and Rust's from_utf8_lossy use).
size_t utf8_sequence(std::string_view s, size_t i, size_t* bad) {
  const auto byte = [&](size_t k) {
    return static_cast<unsigned char>(s[k]);
  };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    len = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    len = 3;
    if (lead == 0xE0) lo = 0xA0;  // no overlong forms
    if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    len = 4;
    if (lead == 0xF0) lo = 0x90;  // no overlong forms
    if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    *bad = 1;
    return 0;
  }
  for (size_t k = 1; k < len; ++k) {
    const bool in_range =
        i + k < s.size() && byte(i + k) >= (k == 1 ? lo : 0x80) && byte(i + k) <= (k == 1 ? hi : 0xBF);
    if (!in_range) {
      *bad = k;
      return 0;
    }
  }
  return len;
}

}  // namespace

std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t bad = 0;
    if (const size_t len = utf8_sequence(text, i, &bad)) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD REPLACEMENT CHARACTER
      i += bad;
    }
  }
  return out;
}

PluginStatus take_status(const TFL_PluginApi* api, TFL_Error* error) {
  PluginStatus status;
  const int32_t code = api->error_code(error);
  status.code = (code >= TFL_ERROR_UNKNOWN && code <= TFL_ERROR_FAILED_PRECONDITION) ? code : TFL_ERROR_UNKNOWN;
  const char* message = api->error_message(error);
  // Copy before destroying: the message lives inside the error object.
  try {
    status.message = message != nullptr ? valid_utf8(message) : "(no message)";
  } catch (...) {
    api->error_destroy(error);
    throw;
  }
  api->error_destroy(error);
  return status;
}

void throw_status(const c10::SourceLocation& where, const PluginRef& owner, const PluginStatus& status,
                  const std::string& what, const std::string& detail) {
  std::string message = c10::str("plugin ", owner.label, ": ", what, " failed (", status_code_name(status.code),
                                 "): ", status.message, detail);
  switch (status.code) {
    case TFL_ERROR_OUT_OF_MEMORY:
      throw c10::OutOfMemoryError(where, std::move(message));
    case TFL_ERROR_UNIMPLEMENTED:
      throw c10::NotImplementedError(where, std::move(message));
    default:
      throw c10::AcceleratorError(where, status.code, std::move(message));
  }
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
