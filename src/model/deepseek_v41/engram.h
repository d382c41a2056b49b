// Engram hashing (MODEL-DEEPSEEK-V41.md §5, V41-REFERENCE-NOTES.md §5): which table rows a token
// reads. Everything here depends on token ids only, so rows can be gathered as soon as the tokens
// of a step are known (prompt rows before layer 0, verify rows once the drafts exist).
//
//  - Buckets: per Engram layer, (N-1) x H prime-sized buckets in (n-gram size, head) order. Primes
//    are taken in order above engram_vocab_size - 1 and never reused across buckets or layers;
//    offsets are the running sums inside the layer; a layer's table has sum(primes) rows.
//  - Classes: token t hashes as class(t) from the sidecar's class map (built from the tokenizer
//    exactly as the reference does, by tools/make_engram_sidecar.py). Ids the tokenizer does not
//    have (num_ids <= t < vocab_size, vocabulary padding) hash as the pad token's class.
//  - Position t, look-back i = 0..N-1: tok_i = class(token t-i); once t-i < 0 or a DEAD token is
//    met (i included), tok_i and every longer look-back are class(engram_pad_id).
//    H_n = XOR_{i<n} tok_i * mult[i] (int64, cannot overflow: mult < 2 * (int64max / C) / 2);
//    row[n, h] = H_n mod prime[n, h] + offset[n, h], for n = 2..N.
//  - Multipliers: numpy default_rng(10007 * layer) draws, frozen in the sidecar (never recomputed
//    here); the released checkpoint's are also compiled in below and must match.
//  - History: what a sequence carries between steps is the class of its last N-1 tokens
//    (kBlocked before the start and for DEAD tokens): `EngramHistory`, a few ints. It is a pure
//    function of the last N-1 committed tokens, so rollback and prefix-cache hits restore it with
//    `history_after` (no log needed).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/deepseek_v41/config.h"

namespace deepinfer::model::v41 {

// Primes of each Engram layer: [layers][(N-1) * H], (n-gram size, head) order.
std::vector<std::vector<int64_t>> engram_primes(const EngramConfig& e);
// Deterministic Miller-Rabin for any 64-bit value.
bool is_prime_u64(uint64_t n);

// The released checkpoint's multipliers (layers 1 and 14, 4-grams, 99,092 classes; §5), checked
// against numpy by tests/python/test_engram_sidecar.py. A sidecar for that config must hold these.
inline constexpr int64_t kReleaseEngramLayers[2] = {1, 14};
inline constexpr int64_t kReleaseEngramClasses = 99092;
inline constexpr int64_t kReleaseMultipliers[2][4] = {
    {76632096046245, 4839876093313, 35959672319349, 73987337458391},
    {67716810739261, 51510806800915, 30921347202721, 82619226485591}};

// engram_sidecar.json (written by tools/make_engram_sidecar.py; format in tools/golden_lib/v41engram.py).
struct EngramSidecar {
  static constexpr const char* kFileName = "engram_sidecar.json";
  std::string path, source, tokenizer_sha256;
  int64_t num_ids = 0, num_classes = 0, max_ngram_size = 0;
  std::vector<int32_t> classes;                                      // [num_ids]
  std::vector<std::pair<int64_t, std::vector<int64_t>>> multipliers; // (layer, [max_ngram_size])

  // Parses and checks the file on its own (first-appearance class numbering, odd multipliers);
  // throws CheckpointError naming the path and key.
  static EngramSidecar from_file(const std::string& path);
  static EngramSidecar from_json_string(const std::string& text, const std::string& origin);
};

struct EngramHistory {
  static constexpr int32_t kBlocked = -1;
  std::vector<int32_t> recent;  // [N-1]: class of token t-1, t-2, ..., or kBlocked
};

class EngramHasher {
 public:
  // Checks the sidecar against the config (class count = engram_compressed_vocab_size, num_ids <=
  // vocab_size, n-gram size, multipliers for exactly the Engram layers, each odd and in range, the
  // release values for the release config); throws CheckpointError naming the sidecar.
  EngramHasher(const DeepseekV41Config& c, EngramSidecar s);
  // `<model_dir>/engram_sidecar.json`; a missing file is a CheckpointError saying how to make it.
  static EngramHasher load(const DeepseekV41Config& c, const std::string& model_dir);

  int64_t num_layers() const { return int64_t(layers_.size()); }
  int64_t num_columns() const { return (n_ - 1) * heads_; }  // rows per position and layer
  int64_t max_ngram() const { return n_; }
  int64_t layer_id(int64_t i) const { return layers_[size_t(i)].id; }
  const std::vector<int64_t>& primes(int64_t i) const { return layers_[size_t(i)].primes; }
  const std::vector<int64_t>& offsets(int64_t i) const { return layers_[size_t(i)].offsets; }
  const std::vector<int64_t>& multipliers(int64_t i) const { return layers_[size_t(i)].mult; }
  int32_t pad_class() const { return pad_class_; }
  // Throws InvalidArgument outside [0, vocab_size).
  int32_t class_of(int32_t token) const;

  EngramHistory start() const;  // before the first token of a sequence
  // The history after a sequence whose last tokens are tokens[0..n) (oldest first; pass the last
  // N-1, or all of them when the sequence is shorter); dead[i] != 0 marks a DEAD token (may be null).
  EngramHistory history_after(const int32_t* tokens, int64_t n, const uint8_t* dead) const;
  // Row ids of T tokens that follow `h`: out [T, num_layers, num_columns]; advances `h`.
  void row_ids(EngramHistory& h, const int32_t* tokens, int64_t T, const uint8_t* dead, int64_t* out) const;

 private:
  struct Layer {
    int64_t id = 0;
    std::vector<int64_t> primes, offsets, mult;  // [(N-1)H], [(N-1)H], [N]
  };
  std::vector<Layer> layers_;
  std::vector<int32_t> classes_;
  int64_t n_ = 0, heads_ = 0, vocab_ = 0;
  int32_t pad_class_ = 0;
};

}  // namespace deepinfer::model::v41
