// A "side" of a cross-tier comparison: which tier, at which precision, with which fault.
// Written DEVICE[:INDEX][:DTYPE][+inject=SPEC][+mix=SPEC], e.g. "ref", "cpu", "cuda:bf16",
// "cuda:0:f32", "cpu+inject=op=down,layer=0,scale=3", "cuda:bf16+mix=attn=f32".
// Each side becomes its own Backend through make_tier() (engine/probe.h).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/inject.h"
#include "engine/probe.h"

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

}  // namespace arbiter::verify
