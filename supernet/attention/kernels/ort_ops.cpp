// ONNX Runtime custom operators around the kernels (window_attention.cpp), domain "nas.kernels", version 1, CPU:
//
//   WindowAttention(q, k, v) -> y   ints before, after, globals, global_after, blocks, columns, step (window_forward's
//                                    pattern: local, dilated, longformer, fixed, strided), and bigbird's causal form:
//                                    ints width, random, seed (R random earlier blocks of `width` keys per block of
//                                    `width` queries, drawn for the run's length as sparse.bigbird_random_block does)
//   LinearAttention(q, k, v[, proj]) -> y   ints feature (native.FEATURES), normalize; floats eps, l1_eps
//   Hydra(q, k, v) -> y             int causal; float eps
//
// q, k, v (B, H, T, D) float32, contiguous as ONNX Runtime hands them over; y (B, H, T, Dv).  The (batch, head) tasks
// run on the session's intra-op threads (KernelContext_ParallelFor).  Built by supernet/attention/ort_ops.py against
// the C API header of ONNX Runtime 1.21 (onnxruntime/onnxruntime_c_api.h, MIT; the pip wheel ships no headers), which
// any later ONNX Runtime serves (ORT_API_VERSION 21); loaded with SessionOptions.register_custom_ops_library.
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "onnxruntime/onnxruntime_c_api.h"
#include "window_attention.h"

namespace {

const OrtApi* api = nullptr;
thread_local OrtKernelContext* current = nullptr;  // the context of the Compute running on this thread

// nas::set_parallel's hook: the tasks on ONNX Runtime's intra-op pool (serially where it has none or refuses)
void ort_parallel(int64_t n, const std::function<void(int64_t, int64_t)>& body) {
  if (current == nullptr || n < 2) return body(0, n);
  auto task = [](void* user, size_t i) { (*static_cast<const std::function<void(int64_t, int64_t)>*>(user))(i, i + 1); };
  OrtStatus* st = api->KernelContext_ParallelFor(current, task, (size_t)n, 0, const_cast<void*>(static_cast<const void*>(&body)));
  if (st != nullptr) {  // refused before running any task
    api->ReleaseStatus(st);
    body(0, n);
  }
}

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void ok(OrtStatus* st) {
  if (st == nullptr) return;
  std::string what = api->GetErrorMessage(st);
  api->ReleaseStatus(st);
  throw Failure(what);
}

int64_t attr_int(const OrtKernelInfo* info, const char* name, int64_t fallback) {
  int64_t v = fallback;
  OrtStatus* st = api->KernelInfoGetAttribute_int64(info, name, &v);
  if (st != nullptr) api->ReleaseStatus(st);  // absent: the default
  return v;
}

float attr_float(const OrtKernelInfo* info, const char* name, float fallback) {
  float v = fallback;
  OrtStatus* st = api->KernelInfoGetAttribute_float(info, name, &v);
  if (st != nullptr) api->ReleaseStatus(st);
  return v;
}

// An input (or an empty array where an optional one is absent) as a contiguous nas::Arr
nas::Arr input(OrtKernelContext* ctx, size_t i, std::vector<int64_t>& shape) {
  size_t count = 0;
  ok(api->KernelContext_GetInputCount(ctx, &count));
  nas::Arr a;
  a.ndim = 1;  // absent: empty (numel 0)
  if (i >= count) return a;
  const OrtValue* value = nullptr;
  ok(api->KernelContext_GetInput(ctx, i, &value));
  if (value == nullptr) return a;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  ok(api->GetTensorTypeAndShape(value, &info));
  size_t dims = 0;
  ONNXTensorElementDataType type;
  OrtStatus* st = api->GetDimensionsCount(info, &dims);
  if (st == nullptr) {
    shape.assign(dims, 0);
    st = api->GetDimensions(info, shape.data(), dims);
  }
  if (st == nullptr) st = api->GetTensorElementType(info, &type);
  api->ReleaseTensorTypeAndShapeInfo(info);
  ok(st);
  nas::check(dims <= 4, "nas.kernels: input ", i, " has ", dims, " dimensions, at most 4");
  void* data = nullptr;
  ok(api->GetTensorMutableData(const_cast<OrtValue*>(value), &data));
  a.data = data;
  a.ndim = (int64_t)dims;
  int64_t stride = 1;
  for (int64_t d = a.ndim - 1; d >= 0; --d) {
    a.sizes[d] = shape[d];
    a.strides[d] = stride;
    stride *= shape[d];
  }
  a.dtype = type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ? nas::DType::Float32 : nas::DType::Other;
  return a;
}

nas::Arr output(OrtKernelContext* ctx, const std::vector<int64_t>& shape) {
  OrtValue* value = nullptr;
  ok(api->KernelContext_GetOutput(ctx, 0, shape.data(), shape.size(), &value));
  void* data = nullptr;
  ok(api->GetTensorMutableData(value, &data));
  nas::Arr a;
  a.data = data;
  a.ndim = (int64_t)shape.size();
  int64_t stride = 1;
  for (int64_t d = a.ndim - 1; d >= 0; --d) {
    a.sizes[d] = shape[d];
    a.strides[d] = stride;
    stride *= shape[d];
  }
  return a;
}

nas::Arr none() {  // an absent lse, picks, proj, den: one dimension of size 0
  nas::Arr a;
  a.ndim = 1;
  return a;
}
const nas::Arr NONE = none();

struct Kernel {
  virtual ~Kernel() = default;
  virtual void compute(OrtKernelContext* ctx) = 0;
};

// BigBird's random block r of query block `block` (blocks of `width` tokens), in [0, block - 2]: the MINSTD generator
// of sparse.bigbird_random_block, term for term (every product below 2^48: int64 never overflows)
int64_t bigbird_random_block(int64_t block, int64_t r, int64_t seed) {
  constexpr int64_t M = 2147483647;
  int64_t x = (block * 92821 + (r + 1) * 68917 + seed) % M;
  x = (x * 48271) % M;
  x = (x * 48271) % M;
  return x % std::max<int64_t>(block - 1, 1);
}

// The kernel's picks for T queries (sparse._native_picks): (ceil(T / width), R) block indices, -1 where a pick does
// not count (blocks 0 and 1 have none outside their window; a repeat of an earlier pick of the row counts once)
std::vector<int64_t> bigbird_picks(int64_t T, int64_t width, int64_t R, int64_t seed) {
  const int64_t n = (T + width - 1) / width;
  std::vector<int64_t> picks(n * R, -1);
  for (int64_t b = 2; b < n; ++b) {
    int64_t* row = picks.data() + b * R;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t p = bigbird_random_block(b, r, seed);
      bool repeat = false;
      for (int64_t e = 0; e < r; ++e) repeat = repeat || bigbird_random_block(b, e, seed) == p;
      row[r] = repeat ? -1 : p;
    }
  }
  return picks;
}

struct Window : Kernel {
  int64_t before, after, globals, global_after, blocks, columns, step, width, random, seed;
  explicit Window(const OrtKernelInfo* info)
      : before(attr_int(info, "before", 0)), after(attr_int(info, "after", 0)), globals(attr_int(info, "globals", 0)),
        global_after(attr_int(info, "global_after", 0)), blocks(attr_int(info, "blocks", 0)),
        columns(attr_int(info, "columns", 0)), step(attr_int(info, "step", 1)), width(attr_int(info, "width", 1)),
        random(attr_int(info, "random", 0)), seed(attr_int(info, "seed", 0)) {
    nas::check(random >= 0 && random <= 8 && (random == 0 || (width >= 16 && width % 16 == 0)),
               "WindowAttention: random (bigbird's R) 0..8, and with it width a positive multiple of 16");
  }
  void compute(OrtKernelContext* ctx) override {
    std::vector<int64_t> sq, sk, sv;
    const nas::Arr q = input(ctx, 0, sq), k = input(ctx, 1, sk), v = input(ctx, 2, sv);
    nas::check(q.ndim == 4 && v.ndim == 4, "WindowAttention: q, k, v (B, H, T, D)");
    const nas::Arr y = output(ctx, {sv[0], sv[1], sv[2], sv[3]});
    std::vector<int64_t> table;  // bigbird: the length's picks, drawn here (a few microseconds; no stored table)
    nas::Arr picks = NONE;
    if (random > 0) {
      table = bigbird_picks(sq[2], width, random, seed);
      picks.data = table.data();
      picks.ndim = 2;
      picks.sizes[0] = (int64_t)table.size() / random;
      picks.sizes[1] = random;
      picks.strides[0] = random;
      picks.strides[1] = 1;
      picks.dtype = nas::DType::Int64;
    }
    nas::window_forward(q, k, v, y, NONE, before, after, globals, global_after, picks, width, blocks, columns, step);
  }
};

struct Linear : Kernel {
  int64_t feature, normalize;
  float eps, l1_eps;
  explicit Linear(const OrtKernelInfo* info)
      : feature(attr_int(info, "feature", 0)), normalize(attr_int(info, "normalize", 1)), eps(attr_float(info, "eps", 1e-6f)),
        l1_eps(attr_float(info, "l1_eps", 0.f)) {}
  void compute(OrtKernelContext* ctx) override {
    std::vector<int64_t> sq, sk, sv, sp;
    const nas::Arr q = input(ctx, 0, sq), k = input(ctx, 1, sk), v = input(ctx, 2, sv), proj = input(ctx, 3, sp);
    nas::check(q.ndim == 4 && v.ndim == 4, "LinearAttention: q, k, v (B, H, T, D)");
    const nas::Arr y = output(ctx, {sv[0], sv[1], sv[2], sv[3]});
    nas::linear_forward(q, k, v, y, feature, normalize != 0, eps, l1_eps, false, proj, NONE);
  }
};

struct Hydra : Kernel {
  int64_t causal;
  float eps;
  explicit Hydra(const OrtKernelInfo* info) : causal(attr_int(info, "causal", 1)), eps(attr_float(info, "eps", 1e-6f)) {}
  void compute(OrtKernelContext* ctx) override {
    std::vector<int64_t> sq, sk, sv;
    const nas::Arr q = input(ctx, 0, sq), k = input(ctx, 1, sk), v = input(ctx, 2, sv);
    nas::check(q.ndim == 4, "Hydra: q, k, v (B, H, T, D)");
    const nas::Arr y = output(ctx, {sv[0], sv[1], sv[2], sv[3]});
    nas::hydra_forward(q, k, v, y, causal != 0, eps);
  }
};

struct Op : OrtCustomOp {
  const char* name;
  size_t inputs, required;
  std::function<Kernel*(const OrtKernelInfo*)> make;
};

OrtStatus* create(const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo* info, void** kernel) {
  try {
    *kernel = static_cast<const Op*>(op)->make(info);
    return nullptr;
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, e.what());
  }
}

OrtStatus* compute(void* kernel, OrtKernelContext* ctx) {
  current = ctx;
  try {
    static_cast<Kernel*>(kernel)->compute(ctx);
    current = nullptr;
    return nullptr;
  } catch (const std::exception& e) {
    current = nullptr;
    return api->CreateStatus(ORT_INVALID_ARGUMENT, e.what());
  }
}

Op make_op(const char* name, size_t inputs, size_t required, std::function<Kernel*(const OrtKernelInfo*)> make) {
  Op op;
  std::memset(static_cast<OrtCustomOp*>(&op), 0, sizeof(OrtCustomOp));
  op.version = ORT_API_VERSION;
  op.name = name;
  op.inputs = inputs;
  op.required = required;
  op.make = std::move(make);
  op.GetName = [](const OrtCustomOp* o) { return static_cast<const Op*>(o)->name; };
  op.GetExecutionProviderType = [](const OrtCustomOp*) { return "CPUExecutionProvider"; };
  op.GetInputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; };
  op.GetInputTypeCount = [](const OrtCustomOp* o) { return static_cast<const Op*>(o)->inputs; };
  op.GetOutputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; };
  op.GetOutputTypeCount = [](const OrtCustomOp*) { return (size_t)1; };
  op.KernelDestroy = [](void* k) { delete static_cast<Kernel*>(k); };
  op.GetInputCharacteristic = [](const OrtCustomOp* o, size_t i) {
    return i < static_cast<const Op*>(o)->required ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  };
  op.GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
  op.GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
  op.GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.CreateKernelV2 = create;
  op.KernelComputeV2 = compute;
  op.GetStartVersion = [](const OrtCustomOp*) { return 1; };
  op.GetEndVersion = [](const OrtCustomOp*) { return 1; };
  return op;
}

std::vector<std::unique_ptr<Op>>& ops() {
  static std::vector<std::unique_ptr<Op>> all;
  if (all.empty()) {
    all.emplace_back(new Op(make_op("WindowAttention", 3, 3, [](const OrtKernelInfo* i) -> Kernel* { return new Window(i); })));
    all.emplace_back(new Op(make_op("LinearAttention", 4, 3, [](const OrtKernelInfo* i) -> Kernel* { return new Linear(i); })));
    all.emplace_back(new Op(make_op("Hydra", 3, 3, [](const OrtKernelInfo* i) -> Kernel* { return new Hydra(i); })));
  }
  return all;
}

}  // namespace

extern "C" {

// The entry ONNX Runtime looks for in a custom-op library (SessionOptions.register_custom_ops_library).
__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  api = base->GetApi(ORT_API_VERSION);
  if (api == nullptr) return nullptr;  // an ONNX Runtime older than 1.21: nothing registered, the session says so
  nas::set_parallel(ort_parallel);
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* st = api->CreateCustomOpDomain("nas.kernels", &domain)) return st;
  for (auto& op : ops()) {
    if (OrtStatus* st = api->CustomOpDomain_Add(domain, op.get())) return st;
  }
  return api->AddCustomOpDomain(options, domain);  // the domain lives as long as the library
}

const char* nas_isa() { return nas::isa(); }

}  // extern "C"
