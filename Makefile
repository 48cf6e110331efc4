# Entry points. `make demo` and `make test` install what they need (Debian packages) first.
BUILD ?= build
JOBS ?= $(shell nproc)
ARBITER = $(BUILD)/src/arbiter
CMAKE_FLAGS ?=

ASAN_BUILD ?= build-asan
FUZZ_SECONDS ?= 600
ASAN_CMAKE = CC=clang-14 CXX=clang++-14 cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	-DARBITER_FUZZ=ON -DARBITER_CUDA=OFF >/dev/null

.PHONY: deps build test demo asan fuzz clean

deps:
	@scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DARBITER_BENCH=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer (CPU tiers only, clang),
# and each libFuzzer harness (fuzz/, docs/reliability.md) ~10 s on its committed seeds: one
# build serves both. `make fuzz` runs each harness FUZZ_SECONDS on a corpus kept in
# $(ASAN_BUILD)/corpus/NAME (grown across runs), stats in $(ASAN_BUILD)/fuzz-NAME.log, a
# finding's input in $(ASAN_BUILD)/crash-* (or timeout-*, oom-*).
asan: deps
	$(ASAN_CMAKE)
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j$(JOBS)

fuzz: deps
	$(ASAN_CMAKE)
	cmake --build $(ASAN_BUILD) -j$(JOBS) --target $(patsubst fuzz/%.cpp,%,$(wildcard fuzz/fuzz_*.cpp))
	@set -e; for h in fuzz/fuzz_*.cpp; do n=$$(basename $$h .cpp); n=$${n#fuzz_}; \
	  mkdir -p $(ASAN_BUILD)/corpus/$$n; echo "[fuzz] $$n: $(FUZZ_SECONDS) s"; \
	  $(ASAN_BUILD)/fuzz/fuzz_$$n -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 \
	    -max_len=65536 -print_final_stats=1 -artifact_prefix=$(ASAN_BUILD)/ $(ASAN_BUILD)/corpus/$$n fuzz/corpus/$$n \
	    >$(ASAN_BUILD)/fuzz-$$n.log 2>&1 || { tail -40 $(ASAN_BUILD)/fuzz-$$n.log; exit 1; }; \
	  grep -E 'stat::number_of_executed_units|Done [0-9]+ runs' $(ASAN_BUILD)/fuzz-$$n.log | tail -2; done

demo: build
	scripts/demo.sh $(ARBITER)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
