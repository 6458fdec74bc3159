/* bench_scale_rank: one rank of the scale benchmark (bench/scale/run.sh), a training job through the C ABI.
 *
 *   srun ... bench_scale_rank --out DIR [--steps S] [--step-ms MS] [--warmup W] [--marker-step M] [--state-bytes B]
 *
 * Each rank registers B bytes of host state (4 KiB unless told), declares the layout dp=<world size> (so that --ckpt-last-words=on
 * arms the last words), restores, and trains until step S: a "step" sleeps until its end on a clock common to
 * every rank, MS milliseconds after the previous one (the compute, which costs no CPU here, so that the CPU a
 * rank uses is the library's; the common clock keeps the ranks in lockstep as gradient reductions would), calls
 * the guard, changes the state and calls ckpt_after_step. It measures itself, without a tracer:
 *   - open+restore: wall time, and /proc/self/io rchar, read_bytes and syscr across ckpt_open + ckpt_restore;
 *     rchar across ckpt_restore alone (the checkpoint's bytes; open reads shared libraries' config files);
 *   - while training (from step resume+W to the last step): CPU (getrusage of the whole process, every thread
 *     of the library included) over wall time, and the TCP connections it holds (socket fds in /proc/self/fd
 *     that are established TCP) with the data segments sent and received on them (TCP_INFO), hence messages
 *     per s;
 *   - rank 0: the latency of each periodic commit (ckpt_stats.last_commit_s, sampled after every step).
 * It writes DIR/pids/rank-R (pid) at start, DIR/ready/rank-R and (rank 0) DIR/start for the common clock,
 * DIR/marker when rank 0 reaches step M, and DIR/rank-R.txt, one line of key=value, when it stops. Exit status 0
 * when training ended normally or stopped after a terminal checkpoint.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"

#define MAX_COMMITS 256

static double unix_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         (double)ru.ru_stime.tv_usec * 1e-6;
}

/* /proc/self/io counters; zero when the file cannot be read. */
typedef struct io_counters {
  unsigned long long rchar, read_bytes, syscr;
} io_counters;

static io_counters read_io(void) {
  io_counters c = {0, 0, 0};
  FILE* f = fopen("/proc/self/io", "r");
  if (f == NULL) return c;
  char key[64];
  unsigned long long value;
  while (fscanf(f, "%63[^:]: %llu\n", key, &value) == 2) {
    if (strcmp(key, "rchar") == 0) c.rchar = value;
    if (strcmp(key, "read_bytes") == 0) c.read_bytes = value;
    if (strcmp(key, "syscr") == 0) c.syscr = value;
  }
  fclose(f);
  return c;
}

/* The sockets this process holds: every socket fd, the established TCP ones, and per fd the socket's inode and
 * the segments with data it sent and received (a 32-byte heartbeat frame is one segment unless frames queue up
 * behind each other). */
#define MAX_FDS 8192
typedef struct socket_census {
  int sockets, tcp_established;
  unsigned long inode[MAX_FDS]; /* 0: no established TCP socket at this fd */
  unsigned long long segs_out[MAX_FDS], segs_in[MAX_FDS];
} socket_census;

static void count_sockets(socket_census* c) {
  memset(c, 0, sizeof *c);
  DIR* d = opendir("/proc/self/fd");
  if (d == NULL) return;
  int own = dirfd(d);
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    int fd = atoi(e->d_name);
    if (fd == own || fd < 0 || fd >= MAX_FDS) continue;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    ++c->sockets;
    int protocol = 0;
    socklen_t len = sizeof protocol;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &len) != 0 || protocol != IPPROTO_TCP) continue;
    struct tcp_info info;
    memset(&info, 0, sizeof info);
    len = sizeof info;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 || info.tcpi_state != 1 /* ESTABLISHED */) continue;
    ++c->tcp_established;
    c->inode[fd] = (unsigned long)st.st_ino;
    c->segs_out[fd] = info.tcpi_data_segs_out; /* segments with payload: pure ACKs are not messages */
    c->segs_in[fd] = info.tcpi_data_segs_in;
  }
  closedir(d);
}

/* Data segments per second over the connections established at both samples, scaled to every connection of the
 * first: ranks finish at different times, and a peer that left takes its connection's counters with it. */
static void segment_rates(const socket_census* a, const socket_census* b, double seconds, double* out, double* in) {
  unsigned long long d_out = 0, d_in = 0;
  int matched = 0;
  for (int fd = 0; fd < MAX_FDS; ++fd) {
    if (a->inode[fd] == 0 || a->inode[fd] != b->inode[fd] || b->segs_out[fd] < a->segs_out[fd]) continue;
    d_out += b->segs_out[fd] - a->segs_out[fd];
    d_in += b->segs_in[fd] - a->segs_in[fd];
    ++matched;
  }
  *out = *in = -1;
  if (matched == 0 || seconds <= 0) return;
  double scale = (double)a->tcp_established / matched;
  *out = (double)d_out / seconds * scale;
  *in = (double)d_in / seconds * scale;
}

static int compare_doubles(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static void write_file(const char* path, const char* text) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE* f = fopen(tmp, "w");
  if (f == NULL) return;
  fputs(text, f);
  fclose(f);
  rename(tmp, path);
}

static void sleep_until(double unix_time) {
  struct timespec ts;
  ts.tv_sec = (time_t)unix_time;
  ts.tv_nsec = (long)((unix_time - (double)ts.tv_sec) * 1e9);
  while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

/* The ranks of a data-parallel job stay within a step of each other (they reduce gradients every step), and the
 * library counts on it; this job has no collective, so it keeps the same lockstep with a common clock instead:
 * every rank says it is ready in DIR/ready/, rank 0 waits for all of them and writes DIR/start (a unix time just
 * ahead), and step k of every rank ends at start + k * step_ms. These files are the benchmark's, outside the
 * checkpoint dir, so no figure counts them. Returns the start time; gives up waiting after two minutes. */
static double common_start(const char* out, int rank, int world) {
  char path[4096], line[64];
  snprintf(path, sizeof path, "%s/ready", out);
  mkdir(path, 0700);
  snprintf(path, sizeof path, "%s/ready/rank-%d", out, rank);
  write_file(path, "1\n");
  snprintf(path, sizeof path, "%s/start", out);
  double give_up = unix_now() + 120;
  struct timespec poll_every = {0, 20 * 1000000L};
  if (rank == 0) {
    char ready[4096];
    snprintf(ready, sizeof ready, "%s/ready", out);
    for (;;) {
      int n = 0;
      DIR* d = opendir(ready);
      struct dirent* e;
      while (d != NULL && (e = readdir(d)) != NULL) n += strncmp(e->d_name, "rank-", 5) == 0;
      if (d != NULL) closedir(d);
      if (n >= world || unix_now() > give_up) break;
      nanosleep(&poll_every, NULL);
    }
    double start = unix_now() + 0.2;
    snprintf(line, sizeof line, "%.6f\n", start);
    write_file(path, line);
    return start;
  }
  for (;;) {
    FILE* f = fopen(path, "r");
    double start = 0;
    if (f != NULL) {
      int got = fscanf(f, "%lf", &start);
      fclose(f);
      if (got == 1) return start;
    }
    if (unix_now() > give_up) return unix_now();
    nanosleep(&poll_every, NULL);
  }
}

static void usage(void) {
  fprintf(stderr, "usage: bench_scale_rank --out DIR [--steps S] [--step-ms MS] [--warmup W] [--marker-step M] "
                  "[--state-bytes B]\n");
  exit(2);
}

typedef struct options {
  const char* out;
  long steps, step_ms, warmup, marker_step, state_bytes;
} options;

static options parse_options(int argc, char** argv) {
  options o = {NULL, 60, 50, 5, -1, 4096};
  for (int i = 1; i < argc; ++i) {
    if (i + 1 >= argc) usage();
    char* end = NULL;
    const char* arg = argv[i];
    const char* value = argv[++i];
    if (strcmp(arg, "--out") == 0) {
      o.out = value;
      continue;
    }
    errno = 0;
    long n = strtol(value, &end, 10);
    if (errno != 0 || end == value || *end != '\0' || n < 0) usage();
    if (strcmp(arg, "--steps") == 0) o.steps = n;
    else if (strcmp(arg, "--step-ms") == 0) o.step_ms = n;
    else if (strcmp(arg, "--warmup") == 0) o.warmup = n;
    else if (strcmp(arg, "--marker-step") == 0) o.marker_step = n;
    else if (strcmp(arg, "--state-bytes") == 0 && n > 0) o.state_bytes = n;
    else usage();
  }
  if (o.out == NULL) usage();
  return o;
}

/* What one rank measured, from ckpt_open to the end of training; the report line is made of it. */
typedef struct rank_run {
  ckpt_checkpointer* cp;
  int rank, world;
  unsigned char* state;
  size_t state_size;
  uint64_t step, resume_step;
  double t_open, t_restored, t_warm, cpu_warm, t_end, cpu_end;
  io_counters io0, io_before_restore, io1;
  int state_ok;
  socket_census at_open, at_warm, at_end;
  double commits[MAX_COMMITS];
  int n_commits;
  int stopped, failed;
  char error[512];
} rank_run;

/* Opens the checkpointer with the layout dp=<world size>, writes DIR/pids/rank-R, registers the state and
 * restores it, checking it bitwise. Returns 0, or 1 after printing why. */
static int open_and_restore(const options* o, rank_run* r) {
  const char* ntasks = getenv("SLURM_NTASKS");
  r->world = ntasks != NULL ? atoi(ntasks) : 1;
  char layout[64];
  snprintf(layout, sizeof layout, "layout=dp=%d", r->world > 0 ? r->world : 1);
  const char* settings[] = {layout};

  char path[4096], line[4096];
  r->t_open = unix_now();
  r->io0 = read_io();
  if (ckpt_open(settings, 1, &r->cp) != 0) {
    fprintf(stderr, "bench_scale_rank: %s\n", ckpt_last_error());
    return 1;
  }
  r->rank = ckpt_rank(r->cp);
  snprintf(path, sizeof path, "%s/pids/rank-%d", o->out, r->rank);
  snprintf(line, sizeof line, "%d\n", (int)getpid());
  write_file(path, line);

  /* Data parallel: every replica holds the same state, so a rank restored from another's shard can be checked. */
  r->state_size = (size_t)o->state_bytes;
  r->state = malloc(r->state_size);
  unsigned char* expected = malloc(r->state_size);
  if (r->state == NULL || expected == NULL) {
    fprintf(stderr, "bench_scale_rank: cannot allocate %zu bytes of state\n", r->state_size);
    return 1;
  }
  for (size_t i = 0; i < r->state_size; ++i) r->state[i] = (unsigned char)i;
  r->step = 0;
  if (ckpt_register_host(r->cp, "state", r->state, r->state_size, 0, NULL) != 0 ||
      (r->io_before_restore = read_io(), ckpt_restore(r->cp, &r->step)) != 0) {
    fprintf(stderr, "bench_scale_rank: rank %d: %s\n", r->rank, ckpt_last_error());
    ckpt_free(r->cp);
    return 1;
  }
  r->t_restored = unix_now();
  /* Bitwise: the restored state is what training from the start to that step computes (the update below). */
  for (size_t i = 0; i < r->state_size; ++i) expected[i] = (unsigned char)i;
  for (uint64_t k = 0; k < r->step; ++k) {
    for (size_t i = 0; i < r->state_size; ++i) expected[i] = (unsigned char)(expected[i] * 31u + (unsigned)k);
  }
  r->io1 = read_io();
  r->state_ok = memcmp(r->state, expected, r->state_size) == 0;
  count_sockets(&r->at_open); /* the mesh is complete once ckpt_open returns */
  r->resume_step = r->step;
  return 0;
}

/* Trains in lockstep until the target step, a stop or a failure; rank 0 samples each commit's latency and writes
 * DIR/marker at the marker step. */
static void train(const options* o, rank_run* r) {
  char path[4096], line[4096];
  uint64_t seen_committed = 0;
  double t_start = common_start(o->out, r->rank, r->world);
  for (; r->step < (uint64_t)o->steps; ++r->step) {
    if (r->step == r->resume_step + (uint64_t)o->warmup) {
      r->t_warm = unix_now();
      r->cpu_warm = cpu_seconds();
      count_sockets(&r->at_warm);
    }
    sleep_until(t_start + (double)(r->step - r->resume_step + 1) * (double)o->step_ms / 1000.0); /* forward, backward */
    if (ckpt_before_update(r->cp) != 0) {
      snprintf(r->error, sizeof r->error, "%s", ckpt_last_error());
      /* The last words started while this rank was between steps: a stop, not a failure. */
      if (strncmp(r->error, "ckpt: training is stopped", 25) == 0) r->stopped = 1;
      else r->failed = 1;
      break;
    }
    for (size_t i = 0; i < r->state_size; ++i) r->state[i] = (unsigned char)(r->state[i] * 31u + (unsigned)r->step);
    if (ckpt_after_step(r->cp, r->step + 1, &r->stopped) != 0) {
      snprintf(r->error, sizeof r->error, "%s", ckpt_last_error());
      r->failed = 1;
      break;
    }
    if (r->rank == 0) {
      ckpt_stats st;
      if (ckpt_stats_get(r->cp, &st) == 0 && st.committed > seen_committed) {
        seen_committed = st.committed;
        if (r->n_commits < MAX_COMMITS) r->commits[r->n_commits++] = st.last_commit_s;
      }
      if ((long)(r->step + 1) == o->marker_step) {
        snprintf(path, sizeof path, "%s/marker", o->out);
        snprintf(line, sizeof line, "%llu %.3f\n", (unsigned long long)(r->step + 1), unix_now());
        write_file(path, line);
      }
    }
    if (r->stopped) {
      ++r->step;
      break;
    }
  }
  r->t_end = unix_now();
  r->cpu_end = cpu_seconds();
  count_sockets(&r->at_end);
}

/* Writes DIR/rank-R.txt, the one line of key=value that bench/scale/report.py parses. */
static void write_report(const options* o, rank_run* r) {
  char path[4096], line[4096];
  double window = r->t_warm > 0 ? r->t_end - r->t_warm : 0;
  double cpu_pct = window > 0 ? 100.0 * (r->cpu_end - r->cpu_warm) / window : -1;
  double out_per_s = -1, in_per_s = -1;
  if (window > 0) segment_rates(&r->at_warm, &r->at_end, window, &out_per_s, &in_per_s);

  ckpt_stats st;
  memset(&st, 0, sizeof st);
  ckpt_stats_get(r->cp, &st);
  double commit_median = -1, commit_max = -1;
  if (r->n_commits > 0) {
    qsort(r->commits, (size_t)r->n_commits, sizeof r->commits[0], compare_doubles);
    commit_median = r->commits[r->n_commits / 2];
    commit_max = r->commits[r->n_commits - 1];
  }
  snprintf(line, sizeof line,
           "rank=%d world=%d pid=%d target=%ld resume_step=%llu end_step=%llu stopped=%d failed=%d "
           "open_restore_s=%.4f rchar=%llu rchar_restore=%llu read_bytes=%llu syscr=%llu cpu_pct=%.3f window_s=%.3f steps_per_s=%.3f "
           "tcp_conns=%d sockets=%d tcp_conns_open=%d tcp_conns_end=%d segs_out_per_s=%.2f segs_in_per_s=%.2f "
           "commits=%d commit_median_s=%.4f commit_max_s=%.4f snapshots=%llu committed=%llu backpressure_waits=%llu "
           "t_open=%.6f t_train=%.6f t_end=%.6f state_ok=%d error=\"%s\"\n",
           r->rank, r->world, (int)getpid(), o->steps, (unsigned long long)r->resume_step,
           (unsigned long long)r->step, r->stopped, r->failed, r->t_restored - r->t_open, r->io1.rchar - r->io0.rchar,
           r->io1.rchar - r->io_before_restore.rchar, r->io1.read_bytes - r->io0.read_bytes,
           r->io1.syscr - r->io0.syscr, cpu_pct, window,
           window > 0 ? (double)(r->step - r->resume_step - (uint64_t)o->warmup) / window : -1,
           r->t_warm > 0 ? r->at_warm.tcp_established : -1, r->t_warm > 0 ? r->at_warm.sockets : -1,
           r->at_open.tcp_established, r->at_end.tcp_established, out_per_s, in_per_s, r->n_commits, commit_median,
           commit_max, (unsigned long long)st.snapshots, (unsigned long long)st.committed,
           (unsigned long long)st.backpressure_waits, r->t_open, r->t_restored, r->t_end, r->state_ok, r->error);
  snprintf(path, sizeof path, "%s/rank-%d.txt", o->out, r->rank);
  write_file(path, line);
}

int main(int argc, char** argv) {
  const options o = parse_options(argc, argv);
  static rank_run r; /* static: the socket censuses are too big for the stack, and it starts zeroed */
  if (open_and_restore(&o, &r) != 0) return 1;
  train(&o, &r);
  write_report(&o, &r); /* before close: after last words the library may end a lingering process */
  int rc = ckpt_close(r.cp);
  if (rc != 0) fprintf(stderr, "bench_scale_rank: rank %d: close: %s\n", r.rank, ckpt_last_error());
  ckpt_free(r.cp);
  return r.failed ? 1 : 0;
}
