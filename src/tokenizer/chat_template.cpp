#include "tokenizer/chat_template.h"

#include <filesystem>

#include "core/error.h"
#include "io/file.h"
#include "io/json.h"
#include "io/gguf.h"

namespace arbiter {

namespace fs = std::filesystem;

ChatTemplate::ChatTemplate(const std::string& source, std::string name, std::string bos_token,
                           std::string eos_token)
    : name_(std::move(name)), bos_(std::move(bos_token)), eos_(std::move(eos_token)), tpl_(source, name_) {}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& tools,
                                 const nlohmann::ordered_json& extra, std::time_t now) const {
  ARB_CHECK(messages.is_array(), "[chat] messages must be a list");
  jinja::Dict g;
  // What transformers' apply_chat_template passes: the special tokens it knows, messages,
  // tools (None when absent), add_generation_prompt, then the caller's extra kwargs.
  if (!bos_.empty()) g.set("bos_token", jinja::Value::string(bos_));
  if (!eos_.empty()) g.set("eos_token", jinja::Value::string(eos_));
  g.set("messages", jinja::Value::from_json(messages));
  g.set("tools", jinja::Value::from_json(tools));
  g.set("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  for (const auto& [k, v] : extra.items()) g.set(k, jinja::Value::from_json(v));
  g.set("strftime_now", jinja::Value::function([now](jinja::CallArgs& a) {
          std::tm tm{};
          localtime_r(&now, &tm);
          char buf[256];
          const std::string fmt = a.get(0, "format").str();
          size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
          return jinja::Value::string(std::string(buf, n));
        }));
  return tpl_.render(g);
}

static std::string read_file(const std::string& path) {
  return read_input_file(path, "[chat]", kMaxInputBytes, "a chat template file");
}

static std::string token_text(const Tokenizer& tok, int32_t id) {
  return id >= 0 ? tok.token_bytes(id) : std::string();
}

static std::unique_ptr<ChatTemplate> make(const std::string& source, const std::string& name,
                                          const Tokenizer& tok) {
  return std::make_unique<ChatTemplate>(source, name, token_text(tok, tok.bos_id()),
                                        token_text(tok, tok.eos_id()));
}

std::unique_ptr<ChatTemplate> chat_template_from_file(const std::string& path, const Tokenizer& tok) {
  return make(read_file(path), path, tok);
}

std::unique_ptr<ChatTemplate> load_chat_template(const std::string& model_path, const Tokenizer& tok) {
  if (fs::is_directory(model_path)) {
    const std::string jinja_path = (fs::path(model_path) / "chat_template.jinja").string();
    if (fs::exists(jinja_path)) return chat_template_from_file(jinja_path, tok);
    const std::string cfg_path = (fs::path(model_path) / "tokenizer_config.json").string();
    if (!fs::exists(cfg_path)) return nullptr;
    const nlohmann::json cfg = parse_json_bounded(read_file(cfg_path), cfg_path, "[chat]");
    if (!cfg.contains("chat_template") || cfg["chat_template"].is_null()) return nullptr;
    const auto& t = cfg["chat_template"];
    const std::string name = cfg_path + ": chat_template";
    if (t.is_string()) return make(t.get<std::string>(), name, tok);
    if (t.is_array())
      for (const auto& e : t)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
          return make(e["template"].get<std::string>(), name + "[default]", tok);
    throw Error("[chat] " + cfg_path + ": chat_template is neither a string nor a list holding a 'default' template");
  }
  if (fs::path(model_path).extension() == ".gguf") {
    GgufFile g(model_path);
    if (!g.has("tokenizer.chat_template")) return nullptr;
    return make(g.get_string("tokenizer.chat_template"), model_path + ": tokenizer.chat_template", tok);
  }
  return nullptr;
}

}  // namespace arbiter
