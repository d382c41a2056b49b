// The public API's values on the wire between the ranks of a data-parallel engine: the LLM's
// config (the driver hands it to the workers it starts), prompts and sampling parameters (new
// requests), request outputs (what the ranks send back). Every field is written; a static size
// check in codec.cpp fails the build when a struct gains a field the codec does not know.
#pragma once
#include "deepinfer/llm.h"
#include "parallel/wire.h"

namespace deepinfer::engine::dp {

void put(parallel::WireWriter& w, const LLMConfig& c);
void put(parallel::WireWriter& w, const PromptInput& p);
void put(parallel::WireWriter& w, const SamplingParams& p);
void put(parallel::WireWriter& w, const RequestOutput& o);

LLMConfig get_llm_config(parallel::WireReader& r);
PromptInput get_prompt(parallel::WireReader& r);
SamplingParams get_sampling_params(parallel::WireReader& r);
RequestOutput get_request_output(parallel::WireReader& r);

}  // namespace deepinfer::engine::dp
