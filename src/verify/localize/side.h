// A "side" of a cross-tier comparison: which tier, at which precision, with which fault.
// Written DEVICE[:INDEX][:DTYPE][+inject=SPEC][+mix=SPEC], e.g. "ref", "cpu", "cuda:bf16",
// "cuda:0:f32", "cpu+inject=op=down,layer=0,scale=3", "cuda:bf16+mix=attn=f32".
// Each side becomes its own Backend through make_backend().
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/inject.h"

namespace arbiter::verify {

struct Side {
  std::string label;  // the text as given (trimmed); names the side in every report
  DeviceSpec spec;    // device ("ref", "cpu", "cuda", "cuda:N"), dtype ("" = tier default), mix
  InjectSpec inject;  // fault injected on this side only (inactive by default)
};

/// Parses one side. Throws arbiter::Error "[side] 'TEXT': ..." naming what is wrong
/// (unknown device, dtype, index on a non-cuda device, bad inject/mix spec).
Side parse_side(const std::string& text);

/// Splits a comma-separated list of sides. Inject and mix specs hold commas themselves, so a
/// fragment that does not start with a device name (ref, cpu, cuda) continues the side
/// before it: "ref,cpu+inject=op=down,layer=0,scale=3,cuda:bf16" is three sides.
std::vector<Side> parse_sides(const std::string& list);

/// Makes the side's backend (threads from the caller: 0 = all cores).
std::unique_ptr<Backend> make_side_backend(const Side& s, int threads);

/// Unit roundoffs of a compute type: storage u_s (activations rounded to it between ops)
/// and accumulation u_a (dot products and sums): f64 2^-53/2^-53, f32 2^-24/2^-24,
/// bf16 2^-8/2^-24, f16 2^-11/2^-24 (every reduced-precision tier accumulates in f32).
struct Roundoff {
  double storage = 0, accum = 0;
};
/// Throws arbiter::Error for an unknown compute name.
Roundoff roundoff_of(const std::string& compute);
/// Componentwise max: a comparison of two inexact sides is bounded by the coarser one.
Roundoff coarser(const Roundoff& a, const Roundoff& b);

}  // namespace arbiter::verify
