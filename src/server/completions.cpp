// POST /v1/completions (OpenAI legacy completions, with vLLM's extra sampling fields).
//   prompt: "text" | ["text", ...] | [token ids] | [[token ids], ...]   (each prompt gets n choices)
//   echo, logprobs (top-N per token), best_of (= n only), suffix (refused), stream + stream_options
#include <chrono>

#include "engine/engine.h"
#include "server/job.h"

namespace deepinfer::server {
namespace {

struct Prompt {
  std::vector<int32_t> ids;
  std::string echo;  // the prompt's text for echo
};

std::vector<Prompt> parse_prompts(ServerState& st, const json* p, bool echo) {
  if (!p) bad_request("'prompt' is required", "prompt");
  const engine::TextCodec* codec = st.loop->engine().codec();
  auto from_text = [&](const std::string& t) {
    if (!codec) bad_request("this server has no tokenizer: give 'prompt' as token ids", "prompt");
    Prompt x;
    try {
      x.ids = codec->encode(t);
    } catch (const Error& e) {
      bad_request(std::string("'prompt' cannot be tokenized: ") + e.what(), "prompt");
    }
    if (echo) x.echo = t;
    return x;
  };
  auto from_ids = [&](const json& a, const std::string& where) {
    Prompt x;
    for (const json& t : a) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= st.vocab_size)
        bad_request("'" + where + "' must hold token ids in [0, " + std::to_string(st.vocab_size) + ")", "prompt");
      x.ids.push_back(int32_t(t.get<int64_t>()));
    }
    if (echo && codec) x.echo = codec->decode(x.ids, false);
    return x;
  };
  std::vector<Prompt> out;
  if (p->is_string()) {
    out.push_back(from_text(p->get<std::string>()));
  } else if (p->is_array() && !p->empty()) {
    const json& first = (*p)[0];
    if (first.is_number_integer()) {
      out.push_back(from_ids(*p, "prompt"));
    } else {
      for (size_t i = 0; i < p->size(); ++i) {
        const json& e = (*p)[i];
        const std::string where = "prompt[" + std::to_string(i) + "]";
        if (first.is_string() && e.is_string()) out.push_back(from_text(e.get<std::string>()));
        else if (first.is_array() && e.is_array() && !e.empty()) out.push_back(from_ids(e, where));
        else bad_request("'prompt' must be a string, an array of strings, token ids, or an array of token-id arrays", "prompt");
      }
    }
  } else {
    bad_request("'prompt' must be a non-empty string, array of strings, token ids, or array of token-id arrays", "prompt");
  }
  if (out.size() > 256) bad_request("'prompt' holds more than 256 prompts", "prompt");
  return out;
}

// OpenAI's completions logprobs: tokens, token_logprobs, top_logprobs ({token: logprob}), text_offset.
struct CompletionLogprobs {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  void add(const CompletionOutput& c, int top_n, int64_t& offset) {
    if (!c.logprobs) return;
    for (size_t i = 0; i < c.logprobs->size() && i < c.token_ids.size(); ++i) {
      const PositionLogprobs& pos = (*c.logprobs)[i];
      std::string tok;
      double lp = 0;
      json tops = json::object();
      for (const auto& [id, l] : pos) {
        if (id == c.token_ids[i]) tok = l.decoded_token, lp = l.logprob;
        if (l.rank <= top_n) tops[l.decoded_token] = l.logprob;
      }
      tokens.push_back(tok);
      token_logprobs.push_back(lp);
      top.push_back(top_n > 0 ? tops : json(nullptr));
      offsets.push_back(offset);
      offset += int64_t(tok.size());
    }
  }
  json to_json() const {
    return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
  }
};

json stop_reason(const CompletionOutput& c) {
  if (c.stop_string) return *c.stop_string;
  if (c.stop_token_id) return *c.stop_token_id;
  return nullptr;
}

class CompletionJob final : public Job {
 public:
  CompletionJob(ServerState& st, std::shared_ptr<Responder> r, std::string id, const CommonOptions& co, int n,
                std::vector<std::string> echo, std::optional<int> logprobs)
      : Job(st, std::move(r), "/v1/completions", std::move(id), co, n), echo_(std::move(echo)), logprobs_(logprobs) {
    choices_.resize(echo_.size() * size_t(n));
  }

 private:
  struct Choice {
    std::string text, finish;
    json stop = nullptr;
    CompletionLogprobs lp;
    int64_t offset = 0;
    bool echoed = false;
  };
  std::string take_echo(int i) {
    Choice& c = choices_[size_t(i)];
    if (c.echoed) return "";
    c.echoed = true;
    return echo_[size_t(i / n())];
  }
  void on_piece(int i, const CompletionOutput& c) override {
    Choice& ch = choices_[size_t(i)];
    const std::string text = take_echo(i) + c.text;
    if (!stream()) {
      ch.text += text;
      if (logprobs_) ch.lp.add(c, *logprobs_, ch.offset);
      return;
    }
    // A piece without text (a skipped special token, an incomplete character) is still sent when
    // it carries logprobs, so that every token is listed.
    if (text.empty() && !c.finished() && !(logprobs_ && !c.token_ids.empty())) return;
    json choice = {{"index", i}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (logprobs_) {
      CompletionLogprobs piece;
      piece.add(c, *logprobs_, ch.offset);
      choice["logprobs"] = piece.to_json();
    }
    if (c.finished()) {
      choice["finish_reason"] = c.finish_reason;
      choice["stop_reason"] = stop_reason(c);
    }
    json chunk = chunk_base("text_completion");
    chunk["choices"] = json::array({choice});
    emit(chunk);
  }
  void on_choice_end(int i, const CompletionOutput& c) override {
    choices_[size_t(i)].finish = c.finish_reason;
    choices_[size_t(i)].stop = stop_reason(c);
  }
  json response_body() override {
    json body = chunk_base("text_completion");
    json cs = json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& c = choices_[i];
      cs.push_back({{"index", i},
                    {"text", c.text},
                    {"logprobs", logprobs_ ? c.lp.to_json() : json(nullptr)},
                    {"finish_reason", c.finish.empty() ? json(nullptr) : json(c.finish)},
                    {"stop_reason", c.stop}});
    }
    body["choices"] = cs;
    return body;
  }

  std::vector<std::string> echo_;
  std::optional<int> logprobs_;
  std::vector<Choice> choices_;
};

}  // namespace

void handle_completions(ServerState& st, const HttpRequest& req, std::shared_ptr<Responder> resp) {
  const double received = engine::now_seconds();
  json body = parse_body(req.body);
  Fields f(body, "");
  SamplingParams sp;
  sp.max_tokens = 16;  // OpenAI's default for completions
  CommonOptions co = parse_common(f, sp, st.vocab_size);
  if (const json* m = f.get("max_tokens")) {
    if (!m->is_number_integer() || m->get<int64_t>() < 0 || m->get<int64_t>() > INT32_MAX)
      bad_request("'max_tokens' must be a non-negative integer", "max_tokens");
    sp.max_tokens = int(m->get<int64_t>());
  } else if (f.has("max_tokens") || body.contains("max_tokens")) {
    sp.max_tokens = std::nullopt;  // explicit null: up to the model's length
  }
  const bool echo = f.boolean("echo").value_or(false);
  std::optional<int> logprobs;
  if (auto v = f.integer("logprobs", 0, 1000)) logprobs = int(*v);
  sp.logprobs = logprobs;
  if (auto b = f.integer("best_of", 1, 1024); b && *b != sp.n)
    bad_request("'best_of' other than n is not supported (best_of=" + std::to_string(*b) + ", n=" + std::to_string(sp.n) + ")",
                "best_of");
  if (auto s = f.str("suffix"); s && !s->empty()) bad_request("'suffix' is not supported", "suffix");
  sp.structured_outputs = structured_outputs(f, st.vocab_size);
  std::vector<Prompt> prompts = parse_prompts(st, f.get("prompt"), echo);
  f.check_unknown();
  if (!co.model.empty() && co.model != st.model_name && co.model != st.model_path)
    throw ApiError(404, "The model '" + co.model + "' does not exist; this server serves '" + st.model_name + "'", "model",
                   "model_not_found");
  try {
    sp.validate(st.vocab_size);
    if (sp.structured_outputs && st.loop->engine().grammar())
      st.loop->engine().grammar()->compile(*sp.structured_outputs);  // cached for add_request
  } catch (const Error& e) {
    bad_request(e.what());
  }
  std::vector<std::string> echo_text;
  std::vector<std::vector<int32_t>> ids;
  for (Prompt& p : prompts) {
    echo_text.push_back(std::move(p.echo));
    ids.push_back(std::move(p.ids));
  }
  auto job = std::make_shared<CompletionJob>(st, resp, st.new_id("cmpl"), co, sp.n, std::move(echo_text), logprobs);
  job->set_kv(req);
  job->submit(std::move(ids), sp, received);
}

}  // namespace deepinfer::server
