// AdamW's hyper-parameters, shared by the host reference (ops/cpu/adamw.h) and the fused device
// optimizers a backend offers (ops/step_runtime.h).
#pragma once

namespace qt {

struct AdamWConfig {
  double lr = 1e-4;  // peak; the schedule scales it each step
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

}  // namespace qt
