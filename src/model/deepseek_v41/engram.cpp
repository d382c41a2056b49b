// Engram buckets, the hasher and its history (engram.h).
#include "model/deepseek_v41/engram.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/check.h"

namespace deepinfer::model::v41 {
namespace {

uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m) { return uint64_t((unsigned __int128)a * b % m); }
uint64_t powmod(uint64_t a, uint64_t e, uint64_t m) {
  uint64_t r = 1;
  for (a %= m; e; e >>= 1, a = mulmod(a, a, m))
    if (e & 1) r = mulmod(r, a, m);
  return r;
}

// Bound on the multipliers that keeps class * multiplier inside int64: (int64max // C) // 2, as
// the reference draws r in [0, bound) and uses 2r + 1.
int64_t multiplier_bound(int64_t classes) { return std::max<int64_t>(1, (INT64_MAX / classes) / 2); }
}  // namespace

bool is_prime_u64(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t p : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int s = 0;
  while (d % 2 == 0) d /= 2, ++s;
  for (uint64_t a : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {  // deterministic below 3.3e24
    uint64_t x = powmod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int r = 1; r < s && composite; ++r) {
      x = mulmod(x, x, n);
      composite = x != n - 1;
    }
    if (composite) return false;
  }
  return true;
}

std::vector<std::vector<int64_t>> engram_primes(const EngramConfig& e) {
  std::vector<std::vector<int64_t>> out;
  std::set<int64_t> used;
  for (size_t l = 0; l < e.layer_ids.size(); ++l) {
    std::vector<int64_t> layer;
    for (int64_t n = 2; n <= e.max_ngram_size; ++n) {
      int64_t p = e.vocab_size - 1;  // each n-gram size restarts the search here; used primes are skipped
      for (int64_t h = 0; h < e.n_heads; ++h) {
        do ++p; while (!is_prime_u64(uint64_t(p)) || used.count(p));
        used.insert(p);
        layer.push_back(p);
      }
    }
    out.push_back(std::move(layer));
  }
  return out;
}

EngramHasher::EngramHasher(const DeepseekV41Config& c, EngramSidecar s) {
  const EngramConfig& e = c.engram;
  const std::string& f = s.path;
  if (s.num_classes != e.compressed_vocab_size)
    DI_THROW(CheckpointError, f, ": the class map has ", s.num_classes, " classes but config.json says "
             "engram_compressed_vocab_size = ", e.compressed_vocab_size, " (wrong tokenizer for this checkpoint?)");
  if (s.num_ids > c.vocab_size)
    DI_THROW(CheckpointError, f, ": num_ids ", s.num_ids, " exceeds the model's vocab_size ", c.vocab_size);
  if (s.max_ngram_size != e.max_ngram_size)
    DI_THROW(CheckpointError, f, ": max_ngram_size ", s.max_ngram_size, " but config.json says engram_max_ngram_size = ",
             e.max_ngram_size);
  if (s.multipliers.size() != e.layer_ids.size())
    DI_THROW(CheckpointError, f, ": multipliers for ", s.multipliers.size(), " layers, config.json has ",
             e.layer_ids.size(), " engram_layer_ids");
  const bool release = e.layer_ids == std::vector<int64_t>{1, 14} && e.max_ngram_size == 4 &&
                       e.compressed_vocab_size == kReleaseEngramClasses;
  const int64_t bound = multiplier_bound(e.compressed_vocab_size);
  const auto primes = engram_primes(e);
  for (size_t l = 0; l < e.layer_ids.size(); ++l) {
    const auto& [layer, mult] = s.multipliers[l];
    if (layer != e.layer_ids[l])
      DI_THROW(CheckpointError, f, ": multipliers[", l, "] is for layer ", layer, ", expected engram layer ", e.layer_ids[l]);
    for (size_t i = 0; i < mult.size(); ++i) {
      if (mult[i] < 1 || mult[i] % 2 == 0 || mult[i] > 2 * bound - 1)
        DI_THROW(CheckpointError, f, ": multipliers[", l, "].values[", i, "] = ", mult[i],
                 " is not an odd value in [1, ", 2 * bound - 1, "]");
      if (release && mult[i] != kReleaseMultipliers[l][i])
        DI_THROW(CheckpointError, f, ": multipliers[", l, "].values[", i, "] = ", mult[i], " differs from the released ",
                 kReleaseMultipliers[l][i]);
    }
    Layer L{layer, primes[l], {}, mult};
    int64_t total = 0;
    for (int64_t p : L.primes) L.offsets.push_back(std::exchange(total, total + p));
    layers_.push_back(std::move(L));
  }
  classes_ = std::move(s.classes);
  n_ = e.max_ngram_size;
  heads_ = e.n_heads;
  vocab_ = c.vocab_size;
  pad_class_ = class_of(int32_t(e.pad_id));
}

EngramHasher EngramHasher::load(const DeepseekV41Config& c, const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / EngramSidecar::kFileName).string();
  if (!std::filesystem::exists(path))
    DI_THROW(CheckpointError, path, ": missing. The model has Engram layers and needs the tokenizer's class map and "
             "hash multipliers: run `python3 tools/make_engram_sidecar.py ", model_dir, "` once (needs the "
             "`tokenizers` package)");
  return EngramHasher(c, EngramSidecar::from_file(path));
}

int32_t EngramHasher::class_of(int32_t token) const {
  if (token < 0 || token >= vocab_)
    DI_THROW(InvalidArgument, "engram: token id ", token, " is outside [0, vocab_size=", vocab_, ")");
  // Ids past the tokenizer (vocabulary padding) have no class in the reference: they hash as pad.
  return size_t(token) < classes_.size() ? classes_[size_t(token)] : pad_class_;
}

EngramHistory EngramHasher::start() const { return {std::vector<int32_t>(size_t(n_ - 1), EngramHistory::kBlocked)}; }

EngramHistory EngramHasher::history_after(const int32_t* tokens, int64_t n, const uint8_t* dead) const {
  EngramHistory h = start();
  for (int64_t i = 0; i < n_ - 1 && i < n; ++i) {  // recent[0] is the newest
    const int64_t t = n - 1 - i;
    h.recent[size_t(i)] = dead && dead[t] ? EngramHistory::kBlocked : class_of(tokens[t]);
  }
  return h;
}

void EngramHasher::row_ids(EngramHistory& h, const int32_t* tokens, int64_t T, const uint8_t* dead, int64_t* out) const {
  DI_CHECK(int64_t(h.recent.size()) == n_ - 1, "engram history of ", h.recent.size(), " entries for ", n_, "-grams");
  std::vector<int64_t> tok(static_cast<size_t>(n_));
  const int64_t cols = num_columns();
  for (int64_t t = 0; t < T; ++t) {
    const int32_t cur = dead && dead[t] ? EngramHistory::kBlocked : class_of(tokens[t]);
    bool blocked = false;
    for (int64_t i = 0; i < n_; ++i) {  // once blocked, every longer look-back is the pad class
      const int32_t src = i == 0 ? cur : h.recent[size_t(i - 1)];
      blocked = blocked || src == EngramHistory::kBlocked;
      tok[size_t(i)] = blocked ? pad_class_ : src;
    }
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& L = layers_[l];
      int64_t* o = out + (t * int64_t(layers_.size()) + int64_t(l)) * cols;
      int64_t rolling = tok[0] * L.mult[0];
      for (int64_t n = 2; n <= n_; ++n) {
        rolling ^= tok[size_t(n - 1)] * L.mult[size_t(n - 1)];
        for (int64_t hd = 0; hd < heads_; ++hd) {
          const size_t c = size_t((n - 2) * heads_ + hd);
          o[c] = rolling % L.primes[c] + L.offsets[c];
        }
      }
    }
    for (int64_t i = n_ - 2; i > 0; --i) h.recent[size_t(i)] = h.recent[size_t(i - 1)];
    if (n_ > 1) h.recent[0] = cur;
  }
}

}  // namespace deepinfer::model::v41
