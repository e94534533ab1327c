#!/bin/sh
# tools/cuda/gpu.sh: run on the GPU machine from the repository root, with a
# kiln built here (make BUILD=build-cuda) carried over. Checks that the
# binary runs there (falls back to the copies of its Debian libraries in
# build-cuda/gpulibs when the image lacks them), then runs what is asked:
#   sh tools/cuda/gpu.sh test          make test-cuda, verbose
#   sh tools/cuda/gpu.sh bench MODEL [pp-tg args]   kiln bench --profile pp-tg on --dummy MODEL
#   sh tools/cuda/gpu.sh hf MODEL P N  transformers peer (tools/cuda/hf_peer.py)
# Several modes may follow one another: "test bench qwen3-0.6b -- bench ...".
B=${BUILD:-build-cuda}
if ldd $B/kiln | grep -q "not found"; then
    export LD_LIBRARY_PATH=$PWD/$B/gpulibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
if ldd $B/kiln | grep -q "not found"; then
    # cuBLAS from the pip wheels that torch brings, if the toolkit's is missing
    P=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
    [ -n "$P" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$P
fi
ldd $B/kiln | grep "not found"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.mem --format=csv,noheader
while [ $# -gt 0 ]; do
    mode=$1; shift
    case $mode in
    test) KILN_TEST_VERBOSE=1 ./$B/test-kiln cuda 2>&1 | grep -v "^\[debug\]\|^kiln: debug" ;;
    bench)
        m=$1; shift
        args=""
        while [ $# -gt 0 ] && [ "$1" != "--" ]; do args="$args $1"; shift; done
        [ "$1" = "--" ] && shift
        ./$B/kiln bench --profile pp-tg --dummy $m --backend cuda $args ;;
    hf)
        python3 tools/cuda/hf_peer.py $1 $2 $3; shift 3 ;;
    --) ;;
    *) echo "unknown mode $mode"; exit 2 ;;
    esac
done
