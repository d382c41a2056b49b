// Expert parallelism on the CUDA backend (expert_parallel.h), two exchanges:
//
// Device (issue #14; when the ExpertParallel carries a device all-to-all, NCCL between GPUs):
// the rows, slots and routed weights are packed per destination rank on the device and
// exchanged from device memory on the step stream (device_expert_exchange.h); only the per-peer
// row counts come back to the host (one small copy per layer, to size the transfers). The
// received rows run through this rank's slots with the single-rank kernels (device moe_route
// over the rows' logical ids, grouped GEMM or per-expert cuBLASLt), the outputs go back the same
// way and land where the combine gathers them.
//
// Host-staged (any other group: gloo, also several processes sharing one GPU, which is how the
// engine's multi-rank runs are tested on one H200): a main MoE layer's dispatch copies the
// step's rows, routing ids and weights to the host, exchanges them through the group, runs this
// rank's slots on the device with the same kernels, copies the outputs back and returns them to
// the ranks that routed them. Cost: two device<->host copies per layer and a sync.
//
// Both: every rank receives the same rows in the same order (each sender's pairs ascending,
// senders in rank order) and the combine sums each token's k outputs in k order, as the
// single-rank combine does, so a rank's tokens get the same additions in the same order.
// DEEPINFER_EP_EXCHANGE=host forces host staging even when a device exchange is there; =device
// refuses to run without one. Fixed-shape (graph) steps are off under expert parallelism: the
// exchange sizes are only known on the host (docs/PARALLEL.md, Not built yet).
#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/check.h"
#include "core/logging.h"
#include "core/numeric.h"
#include "deepinfer/error.h"
#include "model/deepseek/cuda/cuda_backend.h"
#include "model/deepseek/cuda/ep_exchange.h"
#include "model/deepseek/cuda/glue_kernels.h"
#include "model/deepseek/expert_parallel.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/cuda/moe_route.h"

namespace deepinfer::model::ds::cuda {
namespace dc = deepinfer::cuda;
namespace oc = ops::cuda;

namespace {
void grow(dc::DeviceBuffer& b, size_t bytes, int device) { ensure(b, std::max<size_t>(bytes, 256), device); }

// Rows of the activation dtype (bf16 or f32) to f32 and back; bf16 -> f32 -> bf16 is exact.
void to_f32(const std::vector<char>& src, DType dt, int64_t n, std::vector<float>& out) {
  out.resize(size_t(n));
  if (dt == DType::kF32) {
    std::memcpy(out.data(), src.data(), size_t(n) * 4);
    return;
  }
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src.data());
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = bf16_to_f32(s[i]);
}
void from_f32(const float* src, DType dt, int64_t n, char* dst) {
  if (dt == DType::kF32) {
    std::memcpy(dst, src, size_t(n) * 4);
    return;
  }
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
}
}  // namespace

void CudaBackend::set_expert_parallel(std::shared_ptr<ExpertParallel> ep) {
  if (ep && act_ != DType::kBF16 && act_ != DType::kF32)
    DI_THROW(InvalidArgument, describe(), ": expert parallelism needs bf16 or f32 activations");
  if (ep && cp_)
    DI_THROW(InvalidArgument, describe(), ": expert parallelism together with context parallelism is not built on the "
             "GPU backend (the CPU backend runs both over one group)");
  ep_dev_.reset();
  ep_ = std::move(ep);
  if (ep_) {
    const EpExchange want = opts_.ep_exchange;
    parallel::DeviceAllToAllV* a2a = ep_->device_exchange();
    if (want == EpExchange::kDevice && !a2a)
      DI_THROW(InvalidArgument, describe(), ": DEEPINFER_EP_EXCHANGE=device but the expert-parallel group (",
               ep_->describe_group(), ") has no device exchange (NCCL)");
    if (a2a && want != EpExchange::kHost) ep_dev_ = std::make_unique<DeviceExpertExchange>(*a2a, opts_.device);
    DI_INFO(describe(), ": expert parallelism rank ", ep_->rank(), " of ", ep_->size(), ", ",
            ep_dev_ ? "device exchange over " + a2a->describe() : "host-staged exchange over " + ep_->describe_group());
  }
  ModelRef& m = weights_->refs;
  for (size_t l = 0; l < m.layers.size(); ++l) m.layers[l].ffn.ep_layer = ep_ ? int32_t(l) : -1;
}

// This rank's rows, ids and weights to the host, then the all-to-all.
void CudaBackend::ep_dispatch(const MoeRef& M) {
  const Dims& g = arch_.dims;
  const int64_t T = plan_.T, D = g.hidden, K = g.topk, ab = int64_t(dtype_bits(act_) / 8);
  const cudaStream_t st = stream_.get();
  if (M.ep_layer == 0) ep_->begin_step();  // once per main forward, on every rank alike
  if (ep_dev_) {
    ep_recv_ = ep_dev_->dispatch(M.ep_layer, ep_->layout(M.ep_layer), buf(Buf::kH), act_, T, D,
                                 at<int32_t>(L_.buf[size_t(Buf::kIds)]), at<float>(L_.buf[size_t(Buf::kWts)]), K, st);
    return;
  }
  ep_ids_.resize(size_t(T * K));
  ep_wts_.resize(size_t(std::max<int64_t>(T * K, 1)));  // never null: a rank without tokens still passes weights
  ep_stage_.resize(size_t(T * D * ab));
  if (T > 0) {
    dc::copy_d2h(ep_stage_.data(), buf(Buf::kH), ep_stage_.size(), st, false);
    dc::copy_d2h(ep_ids_.data(), buf(Buf::kIds), size_t(T * K) * 4, st, false);
    dc::copy_d2h(ep_wts_.data(), buf(Buf::kWts), size_t(T * K) * 4, st, true);
  }
  to_f32(ep_stage_, act_, T * D, ep_rows_);
  ep_->dispatch(M.ep_layer, ep_rows_.data(), T, D, ep_ids_.data(), K, ep_wts_.data());
}

// The received rows through this rank's slots: sorted by logical expert on the host (the same
// stable permutation as moe_route), the routed weight applied before W2 as on one rank; outputs
// back in arrival order, returned to their ranks, uploaded as [T*K, D] for the combine.
// Exact numerics: each local expert's rows [seg[e], seg[e+1]) of the received (expert-sorted)
// rows through its own cuBLASLt GEMMs (host shapes), the routed weight applied in swiglu_rows.
void CudaBackend::ep_expert_gemms(const MoeRef& M, const std::vector<int32_t>& seg, int64_t m) {
  const Dims& g = arch_.dims;
  const int64_t D = g.hidden, I = g.moe_inter, E = int64_t(seg.size()) - 1, ab = int64_t(dtype_bits(act_) / 8);
  char* xs = ep_x_.as<char>();
  char* gu = ep_gu_.as<char>();
  char* act = ep_act_.as<char>();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t a0 = seg[size_t(e)], n = seg[size_t(e + 1)] - a0;
    if (n > 0) linear(M.experts[size_t(e)].w13, xs + a0 * D * ab, D, n, gu + a0 * 2 * I * ab, act_, 2 * I);
  }
  swiglu_rows(gu, act, ep_perm_w_.as<float>(), m);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t a0 = seg[size_t(e)], n = seg[size_t(e + 1)] - a0;
    if (n > 0) linear(M.experts[size_t(e)].w2, act + a0 * I * ab, I, n, ep_ye_.as<float>() + a0 * D, DType::kF32, D);
  }
}

void CudaBackend::ep_experts(const MoeRef& M) {
  if (ep_dev_) return ep_experts_device(M);
  const Dims& g = arch_.dims;
  const int64_t T = plan_.T, D = g.hidden, K = g.topk, I = g.moe_inter, E = g.experts;
  const int64_t ab = int64_t(dtype_bits(act_) / 8);
  const cudaStream_t st = stream_.get();
  const int dev = opts_.device;
  const parallel::ExpertPlacement& L = ep_->layout(M.ep_layer);
  const ExpertParallel::Received got = ep_->received();
  const int64_t m = int64_t(got.slot.size()), S = L.slots_per_rank;
  DI_CHECK(int64_t(got.weight.size()) == m, "expert-parallel dispatch without routed weights");
  std::vector<int32_t> logical(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j)
    logical[size_t(j)] = L.physical_to_logical[size_t(int64_t(ep_->rank()) * S + got.slot[size_t(j)])];
  std::vector<float> out_arrival(static_cast<size_t>(m * D));
  if (m > 0) {
    // Host permutation (moe_route's twin): seg, perm_src, perm_w, comb, tiles.
    const int64_t max_tiles = oc::moe_route_max_tiles(m, E, oc::kGroupedTileM);
    std::vector<int32_t> seg(static_cast<size_t>(E + 1)), tiles(static_cast<size_t>(std::max<int64_t>(max_tiles, 1)));
    std::vector<int64_t> perm_src(static_cast<size_t>(m)), comb(static_cast<size_t>(m));
    std::vector<float> perm_w(static_cast<size_t>(m));
    int32_t num_tiles = 0;
    oc::moe_route_host({.ids = logical.data(), .weights = got.weight.data(), .tokens = m, .topk = 1, .experts = E,
                        .tile_m = oc::kGroupedTileM, .seg = seg.data(), .perm_src = perm_src.data(),
                        .perm_w = perm_w.data(), .comb = comb.data(), .tiles = tiles.data(), .num_tiles = &num_tiles,
                        .max_tiles = max_tiles});
    for (int64_t j = 0; j < m; ++j)
      if (comb[size_t(j)] < 0)
        DI_THROW(InternalError, "expert-parallel rank ", ep_->rank(), ": layer ", M.ep_layer, " received row ", j,
                 " for expert ", logical[size_t(j)], " outside [0, ", E, ")");
    const bool grouped = moe_path(M) == MoePath::kGrouped;
    // x: the rows in arrival order (grouped GEMM gathers through perm_src) or already sorted.
    std::vector<char> x(static_cast<size_t>(m * D * ab));
    for (int64_t a = 0; a < m; ++a) {
      const int64_t j = grouped ? a : perm_src[size_t(a)];
      from_f32(got.rows.data() + j * D, act_, D, x.data() + a * D * ab);
    }
    grow(ep_x_, x.size(), dev);
    grow(ep_gu_, size_t(m * 2 * I * ab), dev);
    grow(ep_act_, size_t(m * I * ab), dev);
    grow(ep_ye_, size_t(m * D) * 4, dev);
    grow(ep_perm_w_, size_t(m) * 4, dev);
    dc::copy_h2d(ep_x_.data(), x.data(), x.size(), st, false);
    dc::copy_h2d(ep_perm_w_.data(), perm_w.data(), size_t(m) * 4, st, false);
    if (grouped) {
      grow(ep_perm_src_, size_t(m) * 8, dev);
      grow(ep_seg_, size_t(E + 1) * 4, dev);
      grow(ep_tiles_, (tiles.size() + 1) * 4, dev);
      dc::copy_h2d(ep_perm_src_.data(), perm_src.data(), size_t(m) * 8, st, false);
      dc::copy_h2d(ep_seg_.data(), seg.data(), seg.size() * 4, st, false);
      tiles.push_back(num_tiles);  // the count rides after the list
      dc::copy_h2d(ep_tiles_.data(), tiles.data(), tiles.size() * 4, st, false);
      const int32_t* tiles_d = ep_tiles_.as<int32_t>();
      oc::GroupedGemmParams gp{.x = ep_x_.data(), .ldx = D, .x_rows = ep_perm_src_.as<int64_t>(),
                               .w = M.tables.w13, .scale = M.tables.w13_scale, .format = expert_format(M.tables.dtype),
                               .seg = ep_seg_.as<int32_t>(), .tiles = tiles_d, .num_tiles = tiles_d + max_tiles,
                               .max_tiles = max_tiles, .experts = E, .N = 2 * I, .K = D, .y = ep_gu_.data(),
                               .ldy = 2 * I, .y_dtype = act_};
      oc::grouped_gemm(gp, st);
      swiglu_rows(ep_gu_.data(), ep_act_.data(), ep_perm_w_.as<float>(), m);
      gp.x = ep_act_.data();
      gp.ldx = I;
      gp.x_rows = nullptr;
      gp.w = M.tables.w2;
      gp.scale = M.tables.w2_scale;
      gp.N = D;
      gp.K = I;
      gp.y = ep_ye_.data();
      gp.ldy = D;
      gp.y_dtype = DType::kF32;
      oc::grouped_gemm(gp, st);
    } else {
      ep_expert_gemms(M, seg, m);
    }
    std::vector<float> ye(static_cast<size_t>(m * D));
    dc::copy_d2h(ye.data(), ep_ye_.data(), ye.size() * 4, st, true);
    for (int64_t j = 0; j < m; ++j)
      std::memcpy(out_arrival.data() + j * D, ye.data() + comb[size_t(j)] * D, size_t(D) * 4);
  }
  std::vector<float> mine(static_cast<size_t>(T * K * D));
  ep_->give_back(out_arrival.data(), mine.data());
  if (T == 0) return;
  grow(ep_out_, mine.size() * 4, dev);
  grow(ep_comb_, size_t(T * K) * 8, dev);
  std::vector<int64_t> iota(static_cast<size_t>(T * K));
  std::iota(iota.begin(), iota.end(), int64_t(0));
  dc::copy_h2d(ep_out_.data(), mine.data(), mine.size() * 4, st, false);
  dc::copy_h2d(ep_comb_.data(), iota.data(), iota.size() * 8, st, true);  // host vectors die here
}

// The device path's received rows (arrival order, ep_recv_) through this rank's slots, all on
// the device: moe_route over their logical ids (one assignment per row: the same stable sort by
// expert as moe_route_host in the host-staged path), the GEMMs of the host-staged path, the
// outputs gathered back to arrival order and returned.
void CudaBackend::ep_experts_device(const MoeRef& M) {
  const Dims& g = arch_.dims;
  const int64_t D = g.hidden, I = g.moe_inter, E = g.experts, m = ep_recv_.rows;
  const int64_t ab = int64_t(dtype_bits(act_) / 8);
  const cudaStream_t st = stream_.get();
  const int dev = opts_.device;
  if (m > 0) {
    const int64_t max_tiles = oc::moe_route_max_tiles(m, E, oc::kGroupedTileM);
    grow(ep_seg_, size_t(E + 1) * 4, dev), grow(ep_perm_src_, size_t(m) * 8, dev), grow(ep_perm_w_, size_t(m) * 4, dev);
    grow(ep_comb_, size_t(m) * 8, dev), grow(ep_tiles_, size_t(max_tiles + 1) * 4, dev);
    grow(ep_gu_, size_t(m * 2 * I * ab), dev), grow(ep_act_, size_t(m * I * ab), dev), grow(ep_ye_, size_t(m * D) * 4, dev);
    grow(ep_out_, size_t(m * D) * 4, dev);
    int32_t* tiles = ep_tiles_.as<int32_t>();
    oc::moe_route({.ids = ep_recv_.logical, .weights = ep_recv_.weight, .tokens = m, .topk = 1, .experts = E,
                   .tile_m = oc::kGroupedTileM, .seg = ep_seg_.as<int32_t>(), .perm_src = ep_perm_src_.as<int64_t>(),
                   .perm_w = ep_perm_w_.as<float>(), .comb = ep_comb_.as<int64_t>(), .tiles = tiles,
                   .num_tiles = tiles + max_tiles, .max_tiles = max_tiles},
                  st);
    if (moe_path(M) == MoePath::kGrouped) {
      oc::GroupedGemmParams gp{.x = ep_recv_.x, .ldx = D, .x_rows = ep_perm_src_.as<int64_t>(), .w = M.tables.w13,
                               .scale = M.tables.w13_scale, .format = expert_format(M.tables.dtype),
                               .seg = ep_seg_.as<int32_t>(), .tiles = tiles, .num_tiles = tiles + max_tiles,
                               .max_tiles = max_tiles, .experts = E, .N = 2 * I, .K = D, .y = ep_gu_.data(),
                               .ldy = 2 * I, .y_dtype = act_};
      oc::grouped_gemm(gp, st);
      swiglu_rows(ep_gu_.data(), ep_act_.data(), ep_perm_w_.as<float>(), m);
      gp.x = ep_act_.data(), gp.ldx = I, gp.x_rows = nullptr, gp.w = M.tables.w2, gp.scale = M.tables.w2_scale;
      gp.N = D, gp.K = I, gp.y = ep_ye_.data(), gp.ldy = D, gp.y_dtype = DType::kF32;
      oc::grouped_gemm(gp, st);
    } else {
      // Exact numerics: per-expert cuBLASLt GEMMs over sorted rows; their shapes need the
      // segment offsets on the host (one small read-back, as one rank's exact path has).
      grow(ep_x_, size_t(m * D * ab), dev);
      cuda::gather_rows({.src_a = ep_recv_.x, .a_stride = D, .src_dtype = act_, .src_index = ep_perm_src_.as<int64_t>(),
                         .dst = ep_x_.data(), .dst_stride = D, .dst_dtype = act_, .rows = m, .width = D},
                        st);
      std::vector<int32_t> seg(size_t(E + 1));
      dc::copy_d2h(seg.data(), ep_seg_.data(), seg.size() * 4, st, true);
      if (seg[size_t(E)] != m)
        DI_THROW(InternalError, "expert-parallel rank ", ep_->rank(), ": layer ", M.ep_layer, " received ", m - seg[size_t(E)],
                 " rows for experts outside [0, ", E, ")");
      ep_expert_gemms(M, seg, m);
    }
    ep_gather_f32(ep_ye_.as<float>(), ep_comb_.as<int64_t>(), m, D, ep_out_.as<float>(), st);  // back to arrival order
  }
  ep_dev_->give_back(ep_out_.as<float>(), st);
}

void CudaBackend::ep_combine() {
  const Dims& g = arch_.dims;
  if (plan_.T == 0) return;
  if (ep_dev_) {
    cuda::moe_combine({.ye = ep_dev_->out(), .rows = ep_dev_->rows(), .shared = at<float>(L_.buf[size_t(Buf::kShared)]),
                       .out = at<float>(L_.buf[size_t(Buf::kY)]), .tokens = plan_.T, .topk = g.topk, .dim = g.hidden},
                      stream_.get());
    return;
  }
  cuda::moe_combine({.ye = ep_out_.as<float>(), .rows = ep_comb_.as<int64_t>(),
                     .shared = at<float>(L_.buf[size_t(Buf::kShared)]), .out = at<float>(L_.buf[size_t(Buf::kY)]),
                     .tokens = plan_.T, .topk = g.topk, .dim = g.hidden},
                    stream_.get());
}

}  // namespace deepinfer::model::ds::cuda
