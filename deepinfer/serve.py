"""``deepinfer serve [MODEL]``: the OpenAI-compatible HTTP server (also ``python -m deepinfer.serve``).

Binds to 127.0.0.1 unless told otherwise. ``--api-key`` (or ``DEEPINFER_API_KEY``) makes every
/v1 route require ``Authorization: Bearer <key>``. MODEL defaults to the embedded
SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import argparse
import os
import sys


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="deepinfer serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("model", nargs="?", default=None, help="a .gguf, a Hugging Face folder or repo id")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--api-key", default=os.environ.get("DEEPINFER_API_KEY"))
    ap.add_argument("--served-model-name", default=None, help="the model's name in the API")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--kv-cache-memory", type=float, default=None,
                    help="bytes (>= 2), or a fraction of free memory (<= 1)")  # fmt: skip
    ap.add_argument("--max-waiting", type=int, default=1024, help="requests in flight before 429")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--timeout-keep-alive", type=int, default=5,
                    help="seconds an idle HTTP connection stays open (uvicorn's default: 5)")  # fmt: skip
    ap.add_argument(
        "--deterministic",
        action="store_true",
        help="batch-invariant forward: a request's tokens do not depend on what runs beside it",
    )
    ap.add_argument(
        "--dspark",
        choices=("on", "off"),
        default="on",
        help="DSpark speculative decoding of constrained requests",
    )
    ap.add_argument(
        "--async-scheduling",
        choices=("on", "off"),
        default=None,
        help="launch each decode step before the previous one's tokens are read back (default: on CUDA)",
    )
    ap.add_argument("--tensor-parallel-size", type=int, default=1, help="ranks the model is split over")
    ap.add_argument("--expert-parallel-size", type=int, default=1, help="ranks a MoE's experts spread over")
    ap.add_argument("--data-parallel-size", type=int, default=1, help="engine replicas behind one router")
    return ap


def _on_off(flag: str | None) -> bool | None:
    return None if flag is None else flag == "on"


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from functools import partial

    from .llm import LLM

    kv = args.kv_cache_memory
    if kv is not None and kv > 1:
        kv = int(kv)
    factory = partial(LLM, args.model, device=args.device, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
                      max_model_len=args.max_model_len, kv_cache_memory=kv, seed=args.seed,
                      deterministic=args.deterministic,
                      dspark=args.dspark == "on",
                      async_scheduling=_on_off(args.async_scheduling),
                      tensor_parallel_size=args.tensor_parallel_size,
                      expert_parallel_size=args.expert_parallel_size,
                      data_parallel_size=args.data_parallel_size)  # fmt: skip
    name = args.served_model_name or (
        os.path.basename(str(args.model)) if args.model else "SmolLM2-135M-Instruct"
    )
    serve(factory, name=name, host=args.host, port=args.port, api_key=args.api_key,
          max_waiting=args.max_waiting, timeout_keep_alive=args.timeout_keep_alive)  # fmt: skip


def serve(factory, *, name: str, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          max_waiting: int = 1024, timeout_keep_alive: int = 5) -> None:  # fmt: skip
    """Serve until interrupted: the engine process (``factory()`` builds its LLM there; a
    picklable callable), then uvicorn in this one. An idle keep-alive connection is closed after
    ``timeout_keep_alive`` seconds; a client that sends on it just as it closes sees the server
    disconnect without a response, so clients that pool connections retry, or the timeout is
    made longer than their idle gaps."""
    import uvicorn

    from .server.app import create_app
    from .server.engine_loop import EngineLoop

    loop = EngineLoop(factory, max_waiting=max_waiting)
    loop.start()
    app = create_app(loop, model_name=name, api_key=api_key)
    print(f"deepinfer: serving {name} on http://{host}:{port}/v1", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", timeout_keep_alive=timeout_keep_alive)
    finally:
        loop.stop()


def cli() -> None:
    """The ``deepinfer`` console script: ``deepinfer serve ...``."""
    argv = sys.argv[1:]
    if not argv or argv[0] != "serve":
        print(
            "usage: deepinfer serve [MODEL] [--host 127.0.0.1] [--port 8000] [--api-key KEY]", file=sys.stderr
        )
        raise SystemExit(2)
    main(argv[1:])


if __name__ == "__main__":
    main()
