// DeepseekV41Config: both layouts of the goldens, the released values (MODEL-DEEPSEEK-V41.md §1),
// transformers' defaults, and a refusal naming the key for every value or layout it does not take.
#include "model/deepseek_v41/config.h"

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "deepinfer/error.h"
#include "test_util.h"

namespace deepinfer::model::v41 {
namespace {
using json = nlohmann::json;
using v41_test::error_of;
using v41_test::golden;

using v41_test::release_json;

DeepseekV41Config parse(const json& j) { return DeepseekV41Config::from_json_string(j.dump(), "config.json"); }

json fixture_json(const std::string& name) {
  const auto p = golden(name) / "config.json";
  if (!std::filesystem::exists(p)) return json();
  return json::parse(v41_test::read_text(p));
}

TEST(V41Config, ReleaseValues) {
  const DeepseekV41Config c = parse(release_json());
  EXPECT_EQ(c.layout, ConfigLayout::kRelease);
  EXPECT_EQ(c.num_layers, 40);
  EXPECT_EQ(c.dspark.num_stages, 3);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.dense_format, WeightFormat::kFP8Block);
  EXPECT_EQ(c.expert_format, WeightFormat::kFP4);
  EXPECT_EQ(c.fp8_block_out, 32);
  EXPECT_EQ(c.image_token_id, 129264);
  EXPECT_TRUE(c.vision.present);
  EXPECT_EQ(c.vision.num_layers, 32);
  EXPECT_TRUE(c.compress_rope.yarn);
  EXPECT_EQ(c.compress_rope.factor, 16.0);
  EXPECT_EQ(c.compress_rope.original_max_position, 65536);
  EXPECT_FALSE(c.rope.yarn);
  EXPECT_EQ(c.engram.pad_id, 2);
  EXPECT_EQ(c.engram.num_columns(), 24);
  std::string want = "S S";
  for (int l = 2; l < 40; ++l) {
    const bool kv = l == 2 || l == 8 || l == 14 || l == 20, reindex = l >= 24 && l <= 36 && l % 4 == 0;
    want += kv ? (l == 20 ? " F*" : " F") : reindex ? " Xc" : " R";
  }
  EXPECT_EQ(c.schedule_str(), want);
  // Reuse layers read the closest source at or below; decoder reuse layers read the reindex top-k.
  EXPECT_EQ(c.roles[3].kv_source, 2);
  EXPECT_EQ(c.roles[3].topk_source, 2);
  EXPECT_EQ(c.roles[25].kv_source, 20);
  EXPECT_EQ(c.roles[25].topk_source, 24);
  EXPECT_EQ(c.roles[24].role, LayerRole::kReindex);
  EXPECT_TRUE(c.roles[24].uses_candidates);
  EXPECT_FALSE(c.roles[20].uses_candidates);
  EXPECT_TRUE(c.roles[20].candidate_source);
  EXPECT_TRUE(c.roles[1].engram && c.roles[14].engram && !c.roles[2].engram);
  EXPECT_TRUE(c.roles[37].dspark_target && c.roles[39].dspark_target && !c.roles[36].dspark_target);
  EXPECT_TRUE(c.routing_normalized());
  EXPECT_NE(c.summary().find("candidates from layer 20: 2048 blocks of 8"), std::string::npos);
}

TEST(V41Config, GoldenLayoutsAgree) {
  for (const char* name : {"v41_a", "v41_b"}) {
    const auto dir = golden(name);
    if (!std::filesystem::exists(dir / "config.json")) GTEST_SKIP() << dir << " absent";
    const DeepseekV41Config hf = DeepseekV41Config::from_file(dir.string());
    const DeepseekV41Config rel = DeepseekV41Config::from_file(golden(std::string(name) + "_release").string());
    EXPECT_EQ(hf.layout, ConfigLayout::kTransformers);
    EXPECT_EQ(rel.layout, ConfigLayout::kRelease);
    EXPECT_EQ(hf.schedule_str(), rel.schedule_str());
    EXPECT_EQ(hf.compress_ratios, rel.compress_ratios);
    EXPECT_EQ(hf.engram.num_embeddings, rel.engram.num_embeddings);
    EXPECT_EQ(hf.engram.pad_id, rel.engram.pad_id);
    EXPECT_EQ(hf.compress_rope.yarn, rel.compress_rope.yarn);
    EXPECT_EQ(hf.compress_rope.factor, rel.compress_rope.factor);
    EXPECT_EQ(hf.compress_rope.theta, rel.compress_rope.theta);
    EXPECT_EQ(hf.rope.theta, rel.rope.theta);
    EXPECT_EQ(hf.gate_temp, rel.gate_temp);
    EXPECT_EQ(hf.dense_format, WeightFormat::kBF16);
    EXPECT_EQ(rel.dense_format, WeightFormat::kFP8Block);
    EXPECT_EQ(rel.expert_format, WeightFormat::kFP4);
  }
  const DeepseekV41Config a = DeepseekV41Config::from_file(golden("v41_a").string());
  EXPECT_EQ(a.schedule_str(), "S S F X F R F* R Xc R");
  // The release fixture of a carries three DSpark stages (transformers' layout has none).
  const DeepseekV41Config ar = DeepseekV41Config::from_file(golden("v41_a_release").string());
  EXPECT_EQ(a.dspark.num_stages, 0);
  EXPECT_EQ(ar.dspark.num_stages, 3);
  EXPECT_EQ(ar.dspark.block_size, 4);
  EXPECT_TRUE(ar.roles[7].dspark_target && ar.roles[9].dspark_target && !ar.roles[6].dspark_target);
  EXPECT_EQ(a.candidate_topk_blocks, 2);
  const DeepseekV41Config b = DeepseekV41Config::from_file(golden("v41_b").string());
  EXPECT_EQ(b.schedule_str(), "S F R F R F X* R Xc S");
  EXPECT_EQ(b.roles[6].kv_source, 5);
  EXPECT_EQ(b.roles[7].topk_source, 6);
  EXPECT_EQ(b.hc_sinkhorn_iters, 7);
  EXPECT_EQ(b.swiglu_limit, 1.0);
}

TEST(V41Config, PadKeyEitherSpelling) {
  json j = release_json();
  j["text_config"]["engram_pad_token_id"] = 5;
  EXPECT_EQ(parse(j).engram.pad_id, 5);
  j["text_config"].erase("engram_pad_token_id");
  j["text_config"]["engram_pad_id"] = 7;
  EXPECT_EQ(parse(j).engram.pad_id, 7);
  j["text_config"]["engram_pad_token_id"] = 7;  // both, agreeing
  EXPECT_EQ(parse(j).engram.pad_id, 7);
  j["text_config"]["engram_pad_token_id"] = 8;
  V41_EXPECT_HAS(error_of<ConfigError>([&] { parse(j); }), "'text_config.engram_pad_id'");
}

TEST(V41Config, TransformersDefaultsForMissingLists) {
  json j = release_json();
  for (const char* k : {"kv_source_layer_ids", "index_source_layer_ids", "candidate_source_layer_id",
                        "dspark_target_layer_ids"})
    j["text_config"].erase(k);
  DeepseekV41Config c = parse(j);
  EXPECT_EQ(c.kv_source_layer_ids, (std::vector<int64_t>{2, 8, 14, 20}));
  EXPECT_EQ(c.index_source_layer_ids, (std::vector<int64_t>{2, 8, 14, 20, 24, 28, 32, 36}));
  EXPECT_EQ(c.candidate_source_layer_id, 20);
  EXPECT_EQ(c.dspark.target_layer_ids, (std::vector<int64_t>{37, 38, 39}));
  // A custom schedule: the first layer of each run of equal ratios is the source.
  j["text_config"]["compress_ratios"] = {0, 2, 2, 1, 1, 1};
  j["text_config"]["num_hidden_layers"] = 6;
  j["text_config"]["num_nextn_predict_layers"] = 0;
  j["text_config"]["engram_layer_ids"] = json::array();
  j["text_config"]["engram_num_embeddings"] = json::array();
  c = parse(j);
  EXPECT_EQ(c.kv_source_layer_ids, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(c.index_source_layer_ids, c.kv_source_layer_ids);
  EXPECT_EQ(c.schedule_str(), "S F R F* R R");
}

TEST(V41Config, TopOneRoutingIsNotNormalized) {
  json j = release_json();
  j["text_config"]["num_experts_per_tok"] = 1;
  EXPECT_FALSE(parse(j).routing_normalized());
}

struct Refusal {
  const char* what;
  std::function<void(json&)> edit;  // applied to the release config
  const char* key;                  // must appear in the message
};

std::vector<Refusal> refusals() {
  auto t = [](json& j) -> json& { return j["text_config"]; };
  return {
      {"two kv heads", [&](json& j) { t(j)["num_key_value_heads"] = 2; }, "text_config.num_key_value_heads"},
      {"softmax router", [&](json& j) { t(j)["scoring_func"] = "softmax"; }, "text_config.scoring_func"},
      {"two shared experts", [&](json& j) { t(j)["n_shared_experts"] = 2; }, "text_config.n_shared_experts"},
      {"gelu", [&](json& j) { t(j)["hidden_act"] = "gelu"; }, "text_config.hidden_act"},
      {"attention bias", [&](json& j) { t(j)["attention_bias"] = true; }, "text_config.attention_bias"},
      {"yarn mscale", [&](json& j) { t(j)["rope_scaling"]["attention_factor"] = 0.7; }, "text_config.rope_scaling.attention_factor"},
      {"yarn truncate", [&](json& j) { t(j)["rope_scaling"]["truncate"] = false; }, "text_config.rope_scaling.truncate"},
      {"linear rope", [&](json& j) { t(j)["rope_scaling"]["type"] = "linear"; }, "text_config.rope_scaling.rope_type"},
      {"unknown rope key", [&](json& j) { t(j)["rope_scaling"]["low_freq_factor"] = 1; }, "text_config.rope_scaling.low_freq_factor"},
      {"unknown text key", [&](json& j) { t(j)["attention_chunk"] = 4; }, "text_config.attention_chunk"},
      {"unknown top key", [&](json& j) { j["yoco_mode"] = "x"; }, "'yoco_mode'"},
      {"kv source after candidate", [&](json& j) { t(j)["candidate_source_layer_id"] = 14; },
       "KV source 20 comes after the candidate source 14"},
      {"candidate not an index source", [&](json& j) { t(j)["candidate_source_layer_id"] = 21; },
       "text_config.candidate_source_layer_id"},
      {"consumer ratio differs", [&](json& j) { t(j)["compress_ratios"][5] = 1; }, "text_config.compress_ratios[5]"},
      {"kv source not index source",
       [&](json& j) { t(j)["index_source_layer_ids"] = {2, 14, 20, 24, 28, 32, 36}; }, "text_config.kv_source_layer_ids[1]"},
      {"index source without a branch", [&](json& j) { t(j)["index_source_layer_ids"] = {1, 2, 8, 14, 20}; },
       "text_config.index_source_layer_ids[0]"},
      {"compressed layer with no source", [&](json& j) { t(j)["compress_ratios"][1] = 2; }, "text_config.compress_ratios[1]"},
      {"ids not ascending", [&](json& j) { t(j)["kv_source_layer_ids"] = {2, 14, 8, 20}; }, "text_config.kv_source_layer_ids[2]"},
      {"kv source out of range", [&](json& j) { t(j)["kv_source_layer_ids"] = {2, 8, 14, 40}; }, "text_config.kv_source_layer_ids[3]"},
      {"drafter ratio", [&](json& j) { t(j)["compress_ratios"][41] = 2; }, "text_config.compress_ratios[41]"},
      {"ratios too short", [&](json& j) { t(j)["compress_ratios"].erase(t(j)["compress_ratios"].begin() + 39, t(j)["compress_ratios"].end()); },
       "text_config.compress_ratios"},
      {"engram head dim", [&](json& j) { t(j)["engram_head_dim"] = 48; }, "text_config.engram_head_dim"},
      {"engram rows list", [&](json& j) { t(j)["engram_num_embeddings"] = {1}; }, "text_config.engram_num_embeddings"},
      {"engram rows != primes", [&](json& j) { t(j)["engram_num_embeddings"][1] = 384016681; },
       "text_config.engram_num_embeddings[1]"},
      {"engram vocab moves the primes", [&](json& j) { t(j)["engram_vocab_size"] = 16000058; },
       "text_config.engram_num_embeddings[0]"},
      {"engram 1-gram", [&](json& j) { t(j)["engram_max_ngram_size"] = 1; }, "text_config.engram_max_ngram_size"},
      {"engram classes > vocab", [&](json& j) { t(j)["engram_compressed_vocab_size"] = 200000; },
       "text_config.engram_compressed_vocab_size"},
      {"block size", [&](json& j) { j["quantization_config"]["weight_block_size"] = {128, 64}; },
       "quantization_config.weight_block_size"},
      {"scale fmt", [&](json& j) { j["quantization_config"]["scale_fmt"] = "e4m3"; }, "quantization_config.scale_fmt"},
      {"expert dtype", [&](json& j) { j["quantization_config"]["expert_dtype"] = "int4"; }, "quantization_config.expert_dtype"},
      {"vocab type", [&](json& j) { t(j)["vocab_size"] = "big"; }, "text_config.vocab_size"},
      {"missing head_dim", [&](json& j) { t(j).erase("head_dim"); }, "text_config.head_dim"},
      {"noise token", [&](json& j) { t(j)["dspark_noise_token_id"] = 129280; }, "text_config.dspark_noise_token_id"},
      {"dspark targets", [&](json& j) { t(j)["dspark_target_layer_ids"] = {37, 38, 40}; }, "text_config.dspark_target_layer_ids[2]"},
      {"model type", [&](json& j) { j["model_type"] = "deepseek_v4"; }, "'model_type'"},
      {"architecture", [&](json& j) { j["architectures"] = {"DeepseekV4ForCausalLM"}; }, "'architectures'"},
      {"sinkhorn 0", [&](json& j) { t(j)["hc_sinkhorn_iters"] = 0; }, "text_config.hc_sinkhorn_iters"},
      {"gate temp", [&](json& j) { t(j)["gate_temp"] = 0; }, "text_config.gate_temp"},
      {"index dim < rope", [&](json& j) { t(j)["index_head_dim"] = 32; }, "text_config.index_head_dim"},
      {"heads vs groups", [&](json& j) { t(j)["o_groups"] = 7; }, "text_config.o_groups"},
      {"vision key", [&](json& j) { j["vision_config"]["spatial_merge"] = 2; }, "vision_config.spatial_merge"},
      {"vision dims", [&](json& j) { j["vision_config"]["patch_size"] = 0; }, "vision_config.patch_size"},
      {"candidate blocks", [&](json& j) { t(j)["candidate_topk_blocks"] = 0; }, "text_config.candidate_topk_blocks"},
  };
}

TEST(V41Config, RefusalsNameTheKey) {
  for (const Refusal& r : refusals()) {
    json j = release_json();
    r.edit(j);
    const std::string msg = error_of<ConfigError>([&] { parse(j); });
    EXPECT_NE(msg.find(r.key), std::string::npos) << r.what << ": " << msg;
    EXPECT_NE(msg.find("config.json"), std::string::npos) << r.what << ": " << msg;
  }
}

TEST(V41Config, FlatLayoutChecks) {
  json j = fixture_json("v41_a");
  if (j.is_null()) GTEST_SKIP() << "v41_a absent";
  EXPECT_NO_THROW(parse(j));
  json bad = j;
  bad["layer_types"][3] = "shared_compressed_attention";
  V41_EXPECT_HAS(error_of<ConfigError>([&] { parse(bad); }), "'layer_types[3]'");
  bad = j;
  bad["rope_parameters"]["compress"]["partial_rotary_factor"] = 0.5;
  V41_EXPECT_HAS(error_of<ConfigError>([&] { parse(bad); }), "'rope_parameters.compress.partial_rotary_factor'");
  bad = j;
  bad["rope_parameters"]["main"]["rope_type"] = "yarn";
  bad["rope_parameters"]["main"]["original_max_position_embeddings"] = 32;
  V41_EXPECT_HAS(error_of<ConfigError>([&] { parse(bad); }), "'rope_parameters.main.rope_type'");
  bad = j;
  bad["rope_parameters"]["compress"]["rope_theta"] = 5000.0;  // rope_parameters wins, as in transformers
  EXPECT_EQ(parse(bad).compress_rope.theta, 5000.0);
  bad = j;
  bad["model_type"] = "deepseek_v41";  // composite type without text_config
  V41_EXPECT_HAS(error_of<ConfigError>([&] { parse(bad); }), "'model_type'");
}

TEST(V41Config, HostileValues) {
  for (const char* v : {"1e400", "-1", "9223372036854775808", "4.5", "null", "[]", "{}"}) {
    json j = release_json();
    std::string text = j.dump();
    const std::string key = "\"sliding_window\":128";
    const size_t at = text.find(key);
    ASSERT_NE(at, std::string::npos);
    text.replace(at, key.size(), std::string("\"sliding_window\":") + v);
    const std::string msg = error_of<ConfigError>([&] { DeepseekV41Config::from_json_string(text, "c.json"); });
    EXPECT_TRUE(msg.find("sliding_window") != std::string::npos || msg.find("not valid JSON") != std::string::npos)
        << v << ": " << msg;
  }
}

}  // namespace
}  // namespace deepinfer::model::v41
