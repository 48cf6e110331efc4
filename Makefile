# Entry points. `make demo` and `make test` install what they need (Debian packages) first.
BUILD ?= build
JOBS ?= $(shell nproc)
ARBITER = $(BUILD)/src/arbiter
CMAKE_FLAGS ?=

FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 600
FUZZ_CMAKE = CC=clang-14 CXX=clang++-14 cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	-DARBITER_FUZZ=ON -DARBITER_CUDA=OFF >/dev/null

.PHONY: deps build test demo asan fuzz fuzz-smoke clean

deps:
	@scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DARBITER_BENCH=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer (CPU tiers only).
asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DARBITER_SANITIZE=ON -DARBITER_CUDA=OFF >/dev/null
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ctest --output-on-failure -j$(JOBS)

# libFuzzer harnesses (fuzz/, docs/reliability.md), clang with ASan + UBSan. fuzz-smoke: each
# harness ~10 s on its committed seeds (CI). fuzz: each FUZZ_SECONDS on a corpus kept in
# $(FUZZ_BUILD)/corpus/NAME (grown across runs), stats in $(FUZZ_BUILD)/fuzz-NAME.log, a
# finding's input in $(FUZZ_BUILD)/crash-* (or timeout-*, oom-*).
fuzz-smoke: deps
	$(FUZZ_CMAKE)
	cmake --build $(FUZZ_BUILD) -j$(JOBS)
	cd $(FUZZ_BUILD) && ctest --output-on-failure -j$(JOBS)

fuzz: deps
	$(FUZZ_CMAKE)
	cmake --build $(FUZZ_BUILD) -j$(JOBS)
	@set -e; for h in fuzz/fuzz_*.cpp; do n=$$(basename $$h .cpp); n=$${n#fuzz_}; \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$n; echo "[fuzz] $$n: $(FUZZ_SECONDS) s"; \
	  $(FUZZ_BUILD)/fuzz/fuzz_$$n -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 \
	    -max_len=65536 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/ $(FUZZ_BUILD)/corpus/$$n fuzz/corpus/$$n \
	    >$(FUZZ_BUILD)/fuzz-$$n.log 2>&1 || { tail -40 $(FUZZ_BUILD)/fuzz-$$n.log; exit 1; }; \
	  grep -E 'stat::number_of_executed_units|Done [0-9]+ runs' $(FUZZ_BUILD)/fuzz-$$n.log | tail -2; done

demo: build
	scripts/demo.sh $(ARBITER)

clean:
	rm -rf $(BUILD) build-asan $(FUZZ_BUILD)
