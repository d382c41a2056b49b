#include "ops/cuda/gemm.h"

#include <cublasLt.h>

#include <cstring>
#include <sstream>

#include "core/check.h"

namespace deepinfer::ops::cuda {
namespace {

[[noreturn]] void throw_cublas(cublasStatus_t st, const char* call, const char* file, int line) {
  throw CudaError(detail::str_cat(call, " failed at ", file, ":", line, ": cuBLAS status ", int(st), " (",
                                  cublasLtGetStatusString(st), ")"),
                  int(st));
}
#define DI_CUBLAS_CHECK(call)                                                    \
  do {                                                                           \
    cublasStatus_t st_ = (call);                                                 \
    if (st_ != CUBLAS_STATUS_SUCCESS) throw_cublas(st_, #call, __FILE__, __LINE__); \
  } while (0)

cudaDataType_t cuda_type(DType t, const char* what) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF32: return CUDA_R_32F;
    case DType::kF16: return CUDA_R_16F;
    default: DI_THROW(InvalidArgument, "gemm: ", what, " dtype ", dtype_name(t), " not supported");
  }
}

// Largest power of two (<= 256) dividing the address and the leading dimension in bytes, so
// the heuristic never picks an algorithm that needs more alignment than the operand has.
uint32_t alignment(const void* p, int64_t ld, size_t elem) {
  uint64_t a = reinterpret_cast<uint64_t>(p) | uint64_t(ld * int64_t(elem));
  uint32_t al = 256;
  while (al > 1 && (a % al)) al >>= 1;
  return al;
}

// RAII for the three descriptor kinds (destroyed even when a later call throws).
struct Desc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Desc() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void set_batch(cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
  int32_t b = int32_t(batch);
  DI_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)));
  DI_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

void validate(const GemmParams& p) {
  if (p.M < 0 || p.N <= 0 || p.K <= 0 || p.batch < 1)
    DI_THROW(InvalidArgument, "gemm: bad shape M=", p.M, " N=", p.N, " K=", p.K, " batch=", p.batch);
  if (!p.x || !p.w || !p.y) DI_THROW(InvalidArgument, "gemm: null x, w or y");
  if (p.ldx < p.K) DI_THROW(InvalidArgument, "gemm: ldx ", p.ldx, " < K ", p.K);
  if (p.ldw < p.K) DI_THROW(InvalidArgument, "gemm: ldw ", p.ldw, " < K ", p.K);
  if (p.ldy < p.N) DI_THROW(InvalidArgument, "gemm: ldy ", p.ldy, " < N ", p.N);
  if (p.in_dtype != DType::kBF16 && p.in_dtype != DType::kF32)
    DI_THROW(InvalidArgument, "gemm: in_dtype ", dtype_name(p.in_dtype), " not supported (bf16, f32)");
  if (p.in_dtype == DType::kF32 && p.out_dtype != DType::kF32)
    DI_THROW(InvalidArgument, "gemm: f32 inputs need an f32 output");
  if (p.out_dtype != DType::kBF16 && p.out_dtype != DType::kF32)
    DI_THROW(InvalidArgument, "gemm: out_dtype ", dtype_name(p.out_dtype), " not supported (bf16, f32)");
  if (p.M > INT32_MAX || p.N > INT32_MAX || p.K > INT32_MAX || p.batch > INT32_MAX)
    DI_THROW(InvalidArgument, "gemm: dimension over 2^31");
}
}  // namespace

struct CublasLt::Impl {
  cublasLtHandle_t handle = nullptr;
  deepinfer::cuda::DeviceBuffer workspace;
  std::mutex mu;
  std::map<std::string, cublasLtMatmulAlgo_t> algos;  // key: shape, layout, dtypes, alignment
  ~Impl() {
    if (handle) cublasLtDestroy(handle);
  }

  // The cached algorithm for `key`, or one heuristic query (alignments as preferences).
  cublasLtMatmulAlgo_t pick(Desc& d, const std::string& key, uint32_t al_a, uint32_t al_b, uint32_t al_c,
                            const char* what, int64_t M, int64_t N, int64_t K) {
    std::lock_guard<std::mutex> lk(mu);
    auto it = algos.find(key);
    if (it != algos.end()) return it->second;
    DI_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
    const uint64_t ws = workspace.size_bytes();
    DI_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    DI_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                         sizeof(al_a)));
    DI_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                         sizeof(al_b)));
    DI_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                         sizeof(al_c)));
    DI_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                                         sizeof(al_c)));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    DI_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &res, &found));
    if (found == 0)
      throw CudaError(detail::str_cat(what, ": cuBLASLt has no algorithm for M=", M, " N=", N, " K=", K,
                                      " (alignments ", al_a, "/", al_b, "/", al_c, ")"),
                      int(CUBLAS_STATUS_NOT_SUPPORTED));
    algos.emplace(key, res.algo);
    return res.algo;
  }
};

CublasLt::CublasLt(size_t workspace_bytes, int device) : impl_(std::make_unique<Impl>()) {
  DI_CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
  impl_->workspace = deepinfer::cuda::DeviceBuffer(workspace_bytes, device);
}
CublasLt::~CublasLt() = default;
CublasLt::CublasLt(CublasLt&&) noexcept = default;
CublasLt& CublasLt::operator=(CublasLt&&) noexcept = default;

void CublasLt::gemm(const GemmParams& p, cudaStream_t stream) {
  validate(p);
  if (p.M == 0) return;
  const cudaDataType_t tin = cuda_type(p.in_dtype, "in"), tout = cuda_type(p.out_dtype, "out");
  const size_t ein = p.in_dtype == DType::kF32 ? 4 : 2, eout = p.out_dtype == DType::kF32 ? 4 : 2;
  const cublasComputeType_t compute = p.in_dtype == DType::kF32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;

  // Column-major view: yᵀ[N,M] = op(w)ᵀ... i.e. D(N×M, ld ldy) = Wᵀ-op(A: K×N, ld ldw) · B(K×M, ld ldx).
  Desc d;
  DI_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, compute, CUDA_R_32F));
  const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
  DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
  DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, tin, uint64_t(p.K), uint64_t(p.N), p.ldw));
  DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, tin, uint64_t(p.K), uint64_t(p.M), p.ldx));
  DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, tout, uint64_t(p.N), uint64_t(p.M), p.ldy));
  if (p.batch > 1) {
    set_batch(d.a, p.batch, p.batch_stride_w);
    set_batch(d.b, p.batch, p.batch_stride_x);
    set_batch(d.c, p.batch, p.batch_stride_y);
  }
  const uint32_t al_a = alignment(p.w, p.batch > 1 ? p.batch_stride_w : p.ldw, ein);
  const uint32_t al_b = alignment(p.x, p.batch > 1 ? p.batch_stride_x : p.ldx, ein);
  const uint32_t al_c = alignment(p.y, p.batch > 1 ? p.batch_stride_y : p.ldy, eout);

  std::ostringstream key;
  key << p.M << ',' << p.N << ',' << p.K << ',' << p.ldx << ',' << p.ldw << ',' << p.ldy << ',' << p.batch << ','
      << p.batch_stride_x << ',' << p.batch_stride_w << ',' << p.batch_stride_y << ',' << int(p.in_dtype) << ','
      << int(p.out_dtype) << ',' << al_a << ',' << al_b << ',' << al_c << ',' << (p.beta != 0.f);
  const cublasLtMatmulAlgo_t algo = impl_->pick(d, key.str(), al_a, al_b, al_c, "gemm", p.M, p.N, p.K);
  DI_CUBLAS_CHECK(cublasLtMatmul(impl_->handle, d.op, &p.alpha, p.w, d.a, p.x, d.b, &p.beta, p.y, d.c, p.y, d.c,
                                 &algo, impl_->workspace.data(), impl_->workspace.size_bytes(), stream));
}

void CublasLt::gemm_fp8_block(const Fp8GemmParams& p, cudaStream_t stream) {
  if (p.M < 0 || p.M % 4 || p.N <= 0 || p.K <= 0 || p.K % 128 || p.N % 16)
    DI_THROW(InvalidArgument, "gemm_fp8_block: shape M=", p.M, " N=", p.N, " K=", p.K,
             " (needs M % 4 == 0 (pad the rows), K % 128 == 0 and N % 16 == 0)");
  if (!p.x || !p.x_scale || !p.w || !p.w_scale || !p.y) DI_THROW(InvalidArgument, "gemm_fp8_block: null pointer");
  if (p.ldy < p.N) DI_THROW(InvalidArgument, "gemm_fp8_block: ldy ", p.ldy, " < N ", p.N);
  if (p.out_dtype != DType::kBF16 && p.out_dtype != DType::kF32)
    DI_THROW(InvalidArgument, "gemm_fp8_block: out_dtype must be bf16 or f32");
  if (p.M > INT32_MAX || p.N > INT32_MAX || p.K > INT32_MAX) DI_THROW(InvalidArgument, "gemm_fp8_block: dimension over 2^31");
  if (p.M == 0) return;
  const cudaDataType_t tout = cuda_type(p.out_dtype, "out");
  const size_t eout = p.out_dtype == DType::kF32 ? 4 : 2;
  // Same column-major view as gemm(): A = w (K×N, op T) with 128×128 block scales,
  // B = x (K×M, op N) with per-128 vector scales; FP8 on Hopper must be this "TN" form.
  Desc d;
  DI_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
  DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
  const int32_t mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a)));
  DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)));
  const void* sa = p.w_scale;
  const void* sb = p.x_scale;
  DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
  DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
  DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_8F_E4M3, uint64_t(p.K), uint64_t(p.N), p.K));
  DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_8F_E4M3, uint64_t(p.K), uint64_t(p.M), p.K));
  DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, tout, uint64_t(p.N), uint64_t(p.M), p.ldy));
  const uint32_t al_a = alignment(p.w, p.K, 1), al_b = alignment(p.x, p.K, 1), al_c = alignment(p.y, p.ldy, eout);
  std::ostringstream key;
  key << "fp8blk," << p.M << ',' << p.N << ',' << p.K << ',' << p.ldy << ',' << int(p.out_dtype) << ',' << al_a << ','
      << al_b << ',' << al_c;
  const cublasLtMatmulAlgo_t algo = impl_->pick(d, key.str(), al_a, al_b, al_c, "gemm_fp8_block", p.M, p.N, p.K);
  const float alpha = 1.0f, beta = 0.0f;
  DI_CUBLAS_CHECK(cublasLtMatmul(impl_->handle, d.op, &alpha, p.w, d.a, p.x, d.b, &beta, p.y, d.c, p.y, d.c, &algo,
                                 impl_->workspace.data(), impl_->workspace.size_bytes(), stream));
}

}  // namespace deepinfer::ops::cuda
