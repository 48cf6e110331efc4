// Matrix spec parsing (src/verify/matrix/matrix_spec.h): a valid spec reads back as written, the
// shipped specs parse, and every kind of bad input gives one error naming the file, the
// line, the key and the problem. To add a case: append to kBad with a fragment of the
// expected message.
#include "verify/matrix/matrix_spec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "test_util.h"
#include "verify/trace/host_info.h"

using namespace arbiter;
using namespace arbiter::verify;

namespace {

const char* kValid = R"(question = "Is cpu the same model as ref?"
corpus = "models/corpus/stories.txt"
models = ["models/TinyStories-656K", "models/stories260K/stories260K.gguf"]
shapes = ["w1", "w8"]
topk = 4
decided = 1.5
kl_kappa = 500
sweep = [1, 2.5]
reference = "ref"
candidates = ["cpu", "gpu"]

[chunks]
w8 = 3

[arms.ref]
device = "ref"

[arms.cpu]
device = "cpu"
threads = 2
inject = "op=down,layer=0,scale=10"
env = { ARBITER_CPU_ISA = "scalar" }

[arms.gpu]
device = "cuda:1"
dtype = "f16"

[controls]
aa = ["ref"]
noise_floor = [["ref", "cpu"]]
)";

std::string write_spec(const std::string& text) {
  std::string p = test::temp_dir("spec") + "/spec.toml";
  test::write_file(p, text);
  return p;
}

// Replaces the first occurrence of from in kValid by to.
std::string edit(const std::string& from, const std::string& to) {
  std::string s = kValid;
  size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

}  // namespace

TEST(MatrixSpec, ValidSpecReadsBack) {
  std::string path = write_spec(kValid);
  MatrixSpec s = parse_matrix_spec(path);
  EXPECT_EQ(s.question, "Is cpu the same model as ref?");
  ASSERT_EQ(s.models.size(), 2u);
  EXPECT_EQ(matrix_model_name(s.models[1]), "stories260K");
  ASSERT_EQ(s.shapes.size(), 2u);
  EXPECT_EQ(s.shapes[0].shape.max_chunks, 128);
  EXPECT_FALSE(s.shapes[0].capped());
  EXPECT_EQ(s.shapes[1].shape.max_chunks, 3);
  EXPECT_TRUE(s.shapes[1].capped());
  EXPECT_EQ(s.topk, 4);
  EXPECT_DOUBLE_EQ(s.decided, 1.5);
  EXPECT_DOUBLE_EQ(s.kl_kappa, 500);
  EXPECT_EQ(s.sweep, (std::vector<double>{1.0, 2.5}));
  EXPECT_EQ(s.reference, "ref");
  EXPECT_EQ(s.candidates, (std::vector<std::string>{"cpu", "gpu"}));
  const MatrixArm& cpu = s.arm("cpu");
  EXPECT_EQ(cpu.threads, 2);
  EXPECT_EQ(cpu.inject, "op=down,layer=0,scale=10");
  ASSERT_EQ(cpu.env.size(), 1u);
  EXPECT_EQ(cpu.env[0].first, "ARBITER_CPU_ISA");
  EXPECT_EQ(s.arm("gpu").compute(), "f16");
  EXPECT_TRUE(s.arm("gpu").is_gpu());
  EXPECT_EQ(s.arm("ref").compute(), "f64");
  EXPECT_EQ(s.aa, (std::vector<std::string>{"ref"}));
  ASSERT_EQ(s.noise_floor.size(), 1u);
  EXPECT_EQ(s.noise_floor[0].cand, "cpu");

  // Traces: 2 models x 2 shapes x (ref, ref A/A, cpu, gpu), reference first.
  std::vector<MatrixTrace> t = matrix_traces(s);
  ASSERT_EQ(t.size(), 16u);
  EXPECT_EQ(t[0].file, "TinyStories-656K.w1.ref.tsv");
  EXPECT_EQ(t[1].file, "TinyStories-656K.w1.ref.aa.tsv");
  EXPECT_EQ(t[2].file, "TinyStories-656K.w1.cpu.tsv");
  EXPECT_EQ(t.back().file, "stories260K.w8.gpu.tsv");

  // The trace command of a capped shape caps --chunks and carries every arm setting.
  std::vector<std::string> args = matrix_trace_args(s, t[2 + 4], "/d");  // TinyStories w8 cpu
  std::string joined;
  for (const auto& a : args) joined += a + " ";
  EXPECT_EQ(joined,
            "trace -m models/TinyStories-656K --corpus models/corpus/stories.txt --shape w8 "
            "--chunks 3 --topk 4 --device cpu -t 2 --inject op=down,layer=0,scale=10 --quiet ");
  // allow_long_context reaches every trace command (the runner passes it in-process).
  MatrixSpec l = parse_matrix_spec(write_spec(edit("topk = 4", "topk = 4\nallow_long_context = true")));
  EXPECT_TRUE(l.allow_long_context);
  args = matrix_trace_args(l, matrix_traces(l)[0], "/d");
  EXPECT_NE(std::find(args.begin(), args.end(), "--allow-long-context"), args.end());
}

TEST(MatrixSpec, HeaderMismatchIsNamed) {
  MatrixSpec s = parse_matrix_spec(write_spec(kValid));
  MatrixTrace t = matrix_traces(s)[2];  // TinyStories w1 cpu
  TraceHeader h;
  h.model_path = "models/TinyStories-656K";
  h.corpus_path = "models/corpus/stories.txt";
  h.set_shape(s.shapes[0].shape, 4);
  h.device = "cpu";
  h.compute = "f32";
  h.inject = "op=down,layer=0,scale=10";
  h.env = {"ARBITER_CPU_ISA=scalar", "ARBITER_OTHER=1"};
  EXPECT_EQ(matrix_trace_mismatch(s, t, h, "", ""), "");
  TraceHeader bad = h;
  bad.inject = "none";
  EXPECT_NE(matrix_trace_mismatch(s, t, bad, "", "").find("inject"), std::string::npos);
  bad = h;
  bad.max_chunks = 5;
  EXPECT_NE(matrix_trace_mismatch(s, t, bad, "", "").find("shape"), std::string::npos);
  bad = h;
  bad.env = {"ARBITER_CPU_ISA=avx2"};
  EXPECT_NE(matrix_trace_mismatch(s, t, bad, "", "").find("env"), std::string::npos);
  bad = h;
  bad.model_sha256 = "abc";
  EXPECT_NE(matrix_trace_mismatch(s, t, bad, "def", "").find("model sha256"), std::string::npos);
}

TEST(MatrixSpec, ShippedSpecsParse) {
  for (const char* f : {"matrix/default.toml", "matrix/h200.toml"}) {
    SCOPED_TRACE(f);
    MatrixSpec s = parse_matrix_spec(test::source_path(f));
    EXPECT_EQ(s.reference, "ref");
    EXPECT_FALSE(s.aa.empty());
    EXPECT_FALSE(s.noise_floor.empty());
  }
  MatrixSpec h = parse_matrix_spec(test::source_path("matrix/h200.toml"));
  EXPECT_EQ(h.models.size(), 14u);  // the shipped models and every tiny-* family fixture
  for (const std::string& m : h.models)
    EXPECT_TRUE(std::filesystem::exists(test::source_path(m))) << m;
  EXPECT_EQ(h.shapes.size(), 4u);
  for (const char* a : {"cuda-bf16", "cuda-f16", "cuda-f32"}) EXPECT_TRUE(h.arm(a).is_gpu()) << a;
}

// A model with a parent: the reference arm also traces the parent, and both reference traces
// of that model keep full logits (the store's TRACE.logits name) for the KLD statistics.
TEST(MatrixSpec, ParentAddsAReferenceTraceOfTheParentWithFullLogits) {
  MatrixSpec s = parse_matrix_spec(write_spec(
      edit("[chunks]", "[parents]\n\"models/stories260K/stories260K.gguf\" = \"other/parent\"\n\n[chunks]")));
  ASSERT_EQ(s.parents.size(), 2u);
  EXPECT_EQ(s.parents[0], "");
  EXPECT_EQ(s.parents[1], "other/parent");
  int parents = 0, with_logits = 0;
  for (const MatrixTrace& t : matrix_traces(s)) {
    SCOPED_TRACE(t.file);
    if (!t.logits.empty()) {
      ++with_logits;
      EXPECT_EQ(t.logits, t.file + ".logits");
      EXPECT_EQ(t.model, 1u);
      EXPECT_EQ(t.arm, "ref");
      EXPECT_FALSE(t.aa);
    }
    if (!t.parent) continue;
    ++parents;
    EXPECT_EQ(matrix_trace_model(s, t), "other/parent");
    EXPECT_EQ(t.file, "stories260K." + s.shapes[t.shape].shape.name + ".ref.parent.tsv");
    const std::vector<std::string> a = matrix_trace_args(s, t, "/d");
    EXPECT_EQ(a[2], "other/parent");
    auto fl = std::find(a.begin(), a.end(), "--full-logits");
    ASSERT_NE(fl, a.end());
    EXPECT_EQ(*(fl + 1), "/d/" + t.logits);
  }
  EXPECT_EQ(parents, 2);      // one per shape
  EXPECT_EQ(with_logits, 4);  // the parent's and the quantized model's reference, per shape
}

struct BadCase {
  const char* name;
  std::string text;
  const char* key;      // must appear in the message
  const char* problem;  // must appear in the message
};

TEST(MatrixSpec, EndpointArmTracesThroughTheApi) {
  MatrixSpec spec = parse_matrix_spec_text(
      edit("device = \"cuda:1\"\ndtype = \"f16\"", "endpoint = \"http://127.0.0.1:8080\"\nmodel = \"tiny\"\ndtype = \"bf16\""),
      "spec.toml");
  const MatrixArm& gpu = spec.arm("gpu");
  EXPECT_TRUE(gpu.is_endpoint());
  EXPECT_FALSE(gpu.is_gpu());
  EXPECT_EQ(gpu.compute(), "bf16");
  EXPECT_EQ(gpu.device, "api:http://127.0.0.1:8080");
  for (const MatrixTrace& t : matrix_traces(spec)) {
    if (t.arm != "gpu") continue;
    std::string args;
    for (const auto& a : matrix_trace_args(spec, t, "/d")) args += a + " ";
    EXPECT_NE(args.find("-m tiny "), std::string::npos) << args;
    EXPECT_NE(args.find("--tokenizer " + spec.models[t.model] + " --endpoint http://127.0.0.1:8080 --topk 4 --compute bf16"),
              std::string::npos) << args;
    EXPECT_EQ(args.find("--device"), std::string::npos) << args;
    TraceHeader h;
    h.model_path = spec.models[t.model];
    h.corpus_path = spec.corpus;
    h.set_shape(spec.shapes[t.shape].shape, spec.topk);
    h.device = "api:http://127.0.0.1:8080";
    h.compute = "bf16";
    h.inject = "none";
    EXPECT_EQ(matrix_trace_mismatch(spec, t, h, "", ""), "");
    h.compute = "";
    EXPECT_NE(matrix_trace_mismatch(spec, t, h, "", "").find("compute"), std::string::npos);
  }
}

TEST(MatrixSpec, BadInputsNameFileKeyAndProblem) {
  const BadCase cases[] = {
      {"unknown top-level key", edit("topk = 4", "topk = 4\ncolour = 1"), "colour", "unknown key"},
      {"unknown arm key", edit("device = \"ref\"", "device = \"ref\"\ndevcie = \"cpu\""),
       "arms.ref.devcie", "unknown key"},
      {"unknown controls key", edit("aa = [\"ref\"]", "aa = [\"ref\"]\nab = 1"), "controls.ab",
       "unknown key"},
      {"wrong type", edit("topk = 4", "topk = \"4\""), "topk", "expected an integer, got a string"},
      {"long context not a boolean", edit("topk = 4", "topk = 4\nallow_long_context = 1"), "allow_long_context",
       "expected a boolean"},
      {"wrong element type", edit("[\"w1\", \"w8\"]", "[\"w1\", 8]"), "shapes[1]",
       "expected a string"},
      {"missing reference", edit("reference = \"ref\"\n", ""), "reference", "missing (required)"},
      {"reference not an arm", edit("reference = \"ref\"", "reference = \"oracle\""), "reference",
       "no arm named 'oracle'"},
      {"unknown device", edit("device = \"cuda:1\"", "device = \"tpu\""), "arms.gpu.device",
       "unknown device 'tpu'"},
      {"bad cuda index", edit("device = \"cuda:1\"", "device = \"cuda:x\""), "arms.gpu.device",
       "cuda:N"},
      {"bad shape", edit("[\"w1\", \"w8\"]", "[\"w1\", \"w3\"]"), "shapes", "w3"},
      {"duplicate shape", edit("[\"w1\", \"w8\"]", "[\"w1\", \"w1\"]"), "shapes", "listed twice"},
      {"cap of an unlisted shape", edit("w8 = 3", "w256 = 3"), "chunks.w256",
       "not one of the spec's shapes"},
      {"zero cap", edit("w8 = 3", "w8 = 0"), "chunks.w8", ">= 1"},
      {"dtype on ref", edit("device = \"ref\"", "device = \"ref\"\ndtype = \"bf16\""),
       "arms.ref.dtype", "f64"},
      {"unknown cuda dtype", edit("dtype = \"f16\"", "dtype = \"fp8\""), "arms.gpu.dtype", "fp8"},
      {"bad inject", edit("scale=10\"", "scale\"\n"), "arms.cpu.inject", "[inject]"},
      {"mix off cuda", edit("threads = 2", "threads = 2\nmix = \"attn=f32\""), "arms.cpu.mix",
       "only on the cuda tier"},
      {"threads on ref", edit("device = \"ref\"", "device = \"ref\"\nthreads = 2"),
       "arms.ref.threads", "only the cpu"},
      {"bad env name", edit("ARBITER_CPU_ISA", "arbiter_cpu_isa"), "arms.cpu.env.arbiter_cpu_isa",
       "A-Z"},
      {"candidate is reference", edit("[\"cpu\", \"gpu\"]", "[\"cpu\", \"gpu\", \"ref\"]"),
       "candidates", "cannot be its own candidate"},
      {"unknown candidate", edit("[\"cpu\", \"gpu\"]", "[\"cpu\", \"gpu\", \"npu\"]"), "candidates",
       "no arm named 'npu'"},
      {"unused arm", edit("[arms.gpu]", "[arms.spare]\ndevice = \"cpu\"\n\n[arms.gpu]"),
       "arms.spare", "defined but not used"},
      {"endpoint arm with a device", edit("device = \"cuda:1\"", "endpoint = \"http://127.0.0.1:8080\"\nmodel = \"m\"\ndevice = \"cpu\""),
       "arms.gpu.device", "unknown key"},
      {"endpoint arm without a model", edit("device = \"cuda:1\"\ndtype = \"f16\"", "endpoint = \"http://127.0.0.1:8080\""),
       "arms.gpu.model", "missing (required)"},
      {"endpoint not a URL", edit("device = \"cuda:1\"\ndtype = \"f16\"", "endpoint = \"127.0.0.1:8080\"\nmodel = \"m\""),
       "arms.gpu.endpoint", "http://"},
      {"bad noise pair", edit("[[\"ref\", \"cpu\"]]", "[[\"ref\"]]"), "controls.noise_floor[0]",
       "pair of arm names"},
      {"bad arm name", edit("[arms.gpu]", "[arms.\"g p u\"]"), "arms.g p u", "letters, digits"},
      {"negative decided", edit("decided = 1.5", "decided = -1"), "decided", "> 0"},
      {"zero kl_kappa", edit("kl_kappa = 500", "kl_kappa = 0"), "kl_kappa", "> 0"},
      {"kl_kappa a string", edit("kl_kappa = 500", "kl_kappa = \"big\""), "kl_kappa", "expected a number"},
      {"not TOML", edit("topk = 4", "topk = = 4"), "spec.toml:5", "not valid TOML"},
      {"empty models",
       edit("models = [\"models/TinyStories-656K\", \"models/stories260K/stories260K.gguf\"]",
            "models = []"),
       "models", "must not be empty"},
      {"parent of an unlisted model", edit("[chunks]", "[parents]\n\"models/q.gguf\" = \"models/TinyStories-656K\"\n\n[chunks]"),
       "parents.\"models/q.gguf\"", "not one of the spec's models"},
      {"model its own parent", edit("[chunks]", "[parents]\n\"models/TinyStories-656K\" = \"models/TinyStories-656K\"\n\n[chunks]"),
       "parents.\"models/TinyStories-656K\"", "another checkpoint"},
      {"parent not a string", edit("[chunks]", "[parents]\n\"models/TinyStories-656K\" = 1\n\n[chunks]"),
       "parents.\"models/TinyStories-656K\"", "expected a string"},
      {"same model name twice",
       edit("\"models/stories260K/stories260K.gguf\"", "\"other/TinyStories-656K\""), "models",
       "share the name"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = write_spec(c.text);
    try {
      parse_matrix_spec(path);
      ADD_FAILURE() << "accepted: " << c.name;
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_EQ(msg.rfind("[matrix] " + path + ":", 0), 0u) << msg;
      EXPECT_NE(msg.find(c.key), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.problem), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    }
  }
  try {
    parse_matrix_spec("/nonexistent/spec.toml");
    ADD_FAILURE() << "a missing file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/spec.toml: cannot open"), std::string::npos)
        << e.what();
  }
}

// The environment table's driver comes from /proc/driver/nvidia/version, in both the
// proprietary and the open kernel module's wording.
TEST(MatrixHostInfo, NvidiaDriverVersion) {
  EXPECT_EQ(verify::nvidia_driver_version(
                "NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)"),
            "580.159.04");
  EXPECT_EQ(verify::nvidia_driver_version(
                "NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024"),
            "550.54.15");
  EXPECT_EQ(verify::nvidia_driver_version("no version here"), "");
}
