// Layout of the per-forward device workspace (one growable allocation, carved by offsets).
// The same function sizes it for a real step and for the memory plan's worst case, so the plan
// and the forward cannot disagree. Pure host code.
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/deepseek_v4/config.h"

namespace deepinfer::model::v4::gpu {

struct ArenaSizes {
  int64_t T = 0;            // new tokens
  int64_t win_rows = 0;     // staged window rows
  int64_t stage_rows = 0;   // max staged compressor rows over kinds
  int64_t entries = 0;      // max emitted entries over kinds
  int64_t max_cand = 0;     // max candidates of a token (CSA indexer scores)
  int64_t attn_splits = 1;  // split-KV splits of the attention
  int64_t R = 0;            // logits rows
  size_t act_bytes = 2;     // bytes of the "bf16" buffers below: 2 (bf16), 4 in exact numerics (f32)
};

// Byte offsets into the arena; every buffer 256-byte aligned. Shapes as in the forward; "bf16"
// buffers hold the numerics mode's storage dtype (f32 in exact mode, sized by act_bytes).
struct ArenaLayout {
  size_t X, X2, u, mix, hc_ws;               // f32 [T,n,D] x2, f32 [T,D], f32 [T,mix], bytes
  size_t h, y;                               // bf16 [T,D], f32 [T,D]
  size_t qa, qa_bf, qf, q, kvf, kv, o, zo;   // f32 [T,r], bf16 [T,r], f32/bf16 [T,H*d], f32/bf16 [T,d], bf16 [T,H*d], bf16 [T,G*R]
  size_t win, attn_ws;                       // bf16 [win_rows,d], bytes
  size_t az, stage, ent;                     // f32 [T,2c], [stage_rows,2c], [entries,d]
  size_t iaz, istage, ient, qi, iw, scores, sel_rows, sel_count;
  size_t logits_r, ids, wts;                 // router f32 [T,E], i32 [T,K], f32 [T,K]
  size_t xe, gu, act, ye, sh, perm_src, comb_rows, perm_w;  // MoE
  size_t moe_seg, moe_tiles, moe_ntiles;     // device permutation: i32 [E+1], [max tiles], [1]
  size_t sel, hu, hh, logits, head_ws;       // head
  // Dense FP8 linears (cuda_plan.h device_dense_fp8; carved whenever the config has them in the
  // bf16 modes): T <= kDenseFp8PrefillM: gemm_fp8w's K-split workspace (f32, the largest of the
  // layer's linears, for up to kArenaMaxSms SMs); above: bf16 scratch for the largest linear.
  size_t fp8_ws, fp8_ws_bytes, wdq, wdq_bytes;
  size_t total;
};

constexpr int kArenaMaxSms = 256;  // SM count the FP8 GEMM workspace is sized for

ArenaLayout layout_arena(const DeepseekV4Config& cfg, const ArenaSizes& s);

}  // namespace deepinfer::model::v4::gpu
