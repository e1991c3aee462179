# Diaspora: the two Quickstart commands are `make demo` and `make test`.
# Everything goes through CMake + Ninja (+ ccache); this file only sequences the steps.

BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CTEST_FLAGS ?=
TARGETS ?=

.PHONY: all deps configure build test demo bench fuzz chaos test-asan test-tsan build-asan build-tsan clean help

all: build

help:
	@echo "make demo       install what is missing, build, run the demo"
	@echo "make test       install what is missing, build, run every test (ctest)"
	@echo "make build      configure and build into $(BUILD_DIR)/ (bin/, lib/)"
	@echo "make bench      build and run the benchmarks in bench/"
	@echo "make fuzz       build the fuzz targets with clang + libFuzzer into build-fuzz/ and run each"
	@echo "                (FUZZ_SECONDS=60 each, FUZZ_TARGETS=\"event frame ...\"; docs/reliability.md)"
	@echo "make chaos      build, then the long form of the fault tests (tests/chaos/, docs/reliability.md)"
	@echo "make test-asan  build into build-asan/ with ASan+UBSan and run the tests"
	@echo "make test-tsan  build into build-tsan/ with ThreadSanitizer and run the C++ tests"
	@echo "make build-asan, make build-tsan   only build what test-asan / test-tsan run"

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) $(if $(TARGETS),--target $(TARGETS))

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

demo: build
	@bash scripts/demo.sh $(BUILD_DIR)

bench: build
	@bash scripts/bench.sh $(BUILD_DIR)

fuzz:
	@bash scripts/fuzz.sh

# The short form runs in make test (python.test_chaos); mounts a small tmpfs (root).
chaos: build
	@DIASPORA_BIN_DIR=$(abspath $(BUILD_DIR))/bin .venv/bin/python tests/chaos/chaos.py

# Sanitized builds carry line tables only (-g1): a sanitizer's report still names file and
# line; -g's variable info made the objects 12-30 % larger and the compiles 5-10 % (up to 30 %) slower.
SAN_DEBUG = -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DCMAKE_C_FLAGS_DEBUG=-g1

# Under ASan + UBSan: every test but those labelled repeat (pure Python, or a path another
# test already runs: the demo, the benchmarks' tables) or training (the trainer's whole runs
# in C++ tests; its code runs under ASan in the Python tests; docs/building.md, "Tests").
ASAN_MAKE = BUILD_DIR=build-asan BUILD_TYPE=Debug \
	CMAKE_FLAGS="-DDIASPORA_SANITIZE=address,undefined -DDIASPORA_BUILD_BENCH=OFF $(SAN_DEBUG)"
test-asan:
	@$(MAKE) --no-print-directory test $(ASAN_MAKE) CTEST_FLAGS="-LE 'repeat|training'"
build-asan:
	@$(MAKE) --no-print-directory build $(ASAN_MAKE)

# Under ThreadSanitizer: the C++ tests (labels unit, plugin: the plugin's concurrency test
# with many engine threads and a relay, the C ABI test). Python cannot load a TSan library.
# Only what those tests run is built.
TSAN_MAKE = BUILD_DIR=build-tsan BUILD_TYPE=Debug \
	CMAKE_FLAGS="-DDIASPORA_SANITIZE=thread -DDIASPORA_BUILD_BENCH=OFF -DDIASPORA_WITH_TORCH=OFF $(SAN_DEBUG)" \
	TARGETS="diaspora_unit_tests plugin_abi_test"
test-tsan:
	@$(MAKE) --no-print-directory test $(TSAN_MAKE) CTEST_FLAGS="-L 'unit|plugin'"
build-tsan:
	@$(MAKE) --no-print-directory build $(TSAN_MAKE)

clean:
	rm -rf build build-asan build-tsan build-fuzz
