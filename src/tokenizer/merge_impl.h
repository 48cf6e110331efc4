// merge_symbols (declared in vocab.h): the BPE merge loop with a priority queue and a
// linked list, O(n log n) in the word length. Same order as SentencePiece's bpe_model.cc,
// llama.cpp's llm_tokenizer_spm/bpe sessions and HF tokenizers' Word::merge_all: best
// priority first, ties to the leftmost pair; queue entries made stale by earlier merges
// are recognised (neighbours or lengths changed) and skipped.
#pragma once
#include <cmath>
#include <queue>
#include <string_view>
#include <vector>

namespace arbiter::tok {

struct MergeCandidate {
  double priority;
  int32_t left, right;
  int32_t merged_id;
  uint32_t len;  // left.len + right.len when queued
};

struct MergeCandidateOrder {
  bool operator()(const MergeCandidate& a, const MergeCandidate& b) const {
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.left > b.left;
  }
};

template <class Lookup>
void merge_symbols(std::vector<Symbol>& syms, std::string_view word, Lookup lookup) {
  std::priority_queue<MergeCandidate, std::vector<MergeCandidate>, MergeCandidateOrder> queue;
  auto try_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const Symbol& a = syms[l];
    const Symbol& b = syms[r];
    std::string_view merged = word.substr(a.begin, a.len + b.len);
    auto [prio, id] = lookup(a, b, merged);
    if (std::isinf(prio) && prio < 0) return;
    queue.push({prio, l, r, id, a.len + b.len});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) try_pair(i, i + 1);
  while (!queue.empty()) {
    MergeCandidate c = queue.top();
    queue.pop();
    Symbol& a = syms[c.left];
    Symbol& b = syms[c.right];
    if (a.len == 0 || b.len == 0 || a.next != c.right || a.len + b.len != c.len) continue;
    a.len += b.len;
    a.id = c.merged_id;
    b.len = 0;
    a.next = b.next;
    if (b.next >= 0) syms[b.next].prev = c.left;
    try_pair(a.prev, c.left);
    try_pair(c.left, a.next);
  }
}

}  // namespace arbiter::tok
