# trident build. `make` builds build/trident (CPU backend); see README.md.
#   make deps      install missing Debian packages (as root), else print the command;
#                  make .venv/ with the test suite's Python packages (tests/requirements.txt)
#                  and .venv-hf/ (torch + transformers, tests/requirements-hf.txt)
#   make run       deps, build, prepare the default corpus, train configs/tiny.ini
#   make sft       fine-tune make run's model on KJV instruction pairs (configs/sft-tiny.ini):
#                  held-out answers and response validation loss before and after (jobs/sft_example.sh)
#   make test      deps, build (and build-asan/trident for the fuzz test, build-emu/trident
#                  for the emulated CUDA tests; the venvs install meanwhile), run the
#                  test suite (last line: N passed, N failed, N skipped)
#   make test-asan the unit tests under AddressSanitizer + UBSan
#   make bench     benchmarks (tokens/s, MFU against measured sgemm, memory)
#   make test-long the long checks (tests/long/*.sh: tiny.ini 300 steps in fp32, bf16, fp16;
#                  in fp8 hybrid, current and delayed scaling, against bf16)
#   make CUDA=1    also build the CUDA backend (kernels/cuda) with nvcc
#   make EMU=1     the CUDA build run on CPUs (into build-emu): kernels/cuda/*.cu
#                  as host C++ against tests/cuda_emu (emulated runtime, cuBLASLt
#                  and NCCL over MPI), see docs/cuda.md

PKGS      := hdf5 inih openblas libpcre2-8 jansson ompi-c libxxhash libutf8proc libisal
CC        ?= gcc
CXX       ?= g++
ifeq ($(EMU),1)
BUILD     ?= build-emu
endif
BUILD     ?= build
OPT       ?= -O3 -march=native
CFLAGS    += $(OPT) -g -std=gnu11 -fopenmp -Wall -Wextra -Wno-unused-parameter \
             -Isrc -I. -MMD -MP $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
# oneDNN (libdnnl-dev; no pkg-config file): the CPU backend's BF16 GEMM.
LDLIBS    += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -ldnnl -lm -lpthread
LDFLAGS   += -fopenmp

# src/<subsystem>/*.c (docs/design.md §1); src/cli/ is the executable's own.
LIB_SRC   := $(filter-out src/cli/%.c src/parallel/comm_nccl.c,$(wildcard src/*/*.c)) \
             $(wildcard kernels/*.c) $(wildcard kernels/cpu/*.c)
CLI_OBJ   := $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/cli/*.c))

# CUDA=1: kernels/cuda/*.cu with nvcc and src/parallel/comm_nccl.c join the library;
# -DTRIDENT_CUDA tells kernels/backend.c (only) that the CUDA backend exists.
CUDA_HOME  ?= /usr/local/cuda
NVCC       ?= $(CUDA_HOME)/bin/nvcc
# Architectures: sm_80 (A100: everything but FP8), sm_89 (Ada: L4, L40S) and
# sm_90 (H100, H200); FP8 training needs 8.9 or newer (backend_check_fp8).
CUDA_ARCHS ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_89,code=sm_89 \
              -gencode arch=compute_90,code=sm_90
CU_OBJ    :=
# cuDNN and NCCL outside CUDA_HOME (tests/gpu/probe.sh finds them there, in the
# system or in Python wheels and prints these): folders of cudnn.h / nccl.h
# (-isystem: their warnings are not trident's) and of libcudnn.so* /
# libnccl.so* (-L and an rpath, so the binary finds the libraries at run
# time); CUDA_SHIMS: a folder of unversioned links (libcudnn.so ->
# .../libcudnn.so.9) for -l where only libX.so.N exists (-L only). Empty:
# CUDA_HOME's include and lib64 or the system's.
CUDNN_INC  ?=
CUDNN_LIB  ?=
NCCL_INC   ?=
NCCL_LIB   ?=
CUDA_SHIMS ?=
ifeq ($(CUDA),1)
CUDA_LIBDIRS := $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib
CUDA_DEP_INC := $(sort $(CUDNN_INC) $(NCCL_INC))
CUDA_DEP_LIB := $(sort $(CUDNN_LIB) $(NCCL_LIB))
CFLAGS    += -DTRIDENT_CUDA -DTRIDENT_NVTX -I$(CUDA_HOME)/include $(CUDA_DEP_INC:%=-isystem %)
NVFLAGS   := -O3 -g -std=c++17 $(CUDA_ARCHS) -DTRIDENT_CUDA -Isrc -I. $(CUDA_DEP_INC:%=-isystem %) -MMD -MP \
             -Xcompiler -Wall,-Wextra,-Wno-unused-parameter
LIB_SRC   += src/parallel/comm_nccl.c
CU_OBJ    := $(patsubst %.cu,$(BUILD)/%.o,$(wildcard kernels/cuda/*.cu))
LDLIBS    += $(CUDA_SHIMS:%=-L%) $(CUDA_DEP_LIB:%=-L%) $(CUDA_DEP_LIB:%=-Wl,-rpath,%) \
             $(CUDA_LIBDIRS:%=-L%) $(CUDA_LIBDIRS:%=-Wl,-rpath,%) \
             -lcudnn -lnccl -lcublasLt -lcublas -lcudart -lstdc++ -ldl
endif
# EMU=1: the CUDA build on CPUs (docs/cuda.md). The same sources as CUDA=1,
# with tests/cuda_emu first on the include path, so <cuda_runtime_api.h>,
# <nccl.h>, <cublasLt.h>... are the emulation's (C files such as comm_nccl.c
# included); each kernels/cuda/*.cu is preprocessed as C++, its launches
# kernel<<<cfg>>>(args) rewritten to emu_launch(cfg, kernel, args) and
# compiled with g++ (rule below); tests/cuda_emu/*.cpp (the emulated runtime,
# cuBLASLt, NCCL over MPI) join the library, except check_*.cpp: programs
# built into $(BUILD)/tests.
EMU_DIR   := tests/cuda_emu
EMU_OBJ   :=
EMU_PROG  :=
ifeq ($(EMU),1)
ifeq ($(CUDA),1)
$(error EMU=1 and CUDA=1 exclude each other: EMU=1 is the CUDA build without nvcc)
endif
CFLAGS    += -DTRIDENT_CUDA -DTRIDENT_CUDA_EMU -I$(EMU_DIR)
EMU_CXXFLAGS := $(filter-out -std=gnu11 -fopenmp -I%,$(CFLAGS)) -std=c++20 -pthread \
             -I$(EMU_DIR) -Isrc -I. $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LIB_SRC   += src/parallel/comm_nccl.c
CU_OBJ    := $(patsubst %.cu,$(BUILD)/%.o,$(wildcard kernels/cuda/*.cu))
EMU_OBJ   := $(patsubst %.cpp,$(BUILD)/%.o,$(filter-out $(EMU_DIR)/check_%.cpp,$(wildcard $(EMU_DIR)/*.cpp)))
EMU_PROG  := $(patsubst $(EMU_DIR)/%.cpp,$(BUILD)/tests/%,$(wildcard $(EMU_DIR)/check_*.cpp))
LDLIBS    += -lstdc++ -pthread
# NVTX ranges (src/base/nvtx.h) when the toolkit's header-only nvtx3 is here:
# only src/base/nvtx.c includes it, from after the system directories
# (-idirafter), so no other toolkit header replaces an emulated one.
ifneq ($(wildcard $(CUDA_HOME)/include/nvtx3/nvToolsExt.h),)
CFLAGS    += -DTRIDENT_NVTX
LDLIBS    += -ldl
$(BUILD)/src/base/nvtx.o: CFLAGS += -idirafter $(CUDA_HOME)/include
endif
endif
# Rebuilds backend.o when CUDA= or EMU= changes between two makes in one BUILD dir.
$(shell mkdir -p $(BUILD) && f=$(BUILD)/cuda.flag && \
  [ "$$(cat $$f 2>/dev/null)" = "CUDA=$(CUDA) EMU=$(EMU)" ] || echo "CUDA=$(CUDA) EMU=$(EMU)" > $$f)
# The version (src/base/version.h): the release in VERSION and the commit
# (`git describe --always --dirty`, tags left out so that it is the hash;
# "unknown" without .git here). version.flag changes only when they do, so
# an incremental build recompiles version.o alone and relinks.
TRIDENT_RELEASE := $(shell cat VERSION 2>/dev/null || echo unknown)
TRIDENT_GIT     := $(shell [ -e .git ] && git describe --always --dirty --exclude='*' 2>/dev/null || echo unknown)
$(shell f=$(BUILD)/version.flag && \
  [ "$$(cat $$f 2>/dev/null)" = "$(TRIDENT_RELEASE) $(TRIDENT_GIT)" ] || echo "$(TRIDENT_RELEASE) $(TRIDENT_GIT)" > $$f)
# The CPU kernels a second time without OpenMP, for single-thread runs
# (-DCPU_SERIAL: linked as cpu_serial_<op>, see kernels/cpu/cpu.h;
# cpu_backend.c picks the table).
CPU_SERIAL_SRC := $(filter-out kernels/cpu/cpu_backend.c kernels/cpu/cpu_memory.c,$(wildcard kernels/cpu/*.c))
CPU_SERIAL_OBJ := $(CPU_SERIAL_SRC:kernels/cpu/%.c=$(BUILD)/kernels/cpu-serial/%.o)
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CPU_SERIAL_OBJ) $(CU_OBJ) $(EMU_OBJ)
# AdamW's loop vectorizes only without errno for sqrtf; its FMAs are explicit
# (kernels/cpu/cpu_optim.c).
$(BUILD)/kernels/cpu/cpu_optim.o $(BUILD)/kernels/cpu-serial/cpu_optim.o: \
    CFLAGS += -fno-math-errno -ffp-contract=off
TEST_SRC  := $(wildcard tests/unit/test_*.c)
TEST_BIN  := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
MPI_SRC   := $(wildcard tests/mpi/*.c)
MPI_BIN   := $(MPI_SRC:tests/mpi/%.c=$(BUILD)/mpi/%)
BENCH_SRC := $(wildcard tests/bench/bench_*.c)
BENCH_BIN := $(BENCH_SRC:tests/bench/%.c=$(BUILD)/bench/%)

.PHONY: all deps run sft test test-long test-asan bench clean tests benches
all: $(BUILD)/trident tests benches

# Header dependencies come from the compiler (-MMD -MP): $(BUILD)/**/*.d.
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

ifeq ($(EMU),1)
# CUDA source to object: preprocess (the .d file comes from this step),
# rewrite, compile. The rewrites: a launch (kernel name, optional template
# arguments, <<<cfg>>>( ) becomes emu_launch(cfg, kernel, ...; dynamic shared
# memory (`extern __shared__ T name[];`, `extern static ...` once
# preprocessed) becomes a pointer to the launch's (cuda_emu.h).
EMU_REWRITE := s/([A-Za-z_][\w:]*(?:\s*<[^<>;(){}]*>)?)\s*<\s*<\s*<(.*?)>\s*>\s*>\s*\(/emu_launch($$2, $$1, /gs; \
               s/\bextern\s+static\s+(?:alignas\(\d+\)\s+)?([A-Za-z_][\w:]*)\s+(?:alignas\(\d+\)\s+)?(\w+)\s*\[\s*\]\s*;/$$1 *$$2 = ($$1 *)emu_dynamic_shared();/g
define emu_cuda_compile
	@mkdir -p $(dir $@)
	$(CXX) -E -x c++ $(EMU_CXXFLAGS) -MT $@ -MF $(basename $@).d $< -o $(basename $@).ii
	perl -0pe '$(EMU_REWRITE)' $(basename $@).ii > $(basename $@).emu.cpp
	$(CXX) -x c++ $(filter-out -MMD -MP,$(EMU_CXXFLAGS)) -Wno-unknown-pragmas $(basename $@).emu.cpp
endef
$(BUILD)/kernels/cuda/%.o: kernels/cuda/%.cu
	$(emu_cuda_compile) -c -o $@

$(BUILD)/$(EMU_DIR)/%.o: $(EMU_DIR)/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

# Programs checking the emulation itself, with kernels written as CUDA.
$(BUILD)/tests/check_%: $(EMU_DIR)/check_%.cpp $(BUILD)/libtrident.a
	$(emu_cuda_compile) -x none $(BUILD)/libtrident.a -o $@ $(LDFLAGS) $(LDLIBS)
else
$(BUILD)/kernels/cuda/%.o: kernels/cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@
endif

$(BUILD)/kernels/backend.o: $(BUILD)/cuda.flag
$(BUILD)/src/base/version.o: $(BUILD)/version.flag
$(BUILD)/src/base/version.o: CFLAGS += -DTRIDENT_RELEASE='"$(TRIDENT_RELEASE)"' -DTRIDENT_GIT='"$(TRIDENT_GIT)"'

$(BUILD)/kernels/cpu-serial/%.o: kernels/cpu/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fno-openmp -Wno-unknown-pragmas -DCPU_SERIAL -c $< -o $@

$(BUILD)/libtrident.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/trident: $(CLI_OBJ) $(BUILD)/libtrident.a
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

tests: $(TEST_BIN) $(MPI_BIN) $(EMU_PROG)
$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libtrident.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MF $@.d -Itests/unit $< $(BUILD)/libtrident.a -o $@ $(LDFLAGS) $(LDLIBS)

# Multi-rank test programs, run under mpirun by tests/e2e/*.sh.
$(BUILD)/mpi/%: tests/mpi/%.c $(BUILD)/libtrident.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MF $@.d $< $(BUILD)/libtrident.a -o $@ $(LDFLAGS) $(LDLIBS)

benches: $(BENCH_BIN)
$(BUILD)/bench/%: tests/bench/%.c $(BUILD)/libtrident.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MF $@.d -Itests/unit $< $(BUILD)/libtrident.a -o $@ $(LDFLAGS) $(LDLIBS)

deps:
	@scripts/deps.sh

# The AddressSanitizer + UBSan build (build-asan/): test-asan's unit tests, and
# build-asan/trident, which `make test` builds too for tests/e2e/fuzz_readers.sh.
ASAN_MAKE := BUILD=build-asan OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
             LDFLAGS="-fopenmp -fsanitize=address,undefined"

# make test: the Debian packages first (the builds need their headers), then
# the venvs (downloads, mostly network and disk; log in $(BUILD)/deps-venvs.log)
# in the background while the builds run: all, build-asan/trident and
# $(BUILD)-emu/trident (the emulated CUDA build the tests' need_emu would
# otherwise build in the middle of the suite), each on every CPU unless
# make was given -j (TEST_JOBS). all and the emulated build compile through
# ccache when it is installed (scripts/deps.sh installs it; cache in
# build-ccache/): most C files are the same text once preprocessed with the
# emulated build's flags as with the CPU build's (TRIDENT_CUDA changes a
# few), and ccache's preprocessor mode gives them the CPU build's objects and
# warnings; tests/e2e/cuda_build.sh's CUDA build does the same.
TEST_JOBS = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(shell nproc 2>/dev/null || echo 2))
TEST_CC = $(if $(shell command -v ccache 2>/dev/null),ccache )$(CC)
test:
	@scripts/deps.sh packages
	@log=$(BUILD)/deps-venvs.log; scripts/deps.sh venvs >$$log 2>&1 & venvs=$$!; rc=0; \
	export CCACHE_DIR="$(CURDIR)/build-ccache"; \
	$(MAKE) --no-print-directory $(TEST_JOBS) CC="$(TEST_CC)" all && \
	$(MAKE) --no-print-directory $(TEST_JOBS) $(ASAN_MAKE) build-asan/trident && \
	$(MAKE) --no-print-directory $(TEST_JOBS) CC="$(TEST_CC)" EMU=1 BUILD=$(BUILD)-emu \
	    $(BUILD)-emu/trident || rc=$$?; \
	vrc=0; wait $$venvs || vrc=$$?; cat $$log; \
	[ $$vrc -eq 0 ] || { echo "scripts/deps.sh venvs: exit $$vrc"; exit $$vrc; }; exit $$rc
	@BUILD=$(BUILD) tests/run.sh

test-long: deps
	@$(MAKE) --no-print-directory all
	@set -e; for t in tests/long/*.sh; do echo "== $$t"; BUILD=$(BUILD) bash $$t; done

test-asan: deps
	@$(MAKE) --no-print-directory $(ASAN_MAKE) tests build-asan/trident
	@BUILD=build-asan ASAN=1 tests/run.sh

bench: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) tests/bench/run.sh

run: deps
	@$(MAKE) --no-print-directory all
	@scripts/run_default.sh $(ARGS)

# The SFT example (README "Fine-tuning") on make run's latest model: answers
# before, fine-tuning, validation loss before and after, answers after.
sft: $(BUILD)/trident
	@BUILD=$(BUILD) jobs/sft_example.sh $(ARGS)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

clean:
	rm -rf build build-asan build-cuda build-gpu build-emu build-ccache
