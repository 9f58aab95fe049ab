#include "train/report.h"

#include <filesystem>

#include "io/mapped_file.h"

namespace qt {
namespace fs = std::filesystem;

namespace {

// JSON placed inside <script>: "</" would end the element early.
std::string script_safe(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  for (size_t i = 0; i < json.size(); ++i) {
    if (json[i] == '<' && i + 1 < json.size() && json[i + 1] == '/') {
      out += "<\\/";
      ++i;
    } else {
      out += json[i];
    }
  }
  return out;
}

const char* kPage = R"HTML(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>qwentune run report</title>
<style>
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 15px; margin: 4px 0; }
.grid { display: flex; flex-wrap: wrap; gap: 16px; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 8px; }
table { border-collapse: collapse; font-size: 13px; } td { padding: 2px 10px 2px 0; }
svg text { font-size: 10px; fill: #555; }
</style></head><body>
<h1>qwentune run report</h1>
<table id="summary"></table>
<div class="grid" id="charts"></div>
<script id="run-data" type="application/json">@DATA@</script>
<script>
const data = JSON.parse(document.getElementById('run-data').textContent);
const summary = document.getElementById('summary');
for (const [k, v] of Object.entries(data.summary)) {
  const tr = document.createElement('tr');
  tr.innerHTML = '<td></td><td></td>';
  tr.children[0].textContent = k;
  tr.children[1].textContent = typeof v === 'number' ? (Number.isInteger(v) ? v : v.toPrecision(5)) : v;
  summary.appendChild(tr);
}
const charts = [
  {id: 'loss', title: 'loss', series: [['loss', '#1f77b4'], ['eval_loss', '#d62728']]},
  {id: 'lr', title: 'learning rate', series: [['lr', '#2ca02c']]},
  {id: 'grad_norm', title: 'gradient norm', series: [['grad_norm', '#9467bd']]},
  {id: 'tok_s', title: 'throughput (tokens/s)', series: [['tok_s', '#ff7f0e']]},
];
const W = 420, H = 220, L = 56, R = 10, T = 10, B = 28;
const NS = 'http://www.w3.org/2000/svg';
function el(name, attrs, parent) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  parent.appendChild(e);
  return e;
}
for (const c of charts) {
  const pts = c.series.map(([key]) => data.records.filter(r => typeof r[key] === 'number' && isFinite(r[key]))
                                                  .map(r => [r.step, r[key]]));
  const all = pts.flat();
  const card = document.createElement('div');
  card.className = 'card';
  card.innerHTML = '<h2></h2>';
  card.firstChild.textContent = c.title;
  document.getElementById('charts').appendChild(card);
  const svg = el('svg', {width: W, height: H, 'class': 'chart', 'data-metric': c.id}, card);
  if (all.length === 0) { el('text', {x: L, y: H / 2}, svg).textContent = 'no data'; svg.dataset.points = 0; continue; }
  let x0 = Math.min(...all.map(p => p[0])), x1 = Math.max(...all.map(p => p[0]));
  let y0 = Math.min(...all.map(p => p[1])), y1 = Math.max(...all.map(p => p[1]));
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= Math.abs(y0) * 0.05 + 1e-12; y1 += Math.abs(y1) * 0.05 + 1e-12; }
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R), sy = y => T + (y1 - y) / (y1 - y0) * (H - T - B);
  el('line', {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: '#999'}, svg);
  el('line', {x1: L, y1: T, x2: L, y2: H - B, stroke: '#999'}, svg);
  for (const [y, v] of [[T + 8, y1], [H - B, y0]]) el('text', {x: 2, y: y}, svg).textContent = v.toPrecision(3);
  el('text', {x: L, y: H - 8}, svg).textContent = 'step ' + x0;
  el('text', {x: W - R - 50, y: H - 8}, svg).textContent = 'step ' + x1;
  let drawn = 0;
  c.series.forEach(([key, color], i) => {
    if (pts[i].length === 0) return;
    const line = el('polyline', {fill: 'none', stroke: color, 'stroke-width': 1.5, 'data-series': key,
                                 points: pts[i].map(p => sx(p[0]).toFixed(1) + ',' + sy(p[1]).toFixed(1)).join(' ')}, svg);
    line.dataset.points = pts[i].length;
    drawn += pts[i].length;
  });
  svg.dataset.points = drawn;
}
document.body.dataset.rendered = 'true';
</script></body></html>
)HTML";

}  // namespace

void write_run_summary(const std::string& output_dir, const nlohmann::ordered_json& summary) {
  write_text_file((fs::path(output_dir) / "summary.json").string(), summary.dump(2) + "\n");
}

std::string report_html(const std::vector<nlohmann::json>& records, const nlohmann::ordered_json& summary) {
  nlohmann::ordered_json slim = nlohmann::ordered_json::array();
  for (const auto& r : records) {
    nlohmann::ordered_json s;
    for (const char* k : {"step", "loss", "eval_loss", "lr", "grad_norm", "tok_s"})
      if (r.contains(k)) s[k] = r[k];
    slim.push_back(std::move(s));
  }
  const nlohmann::ordered_json payload = {{"records", slim}, {"summary", summary}};
  std::string page = kPage;
  const std::string marker = "@DATA@";
  page.replace(page.find(marker), marker.size(), script_safe(payload.dump()));
  return page;
}

void write_run_report(const std::string& output_dir, const std::vector<nlohmann::json>& records,
                      const nlohmann::ordered_json& summary) {
  write_text_file((fs::path(output_dir) / "report.html").string(), report_html(records, summary));
}

}  // namespace qt
