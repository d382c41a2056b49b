// The KV bundle's wire codec and Engine::export_prefix / import_prefix (engine/kv_transfer.h).
#include "engine/kv_transfer.h"

#include <cstring>
#include <limits>

#include "core/check.h"
#include "deepinfer/error.h"
#include "engine/engine.h"
#include "parallel/wire.h"

namespace deepinfer::engine {
namespace {
constexpr char kMagic[8] = {'D', 'I', 'K', 'V', 'B', 'N', 'D', '1'};

}  // namespace

std::vector<uint8_t> encode_kv_bundle(const KvBundle& b) {
  if (b.on_device())
    DI_THROW(InvalidArgument, "KV bundle: its ", b.device_blocks.bytes, " block bytes are in device memory (device ",
             b.device_blocks.device, "), not encodable: export to the host or hand it over through cuda-ipc");
  // The layout: magic, hash_seed u64, block_tokens i64, block_bytes u64, tokens (u64 count + i32s),
  // blocks (u64 count + bytes), checkpoint.num_tokens i64, checkpoint bytes (u64 count + bytes).
  parallel::WireWriter w;
  w.put_raw(kMagic, sizeof kMagic);
  w.put(b.hash_seed);
  w.put(b.block_tokens);
  w.put(uint64_t(b.block_bytes));
  w.put_vec(b.tokens);
  w.put_vec(b.blocks);
  w.put(b.checkpoint.num_tokens);
  w.put_vec(b.checkpoint.bytes);
  return w.take();
}

KvBundle decode_kv_bundle(std::span<const uint8_t> bytes) {
  // From another server (the disaggregated hand-off): malformed input is InvalidArgument.
  parallel::WireReader r(bytes, "KV bundle", parallel::WireSource::kPeer);
  char magic[sizeof kMagic];
  r.get_raw(magic, sizeof magic, "magic");
  if (std::memcmp(magic, kMagic, sizeof magic) != 0) r.fail("bad magic (not a DIKVBND1 message)");
  KvBundle b;
  b.hash_seed = r.get<uint64_t>("hash_seed");
  b.block_tokens = r.get<int64_t>("block_tokens");
  b.block_bytes = size_t(r.get<uint64_t>("block_bytes"));
  b.tokens = r.get_vec<int32_t>("tokens");
  b.blocks = r.get_vec<uint8_t>("blocks");
  b.checkpoint.num_tokens = r.get<int64_t>("checkpoint.num_tokens");
  b.checkpoint.bytes = r.get_vec<uint8_t>("checkpoint");
  r.expect_done();
  if (b.empty()) return b;
  if (b.block_tokens <= 0 || b.num_tokens() % b.block_tokens != 0)
    DI_THROW(InvalidArgument, "KV bundle: ", b.num_tokens(), " tokens is not a whole number of ", b.block_tokens,
             "-token blocks");
  if (b.blocks.size() != size_t(b.num_tokens() / b.block_tokens) * b.block_bytes)
    DI_THROW(InvalidArgument, "KV bundle: blocks hold ", b.blocks.size(), " bytes, expected ",
             b.num_tokens() / b.block_tokens, " x ", b.block_bytes);
  if (b.checkpoint.num_tokens != b.num_tokens())
    DI_THROW(InvalidArgument, "KV bundle: checkpoint at ", b.checkpoint.num_tokens, " tokens, the prefix has ",
             b.num_tokens());
  return b;
}

KvBundle Engine::export_prefix(std::span<const int32_t> prompt, bool device) {
  KvBundle b;
  b.hash_seed = cache_->hash_seed();
  b.block_tokens = cache_->geometry().block_tokens;
  b.block_bytes = model_->paged_block_bytes();
  if (b.block_bytes == 0 || !scheduler_->prefix_cache().enabled()) return b;  // nothing exportable
  const PrefixMatch m = scheduler_->match_prefix(prompt);
  if (!m.checkpoint || m.blocks.empty()) return b;
  const int64_t n = int64_t(m.blocks.size()) * b.block_tokens;
  DI_CHECK(n == m.num_tokens && m.checkpoint->num_tokens == n, "export_prefix: match of ", m.num_tokens,
           " tokens over ", m.blocks.size(), " blocks");
  b.tokens.assign(prompt.begin(), prompt.begin() + n);
  b.checkpoint = *m.checkpoint;
  if (device) {
    if (model_->device_ordinal() < 0)
      DI_THROW(InvalidArgument, "export_prefix: a device bundle needs a GPU engine (", model_->describe(), ")");
    b.device_blocks = model_->allocate_device_memory(m.blocks.size() * b.block_bytes);
    model_->gather_blocks_to_device(m.blocks, b.device_blocks.data, nullptr);  // complete on return
    return b;
  }
  b.blocks.resize(m.blocks.size() * b.block_bytes);
  std::vector<model::HostBlockCopy> copies;
  for (size_t i = 0; i < m.blocks.size(); ++i) copies.push_back({m.blocks[i], b.blocks.data() + i * b.block_bytes});
  model_->copy_blocks_to_host(copies);
  return b;
}

int64_t Engine::import_prefix(const KvBundle& b) {
  if (b.empty()) return 0;
  const int64_t bt = cache_->geometry().block_tokens;
  if (b.hash_seed != cache_->hash_seed())
    DI_THROW(InvalidArgument, "KV bundle from another model or numerics (block hash seed ", b.hash_seed, ", this engine's ",
             cache_->hash_seed(), ")");
  if (b.block_tokens != bt || b.block_bytes != model_->paged_block_bytes())
    DI_THROW(InvalidArgument, "KV bundle of ", b.block_tokens, "-token blocks of ", b.block_bytes,
             " bytes; this engine's blocks have ", bt, " tokens and ", model_->paged_block_bytes(), " bytes");
  if (!scheduler_->prefix_cache().enabled()) return 0;
  const int64_t n = b.num_tokens(), nblocks = n / bt;
  if (b.on_device() && (b.device_blocks.bytes != size_t(nblocks) * b.block_bytes ||
                        b.device_blocks.device != model_->device_ordinal()))
    DI_THROW(InvalidArgument, "KV bundle: ", b.device_blocks.bytes, " device block bytes on device ",
             b.device_blocks.device, "; this engine needs ", nblocks, " x ", b.block_bytes, " on device ",
             model_->device_ordinal());
  // Blocks this cache already holds (same hash, parent and ids) are shared, not copied again.
  std::vector<int32_t> have;
  uint64_t parent = cache_->hash_seed();
  for (int64_t i = 0; i < nblocks; ++i) {
    std::span<const int32_t> ids(b.tokens.data() + i * bt, size_t(bt));
    const uint64_t h = block_hash(parent, ids);
    const int32_t blk = cache_->find_cached(h, parent, ids);
    if (blk < 0) break;
    have.push_back(blk);
    parent = h;
  }
  // A transient sequence holds the blocks while they are written and hashed, then leaves them
  // in the free list with their hashes: cached, as a finished request leaves its prompt.
  constexpr int64_t kImportSeq = std::numeric_limits<int64_t>::max() - 1;
  if (!cache_->allocate_with_prefix(kImportSeq, have, n)) return -1;  // no room (or no free slot) now
  const SeqCache* sc = cache_->get(kImportSeq);
  if (b.on_device()) {
    // The blocks not already held, from the bundle's device rows [have, nblocks).
    const std::vector<int32_t> fresh(sc->block_ids.begin() + ptrdiff_t(have.size()), sc->block_ids.begin() + nblocks);
    if (!fresh.empty())
      model_->scatter_blocks_from_device(
          fresh, static_cast<const uint8_t*>(b.device_blocks.data) + have.size() * b.block_bytes, nullptr);
  } else {
    std::vector<model::HostBlockCopy> copies;
    for (size_t i = have.size(); i < size_t(nblocks); ++i)
      copies.push_back({sc->block_ids[i], const_cast<uint8_t*>(b.blocks.data() + i * b.block_bytes)});
    if (!copies.empty()) model_->copy_blocks_from_host(copies);
  }
  cache_->hash_full_blocks(kImportSeq, b.tokens, {}, n);
  const std::optional<uint64_t> key = cache_->content_hash(sc->block_ids[size_t(nblocks - 1)]);
  DI_CHECK(key.has_value(), "import_prefix: block ", sc->block_ids[size_t(nblocks - 1)], " not hashed");
  cache_->free(kImportSeq, cache_->last_completed_step());
  scheduler_->put_checkpoint({*key, std::make_shared<model::SlotSnapshot>(b.checkpoint)});
  return n;
}

}  // namespace deepinfer::engine
