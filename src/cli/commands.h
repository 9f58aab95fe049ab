// Each subcommand registers itself on the CLI11 app; main() dispatches and turns qt::Error into
// a one-line message and exit status 1 (the exit codes: README "Exit status").
#pragma once
#include <CLI/CLI.hpp>

namespace qt::cli {

void add_inspect_command(CLI::App& app);
void add_init_model_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_loss_command(CLI::App& app);
void add_train_commands(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_data_commands(CLI::App& app);  // data-stats, prepare
void add_profile_command(CLI::App& app);
void add_plan_command(CLI::App& app);

// The status main() returns after a command ran without an error (a command sets it, e.g. train
// stopped by a signal: 128 + the signal).
int& exit_status();

}  // namespace qt::cli
