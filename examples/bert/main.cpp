// actorpipe-bert: trains a BERT (masked language model) with pipeline parallelism. Without
// --config it trains the embedded default (examples/configs/bert-1f1b.toml).
#include "default_config.hpp"
#include "examples/common/trainer_cli.hpp"

int main(int argc, char** argv) {
  const actorpipe::TrainerProgram program{"actorpipe-bert", actorpipe::Arch::bert,
                                          actorpipe_default_config};
  return actorpipe::trainer_main(argc, argv, program);
}
