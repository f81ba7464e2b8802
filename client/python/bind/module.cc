// kvtier._kvtier: the extension module behind the Python package `kvtier`.
#include <nanobind/nanobind.h>

#include "bindings.h"
#include "convert.h"
#include "kvtier/logging.h"

NB_MODULE(_kvtier, m) {
  m.doc() = "kvtier client SDK (C++) bound with nanobind; import `kvtier`, not this module.";
  kvtier::LogToStderr("kvtier");  // the SDK's log lines, to stderr: stdout is the program's
  kvtier::python::RegisterExceptions(m);
  kvtier::python::BindResults(m);
  kvtier::python::BindClient(m);
  kvtier::python::BindAdmin(m);
  kvtier::python::BindLayerwise(m);
}
