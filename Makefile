# trident build. `make` builds build/trident (CPU backend); see README.md.
#   make deps      install missing Debian packages (as root), else print the command;
#                  make .venv/ with the test suite's Python packages (tests/requirements.txt)
#   make run       deps, build, prepare the default corpus, train configs/tiny.ini
#   make test      deps, build, run the test suite (last line: N passed, N failed, N skipped)
#   make test-asan the unit tests under AddressSanitizer + UBSan
#   make bench     benchmarks (tokens/s, MFU against measured sgemm, memory)
#   make CUDA=1    also build the CUDA backend (kernels/cuda) with nvcc

PKGS      := hdf5 inih openblas libpcre2-8 jansson ompi-c libxxhash
CC        ?= gcc
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
CUDA_ARCHS ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
CU_OBJ    :=
ifeq ($(CUDA),1)
CUDA_LIBDIRS := $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib
CFLAGS    += -DTRIDENT_CUDA -I$(CUDA_HOME)/include
NVFLAGS   := -O3 -g -std=c++17 $(CUDA_ARCHS) -DTRIDENT_CUDA -Isrc -I. -MMD -MP \
             -Xcompiler -Wall,-Wextra,-Wno-unused-parameter
LIB_SRC   += src/parallel/comm_nccl.c
CU_OBJ    := $(patsubst %.cu,$(BUILD)/%.o,$(wildcard kernels/cuda/*.cu))
LDLIBS    += $(CUDA_LIBDIRS:%=-L%) $(CUDA_LIBDIRS:%=-Wl,-rpath,%) \
             -lcudnn -lnccl -lcublasLt -lcublas -lcudart -lstdc++
endif
# Rebuilds backend.o when CUDA= changes between two makes in one BUILD dir.
$(shell mkdir -p $(BUILD) && f=$(BUILD)/cuda.flag && \
  [ "$$(cat $$f 2>/dev/null)" = "CUDA=$(CUDA)" ] || echo "CUDA=$(CUDA)" > $$f)
# The CPU kernels a second time without OpenMP, for single-thread runs
# (-DCPU_SERIAL: linked as cpu_serial_<op>, see kernels/cpu/cpu.h;
# cpu_backend.c picks the table).
CPU_SERIAL_SRC := $(filter-out kernels/cpu/cpu_backend.c kernels/cpu/cpu_memory.c,$(wildcard kernels/cpu/*.c))
CPU_SERIAL_OBJ := $(CPU_SERIAL_SRC:kernels/cpu/%.c=$(BUILD)/kernels/cpu-serial/%.o)
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CPU_SERIAL_OBJ) $(CU_OBJ)
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

.PHONY: all deps run test test-asan bench clean tests benches
all: $(BUILD)/trident tests benches

# Header dependencies come from the compiler (-MMD -MP): $(BUILD)/**/*.d.
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/kernels/cuda/%.o: kernels/cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/kernels/backend.o: $(BUILD)/cuda.flag

$(BUILD)/kernels/cpu-serial/%.o: kernels/cpu/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fno-openmp -Wno-unknown-pragmas -DCPU_SERIAL -c $< -o $@

$(BUILD)/libtrident.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/trident: $(CLI_OBJ) $(BUILD)/libtrident.a
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

tests: $(TEST_BIN) $(MPI_BIN)
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

test: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) tests/run.sh

test-asan: deps
	@$(MAKE) --no-print-directory BUILD=build-asan OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	    LDFLAGS="-fopenmp -fsanitize=address,undefined" tests
	@BUILD=build-asan ASAN=1 tests/run.sh

bench: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) tests/bench/run.sh

run: deps
	@$(MAKE) --no-print-directory all
	@scripts/run_default.sh $(ARGS)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

clean:
	rm -rf build build-asan build-cuda build-gpu
