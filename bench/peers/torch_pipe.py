#!/usr/bin/python3
"""Pipeline peer of `actorpipe-bench pipeline`: PyTorch's GPipe (torch.distributed.pipeline.sync.Pipe).

Builds the GPT of bench/peers/peer_common.py (actorpipe's GPT in PyTorch: pre-LN GPT-2 blocks, tanh
GELU, tied LM head, mean cross-entropy), then times two ways of training one step of m
microbatches of B sequences each, on the same model and data, one after the other in this
process:

  unsplit  the plain model with gradient accumulation: for each microbatch j, forward, loss / m,
           backward; then clip and AdamW. actorpipe's one-stage pipeline does exactly this work.
  pipe     the model cut into 2 partitions (layers [0, split) and [split, L+2) in actorpipe's
           layer units: embedding, L blocks, head with the loss), wrapped in
           Pipe(chunks=m, checkpoint="never") - activations are kept, not recomputed, as
           actorpipe keeps them; the loss of each chunk is computed inside the last partition,
           the step's loss is their mean, as in actorpipe - then clip and AdamW.

Pipe needs the RPC framework (it returns an RRef): a single-worker init_rpc on a free loopback
port. On the CPU, Pipe runs every partition on one worker thread per device (there is one CPU
device) and the backward on the autograd engine's CPU thread, so the partitions do not run
concurrently: both cores help only through torch's intra-op threads (--threads).

actorpipe-bench runs it with OMP_NUM_THREADS and OPENBLAS_NUM_THREADS = --threads, and from 2
threads on OMP_WAIT_POLICY=PASSIVE and OPENBLAS_THREAD_TIMEOUT=4. By hand (tiny shape):

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/peers/torch_pipe.py \\
        --vocab 256 --context 128 --width 128 --depth 4 --heads 4 --batch 8 --seq 128 \\
        --chunks 4 --split 3 --threads 1

Prints one JSON line. Exit status 3 (with a JSON line saying so) when torch or its Pipe cannot
be imported.
"""

import argparse
import json
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (the same GPT as the step peer)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    peer_common.add_shape_arguments(p, "B sequences per microbatch")
    p.add_argument("--chunks", type=int, required=True, help="m microbatches per step")
    p.add_argument("--split", type=int, required=True,
                   help="layers of the first partition (embedding = 1, each block = 1, head = 1)")
    peer_common.add_run_arguments(p, reps=3)
    a = p.parse_args(argv)
    peer_common.check_shape(p, a)
    if a.chunks < 1 or a.reps < 1 or a.warmup < 1:
        p.error("--chunks, --reps and --warmup must be at least 1")
    if not 1 <= a.split <= a.depth + 1:
        p.error(f"--split {a.split}: the first partition holds 1 .. {a.depth + 1} of the "
                f"{a.depth + 2} layers")
    return a


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_partitions(torch, model, a):
    """actorpipe's layers as modules passing (hidden, targets) along, cut after `split`."""
    nn = torch.nn
    F = torch.nn.functional

    class Embedding(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = model.wte, model.wpe

        def forward(self, idx, targets):
            pos = torch.arange(idx.size(1), dtype=torch.long)
            return self.wte(idx) + self.wpe(pos), targets

    class Block(nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x, targets):
            return self.block(x), targets

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_f, self.lm_head = model.ln_f, model.lm_head

        def forward(self, x, targets):
            logits = self.lm_head(self.ln_f(x))
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
            return loss.reshape(1)  # one entry per chunk; Pipe concatenates them

    layers = [Embedding()] + [Block(b) for b in model.blocks] + [Head()]
    return nn.Sequential(nn.Sequential(*layers[:a.split]), nn.Sequential(*layers[a.split:]))


def timed(step, a):
    first_loss, times, step_ms = peer_common.timed_steps(step, a)
    return {"first_loss": first_loss, "step_ms_all": times, "step_ms": step_ms,
            "tokens_per_s": a.chunks * a.batch * a.seq / (step_ms / 1000.0)}


def main(argv):
    a = parse_args(argv)
    # the RPC agent logs its shutdown through glog at INFO level; keep stderr for real problems
    os.environ.setdefault("GLOG_minloglevel", "2")
    try:
        import torch
        import torch.distributed.rpc as rpc
        from torch.distributed.pipeline.sync import Pipe
    except ImportError as e:
        return peer_common.report_missing("torch's Pipe", e)
    peer_common.setup_torch(torch, a)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    rpc.init_rpc("worker", rank=0, world_size=1)
    try:
        model, attention = peer_common.build_model(torch, a)
        pipe = Pipe(build_partitions(torch, model, a), chunks=a.chunks, checkpoint="never")
        opt = peer_common.adamw(torch, model, a)
        params = list(model.parameters())
        idx, targets = peer_common.random_tokens(torch, a, a.chunks * a.batch)
        idx_mb, targets_mb = idx.split(a.batch), targets.split(a.batch)

        def finish():
            if a.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
            opt.step()

        def unsplit_step():
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for x, y in zip(idx_mb, targets_mb):
                loss = model(x, y) / a.chunks
                loss.backward()
                total += loss.item()
            finish()
            return total

        def pipe_step():
            opt.zero_grad(set_to_none=True)
            loss = pipe(idx, targets).local_value().mean()
            loss.backward()
            finish()
            return loss.item()

        unsplit = timed(unsplit_step, a)
        piped = timed(pipe_step, a)
        piped["partitions"] = len(pipe.partitions)
        piped["devices"] = [str(d) for d in pipe.devices]
        result = {
            **peer_common.torch_config(torch, attention),
            "parameters": sum(p.numel() for p in params),
            "chunks": a.chunks,
            "split": a.split,
            "checkpoint": "never",
            "unsplit": unsplit,
            "pipe": piped,
            "env": peer_common.thread_env(),
        }
    finally:
        rpc.shutdown()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
