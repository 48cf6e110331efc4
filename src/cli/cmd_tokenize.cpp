// arbiter tokenize -m MODEL TEXT|--file F [--no-bos] [--special]: prints the token ids of
// TEXT (or of file F's bytes) on one line, space separated. MODEL is a .gguf (vocab-only
// files with no tensors work: only the tokenizer.* metadata is read) or an HF model
// directory (tokenizer.json + tokenizer_config.json). --no-bos: no BOS/EOS even when the
// model adds them; --special: special-token text such as "<|endoftext|>" becomes its id.
#include <cstdio>
#include <filesystem>

#include "cli/command.h"
#include "core/error.h"
#include "io/file.h"
#include "io/gguf.h"
#include "tokenizer/tokenizer.h"

namespace arbiter::cli {
namespace {

const char* kUsage =
    "usage: arbiter tokenize -m MODEL (TEXT | --file F) [--no-bos] [--special] [--decode]\n"
    "  MODEL      a .gguf file (vocab-only works) or an HF model directory\n"
    "  --no-bos   do not add BOS/EOS (the model's own policy applies otherwise)\n"
    "  --special  parse special-token text (e.g. <|endoftext|>) into its id\n"
    "  --decode   also print decode(ids) on a second line\n";

std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) return tokenizer_from_hf_dir(path);
  if (fs::path(path).filename() == "tokenizer.json") {
    const fs::path dir = fs::path(path).parent_path();
    return tokenizer_from_hf_dir(dir.empty() ? "." : dir.string());
  }
  ARB_CHECK(fs::exists(path), "[cli] tokenize: %s: no such file or directory", path.c_str());
  GgufFile g(path);
  return tokenizer_from_gguf(g);
}

int cmd_tokenize(int argc, char** argv) {
  Args a("tokenize", {"-m|--model", "-f|--file"}, {"--no-bos", "--special", "--decode", "-h|--help"});
  a.parse(argc, argv);
  if (a.flag("help")) {
    std::fputs(kUsage, stderr);
    return 0;
  }
  ARB_CHECK(a.has("model"), "[cli] tokenize: -m MODEL is required (see --help)");
  std::string text;
  if (a.has("file")) {
    ARB_CHECK(a.positional().empty(), "[cli] tokenize: give TEXT or --file, not both");
    text = read_input_file(a.str("file"), "[cli] tokenize:", kMaxInputBytes, "a text file");
  } else {
    ARB_CHECK(a.positional().size() == 1,
              "[cli] tokenize: expected one TEXT argument (got %zu; quote the text)", a.positional().size());
    text = a.positional()[0];
  }
  std::unique_ptr<Tokenizer> tok = open_tokenizer(a.str("model"));
  std::vector<int32_t> ids = tok->encode(text, !a.flag("no-bos"), a.flag("special"));
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ' ';
    line += std::to_string(ids[i]);
  }
  line += '\n';
  if (a.flag("decode")) line += tok->decode(ids, false) + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  return 0;
}

}  // namespace

REGISTER_COMMAND("tokenize", "text -> token ids with a model's tokenizer (GGUF or HF dir)", cmd_tokenize);

}  // namespace arbiter::cli
