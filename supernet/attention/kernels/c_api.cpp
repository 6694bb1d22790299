// The kernels (window_attention.cpp) as a C library, for a caller without torch: scripts and tests load it with
// ctypes (the parity check of the Neon build under emulated aarch64, whose Python has numpy and no torch).  One entry,
// nas_call(name, args): the kernel `name` with the positional arguments the torch extension takes (torch_module.cpp),
// each an array, an integer, a real or a list of integers.  Serial (one thread).
#include <cstring>
#include <string>

#include "window_attention.h"

extern "C" {

struct nas_arg {
  int32_t kind;  // 0 array, 1 integer (or bool), 2 real, 3 list of integers
  int32_t dtype;  // arrays: 0 float32, 1 int64
  void* data;
  int64_t ndim;
  int64_t sizes[4];
  int64_t strides[4];
  int64_t integer;
  double real;
  const int64_t* list;
  int64_t count;
};

const char* nas_isa() { return nas::isa(); }

int nas_call(const char* name, const nas_arg* args, int64_t nargs, char* err, int64_t errlen);

}  // extern "C"

namespace {

struct Args {
  const nas_arg* a;
  int64_t n;
  const nas_arg& at(int64_t i, int32_t kind) const {
    nas::check(i < n, "nas_call: too few arguments");
    nas::check(a[i].kind == kind, "nas_call: argument ", i, " is of kind ", a[i].kind, ", expected ", kind);
    return a[i];
  }
  nas::Arr arr(int64_t i) const {
    const nas_arg& x = at(i, 0);
    nas::check(x.ndim >= 0 && x.ndim <= 4, "nas_call: argument ", i, ": at most 4 dimensions");
    nas::Arr r;
    r.data = x.data;
    r.ndim = x.ndim;
    for (int64_t d = 0; d < x.ndim; ++d) {
      r.sizes[d] = x.sizes[d];
      r.strides[d] = x.strides[d];
    }
    r.dtype = x.dtype == 0 ? nas::DType::Float32 : x.dtype == 1 ? nas::DType::Int64 : nas::DType::Other;
    return r;
  }
  int64_t i(int64_t k) const { return at(k, 1).integer; }
  double d(int64_t k) const { return at(k, 2).real; }
  std::vector<int64_t> list(int64_t k) const {
    const nas_arg& x = at(k, 3);
    return std::vector<int64_t>(x.list, x.list + x.count);
  }
  void arity(int64_t want) const { nas::check(n == want, "nas_call: ", want, " arguments expected, got ", n); }
};

void call(const std::string& name, const Args& a) {
  if (name == "window_forward") {
    a.arity(14);
    nas::window_forward(a.arr(0), a.arr(1), a.arr(2), a.arr(3), a.arr(4), a.i(5), a.i(6), a.i(7), a.i(8), a.arr(9), a.i(10),
                        a.i(11), a.i(12), a.i(13));
  } else if (name == "window_backward") {
    a.arity(19);
    nas::window_backward(a.arr(0), a.arr(1), a.arr(2), a.arr(3), a.arr(4), a.arr(5), a.arr(6), a.arr(7), a.i(8), a.i(9),
                         a.i(10), a.i(11), a.arr(12), a.i(13), a.i(14), a.i(15), a.i(16), a.arr(17), a.i(18) != 0);
  } else if (name == "linear_forward") {
    a.arity(11);
    nas::linear_forward(a.arr(0), a.arr(1), a.arr(2), a.arr(3), a.i(4), a.i(5) != 0, a.d(6), a.d(7), a.i(8) != 0, a.arr(9),
                        a.arr(10));
  } else if (name == "linear_backward") {
    a.arity(10);
    nas::linear_backward(a.arr(0), a.arr(1), a.arr(2), a.arr(3), a.arr(4), a.arr(5), a.arr(6), a.arr(7), a.arr(8), a.i(9) != 0);
  } else if (name == "dwconv_forward") {
    a.arity(4);
    nas::dwconv_forward(a.arr(0), a.arr(1), a.arr(2), a.list(3));
  } else if (name == "hydra_forward") {
    a.arity(6);
    nas::hydra_forward(a.arr(0), a.arr(1), a.arr(2), a.arr(3), a.i(4) != 0, a.d(5));
  } else {
    throw nas::Error("nas_call: no kernel named " + name);
  }
}

}  // namespace

int nas_call(const char* name, const nas_arg* args, int64_t nargs, char* err, int64_t errlen) {
  try {
    call(name, Args{args, nargs});
    return 0;
  } catch (const std::exception& e) {
    if (err && errlen > 0) {
      std::strncpy(err, e.what(), errlen - 1);
      err[errlen - 1] = 0;
    }
    return 1;
  }
}
