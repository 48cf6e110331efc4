// The trace header's `# act_quant` line (docs/traces.md) comes from the run itself: a cpu trace
// of a quantized model whose forwards are decode steps (W = 1) records the 8-bit activation
// codes, the same trace with CpuOptions::act_quant off does not, and neither does a trace
// whose forwards are all prefills (W = 8 after a context of BOS + 4: the GEMM keeps f32
// activations; a context of BOS alone would be a decode step and be recorded).
#include <gtest/gtest.h>

#include "backend/cpu/kernels.h"
#include "engine/session.h"
#include "model/model.h"
#include "model/synth.h"
#include "test_util.h"
#include "verify/trace/trace.h"
#include "verify/trace/trace_run.h"

namespace arbiter::test {
namespace {

using verify::Trace;
using verify::TraceRunOptions;

TEST(ActQuantTrace, HeaderRecordsWhatTheRunComputed) {
  const std::string dir = temp_dir("act-quant-trace");
  SynthOptions so;
  so.preset = "tiny";
  so.format = SynthFormat::Gguf;
  so.dtype = DType::F32;
  so.quant = QuantRecipe::Q8_0;
  so.out_dir = dir + "/q8.gguf";
  so.layers = 1;
  so.progress = false;
  synth_checkpoint(so);
  const std::unique_ptr<Model> m = load_model(so.out_dir);

  auto run = [&](int W, bool act_quant) {
    TraceRunOptions o;
    o.shape = {"t", W, 2, 4, 0, "act_quant test"};  // prefill 4: each context pass is T = 5
    o.topk = 2;
    o.corpus_path = source_path("models/corpus/stories.txt");
    o.out_path = dir + "/t.tsv";
    o.model_path = so.out_dir;
    o.progress = false;
    const verify::TraceCorpus c = verify::load_trace_corpus(o, *m);
    cpu::CpuOptions co;
    co.threads = 1;
    co.act_quant = act_quant;
    auto be = cpu::make_cpu_backend(co);
    Session s(*m, *be, 16, 8);
    verify::run_trace(s, o, c);
    return verify::read_trace(o.out_path).header.act_quant;
  };
  EXPECT_EQ(run(1, true), "q8_0");
  EXPECT_EQ(run(1, false), "");
  EXPECT_EQ(run(8, true), "");
}

}  // namespace
}  // namespace arbiter::test
