// Hopper warpgroup MMA (wgmma.mma_async, sm_90a only): shared-memory matrix descriptors for the
// 128-byte swizzle layouts, the fences, and m64nNk16 bf16 x bf16 -> f32 with both operands in
// shared memory. Layouts (PTX ISA, "Shared Memory Matrix Layout", canonical layouts with
// Swizzle<3,4,3>; T = 8 bf16 per 16 bytes):
//  * K-major (A [M, K], or B given as [N, K]): panels of 64 K-columns; in a panel, row r is 128
//    bytes at r * 128 and its 16-byte chunk c sits at chunk c ^ (r & 7) (sw128 below); 8-row groups
//    1024 bytes apart (SBO = 1024; LBO unused for swizzled K-major, encoded 1). A k16 step inside a
//    panel advances the start address by 32 bytes: the hardware applies the XOR to the address bits,
//    so every panel must start 1024-byte aligned.
//  * MN-major (B given as [K, N], kTransB = 1): blocks of 64 N-columns; in a block, K-row k is 128
//    bytes at k * 128, chunks swizzled the same way; SBO = 1024 (the next 8 K-rows), LBO = the byte
//    distance between 64-column blocks. A k16 step advances the start by 16 rows (2048 bytes).
// Smem written by ordinary stores must be fenced to the async proxy (fence_proxy_async) by the
// writing threads before the barrier that precedes the wgmma.
// Accumulator fragment (m64nN, f32): thread t of the warpgroup, warp w = t / 32, lane l: rows
// 16 w + l / 4 and that + 8; d[4 j + 0, 1] are row r0, columns 8 j + 2 (l % 4) + 0, 1; d[4 j + 2, 3]
// the same columns of row r0 + 8 (the mma.sync m16n8 C layout, repeated over N / 8).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/ops_device.cuh"

namespace qt::cuda::wg {

// Byte offset of element (row, col), col < 64, inside a 128-byte-swizzled panel.
__host__ __device__ constexpr uint32_t sw128(uint32_t row, uint32_t col) {
  return row * 128u + ((((col >> 3) ^ row) & 7u) << 4) + ((col & 7u) << 1);
}

// Descriptor of a 128-byte-swizzled operand starting at `smem` (bits 0-13 address >> 4, 16-29 LBO >> 4,
// 32-45 SBO >> 4, 62-63 swizzle mode 1 = 128 B).
__device__ __forceinline__ uint64_t desc_sw128(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return uint64_t((a & 0x3FFFFu) >> 4) | (uint64_t((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (uint64_t((sbo_bytes >> 4) & 0x3FFFu) << 32) | (uint64_t(1) << 62);
}

// The descriptor of the operand `bytes` further on (a multiple of 16; the address field does not
// carry into LBO for shared-memory addresses).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// Hides a descriptor's value from the optimizer, so that the descriptors derived from it by
// desc_advance are formed next to their wgmma instead of hoisted into live registers.
__device__ __forceinline__ uint64_t desc_opaque(uint64_t desc) {
  asm volatile("" : "+l"(desc));
  return desc;
}

using dev::fence_proxy_async;
// Orders the warpgroup's register accesses before the wgmma that follows.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accesses of an accumulator across the async MMA window.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
template <int N>
__device__ __forceinline__ void fence_operands(float (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence_operand(a[i]);
}

// The accumulator operands (m64n32: 16 floats, m64n64: 32, m64n128: 64, m64n256: 128) as asm text and
// output lists.
#define QT_WG_R0_15 \
  "%0, %1, %2, %3, %4, %5, %6, %7," \
  "%8, %9, %10, %11, %12, %13, %14, %15"
#define QT_WG_R0_31 \
  "%0, %1, %2, %3, %4, %5, %6, %7," \
  "%8, %9, %10, %11, %12, %13, %14, %15," \
  "%16, %17, %18, %19, %20, %21, %22, %23," \
  "%24, %25, %26, %27, %28, %29, %30, %31"
#define QT_WG_R32_63 \
  "%32, %33, %34, %35, %36, %37, %38, %39," \
  "%40, %41, %42, %43, %44, %45, %46, %47," \
  "%48, %49, %50, %51, %52, %53, %54, %55," \
  "%56, %57, %58, %59, %60, %61, %62, %63"
#define QT_WG_R64_127 \
  "%64, %65, %66, %67, %68, %69, %70, %71," \
  "%72, %73, %74, %75, %76, %77, %78, %79," \
  "%80, %81, %82, %83, %84, %85, %86, %87," \
  "%88, %89, %90, %91, %92, %93, %94, %95," \
  "%96, %97, %98, %99, %100, %101, %102, %103," \
  "%104, %105, %106, %107, %108, %109, %110, %111," \
  "%112, %113, %114, %115, %116, %117, %118, %119," \
  "%120, %121, %122, %123, %124, %125, %126, %127"
#define QT_WG_O0_15(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define QT_WG_O0_31(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define QT_WG_O32_63(d) \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define QT_WG_O64_127(d) \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define QT_WG_D32_REGS "{" QT_WG_R0_31 "}"
#define QT_WG_D64_REGS "{" QT_WG_R0_31 ", " QT_WG_R32_63 "}"
#define QT_WG_D32_OUT(d) QT_WG_O0_31(d)
#define QT_WG_D64_OUT(d) QT_WG_O0_31(d), QT_WG_O32_63(d)
#define QT_WG_D128_REGS "{" QT_WG_R0_31 ", " QT_WG_R32_63 ", " QT_WG_R64_127 "}"
#define QT_WG_D128_OUT(d) QT_WG_O0_31(d), QT_WG_O32_63(d), QT_WG_O64_127(d)

// d = A B + (scale_d != 0 ? d : 0). kTransB 0: B K-major, 1: N-major; kTransA 0: A K-major, 1:
// M-major (A given as [K, M]: the N-major layout with M for N, the same descriptor fields). kF16:
// both operands fp16 instead of bf16 (the same layouts; the fp16 GDN backward's products).
#define QT_WG_MMA_N32(TY)                                                                       \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                  \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " {" QT_WG_R0_15         \
               "}, %16, %17, p, 1, 1, %20, %19;\n}\n"                                           \
               : QT_WG_O0_15(d)                                                                 \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB), "n"(kTransA))
#define QT_WG_MMA_N64(TY)                                                                       \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                  \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " QT_WG_D32_REGS        \
               ", %32, %33, p, 1, 1, %36, %35;\n}\n"                                             \
               : QT_WG_D32_OUT(d)                                                               \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB), "n"(kTransA))
template <int kTransB, int kTransA = 0, bool kF16 = false>
__device__ __forceinline__ void mma_m64n32k16(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (kF16)
    QT_WG_MMA_N32("f16");
  else
    QT_WG_MMA_N32("bf16");
}

template <int kTransB, int kTransA = 0, bool kF16 = false>
__device__ __forceinline__ void mma_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (kF16)
    QT_WG_MMA_N64("f16");
  else
    QT_WG_MMA_N64("bf16");
}
#undef QT_WG_MMA_N32
#undef QT_WG_MMA_N64

template <int kTransB, int kTransA = 0>
__device__ __forceinline__ void mma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " QT_WG_D64_REGS
               ", %64, %65, p, 1, 1, %68, %67;\n}\n"
               : QT_WG_D64_OUT(d)
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB), "n"(kTransA));
}

template <int kTransB, int kTransA = 0>
__device__ __forceinline__ void mma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " QT_WG_D128_REGS
               ", %128, %129, p, 1, 1, %132, %131;\n}\n"
               : QT_WG_D128_OUT(d)
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB), "n"(kTransA));
}

// The same with A from registers (the m64nNk16 A fragment: warp w of the warpgroup holds rows
// 16 w .. 16 w + 15 in the mma.sync m16n8k16 A layout: a[0] = (row l / 4, columns 2 (l % 4) + 0, 1),
// a[1] = row + 8, a[2] = columns + 8, a[3] = both; bf16 pairs, low half the lower column).
#define QT_WG_MMA_N64_RS(TY)                                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                  \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " QT_WG_D32_REGS        \
               ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                 \
               : QT_WG_D32_OUT(d)                                                               \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(kTransB))
template <int kTransB, bool kF16 = false>
__device__ __forceinline__ void mma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                 int scale_d) {
  if constexpr (kF16)
    QT_WG_MMA_N64_RS("f16");
  else
    QT_WG_MMA_N64_RS("bf16");
}
#undef QT_WG_MMA_N64_RS

template <int kTransB>
__device__ __forceinline__ void mma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                 int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " QT_WG_D64_REGS
               ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
               : QT_WG_D64_OUT(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(kTransB));
}

template <int kTransB>
__device__ __forceinline__ void mma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b,
                                                 int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " QT_WG_D128_REGS
               ", {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
               : QT_WG_D128_OUT(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(kTransB));
}

// acc (64 x kN, f32) = A B^T over K = 16 kSteps, A (64 rows) and B (kN rows) both K-major
// 128-byte-swizzle panel tiles: 64 K-columns per panel, the next panel a_panel / b_panel bytes on.
// The first k-step overwrites acc. No fence or commit: the caller brackets one or more of these.
template <int kN, int kSteps>
__device__ __forceinline__ void mma_abt(float (&acc)[kN / 2], const void* a, uint32_t a_panel, const void* b,
                                        uint32_t b_panel) {
  static_assert(kN == 32 || kN == 64, "S-like tiles of 32 or 64 columns");
  const uint64_t da0 = desc_opaque(desc_sw128(a, 16, 1024));
  const uint64_t db0 = desc_opaque(desc_sw128(b, 16, 1024));
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const uint64_t da = desc_advance(da0, (kk / 4) * a_panel + (kk % 4) * 32);
    const uint64_t db = desc_advance(db0, (kk / 4) * b_panel + (kk % 4) * 32);
    if constexpr (kN == 32)
      mma_m64n32k16<0>(acc, da, db, kk > 0);
    else
      mma_m64n64k16<0>(acc, da, db, kk > 0);
  }
}

// mma_abt bracketed for a warpgroup with no other product in flight: fence, issue, commit, wait,
// and the accumulator fenced for the reads that follow.
template <int kN, int kSteps>
__device__ __forceinline__ void mma_abt_sync(float (&acc)[kN / 2], const void* a, uint32_t a_panel, const void* b,
                                             uint32_t b_panel) {
  fence();
  mma_abt<kN, kSteps>(acc, a, a_panel, b, b_panel);
  commit();
  wait<0>();
  fence_operands(acc);
}

#undef QT_WG_D32_REGS
#undef QT_WG_D32_OUT
#undef QT_WG_D64_REGS
#undef QT_WG_D64_OUT
#undef QT_WG_R0_15
#undef QT_WG_O0_15
#undef QT_WG_R0_31
#undef QT_WG_R32_63
#undef QT_WG_O0_31
#undef QT_WG_O32_63
#undef QT_WG_R64_127
#undef QT_WG_O64_127
#undef QT_WG_D128_REGS
#undef QT_WG_D128_OUT

// ---- mbarriers (ops_device.cuh) and TMA (the warp-specialized kernels' producer / consumer
// hand-over) ------------------------------------------------------------------------------------
using dev::mbar_arrive;
using dev::mbar_arrive_expect_tx;
using dev::mbar_init;
using dev::mbar_wait;
using dev::smem_addr;
// 2-D TMA load of the box at element coordinates (c0 inner, c1 rows) of `map` into dst (1024-byte
// aligned for the 128-byte swizzle), completing on bar. Coordinates past the tensor read zeros.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}
// Register reallocation between the warpgroups of a warp-specialized CTA (all 128 threads of the
// warpgroup execute it; the counts are multiples of 8 in [24, 256]).
template <int kRegs>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
// Synchronises the `threads` threads (a multiple of 32) that use named barrier `id` (1..15; 0 is
// __syncthreads').
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` without waiting (the other side syncs on it).
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Issue order of a product batch between the two warpgroups of a 256-thread CTA (FA3's scheduler
// barriers): warpgroup 1 issues its batch only once warpgroup 0 has issued its own, so the tensor
// cores finish warpgroup 0's batch first and its epilogue runs under warpgroup 1's batch, instead of
// both batches interleaving and both epilogues waiting for both. Each id is used once per batch and
// the CTA meets at a block barrier before the id is used again (one arrive per sync).
__device__ __forceinline__ void issue_after_wg0(int wgi, int id) {
  if (wgi == 1) named_sync(id, 256);
}
__device__ __forceinline__ void issued_by_wg0(int wgi, int id) {
  if (wgi == 0) named_arrive(id, 256);
}

}  // namespace qt::cuda::wg
