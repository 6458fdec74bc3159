#include "staging.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "ckpt/clock.hpp"

namespace ckpt::hooks {

Result<HostBuffer> HostBuffer::allocate(std::size_t bytes) {
  HostBuffer buffer;
  if (bytes == 0) return buffer;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::size_t rounded = (bytes + page - 1) / page * page;
  void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    return Error{"cannot allocate " + std::to_string(rounded) + " bytes of staging memory: " +
                 std::error_code(errno, std::generic_category()).message()};
  }
  buffer.data_ = static_cast<std::byte*>(p);
  buffer.size_ = rounded;
  buffer.anonymous_ = true;
  return buffer;
}

Result<HostBuffer> HostBuffer::map_file(int fd, std::size_t bytes, bool writable) {
  HostBuffer buffer;
  if (bytes == 0) return buffer;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::size_t rounded = (bytes + page - 1) / page * page;
  if (writable) {
    if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(rounded)); err != 0) {
      return Error{"cannot allocate " + std::to_string(rounded) + " bytes of staging file: " +
                   std::error_code(err, std::generic_category()).message()};
    }
  } else {
    rounded = bytes;
  }
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  // Populated either way: a restore reads every byte, and one populate costs a fraction of a fault per page.
  void* p = ::mmap(nullptr, rounded, prot, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    return Error{"cannot map " + std::to_string(rounded) + " bytes of staging file: " +
                 std::error_code(errno, std::generic_category()).message()};
  }
  buffer.data_ = static_cast<std::byte*>(p);
  buffer.size_ = rounded;
  return buffer;
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      anonymous_(std::exchange(other.anonymous_, false)),
      file_(std::exchange(other.file_, std::string())) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    anonymous_ = std::exchange(other.anonymous_, false);
    file_ = std::exchange(other.file_, std::string());
  }
  return *this;
}

HostBuffer::~HostBuffer() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

BufferReserve& BufferReserve::process() {
  static BufferReserve* reserve = new BufferReserve;  // never destroyed: buffers come back during exit too
  return *reserve;
}

void BufferReserve::open() {
  std::lock_guard<std::mutex> lock(mu_);
  open_ = true;
}

namespace {

// A buffer the reserve lets go of: a node tier file goes with its mapping (its tier no longer lists it).
void let_go(std::vector<HostBuffer>& buffers) {
  for (HostBuffer& b : buffers) {
    if (!b.file().empty()) (void)::unlink(b.file().c_str());
  }
  buffers.clear();
}

}  // namespace

void BufferReserve::give(HostBuffer buffer) {
  if (buffer.size() == 0 || (!buffer.anonymous() && buffer.file().empty())) return;
  std::vector<HostBuffer> unused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_) {
      kept_.push_back(std::move(buffer));
      return;
    }
  }
  unused.push_back(std::move(buffer));
  let_go(unused);
}

std::optional<HostBuffer> BufferReserve::take(std::size_t bytes, bool file, const std::string& prefix) {
  std::vector<HostBuffer> unused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t most = bytes + std::max(bytes / 16, page);
    auto of_kind = [&](const HostBuffer& b) { return file ? b.file().rfind(prefix, 0) == 0 : b.anonymous(); };
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      const bool fits = it->size() >= bytes && it->size() <= most;
      if (of_kind(*it) && fits && (best == kept_.end() || it->size() < best->size())) {
        best = it;
      }
    }
    if (best != kept_.end()) {
      HostBuffer taken = std::move(*best);
      kept_.erase(best);
      use_.taken += taken.size();
      return taken;
    }
    for (auto it = kept_.begin(); it != kept_.end();) {
      if (!of_kind(*it)) {
        ++it;
        continue;
      }
      use_.unused += it->size();
      unused.push_back(std::move(*it));
      it = kept_.erase(it);
    }
  }
  let_go(unused);  // before anything new is mapped
  return std::nullopt;
}

Result<HostBuffer> BufferReserve::take_or_allocate(std::size_t bytes) {
  if (bytes == 0) return HostBuffer();
  if (auto kept = take(bytes, false, "")) return std::move(*kept);
  return HostBuffer::allocate(bytes);
}

std::optional<HostBuffer> BufferReserve::take_file(std::size_t bytes, const std::string& prefix) {
  if (bytes == 0 || prefix.empty()) return std::nullopt;
  return take(bytes, true, prefix);
}

BufferReserve::Use BufferReserve::close() {
  std::vector<HostBuffer> unused;
  Use use;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const HostBuffer& b : kept_) use_.unused += b.size();
    open_ = false;
    unused.swap(kept_);
    use = std::exchange(use_, Use{});
  }
  let_go(unused);
  return use;
}

std::size_t BufferReserve::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (const HostBuffer& b : kept_) n += b.size();
  return n;
}

StagingPlan plan_staging(const std::vector<RegionSpec>& regions) {
  StagingPlan plan;
  auto place = [](std::size_t& end, std::size_t size) {
    std::size_t offset = (end + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
    end = offset + size;
    return offset;
  };
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const RegionSpec& r = regions[i];
    if (r.memory == Memory::Host) {
      plan.host.push_back({i, place(plan.host_bytes, r.size), r.size});
    } else {
      plan.device.push_back({i, place(plan.device_bytes, r.size), r.size});
    }
  }
  return plan;
}

std::vector<CopyChunk> split_copies(const std::vector<CopyChunk>& copies, std::size_t chunk) {
  std::vector<CopyChunk> out;
  for (const CopyChunk& c : copies) {
    for (std::size_t done = 0; done < c.size; done += chunk) {
      out.push_back({c.dst + done, c.src + done, std::min(chunk, c.size - done)});
    }
  }
  return out;
}

namespace {
std::atomic<void (*)()> g_copy_hook{nullptr};
}  // namespace

void set_copy_hook_for_testing(void (*hook)()) { g_copy_hook.store(hook); }

CopyPool::CopyPool(unsigned threads) {
  threads_.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { worker(); });
}

CopyPool::~CopyPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void CopyPool::start(std::vector<CopyChunk> chunks) {
  auto batch = std::make_shared<Batch>();
  batch->chunks = std::move(chunks);
  batch->remaining = batch->chunks.size();
  batch->started = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch_ = batch;
    ++generation_;
    if (batch->remaining == 0) last_seconds_ = 0;
  }
  if (threads_.empty()) {
    run(*batch);
    return;
  }
  work_cv_.notify_all();
}

void CopyPool::run(Batch& batch) {
  for (;;) {
    std::size_t i = batch.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= batch.chunks.size()) return;
    const CopyChunk& c = batch.chunks[i];
    if (auto hook = g_copy_hook.load(std::memory_order_relaxed)) hook();
    std::memcpy(c.dst, c.src, c.size);
    std::lock_guard<std::mutex> lock(mu_);
    if (--batch.remaining == 0) {
      last_seconds_ = seconds_since(batch.started);
      done_cv_.notify_all();
    }
  }
}

void CopyPool::worker() {
  std::uint64_t seen = 0;
  for (;;) {
    std::shared_ptr<Batch> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      batch = batch_;
    }
    if (batch) run(*batch);
  }
}

void CopyPool::help_and_wait() {
  std::shared_ptr<Batch> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch = batch_;
  }
  if (batch) run(*batch);
  wait();
}

void CopyPool::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return !batch_ || batch_->remaining == 0; });
}

bool CopyPool::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !batch_ || batch_->remaining == 0;
}

double CopyPool::last_batch_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_seconds_;
}

}  // namespace ckpt::hooks
