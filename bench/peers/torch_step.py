#!/usr/bin/python3
"""PyTorch peer of actorpipe-bench: the same GPT and the same training step, timed the same way.

Builds actorpipe's GPT (engine/model/model.hpp: pre-LN GPT-2 blocks with biases, tanh GELU, layernorm
eps 1e-5, causal multi-head attention, tied LM head, mean softmax cross-entropy with ignore
index -1) in PyTorch, float32 on the CPU, and trains it with AdamW (the same hyper-parameters,
decoupled weight decay on matrices and embeddings only, global-norm clipping) on one microbatch
of random tokens. A step is what ReferenceTrainer::step does: zero the gradients, forward,
backward, clip, optimizer update. Prints one JSON line with the median of --reps timed steps
after --warmup untimed ones, the peak RSS of this process and how torch was configured.

actorpipe-bench runs it as a child process, one per configuration, with OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS set to --threads. By hand (tiny shape, one thread):

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/peers/torch_step.py \\
        --vocab 256 --context 128 --width 128 --depth 4 --heads 4 --batch 8 --seq 128 --threads 1

With --bf16 the forward runs under torch.autocast("cpu", dtype=torch.bfloat16) (PyTorch's CPU
mixed precision: its linear layers and matmuls take bf16 operands; parameters, gradients and
optimizer state stay float32), the peer of actorpipe's pipeline.precision = "bf16".

Exit status 3 (with a JSON line saying so) when torch cannot be imported.
"""

import argparse
import json
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (the GPT and its training, shared with the pipeline peer)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    peer_common.add_shape_arguments(p, "B sequences per step")
    peer_common.add_run_arguments(p, reps=5)
    p.add_argument("--bf16", action="store_true",
                   help="forward under torch.autocast(cpu, bfloat16)")
    a = p.parse_args(argv)
    peer_common.check_shape(p, a)
    if a.reps < 1 or a.warmup < 1:
        p.error("--reps and --warmup must be at least 1")
    return a


def rss_mb(field):
    """VmRSS / VmHWM of this process in MiB (0 if /proc is unavailable)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def main(argv):
    a = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        return peer_common.report_missing("torch", e)
    peer_common.setup_torch(torch, a)
    import_rss = rss_mb("VmRSS")

    model, attention = peer_common.build_model(torch, a)
    opt = peer_common.adamw(torch, model, a)
    params = list(model.parameters())
    idx, targets = peer_common.random_tokens(torch, a, a.batch)

    def step():
        opt.zero_grad(set_to_none=True)
        if a.bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(idx, targets)
        else:
            loss = model(idx, targets)
        loss.backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        opt.step()
        return loss.item()

    first_loss, times, step_ms = peer_common.timed_steps(step, a)
    peak = max(rss_mb("VmHWM"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    print(json.dumps({
        **peer_common.torch_config(torch, attention),
        "optimizer": "torch.optim.AdamW (default implementation)",
        "precision": "bf16 autocast" if a.bf16 else "fp32",
        "parameters": sum(p.numel() for p in params),
        "first_loss": first_loss,
        "step_ms_all": times,
        "step_ms": step_ms,
        "tokens_per_s": a.batch * a.seq / (step_ms / 1000.0),
        "peak_rss_mb": peak,
        "import_rss_mb": import_rss,
        "env": peer_common.thread_env(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
