# zaya build. `make` builds build/zaya; `make test` installs what is missing, builds and runs every test;
# `make demo` installs, builds and runs the main job.
CC      ?= gcc
BUILD   ?= build
OPT     ?= -O3 -march=native
# Open MPI for data parallelism and the collective benchmarks (flags from its compiler wrapper).
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
CFLAGS  += -std=c11 $(OPT) -g -Wall -Wextra -Werror -Wno-unused-parameter -fopenmp -D_GNU_SOURCE -Isrc $(MPI_CFLAGS)
# OpenBLAS built on OpenMP shares zaya's thread pool (the pthread build's idle threads spin and yield, ~20% of a
# training step in perf); Debian ships it as libopenblas0-openmp, used when present.
OPENBLAS_OMP := /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0
comma := ,
BLAS_LIB := $(if $(wildcard $(OPENBLAS_OMP)),$(OPENBLAS_OMP) -Wl$(comma)-rpath$(comma)$(dir $(OPENBLAS_OMP)),-lopenblas)
LDLIBS  += $(BLAS_LIB) -lcjson -lpcre2-8 -lz -lm $(MPI_LIBS)
LDFLAGS += -fopenmp

LIB_SRC  := $(sort $(wildcard src/*.c))
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/unit/*.c))
HDRS     := $(wildcard src/*.h src/*.inc src/cli/*.h tests/unit/*.h)

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

.PHONY: all asan deps test unit-test asan-test oracle-test demo clean format fuzz fuzz-build chaos

all: $(BUILD)/zaya $(BUILD)/zaya_tests

$(BUILD)/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/zaya: $(LIB_OBJ) $(CLI_OBJ)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/zaya_tests: $(LIB_OBJ) $(TEST_OBJ)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# Sanitizer build of the unit tests (ASan + UBSan), in its own build tree.
asan:
	$(MAKE) CC=clang BUILD=build-asan BLAS_LIB=-lopenblas OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	        LDFLAGS="-fopenmp -fsanitize=address,undefined" build-asan/zaya_tests build-asan/zaya

deps:
	@scripts/install-deps.sh

unit-test: all
	OMP_NUM_THREADS=2 $(BUILD)/zaya_tests

asan-test: asan
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 OMP_NUM_THREADS=2 build-asan/zaya_tests

test: deps
	@$(MAKE) --no-print-directory all asan
	@tests/run_all.sh

# The full chaos suite: 10 supervised 2-rank runs, each disturbed 5 times (tests/chaos/chaos.sh; ~5 min).
chaos: all
	@tests/chaos/chaos.sh --runs $(or $(CHAOS_RUNS),10) --seed $(or $(CHAOS_SEED),1)

demo: deps
	@$(MAKE) --no-print-directory all
	@scripts/demo.sh

clean:
	rm -rf build build-asan

# libFuzzer targets (clang), one per parser, built into build-fuzz/ from the parser's sources alone. `make fuzz` runs
# each for FUZZ_SECONDS over its corpus tests/fuzz/corpus/<target> (new inputs go to a temporary directory);
# `make test` runs the same script for a few seconds per target.
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_CFLAGS  := -std=c11 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
                -Wall -Wextra -Werror -Wno-unused-parameter -fopenmp -D_GNU_SOURCE -Isrc
FUZZ_LIBS    := -lopenblas -lcjson -lpcre2-8 -lz -lm
FUZZ_TARGETS := config manifest npy runconfig safetensors shard_header tokenizer
FUZZ_SRC_config       := src/config.c src/util.c
FUZZ_SRC_manifest     := src/manifest.c src/util.c
FUZZ_SRC_npy          := src/npy.c src/util.c
FUZZ_SRC_runconfig    := src/runconfig.c src/optim.c src/matmul.c src/params.c src/util.c
FUZZ_SRC_safetensors  := src/safetensors.c src/util.c
FUZZ_SRC_shard_header := src/shards.c src/util.c
FUZZ_SRC_tokenizer    := src/tokenizer.c src/util.c

fuzz-build: $(FUZZ_TARGETS:%=build-fuzz/fuzz_%)

.SECONDEXPANSION:
build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c $$(FUZZ_SRC_$$*) $(wildcard src/*.h)
	@mkdir -p build-fuzz
	$(FUZZ_CC) $(FUZZ_CFLAGS) $< $(FUZZ_SRC_$*) -o $@ $(FUZZ_LIBS)

fuzz:
	@FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh
