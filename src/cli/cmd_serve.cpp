// `deepinfer serve`: the OpenAI-compatible HTTP server (docs/SERVER.md). Runs until SIGINT or
// SIGTERM, then stops accepting, aborts what runs and exits 0. With --port 0 the bound port is
// printed ("listening on http://HOST:PORT") for scripts and tests.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>

#include "cli/command.h"
#include "cli/lists.h"
#include "cli/service.h"
#include "server/server.h"

namespace {
int run_serve(int argc, char** argv) {
  CLI::App app{"Serve the model over an OpenAI-compatible HTTP API", argv[0]};
  deepinfer::server::ServeOptions o;
  double kv_cache_gib = 0;
  double max_body_mib = 32;
  app.add_option("-m,--model", o.llm.model, "checkpoint folder (default: $DEEPINFER_HF_MODEL_DIR, then the bundled default model)");
  app.add_option("--tokenizer", o.llm.tokenizer, "tokenizer.json or folder (default: the model folder)");
  app.add_option("--max-model-len", o.llm.max_model_len, "max prompt + output tokens");
  app.add_option("--max-num-seqs", o.llm.max_num_seqs, "sequences per step");
  app.add_option("--max-num-batched-tokens", o.llm.max_num_batched_tokens, "tokens per step");
  app.add_option("--kv-cache-gib", kv_cache_gib, "cache memory budget (GiB); 0 = auto");
  app.add_option("--accelerator", o.llm.accelerator, "cpu | nvidia | auto (default: $DEEPINFER_ACCELERATOR)");
  app.add_option("--seed", o.llm.seed, "seeds requests that carry no seed");
  app.add_option("--max-logprobs", o.llm.max_logprobs, "largest logprobs / top_logprobs a request may ask");
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o.llm.enable_prefix_caching,
               "reuse cached prompt prefixes (default on)");
  app.add_option("--host", o.http.host, "address to listen on")->default_str("127.0.0.1");
  app.add_option("--port", o.http.port, "port (0 = any free port, printed at start)")->default_str("8000");
  app.add_option("--served-model-name", o.served_model_name, "the model's name in the API (default: the folder's name)");
  app.add_option("--chat-format", o.chat_format, "auto | v4 | v41 (auto: from config.json's architecture)");
  app.add_option("--max-waiting", o.max_waiting, "sequences waiting for the engine before requests get 503")->default_str("512");
  app.add_option("--io-threads", o.http.io_threads, "HTTP I/O threads")->default_str("2");
  app.add_option("--prep-threads", o.prep_threads, "threads that parse, tokenize and compile grammars")->default_str("2");
  app.add_option("--max-body-mib", max_body_mib, "largest request body (MiB); larger ones get 413")->default_str("32");
  app.add_option("--api-key", o.api_key, "require 'Authorization: Bearer KEY' on /v1 (default: $DEEPINFER_API_KEY)");
  std::string kv_peers;
  app.add_option("--kv-role", o.kv.role, "prefill/decode disaggregation: prefill | decode (docs/ROUTER.md)");
  app.add_option("--kv-rendezvous", o.kv.rendezvous_dir, "directory where prefill and decode servers meet (fresh per deployment)");
  app.add_option("--kv-name", o.kv.name, "this server's name among them (letters, digits, - _)");
  app.add_option("--kv-peers", kv_peers, "the other side's names, comma-separated");
  app.add_option("--kv-wait-s", o.kv_wait_s, "decode: longest wait for a request's KV transfer")->default_str("10");
  std::string kv_transport = "auto";
  app.add_option("--kv-transport", kv_transport,
                 "how KV payloads cross between prefill and decode: cuda-ipc | host | auto (cuda-ipc when both ends are CUDA on one host)")
      ->default_str("auto");
  CLI11_PARSE(app, argc, argv);
  o.kv.transport = deepinfer::server::parse_kv_transport(kv_transport);
  o.kv.peers = deepinfer::cli::split_list(kv_peers);
  o.llm.kv_cache_memory_bytes = size_t(kv_cache_gib * double(size_t(1) << 30));
  o.http.max_body_bytes = size_t(max_body_mib * double(1 << 20));
  if (o.api_key.empty())
    if (const char* k = std::getenv("DEEPINFER_API_KEY")) o.api_key = k;

  const sigset_t sigs = deepinfer::cli::block_stop_signals();  // before any thread starts

  deepinfer::server::Server server(o);
  server.start();
  std::fprintf(stderr, "deepinfer serve: model '%s', listening on http://%s:%d\n", server.model_name().c_str(),
               o.http.host.c_str(), server.port());
  std::fflush(stderr);
  deepinfer::cli::wait_for_stop(sigs, "deepinfer serve");
  server.stop();
  return 0;
}
}  // namespace
DI_REGISTER_COMMAND("serve", "serve the model over an OpenAI-compatible HTTP API", run_serve);
