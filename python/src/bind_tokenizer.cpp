// deepinfer._C.Tokenizer / DecodeStream / Message: thin nanobind layer over include/deepinfer/tokenizer.h.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "binder.h"
#include "deepinfer/tokenizer.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace deepinfer::py {
namespace {
void bind_tokenizer(nb::module_& m) {
  nb::class_<ToolCall>(m, "ToolCall")
      .def(nb::init<>())
      .def("__init__", [](ToolCall* t, std::string name, std::string arguments, std::string id) {
             new (t) ToolCall{std::move(id), std::move(name), std::move(arguments)};
           }, "name"_a, "arguments"_a, "id"_a = "")
      .def_rw("id", &ToolCall::id)
      .def_rw("name", &ToolCall::name)
      .def_rw("arguments", &ToolCall::arguments);

  nb::class_<Message>(m, "Message")
      .def(nb::init<>())
      .def_rw("role", &Message::role)
      .def_rw("content", &Message::content)
      .def_rw("reasoning_content", &Message::reasoning_content)
      .def_rw("tool_calls", &Message::tool_calls)
      .def_rw("tool_call_id", &Message::tool_call_id)
      .def_rw("tools_json", &Message::tools_json)
      .def_rw("response_format_json", &Message::response_format_json);

  nb::class_<Tokenizer>(m, "Tokenizer")
      .def_static("from_file", &Tokenizer::from_file, "path"_a,
                  "Load tokenizer.json (+ tokenizer_config.json beside it), a folder, or GPT-2 encoder.json + vocab.bpe.")
      .def_static("from_gpt2_files", &Tokenizer::from_gpt2_files, "encoder_json"_a, "vocab_bpe"_a)
      .def("encode", [](const Tokenizer& t, const std::string& text, bool add_special_tokens) {
             nb::gil_scoped_release g;
             return t.encode(text, add_special_tokens);
           }, "text"_a, "add_special_tokens"_a = false)
      .def("encode_batch", [](const Tokenizer& t, const std::vector<std::string>& texts, bool add_special_tokens,
                              int num_threads) {
             nb::gil_scoped_release g;
             return t.encode_batch(texts, add_special_tokens, num_threads);
           }, "texts"_a, "add_special_tokens"_a = false, "num_threads"_a = 0)
      .def("decode", [](const Tokenizer& t, const std::vector<int32_t>& ids, bool skip) { return t.decode(ids, skip); },
           "ids"_a, "skip_special_tokens"_a = false)
      .def("token_to_id", &Tokenizer::token_to_id, "token"_a)
      .def("id_to_token", &Tokenizer::id_to_token, "id"_a)
      .def("token_bytes", [](const Tokenizer& t, int32_t id) {
             const std::string& b = t.token_bytes(id);
             return nb::bytes(b.data(), b.size());
           }, "id"_a)
      .def("is_special", &Tokenizer::is_special, "id"_a)
      .def_prop_ro("vocab_size", &Tokenizer::vocab_size)
      .def_prop_ro("special_ids", &Tokenizer::special_ids)
      .def_prop_ro("bos_id", &Tokenizer::bos_id)
      .def_prop_ro("eos_id", &Tokenizer::eos_id)
      .def_prop_ro("add_bos_token", &Tokenizer::add_bos_token)
      .def("apply_chat_template", [](const Tokenizer& t, const std::vector<Message>& messages, bool add_generation_prompt,
                                     bool thinking, std::string reasoning_effort, bool drop_thinking, bool add_bos) {
             ChatOptions o{add_generation_prompt, thinking, std::move(reasoning_effort), drop_thinking, add_bos};
             return t.apply_chat_template(messages, o);
           }, "messages"_a, "add_generation_prompt"_a = true, "thinking"_a = false, "reasoning_effort"_a = "",
           "drop_thinking"_a = true, "add_bos"_a = true);

  nb::class_<DecodeStream>(m, "DecodeStream")
      .def(nb::init<const Tokenizer&, bool>(), "tokenizer"_a, "skip_special_tokens"_a = false, nb::keep_alive<1, 2>())
      .def("step", &DecodeStream::step, "id"_a, "Feed one id; returns the newly complete text (maybe '').")
      .def("finish", &DecodeStream::finish)
      .def("reset", &DecodeStream::reset);
}
}  // namespace
DI_PY_BINDER("tokenizer", 20, bind_tokenizer);
}  // namespace deepinfer::py
