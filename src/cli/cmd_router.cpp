// `deepinfer router`: one OpenAI-compatible endpoint over several `deepinfer serve` replicas
// (docs/ROUTER.md). Runs until SIGINT or SIGTERM. With --port 0 the bound port is printed
// ("listening on http://HOST:PORT"), as `serve` does.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/command.h"
#include "cli/lists.h"
#include "cli/service.h"
#include "router/router.h"

namespace {
using deepinfer::cli::split_list;

int run_router(int argc, char** argv) {
  CLI::App app{"Route OpenAI-compatible requests over several deepinfer serve replicas", argv[0]};
  deepinfer::router::RouterOptions o;
  std::string backends, prefill, decode, policy = "affinity";
  app.add_option("--backends", backends, "replica URLs, comma-separated (http://HOST:PORT,...)");
  app.add_option("--prefill", prefill, "disaggregation: prefill servers (serve --kv-role prefill), comma-separated");
  app.add_option("--decode", decode, "disaggregation: decode servers (serve --kv-role decode), comma-separated");
  app.add_option("--host", o.http.host, "address to listen on")->default_str("127.0.0.1");
  app.add_option("--port", o.http.port, "port (0 = any free port, printed at start)")->default_str("8000");
  app.add_option("--policy", policy, "affinity | least-load | random")->default_str("affinity");
  app.add_option("--health-interval-s", o.pool.poll_interval_s, "seconds between polls of each replica's /load")
      ->default_str("0.5");
  app.add_option("--affinity-block-chars", o.pool.block_chars, "prompt characters per hashed prefix block")
      ->default_str("256");
  app.add_option("--affinity-factor", o.pool.affinity_factor,
                 "a prefix's replica is overloaded above factor x least load + slack")->default_str("2");
  app.add_option("--affinity-slack-tokens", o.pool.affinity_slack_tokens, "the slack of that rule (tokens)")
      ->default_str("2048");
  app.add_option("--io-threads", o.http.io_threads, "HTTP I/O threads")->default_str("2");
  app.add_option("--upstream-timeout-s", o.timeouts.read_s, "longest silence of a replica during a response")
      ->default_str("600");
  CLI11_PARSE(app, argc, argv);
  o.backends = split_list(backends);
  o.prefill = split_list(prefill);
  o.decode = split_list(decode);
  if (o.backends.empty() && o.decode.empty()) {
    std::fprintf(stderr, "deepinfer router: give --backends URL,... (or --prefill URL,... --decode URL,...)\n");
    return 2;
  }
  o.pool.policy = deepinfer::router::parse_policy(policy);

  const sigset_t sigs = deepinfer::cli::block_stop_signals();
  deepinfer::router::Router router(o);
  router.start();
  if (router.prefill_pool())
    std::fprintf(stderr, "deepinfer router: %zu prefill (%d up) + %zu decode servers (%d up), policy %s, listening on http://%s:%d\n",
                 o.prefill.size(), router.prefill_pool()->num_up(), o.decode.size(), router.pool().num_up(), policy.c_str(),
                 o.http.host.c_str(), router.port());
  else
    std::fprintf(stderr, "deepinfer router: %zu backends (%d up), policy %s, listening on http://%s:%d\n",
                 o.backends.size(), router.pool().num_up(), policy.c_str(), o.http.host.c_str(), router.port());
  std::fflush(stderr);
  deepinfer::cli::wait_for_stop(sigs, "deepinfer router");
  router.stop();
  return 0;
}
}  // namespace
DI_REGISTER_COMMAND("router", "route OpenAI-compatible requests over several serve replicas", run_router);
