// What a run leaves for a reader: output_dir/summary.json (steps, losses, throughput, MFU, wall
// time, peak memory, final directory) and output_dir/report.html, one self-contained page (no
// network: the step records are embedded as JSON and drawn as inline SVG by a short script) with
// loss and eval loss, learning rate, gradient norm and throughput plots. Both are refreshed at
// every save.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qt {

void write_run_summary(const std::string& output_dir, const nlohmann::ordered_json& summary);
// The page for `records` (metrics.jsonl's objects) and `summary` (shown as a table).
std::string report_html(const std::vector<nlohmann::json>& records, const nlohmann::ordered_json& summary);
void write_run_report(const std::string& output_dir, const std::vector<nlohmann::json>& records,
                      const nlohmann::ordered_json& summary);

}  // namespace qt
