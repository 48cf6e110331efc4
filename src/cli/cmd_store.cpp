// arbiter store add|verify|compare: evidence on disk (DESIGN.md §5, docs/traces.md §Store).
#include <cstdio>
#include <cstring>

#include "cli/command.h"
#include "cli/common.h"
#include "core/error.h"
#include "verify/trace/store.h"

namespace arbiter::cli {

// Invalid UTF-8 in a label must not make the JSON dump throw.
static constexpr auto kReplace = nlohmann::json::error_handler_t::replace;

static const char* kStoreUsage =
    "usage: arbiter store add DIR TRACE...        copy traces (and TRACE.logits) in; rewrite\n"
    "                                              METADATA.txt, RUNS.txt, SHA256SUMS\n"
    "       arbiter store verify DIR              checksums, complete traces, RUNS.txt\n"
    "       arbiter store compare REFDIR CANDDIR [--decided 2.0] [--route-decided X] [--topk-only] [--json]\n"
    "                                              pair by shape + model; exit = worst verdict\n";

static int cmd_store(int argc, char** argv) {
  using namespace verify;
  if (argc < 1 || !std::strcmp(argv[0], "-h") || !std::strcmp(argv[0], "--help")) {
    std::fputs(kStoreUsage, argc < 1 ? stderr : stdout);
    return argc < 1 ? 2 : 0;
  }
  std::string sub = argv[0];
  if (sub == "add") {
    Args a("store add", {}, {});
    a.parse(argc - 1, argv + 1);
    ARB_CHECK(a.positional().size() >= 2, "[cli] store add: expected DIR TRACE...");
    std::vector<std::string> traces(a.positional().begin() + 1, a.positional().end());
    store_add(a.positional()[0], traces);
    std::fprintf(stderr, "[store] added %zu trace(s) to %s\n", traces.size(),
                 a.positional()[0].c_str());
    return 0;
  }
  if (sub == "verify") {
    Args a("store verify", {}, {});
    a.parse(argc - 1, argv + 1);
    ARB_CHECK(a.positional().size() == 1, "[cli] store verify: expected DIR");
    const std::string& dir = a.positional()[0];
    std::vector<std::string> problems = store_verify(dir, true);
    for (const auto& p : problems) std::fprintf(stderr, "arbiter store verify: %s\n", p.c_str());
    if (!problems.empty()) return 1;
    std::printf("%s: OK (%zu traces)\n", dir.c_str(), store_trace_names(dir).size());
    return 0;
  }
  if (sub == "compare") {
    try {
      Args a("store compare", {"--decided", "--route-decided"}, {"--topk-only", "--json"});
      a.parse(argc - 1, argv + 1);
      ARB_CHECK(a.positional().size() == 2, "[cli] store compare: expected REFDIR CANDDIR");
      CompareOptions opt;
      opt.decided = a.number("decided", 2.0);
      ARB_CHECK(opt.decided > 0, "[cli] store compare: --decided must be > 0");
      opt.route_decided = route_decided_option(a, "store compare");
      StoreComparison c =
          store_compare(a.positional()[0], a.positional()[1], opt, a.flag("topk-only"));
      if (a.flag("json")) std::printf("%s\n", to_json(c).dump(2, ' ', false, kReplace).c_str());
      else std::fputs(format_store_comparison(c).c_str(), stdout);
      for (const auto& p : c.problems) std::fprintf(stderr, "arbiter store compare: %s\n", p.c_str());
      return int(c.worst);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "arbiter store compare: unreadable: %s\n", e.what());
      return int(Verdict::Unreadable);
    }
  }
  throw Error("[cli] store: unknown subcommand '" + sub + "' (add, verify, compare)");
}

REGISTER_COMMAND("store", "trace store: add, verify, compare directories of traces", cmd_store);

}  // namespace arbiter::cli
