/* slurm-ckpt: the C ABI of libckpt, the training-side checkpoint hooks.
 *
 * Every function returning int returns 0 on success and -1 on failure; ckpt_last_error() then holds one line
 * starting with "ckpt: ". No C++ exception ever crosses this interface. A checkpointer is used from one training
 * thread; ckpt_stats_get may be called from any thread.
 *
 *   ckpt_checkpointer* cp;
 *   if (ckpt_open(NULL, 0, &cp) != 0) { fprintf(stderr, "%s\n", ckpt_last_error()); exit(1); }
 *   ckpt_register_host(cp, "weights", w, w_bytes, 0, NULL);
 *   uint64_t step; ckpt_restore(cp, &step);
 *   for (; step < total; ++step) {
 *     compute_gradients();
 *     ckpt_before_update(cp);           // the guard: the last snapshot has copied every region
 *     update(w);
 *     int stop = 0; ckpt_after_step(cp, step + 1, &stop);
 *     if (stop) break;                  // a terminal checkpoint was taken (time limit, SIGTERM, SIGUSR1/2)
 *   }
 *   ckpt_close(cp); ckpt_free(cp);
 */
#ifndef CKPT_H
#define CKPT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libckpt is built with hidden visibility: what this header declares is its exported C ABI. */
#pragma GCC visibility push(default)

typedef struct ckpt_checkpointer ckpt_checkpointer;

/* Region flag: copy inside after_step, for small state that changes outside updates (e.g. BN statistics). */
#define CKPT_REGION_SYNC 1u

/* Counters; times in seconds. last_committed_step is UINT64_MAX before the first commit. */
typedef struct ckpt_stats {
  uint64_t snapshots, persisted, committed, failed;
  uint64_t last_committed_step;
  uint64_t backpressure_waits;
  uint64_t state_bytes, staging_bytes;
  double last_stall_s, total_stall_s, last_copy_s, last_persist_s, last_commit_s, backpressure_s;
  /* CKPT_INTERVAL=auto, rank 0 (zero elsewhere): the chosen interval and its inputs. */
  double auto_interval_s, auto_cost_s, auto_stall_s, auto_interference_s, auto_persist_floor_s, auto_mtbf_s;
  uint64_t auto_checkpoints;
} ckpt_stats;

/* The message of the last failed call on this thread; "" after a successful one. */
const char* ckpt_last_error(void);

/* Creates a checkpointer from the CKPT_* environment, overridden by `count` "key=value" settings (keys: dir,
 * interval, keep, grace, rank, world_size, rendezvous, ...; `settings` may be NULL when count is 0). */
int ckpt_open(const char* const* settings, size_t count, ckpt_checkpointer** out);
/* 1 when a checkpoint dir is configured, else 0 (every call is then a no-op). */
int ckpt_enabled(const ckpt_checkpointer* cp);
/* This process's rank and the world size, -1 on a NULL checkpointer. */
int ckpt_rank(const ckpt_checkpointer* cp);
int ckpt_world_size(const ckpt_checkpointer* cp);

/* Registers (or replaces) a named host region; `meta_json` may be NULL. */
int ckpt_register_host(ckpt_checkpointer* cp, const char* name, void* data, size_t size, unsigned flags,
                       const char* meta_json);
/* Registers a device region written by work on `stream` (a cudaStream_t; NULL: the legacy default stream). */
int ckpt_register_device(ckpt_checkpointer* cp, const char* name, void* data, size_t size, void* stream,
                         unsigned flags, const char* meta_json);
/* Copies a small blob now; every later checkpoint saves its latest value. */
int ckpt_put_blob(ckpt_checkpointer* cp, const char* name, const void* data, size_t size, const char* meta_json);

/* Loads the newest complete checkpoint into the registered regions; *step is where to resume, 0 when none. */
int ckpt_restore(ckpt_checkpointer* cp, uint64_t* step);
/* A region of the checkpoint the last restore loaded (blobs included); valid until the next snapshot. */
int ckpt_restored_region(const ckpt_checkpointer* cp, const char* name, const void** data, size_t* size);

/* The guard: call before every parameter or optimizer update. */
int ckpt_before_update(ckpt_checkpointer* cp);
/* Call after each update with the number of completed updates; *stop becomes 1 when the loop must stop. */
int ckpt_after_step(ckpt_checkpointer* cp, uint64_t step, int* stop);
/* A section of this step's own work (no collective inside) took `seconds`: what straggler detection compares. */
int ckpt_time_section(ckpt_checkpointer* cp, double seconds);
/* Takes a checkpoint now (terminal: then stop); every rank must call it at the same step. */
int ckpt_save(ckpt_checkpointer* cp, uint64_t step, int terminal);

/* Watches an NCCL communicator (an ncclComm_t) until ckpt_close: an asynchronous error aborts it and starts the
 * last words; last words started another way abort it first. Destroy the communicator only after ckpt_close. */
int ckpt_watch_nccl(ckpt_checkpointer* cp, void* comm);

int ckpt_stats_get(const ckpt_checkpointer* cp, ckpt_stats* out);
/* Waits for the last persist and commit; returns the first persist failure, if any. */
int ckpt_close(ckpt_checkpointer* cp);
/* Frees; NULL is fine. Without ckpt_close first, it does not wait for other ranks' shards (for error paths). */
void ckpt_free(ckpt_checkpointer* cp);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif /* CKPT_H */
