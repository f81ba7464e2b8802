// The parts of the kvtier._kvtier module, each defined in its own bind_*.cc.
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

#include "kvtier/client.h"

namespace kvtier::python {

namespace nb = nanobind;

// kvtier.ChunkReservation: the SDK's reservation and which of its chunks were written, so
// that commit() never publishes a slot holding stale bytes.
struct PyReservation {
  explicit PyReservation(ChunkReservation reservation)
      : r(std::move(reservation)), written(r.size(), false) {}
  ChunkReservation r;
  std::vector<bool> written;
};

void BindResults(nb::module_& m);    // Namespace, results, tickets, leases, reservations
void BindClient(nb::module_& m);     // Client
void BindAdmin(nb::module_& m);      // AdminClient
void BindLayerwise(nb::module_& m);  // Runtime, Stream, GpuArena, PagedKvCache, loader, storer

}  // namespace kvtier::python
