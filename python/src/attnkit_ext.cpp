// SPDX-License-Identifier: Apache-2.0
// nanobind module attnkit._ext: declarations and argument conversion only. The Python API with
// its docstrings is python/attnkit/*.py; checks and computation live in the C++ library.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#if defined(__GLIBCXX__)
#include <cxxabi.h>  // abi::__forced_unwind
#endif

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "attnkit/attnkit.hpp"
#include "baselines.hpp"

namespace nb = nanobind;
using attnkit::DType;
using attnkit::TensorView;

namespace {

/// Releases the GIL for a computation and takes it back after, as nb::gil_scoped_release does,
/// except when the interpreter finalizes meanwhile. Before Python 3.14, a daemon thread that
/// waits for the GIL then is ended with pthread_exit, a forced unwind that std::terminate would
/// stop in this destructor (and nanobind's handlers would swallow, which aborts as well): the
/// process would abort at exit. Such a thread waits for the process to end instead, as Python
/// 3.14 makes it do; take_gil has released the GIL's locks before it exits a thread.
class GilReleased {
 public:
  GilReleased() : state_(PyEval_SaveThread()) {}
  ~GilReleased() {
#if defined(__GLIBCXX__)
    try {
      PyEval_RestoreThread(state_);
    } catch (abi::__forced_unwind&) {
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
#else
    PyEval_RestoreThread(state_);
#endif
  }
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;

 private:
  PyThreadState* state_;
};


// ---------------------------------------------------------------------------------------------
// Python objects -> TensorView
// ---------------------------------------------------------------------------------------------

/// A TensorView holds at most kMaxDims dimensions: checked before any is copied into it, on
/// what the import holds (a DLPack producer may export another shape than its `.shape` said).
void check_ndim(std::size_t ndim, const char* name) {
  if (ndim > static_cast<std::size_t>(attnkit::kMaxDims)) {
    throw attnkit::Error(attnkit::ErrorCode::kShape,
                         "topk: " + std::string(name) + " has " + std::to_string(ndim) +
                             " dimensions; at most " + std::to_string(attnkit::kMaxDims) +
                             " are supported");
  }
}

/// A "raw view" tuple (data_ptr, shape, strides_in_elements, dtype_code, device_type,
/// device_index), built by attnkit._arrays for NumPy arrays and torch tensors: cheaper than
/// DLPack and free of DLPack's stream handshake and requires_grad refusal.
TensorView view_from_tuple(const nb::tuple& t, const char* name) {
  TensorView v;
  v.data = reinterpret_cast<void*>(nb::cast<std::uintptr_t>(t[0]));
  const nb::tuple shape = nb::cast<nb::tuple>(t[1]);
  const nb::tuple strides = nb::cast<nb::tuple>(t[2]);
  check_ndim(shape.size(), name);
  if (strides.size() != shape.size()) {
    throw attnkit::Error(attnkit::ErrorCode::kShape,
                         std::string("topk: ") + name + " has " + std::to_string(shape.size()) +
                             " dimensions but " + std::to_string(strides.size()) +
                             " strides; its shape and strides disagree");
  }
  v.ndim = static_cast<std::int32_t>(shape.size());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = nb::cast<std::int64_t>(shape[static_cast<std::size_t>(d)]);
    v.strides[d] = nb::cast<std::int64_t>(strides[static_cast<std::size_t>(d)]);
  }
  v.dtype = static_cast<DType>(nb::cast<int>(t[3]));
  v.device.type = nb::cast<int>(t[4]) == 0 ? attnkit::DeviceType::kCPU : attnkit::DeviceType::kCUDA;
  v.device.index = nb::cast<int>(t[5]);
  return v;
}

DType dtype_from_nb(nb::dlpack::dtype d, const char* name) {
  using Code = nb::dlpack::dtype_code;
  if (d.lanes == 1) {
    const auto code = static_cast<Code>(d.code);
    if (code == Code::Float && d.bits == 32) return DType::kFloat32;
    if (code == Code::Bfloat && d.bits == 16) return DType::kBFloat16;
    if (code == Code::Float && d.bits == 16) return DType::kFloat16;
    if (code == Code::Float && d.bits == 64) return DType::kFloat64;
    if (code == Code::Int && d.bits == 32) return DType::kInt32;
    if (code == Code::Int && d.bits == 64) return DType::kInt64;
    if (code == Code::Int && d.bits == 8) return DType::kInt8;
    if (code == Code::Int && d.bits == 16) return DType::kInt16;
    if (code == Code::UInt && d.bits == 8) return DType::kUInt8;
    if (code == Code::UInt && d.bits == 16) return DType::kUInt16;
    if (code == Code::UInt && d.bits == 32) return DType::kUInt32;
    if (code == Code::UInt && d.bits == 64) return DType::kUInt64;
    if (code == Code::Bool) return DType::kBool;
  }
  throw attnkit::Error(attnkit::ErrorCode::kDType,
                       "topk: " + std::string(name) + " has DLPack dtype (code " +
                           std::to_string(d.code) + ", bits " + std::to_string(d.bits) +
                           ", lanes " + std::to_string(d.lanes) +
                           "), which attnkit does not take; expected float32, bfloat16 or "
                           "float16 data and int32 or int64 indices");
}

/// The DLPack tensors a call imported: each holds its producer's buffer (a capsule may own the
/// only reference to it), so they live until the call has returned. Destroyed with the GIL held.
struct Imports {
  std::vector<nb::ndarray<nb::ro>> inputs;
  std::vector<nb::ndarray<>> outputs;
};

template <class Array>
TensorView view_of(const Array& a, const char* name) {
  TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = dtype_from_nb(a.dtype(), name);
  if (a.device_type() == nb::device::cuda::value) {
    v.device = {attnkit::DeviceType::kCUDA, a.device_id()};
  } else if (a.device_type() == nb::device::cpu::value ||
             a.device_type() == nb::device::cuda_host::value) {
    v.device = {attnkit::DeviceType::kCPU, 0};
  } else {
    throw attnkit::Error(attnkit::ErrorCode::kDevice,
                         "topk: " + std::string(name) + " is on DLPack device type " +
                             std::to_string(a.device_type()) + "; expected CPU or CUDA");
  }
  check_ndim(a.ndim(), name);
  v.ndim = static_cast<std::int32_t>(a.ndim());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = static_cast<std::int64_t>(a.shape(static_cast<std::size_t>(d)));
    v.strides[d] = a.stride(static_cast<std::size_t>(d));
  }
  return v;
}

// The headers of DLPack's managed tensors (dlpack.h, ABI versions 0 and 1), as far as
// capsule_problem reads them before nanobind's import, which trusts ndim and shape.
struct ManagedTensor {
  nb::dlpack::dltensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor*);
};
struct ManagedTensorVersioned {
  std::uint32_t major, minor;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned*);
  std::uint64_t flags;
  nb::dlpack::dltensor dl_tensor;
};

/// obj.__dlpack__()'s capsule, asked for as nanobind's import asks: a versioned one first for
/// an output (its flags say whether it is writable), an unversioned one first for an input; the
/// other kind when the producer refuses with BufferError or TypeError. An output is asked for
/// with copy=False first (the array API's keyword), since a copy would take the results away;
/// a producer that refuses that call is asked as before, and a versioned export flagged as a
/// copy is refused (capsule_problem). Raises the producer's own error.
nb::object export_capsule(nb::handle obj, bool writable) {
  const nb::object dlpack = obj.attr("__dlpack__");
  auto call = [&](bool versioned) {
    return versioned ? dlpack(nb::arg("max_version") = nb::make_tuple(1, 1)) : dlpack();
  };
  if (writable) {
    try {
      return dlpack(nb::arg("max_version") = nb::make_tuple(1, 1), nb::arg("copy") = false);
    } catch (const nb::python_error& e) {
      // Without the keyword, or without versioned capsules: asked as before, below.
      if (!e.matches(PyExc_TypeError) && !e.matches(PyExc_BufferError) &&
          !e.matches(PyExc_ValueError)) {
        throw;
      }
    }
  }
  try {
    return call(writable);
  } catch (const nb::python_error& e) {
    if (!e.matches(PyExc_BufferError) && !e.matches(PyExc_TypeError)) throw;
  }
  return call(!writable);
}

/// Why `capsule` cannot be imported, or "" when its header is sound: a capsule of another
/// name (one already consumed, say), a DLPack major version other than 0 or 1, a negative ndim
/// or a null shape would otherwise be read as they are. More dimensions than attnkit takes
/// raise check_ndim's error for `name`, before the import reads them.
std::string capsule_problem(const nb::object& capsule, const char* name, bool writable,
                            bool& null_data) {
  if (!PyCapsule_CheckExact(capsule.ptr())) {
    return "its __dlpack__ returned " +
           nb::cast<std::string>(nb::str(capsule.type().attr("__name__"))) +
           ", not a DLPack capsule";
  }
  const char* cname = PyCapsule_GetName(capsule.ptr());
  const std::string label = cname == nullptr ? "" : cname;
  const nb::dlpack::dltensor* t = nullptr;
  if (label == "dltensor") {
    const auto* mt = static_cast<ManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), cname));
    if (mt != nullptr) t = &mt->dl_tensor;
  } else if (label == "dltensor_versioned") {
    const auto* mt =
        static_cast<ManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), cname));
    if (mt != nullptr && mt->major != 1) {
      return "its capsule is of DLPack version " + std::to_string(mt->major) + "." +
             std::to_string(mt->minor) + "; attnkit reads version 1 and unversioned capsules";
    }
    constexpr std::uint64_t kIsCopied = 1u << 1;  // DLPACK_FLAG_BITMASK_IS_COPIED
    if (mt != nullptr && writable && (mt->flags & kIsCopied) != 0) {
      return "its export is a copy (DLPack flag IS_COPIED), which the results would be written "
             "to instead of it";
    }
    if (mt != nullptr) t = &mt->dl_tensor;
  } else {
    return "its __dlpack__ returned a capsule named '" + label +
           "', not 'dltensor' or 'dltensor_versioned' (one already consumed?)";
  }
  if (t == nullptr) {
    PyErr_Clear();
    return "its capsule holds no tensor";
  }
  if (t->ndim < 0) return "its tensor has ndim = " + std::to_string(t->ndim);
  check_ndim(static_cast<std::size_t>(t->ndim), name);
  if (t->ndim > 0 && t->shape == nullptr) {
    return "its tensor has ndim = " + std::to_string(t->ndim) + " and a null shape";
  }
  // The import hands on null + byte_offset as the data pointer, which the checks' null test
  // would not see: the view takes null itself (as core's from_dlpack does).
  null_data = t->data == nullptr;
  return "";
}

/// Any DLPack producer's tensor (CuPy, JAX, ...), through nanobind: read-only ones are taken as
/// inputs (JAX exports its arrays so) and refused by name as outputs (`writable`). The capsule
/// is exported here and its header checked before nanobind imports it.
TensorView view_from_dlpack(nb::handle obj, const char* name, Imports& imports, bool writable) {
  auto not_dlpack = [&](const std::string& why) {
    return nb::type_error(("topk: " + std::string(name) + " (a " +
                           nb::cast<std::string>(nb::str(obj.type().attr("__name__"))) +
                           ") could not be read through DLPack: " + why +
                           "; pass a NumPy array or a torch tensor")
                              .c_str());
  };
  nb::object capsule;
  try {
    capsule = export_capsule(obj, writable);
  } catch (const nb::python_error& e) {
    // Python checked that obj's type has __dlpack__: the export itself failed.
    const std::string why = nb::cast<std::string>(nb::str(e.value()));
    throw not_dlpack("its __dlpack__ raised (" +
                     (why.empty() ? nb::cast<std::string>(nb::str(e.type().attr("__name__")))
                                  : why) +
                     ")");
  }
  bool null_data = false;
  if (const std::string why = capsule_problem(capsule, name, writable, null_data); !why.empty()) {
    throw not_dlpack(why);
  }
  auto import_as = [&](auto& array) {
    try {
      return nb::try_cast(capsule, array);
    } catch (const nb::python_error&) {
      return false;
    }
  };
  if (writable) {
    nb::ndarray<> a;
    if (!import_as(a)) {
      nb::ndarray<nb::ro> r;
      if (import_as(r)) {
        throw attnkit::Error(
            attnkit::ErrorCode::kValue,
            "topk: " + std::string(name) + " is read-only; outputs must be writable");
      }
      throw not_dlpack("its capsule could not be imported");
    }
    TensorView v = view_of(a, name);
    if (null_data) v.data = nullptr;
    imports.outputs.push_back(std::move(a));
    return v;
  }
  nb::ndarray<nb::ro> a;
  if (!import_as(a)) throw not_dlpack("its capsule could not be imported");
  TensorView v = view_of(a, name);
  if (null_data) v.data = nullptr;
  imports.inputs.push_back(std::move(a));
  return v;
}

TensorView to_view(nb::handle obj, const char* name, Imports& imports, bool writable = false) {
  if (nb::isinstance<nb::tuple>(obj)) return view_from_tuple(nb::borrow<nb::tuple>(obj), name);
  return view_from_dlpack(obj, name, imports, writable);
}

std::optional<TensorView> to_optional_view(nb::handle obj, const char* name, Imports& imports,
                                           bool writable = false) {
  if (obj.is_none()) return std::nullopt;
  return to_view(obj, name, imports, writable);
}

cudaStream_t as_stream(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// ---------------------------------------------------------------------------------------------
// topk
// ---------------------------------------------------------------------------------------------

/// The tensors of a call without its outputs (topk_check_inputs takes these alone).
attnkit::TopkTensors topk_inputs(nb::handle x, nb::handle begin, nb::handle end,
                                 nb::handle index_offset, Imports& imports) {
  attnkit::TopkTensors t;
  t.x = to_view(x, "x", imports);
  t.begin = to_optional_view(begin, "begin", imports);
  t.end = to_optional_view(end, "end", imports);
  t.index_offset = to_optional_view(index_offset, "index_offset", imports);
  return t;
}

attnkit::TopkTensors topk_tensors(nb::handle x, nb::handle out_indices, nb::handle out_values,
                                  nb::handle begin, nb::handle end, nb::handle index_offset,
                                  Imports& imports) {
  attnkit::TopkTensors t = topk_inputs(x, begin, end, index_offset, imports);
  t.out_indices = to_view(out_indices, "out_indices", imports, true);
  t.out_values = to_optional_view(out_values, "out_values", imports, true);
  return t;
}

attnkit::TopkOptions topk_options(std::int64_t k, bool largest, int sorted, int nan, int ties,
                                  std::int64_t index_fill, std::optional<double> value_fill,
                                  int check, int backend) {
  attnkit::TopkOptions o;
  o.k = k;
  o.largest = largest;
  o.sorted = static_cast<attnkit::TopkOrder>(sorted);
  o.nan = static_cast<attnkit::NanPolicy>(nan);
  o.ties = static_cast<attnkit::TiePolicy>(ties);
  o.index_fill = index_fill;
  o.value_fill = value_fill;
  o.check = static_cast<attnkit::CheckMode>(check);
  o.backend = static_cast<attnkit::TopkBackend>(backend);
  return o;
}

}  // namespace

NB_MODULE(_ext, m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const attnkit::Error& e) {
      switch (e.code()) {
        case attnkit::ErrorCode::kDType: PyErr_SetString(PyExc_TypeError, e.what()); break;
        case attnkit::ErrorCode::kDeviceFault:
        case attnkit::ErrorCode::kInternal: PyErr_SetString(PyExc_RuntimeError, e.what()); break;
        default: PyErr_SetString(PyExc_ValueError, e.what()); break;
      }
    }
  });

  m.def(
      "topk",
      [](nb::handle x, nb::handle out_indices, nb::handle out_values, nb::handle begin,
         nb::handle end, nb::handle index_offset, std::int64_t k, bool largest, int sorted,
         int nan, int ties, std::int64_t index_fill, std::optional<double> value_fill, int check,
         int backend, nb::handle workspace, std::uintptr_t stream) {
        Imports imports;  // outlives the release below: destroyed after the GIL is back
        const attnkit::TopkTensors t =
            topk_tensors(x, out_indices, out_values, begin, end, index_offset, imports);
        const attnkit::TopkOptions o =
            topk_options(k, largest, sorted, nan, ties, index_fill, value_fill, check, backend);
        // A callable allocates the scratch in the caller's framework, asked only when the
        // call needs any: one size query in C++ rather than a second call from Python.
        nb::object scratch;  // what the allocator returned, held until the launch is enqueued
        std::optional<TensorView> ws;
        if (PyCallable_Check(workspace.ptr())) {  // not None, nor a raw view's tuple
          const std::size_t need = attnkit::topk_workspace_size(t, o);
          if (need != 0) {
            scratch = workspace(need, t.x.device.index);
            ws = view_from_tuple(nb::cast<nb::tuple>(scratch[1]), "workspace");
          }
        } else {
          ws = to_optional_view(workspace, "workspace", imports, true);
        }
        const GilReleased released;
        if (ws) {
          std::size_t bytes = static_cast<std::size_t>(ws->numel());
          attnkit::topk(ws->data, bytes, t, o, as_stream(stream));
        } else {
          attnkit::topk(t, o, as_stream(stream));
        }
      },
      nb::arg("x"), nb::arg("out_indices"), nb::arg("out_values").none(),
      nb::arg("begin").none(), nb::arg("end").none(), nb::arg("index_offset").none(),
      nb::arg("k"), nb::arg("largest"), nb::arg("sorted"), nb::arg("nan"), nb::arg("ties"),
      nb::arg("index_fill"), nb::arg("value_fill").none(), nb::arg("check"), nb::arg("backend"),
      nb::arg("workspace").none(), nb::arg("stream"));

  m.def(
      "topk_workspace_size",
      [](nb::handle x, nb::handle out_indices, nb::handle out_values, nb::handle begin,
         nb::handle end, nb::handle index_offset, std::int64_t k, bool largest, int sorted,
         int nan, int ties, std::int64_t index_fill, std::optional<double> value_fill, int check,
         int backend) {
        Imports imports;
        return attnkit::topk_workspace_size(
            topk_tensors(x, out_indices, out_values, begin, end, index_offset, imports),
            topk_options(k, largest, sorted, nan, ties, index_fill, value_fill, check, backend));
      },
      nb::arg("x"), nb::arg("out_indices"), nb::arg("out_values").none(),
      nb::arg("begin").none(), nb::arg("end").none(), nb::arg("index_offset").none(),
      nb::arg("k"), nb::arg("largest"), nb::arg("sorted"), nb::arg("nan"), nb::arg("ties"),
      nb::arg("index_fill"), nb::arg("value_fill").none(), nb::arg("check"), nb::arg("backend"));

  m.def(
      "topk_check_inputs",
      [](nb::handle x, nb::handle begin, nb::handle end, nb::handle index_offset, std::int64_t k,
         bool largest, int sorted, int nan, int ties, std::int64_t index_fill,
         std::optional<double> value_fill, int check, int backend) {
        Imports imports;
        attnkit::topk_check_inputs(
            topk_inputs(x, begin, end, index_offset, imports),
            topk_options(k, largest, sorted, nan, ties, index_fill, value_fill, check, backend));
      },
      nb::arg("x"), nb::arg("begin").none(), nb::arg("end").none(),
      nb::arg("index_offset").none(), nb::arg("k"), nb::arg("largest"), nb::arg("sorted"),
      nb::arg("nan"), nb::arg("ties"), nb::arg("index_fill"), nb::arg("value_fill").none(),
      nb::arg("check"), nb::arg("backend"));

  // A NumPy array's data pointer and strides in elements, for its raw view: the buffer protocol
  // without a format gives both for any dtype (bfloat16 too) in a fraction of what
  // `a.ctypes.data` costs, which builds a ctypes object per call. The strides are None when
  // one is not a multiple of the itemsize, which Python reports with the array's name.
  m.def(
      "ndarray_data",
      [](nb::handle a) {
        Py_buffer view;
        if (PyObject_GetBuffer(a.ptr(), &view, PyBUF_STRIDES) != 0) throw nb::python_error();
        const auto data = reinterpret_cast<std::uintptr_t>(view.buf);
        const Py_ssize_t item = view.itemsize;
        const int ndim = view.ndim;
        if (ndim > attnkit::kMaxDims) {  // Python refuses these by name first
          PyBuffer_Release(&view);
          check_ndim(static_cast<std::size_t>(ndim), "array");
        }
        std::int64_t strides[attnkit::kMaxDims];
        bool whole = item > 0;
        for (int d = 0; whole && d < ndim; ++d) {
          whole = view.strides[d] % item == 0;
          strides[d] = view.strides[d] / item;
        }
        PyBuffer_Release(&view);
        if (!whole) return nb::make_tuple(data, nb::none());
        nb::object s = nb::steal(PyTuple_New(ndim));
        if (!s.is_valid()) throw nb::python_error();
        for (int d = 0; d < ndim; ++d) {
          PyObject* n = PyLong_FromLongLong(strides[d]);
          if (n == nullptr) throw nb::python_error();
          PyTuple_SetItem(s.ptr(), d, n);  // steals n
        }
        return nb::make_tuple(data, s);
      },
      nb::arg("a"));

  // The shape and dtype of a CPU producer that offers only __dlpack__, read by the same import
  // (and checks) as the call's own: NumPy's import cannot read every dtype (bfloat16).
  m.def(
      "dlpack_shape_dtype",
      [](nb::handle obj, const char* name) {
        Imports imports;
        const TensorView v = view_from_dlpack(obj, name, imports, false);
        nb::list shape;
        for (int d = 0; d < v.ndim; ++d) shape.append(v.shape[d]);
        return nb::make_tuple(nb::tuple(shape), static_cast<int>(v.dtype));
      },
      nb::arg("obj"), nb::arg("name"));
  m.def("num_threads", &attnkit::num_threads);
  m.def("set_num_threads", &attnkit::set_num_threads, nb::arg("n"));
  m.def("build_info", &attnkit::build_info);
  m.def("cuda_available_in_build", &attnkit::cuda_available_in_build);

  // Baselines for the demo and benchmarks (tools/baselines.hpp).
  m.def(
      "baseline_topk",
      [](nb::handle x, nb::handle out_indices, nb::handle out_values, std::int64_t k,
         const std::string& method, bool sort_values) {
        Imports imports;
        const TensorView xv = to_view(x, "x", imports);
        const TensorView iv = to_view(out_indices, "out_indices", imports, true);
        const TensorView vv = to_view(out_values, "out_values", imports, true);
        const GilReleased released;
        attnkit::tools::baseline_topk(xv, iv, vv, k, attnkit::tools::parse_baseline(method),
                                      sort_values);
      },
      nb::arg("x"), nb::arg("out_indices"), nb::arg("out_values"), nb::arg("k"),
      nb::arg("method"), nb::arg("sort_values"));
}
