// A run's step records: output_dir/metrics.jsonl (one JSON object a line) and TensorBoard scalars
// under output_dir/tb. A fresh run starts both empty; a resume keeps the records before its first
// step and writes the TensorBoard history again from them, so every step appears once.
#pragma once
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qt {

class TensorBoardWriter;

class MetricsLog {
 public:
  // first_step: the run's first step (1 = fresh: earlier records are removed).
  MetricsLog(const std::string& output_dir, int64_t first_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Appends a record (flushed at once) and its scalars (loss, lr, grad_norm, tok_s, mfu, eval_loss).
  void write(const nlohmann::ordered_json& record);
  const std::vector<nlohmann::json>& records() const { return records_; }

 private:
  std::string path_;
  std::vector<nlohmann::json> records_;
  std::unique_ptr<TensorBoardWriter> tb_;
  std::ofstream out_;
};

}  // namespace qt
