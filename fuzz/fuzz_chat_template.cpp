// libFuzzer harness: a chat template (src/tokenizer/chat_template.h, the Jinja subset of
// tokenizer/jinja.h) parsed from the input bytes and rendered on a fixed conversation with
// every role, tool calls, a tools list and the special tokens, as the server renders it. The
// template's own raise_exception() (jinja::RaiseError) is a clean refusal like any Error.
#include "fuzz_util.h"
#include "tokenizer/chat_template.h"

namespace {

const nlohmann::ordered_json& messages() {
  static const nlohmann::ordered_json m = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris? caf\u00e9 \ud83d\ude00"},
    {"role": "assistant", "content": "<think>\nlook it up\n</think>\n\nLet me check.",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21.5}"},
    {"role": "assistant", "content": "It is 21.5 degrees."},
    {"role": "user", "content": [{"type": "text", "text": "Thanks!"}]}
  ])");
  return m;
}

const nlohmann::ordered_json& tools() {
  static const nlohmann::ordered_json t = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
      "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "The city"},
        "days": {"type": "integer", "enum": [1, 2, 3]},
        "units": {"type": "object", "properties": {"temp": {"type": "string"}}}}}}}
  ])");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace arbiter;
  fuzz::expect_clean([&] {
    ChatTemplate ct(fuzz::bytes(data, size), "fuzz.jinja", "<s>", "</s>");
    const std::time_t now = 1721995200;
    fuzz::sink(ct.render(messages(), true, tools(), {{"enable_thinking", false}}, now).size());
    fuzz::sink(ct.render(messages(), false, nullptr, nlohmann::ordered_json::object(), now).size());
  });
  return 0;
}
