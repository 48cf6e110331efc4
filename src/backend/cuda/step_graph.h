// Decode steps (T == 1) replayed as CUDA graphs. The model calls ops one by one, so the graph
// is built here: an embed of one token opens a step; its launches are queued (each as a
// closure plus a signature of everything it launches with except the position and the token
// id). Every segment_ops queued launches (once the step's position is known), and when
// something needs the results on the host (summarize, read, write, sync, free, the next
// embed: the backend flushes), the queue runs as a segment: as a replay of a graph captured
// earlier for the same signature, as a fresh capture when the signature was seen before, or
// op by op. So the GPU runs the first segments while the host queues the rest (the host needs
// ~100 us to queue a 28-layer step). In a step, position-dependent kernels (RoPE, KV store,
// attention) and the embedding gather read the position and the token id from a small device
// array that the first segment uploads, so one graph serves every position. A replay runs
// exactly the kernels the op-by-op path runs, with the same arguments: results are
// byte-identical.
#pragma once
#include <cuda_runtime.h>

#include <deque>
#include <functional>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host_common.h"

namespace arbiter::cuda {

class StepGraph {
 public:
  explicit StepGraph(cudaStream_t s);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  /// Opens a single-token step: launches submitted until flush() are queued. token: the
  /// step's id, or (on_device) the latest pick, already in the device token slot.
  void open(int token, bool on_device);
  /// Opens a batched forward (continuous batching) as a step: its launches read nothing from
  /// the step's slots (its ids, positions and block tables are in device buffers the backend
  /// fills before them), so nothing is uploaded, and it runs whole at flush() as one segment.
  void open_batch();
  bool is_open() const { return open_; }
  /// Runs a launch now, or queues it in the open step. sig identifies the launch (all
  /// arguments but the position); pos_dep marks launches that read pos0; advances_pos: the
  /// launch adds one to the device position when it runs in a step (the greedy pick).
  /// segment_ops > 0: a step whose position is known runs every that many launches.
  void submit(std::vector<int64_t> sig, bool pos_dep, int pos0,
              std::function<void(const StepCtx&)> run, bool advances_pos, int segment_ops);
  /// Runs the queued step (its last segment) and closes it.
  void flush();
  /// Forgets the captured graphs (they hold the kernels of old tuning choices).
  void clear();
  /// The step's device slots: [0] the position, [1] the token id.
  int* slots() const { return d_step_; }
  /// The signature tag (first element) of the latest launch submitted.
  int64_t last_tag() const { return last_tag_; }
  CudaGraphStats stats() const { return stats_; }

 private:
  static constexpr size_t kMaxGraphs = 64;  // segments (a 28-layer decode step has about 5)
  struct Queued {
    std::vector<int64_t> sig;
    std::function<void(const StepCtx&)> run;
    bool advances_pos = false;
  };
  struct CachedGraph {
    std::vector<int64_t> sig;
    cudaGraphExec_t exec = nullptr;
  };
  /// Runs the queued segment of the open step: a replay of a graph captured for the same
  /// signature, a capture (second sighting of the signature), or op by op.
  void run_segment();

  cudaStream_t stream_;
  CudaGraphStats stats_;
  bool open_ = false, uploaded_ = false, pos_set_ = false;
  bool seg_pos_uniform_ = true;  // every position-dependent op of the segment at pos_
  int pos_ = 0, token_ = 0;
  bool token_on_device_ = false;  // the open step embeds the latest pick
  std::vector<Queued> queue_;
  std::deque<std::vector<int64_t>> seen_;  // segments seen (captured on a second sighting)
  std::deque<CachedGraph> graphs_;
  int64_t last_tag_ = 0;
  int* h_step_ = nullptr;  // pinned (pos, id)
  int* d_step_ = nullptr;
  int device_pos_ = -1;  // what d_step_[0] holds once the queued work has run (-1: unknown)
  cudaEvent_t step_ev_ = nullptr;
};

}  // namespace arbiter::cuda
