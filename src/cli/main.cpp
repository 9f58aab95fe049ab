#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/communicator.h"

int main(int argc, char** argv) {
  CLI::App app{"qwentune: native C++/CUDA fine-tuning for Qwen3.5 hybrid models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "qwentune 0.1.0");
  qt::cli::add_inspect_command(app);
  qt::cli::add_init_model_command(app);
  qt::cli::add_tokenize_command(app);
  qt::cli::add_loss_command(app);
  qt::cli::add_train_commands(app);
  qt::cli::add_bench_command(app);
  qt::cli::add_data_commands(app);
  qt::cli::add_profile_command(app);
  qt::cli::add_plan_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;  // usage errors: 2, as getopt-style tools do
  } catch (const qt::Error& e) {
    std::fprintf(stderr, "qwentune: error: %s\n", e.what());
    if (qt::log_level() <= qt::LogLevel::Debug) std::fprintf(stderr, "  (raised at %s)\n", e.where().c_str());
    qt::mpi_abort_job(1);  // the other ranks of an MPI job must not wait for this one
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qwentune: error: %s\n", e.what());
    qt::mpi_abort_job(1);
    return 1;
  }
  return qt::cli::exit_status();
}

int& qt::cli::exit_status() {
  static int status = 0;
  return status;
}
