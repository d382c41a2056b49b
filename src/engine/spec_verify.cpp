#include "engine/spec_verify.h"

#include "core/check.h"

namespace deepinfer::engine {

VerifyResult verify_drafts(std::span<const int32_t> drafts, std::span<const int32_t> target_draws,
                           DraftAcceptance rule) {
  DI_CHECK(rule == DraftAcceptance::kMatchTargetDraw, "unknown draft acceptance rule");
  DI_CHECK(target_draws.size() == drafts.size() + 1, "verify: ", target_draws.size(), " target rows for ",
           drafts.size(), " drafts");
  VerifyResult r;
  while (size_t(r.num_accepted) < drafts.size() && drafts[size_t(r.num_accepted)] == target_draws[size_t(r.num_accepted)])
    ++r.num_accepted;
  r.tokens.assign(target_draws.begin(), target_draws.begin() + r.num_accepted + 1);
  return r;
}

}  // namespace deepinfer::engine
