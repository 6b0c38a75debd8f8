# Front door for users and CI. Every target first makes sure the Debian packages are present
# (scripts/setup.sh is a no-op when they are) and the build is current.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CHORUS := $(BUILD)/cli/chorus

.PHONY: all setup configure build test demo demo-sparse bench asan tsan fuzz clean format tidy

all: build

setup:
	@bash scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

# The whole test suite (unit, multi-node on loopback, fault and bad-input tests).
test: build
	@ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS) --timeout 900

# The main job: see README.md.
demo: build
	@bash scripts/demo.sh $(CHORUS)

# The third command of README.md: PS techniques against sparse gossip on WN18RR (4 nodes).
demo-sparse: build
	@bash scripts/demo_sparse.sh $(CHORUS)

# Benchmarks run from a Release tree of their own: bench/README.md's figures are Release
# figures, and the default build keeps debug info (RelWithDebInfo), which is slower.
BENCH_BUILD ?= build-release
bench:
	@$(MAKE) --no-print-directory build BUILD=$(BENCH_BUILD) \
		CMAKE_FLAGS="$(CMAKE_FLAGS) -DCMAKE_BUILD_TYPE=Release -DCHORUS_BUILD_BENCH=ON -DCHORUS_BUILD_TESTS=OFF"
	@bash scripts/bench.sh $(BENCH_BUILD)

# Tests under AddressSanitizer + UndefinedBehaviorSanitizer in a separate build tree.
asan:
	@$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DCHORUS_SANITIZE=ON -DCHORUS_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug"

# Tests under ThreadSanitizer in a separate build tree (docs/threading.md).
tsan:
	@TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp $(TSAN_OPTIONS)" $(MAKE) test BUILD=build-tsan CMAKE_FLAGS="-DCHORUS_TSAN=ON -DCHORUS_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG='-O1 -g'"

# libFuzzer targets for every reader of untrusted bytes, built with clang in a tree of their own
# and run FUZZ_SECONDS each (docs/fuzzing.md).
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
fuzz:
	@$(MAKE) --no-print-directory configure BUILD=$(FUZZ_BUILD) \
		CMAKE_FLAGS="$(CMAKE_FLAGS) -DCMAKE_CXX_COMPILER=clang++ -DCHORUS_FUZZ=ON -DCHORUS_BUILD_TESTS=OFF -DCHORUS_BUILD_BENCH=OFF -DCHORUS_NATIVE=OFF -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG='-O1 -gline-tables-only'"
	@cmake --build $(FUZZ_BUILD) -j$(JOBS) --target chorus_fuzz_all
	@bash scripts/fuzz.sh --build $(FUZZ_BUILD) --seconds $(FUZZ_SECONDS)

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

tidy: configure
	@git ls-files '*.cc' | grep -v '^tests/\|^bench/' | xargs clang-tidy -p $(BUILD) --quiet

clean:
	@rm -rf $(BUILD) build-asan build-tsan build-fuzz
