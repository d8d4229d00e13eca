# zaya build. `make` builds build/zaya; `make test` installs what is missing, builds and runs every test;
# `make demo` installs, builds and runs the main job; `make strict` is CI's warning check (-Werror, gcc and clang,
# several -march targets).
CC      ?= gcc
BUILD   ?= build
OPT     ?= -O3
# DEBUG= (tests/strict.sh): no debug information, for builds that only look for warnings
DEBUG   ?= -g
UNAME_M := $(shell uname -m)
# One portable binary: everything targets a baseline, and the hot kernels (src/kernels/kernels_isa.c,
# src/kernels/attention.c) are compiled once more per CPU level and picked at start-up from CPUID (src/kernels/cpu.c; ZAYA_CPU overrides).
# `make NATIVE=1` targets this machine's CPU instead (the binary may then not run on another).
ifeq ($(NATIVE),1)
ARCH    ?= -march=native
else ifeq ($(UNAME_M),x86_64)
ARCH    ?= -march=x86-64-v2
endif
# Warnings are shown, never fatal, for users: which warnings a compiler finds depends on its version and -march.
# WERROR=1 (make strict, CI) makes them errors.
WARN    := -Wall -Wextra -Wno-unused-parameter $(if $(filter 1,$(WERROR)),-Werror)
# Open MPI for data parallelism and the collective benchmarks (flags from its compiler wrapper).
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
CFLAGS  += -std=c11 $(OPT) $(ARCH) $(DEBUG) $(WARN) -fopenmp -D_GNU_SOURCE -Isrc $(MPI_CFLAGS)
# OpenBLAS built on OpenMP shares zaya's thread pool (the pthread build's idle threads spin and yield, ~20% of a
# training step in perf); Debian ships it as libopenblas0-openmp, used when present.
OPENBLAS_OMP := /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0
comma := ,
BLAS_LIB := $(if $(wildcard $(OPENBLAS_OMP)),$(OPENBLAS_OMP) -Wl$(comma)-rpath$(comma)$(dir $(OPENBLAS_OMP)),-lopenblas)
LDLIBS  += $(BLAS_LIB) -lcjson -lpcre2-8 -lutf8proc -lz -lm -lmicrohttpd -lpthread $(MPI_LIBS)
# oneDNN (Debian libdnnl-dev) runs the bf16 products on CPUs with AVX512-BF16 or AMX (src/kernels/matmul_bf16.c); without
# it (DNNL=0, or not installed) they run as rounded inputs through sgemm.
DNNL    ?= $(if $(wildcard /usr/include/dnnl.h),1,0)
ifeq ($(DNNL),1)
CFLAGS  += -DZY_HAVE_DNNL=1
LDLIBS  += -ldnnl
endif
LDFLAGS += -fopenmp

# GPU support (src/gpu/, README "GPUs"): built into the same zaya binary when nvcc is found (PATH, else
# /usr/local/cuda); `make CUDA=0` leaves it out, and without nvcc the build is CPU-only (--device cuda is then a clear
# error). Targets sm_80 (A100) and sm_90 (H100/H200), plus PTX for newer GPUs; the one file with Hopper's wgmma/TMA
# instructions (arch-specific: sm_90a) is compiled for sm_90a alone, below (the others have no sm_90a-only code, so an
# sm_90a copy of them would cost a third more compile time for the same machine code).
# CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a" builds for an H100/H200 alone (faster, as on a lent GPU).
NVCC      ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
CUDA      ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
# NVCC_WERROR=1: -Werror for the CUDA sources alone (CI's make test: its one CUDA build is the warning check, so
# tests/strict.sh need not compile them again).
NVCC_STRICT = $(filter 1,$(WERROR) $(NVCC_WERROR))
NVCCFLAGS ?= -std=c++17 -O3 -g -lineinfo $(CUDA_ARCH) -Isrc -Isrc/gpu \
             -Xcompiler -Wall,-Wextra,-Wno-unused-parameter$(if $(NVCC_STRICT),$(comma)-Werror) \
             $(if $(NVCC_STRICT),-Werror all-warnings)
# GPU_EMU=1 (tests/gpu/emu/backend.sh, its own BUILD): the GPU backend with no GPU. Every CUDA source is compiled by
# the host's C++ compiler against tests/gpu/emu (cuda_emu.h runs kernels as a fiber per CUDA thread; emu_runtime.cpp
# and cublasLt.h there stand in for the CUDA runtime and cuBLASLt), so make test-gpu's suites run on the CPU. Left out:
# the wgmma + TMA experts (no emulation of Hopper's asynchronous units), cuDNN, NCCL.
ifeq ($(GPU_EMU),1)
GPU_SRC   := $(filter-out src/gpu/gpu_none.c,$(sort $(wildcard src/gpu/*.c)))
GPU_CU    := $(filter-out src/gpu/gpu_expert_gemm_sm90.cu,$(sort $(wildcard src/gpu/*.cu)))
GPU_CPP   := tests/gpu/emu/emu_runtime.cpp
# EMU_SAN: sanitizer flags for the emulated sources as well (OPT carries them for the C ones)
EMU_CXXFLAGS := -std=c++20 -O2 $(DEBUG) -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas $(EMU_SAN) \
                $(if $(filter 1,$(WERROR)),-Werror) -DZAYA_GPU_EMU=1 -DGPU_WARP=32 -Itests/gpu/emu -Isrc -Isrc/gpu
GPU_CXXFLAGS := $(EMU_CXXFLAGS)
CFLAGS    += -DZAYA_CUDA=1
$(BUILD)/src/gpu/gpu_comm.o: CFLAGS += -DZAYA_NO_NCCL -Itests/gpu/emu
LDLIBS    += -lstdc++
else ifeq ($(CUDA),1)
GPU_SRC   := $(filter-out src/gpu/gpu_none.c,$(sort $(wildcard src/gpu/*.c)))
GPU_CU    := $(sort $(wildcard src/gpu/*.cu))
# Host C++ against the CUDA runtime, with no kernels (gpu_attention_cudnn.cpp): the host compiler alone (nvcc would
# run its device passes over the whole file, cudnn-frontend's templates included, once per target, for nothing).
GPU_CPP   := $(sort $(wildcard src/gpu/*.cpp))
GPU_CXXFLAGS ?= -std=c++17 -O2 -g -Wall -Wextra -Wno-unused-parameter $(if $(NVCC_STRICT),-Werror) -Isrc -Isrc/gpu \
                -isystem $(CUDA_HOME)/include
CFLAGS    += -DZAYA_CUDA=1
# NCCL for multi-GPU collectives (src/gpu/gpu_comm.c, plain C against nccl.h and the CUDA runtime's C API): linked
# when $(CUDA_HOME)/include/nccl.h exists; without it (or NCCL=0) gpu_comm.c builds with -DZAYA_NO_NCCL, several
# ranks keep the host-staged MPI path and `bench comm --backend nccl` is a clear error.
NCCL      ?= $(if $(wildcard $(CUDA_HOME)/include/nccl.h),1,0)
LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 $(if $(filter 1,$(NCCL)),-lnccl) -lcublasLt -lcudart -lstdc++
$(BUILD)/src/gpu/gpu_comm.o: CFLAGS += -isystem $(CUDA_HOME)/include $(if $(filter 1,$(NCCL)),,-DZAYA_NO_NCCL)
# CUTLASS's headers (PyPI's nvidia-cutlass: scripts/install-deps.sh installs it where nvcc is; CUTLASS_INCLUDE points
# elsewhere) for the experts' grouped products on Hopper's wgmma + TMA (src/gpu/gpu_expert_gemm_sm90.cu, compiled for
# sm_90a alone, with NDEBUG: a device assert would serialise the wgmma pipeline). Without them, or with CUTLASS=0, that
# file is left out and the experts run on the WMMA kernels on every GPU.
CUTLASS_INCLUDE ?= $(shell python3 -c 'import importlib.util as u, os; s = u.find_spec("cutlass_library"); \
                   print(os.path.join(os.path.dirname(s.origin), "source", "include") if s else "")' 2>/dev/null)
CUTLASS   ?= $(if $(wildcard $(CUTLASS_INCLUDE)/cutlass/gemm/group_array_problem_shape.hpp),1,0)
ifeq ($(CUTLASS),1)
$(BUILD)/src/gpu/gpu_expert_gemm.o: override NVCCFLAGS += -DZAYA_CUTLASS=1
$(BUILD)/src/gpu/gpu_expert_gemm_sm90.o: override CUDA_ARCH = -gencode arch=compute_90a,code=sm_90a
$(BUILD)/src/gpu/gpu_expert_gemm_sm90.o: override NVCCFLAGS += -DNDEBUG --expt-relaxed-constexpr -isystem $(CUTLASS_INCLUDE)
else
GPU_CU    := $(filter-out src/gpu/gpu_expert_gemm_sm90.cu,$(GPU_CU))
endif
# cuDNN's fused attention (src/gpu/gpu_attention_cudnn.cpp, ZAYA_GPU_ATTENTION=cudnn): built where the headers are —
# the header-only cudnn-frontend (PyPI's nvidia-cudnn-frontend, its include/ in site-packages) and cudnn.h
# (nvidia-cudnn-cu13, which PyTorch pulls in); no link-time dependency: libcudnn.so.9 is dlopened at run time
# (ZAYA_CUDNN_LIB, the loader's path, else the library beside the headers the build found). CUDNN=0 leaves it out.
# -O1 -g1: it builds a graph once per shape and then only launches it; the frontend's templates took g++ 117 s and
# a 62 MB object at nvcc's -O3 -g, 49 s at -O1 -g1 (a 2-vCPU Zen 4, both cores busy).
CUDNN_PY         := import importlib.util as u, os; f = u.find_spec("cudnn"); c = u.find_spec("nvidia.cudnn")
CUDNN_FE_INCLUDE ?= $(shell python3 -c '$(CUDNN_PY); print(os.path.join(os.path.dirname(os.path.dirname(f.origin)), "include") if f and f.origin else "")' 2>/dev/null)
CUDNN_HOME       ?= $(shell python3 -c '$(CUDNN_PY); print(list(c.submodule_search_locations)[0] if c else "")' 2>/dev/null)
CUDNN     ?= $(if $(and $(wildcard $(CUDNN_FE_INCLUDE)/cudnn_frontend.h),$(wildcard $(CUDNN_HOME)/include/cudnn.h)),1,0)
ifeq ($(CUDNN),1)
$(BUILD)/src/gpu/gpu_attention_tc.o: override NVCCFLAGS += -DZAYA_CUDNN=1
$(BUILD)/src/gpu/gpu_attention_cudnn.o: override GPU_CXXFLAGS += -O1 -g1 -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING \
    -DCUDNN_FRONTEND_SKIP_JSON_LIB -DZAYA_CUDNN_LIBDIR='"$(CUDNN_HOME)/lib"' -isystem $(CUDNN_FE_INCLUDE) \
    -isystem $(CUDNN_HOME)/include
else
GPU_CPP   := $(filter-out src/gpu/gpu_attention_cudnn.cpp,$(GPU_CPP))
endif
else
# gpu_weight_upload.c is host code (what goes up, from where): built here too, so the unit tests walk it
GPU_SRC   := src/gpu/gpu_none.c src/gpu/gpu_weight_upload.c
GPU_CU    :=
GPU_CPP   :=
endif

# Compiled once per CPU level (names suffixed _generic, _avx2, _avx512); the AVX512-BF16 kernels in their own file.
# The quantized-weight kernels are compiled at two more levels, each with the VNNI integer dot products (QUANT_LEVELS).
QUANT_SRC := src/kernels/quant_isa.c
ISA_SRC  := src/kernels/kernels_isa.c src/kernels/attention.c $(QUANT_SRC)
BF16_SRC := src/kernels/matmul_avx512bf16.c
# The library, one folder per concept (README "Layout of the code"); src/cli is the command line, src/gpu the GPU backend.
LIB_DIRS := util model kernels optim io train data dist aegis jinja tokenizer infer serve
LIB_SRC  := $(filter-out $(ISA_SRC) $(BF16_SRC),$(sort $(foreach d,$(LIB_DIRS),$(wildcard src/$(d)/*.c))))
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/unit/*.c))
HDRS     := $(wildcard src/*/*.h src/*/*.inc src/gpu/*.cuh tests/unit/*.h tests/gpu/*.h) \
            $(if $(filter 1,$(GPU_EMU)),$(wildcard tests/gpu/emu/*.h))
GPU_TEST_SRC := $(sort $(wildcard tests/gpu/*.c))

ifeq ($(UNAME_M),x86_64)
ISA_LEVELS      := generic avx2 avx512
ISA_ARCH_avx2   := -march=x86-64-v3
ISA_ARCH_avx512 := -march=x86-64-v4
BF16_ARCH       := -march=x86-64-v4 -mavx512bf16
CFLAGS          += -DZY_HAVE_ISA_LEVELS=1
QUANT_LEVELS    := avxvnni avx512vnni
ISA_ARCH_avxvnni    := -march=x86-64-v3 -mavxvnni
ISA_ARCH_avx512vnni := -march=x86-64-v4 -mavx512vnni
# For the unit tests only: the AVX-VNNI kernels with the instruction emulated in AVX2 (quant_isa.c), so that their
# arithmetic is checked on CPUs without VNNI (and qemu's TCG has none)
QUANT_TEST_LEVELS := avxvnni_emulated
ISA_ARCH_avxvnni_emulated := -march=x86-64-v3 -DZY_EMULATE_AVXVNNI
else
ISA_LEVELS      := generic
QUANT_LEVELS    :=
QUANT_TEST_LEVELS :=
endif
ISA_OBJ  := $(foreach l,$(ISA_LEVELS),$(ISA_SRC:src/%.c=$(BUILD)/src/isa/%.$(l).o)) $(BUILD)/$(BF16_SRC:.c=.o) \
            $(foreach l,$(QUANT_LEVELS),$(QUANT_SRC:src/%.c=$(BUILD)/src/isa/%.$(l).o))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(ISA_OBJ) $(GPU_SRC:%.c=$(BUILD)/%.o) $(GPU_CU:%.cu=$(BUILD)/%.o) \
            $(GPU_CPP:%.cpp=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o) $(foreach l,$(QUANT_TEST_LEVELS),$(QUANT_SRC:src/%.c=$(BUILD)/src/isa/%.$(l).o))
GPU_TEST_OBJ := $(GPU_TEST_SRC:%.c=$(BUILD)/%.o)

.PHONY: all asan deps test test-gpu unit-test asan-test oracle-test demo ablate-attention ablate-moe clean format fuzz fuzz-build chaos strict hip-check

all: $(BUILD)/zaya $(BUILD)/zaya_tests

$(BUILD)/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu $(HDRS)
	@mkdir -p $(dir $@)
	$(if $(filter 1,$(GPU_EMU)),$(CXX) $(EMU_CXXFLAGS) -x c++ -c $< -o $@,$(NVCC) $(NVCCFLAGS) -c $< -o $@)

$(BUILD)/%.o: %.cpp $(HDRS)
	@mkdir -p $(dir $@)
	$(CXX) $(GPU_CXXFLAGS) -c $< -o $@

# The same source at each level: the level's -march comes after the baseline's, so it wins.
define isa_rule
$(BUILD)/src/isa/%.$(1).o: src/%.c $(HDRS)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) $$(ISA_ARCH_$(1)) -DZY_ISA=$(1) -c $$< -o $$@
endef
$(foreach l,$(ISA_LEVELS) $(QUANT_LEVELS) $(QUANT_TEST_LEVELS),$(eval $(call isa_rule,$(l))))

$(BUILD)/$(BF16_SRC:.c=.o): $(BF16_SRC) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(BF16_ARCH) -c $< -o $@

# zaya info prints the git revision; the object is rebuilt when it changes.
GIT_REV := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
$(BUILD)/src/cli/cmd_info.o: CFLAGS += -DZAYA_GIT_REV='"$(GIT_REV)"'
$(BUILD)/src/cli/cmd_info.o: $(BUILD)/git-rev
$(BUILD)/git-rev: FORCE
	@mkdir -p $(BUILD); echo '$(GIT_REV)' | cmp -s - $@ || echo '$(GIT_REV)' > $@
FORCE:

$(BUILD)/zaya: $(LIB_OBJ) $(CLI_OBJ)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/zaya_tests: $(LIB_OBJ) $(TEST_OBJ)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# The GPU tests (each kernel against its CPU namesake, then the whole model); built with GPU support only.
$(BUILD)/zaya_gpu_tests: $(LIB_OBJ) $(GPU_TEST_OBJ)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

ifneq ($(filter 1,$(CUDA) $(GPU_EMU)),)
all: $(BUILD)/zaya_gpu_tests
endif

# On a machine with an NVIDIA GPU: kernels vs the CPU, the model in fp32 vs the CPU, bf16 training, checkpoints
# moving between CPU and GPU (tests/gpu/run.sh; ends with "N passed, N failed").
# make test, test-gpu and demo build with a job per core (CI has two).
NPROC := $(shell nproc 2>/dev/null || echo 2)
test-gpu: deps
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@tests/gpu/run.sh

# Sanitizer build of the unit tests (ASan + UBSan), in its own build tree.
# DNNL=0: oneDNN is built on libgomp and clang links its own OpenMP runtime; two in one process is asking for trouble.
# Warnings are not errors here (WERROR=0, whatever the caller's): tests/strict.sh is the warning check.
asan:
	$(MAKE) CC=clang WERROR=0 BUILD=build-asan BLAS_LIB=-lopenblas DNNL=0 CUDA=0 OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	        LDFLAGS="-fopenmp -fsanitize=address,undefined" build-asan/zaya_tests build-asan/zaya

deps:
	@scripts/install-deps.sh

unit-test: all
	OMP_NUM_THREADS=2 $(BUILD)/zaya_tests

asan-test: asan
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 OMP_NUM_THREADS=2 build-asan/zaya_tests

# CI (ZAYA_STRICT=1): this build is -Werror (gcc at the default -march, the CUDA sources once: the longest part of
# a build), so tests/strict.sh leaves both out (STRICT_CUDA=0, STRICT_SKIP).
test: deps
	@$(MAKE) --no-print-directory -j$(NPROC) $(if $(filter 1,$(ZAYA_STRICT)),WERROR=1) all asan
	@$(if $(filter 1,$(ZAYA_STRICT)),STRICT_CUDA=0 STRICT_SKIP=gcc-default) tests/run_all.sh

# The full chaos suite: 10 supervised 2-rank runs, each disturbed 5 times (tests/chaos/chaos.sh; ~5 min).
chaos: all
	@tests/chaos/chaos.sh --runs $(or $(CHAOS_RUNS),10) --seed $(or $(CHAOS_SEED),1)

demo: deps
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@scripts/demo.sh

# The shipped ablations (configs/ablation-*.json; each about 25 min on 2 cores): the demo data, then zaya ablate.
# Run again to resume; the tables land in runs/ablation-*/ablation.md.
ablate-attention ablate-moe: deps
	@$(MAKE) --no-print-directory all
	@test -s runs/demo/data/mathcode/meta.json || scripts/demo-data.sh
	@$(BUILD)/zaya ablate configs/$(@:ablate-%=ablation-%).json

clean:
	rm -rf build build-asan build-strict build-fuzz

# CI's warning check (tests/strict.sh): every source built with -Werror by gcc and clang at the baseline, x86-64-v3,
# x86-64-v4 and native targets, so a warning that only one compiler or -march finds stops CI, not a user's build.
strict:
	@mkdir -p build-strict && tests/strict.sh

# The GPU kernels compiled for AMD GPUs (hipcc -DZAYA_HIP, -Werror; CI runs it in ZAYA_STRICT=1 make test): needs hipcc
# (Debian: apt-get install hipcc libamdhip64-dev). Compile only: see tests/hip_check.sh for what Debian's ROCm lacks.
hip-check:
	@tests/hip_check.sh

# libFuzzer targets (clang), one per parser, built into build-fuzz/ from the parser's sources alone. `make fuzz` runs
# each for FUZZ_SECONDS over its corpus tests/fuzz/corpus/<target> (new inputs go to a temporary directory);
# `make test` runs the same script for a few seconds per target.
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_CFLAGS  := -std=c11 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
                $(WARN) -fopenmp -D_GNU_SOURCE -Isrc
FUZZ_LIBS    := -lopenblas -lcjson -lpcre2-8 -lutf8proc -lz -lm
FUZZ_TARGETS := config manifest npy runconfig safetensors shard_header tokenizer chat_template serve_request json_schema
FUZZ_SRC_config       := src/model/config.c src/model/legacy.c src/kernels/quant.c src/util/util.c
FUZZ_SRC_manifest     := src/io/manifest.c src/util/util.c
FUZZ_SRC_npy          := src/io/npy.c src/util/util.c
FUZZ_SRC_runconfig    := src/train/runconfig.c src/model/params.c src/util/util.c
FUZZ_SRC_safetensors  := src/io/safetensors.c src/util/util.c
FUZZ_SRC_shard_header := src/io/shards.c src/util/util.c src/util/crc32.c
FUZZ_SRC_tokenizer    := src/tokenizer/tokenizer.c src/tokenizer/tokenizer_normalize.c src/tokenizer/tokenizer_json.c \
                         src/tokenizer/tokenizer_train.c src/tokenizer/tokenizer_pretok.c src/util/util.c src/util/lines.c
FUZZ_SRC_chat_template := src/tokenizer/chat_template.c src/jinja/jinja_value.c src/jinja/jinja_parse.c \
                          src/jinja/jinja_eval.c src/jinja/jinja_filters.c src/util/util.c
FUZZ_SRC_serve_request := src/serve/serve_request.c src/serve/serve_tools.c src/serve/serve_utf8.c src/util/util.c
FUZZ_SRC_json_schema   := src/infer/json_grammar.c src/util/util.c

fuzz-build: $(FUZZ_TARGETS:%=build-fuzz/fuzz_%)

.SECONDEXPANSION:
build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c $$(FUZZ_SRC_$$*) $(wildcard src/*/*.h)
	@mkdir -p build-fuzz
	$(FUZZ_CC) $(FUZZ_CFLAGS) $< $(FUZZ_SRC_$*) -o $@ $(FUZZ_LIBS)

fuzz:
	@FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh
