// Rehearsal config files: YAML -> JSON (core), schema validation, then the structs.
// No LibTorch here, so this translation unit stays cheap to compile.
#include <boost/json.hpp>

#include <fstream>
#include <sstream>

#include "diaspora/rehearsal_config.hpp"

namespace diaspora::rehearsal {
namespace json = boost::json;

namespace {

Location locate(const YamlDocument& doc, const std::string& path) {
  auto it = doc.value_locations.find(path);
  return it != doc.value_locations.end() ? it->second : Location{1, 1};
}

std::uint64_t as_u64(const json::value& v) {
  if (v.is_uint64()) return v.as_uint64();
  return static_cast<std::uint64_t>(v.as_int64());  // the schema has checked minimum 0
}

}  // namespace

RehearsalConfig load_config_string(std::string_view yaml, std::string_view name) {
  const std::string file(name);
  YamlDocument doc = parse_yaml(yaml, file);
  std::vector<Diagnostic> diags = validate_yaml(doc, "rehearsal.schema.json", file);
  if (!diags.empty()) throw SpecError(std::move(diags));

  RehearsalConfig c;
  const json::object& root = doc.root.as_object();
  auto fail = [&](const std::string& path, std::string msg) {
    Location l = locate(doc, path);
    diags.push_back({file, l.line, l.column, path, std::move(msg)});
  };

  if (const auto* b = root.if_contains("buffer")) {
    const json::object& o = b->as_object();
    if (const auto* v = o.if_contains("memory")) {
      auto bytes = parse_size(*v);
      if (!bytes || *bytes == 0) fail("buffer.memory", "must be at least 1 byte");
      else c.buffer.memory_bytes = *bytes;
    }
    if (const auto* v = o.if_contains("max_samples")) c.buffer.max_samples = as_u64(*v);
    if (const auto* v = o.if_contains("class_balanced")) c.buffer.class_balanced = v->as_bool();
    if (const auto* v = o.if_contains("label_tensor")) c.buffer.label_tensor = static_cast<int>(v->as_int64());
    if (const auto* v = o.if_contains("seed")) c.buffer.seed = as_u64(*v);
  }
  if (const auto* s = root.if_contains("insertion")) {
    const json::object& o = s->as_object();
    if (const auto* v = o.if_contains("queue_batches")) c.insertion.queue_batches = static_cast<std::size_t>(as_u64(*v));
  }
  if (const auto* s = root.if_contains("sampling")) {
    const json::object& o = s->as_object();
    if (const auto* v = o.if_contains("representatives")) c.sampling.representatives = v->as_int64();
    if (const auto* v = o.if_contains("seed")) c.sampling.seed = as_u64(*v);
    if (const auto* v = o.if_contains("prefetch")) c.sampling.prefetch = v->as_bool();
    if (const auto* v = o.if_contains("backend")) c.sampling.backend = std::string(v->as_string());
    if (const auto* v = o.if_contains("comm_device")) c.sampling.comm_device = std::string(v->as_string());
    if (const auto* v = o.if_contains("timeout")) {
      auto d = parse_duration(v->as_string());
      if (!d || d->count() < 0.001) fail("sampling.timeout", "must be at least 1ms");
      else c.sampling.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(d->count() * 1000.0));
    }
    const bool cuda = c.sampling.comm_device.rfind("cuda", 0) == 0;
    if (c.sampling.backend == "nccl" && !cuda)
      fail(o.contains("comm_device") ? "sampling.comm_device" : "sampling.backend",
           "backend nccl needs comm_device cuda (or cuda:N)");
    if (c.sampling.backend == "gloo" && cuda)
      fail("sampling.comm_device", "backend gloo communicates from the CPU: use comm_device cpu, or backend nccl");
  }
  if (!diags.empty()) throw SpecError(std::move(diags));
  return c;
}

RehearsalConfig load_config_file(const std::filesystem::path& file) {
  constexpr std::uintmax_t kMaxConfigBytes = 1u << 20;
  const std::string name = file.string();
  auto fail = [&](std::string msg) -> RehearsalConfig {
    throw SpecError(std::vector<Diagnostic>{{name, 0, 0, "", std::move(msg)}});
  };
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return fail("no such file");
  if (std::filesystem::is_directory(file, ec)) return fail("is a directory; give a rehearsal config file (.yaml)");
  auto size = std::filesystem::file_size(file, ec);
  if (ec) return fail("cannot read: " + ec.message());
  if (size > kMaxConfigBytes) return fail("larger than 1 MiB; not a rehearsal config");
  std::ifstream in(file, std::ios::binary);
  if (!in) return fail("cannot open for reading");
  std::stringstream buf;
  buf << in.rdbuf();
  return load_config_string(buf.str(), name);
}

}  // namespace diaspora::rehearsal
