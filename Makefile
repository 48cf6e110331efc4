# Entry points. `make demo` and `make test` install what they need (Debian packages) first.
BUILD ?= build
JOBS ?= $(shell nproc)
ARBITER = $(BUILD)/src/arbiter
CMAKE_FLAGS ?=

.PHONY: deps build test demo asan clean

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

demo: build
	scripts/demo.sh $(ARBITER)

clean:
	rm -rf $(BUILD) build-asan
