#!/usr/bin/env bash
# llama.cpp's llama-bench (the .llcpp.tgz tree of ../shared/device/llama-bench.sh, same CMake
# flags) linked statically, so one file carries it to a later call: xz-compressed and split into
# $1/llama-bench.xz.part-* (each under the 16 MiB a returned file may have; ~41 MB in all for
# sm_90). Build it on the GPU machine's spare cores in one call (~390 s on 10), copy the parts
# into an ignored folder here (e.g. .llb/) and carry it to the calls that compare against
# llama.cpp: `cat .llb/llama-bench.xz.part-* | xz -d > /tmp/llama-bench` costs 4 s there, where
# a build costs ~6 minutes of every such call.
#
#   taskset -c 6-15 bash scripts/llama_static.sh "$OUT"      # on the GPU machine
set -eu
B=/root/llama-static; OUTD=${1:?out dir}; J=${JOBS:-10}
mkdir -p $B.src && tar xzf .llcpp.tgz -C $B.src
cmake -S $B.src/llcpp -B $B -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_UI=OFF \
    -DCMAKE_BUILD_TYPE=Release > $B.cmake.log 2>&1
cmake --build $B -j $J --target llama-bench > $B.build.log 2>&1 || { tail -30 $B.build.log; exit 1; }
ls -la $B/bin/llama-bench; ldd $B/bin/llama-bench | grep -v "^\s*/lib" | head -20
strip $B/bin/llama-bench 2>/dev/null || true
xz -T$J -6 -c $B/bin/llama-bench > /tmp/llama-bench.xz
split -b 15M -d /tmp/llama-bench.xz $OUTD/llama-bench.xz.part-
ls -la $OUTD/llama-bench.xz.part-*
