// The parts of the kvtier._kvtier module, each defined in its own bind_*.cc.
#pragma once

#include <nanobind/nanobind.h>

namespace kvtier::python {

namespace nb = nanobind;

void BindResults(nb::module_& m);    // Namespace, results, tickets, leases, reservations
void BindClient(nb::module_& m);     // Client
void BindAdmin(nb::module_& m);      // AdminClient
void BindLayerwise(nb::module_& m);  // Runtime, Stream, GpuArena, PagedKvCache, loader, storer

}  // namespace kvtier::python
