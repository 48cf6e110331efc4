// Chat templates: the model's own Jinja2 chat_template rendered by our Jinja subset
// (tokenizer/jinja.h) the way HF transformers' apply_chat_template renders it, so the
// prompt text is the one the model was trained on. Used by `serve` (/v1/chat/completions)
// and `generate --chat`.
#pragma once
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

namespace arbiter {

class ChatTemplate {
 public:
  /// source: the template text; name: where it came from (for messages); bos/eos: the
  /// tokens' text ("" when the model has none: the variable is then undefined, as in HF).
  /// Throws arbiter::Error when the template does not parse.
  ChatTemplate(const std::string& source, std::string name, std::string bos_token,
               std::string eos_token);

  /// messages: [{role, content, ...}] as in the OpenAI API; tools: a list or null; extra:
  /// more template variables (e.g. {"enable_thinking": false}); now: the time strftime_now()
  /// formats (local time). Throws jinja::RaiseError for the template's raise_exception()
  /// and arbiter::Error for any other failure.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& tools = nullptr,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
                     std::time_t now = std::time(nullptr)) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_, bos_, eos_;
  jinja::Template tpl_;
};

/// The model's template: DIR/chat_template.jinja, else DIR/tokenizer_config.json's
/// "chat_template" (a string, or a list of {name, template} of which "default" is used),
/// else a GGUF file's tokenizer.chat_template. nullptr when the model ships none.
std::unique_ptr<ChatTemplate> load_chat_template(const std::string& model_path, const Tokenizer& tok);
/// A template from a file (serve/generate --chat-template FILE).
std::unique_ptr<ChatTemplate> chat_template_from_file(const std::string& path, const Tokenizer& tok);

}  // namespace arbiter
