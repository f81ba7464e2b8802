// Conversions between Python objects and the client SDK's types, shared by the bindings.
//
// Errors cross into Python as exceptions: a non-OK kvtier::Status thrown as StatusError is
// raised as the kvtier exception of its code (kvtier.InvalidArgument, ...; module.cc
// registers the translation). Caller errors found here (a token array of the wrong dtype, a
// read-only output buffer) are INVALID_ARGUMENT and name the argument.
//
// Every function here needs the GIL.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/status.h"

namespace kvtier::python {

namespace nb = nanobind;

// A non-OK Status on its way to Python.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(Status status)
      : std::runtime_error(status.message()), status_(std::move(status)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

// Throws StatusError when `status` is not OK.
void ThrowIfError(const Status& status);

// The value of `result`, or throws its Status.
template <typename T>
T ValueOrThrow(Result<T> result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).value();
}

// Registers the translation of StatusError into the class of its code in kvtier.errors
// (kvtier.InvalidArgument, ...; imported from there).
void RegisterExceptions(nb::module_& m);

// Token ids from a list or tuple of ints, or a 1-D int32/int64 array on the CPU (numpy,
// torch, anything with the buffer protocol or DLPack), copied without a Python loop.
// Errors: INVALID_ARGUMENT naming `what` (another type or dtype, more than one dimension,
// a device array, a value outside int32).
std::vector<int32_t> TokensFrom(nb::handle obj, const char* what = "tokens");

// A C-contiguous CPU buffer's bytes (numpy arrays, torch CPU tensors, bytes, bytearray,
// memoryview). `writable`: the buffer must accept writes (a read-only one is refused).
// The span is valid while `holder` lives. Errors: INVALID_ARGUMENT naming `what`.
std::span<std::byte> BytesOf(nb::handle obj, bool writable, const char* what, nb::object* holder);

// kvtier's KV dtype name ("fp16", "bf16", "fp32", "fp8_e4m3", "fp8_e5m2", "int8") from
// that name, a torch dtype (torch.float16), a numpy dtype or its name ("float16").
// Errors: INVALID_ARGUMENT listing the accepted names.
std::string KvDtypeFrom(nb::handle obj);

// A non-negative Python int as an index or count. Errors: INVALID_ARGUMENT naming `what`.
size_t IndexFrom(int64_t value, const char* what);
// A Python int for a uint32 field: InvalidArgument naming `what` when it is
// negative or past 4,294,967,295 (nanobind raised a bare TypeError; it still
// does for an int outside int64, before this runs).
uint32_t U32From(int64_t value, const char* what);

// "best_effort", "wait_complete", "timeout" and back. Errors: INVALID_ARGUMENT.
PrefetchPolicy PrefetchPolicyFrom(const std::string& name);
const char* PrefetchPolicyName(PrefetchPolicy policy);

// Makes `cls` a context manager: `with` returns the object itself and `on_exit(T&)` runs on
// leaving the block (with the GIL released), whatever the exception.
template <typename T, typename OnExit>
void DefContextManager(nb::class_<T>& cls, OnExit on_exit) {
  cls.def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def(
          "__exit__",
          [on_exit](T& obj, nb::handle, nb::handle, nb::handle) {
            nb::gil_scoped_release release;
            on_exit(obj);
          },
          nb::arg("exc_type").none(), nb::arg("exc").none(), nb::arg("tb").none());
}

// The Status as the `fail_open` field of a result: None when OK, else "CODE: message".
nb::object FailOpenOf(const Status& status);

}  // namespace kvtier::python
