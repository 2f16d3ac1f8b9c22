// Config tests: defaults, a full file, --set precedence and value syntax, the TOML round trip,
// one test per class of error (message contents checked), and docs/config.md kept in sync.
#include "engine/config/config.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "engine/config/option_table.hpp"

namespace fs = std::filesystem;
using namespace actorpipe;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The error of config_from_string(text, sets); fails the test if the config is accepted.
std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  auto r = config_from_string(text, sets);
  REQUIRE_MESSAGE(!r.ok(), "accepted: " << text);
  return r.error().message;
}

std::string source_dir() {
  const char* d = std::getenv("ACTORPIPE_SOURCE_DIR");
  REQUIRE_MESSAGE(d != nullptr, "ACTORPIPE_SOURCE_DIR is not set");
  return d;
}

// The data-member names declared in the body of a struct, one declaration per line
// ("type name;" or "type name = default;", trailing // comments allowed).
std::vector<std::string> member_names(const std::string& body) {
  std::vector<std::string> names;
  std::size_t pos = 0;
  while (pos < body.size()) {
    auto eol = body.find('\n', pos);
    if (eol == std::string::npos) eol = body.size();
    std::string line = body.substr(pos, eol - pos);
    pos = eol + 1;
    if (auto c = line.find("//"); c != std::string::npos) line.erase(c);
    const auto semi = line.find(';');
    if (semi == std::string::npos || line.find('(') != std::string::npos) continue;
    std::string decl = line.substr(0, std::min(semi, line.find('=')));
    while (!decl.empty() && decl.back() == ' ') decl.pop_back();
    const auto space = decl.rfind(' ');
    if (space == std::string::npos || decl.find_first_not_of(' ') >= space) continue;
    names.push_back(decl.substr(space + 1));
  }
  return names;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A config in which every key differs from its default.
Config everything_changed() {
  Config c;
  c.model.arch = Arch::bert;
  c.model.vocab_size = 300;
  c.model.context = 64;
  c.model.width = 96;
  c.model.depth = 6;
  c.model.heads = 3;
  c.model.segments = 3;
  c.model.tied = false;
  c.model.init_seed = 9007199254740993ull;  // not representable as a double
  c.data.kind = "text";
  c.data.path = "dir with space/\"quoted\" \\ back\tslash\nnewline-é.txt";
  c.data.seed = 77;
  c.data.synthetic_branching = 7;
  c.data.synthetic_seed = 5;
  c.data.mask_prob = 0.2;
  c.pipeline.mode = "gpipe";
  c.pipeline.stages = 3;
  c.pipeline.microbatches = 6;
  c.pipeline.microbatch_size = 2;
  c.pipeline.seq_len = 32;
  c.pipeline.partition.counts = {2, 3, 3};
  c.pipeline.threads_per_stage = 2;
  c.pipeline.precision = "bf16";
  c.pipeline.split_backward = false;
  c.pipeline.memory_limit_mb = 64;
  c.pipeline.recompute = {RecomputeSpec::Kind::layers, {7, 1}};
  c.pipeline.replicas = 2;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 3e-4f;
  c.optimizer.beta1 = 0.8f;
  c.optimizer.beta2 = 0.999f;
  c.optimizer.eps = 1e-6f;
  c.optimizer.weight_decay = 0.1f;
  c.optimizer.momentum = 0.7f;
  c.optimizer.grad_clip = 0.0f;
  c.optimizer.warmup_steps = 10;
  c.optimizer.decay_steps = 11;
  c.optimizer.min_lr = 1e-5f;
  c.optimizer.dc_lambda = 0.5f;
  c.train.steps = 12;
  c.train.seed = 3;
  c.train.log_every = 0;
  c.train.metrics = "m.jsonl";
  c.train.trace = "t.json";
  c.train.max_restarts = 3;
  c.train.restart_backoff = 2.5;
  c.train.nonfinite = "skip";
  c.train.stop = "run";
  c.checkpoint.dir = "ckpt";
  c.checkpoint.every = 4;
  c.checkpoint.resume = "ckpt/final";
  c.checkpoint.overwrite = true;
  c.cluster.placement = {0, 0, 1};
  c.cluster.bind = "0.0.0.0";
  c.cluster.connect_timeout = 12.5;
  c.cluster.peer_timeout = 3.0;
  c.cluster.tls_certificate = "node.pem";
  c.cluster.tls_key = "node.key";
  c.cluster.tls_ca = "ca.pem";
  c.cluster.gpu_channel = "ucx";
  c.cluster.shared_memory = false;
  c.migration.enabled = true;
  c.migration.moves = "2: 3, 3, 2; 5: 2, 4, 2";
  c.migration.check_every = 3;
  c.migration.threshold = 0.25;
  c.migration.patience = 4;
  c.migration.min_gain = 0.125;
  c.data.holdout = 0.125;
  c.eval.every = 5;
  c.eval.microbatches = 3;
  c.eval.path = "valid.bin";
  return c;
}

}  // namespace

TEST_CASE("an empty file gives the defaults of options.hpp, and they validate") {
  auto r = config_from_string("");
  REQUIRE(r.ok());
  CHECK(to_toml(*r) == to_toml(Config{}));
  CHECK(validate(Config{}).ok());
  auto l = load_config("", {});
  REQUIRE(l.ok());
  CHECK(to_toml(*l) == to_toml(Config{}));
  CHECK(num_layers(ModelOptions{}) == 6);
}

TEST_CASE("a file sets every section") {
  const std::string text = R"(
# comment
[model]
arch = "bert"
vocab_size = 512
width = 64
heads = 8
depth = 2
tied = false

[data]
kind = "tokens"
path = "train.bin"
mask_prob = 0.25

[pipeline]
mode = "pipedream"
stages = 2
partition = [1, 3]
seq_len = 16

[optimizer]
lr = 1            # an integer is accepted for a float key
beta2 = 0.99

[train]
steps = 7
metrics = "out.jsonl"

[checkpoint]
dir = "runs/a"
every = 2
)";
  auto r = config_from_string(text);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(r->model.arch == Arch::bert);
  CHECK(r->model.vocab_size == 512);
  CHECK(r->model.width == 64);
  CHECK(r->model.heads == 8);
  CHECK(r->model.depth == 2);
  CHECK(r->model.tied == false);
  CHECK(r->model.context == 128);  // untouched keys keep their defaults
  CHECK(r->data.kind == "tokens");
  CHECK(r->data.path == "train.bin");
  CHECK(r->data.mask_prob == 0.25);
  CHECK(r->pipeline.mode == "pipedream");
  CHECK(r->pipeline.stages == 2);
  CHECK(r->pipeline.partition.counts == std::vector<int>{1, 3});
  CHECK(r->pipeline.seq_len == 16);
  CHECK(r->optimizer.lr == 1.0f);
  CHECK(r->optimizer.beta2 == 0.99f);
  CHECK(r->train.steps == 7);
  CHECK(r->train.metrics == "out.jsonl");
  CHECK(r->checkpoint.dir == "runs/a");
  CHECK(r->checkpoint.every == 2);
  // Dotted keys and inline tables are the same TOML.
  auto d = config_from_string("model.width = 32\npipeline = { stages = 2 }\n");
  REQUIRE_MESSAGE(d.ok(), d.error().message);
  CHECK(d->model.width == 32);
  CHECK(d->pipeline.stages == 2);
}

TEST_CASE("to_toml round-trips a config in which every key differs from its default") {
  const Config c = everything_changed();
  const Config defaults;
  // keys that only an asynchronous mode takes (train.nonfinite = skip above needs a synchronous
  // one): a second config changes them, and round-trips too
  Config async = c;
  async.pipeline.mode = "2bw";
  async.train.nonfinite = "stop";
  async.optimizer.delay_correction = "nesterov";
  async.optimizer.kind = "adamw";  // NAdam's momentum schedule: AdamW only
  async.optimizer.momentum_decay = 0.004f;
  async.pipeline.stash_precision = "bf16";
  async.optimizer.secant_decay = 0.5f;    // read only with a secant correction, valid without one
  async.optimizer.basis_rotation = true;  // AdamW, with nesterov
  async.optimizer.rotation_every = 3;
  async.optimizer.rotation_max_dim = 256;
  async.optimizer.rotation_block = 64;
  // the keys of stages off the host (which take fp32, one replica): a third config
  Config device;
  device.pipeline.stages = 2;
  device.pipeline.device = "cuda";
  device.pipeline.device_ids = {1, 0};
  for (const auto& spec : internal::option_table()) {
    CHECK_MESSAGE((spec.get(c) != spec.get(defaults) || spec.get(async) != spec.get(defaults) ||
                   spec.get(device) != spec.get(defaults)),
                  spec.name() << " is not exercised");
  }
  REQUIRE_MESSAGE(validate(device).ok(), validate(device).error().message);
  auto rdev = config_from_string(to_toml(device));
  REQUIRE_MESSAGE(rdev.ok(), rdev.error().message);
  for (const auto& spec : internal::option_table())
    CHECK_MESSAGE(spec.get(*rdev) == spec.get(device), spec.name());
  REQUIRE_MESSAGE(validate(async).ok(), validate(async).error().message);
  auto ra = config_from_string(to_toml(async));
  REQUIRE_MESSAGE(ra.ok(), ra.error().message);
  for (const auto& spec : internal::option_table())
    CHECK_MESSAGE(spec.get(*ra) == spec.get(async), spec.name());
  REQUIRE_MESSAGE(validate(c).ok(), validate(c).error().message);
  const std::string text = to_toml(c);
  auto r = config_from_string(text);
  REQUIRE_MESSAGE(r.ok(), r.error().message << "\n" << text);
  for (const auto& spec : internal::option_table()) {
    CHECK_MESSAGE(spec.get(*r) == spec.get(c), spec.name());
  }
  CHECK(r->model.init_seed == 9007199254740993ull);
  CHECK(r->data.path == c.data.path);
  CHECK(r->optimizer.lr == 3e-4f);  // bitwise: the shortest form reads back to the same float
  CHECK(to_toml(*r) == text);
  // The defaults too, with partition written as "even".
  const std::string dt = to_toml(defaults);
  CHECK(contains(dt, "partition = \"even\"\n"));
  CHECK(contains(dt, "lr = 0.001\n"));
  CHECK(contains(dt, "grad_clip = 1.0\n"));
  auto rd = config_from_string(dt);
  REQUIRE(rd.ok());
  CHECK(to_toml(*rd) == dt);
  // And through a file.
  const fs::path p = fs::temp_directory_path() / ("ap_config_" + std::to_string(::getpid()));
  {
    std::ofstream out(p);
    out << text;
  }
  auto l = load_config(p.string());
  fs::remove(p);
  REQUIRE(l.ok());
  CHECK(to_toml(*l) == text);
}

TEST_CASE("--set overrides the file, later --set wins, values are TOML") {
  const std::string file = "[model]\nwidth = 64\n[pipeline]\nmode = \"gpipe\"\n";
  auto r = config_from_string(file, {"model.width=96", "model.width = 32"});
  REQUIRE(r.ok());
  CHECK(r->model.width == 32);
  CHECK(r->pipeline.mode == "gpipe");

  auto s = config_from_string(
      file, {"pipeline.mode=2bw", "pipeline.stages=2", "pipeline.microbatches=2",
             "pipeline.partition=[3,3]", "data.path=\"a b.txt\"", "data.kind=text",
             "model.tied=false", "optimizer.lr=3e-4", "model.arch=bert", "train.metrics=123",
             "train.trace='x.json'", "model.init_seed=12"});
  REQUIRE_MESSAGE(s.ok(), s.error().message);
  CHECK(s->pipeline.mode == "2bw");  // strings need no quotes
  CHECK(s->pipeline.partition.counts == std::vector<int>{3, 3});
  CHECK(s->data.path == "a b.txt");
  CHECK(s->model.tied == false);
  CHECK(s->optimizer.lr == 3e-4f);
  CHECK(s->model.arch == Arch::bert);
  CHECK(s->train.metrics == "123");  // a string key takes the text as it is
  CHECK(s->train.trace == "x.json");
  CHECK(s->model.init_seed == 12);

  auto e = config_from_string("[pipeline]\nstages = 2\npartition = [3, 3]\n",
                              {"pipeline.partition=even"});
  REQUIRE(e.ok());
  CHECK(e->pipeline.partition.even());

  // apply_set alone does not validate: heads = 5 with width 128 is refused only by validate.
  Config c;
  REQUIRE(apply_set(c, "model.heads=5").ok());
  CHECK(c.model.heads == 5);
  CHECK_FALSE(validate(c).ok());
}

TEST_CASE("collect_sets takes --set k=v and --set=k=v") {
  const char* argv[] = {"prog", "cfg.toml", "--set", "a.b=1", "--other", "--set=c.d=[1, 2]"};
  auto r = collect_sets(6, argv);
  REQUIRE(r.ok());
  CHECK(*r == std::vector<std::string>{"a.b=1", "c.d=[1, 2]"});
  const char* bad[] = {"prog", "--set"};
  auto b = collect_sets(2, bad);
  REQUIRE_FALSE(b.ok());
  CHECK(contains(b.error().message, "--set needs"));
}

TEST_CASE("a missing file or a TOML syntax error names the file and line") {
  auto m = load_config("/nonexistent/dir/run.toml");
  REQUIRE_FALSE(m.ok());
  CHECK(contains(m.error().message, "/nonexistent/dir/run.toml"));
  CHECK(contains(m.error().message, "No such file"));

  auto s = error_of("[model]\nwidth = 64\nheads = [1,\n");
  CHECK(contains(s, "<string>:4: TOML syntax error"));
  auto dup = error_of("[model]\nwidth = 64\nwidth = 32\n");
  CHECK(contains(dup, "TOML syntax error"));
  CHECK(contains(dup, "width"));

  const fs::path p = fs::temp_directory_path() / ("ap_bad_" + std::to_string(::getpid()) + ".toml");
  {
    std::ofstream out(p);
    out << "[train]\nsteps = = 3\n";
  }
  auto f = load_config(p.string());
  fs::remove(p);
  REQUIRE_FALSE(f.ok());
  CHECK(contains(f.error().message, p.string() + ":2: TOML syntax error"));
}

TEST_CASE("text that is not UTF-8 is refused naming the line and the byte") {
  // an invalid sequence in a literal string made toml11 read out of bounds reporting it
  CHECK(contains(error_of("[data]\npath = 'a\xff'\n"),
                 "<string>:2: not UTF-8: byte 0xff at offset 16 (TOML text is UTF-8)"));
  CHECK(contains(error_of("# caf\xe9\n[model]\nwidth = 64\n"), "<string>:1: not UTF-8: byte 0xe9"));
  // a --set value, quoted or not: it would be written back by to_toml as text that is not TOML
  CHECK(contains(error_of("", {"data.path=train.b\xf4in"}),
                 "--set data.path=train.b\xf4in: the value is not UTF-8: byte 0xf4 at offset 7"));
  CHECK(contains(error_of("", {"data.path='\xc0\x80'"}), "the value is not UTF-8: byte 0xc0"));
  // UTF-8 is taken as it is, and written back as it was
  auto c =
      config_from_string("[data]\npath = 'caf\xc3\xa9.txt'\n", {"train.metrics=m\xc3\xa9.jsonl"});
  REQUIRE_MESSAGE(c.ok(), c.error().message);
  CHECK(c->data.path == "caf\xc3\xa9.txt");
  auto back = config_from_string(to_toml(*c));
  REQUIRE_MESSAGE(back.ok(), back.error().message);
  CHECK(to_toml(*back) == to_toml(*c));
}

TEST_CASE("unknown sections and keys are refused with the closest known name") {
  auto s = error_of("[modle]\nwidth = 3\n");
  CHECK(contains(s, "<string>:1: unknown section [modle]"));
  CHECK(contains(s, "did you mean [model]?"));
  CHECK(contains(error_of("[clustre]\nbind = 2\n"),
                 "known: model, data, pipeline, optimizer, train, checkpoint, cluster"));

  auto k = error_of("[model]\nwidht = 3\n");
  CHECK(contains(k, "<string>:2: model.widht: unknown key; did you mean model.width?"));
  auto w = error_of("[model]\nlr = 0.1\n");
  CHECK(contains(w, "model.lr: unknown key; did you mean optimizer.lr?"));
  auto far = error_of("[train]\nzzzzzzzz = 1\n");
  CHECK(contains(far, "known keys of [train]: steps, seed, log_every, metrics, trace"));
  auto top = error_of("width = 3\n");
  CHECK(contains(top, "width = 3 is outside any section; did you mean model.width"));
  CHECK(contains(error_of("model = 3\n"), "model must be a section [model]"));

  CHECK(contains(error_of("", {"model.widht=3"}),
                 "--set model.widht=3: model.widht: unknown key; did you mean model.width?"));
  CHECK(contains(error_of("", {"modl.width=3"}), "did you mean [model]?"));
  CHECK(contains(error_of("", {"width=3"}),
                 "\"width\" is not section.key; did you mean model.width?"));
  CHECK(contains(error_of("", {"model.width"}), "expected section.key=value"));
}

TEST_CASE("wrong types are refused naming the key, the value and the expected type") {
  CHECK(contains(error_of("[model]\nwidth = \"big\"\n"),
                 "<string>:2: model.width = \"big\": expected an integer, got a string"));
  CHECK(contains(error_of("[model]\nwidth = 1.5\n"),
                 "model.width = 1.5: expected an integer, got a float"));
  CHECK(contains(error_of("[model]\ntied = 1\n"),
                 "model.tied = 1: expected true or false, got an integer"));
  CHECK(contains(error_of("[optimizer]\nlr = \"fast\"\n"),
                 "optimizer.lr = \"fast\": expected a number, got a string"));
  CHECK(contains(error_of("[optimizer]\nlr = inf\n"), "optimizer.lr = inf: not a finite"));
  CHECK(contains(error_of("[optimizer]\nlr = 1e40\n"), "not a finite 32-bit float"));
  CHECK(contains(error_of("[pipeline]\nmode = 2\n"),
                 "pipeline.mode = 2: expected a string, got an integer"));
  CHECK(contains(error_of("[pipeline]\npartition = [1, \"a\"]\n"),
                 "pipeline.partition = [1, \"a\"]: element \"a\" is not a 32-bit integer"));
  CHECK(contains(error_of("[pipeline]\npartition = \"uneven\"\n"),
                 "expected \"even\", \"auto\" or an array of integers"));
  CHECK(contains(error_of("[model]\nwidth = 3000000000\n"),
                 "model.width = 3000000000: out of the 32-bit integer range"));
  CHECK(contains(error_of("[model]\ninit_seed = -1\n"), "model.init_seed = -1: negative"));
  CHECK(contains(error_of("[model]\narch = \"llama\"\n"),
                 "model.arch = \"llama\": unknown architecture (allowed: gpt, bert)"));
  CHECK(contains(error_of("", {"model.width=abc"}),
                 "--set model.width=abc: abc is not a TOML value (expected integer"));
  CHECK(contains(error_of("", {"model.width=2.5"}),
                 "--set model.width=2.5: model.width = 2.5: expected an integer, got a float"));
}

TEST_CASE("out-of-range values and impossible combinations are refused") {
  auto check = [](const std::vector<std::string>& sets, const std::string& part) {
    auto r = config_from_string("", sets);
    REQUIRE_MESSAGE(!r.ok(), "accepted: " << sets.front());
    CHECK_MESSAGE(contains(r.error().message, part), r.error().message);
  };
  check({"model.heads=5"}, "model.heads = 5: must divide model.width = 128");
  check({"model.heads=0"}, "model.heads = 0: must be >= 1");
  check({"model.vocab_size=1"}, "model.vocab_size = 1: must be >= 2");
  check({"model.depth=0"}, "model.depth = 0: must be >= 1");
  check({"optimizer.lr=0"}, "optimizer.lr = 0: must be > 0");
  check({"optimizer.lr=-1e-3"}, "optimizer.lr = -0.001: must be > 0");
  check({"optimizer.beta1=1"}, "optimizer.beta1 = 1: must be in [0, 1)");
  check({"optimizer.eps=0"}, "optimizer.eps = 0: must be > 0");
  check({"optimizer.kind=adam"},
        "optimizer.kind = \"adam\": unknown optimizer (allowed: adamw, sgd)");
  check({"train.stop=later"}, "train.stop = \"later\": unknown choice (allowed: step, run)");
  check({"pipeline.mode=zb"},
        "pipeline.mode = \"zb\": unknown mode (allowed: gpipe, 1f1b, 2bw, pipedream, xpipe)");
  check({"pipeline.mode=2bw", "pipeline.stages=4", "pipeline.microbatches=3"},
        "pipeline.microbatches = 3: mode 2bw needs at least as many microbatches as "
        "pipeline.stages = 4");
  check({"model.depth=2", "pipeline.stages=5"},
        "pipeline.stages = 5: more stages than the model's 4 layers (model.depth + 2 = 2 + 2)");
  check({"pipeline.stages=2", "pipeline.partition=[6]"},
        "pipeline.partition = [6]: 1 entries but pipeline.stages = 2");
  check({"pipeline.stages=2", "pipeline.partition=[3,4]"},
        "pipeline.partition = [3, 4]: sums to 7 but the model has 6 layers (model.depth + 2 = 4 "
        "+ 2)");
  check({"pipeline.stages=2", "pipeline.partition=[6,0]"},
        "pipeline.partition = [6, 0]: every stage needs at least 1 layer");
  check({"pipeline.seq_len=129"}, "pipeline.seq_len = 129: exceeds model.context = 128");
  check({"pipeline.microbatches=0"}, "pipeline.microbatches = 0: must be >= 1");
  check({"pipeline.microbatches=65537"}, "pipeline.microbatches = 65537: at most 65536 per step");
  check({"pipeline.replicas=-1"}, "pipeline.replicas = -1: must be >= 0");
  check({"pipeline.replicas=3", "pipeline.microbatches=4"},
        "pipeline.replicas = 3: must divide pipeline.microbatches = 4");
  check(
      {"pipeline.mode=2bw", "pipeline.stages=2", "pipeline.microbatches=2", "pipeline.replicas=2"},
      "pipeline.replicas = 2: mode 2bw needs at least pipeline.stages = 2 microbatches per "
      "replica, and pipeline.microbatches = 2 gives 1");
  check({"pipeline.mode=xpipe", "pipeline.replicas=2"},
        "pipeline.replicas = 2: mode xpipe updates every stage after each microbatch");
  check({"pipeline.mode=pipedream", "pipeline.replicas=2"},
        "pipeline.replicas = 2: mode pipedream updates every stage");
  check({"data.kind=text"}, "data.path = \"\": data.kind = \"text\" needs a file path");
  check({"data.kind=tokens"}, "data.kind = \"tokens\" needs a file path");
  check({"data.kind=csv"},
        "data.kind = \"csv\": unknown data source (allowed: synthetic, text, tokens)");
  check({"data.mask_prob=0"}, "data.mask_prob = 0: must be in (0, 1]");
  check({"optimizer.warmup_steps=5", "optimizer.decay_steps=5"},
        "optimizer.decay_steps = 5: must be 0 (no decay) or greater than optimizer.warmup_steps "
        "(5)");
  check({"optimizer.decay_steps=-1"}, "optimizer.decay_steps = -1: must be 0 (no decay)");
  check({"optimizer.lr=1e-3", "optimizer.min_lr=0.01"},
        "optimizer.min_lr = 0.01: must be in [0, optimizer.lr = 0.001]");
  check({"optimizer.min_lr=-1e-4"}, "optimizer.min_lr = -0.0001: must be in [0");
  check({"optimizer.delay_correction=dcasgd"},
        "optimizer.delay_correction = \"dcasgd\": unknown correction (allowed: none, nesterov, "
        "dc, secant, dc+nesterov, secant+nesterov)");
  check({"optimizer.delay_correction=nesterov+secant"},
        "optimizer.delay_correction = \"nesterov+secant\": unknown correction");
  check({"pipeline.mode=xpipe", "optimizer.delay_correction=secant+nesterov"},
        "optimizer.delay_correction = \"secant+nesterov\": pipeline.mode = \"xpipe\" runs each "
        "backward on the weights its update changes");
  check({"pipeline.mode=2bw", "optimizer.delay_correction=secant", "optimizer.secant_decay=1"},
        "optimizer.secant_decay = 1: must be in [0, 1)");
  check({"pipeline.mode=2bw", "pipeline.device=cuda", "optimizer.delay_correction=secant"},
        "optimizer.delay_correction = \"secant\": computed by the CPU kernels only; with "
        "pipeline.device = \"cuda\" use none, nesterov or dc");
  check({"pipeline.mode=2bw", "pipeline.device=cuda", "optimizer.delay_correction=dc+nesterov"},
        "optimizer.delay_correction = \"dc+nesterov\": computed by the CPU kernels only");
  check({"pipeline.mode=1f1b", "optimizer.delay_correction=nesterov"},
        "optimizer.delay_correction = \"nesterov\": pipeline.mode = \"1f1b\" computes every "
        "gradient at the weights it updates");
  check({"pipeline.mode=gpipe", "optimizer.delay_correction=dc"},
        "optimizer.delay_correction = \"dc\": pipeline.mode = \"gpipe\" computes every");
  check({"pipeline.mode=xpipe", "optimizer.delay_correction=dc"},
        "optimizer.delay_correction = \"dc\": pipeline.mode = \"xpipe\" runs each backward on "
        "the weights its update changes");
  check({"optimizer.dc_lambda=-1"}, "optimizer.dc_lambda = -1: must be >= 0");
  check(
      {"pipeline.mode=2bw", "optimizer.delay_correction=nesterov", "optimizer.momentum_decay=-0.5"},
      "optimizer.momentum_decay = -0.5: must be >= 0");
  check({"pipeline.mode=2bw", "optimizer.delay_correction=dc", "optimizer.momentum_decay=0.004"},
        "optimizer.momentum_decay = 0.004: NAdam's momentum schedule applies to a delay "
        "correction with the look-ahead (nesterov, dc+nesterov, secant+nesterov) with the adamw "
        "optimizer (here delay_correction = \"dc\", optimizer.kind = \"adamw\")");
  check({"pipeline.mode=2bw", "optimizer.delay_correction=nesterov", "optimizer.kind=sgd",
         "optimizer.momentum_decay=0.004"},
        "optimizer.kind = \"sgd\")");
  check({"pipeline.precision=fp16"},
        "pipeline.precision = \"fp16\": unknown precision (allowed: fp32, bf16)");
  check({"pipeline.stash_precision=fp16"},
        "pipeline.stash_precision = \"fp16\": unknown precision (allowed: fp32, bf16)");
  check({"pipeline.mode=2bw", "pipeline.stash_precision=bf16"},
        "pipeline.stash_precision = \"bf16\" needs pipeline.precision = \"bf16\" (got \"fp32\")");
  check({"pipeline.mode=1f1b", "pipeline.precision=bf16", "pipeline.stash_precision=bf16"},
        "pipeline.stash_precision = \"bf16\": pipeline.mode = \"1f1b\" keeps no weight version "
        "besides the newest (2bw and pipedream do)");
  check({"pipeline.mode=pipedream", "pipeline.precision=bf16", "pipeline.stash_precision=bf16",
         "optimizer.delay_correction=dc"},
        "pipeline.stash_precision = \"bf16\": optimizer.delay_correction = \"dc\" computes Δ");
  check({"pipeline.mode=2bw", "pipeline.precision=bf16", "pipeline.stash_precision=bf16",
         "optimizer.delay_correction=secant+nesterov"},
        "pipeline.stash_precision = \"bf16\": optimizer.delay_correction = \"secant+nesterov\" "
        "computes Δ");
  check({"pipeline.device=tpu"},
        "pipeline.device = \"tpu\": unknown device (allowed: cpu, cuda, checked)");
  check({"pipeline.device=checked", "pipeline.mode=2bw", "pipeline.precision=bf16",
         "pipeline.stash_precision=bf16"},
        "pipeline.device = \"checked\": pipeline.stash_precision = \"bf16\" keeps the stashed "
        "weights in host memory; only fp32 off the cpu");
  check({"pipeline.device=cuda", "pipeline.stages=2", "pipeline.device_ids=[0]"},
        "pipeline.device_ids = [0]: 1 entries but pipeline.stages = 2");
  check({"pipeline.device=cuda", "pipeline.device_ids=[-1]"},
        "pipeline.device_ids = [-1]: GPU indices must be >= 0");
  check({"pipeline.device_ids=[0]"},
        "pipeline.device_ids = [0]: only with pipeline.device = \"cuda\" (here \"cpu\")");
  check({"optimizer.basis_rotation=true", "optimizer.kind=sgd"},
        "optimizer.basis_rotation = true: rotates AdamW's second moment; optimizer.kind = "
        "\"sgd\" keeps none");
  check({"optimizer.basis_rotation=true", "pipeline.mode=2bw", "optimizer.delay_correction=dc"},
        "optimizer.basis_rotation = true: not with optimizer.delay_correction = \"dc\" (its "
        "compensation acts element by element in the coordinates); use none or nesterov");
  check({"optimizer.basis_rotation=true", "pipeline.mode=pipedream",
         "optimizer.delay_correction=secant+nesterov"},
        "optimizer.basis_rotation = true: not with optimizer.delay_correction = "
        "\"secant+nesterov\"");
  check({"optimizer.basis_rotation=true", "pipeline.device=cuda"},
        "optimizer.basis_rotation = true: computed by the CPU kernels only (here pipeline.device "
        "= \"cuda\")");
  check({"optimizer.basis_rotation=true", "pipeline.device=checked"},
        "optimizer.basis_rotation = true: computed by the CPU kernels only (here pipeline.device "
        "= \"checked\")");
  check({"optimizer.rotation_every=0"}, "optimizer.rotation_every = 0: must be >= 1");
  check({"optimizer.rotation_max_dim=-3"}, "optimizer.rotation_max_dim = -3: must be >= 1");
  check({"optimizer.rotation_block=-1"},
        "optimizer.rotation_block = -1: must be >= 0 (0: each side whole)");
  check({"train.steps=0"}, "train.steps = 0: must be >= 1");
  check({"checkpoint.every=5"}, "checkpoint.every = 5: periodic checkpoints need checkpoint.dir");
  // The same combinations are fine when they are consistent.
  CHECK(config_from_string("", {"pipeline.mode=pipedream", "optimizer.delay_correction=nesterov",
                                "optimizer.momentum_decay=0.004"})
            .ok());
  CHECK(config_from_string("", {"pipeline.mode=2bw", "optimizer.delay_correction=secant+nesterov",
                                "optimizer.momentum_decay=0.004", "optimizer.secant_decay=0"})
            .ok());
  CHECK(config_from_string(
            "", {"pipeline.mode=2bw", "pipeline.device=cuda", "optimizer.delay_correction=dc"})
            .ok());
  CHECK(config_from_string("", {"pipeline.mode=gpipe", "optimizer.basis_rotation=true"}).ok());
  CHECK(config_from_string("", {"pipeline.mode=xpipe", "optimizer.basis_rotation=true",
                                "optimizer.delay_correction=nesterov"})
            .ok());
  CHECK(
      config_from_string("", {"pipeline.mode=2bw", "pipeline.stages=4", "pipeline.microbatches=4"})
          .ok());
  CHECK(config_from_string("", {"pipeline.stages=6", "pipeline.partition=[1,1,1,1,1,1]"}).ok());
  CHECK(
      config_from_string("", {"pipeline.mode=xpipe", "optimizer.delay_correction=nesterov"}).ok());
  CHECK(config_from_string("", {"pipeline.mode=pipedream", "pipeline.microbatches=1",
                                "optimizer.delay_correction=dc", "optimizer.kind=sgd"})
            .ok());
  CHECK(config_from_string("", {"data.kind=text", "data.path=x.txt"}).ok());
  CHECK(config_from_string("", {"checkpoint.every=5", "checkpoint.dir=c"}).ok());
  CHECK(config_from_string(
            "", {"optimizer.warmup_steps=5", "optimizer.decay_steps=6", "optimizer.min_lr=1e-3"})
            .ok());
}

TEST_CASE("pipeline.partition = \"auto\" and pipeline.memory_limit_mb parse, print and fail") {
  // "auto" in a file and from --set, with or without quotes; it is not "even" and has no counts
  auto f =
      config_from_string("[pipeline]\nstages = 2\npartition = \"auto\"\nmemory_limit_mb = 12\n");
  REQUIRE_MESSAGE(f.ok(), f.error().message);
  CHECK(f->pipeline.partition.automatic);
  CHECK(f->pipeline.partition.counts.empty());
  CHECK_FALSE(f->pipeline.partition.even());
  CHECK(f->pipeline.memory_limit_mb == 12);
  for (const char* set : {"pipeline.partition=auto", "pipeline.partition=\"auto\""}) {
    auto s = config_from_string("", {"pipeline.stages=3", set});
    REQUIRE_MESSAGE(s.ok(), s.error().message);
    CHECK(s->pipeline.partition.automatic);
  }
  // to_toml writes it back as "auto"; a later --set of counts or "even" replaces it
  CHECK(contains(to_toml(*f), "partition = \"auto\"\n"));
  CHECK(contains(to_toml(*f), "memory_limit_mb = 12\n"));
  auto back = config_from_string(to_toml(*f));
  REQUIRE(back.ok());
  CHECK(back->pipeline.partition == f->pipeline.partition);
  auto counts = config_from_string(to_toml(*f), {"pipeline.partition=[3,3]"});
  REQUIRE(counts.ok());
  CHECK_FALSE(counts->pipeline.partition.automatic);
  CHECK(counts->pipeline.partition.counts == std::vector<int>{3, 3});
  auto even = config_from_string(to_toml(*f), {"pipeline.partition=even"});
  REQUIRE(even.ok());
  CHECK(even->pipeline.partition.even());
  // errors name the key and the value
  CHECK(contains(error_of("[pipeline]\npartition = \"automatic\"\n"),
                 "pipeline.partition = \"automatic\": expected \"even\", \"auto\" or an array"));
  CHECK(contains(error_of("", {"pipeline.memory_limit_mb=-1"}),
                 "pipeline.memory_limit_mb = -1: must be >= 0 (MiB per stage; 0 = no limit)"));
  CHECK(contains(error_of("", {"pipeline.memory_limit_mb=1.5"}),
                 "pipeline.memory_limit_mb = 1.5: expected an integer, got a float"));
  CHECK(contains(error_of("", {"pipeline.memory_limit_mb=big"}),
                 "--set pipeline.memory_limit_mb=big: big is not a TOML value"));
}

TEST_CASE("every problem is reported, one per line, with its location") {
  auto m = error_of("[model]\nwidht = 3\n\n[optimizer]\nlr = \"x\"\n", {"model.depth=x"});
  CHECK(contains(m, "<string>:2: model.widht: unknown key"));
  CHECK(contains(m, "\n<string>:5: optimizer.lr = \"x\""));
  CHECK(contains(m, "\n--set model.depth=x: x is not a TOML value"));
  CHECK(std::count(m.begin(), m.end(), '\n') == 2);
  auto v = error_of("", {"model.heads=5", "optimizer.lr=0", "train.steps=0"});
  CHECK(std::count(v.begin(), v.end(), '\n') == 2);
}

TEST_CASE("every key of options.hpp is parsed and documented in docs/config.md") {
  const std::string root = source_dir();
  const std::vector<std::string> keys = config_keys();
  // 1. Every member of every options struct has a key (so the parser cannot miss a field).
  const std::string options = slurp(root + "/engine/options.hpp");
  const std::vector<std::pair<std::string, std::string>> structs = {
      {"ModelOptions", "model"},       {"DataOptions", "data"},
      {"PipelineOptions", "pipeline"}, {"OptimizerOptions", "optimizer"},
      {"TrainOptions", "train"},       {"CheckpointOptions", "checkpoint"},
      {"ClusterOptions", "cluster"},   {"MigrationOptions", "migration"},
      {"EvalOptions", "eval"}};
  std::size_t members = 0;
  for (const auto& [name, section] : structs) {
    const auto begin = options.find("struct " + name + " {");
    REQUIRE_MESSAGE(begin != std::string::npos, name << " not found in options.hpp");
    const auto end = options.find("\n};", begin);
    const std::string body = options.substr(begin, end - begin);
    for (const std::string& field : member_names(body)) {
      const std::string key = section + "." + field;
      CHECK_MESSAGE(std::find(keys.begin(), keys.end(), key) != keys.end(),
                    key << " is in options.hpp but the config parser does not know it");
      ++members;
    }
  }
  CHECK(members == keys.size());

  // 2. docs/config.md carries the generated reference verbatim (type, default, allowed values
  // and meaning of every key). ACTORPIPE_UPDATE_DOCS=1 rewrites it.
  const std::string path = root + "/docs/config.md";
  std::string doc = slurp(path);
  const std::string begin_marker = "<!-- BEGIN GENERATED: config_reference_markdown() -->\n";
  const std::string end_marker = "<!-- END GENERATED -->";
  const auto b = doc.find(begin_marker);
  const auto e = doc.find(end_marker);
  REQUIRE_MESSAGE((b != std::string::npos && e != std::string::npos && b < e),
                  path << " lacks the generated-reference markers");
  const std::string generated = config_reference_markdown();
  const std::string current = doc.substr(b + begin_marker.size(), e - b - begin_marker.size());
  if (current != generated && std::getenv("ACTORPIPE_UPDATE_DOCS")) {
    doc.replace(b + begin_marker.size(), current.size(), generated);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << doc;
    MESSAGE("rewrote the reference in " << path);
  } else {
    CHECK_MESSAGE(current == generated,
                  path << " is out of date; rerun this test with ACTORPIPE_UPDATE_DOCS=1");
  }
  for (const auto& key : keys) {
    CHECK_MESSAGE(contains(doc, "`" + key + "`"), key << " is not documented in " << path);
  }
}

TEST_CASE("cluster keys: placement per stage, addresses and timeouts are checked") {
  auto e = error_of("[pipeline]\nstages = 2\n[cluster]\nplacement = [0, 1, 1]\n");
  CHECK(contains(e, "cluster.placement = [0, 1, 1]: 3 entries but pipeline.stages = 2"));
  CHECK(contains(error_of("[pipeline]\nstages = 2\n[cluster]\nplacement = [0, -1]\n"),
                 "cluster.placement = [0, -1]: ranks must be >= 0"));
  CHECK(contains(error_of("[cluster]\nconnect_timeout = 0\n"),
                 "cluster.connect_timeout = 0: must be > 0"));
  CHECK(contains(error_of("[cluster]\npeer_timeout = -1.5\n"),
                 "cluster.peer_timeout = -1.5: must be > 0"));
  CHECK(contains(error_of("[cluster]\nbind = \"\"\n"), "cluster.bind = \"\""));
  CHECK(contains(error_of("[cluster]\ngpu_channel = \"mpi\"\n"),
                 "cluster.gpu_channel = \"mpi\": allowed \"nccl\" or \"ucx\""));
  CHECK(contains(error_of("[cluster]\ntls_key = \"k.pem\"\n"),
                 "TLS needs all three files (or none for plain TCP)"));
  auto ok = config_from_string("[pipeline]\nstages = 3\n[cluster]\nplacement = [0, 0, 1]\n");
  REQUIRE(ok.ok());
  CHECK(ok->cluster.placement == std::vector<int>{0, 0, 1});
  CHECK(ok->cluster.gpu_channel == "nccl");
}

TEST_CASE("pipeline.recompute: none, all, auto or distinct layers in range") {
  auto parsed = [](const std::string& text, const std::vector<std::string>& sets = {}) {
    auto c = config_from_string(text, sets);
    REQUIRE_MESSAGE(c.ok(), (c.ok() ? "" : c.error().message));
    return c->pipeline.recompute;
  };
  using K = RecomputeSpec::Kind;
  CHECK(parsed("").kind == K::none);
  CHECK(parsed("[pipeline]\nrecompute = \"all\"\n").kind == K::all);
  CHECK(parsed("[pipeline]\nrecompute = \"auto\"\n").kind == K::automatic);
  CHECK(parsed("[pipeline]\nrecompute = \"none\"\n").kind == K::none);
  const RecomputeSpec listed = parsed("[pipeline]\nrecompute = [5, 0, 2]\n");
  CHECK(listed.kind == K::layers);
  CHECK(listed.layers == std::vector<int>{5, 0, 2});
  CHECK(parsed("", {"pipeline.recompute=all"}).kind == K::all);
  CHECK(parsed("", {"pipeline.recompute=\"auto\""}).kind == K::automatic);
  CHECK(parsed("", {"pipeline.recompute=[1,2]"}).layers == std::vector<int>{1, 2});
  CHECK(parsed("[pipeline]\nrecompute = \"all\"\n", {"pipeline.recompute=none"}).kind == K::none);
  // to_toml writes what was read
  Config c;
  c.pipeline.recompute = {K::automatic, {}};
  CHECK(contains(to_toml(c), "recompute = \"auto\"\n"));
  c.pipeline.recompute = {K::layers, {4, 1}};
  CHECK(contains(to_toml(c), "recompute = [4, 1]\n"));
  CHECK(contains(to_toml(Config{}), "recompute = \"none\"\n"));
  // errors name the key and the bad value
  CHECK(contains(error_of("[pipeline]\nrecompute = \"some\"\n"),
                 "pipeline.recompute = \"some\": expected \"none\", \"all\", \"auto\" or an "
                 "array of layer indices"));
  CHECK(contains(error_of("[pipeline]\nrecompute = true\n"),
                 "pipeline.recompute = true: expected \"none\", \"all\", \"auto\" or an array "
                 "of layer indices, got a boolean"));
  CHECK(contains(error_of("[pipeline]\nrecompute = [1, \"a\"]\n"),
                 "pipeline.recompute = [1, \"a\"]: element \"a\" is not a 32-bit integer"));
  CHECK(contains(error_of("", {"pipeline.recompute=sometimes"}),
                 "--set pipeline.recompute=sometimes: pipeline.recompute = \"sometimes\": "
                 "expected"));
  // the default model has 6 layers: 0 .. 5
  CHECK(contains(error_of("[pipeline]\nrecompute = [1, 6]\n"),
                 "pipeline.recompute = [1, 6]: layer 6 is outside the model's layers 0 .. 5 "
                 "(model.depth + 2 = 6 layers)"));
  CHECK(contains(error_of("[pipeline]\nrecompute = [-1]\n"),
                 "pipeline.recompute = [-1]: layer -1 is outside the model's layers 0 .. 5"));
  CHECK(contains(error_of("[pipeline]\nrecompute = [2, 3, 2]\n"),
                 "pipeline.recompute = [2, 3, 2]: layer 2 is listed twice"));
  CHECK(config_from_string("[model]\ndepth = 6\n[pipeline]\nrecompute = [7, 6]\n").ok());
}
