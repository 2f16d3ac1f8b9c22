// SerialExecutor: runs any validated schedule over d StageWorkers in one thread, in a fixed
// round-robin order; the readable reference that every parallel execution must match bitwise.
#include "engine/execution/serial_executor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <map>
#include <numeric>

#include "engine/data/loader.hpp"
#include "engine/execution/compute_precision.hpp"
#include "engine/execution/layer_optimizer.hpp"
#include "engine/execution/memory_check.hpp"
#include "engine/execution/nonfinite.hpp"
#include "engine/execution/tied_params.hpp"
#include "engine/schedule/generators.hpp"
#include "engine/schedule/lowering.hpp"
#include "engine/schedule/validate.hpp"
#include "kernels/check.hpp"
#include "kernels/compute_backend.hpp"
#include "kernels/optimizer.hpp"

namespace actorpipe {

namespace {

Tensor take(std::map<int, Tensor>& box, int microbatch) {
  auto it = box.find(microbatch);
  AP_CHECK(it != box.end(), "microbatch {} has not arrived", microbatch);
  Tensor t = std::move(it->second);
  box.erase(it);
  return t;
}

// The tied gradient of an update: owner's contribution + copy's, element-wise, in that order
// (as reduce_tied_grads).
void sum_tied(std::span<const float> owner, std::span<const float> copy, std::vector<float>& out) {
  AP_CHECK(owner.size() == copy.size(), "tied sides of {} and {} floats", owner.size(),
           copy.size());
  out.resize(owner.size());
  for (size_t i = 0; i < owner.size(); ++i) out[i] = owner[i] + copy[i];
}

// Stage r's worker options in an executor of `o` (its threads validated).
StageWorkerOptions stage_options(const SerialExecutorOptions& o, int r) {
  const size_t k = static_cast<size_t>(r);
  StageWorkerOptions w;
  w.mode = o.mode;
  w.stage = r;
  w.microbatches = o.microbatches;
  w.replicas = o.replicas;
  w.B = o.B;
  w.T = o.T;
  w.threads = o.threads.empty() ? 1 : o.threads[k];
  w.precision = o.precision;
  w.bf16_weight_copies = o.bf16_weight_copies;
  w.bf16_stash = o.bf16_stash;
  w.bf16_activations = o.bf16_activations;
  w.log_versions = o.log_versions;
  w.recompute = o.recompute;
  w.backend = o.backends.empty() ? nullptr : o.backends[k];
  return w;
}

}  // namespace

// The state of one run_schedule: what is on the links, who reached which barrier, the tied
// parameters' contributions and published versions.
struct SerialExecutor::Run {
  struct Update {
    std::vector<bool> arrived;     // per stage: reached this OPT_STEP
    std::vector<UpdateJob*> jobs;  // per stage: its update, begun when it arrived
    int executed = 0;              // stages that ran it
    bool collective_done = false;
    float global_scale = 1.0f;
    bool skip = false;  // a non-finite gradient, skip_nonfinite: dropped on every stage
    std::vector<std::vector<float>> contribution;  // per tied k: the copy stage's gradient
    std::vector<bool> has_contribution;
    std::vector<std::vector<float>> sum;  // per tied k: the summed gradient (follow_owner)
  };

  const Schedule& schedule;
  std::span<const Microbatch> batches;
  int d;
  std::vector<size_t> pc;  // next action per stage
  // tensors on their way to stage r: produced (awaiting SEND), on the link (awaiting RECV),
  // received (awaiting F / B)
  std::vector<std::map<int, Tensor>> f_out, f_link, f_in, b_out, b_link, b_in;
  std::vector<double> mb_loss;
  std::map<int, Update> updates;      // by the OPT_STEP's (schedule) version
  std::vector<int> flushes_done;      // per stage
  std::map<int, int> flush_arrivals;  // k-th flush -> stages that reached it
  // per tied k: the owner's published values (its versions; xpipe: its predictions too)
  std::vector<std::map<TiedVersion, std::vector<float>>> published;

  Run(const Schedule& s, std::span<const Microbatch> b, size_t tied)
      : schedule(s),
        batches(b),
        d(s.stages),
        pc(static_cast<size_t>(s.stages), 0),
        f_out(pc.size()),
        f_link(pc.size()),
        f_in(pc.size()),
        b_out(pc.size()),
        b_link(pc.size()),
        b_in(pc.size()),
        mb_loss(static_cast<size_t>(s.total_microbatches()), 0.0),
        flushes_done(pc.size(), 0),
        published(tied) {}

  Update& update(int version, size_t tied) {
    Update& u = updates[version];
    if (u.arrived.empty()) {
      u.arrived.assign(static_cast<size_t>(d), false);
      u.jobs.assign(static_cast<size_t>(d), nullptr);
      u.contribution.resize(tied);
      u.has_contribution.assign(tied, false);
      u.sum.resize(tied);
    }
    return u;
  }
};

SerialExecutor::SerialExecutor(const Model& model, const Partition& partition,
                               const OptimizerOptions& optimizer,
                               const SerialExecutorOptions& options)
    : model_(model), partition_(partition), opt_(optimizer), opts_(options) {
  for (int r = 0; r < partition.stages(); ++r) {
    const StageWorkerOptions w = stage_options(options, r);
    workers_.push_back(std::make_unique<StageWorker>(model, partition, optimizer, w));
    shards_.push_back(std::make_unique<OptimizerShard>(model, partition, r, optimizer,
                                                       workers_.back()->memory()));
    workers_.back()->predict_from(*shards_.back());
  }
}

Expected<std::unique_ptr<SerialExecutor>> SerialExecutor::create(const Model& model,
                                                                 const Partition& partition,
                                                                 const OptimizerOptions& optimizer,
                                                                 const SerialExecutorOptions& o) {
  if (partition.num_layers() != model.num_layers()) {
    return make_error("partition {} covers {} layers but the model has {}", partition.to_string(),
                      partition.num_layers(), model.num_layers());
  }
  if (o.microbatches < 1) return make_error("microbatches = {}: must be >= 1", o.microbatches);
  if (o.replicas < 1) return make_error("replicas = {}: must be >= 1", o.replicas);
  if (o.replicas > 1 && o.reducer == nullptr)
    return make_error("replicas = {}: a replica needs a GradientReducer", o.replicas);
  if (o.reducer != nullptr && o.reducer->replicas() != o.replicas) {
    return make_error("replicas = {} but the reducer sums over {}", o.replicas,
                      o.reducer->replicas());
  }
  if (o.B < 1) return make_error("microbatch_size = {}: must be >= 1", o.B);
  if (Status ok = check_tied_placement(model, partition, o.mode); !ok) return ok.error();
  if (o.T < 1 || o.T > model.options().context) {
    return make_error("seq_len = {}: must be in [1, model.context = {}]", o.T,
                      model.options().context);
  }
  if (!o.threads.empty() && static_cast<int>(o.threads.size()) != partition.stages()) {
    return make_error("threads: {} entries for {} stages", o.threads.size(), partition.stages());
  }
  for (int t : o.threads)
    if (t < 1) return make_error("threads = {}: every stage needs at least 1", t);
  // the CPU kernels' bf16 needs the CPU's bf16 instructions (a GPU stage's products do not)
  const bool cpu_kernels =
      o.backends.empty() || std::any_of(o.backends.begin(), o.backends.end(), [](auto* b) {
        return b == nullptr || b->device() == Device::cpu;
      });
  if (auto p = resolve_precision(to_string(o.precision), cpu_kernels); !p) return p.error();
  if (o.bf16_stash &&
      (o.precision != Precision::bf16 || !o.bf16_weight_copies ||
       (o.mode != Mode::twobw && o.mode != Mode::pipedream) || needs_weight_change(optimizer))) {
    return make_error(
        "a bf16 stash needs bf16 products with weight copies, 2bw or pipedream, and no dc or "
        "secant correction (precision {}, mode {}, optimizer.delay_correction {})",
        to_string(o.precision), to_string(o.mode), optimizer.delay_correction);
  }
  if (!o.backends.empty() && static_cast<int>(o.backends.size()) != partition.stages()) {
    return make_error("backends: {} entries for {} stages", o.backends.size(), partition.stages());
  }
  for (size_t r = 0; r < o.backends.size(); ++r) {
    const Status ok = check_stage_backend(stage_options(o, static_cast<int>(r)));
    if (!ok) return ok.error();
  }
  if (!o.recompute.empty() && static_cast<int>(o.recompute.size()) != model.num_layers()) {
    return make_error("recompute: {} flags for a model of {} layers", o.recompute.size(),
                      model.num_layers());
  }
  if (optimizer.kind != "adamw" && optimizer.kind != "sgd") {
    return make_error("optimizer.kind = \"{}\": expected adamw | sgd", optimizer.kind);
  }
  // the mode's constraints on d and m (2bw: m >= d)
  if (auto s = make_schedule(o.mode, partition.stages(), o.microbatches, 1); !s) return s.error();
  return std::unique_ptr<SerialExecutor>(new SerialExecutor(model, partition, optimizer, o));
}

Expected<std::unique_ptr<SerialExecutor>> SerialExecutor::create(const Config& config,
                                                                 bool log_versions,
                                                                 const Model* own_model,
                                                                 GradientReducer* reducer) {
  auto model = own_model != nullptr ? Expected<Model>(*own_model) : Model::build(config.model);
  if (!model) return model.error();
  auto partition = Partition::from_options(config.pipeline, model->num_layers());
  if (!partition) return partition.error();
  auto mode = parse_mode(config.pipeline.mode);
  if (!mode) return make_error("pipeline.mode: {}", mode.error().message);
  SerialExecutorOptions o;
  o.mode = *mode;
  o.replicas = config.pipeline.replicas;
  if (o.replicas == 0) {
    return make_error(
        "pipeline.replicas = 0: the planner's choice must be made first (Trainer::create does: "
        "plan_job)");
  }
  if (o.replicas < 1 || config.pipeline.microbatches % o.replicas != 0) {
    return make_error("pipeline.replicas = {}: must divide pipeline.microbatches = {}", o.replicas,
                      config.pipeline.microbatches);
  }
  o.microbatches = config.pipeline.microbatches / o.replicas;
  o.reducer = reducer;
  o.B = config.pipeline.microbatch_size;
  o.T = config.pipeline.seq_len > 0 ? config.pipeline.seq_len : config.model.context;
  auto devices = StageDevices::open(config.pipeline, partition->stages());
  if (!devices) return devices.error();
  o.backends = devices->backends();
  // the host's RAM holds the stages on the CPU, a GPU's memory the stages on it
  std::vector<int> all(static_cast<size_t>(partition->stages()));
  std::iota(all.begin(), all.end(), 0);
  if (Status ok = check_stages_fit(
          *model, *partition, *mode, config.optimizer.kind, all,
          std::vector<BackendMemory*>(o.backends.begin(), o.backends.end()), o.B, o.T,
          parse_precision(config.pipeline.precision).value_or(Precision::fp32),
          config.pipeline.stash_precision == "bf16");
      !ok)
    return ok.error();
  o.threads.assign(static_cast<size_t>(partition->stages()), config.pipeline.threads_per_stage);
  // bf16 with the CPU kernels needs the CPU's bf16 instructions; a GPU's products do not
  auto precision = resolve_precision(config.pipeline.precision, devices->cpu_kernels());
  if (!precision) return precision.error();
  o.precision = *precision;
  o.bf16_stash = config.pipeline.stash_precision == "bf16";
  o.log_versions = log_versions;
  o.skip_nonfinite = config.train.nonfinite == "skip";
  auto recompute = recompute_flags(config.pipeline.recompute, model->num_layers());
  if (!recompute) return recompute.error();
  o.recompute = std::move(*recompute);
  auto exec = create(*model, *partition, config.optimizer, o);
  if (!exec) return exec.error();
  (*exec)->devices_ = std::make_unique<StageDevices>(std::move(*devices));
  return exec;
}

Expected<EvalResult> SerialExecutor::evaluate(std::span<const Microbatch> batches) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<double> losses;
  for (const Microbatch& mb : batches) {
    if (mb.B != opts_.B || mb.T != opts_.T) {
      return make_error("evaluation: microbatch {} of shape ({}, {}), the pipeline takes ({}, {})",
                        mb.index, mb.B, mb.T, opts_.B, opts_.T);
    }
    Tensor x;
    LossStats loss;
    for (int r = 0; r < stages(); ++r) {
      ForwardOutput out = worker(r).evaluate(mb, x);
      x = std::move(out.out);
      loss = out.loss;
    }
    if (!std::isfinite(loss.sum)) {
      return make_error("evaluation: non-finite loss {} over {} targets at held-out microbatch {}",
                        loss.sum, loss.count, mb.index);
    }
    losses.push_back(loss.mean());
  }
  EvalResult r = combine_eval_losses(losses, int64_t{opts_.B} * opts_.T);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

int64_t SerialExecutor::microbatches_for(int steps) const {
  return static_cast<int64_t>(steps) * (opts_.mode == Mode::pipedream ? 1 : opts_.microbatches);
}

Expected<std::vector<Schedule>> SerialExecutor::schedules_for(int steps) const {
  if (steps < 1) return make_error("steps = {}: must be >= 1", steps);
  const int d = stages(), m = opts_.microbatches;
  std::vector<Schedule> out;
  const bool sync = is_synchronous(opts_.mode);
  for (int i = 0; i < (sync ? steps : 1); ++i) {
    const bool continued =
        opts_.mode == Mode::twobw && std::all_of(workers_.begin(), workers_.end(),
                                                 [](const auto& w) { return w->holds_previous(); });
    auto s = opts_.mode == Mode::pipedream ? make_pipedream(d, steps)
             : continued                   ? make_2bw(d, m, steps, true)
                                           : make_schedule(opts_.mode, d, m, sync ? 1 : steps);
    if (!s) return s.error();
    if (opts_.lowered) {
      auto l = lower(*s);
      if (!l) return l.error();
      out.push_back(std::move(*l));
    } else {
      out.push_back(std::move(*s));
    }
  }
  return out;
}

Expected<std::vector<double>> SerialExecutor::run(int steps, std::span<const Microbatch> batches,
                                                  const StepDone& on_step, const StopFlag* stop) {
  auto schedules = schedules_for(steps);
  if (!schedules) return schedules.error();
  if (static_cast<int64_t>(batches.size()) != microbatches_for(steps)) {
    return make_error("{} steps of {} read {} microbatches, got {}", steps, to_string(opts_.mode),
                      microbatches_for(steps), batches.size());
  }
  std::vector<double> losses;
  size_t offset = 0;
  for (const Schedule& s : *schedules) {
    const size_t n = static_cast<size_t>(s.total_microbatches());
    const int before = static_cast<int>(losses.size());
    StepDone numbered;
    if (on_step) numbered = [&](int step, double loss) { on_step(before + step, loss); };
    auto l = run_schedule(s, batches.subspan(offset, n), numbered, stop);
    if (!l) return l.error();
    const bool cut = static_cast<int>(l->size()) < s.steps;
    losses.insert(losses.end(), l->begin(), l->end());
    offset += n;
    if (cut) break;
  }
  return losses;
}

namespace {

// The next n microbatches of `data`; a source's failure (named by the DataLoader) is an error.
Expected<std::vector<Microbatch>> read_batches(DataLoader& data, int64_t n) {
  std::vector<Microbatch> batches;
  try {
    for (int64_t i = 0; i < n; ++i) batches.push_back(data.next());
  } catch (const std::exception& e) {
    return make_error("{}", e.what());
  }
  return batches;
}

}  // namespace

Expected<std::vector<double>> SerialExecutor::run(int steps, DataLoader& data,
                                                  const StepDone& on_step, const StopFlag* stop) {
  if (steps < 1) return make_error("steps = {}: must be >= 1", steps);
  const uint64_t start = data.position();
  auto batches = read_batches(data, microbatches_for(steps));
  if (!batches) return batches.error();
  auto losses = run(steps, *batches, on_step, stop);
  // a stopped run consumed the microbatches of the steps it ran
  if (losses && static_cast<int>(losses->size()) < steps)
    data.seek(start + static_cast<uint64_t>(microbatches_for(static_cast<int>(losses->size()))));
  return losses;
}

Expected<EvalResult> SerialExecutor::evaluate(DataLoader& data, int microbatches) {
  auto batches = read_batches(data, microbatches);
  if (!batches) return batches.error();
  return evaluate(*batches);
}

Expected<std::vector<double>> SerialExecutor::run_schedule(const Schedule& s,
                                                           std::span<const Microbatch> batches,
                                                           const StepDone& on_step,
                                                           const StopFlag* stop) {
  if (Status st = validate(s); !st) return st.error();
  if (s.mode != opts_.mode || s.stages != stages()) {
    return make_error("a {} schedule of {} stages given to a {} executor of {} stages",
                      to_string(s.mode), s.stages, to_string(opts_.mode), stages());
  }
  if (static_cast<int>(batches.size()) != s.total_microbatches()) {
    return make_error("the schedule runs {} microbatches, got {}", s.total_microbatches(),
                      batches.size());
  }
  for (auto& w : workers_) {
    if (Status st = w->start_run(s, mb_done_); !st) return st.error();
  }
  const size_t ntied = model_.tied().size();
  const int d = stages();
  const bool global = clips_globally(opts_.mode);
  const TiedSync sync = tied_sync(opts_.mode);
  AP_CHECK(global || sync == TiedSync::follow_owner,
           "{}: per-stage clipping with tied gradients exchanged", to_string(opts_.mode));
  const bool lowered = is_lowered(s);
  Run run(s, batches, ntied);
  // the loss of step u (1-based): (1/m)·Σ meanⱼ over its microbatches in order; known once
  // every stage ran the step's update (the last stage's comes after the step's last forward)
  const int per = s.microbatches;
  auto step_loss = [&](int u) {
    double sum = 0.0;
    for (int j = (u - 1) * per; j < u * per; ++j) sum += run.mb_loss[static_cast<size_t>(j)];
    return sum / per;
  };

  auto cross = [&](size_t k, int r, TiedRole role) {
    return workers_[static_cast<size_t>(r)]->tied_role(k) == role;
  };
  auto stage_of_role = [&](size_t k, TiedRole role) {
    const TiedParam& tp = model_.tied()[k];
    return partition_.stage_of(role == TiedRole::owner ? tp.owner_layer : tp.copy_layer);
  };

  Status failure;  // the first error of an action: the run stops after it
  // Whether stage r's next action can run now (and the side effects of reaching a barrier).
  // host copies of tied values that lie in a stage's memory off the host (host_view)
  std::vector<float> staged[2];
  auto ready = [&](int r, const Action& a) -> bool {
    StageWorker& w = *workers_[static_cast<size_t>(r)];
    switch (a.kind) {
      case ActionKind::F: {
        if (r > 0 && !run.f_in[static_cast<size_t>(r)].contains(a.microbatch)) return false;
        for (size_t k = 0; k < ntied; ++k) {
          const TiedVersion need = w.tied_version_needed(a, k);
          if (need.valid() && !run.published[k].contains(need)) return false;
        }
        return true;
      }
      case ActionKind::B:
        return r == d - 1 || run.b_in[static_cast<size_t>(r)].contains(a.microbatch);
      case ActionKind::SEND_F:
      case ActionKind::SEND_B:
        return true;
      case ActionKind::RECV_F:
        return run.f_link[static_cast<size_t>(r)].contains(a.microbatch);
      case ActionKind::RECV_B:
        return run.b_link[static_cast<size_t>(r)].contains(a.microbatch);
      case ActionKind::OPT_STEP: {
        Run::Update& u = run.update(a.version, ntied);
        if (!u.arrived[static_cast<size_t>(r)]) {
          // the stage's gradients are complete once it reaches the update: it hands them out
          u.arrived[static_cast<size_t>(r)] = true;
          u.jobs[static_cast<size_t>(r)] = &w.begin_update(a);
          // step 0.5: the gradients summed over the replicas (every replica's executor reaches
          // its stages' updates in the same order: the sweep depends on the schedule only)
          if (opts_.reducer != nullptr) {
            UpdateJob& job = *u.jobs[static_cast<size_t>(r)];
            if (Status ok =
                    all_reduce_in(*opts_.reducer, w.memory(), r, job.step(), job.gradients());
                !ok) {
              failure = make_error("stage {}: {}", r, ok.error().message);
              return false;
            }
          }
          for (size_t k = 0; k < ntied && !global; ++k) {
            if (!cross(k, r, TiedRole::copy)) continue;
            const UpdateJob& job = *u.jobs[static_cast<size_t>(r)];
            const auto g = host_view(job.memory(), job.tied_grad(k), staged[0]);
            u.contribution[k].assign(g.begin(), g.end());
            u.has_contribution[k] = true;
          }
        }
        if (global) return std::find(u.arrived.begin(), u.arrived.end(), false) == u.arrived.end();
        // per-stage clipping: the tied parameter follows its owner, who waits for the copy's
        // contribution; the copy waits for nobody
        for (size_t k = 0; k < ntied; ++k)
          if (cross(k, r, TiedRole::owner) && !u.has_contribution[k]) return false;
        return true;
      }
      case ActionKind::FLUSH:  // arrivals are counted by the sweep, once per stage
        return run.flush_arrivals[run.flushes_done[static_cast<size_t>(r)]] == d;
    }
    return false;
  };

  auto execute = [&](int r, const Action& a) {
    StageWorker& w = *workers_[static_cast<size_t>(r)];
    const size_t ru = static_cast<size_t>(r);
    switch (a.kind) {
      case ActionKind::F: {
        Tensor in;
        if (r > 0) in = take(run.f_in[ru], a.microbatch);
        for (size_t k = 0; k < ntied; ++k) {
          const TiedVersion need = w.tied_version_needed(a, k);
          if (!need.valid()) continue;
          w.install_tied_weights(a, k, need, run.published[k].at(need));
          // forwards ask for non-decreasing versions: older ones are done with
          std::erase_if(run.published[k], [&](const auto& e) { return e.first < need; });
        }
        ForwardOutput out = w.exec_forward(a, batches[static_cast<size_t>(a.microbatch)], in);
        // xpipe: the owner's prediction of a tied parameter is what the copy's stage computes
        // the same microbatch with
        for (size_t k = 0; k < ntied && sync == TiedSync::follow_owner; ++k) {
          const StageWorker::PredictedTied p = w.predicted_tied(k);
          if (p.version.valid() && !run.published[k].contains(p.version)) {
            std::vector<float> prediction;
            const std::span<const float> host = host_view(w.memory(), p.weights, prediction);
            run.published[k][p.version].assign(host.begin(), host.end());
          }
        }
        if (r == d - 1) {
          run.mb_loss[static_cast<size_t>(a.microbatch)] = out.loss.mean();
          // a non-finite loss stops the run, as on the actors (stage_actor.cpp); skipped, its
          // gradients are not finite either and the step is dropped at its update
          if (!std::isfinite(out.loss.sum) && failure.ok() && !opts_.skip_nonfinite) {
            failure =
                make_error("stage {}, microbatch {} ({}): non-finite loss {} over {} targets", r,
                           mb_done_ + a.microbatch, to_string(a), out.loss.sum, out.loss.count);
          }
        } else if (lowered) {
          run.f_out[ru][a.microbatch] = std::move(out.out);
        } else {
          run.f_in[ru + 1][a.microbatch] = std::move(out.out);
        }
        break;
      }
      case ActionKind::B: {
        Tensor dout;
        if (r < d - 1) dout = take(run.b_in[ru], a.microbatch);
        Tensor din = w.exec_backward(a, batches[static_cast<size_t>(a.microbatch)], dout);
        if (r == 0) break;
        if (lowered) {
          run.b_out[ru][a.microbatch] = std::move(din);
        } else {
          run.b_in[ru - 1][a.microbatch] = std::move(din);
        }
        break;
      }
      case ActionKind::SEND_F:
        run.f_link[ru + 1][a.microbatch] = take(run.f_out[ru], a.microbatch);
        break;
      case ActionKind::RECV_F:
        run.f_in[ru][a.microbatch] = take(run.f_link[ru], a.microbatch);
        break;
      case ActionKind::SEND_B:
        run.b_link[ru - 1][a.microbatch] = take(run.b_out[ru], a.microbatch);
        break;
      case ActionKind::RECV_B:
        run.b_in[ru][a.microbatch] = take(run.b_link[ru], a.microbatch);
        break;
      case ActionKind::OPT_STEP: {
        Run::Update& u = run.update(a.version, ntied);
        UpdateJob& job = *u.jobs[ru];
        UpdateScales scales;
        if (global) {
          if (!u.collective_done) {
            std::vector<float> sum;
            for (size_t k = 0; k < ntied; ++k) {
              const int o = stage_of_role(k, TiedRole::owner), c = stage_of_role(k, TiedRole::copy);
              if (o == c) continue;
              UpdateJob& jo = *u.jobs[static_cast<size_t>(o)];
              UpdateJob& jc = *u.jobs[static_cast<size_t>(c)];
              sum_tied(host_view(jo.memory(), jo.tied_grad(k), staged[0]),
                       host_view(jc.memory(), jc.tied_grad(k), staged[1]), sum);
              jo.set_tied_grad(workers_[static_cast<size_t>(o)]->context(), k, sum);
              jc.set_tied_grad(workers_[static_cast<size_t>(c)]->context(), k, sum);
            }
            double sumsq = 0.0;  // every layer in order: stage order, then layer order
            for (int q = 0; q < d; ++q) {
              UpdateJob& jq = *u.jobs[static_cast<size_t>(q)];
              const auto sums = jq.finish_gradients(workers_[static_cast<size_t>(q)]->context());
              const int bad = first_nonfinite(sums);
              if (bad >= 0 && !u.skip) {
                if (opts_.skip_nonfinite) {
                  u.skip = true;
                } else if (failure.ok()) {
                  const int layer = workers_[static_cast<size_t>(q)]->first_layer() + bad;
                  failure = make_error(
                      "stage {}: {}", q,
                      nonfinite_gradient(model_, jq.step(), layer, sums[static_cast<size_t>(bad)]));
                }
              }
              for (double v : sums) sumsq += v;
            }
            u.global_scale = clip_scale(sumsq, opt_.grad_clip);
            u.collective_done = true;
          }
          scales = {u.global_scale, u.global_scale};
        } else {
          for (size_t k = 0; k < ntied; ++k) {
            if (!cross(k, r, TiedRole::owner)) continue;
            sum_tied(host_view(job.memory(), job.tied_grad(k), staged[0]), u.contribution[k],
                     u.sum[k]);
            job.set_tied_grad(w.context(), k, u.sum[k]);
          }
          double sumsq = 0.0;  // this stage's layers in order
          const auto sums = job.finish_gradients(w.context());
          if (const int bad = first_nonfinite(sums); bad >= 0 && failure.ok()) {
            failure = make_error("stage {}: {}", r,
                                 nonfinite_gradient(model_, job.step(), w.first_layer() + bad,
                                                    sums[static_cast<size_t>(bad)]));
          }
          for (double v : sums) sumsq += v;
          scales.stage = scales.tied = clip_scale(sumsq, opt_.grad_clip);
        }
        if (!failure.ok()) break;
        // the rest of the protocol back to back: the shard's math on the stage's Context
        if (u.skip) {
          shards_[ru]->skip_update(w.context(), job);
        } else {
          shards_[ru]->run_update(w.context(), job, scales);
        }
        w.commit_update(job);
        for (size_t k = 0; k < ntied; ++k) {
          if (sync == TiedSync::follow_owner && cross(k, r, TiedRole::owner)) {
            const auto t = host_view(w.memory(), w.tied_weights(k), staged[0]);
            run.published[k][TiedVersion{static_cast<int>(w.updates()), 0}].assign(t.begin(),
                                                                                   t.end());
          }
        }
        if (++u.executed == d) {
          if (u.skip) ++skipped_;
          run.updates.erase(a.version);
          if (on_step) on_step(a.version, step_loss(a.version));
        }
        break;
      }
      case ActionKind::FLUSH: {
        w.exec_flush(a);
        ++run.flushes_done[ru];
        break;
      }
    }
  };

  // A stop: the run becomes that of the steps stage 0 has begun (first_steps). No stage can
  // have run an action beyond them: a later step's forward needs one of its microbatches
  // through stage 0, its backwards those forwards, its updates those backwards; so what every
  // stage has run is the start of its list in the shorter run, which each worker takes over
  // (StageWorker::shorten_run).
  const Schedule* sched = &s;
  Schedule shortened;
  auto cut_if_asked = [&]() -> Status {
    if (stop == nullptr || sched != &s || s.steps <= 1 || !stop->requested()) return {};
    int64_t begun = 0;  // microbatches whose F stage 0 ran
    for (size_t i = 0; i < run.pc[0]; ++i) {
      const Action& a = s.per_stage[0][i];
      if (a.kind == ActionKind::F) begun = std::max<int64_t>(begun, a.microbatch + 1);
    }
    const int k = static_cast<int>(std::max<int64_t>(1, (begun + per - 1) / per));
    if (k >= s.steps) return {};
    auto c = first_steps(s, k);
    if (!c) return c.error();
    for (int r = 0; r < d; ++r) {
      const size_t ru = static_cast<size_t>(r);
      const auto& was = s.per_stage[ru];
      const auto& now = c->per_stage[ru];
      AP_CHECK(run.pc[ru] <= now.size() &&
                   std::equal(was.begin(), was.begin() + static_cast<std::ptrdiff_t>(run.pc[ru]),
                              now.begin()),
               "stage {}: its {} actions so far are not the start of its list in the run of the "
               "first {} steps",
               r, run.pc[ru], k);
    }
    for (auto& w : workers_)
      if (Status st = w->shorten_run(*c); !st) return st.error();
    shortened = std::move(*c);
    sched = &shortened;
    return {};
  };

  // Round-robin sweeps: each stage runs its next action if it is ready.
  std::vector<bool> at_flush(static_cast<size_t>(d), false);
  for (;;) {
    if (Status st = cut_if_asked(); !st)
      return make_error("{} pipeline: {}", to_string(opts_.mode), st.error().message);
    bool progress = false, done = true;
    for (int r = 0; r < d; ++r) {
      const size_t ru = static_cast<size_t>(r);
      const auto& list = sched->per_stage[ru];
      if (run.pc[ru] >= list.size()) continue;
      done = false;
      const Action& a = list[run.pc[ru]];
      if (a.kind == ActionKind::FLUSH && !at_flush[ru]) {
        at_flush[ru] = true;
        ++run.flush_arrivals[run.flushes_done[ru]];
      }
      if (!ready(r, a)) {
        if (!failure.ok())
          return make_error("{} pipeline: {}", to_string(opts_.mode), failure.error().message);
        continue;
      }
      execute(r, a);
      if (!failure.ok())
        return make_error("{} pipeline: {}", to_string(opts_.mode), failure.error().message);
      at_flush[ru] = false;
      ++run.pc[ru];
      progress = true;
    }
    if (done) break;
    if (!progress) {
      std::string where;
      for (int r = 0; r < d; ++r) {
        const size_t ru = static_cast<size_t>(r);
        const auto& list = sched->per_stage[ru];
        where += fmt::format("\n  stage {}: {}", r,
                             run.pc[ru] < list.size() ? "waits at " + to_string(list[run.pc[ru]])
                                                      : std::string("done"));
      }
      return make_error("the run is stuck: no stage can proceed{}", where);
    }
  }
  mb_done_ += sched->total_microbatches();
  // follow_owner: the copy's stage installs the owner's newest version, so the copies are equal
  // at rest (the final weights, a checkpoint, the next run's start)
  for (size_t k = 0; k < ntied; ++k) {
    const int o = stage_of_role(k, TiedRole::owner), c = stage_of_role(k, TiedRole::copy);
    if (sync != TiedSync::follow_owner || o == c) continue;
    const StageWorker& wo = *workers_[static_cast<size_t>(o)];
    StageWorker& wc = *workers_[static_cast<size_t>(c)];
    wc.install_tied_weights(k, static_cast<int>(wo.updates()),
                            host_view(wo.memory(), wo.tied_weights(k), staged[0]));
    // 2bw: the previous version too, which a continued run computes with
    const int prev = static_cast<int>(wo.updates()) - 1;
    if (wo.holds_previous() && wc.holds_previous())
      wc.install_tied_weights(k, prev, host_view(wo.memory(), wo.tied_weights(k, prev), staged[0]));
  }

  std::vector<double> losses;
  for (int u = 1; u <= sched->steps; ++u) losses.push_back(step_loss(u));
  return losses;
}

StageWorker& SerialExecutor::worker(int stage) {
  AP_CHECK(stage >= 0 && stage < stages(), "stage {} of {}", stage, stages());
  return *workers_[static_cast<size_t>(stage)];
}

const StageWorker& SerialExecutor::worker(int stage) const {
  AP_CHECK(stage >= 0 && stage < stages(), "stage {} of {}", stage, stages());
  return *workers_[static_cast<size_t>(stage)];
}

OptimizerShard& SerialExecutor::optimizer(int stage) {
  AP_CHECK(stage >= 0 && stage < stages(), "stage {} of {}", stage, stages());
  return *shards_[static_cast<size_t>(stage)];
}

const OptimizerShard& SerialExecutor::optimizer(int stage) const {
  AP_CHECK(stage >= 0 && stage < stages(), "stage {} of {}", stage, stages());
  return *shards_[static_cast<size_t>(stage)];
}

std::span<const float> SerialExecutor::params(int layer) const {
  const int r = partition_.stage_of(layer);
  return worker(r).params(layer - partition_.begin(r));
}

std::vector<VersionUse> SerialExecutor::version_log() const {
  std::vector<VersionUse> out;
  for (const auto& w : workers_)
    out.insert(out.end(), w->version_log().begin(), w->version_log().end());
  return out;
}

}  // namespace actorpipe
