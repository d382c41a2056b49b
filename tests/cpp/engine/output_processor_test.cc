// OutputProcessor: a request whose text processing fails ends alone with an error.
#include <gtest/gtest.h>

#include "core/check.h"
#include "engine/output_processor.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
// Bytes are the id as a letter; id 99 cannot be decoded.
class FlakyCodec final : public TextCodec {
 public:
  std::vector<int32_t> encode(std::string_view) const override { return {}; }
  std::string token_bytes(int32_t id) const override {
    if (id == 99) DI_THROW(TokenizerError, "token_bytes: id 99 has no text");
    return std::string(1, char('a' + id % 26));
  }
  bool is_special(int32_t) const override { return false; }
  std::string chat_prompt(const std::vector<ChatMessage>&, const ChatTemplateOptions&) const override { return {}; }
};
}  // namespace

TEST(OutputProcessor, FailingTokenEndsOnlyItsRequest) {
  FlakyCodec codec;
  OutputProcessor proc(&codec);
  auto prompt = std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>{1, 2});
  auto params = std::make_shared<const SamplingParams>();
  proc.add("bad", "p", prompt, params, {10}, 0.0);
  proc.add("good", "p", prompt, params, {11}, 0.0);

  // The failing token is found before update() commits: the scheduler then ends the sequence
  // at that token, and process() reports the error for that request only.
  ModelRunnerOutput step;
  step.sampled = {{.seq_id = 10, .tokens = {0, 99, 3}}, {.seq_id = 11, .tokens = {1, 2}}};
  std::vector<StopEvent> stops = proc.scan_stops(step);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].seq_id, 10);
  EXPECT_EQ(stops[0].token_index, 1);
  EXPECT_TRUE(stops[0].error);
  SeqUpdate bad{.seq_id = 10, .new_token_ids = {0, 99}, .finished = true, .finish_reason = 3};
  SeqUpdate good{.seq_id = 11, .new_token_ids = {1, 2}};
  OutputProcessor::Result r = proc.process({bad, good}, 1.0);
  ASSERT_EQ(r.outputs.size(), 2u);
  for (const RequestOutput& o : r.outputs) {
    if (o.request_id == "bad") {
      EXPECT_TRUE(o.finished);
      EXPECT_NE(o.error.find("id 99"), std::string::npos) << o.error;
      EXPECT_EQ(o.outputs.at(0).finish_reason, "error");
    } else {
      EXPECT_TRUE(o.error.empty());
      EXPECT_FALSE(o.finished);
      EXPECT_EQ(o.outputs.at(0).text, "bc");
    }
  }
  // The good request keeps going after the failure.
  SeqUpdate more{.seq_id = 11, .new_token_ids = {3}, .finished = true, .finish_reason = 0};
  r = proc.process({more}, 2.0);
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(r.outputs[0].outputs.at(0).text, "bcd");
  EXPECT_TRUE(r.outputs[0].finished);
}

// A stop string inside a multi-token step: scan_stops names the token that completes it
// (across token boundaries, from text of earlier steps), and nothing changes until process().
TEST(OutputProcessor, ScanFindsStopInsideAcceptedRun) {
  FlakyCodec codec;  // id -> 'a' + id % 26
  OutputProcessor proc(&codec);
  auto prompt = std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>{1});
  auto params = std::make_shared<SamplingParams>();
  params->stop = {"cde"};
  proc.add("r", "p", prompt, params, {5}, 0.0);
  proc.process({SeqUpdate{.seq_id = 5, .new_token_ids = {0, 1, 2}}}, 1.0);  // "abc": "c" may start the stop
  ModelRunnerOutput step;
  step.sampled = {{.seq_id = 5, .tokens = {3, 4, 5, 6}}};  // "defg": "cde" completes at token 1
  for (int pass = 0; pass < 2; ++pass) {  // side-effect free: the same answer twice
    std::vector<StopEvent> stops = proc.scan_stops(step);
    ASSERT_EQ(stops.size(), 1u);
    EXPECT_EQ(stops[0].token_index, 1);
    EXPECT_FALSE(stops[0].error);
  }
  auto r = proc.process({SeqUpdate{.seq_id = 5, .new_token_ids = {3, 4}, .finished = true, .finish_reason = 1}}, 2.0);
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(r.outputs[0].outputs.at(0).text, "ab");
  EXPECT_EQ(r.outputs[0].outputs.at(0).finish_reason, "stop");
  EXPECT_EQ(r.outputs[0].outputs.at(0).stop_string, "cde");
  EXPECT_EQ(r.outputs[0].outputs.at(0).token_ids, (std::vector<int32_t>{0, 1, 2, 3, 4}));
}
