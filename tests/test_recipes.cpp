// The recipes in examples/ultrachat_200k load with train_config_load, so a renamed or dropped key
// fails CI instead of a user's run. Parsing needs no hub cache: ids resolve where they are used.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "io/hub_cache.h"
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
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  }
}

}  // namespace
}  // namespace qt
