// The environment variables qwentune reads that other tools define: where caches live (HOME,
// XDG_CACHE_HOME; Hugging Face's HF_HUB_CACHE, HF_HOME) and where a process sits in
// a job (OpenMPI's OMPI_COMM_WORLD_*, Slurm's SLURM_*, torchrun's RANK / WORLD_SIZE / LOCAL_RANK /
// LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT). qwentune's own settings are config keys; its only
// own variables are QWENTUNE_LOG, QWENTUNE_THREADS and QWENTUNE_DEBUG_SYNC (README "GPU").
#pragma once

namespace qt {

// The variable's value, or nullptr when it is unset. `name` must be one of the conventions above
// (anything else is a programming error: a setting belongs in the config).
const char* external_env(const char* name);

}  // namespace qt
