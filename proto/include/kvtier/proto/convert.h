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

}  // namespace kvtier
