#!/bin/sh
# Compile-time performance guard for register-heavy kernels (runs without a GPU):
#   check_ptxas.sh NVCC SRC_DIR FILE.cu KERNEL_REGEX [ALLOW_REGEX ALLOW_BYTES]
# compiles FILE.cu for sm_90a with ptxas -v and fails when
#  * ptxas serialized wgmma anywhere in the file (C7515 / C7518 / C7520 "Potential Performance Loss":
#    a wgmma under a warpgroup-dependent branch, or registers touched inside the async window, makes
#    ptxas wait after every wgmma of the kernel; an info line, so the build does not fail on it), or
#  * a kernel whose name matches KERNEL_REGEX spills registers (the attention wgmma kernels sit at
#    233-255 registers, GDN's mma.sync bwd_chunk at 123 of the 128 its two CTAs per SM allow, the
#    wgmma scans and bwd_chunk at 214-253 of 255; a spill inside their loops costs more than any
#    change that causes it gains). Kernels matching ALLOW_REGEX may spill up to ALLOW_BYTES of stores
#    and of loads each: a warp-specialized kernel whose setmaxnreg split leaves a few loop-invariant
#    scalars in local memory, measured with them (the budget still catches growth).
set -u
nvcc=$1 src=$2 file=$3 regex=$4 allow=${5:-^$} allow_bytes=${6:-0}
out=$("$nvcc" -DQT_HAVE_CUDA=1 -DNDEBUG -O3 -std=c++17 --expt-relaxed-constexpr -I "$src" \
  -gencode arch=compute_90a,code=sm_90a -Xptxas -v -c "$file" -o /dev/null 2>&1) || {
  printf '%s\n' "$out" | tail -20
  echo "check_ptxas: $file does not compile"
  exit 1
}
status=0
if printf '%s\n' "$out" | grep -E 'C75(15|18|20)'; then
  echo "check_ptxas: ptxas serialized wgmma in $file (see the lines above)"
  status=1
fi
# "Compiling entry function 'NAME'" ... "N bytes stack frame, S bytes spill stores, L bytes spill loads"
bad=$(printf '%s\n' "$out" | awk -v re="$regex" -v allow="$allow" -v budget="$allow_bytes" '
  /Compiling entry function/ { name = $0; sub(/.*function .\x27?/, "", name); sub(/\x27.*/, "", name); next }
  /bytes spill stores/ {
    if (name ~ re) {
      n++
      lim = name ~ allow ? budget : 0  # the default allow, ^$, matches no kernel
      if ($5 > lim || $9 > lim) print name ": " $0
    }
  }
  END { if (n == 0) print "no kernel matched " re }')
if [ -n "$bad" ]; then
  printf '%s\n' "$bad"
  echo "check_ptxas: spills (or no match) in the kernels matching '$regex' of $file"
  status=1
fi
[ $status -eq 0 ] && echo "check_ptxas: $file: wgmma not serialized, kernels matching '$regex' spill-free (or within $allow_bytes bytes: '$allow')"
exit $status
