#!/bin/sh
# Builds every libFuzzer target in tools/fuzz/ with clang (ASan + UBSan) and
# runs each for $1 seconds (default 60), with a corpus in build-fuzz/corpus/.
# A crash, or an input running over 10 s (a hang), leaves its input in
# build-fuzz/ and makes this script fail.
set -e
secs=${1:-60}
out=build-fuzz
mkdir -p $out
srcs=$(find src -name '*.c' ! -path 'src/main.c' | sort)
for f in tools/fuzz/fuzz_*.c; do
    name=$(basename "$f" .c)
    echo "== $name"
    clang -g -O1 -std=c11 -D_GNU_SOURCE -fopenmp -fsanitize=fuzzer,address,undefined -Isrc -I$out \
        "$f" $srcs build/gen/configs.c -o "$out/$name" -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd -lm -lpthread
    mkdir -p "$out/corpus/$name"
    seeds=""
    [ -d "tools/fuzz/seeds/$name" ] && seeds="tools/fuzz/seeds/$name"
    rc=0
    (cd $out && ./$name -max_total_time="$secs" -timeout=10 -max_len=65536 -artifact_prefix=./"$name"- "corpus/$name" ${seeds:+../$seeds}) \
        > "$out/$name.log" 2>&1 || rc=$?
    tail -3 "$out/$name.log"
    if [ $rc -ne 0 ]; then
        echo "$name failed (exit $rc): the input is in $out/$name-*, the log in $out/$name.log"
        failed=1
    fi
done
[ -z "$failed" ]
