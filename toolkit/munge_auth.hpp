#pragma once
// MUNGE credentials: the payload of every event and privileged request, and the only uid the controller trusts.
// munged rejects a credential that is replayed, expired or made with another key.
#include <cctype>
#include <cstdint>
#include <string>

#include "ckpt/result.hpp"

namespace ckpt::toolkit {

struct MungePayload {
  std::string payload;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
};

// Encodes `payload` as the calling process's effective uid. `socket` empty: libmunge's default socket.
Result<std::string> munge_encode_payload(const std::string& payload, const std::string& socket);
// Decodes and checks a credential. The error says why ("credential replayed", "expired", ...).
Result<MungePayload> munge_decode_credential(const std::string& credential, const std::string& socket);

// Reads (GET /v1/jobs, /v1/status, ...) say who asks with a MUNGE credential in this header whose payload is
// "GET <path>": the controller shows each user only their own jobs.
inline constexpr const char* kCredentialHeader = "X-Ckpt-Credential";
inline std::string read_credential_payload(const std::string& path) { return "GET " + path; }
// A header's name as the header maps hold it (the server's request heads, HttpResponse::headers): lower case.
inline std::string header_key(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

// The controller's answer to such a read carries, in this header, a MUNGE credential of its own (made as root or
// SlurmUser) whose payload binds it to that request's credential and to the answer's body: a process that took the
// controller's port on a node can neither answer for it nor reuse one of its answers.
inline constexpr const char* kReplyCredentialHeader = "X-Ckpt-Reply-Credential";
// "REPLY <sha256 of the request's credential> <sha256 of the body>", hex.
std::string reply_credential_payload(const std::string& request_credential, const std::string& body);
// Whether `reply_credential` is the controller's answer to `request_credential` with `body`: it decodes, was made
// by uid 0 or `slurm_user_uid`, and its payload is reply_credential_payload(...). The error says which failed.
Status check_reply_credential(const std::string& reply_credential, const std::string& request_credential,
                              const std::string& body, std::uint32_t slurm_user_uid, const std::string& socket);

}  // namespace ckpt::toolkit
