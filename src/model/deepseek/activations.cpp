#include "model/deepseek/activations.h"

#include <algorithm>

#include "core/check.h"

namespace deepinfer::model::ds {

StepSizes step_sizes(const StepPlan& p) {
  StepSizes s;
  s.T = p.T;
  s.win_rows = int64_t(p.win_src.size());
  for (const auto& k : p.kinds) {
    s.stage_rows = std::max<int64_t>(s.stage_rows, int64_t(k.stage_src.size()));
    s.entries = std::max<int64_t>(s.entries, int64_t(k.entry_pos.size()));
  }
  s.R = int64_t(p.logits_rows.size());
  s.Rh = int64_t(p.hidden_rows.size());
  return s;
}

BufferSize buffer_size(Buf b, const Dims& g, const StepSizes& s, size_t A) {
  const int64_t T = s.T, D = g.hidden, n = g.streams, H = g.heads, d = g.head_dim, r = g.q_lora;
  const int64_t GR = g.o_groups * g.o_lora, E = g.experts, K = g.topk;
  const int64_t Hi = std::max<int64_t>(g.index_heads, 1), di = std::max<int64_t>(g.index_dim, 1);
  const int64_t topk = std::max<int64_t>(g.index_topk, 1);
  const int64_t cw = 2 * d, iw = 2 * di;  // widest compressor widths (overlapping)
  switch (b) {
    case Buf::kX: case Buf::kX2: return {T * n * D, 4};
    case Buf::kU: return {T * D, 4};
    case Buf::kMix: case Buf::kMix2: return {T * g.mix_dim(), 4};
    case Buf::kH: return {T * D, A};
    case Buf::kY: return {T * D, 4};
    case Buf::kQa: return {T * r, 4};
    case Buf::kQaN: return {T * r, A};
    case Buf::kQf: return {T * H * d, 4};
    case Buf::kQ: return {T * H * d, A};
    case Buf::kKvf: return {T * d, 4};
    case Buf::kKv: return {T * d, A};
    case Buf::kO: return {T * H * d, A};
    case Buf::kZo: return {T * GR, A};
    case Buf::kWin: return {s.win_rows * d, A};
    case Buf::kAz: return {T * 2 * cw, 4};
    case Buf::kStage: return {s.stage_rows * 2 * cw, 4};
    case Buf::kEnt: return {s.entries * d, 4};
    case Buf::kIaz: return {T * 2 * iw, 4};
    case Buf::kIstage: return {s.stage_rows * 2 * iw, 4};
    case Buf::kIent: return {s.entries * di, 4};
    case Buf::kEntAct: return {s.entries * d, A};
    case Buf::kQi: return {T * Hi * di, A};
    case Buf::kIw: return {T * Hi, 4};
    case Buf::kSelRows: return {T * topk, 4};
    case Buf::kSelCount: return {T, 4};
    case Buf::kCandBlocks: return {T * std::max<int64_t>(g.candidate_topk_blocks, 1), 4};
    case Buf::kEngramKv: return {g.engram ? T * (n + 1) * D : 1, 4};
    case Buf::kRouterLogits: return {T * E, 4};
    case Buf::kIds: case Buf::kWts: return {T * K, 4};
    case Buf::kShared: return {T * D, 4};
    case Buf::kSel: return {s.R * n * D, 4};
    case Buf::kHu: return {s.R * D, 4};
    case Buf::kHh: return {s.R * D, A};
    case Buf::kLogits: return {s.R * g.vocab, 4};
    case Buf::kHidden: return {s.Rh * g.hidden_elems(), 4};
    case Buf::kHs: return {T * n * D, A};
    case Buf::kTaps: return {g.taps > 0 ? T * g.taps * D : 1, 4};
    case Buf::kCount: break;
  }
  DI_CHECK(false, "buffer_size of an unknown buffer ", int(b));
  return {};
}

}  // namespace deepinfer::model::ds
