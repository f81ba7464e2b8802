// Conversions between kvtier types and their wire messages (one place).
#pragma once

#include <optional>
#include <string>

#include "kvtier/chunk_key.h"
#include "kvtier/namespace_spec.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier {

v1::NamespaceSpec ToProto(const NamespaceSpec& spec);
NamespaceSpec FromProto(const v1::NamespaceSpec& spec);

// A 16-byte wire id, or nullopt when `bytes` is not exactly 16 bytes long.
std::optional<ChunkKey> KeyFromWire(const std::string& bytes);

}  // namespace kvtier
