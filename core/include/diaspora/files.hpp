// Durable file writes shared by the tools that must never leave a half-written file:
// certificates and secrets (core), checkpoints and results (diaspora-train).
#pragma once

#include <filesystem>
#include <string_view>

namespace diaspora {

/// Replaces `path` with `content` atomically and durably: writes `path`.tmp (created with
/// permission bits `mode`, so a secret is never briefly readable by others), fsyncs it,
/// renames it over `path` and fsyncs the directory. Readers see the old file or the new
/// one, never a mix; after a crash the rename is either complete or absent.
/// @throws diaspora::Error naming the file when it cannot be created, written, synced or
///         renamed (the .tmp is removed then).
/// @par Thread Safety
/// Reentrant; concurrent calls for the same `path` race on the shared .tmp name.
void write_file_atomic(const std::filesystem::path& path, std::string_view content, unsigned mode = 0644);

}  // namespace diaspora
