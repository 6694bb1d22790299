// The torch extension of the kernels (window_attention.cpp): tensors in, the kernels' arrays out, torch's thread pool
// for their (batch, head) tasks.  Built by supernet/attention/native.py (torch.utils.cpp_extension) for one
// instruction set; a failed check is a RuntimeError with the kernel's reason.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "window_attention.h"

namespace {

nas::Arr arr(const at::Tensor& t) {
  TORCH_CHECK(t.dim() <= 4, "compiled kernels: at most 4 dimensions, got ", t.dim());
  nas::Arr a;
  a.data = t.data_ptr();
  a.ndim = t.dim();
  for (int64_t i = 0; i < a.ndim; ++i) {
    a.sizes[i] = t.size(i);
    a.strides[i] = t.stride(i);
  }
  a.dtype = t.scalar_type() == at::kFloat ? nas::DType::Float32 : t.scalar_type() == at::kLong ? nas::DType::Int64 : nas::DType::Other;
  a.cpu = t.device().is_cpu();
  return a;
}

void torch_parallel(int64_t n, const std::function<void(int64_t, int64_t)>& body) { at::parallel_for(0, n, 1, body); }

using T = const at::Tensor&;

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  nas::set_parallel(torch_parallel);
  m.def("isa", [] { return std::string(nas::isa()); }, "the instruction set this build's vectors use");
  m.def("window_forward",
        [](T q, T k, T v, T out, T lse, int64_t before, int64_t after, int64_t globals, int64_t global_after, T picks,
           int64_t width, int64_t blocks, int64_t columns, int64_t step) {
          nas::window_forward(arr(q), arr(k), arr(v), arr(out), arr(lse), before, after, globals, global_after, arr(picks),
                              width, blocks, columns, step);
        },
        "fused sliding-window attention with global keys (float32)");
  m.def("window_backward",
        [](T q, T k, T v, T lse, T dout, T dq, T dk, T dv, int64_t before, int64_t after, int64_t globals,
           int64_t global_after, T picks, int64_t width, int64_t blocks, int64_t columns, int64_t step, T delta,
           bool accumulate) {
          nas::window_backward(arr(q), arr(k), arr(v), arr(lse), arr(dout), arr(dq), arr(dk), arr(dv), before, after, globals,
                               global_after, arr(picks), width, blocks, columns, step, arr(delta), accumulate);
        },
        "its gradients");
  m.def("linear_forward",
        [](T q, T k, T v, T out, int64_t feature, bool normalize, double eps, double l1_eps, bool accumulate, T proj,
           T den_out) {
          nas::linear_forward(arr(q), arr(k), arr(v), arr(out), feature, normalize, eps, l1_eps, accumulate, arr(proj),
                              arr(den_out));
        },
        "causal kernelized (linear) attention with its feature map (float32)");
  m.def("linear_backward",
        [](T q, T k, T v, T g, T out, T den, T dq, T dk, T dv, bool normalize) {
          nas::linear_backward(arr(q), arr(k), arr(v), arr(g), arr(out), arr(den), arr(dq), arr(dk), arr(dv), normalize);
        },
        "its gradients, without a feature map");
  m.def("dwconv_forward",
        [](T x, T w, T out, std::vector<int64_t> offsets) { nas::dwconv_forward(arr(x), arr(w), arr(out), offsets); },
        "depthwise convolution along the tokens (float32)");
  m.def("hydra_forward",
        [](T q, T k, T v, T out, bool causal, double eps) { nas::hydra_forward(arr(q), arr(k), arr(v), arr(out), causal, eps); },
        "hydra attention, causal or bidirectional (float32)");
}
