# kiln: make | make test | make test-asan | make arm64 | make fuzz | make help
# CUDA objects are built only when nvcc is found (or NVCC= is set); the CPU
# build never needs a GPU.

BUILD    ?= build
CC       ?= gcc
OPT      ?= -O2
CFLAGS   ?= $(OPT) -g
CFLAGS   += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -fopenmp -Isrc -I$(BUILD)/gen -MMD -MP
LDLIBS   += -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd -lm -lpthread -fopenmp
NVCC     ?= $(shell command -v nvcc 2>/dev/null)
CUDA_ARCH ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=compute_80
NVFLAGS  ?=
PYTHON   ?= python3

SRC      := $(shell find src -name '*.c' | sort)
CU_SRC   := $(shell find src -name '*.cu' | sort)
MAIN     := src/main.c
LIB_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(filter-out $(MAIN),$(SRC))) $(BUILD)/gen/configs.o
TEST_SRC := $(sort $(wildcard tests/*.c))
TEST_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(TEST_SRC))

ifneq ($(NVCC),)
ifneq ($(CU_SRC),)
CFLAGS   += -DKILN_CUDA
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
LIB_OBJ  += $(patsubst %.cu,$(BUILD)/%.cu.o,$(CU_SRC))
LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lcublasLt -lstdc++ -Wl,-rpath,$(CUDA_HOME)/lib64
endif
endif

.PHONY: all cpu ktrace arm64 test-arm64 test test-c test-server test-asan test-cuda fuzz bench gemv-bench decode-ab vs-llama clean help format
all: $(BUILD)/kiln $(BUILD)/test-kiln

cpu:
	$(MAKE) NVCC= BUILD=build-cpu all

# kernels that time themselves (src/backend/cuda/ktrace.cuh): build-trace/kiln,
# sm_90a only; KILN_CUDA_KTRACE=FILE at run time, tools/ktrace.py to read FILE
ktrace:
	$(MAKE) BUILD=build-trace NVFLAGS=-DKILN_CUDA_TRACE CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a" build-trace/kiln

# AArch64 (NEON) cross build, run under qemu-user: Debian's gcc-aarch64-linux-gnu,
# qemu-user and the arm64 -dev packages of the libraries (dpkg --add-architecture
# arm64; .ci/arm64 installs them and runs the tests)
ARM64_CC   ?= aarch64-linux-gnu-gcc
# the cross package's ld.so with its own libc (the multiarch libc6:arm64 the -dev
# packages pull in is another build: its libc.so.6 under the cross ld.so hangs
# in the second pthread_create)
ARM64_RUN  ?= qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib
arm64:                          ## cross-build kiln and the test runner for aarch64 in build-arm64/
	$(MAKE) NVCC= CC=$(ARM64_CC) BUILD=build-arm64 all

test-arm64: arm64               ## the C runner for aarch64 under qemu-user (ARGS=group to pick groups)
	$(ARM64_RUN) build-arm64/test-kiln $(ARGS)

$(BUILD)/kiln: $(BUILD)/src/main.o $(LIB_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/test-kiln: $(TEST_OBJ) $(LIB_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) -O3 -std=c++17 $(CUDA_ARCH) $(NVFLAGS) -Isrc -Xcompiler -fPIC -MMD -MP -c -o $@ $<

# the Qwen3 configs in configs/ are compiled in, so --dummy NAME works anywhere
$(BUILD)/gen/configs.c: $(sort $(wildcard configs/*.json)) scripts/embed-configs.sh
	@mkdir -p $(@D)
	sh scripts/embed-configs.sh $(sort $(wildcard configs/*.json)) > $@

$(BUILD)/gen/configs.o: $(BUILD)/gen/configs.c
	$(CC) $(CFLAGS) -c -o $@ $<

test: all                       ## C tests (parsers, ops, parity, engine) then the server suite
	./$(BUILD)/test-kiln
	KILN=$(CURDIR)/$(BUILD)/kiln $(PYTHON) -m pytest -q tests/server tests/cli

test-c: $(BUILD)/test-kiln      ## only the C test runner (ARGS=group to pick groups)
	./$(BUILD)/test-kiln $(ARGS)

ASAN_BUILD ?= build-asan
test-asan:                      ## the C suite under AddressSanitizer + UBSan (in ASAN_BUILD)
	$(MAKE) NVCC= BUILD=$(ASAN_BUILD) OPT=-O1 \
	  CFLAGS_EXTRA= CC="$(CC) -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" all
	ASAN_OPTIONS=detect_leaks=1 ./$(ASAN_BUILD)/test-kiln

test-cuda: all                  ## CUDA op and model tests (needs a GPU)
	./$(BUILD)/test-kiln cuda

fuzz:                           ## libFuzzer targets for the parsers (clang); FUZZ_TIME=seconds each
	sh scripts/fuzz.sh $(FUZZ_TIME)

bench: $(BUILD)/kiln            ## the default benchmark (profile a on --dummy qwen3-0.6b)
	./$(BUILD)/kiln bench

gemv-bench: $(BUILD)/gemv-bench ## the CPU decode GEMV against the bandwidth probe, per matrix size (tools/gemv_bench.c)

$(BUILD)/gemv-bench: $(BUILD)/tools/gemv_bench.o $(LIB_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

decode-ab: $(BUILD)/decode-ab   ## a paired in-process A/B of a CPU switch, whole decode or a GEMV sweep (tools/decode_ab.c)

$(BUILD)/decode-ab: $(BUILD)/tools/decode_ab.o $(LIB_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# kiln and llama.cpp in one process, alternated (tools/vs_llama.c); needs
# LLAMA_CPP=/path/to/llama.cpp with its shared libraries under build/bin
vs-llama: $(BUILD)/vs-llama     ## kiln vs llama.cpp, ABBA rounds in one process (LLAMA_CPP=path to a built llama.cpp)

$(BUILD)/vs-llama: tools/vs_llama.c $(LIB_OBJ)
	@test -n "$(LLAMA_CPP)" || { echo "make vs-llama: set LLAMA_CPP to a llama.cpp tree built with shared libraries"; exit 1; }
	@# kiln's objects from an archive whose symbols stay local (--exclude-libs): no kiln function
	@# may stand in for one of ggml's of the same name inside libllama
	rm -f $(BUILD)/libkiln-vs.a && ar rcs $(BUILD)/libkiln-vs.a $(LIB_OBJ)
	$(CC) $(CFLAGS) -I$(LLAMA_CPP)/include -I$(LLAMA_CPP)/ggml/include -o $@ tools/vs_llama.c $(BUILD)/libkiln-vs.a $(LDLIBS) \
		-Wl,--exclude-libs,ALL -L$(LLAMA_CPP)/build/bin -lllama -lggml -lggml-base -Wl,-rpath,$(abspath $(LLAMA_CPP))/build/bin

format:                         ## clang-format every C source
	clang-format -i $(SRC) $(TEST_SRC) $(shell find src -name '*.h')

clean:
	rm -rf build build-cpu build-asan build-fuzz build-arm64

help:                           ## this list
	@echo "kiln make targets:"
	@echo "  make            build ./build/kiln and the test runner (CUDA too when nvcc is found)"
	@echo "  make cpu        CPU-only build in build-cpu/"
	@echo "  make ktrace     build-trace/kiln, whose CUDA kernels time themselves (KILN_CUDA_KTRACE=FILE; tools/ktrace.py)"
	@echo "  make arm64      aarch64 (NEON) cross build in build-arm64/; make test-arm64 runs its C tests under qemu-user"
	@echo "  make test       all tests: C runner (parsers, kernels, HF parity, engine) + server and CLI pytest"
	@echo "  make test-c     C runner only; ARGS='group ...' picks groups, ARGS=--list lists them"
	@echo "  make test-asan  the C runner under ASan+UBSan"
	@echo "  make test-cuda  CUDA op/model tests on a GPU machine"
	@echo "  make fuzz       run the libFuzzer targets (FUZZ_TIME seconds each, default 60)"
	@echo "  make bench      kiln bench with its defaults"
	@echo "  make gemv-bench the CPU decode GEMV per matrix size against the bandwidth probe (build/gemv-bench)"
	@echo "  make decode-ab  a paired A/B of a CPU switch inside one process (build/decode-ab)"
	@echo "  make format     clang-format the sources"

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
