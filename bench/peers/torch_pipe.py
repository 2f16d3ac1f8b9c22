#!/usr/bin/python3
"""Pipeline peer of `actorpipe-bench pipeline`: PyTorch's GPipe (torch.distributed.pipeline.sync.Pipe).

Builds the GPT of bench/peers/torch_step.py (actorpipe's GPT in PyTorch: pre-LN GPT-2 blocks, tanh
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
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_step  # noqa: E402  (the same GPT as the step peer)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--context", type=int, required=True, help="position table size (maxT)")
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--depth", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--batch", type=int, required=True, help="B sequences per microbatch")
    p.add_argument("--seq", type=int, required=True, help="T tokens per sequence")
    p.add_argument("--chunks", type=int, required=True, help="m microbatches per step")
    p.add_argument("--split", type=int, required=True,
                   help="layers of the first partition (embedding = 1, each block = 1, head = 1)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args(argv)
    if a.width % a.heads != 0:
        p.error(f"--width {a.width} is not divisible by --heads {a.heads}")
    if a.seq > a.context:
        p.error(f"--seq {a.seq} is larger than --context {a.context}")
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
    first_loss = step()
    for _ in range(a.warmup - 1):
        step()
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000.0)
    step_ms = statistics.median(times)
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
        print(json.dumps({"ok": False, "missing": True,
                          "error": f"cannot import torch's Pipe with {sys.executable}: {e}"}))
        return 3
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    rpc.init_rpc("worker", rank=0, world_size=1)
    try:
        model, attention = torch_step.build_model(torch, a)
        pipe = Pipe(build_partitions(torch, model, a), chunks=a.chunks, checkpoint="never")
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)
        params = list(model.parameters())

        g = torch.Generator().manual_seed(a.seed)
        seq = torch.randint(0, a.vocab, (a.chunks * a.batch, a.seq + 1), generator=g)
        idx, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
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
            "ok": True,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "attention": attention,
            "parameters": sum(p.numel() for p in params),
            "chunks": a.chunks,
            "split": a.split,
            "checkpoint": "never",
            "unsplit": unsplit,
            "pipe": piped,
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                    "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT")},
        }
    finally:
        rpc.shutdown()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
