// CPU reference backend tests of the API boundary: bad inputs name the op and the tensor
// (CpuOpsErrors), and the shape checks shared with the CUDA backend (SharedOpChecks).
#include "cpu_ops_test_util.h"

namespace qt {
namespace {

using namespace cpu_ops_test;

// ---- CpuOpsErrors: the API boundary names op and tensor ------------------------------------------

TEST(CpuOpsErrors, WrongShapesAndDtypes) {
  CpuBackend be;
  const GdnDims dims{2, 4, 16, 16};  // conv_dim = 2*32 + 64 = 128
  Seqs seqs({0, 4, 10});
  Tensor qkv = be.alloc(DType::F32, {10, 96}), g = be.alloc(DType::F32, {10, 4}), beta = be.alloc(DType::F32, {10, 4}),
         o = be.alloc(DType::F32, {10, 4, 16});
  EXPECT_ERROR_CONTAINS([&] { be.gdn_forward(o, qkv, g, beta, dims, seqs.info, Tensor(), GdnKeep::States); }, "gdn_forward", "qkv",
                        "f32[10, 96]", "[10, 128]");
  Tensor qkv_ok = be.alloc(DType::F32, {10, 128});
  EXPECT_ERROR_CONTAINS([&] { be.gdn_forward(o, qkv_ok, g, be.alloc(DType::F32, {10, 3}), dims, seqs.info, Tensor(), GdnKeep::States); },
                        "gdn_forward", "beta", "[10, 4]");
  EXPECT_ERROR_CONTAINS([&] { be.gdn_forward(o, qkv_ok, g, beta, GdnDims{3, 4, 16, 16}, seqs.info, Tensor(), GdnKeep::States); },
                        "gdn_forward", "num_v_heads 4", "num_k_heads 3");
  Seqs bad_end({0, 4, 9});
  EXPECT_ERROR_CONTAINS([&] { be.gdn_forward(o, qkv_ok, g, beta, dims, bad_end.info, Tensor(), GdnKeep::States); }, "gdn_forward",
                        "cu_seqlens", "ends at 9", "T = 10");
  Tensor dqkv = be.alloc(DType::F32, {10, 128}), dg = be.alloc(DType::F32, {10, 4}),
         d_o_bf16 = be.alloc(DType::BF16, {10, 4, 16});
  EXPECT_ERROR_CONTAINS([&] { be.gdn_backward(dqkv, dg, beta, d_o_bf16, qkv_ok, g, beta, dims, seqs.info, Tensor(), GdnKeep::States); },
                        "gdn_backward", "d_o", "bf16", "expected dtype f32");

  Tensor x = be.alloc(DType::F32, {10, 8}), w = be.alloc(DType::F32, {8, 4});
  EXPECT_ERROR_CONTAINS([&] { be.conv1d_silu_forward(be.alloc(DType::F32, {10, 7}), x, w, seqs.info); },
                        "conv1d_silu_forward", "y", "f32[10, 7]", "[10, 8]");

  const AttnDims ad{4, 2, 8, 4, 1e4};
  Tensor q = be.alloc(DType::F32, {10, 4, 8}), k = be.alloc(DType::F32, {10, 2, 8}), v = be.alloc(DType::F32, {10, 2, 8}),
         ao = be.alloc(DType::F32, {10, 4, 8});
  EXPECT_ERROR_CONTAINS([&] { be.attention_forward(ao, be.alloc(DType::F32, {10, 4}), q, k, v, ad, seqs.info); },
                        "attention_forward", "lse", "f32[10, 4]", "[4, 10]");
  EXPECT_ERROR_CONTAINS([&] { be.attention_forward(ao, be.alloc(DType::F32, {4, 10}), q, k, k, AttnDims{4, 3, 8, 4, 1e4}, seqs.info); },
                        "attention_forward", "num_kv_heads 3");
  EXPECT_ERROR_CONTAINS(
      [&] {
        be.attn_prep_forward(q, k, be.alloc(DType::F32, {10, 32}), be.alloc(DType::F32, {40}), be.alloc(DType::F32, {20}),
                             be.alloc(DType::F32, {10, 64}), be.alloc(DType::F32, {10, 16}), be.alloc(DType::F32, {8}),
                             be.alloc(DType::F32, {8}), be.alloc(DType::F32, {10}), ad, 1e-6);
      },
      "attn_prep_forward", "positions", "expected dtype i32");

  EXPECT_ERROR_CONTAINS([&] { be.linear_forward(be.alloc(DType::F32, {10, 3}), x, be.alloc(DType::F32, {4, 8})); },
                        "linear_forward", "y", "f32[10, 3]", "[10, 4]");
  Tensor ids = upload_i32(be, {0, 1, 9});
  EXPECT_ERROR_CONTAINS([&] { be.embedding_forward(be.alloc(DType::F32, {3, 4}), be.alloc(DType::F32, {9, 4}), ids); },
                        "embedding_forward", "ids[2] = 9", "[0, 9)");
  Tensor targets = upload_i32(be, {1, -100, -5});
  EXPECT_ERROR_CONTAINS(
      [&] { be.linear_cross_entropy(Tensor(), Tensor(), Tensor(), be.alloc(DType::F32, {3, 4}), be.alloc(DType::F32, {6, 4}), targets, 1.0, true); },
      "linear_cross_entropy", "targets[2] = -5");
  EXPECT_ERROR_CONTAINS(
      [&] { be.linear_cross_entropy(be.alloc(DType::F32, {3, 5}), Tensor(), Tensor(), be.alloc(DType::F32, {3, 4}), be.alloc(DType::F32, {6, 4}), upload_i32(be, {1, 2, 3}), 1.0, true); },
      "linear_cross_entropy", "dhidden", "f32[3, 5]", "[3, 4]");
  EXPECT_ERROR_CONTAINS([&] { be.rmsnorm_forward(x, be.alloc(DType::F32, {10}), x, be.alloc(DType::F32, {7}), 1e-6, Tensor()); },
                        "rmsnorm_forward", "x", "last dim 7");
}

// The per-op checks both backends share (ops/op_check.h), in the CUDA backend's configuration:
// bf16 activations on a CUDA device. The tensors only carry a non-null address (nothing is read),
// so this runs without a GPU and covers the argument sets CudaBackend passes.
TEST(SharedOpChecks, CudaConfigurationAcceptsRightShapesAndNamesWrongOnes) {
  static char storage[16];
  const Device dev = Device::cuda();
  auto t = [&](DType dt, const Shape& s) { return Tensor(storage, dt, s, dev); };
  const DType BF = DType::BF16, F = DType::F32;
  const DeviceKind cuda = DeviceKind::CUDA;
  const int64_t T = 11;
  // Gated delta rule: Hk 2, Hv 4, dk 16, dv 32 -> conv_dim 2*2*16 + 4*32 = 192.
  const GdnDims gd{2, 4, 16, 32};
  const Tensor qkv = t(BF, {T, 192}), g = t(F, {T, 4}), beta = t(F, {T, 4}), o = t(BF, {T, 4, 32});
  EXPECT_EQ(ops::check_gdn_forward("gdn_forward", gd, o, qkv, g, beta, BF, cuda), T);
  EXPECT_EQ(ops::check_gdn_backward("gdn_backward", gd, t(BF, {T, 192}), t(F, {T, 4}), t(F, {T, 4}), o, qkv, g, beta,
                                    BF, cuda),
            T);
  EXPECT_ERROR_CONTAINS([&] { ops::check_gdn_forward("gdn_forward", gd, o, qkv, t(F, {T, 3}), beta, BF, cuda); },
                        "gdn_forward", "g is", "[11, 4]");
  EXPECT_ERROR_CONTAINS(
      [&] {
        ops::check_gdn_backward("gdn_backward", gd, t(BF, {T, 192}), g, beta, t(F, {T, 4, 32}), qkv, g, beta, BF, cuda);
      },
      "gdn_backward", "d_o", "expected dtype bf16");
  EXPECT_ERROR_CONTAINS([&] { ops::check_gdn_forward("gdn_forward", gd, o, Tensor(storage, BF, {T, 192}), g, beta, BF,
                                                     cuda); },
                        "gdn_forward", "qkv", "not on the CUDA device");
  // Gates: [T, H] projections and [H] parameters in bf16, beta / g in f32.
  const auto th = ops::check_gdn_gates_backward("gdn_gates_backward", t(BF, {T, 4}), t(BF, {T, 4}), t(F, {T, 4}),
                                                t(F, {T, 4}), t(BF, {T, 4}), t(BF, {T, 4}), t(BF, {4}), t(BF, {4}), BF,
                                                cuda);
  EXPECT_EQ(th.first, T);
  EXPECT_EQ(th.second, 4);
  EXPECT_ERROR_CONTAINS(
      [&] {
        ops::check_gdn_gates_forward("gdn_gates_forward", t(F, {T, 4}), t(F, {T, 4}), t(BF, {T, 4}), t(BF, {T, 4}),
                                     t(F, {4}), t(BF, {4}), BF, cuda);
      },
      "gdn_gates_forward", "a_log", "expected dtype bf16");
  // Attention (8 q / 2 kv heads, D 64) and its prep (qg holds q and the gate per head).
  const AttnDims ad{8, 2, 64, 32, 1e6};
  const Tensor q = t(BF, {T, 8, 64}), k = t(BF, {T, 2, 64}), v = t(BF, {T, 2, 64}), ao = t(BF, {T, 8, 64}),
               lse = t(F, {8, T});
  EXPECT_EQ(ops::check_attention_backward("attention_backward", ad, t(BF, {T, 8, 64}), t(BF, {T, 2, 64}),
                                          t(BF, {T, 2, 64}), t(BF, {T, 8, 64}), q, k, v, ao, lse, BF, cuda),
            T);
  EXPECT_ERROR_CONTAINS(
      [&] { ops::check_attention_forward("attention_forward", ad, ao, t(F, {T, 8}), q, k, v, BF, cuda); },
      "attention_forward", "lse", "[8, 11]");
  const Tensor qg = t(BF, {T, 8 * 2 * 64}), kr = t(BF, {T, 2 * 64}), w = t(BF, {64}), pos = t(DType::I32, {T});
  EXPECT_EQ(ops::check_attn_prep_forward("attn_prep_forward", ad, q, k, t(BF, {T, 8 * 64}), t(F, {T * 8}),
                                         t(F, {T * 2}), qg, kr, w, w, pos, BF, cuda),
            T);
  EXPECT_ERROR_CONTAINS(
      [&] {
        ops::check_attn_prep_backward("attn_prep_backward", ad, qg, t(BF, {T, 2 * 64 + 1}), q, k, t(BF, {T, 8 * 64}),
                                      qg, kr, w, w, t(F, {T * 8}), t(F, {T * 2}), pos, BF, cuda);
      },
      "attn_prep_backward", "dkr");
  EXPECT_ERROR_CONTAINS([&] { ops::check_attn_dims("attention_forward", AttnDims{6, 4, 64, 32, 1e6}); },
                        "num_q_heads 6", "num_kv_heads 4");
  // Linear: w [N, K], x [T, K], y / dy [T, N].
  const ops::LinearDims ld =
      ops::check_linear("linear_forward", t(BF, {6, 9}), t(BF, {T, 9}), "y", t(BF, {T, 6}), BF, cuda);
  EXPECT_EQ(ld.T, T);
  EXPECT_EQ(ld.N, 6);
  EXPECT_EQ(ld.K, 9);
  EXPECT_ERROR_CONTAINS(
      [&] { ops::check_linear("linear_backward", t(BF, {6, 9}), t(BF, {T, 9}), "dy", t(BF, {T, 7}), BF, cuda); },
      "linear_backward", "dy is", "[11, 6]");
  // Row norms: w [cols], x [..., cols], rstd [rows], the rest shaped like x.
  const Tensor nx = t(BF, {T, 4, 32});
  const ops::NormDims nd = ops::check_norm("gated_rmsnorm_forward", t(BF, {32}), nx, {{"z", &nx}, {"y", &nx}},
                                           t(F, {T * 4}), BF, cuda);
  EXPECT_EQ(nd.rows, T * 4);
  EXPECT_EQ(nd.cols, 32);
  EXPECT_ERROR_CONTAINS(
      [&] { ops::check_norm("rmsnorm_forward", t(BF, {32}), nx, {{"y", &nx}}, t(F, {T}), BF, cuda); },
      "rmsnorm_forward", "rstd", "[44]");
  EXPECT_ERROR_CONTAINS(
      [&] { ops::check_norm("rmsnorm_forward", t(BF, {31}), nx, {{"y", &nx}}, t(F, {T * 4}), BF, cuda); },
      "rmsnorm_forward", "last dim 31");
  // Elementwise: every tensor shaped like the first.
  ops::check_same_shape("swiglu_forward", BF, cuda, {{"gate", &qg}, {"up", &qg}, {"h", &qg}});
  EXPECT_ERROR_CONTAINS([&] { ops::check_same_shape("swiglu_forward", BF, cuda, {{"gate", &qg}, {"up", &kr}}); },
                        "swiglu_forward", "up is");
}

}  // namespace
}  // namespace qt
