// Side specs (verify/localize/side.h), --mix specs (backend/mix.h) and the unit roundoffs the bounds
// are built from. To add a case: a spec string and the fields it must give (or the words its
// error must contain).
#include "verify/localize/side.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "backend/mix.h"
#include "core/error.h"

using namespace arbiter;
using namespace arbiter::verify;

static std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Side, ParsesDeviceIndexDtype) {
  Side s = parse_side("ref");
  EXPECT_EQ(s.spec.device, "ref");
  EXPECT_EQ(s.spec.dtype, "");
  EXPECT_FALSE(s.inject.active);
  s = parse_side("cuda:bf16");
  EXPECT_EQ(s.spec.device, "cuda");
  EXPECT_EQ(s.spec.dtype, "bf16");
  s = parse_side("cuda:0:f32");
  EXPECT_EQ(s.spec.device, "cuda:0");
  EXPECT_EQ(s.spec.dtype, "f32");
  s = parse_side("cuda:3");
  EXPECT_EQ(s.spec.device, "cuda:3");
  EXPECT_EQ(s.spec.dtype, "");
  s = parse_side(" cpu ");
  EXPECT_EQ(s.spec.device, "cpu");
  EXPECT_EQ(s.label, "cpu");
}

TEST(Side, InjectAndMixSuffixes) {
  Side s = parse_side("cpu+inject=op=down,layer=0,scale=3");
  EXPECT_EQ(s.spec.device, "cpu");
  ASSERT_TRUE(s.inject.active);
  EXPECT_EQ(s.inject.stage, "down");
  EXPECT_EQ(s.inject.layer, 0);
  EXPECT_DOUBLE_EQ(s.inject.scale, 3.0);
  EXPECT_EQ(s.label, "cpu+inject=op=down,layer=0,scale=3");
  s = parse_side("cuda:bf16+mix=attn=f32,mlp=bf16+inject=op=up,scale=2");
  EXPECT_EQ(s.spec.mix, "attn=f32,mlp=bf16");
  ASSERT_TRUE(s.inject.active);
  EXPECT_EQ(s.inject.stage, "up");
  EXPECT_DOUBLE_EQ(s.inject.scale, 2.0);
}

TEST(Side, ListKeepsCommasOfSpecsWithTheirSide) {
  auto v = parse_sides("ref,cpu+inject=op=down,layer=0,scale=3,cuda:bf16");
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].label, "ref");
  EXPECT_EQ(v[1].label, "cpu+inject=op=down,layer=0,scale=3");
  EXPECT_EQ(v[1].inject.layer, 0);
  EXPECT_EQ(v[2].spec.device, "cuda");
  EXPECT_EQ(v[2].spec.dtype, "bf16");
  v = parse_sides("ref,cpu,cpu+inject=op=logits,noise=0.1");
  ASSERT_EQ(v.size(), 3u);
  EXPECT_DOUBLE_EQ(v[2].inject.noise, 0.1);
  // A fragment that is neither a side nor a key=value continuing a spec is named.
  EXPECT_NE(error_of([] { parse_sides("ref,gpu"); }).find("'gpu': unknown device"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_sides("ref,cpu+inject=op=up,scale=2,xpu");
            }).find("'xpu': unknown device"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_sides("ref,scale=2"); }).find("'scale=2': unknown device"),
            std::string::npos);
}

TEST(Side, BadSidesAreNamed) {
  EXPECT_NE(error_of([] { parse_side("gpu"); }).find("unknown device 'gpu'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_side("cpu:bf16"); }).find("cpu computes in f32"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_side("ref:0"); }).find("index applies to cuda"), std::string::npos);
  EXPECT_NE(error_of([] { parse_side("cuda:x"); }).find("unexpected 'x'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_side("cpu+foo=1"); }).find("unknown suffix"), std::string::npos);
  EXPECT_NE(error_of([] { parse_side("cpu+mix=attn=f32"); }).find("cuda sides only"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_side("cpu+inject=op=nope,scale=2"); }).find("unknown stage"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_side(""); }).find("empty side"), std::string::npos);
}

TEST(Mix, ParsesAndRefusesBadSpecs) {
  MixSpec m = parse_mix("attn=f32,mlp=bf16,norm=f32");
  ASSERT_EQ(m.entries.size(), 3u);
  EXPECT_EQ(m.dtype_of("attn"), "f32");
  EXPECT_EQ(m.dtype_of("mlp"), "bf16");
  EXPECT_EQ(m.dtype_of("logits"), "");
  EXPECT_EQ(m.text(), "attn=f32,mlp=bf16,norm=f32");
  EXPECT_TRUE(parse_mix("").empty());
  EXPECT_TRUE(parse_mix("none").empty());
  EXPECT_NE(error_of([] { parse_mix("ffn=f32"); }).find("unknown op family 'ffn'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mix("attn=f64"); }).find("dtype 'f64'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_mix("attn=f32,attn=bf16"); }).find("given twice"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mix("attn"); }).find("not family=dtype"), std::string::npos);
  EXPECT_NE(error_of([] { parse_mix("attn=f32,"); }).find("trailing"), std::string::npos);
}

TEST(Mix, MakeBackendRefusesMixRatherThanIgnoreIt) {
  DeviceSpec spec{"cpu", "", 1, "attn=f32"};
  EXPECT_NE(error_of([&] { make_backend(spec); }).find("only on the cuda tier"), std::string::npos);
  spec.mix = "bogus=f32";
  EXPECT_NE(error_of([&] { make_backend(spec); }).find("unknown op family"), std::string::npos);
  spec.device = "cuda";
  spec.mix = "attn=f32";
  // Built without CUDA, or with a CUDA tier that does not honour --mix yet: refused either way.
  EXPECT_NE(error_of([&] { make_backend(spec); }), "");
}

TEST(Roundoff, UnitRoundoffsOfEachType) {
  // u = 2^-p for p significand bits (f64 53, f32 24, bf16 8, f16 11).
  EXPECT_EQ(roundoff_of(DType::F64).storage, 1.1102230246251565e-16);
  EXPECT_EQ(roundoff_of(DType::F32).storage, 5.9604644775390625e-08);
  EXPECT_EQ(roundoff_of(DType::BF16).storage, 0.00390625);
  EXPECT_EQ(roundoff_of(DType::F16).storage, 0.00048828125);
  EXPECT_EQ(roundoff_of(DType::BF16).accum, 5.9604644775390625e-08);
  EXPECT_EQ(roundoff_of(DType::F64).accum, 1.1102230246251565e-16);
  Roundoff c = coarser(roundoff_of(DType::F64), roundoff_of(DType::BF16));
  EXPECT_EQ(c.storage, 0.00390625);
  EXPECT_EQ(c.accum, 5.9604644775390625e-08);
  EXPECT_THROW(roundoff_of(DType::Q8_0), Error);  // a storage type, not a compute type
  EXPECT_EQ(compute_dtype_from_name("bf16"), DType::BF16);
  EXPECT_THROW(compute_dtype_from_name("q8_0"), Error);
  EXPECT_THROW(compute_dtype_from_name("f8"), Error);
}
