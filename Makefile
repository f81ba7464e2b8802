# kvtier: the two commands are `make demo` and `make test`.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps deps-engines build format format-check test test-release test-asan test-tsan \
        sanitize-smoke soak fuzz fuzz-smoke demo bench gpu-check gpu-bundle wheel install deb clean

all: build

deps:
	@bash tools/install-deps.sh

# The vLLM and SGLang venvs as well, for their connector tests.
deps-engines:
	@bash tools/install-deps.sh --engines

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The C++ and CUDA sources as clang-format 14 lays them out (.clang-format): `make format`
# rewrites them, `make format-check` (the first step of make test) names those that differ.
format: deps
	@bash tools/format.sh

format-check: deps
	@bash tools/format.sh --check

# make test checks the layout of the sources (format-check), then builds and runs every test
# once: the Python suites and the install checks (labels python and install) in the release
# build, against the programs users run; every C++ suite in the ASan + UBSan build, then each fuzz
# target briefly in that same build; CacheCore, the client and the integration suites again under
# TSan. test-release runs every test of the release build (make build).
# RELEASE_ONLY: the C++ tests that skip under the sanitizers (a capped address space, an RSS
# bound), run in the release build too.
RELEASE_ONLY = ^(CacheCoreNvmeOutOfMemory\.|WritePipelinedTest\.WithoutAHelperThread|LoadTest\.)
test: deps-engines $(BUILD_DIR)/CMakeCache.txt
	@bash tools/format.sh --check
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kvtier_tests_python kvtier_installed \
	  daemon_cache_core_nvme_test tiers_write_pipeline_test load_test
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 600 -j $(JOBS) -L '^(python|install)$$'
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 600 -R '$(RELEASE_ONLY)'
	@$(MAKE) --no-print-directory test-asan
	@$(MAKE) --no-print-directory test-tsan

test-release: build deps-engines
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 600 -j $(JOBS)

# libFuzzer targets (tests/fuzz; clang, ASan + UBSan) in build-fuzz/, coverage in every file:
# `make fuzz` runs each FUZZ_RUNS times (default 1,000,000), fuzz-smoke each briefly. (make test
# runs them briefly in build-asan instead, which saves a third clang build.)
fuzz: deps
	@JOBS=$(JOBS) bash tests/fuzz/run.sh long

fuzz-smoke: deps
	@JOBS=$(JOBS) bash tests/fuzz/run.sh smoke

# Sanitizer builds in build-asan / build-tsan (tools/sanitizers/test.sh; no Python tests):
# ASan + UBSan (clang) over every C++ test, then the fuzz targets briefly; TSan (g++) over
# CacheCore, the client and the integration tests. Both are part of `make test`.
test-asan: deps
	@bash tools/sanitizers/test.sh address build-asan $(JOBS)

test-tsan: deps
	@bash tools/sanitizers/test.sh thread build-tsan $(JOBS)

# A quicker check while working: CacheCore and its tiers' tests (common/, tiers/, daemon/)
# under ASan + UBSan, and CacheCore's under TSan, built apart (build-asan-core, build-tsan-core).
sanitize-smoke: deps
	@KVTIER_SAN_SCOPE=core bash tools/sanitizers/test.sh address build-asan-core $(JOBS)
	@KVTIER_SAN_SCOPE=core bash tools/sanitizers/test.sh thread build-tsan-core $(JOBS)

# The long campaign runs (docs/RELIABILITY.md), one after another: the crash
# loop (50 cycles per run), the client-death loop (1,000 deaths per run) and
# the 60 s load test. Each test prints a CAMPAIGN line, collected in
# $(BUILD_DIR)/soak/campaign.log. About 10 minutes on 2 cores, after the build.
SOAK_LOG = $(abspath $(BUILD_DIR))/soak/campaign.log
soak: build
	@mkdir -p $(dir $(SOAK_LOG)) && rm -f $(SOAK_LOG)
	cd $(BUILD_DIR) && KVTIER_CAMPAIGN_LOG=$(SOAK_LOG) KVTIER_CRASH_CYCLES=50 \
	  KVTIER_DEATHS=1000 KVTIER_LOAD_SECONDS=60 \
	  ctest --output-on-failure --timeout 3600 -R 'CrashLoopTest|ClientDeathTest|LoadTest'
	@cat $(SOAK_LOG)

demo: build
	@bash tools/demo.sh $(BUILD_DIR)/bin

bench: build
	@bash tools/bench.sh $(BUILD_DIR)/bin

# On a GPU machine with only the CUDA toolkit and cmake: no deps step.
gpu-check:
	@bash tools/gpu-check.sh

# Built here, run there: build/gpu-bundle/run.sh.
gpu-bundle: build
	@bash tools/gpu-bundle.sh $(BUILD_DIR)/bin $(BUILD_DIR)/gpu-bundle

# The Python package as a wheel in $(BUILD_DIR)/wheels (scikit-build-core, client/python).
wheel: deps
	bash tools/build-wheel.sh $(BUILD_DIR)/wheels

# Installs the programs, the client SDK (libkvtier.so, headers, CMake package, kvtier.pc),
# the systemd unit and the sample config under $(DESTDIR)$(PREFIX) (README.md, "Install").
# Builds only what it installs, without the deps step, so `sudo make install` after
# `make build` touches nothing but the install tree.
PREFIX ?= /usr/local
install: $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kvtier_installed
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD_DIR) --prefix "$(PREFIX)"

# The Debian package kvtier_<version>_<arch>.deb in $(BUILD_DIR)/packages (CPack;
# cmake/package.cmake).
deb: deps $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kvtier_installed
	cd $(BUILD_DIR) && cpack -G DEB --config CPackConfig.cmake

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-asan-core build-tsan-core build-fuzz
