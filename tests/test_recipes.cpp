// The recipes in examples/ultrachat_200k load with train_config_load and pass `plan`, so a renamed
// or dropped key, or a recipe that no longer fits one GPU, fails CI instead of a user's run. Parsing needs no hub cache: ids resolve where they are used.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <string>
#include <vector>

#include "io/hub_cache.h"
#include "model/plan.h"
#include "model/presets.h"
#include "test_util.h"
#include "train/trainer.h"

namespace qt {
namespace {

namespace fs = std::filesystem;

TEST(Recipes, UltrachatRecipesLoad) {
  testing::ScratchDir empty("recipes-no-cache");
  testing::ScopedEnv hub("HF_HUB_CACHE", empty.path());
  std::vector<std::string> recipes;
  for (const auto& e : fs::directory_iterator(std::string(QT_EXAMPLES_DIR) + "/ultrachat_200k"))
    if (e.path().extension() == ".yaml") recipes.push_back(e.path().string());
  EXPECT_GE(recipes.size(), 3u);
  for (const std::string& r : recipes) {
    SCOPED_TRACE(r);
    try {
      const TrainConfig c = train_config_load(r, {});
      EXPECT_TRUE(hub_looks_like_id(c.model)) << c.model;
      EXPECT_EQ(c.data.data, (std::vector<std::string>{"HuggingFaceH4/ultrachat_200k"}));
      EXPECT_EQ(c.data.split, "train_sft");
      EXPECT_EQ(c.data.eval_split, "test_sft");
      EXPECT_EQ(c.data.eval_data, c.data.data);
      EXPECT_EQ(c.eval_fraction, 0.0);
      // And through `plan`, with the preset of the same shape as the recipe's model id: the recipe
      // fits one H200 (an 8-GPU recipe: each of 8) with what it sets (checkpointing,
      // method, rows, ZeRO stage).
      std::string preset = c.model.substr(c.model.rfind('-') + 1);
      for (auto& ch : preset) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      PlanRequest req;
      if (c.dist.zero == "3") {  // the sharded recipes are written for one node of 8 GPUs
        req.gpus = 8;
        req.zero = 3;
      }
      req.tokens_per_batch = c.data.pack.tokens_per_batch;
      req.checkpointing = c.activation_checkpointing;
      if (c.method == "lora") req.lora = &c.lora;
      const Plan plan = plan_training(preset_config(preset), req);
      EXPECT_TRUE(plan.fits_141) << plan_table(plan, req);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  }
}

}  // namespace
}  // namespace qt
