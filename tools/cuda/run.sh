#!/bin/sh
# tools/cuda/run.sh: one GPU session's measurements in one command (device
# time is scarce). Run from the repository root on the GPU machine with a
# directory of binaries carried over (B, default build-gpu: kiln, test-kiln,
# optionally kiln-base = the previous version, and gpulibs/ = the Debian .so
# files the image lacks: libcjson.so.1, libpcre2-8.so.0, libutf8proc.so.2,
# libmicrohttpd.so.12 and its chain, libgnutls.so.30, libp11-kit.so.0,
# libidn2.so.0, libunistring.so.2, libtasn1.so.6, libnettle.so.8,
# libhogweed.so.6, libgmp.so.10, libffi.so.8, copied with cp -L from
# /lib/x86_64-linux-gnu; the image has CUDA 13's cuBLAS). Steps, in the order given:
#   test                     ./test-kiln cuda (summary lines)
#   tg MODEL BIN [ENV=V ...] pp128 + tg128 of $B/BIN (kiln, or kiln-base = the previous version)
#   bench MODEL ARGS...      kiln bench --profile pp-tg with ARGS (one word, commas)
#   ncu MODEL SKIP COUNT BIN per-kernel durations of COUNT kernels of a decode
#                            run (graphs off) after SKIP, into $OUT/ncu-MODEL-BIN.csv
#   mem MODEL ARGS...        bench as above under /usr/bin/time -v, host RSS and GPU
#                            memory sampled every 10 s into $OUT/mem-MODEL.log (MODEL:
#                            a built-in name or a config.json, e.g. configs/ cut to fewer
#                            layers; the forty-eighth session's 235B-A22B run:
#                            "mem qwen3-235b-a22b --quant gptq-int4 -p 128,2048 -n 32 -r 1")
#   q4 MODEL                 a Q4_0 GGUF of MODEL's shape with a bf16 embedding / head
#                            (tools/make_dummy_gguf.py --random-codes; gguf from
#                            $B/pylib when the image lacks it) into build-gg/, then
#                            kiln on it, and llama.cpp's llama-bench ($B/llama-bench,
#                            a CUDA build) on the same file when it is there
# Output goes to stdout and $OUT/log.
# llama.cpp's CUDA llama-bench (sm_90 only, stripped: 47.5 MB, 20.6 MiB
# xz-compressed) does not fit a call's 64 MiB beside the whole tree; for a
# peer-only call, move tests/fixtures/qwen3-dense-tiny (33 MB) out of the
# checkout for that one call (put it back after), as the forty-first
# session did, and carry the compressed binary in an ignored folder.
B=${B:-build-gpu}
export LD_LIBRARY_PATH=$PWD/$B/gpulibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ldd $B/kiln | grep "not found"
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm,clocks.mem --format=csv,noheader
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for step in "$@"; do
    set -- $step
    what=$1; shift
    t0=$(date +%s)
    case $what in
    test) ./$B/test-kiln cuda 2>&1 | grep -v "^\[debug\]\|^kiln: debug" | grep -E "FAIL|fail|passed" ;;
    tg)
        m=$1 bin=$2; shift 2
        echo "== $bin $m $*"
        env "$@" ./$B/$bin bench --profile pp-tg --dummy $m --backend cuda -p 128 -n 128 -r 3 2>&1 | grep -E "tg128|pp128|rror|abort" ;;
    bench)
        m=$1; shift
        echo "== bench $m $*"
        ./$B/kiln bench --profile pp-tg --dummy $m --backend cuda "$@" 2>&1 | grep -vE "debug" ;;
    ncu)
        m=$1 skip=$2 cnt=$3 bin=${4:-kiln}
        echo "== ncu $m $bin"
        KILN_CUDA_GRAPHS=0 $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
            --launch-skip $skip --launch-count $cnt ./$B/$bin bench --profile pp-tg --dummy $m --backend cuda -p 1 -n 64 -r 1 \
            >$OUT/ncu-$m-$bin.csv 2>$OUT/ncu-$m-$bin.err
        tail -2 $OUT/ncu-$m-$bin.err; wc -l $OUT/ncu-$m-$bin.csv ;;
    mem)
        m=$1; shift; n=$(basename $m .json)
        echo "== mem $m $*"
        ( while :; do echo "$(date +%s) host $(free -m | awk '/Mem/{print $3}') MiB gpu $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits) MiB"; sleep 10; done ) > $OUT/mem-$n.log &
        sampler=$!
        /usr/bin/time -v ./$B/kiln bench --profile pp-tg --dummy $m --backend cuda "$@" 2>$OUT/mem-$n.err | grep -E "^\| "
        kill $sampler
        grep -E "Maximum resident|Elapsed|rror" $OUT/mem-$n.err | grep -v debug | tail -4 ;;
    q4)
        m=$1; mkdir -p build-gg; f=build-gg/$m-q4_0.gguf
        [ -f $f ] || PYTHONPATH=$PWD/$B/pylib python3 tools/make_dummy_gguf.py configs/$m.json q4_0 $f --head bf16 --random-codes
        echo "== q4 $m"
        ./$B/kiln bench --profile pp-tg -m $f --backend cuda -p 128,1024 -n 128 -r 3 2>&1 | grep -E "^\| "
        [ -x $B/llama-bench ] && ./$B/llama-bench -m $f -p 128,1024 -n 128 -r 3 -fa 1 -ngl 99 -o md ;;
    esac
    echo "-- $what took $(( $(date +%s) - t0 )) s"
done 2>&1 | tee -a $OUT/log
