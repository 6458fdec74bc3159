// bench_store: the checkpoint store against the disk it runs on, in one run.
//   disk sequential write and read bandwidth (O_DIRECT where the file system allows it, else write+fsync and
//   a read after dropping the file's cached pages), XXH3 in memory (the CPU limit), commit latency of a small
//   4-rank checkpoint, and verify throughput cold and warm, reported as medians and as ratios to those limits.
//
//   bench_store [DIR] [--mib N]     DIR defaults to $TMPDIR or /tmp; N (default 1024) is the data per measurement.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/parse.hpp"
#include "ckpt/store.hpp"

namespace {

namespace store = ckpt::store;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kBlock = 4u << 20;
constexpr int kReps = 3;
constexpr int kCommits = 50;
constexpr int kRanks = 4;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  auto index = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(index, v.size() - 1)];
}

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "bench_store: %s\n", why.c_str());
  std::exit(1);
}

struct AlignedBuffer {
  explicit AlignedBuffer(std::size_t n) : size(n) {
    void* p = nullptr;
    if (::posix_memalign(&p, 4096, n) != 0) die("out of memory");
    data.reset(static_cast<char*>(p));
  }
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> data;
  std::size_t size;
};

void fill_random(char* p, std::size_t n, std::uint64_t seed) {
  std::uint64_t x = seed;
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
}

// Drops a file's clean pages from the page cache, so that the next read comes from the disk.
void drop_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Writes `bytes` sequentially and makes them durable; returns bytes/s. Tries O_DIRECT first.
double disk_write(const std::string& path, std::uint64_t bytes, const AlignedBuffer& buf, bool& direct) {
  ::unlink(path.c_str());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0), 0600);
  if (fd < 0 && direct) {
    direct = false;
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  }
  if (fd < 0) die("cannot create " + path + ": " + std::strerror(errno));
  auto start = Clock::now();
  for (std::uint64_t done = 0; done < bytes; done += buf.size) {
    ssize_t n = ::write(fd, buf.data.get(), buf.size);
    if (n < 0 && direct && done == 0 && errno == EINVAL) {  // the file system refuses O_DIRECT
      ::close(fd);
      direct = false;
      return disk_write(path, bytes, buf, direct);
    }
    if (n != static_cast<ssize_t>(buf.size)) die("write failed: " + std::string(std::strerror(errno)));
  }
  if (::fsync(fd) != 0) die("fsync failed");
  double s = seconds_since(start);
  ::close(fd);
  return static_cast<double>(bytes) / s;
}

double disk_read(const std::string& path, const AlignedBuffer& buf, bool direct) {
  if (!direct) drop_cache(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd < 0) die("cannot open " + path);
  auto start = Clock::now();
  std::uint64_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf.data.get(), buf.size);
    if (n < 0) die("read failed: " + std::string(std::strerror(errno)));
    if (n == 0) break;
    total += static_cast<std::uint64_t>(n);
  }
  double s = seconds_since(start);
  ::close(fd);
  return static_cast<double>(total) / s;
}

double xxh3_in_memory(const AlignedBuffer& buf, std::uint64_t bytes) {
  auto start = Clock::now();
  std::uint64_t sink = 0;
  for (std::uint64_t done = 0; done < bytes; done += buf.size) sink ^= XXH3_64bits(buf.data.get(), buf.size);
  double s = seconds_since(start);
  if (sink == 42) std::printf(" ");  // keeps the loop from being optimized away
  return static_cast<double>(bytes) / s;
}

// Writes one checkpoint of kRanks shards of `per_rank` bytes; returns the commit's duration alone.
double save_checkpoint(const std::string& root, std::uint64_t step, const AlignedBuffer& buf, std::uint64_t per_rank,
                       double* save_seconds) {
  auto start = Clock::now();
  store::Manifest m;
  m.step = step;
  m.world_size = kRanks;
  m.layout.dp = kRanks;
  for (int rank = 0; rank < kRanks; ++rank) {
    m.ranks.push_back({rank, rank, 0, 0});
    auto w = store::ShardWriter::open(root, step, rank);
    if (!w) die(w.error());
    for (std::uint64_t done = 0; done < per_rank; done += buf.size) {
      std::uint64_t n = std::min<std::uint64_t>(buf.size, per_rank - done);
      if (auto s = w->append("part" + std::to_string(done / buf.size), buf.data.get(), n); !s) die(s.error());
    }
    if (auto r = w->finish(); !r) die(r.error());
  }
  auto commit_start = Clock::now();
  if (auto s = store::commit(root, m); !s) die(s.error());
  double commit_s = seconds_since(commit_start);
  if (save_seconds != nullptr) *save_seconds = seconds_since(start);
  return commit_s;
}

double gbps(double bytes_per_s) { return bytes_per_s / 1e9; }

struct Args {
  std::string base;  // the dir the run's own temporary dir goes under
  std::uint64_t mib = 1024;
};

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--mib" && i + 1 < argc) {
      auto n = ckpt::parse_uint(argv[++i]);
      if (!n || *n < 16 || *n > (1u << 20)) die("--mib: expected a number from 16 up");
      args.mib = *n;
    } else if (!arg.empty() && arg[0] != '-' && args.base.empty()) {
      args.base = arg;
    } else {
      die("usage: bench_store [DIR] [--mib N]");
    }
  }
  if (args.base.empty()) args.base = std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp";
  return args;
}

// Every measurement's samples (bytes/s, or seconds for the latencies).
struct Samples {
  bool direct = true;  // the disk measurements used O_DIRECT
  std::vector<double> writes, reads, buffered, hashes;
  std::vector<double> commits, saves;
  std::vector<double> cold, warm;
};

// Disk and memory: the physical limits everything else is compared with.
void measure_limits(const std::string& dir, std::uint64_t bytes, const AlignedBuffer& buf, Samples& s) {
  for (int r = 0; r < kReps; ++r) s.writes.push_back(disk_write(dir + "/disk.bin", bytes, buf, s.direct));
  for (int r = 0; r < kReps; ++r) s.reads.push_back(disk_read(dir + "/disk.bin", buf, s.direct));
  // Buffered reads get the kernel's readahead, as verify does; the fairer baseline for it.
  for (int r = 0; r < kReps; ++r) s.buffered.push_back(disk_read(dir + "/disk.bin", buf, false));
  ::unlink((dir + "/disk.bin").c_str());
  for (int r = 0; r < kReps; ++r) s.hashes.push_back(xxh3_in_memory(buf, bytes));
}

// Commit latency: many small checkpoints, commit() alone and the whole save.
void measure_commits(const std::string& dir, Samples& s) {
  const std::string small_root = dir + "/small";
  AlignedBuffer small(64u << 10);
  fill_random(small.data.get(), small.size, 7);
  for (int i = 1; i <= kCommits; ++i) {
    double save_s = 0;
    s.commits.push_back(save_checkpoint(small_root, static_cast<std::uint64_t>(i), small, small.size, &save_s));
    s.saves.push_back(save_s);
  }
}

// Verify throughput over one large checkpoint, cold (from the disk) and warm (from the page cache).
void measure_verify(const std::string& dir, std::uint64_t bytes, const AlignedBuffer& buf, Samples& s) {
  const std::string big_root = dir + "/big";
  save_checkpoint(big_root, 1, buf, bytes / kRanks, nullptr);
  for (int r = 0; r < kReps; ++r) {
    for (int rank = 0; rank < kRanks; ++rank) drop_cache(big_root + "/000000000001/" + store::shard_file_name(rank));
    auto start = Clock::now();
    if (auto v = store::verify(big_root, 1); !v) die(v.error());
    s.cold.push_back(static_cast<double>(bytes) / seconds_since(start));
  }
  for (int r = 0; r < kReps + 1; ++r) {
    auto start = Clock::now();
    if (auto v = store::verify(big_root, 1); !v) die(v.error());
    if (r > 0) s.warm.push_back(static_cast<double>(bytes) / seconds_since(start));  // the first one warms up
  }
}

void print_report(const std::string& base, std::uint64_t bytes, const Samples& s) {
  const double w = median(s.writes), rd = median(s.reads), rb = median(s.buffered), h = median(s.hashes);
  const double c = median(s.cold), wm = median(s.warm);
  auto row = [](const std::string& label, const std::string& value) {
    std::printf("  %-44s %s\n", label.c_str(), value.c_str());
  };
  auto rate = [](double bytes_per_s, const std::string& suffix = "") {
    char text[96];
    std::snprintf(text, sizeof text, "%7.2f GB/s%s", gbps(bytes_per_s), suffix.c_str());
    return std::string(text);
  };
  auto ratio = [](double x, const char* of) {
    char text[64];
    std::snprintf(text, sizeof text, "%.2fx %s", x, of);
    return std::string(text);
  };
  auto latency = [](const std::vector<double>& v) {
    char text[96];
    std::snprintf(text, sizeof text, "median %6.2f ms   p90 %6.2f ms", median(v) * 1e3, percentile(v, 0.9) * 1e3);
    return std::string(text);
  };
  std::printf("bench_store: %s, %llu MiB per measurement, medians of %d runs\n", base.c_str(),
              static_cast<unsigned long long>(bytes >> 20), kReps);
  row(std::string("disk sequential write (") + (s.direct ? "O_DIRECT" : "write") + ", fsync)", rate(w));
  row(std::string("disk sequential read (") + (s.direct ? "O_DIRECT" : "uncached") + ")", rate(rd));
  row("disk sequential read (uncached, buffered)", rate(rb));
  row("xxh3 in memory", rate(h));
  row("commit latency (" + std::to_string(kRanks) + " ranks x 64 KiB, " + std::to_string(kCommits) + "x)",
      latency(s.commits));
  row("save+commit latency (same)", latency(s.saves));
  row("verify, cold cache",
      rate(c, "   = " + ratio(c / rb, "buffered disk read") + ", " + ratio(c / rd, "O_DIRECT read")));
  row("verify, warm cache", rate(wm, "   = " + ratio(wm / h, "xxh3 in memory")));
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  std::string pattern = args.base + "/bench-store-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) die("cannot create a dir under " + args.base);
  const std::string dir = pattern;
  const std::uint64_t bytes = args.mib << 20;
  const std::uint64_t rounded = (bytes + kBlock - 1) / kBlock * kBlock;

  AlignedBuffer buf(kBlock);
  fill_random(buf.data.get(), buf.size, 0x2545F4914F6CDD1DULL);
  Samples samples;
  measure_limits(dir, rounded, buf, samples);
  measure_commits(dir, samples);
  measure_verify(dir, rounded, buf, samples);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  print_report(args.base, rounded, samples);
  return 0;
}
