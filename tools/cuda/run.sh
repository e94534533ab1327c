#!/bin/sh
# tools/cuda/run.sh: one GPU session's measurements in one command (device
# time is scarce). Run from the repository root on the GPU machine with a
# directory of binaries carried over (B, default build-gpu: kiln, test-kiln,
# optionally kiln-base = the previous version, and gpulibs/ = the Debian .so
# files the image lacks). Steps, in the order given:
#   test                     ./test-kiln cuda (summary lines)
#   tg MODEL BIN [ENV=V ...] pp128 + tg128 of $B/BIN (kiln, or kiln-base = the previous version)
#   bench MODEL ARGS...      kiln bench --profile pp-tg with ARGS (one word, commas)
#   ncu MODEL SKIP COUNT BIN per-kernel durations of COUNT kernels of a decode
#                            run (graphs off) after SKIP, into $OUT/ncu-MODEL-BIN.csv
# Output goes to stdout and $OUT/log.
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
    esac
    echo "-- $what took $(( $(date +%s) - t0 )) s"
done 2>&1 | tee -a $OUT/log
