#include "munge_auth.hpp"

#include <munge.h>
#include <openssl/evp.h>

#include <cstdio>
#include <cstdlib>

namespace ckpt::toolkit {

namespace {

struct Context {
  munge_ctx_t ctx = munge_ctx_create();
  ~Context() {
    if (ctx != nullptr) munge_ctx_destroy(ctx);
  }
  Context() = default;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
};

Status set_socket(munge_ctx_t ctx, const std::string& socket) {
  if (ctx == nullptr) return Status::failure("cannot create a MUNGE context");
  if (!socket.empty() && munge_ctx_set(ctx, MUNGE_OPT_SOCKET, socket.c_str()) != EMUNGE_SUCCESS) {
    return Status::failure("cannot use MUNGE socket " + socket);
  }
  return Status::success();
}

}  // namespace

Result<std::string> munge_encode_payload(const std::string& payload, const std::string& socket) {
  Context c;
  if (auto s = set_socket(c.ctx, socket); !s) return Error{s.error()};
  char* cred = nullptr;
  munge_err_t err = munge_encode(&cred, c.ctx, payload.data(), static_cast<int>(payload.size()));
  if (err != EMUNGE_SUCCESS) {
    const char* why = munge_ctx_strerror(c.ctx);
    if (cred != nullptr) std::free(cred);
    return Error{std::string("MUNGE encode failed: ") + (why ? why : munge_strerror(err))};
  }
  std::string out(cred);
  std::free(cred);
  return out;
}

Result<MungePayload> munge_decode_credential(const std::string& credential, const std::string& socket) {
  Context c;
  if (auto s = set_socket(c.ctx, socket); !s) return Error{s.error()};
  void* buf = nullptr;
  int len = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  munge_err_t err = munge_decode(credential.c_str(), c.ctx, &buf, &len, &uid, &gid);
  if (err != EMUNGE_SUCCESS) {
    if (buf != nullptr) std::free(buf);
    return Error{std::string("MUNGE credential rejected: ") + munge_strerror(err)};
  }
  MungePayload out;
  if (buf != nullptr && len > 0) out.payload.assign(static_cast<const char*>(buf), static_cast<std::size_t>(len));
  if (buf != nullptr) std::free(buf);
  out.uid = uid;
  out.gid = gid;
  return out;
}

namespace {

std::string sha256_hex(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr) != 1) return {};
  std::string out;
  char buf[3];
  for (unsigned int i = 0; i < len; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", digest[i]);
    out += buf;
  }
  return out;
}

}  // namespace

std::string reply_credential_payload(const std::string& request_credential, const std::string& body) {
  return "REPLY " + sha256_hex(request_credential) + " " + sha256_hex(body);
}

Status check_reply_credential(const std::string& reply_credential, const std::string& request_credential,
                              const std::string& body, std::uint32_t slurm_user_uid, const std::string& socket) {
  if (reply_credential.empty()) return Status::failure("the answer is not signed (no " + std::string(kReplyCredentialHeader) + ")");
  auto decoded = munge_decode_credential(reply_credential, socket);
  if (!decoded) return Status::failure("the answer's signature: " + decoded.error());
  if (decoded->uid != 0 && decoded->uid != slurm_user_uid) {
    return Status::failure("the answer was signed by uid " + std::to_string(decoded->uid) +
                           ", not by the controller (root or SlurmUser)");
  }
  if (decoded->payload != reply_credential_payload(request_credential, body)) {
    return Status::failure("the answer's signature was made for another request or body");
  }
  return Status::success();
}

}  // namespace ckpt::toolkit
