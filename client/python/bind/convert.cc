#include "convert.h"

#include <Python.h>
#include <nanobind/stl/string.h>

#include <array>
#include <cstring>
#include <limits>
#include <utility>

namespace kvtier::python {
namespace {

// kvtier.errors.BY_CODE (status code name -> exception class), imported once.
PyObject* g_by_code = nullptr;
PyObject* g_error_base = nullptr;

}  // namespace

void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}

void RegisterExceptions(nb::module_& m) {
  (void)m;
  nb::module_ errors = nb::module_::import_("kvtier.errors");
  g_by_code = errors.attr("BY_CODE").inc_ref().ptr();
  g_error_base = errors.attr("Error").inc_ref().ptr();
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const std::string code(StatusCodeName(e.status().code()));
      PyObject* cls = PyDict_GetItemString(g_by_code, code.c_str());  // borrowed
      PyErr_SetString(cls != nullptr ? cls : g_error_base, e.status().message().c_str());
    }
  });
}

std::vector<int32_t> TokensFrom(nb::handle obj, const char* what) {
  auto bad = [&](const std::string& why) {
    return StatusError(Status::InvalidArgument(std::string(what) + ": " + why));
  };
  std::vector<int32_t> out;
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(obj.ptr());
    PyObject** items = PySequence_Fast_ITEMS(obj.ptr());
    out.resize(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      // Any integer (int, numpy integers, 0-d int tensors), never a float.
      nb::object index = nb::steal(PyNumber_Index(items[i]));
      if (!index.is_valid()) {
        PyErr_Clear();
        throw bad("item " + std::to_string(i) + " is not an int");
      }
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
      if (overflow != 0 || v < std::numeric_limits<int32_t>::min() ||
          v > std::numeric_limits<int32_t>::max()) {
        throw bad("item " + std::to_string(i) + " is outside int32");
      }
      out[static_cast<size_t>(i)] = static_cast<int32_t>(v);
    }
    return out;
  }
  nb::ndarray<nb::ro> arr;
  if (!nb::try_cast(obj, arr, /*convert=*/false)) {
    throw bad("expected a list of ints or a 1-D int32/int64 array, got " +
              std::string(nb::type_name(obj.type()).c_str()));
  }
  if (arr.device_type() != nb::device::cpu::value) {
    throw bad("the array is on a device; pass token ids on the CPU");
  }
  if (arr.ndim() != 1) throw bad("expected 1 dimension, got " + std::to_string(arr.ndim()));
  const nb::dlpack::dtype dt = arr.dtype();
  const bool is_int = dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int);
  if (!is_int || (dt.bits != 32 && dt.bits != 64) || dt.lanes != 1) {
    throw bad("expected dtype int32 or int64");
  }
  const size_t n = arr.shape(0);
  const int64_t stride = arr.stride(0);
  out.resize(n);
  const auto* base = static_cast<const std::byte*>(arr.data());
  for (size_t i = 0; i < n; ++i) {
    const std::byte* p = base + static_cast<int64_t>(i) * stride * (dt.bits / 8);
    if (dt.bits == 32) {
      std::memcpy(&out[i], p, 4);
    } else {
      int64_t v;
      std::memcpy(&v, p, 8);
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
        throw bad("item " + std::to_string(i) + " is outside int32");
      }
      out[i] = static_cast<int32_t>(v);
    }
  }
  return out;
}

std::span<std::byte> BytesOf(nb::handle obj, bool writable, const char* what, nb::object* holder) {
  auto bad = [&](const std::string& why) {
    return StatusError(Status::InvalidArgument(std::string(what) + ": " + why));
  };
  // The buffer protocol first: it says whether the buffer is read-only. The memoryview
  // holds the export, so the buffer cannot be resized or freed while `holder` lives.
  if (PyObject_CheckBuffer(obj.ptr())) {
    nb::object view = nb::steal(PyMemoryView_FromObject(obj.ptr()));
    if (!view.is_valid()) {
      PyErr_Clear();
      throw bad("its buffer cannot be read");
    }
    Py_buffer* buf = PyMemoryView_GET_BUFFER(view.ptr());
    if (writable && buf->readonly) throw bad("expected a writable buffer, got a read-only one");
    if (!PyBuffer_IsContiguous(buf, 'C')) throw bad("expected a C-contiguous buffer");
    *holder = view;
    return {static_cast<std::byte*>(buf->buf), static_cast<size_t>(buf->len)};
  }
  // DLPack (torch tensors): CPU, C-contiguous.
  nb::ndarray<> arr;
  bool got = writable ? nb::try_cast(obj, arr, false) : false;
  nb::ndarray<nb::ro> ro;
  if (!writable) got = nb::try_cast(obj, ro, false);
  if (!got) {
    throw bad(std::string("expected a ") + (writable ? "writable " : "") +
              "CPU buffer (numpy array, torch CPU tensor, bytearray), got " +
              nb::type_name(obj.type()).c_str());
  }
  const size_t ndim = writable ? arr.ndim() : ro.ndim();
  const int32_t device = writable ? arr.device_type() : ro.device_type();
  if (device != nb::device::cpu::value) throw bad("the tensor is on a device, not the CPU");
  size_t expected = 1;
  for (size_t d = ndim; d-- > 0;) {
    const size_t extent = writable ? arr.shape(d) : ro.shape(d);
    const int64_t stride = writable ? arr.stride(d) : ro.stride(d);
    if (extent > 1 && stride != static_cast<int64_t>(expected)) {
      throw bad("expected a C-contiguous tensor");
    }
    expected *= extent;
  }
  const size_t nbytes = writable ? arr.nbytes() : ro.nbytes();
  void* data = writable ? arr.data() : const_cast<void*>(ro.data());
  *holder = nb::borrow(obj);
  return {static_cast<std::byte*>(data), nbytes};
}

std::string KvDtypeFrom(nb::handle obj) {
  std::string name;
  if (nb::isinstance<nb::str>(obj)) {
    name = nb::cast<std::string>(obj);
  } else if (nb::hasattr(obj, "name") && nb::isinstance<nb::str>(obj.attr("name"))) {
    name = nb::cast<std::string>(obj.attr("name"));  // numpy dtype
  } else if (nb::hasattr(obj, "__name__") && nb::isinstance<nb::str>(obj.attr("__name__"))) {
    name = nb::cast<std::string>(obj.attr("__name__"));  // numpy scalar type (np.float16)
  } else {
    name = nb::cast<std::string>(nb::str(obj));  // torch.float16
  }
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  static const std::pair<const char*, const char*> kNames[] = {
      {"fp16", "fp16"},
      {"float16", "fp16"},
      {"half", "fp16"},
      {"bf16", "bf16"},
      {"bfloat16", "bf16"},
      {"fp32", "fp32"},
      {"float32", "fp32"},
      {"float", "fp32"},
      {"fp8_e4m3", "fp8_e4m3"},
      {"float8_e4m3fn", "fp8_e4m3"},
      {"fp8", "fp8_e4m3"},
      {"fp8_e5m2", "fp8_e5m2"},
      {"float8_e5m2", "fp8_e5m2"},
      {"int8", "int8"},
      {"fp8_e4m3fn", "fp8_e4m3"},
  };
  for (const auto& [from, to] : kNames) {
    if (name == from) return to;
  }
  throw StatusError(Status::InvalidArgument(
      "kv_dtype: unknown dtype '" + name +
      "'; expected fp16/float16, bf16/bfloat16, fp32/float32, fp8_e4m3/float8_e4m3fn/fp8, "
      "fp8_e5m2/float8_e5m2 or int8 (a name, a torch dtype or a numpy dtype)"));
}

size_t IndexFrom(int64_t value, const char* what) {
  if (value < 0) {
    throw StatusError(
        Status::InvalidArgument(std::string(what) + ": " + std::to_string(value) + " is negative"));
  }
  return static_cast<size_t>(value);
}

uint32_t U32From(int64_t value, const char* what) {
  if (value > int64_t{UINT32_MAX}) {
    throw StatusError(Status::InvalidArgument(std::string(what) + ": " + std::to_string(value) +
                                              " is more than 4294967295"));
  }
  return static_cast<uint32_t>(IndexFrom(value, what));
}

PrefetchPolicy PrefetchPolicyFrom(const std::string& name) {
  if (name == "best_effort") return PrefetchPolicy::kBestEffort;
  if (name == "wait_complete") return PrefetchPolicy::kWaitComplete;
  if (name == "timeout") return PrefetchPolicy::kTimeout;
  throw StatusError(Status::InvalidArgument("policy: '" + name +
                                            "' is not one of best_effort, wait_complete, timeout"));
}

const char* PrefetchPolicyName(PrefetchPolicy policy) {
  switch (policy) {
    case PrefetchPolicy::kBestEffort:
      return "best_effort";
    case PrefetchPolicy::kWaitComplete:
      return "wait_complete";
    case PrefetchPolicy::kTimeout:
      return "timeout";
  }
  return "unknown";
}

nb::object FailOpenOf(const Status& status) {
  if (status.ok()) return nb::none();
  return nb::str(status.ToString().c_str());
}

}  // namespace kvtier::python
