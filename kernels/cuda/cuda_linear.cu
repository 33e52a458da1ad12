#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda_status.h"
#include "temb/base/status_macros.h"
#include "temb/kernels/cuda_backend.h"
#include "temb/kernels/cuda_linear.h"

namespace temb {
namespace cuda {
namespace {

// cuBLASLt's workspace for every GEMM of an engine.  Split-K is ruled out
// (below), so this is only what the chosen kernels ask for.
constexpr size_t kWorkspaceBytes = size_t{4} << 20;

absl::Status CheckBlas(cublasStatus_t status, absl::string_view operation) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(operation, " failed: cuBLAS status ",
                                           static_cast<int>(status));
  // Out of memory or a device fault: another replica may do better.
  return status == CUBLAS_STATUS_ALLOC_FAILED ||
                 status == CUBLAS_STATUS_EXECUTION_FAILED
             ? absl::UnavailableError(message)
             : absl::InternalError(message);
}

cudaDataType_t BlasType(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return CUDA_R_16BF;
    case DType::kFloat16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// cuBLASLt is opened when the first engine is made, not linked: a binary
// that never computes a conditioning model on a GPU neither loads nor ships
// its 0.5 GB, and starts where it is absent.
struct Blas {
  decltype(&::cublasLtCreate) cublasLtCreate = nullptr;
  decltype(&::cublasLtDestroy) cublasLtDestroy = nullptr;
  decltype(&::cublasLtMatmulDescCreate) cublasLtMatmulDescCreate = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) cublasLtMatmulDescDestroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) cublasLtMatmulDescSetAttribute =
      nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) cublasLtMatrixLayoutCreate = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) cublasLtMatrixLayoutDestroy =
      nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) cublasLtMatmulPreferenceCreate =
      nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute)
      cublasLtMatmulPreferenceSetAttribute = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) cublasLtMatmulPreferenceDestroy =
      nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) cublasLtMatmulAlgoGetHeuristic =
      nullptr;
  decltype(&::cublasLtMatmul) cublasLtMatmul = nullptr;
};

absl::StatusOr<const Blas*> LoadBlas() {
  static const absl::StatusOr<const Blas*> loaded =
      []() -> absl::StatusOr<const Blas*> {
    constexpr const char* kLibraries[] = {"libcublasLt.so.13",
                                          "libcublasLt.so"};
    void* library = nullptr;
    for (const char* name : kLibraries) {
      library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (library != nullptr) break;
    }
    if (library == nullptr) {
      return absl::FailedPreconditionError(
          "cannot load libcublasLt.so.13 (CUDA's cuBLAS): install it, or "
          "put its directory in LD_LIBRARY_PATH");
    }
    static Blas blas;
    bool complete = true;
    auto bind = [&](auto* function, const char* name) {
      *function = reinterpret_cast<std::remove_pointer_t<decltype(function)>>(
          dlsym(library, name));
      complete = complete && *function != nullptr;
    };
    bind(&blas.cublasLtCreate, "cublasLtCreate");
    bind(&blas.cublasLtDestroy, "cublasLtDestroy");
    bind(&blas.cublasLtMatmulDescCreate, "cublasLtMatmulDescCreate");
    bind(&blas.cublasLtMatmulDescDestroy, "cublasLtMatmulDescDestroy");
    bind(&blas.cublasLtMatmulDescSetAttribute,
         "cublasLtMatmulDescSetAttribute");
    bind(&blas.cublasLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    bind(&blas.cublasLtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
    bind(&blas.cublasLtMatmulPreferenceCreate,
         "cublasLtMatmulPreferenceCreate");
    bind(&blas.cublasLtMatmulPreferenceSetAttribute,
         "cublasLtMatmulPreferenceSetAttribute");
    bind(&blas.cublasLtMatmulPreferenceDestroy,
         "cublasLtMatmulPreferenceDestroy");
    bind(&blas.cublasLtMatmulAlgoGetHeuristic,
         "cublasLtMatmulAlgoGetHeuristic");
    bind(&blas.cublasLtMatmul, "cublasLtMatmul");
    if (!complete) {
      return absl::FailedPreconditionError(
          "libcublasLt lacks a function temb needs: a cuBLAS older than "
          "CUDA 13?");
    }
    return &blas;
  }();
  return loaded;
}

// The loaded library; only after LoadBlas() succeeded (every engine's
// Create() checks it first).
const Blas& Api() { return **LoadBlas(); }

// The input rows in the weights' dtype (exact: the models round them to it
// first), zero-padded to the tile.
template <typename T>
__global__ void ConvertRows(const float* in, T* out, int64_t count,
                            int64_t padded) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= padded) return;
  const float value = i < count ? in[i] : 0.0f;
  if constexpr (sizeof(T) == 4) {
    out[i] = value;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    out[i] = __float2bfloat16_rn(value);
  } else {
    out[i] = __float2half_rn(value);
  }
}

// out = round(sum + bias) in `out_dtype`, kept as float32; the addition is
// the one float32 rounding the CPU kernel does too.
__global__ void AddBiasAndRound(const float* sums, const float* bias,
                                float* out, int64_t rows, int64_t features,
                                int out_dtype) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= rows * features) return;
  float value = sums[i];
  if (bias != nullptr) value = __fadd_rn(value, bias[i % features]);
  if (out_dtype == static_cast<int>(DType::kBFloat16)) {
    value = __bfloat162float(__float2bfloat16_rn(value));
  } else if (out_dtype == static_cast<int>(DType::kFloat16)) {
    value = __half2float(__float2half_rn(value));
  }
  out[i] = value;
}

float HostToFloat(const uint8_t* bytes, DType dtype) {
  if (dtype == DType::kFloat32) {
    float value;
    std::memcpy(&value, bytes, 4);
    return value;
  }
  uint16_t bits;
  std::memcpy(&bits, bytes, 2);
  return dtype == DType::kBFloat16 ? BFloat16ToFloat(bits) : HalfToFloat(bits);
}

struct BlasLayout {
  cublasLtMatrixLayout_t layout = nullptr;
  ~BlasLayout() {
    if (layout != nullptr) Api().cublasLtMatrixLayoutDestroy(layout);
  }
};

}  // namespace

struct CublasLinearEngine::Impl {
  struct Linear {
    DType dtype = DType::kFloat32;
    int64_t in = 0;
    int64_t out = 0;
    std::unique_ptr<void, DeviceFree> weight;
    std::unique_ptr<float, DeviceFree> bias;  // float32, or null
    cublasLtMatmulDesc_t op = nullptr;
    BlasLayout a, b, c;
    cublasLtMatmulAlgo_t algo;
    bool pedantic = false;  // IEEE float32 accumulation (see Upload)
  };

  int device = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t handle = nullptr;
  std::unique_ptr<void, DeviceFree> workspace;
  std::mutex mu;  // one call at a time on the stream and the buffers
  std::vector<std::unique_ptr<Linear>> linears;
  int64_t bytes = 0;
  // Per call, grown as needed: the tile's converted inputs, sums, outputs.
  std::unique_ptr<void, DeviceFree> x;
  size_t x_bytes = 0;
  std::unique_ptr<float, DeviceFree> sums;
  size_t sums_bytes = 0;
  std::unique_ptr<float, DeviceFree> staged_in;
  size_t staged_in_bytes = 0;
  // The call's rows in and out through page-locked host memory: a copy
  // from or to pageable memory goes through the driver's own bounce buffer
  // in small synchronous pieces.
  std::unique_ptr<float, PinnedFree> host_in;
  size_t host_in_bytes = 0;
  std::unique_ptr<float, PinnedFree> host_out;
  size_t host_out_bytes = 0;

  ~Impl() {
    for (auto& linear : linears) {
      if (linear->op != nullptr) Api().cublasLtMatmulDescDestroy(linear->op);
    }
    if (handle != nullptr) Api().cublasLtDestroy(handle);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  template <typename T>
  absl::Status Grow(std::unique_ptr<T, DeviceFree>* buffer, size_t* size,
                    size_t wanted) {
    if (*size >= wanted) return absl::OkStatus();
    void* p = nullptr;
    RETURN_IF_ERROR(Check(cudaMalloc(&p, wanted), "cudaMalloc"));
    buffer->reset(static_cast<T*>(p));
    *size = wanted;
    return absl::OkStatus();
  }

  // The operation of `compute` for `linear`'s layouts and one algorithm
  // for it without split-K (whose partial sums could be combined in
  // another order): every call runs exactly it.
  cublasStatus_t ChooseAlgorithm(cublasComputeType_t compute, Linear* linear) {
    cublasStatus_t status =
        Api().cublasLtMatmulDescCreate(&linear->op, compute, CUDA_R_32F);
    const cublasOperation_t transpose = CUBLAS_OP_T;
    const cublasOperation_t keep = CUBLAS_OP_N;
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = Api().cublasLtMatmulDescSetAttribute(
          linear->op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
          sizeof(transpose));
    }
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = Api().cublasLtMatmulDescSetAttribute(
          linear->op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep));
    }
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    cublasLtMatmulPreference_t preference = nullptr;
    status = Api().cublasLtMatmulPreferenceCreate(&preference);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    const size_t workspace_bytes = kWorkspaceBytes;
    const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
    Api().cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
        sizeof(workspace_bytes));
    Api().cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
        sizeof(reduction));
    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    status = Api().cublasLtMatmulAlgoGetHeuristic(
        handle, linear->op, linear->a.layout, linear->b.layout,
        linear->c.layout, linear->c.layout, preference, 1, &result, &found);
    Api().cublasLtMatmulPreferenceDestroy(preference);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    if (found < 1) return CUBLAS_STATUS_NOT_SUPPORTED;
    linear->algo = result.algo;
    return CUBLAS_STATUS_SUCCESS;
  }

  absl::Status Grow(std::unique_ptr<float, PinnedFree>* buffer, size_t* size,
                    size_t wanted) {
    if (*size >= wanted) return absl::OkStatus();
    buffer->reset();
    *size = 0;
    void* p = nullptr;
    RETURN_IF_ERROR(Check(cudaMallocHost(&p, wanted), "cudaMallocHost"));
    buffer->reset(static_cast<float*>(p));
    *size = wanted;
    return absl::OkStatus();
  }
};

CublasLinearEngine::CublasLinearEngine(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

CublasLinearEngine::~CublasLinearEngine() {
  if (impl_ != nullptr) {
    ScopedDevice restore;
    (void)cudaSetDevice(impl_->device);
    impl_.reset();
  }
}

int64_t CublasLinearEngine::device_bytes() const { return impl_->bytes; }

std::string CublasLinearEngine::name() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const bool pedantic =
      std::all_of(impl_->linears.begin(), impl_->linears.end(),
                  [](const auto& linear) { return linear->pedantic; });
  return absl::StrCat("cuda:", impl_->device,
                      ":cublaslt:", pedantic ? "float32" : "tensor-cores");
}

absl::StatusOr<std::unique_ptr<CublasLinearEngine>> CublasLinearEngine::Create(
    int device) {
  RETURN_IF_ERROR(LoadBlas().status());
  if (absl::Status probe = Probe(device); !probe.ok()) {
    return absl::FailedPreconditionError(probe.message());
  }
  ScopedDevice restore;
  RETURN_IF_ERROR(Check(cudaSetDevice(device), "cudaSetDevice"));
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  RETURN_IF_ERROR(
      Check(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking),
            "cudaStreamCreate"));
  RETURN_IF_ERROR(
      CheckBlas(Api().cublasLtCreate(&impl->handle), "cublasLtCreate"));
  void* workspace = nullptr;
  RETURN_IF_ERROR(Check(cudaMalloc(&workspace, kWorkspaceBytes), "cudaMalloc"));
  impl->workspace.reset(workspace);
  return std::unique_ptr<CublasLinearEngine>(
      new CublasLinearEngine(std::move(impl)));
}

absl::StatusOr<int> CublasLinearEngine::Upload(const LinearWeights& w) {
  if (w.dtype == DType::kFloat64) {
    return absl::InvalidArgumentError("dtype: fp64 weights are not supported");
  }
  if (w.in_features < 1 || w.out_features < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("in_features and out_features must be >= 1, got ",
                     w.in_features, " and ", w.out_features));
  }
  const size_t element = DTypeSize(w.dtype);
  if (w.weight.size() !=
      static_cast<size_t>(w.in_features * w.out_features) * element) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight: ", w.weight.size(), " bytes do not hold [", w.out_features,
        ", ", w.in_features, "] of ", DTypeName(w.dtype)));
  }
  if (!w.bias.empty() &&
      w.bias.size() != static_cast<size_t>(w.out_features) * element) {
    return absl::InvalidArgumentError(
        absl::StrCat("bias: ", w.bias.size(), " bytes do not hold [",
                     w.out_features, "] of ", DTypeName(w.dtype)));
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  ScopedDevice restore;
  RETURN_IF_ERROR(Check(cudaSetDevice(impl_->device), "cudaSetDevice"));
  auto linear = std::make_unique<Impl::Linear>();
  linear->dtype = w.dtype;
  linear->in = w.in_features;
  linear->out = w.out_features;
  void* weight = nullptr;
  RETURN_IF_ERROR(Check(cudaMalloc(&weight, w.weight.size()), "cudaMalloc"));
  linear->weight.reset(weight);
  RETURN_IF_ERROR(Check(cudaMemcpy(weight, w.weight.data(), w.weight.size(),
                                   cudaMemcpyHostToDevice),
                        "cudaMemcpy"));
  int64_t bytes = static_cast<int64_t>(w.weight.size());
  if (!w.bias.empty()) {
    // The bias joins the float32 sum: widened once here.
    std::vector<float> bias(w.out_features);
    for (int64_t o = 0; o < w.out_features; ++o) {
      bias[o] = HostToFloat(w.bias.data() + o * element, w.dtype);
    }
    void* device_bias = nullptr;
    RETURN_IF_ERROR(
        Check(cudaMalloc(&device_bias, bias.size() * 4), "cudaMalloc"));
    linear->bias.reset(static_cast<float*>(device_bias));
    RETURN_IF_ERROR(Check(cudaMemcpy(device_bias, bias.data(), bias.size() * 4,
                                     cudaMemcpyHostToDevice),
                          "cudaMemcpy"));
    bytes += static_cast<int64_t>(bias.size() * 4);
  }

  // Row-major Y[M, N] = X[M, K] W^T is column-major Y^T[N, M] =
  // op(A) B with A = W stored K x N (transposed) and B = X^T stored K x M.
  const cudaDataType_t type = BlasType(w.dtype);
  RETURN_IF_ERROR(CheckBlas(
      Api().cublasLtMatrixLayoutCreate(&linear->a.layout, type, w.in_features,
                                       w.out_features, w.in_features),
      "cublasLtMatrixLayoutCreate"));
  RETURN_IF_ERROR(CheckBlas(
      Api().cublasLtMatrixLayoutCreate(&linear->b.layout, type, w.in_features,
                                       kRowTile, w.in_features),
      "cublasLtMatrixLayoutCreate"));
  RETURN_IF_ERROR(CheckBlas(Api().cublasLtMatrixLayoutCreate(
                                &linear->c.layout, CUDA_R_32F, w.out_features,
                                kRowTile, w.out_features),
                            "cublasLtMatrixLayoutCreate"));
  // Float32 for every stage of the sum first (PEDANTIC: IEEE float32
  // accumulation, the CPU kernel's contract); where cuBLASLt has no such
  // algorithm, its float32 accumulation on the tensor cores, whose partial
  // sums round less exactly (docs/conditioning.md).
  cublasStatus_t chosen = CUBLAS_STATUS_NOT_SUPPORTED;
  for (const cublasComputeType_t compute :
       {CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_COMPUTE_32F}) {
    if (linear->op != nullptr) {
      Api().cublasLtMatmulDescDestroy(linear->op);
      linear->op = nullptr;
    }
    chosen = impl_->ChooseAlgorithm(compute, linear.get());
    if (chosen == CUBLAS_STATUS_SUCCESS) {
      linear->pedantic = compute == CUBLAS_COMPUTE_32F_PEDANTIC;
      break;
    }
  }
  if (chosen != CUBLAS_STATUS_SUCCESS) {
    return absl::UnavailableError(
        absl::StrCat("cuBLASLt has no algorithm for a [", w.out_features, ", ",
                     w.in_features, "] ", DTypeName(w.dtype),
                     " Linear: cuBLAS status ", static_cast<int>(chosen)));
  }
  impl_->bytes += bytes;
  impl_->linears.push_back(std::move(linear));
  return static_cast<int>(impl_->linears.size() - 1);
}

absl::Status CublasLinearEngine::Forward(int id, absl::Span<const float> x,
                                         int64_t rows, DType out_dtype,
                                         absl::Span<float> out) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (id < 0 || id >= static_cast<int>(impl_->linears.size())) {
    return absl::InvalidArgumentError(absl::StrCat("id: no Linear ", id));
  }
  const Impl::Linear& linear = *impl_->linears[id];
  if (rows < 0 || x.size() != static_cast<size_t>(rows * linear.in) ||
      out.size() != static_cast<size_t>(rows * linear.out)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "x and out must hold ", rows, " rows of ", linear.in, " and ",
        linear.out, " values, got ", x.size(), " and ", out.size()));
  }
  ScopedDevice restore;
  RETURN_IF_ERROR(Check(cudaSetDevice(impl_->device), "cudaSetDevice"));
  const size_t element = DTypeSize(linear.dtype);
  const int64_t tile_in = kRowTile * linear.in;
  const int64_t tile_out = kRowTile * linear.out;
  RETURN_IF_ERROR(impl_->Grow(&impl_->staged_in, &impl_->staged_in_bytes,
                              static_cast<size_t>(tile_in) * 4));
  RETURN_IF_ERROR(impl_->Grow(&impl_->x, &impl_->x_bytes,
                              static_cast<size_t>(tile_in) * element));
  RETURN_IF_ERROR(impl_->Grow(&impl_->sums, &impl_->sums_bytes,
                              static_cast<size_t>(tile_out) * 4 * 2));
  RETURN_IF_ERROR(impl_->Grow(&impl_->host_in, &impl_->host_in_bytes,
                              x.size() * sizeof(float)));
  RETURN_IF_ERROR(impl_->Grow(&impl_->host_out, &impl_->host_out_bytes,
                              out.size() * sizeof(float)));
  std::copy(x.begin(), x.end(), impl_->host_in.get());
  float* sums = impl_->sums.get();
  float* rounded = sums + tile_out;
  const float alpha = 1.0f;
  const float beta = 0.0f;
  constexpr int kThreads = 256;
  for (int64_t first = 0; first < rows; first += kRowTile) {
    const int64_t count = std::min(kRowTile, rows - first);
    RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(impl_->staged_in.get(),
                              impl_->host_in.get() + first * linear.in,
                              static_cast<size_t>(count * linear.in) * 4,
                              cudaMemcpyHostToDevice, impl_->stream),
              "cudaMemcpyAsync"));
    const unsigned blocks =
        static_cast<unsigned>((tile_in + kThreads - 1) / kThreads);
    const float* staged = impl_->staged_in.get();
    switch (linear.dtype) {
      case DType::kBFloat16:
        ConvertRows<<<blocks, kThreads, 0, impl_->stream>>>(
            staged, static_cast<__nv_bfloat16*>(impl_->x.get()),
            count * linear.in, tile_in);
        break;
      case DType::kFloat16:
        ConvertRows<<<blocks, kThreads, 0, impl_->stream>>>(
            staged, static_cast<__half*>(impl_->x.get()), count * linear.in,
            tile_in);
        break;
      default:
        ConvertRows<<<blocks, kThreads, 0, impl_->stream>>>(
            staged, static_cast<float*>(impl_->x.get()), count * linear.in,
            tile_in);
        break;
    }
    RETURN_IF_ERROR(Check(cudaGetLastError(), "ConvertRows"));
    RETURN_IF_ERROR(CheckBlas(
        Api().cublasLtMatmul(
            impl_->handle, linear.op, &alpha, linear.weight.get(),
            linear.a.layout, impl_->x.get(), linear.b.layout, &beta, sums,
            linear.c.layout, sums, linear.c.layout, &linear.algo,
            impl_->workspace.get(), kWorkspaceBytes, impl_->stream),
        "cublasLtMatmul"));
    const int64_t produced = count * linear.out;
    AddBiasAndRound<<<static_cast<unsigned>((produced + kThreads - 1) /
                                            kThreads),
                      kThreads, 0, impl_->stream>>>(
        sums, linear.bias.get(), rounded, count, linear.out,
        static_cast<int>(out_dtype));
    RETURN_IF_ERROR(Check(cudaGetLastError(), "AddBiasAndRound"));
    RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(impl_->host_out.get() + first * linear.out,
                              rounded, static_cast<size_t>(produced) * 4,
                              cudaMemcpyDeviceToHost, impl_->stream),
              "cudaMemcpyAsync"));
  }
  RETURN_IF_ERROR(
      Check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize"));
  std::copy_n(impl_->host_out.get(), out.size(), out.begin());
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace temb
