// actorpipe-gpt: trains a GPT with pipeline parallelism. Without --config it trains the
// embedded default (examples/configs/gpt-1f1b.toml) on the synthetic corpus in about a minute.
#include "default_config.hpp"
#include "examples/common/trainer_cli.hpp"

int main(int argc, char** argv) {
  const actorpipe::TrainerProgram program{"actorpipe-gpt", actorpipe::Arch::gpt,
                                          actorpipe_default_config};
  return actorpipe::trainer_main(argc, argv, program);
}
