/* Exercises every function of torch_fl/plugin_helpers.h; built as C99, C11
 * and C++17 by tests/helpers.rs. Prints the first failed check and exits 1. */
#define _POSIX_C_SOURCE 200809L

#define TFLH_PLUGIN_NAME "helpers_test"
#define TFLH_DEVICE_COUNT 2
#include "torch_fl/plugin_helpers.h"
#include "torch_fl/plugin_helpers.h" /* include guard */

#define CHECK(cond)                                              \
  do {                                                           \
    if (!(cond)) {                                               \
      printf("line %d: check failed: %s\n", __LINE__, #cond);    \
      return 1;                                                  \
    }                                                            \
  } while (0)

/* Checks `err` has `code` and a message containing `text`; releases it. */
static int is_error(TFL_Error* err, int32_t code, const char* text) {
  int ok = err != NULL && tflh_error_code(err) == code &&
           strstr(tflh_error_message(err), text) != NULL;
  if (err != NULL && !ok) printf("unexpected error: %s\n", tflh_error_message(err));
  tflh_error_destroy(err);
  return ok;
}

static TFL_Error* kernel(const TFL_CallFrame* frame) {
  (void)frame;
  return NULL;
}

static const TFL_OpEntry ops[] = {TFLH_OP("neg", kernel)};

int main(void) {
  TFL_Stream *s0 = NULL, *s0_again = NULL, *s1 = NULL, *created = NULL;
  TFL_Event *timed = NULL, *timed2 = NULL, *untimed = NULL;
  TFL_MemoryStats stats;
  TFL_OpTable table;
  static TFLH_MemoryCounters memory = TFLH_MEMORY_COUNTERS_INIT(1000);
  uint8_t done = 0;
  float ms = -1.0f;
  char long_text[600];
  static TFLH_AddressMap addresses = TFLH_ADDRESS_MAP_INIT;
  int buffer_a = 1, buffer_b = 2;
  void *a = NULL, *b = NULL, *handle = NULL;
  size_t offset = 0;

  /* Errors. */
  CHECK(is_error(tflh_error(TFL_ERROR_INTERNAL, "helpers_test: %d %s", 42, "x"),
                 TFL_ERROR_INTERNAL, "helpers_test: 42 x"));
  memset(long_text, 'a', sizeof long_text - 1);
  long_text[sizeof long_text - 1] = '\0';
  {
    TFL_Error* e = tflh_error(TFL_ERROR_UNKNOWN, "%s", long_text);
    CHECK(strlen(tflh_error_message(e)) == TFLH_ERROR_MESSAGE_SIZE - 1);
    tflh_error_destroy(e);
  }
  tflh_error_destroy(NULL);
  CHECK(tflh_check_device(0) == NULL && tflh_check_device(1) == NULL);
  CHECK(is_error(tflh_check_device(2), TFL_ERROR_INVALID_ARGUMENT,
                 "helpers_test: device 2 out of range (device_count = 2)"));
  CHECK(is_error(tflh_check_device(-1), TFL_ERROR_INVALID_ARGUMENT, "device -1"));
  CHECK(tflh_sync_device_synchronize(1) == NULL);

  /* Streams: one default stream per device, stable, never destroyed. */
  CHECK(tflh_sync_default_stream(0, &s0) == NULL && s0 != NULL);
  CHECK(tflh_sync_default_stream(0, &s0_again) == NULL && s0_again == s0);
  CHECK(tflh_sync_default_stream(1, &s1) == NULL && s1 != s0);
  CHECK(is_error(tflh_sync_default_stream(5, &s1), TFL_ERROR_INVALID_ARGUMENT, "out of range"));
  CHECK(is_error(tflh_sync_stream_destroy(s0), TFL_ERROR_INVALID_ARGUMENT,
                 "the default stream cannot be destroyed"));
  CHECK(tflh_sync_stream_create(1, -1, &created) == NULL && created != NULL);
  CHECK(is_error(tflh_sync_stream_create(2, 0, &created), TFL_ERROR_INVALID_ARGUMENT, "device 2"));
  CHECK(tflh_sync_stream_query(created, &done) == NULL && done == 1);
  CHECK(tflh_sync_stream_synchronize(created) == NULL);

  /* Events. */
  CHECK(tflh_sync_event_create(0, TFL_EVENT_TIMING, &timed) == NULL);
  CHECK(tflh_sync_event_create(0, TFL_EVENT_TIMING, &timed2) == NULL);
  CHECK(tflh_sync_event_create(1, 0, &untimed) == NULL);
  CHECK(is_error(tflh_sync_event_elapsed_time(timed, timed2, &ms), TFL_ERROR_FAILED_PRECONDITION,
                 "recorded first"));
  CHECK(tflh_sync_event_query(timed, &done) == NULL && done == 1);
  CHECK(tflh_sync_event_record(timed, s0) == NULL);
  CHECK(tflh_sync_stream_wait_event(created, timed) == NULL);
  CHECK(tflh_sync_event_record(timed2, created) == NULL);
  CHECK(tflh_sync_event_synchronize(timed2) == NULL);
  CHECK(tflh_sync_event_elapsed_time(timed, timed2, &ms) == NULL && ms >= 0.0f);
  CHECK(tflh_sync_event_record(untimed, created) == NULL);
  CHECK(is_error(tflh_sync_event_elapsed_time(timed, untimed, &ms), TFL_ERROR_FAILED_PRECONDITION,
                 "TFL_EVENT_TIMING"));
  CHECK(tflh_sync_event_destroy(timed) == NULL && tflh_sync_event_destroy(timed2) == NULL &&
        tflh_sync_event_destroy(untimed) == NULL);
  CHECK(tflh_sync_stream_destroy(created) == NULL);

  /* Memory counters: capacity 1000 bytes. */
  CHECK(tflh_memory_reserve(&memory, 0, 600) == NULL);
  CHECK(is_error(tflh_memory_reserve(&memory, 0, 401), TFL_ERROR_OUT_OF_MEMORY,
                 "helpers_test: cannot allocate 401 bytes on device 0 (600 of 1000 in use)"));
  CHECK(tflh_memory_reserve(&memory, 0, 400) == NULL);
  tflh_memory_unreserve(&memory, 400);
  tflh_memory_release(&memory, 600);
  CHECK(tflh_memory_reserve(&memory, 0, 100) == NULL);
  memset(&stats, 0xAB, sizeof stats);
  stats.struct_size = sizeof stats;
  CHECK(tflh_memory_stats(&memory, &stats) == NULL);
  CHECK(stats.struct_size == sizeof stats && stats.allocated_bytes == 100 &&
        stats.peak_allocated_bytes == 1000 && stats.reserved_bytes == 100 &&
        stats.total_bytes == 1000 && stats.num_allocations == 2 && stats.num_frees == 1 &&
        stats.num_ooms == 1);
  CHECK(tflh_memory_reset_peak(&memory) == NULL);
  /* An older caller's smaller struct: nothing past its struct_size is written. */
  memset(&stats, 0xAB, sizeof stats);
  stats.struct_size = TFL_STRUCT_SIZE(TFL_MemoryStats, peak_allocated_bytes);
  CHECK(tflh_memory_stats(&memory, &stats) == NULL);
  CHECK(stats.peak_allocated_bytes == 100 && stats.reserved_bytes == 0xABABABABABABABABull);

  /* The op table. */
  memset(&table, 0, sizeof table);
  table.struct_size = sizeof table;
  CHECK(tflh_op_table(&table, ops, 1) == NULL);
  CHECK(table.entries == ops && table.num_entries == 1 && table.entry_size == sizeof(TFL_OpEntry));
  CHECK(strcmp(ops[0].symbol, "kernel") == 0 && ops[0].kernel == kernel &&
        ops[0].struct_size == TFL_STRUCT_SIZE(TFL_OpEntry, infer_outputs));
  /* Device addresses for handle-based memory. */
  CHECK(tflh_address_insert(&addresses, 10000, &buffer_a, &a) == NULL && a != NULL);
  CHECK(tflh_address_insert(&addresses, 0, &buffer_b, &b) == NULL && b != NULL && b != a);
  CHECK(((uintptr_t)a % 64) == 0);
  CHECK(tflh_address_resolve(&addresses, (char*)a + 4100, 16, &handle, &offset) == NULL);
  CHECK(handle == &buffer_a && offset == 4100);
  CHECK(tflh_address_resolve(&addresses, b, 0, &handle, &offset) == NULL && handle == &buffer_b);
  CHECK(is_error(tflh_address_resolve(&addresses, (char*)a + 12000, 1000, &handle, &offset),
                 TFL_ERROR_INVALID_ARGUMENT, "run past the end"));
  CHECK(tflh_address_remove(&addresses, a, &handle) == NULL && handle == &buffer_a);
  CHECK(is_error(tflh_address_remove(&addresses, a, &handle), TFL_ERROR_INVALID_ARGUMENT,
                 "not an allocation"));
  CHECK(is_error(tflh_address_resolve(&addresses, a, 1, &handle, &offset),
                 TFL_ERROR_INVALID_ARGUMENT, "not a device address"));
  CHECK(tflh_address_remove(&addresses, b, &handle) == NULL && addresses.count == 0);
  free(addresses.ranges);
  printf("ok\n");
  return 0;
}
