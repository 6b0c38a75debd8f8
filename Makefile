# Front door for users and CI. Every target first makes sure the Debian packages are present
# (scripts/setup.sh is a no-op when they are) and the build is current.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CHORUS := $(BUILD)/cli/chorus

.PHONY: all setup configure build test demo bench asan clean format tidy

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

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

tidy: configure
	@git ls-files '*.cc' | grep -v '^tests/\|^bench/' | xargs clang-tidy -p $(BUILD) --quiet

clean:
	@rm -rf $(BUILD) build-asan
