#include "train/metrics_log.h"

#include <filesystem>

#include "core/error.h"
#include "train/run_dir.h"
#include "train/tensorboard.h"

namespace qt {
namespace fs = std::filesystem;

namespace {

// The scalars of a step record, in TensorBoard's tags (live and when a resume writes them again).
void tb_record(TensorBoardWriter& tb, const nlohmann::json& r) {
  const int64_t step = r.value("step", int64_t{0});
  for (const auto& [key, tag] : {std::pair<const char*, const char*>{"loss", "train/loss"}, {"lr", "train/lr"},
                                 {"grad_norm", "train/grad_norm"}, {"tok_s", "perf/tokens_per_s"}, {"mfu", "perf/mfu"},
                                 {"eval_loss", "eval/loss"}})
    if (r.contains(key) && r[key].is_number()) tb.scalar(tag, r[key].get<double>(), step);
}

}  // namespace

MetricsLog::MetricsLog(const std::string& output_dir, int64_t first_step)
    : path_((fs::path(output_dir) / "metrics.jsonl").string()) {
  if (first_step > 1) {
    records_ = metrics_truncate(path_, first_step);
  } else {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  const std::string tb_dir = (fs::path(output_dir) / "tb").string();
  tensorboard_remove_event_files(tb_dir);  // a resume writes the kept history again, each step once
  tb_ = std::make_unique<TensorBoardWriter>(tb_dir);
  for (const auto& r : records_) tb_record(*tb_, r);
  tb_->flush();
  out_.open(path_, std::ios::app);
  QT_CHECK(out_.good(), path_, ": cannot open for writing");
}

MetricsLog::~MetricsLog() = default;

void MetricsLog::write(const nlohmann::ordered_json& record) {
  out_ << record.dump() << "\n";
  out_.flush();
  records_.push_back(nlohmann::json::parse(record.dump()));
  tb_record(*tb_, records_.back());
  tb_->flush();
}

}  // namespace qt
