# trident build. `make` builds build/trident (CPU backend); see README.md.
#   make deps      install missing Debian packages (as root), else print the command
#   make run       deps, build, prepare the default corpus, train configs/tiny.ini
#   make test      deps, build, run the test suite (last line: N passed, N failed)
#   make test-asan the model and op tests under AddressSanitizer + UBSan
#   make bench     benchmarks (tokens/s, MFU against measured sgemm, memory)
#   make CUDA=1    also build the CUDA backend (kernels/cuda) with nvcc

PKGS      := hdf5 inih openblas libpcre2-8 jansson ompi-c libxxhash
CC        ?= gcc
BUILD     ?= build
OPT       ?= -O3 -march=native
CFLAGS    += $(OPT) -g -std=gnu11 -fopenmp -Wall -Wextra -Wno-unused-parameter \
             -Isrc -Ikernels $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS    += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lm -lpthread
LDFLAGS   += -fopenmp

LIB_SRC   := $(filter-out src/main.c,$(wildcard src/*.c)) $(wildcard kernels/*.c) \
             $(wildcard kernels/cpu/*.c)
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_SRC  := $(wildcard tests/unit/test_*.c)
TEST_BIN  := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
MPI_SRC   := $(wildcard tests/mpi/*.c)
MPI_BIN   := $(MPI_SRC:tests/mpi/%.c=$(BUILD)/mpi/%)
BENCH_SRC := $(wildcard tests/bench/bench_*.c)
BENCH_BIN := $(BENCH_SRC:tests/bench/%.c=$(BUILD)/bench/%)

.PHONY: all deps run test test-asan bench clean tests benches
all: $(BUILD)/trident tests benches

$(BUILD)/%.o: %.c $(wildcard src/*.h kernels/*.h kernels/cpu/*.h kernels/cpu/generic/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libtrident.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/trident: $(BUILD)/src/main.o $(BUILD)/libtrident.a
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

tests: $(TEST_BIN) $(MPI_BIN)
$(BUILD)/tests/%: tests/unit/%.c $(wildcard tests/unit/*.h) $(BUILD)/libtrident.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit $< $(BUILD)/libtrident.a -o $@ $(LDFLAGS) $(LDLIBS)

# Multi-rank test programs, run under mpirun by tests/e2e/*.sh.
$(BUILD)/mpi/%: tests/mpi/%.c $(BUILD)/libtrident.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(BUILD)/libtrident.a -o $@ $(LDFLAGS) $(LDLIBS)

benches: $(BENCH_BIN)
$(BUILD)/bench/%: tests/bench/%.c $(BUILD)/libtrident.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit $< $(BUILD)/libtrident.a -o $@ $(LDFLAGS) $(LDLIBS)

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

clean:
	rm -rf build build-asan
