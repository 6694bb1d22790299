// The kernels of window_attention.cpp, without torch: what each binding calls (torch_module.cpp: the torch extension;
// c_api.cpp: a C library for ctypes, the emulated-aarch64 parity check's; ort_ops.cpp: ONNX Runtime's custom operators).
// Arrays are a pointer, sizes and strides (in elements); a failed check throws nas::Error with the reason.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace nas {

enum class DType : int32_t { Float32 = 0, Int64 = 1, Other = 2 };

struct Arr {  // a CPU array of up to 4 dimensions (float32 or int64), any strides
  void* data = nullptr;
  int64_t ndim = 0;
  int64_t sizes[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};
  DType dtype = DType::Float32;
  bool cpu = true;

  int64_t dim() const { return ndim; }
  int64_t size(int64_t i) const { return sizes[i < 0 ? i + ndim : i]; }
  int64_t stride(int64_t i) const { return strides[i < 0 ? i + ndim : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t i = 0; i < ndim; ++i) n *= sizes[i];
    return n;
  }
  bool is_contiguous() const {
    int64_t want = 1;
    for (int64_t i = ndim - 1; i >= 0; --i) {
      if (sizes[i] != 1 && strides[i] != want) return false;
      want *= sizes[i];
    }
    return true;
  }
  bool same_sizes(const Arr& o) const {
    if (ndim != o.ndim) return false;
    for (int64_t i = 0; i < ndim; ++i) {
      if (sizes[i] != o.sizes[i]) return false;
    }
    return true;
  }
  float* f() const { return static_cast<float*>(data); }
  int64_t* i64() const { return static_cast<int64_t*>(data); }
};

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Parts>
inline void check(bool ok, const Parts&... parts) {
  if (ok) return;
  std::ostringstream s;
  (s << ... << parts);
  throw Error(s.str());
}

// How the kernels split their (batch, head) tasks over threads: body(begin, end) for ranges covering 0 .. n.  Serial
// unless a binding sets one (the torch extension: at::parallel_for).
using Parallel = void (*)(int64_t n, const std::function<void(int64_t, int64_t)>& body);
void set_parallel(Parallel parallel);

const char* isa();  // "avx512", "avx2" or "neon": what this build's vectors are

void window_forward(const Arr& q, const Arr& k, const Arr& v, const Arr& out, const Arr& lse, int64_t before, int64_t after,
                    int64_t globals, int64_t global_after, const Arr& picks, int64_t width, int64_t blocks, int64_t columns,
                    int64_t step);
void window_backward(const Arr& q, const Arr& k, const Arr& v, const Arr& lse, const Arr& dout, const Arr& dq, const Arr& dk,
                     const Arr& dv, int64_t before, int64_t after, int64_t globals, int64_t global_after, const Arr& picks,
                     int64_t width, int64_t blocks, int64_t columns, int64_t step, const Arr& delta, bool accumulate);
void linear_forward(const Arr& q, const Arr& k, const Arr& v, const Arr& out, int64_t feature, bool normalize, double eps,
                    double l1_eps, bool accumulate, const Arr& proj, const Arr& den_out);
void linear_backward(const Arr& q, const Arr& k, const Arr& v, const Arr& g, const Arr& out, const Arr& den, const Arr& dq,
                     const Arr& dk, const Arr& dv, bool normalize);
void dwconv_forward(const Arr& x, const Arr& w, const Arr& out, const std::vector<int64_t>& offsets);
void hydra_forward(const Arr& q, const Arr& k, const Arr& v, const Arr& out, bool causal, double eps);

}  // namespace nas
