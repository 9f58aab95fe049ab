// qwentune loss --model DIR --data FILE.jsonl [--backend cpu|cuda] [--grads OUT.safetensors]
//                [--tokens-per-batch N]
// Mean cross-entropy over every trained token of the file and, optionally, its fp32 gradients
// under the checkpoint's parameter names. Each line is one sample: pre-tokenized
// {"input_ids": [...], "labels": [...]} (labels optional: all tokens trained).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "io/hf_checkpoint.h"
#include "model/qwen35.h"
#include "ops/backend_factory.h"
#include "ops/cpu/cpu_backend.h"
#include "text/tokenizer.h"

namespace qt::cli {
namespace {

struct Sample {
  std::vector<int32_t> ids, labels;
};

std::vector<Sample> read_tokenized_jsonl(const std::string& path, int64_t vocab) {
  std::ifstream in(path);
  QT_CHECK(in.good(), path, ": cannot open");
  std::vector<Sample> out;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      QT_FAIL(path, ":", lineno, ": malformed JSON: ", e.what());
    }
    QT_CHECK(j.is_object() && j.contains("input_ids") && j["input_ids"].is_array(), path, ":", lineno,
             ": expected an object with an 'input_ids' array");
    Sample s;
    for (const auto& v : j["input_ids"]) {
      QT_CHECK(v.is_number_integer(), path, ":", lineno, ": input_ids must be integers");
      const int64_t id = v.get<int64_t>();
      QT_CHECK(id >= 0 && id < vocab, path, ":", lineno, ": token id ", id, " is outside the vocabulary [0, ", vocab, ")");
      s.ids.push_back(static_cast<int32_t>(id));
    }
    QT_CHECK(!s.ids.empty(), path, ":", lineno, ": empty input_ids");
    if (j.contains("labels") && !j["labels"].is_null()) {
      QT_CHECK(j["labels"].is_array() && j["labels"].size() == s.ids.size(), path, ":", lineno,
               ": labels must be an array as long as input_ids (", s.ids.size(), ")");
      for (const auto& v : j["labels"]) {
        QT_CHECK(v.is_number_integer(), path, ":", lineno, ": labels must be integers");
        const int64_t l = v.get<int64_t>();
        QT_CHECK(l == -100 || (l >= 0 && l < vocab), path, ":", lineno, ": label ", l, " is outside the vocabulary");
        s.labels.push_back(static_cast<int32_t>(l));
      }
    } else {
      s.labels = s.ids;
    }
    out.push_back(std::move(s));
  }
  QT_CHECK(!out.empty(), path, ": no samples");
  return out;
}

void run_loss(const std::string& model_dir, const std::string& data, const std::string& backend_name,
              const std::string& grads_out, int64_t tokens_per_batch) {
  HfModelDir dir = hf_load(model_dir);
  const std::vector<Sample> samples = read_tokenized_jsonl(data, dir.config.vocab_size);
  // Rows in file order: a sample starts a new row when it would overflow the current one.
  std::vector<PackedRow> rows(1);
  int64_t longest = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const int64_t n = static_cast<int64_t>(samples[i].ids.size());
    QT_CHECK(n <= tokens_per_batch, data, ": sample ", i + 1, " has ", n, " tokens, more than --tokens-per-batch ",
             tokens_per_batch);
    if (rows.back().num_tokens() + n > tokens_per_batch) rows.emplace_back();
    rows.back().append_sample(samples[i].ids, samples[i].labels);
    longest = std::max(longest, rows.back().num_tokens());
  }
  int64_t trained = 0;
  for (const auto& r : rows) trained += r.num_trained();
  QT_CHECK(trained > 0, data, ": no trained tokens (every label is -100 or every sample has one token)");
  auto be = make_backend(backend_name == "auto" ? default_backend_name() : backend_name);
  Qwen35Model model(dir.config, *be, longest);
  model.load(dir);
  model.zero_grads();
  double loss_sum = 0;
  for (const auto& r : rows) loss_sum += model.step(r, !grads_out.empty(), 1.0 / double(trained)).loss_sum;
  nlohmann::ordered_json j;
  j["loss"] = loss_sum / double(trained);
  j["trained_tokens"] = trained;
  j["samples"] = samples.size();
  j["batches"] = rows.size();
  j["backend"] = be->name();
  if (!grads_out.empty()) {
    std::vector<std::vector<float>> grads;
    std::vector<TensorWriteSpec> specs;
    double sq = 0;
    for (size_t i = 0; i < model.specs().size(); ++i) {
      grads.push_back(model.grad_f32(i));
      for (float v : grads.back()) sq += double(v) * v;
    }
    for (size_t i = 0; i < model.specs().size(); ++i) {
      const std::vector<float>* g = &grads[i];
      specs.push_back({model.specs()[i].name, DType::F32, model.specs()[i].shape,
                       [g](void* dst, size_t n) { std::memcpy(dst, g->data(), n); }});
    }
    const std::string parent = std::filesystem::path(grads_out).parent_path().string();
    const std::string stem = std::filesystem::path(grads_out).stem().string();
    SafetensorsWriteOptions o;
    o.base_name = stem;
    o.max_shard_bytes = SIZE_MAX;
    write_safetensors(parent.empty() ? "." : parent, specs, o);
    j["grad_norm"] = std::sqrt(sq);
    j["grads"] = grads_out;
  }
  std::printf("%s\n", j.dump().c_str());
}

// Logits of one raw text (no chat template), for parity checks against transformers
// (tools/check_hf_load.py --logits).
void run_logits(const std::string& model_dir, const std::string& text, const std::string& out) {
  HfModelDir dir = hf_load(model_dir);
  const Tokenizer tok = Tokenizer::load((std::filesystem::path(model_dir) / "tokenizer.json").string());
  const std::vector<int32_t> ids = tok.encode(text);
  QT_CHECK(!ids.empty(), "--text encodes to no tokens");
  PackedRow row;
  row.append_sample(ids, std::vector<int32_t>(ids.size(), -100));
  CpuBackend be;
  Qwen35Model model(dir.config, be, row.num_tokens());
  model.load(dir);
  nlohmann::json j = {{"model", model_dir}, {"input_ids", ids}, {"vocab_size", dir.config.vocab_size},
                      {"logits", model.logits(row)}};
  std::ofstream f(out);
  QT_CHECK(f.good(), out, ": cannot create");
  f << j.dump() << "\n";
  QT_CHECK(f.good(), out, ": write failed");
  std::printf("wrote %s (%zu tokens x %lld logits)\n", out.c_str(), ids.size(), static_cast<long long>(dir.config.vocab_size));
}

}  // namespace

void add_loss_command(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("logits", "Write the logits of a raw text to JSON (parity checks)");
    auto model = std::make_shared<std::string>();
    auto text = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    cmd->add_option("--model", *model, "HF model directory")->required();
    cmd->add_option("--text", *text, "raw text")->required();
    cmd->add_option("--out", *out, "output JSON")->required();
    cmd->callback([=] { run_logits(*model, *text, *out); });
  }
  auto* cmd = app.add_subcommand("loss", "Mean loss (and gradients) of a model over a data file");
  auto model = std::make_shared<std::string>();
  auto data = std::make_shared<std::string>();
  auto backend = std::make_shared<std::string>("cpu");
  auto grads = std::make_shared<std::string>();
  auto tpb = std::make_shared<int64_t>(8192);
  cmd->add_option("--model", *model, "HF model directory")->required();
  cmd->add_option("--data", *data, "JSONL file, one sample per line")->required();
  cmd->add_option("--backend", *backend, "cpu, cuda or auto")->capture_default_str();
  cmd->add_option("--grads", *grads, "write fp32 gradients to this .safetensors file");
  cmd->add_option("--tokens-per-batch", *tpb, "tokens per packed row")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->callback([=] {
    if (!grads->empty())
      QT_CHECK(std::filesystem::path(*grads).extension() == ".safetensors", "--grads ", *grads,
               ": the file name must end in .safetensors");
    run_loss(*model, *data, *backend, *grads, *tpb);
  });
}

}  // namespace qt::cli
