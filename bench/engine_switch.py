"""Policy switch time of the CPU engine: `VllmServer.load_weights` (in-place reload, no restart), base <-> checkpoint.

A checkpoint is made the way a trainer saves one (SmolLM2 with one layer scaled, `save_pretrained`, float32), then
the server switches between it and the base `--switches` times. Each switch is the whole `load_weights` call:
the folder check, /pause (drain), the reload, /reset_prefix_cache, /resume. The first request after each switch is
timed too (its prefix cache is empty) against the same request on warm caches.

    python bench/engine_switch.py [--switches 5] [--url http://127.0.0.1:PORT/v1]

`--url` uses a server already running (`python -m proxy.engines.vllm_cpu serve`) instead of starting one. The last
line is one JSON object: switch_s_p50, switch_s_max, first_request_s_p50 (after a switch), warm_request_s_p50.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.engines.vllm_cpu import CACHE_ENV, MODEL_NAME, VllmServer, ensure_env, ensure_model  # noqa: E402

_SCALED = r"""
import sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
with torch.no_grad():
    model.model.layers[3].mlp.down_proj.weight.mul_(1.5)
model.save_pretrained(sys.argv[2])
"""
REQUEST = {"model": MODEL_NAME, "max_tokens": 8, "temperature": 0,
           "messages": [{"role": "system", "content": "You are an agent in a Linux shell."},
                        {"role": "user", "content": "Rename a.txt to b.txt."}]}


def _timed_request(http: httpx.Client) -> float:
    t = time.monotonic()
    http.post("/chat/completions", json=REQUEST).raise_for_status()
    return time.monotonic() - t


def measure(server: VllmServer, switches: int) -> dict:
    base = server.weights_dir
    with tempfile.TemporaryDirectory() as tmp, httpx.Client(base_url=server.base_url, timeout=600) as http:
        ckpt = Path(tmp) / "scaled"
        python = ensure_env(os.environ.get(CACHE_ENV), progress=False)
        subprocess.run([str(python), "-c", _SCALED, str(base), str(ckpt)], check=True, capture_output=True)
        warm = [_timed_request(http) for _ in range(3)]
        times, first = [], []
        for i in range(switches):
            times.append(server.load_weights(ckpt if i % 2 == 0 else base))
            first.append(_timed_request(http))
            print(f"switch {i + 1}: {times[-1]:.3f}s, first request {first[-1]:.3f}s", file=sys.stderr)
        if server.weights_dir != base:
            server.load_weights(base)
    return {"switch_s_p50": round(statistics.median(times), 3), "switch_s_max": round(max(times), 3),
            "first_request_s_p50": round(statistics.median(first), 3),
            "warm_request_s_p50": round(statistics.median(warm), 3), "switches": switches}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--switches", type=int, default=5)
    p.add_argument("--url", help="a running server (python -m proxy.engines.vllm_cpu serve) instead of a new one")
    args = p.parse_args()
    cache = os.environ.get(CACHE_ENV)
    if args.url:
        print(json.dumps(measure(VllmServer.attach(args.url, ensure_model(cache)), args.switches)))
        return
    with VllmServer(cache) as server:
        print(json.dumps(measure(server, args.switches)))


if __name__ == "__main__":
    main()
