#pragma once
// MUNGE credentials: the payload of every event and privileged request, and the only uid the controller trusts.
// munged rejects a credential that is replayed, expired or made with another key.
#include <cstdint>
#include <string>

#include "ckpt/result.hpp"

namespace ckpt::controller {

struct MungePayload {
  std::string payload;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
};

// Encodes `payload` as the calling process's effective uid. `socket` empty: libmunge's default socket.
Result<std::string> munge_encode_payload(const std::string& payload, const std::string& socket);
// Decodes and checks a credential. The error says why ("credential replayed", "expired", ...).
Result<MungePayload> munge_decode_credential(const std::string& credential, const std::string& socket);

}  // namespace ckpt::controller
