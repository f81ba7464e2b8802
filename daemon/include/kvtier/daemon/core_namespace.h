// CoreNamespace: a namespace open in the daemon, as CacheCore and its parts
// (the NVMe writer, the promoter, the HBM copier) see it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvtier/namespace_spec.h"
#include "kvtier/slot_image.h"

namespace kvtier {

struct CoreNamespace {
  NamespaceSpec spec;
  NamespaceId id;
  SlotLayout layout;
  uint32_t ns_index = 0;             // the DRAM tier's namespace number
  uint32_t active_reservations = 0;  // reservations and reads holding a pointer to it
  uint32_t model = 0;                // CacheCore's index of spec.model_id (token counts)
};

// The open namespaces by DRAM namespace number (ns_index).
using CoreNamespaces = std::vector<std::unique_ptr<CoreNamespace>>;

}  // namespace kvtier
