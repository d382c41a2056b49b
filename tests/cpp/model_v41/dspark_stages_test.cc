// DSparkDrafter with its stages behind DSparkStages (dspark_stages.h; the GPU model's path) on the
// CPU, through a recording fake: what the drafter hands the stages (feeds: slot, positions, tap rows,
// the first row written; blocks: ring range lo..last, anchor, drafts) after prefills, feeds past the
// ring's capacity, rollbacks and snapshot restores, how it maps the stages' results into proposals
// (confidence = sigma(c), draft logits), the snapshot framing (the rows the stages return, then the
// host trailer), a sampling picker (host tail over the stages' logits) and device-only tap rows.
// The device implementation itself is held to the host stages on the GPU (v41_dspark_gpu_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "deepinfer/error.h"
#include "model/deepseek_v41/model.h"
#include "test_util.h"

namespace {
using namespace deepinfer;
using namespace deepinfer::model;
using namespace deepinfer::model::v41;

struct Record {
  std::vector<DSparkFeed> feeds;
  std::vector<DSparkBlockSeq> blocks;
  std::vector<bool> greedy;
  const float* taps_device = nullptr;
  int64_t cap = 0, stages = 0, d = 0, V = 0, D = 0, B = 0;
  std::vector<std::vector<int64_t>> written;  // per call of write_ring: slot, lo, hi, first value
};

// Ring row value of (stage, position): checks the snapshot bytes carry the stages' rows.
float row_value(int64_t k, int64_t p, int64_t c) { return float(k * 1000 + p) + float(c) * 1e-3f; }

class FakeStages final : public DSparkStages {
 public:
  explicit FakeStages(std::shared_ptr<Record> r) : r_(std::move(r)) {}
  std::string describe() const override { return "fake"; }
  void feed(const HiddenRows& taps, const std::vector<DSparkFeed>& feeds) override {
    r_->taps_device = taps.device;
    r_->feeds.insert(r_->feeds.end(), feeds.begin(), feeds.end());
  }
  void block(const std::vector<DSparkBlockSeq>& seqs, bool greedy, bool want_logits, DSparkBlockOut& o) override {
    r_->blocks.insert(r_->blocks.end(), seqs.begin(), seqs.end());
    r_->greedy.push_back(greedy);
    const int64_t T = int64_t(seqs.size()) * r_->B;
    if (!greedy) {
      o.base.assign(size_t(T * r_->V), 0.f);
      o.xhat.assign(size_t(T * r_->D), 0.f);
      return;
    }
    for (int64_t t = 0; t < T; ++t) {
      const DSparkBlockSeq& q = seqs[size_t(t / r_->B)];
      o.tokens.push_back(int32_t((q.lo * 7 + q.last + t) % r_->V));
      o.logprobs.push_back(-0.5f - float(t));
      o.conf_logits.push_back(0.25f * float(t) - 1.f);
    }
    if (want_logits)
      for (int64_t i = 0; i < T * r_->V; ++i) o.logits.push_back(float(i % 97));
  }
  void read_ring(int32_t, int64_t lo, int64_t hi, float* dst) override {
    for (int64_t k = 0; k < r_->stages; ++k)
      for (int64_t p = lo; p < hi; ++p)
        for (int64_t c = 0; c < r_->d; ++c) *dst++ = row_value(k, p, c);
  }
  void write_ring(int32_t slot, int64_t lo, int64_t hi, const float* src) override {
    r_->written.push_back({slot, lo, hi, int64_t(src[0])});
    for (int64_t k = 0; k < r_->stages; ++k)
      for (int64_t p = lo; p < hi; ++p)
        for (int64_t c = 0; c < r_->d; ++c) EXPECT_EQ(*src++, row_value(k, p, c)) << "stage " << k << " pos " << p;
  }

 private:
  std::shared_ptr<Record> r_;
};

class DSparkStagesTest : public ::testing::Test {
 protected:
  static constexpr int64_t kRollback = 6;
  void SetUp() override {
    const std::string dir = v41_test::golden("v41_a_release").string();
    rec_ = std::make_shared<Record>();
    ModelOptions o{.max_rollback = kRollback};
    auto rec = rec_;
    o.dspark_stages = [rec](const DeepseekV41Config& c, const DSparkWeights&, int64_t cap,
                            bool) -> std::unique_ptr<DSparkStages> {
      rec->cap = cap, rec->stages = c.dspark.num_stages, rec->d = c.head_dim, rec->V = c.vocab_size;
      rec->D = c.hidden_size, rec->B = c.dspark.block_size;
      return std::make_unique<FakeStages>(rec);
    };
    model_ = DeepseekV41Model::load(dir, o);
    ASSERT_NE(model_->dspark(), nullptr);
    ASSERT_TRUE(model_->dspark()->stages_on_device());
    window_ = model_->config().sliding_window;
    taps_.rows = 64;
    taps_.row_elems = int64_t(model_->config().dspark.target_layer_ids.size()) * model_->config().hidden_size;
    taps_.host = Tensor::empty({taps_.rows, taps_.row_elems}, DType::kF32);
    std::fill_n(taps_.host.data<float>(), taps_.host.numel(), 0.5f);
  }
  std::vector<DraftProposal> round(int32_t slot, int64_t first, int64_t n, int32_t drafts, Tensor* lg = nullptr,
                                   DraftPicker* picker = nullptr) {
    DraftBatch b;
    DraftSeq s{.cache_slot = slot, .first_position = first, .num_positions = int32_t(n), .num_drafts = drafts,
               .first_hidden_row = first + 3};
    for (int64_t i = 0; i < n; ++i) s.next_tokens.push_back(int32_t((first + i) % 300));
    b.seqs = {s};
    b.target_hidden = taps_;
    b.picker = picker;
    return model_->dspark()->propose(b, lg);
  }
  std::shared_ptr<Record> rec_;
  std::unique_ptr<DeepseekV41Model> model_;
  HiddenRows taps_;
  int64_t window_ = 0;
};

TEST_F(DSparkStagesTest, FeedsBlocksAndResultsGoThroughTheStages) {
  const int64_t cap = rec_->cap, B = rec_->B;
  ASSERT_EQ(cap, window_ + kRollback);
  round(0, 0, 12, 0);
  ASSERT_EQ(rec_->feeds.size(), 1u);
  EXPECT_EQ(rec_->feeds[0].first_position, 0);
  EXPECT_EQ(rec_->feeds[0].first_row, 3);
  EXPECT_EQ(rec_->feeds[0].from, 0);
  EXPECT_EQ(rec_->feeds[0].num, 12);
  EXPECT_TRUE(rec_->blocks.empty()) << "no drafts asked: no block";
  // A feed longer than the ring writes only its last `cap` rows.
  round(1, 0, cap + 5, 0);
  EXPECT_EQ(rec_->feeds.back().from, 5);
  // A drafting round: the block reads the last `window` positions.
  Tensor lg;
  const std::vector<DraftProposal> p = round(0, 12, 1, int32_t(B), &lg);
  ASSERT_EQ(rec_->blocks.size(), 1u);
  const DSparkBlockSeq& q = rec_->blocks[0];
  EXPECT_EQ(q.slot, 0);
  EXPECT_EQ(q.last, 12);
  EXPECT_EQ(q.lo, 13 - window_);
  EXPECT_EQ(q.anchor, 12);
  EXPECT_EQ(q.num_drafts, B);
  EXPECT_TRUE(rec_->greedy[0]);
  ASSERT_EQ(p.size(), 1u);
  ASSERT_EQ(p[0].tokens.size(), size_t(B));
  const std::vector<float>& cl = model_->dspark()->last_confidence_logits();
  for (int64_t i = 0; i < B; ++i) {
    EXPECT_EQ(p[0].tokens[size_t(i)], int32_t((q.lo * 7 + q.last + i) % rec_->V));
    EXPECT_EQ(p[0].logprobs[size_t(i)], -0.5f - float(i));
    EXPECT_EQ(cl[size_t(i)], 0.25f * float(i) - 1.f);
    EXPECT_NEAR(p[0].confidence[size_t(i)], 1.0 / (1.0 + std::exp(-(0.25 * double(i) - 1.0))), 1e-7);
  }
  ASSERT_EQ(lg.numel(), B * rec_->V);
  EXPECT_EQ(lg.data<float>()[5], 5.f);
  // A rollback keeps older ring rows usable: a re-feed from 10 reads back to last - window + 1.
  model_->dspark()->rollback(0, 10);
  round(0, 10, 2, 2);
  EXPECT_EQ(rec_->feeds.back().first_position, 10);
  EXPECT_EQ(rec_->feeds.back().from, 0);
  EXPECT_EQ(rec_->blocks.back().last, 11);
  EXPECT_EQ(rec_->blocks.back().lo, 12 - window_);
}

TEST_F(DSparkStagesTest, SnapshotBytesAreTheStagesRowsAndRestoreIntoAnotherSlot) {
  round(0, 0, 20, 0);
  std::vector<uint8_t> bytes = {1, 2, 3};  // the model's own bytes come first
  model_->dspark()->append_snapshot(0, 20, bytes);
  const int64_t lo = 20 - window_, hi = 20;
  const size_t rows = size_t(rec_->stages * (hi - lo) * rec_->d);
  ASSERT_EQ(bytes.size(), 3 + rows * sizeof(float) + 3 * sizeof(int64_t));
  float first;
  std::memcpy(&first, bytes.data() + 3, sizeof(float));
  EXPECT_EQ(first, row_value(0, lo, 0));
  int64_t trailer[3];
  std::memcpy(trailer, bytes.data() + bytes.size() - sizeof(trailer), sizeof(trailer));
  EXPECT_EQ(trailer[0], lo);
  EXPECT_EQ(trailer[1], hi);
  model_->dspark()->take_snapshot(2, bytes);
  EXPECT_EQ(bytes, (std::vector<uint8_t>{1, 2, 3}));
  ASSERT_EQ(rec_->written.size(), 1u);
  EXPECT_EQ(rec_->written[0], (std::vector<int64_t>{2, lo, hi, int64_t(row_value(0, lo, 0))}));
  // The restored slot drafts over the restored range.
  round(2, 20, 1, 1);
  EXPECT_EQ(rec_->blocks.back().slot, 2);
  EXPECT_EQ(rec_->blocks.back().lo, 21 - window_);
}

struct FixedPicker final : DraftPicker {
  int calls = 0;
  int64_t vocab = 0;
  int32_t pick(size_t, int32_t, const float*, int64_t v) override { return ++calls, vocab = v, 7; }
};

TEST_F(DSparkStagesTest, SamplingPickerPicksOnTheHostAndDeviceTapsNeedNoCopy) {
  FixedPicker picker;
  round(0, 0, 9, 0);
  const std::vector<DraftProposal> p = round(0, 9, 1, 3, nullptr, &picker);
  EXPECT_FALSE(rec_->greedy.back()) << "a picker that samples gets the logits back";
  EXPECT_EQ(picker.calls, 3);
  EXPECT_EQ(picker.vocab, rec_->V);
  EXPECT_EQ(p[0].tokens, (std::vector<int32_t>{7, 7, 7}));
  ASSERT_EQ(p[0].confidence.size(), 3u);
  // Tap rows left on the device only: handed to the stages as they are (no host_taps copy).
  float fake_device_row = 0;
  taps_.host = Tensor();
  taps_.device = &fake_device_row;
  round(0, 10, 1, 1);
  EXPECT_EQ(rec_->taps_device, &fake_device_row);
  taps_.device = nullptr;
  EXPECT_THROW(round(0, 11, 1, 1), InvalidArgument) << "no tap rows at all";
}

}  // namespace
