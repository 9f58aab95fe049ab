#include "ops/backend.h"

namespace qt {

// The defaults of the table's QT_OP_DEFAULTED ops, built from other ops.

void Backend::add_rmsnorm_forward(const Tensor& h, const Tensor& y, const Tensor& rstd, const Tensor& x,
                                  const Tensor& r, const Tensor& w, double eps, const Tensor& amax_y) {
  add(h, x, r);
  rmsnorm_forward(y, rstd, h, w, eps, amax_y);
}

void Backend::linear_cross_entropy_to(const Tensor& loss_sum, const Tensor& dhidden, const Tensor& dw,
                                      const Tensor& token_loss, const Tensor& hidden, const Tensor& w,
                                      const Tensor& targets, double grad_scale, bool accumulate_dw) {
  const double sum = linear_cross_entropy(dhidden, dw, token_loss, hidden, w, targets, grad_scale, accumulate_dw);
  copy_from_host(loss_sum, &sum);
}

}  // namespace qt
