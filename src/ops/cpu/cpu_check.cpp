#include "ops/cpu/cpu_check.h"

#include <algorithm>

namespace qt::cpu {

const int32_t* check_seqs(const char* op, const SeqInfo& seqs, int64_t T) {
  QT_CHECK(seqs.num_seqs >= 1, op, ": seqs.num_seqs is ", seqs.num_seqs, ", expected >= 1");
  check_tensor(op, "seqs.cu_seqlens", seqs.cu_seqlens, DType::I32, {seqs.num_seqs + 1});
  const int32_t* cu = seqs.cu_seqlens.ptr<int32_t>();
  QT_CHECK(cu[0] == 0, op, ": seqs.cu_seqlens[0] is ", cu[0], ", expected 0");
  int64_t longest = 0;
  for (int s = 0; s < seqs.num_seqs; ++s) {
    QT_CHECK(cu[s + 1] >= cu[s], op, ": seqs.cu_seqlens decreases at index ", s + 1, " (", cu[s], " -> ",
             cu[s + 1], ")");
    longest = std::max<int64_t>(longest, cu[s + 1] - cu[s]);
  }
  QT_CHECK(cu[seqs.num_seqs] == T, op, ": seqs.cu_seqlens ends at ", cu[seqs.num_seqs], ", expected T = ", T);
  QT_CHECK(seqs.total_tokens == T, op, ": seqs.total_tokens is ", seqs.total_tokens, ", expected T = ", T);
  QT_CHECK(seqs.max_seqlen >= longest, op, ": seqs.max_seqlen is ", seqs.max_seqlen,
           ", less than the longest sequence (", longest, ")");
  return cu;
}

}  // namespace qt::cpu
