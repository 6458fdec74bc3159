/* hooks_c_api_test DIR: the C ABI from C. Bad input fails with one "ckpt:" line; a checkpoint taken through the
 * C calls restores bitwise into a second checkpointer. Exit status 0 when every check holds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"

static int failures = 0;

#define CHECK(cond)                                                           \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "c_api_test:%d: FAIL: %s (%s)\n", __LINE__, #cond, ckpt_last_error()); \
      ++failures;                                                             \
    }                                                                         \
  } while (0)

static int starts_with(const char* s, const char* prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

/* Bad input fails with one "ckpt:" line and leaves no checkpointer. */
static void check_bad_input(const char* const* settings) {
  ckpt_checkpointer* cp = NULL;
  const char* bad[] = {"intervall=5m"};
  CHECK(ckpt_open(bad, 1, &cp) == -1 && cp == NULL);
  CHECK(starts_with(ckpt_last_error(), "ckpt: unknown setting 'intervall'"));
  const char* bad_value[] = {"keep=none"};
  CHECK(ckpt_open(bad_value, 1, &cp) == -1);
  CHECK(starts_with(ckpt_last_error(), "ckpt: keep='none'"));
  const char* not_kv[] = {"dir"};
  CHECK(ckpt_open(not_kv, 1, &cp) == -1);
  CHECK(ckpt_open(NULL, 1, &cp) == -1);
  CHECK(ckpt_open(settings, 4, NULL) == -1);
  CHECK(strcmp(ckpt_last_error(), "ckpt: ckpt_open: out is NULL") == 0);
  CHECK(ckpt_after_step(NULL, 1, NULL) == -1);
  CHECK(strcmp(ckpt_last_error(), "ckpt: ckpt_after_step: cp is NULL") == 0);
  CHECK(ckpt_rank(NULL) == -1);
  ckpt_free(NULL);
}

/* A run of 5 steps; checkpoints at 2 and 4. */
static void run_five_steps(const char* const* settings) {
  ckpt_checkpointer* cp = NULL;
  double weights[1000];
  unsigned char stats[7];
  CHECK(ckpt_open(settings, 4, &cp) == 0);
  CHECK(ckpt_enabled(cp) == 1 && ckpt_rank(cp) == 0 && ckpt_world_size(cp) == 1);
  CHECK(ckpt_register_host(cp, "weights", weights, sizeof weights, 0, "{\"dtype\":\"float64\"}") == 0);
  CHECK(ckpt_register_host(cp, "stats", stats, sizeof stats, CKPT_REGION_SYNC, NULL) == 0);
  CHECK(ckpt_register_host(cp, "bad", stats, sizeof stats, 0x80, NULL) == -1);
  CHECK(ckpt_register_host(cp, "bad", stats, sizeof stats, 0, "{nope") == -1);
  CHECK(starts_with(ckpt_last_error(), "ckpt: region 'bad': metadata is not JSON"));
  uint64_t step = 99;
  CHECK(ckpt_restore(cp, &step) == 0 && step == 0);
  int stop = 1;
  for (step = 0; step < 5; ++step) {
    CHECK(ckpt_before_update(cp) == 0);
    for (int i = 0; i < 1000; ++i) weights[i] = (double)(step + 1) * 0.1 + i;
    memset(stats, (int)(step + 1), sizeof stats);
    CHECK(ckpt_put_blob(cp, "step", &step, sizeof step, NULL) == 0);
    CHECK(ckpt_after_step(cp, step + 1, &stop) == 0 && stop == 0);
  }
  CHECK(ckpt_after_step(cp, 5, &stop) == -1);
  CHECK(starts_with(ckpt_last_error(), "ckpt: step 5 follows step 5"));
  CHECK(ckpt_close(cp) == 0);
  ckpt_stats st;
  CHECK(ckpt_stats_get(cp, &st) == 0);
  CHECK(st.snapshots == 2 && st.committed == 2 && st.last_committed_step == 4 && st.failed == 0);
  CHECK(st.staging_bytes >= st.state_bytes && st.state_bytes == sizeof weights + sizeof stats);
  CHECK(st.auto_interval_s == 0 && st.auto_checkpoints == 0); /* a step interval: auto is off */
  CHECK(ckpt_watch_nccl(cp, NULL) == 0);                       /* closed: a no-op */
  ckpt_free(cp);
}

/* CKPT_INTERVAL=auto shows its choice; with no NCCL in this process, watching one fails with one line. */
static void check_auto_interval(const char* dir_setting) {
  ckpt_checkpointer* cp = NULL;
  ckpt_stats st;
  const char* auto_settings[] = {dir_setting, "interval=auto", "mtbf=600s", "min_interval=1s"};
  CHECK(ckpt_open(auto_settings, 4, &cp) == 0);
  CHECK(ckpt_stats_get(cp, &st) == 0);
  CHECK(st.auto_interval_s == 60 && st.auto_mtbf_s == 600 && st.auto_checkpoints == 0); /* a tenth of the MTBF */
  int fake_comm = 0;
  CHECK(ckpt_watch_nccl(cp, &fake_comm) == -1);
  CHECK(starts_with(ckpt_last_error(), "ckpt: watch_nccl: no NCCL in this process"));
  CHECK(ckpt_close(cp) == 0);
  ckpt_free(cp);
}

/* The checkpoint of step 4 restores bitwise into fresh memory, blob included. */
static void check_restore(const char* const* settings) {
  ckpt_checkpointer* cp = NULL;
  double w2[1000];
  unsigned char s2[7];
  memset(w2, 0, sizeof w2);
  CHECK(ckpt_open(settings, 4, &cp) == 0);
  CHECK(ckpt_register_host(cp, "weights", w2, sizeof w2, 0, NULL) == 0);
  CHECK(ckpt_register_host(cp, "stats", s2, sizeof s2, CKPT_REGION_SYNC, NULL) == 0);
  uint64_t step = 99;
  CHECK(ckpt_restore(cp, &step) == 0 && step == 4);
  double expect[1000];
  for (int i = 0; i < 1000; ++i) expect[i] = 4 * 0.1 + i;
  CHECK(memcmp(w2, expect, sizeof w2) == 0);
  CHECK(s2[0] == 4 && s2[6] == 4);
  const void* blob = NULL;
  size_t blob_size = 0;
  CHECK(ckpt_restored_region(cp, "step", &blob, &blob_size) == 0 && blob_size == sizeof(uint64_t));
  uint64_t blob_step = 0;
  if (blob != NULL) memcpy(&blob_step, blob, sizeof blob_step);
  CHECK(blob_step == 3); /* the loop index at step 4 */
  CHECK(ckpt_restored_region(cp, "nope", &blob, &blob_size) == -1);
  int stop = 1;
  CHECK(ckpt_save(cp, 5, 1) == 0);
  CHECK(ckpt_after_step(cp, 6, &stop) == 0 && stop == 1);
  CHECK(ckpt_close(cp) == 0);
  ckpt_free(cp);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: hooks_c_api_test DIR\n");
    return 2;
  }
  char dir_setting[4096];
  snprintf(dir_setting, sizeof dir_setting, "dir=%s", argv[1]);
  const char* settings[] = {dir_setting, "interval=2steps", "signals=off", "log=warn"};

  check_bad_input(settings);
  run_five_steps(settings);
  check_auto_interval(dir_setting);
  check_restore(settings);

  if (failures == 0) printf("c_api_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
