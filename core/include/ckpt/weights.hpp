#pragma once
// A checkpoint's model weights in formats other tools read (`ckpt export`): which bytes of which shard hold each
// tensor, and the headers of the two formats. Pure: the command reads and writes the files.
//
// A tensor is a region named "model/<name>" whose metadata gives its dtype and shape ({"dtype": "float32",
// "shape": [4096, 4096]}), as the PyTorch module records every entry of the model's state_dict and as a C or C++
// program may declare its own. Under pure data parallelism every replica holds the whole model; the export reads
// one: for each pipeline stage, the shard of the first rank holding model/pp<p>/tp0. A tensor split across
// tensor-parallel ranks is put back together from its blocks, whose places its metadata records
// (store::tensor_chunk, store::plan_relayout); pipeline stages with tensor-parallel splits are refused.
//
//   safetensors: an 8-byte little-endian header length, a JSON header ({name: {dtype, shape, data_offsets}},
//                "__metadata__"), padded with spaces to 8 bytes, then the tensors' bytes. Split into files of at
//                most a chosen size, as Hugging Face publishes models: model-00001-of-00003.safetensors and
//                model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map": {name: file}}).
//   torch:       the zip layout torch.save writes (<archive>/data.pkl, <archive>/data/<key>, <archive>/version),
//                its pickle an OrderedDict of torch._utils._rebuild_tensor_v2 calls that
//                torch.load(weights_only=True) accepts.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/result.hpp"
#include "ckpt/store.hpp"

namespace ckpt::weights {

inline constexpr std::string_view kModelPrefix = "model/";

// The element types both formats carry: the checkpoint's name (torch's, without "torch."), safetensors' code,
// torch's legacy storage class, the size of one element.
struct DType {
  std::string_view name;         // "float32"
  std::string_view safetensors;  // "F32"
  std::string_view storage;      // "FloatStorage"
  std::uint32_t size = 0;        // 4
};
// Null for a name neither format carries.
const DType* dtype_named(std::string_view name);

struct Tensor {
  std::string name;                  // without "model/"
  const DType* dtype = nullptr;
  std::vector<std::uint64_t> shape;  // row-major, contiguous
  std::size_t shard = 0;             // index into Manifest::shards
  std::uint64_t offset = 0;          // in the shard file
  std::uint64_t length = 0;          // bytes: the product of the shape times the element size
  std::optional<std::uint64_t> checksum;  // the region's own, where the checkpoint records one
  // A tensor split across tensor-parallel ranks: the saved blocks it is joined from in memory (shard, offset and
  // checksum are then unused; each block is read whole against its own checksum).
  std::vector<store::BlockRead> blocks;
  std::optional<store::TensorChunk> whole;  // the whole tensor, as copy_box needs it, where `blocks` are used
};

// The model tensors of a checkpoint, in each shard's file order (shards in rank order; under tensor parallelism,
// rank 0's). An error names what cannot be exported: a model region without a dtype and shape or whose bytes do
// not match them, a split tensor whose blocks do not make it whole, tensor-parallel splits across pipeline
// stages, two stages with one name, a checkpoint with no model tensors.
Result<std::vector<Tensor>> model_tensors(const store::Manifest& manifest);

// The shard indexes the tensors that lie in one range each read from, each once, ascending.
std::vector<std::size_t> shards_read(const std::vector<Tensor>& tensors);

// ---- safetensors ----

struct SafetensorsFile {
  std::string name;                   // "model.safetensors", or "model-00001-of-00003.safetensors"
  std::vector<std::size_t> tensors;   // indexes into the tensor list, in file order
  std::string header;                 // the 8-byte length and the padded JSON: the file's first bytes
  std::uint64_t size = 0;             // header and data
};
// The files an export writes: tensors in order, a new file whenever the next tensor would take one past
// `max_file_bytes` of data (a tensor larger than that gets a file of its own). `metadata` is written into each
// header's "__metadata__" (strings only, as the format requires).
std::vector<SafetensorsFile> safetensors_files(const std::vector<Tensor>& tensors, std::uint64_t max_file_bytes,
                                               const std::vector<std::pair<std::string, std::string>>& metadata);
// model.safetensors.index.json for files of more than one.
std::string safetensors_index(const std::vector<Tensor>& tensors, const std::vector<SafetensorsFile>& files);

// ---- torch ----

// data.pkl of a consolidated state_dict: an OrderedDict of the tensors, in order, tensor i's storage under key
// "i" of `archive` ("<archive>/data/<i>").
std::string torch_pickle(const std::vector<Tensor>& tensors);

// One stored (uncompressed) entry of a zip archive, its data aligned to 64 bytes as torch.save aligns it.
struct ZipEntry {
  std::string name;
  std::uint64_t offset = 0;  // of its local header in the archive
  std::uint64_t size = 0;
  std::uint32_t crc32 = 0;
};
// The local header of an entry starting at `offset`, with the padding that aligns its data; sizes and CRC as
// given (the writer streams the data, then writes the header again with the CRC it computed). Zip64 fields where
// a size or offset needs them.
std::string zip_local_header(const ZipEntry& entry);
// The central directory and its end records, for entries written up to `directory_offset`.
std::string zip_directory(const std::vector<ZipEntry>& entries, std::uint64_t directory_offset);

}  // namespace ckpt::weights
