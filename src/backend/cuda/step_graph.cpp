#include "backend/cuda/step_graph.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace arbiter::cuda {

StepGraph::StepGraph(cudaStream_t s) : stream_(s) {
  ARB_CUDA(cudaEventCreateWithFlags(&step_ev_, cudaEventDisableTiming));
  ARB_CUDA(cudaMallocHost(&h_step_, 2 * sizeof(int)));
  ARB_CUDA(cudaMalloc(&d_step_, 2 * sizeof(int)));
}

StepGraph::~StepGraph() {
  for (auto& g : graphs_) cudaGraphExecDestroy(g.exec);
  cudaFree(d_step_);
  cudaFreeHost(h_step_);
  cudaEventDestroy(step_ev_);
}

void StepGraph::open(int token, bool on_device) {
  open_ = true;
  uploaded_ = false;
  pos_set_ = false;
  seg_pos_uniform_ = true;
  pos_ = 0;
  token_ = token;
  token_on_device_ = on_device;
}

void StepGraph::open_batch() {
  open(0, false);
  uploaded_ = true;
}

void StepGraph::clear() {
  for (CachedGraph& g : graphs_) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
}

void StepGraph::submit(std::vector<int64_t> sig, bool pos_dep, int pos0,
                       std::function<void(const StepCtx&)> run, bool advances_pos,
                       int segment_ops) {
  last_tag_ = sig.empty() ? 0 : sig[0];
  if (!open_) {
    run(StepCtx{nullptr, nullptr});
    return;
  }
  if (pos_dep) {
    if (!pos_set_) {
      pos_ = pos0;
      pos_set_ = true;
    } else if (pos0 != pos_) {
      seg_pos_uniform_ = false;
    }
  }
  sig.insert(sig.begin(), int64_t(sig.size()));
  queue_.push_back(Queued{std::move(sig), std::move(run), advances_pos});
  // A full segment runs now, so the GPU works while the host queues the rest of the step
  // (once the position is known: the first segment uploads it). A step that embeds a pick
  // is queued while the GPU still runs earlier steps, so it runs whole: every segment
  // boundary drains the GPU (H200, synth qwen3-0.6b bf16 decode: 1,616-1,622 against
  // 1,588-1,589 tok/s in segments of 32).
  if (segment_ops > 0 && pos_set_ && !token_on_device_ && int(queue_.size()) >= segment_ops)
    run_segment();
}

void StepGraph::flush() {
  if (!open_) return;
  open_ = false;
  run_segment();
}

void StepGraph::run_segment() {
  std::vector<Queued> ops;
  ops.swap(queue_);
  const bool uniform = seg_pos_uniform_;
  seg_pos_uniform_ = true;
  if (ops.empty()) return;
  if (!uploaded_) {
    // A picked token is in d_step_[1] already (the pick wrote it there), and the pick of the
    // previous step may have left this step's position in d_step_[0].
    if (!token_on_device_ || device_pos_ != pos_) {
      // The previous upload of (pos, id) must have been consumed before we rewrite it.
      ARB_CUDA(cudaEventSynchronize(step_ev_));
      h_step_[0] = pos_;
      h_step_[1] = token_;
      const size_t n = token_on_device_ ? 1 : 2;
      ARB_CUDA(cudaMemcpyAsync(d_step_, h_step_, n * sizeof(int), cudaMemcpyHostToDevice,
                               stream_));
      ARB_CUDA(cudaEventRecord(step_ev_, stream_));
      device_pos_ = pos_;
    }
    uploaded_ = true;
  }
  const StepCtx ctx{uniform ? d_step_ : nullptr, d_step_ + 1};
  if (uniform)  // the launches that advance the device position get it (ctx.pos_dev)
    for (const Queued& q : ops) device_pos_ += q.advances_pos ? 1 : 0;
  if (!uniform) {
    for (Queued& q : ops) q.run(ctx);
    ++stats_.eager_steps;
    return;
  }
  std::vector<int64_t> sig;
  for (const Queued& q : ops) sig.insert(sig.end(), q.sig.begin(), q.sig.end());
  for (CachedGraph& g : graphs_)
    if (g.sig == sig) {
      ARB_CUDA(cudaGraphLaunch(g.exec, stream_));
      ++stats_.replays;
      return;
    }
  if (std::find(seen_.begin(), seen_.end(), sig) == seen_.end()) {
    for (Queued& q : ops) q.run(ctx);
    ++stats_.eager_steps;
    if (seen_.size() >= kMaxGraphs) seen_.pop_front();
    seen_.push_back(std::move(sig));
    return;
  }
  // Second sighting of this segment: capture it once, then replay.
  cudaGraph_t graph = nullptr;
  ARB_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    for (Queued& q : ops) q.run(ctx);
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  ARB_CUDA(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  ARB_CUDA(e);
  if (graphs_.size() >= kMaxGraphs) {
    ARB_CUDA(cudaStreamSynchronize(stream_));
    cudaGraphExecDestroy(graphs_.front().exec);
    graphs_.pop_front();
  }
  graphs_.push_back(CachedGraph{std::move(sig), exec});
  ARB_CUDA(cudaGraphLaunch(exec, stream_));
  ++stats_.captures;
}

}  // namespace arbiter::cuda
