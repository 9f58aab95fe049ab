// qwentune loss --model DIR [--adapter PEFT_DIR] --data FILE.jsonl [--backend cpu|cuda] [--grads OUT.safetensors]
//                [--tokens-per-batch N]
// Mean cross-entropy over every trained token of the file and, optionally, its fp32 gradients
// under the checkpoint's parameter names. Each line is one sample: pre-tokenized
// {"input_ids": [...], "labels": [...]} (labels optional: all tokens trained).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "io/peft_adapter.h"
#include "model/lora.h"
#include "core/log.h"
#include "model/hf_checkpoint.h"
#include "model/qwen35.h"
#include "data/data_job.h"
#include "data/readers.h"
#include "ops/backend_factory.h"
#include "ops/cpu/cpu_backend.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace qt::cli {
namespace {

struct TokenSample {
  std::vector<int32_t> ids, labels;
};

// Every line of the file: pre-tokenized {"input_ids", "labels"?} or a chat conversation (any
// schema the data pipeline reads), rendered with the model's tokenizer and chat template.
std::vector<TokenSample> read_loss_samples(const std::string& path, const std::string& model_dir, int64_t vocab,
                                           const ChatTemplateOptions& chat) {
  ReadOptions ro;
  ro.vocab_size = vocab;
  std::vector<TokenSample> out;
  std::unique_ptr<Tokenizer> tok;
  for (Sample& s : read_samples(path, ro)) {
    TokenSample t;
    if (s.pretokenized) {
      t.ids = std::move(s.input_ids);
      t.labels = s.labels.empty() ? t.ids : std::move(s.labels);
    } else {
      if (!tok) tok = std::make_unique<Tokenizer>(Tokenizer::load(resolve_tokenizer(model_dir)));
      TokenizedChat c = chat_tokenize(s.messages, chat, *tok);
      for (int32_t id : c.input_ids)
        QT_CHECK(id < vocab, s.location(), ": token id ", id, " from the tokenizer is outside the model's vocabulary");
      t.ids = std::move(c.input_ids);
      t.labels = std::move(c.labels);
    }
    QT_CHECK(!t.ids.empty(), s.location(), ": empty sample");
    out.push_back(std::move(t));
  }
  QT_CHECK(!out.empty(), path, ": no samples");
  return out;
}

void run_loss(const std::string& model_dir, const std::string& adapter_dir, const std::string& data,
              const std::string& backend_name, const std::string& grads_out, int64_t tokens_per_batch,
              const ChatTemplateOptions& chat) {
  HfModelDir dir = hf_load(model_dir);
  const std::vector<TokenSample> samples = read_loss_samples(data, model_dir, dir.config.vocab_size, chat);
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
  // With --adapter: the LoRA model, whose gradients are the adapters' (under PEFT's keys).
  std::unique_ptr<PeftAdapter> adapter;
  LoraSpec lora;
  if (!adapter_dir.empty()) {
    adapter = std::make_unique<PeftAdapter>(peft_adapter_open(adapter_dir));
    lora = lora_spec_from_peft(*adapter);
  }
  Qwen35Model model(dir.config, *be, longest, Checkpointing::None, adapter ? &lora : nullptr);
  model.load(dir);
  if (adapter) {
    const auto w = lora_read_adapter(*adapter, model.specs());
    for (size_t i = 0; i < w.size(); ++i) model.set_param_f32(i, w[i]);
  }
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
      specs.push_back({adapter ? peft_key(model.specs()[i].name) : model.specs()[i].name, DType::F32, model.specs()[i].shape,
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
  const Tokenizer tok = Tokenizer::load((std::filesystem::path(dir.dir) / "tokenizer.json").string());
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
    cmd->add_option("--model", *model, "HF model directory or hub id (Qwen/Qwen3.5-2B[@rev])")->required();
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
  auto thinking = std::make_shared<std::string>("on");
  auto train_on = std::make_shared<std::string>("assistant");
  cmd->add_option("--model", *model, "HF model directory or hub id (Qwen/Qwen3.5-2B[@rev])")->required();
  auto adapter = std::make_shared<std::string>();
  cmd->add_option("--adapter", *adapter, "a PEFT LoRA adapter on the model (--grads: the adapters' gradients)");
  cmd->add_option("--data", *data, "JSONL file, one sample per line")->required();
  cmd->add_option("--backend", *backend, "cpu, cuda or auto")->capture_default_str();
  cmd->add_option("--grads", *grads, "write fp32 gradients to this .safetensors file");
  cmd->add_option("--tokens-per-batch", *tpb, "tokens per packed row")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--thinking", *thinking, "chat samples: on|off")->capture_default_str();
  cmd->add_option("--train-on", *train_on, "chat samples: assistant|last_assistant|all")->capture_default_str();
  cmd->callback([=] {
    if (!grads->empty())
      QT_CHECK(std::filesystem::path(*grads).extension() == ".safetensors", "--grads ", *grads,
               ": the file name must end in .safetensors");
    ChatTemplateOptions chat;
    chat.thinking = thinking_mode_from_name(*thinking);
    chat.train_on = train_on_from_name(*train_on);
    run_loss(*model, *adapter, *data, *backend, *grads, *tpb, chat);
  });
}

}  // namespace qt::cli
