// Incremental decoding (KV cache + recurrent GDN state) gives the same logits as the full packed
// forward at every position, and restarts cleanly.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/hf_checkpoint.h"
#include "model/decoder.h"
#include "model/qwen35.h"
#include "ops/cpu/cpu_backend.h"
#include "test_util.h"

namespace qt {
namespace {

class Decoder : public ::testing::TestWithParam<std::string> {};

TEST_P(Decoder, StepLogitsEqualFullForward) {
  HfModelDir dir = hf_load(testing::testdata_dir() + "/golden/" + GetParam());
  CpuBackend be;
  std::mt19937 rng(3);
  std::vector<int32_t> ids(90);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % dir.config.vocab_size);
  PackedRow row;
  row.append_sample(ids, std::vector<int32_t>(ids.size(), -100));
  Qwen35Model model(dir.config, be, row.num_tokens());
  model.load(dir);
  const std::vector<float> full = model.logits(row);
  const int64_t V = dir.config.vocab_size;
  IncrementalDecoder dec(model);
  for (int pass = 0; pass < 2; ++pass) {  // the second pass checks reset()
    for (size_t t = 0; t < ids.size(); ++t) {
      const std::vector<float>& step = dec.step(ids[t]);
      double num = 0, den = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double a = step[static_cast<size_t>(v)], b = full[t * static_cast<size_t>(V) + static_cast<size_t>(v)];
        num += (a - b) * (a - b);
        den += b * b;
      }
      // The packed forward runs in fp32 (BLAS), the decoder accumulates in double: ~1e-5 apart.
      ASSERT_LT(std::sqrt(num / den), 1e-4) << "position " << t << " pass " << pass;
    }
    dec.reset();
    EXPECT_EQ(dec.position(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Model, Decoder, ::testing::Values("tiny_tied", "tiny_untied"));

}  // namespace
}  // namespace qt
