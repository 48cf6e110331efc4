// The registry of architecture families (model/arch.h). Adding a family: its file in this
// folder defining `const Arch& NAME_family()`, and one line in each list below.
#include "model/arch.h"

namespace arbiter {

const Arch& llama_family();  // llama.cpp: llama, mistral, qwen2, qwen3 and their MoE members
const Arch& gemma_family();  // gemma.cpp: gemma2, gemma3
const Arch& hybrid_family();  // hybrid.h: granitemoehybrid, nemotron_h

const std::vector<const Arch*>& arch_registry() {
  static const std::vector<const Arch*> registry = {&llama_family(), &gemma_family(),
                                                      &hybrid_family()};
  return registry;
}

}  // namespace arbiter
