/* Exercises the activity-record helpers of torch_fl/plugin_helpers.h (ABI 1.8):
 * the bounded buffer, drains into larger host records, truncation, ranges per
 * thread. Built as C99, C11 and C++17 by tests/helpers.rs; prints the first
 * failed check and exits 1. */
#define _POSIX_C_SOURCE 200809L
#define TFLH_PLUGIN_NAME "act_test"
#define TFLH_ACTIVITY_RANGE_DEPTH 4
#include "torch_fl/plugin_helpers.h"

#define CHECK(cond)                                           \
  do {                                                        \
    if (!(cond)) {                                            \
      printf("line %d: check failed: %s\n", __LINE__, #cond); \
      return 1;                                               \
    }                                                         \
  } while (0)

static int is_invalid(TFL_Error* e) {
  int ok = e != NULL && tflh_error_code(e) == TFL_ERROR_INVALID_ARGUMENT;
  tflh_error_destroy(e);
  return ok;
}

static void* other_thread(void* arg) {
  TFLH_ActivityBuffer* buf = (TFLH_ActivityBuffer*)arg;
  tflh_activity_range_pop(buf); /* its own (empty) stack */
  return tflh_activity_correlation() == 0 ? arg : NULL;
}

int main(void) {
  static TFL_ActivityRecord storage[3];
  static TFLH_ActivityBuffer buf = TFLH_ACTIVITY_BUFFER_INIT(storage, 3);
  TFLH_ActivityBuffer heap;
  TFL_ActivityRecord out[4];
  unsigned char wide[2 * 260];
  size_t written = 99;
  uint64_t dropped = 99, t0, t1;
  char long_name[200];
  pthread_t thread;
  void* result = NULL;
  int i;

  /* Off until enabled; unknown bits refused. */
  CHECK(tflh_activity_kinds(&buf) == 0);
  CHECK(!tflh_activity_enabled(&buf, TFL_ACTIVITY_API));
  CHECK(is_invalid(tflh_activity_enable(&buf, 1u)));
  CHECK(is_invalid(tflh_activity_enable(&buf, 1u << 9)));
  CHECK(tflh_activity_enable(&buf, TFL_ACTIVITY_ALL_KINDS) == NULL);
  CHECK(tflh_activity_enabled(&buf, TFL_ACTIVITY_MARK) && !tflh_activity_enabled(&buf, 40));

  t0 = tflh_activity_host_now_ns();
  t1 = tflh_activity_host_now_ns();
  CHECK(t0 > 0 && t1 >= t0);

  /* Append, bound, drops. */
  memset(long_name, 'x', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = '\0';
  tflh_activity_set_correlation(7);
  CHECK(tflh_activity_correlation() == 7);
  CHECK(tflh_activity_append(&buf, TFL_ACTIVITY_API, TFL_ACTIVITY_HOST_CLOCK, 0, NULL, tflh_activity_correlation(), 10, 5, long_name, "4096 bytes") == 1);
  CHECK(tflh_activity_append(&buf, TFL_ACTIVITY_KERNEL, 0, 0, NULL, 7, 20, 30, "k\xc3\xa9", NULL) == 1);
  CHECK(tflh_activity_append(&buf, TFL_ACTIVITY_SYNC, TFL_ACTIVITY_HOST_CLOCK, 0, NULL, 7, 40, 50, "sync", "") == 1);
  CHECK(tflh_activity_append(&buf, TFL_ACTIVITY_SYNC, TFL_ACTIVITY_HOST_CLOCK, 0, NULL, 7, 40, 50, "lost", "") == 0);
  CHECK(pthread_create(&thread, NULL, other_thread, &buf) == 0);
  CHECK(pthread_join(thread, &result) == 0 && result == &buf);

  /* Drain arguments checked first. */
  CHECK(is_invalid(tflh_activity_drain_into(&buf, out, 247, 4, &written, &dropped)));
  CHECK(is_invalid(tflh_activity_drain_into(&buf, out, sizeof out[0], 4, NULL, &dropped)));
  CHECK(is_invalid(tflh_activity_drain_into(&buf, out, sizeof out[0], 4, &written, NULL)));
  CHECK(is_invalid(tflh_activity_drain_into(&buf, NULL, sizeof out[0], 4, &written, &dropped)));
  CHECK(written == 99 && dropped == 99);
  CHECK(tflh_activity_drain_into(&buf, NULL, sizeof out[0], 0, &written, &dropped) == NULL);
  CHECK(written == 0 && dropped == 1);

  /* Two, then the rest. */
  memset(out, 0, sizeof out);
  CHECK(tflh_activity_drain_into(&buf, out, sizeof out[0], 2, &written, &dropped) == NULL);
  CHECK(written == 2 && dropped == 0);
  CHECK(out[0].struct_size == sizeof(TFL_ActivityRecord) && out[0].kind == TFL_ACTIVITY_API);
  CHECK(out[0].start_ns == 10 && out[0].end_ns == 10 && out[0].correlation_id == 7);
  CHECK(strlen(out[0].name) == TFL_ACTIVITY_NAME_BYTES - 1 && strcmp(out[0].detail, "4096 bytes") == 0);
  CHECK(strcmp(out[1].name, "k\xc3\xa9") == 0 && out[1].detail[0] == '\0' && out[1].flags == 0);
  CHECK(out[2].struct_size == 0);
  CHECK(tflh_activity_drain_into(&buf, out, sizeof out[0], 4, &written, &dropped) == NULL);
  CHECK(written == 1 && strcmp(out[0].name, "sync") == 0);

  /* Truncation steps back over a cut UTF-8 character. */
  {
    char text[TFL_ACTIVITY_NAME_BYTES + 8];
    memset(text, 'a', sizeof text);
    text[TFL_ACTIVITY_NAME_BYTES - 2] = '\xc3';
    text[TFL_ACTIVITY_NAME_BYTES - 1] = '\xa9';
    text[sizeof text - 1] = '\0';
    CHECK(tflh_activity_append(&buf, TFL_ACTIVITY_MARK, TFL_ACTIVITY_HOST_CLOCK, -1, NULL, 0, 1, 1, text, NULL) == 1);
    CHECK(tflh_activity_drain_into(&buf, out, sizeof out[0], 4, &written, &dropped) == NULL);
    CHECK(written == 1 && strlen(out[0].name) == TFL_ACTIVITY_NAME_BYTES - 2);
  }

  /* A larger host record: strided, 1.8's bytes written, the rest untouched. */
  CHECK(tflh_activity_append(&buf, TFL_ACTIVITY_API, TFL_ACTIVITY_HOST_CLOCK, 0, NULL, 0, 1, 2, "a", NULL) == 1);
  CHECK(tflh_activity_append(&buf, TFL_ACTIVITY_API, TFL_ACTIVITY_HOST_CLOCK, 0, NULL, 0, 1, 2, "b", NULL) == 1);
  memset(wide, 0xEE, sizeof wide);
  CHECK(tflh_activity_drain_into(&buf, (TFL_ActivityRecord*)(void*)wide, 260, 2, &written, &dropped) == NULL);
  CHECK(written == 2 && wide[sizeof(TFL_ActivityRecord)] == 0xEE && wide[260 + offsetof(TFL_ActivityRecord, name)] == 'b');

  /* Ranges nest per thread; past the depth they still pair. */
  tflh_activity_set_correlation(0);
  tflh_activity_range_pop(&buf); /* none open */
  tflh_activity_range_push(&buf, "outer");
  tflh_activity_range_mark(&buf, "now");
  tflh_activity_range_pop(&buf);
  CHECK(tflh_activity_drain_into(&buf, out, sizeof out[0], 4, &written, &dropped) == NULL);
  CHECK(written == 2 && out[0].kind == TFL_ACTIVITY_MARK && out[1].kind == TFL_ACTIVITY_RANGE);
  CHECK(strcmp(out[1].name, "outer") == 0 && out[1].device == -1 && out[1].flags == TFL_ACTIVITY_HOST_CLOCK);
  CHECK(out[1].start_ns <= out[0].start_ns && out[0].end_ns <= out[1].end_ns && out[0].start_ns == out[0].end_ns);
  for (i = 0; i < 6; i++) tflh_activity_range_push(&buf, "deep");
  for (i = 0; i < 3; i++) tflh_activity_range_pop(&buf); /* 2 beyond the depth, 1 kept */
  CHECK(tflh_activity_drain_into(&buf, out, sizeof out[0], 4, &written, &dropped) == NULL);
  CHECK(written == 1);
  for (i = 0; i < 3; i++) tflh_activity_range_pop(&buf);
  CHECK(tflh_activity_drain_into(&buf, out, sizeof out[0], 4, &written, &dropped) == NULL);
  CHECK(written == 3);
  CHECK(tflh_activity_enable(&buf, 0) == NULL);
  tflh_activity_range_push(&buf, "unseen");
  CHECK(tflh_activity_enable(&buf, TFL_ACTIVITY_ALL_KINDS) == NULL);
  tflh_activity_range_pop(&buf);
  CHECK(tflh_activity_drain_into(&buf, out, sizeof out[0], 4, &written, &dropped) == NULL);
  CHECK(written == 0);

  /* An allocated buffer, and one of capacity 0 that drops everything. */
  CHECK(tflh_activity_init(&heap, 0) == NULL);
  CHECK(tflh_activity_append(&heap, TFL_ACTIVITY_API, 0, 0, NULL, 0, 0, 0, "x", NULL) == 0);
  CHECK(tflh_activity_drain_into(&heap, out, sizeof out[0], 4, &written, &dropped) == NULL);
  CHECK(written == 0 && dropped == 1);
  tflh_activity_destroy(&heap);
  CHECK(tflh_activity_init(&heap, 2) == NULL);
  CHECK(tflh_activity_append(&heap, TFL_ACTIVITY_API, 0, 0, NULL, 0, 0, 0, "x", NULL) == 1);
  tflh_activity_destroy(&heap);
  tflh_activity_destroy(&buf); /* static storage: nothing to free */
  printf("ok\n");
  return 0;
}
