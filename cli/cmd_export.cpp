// ckpt export: a checkpoint's model weights as safetensors or a torch.save file, for tools that are not ours.
//
// The export streams: it reads each model tensor's own range of its shard, checked against the range's checksum
// (in a checkpoint whose ranges have none, the whole shard once, in file order, against the shard's), and writes
// the bytes where the format puts them. Nothing is published unless every checksum matched: the output is
// written under a temporary name beside OUT and renamed to OUT at the end, never over an existing OUT. Memory
// stays at one read chunk whatever the checkpoint's size; a tensor split across tensor-parallel ranks is joined in
// memory, so the largest of those is held once.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/parse.hpp"
#include "ckpt/posix.hpp"
#include "ckpt/store.hpp"
#include "ckpt/weights.hpp"
#include "commands.hpp"

namespace {

namespace store = ckpt::store;
namespace weights = ckpt::weights;
namespace posix = ckpt::posix;
using ckpt::Status;

constexpr int kExitNo = 1;
constexpr int kExitError = 2;
constexpr std::uint64_t kDefaultMaxFile = 5'000'000'000;  // Hugging Face's default shard size, "5GB"

void error_line(const std::string& message) { std::fprintf(stderr, "ckpt: %s\n", message.c_str()); }

struct ExportArgs {
  std::string dir;
  std::string step;
  std::string format;
  std::string out;
  std::string max_file_size;
  bool verify_all = false;
};

// Where each tensor's bytes go: an open output file and the offset of the tensor's first byte in it. For the
// torch format, the tensor's zip entry too, whose CRC-32 is computed as the bytes pass.
struct Placement {
  int fd = -1;
  std::uint64_t at = 0;
  weights::ZipEntry* entry = nullptr;
};

Status write_at(int fd, const char* data, std::size_t size, std::uint64_t at, const std::string& what) {
  while (size > 0) {
    ssize_t n = ::pwrite(fd, data, size, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::failure("cannot write " + what + ": " + posix::errno_text(errno));
    data += n;
    size -= static_cast<std::size_t>(n);
    at += static_cast<std::uint64_t>(n);
  }
  return Status::success();
}

ckpt::Result<posix::Fd> create_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return ckpt::Error{"cannot create " + path + ": " + posix::errno_text(errno)};
  return posix::Fd(fd);
}

// Writes the bytes of tensors `mine` (in file order) that a chunk of their shard holds to their placements.
class Copier {
 public:
  Copier(const std::vector<weights::Tensor>& tensors, const std::vector<Placement>& placements,
         std::vector<std::size_t> mine, std::string what)
      : tensors_(tensors), placements_(placements), mine_(std::move(mine)), what_(std::move(what)) {}

  bool on_chunk(std::uint64_t offset, const char* data, std::size_t size) {
    const std::uint64_t end = offset + size;
    for (std::size_t k = next_; k < mine_.size(); ++k) {
      const weights::Tensor& t = tensors_[mine_[k]];
      if (t.offset >= end) break;
      const std::uint64_t from = std::max(offset, t.offset), to = std::min(end, t.offset + t.length);
      if (from < to) {
        const Placement& p = placements_[mine_[k]];
        const char* bytes = data + (from - offset);
        written_ = write_at(p.fd, bytes, to - from, p.at + (from - t.offset), what_);
        if (!written_) return false;
        if (p.entry != nullptr) {
          p.entry->crc32 = static_cast<std::uint32_t>(
              ::crc32_z(p.entry->crc32, reinterpret_cast<const Bytef*>(bytes), static_cast<z_size_t>(to - from)));
        }
      }
      if (t.offset + t.length <= end && k == next_) ++next_;
    }
    return true;
  }
  const Status& written() const { return written_; }

 private:
  const std::vector<weights::Tensor>& tensors_;
  const std::vector<Placement>& placements_;
  const std::vector<std::size_t> mine_;
  const std::string what_;
  std::size_t next_ = 0;
  Status written_;
};

// A tensor split across tensor-parallel ranks, joined in memory from its blocks (each read whole against its own
// checksum) and written in one piece: memory holds the largest such tensor and one block of it.
Status join_tensor(const std::string& dir, const store::Manifest& manifest, const weights::Tensor& t,
                   const Placement& p, const std::string& what, std::uint64_t& bytes_read) {
  std::vector<std::byte> whole(static_cast<std::size_t>(t.length)), block;
  store::ShardRead read = store::read_block(dir, manifest, t.blocks, t.whole, t.dtype->size, whole.data(), block);
  bytes_read += read.bytes;
  if (!read.status) return read.status;
  const char* bytes = reinterpret_cast<const char*>(whole.data());
  if (Status s = write_at(p.fd, bytes, whole.size(), p.at, what); !s) return s;
  if (p.entry != nullptr) {
    p.entry->crc32 = static_cast<std::uint32_t>(
        ::crc32_z(p.entry->crc32, reinterpret_cast<const Bytef*>(bytes), static_cast<z_size_t>(whole.size())));
  }
  return Status::success();
}

// Reads what the tensors need of each shard they come from, once: the tensors' own ranges where each records its
// checksum (none of the rest of the shard is read), else the whole shard in file order, its checksum computed as
// it passes. Fails on the first range or shard whose size or checksum is wrong, or on a write error.
Status copy_tensors(const std::string& dir, const store::Manifest& manifest, const std::vector<weights::Tensor>& tensors,
                    const std::vector<Placement>& placements, const std::string& what, std::uint64_t& bytes_read) {
  for (std::size_t shard : weights::shards_read(tensors)) {
    const store::ShardRecord& record = manifest.shards[shard];
    std::vector<std::size_t> mine;  // in file order, as the copier needs
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].blocks.empty() && tensors[i].shard == shard) mine.push_back(i);
    }
    std::stable_sort(mine.begin(), mine.end(), [&](std::size_t a, std::size_t b) {
      return tensors[a].offset < tensors[b].offset;
    });
    Copier copier(tensors, placements, mine, what);
    store::ShardSink sink = [&](std::uint64_t offset, const char* data, std::size_t size) {
      return copier.on_chunk(offset, data, size);
    };
    const bool by_range = std::all_of(mine.begin(), mine.end(), [&](std::size_t i) { return tensors[i].checksum; });
    if (!by_range) {
      store::ShardRead read = store::stream_shard(dir, manifest.step, record, sink);
      bytes_read += read.bytes;
      if (!copier.written()) return copier.written();
      if (!read.status) return read.status;
      continue;
    }
    for (std::size_t i : mine) {
      const weights::Tensor& t = tensors[i];
      const store::StateRange range{std::string(weights::kModelPrefix) + t.name, t.offset, t.length, {}, t.checksum};
      store::ShardRead read = store::stream_range(dir, manifest.step, record, range, sink);
      bytes_read += read.bytes;
      if (!copier.written()) return copier.written();
      if (!read.status) return read.status;
    }
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].blocks.empty()) {
      if (Status s = join_tensor(dir, manifest, tensors[i], placements[i], what, bytes_read); !s) return s;
    }
  }
  return Status::success();
}

Status sync_and_close(posix::Fd& fd, const std::string& what) {
  Status s = posix::fsync_fd(fd.get(), what);
  fd.reset();
  return s;
}

Status sync_dir(const std::string& path) {
  posix::Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return Status::failure("cannot open " + path + ": " + posix::errno_text(errno));
  return posix::fsync_fd(fd.get(), path);
}

// safetensors: OUT is a directory of one file or of several and their index.
Status export_safetensors(const std::string& dir, const store::Manifest& manifest,
                          const std::vector<weights::Tensor>& tensors, std::uint64_t max_file,
                          const std::string& temp, std::size_t& files_written, std::uint64_t& bytes_read) {
  if (::mkdir(temp.c_str(), 0755) != 0) return Status::failure("cannot create " + temp + ": " + posix::errno_text(errno));
  const std::vector<std::pair<std::string, std::string>> metadata = {
      {"format", "pt"}, {"step", std::to_string(manifest.step)}, {"source", "slurm-ckpt"}};
  auto files = weights::safetensors_files(tensors, max_file, metadata);
  std::vector<posix::Fd> fds;
  std::vector<Placement> placements(tensors.size());
  for (const weights::SafetensorsFile& file : files) {
    auto fd = create_file(temp + "/" + file.name);
    if (!fd) return Status::failure(fd.error());
    if (Status s = write_at(fd->get(), file.header.data(), file.header.size(), 0, file.name); !s) return s;
    std::uint64_t at = file.header.size();
    for (std::size_t i : file.tensors) {
      placements[i] = {fd->get(), at, nullptr};
      at += tensors[i].length;
    }
    // The data's length is known: the file is its full size from the start, a short write shows as zeros only
    // in a file that is never published.
    if (::ftruncate(fd->get(), static_cast<off_t>(file.size)) != 0) {
      return Status::failure("cannot size " + file.name + ": " + posix::errno_text(errno));
    }
    fds.push_back(std::move(fd).value());
  }
  if (Status s = copy_tensors(dir, manifest, tensors, placements, "the safetensors output", bytes_read); !s) return s;
  for (std::size_t f = 0; f < fds.size(); ++f) {
    if (Status s = sync_and_close(fds[f], files[f].name); !s) return s;
  }
  if (files.size() > 1) {
    auto fd = create_file(temp + "/model.safetensors.index.json");
    if (!fd) return Status::failure(fd.error());
    std::string index = weights::safetensors_index(tensors, files);
    if (Status s = posix::write_all(fd->get(), index.data(), index.size(), "the index"); !s) return s;
    if (Status s = sync_and_close(fd.value(), "the index"); !s) return s;
  }
  files_written = files.size();
  return sync_dir(temp);
}

// torch: OUT is one file in torch.save's zip layout.
Status export_torch(const std::string& dir, const store::Manifest& manifest, const std::vector<weights::Tensor>& tensors,
                    const std::string& temp, std::uint64_t& bytes_read) {
  auto fd = create_file(temp);
  if (!fd) return Status::failure(fd.error());
  const std::string archive = "archive/";
  const std::string pickle = weights::torch_pickle(tensors);
  const std::string version = "3\n";
  // Entries: data.pkl, one per tensor, version; each placed after the last, its data aligned.
  std::vector<weights::ZipEntry> entries;
  std::uint64_t at = 0;
  auto place = [&](std::string name, std::uint64_t size) {
    weights::ZipEntry e{archive + std::move(name), at, size, 0};
    at += weights::zip_local_header(e).size() + size;
    entries.push_back(std::move(e));
  };
  place("data.pkl", pickle.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) place("data/" + std::to_string(i), tensors[i].length);
  place("version", version.size());
  entries.front().crc32 = static_cast<std::uint32_t>(
      ::crc32_z(0, reinterpret_cast<const Bytef*>(pickle.data()), static_cast<z_size_t>(pickle.size())));
  entries.back().crc32 = static_cast<std::uint32_t>(
      ::crc32_z(0, reinterpret_cast<const Bytef*>(version.data()), static_cast<z_size_t>(version.size())));
  auto data_at = [&](const weights::ZipEntry& e) { return e.offset + weights::zip_local_header(e).size(); };
  if (Status s = write_at(fd->get(), pickle.data(), pickle.size(), data_at(entries.front()), "data.pkl"); !s) return s;
  if (Status s = write_at(fd->get(), version.data(), version.size(), data_at(entries.back()), "version"); !s) return s;
  std::vector<Placement> placements(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) placements[i] = {fd->get(), data_at(entries[i + 1]), &entries[i + 1]};
  if (Status s = copy_tensors(dir, manifest, tensors, placements, "the torch output", bytes_read); !s) return s;
  // The headers last, now that every CRC is known (a header's length does not depend on its CRC).
  for (const weights::ZipEntry& e : entries) {
    std::string header = weights::zip_local_header(e);
    if (Status s = write_at(fd->get(), header.data(), header.size(), e.offset, e.name); !s) return s;
  }
  std::string directory = weights::zip_directory(entries, at);
  if (Status s = write_at(fd->get(), directory.data(), directory.size(), at, "the zip directory"); !s) return s;
  return sync_and_close(fd.value(), temp);
}

// The checkpoint to export: --step N if given and complete, else the one a restart would use. Only manifests and
// sizes are read here; the bytes are checked as they are exported (or all of them first, --verify-all).
std::optional<store::Manifest> choose(const ExportArgs& args) {
  if (!args.step.empty()) {
    auto step = ckpt::parse_uint(args.step);
    if (!step) {
      error_line("--step '" + args.step + "': " + step.error());
      return std::nullopt;
    }
    auto manifest = store::check_records(args.dir, *step);
    if (!manifest) {
      error_line("export: " + manifest.error());
      return std::nullopt;
    }
    return std::move(manifest).value();
  }
  store::ResolveOptions options;
  options.mark = false;
  options.checksums = false;
  store::ResumeChoice choice = store::resolve_resume(args.dir, options);
  if (!choice.step || !choice.manifest) {
    error_line("export: no complete checkpoint in " + args.dir);
    return std::nullopt;
  }
  return std::move(choice.manifest);
}

int run_export(const ExportArgs& args) {
  if (args.format != "safetensors" && args.format != "torch") {
    error_line("--format '" + args.format + "': expected safetensors or torch");
    return kExitError;
  }
  std::uint64_t max_file = kDefaultMaxFile;
  if (!args.max_file_size.empty()) {
    auto size = ckpt::parse_bytes(args.max_file_size);
    if (!size || *size == 0) {
      error_line("--max-file-size '" + args.max_file_size + "': " + (size ? "must be above 0" : size.error()));
      return kExitError;
    }
    max_file = *size;
  }
  std::error_code ec;
  if (std::filesystem::symlink_status(args.out, ec).type() != std::filesystem::file_type::not_found) {
    error_line("export: " + args.out + " exists; the export writes a new one and never replaces anything");
    return kExitError;
  }
  auto manifest = choose(args);
  if (!manifest) return kExitNo;
  if (args.verify_all) {
    if (Status s = store::verify(args.dir, manifest->step, true); !s) {
      error_line("export: " + s.error());
      return kExitNo;
    }
  }
  auto tensors = weights::model_tensors(*manifest);
  if (!tensors) {
    error_line("export: step " + std::to_string(manifest->step) + ": " + tensors.error());
    return kExitNo;
  }
  const std::string temp = args.out + ".partial-" + posix::random_suffix();
  std::size_t files = 1;
  std::uint64_t bytes_read = 0;
  Status done = args.format == "safetensors"
                    ? export_safetensors(args.dir, *manifest, *tensors, max_file, temp, files, bytes_read)
                    : export_torch(args.dir, *manifest, *tensors, temp, bytes_read);
  if (done && std::filesystem::exists(args.out, ec)) done = Status::failure(args.out + " appeared meanwhile");
  if (done && ::rename(temp.c_str(), args.out.c_str()) != 0) {
    done = Status::failure("cannot rename " + temp + " to " + args.out + ": " + posix::errno_text(errno));
  }
  if (!done) {
    std::filesystem::remove_all(temp, ec);
    error_line("export: " + done.error() + "; nothing written");  // the store's errors name the step
    return kExitNo;
  }
  std::filesystem::path parent = std::filesystem::absolute(args.out, ec).parent_path();
  (void)sync_dir(parent.string());
  std::uint64_t bytes = 0;
  for (const weights::Tensor& t : *tensors) bytes += t.length;
  std::uint64_t total = 0;
  for (const store::ShardRecord& r : manifest->shards) total += r.size;
  std::printf("exported step %llu: %zu tensors, %llu bytes, %s in %zu file%s: %s (read %llu of the checkpoint's %llu "
              "bytes)\n",
              static_cast<unsigned long long>(manifest->step), tensors->size(), static_cast<unsigned long long>(bytes),
              args.format.c_str(), files, files == 1 ? "" : "s", args.out.c_str(),
              static_cast<unsigned long long>(bytes_read), static_cast<unsigned long long>(total));
  return 0;
}

}  // namespace

void add_export_commands(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "export", "Write a checkpoint's model weights as safetensors or a torch.save file, checked as they are read");
  cmd->add_option("dir", args->dir, "Checkpoint dir (CKPT_DIR)")->required();
  cmd->add_option("--step", args->step, "Step to export (default: the one a restart would use)")->type_name("N");
  cmd->add_option("--format", args->format, "safetensors (OUT is a directory) or torch (OUT is a file)")
      ->required()
      ->type_name("FORMAT");
  cmd->add_option("-o,--output", args->out, "Where to write; must not exist")->required()->type_name("OUT");
  cmd->add_option("--max-file-size", args->max_file_size, "safetensors: the most data per file (default 5GB)")
      ->type_name("SIZE");
  cmd->add_flag("--verify-all", args->verify_all,
                "First check every shard's checksum, the replicas not exported too");
  cmd->callback([args, &exit_code] { exit_code = run_export(*args); });
}
