// Data item frames and records (data_item.hpp, docs/streaming.md).
#include "diaspora/data_item.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <new>

#include "diaspora/error.hpp"

namespace diaspora::data {

namespace {

void put_u16(std::string& out, std::uint16_t v) {
  out += static_cast<char>(v >> 8);
  out += static_cast<char>(v & 0xff);
}

void put_u32(std::string& out, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out += static_cast<char>((v >> s) & 0xff);
}

void put_u64(std::string& out, std::uint64_t v) {
  for (int s = 56; s >= 0; s -= 8) out += static_cast<char>((v >> s) & 0xff);
}

std::uint64_t get_be(std::string_view b, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<std::size_t>(i)]);
  return v;
}

std::string header(FrameKind kind, std::uint64_t ref, std::uint32_t index, std::uint32_t count, std::size_t extra) {
  std::string out;
  out.reserve(kHeaderBytes + extra);
  out += kMagic;
  out += static_cast<char>(kDataFrameVersion);
  out += static_cast<char>(kind);
  put_u16(out, 0);
  put_u64(out, ref);
  put_u32(out, index);
  put_u32(out, count);
  return out;
}

std::string to_hex(const unsigned char* d, unsigned n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (unsigned i = 0; i < n; ++i) {
    out += kHex[d[i] >> 4];
    out += kHex[d[i] & 15];
  }
  return out;
}

}  // namespace

std::string encode_put(std::uint64_t seq, std::uint32_t index, std::uint32_t count, std::string_view payload) {
  std::string out = header(FrameKind::put, seq, index, count, payload.size());
  out += payload;
  return out;
}

std::string encode_delivered(std::string_view subscription_json, std::string_view topic, std::uint64_t offset,
                             std::uint32_t index, std::uint32_t count, std::string_view payload) {
  std::string out = header(FrameKind::delivered, offset, index, count, 4 + subscription_json.size() + topic.size() + payload.size());
  put_u16(out, static_cast<std::uint16_t>(subscription_json.size()));
  out += subscription_json;
  put_u16(out, static_cast<std::uint16_t>(topic.size()));
  out += topic;
  out += payload;
  return out;
}

std::string encode_stored(std::uint32_t index, std::uint32_t count, std::string_view payload) {
  std::string out = header(FrameKind::stored, 0, index, count, payload.size());
  out += payload;
  return out;
}

Decoded decode(std::string_view b) {
  Decoded d;
  if (b.size() < kHeaderBytes || !b.starts_with(kMagic)) {
    d.error = "not a data frame: a binary frame starts with the 24-byte header beginning \"DSPD\" (docs/streaming.md)";
    return d;
  }
  const auto version = static_cast<unsigned>(static_cast<unsigned char>(b[4]));
  if (version != kDataFrameVersion) {
    d.error = "data frame version " + std::to_string(version) + "; this side speaks version " +
              std::to_string(kDataFrameVersion) + " (upgrade the older of client and relay)";
    return d;
  }
  const auto kind = static_cast<unsigned>(static_cast<unsigned char>(b[5]));
  if (kind < 1 || kind > 3) {
    d.error = "data frame kind " + std::to_string(kind) + " is not 1 (put), 2 (delivered) or 3 (stored)";
    return d;
  }
  Chunk c;
  c.kind = static_cast<FrameKind>(kind);
  c.ref = get_be(b, 8, 8);
  c.index = static_cast<std::uint32_t>(get_be(b, 16, 4));
  c.count = static_cast<std::uint32_t>(get_be(b, 20, 4));
  if (c.index >= c.count) {
    d.error = "data frame chunk index " + std::to_string(c.index) + " is not below its count " + std::to_string(c.count);
    return d;
  }
  std::size_t at = kHeaderBytes;
  if (c.kind == FrameKind::delivered) {
    for (std::string_view* field : {&c.subscription, &c.topic}) {
      if (b.size() - at < 2) {
        d.error = "data frame ends inside its subscription id or topic";
        return d;
      }
      const auto n = static_cast<std::size_t>(get_be(b, at, 2));
      at += 2;
      if (b.size() - at < n) {
        d.error = "data frame ends inside its subscription id or topic";
        return d;
      }
      *field = b.substr(at, n);
      at += n;
    }
  }
  c.payload = b.substr(at);
  d.chunk = c;
  return d;
}

std::string item_uri(std::string_view topic, std::uint64_t offset) {
  return "diaspora://" + std::string(topic) + "/" + std::to_string(offset);
}

std::optional<ItemLocation> parse_item_uri(std::string_view uri) {
  constexpr std::string_view scheme = "diaspora://";
  if (!uri.starts_with(scheme)) return std::nullopt;
  uri.remove_prefix(scheme.size());
  const std::size_t slash = uri.find('/');
  if (slash == 0 || slash == std::string_view::npos) return std::nullopt;
  const std::string_view digits = uri.substr(slash + 1);
  if (digits.empty() || digits.size() > 19 || digits.find_first_not_of("0123456789") != std::string_view::npos)
    return std::nullopt;
  ItemLocation at{std::string(uri.substr(0, slash)), 0};
  for (char c : digits) at.offset = at.offset * 10 + static_cast<std::uint64_t>(c - '0');
  return at;
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 h;
  h.update(bytes);
  return h.hex();
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_) throw std::bad_alloc();
  if (EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
    throw Error("SHA-256 unavailable (OpenSSL)");
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::update(std::string_view bytes) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), bytes.data(), bytes.size());
}

std::string Sha256::hex() {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), d, &n);
  return to_hex(d, n);
}

}  // namespace diaspora::data
